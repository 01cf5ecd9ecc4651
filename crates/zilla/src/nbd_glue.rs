//! The one place the daemon meets the NBD server (crates/zilla-nbd).
//!
//! Exports are every volume of every imported pool, named "POOL/NAME". The server
//! asks the [`Exports`] registry on each connection (NBD_OPT_LIST, NBD_OPT_GO), so a
//! volume created a moment ago is served at once and a destroyed one disappears.

use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use zilla_core::zvol::BlockVolume;

use crate::daemon::PoolTable;

/// The export registry over the daemon's pool table.
pub struct Exports {
    pools: Arc<PoolTable>,
}

impl Exports {
    /// (name, size) of every volume, sorted by name.
    pub fn list(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .pools
            .all()
            .into_iter()
            .flat_map(|(_, p)| p.volumes())
            .map(|v| (v.name, v.volsize))
            .collect();
        out.sort();
        out
    }

    /// Open "POOL/NAME"; None if there is no such volume.
    pub fn open(&self, name: &str) -> Option<Arc<dyn BlockVolume>> {
        let (pool, vol) = name.split_once('/')?;
        match self.pools.get(pool)?.open_volume(vol) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::debug!("NBD export '{name}': {e}");
                None
            }
        }
    }
}

impl zilla_nbd::ExportRegistry for Exports {
    fn list(&self) -> Vec<zilla_nbd::ExportInfo> {
        Exports::list(self)
            .into_iter()
            .map(|(name, size)| zilla_nbd::ExportInfo {
                name,
                description: format!("zilla volume, {}", crate::units::nicebytes(size)),
            })
            .collect()
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockVolume>> {
        Exports::open(self, name)
    }
}

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
