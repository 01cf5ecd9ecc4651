//! kstat: counters, power-of-two latency histograms and the tunables registry.
//!
//! Theory of operation
//! -------------------
//! Every subsystem keeps its statistics in plain atomics so that recording a stat on
//! the data path never takes a lock. Latency histograms use the buckets of
//! `zpool iostat -w`: bucket `i` counts samples in `[2^i, 2^(i+1))` nanoseconds, 0..=36
//! (up to ~68 s; larger samples land in the last bucket).
//!
//! Tunables are process-wide (as OpenZFS module parameters are). Each module that owns
//! tunables declares a `pub const TUNABLES: &[TunableDef]` slice with the default and a
//! one-line description that names its source; `registry()` gathers them once. Reading a
//! tunable on a hot path: keep the `&'static AtomicU64` returned by `tunable()`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub const HISTOGRAM_BUCKETS: usize = 37;

/// A log2 latency histogram (nanoseconds), lock-free.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl Histogram {
    pub fn bucket_of(value_ns: u64) -> usize {
        let b = 63 - (value_ns | 1).leading_zeros() as usize;
        b.min(HISTOGRAM_BUCKETS - 1)
    }
    pub fn record(&self, value_ns: u64) {
        self.buckets[Self::bucket_of(value_ns)].fetch_add(1, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> Vec<u64> {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect()
    }
}

/// One tunable's definition: name (OpenZFS name where one exists), default, and a
/// description that states where the default comes from.
#[derive(Debug, Clone, Copy)]
pub struct TunableDef {
    pub name: &'static str,
    pub default: u64,
    pub description: &'static str,
}

pub struct Registry {
    values: BTreeMap<&'static str, (TunableDef, &'static AtomicU64)>,
}

impl Registry {
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).map(|(_, v)| v.load(Ordering::Relaxed))
    }
    pub fn set(&self, name: &str, value: u64) -> crate::Result<()> {
        match self.values.get(name) {
            Some((_, v)) => {
                v.store(value, Ordering::Relaxed);
                Ok(())
            }
            None => Err(crate::Error::invalid(format!("unknown tunable '{name}'"))),
        }
    }
    /// (definition, current value) for every tunable, sorted by name.
    pub fn list(&self) -> Vec<(TunableDef, u64)> {
        self.values.values().map(|(d, v)| (*d, v.load(Ordering::Relaxed))).collect()
    }
    pub fn handle(&self, name: &str) -> &'static AtomicU64 {
        match self.values.get(name) {
            Some((_, v)) => v,
            None => panic!("tunable {name} is not declared in any module's TUNABLES"),
        }
    }
}

fn all_defs() -> Vec<&'static [TunableDef]> {
    vec![
        crate::vdev::TUNABLES,
        crate::vdev::sim::TUNABLES,
        crate::vdev::queue::TUNABLES,
        crate::arc::TUNABLES,
        crate::txg::TUNABLES,
        crate::dsl_pool::TUNABLES,
        crate::scan::TUNABLES,
    ]
}

pub fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut values = BTreeMap::new();
        for defs in all_defs() {
            for d in defs {
                let cell: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(d.default)));
                let old = values.insert(d.name, (*d, cell));
                assert!(old.is_none(), "tunable {} declared twice", d.name);
            }
        }
        Registry { values }
    })
}

/// A tunable's live cell. Panics if no module declares `name` (a programming error).
pub fn tunable(name: &str) -> &'static AtomicU64 {
    registry().handle(name)
}

/// A tunable read on a hot path: the registry lookup happens once, then every read is
/// one relaxed atomic load. Declare as `static X: Tun = Tun::new("name");`.
pub struct Tun {
    name: &'static str,
    cell: OnceLock<&'static AtomicU64>,
}

impl Tun {
    pub const fn new(name: &'static str) -> Tun {
        Tun { name, cell: OnceLock::new() }
    }
    pub fn get(&self) -> u64 {
        self.cell.get_or_init(|| tunable(self.name)).load(Ordering::Relaxed)
    }
}

/// Current value of a tunable.
pub fn tun(name: &str) -> u64 {
    tunable(name).load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn buckets() {
        assert_eq!(Histogram::bucket_of(0), 0);
        assert_eq!(Histogram::bucket_of(1), 0);
        assert_eq!(Histogram::bucket_of(2), 1);
        assert_eq!(Histogram::bucket_of(1023), 9);
        assert_eq!(Histogram::bucket_of(1024), 10);
        assert_eq!(Histogram::bucket_of(u64::MAX), HISTOGRAM_BUCKETS - 1);
    }
    #[test]
    fn registry_has_defaults() {
        let r = registry();
        assert!(r.get("zfs_txg_timeout").is_some());
        assert!(r.set("no_such_tunable", 1).is_err());
    }
}
