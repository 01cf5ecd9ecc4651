//! analytics: the history of the statistics the web UI draws, one point a second.
//!
//! Theory of operation
//! -------------------
//! A *statistic* (front-end op rate, request latency, device latency, ...) broken down
//! by one *breakdown* (op, volume, client, device, ...) is a *dataset*, named
//! `STATISTIC/BREAKDOWN` (`io.latency/op`); the catalog ([`catalog`]) lists every one,
//! with its kind (counter or histogram) and unit. Datasets are enabled and disabled at
//! run time; three are on by default. The [`Store`] keeps, per enabled dataset:
//!
//! ```text
//!   collector ──ingest(second, Sample)──> Store
//!                                           │  per enabled dataset (history.rs)
//!                                           ├─ second ring  3600 points  (1 hour)
//!                                           ├─ minute ring 10080 points  (7 days)
//!                                           ├─ the minute being summed (sum of its seconds)
//!                                           └─ key table (breakdown keys by id)
//!   HTTP ──query / latest / datasets──────> Store  (answers in the API's JSON shapes)
//!   daemon ──save / load────────────────── state-dir file (persist.rs: minutes only)
//! ```
//!
//! Once a second a collector (outside the engine) hands [`Store::ingest`] a [`Sample`]:
//! per dataset, the keys' counter deltas or sparse histogram deltas in the log-linear
//! buckets of [`buckets`]. Each dataset's values become one encoded point: the busiest
//! 64 keys kept, the rest summed into `other`, histograms sparse, and the point never
//! over its dataset's byte budget (keys move into `other` until it fits). A minute
//! point is the sum of its seconds, written when the first second of the next minute
//! arrives. A second without a sample is a hole (null in a query), never a zero.
//!
//! Memory: a dataset's cost is the bound of its history (points × budget, slots, key
//! table), stated in the catalog before it is enabled; enabling a dataset whose cost
//! would take the enabled datasets past `memory_max_bytes` (128 MiB by default) is
//! refused with the numbers. Disabling one frees its history.
//!
//! Time: the collector stamps samples with monotonic seconds (the Env's `now_ns`). The
//! store maps them to unix seconds from one anchor taken when it starts:
//! `unix = anchor_unix + (mono - anchor_mono)`, so a wall-clock jump while running
//! neither loses nor reorders points (the time axis drifts from the wall clock by the
//! jump until the next start). Loading a saved history within its newest minute (the
//! one being summed at the stop, saved with its end still ahead) goes on summing that
//! minute; loading it with the wall clock gone back across a restart moves the anchor,
//! so new minutes come strictly after saved ones; a
//! file more than [`CLOCK_BEHIND_MAX_S`] ahead of the wall clock (saved under a clock
//! set far ahead) is refused instead, or every point after it would stay misdated.
//!
//! The store is a plain value: the caller serialises access (one mutex) and runs the
//! once-a-second collection and the periodic save.

pub use crate::kstat::buckets;
pub mod catalog;
pub mod history;
mod persist;
pub mod query;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::env::Env;
use catalog::{DatasetId, Kind, Statistic, STATISTICS};
use history::History;

pub use catalog::DEFAULT_DATASETS;
pub use history::{QuerySeries, Sample, SparseBuckets, Value, MINUTE_POINTS, SECOND_POINTS};
pub use query::{LiveDataset, LiveSeries, Query, QueryAnswer, QUERY_KEYS_MAX, QUERY_POINTS_MAX};

/// How far behind the newest saved minute the wall clock may be at start for the time
/// axis to be moved past it; a file further ahead is refused.
pub const CLOCK_BEHIND_MAX_S: u64 = 86_400;

/// Default bound of the enabled datasets' history memory.
pub const MEMORY_MAX_BYTES_DEFAULT: u64 = 128 << 20;

/// What the store refuses, and why.
#[derive(Debug, thiserror::Error)]
pub enum AnalyticsError {
    /// Not a `STATISTIC/BREAKDOWN` of the catalog (HTTP 404).
    #[error("unknown dataset {0:?} (datasets are STATISTIC/BREAKDOWN, e.g. io.latency/op)")]
    UnknownDataset(String),
    /// Enabling would pass the memory bound (HTTP 409).
    #[error(
        "enabling {dataset} needs {needed_bytes} bytes of history memory, but the enabled datasets \
         already take {used_bytes} of the {max_bytes} allowed: disable another dataset first"
    )]
    MemoryExceeded { dataset: String, needed_bytes: u64, used_bytes: u64, max_bytes: u64 },
    /// A query the store cannot answer as asked (HTTP 400).
    #[error("{0}")]
    BadQuery(String),
    /// A sample for a second not after the last one ingested.
    #[error("second {unix_s} (unix) is not after the last second ingested ({last_unix_s})")]
    OutOfOrder { unix_s: u64, last_unix_s: u64 },
}

/// Why a saved history was not loaded (the caller logs it, moves the file aside and
/// starts empty).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read the analytics history file: {0}")]
    Io(std::io::Error),
    #[error("the analytics history file is {bytes} bytes, more than the history bound of {max_bytes}")]
    TooLarge { bytes: u64, max_bytes: u64 },
    #[error("the analytics history file is not usable: {0}")]
    Corrupt(String),
    #[error("a saved history is loaded before the first sample, not after")]
    AfterIngest,
}

/// What a load restored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// False when there was no file (the store kept its datasets).
    pub file_found: bool,
    /// Datasets enabled from the file, and their minute points.
    pub datasets: Vec<String>,
    pub minutes: usize,
    /// Datasets in the file left disabled because they would pass the memory bound.
    pub skipped_over_memory: Vec<String>,
    /// Seconds the time axis was moved forward past the wall clock, because the wall
    /// clock is behind the newest saved minute.
    pub clock_shift_s: u64,
}

/// One dataset as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DatasetInfo {
    pub name: String,
    pub statistic: &'static str,
    pub breakdown: &'static str,
    pub kind: Kind,
    pub unit: &'static str,
    pub enabled: bool,
    pub default: bool,
    /// History memory taken now (0 when disabled).
    pub memory_bytes: u64,
    /// The most its history can take: its cost when enabled.
    pub memory_max_bytes: u64,
    pub description: String,
}

/// The history's size, in points.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryBounds {
    pub second_points: usize,
    pub minute_points: usize,
}

/// The answer to `GET /api/v1/analytics/datasets`.
#[derive(Debug, Serialize)]
pub struct DatasetsAnswer {
    pub datasets: Vec<DatasetInfo>,
    pub statistics: &'static [Statistic],
    pub memory_bytes: u64,
    pub memory_max_bytes: u64,
    pub history: HistoryBounds,
    pub buckets: buckets::BucketEdges,
    pub now: u64,
}

/// The analytics history of every enabled dataset (see the module comment).
pub struct Store {
    env: Arc<dyn Env>,
    memory_max_bytes: u64,
    histories: BTreeMap<DatasetId, History>,
    anchor_mono_s: u64,
    anchor_unix_s: u64,
    /// The last second ingested (unix s).
    last_unix_s: Option<u64>,
    /// End of the newest minute of a loaded file (kept for the next save).
    loaded_newest_minute: u64,
    /// After a load, the last second that counts as ingested (unix s): the newest
    /// saved minute's end, or the second of the load when that minute goes on.
    loaded_last_s: u64,
}

impl Store {
    /// A store with the default datasets enabled, its time anchor taken from `env`
    /// now. `memory_max_bytes` bounds the enabled datasets' history memory.
    pub fn new(env: Arc<dyn Env>, memory_max_bytes: u64) -> Store {
        let anchor_mono_s = env.now_ns() / 1_000_000_000;
        let anchor_unix_s = env.unix_time_ns() / 1_000_000_000;
        let mut s = Store { env, memory_max_bytes, histories: BTreeMap::new(), anchor_mono_s, anchor_unix_s, last_unix_s: None, loaded_newest_minute: 0, loaded_last_s: 0 };
        for d in DEFAULT_DATASETS {
            // the defaults fit any bound the daemon accepts; one that does not stays off
            let _ = s.set_enabled(d, true);
        }
        s
    }

    /// The unix second of monotonic second `mono_s` on this store's time axis.
    pub fn unix_of(&self, mono_s: u64) -> u64 {
        match mono_s.checked_sub(self.anchor_mono_s) {
            Some(d) => self.anchor_unix_s.saturating_add(d),
            None => self.anchor_unix_s.saturating_sub(self.anchor_mono_s - mono_s),
        }
    }

    /// Now, on this store's time axis (unix s).
    pub fn now_unix_s(&self) -> u64 {
        self.unix_of(self.env.now_ns() / 1_000_000_000)
    }

    /// Enable or disable a dataset; its description back. Disabling frees its history.
    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> Result<DatasetInfo, AnalyticsError> {
        let id = DatasetId::parse(name).ok_or_else(|| AnalyticsError::UnknownDataset(name.to_string()))?;
        if !enabled {
            self.histories.remove(&id);
        } else if !self.histories.contains_key(&id) {
            let used_bytes = self.memory_committed_bytes();
            let needed_bytes = id.memory_max_bytes();
            if used_bytes.saturating_add(needed_bytes) > self.memory_max_bytes {
                let max_bytes = self.memory_max_bytes;
                return Err(AnalyticsError::MemoryExceeded { dataset: id.name(), needed_bytes, used_bytes, max_bytes });
            }
            self.histories.insert(id, History::new(id));
        }
        Ok(self.info(id))
    }

    /// One dataset's description.
    pub fn dataset(&self, name: &str) -> Result<DatasetInfo, AnalyticsError> {
        DatasetId::parse(name).map(|id| self.info(id)).ok_or_else(|| AnalyticsError::UnknownDataset(name.to_string()))
    }

    fn info(&self, id: DatasetId) -> DatasetInfo {
        let h = self.histories.get(&id);
        DatasetInfo {
            name: id.name(),
            statistic: id.statistic().name,
            breakdown: id.breakdown(),
            kind: id.kind(),
            unit: id.statistic().unit,
            enabled: h.is_some(),
            default: id.is_default(),
            memory_bytes: h.map_or(0, |h| h.memory_bytes()),
            memory_max_bytes: id.memory_max_bytes(),
            description: id.description(),
        }
    }

    /// The names of the enabled datasets (what a collector samples).
    pub fn enabled(&self) -> Vec<String> {
        self.histories.keys().map(|id| id.name()).collect()
    }

    /// The sum of the enabled datasets' bounds.
    fn memory_committed_bytes(&self) -> u64 {
        self.histories.keys().map(|id| id.memory_max_bytes()).sum()
    }

    /// History memory taken now by all enabled datasets.
    pub fn memory_bytes(&self) -> u64 {
        self.histories.values().map(|h| h.memory_bytes()).sum()
    }

    /// The answer to `GET /api/v1/analytics/datasets`.
    pub fn datasets(&self) -> DatasetsAnswer {
        DatasetsAnswer {
            datasets: DatasetId::all().map(|id| self.info(id)).collect(),
            statistics: STATISTICS,
            memory_bytes: self.memory_bytes(),
            memory_max_bytes: self.memory_max_bytes,
            history: HistoryBounds { second_points: SECOND_POINTS, minute_points: MINUTE_POINTS },
            buckets: buckets::edges(),
            now: self.now_unix_s(),
        }
    }

    /// Record the second ending at monotonic second `mono_s`. Datasets in the sample
    /// that are not enabled are ignored (as is a dataset's second entry); enabled ones
    /// missing from it get a hole.
    pub fn ingest(&mut self, mono_s: u64, sample: &Sample) -> Result<(), AnalyticsError> {
        let unix_s = self.unix_of(mono_s);
        // after a load, the seconds up to the load count as ingested
        let last_unix_s = self.last_unix_s.unwrap_or(0).max(self.loaded_last_s);
        if unix_s <= last_unix_s && (self.last_unix_s.is_some() || self.loaded_last_s > 0) {
            return Err(AnalyticsError::OutOfOrder { unix_s, last_unix_s });
        }
        self.last_unix_s = Some(unix_s);
        let mut seen = Vec::new();
        for (name, series) in &sample.datasets {
            let Some(id) = DatasetId::parse(name).filter(|id| !seen.contains(id)) else { continue };
            seen.push(id);
            if let Some(h) = self.histories.get_mut(&id) {
                h.ingest(unix_s, series);
            }
        }
        Ok(())
    }

    /// Save every enabled dataset's minutes (the minute being summed included) to
    /// `path`, replacing the file atomically. To keep the fsyncs out of a lock around
    /// the store, take [`Store::history_file_bytes`] under it and write them with
    /// [`write_history_file`] after.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        write_history_file(path, &self.history_file_bytes())
    }

    /// The history file's bytes as of now (see [`Store::save`]).
    pub fn history_file_bytes(&self) -> Vec<u8> {
        let datasets: Vec<persist::SavedDataset> = self
            .histories
            .values()
            .map(|h| {
                let (keys, minutes) = h.export_minutes();
                persist::SavedDataset { id: h.id, keys, minutes }
            })
            .collect();
        let newest = self.histories.values().filter_map(|h| h.newest_minute()).max().unwrap_or(0);
        persist::encode(&persist::Saved { newest_minute: newest.max(self.loaded_newest_minute), datasets })
    }

    /// The most bytes a history file of this store can have.
    fn file_bytes_max(&self) -> u64 {
        self.memory_max_bytes.saturating_add(persist::FILE_SLACK_BYTES)
    }

    /// Load a saved history (before the first sample): the file's datasets become the
    /// enabled ones, with their minutes. On any error the store is left as it was.
    pub fn load(&mut self, path: &Path) -> Result<LoadReport, LoadError> {
        if self.last_unix_s.is_some() {
            return Err(LoadError::AfterIngest);
        }
        let Some(bytes) = persist::read_file(path, self.file_bytes_max())? else {
            return Ok(LoadReport::default());
        };
        let saved = persist::decode(&bytes).map_err(LoadError::Corrupt)?;
        let ahead_s = saved.newest_minute.saturating_sub(self.now_unix_s());
        if ahead_s > CLOCK_BEHIND_MAX_S {
            // following it would date every new point that far in the future, for good
            return Err(LoadError::Corrupt(format!(
                "its newest minute is {ahead_s} s ahead of the clock (more than {CLOCK_BEHIND_MAX_S} s: a clock that was wrong when it was saved)"
            )));
        }
        let mut report = LoadReport { file_found: true, ..LoadReport::default() };
        let mut histories = BTreeMap::new();
        let mut committed = 0u64;
        for d in saved.datasets {
            let name = d.id.name();
            if d.minutes.iter().any(|(t, _)| *t > saved.newest_minute) {
                return Err(LoadError::Corrupt(format!("{name}: a minute after the newest one the header names")));
            }
            if committed + d.id.memory_max_bytes() > self.memory_max_bytes {
                report.skipped_over_memory.push(name);
                continue;
            }
            committed += d.id.memory_max_bytes();
            report.minutes += d.minutes.len();
            let h = History::import_minutes(d.id, &d.keys, d.minutes).map_err(|e| LoadError::Corrupt(format!("{name}: {e}")))?;
            histories.insert(d.id, h);
            report.datasets.push(name);
        }
        // Stopped and started again within the minute being summed when saved (its end
        // still ahead): go on summing it, on the wall clock. Otherwise (the clock went
        // back) new seconds come after it.
        let newest = saved.newest_minute;
        let unix_now = self.now_unix_s();
        let resume = newest > 0
            && unix_now < newest
            && history::minute_end(unix_now + 1) == newest
            && histories.values().all(|h| h.can_resume_minute(newest, newest - unix_now));
        self.histories = histories;
        self.loaded_newest_minute = newest;
        if resume {
            self.histories.values_mut().for_each(|h| h.resume_minute(newest));
            self.loaded_last_s = unix_now;
        } else {
            self.loaded_last_s = newest;
            report.clock_shift_s = self.place_after(newest);
        }
        Ok(report)
    }

    /// Move the anchor, if needed, so that every second from now on lies after the
    /// minute ending at `newest_minute` (unix s); the shift in seconds.
    fn place_after(&mut self, newest_minute: u64) -> u64 {
        let mono_now = self.env.now_ns() / 1_000_000_000;
        let unix_now = self.unix_of(mono_now);
        if unix_now > newest_minute {
            return 0;
        }
        self.anchor_mono_s = mono_now;
        self.anchor_unix_s = newest_minute.saturating_add(1);
        self.anchor_unix_s - unix_now
    }
}

/// Replace `path` with a history file's `bytes` (temp file `path`.tmp, fsync, rename,
/// fsync of the directory): a crash leaves the old file or the new one.
pub fn write_history_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    persist::write_file(path, bytes)
}

#[cfg(test)]
mod tests;
