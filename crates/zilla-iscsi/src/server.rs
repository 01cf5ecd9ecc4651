//! server: the accept loop of the target and the life of its connections.
//!
//! ```text
//!   accept ──> [connection task]: login (timeout) ──> full feature phase ──> close
//!     ^             one tokio task per connection, at most `connections_max`;
//!     │             at the cap new clients wait in the listen backlog
//!     └── stops when the shutdown signal fires; then waits (bounded) for the
//!         connection tasks, which stop reading and finish their commands in flight.
//! ```
//!
//! Accept errors (EMFILE and friends) do not end the server: the loop pauses 10 ms
//! doubling to 1 s and logs one warning per failure streak. Every socket gets
//! TCP_NODELAY.

use std::io;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use zilla_frontend::{ExportRegistry, Frontend, FrontendConfig};

use crate::connection::{self, Peer, ServerShared};
use crate::{IscsiConfig, IscsiStats};

const ACCEPT_RETRY_PAUSE_MIN: Duration = Duration::from_millis(10);
const ACCEPT_RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The iSCSI target: the shared front end plus configuration. Cheap to clone.
#[derive(Clone)]
pub struct IscsiServer {
    shared: Arc<ServerShared>,
}

impl IscsiServer {
    /// A target with its own front end (default budgets) over `registry`; for tests.
    pub fn new(registry: Arc<dyn ExportRegistry>, config: IscsiConfig) -> IscsiServer {
        IscsiServer::with_frontend(Frontend::new(registry, FrontendConfig::default()), config)
    }

    /// A target sharing `frontend` with the other front ends. Call
    /// [`IscsiConfig::validate`] first to refuse bad tunables.
    pub fn with_frontend(frontend: Arc<Frontend>, config: IscsiConfig) -> IscsiServer {
        if let Err(problem) = config.validate() {
            tracing::warn!(%problem, "iscsi: config out of range");
        }
        IscsiServer {
            shared: Arc::new(ServerShared {
                frontend,
                config,
                stats: Arc::new(IscsiStats::default()),
                next_tsih: AtomicU16::new(1),
                units: Default::default(),
            }),
        }
    }

    pub fn stats(&self) -> &Arc<IscsiStats> {
        &self.shared.stats
    }

    pub fn config(&self) -> &IscsiConfig {
        &self.shared.config
    }

    /// Serve on a TCP listener until `shutdown` turns true (or its sender goes); then
    /// stop accepting and wait (bounded by the grace time) for connections to finish.
    pub async fn serve_tcp(&self, listener: TcpListener, mut shutdown: watch::Receiver<bool>) -> io::Result<()> {
        let slots = Arc::new(Semaphore::new(self.shared.config.connections_max.clamp(1, 1 << 20)));
        let mut connections = JoinSet::new();
        let mut pause = ACCEPT_RETRY_PAUSE_MIN;
        let mut failing = false;
        loop {
            while connections.try_join_next().is_some() {}
            let slot = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                slot = slots.clone().acquire_owned() => match slot { Ok(s) => s, Err(_) => break },
            };
            let accepted = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(a) => {
                    pause = ACCEPT_RETRY_PAUSE_MIN;
                    failing = false;
                    a
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "iscsi: accept failed (out of file descriptors?); backing off");
                        failing = true;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.wait_for(|s| *s) => break,
                    }
                    pause = (pause * 2).min(ACCEPT_RETRY_PAUSE_MAX);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let portal = stream.local_addr().ok().map(|a| a.to_string());
            let (read_half, write_half) = stream.into_split();
            let peer = Peer { client: peer.ip().to_string(), portal };
            let (server, stop) = (self.clone(), shutdown.clone());
            connections.spawn(async move {
                let _slot = slot;
                server.run(read_half, write_half, peer, stop).await;
            });
        }
        let grace = self.shared.config.shutdown_grace + Duration::from_secs(1);
        let drain = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, drain).await.is_err() {
            tracing::warn!("iscsi: connections still open after the shutdown grace period; aborting them");
            connections.abort_all();
        }
        Ok(())
    }

    /// Serve one connected byte stream (tests); `portal` is what SendTargets reports.
    pub async fn serve_stream<S>(&self, stream: S, portal: Option<String>, shutdown: watch::Receiver<bool>)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        self.run(read_half, write_half, Peer { client: "stream".into(), portal }, shutdown).await;
    }

    async fn run<R, W>(&self, read_half: R, write_half: W, peer: Peer, stop: watch::Receiver<bool>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let stats = &self.shared.stats;
        IscsiStats::count(&stats.connections_accepted);
        stats.connections_active.fetch_add(1, Ordering::Relaxed);
        let client = peer.client.clone();
        if let Err(error) = connection::serve(read_half, write_half, self.shared.clone(), peer, stop).await {
            tracing::debug!(%client, %error, "iscsi: connection ended with an error");
        }
        stats.connections_active.fetch_sub(1, Ordering::Relaxed);
    }
}
