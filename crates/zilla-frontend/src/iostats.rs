//! iostats: per-volume I/O statistics recorded by the front ends.
//!
//! The seam for analytics: a front end resolves a [`VolumeIoStats`] once per session
//! ([`IoStatsTable::volume`]) and records every completed request on it with relaxed
//! atomic adds, so the data path does no lookup and takes no lock. The table is keyed
//! by export name ("POOL/NAME"); entries exist only for exports a client has opened
//! and are dropped by [`IoStatsTable::retain`] when volumes go away, so it is bounded
//! by the number of volumes.
//!
//! Per-client statistics use the same counters: a front end opens a [`ClientSession`]
//! for each connection that reaches the data phase ([`ClientStatsTable::connect`],
//! keyed by protocol and peer host: the IP address for TCP, `uid N` for a unix socket)
//! and records every request on it as well. The table holds at most `clients_max`
//! entries; a new client beyond that replaces the entry seen longest ago (preferring
//! one with no open connection), so a scan of many source addresses costs a bounded
//! table, not memory. Entries outlive their connections until replaced, so a client
//! that reconnects keeps adding to the same counters.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// Buckets of a [`LatencyHistogram`]: bucket 0 counts requests under 1 us, bucket i
/// those of [2^(i-1), 2^i) us, the last everything from 2^(LATENCY_BUCKETS-2) us
/// (about 16.8 s) on.
pub const LATENCY_BUCKETS: usize = 26;

/// Request latencies in power-of-two microsecond buckets (relaxed atomic adds).
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_ns: AtomicU64,
}

/// Plain copy of a [`LatencyHistogram`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LatencySnapshot {
    /// Requests per bucket (empty in a default snapshot).
    pub buckets: Vec<u64>,
    /// Sum of their latencies.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    pub fn record(&self, latency_ns: u64) {
        let us = latency_ns / 1000;
        let bucket = ((u64::BITS - us.leading_zeros()) as usize).min(LATENCY_BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(latency_ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            buckets: self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }

    /// The upper bound of bucket `i` in seconds (`None`: the last, unbounded).
    pub fn upper_bound_s(i: usize) -> Option<f64> {
        (i + 1 < LATENCY_BUCKETS).then(|| (1u64 << i) as f64 / 1e6)
    }
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
    /// Service times of reads, of writes, and of everything else (flush, trim, ...).
    pub latency_read: LatencyHistogram,
    pub latency_write: LatencyHistogram,
    pub latency_other: LatencyHistogram,
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
        match kind {
            IoKind::Read => &self.latency_read,
            IoKind::Write => &self.latency_write,
            _ => &self.latency_other,
        }
        .record(latency_ns);
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
            latency_read: self.latency_read.snapshot(),
            latency_write: self.latency_write.snapshot(),
            latency_other: self.latency_other.snapshot(),
        }
    }
}

/// Plain copy of [`VolumeIoStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    #[serde(default)]
    pub latency_read: LatencySnapshot,
    #[serde(default)]
    pub latency_write: LatencySnapshot,
    #[serde(default)]
    pub latency_other: LatencySnapshot,
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

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Counters of one client (protocol + peer host), cumulative while it is in the table.
#[derive(Debug, Default)]
pub struct ClientIoStats {
    pub io: VolumeIoStats,
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub first_seen_s: AtomicU64,
    /// Unix seconds of the last connect or disconnect.
    pub last_seen_s: AtomicU64,
}

/// One row of [`ClientStatsTable::snapshot`], and of the admin API's GET /v1/clients
/// (the I/O counters flattened into the row).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientIoSnapshot {
    pub protocol: String,
    pub address: String,
    pub connections_open: u64,
    pub connections_total: u64,
    pub first_seen_s: u64,
    pub last_seen_s: u64,
    #[serde(flatten)]
    pub io: VolumeIoSnapshot,
}

/// A connection's handle on its client's counters; counts the connection open until
/// dropped.
pub struct ClientSession {
    stats: Arc<ClientIoStats>,
}

impl ClientSession {
    pub fn stats(&self) -> &Arc<ClientIoStats> {
        &self.stats
    }
}

impl Drop for ClientSession {
    fn drop(&mut self) {
        self.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
        self.stats.last_seen_s.store(unix_now_s(), Ordering::Relaxed);
    }
}

/// (protocol, address) to counters, at most `clients_max` entries.
pub struct ClientStatsTable {
    clients_max: usize,
    clients: Mutex<HashMap<(String, String), Arc<ClientIoStats>>>,
}

impl ClientStatsTable {
    pub fn new(clients_max: usize) -> ClientStatsTable {
        ClientStatsTable { clients_max: clients_max.max(1), clients: Mutex::default() }
    }

    pub fn clients_max(&self) -> usize {
        self.clients_max
    }

    /// A connection of `address` over `protocol` reached the data phase.
    pub fn connect(&self, protocol: &str, address: &str) -> ClientSession {
        let now = unix_now_s();
        let stats = match self.clients.lock() {
            Ok(mut clients) => {
                let key = (protocol.to_string(), address.to_string());
                if !clients.contains_key(&key) && clients.len() >= self.clients_max {
                    Self::evict_one(&mut clients);
                }
                clients
                    .entry(key)
                    .or_insert_with(|| {
                        let fresh = ClientIoStats::default();
                        fresh.first_seen_s.store(now, Ordering::Relaxed);
                        Arc::new(fresh)
                    })
                    .clone()
            }
            Err(_) => Arc::default(),
        };
        stats.connections_open.fetch_add(1, Ordering::Relaxed);
        stats.connections_total.fetch_add(1, Ordering::Relaxed);
        stats.last_seen_s.store(now, Ordering::Relaxed);
        ClientSession { stats }
    }

    /// Drop the entry seen longest ago, preferring one with no open connection.
    fn evict_one(clients: &mut HashMap<(String, String), Arc<ClientIoStats>>) {
        let victim = clients
            .iter()
            .min_by_key(|(_, c)| {
                let open = c.connections_open.load(Ordering::Relaxed) > 0;
                (open, c.last_seen_s.load(Ordering::Relaxed))
            })
            .map(|(key, _)| key.clone());
        if let Some(key) = victim {
            clients.remove(&key);
        }
    }

    /// Every client's counters, sorted by protocol and address.
    pub fn snapshot(&self) -> Vec<ClientIoSnapshot> {
        let Ok(clients) = self.clients.lock() else { return Vec::new() };
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut rows: Vec<ClientIoSnapshot> = clients
            .iter()
            .map(|((protocol, address), c)| ClientIoSnapshot {
                protocol: protocol.clone(),
                address: address.clone(),
                connections_open: load(&c.connections_open),
                connections_total: load(&c.connections_total),
                first_seen_s: load(&c.first_seen_s),
                last_seen_s: load(&c.last_seen_s),
                io: c.io.snapshot(),
            })
            .collect();
        rows.sort_by(|a, b| (&a.protocol, &a.address).cmp(&(&b.protocol, &b.address)));
        rows
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

    #[test]
    fn client_table_is_bounded_and_keeps_connected_clients() {
        let table = ClientStatsTable::new(2);
        let a = table.connect("nbd", "10.0.0.1");
        a.stats().io.record(IoKind::Write, 4096, 1, false);
        {
            let b = table.connect("nbd", "10.0.0.2");
            assert_eq!(b.stats().connections_open.load(Ordering::Relaxed), 1);
        }
        let again = table.connect("nbd", "10.0.0.1");
        assert!(Arc::ptr_eq(a.stats(), again.stats()), "same client, same counters");
        // Full: the third client replaces the one with no open connection (10.0.0.2).
        let _c = table.connect("nbd", "10.0.0.3");
        let rows = table.snapshot();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].address, "10.0.0.1");
        assert_eq!(rows[0].connections_open, 2);
        assert_eq!(rows[0].connections_total, 2);
        assert_eq!(rows[0].io.write_bytes, 4096);
        assert_eq!(rows[1].address, "10.0.0.3");
        drop((a, again));
        assert_eq!(table.snapshot()[0].connections_open, 0);
        // Even with every entry connected, a new client gets a row (the table never grows).
        let _d = table.connect("nbd", "10.0.0.4");
        let _e = table.connect("nbd", "10.0.0.5");
        assert_eq!(table.snapshot().len(), 2);
    }
}
