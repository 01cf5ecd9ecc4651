//! dsl_pool: dirty-data accounting and the write throttle.
//!
//! Theory of operation
//! -------------------
//! Every dirty block counts its logical size against the txg it joined, from the moment
//! it becomes dirty until that txg's sync has written it. The pool total is bounded by
//! `zfs_dirty_data_max`:
//!
//! ```text
//!  delay per write ▲                                   │ hard stop at 100 %
//!                  │                                  ╱│ (writers block, never fail)
//!                  │                              ___╱ │
//!                  │ 0 below 60 %   ______-------      │
//!                  └──────────────┴────────────────────┴──► dirty / max
//!                                60 %                 100 %
//!  delay_ns = zfs_delay_scale * (dirty - min) / (max - dirty), capped at 100 ms,
//!  min = zfs_delay_min_dirty_percent of max (dmu_tx.c)
//! ```
//!
//! Delayed writers are spaced out: each one's wakeup is at least `delay` after the
//! previous delayed writer's wakeup, so the pool admits at most one write per delay
//! period — the curve sets the rate, not just a sleep. A blocking writer sleeps in
//! `throttle`; a front end on an async runtime asks `claim_delay` instead, which takes
//! the same turn in the schedule and returns how long to wait, and waits on a timer:
//! 10,000 delayed writes a second then cost timer entries, not thread hand-offs and
//! sleeps (under 100 writers on the throttle bench the daemon went from 120 % to 102 %
//! of a core, CPU the txg sync needed). The non-blocking write path (`would_wait`) takes a write only
//! if `throttle` would not have waited for it, in either mode.
//!
//! When the open txg alone passes `zfs_dirty_data_sync_percent` of max, the sync thread
//! is kicked.
//!
//! Legacy mode (`zfs_write_throttle_mode=legacy`, a Zilla tunable, for comparison only):
//! the ZFS throttle of 2008-2013 (old dsl_pool_tempreserve_space / txg_delay). Each sync
//! measures the write bandwidth (bytes of the txg / its sync time); the next txgs may
//! hold `zfs_txg_synctime_ms` of it (`write_limit`, at least `zfs_write_limit_min`, at
//! most the dirty max). A write that finds the open txg past 7/8 of the limit waits one
//! clock tick (10 ms); one that finds it full kicks the txg and waits until the next txg
//! opens. That is the tri-modal latency of seed 002: software speed, 10 ms, and a stall
//! for a whole sync. The delay curve and the dirty-percent kick are off in this mode;
//! the hard stop at the dirty max stays.
//!
//! Space. Besides dirty bytes, every dirty change also counts the space its txg will
//! allocate when it syncs (`add_space`: data, the indirect blocks it dirties, its growth
//! of the object directory), and an admission in progress holds a reservation
//! (`reserve`) from its check until its change is counted, so concurrent writers can
//! not all pass the same check. space admission (space.rs) compares allocated + `space_pending`
//! with the pool size minus the slop.
//!
//! Reservations (`refreservation`, thick volumes). A thick volume's reservation R is
//! space the pool keeps for it: the part it has not drawn on yet counts as used for
//! everyone else. Each volume has a [`VolumeSpace`]:
//!
//! ```text
//!  charged = referenced (its committed data blocks, volblocksize each, as of the last sync)
//!          + pending    (what its unsynced txgs will allocate, as add_volume_space counted)
//!  unused  = max(0, R - charged - held)      held = its admissions in progress
//! ```
//!
//! `space_pending` includes the unused reservations of every thick volume, so every
//! admission (writes of other volumes, intent-log blocks in the normal class, a new
//! reservation) leaves them free. A thick volume's own change whose cost fits in its
//! unused reservation is admitted without looking at the pool: it converts reserved
//! space into pending space, which leaves the pool's total demand unchanged, so it is
//! never refused for lack of space while the reservation holds. A change that does not
//! fit is admitted like a thin volume's (and the reservation it exhausts is no longer
//! counted). The sync retires a txg's pending bytes and sets `referenced` from the new
//! tree in one step (`VolumeSpace::synced`), so `charged` never jumps. Frees of a thick
//! volume give its space back to its reservation, not to the pool, as in ZFS.
//!
//! Copy-on-write: an overwrite is charged like a new block while its txg is pending
//! (the old copy is freed only after the sync and its deferral); the reservation's
//! estimate (`refreservation_for`) covers the data once plus every indirect block and
//! the object directory's growth, and a txg's overwrites beyond that draw on the free
//! space like any write.

mod space;
pub use space::{admission_cost_bytes, admit_log_block, dirtied_cost_bytes, slop_bytes, Admit, INDIRECT_COST_BYTES};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::env::Env;
use crate::kstat::{Applies, Tunable};
use crate::txg::{TxgState, TXG_SIZE};
use crate::vdev::queue::DirtyGauge;
use crate::Txg;

pub static ZFS_DIRTY_DATA_MAX: Tunable =
    Tunable::new_auto("zfs_dirty_data_max", 1 << 20, 1 << 44, Applies::Live, "dirty data limit in bytes; 0 = auto: min(10% of RAM, 4 GiB) (dsl_pool.c); at most 25% of RAM (zfs_dirty_data_max_max)")
        .bounded(dirty_data_max_bound);

/// OpenZFS caps zfs_dirty_data_max at zfs_dirty_data_max_max, 25% of physical memory
/// (zfs_dirty_data_max_max_percent): dirty data beyond it would hold a quarter of the
/// machine in buffers a sync has not yet written.
fn dirty_data_max_bound(value: u64) -> Result<(), String> {
    let ram = crate::arc::physical_memory_bytes();
    if value > ram / 4 {
        let words = crate::kstat::size_words;
        return Err(format!("value {} is above 25% of the machine's physical memory ({} of {})", words(value), words(ram / 4), words(ram)));
    }
    Ok(())
}
pub static ZFS_DIRTY_DATA_SYNC_PERCENT: Tunable =
    Tunable::new("zfs_dirty_data_sync_percent", 20, 1, 100, Applies::Live, "open-txg dirty percent of max that starts a sync (dsl_pool.c)");
pub static ZFS_DELAY_MIN_DIRTY_PERCENT: Tunable =
    Tunable::new("zfs_delay_min_dirty_percent", 60, 0, 100, Applies::Live, "dirty percent of max where the write delay starts (dmu_tx.c)");
pub static ZFS_DELAY_SCALE: Tunable =
    Tunable::new("zfs_delay_scale", 500_000, 0, 10_000_000_000, Applies::Live, "delay curve scale in ns (dmu_tx.c)");
pub static ZFS_WRITE_THROTTLE_MODE: Tunable = Tunable::new_choice(
    "zfs_write_throttle_mode",
    &["openzfs", "legacy"],
    Applies::Live,
    "Zilla: openzfs = dirty-data delay curve; legacy = the 2008-2013 throttle (txg sized to zfs_txg_synctime_ms of measured bandwidth, 10 ms delay past 7/8, block when full), for comparison",
);
pub static ZFS_TXG_SYNCTIME_MS: Tunable =
    Tunable::new("zfs_txg_synctime_ms", 5000, 100, 60_000, Applies::Live, "legacy throttle: target sync time of a txg in ms (old txg.c)");
pub static ZFS_WRITE_LIMIT_MIN: Tunable =
    Tunable::new("zfs_write_limit_min", 32 << 20, 1 << 20, 1 << 40, Applies::Live, "legacy throttle: smallest txg write limit in bytes (old dsl_pool.c)");
pub static ZFS_WRITE_LIMIT_OVERRIDE: Tunable = Tunable::new_auto(
    "zfs_write_limit_override",
    1 << 20,
    1 << 44,
    Applies::Live,
    "legacy throttle: fixed txg write limit in bytes; 0 = measured from the sync bandwidth (old dsl_pool.c)",
);
fn is_legacy() -> bool {
    ZFS_WRITE_THROTTLE_MODE.get() == 1
}

/// One clock tick of the legacy throttle's delay (HZ = 100).
const LEGACY_TICK_NS: u64 = 10_000_000;
pub static ZFS_DELAY_MAX_NS: Tunable =
    Tunable::new("zfs_delay_max_ns", 100_000_000, 0, 10_000_000_000, Applies::Live, "longest single write delay (dmu_tx.c MSEC2NSEC(100))");

/// Growth of the object directory per block a txg writes or frees: the replaced block's
/// defer-list entry and the split of an allocated extent (16 bytes each), in the two
/// copies of the MOS.
pub const MOS_COST_PER_BLOCK_BYTES: u64 = 64;

/// The object-directory growth of freeing a whole tree of `data_blocks` data blocks and
/// `indirect_blocks` indirect blocks (two copies each) in one txg, as a volume destroy
/// does.
pub fn tree_free_cost_bytes(data_blocks: u64, indirect_blocks: u64) -> u64 {
    (data_blocks + 2 * indirect_blocks) * MOS_COST_PER_BLOCK_BYTES
}

pub fn dirty_data_max() -> u64 {
    match ZFS_DIRTY_DATA_MAX.get() {
        0 => (crate::arc::physical_memory_bytes() / 10).min(4 << 30),
        v => v,
    }
}

/// Legacy throttle: the write limit after a txg of `bytes` synced in `elapsed_ns`:
/// `zfs_txg_synctime_ms` worth of that bandwidth, between `zfs_write_limit_min` and the
/// dirty max.
pub fn legacy_write_limit(bytes: u64, elapsed_ns: u64) -> u64 {
    let per_s = bytes as u128 * 1_000_000_000 / elapsed_ns.max(1) as u128;
    let limit = (per_s * ZFS_TXG_SYNCTIME_MS.get() as u128 / 1000).min(u64::MAX as u128) as u64;
    let max = dirty_data_max();
    limit.clamp(ZFS_WRITE_LIMIT_MIN.get().min(max), max)
}

/// Delay for one write at `dirty` bytes of `max` (dmu_tx_delay).
pub fn delay_ns(dirty: u64, max: u64) -> u64 {
    let min = max * ZFS_DELAY_MIN_DIRTY_PERCENT.get() / 100;
    if dirty <= min {
        return 0;
    }
    if dirty >= max {
        return ZFS_DELAY_MAX_NS.get();
    }
    let d = ZFS_DELAY_SCALE.get() as u128 * (dirty - min) as u128 / (max - dirty) as u128;
    (d as u64).min(ZFS_DELAY_MAX_NS.get())
}

/// What the throttle asks of one write (`DirtyAccounting::claim_delay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteDelay {
    /// Write now.
    None,
    /// This write's turn comes after this long; it was counted as delayed.
    After(Duration),
    /// Use the blocking write: it waits (dirty max, legacy throttle).
    Blocking,
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct ThrottleStats {
    pub dirty_bytes: u64,
    pub dirty_max: u64,
    pub delayed_writes: u64,
    pub blocked_writes: u64,
    /// Legacy mode: writes delayed one tick past 7/8 of the write limit.
    #[serde(default)]
    pub legacy_delayed_writes: u64,
    /// Legacy mode: writes that found the open txg full and waited for the next.
    #[serde(default)]
    pub legacy_txg_full_waits: u64,
    /// Legacy mode: the open txg's write limit (bytes), from the measured bandwidth.
    #[serde(default)]
    pub write_limit_bytes: u64,
    /// Writes and frees that waited for a txg sync because space admission found the
    /// pool too full for them (see [`space`]).
    #[serde(default)]
    pub space_waits: u64,
}

/// Dirty bytes in atomics, so the common case (well below the delay threshold) takes no
/// lock; the mutex is only for writers that must sleep.
pub struct DirtyAccounting {
    /// Clock and sleeps of the delay curve.
    env: Arc<dyn Env>,
    total: AtomicU64,
    per_txg: [AtomicU64; TXG_SIZE],
    /// Env clock (ns) of the last delayed writer's wakeup.
    last_wakeup_ns: Mutex<Option<u64>>,
    blocked_mu: Mutex<()>,
    cv: Condvar,
    delayed: AtomicU64,
    blocked: AtomicU64,
    /// Bytes the open and syncing txgs will allocate when they sync, as admitted: data
    /// blocks at their logical size plus every indirect block they dirty (each written
    /// anew by copy-on-write, in two copies). Space admission counts this, not `total`.
    space_total: AtomicU64,
    space_per_txg: [AtomicU64; TXG_SIZE],
    /// Size of the last object directory written (its next version needs as much).
    mos_bytes: AtomicU64,
    /// Legacy throttle: the open txg's byte limit, and the start of the running sync.
    write_limit_bytes: AtomicU64,
    sync_started_ns: AtomicU64,
    legacy_delayed: AtomicU64,
    legacy_full: AtomicU64,
    /// Bytes of the syncing txg undirtied so far (its size, with the rest at retire).
    undirtied_bytes: AtomicU64,
    space_waits: AtomicU64,
    /// Admissions between their check and their `add_space` (see [`SpaceReservation`]).
    reserved: AtomicU64,
    /// Object-directory growth of destroyed volumes' trees not yet freed by a sync
    /// (every freed block becomes a defer-list entry).
    doomed_bytes: AtomicU64,
    /// `total` and the limit, published for the leaves' async-write ramp (vdev queue).
    gauge: Arc<DirtyGauge>,
    /// The volumes with a reservation (see "Reservations" above).
    thick: Reservations,
}

/// Space an admitted change holds until its cost is counted by `add_space`; released
/// on drop. A hold taken for a volume (`reserve_for`) holds its cost against the
/// volume's reservation too.
pub struct SpaceReservation<'a> {
    acct: &'a DirtyAccounting,
    bytes: u64,
    volume: Option<&'a VolumeSpace>,
    /// The whole cost fits in the volume's unused reservation.
    within_reservation: bool,
}

impl Drop for SpaceReservation<'_> {
    fn drop(&mut self) {
        self.acct.reserved.fetch_sub(self.bytes, Relaxed);
        if let Some(v) = self.volume {
            v.held.fetch_sub(self.bytes, Relaxed);
        }
    }
}

impl DirtyAccounting {
    pub fn new(env: Arc<dyn Env>) -> DirtyAccounting {
        DirtyAccounting {
            env,
            total: AtomicU64::new(0),
            per_txg: std::array::from_fn(|_| AtomicU64::new(0)),
            last_wakeup_ns: Mutex::new(None),
            blocked_mu: Mutex::new(()),
            cv: Condvar::new(),
            delayed: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            space_total: AtomicU64::new(0),
            space_per_txg: std::array::from_fn(|_| AtomicU64::new(0)),
            mos_bytes: AtomicU64::new(0),
            write_limit_bytes: AtomicU64::new(ZFS_WRITE_LIMIT_MIN.get()),
            sync_started_ns: AtomicU64::new(0),
            legacy_delayed: AtomicU64::new(0),
            legacy_full: AtomicU64::new(0),
            undirtied_bytes: AtomicU64::new(0),
            space_waits: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            doomed_bytes: AtomicU64::new(0),
            gauge: Arc::new(DirtyGauge::default()),
            thick: Reservations::default(),
        }
    }

    /// The gauge the pool's leaf queues read their async-write max_active from.
    pub fn gauge(&self) -> &Arc<DirtyGauge> {
        &self.gauge
    }

    fn publish(&self) {
        self.gauge.set(self.total.load(Relaxed), dirty_data_max());
    }

    /// Called before a writer dirties data: apply the delay curve, block at max (or the
    /// legacy throttle, see the module comment). `abort` is polled so shutdown can
    /// release blocked writers.
    pub fn throttle(&self, txg: &TxgState, abort: &dyn Fn() -> bool) {
        let legacy = is_legacy();
        if legacy {
            self.throttle_legacy(txg, abort);
        }
        self.block_at_max(abort);
        let d = if legacy { 0 } else { delay_ns(self.total.load(Relaxed), dirty_data_max()) };
        if d == 0 {
            return;
        }
        self.delayed.fetch_add(1, Relaxed);
        let wake = self.next_wakeup_ns(d);
        self.env.sleep_until_ns(wake);
    }

    /// The hard stop: wait while the dirty total is at the max.
    pub fn block_at_max(&self, abort: &dyn Fn() -> bool) {
        let max = dirty_data_max();
        if self.total.load(Relaxed) >= max {
            self.blocked.fetch_add(1, Relaxed);
            let mut g = self.blocked_mu.lock();
            while self.total.load(Relaxed) >= max && !abort() {
                crate::env::wait_ns(&*self.env, &self.cv, &mut g, 50_000_000);
            }
        }
    }

    /// The wakeup (Env clock) of a writer delayed by `d`: `d` after the previous
    /// delayed writer's wakeup, or after now if that has passed (dmu_tx_delay's
    /// dp_last_wakeup), so the pool admits one delayed write per `d`.
    fn next_wakeup_ns(&self, d: u64) -> u64 {
        let now = self.env.now_ns();
        let mut last = self.last_wakeup_ns.lock();
        let wake = match *last {
            Some(l) if l > now => l + d,
            _ => now + d,
        };
        *last = Some(wake);
        wake
    }

    /// Whether a write of `bytes` now would wait in `throttle` (a delay, the block at
    /// max, or the legacy throttle's tick or full txg): the non-blocking write path
    /// takes only writes for which this is false.
    pub fn would_wait(&self, txg: &TxgState, bytes: u64) -> bool {
        let (total, max) = (self.total.load(Relaxed), dirty_data_max());
        if total >= max {
            return true;
        }
        if is_legacy() {
            let limit = self.legacy_limit();
            return self.txg_dirty(txg.open_txg()) > limit - limit / 8;
        }
        delay_ns(total + bytes, max) > 0
    }

    /// The throttle's verdict for one write of `bytes` about to be made, without
    /// sleeping: the asynchronous form of `throttle`, for front ends that wait on a
    /// timer instead of a thread. `After(d)` claims the write's turn in the delay
    /// schedule (counted as delayed): the caller waits `d`, then writes without a
    /// second delay (zvol's `*_after_delay`). `Blocking`: the dirty max is reached or the
    /// legacy throttle is on and would act; the caller uses the blocking write.
    pub fn claim_delay(&self, txg: &TxgState, bytes: u64) -> WriteDelay {
        if is_legacy() {
            return if self.would_wait(txg, bytes) { WriteDelay::Blocking } else { WriteDelay::None };
        }
        let (total, max) = (self.total.load(Relaxed), dirty_data_max());
        if total >= max {
            return WriteDelay::Blocking;
        }
        let d = delay_ns(total + bytes, max);
        if d == 0 {
            return WriteDelay::None;
        }
        self.delayed.fetch_add(1, Relaxed);
        let wake = self.next_wakeup_ns(d);
        WriteDelay::After(Duration::from_nanos(wake.saturating_sub(self.env.now_ns())))
    }

    fn legacy_limit(&self) -> u64 {
        match ZFS_WRITE_LIMIT_OVERRIDE.get() {
            0 => self.write_limit_bytes.load(Relaxed).max(1),
            v => v,
        }
    }

    /// The 2008-2013 throttle: one tick of delay past 7/8 of the write limit, a wait
    /// for the next txg when the open one is full. The dirty max still holds (the
    /// caller's curve check follows; legacy txgs stay far below it).
    fn throttle_legacy(&self, txg: &TxgState, abort: &dyn Fn() -> bool) {
        let limit = self.legacy_limit();
        let open = txg.open_txg();
        let dirty = self.txg_dirty(open);
        if dirty >= limit {
            self.legacy_full.fetch_add(1, Relaxed);
            txg.kick(open);
            txg.wait_open_past(open, abort);
        } else if dirty > limit - limit / 8 {
            self.legacy_delayed.fetch_add(1, Relaxed);
            self.env.sleep_ns(LEGACY_TICK_NS);
        }
    }

    /// The sync of a txg begins (the legacy throttle times it).
    pub fn begin_sync(&self) {
        self.sync_started_ns.store(self.env.now_ns(), Relaxed);
    }

    /// Legacy throttle: a txg of `bytes` synced in `elapsed_ns`; the next txgs may hold
    /// `zfs_txg_synctime_ms` of that bandwidth (old dsl_pool_sync's dp_write_limit).
    fn note_synced(&self, bytes: u64, elapsed_ns: u64) {
        if bytes < (1 << 20) || elapsed_ns == 0 {
            return; // too small to measure a bandwidth by
        }
        let limit = legacy_write_limit(bytes, elapsed_ns);
        self.write_limit_bytes.store(limit, Relaxed);
    }

    /// `txg` will allocate `bytes` more when it syncs (see `space_total`).
    pub fn add_space(&self, txg: Txg, bytes: u64) {
        self.space_per_txg[txg.ring_slot(TXG_SIZE)].fetch_add(bytes, Relaxed);
        self.space_total.fetch_add(bytes, Relaxed);
    }

    /// Bytes the unsynced txgs will allocate, plus what their object directories need
    /// (two copies of the last one's size, for each of the open and syncing txgs), plus
    /// admissions in progress and the defer entries of destroyed volumes.
    pub fn space_pending(&self) -> u64 {
        let pending = self.space_total.load(Relaxed)
            + 2 * (2 * self.mos_bytes.load(Relaxed) + (64 << 10))
            + self.reserved.load(Relaxed)
            + self.doomed_bytes.load(Relaxed);
        // (a reservation read from a damaged record may be absurd: never overflow)
        pending.saturating_add(self.thick.unused())
    }

    /// Hold `bytes` of pending space for an admission; the caller checks
    /// `space_pending` (which includes it) after taking it, so two admissions never
    /// both fit into the same free bytes.
    pub fn reserve(&self, bytes: u64) -> SpaceReservation<'_> {
        self.reserved.fetch_add(bytes, Relaxed);
        SpaceReservation { acct: self, bytes, volume: None, within_reservation: false }
    }

    /// A writer waits for a sync because space admission refused it for now.
    pub fn note_space_wait(&self) {
        self.space_waits.fetch_add(1, Relaxed);
    }

    /// A destroyed volume's tree waits to be freed; its defer entries need `bytes`.
    pub fn add_doomed(&self, bytes: u64) {
        self.doomed_bytes.fetch_add(bytes, Relaxed);
    }

    /// A sync freed destroyed trees that were counted with `bytes` by `add_doomed`.
    pub fn doomed_freed(&self, bytes: u64) {
        let _ = self.doomed_bytes.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(bytes)));
    }

    /// The sync wrote an object directory of `bytes`.
    pub fn note_mos_bytes(&self, bytes: u64) {
        self.mos_bytes.store(bytes, Relaxed);
    }

    pub fn add(&self, txg: Txg, bytes: u64) {
        self.per_txg[txg.ring_slot(TXG_SIZE)].fetch_add(bytes, Relaxed);
        self.total.fetch_add(bytes, Relaxed);
        self.publish();
    }

    /// The sync of `txg` has written (issued, within its bounded window of writes in
    /// flight) `bytes` of its dirty data and reserved them in the ARC (arc.rs,
    /// "Reservations": the buffers stay in memory until the commit, so the sync
    /// undirties only what the ARC could reserve): they stop counting as dirty now, not
    /// when the whole txg retires. OpenZFS undirties as the sync's writes complete
    /// (dsl_pool_undirty_space); without it the dirty total stays at its peak for a
    /// whole sync, the delay curve reads that peak and stalls every writer for seconds.
    /// Only the syncing txg is undirtied (no writer adds to it any more). A sync that
    /// fails and is retried does not count the undirtied bytes again: the throttle then
    /// under-counts a suspended pool's dirty data until the txg retires.
    pub fn undirty(&self, txg: Txg, bytes: u64) {
        let slot = &self.per_txg[txg.ring_slot(TXG_SIZE)];
        let n = match slot.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(bytes))) {
            Ok(prev) | Err(prev) => prev.min(bytes),
        };
        self.total.fetch_sub(n, Relaxed);
        self.undirtied_bytes.fetch_add(n, Relaxed);
        self.publish();
        let _g = self.blocked_mu.lock();
        self.cv.notify_all();
    }

    pub fn txg_dirty(&self, txg: Txg) -> u64 {
        self.per_txg[txg.ring_slot(TXG_SIZE)].load(Relaxed)
    }

    /// The open txg is big enough that it should be synced now (legacy mode: its
    /// writers kick it at the write limit themselves; the timer does the rest).
    pub fn should_kick(&self, open_txg: Txg) -> bool {
        !is_legacy() && self.txg_dirty(open_txg) >= dirty_data_max() * ZFS_DIRTY_DATA_SYNC_PERCENT.get() / 100
    }

    /// Txg `txg` has been written: its dirty bytes are no longer dirty.
    pub fn retire(&self, txg: Txg) {
        let n = self.per_txg[txg.ring_slot(TXG_SIZE)].swap(0, Relaxed);
        self.total.fetch_sub(n, Relaxed);
        self.publish();
        let txg_bytes = n + self.undirtied_bytes.swap(0, Relaxed);
        let started = self.sync_started_ns.swap(0, Relaxed);
        if started != 0 {
            self.note_synced(txg_bytes, self.env.now_ns().saturating_sub(started));
        }
        let n = self.space_per_txg[txg.ring_slot(TXG_SIZE)].swap(0, Relaxed);
        self.space_total.fetch_sub(n, Relaxed);
        let _g = self.blocked_mu.lock();
        self.cv.notify_all();
    }

    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    pub fn wake_all(&self) {
        let _g = self.blocked_mu.lock();
        self.cv.notify_all();
    }

    pub fn stats(&self) -> ThrottleStats {
        ThrottleStats {
            dirty_bytes: self.total(),
            dirty_max: dirty_data_max(),
            delayed_writes: self.delayed.load(Relaxed),
            blocked_writes: self.blocked.load(Relaxed),
            legacy_delayed_writes: self.legacy_delayed.load(Relaxed),
            legacy_txg_full_waits: self.legacy_full.load(Relaxed),
            write_limit_bytes: self.write_limit_bytes.load(Relaxed),
            space_waits: self.space_waits.load(Relaxed),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reservations

/// What one indirect block of a volume's tree costs when a txg writes it: 128 KiB
/// (dmu's `INDIRECT_SIZE`), in two copies.
const INDIRECT_BLOCK_COST_BYTES: u64 = 2 * (128 << 10);

/// `refreservation=auto` of a volume (`volume create` without `-s`): its size, plus
/// every indirect block of its full tree (two copies each, as written), plus the object
/// directory's growth when every block is written, plus one more path of indirect
/// blocks (a block's admission counts the path it dirties). The counterpart of OpenZFS's
/// `zvol_volsize_to_reservation` (volsize plus its indirect blocks at full size).
pub fn refreservation_for(volsize: u64, volblocksize: u32) -> u64 {
    let mut blocks = volsize.div_ceil(volblocksize.max(1) as u64);
    let data_blocks = blocks;
    let (mut indirects, mut levels) = (0u64, 0u64);
    // 1024 block pointers per indirect block (dmu::EPB), up to the single root
    while blocks > 1 {
        blocks = blocks.div_ceil(1024);
        indirects += blocks;
        levels += 1;
    }
    volsize
        .saturating_add((indirects + levels).saturating_mul(INDIRECT_BLOCK_COST_BYTES))
        .saturating_add((data_blocks + indirects).saturating_mul(MOS_COST_PER_BLOCK_BYTES))
}

/// One volume's space as reservations see it (module comment, "Reservations").
#[derive(Debug, Default)]
pub struct VolumeSpace {
    /// `refreservation` in bytes; 0 = none (a sparse volume).
    reservation: AtomicU64,
    /// Committed data blocks at volblocksize each, as of the last sync.
    referenced: AtomicU64,
    /// `referenced` plus the pending bytes of every unsynced txg.
    charged: AtomicU64,
    pending_per_txg: [AtomicU64; TXG_SIZE],
    /// Costs of admissions in progress (between their check and `add_volume_space`).
    held: AtomicU64,
}

impl VolumeSpace {
    pub fn new(reservation: u64, referenced: u64) -> VolumeSpace {
        let v = VolumeSpace::default();
        v.reservation.store(reservation, Relaxed);
        v.referenced.store(referenced, Relaxed);
        v.charged.store(referenced, Relaxed);
        v
    }

    /// `refreservation` in bytes (0 = none).
    pub fn reservation(&self) -> u64 {
        self.reservation.load(Relaxed)
    }

    /// Whether the volume is thick and its committed data is within its reservation:
    /// its changes may wait for syncs to return the space its own rewrites free,
    /// rather than fail (see space.rs).
    pub fn holds_reservation(&self) -> bool {
        let reservation = self.reservation();
        reservation > 0 && self.referenced() <= reservation
    }

    /// Data bytes of the committed tree (zfs `referenced`).
    pub fn referenced(&self) -> u64 {
        self.referenced.load(Relaxed)
    }

    /// The reservation not drawn on yet by committed data (zfs
    /// `usedbyrefreservation`): what the pool keeps free for this volume.
    pub fn unused_settled(&self) -> u64 {
        self.reservation().saturating_sub(self.referenced())
    }

    /// The reservation not drawn on by committed data, pending txgs and admissions in
    /// progress: what admission keeps free for this volume now.
    fn unused_now(&self) -> u64 {
        self.reservation().saturating_sub(self.charged.load(Relaxed).saturating_add(self.held.load(Relaxed)))
    }

    /// Txg `txg` is committed and the volume's tree holds `referenced` data bytes: the
    /// txg's pending bytes become referenced ones, in one step.
    pub fn synced(&self, txg: Txg, referenced: u64) {
        let retired = self.pending_per_txg[txg.ring_slot(TXG_SIZE)].swap(0, Relaxed);
        let old = self.referenced.swap(referenced, Relaxed);
        // charged += referenced - old - retired, as one atomic step (wrapping arithmetic)
        self.charged.fetch_add(referenced.wrapping_sub(old).wrapping_sub(retired), Relaxed);
    }

    /// The pool's unsynced txgs are dropped (a pool closed without its final sync).
    pub fn drop_pending(&self) {
        for slot in &self.pending_per_txg {
            let n = slot.swap(0, Relaxed);
            self.charged.fetch_sub(n, Relaxed);
        }
    }
}

/// The volumes with a reservation: read lock-free by every admission, changed under a
/// lock by create, destroy, import and `set refreservation`.
#[derive(Default)]
struct Reservations {
    volumes: arc_swap::ArcSwap<Vec<Arc<VolumeSpace>>>,
    writer: Mutex<()>,
}

impl Reservations {
    /// Sum of the unused reservations admission keeps free.
    fn unused(&self) -> u64 {
        self.volumes.load().iter().fold(0, |sum, v| sum.saturating_add(v.unused_now()))
    }

    fn unused_settled(&self) -> u64 {
        self.volumes.load().iter().fold(0, |sum, v| sum.saturating_add(v.unused_settled()))
    }

    /// Put `vol` in the list if it has a reservation, take it out if not (or if
    /// `gone`). The caller holds `writer`.
    fn update(&self, vol: &Arc<VolumeSpace>, gone: bool) {
        let mut list: Vec<Arc<VolumeSpace>> = self.volumes.load().iter().filter(|v| !Arc::ptr_eq(v, vol)).cloned().collect();
        if !gone && vol.reservation() > 0 {
            list.push(vol.clone());
        }
        self.volumes.store(Arc::new(list));
    }
}

/// The pool's space as `zilla get` and `zilla pool list` show it: one reading, so every
/// figure agrees with the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SpaceFigures {
    pub size: u64,
    pub allocated: u64,
    /// Kept free for the sync (spa_slop_shift): no volume writes into it.
    pub slop: u64,
    /// Unused reservations of thick volumes (refreservation - referenced, summed).
    pub reserved: u64,
    /// What a sparse volume may still write (zfs `available` of the pool's datasets):
    /// size - allocated - slop - reserved, at least 0.
    pub available: u64,
}

impl SpaceFigures {
    /// A volume's `available`: the pool's, plus its own unused reservation.
    pub fn available_to(&self, vol: &VolumeSpace) -> u64 {
        self.available.saturating_add(vol.unused_settled())
    }
}

impl DirtyAccounting {
    /// Count a volume from now on (create, import): its reservation is kept free.
    pub fn track_volume(&self, vol: &Arc<VolumeSpace>) {
        let _w = self.thick.writer.lock();
        self.thick.update(vol, false);
    }

    /// A destroyed volume's reservation is released.
    pub fn untrack_volume(&self, vol: &Arc<VolumeSpace>) {
        let _w = self.thick.writer.lock();
        self.thick.update(vol, true);
    }

    /// Set a volume's reservation to `bytes` (0 = none) if the pool can keep the growth
    /// of its unused part free: `(size, unavailable)` as `PoolIo::space` gives them,
    /// `slop` the space writes leave free. `Err(short)`: the pool lacks `short` bytes.
    pub fn set_reservation(&self, vol: &Arc<VolumeSpace>, bytes: u64, size: u64, unavailable: u64, slop: u64) -> std::result::Result<(), u64> {
        let _w = self.thick.writer.lock();
        let charged = vol.charged.load(Relaxed).saturating_add(vol.held.load(Relaxed));
        let growth = bytes.saturating_sub(charged).saturating_sub(vol.unused_now());
        if growth > 0 {
            let need = unavailable.saturating_add(self.space_pending()).saturating_add(slop).saturating_add(growth);
            if need > size {
                return Err(need - size);
            }
        }
        vol.reservation.store(bytes, Relaxed);
        self.thick.update(vol, false);
        Ok(())
    }

    /// Hold `bytes` of pending space for an admission of a change to `vol` (see
    /// `reserve`), against its reservation too: the hold notes whether the whole cost
    /// fits in what the volume has not drawn on yet.
    pub fn reserve_for<'a>(&'a self, vol: &'a VolumeSpace, bytes: u64) -> SpaceReservation<'a> {
        let reservation = vol.reservation();
        if reservation == 0 {
            return self.reserve(bytes); // a sparse volume: nothing to hold against
        }
        self.reserved.fetch_add(bytes, Relaxed);
        let held_before = vol.held.fetch_add(bytes, Relaxed);
        let drawn = vol.charged.load(Relaxed).saturating_add(held_before).saturating_add(bytes);
        SpaceReservation { acct: self, bytes, volume: Some(vol), within_reservation: drawn <= reservation }
    }

    /// Admission of a held change: `(size, unavailable)` as `PoolIo::space` gives them,
    /// `slop` what the change must leave free. A change of a thick volume that fits in
    /// its unused reservation is admitted as it is (it adds nothing to the pool's
    /// demand); any other must fit beside every pending change and every unused
    /// reservation. `Err(short)`: the pool lacks `short` bytes.
    pub fn admit(&self, held: &SpaceReservation<'_>, size: u64, unavailable: u64, slop: u64) -> std::result::Result<(), u64> {
        if held.within_reservation {
            return Ok(());
        }
        let need = unavailable.saturating_add(self.space_pending()).saturating_add(slop);
        if need > size {
            return Err(need - size);
        }
        Ok(())
    }

    /// `txg` will allocate `bytes` more for `vol` when it syncs: `add_space`, and the
    /// volume's charge against its reservation.
    pub fn add_volume_space(&self, vol: &VolumeSpace, txg: Txg, bytes: u64) {
        vol.pending_per_txg[txg.ring_slot(TXG_SIZE)].fetch_add(bytes, Relaxed);
        vol.charged.fetch_add(bytes, Relaxed);
        self.add_space(txg, bytes);
    }

    /// The pool's space figures from `size` and `allocated` bytes of the normal class.
    /// `unavailable` is what space admission counts as taken (allocated, free pieces too
    /// small for a block, intent-log blocks since the last sync: `PoolIo::space`), so
    /// `available` is what a write can be admitted into once pending txgs have synced:
    /// it leaves out the slop, every unused reservation, the object directory's margin
    /// and destroyed volumes not yet freed, exactly as admission does.
    pub fn space_figures(&self, size: u64, allocated: u64, unavailable: u64, slop: u64) -> SpaceFigures {
        let reserved = self.thick.unused_settled();
        let margin = 2 * (2 * self.mos_bytes.load(Relaxed) + (64 << 10)) + self.doomed_bytes.load(Relaxed);
        let taken = unavailable.max(allocated).saturating_add(slop).saturating_add(reserved).saturating_add(margin);
        let available = size.saturating_sub(taken);
        SpaceFigures { size, allocated, slop, reserved, available }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn delay_curve_matches_openzfs_numbers() {
        // brief §11.1: at 70/80/90/95 % of max: 167 µs / 500 µs / 1.5 ms / 3.5 ms
        let max = 1_000_000u64;
        let us = |p: u64| delay_ns(max * p / 100, max) / 1000;
        assert_eq!(us(50), 0);
        assert_eq!(us(70), 166);
        assert_eq!(us(80), 500);
        assert_eq!(us(90), 1500);
        assert_eq!(us(95), 3500);
        assert_eq!(delay_ns(max, max), 100_000_000);
    }

    #[test]
    fn a_reservation_is_kept_from_everyone_but_its_volume() {
        // Goal: the unused part of a reservation counts as pending for every admission
        // but its own volume's, whose changes up to it are admitted on a full pool; the
        // sync turns pending into referenced without changing the figures.
        const M: u64 = 1 << 20;
        // 4096 blocks of 16K: 4 L1 + 1 L2 indirect, 2 levels, + object-directory growth
        assert_eq!(refreservation_for(64 * M, 16384), 64 * M + (5 + 2) * 2 * (128 << 10) + (4096 + 5) * 64);
        assert_eq!(refreservation_for(16384, 16384), 16384 + 64, "one block: no indirects");
        let a = DirtyAccounting::new(crate::env::real());
        let (size, slop) = (100 * M, 4 * M);
        let base = a.space_pending();
        let thick = Arc::new(VolumeSpace::new(0, 0));
        let thin = Arc::new(VolumeSpace::new(0, 0));
        a.set_reservation(&thick, 50 * M, size, 0, slop).unwrap();
        assert_eq!(a.space_pending(), base + 50 * M);
        // a thin change fits exactly beside the reservation, one byte more does not;
        // `available` shows exactly that room
        let room = size - slop - base - 50 * M;
        assert_eq!(a.space_figures(size, 0, 0, slop).available, room);
        assert_eq!(a.admit(&a.reserve_for(&thin, room), size, 0, slop), Ok(()));
        assert_eq!(a.admit(&a.reserve_for(&thin, room + 1), size, 0, slop), Err(1));
        // the thick volume writes its whole reservation into a pool with nothing free
        let held = a.reserve_for(&thick, 50 * M);
        assert_eq!(a.admit(&held, size, size, slop), Ok(()));
        assert!(a.admit(&a.reserve_for(&thick, 1), size, size, slop).is_err(), "past the reservation: checked like any change");
        a.add_volume_space(&thick, Txg(5), 50 * M);
        drop(held);
        assert_eq!(a.space_pending(), base + 50 * M, "reserved space became pending space");
        a.retire(Txg(5));
        thick.synced(Txg(5), 50 * M);
        assert_eq!((thick.referenced(), thick.unused_settled(), thick.unused_now()), (50 * M, 0, 0));
        // growing a reservation must fit; giving it up always works
        assert!(a.set_reservation(&thick, 60 * M, size, size, slop).is_err());
        assert_eq!(thick.reservation(), 50 * M);
        a.set_reservation(&thick, 0, size, size, slop).unwrap();
        assert_eq!(a.space_pending(), base);
    }

    #[test]
    fn a_syncing_txg_is_undirtied_as_it_is_written() {
        let a = DirtyAccounting::new(crate::env::real());
        a.add(Txg(5), 1000);
        a.add(Txg(6), 300);
        a.undirty(Txg(5), 600);
        assert_eq!((a.total(), a.txg_dirty(Txg(5))), (700, 400));
        a.undirty(Txg(5), 900); // never below zero, never another txg's bytes
        assert_eq!((a.total(), a.txg_dirty(Txg(5)), a.txg_dirty(Txg(6))), (300, 0, 300));
        a.retire(Txg(5));
        assert_eq!(a.total(), 300);
    }

    #[test]
    fn legacy_write_limit_is_five_seconds_of_bandwidth_within_bounds() {
        // (the dirty max is auto here: 10 % of RAM, at most 4 GiB)
        let max = dirty_data_max();
        let bounded = |v: u64| v.clamp((32u64 << 20).min(max), max);
        // 100 MB synced in 1 s: 5 s of 100 MB/s
        assert_eq!(legacy_write_limit(100_000_000, 1_000_000_000), bounded(500_000_000));
        // a slow device: never below zfs_write_limit_min
        assert_eq!(legacy_write_limit(2 << 20, 10_000_000_000), bounded(32 << 20));
        // a fast one: never above the dirty max
        assert_eq!(legacy_write_limit(40 << 30, 100_000_000), max);
    }

    #[test]
    fn claimed_delays_follow_the_curve_and_are_spaced_like_sleeping_writers() {
        // Goal: `claim_delay` gives the verdict `throttle` would act on, without
        // sleeping: nothing below the curve's start, a delay spaced after the previous
        // delayed writer's wakeup above it (so N claims admit one write per delay, as N
        // sleeping writers would), the blocking path at the max; `would_wait` agrees.
        // On the virtual clock; openzfs mode (the default) and the auto dirty max.
        let env = std::sync::Arc::new(crate::env::SimEnv::new(3));
        let a = DirtyAccounting::new(env.clone());
        let txg = TxgState::new(Txg(1), env.clone());
        let max = dirty_data_max();
        let len = 8192;
        a.add(Txg(2), max / 2);
        assert_eq!(a.claim_delay(&txg, len), WriteDelay::None);
        assert!(!a.would_wait(&txg, len));
        a.add(Txg(2), max * 30 / 100); // 80 %
        let d = delay_ns(a.total() + len, max);
        assert!(d > 0 && a.would_wait(&txg, len));
        assert_eq!(a.claim_delay(&txg, len), WriteDelay::After(Duration::from_nanos(d)));
        assert_eq!(a.claim_delay(&txg, len), WriteDelay::After(Duration::from_nanos(2 * d)), "spaced after the first");
        assert_eq!(a.claim_delay(&txg, len), WriteDelay::After(Duration::from_nanos(3 * d)));
        assert_eq!(a.stats().delayed_writes, 3);
        // once the last wakeup has passed, a claim starts from now again
        env.sleep_ns(10 * d);
        assert_eq!(a.claim_delay(&txg, len), WriteDelay::After(Duration::from_nanos(d)));
        a.add(Txg(2), max);
        assert_eq!(a.claim_delay(&txg, len), WriteDelay::Blocking, "at the max: the blocking path waits");
        assert!(a.would_wait(&txg, len));
        assert_eq!(a.stats().delayed_writes, 4, "a blocking verdict is not counted as a delay");
    }
}
