//! spa import: creating a pool, finding importable pools, importing one.
//!
//! Theory of operation
//! -------------------
//! Create opens every leaf, refuses devices that belong to another pool (unless forced),
//! wipes stale labels, writes the config, and syncs the first txg: the pool exists on disk
//! exactly when that uberblock is durable. Import reads every label, takes the newest
//! config of the pool most of the devices are data or log devices of, matches leaves by
//! guid (missing ones become UNAVAIL), and loads the MOS from the newest uberblock whose
//! object directory reads back, claiming the MOS blocks in a fresh allocator.
//! Another pool's device at one of the pool's paths (a reboot that renamed /dev/sdX, a
//! symlink pointed elsewhere) costs a cache or spare slot only that slot: UNAVAIL, with
//! whose label is there in `pool status`, the device released at once and never written
//! (a cache device holds copies, a spare nothing). In a data or log slot it refuses
//! the import, as a device held by another pool or process does. Leaves whose uberblock rings show they missed txgs
//! or were written apart from the pool get those txgs in their DTL (spa/stale.rs).
//! Two devices whose labels claim the same device guid cannot both be it: import
//! refuses, naming both (which is the pool's cannot be told; an older copy alone is
//! judged stale). The listing (`scan_importable`) gives each pool the state an import
//! would give it, and names every device whose label verifies but whose config does
//! not decode, never skipping one silently.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;

use super::config::{check_distinct_devices, check_distinct_leaves, check_leaf_path, check_system_use, device_ashift, open_top, pool_props_with_defaults, take_new_leaf};
use super::{new_guid, validate_pool_name, CreateOptions, LabelJson, LeafConfig, MosMeta, Opener, Pool, PoolConfig, PoolInner, TopConfig, TopSpec, POOL_VERSION};
use super::default_opener;
use crate::dmu::{self, VolumeState};
use crate::zio::PoolIo;
use crate::env::Env;
use crate::metaslab::Metaslabs;
use crate::vdev::label;
use crate::vdev::mirror::{Leaf, LeafState};
use crate::vdev::{Device, DeviceKind, LeafSpec, Role};
use crate::block::blkptr::BlockPointer;
use crate::{Error, Guid, Result, Txg};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ImportablePool {
    pub name: String,
    pub guid: Guid,
    pub state: String,
    pub leaves: Vec<LeafSpec>,
    /// Devices of the pool's newest config not found in the search, with their role.
    #[serde(default)]
    pub missing: Vec<(Role, LeafSpec)>,
    /// Data and log vdevs none of whose devices was found (`mirror-1`, or the device of
    /// a single-device vdev), with their role.
    #[serde(default)]
    pub absent_vdevs: Vec<(Role, String)>,
    /// What an import would make of the pool: ONLINE, DEGRADED (a data or log device is
    /// missing but every such vdev has one) or UNAVAIL (a data vdev has none: it cannot
    /// be imported; a log vdev has none: only with `-m`).
    #[serde(default)]
    pub health: Option<super::PoolHealth>,
    /// Devices of the pool found more than once: each guid with the devices whose
    /// labels claim it (a copied disk, or a crafted label). Import refuses the pool
    /// while any is listed (UNAVAIL).
    #[serde(default)]
    pub duplicates: Vec<(Guid, Vec<LeafSpec>)>,
}

/// A device in the search whose label checksum verifies (it is a Zilla device) but whose
/// label cannot be used to list it under a pool, and why (printable).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct UnusableLabel {
    pub device: LeafSpec,
    pub reason: String,
}

/// What a search for importable pools found: the pools, and the Zilla devices that
/// belong to none of them because their labels cannot be used.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ImportScan {
    pub pools: Vec<ImportablePool>,
    #[serde(default)]
    pub unusable: Vec<UnusableLabel>,
}

/// How to import (CLI: `zilla pool import [-f] [-F [-n]]`).
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Import even if the labels say the pool is active on another host id (never one
    /// whose multihost heartbeat moves while import watches it).
    pub force: bool,
    /// If the newest txg cannot be read, load the newest older one that can (after
    /// verifying every block it references), dropping the writes of the txgs between.
    pub rewind: bool,
    /// With `rewind`: say what would be loaded and dropped, import nothing.
    pub dry_run: bool,
    /// Import even though every device of a log vdev is missing, discarding the intent
    /// log records on it (`zpool import -m`).
    pub missing_log: bool,
}

/// What a rewind loads and what it drops.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RewindPlan {
    pub pool: String,
    /// The newest txg on disk, and when it was written.
    pub newest_txg: Txg,
    pub newest_time_ns: u64,
    /// The txg the import loads (equal to newest_txg when no rewind is needed).
    pub load_txg: Txg,
    pub load_time_ns: u64,
    /// Seconds of acknowledged writes between the two that a rewind drops.
    pub dropped_seconds: f64,
    /// Why the newest txg cannot be loaded (empty when it can).
    pub reason: String,
}

/// Leaves opened (claimed) by a create or import in progress: released if it fails, so
/// the next attempt does not find them held by the I/O threads of a half-built pool.
#[derive(Default)]
struct Claims(Vec<Arc<dyn Device>>);

impl Claims {
    fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        for d in &self.0 {
            d.release();
        }
    }
}

struct Opened {
    spec: LeafSpec,
    dev: Arc<dyn Device>,
}

/// Open (claim) every leaf of a new pool, refusing devices in use or with signatures.
/// The top-level vdevs of a new pool from its opened leaves: their configs, leaves,
/// vdevs and allocator.
fn new_tops(opened_tops: Vec<(TopSpec, Vec<Opened>)>, ashift: u8, env: &Arc<dyn Env>) -> (Vec<TopConfig>, Vec<Arc<Leaf>>, Vec<Arc<crate::vdev::mirror::TopVdev>>, Metaslabs) {
    let mut cfg_tops = Vec::new();
    let mut leaves = Vec::new();
    let mut vdevs = Vec::new();
    let ms = Metaslabs::new();
    for (id, (t, opened)) in opened_tops.into_iter().enumerate() {
        let tguid = new_guid(&**env);
        let mut children = Vec::new();
        let mut leaf_objs = Vec::new();
        for o in opened {
            let g = new_guid(&**env);
            children.push(LeafConfig { guid: g, spec: o.spec.clone(), offline: false, offline_since: Txg::ZERO, dtl: vec![], replacing: None });
            let leaf = Arc::new(Leaf::new(g, o.spec, o.dev, env));
            leaves.push(leaf.clone());
            leaf_objs.push(leaf);
        }
        let tc = TopConfig { id: crate::VdevId(id as u32), guid: tguid, role: t.role, mirror: t.mirror, ashift, children };
        let top = open_top(&tc, leaf_objs);
        if matches!(t.role, Role::Normal | Role::Log) {
            ms.add_vdev(top.id, top.role, top.asize());
        }
        vdevs.push(top);
        cfg_tops.push(tc);
    }
    (cfg_tops, leaves, vdevs, ms)
}

fn open_new_leaves(tops: &[TopSpec], opener: &Opener, force: bool, claims: &mut Claims) -> Result<Vec<(TopSpec, Vec<Opened>)>> {
    let mut opened_tops = Vec::new();
    for t in tops {
        let mut v = Vec::new();
        for l in &t.leaves {
            check_system_use(l, force)?;
            let dev = opener(l, t.role)?;
            claims.0.push(dev.clone());
            take_new_leaf(&*dev, l, t.role, force)?;
            v.push(Opened { spec: l.clone(), dev });
        }
        opened_tops.push((t.clone(), v));
    }
    Ok(opened_tops)
}

/// A leaf with a latency model is reopened with its role's profile (log, cache): the
/// claim is handed over from the first open.
fn reopen_for_role(spec: &LeafSpec, dev: &Arc<dyn Device>, role: Role, opener: &Opener, claims: &mut Claims) -> Result<Arc<dyn Device>> {
    if spec.model.is_none() || role == Role::Normal {
        return Ok(dev.clone());
    }
    dev.release();
    let d = opener(spec, role)?;
    claims.0.push(d.clone());
    Ok(d)
}

/// The pool's ashift: `requested` (0 = automatic) or the largest sector of any leaf.
/// A requested ashift below a leaf's sector size is refused: a write would share a
/// physical sector with live data.
fn choose_ashift(tops: &[(TopSpec, Vec<Opened>)], requested: u8) -> Result<u8> {
    let mut needed = label::MIN_ASHIFT;
    for o in tops.iter().flat_map(|(_, v)| v.iter()) {
        let a = device_ashift(&*o.dev, &o.spec)?;
        if requested != 0 && a > requested {
            return Err(Error::invalid(format!(
                "ashift {requested} is below the {}-byte sectors of {}: a write would share a physical sector with live data",
                1u32 << a,
                o.spec.display()
            )));
        }
        needed = needed.max(a);
    }
    Ok(if requested == 0 { needed } else { requested })
}

impl Pool {
    pub fn create(name: &str, tops: Vec<TopSpec>, opts: CreateOptions) -> Result<Arc<Pool>> {
        Self::create_with(name, tops, opts, default_opener())
    }

    pub fn create_with(name: &str, tops: Vec<TopSpec>, opts: CreateOptions, opener: Opener) -> Result<Arc<Pool>> {
        validate_pool_name(name)?;
        if !tops.iter().any(|t| t.role == Role::Normal) {
            return Err(Error::invalid("a pool needs at least one data vdev (not only log/cache/spare)"));
        }
        let mut props = opts.props.clone();
        // `-o version=1|2`, as zpool create's: the on-disk format (not a stored property)
        let version = super::format2::take_version_prop(&mut props)?;
        if let Some(a) = opts.ashift {
            props.push(("ashift".into(), a.to_string()));
        }
        let all_specs: Vec<&LeafSpec> = tops.iter().flat_map(|t| t.leaves.iter()).collect();
        check_distinct_leaves(&all_specs, &[], name)?;
        all_specs.iter().try_for_each(|l| check_leaf_path(l))?;
        let mut claims = Claims::default();
        let opened_tops = open_new_leaves(&tops, &opener, opts.force, &mut claims)?;
        let all_devs: Vec<(&LeafSpec, &dyn Device)> = opened_tops.iter().flat_map(|(_, v)| v.iter()).map(|o| (&o.spec, &*o.dev)).collect();
        check_distinct_devices(&all_devs)?;
        let mut pool_props = pool_props_with_defaults(&props, 0)?;
        let ashift = choose_ashift(&opened_tops, pool_props["ashift"].parse().unwrap_or(0))?;
        pool_props.insert("ashift".into(), ashift.to_string());
        let env = opts.env.clone().unwrap_or_else(crate::env::real);
        let guid = new_guid(&*env);
        let (cfg_tops, leaves, vdevs, ms) = new_tops(opened_tops, ashift, &env);
        let format2 = version.unwrap_or_else(super::format2::create_format) == 2;
        let config = PoolConfig {
            name: name.to_string(),
            guid,
            version: if format2 { 2 } else { POOL_VERSION },
            state: "active".into(),
            txg: crate::txg::TXG_INITIAL,
            tops: cfg_tops,
            props: pool_props,
            hostid: env.hostid(),
            hostname: crate::env::system_hostname(),
            features_for_read: format2.then(Vec::new),
            features_for_write: format2.then(Vec::new),
        };
        let meta = MosMeta { next_volume_id: 1, mos_root: BlockPointer::hole(), doomed: vec![], scan_state: String::new(), changed: true, health: vec![], history: Default::default(), format2: None };
        let io = PoolIo::new(vdevs, ms, env.clone());
        let inner = PoolInner::new(config, io, leaves, BTreeMap::new(), meta, crate::txg::TXG_INITIAL.prev(), opener, env);
        // wipe stale uberblock rings, then config labels, then the first txg
        for leaf in inner.leaves.read().iter() {
            label::wipe_labels(&**leaf.device()).map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", leaf.spec.display()))))?;
        }
        inner.write_config_labels("active")?;
        let t = inner.txg.open_txg();
        if format2 {
            // journaled from the first allocation: the space maps record every one
            inner.io.ms.set_journal(true);
            let bio = dmu::pool_block_io::PoolBlockIo::new(&inner.io, t, crate::vdev::IoClass::SyncRead);
            let creation_s = inner.env.unix_time_ns() / 1_000_000_000;
            let f2 = super::format2::Format2::create(&bio, &inner.io, t, creation_s, new_guid(&*inner.env).get())?;
            debug_assert!(bio.take_batch().is_empty(), "creating the MOS writes nothing before its sync");
            inner.meta.lock().format2 = Some(Arc::new(f2));
        }
        inner.spa_sync(t)?;
        inner.txg.initial_synced(t);
        claims.keep();
        inner.io.start_l2arc(false);
        Ok(Self::from_inner(inner))
    }

    pub fn find_importable(search: &[PathBuf]) -> Result<Vec<ImportablePool>> {
        Ok(Self::scan_importable(search)?.pools)
    }

    /// The importable pools in `search`, and the devices whose labels verify but cannot
    /// be used (listed, never skipped silently).
    pub fn scan_importable(search: &[PathBuf]) -> Result<ImportScan> {
        let (found, unusable) = scan_search_paths(search)?;
        // per pool, the name and state of the newest config any of its devices holds
        // (as import itself chooses): a device detached or removed while the pool was
        // active keeps an older config saying "active" after the pool is exported
        let mut out: BTreeMap<Guid, (PoolConfig, Vec<(Guid, LeafSpec)>, ImportablePool)> = BTreeMap::new();
        for (spec, lj) in found {
            if lj.config.state == "destroyed" {
                continue;
            }
            let c = &lj.config;
            let (newest, seen, e) = out.entry(c.guid).or_insert_with(|| {
                let p = ImportablePool {
                    name: c.name.clone(),
                    guid: c.guid,
                    state: c.state.clone(),
                    leaves: vec![],
                    missing: vec![],
                    absent_vdevs: vec![],
                    health: None,
                    duplicates: vec![],
                };
                (c.clone(), vec![], p)
            });
            if c.txg > newest.txg {
                *newest = c.clone();
                e.name = c.name.clone();
                e.state = c.state.clone();
            }
            seen.push((lj.this_guid, spec.clone()));
            e.leaves.push(spec);
        }
        let pools = out
            .into_values()
            .map(|(cfg, seen, mut p)| {
                let guids: Vec<Guid> = seen.iter().map(|(g, _)| *g).collect();
                let leaves = cfg.tops.iter().flat_map(|t| t.children.iter().map(move |c| (t.role, c)));
                p.missing = leaves.filter(|(_, c)| !guids.contains(&c.guid)).map(|(role, c)| (role, c.spec.clone())).collect();
                p.duplicates = claimed_twice(&cfg, seen.iter().map(|(g, s)| (*g, s)));
                set_import_health(&mut p, &cfg, &guids);
                p
            })
            .collect();
        Ok(ImportScan { pools, unusable })
    }

    pub fn import(search: &[PathBuf], name: Option<&str>) -> Result<Arc<Pool>> {
        Self::import_found(search, name, &ImportOptions::default())
    }

    /// Import the pool `name` (or the only one) found in `search`, with `opts`.
    pub fn import_found(search: &[PathBuf], name: Option<&str>, opts: &ImportOptions) -> Result<Arc<Pool>> {
        let leaves = Self::find_one(search, name)?;
        Self::import_with_options(&leaves, default_opener(), crate::env::real(), opts)
    }

    /// `import -F -n`: what a rewind of the pool `name` found in `search` would load and
    /// drop, importing nothing.
    pub fn rewind_plan_found(search: &[PathBuf], name: Option<&str>) -> Result<RewindPlan> {
        let leaves = Self::find_one(search, name)?;
        Self::rewind_plan(&leaves, default_opener())
    }

    /// The leaves of the one importable pool matching `name` (or the only one).
    fn find_one(search: &[PathBuf], name: Option<&str>) -> Result<Vec<LeafSpec>> {
        let ImportScan { pools: cands, unusable } = Self::scan_importable(search)?;
        let chosen: Vec<&ImportablePool> = match name {
            Some(n) => cands.iter().filter(|c| c.name == n || c.guid.to_string() == n).collect(),
            None => cands.iter().collect(),
        };
        match chosen.len() {
            0 => Err(Error::NotFound(format!(
                "pool '{}' (no importable pool found in the given directories{})",
                super::config::printable(name.unwrap_or("")),
                unusable.iter().map(|u| format!("; {}: {}", super::config::printable(&u.device.display()), u.reason)).collect::<String>()
            ))),
            1 => Ok(chosen[0].leaves.clone()),
            _ => Err(Error::invalid(format!(
                "more than one importable pool{}: {}; name one (or its guid)",
                name.map(|n| format!(" named '{n}'")).unwrap_or_default(),
                chosen.iter().map(|c| format!("{} ({})", super::config::printable(&c.name), c.guid)).collect::<Vec<_>>().join(", ")
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
        Self::import_with_options(specs, opener, env, &ImportOptions::default())
    }

    /// What `import -F` would do, without doing it (`import -F -n`).
    pub fn rewind_plan(specs: &[LeafSpec], opener: Opener) -> Result<RewindPlan> {
        let opts = ImportOptions { rewind: true, dry_run: true, missing_log: true, ..Default::default() };
        let loaded = load_for_import(specs, &opener, &opts, &crate::env::real(), &mut Claims::default())?;
        Ok(loaded.chosen.plan)
    }

    /// Import, with `opts`: `rewind` allows loading an older txg when the newest cannot
    /// be read (`zpool import -F`). A dry run imports nothing: use [`Pool::rewind_plan`].
    pub fn import_with_options(specs: &[LeafSpec], opener: Opener, env: Arc<dyn Env>, opts: &ImportOptions) -> Result<Arc<Pool>> {
        if opts.dry_run {
            return Err(Error::invalid("a dry run imports nothing: use rewind_plan"));
        }
        let mut claims = Claims::default();
        let Loaded { mut cfg, leaves, io, chosen, bad_labels, judged } = load_for_import(specs, &opener, opts, &env, &mut claims)?;
        let Chosen { ub, mos, ms, format2, newest_txg, plan } = chosen;
        if plan.load_txg != plan.newest_txg {
            tracing::warn!(pool = %cfg.name, "rewinding from txg {} to txg {}: {:.1} s of writes dropped ({})", plan.newest_txg, plan.load_txg, plan.dropped_seconds, plan.reason);
        }
        io.ms.replace_with(ms);
        // a format 2 pool's allocator journals what its space maps must record
        io.ms.set_journal(format2.is_some());
        io.refresh_space();
        settle_leaf_states(&io, &leaves, &cfg, &mos, &judged);
        let volumes = volumes_from_mos(&mos);
        if let Ok(p) = serde_json::from_str::<BTreeMap<String, String>>(&mos.pool_props) {
            cfg.props.extend(p);
        }
        // a property newer than the pool reads as its default
        for (k, v) in super::config::POOL_PROP_DEFAULTS {
            cfg.props.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
        let health = mos.leaf_health.clone().unwrap_or_default();
        let meta = MosMeta { next_volume_id: mos.next_volume_id, mos_root: ub.root, doomed: vec![], scan_state: mos.scan_state.clone(), changed: false, health, history: mos.history.clone(), format2 };
        // After a rewind the next txg follows the newest one seen, so its uberblocks
        // outrank the skipped ones in every slot.
        let inner = PoolInner::new(cfg, io, leaves, volumes, meta, newest_txg.max(ub.txg), opener, env);
        *inner.last_ub.lock() = Some(ub.clone());
        // rewrite labels: marks the pool active and repairs damaged label copies
        if let Err(e) = inner.write_config_labels("active") {
            tracing::warn!("import: could not rewrite labels: {e}");
        }
        // not onto a stale or diverged device before a synced MOS records its DTL
        if !judged.any() {
            spread_loaded_uberblock(&inner, &ub, newest_txg);
        }
        if bad_labels > 0 {
            tracing::info!(pool = %inner.name, bad_labels, "rewrote damaged labels");
        }
        claims.keep();
        // the pool is ours: its cache devices may be read back and fed
        inner.io.start_l2arc(true);
        let pool = Self::from_inner(inner);
        // the intent logs, before anyone can open a volume; only the newest txg's
        // (a rewound pool's logs name blocks reused since)
        if ub.txg == newest_txg {
            if let Err(e) = pool.replay_intent_logs(&mos, ub.txg, opts.missing_log) {
                pool.abandon();
                return Err(e);
            }
        }
        if judged.any() {
            record_judged_devices(&pool);
        }
        // leaves returning with a DTL get resilvered
        for l in pool.inner.leaves.read().iter() {
            if l.state() == LeafState::Online && !l.dtl_empty() {
                crate::scan::start_resilver(&pool.inner.scanner());
                break;
            }
        }
        Ok(pool)
    }

}

/// The volumes of an object directory name each volume once, by a name `volume create`
/// accepts, and each id once, below the next id to hand out: a crafted directory that
/// repeats one would have two volumes share an intent log and a tree.
fn check_mos_volumes(mos: &crate::dmu::Mos) -> std::result::Result<(), String> {
    let (mut ids, mut names) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for v in &mos.volumes {
        let shown = crate::spa::config::printable(&v.name);
        super::validate_volume_name(&v.name).map_err(|_| format!("field volume name = {shown} is not a valid volume name"))?;
        if !names.insert(v.name.as_str()) {
            return Err(format!("field volume name = {shown} appears twice"));
        }
        if !ids.insert(v.id) || v.id >= mos.next_volume_id {
            return Err(format!("field volume id = {} of volume {shown} is repeated or not below the next id {}", v.id, mos.next_volume_id));
        }
    }
    Ok(())
}

/// The volumes the MOS lists, as the pool holds them (each with an empty intent log
/// until replay).
fn volumes_from_mos(mos: &crate::dmu::Mos) -> BTreeMap<String, Arc<VolumeState>> {
    let mut volumes = BTreeMap::new();
    for v in &mos.volumes {
        volumes.insert(
            v.name.clone(),
            Arc::new(VolumeState {
                id: v.id,
                name: v.name.clone(),
                volsize: v.volsize.into(),
                grown_volsize: 0.into(),
                volblocksize: v.volblocksize,
                created_txg: v.created_txg,
                props: crate::props::PublishedProps::new(v.props.clone()),
                committed: RwLock::new(v.root),
                dirty: Default::default(),
                destroyed: false.into(),
                zil: crate::zil::Zilog::new(v.id),
                // a record without the property (older images too) is sparse
                space: Arc::new(crate::dsl_pool::VolumeSpace::new(
                    crate::props::refreservation_bytes(&v.props.value("refreservation")),
                    v.root.bp.fill * v.volblocksize as u64,
                )),
                zfetch: Default::default(),
            }),
        );
    }
    volumes
}

/// A device read at import: its spec, the open device, its labels and config.
type DevLabel = (LeafSpec, Arc<dyn Device>, label::LabelScan, Option<LabelJson>);

/// Everything import reads before it builds the pool.
struct Loaded {
    cfg: PoolConfig,
    leaves: Vec<Arc<Leaf>>,
    io: PoolIo,
    chosen: Chosen,
    bad_labels: usize,
    judged: super::stale::Judged,
}

/// Read the labels, build the vdev tree, choose the uberblock and load its MOS.
fn load_for_import(specs: &[LeafSpec], opener: &Opener, opts: &ImportOptions, env: &Arc<dyn Env>, claims: &mut Claims) -> Result<Loaded> {
    if specs.is_empty() {
        return Err(Error::invalid("no devices to import from"));
    }
    // one device per path: while a device is replaced in place the config names two
    // leaves at one path (the old one, now missing, and the new one); the device
    // there is opened (and locked) once, and its label says which leaf it is
    let mut unique: Vec<LeafSpec> = Vec::with_capacity(specs.len());
    for s in specs {
        if !unique.iter().any(|u| u.path == s.path) {
            unique.push(s.clone());
        }
    }
    let (devs, mut cfg, reasons) = read_labels(&unique, opener, claims)?;
    let checked: Vec<(&dyn Device, &label::LabelScan)> = devs.iter().filter(|d| d.3.is_some()).map(|d| (&*d.1, &d.2)).collect();
    super::mmp::check_import_ownership(&cfg, &checked, &**env, opts.force)?;
    check_features(&cfg)?;
    if !opts.dry_run {
        // the pool is ours and nothing of it has written yet; a device at one of its
        // paths that is none of its leaves is not written
        // (a cache or spare device holds no intent log: not filled)
        for (spec, dev, _, _) in devs.iter().filter(|d| d.3.as_ref().is_some_and(|lj| in_config(&cfg, lj.this_guid))) {
            if slot_at(&cfg, &spec.path).is_some_and(|role| !super::config::holds_intent_log(role)) {
                continue;
            }
            crate::vdev::fill_log_region(&**dev, &spec.display());
        }
    }
    let (vdevs, leaves, ubs, bad_labels) = build_tree(&mut cfg, &devs, &reasons, opener, env, claims)?;
    if let (true, Some((spec, _, scan, _))) = (ubs.is_empty(), devs.iter().find(|d| !d.2.rejected.is_empty())) {
        return Err(Error::Corrupt(format!("pool '{}': no valid uberblock; {}: {}", cfg.name, spec.display(), scan.rejected[0])));
    }
    let io = PoolIo::new(vdevs, Metaslabs::new(), env.clone());
    let chosen = choose_uberblock(&io, &cfg, ubs, opts)?;
    label::check_pool_txg(&chosen.ub).map_err(|why| Error::Corrupt(format!("pool '{}': {why}", cfg.name)))?;
    check_mos_volumes(&chosen.mos).map_err(|why| Error::Corrupt(format!("pool '{}': object directory of txg {}: {why}", cfg.name, chosen.ub.txg)))?;
    let judged = judge_devices(&devs, &cfg, &chosen.ub);
    if !opts.missing_log {
        super::replay::check_log_devices(&cfg, &leaves, &chosen.mos, &chosen.ub)?;
    }
    Ok(Loaded { cfg, leaves, io, chosen, bad_labels, judged })
}

/// The features a format 2 label lists (§19): an unknown read feature refuses the
/// pool naming it; an unknown write feature would need a read-only import, which this
/// build does not offer, so it refuses the pool too, saying so.
fn check_features(cfg: &PoolConfig) -> Result<()> {
    let (Some(read), Some(write)) = (&cfg.features_for_read, &cfg.features_for_write) else { return Ok(()) };
    let named = |e: Error| Error::invalid(format!("pool '{}': {e}", cfg.name));
    match crate::zfeature::import_access(read, write).map_err(named)? {
        crate::zfeature::Access::ReadWrite => Ok(()),
        crate::zfeature::Access::ReadOnly { unknown_write } => Err(Error::invalid(format!(
            "pool '{}' uses feature{} this build does not support for writing: {}; it could be imported only read-only, which this build does not offer",
            cfg.name,
            if unknown_write.len() > 1 { "s" } else { "" },
            unknown_write.join(", ")
        ))),
    }
}

/// Stale and diverged devices (spa/stale.rs), judged by the uberblocks of the pool's
/// data and log devices against the one loaded.
fn judge_devices(devs: &[DevLabel], cfg: &PoolConfig, loaded: &label::Uberblock) -> super::stale::Judged {
    let ub_guids: Vec<Guid> = cfg.tops.iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)).flat_map(|t| t.children.iter().map(|c| c.guid)).collect();
    let rings: Vec<(Guid, Vec<label::Uberblock>)> = devs
        .iter()
        .filter_map(|d| d.3.as_ref().map(|lj| (lj.this_guid, &d.2)))
        .filter(|(g, _)| ub_guids.contains(g))
        .map(|(g, scan)| (g, scan.uberblocks.iter().filter(|u| u.pool_guid == cfg.guid).cloned().collect()))
        .collect();
    let judged = super::stale::judge(&rings, loaded);
    for (spec, _, _, lj) in devs {
        if let Some(lj) = lj {
            let v = judged.verdict(lj.this_guid);
            if *v != super::stale::Verdict::Current {
                tracing::warn!(pool = %cfg.name, device = %spec.shown(), "{}: resilvering it", v.note());
            }
        }
    }
    judged
}

/// None of the devices has a pool label. `missing`: those that could not be opened
/// because they do not exist. "does not exist" only when none exists; else each device
/// with what is wrong with it.
fn no_valid_label(specs: &[LeafSpec], missing: &[LeafSpec]) -> Error {
    let paths = |v: &[&LeafSpec]| v.iter().map(|s| s.display()).collect::<Vec<_>>().join(", ");
    let (gone, there): (Vec<&LeafSpec>, Vec<&LeafSpec>) = specs.iter().partition(|s| missing.contains(s));
    if there.is_empty() {
        return Error::NotFound(paths(&gone));
    }
    let mut what = format!("{} {}", paths(&there), if there.len() == 1 { "has no valid label" } else { "have no valid label" });
    if !gone.is_empty() {
        what.push_str(&format!("; {} {}", paths(&gone), if gone.len() == 1 { "does not exist" } else { "do not exist" }));
    }
    Error::InvalidArgument(format!("no valid pool label: {what}"))
}

/// A path of the pool's config, and why import could not use what it found there:
/// shown by `pool status` beside the leaf, UNAVAIL.
type PathReason = (PathBuf, String);

/// What import found at a path that is not one of the pool's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stranger {
    /// A label of another pool (`cache`: of one of its cache devices).
    OtherPool { name: String, guid: Guid, cache: bool },
    /// Held by another pool or process (taking it failed busy), and its label, read
    /// without taking it, is not this pool's: another pool's, or (None) none.
    Held { label: Option<(String, Guid)> },
}

impl Stranger {
    /// Why the slot is UNAVAIL, as `pool status` shows it.
    fn reason(&self) -> String {
        let pool = |name: &str, guid: &Guid| format!("label belongs to pool '{}' (guid {guid})", super::config::printable(name));
        match self {
            Stranger::OtherPool { name, guid, .. } => pool(name, guid),
            Stranger::Held { label: Some((name, guid)) } => format!("{}; the device is in use", pool(name, guid)),
            Stranger::Held { label: None } => "in use by another process, with no label of this pool".into(),
        }
    }
}

/// What import does with a stranger at a path of its config.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StrangerVerdict {
    /// The slot is UNAVAIL for this reason, and the pool imports: the device is
    /// released at once, never read again nor written.
    Unavail(String),
    /// The import is refused (the error names the device).
    Refuse,
}

/// A stranger in a cache or spare slot (`slot`: the role of the config's leaf at its
/// path, None when the config names no leaf there) costs only that slot: a cache
/// device holds copies, a spare nothing, so the pool imports with the slot UNAVAIL
/// (as OpenZFS does). In a data or log slot, or at a path the config does not name,
/// it refuses the import: the pool's data may be what is missing, and which device
/// is the pool's is for the admin to say. Another pool's cache device is passed by
/// wherever it is (it names no data): a slot it stands in is UNAVAIL.
fn stranger_verdict(slot: Option<Role>, s: &Stranger) -> StrangerVerdict {
    match (slot, s) {
        (Some(Role::Cache | Role::Spare), _) | (_, Stranger::OtherPool { cache: true, .. }) => StrangerVerdict::Unavail(s.reason()),
        _ => StrangerVerdict::Refuse,
    }
}

/// The role of `cfg`'s leaf whose path is `path` (None: no leaf there).
fn slot_at(cfg: &PoolConfig, path: &std::path::Path) -> Option<Role> {
    cfg.tops.iter().find_map(|t| t.children.iter().any(|c| c.spec.path == path).then_some(t.role))
}

/// Whether `cfg` lists a leaf with guid `guid`.
fn in_config(cfg: &PoolConfig, guid: Guid) -> bool {
    cfg.tops.iter().any(|t| t.children.iter().any(|c| c.guid == guid))
}

/// The label of a device held elsewhere, read without taking it (read-only,
/// unlocked): Ok(None) when it has none, Err when it cannot be read.
fn peek_label(spec: &LeafSpec) -> std::result::Result<Option<LabelJson>, ()> {
    let dev = crate::vdev::file::FileDevice::open_shared(&spec.path).map_err(|_| ())?;
    let scan = label::scan_labels(&dev).map_err(|_| ())?;
    match scan.config {
        None => Ok(None),
        Some((_, j)) => super::config::parse_label(&j).map(Some).map_err(|_| ()),
    }
}

/// The config import goes by: the newest of the pool whose data and log devices are
/// most of those found (then: most of them at the path their config gives; then the
/// newest config), so one device of another pool at one of the pool's paths cannot
/// make the pool's own devices look foreign, whichever config is newer. A cache
/// device's label (optional, never holding data) names the pool only when nothing else
/// does, so another pool's cache device put in its place cannot either.
fn choose_config(devs: &[DevLabel]) -> Option<PoolConfig> {
    let mut by_pool: BTreeMap<Guid, (usize, usize, &PoolConfig)> = BTreeMap::new();
    for (spec, _, _, lj) in devs {
        let Some(lj) = lj.as_ref().filter(|lj| !labels_a_cache_device(lj)) else { continue };
        let at_home = lj.config.tops.iter().flat_map(|t| t.children.iter()).any(|c| c.guid == lj.this_guid && c.spec.path == spec.path);
        let e = by_pool.entry(lj.config.guid).or_insert((0, 0, &lj.config));
        e.0 += 1;
        e.1 += at_home as usize;
        if lj.config.txg > e.2.txg {
            e.2 = &lj.config;
        }
    }
    let best = by_pool.into_values().max_by_key(|(found, at_home, cfg)| (*found, *at_home, cfg.txg)).map(|(_, _, cfg)| cfg.clone());
    best.or_else(|| devs.iter().filter_map(|d| d.3.as_ref()).max_by_key(|lj| lj.config.txg).map(|lj| lj.config.clone()))
}

/// What opening and reading the devices to import found.
#[derive(Default)]
struct Found {
    devs: Vec<DevLabel>,
    /// Paths that do not exist.
    missing: Vec<LeafSpec>,
    /// Devices held by another pool or process, with the error saying so.
    held: Vec<(LeafSpec, Error)>,
    reasons: Vec<PathReason>,
}

/// Every device's labels, the config import goes by ([`choose_config`]), and why the
/// paths of the config that hold no device of the pool could not be used. Devices
/// that are not the pool's (another pool's, [`stranger_verdict`]) are released and
/// left out; a device held elsewhere refuses the import unless it is such a stranger
/// in a cache or spare slot.
fn read_labels(specs: &[LeafSpec], opener: &Opener, claims: &mut Claims) -> Result<(Vec<DevLabel>, PoolConfig, Vec<PathReason>)> {
    let mut found = open_devices(specs, opener, claims)?;
    let Some(best_cfg) = choose_config(&found.devs) else {
        return Err(match found.held.into_iter().next() {
            Some((_, busy)) => busy,
            None => no_valid_label(specs, &found.missing),
        });
    };
    if best_cfg.state == "destroyed" {
        return Err(Error::NotFound(format!("pool '{}' was destroyed", best_cfg.name)));
    }
    set_strangers_aside(&mut found, &best_cfg)?;
    check_one_device_per_guid(&found.devs, &best_cfg)?;
    check_one_name(&found.devs, &best_cfg)?;
    Ok((found.devs, best_cfg, found.reasons))
}

/// Open (claim) each device and read its labels. A device held elsewhere is noted
/// for [`set_strangers_aside`]; one that cannot be opened or read, with why.
fn open_devices(specs: &[LeafSpec], opener: &Opener, claims: &mut Claims) -> Result<Found> {
    let mut found = Found::default();
    for s in specs {
        let dev = match opener(s, Role::Normal) {
            Ok(d) => {
                claims.0.push(d.clone());
                d
            }
            // held by a live pool (here or in another process): never import around it,
            // unless it is another pool's device in a cache or spare slot (known once
            // the config is)
            Err(e @ Error::Busy(_)) => {
                found.held.push((s.clone(), e));
                continue;
            }
            Err(e) => {
                if matches!(&e, Error::NotFound(_)) || matches!(&e, Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound) {
                    found.missing.push(s.clone());
                } else {
                    found.reasons.push((s.path.clone(), format!("cannot be opened: {e}")));
                }
                tracing::warn!("import: cannot open {}: {e}", s.shown());
                continue;
            }
        };
        let scan = match label::scan_labels(&*dev) {
            Ok(sc) => sc,
            Err(e) => {
                tracing::warn!("import: cannot read labels of {}: {e}", s.shown());
                found.reasons.push((s.path.clone(), format!("its labels cannot be read: {e}")));
                continue;
            }
        };
        // every number of a label is checked before use: one out of range fails the import
        let lj = match scan.config.as_ref().map(|(_, j)| super::config::parse_label(j)).transpose() {
            Ok(lj) => lj,
            Err(why) => return Err(Error::Corrupt(format!("{}: label: {why}", s.shown()))),
        };
        for why in &scan.rejected {
            tracing::warn!(device = %s.shown(), "import: {why}; not used");
        }
        found.devs.push((s.clone(), dev, scan, lj));
    }
    Ok(found)
}

/// Judge the devices that are not `best`'s ([`stranger_verdict`]): refuse the import,
/// or leave them out (released) with the reason for their slot. Also note why the
/// devices left that are none of its leaves (no label, a guid it does not list) are not.
fn set_strangers_aside(found: &mut Found, best: &PoolConfig) -> Result<()> {
    let reasons = &mut found.reasons;
    let mut keep_out = |spec: &LeafSpec, verdict: StrangerVerdict| -> bool {
        match verdict {
            StrangerVerdict::Unavail(why) => {
                tracing::warn!(pool = %best.name, device = %spec.shown(), "import: {why}; not used (the slot is UNAVAIL)");
                reasons.push((spec.path.clone(), why));
                true
            }
            StrangerVerdict::Refuse => false,
        }
    };
    for (spec, busy) in std::mem::take(&mut found.held) {
        let stranger = match peek_label(&spec) {
            Ok(Some(lj)) if lj.config.guid != best.guid => Stranger::Held { label: Some((lj.config.name, lj.config.guid)) },
            Ok(None) => Stranger::Held { label: None },
            // this pool's device held elsewhere (imported there?), or unreadable
            _ => return Err(busy),
        };
        if !keep_out(&spec, stranger_verdict(slot_at(best, &spec.path), &stranger)) {
            return Err(busy);
        }
    }
    let mut strangers = Vec::new();
    for (i, d) in found.devs.iter().enumerate() {
        let Some(lj) = d.3.as_ref().filter(|lj| lj.config.guid != best.guid) else { continue };
        let stranger = Stranger::OtherPool { name: lj.config.name.clone(), guid: lj.config.guid, cache: labels_a_cache_device(lj) };
        if !keep_out(&d.0, stranger_verdict(slot_at(best, &d.0.path), &stranger)) {
            return Err(Error::invalid(format!("{} belongs to another pool ('{}', guid {})", d.0.display(), lj.config.name, lj.config.guid)));
        }
        strangers.push(i);
    }
    for i in strangers.into_iter().rev() {
        // not the pool's: not held a moment longer than the label read took
        found.devs.remove(i).1.release();
    }
    for (spec, _, _, lj) in &found.devs {
        match lj {
            None => found.reasons.push((spec.path.clone(), "no valid label".into())),
            Some(lj) if !in_config(best, lj.this_guid) => found
                .reasons
                .push((spec.path.clone(), format!("label names device guid {} of this pool, which its config does not list", lj.this_guid))),
            Some(_) => {}
        }
    }
    Ok(())
}

/// Whether the label `lj` is a cache device's (its own leaf is in a cache vdev).
fn labels_a_cache_device(lj: &LabelJson) -> bool {
    lj.config.tops.iter().any(|t| t.role == Role::Cache && t.children.iter().any(|c| c.guid == lj.this_guid))
}

/// Every label holding the newest config names the pool alike: one that names it
/// otherwise (a crafted label, a disk relabelled elsewhere) would rename the pool at
/// import, depending on which device was read last.
fn check_one_name(devs: &[DevLabel], best: &PoolConfig) -> Result<()> {
    let newest = devs.iter().filter_map(|d| d.3.as_ref().map(|lj| (&d.0, lj))).filter(|(_, lj)| lj.config.txg == best.txg);
    let mut names: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (spec, lj) in newest {
        names.entry(lj.config.name.as_str()).or_default().push(spec.shown());
    }
    if names.len() <= 1 {
        return Ok(());
    }
    let shown: Vec<String> = names.iter().map(|(n, d)| format!("'{}' ({})", super::config::printable(n), d.join(", "))).collect();
    Err(Error::Corrupt(format!(
        "the labels of pool guid {} disagree on its name at config txg {}: {}; take out the devices that are not the pool's (or name the ones to use with -d)",
        best.guid,
        best.txg,
        shown.join(" vs ")
    )))
}

/// The live vdev tree for `cfg`, leaves matched to devices by guid (missing ones
/// UNAVAIL, with the reason found at their path, if any); also every uberblock found
/// and the count of damaged labels.
#[allow(clippy::type_complexity)]
fn build_tree(cfg: &mut PoolConfig, devs: &[DevLabel], reasons: &[PathReason], opener: &Opener, env: &Arc<dyn Env>, claims: &mut Claims) -> Result<(Vec<Arc<crate::vdev::mirror::TopVdev>>, Vec<Arc<Leaf>>, Vec<label::Uberblock>, usize)> {
    let (mut vdevs, mut leaves, mut ubs, mut bad_labels) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let pool_guid = cfg.guid;
    for t in cfg.tops.iter_mut() {
        let mut children = Vec::new();
        for lc in t.children.iter_mut() {
            let found = devs.iter().find(|d| d.3.as_ref().map(|lj| lj.this_guid) == Some(lc.guid));
            let leaf = match found {
                Some((spec, dev, scan, _)) => {
                    let dev = reopen_for_role(spec, dev, t.role, opener, claims)?;
                    ubs.extend(scan.uberblocks.iter().filter(|u| u.pool_guid == pool_guid).cloned());
                    bad_labels += scan.bad_labels;
                    lc.spec = spec.clone();
                    let l = Arc::new(Leaf::new(lc.guid, spec.clone(), dev, env));
                    if lc.offline {
                        l.set_initial_state(LeafState::Offline);
                    }
                    l
                }
                None => {
                    let l = Arc::new(Leaf::new(lc.guid, lc.spec.clone(), Arc::new(MissingDevice), env));
                    l.set_initial_state(LeafState::Unavail);
                    let mut e = crate::fm::Event::new(crate::fm::CLASS_STATECHANGE).pool(&cfg.name).vdev(lc.guid, &lc.spec.display());
                    e.pool_guid = pool_guid.get();
                    crate::fm::post(e.str("vdev_state", "UNAVAIL").str("vdev_laststate", "UNKNOWN"));
                    if let Some((_, why)) = reasons.iter().find(|(p, _)| *p == lc.spec.path) {
                        l.set_unavail_reason(why.clone());
                    }
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
        vdevs.push(open_top(t, children));
    }
    Ok((vdevs, leaves, ubs, bad_labels))
}

/// The uberblock import loads, its MOS and allocator, and the newest txg on disk.
struct Chosen {
    ub: label::Uberblock,
    mos: crate::dmu::Mos,
    ms: Metaslabs,
    /// A format 2 pool's open MOS.
    format2: Option<Arc<super::format2::Format2>>,
    newest_txg: Txg,
    plan: RewindPlan,
}

/// An uberblock written at or after the config's txg was written for the config's
/// device set: the sum of its leaf guids must match (a mismatch means the labels and
/// the uberblock describe different pools, or a device set that never existed).
/// Older uberblocks may predate the config change (attach, detach) and are not checked.
fn check_guid_sum(cfg: &PoolConfig, ub: &label::Uberblock) -> Result<()> {
    if ub.txg >= cfg.txg && ub.guid_sum != cfg.guid_sum() {
        return Err(Error::Corrupt(format!(
            "uberblock of txg {} was written for another set of devices than the configuration (txg {}) lists (guid sum {:#x}, expected {:#x})",
            ub.txg.get(),
            cfg.txg.get(),
            ub.guid_sum,
            cfg.guid_sum()
        )));
    }
    Ok(())
}

/// Load the MOS of `ub` into a fresh allocator, claiming the MOS's own blocks.
/// Allocator size of a log vdev with every device missing: large enough for any space
/// map a real device had.
const MISSING_LOG_VDEV_ASIZE: u64 = 1 << 56;

/// What loading a txg's MOS gives: its record, the allocator, and a format 2 pool's
/// open MOS.
type LoadedMos = (crate::dmu::Mos, Metaslabs, Option<Arc<super::format2::Format2>>);

fn load_mos(io: &PoolIo, ub: &label::Uberblock) -> Result<LoadedMos> {
    let mut ms = Metaslabs::new();
    for t in io.vdevs.read().iter() {
        if matches!(t.role, Role::Normal | Role::Log) {
            // a log vdev whose every device is missing (import -m) keeps the intent-log
            // blocks its space map lists: its size is unknown, and nothing is allocated
            // from it while no child is readable (zil::log_class_usable)
            let missing = t.role == Role::Log && t.asize() == 0;
            ms.add_vdev(t.id, t.role, if missing { MISSING_LOG_VDEV_ASIZE } else { t.asize() });
        }
    }
    if ub.is_format2() {
        // reads of what no sync of this import wrote: as of the txg after the loaded one
        let bio = dmu::pool_block_io::PoolBlockIo::new(io, ub.txg.next(), crate::vdev::IoClass::SyncRead);
        let (mos, f2) = super::format2::Format2::load(io, &bio, ub, &ms)?;
        return Ok((mos, ms, Some(Arc::new(f2))));
    }
    let blob = dmu::read_mos_blob(io, &ub.root, crate::vdev::IoClass::SyncRead)?;
    let mos = crate::dmu::Mos::decode(&blob, &mut ms)?;
    for bp in dmu::mos_blocks(io, &ub.root, crate::vdev::IoClass::SyncRead)? {
        for d in bp.copies() {
            ms.claim(d)?;
        }
    }
    Ok((mos, ms, None))
}

/// Every block the trees of `mos` reference reads back and verifies. Needed before
/// loading a txg older than the newest by more than the free deferral: its blocks
/// may have been freed and reused since.
fn verify_trees(io: &PoolIo, mos: &crate::dmu::Mos) -> Result<()> {
    for v in &mos.volumes {
        dmu::walk_all(io, &v.root, crate::vdev::IoClass::SyncRead, &mut |bp, level| {
            if level == 0 {
                io.read_block(bp, crate::vdev::IoClass::SyncRead, crate::arc::BufKind::Data, false)?;
            }
            Ok(())
        })
        .map_err(|e| Error::Corrupt(format!("volume {}: {e}", v.name)))?;
    }
    Ok(())
}

/// Offline leaves as of `txg`: the labels carry the newest config, but a leaf taken
/// offline after `txg` was synced (`offline_since` is the first txg it missed) holds
/// every block of `txg`, and after a rewind may be the only one that does (its
/// siblings' resilvers finished later, or the txg's MOS was written while they were
/// offline). It is opened online, as OpenZFS's rewind uses the config of the txg it
/// loads. A normal import loads a txg >= `offline_since` - 1 and keeps it offline.
fn offline_as_of(io: &PoolIo, cfg: &PoolConfig, txg: Txg) {
    for t in io.vdevs.read().iter() {
        for l in t.children().iter().filter(|l| matches!(l.state(), LeafState::Offline | LeafState::Online)) {
            let Some(lc) = cfg.tops.iter().flat_map(|t| t.children.iter()).find(|c| c.guid == l.guid) else { continue };
            if !lc.offline {
                continue;
            }
            let offline = lc.offline_since.is_zero() || lc.offline_since <= txg.next();
            if !offline && l.state() == LeafState::Offline {
                tracing::warn!(device = %l.spec.shown(), %txg, offline_since = %lc.offline_since, "rewind to a txg before this device went offline: opened online");
            }
            l.set_state(if offline { LeafState::Offline } else { LeafState::Online });
        }
    }
}

/// Most txgs a rewind may go back (the uberblock ring holds 32).
pub const REWIND_MAX_TXGS: u64 = 32;

/// Choose the uberblock to load: the newest valid one, always. If its MOS cannot be
/// read, import fails, unless `opts.rewind`: then the newest older one that loads
/// (and, beyond the free deferral, whose every block verifies) is chosen.
fn choose_uberblock(io: &PoolIo, cfg: &PoolConfig, mut ubs: Vec<label::Uberblock>, opts: &ImportOptions) -> Result<Chosen> {
    let name = cfg.name.as_str();
    let load = |ub: &label::Uberblock| {
        offline_as_of(io, cfg, ub.txg);
        check_guid_sum(cfg, ub).and_then(|_| load_mos(io, ub))
    };
    ubs.sort_by(|a, b| b.txg.cmp(&a.txg).then(b.timestamp_ns.cmp(&a.timestamp_ns)));
    ubs.dedup_by(|a, b| a == b);
    let Some(newest) = ubs.first().cloned() else {
        return Err(Error::Corrupt(format!("pool '{name}': no valid uberblock on any device")));
    };
    let plan_for = |ub: &label::Uberblock, reason: String| RewindPlan {
        pool: name.to_string(),
        newest_txg: newest.txg,
        newest_time_ns: newest.timestamp_ns,
        load_txg: ub.txg,
        load_time_ns: ub.timestamp_ns,
        dropped_seconds: newest.timestamp_ns.saturating_sub(ub.timestamp_ns) as f64 / 1e9,
        reason,
    };
    let newest_err = match load(&newest) {
        Ok((mos, ms, format2)) => return Ok(Chosen { plan: plan_for(&newest, String::new()), ub: newest.clone(), mos, ms, format2, newest_txg: newest.txg }),
        Err(e) => e,
    };
    let reason = format!("the object directory of txg {} cannot be read: {newest_err}", newest.txg);
    let mut last_err = String::new();
    for ub in ubs.iter().skip(1).filter(|u| u.txg < newest.txg && newest.txg.since(u.txg) <= REWIND_MAX_TXGS) {
        let r = load(ub).and_then(|(mos, ms, f2)| {
            if newest.txg.since(ub.txg) > crate::metaslab::TXG_DEFER_SIZE {
                verify_trees(io, &mos)?;
            }
            Ok((mos, ms, f2))
        });
        match r {
            Ok((mos, ms, format2)) => {
                let plan = plan_for(ub, reason.clone());
                if !opts.rewind {
                    return Err(Error::Corrupt(format!(
                        "pool '{name}': {reason}; import with -F to rewind to txg {} ({:.1} s of acknowledged writes would be lost; -F -n shows this without importing)",
                        plan.load_txg, plan.dropped_seconds
                    )));
                }
                // the errors met reading the txgs given up are not errors of the pool
                // now imported: their blocks are not in it
                io.clear_errors();
                return Ok(Chosen { ub: ub.clone(), mos, ms, format2, newest_txg: newest.txg, plan });
            }
            Err(e) => last_err = format!("; txg {}: {e}", ub.txg),
        }
    }
    Err(Error::Corrupt(format!("pool '{name}': {reason}, and no older txg within {REWIND_MAX_TXGS} loads{last_err}")))
}

/// Leaf states at import: DTLs and faults from the MOS, offline leaves missing every
/// txg since they went offline, and no leaf faulted that alone holds some txgs.
fn settle_leaf_states(io: &PoolIo, leaves: &[Arc<Leaf>], cfg: &PoolConfig, mos: &crate::dmu::Mos, judged: &super::stale::Judged) {
    apply_leaf_health(leaves, cfg, mos);
    // leaves that were offline missed every txg since
    for l in leaves {
        if l.state() == LeafState::Offline {
            if let Some(lc) = cfg.tops.iter().flat_map(|t| t.children.iter()).find(|c| c.guid == l.guid) {
                if !lc.offline_since.is_zero() {
                    let mut d = l.dtl();
                    d.push((lc.offline_since, Txg(u64::MAX / 2)));
                    l.set_dtl(d);
                }
            }
        }
    }
    // what the labels show a device missed, which the MOS cannot know (spa/stale.rs)
    judged.apply(leaves);
    keep_required_leaves(io);
    retry_faulted_caches(io);
}

/// A faulted cache device is tried again at every import, as OpenZFS reopens its
/// L2ARC devices: it holds only copies, each checked as it is restored and read, and
/// one that still fails is faulted again. An offline one stays offline (the admin's).
fn retry_faulted_caches(io: &crate::zio::PoolIo) {
    for t in io.vdevs.read().iter().filter(|t| t.role == crate::vdev::Role::Cache) {
        for l in t.children().iter().filter(|l| l.state() == LeafState::Faulted) {
            tracing::info!(device = %l.spec.shown(), "cache device was faulted: tried again");
            l.set_state(LeafState::Online);
        }
    }
}

/// Leaf health from the MOS: DTLs and faults. A leaf the MOS does not list joined
/// after that txg (attach, add) and is treated as missing every txg; an object
/// directory from before the health section keeps the labels' DTLs.
fn apply_leaf_health(leaves: &[Arc<Leaf>], cfg: &PoolConfig, mos: &crate::dmu::Mos) {
    for l in leaves {
        let label_dtl = cfg.tops.iter().flat_map(|t| t.children.iter()).find(|c| c.guid == l.guid).map(|c| c.dtl.clone()).unwrap_or_default();
        let Some(recs) = &mos.leaf_health else {
            l.set_dtl(label_dtl);
            continue;
        };
        match recs.iter().find(|r| r.guid == l.guid) {
            Some(r) => {
                let mut d = r.dtl.clone();
                d.extend(label_dtl);
                l.set_dtl(d);
                if r.faulted && l.state() == LeafState::Online {
                    l.set_state(LeafState::Faulted);
                }
            }
            None => l.set_dtl(vec![(Txg(1), mos.txg)]),
        }
    }
}

/// A leaf the MOS says is faulted, or the labels say is offline, comes back ONLINE when
/// it is the only one holding some txgs: else those blocks could not be read at all.
/// A faulted leaf's siblings may have been attached, offlined or faulted since; an
/// offline leaf can be needed only after a rewind (offline refuses the only holder),
/// to a txg whose MOS still says a sibling's resilver had not finished.
fn keep_required_leaves(io: &crate::zio::PoolIo) {
    for t in io.vdevs.read().iter() {
        for l in t.children().iter().filter(|l| matches!(l.state(), LeafState::Faulted | LeafState::Offline)) {
            let only_here = t.txgs_required(l);
            if !only_here.is_empty() {
                let was = if l.state() == LeafState::Faulted { "faulted" } else { "offline" };
                tracing::warn!(device = %l.spec.shown(), txgs = %crate::vdev::mirror::ranges_text(&only_here), "{was} device is the only one holding some txgs: brought online (degraded)");
                l.set_state(LeafState::Online);
            }
        }
    }
}

/// The loaded uberblock may be durable on one leaf only (the txg in flight at a power
/// cut, its uberblock kept by one disk's cache). Its state is served from now on, so put
/// it on every leaf: else detaching or losing that leaf rolls the pool back to a state
/// older than what clients have read (found by the power-cut test). Not after a rewind:
/// the skipped txgs' slots stay as they are.
fn spread_loaded_uberblock(inner: &PoolInner, ub: &label::Uberblock, newest_txg: Txg) {
    if ub.txg == newest_txg {
        if let Err(e) = inner.write_uberblocks(ub) {
            tracing::warn!("import: could not rewrite the uberblock: {e}");
        }
    }
}

/// The loaded txg is on the current devices only (a stale or diverged one must not get
/// its uberblock before a MOS records what it misses): sync a txg now, whose object
/// directory holds the DTLs and whose uberblock goes to every device, so losing or
/// detaching the current devices cannot roll the pool back to before what clients
/// have read (the power-cut test's check). A failed sync leaves the pool suspended,
/// and nothing that needs a durable config change goes on until it syncs.
fn record_judged_devices(pool: &Pool) {
    pool.inner.meta.lock().changed = true;
    if let Err(e) = pool.sync() {
        tracing::warn!(pool = %pool.inner.name, "import: could not record the stale or diverged devices yet: {e}");
    }
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
    fn kind(&self) -> DeviceKind {
        DeviceKind::Missing
    }
}

/// The devices of `cfg` that more than one device found claims to be: each guid with
/// the devices (in the order found).
fn claimed_twice<'a>(cfg: &PoolConfig, found: impl Iterator<Item = (Guid, &'a LeafSpec)>) -> Vec<(Guid, Vec<LeafSpec>)> {
    let mut by_guid: BTreeMap<Guid, Vec<LeafSpec>> = BTreeMap::new();
    for (g, spec) in found {
        by_guid.entry(g).or_default().push(spec.clone());
    }
    let in_cfg = |g: &Guid| cfg.tops.iter().any(|t| t.children.iter().any(|c| c.guid == *g));
    by_guid.into_iter().filter(|(g, specs)| specs.len() > 1 && in_cfg(g)).collect()
}

/// Refuse an import where two devices claim to be the same device of the pool: which
/// one is the pool's cannot be told (an older copy would be judged stale or diverged
/// by spa/stale.rs, but only once it is the only device with that guid).
fn check_one_device_per_guid(devs: &[DevLabel], cfg: &PoolConfig) -> Result<()> {
    let found = devs.iter().filter_map(|d| d.3.as_ref().map(|lj| (lj.this_guid, &d.0)));
    let Some((guid, specs)) = claimed_twice(cfg, found).into_iter().next() else {
        return Ok(());
    };
    let shown: Vec<String> = specs.iter().map(|s| s.shown()).collect();
    Err(Error::invalid(format!(
        "pool '{}': the devices {} {} claim to be its device with guid {guid} (a copied disk, or a crafted label); \
         take out the ones that are not the pool's (or name the devices to use with -d) and import again",
        cfg.name,
        shown.join(" and "),
        if shown.len() == 2 { "both" } else { "all" }
    )))
}

/// The vdevs of `cfg` with no device in `seen`, and the health an import would give
/// the pool (see [`ImportablePool::health`]). A missing cache or spare device changes
/// neither.
fn set_import_health(p: &mut ImportablePool, cfg: &PoolConfig, seen: &[Guid]) {
    use super::PoolHealth;
    let counted = |r: Role| matches!(r, Role::Normal | Role::Log);
    p.absent_vdevs = cfg
        .tops
        .iter()
        .filter(|t| counted(t.role) && !t.children.is_empty() && t.children.iter().all(|c| !seen.contains(&c.guid)))
        .map(|t| (t.role, if t.mirror { format!("mirror-{}", t.id) } else { t.children[0].spec.display() }))
        .collect();
    p.health = Some(if !p.absent_vdevs.is_empty() || !p.duplicates.is_empty() {
        PoolHealth::Unavail
    } else if p.missing.iter().any(|(r, _)| counted(*r)) {
        PoolHealth::Degraded
    } else {
        PoolHealth::Online
    });
}

/// Files (and block devices) in the search paths that carry a Zilla label, and those
/// whose sealed label config does not decode.
fn scan_search_paths(search: &[PathBuf]) -> Result<(Vec<(LeafSpec, LabelJson)>, Vec<UnusableLabel>)> {
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
    // one device reached by two paths (a symlink, a hard link) is listed once, by a
    // path that is not a symlink if it has one: else it would claim its own guid twice
    let identity = |f: &PathBuf| std::fs::metadata(f).ok().map(|md| crate::vdev::DeviceIdentity::from_metadata(&md));
    let is_link = |f: &PathBuf| std::fs::symlink_metadata(f).is_ok_and(|md| md.file_type().is_symlink());
    let by_plain_path: Vec<crate::vdev::DeviceIdentity> = files.iter().filter(|f| !is_link(f)).filter_map(identity).collect();
    let mut seen: Vec<crate::vdev::DeviceIdentity> = Vec::new();
    let (mut out, mut unusable) = (Vec::new(), Vec::new());
    for f in files {
        let Ok(md) = std::fs::metadata(&f) else { continue };
        use std::os::unix::fs::FileTypeExt;
        if !(md.is_file() || md.file_type().is_block_device()) || (md.is_file() && md.len() < label::MIN_DEVICE_SIZE) {
            continue;
        }
        let id = crate::vdev::DeviceIdentity::from_metadata(&md);
        if seen.contains(&id) || (is_link(&f) && by_plain_path.contains(&id)) {
            continue;
        }
        seen.push(id);
        let raw = LeafSpec { path: f.clone(), model: None };
        // read-only and unlocked: listing must work while a pool holds the leaf
        let Ok(dev) = crate::vdev::file::FileDevice::open_shared(&f) else { continue };
        let Ok(scan) = label::scan_labels(&dev) else { continue };
        let Some((_, j)) = scan.config else { continue };
        let lj = match serde_json::from_slice::<LabelJson>(&j) {
            Ok(lj) => lj,
            Err(e) => {
                let reason = format!("its label verifies but its pool config cannot be decoded: {}", super::config::printable_text(&e.to_string()));
                unusable.push(UnusableLabel { device: raw, reason });
                continue;
            }
        };
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
    Ok((out, unusable))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(txg: u64, guids: &[u64]) -> PoolConfig {
        let children = guids
            .iter()
            .map(|&g| LeafConfig { guid: Guid(g), spec: LeafSpec { path: format!("d{g}").into(), model: None }, offline: false, offline_since: Txg::ZERO, dtl: vec![], replacing: None })
            .collect();
        PoolConfig {
            name: "tank".into(),
            guid: Guid(1),
            version: super::super::POOL_VERSION,
            state: "active".into(),
            txg: Txg(txg),
            tops: vec![TopConfig { id: crate::VdevId(0), guid: Guid(9), role: Role::Normal, mirror: true, ashift: 12, children }],
            props: BTreeMap::new(),
            hostid: 0,
            hostname: String::new(),
            features_for_read: None,
            features_for_write: None,
        }
    }

    fn ub(txg: u64, guid_sum: u64) -> label::Uberblock {
        label::Uberblock { txg: Txg(txg), guid_sum, timestamp_ns: 0, pool_guid: Guid(1), root: BlockPointer::hole(), heartbeat: None }
    }

    /// Another pool's device costs a cache or spare slot only that slot; in a data or
    /// log slot, or at a path the config does not name, it refuses the import (another
    /// pool's cache device excepted: it names no data, wherever it stands).
    #[test]
    fn unknown_features_refuse_the_import_naming_them() {
        let own = |l: &[&str]| Some(l.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        let mut c = PoolConfig { version: 2, features_for_read: own(&["org.zilla:large_blocks"]), features_for_write: own(&["org.zilla:async_destroy"]), ..cfg(5, &[1, 2]) };
        check_features(&c).unwrap();
        check_features(&cfg(5, &[1, 2])).unwrap();
        c.features_for_read = own(&["com.example:dedup"]);
        let e = check_features(&c).unwrap_err().to_string();
        assert!(e.contains("pool 'tank'") && e.contains("com.example:dedup") && e.contains("cannot be imported"), "{e}");
        c.features_for_read = own(&[]);
        c.features_for_write = own(&["com.example:w1", "com.example:w2"]);
        let e = check_features(&c).unwrap_err().to_string();
        assert!(e.contains("features this build does not support for writing: com.example:w1, com.example:w2") && e.contains("read-only"), "{e}");
    }

    #[test]
    fn a_stranger_costs_a_cache_or_spare_slot_and_refuses_a_data_or_log_one() {
        let other = |cache| Stranger::OtherPool { name: "other".into(), guid: Guid(77), cache };
        let held = |label: Option<(String, Guid)>| Stranger::Held { label };
        let owned = held(Some(("other".into(), Guid(77))));
        for slot in [Some(Role::Cache), Some(Role::Spare)] {
            assert_eq!(stranger_verdict(slot, &other(false)), StrangerVerdict::Unavail("label belongs to pool 'other' (guid 77)".into()));
            assert_eq!(stranger_verdict(slot, &other(true)), StrangerVerdict::Unavail("label belongs to pool 'other' (guid 77)".into()));
            assert_eq!(stranger_verdict(slot, &owned), StrangerVerdict::Unavail("label belongs to pool 'other' (guid 77); the device is in use".into()));
            assert_eq!(stranger_verdict(slot, &held(None)), StrangerVerdict::Unavail("in use by another process, with no label of this pool".into()));
        }
        for slot in [Some(Role::Normal), Some(Role::Log), None] {
            assert_eq!(stranger_verdict(slot, &other(false)), StrangerVerdict::Refuse, "{slot:?}");
            assert_eq!(stranger_verdict(slot, &owned), StrangerVerdict::Refuse, "{slot:?}");
            assert_eq!(stranger_verdict(slot, &held(None)), StrangerVerdict::Refuse, "{slot:?}");
            assert!(matches!(stranger_verdict(slot, &other(true)), StrangerVerdict::Unavail(_)), "{slot:?}");
        }
        // a name from a label is shown printable
        let odd = Stranger::OtherPool { name: "a\u{1b}b".into(), guid: Guid(5), cache: false };
        assert!(!odd.reason().contains('\u{1b}'), "{}", odd.reason());
    }

    fn label_of(pool: &PoolConfig, this: u64, at: &str) -> DevLabel {
        let dev: Arc<dyn Device> = Arc::new(MissingDevice);
        let scan = label::LabelScan { config: None, valid_configs: 0, uberblocks: vec![], heartbeats: vec![], bad_labels: 0, rejected: vec![] };
        (LeafSpec { path: at.into(), model: None }, dev, scan, Some(LabelJson { this_guid: Guid(this), config: pool.clone() }))
    }

    /// The config comes from the pool most of the devices are data devices of, even when
    /// the one stranger among them carries a newer config; a tie goes to the pool whose
    /// devices sit at the paths their config gives.
    #[test]
    fn the_config_is_the_pool_most_devices_belong_to() {
        let tank = cfg(10, &[3, 4]);
        let mut other = cfg(500, &[8]);
        other.name = "other".into();
        other.guid = Guid(2);
        let devs = [label_of(&tank, 3, "d3"), label_of(&tank, 4, "d4"), label_of(&other, 8, "d4-renamed")];
        assert_eq!(choose_config(&devs).map(|c| c.name), Some("tank".to_string()));
        let tie = [label_of(&tank, 3, "d3"), label_of(&other, 8, "d3-cache")];
        assert_eq!(choose_config(&tie).map(|c| c.name), Some("tank".to_string()), "tie not broken by the paths");
        let tie = [label_of(&tank, 3, "o8"), label_of(&other, 8, "d8")];
        assert_eq!(choose_config(&tie).map(|c| c.name), Some("other".to_string()), "tie not broken by the paths");
    }

    /// An uberblock written at or after the config's txg must carry the config's guid
    /// sum; an older one may predate an attach or detach.
    #[test]
    fn guid_sum_is_checked_against_the_config_it_was_written_for() {
        let c = cfg(10, &[3, 4]);
        assert!(check_guid_sum(&c, &ub(12, 7)).is_ok());
        assert!(check_guid_sum(&c, &ub(12, 3)).is_err(), "uberblock for another device set accepted");
        assert!(check_guid_sum(&c, &ub(9, 3)).is_ok(), "an uberblock older than the config change refused");
    }
}
