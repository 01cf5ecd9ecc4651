//! txg: transaction groups.
//!
//! Theory of operation
//! -------------------
//! Every change joins the *open* txg. A txg then passes through three states, each
//! driven by its own step, and the states overlap, so up to three txgs are active at
//! once (as in OpenZFS txg.c):
//!
//! ```text
//!   open T+2      ◄── writers join it through a sharded hold (no pool-wide lock)
//!   quiescing T+1 ──  the quiesce thread closed it and waits for its holders to leave;
//!                     once quiesced it waits for the sync thread to take it
//!   syncing T     ──► the sync thread writes T's dirty blocks and commits uberblock T
//! ```
//!
//! Holds. A writer holds the open txg for the few microseconds it takes to insert its
//! dirty records. The hold counters are sharded (`TXG_HOLD_SHARDS` cache-line-aligned
//! shards, a thread keeps its shard, like OpenZFS's per-CPU `tx_cpu` and `tc_lock`), so
//! writers on different threads touch different locks. To close txg T the quiesce step
//! takes every shard lock (in shard order), opens T+1, releases them, then waits until
//! every shard's count for T drops to zero. A holder reads the open txg under its shard
//! lock, so it either counted itself into T before the close (and is waited for) or sees
//! T+1.
//!
//! Who closes a txg (as OpenZFS's txg_sync_thread / txg_quiesce_thread / txg_kick):
//! - the sync thread, when it is idle and has a reason: somebody waits for the open txg
//!   (`wait_synced`, `request_sync`), `zfs_txg_timeout` seconds passed since the previous
//!   close and the open txg has dirty data, or shutdown with dirty data. It asks the
//!   quiesce thread for the open txg and waits for the hand-off. Waiters therefore batch
//!   into one txg while another syncs, exactly as before the split;
//! - a dirty-data kick (`kick`: the open txg passed `zfs_dirty_data_sync_percent` of
//!   `zfs_dirty_data_max`) prompts the quiesce thread directly, even while a txg syncs:
//!   this is where the three states overlap and throughput comes from.
//! The quiesce thread closes a txg only when the previous quiesced one has been taken by
//! the sync thread, so at most one txg waits between them; the sync thread takes
//! quiesced txgs in order and syncs one at a time.
//!
//! Shutdown. After `begin_shutdown` the sync thread asks for the open txg once more if
//! it has dirty data or was asked for, syncs everything quiesced, and exits when nothing
//! is left and no close is in progress (`sync_done`); the quiesce thread exits after it.
//! A dead sync thread (`fatal`) releases the quiesce thread too.
//!
//! Txg numbers never wrap. A txg read from a device is below `Txg::LIMIT` (2^63; label
//! decode refuses larger ones), and the quiesce thread opens the next txg only through
//! `Txg::checked_next`: a counter that would reach the limit stops the pool with an
//! error (`fatal`) instead of opening txg 0 again, whose uberblocks would lose to the
//! old ones and drop every write after it.
//!
//! History. Every txg's life is kept in a ring of the last `zfs_txg_history` txgs
//! (OpenZFS's /proc/spl/kstat/zfs/POOL/txgs, shown by `zilla txgs`): birth (Env clock,
//! ns), state (O open, Q quiescing, W waiting for the sync thread, S syncing, C
//! committed), the time spent in each state (otime, qtime, wtime, stime), and from the
//! sync thread the txg's dirty bytes when its sync began (ndirty) and the leaf reads and
//! writes completed while it synced (nread, nwritten, reads, writes; everything the
//! leaves did in that window, as OpenZFS counts the root vdev's). The state changes
//! above record themselves; a txg older than the ring is no longer updated.
//!
//! Txg numbers start at TXG_INITIAL; per-txg arrays elsewhere are rings of TXG_SIZE
//! indexed by `txg.ring_slot(TXG_SIZE)` (three active txgs plus one being retired).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::env::{self, Env};
use crate::kstat::{Applies, Tunable};
use crate::{Error, Result, Txg};

pub const TXG_INITIAL: Txg = Txg(4);
pub const TXG_SIZE: usize = 4;
/// Shards of the txg hold counters (a power of two; bounded whatever the core count).
pub const TXG_HOLD_SHARDS: usize = 16;

/// Re-check interval (Env time) of a wait on the txg state whose condition is not
/// always notified (an `abort` callback, the open txg): the wait ends after this long
/// and the caller looks again.
const WAIT_RECHECK_NS: u64 = 10_000_000;
/// Re-check interval of `wait_synced` (every change it waits for is notified).
const WAIT_RECHECK_SLOW_NS: u64 = 100_000_000;
/// Re-check interval of a caller waiting out a suspended pool.
const WAIT_RECHECK_SUSPENDED_NS: u64 = 50_000_000;

pub static ZFS_TXG_TIMEOUT: Tunable =
    Tunable::new("zfs_txg_timeout", 5, 1, 86400, Applies::Live, "seconds between txg syncs when nothing else triggers one (txg.c)");

pub static ZFS_TXG_HISTORY: Tunable = Tunable::new(
    "zfs_txg_history",
    100,
    0,
    10_000,
    Applies::Live,
    "txgs kept in the per-pool txg history (`zilla txgs`, OpenZFS's kstat txgs; 0 keeps none)",
);

/// Where a txg is in its life (the `state` column of OpenZFS's txgs kstat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxgPhase {
    Open,
    Quiescing,
    WaitForSync,
    Syncing,
    Committed,
}

impl TxgPhase {
    /// OpenZFS's one-letter name: O, Q, W, S, C.
    pub fn letter(self) -> char {
        match self {
            TxgPhase::Open => 'O',
            TxgPhase::Quiescing => 'Q',
            TxgPhase::WaitForSync => 'W',
            TxgPhase::Syncing => 'S',
            TxgPhase::Committed => 'C',
        }
    }
}

/// What the sync thread measured while a txg synced (added up over retries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxgSyncIo {
    pub nread_bytes: u64,
    pub nwritten_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// One txg's row of the history; times in Env nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxgRecord {
    pub txg: Txg,
    pub birth_ns: u64,
    pub state: TxgPhase,
    /// Dirty bytes of the txg when its sync began.
    pub ndirty_bytes: u64,
    pub io: TxgSyncIo,
    pub open_ns: u64,
    pub quiesce_ns: u64,
    pub wait_ns: u64,
    pub sync_ns: u64,
    /// When the current state began.
    state_since_ns: u64,
}

/// The bounded ring of the last `zfs_txg_history` txgs, oldest first.
#[derive(Default)]
struct TxgHistory {
    ring: VecDeque<TxgRecord>,
}

impl TxgHistory {
    fn opened(&mut self, txg: Txg, now_ns: u64) {
        let keep = ZFS_TXG_HISTORY.get() as usize;
        if keep == 0 {
            self.ring.clear();
            return;
        }
        while self.ring.len() >= keep {
            self.ring.pop_front();
        }
        let r = TxgRecord {
            txg,
            birth_ns: now_ns,
            state: TxgPhase::Open,
            ndirty_bytes: 0,
            io: TxgSyncIo::default(),
            open_ns: 0,
            quiesce_ns: 0,
            wait_ns: 0,
            sync_ns: 0,
            state_since_ns: now_ns,
        };
        self.ring.push_back(r);
    }

    fn get(&mut self, txg: Txg) -> Option<&mut TxgRecord> {
        self.ring.iter_mut().rev().find(|r| r.txg == txg)
    }

    /// `txg` enters `to`: the time since its last change goes to the state it leaves.
    fn advance(&mut self, txg: Txg, to: TxgPhase, now_ns: u64) {
        let Some(r) = self.get(txg) else { return };
        let spent = now_ns.saturating_sub(r.state_since_ns);
        match r.state {
            TxgPhase::Open => r.open_ns += spent,
            TxgPhase::Quiescing => r.quiesce_ns += spent,
            TxgPhase::WaitForSync => r.wait_ns += spent,
            TxgPhase::Syncing => r.sync_ns += spent,
            TxgPhase::Committed => return,
        }
        r.state = to;
        r.state_since_ns = now_ns;
    }
}

#[derive(Debug)]
struct State {
    synced_txg: Txg,
    /// Closed and quiesced, waiting for the sync thread (ZERO: none).
    quiesced_txg: Txg,
    /// Being synced (ZERO: none).
    syncing_txg: Txg,
    /// Highest txg somebody asked to have synced.
    sync_requested: Txg,
    /// A sync of this txg is wanted once the clock reaches the time (ns): a paced
    /// background pass (`spa/trim`) asks for its next step this way.
    sync_requested_at: (Txg, u64),
    /// Highest txg the sync thread asked the quiesce thread to close.
    quiesce_wanted: Txg,
    /// Highest txg a dirty-data kick asked to close.
    kicked: Txg,
    /// The quiesce thread is closing a txg (between the close and the hand-off).
    quiescing: bool,
    /// Env clock (ns) when the previous txg was closed.
    last_close_ns: u64,
    shutting_down: bool,
    /// The sync thread has exited: nothing quiesced will be taken.
    sync_done: bool,
    /// An error from the last sync (the pool is suspended until it succeeds).
    sync_error: Option<String>,
    /// Sync attempts that ended (committed or failed), and whether one is running:
    /// `retry_sync_now` waits for the outcome of an attempt that began after it.
    attempts_ended: u64,
    attempt_running: bool,
    /// Retries an admin asked the suspended pool's sync thread to make without its
    /// backoff (`retry_sync_now`).
    retry_now: u32,
    /// The sync thread died (a bug): waiters get an error instead of hanging.
    fatal: Option<String>,
}

/// Sync attempts a `retry_sync_now` (`zpool clear`) asks for and waits on.
pub const CLEAR_RETRY_ATTEMPTS: u32 = 3;

/// Why `wait_synced_suspended_for` gave up.
#[derive(Debug)]
pub enum SyncWait {
    /// The pool stayed suspended: the last sync error.
    Suspended(String),
    /// The sync thread stopped (shutdown, a broken invariant).
    Failed(Error),
}

/// One shard of hold counters, on its own cache lines.
#[repr(align(128))]
struct HoldShard {
    /// Holders per txg, indexed by `txg.ring_slot(TXG_SIZE)`.
    count: Mutex<[u64; TXG_SIZE]>,
    /// Signalled when a count drops to zero (the quiesce step waits on it).
    drained: Condvar,
}

pub struct TxgState {
    /// Clock of the txg timer (`zfs_txg_timeout`).
    env: Arc<dyn Env>,
    state: Mutex<State>,
    cv: Condvar,
    /// The open txg (its number); changed only while every shard lock is held.
    open_txg: AtomicU64,
    shards: Box<[HoldShard]>,
    /// Mirror of `state.shutting_down` for the data path (checked on every request).
    shutting_down: AtomicBool,
    /// The last txgs' lives (never locked while `state` is).
    history: Mutex<TxgHistory>,
}

/// Proof that the holder may insert dirty records into txg `txg`; released on drop.
pub struct TxgHold<'a> {
    pub txg: Txg,
    shard: &'a HoldShard,
}

impl Drop for TxgHold<'_> {
    fn drop(&mut self) {
        let mut c = self.shard.count.lock();
        let slot = &mut c[self.txg.ring_slot(TXG_SIZE)];
        *slot -= 1;
        if *slot == 0 {
            self.shard.drained.notify_all();
        }
    }
}

/// This thread's hold shard: assigned round-robin at its first hold, then kept.
fn my_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) % TXG_HOLD_SHARDS);
        }
        s.get()
    })
}

/// Why no txg after `t` can be opened.
fn txg_exhausted(t: Txg) -> String {
    format!("txg {t}: the txg counter reached its limit (2^63); no further txg can be written without wrapping")
}

impl TxgState {
    pub fn new(last_synced: Txg, env: Arc<dyn Env>) -> TxgState {
        let exhausted = last_synced.checked_next().is_none().then(|| txg_exhausted(last_synced));
        let tx = TxgState {
            state: Mutex::new(State {
                synced_txg: last_synced,
                quiesced_txg: Txg::ZERO,
                syncing_txg: Txg::ZERO,
                sync_requested: Txg::ZERO,
                sync_requested_at: (Txg::ZERO, 0),
                quiesce_wanted: Txg::ZERO,
                kicked: Txg::ZERO,
                quiescing: false,
                last_close_ns: env.now_ns(),
                shutting_down: false,
                sync_done: false,
                sync_error: None,
                attempts_ended: 0,
                attempt_running: false,
                retry_now: 0,
                fatal: exhausted,
            }),
            cv: Condvar::new(),
            open_txg: AtomicU64::new(last_synced.checked_next().unwrap_or(last_synced).get()),
            shards: (0..TXG_HOLD_SHARDS).map(|_| HoldShard { count: Mutex::new([0; TXG_SIZE]), drained: Condvar::new() }).collect(),
            shutting_down: AtomicBool::new(false),
            history: Mutex::new(TxgHistory::default()),
            env,
        };
        tx.history.lock().opened(last_synced.checked_next().unwrap_or(last_synced), tx.env.now_ns());
        tx
    }

    fn advance(&self, txg: Txg, to: TxgPhase) {
        self.history.lock().advance(txg, to, self.env.now_ns());
    }

    /// The last `n` txgs of the history, oldest first (never more than
    /// `zfs_txg_history` now, even if it was just lowered).
    pub fn history(&self, n: usize) -> Vec<TxgRecord> {
        let n = n.min(ZFS_TXG_HISTORY.get() as usize);
        let h = self.history.lock();
        h.ring.iter().skip(h.ring.len().saturating_sub(n)).copied().collect()
    }

    /// The sync thread is about to sync `txg`, which holds `ndirty_bytes` dirty bytes.
    pub fn note_sync_start(&self, txg: Txg, ndirty_bytes: u64) {
        if let Some(r) = self.history.lock().get(txg) {
            r.ndirty_bytes = ndirty_bytes;
        }
    }

    /// The leaves completed `io` while `txg` synced (one attempt; retries add up).
    pub fn note_sync_io(&self, txg: Txg, io: TxgSyncIo) {
        if let Some(r) = self.history.lock().get(txg) {
            r.io.nread_bytes += io.nread_bytes;
            r.io.nwritten_bytes += io.nwritten_bytes;
            r.io.reads += io.reads;
            r.io.writes += io.writes;
        }
    }

    /// Join the open txg (one shard lock, held only for the increment).
    pub fn hold(&self) -> TxgHold<'_> {
        let shard = &self.shards[my_shard()];
        let mut c = shard.count.lock();
        let txg = Txg(self.open_txg.load(Ordering::Acquire));
        c[txg.ring_slot(TXG_SIZE)] += 1;
        TxgHold { txg, shard }
    }

    pub fn open_txg(&self) -> Txg {
        Txg(self.open_txg.load(Ordering::Acquire))
    }
    pub fn synced_txg(&self) -> Txg {
        self.state.lock().synced_txg
    }
    /// (quiesced, syncing) txgs, ZERO for none: the txgs active besides the open one.
    pub fn active(&self) -> (Txg, Txg) {
        let s = self.state.lock();
        (s.quiesced_txg, s.syncing_txg)
    }

    /// The open txg `txg` holds enough dirty data to be synced now: close it even while
    /// another txg syncs.
    pub fn kick(&self, txg: Txg) {
        let mut s = self.state.lock();
        if txg > s.kicked {
            s.kicked = txg;
            self.cv.notify_all();
        }
    }

    /// Ask for txg `txg` to be synced soon.
    pub fn request_sync(&self, txg: Txg) {
        let mut s = self.state.lock();
        if txg > s.sync_requested {
            s.sync_requested = txg;
            self.cv.notify_all();
        }
    }

    /// Ask for txg `txg` to be synced once `delay_ns` has passed (the sync thread
    /// re-checks every 10 ms). A later call replaces an earlier one.
    pub fn request_sync_after(&self, txg: Txg, delay_ns: u64) {
        let mut s = self.state.lock();
        s.sync_requested_at = (txg, self.env.now_ns().saturating_add(delay_ns));
        self.cv.notify_all();
    }

    /// Block until txg `txg` is on disk.
    pub fn wait_synced(&self, txg: Txg) -> Result<()> {
        let mut s = self.state.lock();
        if txg > s.sync_requested {
            s.sync_requested = txg;
            self.cv.notify_all();
        }
        while s.synced_txg < txg {
            if let Some(f) = &s.fatal {
                return Err(Error::Io(std::io::Error::other(format!("txg sync thread failed: {f}"))));
            }
            if let Some(e) = &s.sync_error {
                if s.shutting_down {
                    return Err(Error::Io(std::io::Error::other(e.clone())));
                }
            }
            if s.sync_done && s.shutting_down {
                return Err(Error::Shutdown);
            }
            env::wait_ns(&*self.env, &self.cv, &mut s, WAIT_RECHECK_SLOW_NS);
        }
        Ok(())
    }

    /// Like `wait_synced`, but a failed sync of it (the pool suspended, retrying) is an
    /// error at once instead of a wait for the retry to work: for import, which must
    /// not hang on a device that fails.
    pub fn wait_synced_or_failed(&self, txg: Txg) -> Result<()> {
        let mut s = self.state.lock();
        if txg > s.sync_requested {
            s.sync_requested = txg;
            self.cv.notify_all();
        }
        while s.synced_txg < txg {
            if let Some(e) = s.fatal.as_ref().or(s.sync_error.as_ref()) {
                return Err(Error::Io(std::io::Error::other(format!("txg sync failed: {e}"))));
            }
            if s.shutting_down {
                return Err(Error::Shutdown);
            }
            env::wait_ns(&*self.env, &self.cv, &mut s, WAIT_RECHECK_NS);
        }
        Ok(())
    }

    /// Like `wait_synced`, but gives up (false) as soon as `abort()` says so or the sync
    /// thread fails; for background work that must not outlive a pool being stopped.
    pub fn wait_synced_unless(&self, txg: Txg, abort: &dyn Fn() -> bool) -> bool {
        let mut s = self.state.lock();
        if txg > s.sync_requested {
            s.sync_requested = txg;
            self.cv.notify_all();
        }
        while s.synced_txg < txg {
            if abort() || s.fatal.is_some() || s.shutting_down {
                return false;
            }
            env::wait_ns(&*self.env, &self.cv, &mut s, WAIT_RECHECK_NS);
        }
        true
    }

    /// Block until a txg after `txg` is open (the legacy throttle's wait when the open
    /// txg is full), or `abort()` says to stop, or the sync thread failed.
    pub fn wait_open_past(&self, txg: Txg, abort: &dyn Fn() -> bool) {
        let mut s = self.state.lock();
        while self.open_txg() <= txg {
            if abort() || s.fatal.is_some() || s.shutting_down {
                return;
            }
            env::wait_ns(&*self.env, &self.cv, &mut s, WAIT_RECHECK_NS);
        }
    }

    /// Quiesce thread: wait until the open txg is asked for (by the sync thread or a
    /// dirty kick) and the previous quiesced txg was taken, then close it, wait for its
    /// holders and hand it to the sync thread. Returns that txg, or None when the thread
    /// should exit.
    pub fn quiesce_next(&self) -> Option<Txg> {
        let mut s = self.state.lock();
        loop {
            if s.fatal.is_some() || s.sync_done {
                return None;
            }
            let open = self.open_txg();
            if s.quiesced_txg.is_zero() && (s.quiesce_wanted >= open || s.kicked >= open) {
                break;
            }
            self.cv.wait(&mut s);
        }
        if self.open_txg().checked_next().is_none() {
            s.fatal = Some(txg_exhausted(self.open_txg()));
            self.cv.notify_all();
            return None;
        }
        s.quiescing = true;
        s.last_close_ns = self.env.now_ns();
        drop(s);
        let t = self.close_open_txg();
        self.wait_holders(t);
        self.advance(t, TxgPhase::WaitForSync);
        let mut s = self.state.lock();
        s.quiescing = false;
        s.quiesced_txg = t;
        self.cv.notify_all();
        Some(t)
    }

    /// Open the next txg under every shard lock; returns the one closed.
    fn close_open_txg(&self) -> Txg {
        let guards: Vec<_> = self.shards.iter().map(|sh| sh.count.lock()).collect();
        let t = Txg(self.open_txg.load(Ordering::Acquire));
        self.open_txg.store(t.next().get(), Ordering::Release);
        drop(guards);
        let now = self.env.now_ns();
        let mut h = self.history.lock();
        h.advance(t, TxgPhase::Quiescing, now);
        h.opened(t.next(), now);
        t
    }

    /// Wait until no writer holds txg `t`.
    fn wait_holders(&self, t: Txg) {
        let i = t.ring_slot(TXG_SIZE);
        for sh in self.shards.iter() {
            let mut c = sh.count.lock();
            while c[i] > 0 {
                sh.drained.wait(&mut c);
            }
        }
    }

    /// Sync thread: wait for the next quiesced txg and take it, asking the quiesce
    /// thread for the open txg when there is a reason to sync it (a waiter, the timer
    /// with dirty data, a kick, shutdown with dirty data). None: shut down, nothing left.
    pub fn wait_for_sync_work(&self, dirty_kick: &dyn Fn(Txg) -> bool, has_dirty: &dyn Fn(Txg) -> bool) -> Option<Txg> {
        let mut s = self.state.lock();
        loop {
            if !s.quiesced_txg.is_zero() {
                let t = s.quiesced_txg;
                s.quiesced_txg = Txg::ZERO;
                s.syncing_txg = t;
                self.cv.notify_all();
                drop(s);
                self.advance(t, TxgPhase::Syncing);
                return Some(t);
            }
            if s.fatal.is_some() {
                return None;
            }
            let open = self.open_txg();
            let timeout_ns = ZFS_TXG_TIMEOUT.get().max(1).saturating_mul(1_000_000_000);
            let due = self.env.now_ns().saturating_sub(s.last_close_ns) >= timeout_ns;
            let asked = s.quiesce_wanted >= open || s.kicked >= open;
            let paced = s.sync_requested_at.0 >= open && self.env.now_ns() >= s.sync_requested_at.1;
            let want = s.sync_requested >= open || paced || dirty_kick(open) || ((due || s.shutting_down) && has_dirty(open));
            if want && !asked {
                s.quiesce_wanted = open;
                self.cv.notify_all();
            } else if !want && !asked && !s.quiescing && s.shutting_down {
                return None;
            } else if due && !want && !asked {
                s.last_close_ns = self.env.now_ns();
            }
            if want || asked || s.quiescing {
                // the hand-off is notified
                self.cv.wait(&mut s);
            } else {
                // Re-check at least every 10 ms of Env time (dirty_kick is polled too).
                let deadline = (s.last_close_ns + timeout_ns).max(self.env.now_ns() + 10_000_000);
                env::wait_until(&*self.env, &self.cv, &mut s, deadline);
            }
        }
    }

    pub fn mark_synced(&self, txg: Txg) {
        self.advance(txg, TxgPhase::Committed);
        let mut s = self.state.lock();
        s.synced_txg = txg;
        s.syncing_txg = Txg::ZERO;
        s.sync_error = None;
        s.attempts_ended += 1;
        s.attempt_running = false;
        self.cv.notify_all();
    }

    /// Sync thread: an attempt at syncing the current txg begins.
    pub fn note_attempt_start(&self) {
        self.state.lock().attempt_running = true;
    }

    /// Sync thread, after a failed attempt: wait `backoff_ns` before the next one, or
    /// less if an admin asks for a retry now (`retry_sync_now`) or the pool shuts down.
    pub fn wait_retry_backoff(&self, backoff_ns: u64) {
        if self.env.is_simulated() {
            // virtual time moves only when a thread sleeps: sleep it out
            self.env.sleep_ns(backoff_ns);
            let mut s = self.state.lock();
            s.retry_now = s.retry_now.saturating_sub(1);
            return;
        }
        let mut s = self.state.lock();
        let deadline = self.env.now_ns().saturating_add(backoff_ns);
        while s.retry_now == 0 && self.env.now_ns() < deadline {
            env::wait_until(&*self.env, &self.cv, &mut s, deadline);
        }
        s.retry_now = s.retry_now.saturating_sub(1);
    }

    /// `zpool clear` of a suspended pool: ask the sync thread to retry the failed sync
    /// at once, [`CLEAR_RETRY_ATTEMPTS`] times without backoff, and wait (at most
    /// `timeout`) for the outcome of those attempts, all begun after this call. Ok:
    /// one committed (the pool resumes); Err: they failed (the error says why), the
    /// sync thread stopped, or they did not end in time. (The first sync after a failed
    /// flush may fail by design: a mirror child whose earlier flush failed holds all
    /// its writes only from its next consuming flush on.)
    pub fn retry_sync_now(&self, timeout: Duration) -> Result<()> {
        let mut s = self.state.lock();
        // an attempt already running began before the caller cleared anything
        let target = s.attempts_ended + CLEAR_RETRY_ATTEMPTS as u64 + u64::from(s.attempt_running);
        s.retry_now = CLEAR_RETRY_ATTEMPTS;
        self.cv.notify_all();
        let deadline_ns = self.env.now_ns().saturating_add(timeout.as_nanos().min(u64::MAX as u128) as u64);
        while s.attempts_ended < target && s.sync_error.is_some() {
            if let Some(f) = &s.fatal {
                return Err(Error::Io(std::io::Error::other(format!("txg sync thread failed: {f}"))));
            }
            if s.sync_done {
                return Err(Error::Shutdown);
            }
            if self.env.now_ns() >= deadline_ns {
                let e = s.sync_error.clone().unwrap_or_default();
                return Err(Error::Io(std::io::Error::other(format!("the retried sync did not finish within {} s (last error: {e})", timeout.as_secs()))));
            }
            env::wait_until(&*self.env, &self.cv, &mut s, deadline_ns);
        }
        match &s.sync_error {
            Some(e) => Err(Error::Io(std::io::Error::other(e.clone()))),
            None => Ok(()),
        }
    }

    /// The pool's syncs are failing (suspended): the last attempt's error.
    pub fn suspended_by(&self) -> Option<String> {
        self.state.lock().sync_error.clone()
    }

    /// Undo `begin_shutdown` after the sync thread exited on a failed sync (an export
    /// whose final sync failed keeps the pool imported). Returns the txg whose sync
    /// failed, which the caller's new sync thread must sync first (the txgs after it
    /// are still quiesced or open); the caller starts new txg threads.
    pub fn cancel_shutdown(&self) -> Option<Txg> {
        let mut s = self.state.lock();
        s.shutting_down = false;
        s.sync_done = false;
        s.retry_now = 0;
        s.attempt_running = false;
        self.shutting_down.store(false, Ordering::Release);
        let unfinished = (!s.syncing_txg.is_zero() && s.syncing_txg > s.synced_txg).then_some(s.syncing_txg);
        self.cv.notify_all();
        unfinished
    }

    /// `wait_synced` for admin commands: while the pool is suspended (its syncs fail),
    /// wait at most `suspended_for` for a retry to go through, then give up with
    /// [`SyncWait::Suspended`] and the last error.
    pub fn wait_synced_suspended_for(&self, txg: Txg, suspended_for: Duration) -> std::result::Result<(), SyncWait> {
        let mut s = self.state.lock();
        if txg > s.sync_requested {
            s.sync_requested = txg;
            self.cv.notify_all();
        }
        let suspended_for_ns = suspended_for.as_nanos().min(u64::MAX as u128) as u64;
        let mut suspended_since_ns: Option<u64> = None;
        while s.synced_txg < txg {
            if let Some(f) = &s.fatal {
                return Err(SyncWait::Failed(Error::Io(std::io::Error::other(format!("txg sync thread failed: {f}")))));
            }
            match &s.sync_error {
                Some(e) if s.shutting_down => return Err(SyncWait::Failed(Error::Io(std::io::Error::other(e.clone())))),
                Some(e) => {
                    let now = self.env.now_ns();
                    if now.saturating_sub(*suspended_since_ns.get_or_insert(now)) >= suspended_for_ns {
                        return Err(SyncWait::Suspended(e.clone()));
                    }
                }
                None => suspended_since_ns = None,
            }
            if s.sync_done && s.shutting_down {
                return Err(SyncWait::Failed(Error::Shutdown));
            }
            env::wait_ns(&*self.env, &self.cv, &mut s, WAIT_RECHECK_SUSPENDED_NS);
        }
        Ok(())
    }

    /// The sync thread has exited: the quiesce thread must not wait for it.
    pub fn sync_thread_exited(&self) {
        let mut s = self.state.lock();
        s.sync_done = true;
        self.cv.notify_all();
    }

    /// Pool creation synced txg `txg` directly: open the next one.
    pub fn initial_synced(&self, txg: Txg) {
        let mut s = self.state.lock();
        s.synced_txg = txg;
        drop(s);
        let guards: Vec<_> = self.shards.iter().map(|sh| sh.count.lock()).collect();
        self.open_txg.store(txg.next().get(), Ordering::Release);
        drop(guards);
        let now = self.env.now_ns();
        let mut h = self.history.lock();
        for to in [TxgPhase::Quiescing, TxgPhase::WaitForSync, TxgPhase::Syncing, TxgPhase::Committed] {
            h.advance(txg, to, now);
        }
        h.opened(txg.next(), now);
        drop(h);
        self.cv.notify_all();
    }

    pub fn mark_sync_failed(&self, msg: String) {
        let mut s = self.state.lock();
        s.sync_error = Some(msg);
        s.attempts_ended += 1;
        s.attempt_running = false;
        self.cv.notify_all();
    }

    /// The sync thread stopped for good (a broken invariant): nothing syncs again.
    pub fn fatal_error(&self) -> Option<String> {
        self.state.lock().fatal.clone()
    }

    pub fn sync_error(&self) -> Option<String> {
        let s = self.state.lock();
        s.fatal.clone().or_else(|| s.sync_error.clone())
    }

    /// The sync thread is gone: fail every waiter from now on.
    pub fn mark_fatal(&self, msg: String) {
        let mut s = self.state.lock();
        s.fatal = Some(msg);
        self.cv.notify_all();
    }

    pub fn begin_shutdown(&self) {
        let mut s = self.state.lock();
        s.shutting_down = true;
        self.shutting_down.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<TxgState> {
        Arc::new(TxgState::new(TXG_INITIAL.prev(), crate::env::real()))
    }

    /// Quiesce waits for every holder of the closed txg, and a hold taken after the
    /// close joins the next txg.
    #[test]
    fn quiesce_waits_for_holders() {
        let tx = state();
        let t = tx.open_txg();
        let h = tx.hold();
        assert_eq!(h.txg, t);
        tx.kick(t);
        let tx2 = tx.clone();
        let q = std::thread::spawn(move || tx2.quiesce_next());
        // the close happens while we hold t; a new hold lands in t+1
        while tx.open_txg() == t {
            std::thread::yield_now();
        }
        let h2 = tx.hold();
        assert_eq!(h2.txg, t.plus(1));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!q.is_finished(), "quiesce finished while txg {t} was still held");
        assert_eq!(tx.active(), (Txg::ZERO, Txg::ZERO));
        drop(h);
        assert_eq!(q.join().unwrap(), Some(t));
        assert_eq!(tx.active(), (t, Txg::ZERO));
        drop(h2);
    }

    /// The history records each state's time and the sync's numbers, in order, and
    /// keeps only the last `zfs_txg_history` txgs.
    #[test]
    fn history_times_each_state_and_stays_bounded() {
        // Method: a simulated clock advanced by a distinct amount in each state, so
        // each column must hold exactly its own state's time.
        let env = Arc::new(crate::env::SimEnv::new(1));
        let tx = TxgState::new(TXG_INITIAL.prev(), env.clone());
        let (t, born) = (tx.open_txg(), env.now_ns());
        env.advance_ns(1_000);
        tx.kick(t);
        assert_eq!(tx.quiesce_next(), Some(t));
        env.advance_ns(20_000);
        assert_eq!(tx.wait_for_sync_work(&|_| false, &|_| true), Some(t));
        tx.note_sync_start(t, 4096);
        tx.note_sync_io(t, TxgSyncIo { nread_bytes: 512, nwritten_bytes: 8192, reads: 1, writes: 2 });
        tx.note_sync_io(t, TxgSyncIo { nread_bytes: 0, nwritten_bytes: 4096, reads: 0, writes: 1 });
        let mid = tx.history(10);
        assert_eq!(mid.iter().map(|r| (r.txg, r.state.letter())).collect::<Vec<_>>(), vec![(t, 'S'), (t.plus(1), 'O')]);
        env.advance_ns(300_000);
        tx.mark_synced(t);
        let r = tx.history(10)[0];
        assert_eq!((r.birth_ns, r.state, r.ndirty_bytes), (born, TxgPhase::Committed, 4096));
        assert_eq!(r.io, TxgSyncIo { nread_bytes: 512, nwritten_bytes: 12288, reads: 1, writes: 3 });
        // quiesce and the hand-off took no simulated time: all 20 us were W
        assert_eq!((r.open_ns, r.quiesce_ns, r.wait_ns, r.sync_ns), (1_000, 0, 20_000, 300_000));
        assert_eq!(tx.history(1)[0].txg, t.plus(1), "history(n) is the last n");
        ZFS_TXG_HISTORY.set(3).unwrap();
        for i in 1..6 {
            tx.kick(t.plus(i));
            assert_eq!(tx.quiesce_next(), Some(t.plus(i)));
            assert_eq!(tx.wait_for_sync_work(&|_| false, &|_| true), Some(t.plus(i)));
            tx.mark_synced(t.plus(i));
        }
        let kept: Vec<Txg> = tx.history(100).iter().map(|r| r.txg).collect();
        ZFS_TXG_HISTORY.set(100).unwrap();
        assert_eq!(kept, vec![t.plus(4), t.plus(5), t.plus(6)]);
    }

    /// The waits that bound an admin command on a suspended pool (`wait_synced`
    /// giving up, `zpool clear`'s retry) run on the pool's Env clock: under a simulated
    /// clock they end when simulated time passes their bound, in little real time.
    #[test]
    fn suspended_waits_end_on_the_env_clock() {
        // Method: a thread moves the simulated clock a second per real millisecond
        // while the pool is suspended (its sync failed) and nothing retries it; each
        // wait is bounded at 30 simulated seconds.
        let env = Arc::new(crate::env::SimEnv::new(4));
        let tx = TxgState::new(TXG_INITIAL.prev(), env.clone());
        let t = tx.open_txg();
        tx.mark_sync_failed("the device is gone".into());
        let stop = Arc::new(AtomicBool::new(false));
        let mover = {
            let (env, stop) = (env.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                    env.advance_ns(1_000_000_000);
                }
            })
        };
        let bound = Duration::from_secs(30);
        let real = std::time::Instant::now();
        let (start, waited) = (env.now_ns(), tx.wait_synced_suspended_for(t, bound));
        assert!(matches!(&waited, Err(SyncWait::Suspended(e)) if e == "the device is gone"), "{waited:?}");
        assert!(env.now_ns() - start >= 30_000_000_000);
        let start = env.now_ns();
        let retried = tx.retry_sync_now(bound).unwrap_err().to_string();
        assert!(retried.contains("did not finish within 30 s"), "{retried}");
        assert!(env.now_ns() - start >= 30_000_000_000);
        stop.store(true, Ordering::Relaxed);
        mover.join().unwrap();
        assert!(real.elapsed() < Duration::from_secs(20), "60 simulated seconds took {:?}", real.elapsed());
    }

    /// Three txgs active at once: one syncing, one quiesced (closed by a dirty kick
    /// while the other syncs), one open.
    #[test]
    fn three_txgs_overlap() {
        let tx = state();
        let t = tx.open_txg();
        tx.kick(t);
        assert_eq!(tx.quiesce_next(), Some(t));
        assert_eq!(tx.wait_for_sync_work(&|_| false, &|_| true), Some(t));
        tx.kick(t.plus(1));
        assert_eq!(tx.quiesce_next(), Some(t.plus(1)));
        let h = tx.hold();
        assert_eq!(h.txg, t.plus(2));
        assert_eq!(tx.active(), (t.plus(1), t));
        drop(h);
        tx.mark_synced(t);
        assert_eq!(tx.wait_for_sync_work(&|_| false, &|_| true), Some(t.plus(1)));
        tx.mark_synced(t.plus(1));
        assert_eq!(tx.synced_txg(), t.plus(1));
    }

    /// A waiter's txg is closed only when the sync thread asks for it (it is idle), so
    /// waiters that arrive during a sync share the next txg.
    #[test]
    fn waiters_batch_while_a_txg_syncs() {
        let tx = state();
        let t = tx.open_txg();
        let q = {
            let tx = tx.clone();
            std::thread::spawn(move || while tx.quiesce_next().is_some() {})
        };
        tx.request_sync(t);
        assert_eq!(tx.wait_for_sync_work(&|_| false, &|_| true), Some(t));
        // t is syncing; waiters ask for t+1 but nobody closes it yet
        tx.request_sync(t.plus(1));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(tx.open_txg(), t.plus(1), "a waiter closed a txg while another was syncing");
        tx.mark_synced(t);
        // the idle sync thread asks for t+1
        assert_eq!(tx.wait_for_sync_work(&|_| false, &|_| true), Some(t.plus(1)));
        tx.mark_synced(t.plus(1));
        tx.begin_shutdown();
        assert_eq!(tx.wait_for_sync_work(&|_| false, &|_| false), None);
        tx.sync_thread_exited();
        q.join().unwrap();
    }

    /// A quiesced txg not yet taken blocks the next close (at most one in hand-off),
    /// and the sync thread's exit releases the waiting quiesce thread.
    #[test]
    fn one_txg_in_hand_off() {
        let tx = state();
        let t = tx.open_txg();
        tx.kick(t.plus(5));
        assert_eq!(tx.quiesce_next(), Some(t));
        let tx2 = tx.clone();
        let q = std::thread::spawn(move || tx2.quiesce_next());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!q.is_finished(), "closed a second txg before the first was taken");
        assert_eq!(tx.open_txg(), t.plus(1));
        tx.sync_thread_exited();
        assert_eq!(q.join().unwrap(), None);
    }

    /// Holds from many threads spread over the shards and all count.
    #[test]
    fn holds_are_sharded() {
        let tx = state();
        let t = tx.open_txg();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        let h = tx.hold();
                        assert!(h.txg >= t);
                    }
                });
            }
        });
        let idle = tx.shards.iter().filter(|sh| sh.count.lock().iter().all(|&c| c == 0)).count();
        assert_eq!(idle, TXG_HOLD_SHARDS, "every hold was released");
        let mine: std::collections::BTreeSet<usize> =
            (0..4).map(|_| std::thread::spawn(my_shard).join().unwrap()).collect();
        assert!(mine.len() >= 2, "threads share one hold shard: {mine:?}");
        assert!(std::mem::align_of::<HoldShard>() >= 128);
    }
}
