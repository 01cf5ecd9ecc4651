//! spa replay: claim and replay of the volumes' intent logs at import.
//!
//! Theory of operation
//! -------------------
//! After the MOS is loaded and the pool's threads run, and before `import` returns
//! (so before any front end serves a volume), every volume whose ZIL header names a
//! chain goes through:
//!
//! ```text
//!  1. claim: walk the chain from the header; every verified block, and the block
//!     after the last one, is taken out of the free trees and defer lists
//!  2. the header gets its claim txg (the last synced txg, unless it has one already)
//!     and is written unchanged by every sync until replay ends
//!     (and so is every block a WR_INDIRECT record points at that was born after the
//!     claim txg: see `zil::claim`)
//!  3. replay every record of a txg newer than the claim txg, in chain order, as
//!     ordinary writes and write_zeroes of the volume (a WR_INDIRECT record's data is
//!     read through its block pointer and verified; a block that does not verify ends
//!     the replay of that chain, with a warning: its commit never completed)
//!  4. end: the chain's blocks (and the claimed indirect blocks) are freed and the
//!     header emptied by the next sync,
//!     which is waited for (the replayed writes are in it or in an earlier one) when
//!     there were records to replay or discard
//! ```
//! A crash anywhere before 4's sync commits leaves the header naming the same chain
//! with the same claim txg; the next import replays the same records again, which
//! gives the same result (writes and zeroings of absolute ranges, in order). The
//! claim is idempotent: claiming what is already allocated changes nothing.

use std::sync::Arc;

use super::{Pool, PoolConfig};
use crate::dmu::Mos;
use crate::vdev::label::Uberblock;
use crate::vdev::mirror::{Leaf, LeafState};
use crate::vdev::Role;
use crate::zil::{self, LogRecord, ZilHeader};
use crate::zvol::BlockVolume;
use crate::{Error, Result, Txg};

impl Pool {
    /// Claim and replay every volume's intent log (see the module comment); `synced`
    /// is the txg the pool was loaded at. Returns the records replayed.
    /// `discard_unreadable` (import -m): a chain that cannot be read (read errors on
    /// every copy of a log block) is discarded with a warning instead of failing the
    /// import; without it the error says that -m is the way out and what it costs.
    pub(super) fn replay_intent_logs(&self, mos: &Mos, synced: Txg, discard_unreadable: bool) -> Result<u64> {
        let mut replayed = 0u64;
        let mut any = false;
        for (id, hdr) in mos.zil_headers.iter().filter(|(_, h)| !h.is_empty()) {
            let Some(name) = self.inner.volumes.read().values().find(|v| v.id == *id).map(|v| v.name.clone()) else {
                return Err(Error::Corrupt(format!("ZIL header for unknown volume id {id}")));
            };
            let vol = self.open_zvol(&name)?;
            let claim_txg = if hdr.claim_txg.is_zero() { synced } else { hdr.claim_txg };
            let chain = match zil::claim(&self.inner.io, hdr, *id, claim_txg) {
                Ok(c) => c,
                Err(e @ Error::Io(_)) if discard_unreadable => {
                    tracing::warn!(pool = %self.inner.name, volume = %name, "cannot read the intent log ({e}); import -m: discarding it, the synchronous writes acknowledged after txg {synced} are lost");
                    vol.zil().begin_replay(ZilHeader { claim_txg, ..*hdr });
                    vol.zil().end_replay(vec![]);
                    any = true;
                    continue;
                }
                Err(Error::Io(e)) => {
                    return Err(Error::Io(std::io::Error::new(
                        e.kind(),
                        format!(
                            "cannot read the intent log of volume '{name}': {e}; import with -m to discard the \
                             unreadable log (the synchronous writes acknowledged after txg {synced} are then lost)"
                        ),
                    )))
                }
                Err(Error::Corrupt(m)) => return Err(Error::Corrupt(format!("volume {name}: {m}"))),
                Err(e) => return Err(e),
            };
            vol.zil().begin_replay(ZilHeader { claim_txg, ..*hdr });
            // a chain with no record newer than the claim txg changes nothing: the next
            // sync frees it (an import of an idle pool writes nothing; a cut before that
            // sync claims the same chain again)
            any |= chain.records.iter().any(|r| r.txg > claim_txg);
            if zil::ZIL_REPLAY_DISABLE.get() != 0 {
                tracing::warn!(pool = %self.inner.name, volume = %name, records = chain.records.len(), "zil_replay_disable is set: discarding the intent log");
            } else {
                let mut records = 0u64;
                for r in chain.records.iter().filter(|r| r.txg > claim_txg) {
                    if !replay_record(&self.inner.io, &*vol, r)? {
                        break;
                    }
                    records += 1;
                }
                vol.zil().stats.replayed_records.fetch_add(records, std::sync::atomic::Ordering::Relaxed);
                replayed += records;
                tracing::info!(pool = %self.inner.name, volume = %name, blocks = chain.blocks.len(), records, "intent log replayed");
            }
            let indirect = chain.indirect_blocks.into_iter().map(|dva| zil::LogPtr { dva });
            vol.zil().end_replay(chain.blocks.into_iter().chain(indirect).collect());
        }
        if any {
            // a failing sync suspends the pool and retries forever: an import gives up
            // instead (the log stays claimed on disk; the next import replays it again)
            let t = self.inner.txg.open_txg();
            self.inner.txg.wait_synced_or_failed(t).map_err(|e| Error::Io(std::io::Error::other(format!("the sync after intent-log replay: {e}"))))?;
        }
        Ok(replayed)
    }
}

/// Apply one record. `Ok(false)`: a WR_INDIRECT record whose block does not verify
/// (its commit was cut short before the block was written, so neither it nor any later
/// record was acknowledged): replay of the chain ends there.
fn replay_record(io: &crate::zio::PoolIo, vol: &dyn BlockVolume, r: &LogRecord) -> Result<bool> {
    let end = r.offset.checked_add(r.len).filter(|&e| e <= vol.size());
    if end.is_none() {
        return Err(Error::Corrupt(format!("intent log record {}+{} beyond volume {}", r.offset, r.len, vol.name())));
    }
    if let Some(bp) = r.indirect_bp() {
        let Some(data) = zil::read_indirect(io, &bp) else {
            tracing::warn!(
                volume = %vol.name(),
                txg = r.txg.get(),
                offset = r.offset,
                "intent log record points at block {}:{:#x} that does not verify: replay of this log ends here",
                bp.dva[0].vdev,
                bp.dva[0].offset
            );
            return Ok(false);
        };
        vol.write(r.offset, &data, false)?;
        return Ok(true);
    }
    match r.rtype {
        zil::TX_WRITE => vol.write(r.offset, &r.data, false)?,
        _ => vol.write_zeroes(r.offset, r.len)?,
    }
    Ok(true)
}

/// Import without `-m`: refuse a pool with a log vdev whose every device is missing.
/// The intent log on it may hold synchronous writes acknowledged after the loaded txg;
/// the error says from which txg and time on they may be lost (the records themselves,
/// and so their txgs, are on the missing device; `zfs_txg_timeout` today says nothing
/// about the one in force when they were written) and how many volumes have a log
/// chain starting there.
pub(super) fn check_log_devices(cfg: &PoolConfig, leaves: &[Arc<Leaf>], mos: &Mos, ub: &Uberblock) -> Result<()> {
    let missing_top = |t: &super::TopConfig| t.children.iter().all(|c| leaves.iter().any(|l| l.guid == c.guid && l.state() == LeafState::Unavail));
    let missing: Vec<&super::TopConfig> = cfg.tops.iter().filter(|t| t.role == Role::Log && missing_top(t)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    // a log file truncated or overwritten is there but has no valid label
    let why = |c: &super::LeafConfig| if std::fs::symlink_metadata(&c.spec.path).is_ok() { "has no valid label" } else { "does not exist" };
    let names: Vec<String> = missing.iter().flat_map(|t| t.children.iter().map(|c| format!("{} ({})", c.spec.display(), why(c)))).collect();
    let chains = mos.zil_headers.iter().filter(|(_, h)| !h.is_empty() && missing.iter().any(|t| t.id == h.head.dva.vdev)).count();
    let at = ub.timestamp_ns / 1_000_000_000;
    let lost = if chains == 0 {
        "no volume's intent log starts there, so no acknowledged write is lost".to_string()
    } else {
        format!(
            "the intent logs of {chains} volume(s) start there: the synchronous writes acknowledged after txg {} \
             (synced at unix time {at}) until the pool stopped are in those log records and may be lost \
             (how many cannot be known without the device)",
            ub.txg.get()
        )
    };
    Err(Error::InvalidArgument(format!(
        "pool '{}': log device {} is missing; {lost}; import with -m to discard the log records on it",
        cfg.name,
        names.join(", ")
    )))
}
