//! The one place the daemon meets the iSCSI target (crates/zilla-iscsi). The daemon
//! builds the front end (with the export registry of [`crate::exports`]) and hands it
//! here, as it does for NBD (nbd_glue.rs).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The iSCSI target over the daemon's one front end (export registry, memory budget,
/// volume-call budget, reply buffers, sessions, statistics), shared with NBD.
pub fn server(frontend: Arc<zilla_frontend::Frontend>, config: zilla_iscsi::IscsiConfig) -> zilla_iscsi::IscsiServer {
    zilla_iscsi::IscsiServer::with_frontend(frontend, config)
}

/// Serve iSCSI on `listener` until `stop` turns true. The task ends when the target
/// has stopped accepting and its connections have finished (bounded by its grace time).
pub fn spawn(server: zilla_iscsi::IscsiServer, listener: TcpListener, stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = server.serve_tcp(listener, stop).await {
            tracing::error!("iSCSI target stopped: {e}");
        }
    })
}
