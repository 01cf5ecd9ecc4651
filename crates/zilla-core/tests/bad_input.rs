//! Bad input: each mistake gets one clear error, and nothing already stored is lost.
mod common;
use common::*;
use std::sync::Arc;
use zilla_core::spa::{CreateOptions, Pool, TopSpec};
use zilla_core::vdev::fault::{FaultDevice, MemDevice};
use zilla_core::vdev::label;
use zilla_core::vdev::Role;
use zilla_core::Error;

const SIZE: u64 = 32 << 20;

/// A pool with one volume holding known data; returns the data.
fn pool_with_data(devs: &DevSet) -> (Arc<Pool>, Vec<u8>) {
    let pool = create(devs, two_mirrors());
    pool.volume_create("vol", 8 << 20, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let data = pattern(5, 3 << 20);
    v.write(12345, &data, false).unwrap();
    v.flush().unwrap();
    (pool, data)
}

fn check_data(pool: &Pool, data: &[u8]) {
    let v = pool.open_volume("vol").unwrap();
    let mut b = vec![0u8; data.len()];
    v.read(12345, &mut b).unwrap();
    assert!(b == data, "stored data changed");
}

fn fault_devs(names: &[&str]) -> (DevSet, Vec<Arc<FaultDevice>>) {
    let d = DevSet::default();
    let mut v = vec![];
    for n in names {
        let f = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(SIZE))));
        d.insert(n, f.clone());
        v.push(f);
    }
    (d, v)
}

#[test]
fn create_on_missing_device_is_not_found_and_writes_nothing() {
    let devs = mem_devs(&["m0a", "m0b", "m1a"], SIZE);
    let e = Pool::create_with("tank", two_mirrors(), CreateOptions::default(), devs.opener()).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    assert!(e.to_string().contains("m1b"), "error names the device: {e}");
    for n in ["m0a", "m0b", "m1a"] {
        assert!(label::scan_labels(&*devs.get(n)).unwrap().config.is_none(), "{n} was written");
    }
}

#[test]
fn create_over_a_device_of_another_pool_is_busy() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b", "x"], SIZE);
    let (pool, data) = pool_with_data(&devs);
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("x"), leaf("m1b")] }];
    let e = Pool::create_with("other", tops.clone(), CreateOptions::default(), devs.opener()).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");
    assert_eq!(e.errno(), libc::EBUSY);
    assert!(e.to_string().contains("tank"), "{e}");
    // nothing of the first pool was touched: it keeps working, and after export too
    check_data(&pool, &data);
    pool.export().unwrap();
    let e = Pool::create_with("other", tops, CreateOptions::default(), devs.opener()).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "exported pool's device: {e:?}");
    assert!(label::scan_labels(&*devs.get("x")).unwrap().config.is_none());
    let pool = import(&devs.clone_without(&["x"]));
    check_data(&pool, &data);
    pool.export().unwrap();
}

#[test]
fn import_with_a_device_of_another_pool_is_refused() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b", "xa", "xb"], SIZE);
    let (pool, data) = pool_with_data(&devs);
    pool.export().unwrap();
    let other = Pool::create_with(
        "other",
        vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("xa"), leaf("xb")] }],
        CreateOptions::default(),
        devs.opener(),
    )
    .unwrap();
    other.export().unwrap();
    let mut specs = devs.clone_without(&["xb"]).specs();
    specs.sort_by(|a, b| a.path.cmp(&b.path));
    let e = Pool::import_with(&specs, devs.opener()).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("another pool"), "{e}");
    let pool = import(&devs.clone_without(&["xa", "xb"]));
    check_data(&pool, &data);
    pool.export().unwrap();
    let other = import(&devs.clone_without(&["m0a", "m0b", "m1a", "m1b"]));
    assert_eq!(other.name(), "other");
    other.export().unwrap();
}

#[test]
fn import_with_every_label_of_one_device_damaged() {
    let (devs, f) = fault_devs(&["m0a", "m0b", "m1a", "m1b"]);
    let (pool, data) = pool_with_data(&devs);
    pool.export().unwrap();
    drop(pool);
    // truncate (zero the tail of) every config region of m0a
    for l in 0..label::LABELS {
        let off = label::label_offset(SIZE, l);
        f[0].inner().write_at(&vec![0u8; 64 << 10], off + (64 << 10)).unwrap();
    }
    assert_eq!(label::scan_labels(&*devs.get("m0a")).unwrap().valid_configs, 0);
    let pool = import(&devs);
    check_data(&pool, &data);
    let st = pool.status();
    assert_ne!(st.state, "UNAVAIL");
    eprintln!("state with m0a unlabelled: {} / {:?}", st.state, st.config[0].children.iter().map(|c| (&c.name, &c.state)).collect::<Vec<_>>());
    pool.export().unwrap();
}

#[test]
fn import_with_one_mirror_child_missing_is_degraded() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], SIZE);
    let (pool, data) = pool_with_data(&devs);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs.clone_without(&["m1b"]));
    check_data(&pool, &data);
    assert_eq!(pool.status().state, "DEGRADED");
    // and it keeps working
    let v = pool.open_volume("vol").unwrap();
    v.write(0, &[1u8; 4096], true).unwrap();
    drop(v);
    pool.export().unwrap();
}

#[test]
fn import_with_every_label_zeroed_is_a_clear_error() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], SIZE);
    let (pool, _) = pool_with_data(&devs);
    pool.export().unwrap();
    for n in ["m0a", "m0b", "m1a", "m1b"] {
        label::wipe_labels(&*devs.get(n)).unwrap();
    }
    let e = Pool::import_with(&devs.specs(), devs.opener()).map(|_| ()).unwrap_err();
    assert!(!matches!(e, Error::NotFound(_)), "{e:?}");
    assert!(e.to_string().contains("no valid pool label") && e.to_string().contains("have no valid label"), "{e}");
    assert!(!e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn volume_and_property_errors() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], SIZE);
    let (pool, data) = pool_with_data(&devs);
    let inval = |r: zilla_core::Result<()>, what: &str| match r {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    // exists
    let e = pool.volume_create("vol", 1 << 20, 16384, &[]).unwrap_err();
    assert!(matches!(e, Error::Exists(_)), "{e:?}");
    assert_eq!(e.errno(), libc::EEXIST);
    // names
    for bad in ["", "a/b", "a b", "vol\0", "ü", "a@b", &"x".repeat(201)] {
        inval(pool.volume_create(bad, 1 << 20, 16384, &[]), &format!("name {bad:?}"));
    }
    // volblocksize
    for bs in [0u32, 3000, 12288, 2048, 256 << 10] {
        inval(pool.volume_create("v2", 1 << 20, bs, &[]), &format!("volblocksize {bs}"));
    }
    // volsize
    inval(pool.volume_create("v2", 0, 16384, &[]), "volsize 0");
    inval(pool.volume_create("v2", 10000, 4096, &[]), "volsize not a multiple");
    // properties
    let p = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    inval(pool.volume_create("v2", 1 << 20, 16384, &p("nosuchprop", "1")), "unknown property");
    inval(pool.volume_create("v2", 1 << 20, 16384, &p("compression", "bogus")), "bad compression");
    inval(pool.volume_create("v2", 1 << 20, 16384, &p("sync", "sometimes")), "bad sync");
    inval(pool.volume_create("v2", 1 << 20, 16384, &p("volblocksize", "4096")), "volblocksize as prop");
    inval(pool.set_prop("vol", "nosuchprop", "1"), "set unknown");
    inval(pool.set_prop("vol", "readonly", "maybe"), "set bad value");
    inval(pool.set_prop("vol", "volsize", "1"), "set read-only prop");
    assert!(matches!(pool.set_prop("nosuchvol", "readonly", "on"), Err(Error::NotFound(_))));
    assert!(matches!(pool.open_volume("nosuchvol").map(|_| ()), Err(Error::NotFound(_))));
    assert!(matches!(pool.get_props("vol", &["nosuchprop".into()]).map(|_| ()), Err(Error::InvalidArgument(_))));
    // none of that created anything
    assert_eq!(pool.volumes().len(), 1);
    check_data(&pool, &data);
    pool.export().unwrap();
    let pool = import(&devs);
    assert_eq!(pool.volumes().len(), 1);
    check_data(&pool, &data);
    pool.export().unwrap();
}

#[test]
fn out_of_range_and_readonly_io() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], SIZE);
    let (pool, data) = pool_with_data(&devs);
    let v = pool.open_volume("vol").unwrap();
    let size = v.size();
    let mut b = vec![0u8; 4096];
    for (off, len) in [(size, 1u64), (size - 100, 4096), (u64::MAX - 10, 4096)] {
        let mut buf = vec![0u8; len as usize];
        assert!(matches!(v.read(off, &mut buf), Err(Error::InvalidArgument(_))), "read {off}+{len}");
        assert!(matches!(v.write(off, &buf, false), Err(Error::NoSpace)), "write {off}+{len}");
        assert!(matches!(v.unmap(off, len), Err(Error::NoSpace)), "unmap {off}+{len}");
        assert!(matches!(v.write_zeroes(off, len), Err(Error::NoSpace)), "write_zeroes {off}+{len}");
        assert!(matches!(v.block_status(off, len), Err(Error::InvalidArgument(_))), "block_status {off}+{len}");
    }
    assert!(matches!(v.unmap(u64::MAX, 2), Err(Error::NoSpace)));
    // the last byte is fine
    v.read(size - 1, &mut b[..1]).unwrap();
    // readonly
    pool.set_prop("vol", "readonly", "on").unwrap();
    assert!(v.read_only());
    assert!(matches!(v.write(0, &b, false), Err(Error::ReadOnly(_))));
    assert!(matches!(v.unmap(0, 1 << 20), Err(Error::ReadOnly(_))));
    assert!(matches!(v.write_zeroes(0, 1 << 20), Err(Error::ReadOnly(_))));
    assert_eq!(v.write(0, &b, false).unwrap_err().errno(), libc::EPERM);
    check_data(&pool, &data);
    drop(v);
    pool.export().unwrap();
    // readonly persists
    let pool = import(&devs);
    let v = pool.open_volume("vol").unwrap();
    assert!(matches!(v.write(12345, &b, true), Err(Error::ReadOnly(_))));
    check_data(&pool, &data);
    pool.set_prop("vol", "readonly", "off").unwrap();
    v.write(0, &b, true).unwrap();
    drop(v);
    pool.export().unwrap();
}

trait Without {
    fn clone_without(&self, names: &[&str]) -> DevSet;
}
impl Without for DevSet {
    fn clone_without(&self, names: &[&str]) -> DevSet {
        let d = DevSet::default();
        for (k, v) in self.devs.lock().iter() {
            if !names.contains(&k.as_str()) {
                d.insert(k, v.clone());
            }
        }
        d
    }
}

/// A device path goes into every label, where import refuses control characters: create,
/// add and attach refuse such a path before writing anything, so no pool is left that
/// can never be imported again.
#[test]
fn a_device_path_a_label_cannot_hold_is_refused_before_anything_is_written() {
    let bad = "m1\nb";
    let devs = mem_devs(&["m0a", "m0b", "m1a", bad, "x"], SIZE);
    let tops = vec![
        TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m0a"), leaf("m0b")] },
        TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m1a"), leaf(bad)] },
    ];
    let e = Pool::create_with("tank", tops, CreateOptions::default(), devs.opener()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("control character") && e.to_string().contains("m1\\nb"), "{e}");
    for n in ["m0a", "m0b", "m1a", bad] {
        assert!(label::scan_labels(&*devs.get(n)).unwrap().config.is_none(), "{n:?} was written");
    }
    let pool = create(&devs, vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m0a"), leaf("m0b")] }]);
    let e = pool.add(vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m1a"), leaf(bad)] }], false).unwrap_err();
    assert!(e.to_string().contains("control character"), "{e}");
    let e = pool.attach("m0a", &leaf(bad), false).unwrap_err();
    assert!(e.to_string().contains("control character"), "{e}");
    for n in ["m1a", bad] {
        assert!(label::scan_labels(&*devs.get(n)).unwrap().config.is_none(), "{n:?} was written");
    }
    // the pool imports as it was
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    assert_eq!(pool.status().config.len(), 1);
    pool.export().unwrap();
}
