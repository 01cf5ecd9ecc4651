//! The one place the daemon meets the NBD server (crates/zilla-nbd). The daemon builds
//! the front end (with the export registry of [`crate::exports`]) and hands it here.

use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The NBD server over the daemon's one front end (export registry, memory budget,
/// volume-call budget, reply buffers, sessions, statistics), which it shares with
/// every other front end and the web layer.
pub fn server(frontend: Arc<zilla_frontend::Frontend>, config: zilla_nbd::NbdConfig) -> zilla_nbd::NbdServer {
    zilla_nbd::NbdServer::with_frontend(frontend, config)
}

/// Start serving NBD on the TCP listener (if any) and the unix socket until `stop`
/// turns true. The returned task ends when the server has stopped accepting and its
/// in-flight requests have finished or failed (bounded by the server's grace time).
pub fn spawn(
    server: zilla_nbd::NbdServer,
    tcp: Option<TcpListener>,
    unix: UnixListener,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let tcp_server = server.clone();
        let tcp_stop = stop.clone();
        let tcp_task = async move {
            match tcp {
                Some(l) => tcp_server.serve_tcp(l, tcp_stop).await,
                None => Ok(()),
            }
        };
        let (a, b) = tokio::join!(tcp_task, server.serve_unix(unix, stop));
        for r in [a, b] {
            if let Err(e) = r {
                tracing::error!("NBD server stopped: {e}");
            }
        }
    })
}
