//! vdev: virtual devices.
//!
//! Theory of operation
//! -------------------
//! A *leaf* is one storage device seen through the narrow [`Device`] trait: read, write,
//! flush, size, rotational. Everything the engine knows about hardware goes through this
//! seam, so tests can put a crash-simulating ([`fault::CrashDevice`]), fault-injecting
//! ([`fault::FaultDevice`]) or latency-modelled ([`sim::SimDevice`]) device under any leaf.
//!
//! Every leaf I/O passes through the leaf's [`queue::LeafQueue`], tagged with its OpenZFS
//! class ([`IoClass`]). The queue admits I/Os per class up to the class's max_active and
//! keeps the per-leaf statistics (operations, bytes, latency histograms per class).
//!
//! A *top-level vdev* is a single leaf or an N-way mirror ([`mirror`]). Data is striped
//! across top-level vdevs by the allocator (metaslab). Every leaf carries four labels
//! ([`label`]) with the pool config and the uberblock ring.
//!
//! ```text
//!   pool root ── top 0: mirror ─┬─ leaf (queue ─ Device)
//!             │                 └─ leaf (queue ─ Device)
//!             ├─ top 1: mirror ── ...
//!             ├─ log:   mirror ── ...        (allocation class "log", ZIL only)
//!             └─ cache: leaf ...             (L2ARC, not part of the block tree)
//! ```
//!
//! Leaf spec strings (CLI): `PATH` (file or block device), `sim-hdd:PATH`,
//! `sim-ssd:PATH` (profile chosen by role: log SSD for `log`, read SSD otherwise).

pub mod fault;
pub mod file;
pub mod label;
pub mod mirror;
pub mod queue;
pub mod sim;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::kstat::{Applies, Tunable};

/// The narrow device seam. Offsets and lengths passed by the engine are multiples of
/// 512 (and of 1<<ashift for data); implementations must accept any buffer alignment
/// (bounce internally for O_DIRECT). All methods may be called from many threads.
pub trait Device: Send + Sync + 'static {
    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`. Not durable until `flush` returns.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Make every write that completed before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Usable size in bytes.
    fn size(&self) -> u64;
    /// Spinning media (affects mirror read selection and aggregation).
    fn rotational(&self) -> bool;
    /// Logical sector size in bytes (ashift is derived from max(logical, physical)).
    fn logical_sector_size(&self) -> u32 {
        512
    }
    fn physical_sector_size(&self) -> u32 {
        4096
    }
    /// Advisory discard (hole punch). Default: nothing.
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Short kind name shown in `pool status`: "file", "disk", "sim-hdd", "sim-ssd", ...
    fn kind(&self) -> String;
}

/// OpenZFS I/O classes (vdev_queue.c), in priority order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum IoClass {
    SyncRead = 0,
    SyncWrite = 1,
    AsyncRead = 2,
    AsyncWrite = 3,
    Scrub = 4,
}

impl IoClass {
    pub const ALL: [IoClass; 5] =
        [IoClass::SyncRead, IoClass::SyncWrite, IoClass::AsyncRead, IoClass::AsyncWrite, IoClass::Scrub];
    pub fn name(self) -> &'static str {
        match self {
            IoClass::SyncRead => "sync_read",
            IoClass::SyncWrite => "sync_write",
            IoClass::AsyncRead => "async_read",
            IoClass::AsyncWrite => "async_write",
            IoClass::Scrub => "scrub",
        }
    }
    pub fn is_read(self) -> bool {
        matches!(self, IoClass::SyncRead | IoClass::AsyncRead | IoClass::Scrub)
    }
}

/// Where a device sits in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Normal,
    Log,
    Cache,
    Spare,
}

/// A parsed leaf spec: the backing path plus the optional latency model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeafSpec {
    pub path: PathBuf,
    /// None, "sim-hdd" or "sim-ssd".
    pub model: Option<String>,
}

impl LeafSpec {
    pub fn parse(spec: &str) -> crate::Result<LeafSpec> {
        let (model, path) = if let Some(p) = spec.strip_prefix("sim-hdd:") {
            (Some("sim-hdd".to_string()), p)
        } else if let Some(p) = spec.strip_prefix("sim-ssd:") {
            (Some("sim-ssd".to_string()), p)
        } else {
            (None, spec)
        };
        if path.is_empty() {
            return Err(crate::Error::invalid(format!("'{spec}': empty device path")));
        }
        Ok(LeafSpec { path: PathBuf::from(path), model })
    }
    pub fn display(&self) -> String {
        match &self.model {
            Some(m) => format!("{m}:{}", self.path.display()),
            None => self.path.display().to_string(),
        }
    }
}

/// Open a leaf device from its spec. `role` picks the sim-ssd profile (log or cache).
pub fn open_leaf(spec: &LeafSpec, role: Role) -> crate::Result<Arc<dyn Device>> {
    let base = file::FileDevice::open(&spec.path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => crate::Error::NotFound(format!("device {}", spec.path.display())),
        _ => crate::Error::Io(io::Error::new(e.kind(), format!("{}: {e}", spec.path.display()))),
    })?;
    let base: Arc<dyn Device> = Arc::new(base);
    Ok(match spec.model.as_deref() {
        None => base,
        Some("sim-hdd") => Arc::new(sim::SimDevice::new(base, sim::SimProfile::hdd_from_tunables())),
        Some("sim-ssd") => {
            let profile = if role == Role::Log {
                sim::SimProfile::log_ssd_from_tunables()
            } else {
                sim::SimProfile::cache_ssd_from_tunables()
            };
            Arc::new(sim::SimDevice::new(base, profile))
        }
        Some(other) => return Err(crate::Error::invalid(format!("unknown device model '{other}'"))),
    })
}

/// Mirror read-selection tunables (vdev_mirror.c defaults).
pub static ZFS_VDEV_MIRROR_ROTATING_INC: Tunable =
    Tunable::new("zfs_vdev_mirror_rotating_inc", 0, 0, 1000, Applies::Live, "load added for a sequential read on a rotating child (vdev_mirror.c)");
pub static ZFS_VDEV_MIRROR_ROTATING_SEEK_INC: Tunable =
    Tunable::new("zfs_vdev_mirror_rotating_seek_inc", 5, 0, 1000, Applies::Live, "load added for a seeking read on a rotating child (vdev_mirror.c)");
pub static ZFS_VDEV_MIRROR_ROTATING_SEEK_OFFSET: Tunable =
    Tunable::new("zfs_vdev_mirror_rotating_seek_offset", 1 << 20, 0, 1 << 40, Applies::Live, "distance within which a rotating read counts as a short seek (vdev_mirror.c)");
pub static ZFS_VDEV_MIRROR_NON_ROTATING_INC: Tunable =
    Tunable::new("zfs_vdev_mirror_non_rotating_inc", 0, 0, 1000, Applies::Live, "load added for a sequential read on a non-rotating child (vdev_mirror.c)");
pub static ZFS_VDEV_MIRROR_NON_ROTATING_SEEK_INC: Tunable =
    Tunable::new("zfs_vdev_mirror_non_rotating_seek_inc", 1, 0, 1000, Applies::Live, "load added for a seeking read on a non-rotating child (vdev_mirror.c)");
