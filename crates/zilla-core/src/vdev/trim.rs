//! trim: autotrim, so space the pool frees reaches its devices' discard (OpenZFS
//! vdev_trim.c, `zpool set autotrim=on`).
//!
//! Theory of operation
//! -------------------
//! A freed block stays deferred for `TXG_DEFER_SIZE` txgs (metaslab), because the
//! trees of the uberblocks before the free still point at it. The sync of txg T
//! releases the frees of txgs <= T-3; with `autotrim=on` it first takes them off the
//! defer lists *without* returning them to the free trees (`take_released`), so
//! nothing can allocate or write them, discards them, waits, and only then frees them
//! (`free_released`). A block is therefore discarded exactly when it could have been
//! reused anyway: no tree an import may load (the last synced txg and the two rewind
//! targets before it) references it, and no write to that space can be in flight or
//! issued until the discard completed (the wait), so a discard never lands on data.
//!
//! ```text
//!   sync T:  defer[<= T-3] --take--> released --plan--> extents per top vdev
//!                                        |                  | discard on every
//!                                        |                  v writable child
//!                                        +--free_released-- wait (all done)
//!                                        v
//!                                   free trees  (allocations of T may reuse them)
//! ```
//!
//! Planning (`plan`): the released blocks of each top-level vdev, sorted and merged
//! where adjacent; extents shorter than `zfs_trim_extent_bytes_min` are left out (as in
//! OpenZFS: a small discard costs the device more than it gives back), longer ones are
//! split at `zfs_trim_extent_bytes_max`. Issue: each extent becomes one discard (trim
//! class, FIFO, `zfs_vdev_trim_max_active`) per writable child at the same physical
//! offset; at most `zfs_trim_queue_limit` discards per child are in flight, so a txg
//! that freed a whole volume does not flood the queues. A discard is advisory: a
//! failure is counted (`TrimStats::errors`) and logged, and neither faults the device
//! nor stops the sync. A child that is not writable (offline, faulted) is skipped; its
//! freed space simply stays on it.
//!
//! Cost: the sync waits for its discards. On files a discard is a hole punch
//! (`fallocate`), on block devices the kernel's discard; the sync's data writes begin
//! after them, so `zilla txgs` shows the wait in the sync time.
//!
//! The manual pass over all free space (`zpool trim`) is spa/trim.rs; it uses
//! `trim_top` the same way. Not built yet: the accumulation of small frees across txgs (`zfs_trim_txg_batch`): each sync plans only
//! what it releases, so scattered small frees are never discarded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::block::blkptr::Dva;
use crate::kstat::{Applies, Tunable};
use crate::vdev::mirror::TopVdev;
use crate::vdev::queue::IoRequest;
use crate::VdevId;

pub static ZFS_TRIM_EXTENT_BYTES_MIN: Tunable = Tunable::new(
    "zfs_trim_extent_bytes_min",
    32 << 10,
    4096,
    128 << 20,
    Applies::Live,
    "freed extents shorter than this are not discarded by autotrim (bytes)",
);
pub static ZFS_TRIM_EXTENT_BYTES_MAX: Tunable = Tunable::new(
    "zfs_trim_extent_bytes_max",
    128 << 20,
    4096,
    1 << 30,
    Applies::Live,
    "longer freed extents are discarded in pieces of this size (bytes)",
);
pub static ZFS_TRIM_QUEUE_LIMIT: Tunable =
    Tunable::new("zfs_trim_queue_limit", 10, 1, 1000, Applies::Live, "discards in flight per device while autotrim runs");

/// (`zfs_trim_extent_bytes_min`, `zfs_trim_extent_bytes_max`) as both trims use them:
/// the two are set one at a time, so a maximum below the minimum is raised to it
/// rather than refused (found by the attack29 review: plan asserted max >= min inside
/// the sync).
pub fn extent_bounds() -> (u64, u64) {
    let min = ZFS_TRIM_EXTENT_BYTES_MIN.get();
    (min, ZFS_TRIM_EXTENT_BYTES_MAX.get().max(min))
}

/// Autotrim's and the manual trim's counters for one pool.
#[derive(Debug, Default)]
pub struct TrimStats {
    /// Extents discarded (each on every writable child) and their bytes.
    pub extents: AtomicU64,
    pub bytes: AtomicU64,
    /// Released bytes left out because their extents were shorter than the minimum.
    pub skipped_bytes: AtomicU64,
    /// Discards a device failed, both kinds (advisory: nothing else happens).
    pub errors: AtomicU64,
    /// Extents and bytes the manual trim (`zilla pool trim`, spa/trim.rs) discarded.
    pub manual_extents: AtomicU64,
    pub manual_bytes: AtomicU64,
}

impl TrimStats {
    /// (kstat name, value) of every counter.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("autotrim_extents", l(&self.extents)),
            ("autotrim_bytes", l(&self.bytes)),
            ("autotrim_skipped_bytes", l(&self.skipped_bytes)),
            ("autotrim_errors", l(&self.errors)),
            ("trim_manual_extents", l(&self.manual_extents)),
            ("trim_manual_bytes", l(&self.manual_bytes)),
        ]
    }
}

/// The extents to discard per top-level vdev for the blocks `released` (data offsets,
/// as in their DVAs), and the bytes left out for being in extents shorter than `min`.
pub fn plan(released: &[Dva], min: u64, max: u64) -> (BTreeMap<VdevId, Vec<(u64, u64)>>, u64) {
    debug_assert!(min > 0 && max >= min);
    let mut by_vdev: BTreeMap<VdevId, Vec<(u64, u64)>> = BTreeMap::new();
    for d in released {
        by_vdev.entry(d.vdev).or_default().push((d.offset, d.asize as u64));
    }
    let mut skipped = 0;
    let mut out = BTreeMap::new();
    for (vdev, mut blocks) in by_vdev {
        blocks.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(blocks.len());
        for (off, len) in blocks {
            match merged.last_mut() {
                Some((o, l)) if *o + *l == off => *l += len,
                _ => {
                    debug_assert!(merged.last().is_none_or(|(o, l)| o + l <= off), "released blocks overlap");
                    merged.push((off, len));
                }
            }
        }
        let mut extents = Vec::new();
        for (off, len) in merged {
            if len < min {
                skipped += len;
                continue;
            }
            let mut at = 0;
            while at < len {
                let n = (len - at).min(max);
                extents.push((off + at, n));
                at += n;
            }
        }
        if !extents.is_empty() {
            out.insert(vdev, extents);
        }
    }
    (out, skipped)
}

/// Discard `extents` (data offsets) on every writable child of `top`, at most
/// `queue_limit` in flight per child, and wait for all of them. Failures are counted in
/// `stats` and logged; they are not returned (a discard is advisory).
pub fn trim_top(top: &Arc<TopVdev>, extents: &[(u64, u64)], queue_limit: usize, stats: &TrimStats, what: &str) {
    let children: Vec<_> = top.children().into_iter().filter(|c| c.readable()).collect();
    if children.is_empty() || extents.is_empty() {
        return;
    }
    let window = queue_limit.max(1) * children.len();
    let (tx, rx) = crossbeam_channel::bounded::<Option<String>>(window);
    let mut in_flight = 0usize;
    let mut first_error: Option<String> = None;
    let reap = |in_flight: &mut usize, first_error: &mut Option<String>| {
        // a completion lost with its sender counts as a failed discard
        let r = rx.recv().unwrap_or_else(|_| Some("discard completion lost".into()));
        *in_flight -= 1;
        if let Some(e) = r {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            first_error.get_or_insert(e);
        }
    };
    for &(off, len) in extents {
        let phys = super::label::DATA_START + off;
        for c in &children {
            while in_flight >= window {
                reap(&mut in_flight, &mut first_error);
            }
            let (tx, name) = (tx.clone(), c.spec.display());
            in_flight += 1;
            c.queue.submit(IoRequest::discard(phys, len, Box::new(move |d| {
                let _ = tx.send(d.result.err().map(|e| format!("{name}: {e}")));
            })));
        }
        stats.extents.fetch_add(1, Ordering::Relaxed);
        stats.bytes.fetch_add(len, Ordering::Relaxed);
    }
    while in_flight > 0 {
        reap(&mut in_flight, &mut first_error);
    }
    if let Some(e) = first_error {
        tracing::warn!(vdev = top.id.get(), "{what}: a discard failed (advisory, nothing lost): {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dva(vdev: u32, offset: u64, asize: u32) -> Dva {
        Dva { vdev: VdevId(vdev), asize, offset }
    }

    #[test]
    fn plan_merges_adjacent_blocks_and_leaves_out_short_extents() {
        let released = [
            dva(1, 0x30000, 0x4000),
            dva(1, 0x10000, 0x4000),
            dva(1, 0x14000, 0x4000),
            dva(1, 0x18000, 0x8000), // 0x10000..0x20000: 64 KiB
            dva(1, 0x40000, 0x4000), // 16 KiB alone: short
            dva(2, 0x0, 0x8000),     // 32 KiB: exactly the minimum
        ];
        let (p, skipped) = plan(&released, 32 << 10, 128 << 20);
        assert_eq!(p[&VdevId(1)], vec![(0x10000, 0x10000)]);
        assert_eq!(p[&VdevId(2)], vec![(0, 0x8000)]);
        assert_eq!(skipped, 0x4000 + 0x4000, "0x30000 and 0x40000 are 16 KiB each and apart");
    }

    #[test]
    fn a_maximum_set_below_the_minimum_is_raised_to_it() {
        let tunables = crate::tunables();
        let (min0, max0) = (ZFS_TRIM_EXTENT_BYTES_MIN.get(), ZFS_TRIM_EXTENT_BYTES_MAX.get());
        tunables.set("zfs_trim_extent_bytes_max", 4096).unwrap();
        tunables.set("zfs_trim_extent_bytes_min", 1 << 20).unwrap();
        let (min, max) = extent_bounds();
        tunables.set("zfs_trim_extent_bytes_min", min0).unwrap();
        tunables.set("zfs_trim_extent_bytes_max", max0).unwrap();
        assert_eq!((min, max), (1 << 20, 1 << 20));
        let released: Vec<Dva> = (0..4).map(|i| dva(1, i << 20, 1 << 20)).collect();
        assert_eq!(plan(&released, min, max).0[&VdevId(1)].len(), 4, "whole 1 MiB pieces, no assertion");
    }

    #[test]
    fn plan_splits_long_extents() {
        let released: Vec<Dva> = (0..10).map(|i| dva(1, i * 0x20000, 0x20000)).collect();
        let (p, skipped) = plan(&released, 4096, 0x50000);
        assert_eq!(p[&VdevId(1)], vec![(0, 0x50000), (0x50000, 0x50000), (0xa0000, 0x50000), (0xf0000, 0x50000)]);
        assert_eq!(skipped, 0);
        let total: u64 = p[&VdevId(1)].iter().map(|e| e.1).sum();
        assert_eq!(total, 10 * 0x20000);
    }
}
