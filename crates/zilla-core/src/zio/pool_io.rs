//! pool_io: the pool's block I/O — verified reads through the ARC with ditto
//! self-heal, allocation of prepared blocks in syncing context, and the sync writer that
//! issues a txg's writes.
//!
//! Theory of operation
//! -------------------
//! [`PoolIo`] owns the top-level vdevs, the allocators (one per class) and the ARC.
//!
//! Reads. `read_block` looks the block up in the ARC by its (vdev, offset, birth) key,
//! which names its content forever. On a miss it reads the copies (DVAs) in order; each
//! copy is read through its mirror (`TopVdev::read_verified`), which tries the children
//! until one matches the checksum from the block pointer and rewrites the children that
//! returned bad data. A copy bad on every child (a ditto copy lost) is rewritten from the
//! first good copy if its space is still allocated. The verified bytes are decompressed
//! and inserted into the ARC. When no copy verifies, the error says whether every copy
//! failed its checksum (`Error::Checksum`) or an I/O error was involved (`Error::Io`),
//! and names the vdev, offset and birth; the pool's bounded error log keeps it for
//! `status -v`.
//!
//! Writes. In syncing context `alloc_block` compresses and checksums a block
//! (`zio::prepare`), allocates its copies from the normal class (joining the sync's undo
//! list) and queues a [`PendingWrite`] per copy. [`SyncWriter`] sorts a batch, merges
//! adjacent blocks of a vdev into runs of up to `AGGREGATION_LIMIT_BYTES`, interleaves
//! the vdevs and keeps a bounded window of runs in flight; `finish` reports the first run
//! no child could write. Frees are deferred (`free_block`) and evict the ARC entry.

use crate::vdev::abd::AlignedBuf;
use crate::vdev::queue::WriteBytes;
use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::arc::{BlockKey, BufKind, CacheHint, PoolArc};
use crate::block::blkptr::{BlockPointer, Dva};
use crate::block::checksum::ChecksumAlgo;
use crate::block::compress::Compression;
use crate::metaslab::Metaslabs;
use crate::vdev::mirror::TopVdev;
use crate::vdev::{IoClass, Role};
use crate::{Error, Result, Txg, VdevId};

/// Counters for `zpool status` (scrub/self-heal) and errors.
#[derive(Debug, Default)]
pub struct IoErrors {
    pub self_healed_bytes: std::sync::atomic::AtomicU64,
    pub unrecoverable: std::sync::atomic::AtomicU64,
}

/// The engine's block I/O: vdev tree, allocator, and the pool's handle on the daemon's
/// ARC (reached only through the named operations below: look up, cache, release to a
/// writer, forget, reserve).
pub struct PoolIo {
    pub vdevs: RwLock<Vec<Arc<TopVdev>>>,
    /// The allocators, one per class, each with its own lock.
    pub ms: Metaslabs,
    arc: PoolArc,
    /// The L2ARC on the pool's cache vdevs (None without any; set when the first is
    /// added).
    l2: RwLock<Option<Arc<crate::l2arc::L2Arc>>>,
    pub errors: IoErrors,
    /// Recent unrecoverable block errors, each block once, oldest first, bounded (for
    /// `status -v`); see [`PoolIo::log_error`].
    error_log: Mutex<ErrorLog>,
    /// Normal-class (size, unavailable: see `space`) as of the last sync, read lock-free
    /// by writers.
    pub space_size: std::sync::atomic::AtomicU64,
    pub space_unavailable: std::sync::atomic::AtomicU64,
    /// Normal-class intent-log blocks allocated since the last `refresh_space` (each
    /// counted as whole `SPACE_ADMISSION_UNIT_BYTES` pieces): log blocks are allocated
    /// between syncs, and admission must see them at once (see `space`).
    space_log_bytes: std::sync::atomic::AtomicU64,
    /// Checksum/compress workers, started at the first sync.
    prepare: std::sync::OnceLock<crate::zio::workers::PrepareWorkers>,
    /// The pool's clock and sleeps, for the layers that reach the pool through its I/O
    /// (the intent log's commit timing).
    env: Arc<dyn crate::env::Env>,
}

pub const ERROR_LOG_MAX: usize = 100;

/// See [`PoolIo::log_error`].
#[derive(Default)]
struct ErrorLog {
    /// (when logged: the value of `logged` then, the block, message)
    entries: Vec<(u64, ErrorKey, String)>,
    /// Calls of `log_error` so far.
    logged: u64,
}

/// A block in the error log: its first DVA and birth (the read path and a scrub word
/// their messages differently; the block is the same).
type ErrorKey = (VdevId, u64, Txg);

/// A block allocated and prepared in syncing context, not yet written.
pub struct PendingWrite {
    pub dva: Dva,
    pub data: Arc<AlignedBuf>,
}

/// Largest aggregated write (zfs_vdev_aggregation_limit).
pub const AGGREGATION_LIMIT_BYTES: usize = 1 << 20;
/// The largest block the pool writes (an indirect block, an object-directory chunk,
/// the largest volblocksize): space admission counts free space in pieces of this size.
pub const SPACE_ADMISSION_UNIT_BYTES: u64 = 128 << 10;
/// The most runs one txg sync keeps in flight.
pub const SYNC_RUNS_IN_FLIGHT_MAX: usize = 128;

/// Adjacent blocks of one top-level vdev written as one I/O: `blocks` indexes the batch.
struct Run {
    vdev: VdevId,
    offset: u64,
    bytes: usize,
    blocks: std::ops::Range<usize>,
}

impl PoolIo {
    /// The allocation unit: `1 << ashift` of the largest-ashift data or log vdev (at
    /// least 4 KiB). Every block's asize is a multiple of it, so on every vdev a block
    /// starts and ends on that vdev's sector boundaries.
    pub fn alloc_unit(&self) -> u64 {
        let ashift = self.vdevs.read().iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)).map(|t| t.ashift).max().unwrap_or(12);
        (1u64 << ashift).max(crate::zio::ALLOC_UNIT)
    }

    pub fn new(vdevs: Vec<Arc<TopVdev>>, ms: Metaslabs, env: Arc<dyn crate::env::Env>) -> PoolIo {
        let arc = PoolArc::attach(crate::arc::daemon_arc().clone());
        PoolIo {
            vdevs: RwLock::new(vdevs),
            ms,
            l2: RwLock::new(None),
            arc,
            errors: Default::default(),
            error_log: Mutex::new(ErrorLog::default()),
            space_size: Default::default(),
            space_unavailable: Default::default(),
            space_log_bytes: Default::default(),
            prepare: std::sync::OnceLock::new(),
            env,
        }
    }

    /// The cached buffer of block `k` (a `kind` block a demand read wants), if the ARC
    /// holds it. A hit is counted; a miss is counted by the read that follows
    /// (`read_block_first_async`, or `read_block`'s own lookup), so a read counts once.
    pub fn cached(&self, k: &BlockKey, kind: BufKind) -> Option<Arc<AlignedBuf>> {
        self.arc.lookup_hit_only(k, CacheHint::of(kind))
    }

    /// [`PoolIo::cached`] for an access `access` describes (a read ahead of demand is
    /// counted as a prefetch hit, and leaves a prefetched buffer's flag alone).
    pub fn cached_as(&self, k: &BlockKey, access: CacheHint) -> Option<Arc<AlignedBuf>> {
        self.arc.lookup_hit_only(k, access)
    }

    /// The daemon's ARC limit in bytes (`zfs_arc_max` as the ARC reads it).
    pub fn arc_c_max(&self) -> u64 {
        self.arc.c_max()
    }

    /// Cache `data` as block `k` (a block read, or written by a committed txg).
    pub fn cache(&self, k: BlockKey, data: Arc<AlignedBuf>, hint: CacheHint) {
        self.arc.insert(k, data, hint)
    }

    /// Take the ARC's buffer `held` of block `k` for a writer that changes it in place,
    /// if nobody else holds it (see `arc::ArcCache::release_to_writer`).
    pub fn release_cached_to_writer(&self, k: &BlockKey, held: &Arc<AlignedBuf>) -> bool {
        self.arc.release_to_writer(k, held)
    }

    /// Drop block `k` from the ARC (freed, or a test making the next read go to disk).
    pub fn forget_cached(&self, k: &BlockKey) {
        self.arc.evict(k)
    }

    /// A reservation in the ARC for a txg sync's written buffers.
    pub fn arc_reservation(&self) -> crate::arc::ArcReservation<'_> {
        self.arc.reservation()
    }

    /// The daemon's ARC statistics.
    pub fn arc_stats(&self) -> crate::arc::ArcStats {
        self.arc.stats()
    }

    /// The pool's L2ARC statistics (None without cache devices).
    pub fn l2_stats(&self) -> Option<crate::l2arc::L2Stats> {
        self.l2arc().map(|l| l.stats())
    }

    /// The pool's L2ARC, if it has cache devices.
    pub fn l2arc(&self) -> Option<Arc<crate::l2arc::L2Arc>> {
        self.l2.read().clone()
    }

    /// Start the L2ARC on the pool's cache vdevs, once the pool is ours (created, or
    /// imported with its ownership checked): before that, nothing may write to them.
    /// `restore`: rebuild their contents (an import; a new pool has nothing to restore).
    pub fn start_l2arc(&self, restore: bool) {
        let caches: Vec<Arc<TopVdev>> = self.vdevs.read().iter().filter(|t| t.role == Role::Cache).cloned().collect();
        let mut l2 = self.l2.write();
        if l2.is_none() && !caches.is_empty() {
            *l2 = crate::l2arc::L2Arc::start(self.arc.load_id(), crate::arc::daemon_arc(), caches, &self.env, restore);
        }
    }

    /// Cache vdev `top` joined the pool (`pool add ... cache`): the L2ARC uses it.
    pub fn cache_vdev_added(&self, top: Arc<TopVdev>) {
        let mut l2 = self.l2.write();
        match &*l2 {
            Some(l) => l.add_device(top),
            None => *l2 = crate::l2arc::L2Arc::start(self.arc.load_id(), crate::arc::daemon_arc(), vec![top], &self.env, false),
        }
    }

    /// Cache vdev `id` is leaving the pool: once this returns the L2ARC no longer
    /// touches it.
    pub fn cache_vdev_removed(&self, id: VdevId) {
        if let Some(l) = self.l2arc() {
            l.remove_device(id);
        }
    }

    /// The pool's Env (clock, sleeps).
    pub fn env(&self) -> &Arc<dyn crate::env::Env> {
        &self.env
    }

    /// The pool's checksum/compress workers (started once, on first use).
    pub fn prepare_workers(&self, env: &Arc<dyn crate::env::Env>, pool: &str) -> &crate::zio::workers::PrepareWorkers {
        self.prepare.get_or_init(|| crate::zio::workers::PrepareWorkers::start(env, pool))
    }

    /// Refresh the lock-free space snapshot from the allocator. Free space counts
    /// only in whole `SPACE_ADMISSION_UNIT_BYTES` pieces: there is no gang block, so a
    /// largest block (an indirect, an object-directory chunk, a 128 KiB data block)
    /// needs that much contiguous space, and free space fragmented into smaller holes
    /// could not take the txg that admission let in.
    pub fn refresh_space(&self) {
        // zeroed before the allocator is read: a log block allocated meanwhile is
        // counted twice until the next refresh, never missed
        self.space_log_bytes.store(0, std::sync::atomic::Ordering::SeqCst);
        let (size, _) = self.ms.space(Role::Normal);
        let usable = self.ms.free_in_units(Role::Normal, SPACE_ADMISSION_UNIT_BYTES);
        self.space_size.store(size, std::sync::atomic::Ordering::Relaxed);
        self.space_unavailable.store(size - usable.min(size), std::sync::atomic::Ordering::Relaxed);
    }

    /// (size, unavailable) bytes of the normal class, for space admission:
    /// unavailable = allocated, plus free space in pieces smaller than the largest
    /// block, as of the last sync (see `refresh_space`), plus the intent-log blocks
    /// allocated in the normal class since then.
    pub fn space(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::{Relaxed, SeqCst};
        let unavailable = self.space_unavailable.load(Relaxed) + self.space_log_bytes.load(SeqCst);
        (self.space_size.load(Relaxed), unavailable)
    }

    /// An intent-log block of `len` bytes is about to be allocated in the normal class
    /// outside any sync: count it as unavailable from now on, in whole admission units
    /// (a small block can break up a 128 KiB piece). An allocation that then fails stays
    /// counted until the next sync: too much, never too little.
    pub fn note_log_block(&self, len: u64) {
        self.space_log_bytes.fetch_add(len.next_multiple_of(SPACE_ADMISSION_UNIT_BYTES), std::sync::atomic::Ordering::SeqCst);
    }

    /// The pool has log vdevs (spa_has_slogs).
    pub fn has_log_vdevs(&self) -> bool {
        self.vdevs.read().iter().any(|t| t.role == Role::Log)
    }

    pub fn top(&self, id: VdevId) -> Option<Arc<TopVdev>> {
        self.vdevs.read().iter().find(|t| t.id == id).cloned()
    }

    /// Record an unrecoverable block in the bounded error log (`zpool status -v`). A
    /// block already listed moves to the end (newest) and is not counted again. The
    /// pool's data-error count is the number of distinct blocks logged while listed:
    /// past [`ERROR_LOG_MAX`] the oldest leave the list and stay counted (a block that
    /// left and is found again counts twice). A finished scrub's rotation
    /// ([`PoolIo::keep_errors_since`]) sets it to the blocks still listed.
    pub fn log_error(&self, bp: &BlockPointer, msg: String) {
        let key = (bp.dva[0].vdev, bp.dva[0].offset, bp.birth);
        let mut l = self.error_log.lock();
        l.logged += 1;
        let seq = l.logged;
        if let Some(i) = l.entries.iter().position(|(_, k, _)| *k == key) {
            l.entries.remove(i);
        } else {
            if l.entries.len() >= ERROR_LOG_MAX {
                l.entries.remove(0);
            }
            self.errors.unrecoverable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        l.entries.push((seq, key, msg));
    }

    /// The blocks listed, oldest first.
    pub fn error_list(&self) -> Vec<String> {
        self.error_log.lock().entries.iter().map(|(_, _, m)| m.clone()).collect()
    }

    /// Forget every listed error (`pool clear`, a rewind's import).
    pub fn clear_errors(&self) {
        self.error_log.lock().entries.clear();
        self.errors.unrecoverable.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// A mark for [`PoolIo::keep_errors_since`]: errors logged after it are newer.
    pub fn errors_logged(&self) -> u64 {
        self.error_log.lock().logged
    }

    /// A scrub that began at `mark` read every block: the errors logged before it are of
    /// blocks it found good or that are gone (repaired, overwritten, freed). Keep only
    /// the blocks logged since, and count only them.
    pub fn keep_errors_since(&self, mark: u64) {
        let mut l = self.error_log.lock();
        l.entries.retain(|(seq, _, _)| *seq > mark);
        self.errors.unrecoverable.store(l.entries.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// The first try of [`PoolIo::read_block`] without blocking, for a block the ARC
    /// does not hold: its first copy, from the child the mirror picks, verified; `done`
    /// runs once, here or from the device completion, with the physical bytes, or with
    /// `None` (then `read_block` from a blocking context). Hand the bytes to
    /// [`PoolIo::finish_block_read`]. `access` says how the ARC miss is counted (a
    /// demand or a prefetch read, data or metadata).
    pub fn read_block_first_async(&self, bp: &BlockPointer, class: IoClass, access: CacheHint, done: Box<dyn FnOnce(Option<crate::vdev::abd::AlignedBuf>) + Send>) {
        let dva = bp.dva[0];
        // a copy on a cache device is read by the blocking path (the L2ARC reads and
        // checks it there, falling back to the pool)
        if self.l2arc().is_some_and(|l| l.holds(&BlockKey::of(bp))) {
            return done(None);
        }
        let Some(top) = self.top(dva.vdev).filter(|_| !bp.is_hole()) else { return done(None) };
        // the ARC miss of this read (the front end's lookup left it to the read)
        self.arc.note_miss(&BlockKey::of(bp), access);
        let bp_copy = *bp;
        top.read_first_async(class, dva.offset, dva.asize as usize, bp.birth, Box::new(move |b| crate::zio::verify_copy(&bp_copy, b)), done);
    }

    /// Whether block `next` may join a run of blocks read as one device I/O by
    /// [`PoolIo::read_run_first_async`]: its first copy starts on the same top-level
    /// vdev where the run's last block's first copy ends, it was born in the same txg
    /// (a child is chosen for the whole run by that birth's DTL), and the run's span
    /// stays within [`AGGREGATION_LIMIT_BYTES`].
    pub fn continues_run(run: &[BlockPointer], next: &BlockPointer) -> bool {
        let (Some(first), Some(last)) = (run.first(), run.last()) else { return true };
        let (a, b) = (last.dva[0], next.dva[0]);
        !next.is_hole()
            && a.vdev == b.vdev
            && a.offset + a.asize as u64 == b.offset
            && last.birth == next.birth
            && b.offset + b.asize as u64 - first.dva[0].offset <= AGGREGATION_LIMIT_BYTES as u64
    }

    /// The first try of several blocks the ARC lacks, stored back to back (each one
    /// [`PoolIo::continues_run`] of those before it), as one device read of their span
    /// from one child, without blocking. `done` runs once with the span's bytes, not
    /// verified: cut them with [`PoolIo::split_run`]; `None` when no child could be
    /// read or a cache device holds one of them (the blocks' own reads then go their
    /// usual ways). Each block's ARC miss is counted as `access`.
    pub fn read_run_first_async(&self, run: &[BlockPointer], class: IoClass, access: CacheHint, done: Box<dyn FnOnce(Option<AlignedBuf>) + Send>) {
        let Some(first) = run.first() else { return done(None) };
        let whole = (1..run.len()).all(|i| Self::continues_run(&run[..i], &run[i]));
        if !whole || first.is_hole() {
            return done(None);
        }
        if let Some(l2) = self.l2arc() {
            if run.iter().any(|bp| l2.holds(&BlockKey::of(bp))) {
                return done(None);
            }
        }
        let Some(top) = self.top(first.dva[0].vdev) else { return done(None) };
        for bp in run {
            self.arc.note_miss(&BlockKey::of(bp), access);
        }
        let last = run[run.len() - 1].dva[0];
        let span = (last.offset + last.asize as u64 - first.dva[0].offset) as usize;
        // each block is verified by itself when the span is cut
        let accept = Box::new(|_: &[u8]| crate::vdev::mirror::VerifyResult::Good);
        top.read_first_async(class, first.dva[0].offset, span, first.birth, accept, done);
    }

    /// The verified physical bytes of each block of `run` from the span
    /// [`PoolIo::read_run_first_async`] read (None: that block's bytes did not verify).
    pub fn split_run(run: &[BlockPointer], span: &AlignedBuf) -> Vec<Option<AlignedBuf>> {
        let base = run.first().map_or(0, |bp| bp.dva[0].offset);
        run.iter()
            .map(|bp| {
                let at = (bp.dva[0].offset - base) as usize;
                let bytes = span.get(at..at + bp.dva[0].asize as usize)?;
                (crate::zio::verify_copy(bp, bytes) == crate::vdev::mirror::VerifyResult::Good).then(|| AlignedBuf::copy_of(bytes))
            })
            .collect()
    }

    /// The logical block from verified physical bytes of `bp` (decompressed, its size
    /// checked), inserted into the ARC when `cache`: how every block read ends.
    pub fn finish_block_read(&self, bp: &BlockPointer, phys: AlignedBuf, hint: CacheHint, cache: bool) -> Result<Arc<AlignedBuf>> {
        let data: Arc<AlignedBuf> = crate::zio::finish_read(bp, phys)?;
        if data.len() != bp.lsize as usize {
            return Err(Error::Corrupt("decompressed size mismatch".into()));
        }
        if cache {
            self.arc.insert(BlockKey::of(bp), data.clone(), hint);
        }
        Ok(data)
    }

    /// Read and verify a block; ARC first. `cache` = insert into the ARC.
    pub fn read_block(&self, bp: &BlockPointer, class: IoClass, kind: BufKind, cache: bool) -> Result<Arc<AlignedBuf>> {
        self.read_block_found_at(bp, class, CacheHint::of(kind), cache, self.ms.release_generation())
    }

    /// [`PoolIo::read_block`] cached with `hint`.
    pub fn read_block_hinted(&self, bp: &BlockPointer, class: IoClass, hint: CacheHint, cache: bool) -> Result<Arc<AlignedBuf>> {
        self.read_block_found_at(bp, class, hint, cache, self.ms.release_generation())
    }

    /// [`PoolIo::read_block`] of a block pointer found in a tree while the release
    /// generation (`Metaslabs::release_generation`) was `generation`, sampled before
    /// the tree was looked at: a bad copy is rewritten only if no freed block was
    /// released since, so a slow lookup and read of a block freed and reused meanwhile
    /// never writes old contents over the new owner's.
    pub fn read_block_found_at(&self, bp: &BlockPointer, class: IoClass, hint: CacheHint, cache: bool, generation: u64) -> Result<Arc<AlignedBuf>> {
        assert!(!bp.is_hole());
        let key = BlockKey::of(bp);
        if let Some(d) = self.arc.lookup(&key, hint) {
            return Ok(d);
        }
        // ARC → L2ARC → pool: a verified copy on a cache device
        if let Some(l2) = self.l2arc() {
            if let Some(buf) = l2.read(bp).filter(|b| b.len() == bp.lsize as usize) {
                let data = Arc::new(buf);
                if cache {
                    // already on a cache device: its eviction need not feed it again
                    self.arc.insert(key, data.clone(), CacheHint { l2_eligible: false, ..hint });
                }
                return Ok(data);
            }
        }
        // Self-heal rewrites only while no freed block has been released for reuse
        // since the block was found (a slow read of a block freed meanwhile must not
        // write its old contents over a new owner's).
        let gate = |write: &mut dyn FnMut() -> bool| self.ms.with_releases_held(generation, write);
        let mut last: Option<io::Error> = None;
        let mut all_checksum = true;
        let mut failed: Vec<(Arc<TopVdev>, Dva)> = Vec::new();
        for dva in bp.copies() {
            let Some(tvd) = self.top(dva.vdev) else {
                all_checksum = false;
                continue;
            };
            let verify = |b: &[u8]| crate::zio::verify_copy(bp, b);
            match tvd.read_verified(class, dva.offset, dva.asize as usize, bp.birth, &verify, &gate) {
                Ok(r) => {
                    let mut healed = r.repaired_bytes;
                    // ditto self-heal: a copy bad on every child of its mirror is rewritten
                    // from this good one (never touching a copy that read back good)
                    for (ftvd, fdva) in failed.drain(..) {
                        let still_allocated = self.ms.is_allocated(&fdva);
                        if still_allocated && gate(&mut || ftvd.write(IoClass::AsyncWrite, &r.data, fdva.offset, bp.birth).is_ok()) {
                            healed += fdva.asize as u64;
                        }
                    }
                    if healed > 0 {
                        self.errors.self_healed_bytes.fetch_add(healed, std::sync::atomic::Ordering::Relaxed);
                    }
                    return self.finish_block_read(bp, r.data, hint, cache);
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
        self.log_error(bp, format!("<0x{:x}> {where_}", bp.dva[0].offset));
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
        logical: &Arc<AlignedBuf>,
        txg: Txg,
        kind: u8,
        level: u8,
        fill: u64,
        algo: ChecksumAlgo,
        comp: Compression,
        copies: usize,
        batch: &mut Vec<PendingWrite>,
    ) -> Result<BlockPointer> {
        let p = crate::zio::prepare(logical, algo, comp, self.alloc_unit());
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
        self.arc.evict(&BlockKey::of(bp));
        if let Some(l2) = self.l2arc() {
            l2.forget(&BlockKey::of(bp));
        }
        for d in bp.copies() {
            self.ms.free_deferred(txg, *d);
        }
    }
}

impl Drop for PoolIo {
    fn drop(&mut self) {
        if let Some(l2) = self.l2.get_mut().take() {
            l2.stop();
        }
    }
}

/// Issues a txg's block writes without waiting for each: a batch is sorted, adjacent
/// blocks of one top-level vdev are merged into runs of up to 1 MiB (written from the
/// blocks' own aligned buffers by one vectored write, no copy), runs of different vdevs are interleaved so every mirror works
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
        let window = (per_top * ntops).clamp(8, SYNC_RUNS_IN_FLIGHT_MAX);
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
            let bufs: Vec<Arc<AlignedBuf>> = batch[run.blocks.clone()].iter().map(|w| w.data.clone()).collect();
            let data = match <[Arc<AlignedBuf>; 1]>::try_from(bufs) {
                Ok([one]) => WriteBytes::One(one),
                Err(bufs) => WriteBytes::Vectored(Arc::new(bufs)),
            };
            debug_assert_eq!(data.len(), run.bytes, "a run's blocks are its bytes");
            self.wait_below(self.window)?;
            let state = self.state.clone();
            top.write_async(IoClass::AsyncWrite, data, run.offset, self.txg, Box::new(move |o| {
                let r = o.into_result();
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
    let mut per_vdev: BTreeMap<VdevId, Vec<Run>> = BTreeMap::new();
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

#[cfg(test)]
mod error_log_tests {
    use super::*;

    fn bp(offset: u64) -> BlockPointer {
        let mut bp = BlockPointer::default();
        bp.dva[0] = Dva { vdev: VdevId(0), asize: 4096, offset };
        bp.birth = Txg(5);
        bp
    }

    /// The count as `log_error` documents it: a block logged again while listed is
    /// counted once; past the bound the oldest leave the list and stay counted (one
    /// found again after leaving counts twice); a scrub's rotation counts what it keeps.
    #[test]
    fn the_data_error_count_follows_the_bounded_list() {
        let io = PoolIo::new(Vec::new(), Metaslabs::new(), crate::env::real());
        let count = || io.errors.unrecoverable.load(std::sync::atomic::Ordering::Relaxed);
        io.log_error(&bp(0), "block 0".into());
        io.log_error(&bp(0), "block 0 again".into());
        assert_eq!((count(), io.error_list().len()), (1, 1), "a block listed is counted once");
        for i in 1..=ERROR_LOG_MAX as u64 {
            io.log_error(&bp(i * 4096), format!("block {i}"));
        }
        assert_eq!((count(), io.error_list().len()), (101, ERROR_LOG_MAX), "the oldest left the list and stays counted");
        assert!(!io.error_list().contains(&"block 0 again".to_string()));
        io.log_error(&bp(0), "block 0 found again".into());
        assert_eq!(count(), 102, "a block found again after leaving the list counts again");
        let mark = io.errors_logged();
        io.log_error(&bp(5 * 4096), "block 5 seen by the scrub".into());
        io.keep_errors_since(mark);
        assert_eq!((count(), io.error_list()), (1, vec!["block 5 seen by the scrub".to_string()]));
        io.clear_errors();
        assert_eq!((count(), io.error_list().len()), (0, 0));
    }
}
