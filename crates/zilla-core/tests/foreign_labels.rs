//! Import with another pool's device at one of the pool's paths (what a reboot that
//! renames /dev/sdX, or a symlink pointed elsewhere, does): in a cache or spare slot the
//! slot is UNAVAIL, saying whose label is there, and the pool imports; the other pool's
//! device is never written, by the import, the L2ARC feed, label updates, scrub, trim
//! or export, and that pool still imports. In a data or log slot the import is
//! refused. Once the right device is back at the path, `online` or export and import
//! bring the slot back.
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zilla_core::spa::{CreateOptions, Pool, ScrubCmd, TopSpec};
use zilla_core::vdev::fault::{CrashDevice, MemDevice};
use zilla_core::vdev::{Device, LeafSpec, Role};

const MIB: u64 = 1 << 20;
const DEV: u64 = 64 * MIB;
const VOL: u64 = 16 * MIB;
const BS: u32 = 16384;

/// `pool status` of leaf `name`: its state and note ("" when it is not listed).
fn leaf_status(pool: &Pool, name: &str) -> (String, String) {
    fn find(v: &[zilla_core::spa::VdevStatus], name: &str) -> Option<(String, String)> {
        v.iter().find_map(|s| if s.name == name { Some((s.state.clone(), s.note.clone())) } else { find(&s.children, name) })
    }
    find(&pool.status().config, name).unwrap_or_default()
}

fn image(d: &dyn Device) -> Vec<u8> {
    let mut img = vec![0u8; d.size() as usize];
    d.read_at(&mut img, 0).unwrap();
    img
}

fn write_volume(pool: &Pool, seed: u64) {
    let v = pool.open_volume("v").unwrap();
    for off in (0..VOL).step_by(MIB as usize) {
        v.write(off, &pattern(seed ^ off, MIB as usize), false).unwrap();
    }
    v.flush().unwrap();
}

fn check_volume(pool: &Pool, seed: u64) {
    let v = pool.open_volume("v").unwrap();
    let mut b = vec![0u8; MIB as usize];
    for off in (0..VOL).step_by(MIB as usize) {
        v.read(off, &mut b).unwrap();
        assert!(b == pattern(seed ^ off, MIB as usize), "wrong data at {off}");
    }
}

/// Pool "tank": two mirrors, a cache device c0 and a spare s0, volume "v" written
/// with pattern `seed`; exported.
fn exported_tank(seed: u64) -> DevSet {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b", "c0", "s0"], DEV);
    let mut tops = two_mirrors();
    tops.push(TopSpec { role: Role::Cache, mirror: false, leaves: vec![leaf("c0")] });
    tops.push(TopSpec { role: Role::Spare, mirror: false, leaves: vec![leaf("s0")] });
    let pool = Pool::create_with("tank", tops, CreateOptions::default(), devs.opener()).expect("create tank");
    pool.volume_create("v", VOL, BS, &[]).unwrap();
    write_volume(&pool, seed);
    pool.export().unwrap();
    devs
}

/// Pool "other" on one device o0 that counts its writes; exported.
fn exported_other() -> (DevSet, Arc<CrashDevice>, Zguid) {
    let o0 = Arc::new(CrashDevice::new(DEV));
    let devs = DevSet::default();
    devs.insert("o0", o0.clone());
    let pool = Pool::create_with("other", vec![TopSpec { role: Role::Normal, mirror: false, leaves: vec![leaf("o0")] }], CreateOptions::default(), devs.opener())
        .expect("create other");
    pool.volume_create("v", VOL, BS, &[]).unwrap();
    write_volume(&pool, 99);
    let guid = pool.guid();
    pool.export().unwrap();
    (devs, o0, guid)
}
type Zguid = zilla_core::Guid;

#[test]
fn another_pools_disk_in_a_cache_or_spare_slot_is_unavail_and_never_written() {
    let tank_devs = exported_tank(1);
    let (other_devs, o0, other_guid) = exported_other();
    let (c0, s0) = (tank_devs.get("c0"), tank_devs.get("s0"));
    for slot in ["c0", "s0"] {
        tank_devs.insert(slot, o0.clone());
        let (before, writes) = (image(&*o0), o0.writes());
        let pool = Pool::import_with(&tank_devs.specs(), tank_devs.opener()).expect("a foreign label in a cache or spare slot refused the import");
        let (state, note) = leaf_status(&pool, slot);
        assert_eq!(state, "UNAVAIL", "{slot}");
        assert_eq!(note, format!("label belongs to pool 'other' (guid {other_guid})"), "{slot}");
        assert_eq!(pool.status().state, "ONLINE", "an unusable {slot} degraded the pool");
        check_volume(&pool, 1);
        write_volume(&pool, 2);
        pool.sync().unwrap();
        pool.scrub(ScrubCmd::Start).unwrap();
        pool.scrub_wait().unwrap();
        pool.trim(zilla_core::spa::trim::TrimCmd::Start).unwrap();
        pool.sync().unwrap();
        check_volume(&pool, 2);
        pool.export().unwrap();
        drop(pool);
        assert_eq!(o0.writes(), writes, "tank wrote to other's device in its {slot} slot");
        assert!(image(&*o0) == before, "other's device changed while in tank's {slot} slot");
        // the other pool is whole
        let other = Pool::import_with(&other_devs.specs(), other_devs.opener()).expect("other no longer imports");
        other.export().unwrap();
        // write the volume back as it was for the next round
        tank_devs.insert(slot, if slot == "c0" { c0.clone() } else { s0.clone() });
        let pool = Pool::import_with(&tank_devs.specs(), tank_devs.opener()).expect("tank with its own devices back");
        assert_eq!(leaf_status(&pool, slot), ("ONLINE".to_string(), String::new()), "{slot} not back after export and import");
        write_volume(&pool, 1);
        pool.export().unwrap();
    }
}

#[test]
fn another_pools_disk_in_a_data_slot_refuses_the_import() {
    let tank_devs = exported_tank(3);
    let (_, o0, _) = exported_other();
    let m0a = tank_devs.get("m0a");
    tank_devs.insert("m0a", o0.clone());
    let writes = o0.writes();
    let e = Pool::import_with(&tank_devs.specs(), tank_devs.opener()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("m0a belongs to another pool ('other'"), "{e}");
    assert_eq!(o0.writes(), writes, "a refused import wrote to the other pool's device");
    tank_devs.insert("m0a", m0a);
    let pool = import(&tank_devs);
    check_volume(&pool, 3);
    pool.export().unwrap();
}

#[test]
fn a_blank_device_in_a_cache_slot_says_so_and_online_takes_the_right_one_back() {
    let tank_devs = exported_tank(4);
    let c0 = tank_devs.get("c0");
    tank_devs.insert("c0", Arc::new(MemDevice::new(DEV)));
    let pool = import(&tank_devs);
    assert_eq!(leaf_status(&pool, "c0"), ("UNAVAIL".to_string(), "no valid label".to_string()));
    let e = pool.online("c0").unwrap_err();
    assert!(e.to_string().contains("cannot online c0: no valid label"), "{e}");
    // the admin puts the pool's own cache device back: online takes it
    tank_devs.insert("c0", c0);
    pool.online("c0").expect("online of the cache device once it is back");
    assert_eq!(leaf_status(&pool, "c0").0, "ONLINE");
    assert!(pool.l2_stats().is_some(), "the cache device brought online is not used by the L2ARC");
    check_volume(&pool, 4);
    pool.export().unwrap();
    let pool = import(&tank_devs);
    assert_eq!(leaf_status(&pool, "c0").0, "ONLINE");
    pool.export().unwrap();
}

// ---------------------------------------------------------------------------------
// real files: the other pool imported (its disk held) while tank imports
// ---------------------------------------------------------------------------------

fn file(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(DEV).unwrap();
    p
}

fn spec(p: &Path) -> LeafSpec {
    LeafSpec { path: p.to_path_buf(), model: None }
}

#[test]
fn a_symlink_to_an_imported_pools_disk_in_a_cache_slot_leaves_the_slot_unavail() {
    let dir = tempfile::tempdir().unwrap();
    let (a0, a1, c0, d0) = (file(dir.path(), "tank-a0"), file(dir.path(), "tank-a1"), file(dir.path(), "tank-c0"), file(dir.path(), "other-d0"));
    let other = Pool::create("other", vec![TopSpec { role: Role::Normal, mirror: false, leaves: vec![spec(&d0)] }], CreateOptions::default()).unwrap();
    let tops = vec![
        TopSpec { role: Role::Normal, mirror: true, leaves: vec![spec(&a0), spec(&a1)] },
        TopSpec { role: Role::Cache, mirror: false, leaves: vec![spec(&c0)] },
    ];
    let tank = Pool::create("tank", tops, CreateOptions::default()).unwrap();
    let leaves: Vec<LeafSpec> = [&a0, &a1, &c0].iter().map(|p| spec(p)).collect();
    tank.export().unwrap();
    drop(tank);
    // the cache path now leads to other's disk, which other holds
    let real = dir.path().join("tank-c0.real");
    std::fs::rename(&c0, &real).unwrap();
    std::os::unix::fs::symlink(&d0, &c0).unwrap();
    let tank = Pool::import_leaves(&leaves).expect("a held foreign disk in the cache slot refused the import");
    let (state, note) = leaf_status(&tank, &c0.display().to_string());
    assert_eq!(state, "UNAVAIL");
    assert_eq!(note, format!("label belongs to pool 'other' (guid {}); the device is in use", other.guid()));
    // the admin fixes the link: online takes the cache device back
    std::fs::remove_file(&c0).unwrap();
    std::fs::rename(&real, &c0).unwrap();
    tank.online(&c0.display().to_string()).expect("online after the link is fixed");
    assert_eq!(leaf_status(&tank, &c0.display().to_string()).0, "ONLINE");
    tank.export().unwrap();
    drop(tank);
    // other is unharmed and still imports; tank too, its cache device ONLINE
    other.export().unwrap();
    drop(other);
    Pool::import_leaves(&[spec(&d0)]).expect("other").export().unwrap();
    let tank = Pool::import_leaves(&leaves).expect("tank");
    assert_eq!(leaf_status(&tank, &c0.display().to_string()).0, "ONLINE");
    tank.export().unwrap();
}

#[test]
fn a_symlink_to_an_imported_pools_disk_in_a_data_slot_refuses_the_import_as_busy() {
    let dir = tempfile::tempdir().unwrap();
    let (a0, a1, d0) = (file(dir.path(), "tank-a0"), file(dir.path(), "tank-a1"), file(dir.path(), "other-d0"));
    let other = Pool::create("other", vec![TopSpec { role: Role::Normal, mirror: false, leaves: vec![spec(&d0)] }], CreateOptions::default()).unwrap();
    let tank = Pool::create("tank", vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![spec(&a0), spec(&a1)] }], CreateOptions::default()).unwrap();
    tank.export().unwrap();
    drop(tank);
    std::fs::rename(&a1, dir.path().join("tank-a1.real")).unwrap();
    std::os::unix::fs::symlink(&d0, &a1).unwrap();
    let e = Pool::import_leaves(&[spec(&a0), spec(&a1)]).map(|_| ()).unwrap_err();
    assert!(matches!(e, zilla_core::Error::Busy(_)), "{e:?}");
    other.export().unwrap();
}
