//! The legacy write throttle (`zfs_write_throttle_mode=legacy`): writes are
//! delayed a tick past 7/8 of the txg write limit and wait for the next txg when it is
//! full; in openzfs mode neither happens below the delay curve. Its own binary: the
//! mode is a process-wide tunable.
mod common;

use common::*;

fn write_4k_many(pool: &zilla_core::spa::Pool, seed: u64, n: u64) -> Vec<u8> {
    let v = pool.open_volume("vol").unwrap();
    let data = pattern(seed, (n * 4096) as usize);
    for i in 0..n {
        let o = (i * 4096) as usize;
        v.write(i * 4096, &data[o..o + 4096], false).unwrap();
    }
    data
}

#[test]
fn legacy_mode_delays_and_blocks_at_the_write_limit_and_openzfs_does_not() {
    let t = zilla_core::tunables();
    // memory devices measure a bandwidth so high that the limit would be the dirty
    // max: fix it at 1 MiB (as old ZFS's zfs_write_limit_override); a long txg timeout
    // so only the throttle closes txgs
    t.set("zfs_txg_timeout", 600).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 128 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 32 << 20, 4096, &[]).unwrap();

    let before = pool.throttle_stats();
    write_4k_many(&pool, 1, 1024);
    let s = pool.throttle_stats();
    assert_eq!((s.legacy_delayed_writes, s.legacy_txg_full_waits), (before.legacy_delayed_writes, before.legacy_txg_full_waits), "openzfs mode: {s:?}");

    pool.sync().unwrap();
    let measured = pool.throttle_stats().write_limit_bytes;
    assert!(measured >= 32 << 20, "the measured write limit {measured} is below zfs_write_limit_min");
    t.set("zfs_write_throttle_mode", 1).unwrap();
    let limit = 1u64 << 20;
    t.set("zfs_write_limit_override", limit).unwrap();
    // write 3 write-limits' worth: every limit's last eighth is delayed, each full txg
    // makes a writer wait for the next
    let n = 3 * limit / 4096;
    let synced_before = pool.synced_txg();
    let data = write_4k_many(&pool, 2, n);
    let s = pool.throttle_stats();
    t.set("zfs_write_throttle_mode", 0).unwrap();
    assert!(s.legacy_delayed_writes > 0, "no write delayed past 7/8 of the limit: {s:?}");
    assert!(s.legacy_txg_full_waits > 0, "no write waited for a full txg: {s:?}");
    assert!(pool.synced_txg().get() >= synced_before.get() + 2, "full txgs were not synced: {s:?}");
    let v = pool.open_volume("vol").unwrap();
    let mut got = vec![0u8; data.len()];
    v.read(0, &mut got).unwrap();
    assert!(got == data, "data written under the legacy throttle differs");
    pool.export().unwrap();
}
