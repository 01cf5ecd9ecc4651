//! The admin API's request and response bodies (JSON over HTTP/1.1 on DIR/zilla.sock).
//!
//! The CLI is a thin client of these routes; docs/cli.md lists them. Responses reuse
//! the engine's serde types (`PoolStatus`, `PoolListRow`, ...), except iostat, whose
//! per-class counters are re-keyed by class name here ([`IostatEntry`]).
//! Errors are `{"error": "..."}` with a 4xx (the request is wrong) or 5xx (the engine
//! failed) status.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use zilla_core::spa::{IostatNode, IostatSnapshot, ScrubCmd, TopSpec};
use zilla_core::vdev::queue::LeafStats;
use zilla_core::vdev::{IoClass, LeafSpec, Role};

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


/// One pool in `/v1/status`: the engine's status, and for a pool in the cache file
/// that this daemon has not imported (state UNAVAIL), why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolStatusEntry {
    #[serde(flatten)]
    pub status: zilla_core::spa::PoolStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
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
    /// Import even if the pool's labels say it is in use elsewhere (`-f`).
    #[serde(default)]
    pub force: bool,
    /// If the newest txg cannot be read, rewind to the newest older one that can (`-F`).
    #[serde(default)]
    pub rewind: bool,
    /// Import even though a log vdev is missing, discarding its intent log (`-m`).
    #[serde(default)]
    pub missing_log: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ScrubReq {
    pub cmd: ScrubCmd,
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TrimReq {
    pub cmd: zilla_core::spa::trim::TrimCmd,
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct AddReq {
    pub tops: Vec<TopSpec>,
    #[serde(default)]
    pub force: bool,
    /// `add -n`: check and answer the layout the pool would have; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// The answer to an add: with `dry_run`, the config tree the pool would have.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct AddReply {
    #[serde(default)]
    pub would_be: Vec<zilla_core::spa::VdevStatus>,
}

/// `pool wait`: the activities to wait for (empty: all of them).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WaitReq {
    #[serde(default)]
    pub activities: Vec<zilla_core::spa::Activity>,
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
    /// attach, replace: answer once the resilver has finished (replace: and the old
    /// device is detached), not once it has started.
    #[serde(default)]
    pub wait: bool,
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

/// `zilla rename POOL/OLD POOL/NEW [-f]`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RenameReq {
    pub from: String,
    pub to: String,
    /// Disconnect attached clients first.
    #[serde(default)]
    pub force: bool,
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
    /// A mode switch's value names (value i is choices[i]); empty for a number.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// Where the value came from: default, config, persistent, cmdline, temporary.
    #[serde(default)]
    pub source: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TunableSet {
    pub name: String,
    pub value: u64,
    /// Also keep it across restarts (DIR/tunables.conf; `tunable set -p`).
    #[serde(default)]
    pub persistent: bool,
    /// `NAME=default`: the value a start without a persistent setting gives (`value`
    /// is ignored); with `persistent`, the persistent setting is removed.
    #[serde(default)]
    pub reset: bool,
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
    /// What the admin should know about this start, e.g. a cache file that could not
    /// be read and was moved aside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Empty {}

/// GET /v1/iostat: one pool's cumulative counters plus when the pool was imported
/// (wall-clock ns), so the first report can be an average since import.
///
/// Per-class statistics are maps keyed by class name (`"sync_read"`, `"sync_write"`,
/// `"async_read"`, `"async_write"`, `"scrub"`), never arrays by position: a client reads
/// the classes it knows by name, so a new or reordered `IoClass` cannot shift its numbers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IostatEntry {
    pub opened_ns: u64,
    pub pool: String,
    pub timestamp_ns: u64,
    pub alloc: u64,
    pub free: u64,
    /// Sum over the normal-class top-level vdevs.
    pub stats: IoStats,
    pub vdevs: Vec<IostatVdev>,
}

/// One txg of a pool's history: the columns of OpenZFS's /proc/spl/kstat/zfs/POOL/txgs
/// (`zilla txgs`). `birth` is the daemon's monotonic clock in ns; `state` O (open), Q
/// (quiescing), W (waiting for sync), S (syncing) or C (committed); `ndirty` the txg's
/// dirty bytes when its sync began; `nread`, `nwritten`, `reads`, `writes` what the
/// pool's leaves completed while it synced; `otime`, `qtime`, `wtime`, `stime` ns spent
/// open, quiescing, waiting for the sync thread and syncing (0 until the state ends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxgEntry {
    pub txg: u64,
    pub birth: u64,
    pub state: String,
    pub ndirty: u64,
    pub nread: u64,
    pub nwritten: u64,
    pub reads: u64,
    pub writes: u64,
    pub otime: u64,
    pub qtime: u64,
    pub wtime: u64,
    pub stime: u64,
}

impl TxgEntry {
    pub fn from_record(r: &zilla_core::txg::TxgRecord) -> TxgEntry {
        TxgEntry {
            txg: r.txg.get(),
            birth: r.birth_ns,
            state: r.state.letter().to_string(),
            ndirty: r.ndirty_bytes,
            nread: r.io.nread_bytes,
            nwritten: r.io.nwritten_bytes,
            reads: r.io.reads,
            writes: r.io.writes,
            otime: r.open_ns,
            qtime: r.quiesce_ns,
            wtime: r.wait_ns,
            stime: r.sync_ns,
        }
    }
}

/// One vdev in an iostat entry; interior nodes (mirrors) carry the sum of their children.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IostatVdev {
    pub name: String,
    pub role: Role,
    pub alloc: u64,
    pub free: u64,
    pub stats: IoStats,
    pub children: Vec<IostatVdev>,
}

/// Whether an I/O class moves data from the device (read) or to it (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoDirection {
    #[default]
    Read,
    Write,
}

/// One I/O class's counters on one vdev (cumulative since import, except queued/active).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ClassIoStats {
    pub direction: IoDirection,
    pub ops: u64,
    pub bytes: u64,
    /// I/Os the device failed (not counted in ops/bytes).
    pub errors: u64,
    /// Waiting in the leaf queue right now.
    pub queued: u32,
    /// Issued to the device right now.
    pub active: u32,
    /// Queue + device latency, log2 buckets of ns (zpool iostat -w).
    pub total_latency_hist: Vec<u64>,
    /// Device service time, log2 buckets of ns.
    pub disk_latency_hist: Vec<u64>,
}

/// A vdev's statistics: one record per I/O class, keyed by class name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct IoStats {
    pub classes: BTreeMap<String, ClassIoStats>,
    pub flushes: u64,
    /// Flush latency, log2 buckets of ns.
    pub flush_latency_hist: Vec<u64>,
}

static NO_CLASS_STATS: ClassIoStats = ClassIoStats {
    direction: IoDirection::Read,
    ops: 0,
    bytes: 0,
    errors: 0,
    queued: 0,
    active: 0,
    total_latency_hist: Vec::new(),
    disk_latency_hist: Vec::new(),
};

impl IoStats {
    /// The engine's per-leaf snapshot, re-keyed by class name.
    pub fn from_leaf(s: &LeafStats) -> IoStats {
        let hist = |h: &[Vec<u64>], c: IoClass| h.get(c as usize).cloned().unwrap_or_default();
        let classes = IoClass::ALL
            .iter()
            .map(|&c| {
                let i = c as usize;
                let direction = if c.is_read() { IoDirection::Read } else { IoDirection::Write };
                let cs = ClassIoStats {
                    direction,
                    ops: s.ops[i],
                    bytes: s.bytes[i],
                    errors: s.errors[i],
                    queued: s.queued[i],
                    active: s.active[i],
                    total_latency_hist: hist(&s.total_latency_hist, c),
                    disk_latency_hist: hist(&s.disk_latency_hist, c),
                };
                (c.name().to_string(), cs)
            })
            .collect();
        IoStats { classes, flushes: s.flushes, flush_latency_hist: s.flush_latency_hist.clone() }
    }

    /// One class's counters (all zero if the daemon did not report that class).
    pub fn class(&self, c: IoClass) -> &ClassIoStats {
        self.classes.get(c.name()).unwrap_or(&NO_CLASS_STATS)
    }
}

impl IostatVdev {
    fn from_node(n: &IostatNode) -> IostatVdev {
        IostatVdev {
            name: n.name.clone(),
            role: n.role,
            alloc: n.alloc,
            free: n.free,
            stats: IoStats::from_leaf(&n.stats),
            children: n.children.iter().map(IostatVdev::from_node).collect(),
        }
    }
}

impl IostatEntry {
    pub fn new(opened_ns: u64, s: &IostatSnapshot) -> IostatEntry {
        IostatEntry {
            opened_ns,
            pool: s.pool.clone(),
            timestamp_ns: s.timestamp_ns,
            alloc: s.alloc,
            free: s.free,
            stats: IoStats::from_leaf(&s.stats),
            vdevs: s.vdevs.iter().map(IostatVdev::from_node).collect(),
        }
    }
}

/// `POST /v1/iscsi/auth`: change the authentication of one target (or the default
/// entry). Secrets travel only in requests, never in answers.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct IscsiAuthRequest {
    /// A target name, or POOL/NAME of its volume; `None`: the default entry.
    #[serde(default)]
    pub target: Option<String>,
    /// Remove the entry's settings first (alone: remove them all).
    #[serde(default)]
    pub clear: bool,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    pub mutual_user: Option<String>,
    #[serde(default)]
    pub mutual_secret: Option<String>,
    /// `Some`: the new list of allowed initiators (replacing the old one).
    #[serde(default)]
    pub initiators: Option<Vec<String>>,
}

/// One entry of the iSCSI authentication settings, without its secrets.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IscsiAuthView {
    /// The target name, or "default".
    pub target: String,
    /// "none", "chap" or "mutual".
    pub auth: String,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub mutual_user: Option<String>,
    /// Allowed initiators; empty: any.
    #[serde(default)]
    pub initiators: Vec<String>,
    /// The target has settings of its own (else the default entry applies to it).
    #[serde(default)]
    pub own_entry: bool,
}

/// One target in `GET /v1/iscsi`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IscsiTargetRow {
    pub iqn: String,
    pub volume: String,
    pub shared: bool,
    pub auth: String,
    pub own_entry: bool,
    /// Allowed initiators (0: any).
    pub initiators: usize,
}

/// One live session in `GET /v1/iscsi`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IscsiSessionRow {
    pub initiator: String,
    pub isid: String,
    pub tsih: u16,
    pub peer: String,
    pub target: String,
    pub discovery: bool,
    pub auth: String,
    /// The initiator's MaxRecvDataSegmentLength (largest data segment we send).
    pub max_recv_data_segment_length: usize,
    /// Ours (largest data segment we receive).
    pub target_max_recv_data_segment_length: usize,
    pub max_burst_length: usize,
    pub first_burst_length: usize,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub header_digest: bool,
    pub data_digest: bool,
    pub started_unix_s: u64,
}

/// `GET /v1/iscsi`: the targets with their authentication, the default entry, the
/// per-target entries and the live sessions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IscsiListing {
    pub default: IscsiAuthView,
    pub entries: Vec<IscsiAuthView>,
    pub targets: Vec<IscsiTargetRow>,
    pub sessions: Vec<IscsiSessionRow>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_with(class: IoClass, ops: u64, bytes: u64) -> LeafStats {
        let mut s = LeafStats::default();
        s.ops[class as usize] = ops;
        s.bytes[class as usize] = bytes;
        s.errors[class as usize] = 1;
        s
    }

    #[test]
    fn iostat_classes_are_keyed_by_name() {
        let st = IoStats::from_leaf(&leaf_with(IoClass::Scrub, 3, 49152));
        let v = serde_json::to_value(&st).unwrap();
        let classes = v["classes"].as_object().unwrap();
        let names: Vec<&str> = classes.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["async_read", "async_write", "scrub", "sync_read", "sync_write", "trim"]);
        assert_eq!(v["classes"]["scrub"]["ops"], 3);
        assert_eq!(v["classes"]["scrub"]["bytes"], 49152);
        assert_eq!(v["classes"]["scrub"]["errors"], 1);
        assert_eq!(v["classes"]["scrub"]["direction"], "read");
        assert_eq!(v["classes"]["async_write"]["direction"], "write");
        assert_eq!(v["classes"]["sync_read"]["ops"], 0);
    }

    #[test]
    fn iostat_reader_ignores_unknown_classes_and_defaults_missing_ones() {
        let json = r#"{"classes": {"trim": {"direction": "write", "ops": 9},
                                   "sync_write": {"direction": "write", "ops": 7, "bytes": 4096}},
                       "flushes": 2}"#;
        let st: IoStats = serde_json::from_str(json).unwrap();
        assert_eq!(st.class(IoClass::SyncWrite).ops, 7);
        assert_eq!(st.class(IoClass::SyncWrite).bytes, 4096);
        assert_eq!(st.class(IoClass::SyncRead).ops, 0);
        assert_eq!(st.class(IoClass::Scrub).bytes, 0);
        assert_eq!(st.flushes, 2);
    }
}

/// One row of GET /v1/clients: a front-end client (protocol + peer host) and its
/// counters since it entered the bounded table. The front ends' own snapshot type, so
/// the row and the counters cannot drift apart.
pub use zilla_frontend::ClientIoSnapshot as ClientRow;
