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
#[allow(dead_code)] // used once the NBD server is wired in (see spawn)
pub struct Exports {
    pools: Arc<PoolTable>,
}

#[allow(dead_code)]
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

/// Start serving NBD on the TCP listener (if any) and the unix socket until `stop`
/// turns true. The returned task ends when the server has stopped accepting and its
/// in-flight requests have finished or failed.
pub fn spawn(
    pools: Arc<PoolTable>,
    tcp: Option<TcpListener>,
    unix: UnixListener,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let _exports = Arc::new(Exports { pools });
    // TODO(nbd): replace this block with the zilla-nbd server once it lands, roughly:
    //   impl zilla_nbd::ExportRegistry for Exports { list -> ExportInfo, open -> open }
    //   let server = zilla_nbd::NbdServer::new();
    //   let a = tcp.map(|l| tokio::spawn(server.clone().serve_tcp(l, exports.clone(), stop.clone())));
    //   let b = tokio::spawn(server.serve_unix(unix, exports, stop));
    //   join both.
    tokio::spawn(async move {
        tracing::warn!("NBD server not built into this binary yet: connections will be closed");
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                c = accept_tcp(&tcp) => drop(c),
                c = unix.accept() => drop(c),
            }
        }
    })
}

async fn accept_tcp(l: &Option<TcpListener>) -> std::io::Result<tokio::net::TcpStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}
