//! Leaf devices backed by a regular file or a block device.
//!
//! Theory of operation
//! -------------------
//! A [`FileDevice`] is one open file descriptor used with positional I/O (`pread` /
//! `pwrite`), so any number of threads may use it at once without a lock.
//!
//! Opening probes for O_DIRECT: the file is opened O_RDWR|O_DIRECT and one aligned 4 KiB
//! read is tried; if either step fails with EINVAL (tmpfs on older kernels, some FUSE
//! and network file systems) the file is reopened buffered. [`FileDevice::is_direct`]
//! tells which. With O_DIRECT the page cache is out of the way, so the engine's own
//! caches (ARC, L2ARC) and the latency models see the device itself.
//!
//! O_DIRECT needs the buffer address aligned to `dio_mem_align` and offset and length
//! to `dio_offset_align` (statx STATX_DIOALIGN, Linux 6.1+; 4096 when unknown, which is
//! always safe). Misaligned requests are bounced through an aligned buffer:
//!
//! ```text
//!   aligned buf + aligned offset/len  -> pread/pwrite directly
//!   misaligned buffer address only    -> copy through an aligned bounce buffer
//!   misaligned offset or length       -> reads: read the covering aligned range;
//!                                        writes: read-modify-write of the covering
//!                                        range, under a range lock
//! ```
//!
//! The engine issues 512-byte multiples aligned to the pool's ashift, so the
//! read-modify-write path only runs when the device's alignment is larger than a request
//! (an odd caller, or a 4Kn disk under 512-byte labels). Every write holds a range lock
//! over the bytes it rewrites (the covering sectors for a read-modify-write), so a
//! read-modify-write never races an aligned write to a neighbouring block in the same
//! sector: one of them waits. (io_uring submits only aligned writes itself and routes
//! the rest here; an aligned write never touches bytes of another block's covering
//! sectors unless the two writes overlap, which the allocator never issues.)
//!
//! Ownership: [`FileDevice::open`] takes the leaf for a pool with a second descriptor,
//! the *claim*: a regular file gets `flock(LOCK_EX|LOCK_NB)` on it, a block device is
//! opened `O_EXCL` (the kernel's claim, which also fails while the device is mounted); a
//! second opener, in this process or another, fails with `WouldBlock`/`ResourceBusy`.
//! The claim is its own descriptor so export can drop it ([`Device::release`]) at once,
//! while I/O threads that still hold the device wind down. [`FileDevice::open_shared`] opens read-only and
//! unlocked, for reading labels (import scans, device checks).
//!
//! Geometry: regular files report their length (rounded down to 512), not rotational,
//! 512/4096-byte logical/physical sectors. Block devices (loop devices included) report
//! lseek(SEEK_END), BLKSSZGET/BLKPBSZGET, and /sys/dev/block/M:m/queue/rotational.
//! flush is fdatasync; discard is fallocate(PUNCH_HOLE|KEEP_SIZE), ignored where
//! unsupported (discard is advisory).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use parking_lot::{Condvar, Mutex};

use super::abd::AlignedBuf;
#[allow(unused_imports)]
use super::{Device, DeviceKind};
use rustix::fs::{AtFlags, FallocateFlags, SeekFrom, StatxFlags};

/// Alignment assumed for O_DIRECT when statx cannot tell (safe for every device).
const DIO_ALIGN_DEFAULT: usize = 4096;
const PROBE_BYTES: usize = 4096;
const SECTOR_BYTES: u64 = 512;

/// A leaf backed by a regular file or block device.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    /// Opened with O_DIRECT (the probe succeeded).
    direct: bool,
    is_block: bool,
    size_bytes: u64,
    /// Required buffer address alignment for O_DIRECT (1 when buffered).
    mem_align: usize,
    /// Required offset/length alignment for O_DIRECT (1 when buffered).
    offset_align: usize,
    rotational: bool,
    logical_sector_bytes: u32,
    physical_sector_bytes: u32,
    /// Byte ranges being written; a read-modify-write waits for overlapping writes.
    write_ranges: RangeLock,
    identity: super::DeviceIdentity,
    /// The descriptor that holds the leaf (flock / O_EXCL); None when shared or released.
    claim: Mutex<Option<File>>,
}

/// A bounded set of locked byte ranges (at most one per writing thread).
#[derive(Default)]
struct RangeLock {
    held: Mutex<Vec<(u64, u64)>>,
    released: Condvar,
}

struct RangeGuard<'a> {
    lock: &'a RangeLock,
    range: (u64, u64),
}

impl RangeLock {
    /// Wait until no held range overlaps `start..end`, then hold it.
    fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let mut held = self.held.lock();
        while held.iter().any(|&(s, e)| s < end && start < e) {
            self.released.wait(&mut held);
        }
        held.push((start, end));
        RangeGuard { lock: self, range: (start, end) }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.lock.held.lock();
        if let Some(i) = held.iter().position(|&r| r == self.range) {
            held.swap_remove(i);
        }
        drop(held);
        self.lock.released.notify_all();
    }
}

impl FileDevice {
    /// Open read-write for a pool and take the leaf: `flock(LOCK_EX|LOCK_NB)` on a regular
    /// file, `O_EXCL` on a block device. A leaf held elsewhere fails with `WouldBlock`
    /// (file) or `ResourceBusy` (block device). O_DIRECT where the file system allows it.
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        Self::open_as(path, true)
    }

    /// Open read-only without taking the leaf (label scans, device checks): writes fail.
    pub fn open_shared(path: &Path) -> io::Result<FileDevice> {
        Self::open_as(path, false)
    }

    fn open_as(path: &Path, exclusive: bool) -> io::Result<FileDevice> {
        let (file, direct) = match Self::open_direct(path, 0, exclusive) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (Self::open_mode(path, 0, exclusive)?, false),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let is_block = meta.file_type().is_block_device();
        if !is_block && !meta.file_type().is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or block device"));
        }
        let claim = if exclusive { Some(claim_leaf(path, is_block)?) } else { None };
        let (mem_align, offset_align) = if direct { dio_alignment(&file) } else { (1, 1) };
        let (size_bytes, rotational, logical, physical) = if is_block {
            let size = rustix::fs::seek(&file, SeekFrom::End(0))?;
            let logical = rustix::fs::ioctl_blksszget(&file).unwrap_or(512);
            let physical = rustix::fs::ioctl_blkpbszget(&file).unwrap_or(logical).max(logical);
            (size, block_rotational(meta.rdev()), logical, physical)
        } else {
            (meta.len() / SECTOR_BYTES * SECTOR_BYTES, false, 512, 4096)
        };
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            direct,
            is_block,
            size_bytes,
            mem_align,
            offset_align,
            rotational,
            logical_sector_bytes: logical,
            physical_sector_bytes: physical,
            write_ranges: RangeLock::default(),
            identity: super::DeviceIdentity::from_metadata(&meta),
            claim: Mutex::new(claim),
        })
    }

    /// Whether I/O bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write zeros into every hole of a regular file within `[start, end)`, then make
    /// them durable; returns the bytes written (0 when its file system has less than
    /// `min_free_bytes` free). Holes read as zeros, so no byte a reader
    /// can see changes: what changes is that the host file system has allocated those
    /// blocks, and a later durable write there needs no journal commit of its own (an
    /// allocation, or an unwritten extent's conversion, which SEEK_HOLE reports as a
    /// hole too). Only on a leaf this process holds (the claim): a concurrent writer
    /// could fill a hole between our SEEK_HOLE and our write. A block device has no
    /// holes: nothing to do.
    pub fn fill_holes(&self, start: u64, end: u64, min_free_bytes: u64) -> io::Result<u64> {
        const CHUNK_BYTES: u64 = 1 << 20;
        if self.is_block || self.claim.lock().is_none() {
            return Ok(0);
        }
        let fs = rustix::fs::fstatvfs(&self.file)?;
        if fs.f_bavail.saturating_mul(fs.f_frsize) < min_free_bytes {
            return Ok(0);
        }
        let end = end.min(self.size_bytes);
        let align = (self.offset_align.max(SECTOR_BYTES as usize)) as u64;
        let zeros = AlignedBuf::zeroed_aligned(CHUNK_BYTES as usize, self.mem_align.max(DIO_ALIGN_DEFAULT));
        let seek = |from: SeekFrom| match rustix::fs::seek(&self.file, from) {
            Ok(at) => Ok(Some(at)),
            Err(rustix::io::Errno::NXIO) => Ok(None),
            Err(e) => Err(io::Error::from(e)),
        };
        let (mut at, mut filled) = (start, 0u64);
        while at < end {
            let Some(hole) = seek(SeekFrom::Hole(at))? else { break };
            if hole >= end {
                break;
            }
            let data = seek(SeekFrom::Data(hole))?.map_or(end, |d| d.min(end));
            // whole aligned units inside the hole only: never a byte outside it
            let (mut from, to) = (hole.next_multiple_of(align), data / align * align);
            while from < to {
                let n = (to - from).min(CHUNK_BYTES);
                super::Device::write_at(self, &zeros.as_slice()[..n as usize], from)?;
                filled += n;
                from += n;
            }
            at = data.max(hole + 1);
        }
        if filled > 0 {
            rustix::fs::fdatasync(&self.file)?;
        }
        Ok(filled)
    }

    fn open_mode(path: &Path, flags: i32, write: bool) -> io::Result<File> {
        OpenOptions::new().read(true).write(write).custom_flags(flags | libc::O_CLOEXEC).open(path)
    }

    /// Open O_DIRECT and prove it works with one aligned read (EINVAL means no).
    fn open_direct(path: &Path, flags: i32, write: bool) -> io::Result<File> {
        let file = Self::open_mode(path, flags | libc::O_DIRECT, write)?;
        let mut probe = AlignedBuf::zeroed_aligned(PROBE_BYTES, DIO_ALIGN_DEFAULT);
        match file.read_at(probe.as_mut_slice(), 0) {
            Ok(_) => Ok(file),
            Err(e) => Err(e),
        }
    }

    fn check_range(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("I/O at {offset}+{len} beyond device size {}", self.size_bytes),
            )),
        }
    }

    fn offset_aligned(&self, offset: u64, len: usize) -> bool {
        offset.is_multiple_of(self.offset_align as u64) && len.is_multiple_of(self.offset_align)
    }

    fn mem_aligned(&self, ptr: *const u8) -> bool {
        (ptr as usize).is_multiple_of(self.mem_align)
    }

    /// Covering aligned range of `offset..offset+len`: (start, length).
    fn covering(&self, offset: u64, len: usize) -> (u64, usize) {
        let a = self.offset_align as u64;
        let start = offset / a * a;
        let end = (offset + len as u64).div_ceil(a) * a;
        (start, (end - start) as usize)
    }

    /// Read into an aligned buffer, tolerating a short read past the device end as long
    /// as the bytes up to `needed` arrived (a file whose length is not aligned).
    fn read_aligned(&self, buf: &mut [u8], offset: u64, needed: usize) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if done < needed {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        }
        Ok(())
    }
}

/// pwritev of all of `bufs` at `offset`, at most IOV_MAX buffers a call, resuming
/// after a short write.
fn pwritev_all(file: &std::fs::File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    use std::io::IoSlice;
    use std::os::unix::fs::FileExt;
    const IOV_MAX: usize = 1024;
    let mut at = offset;
    let mut i = 0;
    while i < bufs.len() {
        let n = (bufs.len() - i).min(IOV_MAX);
        let slices: Vec<IoSlice<'_>> = bufs[i..i + n].iter().map(|b| IoSlice::new(b)).collect();
        let want: usize = bufs[i..i + n].iter().map(|b| b.len()).sum();
        let wrote = match rustix::io::pwritev(file, &slices, at) {
            Ok(w) => w,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if wrote < want {
            // a short write: finish these buffers one by one from where it stopped
            let (mut skip, mut pos) = (wrote, at + wrote as u64);
            for b in &bufs[i..i + n] {
                if skip >= b.len() {
                    skip -= b.len();
                    continue;
                }
                file.write_all_at(&b[skip..], pos)?;
                pos += (b.len() - skip) as u64;
                skip = 0;
            }
        }
        at += want as u64;
        i += n;
    }
    Ok(())
}

impl super::Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        if !self.direct || (self.offset_aligned(offset, buf.len()) && self.mem_aligned(buf.as_ptr())) {
            let len = buf.len();
            return self.read_aligned(buf, offset, len);
        }
        let (start, cover) = self.covering(offset, buf.len());
        let mut bounce = AlignedBuf::zeroed_aligned(cover, self.mem_align.max(self.offset_align));
        let skip = (offset - start) as usize;
        self.read_aligned(bounce.as_mut_slice(), start, skip + buf.len())?;
        buf.copy_from_slice(&bounce.as_slice()[skip..skip + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        if !self.direct || (self.offset_aligned(offset, buf.len()) && self.mem_aligned(buf.as_ptr())) {
            let _range = self.write_ranges.lock(offset, offset + buf.len() as u64);
            return self.file.write_all_at(buf, offset);
        }
        let align = self.mem_align.max(self.offset_align);
        if self.offset_aligned(offset, buf.len()) {
            let mut bounce = AlignedBuf::zeroed_aligned(buf.len(), align);
            bounce.as_mut_slice().copy_from_slice(buf);
            let _range = self.write_ranges.lock(offset, offset + buf.len() as u64);
            return self.file.write_all_at(bounce.as_slice(), offset);
        }
        let (start, cover) = self.covering(offset, buf.len());
        // Read-modify-write: hold the whole covering range so no write to a neighbouring
        // block in the same sectors lands between our read and our write.
        let _range = self.write_ranges.lock(start, start + cover as u64);
        let mut bounce = AlignedBuf::zeroed_aligned(cover, align);
        let skip = (offset - start) as usize;
        self.read_aligned(bounce.as_mut_slice(), start, skip + buf.len())?;
        bounce.as_mut_slice()[skip..skip + buf.len()].copy_from_slice(buf);
        self.file.write_all_at(bounce.as_slice(), start)
    }

    /// One pwritev when every buffer suits O_DIRECT (each a multiple of the offset
    /// alignment, at an aligned address: block buffers are); else one write per buffer.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        self.check_range(offset, len)?;
        let aligned = !self.direct || (self.offset_aligned(offset, 0) && bufs.iter().all(|b| self.offset_aligned(0, b.len()) && self.mem_aligned(b.as_ptr())));
        if !aligned {
            let mut at = offset;
            for b in bufs {
                self.write_at(b, at)?;
                at += b.len() as u64;
            }
            return Ok(());
        }
        let _range = self.write_ranges.lock(offset, offset + len as u64);
        pwritev_all(&self.file, bufs, offset)
    }

    fn flush(&self) -> io::Result<()> {
        rustix::fs::fdatasync(&self.file)?;
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size_bytes
    }

    fn rotational(&self) -> bool {
        self.rotational
    }

    fn logical_sector_size(&self) -> u32 {
        self.logical_sector_bytes
    }

    fn physical_sector_size(&self) -> u32 {
        self.physical_sector_bytes
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len.min(usize::MAX as u64) as usize)?;
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, flags, offset, len) {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn kind(&self) -> DeviceKind {
        if self.is_block { DeviceKind::Disk } else { DeviceKind::File }
    }

    fn identity(&self) -> Option<super::DeviceIdentity> {
        Some(self.identity)
    }

    fn fill_holes(&self, start: u64, end: u64, min_free_bytes: u64) -> io::Result<u64> {
        FileDevice::fill_holes(self, start, end, min_free_bytes)
    }

    fn release(&self) {
        self.claim.lock().take();
    }

    fn raw_target(&self) -> Option<super::RawTarget> {
        use std::os::fd::AsRawFd;
        Some(super::RawTarget {
            fd: self.file.as_raw_fd(),
            mem_align: self.mem_align,
            offset_align: self.offset_align,
            size_bytes: self.size_bytes,
        })
    }
}

/// Take a leaf for this pool with a descriptor of its own (so the claim can be dropped
/// at export while I/O threads still hold the device): a block device opened `O_EXCL`
/// (EBUSY while another pool holds it or it is mounted), a regular file with
/// `flock(LOCK_EX|LOCK_NB)`. A file system without flock support (some network file
/// systems: ENOLCK, EOPNOTSUPP) leaves the leaf unclaimed, with a warning.
///
/// A claim just given up can outlive its close by a moment: a process forking in
/// between (another thread's `Command::spawn`) holds a copy of the descriptor until
/// its exec closes it (O_CLOEXEC), and the lock or the exclusive open goes with the
/// last copy. So a busy answer is retried for up to [`CLAIM_BUSY_RETRY`] before it
/// stands (an export followed at once by an import or a create, as tests do).
///
/// The wait is for another process, so it is real time (`env::real`), whatever the
/// pool's Env.
fn claim_leaf(path: &Path, is_block: bool) -> io::Result<File> {
    let os = crate::env::real();
    let deadline_ns = os.now_ns() + CLAIM_BUSY_RETRY_NS;
    loop {
        match claim_leaf_once(path, is_block) {
            Err(e) if matches!(e.kind(), io::ErrorKind::ResourceBusy | io::ErrorKind::WouldBlock) && os.now_ns() < deadline_ns => {
                os.sleep_ns(10_000_000);
            }
            r => return r,
        }
    }
}

/// How long a busy leaf is retried before the claim is refused (see [`claim_leaf`]).
const CLAIM_BUSY_RETRY_NS: u64 = 250_000_000;

fn claim_leaf_once(path: &Path, is_block: bool) -> io::Result<File> {
    use rustix::fs::FlockOperation;
    let flags = libc::O_CLOEXEC | if is_block { libc::O_EXCL } else { 0 };
    let file = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(io::Error::new(io::ErrorKind::ResourceBusy, "block device is held exclusively elsewhere (a pool, a mount)"))
        }
        Err(e) => return Err(e),
    };
    if is_block {
        return Ok(file);
    }
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            Err(io::Error::new(io::ErrorKind::WouldBlock, "file is locked by another open (a pool in this or another process)"))
        }
        Err(e) if e == rustix::io::Errno::NOLCK || e == rustix::io::Errno::OPNOTSUPP => {
            tracing::warn!("cannot lock leaf file {} ({e}): it is not protected against a second importer", path.display());
            Ok(file)
        }
        Err(e) => Err(e.into()),
    }
}

/// O_DIRECT (memory, offset) alignment from statx STATX_DIOALIGN, else 4096 for both.
fn dio_alignment(file: &File) -> (usize, usize) {
    match rustix::fs::statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        Ok(st) if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 && st.stx_dio_offset_align != 0 => {
            let valid = |a: u32| (a as usize).is_power_of_two() && a as usize <= 1 << 20;
            let mem = if valid(st.stx_dio_mem_align) { st.stx_dio_mem_align as usize } else { DIO_ALIGN_DEFAULT };
            let off = if valid(st.stx_dio_offset_align) { st.stx_dio_offset_align as usize } else { DIO_ALIGN_DEFAULT };
            (mem, off)
        }
        _ => (DIO_ALIGN_DEFAULT, DIO_ALIGN_DEFAULT),
    }
}

/// /sys/dev/block/M:m/queue/rotational, or the parent disk's for a partition.
/// Unknown means not rotational (virtual and loop devices report 0 anyway).
fn block_rotational(rdev: u64) -> bool {
    let dev = PathBuf::from(format!("/sys/dev/block/{}:{}", rustix::fs::major(rdev), rustix::fs::minor(rdev)));
    for candidate in [dev.join("queue/rotational"), dev.join("../queue/rotational")] {
        if let Ok(s) = std::fs::read_to_string(&candidate) {
            return s.trim() == "1";
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::Device;

    fn temp_device(len: u64) -> (tempfile::TempDir, FileDevice) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf0");
        let f = File::create(&path).unwrap();
        f.set_len(len).unwrap();
        drop(f);
        let dev = FileDevice::open(&path).unwrap();
        (dir, dev)
    }

    #[test]
    fn file_geometry() {
        let (_d, dev) = temp_device(4 << 20);
        assert_eq!(dev.size(), 4 << 20);
        assert!(!dev.rotational());
        assert_eq!(dev.kind(), "file");
        assert_eq!((dev.logical_sector_size(), dev.physical_sector_size()), (512, 4096));
        eprintln!("direct={} mem_align={} offset_align={}", dev.is_direct(), dev.mem_align, dev.offset_align);
    }

    #[test]
    fn aligned_and_unaligned_round_trips() {
        // Goal: any buffer address, offset and length round-trips, through O_DIRECT's
        // bounce paths when direct. Method: write patterns at awkward places, read back
        // through both aligned and misaligned buffers, and check the neighbours survive.
        for force_align in [None, Some(4096)] {
            let (_d, mut dev) = temp_device(1 << 20);
            if let (Some(a), true) = (force_align, dev.is_direct()) {
                // Exercise the 4Kn read-modify-write path on a 512-aligned file system.
                dev.mem_align = a;
                dev.offset_align = a;
            }
            round_trips(&dev);
        }
    }

    fn round_trips(dev: &FileDevice) {
        let pattern: Vec<u8> = (0..20000u32).map(|i| (i * 7 + 3) as u8).collect();
        dev.write_at(&pattern[..8192], 0).unwrap();
        for (off, len, skew) in [(4096u64, 4096usize, 1usize), (8192, 512, 0), (10240, 1536, 3), (12345, 777, 5), (65536 - 100, 300, 0)] {
            let mut src = vec![0u8; len + skew];
            src[skew..].copy_from_slice(&pattern[..len]);
            dev.write_at(&src[skew..], off).unwrap();
            let mut dst = vec![0u8; len + 1];
            dev.read_at(&mut dst[1..], off).unwrap();
            assert_eq!(&dst[1..], &pattern[..len], "off {off} len {len}");
        }
        let mut first = AlignedBuf::zeroed_aligned(4096, 4096);
        dev.read_at(first.as_mut_slice(), 0).unwrap();
        assert_eq!(first.as_slice(), &pattern[..4096]);
        // The unaligned write at 12345 left bytes around it intact.
        let mut around = vec![0u8; 2];
        dev.read_at(&mut around, 12344).unwrap();
        assert_eq!(around, vec![0, pattern[0]]);
        dev.flush().unwrap();
        assert!(dev.read_at(&mut [0u8; 512], (1 << 20) - 256).is_err());
        assert!(dev.write_at(&[0u8; 512], 1 << 20).is_err());
    }

    #[test]
    fn tmpfs_falls_back_or_works() {
        // Goal: on tmpfs (O_DIRECT unsupported on older kernels) open still succeeds.
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else { return };
        let path = dir.path().join("leaf");
        File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let dev = FileDevice::open(&path).unwrap();
        eprintln!("tmpfs direct={}", dev.is_direct());
        round_trips(&dev);
    }

    #[test]
    fn discard_punches_holes() {
        let (_d, dev) = temp_device(1 << 20);
        dev.write_at(&vec![9u8; 65536], 0).unwrap();
        dev.discard(0, 65536).unwrap();
        let mut buf = vec![1u8; 65536];
        dev.read_at(&mut buf, 0).unwrap();
        // Where PUNCH_HOLE is supported the range reads back as zeros.
        assert!(buf.iter().all(|&b| b == 0) || buf.iter().all(|&b| b == 9));
    }

    #[test]
    fn filling_holes_allocates_them_and_changes_no_byte() {
        // Goal: fill_holes writes zeros into holes only (data already there survives),
        // leaves no hole in its range and none changed outside it; a shared open
        // writes nothing. Method: a sparse file with data in the middle of the range
        // and past its end; fill; read back; SEEK_HOLE.
        let (dir, dev) = temp_device(8 << 20);
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8 + 1).collect();
        dev.write_at(&data, 1 << 20).unwrap();
        dev.write_at(&data, 6 << 20).unwrap();
        let shared = FileDevice::open_shared(&dir.path().join("leaf0")).unwrap();
        assert_eq!(shared.fill_holes(0, 4 << 20, 0).unwrap(), 0, "a shared open filled holes");
        let hole_at = |at: u64| rustix::fs::seek(&dev.file, SeekFrom::Hole(at)).unwrap();
        if hole_at(0) >= 4 << 20 {
            eprintln!("this file system reports no holes: nothing to check");
            return;
        }
        assert_eq!(dev.fill_holes(4096, 4 << 20, u64::MAX).unwrap(), 0, "filled without the free space asked for");
        let filled = dev.fill_holes(4096, 4 << 20, 0).unwrap();
        assert_eq!(filled, (4 << 20) - 4096 - 8192, "every hole byte of the range, nothing else");
        assert!(hole_at(4096) >= 4 << 20, "a hole is left in the range");
        assert!(hole_at(4 << 20) < 6 << 20, "the fill went past its range");
        let mut back = vec![0u8; 8192];
        dev.read_at(&mut back, 1 << 20).unwrap();
        assert_eq!(back, data, "data in the range changed");
        let mut zeros = vec![1u8; 1 << 20];
        dev.read_at(&mut zeros, 2 << 20).unwrap();
        assert!(zeros.iter().all(|&b| b == 0), "a filled hole does not read as zeros");
        assert_eq!(dev.fill_holes(0, 4 << 20, 0).unwrap(), 4096, "only the one hole left");
    }

    #[test]
    fn a_leaf_is_taken_by_one_opener() {
        // Goal: a pool's leaf file cannot be opened for a second pool (same or another
        // process); label scans still read it. Method: open twice; open_shared.
        let (dir, dev) = temp_device(1 << 20);
        let path = dir.path().join("leaf0");
        let e = FileDevice::open(&path).err().expect("second exclusive open must fail");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        let shared = FileDevice::open_shared(&path).unwrap();
        let mut buf = vec![0u8; 4096];
        shared.read_at(&mut buf, 0).unwrap();
        assert!(shared.write_at(&buf, 0).is_err(), "a shared open is read-only");
        assert_eq!(shared.identity(), dev.identity());
        dev.release();
        let again = FileDevice::open(&path).expect("releasing the claim frees the leaf");
        assert_eq!(FileDevice::open(&path).err().map(|e| e.kind()), Some(io::ErrorKind::WouldBlock));
        drop(again);
        FileDevice::open(&path).expect("closing the device frees the leaf");
    }

    #[test]
    fn missing_file_is_not_found() {
        let e = FileDevice::open(Path::new("/nonexistent/zilla/leaf")).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let dir = tempfile::tempdir().unwrap();
        assert!(FileDevice::open(dir.path()).is_err(), "a directory is not a device");
    }

    #[test]
    fn block_device_when_available() {
        // Goal: geometry of a real block device. Runs only when ZILLA_TEST_BLOCKDEV
        // names a writable one (e.g. a loop device); otherwise a no-op.
        let Ok(path) = std::env::var("ZILLA_TEST_BLOCKDEV") else { return };
        let dev = FileDevice::open(Path::new(&path)).unwrap();
        assert_eq!(dev.kind(), "disk");
        assert!(dev.size() > 0);
        assert!(dev.logical_sector_size() >= 512);
        let mut buf = vec![0u8; 4096];
        dev.read_at(&mut buf, 0).unwrap();
    }
}
