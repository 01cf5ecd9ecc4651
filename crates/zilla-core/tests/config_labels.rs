//! Config changes against txg syncs and power cuts: an uberblock carries the guid sum
//! of the device tree it was written for, and import refuses one at or above the
//! labels' config txg whose sum differs. A config change must therefore never let a
//! sync write the new sum while the labels still hold the old config.
//!
//! Each test stops a config change at a device write (`CrashDevice::hold_writes`),
//! lets a txg sync try to run meanwhile, cuts the power of every device, and imports
//! from their durable images with no rewind.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::CrashMode;
use zilla_core::vdev::Role;

const DEV_SIZE: u64 = 32 << 20;
const VOLSIZE: u64 = 1 << 20;

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Write `seed`'s pattern to the volume and sync, in a thread; true if the sync
/// returned within `patience`.
fn sync_in_background(pool: &Arc<Pool>, seed: u64, patience: Duration) -> (std::thread::JoinHandle<()>, bool) {
    let p = pool.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let v = p.open_volume("v").unwrap();
        v.write(0, &pattern(seed, 4096), false).unwrap();
        let _ = p.sync();
        let _ = tx.send(());
    });
    let done = rx.recv_timeout(patience).is_ok();
    (h, done)
}

/// A 3-way mirror a/b/c with a volume, synced.
fn three_way() -> (CrashRig, Arc<Pool>) {
    zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
    let rig = CrashRig::new(&["a", "b", "c"], DEV_SIZE);
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b"), leaf("c")] }];
    let pool = Pool::create_with("tank", tops, Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
    pool.open_volume("v").unwrap().write(0, &pattern(1, 4096), false).unwrap();
    pool.sync().unwrap();
    (rig, pool)
}

fn import_cut(rig: &CrashRig, mode: CrashMode, seed: u64, what: &str) -> Arc<Pool> {
    let cut = rig.power_cut(mode, seed);
    match Pool::import_with(&cut.set.specs(), cut.set.opener()) {
        Ok(p) => p,
        Err(e) => panic!("{what}: the pool cut there does not import without a rewind: {e}"),
    }
}

/// Detach c while its own writes are held (the wipe of its labels), sync a txg
/// meanwhile, cut. Before the fix the detach changed the tree, released the sync lock
/// and wiped c before writing the others' labels: the sync wrote the new guid sum
/// under the old labels and import refused "guid sum mismatch".
#[test]
fn a_txg_synced_during_a_detach_leaves_an_importable_pool() {
    for (k, mode) in [CrashMode::DropAll, CrashMode::KeepRandomSubset, CrashMode::TornReordered].into_iter().enumerate() {
        let (rig, pool) = three_way();
        let c = rig.dev("c");
        c.hold_writes(true);
        let p = pool.clone();
        let detach = std::thread::spawn(move || p.detach("c"));
        wait_until("the detach reaches c's writes or ends", || c.writes_held() > 0 || detach.is_finished());
        let (sync, _) = sync_in_background(&pool, 2 + k as u64, Duration::from_secs(2));
        let imported = import_cut(&rig, mode, 40 + k as u64, &format!("detach, cut mode {mode:?}"));
        let names: Vec<String> = imported.status().config.iter().flat_map(|t| t.children.iter().map(|c| c.name.clone())).collect();
        assert!(names.iter().any(|n| n == "a") && names.iter().any(|n| n == "b"), "devices after import: {names:?}");
        imported.export().unwrap();
        // the old pool's devices are dead since the cut: whatever it does now fails
        c.hold_writes(false);
        let _ = detach.join().unwrap();
        sync.join().unwrap();
        pool.abandon();
    }
}

// ------------------------------------------------------------------------------------
// A config write that fails, and a label rewrite racing a config change
// ------------------------------------------------------------------------------------

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use zilla_core::vdev::fault::CrashDevice;
use zilla_core::vdev::label::{label_offset, CONFIG_REGION_SIZE};
use zilla_core::vdev::{Device, DeviceKind};

/// A CrashDevice whose config writes to the labels in `mask` (bit l: label l) fail
/// with EIO while armed, after `skip` of them succeeded: a disk (or its controller)
/// failing the second pass of a config write, say.
struct LabelFaults {
    dev: Arc<CrashDevice>,
    mask: AtomicUsize,
    skip: AtomicU64,
    /// Config writes still to refuse once armed (u64::MAX: all).
    refusals_left: AtomicU64,
    /// Reads so far (any offset).
    reads: AtomicU64,
}

impl LabelFaults {
    fn arm(&self, labels: &[usize], skip: u64) {
        self.arm_limited(labels, skip, u64::MAX);
    }
    fn arm_limited(&self, labels: &[usize], skip: u64, refusals: u64) {
        self.refusals_left.store(refusals, Ordering::SeqCst);
        self.skip.store(skip, Ordering::SeqCst);
        self.mask.store(labels.iter().fold(0, |m, l| m | 1 << l), Ordering::SeqCst);
    }
    fn refuses(&self, len: usize, offset: u64) -> bool {
        let mask = self.mask.load(Ordering::SeqCst);
        let config_write = len == CONFIG_REGION_SIZE && (0..4).any(|l| mask & 1 << l != 0 && label_offset(self.dev.size(), l) == offset);
        config_write
            && self.skip.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| s.checked_sub(1)).is_err()
            && self.refusals_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

impl Device for LabelFaults {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if self.refuses(buf.len(), offset) {
            return Err(std::io::Error::other("injected label write error"));
        }
        self.dev.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.dev.flush()
    }
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn rotational(&self) -> bool {
        false
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Test("label-faults")
    }
}

/// A CrashRig whose every device is a `LabelFaults` (disarmed).
fn label_fault_rig(names: &[&str]) -> (CrashRig, Vec<(String, Arc<LabelFaults>)>) {
    zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
    let rig = CrashRig::new(names, DEV_SIZE);
    let mut faults = Vec::new();
    for n in names {
        let f = Arc::new(LabelFaults { dev: rig.dev(n), mask: AtomicUsize::new(0), skip: AtomicU64::new(0), refusals_left: AtomicU64::new(u64::MAX), reads: AtomicU64::new(0) });
        rig.set.insert(n, f.clone());
        faults.push((n.to_string(), f));
    }
    (rig, faults)
}

fn arm(faults: &[(String, Arc<LabelFaults>)], names: &[&str], labels: &[usize], skip: u64) {
    for (_, f) in faults.iter().filter(|(n, _)| names.contains(&n.as_str())) {
        f.arm(labels, skip);
    }
}

/// A flushed write after a failed config change, synced, then a power cut: the pool
/// imports without a rewind and the write reads back.
fn write_sync_cut_import(rig: &CrashRig, pool: &Arc<Pool>, what: &str) {
    let v = pool.open_volume("v").unwrap();
    v.write(8192, &pattern(77, 4096), false).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.sync().unwrap();
    let imported = import_cut(rig, CrashMode::DropAll, 5, what);
    let mut back = vec![0u8; 4096];
    imported.open_volume("v").unwrap().read(8192, &mut back).unwrap();
    assert!(back == pattern(77, 4096), "{what}: the flushed write after it is lost");
    imported.export().unwrap();
    pool.abandon();
}

/// The second pass of a config write (labels 1 and 3) fails on every device it goes
/// to, after the first pass (labels 0 and 2, flushed) took the new config: the change
/// fails and attach and detach undo it in the live tree. The txgs synced next carry
/// the old guid sum; before the fix they went under labels whose newest config was
/// the undone one, and import refused "guid sum mismatch" (import with -F).
#[test]
fn a_config_write_failing_in_its_second_pass_leaves_an_importable_pool() {
    for op in ["detach", "attach"] {
        let (rig, faults) = label_fault_rig(&["a", "b", "c"]);
        let kids = if op == "detach" { vec![leaf("a"), leaf("b"), leaf("c")] } else { vec![leaf("a"), leaf("b")] };
        let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: kids }];
        let pool = Pool::create_with("tank", tops, Default::default(), rig.set.opener()).unwrap();
        pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
        pool.sync().unwrap();
        arm(&faults, &["a", "b", "c"], &[1, 3], 0);
        let r = if op == "detach" { pool.detach("c") } else { pool.attach("a", &leaf("c"), false) };
        assert!(r.is_err(), "{op}: the config reached no device's labels 1 and 3, yet it succeeded");
        arm(&faults, &["a", "b", "c"], &[], 0);
        if op == "attach" {
            // the device that did not join is left as it was found: no label names
            // it a member (a retry needed -f: "c is part of active pool 'tank'")
            let scan = zilla_core::vdev::label::scan_labels(&*rig.set.get("c")).unwrap();
            assert!(scan.config.is_none(), "the failed attach left c labelled as a member of the pool");
        }
        write_sync_cut_import(&rig, &pool, &format!("{op} whose label write failed"));
    }
}

/// `add` of a log vdev whose config write fails in its second pass: either the
/// write to the new leaf alone (its labels 0 and 2 then name the added vdev, at a
/// config txg the pool's own labels do not reach), or the write of the full config
/// after it (the add is undone in the live tree). The next txgs must still import
/// with the new leaf present; before the fix import took the config naming the log
/// vdev and refused "guid sum mismatch".
#[test]
fn an_add_whose_config_write_fails_leaves_an_importable_pool() {
    for (old_leaves_fail, new_leaf_skip) in [(false, 0), (true, 2)] {
        let (rig, faults) = label_fault_rig(&["a", "b", "l"]);
        let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }];
        let pool = Pool::create_with("tank", tops, Default::default(), rig.set.opener()).unwrap();
        pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
        pool.sync().unwrap();
        if old_leaves_fail {
            arm(&faults, &["a", "b"], &[1, 3], 0);
        }
        arm(&faults, &["l"], &[1, 3], new_leaf_skip);
        let r = pool.add(vec![TopSpec { role: Role::Log, mirror: false, leaves: vec![leaf("l")] }], false);
        assert!(r.is_err(), "a config write reached no device's labels 1 and 3, yet add succeeded");
        arm(&faults, &["a", "b", "l"], &[], 0);
        write_sync_cut_import(&rig, &pool, &format!("add whose label write failed (old leaves failing too: {old_leaves_fail})"));
    }
}

/// `remove` of a log vdev whose config write fails in its first pass on the data
/// devices, for good or once: the live tree has dropped the log vdev already (nothing
/// undoes that), so the txgs synced next carry the guid sum without it, under labels
/// that still list it (before the fix import refused "guid sum mismatch"). The error
/// must say the removal stands (before, it reported the label error alone, as if
/// nothing had changed), the device keeps its labels (every config on disk still
/// lists it), and once a sync wrote the config the pool imports without it.
#[test]
fn a_log_remove_whose_config_write_fails_leaves_an_importable_pool() {
    for refusals in [u64::MAX, 2] {
        let (rig, faults) = label_fault_rig(&["a", "b", "l"]);
        let tops = vec![
            TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] },
            TopSpec { role: Role::Log, mirror: false, leaves: vec![leaf("l")] },
        ];
        let pool = Pool::create_with("tank", tops, Default::default(), rig.set.opener()).unwrap();
        pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
        pool.sync().unwrap();
        for (_, f) in faults.iter().filter(|(n, _)| n == "a" || n == "b") {
            f.arm_limited(&[0, 2], 0, refusals);
        }
        let e = pool.remove("l").expect_err("the config reached no device's labels 0 and 2, yet remove succeeded");
        assert!(e.to_string().contains("out of the pool"), "the error does not say the removal stands: {e}");
        let scan = zilla_core::vdev::label::scan_labels(&*rig.set.get("l")).unwrap();
        assert!(scan.config.is_some(), "the removed log device lost its labels while every config on disk still lists it");
        if refusals != u64::MAX {
            let exhausted = faults.iter().filter(|(_, f)| f.refusals_left.load(Ordering::SeqCst) == 0).count();
            assert_eq!(exhausted, 2, "the injected failures did not all happen");
            pool.sync().expect("the sync writes the stale config and goes on");
        }
        arm(&faults, &["a", "b"], &[], 0);
        write_sync_cut_import(&rig, &pool, &format!("log remove whose label write failed (refusals {refusals})"));
    }
}

/// An Env that stops a thread of the test's choice at a point of its choice while
/// armed: `hostid` asked on a thread whose name starts with `thread` (`clock` false:
/// the scan's label rewrite, `write_config_labels`), or the wall clock read there
/// (`clock` true: `start_resilver` stamping its start time).
struct ScanGate {
    real: Arc<dyn zilla_core::env::Env>,
    thread: &'static str,
    clock: bool,
    armed: parking_lot::Mutex<bool>,
    cv: parking_lot::Condvar,
    stopped: AtomicBool,
}

impl ScanGate {
    fn new(thread: &'static str, clock: bool, armed: bool) -> Arc<ScanGate> {
        let real = zilla_core::env::real();
        Arc::new(ScanGate { real, thread, clock, armed: parking_lot::Mutex::new(armed), cv: Default::default(), stopped: AtomicBool::new(false) })
    }
    fn arm(&self) {
        *self.armed.lock() = true;
    }
    fn release(&self) {
        *self.armed.lock() = false;
        self.cv.notify_all();
    }
    /// Wait here while armed, if this is the gated thread and `clock` says this point.
    fn pass(&self, clock: bool) {
        if clock != self.clock || !std::thread::current().name().is_some_and(|n| n.starts_with(self.thread)) {
            return;
        }
        let mut armed = self.armed.lock();
        if *armed {
            self.stopped.store(true, Ordering::SeqCst);
        }
        while *armed {
            self.cv.wait(&mut armed);
        }
    }
}

impl zilla_core::env::Env for ScanGate {
    fn now_ns(&self) -> u64 {
        self.real.now_ns()
    }
    fn unix_time_ns(&self) -> u64 {
        self.pass(true);
        self.real.unix_time_ns()
    }
    fn sleep_until_ns(&self, deadline_ns: u64) {
        self.real.sleep_until_ns(deadline_ns)
    }
    fn spawn(&self, name: String, body: zilla_core::env::ThreadBody) -> std::io::Result<std::thread::JoinHandle<()>> {
        self.real.spawn(name, body)
    }
    fn random_u64(&self) -> u64 {
        self.real.random_u64()
    }
    fn is_simulated(&self) -> bool {
        false
    }
    fn threads_spawned(&self) -> u64 {
        self.real.threads_spawned()
    }
    fn hostid(&self) -> u32 {
        self.pass(false);
        self.real.hostid()
    }
}

fn leaf_names(pool: &Pool) -> Vec<String> {
    let mut v: Vec<String> = pool.status().config.iter().flat_map(|t| t.children.iter().map(|c| c.name.clone())).collect();
    v.sort();
    v
}

/// The resilver of an attach ends in a label rewrite (`write_config_labels`, under
/// `config_write_lock` but not `sync_lock`); a detach changes the live tree and config
/// under `sync_lock` only, then waits for `config_write_lock`. Before the fix the
/// rewrite refreshed its copy of the config, then stored it back: a detach in between
/// was undone in the config (the detached leaf came back), its labels and uberblocks
/// listed the leaf it had wiped, and the next import showed it UNAVAIL.
#[test]
fn a_label_rewrite_by_the_scan_does_not_undo_a_concurrent_detach() {
    zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
    let rig = CrashRig::new(&["a", "b", "c"], DEV_SIZE);
    let gate = ScanGate::new("scan_", false, true);
    let opts = zilla_core::spa::CreateOptions { env: Some(gate.clone()), ..Default::default() };
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }];
    let pool = Pool::create_with("tank", tops, opts, rig.set.opener()).unwrap();
    pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
    pool.open_volume("v").unwrap().write(0, &pattern(1, 4096), false).unwrap();
    pool.sync().unwrap();
    pool.attach("a", &leaf("c"), false).unwrap();
    wait_until("the resilver's label rewrite stops at the gate", || gate.stopped.load(Ordering::SeqCst));
    let p = pool.clone();
    let detach = std::thread::spawn(move || p.detach("b"));
    wait_until("the detach changes the live tree", || !leaf_names(&pool).contains(&"b".to_string()) || detach.is_finished());
    std::thread::sleep(Duration::from_millis(200)); // its config follows in the same step
    gate.release();
    detach.join().unwrap().unwrap();
    pool.sync().unwrap();
    pool.export().unwrap();
    let imported = Pool::import_with(&rig.set.specs(), rig.set.opener()).unwrap();
    assert_eq!(leaf_names(&imported), ["a", "c"], "devices after the detach of b: {:?}", imported.status().config);
    imported.export().unwrap();
}

/// An attach cut while its config write is under way, after the first old leaf took
/// the new config (b's writes held): that config names the new leaf. Before the fix the
/// new leaf's labels came last, so the cut left it with none and import showed it
/// UNAVAIL although present (`online` refuses it as missing at import, and an export
/// and import do not help: it has no label); now it is labelled first, as `add` does.
#[test]
fn an_attach_cut_during_its_label_write_finds_the_new_leaf() {
    for (k, mode) in [CrashMode::DropAll, CrashMode::KeepRandomSubset, CrashMode::TornReordered].into_iter().enumerate() {
        zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
        let rig = CrashRig::new(&["a", "b", "c"], DEV_SIZE);
        let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }];
        let pool = Pool::create_with("tank", tops, Default::default(), rig.set.opener()).unwrap();
        pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
        pool.open_volume("v").unwrap().write(0, &pattern(1, 4096), false).unwrap();
        pool.sync().unwrap();
        let b = rig.dev("b");
        b.hold_writes(true);
        let p = pool.clone();
        let attach = std::thread::spawn(move || p.attach("a", &leaf("c"), false));
        wait_until("the attach reaches b's writes", || b.writes_held() > 0 || attach.is_finished());
        let imported = import_cut(&rig, mode, 60 + k as u64, &format!("attach, cut mode {mode:?}"));
        let states: Vec<(String, String)> =
            imported.status().config.iter().flat_map(|t| t.children.iter().map(|c| (c.name.clone(), c.state.clone()))).collect();
        assert!(!states.iter().any(|(_, s)| s == "UNAVAIL"), "cut mode {mode:?}: devices after import: {states:?}");
        let mut back = vec![0u8; 4096];
        imported.open_volume("v").unwrap().read(0, &mut back).unwrap();
        assert!(back == pattern(1, 4096));
        imported.export().unwrap();
        b.hold_writes(false);
        let _ = attach.join().unwrap();
        pool.abandon();
    }
}

/// The config state in device `name`'s labels (active, exported).
fn label_state(rig: &CrashRig, name: &str) -> String {
    let scan = zilla_core::vdev::label::scan_labels(&*rig.set.get(name)).unwrap();
    let (_, json) = scan.config.expect("a config");
    serde_json::from_slice::<zilla_core::spa::LabelJson>(&json).unwrap().config.state
}

/// An attach that passed its open-pool check, then waited (here: in the opener of
/// the new device), while the admin exported the pool. Before the fix it went on
/// after the export: it wrote "active" over the exported labels of devices the pool
/// had released (another host then needs -f, and the new leaf is attached to a pool
/// nobody has imported) and started a resilver on the exported pool.
#[test]
fn an_attach_racing_an_export_leaves_the_pool_exported() {
    zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
    let rig = CrashRig::new(&["a", "b", "c"], DEV_SIZE);
    let gate = Arc::new((parking_lot::Mutex::new((true, false)), parking_lot::Condvar::new()));
    let (inner, g) = (rig.set.opener(), gate.clone());
    let opener: zilla_core::spa::Opener = Arc::new(move |spec, role| {
        if spec.path.to_str() == Some("c") {
            let mut st = g.0.lock();
            st.1 = true;
            while st.0 {
                g.1.wait(&mut st);
            }
        }
        inner(spec, role)
    });
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }];
    let pool = Pool::create_with("tank", tops, Default::default(), opener).unwrap();
    pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
    let p = pool.clone();
    let attach = std::thread::spawn(move || p.attach("a", &leaf("c"), false));
    wait_until("the attach opens c", || gate.0.lock().1);
    pool.export().unwrap();
    gate.0.lock().0 = false;
    gate.1.notify_all();
    let r = attach.join().unwrap();
    assert!(r.is_err(), "an attach to an exported pool succeeded");
    for n in ["a", "b"] {
        assert_eq!(label_state(&rig, n), "exported", "labels of {n} after the export");
    }
    let imported = rig.import();
    assert_eq!(leaf_names(&imported), ["a", "b"]);
    imported.export().unwrap();
}

/// `online` starts its resilver after releasing the sync lock. One stopped there (at
/// `start_resilver`'s clock reading) while the admin exported the pool: before the fix
/// export went through (no scan was running yet), then the resilver launched on the
/// exported pool, resilvered its released devices and ended by writing "active" over
/// their exported labels. Now export waits for the start and stops what it launched.
#[test]
fn a_resilver_started_as_the_pool_is_exported_does_not_run_after_it() {
    let (rig, faults) = label_fault_rig(&["a", "b"]);
    let reads = || faults.iter().map(|(_, f)| f.reads.load(Ordering::SeqCst)).sum::<u64>();
    let gate = ScanGate::new("online-call", true, false);
    let opts = zilla_core::spa::CreateOptions { env: Some(gate.clone()), ..Default::default() };
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }];
    let pool = Pool::create_with("tank", tops, opts, rig.set.opener()).unwrap();
    pool.volume_create("v", VOLSIZE, 4096, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    v.write(0, &pattern(1, 4096), false).unwrap();
    pool.sync().unwrap();
    pool.offline("b").unwrap();
    v.write(4096, &pattern(2, 4096), false).unwrap();
    drop(v);
    pool.sync().unwrap();
    gate.arm();
    let p = pool.clone();
    let online = std::thread::Builder::new().name("online-call".into()).spawn(move || p.online("b")).unwrap();
    wait_until("the online's resilver start reads the clock", || gate.stopped.load(Ordering::SeqCst) || online.is_finished());
    let p = pool.clone();
    let export = std::thread::spawn(move || p.export());
    std::thread::sleep(Duration::from_millis(300));
    // before the fix the export ended here, the resilver start still held
    let exported_first = export.is_finished();
    let mut reads_at_export = reads();
    gate.release();
    online.join().unwrap().unwrap();
    export.join().unwrap().unwrap();
    if !exported_first {
        reads_at_export = reads();
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(reads(), reads_at_export, "the exported pool's devices were read after the export: a scan ran on it ({:?})", pool.scan_status());
    for d in ["a", "b"] {
        assert_eq!(label_state(&rig, d), "exported", "{d}'s labels after the export and a resilver started meanwhile");
    }
    let imported = Pool::import_with(&rig.set.specs(), rig.set.opener()).unwrap();
    imported.scrub_wait().unwrap(); // the resilver the export stopped runs now
    let mut back = vec![0u8; 4096];
    imported.open_volume("v").unwrap().read(4096, &mut back).unwrap();
    assert!(back == pattern(2, 4096));
    imported.export().unwrap();
}
