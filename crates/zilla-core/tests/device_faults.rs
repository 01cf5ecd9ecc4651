//! Durability under device faults (issue 15, rows 1-5): a disk that errs, lies about
//! what it kept, or is replaced must not cost acknowledged data.
//!
//! Every test runs on [`Disk`]s: in-memory devices with a write cache. A write lands
//! in the cache; a flush makes the cache durable, or - when told to fail - drops it and
//! returns EIO, as Linux drops the dirty pages of a failed fdatasync. A power cut keeps
//! only what was durable. The ledger of acknowledged writes is the test's own.
mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use parking_lot::Mutex;
use zilla_core::spa::{ImportOptions, Pool, TopSpec};
use zilla_core::vdev::label::{self, DATA_START};
use zilla_core::vdev::{Device, Role};

const SIZE: u64 = 48 << 20;
const VOL: u64 = 8 << 20;

/// An in-memory disk with a volatile write cache and fault switches.
struct Disk {
    durable: Mutex<Vec<u8>>,
    cache: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Writes into the data area fail (labels still write).
    fail_data_writes: AtomicBool,
    /// Reads of the data area fail.
    fail_data_reads: AtomicBool,
    /// The next N flushes fail and drop the cache.
    fail_flushes: AtomicU32,
    /// Power is off: every I/O fails.
    dead: AtomicBool,
}

impl Disk {
    fn new() -> Arc<Disk> {
        Disk::from_image(vec![0; SIZE as usize])
    }
    fn from_image(img: Vec<u8>) -> Arc<Disk> {
        Arc::new(Disk {
            durable: Mutex::new(img),
            cache: Mutex::new(Vec::new()),
            fail_data_writes: AtomicBool::new(false),
            fail_data_reads: AtomicBool::new(false),
            fail_flushes: AtomicU32::new(0),
            dead: AtomicBool::new(false),
        })
    }
    fn in_data(&self, offset: u64, len: usize) -> bool {
        offset + len as u64 > DATA_START && offset < label::usable_end(SIZE)
    }
    /// Power cut: the cache is lost; returns the durable image.
    fn cut(&self) -> Vec<u8> {
        self.dead.store(true, Ordering::SeqCst);
        self.cache.lock().clear();
        self.durable.lock().clone()
    }
    fn eio() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EIO)
    }
}

impl Device for Disk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if self.dead.load(Ordering::SeqCst) || (self.fail_data_reads.load(Ordering::SeqCst) && self.in_data(offset, buf.len())) {
            return Err(Disk::eio());
        }
        let o = offset as usize;
        buf.copy_from_slice(&self.durable.lock()[o..o + buf.len()]);
        for (at, data) in self.cache.lock().iter() {
            let (a, b) = (*at as usize, *at as usize + data.len());
            let (lo, hi) = (a.max(o), b.min(o + buf.len()));
            if lo < hi {
                buf[lo - o..hi - o].copy_from_slice(&data[lo - a..hi - a]);
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if self.dead.load(Ordering::SeqCst) || (self.fail_data_writes.load(Ordering::SeqCst) && self.in_data(offset, buf.len())) {
            return Err(Disk::eio());
        }
        self.cache.lock().push((offset, buf.to_vec()));
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Disk::eio());
        }
        let fail = self.fail_flushes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        let pending = std::mem::take(&mut *self.cache.lock());
        if fail {
            return Err(Disk::eio());
        }
        let mut d = self.durable.lock();
        for (at, data) in pending {
            d[at as usize..at as usize + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        SIZE
    }
    fn rotational(&self) -> bool {
        false
    }
    fn kind(&self) -> zilla_core::vdev::DeviceKind {
        zilla_core::vdev::DeviceKind::Test("test-disk")
    }
}

/// A pool on named [`Disk`]s, with the ledger of acknowledged writes.
struct Rig {
    disks: Vec<(String, Arc<Disk>)>,
    set: DevSet,
    pool: Option<Arc<Pool>>,
    /// (offset, bytes) acknowledged by a successful flush.
    acked: Vec<(u64, Vec<u8>)>,
}

impl Rig {
    fn new(names: &[&str], tops: Vec<TopSpec>) -> Rig {
        let set = DevSet::default();
        let disks: Vec<(String, Arc<Disk>)> = names.iter().map(|n| (n.to_string(), Disk::new())).collect();
        for (n, d) in &disks {
            set.insert(n, d.clone());
        }
        let pool = create(&set, tops);
        pool.volume_create("vol", VOL, 4096, &[]).unwrap();
        Rig { disks, set, pool: Some(pool), acked: Vec::new() }
    }
    fn mirror(names: &[&str]) -> Rig {
        Rig::new(names, vec![TopSpec { role: Role::Normal, mirror: names.len() > 1, leaves: names.iter().map(|n| leaf(n)).collect() }])
    }
    fn pool(&self) -> &Arc<Pool> {
        self.pool.as_ref().unwrap()
    }
    fn disk(&self, name: &str) -> &Arc<Disk> {
        &self.disks.iter().find(|d| d.0 == name).unwrap().1
    }
    /// Write `len` bytes at `off` and flush; record it if the flush acknowledged it.
    fn write_flush(&mut self, seed: u64, off: u64, len: usize) -> zilla_core::Result<()> {
        let v = self.pool().open_volume("vol")?;
        let data = pattern(seed, len);
        v.write(off, &data, false)?;
        v.flush()?;
        // these rows are about txg syncs on faulty devices: a flush alone now commits
        // the intent log, so sync the txg as well
        self.pool().sync()?;
        self.acked.retain(|(o, d)| *o + d.len() as u64 <= off || *o >= off + len as u64);
        self.acked.push((off, data));
        Ok(())
    }
    /// Power cut on every disk; import from the durable images (plus `extra` disks).
    fn crash_and_import(&mut self, opts: &ImportOptions) -> zilla_core::Result<Arc<Pool>> {
        let images: Vec<(String, Vec<u8>)> = self.disks.iter().map(|(n, d)| (n.clone(), d.cut())).collect();
        if let Some(p) = self.pool.take() {
            p.abandon();
        }
        self.reopen(images, opts)
    }
    fn reopen(&mut self, images: Vec<(String, Vec<u8>)>, opts: &ImportOptions) -> zilla_core::Result<Arc<Pool>> {
        self.set = DevSet::default();
        self.disks = images.into_iter().map(|(n, img)| (n, Disk::from_image(img))).collect();
        for (n, d) in &self.disks {
            self.set.insert(n, d.clone());
        }
        let p = Pool::import_with_options(&self.set.specs(), self.set.opener(), zilla_core::env::real(), opts)?;
        self.pool = Some(p.clone());
        Ok(p)
    }
    /// Every acknowledged write reads back.
    fn check(&self) {
        let v = self.pool().open_volume("vol").unwrap();
        for (off, data) in &self.acked {
            let mut b = vec![0u8; data.len()];
            v.read(*off, &mut b).unwrap_or_else(|e| panic!("acknowledged write at {off} unreadable: {e}"));
            assert!(&b == data, "acknowledged write at {off} lost");
        }
    }
    fn leaf_state(&self, name: &str) -> (String, u64) {
        let st = self.pool().status();
        let l = st.config.iter().flat_map(|t| std::iter::once(t).chain(t.children.iter())).find(|l| l.name.ends_with(name)).cloned().unwrap();
        (l.state, l.write_errors)
    }
}

fn wait_resilver(pool: &Pool) {
    for _ in 0..500 {
        let s = pool.scan_status();
        if !(s.func == zilla_core::scan::ScanFunc::Resilver && s.state == zilla_core::scan::ScanState::Scanning) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("resilver did not finish");
}

/// Row 1: one child refuses the txg's writes, the other's flush fails (dropping its
/// cache). The flush may only be acknowledged once some child holds the txg; after a
/// power cut the acknowledged write is there.
#[test]
fn mirror_flush_needs_a_child_that_holds_the_txg() {
    let mut rig = Rig::mirror(&["a", "b"]);
    rig.write_flush(1, 0, 256 << 10).unwrap();
    rig.disk("a").fail_data_writes.store(true, Ordering::SeqCst);
    rig.disk("b").fail_flushes.store(1, Ordering::SeqCst);
    rig.write_flush(2, 1 << 20, 256 << 10).expect("flush acknowledged once b held the txg");
    rig.crash_and_import(&ImportOptions::default()).expect("import");
    rig.check();
}

/// Row 1, persistent: the flush on the only writable child always fails. Nothing of
/// the new write may be acknowledged; the old data survives the cut.
#[test]
fn flush_is_not_acknowledged_when_no_child_holds_the_txg() {
    let mut rig = Rig::mirror(&["a", "b"]);
    rig.write_flush(1, 0, 256 << 10).unwrap();
    rig.disk("a").fail_data_writes.store(true, Ordering::SeqCst);
    rig.disk("b").fail_flushes.store(u32::MAX, Ordering::SeqCst);
    let v = rig.pool().open_volume("vol").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = v.write(1 << 20, &pattern(2, 4096), false).and_then(|_| v.flush());
        let _ = tx.send(r.is_ok());
    });
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(true) => panic!("flush acknowledged although no device holds the txg"),
        _ => {}
    }
    rig.crash_and_import(&ImportOptions::default()).expect("import");
    rig.check();
}

/// Row 2: one failed fdatasync on one child. That child must not count as holding
/// the txg: removing its partner is refused until a resilver copied what it lost, and
/// the survivor then holds every acknowledged write.
#[test]
fn one_failed_fdatasync_is_remembered_and_guards_detach() {
    let mut rig = Rig::mirror(&["a", "b"]);
    rig.write_flush(1, 0, 512 << 10).unwrap();
    rig.disk("b").fail_flushes.store(1, Ordering::SeqCst);
    rig.write_flush(2, 2 << 20, 512 << 10).unwrap();
    rig.write_flush(3, 4 << 20, 64 << 10).unwrap();
    let (_, errs) = rig.leaf_state("b");
    assert!(errs >= 1, "b's failed flush not counted");
    match rig.pool().detach("a") {
        Err(e) => {
            assert!(e.to_string().contains("only device holding txgs"), "unexpected refusal: {e}");
            // the resilver the failed flush started (on its own thread) makes b whole
            let mut last = e;
            for _ in 0..500 {
                wait_resilver(rig.pool());
                rig.pool().sync().unwrap();
                match rig.pool().detach("a") {
                    Ok(()) => break,
                    Err(e) => last = e,
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(!rig.pool().leaf_specs().iter().any(|s| s.path.to_string_lossy() == "a"), "detach never allowed: {last}");
        }
        Ok(()) => {} // the resilver had already made b whole
    }
    rig.pool().sync().unwrap();
    // only b is left; its image must hold every acknowledged write
    rig.crash_and_import(&ImportOptions::default()).expect("import b alone");
    rig.check();
}

/// Row 3: `replace a c` where c refuses writes. The resilver cannot repair c, so c
/// keeps its DTL, the replace fails, and a (the only good copy) stays.
#[test]
fn replace_onto_a_device_that_refuses_writes_keeps_the_old_one() {
    let mut rig = Rig::new(&["a", "c"], vec![TopSpec { role: Role::Normal, mirror: false, leaves: vec![leaf("a")] }]);
    rig.write_flush(1, 0, 1 << 20).unwrap();
    rig.disk("c").fail_data_writes.store(true, Ordering::SeqCst);
    // replace returns once the resilver has started; waiting for it reports the failure
    let e = rig.pool().replace("a", &leaf("c"), false).and_then(|()| rig.pool().replace_wait()).expect_err("replace onto a device that refuses writes succeeded");
    assert!(e.to_string().contains("did not complete"), "{e}");
    assert!(rig.pool().leaf_specs().iter().any(|s| s.path.to_string_lossy() == "a"), "a was detached");
    assert!(rig.pool().scan_status().errors > 0 || rig.leaf_state("c").1 > 0, "resilver reported no trouble");
    rig.crash_and_import(&ImportOptions::default()).expect("import");
    rig.check();
}

/// Row 4: a child faulted by write errors stays faulted, with its DTL, across a power
/// cut; detaching its healthy partner is refused after the import.
#[test]
fn faults_and_dtls_survive_a_power_cut() {
    let mut rig = Rig::mirror(&["a", "b"]);
    rig.write_flush(1, 0, 256 << 10).unwrap();
    rig.disk("b").fail_data_writes.store(true, Ordering::SeqCst);
    for i in 0..24u64 {
        rig.write_flush(10 + i, (i % 16) * (256 << 10), 64 << 10).unwrap();
    }
    assert_eq!(rig.leaf_state("b").0, "FAULTED");
    let pool = rig.crash_and_import(&ImportOptions::default()).expect("import");
    assert_ne!(pool.status().state.as_str(), "ONLINE", "a pool with a faulted child imported ONLINE");
    let e = pool.detach("a").expect_err("detach of the only good child allowed after import");
    assert!(e.to_string().contains("only device holding txgs"), "{e}");
    rig.check();
    // the device recovers: clear, resilver, and b alone holds everything
    rig.disk("b").fail_data_writes.store(false, Ordering::SeqCst);
    rig.pool().clear(Some("b")).unwrap();
    wait_resilver(rig.pool());
    // the resilver's repairs and cleared DTL are durable only after a sync; until then
    // detaching the only complete copy is refused
    rig.pool().sync().unwrap();
    rig.pool().detach("a").expect("detach after the resilver");
    rig.pool().sync().unwrap();
    rig.crash_and_import(&ImportOptions::default()).expect("import b alone");
    rig.check();
}

/// Row 5: the newest txg's object directory cannot be read (a transient read error on
/// every copy). Import fails and says so; it does not load an older txg. Once the
/// error clears, import loads the newest txg.
#[test]
fn import_does_not_rewind_silently() {
    let mut rig = Rig::mirror(&["a", "b"]);
    rig.write_flush(1, 0, 256 << 10).unwrap();
    rig.write_flush(2, 1 << 20, 256 << 10).unwrap();
    let images: Vec<(String, Vec<u8>)> = rig.disks.iter().map(|(n, d)| (n.clone(), d.cut())).collect();
    rig.pool.take().unwrap().abandon();
    // transient: the data area of both disks fails reads during the first import
    let set = DevSet::default();
    for (n, img) in &images {
        let d = Disk::from_image(img.clone());
        d.fail_data_reads.store(true, Ordering::SeqCst);
        set.insert(n, d);
    }
    let e = Pool::import_with(&set.specs(), set.opener()).map(|_| ()).expect_err("import succeeded without its newest txg");
    assert!(e.to_string().contains("cannot be read"), "{e}");
    rig.reopen(images, &ImportOptions::default()).expect("import once the error cleared");
    rig.check();
}

/// Row 5, rewind: the newest txg is destroyed for good. Import refuses; `-F -n` says
/// which txg it would load and what it drops; `-F` loads it, and the txgs written after
/// outrank the skipped one.
#[test]
fn rewind_needs_the_flag_and_says_what_it_drops() {
    let mut rig = Rig::mirror(&["a", "b"]);
    rig.write_flush(1, 0, 256 << 10).unwrap();
    let before: Vec<Vec<u8>> = rig.disks.iter().map(|(_, d)| d.durable.lock().clone()).collect();
    let old_txg = rig.pool().synced_txg();
    rig.write_flush(2, 1 << 20, 256 << 10).unwrap();
    let newest_txg = rig.pool().synced_txg();
    assert!(newest_txg > old_txg);
    let mut images: Vec<(String, Vec<u8>)> = rig.disks.iter().map(|(n, d)| (n.clone(), d.cut())).collect();
    rig.pool.take().unwrap().abandon();
    // wreck every data-area byte the last txgs wrote, on both disks
    let (lo, hi) = (DATA_START as usize, label::usable_end(SIZE) as usize);
    for ((_, img), old) in images.iter_mut().zip(&before) {
        for i in lo..hi {
            if img[i] != old[i] {
                img[i] ^= 0x5a;
            }
        }
    }
    let set = DevSet::default();
    for (n, img) in &images {
        set.insert(n, Disk::from_image(img.clone()));
    }
    let e = Pool::import_with(&set.specs(), set.opener()).map(|_| ()).expect_err("import of a wrecked newest txg succeeded");
    assert!(e.to_string().contains("-F"), "the error does not point to -F: {e}");
    let plan = Pool::rewind_plan(&set.specs(), set.opener()).expect("rewind plan");
    assert_eq!(plan.newest_txg, newest_txg);
    assert!(plan.load_txg < newest_txg && plan.load_txg >= old_txg, "{plan:?}");
    let pool = rig.reopen(images, &ImportOptions { rewind: true, ..Default::default() }).expect("import -F");
    rig.acked.truncate(1); // the second write was in the dropped txgs
    rig.check();
    // the blocks that could not be read belong to the txgs given up, not to this pool
    let st = pool.status();
    assert!(st.error_list.is_empty() && st.data_errors == 0, "errors of the dropped txgs listed: {} {:?}", st.data_errors, st.error_list);
    pool.open_volume("vol").unwrap().write(3 << 20, &pattern(9, 4096), false).unwrap();
    pool.sync().unwrap();
    assert!(pool.synced_txg() > newest_txg, "the first txg after a rewind reuses a skipped txg number");
}
