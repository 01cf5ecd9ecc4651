//! iostats: what every completed front-end request leaves for statistics.
//!
//! Theory of operation
//! -------------------
//! Recording must cost the data path no lock and no cache line another connection
//! writes. So every session (one connection's [`crate::Executor`]) owns a [`Recorder`]:
//! per kind of request (read, write, flush, ...), its count, bytes, failures, summed
//! latency, a latency histogram and (reads and writes) a size histogram, all relaxed
//! atomic adds on the session's own memory. The executor records there, at the one
//! place every request completes ([`crate::executor`]'s `Shared::finish`); nothing
//! else on the data path touches statistics.
//!
//! The session registers its recorder once, at connect time, in the [`IoStatsTable`]
//! with what it is: protocol, export ("POOL/NAME") and client. Readers sum: a volume's,
//! a client's or a protocol's totals are what its ended sessions left ("retired"
//! totals, folded in when a session ends) plus its live sessions' recorders, summed
//! when asked (`/metrics`, `/v1/clients`, the analytics collector once a second). Sums
//! only grow while a key exists, so a collector's per-second delta of two sums is the
//! I/O of that second, however sessions came and went in between.
//!
//! ```text
//!   session A ──record──> Recorder A ─┐ live (registered at connect)
//!   session B ──record──> Recorder B ─┤
//!                                     ├──> IoStatsTable::{volume,protocol,client}_totals
//!   ended sessions ──fold at end──> retired totals per volume / protocol / client
//! ```
//!
//! Histograms use the analytics buckets: log-linear, four per power of two of
//! nanoseconds (bytes for sizes), from 1 us to about 17 s ([`bucket_of`]); they fold
//! exactly into `zpool iostat -w`'s power-of-two buckets ([`fold_to_log2`]).
//!
//! Bounds: a recorder is [`Recorder::BYTES`] (about 6.5 KiB), one per session, and
//! sessions are bounded by the front ends' connection limits. Retired totals exist per
//! volume (dropped by [`IoStatsTable::retain`] when volumes go away), per protocol,
//! and per client in the [`ClientStatsTable`], which holds at most `clients_max`
//! entries: a new client beyond that replaces the entry seen longest ago (preferring
//! one with no open connection); what the row's ended sessions left moves to the
//! table's evicted sum, and its sessions still open count there from then on, so a
//! collector still counts every request once. A session still open when its volume is
//! destroyed stops counting for that volume (a new volume of the name starts at zero);
//! the volume's totals at that moment wait, in order, for the collector's next look
//! ([`IoStatsTable::volume_look`], at most [`GONE_VOLUMES_MAX`]), so the I/O it did
//! since the collector's last look is counted too. A client is its TCP peer address,
//! `uid N` on a Unix socket, or its iSCSI initiator name.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

pub use zilla_core::kstat::buckets::{bucket_of, fold_to_log2, BUCKETS};

/// What a request did, as the statistics see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Other,
}

impl IoKind {
    pub const ALL: [IoKind; 6] = [IoKind::Read, IoKind::Write, IoKind::Flush, IoKind::Trim, IoKind::WriteZeroes, IoKind::Other];

    /// The analytics name of the kind (the `op` breakdown's key).
    pub fn name(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
            IoKind::Trim => "trim",
            IoKind::WriteZeroes => "write_zeroes",
            IoKind::Other => "other",
        }
    }
}

const KINDS: usize = IoKind::ALL.len();

/// One kind's cells in a [`Recorder`].
struct KindCells {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_ns: AtomicU64,
    latency: [AtomicU64; BUCKETS],
}

impl Default for KindCells {
    fn default() -> KindCells {
        KindCells {
            ops: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency_ns: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The statistics one session records on: its own memory, written by whichever thread
/// completes one of its requests, read by the collectors. Aligned so no other
/// session's recorder shares its first or last cache line.
#[repr(align(128))]
pub struct Recorder {
    kinds: [KindCells; KINDS],
    /// Transfer sizes of reads and writes.
    sizes: [[AtomicU64; BUCKETS]; 2],
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder {
            kinds: std::array::from_fn(|_| KindCells::default()),
            sizes: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

impl Recorder {
    /// What one recorder holds.
    pub const BYTES: usize = std::mem::size_of::<Recorder>();

    /// Record one completed request of `bytes` that took `latency_ns`. A failed one
    /// transferred nothing: it adds no bytes (its size still goes in the histogram).
    pub fn record(&self, kind: IoKind, bytes: u64, latency_ns: u64, failed: bool) {
        let cells = &self.kinds[kind as usize];
        cells.ops.fetch_add(1, Ordering::Relaxed);
        if !failed {
            cells.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        cells.latency_ns.fetch_add(latency_ns, Ordering::Relaxed);
        cells.latency[bucket_of(latency_ns)].fetch_add(1, Ordering::Relaxed);
        if failed {
            cells.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(sizes) = self.sizes.get(kind as usize) {
            sizes[bucket_of(bytes)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Add what this recorder holds to `into`.
    pub fn add_to(&self, into: &mut IoTotals) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (cells, kind) in self.kinds.iter().zip(into.kinds.iter_mut()) {
            kind.ops += load(&cells.ops);
            kind.bytes += load(&cells.bytes);
            kind.errors += load(&cells.errors);
            kind.latency_ns += load(&cells.latency_ns);
            for (cell, sum) in cells.latency.iter().zip(kind.latency.iter_mut()) {
                *sum += load(cell);
            }
        }
        for (cells, sums) in self.sizes.iter().zip(into.sizes.iter_mut()) {
            for (cell, sum) in cells.iter().zip(sums.iter_mut()) {
                *sum += load(cell);
            }
        }
    }
}

/// Totals of one kind of request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindTotals {
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Sum of the requests' latencies.
    pub latency_ns: u64,
    /// Latencies in [`bucket_of`]'s buckets.
    pub latency: [u64; BUCKETS],
}

impl Default for KindTotals {
    fn default() -> KindTotals {
        KindTotals { ops: 0, bytes: 0, errors: 0, latency_ns: 0, latency: [0; BUCKETS] }
    }
}

/// Plain sums of recorders: per kind (indexed by `IoKind as usize`), and the transfer
/// sizes of reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoTotals {
    pub kinds: [KindTotals; KINDS],
    pub sizes: [[u64; BUCKETS]; 2],
}

impl Default for IoTotals {
    fn default() -> IoTotals {
        IoTotals { kinds: std::array::from_fn(|_| KindTotals::default()), sizes: [[0; BUCKETS]; 2] }
    }
}

impl IoTotals {
    pub fn kind(&self, kind: IoKind) -> &KindTotals {
        &self.kinds[kind as usize]
    }

    pub fn add(&mut self, other: &IoTotals) {
        for (a, b) in self.kinds.iter_mut().zip(&other.kinds) {
            a.ops += b.ops;
            a.bytes += b.bytes;
            a.errors += b.errors;
            a.latency_ns += b.latency_ns;
            a.latency.iter_mut().zip(&b.latency).for_each(|(x, y)| *x += y);
        }
        for (a, b) in self.sizes.iter_mut().zip(&other.sizes) {
            a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        }
    }

    /// The flat view the admin API and /metrics show.
    pub fn snapshot(&self) -> VolumeIoSnapshot {
        let k = |kind| self.kind(kind);
        let (trim, zeroes) = (k(IoKind::Trim), k(IoKind::WriteZeroes));
        let latency = |kinds: &[IoKind]| {
            let mut s = LatencySnapshot { buckets: vec![0; BUCKETS], sum_ns: 0 };
            for &kind in kinds {
                s.sum_ns += k(kind).latency_ns;
                s.buckets.iter_mut().zip(&k(kind).latency).for_each(|(x, y)| *x += y);
            }
            s
        };
        VolumeIoSnapshot {
            read_ops: k(IoKind::Read).ops,
            read_bytes: k(IoKind::Read).bytes,
            write_ops: k(IoKind::Write).ops,
            write_bytes: k(IoKind::Write).bytes,
            flush_ops: k(IoKind::Flush).ops,
            trim_ops: trim.ops + zeroes.ops,
            trim_bytes: trim.bytes + zeroes.bytes,
            other_ops: k(IoKind::Other).ops,
            error_ops: self.kinds.iter().map(|t| t.errors).sum(),
            busy_ns: self.kinds.iter().map(|t| t.latency_ns).sum(),
            latency_read: latency(&[IoKind::Read]),
            latency_write: latency(&[IoKind::Write]),
            latency_other: latency(&[IoKind::Flush, IoKind::Trim, IoKind::WriteZeroes, IoKind::Other]),
        }
    }
}

/// A latency histogram as the admin API shows it: [`bucket_of`]'s buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LatencySnapshot {
    /// Requests per bucket (empty in a default snapshot).
    pub buckets: Vec<u64>,
    /// Sum of their latencies.
    pub sum_ns: u64,
}

impl LatencySnapshot {
    /// Folded into power-of-two buckets: (upper bound in seconds, count), the first
    /// for everything under 2^10 ns, the last (`None`) unbounded.
    pub fn log2_buckets(&self) -> Vec<(Option<f64>, u64)> {
        let mut out: Vec<(Option<f64>, u64)> = (9..=34).map(|j| (Some((1u64 << (j + 1)) as f64 / 1e9), 0)).collect();
        if let Some(last) = out.last_mut() {
            last.0 = None;
        }
        for (i, &n) in self.buckets.iter().enumerate().take(BUCKETS) {
            out[fold_to_log2(i) - 9].1 += n;
        }
        out
    }
}

/// The flat totals of a volume, a client or a protocol.
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

/// What a session is, for the statistics: set once, at connect time.
#[derive(Clone)]
pub struct SessionLabels {
    /// "nbd" or "iscsi" (or a test's name).
    pub protocol: &'static str,
    /// The client's row ([`ClientStatsTable::connect`]); `None` records no client.
    pub client: Option<Arc<ClientIoStats>>,
}

impl SessionLabels {
    /// A session of no client (tests, tools).
    pub fn anonymous(protocol: &'static str) -> SessionLabels {
        SessionLabels { protocol, client: None }
    }
}

/// One live session in the table.
struct LiveSession {
    export: Arc<str>,
    labels: SessionLabels,
    recorder: Arc<Recorder>,
    /// Its volume went away while it lived ([`IoStatsTable::retain`]): its I/O no
    /// longer counts for the volume (a new volume of the same name starts from zero).
    volume_forgotten: bool,
}

#[derive(Default)]
struct TableInner {
    next_id: u64,
    live: BTreeMap<u64, LiveSession>,
    /// What ended sessions left, per export and per protocol.
    retired_volumes: BTreeMap<Arc<str>, IoTotals>,
    retired_protocols: BTreeMap<&'static str, IoTotals>,
    /// Volumes gone ([`IoStatsTable::retain`]) since the collector last looked, in
    /// order, with their totals then (at most [`GONE_VOLUMES_MAX`], the oldest dropped).
    gone_volumes: std::collections::VecDeque<(Arc<str>, IoTotals)>,
}

/// Gone volumes kept for the collector's next look.
pub const GONE_VOLUMES_MAX: usize = 256;

/// The sessions' recorders and what ended sessions left (see the module comment).
#[derive(Default)]
pub struct IoStatsTable {
    inner: Mutex<TableInner>,
}

/// A session's place in the [`IoStatsTable`]: its recorder, and its registration until
/// [`IoStatsTable::retire`].
pub struct Registration {
    pub id: u64,
    pub recorder: Arc<Recorder>,
}

impl IoStatsTable {
    /// The table, also after a panic elsewhere while it was held (sums stay valid).
    fn lock(&self) -> MutexGuard<'_, TableInner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Register a session on `export`; its recorder counts from zero.
    pub fn register(&self, export: &str, labels: SessionLabels) -> Registration {
        let recorder = Arc::new(Recorder::default());
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.live.insert(id, LiveSession { export: Arc::from(export), labels, recorder: recorder.clone(), volume_forgotten: false });
        Registration { id, recorder }
    }

    /// The session ended: fold its recorder into its volume's, protocol's and client's
    /// retired totals.
    pub fn retire(&self, id: u64) {
        let mut inner = self.lock();
        let Some(session) = inner.live.remove(&id) else { return };
        let mut totals = IoTotals::default();
        session.recorder.add_to(&mut totals);
        if !session.volume_forgotten {
            inner.retired_volumes.entry(session.export.clone()).or_default().add(&totals);
        }
        inner.retired_protocols.entry(session.labels.protocol).or_default().add(&totals);
        if let Some(client) = &session.labels.client {
            client.add_retired(&totals);
        }
    }

    /// Keep only the exports `keep` says still exist: the others' retired totals are
    /// dropped, and sessions still open on them stop counting for them.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        let mut inner = self.lock();
        let mut gone: BTreeMap<Arc<str>, IoTotals> = BTreeMap::new();
        let TableInner { live, retired_volumes, .. } = &mut *inner;
        retired_volumes.retain(|name, totals| {
            let kept = keep(name);
            if !kept {
                gone.insert(name.clone(), std::mem::take(totals));
            }
            kept
        });
        for session in live.values_mut().filter(|s| !s.volume_forgotten) {
            if !keep(&session.export) {
                session.volume_forgotten = true;
                session.recorder.add_to(gone.entry(session.export.clone()).or_default());
            }
        }
        for entry in gone {
            if inner.gone_volumes.len() >= GONE_VOLUMES_MAX {
                inner.gone_volumes.pop_front();
            }
            inner.gone_volumes.push_back(entry);
        }
    }

    /// The collector's look: every volume's totals (as [`Self::volume_totals`]) and
    /// the volumes gone since its last look with their totals when they went, in
    /// order (taken: the next look starts a new list). The I/O a volume did between
    /// a look and its end is in the second list.
    pub fn volume_look(&self) -> (Vec<(String, IoTotals)>, Vec<(Arc<str>, IoTotals)>) {
        let mut inner = self.lock();
        let gone = std::mem::take(&mut inner.gone_volumes).into_iter().collect();
        (Self::volume_sums(&inner), gone)
    }

    /// Totals per export (retired plus live), sorted by export name.
    pub fn volume_totals(&self) -> Vec<(String, IoTotals)> {
        Self::volume_sums(&self.lock())
    }

    fn volume_sums(inner: &TableInner) -> Vec<(String, IoTotals)> {
        let mut sums: BTreeMap<&str, IoTotals> = inner.retired_volumes.iter().map(|(n, t)| (&**n, t.clone())).collect();
        for s in inner.live.values().filter(|s| !s.volume_forgotten) {
            s.recorder.add_to(sums.entry(&s.export).or_default());
        }
        sums.into_iter().map(|(n, t)| (n.to_string(), t)).collect()
    }

    /// Totals per protocol (retired plus live).
    pub fn protocol_totals(&self) -> BTreeMap<&'static str, IoTotals> {
        let inner = self.lock();
        let mut sums = inner.retired_protocols.clone();
        for s in inner.live.values() {
            s.recorder.add_to(sums.entry(s.labels.protocol).or_default());
        }
        sums
    }

    /// The flat totals of one export (zero if it has none).
    pub fn volume_snapshot(&self, export: &str) -> VolumeIoSnapshot {
        self.volume_totals().into_iter().find(|(n, _)| n == export).map(|(_, t)| t.snapshot()).unwrap_or_default()
    }

    /// The flat totals of every export, sorted by name.
    pub fn snapshot(&self) -> Vec<(String, VolumeIoSnapshot)> {
        self.volume_totals().into_iter().map(|(n, t)| (n, t.snapshot())).collect()
    }
}

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// One client's row (protocol + address): its connections, and what its ended sessions
/// left (its live sessions' recorders are in the [`IoStatsTable`]).
#[derive(Debug, Default)]
pub struct ClientIoStats {
    /// (protocol, address).
    pub key: (String, String),
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub first_seen_s: AtomicU64,
    /// Unix seconds of the last connect or disconnect.
    pub last_seen_s: AtomicU64,
    /// What this client's ended sessions left, while the row is in the table.
    retired: Mutex<IoTotals>,
    /// The row was evicted (set under `retired`'s lock): sessions that end later
    /// add to the table's evicted sum instead, and live ones count there.
    evicted: AtomicBool,
    /// The table's evicted sum.
    evicted_sum: Arc<Mutex<IoTotals>>,
}

impl ClientIoStats {
    /// A session of this client ended leaving `totals`.
    fn add_retired(&self, totals: &IoTotals) {
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        if self.evicted.load(Ordering::Relaxed) {
            self.evicted_sum.lock().unwrap_or_else(|p| p.into_inner()).add(totals);
        } else {
            retired.add(totals);
        }
    }

    /// The row leaves the table: what it holds moves to the evicted sum.
    fn evict(&self) {
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        self.evicted.store(true, Ordering::Relaxed);
        self.evicted_sum.lock().unwrap_or_else(|p| p.into_inner()).add(&retired);
        *retired = IoTotals::default();
    }

    fn retired(&self) -> IoTotals {
        self.retired.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
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

/// A connection's handle on its client's row; counts the connection open until dropped.
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

/// (protocol, address) to rows, at most `clients_max` entries.
pub struct ClientStatsTable {
    clients_max: usize,
    clients: Mutex<HashMap<(String, String), Arc<ClientIoStats>>>,
    /// What the evicted rows' ended sessions left: a collector's per-second deltas
    /// keep the I/O of a client evicted before its next look (counted as `other`).
    evicted: Arc<Mutex<IoTotals>>,
}

impl ClientStatsTable {
    pub fn new(clients_max: usize) -> ClientStatsTable {
        ClientStatsTable { clients_max: clients_max.max(1), clients: Mutex::default(), evicted: Arc::default() }
    }

    pub fn clients_max(&self) -> usize {
        self.clients_max
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Arc<ClientIoStats>>> {
        self.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A connection of `address` over `protocol` reached the data phase.
    pub fn connect(&self, protocol: &str, address: &str) -> ClientSession {
        let now = unix_now_s();
        let stats = {
            let mut clients = self.lock();
            let key = (protocol.to_string(), address.to_string());
            if !clients.contains_key(&key) && clients.len() >= self.clients_max {
                if let Some(victim) = Self::evict_one(&mut clients) {
                    victim.evict();
                }
            }
            clients
                .entry(key.clone())
                .or_insert_with(|| {
                    let fresh = ClientIoStats { key, evicted_sum: self.evicted.clone(), ..ClientIoStats::default() };
                    fresh.first_seen_s.store(now, Ordering::Relaxed);
                    Arc::new(fresh)
                })
                .clone()
        };
        stats.connections_open.fetch_add(1, Ordering::Relaxed);
        stats.connections_total.fetch_add(1, Ordering::Relaxed);
        stats.last_seen_s.store(now, Ordering::Relaxed);
        ClientSession { stats }
    }

    /// Drop the entry seen longest ago, preferring one with no open connection; the
    /// row dropped.
    fn evict_one(clients: &mut HashMap<(String, String), Arc<ClientIoStats>>) -> Option<Arc<ClientIoStats>> {
        let victim = clients
            .iter()
            .min_by_key(|(_, c)| {
                let open = c.connections_open.load(Ordering::Relaxed) > 0;
                (open, c.last_seen_s.load(Ordering::Relaxed))
            })
            .map(|(key, _)| key.clone());
        clients.remove(&victim?)
    }

    /// The I/O of every evicted row: what their ended sessions left plus their live
    /// sessions in `io` (only grows).
    pub fn evicted_totals(&self, io: &IoStatsTable) -> IoTotals {
        self.look(io).1
    }

    /// Every client's totals (retired plus the live sessions in `io`), sorted by
    /// protocol and address.
    pub fn totals(&self, io: &IoStatsTable) -> Vec<(Arc<ClientIoStats>, IoTotals)> {
        self.look(io).0
    }

    /// Every row's totals (as [`Self::totals`]) and the evicted sum (as
    /// [`Self::evicted_totals`]) at one instant: no row is evicted and no session ends
    /// while they are summed, so every request is in exactly one of them (a collector
    /// that subtracts two looks counts it once).
    pub fn look(&self, io: &IoStatsTable) -> (Vec<(Arc<ClientIoStats>, IoTotals)>, IoTotals) {
        // lock order: clients, then the io table (retire), then a row's retired totals
        let clients = self.lock();
        let live = io.lock();
        let mut evicted = self.evicted.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut sums: HashMap<*const ClientIoStats, IoTotals> = HashMap::new();
        for s in live.live.values() {
            let Some(client) = &s.labels.client else { continue };
            if client.evicted.load(Ordering::Relaxed) {
                s.recorder.add_to(&mut evicted);
            } else {
                s.recorder.add_to(sums.entry(Arc::as_ptr(client)).or_default());
            }
        }
        let mut out: Vec<(Arc<ClientIoStats>, IoTotals)> = clients
            .values()
            .map(|c| {
                let mut t = c.retired();
                if let Some(live) = sums.get(&Arc::as_ptr(c)) {
                    t.add(live);
                }
                (c.clone(), t)
            })
            .collect();
        drop(live);
        drop(clients);
        out.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        (out, evicted)
    }

    /// Every client's row, sorted by protocol and address.
    pub fn snapshot(&self, io: &IoStatsTable) -> Vec<ClientIoSnapshot> {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.totals(io)
            .into_iter()
            .map(|(c, t)| ClientIoSnapshot {
                protocol: c.key.0.clone(),
                address: c.key.1.clone(),
                connections_open: load(&c.connections_open),
                connections_total: load(&c.connections_total),
                first_seen_s: load(&c.first_seen_s),
                last_seen_s: load(&c.last_seen_s),
                io: t.snapshot(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_retired_plus_live_and_survive_the_session() {
        let table = IoStatsTable::default();
        let clients = ClientStatsTable::new(4);
        let c = clients.connect("nbd", "10.0.0.1");
        let a = table.register("p/a", SessionLabels { protocol: "nbd", client: Some(c.stats().clone()) });
        a.recorder.record(IoKind::Write, 4096, 3000, false);
        a.recorder.record(IoKind::Read, 8192, 5000, true);
        let b = table.register("p/b", SessionLabels::anonymous("iscsi"));
        b.recorder.record(IoKind::Flush, 0, 5, false);
        let before = table.snapshot();
        assert_eq!(before.len(), 2);
        assert_eq!(before[0].1.write_bytes, 4096);
        assert_eq!(before[0].1.read_bytes, 0, "a failed read transfers nothing");
        assert_eq!(before[0].1.error_ops, 1);
        assert_eq!(before[0].1.latency_read.buckets.iter().sum::<u64>(), 1);
        assert_eq!(before[1].1.flush_ops, 1);
        assert_eq!(clients.snapshot(&table)[0].io.write_ops, 1);
        table.retire(a.id);
        table.retire(a.id); // twice is once
        assert_eq!(table.snapshot(), before, "a retired session's I/O stays in its volume's totals");
        assert_eq!(clients.snapshot(&table)[0].io.write_ops, 1, "and in its client's");
        assert_eq!(table.protocol_totals()["nbd"].kind(IoKind::Read).ops, 1);
        table.retain(|name| name != "p/a");
        assert_eq!(table.snapshot().len(), 1);
    }

    #[test]
    fn client_table_is_bounded_and_keeps_connected_clients() {
        let table = ClientStatsTable::new(2);
        let io = IoStatsTable::default();
        let a = table.connect("nbd", "10.0.0.1");
        let r = io.register("p/v", SessionLabels { protocol: "nbd", client: Some(a.stats().clone()) });
        r.recorder.record(IoKind::Write, 4096, 1, false);
        {
            let b = table.connect("nbd", "10.0.0.2");
            assert_eq!(b.stats().connections_open.load(Ordering::Relaxed), 1);
        }
        let again = table.connect("nbd", "10.0.0.1");
        assert!(Arc::ptr_eq(a.stats(), again.stats()), "same client, same row");
        // Full: the third client replaces the one with no open connection (10.0.0.2).
        let _c = table.connect("nbd", "10.0.0.3");
        let rows = table.snapshot(&io);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].address, "10.0.0.1");
        assert_eq!(rows[0].connections_open, 2);
        assert_eq!(rows[0].connections_total, 2);
        assert_eq!(rows[0].io.write_bytes, 4096);
        assert_eq!(rows[1].address, "10.0.0.3");
        drop((a, again));
        assert_eq!(table.snapshot(&io)[0].connections_open, 0);
        // Even with every entry connected, a new client gets a row (the table never grows).
        let _d = table.connect("nbd", "10.0.0.4");
        let _e = table.connect("nbd", "10.0.0.5");
        assert_eq!(table.snapshot(&io).len(), 2);
    }

    #[test]
    fn an_evicted_clients_io_stays_in_the_evicted_sum() {
        let table = ClientStatsTable::new(1);
        let io = IoStatsTable::default();
        {
            let a = table.connect("nbd", "10.0.0.1");
            let r = io.register("p/v", SessionLabels { protocol: "nbd", client: Some(a.stats().clone()) });
            r.recorder.record(IoKind::Read, 4096, 1, false);
            io.retire(r.id);
        }
        assert_eq!(table.evicted_totals(&io).kind(IoKind::Read).ops, 0);
        let _b = table.connect("nbd", "10.0.0.2"); // replaces 10.0.0.1
        assert_eq!(table.snapshot(&io).len(), 1);
        assert_eq!(table.evicted_totals(&io).kind(IoKind::Read).ops, 1, "10.0.0.1's read is still counted");
    }

    #[test]
    fn a_client_evicted_while_connected_keeps_counting_once() {
        // Goal: the sum over the table's rows and its evicted sum only grows and counts
        // every request once, also for a row evicted while its session is open (a full
        // table evicts connected rows too), before and after that session ends.
        let table = ClientStatsTable::new(1);
        let io = IoStatsTable::default();
        let all_reads = |table: &ClientStatsTable| {
            let rows: u64 = table.totals(&io).iter().map(|(_, t)| t.kind(IoKind::Read).ops).sum();
            rows + table.evicted_totals(&io).kind(IoKind::Read).ops
        };
        let a = table.connect("nbd", "10.0.0.1");
        let old = io.register("p/v", SessionLabels { protocol: "nbd", client: Some(a.stats().clone()) });
        old.recorder.record(IoKind::Read, 4096, 1, false);
        io.retire(old.id);
        let live = io.register("p/v", SessionLabels { protocol: "nbd", client: Some(a.stats().clone()) });
        live.recorder.record(IoKind::Read, 4096, 1, false);
        assert_eq!(all_reads(&table), 2);
        let _b = table.connect("nbd", "10.0.0.2"); // evicts 10.0.0.1, still connected
        assert_eq!(table.totals(&io).len(), 1);
        assert_eq!(all_reads(&table), 2, "the evicted row's ended and live sessions both count");
        live.recorder.record(IoKind::Read, 4096, 1, false);
        assert_eq!(all_reads(&table), 3, "its live session goes on counting");
        io.retire(live.id);
        assert_eq!(all_reads(&table), 3, "and is counted once when it ends");
        assert_eq!(table.evicted_totals(&io).kind(IoKind::Read).ops, 3);
    }

    #[test]
    fn a_session_outliving_its_volume_does_not_bring_its_totals_back() {
        // Goal: a volume destroyed (retain) while a session's last request is still
        // being answered leaves no totals behind when that session ends, so a new
        // volume of the same name starts from zero; protocol totals keep the I/O.
        let io = IoStatsTable::default();
        let r = io.register("p/v", SessionLabels::anonymous("nbd"));
        r.recorder.record(IoKind::Write, 4096, 1, false);
        io.retain(|name| name != "p/v");
        assert!(io.volume_totals().is_empty(), "a forgotten volume shows no totals: {:?}", io.volume_totals().len());
        io.retire(r.id);
        assert!(io.volume_totals().is_empty(), "not after its session ends either");
        assert_eq!(io.protocol_totals()["nbd"].kind(IoKind::Write).ops, 1);
        let fresh = io.register("p/v", SessionLabels::anonymous("nbd"));
        fresh.recorder.record(IoKind::Read, 512, 1, false);
        let totals = io.volume_totals();
        assert_eq!((totals[0].1.kind(IoKind::Write).ops, totals[0].1.kind(IoKind::Read).ops), (0, 1));
    }

    #[test]
    fn a_failed_request_transfers_no_bytes() {
        // Goal: bytes are what was transferred: a request refused or failed (a read of
        // 4 GiB past the end of the volume) counts as a request and an error, its size
        // in the size histogram, but adds no bytes.
        let r = Recorder::default();
        r.record(IoKind::Read, 0xFFFF_F000, 1000, true);
        r.record(IoKind::Write, 4096, 1000, true);
        r.record(IoKind::Read, 4096, 1000, false);
        let mut t = IoTotals::default();
        r.add_to(&mut t);
        let s = t.snapshot();
        assert_eq!((s.read_ops, s.read_bytes, s.write_ops, s.write_bytes, s.error_ops), (2, 4096, 1, 0, 2));
        assert_eq!(t.sizes[IoKind::Read as usize][bucket_of(0xFFFF_F000)], 1);
    }

    #[test]
    fn a_gone_volume_leaves_its_totals_for_the_collector_once() {
        // Goal: the I/O a volume did up to its destruction reaches the collector's next
        // look once (in order, per generation of a name), never /metrics' totals.
        let io = IoStatsTable::default();
        let ended = io.register("p/v", SessionLabels::anonymous("nbd"));
        ended.recorder.record(IoKind::Read, 512, 1, false);
        io.retire(ended.id);
        let open = io.register("p/v", SessionLabels::anonymous("nbd"));
        open.recorder.record(IoKind::Read, 512, 1, false);
        io.retain(|n| n != "p/v");
        let again = io.register("p/v", SessionLabels::anonymous("nbd"));
        again.recorder.record(IoKind::Write, 512, 1, false);
        io.retain(|n| n != "p/v");
        open.recorder.record(IoKind::Read, 512, 1, false); // after its volume went: not the volume's
        let (now, gone) = io.volume_look();
        assert!(now.is_empty() && io.volume_totals().is_empty());
        let ops: Vec<(u64, u64)> = gone.iter().map(|(_, t)| (t.kind(IoKind::Read).ops, t.kind(IoKind::Write).ops)).collect();
        assert_eq!(ops, [(2, 0), (0, 1)]);
        assert!(io.volume_look().1.is_empty(), "taken once");
        for _ in 0..GONE_VOLUMES_MAX + 5 {
            io.register("p/w", SessionLabels::anonymous("nbd"));
            io.retain(|n| n != "p/w");
        }
        assert_eq!(io.volume_look().1.len(), GONE_VOLUMES_MAX, "bounded");
    }

    #[test]
    fn log2_folding_keeps_every_count() {
        let mut t = IoTotals::default();
        let r = Recorder::default();
        for ns in [10, 1500, 3000, 1 << 20, 1 << 40] {
            r.record(IoKind::Read, 4096, ns, false);
        }
        r.add_to(&mut t);
        let folded = t.snapshot().latency_read.log2_buckets();
        assert_eq!(folded.iter().map(|b| b.1).sum::<u64>(), 5);
        assert_eq!(folded[0].1, 1, "10 ns under 2^10");
        assert_eq!(folded.last().map(|b| (b.0, b.1)), Some((None, 1)));
        assert!(Recorder::BYTES < 8 << 10, "a recorder is {} bytes", Recorder::BYTES);
    }
}
