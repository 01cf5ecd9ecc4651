//! The statistics, their breakdowns, and what each dataset costs in memory.
//!
//! A dataset is a statistic broken down by one breakdown, named `STATISTIC/BREAKDOWN`
//! (`io.latency/op`). Its memory cost is the bound of its history: every point has an
//! encoded size limit (`point_bytes_max`, set by the kind and by how many keys the
//! breakdown can have), and the history holds a fixed number of points.

use serde::Serialize;

use super::history;

/// Counter (events or bytes per second) or histogram (events per bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Counter,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// One statistic of the catalog.
#[derive(Debug, Serialize)]
pub struct Statistic {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: &'static str,
    pub breakdowns: &'static [&'static str],
    pub description: &'static str,
}

const FRONT_END: &[&str] = &["none", "op", "volume", "client", "protocol", "volume+op"];
const DISK: &[&str] = &["none", "device", "class", "op"];

/// Every statistic, in the order the API lists them.
pub static STATISTICS: &[Statistic] = &[
    Statistic { name: "io.ops", kind: Kind::Counter, unit: "ops/s", breakdowns: FRONT_END, description: "Front-end requests (NBD and iSCSI)" },
    Statistic { name: "io.bytes", kind: Kind::Counter, unit: "B/s", breakdowns: FRONT_END, description: "Front-end bytes transferred (NBD and iSCSI)" },
    Statistic { name: "io.latency", kind: Kind::Histogram, unit: "ns", breakdowns: FRONT_END, description: "Front-end request latency (NBD and iSCSI)" },
    Statistic { name: "io.size", kind: Kind::Histogram, unit: "bytes", breakdowns: FRONT_END, description: "Front-end request size (NBD and iSCSI)" },
    Statistic { name: "disk.ops", kind: Kind::Counter, unit: "ops/s", breakdowns: DISK, description: "Device I/Os" },
    Statistic { name: "disk.bytes", kind: Kind::Counter, unit: "B/s", breakdowns: DISK, description: "Device bytes transferred" },
    Statistic { name: "disk.latency", kind: Kind::Histogram, unit: "ns", breakdowns: DISK, description: "Device I/O latency" },
    Statistic { name: "arc.accesses", kind: Kind::Counter, unit: "/s", breakdowns: &["none", "result"], description: "ARC accesses" },
    Statistic { name: "zil.commits", kind: Kind::Counter, unit: "/s", breakdowns: &["none", "volume"], description: "Intent log commits" },
    Statistic { name: "txg.syncs", kind: Kind::Counter, unit: "/s", breakdowns: &["none", "pool"], description: "Transaction group syncs" },
];

/// Datasets enabled when nothing else was chosen.
pub const DEFAULT_DATASETS: &[&str] = &["io.ops/op", "io.latency/op", "disk.latency/device"];

/// Most keys a point keeps (the busiest), the rest summed into [`OTHER_KEY`].
pub const KEYS_PER_POINT_MAX: usize = 64;
/// The key overflow is summed into (also an `op` key of its own: both mean the rest).
pub const OTHER_KEY: &str = "other";

/// A breakdown: what its keys are, and how many there can be (None: open-ended).
fn breakdown_keys_max(breakdown: &str) -> Option<usize> {
    match breakdown {
        "none" => Some(1),
        "op" | "class" => Some(6),
        "protocol" => Some(2),
        "result" => Some(4),
        _ => None,
    }
}

fn breakdown_phrase(breakdown: &str) -> Option<&'static str> {
    Some(match breakdown {
        "op" => "operation",
        "volume" => "volume",
        "client" => "client",
        "protocol" => "protocol",
        "volume+op" => "volume and operation",
        "device" => "device",
        "class" => "I/O class",
        "result" => "result",
        "pool" => "pool",
        _ => return None,
    })
}

/// A dataset of the catalog: a statistic and one of its breakdowns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DatasetId {
    /// Index into [`STATISTICS`].
    stat: u8,
    /// Index into the statistic's breakdowns.
    breakdown: u8,
}

impl DatasetId {
    /// Parse `STATISTIC/BREAKDOWN`; None for anything not in the catalog.
    pub fn parse(name: &str) -> Option<DatasetId> {
        let (stat, breakdown) = name.split_once('/')?;
        DatasetId::from_parts(stat, breakdown)
    }

    /// The dataset of `statistic` by `breakdown`; None if either is unknown.
    pub fn from_parts(statistic: &str, breakdown: &str) -> Option<DatasetId> {
        let s = STATISTICS.iter().position(|s| s.name == statistic)?;
        let b = STATISTICS[s].breakdowns.iter().position(|b| *b == breakdown)?;
        Some(DatasetId { stat: s as u8, breakdown: b as u8 })
    }

    /// Every dataset of the catalog.
    pub fn all() -> impl Iterator<Item = DatasetId> {
        STATISTICS.iter().enumerate().flat_map(|(s, st)| (0..st.breakdowns.len()).map(move |b| DatasetId { stat: s as u8, breakdown: b as u8 }))
    }

    pub fn statistic(self) -> &'static Statistic {
        &STATISTICS[self.stat as usize]
    }

    pub fn breakdown(self) -> &'static str {
        self.statistic().breakdowns[self.breakdown as usize]
    }

    pub fn kind(self) -> Kind {
        self.statistic().kind
    }

    /// `STATISTIC/BREAKDOWN`.
    pub fn name(self) -> String {
        format!("{}/{}", self.statistic().name, self.breakdown())
    }

    pub fn is_default(self) -> bool {
        DEFAULT_DATASETS.iter().any(|d| DatasetId::parse(d) == Some(self))
    }

    /// What the dataset shows, in a sentence fragment.
    pub fn description(self) -> String {
        match breakdown_phrase(self.breakdown()) {
            Some(p) => format!("{}, by {p}", self.statistic().description),
            None => self.statistic().description.to_string(),
        }
    }

    /// Most keys one point of this dataset holds, `other` included.
    pub fn keys_max(self) -> usize {
        breakdown_keys_max(self.breakdown()).unwrap_or(KEYS_PER_POINT_MAX + 1)
    }

    /// Largest encoded point of this dataset (see history.rs for the encoding): room
    /// for every key of a closed breakdown at its largest, a budget for open ones; a
    /// histogram point always has room for one key with every bucket.
    pub fn point_bytes_max(self) -> usize {
        let keys = self.keys_max();
        match self.kind() {
            Kind::Counter => (history::POINT_HEADER_BYTES_MAX + keys * history::COUNTER_SERIES_BYTES_MAX).min(COUNTER_POINT_BYTES_CAP),
            Kind::Histogram => (keys * HISTOGRAM_KEY_BYTES).clamp(history::HISTOGRAM_POINT_BYTES_MIN, HISTOGRAM_POINT_BYTES_CAP),
        }
    }

    /// The most memory this dataset's history can take (its cost when enabled).
    pub fn memory_max_bytes(self) -> u64 {
        history::memory_max_bytes(self.point_bytes_max())
    }
}

/// Budget of an open breakdown's counter point: 64 keys at ~8 bytes each.
const COUNTER_POINT_BYTES_CAP: usize = 512;
/// Budget per key of a histogram point: ~30 buckets at ~3 bytes each.
const HISTOGRAM_KEY_BYTES: usize = 96;
/// Budget of an open breakdown's histogram point.
const HISTOGRAM_POINT_BYTES_CAP: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_and_defaults() {
        for d in DEFAULT_DATASETS {
            let id = DatasetId::parse(d).expect(d);
            assert_eq!(id.name(), *d);
            assert!(id.is_default());
        }
        let id = DatasetId::parse("io.ops/volume+op").unwrap();
        assert_eq!((id.statistic().name, id.breakdown(), id.kind()), ("io.ops", "volume+op", Kind::Counter));
        assert_eq!(DatasetId::parse("io.latency/op").unwrap().description(), "Front-end request latency (NBD and iSCSI), by operation");
        assert_eq!(DatasetId::parse("txg.syncs/none").unwrap().description(), "Transaction group syncs");
        for bad in ["", "/", "io.ops", "io.ops/", "/op", "io.ops/device", "arc.accesses/op", "io.ops/op/x", "nope/none"] {
            assert_eq!(DatasetId::parse(bad), None, "{bad}");
        }
        assert_eq!(DatasetId::all().count(), STATISTICS.iter().map(|s| s.breakdowns.len()).sum::<usize>());
    }

    #[test]
    fn memory_costs() {
        let total: u64 = DEFAULT_DATASETS.iter().map(|d| DatasetId::parse(d).unwrap().memory_max_bytes()).sum();
        assert!(total < super::super::MEMORY_MAX_BYTES_DEFAULT / 2, "the defaults take {total} bytes");
        for id in DatasetId::all() {
            let p = id.point_bytes_max();
            if id.kind() == Kind::Histogram {
                assert!(p >= history::HISTOGRAM_POINT_BYTES_MIN);
            } else {
                assert!(p >= history::POINT_HEADER_BYTES_MAX + history::COUNTER_SERIES_BYTES_MAX);
            }
            assert!(id.memory_max_bytes() > 0);
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics(s in ".*") {
            let _ = DatasetId::parse(&s);
        }
    }
}
