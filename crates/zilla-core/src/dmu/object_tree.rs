//! object_tree: the copy-on-write block tree of one object (format 2).
//!
//! Theory of operation
//! -------------------
//! An object's data blocks hang from its dnode (docs/on-disk-format.md §11): `nblkptr`
//! root pointers at level `nlevels − 1`, each indirect block holding `2^(indblkshift−7)`
//! pointers to the level below. [`lookup`] descends to one block id; [`walk`] visits the
//! data blocks of a range in order; [`apply`] is the syncing side: given the txg's
//! changed level-0 pointers in block order (new blocks already written, holes for
//! freed ones) it rewrites every indirect block on the paths to them once (copy on
//! write: new blocks born in the txg, the replaced ones freed), recounts `fill`, and
//! returns the new roots, growing the tree by as many levels as the highest change
//! needs. Growing rewrites nothing below: the old roots become the first entries of a
//! new indirect (or a chain of them), built in memory and written with the rest.
//!
//! The tree code sees blocks only through [`BlockIo`] (read a pointer's block, write a
//! block and get its pointer, free a pointer), so the same code runs over the pool's
//! pipeline and over a map in the tests. Every pointer read from an indirect block is
//! checked against the tree's limits ([`check_child`]) before it is followed: a crafted
//! image yields an error naming the field, never a panic or a read the tree cannot hold.

use std::sync::Arc;

use super::dnode::Shape;
use crate::block::blkptr::{self, BlockPointer};
use crate::block::checksum::ChecksumAlgo;
use crate::block::compress::Compression;
use crate::vdev::abd::AlignedBuf;
use crate::{Error, Result, Txg};

/// How a block is to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpec {
    pub kind: u8,
    pub level: u8,
    pub fill: u64,
    pub checksum: ChecksumAlgo,
    pub compression: Compression,
}

/// Where an object's blocks are read, written and freed: the pool's pipeline in the
/// syncing txg, or a map in a test.
pub trait BlockIo {
    /// The txg new blocks are born in.
    fn txg(&self) -> Txg;
    /// The logical content of `bp` (checksum verified).
    fn read(&self, bp: &BlockPointer) -> Result<Arc<AlignedBuf>>;
    /// Write `data` as a new block; its pointer.
    fn write(&self, data: Arc<AlignedBuf>, spec: BlockSpec) -> Result<BlockPointer>;
    /// `bp` is no longer referenced from the txg being synced on.
    fn free(&self, bp: &BlockPointer);
}

/// Bytes a pointer allocates: the `asize` of each of its copies.
pub fn allocated_bytes(bp: &BlockPointer) -> u64 {
    if bp.is_hole() {
        return 0;
    }
    bp.copies().map(|d| d.asize as u64).sum()
}

/// The limits of a pointer at `level` of a tree of `shape` (§11): a hole, or `level`
/// as its level field, the kind and `lsize` of that level, `fill` within what the
/// blocks below can hold, born at or before its parent.
pub fn check_child(bp: &BlockPointer, shape: &Shape, level: u32, parent_birth: Txg) -> std::result::Result<(), String> {
    if bp.is_hole() {
        return Ok(());
    }
    let bad = |field: &str, v: u64| Err(format!("field {field} = {v} is out of range"));
    if bp.birth > parent_birth {
        return Err(format!("field birth = {} is out of range (after its parent's, {parent_birth})", bp.birth));
    }
    if bp.level as u32 != level {
        return bad("level", bp.level as u64);
    }
    let (kind, lsize) = if level == 0 { (shape.data_kind, shape.data_block_bytes) } else { (blkptr::KIND_INDIRECT, shape.indirect_bytes() as u32) };
    if bp.kind != kind {
        return bad("kind", bp.kind as u64);
    }
    if bp.lsize != lsize {
        return bad("lsize", bp.lsize as u64);
    }
    if bp.fill == 0 || bp.fill > shape.fill_max(level) {
        return bad("fill", bp.fill);
    }
    Ok(())
}

/// An object's tree as its dnode holds it.
#[derive(Debug, Clone, Copy)]
pub struct Tree<'a> {
    pub shape: Shape,
    pub nlevels: u8,
    pub roots: &'a [BlockPointer],
}

fn read_indirect(io: &dyn BlockIo, shape: &Shape, bp: &BlockPointer) -> Result<Arc<AlignedBuf>> {
    let d = io.read(bp)?;
    if d.len() != shape.indirect_bytes() {
        return Err(Error::Corrupt(format!("an indirect block of {} bytes, not {}", d.len(), shape.indirect_bytes())));
    }
    Ok(d)
}

/// Entry `idx` of indirect block `ind` (found under `parent`), whose entries are at `level`.
fn child(ind: &[u8], idx: u64, shape: &Shape, level: u32, parent: &BlockPointer) -> Result<BlockPointer> {
    let o = idx as usize * BlockPointer::SIZE;
    BlockPointer::check(&ind[o..o + BlockPointer::SIZE])
        .and_then(|bp| check_child(&bp, shape, level, parent.birth).map(|_| bp))
        .map_err(|e| Error::Corrupt(format!("block pointer {idx} of a level {} indirect block: {e}", level + 1)))
}

impl Tree<'_> {
    /// Block ids the tree covers.
    pub fn capacity(&self) -> u64 {
        self.shape.capacity(self.nlevels)
    }

    /// The level-0 pointer of `blkid` (a hole if never written or beyond the tree).
    pub fn lookup(&self, io: &dyn BlockIo, blkid: u64) -> Result<BlockPointer> {
        if blkid >= self.capacity() {
            return Ok(BlockPointer::hole());
        }
        let top = self.nlevels as u32 - 1;
        let mut bp = self.roots[(blkid / self.shape.span(top)) as usize];
        for level in (1..=top).rev() {
            if bp.is_hole() {
                break;
            }
            let ind = read_indirect(io, &self.shape, &bp)?;
            let idx = (blkid / self.shape.span(level - 1)) & ((1 << self.shape.epb_shift()) - 1);
            bp = child(&ind, idx, &self.shape, level - 1, &bp)?;
        }
        Ok(bp)
    }

    /// Visit the non-hole level-0 pointers of block ids `first ..= last` in order,
    /// skipping hole subtrees; `f` returns false to stop (then so does `walk`).
    pub fn walk(&self, io: &dyn BlockIo, first: u64, last: u64, f: &mut dyn FnMut(u64, &BlockPointer) -> Result<bool>) -> Result<bool> {
        let top = self.nlevels as u32 - 1;
        let span = self.shape.span(top);
        let last = last.min(self.capacity().saturating_sub(1));
        if first > last {
            return Ok(true);
        }
        for i in first / span..=last / span {
            if !self.walk_below(io, &self.roots[i as usize], top, i * span, first, last, f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    #[allow(clippy::too_many_arguments)]
    fn walk_below(&self, io: &dyn BlockIo, bp: &BlockPointer, level: u32, base: u64, first: u64, last: u64, f: &mut dyn FnMut(u64, &BlockPointer) -> Result<bool>) -> Result<bool> {
        if bp.is_hole() {
            return Ok(true);
        }
        if level == 0 {
            return f(base, bp);
        }
        let span = self.shape.span(level - 1);
        let ind = read_indirect(io, &self.shape, bp)?;
        let epb = 1u64 << self.shape.epb_shift();
        let lo = first.saturating_sub(base) / span;
        let hi = ((last - base) / span).min(epb - 1);
        for idx in lo..=hi {
            let c = child(&ind, idx, &self.shape, level - 1, bp)?;
            if !self.walk_below(io, &c, level - 1, base + idx * span, first, last, f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The first block id at or after `from` whose data block is a hole or holds less
    /// than `full` (its pointer's `fill`): where an object allocator finds a dnode block
    /// with a free slot. Subtrees whose `fill` says they are full are not read. Past
    /// the tree's capacity when every block up to it is full.
    pub fn first_with_room(&self, io: &dyn BlockIo, from: u64, full: u64) -> Result<u64> {
        let top = self.nlevels as u32 - 1;
        let span = self.shape.span(top);
        for i in from / span..self.roots.len() as u64 {
            if let Some(b) = self.room_below(io, &self.roots[i as usize], top, i * span, from, full)? {
                return Ok(b);
            }
        }
        Ok(self.capacity().max(from))
    }

    fn room_below(&self, io: &dyn BlockIo, bp: &BlockPointer, level: u32, base: u64, from: u64, full: u64) -> Result<Option<u64>> {
        if bp.is_hole() {
            return Ok(Some(base.max(from)));
        }
        let span = self.shape.span(level);
        // a subtree starting before `from` may be full only after it: look inside
        if bp.fill >= span.saturating_mul(full) && base >= from {
            return Ok(None);
        }
        if level == 0 {
            return Ok((bp.fill < full).then_some(base));
        }
        let child_span = self.shape.span(level - 1);
        let ind = read_indirect(io, &self.shape, bp)?;
        for idx in from.saturating_sub(base) / child_span..1u64 << self.shape.epb_shift() {
            let c = child(&ind, idx, &self.shape, level - 1, bp)?;
            if let Some(b) = self.room_below(io, &c, level - 1, base + idx * child_span, from, full)? {
                return Ok(Some(b));
            }
        }
        Ok(None)
    }

    /// Visit every pointer of the tree, indirect blocks after their children (the
    /// order a destroy frees in), with its level.
    pub fn visit_post_order(&self, io: &dyn BlockIo, f: &mut dyn FnMut(&BlockPointer, u32) -> Result<()>) -> Result<()> {
        let top = self.nlevels as u32 - 1;
        for bp in self.roots {
            self.post_order_below(io, bp, top, f)?;
        }
        Ok(())
    }

    /// Post-order from a bookmark: visit every pointer whose post-order key
    /// `(last block id it covers, level)` is at or after `from`, skipping subtrees
    /// wholly before it (never read) and pointers born at or before `floor` with all
    /// below them. `f` returns false to stop before that pointer; its key is returned
    /// (the bookmark to resume from), `None` when the tree is done.
    pub fn post_order_from_key(&self, io: &dyn BlockIo, from: (u64, u32), floor: Txg, f: &mut dyn FnMut(&BlockPointer, u32) -> Result<bool>) -> Result<Option<(u64, u32)>> {
        let top = self.nlevels as u32 - 1;
        for (i, bp) in self.roots.iter().enumerate() {
            if let Some(k) = self.keyed_below(io, bp, top, i as u64, from, floor, f)? {
                return Ok(Some(k));
            }
        }
        Ok(None)
    }

    #[allow(clippy::too_many_arguments)]
    fn keyed_below(&self, io: &dyn BlockIo, bp: &BlockPointer, level: u32, index: u64, from: (u64, u32), floor: Txg, f: &mut dyn FnMut(&BlockPointer, u32) -> Result<bool>) -> Result<Option<(u64, u32)>> {
        let key = ((index.saturating_add(1)).saturating_mul(self.shape.span(level)).saturating_sub(1), level);
        if bp.is_hole() || (floor > Txg::ZERO && bp.birth <= floor) || key < from {
            return Ok(None);
        }
        if level > 0 {
            let ind = read_indirect(io, &self.shape, bp)?;
            let epb = 1u64 << self.shape.epb_shift();
            for idx in 0..epb {
                let c = child(&ind, idx, &self.shape, level - 1, bp)?;
                if let Some(k) = self.keyed_below(io, &c, level - 1, index.saturating_mul(epb).saturating_add(idx), from, floor, f)? {
                    return Ok(Some(k));
                }
            }
        }
        Ok(if f(bp, level)? { None } else { Some(key) })
    }

    /// Visit every pointer born in `txg` or later, post-order, without reading any
    /// subtree whose pointer is older (copy on write: nothing below it is younger).
    pub fn visit_born_since(&self, io: &dyn BlockIo, txg: Txg, f: &mut dyn FnMut(&BlockPointer, u32) -> Result<()>) -> Result<()> {
        let top = self.nlevels as u32 - 1;
        for bp in self.roots {
            self.post_order_from(io, bp, top, txg, f)?;
        }
        Ok(())
    }

    fn post_order_below(&self, io: &dyn BlockIo, bp: &BlockPointer, level: u32, f: &mut dyn FnMut(&BlockPointer, u32) -> Result<()>) -> Result<()> {
        self.post_order_from(io, bp, level, Txg::ZERO, f)
    }

    fn post_order_from(&self, io: &dyn BlockIo, bp: &BlockPointer, level: u32, since: Txg, f: &mut dyn FnMut(&BlockPointer, u32) -> Result<()>) -> Result<()> {
        if bp.is_hole() || bp.birth < since {
            return Ok(());
        }
        if level > 0 {
            let ind = read_indirect(io, &self.shape, bp)?;
            for idx in 0..1u64 << self.shape.epb_shift() {
                let c = child(&ind, idx, &self.shape, level - 1, bp)?;
                self.post_order_from(io, &c, level - 1, since, f)?;
            }
        }
        f(bp, level)
    }
}

/// What [`apply`] made of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub nlevels: u8,
    pub roots: Vec<BlockPointer>,
    /// Bytes allocated minus bytes freed (every copy of every block changed).
    pub used_delta: i64,
}

/// The sum of the `fill` fields of an indirect block's entries.
fn fill_of(ind: &[u8]) -> u64 {
    ind.chunks_exact(BlockPointer::SIZE).map(|e| u64::from_le_bytes(e[64..72].try_into().unwrap())).fold(0, u64::saturating_add)
}

/// A subtree as it was before the txg: a pointer of the old tree, or (while the tree
/// grows) a new indirect `depth` levels above the old roots, which becomes entry 0 of
/// the one above it.
#[derive(Clone, Copy)]
enum Old<'a> {
    Bp(BlockPointer),
    Grown { roots: &'a [BlockPointer], depth: u32 },
}

struct Rebuild<'a> {
    io: &'a dyn BlockIo,
    shape: Shape,
    used_delta: i64,
}

/// Apply a txg's level-0 changes to `tree`: `changes` are `(block id, new pointer)` in
/// strictly ascending block order, each pointer already written (or a hole: the block
/// is freed). The replaced level-0 pointers and indirects are freed through `io`; the
/// new indirects are written through it. Returns the new roots, at the levels the
/// highest change needs (never fewer than before).
pub fn apply(io: &dyn BlockIo, tree: &Tree<'_>, changes: &[(u64, BlockPointer)]) -> Result<Applied> {
    assert!(changes.windows(2).all(|w| w[0].0 < w[1].0), "tree changes out of block order");
    let shape = tree.shape;
    let highest = changes.iter().rev().find(|c| !c.1.is_hole()).map_or(0, |c| c.0);
    let nlevels = tree.nlevels.max(shape.levels_for(highest));
    if highest >= shape.capacity(nlevels) {
        return Err(Error::invalid(format!("block id {highest} is beyond what an object of this shape can hold")));
    }
    let grown = nlevels - tree.nlevels;
    let has_data = tree.roots.iter().any(|b| !b.is_hole());
    let top = nlevels as u32 - 1;
    let span = shape.span(top);
    let mut rb = Rebuild { io, shape, used_delta: 0 };
    let mut roots = Vec::with_capacity(tree.roots.len());
    let mut rest = changes;
    for i in 0..tree.roots.len() as u64 {
        let n = rest.iter().take_while(|c| c.0 / span == i).count();
        let (mine, after) = rest.split_at(n);
        rest = after;
        let old = match (grown, i) {
            (0, _) => Old::Bp(tree.roots[i as usize]),
            (_, 0) if has_data => Old::Grown { roots: tree.roots, depth: grown as u32 },
            _ => Old::Bp(BlockPointer::hole()),
        };
        let untouched = mine.is_empty() && matches!(old, Old::Bp(_));
        roots.push(if untouched { if let Old::Bp(bp) = old { bp } else { unreachable!() } } else { rb.rebuild(old, top, i * span, mine)? });
    }
    // changes beyond the last root's span are holes (frees of never-written blocks)
    debug_assert!(rest.iter().all(|c| c.1.is_hole()));
    Ok(Applied { nlevels, roots, used_delta: rb.used_delta })
}

impl Rebuild<'_> {
    fn free(&mut self, bp: &BlockPointer) {
        if !bp.is_hole() {
            self.used_delta -= allocated_bytes(bp) as i64;
            self.io.free(bp);
        }
    }

    /// The new pointer for `old` at `level`, covering block ids from `base`, after
    /// `changes` (all inside it).
    fn rebuild(&mut self, old: Old<'_>, level: u32, base: u64, changes: &[(u64, BlockPointer)]) -> Result<BlockPointer> {
        if level == 0 {
            debug_assert_eq!(changes.len(), 1);
            if let Old::Bp(bp) = old {
                self.free(&bp);
            }
            let new = changes[0].1;
            self.used_delta += allocated_bytes(&new) as i64;
            return Ok(new);
        }
        let shape = self.shape;
        let epb = 1u64 << shape.epb_shift();
        let span = shape.span(level - 1);
        let mut ind = vec![0u8; shape.indirect_bytes()];
        let mut below: Option<Arc<AlignedBuf>> = None;
        match old {
            Old::Bp(bp) if !bp.is_hole() => {
                let d = read_indirect(self.io, &shape, &bp)?;
                ind.copy_from_slice(&d);
                below = Some(d);
            }
            Old::Grown { roots, depth: 1 } => {
                for (i, r) in roots.iter().enumerate() {
                    ind[i * BlockPointer::SIZE..(i + 1) * BlockPointer::SIZE].copy_from_slice(&r.encode());
                }
            }
            _ => {}
        }
        let child_of = |idx: u64| -> Result<Old<'_>> {
            match (old, &below) {
                (Old::Bp(bp), Some(d)) => Ok(Old::Bp(child(d, idx, &shape, level - 1, &bp)?)),
                (Old::Grown { roots, depth: 1 }, _) => Ok(Old::Bp(roots.get(idx as usize).copied().unwrap_or_default())),
                (Old::Grown { roots, depth }, _) if idx == 0 => Ok(Old::Grown { roots, depth: depth - 1 }),
                _ => Ok(Old::Bp(BlockPointer::hole())),
            }
        };
        let put = |ind: &mut [u8], idx: u64, bp: &BlockPointer| {
            let o = idx as usize * BlockPointer::SIZE;
            ind[o..o + BlockPointer::SIZE].copy_from_slice(&bp.encode());
        };
        // entry 0 of a grown chain above depth 1 is built even with no change under it
        let grown_above = matches!(old, Old::Grown { depth, .. } if depth > 1);
        if grown_above && changes.first().map(|c| (c.0 - base) / span) != Some(0) {
            let new = self.rebuild(child_of(0)?, level - 1, base, &[])?;
            put(&mut ind, 0, &new);
        }
        let mut i = 0;
        while i < changes.len() {
            let idx = (changes[i].0 - base) / span;
            let j = i + changes[i..].iter().take_while(|c| (c.0 - base) / span == idx).count();
            let new = self.rebuild(child_of(idx)?, level - 1, base + idx * span, &changes[i..j])?;
            put(&mut ind, idx, &new);
            i = j;
        }
        debug_assert!(changes.iter().all(|c| (c.0 - base) / span < epb));
        if let Old::Bp(bp) = old {
            self.free(&bp);
        }
        let fill = fill_of(&ind);
        if fill == 0 {
            return Ok(BlockPointer::hole());
        }
        let spec = BlockSpec { kind: blkptr::KIND_INDIRECT, level: level as u8, fill, checksum: ChecksumAlgo::Fletcher4, compression: Compression::Lz4 };
        let new = self.io.write(Arc::new(AlignedBuf::from(&ind[..])), spec)?;
        self.used_delta += allocated_bytes(&new) as i64;
        Ok(new)
    }
}

#[cfg(test)]
pub(crate) mod tests;
