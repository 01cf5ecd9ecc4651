//! The manual trim (`zilla pool trim`, spa/trim.rs): a pass over the pool's free space
//! that discards it on every writable child, one step per txg sync. The crash devices
//! turn a discard into garbage, so a discard of space in use (or one racing a write of
//! that space) shows as a checksum error on read. Its own binary: the trim tunables
//! are process-wide.
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use rand::{Rng, SeedableRng};
use zilla_core::spa::trim::{TrimCmd, TrimState};
use zilla_core::spa::{Pool, ScrubCmd};
use zilla_core::vdev::fault::CrashMode;

const DEV: u64 = 64 << 20;
const KEEP: u64 = 8 << 20;

/// A pool of two mirrors with volume `keep` written (its bytes returned) and a 16 MiB
/// volume written and destroyed, so the free space holds freed blocks; small trim
/// steps, so a pass takes many txgs.
fn setup() -> (CrashRig, Arc<Pool>, Vec<u8>) {
    for (k, v) in [("zilla_trim_txg_extents", 1), ("zilla_trim_txg_interval_ms", 0), ("zfs_trim_extent_bytes_min", 4096), ("zfs_trim_extent_bytes_max", 4 << 20)] {
        zilla_core::tunables().set(k, v).unwrap();
    }
    let rig = CrashRig::new(&["m0a", "m0b", "m1a", "m1b"], DEV);
    let pool = create(&rig.set, two_mirrors());
    pool.volume_create("keep", KEEP, 4096, &[]).unwrap();
    pool.volume_create("gone", 16 << 20, 4096, &[]).unwrap();
    let keep = pattern(1, KEEP as usize);
    pool.open_volume("keep").unwrap().write(0, &keep, false).unwrap();
    pool.open_volume("gone").unwrap().write(0, &pattern(2, 16 << 20), false).unwrap();
    pool.sync().unwrap();
    pool.volume_destroy("gone").unwrap();
    pool.sync().unwrap();
    (rig, pool, keep)
}

fn check(pool: &Pool, want: &[u8], what: &str) {
    let v = pool.open_volume("keep").unwrap();
    let mut got = vec![0u8; want.len()];
    v.read(0, &mut got).unwrap_or_else(|e| panic!("{what}: read: {e}"));
    assert!(got == want, "{what}: volume differs from what was written");
}

#[test]
fn a_manual_trim_discards_the_free_space_and_nothing_in_use() {
    let (rig, pool, mut keep) = setup();
    let discards0: u64 = ["m0a", "m0b", "m1a", "m1b"].iter().map(|n| rig.dev(n).write_bytes()).sum();
    assert!(pool.trim(TrimCmd::Cancel).is_err(), "cancel with no trim");
    pool.trim(TrimCmd::Start).unwrap();
    assert!(matches!(pool.trim(TrimCmd::Start), Err(zilla_core::Error::Busy(_))), "a second start while one runs");
    pool.trim(TrimCmd::Suspend).unwrap();
    let suspended = pool.trim_status();
    assert_eq!(suspended.state, TrimState::Suspended);
    pool.sync().unwrap();
    pool.sync().unwrap();
    assert_eq!(pool.trim_status().bytes_trimmed, suspended.bytes_trimmed, "a suspended trim went on");

    // resume, and write `keep` while the pass runs: no write may land in space being
    // discarded, and none of it may be discarded later. A bounded number (~1 MiB, ~3 %
    // of the free space with both copies and metadata): what they allocate ahead of
    // the cursor is not free when the cursor gets there.
    pool.trim(TrimCmd::Start).unwrap();
    assert_eq!(pool.trim_status().state, TrimState::Active);
    let v = pool.open_volume("keep").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut writes = 0;
    while writes < 256 {
        let off = rng.gen_range(0..KEEP / 4096) * 4096;
        let d = pattern(1000 + writes, 4096);
        v.write(off, &d, false).unwrap();
        keep[off as usize..off as usize + 4096].copy_from_slice(&d);
        writes += 1;
        if writes % 16 == 0 {
            v.flush().unwrap();
        }
    }
    pool.trim_wait().unwrap();
    let st = pool.trim_status();
    assert_eq!(st.state, TrimState::Complete, "{st:?}");
    assert!(st.extents_trimmed > 15, "a pass of one extent per txg ran in few steps: {st:?}");
    assert!(st.bytes_trimmed * 10 >= st.free_bytes_at_start * 9, "the pass left free space out: {st:?}");
    let discarded: u64 = ["m0a", "m0b", "m1a", "m1b"].iter().map(|n| rig.dev(n).write_bytes()).sum::<u64>() - discards0;
    assert!(discarded >= 2 * st.bytes_trimmed, "each extent is discarded on both children of its mirror");
    let counters = pool.trim_stats();
    assert_eq!(counters.iter().find(|c| c.0 == "trim_manual_bytes").map(|c| c.1), Some(st.bytes_trimmed));

    check(&pool, &keep, "after the trim");
    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    assert_eq!(pool.scan_status().errors, 0, "the scrub found damage: {:?}", pool.scan_status());
    pool.check_space_accounting().unwrap();
    v.flush().unwrap();
    drop(v);

    // a cancel forgets the pass; a start after it walks again from the start
    pool.trim(TrimCmd::Start).unwrap();
    pool.trim(TrimCmd::Cancel).unwrap();
    assert_eq!(pool.trim_status().state, TrimState::Canceled);
    assert!(pool.trim(TrimCmd::Suspend).is_err(), "suspend after cancel");

    let after = rig.power_cut(CrashMode::DropAll, 1);
    pool.abandon();
    let p2 = after.import();
    check(&p2, &keep, "after a power cut and import");
    p2.check_space_accounting().unwrap();
    assert_eq!(p2.trim_status().state, TrimState::None, "a pass is not kept across an import");
    p2.export().unwrap();
}

#[test]
fn a_power_cut_in_the_middle_of_a_manual_trim_loses_nothing() {
    for (k, mode) in [CrashMode::DropAll, CrashMode::KeepRandomSubset, CrashMode::TearLast].into_iter().enumerate() {
        let (rig, pool, keep) = setup();
        pool.open_volume("keep").unwrap().flush().unwrap();
        pool.trim(TrimCmd::Start).unwrap();
        // let it walk part of the way, with writes to `keep` beside it
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::spawn(move || {
                let v = pool.open_volume("keep").unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Acquire) {
                    // the same bytes again: the acknowledged content does not change
                    let off = (i * 4096 * 7) % KEEP;
                    let _ = v.write(off, &pattern(1, KEEP as usize)[off as usize..off as usize + 4096], false);
                    i += 1;
                }
            })
        };
        while pool.trim_status().extents_trimmed < 8 + 4 * k as u64 {
            assert_ne!(pool.trim_status().state, TrimState::Complete, "the pass ended before the cut");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let after = rig.power_cut(mode, 40 + k as u64);
        stop.store(true, Ordering::Release);
        writer.join().unwrap();
        pool.abandon();
        let p2 = after.import();
        check(&p2, &keep, &format!("after a cut mid-trim ({mode:?})"));
        p2.check_space_accounting().unwrap();
        // the pass starts over and completes on the imported pool
        p2.trim(TrimCmd::Start).unwrap();
        p2.trim_wait().unwrap();
        assert_eq!(p2.trim_status().state, TrimState::Complete);
        check(&p2, &keep, &format!("after a second pass ({mode:?})"));
        p2.export().unwrap();
    }
}
