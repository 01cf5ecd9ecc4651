//! iostats: per-volume I/O statistics recorded by the front ends.
//!
//! The seam for analytics: a front end resolves a [`VolumeIoStats`] once per session
//! ([`IoStatsTable::volume`]) and records every completed request on it with relaxed
//! atomic adds, so the data path does no lookup and takes no lock. The table is keyed
//! by export name ("POOL/NAME"); entries exist only for exports a client has opened
//! and are dropped by [`IoStatsTable::retain`] when volumes go away, so it is bounded
//! by the number of volumes. Per-client statistics will hang off the same seam (a
//! session handle next to the volume handle) when the analytics work needs them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a request did, as the statistics see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Other,
}

/// Counters of one volume, cumulative since the daemon started.
#[derive(Debug, Default)]
pub struct VolumeIoStats {
    pub read_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_ops: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flush_ops: AtomicU64,
    pub trim_ops: AtomicU64,
    pub trim_bytes: AtomicU64,
    pub other_ops: AtomicU64,
    pub error_ops: AtomicU64,
    /// Sum of request service times (front end receipt to reply queued).
    pub busy_ns: AtomicU64,
}

impl VolumeIoStats {
    /// Record one completed request of `bytes` that took `latency_ns`.
    pub fn record(&self, kind: IoKind, bytes: u64, latency_ns: u64, failed: bool) {
        let (ops, byte_counter) = match kind {
            IoKind::Read => (&self.read_ops, Some(&self.read_bytes)),
            IoKind::Write => (&self.write_ops, Some(&self.write_bytes)),
            IoKind::Flush => (&self.flush_ops, None),
            IoKind::Trim | IoKind::WriteZeroes => (&self.trim_ops, Some(&self.trim_bytes)),
            IoKind::Other => (&self.other_ops, None),
        };
        ops.fetch_add(1, Ordering::Relaxed);
        if let Some(counter) = byte_counter {
            counter.fetch_add(bytes, Ordering::Relaxed);
        }
        if failed {
            self.error_ops.fetch_add(1, Ordering::Relaxed);
        }
        self.busy_ns.fetch_add(latency_ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> VolumeIoSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        VolumeIoSnapshot {
            read_ops: load(&self.read_ops),
            read_bytes: load(&self.read_bytes),
            write_ops: load(&self.write_ops),
            write_bytes: load(&self.write_bytes),
            flush_ops: load(&self.flush_ops),
            trim_ops: load(&self.trim_ops),
            trim_bytes: load(&self.trim_bytes),
            other_ops: load(&self.other_ops),
            error_ops: load(&self.error_ops),
            busy_ns: load(&self.busy_ns),
        }
    }
}

/// Plain copy of [`VolumeIoStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeIoSnapshot {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub flush_ops: u64,
    pub trim_ops: u64,
    pub trim_bytes: u64,
    pub other_ops: u64,
    pub error_ops: u64,
    pub busy_ns: u64,
}

/// Export name to counters.
#[derive(Default)]
pub struct IoStatsTable {
    volumes: Mutex<BTreeMap<String, Arc<VolumeIoStats>>>,
}

impl IoStatsTable {
    /// The counters of `export`, created on first use.
    pub fn volume(&self, export: &str) -> Arc<VolumeIoStats> {
        let Ok(mut volumes) = self.volumes.lock() else { return Arc::default() };
        volumes.entry(export.to_string()).or_default().clone()
    }

    /// Keep only the exports `keep` says still exist.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        if let Ok(mut volumes) = self.volumes.lock() {
            volumes.retain(|name, _| keep(name));
        }
    }

    /// Every volume's counters, sorted by export name.
    pub fn snapshot(&self) -> Vec<(String, VolumeIoSnapshot)> {
        match self.volumes.lock() {
            Ok(volumes) => volumes.iter().map(|(name, stats)| (name.clone(), stats.snapshot())).collect(),
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_per_volume_and_forgets_removed_ones() {
        let table = IoStatsTable::default();
        let a = table.volume("p/a");
        a.record(IoKind::Write, 4096, 10, false);
        a.record(IoKind::Read, 8192, 10, true);
        table.volume("p/b").record(IoKind::Flush, 0, 5, false);
        assert!(Arc::ptr_eq(&a, &table.volume("p/a")));
        let snapshot = table.snapshot();
        assert_eq!(snapshot.len(), 2);
        assert_eq!(snapshot[0].1.write_bytes, 4096);
        assert_eq!(snapshot[0].1.read_bytes, 8192);
        assert_eq!(snapshot[0].1.error_ops, 1);
        assert_eq!(snapshot[1].1.flush_ops, 1);
        table.retain(|name| name != "p/a");
        assert_eq!(table.snapshot().len(), 1);
    }
}
