//! The read-only admin queries, served twice by the same handlers: under `/v1/` on the
//! admin Unix socket and under `/api/v1/` on the HTTP port (for the web dashboard).
//!
//! Theory of operation
//! -------------------
//! Every handler here reads through a [`View`] (the pool table, the front end and its
//! counters, the daemon's info and notices) and nothing else, so none of them can
//! change a pool: what changes state stays in daemon.rs, on the socket only. The
//! daemon merges [`routes`]`("/v1", ...)` into its admin router (whose POST on
//! `/v1/pools` shares the path with the GET here); web.rs nests `routes("/api/v1", ...)`.
//! Both answer with the same JSON because they are the same functions.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use zilla_core::spa::Pool;

use crate::api::{ClientRow, DaemonInfo, IostatEntry, PoolStatusEntry, TxgEntry};
use crate::api_error::ApiError;
use crate::api_error::{blocking, blocking_for};
use crate::pools::{PoolTable, Unavailable};

/// What the pages, the read-only API and /metrics read, and all they may: the pool
/// table, the front end every protocol shares, the NBD server's counters and limits,
/// where the daemon serves and what it noticed at start. The daemon builds it; nothing
/// here changes any of them.
pub struct View {
    pub pools: Arc<PoolTable>,
    pub frontend: Arc<zilla_frontend::Frontend>,
    pub nbd_stats: Arc<zilla_nbd::NbdStats>,
    pub nbd_config: zilla_nbd::NbdConfig,
    /// The iSCSI target's counters.
    pub iscsi_stats: Arc<zilla_iscsi::IscsiStats>,
    pub state_dir: String,
    /// The NBD TCP address, if NBD listens on TCP.
    pub nbd_tcp: Option<String>,
    /// What `/v1/info` answers (without the notices).
    pub info: crate::api::DaemonInfo,
    /// What the admin should know about this start (`/v1/info`'s notices).
    pub notices: Arc<parking_lot::Mutex<Vec<String>>>,
    /// The statistics history (`/api/v1/analytics`).
    pub analytics: Arc<crate::analytics::Analytics>,
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// The read-only routes under `prefix` (`/v1` on the socket, `/api/v1` on HTTP).
pub fn routes(prefix: &str, v: Arc<View>) -> Router {
    Router::new()
        .route(&format!("{prefix}/info"), get(info))
        .route(&format!("{prefix}/pools"), get(pool_list))
        .route(&format!("{prefix}/status"), get(pool_status))
        .route(&format!("{prefix}/iostat"), get(pool_iostat))
        .route(&format!("{prefix}/pools/{{pool}}/props"), get(pool_props))
        .route(&format!("{prefix}/pools/{{pool}}/txgs"), get(pool_txgs))
        .route(&format!("{prefix}/volumes"), get(volume_list))
        .route(&format!("{prefix}/arcstats"), get(arcstats))
        .route(&format!("{prefix}/zilstats"), get(zilstats))
        .route(&format!("{prefix}/clients"), get(client_list))
        .with_state(v)
}

/// The imported pool `name`; for a pool of the cache file not imported here, an
/// error that says so, why, and the way out (not "no such pool").
pub fn pool_named(pools: &PoolTable, name: &str) -> Result<Arc<Pool>, ApiError> {
    if let Some(p) = pools.get(name) {
        return Ok(p);
    }
    let Some(u) = pools.unavailable_entry(name) else {
        return Err(ApiError::not_found("no such pool"));
    };
    let shown = crate::clip::clip(name);
    let way_out = if u.reason.contains("zilla pool import") {
        String::new()
    } else {
        format!("; once its devices (or their labels) are fixed, import it with `zilla pool import {shown}`")
    };
    Err(ApiError(StatusCode::CONFLICT, format!("pool '{shown}' is UNAVAIL (not imported): {}{way_out}", u.reason)))
}

/// The daemon's memory beyond the ARC and dirty data, and its bound (memory.rs).
pub fn memory_report(v: &View) -> crate::memory::MemoryReport {
    let active = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let connections = active(&v.nbd_stats.connections_active) + active(&v.iscsi_stats.connections_active);
    crate::memory::measure(&v.pools, &v.frontend.stats(), connections)
}

async fn info(State(v): State<Arc<View>>) -> Json<DaemonInfo> {
    Json(DaemonInfo { notices: v.notices.lock().clone(), ..v.info.clone() })
}

#[derive(Deserialize)]
struct PoolQuery {
    pool: Option<String>,
}

/// The named pool, or every pool (sorted by name).
fn select_pools(pools: &PoolTable, q: &PoolQuery) -> Result<Vec<Arc<Pool>>, ApiError> {
    match &q.pool {
        Some(p) => Ok(vec![pool_named(pools, p)?]),
        None => Ok(pools.all().into_iter().map(|(_, p)| p).collect()),
    }
}

/// The imported pools the query selects and the unavailable ones; "no such pool" when
/// a named pool is neither.
fn select_all(pools: &PoolTable, q: &PoolQuery) -> Result<(Vec<Arc<Pool>>, Vec<Unavailable>), ApiError> {
    let unavailable = pools.unavailable(q.pool.as_deref());
    if q.pool.is_some() && !unavailable.is_empty() {
        return Ok((vec![], unavailable));
    }
    Ok((select_pools(pools, q)?, unavailable))
}

async fn pool_list(State(v): State<Arc<View>>, Query(q): Query<PoolQuery>) -> ApiResult<Vec<zilla_core::spa::PoolListRow>> {
    let (pools, unavailable) = select_all(&v.pools, &q)?;
    let mut rows: Vec<_> = blocking(move || Ok(pools.iter().map(|p| p.list_row()).collect::<Vec<_>>())).await?;
    rows.extend(unavailable.iter().map(|u| u.list_row()));
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(rows))
}

async fn pool_status(State(v): State<Arc<View>>, Query(q): Query<PoolQuery>) -> ApiResult<Vec<PoolStatusEntry>> {
    let (pools, unavailable) = select_all(&v.pools, &q)?;
    let mut out: Vec<PoolStatusEntry> = blocking(move || {
        Ok(pools.iter().map(|p| PoolStatusEntry { status: p.status(), unavailable: None }).collect::<Vec<_>>())
    })
    .await?;
    out.extend(unavailable.iter().map(|u| u.status()));
    out.sort_by(|a, b| a.status.name.cmp(&b.status.name));
    Ok(Json(out))
}

async fn pool_iostat(State(v): State<Arc<View>>, Query(q): Query<PoolQuery>) -> ApiResult<Vec<IostatEntry>> {
    let pools = select_pools(&v.pools, &q)?;
    let table = v.pools.clone();
    Ok(Json(
        blocking(move || {
            Ok(pools
                .iter()
                .map(|p| {
                    let snapshot = p.iostat();
                    IostatEntry::new(table.opened_ns(&snapshot.pool), &snapshot)
                })
                .collect())
        })
        .await?,
    ))
}

async fn pool_props(State(v): State<Arc<View>>, UrlPath(pool): UrlPath<String>) -> ApiResult<Vec<zilla_core::props::PropRow>> {
    let p = pool_named(&v.pools, &pool)?;
    Ok(Json(blocking_for(&pool, move || Ok(p.get_pool_props())).await?))
}

#[derive(Deserialize)]
struct TxgsQuery {
    n: Option<usize>,
}

/// The pool's last `n` txgs (all it keeps, `zfs_txg_history`, without `n`), oldest first.
async fn pool_txgs(State(v): State<Arc<View>>, UrlPath(pool): UrlPath<String>, Query(q): Query<TxgsQuery>) -> ApiResult<Vec<TxgEntry>> {
    let p = pool_named(&v.pools, &pool)?;
    let n = q.n.unwrap_or(usize::MAX);
    Ok(Json(p.txg_history(n).iter().map(TxgEntry::from_record).collect()))
}

async fn volume_list(State(v): State<Arc<View>>, Query(q): Query<PoolQuery>) -> ApiResult<Vec<zilla_core::spa::VolumeInfo>> {
    let pools = select_pools(&v.pools, &q)?;
    let mut out = blocking(move || Ok(pools.iter().flat_map(|p| p.volumes()).collect::<Vec<_>>())).await?;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(out))
}

/// Per-client front-end counters (bounded table; see zilla-frontend iostats).
async fn client_list(State(v): State<Arc<View>>) -> Json<Vec<ClientRow>> {
    Json(v.frontend.clients.snapshot(&v.frontend.io_stats))
}

/// The intent-log kstat (OpenZFS names, /proc/spl/kstat/zfs/zil) summed over the
/// imported pools.
async fn zilstats(State(v): State<Arc<View>>) -> Json<BTreeMap<String, u64>> {
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    for (_, pool) in v.pools.all() {
        for (k, n) in pool.zil_stats() {
            *m.entry(k.to_string()).or_default() += n;
        }
    }
    Json(m)
}

/// arcstats kstat names -> values of the daemon's ARC (one for every pool; the names
/// are those of /proc/spl/kstat/zfs/arcstats), and Zilla's memory keys (arcstats.rs).
async fn arcstats(State(v): State<Arc<View>>) -> Json<BTreeMap<String, u64>> {
    Json(crate::arcstats::arcstats_map(&memory_report(&v), &v.pools))
}
