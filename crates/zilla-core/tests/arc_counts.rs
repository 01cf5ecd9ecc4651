//! One read, one ARC access: a cold read counts one data miss whether it goes the
//! front end's way (a cached lookup, then the asynchronous device read) or the
//! blocking way, and a warm read one hit. (The front end's lookup leaves the miss to
//! the read that follows; counted twice, arcstats misses and hit ratios were wrong.)
mod common;
use common::*;

const BS: usize = 16384;

#[test]
fn a_cold_read_counts_one_miss_and_a_warm_read_one_hit() {
    // the reads below are sequential: read-ahead would make the later ones hits (the
    // zfetch test counts that); here each read is the only access to its block
    zilla_core::zfetch::ZFS_PREFETCH_DISABLE.set(1).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 96 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("v", 8 << 20, BS as u32, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    v.write(0, &pattern(3, 8 * BS), false).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.export().unwrap();
    drop(pool);
    // the only pool in this process: the daemon ARC's counters are its own
    let pool = import(&devs);
    let v = pool.open_volume("v").unwrap();
    // warm the indirect blocks, so the reads below touch one data block each
    let mut b = vec![0u8; BS];
    v.read(0, &mut b).unwrap();
    let s = || pool.arc_stats();

    // the front end's way: a cached lookup finds nothing, the asynchronous read follows
    let before = s();
    assert!(matches!(v.try_read_cached_shared(BS as u64, BS as u64), Some(Ok(_)) | None));
    let (tx, rx) = std::sync::mpsc::channel();
    v.read_async(BS as u64, BS as u64, Box::new(move |r| tx.send(r.is_some()).unwrap()));
    let served_async = rx.recv().unwrap();
    if !served_async {
        v.read(BS as u64, &mut b).unwrap();
    }
    let after = s();
    assert_eq!(after.demand_data_misses - before.demand_data_misses, 1, "one cold read, misses counted: {before:?} -> {after:?}");

    // the blocking way
    let before = s();
    v.read(2 * BS as u64, &mut b).unwrap();
    let after = s();
    assert_eq!(after.demand_data_misses - before.demand_data_misses, 1, "one cold blocking read: {before:?} -> {after:?}");

    // warm: one hit, no miss
    let before = s();
    assert!(v.try_read_cached_shared(2 * BS as u64, BS as u64).is_some_and(|r| r.is_ok()));
    let after = s();
    assert_eq!((after.demand_data_hits - before.demand_data_hits, after.demand_data_misses - before.demand_data_misses), (1, 0));
}
