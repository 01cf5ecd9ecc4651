//! The one place the daemon meets the NBD server (crates/zilla-nbd). The exports are
//! those of [`crate::exports`].

use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::exports::Exports;
use crate::pools::PoolTable;

/// The NBD server over the daemon's pools, with its own front end (memory budget,
/// volume-call budget, reply buffers, statistics) built from the config file.
pub fn server(
    pools: Arc<PoolTable>,
    frontend: zilla_frontend::FrontendConfig,
    config: zilla_nbd::NbdConfig,
) -> zilla_nbd::NbdServer {
    let frontend = zilla_frontend::Frontend::new(Arc::new(Exports { pools }), frontend);
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
