//! Test devices: crash simulation, fault injection and a plain in-memory disk.
//!
//! Theory of operation
//! -------------------
//! These devices sit under a leaf in tests exactly where a file or disk would, so the
//! engine cannot tell it is being tested.
//!
//! [`CrashDevice`] models a disk with a volatile write cache: a write is visible to
//! later reads at once but is durable only after a `flush` that started after it
//! completed. A power cut keeps some subset of the unflushed writes, chosen by
//! [`CrashMode`] and a seed (so every crash is replayable), and returns the durable
//! image; the device then fails every I/O with EIO, so a pool still running against it
//! cannot change the image afterwards.
//!
//! Representation (chosen so ~1000 crash iterations of 64 MiB pools stay cheap):
//!
//! ```text
//!   image      the *newest* bytes (what reads see), one Vec<u8>, never copied
//!   pending    undo log of unflushed writes: (offset, old bytes, new bytes) in order
//!   flush      clears `pending` (the image already holds the data)         O(1)
//!   power cut  undo every pending write newest-first -> the durable image,
//!              then re-apply the writes the mode keeps; move the image out  O(pending)
//! ```
//!
//! Memory is the image plus twice the unflushed bytes; the engine flushes at least once
//! per txg, which bounds the log in practice.
//!
//! Fault model ([`DeviceFault`], armed with [`CrashDevice::arm`], counted from arming):
//!
//! ```text
//!   WriteEio      writes nth..nth+count fail with EIO; nothing reaches the cache
//!   FlushEio      the nth flush fails with EIO and every write it covered is *lost*:
//!                 never durable (Linux drops the dirty pages after a failed
//!                 fdatasync); reads see the old bytes at once, or (keep_cached) the new
//!                 ones until the cut; the error is reported once, later flushes work
//!   LyingFlush    flushes first..until return Ok and make nothing durable (a drive that
//!                 acknowledges its volatile cache); until = u64::MAX: never honest
//!   Misdirect     write nth lands at another offset; its own offset keeps old bytes
//!   Vanish        from write nth on every I/O fails with ENXIO (the disk was pulled);
//!                 its unflushed writes are lost; the cut returns the durable image
//! ```
//!
//! A log entry is *unflushed* (the cut's mode decides), *durable* (a later honest
//! flush covered it, but an older entry was lost, so the log cannot be cleared) or
//! *lost* (a failed flush covered it). Unflushed entries are always a suffix of the
//! log. The cut undoes the whole log newest-first, re-applies the durable entries in
//! order, then the unflushed ones the mode keeps.
//!
//! [`FaultDevice`] wraps any device and injects errors (EIO per direction or per read
//! range, ENXIO when offline) or silent corruption of the stored bytes.
//! [`MemDevice`] is an in-memory device with no crash semantics at all.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use super::{Device, DeviceKind};

/// Sector granularity of torn writes (the smallest unit a disk writes atomically).
pub const TORN_SECTOR_BYTES: usize = 512;

/// EIO as a raw OS error, so `raw_os_error()` (used for NBD/SCSI error replies) sees it.
/// `_why` documents the call site only.
fn eio(_why: &str) -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Check `offset..offset+len` lies within a device of `size` bytes.
fn check_range(offset: u64, len: usize, size: u64) -> io::Result<Range<usize>> {
    let end = offset.checked_add(len as u64).filter(|&end| end <= size);
    match end {
        Some(end) => Ok(offset as usize..end as usize),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("I/O at {offset}+{len} beyond device size {size}"),
        )),
    }
}

// ------------------------------------------------------------------------------------
// CrashDevice
// ------------------------------------------------------------------------------------

/// Which unflushed writes survive a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unflushed write is lost.
    DropAll,
    /// Each unflushed write is independently kept or dropped (probability 1/2), and the
    /// kept ones land in a random order (overlapping writes may end up older-over-newer).
    KeepRandomSubset,
    /// Every unflushed write is lost except the last one, which is torn: a random strict
    /// prefix (0..n-1 of its n 512-byte sectors) reaches the media.
    TearLast,
    /// A random subset of the unflushed writes lands in a random order, and one more
    /// unflushed write (any of them, chosen at random) is torn as in `TearLast` and lands
    /// last: a destaging cache that reorders, caught mid-write.
    TornReordered,
}

/// A misbehaviour of one device, armed for the rest of its power-on period; write and
/// flush numbers count from arming, 0 = the next one. See the module comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceFault {
    /// Writes `nth..nth+count` fail with EIO and change nothing.
    WriteEio { nth: u64, count: u64 },
    /// Flush `nth` fails with EIO and the writes it covered are lost; `keep_cached`:
    /// reads still see them until the power cut.
    FlushEio { nth: u64, keep_cached: bool },
    /// Flushes `first..until` return Ok and make nothing durable.
    LyingFlush { first: u64, until: u64 },
    /// Write `nth` lands at byte offset `to` (clamped into the device) instead.
    Misdirect { nth: u64, to: u64 },
    /// From write `nth` on, every I/O fails with ENXIO.
    Vanish { nth: u64 },
}

/// What the armed faults have done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FiredFaults {
    pub write_eio: u64,
    pub flush_eio: u64,
    pub lied_flushes: u64,
    pub misdirected: u64,
    pub vanished: bool,
}

/// Durability of one logged write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    Unflushed,
    Durable,
    Lost,
}

/// One logged write, with the bytes it overwrote so the power cut can undo it.
struct PendingWrite {
    offset: usize,
    old: Vec<u8>,
    new: Vec<u8>,
    state: Durability,
}

struct CrashState {
    /// Newest contents; becomes the durable image at the power cut.
    image: Vec<u8>,
    /// Unflushed writes, oldest first.
    pending: Vec<PendingWrite>,
    /// Set at the power cut: every later I/O fails.
    crashed: bool,
    /// Automatic power cut: (writes still allowed before the cut, mode, seed).
    crash_at: Option<(u64, CrashMode, u64)>,
    /// Image produced by an automatic power cut, until taken by `crashed_image`.
    crashed_image: Option<Vec<u8>>,
    /// Armed faults, and writes / flushes seen (refused ones too) since arming.
    faults: Vec<DeviceFault>,
    write_calls: u64,
    flush_calls: u64,
    fired: FiredFaults,
}

/// In-memory disk with a volatile write cache and simulated power cuts.
pub struct CrashDevice {
    size_bytes: u64,
    state: Mutex<CrashState>,
    writes: AtomicU64,
    /// Bytes of the writes accepted.
    write_bytes: AtomicU64,
    flushes: AtomicU64,
    /// Writes wait here while held (`hold_writes`): a test stops a device mid-commit.
    gate: Mutex<WriteGate>,
    gate_cv: parking_lot::Condvar,
}

/// See [`CrashDevice::hold_writes`].
#[derive(Default)]
struct WriteGate {
    held: bool,
    waiting: u32,
}

impl CrashDevice {
    /// A zero-filled device of `size_bytes`.
    pub fn new(size_bytes: u64) -> CrashDevice {
        CrashDevice::from_image(vec![0u8; size_bytes as usize])
    }

    /// A device whose durable contents are `image` (e.g. a previous crash's result).
    pub fn from_image(image: Vec<u8>) -> CrashDevice {
        CrashDevice {
            size_bytes: image.len() as u64,
            state: Mutex::new(CrashState {
                image,
                pending: Vec::new(),
                crashed: false,
                crash_at: None,
                crashed_image: None,
                faults: Vec::new(),
                write_calls: 0,
                flush_calls: 0,
                fired: FiredFaults::default(),
            }),
            writes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            gate: Mutex::new(WriteGate::default()),
            gate_cv: parking_lot::Condvar::new(),
        }
    }

    /// Hold every write (it waits before touching the device) until called with
    /// false: a test stops a commit in the middle of its device writes.
    pub fn hold_writes(&self, hold: bool) {
        self.gate.lock().held = hold;
        if !hold {
            self.gate_cv.notify_all();
        }
    }

    /// Writes waiting at the gate of `hold_writes`.
    pub fn writes_held(&self) -> u32 {
        self.gate.lock().waiting
    }

    fn pass_gate(&self) {
        let mut g = self.gate.lock();
        if g.held {
            g.waiting += 1;
            while g.held {
                self.gate_cv.wait(&mut g);
            }
            g.waiting -= 1;
        }
    }

    /// Cut the power now: returns the durable image after `mode` has picked the surviving
    /// unflushed writes (replayable from `seed`). Every later I/O fails with EIO.
    /// Calling it again after a crash returns an empty Vec.
    pub fn power_cut(&self, mode: CrashMode, seed: u64) -> Vec<u8> {
        let mut st = self.state.lock();
        Self::cut(&mut st, mode, seed)
    }

    /// Arrange an automatic power cut at the `n`-th write from now (n >= 1): that write
    /// and every later I/O fail with EIO; `crashed_image` then returns the image.
    /// `n == 0` cuts the power immediately.
    pub fn crash_after_writes(&self, n: u64, mode: CrashMode, seed: u64) {
        let mut st = self.state.lock();
        if n == 0 {
            let image = Self::cut(&mut st, mode, seed);
            st.crashed_image = Some(image);
        } else {
            st.crash_at = Some((n - 1, mode, seed));
        }
    }

    /// The image left by an automatic power cut. Moves it out (no 64 MiB copy): the
    /// first call after the crash returns Some, later calls None.
    pub fn crashed_image(&self) -> Option<Vec<u8>> {
        self.state.lock().crashed_image.take()
    }

    /// Whether the power has been cut (manually or automatically).
    pub fn has_crashed(&self) -> bool {
        self.state.lock().crashed
    }

    /// Writes accepted so far (failed writes are not counted).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Bytes of the writes accepted so far.
    pub fn write_bytes(&self) -> u64 {
        self.write_bytes.load(Ordering::Relaxed)
    }

    /// Flushes completed so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Writes since the last flush.
    pub fn unflushed_writes(&self) -> usize {
        self.state.lock().pending.iter().filter(|w| w.state == Durability::Unflushed).count()
    }

    /// Arm `fault` for the rest of this power-on period (several may be armed). Write and
    /// flush numbers count from the first arming.
    pub fn arm(&self, fault: DeviceFault) {
        let mut st = self.state.lock();
        if st.faults.is_empty() {
            st.write_calls = 0;
            st.flush_calls = 0;
        }
        st.faults.push(fault);
    }

    /// What the armed faults did so far.
    pub fn fired(&self) -> FiredFaults {
        self.state.lock().fired
    }

    /// Whether the device has vanished (every I/O fails with ENXIO).
    pub fn vanished(&self) -> bool {
        self.state.lock().fired.vanished
    }

    fn cut(st: &mut CrashState, mode: CrashMode, seed: u64) -> Vec<u8> {
        if st.crashed {
            return Vec::new();
        }
        st.crashed = true;
        st.crash_at = None;
        let pending = std::mem::take(&mut st.pending);
        let image = std::mem::take(&mut st.image);
        Self::surviving_image(image, &pending, mode, seed)
    }

    /// The image a power cut would leave now, without cutting: the device goes on
    /// (a test takes it at the instant something is acknowledged, on the thread that
    /// acknowledges, and checks later that the acknowledged data is in it). Copies the
    /// whole device.
    pub fn image_if_cut_now(&self, mode: CrashMode, seed: u64) -> Vec<u8> {
        let st = self.state.lock();
        if st.crashed {
            return Vec::new();
        }
        Self::surviving_image(st.image.clone(), &st.pending, mode, seed)
    }

    /// `image` (the current contents) with the writes of `pending` undone, then the
    /// durable ones and the unflushed survivors `mode` picks applied again.
    fn surviving_image(mut image: Vec<u8>, pending: &[PendingWrite], mode: CrashMode, seed: u64) -> Vec<u8> {
        // Undo newest-first: afterwards `image` is the image before the whole log.
        for w in pending.iter().rev() {
            image[w.offset..w.offset + w.old.len()].copy_from_slice(&w.old);
        }
        for w in pending.iter().filter(|w| w.state == Durability::Durable) {
            image[w.offset..w.offset + w.new.len()].copy_from_slice(&w.new);
        }
        let unflushed: Vec<&PendingWrite> = pending.iter().filter(|w| w.state == Durability::Unflushed).collect();
        let mut rng = StdRng::seed_from_u64(seed);
        match mode {
            CrashMode::DropAll => {}
            CrashMode::KeepRandomSubset => {
                for w in Self::shuffled_subset(&unflushed, &mut rng) {
                    image[w.offset..w.offset + w.new.len()].copy_from_slice(&w.new);
                }
            }
            CrashMode::TearLast => {
                if let Some(w) = unflushed.last() {
                    Self::tear(&mut image, w, &mut rng);
                }
            }
            CrashMode::TornReordered => {
                if !unflushed.is_empty() {
                    let torn = rng.gen_range(0..unflushed.len());
                    let others: Vec<&PendingWrite> =
                        unflushed.iter().enumerate().filter(|(i, _)| *i != torn).map(|(_, w)| *w).collect();
                    for w in Self::shuffled_subset(&others, &mut rng) {
                        image[w.offset..w.offset + w.new.len()].copy_from_slice(&w.new);
                    }
                    Self::tear(&mut image, unflushed[torn], &mut rng);
                }
            }
        }
        image
    }

    /// Each write kept with probability 1/2, in a random order (Fisher-Yates: the disk
    /// may have destaged its cache in any order).
    fn shuffled_subset<'a>(writes: &[&'a PendingWrite], rng: &mut StdRng) -> Vec<&'a PendingWrite> {
        let mut kept: Vec<&PendingWrite> = writes.iter().copied().filter(|_| rng.gen_bool(0.5)).collect();
        for i in (1..kept.len()).rev() {
            kept.swap(i, rng.gen_range(0..=i));
        }
        kept
    }

    /// Apply a random strict prefix of whole sectors of `w`.
    fn tear(image: &mut [u8], w: &PendingWrite, rng: &mut StdRng) {
        let sectors = w.new.len().div_ceil(TORN_SECTOR_BYTES);
        let keep_sectors = rng.gen_range(0..sectors.max(1));
        let keep_bytes = (keep_sectors * TORN_SECTOR_BYTES).min(w.new.len());
        image[w.offset..w.offset + keep_bytes].copy_from_slice(&w.new[..keep_bytes]);
    }

    /// Undo the unflushed suffix of the log newest-first (lost at once, reads see the
    /// old bytes), or mark it lost but leave it visible (`keep_cached`).
    fn lose_unflushed(st: &mut CrashState, keep_cached: bool) {
        if keep_cached {
            for w in st.pending.iter_mut().filter(|w| w.state == Durability::Unflushed) {
                w.state = Durability::Lost;
            }
            return;
        }
        while st.pending.last().is_some_and(|w| w.state == Durability::Unflushed) {
            let w = st.pending.pop().expect("checked");
            st.image[w.offset..w.offset + w.old.len()].copy_from_slice(&w.old);
        }
    }

    /// The device vanishes: its cache is lost, every later I/O fails with ENXIO.
    fn vanish(st: &mut CrashState) {
        Self::lose_unflushed(st, false);
        st.fired.vanished = true;
    }

    /// Apply the armed faults to write number `n`: Err to refuse it, Ok(offset) where it
    /// lands.
    fn fault_write(st: &mut CrashState, n: u64, offset: usize, len: usize, size: usize) -> io::Result<usize> {
        let mut at = offset;
        for f in st.faults.clone() {
            match f {
                DeviceFault::Vanish { nth } if n >= nth => {
                    Self::vanish(st);
                    return Err(errno(libc::ENXIO));
                }
                DeviceFault::WriteEio { nth, count } if n >= nth && n - nth < count => {
                    st.fired.write_eio += 1;
                    return Err(eio("injected write error"));
                }
                DeviceFault::Misdirect { nth, to } if n == nth => {
                    st.fired.misdirected += 1;
                    at = (to as usize).min(size.saturating_sub(len)) / TORN_SECTOR_BYTES * TORN_SECTOR_BYTES;
                }
                _ => {}
            }
        }
        Ok(at)
    }

    /// Apply the armed faults to flush number `n`: Some(result) if a fault decides it.
    fn fault_flush(st: &mut CrashState, n: u64) -> Option<io::Result<()>> {
        for f in st.faults.clone() {
            match f {
                DeviceFault::FlushEio { nth, keep_cached } if n == nth => {
                    st.fired.flush_eio += 1;
                    Self::lose_unflushed(st, keep_cached);
                    return Some(Err(eio("injected flush error")));
                }
                DeviceFault::LyingFlush { first, until } if n >= first && n < until => {
                    st.fired.lied_flushes += 1;
                    return Some(Ok(()));
                }
                _ => {}
            }
        }
        None
    }
}

impl Device for CrashDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = self.state.lock();
        if st.crashed {
            return Err(eio("read after power cut"));
        }
        if st.fired.vanished {
            return Err(errno(libc::ENXIO));
        }
        let r = check_range(offset, buf.len(), self.size_bytes)?;
        buf.copy_from_slice(&st.image[r]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.pass_gate();
        let mut st = self.state.lock();
        if st.crashed {
            return Err(eio("write after power cut"));
        }
        if st.fired.vanished {
            return Err(errno(libc::ENXIO));
        }
        let r = check_range(offset, buf.len(), self.size_bytes)?;
        if let Some((remaining, mode, seed)) = st.crash_at {
            if remaining == 0 {
                let image = Self::cut(&mut st, mode, seed);
                st.crashed_image = Some(image);
                return Err(eio("write at scheduled power cut"));
            }
            st.crash_at = Some((remaining - 1, mode, seed));
        }
        let n = st.write_calls;
        st.write_calls += 1;
        let at = if st.faults.is_empty() { r.start } else { Self::fault_write(&mut st, n, r.start, buf.len(), self.size_bytes as usize)? };
        let r = at..at + buf.len();
        let old = st.image[r.clone()].to_vec();
        st.image[r.clone()].copy_from_slice(buf);
        st.pending.push(PendingWrite { offset: r.start, old, new: buf.to_vec(), state: Durability::Unflushed });
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A discarded range reads as garbage (0xA5) from now on; like a write, the change
    /// is durable only after a flush. Engine code that discards a live block loses it
    /// visibly here (checksum errors), where a real SSD would at some later time.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| eio("discard too long"))?;
        self.write_at(&vec![0xA5u8; len], offset)
    }

    fn flush(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.crashed {
            return Err(eio("flush after power cut"));
        }
        if st.fired.vanished {
            return Err(errno(libc::ENXIO));
        }
        let n = st.flush_calls;
        st.flush_calls += 1;
        if let Some(r) = Self::fault_flush(&mut st, n) {
            return r;
        }
        if st.pending.iter().any(|w| w.state == Durability::Lost) {
            for w in st.pending.iter_mut() {
                if w.state == Durability::Unflushed {
                    w.state = Durability::Durable;
                }
            }
        } else {
            st.pending.clear();
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size_bytes
    }

    fn rotational(&self) -> bool {
        false
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Test("crash")
    }
}

// ------------------------------------------------------------------------------------
// FaultDevice
// ------------------------------------------------------------------------------------

/// Faults injected so far, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    /// I/Os refused with ENXIO while offline.
    pub offline_errors: u64,
    /// Calls to `corrupt`.
    pub corruptions: u64,
}

/// Wraps a device and injects I/O errors or silent corruption on command.
pub struct FaultDevice {
    inner: Arc<dyn Device>,
    fail_reads: AtomicBool,
    fail_writes: AtomicBool,
    fail_flush: AtomicBool,
    offline: AtomicBool,
    /// Reads overlapping any of these byte ranges fail with EIO.
    bad_read_ranges: RwLock<Vec<Range<u64>>>,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    flush_errors: AtomicU64,
    offline_errors: AtomicU64,
    corruptions: AtomicU64,
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn Device>) -> FaultDevice {
        FaultDevice {
            inner,
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            fail_flush: AtomicBool::new(false),
            offline: AtomicBool::new(false),
            bad_read_ranges: RwLock::new(Vec::new()),
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            flush_errors: AtomicU64::new(0),
            offline_errors: AtomicU64::new(0),
            corruptions: AtomicU64::new(0),
        }
    }

    pub fn inner(&self) -> &Arc<dyn Device> {
        &self.inner
    }

    /// Every read fails with EIO while set.
    pub fn fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::Relaxed);
    }

    /// Every write fails with EIO while set (nothing reaches the inner device).
    pub fn fail_writes(&self, on: bool) {
        self.fail_writes.store(on, Ordering::Relaxed);
    }

    /// Every flush fails with EIO while set.
    pub fn fail_flush(&self, on: bool) {
        self.fail_flush.store(on, Ordering::Relaxed);
    }

    /// Reads overlapping `range` fail with EIO (a latent sector error) until `clear`.
    pub fn fail_reads_in(&self, range: Range<u64>) {
        self.bad_read_ranges.write().push(range);
    }

    /// Every I/O fails with ENXIO while set (the disk was pulled).
    pub fn offline(&self, on: bool) {
        self.offline.store(on, Ordering::Relaxed);
    }

    /// Remove every injected error (counters are kept).
    pub fn clear(&self) {
        self.fail_reads(false);
        self.fail_writes(false);
        self.fail_flush(false);
        self.offline(false);
        self.bad_read_ranges.write().clear();
    }

    /// Silently overwrite `offset..offset+len` of the inner device with random bytes
    /// (replayable from `seed`); reads then succeed with wrong data.
    pub fn corrupt(&self, offset: u64, len: u64, seed: u64) -> io::Result<()> {
        let mut junk = vec![0u8; len as usize];
        StdRng::seed_from_u64(seed).fill_bytes(&mut junk);
        self.inner.write_at(&junk, offset)?;
        self.corruptions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            read_errors: self.read_errors.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
            flush_errors: self.flush_errors.load(Ordering::Relaxed),
            offline_errors: self.offline_errors.load(Ordering::Relaxed),
            corruptions: self.corruptions.load(Ordering::Relaxed),
        }
    }

    fn check_offline(&self) -> io::Result<()> {
        if self.offline.load(Ordering::Relaxed) {
            self.offline_errors.fetch_add(1, Ordering::Relaxed);
            return Err(errno(libc::ENXIO));
        }
        Ok(())
    }
}

impl Device for FaultDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_offline()?;
        let end = offset.saturating_add(buf.len() as u64);
        let in_bad_range = || self.bad_read_ranges.read().iter().any(|r| r.start < end && offset < r.end);
        if self.fail_reads.load(Ordering::Relaxed) || in_bad_range() {
            self.read_errors.fetch_add(1, Ordering::Relaxed);
            return Err(errno(libc::EIO));
        }
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_offline()?;
        if self.fail_writes.load(Ordering::Relaxed) {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
            return Err(errno(libc::EIO));
        }
        self.inner.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.check_offline()?;
        if self.fail_flush.load(Ordering::Relaxed) {
            self.flush_errors.fetch_add(1, Ordering::Relaxed);
            return Err(errno(libc::EIO));
        }
        self.inner.flush()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn rotational(&self) -> bool {
        self.inner.rotational()
    }

    fn logical_sector_size(&self) -> u32 {
        self.inner.logical_sector_size()
    }

    fn physical_sector_size(&self) -> u32 {
        self.inner.physical_sector_size()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_offline()?;
        self.inner.discard(offset, len)
    }

    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
}

// ------------------------------------------------------------------------------------
// MemDevice
// ------------------------------------------------------------------------------------

/// A plain in-memory device: writes are durable at once, flush does nothing.
pub struct MemDevice {
    size_bytes: u64,
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(size_bytes: u64) -> MemDevice {
        MemDevice { size_bytes, data: RwLock::new(vec![0u8; size_bytes as usize]) }
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let r = check_range(offset, buf.len(), self.size_bytes)?;
        buf.copy_from_slice(&self.data.read()[r]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let r = check_range(offset, buf.len(), self.size_bytes)?;
        self.data.write()[r].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size_bytes
    }

    fn rotational(&self) -> bool {
        false
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(fill: u8, len: usize) -> Vec<u8> {
        vec![fill; len]
    }

    fn read(dev: &dyn Device, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        dev.read_at(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn crash_reads_see_newest_and_flush_makes_durable() {
        // Goal: reads see unflushed data; only flushed data survives DropAll.
        let dev = CrashDevice::new(1 << 20);
        dev.write_at(&block(1, 4096), 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&block(2, 4096), 0).unwrap();
        dev.write_at(&block(3, 4096), 8192).unwrap();
        assert_eq!(read(&dev, 0, 4096), block(2, 4096));
        assert_eq!(dev.unflushed_writes(), 2);
        assert_eq!((dev.writes(), dev.flushes()), (3, 1));
        let image = dev.power_cut(CrashMode::DropAll, 7);
        assert_eq!(image.len(), 1 << 20);
        assert_eq!(&image[0..4096], &block(1, 4096)[..]);
        assert_eq!(&image[8192..12288], &block(0, 4096)[..]);
        // After the cut everything fails.
        assert!(dev.read_at(&mut [0u8; 512], 0).is_err());
        assert!(dev.write_at(&[0u8; 512], 0).is_err());
        assert!(dev.flush().is_err());
        // A restarted device sees the durable image.
        let dev2 = CrashDevice::from_image(image);
        assert_eq!(read(&dev2, 0, 4096), block(1, 4096));
    }

    #[test]
    fn crash_keep_random_subset_keeps_whole_writes() {
        // Goal: every write is kept whole or dropped whole, both outcomes occur across
        // seeds, and the same seed gives the same image.
        let mut kept_counts = [0usize; 2];
        for seed in 0..20 {
            let dev = CrashDevice::new(64 * 1024);
            for i in 0..8u8 {
                dev.write_at(&block(i + 1, 4096), i as u64 * 4096).unwrap();
            }
            let image = dev.power_cut(CrashMode::KeepRandomSubset, seed);
            for i in 0..8usize {
                let chunk = &image[i * 4096..(i + 1) * 4096];
                let kept = chunk == &block(i as u8 + 1, 4096)[..];
                assert!(kept || chunk == &block(0, 4096)[..], "write {i} partially applied");
                kept_counts[kept as usize] += 1;
            }
            let dev = CrashDevice::new(64 * 1024);
            for i in 0..8u8 {
                dev.write_at(&block(i + 1, 4096), i as u64 * 4096).unwrap();
            }
            assert_eq!(dev.power_cut(CrashMode::KeepRandomSubset, seed), image, "replayable");
        }
        assert!(kept_counts[0] > 20 && kept_counts[1] > 20, "{kept_counts:?}");
    }

    #[test]
    fn crash_overlapping_writes_undo_correctly() {
        // Goal: undo of overlapping unflushed writes restores the durable bytes exactly.
        let dev = CrashDevice::new(16 * 1024);
        dev.write_at(&block(9, 16 * 1024), 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&block(1, 8192), 0).unwrap();
        dev.write_at(&block(2, 8192), 4096).unwrap();
        dev.write_at(&block(3, 512), 1024).unwrap();
        assert_eq!(dev.power_cut(CrashMode::DropAll, 1), block(9, 16 * 1024));
    }

    #[test]
    fn crash_tear_last_applies_sector_prefix() {
        // Goal: only the last write survives, as a strict prefix of whole sectors.
        let mut seen_prefixes = std::collections::BTreeSet::new();
        for seed in 0..30 {
            let dev = CrashDevice::new(64 * 1024);
            dev.write_at(&block(1, 4096), 0).unwrap();
            dev.write_at(&block(2, 8192), 16384).unwrap();
            let image = dev.power_cut(CrashMode::TearLast, seed);
            assert_eq!(&image[0..4096], &block(0, 4096)[..]);
            let region = &image[16384..16384 + 8192];
            let prefix = region.iter().take_while(|&&b| b == 2).count();
            assert_eq!(prefix % TORN_SECTOR_BYTES, 0);
            assert!(prefix < 8192, "torn write must not be complete");
            assert!(region[prefix..].iter().all(|&b| b == 0));
            seen_prefixes.insert(prefix);
        }
        assert!(seen_prefixes.len() > 3, "{seen_prefixes:?}");
    }

    #[test]
    fn crash_after_writes_cuts_at_nth_write() {
        // Goal: the n-th write fails, earlier ones behave normally, the image is there.
        let dev = CrashDevice::new(64 * 1024);
        dev.crash_after_writes(3, CrashMode::DropAll, 0);
        dev.write_at(&block(1, 4096), 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&block(2, 4096), 4096).unwrap();
        assert!(!dev.has_crashed());
        assert!(dev.write_at(&block(3, 4096), 8192).is_err());
        assert!(dev.has_crashed());
        assert!(dev.write_at(&block(4, 4096), 12288).is_err());
        let image = dev.crashed_image().expect("image after automatic crash");
        assert_eq!(&image[0..4096], &block(1, 4096)[..]);
        assert_eq!(&image[4096..8192], &block(0, 4096)[..]);
        assert_eq!(&image[8192..12288], &block(0, 4096)[..]);
        assert!(dev.crashed_image().is_none());
        assert_eq!(dev.writes(), 2);
    }

    #[test]
    fn crash_many_iterations_are_cheap() {
        // Goal: 200 create/write/cut cycles of a 64 MiB device finish quickly (the crash
        // test suites run ~1000 of these).
        let start = std::time::Instant::now();
        for seed in 0..200 {
            let dev = CrashDevice::new(64 << 20);
            for i in 0..32u64 {
                dev.write_at(&[i as u8; 4096], i * 1_000_000 % (64 << 20)).unwrap();
            }
            let image = dev.power_cut(CrashMode::KeepRandomSubset, seed);
            assert_eq!(image.len(), 64 << 20);
        }
        assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
    }

    #[test]
    fn crash_torn_reordered_tears_one_and_keeps_whole_others() {
        // Goal: exactly one write may be partial (a sector prefix), every other one is
        // whole or absent, and across seeds the torn one is not always the last.
        let mut torn_positions = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let dev = CrashDevice::new(64 * 1024);
            for i in 0..6u8 {
                dev.write_at(&block(i + 1, 4096), i as u64 * 8192).unwrap();
            }
            let image = dev.power_cut(CrashMode::TornReordered, seed);
            let mut partial = 0;
            for i in 0..6usize {
                let chunk = &image[i * 8192..i * 8192 + 4096];
                let prefix = chunk.iter().take_while(|&&b| b == i as u8 + 1).count();
                assert!(chunk[prefix..].iter().all(|&b| b == 0), "write {i} is not a prefix");
                assert_eq!(prefix % TORN_SECTOR_BYTES, 0);
                if prefix != 0 && prefix != 4096 {
                    partial += 1;
                    torn_positions.insert(i);
                }
            }
            assert!(partial <= 1, "seed {seed}: {partial} torn writes");
        }
        assert!(torn_positions.len() > 2, "{torn_positions:?}");
    }

    #[test]
    fn flush_eio_loses_covered_writes_once() {
        // Goal: the failing flush loses exactly the writes it covered (reads see the old
        // bytes at once), the next flush works and makes later writes durable.
        let dev = CrashDevice::new(64 * 1024);
        dev.write_at(&block(1, 4096), 0).unwrap();
        dev.flush().unwrap();
        dev.arm(DeviceFault::FlushEio { nth: 0, keep_cached: false });
        dev.write_at(&block(2, 4096), 0).unwrap();
        dev.write_at(&block(3, 4096), 4096).unwrap();
        assert_eq!(dev.flush().unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(read(&dev, 0, 4096), block(1, 4096), "dropped pages are gone");
        assert_eq!(read(&dev, 4096, 4096), block(0, 4096));
        dev.write_at(&block(4, 4096), 8192).unwrap();
        dev.flush().unwrap();
        let image = dev.power_cut(CrashMode::KeepRandomSubset, 1);
        assert_eq!(&image[0..4096], &block(1, 4096)[..]);
        assert_eq!(&image[4096..8192], &block(0, 4096)[..]);
        assert_eq!(&image[8192..12288], &block(4, 4096)[..]);
        assert_eq!(dev.fired().flush_eio, 1);
    }

    #[test]
    fn flush_eio_keep_cached_reads_new_but_cut_loses_them() {
        // Goal: with the page cache kept, reads see the lost writes, a later honest flush
        // makes later writes durable under and over them, and every cut mode loses
        // exactly the lost ones.
        for (seed, mode) in [(1, CrashMode::DropAll), (2, CrashMode::KeepRandomSubset), (3, CrashMode::TornReordered)] {
            let dev = CrashDevice::new(64 * 1024);
            dev.write_at(&block(9, 16384), 0).unwrap();
            dev.flush().unwrap();
            dev.arm(DeviceFault::FlushEio { nth: 0, keep_cached: true });
            dev.write_at(&block(2, 8192), 0).unwrap();
            assert!(dev.flush().is_err());
            assert_eq!(read(&dev, 0, 8192), block(2, 8192), "still cached");
            dev.write_at(&block(5, 4096), 4096).unwrap();
            dev.flush().unwrap();
            let image = dev.power_cut(mode, seed);
            assert_eq!(&image[0..4096], &block(9, 4096)[..], "{mode:?}: lost write must not survive");
            assert_eq!(&image[4096..8192], &block(5, 4096)[..], "{mode:?}: flushed write must survive");
            assert_eq!(&image[8192..16384], &block(9, 8192)[..]);
        }
    }

    #[test]
    fn lying_flush_keeps_nothing_durable_until_honest() {
        // Goal: lying flushes return Ok and leave the writes to the cut's mode; the first
        // honest flush makes everything durable.
        let dev = CrashDevice::new(64 * 1024);
        dev.arm(DeviceFault::LyingFlush { first: 0, until: 2 });
        dev.write_at(&block(1, 4096), 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&block(2, 4096), 4096).unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.unflushed_writes(), 2);
        assert_eq!(dev.fired().lied_flushes, 2);
        let dev2 = CrashDevice::new(64 * 1024);
        dev2.arm(DeviceFault::LyingFlush { first: 0, until: 1 });
        dev2.write_at(&block(1, 4096), 0).unwrap();
        dev2.flush().unwrap();
        dev2.write_at(&block(2, 4096), 4096).unwrap();
        dev2.flush().unwrap();
        assert_eq!(dev2.unflushed_writes(), 0);
        assert_eq!(dev.power_cut(CrashMode::DropAll, 0), block(0, 64 * 1024), "lies: nothing durable");
        let image = dev2.power_cut(CrashMode::DropAll, 0);
        assert_eq!(&image[0..8192], &[block(1, 4096), block(2, 4096)].concat()[..]);
    }

    #[test]
    fn misdirected_write_lands_elsewhere() {
        // Goal: the misdirected write changes the wrong place only; its target keeps old
        // bytes; later writes are normal.
        let dev = CrashDevice::new(64 * 1024);
        dev.arm(DeviceFault::Misdirect { nth: 1, to: 32768 });
        dev.write_at(&block(1, 4096), 0).unwrap();
        dev.write_at(&block(2, 4096), 4096).unwrap();
        dev.write_at(&block(3, 4096), 8192).unwrap();
        assert_eq!(read(&dev, 4096, 4096), block(0, 4096));
        assert_eq!(read(&dev, 32768, 4096), block(2, 4096));
        assert_eq!(read(&dev, 8192, 4096), block(3, 4096));
        assert_eq!(dev.fired().misdirected, 1);
    }

    #[test]
    fn write_eio_window_and_vanish() {
        // Goal: writes in the window fail and change nothing; after a vanish every I/O
        // fails with ENXIO and the cut returns only what was flushed.
        let dev = CrashDevice::new(64 * 1024);
        dev.arm(DeviceFault::WriteEio { nth: 1, count: 2 });
        dev.arm(DeviceFault::Vanish { nth: 5 });
        dev.write_at(&block(1, 4096), 0).unwrap();
        assert!(dev.write_at(&block(2, 4096), 4096).is_err());
        assert!(dev.write_at(&block(2, 4096), 4096).is_err());
        dev.write_at(&block(3, 4096), 8192).unwrap();
        dev.flush().unwrap();
        dev.write_at(&block(4, 4096), 12288).unwrap();
        assert_eq!(dev.write_at(&block(5, 4096), 0).unwrap_err().raw_os_error(), Some(libc::ENXIO));
        assert_eq!(dev.read_at(&mut [0u8; 512], 0).unwrap_err().raw_os_error(), Some(libc::ENXIO));
        assert!(dev.flush().is_err());
        assert!(dev.vanished());
        let image = dev.power_cut(CrashMode::KeepRandomSubset, 3);
        assert_eq!(&image[0..4096], &block(1, 4096)[..]);
        assert_eq!(&image[4096..8192], &block(0, 4096)[..]);
        assert_eq!(&image[8192..12288], &block(3, 4096)[..]);
        assert_eq!(&image[12288..16384], &block(0, 4096)[..], "unflushed at the vanish: lost");
        assert_eq!(dev.fired().write_eio, 2);
    }

    #[test]
    fn out_of_range_is_an_error() {
        let dev = CrashDevice::new(4096);
        assert!(dev.write_at(&[0u8; 512], 4096 - 256).is_err());
        assert!(dev.read_at(&mut [0u8; 512], u64::MAX - 10).is_err());
        let mem = MemDevice::new(4096);
        assert!(mem.write_at(&[0u8; 512], 4000).is_err());
    }

    #[test]
    fn fault_injection_switches() {
        // Goal: each switch fails only its direction, with the right errno, and counts.
        let inner: Arc<dyn Device> = Arc::new(MemDevice::new(1 << 20));
        let dev = FaultDevice::new(inner.clone());
        dev.write_at(&block(5, 4096), 0).unwrap();
        dev.fail_reads(true);
        assert_eq!(dev.read_at(&mut [0u8; 512], 0).unwrap_err().raw_os_error(), Some(libc::EIO));
        dev.write_at(&block(6, 512), 0).unwrap();
        dev.fail_reads(false);
        dev.fail_writes(true);
        assert!(dev.write_at(&block(7, 512), 0).is_err());
        assert_eq!(read(&dev, 0, 512), block(6, 512));
        dev.fail_flush(true);
        assert!(dev.flush().is_err());
        dev.clear();
        dev.flush().unwrap();
        dev.fail_reads_in(8192..12288);
        assert!(dev.read_at(&mut [0u8; 4096], 4096 + 512).is_err());
        assert!(dev.read_at(&mut [0u8; 4096], 4096).is_ok(), "ends exactly at the range");
        assert!(dev.read_at(&mut [0u8; 4096], 12288).is_ok());
        dev.offline(true);
        assert_eq!(dev.read_at(&mut [0u8; 512], 0).unwrap_err().raw_os_error(), Some(libc::ENXIO));
        assert!(dev.write_at(&[0u8; 512], 0).is_err());
        dev.clear();
        let c = dev.counts();
        assert_eq!((c.read_errors, c.write_errors, c.flush_errors, c.offline_errors), (2, 1, 1, 2));
    }

    #[test]
    fn fault_corrupt_is_silent() {
        // Goal: corruption changes the bytes without any error, replayably.
        let inner: Arc<dyn Device> = Arc::new(MemDevice::new(1 << 20));
        let dev = FaultDevice::new(inner.clone());
        dev.write_at(&block(5, 8192), 0).unwrap();
        dev.corrupt(1024, 512, 42).unwrap();
        let got = read(&dev, 0, 8192);
        assert_eq!(&got[..1024], &block(5, 1024)[..]);
        assert_ne!(&got[1024..1536], &block(5, 512)[..]);
        assert_eq!(&got[1536..], &block(5, 8192 - 1536)[..]);
        let first = got[1024..1536].to_vec();
        dev.corrupt(1024, 512, 42).unwrap();
        assert_eq!(read(&dev, 1024, 512), first);
        assert_eq!(dev.counts().corruptions, 2);
    }

    #[test]
    fn mem_device_round_trip() {
        let dev = MemDevice::new(1 << 16);
        dev.write_at(&block(3, 1000), 17).unwrap();
        assert_eq!(read(&dev, 17, 1000), block(3, 1000));
        assert_eq!(dev.size(), 1 << 16);
    }
}
