//! A mirror child put back with old contents (a disk pulled and reinserted, restored
//! from an image) or with contents written apart from the pool (imported alone
//! elsewhere) is found at import by its uberblocks: it gets what it misses in its DTL,
//! reads of those txgs go to its siblings, it is never counted as a current copy by
//! `offline`, `status` says why, and a resilver makes it whole.
mod common;
use std::sync::Arc;

use common::*;
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::MemDevice;
use zilla_core::vdev::{Device, Role};

const SIZE: u64 = 96 << 20;
/// Two L1 spans of 16K blocks: a resilver paused after its first span is unfinished.
const VOL: u64 = 32 << 20;

/// The tests of this file set `zfs_scan_pause_every_spans`, a process-wide tunable.
static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn mirror() -> Vec<TopSpec> {
    vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }]
}

fn image(d: &Arc<dyn Device>) -> Vec<u8> {
    let mut b = vec![0u8; d.size() as usize];
    d.read_at(&mut b, 0).unwrap();
    b
}

fn device_from(img: &[u8]) -> Arc<dyn Device> {
    let d = MemDevice::new(img.len() as u64);
    d.write_at(img, 0).unwrap();
    Arc::new(d)
}

/// A set with only the named devices of `devs` (the others missing).
fn only(devs: &DevSet, names: &[&str]) -> DevSet {
    let s = DevSet::default();
    for n in names {
        s.insert(n, devs.get(n));
    }
    s
}

fn import_set(devs: &DevSet) -> Arc<Pool> {
    Pool::import_with(&devs.specs(), devs.opener()).expect("import")
}

/// Write `data` at `off`, note it in `want`, and sync it.
fn write(pool: &Pool, want: &mut [u8], off: u64, data: &[u8]) {
    let v = pool.open_volume("vol").unwrap();
    v.write(off, data, false).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.sync().unwrap();
    want[off as usize..off as usize + data.len()].copy_from_slice(data);
}

fn check(pool: &Pool, want: &[u8], what: &str) {
    let v = pool.open_volume("vol").unwrap();
    let mut got = vec![0u8; want.len()];
    v.read(0, &mut got).unwrap_or_else(|e| panic!("{what}: read failed: {e}"));
    let first_bad = got.iter().zip(want).position(|(g, w)| g != w);
    assert!(first_bad.is_none(), "{what}: data differs from byte {first_bad:?}");
}

fn leaf_note(pool: &Pool, name: &str) -> String {
    let st = pool.status();
    st.config.iter().flat_map(|t| t.children.iter()).find(|l| l.name == name).map(|l| l.note.clone()).unwrap()
}

/// Finish the resilver (let it run unpaused), then offline `keep_out`, export and
/// import (a cold cache): the other child alone must serve everything.
fn resilver_then_read_from_the_other(pool: Arc<Pool>, devs: &DevSet, keep_out: &str, want: &[u8]) {
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 0).unwrap();
    pool.export().unwrap();
    drop(pool);
    let pool = import_set(devs);
    pool.scrub_wait().unwrap();
    let scan = pool.scan_status();
    assert!(scan.func == "resilver" && scan.state == "finished" && scan.errors == 0, "{scan:?}");
    pool.offline(keep_out).expect("offline after the resilver finished");
    pool.export().unwrap();
    drop(pool);
    let pool = import_set(devs);
    check(&pool, want, "the resilvered child alone");
    pool.export().unwrap();
}

/// A mirror whose child b missed two writes (put back from an image taken before
/// them), imported with the resilver stopped after its first span: the pool, the devices
/// and the contents every read must return.
fn stale_b_with_resilver_stopped() -> (Arc<Pool>, DevSet, Vec<u8>) {
    let devs = mem_devs(&["a", "b"], SIZE);
    let pool = create(&devs, mirror());
    pool.volume_create("vol", VOL, 16384, &[]).unwrap();
    let mut want = vec![0u8; VOL as usize];
    write(&pool, &mut want, 0, &pattern(1, 4 << 20));
    write(&pool, &mut want, 20 << 20, &pattern(2, 1 << 20));
    pool.export().unwrap();
    drop(pool);
    let old_b = image(&devs.get("b"));

    let pool = import(&devs);
    write(&pool, &mut want, 2 << 20, &pattern(3, 4 << 20));
    write(&pool, &mut want, 24 << 20, &pattern(4, 1 << 20));
    pool.export().unwrap();
    drop(pool);

    devs.insert("b", device_from(&old_b));
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 1).unwrap();
    let pool = import(&devs);
    pool.scrub_wait().unwrap();
    (pool, devs, want)
}

#[test]
fn a_stale_child_is_resilvered_and_never_taken_for_the_last_copy() {
    let _one = ONE_AT_A_TIME.lock();
    let (pool, devs, want) = stale_b_with_resilver_stopped();
    assert_eq!(pool.status().state, "DEGRADED", "a stale child shown as current: {:?}", pool.status().config);
    let note = leaf_note(&pool, "b");
    assert!(note.contains("missed txgs"), "status does not say b missed txgs: {note:?}");
    let e = pool.offline("a").expect_err("offline of the only current child accepted");
    assert!(e.to_string().contains("only device holding"), "{e}");
    check(&pool, &want, "before the resilver");
    resilver_then_read_from_the_other(pool, &devs, "a", &want);
}

/// A scrub asked for while the resilver of a stale child is stopped resumes the
/// resilver (a scrub over it would forget the child's missing txgs).
#[test]
fn a_scrub_asked_for_over_a_stopped_resilver_resumes_the_resilver() {
    let _one = ONE_AT_A_TIME.lock();
    let (pool, _devs, want) = stale_b_with_resilver_stopped();
    let scan = pool.scan_status();
    assert!(scan.func == "resilver" && scan.state == "paused", "{scan:?}");
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 0).unwrap();
    let e = pool.scrub(zilla_core::spa::ScrubCmd::Start).expect_err("a scrub replaced a stopped resilver");
    assert!(e.to_string().contains("resilver"), "{e}");
    pool.scrub_wait().unwrap();
    let scan = pool.scan_status();
    assert!(scan.func == "resilver" && scan.state == "finished" && scan.errors == 0, "{scan:?}");
    assert_eq!(pool.status().state, "ONLINE", "b still misses txgs: {:?}", pool.status().config);
    pool.scrub(zilla_core::spa::ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    let scan = pool.scan_status();
    assert!(scan.func == "scrub" && scan.state == "finished" && scan.errors == 0, "{scan:?}");
    pool.offline("a").expect("offline after the resilver finished");
    check(&pool, &want, "b alone");
    pool.export().unwrap();
}

/// As `zpool import` of each half of a split mirror: a alone is written (more txgs),
/// then b alone; together, the pool is a's, b is diverged and rebuilt from a, and no
/// block of b's other life is served.
#[test]
fn halves_written_apart_import_as_one_side_with_the_other_diverged() {
    let _one = ONE_AT_A_TIME.lock();
    let devs = mem_devs(&["a", "b"], SIZE);
    let pool = create(&devs, mirror());
    pool.volume_create("vol", VOL, 16384, &[]).unwrap();
    let mut want = vec![0u8; VOL as usize];
    write(&pool, &mut want, 0, &pattern(1, 8 << 20));
    write(&pool, &mut want, 20 << 20, &pattern(2, 2 << 20));
    pool.export().unwrap();
    drop(pool);

    let side_a = import_set(&only(&devs, &["a"]));
    // more txgs than b's side below: a's is the newest
    for i in 0..12u64 {
        write(&side_a, &mut want, ((i % 4) * 2) << 20, &pattern(10 + i, 1 << 20));
    }
    side_a.export().unwrap();
    drop(side_a);
    let mut theirs = vec![0u8; VOL as usize];
    let side_b = import_set(&only(&devs, &["b"]));
    // overwritten again and again: blocks of the common past that a still references
    // are freed on b and their space reused
    for i in 0..4u64 {
        write(&side_b, &mut theirs, 1 << 20, &pattern(20 + i, 6 << 20));
        write(&side_b, &mut theirs, 21 << 20, &pattern(30 + i, 1 << 20));
    }
    side_b.export().unwrap();
    drop(side_b);

    zilla_core::tunables().set("zfs_scan_pause_every_spans", 1).unwrap();
    let pool = import(&devs);
    pool.scrub_wait().unwrap();
    let note = leaf_note(&pool, "b");
    assert!(note.contains("diverged"), "status does not say b is diverged: {note:?}");
    assert!(leaf_note(&pool, "a").is_empty(), "{:?}", leaf_note(&pool, "a"));
    pool.offline("a").expect_err("offline of the only trusted child accepted");
    check(&pool, &want, "a's side");
    resilver_then_read_from_the_other(pool, &devs, "a", &want);
}

/// A copy of b taken aside, imported alone elsewhere and written, is put back in b's
/// place while the pool went on with both children: the pool never knew b was away
/// (its object directory says b holds everything), only the uberblocks tell.
#[test]
fn a_copy_written_elsewhere_and_put_back_is_diverged() {
    let _one = ONE_AT_A_TIME.lock();
    let devs = mem_devs(&["a", "b"], SIZE);
    let pool = create(&devs, mirror());
    pool.volume_create("vol", VOL, 16384, &[]).unwrap();
    let mut want = vec![0u8; VOL as usize];
    write(&pool, &mut want, 0, &pattern(1, 8 << 20));
    pool.export().unwrap();
    drop(pool);

    // the copy lives elsewhere: overwritten (its old blocks freed and their space reused)
    let elsewhere = DevSet::default();
    elsewhere.insert("b", device_from(&image(&devs.get("b"))));
    let other = import_set(&elsewhere);
    let mut theirs = vec![0u8; VOL as usize];
    for i in 0..3u64 {
        write(&other, &mut theirs, 0, &pattern(30 + i, 8 << 20));
    }
    other.export().unwrap();
    drop(other);

    let pool = import(&devs);
    for i in 0..6u64 {
        write(&pool, &mut want, (i * 3) << 20, &pattern(40 + i, 1 << 20));
    }
    pool.export().unwrap();
    drop(pool);

    devs.insert("b", device_from(&image(&elsewhere.get("b"))));
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 1).unwrap();
    let pool = import(&devs);
    pool.scrub_wait().unwrap();
    let note = leaf_note(&pool, "b");
    assert!(note.contains("diverged"), "status does not say b is diverged: {note:?}");
    pool.offline("a").expect_err("offline of the only trusted child accepted");
    check(&pool, &want, "with the diverged copy back");
    resilver_then_read_from_the_other(pool, &devs, "a", &want);
}
