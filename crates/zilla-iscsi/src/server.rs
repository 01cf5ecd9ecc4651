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

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use zilla_frontend::{ExportRegistry, Frontend, FrontendConfig};

use crate::auth::AuthStore;
use crate::access::{Access, LoginsInProgress};
use crate::connection::{self, Peer, ServerShared};
use crate::sessions::{SessionInfo, SessionRegistry};
use crate::{names, IscsiConfig, IscsiStats};

const ACCEPT_RETRY_PAUSE_MIN: Duration = Duration::from_millis(10);
const ACCEPT_RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);

/// One target as the admin's listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// The target name.
    pub iqn: String,
    /// The volume, POOL/NAME.
    pub volume: String,
    /// Served over iSCSI (`shareiscsi` not off).
    pub shared: bool,
    /// "none", "chap" or "mutual" (from the target's entry or the default).
    pub auth: String,
    /// The target has settings of its own (else the default entry applies).
    pub own_entry: bool,
    /// Initiator names allowed (0: any).
    pub initiators: usize,
}

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
                stats: Arc::new(IscsiStats::default()),
                next_tsih: AtomicU16::new(1),
                access: Access {
                    store: Mutex::new(Arc::new(AuthStore::default())),
                    sessions: Arc::new(SessionRegistry::new(config.connections_max)),
                },
                units: Default::default(),
                logins: Default::default(),
                config,
            }),
        }
    }

    pub fn stats(&self) -> &Arc<IscsiStats> {
        &self.shared.stats
    }

    pub fn config(&self) -> &IscsiConfig {
        &self.shared.config
    }

    /// Replace who may log in; logins from now on use `store` (sessions already
    /// logged in stay).
    pub fn set_auth_store(&self, store: AuthStore) {
        *self.shared.access.store.lock() = Arc::new(store);
    }

    /// The authentication store in use.
    pub fn auth_store(&self) -> Arc<AuthStore> {
        self.shared.access.store()
    }

    /// The live sessions (normal and discovery), oldest first.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.shared.access.sessions.snapshot()
    }

    /// Every volume as a target, with its authentication. Reads the volumes'
    /// `shareiscsi` property: call off the async runtime's worker threads.
    pub fn targets(&self) -> Vec<TargetInfo> {
        let registry = &*self.shared.frontend.registry;
        let store = self.auth_store();
        registry
            .list()
            .into_iter()
            .map(|export| {
                let iqn = names::target_name(&export.name);
                let entry = store.entry(&iqn);
                TargetInfo {
                    shared: names::is_shared(registry, &export.name),
                    auth: entry.kind().to_string(),
                    own_entry: store.own_entry(&iqn).is_some(),
                    initiators: entry.initiators.len(),
                    volume: export.name,
                    iqn,
                }
            })
            .collect()
    }

    /// Serve on a TCP listener until `shutdown` turns true (or its sender goes); then
    /// stop accepting and wait (bounded by the grace time) for connections to finish.
    pub async fn serve_tcp(&self, listener: TcpListener, mut shutdown: watch::Receiver<bool>) -> io::Result<()> {
        let slots = Arc::new(Semaphore::new(self.shared.config.connections_max.clamp(1, 1 << 20)));
        // a target with no CHAP user is open to logins on a loopback listener only
        let listener_loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
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
            // one address may not hold more than LOGINS_PER_ADDRESS_MAX connections in
            // the login phase: a flood from one host cannot fill the connection cap
            // with logins that never finish while others wait
            let Some(login_slot) = LoginsInProgress::try_take(&self.shared.logins, peer.ip()) else {
                IscsiStats::count(&self.shared.stats.logins_refused);
                tracing::debug!(client = %peer.ip(), "iscsi: too many logins in progress from this address; connection closed");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let portal = stream.local_addr().ok().map(|a| a.to_string());
            let (read_half, write_half) = stream.into_split();
            let peer = Peer { client: peer.ip().to_string(), address: peer.to_string(), listener_loopback, portal, login_slot: Some(login_slot) };
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
        let peer = Peer { client: "stream".into(), address: "stream".into(), listener_loopback: true, portal, login_slot: None };
        self.run(read_half, write_half, peer, shutdown).await;
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
