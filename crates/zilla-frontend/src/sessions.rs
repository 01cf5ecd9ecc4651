//! sessions: the live front-end sessions by export, so an admin operation can count the
//! clients attached to a volume or a pool and ask them to go.
//!
//! Theory of operation
//! -------------------
//! A front end lists a session once its export is chosen (`SessionTable::attach`, after
//! the NBD handshake) and keeps the returned [`SessionGuard`] for the session's
//! lifetime; dropping the guard unlists it. The guard hands out a `watch` receiver that
//! turns true when an admin asks the session to go (`SessionTable::disconnect`): the
//! front end then treats it as its own shutdown (stop reading requests, finish those in
//! flight within the shutdown grace, close). `zilla pool destroy` and `volume destroy`
//! refuse while `count` finds sessions on the pool's or volume's exports, unless forced,
//! and then wait for the sessions they disconnected to be unlisted.
//!
//! Bounded: one entry per live session, and sessions are bounded by the front ends'
//! connection caps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

struct SessionEntry {
    export: String,
    disconnect: watch::Sender<bool>,
}

type Live = Arc<Mutex<HashMap<u64, SessionEntry>>>;

/// The table, also after a panic elsewhere while it was held (its entries stay valid).
fn lock(live: &Live) -> MutexGuard<'_, HashMap<u64, SessionEntry>> {
    live.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every live session of every front end, by id.
#[derive(Default)]
pub struct SessionTable {
    next_id: AtomicU64,
    live: Live,
}

/// A listed session; unlisted on drop.
pub struct SessionGuard {
    id: u64,
    live: Live,
    disconnect: watch::Receiver<bool>,
}

impl SessionGuard {
    /// Turns true when an admin asks this session to disconnect.
    pub fn disconnect_requested(&self) -> watch::Receiver<bool> {
        self.disconnect.clone()
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        lock(&self.live).remove(&self.id);
    }
}

impl SessionTable {
    /// List a session serving export `export` ("POOL/NAME").
    pub fn attach(&self, export: &str) -> SessionGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(false);
        lock(&self.live).insert(id, SessionEntry { export: export.to_string(), disconnect: tx });
        SessionGuard { id, live: self.live.clone(), disconnect: rx }
    }

    /// Live sessions whose export satisfies `matches`.
    pub fn count(&self, matches: &dyn Fn(&str) -> bool) -> usize {
        lock(&self.live).values().filter(|e| matches(&e.export)).count()
    }

    /// Ask every live session whose export satisfies `matches` to disconnect; returns
    /// how many were asked.
    pub fn disconnect(&self, matches: &dyn Fn(&str) -> bool) -> usize {
        let live = lock(&self.live);
        let mut asked = 0;
        for e in live.values().filter(|e| matches(&e.export)) {
            e.disconnect.send_replace(true);
            asked += 1;
        }
        asked
    }
}

/// Does export `export` belong to pool `pool`?
pub fn export_in_pool(export: &str, pool: &str) -> bool {
    export.split_once('/').is_some_and(|(p, _)| p == pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_counted_disconnected_and_unlisted() {
        let t = SessionTable::default();
        let a = t.attach("tank/a");
        let b = t.attach("tank/b");
        let _c = t.attach("other/a");
        assert_eq!(t.count(&|e| export_in_pool(e, "tank")), 2);
        assert_eq!(t.count(&|e| e == "tank/a"), 1);
        assert!(!*a.disconnect_requested().borrow());
        assert_eq!(t.disconnect(&|e| e == "tank/a"), 1);
        assert!(*a.disconnect_requested().borrow());
        assert!(!*b.disconnect_requested().borrow());
        drop(a);
        assert_eq!(t.count(&|e| export_in_pool(e, "tank")), 1);
        assert!(!export_in_pool("tankx/a", "tank"));
    }
}
