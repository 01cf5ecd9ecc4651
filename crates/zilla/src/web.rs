//! The HTTP side for people and Prometheus (--http ADDR, default 127.0.0.1:8080).
//!
//! Theory of operation
//! -------------------
//! Everything here only reads (through [`View`]); nothing on HTTP changes a pool.
//! The daemon puts http_host.rs's check in front of this router: requests for a name
//! other than an IP address, localhost or a configured one (DNS rebinding), and writes
//! from another site's page, are refused before any route runs.
//! The pages are plain HTML, JavaScript and CSS (no build step) in `assets/`, compiled
//! in; they carry a Content-Security-Policy that lets them load and fetch from this
//! origin only.
//!
//! ```text
//!   /                      the dashboard (assets/dashboard.html + dashboard.js): pools,
//!                          I/O per pool and volume (the last seconds of the analytics
//!                          history), vdev tree with error counters in zpool status's
//!                          sections, volumes, scrub/resilver, ARC/L2ARC/ZIL, refreshed
//!                          from the /api/v1 routes below
//!   /status                the same facts rendered here as text (no JavaScript needed;
//!                          the dashboard's <noscript> points to it)
//!   /ui/worksheet          the analytics worksheet (assets/worksheet.html + .js): it
//!                          reads /api/v1/analytics/{datasets,query,live} and turns
//!                          datasets on and off (PUT); where those routes are not
//!                          served it says analytics are not available
//!   /ui/assets/{file}      the page assets and the vendored uPlot, compiled into the
//!                          binary (include_bytes!), with a content type and an ETag;
//!                          nothing is fetched from elsewhere at run time
//!   /api/v1/{info,pools,status,iostat,volumes,arcstats,zilstats,clients},
//!   /api/v1/pools/{pool}/{props,txgs}
//!                          the read-only admin queries, the very handlers the admin
//!                          socket serves under /v1 (reads.rs), same JSON
//!   /metrics               OpenMetrics text (what Prometheus scrapes)
//! ```
//!
//! `/metrics` is rendered by the prometheus-client crate (HELP, TYPE, `# EOF`; label
//! values escaped here), with the family names ZFS exporters use (pdf/zfs_exporter
//! `zfs_pool_*`, richardelling/zpool_prometheus `zpool_stats_*` and the `zpool_latency_*`
//! histograms; counters' samples end in `_total`), node_exporter's ZFS collector `node_zfs_arc_<arcstats name>` for the
//! ARC (every key of `/v1/arcstats` but Zilla's own, so keys added there appear here;
//! its `zfetch_*` keys, the read-ahead's zfetchstats, as `node_zfs_zfetch_<name>`),
//! and `zilla_frontend_*` / `zilla_nbd_*` / `zilla_iscsi_*` for the front ends' memory
//! budget, limits and connection and request counters, `zilla_memory_*` for the
//! daemon's memory beyond the ARC and dirty data (memory.rs).

use std::fmt::Write;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use zilla_core::spa::{IostatNode, IostatSnapshot, PoolListRow, VolumeInfo};
use zilla_core::vdev::queue::LeafStats;
use zilla_core::vdev::IoClass;


pub use crate::reads::View;

pub fn router(v: Arc<View>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/status", get(index))
        .route("/ui/worksheet", get(worksheet))
        .route("/ui/assets/{*file}", get(asset))
        .route("/metrics", get(metrics))
        .with_state(v.clone())
        .merge(crate::analytics::routes(v.analytics.clone()))
        .merge(crate::reads::routes("/api/v1", v))
}

/// One file of the web UI, compiled in.
struct Asset {
    /// The path under `/ui/assets/`.
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset { name: $name, content_type: $type, body: include_bytes!(concat!("../assets/", $name)) }
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file under `/ui/assets/` (the pages themselves are `/` and `/ui/worksheet`).
static ASSETS: &[Asset] = &[
    asset!("zilla.css", CSS),
    asset!("common.js", JS),
    asset!("dashboard.js", JS),
    asset!("worksheet.js", JS),
    asset!("vendor/uplot/uPlot.iife.min.js", JS),
    asset!("vendor/uplot/uPlot.min.css", CSS),
    asset!("vendor/uplot/LICENSE", "text/plain; charset=utf-8"),
    asset!("vendor/uplot/README", "text/plain; charset=utf-8"),
];

static DASHBOARD_HTML: &str = include_str!("../assets/dashboard.html");
static WORKSHEET_HTML: &str = include_str!("../assets/worksheet.html");

/// A strong validator for a compiled-in body: FNV-1a of the bytes and the version
/// (the same binary always answers the same ETag; a new build a new one when a file
/// changed).
fn etag_of(body: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in body.iter().chain(env!("CARGO_PKG_VERSION").as_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}\"")
}

/// A compiled-in file: 304 when the browser's copy is current, else the body. The
/// browser revalidates each load (`no-cache`), so a new binary's files show at once.
fn compiled_in(headers: &HeaderMap, content_type: &'static str, body: &'static [u8]) -> Response {
    let etag = etag_of(body);
    let cache = (header::CACHE_CONTROL, "no-cache");
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.split(',').any(|t| t.trim() == etag)) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag), (cache.0, cache.1.to_string())]).into_response();
    }
    (
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::ETAG, etag),
            (cache.0, cache.1.to_string()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
        ],
        body,
    )
        .into_response()
}

async fn asset(UrlPath(file): UrlPath<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == file) {
        Some(a) => compiled_in(&headers, a.content_type, a.body),
        None => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "no such asset\n").into_response(),
    }
}

/// The pages load scripts, styles and data from this origin only (and no frame may
/// embed them): what the test asserts, the browser enforces.
const PAGE_POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'";

fn page(headers: &HeaderMap, html: &'static str) -> Response {
    let mut r = compiled_in(headers, "text/html; charset=utf-8", html.as_bytes());
    r.headers_mut().insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static(PAGE_POLICY));
    r
}

async fn dashboard(headers: HeaderMap) -> Response {
    page(&headers, DASHBOARD_HTML)
}

async fn worksheet(headers: HeaderMap) -> Response {
    page(&headers, WORKSHEET_HTML)
}

/// Everything the page and the metrics need, gathered off the async threads.
struct Snapshot {
    rows: Vec<PoolListRow>,
    /// Imported pools, then those in the cache file not imported (UNAVAIL, with why).
    status: Vec<crate::api::PoolStatusEntry>,
    iostat: Vec<IostatSnapshot>,
    volumes: Vec<VolumeInfo>,
    /// Per pool: the intent-log counters (OpenZFS kstat names).
    zil: Vec<(String, Vec<(&'static str, u64)>)>,
    /// Per pool: the write throttle's dirty bytes and counters (dmu_tx kstat).
    dmu_tx: Vec<(String, zilla_core::dsl_pool::ThrottleStats)>,
    /// Per pool: autotrim's counters.
    trim: Vec<(String, Vec<(&'static str, u64)>)>,
    frontend: FrontendMetrics,
    memory: crate::memory::MemoryReport,
    /// The `/v1/arcstats` map.
    arcstats: std::collections::BTreeMap<String, u64>,
}

/// The front ends' side of /metrics: budgets, limits and NBD counters.
struct FrontendMetrics {
    stats: zilla_frontend::FrontendStats,
    nbd: zilla_nbd::NbdStatsSnapshot,
    nbd_connections_max: usize,
    nbd_in_flight_requests_max: usize,
    nbd_idle_timeout_s: u64,
    nbd_reply_stall_timeout_s: u64,
    iscsi: zilla_iscsi::IscsiStatsSnapshot,
    /// Every volume a client opened: the target of its iSCSI sessions, the export of
    /// its NBD ones.
    volumes: Vec<(String, zilla_frontend::VolumeIoSnapshot)>,
    /// Every client (initiator) the bounded client table holds.
    clients: Vec<zilla_frontend::ClientIoSnapshot>,
}

impl FrontendMetrics {
    fn of(v: &View) -> FrontendMetrics {
        let config = &v.nbd_config;
        FrontendMetrics {
            stats: v.frontend.stats(),
            nbd: v.nbd_stats.snapshot(&v.frontend.io_stats),
            nbd_connections_max: config.connections_max,
            nbd_in_flight_requests_max: config.in_flight_requests_max,
            nbd_idle_timeout_s: config.idle_timeout.as_secs(),
            nbd_reply_stall_timeout_s: config.reply_stall_timeout.as_secs(),
            iscsi: v.iscsi_stats.snapshot(&v.frontend.io_stats),
            volumes: v.frontend.io_stats.snapshot(),
            clients: v.frontend.clients.snapshot(&v.frontend.io_stats),
        }
    }
}

async fn snapshot(v: &Arc<View>) -> Result<Snapshot, String> {
    let pools = v.pools.all();
    let unavailable = v.pools.unavailable(None);
    let frontend = FrontendMetrics::of(v);
    let v2 = v.clone();
    tokio::task::spawn_blocking(move || {
        let memory = crate::reads::memory_report(&v2);
        Snapshot {
            arcstats: crate::arcstats::arcstats_map(&memory, &v2.pools),
            memory,
            frontend,
            rows: pools.iter().map(|(_, p)| p.list_row()).chain(unavailable.iter().map(|u| u.list_row())).collect(),
            status: pools
                .iter()
                .map(|(_, p)| crate::api::PoolStatusEntry { status: p.status(), unavailable: None })
                .chain(unavailable.iter().map(|u| u.status()))
                .collect(),
            iostat: pools.iter().map(|(_, p)| p.iostat()).collect(),
            volumes: pools.iter().flat_map(|(_, p)| p.volumes()).collect(),
            zil: pools.iter().map(|(n, p)| (n.clone(), p.zil_stats())).collect(),
            dmu_tx: pools.iter().map(|(n, p)| (n.to_string(), p.throttle_stats())).collect(),
            trim: pools.iter().map(|(n, p)| (n.clone(), p.trim_stats())).collect(),
        }
    })
    .await
    .map_err(|e| format!("storage engine error: {e}"))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

async fn index(State(v): State<Arc<View>>) -> Html<String> {
    let mut o = String::from(
        "<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=5>\
         <title>zilla</title><style>body{font-family:sans-serif;margin:2em}\
         pre{background:#f4f4f4;padding:1em}td,th{padding:0 1em;text-align:right}\
         td:first-child,th:first-child{text-align:left}</style></head><body><h1>zilla</h1>",
    );
    let _ = write!(
        o,
        "<p>state dir <code>{}</code> &middot; NBD {} &middot; <a href=/>dashboard</a> &middot; <a href=/ui/worksheet>analytics</a> &middot; <a href=/metrics>/metrics</a></p>",
        esc(&v.state_dir),
        esc(v.nbd_tcp.as_deref().unwrap_or("off"))
    );
    match snapshot(&v).await {
        Err(e) => {
            let _ = write!(o, "<p>{}</p>", esc(&e));
        }
        Ok(s) => {
            let cols = crate::format::list_columns(None).unwrap_or_default();
            let _ = write!(o, "<h2>Pools</h2><pre>{}</pre>", esc(&crate::format::pool_list(&s.rows, &cols, false, false)));
            let _ = write!(o, "<h2>Volumes</h2><pre>{}</pre>", esc(&crate::format::volume_list(&s.volumes, false, false)));
            for st in &s.status {
                let text = crate::format::pool_status(&st.status, st.unavailable.as_deref(), true);
                let _ = write!(o, "<h2>{}</h2><pre>{}</pre>", esc(&crate::clip::clip(&st.status.name)), esc(&text));
            }
        }
    }
    o.push_str("</body></html>\n");
    Html(o)
}

fn health_code(h: &str) -> u8 {
    match h {
        "ONLINE" => 0,
        "DEGRADED" => 1,
        "FAULTED" => 2,
        "OFFLINE" => 3,
        "UNAVAIL" => 4,
        "REMOVED" => 5,
        _ => 6,
    }
}

async fn metrics(State(v): State<Arc<View>>) -> impl IntoResponse {
    let body = match snapshot(&v).await {
        Ok(s) => render_metrics(&s),
        Err(e) => format!("# {}\n# EOF\n", e.replace('\n', " ")),
    };
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}

/// A label value escaped as the exposition format requires (`\\`, `\"`, `\n`), and
/// the characters every other output escapes (controls, bidi overrides, invisible
/// format characters: `printable`) written as the text `\u{...}`; the
/// prometheus-client crate writes label values verbatim.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct LabelValue(String);

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        let mut escaped = String::with_capacity(self.0.len());
        for c in self.0.chars() {
            match c {
                '\\' => escaped.push_str("\\\\"),
                '"' => escaped.push_str("\\\""),
                '\n' => escaped.push_str("\\n"),
                c if zilla_core::spa::is_unsafe_char(c) => escaped.push_str(&format!("\\\\u{{{:x}}}", c as u32)),
                c => escaped.push(c),
            }
        }
        encoder.write_str(&escaped)
    }
}

type Labels = Vec<(&'static str, LabelValue)>;

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, LabelValue(v.to_string()))).collect()
}

/// Register a gauge family and fill it.
fn gauges(reg: &mut Registry, name: &str, help: &str, samples: impl IntoIterator<Item = (Labels, i64)>) {
    let family = Family::<Labels, Gauge>::default();
    for (l, v) in samples {
        family.get_or_create(&l).set(v);
    }
    reg.register(name, help, family);
}

/// A histogram given by its buckets (already counted elsewhere, here only encoded).
#[derive(Debug, Default)]
struct FixedHistogram {
    /// Per bucket: upper bound in seconds (`f64::MAX`: +Inf) and count (not cumulative).
    buckets: parking_lot::Mutex<(f64, u64, Vec<(f64, u64)>)>,
}

impl prometheus_client::encoding::EncodeMetric for FixedHistogram {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = &*self.buckets.lock();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(*sum, *count, buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

impl prometheus_client::metrics::TypedMetric for FixedHistogram {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Histogram;
}

/// Register a latency histogram family from [`zilla_frontend::LatencySnapshot`]s (folded to
/// power-of-two buckets) and the sum of the latencies in seconds.
fn latency_histograms<'a>(
    reg: &mut Registry,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, &'a zilla_frontend::LatencySnapshot)>,
) {
    let family = Family::<Labels, FixedHistogram>::default();
    for (l, latency) in samples {
        let count = latency.buckets.iter().sum();
        let sum_s = latency.sum_ns as f64 / 1e9;
        let bounds = latency.log2_buckets().into_iter().map(|(upper_s, n)| (upper_s.unwrap_or(f64::MAX), n)).collect();
        *family.get_or_create(&l).buckets.lock() = (sum_s, count, bounds);
    }
    reg.register(name, help, family);
}

/// Requests, bytes and latency of every volume (an iSCSI target, an NBD export) and
/// of every client (an iSCSI initiator by name, an NBD client by address), over both protocols.
fn register_volume_and_client_io(reg: &mut Registry, f: &FrontendMetrics) {
    let rows: Vec<(Labels, &zilla_frontend::VolumeIoSnapshot)> = f
        .volumes
        .iter()
        .map(|(name, io)| (labels(&[("volume", name)]), io))
        .chain(f.clients.iter().map(|c| (labels(&[("protocol", &c.protocol), ("client", &c.address)]), &c.io)))
        .collect();
    let with_op = |l: &Labels, op: &str| {
        let mut l = l.clone();
        l.push(("op", LabelValue(op.to_string())));
        l
    };
    let (volumes, clients) = rows.split_at(f.volumes.len());
    for (rows, what) in [(volumes, "volume"), (clients, "client")] {
        counters(reg, &format!("zilla_{what}_requests"), &format!("Requests completed per {what}, by operation"), rows.iter().flat_map(|(l, io)| {
            [
                (with_op(l, "read"), io.read_ops),
                (with_op(l, "write"), io.write_ops),
                (with_op(l, "flush"), io.flush_ops),
                (with_op(l, "trim"), io.trim_ops),
                (with_op(l, "other"), io.other_ops),
            ]
        }));
        counters(reg, &format!("zilla_{what}_bytes"), &format!("Request bytes per {what}, by operation (trim includes zeroing)"), rows.iter().flat_map(|(l, io)| {
            [(with_op(l, "read"), io.read_bytes), (with_op(l, "write"), io.write_bytes), (with_op(l, "trim"), io.trim_bytes)]
        }));
        counters(reg, &format!("zilla_{what}_request_errors"), &format!("Requests answered with an error per {what}"), rows.iter().map(|(l, io)| (l.clone(), io.error_ops)));
        latency_histograms(
            reg,
            &format!("zilla_{what}_request_latency_seconds"),
            &format!("Request service time per {what} (receipt to reply queued), by read, write and other"),
            rows.iter().flat_map(|(l, io)| {
                [(with_op(l, "read"), &io.latency_read), (with_op(l, "write"), &io.latency_write), (with_op(l, "other"), &io.latency_other)]
            }),
        );
    }
}

fn counters(reg: &mut Registry, name: &str, help: &str, samples: impl IntoIterator<Item = (Labels, u64)>) {
    let family = Family::<Labels, Counter>::default();
    for (l, v) in samples {
        family.get_or_create(&l).inc_by(v);
    }
    reg.register(name, help, family);
}

/// The exposition (OpenMetrics text). Family names are those of the ZFS exporters;
/// counter samples carry the `_total` suffix the format requires.
fn render_metrics(s: &Snapshot) -> String {
    let mut reg = Registry::default();
    let pl = |r: &PoolListRow| labels(&[("pool", &r.name)]);
    gauges(&mut reg, "zfs_pool_health", "Health: 0 online, 1 degraded, 2 faulted, 3 offline, 4 unavail, 5 removed, 6 suspended",
        s.rows.iter().map(|r| (pl(r), health_code(r.health.as_str()) as i64)));
    gauges(&mut reg, "zfs_pool_size_bytes", "Pool size in bytes", s.rows.iter().map(|r| (pl(r), r.size as i64)));
    gauges(&mut reg, "zfs_pool_allocated_bytes", "Allocated bytes", s.rows.iter().map(|r| (pl(r), r.alloc as i64)));
    gauges(&mut reg, "zfs_pool_free_bytes", "Free bytes", s.rows.iter().map(|r| (pl(r), r.free as i64)));
    let frag = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for r in &s.rows {
        frag.get_or_create(&pl(r)).set(r.frag_percent as f64 / 100.0);
    }
    reg.register("zfs_pool_fragmentation_ratio", "Free space fragmentation (0..1)", frag);
    gauges(&mut reg, "zfs_pool_readonly", "1 if the pool is read-only", s.rows.iter().map(|r| (pl(r), 0)));
    let vl = |v: &VolumeInfo| {
        let pool = v.name.split('/').next().unwrap_or("");
        labels(&[("name", &v.name), ("pool", pool), ("type", "volume")])
    };
    gauges(&mut reg, "zfs_dataset_used_bytes", "Bytes used by the volume", s.volumes.iter().map(|v| (vl(v), v.used as i64)));
    gauges(&mut reg, "zfs_dataset_volume_size_bytes", "Volume size (volsize)", s.volumes.iter().map(|v| (vl(v), v.volsize as i64)));

    // zpool_prometheus-style per-vdev counters: labels name (pool) and vdev path.
    let mut rows: Vec<(Labels, &LeafStats)> = vec![];
    for snap in &s.iostat {
        rows.push((labels(&[("name", &snap.pool), ("vdev", "root")]), &snap.stats));
        fn walk<'a>(pool: &str, prefix: &str, v: &'a IostatNode, out: &mut Vec<(Labels, &'a LeafStats)>) {
            let path = format!("{prefix}/{}", v.name);
            out.push((labels(&[("name", pool), ("vdev", &path)]), &v.stats));
            for c in &v.children {
                walk(pool, &path, c, out);
            }
        }
        for v in &snap.vdevs {
            walk(&snap.pool, "root", v, &mut rows);
        }
    }
    let sum = |st: &LeafStats, bytes: bool, read: bool| -> u64 {
        IoClass::ALL
            .iter()
            .filter(|&&c| c != IoClass::Trim && c.is_read() == read)
            .map(|&c| if bytes { st.bytes[c as usize] } else { st.ops[c as usize] })
            .sum::<u64>()
    };
    for (name, bytes, read, help) in [
        ("zpool_stats_read_ops", false, true, "Read operations"),
        ("zpool_stats_write_ops", false, false, "Write operations"),
        ("zpool_stats_read_bytes", true, true, "Bytes read"),
        ("zpool_stats_write_bytes", true, false, "Bytes written"),
    ] {
        counters(&mut reg, name, help, rows.iter().map(|(l, st)| (l.clone(), sum(st, bytes, read))));
    }
    counters(&mut reg, "zpool_stats_flushes", "Cache flushes", rows.iter().map(|(l, st)| (l.clone(), st.flushes)));
    register_vdev_queue(&mut reg, &rows);
    register_vdev_latency(&mut reg, &rows);
    register_health(&mut reg, &s.status);
    // the intent log: zfs_<kstat name>{pool}, one family per OpenZFS zil kstat
    register_pool_kstats(&mut reg, "zfs_", "Intent log counter (OpenZFS zil kstat)", &s.zil);
    register_dmu_tx(&mut reg, &s.dmu_tx);
    // autotrim: zilla_autotrim_{extents,bytes,skipped_bytes,errors}{pool}; the manual
    // trim (pool trim): zilla_trim_manual_{extents,bytes}{pool}
    register_pool_kstats(&mut reg, "zilla_", "Autotrim and manual trim: free space discarded on the devices (vdev::trim, spa/trim)", &s.trim);
    register_frontend(&mut reg, &s.frontend);
    register_memory(&mut reg, &s.memory);
    register_arcstats(&mut reg, &s.arcstats);
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        return format!("# cannot encode metrics: {e}\n# EOF\n");
    }
    out
}

/// Pool and vdev states, vdev error counters, scrub and resilver progress.
fn register_health(reg: &mut Registry, status: &[crate::api::PoolStatusEntry]) {
    register_pool_state(reg, status);
    register_vdev_health(reg, status);
    register_scan(reg, status);
}

/// node_exporter's `node_zfs_zpool_state{zpool,state}`: one sample per state it
/// knows, 1 for the pool's health and 0 for the others.
fn register_pool_state(reg: &mut Registry, status: &[crate::api::PoolStatusEntry]) {
    const STATES: [&str; 7] = ["online", "degraded", "faulted", "offline", "removed", "unavail", "suspended"];
    gauges(reg, "node_zfs_zpool_state", "Pool state: 1 for the pool's health, 0 for each other state (node_exporter's ZFS collector)", status.iter().flat_map(|e| {
        let health = e.status.state.as_str().to_ascii_lowercase();
        STATES.map(|st| (labels(&[("zpool", &e.status.name), ("state", st)]), (health == st) as i64))
    }));
}

/// Every vdev of the status tree with its `zpool_stats` path ("root/mirror-0/d1", as
/// the I/O counters name it), depth first.
fn vdev_paths<'a>(prefix: &str, nodes: &'a [zilla_core::spa::VdevStatus], out: &mut Vec<(String, &'a zilla_core::spa::VdevStatus)>) {
    for v in nodes {
        let path = format!("{prefix}/{}", v.name);
        out.push((path.clone(), v));
        vdev_paths(&path, &v.children, out);
    }
}

/// zpool_prometheus's vdev_state_t value for a `zpool status` state (zfs.h:
/// 2 offline, 3 removed, 4 can't open, 5 faulted, 6 degraded, 7 healthy).
fn vdev_state_code(state: &str) -> i64 {
    match state {
        "ONLINE" => 7,
        "DEGRADED" => 6,
        "FAULTED" => 5,
        "UNAVAIL" => 4,
        "REMOVED" => 3,
        "OFFLINE" => 2,
        _ => 0,
    }
}

/// Per vdev: the error counters of `zpool status` (zpool_prometheus's
/// `zpool_stats_{read,write,cksum}_errors{name,vdev}`), its state as zpool_prometheus
/// gives it (`zpool_stats_state{name,vdev,state}` = vdev_state_t) and as a state set
/// (`zilla_vdev_state{pool,vdev,state}`: 1 for its state, 0 for the others).
fn register_vdev_health(reg: &mut Registry, status: &[crate::api::PoolStatusEntry]) {
    const STATES: [&str; 6] = ["online", "degraded", "faulted", "offline", "removed", "unavail"];
    let mut rows: Vec<(&str, String, &zilla_core::spa::VdevStatus)> = vec![];
    for e in status {
        let mut paths = vec![];
        vdev_paths("root", &e.status.config, &mut paths);
        rows.extend(paths.into_iter().map(|(path, v)| (e.status.name.as_str(), path, v)));
    }
    let l = |pool: &str, path: &str| labels(&[("name", pool), ("vdev", path)]);
    for (name, help, get) in [
        ("zpool_stats_read_errors", "Read errors (zpool status READ)", (|v| v.read_errors) as fn(&zilla_core::spa::VdevStatus) -> u64),
        ("zpool_stats_write_errors", "Write errors (zpool status WRITE)", |v| v.write_errors),
        ("zpool_stats_cksum_errors", "Checksum errors (zpool status CKSUM)", |v| v.cksum_errors),
    ] {
        counters(reg, name, help, rows.iter().map(|(pool, path, v)| (l(pool, path), get(v))));
    }
    gauges(reg, "zpool_stats_state", "Vdev state (vdev_state_t: 2 offline, 3 removed, 4 unavail, 5 faulted, 6 degraded, 7 online); the state label as zpool status shows it",
        rows.iter().map(|(pool, path, v)| (labels(&[("name", pool), ("vdev", path), ("state", &v.state)]), vdev_state_code(&v.state))));
    gauges(reg, "zilla_vdev_state", "Vdev state: 1 for the vdev's state, 0 for each other state", rows.iter().flat_map(|(pool, path, v)| {
        let state = v.state.to_ascii_lowercase();
        STATES.map(|st| (labels(&[("pool", pool), ("vdev", path), ("state", st)]), (state == st) as i64))
    }));
}

/// pdf/zfs_exporter's scrub family per pool: the last scrub's or resilver's repairs
/// and errors, when it completed, and, while one runs, its totals and rate.
fn register_scan(reg: &mut Registry, status: &[crate::api::PoolStatusEntry]) {
    type Get = fn(&zilla_core::scan::ScanStatus) -> u64;
    let running = |s: &zilla_core::scan::ScanStatus| s.state == zilla_core::scan::ScanState::Scanning;
    let rate: Get = |s| s.progress.as_ref().map_or(0, |p| p.issue_rate_bytes_per_s);
    let families: [(&str, &str, Get, bool); 7] = [
        ("zfs_pool_scrub_total_bytes", "Allocated bytes the scrub or resilver in progress walks, 0 if none runs", |s| s.to_examine_bytes, true),
        ("zfs_pool_scrub_scanned_bytes", "Bytes scanned so far by the scrub or resilver in progress, 0 if none runs", |s| s.examined_bytes, true),
        ("zfs_pool_scrub_issued_bytes", "Bytes verified so far by the scrub or resilver in progress, 0 if none runs", |s| s.issued_bytes, true),
        ("zfs_pool_scrub_rate_bytes_per_second", "Issue rate of the scrub or resilver in progress, 0 if none runs", rate, true),
        ("zfs_pool_scrub_repaired_bytes", "Bytes repaired by the most recent scrub or resilver", |s| s.repaired_bytes, false),
        ("zfs_pool_scrub_errors", "Errors found by the most recent scrub or resilver", |s| s.errors, false),
        ("zfs_pool_scrub_last_completed_timestamp_seconds", "Unix time the most recent scrub or resilver completed, 0 if none", |s| if s.state == zilla_core::scan::ScanState::Finished { s.end_time_s } else { 0 }, false),
    ];
    for (name, help, get, only_running) in families {
        gauges(reg, name, help, status.iter().map(|e| {
            let s = &e.status.scan;
            let v = if only_running && !running(s) { 0 } else { get(s) };
            (labels(&[("pool", &e.status.name)]), i64::try_from(v).unwrap_or(i64::MAX))
        }));
    }
}

/// One counter family `<prefix><kstat name>{pool}` per kstat of `per_pool` (every pool
/// has the same names in the same order).
fn register_pool_kstats(reg: &mut Registry, prefix: &str, help: &str, per_pool: &[(String, Vec<(&'static str, u64)>)]) {
    if let Some((_, first)) = per_pool.first() {
        for (i, (name, _)) in first.iter().enumerate() {
            let samples = per_pool.iter().map(|(pool, st)| (labels(&[("pool", pool)]), st.get(i).map_or(0, |x| x.1)));
            counters(reg, &format!("{prefix}{name}"), help, samples);
        }
    }
}

/// The I/O scheduler per vdev and class: queue depth now, and requests, device calls
/// and requests that went out inside an aggregate since import.
fn register_vdev_queue(reg: &mut Registry, rows: &[(Labels, &LeafStats)]) {
    let per_class = |f: &dyn Fn(&LeafStats, usize) -> u64| -> Vec<(Labels, u64)> {
        let mut out = vec![];
        for (l, st) in rows {
            for c in IoClass::ALL {
                let mut l = l.clone();
                l.push(("class", LabelValue(c.name().to_string())));
                out.push((l, f(st, c as usize)));
            }
        }
        out
    };
    let g = |v: Vec<(Labels, u64)>| v.into_iter().map(|(l, n)| (l, n as i64));
    gauges(reg, "zilla_vdev_queue_pending", "I/Os queued in the class, not yet issued", g(per_class(&|s, c| s.queued[c] as u64)));
    gauges(reg, "zilla_vdev_queue_active", "I/Os of the class issued to the device", g(per_class(&|s, c| s.active[c] as u64)));
    counters(reg, "zilla_vdev_requests", "Requests completed", per_class(&|s, c| s.ops[c]));
    counters(reg, "zilla_vdev_device_ops", "Device calls (an aggregate is one)", per_class(&|s, c| s.device_ops[c]));
    counters(reg, "zilla_vdev_aggregated", "Requests that reached the device inside an aggregate", per_class(&|s, c| s.aggregated[c]));
}

/// zpool_prometheus's latency histograms per vdev: `zpool_latency_{total,disk}_wait_
/// {read,write}` (total: queued and on the device; disk: on the device), the `zpool
/// iostat -w` power-of-two buckets in seconds. Reads are the read classes (sync,
/// async, scrub), writes the write classes; trim is not counted.
fn register_vdev_latency(reg: &mut Registry, rows: &[(Labels, &LeafStats)]) {
    for (wait, total) in [("total_wait", true), ("disk_wait", false)] {
        for (direction, read) in [("read", true), ("write", false)] {
            let family = Family::<Labels, FixedHistogram>::default();
            for (l, st) in rows {
                let (hists, sums) = if total { (&st.total_latency_hist, &st.total_latency_sum_ns) } else { (&st.disk_latency_hist, &st.disk_latency_sum_ns) };
                let classes: Vec<usize> = IoClass::ALL.iter().filter(|&&c| c != IoClass::Trim && c.is_read() == read).map(|&c| c as usize).collect();
                let mut buckets = vec![0u64; zilla_core::kstat::HISTOGRAM_BUCKETS];
                for &c in &classes {
                    for (b, n) in buckets.iter_mut().zip(hists.get(c).map(Vec::as_slice).unwrap_or(&[])) {
                        *b += n;
                    }
                }
                let sum_s = classes.iter().map(|&c| sums[c]).sum::<u64>() as f64 / 1e9;
                let count = buckets.iter().sum();
                let last = buckets.len() - 1;
                let bounds = buckets.iter().enumerate().map(|(i, &n)| (if i == last { f64::MAX } else { (1u64 << (i + 1)) as f64 / 1e9 }, n)).collect();
                *family.get_or_create(l).buckets.lock() = (sum_s, count, bounds);
            }
            let help = format!("{} latency of {direction}s per vdev (zpool iostat -w buckets)", if total { "Total (queued and device)" } else { "Device" });
            reg.register(format!("zpool_latency_{wait}_{direction}"), help, family);
        }
    }
}

/// The write throttle per pool, named after OpenZFS's dmu_tx kstat: dirty bytes and
/// their limit, writes delayed by the dirty-data curve or blocked at the dirty max, and
/// (legacy mode) writes delayed a tick or stopped at a full txg's write limit.
fn register_dmu_tx(reg: &mut Registry, pools: &[(String, zilla_core::dsl_pool::ThrottleStats)]) {
    let pl = |n: &String| labels(&[("pool", n)]);
    gauges(reg, "zilla_dmu_tx_dirty_bytes", "Dirty data not yet synced", pools.iter().map(|(n, t)| (pl(n), t.dirty_bytes as i64)));
    gauges(reg, "zilla_dmu_tx_dirty_max_bytes", "zfs_dirty_data_max in effect", pools.iter().map(|(n, t)| (pl(n), t.dirty_max as i64)));
    gauges(reg, "zilla_dmu_tx_write_limit_bytes", "Legacy throttle: the open txg's write limit", pools.iter().map(|(n, t)| (pl(n), t.write_limit_bytes as i64)));
    for (name, help, get) in [
        ("zilla_dmu_tx_dirty_delay", "Writes delayed by the dirty-data delay curve", (|t| t.delayed_writes) as fn(&zilla_core::dsl_pool::ThrottleStats) -> u64),
        ("zilla_dmu_tx_dirty_over_max", "Writes blocked with dirty data at zfs_dirty_data_max", |t| t.blocked_writes),
        ("zilla_dmu_tx_delay", "Legacy throttle: writes delayed one tick past 7/8 of the write limit", |t| t.legacy_delayed_writes),
        ("zilla_dmu_tx_write_limit", "Legacy throttle: writes that waited for the next txg at the write limit", |t| t.legacy_txg_full_waits),
        ("zilla_dmu_tx_space_wait", "Writes and frees that waited for a txg sync because the pool was too full to admit them", |t| t.space_waits),
    ] {
        counters(reg, name, help, pools.iter().map(|(n, t)| (pl(n), get(t))));
    }
}

/// An unlabelled gauge.
fn gauge(reg: &mut Registry, name: &str, help: &str, value: u64) {
    let metric = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    metric.set(i64::try_from(value).unwrap_or(i64::MAX));
    reg.register(name, help, metric);
}

/// An unlabelled counter.
fn counter(reg: &mut Registry, name: &str, help: &str, value: u64) {
    let metric = Counter::<u64>::default();
    metric.inc_by(value);
    reg.register(name, help, metric);
}

/// `zilla_memory_*`: resident memory and the overhead beyond ARC and dirty data, by
/// part, with its bound (memory.rs).
fn register_memory(reg: &mut Registry, m: &crate::memory::MemoryReport) {
    gauge(reg, "zilla_memory_rss_bytes", "Resident memory of the daemon", m.rss);
    gauge(reg, "zilla_memory_overhead_bytes", "Resident memory beyond the ARC and dirty data", m.overhead);
    gauge(reg, "zilla_memory_overhead_frontend_bytes", "Overhead part: front-end budget in use (request and reply data)", m.frontend);
    gauge(reg, "zilla_memory_overhead_reply_pool_bytes", "Overhead part: idle reply buffers kept for reuse", m.reply_pool);
    gauge(reg, "zilla_memory_overhead_block_buffers_bytes", "Overhead part: free block buffers the slab keeps for reuse", m.block_buffers_idle);
    gauge(reg, "zilla_memory_overhead_other_bytes", "Overhead part: engine buffers, thread stacks, memory the allocator keeps", m.other);
    gauge(reg, "zilla_memory_overhead_max_bytes", "Bound of the overhead: front-end budget + reply-pool cap + 192 MiB + 128 KiB per NBD connection", m.overhead_max);
    gauge(reg, "zilla_memory_overhead_frontend_max_bytes", "Bound of the front-end part: the front-end memory budget", m.frontend_max);
    gauge(reg, "zilla_memory_overhead_reply_pool_max_bytes", "Bound of the reply-pool part: the reply-buffer pool cap", m.reply_pool_max);
    gauge(reg, "zilla_memory_overhead_block_buffers_max_bytes", "Bound of the whole free chunks the block-buffer slab keeps: min(1 GiB, ARC max + dirty max)", m.block_buffers_max);
}

/// node_exporter's ZFS collector names for the ARC: one gauge `node_zfs_arc_<name>` per
/// arcstats key (node_exporter exports them untyped, without a `_total` suffix; a
/// gauge keeps the name, so its dashboards and `rate()` queries work unchanged).
fn register_arcstats(reg: &mut Registry, map: &std::collections::BTreeMap<String, u64>) {
    for (name, value) in crate::arcstats::node_exporter_keys(map) {
        // the read-ahead's counters are OpenZFS's zfetchstats: node_zfs_zfetch_<name>
        match name.strip_prefix("zfetch_") {
            Some(z) => gauge(reg, &format!("node_zfs_zfetch_{z}"), &format!("Read-ahead statistic {z} (OpenZFS zfetchstats)"), value),
            None => gauge(reg, &format!("node_zfs_arc_{name}"), &format!("ARC statistic {name} (OpenZFS arcstats)"), value),
        }
    }
}

/// `zilla_frontend_*` (memory budget, volume calls, reply buffers) and `zilla_nbd_*`
/// (limits, connections by fate, requests and bytes by operation).
fn register_frontend(reg: &mut Registry, f: &FrontendMetrics) {
    let (memory, calls, buffers) = (&f.stats.memory, &f.stats.volume_calls, &f.stats.buffers);
    gauge(reg, "zilla_frontend_memory_budget_bytes", "Configured front-end memory budget for request and reply data", memory.total);
    gauge(reg, "zilla_frontend_memory_in_use_bytes", "Front-end memory budget in use", memory.in_use);
    gauge(reg, "zilla_frontend_memory_reserve_bytes", "Part of the budget kept for connections holding nothing", memory.reserve);
    counter(reg, "zilla_frontend_memory_waits", "Requests that waited for the memory budget", memory.waits);
    gauge(reg, "zilla_frontend_volume_calls_max", "Volume calls allowed in flight (blocking-pool threads)", calls.total);
    gauge(reg, "zilla_frontend_volume_calls_in_use", "Volume calls in flight", calls.in_use);
    gauge(reg, "zilla_frontend_buffer_pool_bytes", "Bytes of idle reply buffers kept for reuse", buffers.pooled_bytes);
    gauge(reg, "zilla_frontend_buffer_pool_max_bytes", "Cap of the reply-buffer pool", buffers.bytes_max);
    gauge(reg, "zilla_nbd_connections_max", "NBD connection cap per listener", f.nbd_connections_max as u64);
    gauge(reg, "zilla_nbd_in_flight_requests_max", "NBD requests in flight per connection", f.nbd_in_flight_requests_max as u64);
    gauge(reg, "zilla_nbd_idle_timeout_seconds", "NBD idle timeout after the handshake (0: never)", f.nbd_idle_timeout_s);
    gauge(reg, "zilla_nbd_reply_stall_timeout_seconds", "NBD reply stall timeout (0: never)", f.nbd_reply_stall_timeout_s);
    let n = &f.nbd;
    gauge(reg, "zilla_nbd_connections_open", "NBD connections open", n.connections_active);
    counter(reg, "zilla_nbd_connections_accepted", "NBD connections accepted", n.connections_accepted);
    counter(reg, "zilla_nbd_sessions_started", "NBD connections that reached the data phase", n.sessions_started);
    counter(reg, "zilla_nbd_connections_refused", "NBD connections closed in the handshake (refused or unknown export, abort or list only, timeout, protocol error)", n.connections_refused);
    counter(reg, "zilla_nbd_connections_evicted", "Idle NBD connections closed to make room at the cap", n.connections_evicted);
    counter(reg, "zilla_nbd_connections_idle_timed_out", "NBD connections closed by the idle timeout", n.connections_idle_timed_out);
    counter(reg, "zilla_nbd_replies_written_direct", "NBD replies written by the thread that finished the request", n.replies_written_direct);
    counter(reg, "zilla_nbd_replies_written_by_writer", "NBD replies written by a connection's writer task (socket full or busy)", n.replies_written_by_writer);
    counter(reg, "zilla_nbd_accept_errors", "Failed NBD accept calls (EMFILE and the like)", n.accept_errors);
    let op = |name: &str| labels(&[("op", name)]);
    let io = &n.io;
    counters(reg, "zilla_nbd_requests", "NBD requests completed, by operation", [
        (op("read"), io.read_ops),
        (op("write"), io.write_ops),
        (op("flush"), io.flush_ops),
        (op("trim"), io.trim_ops),
        (op("other"), io.other_ops),
    ]);
    counters(reg, "zilla_nbd_bytes", "NBD request bytes, by operation (trim includes write-zeroes)", [
        (op("read"), io.read_bytes),
        (op("write"), io.write_bytes),
        (op("trim"), io.trim_bytes),
    ]);
    counter(reg, "zilla_nbd_request_errors", "NBD requests answered with an error", io.error_ops);
    register_iscsi(reg, &f.iscsi);
    register_volume_and_client_io(reg, f);
}

/// `zilla_iscsi_*`: connections and logins by fate, commands and bytes.
fn register_iscsi(reg: &mut Registry, i: &zilla_iscsi::IscsiStatsSnapshot) {
    gauge(reg, "zilla_iscsi_connections_open", "iSCSI connections open", i.connections_active);
    counter(reg, "zilla_iscsi_connections_accepted", "iSCSI connections accepted", i.connections_accepted);
    counter(reg, "zilla_iscsi_sessions_started", "iSCSI normal sessions logged in", i.sessions_started);
    counter(reg, "zilla_iscsi_discovery_sessions", "iSCSI discovery sessions logged in", i.discovery_sessions);
    counter(reg, "zilla_iscsi_logins_refused", "iSCSI logins refused (unknown target, bad keys, authentication, timeout)", i.logins_refused);
    counter(reg, "zilla_iscsi_logins_auth_failed", "iSCSI logins refused for failed CHAP authentication or an initiator not allowed", i.logins_auth_failed);
    counter(reg, "zilla_iscsi_protocol_errors", "iSCSI PDUs rejected and connections closed on malformed PDUs", i.protocol_errors);
    counter(reg, "zilla_iscsi_commands_out_of_window", "iSCSI commands dropped for a CmdSN outside the window", i.commands_out_of_window);
    counter(reg, "zilla_iscsi_task_management", "iSCSI task management requests answered", i.task_management);
    let op = |name: &str| labels(&[("op", name)]);
    counters(reg, "zilla_iscsi_requests", "iSCSI volume requests completed, by operation", [
        (op("read"), i.io.read_ops),
        (op("write"), i.io.write_ops),
        (op("flush"), i.io.flush_ops),
    ]);
    counters(reg, "zilla_iscsi_bytes", "iSCSI request bytes, by operation", [(op("read"), i.io.read_bytes), (op("write"), i.io.write_bytes)]);
    counter(reg, "zilla_iscsi_request_errors", "iSCSI volume requests answered with an error", i.io.error_ops);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut reg = Registry::default();
        gauges(&mut reg, "t_bytes", "help", [(labels(&[("vdev", "a\nb\\c\"d")]), 1)]);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains(r#"t_bytes{vdev="a\nb\\c\"d"} 1"#), "{out}");
        let mut reg = Registry::default();
        gauges(&mut reg, "u_bytes", "help", [(labels(&[("vdev", "x\u{202e}y\u{1b}z")]), 1)]);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains(r#"u_bytes{vdev="x\\u{202e}y\\u{1b}z"} 1"#), "{out}");
        assert!(out.ends_with("# EOF\n"));
    }

    #[test]
    fn arcstats_keys_are_node_exporter_gauges() {
        let mut reg = Registry::default();
        let map: std::collections::BTreeMap<String, u64> =
            [("hits", 12u64), ("l2_hits", 3), ("zfetch_hits", 4), ("zilla_overhead_bytes", 9)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
        register_arcstats(&mut reg, &map);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("\nnode_zfs_arc_hits 12\n"), "{out}");
        assert!(out.contains("\nnode_zfs_arc_l2_hits 3\n"), "{out}");
        assert!(out.contains("\nnode_zfs_zfetch_hits 4\n") && !out.contains("arc_zfetch"), "{out}");
        assert!(!out.contains("zilla_overhead"), "{out}");
    }

    #[test]
    fn assets_are_compiled_in_and_pages_name_only_served_assets() {
        for a in ASSETS {
            assert!(!a.body.is_empty(), "{} is empty", a.name);
        }
        // every /ui/assets/ URL the pages and scripts name is one we serve (no
        // request would 404, none goes elsewhere)
        let texts = [DASHBOARD_HTML, WORKSHEET_HTML];
        for text in texts {
            for (i, _) in text.match_indices("/ui/assets/") {
                let rest = &text[i + "/ui/assets/".len()..];
                let name: String = rest.chars().take_while(|c| !matches!(c, '"' | '\'' | ' ' | '>')).collect();
                assert!(ASSETS.iter().any(|a| a.name == name), "page names unserved asset {name}");
            }
            assert!(!text.contains("http://") && !text.contains("https://"), "a page names another origin");
        }
        assert_eq!(etag_of(b"x"), etag_of(b"x"));
        assert_ne!(etag_of(b"x"), etag_of(b"y"));
    }

    #[test]
    fn unlabelled_samples_have_no_braces() {
        let mut reg = Registry::default();
        gauge(&mut reg, "zilla_x_bytes", "help", 5);
        counter(&mut reg, "zilla_y", "help", 7);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("\nzilla_x_bytes 5\n"), "{out}");
        assert!(out.contains("\nzilla_y_total 7\n"), "{out}");
    }
}
