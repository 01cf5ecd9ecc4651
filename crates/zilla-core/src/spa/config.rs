//! spa config: the pool configuration kept in every leaf's labels, and the admin
//! operations that change it (add, attach, detach, offline, online, replace, clear).
//!
//! Theory of operation
//! -------------------
//! [`PoolConfig`] is the vdev tree as JSON in each leaf's label (with that leaf's own
//! guid, [`LabelJson`]). A config change updates the live tree and rewrites the labels
//! (even copies, flush, odd copies, flush, so a crash leaves at least one intact copy of
//! either the old or new config) in one hold of `sync_lock`. No sync sees half a change,
//! and none runs between the two: an uberblock carries the guid sum of the live tree,
//! and import refuses an uberblock at or above the config's txg whose sum differs. A
//! sync in between once wrote the new sum under the old labels; a power cut there left
//! a pool that imported only with -F (found by the power-cut soak, a detach).
//! The config's txg is the open txg, above every uberblock written with the old sum.
//! A label write that fails may leave its config in some copies (attach and detach
//! then undo their change): the labels are stale, and the next sync writes the live
//! config before its uberblock (`rewrite_stale_labels`).
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

use super::{new_guid, Pool, PoolInner, TopSpec};
use crate::vdev::label;
use crate::vdev::mirror::{Leaf, LeafState, TopVdev};
use crate::vdev::{Device, LeafSpec, Role};
use crate::{Error, Guid, Result, Txg, VdevId};

/// Longest `clear` of a suspended pool waits for the retried sync's outcome.
pub const CLEAR_RETRY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens a leaf device from its spec; tests substitute crash or fault devices.
pub type Opener = Arc<dyn Fn(&LeafSpec, Role) -> Result<Arc<dyn Device>> + Send + Sync>;

pub fn default_opener() -> Opener {
    Arc::new(|spec: &LeafSpec, role: Role| crate::vdev::open_leaf(spec, role))
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeafConfig {
    pub guid: Guid,
    pub spec: LeafSpec,
    #[serde(default)]
    pub offline: bool,
    /// Txg at which the leaf went offline (its DTL starts there).
    #[serde(default)]
    pub offline_since: Txg,
    /// Before the MOS recorded leaf health, DTLs lived here; read from old labels
    /// (merged into the MOS's at import), never written now: the config must fit its
    /// label whatever a DTL grows to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dtl: Vec<(Txg, Txg)>,
    /// While a `replace` resilvers this (new) leaf: the guid of the sibling it
    /// replaces, detached once the resilver has finished (docs/on-disk-format.md §2.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacing: Option<Guid>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopConfig {
    pub id: VdevId,
    pub guid: Guid,
    pub role: Role,
    pub mirror: bool,
    pub ashift: u8,
    pub children: Vec<LeafConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolConfig {
    pub name: String,
    pub guid: Guid,
    pub version: u64,
    /// active | exported | destroyed
    pub state: String,
    pub txg: Txg,
    pub tops: Vec<TopConfig>,
    pub props: BTreeMap<String, String>,
    /// Host id of the system that last wrote the labels (0: a label from before hostids).
    #[serde(default)]
    pub hostid: u32,
    /// Its host name, for messages only.
    #[serde(default)]
    pub hostname: String,
    /// Format 2 (config version 2): the active features a reader must know (§9, §19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features_for_read: Option<Vec<String>>,
    /// Format 2: the active features only a writer must know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features_for_write: Option<Vec<String>>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LabelJson {
    pub this_guid: Guid,
    pub config: PoolConfig,
}

impl PoolConfig {
    pub fn guid_sum(&self) -> u64 {
        self.tops.iter().flat_map(|t| t.children.iter()).fold(0u64, |a, l| a.wrapping_add(l.guid.get()))
    }
}

/// Most top-level vdevs a label config may list.
pub const MAX_TOPS: usize = 1024;
/// Most children of one top-level vdev.
pub const MAX_CHILDREN: usize = 64;
/// Most leaves of a pool (the object directory's health section has the same bound).
pub const MAX_LEAVES: usize = crate::dmu::MOS_MAX_LEAVES as usize;
/// Most pool properties a label config may hold, and the longest key or value.
pub const MAX_PROPS: usize = 64;
pub const MAX_PROP_LEN: usize = 256;
/// Longest host name, leaf path or latency model a label config may hold.
pub const MAX_TEXT_LEN: usize = 4096;
/// Largest top-level vdev id.
pub const MAX_VDEV_ID: u32 = u16::MAX as u32;

/// Parse a label's JSON and check every field against the limits of
/// docs/on-disk-format.md §2.1. The error names the field and its value (made
/// printable); the caller adds the device.
pub fn parse_label(json: &[u8]) -> std::result::Result<LabelJson, String> {
    let lj: LabelJson = serde_json::from_slice(json).map_err(|e| format!("the pool config does not parse: {}", printable_text(&e.to_string())))?;
    validate_label(&lj)?;
    Ok(lj)
}

pub use crate::types::{is_unsafe_char, printable, printable_text, push_printable_char};

fn text_ok(s: &str) -> bool {
    s.len() <= MAX_TEXT_LEN && !s.chars().any(|c| c.is_control())
}

/// The checks of [`parse_label`] on a parsed label.
pub fn validate_label(lj: &LabelJson) -> std::result::Result<(), String> {
    let c = &lj.config;
    let bad = |field: &str, v: &dyn std::fmt::Display| Err(format!("field {field} = {v} is out of range"));
    if super::validate_pool_name(&c.name).is_err() {
        return bad("name", &format!("'{}'", printable(&c.name)));
    }
    if c.guid.get() == 0 {
        return bad("guid", &0);
    }
    if lj.this_guid.get() == 0 {
        return bad("this_guid", &0);
    }
    validate_version(c)?;
    if !matches!(c.state.as_str(), "active" | "exported" | "destroyed") {
        return bad("state", &format!("'{}'", printable(&c.state)));
    }
    if c.txg.is_zero() || !c.txg.is_valid_on_disk() {
        return bad("txg", &c.txg);
    }
    if !text_ok(&c.hostname) {
        return bad("hostname", &format!("'{}'", printable(&c.hostname)));
    }
    validate_props(&c.props)?;
    validate_tops(c)
}

/// Config version 1 has no feature lists; version 2 has both (§9).
fn validate_version(c: &PoolConfig) -> std::result::Result<(), String> {
    match (c.version, &c.features_for_read, &c.features_for_write) {
        (1, None, None) => Ok(()),
        (1, ..) => Err("fields features_for_read and features_for_write are not allowed in config version 1".into()),
        (2, Some(r), Some(w)) => {
            crate::zfeature::check_list("features_for_read", r)?;
            crate::zfeature::check_list("features_for_write", w)
        }
        (2, ..) => Err("config version 2 needs both fields features_for_read and features_for_write".into()),
        (v, ..) => Err(format!("field version = {v} is out of range (1 or 2)")),
    }
}

fn validate_props(props: &BTreeMap<String, String>) -> std::result::Result<(), String> {
    if props.len() > MAX_PROPS {
        return Err(format!("field props has {} entries (at most {MAX_PROPS})", props.len()));
    }
    for (k, v) in props {
        let known = POOL_PROP_DEFAULTS.iter().any(|(d, _)| d == k);
        let ok = k.len() <= MAX_PROP_LEN && v.len() <= MAX_PROP_LEN && text_ok(k) && text_ok(v);
        if !ok || (known && validate_pool_prop(k, v).is_err()) {
            return Err(format!("field props.{} = '{}' is out of range", printable(k), printable(v)));
        }
    }
    Ok(())
}

fn validate_tops(c: &PoolConfig) -> std::result::Result<(), String> {
    if c.tops.is_empty() || c.tops.len() > MAX_TOPS {
        return Err(format!("field tops has {} entries (1 to {MAX_TOPS})", c.tops.len()));
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut guids = std::collections::BTreeSet::new();
    let mut leaves = 0usize;
    for t in &c.tops {
        let at = format!("tops[id {}]", t.id);
        if t.id.get() > MAX_VDEV_ID || !ids.insert(t.id) {
            return Err(format!("field {at}.id = {} is out of range or repeated", t.id));
        }
        if t.guid.get() == 0 || !guids.insert(t.guid) {
            return Err(format!("field {at}.guid = {} is zero or repeated", t.guid));
        }
        if !(label::MIN_ASHIFT..=label::MAX_ASHIFT).contains(&t.ashift) {
            return Err(format!("field {at}.ashift = {} is out of range ({} to {})", t.ashift, label::MIN_ASHIFT, label::MAX_ASHIFT));
        }
        if t.children.is_empty() || t.children.len() > MAX_CHILDREN || (!t.mirror && t.children.len() > 1) {
            return Err(format!("field {at}.children has {} entries (1 to {MAX_CHILDREN}, 1 unless a mirror)", t.children.len()));
        }
        leaves += t.children.len();
        if leaves > MAX_LEAVES {
            return Err(format!("field tops lists more than {MAX_LEAVES} leaves"));
        }
        for l in &t.children {
            validate_leaf(l, &at, &mut guids)?;
        }
    }
    if !c.tops.iter().any(|t| t.role == Role::Normal) {
        return Err("field tops has no data vdev".to_string());
    }
    Ok(())
}

fn validate_leaf(l: &LeafConfig, at: &str, guids: &mut std::collections::BTreeSet<Guid>) -> std::result::Result<(), String> {
    if l.guid.get() == 0 || !guids.insert(l.guid) {
        return Err(format!("field {at}.children.guid = {} is zero or repeated", l.guid));
    }
    let at = format!("{at}.children[guid {}]", l.guid);
    let path = l.spec.path.to_string_lossy();
    if path.is_empty() || !text_ok(&path) {
        return Err(format!("field {at}.path = '{}' is out of range", printable(&path)));
    }
    if !l.offline_since.is_valid_on_disk() {
        return Err(format!("field {at}.offline_since = {} is out of range", l.offline_since));
    }
    if l.dtl.len() > crate::vdev::mirror::DTL_MAX_RANGES {
        return Err(format!("field {at}.dtl has {} ranges (at most {})", l.dtl.len(), crate::vdev::mirror::DTL_MAX_RANGES));
    }
    let mut prev: Option<Txg> = None;
    for &(a, b) in &l.dtl {
        if a.is_zero() || a > b || !b.is_valid_on_disk() || prev.is_some_and(|p| p >= a) {
            return Err(format!("field {at}.dtl range [{a}, {b}] is out of range or out of order"));
        }
        prev = Some(b);
    }
    Ok(())
}

/// Pool properties and their defaults (`ashift` is set at creation only).
pub const POOL_PROP_DEFAULTS: [(&str, &str); 5] =
    [("ashift", "0"), ("autoreplace", "off"), ("autotrim", "off"), ("failmode", "wait"), ("multihost", "off")];

pub(super) fn pool_props_with_defaults(props: &[(String, String)], ashift: u8) -> Result<BTreeMap<String, String>> {
    let mut m: BTreeMap<String, String> = POOL_PROP_DEFAULTS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    m.insert("ashift".to_string(), ashift.to_string());
    for (k, v) in props {
        let v = validate_pool_prop(k, v)?;
        m.insert(k.clone(), v);
    }
    Ok(m)
}

/// The value `v` of pool property `k` as stored (lower case), or why it is refused.
pub(super) fn validate_pool_prop(k: &str, v: &str) -> Result<String> {
    let v = v.trim().to_ascii_lowercase();
    match k {
        "ashift" => {
            let a: u8 = v.parse().map_err(|_| Error::invalid(format!("bad ashift '{v}'")))?;
            if a != 0 && !(label::MIN_ASHIFT..=label::MAX_ASHIFT).contains(&a) {
                return Err(Error::invalid(format!(
                    "ashift {a} not supported: 12 (4 KiB sectors) or 13 (8 KiB sectors), or 0 for automatic"
                )));
            }
        }
        "autoreplace" | "autotrim" | "multihost" => {
            if v != "on" && v != "off" {
                return Err(Error::invalid(format!("bad value '{v}' for {k}: expected on or off")));
            }
        }
        "failmode" => {
            if v == "continue" {
                return Err(Error::invalid(
                    "failmode=continue is not supported: while a pool is suspended its writes wait (failmode=wait)".to_string(),
                ));
            }
            if v != "wait" {
                return Err(Error::invalid(format!("bad value '{v}' for failmode: expected wait")));
            }
        }
        _ => return Err(Error::invalid(format!("unknown pool property '{k}'"))),
    }
    Ok(v)
}

/// The live top-level vdev for a config entry: the one place a `TopVdev` is built.
pub(super) fn open_top(tc: &TopConfig, children: Vec<Arc<Leaf>>) -> Arc<TopVdev> {
    Arc::new(TopVdev { id: tc.id, guid: tc.guid, role: tc.role, ashift: tc.ashift, children: RwLock::new(children), suspect_reads: Default::default() })
}

impl PoolInner {
    /// Refresh the config's per-leaf state from the live tree.
    pub fn refresh_config(&self) -> PoolConfig {
        let mut cfg = self.config.lock();
        self.refresh_locked(&mut cfg);
        cfg.clone()
    }

    /// [`PoolInner::refresh_config`] on the config its caller holds locked.
    fn refresh_locked(&self, cfg: &mut PoolConfig) {
        let synced = self.txg.synced_txg();
        for t in cfg.tops.iter_mut() {
            for l in t.children.iter_mut() {
                if let Some(leaf) = self.leaves.read().iter().find(|x| x.guid == l.guid) {
                    let off = leaf.state() == LeafState::Offline;
                    if off && !l.offline {
                        l.offline_since = synced.next();
                    }
                    l.offline = off;
                    l.dtl = Vec::new();
                    l.spec = leaf.spec.clone();
                }
            }
        }
    }

    /// Refuse to `what` (detach, offline) `leaf` when it is the only child of `top`
    /// holding some txgs: the others are missing them (DTL) or cannot be read.
    fn refuse_if_only_holder(&self, top: &TopVdev, leaf: &Leaf, name: &str, what: &str) -> Result<()> {
        let health = self.meta.lock().health.clone();
        let committed = |g: Guid| health.iter().find(|h| h.guid == g).map(|h| h.dtl.clone()).unwrap_or_default();
        let only = top.txgs_only_on(leaf, self.txg.open_txg(), &committed);
        if only.is_empty() {
            return Ok(());
        }
        let others: Vec<String> = top.children().iter().filter(|c| c.guid != leaf.guid).map(|c| c.spec.display()).collect();
        Err(Error::Busy(format!(
            "cannot {what} {name}: it is the only device holding txgs {} (missing on {}); let the resilver finish (zilla pool status), or bring the other devices back first",
            crate::vdev::mirror::ranges_text(&only),
            others.join(", ")
        )))
    }

    /// Write the config to every leaf's labels: even labels, flush, odd labels, flush,
    /// through each leaf's queue (after the writes queued before). One writer at a
    /// time, and each write carries a config txg above the last one written.
    pub fn write_config_labels(&self, state: &str) -> Result<()> {
        let _w = self.config_write_lock.lock();
        let (hostid, hostname) = (self.env.hostid(), crate::env::system_hostname());
        // refreshed, stamped and stored in one hold of the config lock: a change made
        // meanwhile under `sync_lock` alone (the scan rewrites the labels without it)
        // must not be overwritten with an older copy (a detached leaf came back)
        let cfg = {
            let mut live = self.config.lock();
            self.refresh_locked(&mut live);
            live.state = state.to_string();
            live.hostid = hostid;
            live.hostname = hostname;
            live.txg = self.txg.open_txg().max(live.txg.next());
            live.clone()
        };
        let leaves = self.leaves.read().clone();
        let r = self.write_labels(&cfg, &leaves);
        self.labels_stale.store(r.is_err(), Ordering::Release);
        r
    }

    /// Write the config `edit` makes of the live one to the labels of `new` leaves only
    /// (add, attach: before any leaf of the pool names them). Its config txg is spent
    /// even if the write fails (a new leaf may hold it): the next config write goes
    /// above it, and is due before the next uberblock.
    fn label_new_leaves(&self, new: &[Arc<Leaf>], edit: impl FnOnce(&mut PoolConfig)) -> Result<()> {
        let _w = self.config_write_lock.lock();
        let mut cfg = self.refresh_config();
        edit(&mut cfg);
        cfg.state = "active".to_string();
        cfg.txg = self.txg.open_txg().max(cfg.txg.next());
        self.config.lock().txg = cfg.txg;
        let r = self.write_labels(&cfg, new);
        if r.is_err() {
            self.labels_stale.store(true, Ordering::Release);
        }
        r
    }

    /// After a failed config write (`labels_stale`), write the live config before an
    /// uberblock carries its guid sum: the failed write may have left its config, newer
    /// than any other, in some label copies (a pass fails only where every device
    /// failed it, and the one before may have succeeded), and an attach or detach undoes
    /// its change; import refuses an uberblock at or above the newest config's txg
    /// whose sum is not that config's. Under `sync_lock`.
    pub(super) fn rewrite_stale_labels(&self) -> Result<()> {
        if !self.labels_stale.load(Ordering::Acquire) {
            return Ok(());
        }
        self.write_config_labels("active")
    }

    /// Write `cfg` to the labels of `leaves`: even labels, flush, odd labels, flush. Ok if
    /// every pass reached at least one online leaf.
    fn write_labels(&self, cfg: &PoolConfig, leaves: &[Arc<Leaf>]) -> Result<()> {
        for pass in [[0usize, 2], [1, 3]] {
            let mut ok = 0;
            for leaf in leaves.iter().filter(|l| l.state() == LeafState::Online) {
                if write_label_pass(leaf, cfg, pass)? {
                    ok += 1;
                }
            }
            if ok == 0 && !leaves.is_empty() {
                return Err(Error::Io(std::io::Error::other("could not write the pool config to any device")));
            }
        }
        Ok(())
    }
}

/// Write `cfg` into labels `pass` of `leaf` and flush. False if the leaf failed (its
/// error counters and DTL say so); Err only for a config too big for its label.
fn write_label_pass(leaf: &Arc<Leaf>, cfg: &PoolConfig, pass: [usize; 2]) -> Result<bool> {
    let json = serde_json::to_vec(&LabelJson { this_guid: leaf.guid, config: cfg.clone() })
        .map_err(|e| Error::Corrupt(format!("encoding the pool config: {e}")))?;
    let size = leaf.device().size();
    let mut good = true;
    for l in pass {
        let off = label::label_offset(size, l);
        let buf = label::encode_config(&json, cfg.txg, off)?;
        if leaf.queue.write(crate::vdev::IoClass::SyncWrite, &buf, off).is_err() {
            good = false;
        }
    }
    if !good {
        leaf.write_errors.fetch_add(1, Ordering::Relaxed);
        return Ok(false);
    }
    // a failed flush counts its own write error
    Ok(leaf.flush_blocking().is_ok())
}

impl Pool {
    /// `sync_lock` for a config change, refused once the pool is closed. Export writes
    /// its labels under the lock: a change that passed `check_open` before an export
    /// once went on after it, wrote "active" over the exported labels of released
    /// devices and started a resilver on the exported pool.
    fn lock_for_change(&self) -> Result<parking_lot::MutexGuard<'_, ()>> {
        let g = self.inner.sync_lock.lock();
        self.check_open()?;
        Ok(g)
    }

    pub fn add(&self, tops: Vec<TopSpec>, force: bool) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        if !force {
            check_replication(&inner.config.lock(), &tops)?;
        }
        let _g = self.lock_for_change()?;
        let mut new_tops = Vec::new();
        let mut next_id = inner.tops().iter().map(|t| t.id.next()).max().unwrap_or(VdevId(0));
        let new_specs: Vec<&LeafSpec> = tops.iter().flat_map(|t| t.leaves.iter()).collect();
        check_distinct_leaves(&new_specs, &inner.leaves.read(), &inner.name)?;
        for l in &new_specs {
            check_leaf_path(l)?;
        }
        for t in &tops {
            let mut kids = Vec::new();
            let mut cfg_kids = Vec::new();
            for l in &t.leaves {
                if inner.find_leaf(&l.display()).is_some() {
                    return Err(Error::invalid(format!("{} is already in pool '{}'", l.display(), inner.name)));
                }
                check_system_use(l, force)?;
                let dev = (inner.opener)(l, t.role)?;
                take_new_leaf(&*dev, l, t.role, force)?;
                label::wipe_labels(&*dev)?;
                let g = new_guid(&*inner.env);
                kids.push(Arc::new(Leaf::new(g, l.clone(), dev, &inner.env)));
                cfg_kids.push(LeafConfig { guid: g, spec: l.clone(), offline: false, offline_since: Txg::ZERO, dtl: vec![], replacing: None });
            }
            let pool_ashift = inner.config.lock().props.get("ashift").and_then(|a| a.parse().ok()).unwrap_or(label::MIN_ASHIFT);
            let ashift = kids.iter().try_fold(pool_ashift, |a, k| device_ashift(&**k.device(), &k.spec).map(|d| a.max(d)))?;
            let tc = TopConfig { id: next_id, guid: new_guid(&*inner.env), role: t.role, mirror: t.mirror, ashift, children: cfg_kids };
            new_tops.push((open_top(&tc, kids.clone()), tc, kids));
            next_id = next_id.next();
        }
        // The new leaves get the new config first: once any old leaf carries it, import
        // needs them, and a power cut between the two would leave a config naming
        // top-level vdevs with no label anywhere (an unimportable pool; found by the
        // power-cut test).
        let new_leaves: Vec<Arc<Leaf>> = new_tops.iter().flat_map(|(_, _, kids)| kids.iter().cloned()).collect();
        inner.label_new_leaves(&new_leaves, |cfg| cfg.tops.extend(new_tops.iter().map(|(_, tc, _)| tc.clone())))?;
        // The new vdevs' labels are written before the allocator may place a block on
        // them: a block there is never referenced from a pool whose labels do not know
        // the vdev. On failure the tree is as before.
        let guids: Vec<Guid> = new_tops.iter().flat_map(|(_, _, kids)| kids.iter().map(|k| k.guid)).collect();
        let ids: Vec<VdevId> = new_tops.iter().map(|(t, _, _)| t.id).collect();
        let mut alloc = Vec::new();
        for (top, tc, kids) in new_tops {
            inner.leaves.write().extend(kids);
            alloc.push(top.clone());
            inner.io.vdevs.write().push(top);
            inner.config.lock().tops.push(tc);
        }
        if let Err(e) = inner.write_config_labels("active") {
            inner.leaves.write().retain(|l| !guids.contains(&l.guid));
            inner.io.vdevs.write().retain(|t| !ids.contains(&t.id));
            inner.config.lock().tops.retain(|t| !ids.contains(&t.id));
            return Err(e);
        }
        for top in alloc.iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)) {
            inner.io.ms.add_vdev(top.id, top.role, top.asize());
        }
        for top in alloc.iter().filter(|t| t.role == Role::Cache) {
            inner.io.cache_vdev_added(top.clone());
        }
        inner.meta.lock().changed = true;
        inner.io.refresh_space();
        drop(_g);
        self.sync()
    }

    /// `zpool add -n`: the checks `add` makes before it opens a device (replication
    /// unless `force`, paths, leaves already in the pool), and the tree the pool would
    /// have: its top-level vdevs, then the new ones (numbered as `add` would number them).
    /// Nothing is opened or written.
    pub fn add_dry_run(&self, tops: &[TopSpec], force: bool) -> Result<Vec<super::status::VdevStatus>> {
        self.check_open()?;
        let inner = &self.inner;
        if !force {
            check_replication(&inner.config.lock(), tops)?;
        }
        let new_specs: Vec<&LeafSpec> = tops.iter().flat_map(|t| t.leaves.iter()).collect();
        check_distinct_leaves(&new_specs, &inner.leaves.read(), &inner.name)?;
        for l in &new_specs {
            check_leaf_path(l)?;
            if inner.find_leaf(&l.display()).is_some() {
                return Err(Error::invalid(format!("{} is already in pool '{}'", l.display(), inner.name)));
            }
        }
        let mut tree = self.status().config;
        let mut next_id = inner.tops().iter().map(|t| t.id.next()).max().unwrap_or(VdevId(0));
        let node = |name: String, kind: &str, role: Role, children| super::status::VdevStatus {
            name, kind: kind.into(), role, state: String::new(), read_errors: 0, write_errors: 0, cksum_errors: 0, note: String::new(), children,
        };
        for t in tops {
            let leaves: Vec<_> = t.leaves.iter().map(|l| node(l.display(), "disk", t.role, vec![])).collect();
            match t.mirror {
                true => tree.push(node(format!("mirror-{next_id}"), "mirror", t.role, leaves)),
                false => tree.extend(leaves),
            }
            next_id = next_id.next();
        }
        Ok(tree)
    }

    pub fn attach(&self, existing: &str, new: &LeafSpec, force: bool) -> Result<()> {
        self.attach_leaf(existing, new, force, false)
    }

    /// `attach`, or with `replacing` the first half of `replace`: the new leaf's config
    /// names `existing` as the leaf it replaces ([`Pool::finish_replacements`]).
    fn attach_leaf(&self, existing: &str, new: &LeafSpec, force: bool, replacing: bool) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (top, old) = inner.find_leaf(existing).ok_or_else(|| Error::NotFound(format!("device '{existing}' in pool '{}'", inner.name)))?;
        if top.role == Role::Cache || top.role == Role::Spare {
            return Err(Error::invalid("cannot attach to a cache or spare device"));
        }
        // a replacement in place: the new device is at the old one's path
        let in_place = replacing && new.display() == old.spec.display();
        if !in_place && inner.find_leaf(&new.display()).is_some() {
            return Err(Error::invalid(format!("{} is already in pool '{}'", new.display(), inner.name)));
        }
        let others: Vec<Arc<Leaf>> = inner.leaves.read().iter().filter(|l| !(in_place && l.guid == old.guid)).cloned().collect();
        check_distinct_leaves(&[new], &others, &inner.name)?;
        check_leaf_path(new)?;
        check_system_use(new, force)?;
        let dev = (inner.opener)(new, top.role)?;
        take_new_leaf(&*dev, new, top.role, force)?;
        let need = device_ashift(&*dev, new)?;
        if need > top.ashift {
            return Err(Error::invalid(format!(
                "{} has {}-byte sectors, larger than the vdev's ashift {} ({} bytes): a write would share a physical sector with live data",
                new.display(),
                1u32 << need,
                top.ashift,
                1u32 << top.ashift
            )));
        }
        if label::usable_end(dev.size()) < top.asize() + label::DATA_START {
            // zpool: "device is too small"; the sizes say by how much
            let need_bytes = top.asize() + label::DATA_START + 2 * label::LABEL_SIZE;
            return Err(Error::invalid(format!(
                "{} is too small to attach: {} bytes, the vdev needs at least {} bytes",
                new.display(),
                dev.size(),
                need_bytes
            )));
        }
        label::wipe_labels(&*dev)?;
        let g = new_guid(&*inner.env);
        let leaf = Arc::new(Leaf::new(g, new.clone(), dev, &inner.env));
        // it has nothing: every txg up to now is missing
        leaf.set_dtl(vec![(Txg(1), inner.txg.open_txg())]);
        {
            // the labels are written before a sync may put the new guid sum in an
            // uberblock (see the module comment)
            let _g = self.lock_for_change()?;
            let lc = LeafConfig { guid: g, spec: new.clone(), offline: false, offline_since: Txg::ZERO, dtl: vec![], replacing: replacing.then_some(old.guid) };
            // the new leaf is labelled first, as in `add`: a cut after an old leaf took
            // the config naming it once left it unlabelled, UNAVAIL at import
            if let Err(e) = inner.label_new_leaves(std::slice::from_ref(&leaf), |cfg| push_child(cfg, top.id, lc.clone())) {
                abandon_new_leaf(&leaf);
                return Err(e);
            }
            let before = inner.tree_before(&top);
            top.children.write().push(leaf.clone());
            inner.leaves.write().push(leaf.clone());
            push_child(&mut inner.config.lock(), top.id, lc);
            if let Err(e) = inner.write_config_labels("active") {
                inner.restore_tree(&top, before);
                abandon_new_leaf(&leaf);
                return Err(e);
            }
        }
        crate::scan::start_resilver(&inner.scanner());
        Ok(())
    }

    /// [`PoolInner::refuse_if_only_holder`], asked again after one txg sync when it
    /// refuses: a resilver that finished since the last sync cleared its target's DTL in
    /// memory only, and the check also reads the DTLs the object directory still has
    /// (`status` already says the resilver finished; with `zfs_txg_timeout` raised the
    /// refusal lasted until the next sync, minutes).
    fn refuse_if_only_holder_after_sync(&self, top: &TopVdev, leaf: &Leaf, name: &str, what: &str) -> Result<()> {
        match self.inner.refuse_if_only_holder(top, leaf, name, what) {
            Err(e @ Error::Busy(_)) => {
                if self.sync().is_err() {
                    return Err(e); // a pool whose syncs fail: the refusal as it was
                }
                self.inner.refuse_if_only_holder(top, leaf, name, what)
            }
            r => r,
        }
    }

    pub fn detach(&self, dev: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (top, leaf) = inner.find_leaf(dev).ok_or_else(|| Error::NotFound(format!("device '{dev}' in pool '{}'", inner.name)))?;
        let kids = top.children();
        if top.role == Role::Normal || top.role == Role::Log {
            if kids.len() < 2 {
                return Err(Error::invalid(format!("cannot detach {dev}: only a device of a mirror can be detached")));
            }
            self.refuse_if_only_holder_after_sync(&top, &leaf, dev, "detach")?;
        }
        {
            // The labels get the config without the leaf before a sync may put the new
            // guid sum in an uberblock, and before the leaf's own labels are wiped: a
            // power cut in between leaves the old config with the old sum, or the new
            // one (the leaf, still labelled, is then not in it and import passes it by).
            let _g = self.lock_for_change()?;
            let before = inner.tree_before(&top);
            top.children.write().retain(|c| c.guid != leaf.guid);
            inner.leaves.write().retain(|c| c.guid != leaf.guid);
            {
                let mut cfg = inner.config.lock();
                for tc in cfg.tops.iter_mut() {
                    tc.children.retain(|c| c.guid != leaf.guid);
                    tc.mirror = tc.children.len() > 1;
                    // a replace ends with either of its two leaves detached
                    tc.children.iter_mut().filter(|c| c.replacing == Some(leaf.guid)).for_each(|c| c.replacing = None);
                }
                if top.role == Role::Cache || top.role == Role::Spare {
                    cfg.tops.retain(|t| t.id != top.id);
                }
            }
            if let Err(e) = inner.write_config_labels("active") {
                inner.restore_tree(&top, before);
                return Err(e);
            }
            if top.role == Role::Cache || top.role == Role::Spare {
                inner.io.vdevs.write().retain(|t| t.id != top.id);
            }
        }
        if top.role == Role::Cache {
            // no feed write may land on the device once it is released
            inner.io.cache_vdev_removed(top.id);
        }
        let _ = label::wipe_labels(&**leaf.device());
        leaf.device().release();
        crate::scan::leaf_detached(&inner.scanner());
        Ok(())
    }

    /// `zpool remove`: a log vdev (by its leaf name, or `mirror-N` for a log mirror),
    /// a cache or a spare device. Data vdevs cannot be removed.
    ///
    /// A log vdev leaves in four steps: it takes no new allocations; every volume's
    /// chain moves its tail elsewhere ([`crate::zil::Zilog::evacuate`]) and txgs sync
    /// until no chain block on it is referenced (the records in them are then in the
    /// pool itself); its deferred frees are released and one more txg writes space
    /// maps with nothing on it; then the config without it is written to the labels.
    /// A power cut at any point leaves either the old config (the vdev still in the
    /// pool, maybe empty) or the new one with no reference to the vdev anywhere.
    pub fn remove(&self, dev: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let top = match dev.strip_prefix("mirror-").and_then(|n| n.parse::<u32>().ok()) {
            Some(id) => inner.tops().into_iter().find(|t| t.id.get() == id && t.children().len() > 1),
            None => inner.find_leaf(dev).map(|(t, _)| t),
        };
        let top = top.ok_or_else(|| Error::NotFound(format!("device '{dev}' in pool '{}'", inner.name)))?;
        match top.role {
            Role::Cache | Role::Spare => self.detach(dev),
            Role::Normal => Err(Error::invalid(format!(
                "cannot remove {dev}: only log, cache and spare devices can be removed (data vdev removal is not supported)"
            ))),
            Role::Log if top.children().len() > 1 && !dev.starts_with("mirror-") => Err(Error::invalid(format!(
                "cannot remove {dev}: it is part of the log mirror mirror-{id}; remove mirror-{id} or detach {dev}",
                id = top.id
            ))),
            Role::Log => self.remove_log(&top),
        }
    }

    fn remove_log(&self, top: &Arc<TopVdev>) -> Result<()> {
        let inner = &self.inner;
        let id = top.id;
        inner.io.ms.set_noalloc(id, true);
        let r = self.evacuate_log(id);
        if r.is_err() {
            inner.io.ms.set_noalloc(id, false);
        }
        r?;
        let labels = {
            // labels before any uberblock with the new guid sum (module comment)
            let _g = self.lock_for_change()?;
            inner.io.ms.remove_vdev(id)?;
            let guids: Vec<Guid> = top.children().iter().map(|c| c.guid).collect();
            inner.io.vdevs.write().retain(|t| t.id != id);
            inner.leaves.write().retain(|l| !guids.contains(&l.guid));
            inner.config.lock().tops.retain(|t| t.id != id);
            inner.io.refresh_space();
            inner.write_config_labels("active")
        };
        // Nothing undoes the removal in the live tree: the log is evacuated, and a
        // failed label write leaves the labels stale, so the next sync writes them
        // before its uberblock (or fails). The removed leaves lose their labels only
        // when a config without them is on disk: until then the labels that are still
        // list them, and a power cut must find them there.
        if let Err(e) = labels {
            for leaf in top.children() {
                leaf.device().release();
            }
            let devs: Vec<String> = top.children().iter().map(|c| c.spec.display()).collect();
            return Err(Error::Io(std::io::Error::other(
                format!(
                    "the log vdev is out of the pool, but writing the new configuration failed ({e}); the next txg sync \
                     writes it again. {} keep their labels (a new pool takes them with -f)",
                    devs.join(", ")
                ),
            )));
        }
        for leaf in top.children() {
            let _ = label::wipe_labels(&**leaf.device());
            leaf.device().release();
        }
        inner.meta.lock().changed = true;
        self.sync()
    }

    /// Make every intent-log block on vdev `id` unreferenced and free, and the space
    /// maps on disk say so.
    fn evacuate_log(&self, id: crate::VdevId) -> Result<()> {
        const SYNCS_MAX: usize = 12;
        let inner = &self.inner;
        for _ in 0..SYNCS_MAX {
            let vols: Vec<_> = inner.volumes.read().values().cloned().collect();
            let open = || inner.txg.open_txg();
            let mut busy = false;
            for v in &vols {
                let admit = |len: u64| crate::dsl_pool::admit_log_block(&inner.io, &inner.dirty, len);
                busy |= !v.zil.evacuate(&inner.io, id, &open, &admit)?;
                busy |= v.zil.references_vdev(id);
            }
            if !busy {
                let left = {
                    let _g = inner.sync_lock.lock();
                    inner.io.ms.drain_vdev(id)
                };
                if left == 0 {
                    inner.meta.lock().changed = true;
                    return self.sync();
                }
            }
            inner.meta.lock().changed = true;
            self.sync()?;
        }
        Err(Error::Busy(format!(
            "cannot remove the log vdev: intent log blocks on it are still in use after {SYNCS_MAX} txgs; try again"
        )))
    }

    pub fn offline(&self, dev: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (top, leaf) = inner.find_leaf(dev).ok_or_else(|| Error::NotFound(format!("device '{dev}' in pool '{}'", inner.name)))?;
        if leaf.state() == LeafState::Offline {
            return Ok(());
        }
        if matches!(top.role, Role::Normal | Role::Log) {
            if !top.children().iter().any(|c| c.guid != leaf.guid && c.readable()) {
                return Err(Error::invalid(format!("cannot offline {dev}: no valid replicas")));
            }
            self.refuse_if_only_holder_after_sync(&top, &leaf, dev, "offline")?;
        }
        // under the sync lock up to the labels: `offline_since` is the first txg the
        // leaf misses, so no sync may run between the state change and the config
        let _g = self.lock_for_change()?;
        leaf.set_state(LeafState::Offline);
        inner.write_config_labels("active")
    }

    pub fn online(&self, dev: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (top, leaf) = inner.find_leaf(dev).ok_or_else(|| Error::NotFound(format!("device '{dev}' in pool '{}'", inner.name)))?;
        match leaf.state() {
            LeafState::Online => return Ok(()),
            LeafState::Unavail if reopenable(&top, &leaf) => return self.online_missing(&top, &leaf, dev),
            LeafState::Unavail => {
                return Err(Error::invalid(format!("cannot online {dev}: it is the only device of its vdev and was missing at import; export and import the pool")));
            }
            _ => {}
        }
        {
            let _g = self.lock_for_change()?;
            leaf.set_state(LeafState::Online);
            inner.write_config_labels("active")?;
        }
        if matches!(inner.meta.lock().health.iter().find(|h| h.guid == leaf.guid), Some(h) if h.faulted) {
            self.sync()?; // a fault the MOS records is cleared there too
        }
        if !leaf.dtl_empty() {
            crate::scan::start_resilver(&inner.scanner());
        }
        Ok(())
    }

    /// `online` (and `clear`) of a device that was UNAVAIL at import (missing, or
    /// another pool's device at its path), as `zpool online` reopens it: the device now
    /// at its path is taken only if its label is this leaf's (this pool, this device
    /// guid). It then replaces the placeholder and gets the current config; a cache
    /// device joins the L2ARC empty; a data or log device first gets in its DTL every
    /// txg it may lack ([`missed_while_away`]) and is resilvered. Anything else at the
    /// path is refused, saying what is there, and is not written.
    fn online_missing(&self, top: &Arc<TopVdev>, leaf: &Arc<Leaf>, name: &str) -> Result<()> {
        let inner = &self.inner;
        let dev = (inner.opener)(&leaf.spec, top.role).map_err(|e| match e {
            Error::NotFound(_) => Error::NotFound(format!("cannot online {name}: {} does not exist", leaf.spec.display())),
            e => e,
        })?;
        let found = label::scan_labels(&*dev).ok().and_then(|scan| scan.config).map(|(_, j)| parse_label(&j));
        let why = match &found {
            Some(Ok(lj)) if lj.config.guid == inner.guid && lj.this_guid == leaf.guid => None,
            Some(Ok(lj)) if lj.config.guid != inner.guid => {
                Some(format!("label belongs to pool '{}' (guid {})", printable(&lj.config.name), lj.config.guid))
            }
            Some(Ok(lj)) => Some(format!("label names device guid {} of this pool, not this device (guid {})", lj.this_guid, leaf.guid)),
            Some(Err(why)) => Some(format!("its label does not parse: {why}")),
            None => Some("no valid label".to_string()),
        };
        if let Some(why) = why {
            dev.release();
            leaf.set_unavail_reason(why.clone());
            return Err(Error::invalid(format!(
                "cannot online {name}: {why}; put this pool's device back at {}, or remove the device from the pool and add one anew",
                leaf.spec.display()
            )));
        }
        let fresh = Arc::new(Leaf::new(leaf.guid, leaf.spec.clone(), dev, &inner.env));
        let data = holds_intent_log(top.role);
        let swap = |from: &Arc<Leaf>, to: &Arc<Leaf>| {
            if data && Arc::ptr_eq(to, &fresh) {
                // under the sync lock: what it missed is in its DTL before any read
                to.set_dtl(missed_while_away(inner, top, from, &**to.device()));
            }
            for c in top.children.write().iter_mut().filter(|c| c.guid == from.guid) {
                *c = to.clone();
            }
            for c in inner.leaves.write().iter_mut().filter(|c| c.guid == from.guid) {
                *c = to.clone();
            }
        };
        let labelled = self.lock_for_change().and_then(|_g| {
            swap(leaf, &fresh);
            let r = inner.write_config_labels("active");
            if r.is_err() {
                swap(&fresh, leaf);
            }
            r
        });
        if let Err(e) = labelled {
            fresh.device().release();
            return Err(e);
        }
        let what = match top.role {
            Role::Cache => "cache",
            Role::Spare => "spare",
            Role::Log => "log",
            Role::Normal => "data",
        };
        tracing::info!(pool = %inner.name, device = %fresh.spec.shown(), "{what} device missing at import reopened");
        if data {
            crate::scan::start_resilver(&inner.scanner());
        }
        // the L2ARC had no use of the placeholder (no space): it takes the device now
        if top.role == Role::Cache && inner.io.l2arc().is_none_or(|l| l.device_space(top.id).is_none()) {
            inner.io.cache_vdev_added(top.clone());
        }
        Ok(())
    }

    /// `zpool replace`: attach `new` next to `old` as its replacement and start the
    /// resilver; returns once it has started. The two show as `replacing-N` until the
    /// resilver has finished, when [`Pool::finish_replacements`] detaches `old`
    /// ([`Pool::replace_wait`] waits for that).
    pub fn replace(&self, old: &str, new: &LeafSpec, force: bool) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (_, leaf) = inner.find_leaf(old).ok_or_else(|| Error::NotFound(format!("device '{old}' in pool '{}'", inner.name)))?;
        if let Some((_, by)) = inner.replacements().into_iter().find(|&(o, _)| o == leaf.guid) {
            let by = inner.leaves.read().iter().find(|l| l.guid == by).map(|l| l.spec.display()).unwrap_or_default();
            return Err(Error::Busy(format!("{old} is already being replaced by {by}; wait for it with 'zilla pool wait -t replace'")));
        }
        if new.display() == leaf.spec.display() {
            self.check_replace_in_place(&leaf, force)?;
        }
        self.attach_leaf(old, new, force, true)
    }

    /// `zpool replace POOL DEV` with no new device: a new disk put where `leaf` was
    /// (its path). Refused while `leaf` itself works (zpool: "is busy"), and when the
    /// device at the path is this very leaf come back (that is `pool online`); the
    /// device found there must otherwise be free as for any replace (no label of an
    /// active or exported pool unless forced).
    fn check_replace_in_place(&self, leaf: &Arc<Leaf>, force: bool) -> Result<()> {
        let inner = &self.inner;
        let path = leaf.spec.display();
        if leaf.readable() {
            return Err(Error::Busy(format!("{path} is busy: it is this pool's working device; name a new device to replace it with")));
        }
        let (top, _) = inner.find_leaf(&leaf.guid.to_string()).ok_or_else(|| Error::NotFound(format!("device '{path}' in pool '{}'", inner.name)))?;
        if !top.children().iter().any(|c| c.guid != leaf.guid && c.readable()) {
            return Err(Error::invalid(format!("{path} has no valid replicas to be rebuilt from")));
        }
        let dev = (inner.opener)(&leaf.spec, top.role).map_err(|e| match e {
            Error::NotFound(_) => Error::NotFound(format!("{path} does not exist: put the new device at that path first")),
            e => e,
        })?;
        let own = label::scan_labels(&*dev)
            .ok()
            .and_then(|scan| scan.config)
            .and_then(|(_, j)| parse_label(&j).ok())
            .is_some_and(|lj| lj.config.guid == inner.guid && lj.this_guid == leaf.guid);
        let free = if own { Ok(()) } else { check_device_free(&*dev, &leaf.spec, force) };
        dev.release();
        if own {
            return Err(Error::invalid(format!(
                "{path} holds this pool's device {path} itself, back at its path: bring it back with 'zilla pool online {} {path}'",
                inner.name
            )));
        }
        free
    }

    /// Finish the replacements whose new leaf holds everything (no DTL, no resilver
    /// running): the resilver's repairs and cleared DTLs are made durable first (a
    /// cut in between must not leave the new leaf alone and incomplete), then the old
    /// leaf is detached. Each is detached at most once, however many callers race.
    pub fn finish_replacements(&self) -> Result<()> {
        let inner = &self.inner;
        let _one = inner.replace_lock.lock();
        let done = |new: Guid| !crate::scan::is_running(&inner.scanner()) && inner.leaves.read().iter().any(|l| l.guid == new && l.readable() && l.dtl_empty());
        if !inner.replacements().into_iter().any(|(_, new)| done(new)) {
            return Ok(());
        }
        self.sync()?;
        for (old, new) in inner.replacements() {
            if !done(new) {
                continue;
            }
            let shown = |g: Guid| inner.leaves.read().iter().find(|l| l.guid == g).map(|l| l.spec.display()).unwrap_or_default();
            let (old_name, new_name) = (shown(old), shown(new));
            self.detach(&old.to_string()).map_err(|e| match e {
                Error::Busy(why) => Error::Busy(format!("replace of {old_name} by {new_name} did not complete, both are kept: {why}")),
                e => e,
            })?;
            tracing::info!(pool = %inner.name, old = %old_name, new = %new_name, "replace finished");
        }
        Ok(())
    }

    /// Wait until no replacement is in progress (`replace -w`, `pool wait -t
    /// replace`): each resilver's end finishes those it completed. One the resilver
    /// ended without completing is an error that names it (both leaves are kept).
    pub fn replace_wait(&self) -> Result<()> {
        loop {
            crate::scan::wait(&self.inner.scanner());
            self.finish_replacements()?;
            let left = self.inner.replacements();
            if left.is_empty() {
                return Ok(());
            }
            if !crate::scan::is_running(&self.inner.scanner()) {
                let leaves = self.inner.leaves.read().clone();
                let shown = |g: Guid| leaves.iter().find(|l| l.guid == g).map(|l| l.spec.display()).unwrap_or_default();
                let (old, new) = left[0];
                return Err(Error::Busy(format!(
                    "replace of {} by {} did not complete: the resilver ended with {} still missing data; both are kept (zilla pool status)",
                    shown(old),
                    shown(new),
                    shown(new)
                )));
            }
        }
    }

    /// Whether a replacement is in progress.
    pub fn replacing(&self) -> bool {
        !self.inner.replacements().is_empty()
    }

    pub fn clear(&self, dev: Option<&str>) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        self.reopen_missing(dev);
        match dev {
            Some(d) => {
                let (_, l) = inner.find_leaf(d).ok_or_else(|| Error::NotFound(format!("device '{d}' in pool '{}'", inner.name)))?;
                l.clear_errors();
                if l.state() == LeafState::Faulted {
                    l.set_state(LeafState::Online);
                }
            }
            None => {
                for l in inner.leaves.read().iter() {
                    l.clear_errors();
                    if l.state() == LeafState::Faulted {
                        l.set_state(LeafState::Online);
                    }
                }
                inner.io.clear_errors();
            }
        }
        if inner.txg.suspended_by().is_some() {
            // the failed sync, retried now on the cleared devices: it commits (the pool
            // resumes, waiting writers go on) or the answer says they still fail
            if let Err(e) = inner.txg.retry_sync_now(CLEAR_RETRY_WAIT) {
                let n = &inner.name;
                let why = match e {
                    Error::Io(e) => e.to_string(),
                    e => e.to_string(),
                };
                return Err(Error::Busy(format!(
                    "pool '{n}' is still suspended: the retried sync failed ({why}); its devices still fail. \
                     Once they work again run `zilla pool clear {n}` again, or `zilla pool export -f {n}` \
                     exports the pool without the final sync"
                )));
            }
        }
        // the cleared faults are in the MOS when clear returns (a power cut must not
        // bring them back)
        inner.meta.lock().changed = true;
        self.sync()?;
        if inner.leaves.read().iter().any(|l| l.readable() && !l.dtl_empty()) {
            crate::scan::start_resilver(&inner.scanner());
        }
        Ok(())
    }

}

impl Pool {
    /// `clear` retries the devices missing since import (all, or the one named), as
    /// `zpool clear` reopens its devices: one now back at its path rejoins
    /// ([`Pool::online_missing`]); one still missing stays UNAVAIL, its reason updated.
    fn reopen_missing(&self, dev: Option<&str>) {
        let tops = self.inner.tops();
        for t in &tops {
            for l in t.children().iter().filter(|l| l.state() == LeafState::Unavail && reopenable(t, l)) {
                let named = dev.is_none_or(|d| self.inner.find_leaf(d).is_some_and(|(_, x)| x.guid == l.guid));
                if named {
                    if let Err(e) = self.online_missing(t, l, &l.spec.display()) {
                        tracing::info!(pool = %self.inner.name, device = %l.spec.shown(), "clear: device still unavailable: {e}");
                    }
                }
            }
        }
    }
}

/// What the `autoreplace` pass ([`Pool::autoreplace_pass`]) did, or would not do, for
/// one unusable device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AutoreplaceOutcome {
    /// A blank device at its path: a replacement in place started (resilvering).
    Replaced,
    /// This pool's own device back at its path: reopened (`pool online`).
    Onlined,
    /// Something is at its path that autoreplace must not take; the reason.
    Refused(String),
}

impl Pool {
    /// The `autoreplace` pool property is on.
    pub fn autoreplace(&self) -> bool {
        self.inner.config.lock().props.get("autoreplace").is_some_and(|v| v == "on")
    }

    /// One pass of `autoreplace=on` (the daemon runs it every few seconds and at
    /// `clear`): for each data or log device that cannot be used (UNAVAIL, FAULTED) and
    /// has a readable sibling to be rebuilt from, and is not being replaced already,
    /// look at its path. A device with no label and no file system or partition table
    /// there is a new disk put in the old one's place: it replaces the old one in place
    /// (as `zpool replace POOL DEV`). This pool's own device back there is reopened
    /// (UNAVAIL since import) or left for `pool clear` (FAULTED). Anything else (another
    /// pool's label, a signature) is refused and never written. Nothing at the path:
    /// no outcome. Off, exported, or suspended: nothing is done.
    pub fn autoreplace_pass(&self) -> Vec<(String, AutoreplaceOutcome)> {
        let inner = &self.inner;
        if !self.autoreplace() || self.check_open().is_err() || inner.txg.suspended_by().is_some() {
            return vec![];
        }
        let replaced: Vec<Guid> = inner.replacements().into_iter().flat_map(|(o, n)| [o, n]).collect();
        let mut out = Vec::new();
        for top in inner.tops().iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)) {
            for leaf in top.children() {
                let state = leaf.state();
                if !matches!(state, LeafState::Unavail | LeafState::Faulted) || replaced.contains(&leaf.guid) {
                    continue;
                }
                if !top.children().iter().any(|c| c.guid != leaf.guid && c.readable()) {
                    continue;
                }
                let path = leaf.spec.display();
                let Ok(dev) = (inner.opener)(&leaf.spec, top.role) else { continue };
                let label = label::scan_labels(&*dev).ok().and_then(|scan| scan.config).map(|(_, j)| parse_label(&j));
                let own = matches!(&label, Some(Ok(lj)) if lj.config.guid == inner.guid && lj.this_guid == leaf.guid);
                let blank = match &label {
                    None => check_device_free(&*dev, &leaf.spec, false).err().map(|e| e.to_string()),
                    Some(Ok(lj)) if own => Some(format!("{path} is this pool's device {path} (guid {})", lj.this_guid)),
                    Some(Ok(lj)) => Some(format!("{path} holds a label of pool '{}' (guid {})", printable(&lj.config.name), lj.config.guid)),
                    Some(Err(why)) => Some(format!("{path} holds a label that does not parse ({why})")),
                };
                dev.release();
                let outcome = match (own, state, blank) {
                    (true, LeafState::Unavail, _) => match self.online_missing(top, &leaf, &path) {
                        Ok(()) => AutoreplaceOutcome::Onlined,
                        Err(e) => AutoreplaceOutcome::Refused(e.to_string()),
                    },
                    (true, _, _) => AutoreplaceOutcome::Refused(format!("{path} is this pool's device, faulted; 'zilla pool clear {}' takes it back", inner.name)),
                    (false, _, Some(why)) => AutoreplaceOutcome::Refused(format!("{why}; autoreplace takes only a blank device")),
                    (false, _, None) => match self.replace(&leaf.guid.to_string(), &leaf.spec, false) {
                        Ok(()) => AutoreplaceOutcome::Replaced,
                        Err(e) => AutoreplaceOutcome::Refused(e.to_string()),
                    },
                };
                out.push((path, outcome));
            }
        }
        out
    }
}

/// A device missing at import can be reopened in place when it holds no data of its
/// own that the pool lacks: a cache or spare device, or a child with a readable sibling
/// (a lone data or log device missing at import is refused: export and import).
fn reopenable(top: &TopVdev, leaf: &Leaf) -> bool {
    matches!(top.role, Role::Cache | Role::Spare) || top.children().iter().any(|c| c.guid != leaf.guid && c.readable())
}

/// The txgs a device back at its path may lack: every txg after the newest uberblock
/// on it up to the open one (what the pool wrote while it was away; at least what the
/// placeholder's DTL recorded), or every txg when its uberblocks disagree with its
/// siblings' (written apart from the pool: spa/stale.rs).
fn missed_while_away(inner: &PoolInner, top: &TopVdev, placeholder: &Leaf, dev: &dyn Device) -> Vec<(Txg, Txg)> {
    let ours = |scan: Option<label::LabelScan>| -> Vec<label::Uberblock> {
        scan.map(|s| s.uberblocks.into_iter().filter(|u| u.pool_guid == inner.guid).collect()).unwrap_or_default()
    };
    let mine = ours(label::scan_labels(dev).ok());
    let mut rings: Vec<(Guid, Vec<label::Uberblock>)> =
        top.children().iter().filter(|c| c.guid != placeholder.guid && c.readable()).map(|c| (c.guid, ours(label::scan_labels(&**c.device()).ok()))).collect();
    let newest = rings.iter().flat_map(|(_, u)| u.iter()).max_by_key(|u| (u.txg, u.timestamp_ns)).cloned();
    let newest_mine = mine.iter().map(|u| u.txg).max().unwrap_or(Txg::ZERO);
    rings.push((placeholder.guid, mine));
    let open = inner.txg.open_txg();
    let diverged = newest.is_some_and(|n| matches!(super::stale::judge(&rings, &n).verdict(placeholder.guid), super::stale::Verdict::Diverged { .. }));
    let mut dtl = placeholder.dtl();
    let first = if diverged { Txg(1) } else { newest_mine.next() };
    if first <= open {
        crate::vdev::mirror::range_insert(&mut dtl, first, open);
    }
    dtl
}

impl PoolInner {
    /// The replacements in progress: (old leaf, new leaf) guids, siblings in the tree.
    pub(super) fn replacements(&self) -> Vec<(Guid, Guid)> {
        let cfg = self.config.lock();
        let mut out = Vec::new();
        for t in &cfg.tops {
            for c in &t.children {
                if let Some(old) = c.replacing.filter(|&o| o != c.guid && t.children.iter().any(|s| s.guid == o)) {
                    out.push((old, c.guid));
                }
            }
        }
        out
    }
}

/// The live tree a change (attach, detach) is about to alter: `top`'s children, the
/// pool's leaves and its config, so a failed label write can put them back.
struct TreeBefore {
    children: Vec<Arc<Leaf>>,
    leaves: Vec<Arc<Leaf>>,
    config: PoolConfig,
}

impl PoolInner {
    fn tree_before(&self, top: &TopVdev) -> TreeBefore {
        TreeBefore { children: top.children(), leaves: self.leaves.read().clone(), config: self.config.lock().clone() }
    }

    /// Undo a change whose label write failed; the config keeps the txg that write
    /// spent (the next one goes above it).
    fn restore_tree(&self, top: &TopVdev, before: TreeBefore) {
        *top.children.write() = before.children;
        *self.leaves.write() = before.leaves;
        let mut cfg = self.config.lock();
        *cfg = PoolConfig { txg: cfg.txg, ..before.config };
    }
}

/// A leaf an attach labelled but could not add: its labels (which name it a member)
/// are wiped and its device released, so a retry needs no -f. Best effort: the device
/// may be what failed.
fn abandon_new_leaf(leaf: &Leaf) {
    let _ = label::wipe_labels(&**leaf.device());
    leaf.device().release();
}

/// `lc` as a new child of top-level vdev `top` in `cfg` (attach), which makes it a mirror.
fn push_child(cfg: &mut PoolConfig, top: VdevId, lc: LeafConfig) {
    if let Some(tc) = cfg.tops.iter_mut().find(|t| t.id == top) {
        tc.children.push(lc);
        tc.mirror = true;
    }
}

/// Refuse leaves that are the same storage as each other or as a leaf already in the
/// pool: compared by identity (st_rdev for block devices, st_dev/st_ino for files), so a
/// symlink, a hard link or a second path to one file is caught. Runs before any leaf is
/// opened (a second open would only fail on the leaf lock, with a vaguer message).
pub(super) fn check_distinct_leaves(new: &[&LeafSpec], existing: &[Arc<Leaf>], pool: &str) -> Result<()> {
    use crate::vdev::DeviceIdentity;
    let existing: Vec<(DeviceIdentity, String)> =
        existing.iter().filter_map(|l| l.device().identity().or_else(|| DeviceIdentity::of_path(&l.spec.path)).map(|i| (i, l.spec.display()))).collect();
    let mut seen: Vec<(DeviceIdentity, String)> = Vec::new();
    for spec in new {
        let Some(id) = DeviceIdentity::of_path(&spec.path) else { continue };
        if let Some((_, other)) = existing.iter().find(|(i, _)| *i == id) {
            return Err(Error::invalid(format!("{} is already in pool '{pool}' (as {other})", spec.display())));
        }
        if let Some((_, other)) = seen.iter().find(|(i, _)| *i == id) {
            return Err(Error::invalid(format!("{} and {other} are the same device; each leaf must be distinct", spec.display())));
        }
        seen.push((id, spec.display()));
    }
    Ok(())
}

/// The same check on opened devices (callers that pass devices through the API with an
/// opener of their own): two devices reporting one identity are refused.
pub(super) fn check_distinct_devices(devs: &[(&LeafSpec, &dyn Device)]) -> Result<()> {
    for (i, (a_spec, a)) in devs.iter().enumerate() {
        let Some(ida) = a.identity() else { continue };
        if let Some((b_spec, _)) = devs[..i].iter().find(|(_, b)| b.identity() == Some(ida)) {
            return Err(Error::invalid(format!("{} and {} are the same device; each leaf must be distinct", a_spec.display(), b_spec.display())));
        }
    }
    Ok(())
}

/// The smallest ashift `dev` can take: log2 of its larger sector size, at least 12;
/// sectors beyond 8 KiB are refused (the label's uberblock ring would be too short).
pub(super) fn device_ashift(dev: &dyn Device, spec: &LeafSpec) -> Result<u8> {
    let sector = dev.logical_sector_size().max(dev.physical_sector_size()).max(512);
    let a = (sector.next_power_of_two().trailing_zeros() as u8).max(label::MIN_ASHIFT);
    if a > label::MAX_ASHIFT {
        return Err(Error::invalid(format!("{}: {sector}-byte sectors are not supported (at most 8 KiB)", spec.display())));
    }
    Ok(a)
}

/// A new device's path goes into every label of its pool, where import checks it
/// (`validate_leaf`): a path those checks refuse would leave a pool that can never be
/// imported again, so it is refused here, before anything is written.
pub(super) fn check_leaf_path(spec: &LeafSpec) -> Result<()> {
    let Some(path) = spec.path.to_str() else {
        return Err(Error::invalid(format!("device path '{}' is not UTF-8: it cannot be stored in the pool's labels", printable(&spec.path.to_string_lossy()))));
    };
    if path.is_empty() || !text_ok(path) {
        return Err(Error::invalid(format!(
            "device path '{}' cannot be stored in the pool's labels: it is empty, longer than {MAX_TEXT_LEN} bytes or holds a control character",
            printable(path)
        )));
    }
    Ok(())
}

/// Refuse a device the system uses (mounted, a partition mounted, backing a loop device,
/// held by device-mapper/md): before it is opened, so the error says why. Forcing lets a
/// file that backs a loop device through; a mounted block device still fails its claim.
pub(super) fn check_system_use(spec: &LeafSpec, force: bool) -> Result<()> {
    let Some(why) = crate::vdev::inuse::in_use_by_system(&spec.path) else { return Ok(()) };
    let overridable = why.contains(" backs ") || !why.contains("mounted");
    if force && overridable {
        return Ok(());
    }
    Err(Error::Busy(format!("{} is in use: {why}{}", spec.display(), if overridable { "; use -f to override" } else { "" })))
}

/// Take a new leaf into the pool: [`check_device_free`], then, the leaf being ours and
/// nothing of the pool having written to it, fill its log region's holes
/// ([`crate::vdev::fill_log_region`]; a cache or spare device holds no intent log).
/// Create, add and attach all come through here.
pub(super) fn take_new_leaf(dev: &dyn Device, spec: &LeafSpec, role: Role, force: bool) -> Result<()> {
    check_device_free(dev, spec, force)?;
    if holds_intent_log(role) {
        crate::vdev::fill_log_region(dev, &spec.display());
    }
    Ok(())
}

/// Whether a leaf of a top-level vdev of `role` may hold intent-log blocks (normal
/// vdevs in their embedded log region, log vdevs throughout; cache and spare: never).
pub(super) fn holds_intent_log(role: Role) -> bool {
    matches!(role, Role::Normal | Role::Log)
}

/// Refuse a device that carries a label of an active or exported pool, or a known file
/// system, volume manager or partition table signature, unless forced.
pub(super) fn check_device_free(dev: &dyn Device, spec: &LeafSpec, force: bool) -> Result<()> {
    if dev.size() < label::MIN_DEVICE_SIZE {
        return Err(Error::invalid(format!(
            "{} is too small ({} bytes; at least {} MiB needed)",
            spec.display(),
            dev.size(),
            label::MIN_DEVICE_SIZE >> 20
        )));
    }
    if force {
        return Ok(());
    }
    if let Ok(scan) = label::scan_labels(dev) {
        if let Some((_, j)) = scan.config {
            if let Ok(lj) = serde_json::from_slice::<LabelJson>(&j) {
                if lj.config.state != "destroyed" {
                    return Err(Error::Busy(format!(
                        "{} is part of {} pool '{}'; use -f to override",
                        spec.display(),
                        if lj.config.state == "exported" { "exported" } else { "active" },
                        lj.config.name
                    )));
                }
                return Ok(());
            }
        }
    }
    if let Some(sig) = crate::vdev::inuse::find_signature(dev) {
        return Err(Error::Busy(format!("{} has an existing {sig}; use -f to overwrite it", spec.display())));
    }
    Ok(())
}

/// A data vdev's replication as `zpool add` compares it: "disk", or "mirror" with its
/// width (a replacement in progress does not widen a vdev).
fn replication_of(mirror: bool, width: usize) -> (&'static str, usize) {
    if mirror && width > 1 { ("mirror", width) } else { ("disk", 1) }
}

/// `zpool add`'s replication check (its `check_replication`): the new data vdevs must
/// agree with each other and with the pool's (when the pool's agree among themselves),
/// else the add is refused unless forced. Log, cache and spare vdevs hold no pool data
/// and are not compared.
pub(super) fn check_replication(cfg: &PoolConfig, tops: &[TopSpec]) -> Result<()> {
    let new: Vec<(&str, usize)> = tops.iter().filter(|t| t.role == Role::Normal).map(|t| replication_of(t.mirror, t.leaves.len())).collect();
    let Some(&first) = new.first() else { return Ok(()) };
    let mismatch = |why: String| {
        Err(Error::invalid(format!("invalid vdev specification\nuse '-f' to override the following errors:\nmismatched replication level: {why}")))
    };
    if let Some(&other) = new.iter().find(|&&r| r != first) {
        return match first.0 == other.0 {
            true => mismatch(format!("both {}-way and {}-way {} vdevs are present", first.1, other.1, first.0)),
            false => mismatch("both disk and mirror vdevs are present".to_string()),
        };
    }
    let pool: Vec<(&str, usize)> = cfg
        .tops
        .iter()
        .filter(|t| t.role == Role::Normal)
        .map(|t| replication_of(t.mirror, t.children.iter().filter(|c| c.replacing.is_none()).count()))
        .collect();
    let Some(&have) = pool.first() else { return Ok(()) };
    if pool.iter().any(|&r| r != have) || have == first {
        return Ok(()); // a pool already mixed (forced before) is not held to one level
    }
    if have.0 != first.0 {
        return mismatch(format!("pool uses {} and new vdev is {}", have.0, first.0));
    }
    mismatch(format!("pool uses {}-way {} and new vdev uses {}-way {}", have.1, have.0, first.1, first.0))
}

#[cfg(test)]
mod replication_tests {
    use super::*;

    fn cfg(tops: &[(Role, bool, usize)]) -> PoolConfig {
        let mut g = 0u64;
        let mut guid = || {
            g += 1;
            Guid(g)
        };
        let leaf = |g: Guid| LeafConfig { guid: g, spec: LeafSpec { path: format!("d{g}").into(), model: None }, offline: false, offline_since: Txg::ZERO, dtl: vec![], replacing: None };
        let tops = tops
            .iter()
            .enumerate()
            .map(|(i, &(role, mirror, n))| TopConfig { id: VdevId(i as u32), guid: guid(), role, mirror, ashift: 12, children: (0..n).map(|_| leaf(guid())).collect() })
            .collect();
        PoolConfig { name: "tank".into(), guid: Guid(99), version: 1, state: "active".into(), txg: Txg(5), tops, props: BTreeMap::new(), hostid: 0, hostname: String::new(), features_for_read: None, features_for_write: None }
    }

    fn spec(role: Role, mirror: bool, n: usize) -> TopSpec {
        TopSpec { role, mirror, leaves: (0..n).map(|i| LeafSpec { path: format!("n{i}").into(), model: None }).collect() }
    }

    fn why(r: Result<()>) -> String {
        match r {
            Err(Error::InvalidArgument(m)) => m.lines().last().unwrap_or_default().to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn config_version_2_carries_both_feature_lists_and_version_1_neither() {
        let lj = |c: PoolConfig| LabelJson { this_guid: c.tops[0].children[0].guid, config: c };
        let v1 = cfg(&[(Role::Normal, true, 2)]);
        validate_label(&lj(v1.clone())).unwrap();
        let json = serde_json::to_string(&lj(v1.clone())).unwrap();
        assert!(!json.contains("features_for"), "a version 1 label is written as before: {json}");
        let with = |v: u64, r: Option<Vec<&str>>, w: Option<Vec<&str>>| {
            let own = |l: Option<Vec<&str>>| l.map(|l| l.into_iter().map(String::from).collect());
            PoolConfig { version: v, features_for_read: own(r), features_for_write: own(w), ..v1.clone() }
        };
        assert!(validate_label(&lj(with(1, Some(vec![]), Some(vec![])))).unwrap_err().contains("not allowed in config version 1"));
        validate_label(&lj(with(2, Some(vec![]), Some(vec!["org.zilla:async_destroy", "com.example:x"])))).unwrap();
        assert!(validate_label(&lj(with(2, Some(vec![]), None))).unwrap_err().contains("needs both"));
        assert!(validate_label(&lj(with(2, Some(vec!["Bad Name"]), Some(vec![])))).unwrap_err().contains("features_for_read"));
        assert!(validate_label(&lj(with(3, None, None))).unwrap_err().contains("version = 3"));
        let v2 = lj(with(2, Some(vec!["org.zilla:large_blocks"]), Some(vec![])));
        let back = parse_label(serde_json::to_string(&v2).unwrap().as_bytes()).unwrap();
        assert_eq!(back.config.features_for_read, Some(vec!["org.zilla:large_blocks".to_string()]));
    }

    #[test]
    fn a_lone_disk_on_a_pool_of_mirrors_is_refused_in_zpools_words() {
        let mirrors = cfg(&[(Role::Normal, true, 2), (Role::Normal, true, 2)]);
        let r = check_replication(&mirrors, &[spec(Role::Normal, false, 1)]);
        let Err(Error::InvalidArgument(m)) = &r else { panic!("{r:?}") };
        assert_eq!(m, "invalid vdev specification\nuse '-f' to override the following errors:\nmismatched replication level: pool uses mirror and new vdev is disk");
        assert_eq!(why(check_replication(&mirrors, &[spec(Role::Normal, true, 3)])), "mismatched replication level: pool uses 2-way mirror and new vdev uses 3-way mirror");
        assert!(check_replication(&mirrors, &[spec(Role::Normal, true, 2)]).is_ok());
        let disks = cfg(&[(Role::Normal, false, 1)]);
        assert_eq!(why(check_replication(&disks, &[spec(Role::Normal, true, 2)])), "mismatched replication level: pool uses disk and new vdev is mirror");
        assert!(check_replication(&disks, &[spec(Role::Normal, false, 1)]).is_ok());
    }

    #[test]
    fn log_cache_and_spare_are_not_compared_and_new_vdevs_must_agree() {
        let mirrors = cfg(&[(Role::Normal, true, 2), (Role::Log, false, 1)]);
        for role in [Role::Log, Role::Cache, Role::Spare] {
            assert!(check_replication(&mirrors, &[spec(role, false, 1)]).is_ok(), "{role:?}");
        }
        assert_eq!(
            why(check_replication(&mirrors, &[spec(Role::Normal, true, 2), spec(Role::Normal, false, 1)])),
            "mismatched replication level: both disk and mirror vdevs are present"
        );
        assert_eq!(
            why(check_replication(&mirrors, &[spec(Role::Normal, true, 2), spec(Role::Normal, true, 3)])),
            "mismatched replication level: both 2-way and 3-way mirror vdevs are present"
        );
        // a pool already mixed (forced) is not held to one level
        let mixed = cfg(&[(Role::Normal, true, 2), (Role::Normal, false, 1)]);
        assert!(check_replication(&mixed, &[spec(Role::Normal, false, 1)]).is_ok());
    }
}
