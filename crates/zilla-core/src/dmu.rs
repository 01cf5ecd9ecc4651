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

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::arc::{ArcCache, BlockKey, BufKind};
use crate::metaslab::Metaslabs;
use crate::vdev::mirror::TopVdev;
use crate::vdev::{IoClass, Role};
use crate::zio::blkptr::{self, BlockPointer, Dva};
use crate::zio::checksum::ChecksumAlgo;
use crate::zio::compress::Compression;
use crate::{Error, Result, Txg};

pub const INDIRECT_SIZE: usize = 128 << 10;
pub const INDIRECT_SHIFT: u32 = 10;
pub const EPB: u64 = 1 << INDIRECT_SHIFT;
pub const MOS_CHUNK_SIZE: usize = 128 << 10;
pub const MOS_MAGIC: u64 = 0x5a494c4c_414d4f53; // "ZILLAMOS"
pub const MOS_VERSION: u64 = 1;

pub use crate::zio::reader::Reader;

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

/// Counters for `zpool status` (scrub/self-heal) and errors.
#[derive(Debug, Default)]
pub struct IoErrors {
    pub self_healed_bytes: std::sync::atomic::AtomicU64,
    pub unrecoverable: std::sync::atomic::AtomicU64,
}

/// The engine's block I/O: vdev tree, allocator, ARC.
pub struct PoolIo {
    pub vdevs: RwLock<Vec<Arc<TopVdev>>>,
    /// The allocators, one per class, each with its own lock.
    pub ms: Metaslabs,
    pub arc: ArcCache,
    pub errors: IoErrors,
    /// Recent unrecoverable block errors (bounded, for `status -v`).
    pub error_log: Mutex<Vec<String>>,
    /// Normal-class (size, allocated) as of the last sync, read lock-free by writers.
    pub space_size: std::sync::atomic::AtomicU64,
    pub space_alloc: std::sync::atomic::AtomicU64,
    /// Aligned aggregation buffers for sync writes.
    pub write_buffers: Arc<crate::vdev::abd::BufPool>,
    /// Checksum/compress workers, started at the first sync.
    prepare: std::sync::OnceLock<crate::zio::workers::PrepareWorkers>,
}

pub const ERROR_LOG_MAX: usize = 100;

/// A block allocated and prepared in syncing context, not yet written.
pub struct PendingWrite {
    pub dva: Dva,
    pub data: Arc<[u8]>,
}

/// Largest aggregated write (zfs_vdev_aggregation_limit).
pub const AGGREGATION_LIMIT_BYTES: usize = 1 << 20;
/// Idle aggregation buffers kept for reuse (each AGGREGATION_LIMIT_BYTES).
pub const WRITE_BUFFERS_POOLED: usize = 32;

/// Adjacent blocks of one top-level vdev written as one I/O: `blocks` indexes the batch.
struct Run {
    vdev: u32,
    offset: u64,
    bytes: usize,
    blocks: std::ops::Range<usize>,
}

impl PoolIo {
    pub fn new(vdevs: Vec<Arc<TopVdev>>, ms: Metaslabs) -> PoolIo {
        PoolIo {
            vdevs: RwLock::new(vdevs),
            ms,
            arc: ArcCache::following_tunable(),
            errors: Default::default(),
            error_log: Mutex::new(Vec::new()),
            space_size: Default::default(),
            space_alloc: Default::default(),
            write_buffers: Arc::new(crate::vdev::abd::BufPool::new(AGGREGATION_LIMIT_BYTES, WRITE_BUFFERS_POOLED)),
            prepare: std::sync::OnceLock::new(),
        }
    }

    /// The pool's checksum/compress workers (started once, on first use).
    pub fn prepare_workers(&self, env: &Arc<dyn crate::env::Env>, pool: &str) -> &crate::zio::workers::PrepareWorkers {
        self.prepare.get_or_init(|| crate::zio::workers::PrepareWorkers::start(env, pool))
    }

    /// Refresh the lock-free space snapshot from the allocator.
    pub fn refresh_space(&self) {
        let (size, alloc) = self.ms.space(Role::Normal);
        self.space_size.store(size, std::sync::atomic::Ordering::Relaxed);
        self.space_alloc.store(alloc, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn space(&self) -> (u64, u64) {
        (self.space_size.load(std::sync::atomic::Ordering::Relaxed), self.space_alloc.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub fn top(&self, id: u32) -> Option<Arc<TopVdev>> {
        self.vdevs.read().iter().find(|t| t.id == id).cloned()
    }

    fn log_error(&self, msg: String) {
        let mut l = self.error_log.lock();
        if l.len() >= ERROR_LOG_MAX {
            l.remove(0);
        }
        l.push(msg);
        self.errors.unrecoverable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Read and verify a block; ARC first. `cache` = insert into the ARC.
    pub fn read_block(&self, bp: &BlockPointer, class: IoClass, kind: BufKind, cache: bool) -> Result<Arc<[u8]>> {
        assert!(!bp.is_hole());
        let key = BlockKey { vdev: bp.dva[0].vdev, offset: bp.dva[0].offset, birth: bp.birth };
        if let Some(d) = self.arc.lookup(&key) {
            return Ok(d);
        }
        let mut last: Option<io::Error> = None;
        let mut all_checksum = true;
        let mut failed: Vec<(Arc<TopVdev>, Dva)> = Vec::new();
        for dva in bp.copies() {
            let Some(tvd) = self.top(dva.vdev) else {
                all_checksum = false;
                continue;
            };
            let verify = |b: &[u8]| crate::zio::verify_copy(bp, b);
            match tvd.read_verified(class, dva.offset, dva.asize as usize, bp.birth, &verify) {
                Ok(r) => {
                    let mut healed = r.repaired_bytes;
                    // ditto self-heal: a copy bad on every child of its mirror is rewritten
                    // from this good one (never touching a copy that read back good)
                    for (ftvd, fdva) in failed.drain(..) {
                        let still_allocated = self.ms.is_allocated(&fdva);
                        if still_allocated && ftvd.write(IoClass::AsyncWrite, &r.data, fdva.offset, bp.birth).is_ok() {
                            healed += fdva.asize as u64;
                        }
                    }
                    if healed > 0 {
                        self.errors.self_healed_bytes.fetch_add(healed, std::sync::atomic::Ordering::Relaxed);
                    }
                    let data: Arc<[u8]> = crate::zio::finish_read(bp, &r.data)?;
                    if data.len() != bp.lsize as usize {
                        return Err(Error::Corrupt("decompressed size mismatch".into()));
                    }
                    if cache {
                        self.arc.insert(key, data.clone(), kind);
                    }
                    return Ok(data);
                }
                Err(e) => {
                    if e.kind() != io::ErrorKind::InvalidData {
                        all_checksum = false;
                    }
                    failed.push((tvd.clone(), *dva));
                    last = Some(e);
                }
            }
        }
        let where_ = format!("vdev {} offset {:#x} birth {}", bp.dva[0].vdev, bp.dva[0].offset, bp.birth);
        self.log_error(format!("<0x{:x}> {where_}", bp.dva[0].offset));
        if all_checksum {
            Err(Error::Checksum(where_))
        } else {
            Err(Error::Io(io::Error::new(
                io::ErrorKind::Other,
                format!("{where_}: {}", last.map(|e| e.to_string()).unwrap_or_else(|| "no copy readable".into())),
            )))
        }
    }

    /// Prepare and allocate a block in syncing context; the write is queued in `batch`.
    #[allow(clippy::too_many_arguments)]
    pub fn alloc_block(
        &self,
        logical: &Arc<[u8]>,
        txg: Txg,
        kind: u8,
        level: u8,
        fill: u64,
        algo: ChecksumAlgo,
        comp: Compression,
        copies: usize,
        batch: &mut Vec<PendingWrite>,
    ) -> Result<BlockPointer> {
        let p = crate::zio::prepare(logical, algo, comp);
        self.alloc_prepared(p, txg, kind, level, fill, copies, batch)
    }

    /// Allocate space for an already prepared (checksummed, compressed) block.
    #[allow(clippy::too_many_arguments)]
    pub fn alloc_prepared(
        &self,
        p: crate::zio::PreparedBlock,
        txg: Txg,
        kind: u8,
        level: u8,
        fill: u64,
        copies: usize,
        batch: &mut Vec<PendingWrite>,
    ) -> Result<BlockPointer> {
        let asize = p.asize();
        let data = p.data;
        let mut bp = BlockPointer {
            dva: [Dva::default(); 3],
            lsize: p.lsize,
            psize: p.psize,
            birth: txg,
            fill,
            checksum_code: p.algo.code(),
            compression_code: p.compression.code(),
            kind,
            level,
            checksum: p.checksum,
        };
        // syncing context: the allocation joins txg's undo list
        for (slot, d) in bp.dva.iter_mut().zip(self.ms.alloc(Role::Normal, asize, copies, Some(txg))?) {
            *slot = d;
        }
        for d in bp.copies() {
            batch.push(PendingWrite { dva: *d, data: data.clone() });
        }
        Ok(bp)
    }

    /// Issue a batch of writes and wait for them (see [`SyncWriter`]).
    pub fn issue_writes(&self, batch: Vec<PendingWrite>, txg: Txg) -> Result<()> {
        let w = SyncWriter::new(self, txg);
        w.issue(batch)?;
        w.finish()
    }

    /// Free a block's copies in txg `txg` (deferred) and drop it from the ARC.
    pub fn free_block(&self, bp: &BlockPointer, txg: Txg) {
        if bp.is_hole() {
            return;
        }
        self.arc.evict(&BlockKey { vdev: bp.dva[0].vdev, offset: bp.dva[0].offset, birth: bp.birth });
        for d in bp.copies() {
            self.ms.free_deferred(txg, *d);
        }
    }

    pub fn read_indirect(&self, bp: &BlockPointer, class: IoClass) -> Result<Arc<[u8]>> {
        let d = self.read_block(bp, class, BufKind::Metadata, true)?;
        if d.len() != INDIRECT_SIZE || bp.kind != blkptr::KIND_INDIRECT {
            return Err(Error::Corrupt(format!("indirect block has size {} kind {}", d.len(), bp.kind)));
        }
        Ok(d)
    }
}

/// Issues a txg's block writes without waiting for each: a batch is sorted, adjacent
/// blocks of one top-level vdev are merged into aligned runs of up to 1 MiB (copied once
/// into a pooled buffer), runs of different vdevs are interleaved so every mirror works
/// at once, and each run becomes one mirror write (one request per child, all in
/// flight). At most `window` runs are in flight: `issue` blocks only when the window is
/// full, so the caller prepares the next batch while the devices write this one.
/// `finish` waits for everything and reports the first run no child could write.
pub struct SyncWriter<'a> {
    io: &'a PoolIo,
    txg: Txg,
    window: usize,
    state: Arc<(Mutex<WriterState>, parking_lot::Condvar)>,
}

#[derive(Default)]
struct WriterState {
    in_flight: usize,
    failed: Option<Error>,
}

impl<'a> SyncWriter<'a> {
    pub fn new(io: &'a PoolIo, txg: Txg) -> SyncWriter<'a> {
        let ntops = io.vdevs.read().len().max(1);
        let per_top = crate::vdev::queue::ZFS_VDEV_ASYNC_WRITE_MAX_ACTIVE.get() as usize;
        let window = (per_top * ntops).clamp(8, 4 * WRITE_BUFFERS_POOLED);
        SyncWriter { io, txg, window, state: Arc::new((Mutex::new(WriterState::default()), parking_lot::Condvar::new())) }
    }

    /// Submit a batch (merged into runs); blocks only while the window is full.
    pub fn issue(&self, mut batch: Vec<PendingWrite>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        batch.sort_by_key(|w| (w.dva.vdev, w.dva.offset));
        for run in interleaved_runs(&batch) {
            let Some(top) = self.io.top(run.vdev) else {
                return Err(Error::Corrupt(format!("write to unknown vdev {}", run.vdev)));
            };
            let mut buf = self.io.write_buffers.get(run.bytes);
            for w in &batch[run.blocks.clone()] {
                buf.extend_from_slice(&w.data);
            }
            self.wait_below(self.window)?;
            let buf = Arc::new(buf);
            let (state, keep) = (self.state.clone(), buf.clone());
            let pool = self.io.write_buffers.clone();
            top.write_async(IoClass::AsyncWrite, buf, run.offset, self.txg, Box::new(move |o| {
                let r = o.into_result();
                if let Ok(b) = Arc::try_unwrap(keep) {
                    pool.put(b);
                }
                let mut st = state.0.lock();
                st.in_flight -= 1;
                if let (Err(e), None) = (r, &st.failed) {
                    st.failed = Some(Error::Io(e.into()));
                }
                state.1.notify_all();
            }));
        }
        Ok(())
    }

    /// Block until fewer than `n` runs are in flight, then count one more.
    fn wait_below(&self, n: usize) -> Result<()> {
        let mut st = self.state.0.lock();
        while st.in_flight >= n {
            self.state.1.wait(&mut st);
        }
        if let Some(e) = st.failed.take() {
            return Err(e);
        }
        st.in_flight += 1;
        Ok(())
    }

    /// Wait for every run; the first failure, if any.
    pub fn finish(self) -> Result<()> {
        let mut st = self.state.0.lock();
        while st.in_flight > 0 {
            self.state.1.wait(&mut st);
        }
        match st.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for SyncWriter<'_> {
    fn drop(&mut self) {
        // Never return while a completion may still touch the pool's buffers.
        let mut st = self.state.0.lock();
        while st.in_flight > 0 {
            self.state.1.wait(&mut st);
        }
    }
}

/// Merge a sorted batch into runs and interleave the vdevs' runs round-robin.
fn interleaved_runs(batch: &[PendingWrite]) -> Vec<Run> {
    let mut per_vdev: BTreeMap<u32, Vec<Run>> = BTreeMap::new();
    for (i, w) in batch.iter().enumerate() {
        let runs = per_vdev.entry(w.dva.vdev).or_default();
        match runs.last_mut() {
            Some(r) if r.offset + r.bytes as u64 == w.dva.offset && r.bytes + w.data.len() <= AGGREGATION_LIMIT_BYTES => {
                r.bytes += w.data.len();
                r.blocks.end = i + 1;
            }
            _ => runs.push(Run { vdev: w.dva.vdev, offset: w.dva.offset, bytes: w.data.len(), blocks: i..i + 1 }),
        }
    }
    let mut queues: Vec<std::collections::VecDeque<Run>> = per_vdev.into_values().map(Into::into).collect();
    let mut runs: Vec<Run> = Vec::new();
    while queues.iter().any(|q| !q.is_empty()) {
        for q in queues.iter_mut() {
            if let Some(r) = q.pop_front() {
                runs.push(r);
            }
        }
    }
    runs
}

fn child_bp(ind: &[u8], idx: u64) -> Result<BlockPointer> {
    let o = idx as usize * BlockPointer::SIZE;
    BlockPointer::decode(&ind[o..o + BlockPointer::SIZE]).ok_or_else(|| Error::Corrupt("bad block pointer in indirect block".into()))
}

/// Committed root of a volume's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeRoot {
    pub bp: BlockPointer,
    pub nlevels: u8,
}

/// Find the L0 block pointer of `blkid` (hole if unwritten).
pub fn lookup(io: &PoolIo, root: &TreeRoot, blkid: u64, class: IoClass) -> Result<BlockPointer> {
    let mut bp = root.bp;
    for level in (1..root.nlevels as u32).rev() {
        if bp.is_hole() {
            return Ok(bp);
        }
        let ind = io.read_indirect(&bp, class)?;
        let idx = (blkid >> (INDIRECT_SHIFT * (level - 1))) & (EPB - 1);
        bp = child_bp(&ind, idx)?;
    }
    Ok(bp)
}

/// Visit every non-hole L0 block pointer whose blkid lies in `[first, last]`, in order,
/// skipping hole subtrees. `f` returns false to stop.
pub fn walk_range(
    io: &PoolIo,
    root: &TreeRoot,
    first: u64,
    last: u64,
    class: IoClass,
    f: &mut dyn FnMut(u64, &BlockPointer) -> Result<bool>,
) -> Result<bool> {
    fn rec(
        io: &PoolIo,
        bp: &BlockPointer,
        level: u32,
        base: u64,
        first: u64,
        last: u64,
        class: IoClass,
        f: &mut dyn FnMut(u64, &BlockPointer) -> Result<bool>,
    ) -> Result<bool> {
        if bp.is_hole() {
            return Ok(true);
        }
        if level == 0 {
            return f(base, bp);
        }
        let span = EPB.pow(level - 1);
        let ind = io.read_indirect(bp, class)?;
        let lo = first.saturating_sub(base) / span;
        let hi = ((last - base) / span).min(EPB - 1);
        for idx in lo..=hi {
            let c = child_bp(&ind, idx)?;
            if !rec(io, &c, level - 1, base + idx * span, first, last, class, f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
    rec(io, &root.bp, root.nlevels as u32 - 1, 0, first, last, class, f)
}

/// Visit every block pointer of the tree (indirects included), parents before children.
pub fn walk_all(io: &PoolIo, root: &TreeRoot, class: IoClass, f: &mut dyn FnMut(&BlockPointer, u8) -> Result<()>) -> Result<()> {
    fn rec(io: &PoolIo, bp: &BlockPointer, level: u32, class: IoClass, f: &mut dyn FnMut(&BlockPointer, u8) -> Result<()>) -> Result<()> {
        if bp.is_hole() {
            return Ok(());
        }
        f(bp, level as u8)?;
        if level == 0 {
            return Ok(());
        }
        let ind = io.read_indirect(bp, class)?;
        for idx in 0..EPB {
            let c = child_bp(&ind, idx)?;
            rec(io, &c, level - 1, class, f)?;
        }
        Ok(())
    }
    rec(io, &root.bp, root.nlevels as u32 - 1, class, f)
}

/// Per-volume settings the syncing context needs.
pub struct WritePolicy {
    pub algo: ChecksumAlgo,
    pub comp: Compression,
    pub txg: Txg,
}

/// Apply sorted L0 changes to the tree rooted at `root`: write new indirects (queued in
/// `batch`), free replaced blocks in `txg`. Returns the new root.
pub fn apply_changes(
    io: &PoolIo,
    root: &TreeRoot,
    changes: &[(u64, BlockPointer)],
    pol: &WritePolicy,
    batch: &mut Vec<PendingWrite>,
) -> Result<TreeRoot> {
    fn rec(
        io: &PoolIo,
        bp: &BlockPointer,
        level: u32,
        base: u64,
        changes: &[(u64, BlockPointer)],
        pol: &WritePolicy,
        batch: &mut Vec<PendingWrite>,
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
            io.read_indirect(bp, IoClass::AsyncRead)?.to_vec()
        };
        let mut i = 0;
        while i < changes.len() {
            let idx = (changes[i].0 - base) / span;
            let mut j = i + 1;
            while j < changes.len() && (changes[j].0 - base) / span == idx {
                j += 1;
            }
            let old = child_bp(&ind, idx)?;
            let new = rec(io, &old, level - 1, base + idx * span, &changes[i..j], pol, batch)?;
            let o = idx as usize * BlockPointer::SIZE;
            ind[o..o + BlockPointer::SIZE].copy_from_slice(&new.encode());
            i = j;
        }
        io.free_block(bp, pol.txg);
        let mut fill = 0u64;
        for idx in 0..EPB {
            fill += child_bp(&ind, idx)?.fill;
        }
        if fill == 0 {
            return Ok(BlockPointer::hole());
        }
        let ind: Arc<[u8]> = ind.into();
        io.alloc_block(&ind, pol.txg, blkptr::KIND_INDIRECT, level as u8, fill, ChecksumAlgo::Fletcher4, Compression::Lz4, 2, batch)
    }
    if changes.is_empty() {
        return Ok(*root);
    }
    let bp = rec(io, &root.bp, root.nlevels as u32 - 1, 0, changes, pol, batch)?;
    Ok(TreeRoot { bp, nlevels: root.nlevels })
}

// ---------------------------------------------------------------------------------------
// Dirty records

pub const DIRTY_SHARDS: usize = 64;

#[derive(Clone)]
pub struct DirtyVersion {
    pub txg: Txg,
    /// None = the block was freed (reads as zeros, hole).
    pub data: Option<Arc<[u8]>>,
}

#[derive(Default)]
pub struct DirtyShard {
    pub blocks: HashMap<u64, Vec<DirtyVersion>>,
    /// Incremented whenever a sync drops committed records from this shard.
    pub commit_gen: u64,
}

pub struct DirtySet {
    pub shards: Vec<Mutex<DirtyShard>>,
    /// Indirect blocks dirtied per txg, as (txg, level, index): each is rewritten by
    /// that txg's sync, and space admission counts it once. Sharded by index.
    indirects: Vec<Mutex<std::collections::HashSet<(Txg, u8, u64)>>>,
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
    pub fn shard(&self, blkid: u64) -> &Mutex<DirtyShard> {
        &self.shards[(blkid as usize) % DIRTY_SHARDS]
    }
    /// Newest dirty version of a block: Some(None) = freed, Some(Some) = data.
    pub fn newest(&self, blkid: u64) -> Option<Option<Arc<[u8]>>> {
        self.shard(blkid).lock().blocks.get(&blkid).and_then(|v| v.last()).map(|v| v.data.clone())
    }
    /// Insert a version for `txg`; returns true if this block became newly dirty in txg.
    pub fn insert(shard: &mut DirtyShard, blkid: u64, txg: Txg, data: Option<Arc<[u8]>>) -> bool {
        let v = shard.blocks.entry(blkid).or_default();
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
    pub fn collect(&self, txg: Txg) -> Vec<(u64, Option<Arc<[u8]>>)> {
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
    pub fn note_indirects(&self, txg: Txg, blkid: u64, nlevels: u8) -> u32 {
        let mut n = 0;
        for level in 1..nlevels.max(1) {
            let idx = blkid >> (INDIRECT_SHIFT * level as u32);
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
            let bp = BlockPointer::decode(r.bytes(BlockPointer::SIZE)?).ok_or_else(|| Error::Corrupt("bad volume root".into()))?;
            let props_json = r.string()?;
            let local: BTreeMap<String, String> =
                serde_json::from_str(&props_json).map_err(|e| Error::Corrupt(format!("volume properties: {e}")))?;
            let created_txg = Txg(r.u64()?);
            if !(1..=8).contains(&nlevels) || !volblocksize.is_power_of_two() {
                return Err(Error::Corrupt(format!("volume {name}: bad geometry")));
            }
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
        Ok(Mos { txg, next_volume_id, volumes, scan_state, pool_props, leaf_health })
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
        let mut buf = c.to_vec();
        buf.resize(c.len().div_ceil(4096) * 4096, 0);
        let buf: Arc<[u8]> = buf.into();
        let bp = io.alloc_block(&buf, txg, blkptr::KIND_MOS_CHUNK, 0, 1, ChecksumAlgo::Fletcher4, Compression::Lz4, 2, batch)?;
        index[i * BlockPointer::SIZE..(i + 1) * BlockPointer::SIZE].copy_from_slice(&bp.encode());
    }
    let index: Arc<[u8]> = index.into();
    let mut ibp = io.alloc_block(&index, txg, blkptr::KIND_MOS_INDEX, 1, chunks.len() as u64, ChecksumAlgo::Fletcher4, Compression::Lz4, 3, batch)?;
    ibp.fill = blob.len() as u64;
    // fill of the index = exact blob length; the checksum covers data only, so this is safe
    Ok(ibp)
}

/// Every bp of the MOS (index first), for freeing and scrubbing.
pub fn mos_blocks(io: &PoolIo, index: &BlockPointer, class: IoClass) -> Result<Vec<BlockPointer>> {
    let ind = io.read_block(index, class, BufKind::Metadata, false)?;
    let nchunks = (index.fill as usize).div_ceil(MOS_CHUNK_SIZE);
    if nchunks * BlockPointer::SIZE > ind.len() {
        return Err(Error::Corrupt("MOS index too small".into()));
    }
    let mut out = vec![*index];
    for i in 0..nchunks {
        out.push(child_bp(&ind, i as u64)?);
    }
    Ok(out)
}

pub fn read_mos_blob(io: &PoolIo, index: &BlockPointer, class: IoClass) -> Result<Vec<u8>> {
    let bps = mos_blocks(io, index, class)?;
    let mut blob = Vec::with_capacity(index.fill as usize);
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
    pub volsize: u64,
    pub volblocksize: u32,
    pub created_txg: Txg,
    pub props: RwLock<crate::props::PropSet>,
    pub committed: RwLock<TreeRoot>,
    pub dirty: DirtySet,
    pub destroyed: std::sync::atomic::AtomicBool,
}

impl VolumeState {
    pub fn nblocks(&self) -> u64 {
        self.volsize.div_ceil(self.volblocksize as u64)
    }
    pub fn record(&self, root: TreeRoot) -> VolumeRecord {
        VolumeRecord {
            id: self.id,
            name: self.name.clone(),
            volsize: self.volsize,
            volblocksize: self.volblocksize,
            root,
            props: self.props.read().clone(),
            created_txg: self.created_txg,
        }
    }
}
