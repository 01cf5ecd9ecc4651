//! Text output in the shapes of zpool(8) and zfs(8): status trees, list tables,
//! iostat reports, property rows. Shared by the CLI and the daemon's status page.

use std::fmt::Write;

use zilla_core::props::PropRow;
use zilla_core::spa::{PoolListRow, PoolStatus, VdevStatus, VolumeInfo};
use zilla_core::vdev::{IoClass, Role};

use crate::api::{IoStats, IostatEntry, IostatVdev};
use crate::status_text::{errors_line, scan_line, status_action, trim_line};
use crate::units::{nicebytes, nicenum, nicetime_ns, parse_size};

// ---------------------------------------------------------------------------------
// Tables

/// Column alignment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A zfs-style table: two spaces between columns, header in capitals; scripted
/// (`-H`) = no header, one tab between fields.
pub fn table(headers: &[&str], align: &[Align], rows: &[Vec<String>], scripted: bool) -> String {
    let mut out = String::new();
    if scripted {
        for r in rows {
            out.push_str(&r.join("\t"));
            out.push('\n');
        }
        return out;
    }
    let mut width: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let last = i + 1 == cells.len();
            let w = width[i];
            match align[i] {
                Align::Left if last => s.push_str(c),
                Align::Left => s.push_str(&format!("{c:<w$}")),
                Align::Right => s.push_str(&format!("{c:>w$}")),
            }
            if !last {
                s.push_str("  ");
            }
        }
        s.trim_end().to_string() + "\n"
    };
    out.push_str(&line(headers.to_vec()));
    for r in rows {
        out.push_str(&line(r.iter().map(|s| s.as_str()).collect()));
    }
    out
}

// ---------------------------------------------------------------------------------
// pool status

/// Is this pool in perfect health (for `status -x`)?
pub fn is_healthy(s: &PoolStatus) -> bool {
    fn clean(v: &VdevStatus) -> bool {
        v.read_errors == 0 && v.write_errors == 0 && v.cksum_errors == 0 && v.children.iter().all(clean)
    }
    s.state == "ONLINE" && status_action(s).0.is_empty() && s.error_list.is_empty() && s.config.iter().all(clean)
}

/// Is this pool imported and in perfect health (for `status -x`)?
pub fn is_healthy_entry(s: &crate::api::PoolStatusEntry) -> bool {
    s.unavailable.is_none() && is_healthy(&s.status)
}

/// The config list without a root node, whichever way the engine reports it.
fn top_level(s: &PoolStatus) -> (Option<&VdevStatus>, &[VdevStatus]) {
    match s.config.as_slice() {
        [root] if root.name == s.name => (Some(root), &root.children),
        all => (None, all),
    }
}

/// `zpool status` of one pool; `unavailable`: why a pool in the cache file is not
/// imported (it replaces the status and action paragraphs).
pub fn pool_status(s: &PoolStatus, unavailable: Option<&str>, verbose: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "  pool: {}", safe(&s.name));
    let _ = writeln!(o, " state: {}", s.state);
    let (status, action) = match unavailable {
        Some(why) => (
            format!("The pool is not imported: {}", crate::clip::clip_message(why)),
            format!("Import it with 'zilla pool import {}', or forget it with 'zilla pool export {}'.", safe(&s.name), safe(&s.name)),
        ),
        None => status_action(s),
    };
    if !status.is_empty() {
        let _ = writeln!(o, "status: {}", indent_para(&status));
    }
    if !action.is_empty() {
        let _ = writeln!(o, "action: {}", indent_para(&action));
    }
    let _ = writeln!(o, "  scan: {}", indent_para(&scan_line(&s.scan)));
    if let Some(t) = trim_line(&s.trim) {
        let _ = writeln!(o, "  trim: {}", indent_para(&t));
    }
    let _ = writeln!(o, "config:\n");

    let (root, tops) = top_level(s);
    let mut rows: Vec<(String, &str, String, String, String, &str)> = vec![];
    let (r, w, c) = root.map_or((0, 0, 0), |r| (r.read_errors, r.write_errors, r.cksum_errors));
    rows.push((safe(&s.name), s.state.as_str(), r.to_string(), w.to_string(), c.to_string(), ""));
    let mut classes: Vec<(Role, &str)> = vec![(Role::Normal, "")];
    classes.extend([(Role::Log, "logs"), (Role::Cache, "cache"), (Role::Spare, "spares")]);
    for (role, header) in classes {
        let members: Vec<&VdevStatus> = tops.iter().filter(|v| v.role == role).collect();
        if members.is_empty() {
            continue;
        }
        if !header.is_empty() {
            rows.push((header.to_string(), "", String::new(), String::new(), String::new(), ""));
        }
        for v in members {
            push_vdev(&mut rows, v, 1);
        }
    }
    let namew = rows.iter().map(|r| r.0.len()).max().unwrap_or(4).max(10);
    let _ = writeln!(o, "\t{:<namew$}  {:<8} {:>5} {:>5} {:>5}", "NAME", "STATE", "READ", "WRITE", "CKSUM");
    for (name, state, r, w, c, note) in rows {
        if state.is_empty() {
            let _ = writeln!(o, "\t{name}");
            continue;
        }
        let line = format!("\t{name:<namew$}  {state:<8} {r:>5} {w:>5} {c:>5}  {note}");
        let _ = writeln!(o, "{}", line.trim_end());
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "errors: {}", errors_line(s));
    if verbose && !s.error_list.is_empty() {
        let _ = writeln!(o);
        for e in &s.error_list {
            let _ = writeln!(o, "        {e}");
        }
    }
    o
}

/// The tree `zpool add -n` prints: the pool, its data vdevs, then the `logs`, `cache`
/// and `spares` sections, names only, indented two spaces a level after a tab.
pub fn layout_tree(pool: &str, tops: &[VdevStatus]) -> String {
    fn push(o: &mut String, v: &VdevStatus, depth: usize) {
        let _ = writeln!(o, "\t{}{}", "  ".repeat(depth), safe(&v.name));
        for c in &v.children {
            push(o, c, depth + 1);
        }
    }
    let mut o = format!("\t{}\n", safe(pool));
    for (role, header) in [(Role::Normal, ""), (Role::Log, "logs"), (Role::Cache, "cache"), (Role::Spare, "spares")] {
        let members: Vec<&VdevStatus> = tops.iter().filter(|v| v.role == role).collect();
        if !members.is_empty() && !header.is_empty() {
            let _ = writeln!(o, "\t{header}");
        }
        for v in members {
            push(&mut o, v, 1);
        }
    }
    o
}

type StatusRow<'a> = (String, &'a str, String, String, String, &'a str);

fn push_vdev<'a>(rows: &mut Vec<StatusRow<'a>>, v: &'a VdevStatus, depth: usize) {
    let name = format!("{}{}", "  ".repeat(depth), safe(&v.name));
    rows.push((
        name,
        &v.state,
        nicenum(v.read_errors),
        nicenum(v.write_errors),
        nicenum(v.cksum_errors),
        &v.note,
    ));
    for c in &v.children {
        push_vdev(rows, c, depth + 1);
    }
}

/// A paragraph's continuation lines indented by one tab, as zpool prints them (lines
/// that already start with a tab keep just that one).
fn indent_para(s: &str) -> String {
    s.lines().map(|l| l.trim_start_matches('\t')).collect::<Vec<_>>().join("\n\t")
}

// ---------------------------------------------------------------------------------
// pool list

pub const LIST_COLUMNS: &[&str] =
    &["name", "size", "alloc", "free", "ckpoint", "expandsz", "frag", "cap", "dedup", "health", "altroot"];
const LIST_EXTRA: &[&str] = &["ashift", "allocated", "fragmentation", "capacity", "avail"];

/// Check `-o` column names; returns the canonical short names.
pub fn list_columns(spec: Option<&str>) -> Result<Vec<String>, String> {
    let Some(spec) = spec else {
        return Ok(LIST_COLUMNS.iter().map(|s| s.to_string()).collect());
    };
    spec.split(',')
        .map(|c| {
            let c = c.trim().to_ascii_lowercase();
            let c = match c.as_str() {
                "allocated" => "alloc".to_string(),
                "available" => "avail".to_string(),
                "fragmentation" => "frag".to_string(),
                "capacity" => "cap".to_string(),
                _ => c,
            };
            if LIST_COLUMNS.contains(&c.as_str()) || LIST_EXTRA.contains(&c.as_str()) {
                Ok(c)
            } else {
                Err(format!("invalid column '{c}': expected one of {}, ashift, avail", LIST_COLUMNS.join(", ")))
            }
        })
        .collect()
}

/// A name read from a device or sent by a client, fit to print: control characters
/// and escape sequences shown escaped, cut to a bounded length.
pub fn safe(name: &str) -> String {
    crate::clip::clip(name)
}

/// A pool not imported (its sizes are unknown).
fn unavail(r: &PoolListRow) -> bool {
    r.health == zilla_core::spa::PoolHealth::Unavail && r.size == 0
}

pub fn pool_list(rows: &[PoolListRow], cols: &[String], scripted: bool, parsable: bool) -> String {
    let size = |n: u64| if parsable { n.to_string() } else { nicebytes(n) };
    let pct = |n: u64| if parsable { n.to_string() } else { format!("{n}%") };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            cols.iter()
                .map(|c| match c.as_str() {
                    "name" => safe(&r.name),
                    "size" | "alloc" | "free" | "avail" | "frag" | "cap" | "ashift" | "dedup" if unavail(r) => "-".into(),
                    "size" => size(r.size),
                    "alloc" => size(r.alloc),
                    "free" => size(r.free),
                    "avail" => size(r.avail),
                    "frag" => pct(r.frag_percent),
                    "cap" => pct(r.cap_percent),
                    "dedup" => if parsable { "1.00".into() } else { "1.00x".into() },
                    "health" => r.health.to_string(),
                    "ashift" => r.ashift.to_string(),
                    _ => "-".into(),
                })
                .collect()
        })
        .collect();
    let headers: Vec<String> = cols.iter().map(|c| c.to_ascii_uppercase()).collect();
    let headers: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
    let align: Vec<Align> = cols
        .iter()
        .map(|c| if matches!(c.as_str(), "name" | "altroot") { Align::Left } else { Align::Right })
        .collect();
    table(&headers, &align, &cells, scripted)
}

// ---------------------------------------------------------------------------------
// zilla get / volume list

const SIZE_PROPS: &[&str] = &[
    "volsize",
    "volblocksize",
    "used",
    "logicalused",
    "referenced",
    "available",
    "refreservation",
    "usedbydataset",
    "usedbyrefreservation",
    "logicalreferenced",
    "size",
    "allocated",
    "free",
];

/// A property's value as `zfs get` prints it from the engine's exact form: sizes as
/// nicenums (`1.50G`), `creation` as a date (`Wed Dec  2  4:55 2026`, local time),
/// `compressratio` with its `x`; with `parsable` (`-p`) exact bytes, unix seconds and
/// `1.00`.
pub fn prop_value(property: &str, value: &str, parsable: bool) -> String {
    if SIZE_PROPS.contains(&property) {
        if parsable {
            if let Ok(n) = parse_size(value) {
                return n.to_string();
            }
        } else if let Ok(n) = value.parse::<u64>() {
            return nicebytes(n);
        }
    }
    match (property, value.parse::<i64>()) {
        ("creation", Ok(seconds)) if !parsable => return zfs_date(seconds),
        _ => {}
    }
    if property == "compressratio" && !parsable && value != "-" {
        return format!("{value}x");
    }
    value.to_string()
}

/// Properties `zfs list` right-aligns (sizes and ratios).
pub fn is_numeric_prop(property: &str) -> bool {
    SIZE_PROPS.contains(&property) || matches!(property, "compressratio" | "createtxg" | "objsetid")
}

/// Unix seconds as zfs shows a date: strftime `%a %b %e %k:%M %Y`, local time.
fn zfs_date(seconds: i64) -> String {
    let t = seconds as libc::time_t;
    // SAFETY: localtime_r and strftime write only into the buffers given.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return seconds.to_string();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c"%a %b %e %k:%M %Y".as_ptr(), &tm);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// `zfs get`: NAME PROPERTY VALUE SOURCE, values as [`prop_value`] shows them.
pub fn prop_rows(rows: &[PropRow], scripted: bool, parsable: bool) -> String {
    let cells: Vec<Vec<String>> =
        rows.iter().map(|r| vec![r.name.clone(), r.property.clone(), prop_value(&r.property, &r.value, parsable), r.source.clone()]).collect();
    let mut out = table(&["NAME", "PROPERTY", "VALUE", "SOURCE"], &[Align::Left; 4], &cells, scripted);
    if !scripted {
        // properties that are stored but not acted on yet say so under the table
        let noted: std::collections::BTreeSet<(&str, &str)> =
            rows.iter().filter_map(|r| Some((r.property.as_str(), r.note.as_deref()?))).collect();
        for (property, note) in noted {
            out += &format!("note: {property} is stored but has no effect yet: {note}\n");
        }
    }
    out
}

pub fn volume_list(vols: &[VolumeInfo], scripted: bool, parsable: bool) -> String {
    let size = |n: u64| if parsable { n.to_string() } else { nicebytes(n) };
    let cells: Vec<Vec<String>> = vols
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                size(v.used),
                size(v.available),
                size(v.referenced),
                if v.refreservation == 0 { "none".into() } else { size(v.refreservation) },
                size(v.volsize),
                size(v.volblocksize as u64),
                if v.readonly { "on".into() } else { "off".into() },
            ]
        })
        .collect();
    let a = [Align::Left, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right];
    table(&["NAME", "USED", "AVAIL", "REFER", "REFRESERV", "VOLSIZE", "VOLBLOCK", "RDONLY"], &a, &cells, scripted)
}

// ---------------------------------------------------------------------------------
// pool iostat

#[derive(Clone, Copy, Default)]
pub struct IostatFlags {
    pub verbose: bool,
    pub latency: bool,
    pub queues: bool,
    pub histograms: bool,
    pub scripted: bool,
    pub parsable: bool,
}

const READ_CLASSES: [IoClass; 3] = [IoClass::SyncRead, IoClass::AsyncRead, IoClass::Scrub];
const WRITE_CLASSES: [IoClass; 2] = [IoClass::SyncWrite, IoClass::AsyncWrite];

fn sub_hist(cur: &[u64], prev: Option<&[u64]>) -> Vec<u64> {
    match prev {
        Some(p) => cur.iter().enumerate().map(|(i, v)| v.saturating_sub(*p.get(i).unwrap_or(&0))).collect(),
        None => cur.to_vec(),
    }
}

fn add_hist(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (i, v) in b.iter().enumerate() {
        a[i] += v;
    }
}

/// Average of a log2 histogram, bucket i counted as 2^i ns (as zpool iostat -l does).
fn hist_avg(h: &[u64]) -> Option<u64> {
    let count: u64 = h.iter().sum();
    if count == 0 {
        return None;
    }
    let sum: u128 = h.iter().enumerate().map(|(i, &c)| c as u128 * (1u128 << i.min(63))).sum();
    Some((sum / count as u128) as u64)
}

/// Where class `c` sits in `IoClass::ALL` (the index of Delta's per-class vectors).
fn slot(c: IoClass) -> usize {
    IoClass::ALL.iter().position(|&x| x == c).unwrap_or(0)
}

/// One node's numbers over an interval; per-class vectors are indexed like `IoClass::ALL`.
struct Delta {
    ops_r: f64,
    ops_w: f64,
    bw_r: f64,
    bw_w: f64,
    total: Vec<Vec<u64>>,
    disk: Vec<Vec<u64>>,
    queued: [u32; IoClass::ALL.len()],
    active: [u32; IoClass::ALL.len()],
}

fn delta(cur: &IoStats, prev: Option<&IoStats>, secs: f64) -> Delta {
    let d = |field: fn(&crate::api::ClassIoStats) -> u64, classes: &[IoClass]| -> f64 {
        classes
            .iter()
            .map(|&c| field(cur.class(c)).saturating_sub(prev.map_or(0, |p| field(p.class(c)))))
            .sum::<u64>() as f64
            / secs
    };
    let hist = |field: fn(&crate::api::ClassIoStats) -> &Vec<u64>| -> Vec<Vec<u64>> {
        IoClass::ALL.iter().map(|&c| sub_hist(field(cur.class(c)), prev.map(|p| field(p.class(c)).as_slice()))).collect()
    };
    Delta {
        ops_r: d(|s| s.ops, &READ_CLASSES),
        ops_w: d(|s| s.ops, &WRITE_CLASSES),
        bw_r: d(|s| s.bytes, &READ_CLASSES),
        bw_w: d(|s| s.bytes, &WRITE_CLASSES),
        total: hist(|s| &s.total_latency_hist),
        disk: hist(|s| &s.disk_latency_hist),
        queued: IoClass::ALL.map(|c| cur.class(c).queued),
        active: IoClass::ALL.map(|c| cur.class(c).active),
    }
}

impl Delta {
    fn merged(h: &[Vec<u64>], classes: &[IoClass]) -> Vec<u64> {
        let mut out = vec![];
        for &c in classes {
            add_hist(&mut out, &h[slot(c)]);
        }
        out
    }
}

struct Fmt {
    parsable: bool,
}

impl Fmt {
    fn num(&self, v: f64) -> String {
        if self.parsable {
            format!("{}", v.round() as u64)
        } else {
            nicenum(v.round() as u64)
        }
    }
    fn bytes(&self, v: u64) -> String {
        if self.parsable {
            v.to_string()
        } else {
            nicenum(v)
        }
    }
    fn time(&self, v: Option<u64>) -> String {
        match v {
            None => "-".into(),
            Some(ns) if self.parsable => ns.to_string(),
            Some(ns) => nicetime_ns(ns),
        }
    }
}

/// Seconds a snapshot's counters cover when there is no previous snapshot (both
/// timestamps are wall-clock ns).
fn since_open_secs(s: &IostatEntry) -> f64 {
    (s.timestamp_ns.saturating_sub(s.opened_ns) as f64 / 1e9).max(1.0)
}

/// One iostat report (header + rows) for `cur` against `prev` (None = since open).
pub fn iostat_report(cur: &[IostatEntry], prev: Option<&[IostatEntry]>, f: IostatFlags) -> String {
    if f.histograms {
        return iostat_histograms(cur, prev, f);
    }
    let fm = Fmt { parsable: f.parsable };
    let mut headers = vec!["pool", "alloc", "free", "read", "write", "read", "write"];
    if f.latency {
        headers.extend(["total_wait", "", "disk_wait", "", "syncq_wait", "", "asyncq_wait", "", "scrub", "trim"]);
    }
    if f.queues {
        headers.extend(["syncq_read", "", "syncq_write", "", "asyncq_read", "", "asyncq_write", "", "scrubq_read", "", "trimq_write", ""]);
    }
    let mut rows: Vec<Vec<String>> = vec![];
    let mut separators: Vec<usize> = vec![];
    for s in cur {
        let p = prev.and_then(|ps| ps.iter().find(|p| p.pool == s.pool));
        let secs = match p {
            Some(p) => ((s.timestamp_ns.saturating_sub(p.timestamp_ns)) as f64 / 1e9).max(1e-3),
            None => since_open_secs(s),
        };
        rows.push(iostat_row(&s.pool, Some((s.alloc, s.free)), &s.stats, p.map(|p| &p.stats), secs, &fm, f));
        if f.verbose {
            for (role, header) in [(Role::Normal, ""), (Role::Log, "logs"), (Role::Cache, "cache")] {
                let members: Vec<&IostatVdev> = s.vdevs.iter().filter(|v| v.role == role).collect();
                if members.is_empty() {
                    continue;
                }
                if !header.is_empty() {
                    let mut r = vec![header.to_string()];
                    r.resize(rows[0].len(), "-".into());
                    rows.push(r);
                }
                for v in members {
                    let pv = p.and_then(|p| p.vdevs.iter().find(|x| x.name == v.name));
                    push_iostat_node(&mut rows, v, pv, 1, secs, &fm, f);
                }
            }
            separators.push(rows.len());
        }
    }
    render_iostat(&headers, &rows, &separators, f)
}

fn push_iostat_node(
    rows: &mut Vec<Vec<String>>,
    v: &IostatVdev,
    prev: Option<&IostatVdev>,
    depth: usize,
    secs: f64,
    fm: &Fmt,
    f: IostatFlags,
) {
    let cap = if v.children.is_empty() && v.alloc + v.free == 0 { None } else { Some((v.alloc, v.free)) };
    let name = format!("{}{}", "  ".repeat(depth), safe(&v.name));
    rows.push(iostat_row(&name, cap, &v.stats, prev.map(|p| &p.stats), secs, fm, f));
    for c in &v.children {
        let pc = prev.and_then(|p| p.children.iter().find(|x| x.name == c.name));
        push_iostat_node(rows, c, pc, depth + 1, secs, fm, f);
    }
}

fn iostat_row(
    name: &str,
    cap: Option<(u64, u64)>,
    cur: &IoStats,
    prev: Option<&IoStats>,
    secs: f64,
    fm: &Fmt,
    f: IostatFlags,
) -> Vec<String> {
    let d = delta(cur, prev, secs);
    let mut r = vec![name.to_string()];
    match cap {
        Some((a, fr)) => r.extend([fm.bytes(a), fm.bytes(fr)]),
        None => r.extend(["-".into(), "-".into()]),
    }
    r.extend([fm.num(d.ops_r), fm.num(d.ops_w), fm.num(d.bw_r), fm.num(d.bw_w)]);
    if f.latency {
        let tot_r = hist_avg(&Delta::merged(&d.total, &READ_CLASSES[..2]));
        let tot_w = hist_avg(&Delta::merged(&d.total, &WRITE_CLASSES));
        let disk_r = hist_avg(&Delta::merged(&d.disk, &READ_CLASSES[..2]));
        let disk_w = hist_avg(&Delta::merged(&d.disk, &WRITE_CLASSES));
        // Queue wait = total - device time, per class.
        let qwait = |c: IoClass| -> Option<u64> {
            let t = hist_avg(&d.total[slot(c)])?;
            let k = hist_avg(&d.disk[slot(c)]).unwrap_or(0);
            Some(t.saturating_sub(k))
        };
        let scrub = hist_avg(&d.total[slot(IoClass::Scrub)]);
        r.extend([
            fm.time(tot_r),
            fm.time(tot_w),
            fm.time(disk_r),
            fm.time(disk_w),
            fm.time(qwait(IoClass::SyncRead)),
            fm.time(qwait(IoClass::SyncWrite)),
            fm.time(qwait(IoClass::AsyncRead)),
            fm.time(qwait(IoClass::AsyncWrite)),
            fm.time(scrub),
            fm.time(hist_avg(&d.total[slot(IoClass::Trim)])),
        ]);
    }
    if f.queues {
        for c in [IoClass::SyncRead, IoClass::SyncWrite, IoClass::AsyncRead, IoClass::AsyncWrite, IoClass::Scrub, IoClass::Trim] {
            r.push(fm.num(d.queued[slot(c)] as f64));
            r.push(fm.num(d.active[slot(c)] as f64));
        }
    }
    r
}

fn render_iostat(headers: &[&str], rows: &[Vec<String>], separators: &[usize], f: IostatFlags) -> String {
    if f.scripted {
        return table(headers, &vec![Align::Left; headers.len()], rows, true);
    }
    let namew = rows.iter().map(|r| r[0].len()).max().unwrap_or(4).max(10);
    let colw = if f.parsable {
        rows.iter().flat_map(|r| r[1..].iter().map(|c| c.len())).max().unwrap_or(5).max(5)
    } else {
        5
    };
    let mut o = String::new();
    // Group header line: capacity / operations / bandwidth [/ total_wait ...].
    let mut groups = vec!["capacity", "operations", "bandwidth"];
    let mut sub: Vec<String> = vec!["alloc", "free", "read", "write", "read", "write"].into_iter().map(String::from).collect();
    if f.latency {
        groups.extend(["total_wait", "disk_wait", "syncq_wait", "asyncq_wait"]);
        sub.extend(["read", "write", "read", "write", "read", "write", "read", "write"].map(String::from));
    }
    let mut line1 = format!("{:<namew$}", "");
    for g in &groups {
        let w = colw * 2 + 2;
        line1.push_str(&format!("  {g:^w$}"));
    }
    if f.latency {
        line1.push_str(&format!("  {:>colw$}  {:>colw$}", "scrub", "trim"));
        sub.extend(["wait".into(), "wait".into()]);
    }
    if f.queues {
        for g in ["syncq_read", "syncq_write", "asyncq_read", "asyncq_write", "scrubq_read", "trimq_write"] {
            let w = colw * 2 + 2;
            line1.push_str(&format!("  {g:^w$}"));
            sub.extend(["pend".into(), "activ".into()]);
        }
    }
    o.push_str(line1.trim_end());
    o.push('\n');
    let mut line2 = format!("{:<namew$}", "pool");
    for s in &sub {
        line2.push_str(&format!("  {s:>colw$}"));
    }
    o.push_str(&line2);
    o.push('\n');
    let dashes = {
        let mut l = "-".repeat(namew);
        for _ in &sub {
            l.push_str(&format!("  {}", "-".repeat(colw)));
        }
        l
    };
    o.push_str(&dashes);
    o.push('\n');
    for (i, r) in rows.iter().enumerate() {
        let mut l = format!("{:<namew$}", r[0]);
        for c in &r[1..] {
            l.push_str(&format!("  {c:>colw$}"));
        }
        o.push_str(&l);
        o.push('\n');
        if separators.contains(&(i + 1)) {
            o.push_str(&dashes);
            o.push('\n');
        }
    }
    o
}

/// `-w`: latency histograms, one table per pool (and per vdev with -v).
fn iostat_histograms(cur: &[IostatEntry], prev: Option<&[IostatEntry]>, f: IostatFlags) -> String {
    let mut o = String::new();
    for s in cur {
        let p = prev.and_then(|ps| ps.iter().find(|p| p.pool == s.pool));
        o.push_str(&histogram_table(&s.pool, &s.stats, p.map(|p| &p.stats), f));
        if f.verbose {
            fn walk(o: &mut String, v: &IostatVdev, pv: Option<&IostatVdev>, f: IostatFlags) {
                o.push_str(&histogram_table(&v.name, &v.stats, pv.map(|p| &p.stats), f));
                for c in &v.children {
                    walk(o, c, pv.and_then(|p| p.children.iter().find(|x| x.name == c.name)), f);
                }
            }
            for v in &s.vdevs {
                walk(&mut o, v, p.and_then(|p| p.vdevs.iter().find(|x| x.name == v.name)), f);
            }
        }
    }
    o
}

fn histogram_table(name: &str, cur: &IoStats, prev: Option<&IoStats>, f: IostatFlags) -> String {
    let d = delta(cur, prev, 1.0);
    let cols: Vec<Vec<u64>> = vec![
        Delta::merged(&d.total, &READ_CLASSES[..2]),
        Delta::merged(&d.total, &WRITE_CLASSES),
        Delta::merged(&d.disk, &READ_CLASSES[..2]),
        Delta::merged(&d.disk, &WRITE_CLASSES),
        d.total[slot(IoClass::SyncRead)].clone(),
        d.total[slot(IoClass::SyncWrite)].clone(),
        d.total[slot(IoClass::AsyncRead)].clone(),
        d.total[slot(IoClass::AsyncWrite)].clone(),
        d.total[slot(IoClass::Scrub)].clone(),
    ];
    let n = zilla_core::kstat::HISTOGRAM_BUCKETS;
    let fm = Fmt { parsable: f.parsable };
    let rows: Vec<Vec<String>> = (0..n)
        .map(|i| {
            let mut r = vec![bucket_label(i, f.parsable)];
            r.extend(cols.iter().map(|c| fm.num(*c.get(i).unwrap_or(&0) as f64)));
            r
        })
        .collect();
    let mut headers = vec![name, "read", "write", "read", "write", "read", "write", "read", "write", "scrub"];
    if f.scripted {
        return table(&headers, &[Align::Left; 10], &rows, true);
    }
    let mut o = format!(
        "{:<10}  {:^12}  {:^12}  {:^12}  {:^12}  {:^5}\n",
        name, "total_wait", "disk_wait", "sync_total", "async_total", "scrub"
    );
    headers[0] = "latency";
    o.push_str(&table(&headers, &[Align::Left, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right], &rows, false));
    o.push('\n');
    o
}

/// Bucket i holds [2^i, 2^(i+1)) ns; zpool labels it with its upper bound.
fn bucket_label(i: usize, parsable: bool) -> String {
    let ns: u64 = (1u64 << (i + 1)) - 1;
    if parsable {
        return ns.to_string();
    }
    let (v, u) = if ns < 1_000 {
        (ns, "ns")
    } else if ns < 1_000_000 {
        (ns / 1_000, "us")
    } else if ns < 1_000_000_000 {
        (ns / 1_000_000, "ms")
    } else {
        (ns / 1_000_000_000, "s")
    };
    format!("{v}{u}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iostat_entry(timestamp_ns: u64, class: IoClass, ops: u64, bytes: u64) -> IostatEntry {
        let mut s = zilla_core::vdev::queue::LeafStats::default();
        s.ops[class as usize] = ops;
        s.bytes[class as usize] = bytes;
        IostatEntry {
            opened_ns: 0,
            pool: "tank".into(),
            timestamp_ns,
            alloc: 0,
            free: 0,
            stats: crate::api::IoStats::from_leaf(&s),
            vdevs: vec![],
        }
    }

    #[test]
    fn names_from_disk_are_printed_escaped_and_unavailable_pools_without_sizes() {
        let row = |name: &str, health| PoolListRow { name: name.into(), size: 0, alloc: 0, free: 0, frag_percent: 0, cap_percent: 0, health, ashift: 0, avail: 0 };
        let cols: Vec<String> = ["name", "size", "health"].iter().map(|s| s.to_string()).collect();
        let out = pool_list(&[row("evil\n\x1b[31mred", zilla_core::spa::PoolHealth::Unavail)], &cols, true, false);
        assert_eq!(out, "evil\\n\\u{1b}[31mred\t-\tUNAVAIL\n");
        assert!(!out.contains('\x1b'));
    }

    #[test]
    fn iostat_counts_scrub_as_reads_by_class_name() {
        let f = IostatFlags { scripted: true, parsable: true, ..Default::default() };
        let prev = [iostat_entry(1_000_000_000, IoClass::Scrub, 0, 0)];
        let cur = [iostat_entry(3_000_000_000, IoClass::Scrub, 200, 2_000_000)];
        let out = iostat_report(&cur, Some(&prev), f);
        // pool alloc free read-ops write-ops read-bw write-bw, over 2 s
        assert_eq!(out.trim_end(), "tank\t0\t0\t100\t0\t1000000\t0");
        let cur = [iostat_entry(3_000_000_000, IoClass::AsyncWrite, 20, 4_000_000)];
        let out = iostat_report(&cur, Some(&prev), f);
        assert_eq!(out.trim_end(), "tank\t0\t0\t0\t10\t0\t2000000");
    }

    fn leaf(name: &str, state: &str) -> VdevStatus {
        VdevStatus {
            name: name.into(),
            kind: "file".into(),
            role: Role::Normal,
            state: state.into(),
            read_errors: 0,
            write_errors: 0,
            cksum_errors: 0,
            note: String::new(),
            children: vec![],
        }
    }

    #[test]
    fn status_tree_has_zpool_shape() {
        let mut m = leaf("mirror-0", "ONLINE");
        m.kind = "mirror".into();
        m.children = vec![leaf("/d/a", "ONLINE"), leaf("/d/b", "ONLINE")];
        let mut log = leaf("sim-ssd:/d/log", "ONLINE");
        log.role = Role::Log;
        let s = PoolStatus {
            name: "tank".into(),
            guid: zilla_core::Guid(1),
            state: zilla_core::spa::PoolHealth::Online,
            scan: Default::default(),
            trim: Default::default(),
            config: vec![m, log],
            data_errors: 0,
            error_list: vec![],
        };
        let out = pool_status(&s, None, false);
        assert!(out.contains("  pool: tank\n state: ONLINE\n  scan: none requested\nconfig:\n\n"));
        assert!(out.contains("\tNAME              STATE     READ WRITE CKSUM\n"), "{out}");
        assert!(out.contains("\t  mirror-0        ONLINE       0     0     0\n"), "{out}");
        assert!(out.contains("\t    /d/a          ONLINE       0     0     0\n"), "{out}");
        assert!(out.contains("\tlogs\n\t  sim-ssd:/d/log"), "{out}");
        assert!(out.ends_with("errors: No known data errors\n"));
        assert!(is_healthy(&s));
    }

    #[test]
    fn scripted_tables_use_tabs() {
        let t = table(&["A", "B"], &[Align::Left, Align::Right], &[vec!["x".into(), "1".into()]], true);
        assert_eq!(t, "x\t1\n");
        let t = table(&["NAME", "SIZE"], &[Align::Left, Align::Right], &[vec!["tank".into(), "1.50G".into()]], false);
        assert_eq!(t, "NAME   SIZE\ntank  1.50G\n");
    }

    #[test]
    fn histogram_labels() {
        assert_eq!(bucket_label(0, false), "1ns");
        assert_eq!(bucket_label(9, false), "1us");
        assert_eq!(bucket_label(19, false), "1ms");
        assert_eq!(bucket_label(36, false), "137s");
        assert_eq!(hist_avg(&[0, 0, 4]), Some(4));
    }
}

/// zilstat's default columns after `time`: (column, kstat name or sum of names).
pub const ZILSTAT_COLUMNS: [(&str, &[&str]); 10] = [
    ("cc", &["zil_commit_count"]),
    ("ic", &["zil_itx_count"]),
    ("idc", &["zil_itx_copied_count", "zil_itx_needcopy_count"]),
    ("idb", &["zil_itx_copied_bytes", "zil_itx_needcopy_bytes"]),
    ("iic", &["zil_itx_indirect_count"]),
    ("iib", &["zil_itx_indirect_bytes"]),
    ("imnc", &["zil_itx_metaslab_normal_count"]),
    ("imnw", &["zil_itx_metaslab_normal_write"]),
    ("imsc", &["zil_itx_metaslab_slog_count"]),
    ("imsw", &["zil_itx_metaslab_slog_write"]),
];

/// `zilla txgs`: the kstat's columns, raw numbers (bytes, ns) as OpenZFS prints them.
pub fn txgs_table(rows: &[crate::api::TxgEntry], scripted: bool) -> String {
    let headers = ["txg", "birth", "state", "ndirty", "nread", "nwritten", "reads", "writes", "otime", "qtime", "wtime", "stime"];
    let mut align = vec![Align::Right; headers.len()];
    align[2] = Align::Left;
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|t| {
            let n = [t.ndirty, t.nread, t.nwritten, t.reads, t.writes, t.otime, t.qtime, t.wtime, t.stime];
            [t.txg.to_string(), t.birth.to_string(), t.state.clone()].into_iter().chain(n.iter().map(u64::to_string)).collect()
        })
        .collect();
    table(&headers, &align, &cells, scripted)
}

pub fn zilstat_header() -> String {
    let mut o = format!("{:>8}", "time");
    for (c, _) in ZILSTAT_COLUMNS {
        o.push_str(&format!(" {c:>6}"));
    }
    o
}

/// One zilstat row: totals (`prev` None) or the rate per second since `prev`.
pub fn zilstat_row(cur: &std::collections::BTreeMap<String, u64>, prev: Option<&std::collections::BTreeMap<String, u64>>, secs: f64) -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs() % 86400;
    let mut o = format!("{:>8}", format!("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60));
    for (_, names) in ZILSTAT_COLUMNS {
        let sum = |m: &std::collections::BTreeMap<String, u64>| names.iter().map(|k| m.get(*k).copied().unwrap_or(0)).sum::<u64>();
        let v = match prev {
            None => sum(cur),
            Some(p) => (sum(cur).saturating_sub(sum(p)) as f64 / secs).round() as u64,
        };
        o.push_str(&format!(" {:>6}", crate::units::nicenum(v)));
    }
    o
}
