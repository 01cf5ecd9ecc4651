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

    /// The volume other than `export`, served over iSCSI (`shareiscsi` not off), whose
    /// target name `export` would also map to (names are lowercased and characters an
    /// IQN may not hold become `-`, so `tank/Vol_1` and `tank/vol-1` clash).
    pub fn iscsi_target_taken_by(&self, export: &str) -> Option<String> {
        let want = zilla_iscsi::names::target_name(export);
        self.list().into_iter().map(|(name, _)| name).filter(|name| name != export).find(|name| {
            zilla_iscsi::names::target_name(name) == want && zilla_nbd::ExportRegistry::property(self, name, "shareiscsi").as_deref() != Some("off")
        })
    }

    /// Refuse to serve `export` over iSCSI when another shared volume has its target
    /// name; the message says how to go on.
    pub fn check_iscsi_target_free(&self, export: &str) -> Result<(), String> {
        match self.iscsi_target_taken_by(export) {
            None => Ok(()),
            Some(other) => Err(format!(
                "volume '{export}' would be iSCSI target {}, which '{other}' already is (names are lowercased and \
                 characters other than a-z, 0-9, '-' and '.' become '-'): choose another name, or set shareiscsi=off on one of them",
                zilla_iscsi::names::target_name(export)
            )),
        }
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
    fn pool_id(&self, name: &str) -> Option<u64> {
        let (pool, _) = name.split_once('/')?;
        Some(self.pools.get(pool)?.guid().0)
    }
    fn property(&self, name: &str, property: &str) -> Option<String> {
        let (pool, vol) = name.split_once('/')?;
        if zilla_core::props::is_internal(property) {
            return self.pools.get(pool)?.internal_prop(vol, property);
        }
        let rows = self.pools.get(pool)?.get_props(vol, &[property.to_string()]).ok()?;
        rows.into_iter().next().map(|row| row.value)
    }
    fn set_property(&self, name: &str, property: &str, value: &str) -> Result<(), String> {
        let (pool, vol) = name.split_once('/').ok_or_else(|| format!("'{name}' is not POOL/NAME"))?;
        let pool = self.pools.get(pool).ok_or_else(|| format!("pool of '{name}' is not imported"))?;
        pool.set_prop(vol, property, value).map_err(|e| e.to_string())
    }
}
