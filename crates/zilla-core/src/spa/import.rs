//! spa import: creating a pool, finding importable pools, importing one.
//!
//! Theory of operation
//! -------------------
//! Create opens every leaf, refuses devices that belong to another pool (unless forced),
//! wipes stale labels, writes the config, and syncs the first txg: the pool exists on disk
//! exactly when that uberblock is durable. Import reads every label, takes the config with
//! the highest config txg, matches leaves by guid (missing ones become UNAVAIL), and loads
//! the MOS from the newest uberblock whose object directory reads back, claiming the
//! MOS blocks in a fresh allocator.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;

use super::config::{check_device_free, open_top, pool_props_with_defaults};
use super::{new_guid, validate_pool_name, CreateOptions, LabelJson, LeafConfig, MosMeta, Opener, Pool, PoolConfig, PoolInner, TopConfig, TopSpec, POOL_VERSION};
use super::default_opener;
use crate::dmu::{self, VolumeState};
use crate::zio::PoolIo;
use crate::env::Env;
use crate::metaslab::Metaslabs;
use crate::vdev::label;
use crate::vdev::mirror::{Leaf, LeafState};
use crate::vdev::{Device, LeafSpec, Role};
use crate::block::blkptr::BlockPointer;
use crate::{Error, Guid, Result, Txg};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ImportablePool {
    pub name: String,
    pub guid: Guid,
    pub state: String,
    pub leaves: Vec<LeafSpec>,
}

struct Opened {
    spec: LeafSpec,
    dev: Arc<dyn Device>,
}

fn ashift_of(dev: &dyn Device) -> u8 {
    let s = dev.logical_sector_size().max(dev.physical_sector_size()).max(512);
    (s.trailing_zeros() as u8).clamp(9, 16).max(12)
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
        let ms = Metaslabs::new();
        for (id, (t, opened)) in opened_tops.into_iter().enumerate() {
            let tguid = new_guid(&*env);
            let mut children = Vec::new();
            let mut leaf_objs = Vec::new();
            for o in opened {
                let g = new_guid(&*env);
                children.push(LeafConfig { guid: g, spec: o.spec.clone(), offline: false, offline_since: Txg::ZERO, dtl: vec![] });
                let leaf = Arc::new(Leaf::new(g, o.spec, o.dev));
                leaves.push(leaf.clone());
                leaf_objs.push(leaf);
            }
            let tc = TopConfig { id: id as u32, guid: tguid, role: t.role, mirror: t.mirror, ashift, children };
            let top = open_top(&tc, leaf_objs);
            if matches!(t.role, Role::Normal | Role::Log) {
                ms.add_vdev(top.id, top.role, top.asize());
            }
            vdevs.push(top);
            cfg_tops.push(tc);
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
        let meta = MosMeta { next_volume_id: 1, mos_root: BlockPointer::hole(), doomed: vec![], scan_state: String::new(), changed: true };
        let io = PoolIo::new(vdevs, ms);
        let inner = PoolInner::new(config, io, leaves, BTreeMap::new(), meta, crate::txg::TXG_INITIAL.prev(), opener, env);
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
        let mut out: BTreeMap<Guid, ImportablePool> = BTreeMap::new();
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
            vdevs.push(open_top(t, children));
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
                    tracing::warn!(pool = %cfg.name, txg = ub.txg.get(), "uberblock unusable, trying an older one: {e}");
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
        io.ms.replace_with(ms);
        io.refresh_space();
        // leaves that were offline missed every txg since
        for l in &leaves {
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
                    props: crate::props::PublishedProps::new(v.props.clone()),
                    committed: RwLock::new(v.root),
                    dirty: Default::default(),
                    destroyed: false.into(),
                }),
            );
        }
        if let Ok(p) = serde_json::from_str::<BTreeMap<String, String>>(&mos.pool_props) {
            cfg.props.extend(p);
        }
        let meta = MosMeta { next_volume_id: mos.next_volume_id, mos_root: ub.root, doomed: vec![], scan_state: mos.scan_state.clone(), changed: false };
        let inner = PoolInner::new(cfg, io, leaves, volumes, meta, ub.txg, opener, env);
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
                crate::scan::start_resilver(&pool.inner.scanner());
                break;
            }
        }
        Ok(pool)
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
