//! space: space admission, beside the dirty-data accounting it extends.
//!
//! Theory of operation. A txg must never fail its sync for space: the sync cannot give
//! back what it was asked to write. So every change is admitted before it becomes
//! dirty, against the pool as the sync will find it (docs/design.md, "Space
//! admission"): what is allocated (`PoolIo::space`), plus what the unsynced txgs will
//! allocate (`DirtyAccounting::space_pending`: their data, every indirect block they
//! dirty, their object directories, every admission in progress, every thick volume's
//! unused reservation), plus this change with a full path of new indirect blocks
//! ([`admission_cost_bytes`]), must leave the slop free ([`slop_bytes`]; half of it for
//! a free, so a full pool can always be emptied). A change of a thick volume that fits
//! in its own unused reservation is admitted as it is.
//!
//! A volume calls in once per block: [`DirtyAccounting::try_admit_change`] (never
//! waits: the non-blocking write path) or [`DirtyAccounting::admit_change`], which,
//! when the change does not fit while dirty data or deferred frees are pending, waits
//! for txgs to sync and tries again (OpenZFS: ERESTART from dsl_dir_tempreserve_space,
//! then dmu_tx_wait). The returned [`SpaceReservation`] holds the change's cost in
//! `space_pending` until the volume has counted the dirtied block
//! (`add_volume_space` with [`dirtied_cost_bytes`]), so two concurrent changes never
//! pass the same check. Intent-log blocks in the normal class pass the same rule
//! ([`admit_log_block`]).

use crate::zio::PoolIo;
use crate::{Error, Result};

use super::{DirtyAccounting, SpaceReservation, VolumeSpace, MOS_COST_PER_BLOCK_BYTES};

/// Space a dirtied indirect block takes when its txg syncs: a new copy of it (128 KiB,
/// dmu's `INDIRECT_SIZE`, asserted there), written twice (indirect blocks carry two
/// copies), uncompressed at worst.
pub const INDIRECT_COST_BYTES: u64 = 2 * (128 << 10);

/// Syncs an admission waits for before it answers ENOSPC: a write waits this many in
/// all, a free this many in a row that did not bring it closer to fitting.
const ADMISSION_STALLS_MAX: usize = crate::metaslab::TXG_DEFER_SIZE as usize + 2;

/// Bytes kept free for the sync (spa_slop_shift = 5: 1/32 of the pool), at least 4 MiB
/// and at most half the pool. Writes must leave all of it free; frees may use half of
/// it (OpenZFS lets frees into the reserved slop the same way), so a full pool can
/// always be emptied.
pub fn slop_bytes(size: u64) -> u64 {
    (size / 32).max(4 << 20).min(size / 2)
}

/// Is the change a free (admitted into half the slop) or a write (leaves all of it)?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Write,
    Free,
}

/// What a change admitted to the pool costs: data at its logical size, a full path of
/// new indirect blocks, and the object directory's growth for each of them.
pub fn admission_cost_bytes(data_bytes: u64, nlevels: u8) -> u64 {
    let indirects = (nlevels as u64).saturating_sub(1);
    data_bytes + indirects * INDIRECT_COST_BYTES + (1 + indirects) * MOS_COST_PER_BLOCK_BYTES
}

/// What a block that became dirty will allocate when its txg syncs: its data, the
/// indirect blocks it dirtied first in that txg, and the object directory's growth.
pub fn dirtied_cost_bytes(data_bytes: u64, new_indirects: u64) -> u64 {
    data_bytes + new_indirects * INDIRECT_COST_BYTES + (1 + new_indirects) * MOS_COST_PER_BLOCK_BYTES
}

/// Space admission of an intent-log block of `len` bytes in the normal class (the pool
/// has no usable log vdev): like a write, it must leave the whole slop free, so the log
/// never takes the space the sync needs (log blocks are freed only by syncs: a log that
/// starved the sync would wait for it forever). Admitted, it counts as unavailable
/// space at once (`PoolIo::note_log_block`), so later writes are admitted around it.
/// Refused, the commit waits for a txg instead.
pub fn admit_log_block(io: &PoolIo, dirty: &DirtyAccounting, len: u64) -> bool {
    let _held = dirty.reserve(len.next_multiple_of(crate::zio::pool_io::SPACE_ADMISSION_UNIT_BYTES));
    let (size, unavailable) = io.space();
    if unavailable + dirty.space_pending() + slop_bytes(size) > size {
        return false;
    }
    io.note_log_block(len);
    true
}

impl DirtyAccounting {
    /// Admit a change of `new_bytes` of data (0 for a free) to a volume whose tree has
    /// `nlevels` levels, without waiting. `Err` holds how many bytes are missing.
    pub fn try_admit_change<'a>(
        &'a self,
        io: &PoolIo,
        vol: &'a VolumeSpace,
        new_bytes: u64,
        nlevels: u8,
        kind: Admit,
    ) -> std::result::Result<SpaceReservation<'a>, u64> {
        let held = self.reserve_for(vol, admission_cost_bytes(new_bytes, nlevels));
        let (size, unavailable) = io.space();
        let slop = match kind {
            Admit::Write => slop_bytes(size),
            Admit::Free => slop_bytes(size) / 2,
        };
        self.admit(&held, size, unavailable, slop)?;
        Ok(held)
    }

    /// [`DirtyAccounting::try_admit_change`], waiting for syncs while the change does
    /// not fit and they may make room: a write gets ENOSPC when it does not fit even
    /// then; a free keeps waiting as long as the syncs make progress (each one empties
    /// indirect blocks and returns deferred frees), so a TRIM of a full pool finishes
    /// in several txgs instead of failing. A change of a thick volume whose data is
    /// within its reservation also keeps waiting while deferred frees are pending: a
    /// rewrite's new copy is allocated before the old copy comes back (two txgs after
    /// the sync that frees it), so in a full pool a thick volume rewrites at the pace
    /// its own frees return instead of failing. It gets ENOSPC only when nothing is
    /// left to return.
    pub fn admit_change<'a>(
        &'a self,
        io: &PoolIo,
        txg: &crate::txg::TxgState,
        vol: &'a VolumeSpace,
        new_bytes: u64,
        nlevels: u8,
        kind: Admit,
    ) -> Result<SpaceReservation<'a>> {
        let mut stalls = 0;
        let mut best_shortfall = u64::MAX;
        // a thick volume within its reservation waits while frees are on their way:
        // its rewrites need room for the new copy before the old one is returned
        let patient = vol.holds_reservation();
        loop {
            let shortfall = match self.try_admit_change(io, vol, new_bytes, nlevels, kind) {
                Ok(held) => return Ok(held),
                Err(shortfall) => shortfall,
            };
            let deferred = io.ms.deferred_bytes() > 0;
            if (kind == Admit::Free || patient) && (shortfall < best_shortfall || (patient && deferred)) {
                best_shortfall = shortfall;
                stalls = 0;
            }
            let pending = self.total() > 0 || deferred;
            if !pending || stalls >= ADMISSION_STALLS_MAX {
                return Err(Error::NoSpace);
            }
            stalls += 1;
            self.note_space_wait();
            let t = txg.open_txg();
            txg.wait_synced(t)?;
        }
    }
}
