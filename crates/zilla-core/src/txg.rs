//! txg: transaction groups.
//!
//! Theory of operation
//! -------------------
//! Every change joins the *open* txg. The sync thread (spa) periodically *quiesces* it —
//! waits for writers that hold it to finish inserting their dirty records — opens the
//! next one, and *syncs* the quiesced txg to disk. So at any instant there is one open
//! txg accepting writes, at most one being quiesced and at most one syncing (three
//! active at most, as in OpenZFS):
//!
//! ```text
//!   open T+1  ◄── writers (hold: shared lock for the few µs of the insert)
//!   syncing T ──► dirty blocks written, trees rebuilt, uberblock T committed
//! ```
//!
//! A sync starts when `zfs_txg_timeout` seconds passed since the previous one started,
//! when the open txg's dirty data passes `zfs_dirty_data_sync_percent` of
//! `zfs_dirty_data_max` (dsl_pool kicks it), or when someone waits for a txg
//! (`wait_synced`, used by flush and FUA until the intent log exists).
//!
//! Txg numbers start at TXG_INITIAL; per-txg arrays elsewhere are rings of TXG_SIZE
//! indexed by `txg & TXG_MASK`.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};

use crate::env::{self, Env};
use crate::kstat::{Applies, Tunable};
use crate::{Error, Result};

pub const TXG_INITIAL: u64 = 4;
pub const TXG_SIZE: usize = 4;
pub const TXG_MASK: u64 = 3;

pub static ZFS_TXG_TIMEOUT: Tunable =
    Tunable::new("zfs_txg_timeout", 5, 1, 86400, Applies::Live, "seconds between txg syncs when nothing else triggers one (txg.c)");

#[derive(Debug)]
struct State {
    open_txg: u64,
    synced_txg: u64,
    /// Highest txg somebody asked to have synced.
    sync_requested: u64,
    /// Env clock (ns) when the previous sync started.
    last_sync_start_ns: u64,
    shutting_down: bool,
    /// An error from the last sync (the pool is suspended until it succeeds).
    sync_error: Option<String>,
    /// The sync thread died (a bug): waiters get an error instead of hanging.
    fatal: Option<String>,
}

pub struct TxgState {
    /// Clock of the txg timer (`zfs_txg_timeout`).
    env: Arc<dyn Env>,
    state: Mutex<State>,
    /// Mirror of `state.open_txg`, changed only under the exclusive hold lock, so holders
    /// read it without the state mutex.
    open_txg: std::sync::atomic::AtomicU64,
    cv: Condvar,
    hold: RwLock<()>,
    /// Mirror of `state.shutting_down` for the data path (checked on every request).
    shutting_down: std::sync::atomic::AtomicBool,
}

/// Proof that the holder may insert dirty records into txg `txg`.
pub struct TxgHold<'a> {
    pub txg: u64,
    _guard: RwLockReadGuard<'a, ()>,
}

impl TxgState {
    pub fn new(last_synced: u64, env: Arc<dyn Env>) -> TxgState {
        TxgState {
            state: Mutex::new(State {
                open_txg: last_synced + 1,
                synced_txg: last_synced,
                sync_requested: 0,
                last_sync_start_ns: env.now_ns(),
                shutting_down: false,
                sync_error: None,
                fatal: None,
            }),
            cv: Condvar::new(),
            hold: RwLock::new(()),
            open_txg: std::sync::atomic::AtomicU64::new(last_synced + 1),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            env,
        }
    }

    pub fn hold(&self) -> TxgHold<'_> {
        let g = self.hold.read();
        let txg = self.open_txg.load(std::sync::atomic::Ordering::Acquire);
        TxgHold { txg, _guard: g }
    }

    pub fn open_txg(&self) -> u64 {
        self.state.lock().open_txg
    }
    pub fn synced_txg(&self) -> u64 {
        self.state.lock().synced_txg
    }

    /// Ask for txg `txg` to be synced soon (kick).
    pub fn request_sync(&self, txg: u64) {
        let mut s = self.state.lock();
        if txg > s.sync_requested {
            s.sync_requested = txg;
            self.cv.notify_all();
        }
    }

    /// Block until txg `txg` is on disk.
    pub fn wait_synced(&self, txg: u64) -> Result<()> {
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
            self.cv.wait_for(&mut s, Duration::from_millis(100));
        }
        Ok(())
    }

    /// Like `wait_synced`, but gives up (false) as soon as `abort()` says so or the sync
    /// thread fails; for background work that must not outlive a pool being stopped.
    pub fn wait_synced_unless(&self, txg: u64, abort: &dyn Fn() -> bool) -> bool {
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

    /// Sync thread: wait until a txg should be synced; returns the quiesced txg, or None
    /// when shutting down with nothing left to do.
    pub fn wait_for_work(&self, dirty_kick: &dyn Fn(u64) -> bool, has_dirty: &dyn Fn(u64) -> bool) -> Option<u64> {
        let mut s = self.state.lock();
        loop {
            let timeout_ns = ZFS_TXG_TIMEOUT.get().max(1).saturating_mul(1_000_000_000);
            let open = s.open_txg;
            let due = self.env.now_ns().saturating_sub(s.last_sync_start_ns) >= timeout_ns;
            let wanted = s.sync_requested >= open || dirty_kick(open);
            if s.shutting_down {
                if has_dirty(open) || s.sync_requested >= open {
                    break;
                }
                return None;
            }
            if wanted || (due && has_dirty(open)) {
                break;
            }
            if due {
                s.last_sync_start_ns = self.env.now_ns();
            }
            // Re-check at least every 10 ms of Env time (dirty_kick is not notified).
            let deadline = (s.last_sync_start_ns + timeout_ns).max(self.env.now_ns() + 10_000_000);
            env::wait_until(&*self.env, &self.cv, &mut s, deadline);
        }
        s.last_sync_start_ns = self.env.now_ns();
        drop(s);
        // quiesce: wait for every holder of the open txg, then open the next
        let _w = self.hold.write();
        let mut s = self.state.lock();
        let t = s.open_txg;
        s.open_txg += 1;
        self.open_txg.store(s.open_txg, std::sync::atomic::Ordering::Release);
        Some(t)
    }

    pub fn mark_synced(&self, txg: u64) {
        let mut s = self.state.lock();
        s.synced_txg = txg;
        s.sync_error = None;
        self.cv.notify_all();
    }

    /// Pool creation synced txg `txg` directly: open the next one.
    pub fn initial_synced(&self, txg: u64) {
        let mut s = self.state.lock();
        s.synced_txg = txg;
        s.open_txg = txg + 1;
        let _w = self.hold.write();
        self.open_txg.store(txg + 1, std::sync::atomic::Ordering::Release);
        self.cv.notify_all();
    }

    pub fn mark_sync_failed(&self, msg: String) {
        let mut s = self.state.lock();
        s.sync_error = Some(msg);
        self.cv.notify_all();
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
        self.shutting_down.store(true, std::sync::atomic::Ordering::Release);
        self.cv.notify_all();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn notify(&self) {
        self.cv.notify_all();
    }
}
