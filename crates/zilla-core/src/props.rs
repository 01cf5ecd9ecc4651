//! Volume properties with ZFS names and values (ARCHITECTURE.md section 4).
//!
//! A volume stores only its *local* values; everything else is the default. `get`
//! reports SOURCE as `local` or `default` (or `-` for read-only statistics), as
//! `zfs get` does.

use std::collections::BTreeMap;

use crate::{Error, Result};

pub struct PropDef {
    pub name: &'static str,
    pub default: &'static str,
    /// Accepted values; empty = special validation in `validate`.
    pub values: &'static [&'static str],
    /// Can be changed after creation.
    pub settable: bool,
}

pub const PROPS: &[PropDef] = &[
    PropDef { name: "sync", default: "standard", values: &["standard", "always", "disabled"], settable: true },
    PropDef { name: "logbias", default: "latency", values: &["latency", "throughput"], settable: true },
    PropDef { name: "wce", default: "off", values: &["off", "on"], settable: true },
    PropDef { name: "primarycache", default: "all", values: &["all", "metadata", "none"], settable: true },
    PropDef { name: "secondarycache", default: "all", values: &["all", "metadata", "none"], settable: true },
    PropDef { name: "compression", default: "off", values: &[], settable: true },
    PropDef { name: "checksum", default: "on", values: &["on", "fletcher4", "blake3", "sha256", "off"], settable: true },
    PropDef { name: "readonly", default: "off", values: &["off", "on"], settable: true },
];

/// Read-only / create-time properties reported by `get` but not in `PROPS`.
pub const READONLY_PROPS: &[&str] = &["volsize", "volblocksize", "used", "logicalused", "referenced"];

pub fn find(name: &str) -> Option<&'static PropDef> {
    PROPS.iter().find(|p| p.name == name)
}

/// Normalize and validate `value` for property `name`.
pub fn validate(name: &str, value: &str) -> Result<String> {
    let def = find(name).ok_or_else(|| {
        if READONLY_PROPS.contains(&name) {
            Error::invalid(format!("property '{name}' is read-only"))
        } else {
            Error::invalid(format!("unknown property '{name}'"))
        }
    })?;
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
pub fn parse_compression(v: &str) -> Result<crate::zio::compress::Compression> {
    use crate::zio::compress::Compression;
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

/// Local property values of one volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PropSet {
    pub local: BTreeMap<String, String>,
}

impl PropSet {
    pub fn get(&self, name: &str) -> (String, &'static str) {
        match self.local.get(name) {
            Some(v) => (v.clone(), "local"),
            None => (find(name).map(|d| d.default).unwrap_or("-").to_string(), "default"),
        }
    }
    pub fn value(&self, name: &str) -> String {
        self.get(name).0
    }
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let v = validate(name, value)?;
        self.local.insert(name.to_string(), v);
        Ok(())
    }
}

/// One `zilla get` row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PropRow {
    pub name: String,
    pub property: String,
    pub value: String,
    pub source: String,
}

#[cfg(test)]
mod tests {
    use super::*;
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
    }
}
