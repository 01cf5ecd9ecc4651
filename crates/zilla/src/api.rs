//! The admin API's request and response bodies (JSON over HTTP/1.1 on DIR/zilla.sock).
//!
//! The CLI is a thin client of these routes; docs/cli.md lists them. Responses reuse
//! the engine's serde types (`PoolStatus`, `PoolListRow`, `IostatSnapshot`, ...).
//! Errors are `{"error": "..."}` with a 4xx (the request is wrong) or 5xx (the engine
//! failed) status.

use serde::{Deserialize, Serialize};
use zilla_core::spa::{ScrubCmd, TopSpec};
use zilla_core::vdev::LeafSpec;

#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CreatePool {
    pub name: String,
    /// Parsed on the client so relative paths are resolved against the caller's cwd.
    pub tops: Vec<TopSpec>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub props: Vec<(String, String)>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ImportReq {
    /// Directories or device paths to search; empty = the default (/dev/disk/by-id style
    /// search is not done: give -d).
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Pool name or guid; None = list (for /importable) or the only one (for /import).
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ScrubReq {
    pub cmd: ScrubCmd,
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct AddReq {
    pub tops: Vec<TopSpec>,
    #[serde(default)]
    pub force: bool,
}

/// attach (device + new), replace (device + optional new), detach/offline/online
/// (device), clear (optional device).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DeviceReq {
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub new: Option<LeafSpec>,
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CreateVolume {
    /// "pool/name"
    pub name: String,
    pub volsize: u64,
    pub volblocksize: u32,
    #[serde(default)]
    pub sparse: bool,
    #[serde(default)]
    pub props: Vec<(String, String)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct GetReq {
    /// "pool/name" (volume properties) or "pool" (pool properties).
    pub name: String,
    /// Empty = all.
    #[serde(default)]
    pub props: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SetReq {
    pub name: String,
    pub property: String,
    pub value: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TunableRow {
    pub name: String,
    pub value: u64,
    pub default: u64,
    /// Accepted range (inclusive); 0 is also accepted when `zero_is_auto`.
    #[serde(default)]
    pub min: u64,
    #[serde(default)]
    pub max: u64,
    #[serde(default)]
    pub zero_is_auto: bool,
    /// When a change takes effect: "live", "next device open", "next pool open".
    #[serde(default)]
    pub applies: String,
    pub description: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TunableSet {
    pub name: String,
    pub value: u64,
}

/// GET /v1/info: what this daemon serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonInfo {
    pub version: String,
    pub pid: u32,
    pub state_dir: String,
    pub nbd_tcp: Option<String>,
    pub nbd_unix: Option<String>,
    pub iscsi: Option<String>,
    pub http: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Empty {}

/// GET /v1/iostat: the engine's cumulative snapshot plus when the pool was imported
/// (wall-clock ns), so the first report can be an average since import.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IostatEntry {
    pub opened_ns: u64,
    #[serde(flatten)]
    pub snapshot: zilla_core::spa::IostatSnapshot,
}
