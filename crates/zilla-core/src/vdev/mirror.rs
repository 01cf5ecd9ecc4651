//! mirror: top-level vdevs (a single disk is a one-child mirror) and their leaves.
//!
//! Theory of operation
//! -------------------
//! A [`TopVdev`] owns 1..N [`Leaf`]s holding identical copies of every block written to
//! it. Writes go to every writable child; a write succeeds when at least one child took
//! it. A child that is offline, faulted or fails the write is *missing* that txg: the txg
//! is added to the child's DTL ("dirty time log", a list of txg ranges), and resilver
//! later copies exactly those txgs' blocks to it.
//!
//! Reads choose the least-loaded readable child (vdev_mirror.c): load = queued+active
//! I/Os plus a locality increment (0 when the read starts where the child's last I/O
//! ended; on rotating media 2 when within 1 MiB, 5 otherwise; on SSDs 1 when not
//! sequential). Ties go to child `(offset >> 21) % ties` so a sequential run stays on one
//! child. Children whose DTL covers the block's birth txg are skipped unless nothing else
//! is left. Every copy read is verified by the caller's `verify` closure (the checksum from
//! the block pointer); on an I/O error or a mismatch the next child is tried and, once a
//! good copy is found, every child that failed is rewritten from it (self-heal). A child
//! that returned good data is never rewritten.
//!
//! Scrub reads every readable child, verifies each copy and repairs the bad ones.
//!
//! Error counters (READ / WRITE / CKSUM of `zpool status`) are per leaf, atomics.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::queue::LeafQueue;
use super::{Device, IoClass, LeafSpec, Role};
use super::{
    ZFS_VDEV_MIRROR_NON_ROTATING_INC as NON_ROTATING_INC, ZFS_VDEV_MIRROR_NON_ROTATING_SEEK_INC as NON_ROTATING_SEEK_INC,
    ZFS_VDEV_MIRROR_ROTATING_INC as ROTATING_INC, ZFS_VDEV_MIRROR_ROTATING_SEEK_INC as ROTATING_SEEK_INC,
    ZFS_VDEV_MIRROR_ROTATING_SEEK_OFFSET as ROTATING_SEEK_OFFSET,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LeafState {
    Online = 0,
    Offline = 1,
    Faulted = 2,
    Unavail = 3,
}

impl LeafState {
    fn from_u8(v: u8) -> LeafState {
        match v {
            0 => LeafState::Online,
            1 => LeafState::Offline,
            2 => LeafState::Faulted,
            _ => LeafState::Unavail,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            LeafState::Online => "ONLINE",
            LeafState::Offline => "OFFLINE",
            LeafState::Faulted => "FAULTED",
            LeafState::Unavail => "UNAVAIL",
        }
    }
}

/// One physical device of the pool.
pub struct Leaf {
    pub guid: u64,
    pub spec: LeafSpec,
    pub queue: LeafQueue,
    state: AtomicU8,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub cksum_errors: AtomicU64,
    /// Txg ranges [first, last] this child is missing (needs resilver).
    dtl: Mutex<Vec<(u64, u64)>>,
    /// I/O errors since the last success: too many fault the leaf (zfs-diagnosis style).
    consecutive_errors: std::sync::atomic::AtomicU32,
}

/// A leaf with this many I/O errors in a row, or one that reports ENXIO (gone), is
/// FAULTED while a sibling can still serve: it stops receiving I/O and accumulates a
/// DTL; `zilla pool clear` or `online` brings it back and resilvers what it missed.
pub const FAULT_AFTER_CONSECUTIVE_ERRORS: u32 = 10;

/// Mirror writes at least this large are issued to the children in parallel.
pub const PARALLEL_CHILD_WRITE_BYTES: usize = 64 << 10;

impl Leaf {
    pub fn new(guid: u64, spec: LeafSpec, dev: Arc<dyn Device>) -> Leaf {
        Leaf {
            guid,
            spec,
            queue: LeafQueue::new(dev),
            state: AtomicU8::new(LeafState::Online as u8),
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            cksum_errors: AtomicU64::new(0),
            dtl: Mutex::new(Vec::new()),
            consecutive_errors: std::sync::atomic::AtomicU32::new(0),
        }
    }

    fn note_ok(&self) {
        if self.consecutive_errors.load(Ordering::Relaxed) != 0 {
            self.consecutive_errors.store(0, Ordering::Relaxed);
        }
    }
    pub fn device(&self) -> &Arc<dyn Device> {
        self.queue.device()
    }
    pub fn state(&self) -> LeafState {
        LeafState::from_u8(self.state.load(Ordering::Acquire))
    }
    pub fn set_state(&self, s: LeafState) {
        self.state.store(s as u8, Ordering::Release)
    }
    pub fn readable(&self) -> bool {
        self.state() == LeafState::Online
    }
    pub fn dtl(&self) -> Vec<(u64, u64)> {
        self.dtl.lock().clone()
    }
    pub fn set_dtl(&self, d: Vec<(u64, u64)>) {
        *self.dtl.lock() = d;
    }
    pub fn dtl_add(&self, txg: u64) {
        let mut d = self.dtl.lock();
        if let Some(last) = d.last_mut() {
            if txg >= last.0 && txg <= last.1 + 1 {
                last.1 = last.1.max(txg);
                return;
            }
        }
        d.push((txg, txg));
    }
    pub fn dtl_contains(&self, txg: u64) -> bool {
        self.dtl.lock().iter().any(|&(a, b)| txg >= a && txg <= b)
    }
    pub fn dtl_empty(&self) -> bool {
        self.dtl.lock().is_empty()
    }
    pub fn clear_errors(&self) {
        self.read_errors.store(0, Ordering::Relaxed);
        self.write_errors.store(0, Ordering::Relaxed);
        self.cksum_errors.store(0, Ordering::Relaxed);
    }
}

/// Result of a verified read: the data plus repair bookkeeping.
pub struct MirrorRead {
    pub data: Vec<u8>,
    pub repaired_bytes: u64,
}

/// Outcome of a scrub of one block on one top-level vdev.
#[derive(Debug, Default, Clone, Copy)]
pub struct ScrubOutcome {
    pub repaired_bytes: u64,
    pub bad_copies: u32,
    pub unrecoverable: bool,
}

pub struct TopVdev {
    pub id: u32,
    pub guid: u64,
    pub role: Role,
    pub is_mirror: bool,
    pub ashift: u8,
    pub children: parking_lot::RwLock<Vec<Arc<Leaf>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyResult {
    Good,
    Bad,
}

impl TopVdev {
    /// Count an I/O error on `c` and fault it if it looks dead and a sibling is healthy.
    fn note_error(&self, c: &Leaf, e: &io::Error) {
        let n = c.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
        let gone = e.raw_os_error() == Some(libc::ENXIO);
        if (gone || n >= FAULT_AFTER_CONSECUTIVE_ERRORS) && c.state() == LeafState::Online {
            let sibling_ok = self.children.read().iter().any(|o| o.guid != c.guid && o.readable());
            if sibling_ok {
                c.set_state(LeafState::Faulted);
                tracing::warn!(device = %c.spec.display(), errors = n, "device faulted after I/O errors: {e}");
            }
        }
    }

    pub fn children(&self) -> Vec<Arc<Leaf>> {
        self.children.read().clone()
    }

    /// Usable bytes for allocation: the smallest child, minus the label areas. Children
    /// missing at import (size 0) do not count, or a degraded mirror would have no space.
    pub fn asize(&self) -> u64 {
        let min = self.children.read().iter().map(|c| c.device().size()).filter(|&s| s > 0).min().unwrap_or(0);
        super::label::usable_end(min).saturating_sub(super::label::DATA_START)
    }

    pub fn state_name(&self) -> &'static str {
        let ch = self.children.read();
        let online = ch.iter().filter(|c| c.readable()).count();
        if online == ch.len() {
            if ch.iter().any(|c| !c.dtl_empty()) { "DEGRADED" } else { "ONLINE" }
        } else if online == 0 {
            "UNAVAIL"
        } else {
            "DEGRADED"
        }
    }

    /// Write `buf` at data offset `offset` (relative to DATA_START) on every writable child.
    /// Children that miss it get `txg` in their DTL. Ok if at least one child succeeded.
    /// Large writes go to the children in parallel (one device latency, not N).
    pub fn write(&self, class: IoClass, buf: &[u8], offset: u64, txg: u64) -> io::Result<()> {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let mut writable: Vec<&Arc<Leaf>> = Vec::with_capacity(children.len());
        for c in &children {
            if c.readable() {
                writable.push(c);
            } else {
                c.dtl_add(txg);
            }
        }
        let one = |c: &Leaf| -> io::Result<()> {
            match c.queue.write(class, buf, phys) {
                Ok(()) => {
                    c.note_ok();
                    Ok(())
                }
                Err(e) => {
                    c.write_errors.fetch_add(1, Ordering::Relaxed);
                    c.dtl_add(txg);
                    self.note_error(c, &e);
                    Err(e)
                }
            }
        };
        let results: Vec<io::Result<()>> = if writable.len() > 1 && buf.len() >= PARALLEL_CHILD_WRITE_BYTES {
            std::thread::scope(|s| {
                let handles: Vec<_> = writable[1..].iter().map(|c| s.spawn(|| one(c))).collect();
                let mut out = vec![one(writable[0])];
                for h in handles {
                    out.push(h.join().unwrap_or_else(|_| Err(io::Error::other("mirror child writer panicked"))));
                }
                out
            })
        } else {
            writable.iter().map(|c| one(c)).collect()
        };
        let mut last_err = None;
        let mut ok = 0;
        for r in results {
            match r {
                Ok(()) => ok += 1,
                Err(e) => last_err = Some(e),
            }
        }
        if ok > 0 {
            Ok(())
        } else {
            Err(last_err.unwrap_or_else(|| io::Error::new(io::ErrorKind::Other, "no writable device in vdev")))
        }
    }

    fn load_of(&self, c: &Leaf, offset: u64) -> u64 {
        let rotating = c.device().rotational();
        let last = c.queue.last_offset();
        let inc = if last == offset {
            if rotating { ROTATING_INC.get() } else { NON_ROTATING_INC.get() }
        } else if rotating {
            let seek_inc = ROTATING_SEEK_INC.get();
            if last.abs_diff(offset) <= ROTATING_SEEK_OFFSET.get() { seek_inc / 2 } else { seek_inc }
        } else {
            NON_ROTATING_SEEK_INC.get()
        };
        c.queue.pending() as u64 + inc
    }

    /// Order in which to try the children for a read at `offset` of a block born in `birth`.
    fn read_order(&self, children: &[Arc<Leaf>], phys: u64, birth: u64) -> Vec<usize> {
        let mut fresh: Vec<(u64, usize)> = Vec::new();
        let mut stale: Vec<usize> = Vec::new();
        for (i, c) in children.iter().enumerate() {
            if !c.readable() {
                continue;
            }
            if c.dtl_contains(birth) {
                stale.push(i);
            } else {
                fresh.push((self.load_of(c, phys), i));
            }
        }
        let mut order = Vec::with_capacity(children.len());
        if let Some(min) = fresh.iter().map(|f| f.0).min() {
            let ties: Vec<usize> = fresh.iter().filter(|f| f.0 == min).map(|f| f.1).collect();
            let pick = ties[((phys >> 21) as usize) % ties.len()];
            order.push(pick);
            let mut rest: Vec<(u64, usize)> = fresh.into_iter().filter(|f| f.1 != pick).collect();
            rest.sort();
            order.extend(rest.into_iter().map(|f| f.1));
        }
        order.extend(stale);
        order
    }

    /// Read `len` bytes at data offset `offset`, verifying each copy; self-heal bad copies.
    pub fn read_verified(
        &self,
        class: IoClass,
        offset: u64,
        len: usize,
        birth: u64,
        verify: &dyn Fn(&[u8]) -> VerifyResult,
    ) -> io::Result<MirrorRead> {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let order = self.read_order(&children, phys, birth);
        let mut failed: Vec<usize> = Vec::new();
        let mut last_err: Option<io::Error> = None;
        for &i in &order {
            let c = &children[i];
            let mut buf = vec![0u8; len];
            match c.queue.read(class, &mut buf, phys) {
                Ok(()) => {
                    if verify(&buf) == VerifyResult::Good {
                        let mut repaired = 0;
                        for &f in &failed {
                            if self.repair(&children[f], &buf, phys) {
                                repaired += len as u64;
                            }
                        }
                        return Ok(MirrorRead { data: buf, repaired_bytes: repaired });
                    }
                    c.cksum_errors.fetch_add(1, Ordering::Relaxed);
                    last_err = Some(io::Error::new(io::ErrorKind::InvalidData, "checksum mismatch"));
                    failed.push(i);
                }
                Err(e) => {
                    c.read_errors.fetch_add(1, Ordering::Relaxed);
                    self.note_error(c, &e);
                    last_err = Some(e);
                    failed.push(i);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::new(io::ErrorKind::Other, "no readable device in vdev")))
    }

    fn repair(&self, c: &Leaf, good: &[u8], phys: u64) -> bool {
        if !c.readable() {
            return false;
        }
        match c.queue.write(IoClass::AsyncWrite, good, phys) {
            Ok(()) => true,
            Err(_) => {
                c.write_errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Scrub one block: read every readable child, verify, repair bad copies from a good
    /// one. Children whose DTL covers `birth` are repaired too when good data exists
    /// (resilver).
    pub fn scrub_block(
        &self,
        offset: u64,
        len: usize,
        birth: u64,
        verify: &dyn Fn(&[u8]) -> VerifyResult,
    ) -> ScrubOutcome {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let mut good: Option<Vec<u8>> = None;
        let mut bad: Vec<usize> = Vec::new();
        let mut out = ScrubOutcome::default();
        for (i, c) in children.iter().enumerate() {
            if !c.readable() {
                continue;
            }
            let mut buf = vec![0u8; len];
            match c.queue.read(IoClass::Scrub, &mut buf, phys) {
                Ok(()) if verify(&buf) == VerifyResult::Good => {
                    if good.is_none() {
                        good = Some(buf);
                    }
                }
                Ok(()) => {
                    if !c.dtl_contains(birth) {
                        c.cksum_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    bad.push(i);
                }
                Err(e) => {
                    c.read_errors.fetch_add(1, Ordering::Relaxed);
                    self.note_error(c, &e);
                    bad.push(i);
                }
            }
        }
        out.bad_copies = bad.len() as u32;
        match good {
            Some(g) => {
                for i in bad {
                    if self.repair(&children[i], &g, phys) {
                        out.repaired_bytes += len as u64;
                    }
                }
            }
            None => out.unrecoverable = true,
        }
        out
    }

    pub fn flush(&self) -> io::Result<()> {
        let mut ok = 0;
        let mut err = None;
        for c in self.children() {
            if !c.readable() {
                continue;
            }
            match c.queue.flush() {
                Ok(()) => ok += 1,
                Err(e) => {
                    c.write_errors.fetch_add(1, Ordering::Relaxed);
                    err = Some(e)
                }
            }
        }
        if ok > 0 { Ok(()) } else { Err(err.unwrap_or_else(|| io::Error::new(io::ErrorKind::Other, "no writable device"))) }
    }
}
