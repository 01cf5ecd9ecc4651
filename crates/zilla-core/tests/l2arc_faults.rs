//! The L2ARC against a failing disk, a careless admin and an unfriendly image: cache
//! devices corrupted, truncated, swapped or erring while the pool runs and between
//! imports, cut off in the middle of a feed, added and removed under reads, and log
//! blocks crafted with valid checksums. Every read returns the bytes written, and the
//! counters (`l2_*`) say what happened.
mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::{CrashDevice, CrashMode, FaultDevice, MemDevice};
use zilla_core::vdev::{Device, Role};

const MIB: u64 = 1 << 20;
const VOL: u64 = 112 * MIB;
const BS: usize = 16384;
const POOL_DEV: u64 = 192 * MIB;

fn tops_with_caches(caches: &[&str]) -> Vec<TopSpec> {
    let mut t = two_mirrors();
    for c in caches {
        t.push(TopSpec { role: Role::Cache, mirror: false, leaves: vec![leaf(c)] });
    }
    t
}

/// A pool named `name` on fresh devices with cache devices `caches` (name, device),
/// its volume "v" written with pattern `seed`.
fn pool_with_caches(name: &str, caches: &[(&str, Arc<dyn Device>)], seed: u64) -> (DevSet, Arc<Pool>) {
    // the daemon's ARC at its floor: the volume does not fit, eviction feeds the L2ARC
    zilla_core::arc::ZFS_ARC_MAX.set(64 * MIB).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], POOL_DEV);
    for (n, d) in caches {
        devs.insert(n, d.clone());
    }
    let names: Vec<&str> = caches.iter().map(|(n, _)| *n).collect();
    let pool = Pool::create_with(name, tops_with_caches(&names), zilla_core::spa::CreateOptions::default(), devs.opener()).expect("create");
    pool.volume_create("v", VOL, BS as u32, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    for off in (0..VOL).step_by(MIB as usize) {
        v.write(off, &pattern(seed ^ off, MIB as usize), false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    (devs, pool)
}

/// Read the whole volume and check every byte (a pass that also evicts and so feeds).
fn read_all(pool: &Pool, seed: u64) {
    let v = pool.open_volume("v").unwrap();
    let mut b = vec![0u8; MIB as usize];
    for off in (0..VOL).step_by(MIB as usize) {
        v.read(off, &mut b).unwrap_or_else(|e| panic!("read at {off} failed: {e}"));
        assert!(b == pattern(seed ^ off, MIB as usize), "wrong data at {off}: {:?}", pool.l2_stats());
    }
}

fn l2(pool: &Pool) -> zilla_core::l2arc::L2Stats {
    pool.l2_stats().expect("the pool has an L2ARC")
}

/// Read passes until the cache devices hold at least `bytes` (the feed runs each second).
fn warm(pool: &Pool, seed: u64, bytes: u64) {
    let t = Instant::now();
    loop {
        read_all(pool, seed);
        let s = l2(pool);
        if s.l2_size >= bytes {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the cache devices did not fill: {s:?}");
        std::thread::sleep(Duration::from_millis(1100));
    }
}

/// The pool's L2ARC once its rebuild has run (on the feed thread, at import).
fn rebuilt(pool: &Pool) -> zilla_core::l2arc::L2Stats {
    let t = Instant::now();
    loop {
        let s = l2(pool);
        let done = s.l2_rebuild_log_blks > 0 || s.l2_rebuild_dh_errors > 0 || s.l2_rebuild_unsupported > 0 || s.l2_rebuild_cksum_lb_errors > 0 || s.l2_rebuild_io_errors > 0;
        if done || t.elapsed() > Duration::from_secs(10) {
            // the walk may still be restoring: let it finish
            std::thread::sleep(Duration::from_millis(200));
            return l2(pool);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pool status` of the cache device `name`: its state ("" when it is not listed).
fn cache_state(pool: &Pool, name: &str) -> String {
    fn find(v: &[zilla_core::spa::VdevStatus], name: &str) -> Option<String> {
        v.iter().find_map(|s| if s.name == name { Some(s.state.clone()) } else { find(&s.children, name) })
    }
    find(&pool.status().config, name).unwrap_or_default()
}

// ---------------------------------------------------------------------------------
// 1. corrupt, truncate, swap, EIO: live and between imports
// ---------------------------------------------------------------------------------

#[test]
fn copies_corrupted_live_and_between_imports_are_counted_and_never_served() {
    let cache = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(160 * MIB))));
    let (devs, pool) = pool_with_caches("f_corrupt", &[("c0", cache.clone())], 21);
    warm(&pool, 21, 48 * MIB);
    // live: other bytes over every other MiB of the ring, behind the pool's back
    for (i, off) in (8 * MIB..152 * MIB).step_by(2 * MIB as usize).enumerate() {
        cache.corrupt(off, MIB, i as u64).unwrap();
    }
    let before = l2(&pool);
    read_all(&pool, 21);
    read_all(&pool, 21);
    let after = l2(&pool);
    assert!(after.l2_cksum_bad > before.l2_cksum_bad, "live corruption not noticed: {after:?}");
    assert!(after.l2_hits > before.l2_hits, "the intact copies were not served: {after:?}");

    // between imports: copies rewritten while the pool is exported (the first 64 KiB
    // of every batch the log names; the log blocks themselves intact). First a batch
    // written after the live corruption, so the newest log block is intact.
    warm(&pool, 21, 48 * MIB);
    let done = l2(&pool).l2_writes_done;
    let t = Instant::now();
    while l2(&pool).l2_writes_done == done {
        assert!(t.elapsed() < Duration::from_secs(60), "no feed after the corruption: {:?}", l2(&pool));
        read_all(&pool, 21);
        std::thread::sleep(Duration::from_millis(1100));
    }
    pool.export().unwrap();
    drop(pool);
    let raw: Arc<dyn Device> = cache.clone();
    let h = header_of(&raw);
    let (mut at, mut len, mut batches) = (h.newest_log, h.newest_log_len as u64, 0);
    while at != 0 && batches < 64 {
        // the chain ends where the live corruption above hit an older log block
        let mut b = vec![0u8; len as usize];
        raw.read_at(&mut b, at).unwrap();
        let Some(lb) = LogBlock::decode(&b) else { break };
        if lb.batch_end - lb.batch_start > 64 * 1024 {
            cache.corrupt(lb.batch_start, 64 * 1024, 1000 + batches).unwrap();
        }
        (at, len) = (lb.prev, lb.prev_len as u64);
        batches += 1;
    }
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_bufs > 0, "nothing restored: {s:?}");
    read_all(&pool, 21);
    read_all(&pool, 21);
    let after = l2(&pool);
    assert!(after.l2_cksum_bad > 0, "copies corrupted between imports were not noticed: {after:?}");
    assert!(after.l2_hits > 0, "no intact restored copy served: {after:?}");
    assert_eq!(cache_state(&pool, "c0"), "ONLINE", "bad copies are not device errors");

    // and the newest log block overwritten: nothing it or older ones name is trusted
    warm(&pool, 21, 48 * MIB);
    pool.export().unwrap();
    drop(pool);
    let h = header_of(&raw);
    cache.corrupt(h.newest_log, h.newest_log_len as u64, 7).unwrap();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_cksum_lb_errors > 0 && s.l2_rebuild_bufs == 0, "a corrupt log block was trusted: {s:?}");
    read_all(&pool, 21);
    pool.export().unwrap();
}

#[test]
fn a_cache_device_truncated_between_imports_is_not_trusted_and_the_pool_imports() {
    for keep in [96 * MIB, 64 * 1024, 0] {
        let cache: Arc<dyn Device> = Arc::new(MemDevice::new(160 * MIB));
        let name = format!("f_trunc{}", keep >> 10);
        let (devs, pool) = pool_with_caches(&name, &[("c0", cache.clone())], 22);
        warm(&pool, 22, 64 * MIB);
        pool.export().unwrap();
        drop(pool);
        // the file shrunk to `keep` bytes: its tail (and the labels there) gone
        let short: Arc<dyn Device> = Arc::new(MemDevice::new(keep));
        if keep > 0 {
            let mut b = vec![0u8; keep as usize];
            cache.read_at(&mut b, 0).unwrap();
            short.write_at(&b, 0).unwrap();
        }
        devs.insert("c0", short);
        let pool = Pool::import_with(&devs.specs(), devs.opener()).unwrap_or_else(|e| panic!("a pool whose cache device shrank to {keep} bytes does not import: {e}"));
        match pool.l2_stats() {
            Some(_) => {
                // the device header no longer matches the geometry: counted, and
                // nothing restored that is not on the device
                let s = rebuilt(&pool);
                assert!(s.l2_rebuild_unsupported + s.l2_rebuild_cksum_lb_errors > 0, "kept {keep} bytes: the shrink went unnoticed: {s:?}");
            }
            None => assert_ne!(cache_state(&pool, "c0"), "ONLINE", "kept {keep} bytes: a cache device too small to use is shown ONLINE"),
        }
        read_all(&pool, 22);
        read_all(&pool, 22);
        if let Some(s) = pool.l2_stats() {
            assert_eq!(s.l2_cksum_bad + s.l2_io_error, 0, "kept {keep} bytes: a restored header named bytes the device no longer has: {s:?}");
        }
        pool.export().unwrap();
    }
}

#[test]
fn a_cache_device_that_errs_live_is_counted_then_faulted_and_the_pool_serves() {
    let cache = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(160 * MIB))));
    let (devs, pool) = pool_with_caches("f_eio", &[("c0", cache.clone())], 23);
    warm(&pool, 23, 48 * MIB);
    // a few bad sectors: counted, the copies there dropped, the device stays ONLINE
    for off in [20 * MIB, 40 * MIB, 60 * MIB] {
        cache.fail_reads_in(off..off + 8192);
    }
    read_all(&pool, 23);
    read_all(&pool, 23);
    let s = l2(&pool);
    assert!(s.l2_io_error > 0 && s.l2_io_error < zilla_core::l2arc::FAULT_AFTER_ERRORS, "{s:?}");
    assert!(s.l2_hits > 0, "{s:?}");
    assert_eq!(cache_state(&pool, "c0"), "ONLINE");
    cache.clear();

    // writes fail while reads of the copies still work: the feed's errors fault the
    // device all the same. The volume is all on the device first, and a second
    // volume's new blocks give every feed a little work (a failed feed still moves the
    // hand and forgets what lies there: with big feeds the copies would be gone, and
    // the reads with them, before the runs of errors mattered)
    warm(&pool, 23, 100 * MIB);
    pool.volume_create("w", 32 * MIB, BS as u32, &[]).unwrap();
    let w = pool.open_volume("w").unwrap();
    cache.fail_writes(true);
    let t = Instant::now();
    let mut round = 0;
    while cache_state(&pool, "c0") != "FAULTED" {
        assert!(t.elapsed() < Duration::from_secs(40), "a cache device whose every write fails is never faulted: {:?}", l2(&pool));
        round += 1;
        w.write(round % 32 * MIB, &pattern(round, MIB as usize), false).unwrap();
        read_all(&pool, 23);
    }
    let s = l2(&pool);
    assert!(s.l2_writes_error >= zilla_core::l2arc::FAULT_AFTER_ERRORS, "{s:?}");
    assert_eq!(s.l2_size, 0, "a faulted cache device keeps its headers: {s:?}");
    let hits = s.l2_hits;
    read_all(&pool, 23);
    assert_eq!(l2(&pool).l2_hits, hits, "a faulted cache device served reads");

    // the admin replaces the disk's cable and clears the fault: the device is fed again
    cache.clear();
    pool.clear(Some("c0")).unwrap();
    assert_eq!(cache_state(&pool, "c0"), "ONLINE");
    let t = Instant::now();
    while l2(&pool).l2_size < 8 * MIB {
        assert!(t.elapsed() < Duration::from_secs(30), "a cache device cleared after its fault is shown ONLINE but never used: {:?}", l2(&pool));
        round += 1;
        w.write(round % 32 * MIB, &pattern(round, MIB as usize), false).unwrap();
        read_all(&pool, 23);
    }
    drop(w);

    // pulled (ENXIO) at the next import: the pool imports and serves
    pool.export().unwrap();
    drop(pool);
    cache.offline(true);
    let pool = import(&devs);
    read_all(&pool, 23);
    assert_ne!(cache_state(&pool, "c0"), "ONLINE", "a pulled cache device shown ONLINE");
    if let Some(s) = pool.l2_stats() {
        assert_eq!(s.l2_hits + s.l2_rebuild_bufs, 0, "{s:?}");
    }
    pool.export().unwrap();
}

#[test]
fn reads_failing_at_import_leave_the_cache_device_empty_and_the_pool_serving() {
    let cache = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(160 * MIB))));
    let (devs, pool) = pool_with_caches("f_eio_imp", &[("c0", cache.clone())], 24);
    warm(&pool, 24, 48 * MIB);
    pool.export().unwrap();
    drop(pool);
    // the ring unreadable (labels and header still readable): every log block errs
    cache.fail_reads_in(zilla_core::vdev::label::DATA_START + 4096..160 * MIB - 4 * MIB);
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_io_errors > 0 && s.l2_rebuild_bufs == 0, "{s:?}");
    read_all(&pool, 24);
    cache.clear();
    read_all(&pool, 24);
    let s = l2(&pool);
    assert_eq!(s.l2_cksum_bad, 0, "{s:?}");
    pool.export().unwrap();
}

#[test]
fn two_cache_devices_swapped_between_imports_serve_only_their_own_copies() {
    let c0: Arc<dyn Device> = Arc::new(MemDevice::new(96 * MIB));
    let c1: Arc<dyn Device> = Arc::new(MemDevice::new(96 * MIB));
    let (devs, pool) = pool_with_caches("f_swap1", &[("c0", c0.clone()), ("c1", c1.clone())], 25);
    warm(&pool, 25, 64 * MIB);
    pool.export().unwrap();
    drop(pool);
    // the two files exchanged under their names: the labels travel with them, so each
    // is still its own cache vdev and its log is its own
    devs.insert("c0", c1.clone());
    devs.insert("c1", c0.clone());
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert_eq!(s.l2_rebuild_success, 2, "{s:?}");
    read_all(&pool, 25);
    read_all(&pool, 25);
    let after = l2(&pool);
    assert!(after.l2_hits > 0, "{after:?}");
    assert_eq!(after.l2_cksum_bad, 0, "a restored header pointed at other bytes: {after:?}");
    warm(&pool, 25, 64 * MIB);
    pool.export().unwrap();
    drop(pool);

    // the rings exchanged under the labels (each device keeps its labels, its data area
    // is the other's): neither may trust the other's header
    let ring_of = |d: &Arc<dyn Device>| {
        let at = zilla_core::vdev::label::DATA_START;
        let mut b = vec![0u8; (d.size() - 2 * at) as usize];
        d.read_at(&mut b, at).unwrap();
        b
    };
    let (r0, r1) = (ring_of(&c0), ring_of(&c1));
    c0.write_at(&r1, zilla_core::vdev::label::DATA_START).unwrap();
    c1.write_at(&r0, zilla_core::vdev::label::DATA_START).unwrap();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_unsupported == 2 && s.l2_rebuild_dh_errors == 0 && s.l2_rebuild_bufs == 0, "a device restored the other's log: {s:?}");
    read_all(&pool, 25);
    read_all(&pool, 25);
    assert_eq!(l2(&pool).l2_cksum_bad, 0);
    pool.export().unwrap();
}

#[test]
fn cache_devices_swapped_between_two_pools_never_serve_the_other_pools_blocks() {
    // the same layout and block addresses in both pools, different bytes
    let ca: Arc<dyn Device> = Arc::new(MemDevice::new(160 * MIB));
    let cb: Arc<dyn Device> = Arc::new(MemDevice::new(160 * MIB));
    let (da, a) = pool_with_caches("f_swapa", &[("ca", ca.clone())], 26);
    let (db, b) = pool_with_caches("f_swapb", &[("cb", cb.clone())], 27);
    warm(&a, 26, 48 * MIB);
    warm(&b, 27, 48 * MIB);
    a.export().unwrap();
    b.export().unwrap();
    drop((a, b));
    // each pool's cache file replaced by a copy of the other's, labels and all
    let copy = |d: &Arc<dyn Device>| -> Arc<dyn Device> {
        let mut img = vec![0u8; d.size() as usize];
        d.read_at(&mut img, 0).unwrap();
        let m = Arc::new(MemDevice::new(d.size()));
        m.write_at(&img, 0).unwrap();
        m
    };
    da.insert("ca", copy(&cb));
    db.insert("cb", copy(&ca));
    for (devs, seed) in [(&da, 26), (&db, 27)] {
        let pool = Pool::import_with(&devs.specs(), devs.opener()).expect("a pool whose cache device is another pool's does not import");
        if pool.l2_stats().is_some() {
            let s = rebuilt(&pool);
            assert_eq!(s.l2_rebuild_bufs, 0, "another pool's cache device was restored: {s:?}");
        }
        read_all(&pool, seed);
        read_all(&pool, seed);
        pool.export().unwrap();
    }
}

// ---------------------------------------------------------------------------------
// 2. cut off in the middle of a feed
// ---------------------------------------------------------------------------------

/// A small xorshift for the cut points (replayable per seed).
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Import the pool again with cache device `c0` holding `image` (what the last cut
/// left), once its rebuild has run; read every block once and check that no restored
/// header named a bad copy.
fn import_after_cut(devs: &DevSet, pool: Arc<Pool>, image: Vec<u8>, what: &str) -> (Arc<Pool>, Arc<CrashDevice>, u64) {
    let _ = pool.export();
    drop(pool);
    let cache = Arc::new(CrashDevice::from_image(image));
    devs.insert("c0", cache.clone());
    let pool = import(devs);
    let s = rebuilt(&pool);
    // every restored header must name a valid copy: the first read of each is a hit
    // (the ring this small does not wrap again within one pass here), never a bad copy
    read_all(&pool, 28);
    let after = l2(&pool);
    assert_eq!(after.l2_cksum_bad, 0, "{what}: a restored header named a bad copy: {after:?}");
    assert_eq!(cache_state(&pool, "c0"), "ONLINE", "{what}");
    (pool, cache, s.l2_rebuild_bufs)
}

#[test]
fn a_cut_in_the_middle_of_a_feed_restores_only_valid_copies() {
    // a small cache device: the ring wraps every few feeds, so cuts land on batches that
    // overwrite older ones
    const CACHE: u64 = 40 * MIB;
    let mut cache = Arc::new(CrashDevice::new(CACHE));
    let (devs, mut pool) = pool_with_caches("f_cut", &[("c0", cache.clone() as Arc<dyn Device>)], 28);
    let modes = [CrashMode::TearLast, CrashMode::KeepRandomSubset, CrashMode::TornReordered, CrashMode::DropAll];
    let mut x = 0x2545F4914F6CDD1D_u64;
    let (mut restored, mut torn) = (0, 0);
    for round in 0..10u64 {
        warm(&pool, 28, 16 * MIB);
        let image = if round % 2 == 0 {
            // the power cut at a random write of the next feeds (a batch is three
            // durable writes: header, copies and log block, header)
            let cut_after = 1 + next(&mut x) % 12;
            cache.crash_after_writes(cut_after, modes[(round / 2) as usize % modes.len()], next(&mut x));
            let t = Instant::now();
            while !cache.has_crashed() {
                assert!(t.elapsed() < Duration::from_secs(60), "round {round}: the feed wrote nothing: {:?}", l2(&pool));
                read_all(&pool, 28);
            }
            cache.crashed_image().expect("the cut's image")
        } else {
            // the process killed while a feed write is in flight: the feed stopped at
            // one of its next writes, and a random prefix of the range the device
            // header says a batch is overwriting torn (other bytes there)
            cache.hold_writes(true);
            let mut steps = next(&mut x) % 3;
            let t = Instant::now();
            loop {
                while cache.writes_held() == 0 {
                    assert!(t.elapsed() < Duration::from_secs(60), "round {round}: the feed wrote nothing: {:?}", l2(&pool));
                    read_all(&pool, 28);
                }
                if steps == 0 {
                    break;
                }
                steps -= 1;
                cache.hold_writes(false);
                cache.hold_writes(true);
            }
            let mut image = cache.image_if_cut_now(CrashMode::DropAll, 0);
            cache.hold_writes(false);
            let at = zilla_core::vdev::label::DATA_START as usize;
            if let Some(h) = DevHeader::decode(&image[at..at + DEV_HDR_BYTES as usize]).filter(|h| h.evict_to > h.evict_from) {
                let pages = (h.evict_to - h.evict_from) / 4096;
                let tear = ((1 + next(&mut x) % pages) * 4096) as usize;
                let from = h.evict_from as usize;
                image[from..from + tear].copy_from_slice(&pattern(next(&mut x), tear));
                torn += 1;
            }
            image
        };
        let what = format!("round {round}");
        let (p, c, bufs) = import_after_cut(&devs, pool, image, &what);
        (pool, cache) = (p, c);
        restored += bufs;
    }
    assert!(restored > 0 && torn > 0, "the cuts restored {restored} copies and tore {torn} batches: the test tests nothing");
    pool.export().unwrap();
}

// ---------------------------------------------------------------------------------
// 4. crafted log blocks with valid checksums
// ---------------------------------------------------------------------------------

use zilla_core::l2arc::persist::{DevHeader, LogBlock, DEV_HDR_BYTES};

fn header_of(cache: &Arc<dyn Device>) -> DevHeader {
    let mut b = vec![0u8; DEV_HDR_BYTES as usize];
    cache.read_at(&mut b, zilla_core::vdev::label::DATA_START).unwrap();
    DevHeader::decode(&b).expect("a device header")
}

fn log_at(cache: &Arc<dyn Device>, at: u64, len: u64) -> LogBlock {
    let mut b = vec![0u8; len as usize];
    cache.read_at(&mut b, at).unwrap();
    LogBlock::decode(&b).expect("a log block")
}

/// A pool warmed and exported; its cache device, and the newest log block.
fn exported_with_log(name: &str, seed: u64) -> (DevSet, Arc<dyn Device>, DevHeader, LogBlock) {
    let cache: Arc<dyn Device> = Arc::new(MemDevice::new(160 * MIB));
    let (devs, pool) = pool_with_caches(name, &[("c0", cache.clone())], seed);
    warm(&pool, seed, 48 * MIB);
    pool.export().unwrap();
    drop(pool);
    let h = header_of(&cache);
    let newest = log_at(&cache, h.newest_log, h.newest_log_len as u64);
    (devs, cache, h, newest)
}

#[test]
fn crafted_entries_naming_other_blocks_copies_are_never_served() {
    let (devs, cache, h, mut newest) = exported_with_log("f_keys", 29);
    assert!(newest.entries.len() >= 4, "{} entries", newest.entries.len());
    // the keys rotated among the entries: each names another block's copy (addresses,
    // lengths and everything else as written)
    let keys: Vec<_> = newest.entries.iter().map(|e| e.key).collect();
    for (i, e) in newest.entries.iter_mut().enumerate() {
        e.key = keys[(i + 1) % keys.len()];
    }
    cache.write_at(&newest.encode(), h.newest_log).unwrap();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_log_blks > 0, "{s:?}");
    // read_all fails on a wrong byte
    read_all(&pool, 29);
    read_all(&pool, 29);
    pool.export().unwrap();
}

#[test]
fn crafted_prev_pointers_forming_a_loop_end_the_walk() {
    let (devs, cache, h, newest) = exported_with_log("f_loop", 30);
    assert!(newest.prev != 0, "the warm-up wrote a single batch");
    let mut older = log_at(&cache, newest.prev, newest.prev_len as u64);
    // the older block points back at the newest one: newest → older → newest → ...
    older.prev = h.newest_log;
    older.prev_len = h.newest_log_len;
    cache.write_at(&older.encode(), newest.prev).unwrap();
    let t = Instant::now();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(s.l2_rebuild_log_blks <= 2, "a loop was walked more than once: {s:?}");
    assert!(s.l2_rebuild_cksum_lb_errors > 0, "the loop was not counted: {s:?}");
    read_all(&pool, 30);
    assert_eq!(l2(&pool).l2_cksum_bad, 0);
    pool.export().unwrap();
}

#[test]
fn crafted_entries_piled_on_one_address_stay_within_the_header_bound() {
    let (devs, cache, h, mut newest) = exported_with_log("f_pile", 31);
    // the newest block: as many entries as a log block may hold, distinct keys, every
    // one naming the batch's first copy (its address, length and check)
    let first = newest.entries[0];
    let n = zilla_core::l2arc::persist::LOG_ENTRIES_MAX;
    let mut entries = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let mut e = first;
        e.key.offset = first.key.offset.wrapping_add((i + 1) << 40);
        entries.push(e);
    }
    newest.entries = entries;
    let bytes = newest.encode();
    // the bigger log block still ends where the batch ended... it starts at the batch's
    // end and must fit in the ring; the header names its new length
    let mut hh = h;
    hh.newest_log_len = bytes.len() as u32;
    hh.hand = h.newest_log + bytes.len() as u64;
    if hh.hand > 160 * MIB - 8 * MIB {
        return; // no room after the batch on this run's ring: nothing to craft
    }
    cache.write_at(&bytes, h.newest_log).unwrap();
    cache.write_at(&hh.encode(), zilla_core::vdev::label::DATA_START).unwrap();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    let cap = zilla_core::arc::daemon_arc().c_max() / 100 * zilla_core::l2arc::L2ARC_META_PERCENT.get();
    assert!(s.l2_hdr_size <= cap, "headers beyond l2arc_meta_percent: {s:?}");
    assert!(s.l2_asize <= 160 * MIB, "more bytes counted on the cache device than it has: {s:?}");
    read_all(&pool, 31);
    pool.export().unwrap();
}

// ---------------------------------------------------------------------------------
// 5. cache devices added and removed under reads
// ---------------------------------------------------------------------------------

#[test]
fn cache_devices_added_and_removed_under_reads() {
    let c0: Arc<dyn Device> = Arc::new(MemDevice::new(128 * MIB));
    let (devs, pool) = pool_with_caches("f_live", &[("c0", c0)], 32);
    warm(&pool, 32, 32 * MIB);
    // a reader checks every byte while the admin adds and removes cache devices
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut passes = 0;
            while !stop.load(Ordering::Relaxed) {
                read_all(&pool, 32);
                passes += 1;
            }
            passes
        })
    };
    let c1: Arc<dyn Device> = Arc::new(MemDevice::new(128 * MIB));
    devs.insert("c1", c1.clone());
    pool.add(vec![TopSpec { role: Role::Cache, mirror: false, leaves: vec![leaf("c1")] }], false).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    pool.remove("c0").unwrap();
    // the added device carries the L2ARC alone now: it must fill
    let t = Instant::now();
    while l2(&pool).l2_size < 16 * MIB {
        assert!(t.elapsed() < Duration::from_secs(30), "a cache device added live is never fed: {:?}", l2(&pool));
        std::thread::sleep(Duration::from_millis(500));
    }
    devs.insert("c2", Arc::new(MemDevice::new(128 * MIB)));
    pool.add(vec![TopSpec { role: Role::Cache, mirror: false, leaves: vec![leaf("c2")] }], false).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    pool.remove("c1").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let passes = reader.join().expect("a read under add/remove failed");
    assert!(passes > 0);
    read_all(&pool, 32);
    pool.export().unwrap();
}

#[test]
fn crafted_lengths_and_ranges_never_drive_a_read_beyond_the_log_bound() {
    let (devs, cache, h, newest) = exported_with_log("f_len", 33);
    let at = zilla_core::vdev::label::DATA_START;
    // the device as exported: each craft below starts from it, so the log blocks it
    // keeps name only copies it holds (the feed of a later import writes over them)
    let mut image = vec![0u8; 160 * MIB as usize];
    cache.read_at(&mut image, 0).unwrap();
    // 1: the header names a newest log block of 64 MiB (inside the ring, far beyond
    // the largest log block), with a valid header checksum
    let mut hh = h;
    let room = (160 * MIB - 2 * at - 4096).saturating_sub(h.newest_log) / 4096 * 4096;
    hh.newest_log_len = (64 * MIB).min(room) as u32;
    assert!(hh.newest_log_len as u64 > zilla_core::l2arc::persist::log_block_bytes(zilla_core::l2arc::persist::LOG_ENTRIES_MAX), "no room to craft: {h:?}");
    cache.write_at(&hh.encode(), at).unwrap();
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_cksum_lb_errors > 0 && s.l2_rebuild_io_errors == 0 && s.l2_rebuild_bufs == 0, "a log length beyond the bound was read: {s:?}");
    // the device starts over: what the feed writes now is a chain of its own, which
    // the next import walks without meeting the refused block again
    warm(&pool, 33, 32 * MIB);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let s = rebuilt(&pool);
    assert!(s.l2_rebuild_bufs > 0 && s.l2_rebuild_cksum_lb_errors == 0, "the new chain led back to the refused block: {s:?}");
    read_all(&pool, 33);
    pool.export().unwrap();
    drop(pool);
    // 2: the newest block's prev length 4 GiB, and 3: its batch reaching into the
    // labels: the walk stops there (the newest block alone may come back in 2)
    for craft in 0..2 {
        cache.write_at(&image, 0).unwrap();
        let mut lb = newest.clone();
        match craft {
            0 => lb.prev_len = u32::MAX,
            _ => lb.batch_start = 0,
        }
        cache.write_at(&lb.encode(), h.newest_log).unwrap();
        let pool = import(&devs);
        let s = rebuilt(&pool);
        assert!(s.l2_rebuild_cksum_lb_errors > 0 && s.l2_rebuild_io_errors == 0, "craft {craft}: {s:?}");
        if craft == 1 {
            assert_eq!(s.l2_rebuild_bufs, 0, "a batch reaching into the labels was restored: {s:?}");
        }
        read_all(&pool, 33);
        assert_eq!(l2(&pool).l2_cksum_bad, 0);
        pool.export().unwrap();
        drop(pool);
    }
}
