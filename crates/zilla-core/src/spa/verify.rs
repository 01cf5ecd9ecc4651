//! spa verify: a zdb-style space accounting check used by the tests.
//!
//! Theory of operation
//! -------------------
//! Walks every block tree (MOS, volumes, doomed volumes), every defer list and the
//! blocks the intent logs hold, and compares the extents they reference with what the
//! allocator says is allocated.
use super::Pool;
use crate::dmu;
use crate::block::blkptr::BlockPointer;

impl Pool {
    /// zdb-style leak check: every allocated extent is referenced exactly once by the
    /// block trees (MOS + volumes) or waits on a defer list, and nothing referenced is
    /// free. Returns a description of the first mismatch.
    pub fn check_space_accounting(&self) -> std::result::Result<(), String> {
        let _g = self.inner.sync_lock.lock();
        let inner = &self.inner;
        let mut used: Vec<(crate::VdevId, u64, u64)> = Vec::new();
        let mut add_bp = |bp: &BlockPointer| {
            for d in bp.copies() {
                used.push((d.vdev, d.offset, d.asize as u64));
            }
        };
        let mos_root = inner.meta.lock().mos_root;
        if !mos_root.is_hole() {
            for bp in inner.mos_blocks_at(&mos_root, crate::vdev::IoClass::SyncRead).map_err(|e| e.to_string())? {
                add_bp(&bp);
            }
        }
        let mut log_blocks = Vec::new();
        for v in inner.volumes.read().values() {
            log_blocks.extend(v.zil.held_blocks());
            let root = *v.committed.read();
            dmu::walk_all(&inner.io, &root, crate::vdev::IoClass::SyncRead, &mut |bp, _| {
                add_bp(bp);
                Ok(())
            })
            .map_err(|e| format!("walking {}: {e}", v.name))?;
        }
        for d in inner.meta.lock().doomed.clone() {
            dmu::walk_all(&inner.io, &d, crate::vdev::IoClass::SyncRead, &mut |bp, _| {
                add_bp(bp);
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        }
        for d in inner.io.ms.deferred().into_iter().chain(log_blocks) {
            used.push((d.vdev, d.offset, d.asize as u64));
        }
        used.sort();
        for w in used.windows(2) {
            if w[0].0 == w[1].0 && w[0].1 + w[0].2 > w[1].1 {
                return Err(format!("double allocation: vdev {} {:#x}+{} overlaps {:#x}+{}", w[0].0, w[0].1, w[0].2, w[1].1, w[1].2));
            }
        }
        for (id, alloc) in inner.io.ms.extents() {
            let mut walked: Vec<(u64, u64)> = Vec::new();
            for &(_, off, len) in used.iter().filter(|u| u.0 == id) {
                match walked.last_mut() {
                    Some(l) if l.0 + l.1 == off => l.1 += len,
                    _ => walked.push((off, len)),
                }
            }
            if alloc != walked {
                let a_sum: u64 = alloc.iter().map(|x| x.1).sum();
                let w_sum: u64 = walked.iter().map(|x| x.1).sum();
                let first_diff = alloc.iter().zip(walked.iter()).find(|(x, y)| x != y);
                return Err(format!(
                    "vdev {id}: allocator has {} extents / {a_sum} bytes, trees reference {} extents / {w_sum} bytes; first difference {:?}",
                    alloc.len(),
                    walked.len(),
                    first_diff
                ));
            }
        }
        Ok(())
    }
}

/// zdb-like read access for tests and debugging tools: not a stable API.
impl Pool {
    #[doc(hidden)]
    pub fn debug_io(&self) -> &crate::zio::PoolIo {
        &self.inner.io
    }
    /// The committed (last synced) tree root of a volume.
    #[doc(hidden)]
    pub fn debug_volume_root(&self, volume: &str) -> Option<crate::dmu::TreeRoot> {
        self.inner.volumes.read().get(volume).map(|v| *v.committed.read())
    }
    #[doc(hidden)]
    pub fn debug_mos_blocks(&self) -> crate::Result<Vec<BlockPointer>> {
        let root = self.inner.meta.lock().mos_root;
        self.inner.mos_blocks_at(&root, crate::vdev::IoClass::SyncRead)
    }
    #[doc(hidden)]
    pub fn debug_mos_root(&self) -> BlockPointer {
        self.inner.meta.lock().mos_root
    }
    #[doc(hidden)]
    pub fn debug_leaves(&self) -> Vec<std::sync::Arc<crate::vdev::mirror::Leaf>> {
        self.inner.leaves.read().clone()
    }
}

impl Pool {
    /// (open, quiesced, syncing) txgs; 0 = none in that state.
    #[doc(hidden)]
    pub fn debug_txg_states(&self) -> (u64, u64, u64) {
        let (q, s) = self.inner.txg.active();
        (self.inner.txg.open_txg().get(), q.get(), s.get())
    }
}
