//! Space admission (issue 15, row 6): a small pool under scattered 4 KiB writes. Every
//! write is admitted only if its txg, with the indirect blocks it rewrites and the
//! object directory, still fits: the sync never fails for space, writers get ENOSPC,
//! and frees keep working. Frees are admitted too: a free rewrites the indirect block
//! above it unless that block empties, and its txg cannot use the space it frees, so a
//! txg of partial frees at ENOSPC needs new space (the wedge of 2026-11-23: a TRIM spread
//! over several txgs made the sync fail for space forever). Also: freeing never-written
//! blocks creates no dirty data. Every test runs its workload under a deadline, so a
//! wedge fails the test with a message instead of hanging the suite.
mod common;
use common::*;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zilla_core::spa::Pool;
use zilla_core::zvol::BlockVolume;
use zilla_core::Error;

/// How long a workload may take before the test calls it a wedge (the workloads take a
/// few seconds; 120 s leaves room for a loaded machine).
const DEADLINE_SECS: u64 = 120;

/// Run `f` in its own thread; fail the test if it panics or does not finish in time.
fn within_deadline(what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(DEADLINE_SECS)) {
        Ok(()) => worker.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = worker.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: not finished after {DEADLINE_SECS} s: a writer, FLUSH or the sync is wedged at ENOSPC")
        }
    }
}

/// Scattered 4 KiB writes (over 1 GiB, nearly each its own indirect block) until more
/// than 100 got ENOSPC; returns the acknowledged (offset, seed) pairs, newest last.
fn fill_until_enospc(v: &Arc<dyn BlockVolume>, seed: u64) -> Vec<(u64, u64)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut acked = Vec::new();
    let mut enospc = 0;
    for i in 0..20_000u64 {
        let off = rng.gen_range(0..v.size() / 4096) * 4096;
        match v.write(off, &pattern(i, 4096), false) {
            Ok(()) => acked.push((off, i)),
            Err(Error::NoSpace) => enospc += 1,
            Err(e) => panic!("write {i}: {e}"),
        }
        if enospc > 100 {
            break;
        }
    }
    assert!(enospc > 0, "a 46 MiB pool took 20,000 scattered 4 KiB writes into 1 GiB");
    acked
}

fn small_pool() -> Arc<Pool> {
    // two 2-way mirrors of 24 MiB: a ~46 MiB pool, as in the issue
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    create(&devs, two_mirrors())
}

#[test]
fn scattered_writes_get_enospc_and_never_wedge_the_sync() {
    within_deadline("scattered writes to ENOSPC, then frees", scattered_writes_then_frees);
}

fn scattered_writes_then_frees() {
    // two 2-way mirrors of 24 MiB: a ~46 MiB pool, as in the issue
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 1 << 30, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let mut acked: Vec<(u64, u64)> = Vec::new();
    let mut batch: Vec<(u64, u64)> = Vec::new();
    let mut enospc = 0;
    // scattered over 1 GiB: nearly every write dirties its own indirect block; one txg
    // takes them all (no flush until ENOSPC)
    for i in 0..20_000u64 {
        let off = rng.gen_range(0..(1u64 << 30) / 4096) * 4096;
        match v.write(off, &pattern(i, 4096), false) {
            Ok(()) => batch.push((off, i)),
            Err(Error::NoSpace) => enospc += 1,
            Err(e) => panic!("write {i}: {e}"),
        }
        if enospc > 100 {
            break;
        }
    }
    assert!(enospc > 0, "a 46 MiB pool took 20,000 scattered 4 KiB writes into 1 GiB");
    // the flush must complete: its txg was admitted, so it fits
    let (tx, rx) = std::sync::mpsc::channel();
    let v2 = v.clone();
    std::thread::spawn(move || {
        let _ = tx.send(v2.flush().map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("flush at ENOSPC failed: {e}"),
        Err(_) => panic!("flush at ENOSPC hangs: the admitted txg does not fit (sync fails for space)"),
    }
    for (o, s) in batch.drain(..) {
        acked.retain(|&(ao, _)| ao != o);
        acked.push((o, s));
    }
    pool.sync().expect("a sync at ENOSPC");
    assert_eq!(pool.status().state.as_str(), "ONLINE", "the pool is not healthy at ENOSPC");
    let mut b = vec![0u8; 4096];
    for &(o, s) in &acked {
        v.read(o, &mut b).unwrap();
        assert!(b == pattern(s, 4096), "acknowledged write at {o} lost");
    }
    // frees work at ENOSPC, and make room for writes again. First half of every
    // indirect block's span (4 MiB): each one is rewritten, not emptied, while nothing
    // it frees can be reused in its txg; then everything.
    for l1 in 0..(1u64 << 30) / (4 << 20) {
        v.unmap(l1 * (4 << 20), 2 << 20).expect("partial unmap at ENOSPC");
    }
    v.flush().expect("flush after a partial unmap");
    v.unmap(0, 1 << 30).expect("unmap at ENOSPC");
    v.flush().expect("flush after unmap");
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    v.write(200 << 20, &pattern(7, 4096), false).expect("write after freeing space");
    v.flush().unwrap();
    drop(v);
    pool.export().expect("export after ENOSPC");
}

#[test]
fn freeing_never_written_blocks_dirties_nothing() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("big", 1 << 30, 4096, &[]).unwrap();
    let v = pool.open_volume("big").unwrap();
    v.write(64 << 20, &pattern(1, 4096), false).unwrap();
    v.flush().unwrap();
    v.unmap(0, 512 << 20).unwrap();
    v.write_zeroes(512 << 20, 256 << 20).unwrap();
    let dirty = pool.throttle_stats().dirty_bytes;
    // one written block was freed: one record; 196,607 holes must add nothing
    assert!(dirty <= 4096, "freeing holes dirtied {dirty} bytes");
    v.flush().unwrap();
    let mut b = vec![1u8; 4096];
    v.read(64 << 20, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "the one written block was not freed");
}

/// A volume destroy at ENOSPC frees its space: the sync that frees the tree fits (its
/// defer entries were counted), and writes to another volume succeed afterwards.
#[test]
fn volume_destroy_at_enospc_makes_room_for_writes() {
    within_deadline("volume destroy at ENOSPC", || {
        let pool = small_pool();
        pool.volume_create("big", 1 << 30, 4096, &[]).unwrap();
        pool.volume_create("small", 64 << 20, 4096, &[]).unwrap();
        let big = pool.open_volume("big").unwrap();
        let small = pool.open_volume("small").unwrap();
        fill_until_enospc(&big, 16);
        big.flush().expect("flush at ENOSPC");
        assert!(matches!(small.write(0, &pattern(1, 64 << 10), false), Err(Error::NoSpace)), "64 KiB fit into a full pool");
        drop(big);
        pool.volume_destroy("big").expect("volume destroy at ENOSPC");
        for _ in 0..4 {
            pool.sync().expect("sync after the destroy");
        }
        for i in 0..64u64 {
            small.write(i << 20, &pattern(i, 256 << 10), false).expect("write after the destroy freed space");
        }
        small.flush().expect("flush after the destroy");
        assert_eq!(pool.status().state.as_str(), "ONLINE");
        let mut b = vec![0u8; 256 << 10];
        small.read(5 << 20, &mut b).unwrap();
        assert!(b == pattern(5, 256 << 10), "a write after the destroy reads back wrong");
        drop(small);
        pool.export().expect("export after ENOSPC");
    });
}

/// Four writers run into ENOSPC together (their admissions race) while a fifth thread
/// flushes and TRIMs: every FLUSH returns, nothing but ENOSPC is refused, the pool
/// stays ONLINE and every write acknowledged before a completed flush reads back.
#[test]
fn flush_and_trim_never_hang_while_writers_hit_enospc() {
    within_deadline("concurrent writers at ENOSPC with FLUSH and TRIM", || {
        let pool = small_pool();
        pool.volume_create("vol", 1 << 30, 4096, &[]).unwrap();
        let v = pool.open_volume("vol").unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let (v, stop) = (v.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(100 + w);
                    let (mut acked, mut enospc) = (Vec::new(), 0u64);
                    // each writer its own quarter of the volume: no overwrites across writers
                    let base = w * (256 << 20);
                    while enospc < 200 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let off = base + rng.gen_range(0..(256u64 << 20) / 4096) * 4096;
                        let seed = w << 32 | acked.len() as u64;
                        match v.write(off, &pattern(seed, 4096), false) {
                            Ok(()) => acked.push((off, seed)),
                            Err(Error::NoSpace) => enospc += 1,
                            Err(e) => panic!("writer {w}: {e}"),
                        }
                    }
                    (acked, enospc)
                })
            })
            .collect();
        let mut flushes = 0;
        let mut trims = 0u64;
        while writers.iter().any(|w| !w.is_finished()) {
            v.flush().expect("FLUSH while writers hit ENOSPC");
            flushes += 1;
            // TRIM a piece of the last quarter's lower half (writer 3 may rewrite it)
            v.unmap((768 << 20) + (trims % 64) * (2 << 20), 1 << 20).expect("TRIM while writers hit ENOSPC");
            trims += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total_enospc = 0;
        let mut acked = Vec::new();
        for w in writers {
            let (a, e) = w.join().unwrap();
            total_enospc += e;
            acked.extend(a);
        }
        assert!(total_enospc > 0, "no writer got ENOSPC");
        assert!(flushes > 0);
        v.flush().expect("final FLUSH");
        pool.sync().expect("a sync at ENOSPC");
        assert_eq!(pool.status().state.as_str(), "ONLINE", "the pool is not healthy at ENOSPC");
        // newest write per offset; skip the TRIMmed range, whose reads depend on order
        let mut newest = std::collections::HashMap::new();
        for (o, s) in acked {
            newest.insert(o, s);
        }
        let mut b = vec![0u8; 4096];
        for (&o, &s) in &newest {
            if (768u64 << 20..896 << 20).contains(&o) {
                continue;
            }
            v.read(o, &mut b).unwrap();
            assert!(b == pattern(s, 4096), "acknowledged write at {o} lost");
        }
        drop(v);
        pool.export().expect("export after ENOSPC");
    });
}
