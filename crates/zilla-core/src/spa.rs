//! spa: the storage pool — create, import, export, destroy, config changes, status.
//!
//! Theory of operation
//! -------------------
//! `Pool` is the handle the daemon holds. Creating a pool writes labels with the config
//! to every leaf and syncs an initial txg (empty MOS), so a pool exists on disk exactly
//! when an uberblock for it is durable. Importing scans the labels of the given devices,
//! groups them by pool guid, takes the config with the highest config txg, checks that
//! every top-level vdev has at least one readable child, then loads the MOS from the
//! newest uberblock whose tree reads back (falling back to older uberblocks in the ring if
//! the newest is damaged). See spa_impl.rs for the sync protocol.
use std::path::PathBuf;
use std::sync::Arc;

use crate::props::PropRow;
use crate::vdev::queue::LeafStats;
use crate::env::Env;
use crate::vdev::{LeafSpec, Role};
use crate::zvol::BlockVolume;
use crate::{Error, Result};

/// One top-level vdev as the user asked for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopSpec {
    pub role: Role,
    pub mirror: bool,
    pub leaves: Vec<LeafSpec>,
}

/// Parse zpool's vdev grammar: `[mirror] A B ... log [mirror] C D cache E spare F`.
/// Each `mirror` keyword starts a new mirror; bare leaves in the normal class are
/// single-disk top-level vdevs; cache and spare leaves are always single.
pub fn parse_vdev_args(args: &[String]) -> Result<Vec<TopSpec>> {
    let mut tops: Vec<TopSpec> = Vec::new();
    let mut role = Role::Normal;
    let mut in_mirror = false;
    for a in args {
        match a.as_str() {
            "mirror" => {
                if matches!(role, Role::Cache | Role::Spare) {
                    return Err(Error::invalid(format!("{:?} devices cannot be mirrored", role).to_lowercase()));
                }
                tops.push(TopSpec { role, mirror: true, leaves: vec![] });
                in_mirror = true;
            }
            "log" => { role = Role::Log; in_mirror = false; }
            "cache" => { role = Role::Cache; in_mirror = false; }
            "spare" => { role = Role::Spare; in_mirror = false; }
            "raidz" | "raidz1" | "raidz2" | "raidz3" | "draid" | "special" | "dedup" => {
                return Err(Error::invalid(format!("vdev type '{a}' is not supported (use mirror)")));
            }
            leaf => {
                let spec = LeafSpec::parse(leaf)?;
                if in_mirror {
                    tops.last_mut().expect("mirror pushed").leaves.push(spec);
                } else {
                    tops.push(TopSpec { role, mirror: false, leaves: vec![spec] });
                }
            }
        }
    }
    for t in &tops {
        if t.mirror && t.leaves.len() < 2 {
            return Err(Error::invalid("a mirror needs at least two devices"));
        }
    }
    if tops.is_empty() {
        return Err(Error::invalid("no devices given"));
    }
    let mut seen = std::collections::HashSet::new();
    for t in &tops {
        for l in &t.leaves {
            if !seen.insert(l.path.clone()) {
                return Err(Error::invalid(format!("{} is specified more than once", l.path.display())));
            }
        }
    }
    Ok(tops)
}

#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    pub force: bool,
    pub ashift: Option<u8>,
    /// Pool properties (-o name=value): ashift, autoreplace, failmode.
    pub props: Vec<(String, String)>,
    /// Clock, sleeps, threads and randomness; None = the real world (`env::real()`).
    pub env: Option<Arc<dyn Env>>,
}

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

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub guid: u64,
    pub state: String,
    /// `status:` and `action:` paragraphs, empty when healthy.
    pub status: String,
    pub action: String,
    /// `scan:` line, e.g. "scrub repaired 0B in 00:00:01 with 0 errors on <date>" or "none requested"
    pub scan: String,
    pub config: Vec<VdevStatus>,
    /// `errors:` line: "No known data errors" or "N data errors, use '-v' for a list"
    pub errors: String,
    /// -v: the affected block list
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
    pub health: String,
    pub ashift: u8,
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
    pub used: u64,
    pub readonly: bool,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ImportablePool {
    pub name: String,
    pub guid: u64,
    pub state: String,
    pub leaves: Vec<LeafSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubCmd {
    Start,
    Pause,
    Stop,
}

pub use crate::spa_impl::{default_opener, LabelJson, LeafConfig, Opener, PoolConfig, TopConfig};
use crate::spa_impl::{new_guid, MosMeta, PoolInner, VolumeState};
use crate::dmu::{self, PoolIo, TreeRoot};
use crate::metaslab::Metaslabs;
use crate::txg::TxgState;
use crate::dsl_pool::DirtyAccounting;
use crate::vdev::label;
use crate::vdev::mirror::{Leaf, LeafState, TopVdev};
use crate::vdev::Device;
use crate::zio::blkptr::BlockPointer;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use parking_lot::{Mutex, RwLock};

pub const POOL_VERSION: u64 = 1;
pub const MAX_VOLBLOCKSIZE: u32 = 128 << 10;
pub const MIN_VOLBLOCKSIZE: u32 = 4096;

pub fn validate_pool_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.chars().next().map_or(false, |c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if !ok {
        return Err(Error::invalid(format!(
            "invalid pool name '{name}': must begin with a letter and contain only letters, digits, '_', '-', '.', ':'"
        )));
    }
    if ["mirror", "raidz", "draid", "spare", "log", "cache"].iter().any(|r| name.starts_with(r)) {
        return Err(Error::invalid(format!("invalid pool name '{name}': name is reserved")));
    }
    Ok(())
}

pub fn validate_volume_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if !ok {
        return Err(Error::invalid(format!(
            "invalid volume name '{name}': use letters, digits, '_', '-', '.', ':' (no '/')"
        )));
    }
    Ok(())
}

pub struct Pool {
    inner: Arc<PoolInner>,
    sync_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    closed: std::sync::atomic::AtomicBool,
}

struct Opened {
    spec: LeafSpec,
    dev: Arc<dyn Device>,
}

fn pool_props_with_defaults(props: &[(String, String)], ashift: u8) -> Result<BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    m.insert("ashift".to_string(), ashift.to_string());
    m.insert("autoreplace".to_string(), "off".to_string());
    m.insert("failmode".to_string(), "wait".to_string());
    for (k, v) in props {
        let v = v.trim().to_ascii_lowercase();
        match k.as_str() {
            "ashift" => {
                let a: u8 = v.parse().map_err(|_| Error::invalid(format!("bad ashift '{v}'")))?;
                if a != 0 && !(9..=16).contains(&a) {
                    return Err(Error::invalid(format!("ashift {a} out of range (9..16)")));
                }
            }
            "autoreplace" => {
                if v != "on" && v != "off" {
                    return Err(Error::invalid(format!("bad value '{v}' for autoreplace: expected on or off")));
                }
            }
            "failmode" => {
                if v != "wait" && v != "continue" {
                    return Err(Error::invalid(format!("bad value '{v}' for failmode: expected wait or continue")));
                }
            }
            _ => return Err(Error::invalid(format!("unknown pool property '{k}'"))),
        }
        m.insert(k.clone(), v);
    }
    Ok(m)
}

fn ashift_of(dev: &dyn Device) -> u8 {
    let s = dev.logical_sector_size().max(dev.physical_sector_size()).max(512);
    (s.trailing_zeros() as u8).clamp(9, 16).max(12)
}

impl Pool {
    fn from_inner(inner: Arc<PoolInner>) -> Arc<Pool> {
        let t = inner.clone();
        let handle = inner.env.spawn(format!("txg_sync_{}", inner.name), Box::new(move || t.sync_loop())).expect("spawn txg sync thread");
        let pool = Arc::new(Pool { inner, sync_thread: Mutex::new(Some(handle)), closed: false.into() });
        crate::scan::resume_after_import(&pool.inner);
        pool
    }

    pub fn inner(&self) -> &Arc<PoolInner> {
        &self.inner
    }

    pub fn create(name: &str, tops: Vec<TopSpec>, opts: CreateOptions) -> Result<Arc<Pool>> {
        Self::create_with(name, tops, opts, default_opener())
    }

    pub fn create_with(name: &str, tops: Vec<TopSpec>, opts: CreateOptions, opener: Opener) -> Result<Arc<Pool>> {
        validate_pool_name(name)?;
        if !tops.iter().any(|t| t.role == Role::Normal) {
            return Err(Error::invalid("a pool needs at least one data vdev (not only log/cache/spare)"));
        }
        let mut props = opts.props.clone();
        if let Some(a) = opts.ashift {
            props.push(("ashift".into(), a.to_string()));
        }
        let mut opened_tops: Vec<(TopSpec, Vec<Opened>)> = Vec::new();
        for t in &tops {
            let mut v = Vec::new();
            for l in &t.leaves {
                let dev = opener(l, t.role)?;
                check_device_free(&*dev, l, opts.force)?;
                v.push(Opened { spec: l.clone(), dev });
            }
            opened_tops.push((t.clone(), v));
        }
        let ashift = opened_tops.iter().flat_map(|(_, v)| v.iter()).map(|o| ashift_of(&*o.dev)).max().unwrap_or(12);
        let pool_props = pool_props_with_defaults(&props, ashift)?;
        let env = opts.env.clone().unwrap_or_else(crate::env::real);
        let guid = new_guid(&*env);
        let mut cfg_tops = Vec::new();
        let mut leaves = Vec::new();
        let mut vdevs = Vec::new();
        let mut ms = Metaslabs::new();
        for (id, (t, opened)) in opened_tops.into_iter().enumerate() {
            let tguid = new_guid(&*env);
            let mut children = Vec::new();
            let mut leaf_objs = Vec::new();
            for o in opened {
                let g = new_guid(&*env);
                children.push(LeafConfig { guid: g, spec: o.spec.clone(), offline: false, offline_since: 0, dtl: vec![] });
                let leaf = Arc::new(Leaf::new(g, o.spec, o.dev));
                leaves.push(leaf.clone());
                leaf_objs.push(leaf);
            }
            let top = Arc::new(TopVdev {
                id: id as u32,
                guid: tguid,
                role: t.role,
                is_mirror: t.mirror,
                ashift,
                children: RwLock::new(leaf_objs),
            });
            if matches!(t.role, Role::Normal | Role::Log) {
                ms.add_vdev(id as u32, t.role, top.asize());
            }
            vdevs.push(top);
            cfg_tops.push(TopConfig { id: id as u32, guid: tguid, role: t.role, mirror: t.mirror, ashift, children });
        }
        let config = PoolConfig {
            name: name.to_string(),
            guid,
            version: POOL_VERSION,
            state: "active".into(),
            txg: crate::txg::TXG_INITIAL,
            tops: cfg_tops,
            props: pool_props,
        };
        let inner = Arc::new(PoolInner {
            name: name.to_string(),
            guid,
            io: PoolIo::new(vdevs, ms),
            txg: TxgState::new(crate::txg::TXG_INITIAL - 1, env.clone()),
            dirty: DirtyAccounting::new(env.clone()),
            config: Mutex::new(config),
            leaves: RwLock::new(leaves),
            volumes: RwLock::new(BTreeMap::new()),
            meta: Mutex::new(MosMeta {
                next_volume_id: 1,
                mos_root: BlockPointer::hole(),
                doomed: vec![],
                scan_state: String::new(),
                changed: true,
            }),
            sync_lock: Mutex::new(()),
            opener,
            suspended: false.into(),
            abandoned: false.into(),
            scan: Default::default(),
            env,
        });
        // wipe stale uberblock rings, then config labels, then the first txg
        for leaf in inner.leaves.read().iter() {
            label::wipe_labels(&**leaf.device()).map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", leaf.spec.display()))))?;
        }
        inner.write_config_labels("active")?;
        let t = inner.txg.open_txg();
        inner.spa_sync(t)?;
        inner.txg.initial_synced(t);
        Ok(Self::from_inner(inner))
    }

    pub fn find_importable(search: &[PathBuf]) -> Result<Vec<ImportablePool>> {
        let found = scan_search_paths(search, &default_opener())?;
        let mut out: BTreeMap<u64, ImportablePool> = BTreeMap::new();
        for (spec, lj) in found {
            if lj.config.state == "destroyed" {
                continue;
            }
            let e = out.entry(lj.config.guid).or_insert_with(|| ImportablePool {
                name: lj.config.name.clone(),
                guid: lj.config.guid,
                state: lj.config.state.clone(),
                leaves: vec![],
            });
            e.leaves.push(spec);
        }
        Ok(out.into_values().collect())
    }

    pub fn import(search: &[PathBuf], name: Option<&str>) -> Result<Arc<Pool>> {
        let cands = Self::find_importable(search)?;
        let chosen: Vec<&ImportablePool> = match name {
            Some(n) => cands.iter().filter(|c| c.name == n || c.guid.to_string() == n).collect(),
            None => cands.iter().collect(),
        };
        match chosen.len() {
            0 => Err(Error::NotFound(format!("pool '{}' (no importable pool found in the given directories)", name.unwrap_or("")))),
            1 => Self::import_leaves(&chosen[0].leaves),
            _ => Err(Error::invalid(format!(
                "more than one importable pool{}: {}; name one (or its guid)",
                name.map(|n| format!(" named '{n}'")).unwrap_or_default(),
                chosen.iter().map(|c| format!("{} ({})", c.name, c.guid)).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    pub fn import_leaves(leaves: &[LeafSpec]) -> Result<Arc<Pool>> {
        Self::import_with(leaves, default_opener())
    }

    pub fn import_with(specs: &[LeafSpec], opener: Opener) -> Result<Arc<Pool>> {
        Self::import_with_env(specs, opener, crate::env::real())
    }

    /// Import with a given Env (tests: a simulated clock and seeded randomness).
    pub fn import_with_env(specs: &[LeafSpec], opener: Opener, env: Arc<dyn Env>) -> Result<Arc<Pool>> {
        if specs.is_empty() {
            return Err(Error::invalid("no devices to import from"));
        }
        // read every label
        let mut devs: Vec<(LeafSpec, Arc<dyn Device>, label::LabelScan, Option<LabelJson>)> = Vec::new();
        for s in specs {
            let dev = match opener(s, Role::Normal) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!("import: cannot open {}: {e}", s.display());
                    continue;
                }
            };
            let scan = match label::scan_labels(&*dev) {
                Ok(sc) => sc,
                Err(e) => {
                    tracing::warn!("import: cannot read labels of {}: {e}", s.display());
                    continue;
                }
            };
            let lj = scan.config.as_ref().and_then(|(_, j)| serde_json::from_slice::<LabelJson>(j).ok());
            devs.push((s.clone(), dev, scan, lj));
        }
        let Some(best_cfg) = devs.iter().filter_map(|d| d.3.as_ref()).max_by_key(|lj| lj.config.txg).map(|lj| lj.config.clone()) else {
            return Err(Error::NotFound(format!(
                "no valid pool label on {}",
                specs.iter().map(|s| s.display()).collect::<Vec<_>>().join(", ")
            )));
        };
        if best_cfg.state == "destroyed" {
            return Err(Error::NotFound(format!("pool '{}' was destroyed", best_cfg.name)));
        }
        for d in &devs {
            if let Some(lj) = &d.3 {
                if lj.config.guid != best_cfg.guid {
                    return Err(Error::invalid(format!(
                        "{} belongs to another pool ('{}', guid {})",
                        d.0.display(),
                        lj.config.name,
                        lj.config.guid
                    )));
                }
            }
        }
        let mut cfg = best_cfg.clone();
        // build the tree, matching leaves by guid
        let mut vdevs = Vec::new();
        let mut leaves = Vec::new();
        let mut ubs: Vec<label::Uberblock> = Vec::new();
        let mut bad_labels = 0;
        for t in cfg.tops.iter_mut() {
            let mut children = Vec::new();
            for lc in t.children.iter_mut() {
                let found = devs.iter().find(|d| d.3.as_ref().map(|lj| lj.this_guid) == Some(lc.guid));
                let leaf = match found {
                    Some((spec, dev, scan, _)) => {
                        let dev: Arc<dyn Device> = if spec.model.is_some() && t.role != Role::Normal {
                            opener(spec, t.role).unwrap_or_else(|_| dev.clone())
                        } else {
                            dev.clone()
                        };
                        ubs.extend(scan.uberblocks.iter().filter(|u| u.pool_guid == cfg.guid).cloned());
                        bad_labels += scan.bad_labels;
                        lc.spec = spec.clone();
                        let l = Arc::new(Leaf::new(lc.guid, spec.clone(), dev));
                        if lc.offline {
                            l.set_state(LeafState::Offline);
                        }
                        l.set_dtl(lc.dtl.clone());
                        l
                    }
                    None => {
                        let l = Arc::new(Leaf::new(lc.guid, lc.spec.clone(), Arc::new(MissingDevice)));
                        l.set_state(LeafState::Unavail);
                        l
                    }
                };
                leaves.push(leaf.clone());
                children.push(leaf);
            }
            if matches!(t.role, Role::Normal) && !children.iter().any(|c| c.state() != LeafState::Unavail) {
                return Err(Error::NotFound(format!(
                    "pool '{}': every device of top-level vdev {} is missing ({})",
                    cfg.name,
                    t.id,
                    t.children.iter().map(|c| c.spec.display()).collect::<Vec<_>>().join(", ")
                )));
            }
            vdevs.push(Arc::new(TopVdev {
                id: t.id,
                guid: t.guid,
                role: t.role,
                is_mirror: t.mirror,
                ashift: t.ashift,
                children: RwLock::new(children),
            }));
        }
        ubs.sort_by(|a, b| b.txg.cmp(&a.txg).then(b.timestamp_ns.cmp(&a.timestamp_ns)));
        ubs.dedup_by(|a, b| a == b);
        if ubs.is_empty() {
            return Err(Error::Corrupt(format!("pool '{}': no valid uberblock on any device", cfg.name)));
        }
        let io = PoolIo::new(vdevs, Metaslabs::new());
        // newest uberblock whose MOS reads back
        let mut loaded = None;
        let mut last_err = None;
        for ub in &ubs {
            let mut ms = Metaslabs::new();
            for t in io.vdevs.read().iter() {
                if matches!(t.role, Role::Normal | Role::Log) {
                    ms.add_vdev(t.id, t.role, t.asize());
                }
            }
            let r = (|| -> Result<crate::dmu::Mos> {
                let blob = dmu::read_mos_blob(&io, &ub.root, crate::vdev::IoClass::SyncRead)?;
                let mos = crate::dmu::Mos::decode(&blob, &mut ms)?;
                for bp in dmu::mos_blocks(&io, &ub.root, crate::vdev::IoClass::SyncRead)? {
                    for d in bp.copies() {
                        ms.claim(d)?;
                    }
                }
                Ok(mos)
            })();
            match r {
                Ok(mos) => {
                    loaded = Some((ub.clone(), mos, ms));
                    break;
                }
                Err(e) => {
                    tracing::warn!(pool = %cfg.name, txg = ub.txg, "uberblock unusable, trying an older one: {e}");
                    last_err = Some(e);
                }
            }
        }
        let Some((ub, mos, ms)) = loaded else {
            return Err(Error::Corrupt(format!(
                "pool '{}': no uberblock with a readable object directory ({})",
                cfg.name,
                last_err.map(|e| e.to_string()).unwrap_or_default()
            )));
        };
        *io.ms.lock() = ms;
        io.refresh_space();
        // leaves that were offline missed every txg since
        for l in &leaves {
            if l.state() == LeafState::Offline {
                if let Some(lc) = cfg.tops.iter().flat_map(|t| t.children.iter()).find(|c| c.guid == l.guid) {
                    if lc.offline_since > 0 {
                        let mut d = l.dtl();
                        d.push((lc.offline_since, u64::MAX / 2));
                        l.set_dtl(d);
                    }
                }
            }
        }
        let mut volumes = BTreeMap::new();
        for v in &mos.volumes {
            volumes.insert(
                v.name.clone(),
                Arc::new(VolumeState {
                    id: v.id,
                    name: v.name.clone(),
                    volsize: v.volsize,
                    volblocksize: v.volblocksize,
                    created_txg: v.created_txg,
                    props: RwLock::new(v.props.clone()),
                    committed: RwLock::new(v.root),
                    dirty: Default::default(),
                    destroyed: false.into(),
                }),
            );
        }
        if let Ok(p) = serde_json::from_str::<BTreeMap<String, String>>(&mos.pool_props) {
            cfg.props.extend(p);
        }
        let inner = Arc::new(PoolInner {
            name: cfg.name.clone(),
            guid: cfg.guid,
            io,
            txg: TxgState::new(ub.txg, env.clone()),
            dirty: DirtyAccounting::new(env.clone()),
            config: Mutex::new(cfg),
            leaves: RwLock::new(leaves),
            volumes: RwLock::new(volumes),
            meta: Mutex::new(MosMeta {
                next_volume_id: mos.next_volume_id,
                mos_root: ub.root,
                doomed: vec![],
                scan_state: mos.scan_state.clone(),
                changed: false,
            }),
            sync_lock: Mutex::new(()),
            opener,
            suspended: false.into(),
            abandoned: false.into(),
            scan: Default::default(),
            env,
        });
        // rewrite labels: marks the pool active and repairs damaged label copies
        if let Err(e) = inner.write_config_labels("active") {
            tracing::warn!("import: could not rewrite labels: {e}");
        }
        if bad_labels > 0 {
            tracing::info!(pool = %inner.name, bad_labels, "rewrote damaged labels");
        }
        let pool = Self::from_inner(inner);
        // leaves returning with a DTL get resilvered
        for l in pool.inner.leaves.read().iter() {
            if l.state() == LeafState::Online && !l.dtl_empty() {
                crate::scan::start_resilver(&pool.inner);
                break;
            }
        }
        Ok(pool)
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    fn stop_threads(&self) {
        self.inner.txg.begin_shutdown();
        self.inner.dirty.wake_all();
        if let Some(h) = self.sync_thread.lock().take() {
            let _ = h.join();
        }
    }

    pub fn export(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(format!("pool '{}' is already exported", self.inner.name)));
        }
        crate::scan::pause_for_export(&self.inner);
        // final sync of everything dirty
        let open = self.inner.txg.open_txg();
        self.inner.txg.request_sync(open);
        self.stop_threads();
        if let Some(e) = self.inner.txg.sync_error() {
            return Err(Error::Io(std::io::Error::other(format!("final sync failed: {e}"))));
        }
        self.inner.write_config_labels("exported")?;
        Ok(())
    }

    /// Stop the background threads without syncing (tests: simulated crash).
    pub fn abandon(&self) {
        self.closed.store(true, Ordering::Release);
        self.inner.abandoned.store(true, Ordering::Release);
        crate::scan::stop(&self.inner);
        self.inner.txg.begin_shutdown();
        self.inner.suspended.store(true, Ordering::Relaxed);
        // drop dirty data so the final-sync path has nothing to do
        for v in self.inner.volumes.read().values() {
            v.dirty.clear();
        }
        self.inner.meta.lock().changed = false;
        for t in crate::txg::TXG_INITIAL..self.inner.txg.open_txg() + 1 {
            self.inner.dirty.retire(t);
        }
        if let Some(h) = self.sync_thread.lock().take() {
            let _ = h.join();
        }
    }

    pub fn destroy(&self) -> Result<()> {
        self.check_open()?;
        self.closed.store(true, Ordering::Release);
        crate::scan::stop(&self.inner);
        self.stop_threads();
        for leaf in self.inner.leaves.read().iter() {
            if leaf.state() == LeafState::Unavail {
                continue;
            }
            if let Err(e) = label::wipe_labels(&**leaf.device()) {
                tracing::warn!("destroy: could not wipe {}: {e}", leaf.spec.display());
            }
        }
        Ok(())
    }

    pub fn name(&self) -> String {
        self.inner.name.clone()
    }
    pub fn guid(&self) -> u64 {
        self.inner.guid
    }
    pub fn leaf_specs(&self) -> Vec<LeafSpec> {
        self.inner.leaves.read().iter().map(|l| l.spec.clone()).collect()
    }
    pub fn synced_txg(&self) -> u64 {
        self.inner.txg.synced_txg()
    }

    pub fn sync(&self) -> Result<()> {
        self.check_open()?;
        let t = self.inner.txg.open_txg();
        self.inner.txg.wait_synced(t)
    }

    // ---- status -------------------------------------------------------------------

    fn health(&self) -> String {
        if self.inner.suspended.load(Ordering::Relaxed) {
            return "SUSPENDED".into();
        }
        let mut worst = "ONLINE";
        for t in self.inner.tops() {
            if t.role == Role::Cache || t.role == Role::Spare {
                continue;
            }
            match t.state_name() {
                "UNAVAIL" if t.role == Role::Normal => return "UNAVAIL".into(),
                "ONLINE" => {}
                _ => worst = "DEGRADED",
            }
        }
        worst.into()
    }

    pub fn status(&self) -> PoolStatus {
        let inner = &self.inner;
        let mut config = Vec::new();
        let resilvering = crate::scan::is_resilvering(inner);
        for t in inner.tops() {
            let kids: Vec<VdevStatus> = t
                .children()
                .iter()
                .map(|c| VdevStatus {
                    name: c.spec.display(),
                    kind: c.device().kind(),
                    role: t.role,
                    state: c.state().name().to_string(),
                    read_errors: c.read_errors.load(Ordering::Relaxed),
                    write_errors: c.write_errors.load(Ordering::Relaxed),
                    cksum_errors: c.cksum_errors.load(Ordering::Relaxed),
                    note: if resilvering && !c.dtl_empty() { "(resilvering)".into() } else { String::new() },
                    children: vec![],
                })
                .collect();
            let state = match t.role {
                Role::Cache | Role::Spare => if kids.iter().all(|k| k.state == "ONLINE") { "ONLINE" } else { "UNAVAIL" },
                _ => t.state_name(),
            };
            if t.is_mirror {
                config.push(VdevStatus {
                    name: format!("mirror-{}", t.id),
                    kind: "mirror".into(),
                    role: t.role,
                    state: state.into(),
                    read_errors: 0,
                    write_errors: 0,
                    cksum_errors: 0,
                    note: String::new(),
                    children: kids,
                });
            } else {
                config.extend(kids);
            }
        }
        let health = self.health();
        let (status, action) = match health.as_str() {
            "ONLINE" => {
                let errs: u64 = inner.leaves.read().iter().map(|l| {
                    l.read_errors.load(Ordering::Relaxed) + l.write_errors.load(Ordering::Relaxed) + l.cksum_errors.load(Ordering::Relaxed)
                }).sum();
                if errs > 0 {
                    (
                        "One or more devices has experienced an unrecoverable error.  An\n\tattempt was made to correct the error.  Applications are unaffected.".to_string(),
                        "Determine if the device needs to be replaced, and clear the errors\n\tusing 'zilla pool clear' or replace the device with 'zilla pool replace'.".to_string(),
                    )
                } else {
                    (String::new(), String::new())
                }
            }
            "DEGRADED" => (
                "One or more devices is offline, missing or resilvering.  Sufficient replicas exist for\n\tthe pool to continue functioning in a degraded state.".into(),
                "Online the device using 'zilla pool online' or replace it with 'zilla pool replace'.".into(),
            ),
            "SUSPENDED" => (
                "The pool is suspended: a txg could not be written.".into(),
                "Check the devices; writes wait until the pool can be synced (failmode=wait).".into(),
            ),
            _ => ("One or more devices could not be used.".into(), "Attach the missing device and import again.".into()),
        };
        let unrec = inner.io.errors.unrecoverable.load(Ordering::Relaxed);
        PoolStatus {
            name: inner.name.clone(),
            guid: inner.guid,
            state: health,
            status,
            action,
            scan: crate::scan::scan_line(inner),
            config,
            errors: if unrec == 0 { "No known data errors".into() } else { format!("{unrec} data errors, use '-v' for a list") },
            error_list: inner.io.error_log.lock().clone(),
        }
    }

    pub fn list_row(&self) -> PoolListRow {
        let ms = self.inner.io.ms.lock();
        let (size, alloc) = ms.space(Role::Normal);
        PoolListRow {
            name: self.inner.name.clone(),
            size,
            alloc,
            free: size - alloc,
            frag_percent: ms.frag_percent(),
            cap_percent: if size == 0 { 0 } else { alloc * 100 / size },
            health: self.health(),
            ashift: self.inner.config.lock().props.get("ashift").and_then(|a| a.parse().ok()).unwrap_or(12),
        }
    }

    pub fn iostat(&self) -> IostatSnapshot {
        fn add(a: &mut LeafStats, b: &LeafStats) {
            for i in 0..5 {
                a.ops[i] += b.ops[i];
                a.bytes[i] += b.bytes[i];
                a.queued[i] += b.queued[i];
                a.active[i] += b.active[i];
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
        // space per top-level vdev, read under the allocator lock without copying its trees
        let tops = self.inner.tops();
        let (vdev_space, (size, alloc)): (Vec<(u64, u64)>, (u64, u64)) = {
            let ms = self.inner.io.ms.lock();
            (tops.iter().map(|t| ms.vdev_space(t.id)).collect(), ms.space(Role::Normal))
        };
        let mut total = LeafStats::default();
        let mut vdevs = Vec::new();
        for (t, &(size, alloc)) in tops.iter().zip(&vdev_space) {
            let mut tstats = LeafStats::default();
            let mut children = Vec::new();
            for c in t.children() {
                let s = c.queue.stats();
                add(&mut tstats, &s);
                children.push(IostatNode { name: c.spec.display(), role: t.role, alloc: 0, free: 0, stats: s, children: vec![] });
            }
            if t.role == Role::Normal {
                add(&mut total, &tstats);
            }
            let name = if t.is_mirror { format!("mirror-{}", t.id) } else { children[0].name.clone() };
            if t.is_mirror {
                vdevs.push(IostatNode { name, role: t.role, alloc, free: size - alloc, stats: tstats, children });
            } else {
                let mut c = children.pop().unwrap();
                c.alloc = alloc;
                c.free = size - alloc;
                vdevs.push(c);
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

    pub fn arc_stats(&self) -> crate::arc::ArcStats {
        self.inner.io.arc.stats()
    }

    pub fn throttle_stats(&self) -> crate::dsl_pool::ThrottleStats {
        self.inner.dirty.stats()
    }

    pub fn scrub(&self, cmd: ScrubCmd) -> Result<()> {
        self.check_open()?;
        match cmd {
            ScrubCmd::Start => crate::scan::start_scrub(&self.inner),
            ScrubCmd::Pause => crate::scan::pause(&self.inner),
            ScrubCmd::Stop => crate::scan::cancel(&self.inner),
        }
    }

    pub fn scrub_wait(&self) -> Result<()> {
        crate::scan::wait(&self.inner);
        Ok(())
    }

    // ---- config changes -----------------------------------------------------------

    pub fn add(&self, tops: Vec<TopSpec>, force: bool) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let _g = inner.sync_lock.lock();
        let mut new_tops = Vec::new();
        let mut next_id = inner.tops().iter().map(|t| t.id + 1).max().unwrap_or(0);
        for t in &tops {
            let mut kids = Vec::new();
            let mut cfg_kids = Vec::new();
            for l in &t.leaves {
                if inner.find_leaf(&l.display()).is_some() {
                    return Err(Error::invalid(format!("{} is already in pool '{}'", l.display(), inner.name)));
                }
                let dev = (inner.opener)(l, t.role)?;
                check_device_free(&*dev, l, force)?;
                label::wipe_labels(&*dev)?;
                let g = new_guid(&*inner.env);
                kids.push(Arc::new(Leaf::new(g, l.clone(), dev)));
                cfg_kids.push(LeafConfig { guid: g, spec: l.clone(), offline: false, offline_since: 0, dtl: vec![] });
            }
            let ashift = inner.config.lock().props.get("ashift").and_then(|a| a.parse().ok()).unwrap_or(12);
            let top = Arc::new(TopVdev { id: next_id, guid: new_guid(&*inner.env), role: t.role, is_mirror: t.mirror, ashift, children: RwLock::new(kids.clone()) });
            new_tops.push((top, TopConfig { id: next_id, guid: 0, role: t.role, mirror: t.mirror, ashift, children: cfg_kids }, kids));
            next_id += 1;
        }
        for (top, mut tc, kids) in new_tops {
            tc.guid = top.guid;
            if matches!(top.role, Role::Normal | Role::Log) {
                inner.io.ms.lock().add_vdev(top.id, top.role, top.asize());
            }
            inner.leaves.write().extend(kids);
            inner.io.vdevs.write().push(top);
            inner.config.lock().tops.push(tc);
        }
        inner.meta.lock().changed = true;
        inner.io.refresh_space();
        drop(_g);
        inner.write_config_labels("active")?;
        self.sync()
    }

    pub fn attach(&self, existing: &str, new: &LeafSpec, force: bool) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (top, _) = inner.find_leaf(existing).ok_or_else(|| Error::NotFound(format!("device '{existing}' in pool '{}'", inner.name)))?;
        if top.role == Role::Cache || top.role == Role::Spare {
            return Err(Error::invalid("cannot attach to a cache or spare device"));
        }
        if inner.find_leaf(&new.display()).is_some() {
            return Err(Error::invalid(format!("{} is already in pool '{}'", new.display(), inner.name)));
        }
        let dev = (inner.opener)(new, top.role)?;
        check_device_free(&*dev, new, force)?;
        if label::usable_end(dev.size()) < top.asize() + label::DATA_START {
            return Err(Error::invalid(format!("{} is too small to attach", new.display())));
        }
        label::wipe_labels(&*dev)?;
        let g = new_guid(&*inner.env);
        let leaf = Arc::new(Leaf::new(g, new.clone(), dev));
        // it has nothing: every txg up to now is missing
        leaf.set_dtl(vec![(1, inner.txg.open_txg())]);
        {
            let _g = inner.sync_lock.lock();
            top.children.write().push(leaf.clone());
            inner.leaves.write().push(leaf);
            let mut cfg = inner.config.lock();
            if let Some(tc) = cfg.tops.iter_mut().find(|t| t.id == top.id) {
                tc.children.push(LeafConfig { guid: g, spec: new.clone(), offline: false, offline_since: 0, dtl: vec![] });
                tc.mirror = true;
            }
        }
        inner.write_config_labels("active")?;
        crate::scan::start_resilver(inner);
        Ok(())
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
            let others_good = kids.iter().any(|c| c.guid != leaf.guid && c.readable() && c.dtl_empty());
            if !others_good {
                return Err(Error::invalid(format!("cannot detach {dev}: no valid replicas")));
            }
        }
        {
            let _g = inner.sync_lock.lock();
            top.children.write().retain(|c| c.guid != leaf.guid);
            inner.leaves.write().retain(|c| c.guid != leaf.guid);
            let mut cfg = inner.config.lock();
            for tc in cfg.tops.iter_mut() {
                tc.children.retain(|c| c.guid != leaf.guid);
            }
            if top.role == Role::Cache || top.role == Role::Spare {
                cfg.tops.retain(|t| t.id != top.id);
            }
        }
        if top.role == Role::Cache || top.role == Role::Spare {
            inner.io.vdevs.write().retain(|t| t.id != top.id);
        }
        let _ = label::wipe_labels(&**leaf.device());
        inner.write_config_labels("active")
    }

    pub fn offline(&self, dev: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (top, leaf) = inner.find_leaf(dev).ok_or_else(|| Error::NotFound(format!("device '{dev}' in pool '{}'", inner.name)))?;
        if leaf.state() == LeafState::Offline {
            return Ok(());
        }
        if matches!(top.role, Role::Normal | Role::Log) && !top.children().iter().any(|c| c.guid != leaf.guid && c.readable()) {
            return Err(Error::invalid(format!("cannot offline {dev}: no valid replicas")));
        }
        {
            let _g = inner.sync_lock.lock();
            leaf.set_state(LeafState::Offline);
        }
        inner.write_config_labels("active")
    }

    pub fn online(&self, dev: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        let (_top, leaf) = inner.find_leaf(dev).ok_or_else(|| Error::NotFound(format!("device '{dev}' in pool '{}'", inner.name)))?;
        match leaf.state() {
            LeafState::Online => return Ok(()),
            LeafState::Unavail => {
                return Err(Error::invalid(format!("cannot online {dev}: device was missing at import; export and import the pool")));
            }
            _ => {}
        }
        {
            let _g = inner.sync_lock.lock();
            leaf.set_state(LeafState::Online);
        }
        inner.write_config_labels("active")?;
        if !leaf.dtl_empty() {
            crate::scan::start_resilver(inner);
        }
        Ok(())
    }

    pub fn replace(&self, old: &str, new: &LeafSpec, force: bool) -> Result<()> {
        self.check_open()?;
        self.attach(old, new, force)?;
        crate::scan::wait(&self.inner);
        self.detach(old)
    }

    pub fn clear(&self, dev: Option<&str>) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
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
                inner.io.errors.unrecoverable.store(0, Ordering::Relaxed);
                inner.io.error_log.lock().clear();
            }
        }
        if inner.leaves.read().iter().any(|l| l.readable() && !l.dtl_empty()) {
            crate::scan::start_resilver(inner);
        }
        inner.suspended.store(false, Ordering::Relaxed);
        Ok(())
    }

    pub fn get_pool_props(&self) -> Vec<PropRow> {
        let row = self.list_row();
        let cfg = self.inner.config.lock().clone();
        let mut out = vec![];
        let mut push = |p: &str, v: String, s: &str| out.push(PropRow { name: cfg.name.clone(), property: p.into(), value: v, source: s.into(), note: None });
        push("size", row.size.to_string(), "-");
        push("allocated", row.alloc.to_string(), "-");
        push("free", row.free.to_string(), "-");
        push("capacity", format!("{}%", row.cap_percent), "-");
        push("fragmentation", format!("{}%", row.frag_percent), "-");
        push("health", row.health.clone(), "-");
        push("guid", cfg.guid.to_string(), "-");
        for (k, v) in &cfg.props {
            push(k, v.clone(), if k == "ashift" { "local" } else { "default" });
        }
        out
    }

    // ---- volumes -------------------------------------------------------------------

    pub fn volume_create(&self, name: &str, volsize: u64, volblocksize: u32, sparse: bool, props: &[(String, String)]) -> Result<()> {
        let _ = sparse; // reservations are not implemented: every volume is sparse
        self.check_open()?;
        validate_volume_name(name)?;
        if !volblocksize.is_power_of_two() || !(MIN_VOLBLOCKSIZE..=MAX_VOLBLOCKSIZE).contains(&volblocksize) {
            return Err(Error::invalid(format!("volblocksize {volblocksize} must be a power of two from 4K to 128K")));
        }
        if volsize == 0 || volsize % volblocksize as u64 != 0 {
            return Err(Error::invalid(format!("volsize {volsize} must be a non-zero multiple of volblocksize ({volblocksize})")));
        }
        if volsize > (1u64 << 50) {
            return Err(Error::invalid("volsize too large (max 1 PiB)"));
        }
        let mut ps = crate::props::PropSet::default();
        for (k, v) in props {
            if k == "volblocksize" || k == "volsize" {
                return Err(Error::invalid(format!("use -b / -V for '{k}'")));
            }
            ps.set(k, v)?;
        }
        let inner = &self.inner;
        let mut vols = inner.volumes.write();
        if vols.contains_key(name) {
            return Err(Error::Exists(format!("{}/{name}", inner.name)));
        }
        let id = {
            let mut m = inner.meta.lock();
            let id = m.next_volume_id;
            m.next_volume_id += 1;
            m.changed = true;
            id
        };
        let nlevels = dmu::levels_for(volsize / volblocksize as u64);
        vols.insert(
            name.to_string(),
            Arc::new(VolumeState {
                id,
                name: name.to_string(),
                volsize,
                volblocksize,
                created_txg: inner.txg.open_txg(),
                props: RwLock::new(ps),
                committed: RwLock::new(TreeRoot { bp: BlockPointer::hole(), nlevels }),
                dirty: Default::default(),
                destroyed: false.into(),
            }),
        );
        drop(vols);
        self.sync()
    }

    pub fn volume_destroy(&self, name: &str) -> Result<()> {
        self.check_open()?;
        let inner = &self.inner;
        // sync first so the tree we free is complete
        self.sync()?;
        let _g = inner.sync_lock.lock();
        let v = inner.volumes.write().remove(name).ok_or_else(|| Error::NotFound(format!("volume '{}/{name}'", inner.name)))?;
        v.destroyed.store(true, Ordering::Release);
        let root = *v.committed.read();
        let mut m = inner.meta.lock();
        if !root.bp.is_hole() {
            m.doomed.push(root);
        }
        m.changed = true;
        drop(m);
        drop(_g);
        self.sync()
    }

    pub fn volumes(&self) -> Vec<VolumeInfo> {
        self.inner
            .volumes
            .read()
            .values()
            .map(|v| VolumeInfo {
                name: format!("{}/{}", self.inner.name, v.name),
                volsize: v.volsize,
                volblocksize: v.volblocksize,
                used: v.committed.read().bp.fill * v.volblocksize as u64,
                readonly: v.props.read().typed().readonly,
            })
            .collect()
    }

    pub fn open_volume(&self, name: &str) -> Result<Arc<dyn BlockVolume>> {
        Ok(self.open_zvol(name)?)
    }

    pub fn open_zvol(&self, name: &str) -> Result<Arc<crate::zvol::Volume>> {
        self.check_open()?;
        let v = self.inner.volumes.read().get(name).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{name}'", self.inner.name)))?;
        Ok(Arc::new(crate::zvol::Volume::new(self.inner.clone(), v)))
    }

    pub fn get_props(&self, volume: &str, props: &[String]) -> Result<Vec<PropRow>> {
        let v = self.inner.volumes.read().get(volume).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{volume}'", self.inner.name)))?;
        let full = format!("{}/{}", self.inner.name, v.name);
        let ps = v.props.read().clone();
        let used = v.committed.read().bp.fill * v.volblocksize as u64;
        let mut all: Vec<(String, String, String, Option<&str>)> = vec![
            ("volsize".into(), v.volsize.to_string(), "local".into(), None),
            ("volblocksize".into(), v.volblocksize.to_string(), "default".into(), None),
            ("used".into(), used.to_string(), "-".into(), None),
            ("referenced".into(), used.to_string(), "-".into(), None),
            ("logicalused".into(), used.to_string(), "-".into(), None),
        ];
        for d in crate::props::PROPS {
            let (val, src) = ps.get(d.name);
            all.push((d.name.into(), val, src.into(), d.no_effect_yet));
        }
        let wanted: Vec<String> = if props.is_empty() || props.iter().any(|p| p == "all") {
            all.iter().map(|a| a.0.clone()).collect()
        } else {
            props.to_vec()
        };
        let mut out = Vec::new();
        for w in wanted {
            match all.iter().find(|a| a.0 == w) {
                Some((p, val, src, note)) => out.push(PropRow {
                    name: full.clone(),
                    property: p.clone(),
                    value: val.clone(),
                    source: src.clone(),
                    note: note.map(String::from),
                }),
                None => return Err(Error::invalid(format!("unknown property '{w}'"))),
            }
        }
        Ok(out)
    }

    pub fn set_prop(&self, volume: &str, prop: &str, value: &str) -> Result<()> {
        self.check_open()?;
        let v = self.inner.volumes.read().get(volume).cloned().ok_or_else(|| Error::NotFound(format!("volume '{}/{volume}'", self.inner.name)))?;
        v.props.write().set(prop, value)?;
        self.inner.meta.lock().changed = true;
        self.sync()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            // not exported: behave like a crash (nothing more is written)
            self.abandon();
        }
    }
}

/// Refuse a device that carries a label of an active or exported pool unless forced.
fn check_device_free(dev: &dyn Device, spec: &LeafSpec, force: bool) -> Result<()> {
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
            }
        }
    }
    Ok(())
}

/// A leaf that was missing at import.
struct MissingDevice;
impl Device for MissingDevice {
    fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENXIO))
    }
    fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENXIO))
    }
    fn flush(&self) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENXIO))
    }
    fn size(&self) -> u64 {
        0
    }
    fn rotational(&self) -> bool {
        false
    }
    fn kind(&self) -> String {
        "missing".into()
    }
}

/// Files (and block devices) in the search paths that carry a Zilla label.
fn scan_search_paths(search: &[PathBuf], opener: &Opener) -> Result<Vec<(LeafSpec, LabelJson)>> {
    let mut files = Vec::new();
    for p in search {
        if p.is_dir() {
            let rd = std::fs::read_dir(p).map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))))?;
            let mut v: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            v.sort();
            files.extend(v);
        } else if p.exists() {
            files.push(p.clone());
        } else {
            return Err(Error::NotFound(p.display().to_string()));
        }
    }
    let mut out = Vec::new();
    for f in files {
        let Ok(md) = std::fs::metadata(&f) else { continue };
        use std::os::unix::fs::FileTypeExt;
        if !(md.is_file() || md.file_type().is_block_device()) || (md.is_file() && md.len() < label::MIN_DEVICE_SIZE) {
            continue;
        }
        let raw = LeafSpec { path: f.clone(), model: None };
        let Ok(dev) = opener(&raw, Role::Normal) else { continue };
        let Ok(scan) = label::scan_labels(&*dev) else { continue };
        let Some((_, j)) = scan.config else { continue };
        let Ok(lj) = serde_json::from_slice::<LabelJson>(&j) else { continue };
        // keep the latency model recorded in the config for this leaf
        let spec = lj
            .config
            .tops
            .iter()
            .flat_map(|t| t.children.iter())
            .find(|c| c.guid == lj.this_guid)
            .map(|c| LeafSpec { path: f.clone(), model: c.spec.model.clone() })
            .unwrap_or(raw);
        out.push((spec, lj));
    }
    Ok(out)
}

impl Pool {
    /// zdb-style leak check: every allocated extent is referenced exactly once by the
    /// block trees (MOS + volumes) or waits on a defer list, and nothing referenced is
    /// free. Returns a description of the first mismatch.
    pub fn check_space_accounting(&self) -> std::result::Result<(), String> {
        let _g = self.inner.sync_lock.lock();
        let inner = &self.inner;
        let mut used: Vec<(u32, u64, u64)> = Vec::new();
        let mut add_bp = |bp: &BlockPointer| {
            for d in bp.copies() {
                used.push((d.vdev, d.offset, d.asize as u64));
            }
        };
        let mos_root = inner.meta.lock().mos_root;
        if !mos_root.is_hole() {
            for bp in dmu::mos_blocks(&inner.io, &mos_root, crate::vdev::IoClass::SyncRead).map_err(|e| e.to_string())? {
                add_bp(&bp);
            }
        }
        for v in inner.volumes.read().values() {
            let root = *v.committed.read();
            dmu::walk_all(&inner.io, &root, crate::vdev::IoClass::SyncRead, &mut |bp, _| {
                add_bp(bp);
                Ok(())
            })
            .map_err(|e| format!("walking {}: {e}", v.name))?;
        }
        for d in inner.meta.lock().doomed.clone() {
            dmu::walk_all(&inner.io, &d, crate::vdev::IoClass::SyncRead, &mut |bp, _| {
                add_bp(bp);
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        }
        let ms = inner.io.ms.lock().clone();
        for list in ms.defer.values() {
            for d in list {
                used.push((d.vdev, d.offset, d.asize as u64));
            }
        }
        used.sort();
        for w in used.windows(2) {
            if w[0].0 == w[1].0 && w[0].1 + w[0].2 > w[1].1 {
                return Err(format!("double allocation: vdev {} {:#x}+{} overlaps {:#x}+{}", w[0].0, w[0].1, w[0].2, w[1].1, w[1].2));
            }
        }
        for (id, v) in ms.vdevs.iter().enumerate() {
            let Some((_, a)) = v else { continue };
            let mut walked: Vec<(u64, u64)> = Vec::new();
            for &(vd, off, len) in used.iter().filter(|u| u.0 as usize == id) {
                let _ = vd;
                match walked.last_mut() {
                    Some(l) if l.0 + l.1 == off => l.1 += len,
                    _ => walked.push((off, len)),
                }
            }
            let alloc = a.allocated_extents();
            if alloc != walked {
                let a_sum: u64 = alloc.iter().map(|x| x.1).sum();
                let w_sum: u64 = walked.iter().map(|x| x.1).sum();
                let first_diff = alloc.iter().zip(walked.iter()).find(|(x, y)| x != y);
                return Err(format!(
                    "vdev {id}: allocator has {} extents / {a_sum} bytes, trees reference {} extents / {w_sum} bytes; first difference {:?}",
                    alloc.len(),
                    walked.len(),
                    first_diff
                ));
            }
        }
        Ok(())
    }
}
