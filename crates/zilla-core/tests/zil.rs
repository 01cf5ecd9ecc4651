//! Intent log: commits survive power cuts through claim and replay at import.
//!
//! Every test cuts the power of CrashDevices (unflushed writes dropped, kept in part or
//! torn) and imports from their durable images. The txg timeout is raised so no txg
//! syncs on its own: what a flush made durable after the chain exists lives only in
//! the log until replay.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::{CrashDevice, CrashMode};
use zilla_core::vdev::Role;
use zilla_core::zvol::BlockVolume;

const DEV_SIZE: u64 = 32 << 20;
const VOLSIZE: u64 = 4 << 20;

type Rig = CrashRig;

fn tops(with_log: bool, log_mirror: bool) -> Vec<TopSpec> {
    let mut t = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m0a"), leaf("m0b")] }];
    if with_log {
        let leaves = if log_mirror { vec![leaf("la"), leaf("lb")] } else { vec![leaf("la")] };
        t.push(TopSpec { role: Role::Log, mirror: log_mirror, leaves });
    }
    t
}

fn no_txg_timeout() {
    zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
}

/// The expected volume contents, applied alongside the engine.
struct Model {
    bytes: Vec<u8>,
}

impl Model {
    fn new() -> Model {
        Model { bytes: vec![0u8; VOLSIZE as usize] }
    }
    fn write(&mut self, v: &dyn BlockVolume, off: u64, data: &[u8], fua: bool) {
        v.write(off, data, fua).unwrap();
        self.bytes[off as usize..off as usize + data.len()].copy_from_slice(data);
    }
    /// A write the test applied itself (acknowledged).
    fn write_untracked(&mut self, off: u64, data: &[u8]) {
        self.bytes[off as usize..off as usize + data.len()].copy_from_slice(data);
    }
    fn zero(&mut self, v: &dyn BlockVolume, off: u64, len: u64) {
        v.write_zeroes(off, len).unwrap();
        self.bytes[off as usize..(off + len) as usize].fill(0);
    }
    fn check(&self, v: &dyn BlockVolume, what: &str) {
        let mut buf = vec![0u8; VOLSIZE as usize];
        v.read(0, &mut buf).unwrap();
        if buf != self.bytes {
            let first = buf.iter().zip(&self.bytes).position(|(a, b)| a != b).unwrap();
            panic!("{what}: volume differs from the acknowledged contents first at byte {first}");
        }
    }
}

/// A mix of full-block, partial and zeroing writes, some FUA; ends with a flush.
fn workload(m: &mut Model, v: &dyn BlockVolume, seed: u64) {
    for i in 0..24u64 {
        let off = (seed * 7 + i * 13) % 1000 * 4096;
        match i % 4 {
            0 => m.write(v, off, &pattern(seed ^ i, 4096), false),
            1 => m.write(v, off + 100, &pattern(seed ^ i, 1000), false),
            2 => m.write(v, off, &pattern(seed ^ i, 3 * 4096), i % 8 == 2),
            _ => m.zero(v, off + 512, 6000),
        }
    }
    v.flush().unwrap();
}

fn setup(rig: &Rig, with_log: bool, log_mirror: bool, props: &[(String, String)]) -> (Arc<Pool>, Model) {
    no_txg_timeout();
    let pool = Pool::create_with("tank", tops(with_log, log_mirror), Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("v", VOLSIZE, 4096, props).unwrap();
    let v = pool.open_volume("v").unwrap();
    let mut m = Model::new();
    // the first commit creates the chain: its header needs one txg sync
    m.write(&*v, 0, &pattern(1, 4096), false);
    v.flush().unwrap();
    (pool, m)
}

fn commit_survives_power_cut(with_log: bool, log_mirror: bool) {
    for (k, mode) in [CrashMode::DropAll, CrashMode::KeepRandomSubset, CrashMode::TearLast, CrashMode::TornReordered].into_iter().enumerate() {
        let names: &[&str] = if log_mirror { &["m0a", "m0b", "la", "lb"] } else { &["m0a", "m0b", "la"] };
        let rig = Rig::new(names, DEV_SIZE);
        let (pool, mut m) = setup(&rig, with_log, log_mirror, &[]);
        let v = pool.open_zvol("v").unwrap();
        let synced = pool.synced_txg();
        let log_writes = rig.writes("la");
        workload(&mut m, &*v, 10 + k as u64);
        assert_eq!(pool.synced_txg(), synced, "a flush synced a txg instead of writing the log");
        let st = &v.zil().stats;
        assert!(st.zil_commit_writer_count.load(Ordering::Relaxed) >= 2);
        if with_log {
            assert!(rig.writes("la") > log_writes, "nothing reached the log device");
            assert!(st.zil_itx_metaslab_slog_count.load(Ordering::Relaxed) > 0);
            assert_eq!(st.zil_itx_metaslab_normal_count.load(Ordering::Relaxed), 0);
        } else {
            assert!(st.zil_itx_metaslab_normal_count.load(Ordering::Relaxed) > 0);
        }
        // unacknowledged writes after the last flush may or may not survive: none here
        let after = rig.power_cut(mode, 77 + k as u64);
        pool.abandon();
        let p2 = after.import();
        m.check(&*p2.open_volume("v").unwrap(), &format!("after replay ({mode:?})"));
        // the replay synced: a second import has nothing to replay and the same data
        p2.export().unwrap();
        let p3 = after.import();
        m.check(&*p3.open_volume("v").unwrap(), "second import");
        p3.export().unwrap();
    }
}

#[test]
fn commit_then_power_cut_replays_from_log_device() {
    commit_survives_power_cut(true, false);
}

#[test]
fn commit_then_power_cut_replays_from_log_mirror() {
    commit_survives_power_cut(true, true);
}

#[test]
fn without_log_device_the_log_lives_in_the_normal_class() {
    commit_survives_power_cut(false, false);
}

#[test]
fn sync_always_commits_every_write() {
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    let (pool, mut m) = setup(&rig, true, false, &[("sync".into(), "always".into())]);
    let v = pool.open_zvol("v").unwrap();
    let synced = pool.synced_txg();
    for i in 0..10u64 {
        m.write(&*v, i * 8192 + 300, &pattern(i + 100, 5000), false);
    }
    assert_eq!(pool.synced_txg(), synced);
    assert!(v.zil().stats.zil_commit_writer_count.load(Ordering::Relaxed) >= 10);
    let after = rig.power_cut(CrashMode::KeepRandomSubset, 5);
    pool.abandon();
    let p2 = after.import();
    m.check(&*p2.open_volume("v").unwrap(), "sync=always after replay");
    p2.export().unwrap();
}

#[test]
fn sync_disabled_never_waits_and_logs_nothing() {
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    no_txg_timeout();
    let pool = Pool::create_with("tank", tops(true, false), Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("v", VOLSIZE, 4096, &[("sync".into(), "disabled".into())]).unwrap();
    let v = pool.open_zvol("v").unwrap();
    let synced = pool.synced_txg();
    let (log_writes, data_writes) = (rig.writes("la"), rig.writes("m0a"));
    for i in 0..8u64 {
        v.write(i * 4096, &pattern(i, 4096), true).unwrap();
        v.flush().unwrap();
    }
    assert_eq!(pool.synced_txg(), synced, "sync=disabled waited for a txg");
    assert_eq!(rig.writes("la"), log_writes, "sync=disabled wrote the log");
    assert_eq!(rig.writes("m0a"), data_writes);
    assert_eq!(v.zil().stats.zil_itx_count.load(Ordering::Relaxed), 0);
    pool.abandon();
}

#[test]
fn a_flush_with_nothing_pending_writes_nothing() {
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    let (pool, mut m) = setup(&rig, true, false, &[]);
    let v = pool.open_zvol("v").unwrap();
    m.write(&*v, 8192, &pattern(9, 4096), false);
    v.flush().unwrap();
    let w = rig.writes("la");
    let writers = v.zil().stats.zil_commit_writer_count.load(Ordering::Relaxed);
    for _ in 0..5 {
        v.flush().unwrap();
    }
    assert_eq!(rig.writes("la"), w);
    assert_eq!(v.zil().stats.zil_commit_writer_count.load(Ordering::Relaxed), writers);
    pool.abandon();
}

/// Concurrent flushers share lwbs: fewer issuers than commits.
#[test]
fn concurrent_flushes_are_batched() {
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    let (pool, _m) = setup(&rig, true, false, &[]);
    let v = pool.open_zvol("v").unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let v = v.clone();
            s.spawn(move || {
                for i in 0..20u64 {
                    v.write((t * 64 + i) * 4096, &pattern(t * 100 + i, 4096), false).unwrap();
                    v.flush().unwrap();
                }
            });
        }
    });
    let st = &v.zil().stats;
    let (commits, writers) = (st.zil_commit_count.load(Ordering::Relaxed), st.zil_commit_writer_count.load(Ordering::Relaxed));
    assert!(commits >= 160);
    assert!(writers <= commits, "{writers} issuers for {commits} commits");
    let after = rig.power_cut(CrashMode::DropAll, 1);
    pool.abandon();
    let p2 = after.import();
    let v2 = p2.open_volume("v").unwrap();
    for t in 0..8u64 {
        for i in 0..20u64 {
            let mut b = vec![0u8; 4096];
            v2.read((t * 64 + i) * 4096, &mut b).unwrap();
            assert_eq!(b, pattern(t * 100 + i, 4096), "writer {t} write {i}");
        }
    }
    p2.export().unwrap();
}

/// A power cut at every write of the replaying import: the next import still replays
/// everything (replay is idempotent and its header survives until it is done).
#[test]
fn power_cut_during_replay() {
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    let (pool, mut m) = setup(&rig, true, false, &[]);
    let v = pool.open_zvol("v").unwrap();
    workload(&mut m, &*v, 3);
    let base: Vec<(String, Vec<u8>)> = rig.devs.iter().map(|(n, d)| (n.clone(), d.power_cut(CrashMode::DropAll, 9))).collect();
    pool.abandon();
    let mut cut_at = 1u64;
    loop {
        // import from the base images, cutting the power at the n-th write of one device
        let rig2 = Rig { set: DevSet::default(), devs: Vec::new() };
        let rig2 = base.iter().fold(rig2, |mut r, (n, img)| {
            let d = Arc::new(CrashDevice::from_image(img.clone()));
            r.set.insert(n, d.clone());
            r.devs.push((n.clone(), d));
            r
        });
        let victim = &rig2.devs[(cut_at % 3) as usize].1;
        victim.crash_after_writes(cut_at, CrashMode::TornReordered, cut_at);
        for (_, d) in &rig2.devs {
            if !Arc::ptr_eq(d, victim) {
                d.crash_after_writes(cut_at + 40, CrashMode::KeepRandomSubset, cut_at);
            }
        }
        let done = match Pool::import_with(&rig2.set.specs(), rig2.set.opener()) {
            Ok(p) => {
                let crashed = rig2.devs.iter().any(|(_, d)| d.has_crashed());
                if !crashed {
                    m.check(&*p.open_volume("v").unwrap(), "replay without a cut");
                    p.export().unwrap();
                    true
                } else {
                    p.abandon();
                    false
                }
            }
            Err(_) => false,
        };
        // whatever the cut left, the next import replays to the acknowledged state
        let images: Vec<(String, Vec<u8>)> = rig2
            .devs
            .iter()
            .map(|(n, d)| (n.clone(), d.crashed_image().unwrap_or_else(|| d.power_cut(CrashMode::DropAll, 0))))
            .collect();
        let set = DevSet::default();
        for (n, img) in images {
            set.insert(&n, Arc::new(CrashDevice::from_image(img)));
        }
        let p = Pool::import_with(&set.specs(), set.opener()).unwrap_or_else(|e| panic!("import after a cut at write {cut_at} of replay: {e}"));
        m.check(&*p.open_volume("v").unwrap(), &format!("after a cut at write {cut_at} of replay"));
        p.export().unwrap();
        if done || cut_at > 60 {
            break;
        }
        cut_at += 1;
    }
}

/// After a replay, later overwrites that were synced win: the old chain is never
/// replayed again.
#[test]
fn a_replayed_chain_is_not_replayed_again() {
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    let (pool, mut m) = setup(&rig, true, false, &[]);
    let v = pool.open_zvol("v").unwrap();
    workload(&mut m, &*v, 4);
    let r1 = rig.power_cut(CrashMode::DropAll, 2);
    pool.abandon();
    let p2 = r1.import();
    let v2 = p2.open_volume("v").unwrap();
    m.check(&*v2, "first replay");
    for i in 0..1000u64 {
        if i % 37 == 0 {
            m.write(&*v2, i * 4096, &pattern(i + 5000, 4096), false);
        }
    }
    p2.sync().unwrap();
    // a new chain, with records, then a cut
    m.write(&*v2, 4096, &pattern(6000, 4096), false);
    v2.flush().unwrap();
    m.write(&*v2, 12288, &pattern(6001, 2048), true);
    let r2 = r1.power_cut(CrashMode::KeepRandomSubset, 3);
    p2.abandon();
    let p3 = r2.import();
    m.check(&*p3.open_volume("v").unwrap(), "second chain replayed, first not");
    p3.export().unwrap();
}

/// FLUSH and FUA as the NBD front end makes them (`flush_async`: the engine thread that
/// completes the log write answers): answered from another thread, without a txg sync,
/// and what they acknowledged is replayed after a power cut. With the log device
/// failing, the asynchronous commit falls back (its completion says "blocking") and
/// the blocking flush still makes everything durable.
#[test]
fn asynchronous_commits_are_durable_when_answered() {
    use zilla_core::vdev::fault::DeviceFault;
    for (k, mode) in [CrashMode::DropAll, CrashMode::TornReordered].into_iter().enumerate() {
        let rig = Rig::new(&["m0a", "m0b", "la", "lb"], DEV_SIZE);
        let (pool, mut m) = setup(&rig, true, true, &[]);
        let v = pool.open_zvol("v").unwrap();
        let synced = pool.synced_txg();
        let mut elsewhere = 0;
        for i in 0..16u64 {
            let off = (i * 37 + k as u64) % 1000 * 4096;
            let data = pattern(100 + i, if i % 2 == 0 { 4096 } else { 1000 });
            if i % 3 == 0 {
                fua_write_as_front_end(&*v, off, &data).unwrap();
                m.write_untracked(off, &data);
            } else {
                m.write(&*v, off, &data, false);
                let (r, other_thread) = flush_as_front_end_on(&*v);
                r.unwrap();
                elsewhere += other_thread as u32;
            }
        }
        assert!(elsewhere >= 8, "only {elsewhere} of 10 flushes were answered by the completion");
        assert_eq!(pool.synced_txg(), synced, "an asynchronous flush synced a txg instead of writing the log");
        // both log children fail their writes: the next commits fall back
        rig.devs[2].1.arm(DeviceFault::WriteEio { nth: 0, count: u64::MAX });
        rig.devs[3].1.arm(DeviceFault::WriteEio { nth: 0, count: u64::MAX });
        for i in 0..4u64 {
            m.write(&*v, i * 8192, &pattern(200 + i, 4096), false);
            flush_as_front_end(&*v).unwrap();
        }
        let after = rig.power_cut(mode, 300 + k as u64);
        pool.abandon();
        let p2 = after.import();
        m.check(&*p2.open_volume("v").unwrap(), &format!("after replay of asynchronous commits ({mode:?})"));
        p2.export().unwrap();
    }
}

/// A FLUSH that finds a commit in flight queues a waiter (no thread waits); it is
/// answered only by the round that writes its own itx, not by the round in flight when
/// it queued. Deterministic: the log mirror's writes are held so the first round stays
/// in flight while the second write and its FLUSH arrive; inside the second answer, on
/// the answering engine thread, the devices' images are taken as a power cut would
/// leave them, and both writes must read back from them after replay.
#[test]
fn a_queued_commit_waiter_is_answered_by_the_round_that_writes_its_itx() {
    type Answer = (Option<zilla_core::Result<()>>, Vec<(String, Vec<u8>)>);
    let rig = Rig::new(&["m0a", "m0b", "la", "lb"], DEV_SIZE);
    let (pool, _m) = setup(&rig, true, true, &[]);
    let v = pool.open_zvol("v").unwrap();
    let logs: Vec<Arc<CrashDevice>> = rig.devs.iter().filter(|(n, _)| n.starts_with('l')).map(|(_, d)| d.clone()).collect();
    logs.iter().for_each(|d| d.hold_writes(true));
    let (x, y) = (pattern(71, 4096), pattern(72, 4096));
    v.write(8 * 4096, &x, false).unwrap();
    let (tx1, rx1) = std::sync::mpsc::channel();
    v.flush_async(Box::new(move |r| tx1.send(r).unwrap()));
    let t0 = std::time::Instant::now();
    while logs.iter().map(|d| d.writes_held()).sum::<u32>() == 0 {
        assert!(t0.elapsed().as_secs() < 10, "the first round never reached the log devices");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    v.write(9 * 4096, &y, false).unwrap();
    let (tx2, rx2) = std::sync::mpsc::channel::<Answer>();
    let devs = rig.devs.clone();
    v.flush_async(Box::new(move |r| {
        let images = devs.iter().map(|(n, d)| (n.clone(), d.image_if_cut_now(CrashMode::DropAll, 0))).collect();
        tx2.send((r, images)).unwrap();
    }));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(rx1.try_recv().is_err() && rx2.try_recv().is_err(), "a flush was answered while its log writes were held");
    logs.iter().for_each(|d| d.hold_writes(false));
    assert!(matches!(rx1.recv().unwrap(), Some(Ok(()))), "the first flush failed or fell back");
    let (r2, images) = rx2.recv().unwrap();
    assert!(matches!(r2, Some(Ok(()))), "the queued flush failed or fell back to the blocking path");
    let writers = v.zil().stats.zil_commit_writer_count.load(Ordering::Relaxed);
    drop(v);
    pool.abandon();
    let set = DevSet::default();
    for (n, img) in images {
        set.insert(&n, Arc::new(CrashDevice::from_image(img)));
    }
    let p = Pool::import_with(&set.specs(), set.opener()).expect("import");
    let v = p.open_volume("v").unwrap();
    for (off, data) in [(8 * 4096, &x), (9 * 4096, &y)] {
        let mut got = vec![0u8; 4096];
        v.read(off, &mut got).unwrap();
        assert!(&got == data, "the write at {off} was acknowledged before it was durable");
    }
    drop(v);
    p.export().unwrap();
    assert!(writers >= 3, "the queued waiter got no round of its own");
}

/// Many connections' FLUSHes on the asynchronous path at once: every flush is answered
/// exactly once, the rounds are batched (fewer commit writers than commits), few fall
/// back to the blocking path, and every acknowledged write survives a power cut.
#[test]
fn concurrent_asynchronous_flushes_are_batched_and_durable() {
    use std::sync::atomic::AtomicU64;
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 40;
    for (k, mode) in [CrashMode::DropAll, CrashMode::TornReordered].into_iter().enumerate() {
        let rig = Rig::new(&["m0a", "m0b", "la", "lb"], DEV_SIZE);
        let (pool, _m) = setup(&rig, true, true, &[]);
        let v = pool.open_zvol("v").unwrap();
        let synced = pool.synced_txg();
        let (commits0, writers0) = (v.zil().stats.zil_commit_count.load(Ordering::Relaxed), v.zil().stats.zil_commit_writer_count.load(Ordering::Relaxed));
        let acked = std::sync::Mutex::new(Vec::new());
        let blocking = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (v, acked, blocking) = (&v, &acked, &blocking);
                s.spawn(move || {
                    for i in 0..ROUNDS {
                        let off = (1 + t * ROUNDS + i) * 4096;
                        let data = pattern(1000 * (k as u64 + 1) + t * ROUNDS + i, 4096);
                        v.write(off, &data, false).unwrap();
                        let (tx, rx) = std::sync::mpsc::channel();
                        v.flush_async(Box::new(move |r| tx.send(r).unwrap()));
                        let answer = rx.recv().expect("a flush was never answered");
                        assert!(rx.try_recv().is_err(), "a flush was answered twice");
                        match answer {
                            Some(r) => r.unwrap(),
                            None => {
                                blocking.fetch_add(1, Ordering::Relaxed);
                                v.flush().unwrap();
                            }
                        }
                        acked.lock().unwrap().push((off, data));
                    }
                });
            }
        });
        let st = &v.zil().stats;
        let commits = st.zil_commit_count.load(Ordering::Relaxed) - commits0;
        let writers = st.zil_commit_writer_count.load(Ordering::Relaxed) - writers0;
        let blocking = blocking.load(Ordering::Relaxed);
        assert!(writers < commits, "no batching: {writers} commit writers for {commits} commits");
        assert!(blocking <= THREADS * ROUNDS / 4, "{blocking} of {} flushes fell back to the blocking path", THREADS * ROUNDS);
        assert_eq!(pool.synced_txg(), synced, "a flush synced a txg instead of writing the log");
        let after = rig.power_cut(mode, 400 + k as u64);
        drop(v);
        pool.abandon();
        let p2 = after.import();
        let v2 = p2.open_volume("v").unwrap();
        for (off, data) in acked.into_inner().unwrap() {
            let mut got = vec![0u8; data.len()];
            v2.read(off, &mut got).unwrap();
            assert!(got == data, "acknowledged write at {off} lost after replay ({mode:?})");
        }
        drop(v2);
        p2.export().unwrap();
    }
}

/// The log device starts failing every write: commits fall back (a txg sync, then log
/// blocks in the normal class), every flush still returns only when its writes are
/// durable, and `pool status` counts the log device's write errors.
#[test]
fn a_failing_log_device_falls_back_and_loses_nothing() {
    use zilla_core::vdev::fault::DeviceFault;
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    let (pool, mut m) = setup(&rig, true, false, &[]);
    let v = pool.open_zvol("v").unwrap();
    workload(&mut m, &*v, 21);
    let st = &v.zil().stats;
    assert_eq!(st.zil_itx_metaslab_normal_count.load(Ordering::Relaxed), 0);
    rig.devs[2].1.arm(DeviceFault::WriteEio { nth: 0, count: u64::MAX });
    for k in 0..4u64 {
        workload(&mut m, &*v, 30 + k);
    }
    assert!(st.zil_itx_metaslab_normal_count.load(Ordering::Relaxed) > 0, "the log never moved to the normal class");
    let log_errors: u64 = pool
        .status()
        .config
        .iter()
        .filter(|t| t.role == Role::Log)
        .map(|t| t.write_errors + t.children.iter().map(|c| c.write_errors).sum::<u64>())
        .sum();
    assert!(log_errors > 0, "pool status shows no write errors on the log device");
    let after = rig.power_cut(CrashMode::DropAll, 8);
    pool.abandon();
    let p2 = after.import();
    m.check(&*p2.open_volume("v").unwrap(), "after the log device failed");
    p2.export().unwrap();
}

/// A pool whose log device is missing imports only with `-m` (ImportOptions::
/// missing_log), and the refusal says what may be lost. With -m the log records on it
/// are gone; the pool works on, its log in the normal class.
#[test]
fn a_missing_log_device_needs_import_m() {
    use zilla_core::spa::ImportOptions;
    let rig = Rig::new(&["m0a", "m0b", "la"], DEV_SIZE);
    let (pool, mut m) = setup(&rig, true, false, &[]);
    let v = pool.open_zvol("v").unwrap();
    pool.sync().unwrap();
    let synced = m.bytes.clone();
    workload(&mut m, &*v, 40);
    let after = rig.power_cut(CrashMode::DropAll, 4);
    pool.abandon();
    let set = DevSet::default();
    for (n, d) in after.devs.iter().filter(|(n, _)| n != "la") {
        set.insert(n, d.clone());
    }
    let e = match Pool::import_with(&set.specs(), set.opener()) {
        Ok(_) => panic!("imported without its log device and without -m"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("-m") && e.contains("may be lost") && e.contains("la"), "refusal: {e}");
    let opts = ImportOptions { missing_log: true, ..Default::default() };
    let env = zilla_core::env::real();
    let p2 = Pool::import_with_options(&set.specs(), set.opener(), env.clone(), &opts).expect("import -m");
    let v2 = p2.open_zvol("v").unwrap();
    let mut m2 = Model { bytes: synced };
    m2.check(&*v2, "import -m: the synced state");
    m2.write(&*v2, 4096 * 7, &pattern(77, 4096), false);
    v2.flush().unwrap();
    let r3 = Rig { set: set.clone(), devs: after.devs.iter().filter(|(n, _)| n != "la").cloned().collect() }.power_cut(CrashMode::DropAll, 5);
    p2.abandon();
    let p3 = Pool::import_with_options(&r3.set.specs(), r3.set.opener(), env, &opts).expect("import -m again");
    m2.check(&*p3.open_volume("v").unwrap(), "a flush after import -m");
    p3.export().unwrap();
}

/// A log mirror acknowledges a commit only when one child both wrote every lwb and
/// flushed after it: here one child's writes fail and the other's flush fails (losing
/// what it covered at the power cut). No child holds the lwb, so the commit must fall
/// back to a txg sync; counting either child would lose the acknowledged writes.
#[test]
fn a_log_mirror_needs_one_child_that_wrote_and_flushed() {
    use zilla_core::vdev::fault::DeviceFault;
    let rig = Rig::new(&["m0a", "m0b", "la", "lb"], DEV_SIZE);
    let (pool, mut m) = setup(&rig, true, true, &[]);
    let v = pool.open_zvol("v").unwrap();
    workload(&mut m, &*v, 41);
    let synced = pool.synced_txg();
    let (la, lb) = (&rig.devs[2].1, &rig.devs[3].1);
    la.arm(DeviceFault::WriteEio { nth: 0, count: u64::MAX });
    lb.arm(DeviceFault::FlushEio { nth: 0, keep_cached: true });
    workload(&mut m, &*v, 42);
    assert!(pool.synced_txg() > synced, "a commit was acknowledged by a log mirror with no child holding it");
    let after = rig.power_cut(CrashMode::DropAll, 9);
    pool.abandon();
    let p2 = after.import();
    m.check(&*p2.open_volume("v").unwrap(), "after a log mirror lost its lwb on both children");
    p2.export().unwrap();
}

// ---- WR_INDIRECT: blocks written in place at commit (dmu_sync) -------------------------

const TP_BS: u64 = 16384;

fn throughput() -> Vec<(String, String)> {
    vec![("logbias".to_string(), "throughput".to_string())]
}

/// A pool (log mirror or none) with volume "v" of 16 KiB blocks and `props`, its log
/// chain created (one synced txg); txgs then sync only when asked.
fn setup_16k(rig: &Rig, with_log: bool, props: &[(String, String)]) -> (Arc<Pool>, Model) {
    no_txg_timeout();
    let pool = Pool::create_with("tank", tops(with_log, with_log), Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("v", VOLSIZE, TP_BS as u32, props).unwrap();
    let v = pool.open_volume("v").unwrap();
    let mut m = Model::new();
    m.write(&*v, 0, &pattern(1, 4096), false);
    v.flush().unwrap();
    (pool, m)
}

/// logbias=throughput: each flushed whole-block write is durable without a txg sync
/// (the block is written in place, the log holds its pointer), survives a power cut
/// with nothing synced after it, and the log holds no data bytes.
fn throughput_commit_is_durable_without_a_sync(with_log: bool) {
    let names: &[&str] = if with_log { &["m0a", "m0b", "la", "lb"] } else { &["m0a", "m0b"] };
    for (k, mode) in [CrashMode::DropAll, CrashMode::KeepRandomSubset, CrashMode::TornReordered].into_iter().enumerate() {
        let rig = Rig::new(names, DEV_SIZE);
        let (pool, mut m) = setup_16k(&rig, with_log, &throughput());
        let v = pool.open_zvol("v").unwrap();
        let synced = pool.synced_txg();
        let data0 = rig.writes("m0a");
        for i in 0..32u64 {
            m.write(&*v, (i + 1) * TP_BS, &pattern(100 + i + k as u64, TP_BS as usize), false);
            v.flush().unwrap();
        }
        assert_eq!(pool.synced_txg(), synced, "a throughput commit waited for a txg sync");
        let st = &v.zil().stats;
        assert_eq!(st.zil_itx_indirect_count.load(Ordering::Relaxed), 32);
        assert_eq!(st.zil_itx_needcopy_count.load(Ordering::Relaxed), 0);
        // the log records hold pointers, not data (header + 128-byte block pointer each)
        let rec_bytes = st.zil_itx_metaslab_slog_bytes.load(Ordering::Relaxed) + st.zil_itx_metaslab_normal_bytes.load(Ordering::Relaxed);
        assert!(rec_bytes <= 32 * (40 + 128) + 4096 + 64, "log record bytes {rec_bytes}");
        assert!(rig.writes("m0a") >= data0 + 32, "the blocks were not written in place");
        let after = rig.power_cut(mode, 500 + k as u64);
        pool.abandon();
        let p2 = after.import();
        let v2 = p2.open_volume("v").unwrap();
        m.check(&*v2, &format!("after replay of indirect records ({mode:?})"));
        p2.check_space_accounting().unwrap();
        drop(v2);
        p2.export().unwrap();
        let p3 = after.import();
        m.check(&*p3.open_volume("v").unwrap(), "second import");
        p3.check_space_accounting().unwrap();
        p3.export().unwrap();
    }
}

#[test]
fn throughput_commit_is_durable_without_a_sync_no_log_device() {
    throughput_commit_is_durable_without_a_sync(false);
}

#[test]
fn throughput_commit_is_durable_without_a_sync_log_mirror() {
    throughput_commit_is_durable_without_a_sync(true);
}

/// Bytes written to the normal class (both sides of the mirror) by a txg sync after 64
/// flushed whole-block writes of 16 KiB, with the given properties.
fn sync_bytes_after_commits(props: &[(String, String)]) -> (u64, u64) {
    let rig = Rig::new(&["m0a", "m0b", "la", "lb"], DEV_SIZE);
    let (pool, mut m) = setup_16k(&rig, true, props);
    let v = pool.open_zvol("v").unwrap();
    let data = |r: &Rig| r.devs.iter().filter(|(n, _)| n.starts_with("m0")).map(|(_, d)| d.write_bytes()).sum::<u64>();
    let before = data(&rig);
    for i in 0..64u64 {
        m.write(&*v, (i + 1) * TP_BS, &pattern(300 + i, TP_BS as usize), false);
        v.flush().unwrap();
    }
    let committed = data(&rig) - before;
    pool.check_space_accounting().unwrap();
    let before_sync = data(&rig);
    pool.sync().unwrap();
    let synced = data(&rig) - before_sync;
    pool.check_space_accounting().unwrap();
    m.check(&*v, "after the sync");
    drop(v);
    pool.export().unwrap();
    let p2 = rig.import();
    m.check(&*p2.open_volume("v").unwrap(), "after export and import");
    p2.check_space_accounting().unwrap();
    p2.export().unwrap();
    (committed, synced)
}

/// The txg sync uses the blocks the commits wrote (the dirty records' overrides)
/// instead of writing the data again: with logbias=latency the sync writes the 1 MiB
/// of data to the mirror (twice: both sides), with throughput only the tree and the
/// object directory.
#[test]
fn the_sync_does_not_write_a_dmu_synced_block_again() {
    let data_bytes = 64 * TP_BS * 2; // both sides of the mirror
    let (lat_commit, lat_sync) = sync_bytes_after_commits(&[]);
    let (tp_commit, tp_sync) = sync_bytes_after_commits(&throughput());
    assert!(lat_commit < data_bytes / 4, "latency mode wrote {lat_commit} bytes to the pool at commit");
    assert!(lat_sync >= data_bytes, "latency-mode sync wrote only {lat_sync} bytes");
    assert!(tp_commit >= data_bytes, "throughput commits wrote only {tp_commit} bytes in place");
    assert!(tp_sync < data_bytes / 2, "throughput-mode sync wrote {tp_sync} bytes: the data again? (latency: {lat_sync})");
}

/// A block rewritten in the same txg after its commit: the override of the older
/// version is dropped (its block freed by the sync), and the newer data wins both
/// after replay (power cut before any sync) and after the sync.
#[test]
fn a_rewrite_after_a_throughput_commit_wins() {
    for cut in [true, false] {
        let rig = Rig::new(&["m0a", "m0b"], DEV_SIZE);
        let (pool, mut m) = setup_16k(&rig, false, &throughput());
        let v = pool.open_zvol("v").unwrap();
        let synced = pool.synced_txg();
        for round in 0..3u64 {
            for i in 0..8u64 {
                m.write(&*v, (i + 1) * TP_BS, &pattern(1000 * round + i, TP_BS as usize), false);
                v.flush().unwrap();
            }
        }
        // a whole-block rewrite not followed by a flush of its own, then a partial one
        // that is flushed (a copied record after the indirect ones)
        m.write(&*v, 2 * TP_BS, &pattern(7000, TP_BS as usize), false);
        m.write(&*v, 3 * TP_BS + 100, &pattern(7001, 3000), false);
        v.flush().unwrap();
        assert_eq!(pool.synced_txg(), synced, "a commit synced a txg");
        m.check(&*v, "before the cut or sync");
        if cut {
            let after = rig.power_cut(CrashMode::DropAll, 9);
            pool.abandon();
            let p2 = after.import();
            m.check(&*p2.open_volume("v").unwrap(), "after replay");
            p2.check_space_accounting().unwrap();
            p2.export().unwrap();
        } else {
            pool.sync().unwrap();
            pool.check_space_accounting().unwrap();
            m.check(&*v, "after the sync");
            // the freed overrides are reusable; more rounds and syncs stay exact
            for i in 0..8u64 {
                m.write(&*v, (i + 1) * TP_BS, &pattern(9000 + i, TP_BS as usize), true);
            }
            pool.sync().unwrap();
            pool.sync().unwrap();
            pool.check_space_accounting().unwrap();
            drop(v);
            pool.export().unwrap();
            let p2 = rig.import();
            m.check(&*p2.open_volume("v").unwrap(), "after export and import");
            p2.check_space_accounting().unwrap();
            p2.export().unwrap();
        }
    }
}

/// A WR_INDIRECT record whose block does not verify (here: the block damaged on every
/// copy after the cut) ends the replay of its chain there: the records before it are
/// replayed, it and the later ones are not, the import succeeds and nothing leaks.
#[test]
fn a_bad_indirect_block_ends_replay_of_its_chain() {
    let rig = Rig::new(&["m0a", "m0b"], DEV_SIZE);
    let (pool, mut m) = setup_16k(&rig, false, &throughput());
    let v = pool.open_zvol("v").unwrap();
    let loaded = m.bytes.clone();
    let blocks: Vec<Vec<u8>> = (0..8u64).map(|i| pattern(4000 + i, TP_BS as usize)).collect();
    for (i, b) in blocks.iter().enumerate() {
        m.write(&*v, (i as u64 + 1) * TP_BS, b, false);
        v.flush().unwrap();
    }
    let set = DevSet::default();
    for (k, (n, d)) in rig.devs.iter().enumerate() {
        let mut img = d.power_cut(CrashMode::DropAll, k as u64);
        // damage block 4's copy wherever it lies (the volume is not compressed)
        let at = img.windows(64).position(|w| w == &blocks[4][..64]).expect("block 4 is on every side of the mirror");
        img[at + 1000] ^= 0xff;
        set.insert(n, Arc::new(CrashDevice::from_image(img)));
    }
    pool.abandon();
    let p2 = Pool::import_with(&set.specs(), set.opener()).expect("import ends the replay at the bad block");
    let v2 = p2.open_volume("v").unwrap();
    let mut expect = loaded;
    for (i, b) in blocks.iter().enumerate().take(4) {
        let off = (i + 1) * TP_BS as usize;
        expect[off..off + b.len()].copy_from_slice(b);
    }
    m.bytes = expect;
    m.check(&*v2, "replay up to the bad block");
    p2.check_space_accounting().unwrap();
    drop(v2);
    p2.export().unwrap();
}

// ---- attack: commits that fall back, indirect blocks that never landed ----------------

use zilla_core::vdev::{Device, DeviceKind};

/// A CrashDevice whose cache flushes can be held (a device stuck in a flush): while the
/// gate is closed every flush waits, so a txg sync or a commit flushing this device
/// stalls there and the test acts inside that window.
struct GateDevice {
    inner: Arc<CrashDevice>,
    closed: parking_lot::Mutex<bool>,
    cv: parking_lot::Condvar,
    waiting: std::sync::atomic::AtomicU64,
}

impl GateDevice {
    fn close(&self) {
        *self.closed.lock() = true;
    }
    fn open(&self) {
        *self.closed.lock() = false;
        self.cv.notify_all();
    }
    fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::SeqCst)
    }
}

impl Device for GateDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        {
            let mut c = self.closed.lock();
            if *c {
                self.waiting.fetch_add(1, Ordering::SeqCst);
                while *c {
                    self.cv.wait(&mut c);
                }
                self.waiting.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn rotational(&self) -> bool {
        self.inner.rotational()
    }
    fn logical_sector_size(&self) -> u32 {
        self.inner.logical_sector_size()
    }
    fn physical_sector_size(&self) -> u32 {
        self.inner.physical_sector_size()
    }
    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
}

/// A rig whose devices named in `gated` are opened through a [`GateDevice`] (the rig's
/// `devs` keep the CrashDevices, for power cuts).
fn gated_rig(names: &[&str], gated: &[&str]) -> (Rig, Vec<Arc<GateDevice>>) {
    let set = DevSet::default();
    let (mut devs, mut gates) = (Vec::new(), Vec::new());
    for n in names {
        let d = Arc::new(CrashDevice::new(DEV_SIZE));
        if gated.contains(n) {
            let g = Arc::new(GateDevice { inner: d.clone(), closed: Default::default(), cv: Default::default(), waiting: Default::default() });
            set.insert(n, g.clone());
            gates.push(g);
        } else {
            set.insert(n, d.clone());
        }
        devs.push((n.to_string(), d));
    }
    (Rig { set, devs }, gates)
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Writer B's write is taken by writer A's commit, which cannot log it and waits for a
/// txg sync instead (`new_chain`: the volume has no chain on disk yet, so its first
/// commit waits for the sync that writes the header; else the log device fails the lwb
/// write and the chain breaks). B's flush comes while that sync is stuck in a data
/// disk's cache flush and finds nothing pending: it must still wait for that sync. It
/// returned at once: a power cut then lost B's acknowledged write.
fn flush_behind_a_fallen_back_commit(new_chain: bool) {
    use zilla_core::vdev::fault::DeviceFault;
    let (rig, gates) = gated_rig(&["m0a", "m0b", "la"], &["m0a", "m0b"]);
    no_txg_timeout();
    let pool = Pool::create_with("tank", tops(true, false), Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
    let v = pool.open_zvol("v").unwrap();
    let mut m = Model::new();
    if !new_chain {
        m.write(&*v, 0, &pattern(1, 4096), false);
        v.flush().unwrap(); // the chain's header is on disk
        rig.devs[2].1.arm(DeviceFault::WriteEio { nth: 0, count: u64::MAX });
    }
    let synced = pool.synced_txg();
    m.write(&*v, 10 * 4096, &pattern(502, 4096), false); // B's write, not flushed yet
    gates.iter().for_each(|g| g.close());
    let a = {
        let v = v.clone();
        std::thread::spawn(move || {
            v.write(20 * 4096, &pattern(501, 4096), false)?;
            v.flush()
        })
    };
    m.bytes[20 * 4096..21 * 4096].copy_from_slice(&pattern(501, 4096));
    wait_until("A's commit to fall back to a txg sync held in a flush", || gates.iter().any(|g| g.waiting() > 0));
    assert_eq!(pool.synced_txg(), synced, "a txg synced through the closed gate");
    let (tx, rx) = std::sync::mpsc::channel();
    let b = {
        let v = v.clone();
        std::thread::spawn(move || {
            let r = v.flush();
            let _ = tx.send(());
            r
        })
    };
    let early = rx.recv_timeout(std::time::Duration::from_secs(2)).is_ok();
    let unsynced = pool.synced_txg() == synced;
    gates.iter().for_each(|g| g.open());
    a.join().unwrap().unwrap();
    b.join().unwrap().unwrap();
    assert!(
        !(early && unsynced),
        "B's flush returned while B's write was neither in the log nor in a synced txg (the commit that took it waits for a txg sync; new chain: {new_chain})"
    );
    let after = rig.power_cut(CrashMode::DropAll, 3);
    pool.abandon();
    let p2 = after.import();
    m.check(&*p2.open_volume("v").unwrap(), "after the fallback sync");
    p2.export().unwrap();
}

#[test]
fn a_flush_behind_a_commit_that_fell_back_waits_for_its_sync_new_chain() {
    flush_behind_a_fallen_back_commit(true);
}

#[test]
fn a_flush_behind_a_commit_that_fell_back_waits_for_its_sync_broken_chain() {
    flush_behind_a_fallen_back_commit(false);
}

/// logbias=throughput on a checksum=off volume: a commit's lwb reaches the log mirror
/// (written and flushed) but the power fails while the data block it points at waits in
/// the data disks' flush. The write was never acknowledged, so replay must not write
/// anything but the old or the new bytes there; the record's block pointer must carry a
/// checksum that can fail. With the volume's checksum (off) replay took whatever the
/// disk held at that address (zeros here; another volume's freed data in general).
#[test]
fn an_unwritten_indirect_block_of_a_checksum_off_volume_is_not_replayed() {
    let (rig, gates) = gated_rig(&["m0a", "m0b", "la", "lb"], &["m0a", "m0b"]);
    no_txg_timeout();
    let pool = Pool::create_with("tank", tops(true, true), Default::default(), rig.set.opener()).unwrap();
    let props = [("logbias".to_string(), "throughput".to_string()), ("checksum".to_string(), "off".to_string())];
    pool.volume_create("v", VOLSIZE, TP_BS as u32, &props).unwrap();
    let v = pool.open_zvol("v").unwrap();
    let old = pattern(11, TP_BS as usize);
    v.write(TP_BS, &old, false).unwrap();
    v.flush().unwrap(); // creates the chain (a txg sync)
    pool.sync().unwrap();
    let (la, lb) = (rig.devs[2].1.clone(), rig.devs[3].1.clone());
    let (la0, lb0) = (la.flushes(), lb.flushes());
    gates.iter().for_each(|g| g.close());
    let new = pattern(12, TP_BS as usize);
    let _writer = {
        let (v, new) = (v.clone(), new.clone());
        std::thread::spawn(move || {
            let _ = v.write(TP_BS, &new, false).and_then(|_| v.flush());
        })
    };
    wait_until("the lwb flushed on both log children and the data block held in its flush", || {
        gates.iter().all(|g| g.waiting() > 0) && la.flushes() > la0 && lb.flushes() > lb0
    });
    assert!(v.zil().stats.zil_itx_indirect_count.load(Ordering::Relaxed) >= 1);
    let after = rig.power_cut(CrashMode::DropAll, 5);
    gates.iter().for_each(|g| g.open());
    pool.abandon();
    let p2 = after.import();
    let mut got = vec![0u8; TP_BS as usize];
    p2.open_volume("v").unwrap().read(TP_BS, &mut got).unwrap();
    assert!(
        got == old || got == new,
        "replay wrote bytes never written at that offset (all zeros: {})",
        got.iter().all(|&b| b == 0)
    );
    p2.check_space_accounting().unwrap();
    p2.export().unwrap();
}

/// A flush after more logged data than `zilla_zil_commit_bytes_max` (16 MiB: ten
/// passes of 8 KiB writes over the first half of every 16 KiB block of the 4 MiB
/// volume, 20 MiB of WR_COPIED records: whole-block rewrites would supersede each
/// other and leave only 4 MiB to log) waits for a txg sync instead of copying it all
/// into log blocks; the chain stays in
/// use for the next, small commit, and nothing acknowledged is lost. Both flush paths:
/// the front end's (started without blocking) and the blocking one.
#[test]
fn a_commit_of_more_than_the_bound_waits_for_a_txg_sync() {
    let bound = zilla_core::zil::ZILLA_ZIL_COMMIT_BYTES_MAX.get();
    const HALF: u64 = TP_BS / 2;
    assert!(10 * (VOLSIZE / TP_BS) * HALF > bound, "the test logs more than the default bound");
    for front_end in [true, false] {
        let rig = Rig::new(&["m0a", "m0b", "la", "lb"], DEV_SIZE);
        let (pool, mut m) = setup_16k(&rig, true, &[]);
        let v = pool.open_zvol("v").unwrap();
        let st = &v.zil().stats;
        let (synced, lwbs) = (pool.synced_txg(), st.zil_lwb_write_count.load(Ordering::Relaxed));
        for pass in 0..10u64 {
            for i in 0..VOLSIZE / TP_BS {
                m.write(&*v, i * TP_BS, &pattern(pass * 1000 + i, HALF as usize), false);
            }
        }
        if front_end { flush_as_front_end(&*v).unwrap() } else { v.flush().unwrap() }
        assert_eq!(st.zil_commit_txg_fallback_count.load(Ordering::Relaxed), 1);
        assert!(pool.synced_txg() > synced, "the flush returned before its txg synced");
        assert_eq!(st.zil_lwb_write_count.load(Ordering::Relaxed), lwbs, "the large commit was written to the log");
        // a small commit afterwards goes to the log, without a sync
        let (synced, log_writes) = (pool.synced_txg(), rig.writes("la"));
        m.write(&*v, 5 * TP_BS, &pattern(7, TP_BS as usize), false);
        if front_end { flush_as_front_end(&*v).unwrap() } else { v.flush().unwrap() }
        assert_eq!(pool.synced_txg(), synced, "a small commit waited for a txg sync");
        assert!(rig.writes("la") > log_writes, "the small commit did not reach the log");
        assert_eq!(st.zil_commit_txg_fallback_count.load(Ordering::Relaxed), 1);
        let after = rig.power_cut(CrashMode::DropAll, 900);
        pool.abandon();
        let p2 = after.import();
        m.check(&*p2.open_volume("v").unwrap(), "after the fallen-back commit and replay");
        p2.export().unwrap();
    }
}

/// The superseding tests' frame, for logbias latency (a log record with the data) and
/// throughput (a block written in place), each with two kinds of power cut: `writes`
/// (given the model, the volume and the round) runs with no txg syncing, a flush
/// commits it, the itxs superseded must number `superseded`, and after the cut replay
/// must give exactly the model.
fn replay_after_superseding(seed: u64, superseded: u64, writes: &dyn Fn(&mut Model, &dyn BlockVolume, u64)) {
    for props in [vec![], throughput()] {
        for (k, mode) in [CrashMode::DropAll, CrashMode::KeepRandomSubset].into_iter().enumerate() {
            let rig = Rig::new(&["m0a", "m0b", "la", "lb"], DEV_SIZE);
            let (pool, mut m) = setup_16k(&rig, true, &props);
            let v = pool.open_zvol("v").unwrap();
            let synced = pool.synced_txg();
            let st = &v.zil().stats;
            let superseded0 = st.zil_itx_superseded_count.load(Ordering::Relaxed);
            writes(&mut m, &*v, k as u64);
            v.flush().unwrap();
            assert_eq!(pool.synced_txg(), synced, "the commit waited for a txg sync");
            assert_eq!(st.zil_itx_superseded_count.load(Ordering::Relaxed) - superseded0, superseded, "itxs superseded ({mode:?}, {props:?})");
            let after = rig.power_cut(mode, seed + k as u64);
            pool.abandon();
            let p2 = after.import();
            m.check(&*p2.open_volume("v").unwrap(), &format!("after replay ({mode:?}, {props:?})"));
            p2.check_space_accounting().unwrap();
            p2.export().unwrap();
        }
    }
}

/// A partial write of a block whose whole-block write is still pending in the same txg
/// is logged as the whole new block, superseding the first record (no old buffer kept
/// beside the new one); replay gives both writes.
#[test]
fn a_partial_write_after_a_pending_whole_write_replays_both() {
    // each partial write supersedes the block's record: two per block
    replay_after_superseding(700, 16, &|m, v, k| {
        for i in 1..9u64 {
            m.write(v, i * TP_BS, &pattern(300 + i + k, TP_BS as usize), false);
            m.write(v, i * TP_BS + 4096, &pattern(400 + i, 4096), false);
            m.write(v, i * TP_BS + 12288, &pattern(500 + i, 1024), false);
        }
    });
}

/// An unmap or write_zeroes of a whole block whose whole-block write is still pending
/// in the same txg supersedes that record (its buffer is released), and a partial one
/// does not; replay gives the zeros and the writes after them.
#[test]
fn a_whole_block_unmap_after_a_pending_whole_write_replays_as_zeros() {
    // each whole-block unmap supersedes the block's record: 8 + 2
    replay_after_superseding(900, 10, &|m, v, k| {
        for i in 1..9u64 {
            m.write(v, i * TP_BS, &pattern(600 + i + k, TP_BS as usize), false);
            m.zero(v, i * TP_BS, TP_BS); // whole block: supersedes the write
            if i % 2 == 0 {
                m.write(v, i * TP_BS, &pattern(700 + i, TP_BS as usize), false);
                m.zero(v, i * TP_BS + 4096, 4096); // part of it: supersedes nothing
            }
        }
        // two blocks in one unmap: each block's record goes
        m.write(v, 10 * TP_BS, &pattern(801, TP_BS as usize), false);
        m.write(v, 11 * TP_BS, &pattern(802, TP_BS as usize), false);
        m.zero(v, 10 * TP_BS, 2 * TP_BS);
    });
}
