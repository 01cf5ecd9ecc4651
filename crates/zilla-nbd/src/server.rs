//! server: accept loops (TCP, unix) and the life of one connection.
//!
//! ```text
//!   accept ──> [connection task]: handshake (timeout) ──> transmission ──> close
//!     ^             one tokio task per connection, at most `connections_max`
//!     │             per listener; at the cap, the connection idle longest is evicted
//!     └── stops when the shutdown signal fires; then waits (bounded) for the
//!         connection tasks, which answer ESHUTDOWN and drain in-flight requests.
//! ```
//!
//! The shutdown signal is a `tokio::sync::watch::Receiver<bool>`: the daemon sends
//! `true` (or drops the sender) to stop. Accept errors (EMFILE and friends) do not end
//! the server: the loop backs off (10 ms doubling to 1 s, reset by the next success)
//! and logs at most one warning per `ACCEPT_ERROR_LOG_INTERVAL`, with the count of
//! failures since the last one. Every accepted TCP socket gets TCP_NODELAY: replies
//! are small and latency-bound.
//!
//! Connection cap: when all `connections_max` slots are taken, the accept loop holds
//! the newly accepted client (one at a time; later ones wait in the listen backlog)
//! and asks the connection whose last request is oldest (at least `EVICT_IDLE_MIN`
//! ago, nothing in flight) to close, retrying every `EVICT_RETRY_INTERVAL` until a
//! slot frees. So idle clients cannot lock new ones out.
//!
//! Statistics: [`NbdStats`] counts connections by fate and every request (totals of
//! the protocol); each connection that reaches transmission also records into its
//! client's row of the front end's bounded client table (peer IP for TCP, `uid N`
//! for the unix socket) and into its volume's counters.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use zilla_frontend::{ExportRegistry, Frontend, FrontendConfig};

pub use crate::stats::{NbdStats, NbdStatsSnapshot};

use crate::connection_slot::{now_ms, ConnectionSlot};
use crate::framing::FrameReader;
use crate::{handshake, transmission, NbdConfig};

/// First pause after a failed accept; doubles up to `ACCEPT_RETRY_PAUSE_MAX`.
const ACCEPT_RETRY_PAUSE_MIN: Duration = Duration::from_millis(10);
const ACCEPT_RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);
/// At most one accept-failure warning per interval.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// A connection is evicted at the cap only after this long without a request.
const EVICT_IDLE_MIN: Duration = Duration::from_secs(5);
/// How often a client waiting for a slot retries the eviction.
const EVICT_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// A session asked to disconnect is dropped this long after the shutdown grace if it
/// has not ended by itself.
const DISCONNECT_FORCE_MARGIN: Duration = Duration::from_secs(1);
/// How often idle pooled reply buffers are trimmed.
const BUFFER_TRIM_INTERVAL: Duration = Duration::from_secs(5);

type SlotTable = Mutex<HashMap<u64, Arc<ConnectionSlot>>>;

/// What a connection task needs to list itself in the slot table.
struct Registration {
    slot: OwnedSemaphorePermit,
    slots: Arc<SlotTable>,
    id: u64,
    peer: String,
}

/// The NBD server: the shared front end plus configuration. Cheap to clone; every
/// clone serves the same registry and shares counters and budgets.
#[derive(Clone)]
pub struct NbdServer {
    frontend: Arc<Frontend>,
    config: Arc<NbdConfig>,
    stats: Arc<NbdStats>,
}

impl NbdServer {
    /// A server with its own front end (default budgets) over `registry`; for tests
    /// and embeddings. The daemon uses [`NbdServer::with_frontend`].
    pub fn new(registry: Arc<dyn ExportRegistry>, config: NbdConfig) -> NbdServer {
        NbdServer::with_frontend(Frontend::new(registry, FrontendConfig::default()), config)
    }

    /// A server sharing `frontend` (registry, budgets, statistics) with other front
    /// ends. Call [`NbdConfig::validate`] first to reject bad tunables; the server
    /// clamps them into a safe range rather than failing.
    pub fn with_frontend(frontend: Arc<Frontend>, config: NbdConfig) -> NbdServer {
        if let Err(problem) = config.validate() {
            tracing::warn!(%problem, "nbd: config out of range; values are clamped");
        }
        NbdServer { frontend, config: Arc::new(config), stats: Arc::new(NbdStats::default()) }
    }

    pub fn stats(&self) -> &Arc<NbdStats> {
        &self.stats
    }

    pub fn config(&self) -> &NbdConfig {
        &self.config
    }

    pub fn frontend(&self) -> &Arc<Frontend> {
        &self.frontend
    }

    /// Serve NBD on a TCP listener until `shutdown` becomes true (or its sender is
    /// dropped); then stop accepting and wait (bounded) for connections to drain.
    pub async fn serve_tcp(&self, listener: TcpListener, shutdown: watch::Receiver<bool>) -> io::Result<()> {
        let listener = &listener;
        self.accept_loop(shutdown, move || async move {
            let (stream, peer) = listener.accept().await?;
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%peer, %error, "nbd: TCP_NODELAY failed");
            }
            let (read_half, write_half) = stream.into_split();
            Ok((read_half, write_half, peer.ip().to_string()))
        })
        .await
    }

    /// Serve NBD on a unix-domain socket listener; same contract as [`Self::serve_tcp`].
    pub async fn serve_unix(&self, listener: UnixListener, shutdown: watch::Receiver<bool>) -> io::Result<()> {
        let listener = &listener;
        self.accept_loop(shutdown, move || async move {
            let (stream, _peer) = listener.accept().await?;
            let client = match stream.peer_cred() {
                Ok(cred) => format!("uid {}", cred.uid()),
                Err(_) => "unix".to_string(),
            };
            let (read_half, write_half) = stream.into_split();
            Ok((read_half, write_half, client))
        })
        .await
    }

    /// Serve one already-connected byte stream (used by tests and the fuzz target).
    pub async fn serve_stream<S>(&self, stream: S, shutdown: watch::Receiver<bool>) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        self.serve_connection(read_half, write_half, &ConnectionSlot::default(), "stream", shutdown).await
    }

    async fn accept_loop<A, F, R, W>(&self, mut shutdown: watch::Receiver<bool>, mut accept: A) -> io::Result<()>
    where
        A: FnMut() -> F,
        F: std::future::Future<Output = io::Result<(R, W, String)>>,
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + crate::reply_line::DirectFd + Unpin + Send + 'static,
    {
        let connection_slots = Arc::new(Semaphore::new(self.config.connections_max.clamp(1, 1 << 20)));
        let slots: Arc<SlotTable> = Arc::default();
        let mut connections = JoinSet::new();
        let mut backoff = AcceptBackoff::default();
        let mut trim = tokio::time::interval(BUFFER_TRIM_INTERVAL);
        let mut next_id = 0u64;
        loop {
            if *shutdown.borrow() {
                break;
            }
            // Reap finished connection tasks so the set stays bounded.
            while connections.try_join_next().is_some() {}
            let accepted = tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() { break; }
                    continue;
                }
                _ = trim.tick() => {
                    self.frontend.buffers.trim();
                    continue;
                }
                accepted = accept() => accepted,
            };
            let (read_half, write_half, peer) = match accepted {
                Ok(halves) => {
                    backoff.succeeded();
                    halves
                }
                Err(error) => {
                    self.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                    let pause = backoff.failed(&error);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.changed() => {}
                    }
                    continue;
                }
            };
            let slot = self.wait_for_slot(&connection_slots, &slots, &mut shutdown).await;
            let Some(slot) = slot else { break };
            next_id += 1;
            let (server, connection_shutdown) = (self.clone(), shutdown.clone());
            let registration = Registration { slot, slots: slots.clone(), id: next_id, peer };
            connections.spawn(server.run_registered(read_half, write_half, registration, connection_shutdown));
        }
        // Connections saw the same signal; give them the grace period plus a margin.
        let drain = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(self.config.shutdown_grace + Duration::from_secs(1), drain).await.is_err() {
            tracing::warn!("nbd: connections still open after the shutdown grace period; aborting them");
            connections.abort_all();
        }
        Ok(())
    }

    /// A slot for a client just accepted. At the cap the client waits here (one
    /// descriptor beyond the cap at most) while idle connections are asked to make
    /// room. `None` when shutting down.
    async fn wait_for_slot(
        &self,
        connection_slots: &Arc<Semaphore>,
        slots: &SlotTable,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<OwnedSemaphorePermit> {
        loop {
            if let Ok(slot) = connection_slots.clone().try_acquire_owned() {
                return Some(slot);
            }
            self.evict_idlest(slots);
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return None,
                slot = connection_slots.clone().acquire_owned() => return slot.ok(),
                _ = tokio::time::sleep(EVICT_RETRY_INTERVAL) => {}
            }
        }
    }

    /// One connection task: listed in the slot table for its lifetime.
    async fn run_registered<R, W>(self, read_half: R, write_half: W, registration: Registration, shutdown: watch::Receiver<bool>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + crate::reply_line::DirectFd + Unpin + Send + 'static,
    {
        let Registration { slot: _slot, slots, id, peer } = registration;
        let connection = Arc::new(ConnectionSlot::default());
        if let Ok(mut table) = slots.lock() {
            table.insert(id, connection.clone());
        }
        if let Err(error) = self.serve_connection(read_half, write_half, &connection, &peer, shutdown).await {
            tracing::debug!(%error, "nbd: connection ended with an error");
        }
        if let Ok(mut table) = slots.lock() {
            table.remove(&id);
        };
    }

    /// At the connection cap: ask the connection idle longest to close.
    fn evict_idlest(&self, slots: &SlotTable) {
        let Ok(table) = slots.lock() else { return };
        let newest_allowed = now_ms().saturating_sub(EVICT_IDLE_MIN.as_millis() as u64);
        let idlest = table
            .values()
            .filter(|c| {
                let last = c.last_request_ms.load(Ordering::Relaxed);
                last != 0 && last <= newest_allowed
            })
            .min_by_key(|c| c.last_request_ms.load(Ordering::Relaxed));
        if let Some(connection) = idlest {
            // Not again before it has had time to go (it may also refuse: busy).
            connection.last_request_ms.store(now_ms(), Ordering::Relaxed);
            connection.evict.notify_one();
            self.stats.connections_evicted.fetch_add(1, Ordering::Relaxed);
            tracing::info!("nbd: connection cap reached; closing the connection idle longest");
        }
    }

    /// Run one connection: handshake, then transmission.
    async fn serve_connection<R, W>(
        &self,
        read_half: R,
        mut write_half: W,
        slot: &ConnectionSlot,
        peer: &str,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<()>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + crate::reply_line::DirectFd + Unpin + Send + 'static,
    {
        self.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
        self.stats.connections_active.fetch_add(1, Ordering::Relaxed);
        let _active = ActiveGuard(&self.stats);
        let mut reader = FrameReader::new(read_half);
        let registry = &*self.frontend.registry;
        let negotiation = handshake::negotiate(&mut reader, &mut write_half, registry, &self.config);
        let refused = || self.stats.connections_refused.fetch_add(1, Ordering::Relaxed);
        let session = tokio::select! {
            result = tokio::time::timeout(self.config.handshake_timeout, negotiation) => match result {
                Ok(Ok(Some(session))) => session,
                Ok(Ok(None)) => {
                    refused();
                    return Ok(());
                }
                Ok(Err(error)) => {
                    refused();
                    return if error.kind() == io::ErrorKind::UnexpectedEof { Ok(()) } else { Err(error) };
                }
                Err(_elapsed) => {
                    refused();
                    tracing::debug!("nbd: handshake timed out");
                    return Ok(());
                }
            },
            _ = wait_for_shutdown(&mut shutdown) => return Ok(()),
        };
        self.stats.sessions_started.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(export = %session.export.name, flags = session.transmission_flags, %peer, "nbd: transmission");
        let client = self.frontend.clients.connect("nbd", peer);
        let recorders = transmission::SessionRecorders { client: client.stats().clone(), server: self.stats.clone() };
        // listed while it transmits; an admin's disconnect (destroy -f) stops it as a
        // server shutdown would
        let listed = self.frontend.sessions.attach(&session.export.name);
        let mut disconnect = listed.disconnect_requested();
        let stop = stop_on_either(shutdown, disconnect.clone());
        let run = transmission::run(reader, write_half, session, &self.config, &self.frontend, slot, recorders, stop);
        // A session asked to go has the shutdown grace to finish what is in flight; one
        // that cannot (a reader waiting for budget a non-reading client holds) is
        // dropped then, so the destroy waiting for it is not held up.
        let forced = async {
            let _ = disconnect.wait_for(|go| *go).await;
            tokio::time::sleep(self.config.shutdown_grace + DISCONNECT_FORCE_MARGIN).await;
        };
        tokio::select! {
            result = run => result,
            _ = forced => {
                tracing::info!(%peer, "nbd: session dropped after an admin's disconnect");
                Ok(())
            }
        }
    }
}

/// A receiver that turns true when `shutdown` does (or its sender goes) or when
/// `disconnect` does; the forwarding task ends with the session (its receivers
/// dropped).
fn stop_on_either(mut shutdown: watch::Receiver<bool>, mut disconnect: watch::Receiver<bool>) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(*shutdown.borrow() || *disconnect.borrow());
    if *rx.borrow() {
        return rx;
    }
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
                changed = disconnect.changed() => {
                    if changed.is_err() {
                        return; // the session is over
                    }
                    if *disconnect.borrow() {
                        break;
                    }
                }
                _ = tx.closed() => return,
            }
        }
        let _ = tx.send(true);
    });
    rx
}

/// Accept-failure pacing: exponential pause, one log line per interval.
struct AcceptBackoff {
    pause: Duration,
    failures_unlogged: u64,
    last_logged: Option<Instant>,
}

impl Default for AcceptBackoff {
    fn default() -> AcceptBackoff {
        AcceptBackoff { pause: ACCEPT_RETRY_PAUSE_MIN, failures_unlogged: 0, last_logged: None }
    }
}

impl AcceptBackoff {
    fn succeeded(&mut self) {
        self.pause = ACCEPT_RETRY_PAUSE_MIN;
    }

    /// Record a failure; returns how long to pause before the next accept.
    fn failed(&mut self, error: &io::Error) -> Duration {
        self.failures_unlogged += 1;
        let due = self.last_logged.is_none_or(|at| at.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL);
        if due {
            tracing::warn!(
                %error,
                failures = self.failures_unlogged,
                "nbd: accept failed (out of file descriptors?); backing off, next report in {:?}",
                ACCEPT_ERROR_LOG_INTERVAL
            );
            self.failures_unlogged = 0;
            self.last_logged = Some(Instant::now());
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_RETRY_PAUSE_MAX);
        pause
    }
}

struct ActiveGuard<'a>(&'a NbdStats);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.connections_active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Resolves once the shutdown signal is true or its sender is gone.
async fn wait_for_shutdown(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
