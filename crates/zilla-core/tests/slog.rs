//! Separate log devices (SLOG): commits land on the log vdev, the ZIL counters say so,
//! and a log vdev can be removed (`zpool remove`) without losing a write acknowledged
//! by a commit: after the removal the pool's own devices hold everything, even if the
//! power is cut at once and the removed devices are gone.
mod common;
use std::sync::Arc;

use common::*;
use zilla_core::spa::TopSpec;
use zilla_core::vdev::fault::{CrashDevice, CrashMode};
use zilla_core::vdev::Role;

const DEV_BYTES: u64 = 64 << 20;
const DATA: [&str; 4] = ["m0a", "m0b", "m1a", "m1b"];

fn stat(pool: &zilla_core::spa::Pool, name: &str) -> u64 {
    pool.zil_stats().iter().find(|(n, _)| *n == name).map(|(_, v)| *v).expect(name)
}

fn crash_devs(names: &[&str]) -> (DevSet, Vec<(String, Arc<CrashDevice>)>) {
    let set = DevSet::default();
    let mut all = vec![];
    for n in names {
        let d = Arc::new(CrashDevice::new(DEV_BYTES));
        set.insert(n, d.clone());
        all.push((n.to_string(), d));
    }
    (set, all)
}

fn with_log_mirror() -> Vec<TopSpec> {
    let mut t = two_mirrors();
    t.push(TopSpec { role: Role::Log, mirror: true, leaves: vec![leaf("l0"), leaf("l1")] });
    t
}

/// Write `n` 4K blocks of seed `seed` at block offsets `first..`, each followed by a
/// commit (an NBD FLUSH).
fn write_flushed(v: &dyn zilla_core::zvol::BlockVolume, seed: u64, first: u64, n: u64) {
    for i in 0..n {
        v.write((first + i) * 4096, &pattern(seed + i, 4096), false).unwrap();
        v.flush().unwrap();
    }
}

fn check(v: &dyn zilla_core::zvol::BlockVolume, seed: u64, first: u64, n: u64, what: &str) {
    let mut back = vec![0u8; 4096];
    for i in 0..n {
        v.read((first + i) * 4096, &mut back).unwrap();
        assert!(back == pattern(seed + i, 4096), "{what}: block {} differs", first + i);
    }
}

#[test]
fn log_vdev_takes_commits_and_leaves_without_losing_acknowledged_writes() {
    // only the log holds the flushed writes until the vdev is removed
    let txg_timeout = zilla_core::tunables().get("zfs_txg_timeout").unwrap();
    zilla_core::tunables().set("zfs_txg_timeout", 3600).unwrap();
    let (devs, all) = crash_devs(&["m0a", "m0b", "m1a", "m1b", "l0", "l1"]);
    let pool = create(&devs, with_log_mirror());
    pool.volume_create("vol", 32 << 20, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    write_flushed(&*v, 100, 0, 4); // the first commit creates the chain (waits for a txg)
    write_flushed(&*v, 200, 64, 32);
    assert!(stat(&pool, "zil_itx_metaslab_slog_count") >= 32, "{:?}", pool.zil_stats());
    assert_eq!(stat(&pool, "zil_itx_metaslab_normal_count"), 0, "{:?}", pool.zil_stats());
    assert!(stat(&pool, "zil_commit_count") >= 36);
    assert!(stat(&pool, "zil_lwb_write_count") >= 1);

    // a leaf of the log mirror, or a data vdev: refused with a reason
    let e = pool.remove("l0").unwrap_err().to_string();
    assert!(e.contains("mirror-2"), "{e}");
    let e = pool.remove("m0a").unwrap_err().to_string();
    assert!(e.contains("only log, cache and spare"), "{e}");
    assert!(pool.remove("nosuch").is_err());

    pool.remove("mirror-2").unwrap();
    assert!(pool.status().config.iter().all(|t| t.role != Role::Log), "the log vdev is still in the config");
    // commits keep working, now from the normal class
    write_flushed(&*v, 300, 128, 4);
    assert!(stat(&pool, "zil_itx_metaslab_normal_count") >= 4, "{:?}", pool.zil_stats());

    // power cut now: the data devices alone (the log devices are gone) hold every
    // acknowledged write
    let images: Vec<(String, Vec<u8>)> =
        all.iter().filter(|(n, _)| DATA.contains(&n.as_str())).map(|(n, d)| (n.clone(), d.power_cut(CrashMode::DropAll, 7))).collect();
    for (_, d) in &all {
        d.power_cut(CrashMode::DropAll, 7);
    }
    drop(v);
    drop(pool);
    let after = DevSet::default();
    for (n, img) in images {
        after.insert(&n, Arc::new(CrashDevice::from_image(img)));
    }
    let pool = import(&after);
    assert!(pool.status().config.iter().all(|t| t.role != Role::Log));
    let v = pool.open_volume("vol").unwrap();
    check(&*v, 100, 0, 4, "before the removal (first chain)");
    check(&*v, 200, 64, 32, "before the removal");
    check(&*v, 300, 128, 4, "after the removal (log in the normal class)");
    drop(v);
    pool.export().unwrap();
    zilla_core::tunables().set("zfs_txg_timeout", txg_timeout).unwrap();
}

#[test]
fn a_removed_log_vdev_can_be_added_again() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b", "l0", "l1"], DEV_BYTES);
    let pool = create(&devs, with_log_mirror());
    pool.volume_create("vol", 8 << 20, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    write_flushed(&*v, 1, 0, 8);
    pool.remove("mirror-2").unwrap();
    // the removed devices carry no label of the pool any more: add takes them back
    pool.add(vec![TopSpec { role: Role::Log, mirror: false, leaves: vec![leaf("l0")] }], false).unwrap();
    let slog0 = stat(&pool, "zil_itx_metaslab_slog_count");
    write_flushed(&*v, 50, 16, 8);
    assert!(stat(&pool, "zil_itx_metaslab_slog_count") > slog0, "{:?}", pool.zil_stats());
    pool.remove("l0").unwrap();
    check(&*v, 1, 0, 8, "first writes");
    check(&*v, 50, 16, 8, "writes through the re-added log");
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let only_data = DevSet::default();
    for n in DATA {
        only_data.insert(n, devs.get(n));
    }
    let pool = import(&only_data);
    let v = pool.open_volume("vol").unwrap();
    check(&*v, 50, 16, 8, "after import without the log devices");
    drop(v);
    pool.export().unwrap();
}

#[test]
fn logbias_throughput_sends_whole_blocks_to_the_pool_and_latency_to_the_log() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b", "l0", "l1"], DEV_BYTES);
    let pool = create(&devs, with_log_mirror());
    let tp = [("logbias".to_string(), "throughput".to_string())];
    pool.volume_create("tp", 8 << 20, 16384, &tp).unwrap();
    pool.volume_create("lat", 8 << 20, 16384, &[]).unwrap();
    let (tp, lat) = (pool.open_volume("tp").unwrap(), pool.open_volume("lat").unwrap());
    lat.write(0, &pattern(9, 4096), false).unwrap();
    lat.flush().unwrap(); // the chain of "lat" exists: later commits write lwbs
    let slog0 = stat(&pool, "zil_itx_metaslab_slog_write");
    let (recs0, rec_bytes0) = (stat(&pool, "zil_itx_metaslab_slog_count"), stat(&pool, "zil_itx_metaslab_slog_bytes"));
    for i in 0..8u64 {
        tp.write(i * 16384, &pattern(i, 16384), false).unwrap();
        tp.flush().unwrap();
    }
    assert_eq!(stat(&pool, "zil_itx_indirect_count"), 8, "{:?}", pool.zil_stats());
    assert_eq!(stat(&pool, "zil_itx_indirect_bytes"), 8 * 16384);
    // the blocks went to the pool in place; the log got only their pointers (as in
    // OpenZFS, the lwbs holding WR_INDIRECT records still go to the log device): a
    // 40-byte record header and a 128-byte block pointer per record, one small lwb per
    // commit (the first commit created the chain with a txg sync instead)
    let recs = stat(&pool, "zil_itx_metaslab_slog_count") - recs0;
    assert!((1..=8).contains(&recs), "{recs} indirect records");
    assert_eq!(stat(&pool, "zil_itx_metaslab_slog_bytes") - rec_bytes0, recs * (40 + 128), "logbias=throughput wrote data to the log");
    assert!(stat(&pool, "zil_itx_metaslab_slog_write") - slog0 <= recs * 4096, "logbias=throughput wrote whole blocks to the log");
    for i in 0..8u64 {
        lat.write((i + 1) * 16384, &pattern(i, 16384), false).unwrap();
        lat.flush().unwrap();
    }
    assert!(stat(&pool, "zil_itx_metaslab_slog_write") - slog0 >= 8 * 16384, "{:?}", pool.zil_stats());
    assert_eq!(stat(&pool, "zil_itx_indirect_count"), 8);
    // a partial block with logbias=throughput is still copied into the log
    let copied0 = stat(&pool, "zil_itx_copied_count");
    tp.write(200 << 10, &pattern(77, 4096), false).unwrap();
    tp.flush().unwrap();
    assert_eq!(stat(&pool, "zil_itx_copied_count"), copied0 + 1);
    let mut back = vec![0u8; 16384];
    for i in 0..8u64 {
        tp.read(i * 16384, &mut back).unwrap();
        assert!(back == pattern(i, 16384), "throughput block {i}");
    }
    drop((tp, lat));
    pool.export().unwrap();
}
