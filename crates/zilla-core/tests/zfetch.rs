//! Read-ahead (zfetch): a sequential reader of a cold volume finds its blocks read ahead
//! (demand misses drop, the ARC counts the prefetch reads and their use), random reads
//! read nothing ahead, the stream limit holds, `zfs_prefetch_disable=1` turns it off,
//! and prefetch skips holes and dirty blocks and stops with a destroyed volume.
//!
//! The ARC is the process's: the tests take turns (`serial`) and compare counter deltas.
mod common;
use common::*;

use std::sync::Arc;
use zilla_core::spa::Pool;
use zilla_core::zfetch::{ZfetchStats, ZFETCH_MAX_STREAMS, ZFETCH_MIN_SEC_REAP, ZFS_PREFETCH_DISABLE};
use zilla_core::zvol::{BlockVolume, Volume};

const BS: usize = 16384;
const VOL_BYTES: u64 = 32 << 20;
const CHUNK: usize = 128 << 10;
const SEED: u64 = 11;

/// One test at a time (the ARC and the tunables are the process's); the tunables go
/// back to their defaults when the turn ends.
struct Turn(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

fn serial() -> Turn {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    Turn(LOCK.lock().unwrap_or_else(|e| e.into_inner()))
}

impl Drop for Turn {
    fn drop(&mut self) {
        for t in [&ZFS_PREFETCH_DISABLE, &ZFETCH_MAX_STREAMS, &ZFETCH_MIN_SEC_REAP] {
            t.set(t.default).unwrap();
        }
    }
}

/// A pool with volume `v` written as `write` says (offset, bytes), synced, exported.
fn written_pool(write: &[(u64, usize)]) -> DevSet {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 96 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("v", VOL_BYTES, BS as u32, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    let data = pattern(SEED, VOL_BYTES as usize);
    for &(off, len) in write {
        v.write(off, &data[off as usize..off as usize + len], false).unwrap();
    }
    v.flush().unwrap();
    drop(v);
    pool.export().unwrap();
    devs
}

/// The pool imported again: nothing of it in the ARC.
fn cold(devs: &DevSet) -> (Arc<Pool>, Arc<Volume>) {
    let pool = import(devs);
    let v = pool.open_zvol("v").unwrap();
    (pool, v)
}

fn close(pool: Arc<Pool>, v: Arc<Volume>) {
    settle(&v);
    drop(v);
    pool.export().unwrap();
}

/// Wait until no prefetch read of `v` is in flight.
fn settle(v: &Volume) {
    let t = std::time::Instant::now();
    while v.zfetch().inflight_bytes() > 0 {
        assert!(t.elapsed().as_secs() < 20, "prefetch reads still in flight after 20 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Read `[from, to)` in `chunk` pieces, in order, each checked against `expect`; the
/// reads ahead of each are let finish before the next (so the counts do not depend on
/// timing).
fn read_in_order(v: &Volume, from: u64, to: u64, chunk: usize, expect: &[u8]) {
    let mut buf = vec![0u8; chunk];
    let mut off = from;
    while off < to {
        v.read(off, &mut buf).unwrap();
        assert!(buf == expect[off as usize..off as usize + chunk], "wrong data at {off}");
        settle(v);
        off += chunk as u64;
    }
}

fn delta(a: &ZfetchStats, b: &ZfetchStats) -> ZfetchStats {
    ZfetchStats { hits: b.hits - a.hits, misses: b.misses - a.misses, max_streams: b.max_streams - a.max_streams, io_issued: b.io_issued - a.io_issued }
}

#[test]
fn a_sequential_reader_hits_what_was_read_ahead() {
    let _turn = serial();
    let devs = written_pool(&[(0, VOL_BYTES as usize)]);
    let data = pattern(SEED, VOL_BYTES as usize);
    let blocks = VOL_BYTES / BS as u64;

    // read-ahead off: every block is a demand miss, nothing is prefetched
    ZFS_PREFETCH_DISABLE.set(1).unwrap();
    let (pool, v) = cold(&devs);
    let (a0, z0) = (pool.arc_stats(), pool.zfetch_stats());
    read_in_order(&v, 0, VOL_BYTES, CHUNK, &data);
    let (a1, z1) = (pool.arc_stats(), pool.zfetch_stats());
    let misses_off = a1.demand_data_misses - a0.demand_data_misses;
    assert_eq!(misses_off, blocks, "{a0:?} -> {a1:?}");
    assert_eq!(delta(&z0, &z1), ZfetchStats::default());
    assert_eq!(a1.prefetch_data_misses, a0.prefetch_data_misses);
    close(pool, v);

    // on: after the first reads the stream reads ahead and the reader hits
    ZFS_PREFETCH_DISABLE.set(0).unwrap();
    let (pool, v) = cold(&devs);
    let (a0, z0) = (pool.arc_stats(), pool.zfetch_stats());
    read_in_order(&v, 0, VOL_BYTES, CHUNK, &data);
    let (a1, z1) = (pool.arc_stats(), pool.zfetch_stats());
    let z = delta(&z0, &z1);
    let misses_on = a1.demand_data_misses - a0.demand_data_misses;
    let chunks = VOL_BYTES / CHUNK as u64;
    assert!(misses_on * 16 <= misses_off, "demand misses {misses_on} with read-ahead, {misses_off} without");
    assert!(a1.prefetch_data_misses - a0.prefetch_data_misses >= blocks * 3 / 4, "prefetch reads: {a0:?} -> {a1:?}");
    assert!(a1.prefetch_used - a0.prefetch_used >= blocks * 3 / 4, "prefetched buffers used: {a0:?} -> {a1:?}");
    assert!(z.hits >= chunks - 2 && z.misses <= 2 && z.io_issued >= blocks * 3 / 4, "{z:?}");

    // again, warm: the stream's reads ahead find the blocks cached (prefetch hits), no I/O
    let (a2, z2) = (pool.arc_stats(), pool.zfetch_stats());
    read_in_order(&v, 0, VOL_BYTES, CHUNK, &data);
    let (a3, z3) = (pool.arc_stats(), pool.zfetch_stats());
    assert!(a3.prefetch_data_hits - a2.prefetch_data_hits >= blocks / 2, "{a2:?} -> {a3:?}");
    assert_eq!(a3.demand_data_misses - a2.demand_data_misses, 0);
    assert_eq!(delta(&z2, &z3).io_issued, 0);
    close(pool, v);
}

#[test]
fn random_reads_read_nothing_ahead() {
    let _turn = serial();
    let devs = written_pool(&[(0, VOL_BYTES as usize)]);
    let data = pattern(SEED, VOL_BYTES as usize);
    let (pool, v) = cold(&devs);
    let (a0, z0) = (pool.arc_stats(), pool.zfetch_stats());
    // single blocks at multiples of 4: no read can be the block after another
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut buf = vec![0u8; BS];
    for _ in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let blk = (x % (VOL_BYTES / BS as u64 / 4)) * 4;
        let off = blk * BS as u64;
        v.read(off, &mut buf).unwrap();
        assert!(buf == data[off as usize..off as usize + BS]);
    }
    settle(&v);
    let (a1, z1) = (pool.arc_stats(), pool.zfetch_stats());
    let z = delta(&z0, &z1);
    assert_eq!(z.io_issued, 0, "{z:?}");
    assert_eq!(a1.prefetch_data_misses - a0.prefetch_data_misses, 0);
    assert!(z.misses >= 250, "{z:?}");
    close(pool, v);
}

#[test]
fn more_streams_than_the_limit() {
    let _turn = serial();
    let devs = written_pool(&[(0, VOL_BYTES as usize)]);
    let data = pattern(SEED, VOL_BYTES as usize);
    let regions = 10u64;
    let span = VOL_BYTES / regions / CHUNK as u64 * CHUNK as u64;
    let rounds = 12u64;
    let interleaved = |v: &Volume| {
        for r in 0..rounds {
            for g in 0..regions {
                let off = g * span + r * CHUNK as u64;
                read_in_order(v, off, off + CHUNK as u64, CHUNK, &data);
            }
        }
    };
    // ten readers, eight streams, none idle a second: two readers never get one
    let (pool, v) = cold(&devs);
    let z0 = pool.zfetch_stats();
    interleaved(&v);
    let z = delta(&z0, &pool.zfetch_stats());
    assert_eq!(v.zfetch().stream_count(), 8);
    assert!(z.max_streams >= 2 * (rounds - 1), "{z:?}");
    assert!(z.hits >= 8 * (rounds - 1) && z.io_issued > 0, "{z:?}");
    close(pool, v);

    // streams reaped at once: a new one always takes the oldest's slot
    ZFETCH_MIN_SEC_REAP.set(0).unwrap();
    ZFETCH_MAX_STREAMS.set(4).unwrap();
    let (pool, v) = cold(&devs);
    let z0 = pool.zfetch_stats();
    interleaved(&v);
    let z = delta(&z0, &pool.zfetch_stats());
    assert_eq!(v.zfetch().stream_count(), 4);
    assert_eq!(z.max_streams, 0, "{z:?}");
    close(pool, v);
}

#[test]
fn holes_and_dirty_blocks_are_not_read_ahead_and_a_destroyed_volume_reads_nothing() {
    let _turn = serial();
    // every other MiB written; the rest are holes
    let writes: Vec<(u64, usize)> = (0..VOL_BYTES >> 20).step_by(2).map(|m| (m << 20, 1 << 20)).collect();
    let devs = written_pool(&writes);
    let data = pattern(SEED, VOL_BYTES as usize);
    let mut expect = vec![0u8; VOL_BYTES as usize];
    for &(off, len) in &writes {
        expect[off as usize..off as usize + len].copy_from_slice(&data[off as usize..off as usize + len]);
    }
    let (pool, v) = cold(&devs);
    // dirty blocks in the open txg, in the first half, some over holes
    let fresh = pattern(99, 4 << 20);
    v.write(2 << 20, &fresh, false).unwrap();
    expect[2 << 20..6 << 20].copy_from_slice(&fresh);
    let z0 = pool.zfetch_stats();
    read_in_order(&v, 0, VOL_BYTES, CHUNK, &expect);
    let z = delta(&z0, &pool.zfetch_stats());
    // the committed data blocks that are not dirty: 16 MiB written, 2 MiB of it dirty now
    let committed = 14 * (1 << 20) / BS as u64;
    assert!(z.io_issued >= committed / 2 && z.io_issued <= committed, "{z:?}: {committed} data blocks to read ahead");
    close(pool, v);

    // destroyed while a stream reads ahead: the reads already issued end, no new one starts
    let (pool, v) = cold(&devs);
    let mut buf = vec![0u8; CHUNK];
    for i in 0..6 {
        v.read(i * CHUNK as u64, &mut buf).unwrap();
    }
    pool.volume_destroy("v").unwrap();
    settle(&v);
    let issued = v.zfetch().stats().io_issued;
    assert!(issued > 0);
    assert!(v.read(6 * CHUNK as u64, &mut buf).is_err());
    assert!(v.try_read_cached_shared(7 * CHUNK as u64, CHUNK as u64).is_some_and(|r| r.is_err()));
    assert_eq!(v.zfetch().stats().io_issued, issued);
    drop(v);
    pool.export().unwrap();
}

/// The detector alone: the distance doubles from twice the read up to its cap, reads of
/// one reader delivered out of order stay in its stream, and a range given back is read
/// again at the next hit.
#[test]
fn the_detector_follows_one_reader_through_reordered_requests() {
    use zilla_core::zfetch::{Limits, Zfetch};
    let _turn = serial();
    let z = Zfetch::default();
    let limits = Limits { max_distance: 64, nblocks: 1 << 20, block_bytes: 16384 };
    let at = |blk: u64| z.access(blk, 8, 0, limits).expect("the detector is free");
    assert!(at(0).is_empty(), "a new stream reads nothing ahead");
    assert_eq!(at(8), 16..32, "first hit: twice the read ahead of the new end");
    assert_eq!(at(16), 32..56);
    assert_eq!(at(24), 56..96, "distance 64 is the cap");
    // the next two requests arrive swapped: both continue the stream
    assert_eq!(at(40), 96..112);
    assert!(at(32).is_empty(), "the straggler behind the stream adds nothing");
    // a walk that stopped at 100 leaves 100.. to the next hit
    z.give_back(96..112, 100);
    assert_eq!(at(48), 100..120);
    let s = z.stats();
    assert_eq!((s.hits, s.misses, z.stream_count()), (6, 1, 1), "{s:?}");
}

/// Device reads of class AsyncRead (read-ahead's) on every leaf of `pool` so far.
fn async_read_device_ops(pool: &Pool) -> u64 {
    let i = zilla_core::vdev::IoClass::ALL.iter().position(|c| *c == zilla_core::vdev::IoClass::AsyncRead).unwrap();
    pool.iostat().stats.device_ops[i]
}

#[test]
fn blocks_stored_back_to_back_are_read_ahead_together_and_each_is_verified() {
    let _turn = serial();
    let devs = written_pool(&[(0, VOL_BYTES as usize)]);
    let data = pattern(SEED, VOL_BYTES as usize);
    let blocks = VOL_BYTES / BS as u64;
    // block 100's copy is damaged on every child of its mirror: no read can verify it
    let bad_blkid = 100u64;
    let pool = import(&devs);
    let root = pool.debug_volume_root("v").unwrap();
    let bp = zilla_core::dmu::lookup(pool.debug_io(), &root, zilla_core::BlockId(bad_blkid), zilla_core::vdev::IoClass::SyncRead).unwrap();
    let d = bp.dva[0];
    for c in pool.debug_io().top(d.vdev).unwrap().children() {
        let junk = vec![0x5Au8; d.asize as usize];
        devs.get(&c.spec.display()).write_at(&junk, zilla_core::vdev::label::DATA_START + d.offset).unwrap();
    }
    pool.export().unwrap();

    let (pool, v) = cold(&devs);
    let (a0, ops0) = (pool.arc_stats(), async_read_device_ops(&pool));
    let mut buf = vec![0u8; CHUNK];
    let bad_chunk = bad_blkid * BS as u64 / CHUNK as u64;
    for off in (0..VOL_BYTES).step_by(CHUNK) {
        let r = v.read(off, &mut buf);
        if off / CHUNK as u64 == bad_chunk {
            // read ahead with its neighbours, the damaged block was dropped, not cached
            assert!(matches!(r, Err(zilla_core::Error::Checksum(_))), "the damaged block read as {:?}", r.map(|_| buf[(bad_blkid as usize * BS) % CHUNK]));
        } else {
            r.unwrap();
            assert!(buf == data[off as usize..off as usize + CHUNK], "wrong data at {off}");
        }
        settle(&v);
    }
    let (a1, ops1) = (pool.arc_stats(), async_read_device_ops(&pool));
    let prefetched = a1.prefetch_data_misses - a0.prefetch_data_misses;
    let device_reads = ops1 - ops0;
    assert!(prefetched >= blocks * 3 / 4, "prefetch reads: {a0:?} -> {a1:?}");
    // the stream reads ahead 8 blocks per 128K read: runs of several blocks each
    assert!(device_reads * 3 <= prefetched, "{prefetched} blocks read ahead in {device_reads} device reads");
    close(pool, v);
}

/// The detector alone under random reads: reads that land just ahead of a stream
/// continue it but never lengthen its reach, so over 100,000 random 16K reads of a
/// 640 MiB volume the blocks read ahead stay a small fraction of those read.
#[test]
fn random_reads_landing_near_streams_do_not_grow_them() {
    use zilla_core::zfetch::{Limits, Zfetch};
    let _turn = serial();
    let z = Zfetch::default();
    let nblocks = 40_960;
    let limits = Limits { max_distance: 512, nblocks, block_bytes: 16384 };
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut ahead = 0u64;
    let reads = 100_000u64;
    for i in 0..reads {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // now and then two reads in a row, as a random reader's neighbours do
        let blk = if i % 50 == 1 { (x % nblocks).saturating_sub(1) } else { x % nblocks };
        let r = z.access(blk, 1, i * 40_000, limits).expect("the detector is free");
        ahead += r.end - r.start;
    }
    assert!(ahead * 100 <= reads, "{ahead} blocks read ahead for {reads} random one-block reads: {:?}", z.stats());
}
