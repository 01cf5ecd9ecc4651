//! prefetch: the I/O side of read-ahead (the detector and its bounds are `zfetch`,
//! whose module comment is the theory of operation). A demand read tells the volume's
//! detector what it read; the blocks the detector hands back are read here without
//! waiting, from memory-only tree walks: a block dirty in an open txg, a hole, or one the
//! ARC holds needs no read; an indirect block the ARC lacks is read (as prefetched
//! metadata) and the walk stops there until the next hit.

use super::*;
use crate::block::blkptr::BlockPointer;
use crate::zfetch::{self, Limits};

impl Volume {
    /// A demand read of `[offset, offset + len)` was served or is on its way: feed the
    /// detector and read ahead what it asks for. Never waits for I/O.
    pub(super) fn read_ahead(&self, offset: u64, len: u64) {
        if !zfetch::enabled() || len == 0 || !self.primary_cache_data() {
            return;
        }
        let bs = self.bs();
        let first = offset / bs;
        let nblks = (offset + len - 1) / bs - first + 1;
        let io = self.pool.io();
        let limits = Limits { max_distance: zfetch::max_distance_blocks(bs, io.arc_c_max()), nblocks: self.vol.nblocks(), block_bytes: bs };
        let Some(range) = self.vol.zfetch.access(first, nblks, io.env().now_ns(), limits) else { return };
        if range.is_empty() {
            return;
        }
        let stopped = self.prefetch_range(range.clone());
        if stopped < range.end {
            self.vol.zfetch.give_back(range, stopped);
        }
    }

    /// Issue the reads of the blocks of `range` that need one, blocks stored back to back
    /// as one device read (a run, see `PoolIo::continues_run`); the block the walk
    /// stopped at (`range.end`: it went through).
    fn prefetch_range(&self, range: std::ops::Range<u64>) -> u64 {
        let mut memo = None;
        let data = CacheHint { prefetched: true, ..self.data_hint() };
        // the volume's secondarycache decides for read-ahead too (an indirect block read
        // ahead is the same block a demand read would cache)
        let metadata = CacheHint { prefetched: true, ..self.metadata_hint() };
        // the run being gathered and the block it starts at
        let mut run: Vec<BlockPointer> = Vec::new();
        let mut run_start = range.start;
        for blkid in range.clone() {
            // a volume destroyed (or a pool exporting) meanwhile reads nothing more
            if self.check_live().is_err() {
                return range.end;
            }
            match self.lookup_cached(BlockId(blkid), &mut memo, Access::Prefetch) {
                // dirty, a hole, cached, or a pointer that does not check out (the
                // demand read will say why): nothing to read ahead
                Some(CachedBlock::Data(_)) | None => {
                    if !self.issue_run(&mut run, data) {
                        return run_start;
                    }
                }
                Some(CachedBlock::Missing(bp)) => {
                    if !PoolIo::continues_run(&run, &bp) && !self.issue_run(&mut run, data) {
                        return run_start;
                    }
                    if run.is_empty() {
                        run_start = blkid;
                    }
                    run.push(bp);
                }
                Some(CachedBlock::IndirectMissing(bp)) => {
                    if !self.issue_run(&mut run, data) {
                        return run_start;
                    }
                    self.issue_prefetch(bp, metadata);
                    return blkid;
                }
            }
        }
        if !self.issue_run(&mut run, data) {
            return run_start;
        }
        range.end
    }

    /// Read the blocks of `run` (emptied) ahead of demand into the ARC as `hint` says: one
    /// block by itself, several as one device read of their span, cut and verified block
    /// by block. False when the in-flight bounds did not allow it (nothing issued).
    fn issue_run(&self, run: &mut Vec<BlockPointer>, hint: CacheHint) -> bool {
        match run.len() {
            0 => return true,
            1 => {
                let ok = self.issue_prefetch(run[0], hint);
                run.clear();
                return ok;
            }
            _ => {}
        }
        let bytes: u64 = run.iter().map(|bp| u64::from(bp.lsize).max(u64::from(bp.dva[0].asize))).sum();
        if !self.vol.zfetch.try_begin_io(bytes, run.len() as u64) {
            run.clear();
            return false;
        }
        let blocks: Arc<[BlockPointer]> = std::mem::take(run).into();
        let (pool, vol, issued) = (self.pool.clone(), self.vol.clone(), blocks.clone());
        self.pool.io().read_run_first_async(&issued, IoClass::AsyncRead, hint, Box::new(move |span| {
            // blocks that do not verify are dropped: their demand reads try every copy
            if let Some(span) = span.filter(|_| !vol.destroyed.load(Ordering::Acquire)) {
                for (bp, phys) in blocks.iter().zip(PoolIo::split_run(&blocks, &span)) {
                    if let Some(phys) = phys {
                        let _ = pool.io().finish_block_read(bp, phys, hint, true);
                    }
                }
            }
            vol.zfetch.end_io(bytes);
        }));
        true
    }

    /// Read block `bp` ahead of demand into the ARC as `hint` says, if the in-flight
    /// bounds allow (false: they did not).
    fn issue_prefetch(&self, bp: BlockPointer, hint: CacheHint) -> bool {
        let bytes = u64::from(bp.lsize).max(u64::from(bp.dva[0].asize));
        if !self.vol.zfetch.try_begin_io(bytes, 1) {
            return false;
        }
        let pool = self.pool.clone();
        let vol = self.vol.clone();
        self.pool.io().read_block_first_async(&bp, IoClass::AsyncRead, hint, Box::new(move |phys| {
            // a failed or unverified copy is dropped: the demand read tries every copy
            if let Some(phys) = phys.filter(|_| !vol.destroyed.load(Ordering::Acquire)) {
                let _ = pool.io().finish_block_read(&bp, phys, hint, true);
            }
            vol.zfetch.end_io(bytes);
        }));
        true
    }
}
