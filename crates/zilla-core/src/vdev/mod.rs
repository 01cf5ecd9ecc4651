//! vdev: virtual devices.
//!
//! Theory of operation
//! -------------------
//! A *leaf* is one storage device seen through the narrow [`Device`] trait: read, write,
//! flush, size, rotational. Everything the engine knows about hardware goes through this
//! seam, so tests can put a crash-simulating ([`fault::CrashDevice`]), fault-injecting
//! ([`fault::FaultDevice`]) or latency-modelled ([`sim::SimDevice`]) device under any leaf.
//!
//! Every leaf I/O is a request value ([`queue::IoRequest`]: class, operation, offset, an
//! owned [`abd::AlignedBuf`], a completion) queued on the leaf's [`queue::LeafQueue`], per
//! OpenZFS class ([`IoClass`]). The queue issues requests up to each class's max_active
//! through the leaf's device engine (worker threads, or io_uring) and completes each with
//! a typed result ([`IoError`] keeps device, offset, operation and kind). It also keeps
//! the per-leaf statistics (operations, bytes, latency histograms per class).
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

pub mod abd;
pub mod fault;
pub mod file;
pub mod inuse;
pub mod label;
pub mod mirror;
pub mod queue;
pub mod sim;
pub mod trim;

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
    /// Write `bufs` back to back from `offset` as one write (a vectored write: one
    /// device command, torn or dropped as one by a power cut). Default: the buffers
    /// copied into one and a single `write_at`; a file overrides it with pwritev, a
    /// model with one modelled command.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        match bufs {
            [] => Ok(()),
            [one] => self.write_at(one, offset),
            _ => self.write_at(&bufs.concat(), offset),
        }
    }
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
    /// What the device is, shown in `pool status` ("file", "disk", "sim-hdd", ...).
    fn kind(&self) -> DeviceKind;
    /// The file descriptor and alignment rules under this device, when its reads, writes
    /// and flushes are exactly pread/pwrite/fdatasync on that descriptor (the io_uring
    /// engine then issues them itself). None for modelled and test devices.
    fn raw_target(&self) -> Option<RawTarget> {
        None
    }
    /// What this device *is*, independent of the path that named it (a symlink, a second
    /// path to the same file): the engine compares leaves by this. None for test devices.
    fn identity(&self) -> Option<DeviceIdentity> {
        None
    }
    /// Give up this pool's claim on the device (flock / O_EXCL) at export, destroy,
    /// detach or a simulated crash; I/O threads may still hold the device afterwards.
    fn release(&self) {}
    /// Write zeros into the holes of `[start, end)` (a sparse file's), making them
    /// durable; bytes written. Nothing where there are no holes, or where the backing
    /// file system has less than `min_free_bytes` free. Default: nothing.
    fn fill_holes(&self, _start: u64, _end: u64, _min_free_bytes: u64) -> io::Result<u64> {
        Ok(0)
    }
}

/// A device's identity: block devices by their device number (st_rdev), regular files
/// by (st_dev, st_ino). Two leaves with equal identities are the same storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceIdentity {
    Block { rdev: u64 },
    File { dev: u64, ino: u64 },
}

impl DeviceIdentity {
    /// From a stat result (the target's, symlinks followed).
    pub fn from_metadata(md: &std::fs::Metadata) -> DeviceIdentity {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if md.file_type().is_block_device() {
            DeviceIdentity::Block { rdev: md.rdev() }
        } else {
            DeviceIdentity::File { dev: md.dev(), ino: md.ino() }
        }
    }

    /// The identity of what `path` names now (None when it cannot be stat'ed).
    pub fn of_path(path: &std::path::Path) -> Option<DeviceIdentity> {
        std::fs::metadata(path).ok().map(|md| DeviceIdentity::from_metadata(&md))
    }
}

/// A device the io_uring engine can drive directly (see [`Device::raw_target`]).
#[derive(Debug, Clone, Copy)]
pub struct RawTarget {
    pub fd: std::os::fd::RawFd,
    /// Buffer address alignment the descriptor needs (1 when buffered).
    pub mem_align: usize,
    /// Offset and length alignment the descriptor needs (1 when buffered).
    pub offset_align: usize,
    pub size_bytes: u64,
}

/// What a failed I/O failed with. Kept apart because callers act differently: a
/// checksum error means another copy may be good (and this one is repaired); an I/O
/// error counts toward faulting the device; corruption is a decoded structure that
/// makes no sense (SCSI: MEDIUM ERROR for checksum/corrupt, HARDWARE ERROR for I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoErrorKind {
    /// The device refused or failed the operation (errno in [`IoError::errno`]).
    Io,
    /// The bytes arrived but do not match the block pointer's checksum.
    Checksum,
    /// The bytes arrived but decode to nonsense (sizes, magic).
    Corrupt,
}

/// Operation of a leaf request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoOp {
    Read,
    Write,
    Flush,
    Discard,
}

impl IoOp {
    pub fn name(self) -> &'static str {
        match self {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Flush => "flush",
            IoOp::Discard => "discard",
        }
    }
}

/// The error value a leaf request completes with: which device, which operation at
/// which offset and length, what kind of failure, and the OS error if there was one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoError {
    pub device: Arc<str>,
    pub op: IoOp,
    pub offset: u64,
    pub len: u64,
    pub kind: IoErrorKind,
    pub errno: Option<i32>,
    pub detail: String,
}

impl IoError {
    /// An OS-level failure of `op` on `device`.
    pub fn from_io(device: &Arc<str>, op: IoOp, offset: u64, len: u64, e: &io::Error) -> IoError {
        IoError { device: device.clone(), op, offset, len, kind: IoErrorKind::Io, errno: e.raw_os_error(), detail: e.to_string() }
    }
    /// A copy that failed verification.
    pub fn checksum(device: &Arc<str>, offset: u64, len: u64) -> IoError {
        IoError { device: device.clone(), op: IoOp::Read, offset, len, kind: IoErrorKind::Checksum, errno: None, detail: "checksum mismatch".into() }
    }
    /// The device is gone (ENXIO): it is faulted at once, not after repeated errors.
    pub fn is_gone(&self) -> bool {
        self.errno == Some(libc::ENXIO)
    }
    /// The `io::Error` for callers that speak std: kind InvalidData for checksum and
    /// corruption, the errno's kind otherwise; the message keeps device and offset.
    pub fn to_io(&self) -> io::Error {
        let kind = match (self.kind, self.errno) {
            (IoErrorKind::Checksum | IoErrorKind::Corrupt, _) => io::ErrorKind::InvalidData,
            (IoErrorKind::Io, Some(e)) => io::Error::from_raw_os_error(e).kind(),
            (IoErrorKind::Io, None) => io::ErrorKind::Other,
        };
        io::Error::new(kind, self.to_string())
    }
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} of {} bytes at offset {:#x}: {}", self.device, self.op.name(), self.len, self.offset, self.detail)
    }
}

impl std::error::Error for IoError {}

impl From<IoError> for io::Error {
    fn from(e: IoError) -> io::Error {
        e.to_io()
    }
}

/// OpenZFS I/O classes (vdev_queue.c), in priority order (OpenZFS's removal,
/// initializing and rebuild classes have no Zilla counterpart; trim keeps its place
/// after them as the lowest priority).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum IoClass {
    SyncRead = 0,
    SyncWrite = 1,
    AsyncRead = 2,
    AsyncWrite = 3,
    Scrub = 4,
    /// Discards of freed space (OpenZFS ZIO_PRIORITY_TRIM): FIFO, never aggregated.
    Trim = 5,
}

impl IoClass {
    pub const ALL: [IoClass; 6] =
        [IoClass::SyncRead, IoClass::SyncWrite, IoClass::AsyncRead, IoClass::AsyncWrite, IoClass::Scrub, IoClass::Trim];
    pub fn name(self) -> &'static str {
        match self {
            IoClass::SyncRead => "sync_read",
            IoClass::SyncWrite => "sync_write",
            IoClass::AsyncRead => "async_read",
            IoClass::AsyncWrite => "async_write",
            IoClass::Scrub => "scrub",
            IoClass::Trim => "trim",
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

/// What a leaf device is (`Device::kind`), as `pool status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A regular file.
    File,
    /// A block device.
    Disk,
    /// A file behind the latency model of a hard disk (`sim-hdd:`).
    SimHdd,
    /// A file behind the latency model of an SSD (`sim-ssd:`).
    SimSsd,
    /// In memory (tests).
    Memory,
    /// A leaf the config names that import could not open.
    Missing,
    /// A test or fault-injection device, by its own name.
    Test(&'static str),
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::File => "file",
            DeviceKind::Disk => "disk",
            DeviceKind::SimHdd => "sim-hdd",
            DeviceKind::SimSsd => "sim-ssd",
            DeviceKind::Memory => "mem",
            DeviceKind::Missing => "missing",
            DeviceKind::Test(name) => name,
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for DeviceKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The latency model a leaf spec asks for (`sim-hdd:PATH`, `sim-ssd:PATH`). Stored in
/// the label config as "sim-hdd" / "sim-ssd".
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LeafModel {
    #[serde(rename = "sim-hdd")]
    SimHdd,
    #[serde(rename = "sim-ssd")]
    SimSsd,
}

impl LeafModel {
    pub fn as_str(self) -> &'static str {
        match self {
            LeafModel::SimHdd => "sim-hdd",
            LeafModel::SimSsd => "sim-ssd",
        }
    }
}

/// A parsed leaf spec: the backing path plus the optional latency model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeafSpec {
    pub path: PathBuf,
    /// None for the device as it is.
    pub model: Option<LeafModel>,
}

impl LeafSpec {
    pub fn parse(spec: &str) -> crate::Result<LeafSpec> {
        let (model, path) = if let Some(p) = spec.strip_prefix("sim-hdd:") {
            (Some(LeafModel::SimHdd), p)
        } else if let Some(p) = spec.strip_prefix("sim-ssd:") {
            (Some(LeafModel::SimSsd), p)
        } else {
            (None, spec)
        };
        if path.is_empty() {
            return Err(crate::Error::invalid(format!("'{spec}': empty device path")));
        }
        Ok(LeafSpec { path: PathBuf::from(path), model })
    }
    pub fn display(&self) -> String {
        match self.model {
            Some(m) => format!("{}:{}", m.as_str(), self.path.display()),
            None => self.path.display().to_string(),
        }
    }
    /// [`LeafSpec::display`] safe to print in a log line or a message: a path may come
    /// from a device directory anyone could write a file name into (see
    /// [`crate::types::printable`]).
    pub fn shown(&self) -> String {
        crate::types::printable(&self.display())
    }
}

/// Open a leaf device from its spec. `role` picks the sim-ssd profile (log or cache).
pub fn open_leaf(spec: &LeafSpec, role: Role) -> crate::Result<Arc<dyn Device>> {
    let base = file::FileDevice::open(&spec.path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => crate::Error::NotFound(format!("device {}", spec.path.display())),
        io::ErrorKind::WouldBlock | io::ErrorKind::ResourceBusy => crate::Error::Busy(format!(
            "{} is in use by another pool or process (it is locked: {e}); export the pool that holds it",
            spec.path.display()
        )),
        _ => crate::Error::Io(io::Error::new(e.kind(), format!("{}: {e}", spec.path.display()))),
    })?;
    let base: Arc<dyn Device> = Arc::new(base);
    Ok(match spec.model {
        None => base,
        Some(LeafModel::SimHdd) => Arc::new(sim::SimDevice::new(base, sim::SimProfile::hdd_from_tunables())),
        Some(LeafModel::SimSsd) => {
            let profile = if role == Role::Log {
                sim::SimProfile::log_ssd_from_tunables()
            } else {
                sim::SimProfile::cache_ssd_from_tunables()
            };
            Arc::new(sim::SimDevice::new(base, profile))
        }
    })
}

/// The embedded log region's share of a normal vdev: 1/2^EMBEDDED_LOG_SHIFT of it.
pub const EMBEDDED_LOG_SHIFT: u32 = 4;
/// The region's largest size (bytes), per vdev.
pub const EMBEDDED_LOG_MAX_BYTES: u64 = 512 << 20;
/// The region's granularity and smallest size (bytes): a vdev under 4 MiB has none.
pub const EMBEDDED_LOG_UNIT_BYTES: u64 = 256 << 10;

/// Bytes at the start of a normal vdev of `size` bytes kept for intent-log blocks (see
/// the `metaslab` module comment). A function of the size alone, monotone in it, so every import
/// finds the same region and a leaf at least as large as its vdev covers it.
pub fn embedded_log_bytes(size: u64) -> u64 {
    let r = (size >> EMBEDDED_LOG_SHIFT).min(EMBEDDED_LOG_MAX_BYTES);
    r / EMBEDDED_LOG_UNIT_BYTES * EMBEDDED_LOG_UNIT_BYTES
}

/// Whether a plain-file leaf the pool takes has the holes of its embedded log region
/// filled ([`fill_log_region`]).
pub static ZILLA_LOG_REGION_FILL: Tunable = Tunable::new(
    "zilla_log_region_fill",
    1,
    0,
    1,
    Applies::Live,
    "1: a leaf that is a sparse file gets the holes of its embedded log region (1/16 of it, at most 512 MiB) written with zeros when a pool takes it (create, add, attach, import), so intent-log writes there wait for no host file system allocation",
);

/// Fill the holes of a plain-file leaf's embedded log region (see `metaslab`; devices
/// other than plain files have none, [`Device::fill_holes`]): the region as the leaf's
/// own size gives it, which covers its top-level vdev's (a vdev is no larger than its
/// smallest leaf, and the region grows with the size).
///
/// Only before anything of the pool writes to the leaf, and only once the pool is
/// known to be this process's (a new leaf that passed the in-use checks; an import
/// past its multihost check; never a dry run): a write between the hole's SEEK_HOLE
/// and the zeros would be overwritten. Best effort: it is skipped where the host file
/// system has less than four times the region free (the room is the data's), and a
/// failure leaves the rest sparse; the log works there as anywhere, only slower.
pub fn fill_log_region(dev: &dyn Device, name: &str) {
    if ZILLA_LOG_REGION_FILL.get() != 1 {
        return;
    }
    let size = label::usable_end(dev.size()).saturating_sub(label::DATA_START);
    let region = embedded_log_bytes(size);
    if region == 0 {
        return;
    }
    // real time, whatever the pool's Env: the host file system's work, told to the admin
    let os = crate::env::real();
    let started_ns = os.now_ns();
    match dev.fill_holes(label::DATA_START, label::DATA_START + region, region.saturating_mul(4)) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            "{name}: wrote {} MiB of zeros over the holes of its log region in {} ms (so intent-log writes find allocated blocks)",
            n >> 20,
            os.now_ns().saturating_sub(started_ns) / 1_000_000
        ),
        Err(e) => tracing::warn!("{name}: filling its log region failed, leaving it sparse: {e}"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_path_is_shown_with_its_control_and_format_characters_escaped() {
        let spec = LeafSpec::parse("sim-hdd:/dev/disk\n2026-11-28 INFO pool imported\u{202e}").unwrap();
        assert_eq!(spec.display(), "sim-hdd:/dev/disk\n2026-11-28 INFO pool imported\u{202e}");
        assert_eq!(spec.shown(), "sim-hdd:/dev/disk\\n2026-11-28 INFO pool imported\\u{202e}");
        assert_eq!(LeafSpec::parse("/dev/plain").unwrap().shown(), "/dev/plain");
    }
}
