//! pool_block_io: the object layer's block seam over the pool's pipeline.
//!
//! [`PoolBlockIo`] is [`BlockIo`] for one txg of one pool: reads go through the ARC
//! (and the L2ARC) with checksums verified and bad copies healed; writes are prepared
//! (checksum, compression), allocated and queued in the txg's write batch, which the
//! sync issues with the rest of the txg; frees go to the txg's deferred frees. A block
//! born in this txg is read back from what was written (its write may not be issued
//! yet), and freed at once when a later sync pass replaces it: its write leaves the
//! batch and its space the sync's undo list (no tree an import can choose references
//! it). Copies:
//! data blocks one, metadata two (on different top-level vdevs where there are two),
//! objset blocks three, as OpenZFS keeps ditto copies of what more depends on.

use std::sync::Arc;

use parking_lot::Mutex;

use super::object_tree::{BlockIo, BlockSpec};
use crate::arc::BufKind;
use crate::block::blkptr::{self, BlockPointer};
use crate::vdev::abd::AlignedBuf;
use crate::vdev::IoClass;
use crate::zio::{PendingWrite, PoolIo};
use crate::{Result, Txg};

/// Copies of a block of `kind`.
pub fn copies_of(kind: u8) -> usize {
    match kind {
        blkptr::KIND_DATA => 1,
        blkptr::KIND_OBJSET => 3,
        _ => 2,
    }
}

/// The pool's pipeline in `txg`.
pub struct PoolBlockIo<'a> {
    pub io: &'a PoolIo,
    pub txg: Txg,
    /// How reads are queued (sync-time reads of old indirects: async read).
    pub class: IoClass,
    /// Writes prepared in this txg, for the sync to issue.
    pub batch: Mutex<Vec<PendingWrite>>,
    /// The logical content of every block written in this txg and not freed, by its
    /// first copy's (vdev, offset). Bounded by the txg's writes through this seam.
    written: Mutex<std::collections::HashMap<(u32, u64), Arc<AlignedBuf>>>,
}

impl<'a> PoolBlockIo<'a> {
    pub fn new(io: &'a PoolIo, txg: Txg, class: IoClass) -> PoolBlockIo<'a> {
        PoolBlockIo { io, txg, class, batch: Mutex::new(Vec::new()), written: Mutex::new(Default::default()) }
    }
    /// The prepared writes, to issue.
    pub fn take_batch(&self) -> Vec<PendingWrite> {
        std::mem::take(&mut *self.batch.lock())
    }
}

impl BlockIo for PoolBlockIo<'_> {
    fn txg(&self) -> Txg {
        self.txg
    }
    fn read(&self, bp: &BlockPointer) -> Result<Arc<AlignedBuf>> {
        if bp.birth == self.txg {
            if let Some(b) = self.written.lock().get(&(bp.dva[0].vdev.0, bp.dva[0].offset)) {
                return Ok(b.clone());
            }
        }
        let kind = if bp.kind == blkptr::KIND_DATA { BufKind::Data } else { BufKind::Metadata };
        self.io.read_block(bp, self.class, kind, true)
    }
    fn write(&self, data: Arc<AlignedBuf>, spec: BlockSpec) -> Result<BlockPointer> {
        let mut batch = self.batch.lock();
        let bp = self.io.alloc_block(&data, self.txg, spec.kind, spec.level, spec.fill, spec.checksum, spec.compression, copies_of(spec.kind), &mut batch)?;
        drop(batch);
        if !bp.is_hole() && !bp.dva[0].is_empty() {
            self.written.lock().insert((bp.dva[0].vdev.0, bp.dva[0].offset), data);
        }
        Ok(bp)
    }
    fn free(&self, bp: &BlockPointer) {
        if bp.is_hole() {
            return;
        }
        let mine = bp.birth == self.txg && self.written.lock().remove(&(bp.dva[0].vdev.0, bp.dva[0].offset)).is_some();
        if !mine {
            self.io.free_block(bp, self.txg);
            return;
        }
        let copies: Vec<_> = bp.copies().copied().collect();
        self.batch.lock().retain(|w| !copies.contains(&w.dva));
        for d in &copies {
            self.io.ms.free_unused(d);
        }
    }
}
