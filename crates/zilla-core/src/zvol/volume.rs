//! volume: the engine's block volume (`Volume`), what [`super::BlockVolume`] runs on.
//!
//! Theory of operation. A volume is a tree of block pointers (dmu's `TreeRoot`, one
//! per committed txg) plus a dirty set: per block, the versions written in the open
//! and quiescing txgs, newest last, sharded by block id. A read looks at the newest
//! dirty version first, then the committed tree through the ARC; a write of a block
//!
//! 1. passes the write throttle (`dsl_pool::DirtyAccounting::throttle`: the delay curve,
//!    the hard stop at `zfs_dirty_data_max`),
//! 2. is admitted against the pool's space as the sync will find it (`dsl_pool`'s
//!    space admission: allocated + pending + this change must leave the slop free),
//! 3. takes a txg hold, records its new version in the held txg (or the block's newest
//!    version's txg when later), counts the dirty bytes, and drops the hold;
//! 4. if it must be durable before its acknowledgement (FUA, `sync=always`), logs an
//!    intent-log record (zil) and commits it, or waits for its txg when the log is
//!    disabled or full.
//!
//! The sync (spa) writes each txg's dirty versions into a new tree and publishes it;
//! versions older than the committed txg are dropped. The non-blocking calls
//! (`try_*`, `*_async`, `*_after_delay`) are the same steps taken only when none of
//! them would wait; they answer "would block" otherwise and the front end's executor
//! runs the blocking call on a thread. See docs/design.md, "Data path".

use crate::vdev::abd::AlignedBuf;
use crate::zvol::{BlockVolume, CommitDone, Extent, ReadDone, SharedSlice, WriteData, WriteDelay};
use crate::{BlockId, Result};

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::arc::{BlockKey, BufKind, CacheHint};
use crate::dmu::{self, DirtySet, TreeRoot, VolumeState};
use crate::zio::PoolIo;
use crate::dsl_pool::{Admit, DirtyAccounting};
use crate::props::{CachePolicy, SyncPolicy};
use crate::txg::TxgState;
use crate::vdev::IoClass;
use crate::zil::{AdmitLogBlock, CommitOutcome, CommitStart, CommitWaiter, DataPolicy, Flight, RoundStart, SettledWaiters, Waited};
use crate::{Error, Txg};

mod prefetch;

/// A block as [`Volume::lookup_cached`] finds it in memory.
enum CachedBlock {
    /// Its newest content (None: a hole).
    Data(Option<Arc<AlignedBuf>>),
    /// Committed, not in the ARC: where to read it.
    Missing(crate::block::blkptr::BlockPointer),
    /// An indirect block on the way to it is not in the ARC: that block's pointer.
    IndirectMissing(crate::block::blkptr::BlockPointer),
}

/// Who looks a block up: a demand read, or a read ahead of one (counted apart in the
/// ARC, and a prefetch leaves a prefetched buffer's flag alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Demand,
    Prefetch,
}

impl Access {
    fn hint(self, kind: BufKind) -> CacheHint {
        CacheHint { prefetched: self == Access::Prefetch, ..CacheHint::of(kind) }
    }
}

/// Blocks one zero-copy read may share; a longer read is copied instead.
pub const SHARED_READ_BLOCKS_MAX: u64 = 64;

/// One shared block of zeros for holes in zero-copy reads, as large as the largest
/// volblocksize (a larger hole piece makes the read fall back to copying).
fn zero_block() -> &'static std::sync::Arc<AlignedBuf> {
    const ZERO_BLOCK_BYTES: usize = 128 << 10;
    static ZEROS: std::sync::OnceLock<std::sync::Arc<AlignedBuf>> = std::sync::OnceLock::new();
    ZEROS.get_or_init(|| Arc::new(AlignedBuf::zeroed(ZERO_BLOCK_BYTES)))
}


/// Call settled commit waiters (outside every lock).
fn settle(settled: SettledWaiters) {
    for (waiter, how) in settled {
        waiter(how);
    }
}

/// What a volume sees of its pool: the narrow context spa hands to zvol. spa implements
/// it, so zvol never names the pool type and the layering points down.
pub trait VolumePool: Send + Sync {
    fn pool_name(&self) -> &str;
    /// Block I/O: verified reads through the ARC, space.
    fn io(&self) -> &PoolIo;
    /// Holds on the open txg, sync requests and waits.
    fn txg(&self) -> &TxgState;
    /// Dirty-data accounting and the write throttle.
    fn dirty(&self) -> &DirtyAccounting;
    /// Something in the MOS (properties, volumes) changed and waits for a sync.
    fn mos_changed(&self) -> bool;
    /// A random number from the pool's environment (intent-log chain guids).
    fn random_u64(&self) -> u64;
}

/// A volume of an imported pool. Cheap to clone (shares the pool and volume state).
pub struct Volume {
    pool: Arc<dyn VolumePool>,
    vol: Arc<VolumeState>,
}

/// A block's new content: `base` (zeros when None) with `[in_off, in_off+len)`
/// replaced by `patch` (zeros when None), built in its shared buffer directly. A whole
/// block written is one allocation and one copy of the caller's bytes (it was a zeroed
/// Vec, a copy into it, and a second allocation and copy into the Arc: 11 % of the
/// daemon's CPU under 8K writes).
fn patched_block(base: Option<&[u8]>, bs: usize, in_off: usize, len: usize, patch: Option<&[u8]>) -> Arc<AlignedBuf> {
    if let (Some(p), true) = (patch, in_off == 0 && len == bs) {
        return Arc::new(AlignedBuf::copy_of(p));
    }
    let mut block: Arc<AlignedBuf> = match base {
        Some(b) => Arc::new(AlignedBuf::copy_of(b)),
        None => Arc::new(AlignedBuf::zeroed(bs)),
    };
    apply_patch(&mut Arc::get_mut(&mut block).expect("a block just made has no other owner")[in_off..in_off + len], patch);
    block
}

/// Write a change into its range of a block: the patch's bytes, or zeros (None).
fn apply_patch(range: &mut [u8], patch: Option<&[u8]>) {
    match patch {
        Some(p) => range.copy_from_slice(p),
        None => range.fill(0),
    }
}

/// One block's share of a byte range: `(blkid, offset in block, offset in range, len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockChunk {
    pub blkid: BlockId,
    pub in_block: usize,
    pub in_range: usize,
    pub len: usize,
}

/// Split `[offset, offset+len)` at block boundaries of `block_size`.
pub fn block_chunks(offset: u64, len: u64, block_size: u64) -> impl Iterator<Item = BlockChunk> {
    debug_assert!(block_size > 0);
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let in_block = pos % block_size;
        let n = (block_size - in_block).min(end - pos);
        let c = BlockChunk { blkid: BlockId::of_offset(pos, block_size), in_block: in_block as usize, in_range: (pos - offset) as usize, len: n as usize };
        pos += n;
        Some(c)
    })
}

/// How `modify` throttles: each block through the delay curve (a blocking write), or
/// only the hard stop at the dirty max (the write's delay was claimed and waited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Throttle {
    PerBlock,
    Delayed,
}

/// A write's bytes: a slice (copied into the blocks), or what a front end received
/// cut at this volume's block boundaries (a whole block's piece becomes the block).
#[derive(Clone, Copy)]
enum Src<'a> {
    Slice(&'a [u8]),
    Pieces(&'a [Arc<AlignedBuf>]),
}

impl<'a> Src<'a> {
    /// `data` as this volume takes it: its pieces when they are cut at the block
    /// boundaries of a write at `offset`, else its bytes copied into `flat`.
    fn of(data: &'a WriteData, offset: u64, bs: u64, flat: &'a mut Vec<u8>) -> Src<'a> {
        let cut = crate::zvol::WriteData::cut(offset, data.len() as u64, bs);
        if data.pieces().len() == cut.clone().count() && data.pieces().iter().zip(cut).all(|(p, n)| p.len() == n) {
            return Src::Pieces(data.pieces());
        }
        *flat = data.to_vec();
        Src::Slice(flat)
    }

    /// Chunk `i` (`c`) of the write: its bytes, and the block's new buffer itself when
    /// the chunk is a whole block received in its own piece.
    fn chunk(&self, i: usize, c: &BlockChunk, bs: usize) -> (&'a [u8], Option<&'a Arc<AlignedBuf>>) {
        match *self {
            Src::Slice(d) => (&d[c.in_range..c.in_range + c.len], None),
            Src::Pieces(p) => {
                debug_assert_eq!(p[i].len(), c.len, "a piece is its chunk");
                (p[i].as_slice(), (c.len == bs).then_some(&p[i]))
            }
        }
    }

    fn len(&self) -> usize {
        match *self {
            Src::Slice(d) => d.len(),
            Src::Pieces(p) => p.iter().map(|b| b.len()).sum(),
        }
    }
}

/// What a new dirty version did to its block's dirty accounting in its txg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dirtied {
    /// The block became dirty in the txg ([`Volume::account_dirty`]).
    Newly,
    /// The txg's version was a free record (counted as 512 bytes) and was replaced.
    Refilled,
    /// The txg's version held data and was replaced (already counted).
    Again,
}

impl Volume {
    pub fn new(pool: Arc<dyn VolumePool>, vol: Arc<VolumeState>) -> Volume {
        Volume { pool, vol }
    }

    fn bs(&self) -> u64 {
        self.vol.volblocksize as u64
    }

    /// A commit that cannot go the asynchronous way: the pool failed, a sync failed,
    /// or a property or volume change only a txg sync writes.
    fn needs_blocking_commit(&self) -> bool {
        let txgs = self.pool.txg();
        txgs.fatal_error().is_some() || txgs.sync_error().is_some() || self.pool.mos_changed()
    }

    /// Call `f` with what a commit of this volume needs: the pool's I/O, the synced
    /// and open txgs, a guid source, the space admission of normal-class log blocks and
    /// the volume's data policy.
    fn with_commit_args<T>(&self, f: impl FnOnce(&crate::zio::PoolIo, Txg, crate::zil::OpenTxg<'_>, &dyn Fn() -> u64, AdmitLogBlock<'_>, DataPolicy) -> T) -> T {
        let txgs = self.pool.txg();
        // The synced txg may be read early (older only keeps more itxs and waits more);
        // the open txg is read by the commit itself once it has taken its itxs.
        let synced = txgs.synced_txg();
        let open = || txgs.open_txg();
        let pool = &self.pool;
        let admit = |len: u64| crate::dsl_pool::admit_log_block(pool.io(), pool.dirty(), len);
        let props = self.vol.props.typed();
        let policy = DataPolicy { algo: props.checksum, comp: props.compression };
        f(pool.io(), synced, &open, &|| pool.random_u64(), &admit, policy)
    }

    /// Issue a round of the asynchronous commit chain (see zil, "Commit waiters without
    /// threads"). Its completion answers `first` (the commit that started the chain, if
    /// this is its first round) and the waiters it made durable, and starts the next
    /// round when waiters remain.
    fn issue_round(&self, flight: Flight, first: Option<CommitWaiter>) {
        let this = Volume { pool: self.pool.clone(), vol: self.vol.clone() };
        self.vol.zil.issue_started(self.pool.io(), flight, Box::new(move |flight, result| {
            let end = this.vol.zil.finish_async(this.pool.io(), flight, result);
            if let Some(first) = first {
                // a failed log write: the blocking flush waits for the txg that holds
                // these itxs now (`sync_fallback`)
                first(if end.outcome == CommitOutcome::Durable { Waited::Durable } else { Waited::CommitBlocking });
            }
            settle(end.settled);
            if end.again {
                this.next_round();
            }
        }));
    }

    /// The next round of the chain, on the engine thread that completed the last one.
    fn next_round(&self) {
        if self.check_live().is_err() || self.needs_blocking_commit() {
            return settle(self.vol.zil.abandon_round());
        }
        let round = self.with_commit_args(|io, synced, open, new_guid, admit, policy| self.vol.zil.commit_round(io, synced, open, new_guid, admit, policy));
        match round {
            RoundStart::Issue(flight) => self.issue_round(flight, None),
            RoundStart::Ended(settled) => settle(settled),
        }
    }

    fn check_live(&self) -> Result<()> {
        if self.vol.destroyed.load(Ordering::Acquire) {
            return Err(Error::NotFound(format!("volume '{}/{}' was destroyed", self.pool.pool_name(), self.vol.name)));
        }
        if self.pool.txg().is_shutting_down() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    fn check_read(&self, offset: u64, len: u64) -> Result<()> {
        self.check_live()?;
        if offset.checked_add(len).map_or(true, |e| e > self.vol.volsize()) {
            return Err(Error::invalid(format!("range {offset}+{len} beyond volume size {}", self.vol.volsize())));
        }
        Ok(())
    }

    fn check_write(&self, offset: u64, len: u64) -> Result<()> {
        self.check_live()?;
        if self.vol.props.typed().readonly {
            return Err(Error::ReadOnly(format!("{}/{}", self.pool.pool_name(), self.vol.name)));
        }
        if offset.checked_add(len).map_or(true, |e| e > self.vol.volsize()) {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Admit a change of `new_bytes` (0 for a free) against the pool's space, waiting
    /// for syncs when it does not fit yet (dsl_pool/space.rs). The reservation holds
    /// its cost until `account_dirty` has counted it.
    fn reserve_space(&self, new_bytes: u64, kind: Admit) -> Result<crate::dsl_pool::SpaceReservation<'_>> {
        let nlevels = self.vol.committed.read().nlevels;
        self.pool.dirty().admit_change(self.pool.io(), self.pool.txg(), &self.vol.space, new_bytes, nlevels, kind)
    }

    /// The block reads as a hole: no dirty version, or a dirty free, over a committed
    /// hole (or none at all).
    fn is_hole(&self, blkid: BlockId) -> Result<bool> {
        match self.vol.dirty.newest(blkid) {
            Some(Some(_)) => return Ok(false),
            Some(None) => return Ok(true),
            None => {}
        }
        let root = *self.vol.committed.read();
        if root.bp.is_hole() {
            return Ok(true);
        }
        Ok(dmu::lookup_hinted(&self.pool.io(), &root, blkid, IoClass::SyncRead, self.metadata_hint())?.is_hole())
    }

    fn primary_cache_data(&self) -> bool {
        self.vol.props.typed().primarycache == CachePolicy::All
    }

    /// How this volume's data blocks are cached: on a cache device only with
    /// `secondarycache=all`.
    fn data_hint(&self) -> CacheHint {
        CacheHint { l2_eligible: self.vol.props.typed().secondarycache == CachePolicy::All, ..CacheHint::DATA }
    }

    /// How this volume's indirect blocks are cached: on a cache device unless
    /// `secondarycache=none`.
    fn metadata_hint(&self) -> CacheHint {
        CacheHint { l2_eligible: self.vol.props.typed().secondarycache != CachePolicy::None, ..CacheHint::METADATA }
    }

    /// Content of a committed block (None = hole).
    fn read_committed(&self, blkid: BlockId, class: IoClass) -> Result<Option<Arc<AlignedBuf>>> {
        Ok(self.read_committed_keyed(blkid, class)?.map(|(data, _)| data))
    }

    /// Content of a committed block and its cache key (None = hole).
    fn read_committed_keyed(&self, blkid: BlockId, class: IoClass) -> Result<Option<(Arc<AlignedBuf>, BlockKey)>> {
        // before the tree is looked at: a self-heal rewrite of the block found is safe
        // only if nothing freed was released since (see `PoolIo::read_block_found_at`)
        let generation = self.pool.io().ms.release_generation();
        let root = *self.vol.committed.read();
        let bp = dmu::lookup_hinted(&self.pool.io(), &root, blkid, class, self.metadata_hint())?;
        if bp.is_hole() {
            return Ok(None);
        }
        dmu::check_tree_bp(&bp, 0, Some(self.vol.volblocksize), crate::Txg::LIMIT)
            .map_err(|e| Error::Corrupt(format!("volume {} block {blkid}: block pointer: {e}", self.vol.name)))?;
        let cache = self.primary_cache_data();
        let data = self.pool.io().read_block_found_at(&bp, class, self.data_hint(), cache, generation)?;
        Ok(Some((data, BlockKey::of(&bp))))
    }

    /// Newest content of a block: dirty first, then committed. Dirty must be checked first
    /// (see dmu: records are dropped only after the new root is published).
    fn read_block(&self, blkid: BlockId) -> Result<Option<Arc<AlignedBuf>>> {
        if let Some(d) = self.vol.dirty.newest(blkid) {
            return Ok(d);
        }
        self.read_committed(blkid, IoClass::SyncRead)
    }

    /// Non-blocking variant: only ARC and dirty data. `memo` keeps the level-1 indirect
    /// of the previous block so a multi-block read walks the tree once per 1024 blocks;
    /// it is tied to the root it was read from and dropped when a sync publishes a new
    /// one (the root is re-read after each dirty check, as the dmu ordering requires).
    fn read_block_cached(&self, blkid: BlockId, memo: &mut Option<(TreeRoot, u64, Arc<AlignedBuf>)>) -> Option<Option<Arc<AlignedBuf>>> {
        match self.lookup_cached(blkid, memo, Access::Demand)? {
            CachedBlock::Data(d) => Some(d),
            CachedBlock::Missing(_) | CachedBlock::IndirectMissing(_) => None,
        }
    }

    /// Where block `blkid` is, from memory only: its newest content (dirty or in the
    /// ARC; None = hole), or the block pointer of a committed block the ARC lacks.
    /// `IndirectMissing` when an indirect block on the way is not cached; `None` when a
    /// pointer on the way does not check out (the blocking read says why).
    fn lookup_cached(&self, blkid: BlockId, memo: &mut Option<(TreeRoot, u64, Arc<AlignedBuf>)>, access: Access) -> Option<CachedBlock> {
        if let Some(d) = self.vol.dirty.newest(blkid) {
            return Some(CachedBlock::Data(d));
        }
        let root = *self.vol.committed.read();
        let io = &self.pool.io();
        let bp = match memo {
            Some((r, l1idx, l1)) if *r == root && *l1idx == blkid.ancestor(1) && root.nlevels >= 2 => {
                let o = blkid.slot_in(1) as usize * crate::block::blkptr::BlockPointer::SIZE;
                let bp = crate::block::blkptr::BlockPointer::decode(l1.get(o..o + 128)?)?;
                dmu::check_tree_bp(&bp, 0, Some(self.vol.volblocksize), crate::Txg::LIMIT).ok()?;
                bp
            }
            _ => {
                let mut bp = root.bp;
                for level in (1..root.nlevels as u32).rev() {
                    if bp.is_hole() {
                        return Some(CachedBlock::Data(None));
                    }
                    let Some(ind) = io.cached_as(&BlockKey::of(&bp), access.hint(BufKind::Metadata)) else {
                        return Some(CachedBlock::IndirectMissing(bp));
                    };
                    let o = blkid.slot_in(level) as usize * crate::block::blkptr::BlockPointer::SIZE;
                    let parent_birth = bp.birth;
                    bp = crate::block::blkptr::BlockPointer::decode(ind.get(o..o + 128)?)?;
                    // a pointer out of place is corruption: the blocking read says so
                    dmu::check_tree_bp(&bp, level - 1, Some(self.vol.volblocksize), parent_birth).ok()?;
                    if level == 1 {
                        *memo = Some((root, blkid.ancestor(1), ind));
                    }
                }
                bp
            }
        };
        if bp.is_hole() {
            return Some(CachedBlock::Data(None));
        }
        if u64::from(bp.lsize) != self.bs() {
            return None;
        }
        match io.cached_as(&BlockKey::of(&bp), access.hint(BufKind::Data)) {
            Some(d) if d.len() == self.bs() as usize => Some(CachedBlock::Data(Some(d))),
            Some(_) => None,
            None => Some(CachedBlock::Missing(bp)),
        }
    }

    /// A hold on the open txg for a change to block `blkid`; the test hook
    /// (`test_hooks::set_after_hold`) runs after it is taken, before the shard lock.
    fn hold_for(&self, blkid: BlockId) -> crate::txg::TxgHold<'_> {
        let hold = self.pool.txg().hold();
        test_hooks::after_hold(blkid, hold.txg);
        hold
    }

    /// Replace `[in_off, in_off+patch.len())` of block `blkid` (None patch = zeros), or the
    /// whole block. `whole_hole` = free the block instead of writing zeros.
    /// `whole`: the new block's own buffer (a whole block a front end received), taken
    /// by reference instead of copying `patch`.
    fn update_block(&self, blkid: BlockId, in_off: usize, patch: Option<&[u8]>, whole: Option<&Arc<AlignedBuf>>, len: usize, whole_hole: bool) -> Result<Txg> {
        let bs = self.bs() as usize;
        let full = in_off == 0 && len == bs;
        let mut attempts = 0;
        loop {
            attempts += 1;
            // base content for a partial update, read without locks
            let (base, gen) = if full {
                (None, 0)
            } else {
                let shard = self.vol.dirty.shard(blkid).lock();
                let gen = shard.commit_gen;
                let has = shard.blocks.contains_key(&blkid);
                drop(shard);
                if has {
                    (None, gen)
                } else {
                    (Some(self.read_committed_keyed(blkid, IoClass::SyncRead)?), gen)
                }
            };
            let hold = self.hold_for(blkid);
            let mut shard = self.vol.dirty.shard(blkid).lock();
            // a whole-block write needs no base (and touching the old buffer's count
            // would only pull it into the cache)
            let newest = if full { None } else { shard.blocks.get(&blkid).and_then(|v| v.last()).map(|v| v.data.clone()) };
            // the base, and its cache key when it is the committed block
            let (base_now, committed_key): (Option<Arc<AlignedBuf>>, Option<BlockKey>) = if full {
                (None, None)
            } else if let Some(n) = newest {
                (n, None)
            } else if shard.commit_gen != gen || base.is_none() {
                if attempts > 100 {
                    return Err(Error::Busy("block changed too often during a partial write".into()));
                }
                continue;
            } else {
                match base.flatten() {
                    Some((data, key)) => (Some(data), Some(key)),
                    None => (None, None),
                }
            };
            let new: Option<Arc<AlignedBuf>> = if whole_hole && full {
                None
            } else if let (true, Some(block)) = (full, whole) {
                Some(block.clone())
            } else {
                Some(match (base_now, committed_key) {
                    (Some(block), Some(key)) => self.patch_committed(block, &key, bs, in_off, len, patch),
                    (base_now, _) => patched_block(base_now.as_deref().map(|b| b.as_slice()), bs, in_off, len, patch),
                })
            };
            let has_data = new.is_some();
            let (txg, dirtied) = self.record_version(&mut shard, blkid, hold.txg, in_off, len, patch, new);
            drop(shard);
            match dirtied {
                Dirtied::Newly => self.account_dirty(txg, blkid, has_data),
                Dirtied::Refilled if has_data => self.account_refill(txg),
                _ => {}
            }
            return Ok(txg);
        }
    }

    /// The new version of a committed block after a partial change. The committed
    /// block's buffer becomes the new version, changed in place, when nobody else holds
    /// it: it is unique already (not cached), or the ARC gives it up
    /// ([`crate::arc::ArcCache::release_to_writer`], OpenZFS's `arc_release` when a
    /// dbuf is dirtied). Otherwise (a reader holds it: a reply on the wire, an
    /// intent-log record) the block is copied, as before. The ARC then lacks the old
    /// version, as in OpenZFS; the txg sync caches the new one. Under random 4K writes
    /// the copy and the allocation of the 16 KiB block were 10.5 % and ~5 % of the
    /// daemon's CPU (stop 34's profile).
    fn patch_committed(&self, mut block: Arc<AlignedBuf>, key: &BlockKey, bs: usize, in_off: usize, len: usize, patch: Option<&[u8]>) -> Arc<AlignedBuf> {
        let unique = block.len() == bs && (Arc::get_mut(&mut block).is_some() || self.pool.io().release_cached_to_writer(key, &block));
        if !unique {
            return patched_block(Some(&block), bs, in_off, len, patch);
        }
        apply_patch(&mut Arc::get_mut(&mut block).expect("a released buffer has no other owner")[in_off..in_off + len], patch);
        block
    }

    /// Put block `blkid`'s new version `new` in the dirty set (the shard is locked), with
    /// its intent-log record; returns the txg it went into and what that did to the
    /// block's dirty accounting ([`Volume::account_dirty`] or [`Volume::account_refill`]
    /// then, with the shard unlocked).
    ///
    /// A writer whose hold is on txg T (taken just before T closed) can find a version of
    /// T+1 here already, written by a writer of the next txg from an older base: it lacks
    /// this change, and a T version pushed after it would be synced in T and then
    /// overwritten on disk by T+1's (an acknowledged write lost after export while every
    /// live read was right: tests/concurrency.rs). The change goes into the newest
    /// version's txg instead: T+1 is open and cannot quiesce while T is held. (OpenZFS
    /// likewise writes into the newest dbuf data once a later txg has dirtied it.)
    #[allow(clippy::too_many_arguments)]
    fn record_version(&self, shard: &mut crate::dmu::DirtyShard, blkid: BlockId, held: Txg, in_off: usize, len: usize, patch: Option<&[u8]>, new: Option<Arc<AlignedBuf>>) -> (Txg, Dirtied) {
        let last = shard.blocks.get(&blkid).and_then(|v| v.last());
        let txg = last.map_or(held, |v| v.txg.max(held));
        debug_assert!(txg.get() <= held.get() + 1, "a dirty version more than one txg past a held txg");
        // a free record of this txg was counted as 512 bytes, not as a block
        let was_free = last.is_some_and(|v| v.txg == txg && v.data.is_none());
        self.log_itx(txg, blkid, in_off, len, patch, new.as_ref());
        let dirtied = if DirtySet::insert(shard, blkid, txg, new) {
            Dirtied::Newly
        } else if was_free {
            Dirtied::Refilled
        } else {
            Dirtied::Again
        };
        (txg, dirtied)
    }

    /// A free record of `txg` (counted as 512 bytes by [`Volume::account_dirty`]) holds
    /// data again: count the block's bytes and the space its sync will allocate. Without
    /// this, trimming blocks and writing them again in one txg dirtied whole blocks that
    /// neither the throttle nor `zfs_dirty_data_max` saw (3 GiB trimmed and rewritten
    /// with syncs held off: 3 GiB more RSS, 96 MiB counted).
    fn account_refill(&self, txg: Txg) {
        let bs = self.bs();
        self.pool.dirty().add(txg, bs.saturating_sub(512));
        self.pool.dirty().add_volume_space(&self.vol.space, txg, bs);
    }

    /// Block `blkid` became dirty in `txg`: count its bytes (a free record costs
    /// memory, not a block write: 512 bytes, so a flush after an unmap still sees dirty
    /// state) and the space its sync will allocate.
    fn account_dirty(&self, txg: Txg, blkid: BlockId, has_data: bool) {
        let bs = self.bs();
        self.pool.dirty().add(txg, if has_data { bs } else { 512 });
        let nlevels = self.vol.committed.read().nlevels;
        let indirects = self.vol.dirty.note_indirects(txg, blkid, nlevels) as u64;
        let data = if has_data { bs } else { 0 };
        self.pool.dirty().add_volume_space(&self.vol.space, txg, crate::dsl_pool::dirtied_cost_bytes(data, indirects));
    }

    /// The intent-log record of a change to block `blkid`, appended under the block's
    /// dirty-shard lock so the log's order per block is the dirty versions' order. A
    /// volume with sync=disabled logs nothing (its flushes never wait). A whole-block
    /// write is indirect (written in place by the commit, the log gets its block
    /// pointer) as zvol_log_write chooses: with logbias=throughput, or when the pool
    /// has no log vdev and the block is larger than `zfs_immediate_write_sz`.
    fn log_itx(&self, txg: Txg, blkid: crate::BlockId, in_off: usize, len: usize, patch: Option<&[u8]>, new: Option<&Arc<AlignedBuf>>) {
        let props = self.vol.props.typed();
        if props.sync == SyncPolicy::Disabled {
            return;
        }
        let offset = blkid.offset_bytes(self.bs()) + in_off as u64;
        let whole = len as u64 == self.bs();
        let indirect = whole
            && (props.logbias == crate::props::LogBias::Throughput
                || (self.bs() > crate::zil::ZFS_IMMEDIATE_WRITE_SZ.get() && !self.pool.io().has_log_vdevs()));
        match (patch, new) {
            (Some(_), Some(block)) if indirect => self.vol.zil.log_write_indirect(txg, offset, block.clone()),
            (Some(_), Some(block)) if whole => self.vol.zil.log_write(txg, offset, block.clone(), true),
            // the whole new block instead when a whole-block itx of it is pending
            // by reference to the new version; copied only if a commit takes it
            (Some(p), Some(block)) => self.vol.zil.log_partial_write(txg, blkid.offset_bytes(self.bs()), offset, block, in_off, p.len()),
            (Some(p), None) => self.vol.zil.log_write(txg, offset, Arc::new(AlignedBuf::copy_of(p)), false),
            (None, _) if whole => self.vol.zil.log_truncate_block(txg, offset, len as u64),
            (None, _) => self.vol.zil.log_truncate(txg, offset, len as u64),
        }
    }

    /// zil_commit: every change applied to this volume before the call is durable when
    /// it returns (in the intent log, or in a synced txg when the log cannot take it).
    pub fn zil_commit(&self) -> Result<()> {
        let txgs = self.pool.txg();
        // a pool whose sync thread stopped (broken invariant) takes no synchronous
        // writes; one whose syncs fail and are retried (suspended) makes them wait for
        // a txg, as before the intent log (failmode=wait)
        if let Some(e) = txgs.fatal_error() {
            return Err(Error::Io(std::io::Error::other(format!("txg sync thread failed: {e}"))));
        }
        if txgs.sync_error().is_some() {
            let seq = self.vol.zil.last_seq();
            txgs.wait_synced(txgs.open_txg())?;
            self.vol.zil.note_synced_through(seq);
            return Ok(());
        }
        let seq = self.vol.zil.last_seq();
        let outcome = self.with_commit_args(|io, synced, open, new_guid, admit, policy| self.vol.zil.commit(io, synced, open, new_guid, admit, policy))?;
        match outcome {
            crate::zil::CommitOutcome::Durable => Ok(()),
            crate::zil::CommitOutcome::NeedTxgSync(t) => {
                txgs.wait_synced(t)?;
                self.vol.zil.note_synced_through(seq);
                Ok(())
            }
        }
    }

    /// Apply a write without blocking (no throttle delay, no device read, no txg
    /// wait) and without committing it, whatever the sync policy; `None`: would block.
    /// `delayed`: the write's throttle delay was claimed and waited
    /// (`claim_write_delay`), so only the hard stop at the dirty max sends it to the
    /// blocking path.
    fn apply_write_nonblocking(&self, offset: u64, data: Src<'_>, delayed: bool) -> Option<Result<()>> {
        if let Err(e) = self.check_write(offset, data.len() as u64) {
            return Some(Err(e));
        }
        let dirty = self.pool.dirty();
        let waits = if delayed {
            dirty.total() >= crate::dsl_pool::dirty_data_max()
        } else {
            dirty.would_wait(self.pool.txg(), data.len() as u64)
        };
        if waits {
            return None;
        }
        let nlevels = self.vol.committed.read().nlevels;
        let Ok(_admitted) = dirty.try_admit_change(self.pool.io(), &self.vol.space, data.len() as u64, nlevels, Admit::Write) else {
            return None; // the blocking path waits for syncs before answering ENOSPC
        };
        let bs = self.bs();
        let mut max_txg = Txg::ZERO;
        for (i, c) in block_chunks(offset, data.len() as u64, bs).enumerate() {
            if c.len as u64 != bs && self.read_block_cached(c.blkid, &mut None).is_none() {
                return None;
            }
            let (patch, whole) = data.chunk(i, &c, bs as usize);
            match self.update_block(c.blkid, c.in_block, Some(patch), whole, c.len, false) {
                Ok(t) => max_txg = max_txg.max(t),
                Err(e) => return Some(Err(e)),
            }
        }
        if !max_txg.is_zero() && self.pool.dirty().should_kick(max_txg) {
            self.pool.txg().kick(max_txg);
        }
        Some(Ok(()))
    }

    /// The volume's intent log (counters, tests).
    pub fn zil(&self) -> &crate::zil::Zilog {
        &self.vol.zil
    }

    /// The volume's read-ahead detector (counters, prefetch bytes in flight).
    pub fn zfetch(&self) -> &crate::zfetch::Zfetch {
        &self.vol.zfetch
    }

    /// Whether a write must be committed before it is acknowledged: every write of a
    /// `sync=always` volume, a FUA write unless `sync=disabled`.
    fn write_needs_commit(&self, fua: bool) -> bool {
        let sync = self.vol.props.typed().sync;
        sync == SyncPolicy::Always || (fua && sync != SyncPolicy::Disabled)
    }

    fn after_write(&self, txg: Txg, fua: bool) -> Result<()> {
        if self.pool.dirty().should_kick(txg) {
            self.pool.txg().kick(txg);
        }
        if self.write_needs_commit(fua) {
            self.zil_commit()?;
        }
        Ok(())
    }

    fn modify(&self, offset: u64, len: u64, data: Option<Src<'_>>, free_whole: bool, fua: bool) -> Result<()> {
        self.modify_with(offset, len, data, free_whole, fua, Throttle::PerBlock)
    }

    fn modify_with(&self, offset: u64, len: u64, data: Option<Src<'_>>, free_whole: bool, fua: bool, throttle: Throttle) -> Result<()> {
        let bs = self.bs();
        let mut max_txg = Txg::ZERO;
        for (i, c) in block_chunks(offset, len, bs).enumerate() {
            // freeing a block that was never written (or is freed already) changes
            // nothing: no dirty record, no throttle (a TRIM of a whole empty volume
            // must not fill the dirty limit)
            if data.is_none() && free_whole && c.len as u64 == bs && self.is_hole(c.blkid)? {
                continue;
            }
            let abort = || self.pool.txg().is_shutting_down();
            match throttle {
                Throttle::PerBlock => self.pool.dirty().throttle(self.pool.txg(), &abort),
                Throttle::Delayed => self.pool.dirty().block_at_max(&abort),
            }
            // a free too rewrites the indirect blocks above it (unless they empty), and
            // its txg cannot use the space it frees: admitted like a write, into half
            // the slop
            let _admitted = if data.is_some() || !free_whole || c.len as u64 != bs {
                self.reserve_space(bs, Admit::Write)?
            } else {
                self.reserve_space(0, Admit::Free)?
            };
            let (patch, whole) = match data {
                Some(d) => {
                    let (p, w) = d.chunk(i, &c, bs as usize);
                    (Some(p), w)
                }
                None => (None, None),
            };
            let t = self.update_block(c.blkid, c.in_block, patch, whole, c.len, free_whole)?;
            max_txg = max_txg.max(t);
        }
        if !max_txg.is_zero() {
            self.after_write(max_txg, fua)?;
        }
        Ok(())
    }
}

impl BlockVolume for Volume {
    fn name(&self) -> String {
        format!("{}/{}", self.pool.pool_name(), self.vol.name)
    }
    fn size(&self) -> u64 {
        self.vol.volsize()
    }
    fn block_size(&self) -> u32 {
        self.vol.volblocksize
    }
    fn read_only(&self) -> bool {
        self.vol.props.typed().readonly
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_read(offset, buf.len() as u64)?;
        self.read_ahead(offset, buf.len() as u64);
        for c in block_chunks(offset, buf.len() as u64, self.bs()) {
            let out = &mut buf[c.in_range..c.in_range + c.len];
            match self.read_block(c.blkid)? {
                Some(d) => out.copy_from_slice(&d[c.in_block..c.in_block + c.len]),
                None => out.fill(0),
            }
        }
        Ok(())
    }

    fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<()>> {
        if let Err(e) = self.check_read(offset, buf.len() as u64) {
            return Some(Err(e));
        }
        let mut memo = None;
        for c in block_chunks(offset, buf.len() as u64, self.bs()) {
            let out = &mut buf[c.in_range..c.in_range + c.len];
            match self.read_block_cached(c.blkid, &mut memo)? {
                Some(d) => out.copy_from_slice(&d[c.in_block..c.in_block + c.len]),
                None => out.fill(0),
            }
        }
        self.read_ahead(offset, buf.len() as u64);
        Some(Ok(()))
    }

    fn try_read_cached_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<SharedSlice>>> {
        if let Err(e) = self.check_read(offset, len) {
            return Some(Err(e));
        }
        let bs = self.bs();
        let blocks = if len == 0 { 0 } else { (offset + len - 1) / bs - offset / bs + 1 };
        if blocks > SHARED_READ_BLOCKS_MAX {
            return None;
        }
        let mut memo = None;
        let mut pieces = Vec::with_capacity(blocks as usize);
        for c in block_chunks(offset, len, bs) {
            let piece = match self.read_block_cached(c.blkid, &mut memo)? {
                Some(d) => SharedSlice::new(d, c.in_block, c.len)?,
                None => SharedSlice::new(zero_block().clone(), 0, c.len)?,
            };
            pieces.push(piece);
        }
        self.read_ahead(offset, len);
        Some(Ok(pieces))
    }

    fn cached_reads_are_shared(&self, len: u64) -> bool {
        // `len` bytes span at most len / bs + 2 blocks, whatever the offset
        len / self.bs() + 2 <= SHARED_READ_BLOCKS_MAX
    }

    fn read_async(&self, offset: u64, len: u64, done: ReadDone) {
        if let Err(e) = self.check_read(offset, len) {
            return done(Some(Err(e)));
        }
        let bs = self.bs();
        let blocks = if len == 0 { 0 } else { (offset + len - 1) / bs - offset / bs + 1 };
        if blocks > SHARED_READ_BLOCKS_MAX {
            return done(None);
        }
        // every block from memory but at most one, read from its first copy
        let mut memo = None;
        let mut pieces = Vec::with_capacity(blocks as usize);
        let mut missing = None;
        for c in block_chunks(offset, len, bs) {
            let piece = match self.lookup_cached(c.blkid, &mut memo, Access::Demand) {
                Some(CachedBlock::Data(Some(d))) => SharedSlice::new(d, c.in_block, c.len),
                Some(CachedBlock::Data(None)) => SharedSlice::new(zero_block().clone(), 0, c.len),
                Some(CachedBlock::Missing(bp)) if missing.is_none() => {
                    missing = Some((pieces.len(), bp, c.in_block, c.len));
                    SharedSlice::new(zero_block().clone(), 0, 0)
                }
                _ => None,
            };
            let Some(piece) = piece else { return done(None) };
            pieces.push(piece);
        }
        let Some((at, bp, in_block, piece_len)) = missing else {
            self.read_ahead(offset, len);
            return done(Some(Ok(pieces)));
        };
        let pool = self.pool.clone();
        let cache = self.primary_cache_data();
        let hint = self.data_hint();
        self.pool.io().read_block_first_async(&bp, IoClass::SyncRead, hint, Box::new(move |phys| {
            let Some(phys) = phys else { return done(None) };
            let block = pool.io().finish_block_read(&bp, phys, hint, cache).ok();
            match block.and_then(|d| SharedSlice::new(d, in_block, piece_len)) {
                Some(piece) => {
                    pieces[at] = piece;
                    done(Some(Ok(pieces)))
                }
                None => done(None),
            }
        }));
        // the demand read is on its way: what follows it is read ahead behind it
        self.read_ahead(offset, len);
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_write(offset, data.len() as u64)?;
        self.modify(offset, data.len() as u64, Some(Src::Slice(data)), false, fua)
    }

    fn write_data(&self, offset: u64, data: &WriteData, fua: bool) -> Result<()> {
        self.check_write(offset, data.len() as u64)?;
        let mut flat = Vec::new();
        let src = Src::of(data, offset, self.bs(), &mut flat);
        self.modify(offset, data.len() as u64, Some(src), false, fua)
    }

    fn try_write_nonblocking(&self, offset: u64, data: &WriteData) -> Option<Result<()>> {
        if self.vol.props.typed().sync == SyncPolicy::Always {
            return None;
        }
        let mut flat = Vec::new();
        self.apply_write_nonblocking(offset, Src::of(data, offset, self.bs(), &mut flat), false)
    }

    fn try_write_nonblocking_sync(&self, offset: u64, data: &WriteData, fua: bool) -> Option<Result<bool>> {
        let commit = self.write_needs_commit(fua);
        let mut flat = Vec::new();
        Some(self.apply_write_nonblocking(offset, Src::of(data, offset, self.bs(), &mut flat), false)?.map(|()| commit))
    }

    fn claim_write_delay(&self, len: u64) -> WriteDelay {
        self.pool.dirty().claim_delay(self.pool.txg(), len)
    }

    fn try_write_after_delay(&self, offset: u64, data: &WriteData, fua: bool) -> Option<Result<bool>> {
        let commit = self.write_needs_commit(fua);
        let mut flat = Vec::new();
        Some(self.apply_write_nonblocking(offset, Src::of(data, offset, self.bs(), &mut flat), true)?.map(|()| commit))
    }

    fn write_after_delay(&self, offset: u64, data: &WriteData, fua: bool) -> Result<()> {
        self.check_write(offset, data.len() as u64)?;
        let mut flat = Vec::new();
        let src = Src::of(data, offset, self.bs(), &mut flat);
        self.modify_with(offset, data.len() as u64, Some(src), false, fua, Throttle::Delayed)
    }

    fn flush_async(&self, done: CommitDone) {
        if let Err(e) = self.check_live() {
            return done(Some(Err(e)));
        }
        if self.vol.props.typed().sync == SyncPolicy::Disabled {
            return done(Some(Ok(())));
        }
        // the rare paths wait for a txg: the blocking `flush` takes them
        if self.needs_blocking_commit() {
            return done(None);
        }
        let mut waiter: Option<CommitWaiter> = Some(Box::new(move |how| match how {
            Waited::Durable => done(Some(Ok(()))),
            Waited::CommitBlocking => done(None),
        }));
        let start = self.with_commit_args(|io, synced, open, new_guid, admit, policy| {
            self.vol.zil.commit_start(io, synced, open, new_guid, admit, policy, &mut waiter)
        });
        let how = match start {
            CommitStart::Issue(flight) => return self.issue_round(flight, waiter),
            CommitStart::Queued => return,
            CommitStart::Done(CommitOutcome::Durable) => Waited::Durable,
            // a txg to wait for, or another commit holds the log and nothing can queue
            CommitStart::Done(CommitOutcome::NeedTxgSync(_)) | CommitStart::Busy => Waited::CommitBlocking,
        };
        if let Some(w) = waiter {
            w(how);
        }
    }

    fn flush(&self) -> Result<()> {
        self.check_live()?;
        if self.vol.props.typed().sync == SyncPolicy::Disabled {
            return Ok(());
        }
        self.zil_commit()?;
        if !self.pool.mos_changed() {
            return Ok(());
        }
        // a property or volume change not yet on disk: only a txg sync writes it
        let t = self.pool.txg().open_txg();
        self.pool.txg().wait_synced(t)
    }

    fn unmap(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        self.modify(offset, len, None, true, false)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        self.modify(offset, len, None, true, false)
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.check_read(offset, len)?;
        if len == 0 {
            return Ok(vec![]);
        }
        let bs = self.bs();
        let first = BlockId::of_offset(offset, bs);
        let last = BlockId::of_offset(offset + len - 1, bs);
        // dirty records first, then the committed tree: a sync that publishes a block
        // and drops its record in between is then seen in the tree (see dmu)
        let dirty: std::collections::HashMap<BlockId, bool> =
            (first.get()..=last.get()).map(BlockId).filter_map(|b| self.vol.dirty.newest(b).map(|d| (b, d.is_none()))).collect();
        let root = *self.vol.committed.read();
        let mut allocated: Vec<BlockId> = Vec::new();
        dmu::walk_range(&self.pool.io(), &root, first, last, IoClass::SyncRead, self.metadata_hint(), &mut |blk, _| {
            allocated.push(blk);
            Ok(true)
        })?;
        let mut alloc_iter = allocated.into_iter().peekable();
        let mut out: Vec<Extent> = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let blkid = BlockId::of_offset(pos, bs);
            let n = (bs - pos % bs).min(end - pos);
            while alloc_iter.peek().map_or(false, |&b| b < blkid) {
                alloc_iter.next();
            }
            let committed_data = alloc_iter.peek() == Some(&blkid);
            let hole = match dirty.get(&blkid) {
                Some(&h) => h,
                None => !committed_data,
            };
            match out.last_mut() {
                Some(l) if l.hole == hole => l.length += n,
                _ => out.push(Extent { offset: pos, length: n, hole }),
            }
            pos += n;
        }
        Ok(out)
    }
}

/// Testing aid for deterministic interleavings (tests/lost_update.rs): a callback every
/// block update runs after it took its txg hold and before it locks the block's dirty
/// shard, the window in which the held txg may close and the next one open. One
/// relaxed load when unset.
#[doc(hidden)]
pub mod test_hooks {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::RwLock;

    pub type AfterHold = Box<dyn Fn(crate::BlockId, crate::Txg) + Send + Sync>;
    static ARMED: AtomicBool = AtomicBool::new(false);
    static HOOK: RwLock<Option<AfterHold>> = RwLock::new(None);

    pub fn set_after_hold(hook: Option<AfterHold>) {
        let armed = hook.is_some();
        *HOOK.write().unwrap_or_else(|e| e.into_inner()) = hook;
        ARMED.store(armed, Ordering::SeqCst);
    }

    pub(super) fn after_hold(blkid: crate::BlockId, txg: crate::Txg) {
        if ARMED.load(Ordering::Relaxed) {
            if let Some(h) = &*HOOK.read().unwrap_or_else(|e| e.into_inner()) {
                h(blkid, txg);
            }
        }
    }
}

#[cfg(test)]
mod block_chunk_tests {
    use super::*;
    #[test]
    fn chunks_cover_the_range_exactly() {
        let v: Vec<BlockChunk> = block_chunks(100, 20_000, 4096).collect();
        assert_eq!(v.first().unwrap(), &BlockChunk { blkid: BlockId(0), in_block: 100, in_range: 0, len: 3996 });
        assert_eq!(v.iter().map(|c| c.len).sum::<usize>(), 20_000);
        for w in v.windows(2) {
            assert_eq!(w[0].in_range + w[0].len, w[1].in_range);
            assert_eq!(w[0].blkid.next(), w[1].blkid);
            assert_eq!(w[1].in_block, 0);
        }
        assert_eq!(block_chunks(5, 0, 512).count(), 0);
    }
}
