//! pools: the pools this daemon knows, by name.
//!
//! Theory of operation
//! -------------------
//! The [`PoolTable`] holds every imported pool (with the time it was imported here,
//! iostat's origin). The daemon is its only writer: create, import, export and destroy
//! change it under the daemon's admin mutex. Everything else only reads it, at the
//! moment it needs a pool: the export registry the front ends share (a volume created
//! a moment ago is served at once, a destroyed one disappears), the web page and
//! /metrics, the memory report. So the daemon, the front ends and the web layer all
//! look down to this module and none of them to another.
//!
//! A pool of the cache file that is not imported here is an [`Unavailable`]: its cache
//! entry and why (shown as UNAVAIL by `pool list`, `pool status` and the web page).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use zilla_core::spa::Pool;
use zilla_core::vdev::LeafSpec;

use crate::api::PoolStatusEntry;
use crate::state_dir::CacheEntry;

/// The imported pools, by name, and the pools of the cache file not imported. Shared
/// with the export registry, which looks a volume up on every new connection so a new
/// volume is exported at once.
#[derive(Default)]
pub struct PoolTable {
    pools: RwLock<BTreeMap<String, Arc<Pool>>>,
    /// Wall-clock ns when each pool was imported here: iostat's first report is the
    /// average since then, as zpool's is since boot.
    opened_ns: RwLock<BTreeMap<String, u64>>,
    /// Cache entries not imported (the import at start failed, held after a stop on a
    /// broken invariant, `--no-import`): kept so a later start retries, dropped when a
    /// pool of that name is created, imported, exported or destroyed.
    unavailable: Mutex<Vec<Unavailable>>,
}

impl PoolTable {
    pub fn get(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools.read().get(name).cloned()
    }
    pub fn all(&self) -> Vec<(String, Arc<Pool>)> {
        self.pools.read().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
    pub fn opened_ns(&self, name: &str) -> u64 {
        self.opened_ns.read().get(name).copied().unwrap_or(0)
    }
    pub fn insert(&self, name: String, pool: Arc<Pool>) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.opened_ns.write().insert(name.clone(), now.as_nanos() as u64);
        self.pools.write().insert(name, pool);
    }
    pub fn remove(&self, name: &str) -> Option<Arc<Pool>> {
        self.opened_ns.write().remove(name);
        self.pools.write().remove(name)
    }

    /// The pools not imported here, all or the one named `pool`, by name.
    pub fn unavailable(&self, pool: Option<&str>) -> Vec<Unavailable> {
        let mut v: Vec<Unavailable> =
            self.unavailable.lock().iter().filter(|u| pool.is_none_or(|p| p == u.entry.name)).cloned().collect();
        v.sort_by(|a, b| a.entry.name.cmp(&b.entry.name));
        v
    }
    pub fn unavailable_entry(&self, name: &str) -> Option<Unavailable> {
        self.unavailable.lock().iter().find(|u| u.entry.name == name).cloned()
    }
    pub fn add_unavailable(&self, u: Unavailable) {
        self.unavailable.lock().push(u);
    }
    /// Forget the pool `name` is not imported; returns what was forgotten.
    pub fn forget_unavailable(&self, name: &str) -> Vec<Unavailable> {
        let mut list = self.unavailable.lock();
        let (gone, kept) = std::mem::take(&mut *list).into_iter().partition(|u| u.entry.name == name);
        *list = kept;
        gone
    }
}

/// A pool in the cache file that this daemon has not imported, and why.
#[derive(Clone)]
pub struct Unavailable {
    pub entry: CacheEntry,
    pub reason: String,
}

impl Unavailable {
    pub fn list_row(&self) -> zilla_core::spa::PoolListRow {
        zilla_core::spa::PoolListRow {
            name: self.entry.name.clone(),
            size: 0,
            alloc: 0,
            free: 0,
            frag_percent: 0,
            cap_percent: 0,
            health: zilla_core::spa::PoolHealth::Unavail,
            ashift: 0,
            avail: 0,
        }
    }

    /// The status of a pool not imported: its cached leaves, all UNAVAIL, and why.
    pub fn status(&self) -> PoolStatusEntry {
        let leaf = |l: &LeafSpec| zilla_core::spa::VdevStatus {
            name: l.display(),
            kind: String::new(),
            role: zilla_core::vdev::Role::Normal,
            state: "UNAVAIL".into(),
            read_errors: 0,
            write_errors: 0,
            cksum_errors: 0,
            note: String::new(),
            children: vec![],
        };
        let status = zilla_core::spa::PoolStatus {
            name: self.entry.name.clone(),
            guid: self.entry.guid,
            state: zilla_core::spa::PoolHealth::Unavail,
            scan: Default::default(),
            trim: Default::default(),
            config: self.entry.leaves.iter().map(leaf).collect(),
            data_errors: 0,
            error_list: vec![],
        };
        PoolStatusEntry { status, unavailable: Some(self.reason.clone()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(name: &str, reason: &str) -> Unavailable {
        Unavailable { entry: CacheEntry::new(name.into(), Default::default(), vec![]), reason: reason.into() }
    }

    #[test]
    fn pools_not_imported_are_listed_by_name_and_forgotten_with_what_they_were() {
        let t = PoolTable::default();
        t.add_unavailable(unavailable("b", "held"));
        t.add_unavailable(unavailable("a", "missing devices"));
        let names = |v: Vec<Unavailable>| v.into_iter().map(|u| u.entry.name).collect::<Vec<_>>();
        assert_eq!(names(t.unavailable(None)), ["a", "b"]);
        assert_eq!(names(t.unavailable(Some("b"))), ["b"]);
        assert!(t.unavailable(Some("c")).is_empty());
        assert_eq!(t.unavailable_entry("a").map(|u| u.reason).as_deref(), Some("missing devices"));
        let gone = t.forget_unavailable("b");
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].reason, "held");
        assert_eq!(names(t.unavailable(None)), ["a"]);
        assert!(t.forget_unavailable("b").is_empty());
        gone.into_iter().for_each(|u| t.add_unavailable(u));
        assert_eq!(names(t.unavailable(None)), ["a", "b"]);
    }
}
