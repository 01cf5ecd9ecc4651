//! kstat: counters, power-of-two latency histograms and tunables.
//!
//! Theory of operation
//! -------------------
//! Every subsystem keeps its statistics in plain atomics so that recording a stat on
//! the data path never takes a lock. Latency histograms use the buckets of
//! `zpool iostat -w`: bucket `i` counts samples in `[2^i, 2^(i+1))` nanoseconds, 0..=36
//! (up to ~68 s; larger samples land in the last bucket). Analytics and the front ends'
//! recorders use finer buckets, four per power of two ([`buckets`]), that fold into
//! these exactly.
//!
//! Tunables are process-wide (as OpenZFS module parameters are). kstat imports nothing
//! from the rest of the crate: each module that owns tunables declares them as typed
//! statics (`pub static ZFS_TXG_TIMEOUT: Tunable = Tunable::new(..)`) with a default, a
//! valid range, what a change does ([`Applies`]) and a one-line description naming where
//! the default comes from. The crate root assembles them once into a [`Registry`]
//! (`zilla_core::tunables()`), which the admin API lists and sets by name. The owning
//! module reads its static directly: one relaxed atomic load, no lookup by name, so hot
//! paths may read tunables freely. A value outside `min..=max` is refused with an error
//! that names the range; a name lookup never panics.
//!
//! Where OpenZFS bounds a tunable by what the machine has (zfs_arc_max below physical
//! memory and not below zfs_arc_min, ...), the tunable carries a `bound`: a check run on
//! every change after the range check, refusing the value with the machine's figure
//! named ([`Tunable::bounded`]).

pub mod buckets;

use std::sync::atomic::{AtomicU64, Ordering};
pub const HISTOGRAM_BUCKETS: usize = 37;

/// A log2 latency histogram (nanoseconds) with the sum of its samples, lock-free.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }
}

impl Histogram {
    pub fn bucket_of(value_ns: u64) -> usize {
        let b = 63 - (value_ns | 1).leading_zeros() as usize;
        b.min(HISTOGRAM_BUCKETS - 1)
    }
    pub fn record(&self, value_ns: u64) {
        self.buckets[Self::bucket_of(value_ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(value_ns, Ordering::Relaxed);
    }
    /// The sum of the samples recorded.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }
    pub fn snapshot(&self) -> Vec<u64> {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect()
    }
}

/// When a changed tunable takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// Read on every use: the next I/O, sync or eviction sees the new value.
    Live,
    /// Read when a device is opened (pool create, import, attach, replace).
    NextDeviceOpen,
    /// Read when a pool is created or imported.
    NextPoolOpen,
}

impl Applies {
    pub fn as_str(self) -> &'static str {
        match self {
            Applies::Live => "live",
            Applies::NextDeviceOpen => "next device open",
            Applies::NextPoolOpen => "next pool open",
        }
    }
}

impl std::fmt::Display for Applies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tunable: its definition and its live value.
#[derive(Debug)]
pub struct Tunable {
    /// OpenZFS module-parameter name where one exists.
    pub name: &'static str,
    pub default: u64,
    /// Smallest and largest accepted value (inclusive).
    pub min: u64,
    pub max: u64,
    /// 0 is also accepted and means "computed automatically" (see the description).
    pub zero_is_auto: bool,
    pub applies: Applies,
    /// One line; says where the default comes from.
    pub description: &'static str,
    /// For a mode switch: the name of each value 0, 1, ... (`set` by name or number).
    pub choices: &'static [&'static str],
    /// A check against the machine (RAM, another tunable) run after the range check.
    pub bound: Option<fn(u64) -> Result<(), String>>,
    value: AtomicU64,
}

/// A refused tunable lookup or change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunableError {
    Unknown { name: String },
    OutOfRange { name: &'static str, value: u64, min: u64, max: u64, zero_is_auto: bool },
    /// In range, but beyond what the machine allows: the bound's reason, which names
    /// the value.
    Refused { name: &'static str, value: u64, reason: String },
}

impl std::fmt::Display for TunableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TunableError::Unknown { name } => write!(f, "unknown tunable '{name}'"),
            TunableError::OutOfRange { name, value, min, max, zero_is_auto } => {
                let auto = if *zero_is_auto { "0 (auto) or " } else { "" };
                write!(f, "{name}: value {value} is out of range (allowed {auto}{min} to {max})")
            }
            TunableError::Refused { name, reason, .. } => write!(f, "{name}: {reason}"),
        }
    }
}

impl std::error::Error for TunableError {}

impl Tunable {
    /// A tunable set to its default. `min <= default <= max` is checked at compile time
    /// for statics (a const panic).
    pub const fn new(name: &'static str, default: u64, min: u64, max: u64, applies: Applies, description: &'static str) -> Tunable {
        assert!(min <= default && default <= max, "tunable default outside its range");
        Tunable { name, default, min, max, zero_is_auto: false, applies, description, choices: &[], bound: None, value: AtomicU64::new(default) }
    }

    /// A mode switch: value i means `choices[i]`; the default is `choices[0]`.
    pub const fn new_choice(name: &'static str, choices: &'static [&'static str], applies: Applies, description: &'static str) -> Tunable {
        assert!(!choices.is_empty(), "a mode tunable needs choices");
        let max = choices.len() as u64 - 1;
        Tunable { name, default: 0, min: 0, max, zero_is_auto: false, applies, description, choices, bound: None, value: AtomicU64::new(0) }
    }

    /// The name of the current value of a mode switch (None for a number).
    pub fn choice(&self) -> Option<&'static str> {
        self.choices.get(self.get() as usize).copied()
    }

    /// The value a word names: a choice's name for a mode switch, else None.
    pub fn value_of(&self, word: &str) -> Option<u64> {
        self.choices.iter().position(|c| *c == word).map(|i| i as u64)
    }

    /// A tunable whose default 0 means "computed automatically"; an explicit value must
    /// lie in `min..=max`.
    pub const fn new_auto(name: &'static str, min: u64, max: u64, applies: Applies, description: &'static str) -> Tunable {
        assert!(min <= max, "tunable range empty");
        Tunable { name, default: 0, min, max, zero_is_auto: true, applies, description, choices: &[], bound: None, value: AtomicU64::new(0) }
    }

    /// The same tunable with a check against the machine, run on every change.
    pub const fn bounded(mut self, bound: fn(u64) -> Result<(), String>) -> Tunable {
        self.bound = Some(bound);
        self
    }

    pub fn in_range(&self, value: u64) -> bool {
        (value == 0 && self.zero_is_auto) || (self.min..=self.max).contains(&value)
    }

    /// Current value: one relaxed atomic load.
    #[inline]
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }

    /// Change the value; refused (and unchanged) outside `min..=max` or its bound.
    pub fn set(&self, value: u64) -> Result<(), TunableError> {
        self.check(value)?;
        self.value.store(value, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `set(value)` would be accepted, and why not.
    pub fn check(&self, value: u64) -> Result<(), TunableError> {
        if !self.in_range(value) {
            let (name, min, max, zero_is_auto) = (self.name, self.min, self.max, self.zero_is_auto);
            return Err(TunableError::OutOfRange { name, value, min, max, zero_is_auto });
        }
        if let Some(Err(reason)) = self.bound.map(|b| b(value)) {
            return Err(TunableError::Refused { name: self.name, value, reason });
        }
        Ok(())
    }
}

/// A byte count as a refusal names it: "24G", "1.50G", "512M", "4096" (bytes below
/// 1 KiB), binary units as zfs prints them.
pub fn size_words(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["K", "M", "G", "T", "P", "E"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut unit = 0;
    let mut scaled = bytes as f64 / 1024.0;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    if scaled.fract() == 0.0 {
        format!("{}{}", scaled as u64, UNITS[unit])
    } else {
        format!("{scaled:.2}{}", UNITS[unit])
    }
}

/// Every tunable of the crate by name; built once at the crate root from the modules'
/// statics.
pub struct Registry {
    tunables: &'static [&'static Tunable],
}

/// Longest name quoted back in an error (names come from clients).
const NAME_QUOTE_MAX: usize = 100;

impl Registry {
    pub const fn new(tunables: &'static [&'static Tunable]) -> Registry {
        Registry { tunables }
    }

    /// The tunable called `name`, if any (never panics).
    pub fn find(&self, name: &str) -> Option<&'static Tunable> {
        self.tunables.iter().copied().find(|t| t.name == name)
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        self.find(name).map(Tunable::get)
    }

    pub fn set(&self, name: &str, value: u64) -> Result<(), TunableError> {
        match self.find(name) {
            Some(t) => t.set(value),
            None => Err(TunableError::Unknown { name: name.chars().take(NAME_QUOTE_MAX).collect() }),
        }
    }

    /// Every tunable, sorted by name.
    pub fn list(&self) -> Vec<&'static Tunable> {
        let mut v = self.tunables.to_vec();
        v.sort_by_key(|t| t.name);
        v
    }

    /// Names declared more than once (a test asserts there are none).
    pub fn duplicate_names(&self) -> Vec<&'static str> {
        let names: Vec<&str> = self.list().iter().map(|t| t.name).collect();
        names.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_bound_refuses_in_range_values_with_its_reason() {
        fn even(v: u64) -> Result<(), String> {
            if v % 2 == 0 { Ok(()) } else { Err(format!("value {v} is odd")) }
        }
        static T: Tunable = Tunable::new("zilla_test_even", 2, 0, 10, Applies::Live, "test").bounded(even);
        T.set(4).unwrap();
        let e = T.set(5).unwrap_err();
        assert_eq!(e.to_string(), "zilla_test_even: value 5 is odd");
        assert_eq!(T.get(), 4, "a refused value leaves the tunable as it was");
        assert!(matches!(T.set(11), Err(TunableError::OutOfRange { .. })), "the range is checked first");
        assert_eq!((size_words(512), size_words(24 << 30), size_words(3 << 29), size_words(1 << 40)), ("512".into(), "24G".into(), "1.50G".into(), "1T".into()));
    }

    #[test]
    fn a_mode_switch_is_set_by_name_or_number() {
        static MODE: Tunable = Tunable::new_choice("zilla_test_mode", &["openzfs", "legacy"], Applies::Live, "test");
        assert_eq!((MODE.get(), MODE.choice()), (0, Some("openzfs")));
        assert_eq!(MODE.value_of("legacy"), Some(1));
        assert_eq!(MODE.value_of("fast"), None);
        MODE.set(1).unwrap();
        assert_eq!(MODE.choice(), Some("legacy"));
        assert!(MODE.set(2).is_err(), "a value past the last choice is refused");
        assert_eq!(MODE.choice(), Some("legacy"));
    }

    #[test]
    fn buckets() {
        assert_eq!(Histogram::bucket_of(0), 0);
        assert_eq!(Histogram::bucket_of(1), 0);
        assert_eq!(Histogram::bucket_of(2), 1);
        assert_eq!(Histogram::bucket_of(1023), 9);
        assert_eq!(Histogram::bucket_of(1024), 10);
        assert_eq!(Histogram::bucket_of(u64::MAX), HISTOGRAM_BUCKETS - 1);
    }

    static T_A: Tunable = Tunable::new("t_a", 5, 1, 10, Applies::Live, "test");
    static T_B: Tunable = Tunable::new("t_b", 0, 0, 0, Applies::NextPoolOpen, "test");
    static T_C: Tunable = Tunable::new_auto("t_c", 100, 200, Applies::Live, "test");
    static REG: Registry = Registry::new(&[&T_B, &T_A, &T_C]);

    #[test]
    fn registry_lookup_set_and_ranges() {
        assert_eq!(REG.get("t_a"), Some(5));
        assert!(REG.get("no_such_tunable").is_none());
        assert_eq!(REG.set("no_such_tunable", 1), Err(TunableError::Unknown { name: "no_such_tunable".into() }));
        let long = "x".repeat(5000);
        let e = REG.set(&long, 1).unwrap_err().to_string();
        assert!(e.len() < 150, "{e}");
        let e = REG.set("t_a", 0).unwrap_err();
        assert_eq!(e.to_string(), "t_a: value 0 is out of range (allowed 1 to 10)");
        assert_eq!(REG.set("t_a", 11).unwrap_err(), TunableError::OutOfRange { name: "t_a", value: 11, min: 1, max: 10, zero_is_auto: false });
        assert_eq!(T_A.get(), 5, "a refused value leaves the tunable unchanged");
        REG.set("t_a", 10).unwrap();
        assert_eq!(T_A.get(), 10);
        assert_eq!(REG.list().iter().map(|t| t.name).collect::<Vec<_>>(), ["t_a", "t_b", "t_c"]);
        assert_eq!(REG.set("t_c", 99).unwrap_err().to_string(), "t_c: value 99 is out of range (allowed 0 (auto) or 100 to 200)");
        REG.set("t_c", 150).unwrap();
        REG.set("t_c", 0).unwrap();
        assert_eq!(T_C.get(), 0);
        assert!(REG.duplicate_names().is_empty());
    }
}
