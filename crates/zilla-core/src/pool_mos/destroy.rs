//! A format 2 pool's destroys: a dataset leaves the namespace in one txg and its
//! objset joins the destroy queue (§18), which every txg works down by a bounded
//! number of block copies ([`ZFS_ASYNC_BLOCK_MAX_BLOCKS`]) until it is empty; the
//! queue object exists only while something is being destroyed.

use super::*;
use crate::dsl_destroy::{DestroyEntry, DestroyQueue};
use crate::kstat::{Applies, Tunable};

pub static ZFS_ASYNC_BLOCK_MAX_BLOCKS: Tunable = Tunable::new(
    "zfs_async_block_max_blocks",
    100_000,
    1,
    1 << 30,
    Applies::Live,
    "block copies a txg frees from destroyed datasets at most (the rest in later txgs)",
);

const QUEUE_ENTRY: &str = "destroy_queue";

impl PoolMos {
    fn destroy_queue<'a>(&'a self, io: &'a dyn BlockIo) -> Result<Option<DestroyQueue<'a>>> {
        let z = ObjectInTxg { objset: &self.os, io, txg: Txg::ZERO, object: DIRECTORY_OBJECT };
        Ok(zap::lookup_u64(&z, QUEUE_ENTRY.as_bytes())?.map(|object| DestroyQueue { mos: &self.os, io, object }))
    }

    /// Take the childless dataset directory `dir` out of the namespace in `txg` and
    /// queue its objset (`bytes`: what it holds, for `freeing`).
    pub fn destroy_dataset(&self, io: &dyn BlockIo, txg: Txg, dir: u64, bytes: u64) -> Result<()> {
        let ds = self.dsl(io).remove_leaf(txg, dir)?;
        if ds.objset_bp.is_hole() {
            return Ok(());
        }
        let q = match self.destroy_queue(io)? {
            Some(q) => q,
            None => {
                let q = DestroyQueue::create(&self.os, io, txg)?;
                put(&self.os, io, txg, DIRECTORY_OBJECT, QUEUE_ENTRY, q.object)?;
                q
            }
        };
        q.push(txg, &DestroyEntry::new(ds.objset_bp, bytes))
    }

    /// One txg's share of the queued destroys; the block copies freed. The queue object
    /// goes once it is done.
    pub fn step_destroys(&self, io: &dyn BlockIo, txg: Txg) -> Result<u64> {
        let Some(q) = self.destroy_queue(io)? else { return Ok(0) };
        let (freed, done) = q.step(io, txg, ZFS_ASYNC_BLOCK_MAX_BLOCKS.get())?;
        if done {
            self.os.free_object(io, txg, q.object)?;
            zap::remove(&mut ObjectInTxg { objset: &self.os, io, txg, object: DIRECTORY_OBJECT }, QUEUE_ENTRY.as_bytes())?;
        }
        Ok(freed)
    }

    /// Something is queued for destruction.
    pub fn destroys_pending(&self, io: &dyn BlockIo) -> Result<bool> {
        Ok(self.destroy_queue(io)?.is_some())
    }

    /// Bytes the queued destroys have still to free (`pool get freeing`).
    pub fn freeing_bytes(&self, io: &dyn BlockIo) -> Result<u64> {
        self.destroy_queue(io)?.map_or(Ok(0), |q| q.freeing_bytes())
    }
}
