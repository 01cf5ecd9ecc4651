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
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Guid, Txg};

use super::abd::AlignedBuf;
use super::queue::{IoRequest, LeafQueue};
use super::{Device, IoClass, IoError, IoErrorKind, IoOp, LeafSpec, Role};
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
    pub guid: Guid,
    pub spec: LeafSpec,
    pub queue: LeafQueue,
    state: AtomicU8,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub cksum_errors: AtomicU64,
    /// Txg ranges [first, last] this child is missing (needs resilver).
    dtl: Mutex<Vec<(Txg, Txg)>>,
    /// I/O errors since the last success: too many fault the leaf (zfs-diagnosis style).
    consecutive_errors: std::sync::atomic::AtomicU32,
}

/// A leaf with this many I/O errors in a row, or one that reports ENXIO (gone), is
/// FAULTED while a sibling can still serve: it stops receiving I/O and accumulates a
/// DTL; `zilla pool clear` or `online` brings it back and resilvers what it missed.
pub const FAULT_AFTER_CONSECUTIVE_ERRORS: u32 = 10;

impl Leaf {
    pub fn new(guid: Guid, spec: LeafSpec, dev: Arc<dyn Device>) -> Leaf {
        let queue = LeafQueue::new(dev, &spec.display());
        Leaf {
            guid,
            spec,
            queue,
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
    pub fn dtl(&self) -> Vec<(Txg, Txg)> {
        self.dtl.lock().clone()
    }
    pub fn set_dtl(&self, d: Vec<(Txg, Txg)>) {
        *self.dtl.lock() = d;
    }
    pub fn dtl_add(&self, txg: Txg) {
        let mut d = self.dtl.lock();
        if let Some(last) = d.last_mut() {
            if txg >= last.0 && txg <= last.1.next() {
                last.1 = last.1.max(txg);
                return;
            }
        }
        d.push((txg, txg));
    }
    pub fn dtl_contains(&self, txg: Txg) -> bool {
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
    pub data: AlignedBuf,
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
    pub guid: Guid,
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
    fn note_error(&self, c: &Leaf, e: &IoError) {
        let n = c.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
        let gone = e.is_gone();
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

    /// Write `data` at data offset `offset` (relative to DATA_START) on every writable
    /// child: one child request each, sharing the buffer, all in flight at once. Children
    /// that miss it (not online, or their write fails) get `txg` in their DTL. `done` runs
    /// once, on the engine thread of the last child to finish, with every child's result.
    pub fn write_async(self: &Arc<Self>, class: IoClass, data: Arc<AlignedBuf>, offset: u64, txg: Txg, done: WriteDone) {
        let phys = super::label::DATA_START + offset;
        let writable: Vec<Arc<Leaf>> = self
            .children()
            .into_iter()
            .filter(|c| {
                let ok = c.readable();
                if !ok {
                    c.dtl_add(txg);
                }
                ok
            })
            .collect();
        if writable.is_empty() {
            done(WriteOutcome { written: 0, failed: Vec::new(), len: data.len() as u64, offset: phys });
            return;
        }
        let fan = Arc::new(Fanout {
            left: AtomicU32::new(writable.len() as u32),
            outcome: Mutex::new(WriteOutcome { written: 0, failed: Vec::new(), len: data.len() as u64, offset: phys }),
            done: Mutex::new(Some(done)),
        });
        for c in writable {
            let (fan, top, leaf) = (fan.clone(), self.clone(), c.clone());
            let req = IoRequest::write(class, phys, data.clone(), Box::new(move |d| {
                // Let go of the shared buffer before the last child reports, so the
                // caller gets it back for reuse.
                let super::queue::IoDone { result, data, .. } = d;
                drop(data);
                match result {
                    Ok(()) => {
                        leaf.note_ok();
                        fan.outcome.lock().written += 1;
                    }
                    Err(e) => {
                        leaf.write_errors.fetch_add(1, Ordering::Relaxed);
                        leaf.dtl_add(txg);
                        top.note_error(&leaf, &e);
                        fan.outcome.lock().failed.push((leaf.guid, e));
                    }
                }
                fan.child_done();
            }));
            c.queue.submit(req);
        }
    }

    /// Blocking write of `buf` (copied once into an aligned buffer). Ok if at least one
    /// child wrote it.
    pub fn write(self: &Arc<Self>, class: IoClass, buf: &[u8], offset: u64, txg: Txg) -> io::Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.write_async(class, Arc::new(AlignedBuf::copy_of(buf)), offset, txg, Box::new(move |o| {
            let _ = tx.send(o);
        }));
        let o = rx.recv().map_err(|_| io::Error::other("mirror write completion lost"))?;
        o.into_result().map_err(io::Error::from)
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
    fn read_order(&self, children: &[Arc<Leaf>], phys: u64, birth: Txg) -> Vec<usize> {
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
        birth: Txg,
        verify: &dyn Fn(&[u8]) -> VerifyResult,
    ) -> io::Result<MirrorRead> {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let order = self.read_order(&children, phys, birth);
        let mut failed: Vec<usize> = Vec::new();
        let mut last_err: Option<IoError> = None;
        for &i in &order {
            let c = &children[i];
            match c.queue.read_buf(class, len, phys) {
                Ok(buf) => {
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
                    last_err = Some(IoError::checksum(&c.queue_name(), phys, len as u64));
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
        Err(last_err.map(io::Error::from).unwrap_or_else(|| io::Error::new(io::ErrorKind::Other, "no readable device in vdev")))
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
        birth: Txg,
        verify: &dyn Fn(&[u8]) -> VerifyResult,
    ) -> ScrubOutcome {
        let phys = super::label::DATA_START + offset;
        let children = self.children();
        let mut good: Option<AlignedBuf> = None;
        let mut bad: Vec<usize> = Vec::new();
        let mut out = ScrubOutcome::default();
        for (i, c) in children.iter().enumerate() {
            if !c.readable() {
                continue;
            }
            match c.queue.read_buf(IoClass::Scrub, len, phys) {
                Ok(buf) if verify(&buf) == VerifyResult::Good => {
                    if good.is_none() {
                        good = Some(buf);
                    }
                }
                Ok(_) => {
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

    /// Flush every online child (each flush waits, in its leaf's queue, for the writes
    /// submitted before it). `done` gets how many children flushed and each failure.
    pub fn flush_async(self: &Arc<Self>, done: WriteDone) {
        let online: Vec<Arc<Leaf>> = self.children().into_iter().filter(|c| c.readable()).collect();
        if online.is_empty() {
            done(WriteOutcome { written: 0, failed: Vec::new(), len: 0, offset: 0 });
            return;
        }
        let fan = Arc::new(Fanout {
            left: AtomicU32::new(online.len() as u32),
            outcome: Mutex::new(WriteOutcome { written: 0, failed: Vec::new(), len: 0, offset: 0 }),
            done: Mutex::new(Some(done)),
        });
        for c in online {
            let (fan, leaf) = (fan.clone(), c.clone());
            c.queue.submit(IoRequest::flush(Box::new(move |d| {
                match d.result {
                    Ok(()) => fan.outcome.lock().written += 1,
                    Err(e) => {
                        leaf.write_errors.fetch_add(1, Ordering::Relaxed);
                        fan.outcome.lock().failed.push((leaf.guid, e));
                    }
                }
                fan.child_done();
            })));
        }
    }

    /// Blocking flush: Ok if at least one online child flushed.
    pub fn flush(self: &Arc<Self>) -> io::Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.flush_async(Box::new(move |o| {
            let _ = tx.send(o);
        }));
        let o = rx.recv().map_err(|_| io::Error::other("mirror flush completion lost"))?;
        if o.written > 0 {
            return Ok(());
        }
        Err(o.failed.into_iter().next().map(|(_, e)| e.to_io()).unwrap_or_else(|| io::Error::other("no writable device")))
    }
}

/// Called once with the combined result of a mirror write or flush.
pub type WriteDone = Box<dyn FnOnce(WriteOutcome) + Send>;

/// What a mirror write (or flush) did on its children: errors are values, so a caller
/// can record which child missed which txg.
#[derive(Debug)]
pub struct WriteOutcome {
    /// Children that completed it.
    pub written: u32,
    /// Children that failed it, by guid, with the error.
    pub failed: Vec<(Guid, IoError)>,
    pub len: u64,
    /// Physical offset on the children.
    pub offset: u64,
}

impl WriteOutcome {
    /// Ok if at least one child holds the data (the others are in their DTLs).
    pub fn into_result(self) -> Result<(), IoError> {
        if self.written > 0 {
            return Ok(());
        }
        Err(self.failed.into_iter().next().map(|(_, e)| e).unwrap_or(IoError {
            device: "mirror".into(),
            op: IoOp::Write,
            offset: self.offset,
            len: self.len,
            kind: IoErrorKind::Io,
            errno: Some(libc::ENXIO),
            detail: "no writable device in vdev".into(),
        }))
    }
}

/// Combines the children's completions of one mirror request.
struct Fanout {
    left: AtomicU32,
    outcome: Mutex<WriteOutcome>,
    done: Mutex<Option<WriteDone>>,
}

impl Fanout {
    fn child_done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let o = std::mem::replace(&mut *self.outcome.lock(), WriteOutcome { written: 0, failed: Vec::new(), len: 0, offset: 0 });
            if let Some(done) = self.done.lock().take() {
                done(o);
            }
        }
    }
}

impl Leaf {
    fn queue_name(&self) -> Arc<str> {
        self.spec.display().into()
    }
}
