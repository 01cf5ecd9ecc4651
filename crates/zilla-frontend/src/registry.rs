//! registry: how a front end finds volumes by export name.
//!
//! The daemon implements [`ExportRegistry`] over its pools; tests use
//! [`StaticRegistry`]. Export names are `POOL/NAME`. The empty export name (what a
//! client sends for `nbd://host/`) resolves to the only export when exactly one exists,
//! and to nothing otherwise: with several volumes we refuse to guess. Lookups happen
//! once per OPT_GO/OPT_INFO/EXPORT_NAME, never on the data path.

use std::collections::BTreeMap;
use std::sync::Arc;

use zilla_core::zvol::BlockVolume;

/// One export as listed by NBD_OPT_LIST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// "POOL/NAME"
    pub name: String,
    /// Free text for humans (`nbdinfo --list` shows it); may be empty.
    pub description: String,
}

/// The set of volumes the server may hand out.
pub trait ExportRegistry: Send + Sync + 'static {
    /// Every export, in a stable order.
    fn list(&self) -> Vec<ExportInfo>;
    /// The volume behind an exact export name (not the empty name; see
    /// [`resolve_export`]).
    fn open(&self, name: &str) -> Option<Arc<dyn BlockVolume>>;
    /// A stable number identifying the pool that holds export `name` (the pool GUID),
    /// from which a protocol derives identifiers that survive restarts (the iSCSI
    /// target's NAA identifier and serial). `None`: not known (then the name alone is
    /// used).
    fn pool_id(&self, _name: &str) -> Option<u64> {
        None
    }
    /// The value of a volume property of export `name` ("on"/"off", ...), if any.
    fn property(&self, _name: &str, _property: &str) -> Option<String> {
        None
    }
    /// Set a volume property of export `name` persistently (an iSCSI MODE SELECT that
    /// changes the write cache sets `wce`). May block (the pool writes the change).
    fn set_property(&self, _name: &str, _property: &str, _value: &str) -> Result<(), String> {
        Err("this registry cannot change properties".to_string())
    }
}

/// An opened export: its canonical name, description and volume.
pub struct ResolvedExport {
    pub name: String,
    pub description: String,
    pub volume: Arc<dyn BlockVolume>,
}

/// Resolve a client-supplied export name, mapping "" to the only export if exactly
/// one exists.
pub fn resolve_export(registry: &dyn ExportRegistry, requested: &str) -> Option<ResolvedExport> {
    let exports = registry.list();
    let info = if requested.is_empty() {
        match exports.as_slice() {
            [only] => only.clone(),
            _ => return None,
        }
    } else {
        exports.into_iter().find(|e| e.name == requested).unwrap_or(ExportInfo {
            name: requested.to_string(),
            description: String::new(),
        })
    };
    let volume = registry.open(&info.name)?;
    Some(ResolvedExport { name: info.name, description: info.description, volume })
}

/// A fixed map of export name to volume, for tests and simple embeddings.
#[derive(Default)]
pub struct StaticRegistry {
    exports: BTreeMap<String, (String, Arc<dyn BlockVolume>)>,
}

impl StaticRegistry {
    pub fn new() -> StaticRegistry {
        StaticRegistry::default()
    }

    /// Add (or replace) an export.
    pub fn insert(&mut self, name: &str, description: &str, volume: Arc<dyn BlockVolume>) {
        self.exports.insert(name.to_string(), (description.to_string(), volume));
    }

    /// Builder form of [`StaticRegistry::insert`].
    pub fn with(mut self, name: &str, volume: Arc<dyn BlockVolume>) -> StaticRegistry {
        self.insert(name, "", volume);
        self
    }
}

impl ExportRegistry for StaticRegistry {
    fn list(&self) -> Vec<ExportInfo> {
        self.exports
            .iter()
            .map(|(name, (description, _))| ExportInfo {
                name: name.clone(),
                description: description.clone(),
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn BlockVolume>> {
        self.exports.get(name).map(|(_, volume)| volume.clone())
    }
}
