//! metaslab: space allocation per top-level vdev, deferred frees.
//!
//! Theory of operation
//! -------------------
//! Each top-level vdev's data area is one range tree of *free* extents
//! (`BTreeMap<start, len>`, adjacent extents always merged). Allocation is first-fit
//! from a cursor that follows the last allocation, so a txg's blocks land next to each
//! other and the sync can aggregate them into large writes (OpenZFS "dynamic fit").
//!
//! Data is striped across the top-level vdevs of the normal class with a rotor that
//! moves to the next vdev every `metaslab_aliquot` bytes (512 KiB), skipping full ones.
//!
//! Frees are deferred: a block freed in txg T goes to `defer[T]` and returns to the free
//! tree when txg T+3 starts to sync (each sync of S first releases the lists through
//! S - TXG_DEFER_SIZE - 1), so while S syncs, the trees of the two uberblocks before it
//! (S-1 and S-2, the fallbacks if S never lands) stay intact on disk.
//!
//! Invariants (asserted): an extent is never freed twice, never allocated twice, and
//! `allocated + free == size` for every vdev. The persisted form (in the MOS) is the
//! list of allocated extents per vdev plus the defer lists; see docs/on-disk-format.md.

use std::collections::BTreeMap;

use crate::vdev::Role;
use crate::zio::blkptr::Dva;
use crate::{Error, Result};

pub const TXG_DEFER_SIZE: u64 = 2;
pub const METASLAB_ALIQUOT: u64 = 512 << 10;

#[derive(Debug, Clone)]
pub struct RangeAllocator {
    pub size: u64,
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
    cursor: u64,
}

impl RangeAllocator {
    pub fn new(size: u64) -> RangeAllocator {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        RangeAllocator { size, free, free_bytes: size, cursor: 0 }
    }
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }
    pub fn allocated_bytes(&self) -> u64 {
        self.size - self.free_bytes
    }
    /// Number of free extents (fragmentation indicator).
    pub fn free_extents(&self) -> usize {
        self.free.len()
    }

    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        assert!(len > 0);
        let found = self
            .free
            .range(self.cursor..)
            .find(|(_, &l)| l >= len)
            .or_else(|| {
                // an extent that starts before the cursor but covers it
                self.free.range(..self.cursor).next_back().filter(|(&s, &l)| s + l > self.cursor && s + l - self.cursor >= len)
            })
            .or_else(|| self.free.range(..self.cursor).find(|(_, &l)| l >= len))
            .map(|(&s, &l)| (s, l));
        let (start, extent_len) = found?;
        let at = if start < self.cursor && start + extent_len > self.cursor && start + extent_len - self.cursor >= len { self.cursor } else { start };
        self.remove_range(at, len);
        self.cursor = at + len;
        Some(at)
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

    pub fn is_free(&self, at: u64, len: u64) -> bool {
        if at.checked_add(len).is_none() {
            return false;
        }
        match self.free.range(..=at).next_back() {
            Some((&s, &l)) => s <= at && at + len <= s + l,
            None => false,
        }
    }

    /// Mark an allocated range (import). Error if any part is already allocated.
    pub fn claim(&mut self, at: u64, len: u64) -> Result<()> {
        if len == 0 || at.checked_add(len).map_or(true, |end| end > self.size) || !self.is_free(at, len) {
            return Err(Error::Corrupt(format!("space map claims {at}+{len} twice or out of range")));
        }
        self.remove_range(at, len);
        Ok(())
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

/// All allocators of a pool plus the defer lists.
#[derive(Debug, Clone)]
pub struct Metaslabs {
    /// Indexed by top-level vdev id; None for ids not in the tree (removed) or cache.
    pub vdevs: Vec<Option<(Role, RangeAllocator)>>,
    rotor: usize,
    rotor_bytes: u64,
    /// txg -> extents freed in that txg, released when txg + TXG_DEFER_SIZE + 1 starts
    /// to sync.
    pub defer: BTreeMap<u64, Vec<Dva>>,
}

impl Metaslabs {
    pub fn new() -> Metaslabs {
        Metaslabs { vdevs: Vec::new(), rotor: 0, rotor_bytes: 0, defer: BTreeMap::new() }
    }

    pub fn add_vdev(&mut self, id: u32, role: Role, size: u64) {
        let id = id as usize;
        if self.vdevs.len() <= id {
            self.vdevs.resize(id + 1, None);
        }
        self.vdevs[id] = Some((role, RangeAllocator::new(size)));
    }

    /// Allocate `len` bytes in class `role`, avoiding vdev `avoid` when another has room.
    pub fn alloc(&mut self, role: Role, len: u64, avoid: Option<u32>) -> Result<Dva> {
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
                let id = (self.rotor + k) % n;
                if pass == 0 && avoid == Some(id as u32) && n > 1 {
                    continue;
                }
                if let Some((r, a)) = self.vdevs[id].as_mut() {
                    if *r != role {
                        continue;
                    }
                    if let Some(off) = a.alloc(len) {
                        if k != 0 {
                            self.rotor = id;
                            self.rotor_bytes = 0;
                        }
                        if avoid.is_none() {
                            self.rotor_bytes += len;
                        }
                        return Ok(Dva { vdev: id as u32, asize: len as u32, offset: off });
                    }
                }
            }
        }
        Err(Error::NoSpace)
    }

    pub fn claim(&mut self, dva: &Dva) -> Result<()> {
        match self.vdevs.get_mut(dva.vdev as usize).and_then(|v| v.as_mut()) {
            Some((_, a)) => a.claim(dva.offset, dva.asize as u64),
            None => Err(Error::Corrupt(format!("block on unknown vdev {}", dva.vdev))),
        }
    }

    /// Free immediately (a block allocated and never made reachable).
    pub fn free_now(&mut self, dva: &Dva) {
        if let Some(Some((_, a))) = self.vdevs.get_mut(dva.vdev as usize) {
            a.free(dva.offset, dva.asize as u64);
        }
    }

    pub fn free_deferred(&mut self, txg: u64, dva: Dva) {
        self.defer.entry(txg).or_default().push(dva);
    }

    /// Release every defer list of a txg <= `txg`.
    pub fn release_through(&mut self, txg: u64) {
        let keep = self.defer.split_off(&(txg + 1));
        let done = std::mem::replace(&mut self.defer, keep);
        for (_, list) in done {
            for d in list {
                self.free_now(&d);
            }
        }
    }

    pub fn deferred_bytes(&self) -> u64 {
        self.defer.values().flatten().map(|d| d.asize as u64).sum()
    }

    pub fn space(&self, role: Role) -> (u64, u64) {
        let mut size = 0;
        let mut alloc = 0;
        for (r, a) in self.vdevs.iter().flatten() {
            if *r == role {
                size += a.size;
                alloc += a.allocated_bytes();
            }
        }
        (size, alloc)
    }

    pub fn vdev_space(&self, id: u32) -> (u64, u64) {
        match self.vdevs.get(id as usize).and_then(|v| v.as_ref()) {
            Some((_, a)) => (a.size, a.allocated_bytes()),
            None => (0, 0),
        }
    }

    pub fn frag_percent(&self) -> u64 {
        let (mut ext, mut free) = (0u64, 0u64);
        for (_, a) in self.vdevs.iter().flatten() {
            ext += a.free_extents() as u64;
            free += a.free_bytes();
        }
        if free == 0 {
            return 0;
        }
        // mean free extent size vs 16 MiB: small extents = fragmented
        let mean = free / ext.max(1);
        100u64.saturating_sub((mean * 100 / (16 << 20)).min(100))
    }

    /// Persisted form: per vdev id the allocated extents; plus defer lists.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.vdevs.len() as u32).to_le_bytes());
        for v in &self.vdevs {
            match v {
                None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
                Some((_, a)) => {
                    let ext = a.allocated_extents();
                    out.extend_from_slice(&(ext.len() as u32).to_le_bytes());
                    for (s, l) in ext {
                        out.extend_from_slice(&s.to_le_bytes());
                        out.extend_from_slice(&l.to_le_bytes());
                    }
                }
            }
        }
        out.extend_from_slice(&(self.defer.len() as u32).to_le_bytes());
        for (txg, list) in &self.defer {
            out.extend_from_slice(&txg.to_le_bytes());
            out.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for d in list {
                out.extend_from_slice(&d.vdev.to_le_bytes());
                out.extend_from_slice(&d.asize.to_le_bytes());
                out.extend_from_slice(&d.offset.to_le_bytes());
            }
        }
    }

    /// Load the persisted form into allocators already created with `add_vdev`.
    pub fn decode_into(&mut self, r: &mut crate::dmu::Reader) -> Result<()> {
        let n = r.u32()? as usize;
        for id in 0..n {
            let count = r.u32()?;
            if count == u32::MAX {
                continue;
            }
            for _ in 0..count {
                let s = r.u64()?;
                let l = r.u64()?;
                match self.vdevs.get_mut(id).and_then(|v| v.as_mut()) {
                    Some((_, a)) => a.claim(s, l)?,
                    None => return Err(Error::Corrupt(format!("space map for unknown vdev {id}"))),
                }
            }
        }
        let nd = r.u32()?;
        for _ in 0..nd {
            let txg = r.u64()?;
            let cnt = r.u32()?;
            let mut list = Vec::new();
            for _ in 0..cnt {
                let d = Dva { vdev: r.u32()?, asize: r.u32()?, offset: r.u64()? };
                // a deferred free must name allocated space, or releasing it later would
                // corrupt the free tree
                let ok = match self.vdevs.get(d.vdev as usize).and_then(|v| v.as_ref()) {
                    Some((_, a)) => {
                        d.asize > 0
                            && d.offset.checked_add(d.asize as u64).is_some_and(|e| e <= a.size)
                            && a.free.range(..d.offset + d.asize as u64).next_back().map_or(true, |(&fs, &fl)| fs + fl <= d.offset)
                    }
                    None => false,
                };
                if !ok {
                    return Err(Error::Corrupt(format!("defer list names unallocated space {d:?}")));
                }
                list.push(d);
            }
            self.defer.insert(txg, list);
        }
        Ok(())
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

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut a = RangeAllocator::new(1 << 20);
        let at = a.alloc(4096).unwrap();
        a.free(at, 4096);
        a.free(at, 4096);
    }
}
