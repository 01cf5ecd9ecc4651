//! The L2ARC on cache devices: blocks the ARC evicts are written to the pool's cache
//! device and served from it, verified; a corrupt, failing or foreign copy is never
//! returned, is counted, and the read goes to the pool.
mod common;
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::{FaultDevice, MemDevice};
use zilla_core::vdev::{Device, Role};

const MIB: u64 = 1 << 20;
const VOL: u64 = 112 * MIB;
const BS: usize = 16384;

fn tops_with_cache() -> Vec<TopSpec> {
    let mut t = two_mirrors();
    t.push(TopSpec { role: Role::Cache, mirror: false, leaves: vec![leaf("c0")] });
    t
}

/// A pool named `name` on fresh devices whose cache device is `cache`, its volume
/// written with pattern `seed`.
fn pool_with_cache(name: &str, cache: Arc<dyn Device>, seed: u64) -> (DevSet, Arc<Pool>) {
    // the daemon's ARC at its floor, so the volume does not fit and eviction feeds the
    // cache device
    zilla_core::arc::ZFS_ARC_MAX.set(64 * MIB).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 256 * MIB);
    devs.insert("c0", cache);
    let pool = Pool::create_with(name, tops_with_cache(), zilla_core::spa::CreateOptions::default(), devs.opener()).expect("create");
    pool.volume_create("v", VOL, BS as u32, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    for off in (0..VOL).step_by(MIB as usize) {
        v.write(off, &pattern(seed ^ off, MIB as usize), false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    (devs, pool)
}

/// Read the whole volume and check it (a pass that also evicts and so feeds).
fn read_all(pool: &Pool, seed: u64) {
    let v = pool.open_volume("v").unwrap();
    let mut b = vec![0u8; MIB as usize];
    for off in (0..VOL).step_by(MIB as usize) {
        v.read(off, &mut b).unwrap();
        assert!(b == pattern(seed ^ off, MIB as usize), "wrong data at {off}");
    }
}

/// Read passes until the cache device holds at least `bytes` (the feed runs each second).
fn warm(pool: &Pool, seed: u64, bytes: u64) {
    let t = Instant::now();
    loop {
        read_all(pool, seed);
        let l2 = pool.l2_stats().expect("the pool has an L2ARC");
        if l2.l2_size >= bytes {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the cache device did not fill: {l2:?}");
        std::thread::sleep(Duration::from_millis(1200));
    }
}

#[test]
fn evicted_blocks_are_served_from_the_cache_device_and_bad_copies_never_are() {
    let cache = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(256 * MIB))));
    let (_devs, pool) = pool_with_cache("l2a", cache.clone(), 7);
    warm(&pool, 7, 32 * MIB);
    let before = pool.l2_stats().unwrap();
    read_all(&pool, 7);
    let after = pool.l2_stats().unwrap();
    assert!(after.l2_hits > before.l2_hits, "no L2 hits: {after:?}");
    assert_eq!(after.l2_cksum_bad, 0);

    // scribble over the whole ring: every copy fails its check, the data still comes
    // from the pool, and the bad copies are forgotten
    let junk = vec![0xA5u8; MIB as usize];
    for off in (8 * MIB..248 * MIB).step_by(MIB as usize) {
        cache.write_at(&junk, off).unwrap();
    }
    read_all(&pool, 7);
    let bad = pool.l2_stats().unwrap();
    assert!(bad.l2_cksum_bad > 0, "corrupt copies were not noticed: {bad:?}");

    // a cache device whose reads fail: counted, faulted after a run of errors, the pool
    // carries on
    warm(&pool, 7, 16 * MIB);
    cache.fail_reads(true);
    read_all(&pool, 7);
    read_all(&pool, 7);
    let failed = pool.l2_stats().unwrap();
    assert!(failed.l2_io_error >= zilla_core::l2arc::FAULT_AFTER_ERRORS, "{failed:?}");
    let status = pool.status();
    let text = format!("{status:?}");
    assert!(text.contains("FAULTED"), "the cache device is not shown faulted: {text}");
    assert_eq!(failed.l2_size, 0, "a faulted cache device keeps its headers");
    read_all(&pool, 7);
}

#[test]
fn two_pools_never_serve_each_others_blocks() {
    // the same layout and block addresses in both pools, different bytes
    let (_da, a) = pool_with_cache("l2x", Arc::new(MemDevice::new(256 * MIB)), 1);
    let (_db, b) = pool_with_cache("l2y", Arc::new(MemDevice::new(256 * MIB)), 2);
    warm(&a, 1, 16 * MIB);
    warm(&b, 2, 16 * MIB);
    for _ in 0..2 {
        read_all(&a, 1);
        read_all(&b, 2);
    }
    assert!(a.l2_stats().unwrap().l2_hits > 0 && b.l2_stats().unwrap().l2_hits > 0);
}

#[test]
fn a_cache_device_added_live_is_fed_and_one_removed_is_never_written_again() {
    zilla_core::arc::ZFS_ARC_MAX.set(64 * MIB).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 256 * MIB);
    let pool = Pool::create_with("l2live", two_mirrors(), zilla_core::spa::CreateOptions::default(), devs.opener()).expect("create");
    pool.volume_create("v", VOL, BS as u32, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    for off in (0..VOL).step_by(MIB as usize) {
        v.write(off, &pattern(3 ^ off, MIB as usize), false).unwrap();
    }
    v.flush().unwrap();
    drop(v);
    pool.sync().unwrap();
    assert!(pool.l2_stats().is_none(), "an L2ARC without cache devices");
    let cache: Arc<dyn Device> = Arc::new(MemDevice::new(256 * MIB));
    devs.insert("c0", cache.clone());
    pool.add(vec![TopSpec { role: Role::Cache, mirror: false, leaves: vec![leaf("c0")] }], false).unwrap();
    warm(&pool, 3, 16 * MIB);
    read_all(&pool, 3);
    assert!(pool.l2_stats().unwrap().l2_hits > 0, "{:?}", pool.l2_stats());
    pool.remove("c0").unwrap();
    let image = |d: &Arc<dyn Device>| {
        let mut b = vec![0u8; 256 * MIB as usize];
        d.read_at(&mut b, 0).unwrap();
        zilla_core::block::checksum::fletcher4(&b)
    };
    let after_remove = image(&cache);
    // reads go on, the ARC evicts, the feed runs: nothing reaches the removed device
    read_all(&pool, 3);
    std::thread::sleep(Duration::from_millis(2500));
    read_all(&pool, 3);
    assert_eq!(image(&cache), after_remove, "the L2ARC wrote to a device removed from the pool");
    assert_eq!(pool.l2_stats().map(|s| s.l2_size).unwrap_or(0), 0);
}
