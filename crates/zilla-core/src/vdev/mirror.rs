//! mirror: top-level vdevs (a single disk is a one-child mirror) and their leaves.
//!
//! Theory of operation
//! -------------------
//! A [`TopVdev`] owns 1..N [`Leaf`]s holding identical copies of every block written to
//! it. Writes go to every writable child; a write succeeds when at least one child took
//! it. A child that is offline, faulted or fails the write is *missing* that txg: the txg
//! is added to the child's DTL ("dirty time log", a list of txg ranges), and resilver
//! later copies exactly those txgs' blocks to it.
//!
//! Reads choose the least-loaded readable child (vdev_mirror.c): load = queued+active
//! I/Os plus a locality increment (0 when the read starts where the child's last I/O
//! ended; on rotating media 2 when within 1 MiB, 5 otherwise; on SSDs 1 when not
//! sequential). Ties go to child `(offset >> 21) % ties` so a sequential run stays on one
//! child. Children whose DTL covers the block's birth txg are skipped unless nothing else
//! is left. Every copy read is verified by the caller's `verify` closure (the checksum from
//! the block pointer); on an I/O error or a mismatch the next child is tried and, once a
//! good copy is found, every child that failed is rewritten from it (self-heal). A child
//! that returned good data is never rewritten.
//!
//! Scrub reads every readable child, verifies each copy and repairs the bad ones.
//!
//! Error counters (READ / WRITE / CKSUM of `zpool status`) are per leaf, atomics.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Guid, Txg, VdevId};

use super::abd::AlignedBuf;
use super::queue::{IoRequest, LeafQueue, WriteBytes};
use super::{Device, IoClass, IoError, IoErrorKind, IoOp, LeafSpec, Role};
use super::{
    ZFS_VDEV_MIRROR_NON_ROTATING_INC as NON_ROTATING_INC, ZFS_VDEV_MIRROR_NON_ROTATING_SEEK_INC as NON_ROTATING_SEEK_INC,
    ZFS_VDEV_MIRROR_ROTATING_INC as ROTATING_INC, ZFS_VDEV_MIRROR_ROTATING_SEEK_INC as ROTATING_SEEK_INC,
    ZFS_VDEV_MIRROR_ROTATING_SEEK_OFFSET as ROTATING_SEEK_OFFSET,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LeafState {
    Online = 0,
    Offline = 1,
    Faulted = 2,
    Unavail = 3,
}

impl LeafState {
    fn from_u8(v: u8) -> LeafState {
        match v {
            0 => LeafState::Online,
            1 => LeafState::Offline,
            2 => LeafState::Faulted,
            _ => LeafState::Unavail,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            LeafState::Online => "ONLINE",
            LeafState::Offline => "OFFLINE",
            LeafState::Faulted => "FAULTED",
            LeafState::Unavail => "UNAVAIL",
        }
    }
}

/// One physical device of the pool.
pub struct Leaf {
    pub guid: Guid,
    pub spec: LeafSpec,
    pub queue: LeafQueue,
    state: AtomicU8,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub cksum_errors: AtomicU64,
    /// Txg ranges [first, last] this child is missing (needs resilver), sorted, at most
    /// [`DTL_MAX_RANGES`]. Persistent: every sync stores it in the MOS (spa/sync.rs).
    dtl: Mutex<Vec<(Txg, Txg)>>,
    /// Bumped on every DTL change; the sync compares it to notice a DTL that changed
    /// after the MOS recording it was encoded.
    dtl_generation: AtomicU64,
    /// Which writes each flush covers, so a failed flush puts in the DTL everything it
    /// may have dropped (see [`FlushTrack`]).
    flush_track: Mutex<FlushTrack>,
    /// A write failed since the last flush was submitted: this leaf does not hold the
    /// txg being synced, whatever its next flush says.
    write_failed_since_flush: std::sync::atomic::AtomicBool,
    /// I/O errors since the last success: too many fault the leaf (zfs-diagnosis style).
    consecutive_errors: std::sync::atomic::AtomicU32,
    /// While a resilver pass runs: every range added to the DTL since it began, even
    /// ranges the DTL already covered (a repair lost to a failed flush lands inside the
    /// range being repaired). The pass does not clear these (see `scan::finish_resilver`).
    dtl_journal: Mutex<Option<Vec<(Txg, Txg)>>>,
    /// Why import found this leaf behind or apart from its siblings ("missed txgs
    /// 12-20"), shown by `pool status` while its DTL is not empty.
    import_note: Mutex<String>,
    /// Why import could not use what it found at this leaf's path (another pool's
    /// label, no label), shown by `pool status` while the leaf is UNAVAIL.
    unavail_reason: Mutex<String>,
}

/// A leaf's unflushed writes and flushes in flight, by birth txg range.
#[derive(Default)]
struct FlushTrack {
    /// Births of the writes queued since the last flush was queued.
    unflushed: Option<(Txg, Txg)>,
    /// Flushes queued and not completed.
    in_flight: Vec<InFlightFlush>,
    /// Failed flushes so far: a flush in flight across a failure proves nothing.
    failures: u64,
    /// The queue's device flush errors ([`LeafQueue::device_flush_errors`]) as of the
    /// last [`Leaf::flush_failed`]: fewer than the queue's count means a failure whose
    /// bookkeeping has not run, which will not see a flush completing meanwhile.
    accounted: u64,
}

/// A queued flush, as it was when it took its place in the queue.
struct InFlightFlush {
    id: u64,
    /// The births it covers.
    covered: Option<(Txg, Txg)>,
    /// `FlushTrack::failures` then.
    failures_at: u64,
    /// A write had failed since the previous consuming flush.
    write_failed: bool,
}

/// Bound on flushes in flight on one leaf (each has a caller waiting for it: the
/// syncing txg, intent-log commits, label writes).
const FLUSHES_IN_FLIGHT_MAX: usize = 4096;

/// Flush ids, unique within the process.
static FLUSH_IDS: AtomicU64 = AtomicU64::new(1);

/// Bound on a leaf's DTL ranges; beyond it the two closest ranges merge (resilvering
/// more than needed, never less).
pub const DTL_MAX_RANGES: usize = 64;

/// A leaf with this many I/O errors in a row, or one that reports ENXIO (gone), is
/// FAULTED while a sibling can still serve: it stops receiving I/O and accumulates a
/// DTL; `zilla pool clear` or `online` brings it back and resilvers what it missed.
pub const FAULT_AFTER_CONSECUTIVE_ERRORS: u32 = 10;

impl Leaf {
    /// A leaf on `dev`, its queue timing requests on `env`'s clock (the pool's).
    pub fn new(guid: Guid, spec: LeafSpec, dev: Arc<dyn Device>, env: &Arc<dyn crate::env::Env>) -> Leaf {
        let queue = LeafQueue::new(dev, &spec.display(), env);
        Leaf {
            guid,
            spec,
            queue,
            state: AtomicU8::new(LeafState::Online as u8),
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            cksum_errors: AtomicU64::new(0),
            dtl: Mutex::new(Vec::new()),
            dtl_generation: AtomicU64::new(0),
            flush_track: Mutex::new(FlushTrack::default()),
            write_failed_since_flush: std::sync::atomic::AtomicBool::new(false),
            consecutive_errors: std::sync::atomic::AtomicU32::new(0),
            dtl_journal: Mutex::new(None),
            import_note: Mutex::new(String::new()),
            unavail_reason: Mutex::new(String::new()),
        }
    }

    /// Queue a write of blocks born in `births` on this leaf, noting them as unflushed
    /// in the same step as the write takes its place in the queue's order (a flush
    /// another thread queues at the same moment either covers the write and its
    /// births, or neither).
    pub fn submit_write(&self, req: IoRequest, births: &[Txg]) {
        debug_assert!(req.op == IoOp::Write, "only writes carry births");
        self.queue.submit_noting(req, || {
            let mut t = self.flush_track.lock();
            for &b in births {
                t.unflushed = Some(match t.unflushed {
                    Some((lo, hi)) => (lo.min(b), hi.max(b)),
                    None => (b, b),
                });
            }
        });
    }

    /// Blocking write of `buf` at `phys`, a block born in `birth` (see [`Leaf::submit_write`]).
    pub fn write_blocking(&self, class: IoClass, buf: &[u8], phys: u64, birth: Txg) -> Result<(), IoError> {
        let w = super::queue::Waiter::new();
        self.submit_write(IoRequest::write(class, phys, Arc::new(AlignedBuf::copy_of(buf)), w.completion()), &[birth]);
        w.wait().result
    }

    /// Queue a flush of this leaf. It covers every write queued before it; those
    /// births leave the unflushed range as it is queued (atomically, see
    /// [`Leaf::submit_write`]). A failure puts in the DTL everything it may have
    /// dropped: what it covered, what any other flush still in flight covers, and what
    /// was written since (Linux drops the dirty pages of a failed fdatasync and reports
    /// the error to one caller only, so a concurrent flush may succeed without having
    /// made its writes durable). `done` gets the result and whether this leaf now
    /// holds every write flushed: the flush succeeded, no flush failed while it was in
    /// flight, and no write failed since the previous flush with `consume` (the sync's
    /// data flush consumes that note; label and uberblock flushes only read it).
    pub fn submit_flush(self: &Arc<Self>, consume: bool, done: impl FnOnce(Result<(), IoError>, bool) + Send + 'static) {
        let id = FLUSH_IDS.fetch_add(1, Ordering::Relaxed);
        let leaf = self.clone();
        let req = IoRequest::flush(Box::new(move |d| {
            let (covered, write_failed, failed_meanwhile, unaccounted) = {
                let mut t = leaf.flush_track.lock();
                let i = t.in_flight.iter().position(|f| f.id == id).expect("a queued flush is tracked until it completes");
                let f = t.in_flight.swap_remove(i);
                (f.covered, f.write_failed, t.failures != f.failures_at, leaf.queue.device_flush_errors() != t.accounted)
            };
            // A device flush failed and its bookkeeping has not run yet (an intent-log
            // flush failed in a write's completion, or a queued flush whose completion
            // is still to come), then this one ran and succeeded (Linux reports the
            // error once): that bookkeeping will not find this flush in flight, so what
            // this one covers goes into the DTL here.
            if d.result.is_ok() && unaccounted {
                if let Some((lo, hi)) = covered {
                    leaf.dtl_add_range(lo, hi);
                }
            }
            match d.result {
                Ok(()) => done(Ok(()), !failed_meanwhile && !unaccounted && !write_failed),
                Err(e) => {
                    leaf.flush_failed(covered);
                    done(Err(e), false)
                }
            }
        }));
        self.queue.submit_noting(req, || {
            let write_failed = if consume {
                self.write_failed_since_flush.swap(false, Ordering::AcqRel)
            } else {
                self.write_failed_since_flush.load(Ordering::Acquire)
            };
            let mut t = self.flush_track.lock();
            let covered = t.unflushed.take();
            assert!(t.in_flight.len() < FLUSHES_IN_FLIGHT_MAX, "flushes in flight on one leaf are bounded by their waiting callers");
            let failures_at = t.failures;
            t.in_flight.push(InFlightFlush { id, covered, failures_at, write_failed });
        });
    }

    /// A flush failed: what it covered, what every flush still in flight covers, and
    /// everything written since (the kernel may have dropped those pages too and will
    /// not say so again) is missing here. A flush issued outside the queue (on the
    /// completion of its own last write) passes None: it covers completed writes, all
    /// of which are in the unflushed range or covered by a flush in flight.
    pub(crate) fn flush_failed(&self, covered: Option<(Txg, Txg)>) {
        let lost: Vec<(Txg, Txg)> = {
            let mut t = self.flush_track.lock();
            t.failures += 1;
            // every write a failure counted so far may have dropped is in what this
            // collects, or was put in the DTL by a flush that completed before it.
            // That holds for a second failure counted before this bookkeeping too: the
            // writes it dropped completed before it was counted, so they are queued by
            // now, and each is unflushed, covered by a flush in flight (collected
            // here), or covered by a flush that completed while the count was ahead
            // (which put its range in the DTL itself).
            t.accounted = self.queue.device_flush_errors();
            [covered, t.unflushed].into_iter().chain(t.in_flight.iter().map(|f| f.covered)).flatten().collect()
        };
        for (lo, hi) in lost {
            self.dtl_add_range(lo, hi);
        }
        self.write_failed_since_flush.store(true, Ordering::Release);
    }

    /// Flush this leaf through its queue (after every write queued before). A failure
    /// puts what it may have dropped in the DTL (see [`Leaf::submit_flush`]).
    pub fn flush_blocking(self: &Arc<Self>) -> io::Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.submit_flush(false, move |r, _| {
            let _ = tx.send(r);
        });
        match rx.recv().map_err(|_| io::Error::other("leaf flush completion lost"))? {
            Ok(()) => Ok(()),
            Err(e) => {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    /// Generation of the DTL (changes whenever the DTL does).
    pub fn dtl_generation(&self) -> u64 {
        self.dtl_generation.load(Ordering::Acquire)
    }

    fn note_ok(&self) {
        if self.consecutive_errors.load(Ordering::Relaxed) != 0 {
            self.consecutive_errors.store(0, Ordering::Relaxed);
        }
    }
    pub fn device(&self) -> &Arc<dyn Device> {
        self.queue.device()
    }
    pub fn state(&self) -> LeafState {
        LeafState::from_u8(self.state.load(Ordering::Acquire))
    }
    /// Set the state; a change is posted as `resource.fs.zfs.statechange` (fm.rs).
    pub fn set_state(&self, s: LeafState) {
        let old = LeafState::from_u8(self.state.swap(s as u8, Ordering::AcqRel));
        if old != s {
            let e = crate::fm::Event::new(crate::fm::CLASS_STATECHANGE).vdev(self.guid, &self.spec.display());
            crate::fm::post(e.str("vdev_state", s.name()).str("vdev_laststate", old.name()));
        }
    }

    /// The state a leaf is opened in (at import: OFFLINE as the config says, UNAVAIL
    /// when its device is missing), without an event: the importer posts one that
    /// names the pool once it knows what the change means.
    pub fn set_initial_state(&self, s: LeafState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// Post an error report (fm.rs, rate limited per device) for `len` bytes at device
    /// offset `phys` of this leaf.
    fn ereport(&self, class: &str, phys: u64, len: u64, birth: Txg, errno: Option<i32>) {
        let mut e = crate::fm::Event::new(class).vdev(self.guid, &self.spec.display()).u64("zio_offset", phys).u64("zio_size", len);
        if !birth.is_zero() {
            e = e.u64("zio_txg", birth.get());
        }
        if let Some(n) = errno {
            e = e.u64("zio_err", n as u64);
        }
        crate::fm::post_rate_limited(e);
    }
    pub fn readable(&self) -> bool {
        self.state() == LeafState::Online
    }
    pub fn dtl(&self) -> Vec<(Txg, Txg)> {
        self.dtl.lock().clone()
    }
    pub fn set_dtl(&self, d: Vec<(Txg, Txg)>) {
        let mut cur = self.dtl.lock();
        let mut n: Vec<(Txg, Txg)> = Vec::new();
        for (lo, hi) in d {
            range_insert(&mut n, lo, hi);
        }
        if *cur != n {
            *cur = n;
            self.dtl_generation.fetch_add(1, Ordering::AcqRel);
        }
    }
    pub fn dtl_add(&self, txg: Txg) {
        self.dtl_add_range(txg, txg)
    }
    /// Add txgs `lo..=hi` to the DTL.
    pub fn dtl_add_range(&self, lo: Txg, hi: Txg) {
        let mut d = self.dtl.lock();
        if let Some(j) = self.dtl_journal.lock().as_mut() {
            range_insert(j, lo, hi);
        }
        if d.iter().any(|&(a, b)| a <= lo && hi <= b) {
            return;
        }
        range_insert(&mut d, lo, hi);
        self.dtl_generation.fetch_add(1, Ordering::AcqRel);
    }
    /// A resilver pass begins: start recording DTL additions (see `dtl_journal`).
    pub fn begin_dtl_journal(&self) {
        let _d = self.dtl.lock();
        *self.dtl_journal.lock() = Some(Vec::new());
    }
    /// The DTL ranges added since [`Leaf::begin_dtl_journal`] (recording goes on).
    pub fn dtl_journal(&self) -> Vec<(Txg, Txg)> {
        self.dtl_journal.lock().clone().unwrap_or_default()
    }
    /// A resilver pass repaired `repaired` on this leaf: remove it from the DTL, except
    /// what was added since the pass began (and `also_kept`), and stop recording.
    pub fn finish_dtl_journal(&self, repaired: &[(Txg, Txg)], also_kept: &[(Txg, Txg)]) {
        let mut d = self.dtl.lock();
        let journal = self.dtl_journal.lock().take().unwrap_or_default();
        let clear = range_subtract(&range_subtract(repaired, &journal), also_kept);
        let n = range_subtract(&d, &clear);
        if *d != n {
            *d = n;
            self.dtl_generation.fetch_add(1, Ordering::AcqRel);
        }
    }
    pub fn dtl_contains(&self, txg: Txg) -> bool {
        self.dtl.lock().iter().any(|&(a, b)| txg >= a && txg <= b)
    }
    pub fn dtl_empty(&self) -> bool {
        self.dtl.lock().is_empty()
    }
    /// Why import put this leaf's DTL where it is (see `import_note`).
    pub fn set_import_note(&self, note: String) {
        *self.import_note.lock() = note;
    }
    /// The import note while the leaf still misses txgs (resilver not finished).
    pub fn import_note(&self) -> Option<String> {
        if self.dtl_empty() {
            return None;
        }
        let n = self.import_note.lock().clone();
        (!n.is_empty()).then_some(n)
    }
    /// Why the device at this leaf's path is not the leaf (see `unavail_reason`).
    pub fn set_unavail_reason(&self, why: String) {
        *self.unavail_reason.lock() = why;
    }
    /// The reason while the leaf is UNAVAIL.
    pub fn unavail_reason(&self) -> Option<String> {
        if self.state() != LeafState::Unavail {
            return None;
        }
        let n = self.unavail_reason.lock().clone();
        (!n.is_empty()).then_some(n)
    }
    pub fn clear_errors(&self) {
        self.read_errors.store(0, Ordering::Relaxed);
        self.write_errors.store(0, Ordering::Relaxed);
        self.cksum_errors.store(0, Ordering::Relaxed);
    }
}

/// Result of a verified read: the data plus repair bookkeeping.
pub struct MirrorRead {
    pub data: AlignedBuf,
    pub repaired_bytes: u64,
}

/// Outcome of a scrub of one block on one top-level vdev.
#[derive(Debug, Default, Clone)]
pub struct ScrubOutcome {
    pub repaired_bytes: u64,
    pub bad_copies: u32,
    pub unrecoverable: bool,
    /// Children whose copy was bad and could not be rewritten (by guid): a resilver
    /// must not clear their DTLs.
    pub unrepaired: Vec<Guid>,
}

pub struct TopVdev {
    pub id: VdevId,
    pub guid: Guid,
    pub role: Role,
    pub ashift: u8,
    /// Two or more make a mirror ([`TopVdev::is_mirror`]): attach and detach change
    /// this list only, so every view of the tree follows it at once.
    pub children: parking_lot::RwLock<Vec<Arc<Leaf>>>,
    /// Reads whose asynchronous first try failed on a child, newest last, at most
    /// `SUSPECT_READS_MAX`: the blocking retry reads the other children first and
    /// repairs that child from a good copy without asking it again.
    pub suspect_reads: parking_lot::Mutex<std::collections::VecDeque<SuspectRead>>,
}

/// A block whose asynchronous first read failed on `child` (see `suspect_reads`).
#[derive(Debug, Clone, Copy)]
pub struct SuspectRead {
    phys: u64,
    birth: Txg,
    child: Guid,
}

/// The self-heal gate of a caller whose blocks cannot be reused while it runs (a scrub
/// or resilver holds a free pin): [`TopVdev::read_verified`] runs each rewrite through
/// its gate, which runs it only if still safe and says whether it ran and succeeded.
pub fn repair_always(write: &mut dyn FnMut() -> bool) -> bool {
    write()
}

/// Failed asynchronous first tries remembered for their blocking retries.
const SUSPECT_READS_MAX: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyResult {
    Good,
    Bad,
}

impl TopVdev {
    /// Count an I/O error on `c` and fault it if it looks dead and its siblings can
    /// serve everything it holds. A leaf that is the only one holding some txgs (its
    /// siblings were attached, offlined or faulted since) stays ONLINE however many
    /// errors it has: faulting it would make those blocks unreadable, where reading it
    /// may still work (a disk whose writes fail often still reads). OpenZFS does the
    /// same (`vdev_fault` degrades instead of faulting when `vdev_dtl_required`).
    fn note_error(&self, c: &Leaf, e: &IoError) {
        c.ereport(crate::fm::CLASS_IO, e.offset, e.len, Txg::ZERO, Some(e.errno.unwrap_or(libc::EIO)));
        let n = c.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
        let gone = e.is_gone();
        if (gone || n >= FAULT_AFTER_CONSECUTIVE_ERRORS) && c.state() == LeafState::Online {
            let sibling_ok = self.children.read().iter().any(|o| o.guid != c.guid && o.readable());
            let only_here = self.txgs_required(c);
            if sibling_ok && only_here.is_empty() {
                c.set_state(LeafState::Faulted);
                tracing::warn!(device = %c.spec.shown(), errors = n, "device faulted after I/O errors: {e}");
            } else if sibling_ok && n == FAULT_AFTER_CONSECUTIVE_ERRORS {
                tracing::warn!(
                    device = %c.spec.shown(),
                    errors = n,
                    txgs = %ranges_text(&only_here),
                    "device has I/O errors but is the only one holding some txgs: kept online (degraded): {e}"
                );
            }
        }
    }

    /// The txgs only `c` holds among this vdev's children, up to any txg: not empty
    /// means `c` must not be faulted or taken away.
    pub fn txgs_required(&self, c: &Leaf) -> Vec<(Txg, Txg)> {
        self.txgs_only_on(c, Txg(u64::MAX / 8), &|_| Vec::new())
    }

    pub fn children(&self) -> Vec<Arc<Leaf>> {
        self.children.read().clone()
    }

    /// A mirror: more than one child (as `zpool` shows a vdev a detach left with one
    /// child as that disk, and one an attach gave a second child as `mirror-N`).
    pub fn is_mirror(&self) -> bool {
        self.children.read().len() > 1
    }

    /// Usable bytes for allocation: the smallest child, minus the label areas. Children
    /// missing at import (size 0) do not count, or a degraded mirror would have no space.
    pub fn asize(&self) -> u64 {
        let min = self.children.read().iter().map(|c| c.device().size()).filter(|&s| s > 0).min().unwrap_or(0);
        super::label::usable_end(min).saturating_sub(super::label::DATA_START)
    }

    pub fn state_name(&self) -> &'static str {
        let ch = self.children.read();
        let online = ch.iter().filter(|c| c.readable()).count();
        if online == ch.len() {
            if ch.iter().any(|c| !c.dtl_empty()) { "DEGRADED" } else { "ONLINE" }
        } else if online == 0 {
            "UNAVAIL"
        } else {
            "DEGRADED"
        }
    }

    /// The children that take writes now (online); `missed` runs for each other one
    /// (it gets the txgs of the writes in its DTL).
    fn writable_children(&self, missed: &dyn Fn(&Leaf)) -> Vec<Arc<Leaf>> {
        let mut all = self.children();
        all.retain(|c| {
            let ok = c.readable();
            if !ok {
                missed(c);
            }
            ok
        });
        all
    }

    /// A write of a block born in `txg` failed on `leaf`: it misses that txg, its next
    /// flush does not count as holding what it was given, and the error counts toward
    /// faulting it.
    fn note_write_failed(&self, leaf: &Leaf, txg: Txg, e: &IoError) {
        leaf.write_errors.fetch_add(1, Ordering::Relaxed);
        leaf.write_failed_since_flush.store(true, Ordering::Release);
        leaf.dtl_add(txg);
        self.note_error(leaf, e);
    }

    /// Write `data` at data offset `offset` (relative to DATA_START) on every writable
    /// child: one child request each, sharing the buffer, all in flight at once. Children
    /// that miss it (not online, or their write fails) get `txg` in their DTL. `done` runs
    /// once, on the engine thread of the last child to finish, with every child's result.
    pub fn write_async(self: &Arc<Self>, class: IoClass, data: impl Into<WriteBytes>, offset: u64, txg: Txg, done: WriteDone) {
        let data: WriteBytes = data.into();
        let phys = super::label::DATA_START + offset;
        let writable = self.writable_children(&|c| c.dtl_add(txg));
        if writable.is_empty() {
            done(WriteOutcome { written: 0, failed: Vec::new(), len: data.len() as u64, offset: phys });
            return;
        }
        let fan = Fanout::new(writable.len(), data.len() as u64, phys, done);
        for c in writable {
            let (fan, top, leaf) = (fan.clone(), self.clone(), c.clone());
            let req = IoRequest::write(class, phys, data.clone(), Box::new(move |d| {
                // Let go of the shared buffer before the last child reports, so the
                // caller gets it back for reuse.
                let super::queue::IoDone { result, data, .. } = d;
                drop(data);
                match result {
                    Ok(()) => {
                        leaf.note_ok();
                        fan.outcome.lock().written += 1;
                    }
                    Err(e) => {
                        top.note_write_failed(&leaf, txg, &e);
                        fan.outcome.lock().failed.push((leaf.guid, e));
                    }
                }
                fan.child_done();
            }));
            c.submit_write(req, &[txg]);
        }
    }

    /// Write `blocks` on every writable child, then, per child,
    /// flush its write cache as soon as its own last write completed (with `flush`):
    /// the intent log's write-then-flush. The flush runs in that completion, on the
    /// engine thread that finished the write, so a commit waits for one hand-off per
    /// child and back instead of two; on an io_uring leaf each block is instead written
    /// durable (RWF_DSYNC) and no separate flush is issued. `done` gets, as `written`, the children that hold
    /// every block (all writes and the flush succeeded). A child that misses a block
    /// gets `txg` in its DTL as in [`TopVdev::write_async`]; a failed flush is handled
    /// as the sync's (everything not yet flushed on that child may be lost).
    ///
    /// The leaf's unflushed set is left alone: the flush covers the completed writes
    /// only, and the txg sync's own flush still covers whatever it wrote.
    pub fn write_blocks_then_flush(self: &Arc<Self>, class: IoClass, blocks: Vec<BlockWrite>, flush: bool, done: WriteDone) {
        let len: u64 = blocks.iter().map(|b| b.data.len() as u64).sum();
        let first = blocks.first().map_or(0, |b| super::label::DATA_START + b.offset);
        let writable = self.writable_children(&|c| blocks.iter().for_each(|b| c.dtl_add(b.txg)));
        if writable.is_empty() || blocks.is_empty() {
            let written = if blocks.is_empty() { writable.len() as u32 } else { 0 };
            done(WriteOutcome { written, failed: Vec::new(), len, offset: first });
            return;
        }
        let fan = Fanout::new(writable.len(), len, first, done);
        let txgs: Arc<[Txg]> = blocks.iter().map(|b| b.txg).collect();
        for c in writable {
            // Where a durable write is one device request (io_uring: RWF_DSYNC, FUA on a
            // device that has it), each block is written durable and no flush follows:
            // no completion waits on a blocking fdatasync (the leaf's reaper would stall
            // every other completion of the leaf meanwhile), and two mirror children on
            // one host file system do not queue two separate journal commits. Elsewhere
            // (modelled and test devices, worker threads) the blocks are written and the
            // last one's completion flushes once.
            let durable = flush && c.queue.durable_writes_in_one_request();
            let child = Arc::new(ChildRun { left: AtomicU32::new(blocks.len() as u32), failed: std::sync::atomic::AtomicBool::new(false) });
            for b in &blocks {
                let (fan, top, leaf, child, txgs, txg) = (fan.clone(), self.clone(), c.clone(), child.clone(), txgs.clone(), b.txg);
                let req = IoRequest::write(class, super::label::DATA_START + b.offset, b.data.clone(), Box::new(move |d| {
                    let super::queue::IoDone { result, data, .. } = d;
                    drop(data);
                    if let Err(e) = result {
                        top.note_write_failed(&leaf, txg, &e);
                        if durable {
                            // the error may be the flush's: as a failed flush, whatever
                            // this leaf has not had flushed may be lost
                            leaf.flush_failed(None);
                        }
                        child.failed.store(true, Ordering::Release);
                        fan.outcome.lock().failed.push((leaf.guid, e));
                    }
                    if child.left.fetch_sub(1, Ordering::AcqRel) != 1 {
                        return;
                    }
                    if !child.failed.load(Ordering::Acquire) {
                        match if flush && !durable { leaf.queue.flush_completed_writes() } else { Ok(()) } {
                            Ok(()) => {
                                leaf.note_ok();
                                fan.outcome.lock().written += 1;
                            }
                            Err(e) => {
                                leaf.write_errors.fetch_add(1, Ordering::Relaxed);
                                txgs.iter().for_each(|t| leaf.dtl_add(*t));
                                leaf.flush_failed(None);
                                top.note_error(&leaf, &e);
                                fan.outcome.lock().failed.push((leaf.guid, e));
                            }
                        }
                    }
                    fan.child_done();
                }));
                c.submit_write(if durable { req.durable() } else { req }, &[b.txg]);
            }
        }
    }

    /// Blocking write of `buf` (copied once into an aligned buffer). Ok if at least one
    /// child wrote it.
    pub fn write(self: &Arc<Self>, class: IoClass, buf: &[u8], offset: u64, txg: Txg) -> io::Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.write_async(class, Arc::new(AlignedBuf::copy_of(buf)), offset, txg, Box::new(move |o| {
            let _ = tx.send(o);
        }));
        let o = rx.recv().map_err(|_| io::Error::other("mirror write completion lost"))?;
        o.into_result().map_err(io::Error::from)
    }

    fn load_of(&self, c: &Leaf, offset: u64) -> u64 {
        let rotating = c.device().rotational();
        let last = c.queue.last_offset();
        let inc = if last == offset {
            if rotating { ROTATING_INC.get() } else { NON_ROTATING_INC.get() }
        } else if rotating {
            let seek_inc = ROTATING_SEEK_INC.get();
            if last.abs_diff(offset) <= ROTATING_SEEK_OFFSET.get() { seek_inc / 2 } else { seek_inc }
        } else {
            NON_ROTATING_SEEK_INC.get()
        };
        c.queue.pending() as u64 + inc
    }

    /// Order in which to try the children for a read at `offset` of a block born in `birth`.
    fn read_order(&self, children: &[Arc<Leaf>], phys: u64, birth: Txg) -> Vec<usize> {
        let mut fresh: Vec<(u64, usize)> = Vec::new();
        let mut stale: Vec<usize> = Vec::new();
        for (i, c) in children.iter().enumerate() {
            if !c.readable() {
                continue;
            }
            if c.dtl_contains(birth) {
                stale.push(i);
            } else {
                fresh.push((self.load_of(c, phys), i));
            }
        }
        let mut order = Vec::with_capacity(children.len());
        if let Some(min) = fresh.iter().map(|f| f.0).min() {
            let ties: Vec<usize> = fresh.iter().filter(|f| f.0 == min).map(|f| f.1).collect();
            let pick = ties[((phys >> 21) as usize) % ties.len()];
            order.push(pick);
            let mut rest: Vec<(u64, usize)> = fresh.into_iter().filter(|f| f.1 != pick).collect();
            rest.sort();
            order.extend(rest.into_iter().map(|f| f.1));
        }
        order.extend(stale);
        order
    }

    /// Read `len` bytes at data offset `offset`, verifying each copy; self-heal bad
    /// copies, each rewrite run through `gate` (which runs it only if the block cannot
    /// have been freed and reused since it was found; see `Metaslabs::with_releases_held`).
    pub fn read_verified(
        &self,
        class: IoClass,
        offset: u64,
        len: usize,
        birth: Txg,
        verify: &dyn Fn(&[u8]) -> VerifyResult,
        gate: &dyn Fn(&mut dyn FnMut() -> bool) -> bool,
    ) -> io::Result<MirrorRead> {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let (order, suspect) = self.suspect_last(&children, phys, birth, self.read_order(&children, phys, birth));
        // The child whose asynchronous try of this read failed is not read again first:
        // its failure is counted (by the try) and it is repaired from the first good
        // copy like any child that failed here. A dying disk is not asked twice for the
        // block (each ask may cost it seconds of retries). It is read last, only when no
        // other child has a good copy (the try's failure may have been passing), and
        // meeting the same failure again then is not a second error.
        let mut failed: Vec<usize> = suspect.into_iter().collect();
        let mut last_err: Option<IoError> = None;
        for &i in &order {
            let c = &children[i];
            let counted = suspect == Some(i);
            if counted {
                failed.retain(|&f| f != i);
            }
            match c.queue.read_buf(class, len, phys) {
                Ok(buf) => {
                    if verify(&buf) == VerifyResult::Good {
                        let mut repaired = 0;
                        for &f in &failed {
                            if gate(&mut || self.repair(&children[f], &buf, phys, birth)) {
                                repaired += len as u64;
                            }
                        }
                        return Ok(MirrorRead { data: buf, repaired_bytes: repaired });
                    }
                    if !counted {
                        c.cksum_errors.fetch_add(1, Ordering::Relaxed);
                        c.ereport(crate::fm::CLASS_CHECKSUM, phys, len as u64, birth, None);
                    }
                    last_err = Some(IoError::checksum(&c.queue_name(), phys, len as u64));
                    failed.push(i);
                }
                Err(e) => {
                    if !counted {
                        c.read_errors.fetch_add(1, Ordering::Relaxed);
                        self.note_error(c, &e);
                    }
                    last_err = Some(e);
                    failed.push(i);
                }
            }
        }
        Err(last_err.map(io::Error::from).unwrap_or_else(|| io::Error::new(io::ErrorKind::Other, "no readable device in vdev")))
    }

    /// The first try of [`TopVdev::read_verified`] without blocking: read the block
    /// from the child the read order picks first and call `done` from that read's
    /// completion (on the engine thread) with the bytes if they verify. `None` when no
    /// fresh child is readable, or the read failed or did not verify: the caller then
    /// does the whole `read_verified` from a blocking context, which tries every child
    /// and repairs bad copies. The error this try met is counted here, on the child
    /// that gave it (the retry may well read the other child: under load the read
    /// order follows the queues), so a failing disk's errors add up to a fault. The
    /// completion holds the child, so its queue outlives the request. `done` must not
    /// block.
    pub fn read_first_async(
        self: &Arc<Self>,
        class: IoClass,
        offset: u64,
        len: usize,
        birth: Txg,
        verify: Box<dyn FnOnce(&[u8]) -> VerifyResult + Send>,
        done: Box<dyn FnOnce(Option<AlignedBuf>) + Send>,
    ) {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let first = self.read_order(&children, phys, birth).first().copied();
        let Some(c) = first.map(|i| &children[i]).filter(|c| !c.dtl_contains(birth)) else {
            return done(None);
        };
        let (this, leaf) = (self.clone(), c.clone());
        c.queue.submit(IoRequest::read(class, phys, AlignedBuf::for_overwrite(len), Box::new(move |d| match d.into_read() {
            Ok(buf) if verify(&buf) == VerifyResult::Good => done(Some(buf)),
            Ok(_) => {
                leaf.cksum_errors.fetch_add(1, Ordering::Relaxed);
                leaf.ereport(crate::fm::CLASS_CHECKSUM, phys, len as u64, birth, None);
                this.note_suspect(phys, birth, leaf.guid);
                done(None)
            }
            Err(e) => {
                leaf.read_errors.fetch_add(1, Ordering::Relaxed);
                this.note_error(&leaf, &e);
                this.note_suspect(phys, birth, leaf.guid);
                done(None)
            }
        })));
    }

    fn note_suspect(&self, phys: u64, birth: Txg, child: Guid) {
        let mut l = self.suspect_reads.lock();
        if l.len() >= SUSPECT_READS_MAX {
            l.pop_front();
        }
        l.push_back(SuspectRead { phys, birth, child });
    }

    /// `order` with the child whose asynchronous try of this read (this block: offset
    /// and birth, so a stale note never matches a later block in the same place) failed
    /// moved last, and that child's index (its failure is already counted).
    fn suspect_last(&self, children: &[Arc<Leaf>], phys: u64, birth: Txg, mut order: Vec<usize>) -> (Vec<usize>, Option<usize>) {
        let suspect = {
            let mut l = self.suspect_reads.lock();
            match l.iter().rposition(|s| s.phys == phys && s.birth == birth) {
                Some(i) => l.remove(i).map(|s| s.child),
                None => None,
            }
        };
        let Some(at) = suspect.and_then(|g| order.iter().position(|&i| children[i].guid == g)) else {
            return (order, None);
        };
        let i = order.remove(at);
        order.push(i);
        (order, Some(i))
    }

    /// Rewrite a bad copy on `c` from `good`. A failed repair puts the block's birth txg
    /// in `c`'s DTL: `c` is known to miss it, and a resilver retries it.
    fn repair(&self, c: &Leaf, good: &[u8], phys: u64, birth: Txg) -> bool {
        if !c.readable() {
            return false;
        }
        match c.write_blocking(IoClass::AsyncWrite, good, phys, birth) {
            Ok(()) => true,
            Err(e) => {
                c.write_errors.fetch_add(1, Ordering::Relaxed);
                c.write_failed_since_flush.store(true, Ordering::Release);
                c.dtl_add(birth);
                self.note_error(c, &e);
                false
            }
        }
    }

    /// Scrub one block: read every readable child, verify, repair bad copies from a good
    /// one. Children whose DTL covers `birth` are rewritten too when good data exists
    /// (resilver), even when their own copy reads back: a failed flush may have lost
    /// the write while the page cache still serves it (Linux keeps the pages of a
    /// failed fdatasync, clean, and never writes them again), and the resilver clears
    /// the DTL of every block it leaves alone. Left alone, such a copy was gone at the
    /// next power cut while the engine held the child whole and let its sibling be
    /// faulted (crash soak seed 4675065709196258009). OpenZFS's resilver likewise
    /// writes a child whose DTL covers the block without reading it.
    pub fn scrub_block(
        &self,
        offset: u64,
        len: usize,
        birth: Txg,
        verify: &dyn Fn(&[u8]) -> VerifyResult,
    ) -> ScrubOutcome {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let mut good: Option<AlignedBuf> = None;
        let mut bad: Vec<usize> = Vec::new();
        let mut stale: Vec<usize> = Vec::new();
        let mut out = ScrubOutcome::default();
        for (i, c) in children.iter().enumerate() {
            if !c.readable() {
                // offline or faulted now: if it misses this block, the pass did not
                // repair it, and a resilver that finishes after it comes back (a pass
                // resumed after a power cut is not restarted by the online) must keep
                // its DTL
                if c.dtl_contains(birth) {
                    out.unrepaired.push(c.guid);
                }
                continue;
            }
            match c.queue.read_buf(IoClass::Scrub, len, phys) {
                Ok(buf) if verify(&buf) == VerifyResult::Good => {
                    if good.is_none() {
                        good = Some(buf);
                    }
                    // a read proves nothing on a DTL child: see the doc comment
                    if c.dtl_contains(birth) {
                        stale.push(i);
                    }
                }
                Ok(_) => {
                    if !c.dtl_contains(birth) {
                        c.cksum_errors.fetch_add(1, Ordering::Relaxed);
                        c.ereport(crate::fm::CLASS_CHECKSUM, phys, len as u64, birth, None);
                    }
                    bad.push(i);
                }
                Err(e) => {
                    c.read_errors.fetch_add(1, Ordering::Relaxed);
                    self.note_error(c, &e);
                    bad.push(i);
                }
            }
        }
        out.bad_copies = bad.len() as u32;
        match good {
            Some(g) => {
                for i in bad.into_iter().chain(stale) {
                    if self.repair(&children[i], &g, phys, birth) {
                        out.repaired_bytes += len as u64;
                    } else {
                        out.unrepaired.push(children[i].guid);
                    }
                }
            }
            None => {
                out.unrecoverable = true;
                out.unrepaired.extend(bad.iter().map(|&i| children[i].guid));
            }
        }
        out
    }

    /// Flush every online child (each flush waits, in its leaf's queue, for the writes
    /// submitted before it). `done` gets, as `written`, how many children now *hold*
    /// everything written to them since their previous flush: the flush succeeded and
    /// no write failed in between. A child whose flush fails gets every txg it may
    /// have lost in its DTL (see [`Leaf::unflushed`]) and counts toward being faulted.
    pub fn flush_async(self: &Arc<Self>, done: WriteDone) {
        let online: Vec<Arc<Leaf>> = self.children().into_iter().filter(|c| c.readable()).collect();
        if online.is_empty() {
            done(WriteOutcome { written: 0, failed: Vec::new(), len: 0, offset: 0 });
            return;
        }
        let fan = Fanout::new(online.len(), 0, 0, done);
        for c in online {
            let (fan, top, leaf) = (fan.clone(), self.clone(), c.clone());
            c.submit_flush(true, move |result, holds_all| {
                match result {
                    Ok(()) if holds_all => {
                        leaf.note_ok();
                        fan.outcome.lock().written += 1
                    }
                    Ok(()) => {}
                    Err(e) => {
                        leaf.write_errors.fetch_add(1, Ordering::Relaxed);
                        top.note_error(&leaf, &e);
                        fan.outcome.lock().failed.push((leaf.guid, e));
                    }
                }
                fan.child_done();
            });
        }
    }

    /// Blocking flush: Ok if at least one online child holds what was written.
    pub fn flush(self: &Arc<Self>) -> io::Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.flush_async(Box::new(move |o| {
            let _ = tx.send(o);
        }));
        let o = rx.recv().map_err(|_| io::Error::other("mirror flush completion lost"))?;
        if o.written > 0 {
            return Ok(());
        }
        Err(o.failed.into_iter().next().map(|(_, e)| e.to_io()).unwrap_or_else(|| io::Error::other("no device of the vdev holds the writes")))
    }
}

/// Called once with the combined result of a mirror write or flush.
pub type WriteDone = Box<dyn FnOnce(WriteOutcome) + Send>;

/// What a mirror write (or flush) did on its children: errors are values, so a caller
/// can record which child missed which txg.
#[derive(Debug)]
pub struct WriteOutcome {
    /// Children that completed it.
    pub written: u32,
    /// Children that failed it, by guid, with the error.
    pub failed: Vec<(Guid, IoError)>,
    pub len: u64,
    /// Physical offset on the children.
    pub offset: u64,
}

impl WriteOutcome {
    /// Ok if at least one child holds the data (the others are in their DTLs).
    pub fn into_result(self) -> Result<(), IoError> {
        if self.written > 0 {
            return Ok(());
        }
        Err(self.failed.into_iter().next().map(|(_, e)| e).unwrap_or(IoError {
            device: "mirror".into(),
            op: IoOp::Write,
            offset: self.offset,
            len: self.len,
            kind: IoErrorKind::Io,
            errno: Some(libc::ENXIO),
            detail: "no writable device in vdev".into(),
        }))
    }
}

/// Combines the children's completions of one mirror request.
struct Fanout {
    left: AtomicU32,
    outcome: Mutex<WriteOutcome>,
    done: Mutex<Option<WriteDone>>,
}

/// One block of a [`TopVdev::write_blocks_then_flush`]: its data offset, bytes, and
/// the txg a child that misses it gets in its DTL.
pub struct BlockWrite {
    pub offset: u64,
    pub data: Arc<AlignedBuf>,
    pub txg: Txg,
}

/// One child's part of a [`TopVdev::write_blocks_then_flush`]: its writes still
/// outstanding, and whether one failed (then it is not flushed and does not count).
struct ChildRun {
    left: AtomicU32,
    failed: std::sync::atomic::AtomicBool,
}

impl Fanout {
    /// Waits for `children` reports, then calls `done` once with their outcome.
    fn new(children: usize, len: u64, offset: u64, done: WriteDone) -> Arc<Fanout> {
        Arc::new(Fanout {
            left: AtomicU32::new(children as u32),
            outcome: Mutex::new(WriteOutcome { written: 0, failed: Vec::new(), len, offset }),
            done: Mutex::new(Some(done)),
        })
    }

    fn child_done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let o = std::mem::replace(&mut *self.outcome.lock(), WriteOutcome { written: 0, failed: Vec::new(), len: 0, offset: 0 });
            if let Some(done) = self.done.lock().take() {
                done(o);
            }
        }
    }
}

impl Leaf {
    fn queue_name(&self) -> Arc<str> {
        self.spec.display().into()
    }
}

// ---- DTL range sets: sorted, disjoint, non-adjacent inclusive txg ranges ----

/// Insert `lo..=hi` into the range set `d`, merging overlaps and neighbours; beyond
/// [`DTL_MAX_RANGES`] the two ranges with the smallest gap merge (a superset: more
/// resilver, never less).
pub fn range_insert(d: &mut Vec<(Txg, Txg)>, lo: Txg, hi: Txg) {
    debug_assert!(lo <= hi, "DTL range {lo}..={hi} reversed");
    let (lo, hi) = (lo.min(hi), hi.max(lo));
    d.push((lo, hi));
    d.sort_unstable();
    let mut out: Vec<(Txg, Txg)> = Vec::with_capacity(d.len());
    for &(a, b) in d.iter() {
        match out.last_mut() {
            Some(last) if a.get() <= last.1.get().saturating_add(1) => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    while out.len() > DTL_MAX_RANGES {
        let i = (0..out.len() - 1).min_by_key(|&i| out[i + 1].0.since(out[i].1)).unwrap_or(0);
        out[i].1 = out[i + 1].1;
        out.remove(i + 1);
    }
    debug_assert!(out.windows(2).all(|w| w[0].1 < w[1].0), "DTL ranges overlap");
    *d = out;
}

/// The txgs in both range sets.
pub fn range_intersect(a: &[(Txg, Txg)], b: &[(Txg, Txg)]) -> Vec<(Txg, Txg)> {
    let mut out = Vec::new();
    for &(a0, a1) in a {
        for &(b0, b1) in b {
            let (lo, hi) = (a0.max(b0), a1.min(b1));
            if lo <= hi {
                out.push((lo, hi));
            }
        }
    }
    out.sort_unstable();
    out
}

/// The txgs of `a` that are not in `b`.
pub fn range_subtract(a: &[(Txg, Txg)], b: &[(Txg, Txg)]) -> Vec<(Txg, Txg)> {
    let mut out = Vec::new();
    for &(lo, hi) in a {
        let mut cur = lo;
        for &(b0, b1) in b {
            if b1 < cur || b0 > hi {
                continue;
            }
            if b0 > cur {
                out.push((cur, b0.prev()));
            }
            cur = Txg(b1.get().saturating_add(1));
            if cur > hi {
                break;
            }
        }
        if cur <= hi && cur >= lo {
            out.push((cur, hi));
        }
    }
    out
}

/// "5", "5-9", "5-9, 12": ranges as an admin reads them (open ranges say "on").
pub fn ranges_text(r: &[(Txg, Txg)]) -> String {
    r.iter()
        .map(|&(a, b)| if a == b { a.get().to_string() } else if b.get() >= u64::MAX / 4 { format!("{} on", a.get()) } else { format!("{}-{}", a.get(), b.get()) })
        .collect::<Vec<_>>()
        .join(", ")
}

impl TopVdev {
    /// The txgs up to `through` that only `leaf` holds among this vdev's children: the
    /// ones every other child is missing (not readable, or in its DTL) while `leaf`
    /// has them. Removing or offlining `leaf` would lose those txgs' blocks.
    /// `committed(guid)` adds what the committed MOS says a child misses: a resilver
    /// may have cleared a DTL in memory whose repairs are not durable yet.
    /// Cache and spare devices hold no txgs: the pool's blocks are never only there.
    pub fn txgs_only_on(&self, leaf: &Leaf, through: Txg, committed: &dyn Fn(Guid) -> Vec<(Txg, Txg)>) -> Vec<(Txg, Txg)> {
        if matches!(self.role, Role::Cache | Role::Spare) {
            return Vec::new();
        }
        let all = vec![(Txg(1), through)];
        let mut missing_elsewhere = all.clone();
        for c in self.children().iter().filter(|c| c.guid != leaf.guid) {
            let missing_on_c = if c.readable() {
                let mut d = c.dtl();
                for (lo, hi) in committed(c.guid) {
                    range_insert(&mut d, lo, hi);
                }
                d
            } else {
                all.clone()
            };
            missing_elsewhere = range_intersect(&missing_elsewhere, &missing_on_c);
        }
        let held_by_leaf = if leaf.state() == LeafState::Unavail { Vec::new() } else { range_subtract(&all, &leaf.dtl()) };
        range_intersect(&missing_elsewhere, &held_by_leaf)
    }
}

#[cfg(test)]
mod dtl_tests {
    use super::*;

    fn r(v: &[(u64, u64)]) -> Vec<(Txg, Txg)> {
        v.iter().map(|&(a, b)| (Txg(a), Txg(b))).collect()
    }

    #[test]
    fn ranges_merge_subtract_intersect() {
        let mut d = Vec::new();
        range_insert(&mut d, Txg(5), Txg(5));
        range_insert(&mut d, Txg(6), Txg(8));
        range_insert(&mut d, Txg(12), Txg(12));
        assert_eq!(d, r(&[(5, 8), (12, 12)]));
        assert_eq!(range_subtract(&r(&[(1, 20)]), &d), r(&[(1, 4), (9, 11), (13, 20)]));
        assert_eq!(range_intersect(&r(&[(1, 6), (11, 30)]), &d), r(&[(5, 6), (12, 12)]));
        assert_eq!(ranges_text(&d), "5-8, 12");
    }

    fn leaf() -> Leaf {
        let spec = LeafSpec { path: "/mem/a".into(), model: None };
        Leaf::new(Guid(7), spec, Arc::new(crate::vdev::fault::MemDevice::new(1 << 20)), &crate::env::real())
    }

    /// A resilver pass clears only what it set out to repair: not a range added while
    /// it ran (a repair lost to a failed flush, inside the range it repairs), not a
    /// range it never targeted (a device attached meanwhile), not its `lost` record.
    #[test]
    fn resilver_clears_only_its_target_minus_later_additions() {
        let l = leaf();
        l.set_dtl(r(&[(1, 50)]));
        l.begin_dtl_journal();
        let target = l.dtl();
        l.dtl_add_range(Txg(10), Txg(12)); // inside the target: the DTL is unchanged
        assert_eq!(l.dtl(), r(&[(1, 50)]));
        l.dtl_add(Txg(70)); // after the pass started
        l.finish_dtl_journal(&range_intersect(&target, &r(&[(1, 40)])), &r(&[(20, 20)]));
        assert_eq!(l.dtl(), r(&[(10, 12), (20, 20), (41, 50), (70, 70)]));
        // recording stopped: a later addition is not journaled
        l.dtl_add(Txg(80));
        assert!(l.dtl_journal().is_empty());
        // a leaf the pass did not target keeps everything
        let other = leaf();
        other.set_dtl(r(&[(1, 60)]));
        other.begin_dtl_journal();
        other.finish_dtl_journal(&[], &[]);
        assert_eq!(other.dtl(), r(&[(1, 60)]));
    }

    /// A faulted cache or spare device holds no txgs, so import leaves it faulted and
    /// offline is not refused; the only child of a normal or log vdev holds them all.
    #[test]
    fn only_pool_vdevs_hold_txgs() {
        let l = Arc::new(leaf());
        l.set_state(LeafState::Faulted);
        for role in [Role::Normal, Role::Log, Role::Cache, Role::Spare] {
            let top = TopVdev { id: VdevId(0), guid: Guid(10), role, ashift: 12, children: parking_lot::RwLock::new(vec![l.clone()]), suspect_reads: Default::default() };
            let held = top.txgs_required(&l);
            assert_eq!(held.is_empty(), matches!(role, Role::Cache | Role::Spare), "{role:?}: {held:?}");
        }
    }

    #[test]
    fn range_set_is_bounded_and_a_superset() {
        let mut d = Vec::new();
        for i in 0..1000u64 {
            range_insert(&mut d, Txg(i * 10), Txg(i * 10));
        }
        assert!(d.len() <= DTL_MAX_RANGES);
        for i in 0..1000u64 {
            assert!(d.iter().any(|&(a, b)| a.get() <= i * 10 && i * 10 <= b.get()), "txg {} dropped", i * 10);
        }
    }
}

#[cfg(test)]
mod flush_race_tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Device operations in the order the device saw them: a write by its offset when
    /// it completes, a flush (and whether it failed) when it starts.
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Write(u64),
        Flush { failed: bool },
    }

    /// Every third flush fails, as a disk whose write-back fails: Linux drops the dirty
    /// pages of the writes it had not made durable.
    struct OrderDevice {
        ops: Mutex<Vec<Op>>,
        flushes: AtomicU64,
        in_flush: AtomicBool,
        overlapping_flushes: AtomicU64,
    }

    impl Device for OrderDevice {
        fn read_at(&self, buf: &mut [u8], _offset: u64) -> io::Result<()> {
            buf.fill(0);
            Ok(())
        }
        fn write_at(&self, _buf: &[u8], offset: u64) -> io::Result<()> {
            std::hint::spin_loop();
            self.ops.lock().push(Op::Write(offset));
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            if self.in_flush.swap(true, Ordering::AcqRel) {
                self.overlapping_flushes.fetch_add(1, Ordering::Relaxed);
            }
            let failed = self.flushes.fetch_add(1, Ordering::Relaxed) % 3 == 1;
            self.ops.lock().push(Op::Flush { failed });
            std::thread::yield_now();
            self.in_flush.store(false, Ordering::Release);
            if failed {
                Err(io::Error::from_raw_os_error(libc::EIO))
            } else {
                Ok(())
            }
        }
        fn size(&self) -> u64 {
            1 << 40
        }
        fn rotational(&self) -> bool {
            false
        }
        fn kind(&self) -> crate::vdev::DeviceKind {
            crate::vdev::DeviceKind::Memory
        }
    }

    /// A one-child mirror of `leaf` (its writes, repairs and flushes are the leaf's).
    fn mirror_of(leaf: &Arc<Leaf>) -> Arc<TopVdev> {
        Arc::new(TopVdev {
            id: VdevId(0),
            guid: Guid(10),
            role: Role::Normal,
            ashift: 12,
            children: parking_lot::RwLock::new(vec![leaf.clone()]),
            suspect_reads: Default::default(),
        })
    }

    /// Repairs (writes with no flush of their own) racing queued flushes from two
    /// threads and intent-log style write-then-flush runs from a third: every write
    /// that a failed flush may have dropped (the first flush the device started after
    /// the write completed failed) has its birth txg in the DTL. A flush that took the
    /// write's txg off the unflushed range before the write was queued behind it would
    /// leave it out. The device never sees two flushes at once (Linux would report a
    /// failed write-back to only one of them).
    #[test]
    fn every_write_a_failed_flush_may_have_dropped_is_in_the_dtl() {
        let dev = Arc::new(OrderDevice {
            ops: Mutex::new(Vec::new()),
            flushes: AtomicU64::new(0),
            in_flush: AtomicBool::new(false),
            overlapping_flushes: AtomicU64::new(0),
        });
        let spec = LeafSpec { path: "/mem/race".into(), model: None };
        let leaf = Arc::new(Leaf::new(Guid(11), spec, dev.clone(), &crate::env::real()));
        let top = mirror_of(&leaf);
        const WRITES: u64 = 20_000;
        let phys_of = |birth: u64| super::super::label::DATA_START + birth * 4096;
        let stop = Arc::new(AtomicBool::new(false));
        let flushers: Vec<_> = (0..2)
            .map(|_| {
                let (top, stop) = (top.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        let _ = top.flush();
                    }
                })
            })
            .collect();
        let logger = {
            let (top, stop) = (top.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut birth = WRITES;
                while !stop.load(Ordering::Acquire) {
                    birth += 1;
                    let (tx, rx) = crossbeam_channel::bounded(1);
                    let data = Arc::new(AlignedBuf::copy_of(&[9u8; 4096]));
                    let block = BlockWrite { offset: birth * 4096, data, txg: Txg(birth) };
                    top.write_blocks_then_flush(IoClass::SyncWrite, vec![block], true, Box::new(move |o| {
                        let _ = tx.send(o.written);
                    }));
                    rx.recv().unwrap();
                }
            })
        };
        let data = vec![7u8; 4096];
        for birth in 1..=WRITES {
            assert!(top.repair(&leaf, &data, phys_of(birth), Txg(birth)), "the device refuses no write");
        }
        stop.store(true, Ordering::Release);
        flushers.into_iter().for_each(|f| f.join().unwrap());
        logger.join().unwrap();
        assert_eq!(dev.overlapping_flushes.load(Ordering::Relaxed), 0, "two device flushes ran at once");
        let ops = dev.ops.lock().clone();
        let mut exposed = 0;
        for (i, op) in ops.iter().enumerate() {
            let Op::Write(offset) = *op else { continue };
            let next_flush = ops[i + 1..].iter().find_map(|o| match o {
                Op::Flush { failed } => Some(*failed),
                Op::Write(_) => None,
            });
            if next_flush == Some(true) {
                exposed += 1;
                let birth = (offset - super::super::label::DATA_START) / 4096;
                assert!(leaf.dtl_contains(Txg(birth)), "txg {birth} may be lost to a failed flush but is not in the DTL");
            }
        }
        assert!(exposed > 100, "only {exposed} writes met a failed flush: the race was not exercised");
    }

    /// A flush queued behind one that fails proves nothing for the writes it covers:
    /// they may have completed, and been dropped, before the failing flush ran. The
    /// failure puts them in the DTL, and the later flush does not report the leaf whole.
    #[test]
    fn a_failed_flush_takes_the_queued_flushes_births_into_the_dtl() {
        let dev = Arc::new(OrderDevice {
            ops: Mutex::new(Vec::new()),
            flushes: AtomicU64::new(1), // the first flush is the failing one (1 % 3)
            in_flush: AtomicBool::new(false),
            overlapping_flushes: AtomicU64::new(0),
        });
        let spec = LeafSpec { path: "/mem/queued".into(), model: None };
        let leaf = Arc::new(Leaf::new(Guid(12), spec, dev.clone(), &crate::env::real()));
        leaf.queue.set_paused(true);
        let (tx, rx) = crossbeam_channel::unbounded();
        let buf = Arc::new(AlignedBuf::copy_of(&[1u8; 4096]));
        for (birth, name) in [(5u64, "first"), (6, "second")] {
            leaf.submit_write(IoRequest::write(IoClass::AsyncWrite, birth * 4096, buf.clone(), Box::new(|_| {})), &[Txg(birth)]);
            let tx = tx.clone();
            leaf.submit_flush(true, move |r, holds_all| {
                let _ = tx.send((name, r.is_ok(), holds_all));
            });
        }
        leaf.queue.set_paused(false);
        let mut ends: Vec<_> = (0..2).map(|_| rx.recv().unwrap()).collect();
        ends.sort();
        assert_eq!(ends, vec![("first", false, false), ("second", true, false)]);
        assert_eq!(leaf.dtl(), vec![(Txg(5), Txg(6))]);
    }

    /// Writes succeed; the first device flush fails, later ones succeed; a write at
    /// `gated` blocks in the device until `gate` is set.
    struct GateDevice {
        flushes: AtomicU64,
        gated: u64,
        gate: AtomicBool,
    }

    impl Device for GateDevice {
        fn read_at(&self, buf: &mut [u8], _offset: u64) -> io::Result<()> {
            buf.fill(0);
            Ok(())
        }
        fn write_at(&self, _buf: &[u8], offset: u64) -> io::Result<()> {
            while offset == self.gated && !self.gate.load(Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            if self.flushes.fetch_add(1, Ordering::AcqRel) == 0 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            Ok(())
        }
        fn size(&self) -> u64 {
            1 << 40
        }
        fn rotational(&self) -> bool {
            false
        }
        fn kind(&self) -> crate::vdev::DeviceKind {
            crate::vdev::DeviceKind::Memory
        }
    }

    /// An intent-log write-then-flush whose flush (run in the write's completion,
    /// outside the queue) fails drops the pages of every write completed before it.
    /// A queued flush that was waiting at that moment, and that runs (and succeeds:
    /// Linux reported the error once) before the failing one's bookkeeping, must not
    /// report the leaf whole, and its writes must be in the DTL.
    #[test]
    fn a_queued_flush_completing_before_a_failed_log_flush_is_accounted_loses_nothing() {
        let phys_of = |birth: u64| super::super::label::DATA_START + birth * 4096;
        let dev = Arc::new(GateDevice { flushes: AtomicU64::new(0), gated: phys_of(6), gate: AtomicBool::new(false) });
        let spec = LeafSpec { path: "/mem/gate".into(), model: None };
        let leaf = Arc::new(Leaf::new(Guid(13), spec, dev.clone(), &crate::env::real()));
        let top = mirror_of(&leaf);
        let buf = Arc::new(AlignedBuf::copy_of(&[3u8; 4096]));
        // txg 7's write completes: its pages are dirty, unflushed
        leaf.write_blocking(IoClass::AsyncWrite, &[3u8; 4096], phys_of(7), Txg(7)).unwrap();
        // txg 6's write hangs in the device; a flush (covering 6 and 7) queues behind it
        leaf.submit_write(IoRequest::write(IoClass::AsyncWrite, phys_of(6), buf.clone(), Box::new(|_| {})), &[Txg(6)]);
        let (tx, rx) = crossbeam_channel::bounded(1);
        leaf.submit_flush(true, move |r, holds_all| {
            let _ = tx.send((r.is_ok(), holds_all));
        });
        // the intent log writes txg 8 and flushes in the write's completion: the device
        // fails that flush (dropping txg 7's pages); its bookkeeping is held up here
        let dtl_guard = leaf.dtl.lock();
        let block = BlockWrite { offset: 8 * 4096, data: buf.clone(), txg: Txg(8) };
        let (ltx, lrx) = crossbeam_channel::bounded(1);
        top.write_blocks_then_flush(IoClass::SyncWrite, vec![block], true, Box::new(move |o| {
            let _ = ltx.send(o.written);
        }));
        while dev.flushes.load(Ordering::Acquire) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // txg 6's write completes; the queued flush runs, after the failed one, and its
        // completion takes it off the in-flight list
        dev.gate.store(true, Ordering::Release);
        while dev.flushes.load(Ordering::Acquire) < 2 || !leaf.flush_track.lock().in_flight.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(dtl_guard);
        assert_eq!(lrx.recv().unwrap(), 0, "the log's flush failed");
        let (ok, holds_all) = rx.recv().unwrap();
        assert!(ok, "the device failed only the first flush");
        assert!(leaf.dtl_contains(Txg(7)), "txg 7, written before a flush that failed, is not in the DTL: {:?}", leaf.dtl());
        assert!(!holds_all, "a flush that ran after a failed one reported the leaf whole");
    }

    /// A queued flush that fails releases its slot before its completion (its
    /// bookkeeping) runs, and a flush queued after the device reported the failure may
    /// run and complete first, having covered writes that completed before the failed
    /// flush (and were dropped with it). The queue has counted the failure; the leaf has
    /// not accounted for it yet. That flush proves nothing and its writes go in the DTL.
    #[test]
    fn a_flush_queued_after_an_unaccounted_device_failure_proves_nothing() {
        let phys_of = |birth: u64| super::super::label::DATA_START + birth * 4096;
        let dev = Arc::new(GateDevice { flushes: AtomicU64::new(1), gated: 0, gate: AtomicBool::new(true) });
        let spec = LeafSpec { path: "/mem/unaccounted".into(), model: None };
        let leaf = Arc::new(Leaf::new(Guid(14), spec, dev.clone(), &crate::env::real()));
        leaf.write_blocking(IoClass::AsyncWrite, &[3u8; 4096], phys_of(5), Txg(5)).unwrap();
        // a flush in flight before (covering nothing of txg 5) fails on the device:
        // txg 5's pages are dropped; its completion has not run yet
        leaf.queue.note_device_flush_error();
        let (tx, rx) = crossbeam_channel::bounded(1);
        leaf.submit_flush(true, move |r, holds_all| {
            let _ = tx.send((r.is_ok(), holds_all));
        });
        let (ok, holds_all) = rx.recv().unwrap();
        // the failed flush's bookkeeping, late
        leaf.flush_failed(None);
        assert!(ok);
        assert!(leaf.dtl_contains(Txg(5)), "txg 5, dropped by the failed flush, is not in the DTL: {:?}", leaf.dtl());
        assert!(!holds_all, "a flush run before a failure was accounted reported the leaf whole");
        // once accounted, flushes prove their writes again
        leaf.write_blocking(IoClass::AsyncWrite, &[3u8; 4096], phys_of(6), Txg(6)).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        leaf.submit_flush(true, move |r, holds_all| {
            let _ = tx.send((r.is_ok(), holds_all));
        });
        let (ok, _) = rx.recv().unwrap();
        assert!(ok && !leaf.dtl_contains(Txg(6)));
        let (tx, rx) = crossbeam_channel::bounded(1);
        leaf.submit_flush(true, move |r, holds_all| {
            let _ = tx.send((r.is_ok(), holds_all));
        });
        assert_eq!(rx.recv().unwrap(), (true, true), "an accounted failure must not degrade the leaf for ever");
    }
}
