//! spa: the storage pool allocator — the pool as a whole (ENGINE: being written).
use std::path::PathBuf;
use std::sync::Arc;

use crate::props::PropRow;
use crate::vdev::queue::LeafStats;
use crate::vdev::{LeafSpec, Role};
use crate::zvol::BlockVolume;
use crate::{Error, Result};

/// One top-level vdev as the user asked for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopSpec {
    pub role: Role,
    pub mirror: bool,
    pub leaves: Vec<LeafSpec>,
}

/// Parse zpool's vdev grammar: `[mirror] A B ... log [mirror] C D cache E spare F`.
/// Each `mirror` keyword starts a new mirror; bare leaves in the normal class are
/// single-disk top-level vdevs; cache and spare leaves are always single.
pub fn parse_vdev_args(args: &[String]) -> Result<Vec<TopSpec>> {
    let mut tops: Vec<TopSpec> = Vec::new();
    let mut role = Role::Normal;
    let mut in_mirror = false;
    for a in args {
        match a.as_str() {
            "mirror" => {
                if matches!(role, Role::Cache | Role::Spare) {
                    return Err(Error::invalid(format!("{:?} devices cannot be mirrored", role).to_lowercase()));
                }
                tops.push(TopSpec { role, mirror: true, leaves: vec![] });
                in_mirror = true;
            }
            "log" => { role = Role::Log; in_mirror = false; }
            "cache" => { role = Role::Cache; in_mirror = false; }
            "spare" => { role = Role::Spare; in_mirror = false; }
            "raidz" | "raidz1" | "raidz2" | "raidz3" | "draid" | "special" | "dedup" => {
                return Err(Error::invalid(format!("vdev type '{a}' is not supported (use mirror)")));
            }
            leaf => {
                let spec = LeafSpec::parse(leaf)?;
                if in_mirror {
                    tops.last_mut().expect("mirror pushed").leaves.push(spec);
                } else {
                    tops.push(TopSpec { role, mirror: false, leaves: vec![spec] });
                }
            }
        }
    }
    for t in &tops {
        if t.mirror && t.leaves.len() < 2 {
            return Err(Error::invalid("a mirror needs at least two devices"));
        }
    }
    if tops.is_empty() {
        return Err(Error::invalid("no devices given"));
    }
    let mut seen = std::collections::HashSet::new();
    for t in &tops {
        for l in &t.leaves {
            if !seen.insert(l.path.clone()) {
                return Err(Error::invalid(format!("{} is specified more than once", l.path.display())));
            }
        }
    }
    Ok(tops)
}

#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    pub force: bool,
    pub ashift: Option<u8>,
    /// Pool properties (-o name=value): ashift, autoreplace, failmode.
    pub props: Vec<(String, String)>,
}

/// One node of `zilla pool status`'s config tree.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VdevStatus {
    /// Leaf: its spec string; mirror: "mirror-N"; class headers are not nodes.
    pub name: String,
    /// "mirror", "file", "disk", "sim-hdd", "sim-ssd", ...
    pub kind: String,
    pub role: Role,
    /// ONLINE, DEGRADED, FAULTED, OFFLINE, UNAVAIL, REMOVED
    pub state: String,
    pub read_errors: u64,
    pub write_errors: u64,
    pub cksum_errors: u64,
    /// e.g. "(resilvering)" or "" 
    pub note: String,
    pub children: Vec<VdevStatus>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub guid: u64,
    pub state: String,
    /// `status:` and `action:` paragraphs, empty when healthy.
    pub status: String,
    pub action: String,
    /// `scan:` line, e.g. "scrub repaired 0B in 00:00:01 with 0 errors on <date>" or "none requested"
    pub scan: String,
    pub config: Vec<VdevStatus>,
    /// `errors:` line: "No known data errors" or "N data errors, use '-v' for a list"
    pub errors: String,
    /// -v: the affected block list
    pub error_list: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PoolListRow {
    pub name: String,
    pub size: u64,
    pub alloc: u64,
    pub free: u64,
    pub frag_percent: u64,
    pub cap_percent: u64,
    pub health: String,
    pub ashift: u8,
}

/// One vdev in an iostat snapshot (cumulative counters; the CLI takes differences).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IostatNode {
    pub name: String,
    pub role: Role,
    pub alloc: u64,
    pub free: u64,
    /// Sum over children for interior nodes.
    pub stats: LeafStats,
    pub children: Vec<IostatNode>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IostatSnapshot {
    pub pool: String,
    pub timestamp_ns: u64,
    pub alloc: u64,
    pub free: u64,
    pub stats: LeafStats,
    pub vdevs: Vec<IostatNode>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VolumeInfo {
    /// "pool/name"
    pub name: String,
    pub volsize: u64,
    pub volblocksize: u32,
    pub used: u64,
    pub readonly: bool,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ImportablePool {
    pub name: String,
    pub guid: u64,
    pub state: String,
    pub leaves: Vec<LeafSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubCmd {
    Start,
    Pause,
    Stop,
}

pub struct Pool {}

impl Pool {
    pub fn create(_name: &str, _tops: Vec<TopSpec>, _opts: CreateOptions) -> Result<Arc<Pool>> { todo!() }
    /// Scan files and block devices in `search` (directories are listed, files taken as
    /// they are) for pool labels.
    pub fn find_importable(_search: &[PathBuf]) -> Result<Vec<ImportablePool>> { todo!() }
    /// Import the pool named (or with guid) `name` found in `search`; None = the only one.
    pub fn import(_search: &[PathBuf], _name: Option<&str>) -> Result<Arc<Pool>> { todo!() }
    /// Import from an exact device list (the daemon's cache file).
    pub fn import_leaves(_leaves: &[LeafSpec]) -> Result<Arc<Pool>> { todo!() }
    /// Sync everything, write final labels, close devices. The pool is unusable after.
    pub fn export(&self) -> Result<()> { todo!() }
    /// Export and wipe the labels of every leaf.
    pub fn destroy(&self) -> Result<()> { todo!() }
    pub fn name(&self) -> String { todo!() }
    pub fn guid(&self) -> u64 { todo!() }
    /// Every leaf spec (for the daemon's cache file).
    pub fn leaf_specs(&self) -> Vec<LeafSpec> { todo!() }
    pub fn status(&self) -> PoolStatus { todo!() }
    pub fn list_row(&self) -> PoolListRow { todo!() }
    pub fn iostat(&self) -> IostatSnapshot { todo!() }
    pub fn scrub(&self, _cmd: ScrubCmd) -> Result<()> { todo!() }
    /// Block until the running scrub (if any) finishes.
    pub fn scrub_wait(&self) -> Result<()> { todo!() }
    pub fn add(&self, _tops: Vec<TopSpec>, _force: bool) -> Result<()> { todo!() }
    pub fn attach(&self, _existing: &str, _new: &LeafSpec, _force: bool) -> Result<()> { todo!() }
    pub fn detach(&self, _dev: &str) -> Result<()> { todo!() }
    pub fn offline(&self, _dev: &str) -> Result<()> { todo!() }
    pub fn online(&self, _dev: &str) -> Result<()> { todo!() }
    pub fn replace(&self, _old: &str, _new: &LeafSpec, _force: bool) -> Result<()> { todo!() }
    /// Reset error counters of one device or all.
    pub fn clear(&self, _dev: Option<&str>) -> Result<()> { todo!() }
    /// Pool properties: ashift, autoreplace, failmode, size, allocated, free, health, guid.
    pub fn get_pool_props(&self) -> Vec<PropRow> { todo!() }
    pub fn volume_create(&self, _name: &str, _volsize: u64, _volblocksize: u32, _sparse: bool, _props: &[(String, String)]) -> Result<()> { todo!() }
    pub fn volume_destroy(&self, _name: &str) -> Result<()> { todo!() }
    pub fn volumes(&self) -> Vec<VolumeInfo> { todo!() }
    /// `name` is the volume name inside this pool (no "pool/" prefix).
    pub fn open_volume(&self, _name: &str) -> Result<Arc<dyn BlockVolume>> { todo!() }
    /// Rows for `zilla get`; `props` empty = all.
    pub fn get_props(&self, _volume: &str, _props: &[String]) -> Result<Vec<PropRow>> { todo!() }
    pub fn set_prop(&self, _volume: &str, _prop: &str, _value: &str) -> Result<()> { todo!() }
    /// Wait until everything written so far is in a synced txg.
    pub fn sync(&self) -> Result<()> { todo!() }
}
