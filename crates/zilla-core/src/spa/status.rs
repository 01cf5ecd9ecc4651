//! spa status: what `zilla pool status`, `list`, `iostat` and `get` report, as data.
//!
//! Theory of operation
//! -------------------
//! Everything here is read-only snapshots of live counters and state; the prose that
//! `zpool status` prints around them (status/action paragraphs, the scan line) is the
//! binary's business.
use std::sync::atomic::Ordering;

use super::Pool;
use crate::props::PropRow;
use std::sync::Arc;

use crate::vdev::mirror::{Leaf, LeafState, TopVdev};
use crate::vdev::queue::LeafStats;
use crate::vdev::Role;
use crate::Guid;

/// One node of `zilla pool status`'s config tree.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VdevStatus {
    /// Leaf: its spec string; mirror: "mirror-N"; class headers are not nodes.
    pub name: String,
    /// "mirror", "file", "disk", "sim-hdd", "sim-ssd", ...
    pub kind: String,
    pub role: Role,
    /// ONLINE, DEGRADED, FAULTED, OFFLINE, UNAVAIL, REMOVED
    pub state: String,
    pub read_errors: u64,
    pub write_errors: u64,
    pub cksum_errors: u64,
    /// e.g. "(resilvering)" or "" 
    pub note: String,
    pub children: Vec<VdevStatus>,
}

/// A pool's health, as `zpool status` names it (serialized the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PoolHealth {
    Online,
    /// Some redundancy lost; every block still readable.
    Degraded,
    /// A normal-class top-level vdev is gone: data unreachable.
    Unavail,
    /// A txg sync failed: nothing more is written until it succeeds.
    Suspended,
}

impl PoolHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolHealth::Online => "ONLINE",
            PoolHealth::Degraded => "DEGRADED",
            PoolHealth::Unavail => "UNAVAIL",
            PoolHealth::Suspended => "SUSPENDED",
        }
    }
}

impl std::fmt::Display for PoolHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compare with the `zpool status` name ("ONLINE", ...).
impl PartialEq<&str> for PoolHealth {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub guid: Guid,
    pub state: PoolHealth,
    /// The last or current scrub/resilver (`func` empty: never run).
    pub scan: crate::scan::ScanStatus,
    /// The manual trim (`zilla pool trim`) since import (`state` none: never run).
    #[serde(default)]
    pub trim: super::trim::TrimStatus,
    pub config: Vec<VdevStatus>,
    /// Blocks that could not be read or repaired since the last `clear`.
    pub data_errors: u64,
    /// The affected blocks (`status -v`).
    pub error_list: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PoolListRow {
    pub name: String,
    pub size: u64,
    pub alloc: u64,
    pub free: u64,
    pub frag_percent: u64,
    pub cap_percent: u64,
    pub health: PoolHealth,
    pub ashift: u8,
    /// What a sparse volume may still write (`SpaceFigures::available`): free space
    /// less the slop and the thick volumes' unused reservations.
    #[serde(default)]
    pub avail: u64,
}

/// One vdev in an iostat snapshot (cumulative counters; the CLI takes differences).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IostatNode {
    pub name: String,
    pub role: Role,
    pub alloc: u64,
    pub free: u64,
    /// Sum over children for interior nodes.
    pub stats: LeafStats,
    pub children: Vec<IostatNode>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IostatSnapshot {
    pub pool: String,
    pub timestamp_ns: u64,
    pub alloc: u64,
    pub free: u64,
    pub stats: LeafStats,
    pub vdevs: Vec<IostatNode>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VolumeInfo {
    /// "pool/name"
    pub name: String,
    pub volsize: u64,
    pub volblocksize: u32,
    /// referenced plus the unused reservation (zfs `used`).
    pub used: u64,
    pub readonly: bool,
    /// The pool's available space, plus the volume's unused reservation (zfs).
    #[serde(default)]
    pub available: u64,
    /// Committed data blocks, volblocksize each.
    #[serde(default)]
    pub referenced: u64,
    /// Bytes; 0 = none (sparse).
    #[serde(default)]
    pub refreservation: u64,
    #[serde(default)]
    pub logicalused: u64,
}

/// What `status` prints beside a leaf: "(resilvering)" while a resilver repairs it,
/// and why import found it behind or apart from its siblings while it still misses
/// txgs ("(missed txgs 12-20; resilvering)").
fn leaf_note(c: &crate::vdev::mirror::Leaf, resilvering: bool) -> String {
    match (c.import_note(), resilvering && !c.dtl_empty()) {
        (Some(n), true) => format!("({n}; resilvering)"),
        (Some(n), false) => format!("({n})"),
        (None, true) => "(resilvering)".into(),
        (None, false) => String::new(),
    }
}

/// Add leaf statistics `b` into `a` (a vdev's sum over its children).
fn add_stats(a: &mut LeafStats, b: &LeafStats) {
    for i in 0..crate::vdev::IoClass::ALL.len() {
        a.ops[i] += b.ops[i];
        a.bytes[i] += b.bytes[i];
        a.device_ops[i] += b.device_ops[i];
        a.aggregated[i] += b.aggregated[i];
        a.queued[i] += b.queued[i];
        a.errors[i] += b.errors[i];
        a.active[i] += b.active[i];
        a.total_latency_sum_ns[i] += b.total_latency_sum_ns[i];
        a.disk_latency_sum_ns[i] += b.disk_latency_sum_ns[i];
    }
    a.flushes += b.flushes;
    for (ha, hb) in [(&mut a.total_latency_hist, &b.total_latency_hist), (&mut a.disk_latency_hist, &b.disk_latency_hist)] {
        if ha.len() < hb.len() {
            ha.resize(hb.len(), vec![]);
        }
        for (x, y) in ha.iter_mut().zip(hb.iter()) {
            if x.len() < y.len() {
                x.resize(y.len(), 0);
            }
            for (p, q) in x.iter_mut().zip(y.iter()) {
                *p += q;
            }
        }
    }
}

/// How `status` and `iostat -v` show a top-level vdev: `name` None when it is its one
/// leaf, else `mirror-N` or (a lone disk being replaced) `replacing-N`; `groups` its
/// children in order, each a leaf (None, [index]) or a `replacing-I` pair
/// (Some, [old, new]), I the old leaf's index among its siblings, as zpool numbers them.
struct TopLayout {
    name: Option<String>,
    groups: Vec<(Option<String>, Vec<usize>)>,
}

fn top_layout(t: &TopVdev, pairs: &[(Guid, Guid)]) -> TopLayout {
    let kids = t.children();
    let at = |g: Guid| kids.iter().position(|c| c.guid == g);
    let pairs: Vec<(usize, usize)> = pairs.iter().filter_map(|&(old, new)| Some((at(old)?, at(new)?))).collect();
    if kids.len() == 1 {
        return TopLayout { name: None, groups: vec![(None, vec![0])] };
    }
    if kids.len() == 2 && pairs.len() == 1 {
        let (old, new) = pairs[0];
        return TopLayout { name: Some(format!("replacing-{}", t.id)), groups: vec![(None, vec![old]), (None, vec![new])] };
    }
    let mut groups = Vec::new();
    for i in 0..kids.len() {
        if pairs.iter().any(|&(_, new)| new == i) {
            continue; // shown under its replacing-I
        }
        match pairs.iter().find(|&&(old, _)| old == i) {
            Some(&(old, new)) => groups.push((Some(format!("replacing-{old}")), vec![old, new])),
            None => groups.push((None, vec![i])),
        }
    }
    TopLayout { name: Some(format!("mirror-{}", t.id)), groups }
}

/// A leaf's name in `status` and `iostat -v`: its path, and `PATH/old` for the device a
/// replacement in place is replacing (the new device at the same path, as zpool names it).
fn shown_leaf_name(c: &Leaf, pairs: &[(Guid, Guid)], kids: &[Arc<Leaf>]) -> String {
    let name = c.spec.display();
    let replaced_in_place = pairs.iter().filter(|&&(old, _)| old == c.guid).any(|&(_, new)| kids.iter().any(|k| k.guid == new && k.spec.display() == name));
    if replaced_in_place {
        format!("{name}/old")
    } else {
        name
    }
}

/// The leaves a resilver is repairing now: while it runs, every readable leaf with a
/// DTL except those the last pass could not repair.
fn resilver_repairs(inner: &std::sync::Arc<super::PoolInner>) -> Vec<Guid> {
    let scan = inner.scanner();
    let s = crate::scan::status(&scan);
    let active = s.func == crate::scan::ScanFunc::Resilver && (s.state == crate::scan::ScanState::Scanning || crate::scan::is_running(&scan));
    if !active {
        return Vec::new();
    }
    inner.leaves.read().iter().filter(|l| l.readable() && !l.dtl_empty() && !s.unrepaired_devices.contains(&l.guid)).map(|l| l.guid).collect()
}

/// A data or log vdev's state from its leaves, by zpool's rules: ONLINE when every
/// leaf is; a leaf that misses txgs (DTL) counts as healthy while a resilver repairs it
/// (a new disk being resilvered, one back from offline), as degraded otherwise; UNAVAIL
/// when none can be read; else DEGRADED.
fn top_state(leaves: &[Arc<Leaf>], repairing: &[Guid]) -> &'static str {
    let readable = leaves.iter().filter(|c| c.readable()).count();
    if readable == 0 {
        "UNAVAIL"
    } else if readable < leaves.len() || leaves.iter().any(|c| !c.dtl_empty() && !repairing.contains(&c.guid)) {
        "DEGRADED"
    } else {
        "ONLINE"
    }
}

impl Pool {
    /// True while the pool's txg syncs fail (it retries with backoff; writes are held).
    pub fn is_suspended(&self) -> bool {
        self.inner.suspended.load(Ordering::Relaxed)
    }

    fn health(&self) -> PoolHealth {
        if self.inner.suspended.load(Ordering::Relaxed) {
            return PoolHealth::Suspended;
        }
        let repairing = resilver_repairs(&self.inner);
        let mut worst = PoolHealth::Online;
        for t in self.inner.tops() {
            if t.role == Role::Cache || t.role == Role::Spare {
                continue;
            }
            match top_state(&t.children(), &repairing) {
                "UNAVAIL" if t.role == Role::Normal => return PoolHealth::Unavail,
                "ONLINE" => {}
                _ => worst = PoolHealth::Degraded,
            }
        }
        worst
    }

    pub fn status(&self) -> PoolStatus {
        let inner = &self.inner;
        let mut config = Vec::new();
        let resilvering = crate::scan::is_resilvering(&inner.scanner());
        let repairing = resilver_repairs(inner);
        let pairs = inner.replacements();
        for t in inner.tops() {
            let kids = t.children();
            let leaf = |i: usize| {
                let c = &kids[i];
                VdevStatus {
                    name: shown_leaf_name(c, &pairs, &kids),
                    kind: c.device().kind().to_string(),
                    role: t.role,
                    state: c.state().name().to_string(),
                    read_errors: c.read_errors.load(Ordering::Relaxed),
                    write_errors: c.write_errors.load(Ordering::Relaxed),
                    cksum_errors: c.cksum_errors.load(Ordering::Relaxed),
                    note: c.unavail_reason().unwrap_or_else(|| leaf_note(c, resilvering)),
                    children: vec![],
                }
            };
            let interior = |name: String, members: &[usize], children: Vec<VdevStatus>| {
                let of: Vec<Arc<Leaf>> = members.iter().map(|&i| kids[i].clone()).collect();
                let state = match t.role {
                    Role::Cache | Role::Spare => if of.iter().all(|k| k.state() == LeafState::Online) { "ONLINE" } else { "UNAVAIL" },
                    _ => top_state(&of, &repairing),
                };
                let kind = if name.starts_with("replacing") { "replacing" } else { "mirror" };
                VdevStatus { name, kind: kind.into(), role: t.role, state: state.into(), read_errors: 0, write_errors: 0, cksum_errors: 0, note: String::new(), children }
            };
            let layout = top_layout(&t, &pairs);
            let groups: Vec<VdevStatus> = layout
                .groups
                .iter()
                .map(|(name, members)| match name {
                    None => leaf(members[0]),
                    Some(n) => interior(n.clone(), members, members.iter().map(|&i| leaf(i)).collect()),
                })
                .collect();
            match layout.name {
                None => config.extend(groups),
                Some(n) => config.push(interior(n, &(0..kids.len()).collect::<Vec<_>>(), groups)),
            }
        }
        PoolStatus {
            name: inner.name.clone(),
            guid: inner.guid,
            state: self.health(),
            scan: crate::scan::status(&inner.scanner()),
            trim: self.trim_status(),
            config,
            data_errors: inner.io.errors.unrecoverable.load(Ordering::Relaxed),
            error_list: inner.io.error_list(),
        }
    }

    pub fn list_row(&self) -> PoolListRow {
        let ms = &self.inner.io.ms;
        let space = self.space_figures();
        let (size, alloc) = (space.size, space.allocated);
        PoolListRow {
            name: self.inner.name.clone(),
            size,
            alloc,
            free: size - alloc,
            avail: space.available,
            frag_percent: ms.frag_percent(),
            cap_percent: if size == 0 { 0 } else { alloc * 100 / size },
            health: self.health(),
            ashift: self.inner.config.lock().props.get("ashift").and_then(|a| a.parse().ok()).unwrap_or(12),
        }
    }

    pub fn iostat(&self) -> IostatSnapshot {
        // space per top-level vdev, read under the allocator lock without copying its trees
        let tops = self.inner.tops();
        let (mut vdev_space, (size, alloc)): (Vec<(u64, u64)>, (u64, u64)) = {
            let ms = &self.inner.io.ms;
            (tops.iter().map(|t| ms.vdev_space(t.id)).collect(), ms.space(Role::Normal))
        };
        // a cache device has no allocator: its alloc is what the L2ARC holds on it, its
        // size the ring's (zpool iostat -v); one the L2ARC does not use shows none
        if let Some(l2) = self.inner.io.l2arc() {
            for (t, space) in tops.iter().zip(vdev_space.iter_mut()).filter(|(t, _)| t.role == Role::Cache) {
                *space = l2.device_space(t.id).unwrap_or((0, 0));
            }
        }
        let mut total = LeafStats::default();
        let mut vdevs = Vec::new();
        let pairs = self.inner.replacements();
        for (t, &(size, alloc)) in tops.iter().zip(&vdev_space) {
            let mut tstats = LeafStats::default();
            let mut children = Vec::new();
            let kids = t.children();
            for c in &kids {
                let s = c.queue.stats();
                add_stats(&mut tstats, &s);
                children.push(IostatNode { name: shown_leaf_name(c, &pairs, &kids), role: t.role, alloc: 0, free: 0, stats: s, children: vec![] });
            }
            if t.role == Role::Normal {
                add_stats(&mut total, &tstats);
            }
            let layout = top_layout(t, &pairs);
            let mut groups: Vec<IostatNode> = layout
                .groups
                .iter()
                .map(|(name, members)| match name {
                    None => children[members[0]].clone(),
                    Some(n) => {
                        let mut stats = LeafStats::default();
                        members.iter().for_each(|&i| add_stats(&mut stats, &children[i].stats));
                        IostatNode { name: n.clone(), role: t.role, alloc: 0, free: 0, stats, children: members.iter().map(|&i| children[i].clone()).collect() }
                    }
                })
                .collect();
            match layout.name {
                Some(name) => vdevs.push(IostatNode { name, role: t.role, alloc, free: size.saturating_sub(alloc), stats: tstats, children: groups }),
                None => {
                    let mut c = groups.pop().expect("a top-level vdev has a child");
                    c.alloc = alloc;
                    c.free = size.saturating_sub(alloc);
                    vdevs.push(c);
                }
            }
        }
        IostatSnapshot {
            pool: self.inner.name.clone(),
            timestamp_ns: self.inner.env.unix_time_ns(),
            alloc,
            free: size - alloc,
            stats: total,
            vdevs,
        }
    }

    pub fn get_pool_props(&self) -> Vec<PropRow> {
        let row = self.list_row();
        let cfg = self.inner.config.lock().clone();
        let mut out = vec![];
        let mut push = |p: &str, v: String, s: &str| out.push(PropRow { name: cfg.name.clone(), property: p.into(), value: v, source: s.into(), note: None });
        push("size", row.size.to_string(), "-");
        push("allocated", row.alloc.to_string(), "-");
        push("free", row.free.to_string(), "-");
        push("available", row.avail.to_string(), "-");
        push("capacity", format!("{}%", row.cap_percent), "-");
        push("fragmentation", format!("{}%", row.frag_percent), "-");
        push("health", row.health.to_string(), "-");
        push("guid", cfg.guid.to_string(), "-");
        for (k, v) in &cfg.props {
            let default = super::config::POOL_PROP_DEFAULTS.iter().any(|(dk, dv)| dk == k && dv == v) && k != "ashift";
            push(k, v.clone(), if default { "default" } else { "local" });
        }
        out
    }

}
