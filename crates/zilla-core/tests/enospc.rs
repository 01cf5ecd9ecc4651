//! Filling the pool: writes end in NoSpace, the pool stays healthy, acknowledged data is
//! intact, and freeing space makes writes succeed again.
mod common;
use common::*;
use zilla_core::zvol::BlockVolume;
use zilla_core::Error;

const CHUNK: usize = 256 << 10;

#[test]
fn fill_pool_until_enospc_then_recover() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    // much larger than the pool
    pool.volume_create("big", 256 << 20, 16384, &[]).unwrap();
    let v = pool.open_volume("big").unwrap();
    let mut acked: Vec<(u64, u64)> = vec![]; // (offset, seed)
    let mut off = 0u64;
    let err = loop {
        let seed = off / CHUNK as u64 + 1;
        let r = v.write(off, &pattern(seed, CHUNK), false).and_then(|_| v.flush());
        match r {
            Ok(()) => acked.push((off, seed)),
            Err(e) => break e,
        }
        off += CHUNK as u64;
        assert!(off < 256 << 20, "never ran out of space");
    };
    assert!(matches!(err, Error::NoSpace), "expected NoSpace, got {err:?}");
    assert_eq!(err.errno(), libc::ENOSPC);
    let filled = acked.len() as u64 * CHUNK as u64;
    assert!(filled >= 24 << 20, "only {filled} bytes fit in a 46 MiB pool");
    // further writes keep failing cleanly, reads work
    assert!(matches!(v.write(off + (1 << 20), &pattern(999, CHUNK), false), Err(Error::NoSpace)));
    let check = |v: &dyn BlockVolume, acked: &[(u64, u64)]| {
        let mut b = vec![0u8; CHUNK];
        for &(o, s) in acked {
            v.read(o, &mut b).unwrap();
            assert!(b == pattern(s, CHUNK), "acknowledged chunk at {o} differs");
        }
    };
    check(&*v, &acked);
    // the pool still syncs, exports and imports
    pool.sync().unwrap();
    assert_eq!(pool.status().state, "ONLINE");
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let v = pool.open_volume("big").unwrap();
    check(&*v, &acked);

    // free half of what was written; frees are deferred, so allow a few syncs
    let half = (acked.len() / 2) as u64 * CHUNK as u64;
    v.unmap(0, half).unwrap();
    let mut ok = false;
    for _ in 0..6 {
        pool.sync().unwrap();
        if v.write(off, &pattern(4242, CHUNK), false).is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "writes still fail after freeing {half} bytes and several syncs");
    v.flush().unwrap();
    // write a good part of the freed space again
    let mut more = vec![(off, 4242u64)];
    let mut o = off + CHUNK as u64;
    while o < off + half / 2 {
        v.write(o, &pattern(o, CHUNK), false).unwrap();
        more.push((o, o));
        o += CHUNK as u64;
    }
    v.flush().unwrap();
    let kept: Vec<(u64, u64)> = acked.iter().copied().filter(|&(a, _)| a >= half).collect();
    check(&*v, &kept);
    check(&*v, &more);
    let mut z = vec![1u8; CHUNK];
    v.read(0, &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0), "unmapped range must read zeros");
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let v = pool.open_volume("big").unwrap();
    check(&*v, &kept);
    check(&*v, &more);
    drop(v);
    pool.export().unwrap();
}

/// Without flushes between writes: dirty data counts against free space, and whatever
/// is acknowledged by the final flush survives.
#[test]
fn fill_pool_with_dirty_data_then_flush() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("big", 256 << 20, 4096, &[]).unwrap();
    let v = pool.open_volume("big").unwrap();
    let mut acked = vec![];
    let mut off = 0u64;
    loop {
        match v.write(off, &pattern(off, CHUNK), false) {
            Ok(()) => acked.push(off),
            Err(Error::NoSpace) => break,
            Err(e) => panic!("unexpected {e:?}"),
        }
        off += CHUNK as u64;
        assert!(off < 256 << 20);
    }
    v.flush().expect("flush after ENOSPC must succeed");
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let v = pool.open_volume("big").unwrap();
    let mut b = vec![0u8; CHUNK];
    for &o in &acked {
        v.read(o, &mut b).unwrap();
        assert!(b == pattern(o, CHUNK), "chunk at {o} differs");
    }
    drop(v);
    pool.export().unwrap();
}

/// Overwriting a volume that fills most of the pool must not fail: the old copies and
/// the dirty data only look like a shortage until the txg syncs (found by the bench).
#[test]
fn overwrites_wait_for_sync_instead_of_enospc() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 << 20);
    let pool = create(&devs, two_mirrors());
    let volsize: u64 = 88 << 20;
    pool.volume_create("big", volsize, 16384, &[]).unwrap();
    let v = pool.open_volume("big").unwrap();
    let chunk = 1 << 20;
    for round in 0..3u64 {
        for off in (0..volsize).step_by(chunk) {
            let data = pattern(round * 1000 + off / chunk as u64, chunk);
            v.write(off, &data, false).unwrap_or_else(|e| panic!("round {round} offset {off}: {e}"));
        }
        // commit the round: the next one overwrites blocks whose old copies are allocated
        v.flush().unwrap();
    }
    v.flush().unwrap();
    let mut back = vec![0u8; chunk];
    for off in (0..volsize).step_by(chunk) {
        v.read(off, &mut back).unwrap();
        assert!(back == pattern(2 * 1000 + off / chunk as u64, chunk), "offset {off}");
    }
    drop(v);
    pool.export().unwrap();
}
