//! The daemon: `zilla serve` (and `zilla demo`, which runs the same code in-process).
//!
//! Theory of operation
//! -------------------
//! One process owns one *state directory*:
//!
//! ```text
//!   DIR/zilla.lock    flock'd for the daemon's lifetime; holds its pid
//!   DIR/zilla.cache   JSON: the pools this daemon has imported and their leaf specs
//!                     (one that cannot be read is moved aside to zilla.cache.bad and
//!                     the start goes on without it; `pool status` says so)
//!   DIR/zilla.sock    admin API: JSON over HTTP/1.1 (the CLI talks to this)
//!   DIR/nbd.sock      NBD over a unix socket (TCP on --nbd as well)
//! ```
//!
//! iSCSI is served on TCP (--iscsi, 127.0.0.1:3260 unless told), by the target of
//! crates/zilla-iscsi over the same front end (iscsi_glue.rs).
//!
//! Start: take the lock (a second daemon on the same directory is refused), remove a
//! stale socket, read the cache file and import each pool from its exact leaf list
//! (a pool that fails is logged and kept in the cache as unavailable, never fatal),
//! then serve the admin API, NBD, iSCSI, and the HTTP page/metrics.
//!
//! A pool that is not imported stays in the cache file and shows as UNAVAIL with the
//! reason in `pool status` and `pool list` until the admin imports it (`pool import
//! NAME`, from its cached leaves), exports or destroys it (both just forget it):
//!
//! ```text
//!   import at start failed        reason: the import error; retried at every start
//!   held                          the daemon stopped on a broken invariant while
//!                                 working for it (DIR/zilla.stopped, written by the
//!                                 panic hook, is folded into the cache entry at the
//!                                 next start): not imported automatically again, so
//!                                 one pool cannot crash-loop the daemon
//!   serve --no-import             every pool; the cache file is kept as it is
//! ```
//!
//! A kill -9 or a power cut leaves no stop record: every pool comes back. Export marks
//! the pool's cache entry `exporting` before the engine exports it and drops the entry
//! after, so a pool whose export was cut short is imported again at the next start.
//!
//! Every change to the set of pools or their devices (create, import, export,
//! destroy, add, attach, detach, replace) rewrites the cache file atomically (write a
//! temporary file, fsync, rename, fsync the directory), under the admin mutex that
//! serialises configuration changes.
//!
//! Stop (SIGTERM/SIGINT): stop accepting everywhere, give the NBD server and the iSCSI
//! target a bounded time
//! to finish in-flight requests, then `sync` and `export` every pool *without* removing
//! it from the cache, so the next start imports it again; remove the sockets; exit 0.
//!
//! The daemon owns the parts and wires them, and none of them knows the daemon: the
//! pool table (pools.rs), the one front end every protocol shares (zilla-frontend's
//! `Frontend`: export registry over the pool table (exports.rs), budgets, sessions,
//! statistics), handed to the NBD server (nbd_glue.rs) and the iSCSI target (iscsi_glue.rs),
//! and a read-only view of both (web.rs `View`) for the web pages, /metrics and the
//! read-only queries (reads.rs), which the admin socket serves under `/v1` and the HTTP
//! port under `/api/v1`. The admin API below changes the pool table and asks the front
//! end's sessions; it is on the socket only.
//!
//! Engine calls block (device I/O, txg syncs); the async side reaches them only
//! through `spawn_blocking`. A panic anywhere is a broken invariant: the panic hook
//! (`stop_on_broken_invariant` in main.rs) logs it and stops the daemon; see
//! docs/design.md "Broken invariants".

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::watch;
use zilla_core::spa::{CreateOptions, Pool};
use zilla_core::vdev::LeafSpec;

use crate::api::*;
use crate::pools::{PoolTable, Unavailable};

pub const DEFAULT_NBD: &str = "127.0.0.1:10809";
pub const DEFAULT_HTTP: &str = "127.0.0.1:8080";
pub const DEFAULT_ISCSI: &str = "127.0.0.1:3260";
/// How long in-flight NBD requests get to finish at shutdown.
const NBD_DRAIN: Duration = Duration::from_secs(10);
/// How long shutdown waits on a suspended pool's final sync (see `export_all`).
const EXPORT_SUSPENDED_GRACE: Duration = Duration::from_secs(5);
/// How long running admin requests get to finish at shutdown.
const ADMIN_DRAIN: Duration = Duration::from_secs(5);
/// How long running page and /metrics requests get to finish at shutdown.
const HTTP_DRAIN: Duration = Duration::from_secs(2);

/// Where the daemon listens (`None` = that listener is off) and its limits.
#[derive(Debug, Clone)]
pub struct ServeOpts {
    pub nbd: Option<String>,
    pub iscsi: Option<String>,
    pub http: Option<String>,
    /// Config-file settings (limits, admin_group).
    pub settings: crate::config::Settings,
    /// Import no pool at start (`serve --no-import`); the cache file is kept.
    pub no_import: bool,
    /// `serve --iscsi-auth none`: a target without a CHAP user takes logins without
    /// authentication on any address (else on a loopback address only).
    pub iscsi_unauthenticated: bool,
}

impl ServeOpts {
    pub fn new(nbd: Option<String>, iscsi: Option<String>, http: Option<String>) -> ServeOpts {
        ServeOpts { nbd, iscsi, http, settings: Default::default(), no_import: false, iscsi_unauthenticated: false }
    }
}

/// Mark the pool a stop on a broken invariant was working for as held in the cache
/// (not imported at start until the admin imports it by hand).
fn hold_stopped_pool(cache: &mut CacheFile, stop: &crate::state_dir::StopRecord) {
    let Some(pool) = &stop.pool else {
        tracing::warn!("the daemon stopped on a broken invariant ({}) while working for no one pool; importing every pool", stop.message);
        return;
    };
    let shown = crate::clip::clip(pool);
    let Some(entry) = cache.pools.iter_mut().find(|e| &e.name == pool) else {
        tracing::warn!("the daemon stopped on a broken invariant while working for pool '{shown}', which is not in the cache file: {}", stop.message);
        return;
    };
    let when = crate::status_text::fmt_time(stop.time_unix_s);
    entry.held = Some(format!(
        "the daemon stopped on a broken invariant while working for this pool at {when}: {}; \
         import it by hand with `zilla pool import {shown}` once resolved",
        crate::clip::clip_message(&stop.message)
    ));
}

/// Prepare the state directory (create it private, refuse one others can write) and
/// take its lock.
pub fn lock_state_dir(dir: &Path, settings: &crate::config::Settings) -> anyhow::Result<StateLock> {
    let gid = crate::config::admin_gid(settings)?;
    let dir = crate::state_dir::prepare(dir, gid)?;
    crate::state_dir::lock(&dir)
}

pub use crate::state_dir::{read_cache, CacheEntry, CacheFile, StateLock, CACHE_VERSION};
use crate::state_dir::write_cache;

// ---------------------------------------------------------------------------------
// The daemon

pub struct Daemon {
    pub state_dir: PathBuf,
    pub pools: Arc<PoolTable>,
    /// Serialises configuration changes and cache-file writes.
    admin: tokio::sync::Mutex<()>,
    /// What the admin should know about this start (a cache file that could not be
    /// read): `/v1/info`, shown by `pool status` and the import listing.
    notices: Arc<Mutex<Vec<String>>>,
    pub info: DaemonInfo,
    /// The one front end every protocol shares (export registry over `pools`, memory
    /// and volume-call budgets, reply buffers, sessions, per-volume and per-client
    /// statistics); the daemon builds it and hands it to each front end and the web.
    pub frontend: Arc<zilla_frontend::Frontend>,
    /// The NBD server over `frontend` (its own counters and limits).
    pub nbd: zilla_nbd::NbdServer,
    /// The iSCSI target over `frontend` (its own counters and limits).
    pub iscsi: zilla_iscsi::IscsiServer,
    /// The statistics history the web UI draws (analytics.rs).
    pub analytics: Arc<crate::analytics::Analytics>,
    /// The pool events this daemon keeps (events.rs, `pool events`).
    pub events: Arc<crate::events::EventStore>,
}

impl crate::autoreplace::Host for Daemon {
    fn pools(&self) -> Vec<(String, Arc<Pool>)> {
        self.pools.all()
    }
    fn admin_lock(&self) -> &tokio::sync::Mutex<()> {
        &self.admin
    }
    async fn device_changed(self: Arc<Self>, pool: String, p: Arc<Pool>) {
        if let Err(ApiError(_, m)) = self.save_cache_after_device_change("the autoreplace").await {
            tracing::error!("pool '{}': {m}", crate::clip::clip(&pool));
        }
        self.finish_replacements_later(&pool, p);
    }
}

pub use crate::api_error::ApiError;
use crate::api_error::{blocking, blocking_for};

/// A JSON request body whose rejection (bad JSON, wrong type) is an [`ApiError`]: one
/// line, `{"error": ...}`, with any echoed value clipped.
pub struct ApiJson<T>(pub T);

impl<T, S> axum::extract::FromRequest<S> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(r) => Err(ApiError(r.status(), r.body_text())),
        }
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

impl Daemon {
    /// A daemon with no pool yet, and the one front end every protocol shares (its
    /// export registry reads the pool table), with the NBD server over it.
    fn new(
        state_dir: PathBuf,
        info: DaemonInfo,
        frontend_config: zilla_frontend::FrontendConfig,
        nbd_config: zilla_nbd::NbdConfig,
        iscsi_config: zilla_iscsi::IscsiConfig,
        analytics_memory_max_bytes: Option<u64>,
    ) -> Arc<Daemon> {
        let pools = Arc::new(PoolTable::default());
        // the block-buffer slab keeps free memory only while the ARC and the dirty data
        // leave room for it (docs/design.md, "Memory")
        zilla_core::vdev::abd::set_budget_fn(Arc::new(|| zilla_core::arc::daemon_arc().c_max() + zilla_core::dsl_pool::dirty_data_max()));
        let registry = Arc::new(crate::exports::Exports { pools: pools.clone() });
        // one clock for the daemon: the pools it imports, request latencies, Analytics
        let env = zilla_core::env::real();
        let frontend = zilla_frontend::Frontend::with_env(registry, frontend_config, &env);
        let nbd = crate::nbd_glue::server(frontend.clone(), nbd_config);
        let iscsi = crate::iscsi_glue::server(frontend.clone(), iscsi_config);
        let analytics_bytes = analytics_memory_max_bytes.unwrap_or(zilla_core::analytics::MEMORY_MAX_BYTES_DEFAULT);
        let analytics = crate::analytics::Analytics::open(&state_dir, env, analytics_bytes);
        let events = crate::events::EventStore::open(&state_dir);
        crate::events::spawn_pump(events.clone(), pools.clone());
        Arc::new(Daemon {
            analytics,
            events,
            state_dir,
            pools,
            notices: Arc::new(Mutex::new(vec![])),
            admin: tokio::sync::Mutex::new(()),
            info,
            frontend,
            nbd,
            iscsi,
        })
    }

    /// What the web pages, the read-only queries and /metrics read: the pool table, the
    /// front end, the NBD and iSCSI counters and limits, where the daemon serves, its
    /// notices.
    fn web_view(&self) -> Arc<crate::web::View> {
        Arc::new(crate::web::View {
            pools: self.pools.clone(),
            frontend: self.frontend.clone(),
            nbd_stats: self.nbd.stats().clone(),
            nbd_config: self.nbd.config().clone(),
            iscsi_stats: self.iscsi.stats().clone(),
            state_dir: self.info.state_dir.clone(),
            nbd_tcp: self.info.nbd_tcp.clone(),
            info: self.info.clone(),
            notices: self.notices.clone(),
            analytics: self.analytics.clone(),
        })
    }

    /// The imported pool `name`; for a pool of the cache file not imported here, an
    /// error that says so, why, and the way out (not "no such pool").
    fn pool(&self, name: &str) -> Result<Arc<Pool>, ApiError> {
        crate::reads::pool_named(&self.pools, name)
    }

    /// The export registry over this daemon's pools (what the front ends serve).
    fn exports(&self) -> crate::exports::Exports {
        crate::exports::Exports { pools: self.pools.clone() }
    }

    /// Split "pool/vol" and find the pool.
    fn volume_pool(&self, full: &str) -> Result<(Arc<Pool>, String), ApiError> {
        let (p, v) = full
            .split_once('/')
            .filter(|(p, v)| !p.is_empty() && !v.is_empty())
            .ok_or_else(|| ApiError::bad(format!("'{full}' is not a volume name (expected POOL/NAME)")))?;
        Ok((self.pool(p)?, v.to_string()))
    }

    /// Rewrite DIR/zilla.cache from the imported pools (+ unavailable ones), leaving
    /// out `without`. Called with the admin mutex held.
    async fn save_cache_without(self: &Arc<Self>, without: Option<&str>) -> Result<(), ApiError> {
        self.save_cache_edited(without, None).await
    }

    /// Rewrite DIR/zilla.cache, leaving out `without` and marking `exporting` as
    /// being exported.
    async fn save_cache_edited(self: &Arc<Self>, without: Option<&str>, exporting: Option<&str>) -> Result<(), ApiError> {
        let d = self.clone();
        let without = without.map(str::to_string);
        let exporting = exporting.map(str::to_string);
        blocking(move || {
            let mut pools: Vec<CacheEntry> = d
                .pools
                .all()
                .into_iter()
                .filter(|(name, _)| Some(name) != without.as_ref())
                .map(|(name, p)| CacheEntry { exporting: Some(&name) == exporting.as_ref(), ..CacheEntry::new(name, p.guid(), p.leaf_specs()) })
                .collect();
            pools.extend(d.pools.unavailable(None).into_iter().map(|u| u.entry).filter(|e| Some(&e.name) != without.as_ref()));
            pools.sort_by(|a, b| a.name.cmp(&b.name));
            write_cache(&d.state_dir, &CacheFile { version: CACHE_VERSION, pools }).map_err(|e| {
                let path = d.state_dir.join("zilla.cache");
                ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot write the cache file {}: {e}", path.display()))
            })
        })
        .await
    }

    async fn save_cache(self: &Arc<Self>) -> Result<(), ApiError> {
        self.save_cache_without(None).await
    }

    /// A replace answers once its resilver has started; this task completes it (the
    /// engine detaches the old device when the resilver has finished) and then writes
    /// the cache file. Started by `replace` and for a pool imported mid-replace.
    fn finish_replacements_later(self: &Arc<Self>, name: &str, p: Arc<Pool>) {
        if !p.replacing() {
            return;
        }
        let (d, name) = (self.clone(), name.to_string());
        tokio::spawn(async move {
            match blocking_for(&name, move || Ok(p.replace_wait()?)).await {
                Ok(()) => {
                    let _g = d.admin.lock().await;
                    if let Err(ApiError(_, m)) = d.save_cache_after_device_change("the replace").await {
                        tracing::error!("pool '{}': {m}", crate::clip::clip(&name));
                    }
                }
                Err(ApiError(_, m)) => tracing::warn!("pool '{}': {m}", crate::clip::clip(&name)),
            }
        });
    }

    /// Put a just-created or just-imported pool in the table and the cache file; if
    /// the cache file cannot be written, take it out again and `undo` it (destroy or
    /// export), so nothing changed. The error says what failed and what was undone.
    async fn commit_new_pool(
        self: &Arc<Self>,
        name: &str,
        pool: Arc<Pool>,
        undo: fn(&Pool) -> zilla_core::Result<()>,
        undone: &str,
    ) -> Result<(), ApiError> {
        let was_unavailable = self.pools.forget_unavailable(name);
        self.pools.insert(name.to_string(), pool.clone());
        let Err(ApiError(status, msg)) = self.save_cache().await else {
            self.finish_replacements_later(name, pool);
            return Ok(());
        };
        self.pools.remove(name);
        was_unavailable.into_iter().for_each(|u| self.pools.add_unavailable(u));
        let outcome = match blocking(move || Ok(undo(&pool)?)).await {
            Ok(()) => undone.to_string(),
            Err(ApiError(_, e)) => format!("undoing it failed as well ({e})"),
        };
        tracing::error!("pool '{name}': {msg}; {outcome}");
        Err(ApiError(status, format!("{msg}; {outcome}")))
    }

    /// Export or destroy a pool all or nothing: the cache file is written without it
    /// first (export: with it marked `exporting`, so an export cut short by a kill is
    /// imported again at the next start) (failure: nothing changed), then the engine
    /// acts (failure: the cache file is written with it again), then the table forgets
    /// it (export: and the cache file drops it).
    /// `act`'s Ok means the pool is gone from the engine (its value is passed back).
    async fn retire_pool<T: Send + 'static>(
        self: &Arc<Self>,
        name: &str,
        act: fn(&Pool) -> zilla_core::Result<T>,
        exporting: bool,
    ) -> Result<T, ApiError> {
        let p = self.pool(name)?;
        let first = if exporting { self.save_cache_edited(None, Some(name)).await } else { self.save_cache_without(Some(name)).await };
        first.map_err(|ApiError(s, m)| ApiError(s, format!("{m}; nothing was changed")))?;
        let done = match blocking_for(name, move || Ok(act(&p)?)).await {
            Ok(done) => done,
            Err(e) => {
                if let Err(ApiError(_, m)) = self.save_cache().await {
                    tracing::error!("pool '{name}' stays imported but is missing from the cache file: {m}");
                }
                return Err(e);
            }
        };
        self.pools.remove(name);
        if exporting {
            if let Err(ApiError(_, m)) = self.save_cache().await {
                tracing::error!("pool '{name}' was exported, but {m}; the next start imports it again");
            }
        }
        Ok(done)
    }

    /// After a device change the engine already committed to the labels: write the
    /// cache file, or say clearly that only the cache file is behind.
    async fn save_cache_after_device_change(self: &Arc<Self>, what: &str) -> Result<(), ApiError> {
        self.save_cache().await.map_err(|ApiError(s, m)| {
            ApiError(
                s,
                format!(
                    "{what} was done in the pool, but {m}; the pool's labels have the new layout \
                     and the daemon rewrites the cache file at the next change and at shutdown"
                ),
            )
        })
    }

    /// Import every pool in the cache file that is not imported yet, except those held
    /// after a stop on a broken invariant (and all of them with `no_import`).
    async fn import_cached(self: &Arc<Self>, no_import: bool) -> anyhow::Result<()> {
        crate::state_dir::record_stops_in(&self.state_dir);
        let (mut cache, problem) = crate::state_dir::load_cache(&self.state_dir);
        if let Some(problem) = problem {
            tracing::error!("{problem}");
            self.notices.lock().push(problem);
        }
        let stop = crate::state_dir::read_stop_record(&self.state_dir);
        if let Some(stop) = &stop {
            hold_stopped_pool(&mut cache, stop);
            // the hold must be durable before the record goes
            write_cache(&self.state_dir, &cache).with_context(|| format!("cannot write the cache file in {}", self.state_dir.display()))?;
            crate::state_dir::remove_stop_record(&self.state_dir)
                .with_context(|| format!("cannot remove the stop record in {}", self.state_dir.display()))?;
        }
        for entry in cache.pools {
            let name = entry.name.clone();
            if self.pools.get(&name).is_some() {
                continue;
            }
            let shown = crate::clip::clip(&name);
            if let Some(held) = &entry.held {
                tracing::error!("pool '{shown}' is not imported: {held}");
                self.pools.add_unavailable(Unavailable { reason: held.clone(), entry });
                continue;
            }
            if no_import {
                let reason = format!("not imported: the daemon was started with --no-import; import it with `zilla pool import {shown}`");
                self.pools.add_unavailable(Unavailable { reason, entry });
                continue;
            }
            if entry.exporting {
                tracing::warn!("the export of pool '{shown}' did not finish; importing it again");
            }
            let leaves = entry.leaves.clone();
            match blocking_for(&name, move || Pool::import_leaves(&leaves).map_err(ApiError::from)).await {
                Ok(pool) => {
                    let got = pool.name();
                    if got != name {
                        tracing::warn!("cache entry '{shown}' imported as pool '{}'", crate::clip::clip(&got));
                    }
                    tracing::info!("imported pool '{}' from the cache file", crate::clip::clip(&got));
                    self.finish_replacements_later(&got, pool.clone());
                    self.pools.insert(got, pool);
                }
                Err(ApiError(_, msg)) => {
                    tracing::error!("cannot import pool '{shown}' from the cache file: {msg}; it stays UNAVAIL, the daemon serves the other pools");
                    let reason = format!("cannot be imported from the cache file: {msg}");
                    self.pools.add_unavailable(Unavailable { reason, entry: CacheEntry { exporting: false, ..entry } });
                }
            }
        }
        Ok(())
    }

    /// Sync and export every pool (keeping the cache file as it is).
    /// Export every pool at shutdown. A pool whose syncs keep failing (suspended: a dead
    /// device, a host file system that is full) can never finish its final sync; after
    /// [`EXPORT_SUSPENDED_GRACE`] of suspension the daemon leaves it as a power cut would,
    /// so SIGTERM still stops the daemon. Nothing acknowledged is lost by that: a write a
    /// flush acknowledged is already on stable storage, and the next import loads the
    /// last synced txg; writes never flushed are dropped, as in a power cut.
    async fn export_all(self: &Arc<Self>) {
        let _g = self.admin.lock().await;
        crate::events::flush(&self.events, &self.pools);
        if let Err(ApiError(_, e)) = self.save_cache().await {
            tracing::error!("{e}");
        }
        for (name, pool) in self.pools.all() {
            let n = name.clone();
            let p = pool.clone();
            let job = blocking_for(&name, move || {
                p.sync()?;
                p.export()?;
                Ok(())
            });
            tokio::pin!(job);
            let mut suspended_s = 0;
            let r = loop {
                match tokio::time::timeout(Duration::from_secs(1), &mut job).await {
                    Ok(r) => break Some(r),
                    Err(_) if pool.is_suspended() => {
                        suspended_s += 1;
                        if suspended_s >= EXPORT_SUSPENDED_GRACE.as_secs() {
                            break None;
                        }
                    }
                    Err(_) => suspended_s = 0,
                }
            };
            match r {
                Some(Ok(())) => tracing::info!("exported pool '{n}'"),
                Some(Err(ApiError(_, e))) if !pool.is_suspended() => tracing::error!("cannot export pool '{n}': {e}"),
                _ => tracing::error!(
                    "pool '{n}' is suspended (its txg syncs fail) and cannot finish its final sync: \
                     leaving it unexported, as a power cut would; the next import loads its last \
                     synced txg, and writes no flush acknowledged since then are lost"
                ),
            }
            self.pools.remove(&name);
        }
    }
}

/// Raise the descriptor limit and fit the connection caps, front-end budget and NBD
/// limits from the config file under it; logs what is in force.
fn resolve_limits(
    opts: &ServeOpts,
) -> anyhow::Result<(crate::config::Limits, zilla_nbd::NbdConfig, zilla_frontend::FrontendConfig)> {
    let fd_limit = crate::config::raise_nofile_limit();
    let nbd_listeners = 1 + opts.nbd.is_some() as usize;
    let nbd_default = zilla_nbd::NbdConfig::default().connections_max;
    let limits = crate::config::Limits::resolve(&opts.settings, fd_limit, nbd_listeners, nbd_default)?;
    let nbd_config = crate::config::nbd_config(&opts.settings, limits.nbd_connections_max)?;
    let frontend_config = crate::config::frontend_config(&opts.settings)?;
    tracing::info!("{}", limits.describe());
    tracing::info!("fletcher4 checksums: {} implementation", zilla_core::block::checksum::fletcher4_impl_name());
    tracing::info!(
        "front end: memory budget {} bytes, reply-buffer pool {} bytes; NBD: {} requests in flight per connection, \
         idle timeout {} s, reply stall {} s",
        frontend_config.memory_budget_bytes,
        frontend_config.buffer_pool_bytes_max,
        nbd_config.in_flight_requests_max,
        nbd_config.idle_timeout.as_secs(),
        nbd_config.reply_stall_timeout.as_secs()
    );
    Ok((limits, nbd_config, frontend_config))
}

/// Remove sockets a daemon that died left behind (we hold the lock, so any socket
/// there is such a one).
fn remove_stale_sockets(socks: &[&Path]) -> anyhow::Result<()> {
    for s in socks {
        if std::fs::symlink_metadata(s).is_ok() {
            std::fs::remove_file(s).with_context(|| format!("cannot remove stale socket {}", s.display()))?;
        }
    }
    Ok(())
}


/// On a listener other than loopback, say once how targets without a CHAP user are
/// treated.
fn log_iscsi_exposure(iscsi: Option<&tokio::net::TcpListener>, unauthenticated: bool) {
    if let Some(addr) = iscsi.and_then(|l| l.local_addr().ok()).filter(|a| !a.ip().is_loopback()) {
        if unauthenticated {
            tracing::warn!("iSCSI on {addr}: logins to targets without a CHAP user are not authenticated (--iscsi-auth none)");
        } else {
            tracing::info!("iSCSI on {addr}: targets without a CHAP user refuse logins (set one with `zilla iscsi auth`)");
        }
    }
}
/// Run the daemon until SIGTERM/SIGINT. `preimported` pools (the demo's) are added
/// before the cache file is read. `ready` is called once every listener is bound.
pub async fn run(
    opts: ServeOpts,
    lock: StateLock,
    preimported: Vec<Arc<Pool>>,
    ready: impl FnOnce(&DaemonInfo),
) -> anyhow::Result<()> {
    let dir = lock.dir.clone();
    let admin_gid = crate::config::admin_gid(&opts.settings)?;
    let (limits, nbd_config, frontend_config) = resolve_limits(&opts)?;
    let admin_sock = dir.join("zilla.sock");
    let nbd_sock = dir.join("nbd.sock");
    remove_stale_sockets(&[&admin_sock, &nbd_sock])?;

    // Bind everything first so a busy port fails the start before pools are touched.
    let admin_listener = tokio::net::UnixListener::bind(&admin_sock)
        .with_context(|| format!("cannot listen on {}", admin_sock.display()))?;
    crate::state_dir::secure_socket(&admin_sock, admin_gid)?;
    let nbd_tcp = match &opts.nbd {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await.with_context(|| format!("cannot listen for NBD on {a}"))?),
        None => None,
    };
    let nbd_unix = tokio::net::UnixListener::bind(&nbd_sock)
        .with_context(|| format!("cannot listen on {}", nbd_sock.display()))?;
    crate::state_dir::secure_socket(&nbd_sock, admin_gid)?;
    let http = bind_tcp(opts.http.as_deref(), "HTTP").await?;
    let iscsi = bind_tcp(opts.iscsi.as_deref(), "iSCSI").await?;

    let address = |l: Option<&tokio::net::TcpListener>| l.and_then(|l| l.local_addr().ok()).map(|a| a.to_string());
    let info = DaemonInfo::serving(&dir, address(nbd_tcp.as_ref()), &nbd_sock, address(iscsi.as_ref()), address(http.as_ref()));
    // CHAP users and initiator lists: a file that cannot be read stops the start (serving
    // without the CHAP the admin set up would open the targets)
    let iscsi_auth = crate::iscsi_admin::load(&dir)?;
    let iscsi_config = crate::config::iscsi_config(&opts.settings, opts.iscsi_unauthenticated)?;
    let daemon = Daemon::new(dir.clone(), info.clone(), frontend_config, nbd_config, iscsi_config, opts.settings.analytics_memory_max_bytes);
    daemon.iscsi.set_auth_store(iscsi_auth);
    log_iscsi_exposure(iscsi.as_ref(), opts.iscsi_unauthenticated);
    for p in preimported {
        daemon.pools.insert(p.name(), p);
    }
    daemon.import_cached(opts.no_import).await?;
    {
        let _g = daemon.admin.lock().await;
        if let Err(ApiError(_, e)) = daemon.save_cache().await {
            tracing::error!("{e}");
        }
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let admin_task = {
        let app = crate::http_serve::with_body_limits(admin_router(daemon.clone()), limits.admin);
        let listener = crate::http_serve::Listener::Unix(admin_listener);
        // Admin requests still running (e.g. `scrub -w`) must not hold shutdown forever.
        tokio::spawn(crate::http_serve::serve("admin API", listener, app, limits.admin, stop_rx.clone(), ADMIN_DRAIN))
    };
    let nbd_task = crate::nbd_glue::spawn(daemon.nbd.clone(), nbd_tcp, nbd_unix, stop_rx.clone());
    let iscsi_task = iscsi.map(|l| crate::iscsi_glue::spawn(daemon.iscsi.clone(), l, stop_rx.clone()));
    let background = spawn_web_and_analytics(&daemon, http, limits.http, opts.settings.http_allowed_hosts.clone().unwrap_or_default(), &stop_rx);

    tracing::info!(
        "serving {}: admin {}, NBD {} and {}, iSCSI {}, HTTP {}",
        dir.display(),
        admin_sock.display(),
        info.nbd_tcp.as_deref().unwrap_or("off"),
        nbd_sock.display(),
        info.iscsi.as_deref().unwrap_or("off"),
        info.http.as_deref().unwrap_or("off")
    );
    ready(&info);

    wait_for_signal().await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    drain_front_ends(nbd_task, iscsi_task).await;
    let _ = admin_task.await;
    background.join().await;
    daemon.export_all().await;
    let _ = std::fs::remove_file(&admin_sock);
    let _ = std::fs::remove_file(&nbd_sock);
    tracing::info!("stopped");
    drop(lock);
    Ok(())
}

impl DaemonInfo {
    /// What a daemon serving from `dir` on these addresses tells its clients.
    fn serving(dir: &std::path::Path, nbd_tcp: Option<String>, nbd_sock: &std::path::Path, iscsi: Option<String>, http: Option<String>) -> DaemonInfo {
        DaemonInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            state_dir: dir.display().to_string(),
            nbd_tcp,
            nbd_unix: Some(nbd_sock.display().to_string()),
            iscsi,
            http,
            notices: vec![],
        }
    }
}

/// The HTTP server (if it listens) and the analytics collector, both until `stop`.
struct Background {
    http: Option<tokio::task::JoinHandle<()>>,
    collector: tokio::task::JoinHandle<()>,
    autoreplace: tokio::task::JoinHandle<()>,
}

fn spawn_web_and_analytics(
    daemon: &Arc<Daemon>,
    http: Option<tokio::net::TcpListener>,
    limits: crate::http_serve::HttpLimits,
    allowed_hosts: crate::http_host::AllowedHosts,
    stop: &watch::Receiver<bool>,
) -> Background {
    let http = http.map(|l| {
        tracing::info!("HTTP: answering requests for {}", allowed_hosts.describe());
        let allowed_hosts = Arc::new(allowed_hosts);
        let app = crate::http_serve::with_body_limits(crate::web::router(daemon.web_view()), limits);
        // outermost: a request for another site's name is refused before anything runs
        let app = crate::http_host::with_host_check(app, allowed_hosts);
        let listener = crate::http_serve::Listener::Tcp(l);
        tokio::spawn(crate::http_serve::serve("HTTP", listener, app, limits, stop.clone(), HTTP_DRAIN))
    });
    let collector = crate::analytics::run_collector(daemon.analytics.clone(), daemon.pools.clone(), daemon.frontend.clone(), stop.clone());
    let autoreplace = tokio::spawn(crate::autoreplace::run(daemon.clone(), stop.clone()));
    Background { http, collector: tokio::spawn(collector), autoreplace }
}

impl Background {
    /// Wait for both to end (the collector saves the history last).
    async fn join(self) {
        if let Some(t) = self.http {
            let _ = t.await;
        }
        let _ = self.collector.await;
        let _ = self.autoreplace.await;
    }
}

/// A TCP listener on `addr` (`None`: that listener is off).
async fn bind_tcp(addr: Option<&str>, what: &str) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    match addr {
        Some(a) => Ok(Some(tokio::net::TcpListener::bind(a).await.with_context(|| format!("cannot listen for {what} on {a}"))?)),
        None => Ok(None),
    }
}

/// At shutdown: give the NBD and iSCSI connections a bounded time to finish their
/// in-flight requests.
async fn drain_front_ends(nbd_task: tokio::task::JoinHandle<()>, iscsi_task: Option<tokio::task::JoinHandle<()>>) {
    if tokio::time::timeout(NBD_DRAIN, nbd_task).await.is_err() {
        tracing::warn!("NBD connections did not finish within {NBD_DRAIN:?}; exporting anyway");
    }
    if let Some(task) = iscsi_task {
        if tokio::time::timeout(NBD_DRAIN, task).await.is_err() {
            tracing::warn!("iSCSI connections did not finish within {NBD_DRAIN:?}; exporting anyway");
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    crate::sd_notify::stopping("stopping: draining clients and exporting pools");
}

// ---------------------------------------------------------------------------------
// Admin API routes

fn admin_router(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/pools", post(pool_create))
        .route("/v1/importable", post(pool_importable))
        .route("/v1/import", post(pool_import))
        .route("/v1/import/rewind-plan", post(pool_rewind_plan))
        .route("/v1/pools/{pool}", delete(pool_destroy))
        .route("/v1/pools/{pool}/export", post(pool_export))
        .route("/v1/pools/{pool}/scrub", post(pool_scrub))
        .route("/v1/pools/{pool}/trim", post(pool_trim))
        .route("/v1/pools/{pool}/add", post(pool_add))
        .route("/v1/pools/{pool}/wait", post(pool_wait))
        .route("/v1/pools/{pool}/{op}", post(pool_device_op))
        .route("/v1/volumes", post(volume_create))
        .route("/v1/volumes/{pool}/{name}", delete(volume_destroy))
        .route("/v1/get", post(prop_get))
        .route("/v1/set", post(prop_set))
        .route("/v1/rename", post(volume_rename))
        .route("/v1/tunables", get(tunable_list).post(tunable_set))
        .route("/v1/iscsi", get(iscsi_list))
        .route("/v1/iscsi/auth", post(iscsi_auth))
        .fallback(|| async { ApiError::not_found("no such API route") })
        .with_state(d.clone())
        // the read-only queries, the same handlers the HTTP port serves under /api/v1
        .merge(crate::reads::routes("/v1", d.web_view()))
        .merge(crate::events::routes(crate::events::EventsApi { store: d.events.clone(), pools: d.pools.clone() }))
        // every command that changes a pool goes into its history (history.rs)
        .layer(axum::middleware::from_fn_with_state(d.pools.clone(), crate::history::record))
}

async fn pool_create(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<CreatePool>) -> ApiResult<Empty> {
    zilla_core::spa::validate_pool_name(&req.name)?;
    let _g = d.admin.lock().await;
    if d.pools.get(&req.name).is_some() {
        return Err(ApiError(StatusCode::CONFLICT, "pool already exists".into()));
    }
    if d.pools.unavailable_entry(&req.name).is_some() {
        // as zpool: an UNAVAIL pool in the cache still holds its name (its disks may come back)
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "pool already exists: '{}' is UNAVAIL (its devices could not be opened); `zilla pool export {}` forgets it",
                req.name, req.name
            ),
        ));
    }
    let mut opts = CreateOptions { force: req.force, ashift: None, props: vec![], ..Default::default() };
    for (k, v) in req.props {
        if k == "ashift" {
            let a: u8 = v.parse().ok().filter(|a| *a == 0 || (12..=13).contains(a)).ok_or_else(|| {
                ApiError::bad(format!("bad value '{v}' for property 'ashift': expected 12 (4K sectors), 13 (8K) or 0 (automatic)"))
            })?;
            opts.ashift = Some(a);
        } else {
            opts.props.push((k, v));
        }
    }
    let name = req.name.clone();
    let pool = blocking_for(&req.name, move || Ok(Pool::create(&name, req.tops, opts)?)).await?;
    d.commit_new_pool(&req.name, pool, Pool::destroy, "the pool was destroyed again (nothing was created)").await?;
    tracing::info!("created pool '{}'", req.name);
    crate::events::post_admin("sysevent.fs.zfs.pool_create", &req.name, None, None);
    Ok(Json(Empty {}))
}

fn search_paths(dirs: &[String]) -> Vec<PathBuf> {
    if dirs.is_empty() {
        vec![PathBuf::from("/dev")]
    } else {
        dirs.iter().map(PathBuf::from).collect()
    }
}

/// The pools `pool import` could import from the search paths, leaving out those this
/// daemon has imported already (their labels say "active" on this host).
async fn pool_importable(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<ImportReq>) -> ApiResult<zilla_core::spa::ImportScan> {
    let search = search_paths(&req.dirs);
    let mut found = blocking(move || Ok(Pool::scan_importable(&search)?)).await?;
    let imported: Vec<zilla_core::Guid> = d.pools.all().iter().map(|(_, p)| p.guid()).collect();
    found.pools.retain(|f| !imported.contains(&f.guid));
    Ok(Json(found))
}

async fn pool_import(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<ImportReq>) -> ApiResult<Empty> {
    let _g = d.admin.lock().await;
    if let Some(n) = &req.name {
        if d.pools.get(n).is_some() {
            return Err(ApiError(StatusCode::CONFLICT, "a pool with that name is already imported".into()));
        }
    }
    let search = search_paths(&req.dirs);
    let name = req.name.clone();
    let opts = zilla_core::spa::ImportOptions { force: req.force, rewind: req.rewind, dry_run: false, missing_log: req.missing_log };
    // A pool this daemon has in its cache file but not imported: from its cached leaves
    // unless the admin names where to search.
    let cached = name.as_deref().and_then(|n| d.pools.unavailable_entry(n)).filter(|_| req.dirs.is_empty());
    let working_for = match (&name, &cached) {
        (Some(n), _) => n.clone(),
        (None, _) => importable_name(search.clone()).await.unwrap_or_default(),
    };
    let pool = blocking_for(&working_for, move || match cached {
        Some(u) => Ok(Pool::import_with_options(&u.entry.leaves, zilla_core::spa::default_opener(), zilla_core::env::real(), &opts)?),
        None => Ok(Pool::import_found(&search, name.as_deref(), &opts)?),
    })
    .await?;
    let name = pool.name();
    if d.pools.get(&name).is_some() {
        // Imported by guid under a name we already have: undo.
        let p = pool.clone();
        let _ = blocking(move || Ok(p.export()?)).await;
        return Err(ApiError(StatusCode::CONFLICT, format!("a pool named '{name}' is already imported")));
    }
    d.commit_new_pool(&name, pool, Pool::export, "the pool was exported again (nothing was imported)").await?;
    tracing::info!("imported pool '{name}'");
    crate::events::post_admin("sysevent.fs.zfs.pool_import", &name, None, None);
    Ok(Json(Empty {}))
}

/// The pool part of "pool" or "pool/volume".
fn pool_of(name: &str) -> &str {
    name.split_once('/').map_or(name, |(p, _)| p)
}

/// The name of the only importable pool in `search` (what `pool import` without a
/// name imports), so that its import runs as working for it.
async fn importable_name(search: Vec<PathBuf>) -> Option<String> {
    let found = blocking(move || Ok(Pool::find_importable(&search)?)).await.ok()?;
    match found.as_slice() {
        [one] => Some(one.name.clone()),
        _ => None,
    }
}

/// `zilla pool import -F -n`: what a rewind would load and drop; imports nothing.
async fn pool_rewind_plan(State(_d): State<Arc<Daemon>>, ApiJson(req): ApiJson<ImportReq>) -> ApiResult<zilla_core::spa::RewindPlan> {
    let search = search_paths(&req.dirs);
    let name = req.name.clone();
    Ok(Json(blocking(move || Ok(Pool::rewind_plan_found(&search, name.as_deref())?)).await?))
}

async fn pool_export(State(d): State<Arc<Daemon>>, UrlPath(pool): UrlPath<String>, Query(q): Query<DestroyQuery>) -> ApiResult<Empty> {
    let _g = d.admin.lock().await;
    if d.pools.get(&pool).is_none() && d.pools.unavailable_entry(&pool).is_some() {
        // not imported here: exporting it only means forgetting it
        d.save_cache_without(Some(&pool)).await?;
        d.pools.forget_unavailable(&pool);
        tracing::info!("forgot unavailable pool '{}'", crate::clip::clip(&pool));
        return Ok(Json(Empty {}));
    }
    // As `zpool export` refuses while a zvol is open ("pool is busy"): a client whose
    // volume vanishes under it gets I/O errors for every later request.
    let handle = d.pool(&pool)?;
    let p = pool.clone();
    let in_pool = move |e: &str| zilla_frontend::sessions::export_in_pool(e, &p);
    if !handle.is_suspended() || !q.force {
        if let Some(e) = handle.export_refusal() {
            return Err(e.into()); // suspended: its final sync cannot complete
        }
        clear_sessions(&d, &format!("pool '{pool}'"), q.force, &in_pool).await?;
        d.retire_pool(&pool, Pool::export, true).await?;
        tracing::info!("exported pool '{pool}'");
        crate::events::post_admin("sysevent.fs.zfs.pool_export", &pool, None, None);
        return Ok(Json(Empty {}));
    }
    // Suspended, -f: its clients' requests wait on the pool and would hold their
    // sessions; the export without a final sync fails those requests, then they go.
    d.frontend.sessions.disconnect(&in_pool);
    d.retire_pool(&pool, Pool::export_unsynced, true).await?;
    if let Err(ApiError(_, e)) = clear_sessions(&d, &format!("pool '{pool}'"), true, &in_pool).await {
        tracing::warn!("exported pool '{pool}' without its final sync; {e}");
    }
    tracing::info!("exported suspended pool '{pool}' without its final sync");
    Ok(Json(Empty {}))
}

/// `?force=true` of the destroy and export calls (`-f`): disconnect attached clients first.
#[derive(Deserialize, Default)]
struct DestroyQuery {
    #[serde(default)]
    force: bool,
}

/// Longest a forced destroy waits for the clients it disconnected to go, beyond the
/// front ends' shutdown grace (requests in flight finish within that).
const DISCONNECT_WAIT_MARGIN: Duration = Duration::from_secs(5);

/// Longest an export or destroy without -f waits for attached clients that are already
/// leaving: a client that has just closed its socket (fio, nbdcopy and qemu-img exit
/// and the admin's next command runs at once) is counted until its connection task has
/// seen the end of the stream.
const CLOSING_CLIENTS_WAIT: Duration = Duration::from_secs(1);

/// Export or destroy of `what` (its exports are those `matches` accepts): refuse while
/// clients are attached, or with `force` disconnect them and wait until they are gone.
async fn clear_sessions(d: &Daemon, what: &str, force: bool, matches: &(dyn Fn(&str) -> bool + Sync)) -> Result<(), ApiError> {
    let sessions = &d.frontend.sessions;
    let mut attached = sessions.count(matches);
    if attached == 0 {
        return Ok(());
    }
    let clients = |n: usize| if n == 1 { "1 client is".to_string() } else { format!("{n} clients are") };
    if !force {
        let deadline = tokio::time::Instant::now() + CLOSING_CLIENTS_WAIT;
        while attached > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            attached = sessions.count(matches);
        }
        if attached == 0 {
            return Ok(());
        }
        return Err(ApiError(StatusCode::CONFLICT, format!("{what} is busy: {} attached (use -f to disconnect them)", clients(attached))));
    }
    sessions.disconnect(matches);
    tracing::warn!("{what}: disconnecting {attached} attached client(s) (-f)");
    let deadline = tokio::time::Instant::now() + d.nbd.config().shutdown_grace + DISCONNECT_WAIT_MARGIN;
    loop {
        let left = sessions.count(matches);
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError(StatusCode::CONFLICT, format!("{what} is busy: {} still attached after the disconnect", clients(left))));
        }
        sessions.disconnect(matches); // clients that attached meanwhile
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pool_destroy(State(d): State<Arc<Daemon>>, UrlPath(pool): UrlPath<String>, Query(q): Query<DestroyQuery>) -> ApiResult<Empty> {
    let _g = d.admin.lock().await;
    if d.pools.get(&pool).is_some() {
        let p = pool.clone();
        clear_sessions(&d, &format!("pool '{pool}'"), q.force, &move |e| zilla_frontend::sessions::export_in_pool(e, &p)).await?;
    }
    if d.pools.get(&pool).is_none() {
        let was_unavailable = d.pools.unavailable_entry(&pool).is_some();
        if was_unavailable {
            d.save_cache_without(Some(&pool)).await?;
            d.pools.forget_unavailable(&pool);
            return Ok(Json(Empty {}));
        }
        return Err(ApiError::not_found("no such pool"));
    }
    let report = d.retire_pool(&pool, Pool::destroy_report, false).await?;
    crate::events::post_admin("sysevent.fs.zfs.pool_destroy", &pool, None, None);
    let prefix = format!("{pool}/");
    d.frontend.io_stats.retain(|n| !n.starts_with(&prefix));
    if report.labels_kept.is_empty() {
        tracing::info!("destroyed pool '{pool}'");
        return Ok(Json(Empty {}));
    }
    // As a device's failure: the pool is gone here, but its labels are not.
    let kept: Vec<String> = report.labels_kept.iter().map(|(dev, e)| format!("{} ({e})", zilla_core::spa::printable(dev))).collect();
    let msg = format!(
        "the pool was removed from this daemon, but the labels on {} could not be cleared: \
         `zilla pool import` may still find the pool there; once the devices work, import it and destroy it again",
        kept.join(", ")
    );
    tracing::error!("destroy of pool '{pool}': {msg}");
    Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, msg))
}

async fn pool_scrub(State(d): State<Arc<Daemon>>, UrlPath(pool): UrlPath<String>, ApiJson(req): ApiJson<ScrubReq>) -> ApiResult<Empty> {
    let p = d.pool(&pool)?;
    blocking_for(&pool, move || {
        let start = req.cmd == zilla_core::spa::ScrubCmd::Start;
        match p.scrub(req.cmd) {
            // `scrub -w` on a scrub already running waits for that one
            Err(zilla_core::Error::Busy(_)) if req.wait && start && p.scan_status().func == zilla_core::scan::ScanFunc::Scrub => {}
            r => r?,
        }
        if req.wait && start {
            p.wait_activity(zilla_core::spa::Activity::Scrub)?;
        }
        Ok(())
    })
    .await?;
    Ok(Json(Empty {}))
}

async fn pool_trim(State(d): State<Arc<Daemon>>, UrlPath(pool): UrlPath<String>, ApiJson(req): ApiJson<TrimReq>) -> ApiResult<Empty> {
    let p = d.pool(&pool)?;
    blocking_for(&pool, move || {
        p.trim(req.cmd)?;
        if req.wait && req.cmd == zilla_core::spa::trim::TrimCmd::Start {
            p.trim_wait()?;
        }
        Ok(())
    })
    .await?;
    Ok(Json(Empty {}))
}

async fn pool_add(State(d): State<Arc<Daemon>>, UrlPath(pool): UrlPath<String>, ApiJson(req): ApiJson<AddReq>) -> ApiResult<AddReply> {
    let _g = d.admin.lock().await;
    let p = d.pool(&pool)?;
    if req.dry_run {
        let would_be = blocking_for(&pool, move || Ok(p.add_dry_run(&req.tops, req.force)?)).await?;
        return Ok(Json(AddReply { would_be }));
    }
    let added: Vec<String> = req.tops.iter().flat_map(|t| t.leaves.iter().map(|l| l.display())).collect();
    blocking_for(&pool, move || Ok(p.add(req.tops, req.force)?)).await?;
    added.iter().for_each(|a| crate::events::post_admin("sysevent.fs.zfs.vdev_add", &pool, Some(a.as_str()), None));
    d.save_cache_after_device_change("the add").await?;
    Ok(Json(AddReply::default()))
}

/// `pool wait [-t ACTIVITY,...]`: answer once none of them is in progress.
async fn pool_wait(State(d): State<Arc<Daemon>>, UrlPath(pool): UrlPath<String>, ApiJson(req): ApiJson<WaitReq>) -> ApiResult<Empty> {
    let p = d.pool(&pool)?;
    let activities = if req.activities.is_empty() { zilla_core::spa::Activity::ALL.to_vec() } else { req.activities };
    blocking_for(&pool, move || activities.into_iter().try_for_each(|a| Ok(p.wait_activity(a)?))).await?;
    Ok(Json(Empty {}))
}

/// After an attach or replace with `-w`: wait, without the admin lock (other commands
/// go on meanwhile), for the resilver to finish, and a replace to complete.
async fn wait_for_resilver(pool: &str, p: Arc<Pool>, replace: bool) -> Result<(), ApiError> {
    blocking_for(pool, move || {
        match replace {
            true => p.replace_wait()?,
            false => p.wait_activity(zilla_core::spa::Activity::Resilver)?,
        }
        Ok(())
    })
    .await
}

/// attach, detach, remove, replace, offline, online, clear.
async fn pool_device_op(
    State(d): State<Arc<Daemon>>,
    UrlPath((pool, op)): UrlPath<(String, String)>,
    ApiJson(req): ApiJson<DeviceReq>,
) -> ApiResult<Empty> {
    let admin = d.admin.lock().await;
    let p = d.pool(&pool)?;
    let (waiter, wait) = (p.clone(), req.wait);
    let device = req.device.clone();
    let (old_path, new_path) = (req.device.clone(), req.new.as_ref().map(|n| n.display()));
    let need_dev = || device.clone().ok_or_else(|| ApiError::bad("missing device"));
    let changes_config = matches!(op.as_str(), "detach" | "replace" | "remove");
    match op.as_str() {
        "attach" => {
            let dev = need_dev()?;
            let new = req.new.ok_or_else(|| ApiError::bad("missing new device"))?;
            let new_name = new.path.display().to_string();
            let p2 = p.clone();
            blocking_for(&pool, move || Ok(p.attach(&dev, &new, req.force)?)).await?;
            if let Err(ApiError(status, msg)) = d.save_cache().await {
                // Undo: detach the new device again, so the pool matches the cache file.
                let outcome = match blocking_for(&pool, move || Ok(p2.detach(&new_name)?)).await {
                    Ok(()) => "the new device was detached again (nothing was attached)".to_string(),
                    Err(ApiError(_, e)) => format!("detaching the new device again failed as well ({e})"),
                };
                return Err(ApiError(status, format!("{msg}; {outcome}")));
            }
        }
        "replace" => {
            let dev = need_dev()?;
            let new = match req.new {
                Some(n) => n,
                None => LeafSpec::parse(&dev).map_err(ApiError::from)?,
            };
            blocking_for(&pool, move || Ok(p.replace(&dev, &new, req.force)?)).await?;
            d.finish_replacements_later(&pool, waiter.clone());
        }
        "detach" => {
            let dev = need_dev()?;
            blocking_for(&pool, move || Ok(p.detach(&dev)?)).await?
        }
        "remove" => {
            let dev = need_dev()?;
            blocking_for(&pool, move || Ok(p.remove(&dev)?)).await?
        }
        "offline" => {
            let dev = need_dev()?;
            blocking_for(&pool, move || Ok(p.offline(&dev)?)).await?
        }
        "online" => {
            let dev = need_dev()?;
            blocking_for(&pool, move || Ok(p.online(&dev)?)).await?
        }
        "clear" => blocking_for(&pool, move || Ok(p.clear(device.as_deref())?)).await?,
        "upgrade" => blocking_for(&pool, move || Ok(p.upgrade().map(|_| ())?)).await?,
        other => return Err(ApiError::not_found(format!("unknown pool operation '{other}'"))),
    }
    crate::events::post_device_op(&pool, &op, old_path.as_deref(), new_path.as_deref());
    if changes_config {
        d.save_cache_after_device_change(&format!("the {op}")).await?;
    }
    drop(admin);
    if wait && matches!(op.as_str(), "attach" | "replace") {
        wait_for_resilver(&pool, waiter, op == "replace").await?;
    }
    Ok(Json(Empty {}))
}

async fn volume_create(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<CreateVolume>) -> ApiResult<Empty> {
    let (p, vol) = d.volume_pool(&req.name)?;
    zilla_core::spa::validate_volume_name(&vol)?;
    if req.volsize == 0 {
        return Err(ApiError::bad("volume size must be greater than zero"));
    }
    let (min, max) = (zilla_core::spa::MIN_VOLBLOCKSIZE, zilla_core::spa::MAX_VOLBLOCKSIZE);
    if !req.volblocksize.is_power_of_two() || !(min..=max).contains(&req.volblocksize) {
        return Err(ApiError::bad(format!(
            "bad volblocksize {}: must be a power of two from {} to {}",
            req.volblocksize,
            crate::units::nicebytes(min as u64),
            crate::units::nicebytes(max as u64)
        )));
    }
    if req.volsize % req.volblocksize as u64 != 0 {
        return Err(ApiError::bad(format!(
            "volume size must be a multiple of volume block size ({})",
            crate::units::nicebytes(req.volblocksize as u64)
        )));
    }
    for (k, v) in &req.props {
        zilla_core::props::validate(k, v)?;
    }
    if !req.props.iter().any(|(k, v)| k == "shareiscsi" && v == "off") {
        d.exports().check_iscsi_target_free(&req.name).map_err(ApiError::bad)?;
    }
    let mut props = req.props;
    if !req.sparse && !props.iter().any(|(k, _)| k == "refreservation") {
        props.push(("refreservation".into(), "auto".into())); // thick, as zfs create -V
    }
    blocking_for(pool_of(&req.name).to_string(), move || Ok(p.volume_create(&vol, req.volsize, req.volblocksize, &props)?)).await?;
    tracing::info!("created volume '{}'", req.name);
    Ok(Json(Empty {}))
}

async fn volume_destroy(State(d): State<Arc<Daemon>>, UrlPath((pool, name)): UrlPath<(String, String)>, Query(q): Query<DestroyQuery>) -> ApiResult<Empty> {
    let p = d.pool(&pool)?;
    let export = format!("{pool}/{name}");
    let e = export.clone();
    clear_sessions(&d, &format!("volume '{export}'"), q.force, &move |x| x == e).await?;
    blocking_for(&pool, move || Ok(p.volume_destroy(&name)?)).await?;
    // its front-end totals go with it (a name created and destroyed in a loop must not
    // grow the table; one created again counts from zero)
    d.frontend.io_stats.retain(|n| n != export);
    Ok(Json(Empty {}))
}

async fn prop_get(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<GetReq>) -> ApiResult<Vec<zilla_core::props::PropRow>> {
    if !req.name.contains('/') {
        // A pool: its pool properties (zpool get).
        let p = d.pool(&req.name)?;
        let rows = blocking_for(pool_of(&req.name).to_string(), move || Ok(p.get_pool_props())).await?;
        if req.props.is_empty() {
            return Ok(Json(rows));
        }
        let mut out = vec![];
        for want in &req.props {
            match rows.iter().find(|r| &r.property == want) {
                Some(r) => out.push(r.clone()),
                None => return Err(ApiError::bad(format!("unknown property '{want}'"))),
            }
        }
        return Ok(Json(out));
    }
    let (p, vol) = d.volume_pool(&req.name)?;
    Ok(Json(blocking_for(pool_of(&req.name).to_string(), move || Ok(p.get_props(&vol, &req.props)?)).await?))
}

async fn prop_set(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<SetReq>) -> ApiResult<Empty> {
    if !req.name.contains('/') {
        // A pool: a pool property (zpool set).
        let p = d.pool(&req.name)?;
        blocking_for(pool_of(&req.name).to_string(), move || Ok(p.set_pool_prop(&req.property, &req.value)?)).await?;
        return Ok(Json(Empty {}));
    }
    let (p, vol) = d.volume_pool(&req.name)?;
    if req.property != "volsize" {
        zilla_core::props::validate(&req.property, &req.value)?; // volsize: the pool checks it
    }
    if req.property == "shareiscsi" && req.value == "on" {
        d.exports().check_iscsi_target_free(&req.name).map_err(ApiError::bad)?;
    }
    blocking_for(pool_of(&req.name).to_string(), move || Ok(p.set_prop(&vol, &req.property, &req.value)?)).await?;
    Ok(Json(Empty {}))
}

/// `zilla rename`: a volume gets a new name in its pool; its NBD export and iSCSI
/// target follow the name. Refused while clients are attached (unless `force`), and
/// while the iSCSI target has settings of its own (they name the old target).
async fn volume_rename(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<RenameReq>) -> ApiResult<Empty> {
    let (p, from) = d.volume_pool(&req.from)?;
    let (to_pool, to) = req.to.split_once('/').filter(|(p, v)| !p.is_empty() && !v.is_empty()).ok_or_else(|| ApiError::bad(format!("'{}' is not a volume name (expected POOL/NAME)", req.to)))?;
    if to_pool != pool_of(&req.from) {
        return Err(ApiError::bad("volumes must stay within the same pool"));
    }
    zilla_core::spa::validate_volume_name(to)?;
    let old_target = zilla_iscsi::names::target_name(&req.from);
    if d.iscsi.auth_store().targets().any(|(name, _)| name == old_target) {
        return Err(ApiError::bad(format!(
            "iSCSI target {old_target} has settings of its own: clear them (`zilla iscsi auth {} --clear`), rename, then set them for the new name",
            req.from
        )));
    }
    if d.exports().iscsi_target_taken_by(&req.to).is_some_and(|other| other != req.from) {
        d.exports().check_iscsi_target_free(&req.to).map_err(ApiError::bad)?;
    }
    let e = req.from.clone();
    clear_sessions(&d, &format!("volume '{}'", req.from), req.force, &move |x| x == e).await?;
    let to = to.to_string();
    blocking_for(pool_of(&req.from).to_string(), move || Ok(p.volume_rename(&from, &to)?)).await?;
    let from = req.from.clone();
    d.frontend.io_stats.retain(|n| n != from);
    tracing::info!("renamed volume '{}' to '{}'", req.from, req.to);
    Ok(Json(Empty {}))
}

async fn tunable_list() -> Json<Vec<TunableRow>> {
    let rows = zilla_core::tunables()
        .list()
        .into_iter()
        .map(|t| TunableRow {
            name: t.name.into(),
            value: t.get(),
            default: t.default,
            min: t.min,
            max: t.max,
            zero_is_auto: t.zero_is_auto,
            applies: t.applies.as_str().into(),
            description: t.description.into(),
            choices: t.choices.iter().map(|c| c.to_string()).collect(),
            source: crate::tunables::source(t.name).as_str().into(),
        })
        .collect();
    Json(rows)
}

async fn tunable_set(State(d): State<Arc<Daemon>>, ApiJson(req): ApiJson<TunableSet>) -> ApiResult<Empty> {
    let dir = d.state_dir.clone();
    let value = (!req.reset).then_some(req.value);
    let name = req.name.clone();
    blocking(move || crate::tunables::set_live(&dir, &name, value, req.persistent).map_err(ApiError::bad)).await?;
    let now = zilla_core::tunables().get(&req.name).unwrap_or_default();
    let persistent = if req.persistent { ", persistent setting changed" } else { "" };
    tracing::info!("tunable {} set to {now} ({}{persistent})", crate::clip::clip(&req.name), crate::tunables::source(&req.name).as_str());
    Ok(Json(Empty {}))
}

/// The iSCSI targets with their authentication, and the live sessions.
async fn iscsi_list(State(d): State<Arc<Daemon>>) -> ApiResult<crate::api::IscsiListing> {
    let server = d.iscsi.clone();
    Ok(Json(blocking(move || Ok(crate::iscsi_admin::listing(&server))).await?))
}

/// Change one target's (or the default) CHAP users and initiator list: written to
/// DIR/iscsi-auth.json first, then used by the next login.
async fn iscsi_auth(
    State(d): State<Arc<Daemon>>,
    ApiJson(req): ApiJson<crate::api::IscsiAuthRequest>,
) -> ApiResult<crate::api::IscsiAuthView> {
    let _g = d.admin.lock().await;
    let (next, target) = crate::iscsi_admin::apply(&d.iscsi.auth_store(), &req).map_err(ApiError::bad)?;
    let dir = d.state_dir.clone();
    let saved = next.clone();
    blocking(move || {
        crate::iscsi_admin::save(&dir, &saved).map_err(|e| {
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot write {}: {e}", dir.join(crate::iscsi_admin::AUTH_FILE_NAME).display()))
        })
    })
    .await?;
    let view = crate::iscsi_admin::view(&next, target.as_deref());
    d.iscsi.set_auth_store(next);
    tracing::info!(
        "iSCSI authentication of {} set: {}, {} allowed initiators (0: any)",
        crate::clip::clip(&view.target),
        view.auth,
        view.initiators.len()
    );
    Ok(Json(view))
}


