//! spa: the storage pool — create, import, export, destroy, config changes, status.
//!
//! Theory of operation
//! -------------------
//! `Pool` is the handle the daemon holds; [`PoolInner`] is the pool state it shares
//! (`Arc`) with every open volume and the background threads (txg sync, scan). The sync
//! thread is the only writer of the committed state (volume roots, MOS, uberblocks); open
//! context only adds dirty records.
//!
//! Creating a pool writes labels with the config to every leaf and syncs an initial txg
//! (empty MOS), so a pool exists on disk exactly when an uberblock for it is durable.
//! Importing scans the labels of the given devices, groups them by pool guid, takes the
//! config with the highest config txg, checks that every top-level vdev has at least one
//! readable child, then loads the MOS from the newest uberblock whose tree reads back
//! (falling back to older uberblocks in the ring if the newest is damaged).
//!
//! ```text
//!  mod.rs     Pool handle, PoolInner, volumes (create/destroy/props), lifecycle
//!  config.rs  on-label config (PoolConfig), label writes, add/attach/detach/online/...
//!  import.rs  create, find importable pools, import (label scan, uberblock choice)
//!  sync.rs    spa_sync: the txg commit protocol, and the sync thread
//!  status.rs  structured status, list, iostat, pool properties
//!  verify.rs  zdb-style space accounting check (tests)
//!  trim.rs    the manual trim (zpool trim): a pass over the free space, in the syncs
//! ```
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::dmu::{self, TreeRoot, VolumeState};
use crate::zio::PoolIo;
use crate::dsl_pool::DirtyAccounting;
use crate::env::Env;
use crate::props::PropRow;
use crate::txg::TxgState;
use crate::vdev::label;
use crate::vdev::mirror::{Leaf, LeafState, TopVdev};
use crate::vdev::{LeafSpec, Role};
use crate::block::blkptr::BlockPointer;
use crate::scan::ScanPool;
use crate::zvol::{BlockVolume, VolumePool};
use crate::{Error, Guid, Result, Txg};

mod config;
mod dataset;
mod format2;
pub use dataset::{compressratio, max_volsize, CREATION_PROP};
mod import;
mod mmp;
mod replay;
mod status;
mod stale;
mod sync;
mod verify;
pub mod trim;

pub use config::{default_opener, AutoreplaceOutcome, LabelJson, LeafConfig, Opener, PoolConfig, TopConfig};
pub use config::{is_unsafe_char, parse_label, printable, printable_text, push_printable_char, validate_label};
pub use import::{ImportOptions, ImportScan, ImportablePool, RewindPlan, UnusableLabel, REWIND_MAX_TXGS};
pub use mmp::ZFS_MULTIHOST_INTERVAL_MS;
pub use status::{IostatNode, IostatSnapshot, PoolHealth, PoolListRow, PoolStatus, VdevStatus, VolumeInfo};
pub use format2::ZILLA_POOL_CREATE_FORMAT;
pub use sync::{SYNC_CHUNK_BLOCKS, ZFS_DEBUG_FAIL_SYNC_ASSERTION};

/// One top-level vdev as the user asked for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopSpec {
    pub role: Role,
    pub mirror: bool,
    pub leaves: Vec<LeafSpec>,
}

#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    pub force: bool,
    pub ashift: Option<u8>,
    /// Pool properties (-o name=value): ashift, autoreplace, failmode.
    pub props: Vec<(String, String)>,
    /// Clock, sleeps, threads and randomness; None = the real world (`env::real()`).
    pub env: Option<Arc<dyn Env>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubCmd {
    Start,
    Pause,
    Stop,
}

/// What `zilla pool wait -t` waits for (zpool wait's activities that Zilla has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activity {
    /// A scrub scanning (a paused one is not in progress, as in zpool wait).
    Scrub,
    /// A resilver (every pass).
    Resilver,
    /// A `replace` not yet finished: resilvered, and the old device detached.
    Replace,
    /// A manual trim.
    Trim,
}

impl Activity {
    pub const ALL: [Activity; 4] = [Activity::Replace, Activity::Resilver, Activity::Scrub, Activity::Trim];

    /// The name `-t` takes, or why it is refused (zpool's message, with the list).
    pub fn parse(s: &str) -> Result<Activity> {
        match s {
            "scrub" => Ok(Activity::Scrub),
            "resilver" => Ok(Activity::Resilver),
            "replace" => Ok(Activity::Replace),
            "trim" => Ok(Activity::Trim),
            _ => Err(Error::invalid(format!("invalid activity '{s}'; valid activities: replace, resilver, scrub, trim"))),
        }
    }
}

pub const POOL_VERSION: u64 = 1;

/// How long `Pool::sync` (every admin command that changes the pool) waits on a
/// suspended pool's retries before it answers that the pool is suspended.
pub const SUSPENDED_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
pub const MAX_VOLBLOCKSIZE: u32 = 128 << 10;
pub const MIN_VOLBLOCKSIZE: u32 = 4096;

pub fn validate_pool_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.chars().next().map_or(false, |c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if !ok {
        let shown: String = name.chars().take(100).collect();
        let cut = if name.chars().nth(100).is_some() { "...(truncated)" } else { "" };
        return Err(Error::invalid(format!(
            "invalid pool name '{shown}{cut}': must begin with a letter and contain only letters, digits, '_', '-', '.', ':'"
        )));
    }
    if ["mirror", "raidz", "draid", "spare", "log", "cache"].iter().any(|r| name.starts_with(r)) {
        return Err(Error::invalid(format!("invalid pool name '{name}': name is reserved")));
    }
    Ok(())
}

/// A volume name: letters, digits, `_-.:`, at most 200 bytes; not `.` or `..` (they
/// read as path components) and not starting with `-` (it reads as an option).
pub fn validate_volume_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if !ok {
        let shown: String = name.chars().take(100).collect();
        let cut = if name.chars().nth(100).is_some() { "...(truncated)" } else { "" };
        return Err(Error::invalid(format!(
            "invalid volume name '{shown}{cut}': use letters, digits, '_', '-', '.', ':' (no '/')"
        )));
    }
    if name == "." || name == ".." {
        return Err(Error::invalid(format!("invalid volume name '{name}': '.' and '..' are reserved")));
    }
    if name.starts_with('-') {
        return Err(Error::invalid(format!("invalid volume name '{name}': must not begin with '-'")));
    }
    Ok(())
}

/// MOS fields that are not volumes.
pub(crate) struct MosMeta {
    pub next_volume_id: u64,
    pub mos_root: BlockPointer,
    /// Roots of destroyed volumes whose blocks are freed in the next sync.
    pub doomed: Vec<TreeRoot>,
    pub scan_state: String,
    /// Something in the MOS changed (props, volumes) even if no data is dirty.
    pub changed: bool,
    /// Leaf health (DTLs, faults) as the committed MOS records it.
    pub health: Vec<crate::dmu::LeafHealth>,
    /// The command history (spa_history.rs), written with every MOS.
    pub history: crate::spa_history::History,
    /// A format 2 pool's MOS (spa/format2.rs); `None`: format 1.
    pub format2: Option<Arc<format2::Format2>>,
}

pub(crate) struct PoolInner {
    name: String,
    guid: Guid,
    io: PoolIo,
    txg: TxgState,
    dirty: DirtyAccounting,
    config: Mutex<PoolConfig>,
    leaves: RwLock<Vec<Arc<Leaf>>>,
    volumes: RwLock<BTreeMap<String, Arc<VolumeState>>>,
    meta: Mutex<MosMeta>,
    /// Serialises syncs with config changes (attach/detach/add/online/offline).
    sync_lock: Mutex<()>,
    /// Serialises label writes (each config txg is written once, increasing).
    config_write_lock: Mutex<()>,
    /// The last config write failed: the labels may hold a config other than the live
    /// one (the new one in some copies, an undone one). The next sync writes them
    /// before its uberblock, which carries the live guid sum (spa/config.rs).
    labels_stale: AtomicBool,
    opener: Opener,
    suspended: AtomicBool,
    /// Set by `Pool::abandon`: background threads stop at once, nothing more is written.
    abandoned: AtomicBool,
    /// A committed txg recorded new DTL entries on an online leaf: the sync thread
    /// starts a resilver.
    resilver_wanted: AtomicBool,
    scan: crate::scan::ScanControl,
    /// Clock, sleeps, thread spawns and randomness (real, or simulated in tests).
    env: Arc<dyn crate::env::Env>,
    /// The newest uberblock on disk (the heartbeat rewrites it with a sequence number).
    last_ub: Mutex<Option<label::Uberblock>>,
    /// Autotrim's and the manual trim's counters (`vdev::trim`).
    trim_stats: crate::vdev::trim::TrimStats,
    /// The manual trim (`zilla pool trim`, spa/trim.rs).
    manual_trim: Mutex<trim::ManualTrim>,
    /// Serialises finishing replacements (one detach of each old leaf).
    replace_lock: Mutex<()>,
}

/// A random non-zero guid from `env`'s RNG (seeded under simulation).
pub(crate) fn new_guid(env: &dyn crate::env::Env) -> Guid {
    loop {
        let g = env.random_u64();
        if g != 0 {
            return Guid(g);
        }
    }
}

impl PoolInner {
    /// Every metadata block of the MOS at `root`, in either format.
    pub(crate) fn mos_blocks_at(&self, root: &BlockPointer, class: crate::vdev::IoClass) -> Result<Vec<BlockPointer>> {
        if root.kind == crate::block::blkptr::KIND_OBJSET {
            let bio = crate::dmu::pool_block_io::PoolBlockIo::new(&self.io, Txg::ZERO, class);
            return crate::pool_mos::metadata_blocks(&bio, root);
        }
        crate::dmu::mos_blocks(&self.io, root, class)
    }

    /// This pool as its scan thread sees it.
    pub(super) fn scanner(self: &Arc<Self>) -> Arc<dyn ScanPool> {
        self.clone()
    }

    /// The one constructor: `synced_txg` is the last txg on disk (the new pool's
    /// first txg is `synced_txg + 1`).
    #[allow(clippy::too_many_arguments)]
    fn new(
        config: PoolConfig,
        io: PoolIo,
        leaves: Vec<Arc<Leaf>>,
        volumes: BTreeMap<String, Arc<VolumeState>>,
        meta: MosMeta,
        synced_txg: Txg,
        opener: Opener,
        env: Arc<dyn Env>,
    ) -> Arc<PoolInner> {
        let dirty = DirtyAccounting::new(env.clone());
        for v in volumes.values() {
            dirty.track_volume(&v.space);
        }
        Arc::new(PoolInner {
            name: config.name.clone(),
            guid: config.guid,
            io,
            txg: TxgState::new(synced_txg, env.clone()),
            dirty,
            config: Mutex::new(config),
            leaves: RwLock::new(leaves),
            volumes: RwLock::new(volumes),
            meta: Mutex::new(meta),
            sync_lock: Mutex::new(()),
            config_write_lock: Mutex::new(()),
            labels_stale: false.into(),
            opener,
            suspended: false.into(),
            abandoned: false.into(),
            resilver_wanted: false.into(),
            scan: Default::default(),
            env,
            last_ub: Mutex::new(None),
            trim_stats: Default::default(),
            manual_trim: Default::default(),
            replace_lock: Mutex::new(()),
        })
    }

    /// The `autotrim` pool property is on.
    pub fn autotrim(&self) -> bool {
        self.config.lock().props.get("autotrim").is_some_and(|v| v == "on")
    }

    /// Drop this pool's claim (flock / O_EXCL) on every leaf: export, destroy, crash.
    fn release_leaves(&self) {
        for leaf in self.leaves.read().iter() {
            leaf.device().release();
        }
    }

    pub fn tops(&self) -> Vec<Arc<TopVdev>> {
        self.io.vdevs.read().clone()
    }


    /// The leaf a device name means: its path (whole, as given, or its file name), or
    /// its guid. While a device is replaced in place two leaves share a path: the path
    /// means the new device, `PATH/old` (or the guid) the old one, whatever their states.
    pub fn find_leaf(&self, name: &str) -> Option<(Arc<TopVdev>, Arc<Leaf>)> {
        self.find_leaf_as(name, false).or_else(|| self.find_leaf_as(name.strip_suffix("/old")?, true))
    }

    /// [`PoolInner::find_leaf`]: `old` looks for the device a replacement in place replaces.
    fn find_leaf_as(&self, name: &str, old: bool) -> Option<(Arc<TopVdev>, Arc<Leaf>)> {
        let pairs = self.replacements();
        for t in self.tops() {
            for c in t.children() {
                if c.guid.to_string() == name && !old {
                    return Some((t.clone(), c));
                }
                let same = c.spec.display() == name
                    || c.spec.path.to_string_lossy() == name
                    || c.spec.path.file_name().map(|f| f.to_string_lossy() == name).unwrap_or(false);
                if !same {
                    continue;
                }
                // the old half of an in-place pair: its path is the new one's
                let in_place_old = pairs.iter().any(|&(o, n)| {
                    o == c.guid && t.children().iter().any(|k| k.guid == n && k.spec.path == c.spec.path)
                });
                if old == in_place_old {
                    return Some((t.clone(), c));
                }
            }
        }
        None
    }
}

/// What [`Pool::destroy_report`] could not do.
#[derive(Debug, Default)]
pub struct DestroyReport {
    /// The devices whose labels could not be cleared, and why.
    pub labels_kept: Vec<(String, String)>,
}

pub struct Pool {
    inner: Arc<PoolInner>,
    /// The txg quiesce and sync threads.
    txg_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    closed: std::sync::atomic::AtomicBool,
}

impl Pool {
    fn from_inner(inner: Arc<PoolInner>) -> Arc<Pool> {
        let threads = Self::spawn_txg_threads(&inner, None);
        let mut threads = threads;
        if inner.multihost() {
            let h = inner.clone();
            threads.push(inner.env.spawn(format!("mmp_{}", inner.name), Box::new(move || h.heartbeat_loop())).expect("spawn heartbeat thread"));
        }
        let pool = Arc::new(Pool { inner, txg_threads: Mutex::new(threads), closed: false.into() });
        crate::scan::resume_after_import(&pool.inner.scanner());
        pool
    }

    /// The txg quiesce and sync threads; `unfinished`: a txg whose sync failed when the
    /// previous sync thread stopped, synced first.
    fn spawn_txg_threads(inner: &Arc<PoolInner>, unfinished: Option<Txg>) -> Vec<std::thread::JoinHandle<()>> {
        let (q, s) = (inner.clone(), inner.clone());
        vec![
            inner.env.spawn(format!("txg_quiesce_{}", inner.name), Box::new(move || q.quiesce_loop())).expect("spawn txg quiesce thread"),
            inner.env.spawn(format!("txg_sync_{}", inner.name), Box::new(move || {
                crate::zio::workers::lower_thread_priority();
                s.sync_loop(unfinished)
            })).expect("spawn txg sync thread"),
        ]
    }

    /// The error every admin command that needs a sync gets while the pool is
    /// suspended: why, and the two ways out.
    fn suspended_error(&self, why: &str) -> Error {
        let n = &self.inner.name;
        Error::Busy(format!(
            "pool '{n}' is suspended: its txg syncs fail ({why}); the change is written by the first \
             sync that succeeds. Writes wait until `zilla pool clear {n}` resumes the pool once the \
             devices work again, or `zilla pool export -f {n}` exports it without the final sync (what \
             the last synced txg and the intent logs hold stays)"
        ))
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    fn join_txg_threads(&self) {
        let threads = std::mem::take(&mut *self.txg_threads.lock());
        for h in threads {
            let _ = h.join();
        }
    }

    fn stop_threads(&self) {
        self.inner.txg.begin_shutdown();
        self.inner.dirty.wake_all();
        self.join_txg_threads();
    }

    /// Why a plain export is refused now: the pool is suspended, so its final sync
    /// cannot complete (`export_unsynced` exports it without one).
    pub fn export_refusal(&self) -> Option<Error> {
        let why = self.inner.txg.suspended_by()?;
        let n = &self.inner.name;
        Some(Error::Busy(format!(
            "pool '{n}' is suspended: its txg syncs fail ({why}), so the final sync of an export \
             cannot complete; `zilla pool export -f {n}` exports it without the final sync (what \
             the last synced txg and the intent logs hold stays), or heal the devices and run \
             `zilla pool clear {n}`"
        )))
    }

    /// Export: a final sync, labels marked exported, devices released. All or nothing:
    /// if the final sync fails the pool stays imported and running as before.
    pub fn export(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::invalid(format!("pool '{}' is already exported", self.inner.name)));
        }
        if let Some(e) = self.export_refusal() {
            return Err(e);
        }
        // the final sync while the pool still runs: a failure leaves it as it was
        let open = self.inner.txg.open_txg();
        if let Err(e) = self.inner.txg.wait_synced_or_failed(open) {
            return Err(Error::Io(std::io::Error::other(format!("final sync failed, the pool stays imported: {e}"))));
        }
        if self.closed.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(format!("pool '{}' is already exported", self.inner.name)));
        }
        crate::scan::pause_for_export(&self.inner.scanner());
        // what was dirtied since, synced as the threads stop
        let open = self.inner.txg.open_txg();
        self.inner.txg.request_sync(open);
        self.stop_threads();
        if let Some(e) = self.inner.txg.sync_error() {
            self.restart_after_failed_export();
            return Err(Error::Io(std::io::Error::other(format!("final sync failed, the pool stays imported: {e}"))));
        }
        // under sync_lock: a config change (`lock_for_change`) ended before, or is refused
        let _g = self.inner.sync_lock.lock();
        let r = self.inner.write_config_labels("exported");
        self.inner.release_leaves();
        r
    }

    /// The devices failed during an export's last sync after the threads were told to
    /// stop: start them again (the failed txg first) so the pool is imported and
    /// retrying as before the export.
    fn restart_after_failed_export(&self) {
        if self.inner.txg.fatal_error().is_some() {
            return; // a broken invariant: nothing syncs again either way
        }
        let unfinished = self.inner.txg.cancel_shutdown();
        *self.txg_threads.lock() = Self::spawn_txg_threads(&self.inner, unfinished);
        self.closed.store(false, Ordering::Release);
        tracing::error!(pool = %self.inner.name, "export: the final sync failed; the pool stays imported (suspended, retrying)");
    }

    /// `zilla pool export -f` of a suspended pool: export without the final sync. The
    /// pool stops at once (nothing more is synced; writers and flushes waiting on it get
    /// an error), its labels are marked exported where the devices still take writes,
    /// and its devices are released. What the last synced txg holds stays, and the
    /// intent logs (every write a FLUSH or FUA acknowledged since) replay at the next
    /// import. A pool that is not suspended is exported as by `export`.
    pub fn export_unsynced(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::invalid(format!("pool '{}' is already exported", self.inner.name)));
        }
        let Some(why) = self.inner.txg.suspended_by() else {
            return self.export();
        };
        tracing::warn!(pool = %self.inner.name, "exporting the suspended pool without its final sync ({why}); the intent logs replay at the next import");
        self.stop_without_sync();
        let _g = self.inner.sync_lock.lock();
        if let Err(e) = self.inner.write_config_labels("exported") {
            // an import needs no exported label (a pool that was not exported imports too)
            tracing::warn!(pool = %self.inner.name, "export -f: could not mark the labels exported: {e}");
        }
        self.inner.release_leaves();
        Ok(())
    }

    /// Stop the background threads without syncing (tests: simulated crash).
    pub fn abandon(&self) {
        self.stop_without_sync();
        self.inner.release_leaves();
    }

    /// Close the pool and stop its threads without syncing: the dirty data is dropped,
    /// every waiter gets an error.
    fn stop_without_sync(&self) {
        self.closed.store(true, Ordering::Release);
        self.inner.abandoned.store(true, Ordering::Release);
        crate::scan::stop(&self.inner.scanner());
        self.inner.txg.begin_shutdown();
        self.inner.suspended.store(true, Ordering::Relaxed);
        // drop dirty data so the final-sync path has nothing to do
        for v in self.inner.volumes.read().values() {
            v.dirty.clear();
            v.space.drop_pending();
        }
        self.inner.meta.lock().changed = false;
        for t in crate::txg::TXG_INITIAL.get()..=self.inner.txg.open_txg().get() {
            self.inner.dirty.retire(Txg(t));
        }
        self.inner.dirty.wake_all();
        self.join_txg_threads();
    }

    /// Destroy the pool; an error when the labels of a device it could reach could not
    /// be cleared (the pool is gone here all the same: see [`Pool::destroy_report`]).
    pub fn destroy(&self) -> Result<()> {
        let report = self.destroy_report()?;
        match report.labels_kept.as_slice() {
            [] => Ok(()),
            kept => Err(Error::Io(std::io::Error::other(format!(
                "the labels on {} could not be cleared",
                kept.iter().map(|(dev, e)| format!("{dev} ({e})")).collect::<Vec<_>>().join(", ")
            )))),
        }
    }

    /// Destroy the pool: close it, stop its threads and clear the labels of every
    /// device it can reach, then release its devices. Once this returns Ok the pool is
    /// gone from this process whatever the devices did; a device whose labels could
    /// not be cleared (its writes or flush fail: a suspended pool) is listed in the
    /// report, as an import may still find the pool on it. An unavailable device is
    /// not written (nor listed).
    pub fn destroy_report(&self) -> Result<DestroyReport> {
        self.check_open()?;
        self.closed.store(true, Ordering::Release);
        crate::scan::stop(&self.inner.scanner());
        self.stop_threads();
        let mut labels_kept = vec![];
        for leaf in self.inner.leaves.read().iter() {
            if leaf.state() == LeafState::Unavail {
                continue;
            }
            if let Err(e) = label::wipe_labels(&**leaf.device()) {
                tracing::warn!(pool = %self.inner.name, "destroy: could not clear the labels on {}: {e}", leaf.spec.shown());
                labels_kept.push((leaf.spec.display(), e.to_string()));
            }
        }
        self.inner.release_leaves();
        Ok(DestroyReport { labels_kept })
    }

    pub fn name(&self) -> String {
        self.inner.name.clone()
    }
    pub fn guid(&self) -> Guid {
        self.inner.guid
    }
    pub fn leaf_specs(&self) -> Vec<LeafSpec> {
        self.inner.leaves.read().iter().map(|l| l.spec.clone()).collect()
    }
    pub fn synced_txg(&self) -> Txg {
        self.inner.txg.synced_txg()
    }

    /// Wait until everything changed so far is synced. A suspended pool gets
    /// [`SUSPENDED_SYNC_WAIT`] for its retries to go through, then an error that says
    /// so (an admin command never hangs on it; writers wait, as `failmode=wait`).
    pub fn sync(&self) -> Result<()> {
        self.check_open()?;
        let t = self.inner.txg.open_txg();
        self.inner.txg.wait_synced_suspended_for(t, SUSPENDED_SYNC_WAIT).map_err(|e| match e {
            crate::txg::SyncWait::Suspended(why) => self.suspended_error(&why),
            crate::txg::SyncWait::Failed(e) => e,
        })
    }

    /// Record an admin command in the pool's history (spa_history.rs, `zilla pool
    /// history`); it is on disk with the next txg (the caller's [`Pool::sync`]). `pin`:
    /// the pool's creation, the first record, kept when older ones are dropped.
    pub fn log_history(&self, rec: crate::spa_history::HistoryRecord, pin: bool) {
        let mut m = self.inner.meta.lock();
        m.history.append(rec, pin);
        m.changed = true;
    }

    /// `guid` is one of this pool's leaves (events name the pool of a device by it).
    pub fn has_leaf(&self, guid: Guid) -> bool {
        self.inner.leaves.read().iter().any(|l| l.guid == guid)
    }

    /// The command history, oldest first, and how many records were dropped to keep
    /// its bound.
    pub fn history(&self) -> (Vec<crate::spa_history::HistoryRecord>, u64) {
        let m = self.inner.meta.lock();
        (m.history.records().to_vec(), m.history.dropped)
    }

    /// Dirty data and the write throttle: bytes dirty now, the limit, delayed writers.
    pub fn throttle_stats(&self) -> crate::dsl_pool::ThrottleStats {
        self.inner.dirty.stats()
    }

    /// The last `n` txgs' lives, oldest first (`zilla txgs`; at most `zfs_txg_history`).
    pub fn txg_history(&self, n: usize) -> Vec<crate::txg::TxgRecord> {
        self.inner.txg.history(n)
    }

    /// The intent-log counters (OpenZFS kstat names, /proc/spl/kstat/zfs/zil) summed
    /// over the pool's volumes.
    pub fn zil_stats(&self) -> Vec<(&'static str, u64)> {
        let mut out = crate::zil::ZilStats::default().snapshot();
        for v in self.inner.volumes.read().values() {
            for (o, (_, n)) in out.iter_mut().zip(v.zil.stats.snapshot()) {
                o.1 += n;
            }
        }
        out
    }

    /// Intent-log commits per volume (its name in the pool, `zil_commit_count`).
    pub fn zil_commits_by_volume(&self) -> Vec<(String, u64)> {
        let volumes = self.inner.volumes.read();
        volumes.iter().map(|(name, v)| (name.clone(), v.zil.stats.zil_commit_count.load(std::sync::atomic::Ordering::Relaxed))).collect()
    }

    pub fn arc_stats(&self) -> crate::arc::ArcStats {
        self.inner.io.arc_stats()
    }

    /// The read-ahead counters (OpenZFS zfetchstats names) summed over the pool's
    /// volumes.
    pub fn zfetch_stats(&self) -> crate::zfetch::ZfetchStats {
        let mut out = crate::zfetch::ZfetchStats::default();
        for v in self.inner.volumes.read().values() {
            out.add(&v.zfetch.stats());
        }
        out
    }

    /// How many of `volume`'s committed blocks (data and indirect) the pool's cache
    /// devices hold (`secondarycache` checks; 0 without cache devices).
    pub fn l2_blocks_of_volume(&self, volume: &str) -> Result<usize> {
        let v = self.inner.volumes.read().get(volume).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{volume}'", self.inner.name)))?;
        let Some(l2) = self.inner.io.l2arc() else { return Ok(0) };
        let root = *v.committed.read();
        let hint = crate::arc::CacheHint { l2_eligible: false, ..crate::arc::CacheHint::METADATA };
        let mut held = 0;
        crate::dmu::walk_all_hinted(&self.inner.io, &root, crate::vdev::IoClass::SyncRead, hint, &mut |bp, _| {
            held += usize::from(l2.holds(&crate::arc::BlockKey::of(bp)));
            Ok(())
        })?;
        Ok(held)
    }

    /// The pool's L2ARC statistics (None without cache devices).
    pub fn l2_stats(&self) -> Option<crate::l2arc::L2Stats> {
        self.inner.io.l2_stats()
    }

    pub fn scrub(&self, cmd: ScrubCmd) -> Result<()> {
        self.check_open()?;
        match cmd {
            ScrubCmd::Start => crate::scan::start_scrub(&self.inner.scanner()),
            ScrubCmd::Pause => crate::scan::pause(&self.inner.scanner()),
            ScrubCmd::Stop => crate::scan::cancel(&self.inner.scanner()),
        }
    }

    /// The last or current scrub/resilver.
    pub fn scan_status(&self) -> crate::scan::ScanStatus {
        crate::scan::status(&self.inner.scanner())
    }

    pub fn scrub_wait(&self) -> Result<()> {
        crate::scan::wait(&self.inner.scanner());
        Ok(())
    }

    /// `zpool wait -t ACTIVITY`: return once `activity` is not in progress (at once if
    /// it is not now). A pool exported meanwhile ends the wait with an error.
    pub fn wait_activity(&self, activity: Activity) -> Result<()> {
        const POLL: std::time::Duration = std::time::Duration::from_millis(50);
        let scanning = |func: crate::scan::ScanFunc| {
            let s = self.scan_status();
            s.func == func && (s.state == crate::scan::ScanState::Scanning || crate::scan::is_running(&self.inner.scanner()))
        };
        match activity {
            Activity::Trim => return self.trim_wait(),
            Activity::Replace => return self.replace_wait(),
            Activity::Scrub | Activity::Resilver => {}
        }
        let func = if activity == Activity::Scrub { crate::scan::ScanFunc::Scrub } else { crate::scan::ScanFunc::Resilver };
        while scanning(func) {
            self.check_open()?;
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    // ---- volumes -------------------------------------------------------------------

    /// Create a volume. It is sparse unless `props` sets `refreservation` (`auto`: the
    /// volume's size with its metadata, what `zilla volume create` without `-s` asks
    /// for); a reservation the pool cannot keep free is refused (`NoSpaceFor`).
    pub fn volume_create(&self, name: &str, volsize: u64, volblocksize: u32, props: &[(String, String)]) -> Result<()> {
        self.check_open()?;
        validate_volume_name(name)?;
        if !volblocksize.is_power_of_two() || !(MIN_VOLBLOCKSIZE..=MAX_VOLBLOCKSIZE).contains(&volblocksize) {
            return Err(Error::invalid(format!("volblocksize {volblocksize} must be a power of two from 4K to 128K")));
        }
        if volsize == 0 || volsize % volblocksize as u64 != 0 {
            return Err(Error::invalid(format!("volsize {volsize} must be a non-zero multiple of volblocksize ({volblocksize})")));
        }
        if volsize > (1u64 << 50) {
            return Err(Error::invalid("volsize too large (max 1 PiB)"));
        }
        let mut ps = crate::props::PropSet::default();
        for (k, v) in props {
            if k == "volblocksize" || k == "volsize" {
                return Err(Error::invalid(format!("use -b / -V for '{k}'")));
            }
            let v = if k == "refreservation" { resolve_refreservation(v, volsize, volblocksize)? } else { v.clone() };
            ps.set(k, &v)?;
        }
        let created_s = self.inner.env.unix_time_ns() / 1_000_000_000;
        ps.set(dataset::CREATION_PROP, &created_s.to_string())?;
        let reservation = crate::props::refreservation_bytes(&ps.value("refreservation"));
        let inner = &self.inner;
        let mut vols = inner.volumes.write();
        if vols.contains_key(name) {
            return Err(Error::Exists(format!("{}/{name}", inner.name)));
        }
        let space = Arc::new(crate::dsl_pool::VolumeSpace::new(0, 0));
        inner.reserve_for_volume(&space, reservation).map_err(|e| match e {
            Error::NoSpaceFor(why) => Error::NoSpaceFor(format!("{why} (a sparse volume, `-s`, reserves nothing)")),
            e => e,
        })?;
        let id = {
            let mut m = inner.meta.lock();
            let id = m.next_volume_id;
            m.next_volume_id += 1;
            m.changed = true;
            id
        };
        let nlevels = dmu::levels_for(volsize / volblocksize as u64);
        vols.insert(
            name.to_string(),
            Arc::new(VolumeState {
                id,
                name: name.to_string(),
                volsize: volsize.into(),
                grown_volsize: 0.into(),
                volblocksize,
                created_txg: inner.txg.open_txg(),
                props: crate::props::PublishedProps::new(ps),
                committed: RwLock::new(TreeRoot { bp: BlockPointer::hole(), nlevels }),
                dirty: Default::default(),
                destroyed: false.into(),
                zil: crate::zil::Zilog::new(id),
                space,
                zfetch: Default::default(),
            }),
        );
        drop(vols);
        self.sync()
    }

    pub fn volume_destroy(&self, name: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        // sync first so the tree we free is complete
        self.sync()?;
        let _g = inner.sync_lock.lock();
        let v = inner.volumes.write().remove(name).ok_or_else(|| Error::NotFound(format!("volume '{}/{name}'", inner.name)))?;
        v.destroyed.store(true, Ordering::Release);
        inner.dirty.untrack_volume(&v.space);
        // its intent log's blocks go with it, in the txg that drops it from the MOS
        let free_txg = inner.txg.open_txg();
        for d in v.zil.take_all_blocks() {
            inner.io.ms.log_referenced(&d);
            inner.io.ms.free_deferred(free_txg, d);
        }
        let root = *v.committed.read();
        let mut m = inner.meta.lock();
        if !root.bp.is_hole() {
            // its defer entries grow the next MOS: writers must leave room for them
            inner.dirty.add_doomed(root.free_cost_bytes());
            m.doomed.push(root);
        }
        m.changed = true;
        drop(m);
        drop(_g);
        self.sync()
    }

    pub fn volumes(&self) -> Vec<VolumeInfo> {
        let figures = self.space_figures();
        self.inner
            .volumes
            .read()
            .values()
            .map(|v| {
                let s = VolumeSpaceFigures::of(v, &figures);
                VolumeInfo {
                    name: format!("{}/{}", self.inner.name, v.name),
                    volsize: v.volsize(),
                    volblocksize: v.volblocksize,
                    used: s.used,
                    readonly: v.props.typed().readonly,
                    available: s.available,
                    referenced: s.referenced,
                    refreservation: s.refreservation,
                    logicalused: s.logicalused,
                }
            })
            .collect()
    }

    /// The pool's space as `zilla get` and `zilla pool list` show it (one reading).
    pub fn space_figures(&self) -> crate::dsl_pool::SpaceFigures {
        let (size, allocated) = self.inner.io.ms.space(crate::vdev::Role::Normal);
        let (_, unavailable) = self.inner.io.space();
        self.inner.dirty.space_figures(size, allocated, unavailable, crate::dsl_pool::slop_bytes(size))
    }

    pub fn open_volume(&self, name: &str) -> Result<Arc<dyn BlockVolume>> {
        Ok(self.open_zvol(name)?)
    }

    pub fn open_zvol(&self, name: &str) -> Result<Arc<crate::zvol::Volume>> {
        self.check_open()?;
        let v = self.inner.volumes.read().get(name).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{name}'", self.inner.name)))?;
        Ok(Arc::new(crate::zvol::Volume::new(self.inner.clone() as Arc<dyn VolumePool>, v)))
    }

    pub fn get_props(&self, volume: &str, props: &[String]) -> Result<Vec<PropRow>> {
        let v = self.inner.volumes.read().get(volume).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{volume}'", self.inner.name)))?;
        let full = format!("{}/{}", self.inner.name, v.name);
        let ps = v.props.snapshot();
        let s = VolumeSpaceFigures::of(&v, &self.space_figures());
        let mut all: Vec<(String, String, String, Option<&str>)> = vec![
            ("volsize".into(), v.volsize().to_string(), "local".into(), None),
            ("volblocksize".into(), v.volblocksize.to_string(), "default".into(), None),
            ("used".into(), s.used.to_string(), "-".into(), None),
            ("available".into(), s.available.to_string(), "-".into(), None),
            ("referenced".into(), s.referenced.to_string(), "-".into(), None),
            ("logicalused".into(), s.logicalused.to_string(), "-".into(), None),
            ("usedbydataset".into(), s.referenced.to_string(), "-".into(), None),
            ("usedbyrefreservation".into(), v.space.unused_settled().to_string(), "-".into(), None),
            ("createtxg".into(), v.created_txg.0.to_string(), "-".into(), None),
            ("objsetid".into(), v.id.to_string(), "-".into(), None),
        ];
        all.extend(dataset::statistics(&full, &ps, &s).into_iter().map(|(p, val)| (p.to_string(), val, "-".to_string(), None)));
        for d in crate::props::PROPS {
            let (val, src) = ps.get(d.name);
            all.push((d.name.into(), val, src.into(), d.no_effect_yet));
        }
        let wanted: Vec<String> = if props.is_empty() || props.iter().any(|p| p == "all") {
            all.iter().map(|a| a.0.clone()).collect()
        } else {
            props.to_vec()
        };
        let mut out = Vec::new();
        for w in wanted {
            match all.iter().find(|a| a.0 == w) {
                Some((p, val, src, note)) => out.push(PropRow {
                    name: full.clone(),
                    property: p.clone(),
                    value: val.clone(),
                    source: src.clone(),
                    note: note.map(String::from),
                }),
                None => return Err(Error::invalid(format!("unknown property '{w}'"))),
            }
        }
        Ok(out)
    }

    /// The value of internal property `prop` of `volume` (not shown by `get_props`).
    pub fn internal_prop(&self, volume: &str, prop: &str) -> Option<String> {
        let v = self.inner.volumes.read().get(volume).cloned()?;
        let value = v.props.snapshot().local().get(prop).cloned();
        value
    }

    /// `zpool set PROP=VALUE`: change a pool property (not `ashift`); it is written by
    /// the sync this call waits for.
    pub fn set_pool_prop(&self, prop: &str, value: &str) -> Result<()> {
        self.check_open()?;
        if prop == "ashift" {
            return Err(Error::invalid("ashift is fixed when the pool is created".to_string()));
        }
        let v = config::validate_pool_prop(prop, value)?;
        self.inner.config.lock().props.insert(prop.to_string(), v);
        self.inner.meta.lock().changed = true;
        self.sync()
    }

    /// The `autotrim` pool property is on.
    pub fn autotrim(&self) -> bool {
        self.inner.autotrim()
    }

    /// Autotrim's counters: (kstat name, value).
    pub fn trim_stats(&self) -> Vec<(&'static str, u64)> {
        self.inner.trim_stats.snapshot()
    }

    pub fn set_prop(&self, volume: &str, prop: &str, value: &str) -> Result<()> {
        self.check_open()?;
        if prop == "volsize" {
            let size = crate::props::parse_size(&value.trim().to_ascii_lowercase())
                .ok_or_else(|| Error::invalid(format!("bad value '{value}' for property 'volsize': expected a size such as 20G")))?;
            return self.set_volsize(volume, size);
        }
        let v = self.inner.volumes.read().get(volume).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{volume}'", self.inner.name)))?;
        if prop == "refreservation" {
            let value = resolve_refreservation(value, v.volsize(), v.volblocksize)?;
            let bytes = crate::props::refreservation_bytes(&value);
            // the reservation and the property change together: one `set` at a time
            let _g = self.inner.volumes.write();
            self.inner.reserve_for_volume(&v.space, bytes)?;
            v.props.set(prop, &value)?;
        } else {
            v.props.set(prop, value)?;
        }
        self.inner.meta.lock().changed = true;
        self.sync()
    }
}

/// `refreservation` as given (`none`, `auto`, a size) to its stored form: `auto` is the
/// reservation of a thick volume of `volsize` (`dsl_pool::refreservation_for`).
fn resolve_refreservation(value: &str, volsize: u64, volblocksize: u32) -> Result<String> {
    match crate::props::validate("refreservation", value)?.as_str() {
        "auto" => Ok(crate::dsl_pool::refreservation_for(volsize, volblocksize).to_string()),
        v => Ok(v.to_string()),
    }
}

/// Bytes as `zfs` shows them (`1.50G`), for messages.
fn shown_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["K", "M", "G", "T", "P", "E"];
    if n < 1024 {
        return format!("{n}B");
    }
    let (mut v, mut i) = (n as f64 / 1024.0, 0);
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2}{}", UNITS[i])
}

/// One volume's space figures (zfs names), from the pool's reading.
struct VolumeSpaceFigures {
    refreservation: u64,
    referenced: u64,
    /// referenced plus the unused reservation (usedbydataset + usedbyrefreservation).
    used: u64,
    available: u64,
    logicalused: u64,
}

impl VolumeSpaceFigures {
    fn of(v: &VolumeState, pool: &crate::dsl_pool::SpaceFigures) -> VolumeSpaceFigures {
        let referenced = v.space.referenced();
        VolumeSpaceFigures {
            refreservation: v.space.reservation(),
            referenced,
            used: referenced.saturating_add(v.space.unused_settled()),
            available: pool.available_to(&v.space),
            // data blocks at their logical size: what was written and not freed
            logicalused: v.committed.read().bp.fill * v.volblocksize as u64,
        }
    }
}

impl PoolInner {
    /// Set a volume's reservation to `bytes` (0 = none), refused when the pool cannot
    /// keep the growth of its unused part free.
    fn reserve_for_volume(&self, space: &Arc<crate::dsl_pool::VolumeSpace>, bytes: u64) -> Result<()> {
        let (size, unavailable) = self.io.space();
        let slop = crate::dsl_pool::slop_bytes(size);
        self.dirty.set_reservation(space, bytes, size, unavailable, slop).map_err(|short| {
            // the figure `zilla get available POOL` shows
            let (size, allocated) = self.io.ms.space(crate::vdev::Role::Normal);
            let available = self.dirty.space_figures(size, allocated, unavailable, slop).available;
            Error::NoSpaceFor(format!(
                "a refreservation of {} does not fit in pool '{}': {} available, {} short",
                shown_bytes(bytes),
                self.name,
                shown_bytes(available),
                shown_bytes(short)
            ))
        })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            // not exported: behave like a crash (nothing more is written)
            self.abandon();
        }
    }
}

impl VolumePool for PoolInner {
    fn pool_name(&self) -> &str {
        &self.name
    }
    fn io(&self) -> &PoolIo {
        &self.io
    }
    fn txg(&self) -> &TxgState {
        &self.txg
    }
    fn dirty(&self) -> &DirtyAccounting {
        &self.dirty
    }
    fn mos_changed(&self) -> bool {
        self.meta.lock().changed
    }
    fn random_u64(&self) -> u64 {
        self.env.random_u64()
    }
}

impl ScanPool for PoolInner {
    fn pool_name(&self) -> &str {
        &self.name
    }
    fn io(&self) -> &PoolIo {
        &self.io
    }
    fn env(&self) -> &dyn Env {
        &*self.env
    }
    fn scan(&self) -> &crate::scan::ScanControl {
        &self.scan
    }
    fn txg(&self) -> &TxgState {
        &self.txg
    }
    fn mos_root(&self) -> BlockPointer {
        self.meta.lock().mos_root
    }
    fn mos_blocks(&self, root: &BlockPointer, class: crate::vdev::IoClass) -> Result<Vec<BlockPointer>> {
        self.mos_blocks_at(root, class)
    }
    fn saved_scan_state(&self) -> String {
        self.meta.lock().scan_state.clone()
    }
    fn save_scan_state(&self, json: String, mark_changed: bool) {
        let mut m = self.meta.lock();
        m.scan_state = json;
        m.changed |= mark_changed;
    }
    fn volumes(&self) -> Vec<Arc<VolumeState>> {
        self.volumes.read().values().cloned().collect()
    }
    fn leaves(&self) -> Vec<Arc<Leaf>> {
        self.leaves.read().clone()
    }
    fn rewrite_labels(&self) -> Result<()> {
        self.write_config_labels("active")
    }
}
