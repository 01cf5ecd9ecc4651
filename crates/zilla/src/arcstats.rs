//! arcstats: the ARC's statistics as users read them — the `/v1/arcstats` map, the
//! columns of `zilla arcstat`, the `zilla arc-summary` report.
//!
//! Theory of operation
//! -------------------
//! The daemon describes its ARC with one flat map, OpenZFS arcstats kstat name → u64
//! ([`arcstats_map`], served as `GET /v1/arcstats` and exported on `/metrics` as
//! `node_zfs_arc_<name>`), plus Zilla's `zilla_*` memory keys. Everything the CLI
//! prints is derived from that map alone, by name, never from a struct: a key the
//! daemon adds later (the L2ARC's `l2_*`, `mutex_miss`, ...) shows up in the columns
//! and sections that read it with no change here, and a column whose keys are absent
//! prints `-` (arc-summary leaves such a line out).
//!
//! `arcstat` follows OpenZFS's arcstat.py: a field is either a counter rate (the
//! difference between two samples of one or more counters, divided by the interval;
//! the first row, with no earlier sample, is the total since the daemon started), a
//! percentage of the reads in the same interval (0 when there were none), or a size
//! (the current value). Counts and sizes are printed as `zfs_nicenum` does.

use std::collections::BTreeMap;

use crate::units::nicenum;

/// The arcstats map of the daemon's ARC (one ARC for every pool) and its memory
/// report: what `/v1/arcstats` serves and `/metrics` exports.
pub fn arcstats_map(memory: &crate::memory::MemoryReport, pools: &crate::pools::PoolTable) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    let a = zilla_core::arc::daemon_arc().stats();
    for (k, v) in [
        ("hits", a.hits),
        ("misses", a.misses),
        ("demand_data_hits", a.demand_data_hits),
        ("demand_data_misses", a.demand_data_misses),
        ("demand_metadata_hits", a.demand_metadata_hits),
        ("demand_metadata_misses", a.demand_metadata_misses),
        ("prefetch_data_hits", a.prefetch_data_hits),
        ("prefetch_data_misses", a.prefetch_data_misses),
        ("prefetch_metadata_hits", a.prefetch_metadata_hits),
        ("prefetch_metadata_misses", a.prefetch_metadata_misses),
        ("mru_hits", a.mru_hits),
        ("mfu_hits", a.mfu_hits),
        ("mru_ghost_hits", a.mru_ghost_hits),
        ("mfu_ghost_hits", a.mfu_ghost_hits),
        ("size", a.size),
        ("c", a.c),
        ("c_min", a.c_min),
        ("c_max", a.c_max),
        ("p", a.p),
        ("meta", a.meta),
        ("pd", a.pd),
        ("pm", a.pm),
        ("data_size", a.data_size),
        ("metadata_size", a.metadata_size),
        ("mru_size", a.mru_size),
        ("mfu_size", a.mfu_size),
        ("mru_ghost_size", a.mru_ghost_size),
        ("mfu_ghost_size", a.mfu_ghost_size),
        ("hdr_size", a.hdr_size),
        ("evict_skip", a.evict_skip),
        ("deleted", a.evictions),
        ("memory_throttle_count", a.memory_throttle_count),
        ("arc_prefetch_used", a.prefetch_used),
        ("arc_shrinks", a.shrinks),
    ] {
        *m.entry(k.to_string()).or_default() += v;
    }
    add_l2arc_stats(pools, &mut m);
    add_zfetch_stats(pools, &mut m);
    // What the system can still give the daemon (MemAvailable, the cgroup's limit):
    // the number the ARC shrinks on; arcstat's `avail`.
    if let Some(avail) = zilla_core::env::system_memory_available_bytes() {
        m.insert("memory_available_bytes".to_string(), avail);
    }
    for (k, v) in memory.kstats() {
        m.insert(k.to_string(), v);
    }
    m
}

/// The L2ARC's arcstats (`l2_*`): per pool (its cache devices), summed over the pools
/// that have one; absent when none has.
fn add_l2arc_stats(pools: &crate::pools::PoolTable, m: &mut BTreeMap<String, u64>) {
    for (_, pool) in pools.all() {
        let Some(l) = pool.l2_stats() else { continue };
        for (k, v) in [
            ("l2_hits", l.l2_hits),
            ("l2_misses", l.l2_misses),
            ("l2_feeds", l.l2_feeds),
            ("l2_writes_sent", l.l2_writes_sent),
            ("l2_writes_done", l.l2_writes_done),
            ("l2_writes_error", l.l2_writes_error),
            ("l2_write_bytes", l.l2_write_bytes),
            ("l2_read_bytes", l.l2_read_bytes),
            ("l2_cksum_bad", l.l2_cksum_bad),
            ("l2_io_error", l.l2_io_error),
            ("l2_abort_lowmem", l.l2_abort_lowmem),
            ("l2_feed_dropped", l.l2_feed_dropped),
            ("l2_size", l.l2_size),
            ("l2_asize", l.l2_asize),
            ("l2_hdr_size", l.l2_hdr_size),
            ("l2_blocks", l.l2_blocks),
            ("l2_rebuild_success", l.l2_rebuild_success),
            ("l2_rebuild_log_blks", l.l2_rebuild_log_blks),
            ("l2_rebuild_bufs", l.l2_rebuild_bufs),
            ("l2_rebuild_dh_errors", l.l2_rebuild_dh_errors),
            ("l2_rebuild_unsupported", l.l2_rebuild_unsupported),
            ("l2_rebuild_cksum_lb_errors", l.l2_rebuild_cksum_lb_errors),
            ("l2_rebuild_io_errors", l.l2_rebuild_io_errors),
            ("l2_rebuild_lowmem", l.l2_rebuild_lowmem),
        ] {
            *m.entry(k.to_string()).or_default() += v;
        }
    }
}

/// The read-ahead counters, OpenZFS's zfetchstats (/proc/spl/kstat/zfs/zfetchstats)
/// with a `zfetch_` prefix, summed over the pools' volumes.
fn add_zfetch_stats(pools: &crate::pools::PoolTable, m: &mut BTreeMap<String, u64>) {
    let mut z = zilla_core::zfetch::ZfetchStats::default();
    for (_, pool) in pools.all() {
        z.add(&pool.zfetch_stats());
    }
    for (k, v) in [("zfetch_hits", z.hits), ("zfetch_misses", z.misses), ("zfetch_max_streams", z.max_streams), ("zfetch_io_issued", z.io_issued)] {
        m.insert(k.to_string(), v);
    }
}

/// The keys `/metrics` exports as `node_zfs_arc_<key>` (`zfetch_<name>` as
/// `node_zfs_zfetch_<name>`): the arcstats and zfetchstats kstat names,
/// not Zilla's memory keys (exported as `zilla_memory_*`), and only names a metric
/// may carry.
pub fn node_exporter_keys(map: &BTreeMap<String, u64>) -> impl Iterator<Item = (&str, u64)> {
    map.iter()
        .filter(|(k, _)| !k.starts_with("zilla_") && !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(|(k, v)| (k.as_str(), *v))
}

// ---------------------------------------------------------------------------------
// arcstat

/// How a field's value comes from the map.
#[derive(Clone, Copy)]
enum Source {
    /// The local time, HH:MM:SS.
    Time,
    /// Per second: the sum of these counters' increase over the interval.
    Rate(&'static [&'static str]),
    /// Percentage: the increase of the first set of counters over the increase of the
    /// second set (0 when the second did not move).
    Pct(&'static [&'static str], &'static [&'static str]),
    /// 100 − the percentage of the `Pct` (the miss share of the same reads).
    PctRest(&'static [&'static str], &'static [&'static str]),
    /// The current value (a size).
    Now(&'static str),
    /// The first key's current value as a percentage of the sum of the others'.
    NowPct(&'static str, &'static [&'static str]),
}

use Source::*;

const H: &[&str] = &["hits"];
const M: &[&str] = &["misses"];
const HM: &[&str] = &["hits", "misses"];
const DH: &[&str] = &["demand_data_hits", "demand_metadata_hits"];
const DM: &[&str] = &["demand_data_misses", "demand_metadata_misses"];
const D: &[&str] = &["demand_data_hits", "demand_metadata_hits", "demand_data_misses", "demand_metadata_misses"];
const DDH: &[&str] = &["demand_data_hits"];
const DDM: &[&str] = &["demand_data_misses"];
const DD: &[&str] = &["demand_data_hits", "demand_data_misses"];
const DMH: &[&str] = &["demand_metadata_hits"];
const DMM: &[&str] = &["demand_metadata_misses"];
const DMD: &[&str] = &["demand_metadata_hits", "demand_metadata_misses"];
const PH: &[&str] = &["prefetch_data_hits", "prefetch_metadata_hits"];
const PM: &[&str] = &["prefetch_data_misses", "prefetch_metadata_misses"];
const P: &[&str] = &["prefetch_data_hits", "prefetch_metadata_hits", "prefetch_data_misses", "prefetch_metadata_misses"];
const PDH: &[&str] = &["prefetch_data_hits"];
const PDM: &[&str] = &["prefetch_data_misses"];
const PD: &[&str] = &["prefetch_data_hits", "prefetch_data_misses"];
const PMH: &[&str] = &["prefetch_metadata_hits"];
const PMM: &[&str] = &["prefetch_metadata_misses"];
const PMD: &[&str] = &["prefetch_metadata_hits", "prefetch_metadata_misses"];
const MH: &[&str] = &["demand_metadata_hits", "prefetch_metadata_hits"];
const MM: &[&str] = &["demand_metadata_misses", "prefetch_metadata_misses"];
const MD: &[&str] = &["demand_metadata_hits", "prefetch_metadata_hits", "demand_metadata_misses", "prefetch_metadata_misses"];
const L2H: &[&str] = &["l2_hits"];
const L2M: &[&str] = &["l2_misses"];
const L2: &[&str] = &["l2_hits", "l2_misses"];
const LISTS: &[&str] = &["mru_size", "mfu_size"];

/// arcstat's fields: name, source, description (`arcstat -v`). The names and
/// meanings are arcstat.py's; `overhd` is Zilla's.
const FIELDS: &[(&str, Source, &str)] = &[
    ("time", Time, "Time"),
    ("hits", Rate(H), "ARC hits per second"),
    ("miss", Rate(M), "ARC misses per second"),
    ("read", Rate(HM), "Total ARC accesses per second"),
    ("hit%", Pct(H, HM), "ARC hit percentage"),
    ("miss%", PctRest(H, HM), "ARC miss percentage"),
    ("dhit", Rate(DH), "Demand hits per second"),
    ("dmis", Rate(DM), "Demand misses per second"),
    ("dh%", Pct(DH, D), "Demand hit percentage"),
    ("dm%", PctRest(DH, D), "Demand miss percentage"),
    ("ddhit", Rate(DDH), "Demand data hits per second"),
    ("ddmis", Rate(DDM), "Demand data misses per second"),
    ("ddh%", Pct(DDH, DD), "Demand data hit percentage"),
    ("ddm%", PctRest(DDH, DD), "Demand data miss percentage"),
    ("dmhit", Rate(DMH), "Demand metadata hits per second"),
    ("dmmis", Rate(DMM), "Demand metadata misses per second"),
    ("dmh%", Pct(DMH, DMD), "Demand metadata hit percentage"),
    ("dmm%", PctRest(DMH, DMD), "Demand metadata miss percentage"),
    ("phit", Rate(PH), "Prefetch hits per second"),
    ("pmis", Rate(PM), "Prefetch misses per second"),
    ("ph%", Pct(PH, P), "Prefetch hits percentage"),
    ("pm%", PctRest(PH, P), "Prefetch miss percentage"),
    ("pdhit", Rate(PDH), "Prefetch data hits per second"),
    ("pdmis", Rate(PDM), "Prefetch data misses per second"),
    ("pdh%", Pct(PDH, PD), "Prefetch data hits percentage"),
    ("pdm%", PctRest(PDH, PD), "Prefetch data miss percentage"),
    ("pmhit", Rate(PMH), "Prefetch metadata hits per second"),
    ("pmmis", Rate(PMM), "Prefetch metadata misses per second"),
    ("pmh%", Pct(PMH, PMD), "Prefetch metadata hits percentage"),
    ("pmm%", PctRest(PMH, PMD), "Prefetch metadata miss percentage"),
    ("mhit", Rate(MH), "Metadata hits per second"),
    ("mmis", Rate(MM), "Metadata misses per second"),
    ("mread", Rate(MD), "Metadata accesses per second"),
    ("mh%", Pct(MH, MD), "Metadata hit percentage"),
    ("mm%", PctRest(MH, MD), "Metadata miss percentage"),
    ("arcsz", Now("size"), "ARC size"),
    ("size", Now("size"), "ARC size"),
    ("c", Now("c"), "ARC target size"),
    ("mfu", Rate(&["mfu_hits"]), "MFU list hits per second"),
    ("mru", Rate(&["mru_hits"]), "MRU list hits per second"),
    ("mfug", Rate(&["mfu_ghost_hits"]), "MFU ghost list hits per second"),
    ("mrug", Rate(&["mru_ghost_hits"]), "MRU ghost list hits per second"),
    ("mfu%", NowPct("mfu_size", LISTS), "MFU size percentage (of MFU + MRU)"),
    ("mru%", NowPct("mru_size", LISTS), "MRU size percentage (of MFU + MRU)"),
    ("mfusz", Now("mfu_size"), "MFU size"),
    ("mrusz", Now("mru_size"), "MRU size"),
    ("mfugsz", Now("mfu_ghost_size"), "MFU ghost size (data evicted, headers kept)"),
    ("mrugsz", Now("mru_ghost_size"), "MRU ghost size (data evicted, headers kept)"),
    ("eskip", Rate(&["evict_skip"]), "evict_skip per second"),
    ("mtxmis", Rate(&["mutex_miss"]), "mutex_miss per second"),
    ("dread", Rate(D), "Demand accesses per second"),
    ("ddread", Rate(DD), "Demand data accesses per second"),
    ("dmread", Rate(DMD), "Demand metadata accesses per second"),
    ("pread", Rate(P), "Prefetch accesses per second"),
    ("pdread", Rate(PD), "Prefetch data accesses per second"),
    ("pmread", Rate(PMD), "Prefetch metadata accesses per second"),
    ("l2hits", Rate(L2H), "L2ARC hits per second"),
    ("l2miss", Rate(L2M), "L2ARC misses per second"),
    ("l2read", Rate(L2), "Total L2ARC accesses per second"),
    ("l2hit%", Pct(L2H, L2), "L2ARC access hit percentage"),
    ("l2miss%", PctRest(L2H, L2), "L2ARC access miss percentage"),
    ("l2asize", Now("l2_asize"), "Actual (compressed) size of the L2ARC"),
    ("l2size", Now("l2_size"), "Size of the L2ARC"),
    ("l2bytes", Rate(&["l2_read_bytes"]), "Bytes read per second from the L2ARC"),
    ("grow", Now("arc_no_grow"), "ARC grow disabled"),
    ("need", Now("arc_need_free"), "ARC reclaim need"),
    ("free", Now("memory_free_bytes"), "ARC free memory"),
    ("avail", Now("memory_available_bytes"), "ARC available memory"),
    ("waste", Now("abd_chunk_waste_size"), "Wasted memory due to round up to pagesize"),
    ("overhd", Now("zilla_overhead_bytes"), "Daemon memory beyond the ARC and dirty data"),
];

/// The columns without `-f` (those of earlier versions; arcstat.py's own default
/// differs).
pub const DEFAULT_FIELDS: &[&str] = &["time", "read", "miss", "miss%", "size", "c", "avail", "overhd"];

/// Every field name, in `-v` order.
pub fn field_names() -> Vec<&'static str> {
    FIELDS.iter().map(|f| f.0).collect()
}

/// `arcstat -v`: one line per field with its description.
pub fn field_descriptions() -> String {
    let mut o = String::from("Field definitions are as follows:\n");
    for (name, _, desc) in FIELDS {
        o.push_str(&format!("{name:>11} : {desc}\n"));
    }
    o
}

/// The fields of `-f a,b,c` (None: the default), or an error naming the first unknown
/// one and listing the valid names.
pub fn parse_fields(spec: Option<&str>) -> Result<Vec<&'static str>, String> {
    let Some(spec) = spec else { return Ok(DEFAULT_FIELDS.to_vec()) };
    let mut out = vec![];
    for name in spec.split(',').map(str::trim) {
        match FIELDS.iter().find(|f| f.0 == name) {
            Some(f) => out.push(f.0),
            None => {
                return Err(format!(
                    "invalid column '{name}': expected a comma-separated list of {} (descriptions: zilla arcstat -v)",
                    field_names().join(", ")
                ))
            }
        }
    }
    Ok(out)
}

/// A column, right-aligned: 7 characters (8 for the time), one space between columns.
fn cell(field: &str, s: &str) -> String {
    let w = if field == "time" { 8 } else { 7 };
    format!("{s:>w$}")
}

pub fn header(fields: &[&str]) -> String {
    fields.iter().map(|f| cell(f, f)).collect::<Vec<_>>().join(" ")
}

/// The value of one field, `-` when the map lacks a key it reads. `prev` None: the
/// counters' totals (the first row); else their increase per second over `secs`.
pub fn field_value(
    field: &str,
    cur: &BTreeMap<String, u64>,
    prev: Option<&BTreeMap<String, u64>>,
    secs: f64,
    now_hms: &str,
) -> String {
    let Some((_, source, _)) = FIELDS.iter().find(|f| f.0 == field) else { return "-".into() };
    // the increase of the sum of these counters (None: a key is missing)
    let delta = |keys: &[&str]| -> Option<u64> {
        let mut sum = 0u64;
        for k in keys {
            let now = *cur.get(*k)?;
            let before = prev.and_then(|p| p.get(*k).copied()).unwrap_or(0);
            sum = sum.saturating_add(now.saturating_sub(before));
        }
        Some(sum)
    };
    let pct = |part: &[&str], whole: &[&str]| -> Option<u64> {
        let (p, w) = (delta(part)?, delta(whole)?);
        Some(if w == 0 { 0 } else { (p as u128 * 100 / w as u128) as u64 })
    };
    let secs = if secs > 0.0 && secs.is_finite() { secs } else { 1.0 };
    let v = match *source {
        Time => return now_hms.to_string(),
        Rate(keys) => delta(keys).map(|d| (d as f64 / secs).round() as u64),
        Pct(part, whole) => pct(part, whole),
        PctRest(part, whole) => match (pct(part, whole), delta(whole)) {
            (Some(p), Some(w)) if w > 0 => Some(100 - p.min(100)),
            (Some(_), Some(_)) => Some(0),
            _ => None,
        },
        Now(key) => cur.get(key).copied(),
        NowPct(key, whole) => {
            let part = cur.get(key).copied();
            let total: Option<u64> = whole.iter().map(|k| cur.get(*k).copied()).sum();
            match (part, total) {
                (Some(p), Some(t)) if t > 0 => Some((p as u128 * 100 / t as u128) as u64),
                (Some(_), Some(_)) => Some(0),
                _ => None,
            }
        }
    };
    v.map(nicenum).unwrap_or_else(|| "-".into())
}

/// One arcstat row.
pub fn row(fields: &[&str], cur: &BTreeMap<String, u64>, prev: Option<&BTreeMap<String, u64>>, secs: f64, now_hms: &str) -> String {
    fields.iter().map(|f| cell(f, &field_value(f, cur, prev, secs, now_hms))).collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------
// arc-summary

/// Bytes as arc_summary prints them: `30.0 GiB`, `512 Bytes`.
fn f_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["Bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} Bytes");
    }
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

/// Counts as arc_summary prints them: 1000-based, `812.3k`, `1.2G`, `42`.
fn f_hits(n: u64) -> String {
    const UNITS: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    if n < 1000 {
        return n.to_string();
    }
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1000.0 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.1}{}", UNITS[i])
}

/// A share as arc_summary prints it: `12.5 %`, `< 0.1 %`, `n/a` of nothing.
fn f_perc(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "n/a".into();
    }
    let p = part as f64 * 100.0 / whole as f64;
    if p > 0.0 && p < 0.1 {
        "< 0.1 %".into()
    } else {
        format!("{p:.1} %")
    }
}

/// A fixed-point fraction (2^32 = 1) as a percentage.
fn f_fraction(x: u64) -> String {
    format!("{:.1} %", x as f64 * 100.0 / (1u64 << 32) as f64)
}

const INDENT: &str = "        ";
/// Where a line's label ends, its share ends, its value ends (arc_summary's 72 columns).
const LABEL_CHARS: usize = 51;
const SHARE_CHARS: usize = 9;
const VALUE_CHARS: usize = 12;
#[cfg(test)]
const LINE_CHARS: usize = LABEL_CHARS + SHARE_CHARS + VALUE_CHARS;

/// The report under construction: section titles and indented lines, each with an
/// optional share and value right-aligned on the same columns, as arc_summary prints.
struct Report {
    out: String,
}

impl Report {
    fn row(&mut self, label: String, share: &str, value: &str) {
        let w = LABEL_CHARS.max(label.len() + 1);
        let line = format!("{label:<w$}{share:>SHARE_CHARS$}{value:>VALUE_CHARS$}");
        self.out.push_str(line.trim_end());
        self.out.push('\n');
    }

    fn title(&mut self, text: &str, share: &str, value: &str) {
        self.row(format!("{text}:"), share, value);
    }

    fn line(&mut self, text: &str, share: &str, value: &str) {
        self.row(format!("{INDENT}{text}:"), share, value);
    }

    fn blank(&mut self) {
        self.out.push('\n');
    }
}

/// arc-summary's size section.
fn section_size(r: &mut Report, m: &BTreeMap<String, u64>) {
    let g = |k: &str| m.get(k).copied();
    // ARC size
    if let (Some(size), Some(c_max)) = (g("size"), g("c_max")) {
        r.title("ARC size (current)", &f_perc(size, c_max), &f_bytes(size));
        if let Some(c) = g("c") {
            r.line("Target size (adaptive)", &f_perc(c, c_max), &f_bytes(c));
        }
        if let Some(c_min) = g("c_min") {
            r.line("Min size (hard limit)", &f_perc(c_min, c_max), &f_bytes(c_min));
            let ratio = if c_min > 0 { format!("{}:1", c_max / c_min) } else { "n/a".into() };
            r.line("Max size (high water)", &ratio, &f_bytes(c_max));
        }
        if let (Some(mfu), Some(mru)) = (g("mfu_size"), g("mru_size")) {
            r.line("Most Frequently Used (MFU) cache size", &f_perc(mfu, mfu + mru), &f_bytes(mfu));
            r.line("Most Recently Used (MRU) cache size", &f_perc(mru, mfu + mru), &f_bytes(mru));
        }
        if let (Some(meta), Some(data)) = (g("metadata_size"), g("data_size")) {
            r.line("Metadata cache size (current)", &f_perc(meta, meta + data), &f_bytes(meta));
            r.line("Data cache size (current)", &f_perc(data, meta + data), &f_bytes(data));
        }
        if let Some(x) = g("mfu_ghost_size") {
            r.line("Most Frequently Used (MFU) ghost size", "", &f_bytes(x));
        }
        if let Some(x) = g("mru_ghost_size") {
            r.line("Most Recently Used (MRU) ghost size", "", &f_bytes(x));
        }
        if let Some(x) = g("hdr_size") {
            r.line("Header size", &f_perc(x, size), &f_bytes(x));
        }
        r.blank();
    }
}

/// arc-summary's hash section.
fn section_hash(r: &mut Report, m: &BTreeMap<String, u64>) {
    let g = |k: &str| m.get(k).copied();
    // ARC hash breakdown (only the keys the daemon has)
    let hash: Vec<(&str, &str)> = [
        ("hash_elements_max", "Elements max"),
        ("hash_elements", "Elements current"),
        ("hash_collisions", "Collisions"),
        ("hash_chain_max", "Chain max"),
        ("hash_chains", "Chains"),
    ]
    .into_iter()
    .filter(|(k, _)| m.contains_key(*k))
    .collect();
    if !hash.is_empty() {
        r.title("ARC hash breakdown", "", "");
        for (k, label) in hash {
            let share = match (k, g("hash_elements_max")) {
                ("hash_elements", Some(max)) => f_perc(g(k).unwrap_or(0), max),
                _ => String::new(),
            };
            r.line(label, &share, &f_hits(g(k).unwrap_or(0)));
        }
        r.blank();
    }
}

/// arc-summary's misc section.
fn section_misc(r: &mut Report, m: &BTreeMap<String, u64>) {
    let g = |k: &str| m.get(k).copied();
    // ARC misc
    let misc: Vec<(&str, &str)> = [
        ("deleted", "Deleted"),
        ("mutex_miss", "Mutex misses"),
        ("evict_skip", "Eviction skips"),
        ("memory_throttle_count", "Memory throttle count"),
        ("arc_shrinks", "Target lowered for memory (shrinks)"),
        ("arc_prefetch_used", "Prefetched buffers used"),
    ]
    .into_iter()
    .filter(|(k, _)| m.contains_key(*k))
    .collect();
    if !misc.is_empty() {
        r.title("ARC misc", "", "");
        for (k, label) in misc {
            r.line(label, "", &f_hits(g(k).unwrap_or(0)));
        }
        r.blank();
    }
}

/// arc-summary's targets section.
fn section_targets(r: &mut Report, m: &BTreeMap<String, u64>) {
    let g = |k: &str| m.get(k).copied();
    // Adaptive targets
    if g("meta").is_some() || g("pd").is_some() || g("pm").is_some() || g("p").is_some() {
        r.title("ARC adaptive targets", "", "");
        if let Some(x) = g("meta") {
            r.line("Metadata share (meta)", &f_fraction(x), "");
        }
        if let Some(x) = g("pd") {
            r.line("MRU share of data (pd)", &f_fraction(x), "");
        }
        if let Some(x) = g("pm") {
            r.line("MRU share of metadata (pm)", &f_fraction(x), "");
        }
        if let (Some(p), Some(c)) = (g("p"), g("c")) {
            r.line("MRU target size (p)", &f_perc(p, c), &f_bytes(p));
        }
        r.blank();
    }
}

/// arc-summary's efficiency section.
fn section_efficiency(r: &mut Report, m: &BTreeMap<String, u64>) {
    let g = |k: &str| m.get(k).copied();
    // Efficiency
    if let (Some(hits), Some(misses)) = (g("hits"), g("misses")) {
        let total = hits.saturating_add(misses);
        r.title("ARC total accesses (hits + misses)", "", &f_hits(total));
        r.line("Cache hit ratio", &f_perc(hits, total), &f_hits(hits));
        r.line("Cache miss ratio", &f_perc(misses, total), &f_hits(misses));
        if let (Some(mfu), Some(mru)) = (g("mfu_hits"), g("mru_hits")) {
            r.line("Actual hit ratio (MFU + MRU hits)", &f_perc(mfu + mru, total), &f_hits(mfu + mru));
        }
        for (label, h, mi) in [
            ("Data demand efficiency", "demand_data_hits", "demand_data_misses"),
            ("Data prefetch efficiency", "prefetch_data_hits", "prefetch_data_misses"),
            ("Metadata demand efficiency", "demand_metadata_hits", "demand_metadata_misses"),
            ("Metadata prefetch efficiency", "prefetch_metadata_hits", "prefetch_metadata_misses"),
        ] {
            if let (Some(h), Some(mi)) = (g(h), g(mi)) {
                r.line(label, &f_perc(h, h + mi), &f_hits(h + mi));
            }
        }
        r.blank();

        let by_cache: Vec<(&str, u64)> = [
            ("Most frequently used (MFU)", "mfu_hits"),
            ("Most recently used (MRU)", "mru_hits"),
            ("Most frequently used (MFU) ghost", "mfu_ghost_hits"),
            ("Most recently used (MRU) ghost", "mru_ghost_hits"),
        ]
        .into_iter()
        .filter_map(|(label, k)| Some((label, g(k)?)))
        .collect();
        if !by_cache.is_empty() {
            r.title("Cache hits by cache type", "", "");
            for (label, n) in by_cache {
                r.line(label, &f_perc(n, hits), &f_hits(n));
            }
            r.blank();
        }
        for (title, whole, suffix) in [("Cache hits by data type", hits, "hits"), ("Cache misses by data type", misses, "misses")] {
            let rows: Vec<(&str, u64)> = [
                ("Demand data", "demand_data"),
                ("Prefetch data", "prefetch_data"),
                ("Demand metadata", "demand_metadata"),
                ("Prefetch metadata", "prefetch_metadata"),
            ]
            .into_iter()
            .filter_map(|(label, k)| Some((label, g(&format!("{k}_{suffix}"))?)))
            .collect();
            if !rows.is_empty() {
                r.title(title, "", "");
                for (label, n) in rows {
                    r.line(label, &f_perc(n, whole), &f_hits(n));
                }
                r.blank();
            }
        }
    }
}

/// arc-summary's l2arc section.
fn section_l2arc(r: &mut Report, m: &BTreeMap<String, u64>) {
    let g = |k: &str| m.get(k).copied();
    // L2ARC: only with a cache device's keys
    if m.keys().any(|k| k.starts_with("l2_")) {
        let size_lines: Vec<(&str, &str)> = [("l2_asize", "Allocated size (compressed)"), ("l2_hdr_size", "Header size")]
            .into_iter()
            .filter(|(k, _)| m.contains_key(*k))
            .collect();
        match g("l2_size") {
            Some(size) => r.title("L2ARC size (adaptive)", "", &f_bytes(size)),
            None => r.title("L2ARC size (adaptive)", "", ""),
        }
        for (k, label) in size_lines {
            let share = match g("l2_size") {
                Some(size) if k == "l2_asize" => f_perc(g(k).unwrap_or(0), size),
                _ => String::new(),
            };
            r.line(label, &share, &f_bytes(g(k).unwrap_or(0)));
        }
        r.blank();
        if let (Some(h), Some(mi)) = (g("l2_hits"), g("l2_misses")) {
            r.title("L2ARC breakdown", "", &f_hits(h + mi));
            r.line("Hit ratio", &f_perc(h, h + mi), &f_hits(h));
            r.line("Miss ratio", &f_perc(mi, h + mi), &f_hits(mi));
            if let Some(f) = g("l2_feeds") {
                r.line("Feeds", "", &f_hits(f));
            }
            r.blank();
        }
        let counters: Vec<(&str, &str)> = [
            ("l2_writes_sent", "Writes sent"),
            ("l2_cksum_bad", "Checksum errors"),
            ("l2_io_error", "I/O errors"),
        ]
        .into_iter()
        .filter(|(k, _)| m.contains_key(*k))
        .collect();
        if !counters.is_empty() {
            r.title("L2ARC writes and errors", "", "");
            for (k, label) in counters {
                r.line(label, "", &f_hits(g(k).unwrap_or(0)));
            }
            r.blank();
        }
        let rebuild: Vec<(&String, &u64)> = m.iter().filter(|(k, _)| k.starts_with("l2_rebuild_")).collect();
        if !rebuild.is_empty() {
            r.title("L2ARC rebuild", "", "");
            for (k, v) in rebuild {
                let label = k.trim_start_matches("l2_rebuild_").replace('_', " ");
                let value = if k.ends_with("size") || k.ends_with("bytes") { f_bytes(*v) } else { f_hits(*v) };
                r.line(&label, "", &value);
            }
            r.blank();
        }
    }
}

/// `zilla arc-summary`: OpenZFS arc_summary's ARC sections from one arcstats map. A
/// line whose keys the map lacks is left out; the L2ARC section appears only when the
/// map has L2ARC keys.
pub fn summary(m: &BTreeMap<String, u64>) -> String {
    let mut r = Report { out: String::new() };
    section_size(&mut r, m);
    section_hash(&mut r, m);
    section_misc(&mut r, m);
    section_targets(&mut r, m);
    section_efficiency(&mut r, m);
    section_l2arc(&mut r, m);
    if r.out.ends_with("\n\n") {
        r.out.pop();
    }
    r.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn base() -> BTreeMap<String, u64> {
        map(&[
            ("hits", 900),
            ("misses", 100),
            ("demand_data_hits", 600),
            ("demand_data_misses", 60),
            ("demand_metadata_hits", 200),
            ("demand_metadata_misses", 20),
            ("prefetch_data_hits", 70),
            ("prefetch_data_misses", 15),
            ("prefetch_metadata_hits", 30),
            ("prefetch_metadata_misses", 5),
            ("mru_hits", 300),
            ("mfu_hits", 600),
            ("mru_ghost_hits", 4),
            ("mfu_ghost_hits", 2),
            ("size", 3 << 20),
            ("c", 4 << 20),
            ("c_min", 1 << 20),
            ("c_max", 8 << 20),
            ("p", 2 << 20),
            ("meta", 1 << 30),
            ("pd", 1 << 31),
            ("pm", 3 << 30),
            ("data_size", 2 << 20),
            ("metadata_size", 1 << 20),
            ("mru_size", 1 << 20),
            ("mfu_size", 3 << 20),
            ("mru_ghost_size", 5 << 20),
            ("mfu_ghost_size", 6 << 20),
            ("hdr_size", 4096),
            ("evict_skip", 7),
            ("deleted", 11),
            ("zilla_overhead_bytes", 9 << 20),
        ])
    }

    fn values(fields: &str, cur: &BTreeMap<String, u64>, prev: Option<&BTreeMap<String, u64>>, secs: f64) -> Vec<String> {
        let f = parse_fields(Some(fields)).unwrap();
        f.iter().map(|x| field_value(x, cur, prev, secs, "12:34:56")).collect()
    }

    #[test]
    fn first_row_is_totals_and_sizes_are_current() {
        let m = base();
        assert_eq!(
            values("time,hits,miss,read,hit%,miss%,size,c,arcsz,overhd", &m, None, 1.0),
            ["12:34:56", "900", "100", "1000", "90", "10", "3M", "4M", "3M", "9M"]
        );
        // demand = 800 hits of 880; data demand 600 of 660; metadata demand 200 of 220
        assert_eq!(values("dhit,dmis,dread,dh%,dm%", &m, None, 1.0), ["800", "80", "880", "90", "10"]);
        assert_eq!(values("ddhit,ddmis,ddh%,ddm%,dmhit,dmmis,dmh%,dmm%", &m, None, 1.0), ["600", "60", "90", "10", "200", "20", "90", "10"]);
        // prefetch = 100 hits of 120 (83 %)
        assert_eq!(values("phit,pmis,pread,ph%,pm%", &m, None, 1.0), ["100", "20", "120", "83", "17"]);
        assert_eq!(values("pdhit,pdmis,pdh%,pdm%,pmhit,pmmis,pmh%,pmm%", &m, None, 1.0), ["70", "15", "82", "18", "30", "5", "85", "15"]);
        // metadata = demand + prefetch metadata: 230 hits of 255
        assert_eq!(values("mhit,mmis,mread,mh%,mm%", &m, None, 1.0), ["230", "25", "255", "90", "10"]);
        assert_eq!(values("mfu,mru,mfug,mrug,mfu%,mru%,mfusz,mrusz,eskip", &m, None, 1.0), ["600", "300", "2", "4", "75", "25", "3M", "1M", "7"]);
    }

    #[test]
    fn later_rows_are_rates_over_the_interval() {
        let prev = base();
        let mut cur = base();
        for (k, add) in [("hits", 2000u64), ("misses", 500), ("demand_data_hits", 2000), ("demand_data_misses", 500)] {
            *cur.get_mut(k).unwrap() += add;
        }
        cur.insert("size".into(), 5 << 20);
        // counts as zfs_nicenum prints them (1024-based): 1250 reads/s is 1.22K
        assert_eq!(values("hits,miss,read,hit%,miss%,ddh%,size", &cur, Some(&prev), 2.0), ["1000", "250", "1.22K", "80", "20", "80", "5M"]);
        // nothing moved: percentages are 0, as arcstat.py prints them
        assert_eq!(values("read,hit%,miss%,ph%,pm%", &prev, Some(&prev), 1.0), ["0", "0", "0", "0", "0"]);
        // a counter that went backwards (a restarted daemon) is not a huge rate
        assert_eq!(values("hits", &prev, Some(&cur), 1.0), ["0"]);
    }

    #[test]
    fn absent_keys_print_a_dash_and_present_l2_keys_print_values() {
        let m = base();
        let no_l2 = values("l2hits,l2miss,l2read,l2hit%,l2miss%,l2asize,l2size,l2bytes", &m, None, 1.0);
        assert!(no_l2.iter().all(|v| v == "-"), "{no_l2:?}");
        assert_eq!(values("mtxmis,waste,grow,need,free,avail", &m, None, 1.0), ["-"; 6]);
        let mut with = m.clone();
        for (k, v) in [("l2_hits", 30u64), ("l2_misses", 10), ("l2_size", 2 << 30), ("l2_asize", 1 << 30), ("l2_read_bytes", 4096), ("mutex_miss", 3)] {
            with.insert(k.into(), v);
        }
        assert_eq!(
            values("l2hits,l2miss,l2read,l2hit%,l2miss%,l2asize,l2size,l2bytes,mtxmis", &with, None, 1.0),
            ["30", "10", "40", "75", "25", "1G", "2G", "4K", "3"]
        );
    }

    #[test]
    fn fields_are_checked_and_listed() {
        assert_eq!(parse_fields(None).unwrap(), DEFAULT_FIELDS);
        assert_eq!(parse_fields(Some("hits,miss")).unwrap(), ["hits", "miss"]);
        let e = parse_fields(Some("hits,nosuch,miss")).unwrap_err();
        assert!(e.starts_with("invalid column 'nosuch'"), "{e}");
        assert!(e.contains("l2hits") && e.contains("overhd") && e.contains("time"), "{e}");
        assert!(parse_fields(Some("")).is_err());
        let v = field_descriptions();
        for name in field_names() {
            assert!(v.lines().any(|l| l.split(" : ").next().map(str::trim) == Some(name)), "{name} missing from -v");
        }
        for required in "time hits miss read hit% miss% dhit dmis dh% dm% ddhit ddmis ddh% ddm% dmhit dmmis dmh% dmm% phit pmis ph% pm% pdhit pdmis pdh% pdm% pmhit pmmis pmh% pmm% mhit mmis mread mh% mm% arcsz size c mfu mru mfug mrug mfu% mru% mfusz mrusz eskip mtxmis dread pread grow need free avail waste l2hits l2miss l2read l2hit% l2miss% l2asize l2size l2bytes overhd".split(' ') {
            assert!(field_names().contains(&required), "{required}");
        }
    }

    #[test]
    fn header_and_row_line_up() {
        let f = parse_fields(Some("time,hits,l2miss%,size")).unwrap();
        let h = header(&f);
        let r = row(&f, &base(), None, 1.0, "12:34:56");
        assert_eq!(h, "    time    hits l2miss%    size");
        assert_eq!(r, "12:34:56     900       -      3M");
        assert_eq!(h.len(), r.len());
    }

    #[test]
    fn summary_has_the_arc_sections_and_no_l2arc_without_its_keys() {
        let s = summary(&base());
        for want in [
            "ARC size (current):",
            "Target size (adaptive):",
            "Min size (hard limit):",
            "Max size (high water):",
            "Most Frequently Used (MFU) cache size:",
            "Metadata cache size (current):",
            "Header size:",
            "ARC adaptive targets:",
            "ARC total accesses (hits + misses):",
            "Cache hits by cache type:",
            "Cache misses by data type:",
        ] {
            assert!(s.contains(want), "{want} missing:\n{s}");
        }
        assert!(!s.contains("L2ARC"), "{s}");
        assert!(!s.contains("hash"), "{s}");
        let line = |label: &str| s.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_default().to_string();
        // size 3 MiB of c_max 8 MiB; c_max/c_min 8:1; MFU 3 of 4 MiB; hits 900 of 1000
        assert!(line("ARC size (current):").ends_with("37.5 %     3.0 MiB"), "{s}");
        assert!(line("Max size (high water):").contains("8:1"), "{s}");
        assert!(line("Most Frequently Used (MFU) cache size:").contains("75.0 %"), "{s}");
        assert!(line("Cache hit ratio:").contains("90.0 %"), "{s}");
        assert!(line("Metadata share (meta):").contains("25.0 %"), "{s}");
        assert!(line("MRU share of metadata (pm):").contains("75.0 %"), "{s}");
        assert!(line("Data demand efficiency:").contains("90.9 %"), "{s}");
        // values end on one column, shares on another, titles alone end in ':'
        for l in s.lines().filter(|l| !l.is_empty()) {
            let aligned = l.ends_with(':') || l.len() == LINE_CHARS || l.ends_with('%') && l.len() == LINE_CHARS - VALUE_CHARS;
            assert!(aligned, "not aligned: '{l}'\n{s}");
        }

        let mut with = base();
        for (k, v) in [("l2_hits", 30u64), ("l2_misses", 10), ("l2_size", 2 << 30), ("l2_asize", 1 << 30), ("l2_feeds", 5), ("l2_rebuild_success", 1)] {
            with.insert(k.into(), v);
        }
        let s = summary(&with);
        assert!(s.contains("L2ARC size (adaptive):") && s.contains("2.0 GiB"), "{s}");
        assert!(s.lines().any(|l| l.contains("Hit ratio:") && l.contains("75.0 %")), "{s}");
        assert!(s.contains("L2ARC rebuild:"), "{s}");
    }

    #[test]
    fn summary_of_a_sparse_map_leaves_lines_out() {
        assert_eq!(summary(&BTreeMap::new()), "");
        let s = summary(&map(&[("hits", 5), ("misses", 0), ("l2_hits", 1)]));
        assert!(s.contains("Cache hit ratio:") && s.contains("100.0 %"), "{s}");
        assert!(!s.contains("ARC size (current)") && !s.contains("Demand data"), "{s}");
        // an L2ARC key alone still opens its section; lines without keys stay out
        assert!(s.contains("L2ARC size (adaptive):") && !s.contains("Hit ratio"), "{s}");
    }

    #[test]
    fn numbers_read_like_arc_summary() {
        assert_eq!(f_bytes(512), "512 Bytes");
        assert_eq!(f_bytes(3 << 29), "1.5 GiB");
        assert_eq!(f_hits(999), "999");
        assert_eq!(f_hits(812_300), "812.3k");
        assert_eq!(f_perc(1, 10_000), "< 0.1 %");
        assert_eq!(f_perc(0, 0), "n/a");
        assert_eq!(f_fraction(1 << 31), "50.0 %");
    }

    #[test]
    fn node_exporter_keys_leave_out_zilla_keys() {
        let mut m = base();
        m.insert("bad name".into(), 1);
        let keys: Vec<&str> = node_exporter_keys(&m).map(|(k, _)| k).collect();
        assert!(keys.contains(&"hits") && keys.contains(&"c_max"));
        assert!(!keys.iter().any(|k| k.starts_with("zilla_") || k.contains(' ')), "{keys:?}");
    }
}
