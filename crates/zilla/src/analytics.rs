//! analytics: the daemon's collector of the statistics history, and its HTTP API.
//!
//! Theory of operation
//! -------------------
//! The history itself is zilla-core's `analytics::Store` (datasets, rings, the saved
//! minutes). This module feeds it and serves it:
//!
//! ```text
//!   every second (Env clock)                          HTTP (/api/v1/analytics)
//!   collector ── reads cumulative sums ──┐            GET  datasets
//!     front end: IoStatsTable / clients  │            PUT  datasets/{statistic}/{breakdown}
//!     pools: iostat leaves, ARC, ZIL, txg├─ delta ─>  GET  query?dataset=&from=&to=&...
//!                                        │  Sample    GET  live?dataset=... (SSE)
//!   every minute, and at shutdown: save the minutes to STATE/analytics-history
//! ```
//!
//! Every source is a cumulative sum that only grows while its key exists (the front
//! end's ended sessions stay in their volume's, client's and protocol's totals), so a
//! second's value is the difference of two sums; a key seen for the first time counts
//! from zero, one that shrank (a pool re-imported) counts as new. A volume destroyed
//! since the last look counts what it did until then (the front end keeps its totals
//! at its end for the next look); one created again counts from zero. Client rows are
//! followed one by one (a row evicted from the clients table moves its sums to the
//! table's evicted sum, `other`, of which only the part not yet counted under the
//! row's own key is new), from one consistent look at rows and evicted sum. The sums
//! are read every second; only the enabled datasets' values are computed (so one
//! enabled again starts from its first second). The first tick only takes the sums.
//! A tick that comes late (the machine busy) spreads what it took evenly over the
//! seconds since the last one (at most a minute), so neither a hole nor a doubled
//! second shows in the rates, and the totals stay exact.
//!
//! Bounds: at most [`LIVE_SUBSCRIBERS_MAX`] live streams, at most
//! [`LIVE_PER_CLIENT_MAX`] of them from one client address (an IPv6 client: its /64),
//! so one client cannot take every slot (429 beyond its share, 503 when all are
//! taken); each of at most [`LIVE_DATASETS_MAX`] datasets and one event a second,
//! ending after [`LIVE_EVENTS_MAX`] events (its first tells the browser to reconnect
//! within a second). A client that stops reading is disconnected by the HTTP server's
//! write-stall guard (http_serve.rs: no byte acknowledged for
//! `http_write_stall_timeout_s`), which gives its slot back; a query answers at most
//! the store's points and keys limits. The store's memory is bounded by the catalog.
//!
//! The history file: loaded at start; a file that cannot be used (torn, corrupt,
//! foreign) is reported, moved aside to `analytics-history.bad` and replaced. A new
//! history (no usable file) has the store's defaults and the datasets the dashboard's
//! I/O panel reads ([`DASHBOARD_DATASETS`]) enabled; a loaded one has the file's.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query as UrlQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::watch;
use zilla_core::analytics::{AnalyticsError, Query, Sample, Store, Value};
use zilla_core::env::Env;
use zilla_core::vdev::{IoClass, Role};
use zilla_frontend::iostats::{ClientIoStats, ClientStatsTable, IoStatsTable};
use zilla_frontend::{Frontend, IoKind, IoTotals};

use crate::api_error::ApiError;
use crate::pools::PoolTable;

/// Live streams served at once.
pub const LIVE_SUBSCRIBERS_MAX: usize = 16;
/// Live streams one client address may hold (a browser tab holds one).
pub const LIVE_PER_CLIENT_MAX: usize = 4;
/// Datasets one live stream may follow.
pub const LIVE_DATASETS_MAX: usize = 8;
/// Events a live stream sends before it ends (a browser's EventSource reconnects
/// within a second): a client that stops reading gives its slot back within this long.
pub const LIVE_EVENTS_MAX: u64 = 300;
/// Datasets the dashboard's I/O panel reads (operations are their histograms'
/// counts): per pool, from its devices' latency (a default dataset) and bytes; per
/// volume, its requests' latency and bytes. Enabled with the defaults in a new history.
pub const DASHBOARD_DATASETS: &[&str] = &["disk.bytes/device", "io.latency/volume", "io.bytes/volume"];
/// How often the minutes are saved.
const SAVE_EVERY_S: u64 = 60;
const HISTORY_FILE: &str = "analytics-history";
/// The tick value that tells the live streams the daemon is stopping (they end, so
/// the HTTP server's graceful shutdown does not wait on them).
const TICK_STOPPING: u64 = u64::MAX;

/// The history, where it is saved, and the tick the live streams wait for.
pub struct Analytics {
    store: Mutex<Store>,
    path: PathBuf,
    env: Arc<dyn Env>,
    /// The last second ingested (monotonic s); live streams wake on its change.
    tick: watch::Sender<u64>,
    live: Mutex<LiveSlots>,
}

/// The live streams open: in all, and per client (at most [`LIVE_SUBSCRIBERS_MAX`]
/// rows, one per client holding a stream).
#[derive(Default)]
struct LiveSlots {
    total: usize,
    per_client: HashMap<std::net::IpAddr, usize>,
}

impl LiveSlots {
    /// Take a slot for `client` (`None`: a caller without an address), or say why not.
    fn take(&mut self, client: Option<std::net::IpAddr>) -> Result<(), ApiError> {
        if self.total >= LIVE_SUBSCRIBERS_MAX {
            return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("at most {LIVE_SUBSCRIBERS_MAX} live streams at once; close one")));
        }
        if let Some(c) = client {
            let held = self.per_client.entry(c).or_insert(0);
            if *held >= LIVE_PER_CLIENT_MAX {
                return Err(ApiError(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("at most {LIVE_PER_CLIENT_MAX} live streams per client address ({c} holds {held}); close one"),
                ));
            }
            *held += 1;
        }
        self.total += 1;
        Ok(())
    }

    fn give_back(&mut self, client: Option<std::net::IpAddr>) {
        self.total = self.total.saturating_sub(1);
        if let Some(c) = client {
            if let Some(held) = self.per_client.get_mut(&c) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    self.per_client.remove(&c);
                }
            }
        }
    }
}

impl Analytics {
    /// The history of `state_dir`, loaded from its file if there is one (a bad file is
    /// reported, moved aside, and the history starts empty).
    /// `memory_max_bytes` bounds the enabled datasets' history (config key
    /// `analytics_memory_max_bytes`).
    pub fn open(state_dir: &std::path::Path, env: Arc<dyn Env>, memory_max_bytes: u64) -> Arc<Analytics> {
        let path = state_dir.join(HISTORY_FILE);
        let mut store = Store::new(env.clone(), memory_max_bytes);
        let loaded = store.load(&path);
        if !matches!(loaded, Ok(ref r) if r.file_found) {
            // a new history: the dashboard's datasets on beside the defaults (a saved
            // one keeps the datasets it had; the dashboard offers to enable them)
            for d in DASHBOARD_DATASETS {
                if let Err(e) = store.set_enabled(d, true) {
                    tracing::warn!("analytics: dataset {d} for the dashboard not enabled: {e}");
                }
            }
        }
        match loaded {
            Ok(r) if r.file_found => {
                tracing::info!(datasets = r.datasets.len(), minutes = r.minutes, clock_shift_s = r.clock_shift_s, "analytics: history loaded from {}", path.display());
                if !r.skipped_over_memory.is_empty() {
                    tracing::warn!("analytics: datasets left off (over the memory bound): {}", r.skipped_over_memory.join(", "));
                }
            }
            Ok(_) => {}
            Err(e) => {
                let aside = state_dir.join(format!("{HISTORY_FILE}.bad"));
                let moved = std::fs::rename(&path, &aside).map(|_| format!("moved to {}", aside.display()));
                tracing::warn!("analytics: {e}; starting an empty history ({})", moved.unwrap_or_else(|e| format!("not moved: {e}")));
            }
        }
        let (tick, _) = watch::channel(0);
        Arc::new(Analytics { store: Mutex::new(store), path, env, tick, live: Mutex::new(LiveSlots::default()) })
    }

    /// Save the minutes now (the fsyncs outside the lock).
    pub fn save(&self) {
        let bytes = self.store.lock().history_file_bytes();
        if let Err(e) = zilla_core::analytics::write_history_file(&self.path, &bytes) {
            tracing::warn!("analytics: cannot save the history to {}: {e}", self.path.display());
        }
    }

    fn mono_s(&self) -> u64 {
        self.env.now_ns() / 1_000_000_000
    }
}

/// The most seconds one late sample is spread over; a longer stall puts its events in
/// its last minute.
const LATE_SPREAD_MAX_S: u64 = 60;

/// Run the collector until `stop` turns true: one sample a second, the minutes saved
/// every minute and once more at the end.
pub async fn run_collector(analytics: Arc<Analytics>, pools: Arc<PoolTable>, frontend: Arc<Frontend>, mut stop: watch::Receiver<bool>) {
    let mut collector = Collector::default();
    let mut last_save_s = analytics.mono_s();
    let mut next_s = analytics.mono_s() + 1;
    let mut last_sample_s: Option<u64> = None;
    loop {
        let wait_ns = (next_s * 1_000_000_000).saturating_sub(analytics.env.now_ns());
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_nanos(wait_ns)) => {}
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
        let now_s = analytics.mono_s();
        next_s = now_s + 1;
        let enabled = analytics.store.lock().enabled();
        let (a, p, f) = (analytics.clone(), pools.clone(), frontend.clone());
        let sample = tokio::task::spawn_blocking(move || {
            let sample = collector.sample(&enabled, &p, &f);
            (collector, sample)
        })
        .await;
        let Ok((back, sample)) = sample else { break };
        collector = back;
        if let Some(sample) = sample {
            // woken late (a busy machine): the sums cover every second since the last
            // sample, spread evenly over them rather than put into one
            let seconds = last_sample_s.map_or(1, |l| now_s.saturating_sub(l).clamp(1, LATE_SPREAD_MAX_S));
            let parts = if seconds > 1 { sample.split(seconds) } else { vec![sample] };
            let mut store = a.store.lock();
            for (i, part) in parts.iter().enumerate() {
                if let Err(e) = store.ingest(now_s + 1 + i as u64 - seconds, part) {
                    tracing::debug!("analytics: sample not taken: {e}");
                }
            }
            drop(store);
            a.tick.send_replace(now_s);
        }
        last_sample_s = Some(now_s);
        if now_s >= last_save_s + SAVE_EVERY_S {
            last_save_s = now_s;
            let a = analytics.clone();
            let _ = tokio::task::spawn_blocking(move || a.save()).await;
        }
    }
    analytics.tick.send_replace(TICK_STOPPING);
    let a = analytics.clone();
    let _ = tokio::task::spawn_blocking(move || a.save()).await;
}

/// A key's cumulative front-end totals.
type FrontSums = HashMap<String, IoTotals>;

/// The previous second's cumulative sums, per source and key.
#[derive(Default)]
struct Collector {
    started: bool,
    volumes: FrontSums,
    protocols: FrontSums,
    /// Per client row (by its address in memory, the row kept alive here so the
    /// address is not reused): the row and its totals.
    client_rows: HashMap<usize, (Arc<ClientIoStats>, IoTotals)>,
    /// The clients table's evicted sum.
    clients_evicted: IoTotals,
    /// (device key, class) -> (ops, bytes, latency buckets).
    devices: HashMap<(String, IoClass), (u64, u64, Vec<u64>)>,
    /// ARC hits and misses, and per pool its L2ARC's (`l2_hit/POOL`).
    arc: BTreeMap<String, u64>,
    zil: BTreeMap<String, u64>,
    txgs: BTreeMap<String, u64>,
}

fn sub_totals(now: &IoTotals, before: Option<&IoTotals>) -> IoTotals {
    let Some(before) = before else { return now.clone() };
    if now.kinds.iter().zip(&before.kinds).any(|(a, b)| a.ops < b.ops) {
        return now.clone(); // the key started over
    }
    saturating_sub_totals(now, before)
}

/// The second's deltas of `now` against `before` (which becomes `now`).
fn deltas(now: FrontSums, before: &mut FrontSums) -> Vec<(String, IoTotals)> {
    let out = now.iter().map(|(k, t)| (k.clone(), sub_totals(t, before.get(k)))).collect();
    *before = now;
    out
}

/// `now - before` per cell, never below zero.
fn saturating_sub_totals(now: &IoTotals, before: &IoTotals) -> IoTotals {
    let mut d = now.clone();
    for (a, b) in d.kinds.iter_mut().zip(&before.kinds) {
        a.ops = a.ops.saturating_sub(b.ops);
        a.bytes = a.bytes.saturating_sub(b.bytes);
        a.errors = a.errors.saturating_sub(b.errors);
        a.latency_ns = a.latency_ns.saturating_sub(b.latency_ns);
        a.latency.iter_mut().zip(&b.latency).for_each(|(x, y)| *x = x.saturating_sub(*y));
    }
    for (a, b) in d.sizes.iter_mut().zip(&before.sizes) {
        a.iter_mut().zip(b).for_each(|(x, y)| *x = x.saturating_sub(*y));
    }
    d
}

fn sparse(buckets: &[u64]) -> Vec<(u8, u64)> {
    buckets.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (i as u8, *n)).collect()
}

/// The value of front-end statistic `statistic` for the requests of `kinds` in `t`.
fn front_value(statistic: &str, t: &IoTotals, kinds: &[IoKind]) -> Option<Value> {
    let ks = || kinds.iter().map(|&k| t.kind(k));
    let v = match statistic {
        "io.ops" => Value::Counter(ks().map(|k| k.ops).sum()),
        "io.bytes" => Value::Counter(ks().map(|k| k.bytes).sum()),
        "io.latency" => {
            let mut b = vec![0u64; zilla_frontend::iostats::BUCKETS];
            ks().for_each(|k| b.iter_mut().zip(&k.latency).for_each(|(x, y)| *x += y));
            Value::Histogram(sparse(&b))
        }
        "io.size" => {
            let mut b = vec![0u64; zilla_frontend::iostats::BUCKETS];
            for &k in kinds {
                if let Some(sizes) = t.sizes.get(k as usize) {
                    b.iter_mut().zip(sizes).for_each(|(x, y)| *x += y);
                }
            }
            Value::Histogram(sparse(&b))
        }
        _ => return None,
    };
    let empty = match &v {
        Value::Counter(n) => *n == 0,
        Value::Histogram(b) => b.is_empty(),
    };
    (!empty).then_some(v)
}

fn sum_totals<'a>(all: impl Iterator<Item = &'a IoTotals>) -> IoTotals {
    let mut s = IoTotals::default();
    all.for_each(|t| s.add(t));
    s
}

impl Collector {
    /// One second's sample of the `enabled` datasets; None on the first call (it only
    /// takes the sums). The sums are taken every second, also while no dataset of
    /// theirs is enabled: the first second after one is enabled again is that second's
    /// I/O, not everything since it was disabled.
    fn sample(&mut self, enabled: &[String], pools: &PoolTable, frontend: &Frontend) -> Option<Sample> {
        let mut sample = Sample::default();
        self.sample_front(enabled, &frontend.io_stats, &frontend.clients, &mut sample);
        let all_pools = pools.all();
        self.sample_disks(enabled, &all_pools, &mut sample);
        self.sample_engine(enabled, &all_pools, &mut sample);
        let first = !self.started;
        self.started = true;
        for d in enabled {
            sample.touch(d);
        }
        (!first).then_some(sample)
    }

    /// The second's I/O per client address (rows of one address summed: an iSCSI
    /// initiator may call itself what an NBD client's address is). Clients evicted
    /// from the table (it keeps clients_max) count as `other`: the growth of the
    /// evicted sum, less what the rows evicted since the last look held then (that
    /// was counted under their own key).
    fn client_deltas(&mut self, clients: &ClientStatsTable, io: &IoStatsTable) -> Vec<(String, IoTotals)> {
        let (rows, evicted) = clients.look(io);
        let mut out = FrontSums::new();
        let mut now: HashMap<usize, (Arc<ClientIoStats>, IoTotals)> = HashMap::new();
        for (row, t) in rows {
            let id = Arc::as_ptr(&row) as usize;
            let d = sub_totals(&t, self.client_rows.get(&id).map(|(_, before)| before));
            out.entry(row.key.1.clone()).or_default().add(&d);
            now.insert(id, (row, t));
        }
        let mut counted = self.clients_evicted.clone();
        for (id, (_, before)) in &self.client_rows {
            if !now.contains_key(id) {
                counted.add(before);
            }
        }
        out.entry(zilla_core::analytics::catalog::OTHER_KEY.to_string()).or_default().add(&saturating_sub_totals(&evicted, &counted));
        self.client_rows = now;
        self.clients_evicted = evicted;
        out.into_iter().collect()
    }

    /// The second's I/O per volume: of each volume gone since the last look, what it
    /// did after that look (a name gone and created again counts the new one from
    /// zero); of the others, the change of their sums.
    fn volume_deltas(&mut self, io: &IoStatsTable) -> Vec<(String, IoTotals)> {
        let (now, gone) = io.volume_look();
        let mut out = FrontSums::new();
        for (name, last) in gone {
            let d = match self.volumes.remove(&*name) {
                Some(before) => saturating_sub_totals(&last, &before),
                None => last,
            };
            out.entry(name.to_string()).or_default().add(&d);
        }
        let now: FrontSums = now.into_iter().collect();
        for (name, t) in &now {
            out.entry(name.clone()).or_default().add(&sub_totals(t, self.volumes.get(name)));
        }
        self.volumes = now;
        out.into_iter().collect()
    }

    fn sample_front(&mut self, enabled: &[String], io: &IoStatsTable, clients: &ClientStatsTable, sample: &mut Sample) {
        let volumes = self.volume_deltas(io);
        let protocols = deltas(io.protocol_totals().into_iter().map(|(k, t)| (k.to_string(), t)).collect(), &mut self.protocols);
        let clients = self.client_deltas(clients, io);
        let all = sum_totals(protocols.iter().map(|(_, t)| t));
        for dataset in enabled.iter().filter(|d| d.starts_with("io.")) {
            let Some((statistic, breakdown)) = dataset.split_once('/') else { continue };
            let mut add = |key: &str, t: &IoTotals, kinds: &[IoKind]| {
                if let Some(v) = front_value(statistic, t, kinds) {
                    sample.add(dataset, key, v);
                }
            };
            match breakdown {
                "none" => add("all", &all, &IoKind::ALL),
                "op" => IoKind::ALL.iter().for_each(|&k| add(k.name(), &all, &[k])),
                "volume" => volumes.iter().for_each(|(key, t)| add(key, t, &IoKind::ALL)),
                "protocol" => protocols.iter().for_each(|(key, t)| add(key, t, &IoKind::ALL)),
                "client" => clients.iter().for_each(|(key, t)| add(key, t, &IoKind::ALL)),
                "volume+op" => {
                    for (key, t) in &volumes {
                        IoKind::ALL.iter().for_each(|&k| add(&format!("{key}:{}", k.name()), t, &[k]));
                    }
                }
                _ => {}
            }
        }
    }

    fn sample_disks(&mut self, enabled: &[String], pools: &[(String, Arc<zilla_core::spa::Pool>)], sample: &mut Sample) {
        let mut now: HashMap<(String, IoClass), (u64, u64, Vec<u64>)> = HashMap::new();
        for (name, pool) in pools {
            let snap = pool.iostat();
            for top in &snap.vdevs {
                let prefix = match top.role {
                    Role::Normal => name.clone(),
                    Role::Log => format!("{name}/logs"),
                    Role::Cache => format!("{name}/cache"),
                    Role::Spare => format!("{name}/spares"),
                };
                leaves(top, &prefix, &mut |key, st| {
                    for c in IoClass::ALL {
                        let fine = st.disk_latency_fine.get(c as usize).cloned().unwrap_or_default();
                        now.insert((key.to_string(), c), (st.ops[c as usize], st.bytes[c as usize], fine));
                    }
                });
            }
        }
        let mut per: Vec<(String, IoClass, u64, u64, Vec<u64>)> = Vec::new();
        for ((key, class), (ops, bytes, fine)) in &now {
            let (o, b, f) = match self.devices.get(&(key.clone(), *class)) {
                Some((o0, b0, f0)) if *o0 <= *ops => {
                    (ops - o0, bytes.saturating_sub(*b0), fine.iter().zip(f0.iter().chain(std::iter::repeat(&0))).map(|(x, y)| x.saturating_sub(*y)).collect())
                }
                _ => (*ops, *bytes, fine.clone()),
            };
            if o > 0 {
                per.push((key.clone(), *class, o, b, f));
            }
        }
        self.devices = now;
        for dataset in enabled.iter().filter(|d| d.starts_with("disk.")) {
            let Some((statistic, breakdown)) = dataset.split_once('/') else { continue };
            let mut groups: BTreeMap<String, (u64, u64, Vec<u64>)> = BTreeMap::new();
            for (key, class, o, b, f) in &per {
                let group = match breakdown {
                    "device" => key.clone(),
                    "class" => class.name().to_string(),
                    "op" => (if class.is_read() { "read" } else { "write" }).to_string(),
                    _ => "all".to_string(),
                };
                let g = groups.entry(group).or_insert_with(|| (0, 0, vec![0; zilla_frontend::iostats::BUCKETS]));
                g.0 += o;
                g.1 += b;
                g.2.iter_mut().zip(f).for_each(|(x, y)| *x += y);
            }
            for (key, (o, b, f)) in groups {
                let v = match statistic {
                    "disk.ops" => Value::Counter(o),
                    "disk.bytes" => Value::Counter(b),
                    _ => Value::Histogram(sparse(&f)),
                };
                sample.add(dataset, &key, v);
            }
        }
    }

    /// ARC accesses, intent-log commits and txg syncs.
    fn sample_engine(&mut self, enabled: &[String], pools: &[(String, Arc<zilla_core::spa::Pool>)], sample: &mut Sample) {
        let started = self.started;
        let mut arc: BTreeMap<String, u64> = BTreeMap::new();
        let mut zil: BTreeMap<String, u64> = BTreeMap::new();
        let mut txgs: BTreeMap<String, u64> = BTreeMap::new();
        let a = zilla_core::arc::daemon_arc().stats(); // one ARC for every pool
        arc.insert("hit".into(), a.hits);
        arc.insert("miss".into(), a.misses);
        for (name, pool) in pools {
            // per pool: a pool exported or imported must not move the others' sums
            if let Some(l) = pool.l2_stats() {
                arc.insert(format!("l2_hit/{name}"), l.l2_hits);
                arc.insert(format!("l2_miss/{name}"), l.l2_misses);
            }
            for (volume, commits) in pool.zil_commits_by_volume() {
                zil.insert(format!("{name}/{volume}"), commits);
            }
            txgs.insert(name.clone(), pool.synced_txg().0);
        }
        let mut emit = |dataset: &str, rows: Vec<(String, u64)>| {
            if started && enabled.iter().any(|d| d == dataset) {
                for (k, v) in rows.into_iter().filter(|(_, v)| *v > 0) {
                    sample.add(dataset, &k, Value::Counter(v));
                }
            }
        };
        let mut arc_d: BTreeMap<String, u64> = BTreeMap::new();
        for (k, v) in &arc {
            let result = k.split('/').next().unwrap_or(k);
            *arc_d.entry(result.to_string()).or_default() += counter_delta(*v, self.arc.get(k));
        }
        emit("arc.accesses/none", vec![("all".into(), arc_d.iter().filter(|(k, _)| *k == "hit" || *k == "miss").map(|(_, v)| v).sum())]);
        emit("arc.accesses/result", arc_d.into_iter().collect());
        let zil_d: Vec<(String, u64)> = zil.iter().map(|(k, v)| (k.clone(), counter_delta(*v, self.zil.get(k)))).collect();
        emit("zil.commits/none", vec![("all".into(), zil_d.iter().map(|(_, v)| v).sum())]);
        emit("zil.commits/volume", zil_d);
        // a txg number is not a count from zero: a pool seen for the first time (imported)
        // or rewound counts nothing this second
        let txg_d: Vec<(String, u64)> = txgs.iter().map(|(k, v)| (k.clone(), self.txgs.get(k).map_or(0, |b| v.saturating_sub(*b)))).collect();
        emit("txg.syncs/none", vec![("all".into(), txg_d.iter().map(|(_, v)| v).sum())]);
        emit("txg.syncs/pool", txg_d);
        (self.arc, self.zil, self.txgs) = (arc, zil, txgs);
    }
}

/// The change of a counter that counts from zero since its key appeared: all of it
/// when the key is new or shrank (it started over).
fn counter_delta(now: u64, before: Option<&u64>) -> u64 {
    match before {
        Some(b) if *b <= now => now - b,
        _ => now,
    }
}

/// Call `f` with the key (`prefix/.../leaf`) and stats of every leaf under `node`.
fn leaves(node: &zilla_core::spa::IostatNode, prefix: &str, f: &mut dyn FnMut(&str, &zilla_core::vdev::queue::LeafStats)) {
    let key = format!("{prefix}/{}", node.name);
    if node.children.is_empty() {
        f(&key, &node.stats);
    }
    for c in &node.children {
        leaves(c, &key, f);
    }
}

// --- HTTP ------------------------------------------------------------------------------

/// The analytics routes, under `/api/v1/analytics`.
pub fn routes(analytics: Arc<Analytics>) -> Router {
    Router::new()
        .route("/api/v1/analytics/datasets", get(datasets))
        .route("/api/v1/analytics/datasets/{statistic}/{breakdown}", put(set_dataset))
        .route("/api/v1/analytics/query", get(query))
        .route("/api/v1/analytics/live", get(live))
        .with_state(analytics)
}

fn store_error(e: AnalyticsError) -> ApiError {
    let status = match &e {
        AnalyticsError::UnknownDataset(_) => StatusCode::NOT_FOUND,
        AnalyticsError::MemoryExceeded { .. } => StatusCode::CONFLICT,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError(status, e.to_string())
}

async fn datasets(State(a): State<Arc<Analytics>>) -> Response {
    Json(a.store.lock().datasets()).into_response()
}

#[derive(Deserialize)]
struct Enable {
    enabled: bool,
}

async fn set_dataset(
    State(a): State<Arc<Analytics>>,
    UrlPath((statistic, breakdown)): UrlPath<(String, String)>,
    body: Result<Json<Enable>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(Enable { enabled }) = body.map_err(|e| ApiError::bad(format!("expected {{\"enabled\": true|false}}: {}", crate::clip::clip(&e.body_text()))))?;
    let name = format!("{statistic}/{breakdown}");
    let info = a.store.lock().set_enabled(&name, enabled).map_err(store_error)?;
    tracing::info!("analytics: dataset {name} {}", if enabled { "enabled" } else { "disabled" });
    Ok(Json(info).into_response())
}

/// A dataset name from a query string: `+` there decodes to a space, and no dataset
/// name has a space, so `dataset=io.ops/volume+op` means what it says.
fn plus_kept(name: &str) -> String {
    name.replace(' ', "+")
}

async fn query(State(a): State<Arc<Analytics>>, UrlQuery(params): UrlQuery<Vec<(String, String)>>) -> Result<Response, ApiError> {
    let mut q = Query::default();
    let number = |k: &str, v: &str| v.parse::<u64>().map_err(|_| ApiError::bad(format!("{k}: expected a whole number, got {:?}", crate::clip::clip(v))));
    for (k, v) in &params {
        match k.as_str() {
            "dataset" => q.dataset = plus_kept(v),
            "from" => q.from = Some(number(k, v)?),
            "to" => q.to = Some(number(k, v)?),
            "resolution" => q.resolution = Some(number(k, v)?),
            "filter" => q.filter.extend(v.split(',').filter(|s| !s.is_empty()).map(str::to_string)),
            _ => return Err(ApiError::bad(format!("unknown parameter {:?} (dataset, from, to, resolution, filter)", crate::clip::clip(k)))),
        }
    }
    if q.dataset.is_empty() {
        return Err(ApiError::bad("dataset= is required (e.g. dataset=io.latency/op)"));
    }
    let answer = a.store.lock().query(&q).map_err(store_error)?;
    Ok(Json(answer).into_response())
}

/// Holds a live stream's slot while it lives.
struct Subscriber(Arc<Analytics>, Option<std::net::IpAddr>);

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.live.lock().give_back(self.1);
    }
}

async fn live(
    State(a): State<Arc<Analytics>>,
    peer: Option<axum::Extension<crate::http_serve::PeerAddr>>,
    UrlQuery(params): UrlQuery<Vec<(String, String)>>,
) -> Result<Response, ApiError> {
    if let Some((k, _)) = params.iter().find(|(k, _)| k != "dataset") {
        return Err(ApiError::bad(format!("unknown parameter {:?} (dataset, repeated)", crate::clip::clip(k))));
    }
    let names: Vec<String> = params.into_iter().map(|(_, v)| plus_kept(&v)).collect();
    if names.is_empty() || names.len() > LIVE_DATASETS_MAX {
        return Err(ApiError::bad(format!("name 1 to {LIVE_DATASETS_MAX} datasets (dataset=NAME, repeated)")));
    }
    for n in &names {
        a.store.lock().dataset(n).map_err(store_error)?;
    }
    if *a.tick.borrow() == TICK_STOPPING {
        return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping".into()));
    }
    let client = peer.map(|axum::Extension(p)| p.client_key());
    a.live.lock().take(client)?;
    let guard = Subscriber(a.clone(), client);
    let tick = a.tick.subscribe();
    let stream = futures_util::stream::unfold((guard, tick, names, 0u64), |(guard, mut tick, names, sent)| async move {
        if sent >= LIVE_EVENTS_MAX {
            return None;
        }
        tick.changed().await.ok()?;
        if *tick.borrow_and_update() == TICK_STOPPING {
            return None;
        }
        let mut event = live_event(&guard.0, &names);
        if sent == 0 {
            event = event.retry(Duration::from_secs(1));
        }
        Some((Ok::<Event, Infallible>(event), (guard, tick, names, sent + 1)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

/// One live event: the last second of each of `names`.
fn live_event(a: &Analytics, names: &[String]) -> Event {
    let store = a.store.lock();
    let mut time = 0;
    let mut datasets = serde_json::Map::new();
    for n in names {
        if let Ok(Some((t, point))) = store.latest(n) {
            time = time.max(t);
            datasets.insert(n.clone(), serde_json::to_value(point).unwrap_or_default());
        }
    }
    let data = serde_json::json!({ "time": time, "datasets": datasets });
    Event::default().event("point").data(data.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_takes_at_most_its_share_of_the_live_slots() {
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        let mut slots = LiveSlots::default();
        for _ in 0..LIVE_PER_CLIENT_MAX {
            slots.take(ip("127.0.0.1")).unwrap();
        }
        let e = slots.take(ip("127.0.0.1")).unwrap_err();
        assert_eq!(e.0, StatusCode::TOO_MANY_REQUESTS);
        assert!(e.1.contains("127.0.0.1 holds 4"), "{}", e.1);
        for c in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
            for _ in 0..LIVE_PER_CLIENT_MAX {
                slots.take(ip(c)).unwrap();
            }
        }
        assert_eq!(slots.take(ip("127.0.0.5")).unwrap_err().0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(slots.take(None).unwrap_err().0, StatusCode::SERVICE_UNAVAILABLE);
        slots.give_back(ip("127.0.0.1"));
        slots.take(ip("127.0.0.5")).unwrap();
        for c in ["127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.5"] {
            slots.give_back(ip(c));
        }
        assert_eq!(slots.per_client.len(), 3, "a client holding nothing has no row");
        assert_eq!(slots.total, 12);
    }

    #[test]
    fn a_dataset_enabled_again_starts_from_that_second() {
        // Goal: with every io.* dataset disabled for a while, the first second after
        // one is enabled again shows that second's requests, not all since.
        use zilla_frontend::iostats::SessionLabels;
        let frontend = Frontend::new(Arc::new(zilla_frontend::StaticRegistry::new()), zilla_frontend::FrontendConfig::default());
        let pools = PoolTable::default();
        let on = vec!["io.ops/none".to_string()];
        let mut collector = Collector::default();
        let r = frontend.io_stats.register("p/v", SessionLabels::anonymous("nbd"));
        let reads = |n: u64| (0..n).for_each(|_| r.recorder.record(IoKind::Read, 4096, 1000, false));
        let ops = |s: Option<Sample>| {
            let s = s.expect("a sample after the first second");
            let all = s.datasets.iter().find(|(d, _)| d == "io.ops/none").map(|(_, v)| v.clone()).unwrap_or_default();
            all.iter().map(|(_, v)| if let Value::Counter(n) = v { *n } else { 0 }).sum::<u64>()
        };
        assert!(collector.sample(&on, &pools, &frontend).is_none(), "the first second only takes the sums");
        reads(3);
        assert_eq!(ops(collector.sample(&on, &pools, &frontend)), 3);
        reads(500); // while disabled
        collector.sample(&[], &pools, &frontend);
        reads(200);
        collector.sample(&[], &pools, &frontend);
        reads(2);
        assert_eq!(ops(collector.sample(&on, &pools, &frontend)), 2, "the second after enabling");
    }

    #[test]
    fn a_volume_destroyed_between_two_looks_keeps_its_last_io() {
        // Goal: io.*/volume counts the I/O of a volume up to its destruction, also of
        // one created, used and destroyed between two looks, and of a name created
        // again (from zero), every request once.
        use zilla_frontend::iostats::SessionLabels;
        let io = IoStatsTable::default();
        let mut collector = Collector::default();
        let reads = |d: &[(String, IoTotals)]| d.iter().filter(|(k, _)| k == "p/v").map(|(_, t)| t.kind(IoKind::Read).ops).sum::<u64>();
        let session = |n: u64| {
            let r = io.register("p/v", SessionLabels::anonymous("nbd"));
            (0..n).for_each(|_| r.recorder.record(IoKind::Read, 4096, 1000, false));
            r
        };
        assert_eq!(reads(&collector.volume_deltas(&io)), 0);
        let a = session(10);
        assert_eq!(reads(&collector.volume_deltas(&io)), 10);
        a.recorder.record(IoKind::Read, 4096, 1000, false);
        io.retire(a.id);
        io.retain(|n| n != "p/v"); // seen, then 1 more read, then destroyed
        let b = session(5); // created again: from zero
        io.retire(b.id);
        io.retain(|n| n != "p/v");
        let c = session(300); // more reads than the first one had
        assert_eq!(reads(&collector.volume_deltas(&io)), 1 + 5 + 300);
        c.recorder.record(IoKind::Read, 4096, 1000, false);
        assert_eq!(reads(&collector.volume_deltas(&io)), 1);
        assert_eq!(reads(&collector.volume_deltas(&io)), 0);
    }

    #[test]
    fn every_client_request_is_counted_once_through_evictions() {
        // Goal: the per-second client deltas (rows and `other`) add up to the requests
        // made, however rows are evicted (seen before or not, connected or not) and
        // however clients share an address (an NBD client and an iSCSI initiator
        // both called 10.0.0.N).
        use zilla_frontend::iostats::SessionLabels;
        let io = IoStatsTable::default();
        let clients = ClientStatsTable::new(3);
        let mut collector = Collector::default();
        let ops = |d: &[(String, IoTotals)]| d.iter().map(|(_, t)| t.kind(IoKind::Read).ops).sum::<u64>();
        assert_eq!(ops(&collector.client_deltas(&clients, &io)), 0);
        let (mut made, mut counted) = (0u64, 0u64);
        let mut open = Vec::new();
        for i in 0..40u64 {
            let protocol = if i % 3 == 0 { "iscsi" } else { "nbd" };
            let session = clients.connect(protocol, &format!("10.0.0.{}", i % 7));
            let r = io.register("p/v", SessionLabels { protocol, client: Some(session.stats().clone()) });
            for _ in 0..=i % 5 {
                r.recorder.record(IoKind::Read, 4096, 1000, false);
                made += 1;
            }
            if i % 4 == 0 {
                open.push((session, r)); // stays connected, reads again later
            } else {
                io.retire(r.id);
            }
            if let Some((_, r)) = open.get((i as usize * 5) % open.len().max(1)) {
                r.recorder.record(IoKind::Read, 4096, 1000, false);
                made += 1;
            }
            if i % 6 == 5 {
                if let Some((_, r)) = open.pop() {
                    io.retire(r.id);
                }
            }
            if i % 2 == 1 {
                let d = collector.client_deltas(&clients, &io);
                counted += ops(&d);
                assert_eq!(counted, made, "after client {i}: {d:?}");
            }
        }
        for (_, r) in open.drain(..) {
            io.retire(r.id);
        }
        counted += ops(&collector.client_deltas(&clients, &io));
        assert_eq!(counted, made);
        assert_eq!(counter_delta(10, Some(&4)), 6);
        assert_eq!(counter_delta(3, Some(&40)), 3, "a counter that shrank started over");
        assert_eq!(counter_delta(9, None), 9, "a new key counts from zero");
    }
}
