//! The headers of one cache device: which blocks its ring holds, where, in write order.
//!
//! ```text
//!   entries: VecDeque<Entry>, oldest first (= ring address order within a sweep)
//!            Entry (32 B): block offset u64 | birth u64 | vdev u32 | address/4K u32
//!                          | length u32 (0: forgotten) | kind u8 | 3 pad
//!   index:   hash table of u32 sequence numbers (an entry's position is its number
//!            minus the number of the oldest entry), keyed by the entry's block
//! ```
//!
//! The ring forgets from the old end as its hand advances ([`Headers::forget_front_in`])
//! and appends new copies at the other ([`Headers::push`]); a block freed, or a copy
//! found bad, is forgotten in place (a tombstone, dropped from the index) and the
//! entries are compacted once tombstones pass a quarter of them. No key is stored
//! twice: the index holds 4-byte numbers, not keys.
//!
//! Memory per block ([`Headers::memory_bytes`], `l2_hdr_size`): 32 bytes of entry plus
//! growth slack (the entries grow by an eighth, never doubling) plus 5 bytes per
//! index bucket at a load of 7/16 to 7/8, plus tombstones (at most a quarter): at most
//! 32 × 1.25 × 1.125 + 5 / (7/16) ≈ 57 bytes per block, 64 with the small fixed parts
//! at small counts excluded (see the test). OpenZFS's L2-only header is 96 bytes.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::arc::{BlockKey, BufKind};

/// The ring's unit: every copy's address is a multiple of it.
pub const UNIT_BYTES: u64 = 4096;
/// The highest address a header can hold (a 32-bit count of units).
pub const ADDR_MAX: u64 = u32::MAX as u64 * UNIT_BYTES;

/// Where a copy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub addr: u64,
    pub len: u32,
    pub kind: BufKind,
}

#[derive(Clone, Copy)]
struct Entry {
    offset: u64,
    birth: u64,
    vdev: u32,
    addr_units: u32,
    /// Bytes of the copy; 0: forgotten.
    len: u32,
    kind: u8,
}

impl Entry {
    fn loc(&self) -> Loc {
        let kind = if self.kind == 1 { BufKind::Metadata } else { BufKind::Data };
        Loc { addr: self.addr_units as u64 * UNIT_BYTES, len: self.len, kind }
    }
    fn is(&self, k: &BlockKey) -> bool {
        self.offset == k.offset && self.birth == k.birth.0 && self.vdev == k.vdev.0
    }
}

/// The headers of one cache device (module comment).
pub struct Headers {
    entries: VecDeque<Entry>,
    /// The sequence number of `entries[0]`.
    front_seq: u32,
    index: HashTable<u32>,
    hasher: foldhash::fast::FixedState,
    live: usize,
    /// Bytes of the copies indexed: rounded to the ring's unit, and as stored.
    pub asize: u64,
    pub lsize: u64,
}

impl Default for Headers {
    fn default() -> Headers {
        Headers { entries: VecDeque::new(), front_seq: 0, index: HashTable::new(), hasher: foldhash::fast::FixedState::with_seed(0x4c32_6172_63), live: 0, asize: 0, lsize: 0 }
    }
}

impl Headers {
    fn hash(&self, k: &BlockKey) -> u64 {
        self.hasher.hash_one((k.vdev.0, k.offset, k.birth.0))
    }

    fn entry(&self, seq: u32) -> &Entry {
        &self.entries[seq.wrapping_sub(self.front_seq) as usize]
    }

    fn find(&self, k: &BlockKey) -> Option<u32> {
        self.index.find(self.hash(k), |&s| self.entry(s).is(k)).copied()
    }

    /// Blocks indexed.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub fn get(&self, k: &BlockKey) -> Option<Loc> {
        self.find(k).map(|s| self.entry(s).loc())
    }

    pub fn contains(&self, k: &BlockKey) -> bool {
        self.find(k).is_some()
    }

    /// DRAM the headers take, slack included (`l2_hdr_size`).
    pub fn memory_bytes(&self) -> u64 {
        (self.entries.capacity() * std::mem::size_of::<Entry>() + self.index.allocation_size()) as u64
    }

    /// Append the copy of `k` at `loc` (the newest: its address follows every other's in
    /// this sweep). `k` must not be indexed; `loc.addr` must be a multiple of the unit
    /// at most [`ADDR_MAX`].
    pub fn push(&mut self, k: BlockKey, loc: Loc) {
        assert!(loc.len > 0 && loc.addr % UNIT_BYTES == 0 && loc.addr <= ADDR_MAX, "a header for {loc:?}");
        debug_assert!(!self.contains(&k), "a block indexed twice");
        if self.entries.len() == self.entries.capacity() {
            self.entries.reserve_exact((self.entries.len() / 8).max(64));
        }
        let seq = self.front_seq.wrapping_add(self.entries.len() as u32);
        let kind = u8::from(loc.kind == BufKind::Metadata);
        self.entries.push_back(Entry { offset: k.offset, birth: k.birth.0, vdev: k.vdev.0, addr_units: (loc.addr / UNIT_BYTES) as u32, len: loc.len, kind });
        let h = self.hash(&k);
        let (entries, front, hasher) = (&self.entries, self.front_seq, &self.hasher);
        self.index.insert_unique(h, seq, |&s| {
            let e = &entries[s.wrapping_sub(front) as usize];
            hasher.hash_one((e.vdev, e.offset, e.birth))
        });
        self.live += 1;
        self.asize += (loc.len as u64).next_multiple_of(UNIT_BYTES);
        self.lsize += loc.len as u64;
    }

    /// Drop entry `seq` from the index and the byte counts (it stays as a tombstone).
    fn unindex(&mut self, seq: u32) {
        let e = *self.entry(seq);
        debug_assert!(e.len > 0);
        let h = self.hasher.hash_one((e.vdev, e.offset, e.birth));
        if let Ok(found) = self.index.find_entry(h, |&s| s == seq) {
            found.remove();
        }
        let at = seq.wrapping_sub(self.front_seq) as usize;
        self.entries[at].len = 0;
        self.live -= 1;
        self.asize -= (e.len as u64).next_multiple_of(UNIT_BYTES);
        self.lsize -= e.len as u64;
    }

    /// Forget the oldest copies while they lie in [from, to) (the hand is about to
    /// write there), and the forgotten ones before them.
    pub fn forget_front_in(&mut self, from: u64, to: u64) {
        while let Some(e) = self.entries.front().copied() {
            if e.len > 0 {
                let addr = e.addr_units as u64 * UNIT_BYTES;
                if addr < from || addr >= to {
                    break;
                }
                self.unindex(self.front_seq);
            }
            self.entries.pop_front();
            self.front_seq = self.front_seq.wrapping_add(1);
        }
    }

    /// Forget the copy of `k` if it is the one at `addr`. Returns whether it was.
    pub fn forget(&mut self, k: &BlockKey, addr: u64) -> bool {
        let Some(seq) = self.find(k).filter(|&s| self.entry(s).loc().addr == addr) else { return false };
        self.unindex(seq);
        if self.entries.len() - self.live > self.live / 4 + 64 {
            self.compact();
        }
        true
    }

    /// Drop the tombstones and renumber.
    fn compact(&mut self) {
        self.entries.retain(|e| e.len > 0);
        self.entries.shrink_to(self.entries.len() + self.entries.len() / 8);
        self.front_seq = 0;
        self.index = HashTable::with_capacity(self.entries.len());
        for i in 0..self.entries.len() {
            let e = self.entries[i];
            let h = self.hasher.hash_one((e.vdev, e.offset, e.birth));
            let (entries, hasher) = (&self.entries, &self.hasher);
            self.index.insert_unique(h, i as u32, |&s| {
                let e = &entries[s as usize];
                hasher.hash_one((e.vdev, e.offset, e.birth))
            });
        }
    }

    pub fn clear(&mut self) {
        *self = Headers::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Txg, VdevId};

    fn k(i: u64) -> BlockKey {
        BlockKey { vdev: VdevId((i % 3) as u32), offset: i << 13, birth: Txg(5 + i % 7) }
    }

    fn loc(i: u64) -> Loc {
        Loc { addr: (1 << 20) + i * 8192, len: 8192, kind: if i % 5 == 0 { BufKind::Metadata } else { BufKind::Data } }
    }

    #[test]
    fn a_header_costs_at_most_64_bytes_with_every_slack() {
        let mut h = Headers::default();
        let mut worst = 0f64;
        for i in 0..300_000u64 {
            h.push(k(i), loc(i));
            if i >= 1000 {
                worst = worst.max(h.memory_bytes() as f64 / h.len() as f64);
            }
        }
        // tombstones: free every other block of a stretch
        for i in (100_000..200_000u64).step_by(2) {
            assert!(h.forget(&k(i), loc(i).addr));
            worst = worst.max(h.memory_bytes() as f64 / h.len() as f64);
        }
        assert!(worst <= 64.0, "{worst:.1} bytes per header");
        assert_eq!(std::mem::size_of::<Entry>(), 32);
    }

    #[test]
    fn the_ring_forgets_from_its_old_end_and_lookups_follow_every_change() {
        let mut h = Headers::default();
        let mut model = std::collections::HashMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = 0u64;
        let mut front = 0u64;
        for _ in 0..50_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            match rng % 10 {
                0..=5 => {
                    h.push(k(next), loc(next));
                    model.insert(next, loc(next));
                    next += 1;
                }
                6..=7 if next > front => {
                    let i = front + rng % (next - front);
                    let was = model.remove(&i).is_some();
                    assert_eq!(h.forget(&k(i), loc(i).addr), was);
                }
                _ => {
                    let to = front + rng % 40;
                    h.forget_front_in(loc(front).addr, loc(to).addr);
                    while front < to {
                        model.remove(&front);
                        front += 1;
                    }
                }
            }
            if rng % 97 == 0 {
                for i in front.saturating_sub(3)..next {
                    assert_eq!(h.get(&k(i)), model.get(&i).copied(), "block {i}");
                }
            }
        }
        assert_eq!(h.len(), model.len());
        assert_eq!(h.lsize, model.len() as u64 * 8192);
        assert!(!h.forget(&k(next - 1), 0), "a copy at another address is not forgotten");
    }
}
