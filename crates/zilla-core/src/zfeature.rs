//! zfeature: per-pool feature flags (format 2).
//!
//! Theory of operation
//! -------------------
//! A feature names an on-disk structure a build must understand (docs/on-disk-format.md
//! §19). Each is **disabled** (the pool has never heard of it), **enabled** (`pool
//! upgrade` turned it on; nothing uses it yet: count 0) or **active** (count > 0: some
//! structure that needs it exists). Features come in two kinds: one a reader must
//! know to read the pool at all (`features_for_read`), and one only a writer must know
//! (`features_for_write`): a build that does not know the latter can still read the
//! pool, so it imports it read-only.
//!
//! The MOS keeps the truth: two counts ZAPs (name → u64 count, one per kind) and the
//! txg each feature was enabled in. The label config carries the names of the active
//! ones of each kind, so an import decides before it reads the MOS ([`import_access`]):
//! an unknown read feature refuses the pool naming it, an unknown write feature
//! makes it read-only. Counts change in the txg of the change that needs them, so the
//! config and the structures never disagree about a committed txg.
//!
//! **Names.** Zilla's features are `org.zilla:NAME`; any other vendor's reverse-DNS
//! name is accepted as a name and treated as unknown. [`check_name`] is the syntax.

use crate::dmu::dnode::{ObjectSpec, ObjectType};
use crate::dmu::object_tree::BlockIo;
use crate::dmu::objset::Objset;
use crate::dmu::zap_store::ObjectInTxg;
use crate::{zap, Error, Result, Txg};

/// The prefix of Zilla's own feature names.
pub const VENDOR: &str = "org.zilla:";
/// Longest short name (after the vendor).
pub const SHORT_NAME_MAX_BYTES: usize = 64;
/// Longest full name.
pub const NAME_MAX_BYTES: usize = 256;
/// Most names a label config lists per kind.
pub const MAX_LISTED: usize = 64;

/// Which list a feature is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A reader must understand it.
    Read,
    /// Only a writer must.
    Write,
}

/// A feature this build knows.
#[derive(Debug)]
pub struct FeatureInfo {
    /// `zpool`'s `feature@NAME` name.
    pub short: &'static str,
    pub kind: Kind,
    pub description: &'static str,
}

impl FeatureInfo {
    pub fn name(&self) -> String {
        format!("{VENDOR}{}", self.short)
    }
}

/// Every feature this build knows.
pub static FEATURES: &[FeatureInfo] = &[
    FeatureInfo { short: "async_destroy", kind: Kind::Write, description: "destroy datasets in the background, a bounded amount per txg" },
    FeatureInfo { short: "large_blocks", kind: Kind::Read, description: "data blocks larger than 128 KiB" },
];

/// The known feature of `name` (full, or the short `feature@` form).
pub fn find(name: &str) -> Option<&'static FeatureInfo> {
    let short = name.strip_prefix(VENDOR).unwrap_or(name);
    FEATURES.iter().find(|f| f.short == short)
}

/// The syntax of a full feature name: `vendor:short`, the vendor a reverse-DNS name of
/// lower-case letters, digits, `.` and `-`, the short name 1 … 64 of `[a-z0-9_]`.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    let bad = || Err(format!("'{}' is not a feature name (vendor:name, e.g. {VENDOR}async_destroy)", name.escape_debug()));
    let Some((vendor, short)) = name.split_once(':') else { return bad() };
    let vendor_ok = !vendor.is_empty() && vendor.contains('.') && vendor.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-');
    let short_ok = (1..=SHORT_NAME_MAX_BYTES).contains(&short.len()) && short.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
    if name.len() > NAME_MAX_BYTES || !vendor_ok || !short_ok {
        return bad();
    }
    Ok(())
}

/// The checks of a label config's feature list (§9): names, bound, no repeats.
pub fn check_list(field: &str, names: &[String]) -> std::result::Result<(), String> {
    if names.len() > MAX_LISTED {
        return Err(format!("field {field} has {} names (at most {MAX_LISTED})", names.len()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for n in names {
        check_name(n).map_err(|e| format!("field {field}: {e}"))?;
        if !seen.insert(n) {
            return Err(format!("field {field} names '{n}' twice"));
        }
    }
    Ok(())
}

/// How a pool whose label lists these active features may be imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    /// Only read-only: these write features are unknown here.
    ReadOnly { unknown_write: Vec<String> },
}

/// The import decision of §19. The error names every unknown read feature.
pub fn import_access(for_read: &[String], for_write: &[String]) -> Result<Access> {
    let unknown = |names: &[String], kind: Kind| -> Vec<String> {
        names.iter().filter(|n| !n.strip_prefix(VENDOR).and_then(find).is_some_and(|f| f.kind == kind)).cloned().collect()
    };
    let read = unknown(for_read, Kind::Read);
    if !read.is_empty() {
        return Err(Error::invalid(format!(
            "the pool uses feature{} this build does not support: {}; it cannot be imported",
            if read.len() > 1 { "s" } else { "" },
            read.join(", ")
        )));
    }
    let write = unknown(for_write, Kind::Write);
    Ok(if write.is_empty() { Access::ReadWrite } else { Access::ReadOnly { unknown_write: write } })
}

/// A feature's state in a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Disabled,
    Enabled,
    Active(u64),
}

impl State {
    /// As `pool get feature@NAME` shows it.
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Disabled => "disabled",
            State::Enabled => "enabled",
            State::Active(_) => "active",
        }
    }
}

/// The MOS objects that hold a pool's features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureObjects {
    pub for_read: u64,
    pub for_write: u64,
    pub enabled_txg: u64,
}

/// A pool's features, over the MOS.
pub struct Features<'a> {
    pub mos: &'a Objset,
    pub io: &'a dyn BlockIo,
    pub objects: FeatureObjects,
}

const ZAP_BLOCK_BYTES: u32 = 512;

impl<'a> Features<'a> {
    /// The three objects of a new pool, no feature enabled.
    pub fn create(mos: &'a Objset, io: &'a dyn BlockIo, txg: Txg) -> Result<Features<'a>> {
        let new = |ty: ObjectType| -> Result<u64> {
            let o = mos.allocate(io, txg, &ObjectSpec::metadata(ty, ZAP_BLOCK_BYTES))?;
            zap::create(&mut ObjectInTxg { objset: mos, io, txg, object: o }, (o.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ txg.get()) | 1)?;
            Ok(o)
        };
        let objects = FeatureObjects { for_read: new(ObjectType::FeatureCounts)?, for_write: new(ObjectType::FeatureCounts)?, enabled_txg: new(ObjectType::FeatureCounts)? };
        Ok(Features { mos, io, objects })
    }

    fn zap(&self, txg: Txg, object: u64) -> ObjectInTxg<'_> {
        ObjectInTxg { objset: self.mos, io: self.io, txg, object }
    }

    fn counts_of(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Read => self.objects.for_read,
            Kind::Write => self.objects.for_write,
        }
    }

    /// The state of a known feature.
    pub fn state(&self, f: &FeatureInfo) -> Result<State> {
        let name = f.name();
        match zap::lookup_u64(&self.zap(Txg::ZERO, self.counts_of(f.kind)), name.as_bytes())? {
            None => Ok(State::Disabled),
            Some(0) => Ok(State::Enabled),
            Some(n) => Ok(State::Active(n)),
        }
    }

    /// Enable `f` in `txg` (nothing if it is already).
    pub fn enable(&self, txg: Txg, f: &FeatureInfo) -> Result<bool> {
        if self.state(f)? != State::Disabled {
            return Ok(false);
        }
        let name = f.name();
        zap::insert(&mut self.zap(txg, self.counts_of(f.kind)), name.as_bytes(), &0u64.to_le_bytes())?;
        zap::update(&mut self.zap(txg, self.objects.enabled_txg), name.as_bytes(), &txg.get().to_le_bytes())?;
        Ok(true)
    }

    /// Change `f`'s count by `delta` in `txg`: it must be enabled, and the count never
    /// goes below zero (a pair of increments and decrements that disagree is a bug).
    pub fn add_count(&self, txg: Txg, f: &FeatureInfo, delta: i64) -> Result<State> {
        let now = match self.state(f)? {
            State::Disabled => return Err(Error::invalid(format!("feature@{} is not enabled on this pool", f.short))),
            State::Enabled => 0,
            State::Active(n) => n,
        };
        let new = now.checked_add_signed(delta).unwrap_or_else(|| panic!("feature@{} count {now} changed by {delta}", f.short));
        zap::update(&mut self.zap(txg, self.counts_of(f.kind)), f.name().as_bytes(), &new.to_le_bytes())?;
        Ok(if new == 0 { State::Enabled } else { State::Active(new) })
    }

    /// Every feature the pool records, known or not: (full name, kind, count).
    pub fn all(&self) -> Result<Vec<(String, Kind, u64)>> {
        let mut out = Vec::new();
        for kind in [Kind::Read, Kind::Write] {
            let z = self.zap(Txg::ZERO, self.counts_of(kind));
            let mut from = 0;
            loop {
                let page = zap::list(&z, from, 256)?;
                let Some(last) = page.last() else { break };
                from = last.position + 1;
                for e in &page {
                    let name = String::from_utf8(e.name.clone()).map_err(|_| Error::Corrupt("a feature name that is not UTF-8".into()))?;
                    check_name(&name).map_err(Error::Corrupt)?;
                    let count = <[u8; 8]>::try_from(&e.value[..]).map(u64::from_le_bytes).map_err(|_| Error::Corrupt(format!("feature {name}: a count of {} bytes", e.value.len())))?;
                    out.push((name, kind, count));
                }
            }
        }
        Ok(out)
    }

    /// The active features of each kind, as the label config lists them.
    pub fn active_lists(&self) -> Result<(Vec<String>, Vec<String>)> {
        let all = self.all()?;
        let pick = |k: Kind| all.iter().filter(|(_, kind, n)| *kind == k && *n > 0).map(|(name, ..)| name.clone()).collect();
        Ok((pick(Kind::Read), pick(Kind::Write)))
    }
}

#[cfg(test)]
mod tests;
