//! dmu: block I/O through the ARC, volume block-pointer trees, dirty records, the MOS.
//!
//! Theory of operation
//! -------------------
//! A volume is a tree of block pointers. Level 0 blocks hold `volblocksize` bytes of
//! data; an indirect block is 128 KiB holding 1024 block pointers; the root pointer sits
//! in the volume's record in the object directory (MOS):
//!
//! ```text
//!   uberblock ─► MOS index ─► MOS chunks (volumes, space maps, defer lists, scan state)
//!                                  │ volume record: root bp, nlevels
//!                                  ▼
//!                      L2 indirect [bp × 1024] ─► L1 indirect [bp × 1024] ─► L0 data
//! ```
//!
//! Writes never touch the tree directly: they become *dirty records* — the new content of
//! a whole block (or "free") tagged with the txg they joined — kept in per-volume shards.
//! Reads look at the newest dirty record first, then at the committed tree. When txg T
//! syncs, its records are written to fresh locations, every indirect block on the path
//! to them is rewritten (copy-on-write), the old blocks go to the defer list, and the new
//! root is published; only then are T's records dropped, so a reader always finds the
//! data either dirty or committed.
//!
//! A partial-block write needs the block's old content (read-modify-write). It is read
//! without any lock; a per-shard `commit_gen` counter detects a sync that committed the
//! block meanwhile, in which case the read is retried.

use crate::vdev::abd::AlignedBuf;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::arc::BufKind;
use crate::metaslab::Metaslabs;
use crate::vdev::IoClass;
use crate::block::blkptr::{self, BlockPointer};
use crate::block::checksum::ChecksumAlgo;
use crate::block::compress::Compression;
use crate::zio::{PendingWrite, PoolIo};
use crate::BlockId;
use crate::{Error, Result, Txg};

pub const INDIRECT_SIZE: usize = 128 << 10;
// space admission (a lower layer) prices a dirtied indirect block as two copies of it
const _: () = assert!(crate::dsl_pool::INDIRECT_COST_BYTES == 2 * INDIRECT_SIZE as u64);
pub const INDIRECT_SHIFT: u32 = 10;
pub const EPB: u64 = 1 << INDIRECT_SHIFT;

/// A volume's tree geometry, seen from one of its data blocks.
impl BlockId {
    /// Index, among the blocks of level `level`, of the block above this one at that
    /// level (level 0: this block's own id).
    pub const fn ancestor(self, level: u32) -> u64 {
        self.0 >> (INDIRECT_SHIFT * level)
    }
    /// Which of the EPB block pointers of its level-`level` ancestor (level >= 1) leads
    /// towards this block.
    pub const fn slot_in(self, level: u32) -> u64 {
        self.ancestor(level - 1) & (EPB - 1)
    }
    /// The last block id of the L1 span (EPB blocks) this block begins or lies in,
    /// not past `last`.
    pub fn span_end(self, last: BlockId) -> BlockId {
        BlockId((self.0 | (EPB - 1)).min(last.0))
    }
}
pub const MOS_CHUNK_SIZE: usize = 128 << 10;
pub const MOS_MAGIC: u64 = 0x5a494c4c_414d4f53; // "ZILLAMOS"
pub const MOS_VERSION: u64 = 1;

pub use crate::block::reader::Reader;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Number of tree levels (including L0) for `nblocks` blocks.
pub fn levels_for(nblocks: u64) -> u8 {
    let mut levels = 1u8;
    let mut span = 1u64;
    while span < nblocks {
        span = span.saturating_mul(EPB);
        levels += 1;
    }
    levels
}

/// Read an indirect block of a volume tree (through the ARC, as metadata) and check
/// that it is one.
pub fn read_indirect(io: &PoolIo, bp: &BlockPointer, class: IoClass) -> Result<Arc<AlignedBuf>> {
    read_indirect_hinted(io, bp, class, crate::arc::CacheHint::METADATA)
}

/// [`read_indirect`] cached with `hint` (its volume's `secondarycache`).
pub fn read_indirect_hinted(io: &PoolIo, bp: &BlockPointer, class: IoClass, hint: crate::arc::CacheHint) -> Result<Arc<AlignedBuf>> {
    let d = io.read_block_hinted(bp, class, hint, true)?;
    if d.len() != INDIRECT_SIZE || bp.kind != blkptr::KIND_INDIRECT {
        return Err(Error::Corrupt(format!("indirect block has size {} kind {}", d.len(), bp.kind)));
    }
    Ok(d)
}

fn child_bp(ind: &[u8], idx: u64) -> Result<BlockPointer> {
    let o = idx as usize * BlockPointer::SIZE;
    BlockPointer::check(&ind[o..o + BlockPointer::SIZE]).map_err(|e| Error::Corrupt(format!("block pointer {idx} of an indirect block: {e}")))
}

/// Pointer `idx` of an indirect block of a volume tree, whose children are at `level`:
/// a valid block pointer ([`BlockPointer::check`]) that is also what a tree holds at
/// that level ([`check_tree_bp`]).
pub fn tree_child(ind: &[u8], idx: u64, level: u32, parent_birth: Txg) -> Result<BlockPointer> {
    let bp = child_bp(ind, idx)?;
    check_tree_bp(&bp, level, None, parent_birth).map_err(|e| Error::Corrupt(format!("block pointer {idx} of a level {} indirect block: {e}", level + 1)))?;
    Ok(bp)
}

/// The limits of a non-hole pointer at `level` of a volume tree (docs/on-disk-format.md
/// §6): a data block (level 0: kind 1, fill 1, `lsize` the volume's block size when
/// `volblocksize` is known) or an indirect (kind 2, `lsize` 128 KiB, fill 1 …
/// 1024^level); its `level` field is the level it is found at, and it was born at or
/// before its parent (`parent_birth`: the txg of the object directory for the root), which
/// copy-on-write rewrote with it.
#[inline]
pub fn check_tree_bp(bp: &BlockPointer, level: u32, volblocksize: Option<u32>, parent_birth: Txg) -> std::result::Result<(), String> {
    // every read of a cached block asks: one predicate first, the message only on failure
    let indirect = level != 0;
    let (kind, lsize) = if indirect { (blkptr::KIND_INDIRECT, Some(INDIRECT_SIZE as u32)) } else { (blkptr::KIND_DATA, volblocksize) };
    let max_fill = if indirect { EPB.saturating_pow(level) } else { 1 };
    let ok = (bp.birth <= parent_birth)
        & (bp.kind == kind)
        & (bp.level as u32 == level)
        & (bp.fill != 0)
        & (bp.fill <= max_fill)
        & lsize.map_or(true, |l| l == bp.lsize);
    if ok || bp.is_hole() {
        return Ok(());
    }
    check_tree_bp_fields(bp, level, volblocksize, parent_birth)
}

/// [`check_tree_bp`]'s limits one by one, naming the first field out of range.
#[cold]
fn check_tree_bp_fields(bp: &BlockPointer, level: u32, volblocksize: Option<u32>, parent_birth: Txg) -> std::result::Result<(), String> {
    let bad = |field: &str, v: u64| Err(format!("field {field} = {v} is out of range"));
    if bp.birth > parent_birth {
        return Err(format!("field birth = {} is out of range (after its parent's, {parent_birth})", bp.birth));
    }
    let (kind, max_fill) = if level == 0 { (blkptr::KIND_DATA, 1) } else { (blkptr::KIND_INDIRECT, EPB.saturating_pow(level)) };
    if bp.kind != kind {
        return bad("kind", bp.kind as u64);
    }
    if bp.level as u32 != level {
        return bad("level", bp.level as u64);
    }
    if bp.fill == 0 || bp.fill > max_fill {
        return bad("fill", bp.fill);
    }
    let lsize = if level == 0 { volblocksize } else { Some(INDIRECT_SIZE as u32) };
    if lsize.is_some_and(|l| l != bp.lsize) {
        return bad("lsize", bp.lsize as u64);
    }
    Ok(())
}

/// Committed root of a volume's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeRoot {
    pub bp: BlockPointer,
    pub nlevels: u8,
}

impl TreeRoot {
    /// What freeing this whole tree in one txg adds to the object directory (a defer
    /// entry per block): `fill` data blocks and at most one indirect per EPB of them
    /// per level.
    pub fn free_cost_bytes(&self) -> u64 {
        if self.bp.is_hole() {
            return 0;
        }
        let data = self.bp.fill;
        let indirects = data.div_ceil(EPB) * 2 + self.nlevels as u64;
        crate::dsl_pool::tree_free_cost_bytes(data, indirects)
    }
}

/// Find the L0 block pointer of `blkid` (hole if unwritten).
pub fn lookup(io: &PoolIo, root: &TreeRoot, blkid: BlockId, class: IoClass) -> Result<BlockPointer> {
    lookup_hinted(io, root, blkid, class, crate::arc::CacheHint::METADATA)
}

/// [`lookup`] caching the indirect blocks it reads with `hint`.
pub fn lookup_hinted(io: &PoolIo, root: &TreeRoot, blkid: BlockId, class: IoClass, hint: crate::arc::CacheHint) -> Result<BlockPointer> {
    let mut bp = root.bp;
    for level in (1..root.nlevels as u32).rev() {
        if bp.is_hole() {
            return Ok(bp);
        }
        let ind = read_indirect_hinted(io, &bp, class, hint)?;
        bp = tree_child(&ind, blkid.slot_in(level), level - 1, bp.birth)?;
    }
    Ok(bp)
}

/// Visit every non-hole L0 block pointer whose blkid lies in `[first, last]`, in order,
/// skipping hole subtrees; the indirect blocks read are cached as `hint` says. `f`
/// returns false to stop.
pub fn walk_range(
    io: &PoolIo,
    root: &TreeRoot,
    first: BlockId,
    last: BlockId,
    class: IoClass,
    hint: crate::arc::CacheHint,
    f: &mut dyn FnMut(BlockId, &BlockPointer) -> Result<bool>,
) -> Result<bool> {
    #[allow(clippy::too_many_arguments)]
    fn rec(
        io: &PoolIo,
        bp: &BlockPointer,
        level: u32,
        base: u64,
        first: u64,
        last: u64,
        class: IoClass,
        hint: crate::arc::CacheHint,
        f: &mut dyn FnMut(BlockId, &BlockPointer) -> Result<bool>,
    ) -> Result<bool> {
        if bp.is_hole() {
            return Ok(true);
        }
        if level == 0 {
            return f(BlockId(base), bp);
        }
        let span = EPB.pow(level - 1);
        let ind = read_indirect_hinted(io, bp, class, hint)?;
        let lo = first.saturating_sub(base) / span;
        let hi = ((last - base) / span).min(EPB - 1);
        for idx in lo..=hi {
            let c = tree_child(&ind, idx, level - 1, bp.birth)?;
            if !rec(io, &c, level - 1, base + idx * span, first, last, class, hint, f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
    rec(io, &root.bp, root.nlevels as u32 - 1, 0, first.get(), last.get(), class, hint, f)
}

/// Visit every block pointer of the tree (indirects included), parents before children.
pub fn walk_all(io: &PoolIo, root: &TreeRoot, class: IoClass, f: &mut dyn FnMut(&BlockPointer, u8) -> Result<()>) -> Result<()> {
    walk_all_hinted(io, root, class, crate::arc::CacheHint::METADATA, f)
}

/// [`walk_all`], the indirect blocks it reads cached as `hint` says (a volume's
/// `secondarycache` decides whether they may go to a cache device).
pub fn walk_all_hinted(io: &PoolIo, root: &TreeRoot, class: IoClass, hint: crate::arc::CacheHint, f: &mut dyn FnMut(&BlockPointer, u8) -> Result<()>) -> Result<()> {
    fn rec(io: &PoolIo, bp: &BlockPointer, level: u32, class: IoClass, hint: crate::arc::CacheHint, f: &mut dyn FnMut(&BlockPointer, u8) -> Result<()>) -> Result<()> {
        if bp.is_hole() {
            return Ok(());
        }
        f(bp, level as u8)?;
        if level == 0 {
            return Ok(());
        }
        let ind = read_indirect_hinted(io, bp, class, hint)?;
        for idx in 0..EPB {
            let c = tree_child(&ind, idx, level - 1, bp.birth)?;
            rec(io, &c, level - 1, class, hint, f)?;
        }
        Ok(())
    }
    rec(io, &root.bp, root.nlevels as u32 - 1, class, hint, f)
}

/// Per-volume settings the syncing context needs.
pub struct WritePolicy {
    pub algo: ChecksumAlgo,
    pub comp: Compression,
    pub txg: Txg,
    /// Keep the new indirect blocks for the ARC (primarycache all or metadata).
    pub cache_metadata: bool,
    /// How an old indirect block read for the rewrite is cached: the volume's
    /// `secondarycache` decides whether it may go to a cache device.
    pub read_hint: crate::arc::CacheHint,
}

/// A block written by a sync, to enter the ARC once its txg has committed.
pub type WrittenBlock = (crate::arc::BlockKey, Arc<AlignedBuf>);

/// Apply sorted L0 changes to the tree rooted at `root`: write new indirects (queued in
/// `batch`), free replaced blocks in `txg`. Returns the new root. With
/// `pol.cache_metadata` the new indirects are pushed to `written`, so the caller caches
/// them once the txg commits: without that, every txg left the next write under each
/// rewritten indirect (and the next sync's rewrite of it) to read it back from disk.
pub fn apply_changes(
    io: &PoolIo,
    root: &TreeRoot,
    changes: &[(BlockId, BlockPointer)],
    pol: &WritePolicy,
    batch: &mut Vec<PendingWrite>,
    written: &mut Vec<WrittenBlock>,
) -> Result<TreeRoot> {
    #[allow(clippy::too_many_arguments)]
    fn rec(
        io: &PoolIo,
        bp: &BlockPointer,
        level: u32,
        base: u64,
        changes: &[(BlockId, BlockPointer)],
        pol: &WritePolicy,
        batch: &mut Vec<PendingWrite>,
        written: &mut Vec<WrittenBlock>,
    ) -> Result<BlockPointer> {
        if level == 0 {
            debug_assert_eq!(changes.len(), 1);
            io.free_block(bp, pol.txg);
            return Ok(changes[0].1);
        }
        let span = EPB.pow(level - 1);
        let mut ind: Vec<u8> = if bp.is_hole() {
            vec![0u8; INDIRECT_SIZE]
        } else {
            read_indirect_hinted(io, bp, IoClass::AsyncRead, pol.read_hint)?.to_vec()
        };
        let mut i = 0;
        while i < changes.len() {
            let idx = (changes[i].0.get() - base) / span;
            let mut j = i + 1;
            while j < changes.len() && (changes[j].0.get() - base) / span == idx {
                j += 1;
            }
            let old = tree_child(&ind, idx, level - 1, bp.birth)?;
            let new = rec(io, &old, level - 1, base + idx * span, &changes[i..j], pol, batch, written)?;
            let o = idx as usize * BlockPointer::SIZE;
            ind[o..o + BlockPointer::SIZE].copy_from_slice(&new.encode());
            i = j;
        }
        io.free_block(bp, pol.txg);
        let mut fill = 0u64;
        for idx in 0..EPB {
            fill = fill.saturating_add(child_bp(&ind, idx)?.fill);
        }
        if fill == 0 {
            return Ok(BlockPointer::hole());
        }
        let ind: Arc<AlignedBuf> = Arc::new(AlignedBuf::from(ind));
        let new = io.alloc_block(&ind, pol.txg, blkptr::KIND_INDIRECT, level as u8, fill, ChecksumAlgo::Fletcher4, Compression::Lz4, 2, batch)?;
        if pol.cache_metadata {
            written.push((crate::arc::BlockKey::of(&new), ind));
        }
        Ok(new)
    }
    if changes.is_empty() {
        return Ok(*root);
    }
    let bp = rec(io, &root.bp, root.nlevels as u32 - 1, 0, changes, pol, batch, written)?;
    Ok(TreeRoot { bp, nlevels: root.nlevels })
}

// ---------------------------------------------------------------------------------------
// Dirty records

pub const DIRTY_SHARDS: usize = 64;

#[derive(Clone)]
pub struct DirtyVersion {
    pub txg: Txg,
    /// None = the block was freed (reads as zeros, hole).
    pub data: Option<Arc<AlignedBuf>>,
}

/// The dirty set's maps hash with a seeded foldhash (SipHash was a visible share of every
/// write's CPU: a block id and three indirect keys hashed per dirtied block); the
/// per-process random seed keeps keys crafted by a client from colliding.
type FastHash = foldhash::fast::RandomState;

#[derive(Default)]
pub struct DirtyShard {
    pub blocks: HashMap<BlockId, Vec<DirtyVersion>, FastHash>,
    /// Incremented whenever a sync drops committed records from this shard.
    pub commit_gen: u64,
}

pub struct DirtySet {
    pub shards: Vec<Mutex<DirtyShard>>,
    /// Indirect blocks dirtied per txg, as (txg, level, index): each is rewritten by
    /// that txg's sync, and space admission counts it once. Sharded by index.
    indirects: Vec<Mutex<std::collections::HashSet<(Txg, u8, u64), FastHash>>>,
}

/// Shards of [`DirtySet::indirects`].
const INDIRECT_SHARDS: usize = 16;

impl Default for DirtySet {
    fn default() -> Self {
        DirtySet {
            shards: (0..DIRTY_SHARDS).map(|_| Mutex::new(DirtyShard::default())).collect(),
            indirects: (0..INDIRECT_SHARDS).map(|_| Mutex::new(Default::default())).collect(),
        }
    }
}

impl DirtySet {
    pub fn shard(&self, blkid: BlockId) -> &Mutex<DirtyShard> {
        &self.shards[(blkid.get() as usize) % DIRTY_SHARDS]
    }
    /// Newest dirty version of a block: Some(None) = freed, Some(Some) = data.
    pub fn newest(&self, blkid: BlockId) -> Option<Option<Arc<AlignedBuf>>> {
        self.shard(blkid).lock().blocks.get(&blkid).and_then(|v| v.last()).map(|v| v.data.clone())
    }
    /// Insert a version for `txg`; returns true if this block became newly dirty in txg.
    /// Versions stay in txg order: `txg` is at least the newest version's (a writer
    /// holding an older txg writes into the newest version, see zvol update_block).
    pub fn insert(shard: &mut DirtyShard, blkid: BlockId, txg: Txg, data: Option<Arc<AlignedBuf>>) -> bool {
        let v = shard.blocks.entry(blkid).or_default();
        assert!(v.last().is_none_or(|last| last.txg <= txg), "dirty version of {txg:?} after a newer one: its sync would be overwritten by the older data");
        match v.last_mut() {
            Some(last) if last.txg == txg => {
                last.data = data;
                false
            }
            _ => {
                v.push(DirtyVersion { txg, data });
                true
            }
        }
    }
    /// Every record of txg `txg`, sorted by blkid.
    pub fn collect(&self, txg: Txg) -> Vec<(BlockId, Option<Arc<AlignedBuf>>)> {
        let mut out = Vec::new();
        for s in &self.shards {
            let s = s.lock();
            for (&blk, vs) in &s.blocks {
                if let Some(v) = vs.iter().find(|v| v.txg == txg) {
                    out.push((blk, v.data.clone()));
                }
            }
        }
        out.sort_by_key(|x| x.0);
        out
    }
    /// Drop every record of a txg <= `txg` (it is committed).
    /// Block `blkid` became dirty in `txg`: how many indirect blocks above it (in a
    /// tree of `nlevels`) became dirty in `txg` with it.
    pub fn note_indirects(&self, txg: Txg, blkid: BlockId, nlevels: u8) -> u32 {
        let mut n = 0;
        for level in 1..nlevels.max(1) {
            let idx = blkid.ancestor(level as u32);
            let newly = self.indirects[(idx as usize) % INDIRECT_SHARDS].lock().insert((txg, level, idx));
            if !newly {
                break; // its parents are dirty already
            }
            n += 1;
        }
        n
    }

    pub fn retire(&self, txg: Txg) {
        for s in &self.shards {
            let mut s = s.lock();
            s.blocks.retain(|_, vs| {
                vs.retain(|v| v.txg > txg);
                !vs.is_empty()
            });
            // a burst of dirty blocks must not pin its table's memory for good
            if s.blocks.capacity() > 64 && s.blocks.len() < s.blocks.capacity() / 4 {
                s.blocks.shrink_to_fit();
            }
            s.commit_gen += 1;
        }
        for m in &self.indirects {
            let mut m = m.lock();
            m.retain(|&(t, _, _)| t > txg);
            if m.capacity() > 64 && m.len() < m.capacity() / 4 {
                m.shrink_to_fit();
            }
        }
    }
    pub fn has_dirty(&self, txg: Txg) -> bool {
        self.shards.iter().any(|s| s.lock().blocks.values().any(|vs| vs.iter().any(|v| v.txg == txg)))
    }
    pub fn clear(&self) {
        for s in &self.shards {
            let mut s = s.lock();
            s.blocks.clear();
            s.commit_gen += 1;
        }
        for m in &self.indirects {
            m.lock().clear();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The object directory (MOS)

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: u64,
    pub name: String,
    pub volsize: u64,
    pub volblocksize: u32,
    pub root: TreeRoot,
    pub props: crate::props::PropSet,
    pub created_txg: Txg,
}

/// Everything the MOS holds, decoded.
#[derive(Debug, Clone)]
pub struct Mos {
    pub txg: Txg,
    pub next_volume_id: u64,
    pub volumes: Vec<VolumeRecord>,
    /// The scan's status and bookmark (`scan::ScanStatus` as JSON; empty when no scan
    /// ever ran), so a paused or interrupted scrub resumes after import.
    pub scan_state: String,
    /// Pool properties (JSON).
    pub pool_props: String,
    /// Health of every leaf: its DTL and whether it is faulted (the persistent home of
    /// both, as OpenZFS keeps DTL space maps in the MOS). `None` in an object directory
    /// written before this section existed (the DTLs were then in the labels).
    pub leaf_health: Option<Vec<LeafHealth>>,
    /// ZIL headers by volume id (volumes without a log chain are not listed). A
    /// trailing section after the leaf health: object directories written before it
    /// existed decode with none.
    pub zil_headers: Vec<(u64, crate::zil::ZilHeader)>,
    /// The pool's command history (spa_history.rs): a trailing section after the ZIL
    /// headers, absent while empty and in object directories written before it existed.
    pub history: crate::spa_history::History,
}

/// One leaf's persistent health record in the MOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafHealth {
    pub guid: crate::Guid,
    pub faulted: bool,
    /// Txg ranges [first, last] the leaf is missing (at most `DTL_MAX_RANGES`).
    pub dtl: Vec<(Txg, Txg)>,
}

/// Most leaves a pool's health section may list (a crafted image cannot make decode
/// allocate more).
pub const MOS_MAX_LEAVES: u32 = 4096;

fn encode_leaf_health(out: &mut Vec<u8>, recs: &[LeafHealth]) {
    out.extend_from_slice(&(recs.len() as u32).to_le_bytes());
    for r in recs {
        out.extend_from_slice(&r.guid.get().to_le_bytes());
        out.push(r.faulted as u8);
        out.extend_from_slice(&(r.dtl.len() as u32).to_le_bytes());
        for &(a, b) in &r.dtl {
            out.extend_from_slice(&a.get().to_le_bytes());
            out.extend_from_slice(&b.get().to_le_bytes());
        }
    }
}

fn decode_leaf_health(r: &mut Reader<'_>) -> Result<Vec<LeafHealth>> {
    let n = r.u32()?;
    if n > MOS_MAX_LEAVES {
        return Err(Error::Corrupt(format!("object directory lists {n} leaves (at most {MOS_MAX_LEAVES})")));
    }
    let mut recs = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let guid = crate::Guid(r.u64()?);
        let faulted = match r.u8()? {
            0 => false,
            1 => true,
            f => return Err(Error::Corrupt(format!("leaf {guid}: bad health flags {f}"))),
        };
        let nr = r.u32()?;
        if nr as usize > crate::vdev::mirror::DTL_MAX_RANGES {
            return Err(Error::Corrupt(format!("leaf {guid}: {nr} DTL ranges")));
        }
        let mut dtl = Vec::with_capacity(nr as usize);
        for _ in 0..nr {
            let (a, b) = (Txg(r.u64()?), Txg(r.u64()?));
            if a > b || dtl.last().is_some_and(|&(_, pb): &(Txg, Txg)| pb >= a) {
                return Err(Error::Corrupt(format!("leaf {guid}: DTL ranges out of order")));
            }
            dtl.push((a, b));
        }
        recs.push(LeafHealth { guid, faulted, dtl });
    }
    Ok(recs)
}

/// A volume's root pointer from the object directory: a block pointer that is the top
/// of a tree of `nlevels` levels of `volblocksize` blocks, with at most `nblocks` data
/// blocks below it.
fn check_volume_root(name: &str, b: &[u8], nblocks: u64, volblocksize: u32, nlevels: u8, mos_txg: Txg) -> Result<BlockPointer> {
    let bad = |e: String| Error::Corrupt(format!("volume {name}: root block pointer: {e}"));
    let bp = BlockPointer::check(b).map_err(bad)?;
    check_tree_bp(&bp, nlevels as u32 - 1, Some(volblocksize), mos_txg).map_err(bad)?;
    if bp.fill > nblocks {
        return Err(bad(format!("field fill = {} is out of range (the volume has {nblocks} blocks)", bp.fill)));
    }
    Ok(bp)
}

impl Mos {
    pub fn encode(&self, ms: &Metaslabs) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MOS_MAGIC.to_le_bytes());
        out.extend_from_slice(&MOS_VERSION.to_le_bytes());
        out.extend_from_slice(&self.txg.get().to_le_bytes());
        out.extend_from_slice(&self.next_volume_id.to_le_bytes());
        out.extend_from_slice(&(self.volumes.len() as u32).to_le_bytes());
        for v in &self.volumes {
            out.extend_from_slice(&v.id.to_le_bytes());
            put_str(&mut out, &v.name);
            out.extend_from_slice(&v.volsize.to_le_bytes());
            out.extend_from_slice(&v.volblocksize.to_le_bytes());
            out.push(v.root.nlevels);
            out.extend_from_slice(&v.root.bp.encode());
            put_str(&mut out, &serde_json::to_string(v.props.local()).unwrap_or_default());
            out.extend_from_slice(&v.created_txg.get().to_le_bytes());
        }
        ms.encode(&mut out);
        put_str(&mut out, &self.scan_state);
        put_str(&mut out, &self.pool_props);
        if let Some(h) = &self.leaf_health {
            encode_leaf_health(&mut out, h);
            let zh: Vec<_> = self.zil_headers.iter().filter(|(_, h)| !h.is_empty()).collect();
            if !zh.is_empty() || !self.history.is_empty() {
                out.extend_from_slice(&(zh.len() as u32).to_le_bytes());
                for (id, h) in zh {
                    out.extend_from_slice(&id.to_le_bytes());
                    h.encode(&mut out);
                }
            }
            if !self.history.is_empty() {
                self.history.encode(&mut out);
            }
        } else {
            debug_assert!(self.zil_headers.is_empty(), "ZIL headers need the leaf health section before them");
        }
        out
    }

    pub fn decode(b: &[u8], ms: &mut Metaslabs) -> Result<Mos> {
        let mut r = Reader::new(b);
        if r.u64()? != MOS_MAGIC {
            return Err(Error::Corrupt("bad object directory magic".into()));
        }
        let ver = r.u64()?;
        if ver != MOS_VERSION {
            return Err(Error::Corrupt(format!("unsupported object directory version {ver}")));
        }
        let txg = Txg(r.u64()?);
        let next_volume_id = r.u64()?;
        let n = r.u32()?;
        if n > 1_000_000 {
            return Err(Error::Corrupt("absurd volume count".into()));
        }
        let mut volumes = Vec::new();
        for _ in 0..n {
            let id = r.u64()?;
            let name = r.string()?;
            let volsize = r.u64()?;
            let volblocksize = r.u32()?;
            let nlevels = r.u8()?;
            let root_bytes = r.bytes(BlockPointer::SIZE)?;
            let props_json = r.string()?;
            let local: BTreeMap<String, String> =
                serde_json::from_str(&props_json).map_err(|e| Error::Corrupt(format!("volume properties: {e}")))?;
            let created_txg = Txg(r.u64()?);
            // the tree's height follows from the geometry; anything else (a crafted
            // nlevels = 8 would overflow EPB^7) is corrupt
            if !(512..=(128 << 10)).contains(&volblocksize) || !volblocksize.is_power_of_two() || volsize == 0 || nlevels != levels_for(volsize.div_ceil(volblocksize as u64)) {
                return Err(Error::Corrupt(format!("volume {name}: bad geometry (volsize {volsize}, volblocksize {volblocksize}, {nlevels} levels)")));
            }
            let bp = check_volume_root(&name, root_bytes, volsize.div_ceil(volblocksize as u64), volblocksize, nlevels, txg)?;
            volumes.push(VolumeRecord {
                id,
                name,
                volsize,
                volblocksize,
                root: TreeRoot { bp, nlevels },
                props: crate::props::PropSet::from_local(local),
                created_txg,
            });
        }
        ms.decode_into(&mut r)?;
        let scan_state = r.string()?;
        let pool_props = r.string()?;
        let leaf_health = if r.remaining() > 0 { Some(decode_leaf_health(&mut r)?) } else { None };
        let mut zil_headers = Vec::new();
        if r.remaining() > 0 {
            let n = r.u32()?;
            if n as usize > volumes.len() {
                return Err(Error::Corrupt(format!("object directory has {n} ZIL headers for {} volumes", volumes.len())));
            }
            for _ in 0..n {
                let id = r.u64()?;
                let h = crate::zil::ZilHeader::decode(&mut r)?;
                if !volumes.iter().any(|v| v.id == id) || zil_headers.iter().any(|(i, _)| *i == id) {
                    return Err(Error::Corrupt(format!("ZIL header for unknown or repeated volume id {id}")));
                }
                zil_headers.push((id, h));
            }
        }
        let history = if r.remaining() > 0 { crate::spa_history::History::decode(&mut r)? } else { Default::default() };
        Ok(Mos { txg, next_volume_id, volumes, scan_state, pool_props, leaf_health, zil_headers, history })
    }
}

/// Write the MOS blob as chunks plus an index block; returns the index bp.
pub fn write_mos(io: &PoolIo, blob: &[u8], txg: Txg, batch: &mut Vec<PendingWrite>) -> Result<BlockPointer> {
    let chunks: Vec<&[u8]> = blob.chunks(MOS_CHUNK_SIZE).collect();
    if chunks.len() > (INDIRECT_SIZE / BlockPointer::SIZE) {
        return Err(Error::NoSpace);
    }
    let mut index = vec![0u8; (chunks.len() * BlockPointer::SIZE).div_ceil(4096).max(1) * 4096];
    for (i, c) in chunks.iter().enumerate() {
        let mut buf = AlignedBuf::with_capacity(c.len().div_ceil(4096) * 4096);
        buf.extend_from_slice(c);
        buf.resize(buf.capacity().min(c.len().div_ceil(4096) * 4096));
        let buf = Arc::new(buf);
        let bp = io.alloc_block(&buf, txg, blkptr::KIND_MOS_CHUNK, 0, 1, ChecksumAlgo::Fletcher4, Compression::Lz4, 2, batch)?;
        index[i * BlockPointer::SIZE..(i + 1) * BlockPointer::SIZE].copy_from_slice(&bp.encode());
    }
    let index: Arc<AlignedBuf> = Arc::new(AlignedBuf::from(index));
    let mut ibp = io.alloc_block(&index, txg, blkptr::KIND_MOS_INDEX, 1, chunks.len() as u64, ChecksumAlgo::Fletcher4, Compression::Lz4, 3, batch)?;
    ibp.fill = blob.len() as u64;
    // fill of the index = exact blob length; the checksum covers data only, so this is safe
    Ok(ibp)
}

/// Every bp of the MOS (index first), for freeing and scrubbing.
pub fn mos_blocks(io: &PoolIo, index: &BlockPointer, class: IoClass) -> Result<Vec<BlockPointer>> {
    let ind = io.read_block(index, class, BufKind::Metadata, false)?;
    // the index's fill is the MOS byte length: at most one index block of chunks
    let max_chunks = INDIRECT_SIZE / BlockPointer::SIZE;
    let nchunks = (index.fill.min((max_chunks * MOS_CHUNK_SIZE) as u64 + 1) as usize).div_ceil(MOS_CHUNK_SIZE);
    if nchunks > max_chunks || nchunks * BlockPointer::SIZE > ind.len() {
        return Err(Error::Corrupt(format!("MOS index: field fill = {} is out of range (at most {} bytes)", index.fill, max_chunks * MOS_CHUNK_SIZE)));
    }
    let mut out = vec![*index];
    for i in 0..nchunks {
        let bp = child_bp(&ind, i as u64)?;
        if !bp.is_hole() && bp.kind != blkptr::KIND_MOS_CHUNK {
            return Err(Error::Corrupt(format!("MOS index: chunk {i}: field kind = {} is out of range", bp.kind)));
        }
        out.push(bp);
    }
    Ok(out)
}

pub fn read_mos_blob(io: &PoolIo, index: &BlockPointer, class: IoClass) -> Result<Vec<u8>> {
    let bps = mos_blocks(io, index, class)?;
    // `fill` is bounded by mos_blocks (at most 1024 chunks); reserve no more than that
    let mut blob = Vec::with_capacity((index.fill as usize).min(bps.len().saturating_sub(1) * MOS_CHUNK_SIZE));
    for bp in &bps[1..] {
        if bp.is_hole() {
            return Err(Error::Corrupt("hole in MOS".into()));
        }
        blob.extend_from_slice(&io.read_block(bp, class, BufKind::Metadata, false)?);
    }
    blob.truncate(index.fill as usize);
    Ok(blob)
}

/// In-memory state of one volume.
pub struct VolumeState {
    pub id: u64,
    pub name: String,
    /// Its size in bytes: grows with `set volsize` (within the tree height `nlevels`
    /// of its root allows), read with [`VolumeState::volsize`].
    pub volsize: std::sync::atomic::AtomicU64,
    /// A grow on its way to disk (0: none): the size MOS records hold from the sync
    /// that writes it, before `volsize` serves it, so no write beyond the old end (nor
    /// its intent-log record) can be acknowledged before the larger size is durable.
    pub grown_volsize: std::sync::atomic::AtomicU64,
    pub volblocksize: u32,
    pub created_txg: Txg,
    /// Published as one `Arc`, loaded lock-free on the I/O path.
    pub props: crate::props::PublishedProps,
    pub committed: RwLock<TreeRoot>,
    pub dirty: DirtySet,
    pub destroyed: std::sync::atomic::AtomicBool,
    /// The volume's intent log.
    pub zil: crate::zil::Zilog,
    /// Its space against its reservation (`refreservation`), see dsl_pool.
    pub space: Arc<crate::dsl_pool::VolumeSpace>,
    /// Its read-ahead streams and prefetch accounting.
    pub zfetch: crate::zfetch::Zfetch,
}

impl VolumeState {
    pub fn volsize(&self) -> u64 {
        self.volsize.load(std::sync::atomic::Ordering::Acquire)
    }
    pub fn nblocks(&self) -> u64 {
        self.volsize().div_ceil(self.volblocksize as u64)
    }
    pub fn record(&self, root: TreeRoot) -> VolumeRecord {
        VolumeRecord {
            id: self.id,
            name: self.name.clone(),
            volsize: self.volsize().max(self.grown_volsize.load(std::sync::atomic::Ordering::Acquire)),
            volblocksize: self.volblocksize,
            root,
            props: crate::props::PropSet::clone(&self.props.snapshot()),
            created_txg: self.created_txg,
        }
    }
}

#[cfg(test)]
mod block_id_tests {
    use super::*;

    /// `check_tree_bp`'s one predicate and its field-by-field check agree: every pair
    /// of its fields set to every pair of boundary values, at every level.
    #[test]
    fn check_tree_bp_predicate_agrees_with_its_fields() {
        let values = [0u64, 1, 2, 3, 4, 7, 1023, 1024, 1025, 4096, 16384, INDIRECT_SIZE as u64, 1 << 20, 1 << 30, u32::MAX as u64, u64::MAX];
        let (mut checked, mut refused) = (0, 0);
        for level in 0..4u32 {
            let mut base = BlockPointer::hole();
            base.birth = Txg(50);
            (base.kind, base.level, base.fill) = (if level == 0 { blkptr::KIND_DATA } else { blkptr::KIND_INDIRECT }, level as u8, 1);
            base.lsize = if level == 0 { 16384 } else { INDIRECT_SIZE as u32 };
            for f in 0..5 {
                for g in f..5 {
                    for &v in &values {
                        for &w in &values {
                            let mut bp = base;
                            for (field, x) in [(f, v), (g, w)] {
                                match field {
                                    0 => bp.kind = x as u8,
                                    1 => bp.level = x as u8,
                                    2 => bp.fill = x,
                                    3 => bp.lsize = x as u32,
                                    _ => bp.birth = Txg(x.max(1)),
                                }
                            }
                            for vbs in [None, Some(16384)] {
                                let fast = check_tree_bp(&bp, level, vbs, Txg(100)).is_ok();
                                assert_eq!(fast, check_tree_bp_fields(&bp, level, vbs, Txg(100)).is_ok(), "{bp:?} level {level}");
                                checked += 1;
                                refused += usize::from(!fast);
                            }
                        }
                    }
                }
            }
        }
        assert!(refused > checked / 4 && refused < checked, "{refused} of {checked} refused");
    }

    #[test]
    fn tree_geometry_of_a_block_id() {
        let b = BlockId(3 * EPB * EPB + 5 * EPB + 7);
        assert_eq!(b.ancestor(0), b.get());
        assert_eq!(b.ancestor(1), 3 * EPB + 5);
        assert_eq!(b.ancestor(2), 3);
        assert_eq!((b.slot_in(1), b.slot_in(2), b.slot_in(3)), (7, 5, 3));
        // a span ends at the L1 boundary, or at `last` if that comes first
        assert_eq!(BlockId(0).span_end(BlockId(10 * EPB)), BlockId(EPB - 1));
        assert_eq!(BlockId(EPB + 1).span_end(BlockId(10 * EPB)), BlockId(2 * EPB - 1));
        assert_eq!(BlockId(EPB).span_end(BlockId(EPB + 9)), BlockId(EPB + 9));
        assert_eq!(BlockId::of_offset(5 * 4096 + 1, 4096), BlockId(5));
        assert_eq!(BlockId(5).offset_bytes(4096), 5 * 4096);
    }
}

// ---------------------------------------------------------------------------------------
// Format 2: dnodes, object trees, objsets (docs/on-disk-format.md §10, §11)

pub mod dnode;
pub mod object_tree;
pub mod objset;
pub mod zap_store;
pub mod pool_block_io;
