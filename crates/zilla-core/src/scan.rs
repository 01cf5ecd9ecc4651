//! scan: scrub and resilver.
//!
//! Theory of operation
//! -------------------
//! A scan walks every block reachable from the newest committed state — the labels, the
//! MOS blocks, then every volume's tree in blkid order — and hands each block pointer to
//! the mirror code, which reads *every* copy on every readable child (scrub class),
//! verifies it against the pointer's checksum and rewrites bad copies from a good one.
//! A resilver is the same walk restricted to blocks born in some child's DTL (the txgs it
//! missed); subtrees born before the oldest missed txg are skipped whole, because a
//! parent is always at least as new as its children.
//!
//! The walk proceeds one L1 span (1024 blocks) at a time against a fresh snapshot of the
//! volume root, recording a bookmark `(phase, volume id, blkid)` after each span. The
//! bookmark and counters live in the MOS (`scan_state`, JSON), so a paused scrub — or one
//! running when the pool was exported — resumes where it stopped. Starting, pausing
//! and stopping a scrub return only once the txg carrying the new record has synced
//! (`wait_durable`), so a crash right after one of them keeps its effect.
//!
//! A block found bad on every copy is rechecked against the current tree before it is
//! counted: the walk reads a snapshot, and a block freed and reused meanwhile is not an
//! error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::dmu::{self, TreeRoot, VolumeState, EPB};
use crate::zio::PoolIo;
use crate::env::Env;
use crate::kstat::{Applies, Tunable};
use crate::txg::TxgState;
use crate::vdev::mirror::Leaf;
use crate::vdev::IoClass;
use crate::block::blkptr::BlockPointer;
use crate::{BlockId, Error, Result, Txg};

pub static ZFS_SCAN_PAUSE_EVERY_SPANS: Tunable = Tunable::new(
    "zfs_scan_pause_every_spans",
    0,
    0,
    u32::MAX as u64,
    Applies::Live,
    "testing aid: pause the scan after this many L1 spans (0 = never)",
);

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bookmark {
    pub phase: u8,
    pub volume_id: u64,
    pub blkid: BlockId,
}

/// What a scan does. Serialized as "", "scrub", "resilver" (the MOS `scan_state` JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanFunc {
    /// No scan has ever run on this pool.
    #[default]
    #[serde(rename = "")]
    None,
    Scrub,
    Resilver,
}

/// Where a scan is. Serialized as "", "scanning", "paused", "finished", "canceled".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanState {
    /// No scan has ever run.
    #[default]
    #[serde(rename = "")]
    None,
    Scanning,
    Paused,
    Finished,
    Canceled,
}

impl ScanFunc {
    pub fn as_str(self) -> &'static str {
        match self {
            ScanFunc::None => "",
            ScanFunc::Scrub => "scrub",
            ScanFunc::Resilver => "resilver",
        }
    }
}

impl ScanState {
    pub fn as_str(self) -> &'static str {
        match self {
            ScanState::None => "",
            ScanState::Scanning => "scanning",
            ScanState::Paused => "paused",
            ScanState::Finished => "finished",
            ScanState::Canceled => "canceled",
        }
    }
}

/// Compare with the serialized name ("scrub", "paused", ...).
impl PartialEq<&str> for ScanFunc {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<&str> for ScanState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ScanStatus {
    pub func: ScanFunc,
    pub state: ScanState,
    pub start_time_s: u64,
    pub end_time_s: u64,
    /// "Scanned": allocated bytes the walk has found so far (each block pointer's
    /// copies, once each however many mirror children hold them), issued or not.
    pub examined_bytes: u64,
    /// Allocated bytes of the pool's normal vdevs when the scan began (counted as
    /// `examined_bytes` is): what `zpool status` shows as the total.
    pub to_examine_bytes: u64,
    /// "Issued": allocated bytes whose copies were read and verified (every mirror
    /// child read, each block counted once).
    #[serde(default)]
    pub issued_bytes: u64,
    /// Resilver: allocated bytes the walk found but had no need to read (born before
    /// the oldest missed txg). Progress is issued of `to_examine - skipped`.
    #[serde(default)]
    pub skipped_bytes: u64,
    /// When this pass began (the scan's start, its resume after a pause or an
    /// import), and what it scanned and issued since: the rates.
    #[serde(default)]
    pub pass_start_time_s: u64,
    #[serde(default)]
    pub pass_examined_bytes: u64,
    #[serde(default)]
    pub pass_issued_bytes: u64,
    /// When the scrub was paused (state paused).
    #[serde(default)]
    pub pause_time_s: u64,
    /// Rates, percentage and time left, worked out when the status is asked for
    /// ([`status`]) while a scan is in progress or paused; never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ScanProgress>,
    pub repaired_bytes: u64,
    pub errors: u64,
    pub bookmark: Bookmark,
    /// Resilver: the last synced txg when the pass started (DTL entries up to it are
    /// cleared on success; later ones get another pass).
    pub start_txg: Txg,
    pub min_txg: Txg,
    /// Resilver: devices (guids) whose blocks could not all be repaired in the last
    /// pass; their DTLs were kept. Another pass is not tried for them: the admin is
    /// (`zilla pool clear`, `online`, `replace`).
    #[serde(default)]
    pub unrepaired_devices: Vec<crate::Guid>,
    /// Resilver: the pass so far could not read some subtree (which children miss what
    /// under it is unknown): no DTL is cleared when it finishes.
    #[serde(default)]
    pub unrepaired_all: bool,
    /// Resilver: what this pass repairs, per leaf: its DTL when the pass began. Only
    /// these ranges (up to `start_txg`) are cleared when it finishes; a leaf attached
    /// or a DTL grown meanwhile keeps its own for another pass. Stored with the
    /// bookmark, so a pass resumed after a crash clears no more than it covered.
    #[serde(default)]
    pub targets: Vec<ResilverTarget>,
    /// Scrub: `PoolIo::errors_logged` when the scrub began. A finished scrub keeps only
    /// the errors logged since (OpenZFS likewise drops the error log's entries that the
    /// last scrub did not find again). In memory only, as the error log is: a scrub
    /// resumed after a restart begins with an empty log and a mark of 0.
    #[serde(skip)]
    pub errors_logged_at_start: u64,
}

/// A scan's progress as `zpool status` prints it (`print_scan_scrub_resilver_status`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScanProgress {
    /// Bytes scanned and issued per second over this pass (0 while paused).
    pub scan_rate_bytes_per_s: u64,
    pub issue_rate_bytes_per_s: u64,
    /// What issuing is measured against: `to_examine_bytes - skipped_bytes`.
    pub issue_total_bytes: u64,
    /// Issued of `issue_total_bytes`, 0 ..= 100.
    pub percent_done: f64,
    /// Seconds to go at the issue rate; None when zpool gives no estimate (paused,
    /// nothing issued yet, a resilver that repaired nothing yet, or under 10 MiB/s).
    pub seconds_left: Option<u64>,
}

/// The issue rate below which zpool gives no time left.
const ESTIMATE_MIN_RATE_BYTES_PER_S: u64 = 10 << 20;

/// `s`'s progress at `now_s` (zpool's arithmetic: rates over the pass's elapsed
/// seconds, at least 1; done when issued).
pub fn progress(s: &ScanStatus, now_s: u64) -> ScanProgress {
    let elapsed = now_s.saturating_sub(s.pass_start_time_s).max(1);
    let paused = s.state == ScanState::Paused;
    let (scan_rate, issue_rate) = if paused { (0, 0) } else { (s.pass_examined_bytes / elapsed, s.pass_issued_bytes / elapsed) };
    let total = s.to_examine_bytes.saturating_sub(s.skipped_bytes);
    let percent_done = if total == 0 { 100.0 } else { (s.issued_bytes as f64 * 100.0 / total as f64).min(100.0) };
    let started = if s.func == ScanFunc::Resilver { s.repaired_bytes > 0 } else { s.issued_bytes > 0 };
    let seconds_left =
        (!paused && total >= s.issued_bytes && issue_rate >= ESTIMATE_MIN_RATE_BYTES_PER_S && started).then(|| (total - s.issued_bytes) / issue_rate);
    ScanProgress { scan_rate_bytes_per_s: scan_rate, issue_rate_bytes_per_s: issue_rate, issue_total_bytes: total, percent_done, seconds_left }
}

/// One leaf a resilver pass repairs (see [`ScanStatus::targets`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResilverTarget {
    pub guid: crate::Guid,
    /// The leaf's DTL when the pass began.
    pub dtl: Vec<(Txg, Txg)>,
    /// Ranges added to its DTL while the pass ran (a repair lost to a failed flush):
    /// never cleared by this pass.
    #[serde(default)]
    pub lost: Vec<(Txg, Txg)>,
}

/// The resilver targets: every readable leaf with a DTL, except `skip`. Each starts
/// recording its DTL additions.
fn resilver_targets(inner: &Arc<dyn ScanPool>, skip: &[crate::Guid]) -> Vec<ResilverTarget> {
    let mut out = Vec::new();
    for l in inner.leaves().iter().filter(|l| l.readable() && !skip.contains(&l.guid)) {
        l.begin_dtl_journal();
        let dtl = l.dtl();
        if !dtl.is_empty() {
            out.push(ResilverTarget { guid: l.guid, dtl, lost: Vec::new() });
        }
    }
    out
}

/// What a scan sees of its pool: the narrow context spa hands to scan. spa implements
/// it, so scan never names the pool type and the layering points down.
pub trait ScanPool: Send + Sync {
    fn pool_name(&self) -> &str;
    /// Verified reads and mirror repair, the allocator's totals, the error log.
    fn io(&self) -> &PoolIo;
    fn env(&self) -> &dyn Env;
    /// This pool's scan state and thread.
    fn scan(&self) -> &ScanControl;
    fn txg(&self) -> &TxgState;
    /// Root of the committed MOS (its blocks are scanned first).
    fn mos_root(&self) -> BlockPointer;
    /// Every metadata block of the MOS at `root` (format 2: of the dataset objsets too,
    /// but not the volumes' trees).
    fn mos_blocks(&self, root: &BlockPointer, class: IoClass) -> Result<Vec<BlockPointer>>;
    /// The scan record as last stored in the MOS (JSON, empty if none).
    fn saved_scan_state(&self) -> String;
    /// Store the scan record in the MOS with the next sync; `mark_changed` forces one.
    fn save_scan_state(&self, json: String, mark_changed: bool);
    fn volumes(&self) -> Vec<Arc<VolumeState>>;
    fn leaves(&self) -> Vec<Arc<Leaf>>;
    /// Rewrite every leaf's labels (repairs damaged copies; records DTL changes).
    fn rewrite_labels(&self) -> Result<()>;
}

#[derive(Default)]
pub struct ScanControl {
    status: Mutex<ScanStatus>,
    cv: Condvar,
    running: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Serialises starting, pausing and canceling: each is stop, join, set the status,
    /// launch, and two of them interleaved could leave a scan stopped but "scanning".
    control: Mutex<()>,
    /// Set under `control` by export and abandon: no scan starts after them. `online`
    /// and `attach` start their resilver after releasing the pool's sync lock, and one
    /// that began before an export once launched after it, resilvered the released
    /// devices and wrote "active" over their exported labels.
    closed: AtomicBool,
}

impl ScanControl {
    /// Stop for good (export under `control`, abandon).
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

fn now_s(inner: &Arc<dyn ScanPool>) -> u64 {
    inner.env().unix_time_ns() / 1_000_000_000
}

fn persist(inner: &Arc<dyn ScanPool>, mark_changed: bool) {
    let s = inner.scan().status.lock().clone();
    inner.save_scan_state(serde_json::to_string(&s).unwrap_or_default(), mark_changed);
}

/// The scan record, with its progress while a scan is in progress or paused.
pub fn status(inner: &Arc<dyn ScanPool>) -> ScanStatus {
    let mut s = inner.scan().status.lock().clone();
    if s.state == ScanState::Scanning || s.state == ScanState::Paused {
        s.progress = Some(progress(&s, now_s(inner)));
    }
    s
}

/// A scan thread is running (scrub or resilver).
pub fn is_running(inner: &Arc<dyn ScanPool>) -> bool {
    inner.scan().running.load(Ordering::Acquire)
}

pub fn is_resilvering(inner: &Arc<dyn ScanPool>) -> bool {
    let s = inner.scan().status.lock();
    s.func == ScanFunc::Resilver && s.state == ScanState::Scanning
}

fn launch(inner: &Arc<dyn ScanPool>) {
    if inner.scan().running.swap(true, Ordering::AcqRel) {
        return;
    }
    inner.scan().stop.store(false, Ordering::Release);
    {
        // a new pass: the rates count from here
        let mut s = inner.scan().status.lock();
        s.pass_start_time_s = now_s(inner);
        s.pass_examined_bytes = 0;
        s.pass_issued_bytes = 0;
    }
    let i = inner.clone();
    let h = inner.env().spawn(
        format!("scan_{}", inner.pool_name()),
        Box::new(move || {
            let mut r = run(&i);
            let mut passes = 1;
            while passes < MAX_RESILVER_PASSES && r.is_ok() && another_pass(&i) {
                r = run(&i);
                passes += 1;
            }
            if r.is_ok() {
                post_finished(&i);
            }
            if let Err(e) = r {
                tracing::warn!(pool = %i.pool_name(), "scan stopped: {e}");
                let mut s = i.scan().status.lock();
                if s.state == ScanState::Scanning {
                    s.state = ScanState::Paused;
                }
            }
            i.scan().running.store(false, Ordering::Release);
            persist(&i, true);
            i.scan().cv.notify_all();
        }),
    )
    .expect("spawn scan thread");
    *inner.scan().thread.lock() = Some(h);
}

/// Bound on resilver passes in one launch (each pass waits for a txg to sync first); a
/// leaf that keeps missing writes is left DEGRADED with its DTL for the admin.
const MAX_RESILVER_PASSES: u32 = 8;

/// After a finished resilver: if a readable leaf still has DTL entries (txgs that were
/// syncing when the pass started), wait for the next txg to sync and set up another
/// pass over them. Returns false when nothing is left (or the scan was stopped).
fn another_pass(inner: &Arc<dyn ScanPool>) -> bool {
    let (func, state, start_txg) = {
        let s = inner.scan().status.lock();
        (s.func, s.state, s.start_txg)
    };
    let unrepaired = inner.scan().status.lock().unrepaired_devices.clone();
    let remaining: Vec<Txg> =
        inner.leaves().iter().filter(|l| l.readable() && !unrepaired.contains(&l.guid)).flat_map(|l| l.dtl()).map(|r| r.0).collect();
    if func != ScanFunc::Resilver || state != ScanState::Finished || remaining.is_empty() || inner.scan().stop.load(Ordering::Acquire) {
        return false;
    }
    let abort = || inner.scan().stop.load(Ordering::Acquire);
    if !inner.txg().wait_synced_unless(start_txg.next(), &abort) {
        return false;
    }
    let targets = resilver_targets(inner, &unrepaired);
    let mut s = inner.scan().status.lock();
    s.state = ScanState::Scanning;
    s.start_txg = inner.txg().synced_txg();
    s.min_txg = targets.iter().flat_map(|t| t.dtl.iter()).map(|r| r.0).min().unwrap_or(Txg::ZERO);
    s.targets = targets;
    s.unrepaired_all = false;
    s.bookmark = Bookmark::default();
    // a new walk: its progress counts from nothing
    s.to_examine_bytes = allocated_bytes(inner);
    (s.examined_bytes, s.issued_bytes, s.skipped_bytes) = (0, 0, 0);
    (s.pass_start_time_s, s.pass_examined_bytes, s.pass_issued_bytes) = (now_s(inner), 0, 0);
    true
}

fn join(inner: &Arc<dyn ScanPool>) {
    if let Some(h) = inner.scan().thread.lock().take() {
        let _ = h.join();
    }
}

/// Start (or resume a paused) scrub; returns once its start is on disk, so a crash
/// after the command answered resumes it at the next import.
pub fn start_scrub(inner: &Arc<dyn ScanPool>) -> Result<()> {
    let txg = start_scrub_locked(inner)?;
    wait_durable(inner, txg, "the scrub is started")
}

/// Wait until txg `txg`, open when the scan record was saved, has synced: it carries
/// the record (a txg that was syncing then may have encoded the MOS before it), so a
/// crash after this leaves the record on disk, as OpenZFS's scan setup is a sync task.
/// Called without the control lock: a pool whose syncs fail answers at once with an
/// error (the record stays in memory and goes out when the syncs work again), and no
/// other scan command waits behind it.
fn wait_durable(inner: &Arc<dyn ScanPool>, txg: Txg, done: &str) -> Result<()> {
    match inner.txg().wait_synced_or_failed(txg) {
        Ok(()) => Ok(()),
        Err(Error::Shutdown) => Err(Error::Shutdown),
        Err(e) => Err(Error::Io(std::io::Error::other(format!(
            "{done}, but the pool could not record it on disk yet ({e}); it is recorded with the next txg that syncs"
        )))),
    }
}

/// `start_scrub` under the control lock; returns the txg that records the start.
fn start_scrub_locked(inner: &Arc<dyn ScanPool>) -> Result<Txg> {
    let _control = inner.scan().control.lock();
    if inner.scan().is_closed() {
        return Err(Error::Shutdown);
    }
    {
        let mut s = inner.scan().status.lock();
        if s.state == ScanState::Scanning && inner.scan().running.load(Ordering::Acquire) {
            if s.func == ScanFunc::Resilver {
                return Err(Error::Busy("a resilver is in progress".into()));
            }
            return Err(Error::Busy("a scrub is already in progress (pause it with -p, stop it with -s)".into()));
        }
        if s.func == ScanFunc::Resilver && inner.scan().running.load(Ordering::Acquire) {
            // a finished pass whose thread waits for a txg sync before another pass
            // over DTL ranges left (`another_pass`): joining it here would hold the
            // control lock for as long as the pool cannot sync (a suspended pool: for
            // ever), hanging this and every later scan command
            return Err(Error::Busy("a resilver is in progress (another pass waits for a txg sync)".into()));
        }
        if s.state == ScanState::Paused && s.func == ScanFunc::Resilver {
            // A resilver that stopped (an error, a pause between spans) still owns its
            // targets' DTLs: a scrub started over it would forget them, leaving the
            // devices missing txgs until the next import. Resume it instead.
            s.state = ScanState::Scanning;
            drop(s);
            persist(inner, true);
            launch(inner);
            return Err(Error::Busy("a resilver had stopped before it finished: it has been resumed; start the scrub once it finishes".into()));
        }
        if s.state == ScanState::Paused && s.func == ScanFunc::Scrub {
            s.state = ScanState::Scanning;
            post_event(inner, &s, crate::fm::CLASS_SCRUB_RESUME);
        } else {
            *s = ScanStatus {
                func: ScanFunc::Scrub,
                state: ScanState::Scanning,
                start_time_s: now_s(inner),
                to_examine_bytes: allocated_bytes(inner),
                errors_logged_at_start: inner.io().errors_logged(),
                ..Default::default()
            };
            post_event(inner, &s, crate::fm::CLASS_SCRUB_START);
        }
    }
    join(inner);
    persist(inner, true);
    let txg = inner.txg().open_txg();
    launch(inner);
    Ok(txg)
}

pub fn start_resilver(inner: &Arc<dyn ScanPool>) {
    let _control = inner.scan().control.lock();
    if inner.scan().is_closed() {
        return; // exported meanwhile: the DTLs start it again at the next import
    }
    // An online leaf's open-ended DTL range (offline across an export: "missing from
    // offline_since on") ends now; left open it would survive every resilver.
    let open = inner.txg().open_txg();
    for l in inner.leaves().iter().filter(|l| l.readable()) {
        let d = l.dtl();
        if d.iter().any(|r| r.1 > open) {
            l.set_dtl(d.into_iter().map(|(a, b)| (a, b.min(open))).collect());
        }
    }
    // Nothing is missing: a start asked for by a sync that saw a DTL grow may arrive
    // after the resilver that repaired it finished, and must not start another (an
    // admin's scrub right after that resilver would find the pool busy).
    if !inner.leaves().iter().any(|l| l.readable() && !l.dtl_empty()) {
        return;
    }
    if inner.scan().running.load(Ordering::Acquire) {
        // restart as a resilver: resilver takes priority over a scrub
        inner.scan().stop.store(true, Ordering::Release);
        join(inner);
    }
    {
        // a scrub that the resilver replaces ends as zfs ends it (dsl_scan_done): aborted
        let s = inner.scan().status.lock();
        if s.func == ScanFunc::Scrub && matches!(s.state, ScanState::Scanning | ScanState::Paused) {
            post_event(inner, &s, crate::fm::CLASS_SCRUB_ABORT);
        }
    }
    let targets = resilver_targets(inner, &[]);
    let min_txg = targets.iter().flat_map(|t| t.dtl.iter()).map(|r| r.0).min().unwrap_or(Txg::ZERO);
    {
        let mut s = inner.scan().status.lock();
        *s = ScanStatus {
            func: ScanFunc::Resilver,
            state: ScanState::Scanning,
            start_time_s: now_s(inner),
            to_examine_bytes: allocated_bytes(inner),
            // The last txg whose blocks the walk is sure to see (committed trees). A txg
            // syncing now may have skipped the leaf and commit behind the walk: its DTL
            // entry stays and the resilver runs another pass (see `another_pass`).
            start_txg: inner.txg().synced_txg(),
            min_txg,
            targets,
            ..Default::default()
        };
        post_event(inner, &s, crate::fm::CLASS_RESILVER_START);
    }
    persist(inner, true);
    launch(inner);
}

/// A leaf left the pool (detach): a resilver none of whose targets is still in the
/// pool has nothing left to write and ends now, as finished (with its event), instead of
/// reading the whole pool for nobody.
pub fn leaf_detached(inner: &Arc<dyn ScanPool>) {
    let _control = inner.scan().control.lock();
    let leaves = inner.leaves();
    {
        let s = inner.scan().status.lock();
        let kept = s.targets.iter().any(|t| leaves.iter().any(|l| l.guid == t.guid));
        if s.func != ScanFunc::Resilver || !matches!(s.state, ScanState::Scanning | ScanState::Paused) || kept {
            return;
        }
    }
    inner.scan().stop.store(true, Ordering::Release);
    join(inner);
    {
        let mut s = inner.scan().status.lock();
        s.state = ScanState::Finished;
        s.end_time_s = now_s(inner);
        s.bookmark = Bookmark::default();
        s.targets.clear();
        post_event(inner, &s, crate::fm::CLASS_RESILVER_FINISH);
    }
    tracing::info!(pool = %inner.pool_name(), "the resilver's devices were detached: it ends");
    persist(inner, true);
}

/// Post a scan event (fm.rs) with the scan's counters as `s` has them.
fn post_event(inner: &Arc<dyn ScanPool>, s: &ScanStatus, class: &str) {
    let mut e = crate::fm::Event::new(class).pool(inner.pool_name()).str("scan_func", s.func.as_str());
    if matches!(class, crate::fm::CLASS_SCRUB_FINISH | crate::fm::CLASS_RESILVER_FINISH | crate::fm::CLASS_SCRUB_ABORT) {
        e = e.u64("scan_examined", s.examined_bytes).u64("scan_repaired", s.repaired_bytes).u64("scan_errors", s.errors);
    }
    crate::fm::post(e);
}

/// Pause the scrub; returns once the pause is on disk (see `wait_durable`).
pub fn pause(inner: &Arc<dyn ScanPool>) -> Result<()> {
    let txg = pause_locked(inner)?;
    wait_durable(inner, txg, "the scrub is paused")
}

fn pause_locked(inner: &Arc<dyn ScanPool>) -> Result<Txg> {
    let _control = inner.scan().control.lock();
    {
        let s = inner.scan().status.lock();
        if s.state != ScanState::Scanning {
            return Err(Error::invalid("there is no active scrub"));
        }
        if s.func == ScanFunc::Resilver {
            return Err(Error::invalid("a resilver cannot be paused"));
        }
    }
    inner.scan().stop.store(true, Ordering::Release);
    join(inner);
    {
        let mut s = inner.scan().status.lock();
        s.state = ScanState::Paused;
        s.pause_time_s = now_s(inner);
        post_event(inner, &s, crate::fm::CLASS_SCRUB_PAUSED);
    }
    persist(inner, true);
    Ok(inner.txg().open_txg())
}

/// Cancel the scrub; returns once that is on disk (see `wait_durable`).
pub fn cancel(inner: &Arc<dyn ScanPool>) -> Result<()> {
    let txg = cancel_locked(inner)?;
    wait_durable(inner, txg, "the scrub is canceled")
}

fn cancel_locked(inner: &Arc<dyn ScanPool>) -> Result<Txg> {
    let _control = inner.scan().control.lock();
    {
        let s = inner.scan().status.lock();
        if s.state != ScanState::Scanning && s.state != ScanState::Paused {
            return Err(Error::invalid("there is no active scrub"));
        }
        if s.func == ScanFunc::Resilver {
            return Err(Error::invalid("a resilver cannot be canceled"));
        }
    }
    inner.scan().stop.store(true, Ordering::Release);
    join(inner);
    {
        let mut s = inner.scan().status.lock();
        s.state = ScanState::Canceled;
        s.end_time_s = now_s(inner);
        post_event(inner, &s, crate::fm::CLASS_SCRUB_ABORT);
    }
    persist(inner, true);
    Ok(inner.txg().open_txg())
}

/// Block until no scan is running.
/// Wait until no scan runs. A resilver restarted under the control lock (to take a new
/// target) is not running for a moment between its two threads: the wait ends only when
/// no scan runs with the control lock free, so the caller's next command does not meet
/// the restarted one.
pub fn wait(inner: &Arc<dyn ScanPool>) {
    loop {
        {
            let mut s = inner.scan().status.lock();
            while inner.scan().running.load(Ordering::Acquire) {
                crate::env::wait_ns(inner.env(), &inner.scan().cv, &mut s, 100_000_000);
            }
        }
        let _control = inner.scan().control.lock();
        if !inner.scan().running.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Export: stop a running scan, keeping it resumable (state stays "scanning" on disk).
pub fn pause_for_export(inner: &Arc<dyn ScanPool>) {
    let _control = inner.scan().control.lock();
    inner.scan().close();
    if inner.scan().running.load(Ordering::Acquire) {
        inner.scan().stop.store(true, Ordering::Release);
        join(inner);
        inner.scan().status.lock().state = ScanState::Scanning;
        persist(inner, true);
    }
}

pub fn stop(inner: &Arc<dyn ScanPool>) {
    // not under `control`: abandon (a simulated crash) must not wait for a start in
    // progress; a scan launched after this is stopped by the pool's shutdown
    inner.scan().close();
    inner.scan().stop.store(true, Ordering::Release);
    join(inner);
}

pub fn resume_after_import(inner: &Arc<dyn ScanPool>) {
    let json = inner.saved_scan_state();
    if json.is_empty() {
        return;
    }
    if let Ok(s) = serde_json::from_str::<ScanStatus>(&json) {
        let resume = s.state == ScanState::Scanning;
        if resume && s.func == ScanFunc::Resilver {
            // DTL additions since the crash are recorded from now on; those before it
            // are in `lost` (stored with each bookmark)
            for l in inner.leaves().iter().filter(|l| s.targets.iter().any(|t| t.guid == l.guid)) {
                l.begin_dtl_journal();
            }
        }
        *inner.scan().status.lock() = s;
        if resume {
            launch(inner);
        }
    }
}

/// What a scan walks: the allocated bytes of the normal top-level vdevs, each block
/// once however many mirror children hold it (what `zpool list` shows as ALLOC), so
/// progress ends at 100 % on a single disk and an n-way mirror alike.
fn allocated_bytes(inner: &Arc<dyn ScanPool>) -> u64 {
    inner.io().ms.space(crate::vdev::Role::Normal).1
}

/// The allocated bytes of `bp`'s copies (each DVA's asize).
fn bp_bytes(bp: &BlockPointer) -> u64 {
    bp.copies().map(|d| d.asize as u64).sum()
}

/// The walk found `bp` (`skipped`: it needs no reading).
fn count_scanned(inner: &Arc<dyn ScanPool>, bp: &BlockPointer, skipped: bool) {
    let n = bp_bytes(bp);
    let mut s = inner.scan().status.lock();
    s.examined_bytes += n;
    s.pass_examined_bytes += n;
    if skipped {
        s.skipped_bytes += n;
    }
}

/// Leaves a resilver pass could not fully repair: their DTLs stay. `all` when a
/// subtree could not be read at all (which children miss what under it is unknown).
#[derive(Default)]
struct Unrepaired {
    leaves: std::collections::HashSet<crate::Guid>,
    all: bool,
}

/// Scrub one block pointer on every copy; returns false if it is unrecoverable.
/// Children whose bad copy could not be rewritten go into `unrepaired`.
fn scrub_bp(inner: &Arc<dyn ScanPool>, bp: &BlockPointer, unrepaired: &mut Unrepaired) -> bool {
    let mut ok_somewhere = false;
    let mut any = false;
    let mut lost = Vec::new();
    for dva in bp.copies() {
        let Some(tvd) = inner.io().top(dva.vdev) else { continue };
        any = true;
        let verify = |b: &[u8]| crate::zio::verify_copy(bp, b);
        let o = tvd.scrub_block(dva.offset, dva.asize as usize, bp.birth, &verify);
        unrepaired.leaves.extend(o.unrepaired.iter().copied());
        let mut s = inner.scan().status.lock();
        s.issued_bytes += dva.asize as u64;
        s.pass_issued_bytes += dva.asize as u64;
        s.repaired_bytes += o.repaired_bytes;
        drop(s);
        if o.repaired_bytes > 0 {
            inner.io().errors.self_healed_bytes.fetch_add(o.repaired_bytes, Ordering::Relaxed);
        }
        if !o.unrecoverable {
            ok_somewhere = true;
        } else {
            lost.push((tvd, *dva));
        }
    }
    if ok_somewhere && !lost.is_empty() {
        repair_ditto(inner, bp, &lost);
    }
    ok_somewhere || !any
}

/// Some DVAs of `bp` are bad on every child of their mirror but another DVA is good:
/// rewrite the bad DVAs from a good copy (every DVA holds the same physical bytes).
fn repair_ditto(inner: &Arc<dyn ScanPool>, bp: &BlockPointer, lost: &[(Arc<crate::vdev::mirror::TopVdev>, crate::block::blkptr::Dva)]) {
    let verify = |b: &[u8]| crate::zio::verify_copy(bp, b);
    let good = bp.copies().filter(|d| !lost.iter().any(|(_, l)| l == *d)).find_map(|d| {
        let tvd = inner.io().top(d.vdev)?;
        tvd.read_verified(IoClass::Scrub, d.offset, d.asize as usize, bp.birth, &verify, &crate::vdev::mirror::repair_always).ok()
    });
    let Some(good) = good else { return };
    for (tvd, d) in lost {
        if good.data.len() != d.asize as usize {
            continue;
        }
        if tvd.write(IoClass::AsyncWrite, &good.data, d.offset, bp.birth).is_ok() {
            let n = d.asize as u64 * tvd.children().iter().filter(|c| c.readable()).count() as u64;
            inner.scan().status.lock().repaired_bytes += n;
            inner.io().errors.self_healed_bytes.fetch_add(n, Ordering::Relaxed);
        }
    }
}

fn check_labels(inner: &Arc<dyn ScanPool>) {
    let mut bad = 0;
    for leaf in inner.leaves().iter() {
        if !leaf.readable() {
            continue;
        }
        match crate::vdev::label::scan_labels(&**leaf.device()) {
            Ok(s) => bad += s.bad_labels,
            Err(_) => bad += crate::vdev::label::LABELS,
        }
    }
    if bad > 0 {
        tracing::info!(pool = %inner.pool_name(), bad, "scrub: rewriting damaged labels");
        if inner.rewrite_labels().is_ok() {
            inner.scan().status.lock().repaired_bytes += bad as u64 * crate::vdev::label::CONFIG_REGION_SIZE as u64;
        }
    }
}

fn run(inner: &Arc<dyn ScanPool>) -> Result<()> {
    let (func, min_txg) = {
        let s = inner.scan().status.lock();
        (s.func, s.min_txg)
    };
    let resilver = func == ScanFunc::Resilver;
    let stop = || inner.scan().stop.load(Ordering::Acquire) || inner.txg().is_shutting_down();
    let mut spans = 0u64;
    let pause_every = ZFS_SCAN_PAUSE_EVERY_SPANS.get();
    let (mut bm, mut unrepaired) = {
        // a pass resumed after a crash keeps what its first part could not repair
        let s = inner.scan().status.lock();
        (s.bookmark.clone(), Unrepaired { leaves: s.unrepaired_devices.iter().copied().collect(), all: s.unrepaired_all })
    };
    if bm.phase == 0 {
        if !resilver {
            check_labels(inner);
        }
        scan_mos(inner, resilver, min_txg, &mut unrepaired)?;
        bm = Bookmark { phase: 1, volume_id: 0, blkid: BlockId(0) };
        inner.scan().status.lock().bookmark = bm.clone();
    }
    let mut vols: Vec<_> = inner.volumes();
    vols.sort_by_key(|v| v.id);
    for v in vols {
        if v.id < bm.volume_id {
            continue;
        }
        let mut blk = if v.id == bm.volume_id { bm.blkid } else { BlockId(0) };
        let end = BlockId(v.nblocks());
        while blk < end {
            if stop() {
                return Ok(());
            }
            let last = blk.span_end(BlockId(end.get() - 1));
            // the pin keeps every block of this root where it is while the span's
            // repairs are written (a block freed meanwhile is not reused)
            let pin = inner.io().ms.pin_frees(|| inner.txg().synced_txg());
            let root: TreeRoot = *v.committed.read();
            let mut bad: Vec<(BlockId, BlockPointer)> = Vec::new();
            walk_span(inner, &root, blk, last, if resilver { min_txg } else { Txg::ZERO }, &mut bad, &mut unrepaired)?;
            drop(pin);
            count_bad_blocks(inner, &v, bad);
            blk = last.next();
            {
                let mut s = inner.scan().status.lock();
                s.bookmark = Bookmark { phase: 1, volume_id: v.id, blkid: blk };
                if resilver {
                    note_unrepaired(inner, &mut s, &unrepaired);
                }
            }
            persist(inner, false);
            spans += 1;
            if pause_every > 0 && spans % pause_every == 0 {
                inner.scan().stop.store(true, Ordering::Release);
                inner.scan().status.lock().state = ScanState::Paused;
                return Ok(());
            }
        }
    }
    finish_pass(inner, resilver, &unrepaired);
    Ok(())
}

/// A pass read everything: it is finished; a resilver clears the DTLs it repaired, a
/// scrub keeps only the errors found since it began.
fn finish_pass(inner: &Arc<dyn ScanPool>, resilver: bool, unrepaired: &Unrepaired) {
    let errors_mark = {
        let mut s = inner.scan().status.lock();
        s.state = ScanState::Finished;
        s.end_time_s = now_s(inner);
        s.bookmark = Bookmark::default();
        s.errors_logged_at_start
    };
    if resilver {
        finish_resilver(inner, unrepaired);
    } else {
        inner.io().keep_errors_since(errors_mark);
    }
}

/// The scan thread's passes ended: a finished scan posts its end (a resilver once, after
/// its last pass; a paused or canceled one posted that already).
fn post_finished(inner: &Arc<dyn ScanPool>) {
    let s = inner.scan().status.lock();
    if s.state == ScanState::Finished {
        let class = if s.func == ScanFunc::Resilver { crate::fm::CLASS_RESILVER_FINISH } else { crate::fm::CLASS_SCRUB_FINISH };
        post_event(inner, &s, class);
    }
}

/// Count the blocks of a span found bad on every copy, rechecked against the current
/// tree: a block freed meanwhile is not an error.
fn count_bad_blocks(inner: &Arc<dyn ScanPool>, v: &VolumeState, bad: Vec<(BlockId, BlockPointer)>) {
    for (blkid, bp) in bad {
        let cur = *v.committed.read();
        if let Ok(now) = dmu::lookup(inner.io(), &cur, blkid, IoClass::Scrub) {
            if now == bp && !v.destroyed.load(Ordering::Acquire) {
                inner.scan().status.lock().errors += 1;
                inner.io().log_error(&bp, format!("{}/{} block {blkid} (birth {})", inner.pool_name(), v.name, bp.birth));
            }
        }
    }
}

/// Scan the MOS blocks (phase 0).
fn scan_mos(inner: &Arc<dyn ScanPool>, resilver: bool, min_txg: Txg, unrepaired: &mut Unrepaired) -> Result<()> {
    let mos_root = inner.mos_root();
    if !mos_root.is_hole() {
        let _pin = inner.io().ms.pin_frees(|| inner.txg().synced_txg());
        for bp in inner.mos_blocks(&mos_root, IoClass::Scrub)? {
            let needed = !resilver || bp.birth >= min_txg;
            count_scanned(inner, &bp, !needed);
            if needed && !scrub_bp(inner, &bp, unrepaired) {
                inner.scan().status.lock().errors += 1;
            }
        }
    }
    Ok(())
}

/// Store with the bookmark what the pass could not repair so far: the leaves, and each
/// target's DTL additions since the pass began.
fn note_unrepaired(inner: &Arc<dyn ScanPool>, s: &mut ScanStatus, unrepaired: &Unrepaired) {
    s.unrepaired_devices = unrepaired.leaves.iter().copied().collect();
    s.unrepaired_all = unrepaired.all;
    let leaves = inner.leaves();
    for t in s.targets.iter_mut() {
        if let Some(l) = leaves.iter().find(|l| l.guid == t.guid) {
            for (lo, hi) in l.dtl_journal() {
                crate::vdev::mirror::range_insert(&mut t.lost, lo, hi);
            }
        }
    }
}

/// A resilver pass finished: on every readable leaf it fully repaired, clear the DTL
/// ranges it set out to repair (its target's, up to `start_txg`) except those added
/// while it ran; keep the others' and say so.
fn finish_resilver(inner: &Arc<dyn ScanPool>, unrepaired: &Unrepaired) {
    let (start_txg, targets) = {
        let s = inner.scan().status.lock();
        (s.start_txg, s.targets.clone())
    };
    if unrepaired.all {
        tracing::warn!(pool = %inner.pool_name(), "resilver could not read part of the pool: every DTL is kept");
    }
    inner.scan().status.lock().unrepaired_devices = if unrepaired.all {
        inner.leaves().iter().filter(|l| !l.dtl_empty()).map(|l| l.guid).collect()
    } else {
        unrepaired.leaves.iter().copied().collect()
    };
    for l in inner.leaves().iter() {
        // an unreadable leaf (missing, offline, the old half of a replace) keeps its DTL
        // by design: only a leaf the resilver meant to repair is worth a warning
        if unrepaired.leaves.contains(&l.guid) && l.readable() {
            tracing::warn!(pool = %inner.pool_name(), device = %l.spec.shown(), "resilver could not repair every block on this device: its DTL is kept");
        }
        match targets.iter().find(|t| t.guid == l.guid) {
            Some(t) if l.readable() && !unrepaired.all && !unrepaired.leaves.contains(&l.guid) => {
                let repaired = crate::vdev::mirror::range_intersect(&t.dtl, &[(Txg(1), start_txg)]);
                l.finish_dtl_journal(&repaired, &t.lost);
            }
            _ => l.finish_dtl_journal(&[], &[]), // clears nothing, stops recording
        }
    }
    let _ = inner.rewrite_labels();
}

/// One span's walk (`walk_span`).
struct Walk<'a> {
    inner: &'a Arc<dyn ScanPool>,
    first: u64,
    last: u64,
    min_txg: Txg,
    /// The tree's top level (its root's).
    top: u32,
    bad: &'a mut Vec<(BlockId, BlockPointer)>,
    unrepaired: &'a mut Unrepaired,
}

impl Walk<'_> {
    /// The walk reached `bp` (level `level`, first block `base`): counted as scanned
    /// if it was found now (an indirect in the first span it covers, an L0 root; other
    /// L0s were counted when their L1 was read, ahead of their reads). Whether it
    /// needs reading (born at or after `min_txg`).
    fn found(&self, bp: &BlockPointer, level: u32, base: u64) -> bool {
        let needed = bp.birth >= self.min_txg;
        if (level > 0 && base >= self.first) || (level == 0 && self.top == 0) {
            count_scanned(self.inner, bp, !needed);
        }
        needed
    }

    /// An L1 was read: its L0s are found (scanned before they are issued).
    fn found_l0s<'b>(&self, kids: impl Iterator<Item = &'b BlockPointer>) {
        for c in kids.filter(|c| !c.is_hole()) {
            count_scanned(self.inner, c, c.birth < self.min_txg);
        }
    }
}

/// Scrub every block of `[first, last]` (indirects included) born at or after
/// `min_txg`. An indirect block no copy of which reads back is an error, and its
/// subtree is unrepaired (`unrepaired.all`): nothing under it was examined.
fn walk_span(
    inner: &Arc<dyn ScanPool>,
    root: &TreeRoot,
    first: BlockId,
    last: BlockId,
    min_txg: Txg,
    bad: &mut Vec<(BlockId, BlockPointer)>,
    unrepaired: &mut Unrepaired,
) -> Result<()> {
    let top = root.nlevels as u32 - 1;
    let mut w = Walk { inner, first: first.get(), last: last.get(), min_txg, top, bad, unrepaired };
    return rec(&mut w, &root.bp, top, 0);

    fn rec(w: &mut Walk<'_>, bp: &BlockPointer, level: u32, base: u64) -> Result<()> {
        let (inner, first, last) = (w.inner, w.first, w.last);
        if bp.is_hole() || !w.found(bp, level, base) {
            return Ok(());
        }
        // an indirect is scrubbed in the first span it covers; L0s in their own span
        if (level == 0 || base >= first) && !scrub_bp(inner, bp, w.unrepaired) {
            if level == 0 {
                w.bad.push((BlockId(base), *bp));
            } else {
                inner.scan().status.lock().errors += 1;
                w.unrepaired.all = true;
            }
            return Ok(());
        }
        if level == 0 {
            return Ok(());
        }
        let span = EPB.pow(level - 1);
        let ind = match dmu::read_indirect(inner.io(), bp, IoClass::Scrub) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(pool = %inner.pool_name(), "scan: indirect block (birth {}) unreadable, its subtree is not examined: {e}", bp.birth);
                inner.scan().status.lock().errors += 1;
                w.unrepaired.all = true;
                return Ok(());
            }
        };
        let lo = first.saturating_sub(base) / span;
        let hi = ((last - base) / span).min(EPB - 1);
        let kids: Vec<_> = (lo..=hi).map(|idx| (idx, dmu::tree_child(&ind, idx, level - 1, bp.birth))).collect();
        if level == 1 {
            w.found_l0s(kids.iter().filter_map(|(_, c)| c.as_ref().ok()));
        }
        for (idx, c) in kids {
            let Ok(c) = c else {
                inner.scan().status.lock().errors += 1;
                w.unrepaired.all = true;
                continue;
            };
            rec(w, &c, level - 1, base + idx * span)?;
        }
        Ok(())
    }
}

