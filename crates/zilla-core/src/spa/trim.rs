//! spa trim: `zpool trim`, a manual pass that discards every free extent of the pool
//! (OpenZFS vdev_trim.c's manual trim; autotrim is `vdev::trim`).
//!
//! Theory of operation
//! -------------------
//! A pass keeps one cursor per top-level vdev (data and log; cache and spare devices
//! hold no pool space) and walks each vdev's free space in offset order. The work is
//! done by the txg syncs, at the place autotrim uses: right after the sync of T has
//! released the frees of txgs <= T-3, and before it allocates anything, it takes up
//! to `zilla_trim_txg_extents` free extents after each cursor out of the free trees
//! (`Metaslabs::take_free_for_trim`: at least `zfs_trim_extent_bytes_min`, split at
//! `zfs_trim_extent_bytes_max`), discards them on every writable child
//! (`vdev::trim::trim_top`: trim class, `zfs_trim_queue_limit` in flight per child),
//! waits for the discards, and gives the extents back (at most `zilla_trim_txg_bytes`
//! per vdev per txg, but always one extent). A pass walks from the sync
//! that releases the frees made before it started (`TXG_DEFER_SIZE` + 1 txgs later), so
//! the space of a volume just destroyed is in it. While a pass is active each
//! sync asks for the next one `zilla_trim_txg_interval_ms` later, so it advances on
//! an idle pool too (an empty txg costs its object directory and uberblock writes),
//! without making txgs back to back: the defer window is counted in txgs, and a pass
//! that shrank a txg to milliseconds would shrink the time a freed block stays
//! untouched with it.
//!
//! Crash analysis. (1) No write lands on space being discarded: the extents are out of
//! the free trees while their discards are in flight, under `sync_lock`, so neither
//! the sync nor the intent log (which allocates outside syncs) can allocate them.
//! (2) No tree an import may load references them: the free trees hold only space
//! whose frees are past the defer window (metaslab), the same rule autotrim relies on.
//! (3) No space map records them as allocated: they are back in the free trees before
//! the sync encodes the allocators into the object directory. So a power cut at any
//! point loses only the pass's progress, which is kept in memory: after an import
//! `pool trim` starts over (discarding space again is harmless). Space freed behind a
//! cursor during the pass is not discarded by it (autotrim does that when on).
//!
//! Cost: the sync that runs a step waits for its discards (`zilla txgs` shows it in
//! the sync time), and while the extents are out a commit that needs a log block in
//! the normal class may find less room and wait for a txg instead.
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use crate::kstat::{Applies, Tunable};
use crate::vdev::trim::{TrimStats, ZFS_TRIM_QUEUE_LIMIT};
use crate::vdev::Role;
use crate::{Error, Result, Txg, VdevId};

use super::{Pool, PoolInner};

pub static ZILLA_TRIM_TXG_EXTENTS: Tunable = Tunable::new(
    "zilla_trim_txg_extents",
    256,
    1,
    100_000,
    Applies::Live,
    "free extents a manual trim (zilla pool trim) discards per top-level vdev per txg",
);
pub static ZILLA_TRIM_TXG_BYTES: Tunable = Tunable::new(
    "zilla_trim_txg_bytes",
    1 << 30,
    4096,
    1 << 40,
    Applies::Live,
    "bytes a manual trim discards per top-level vdev per txg (at least one extent)",
);
pub static ZILLA_TRIM_TXG_INTERVAL_MS: Tunable = Tunable::new(
    "zilla_trim_txg_interval_ms",
    100,
    0,
    60_000,
    Applies::Live,
    "least time between the txgs a manual trim asks for (ms; other syncs are not held)",
);

/// What `zilla pool trim` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrimCmd {
    /// Start a pass (or resume a suspended one).
    Start,
    /// Stop, keeping the cursors: `Start` resumes (`zpool trim -s`).
    Suspend,
    /// Stop and forget the pass (`zpool trim -c`).
    Cancel,
}

/// Where the manual trim is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrimState {
    /// No pass since import.
    #[default]
    None,
    Active,
    Suspended,
    Canceled,
    Complete,
}

/// The manual trim's progress (`pool status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrimStatus {
    pub state: TrimState,
    /// Free bytes of the pool's data and log vdevs when the pass started: the pass
    /// walks about this much (the pool keeps allocating and freeing meanwhile).
    pub free_bytes_at_start: u64,
    /// Bytes and extents discarded so far (each on every writable child).
    pub bytes_trimmed: u64,
    pub extents_trimmed: u64,
    /// Free bytes passed over for lying in extents shorter than the minimum.
    pub bytes_skipped: u64,
    /// Discards a device failed (advisory: nothing else happens).
    pub errors: u64,
    pub start_time_s: u64,
    pub end_time_s: u64,
}

/// A pass: its status and the cursor of every top-level vdev with free space left to
/// walk (a data offset; bounded by the pool's top-level vdevs).
#[derive(Debug, Default)]
pub(crate) struct ManualTrim {
    status: TrimStatus,
    cursors: BTreeMap<VdevId, u64>,
    /// The first txg whose sync walks: the frees made before the pass started are
    /// free by then (released TXG_DEFER_SIZE + 1 txgs after their own).
    walk_from_txg: Txg,
}

impl PoolInner {
    /// One step of an active pass, in the sync of `txg` (under `sync_lock`, before it
    /// allocates): see the module comment.
    pub(super) fn manual_trim_step(&self, txg: Txg) {
        let cursors: Vec<(VdevId, u64)> = {
            let t = self.manual_trim.lock();
            if t.status.state != TrimState::Active {
                return;
            }
            if txg < t.walk_from_txg {
                self.txg.request_sync_after(self.txg.open_txg(), ZILLA_TRIM_TXG_INTERVAL_MS.get() * 1_000_000);
                return;
            }
            t.cursors.iter().map(|(&v, &c)| (v, c)).collect()
        };
        let (min, max) = crate::vdev::trim::extent_bounds();
        let (per_txg, queue_limit) = (ZILLA_TRIM_TXG_EXTENTS.get() as usize, ZFS_TRIM_QUEUE_LIMIT.get() as usize);
        let bytes_per_txg = ZILLA_TRIM_TXG_BYTES.get();
        let stats = TrimStats::default();
        let mut moved: Vec<(VdevId, Option<u64>)> = Vec::with_capacity(cursors.len());
        let mut skipped = 0;
        for (vdev, from) in cursors {
            let Some(top) = self.io.top(vdev) else {
                moved.push((vdev, None)); // removed since the pass began
                continue;
            };
            let (extents, next, short) = self.io.ms.take_free_for_trim(vdev, from, min, max, (per_txg, bytes_per_txg));
            skipped += short;
            crate::vdev::trim::trim_top(&top, &extents, queue_limit, &stats, "trim");
            self.io.ms.return_trimmed(vdev, &extents);
            moved.push((vdev, next));
        }
        let mut t = self.manual_trim.lock();
        if t.status.state != TrimState::Active {
            return; // suspended or canceled while this step ran: its extents are back
        }
        for (vdev, next) in moved {
            match next {
                Some(c) => t.cursors.insert(vdev, c),
                None => t.cursors.remove(&vdev),
            };
        }
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        t.status.bytes_trimmed += l(&stats.bytes);
        t.status.extents_trimmed += l(&stats.extents);
        t.status.errors += l(&stats.errors);
        t.status.bytes_skipped += skipped;
        self.trim_stats.manual_bytes.fetch_add(l(&stats.bytes), Ordering::Relaxed);
        self.trim_stats.manual_extents.fetch_add(l(&stats.extents), Ordering::Relaxed);
        self.trim_stats.errors.fetch_add(l(&stats.errors), Ordering::Relaxed);
        if t.cursors.is_empty() {
            t.status.state = TrimState::Complete;
            t.status.end_time_s = self.env.unix_time_ns() / 1_000_000_000;
            tracing::info!(pool = %self.name, txg = txg.get(), bytes = t.status.bytes_trimmed, "manual trim complete");
        } else {
            self.txg.request_sync_after(self.txg.open_txg(), ZILLA_TRIM_TXG_INTERVAL_MS.get() * 1_000_000);
        }
    }
}

impl Pool {
    /// `zilla pool trim`: start (or resume), suspend or cancel the manual trim.
    pub fn trim(&self, cmd: TrimCmd) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let mut t = inner.manual_trim.lock();
        match (cmd, t.status.state) {
            (TrimCmd::Start, TrimState::Active) => return Err(Error::Busy("a trim is already in progress (suspend it with -s, cancel it with -c)".into())),
            (TrimCmd::Start, TrimState::Suspended) => t.status.state = TrimState::Active,
            (TrimCmd::Start, _) => {
                let tops: Vec<VdevId> = inner.tops().iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)).map(|t| t.id).collect();
                let free = [Role::Normal, Role::Log].iter().map(|&r| inner.io.ms.space(r)).map(|(size, alloc)| size - alloc).sum();
                t.cursors = tops.into_iter().map(|v| (v, 0)).collect();
                // what was freed until now (the open txg) is released by this sync
                t.walk_from_txg = Txg(inner.txg.open_txg().get() + crate::metaslab::TXG_DEFER_SIZE + 1);
                t.status = TrimStatus { state: TrimState::Active, free_bytes_at_start: free, start_time_s: inner.env.unix_time_ns() / 1_000_000_000, ..Default::default() };
            }
            (TrimCmd::Suspend, TrimState::Active) => t.status.state = TrimState::Suspended,
            (TrimCmd::Cancel, TrimState::Active | TrimState::Suspended) => {
                t.status.state = TrimState::Canceled;
                t.status.end_time_s = inner.env.unix_time_ns() / 1_000_000_000;
                t.cursors.clear();
            }
            (TrimCmd::Suspend | TrimCmd::Cancel, _) => return Err(Error::invalid("there is no active trim to suspend or cancel".to_string())),
        }
        drop(t);
        if cmd == TrimCmd::Start {
            inner.txg.request_sync(inner.txg.open_txg());
        }
        Ok(())
    }

    /// The manual trim's progress.
    pub fn trim_status(&self) -> TrimStatus {
        self.inner.manual_trim.lock().status.clone()
    }

    /// Wait until no trim is active (complete, suspended, canceled, or the pool closes).
    pub fn trim_wait(&self) -> Result<()> {
        const POLL: std::time::Duration = std::time::Duration::from_millis(20);
        while self.trim_status().state == TrimState::Active {
            self.check_open()?;
            if self.inner.suspended.load(Ordering::Acquire) {
                return Err(Error::Io(std::io::Error::other("the pool is suspended: its syncs, which run the trim, fail")));
            }
            if let Some(e) = self.inner.txg.fatal_error() {
                return Err(Error::Io(std::io::Error::other(format!("txg sync thread failed: {e}"))));
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}
