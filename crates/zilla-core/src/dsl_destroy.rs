//! dsl_destroy: destroying a dataset in the background, a bounded amount per txg.
//!
//! Theory of operation
//! -------------------
//! `destroy` takes a dataset out of the namespace in one txg and appends its objset's
//! root pointer to the pool's **destroy queue** (docs/on-disk-format.md §18). Every
//! later txg frees at most a budget of block copies from the first unfinished entry,
//! in a fixed post-order, and writes the entry's new bookmark in the same txg, so the
//! frees and the bookmark that covers them commit together.
//!
//! **The walk** ([`destroy_step`]) has three phases: (0) every object's tree, objects in
//! ascending order, each tree in post-order (a block's key is the last block id it
//! covers and its level; an indirect comes after its last child); (1) the meta-dnode's
//! tree (its dnode blocks and indirects) in the same post-order; (2) the objset block.
//! The bookmark is the key of the next block to free, so every block a resumed walk
//! reads (the objset block, the meta-dnode's path to the bookmark's dnode block, the
//! object's path to the bookmark) is one the walk has not freed: phases 0 and 1 free
//! nothing that an earlier point of the walk still reads. A subtree wholly before the
//! bookmark is skipped without being read.
//!
//! **Bounds.** A step frees at most its budget of copies (`zfs_async_block_max_blocks`)
//! and reads at most the path to the bookmark plus what it frees; the queue holds at
//! most [`MAX_ENTRIES`] entries.

use std::sync::Arc;

use crate::block::blkptr::BlockPointer;
use crate::dmu::dnode::{DnodePhys, ObjectSpec, ObjectType, DNODES_PER_BLOCK, DNODE_BYTES};
use crate::dmu::object_tree::{allocated_bytes, BlockIo, Tree};
use crate::dmu::objset::{Objset, ObjsetPhys};
use crate::vdev::abd::AlignedBuf;
use crate::{Error, Result, Txg};

/// Bytes of a queue entry.
pub const ENTRY_BYTES: usize = 192;
/// Data block size of the queue object, and entries per block (the rest is zero).
pub const BLOCK_BYTES: u32 = 16 << 10;
pub const ENTRIES_PER_BLOCK: u64 = BLOCK_BYTES as u64 / ENTRY_BYTES as u64;
/// Most entries the queue holds.
pub const MAX_ENTRIES: u64 = 1 << 20;

/// Where a destroy's walk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    #[default]
    Objects = 0,
    MetaDnode = 1,
    ObjsetBlock = 2,
}

/// One queued destroy (§18).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestroyEntry {
    pub root: BlockPointer,
    /// Only blocks born after it are freed (0: all).
    pub floor: Txg,
    pub bytes_left: u64,
    pub object: u64,
    pub blkid: u64,
    pub level: u8,
    pub phase: Phase,
}

impl DestroyEntry {
    pub fn new(root: BlockPointer, bytes: u64) -> DestroyEntry {
        DestroyEntry { root, floor: Txg::ZERO, bytes_left: bytes, object: 0, blkid: 0, level: 0, phase: Phase::Objects }
    }

    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[..BlockPointer::SIZE].copy_from_slice(&self.root.encode());
        b[128..136].copy_from_slice(&self.floor.get().to_le_bytes());
        b[136..144].copy_from_slice(&self.bytes_left.to_le_bytes());
        b[144..152].copy_from_slice(&self.object.to_le_bytes());
        b[152..160].copy_from_slice(&self.blkid.to_le_bytes());
        b[160] = self.level;
        b[161] = self.phase as u8;
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<DestroyEntry, String> {
        let root = BlockPointer::check(&b[..BlockPointer::SIZE]).map_err(|e| format!("root pointer: {e}"))?;
        let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let phase = match b[161] {
            0 => Phase::Objects,
            1 => Phase::MetaDnode,
            2 => Phase::ObjsetBlock,
            p => return Err(format!("phase {p}")),
        };
        if root.is_hole() || root.kind != crate::block::blkptr::KIND_OBJSET || b[162..].iter().any(|&x| x != 0) || b[160] > crate::dmu::dnode::MAX_NLEVELS || u(128) >= Txg::LIMIT.get() {
            return Err("an entry out of its limits (root kind, level, floor or reserved bytes)".into());
        }
        Ok(DestroyEntry { root, floor: Txg(u(128)), bytes_left: u(136), object: u(144), blkid: u(152), level: b[160], phase })
    }
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepDone {
    pub copies_freed: u64,
    pub bytes_freed: u64,
    pub finished: bool,
}

/// Free up to `budget` block copies of `e`'s objset through `io`, moving its bookmark.
pub fn destroy_step(io: &dyn BlockIo, e: &mut DestroyEntry, budget: u64) -> Result<StepDone> {
    let (copies, bytes) = (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64));
    let mut free = |bp: &BlockPointer, _: u32| -> Result<bool> {
        let n = bp.copies().count() as u64;
        if copies.get() + n > budget {
            return Ok(false);
        }
        copies.set(copies.get() + n);
        bytes.set(bytes.get() + allocated_bytes(bp));
        io.free(bp);
        Ok(true)
    };
    let finished = walk_phases(io, e, &mut free)?;
    e.bytes_left = if finished { 0 } else { e.bytes_left.saturating_sub(bytes.get()) };
    Ok(StepDone { copies_freed: copies.get(), bytes_freed: bytes.get(), finished })
}

/// The three phases from `e`'s bookmark; true when the objset is all freed.
fn walk_phases(io: &dyn BlockIo, e: &mut DestroyEntry, free: &mut dyn FnMut(&BlockPointer, u32) -> Result<bool>) -> Result<bool> {
    let os = ObjsetPhys::decode(&io.read(&e.root)?, e.root.birth).map_err(Error::Corrupt)?;
    let meta = &os.meta_dnode;
    let meta_tree = Tree { shape: meta.shape(), nlevels: meta.nlevels, roots: &meta.blkptr };
    if e.phase == Phase::Objects {
        if let Some((object, key)) = free_objects(io, &meta_tree, e, free)? {
            (e.object, e.blkid, e.level) = (object, key.0, key.1 as u8);
            return Ok(false);
        }
        (e.phase, e.blkid, e.level) = (Phase::MetaDnode, 0, 0);
    }
    if e.phase == Phase::MetaDnode {
        if let Some(k) = meta_tree.post_order_from_key(io, (e.blkid, e.level as u32), e.floor, free)? {
            (e.blkid, e.level) = (k.0, k.1 as u8);
            return Ok(false);
        }
        e.phase = Phase::ObjsetBlock;
    }
    let root = e.root;
    Ok(!(e.floor == Txg::ZERO || root.birth > e.floor) || free(&root, 0)?)
}

/// Phase 0 from the bookmark: the object and key the budget stopped at, if it did.
fn free_objects(io: &dyn BlockIo, meta_tree: &Tree<'_>, e: &DestroyEntry, free: &mut dyn FnMut(&BlockPointer, u32) -> Result<bool>) -> Result<Option<(u64, (u64, u32))>> {
    let mut stopped = None;
    meta_tree.walk(io, e.object / DNODES_PER_BLOCK, u64::MAX, &mut |blkid, bp| {
        let b = io.read(bp)?;
        for slot in 0..DNODES_PER_BLOCK {
            let object = blkid * DNODES_PER_BLOCK + slot;
            if object == 0 || object < e.object {
                continue;
            }
            let at = slot as usize * DNODE_BYTES;
            let Some(p): Option<DnodePhys> = DnodePhys::decode(&b[at..at + DNODE_BYTES], bp.birth).map_err(|w| Error::Corrupt(format!("object {object}: {w}")))? else { continue };
            let from = if object == e.object { (e.blkid, e.level as u32) } else { (0, 0) };
            let tree = Tree { shape: p.shape(), nlevels: p.nlevels, roots: &p.blkptr };
            if let Some(k) = tree.post_order_from_key(io, from, e.floor, free)? {
                stopped = Some((object, k));
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    Ok(stopped)
}

/// The pool's destroy queue, a MOS object.
pub struct DestroyQueue<'a> {
    pub mos: &'a Objset,
    pub io: &'a dyn BlockIo,
    pub object: u64,
}

impl<'a> DestroyQueue<'a> {
    pub fn create(mos: &'a Objset, io: &'a dyn BlockIo, txg: Txg) -> Result<DestroyQueue<'a>> {
        let object = mos.allocate(io, txg, &ObjectSpec::metadata(ObjectType::DestroyQueue, BLOCK_BYTES))?;
        Ok(DestroyQueue { mos, io, object })
    }

    /// (first unfinished index, entry count).
    pub fn counts(&self) -> Result<(u64, u64)> {
        let b = self.mos.typed_dnode(self.io, self.object, ObjectType::DestroyQueue)?.bonus;
        let first = u64::from_le_bytes(b[..8].try_into().expect("8"));
        let count = u64::from_le_bytes(b[8..16].try_into().expect("8"));
        if first > count || count > MAX_ENTRIES {
            return Err(Error::Corrupt(format!("destroy queue: first unfinished {first} of {count} entries")));
        }
        Ok((first, count))
    }

    fn set_counts(&self, txg: Txg, first: u64, count: u64) -> Result<()> {
        self.mos.update_dnode(self.io, txg, self.object, |p| {
            p.bonus[..8].copy_from_slice(&first.to_le_bytes());
            p.bonus[8..16].copy_from_slice(&count.to_le_bytes());
            Ok(())
        })
    }

    pub fn entry(&self, index: u64) -> Result<DestroyEntry> {
        let b = self.mos.read_block(self.io, self.object, index / ENTRIES_PER_BLOCK)?.ok_or_else(|| Error::Corrupt(format!("destroy queue entry {index}: a hole")))?;
        let at = (index % ENTRIES_PER_BLOCK) as usize * ENTRY_BYTES;
        DestroyEntry::decode(&b[at..at + ENTRY_BYTES]).map_err(|w| Error::Corrupt(format!("destroy queue entry {index}: {w}")))
    }

    /// Write entry `index` in `txg`.
    pub fn set_entry(&self, txg: Txg, index: u64, e: &DestroyEntry) -> Result<()> {
        let blkid = index / ENTRIES_PER_BLOCK;
        let mut b = self.mos.read_block(self.io, self.object, blkid)?.map(|b| b.to_vec()).unwrap_or_else(|| vec![0; BLOCK_BYTES as usize]);
        let at = (index % ENTRIES_PER_BLOCK) as usize * ENTRY_BYTES;
        b[at..at + ENTRY_BYTES].copy_from_slice(&e.encode());
        self.mos.write_block(self.io, txg, self.object, blkid, Some(Arc::new(AlignedBuf::from(&b[..]))))
    }

    /// Queue `e` in `txg`.
    pub fn push(&self, txg: Txg, e: &DestroyEntry) -> Result<()> {
        let (first, count) = self.counts()?;
        if count >= MAX_ENTRIES {
            return Err(Error::NoSpaceFor(format!("the destroy queue holds {MAX_ENTRIES} entries")));
        }
        self.set_entry(txg, count, e)?;
        self.set_counts(txg, first, count + 1)
    }

    /// One txg's work: up to `budget` copies from the first unfinished entries. Returns
    /// the copies freed and whether the queue is now done (the caller then frees it).
    pub fn step(&self, io: &dyn BlockIo, txg: Txg, budget: u64) -> Result<(u64, bool)> {
        let (mut first, count) = self.counts()?;
        let mut freed = 0;
        while first < count && freed < budget {
            let mut e = self.entry(first)?;
            let d = destroy_step(io, &mut e, budget - freed)?;
            freed += d.copies_freed;
            self.set_entry(txg, first, &e)?;
            if !d.finished {
                break;
            }
            first += 1;
        }
        self.set_counts(txg, first, count)?;
        Ok((freed, first == count))
    }

    /// Bytes every unfinished entry has still to free (`pool get freeing`).
    pub fn freeing_bytes(&self) -> Result<u64> {
        let (first, count) = self.counts()?;
        (first..count).try_fold(0u64, |s, i| Ok(s.saturating_add(self.entry(i)?.bytes_left)))
    }
}

#[cfg(test)]
mod tests;
