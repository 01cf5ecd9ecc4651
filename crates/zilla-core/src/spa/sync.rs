//! spa sync: the txg commit protocol and the sync thread.
//!
//! Theory of operation
//! -------------------
//! spa_sync(T), the commit protocol (docs/design.md, crash analysis):
//!
//! ```text
//!  1. snapshot the allocator (restored if the sync fails, so nothing leaks)
//!  2. per volume: allocate + write T's dirty blocks, rewrite indirects (COW),
//!     old blocks -> defer[T]; destroyed volumes' trees -> defer[T]
//!  3. old MOS blocks -> defer[T]; defer lists of txg <= T-3 return to the free trees
//!  4. encode MOS (volumes, space maps, defer lists, scan state), write it
//!  5. flush every leaf                               <- data durable
//!  6. uberblock T into slot T%32 of all 4 labels of every leaf, flush   <- commit point
//!  7. publish new roots, drop T's dirty records, retire T's dirty bytes
//! ```
//! A crash before 6 completes on some device leaves uberblock T-1 the newest valid one;
//! every block T-1 references is intact because nothing it references was freed for

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::PoolInner;
use crate::dmu::{self, Mos, TreeRoot, VolumeState, WritePolicy};
use crate::vdev::label::Uberblock;
use crate::vdev::mirror::{Leaf, LeafState};
use crate::vdev::{label, Role};
use crate::zio::blkptr::{self, BlockPointer};
use crate::zio::checksum::ChecksumAlgo;
use crate::kstat::{Applies, Tunable};
use crate::{Error, Result};

pub static ZFS_DEBUG_FAIL_SYNC_ASSERTION: Tunable = Tunable::new(
    "zfs_debug_fail_sync_assertion",
    0,
    0,
    1,
    Applies::Live,
    "testing aid: 1 makes the next txg sync fail an assertion before it writes anything (exercises the broken-invariant policy: the daemon stops)",
);

/// Dirty blocks prepared and handed to the issuer at a time during a sync.
pub const SYNC_CHUNK_BLOCKS: usize = 512;
/// Prepared chunks that may wait for the issuer (bounds the sync's extra memory).
pub const SYNC_PIPELINE_CHUNKS: usize = 4;

/// Checksum and compress a txg's dirty blocks on all cores (order preserved).
fn prepare_parallel(
    recs: &[(u64, Option<Arc<[u8]>>)],
    algo: ChecksumAlgo,
    comp: crate::zio::compress::Compression,
) -> Vec<Option<crate::zio::PreparedBlock>> {
    let one = |d: &Option<Arc<[u8]>>| d.as_ref().map(|d| crate::zio::prepare(d, algo, comp));
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
    if cpus < 2 || recs.len() < 64 {
        return recs.iter().map(|(_, d)| one(d)).collect();
    }
    let chunk = recs.len().div_ceil(cpus);
    std::thread::scope(|s| {
        let handles: Vec<_> = recs.chunks(chunk).map(|c| s.spawn(move || c.iter().map(|(_, d)| one(d)).collect::<Vec<_>>())).collect();
        handles.into_iter().flat_map(|h| h.join().expect("prepare worker panicked")).collect()
    })
}

impl PoolInner {
    /// Leaves that carry uberblocks (normal + log classes).
    fn ub_leaves(&self) -> Vec<Arc<Leaf>> {
        self.tops().iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)).flat_map(|t| t.children()).collect()
    }


    fn write_uberblocks(&self, ub: &Uberblock) -> Result<()> {
        let leaves = self.ub_leaves();
        let ok = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for leaf in &leaves {
                if leaf.state() != LeafState::Online {
                    continue;
                }
                let ok = &ok;
                s.spawn(move || {
                    let dev = leaf.device();
                    let size = dev.size();
                    let mut good = true;
                    for l in 0..label::LABELS {
                        let off = label::ub_offset(size, l, ub.txg);
                        if leaf.queue.write(crate::vdev::IoClass::SyncWrite, &ub.encode(off), off).is_err() {
                            good = false;
                        }
                    }
                    if good && leaf.queue.flush().is_ok() {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        leaf.write_errors.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        if ok.load(Ordering::Relaxed) == 0 {
            return Err(Error::Io(std::io::Error::other("could not write the uberblock to any device")));
        }
        Ok(())
    }

    fn flush_all(&self) -> Result<()> {
        let tops = self.tops();
        let mut err = None;
        std::thread::scope(|s| {
            let hs: Vec<_> = tops.iter().filter(|t| t.role != Role::Cache && t.role != Role::Spare).map(|t| s.spawn(move || t.flush())).collect();
            for h in hs {
                if let Ok(Err(e)) = h.join() {
                    err = Some(e);
                }
            }
        });
        match err {
            Some(e) => Err(Error::Io(e)),
            None => Ok(()),
        }
    }

    pub fn has_dirty(&self, txg: u64) -> bool {
        if self.dirty.txg_dirty(txg) > 0 || self.meta.lock().changed {
            return true;
        }
        self.volumes.read().values().any(|v| v.dirty.has_dirty(txg))
    }

    /// Sync txg `txg`. On failure the allocator is restored and the dirty records stay.
    pub fn spa_sync(&self, txg: u64) -> Result<()> {
        assert!(
            ZFS_DEBUG_FAIL_SYNC_ASSERTION.get() == 0,
            "zfs_debug_fail_sync_assertion is set: txg {txg} of pool {} stops at a failed assertion",
            self.name
        );
        let _g = self.sync_lock.lock();
        // Frees of txg <= T-3 are reusable whether or not T commits (the trees of T-1
        // and T-2 never reference them), so release them outside the snapshot: a sync
        // retried after ENOSPC then sees that space.
        self.io.ms.lock().release_through(txg.saturating_sub(crate::metaslab::TXG_DEFER_SIZE + 1));
        let ms_snapshot = self.io.ms.lock().clone();
        let r = self.spa_sync_inner(txg);
        if r.is_err() {
            *self.io.ms.lock() = ms_snapshot;
        }
        self.io.refresh_space();
        match r {
            Ok(()) => {
                self.suspended.store(false, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.suspended.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn spa_sync_inner(&self, txg: u64) -> Result<()> {
        let threads = 8;
        let vols: Vec<Arc<VolumeState>> = self.volumes.read().values().cloned().collect();
        let mut batch = Vec::new();
        let mut new_roots: Vec<(Arc<VolumeState>, TreeRoot)> = Vec::new();
        // blocks written in this txg, cached in the ARC once the txg commits (a partial
        // overwrite of a recently written block then needs no device read)
        let mut written: Vec<(crate::arc::BlockKey, Arc<[u8]>)> = Vec::new();
        let (doomed, old_mos, next_id, scan_state) = {
            let m = self.meta.lock();
            (m.doomed.clone(), m.mos_root, m.next_volume_id, m.scan_state.clone())
        };
        // Pipeline: data blocks are checksummed and allocated in chunks; each chunk goes
        // to the issuer thread while the next one is prepared, and the indirect blocks
        // are rebuilt while the last chunks are still being written.
        let (tx, rx) = crossbeam_channel::bounded::<Vec<dmu::PendingWrite>>(SYNC_PIPELINE_CHUNKS);
        std::thread::scope(|s| -> Result<()> {
            let io = &self.io;
            let issuer = s.spawn(move || {
                let mut r = Ok(());
                for chunk in rx {
                    if r.is_ok() {
                        r = io.issue_writes(chunk, txg, threads);
                    }
                }
                r
            });
            let produced = (|| -> Result<()> {
                let mut trees = Vec::new();
                for v in &vols {
                    let recs = v.dirty.collect(txg);
                    let root = *v.committed.read();
                    if recs.is_empty() {
                        new_roots.push((v.clone(), root));
                        continue;
                    }
                    let props = v.props.read().typed();
                    let (algo, comp) = (props.checksum, props.compression);
                    let cache = props.primarycache == crate::props::CachePolicy::All;
                    let mut changes = Vec::with_capacity(recs.len());
                    for chunk in recs.chunks(SYNC_CHUNK_BLOCKS) {
                        // checksum and compress on every core, then allocate in blkid order
                        let prepared = prepare_parallel(chunk, algo, comp);
                        let mut chunk_batch = Vec::with_capacity(chunk.len());
                        for ((blkid, data), p) in chunk.iter().zip(prepared) {
                            let bp = match p {
                                Some(p) => self.io.alloc_prepared(p, txg, blkptr::KIND_DATA, 0, 1, 1, &mut chunk_batch)?,
                                None => BlockPointer::hole(),
                            };
                            if let (true, Some(d)) = (cache, data) {
                                written.push((crate::arc::BlockKey { vdev: bp.dva[0].vdev, offset: bp.dva[0].offset, birth: bp.birth }, d.clone()));
                            }
                            changes.push((*blkid, bp));
                        }
                        if tx.send(chunk_batch).is_err() {
                            break; // the issuer stopped on an error; it reports it
                        }
                    }
                    trees.push((v.clone(), root, changes, WritePolicy { algo, comp, txg }));
                }
                for (v, root, changes, pol) in &trees {
                    let nr = dmu::apply_changes(&self.io, root, changes, pol, &mut batch)?;
                    new_roots.push((v.clone(), nr));
                }
                // destroyed volumes
                for root in &doomed {
                    let mut bps = Vec::new();
                    dmu::walk_all(&self.io, root, crate::vdev::IoClass::AsyncRead, &mut |bp, _| {
                        bps.push(*bp);
                        Ok(())
                    })?;
                    for bp in bps {
                        self.io.free_block(&bp, txg);
                    }
                }
                Ok(())
            })();
            drop(tx);
            let issued = issuer.join().unwrap_or_else(|_| Err(Error::Corrupt("sync writer panicked".into())));
            produced?;
            issued
        })?;
        self.io.issue_writes(std::mem::take(&mut batch), txg, threads)?;
        // the MOS
        if !old_mos.is_hole() {
            for bp in dmu::mos_blocks(&self.io, &old_mos, crate::vdev::IoClass::AsyncRead)? {
                self.io.free_block(&bp, txg);
            }
        }
        let pool_props = serde_json::to_string(&self.config.lock().props).unwrap_or_default();
        let mos = Mos {
            txg,
            next_volume_id: next_id,
            volumes: new_roots.iter().map(|(v, r)| v.record(*r)).collect(),
            scan_state,
            pool_props,
        };
        let blob = {
            let ms = self.io.ms.lock();
            mos.encode(&ms)
        };
        let mos_root = dmu::write_mos(&self.io, &blob, txg, &mut batch)?;
        self.io.issue_writes(batch, txg, threads)?;
        self.flush_all()?;
        let ub = Uberblock {
            txg,
            guid_sum: self.config.lock().guid_sum(),
            timestamp_ns: self.env.unix_time_ns(),
            pool_guid: self.guid,
            root: mos_root,
        };
        self.write_uberblocks(&ub)?;
        // committed: publish. ARC entries only now: a failed sync is retried with new
        // allocations, and a key (vdev, offset, birth) must never name other content.
        for (k, d) in written {
            self.io.arc.insert(k, d, crate::arc::BufKind::Data);
        }
        for (v, r) in &new_roots {
            *v.committed.write() = *r;
            v.dirty.retire(txg);
        }
        {
            let mut m = self.meta.lock();
            m.mos_root = mos_root;
            m.doomed.retain(|d| !doomed.contains(d));
            m.changed = false;
        }
        self.dirty.retire(txg);
        Ok(())
    }

    /// The sync thread body.
    pub fn sync_loop(self: &Arc<Self>) {
        loop {
            let kick = |open: u64| self.dirty.should_kick(open);
            let has = |open: u64| self.has_dirty(open);
            let Some(txg) = self.txg.wait_for_work(&kick, &has) else { return };
            if self.abandoned.load(Ordering::Acquire) {
                return;
            }
            let mut backoff_ms = 10;
            loop {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spa_sync(txg)));
                let r = match r {
                    Ok(r) => r,
                    Err(p) => {
                        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                        tracing::error!(pool = %self.name, txg, "txg sync panicked, pool suspended: {msg}");
                        self.suspended.store(true, Ordering::Relaxed);
                        self.txg.mark_fatal(format!("txg {txg}: {msg}"));
                        return;
                    }
                };
                match r {
                    Ok(()) => {
                        self.txg.mark_synced(txg);
                        break;
                    }
                    Err(e) => {
                        tracing::error!(pool = %self.name, txg, "txg sync failed, pool suspended, retrying: {e}");
                        self.txg.mark_sync_failed(e.to_string());
                        if self.abandoned.load(Ordering::Acquire) || (self.txg.is_shutting_down() && backoff_ms >= 1000) {
                            return;
                        }
                        self.env.sleep_ns(backoff_ms * 1_000_000);
                        backoff_ms = (backoff_ms * 2).min(1000);
                    }
                }
            }
        }
    }
}
