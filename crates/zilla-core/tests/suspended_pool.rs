//! A suspended pool (every flush of both mirror children fails, so no txg commits) stays
//! manageable: admin calls answer within seconds; `clear` says the devices still fail
//! while they do, and resumes the pool (held flushes go on) once they work; a plain
//! export is refused and points to `-f`; `export_unsynced` (`export -f`) exports it
//! without the final sync, and after the devices heal an import finds every write a
//! flush acknowledged (the last synced txg plus the intent log's replay).
mod common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::{FaultDevice, MemDevice};
use zilla_core::vdev::Role;

/// Run `f` on its own thread; panic if it has not answered within `secs` seconds.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).unwrap_or_else(|_| panic!("{what} did not answer within {secs} s on a suspended pool"))
}

struct Rig {
    devs: DevSet,
    faults: Vec<Arc<FaultDevice>>,
}

impl Rig {
    fn new() -> Rig {
        let devs = DevSet::default();
        let mut faults = Vec::new();
        for n in ["m0a", "m0b"] {
            let f = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(64 << 20))));
            faults.push(f.clone());
            devs.insert(n, f);
        }
        Rig { devs, faults }
    }
    fn fail_flushes(&self, on: bool) {
        for f in &self.faults {
            f.fail_flush(on);
        }
    }
}

fn one_mirror() -> Vec<TopSpec> {
    vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m0a"), leaf("m0b")] }]
}

/// Make the pool suspended: both children fail every flush and a sync is asked for.
fn suspend(rig: &Rig, pool: &Arc<Pool>) {
    rig.fail_flushes(true);
    let p = pool.clone();
    let r = within(15, "pool.sync", move || p.sync());
    let e = r.expect_err("a sync with every flush failing must not succeed");
    assert!(e.to_string().contains("suspended"), "sync's error does not say the pool is suspended: {e}");
    assert_eq!(pool.status().state, "SUSPENDED");
}

#[test]
fn suspended_pool_clear_and_export_f() {
    let rig = Rig::new();
    let pool = create(&rig.devs, one_mirror());
    pool.volume_create("vol", 16 << 20, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let synced = pattern(1, 1 << 20);
    v.write(0, &synced, false).unwrap();
    v.flush().unwrap();
    pool.sync().unwrap();

    suspend(&rig, &pool);
    // clear while the devices still fail: a clear answer, the pool stays SUSPENDED
    let p = pool.clone();
    let t = Instant::now();
    let e = within(20, "clear", move || p.clear(None)).expect_err("clear succeeded while every flush fails");
    assert!(e.to_string().contains("still suspended"), "clear's error: {e}");
    assert!(t.elapsed() < Duration::from_secs(15), "clear took {:?}", t.elapsed());
    assert_eq!(pool.status().state, "SUSPENDED");
    // the other admin calls answer
    let p = pool.clone();
    within(5, "status, list, iostat, props", move || {
        let _ = (p.status(), p.list_row(), p.volumes(), p.get_props("vol", &["all".into()]));
    });
    let p = pool.clone();
    let e = within(10, "set", move || p.set_prop("vol", "compression", "lz4")).expect_err("set on a suspended pool said it was done");
    assert!(e.to_string().contains("suspended"), "set's error: {e}");
    let p = pool.clone();
    let e = within(10, "export", move || p.export()).expect_err("a plain export of a suspended pool succeeded");
    assert!(e.to_string().contains("export -f"), "export's error does not point to -f: {e}");
    assert_eq!(pool.status().state, "SUSPENDED", "a refused export must leave the pool as it was");

    // a writer's flush waits while the pool is suspended; clear after the devices heal
    // resumes the pool and the flush goes on
    let held = pattern(2, 1 << 20);
    v.write(1 << 20, &held, false).unwrap();
    let v2 = v.clone();
    let flusher = std::thread::spawn(move || v2.flush());
    std::thread::sleep(Duration::from_millis(300));
    rig.fail_flushes(false);
    let p = pool.clone();
    within(15, "clear after the devices healed", move || p.clear(None)).expect("clear after the devices healed");
    assert_eq!(pool.status().state, "ONLINE");
    flusher.join().unwrap().expect("the flush held while suspended must succeed once the pool resumes");

    // a write a flush acknowledged (in the intent log), then suspended again: export -f
    let logged = pattern(3, 1 << 20);
    v.write(2 << 20, &logged, false).unwrap();
    v.flush().unwrap();
    let synced_before = pool.synced_txg();
    suspend(&rig, &pool);
    v.write(3 << 20, &pattern(4, 1 << 20), false).unwrap(); // never flushed
    let v2 = v.clone();
    let flusher = std::thread::spawn(move || v2.flush());
    std::thread::sleep(Duration::from_millis(300));
    let p = pool.clone();
    within(15, "export -f", move || p.export_unsynced()).expect("export -f of a suspended pool");
    assert!(flusher.join().unwrap().is_err(), "a flush held by the exported pool must fail");
    assert_eq!(pool.synced_txg(), synced_before, "export -f must not commit a txg");
    assert!(pool.export().is_err(), "the pool is gone after export -f");
    drop(v);
    drop(pool);

    // the devices heal: the pool imports, the intent log replays
    rig.fail_flushes(false);
    let pool = import(&rig.devs);
    assert_eq!(pool.status().state, "ONLINE");
    let v = pool.open_volume("vol").unwrap();
    for (off, want, what) in [(0u64, &synced, "synced"), (1 << 20, &held, "held while suspended"), (2 << 20, &logged, "in the intent log")] {
        let mut back = vec![0u8; want.len()];
        v.read(off, &mut back).unwrap();
        assert!(back == *want, "the write {what} is not there after export -f and import");
    }
    drop(v);
    pool.export().unwrap();
}

/// An export whose final sync fails leaves the pool imported and running: once the
/// devices work again it syncs and exports normally.
#[test]
fn failed_export_leaves_the_pool_imported() {
    let rig = Rig::new();
    let pool = create(&rig.devs, one_mirror());
    pool.volume_create("vol", 16 << 20, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    v.write(0, &pattern(5, 1 << 20), false).unwrap();
    rig.fail_flushes(true);
    let p = pool.clone();
    let e = within(15, "export", move || p.export()).expect_err("export succeeded while every flush fails");
    assert!(e.to_string().contains("stays imported") || e.to_string().contains("export -f"), "export's error: {e}");
    rig.fail_flushes(false);
    let p = pool.clone();
    within(15, "clear", move || p.clear(None)).expect("clear after the devices healed");
    pool.scrub_wait().unwrap(); // the resilver of what the failed flushes may have dropped
    assert_eq!(pool.status().state, "ONLINE");
    let data = pattern(6, 1 << 20);
    v.write(1 << 20, &data, false).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.export().expect("export once the devices work");
    drop(pool);
    let pool = import(&rig.devs);
    let v = pool.open_volume("vol").unwrap();
    let mut back = vec![0u8; 1 << 20];
    v.read(1 << 20, &mut back).unwrap();
    assert!(back == data);
}
