//! exports: the volumes the front ends serve, by export name.
//!
//! Exports are every volume of every imported pool, named "POOL/NAME". A front end
//! asks the [`Exports`] registry on each connection (NBD_OPT_LIST, NBD_OPT_GO), so a
//! volume created a moment ago is served at once and a destroyed one disappears.

use std::sync::Arc;

use zilla_core::zvol::BlockVolume;

use crate::pools::PoolTable;

/// The export registry over the daemon's pool table.
pub struct Exports {
    pub pools: Arc<PoolTable>,
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
