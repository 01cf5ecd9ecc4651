//! server: accept loops (TCP, unix) and the life of one connection.
//!
//! ```text
//!   accept ──> [connection task]: handshake (timeout) ──> transmission ──> close
//!     ^             one tokio task per connection, at most `connections_max`
//!     └── stops when the shutdown signal fires; then waits (bounded) for the
//!         connection tasks, which answer ESHUTDOWN and drain in-flight requests.
//! ```
//!
//! The shutdown signal is a `tokio::sync::watch::Receiver<bool>`: the daemon sends
//! `true` (or drops the sender) to stop. Accept errors (EMFILE and friends) are logged
//! and retried after a short pause rather than ending the server. Every accepted TCP
//! socket gets TCP_NODELAY: replies are small and latency-bound.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::framing::FrameReader;
use crate::registry::ExportRegistry;
use crate::{handshake, transmission, NbdConfig};

/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Counters for the admin API / analytics.
#[derive(Debug, Default)]
pub struct NbdStats {
    /// Connections accepted since start.
    pub connections_accepted: AtomicU64,
    /// Connections currently open.
    pub connections_active: AtomicU64,
    /// Connections that reached the transmission phase.
    pub sessions_started: AtomicU64,
}

/// The NBD server: a registry of exports plus configuration. Cheap to clone; every
/// clone serves the same registry and shares counters.
#[derive(Clone)]
pub struct NbdServer {
    registry: Arc<dyn ExportRegistry>,
    config: Arc<NbdConfig>,
    stats: Arc<NbdStats>,
}

impl NbdServer {
    /// Build a server. Call [`NbdConfig::validate`] first to reject bad tunables; the
    /// server itself clamps them into a safe range rather than failing.
    pub fn new(registry: Arc<dyn ExportRegistry>, config: NbdConfig) -> NbdServer {
        if let Err(problem) = config.validate() {
            tracing::warn!(%problem, "nbd: config out of range; values are clamped");
        }
        NbdServer { registry, config: Arc::new(config), stats: Arc::new(NbdStats::default()) }
    }

    pub fn stats(&self) -> &NbdStats {
        &self.stats
    }

    pub fn config(&self) -> &NbdConfig {
        &self.config
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
            Ok((read_half, write_half))
        })
        .await
    }

    /// Serve NBD on a unix-domain socket listener; same contract as [`Self::serve_tcp`].
    pub async fn serve_unix(&self, listener: UnixListener, shutdown: watch::Receiver<bool>) -> io::Result<()> {
        let listener = &listener;
        self.accept_loop(shutdown, move || async move {
            let (stream, _peer) = listener.accept().await?;
            Ok(stream.into_split())
        })
        .await
    }

    /// Serve one already-connected byte stream (used by tests and the fuzz target).
    pub async fn serve_stream<S>(&self, stream: S, shutdown: watch::Receiver<bool>) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        self.serve_connection(read_half, write_half, shutdown).await
    }

    async fn accept_loop<A, F, R, W>(&self, mut shutdown: watch::Receiver<bool>, mut accept: A) -> io::Result<()>
    where
        A: FnMut() -> F,
        F: std::future::Future<Output = io::Result<(R, W)>>,
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let connection_slots = Arc::new(Semaphore::new(self.config.connections_max));
        let mut connections = JoinSet::new();
        loop {
            if *shutdown.borrow() {
                break;
            }
            // Reap finished connection tasks so the set stays bounded.
            while connections.try_join_next().is_some() {}
            let slot = tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() { break; }
                    continue;
                }
                slot = connection_slots.clone().acquire_owned() => slot,
            };
            let Ok(slot) = slot else { break };
            let accepted = tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() { break; }
                    continue;
                }
                accepted = accept() => accepted,
            };
            let (read_half, write_half) = match accepted {
                Ok(halves) => halves,
                Err(error) => {
                    tracing::warn!(%error, "nbd: accept failed");
                    tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                    continue;
                }
            };
            let server = self.clone();
            let connection_shutdown = shutdown.clone();
            connections.spawn(async move {
                let _slot = slot;
                if let Err(error) = server.serve_connection(read_half, write_half, connection_shutdown).await {
                    tracing::debug!(%error, "nbd: connection ended with an error");
                }
            });
        }
        // Connections saw the same signal; give them the grace period plus a margin.
        let drain = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(self.config.shutdown_grace + Duration::from_secs(2), drain).await.is_err() {
            tracing::warn!("nbd: connections still open after the shutdown grace period; aborting them");
            connections.abort_all();
        }
        Ok(())
    }

    /// Run one connection: handshake, then transmission.
    async fn serve_connection<R, W>(&self, read_half: R, mut write_half: W, mut shutdown: watch::Receiver<bool>) -> io::Result<()>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        self.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
        self.stats.connections_active.fetch_add(1, Ordering::Relaxed);
        let _active = ActiveGuard(&self.stats);
        let mut reader = FrameReader::new(read_half);
        let negotiation = handshake::negotiate(&mut reader, &mut write_half, &*self.registry, &self.config);
        let session = tokio::select! {
            result = tokio::time::timeout(self.config.handshake_timeout, negotiation) => match result {
                Ok(Ok(Some(session))) => session,
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(error)) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(Err(error)) => return Err(error),
                Err(_elapsed) => {
                    tracing::debug!("nbd: handshake timed out");
                    return Ok(());
                }
            },
            _ = wait_for_shutdown(&mut shutdown) => return Ok(()),
        };
        self.stats.sessions_started.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(export = %session.export.name, flags = session.transmission_flags, "nbd: transmission");
        transmission::run(reader, write_half, session, &self.config, shutdown).await
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
