//! Dataset administration of volumes: growing (`set volsize`), renaming, and the
//! read-only statistics zfs shows for a dataset (`type`, `name`, `creation`,
//! `compressratio`, `logicalreferenced`).
//!
//! Growing. A volume's size is one field of its MOS record; its block tree has the
//! height (`nlevels`) its size needs (docs/on-disk-format.md §5-6). A grow that keeps
//! the height changes nothing but that field: the new size goes into the MOS record of
//! the sync `set` waits for (`grown_volsize`), and only once that sync is done is it
//! served (reads and writes up to it accepted). A crash before leaves the old size and
//! no block or intent-log record beyond it; a crash after, the new size (which no
//! write may have reached yet). If the sync fails the old size stays served. A grow that would need a taller tree is
//! refused with the largest size the volume can grow to. A thick volume (its
//! `refreservation` is the one `auto` gives its size) keeps being thick: its
//! reservation grows with it, first, and a grow the pool cannot reserve is refused.
//! Shrinking is refused: the blocks beyond the new end would stay allocated in a tree
//! whose records say they cannot exist.
//!
//! Renaming. A volume is its id (its intent log, tree and reservations hang off the
//! id, never the name), so a rename is a change of the name in the pool's table and of
//! the MOS record the next sync writes. It is done under the sync lock with the table
//! held, and only while nothing else holds the volume (no open client, no scan): then
//! the pool's `VolumeState` is taken out of its `Arc`, renamed and put back.
//!
//! Creation time. `volume create` stores the wall-clock second in the internal property
//! `_creation`; volumes created before it existed show `-`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{resolve_refreservation, Pool};
use crate::{Error, Result};

/// The internal property holding a volume's creation time (decimal unix seconds).
pub const CREATION_PROP: &str = "_creation";

impl Pool {
    /// `zfs set volsize=SIZE`: grow the volume to `new_size` bytes (a multiple of its
    /// volblocksize); its reservation follows when it was the size's (thick volume).
    pub fn set_volsize(&self, volume: &str, new_size: u64) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let v = inner.volumes.read().get(volume).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{volume}'", inner.name)))?;
        let (old, bs) = (v.volsize(), v.volblocksize);
        if new_size == 0 || new_size % bs as u64 != 0 {
            return Err(Error::invalid(format!("volume size must be a multiple of volume block size ({})", super::shown_bytes(bs as u64))));
        }
        if new_size < old {
            return Err(Error::invalid(format!(
                "cannot shrink a volume ({} to {}): the data beyond the new end would be lost; \
                 copy the data to a new, smaller volume instead",
                super::shown_bytes(old),
                super::shown_bytes(new_size)
            )));
        }
        let nlevels = v.committed.read().nlevels;
        let max = max_volsize(nlevels, bs);
        if new_size > max {
            return Err(Error::invalid(format!(
                "volume size {} needs a taller block tree than this volume has: it can grow to at most {}",
                super::shown_bytes(new_size),
                super::shown_bytes(max)
            )));
        }
        if new_size == old {
            return Ok(());
        }
        {
            // one size change at a time, and the reservation with it
            let _g = inner.volumes.write();
            let reserved = crate::props::refreservation_bytes(&v.props.snapshot().value("refreservation"));
            if reserved != 0 && reserved == crate::dsl_pool::refreservation_for(old, bs) {
                let value = resolve_refreservation("auto", new_size, bs)?;
                inner.reserve_for_volume(&v.space, crate::props::refreservation_bytes(&value))?;
                v.props.set("refreservation", &value)?;
            }
            v.grown_volsize.store(new_size, Ordering::Release);
        }
        inner.meta.lock().changed = true;
        let synced = self.sync();
        if synced.is_ok() {
            v.volsize.store(new_size, Ordering::Release);
        }
        v.grown_volsize.store(0, Ordering::Release);
        synced
    }

    /// `zfs rename POOL/OLD POOL/NEW` within the pool; refused while anything holds
    /// the volume open.
    pub fn volume_rename(&self, old: &str, new: &str) -> Result<()> {
        self.check_open()?;
        super::validate_volume_name(new)?;
        let inner = &self.inner;
        self.sync()?;
        let _g = inner.sync_lock.lock();
        let mut vols = inner.volumes.write();
        if vols.contains_key(new) {
            return Err(Error::Exists(format!("{}/{new}", inner.name)));
        }
        let v = vols.remove(old).ok_or_else(|| Error::NotFound(format!("volume '{}/{old}'", inner.name)))?;
        let mut state = match Arc::try_unwrap(v) {
            Ok(s) => s,
            Err(v) => {
                vols.insert(old.to_string(), v);
                return Err(Error::Busy(format!("volume '{}/{old}' is open (a client or a scan is using it); try again when it is not", inner.name)));
            }
        };
        state.name = new.to_string();
        vols.insert(new.to_string(), Arc::new(state));
        inner.meta.lock().changed = true;
        drop(vols);
        drop(_g);
        self.sync()
    }
}

/// The read-only statistics zfs shows for every dataset, exact (`-p`) values: `type`,
/// `creation` (unix seconds, `-` when unknown), `compressratio` (`1.00`),
/// `logicalreferenced`, and `name` (listed by `get all` last; zfs shows it as a column).
pub(super) fn statistics(full: &str, ps: &crate::props::PropSet, s: &super::VolumeSpaceFigures) -> Vec<(&'static str, String)> {
    let creation = ps.local().get(CREATION_PROP).cloned().unwrap_or_else(|| "-".to_string());
    vec![
        ("type", "volume".to_string()),
        ("creation", creation),
        ("compressratio", compressratio(s.logicalused, s.referenced).1),
        ("logicalreferenced", s.logicalused.to_string()),
        ("name", full.to_string()),
    ]
}

/// Largest size a volume of `volblocksize` blocks whose tree has `nlevels` levels can
/// have (the geometry check of the MOS wants `nlevels == levels_for(nblocks)`).
pub fn max_volsize(nlevels: u8, volblocksize: u32) -> u64 {
    let mut blocks: u64 = 1;
    for _ in 1..nlevels {
        blocks = blocks.saturating_mul(crate::dmu::EPB);
    }
    let max = blocks.saturating_mul(volblocksize as u64).min(1u64 << 50);
    debug_assert!(crate::dmu::levels_for(max / volblocksize as u64) <= nlevels);
    max
}

/// zfs's `compressratio` from logical and physical bytes: `1.00x` (`1.00` parsable),
/// two decimals, rounded down; `1.00x` for a volume with nothing written.
pub fn compressratio(logical: u64, physical: u64) -> (String, String) {
    let hundredths = if physical == 0 { 100 } else { (logical as u128 * 100 / physical as u128) as u64 };
    let exact = format!("{}.{:02}", hundredths / 100, hundredths % 100);
    (format!("{exact}x"), exact)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_volsize_keeps_the_tree_height() {
        for bs in [4096u32, 16384, 131072] {
            for nlevels in 1..=4u8 {
                let max = max_volsize(nlevels, bs);
                assert_eq!(crate::dmu::levels_for(max / bs as u64), nlevels, "bs {bs} nlevels {nlevels}");
                if nlevels < 4 {
                    assert!(crate::dmu::levels_for(max / bs as u64 + 1) > nlevels);
                }
            }
        }
    }

    #[test]
    fn compressratio_shapes() {
        assert_eq!(compressratio(0, 0), ("1.00x".to_string(), "1.00".to_string()));
        assert_eq!(compressratio(300, 100).0, "3.00x");
        assert_eq!(compressratio(199, 100).1, "1.99");
    }
}
