//! spa stale: at import, children whose labels show they missed txgs their siblings
//! have (stale), or were written apart from them (diverged).
//!
//! Theory of operation
//! -------------------
//! A child's uberblock ring records the txgs it took part in. A disk pulled and put
//! back, or restored from an old image, carries an older ring than its siblings; a
//! disk imported alone elsewhere and written carries uberblocks at txgs its siblings
//! also have, but different ones (another MOS root, time, ...). The pool's own record
//! of what a child misses (its DTL in the object directory) knows neither: it was
//! written while the child's current contents were somewhere else.
//!
//! Import compares the rings before it builds the pool:
//!
//! ```text
//!   reference:  the devices holding the uberblock import loaded (the newest that loads)
//!   each other device, newest ring first:
//!     a txg both have, with no uberblock in common     -> DIVERGED
//!     otherwise, its newest txg t below the newest N  -> STALE, misses t+1 ..= N
//!     otherwise                                         -> current (joins the reference)
//! ```
//!
//! A stale child gets `t+1 ..= N` in its DTL: reads of those txgs go to its siblings,
//! the last-copy guard (`offline`, `detach`) counts it as missing them, and import
//! starts a resilver. A diverged child is trusted for nothing: its other life freed
//! blocks of the common past and reused their space, so any of its copies may be
//! overwritten; it gets every txg in its DTL and is rebuilt from the chosen side. The
//! side loaded is the one with the newest uberblock (highest txg, then time), as for any
//! import; only a rewind (`-F`) could load an older txg of the other side.
//!
//! Bounds and limits: the rings hold the last 32 txgs (16 at ashift 13). A device with
//! no txg in common with the reference cannot be told diverged from stale; it is taken
//! as stale (its DTL covers every txg after its newest), and a device whose absence the
//! pool recorded (offline, faulted, missing at import) is covered anyway by the DTL the
//! pool kept from the txg it left. Until the DTL is in a synced object directory the
//! loaded uberblock is not copied to such a device (`Judged::any`), so a crash in between
//! finds it stale again. A device holding txgs past the loaded one (a rewind) is
//! current.
use std::collections::BTreeMap;

use crate::vdev::label::Uberblock;
use crate::vdev::mirror::{range_insert, Leaf};
use crate::{Guid, Txg};

/// What import concluded about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It holds the newest txg, or agrees with the devices that do.
    Current,
    /// It agrees with the reference, but its newest uberblock is at `newest`, below
    /// the pool's: it missed `newest + 1 ..= pool`.
    Stale { newest: Txg, pool: Txg },
    /// It has an uberblock at a txg the reference also has, but another one; the last
    /// txg both agree on before that is `agreed` (zero: none seen).
    Diverged { agreed: Txg, first_differing: Txg, pool: Txg },
}

impl Verdict {
    /// The txg ranges the device must be resilvered for.
    pub(super) fn missing(&self) -> Vec<(Txg, Txg)> {
        match *self {
            Verdict::Current => Vec::new(),
            Verdict::Stale { newest, pool } => vec![(newest.next(), pool)],
            Verdict::Diverged { pool, .. } => vec![(Txg(1), pool)],
        }
    }

    /// What `pool status` says beside the device.
    pub(super) fn note(&self) -> String {
        match *self {
            Verdict::Current => String::new(),
            Verdict::Stale { newest, pool } if newest.next() == pool => format!("missed txg {}", pool.get()),
            Verdict::Stale { newest, pool } => format!("missed txgs {}-{}", newest.next().get(), pool.get()),
            Verdict::Diverged { agreed, first_differing, .. } if agreed.is_zero() => {
                format!("diverged: written apart from the pool (txg {} differs), not trusted", first_differing.get())
            }
            Verdict::Diverged { agreed, .. } => format!("diverged: written apart from the pool after txg {}, not trusted", agreed.get()),
        }
    }
}

/// The verdict on every device that carries a label of the pool, by its guid.
#[derive(Debug, Default)]
pub(super) struct Judged {
    pub(super) verdicts: BTreeMap<Guid, Verdict>,
}

impl Judged {
    pub(super) fn verdict(&self, g: Guid) -> &Verdict {
        self.verdicts.get(&g).unwrap_or(&Verdict::Current)
    }
    #[cfg(test)]
    pub(super) fn diverged(&self, g: Guid) -> bool {
        matches!(self.verdict(g), Verdict::Diverged { .. })
    }
    /// Some device is stale or diverged.
    pub(super) fn any(&self) -> bool {
        self.verdicts.values().any(|v| *v != Verdict::Current)
    }

    /// Put what each leaf misses into its DTL, and the reason beside it in `status`.
    pub(super) fn apply(&self, leaves: &[std::sync::Arc<Leaf>]) {
        for l in leaves {
            let v = self.verdict(l.guid);
            if *v == Verdict::Current {
                continue;
            }
            let mut d = l.dtl();
            for (lo, hi) in v.missing() {
                range_insert(&mut d, lo, hi);
            }
            l.set_dtl(d);
            l.set_import_note(v.note());
        }
    }
}

/// One device's uberblocks by txg (several at one txg: a rewritten slot, torn labels).
type Ring = BTreeMap<Txg, Vec<Uberblock>>;

fn ring_of(ubs: &[Uberblock]) -> Ring {
    let mut r: Ring = BTreeMap::new();
    for u in ubs {
        let e = r.entry(u.txg).or_default();
        if !e.contains(u) {
            e.push(u.clone());
        }
    }
    r
}

/// Order of uberblocks: the newest is the highest txg, then the latest time, then the
/// guid sum and the MOS root's address (any fixed order, so every import chooses alike).
#[cfg(test)]
fn ub_key(u: &Uberblock) -> (Txg, u64, u64, u64) {
    (u.txg, u.timestamp_ns, u.guid_sum, u.root.dva[0].offset)
}

/// The newest of `devices`' uberblocks (highest txg, then time): what import loads
/// when it can.
#[cfg(test)]
fn newest(devices: &[(Guid, Vec<Uberblock>)]) -> Option<Uberblock> {
    devices.iter().flat_map(|(_, u)| u.iter()).max_by_key(|u| ub_key(u)).cloned()
}

/// Judge every device by its uberblocks (`devices`: its guid and the pool's uberblocks
/// its labels hold) against `newest`, the uberblock import loaded. See the module
/// comment.
pub(super) fn judge(devices: &[(Guid, Vec<Uberblock>)], newest: &Uberblock) -> Judged {
    let rings: Vec<(Guid, Ring)> = devices.iter().map(|(g, u)| (*g, ring_of(u))).collect();
    let newest = newest.clone();
    let pool = newest.txg;
    let mut reference: Ring = BTreeMap::new();
    let mut rest = Vec::new();
    for (g, r) in &rings {
        if r.get(&pool).is_some_and(|v| v.contains(&newest)) {
            merge(&mut reference, r);
        } else {
            rest.push((*g, r));
        }
    }
    // the devices closest to the reference first: each that agrees extends it
    rest.sort_by_key(|(_, r)| std::cmp::Reverse(r.range(..=pool).next_back().map(|(t, _)| *t).unwrap_or(Txg::ZERO)));
    let mut out = Judged::default();
    for (g, r) in rest {
        let v = compare(&reference, r, pool);
        if !matches!(v, Verdict::Diverged { .. }) {
            merge(&mut reference, r);
        }
        if v != Verdict::Current {
            out.verdicts.insert(g, v);
        }
    }
    out
}

fn merge(into: &mut Ring, r: &Ring) {
    for (t, v) in r {
        let e = into.entry(*t).or_default();
        for u in v {
            if !e.contains(u) {
                e.push(u.clone());
            }
        }
    }
}

/// One device's ring against the reference's, up to the pool's newest txg `pool`.
fn compare(reference: &Ring, r: &Ring, pool: Txg) -> Verdict {
    let mut agreed = Txg::ZERO;
    for (t, mine) in r.range(..=pool) {
        let Some(theirs) = reference.get(t) else { continue };
        if !mine.iter().any(|u| theirs.contains(u)) {
            return Verdict::Diverged { agreed, first_differing: *t, pool };
        }
        agreed = *t;
    }
    // a device with txgs past the loaded one (a rewind) holds every txg up to it
    if r.range(pool.next()..).next().is_some() {
        return Verdict::Current;
    }
    match r.keys().next_back() {
        Some(&newest) if newest < pool => Verdict::Stale { newest, pool },
        None => Verdict::Stale { newest: Txg::ZERO, pool },
        _ => Verdict::Current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::blkptr::BlockPointer;

    fn ub(txg: u64, time: u64) -> Uberblock {
        Uberblock { txg: Txg(txg), guid_sum: 7, timestamp_ns: time, pool_guid: Guid(1), root: BlockPointer::hole(), heartbeat: None }
    }

    fn ring(txgs: std::ops::RangeInclusive<u64>, time_of: impl Fn(u64) -> u64) -> Vec<Uberblock> {
        txgs.map(|t| ub(t, time_of(t))).collect()
    }

    fn judge_newest(devices: &[(Guid, Vec<Uberblock>)]) -> Judged {
        judge(devices, &newest(devices).unwrap())
    }

    #[test]
    fn a_device_behind_its_sibling_is_stale() {
        let j = judge_newest(&[(Guid(1), ring(3..=20, |t| t)), (Guid(2), ring(3..=12, |t| t))]);
        assert_eq!(*j.verdict(Guid(1)), Verdict::Current);
        assert_eq!(*j.verdict(Guid(2)), Verdict::Stale { newest: Txg(12), pool: Txg(20) });
        assert_eq!(j.verdict(Guid(2)).missing(), vec![(Txg(13), Txg(20))]);
        assert_eq!(j.verdict(Guid(2)).note(), "missed txgs 13-20");
    }

    #[test]
    fn a_device_written_apart_is_diverged_and_the_newest_side_wins() {
        // both were at txg 10; each was then written alone: a to 18, b to 15
        let a = ring(3..=18, |t| t);
        let b = ring(3..=15, |t| if t > 10 { t + 1000 } else { t });
        let j = judge_newest(&[(Guid(1), a), (Guid(2), b)]);
        assert_eq!(*j.verdict(Guid(1)), Verdict::Current);
        assert_eq!(*j.verdict(Guid(2)), Verdict::Diverged { agreed: Txg(10), first_differing: Txg(11), pool: Txg(18) });
        assert_eq!(j.verdict(Guid(2)).missing(), vec![(Txg(1), Txg(18))]);
        assert!(j.diverged(Guid(2)) && j.any());
    }

    #[test]
    fn equal_rings_and_a_lone_device_are_current() {
        let j = judge_newest(&[(Guid(1), ring(3..=9, |t| t)), (Guid(2), ring(3..=9, |t| t))]);
        assert!(!j.any());
        assert!(!judge_newest(&[(Guid(1), ring(3..=9, |t| t))]).any());
    }

    /// The same highest txg written twice apart: the later one is chosen, the other
    /// side is diverged (never a mixture).
    #[test]
    fn the_same_txg_written_apart_is_decided_by_time() {
        let a = ring(3..=12, |t| if t > 10 { t + 2000 } else { t });
        let b = ring(3..=12, |t| if t > 10 { t + 1000 } else { t });
        let j = judge_newest(&[(Guid(1), a), (Guid(2), b)]);
        assert_eq!(*j.verdict(Guid(1)), Verdict::Current);
        assert!(j.diverged(Guid(2)), "{:?}", j.verdict(Guid(2)));
    }
}
