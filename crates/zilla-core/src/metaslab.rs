//! metaslab: space allocation per top-level vdev, deferred frees.
//!
//! Theory of operation
//! -------------------
//! Each top-level vdev's data area is one range tree of *free* extents
//! (`BTreeMap<start, len>`, adjacent extents always merged). Allocation is first-fit
//! from a cursor that follows the last allocation, so a txg's blocks land next to each
//! other and the sync can aggregate them into large writes (OpenZFS "dynamic fit").
//!
//! Space is kept per allocation class (normal: the data vdevs; log: the SLOG vdevs),
//! each class behind its own lock, so the intent log can allocate log blocks while a
//! txg sync allocates data blocks. Within a class, data is striped across its top-level
//! vdevs with a rotor that moves to the next vdev every `metaslab_aliquot` bytes
//! (512 KiB), skipping full ones.
//!
//! The embedded log region (OpenZFS 2.1's embedded log class, one metaslab of each
//! normal vdev kept for the intent log). With no log vdevs, or when they are full or
//! failing, intent-log blocks are allocated from the normal class; mixed in with data
//! they fragment its free space, and on a leaf that is a sparse file each log write
//! lands on space the host file system has never allocated, so every commit waits
//! for a host journal commit on every child (the slog scenario's plain-file pool). So each
//! normal vdev keeps its first `vdev::embedded_log_bytes` (1/16 of it, at most 512 MiB)
//! for log blocks: they are allocated there first, next-fit with a cursor of their
//! own, so the region cycles as the txgs free old chains; data blocks start after it.
//! The region is a preference, not a partition: a log block that finds no room there
//! goes to the data area, and a data block that finds none in the data area goes to
//! the region, so the class's free space means what it did and a nearly full pool
//! fills the region too. Nothing of it is on disk: the region is a function of the
//! vdev's size, any block may live anywhere, and pools from before it import as they
//! are. A plain-file leaf has the region's holes filled once the pool owns it
//! (`vdev::fill_log_region`, tunable `zilla_log_region_fill`).
//!
//! Frees are deferred: a block freed in txg T goes to `defer[T]`, and once T+2 has
//! committed it returns to the free tree (TXG_DEFER_SIZE = 2: the trees of the newest
//! uberblock and of the two before it stay intact on disk; a block freed in T is still
//! in T-1's tree, and T+2 is the newest when it is released).
//!
//! Awaited frees. A pool that goes idle right after a change would leave that change's
//! frees deferred for as long as no txg syncs, and FREE would not show them. So a
//! sync whose txg freed anything besides its own rewrite of the object directory
//! marks the txg awaited (`await_release`), and while an awaited defer list is not
//! yet released the pool keeps syncing, empty txgs at the `zfs_txg_timeout` pace
//! (`frees_awaited`, spa's idle decision). The object directory's own frees are not
//! awaited: every sync makes some, and awaiting them would keep an idle pool syncing
//! for ever; they are released with the next change. At import every loaded defer
//! list is awaited.
//!
//! A sync that fails is undone exactly: every allocation made for the txg being synced
//! goes on that sync's undo list (`begin_sync` .. `end_sync` / `undo_sync`), and the
//! frees it deferred are cut back to the mark taken when it began. Nothing else is
//! rolled back, so allocations made meanwhile outside the sync (log blocks) survive.
//!
//! The journal (format 2). A format 2 pool's space maps are logs a txg appends to
//! (space_map.rs), so the allocator notes, per class and in order, every allocation
//! and every immediate free since the last cut: sync and open-context allocations,
//! import claims, a log block once its referrer is durable (never before, nor the
//! free of one that never was), `free_now`, `free_unused`, and the frees of an undone
//! sync. Deferred frees are not noted: the sync appends them from the defer lists (in
//! T's sync, T − 2's) just before they are released. A sync takes the journal at its
//! cut ([`Metaslabs::take_journal`]) and a failed attempt gives it back
//! ([`Metaslabs::restore_journal`]). Bounded by one txg's allocations.
//!
//! Invariants (asserted): an extent is never freed twice, never allocated twice, and
//! `allocated + free == size` for every vdev. The persisted form (in the MOS) is the
//! list of allocated extents per vdev plus the defer lists; see docs/on-disk-format.md.

mod frag;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::vdev::{embedded_log_bytes, Role};
#[cfg(test)]
use crate::vdev::EMBEDDED_LOG_MAX_BYTES;
use crate::block::blkptr::Dva;
use crate::kstat::{Applies, Tunable};
use crate::{Error, Result, Txg, VdevId};

pub const TXG_DEFER_SIZE: u64 = 2;
pub const METASLAB_ALIQUOT: u64 = 512 << 10;

/// Where a vdev's allocator starts its search. 0 (the default): after its last
/// allocation (next-fit, so a txg's blocks land side by side). 1: at the start of the
/// vdev (first-fit), so space is reused as soon as the defer window releases it. The
/// crash test switches it on in some boots: with next-fit a freed block is reused only
/// after the cursor wraps, so a defer window one txg too short would go unseen there.
pub static ZILLA_METASLAB_FIRST_FIT: Tunable = Tunable::new(
    "zilla_metaslab_first_fit",
    0,
    0,
    1,
    Applies::Live,
    "1: allocate from the lowest free offset (reuse freed space at once; for tests)",
);

/// What an allocation is for: where in a vdev it looks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Blocks of the txg's tree (and dmu_sync's blocks, which join it): the data area
    /// first, the embedded log region last.
    Data,
    /// Intent-log blocks (lwbs): the embedded log region first.
    IntentLog,
}

#[derive(Debug, Clone)]
pub struct RangeAllocator {
    pub size: u64,
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
    /// Free bytes a manual trim has out of the tree while it discards them: not
    /// allocatable, but not allocated either (space admission must not see a pool
    /// fill up for the length of a trim step and refuse writes).
    trimming_bytes: u64,
    /// `[0, log_end)` is the embedded log region (0: none).
    log_end: u64,
    /// Next-fit cursors: the data area's (in `[log_end, size]`) and the region's (in
    /// `[0, log_end]`).
    cursor: u64,
    log_cursor: u64,
}

impl RangeAllocator {
    pub fn new(size: u64) -> RangeAllocator {
        RangeAllocator::with_log_region(size, 0)
    }

    /// An allocator whose first `log_bytes` are the embedded log region.
    pub fn with_log_region(size: u64, log_bytes: u64) -> RangeAllocator {
        assert!(log_bytes <= size / 2, "log region {log_bytes} of a {size}-byte vdev");
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        RangeAllocator { size, free, free_bytes: size, trimming_bytes: 0, log_end: log_bytes, cursor: log_bytes, log_cursor: 0 }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }
    pub fn allocated_bytes(&self) -> u64 {
        self.size - self.free_bytes - self.trimming_bytes
    }
    /// Number of free extents.
    pub fn free_extents(&self) -> usize {
        self.free.len()
    }

    /// This vdev's free-space fragmentation in percent, as OpenZFS computes it
    /// (frag.rs); None when nothing is free.
    pub fn fragmentation(&self) -> Option<u64> {
        frag::vdev_fragmentation(self.size, self.free.iter().map(|(&at, &len)| (at, len)))
    }

    /// Allocate `len` bytes of data (the data area first).
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        self.alloc_for(len, Purpose::Data)
    }

    /// Allocate `len` bytes for `purpose`: next-fit in its own area, then the other.
    pub fn alloc_for(&mut self, len: u64, purpose: Purpose) -> Option<u64> {
        assert!(len > 0);
        let first_fit = ZILLA_METASLAB_FIRST_FIT.get() == 1;
        let (data, log) = ((self.log_end, self.size, false), (0, self.log_end, true));
        let order = match purpose {
            Purpose::Data => [data, log],
            Purpose::IntentLog => [log, data],
        };
        for (lo, hi, is_log) in order {
            if hi - lo < len {
                continue;
            }
            let cursor = if first_fit { lo } else if is_log { self.log_cursor } else { self.cursor };
            let Some(at) = self.find_free(len, lo, hi, cursor.clamp(lo, hi)) else { continue };
            debug_assert!(lo <= at && at + len <= hi);
            self.remove_range(at, len);
            if is_log {
                self.log_cursor = at + len;
            } else {
                self.cursor = at + len;
            }
            return Some(at);
        }
        None
    }

    /// The first `len` free bytes within `[lo, hi)` at or after `from`, else the first
    /// from `lo` on (next-fit with wrap-around).
    fn find_free(&self, len: u64, lo: u64, hi: u64, from: u64) -> Option<u64> {
        for start in [from, lo] {
            // the free extent holding `start`, then those after it, clipped to the area
            let holding = self.free.range(..start).next_back().filter(|(&s, &l)| s + l > start);
            let found = holding
                .into_iter()
                .chain(self.free.range(start..hi))
                .map(|(&s, &l)| (s.max(start), (s + l).min(hi)))
                .find(|&(a, b)| b >= a + len);
            if let Some((a, _)) = found {
                return Some(a);
            }
            if start == lo {
                break;
            }
        }
        None
    }

    fn remove_range(&mut self, at: u64, len: u64) {
        let (&s, &l) = self.free.range(..=at).next_back().expect("range is free");
        assert!(s <= at && at + len <= s + l, "allocating non-free range {at}+{len}");
        self.free.remove(&s);
        if s < at {
            self.free.insert(s, at - s);
        }
        if at + len < s + l {
            self.free.insert(at + len, s + l - (at + len));
        }
        self.free_bytes -= len;
    }

    /// Free bytes that blocks of `unit` bytes can use: every free extent counts only
    /// the whole units it holds (the rest is too fragmented for such a block).
    pub fn free_in_units(&self, unit: u64) -> u64 {
        self.free.values().map(|&l| l / unit * unit).sum()
    }

    pub fn is_free(&self, at: u64, len: u64) -> bool {
        if at.checked_add(len).is_none() {
            return false;
        }
        match self.free.range(..=at).next_back() {
            Some((&s, &l)) => s <= at && at + len <= s + l,
            None => false,
        }
    }

    /// Is every byte of `[at, at + len)` allocated (and inside the vdev)?
    pub fn is_wholly_allocated(&self, at: u64, len: u64) -> bool {
        let Some(end) = at.checked_add(len).filter(|e| *e <= self.size) else { return false };
        self.free.range(..end).next_back().is_none_or(|(&s, &l)| s + l <= at)
    }

    /// Mark an allocated range (import). Error if any part is already allocated.
    pub fn claim(&mut self, at: u64, len: u64) -> Result<()> {
        if len == 0 || at.checked_add(len).map_or(true, |end| end > self.size) || !self.is_free(at, len) {
            return Err(Error::Corrupt(format!("space map claims {at}+{len} twice or out of range")));
        }
        self.remove_range(at, len);
        Ok(())
    }

    /// Take every free part of `[at, at+len)` out of the free tree (claiming a log
    /// block at import, whose parts may be free or allocated).
    pub fn claim_free_parts(&mut self, at: u64, len: u64) -> Vec<(u64, u64)> {
        let end = at.saturating_add(len).min(self.size);
        let parts: Vec<(u64, u64)> = self
            .free
            .range(..end)
            .rev()
            .take_while(|(&s, &l)| s + l > at)
            .map(|(&s, &l)| (s.max(at), (s + l).min(end)))
            .filter(|(a, b)| a < b)
            .collect();
        for &(a, b) in &parts {
            self.remove_range(a, b - a);
        }
        parts.into_iter().map(|(a, b)| (a, b - a)).collect()
    }

    /// Return a range to the free tree. Panics on a double free (an engine bug).
    pub fn free(&mut self, at: u64, len: u64) {
        assert!(at + len <= self.size, "free beyond vdev end");
        let prev = self.free.range(..=at).next_back().map(|(&s, &l)| (s, l));
        if let Some((s, l)) = prev {
            assert!(s + l <= at, "double free of {at}+{len} (free extent {s}+{l})");
        }
        let next = self.free.range(at..).next().map(|(&s, &l)| (s, l));
        if let Some((s, _)) = next {
            assert!(at + len <= s, "double free of {at}+{len} (free extent at {s})");
        }
        let mut start = at;
        let mut end = at + len;
        if let Some((s, l)) = prev {
            if s + l == at {
                self.free.remove(&s);
                start = s;
            }
        }
        if let Some((s, l)) = next {
            if s == end {
                self.free.remove(&s);
                end = s + l;
            }
        }
        self.free.insert(start, end - start);
        self.free_bytes += len;
    }

    /// Take free space at or after `from` out of the free tree for a manual trim, in
    /// offset order: at most `budget.0` extents and `budget.1` bytes (but at least one
    /// extent), each at most `max_len` bytes (a longer free extent is taken in part),
    /// leaving free extents shorter than `min_len` in the tree. Returns the extents, where the next call continues (`None`: nothing is
    /// left after them) and the free bytes passed over in short extents.
    pub fn take_free_after(&mut self, from: u64, min_len: u64, max_len: u64, budget: (usize, u64)) -> (Vec<(u64, u64)>, Option<u64>, u64) {
        debug_assert!(min_len > 0 && max_len >= min_len);
        let (max_extents, max_bytes) = budget;
        let mut taken: Vec<(u64, u64)> = Vec::new();
        let mut taken_bytes = 0u64;
        let mut at = from;
        let mut skipped = 0;
        loop {
            if !taken.is_empty() && (taken.len() >= max_extents || taken_bytes >= max_bytes) {
                return (self.remove_taken(taken), Some(at), skipped);
            }
            // the free extent holding `at`, else the next one after it
            let next = self
                .free
                .range(..=at)
                .next_back()
                .filter(|(&s, &l)| s + l > at)
                .or_else(|| self.free.range(at..).next())
                .map(|(&s, &l)| (s.max(at), s + l));
            let Some((start, end)) = next else {
                return (self.remove_taken(taken), None, skipped);
            };
            if end - start >= min_len {
                let n = (end - start).min(max_len);
                taken.push((start, n));
                taken_bytes += n;
                at = start + n;
            } else {
                skipped += end - start;
                at = end;
            }
        }
    }

    fn remove_taken(&mut self, taken: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        for &(at, len) in &taken {
            self.remove_range(at, len);
            self.trimming_bytes += len;
        }
        taken
    }

    /// Give back an extent taken by [`RangeAllocator::take_free_after`].
    pub fn return_trimmed(&mut self, at: u64, len: u64) {
        assert!(self.trimming_bytes >= len, "returning {len} trimmed bytes, {} out", self.trimming_bytes);
        self.free(at, len);
        self.trimming_bytes -= len;
    }

    /// Allocated extents in order (complement of the free tree).
    pub fn allocated_extents(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = 0;
        for (&s, &l) in &self.free {
            if s > pos {
                out.push((pos, s - pos));
            }
            pos = s + l;
        }
        if pos < self.size {
            out.push((pos, self.size - pos));
        }
        out
    }
}

/// One allocation class (normal or log): the allocators of its top-level vdevs, the
/// rotor that stripes across them, and the undo list of the sync in progress.
#[derive(Debug, Clone)]
struct AllocClass {
    /// (top-level vdev id, allocator), sorted by id.
    vdevs: Vec<(VdevId, RangeAllocator)>,
    rotor: usize,
    rotor_bytes: u64,
    /// The txg whose sync is in progress (0: none) and what it allocated so far: the
    /// per-sync undo list. Allocations outside a sync (the intent log) are not in it.
    sync_txg: Txg,
    sync_allocs: Vec<Dva>,
    /// Vdevs being removed (`zpool remove` of a log vdev): nothing new is allocated on
    /// them; frees and claims still find them. At most the class's vdev count.
    noalloc: Vec<VdevId>,
    /// Format 2's journal (see "The journal"): allocations (true) and immediate frees
    /// since the last cut, in order. Empty unless the journal is on.
    journal: Vec<(Dva, bool)>,
}

impl AllocClass {
    fn new() -> AllocClass {
        AllocClass { vdevs: Vec::new(), rotor: 0, rotor_bytes: 0, sync_txg: Txg::ZERO, sync_allocs: Vec::new(), noalloc: Vec::new(), journal: Vec::new() }
    }

    fn get_mut(&mut self, vdev: VdevId) -> Option<&mut RangeAllocator> {
        self.vdevs.iter_mut().find(|(id, _)| *id == vdev).map(|(_, a)| a)
    }

    fn get(&self, vdev: VdevId) -> Option<&RangeAllocator> {
        self.vdevs.iter().find(|(id, _)| *id == vdev).map(|(_, a)| a)
    }

    /// Allocate `len` bytes for `purpose`, avoiding vdev `avoid` when another has room.
    fn alloc(&mut self, len: u64, avoid: Option<VdevId>, purpose: Purpose) -> Result<Dva> {
        let n = self.vdevs.len();
        if n == 0 {
            return Err(Error::NoSpace);
        }
        if self.rotor_bytes >= METASLAB_ALIQUOT {
            self.rotor = (self.rotor + 1) % n;
            self.rotor_bytes = 0;
        }
        for pass in 0..2 {
            for k in 0..n {
                let i = (self.rotor + k) % n;
                let (id, a) = &mut self.vdevs[i];
                if (pass == 0 && avoid == Some(*id) && n > 1) || self.noalloc.contains(id) {
                    continue;
                }
                if let Some(off) = a.alloc_for(len, purpose) {
                    let dva = Dva { vdev: *id, asize: len as u32, offset: off };
                    if k != 0 {
                        self.rotor = i;
                        self.rotor_bytes = 0;
                    }
                    if avoid.is_none() {
                        self.rotor_bytes += len;
                    }
                    return Ok(dva);
                }
            }
        }
        Err(Error::NoSpace)
    }

    /// `copies` DVAs of `len` bytes on distinct vdevs where possible; all or nothing.
    fn alloc_copies(&mut self, len: u64, copies: usize, purpose: Purpose) -> Result<Vec<Dva>> {
        let copies = copies.min(self.vdevs.len()).clamp(1, 3);
        let mut out: Vec<Dva> = Vec::with_capacity(copies);
        for i in 0..copies {
            let avoid = if i > 0 { Some(out[0].vdev) } else { None };
            match self.alloc(len, avoid, purpose) {
                Ok(d) => out.push(d),
                Err(e) => {
                    for d in &out {
                        self.free_now(d);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn free_now(&mut self, dva: &Dva) {
        if let Some(a) = self.get_mut(dva.vdev) {
            a.free(dva.offset, dva.asize as u64);
        }
    }
}

/// The class a top-level vdev's space belongs to.
fn class_index(role: Role) -> Option<usize> {
    match role {
        Role::Normal => Some(0),
        Role::Log => Some(1),
        Role::Cache | Role::Spare => None,
    }
}

/// All allocators of a pool: one per allocation class, each behind its own lock, plus
/// the defer lists.
///
/// Locks (docs/design.md, "Lock order"): each class lock, `vdev_class` and `defer` are
/// leaves: none of them is held while another is taken. `log_unreferenced` is taken
/// before a class lock (log allocation, encode), never after one.
#[derive(Debug)]
pub struct Metaslabs {
    /// Indexed by [`class_index`]: normal, log.
    classes: [Mutex<AllocClass>; 2],
    /// Top-level vdev id -> class index, for frees and claims that name only a DVA.
    vdev_class: RwLock<BTreeMap<VdevId, usize>>,
    /// txg -> extents freed in that txg, released when txg + TXG_DEFER_SIZE has
    /// committed.
    defer: Mutex<DeferLists>,
    /// Log blocks allocated whose referrer (the previous log block or the ZIL header)
    /// is not durable yet: left out of the persisted space maps, so a power cut does
    /// not leak them (the intent log claims what it finds at import). Taken before a
    /// class lock. Bounded by the blocks of the log chains in flight.
    log_unreferenced: Mutex<Vec<Dva>>,
    /// Bumped (under the defer lock) whenever frees leave their defer lists: a reader
    /// that saw the same value before and after knows no block it found could have
    /// been reused meanwhile (see [`Metaslabs::release_generation`]).
    release_generation: AtomicU64,
    /// Whether changes are journaled (a format 2 pool's space maps record them).
    journal_on: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default, Clone)]
struct DeferLists {
    lists: BTreeMap<Txg, Vec<Dva>>,
    /// Length of `lists[sync_txg]` when that txg's sync began (its undo mark).
    sync_txg: Txg,
    sync_mark: usize,
    /// Txgs whose trees someone is repairing from (scrub, resilver): frees of later
    /// txgs stay deferred while a pin holds, so a repair never writes over a block that
    /// was freed and reused after its tree was read. Bounded by the scan threads.
    pins: Vec<Txg>,
    /// Defer lists of txgs up to this one are awaited: the pool syncs until they are
    /// released (see "Awaited frees").
    awaited: Txg,
}

/// Holds frees of txgs after `txg` on their defer lists until dropped.
pub struct FreePin<'a> {
    ms: &'a Metaslabs,
    txg: Txg,
}

impl Drop for FreePin<'_> {
    fn drop(&mut self) {
        let mut d = self.ms.defer.lock();
        if let Some(i) = d.pins.iter().position(|&p| p == self.txg) {
            d.pins.swap_remove(i);
        }
    }
}

impl Metaslabs {
    pub fn new() -> Metaslabs {
        Metaslabs {
            classes: [Mutex::new(AllocClass::new()), Mutex::new(AllocClass::new())],
            vdev_class: RwLock::new(BTreeMap::new()),
            defer: Mutex::new(DeferLists::default()),
            log_unreferenced: Mutex::new(Vec::new()),
            release_generation: AtomicU64::new(0),
            journal_on: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Replace every allocator and defer list with `other`'s (import: the space maps of
    /// the uberblock that was chosen).
    pub fn replace_with(&self, other: Metaslabs) {
        let [n, l] = other.classes;
        *self.classes[0].lock() = n.into_inner();
        *self.classes[1].lock() = l.into_inner();
        *self.vdev_class.write() = other.vdev_class.into_inner();
        let mut d = other.defer.into_inner();
        // frees the previous owner of the pool did not see released: apply them
        d.awaited = d.lists.keys().next_back().copied().unwrap_or(Txg::ZERO);
        *self.defer.lock() = d;
    }

    /// Give top-level vdev `id` of class `role` an allocator of `size` bytes (a normal
    /// vdev's with its embedded log region).
    pub fn add_vdev(&self, id: VdevId, role: Role, size: u64) {
        let Some(ci) = class_index(role) else { return };
        let log_bytes = if role == Role::Normal { embedded_log_bytes(size) } else { 0 };
        let mut c = self.classes[ci].lock();
        c.vdevs.retain(|(v, _)| *v != id);
        c.vdevs.push((id, RangeAllocator::with_log_region(size, log_bytes)));
        c.vdevs.sort_by_key(|(v, _)| *v);
        self.vdev_class.write().insert(id, ci);
    }

    fn class_of(&self, vdev: VdevId) -> Option<&Mutex<AllocClass>> {
        self.vdev_class.read().get(&vdev).map(|&ci| &self.classes[ci])
    }

    /// Allocate `copies` DVAs of `len` bytes in class `role` for the sync of `txg`
    /// (recorded in that sync's undo list), or outside any sync (`txg` = None).
    pub fn alloc(&self, role: Role, len: u64, copies: usize, txg: Option<Txg>) -> Result<Vec<Dva>> {
        self.alloc_for(role, len, copies, txg, Purpose::Data, true)
    }

    fn alloc_for(&self, role: Role, len: u64, copies: usize, txg: Option<Txg>, purpose: Purpose, journal: bool) -> Result<Vec<Dva>> {
        let ci = class_index(role).ok_or(Error::NoSpace)?;
        let mut c = self.classes[ci].lock();
        let dvas = c.alloc_copies(len, copies, purpose)?;
        if journal && self.journaling() {
            c.journal.extend(dvas.iter().map(|d| (*d, true)));
        }
        if let Some(t) = txg {
            assert_eq!(c.sync_txg, t, "allocation for txg {t} outside its sync");
            c.sync_allocs.extend_from_slice(&dvas);
        }
        Ok(dvas)
    }

    /// Allocate one block in class `role` outside any sync, for `purpose` (an intent-log
    /// block, or a dmu_sync data block the log points to); it stays out of the
    /// persisted space maps until [`Metaslabs::log_referenced`].
    pub fn alloc_log(&self, role: Role, len: u64, purpose: Purpose) -> Result<Dva> {
        let mut u = self.log_unreferenced.lock();
        let d = self.alloc_for(role, len, 1, None, purpose, false)?[0];
        u.push(d);
        Ok(d)
    }

    /// The log block's referrer is durable: it belongs in the space maps.
    pub fn log_referenced(&self, dva: &Dva) {
        let mut u = self.log_unreferenced.lock();
        if let Some(i) = u.iter().position(|d| d == dva) {
            u.swap_remove(i);
            self.journal(dva, true);
        }
    }

    fn journaling(&self) -> bool {
        self.journal_on.load(Ordering::Relaxed)
    }

    /// Note an allocation (`true`) or immediate free in the journal of `dva`'s class.
    fn journal(&self, dva: &Dva, allocated: bool) {
        if self.journaling() {
            if let Some(c) = self.class_of(dva.vdev) {
                c.lock().journal.push((*dva, allocated));
            }
        }
    }

    /// Journal changes from now on (a format 2 pool; off: format 1, whose object
    /// directory lists every allocated extent).
    pub fn set_journal(&self, on: bool) {
        self.journal_on.store(on, Ordering::Relaxed);
        if !on {
            self.classes.iter().for_each(|c| c.lock().journal.clear());
        }
    }

    /// The journal's cut: everything noted since the last one, in order (normal class
    /// first). What is noted from now on belongs to the next cut.
    pub fn take_journal(&self) -> Vec<(Dva, bool)> {
        let mut out = Vec::new();
        for c in &self.classes {
            out.append(&mut c.lock().journal);
        }
        out
    }

    /// A failed sync attempt gives its cut back: `taken` goes before what was noted
    /// since.
    pub fn restore_journal(&self, taken: Vec<(Dva, bool)>) {
        for c in &self.classes {
            let mut c = c.lock();
            let mine: Vec<(Dva, bool)> = taken.iter().filter(|(d, _)| c.get(d.vdev).is_some()).copied().collect();
            let since = std::mem::replace(&mut c.journal, mine);
            c.journal.extend(since);
        }
    }

    /// Import: the log block `dva` of a valid chain stays allocated. Parts of it the
    /// loaded state has free are claimed; parts on a defer list (freed by an earlier
    /// owner, reused by the log in a txg that never synced) leave the list. Idempotent.
    pub fn claim_log(&self, dva: &Dva) -> Result<()> {
        let (at, end) = (dva.offset, dva.offset.saturating_add(dva.asize as u64));
        {
            let mut d = self.defer.lock();
            for list in d.lists.values_mut() {
                let mut kept = Vec::with_capacity(list.len());
                for e in list.drain(..) {
                    let (es, ee) = (e.offset, e.offset + e.asize as u64);
                    if e.vdev != dva.vdev || ee <= at || es >= end {
                        kept.push(e);
                        continue;
                    }
                    if es < at {
                        kept.push(Dva { vdev: e.vdev, asize: (at - es) as u32, offset: es });
                    }
                    if ee > end {
                        kept.push(Dva { vdev: e.vdev, asize: (ee - end) as u32, offset: end });
                    }
                }
                *list = kept;
            }
            d.lists.retain(|_, l| !l.is_empty());
        }
        let c = self.class_of(dva.vdev).ok_or_else(|| Error::Corrupt(format!("log block on unknown vdev {}", dva.vdev)))?;
        let mut c = c.lock();
        let a = c.get_mut(dva.vdev).ok_or_else(|| Error::Corrupt(format!("log block on unknown vdev {}", dva.vdev)))?;
        if end > a.size {
            return Err(Error::Corrupt(format!("log block {dva:?} beyond its vdev")));
        }
        let parts = a.claim_free_parts(at, dva.asize as u64);
        if self.journaling() {
            c.journal.extend(parts.into_iter().map(|(o, l)| (Dva { vdev: dva.vdev, asize: l as u32, offset: o }, true)));
        }
        Ok(())
    }

    /// Number of top-level vdevs in class `role` that take new allocations.
    pub fn vdev_count(&self, role: Role) -> usize {
        class_index(role).map_or(0, |ci| {
            let c = self.classes[ci].lock();
            c.vdevs.iter().filter(|(id, _)| !c.noalloc.contains(id)).count()
        })
    }

    /// Stop (`on`) or resume allocating on top-level vdev `id` (device removal).
    pub fn set_noalloc(&self, id: VdevId, on: bool) {
        let Some(c) = self.class_of(id) else { return };
        let mut c = c.lock();
        c.noalloc.retain(|v| *v != id);
        if on {
            c.noalloc.push(id);
        }
    }

    /// Device removal, once nothing references vdev `id` any more: its deferred frees
    /// are released now (the blocks they name are unreachable from the current state)
    /// and the bytes still allocated on it are returned (0: it may leave).
    pub fn drain_vdev(&self, id: VdevId) -> u64 {
        let mut released = Vec::new();
        {
            let mut d = self.defer.lock();
            for list in d.lists.values_mut() {
                released.extend(list.iter().filter(|e| e.vdev == id).copied());
                list.retain(|e| e.vdev != id);
            }
            d.lists.retain(|_, l| !l.is_empty());
        }
        for e in &released {
            self.free_unjournaled(e);
            // format 2: the vdev's space maps record them before its maps go
            self.journal(e, false);
        }
        let unref = self.log_unreferenced.lock().iter().filter(|d| d.vdev == id).map(|d| d.asize as u64).sum::<u64>();
        self.vdev_space(id).1 + unref
    }

    /// Forget top-level vdev `id` (it has left the pool). Refused while anything is
    /// allocated on it.
    pub fn remove_vdev(&self, id: VdevId) -> Result<()> {
        let Some(c) = self.class_of(id) else { return Ok(()) };
        {
            let mut c = c.lock();
            if let Some(a) = c.get(id) {
                if a.allocated_bytes() != 0 {
                    return Err(Error::Busy(format!("{} bytes are still allocated on vdev {id}", a.allocated_bytes())));
                }
            }
            c.vdevs.retain(|(v, _)| *v != id);
            c.noalloc.retain(|v| *v != id);
            c.rotor = 0;
            c.rotor_bytes = 0;
        }
        self.vdev_class.write().remove(&id);
        Ok(())
    }

    pub fn claim(&self, dva: &Dva) -> Result<()> {
        let c = self.class_of(dva.vdev).ok_or_else(|| Error::Corrupt(format!("block on unknown vdev {}", dva.vdev)))?;
        let mut c = c.lock();
        match c.get_mut(dva.vdev) {
            Some(a) => a.claim(dva.offset, dva.asize as u64)?,
            None => return Err(Error::Corrupt(format!("block on unknown vdev {}", dva.vdev))),
        }
        if self.journaling() {
            c.journal.push((*dva, true));
        }
        Ok(())
    }

    /// Import of a format 2 pool: `[at, at + len)` of vdev `vdev` is allocated (its
    /// space maps say so), noted in the journal when it is on.
    pub fn claim_extent(&self, vdev: VdevId, at: u64, len: u64) -> Result<()> {
        let unknown = || Error::Corrupt(format!("space on unknown vdev {vdev}"));
        let mut c = self.class_of(vdev).ok_or_else(unknown)?.lock();
        let a = c.get_mut(vdev).ok_or_else(unknown)?;
        if at.checked_add(len).is_none_or(|e| e > a.size) {
            return Err(Error::Corrupt(format!("an allocated extent [{at:#x}, +{len:#x}) beyond vdev {vdev}")));
        }
        a.claim(at, len)
    }

    /// Free immediately (a block allocated and never made reachable). A log block
    /// whose referrer never became durable was never journaled, nor is its free.
    pub fn free_now(&self, dva: &Dva) {
        let was_unreferenced = {
            let mut u = self.log_unreferenced.lock();
            u.iter().position(|d| d == dva).map(|i| u.swap_remove(i)).is_some()
        };
        if let Some(c) = self.class_of(dva.vdev) {
            let mut c = c.lock();
            c.free_now(dva);
            if !was_unreferenced && self.journaling() {
                c.journal.push((*dva, false));
            }
        }
    }

    /// Free at once a block the sync in progress allocated and no longer references
    /// (a MOS block rewritten by a later pass of the same txg): off the undo list too.
    pub fn free_unused(&self, dva: &Dva) {
        let Some(c) = self.class_of(dva.vdev) else { return };
        let mut c = c.lock();
        let i = c.sync_allocs.iter().rposition(|d| d == dva).unwrap_or_else(|| panic!("free_unused of {dva:?}, which the sync in progress did not allocate"));
        c.sync_allocs.swap_remove(i);
        c.free_now(dva);
        if self.journaling() {
            c.journal.push((*dva, false));
        }
    }

    /// Is any part of `dva` allocated?
    pub fn is_allocated(&self, dva: &Dva) -> bool {
        self.class_of(dva.vdev).is_some_and(|c| c.lock().get(dva.vdev).is_some_and(|a| !a.is_free(dva.offset, dva.asize as u64)))
    }

    /// Is every byte of `dva` allocated?
    pub fn is_wholly_allocated(&self, dva: &Dva) -> bool {
        self.class_of(dva.vdev).is_some_and(|c| c.lock().get(dva.vdev).is_some_and(|a| a.is_wholly_allocated(dva.offset, dva.asize as u64)))
    }

    pub fn free_deferred(&self, txg: Txg, dva: Dva) {
        self.defer.lock().lists.entry(txg).or_default().push(dva);
    }

    /// Deferred frees of txg `txg` (the object directory's own included).
    pub fn deferred_count(&self, txg: Txg) -> usize {
        self.defer.lock().lists.get(&txg).map_or(0, |l| l.len())
    }

    /// The frees of txg `txg` are awaited: the pool keeps syncing until they are
    /// released (see "Awaited frees").
    pub fn await_release(&self, txg: Txg) {
        let mut d = self.defer.lock();
        d.awaited = d.awaited.max(txg);
    }

    /// Some awaited defer list is not released yet. The sync thread asks under the txg
    /// state lock (spa's `has_dirty`), while [`Metaslabs::pin_frees`] takes the defer
    /// lock and then the txg state's: waiting here would deadlock the two. A defer lock
    /// held elsewhere answers "maybe" (true), which costs at most one more idle sync.
    pub fn frees_awaited(&self) -> bool {
        let Some(d) = self.defer.try_lock() else { return true };
        d.lists.range(..=d.awaited).any(|(_, l)| !l.is_empty())
    }

    /// Pin the trees of `synced_txg()` (read under the defer lock, so no release can
    /// slip between): every block they reference keeps its contents until the pin is
    /// dropped. See [`DeferLists::pins`].
    pub fn pin_frees(&self, synced_txg: impl FnOnce() -> Txg) -> FreePin<'_> {
        let mut d = self.defer.lock();
        let txg = synced_txg();
        d.pins.push(txg);
        FreePin { ms: self, txg }
    }

    /// How many times freed blocks have been released for reuse so far.
    pub fn release_generation(&self) -> u64 {
        self.release_generation.load(Ordering::Acquire)
    }

    /// Run `write` (a self-heal rewrite of a block read since the release generation
    /// was `generation`) with every release held off, only if no block was released
    /// since: the block read cannot have been freed and reused by another owner, whose
    /// data the rewrite would overwrite. False (not written) otherwise: a scrub repairs
    /// it later. A scrub or resilver needs no gate; its pin holds its tree's blocks.
    pub fn with_releases_held(&self, generation: u64, write: &mut dyn FnMut() -> bool) -> bool {
        let _pin = self.pin_frees(|| Txg(0));
        self.release_generation() == generation && write()
    }

    /// Release every defer list of a txg <= `txg`.
    pub fn release_through(&self, txg: Txg) {
        let released = self.take_released(txg);
        self.free_released(&released);
    }

    /// The frees still deferred of every txg <= `txg` (a pin held their release).
    pub fn deferred_through(&self, txg: Txg) -> Vec<Dva> {
        self.defer.lock().lists.range(..=txg).flat_map(|(_, l)| l.iter().copied()).collect()
    }

    /// The frees deferred in `txg` so far.
    pub fn deferred_of(&self, txg: Txg) -> Vec<Dva> {
        self.defer.lock().lists.get(&txg).cloned().unwrap_or_default()
    }

    /// Take the frees of txgs <= `txg` (fewer while a pin holds) off their defer
    /// lists without returning them to the free trees: the blocks are then neither
    /// deferred nor allocatable, so nothing can be written there until
    /// [`Metaslabs::free_released`] (autotrim discards them in between).
    pub fn take_released(&self, txg: Txg) -> Vec<Dva> {
        let done = {
            let mut d = self.defer.lock();
            let txg = d.pins.iter().copied().min().map_or(txg, |p| txg.min(p));
            let keep = d.lists.split_off(&txg.next());
            let done = std::mem::replace(&mut d.lists, keep);
            if done.values().any(|l| !l.is_empty()) {
                self.release_generation.fetch_add(1, Ordering::AcqRel);
            }
            done
        };
        done.into_values().flatten().collect()
    }

    /// [`RangeAllocator::take_free_after`] on top-level vdev `vdev` (manual trim; an
    /// unknown vdev has nothing left). The caller returns the extents with
    /// [`Metaslabs::return_trimmed`] before anything persists the allocators: only the
    /// sync does, and the sync is the caller (`spa/trim`).
    pub fn take_free_for_trim(&self, vdev: VdevId, from: u64, min_len: u64, max_len: u64, budget: (usize, u64)) -> (Vec<(u64, u64)>, Option<u64>, u64) {
        let Some(c) = self.class_of(vdev) else { return (Vec::new(), None, 0) };
        let mut c = c.lock();
        match c.get_mut(vdev) {
            Some(a) => a.take_free_after(from, min_len, max_len, budget),
            None => (Vec::new(), None, 0),
        }
    }

    /// Give back extents taken by [`Metaslabs::take_free_for_trim`].
    pub fn return_trimmed(&self, vdev: VdevId, extents: &[(u64, u64)]) {
        let Some(c) = self.class_of(vdev) else { return };
        let mut c = c.lock();
        if let Some(a) = c.get_mut(vdev) {
            for &(at, len) in extents {
                a.return_trimmed(at, len);
            }
        }
    }

    /// Return blocks taken by [`Metaslabs::take_released`] to the free trees.
    pub fn free_released(&self, released: &[Dva]) {
        // not journaled: the sync that released them appended them from the defer list
        for d in released {
            self.free_unjournaled(d);
        }
    }

    fn free_unjournaled(&self, dva: &Dva) {
        if let Some(c) = self.class_of(dva.vdev) {
            c.lock().free_now(dva);
        }
    }

    /// The sync of `txg` begins: start its undo list in every class and mark its defer
    /// list.
    pub fn begin_sync(&self, txg: Txg) {
        for c in &self.classes {
            let mut c = c.lock();
            c.sync_txg = txg;
            c.sync_allocs.clear();
        }
        let mut d = self.defer.lock();
        d.sync_mark = d.lists.get(&txg).map_or(0, |l| l.len());
        d.sync_txg = txg;
    }

    /// The sync of `txg` committed: its allocations stay.
    pub fn end_sync(&self, txg: Txg) {
        for c in &self.classes {
            let mut c = c.lock();
            debug_assert_eq!(c.sync_txg, txg);
            c.sync_txg = Txg::ZERO;
            c.sync_allocs.clear();
        }
        self.defer.lock().sync_txg = Txg::ZERO;
    }

    /// The sync of `txg` failed: free exactly what it allocated and forget the frees it
    /// deferred (its retry frees the same blocks again). Nothing else is touched, so
    /// space allocated meanwhile outside the sync (log blocks) stays allocated.
    pub fn undo_sync(&self, txg: Txg) {
        for c in &self.classes {
            let mut c = c.lock();
            debug_assert_eq!(c.sync_txg, txg);
            let allocs = std::mem::take(&mut c.sync_allocs);
            for d in allocs.iter().rev() {
                c.free_now(d);
            }
            if self.journaling() {
                c.journal.extend(allocs.iter().rev().map(|d| (*d, false)));
            }
            c.sync_txg = Txg::ZERO;
        }
        let mut d = self.defer.lock();
        let mark = d.sync_mark;
        if let Some(l) = d.lists.get_mut(&txg) {
            l.truncate(mark);
            if l.is_empty() {
                d.lists.remove(&txg);
            }
        }
        d.sync_txg = Txg::ZERO;
    }

    pub fn deferred_bytes(&self) -> u64 {
        self.defer.lock().lists.values().flatten().map(|d| d.asize as u64).sum()
    }

    /// Every deferred free (the leak check).
    pub fn deferred(&self) -> Vec<Dva> {
        self.defer.lock().lists.values().flatten().copied().collect()
    }

    /// (size, allocated) bytes of class `role`.
    pub fn space(&self, role: Role) -> (u64, u64) {
        let Some(ci) = class_index(role) else { return (0, 0) };
        let c = self.classes[ci].lock();
        c.vdevs.iter().fold((0, 0), |(s, a), (_, r)| (s + r.size, a + r.allocated_bytes()))
    }

    /// Free bytes of class `role` that blocks of `unit` bytes can use (see
    /// [`RangeAllocator::free_in_units`]).
    pub fn free_in_units(&self, role: Role, unit: u64) -> u64 {
        let Some(ci) = class_index(role) else { return 0 };
        let c = self.classes[ci].lock();
        c.vdevs.iter().map(|(_, r)| r.free_in_units(unit)).sum()
    }

    /// (size, allocated) bytes of top-level vdev `id`.
    pub fn vdev_space(&self, id: VdevId) -> (u64, u64) {
        match self.class_of(id) {
            Some(c) => c.lock().get(id).map_or((0, 0), |a| (a.size, a.allocated_bytes())),
            None => (0, 0),
        }
    }

    /// FRAG of `pool list`: the normal class's free-space fragmentation in percent,
    /// OpenZFS's `metaslab_class_fragmentation` (frag.rs).
    pub fn frag_percent(&self) -> u64 {
        let c = self.classes[0].lock();
        frag::class_fragmentation(c.vdevs.iter().map(|(_, a)| (a.fragmentation(), a.size)))
    }

    /// Allocated extents of every vdev, by vdev id (classes merged).
    pub fn extents(&self) -> BTreeMap<VdevId, Vec<(u64, u64)>> {
        let mut out = BTreeMap::new();
        for c in &self.classes {
            for (id, a) in &c.lock().vdevs {
                out.insert(*id, a.allocated_extents());
            }
        }
        out
    }

    /// The allocated extents the persisted state lists: all of them but log blocks no
    /// durable referrer names yet.
    fn persisted_extents(&self) -> BTreeMap<VdevId, Vec<(u64, u64)>> {
        let u = self.log_unreferenced.lock();
        let mut ext = self.extents();
        for d in u.iter() {
            if let Some(list) = ext.get_mut(&d.vdev) {
                cut_extent(list, d.offset, d.asize as u64);
            }
        }
        ext
    }

    /// Upgrade to format 2: journal from now on, every allocated extent noted first
    /// (but log blocks no durable referrer names yet, noted when one does), so the
    /// first format 2 sync's space maps list what format 1's object directory did.
    pub fn journal_everything_allocated(&self) {
        let ext = self.persisted_extents();
        self.set_journal(true);
        const PIECE: u64 = 1 << 30;
        for (vdev, list) in ext {
            for (at, len) in list {
                for off in (at..at + len).step_by(PIECE as usize) {
                    let asize = (at + len - off).min(PIECE) as u32;
                    self.journal(&Dva { vdev, offset: off, asize }, true);
                }
            }
        }
    }

    /// Persisted form: per vdev id the allocated extents; plus defer lists.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let ext = self.persisted_extents();
        let n = ext.keys().next_back().map_or(0, |&m| m.index() + 1);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for id in 0..n as u32 {
            match ext.get(&VdevId(id)) {
                None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
                Some(list) => {
                    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
                    for (s, l) in list {
                        out.extend_from_slice(&s.to_le_bytes());
                        out.extend_from_slice(&l.to_le_bytes());
                    }
                }
            }
        }
        let d = self.defer.lock();
        out.extend_from_slice(&(d.lists.len() as u32).to_le_bytes());
        for (txg, list) in &d.lists {
            out.extend_from_slice(&txg.get().to_le_bytes());
            out.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for d in list {
                out.extend_from_slice(&d.vdev.get().to_le_bytes());
                out.extend_from_slice(&d.asize.to_le_bytes());
                out.extend_from_slice(&d.offset.to_le_bytes());
            }
        }
    }

    /// Load the persisted form into allocators already created with `add_vdev`.
    pub fn decode_into(&mut self, r: &mut crate::block::reader::Reader) -> Result<()> {
        let n = r.u32()? as usize;
        for id in 0..n {
            let count = r.u32()?;
            if count == u32::MAX {
                continue;
            }
            for _ in 0..count {
                let s = r.u64()?;
                let l = r.u64()?;
                let ci = self.vdev_class.get_mut().get(&VdevId(id as u32)).copied();
                match ci.and_then(|ci| self.classes[ci].get_mut().get_mut(VdevId(id as u32))) {
                    Some(a) => a.claim(s, l)?,
                    None => return Err(Error::Corrupt(format!("space map for unknown vdev {id}"))),
                }
            }
        }
        let nd = r.u32()?;
        // every deferred extent, to refuse one named twice (or two that overlap): both
        // would be released, and the second free would corrupt the free tree
        let mut deferred: BTreeMap<(VdevId, u64), u64> = BTreeMap::new();
        for _ in 0..nd {
            let txg = Txg(r.u64()?);
            let cnt = r.u32()?;
            let mut list = Vec::new();
            for _ in 0..cnt {
                let d = Dva { vdev: VdevId(r.u32()?), asize: r.u32()?, offset: r.u64()? };
                // a deferred free must name allocated space, or releasing it later would
                // corrupt the free tree
                let ci = self.vdev_class.get_mut().get(&d.vdev).copied();
                let ok = match ci.and_then(|ci| self.classes[ci].get_mut().get(d.vdev)) {
                    Some(a) => {
                        d.asize > 0
                            && d.offset.checked_add(d.asize as u64).is_some_and(|e| e <= a.size)
                            && a.free.range(..d.offset + d.asize as u64).next_back().map_or(true, |(&fs, &fl)| fs + fl <= d.offset)
                    }
                    None => false,
                };
                if !ok {
                    return Err(Error::Corrupt(format!("defer list names unallocated space {d:?}")));
                }
                let end = d.offset + d.asize as u64;
                let before = deferred.range(..(d.vdev, end)).next_back().filter(|((v, _), &e)| *v == d.vdev && e > d.offset);
                if before.is_some() {
                    return Err(Error::Corrupt(format!("defer lists name {d:?} twice (or overlapping)")));
                }
                deferred.insert((d.vdev, d.offset), end);
                list.push(d);
            }
            self.defer.get_mut().lists.insert(txg, list);
        }
        Ok(())
    }
}

/// Remove `[at, at+len)` from a sorted list of allocated extents that contains it.
fn cut_extent(list: &mut Vec<(u64, u64)>, at: u64, len: u64) {
    let Some(i) = list.iter().position(|&(s, l)| s <= at && at + len <= s + l) else { return };
    let (s, l) = list.remove(i);
    let mut pieces = Vec::new();
    if s < at {
        pieces.push((s, at - s));
    }
    if at + len < s + l {
        pieces.push((at + len, s + l - at - len));
    }
    for (k, p) in pieces.into_iter().enumerate() {
        list.insert(i + k, p);
    }
}

impl Default for Metaslabs {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An extent wholly before the cursor (found by the wrap-around search) must be
    /// allocated from its start; this used to underflow and panic the sync thread.
    #[test]
    fn alloc_from_extent_before_cursor() {
        let mut a = RangeAllocator::new(16 * 4096);
        let x = a.alloc(4 * 4096).unwrap();
        let _y = a.alloc(12 * 4096).unwrap(); // cursor at the end, nothing free after it
        a.free(x, 4 * 4096);
        assert_eq!(a.alloc(2 * 4096), Some(x));
        assert_eq!(a.free_bytes(), 2 * 4096);
    }

    /// A crafted object directory naming one deferred extent twice (or two overlapping
    /// ones) is corrupt: both would be released, and the second free would corrupt
    /// the free tree (a double free that used to panic the sync thread).
    #[test]
    fn duplicate_defer_entries_are_refused() {
        let enc = |lists: &[(u64, Vec<Dva>)]| {
            let ms = Metaslabs::new();
            ms.add_vdev(VdevId(0), crate::vdev::Role::Normal, 1 << 20);
            ms.claim(&Dva { vdev: VdevId(0), asize: 64 << 10, offset: 0 }).unwrap();
            for (t, l) in lists {
                ms.defer.lock().lists.insert(Txg(*t), l.clone());
            }
            let mut out = Vec::new();
            ms.encode(&mut out);
            let mut fresh = Metaslabs::new();
            fresh.add_vdev(VdevId(0), crate::vdev::Role::Normal, 1 << 20);
            fresh.decode_into(&mut crate::block::reader::Reader::new(&out))
        };
        let d = Dva { vdev: VdevId(0), asize: 4096, offset: 8192 };
        assert!(enc(&[(5, vec![d])]).is_ok());
        assert!(enc(&[(5, vec![d, d])]).is_err(), "one extent deferred twice in a txg");
        assert!(enc(&[(5, vec![d]), (6, vec![d])]).is_err(), "one extent deferred in two txgs");
        let overlap = Dva { vdev: VdevId(0), asize: 8192, offset: 4096 };
        assert!(enc(&[(5, vec![d]), (6, vec![overlap])]).is_err(), "overlapping deferred extents");
    }

    /// A self-heal rewrite runs only if no freed block was released since the read
    /// began, and no release happens while it runs (the block read cannot have a new
    /// owner whose data it would overwrite).
    #[test]
    fn a_self_heal_rewrite_waits_out_no_release() {
        let ms = Metaslabs::new();
        ms.add_vdev(VdevId(0), crate::vdev::Role::Normal, 1 << 20);
        let d = Dva { vdev: VdevId(0), asize: 4096, offset: 8192 };
        ms.claim(&d).unwrap();
        ms.free_deferred(Txg(5), d);
        let read_began = ms.release_generation();
        let mut released_meanwhile = 0;
        assert!(ms.with_releases_held(read_began, &mut || {
            released_meanwhile = ms.take_released(Txg(9)).len();
            true
        }));
        assert_eq!(released_meanwhile, 0, "a release ran beside the rewrite");
        assert_eq!(ms.take_released(Txg(9)), vec![d]);
        let mut ran = false;
        assert!(!ms.with_releases_held(read_began, &mut || {
            ran = true;
            true
        }));
        assert!(!ran, "the rewrite ran after its block was released");
        assert!(ms.with_releases_held(ms.release_generation(), &mut || true));
    }

    /// Intent-log blocks go to the embedded log region and data stays out of it while
    /// the data area has room; each spills into the other when its own area is full.
    #[test]
    fn the_embedded_log_region_takes_log_blocks_first() {
        let size = 64 << 20;
        let region = embedded_log_bytes(size);
        assert_eq!(region, 4 << 20);
        assert_eq!(embedded_log_bytes((4 << 20) - 1), 0, "a vdev under 4 MiB has no region");
        assert_eq!(embedded_log_bytes(15 << 20), 768 << 10, "the crash test's vdevs have one");
        assert_eq!(embedded_log_bytes(1 << 40), EMBEDDED_LOG_MAX_BYTES);
        let ms = Metaslabs::new();
        ms.add_vdev(VdevId(0), Role::Normal, size);
        ms.add_vdev(VdevId(1), Role::Log, size);
        let data = ms.alloc(Role::Normal, 128 << 10, 1, None).unwrap()[0];
        assert!(data.offset >= region, "a data block in the log region: {data:?}");
        let lwb = ms.alloc_log(Role::Normal, 128 << 10, Purpose::IntentLog).unwrap();
        assert!(lwb.offset + (128 << 10) <= region, "a log block outside the region: {lwb:?}");
        let indirect = ms.alloc_log(Role::Normal, 16 << 10, Purpose::Data).unwrap();
        assert!(indirect.offset >= region, "a dmu_sync block in the log region: {indirect:?}");
        assert_eq!(ms.alloc_log(Role::Log, 4096, Purpose::IntentLog).unwrap().offset, 0, "a log vdev is all log");

        let unit = 4096;
        let mut a = RangeAllocator::with_log_region(16 * unit, 4 * unit);
        let logs: Vec<u64> = (0..4).map(|_| a.alloc_for(unit, Purpose::IntentLog).unwrap()).collect();
        assert_eq!(logs, [0, unit, 2 * unit, 3 * unit], "next-fit through the region");
        assert!(a.alloc_for(unit, Purpose::IntentLog).unwrap() >= 4 * unit, "a full region spills into the data area");
        a.free(unit, unit);
        assert_eq!(a.alloc_for(unit, Purpose::IntentLog), Some(unit), "the region's cursor wraps to freed space");
        while a.alloc(unit).is_some() {}
        assert_eq!(a.free_bytes(), 0);
        a.free(2 * unit, unit);
        assert_eq!(a.alloc(unit), Some(2 * unit), "a full data area spills into the region");
        assert_eq!(a.alloc(unit), None);
    }

    proptest! {
        /// Model test, with an embedded log region: allocations never overlap, frees
        /// restore, accounting holds, and an allocation lands outside its own area only
        /// when that area had no room for it.
        #[test]
        fn allocator_with_a_log_region_matches_model(ops in proptest::collection::vec((0u8..3, 1u64..16), 1..300)) {
            let (size, region) = (256 * 4096, 32 * 4096);
            let mut a = RangeAllocator::with_log_region(size, region);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (op, units) in ops {
                if op < 2 || live.is_empty() {
                    let (len, purpose) = (units * 4096, if op == 0 { Purpose::Data } else { Purpose::IntentLog });
                    let own = if purpose == Purpose::Data { (region, size) } else { (0, region) };
                    let room = a.find_free(len, own.0, own.1, own.0).is_some();
                    if let Some(at) = a.alloc_for(len, purpose) {
                        for &(s, l) in &live {
                            prop_assert!(at + len <= s || s + l <= at, "overlap");
                        }
                        let inside = own.0 <= at && at + len <= own.1;
                        prop_assert_eq!(inside, room, "{:?} of {} at {}", purpose, len, at);
                        live.push((at, len));
                    } else {
                        prop_assert!(!room, "refused although its area had room");
                    }
                } else {
                    let (s, l) = live.swap_remove((units as usize) % live.len());
                    a.free(s, l);
                }
                let used: u64 = live.iter().map(|x| x.1).sum();
                prop_assert_eq!(a.allocated_bytes(), used);
            }
        }
    }

    proptest! {
        /// Model test: allocations never overlap, frees restore, accounting holds.
        #[test]
        fn allocator_matches_model(ops in proptest::collection::vec((any::<bool>(), 1u64..16), 1..300)) {
            let size = 256 * 4096;
            let mut a = RangeAllocator::new(size);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (is_alloc, units) in ops {
                if is_alloc || live.is_empty() {
                    let len = units * 4096;
                    if let Some(at) = a.alloc(len) {
                        for &(s, l) in &live {
                            prop_assert!(at + len <= s || s + l <= at, "overlap");
                        }
                        live.push((at, len));
                    }
                } else {
                    let (s, l) = live.swap_remove((units as usize) % live.len());
                    a.free(s, l);
                }
                let used: u64 = live.iter().map(|x| x.1).sum();
                prop_assert_eq!(a.allocated_bytes(), used);
                let ext: u64 = a.allocated_extents().iter().map(|x| x.1).sum();
                prop_assert_eq!(ext, used);
            }
        }
    }

    /// A failed sync undoes exactly its own allocations and deferred frees: log blocks
    /// allocated meanwhile (the intent log, outside the sync) stay allocated.
    #[test]
    fn the_journal_notes_what_the_space_maps_must_record() {
        let ms = Metaslabs::new();
        ms.add_vdev(VdevId(0), Role::Normal, 64 << 20);
        ms.add_vdev(VdevId(1), Role::Log, 1 << 20);
        let before = ms.alloc(Role::Normal, 4096, 1, None).unwrap()[0];
        assert!(ms.take_journal().is_empty(), "off until a format 2 pool turns it on");
        ms.set_journal(true);
        let a = ms.alloc(Role::Normal, 4096, 1, None).unwrap();
        ms.free_now(&before);
        // a log block: noted once its referrer is durable; one that never was is not
        let lwb = ms.alloc_log(Role::Log, 4096, Purpose::IntentLog).unwrap();
        let lost = ms.alloc_log(Role::Log, 8192, Purpose::IntentLog).unwrap();
        ms.log_referenced(&lwb);
        ms.free_now(&lost);
        let cut = ms.take_journal();
        assert_eq!(cut, vec![(a[0], true), (before, false), (lwb, true)]);
        // a sync attempt: its allocations are noted, and so are their frees when undone;
        // a block it rewrote within the txg nets to nothing as well
        ms.begin_sync(Txg(3));
        let s = ms.alloc(Role::Normal, 8192, 1, Some(Txg(3))).unwrap()[0];
        let gone = ms.alloc(Role::Normal, 512, 1, Some(Txg(3))).unwrap()[0];
        ms.free_unused(&gone);
        let attempt = ms.take_journal();
        assert_eq!(attempt, vec![(s, true), (gone, true), (gone, false)]);
        ms.undo_sync(Txg(3));
        ms.restore_journal(attempt);
        let j = ms.take_journal();
        assert_eq!(j, vec![(s, true), (gone, true), (gone, false), (s, false)]);
        ms.set_journal(false);
    }

    #[test]
    fn failed_sync_undoes_only_its_own_allocations() {
        let ms = Metaslabs::new();
        ms.add_vdev(VdevId(0), Role::Normal, 1 << 20);
        ms.add_vdev(VdevId(1), Role::Log, 1 << 20);
        // state before the sync: one committed block, one older deferred free
        let kept = ms.alloc(Role::Normal, 4096, 1, None).unwrap()[0];
        let old_free = ms.alloc(Role::Normal, 4096, 1, None).unwrap()[0];
        ms.free_deferred(Txg(7), old_free);
        ms.begin_sync(Txg(7));
        let synced = ms.alloc(Role::Normal, 8192, 1, Some(Txg(7))).unwrap()[0];
        let log = ms.alloc(Role::Log, 4096, 1, None).unwrap()[0];
        ms.free_deferred(Txg(7), kept);
        assert_eq!(ms.space(Role::Normal).1, 4096 * 2 + 8192);
        ms.undo_sync(Txg(7));
        assert!(!ms.is_allocated(&synced), "the sync's own block must be freed");
        assert!(ms.is_allocated(&log), "a log block allocated during the sync must survive");
        assert!(ms.is_allocated(&kept) && ms.is_allocated(&old_free));
        assert_eq!(ms.deferred(), vec![old_free], "only the sync's deferred frees are forgotten");
        assert_eq!(ms.space(Role::Normal).1, 4096 * 2);
        assert_eq!(ms.space(Role::Log).1, 4096);
        // a committed sync keeps everything
        ms.begin_sync(Txg(8));
        let b = ms.alloc(Role::Normal, 4096, 1, Some(Txg(8))).unwrap()[0];
        ms.end_sync(Txg(8));
        assert!(ms.is_allocated(&b));
    }

    /// Classes never lend each other space.
    #[test]
    fn classes_are_separate() {
        let ms = Metaslabs::new();
        ms.add_vdev(VdevId(0), Role::Normal, 64 << 10);
        ms.add_vdev(VdevId(1), Role::Log, 1 << 20);
        assert_eq!(ms.alloc(Role::Normal, 64 << 10, 1, None).unwrap()[0].vdev, VdevId(0));
        assert!(matches!(ms.alloc(Role::Normal, 4096, 1, None), Err(Error::NoSpace)));
        assert_eq!(ms.alloc(Role::Log, 4096, 1, None).unwrap()[0].vdev, VdevId(1));
        assert!(matches!(ms.alloc(Role::Cache, 4096, 1, None), Err(Error::NoSpace)));
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut a = RangeAllocator::new(1 << 20);
        let at = a.alloc(4096).unwrap();
        a.free(at, 4096);
        a.free(at, 4096);
    }
}

#[cfg(test)]
mod trim_tests {
    use super::*;

    fn alloc_at(a: &mut RangeAllocator, at: u64, len: u64) {
        a.claim(at, len).unwrap();
    }

    #[test]
    fn take_free_after_walks_free_space_in_order_and_skips_short_extents() {
        let mut a = RangeAllocator::new(1 << 20);
        // free: [0,4K) [8K,100K) [104K,108K) [112K,1M)
        alloc_at(&mut a, 4096, 4096);
        alloc_at(&mut a, 100 << 10, 4096);
        alloc_at(&mut a, 108 << 10, 4096);
        let free0 = a.free_bytes();
        // at most two extents of at most 64K, none shorter than 8K
        let (t, next, skipped) = a.take_free_after(0, 8192, 64 << 10, (2, u64::MAX));
        assert_eq!(t, vec![(8192, 64 << 10), (72 << 10, 28 << 10)]);
        assert_eq!((next, skipped), (Some(100 << 10), 4096), "[0,4K) is short");
        assert_eq!(a.free_bytes(), free0 - (92 << 10));
        assert_eq!(a.allocated_bytes(), (1 << 20) - free0, "space being trimmed is not allocated");
        assert!(!a.is_free(8192, 4096) && a.is_free(0, 4096), "taken space left the tree, short extents stayed");
        // from the middle of a free extent: its rest, then to the end
        let (t2, next2, _) = a.take_free_after(200 << 10, 8192, 1 << 20, (10, u64::MAX));
        assert_eq!(t2, vec![(200 << 10, (1 << 20) - (200 << 10))]);
        assert_eq!(next2, None);
        for &(at, len) in t.iter().chain(&t2) {
            a.return_trimmed(at, len);
        }
        assert_eq!(a.free_bytes(), free0, "returning every extent restores the tree");
        let (t3, next3, _) = a.take_free_after(1 << 20, 4096, 1 << 20, (10, u64::MAX));
        assert!(t3.is_empty() && next3.is_none());
        // a byte budget stops after the extent that reaches it, and never takes nothing
        let (t4, next4, _) = a.take_free_after(0, 8192, 16 << 10, (100, 20 << 10));
        assert_eq!(t4, vec![(8192, 16 << 10), (24 << 10, 16 << 10)]);
        assert_eq!(next4, Some(40 << 10));
        for &(at, len) in &t4 {
            a.return_trimmed(at, len);
        }
        let (t5, _, _) = a.take_free_after(0, 8192, 64 << 10, (100, 1));
        assert_eq!(t5, vec![(8192, 64 << 10)], "a budget under one extent still takes one");
    }
}
