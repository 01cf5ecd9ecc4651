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
    // the count the secondarycache tests rely on sees a volume's blocks there
    let held = pool.l2_blocks_of_volume("v").unwrap();
    assert!(held as u64 * BS as u64 >= 16 * MIB, "only {held} of the volume's blocks found on the cache device: {before:?}");
    read_all(&pool, 7);
    let after = pool.l2_stats().unwrap();
    assert!(after.l2_hits > before.l2_hits, "no L2 hits: {after:?}");
    assert_eq!(after.l2_cksum_bad, 0);
    let per_block = after.l2_hdr_size as f64 / after.l2_blocks as f64;
    assert!(per_block <= 64.0, "{per_block:.1} bytes of DRAM per block on the cache device: {after:?}");

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

/// Wait until the pool's L2ARC rebuild has run (it runs on the feed thread at import).
fn rebuilt(pool: &Pool) -> zilla_core::l2arc::L2Stats {
    let t = Instant::now();
    loop {
        let s = pool.l2_stats().expect("an L2ARC");
        if s.l2_rebuild_log_blks > 0 || s.l2_rebuild_dh_errors > 0 || s.l2_rebuild_unsupported > 0 || s.l2_rebuild_cksum_lb_errors > 0 || t.elapsed() > Duration::from_secs(10) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_cache_device_is_warm_again_after_an_export_and_import() {
    let cache: Arc<dyn Device> = Arc::new(MemDevice::new(256 * MIB));
    let (devs, pool) = pool_with_cache("l2p", cache, 5);
    warm(&pool, 5, 32 * MIB);
    let before = pool.l2_stats().unwrap();
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_bufs > 0 && s.l2_size >= before.l2_size / 2, "little came back: {s:?} (before export {before:?})");
    read_all(&pool, 5);
    let after = pool.l2_stats().unwrap();
    assert!(after.l2_hits > 0, "no hits from the rebuilt headers: {after:?}");
    assert_eq!(after.l2_cksum_bad, 0, "a rebuilt header pointed at other bytes: {after:?}");
}

#[test]
fn an_interrupted_batch_and_crafted_log_blocks_are_never_trusted() {
    use zilla_core::l2arc::persist::{DevHeader, LogBlock, DEV_HDR_BYTES};
    let cache: Arc<dyn Device> = Arc::new(MemDevice::new(256 * MIB));
    let (devs, pool) = pool_with_cache("l2c", cache.clone(), 9);
    warm(&pool, 9, 32 * MIB);
    pool.export().unwrap();
    drop(pool);
    // the header as a crash left it between steps 1 and 2 of the newest batch, and
    // that batch half overwritten with other bytes
    let hdr_at = zilla_core::vdev::label::DATA_START;
    let mut b = vec![0u8; DEV_HDR_BYTES as usize];
    cache.read_at(&mut b, hdr_at).unwrap();
    let mut h = DevHeader::decode(&b).expect("a device header");
    let mut lb = vec![0u8; h.newest_log_len as usize];
    cache.read_at(&mut lb, h.newest_log).unwrap();
    let newest = LogBlock::decode(&lb).expect("the newest log block");
    h.evict_from = newest.batch_start;
    h.evict_to = h.newest_log + h.newest_log_len as u64;
    cache.write_at(&h.encode(), hdr_at).unwrap();
    let junk = vec![0x5Au8; ((newest.batch_end - newest.batch_start) / 2) as usize];
    cache.write_at(&junk, newest.batch_start).unwrap();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_cksum_lb_errors > 0, "the interrupted batch was trusted: {s:?}");
    read_all(&pool, 9);
    read_all(&pool, 9);
    let after = pool.l2_stats().unwrap();
    assert_eq!(after.l2_cksum_bad, 0, "a header of the interrupted batch was restored: {after:?}");
}

#[test]
fn another_pools_cache_device_is_reset_not_served() {
    let ca: Arc<dyn Device> = Arc::new(MemDevice::new(256 * MIB));
    let cb: Arc<dyn Device> = Arc::new(MemDevice::new(256 * MIB));
    let (da, a) = pool_with_cache("l2s", ca.clone(), 11);
    let (_db, b) = pool_with_cache("l2t", cb.clone(), 12);
    warm(&a, 11, 16 * MIB);
    warm(&b, 12, 16 * MIB);
    a.export().unwrap();
    b.export().unwrap();
    drop((a, b));
    // pool a's cache device now holds pool b's copies (same block addresses)
    let mut img = vec![0u8; 256 * MIB as usize];
    cb.read_at(&mut img, 0).unwrap();
    // keep a's labels (the pool must still import it as its cache device)
    let labels = zilla_core::vdev::label::DATA_START as usize;
    ca.write_at(&img[labels..], labels as u64).unwrap();
    let a = import(&da);
    let s = rebuilt(&a);
    assert!(s.l2_rebuild_unsupported > 0 && s.l2_rebuild_bufs == 0, "another pool's device was trusted: {s:?}");
    read_all(&a, 11);
}

#[test]
fn crafted_log_entries_with_valid_checksums_restore_nothing_outside_the_ring() {
    use zilla_core::l2arc::persist::{DevHeader, LogBlock, DEV_HDR_BYTES};
    let cache: Arc<dyn Device> = Arc::new(MemDevice::new(256 * MIB));
    let (devs, pool) = pool_with_cache("l2d", cache.clone(), 13);
    warm(&pool, 13, 32 * MIB);
    pool.export().unwrap();
    drop(pool);
    let hdr_at = zilla_core::vdev::label::DATA_START;
    let mut b = vec![0u8; DEV_HDR_BYTES as usize];
    cache.read_at(&mut b, hdr_at).unwrap();
    let h = DevHeader::decode(&b).expect("a device header");
    let mut lb = vec![0u8; h.newest_log_len as usize];
    cache.read_at(&mut lb, h.newest_log).unwrap();
    let mut newest = LogBlock::decode(&lb).expect("the newest log block");
    let n = newest.entries.len() as u64;
    // every way an entry can point outside its batch, re-encoded with a valid checksum
    for (i, e) in newest.entries.iter_mut().enumerate() {
        match i % 4 {
            0 => e.addr = u64::MAX - 4096,
            1 => e.len = u32::MAX,
            2 => e.len = 0,
            _ => e.addr = newest.batch_end,
        }
    }
    cache.write_at(&newest.encode(), h.newest_log).unwrap();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_log_blks > 0, "{s:?}");
    // the crafted block itself passed its checks; its entries were refused one by one
    // (older batches, when the warm-up wrote more than one, may come back)
    let s = pool.l2_stats().unwrap();
    assert_eq!(s.l2_rebuild_cksum_lb_errors, 0, "{s:?}");
    assert!(s.l2_rebuild_bufs + n > n || s.l2_blocks == 0, "{s:?}");
    read_all(&pool, 13);
    read_all(&pool, 13);
    let after = pool.l2_stats().unwrap();
    assert_eq!(after.l2_cksum_bad, 0, "a crafted entry became a header: {after:?}");
    assert_eq!(after.l2_io_error, 0, "a crafted entry was read: {after:?}");
}


#[test]
fn secondarycache_none_keeps_a_volumes_data_off_the_cache_device() {
    zilla_core::arc::ZFS_ARC_MAX.set(64 * MIB).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 256 * MIB);
    devs.insert("c0", Arc::new(MemDevice::new(256 * MIB)));
    let pool = Pool::create_with("l2n", tops_with_cache(), zilla_core::spa::CreateOptions::default(), devs.opener()).expect("create");
    pool.volume_create("v", VOL, BS as u32, &[("secondarycache".into(), "none".into())]).unwrap();
    let v = pool.open_volume("v").unwrap();
    // the second pass rewrites every indirect block: its sync reads the old ones
    for _pass in 0..2 {
        for off in (0..VOL).step_by(MIB as usize) {
            v.write(off, &pattern(17 ^ off, MIB as usize), false).unwrap();
        }
        pool.sync().unwrap();
    }
    v.flush().unwrap();
    drop(v);
    pool.sync().unwrap();
    // written blocks and read blocks both pass through the ARC and are evicted
    for _ in 0..3 {
        read_all(&pool, 17);
        std::thread::sleep(Duration::from_millis(1200));
    }
    let s = pool.l2_stats().unwrap();
    // neither its data nor its indirect blocks (the pool's own metadata may go there)
    let held = pool.l2_blocks_of_volume("v").unwrap();
    assert_eq!(held, 0, "{held} blocks of a secondarycache=none volume reached the cache device: {s:?}");
}

/// Compressible data: runs of a byte from the pattern, so lz4 shrinks every block.
fn compressible(seed: u64, len: usize) -> Vec<u8> {
    pattern(seed, len / 64).iter().flat_map(|&b| std::iter::repeat_n(b, 64)).collect()
}

#[test]
fn compressed_blocks_are_served_verified_against_their_block_pointers() {
    zilla_core::arc::ZFS_ARC_MAX.set(64 * MIB).unwrap();
    let cache = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(256 * MIB))));
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 256 * MIB);
    devs.insert("c0", cache.clone());
    let pool = Pool::create_with("l2z", tops_with_cache(), zilla_core::spa::CreateOptions::default(), devs.opener()).expect("create");
    pool.volume_create("v", VOL, BS as u32, &[("compression".into(), "lz4".into())]).unwrap();
    let v = pool.open_volume("v").unwrap();
    for off in (0..VOL).step_by(MIB as usize) {
        v.write(off, &compressible(off, MIB as usize), false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    let check = |pass: &str| {
        let mut b = vec![0u8; MIB as usize];
        for off in (0..VOL).step_by(MIB as usize) {
            v.read(off, &mut b).unwrap();
            assert!(b == compressible(off, MIB as usize), "{pass}: wrong data at {off}");
        }
    };
    let t = Instant::now();
    while pool.l2_stats().unwrap().l2_size < 32 * MIB {
        check("warming");
        assert!(t.elapsed() < Duration::from_secs(60), "the cache device did not fill: {:?}", pool.l2_stats());
        std::thread::sleep(Duration::from_millis(1200));
    }
    let before = pool.l2_stats().unwrap();
    check("warm");
    let after = pool.l2_stats().unwrap();
    assert!(after.l2_hits > before.l2_hits, "no L2 hits on compressed blocks: {after:?}");
    assert_eq!(after.l2_cksum_bad, 0, "good copies of compressed blocks failed their check: {after:?}");
    // one byte changed in every copy: no hit, each counted, the data from the pool
    let ring = 8 * MIB..248 * MIB;
    for off in ring.step_by(4096) {
        let mut b = vec![0u8; 1];
        cache.read_at(&mut b, off + 100).unwrap();
        b[0] ^= 1;
        cache.write_at(&b, off + 100).unwrap();
    }
    // (the feed goes on writing good copies meanwhile: those may hit)
    check("corrupt");
    let bad = pool.l2_stats().unwrap();
    assert!(bad.l2_cksum_bad > 0, "corrupt copies of compressed blocks were not noticed: {bad:?}");
}

/// A volume of 4K blocks with one block written in every level-1 span (1024 blocks, 4
/// MiB): each block read needs its own 128 KiB indirect block, so 2048 of them (256 MiB
/// of metadata) pass through a 64 MiB ARC and are evicted. `secondarycache` is the
/// volume's; returns the pool's L2 figures after three read passes.
/// The pool's L2ARC statistics and how many of the volume's blocks its cache holds.
fn indirect_heavy_pool(name: &str, secondarycache: &str) -> (zilla_core::l2arc::L2Stats, usize) {
    const SPAN: u64 = 4 * MIB;
    const SPANS: u64 = 2048;
    zilla_core::arc::ZFS_ARC_MAX.set(64 * MIB).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 256 * MIB);
    devs.insert("c0", Arc::new(MemDevice::new(256 * MIB)));
    let pool = Pool::create_with(name, tops_with_cache(), zilla_core::spa::CreateOptions::default(), devs.opener()).expect("create");
    pool.volume_create("v", SPAN * SPANS, 4096, &[("secondarycache".into(), secondarycache.into())]).unwrap();
    let v = pool.open_volume("v").unwrap();
    for i in 0..SPANS {
        v.write(i * SPAN, &pattern(i, 4096), false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    let mut b = vec![0u8; 4096];
    for _ in 0..3 {
        for i in 0..SPANS {
            v.read(i * SPAN, &mut b).unwrap();
            assert!(b == pattern(i, 4096), "wrong data in span {i}");
        }
        std::thread::sleep(Duration::from_millis(1200));
    }
    (pool.l2_stats().unwrap(), pool.l2_blocks_of_volume("v").unwrap())
}

#[test]
fn secondarycache_keeps_a_volumes_indirect_blocks_where_it_says() {
    // metadata: the evicted indirect blocks reach the cache device (so the workload
    // does feed indirect blocks), its 4K data blocks do not
    let (meta, meta_held) = indirect_heavy_pool("l2im", "metadata");
    assert!(meta_held >= 256, "the cache device holds {meta_held} of the volume's blocks: {meta:?}");
    assert!(meta.l2_blocks >= 256, "indirect blocks of a secondarycache=metadata volume did not reach the cache device: {meta:?}");
    assert!(meta.l2_size >= meta.l2_blocks * (64 << 10), "small (data) blocks on the cache device of a secondarycache=metadata volume: {meta:?}");
    // none: not one of the same indirect blocks
    // (pool metadata, the MOS's blocks, may be there: it is not the volume's)
    let (none, none_held) = indirect_heavy_pool("l2in", "none");
    assert_eq!(none_held, 0, "indirect blocks of a secondarycache=none volume reached the cache device: {none:?}");
    assert!(none.l2_blocks <= 16, "more than the pool's metadata on the cache device: {none:?}");
}
