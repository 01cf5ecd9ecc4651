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
//!  3. replay every record of a txg newer than the claim txg, in chain order, as
//!     ordinary writes and write_zeroes of the volume
//!  4. end: the chain's blocks are freed and the header emptied by the next sync,
//!     which is waited for (the replayed writes are in it or in an earlier one)
//! ```
//! A crash anywhere before 4's sync commits leaves the header naming the same chain
//! with the same claim txg; the next import replays the same records again, which
//! gives the same result (writes and zeroings of absolute ranges, in order). The
//! claim is idempotent: claiming what is already allocated changes nothing.

use super::Pool;
use crate::dmu::Mos;
use crate::zil::{self, LogRecord, ZilHeader};
use crate::zvol::BlockVolume;
use crate::{Error, Result, Txg};

impl Pool {
    /// Claim and replay every volume's intent log (see the module comment); `synced`
    /// is the txg the pool was loaded at. Returns the records replayed.
    pub(super) fn replay_intent_logs(&self, mos: &Mos, synced: Txg) -> Result<u64> {
        let mut replayed = 0u64;
        let mut any = false;
        for (id, hdr) in mos.zil_headers.iter().filter(|(_, h)| !h.is_empty()) {
            let Some(name) = self.inner.volumes.read().values().find(|v| v.id == *id).map(|v| v.name.clone()) else {
                return Err(Error::Corrupt(format!("ZIL header for unknown volume id {id}")));
            };
            let vol = self.open_zvol(&name)?;
            let chain = zil::claim(&self.inner.io, hdr, *id)?;
            let claim_txg = if hdr.claim_txg.is_zero() { synced } else { hdr.claim_txg };
            vol.zil().begin_replay(ZilHeader { claim_txg, ..*hdr });
            any = true;
            if zil::ZIL_REPLAY_DISABLE.get() != 0 {
                tracing::warn!(pool = %self.inner.name, volume = %name, records = chain.records.len(), "zil_replay_disable is set: discarding the intent log");
            } else {
                for r in chain.records.iter().filter(|r| r.txg > claim_txg) {
                    replay_record(&*vol, r)?;
                    replayed += 1;
                }
            }
            tracing::info!(pool = %self.inner.name, volume = %name, blocks = chain.blocks.len(), replayed, "intent log replayed");
            vol.zil().end_replay(chain.blocks);
        }
        if any {
            self.sync()?;
        }
        Ok(replayed)
    }
}

fn replay_record(vol: &dyn BlockVolume, r: &LogRecord) -> Result<()> {
    let end = r.offset.checked_add(r.len).filter(|&e| e <= vol.size());
    if end.is_none() {
        return Err(Error::Corrupt(format!("intent log record {}+{} beyond volume {}", r.offset, r.len, vol.name())));
    }
    match r.rtype {
        zil::TX_WRITE => vol.write(r.offset, &r.data, false),
        _ => vol.write_zeroes(r.offset, r.len),
    }
}
