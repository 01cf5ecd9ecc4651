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
