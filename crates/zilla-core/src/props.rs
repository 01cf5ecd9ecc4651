//! Volume properties with ZFS names and values (ARCHITECTURE.md section 4).
//!
//! A volume stores only its *local* values (the on-disk form: name -> string); everything
//! else is the default. `get` reports SOURCE as `local` or `default` (or `-` for
//! read-only statistics), as `zfs get` does.
//!
//! The data path never reads a string: every `set` (and every decode) recomputes the
//! typed [`VolumeProps`], a small `Copy` struct of enums. A volume publishes its
//! [`PropSet`] as one `Arc` ([`PublishedProps`]): a `set` builds the next set aside and
//! swaps the `Arc` in (sets are serialised by a writer lock); a reader on the I/O path
//! loads the current `Arc` without a lock and without an allocation (`arc-swap`) and
//! copies the typed values out. No string compare per I/O.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::block::checksum::ChecksumAlgo;
use crate::block::compress::Compression;
use crate::{Error, Result};

/// `sync`: when a write is on stable storage before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// FUA writes and flushes are honoured.
    #[default]
    Standard,
    /// Every write is treated as FUA.
    Always,
    /// FUA and flushes are acknowledged without waiting (data at risk).
    Disabled,
}

/// `logbias`: where synchronous writes go (latency: the log device; throughput: the pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogBias {
    #[default]
    Latency,
    Throughput,
}

/// `primarycache` / `secondarycache`: what the cache may hold for this volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    #[default]
    All,
    Metadata,
    None,
}

/// Every settable property of a volume, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeProps {
    pub sync: SyncPolicy,
    pub logbias: LogBias,
    /// Write cache enabled as seen by initiators (SCSI WCE bit).
    pub wce: bool,
    pub primarycache: CachePolicy,
    pub secondarycache: CachePolicy,
    pub compression: Compression,
    pub checksum: ChecksumAlgo,
    pub readonly: bool,
}

impl Default for VolumeProps {
    fn default() -> Self {
        VolumeProps {
            sync: SyncPolicy::Standard,
            logbias: LogBias::Latency,
            wce: false,
            primarycache: CachePolicy::All,
            secondarycache: CachePolicy::All,
            compression: Compression::Off,
            checksum: ChecksumAlgo::Fletcher4,
            readonly: false,
        }
    }
}

impl VolumeProps {
    /// Apply one validated (normalised) value; unknown names and values are ignored so
    /// a decoded record with a newer property never fails.
    fn apply(&mut self, name: &str, v: &str) {
        let cache = |v: &str| match v {
            "metadata" => CachePolicy::Metadata,
            "none" => CachePolicy::None,
            _ => CachePolicy::All,
        };
        match name {
            "sync" => {
                self.sync = match v {
                    "always" => SyncPolicy::Always,
                    "disabled" => SyncPolicy::Disabled,
                    _ => SyncPolicy::Standard,
                }
            }
            "logbias" => self.logbias = if v == "throughput" { LogBias::Throughput } else { LogBias::Latency },
            "wce" => self.wce = v == "on",
            "primarycache" => self.primarycache = cache(v),
            "secondarycache" => self.secondarycache = cache(v),
            "compression" => self.compression = parse_compression(v).unwrap_or(Compression::Off),
            "checksum" => self.checksum = ChecksumAlgo::from_prop(v).unwrap_or(ChecksumAlgo::Fletcher4),
            "readonly" => self.readonly = v == "on",
            _ => {}
        }
    }
}

pub struct PropDef {
    pub name: &'static str,
    pub default: &'static str,
    /// Accepted values; empty = special validation in `validate`.
    pub values: &'static [&'static str],
    /// Can be changed after creation.
    pub settable: bool,
    /// Accepted and stored, but nothing acts on it yet: why (shown by `zilla get`).
    pub no_effect_yet: Option<&'static str>,
}

pub const PROPS: &[PropDef] = &[
    PropDef { name: "sync", default: "standard", values: &["standard", "always", "disabled"], settable: true, no_effect_yet: None },
    PropDef { name: "logbias", default: "latency", values: &["latency", "throughput"], settable: true, no_effect_yet: None },
    PropDef { name: "wce", default: "off", values: &["off", "on"], settable: true, no_effect_yet: None },
    PropDef { name: "primarycache", default: "all", values: &["all", "metadata", "none"], settable: true, no_effect_yet: None },
    PropDef { name: "secondarycache", default: "all", values: &["all", "metadata", "none"], settable: true, no_effect_yet: None },
    PropDef { name: "compression", default: "off", values: &[], settable: true, no_effect_yet: None },
    PropDef { name: "checksum", default: "on", values: &["on", "fletcher4", "blake3", "sha256", "off"], settable: true, no_effect_yet: None },
    PropDef { name: "readonly", default: "off", values: &["off", "on"], settable: true, no_effect_yet: None },
    PropDef { name: "refreservation", default: "none", values: &[], settable: true, no_effect_yet: None },
    PropDef { name: "shareiscsi", default: "on", values: &["on", "off"], settable: true, no_effect_yet: None },
];

/// Internal properties: kept with the volume for the product itself (the iSCSI
/// persistent reservations of a volume whose initiators asked for them to survive a
/// restart). `get` does not list them and `set` refuses them (`validate` does not
/// know them); only the pool's own callers write them, through [`PropSet::set`].
pub const INTERNAL_PROPS: &[&str] = &["_iscsi_pr", "_creation"];
/// Longest value of an internal property (bytes).
pub const INTERNAL_VALUE_MAX_BYTES: usize = 64 << 10;

/// `name` is an internal property.
pub fn is_internal(name: &str) -> bool {
    INTERNAL_PROPS.contains(&name)
}

/// Read-only / create-time properties reported by `get` but not in `PROPS`.
pub const READONLY_PROPS: &[&str] =
    &[
        "volsize", "volblocksize", "used", "logicalused", "referenced", "available", "usedbyrefreservation", "usedbydataset", "createtxg",
        "objsetid", "type", "name", "creation", "compressratio", "logicalreferenced",
    ];

/// Properties a dataset does not inherit from its parent (zfs: space limits and
/// sizes are per dataset); every other one, and every name this build does not know
/// (user properties), is inherited.
pub const NOT_INHERITED: &[&str] = &["quota", "refquota", "reservation", "refreservation", "volsize", "volblocksize"];

/// Whether a dataset without a local value of `name` takes its parent's.
pub fn inheritable(name: &str) -> bool {
    !NOT_INHERITED.contains(&name) && !READONLY_PROPS.contains(&name) && !is_internal(name)
}

/// `refreservation` as stored: `none`, or bytes. (`auto`, accepted by `validate`, is
/// resolved by the pool from the volume's size before it is stored.)
pub fn refreservation_bytes(value: &str) -> u64 {
    value.parse().unwrap_or(0)
}

/// `refreservation` values: `none` (or 0), `auto`, or a size (`10G`, `1.5T`, `4096`:
/// powers of 1024, as zfs). Normalised to `none`, `auto` or bytes.
fn validate_refreservation(value: &str) -> Result<String> {
    let v = value.trim().to_ascii_lowercase();
    if v == "none" || v == "auto" {
        return Ok(v);
    }
    match parse_size(&v) {
        Some(0) => Ok("none".into()),
        Some(n) => Ok(n.to_string()),
        None => Err(Error::invalid(format!("bad value '{value}' for property 'refreservation': expected none, auto or a size such as 10G"))),
    }
}

/// A size such as `10G`, `512M`, `1.5T` or `4096` (powers of 1024; `B`/`iB` after the
/// suffix allowed); `None` if it is not one or does not fit in 64 bits.
pub fn parse_size(v: &str) -> Option<u64> {
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (num, suffix) = v.split_at(split);
    if num.is_empty() || num == "." {
        return None;
    }
    let suffix = suffix.trim().to_ascii_uppercase();
    let unit = match suffix.as_str() {
        "" | "B" => 0,
        s => {
            let mut chars = s.chars();
            let letter = chars.next()?;
            if !matches!(chars.as_str(), "" | "B" | "IB") {
                return None;
            }
            1 + "KMGTPE".find(letter)? as u32
        }
    };
    let mult = 1u128 << (10 * unit);
    let value = if num.contains('.') {
        let f: f64 = num.parse().ok()?;
        let x = f * mult as f64;
        (x.is_finite() && x <= u64::MAX as f64).then(|| x.round() as u128)?
    } else {
        num.parse::<u128>().ok()?.checked_mul(mult)?
    };
    u64::try_from(value).ok()
}

pub fn find(name: &str) -> Option<&'static PropDef> {
    PROPS.iter().find(|p| p.name == name)
}

/// Normalize and validate `value` for property `name`.
pub fn validate(name: &str, value: &str) -> Result<String> {
    let def = find(name).ok_or_else(|| {
        if READONLY_PROPS.contains(&name) {
            Error::invalid(format!("'{name}' is readonly"))
        } else {
            Error::invalid(format!("unknown property '{name}'"))
        }
    })?;
    if name == "refreservation" {
        return validate_refreservation(value);
    }
    let v = value.trim().to_ascii_lowercase();
    if name == "compression" {
        return parse_compression(&v).map(|_| v.clone());
    }
    if def.values.contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(Error::invalid(format!(
            "bad value '{value}' for property '{name}': expected one of {}",
            def.values.join(", ")
        )))
    }
}

/// compression values: off | on (= lz4) | lz4 | zstd | zstd-N (1..=19)
pub fn parse_compression(v: &str) -> Result<crate::block::compress::Compression> {
    use crate::block::compress::Compression;
    match v {
        "off" => Ok(Compression::Off),
        "on" | "lz4" => Ok(Compression::Lz4),
        "zstd" => Ok(Compression::Zstd(3)),
        _ => {
            if let Some(n) = v.strip_prefix("zstd-") {
                if let Ok(level) = n.parse::<u8>() {
                    if (1..=19).contains(&level) {
                        return Ok(Compression::Zstd(level));
                    }
                }
            }
            Err(Error::invalid(format!(
                "bad value '{v}' for property 'compression': expected off, lz4, zstd or zstd-1..zstd-19"
            )))
        }
    }
}

/// Local property values of one volume, and their typed form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PropSet {
    /// The on-disk form: property name -> normalised value, local values only.
    local: BTreeMap<String, String>,
    typed: VolumeProps,
}

impl PropSet {
    /// From decoded local values (values that do not parse fall back to the default).
    pub fn from_local(local: BTreeMap<String, String>) -> PropSet {
        let mut typed = VolumeProps::default();
        for (k, v) in &local {
            typed.apply(k, v);
        }
        PropSet { local, typed }
    }
    pub fn local(&self) -> &BTreeMap<String, String> {
        &self.local
    }
    /// The typed values the data path reads (a copy: no allocation).
    pub fn typed(&self) -> VolumeProps {
        self.typed
    }
    pub fn get(&self, name: &str) -> (String, &'static str) {
        match self.local.get(name) {
            Some(v) => (v.clone(), "local"),
            None => (find(name).map(|d| d.default).unwrap_or("-").to_string(), "default"),
        }
    }
    pub fn value(&self, name: &str) -> String {
        self.get(name).0
    }
    /// Set a property (an internal one too: an empty value removes it).
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        if is_internal(name) {
            if value.len() > INTERNAL_VALUE_MAX_BYTES || value.chars().any(|c| c.is_control()) {
                return Err(Error::invalid(format!("value of internal property '{name}' out of range ({} bytes)", value.len())));
            }
            if value.is_empty() {
                self.local.remove(name);
            } else {
                self.local.insert(name.to_string(), value.to_string());
            }
            return Ok(());
        }
        let v = validate(name, value)?;
        self.typed.apply(name, &v);
        self.local.insert(name.to_string(), v);
        Ok(())
    }
}

/// A volume's properties as its readers see them: one `Arc<PropSet>`, swapped whole on
/// every `set`. Readers never block a `set` and a `set` never blocks them.
pub struct PublishedProps {
    current: ArcSwap<PropSet>,
    /// Serialises `set`s, so two concurrent sets cannot lose one another's change.
    writer: Mutex<()>,
}

impl PublishedProps {
    pub fn new(props: PropSet) -> PublishedProps {
        PublishedProps { current: ArcSwap::from_pointee(props), writer: Mutex::new(()) }
    }
    /// The typed values, for the I/O path: a lock-free load of the current set and a
    /// copy of its `Copy` typed form (no allocation).
    pub fn typed(&self) -> VolumeProps {
        self.current.load().typed
    }
    /// The current set (for `get`, and to persist it in the MOS).
    pub fn snapshot(&self) -> Arc<PropSet> {
        self.current.load_full()
    }
    /// Validate and set one property, then publish the new set. An invalid value
    /// leaves the published set alone.
    pub fn set(&self, name: &str, value: &str) -> Result<()> {
        let _w = self.writer.lock();
        let mut next = PropSet::clone(&self.current.load());
        next.set(name, value)?;
        self.current.store(Arc::new(next));
        Ok(())
    }
}

impl std::fmt::Debug for PublishedProps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self.current.load(), f)
    }
}

/// One `zilla get` row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PropRow {
    pub name: String,
    pub property: String,
    pub value: String,
    pub source: String,
    /// Set for properties that are stored but not acted on yet: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_props_swap_one_arc_per_set() {
        let p = PublishedProps::new(PropSet::default());
        let before = p.snapshot();
        p.set("sync", "always").unwrap();
        assert_eq!(p.typed().sync, SyncPolicy::Always);
        // the old snapshot is untouched: a set publishes a new Arc, it does not mutate
        assert_eq!(before.typed().sync, SyncPolicy::Standard);
        assert!(!Arc::ptr_eq(&before, &p.snapshot()));
        // a refused value publishes nothing
        let now = p.snapshot();
        assert!(p.set("sync", "sometimes").is_err());
        assert!(Arc::ptr_eq(&now, &p.snapshot()));
        // concurrent sets of different properties do not lose one another
        std::thread::scope(|s| {
            s.spawn(|| for _ in 0..200 { p.set("readonly", "on").unwrap() });
            s.spawn(|| for _ in 0..200 { p.set("primarycache", "metadata").unwrap() });
            s.spawn(|| for _ in 0..2000 { let _ = p.typed(); });
        });
        let t = p.typed();
        assert!(t.readonly && t.primarycache == CachePolicy::Metadata && t.sync == SyncPolicy::Always);
    }

    #[test]
    fn refreservation_values() {
        assert_eq!(validate("refreservation", "none").unwrap(), "none");
        assert_eq!(validate("refreservation", "AUTO").unwrap(), "auto");
        assert_eq!(validate("refreservation", "0").unwrap(), "none");
        assert_eq!(validate("refreservation", "10G").unwrap(), (10u64 << 30).to_string());
        assert_eq!(validate("refreservation", "1.5k").unwrap(), "1536");
        assert_eq!(validate("refreservation", "64MiB").unwrap(), (64u64 << 20).to_string());
        assert_eq!(validate("refreservation", "4096").unwrap(), "4096");
        for bad in ["", "ten", "10X", "1.2.3G", "-5M", "99999999999E"] {
            assert!(validate("refreservation", bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(refreservation_bytes("none"), 0);
        assert_eq!(refreservation_bytes("4096"), 4096);
    }

    #[test]
    fn internal_properties_are_kept_but_not_user_settable() {
        let mut p = PropSet::default();
        assert!(validate("_iscsi_pr", "x").is_err(), "users cannot set it");
        p.set("_iscsi_pr", "zpr1 1 0 -").unwrap();
        assert_eq!(p.local().get("_iscsi_pr").map(String::as_str), Some("zpr1 1 0 -"));
        assert!(p.set("_iscsi_pr", &"x".repeat(INTERNAL_VALUE_MAX_BYTES + 1)).is_err());
        assert!(!PROPS.iter().any(|d| is_internal(d.name)), "never listed by get all");
        p.set("_iscsi_pr", "").unwrap();
        assert!(p.local().is_empty());
    }

    #[test]
    fn validation() {
        assert_eq!(validate("sync", "ALWAYS").unwrap(), "always");
        assert!(validate("sync", "sometimes").is_err());
        assert!(validate("nosuch", "x").is_err());
        assert!(validate("volsize", "1G").is_err());
        assert!(validate("compression", "zstd-7").is_ok());
        assert!(validate("compression", "zstd-70").is_err());
        let mut p = PropSet::default();
        assert_eq!(p.get("logbias"), ("latency".to_string(), "default"));
        p.set("logbias", "throughput").unwrap();
        assert_eq!(p.get("logbias"), ("throughput".to_string(), "local"));
        assert_eq!(p.typed().logbias, LogBias::Throughput);
    }

    #[test]
    fn typed_values_follow_every_set_and_decode() {
        let mut p = PropSet::default();
        assert_eq!(p.typed(), VolumeProps::default());
        for (name, value) in [("sync", "always"), ("primarycache", "metadata"), ("compression", "zstd-7"), ("checksum", "sha256"), ("readonly", "on"), ("wce", "on"), ("secondarycache", "none")] {
            p.set(name, value).unwrap();
        }
        let t = p.typed();
        assert_eq!(t.sync, SyncPolicy::Always);
        assert_eq!(t.primarycache, CachePolicy::Metadata);
        assert_eq!(t.secondarycache, CachePolicy::None);
        assert_eq!(t.compression, Compression::Zstd(7));
        assert_eq!(t.checksum, ChecksumAlgo::Sha256);
        assert!(t.readonly && t.wce);
        assert!(p.set("sync", "sometimes").is_err());
        assert_eq!(p.typed().sync, SyncPolicy::Always, "a refused value changes nothing");
        let decoded = PropSet::from_local(p.local().clone());
        assert_eq!(decoded, p);
        // a value that no longer parses (newer or damaged record) decodes to the default
        let odd = PropSet::from_local([("sync".to_string(), "sometimes".to_string())].into());
        assert_eq!(odd.typed().sync, SyncPolicy::Standard);
    }
}
