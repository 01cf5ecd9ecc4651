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
//!  3. old MOS blocks -> defer[T]
//!  4. encode MOS (volumes, space maps, defer lists, scan state), write it
//!  5. flush every leaf                               <- data durable
//!  6. uberblock T into slot T%32 of all 4 labels of every leaf, flush   <- commit point
//!  7. publish new roots, drop T's dirty records, retire T's dirty bytes;
//!     defer lists of txg <= T-2 return to the free trees
//! ```
//! A crash before 6 completes on some device leaves uberblock T-1 the newest valid one;
//! every block T-1 references is intact because nothing it references was freed for
//! reuse: the frees released so far are of txgs <= T-3, and a block freed in F is
//! referenced only by trees older than F. Step 7's release keeps the same window for
//! the newest uberblock, T: the trees of T, T-1 and T-2 stay intact.
//!
//! Idle. A txg with nothing dirty is not synced, with one exception: while a change's
//! frees wait out the defer window (metaslab.rs, "Awaited frees"), `has_dirty` says
//! yes, so an idle pool syncs empty txgs at the `zfs_txg_timeout` pace until they are
//! released (two txgs after the one that freed them), then stays idle.

use crate::vdev::abd::AlignedBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::PoolInner;
use crate::dmu::{self, Mos, TreeRoot, VolumeState, WritePolicy};
use crate::vdev::label::Uberblock;
use crate::vdev::mirror::{Leaf, LeafState};
use crate::vdev::{label, Role};
use crate::block::blkptr::{self, BlockPointer};
use crate::kstat::{Applies, Tunable};
use crate::{Error, Result, Txg};

pub static ZFS_DEBUG_FAIL_SYNC_ASSERTION: Tunable = Tunable::new(
    "zfs_debug_fail_sync_assertion",
    0,
    0,
    1,
    Applies::Live,
    "testing aid: 1 makes the next txg sync fail an assertion before it writes anything (exercises the broken-invariant policy: the daemon stops)",
);

/// How often a sync rewrites its txg because a device failed while it was written,
/// before it gives up (the pool then suspends and retries with backoff).
pub const SYNC_HEALTH_RETRIES: u32 = 5;

/// Why one attempt at syncing a txg failed.
#[derive(Debug)]
enum SyncError {
    /// A leaf's DTL or state changed after the MOS was encoded: write the txg again.
    HealthChanged(String),
    Failed(Error),
}

impl From<Error> for SyncError {
    fn from(e: Error) -> Self {
        SyncError::Failed(e)
    }
}

/// Which leaves' health differs, for the log.
fn health_diff(before: &[dmu::LeafHealth], after: &[dmu::LeafHealth]) -> String {
    after
        .iter()
        .filter(|a| !before.contains(a))
        .map(|a| format!("leaf {:016x} dtl [{}]{}", a.guid.get(), crate::vdev::mirror::ranges_text(&a.dtl), if a.faulted { " faulted" } else { "" }))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a txg's data pass shares: the bounded writer; the ARC reservation for the
/// buffers it has written and holds until the commit (arc.rs, "Reservations": what
/// stops counting as dirty is reserved there); the blocks written, cached in the ARC
/// once the txg commits (a partial overwrite of a recently written block then needs no
/// device read).
struct DataPass<'a> {
    txg: Txg,
    writer: crate::zio::SyncWriter<'a>,
    reservation: crate::arc::ArcReservation<'a>,
    /// With the hint each is cached under (its volume's `secondarycache`).
    written: Vec<(dmu::WrittenBlock, crate::arc::CacheHint)>,
}

/// One volume's part of a txg: its committed root, its changed block pointers, and
/// how its indirect blocks are written.
type VolumeChanges = (Arc<VolumeState>, TreeRoot, Vec<(crate::BlockId, BlockPointer)>, WritePolicy);

/// When each phase of one sync ended (ms since it began): data issued, indirect blocks
/// built, everything written, MOS written and flushed, uberblock committed, published.
/// Logged at debug level (`RUST_LOG=zilla::txg=debug`), for profiling a pool's syncs.
struct SyncPhases {
    start: std::time::Instant,
    ends_ms: Vec<u64>,
}

impl SyncPhases {
    fn start() -> SyncPhases {
        SyncPhases { start: std::time::Instant::now(), ends_ms: Vec::with_capacity(6) }
    }
    fn mark(&mut self) {
        self.ends_ms.push(self.start.elapsed().as_millis() as u64);
    }
    fn log(&self, txg: Txg) {
        let e = |i: usize| self.ends_ms.get(i).copied().unwrap_or(0);
        tracing::debug!(target: "zilla::txg", txg = txg.get(), data_issued_ms = e(0), indirects_ms = e(1),
            written_ms = e(2), mos_flushed_ms = e(3), uberblock_ms = e(4), published_ms = e(5), "txg synced");
    }
}

/// Dirty blocks prepared, allocated and handed to the writer at a time during a sync.
pub const SYNC_CHUNK_BLOCKS: usize = 512;

impl PoolInner {
    /// Leaves that carry uberblocks (normal + log classes).
    /// The ashift of the top-level vdev holding leaf `guid` (its label slot size).
    pub(super) fn leaf_ashift(&self, guid: crate::Guid) -> u8 {
        self.tops().iter().find(|t| t.children().iter().any(|c| c.guid == guid)).map_or(label::MIN_ASHIFT, |t| t.ashift)
    }

    fn ub_leaves(&self) -> Vec<Arc<Leaf>> {
        self.tops().iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)).flat_map(|t| t.children()).collect()
    }


    /// Uberblock `ub` into its slot of all four labels of every online leaf, then a
    /// flush, all leaves at once: per leaf four write requests and a flush request,
    /// which its queue issues only after those writes completed. Ok if at least one leaf
    /// wrote all four and flushed. A leaf whose flush fails here gets what it may have
    /// dropped in its DTL (recorded by the next txg's MOS; its data of this txg was
    /// flushed by `flush_all` already).
    pub(super) fn write_uberblocks(&self, ub: &Uberblock) -> Result<()> {
        use crate::vdev::queue::IoRequest;
        use crate::vdev::IoClass;
        let leaves: Vec<Arc<Leaf>> = self.ub_leaves().into_iter().filter(|l| l.state() == LeafState::Online).collect();
        let (tx, rx) = crossbeam_channel::unbounded::<(usize, bool)>();
        for (i, leaf) in leaves.iter().enumerate() {
            let size = leaf.device().size();
            for l in 0..label::LABELS {
                let ashift = self.leaf_ashift(leaf.guid);
                let off = label::ub_offset_at(size, l, ub.txg, ashift);
                let buf = Arc::new(crate::vdev::abd::AlignedBuf::copy_of(&ub.encode_slot(off, label::ub_slot_size(ashift))));
                let tx = tx.clone();
                leaf.queue.submit(IoRequest::write(IoClass::SyncWrite, off, buf, Box::new(move |d| {
                    let _ = tx.send((i, d.result.is_ok()));
                })));
            }
            let tx = tx.clone();
            leaf.submit_flush(false, move |result, _| {
                let _ = tx.send((i, result.is_ok()));
            });
        }
        drop(tx);
        let mut good = vec![true; leaves.len()];
        for (i, ok) in rx.iter() {
            good[i] &= ok;
        }
        for (leaf, _) in leaves.iter().zip(&good).filter(|(_, g)| !**g) {
            leaf.write_errors.fetch_add(1, Ordering::Relaxed);
        }
        if !good.iter().any(|g| *g) {
            return Err(Error::Io(std::io::Error::other("could not write the uberblock to any device")));
        }
        Ok(())
    }

    /// Every leaf's health as the MOS records it: DTL and faulted state.
    pub(crate) fn leaf_health(&self) -> Vec<dmu::LeafHealth> {
        self.leaves
            .read()
            .iter()
            .map(|l| dmu::LeafHealth { guid: l.guid, faulted: l.state() == LeafState::Faulted, dtl: l.dtl() })
            .collect()
    }

    /// Some readable leaf has DTL entries in `now` that `before` lacked: it missed
    /// writes (a failed write or flush) while staying online, so a resilver should
    /// copy them to it.
    fn dtl_grew_on_readable_leaf(&self, before: &[dmu::LeafHealth], now: &[dmu::LeafHealth]) -> bool {
        let leaves = self.leaves.read();
        now.iter().any(|h| {
            let readable = leaves.iter().any(|l| l.guid == h.guid && l.readable());
            let old = before.iter().find(|b| b.guid == h.guid).map(|b| b.dtl.clone()).unwrap_or_default();
            readable && !crate::vdev::mirror::range_subtract(&h.dtl, &old).is_empty()
        })
    }

    /// Write txg `txg`'s uberblock (MOS at `root`) everywhere; it is then the newest.
    fn commit_uberblock(&self, txg: crate::Txg, root: BlockPointer) -> Result<()> {
        let ub = Uberblock {
            txg,
            guid_sum: self.config.lock().guid_sum(),
            timestamp_ns: self.env.unix_time_ns(),
            pool_guid: self.guid,
            root,
            heartbeat: None,
        };
        self.write_uberblocks(&ub)?;
        *self.last_ub.lock() = Some(ub);
        Ok(())
    }

    /// Flush every data-holding top-level vdev, all at once (one flush request per
    /// child). Fails if some top-level vdev has no child that holds everything written
    /// to it since its last flush (see `TopVdev::flush_async`). Log vdevs are flushed
    /// but cannot fail the sync: no txg's blocks are on them (the intent log flushes
    /// its own blocks before a commit returns), and a pool imported with its log
    /// devices missing (`import -m`) must still sync.
    fn flush_all(&self) -> Result<()> {
        let tops: Vec<_> = self.tops().into_iter().filter(|t| t.role != Role::Cache && t.role != Role::Spare).collect();
        let (tx, rx) = crossbeam_channel::unbounded();
        for t in &tops {
            let tx = tx.clone();
            let log = t.role == Role::Log;
            t.flush_async(Box::new(move |o| {
                let _ = tx.send((log, o));
            }));
        }
        drop(tx);
        let mut err = None;
        for (log, o) in rx.iter() {
            if o.written == 0 && !log {
                let e = o.failed.into_iter().next().map(|(_, e)| e.to_io()).unwrap_or_else(|| std::io::Error::other("no writable device"));
                err = Some(e);
            }
        }
        match err {
            Some(e) => Err(Error::Io(e)),
            None => Ok(()),
        }
    }

    pub fn has_dirty(&self, txg: Txg) -> bool {
        if self.dirty.txg_dirty(txg) > 0 || self.meta.lock().changed {
            return true;
        }
        // a DTL or fault not yet in the MOS
        if self.leaf_health() != self.meta.lock().health {
            return true;
        }
        // frees that come back only with more txgs (see "Idle")
        if self.io.ms.frees_awaited() {
            return true;
        }
        // a format 2 pool's destroy queue is worked down txg by txg
        if self.meta.lock().format2.as_ref().is_some_and(|f| f.destroying()) {
            return true;
        }
        self.volumes.read().values().any(|v| v.dirty.has_dirty(txg) || v.zil.needs_header_sync())
    }

    /// Sync txg `txg`. On failure exactly this sync's allocations and deferred frees are
    /// undone (nothing allocated meanwhile outside the sync) and the dirty records stay.
    pub fn spa_sync(&self, txg: Txg) -> Result<()> {
        assert!(
            ZFS_DEBUG_FAIL_SYNC_ASSERTION.get() == 0,
            "zfs_debug_fail_sync_assertion is set: txg {txg} of pool {} stops at a failed assertion",
            self.name
        );
        let _g = self.sync_lock.lock();
        self.dirty.begin_sync();
        // The leaves' async-write max_active follows this pool's dirty data (a leaf
        // attached since the last sync gets the gauge here, before its first sync write).
        self.publish_dirty_gauge();
        // Frees of txg <= T-3 are reusable whether or not T commits (the trees of T-1
        // and T-2 never reference them), so release them outside the undo list: a sync
        // retried after ENOSPC then sees that space. (Step 7 of the previous sync
        // released them already; after an import this is the first release.)
        // Format 2 takes T - 2's frees out of the defer lists now, records them in T's
        // space maps, and frees them in the allocator once T commits (spa/format2.rs).
        let f2 = self.meta.lock().format2.clone();
        match &f2 {
            None => self.release_frees(txg.minus(crate::metaslab::TXG_DEFER_SIZE + 1)),
            Some(f) => {
                f.take_released(&self.io.ms, txg.minus(crate::metaslab::TXG_DEFER_SIZE));
            }
        }
        // a manual trim's step, at the same place and for the same reason (spa/trim.rs)
        self.manual_trim_step(txg);
        let (r, released) = self.sync_attempts(txg, f2.as_deref());
        if r.is_ok() {
            // Step 7's release: T is the newest uberblock, and no tree of T, T-1 or T-2
            // references a block freed in T-2 or before. Released now rather than at the
            // next sync's start, so that space is back (FREE, admission) even if no
            // further txg syncs soon.
            match &f2 {
                None => self.release_frees(txg.minus(crate::metaslab::TXG_DEFER_SIZE)),
                Some(_) => self.free_released(released),
            }
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

    /// Sync `txg`, writing it again while a device fails during its writes (at most
    /// [`SYNC_HEALTH_RETRIES`] attempts), each failed attempt undone; a format 2 pool's
    /// released frees its committed attempt recorded.
    fn sync_attempts(&self, txg: Txg, f2: Option<&super::format2::Format2>) -> (Result<()>, Vec<crate::block::blkptr::Dva>) {
        let mut attempt = 0;
        let mut released = Vec::new();
        let r = loop {
            self.io.ms.begin_sync(txg);
            if let Some(f) = f2 {
                f.sync_begin(txg);
            }
            let r = self.spa_sync_inner(txg);
            match (&r, f2) {
                (Ok(()), None) => self.io.ms.end_sync(txg),
                (Ok(()), Some(f)) => {
                    released = f.sync_end(txg);
                    self.io.ms.end_sync(txg);
                }
                (Err(_), None) => self.io.ms.undo_sync(txg),
                (Err(_), Some(f)) => {
                    f.sync_abort(txg, &self.io.ms);
                    self.io.ms.undo_sync(txg);
                }
            }
            attempt += 1;
            match r {
                Err(SyncError::HealthChanged(why)) if attempt < SYNC_HEALTH_RETRIES => {
                    tracing::warn!(pool = %self.name, txg = txg.get(), attempt, "rewriting txg: {why}");
                }
                Err(SyncError::HealthChanged(why)) => break Err(Error::Io(std::io::Error::other(why))),
                Err(SyncError::Failed(e)) => break Err(e),
                Ok(()) => break Ok(()),
            }
        };
        (r, released)
    }

    /// Return the frees of txgs <= `through` to the free trees; with `autotrim=on`,
    /// discard them first (see `vdev::trim`: nothing can allocate them until the
    /// discards completed).
    fn release_frees(&self, through: Txg) {
        self.free_released(self.io.ms.take_released(through));
    }

    /// Return `released` (taken from the defer lists) to the free trees, trimmed first
    /// with `autotrim=on`.
    fn free_released(&self, released: Vec<crate::block::blkptr::Dva>) {
        if !released.is_empty() && self.autotrim() {
            use crate::vdev::trim;
            let (min, max) = trim::extent_bounds();
            let (plan, skipped) = trim::plan(&released, min, max);
            self.trim_stats.skipped_bytes.fetch_add(skipped, Ordering::Relaxed);
            for (vdev, extents) in plan {
                if let Some(top) = self.io.top(vdev) {
                    trim::trim_top(&top, &extents, trim::ZFS_TRIM_QUEUE_LIMIT.get() as usize, &self.trim_stats, "autotrim");
                }
            }
        }
        self.io.ms.free_released(&released);
    }

    fn publish_dirty_gauge(&self) {
        self.dirty.gauge().set(self.dirty.total(), crate::dsl_pool::dirty_data_max());
        for leaf in self.leaves.read().iter() {
            leaf.queue.set_dirty_gauge(self.dirty.gauge());
        }
    }

    /// Steps 2-7 of the commit protocol.
    /// A data device that takes no writes (offline, missing, faulted) misses `txg`
    /// whatever the txg writes (at least the MOS): in its DTL before the MOS's leaf
    /// health is taken, so the txg is not written twice to record it.
    fn note_unwritable_leaves(&self, txg: Txg) {
        for top in self.tops().iter().filter(|t| t.role == crate::vdev::Role::Normal) {
            top.children().iter().filter(|c| !c.readable()).for_each(|c| c.dtl_add(txg));
        }
    }

    fn spa_sync_inner(&self, txg: Txg) -> std::result::Result<(), SyncError> {
        self.rewrite_stale_labels().map_err(SyncError::Failed)?;
        self.note_unwritable_leaves(txg);
        let mut phases = SyncPhases::start();
        let vols: Vec<Arc<VolumeState>> = self.volumes.read().values().cloned().collect();
        let mut batch = Vec::new();
        let mut new_roots: Vec<(Arc<VolumeState>, TreeRoot)> = Vec::new();
        let (doomed, old_mos, next_id, scan_state, history) = {
            let m = self.meta.lock();
            (m.doomed.clone(), m.mos_root, m.next_volume_id, m.scan_state.clone(), m.history.clone())
        };
        // Pipeline: data blocks are checksummed (pool workers) and allocated in chunks, each
        // chunk's writes submitted without waiting while the next is prepared; indirect
        // blocks are rebuilt while the last chunks are still being written.
        let mut pass = DataPass { txg, writer: crate::zio::SyncWriter::new(&self.io, txg), reservation: self.io.arc_reservation(), written: Vec::new() };
        let trees = self.sync_volumes(&vols, &mut pass, &mut new_roots)?;
        phases.mark();
        let indirects = self.rebuild_trees(&trees, &mut batch, &mut new_roots)?;
        let f2 = self.meta.lock().format2.clone();
        if f2.is_none() {
            // format 2 queues a destroyed volume's objset instead (pool_mos/destroy.rs)
            self.free_doomed(&doomed, txg)?;
        }
        let DataPass { writer, reservation, written, .. } = pass;
        phases.mark();
        writer.issue(std::mem::take(&mut batch))?;
        writer.finish()?;
        phases.mark();
        let mos_frees = if f2.is_none() { self.free_old_mos(&old_mos, txg)? } else { 0 };
        let (zil_headers, zil_tokens) = self.zil_headers_for_sync(&new_roots, txg);
        // format 2: what the txg frees before its MOS (which frees its own older blocks)
        let data_frees = self.io.ms.deferred_count(txg);
        let pool_props = serde_json::to_string(&self.config.lock().props).unwrap_or_default();
        let (mos_root, health) = self.write_mos_and_flush(txg, f2.as_deref(), &old_mos, Mos {
            txg,
            next_volume_id: next_id,
            volumes: new_roots.iter().map(|(v, r)| v.record(*r)).collect(),
            scan_state,
            pool_props,
            leaf_health: None,
            zil_headers,
            history,
        }, &mut batch)?;
        phases.mark();
        self.commit_uberblock(txg, mos_root)?;
        if (f2.is_none() && self.io.ms.deferred_count(txg) > mos_frees) || (f2.is_some() && data_frees > 0) {
            // this txg freed more than its old MOS: the pool syncs until that is back
            self.io.ms.await_release(txg);
        }
        phases.mark();
        // committed: publish. ARC entries only now: a failed sync is retried with new
        // allocations, and a key (vdev, offset, birth) must never name other content.
        drop(reservation);
        self.cache_written(written, indirects);
        for (v, r) in &new_roots {
            *v.committed.write() = *r;
            v.dirty.retire(txg);
            v.space.synced(txg, r.bp.fill * v.volblocksize as u64);
        }
        for (v, tok) in zil_tokens {
            v.zil.synced(tok);
        }
        self.publish_metadata(txg, mos_root, health, &doomed);
        phases.mark();
        phases.log(txg);
        Ok(())
    }

    /// Each changed volume's indirect blocks rewritten (COW) into `batch`, its new root
    /// in `new_roots`; the indirect blocks written, with the hint each is cached under.
    fn rebuild_trees(&self, trees: &[VolumeChanges], batch: &mut Vec<crate::zio::PendingWrite>, new_roots: &mut Vec<(Arc<VolumeState>, TreeRoot)>) -> Result<Vec<(dmu::WrittenBlock, crate::arc::CacheHint)>> {
        let mut indirects = Vec::new();
        for (v, root, changes, pol) in trees {
            let mut written = Vec::new();
            let nr = dmu::apply_changes(&self.io, root, changes, pol, batch, &mut written)?;
            // a volume's indirect blocks go to a cache device unless secondarycache=none
            let l2_eligible = v.props.typed().secondarycache != crate::props::CachePolicy::None;
            let hint = crate::arc::CacheHint { l2_eligible, ..crate::arc::CacheHint::METADATA };
            indirects.extend(written.into_iter().map(|w| (w, hint)));
            new_roots.push((v.clone(), nr));
        }
        Ok(indirects)
    }

    /// The intent logs in txg `txg`: each volume's header, and the log blocks the txg
    /// makes obsolete freed (deferred); the tokens retire them once it commits.
    #[allow(clippy::type_complexity)]
    fn zil_headers_for_sync(&self, vols: &[(Arc<VolumeState>, TreeRoot)], txg: Txg) -> (Vec<(u64, crate::zil::ZilHeader)>, Vec<(Arc<VolumeState>, crate::zil::SyncToken)>) {
        let io = &self.io;
        let mut headers = Vec::with_capacity(vols.len());
        let mut tokens = Vec::with_capacity(vols.len());
        for (v, _) in vols {
            let (h, tok) = v.zil.header_for_sync(io, txg, &mut |d| io.ms.free_deferred(txg, d));
            headers.push((v.id, h));
            tokens.push((v.clone(), tok));
        }
        (headers, tokens)
    }

    /// Step 7's pool-wide half: the new MOS root and leaf health, the destroyed trees
    /// that are freed now, and the txg's space estimates retired. The allocator's space
    /// is refreshed before the estimates it replaces are retired: space admission sees
    /// this txg's allocations in one of the two at every moment (else it would admit
    /// into them).
    fn publish_metadata(&self, txg: Txg, mos_root: BlockPointer, health: Vec<dmu::LeafHealth>, doomed: &[TreeRoot]) {
        self.io.refresh_space();
        self.dirty.doomed_freed(doomed.iter().map(|r| r.free_cost_bytes()).sum());
        {
            let mut m = self.meta.lock();
            m.mos_root = mos_root;
            if self.dtl_grew_on_readable_leaf(&m.health, &health) {
                self.resilver_wanted.store(true, Ordering::Release);
            }
            m.health = health;
            m.doomed.retain(|d| !doomed.contains(d));
            m.changed = false;
        }
        self.dirty.retire(txg);
    }

    /// Step 4-5: encode the MOS with the leaves' health as it is now (the txg's data
    /// writes have completed, so the DTL entries they caused are in it), write it,
    /// flush every leaf. A child that failed a write or flush after the MOS was
    /// encoded missed (part of) this txg and the MOS does not say so: committing would
    /// let a power cut forget it, so the txg is written again.
    /// A format 2 pool (`f2`) writes its MOS objset instead, replacing `old_mos`.
    fn write_mos_and_flush(&self, txg: Txg, f2: Option<&super::format2::Format2>, old_mos: &BlockPointer, mut mos: Mos, batch: &mut Vec<crate::zio::PendingWrite>) -> std::result::Result<(BlockPointer, Vec<dmu::LeafHealth>), SyncError> {
        let health = self.leaf_health();
        mos.leaf_health = Some(health.clone());
        let mos_root = match f2 {
            None => {
                let blob = mos.encode(&self.io.ms);
                self.dirty.note_mos_bytes(blob.len() as u64);
                dmu::write_mos(&self.io, &blob, txg, batch)?
            }
            Some(f) => {
                let bio = dmu::pool_block_io::PoolBlockIo::new(&self.io, txg, crate::vdev::IoClass::AsyncRead);
                let root = f.sync_txg(&bio, &self.io, txg, &mos, old_mos)?;
                let writes = bio.take_batch();
                self.dirty.note_mos_bytes(writes.iter().map(|w| w.data.len() as u64).sum());
                batch.extend(writes);
                root
            }
        };
        self.io.issue_writes(std::mem::take(batch), txg)?;
        self.flush_all()?;
        let now = self.leaf_health();
        if now != health {
            return Err(SyncError::HealthChanged(format!("txg {txg}: a device failed while the txg was written: {}", health_diff(&health, &now))));
        }
        Ok((mos_root, health))
    }

    /// Step 3: free the blocks of the MOS that `txg` replaces; returns how many
    /// deferred frees that made (block copies).
    fn free_old_mos(&self, old_mos: &BlockPointer, txg: Txg) -> Result<usize> {
        if old_mos.is_hole() {
            return Ok(0);
        }
        let before = self.io.ms.deferred_count(txg);
        for bp in dmu::mos_blocks(&self.io, old_mos, crate::vdev::IoClass::AsyncRead)? {
            self.io.free_block(&bp, txg);
        }
        Ok(self.io.ms.deferred_count(txg) - before)
    }

    /// Free every block of the destroyed volumes' trees in `txg`.
    fn free_doomed(&self, doomed: &[TreeRoot], txg: Txg) -> Result<()> {
        for root in doomed {
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
    }

    /// Prepare, allocate and submit one volume's dirty data blocks of `txg`; returns the
    /// Put the data blocks and indirect blocks a committed txg wrote into the ARC.
    fn cache_written(&self, data: Vec<(dmu::WrittenBlock, crate::arc::CacheHint)>, indirects: Vec<(dmu::WrittenBlock, crate::arc::CacheHint)>) {
        for ((k, d), hint) in data.into_iter().chain(indirects) {
            self.io.cache(k, d, hint);
        }
    }

    /// L0 changes (blkid, new bp) for the tree rewrite, sorted. A block a commit wrote
    /// in place for the very dirty version being synced (`overrides`, dmu_sync) is
    /// not written again: its block pointer is used (the dirty record's override);
    /// the overrides not used are freed in `txg`.
    /// Step 2's data pass over every volume: collect each one's dirty blocks of the
    /// txg and hand them to the writer; a volume with none keeps its root (and frees
    /// the dmu_sync blocks nobody used). Returns what `apply_changes` needs per volume.
    fn sync_volumes(
        &self,
        vols: &[Arc<VolumeState>],
        pass: &mut DataPass<'_>,
        new_roots: &mut Vec<(Arc<VolumeState>, TreeRoot)>,
    ) -> Result<Vec<VolumeChanges>> {
        let txg = pass.txg;
        let mut trees = Vec::new();
        for v in vols {
            let overrides = v.zil.overrides_for_sync(txg); // first: waits for dmu_syncs of txg
            let recs = v.dirty.collect(txg);
            let root = *v.committed.read();
            if recs.is_empty() {
                crate::zil::Zilog::free_unused_overrides(&self.io, &overrides, &vec![false; overrides.len()], txg);
                new_roots.push((v.clone(), root));
                continue;
            }
            let changes = self.sync_volume_data(v, &recs, &overrides, pass)?;
            let props = v.props.typed();
            let cache_metadata = props.primarycache != crate::props::CachePolicy::None;
            let l2_eligible = props.secondarycache != crate::props::CachePolicy::None;
            let read_hint = crate::arc::CacheHint { l2_eligible, ..crate::arc::CacheHint::METADATA };
            trees.push((v.clone(), root, changes, WritePolicy { algo: props.checksum, comp: props.compression, txg, cache_metadata, read_hint }));
        }
        Ok(trees)
    }

    fn sync_volume_data(
        &self,
        v: &VolumeState,
        recs: &[(crate::BlockId, Option<Arc<AlignedBuf>>)],
        overrides: &[crate::zil::DmuSynced],
        pass: &mut DataPass<'_>,
    ) -> Result<Vec<(crate::BlockId, BlockPointer)>> {
        let txg = pass.txg;
        let props = v.props.typed();
        let (algo, comp) = (props.checksum, props.compression);
        let cache = props.primarycache == crate::props::CachePolicy::All;
        // a written data block may go to a cache device only with secondarycache=all
        let hint = crate::arc::CacheHint { l2_eligible: props.secondarycache == crate::props::CachePolicy::All, ..crate::arc::CacheHint::DATA };
        let workers = self.io.prepare_workers(&self.env, &self.name);
        let mut changes = Vec::with_capacity(recs.len());
        let (overridden, rest) = Self::take_overrides(recs, overrides, txg, &self.io);
        if !overridden.is_empty() {
            for (blkid, data, bp) in &overridden {
                if cache {
                    pass.written.push(((crate::arc::BlockKey::of(&bp), data.clone()), hint));
                }
                changes.push((*blkid, *bp));
            }
            self.dirty.undirty(txg, pass.reservation.take_up_to(overridden.len() as u64 * v.volblocksize as u64));
        }
        let recs: &[(crate::BlockId, Option<Arc<AlignedBuf>>)] = rest.as_deref().unwrap_or(recs);
        for chunk in recs.chunks(SYNC_CHUNK_BLOCKS) {
            let prepared = workers.prepare_all(chunk, algo, comp, self.io.alloc_unit());
            let mut chunk_batch = Vec::with_capacity(chunk.len());
            for ((blkid, data), p) in chunk.iter().zip(prepared) {
                let bp = match p {
                    Some(p) => self.io.alloc_prepared(p, txg, blkptr::KIND_DATA, 0, 1, 1, &mut chunk_batch)?,
                    None => BlockPointer::hole(),
                };
                if let (true, Some(d)) = (cache, data) {
                    pass.written.push(((crate::arc::BlockKey::of(&bp), d.clone()), hint));
                }
                changes.push((*blkid, bp));
            }
            pass.writer.issue(chunk_batch)?;
            // counted as zvol counted them: a block's size, 512 bytes for a free
            let bs = v.volblocksize as u64;
            let issued = chunk.iter().map(|(_, d)| if d.is_some() { bs } else { 512 }).sum();
            self.dirty.undirty(txg, pass.reservation.take_up_to(issued));
        }
        if !overridden.is_empty() {
            changes.sort_by_key(|c| c.0);
        }
        Ok(changes)
    }

    /// Split `recs` into the blocks whose dmu_sync'ed override the sync uses (blkid,
    /// data, bp) and the rest (`None`: all of them, nothing overridden); frees the
    /// overrides not used in `txg`.
    #[allow(clippy::type_complexity)]
    fn take_overrides(
        recs: &[(crate::BlockId, Option<Arc<AlignedBuf>>)],
        overrides: &[crate::zil::DmuSynced],
        txg: Txg,
        io: &crate::zio::PoolIo,
    ) -> (Vec<(crate::BlockId, Arc<AlignedBuf>, BlockPointer)>, Option<Vec<(crate::BlockId, Option<Arc<AlignedBuf>>)>>) {
        if overrides.is_empty() {
            return (Vec::new(), None);
        }
        let mut by_blkid: std::collections::HashMap<crate::BlockId, Vec<usize>> = std::collections::HashMap::new();
        for (i, o) in overrides.iter().enumerate() {
            by_blkid.entry(o.blkid).or_default().push(i);
        }
        let mut used = vec![false; overrides.len()];
        let mut overridden = Vec::new();
        let mut rest = Vec::with_capacity(recs.len());
        for (blkid, data) in recs {
            let hit = data.as_ref().and_then(|d| by_blkid.get(blkid)?.iter().copied().find(|&i| overrides[i].txg == txg && overrides[i].matches(*blkid, d)));
            match (hit, data) {
                (Some(i), Some(d)) => {
                    used[i] = true;
                    overridden.push((*blkid, d.clone(), overrides[i].bp));
                }
                _ => rest.push((*blkid, data.clone())),
            }
        }
        crate::zil::Zilog::free_unused_overrides(io, overrides, &used, txg);
        (overridden, Some(rest))
    }

    /// The quiesce thread body: closes the open txg when the sync thread or a dirty kick
    /// asks, waits for its holders, hands it to the sync thread.
    pub(super) fn quiesce_loop(self: &Arc<Self>) {
        while self.txg.quiesce_next().is_some() {}
    }

    /// The sync thread body: syncs quiesced txgs in order, retrying a failed one.
    /// `unfinished`: a txg a previous sync thread failed to sync, synced first.
    pub(super) fn sync_loop(self: &Arc<Self>, unfinished: Option<Txg>) {
        let kick = |open: Txg| self.dirty.should_kick(open);
        let has = |open: Txg| self.has_dirty(open);
        if let Some(txg) = unfinished {
            if !self.sync_until_done(txg) {
                self.txg.sync_thread_exited();
                return;
            }
        }
        while let Some(txg) = self.txg.wait_for_sync_work(&kick, &has) {
            if self.abandoned.load(Ordering::Acquire) || !self.sync_until_done(txg) {
                break;
            }
            // (a running resilver takes new DTL entries in its next pass; one that
            // finished meanwhile may have copied them already)
            let missing = || self.leaves.read().iter().any(|l| l.readable() && !l.dtl_empty());
            if self.resilver_wanted.swap(false, Ordering::AcqRel) && !crate::scan::is_running(&self.scanner()) && missing() {
                // not on this thread: starting a resilver may wait for a scrub thread
                // that waits for a sync
                let scanner = self.scanner();
                let started = self.env.spawn(format!("resilver_start_{}", self.name), Box::new(move || crate::scan::start_resilver(&scanner)));
                if let Err(e) = started {
                    tracing::warn!(pool = %self.name, "could not start a resilver: {e}");
                }
            }
        }
        self.txg.sync_thread_exited();
    }

    /// Reads and writes the pool's data and log leaves completed so far (the txg
    /// history's nread, nwritten, reads, writes; OpenZFS counts the root vdev's).
    fn leaf_io_totals(&self) -> [u64; 4] {
        let mut t = [0; 4];
        for top in self.tops() {
            for c in top.children() {
                for (x, y) in t.iter_mut().zip(c.queue.io_totals()) {
                    *x += y;
                }
            }
        }
        t
    }

    /// Sync `txg`, retrying with backoff while the pool is suspended (`zilla pool
    /// clear` cuts the backoff short: `TxgState::retry_sync_now`). False: stop the
    /// thread (abandoned, shutting down with the error persisting, or a broken invariant).
    fn sync_until_done(&self, txg: Txg) -> bool {
        let mut backoff_ms = 10;
        let dirty_bytes = self.dirty.txg_dirty(txg);
        self.txg.note_sync_start(txg, dirty_bytes);
        loop {
            self.txg.note_attempt_start();
            let before = self.leaf_io_totals();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spa_sync(txg)));
            let after = self.leaf_io_totals();
            let d = |i: usize| after[i].saturating_sub(before[i]);
            self.txg.note_sync_io(txg, crate::txg::TxgSyncIo { reads: d(0), nread_bytes: d(1), writes: d(2), nwritten_bytes: d(3) });
            let r = match r {
                Ok(r) => r,
                Err(p) => {
                    let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                    tracing::error!(pool = %self.name, txg = txg.get(), "txg sync panicked, pool suspended: {msg}");
                    self.suspended.store(true, Ordering::Relaxed);
                    self.txg.mark_fatal(format!("txg {txg}: {msg}"));
                    return false;
                }
            };
            match r {
                Ok(()) => {
                    self.txg.mark_synced(txg);
                    if dirty_bytes == 0 {
                        // an idle pool: give the block-buffer slab's unused chunks back
                        crate::vdev::abd::trim(self.env.now_ns());
                    }
                    return true;
                }
                Err(e) => {
                    tracing::error!(pool = %self.name, txg = txg.get(), "txg sync failed, pool suspended, retrying: {e}");
                    self.txg.mark_sync_failed(e.to_string());
                    if self.abandoned.load(Ordering::Acquire) || (self.txg.is_shutting_down() && backoff_ms >= 1000) {
                        return false;
                    }
                    self.txg.wait_retry_backoff(backoff_ms * 1_000_000);
                    backoff_ms = (backoff_ms * 2).min(1000);
                }
            }
        }
    }
}
