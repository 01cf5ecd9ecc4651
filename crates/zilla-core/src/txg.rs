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
//! Txg numbers start at TXG_INITIAL; per-txg arrays elsewhere are rings of TXG_SIZE
//! indexed by `txg.ring_slot(TXG_SIZE)` (three active txgs plus one being retired).

use std::cell::Cell;
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

pub static ZFS_TXG_TIMEOUT: Tunable =
    Tunable::new("zfs_txg_timeout", 5, 1, 86400, Applies::Live, "seconds between txg syncs when nothing else triggers one (txg.c)");

#[derive(Debug)]
struct State {
    synced_txg: Txg,
    /// Closed and quiesced, waiting for the sync thread (ZERO: none).
    quiesced_txg: Txg,
    /// Being synced (ZERO: none).
    syncing_txg: Txg,
    /// Highest txg somebody asked to have synced.
    sync_requested: Txg,
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
    /// The sync thread died (a bug): waiters get an error instead of hanging.
    fatal: Option<String>,
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

impl TxgState {
    pub fn new(last_synced: Txg, env: Arc<dyn Env>) -> TxgState {
        TxgState {
            state: Mutex::new(State {
                synced_txg: last_synced,
                quiesced_txg: Txg::ZERO,
                syncing_txg: Txg::ZERO,
                sync_requested: Txg::ZERO,
                quiesce_wanted: Txg::ZERO,
                kicked: Txg::ZERO,
                quiescing: false,
                last_close_ns: env.now_ns(),
                shutting_down: false,
                sync_done: false,
                sync_error: None,
                fatal: None,
            }),
            cv: Condvar::new(),
            open_txg: AtomicU64::new(last_synced.next().get()),
            shards: (0..TXG_HOLD_SHARDS).map(|_| HoldShard { count: Mutex::new([0; TXG_SIZE]), drained: Condvar::new() }).collect(),
            shutting_down: AtomicBool::new(false),
            env,
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
            self.cv.wait_for(&mut s, Duration::from_millis(100));
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
            self.cv.wait_for(&mut s, Duration::from_millis(10));
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
            self.cv.wait_for(&mut s, Duration::from_millis(10));
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
            self.cv.wait_for(&mut s, Duration::from_millis(10));
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
        s.quiescing = true;
        s.last_close_ns = self.env.now_ns();
        drop(s);
        let t = self.close_open_txg();
        self.wait_holders(t);
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
                return Some(t);
            }
            if s.fatal.is_some() {
                return None;
            }
            let open = self.open_txg();
            let timeout_ns = ZFS_TXG_TIMEOUT.get().max(1).saturating_mul(1_000_000_000);
            let due = self.env.now_ns().saturating_sub(s.last_close_ns) >= timeout_ns;
            let asked = s.quiesce_wanted >= open || s.kicked >= open;
            let want = s.sync_requested >= open || dirty_kick(open) || ((due || s.shutting_down) && has_dirty(open));
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
        let mut s = self.state.lock();
        s.synced_txg = txg;
        s.syncing_txg = Txg::ZERO;
        s.sync_error = None;
        self.cv.notify_all();
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
        self.cv.notify_all();
    }

    pub fn mark_sync_failed(&self, msg: String) {
        let mut s = self.state.lock();
        s.sync_error = Some(msg);
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
