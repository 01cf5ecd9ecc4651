//! spa format2: a format 2 pool's MOS (pool_mos.rs) kept in step with the pool.
//!
//! Theory of operation
//! -------------------
//! Every txg the pool assembles its state (volume table, intent-log headers, scan
//! status, pool properties, leaf health, history) into the `Mos` record that format 1
//! encodes whole. A format 2 pool hands that record to [`Format2::sync_txg`] instead,
//! which compares it with what the MOS holds as of the last committed txg
//! ([`Applied`], in memory) and writes only what differs: a new volume becomes a
//! dataset, a destroyed one leaves the namespace and joins the destroy queue, a
//! rename is a child-map change, a volume's new tree is adopted by its objset. Then
//! the txg's space changes (the allocator's journal, net, and the frees of T − 2
//! released after T) go into the space maps, its deferred frees into its free list,
//! and the MOS is written in passes. What the attempt applied becomes [`Applied`] only
//! when the txg commits ([`Format2::sync_end`]); a failed attempt is undone whole
//! ([`Format2::sync_abort`]): the objsets, the maps, the journal's cut.
//!
//! A format 2 volume's id is its dataset's `objsetid` (never reused); the root
//! dataset has objsetid 0, so volume ids begin at 1 as in format 1 (an upgraded
//! pool's volumes keep theirs).
//!
//! **Bounds.** [`Applied`] holds one small record per volume (the pool's table
//! holds more); the released frees of one txg; the journal's cut of one attempt.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::block::blkptr::{BlockPointer, Dva};
use crate::dmu::object_tree::BlockIo;
use crate::dmu::{LeafHealth, Mos, TreeRoot, VolumeRecord};
use crate::metaslab::Metaslabs;
use crate::pool_mos::{PoolMos, TopSpace, SCAN_RECORD_WORDS};
use crate::scan::{Bookmark, ResilverTarget, ScanFunc, ScanState, ScanStatus};
use crate::spa_history::{History, HistoryRecord};
use crate::{Error, Guid, Result, Txg};

pub static ZILLA_POOL_CREATE_FORMAT: crate::kstat::Tunable = crate::kstat::Tunable::new(
    "zilla_pool_create_format",
    0,
    0,
    2,
    crate::kstat::Applies::Live,
    "the on-disk format `pool create` writes: 1, or 2 (objsets, datasets, space maps; docs/on-disk-format.md, Format 2); 0: the build's default",
);

/// The format a new pool gets by default.
pub const DEFAULT_CREATE_FORMAT: u64 = 1;

/// The format `pool create` writes: the tunable when set, else `ZILLA_POOL_CREATE_FORMAT`
/// in the environment (how a whole test run is switched), else the build's default.
pub fn create_format() -> u64 {
    match ZILLA_POOL_CREATE_FORMAT.get() {
        0 => std::env::var("ZILLA_POOL_CREATE_FORMAT").ok().and_then(|v| v.parse().ok()).filter(|v| (1..=2).contains(v)).unwrap_or(DEFAULT_CREATE_FORMAT),
        t => t,
    }
}

/// `pool create -o version=N`: the format asked for, taken out of the properties.
pub fn take_version_prop(props: &mut Vec<(String, String)>) -> Result<Option<u64>> {
    let Some(i) = props.iter().position(|(k, _)| k == "version") else { return Ok(None) };
    let (_, v) = props.remove(i);
    match v.trim() {
        "1" => Ok(Some(1)),
        "2" => Ok(Some(2)),
        other => Err(Error::invalid(format!("bad value '{}' for property 'version': this build writes format 1 or 2", crate::types::printable(other)))),
    }
}

/// The root dataset's `objsetid`.
pub const ROOT_OBJSETID: u64 = 0;

/// One volume as the MOS holds it (what a change is compared with).
#[derive(Debug, Clone, PartialEq, Eq)]
struct AppliedVolume {
    dir: u64,
    dataset: u64,
    name: String,
    volsize: u64,
    volblocksize: u32,
    props: BTreeMap<String, String>,
    root: TreeRoot,
    zil: [u8; 40],
}

/// What the MOS holds as of the last committed txg, for the fields a txg may change.
#[derive(Debug, Clone, Default)]
struct Applied {
    volumes: BTreeMap<u64, AppliedVolume>,
    pool_props: BTreeMap<String, String>,
    health: Vec<LeafHealth>,
    scan: Option<([u64; SCAN_RECORD_WORDS], Vec<u8>)>,
    /// History records ever appended (the in-memory ring's dropped + held).
    history_total: u64,
    /// The next volume id the MOS hands out.
    next_id: u64,
}

/// A format 2 pool's MOS and the sync state around it.
pub(crate) struct Format2 {
    pub mos: PoolMos,
    applied: Mutex<Applied>,
    /// The attempt in progress: what it applied, its journal cut, the datasets it
    /// destroyed.
    pending: Mutex<Option<(Applied, Vec<(Dva, bool)>, Vec<u64>)>>,
    /// T − 2's frees, out of the defer lists, until a sync records them and commits.
    released: Mutex<Vec<Dva>>,
    /// The destroy queue had work left after the last sync attempt.
    destroying: AtomicBool,
}

fn zil_bytes(h: Option<&crate::zil::ZilHeader>) -> [u8; 40] {
    let mut out = [0u8; 40];
    if let Some(h) = h {
        let mut b = Vec::with_capacity(40);
        h.encode(&mut b);
        out.copy_from_slice(&b);
    }
    out
}

fn pool_tops(io: &crate::zio::PoolIo) -> Vec<TopSpace> {
    use crate::vdev::Role;
    io.vdevs.read().iter().filter(|t| matches!(t.role, Role::Normal | Role::Log)).map(|t| TopSpace { id: t.id, guid: t.guid, area_bytes: t.asize() }).collect()
}

impl Format2 {
    /// A new pool's MOS in `txg` (and an upgraded one's: the first sync creates every
    /// volume of the table, in id order, each keeping its id).
    pub fn create(io: &dyn BlockIo, pool: &crate::zio::PoolIo, txg: Txg, creation_time_s: u64, guid: u64) -> Result<Format2> {
        let root = crate::dsl_dir::NewDataset { creation_time_s, objsetid: ROOT_OBJSETID, guid };
        let mos = PoolMos::create(io, txg, &pool_tops(pool), root)?;
        Ok(Format2 { mos, applied: Mutex::new(Applied::default()), pending: Mutex::new(None), released: Mutex::new(Vec::new()), destroying: AtomicBool::new(false) })
    }

    /// The frees of txgs up to `through`, out of the defer lists, for the next sync
    /// to record (kept until one commits).
    pub fn take_released(&self, ms: &Metaslabs, through: Txg) -> Vec<Dva> {
        let mut r = self.released.lock();
        r.extend(ms.take_released(through));
        r.clone()
    }

    /// Destroyed datasets still have blocks to free: the pool keeps syncing.
    pub fn destroying(&self) -> bool {
        self.destroying.load(Ordering::Relaxed)
    }

    pub fn sync_begin(&self, txg: Txg) {
        self.mos.sync_begin(txg);
        *self.pending.lock() = None;
    }

    /// The attempt committed: what it applied is what the MOS holds; the released
    /// frees it recorded are returned, to free in the allocator.
    pub fn sync_end(&self, txg: Txg) -> Vec<Dva> {
        self.mos.sync_end(txg);
        if let Some((applied, _, destroyed)) = self.pending.lock().take() {
            *self.applied.lock() = applied;
            destroyed.into_iter().for_each(|d| self.mos.forget_dataset(d));
        }
        std::mem::take(&mut *self.released.lock())
    }

    /// The attempt failed: the MOS and the maps are as they were, and the journal's
    /// cut goes back (`ms.undo_sync` has run or runs next).
    pub fn sync_abort(&self, txg: Txg, ms: &Metaslabs) {
        self.mos.sync_abort(txg);
        if let Some((_, cut, _)) = self.pending.lock().take() {
            ms.restore_journal(cut);
        }
    }

    /// Steps 3 and 4 of a format 2 txg: the MOS brought to `m`, its space and frees
    /// recorded, written in passes into `io`'s batch; the new MOS root. `old_root`, the
    /// MOS block this txg replaces, is freed.
    pub fn sync_txg(&self, io: &dyn BlockIo, pool: &crate::zio::PoolIo, txg: Txg, m: &Mos, old_root: &BlockPointer) -> Result<BlockPointer> {
        let upgrading = old_root.kind == crate::block::blkptr::KIND_MOS_INDEX;
        if upgrading {
            // the upgrade's txg: format 1's object directory goes whole
            for bp in crate::dmu::mos_blocks(pool, old_root, crate::vdev::IoClass::AsyncRead)? {
                io.free(&bp);
            }
        } else if !old_root.is_hole() {
            io.free(old_root);
        }
        let mut next = self.applied.lock().clone();
        let mut destroyed = Vec::new();
        *self.pending.lock() = Some((Applied::default(), Vec::new(), Vec::new()));
        self.add_vdevs(io, pool, txg)?;
        self.apply_volumes(io, txg, m, &mut next, &mut destroyed)?;
        if self.mos.step_destroys(io, txg)? > 0 {
            // the pool syncs until these frees are back (see spa/sync.rs, "Idle")
            pool.ms.await_release(txg);
        }
        self.destroying.store(self.mos.destroys_pending(io)?, Ordering::Relaxed);
        self.mos.sync_datasets(io, txg)?;
        self.apply_pool_state(io, txg, m, &mut next)?;
        let cut = pool.ms.take_journal();
        let released = self.released.lock().clone();
        *self.pending.lock() = Some((next, cut.clone(), destroyed));
        let net = crate::space_map::net_journal(&cut).map_err(|w| Error::Corrupt(format!("txg {txg}: the allocator's journal: {w}")))?;
        self.mos.record_space(io, txg, &net, &released)?;
        self.remove_vdevs(io, pool, txg)?;
        // Free list T % 3 replaces T − 3's: frees of T − 3 and before that a pin kept
        // deferred (a scan in progress) are carried into it, or a crash would forget them
        // (in the upgrade's txg every deferred free: no older list exists). Import drops
        // a carried entry the maps list as free since (released after it was carried).
        let mut frees = pool.ms.deferred_through(if upgrading { txg.prev() } else { txg.minus(3) });
        frees.extend(pool.ms.deferred_of(txg));
        self.mos.append_frees(io, txg, &frees)?;
        self.mos.sync(io, txg)?.ok_or_else(|| Error::Corrupt(format!("txg {txg}: the MOS had nothing to write")))
    }

    /// A vdev new to the MOS (added, or a log vdev added again under a removed one's
    /// id) gets a metaslab array.
    fn add_vdevs(&self, io: &dyn BlockIo, pool: &crate::zio::PoolIo, txg: Txg) -> Result<()> {
        let known = self.mos.vdev_guids();
        for t in pool_tops(pool).iter().filter(|t| !known.contains(&(t.id, t.guid))) {
            if known.iter().any(|k| k.0 == t.id) {
                self.mos.remove_vdev(io, txg, t.id)?;
            }
            self.mos.add_vdev(io, txg, t)?;
        }
        Ok(())
    }

    /// A vdev that left the pool loses its maps, once the txg's space changes (its last
    /// frees) are recorded in them.
    fn remove_vdevs(&self, io: &dyn BlockIo, pool: &crate::zio::PoolIo, txg: Txg) -> Result<()> {
        let tops = pool_tops(pool);
        for (id, guid) in self.mos.vdev_guids() {
            if !tops.iter().any(|t| t.id == id && t.guid == guid) {
                self.mos.remove_vdev(io, txg, id)?;
            }
        }
        Ok(())
    }

    fn apply_volumes(&self, io: &dyn BlockIo, txg: Txg, m: &Mos, next: &mut Applied, destroyed: &mut Vec<u64>) -> Result<()> {
        let root_dir = self.mos.dir.root_dataset;
        let ids: BTreeSet<u64> = m.volumes.iter().map(|v| v.id).collect();
        for (_, a) in next.volumes.iter().filter(|(id, _)| !ids.contains(id)) {
            self.mos.destroy_dataset(io, txg, a.dir, a.root.bp.fill.saturating_mul(a.volblocksize as u64))?;
            destroyed.push(a.dataset);
        }
        next.volumes.retain(|id, _| ids.contains(id));
        // in id order: a new volume's id is at least the next one to hand out
        let mut by_id: Vec<&VolumeRecord> = m.volumes.iter().collect();
        by_id.sort_by_key(|v| v.id);
        for v in by_id {
            let zil = zil_bytes(m.zil_headers.iter().find(|(id, _)| *id == v.id).map(|(_, h)| h));
            let a = match next.volumes.get_mut(&v.id) {
                Some(a) => a,
                None => {
                    let creation = v.props.local().get(super::dataset::CREATION_PROP).and_then(|c| c.parse().ok()).unwrap_or(0);
                    let guid = v.id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ txg.get();
                    let info = self.mos.create_volume_numbered(io, txg, root_dir, &v.name, (v.volsize, v.volblocksize), creation, guid, v.id)?;
                    let fresh = AppliedVolume { dir: info.dir, dataset: info.dataset, name: v.name.clone(), volsize: v.volsize, volblocksize: v.volblocksize, props: BTreeMap::new(), root: TreeRoot { bp: BlockPointer::hole(), nlevels: 1 }, zil: [0; 40] };
                    next.volumes.entry(v.id).or_insert(fresh)
                }
            };
            if a.name != v.name {
                self.mos.rename_child(io, txg, root_dir, &a.name, &v.name)?;
                a.name = v.name.clone();
            }
            if &a.props != v.props.local() {
                self.mos.set_local_props(io, txg, a.dir, v.props.local())?;
                a.props = v.props.local().clone();
            }
            if a.volsize != v.volsize {
                self.mos.set_volume_size(io, txg, a.dataset, v.volsize)?;
            }
            if a.root != v.root || a.volsize != v.volsize {
                let used = v.root.bp.fill.saturating_mul(v.volblocksize as u64);
                self.mos.set_volume_tree(io, txg, a.dataset, v.root.nlevels, v.root.bp, used, v.volsize / v.volblocksize as u64)?;
                (a.root, a.volsize) = (v.root, v.volsize);
            }
            if a.zil != zil {
                self.mos.set_zil_header(io, txg, a.dataset, zil)?;
                a.zil = zil;
            }
        }
        if m.next_volume_id > next.next_id {
            self.mos.raise_next_dataset_id(io, txg, m.next_volume_id)?;
            next.next_id = m.next_volume_id;
        }
        Ok(())
    }

    fn apply_pool_state(&self, io: &dyn BlockIo, txg: Txg, m: &Mos, next: &mut Applied) -> Result<()> {
        let props: BTreeMap<String, String> = serde_json::from_str(&m.pool_props).unwrap_or_default();
        if props != next.pool_props {
            self.mos.set_pool_props(io, txg, &props)?;
            next.pool_props = props;
        }
        let health = m.leaf_health.clone().unwrap_or_default();
        if health != next.health {
            let map = health.iter().map(|h| (h.guid, (h.faulted, h.dtl.clone()))).collect();
            self.mos.set_leaf_health(io, txg, &map)?;
            next.health = health;
        }
        let scan = if m.scan_state.is_empty() { None } else { Some(scan_record(&m.scan_state)?) };
        if scan != next.scan {
            if let Some((w, tail)) = &scan {
                self.mos.set_scan(io, txg, w, tail)?;
            }
            next.scan = scan;
        }
        let total = m.history.dropped + m.history.records().len() as u64;
        let new = total.saturating_sub(next.history_total).min(m.history.records().len() as u64) as usize;
        let recs = m.history.records();
        for (i, r) in recs[recs.len() - new..].iter().enumerate() {
            let pin = next.history_total == 0 && i == 0;
            self.mos.history(io).append(txg, &r.json(), pin)?;
        }
        next.history_total = total;
        Ok(())
    }

    /// Import: open the MOS of uberblock `ub`, build the allocator from its space maps
    /// (journaling from then on) and the pool's state as a `Mos` record.
    pub fn load(pool: &crate::zio::PoolIo, io: &dyn BlockIo, ub: &crate::vdev::label::Uberblock, ms: &Metaslabs) -> Result<(Mos, Format2)> {
        let mos = PoolMos::open(io, &ub.root, &pool_tops(pool))?;
        mos.load_allocator(io, &ub.root, ub.txg, ms)?;
        let mut applied = Applied::default();
        let mut volumes = Vec::new();
        let mut zil_headers = Vec::new();
        for v in mos.volumes(io)? {
            let props = mos.local_props(io, v.dir)?;
            let root = TreeRoot { bp: v.root, nlevels: v.nlevels };
            if v.zil_header != [0; 40] {
                let h = crate::zil::ZilHeader::decode(&mut crate::block::reader::Reader::new(&v.zil_header)).map_err(|e| Error::Corrupt(format!("volume {}: intent log header: {e}", v.path)))?;
                zil_headers.push((v.objsetid, h));
            }
            applied.volumes.insert(v.objsetid, AppliedVolume { dir: v.dir, dataset: v.dataset, name: v.path.clone(), volsize: v.volsize, volblocksize: v.volblocksize, props: props.clone(), root, zil: v.zil_header });
            volumes.push(VolumeRecord { id: v.objsetid, name: v.path, volsize: v.volsize, volblocksize: v.volblocksize, root, props: crate::props::PropSet::from_local(props), created_txg: v.creation_txg });
        }
        applied.pool_props = mos.pool_props(io)?;
        let health: Vec<LeafHealth> = mos.leaf_health(io)?.into_iter().map(|(guid, (faulted, dtl))| LeafHealth { guid, faulted, dtl }).collect();
        applied.health = health.clone();
        applied.scan = mos.scan(io)?;
        let scan_state = match &applied.scan {
            Some((w, tail)) => serde_json::to_string(&scan_status(w, tail)?).unwrap_or_default(),
            None => String::new(),
        };
        let history = load_history(&mos, io)?;
        applied.history_total = history.dropped + history.records().len() as u64;
        applied.next_id = mos.next_dataset_id(io)?;
        let m = Mos {
            txg: ub.txg,
            next_volume_id: applied.next_id,
            volumes,
            scan_state,
            pool_props: serde_json::to_string(&applied.pool_props).unwrap_or_default(),
            leaf_health: Some(health),
            zil_headers,
            history,
        };
        Ok((m, Format2 { mos, applied: Mutex::new(applied), pending: Mutex::new(None), released: Mutex::new(Vec::new()), destroying: AtomicBool::new(false) }))
    }
}

impl super::Pool {
    /// The pool's on-disk format: 1, or 2 (objsets, datasets, space maps).
    pub fn format(&self) -> u64 {
        if self.inner.meta.lock().format2.is_some() { 2 } else { 1 }
    }

    /// `zilla pool upgrade`: a format 1 pool becomes format 2 in one txg; false if it is
    /// format 2 already. The labels say version 2 first; the commit point is the first
    /// version 2 uberblock (a cut before it imports the pool as format 1, unchanged).
    /// Everything format 2 holds is new blocks; the volume trees are adopted as they
    /// are, and format 1's object directory is freed in that txg.
    pub fn upgrade(&self) -> Result<bool> {
        self.check_open()?;
        if self.format() == 2 {
            return Ok(false);
        }
        // destroyed volumes' trees are freed by format 1 first
        self.sync()?;
        {
            let inner = &self.inner;
            let _g = inner.sync_lock.lock();
            self.check_open()?;
            if inner.meta.lock().format2.is_some() {
                return Ok(false);
            }
            if !inner.meta.lock().doomed.is_empty() {
                return Err(Error::Busy("a destroyed volume's blocks are still being freed; try again".into()));
            }
            let before = inner.config.lock().clone();
            {
                let mut c = inner.config.lock();
                (c.version, c.features_for_read, c.features_for_write) = (2, Some(Vec::new()), Some(Vec::new()));
            }
            if let Err(e) = inner.write_config_labels("active") {
                *inner.config.lock() = before;
                return Err(e);
            }
            let txg = inner.txg.synced_txg().next();
            let bio = crate::dmu::pool_block_io::PoolBlockIo::new(&inner.io, txg, crate::vdev::IoClass::SyncRead);
            let creation_s = inner.env.unix_time_ns() / 1_000_000_000;
            let f2 = Format2::create(&bio, &inner.io, txg, creation_s, super::new_guid(&*inner.env).get())?;
            debug_assert!(bio.take_batch().is_empty(), "creating the MOS writes nothing before its sync");
            inner.io.ms.journal_everything_allocated();
            let mut m = inner.meta.lock();
            m.format2 = Some(std::sync::Arc::new(f2));
            m.changed = true;
        }
        self.sync()?;
        Ok(true)
    }
}

fn load_history(mos: &PoolMos, io: &dyn BlockIo) -> Result<History> {
    let mut h = History::default();
    for (i, json) in mos.history(io).records()?.iter().enumerate() {
        let rec: HistoryRecord = serde_json::from_slice(json).map_err(|e| Error::Corrupt(format!("pool history record {i}: {e}")))?;
        h.append(rec, i == 0 && mos.history(io).phys()?.pinned > 0);
    }
    h.dropped += mos.history(io).phys()?.dropped;
    Ok(h)
}

/// Most resilver targets and unrepaired devices a scan record's tail lists.
const SCAN_TAIL_MAX_LEAVES: usize = 4096;

/// A scan status (its JSON) as the scan record of §14.3: 20 words and the tail.
fn scan_record(json: &str) -> Result<([u64; SCAN_RECORD_WORDS], Vec<u8>)> {
    let s: ScanStatus = serde_json::from_str(json).map_err(|e| Error::Corrupt(format!("the scan state: {e}")))?;
    let func = match s.func {
        ScanFunc::None => 0,
        ScanFunc::Scrub => 1,
        ScanFunc::Resilver => 2,
    };
    let state = match s.state {
        ScanState::None => 0,
        ScanState::Scanning => 1,
        ScanState::Finished => 2,
        ScanState::Canceled => 3,
        ScanState::Paused => 4,
    };
    let (dataset, object) = if s.bookmark.phase == 0 { (0, 0) } else { (s.bookmark.volume_id, crate::pool_mos::VOLUME_DATA_OBJECT) };
    let w = [
        func, state, s.start_time_s, s.end_time_s, s.examined_bytes, s.to_examine_bytes, s.issued_bytes, s.skipped_bytes,
        s.pass_start_time_s, s.pass_examined_bytes, s.pass_issued_bytes, s.pause_time_s, s.repaired_bytes, s.errors,
        s.start_txg.get(), s.min_txg.get(), dataset, object, 0, s.bookmark.blkid.0,
    ];
    let mut tail = vec![s.unrepaired_all as u8];
    tail.extend_from_slice(&(s.unrepaired_devices.len().min(SCAN_TAIL_MAX_LEAVES) as u32).to_le_bytes());
    s.unrepaired_devices.iter().take(SCAN_TAIL_MAX_LEAVES).for_each(|g| tail.extend_from_slice(&g.get().to_le_bytes()));
    tail.extend_from_slice(&(s.targets.len().min(SCAN_TAIL_MAX_LEAVES) as u32).to_le_bytes());
    for t in s.targets.iter().take(SCAN_TAIL_MAX_LEAVES) {
        tail.extend_from_slice(&t.guid.get().to_le_bytes());
        tail.extend_from_slice(&crate::pool_mos::encode_leaf_health(false, &t.dtl[..t.dtl.len().min(crate::pool_mos::LEAF_DTL_MAX_RANGES)]));
        tail.extend_from_slice(&crate::pool_mos::encode_leaf_health(false, &t.lost[..t.lost.len().min(crate::pool_mos::LEAF_DTL_MAX_RANGES)]));
    }
    Ok((w, tail))
}

fn ranges(r: &mut crate::block::reader::Reader<'_>) -> Result<Vec<(Txg, Txg)>> {
    let head = r.bytes(2)?;
    let n = head[1] as usize;
    let mut b = head.to_vec();
    b.extend_from_slice(r.bytes(16 * n.min(crate::pool_mos::LEAF_DTL_MAX_RANGES))?);
    crate::pool_mos::decode_leaf_health(&b).map(|(_, d)| d).map_err(|w| Error::Corrupt(format!("scan record tail: {w}")))
}

/// The scan record of §14.3 as a scan status; every limit checked.
fn scan_status(w: &[u64; SCAN_RECORD_WORDS], tail: &[u8]) -> Result<ScanStatus> {
    crate::pool_mos::check_scan_record(w).map_err(Error::Corrupt)?;
    let func = [ScanFunc::None, ScanFunc::Scrub, ScanFunc::Resilver][w[0] as usize];
    let state = [ScanState::None, ScanState::Scanning, ScanState::Finished, ScanState::Canceled, ScanState::Paused][w[1] as usize];
    let bookmark = match w[17] {
        0 => Bookmark { phase: 0, volume_id: 0, blkid: crate::BlockId(0) },
        1 => Bookmark { phase: 1, volume_id: w[16], blkid: crate::BlockId(w[19]) },
        o => return Err(Error::Corrupt(format!("scan record: bookmark object {o}"))),
    };
    let mut r = crate::block::reader::Reader::new(tail);
    let unrepaired_all = match r.u8()? {
        0 => false,
        1 => true,
        f => return Err(Error::Corrupt(format!("scan record tail: flag {f}"))),
    };
    let n = r.u32()? as usize;
    if n > SCAN_TAIL_MAX_LEAVES {
        return Err(Error::Corrupt(format!("scan record tail: {n} unrepaired devices")));
    }
    let unrepaired_devices = (0..n).map(|_| r.u64().map(Guid)).collect::<Result<Vec<_>>>()?;
    let m = r.u32()? as usize;
    if m > SCAN_TAIL_MAX_LEAVES {
        return Err(Error::Corrupt(format!("scan record tail: {m} resilver targets")));
    }
    let mut targets = Vec::with_capacity(m);
    for _ in 0..m {
        let guid = Guid(r.u64()?);
        targets.push(ResilverTarget { guid, dtl: ranges(&mut r)?, lost: ranges(&mut r)? });
    }
    if r.remaining() != 0 {
        return Err(Error::Corrupt(format!("scan record tail: {} bytes after its last field", r.remaining())));
    }
    Ok(ScanStatus {
        func, state, start_time_s: w[2], end_time_s: w[3], examined_bytes: w[4], to_examine_bytes: w[5], issued_bytes: w[6], skipped_bytes: w[7],
        pass_start_time_s: w[8], pass_examined_bytes: w[9], pass_issued_bytes: w[10], pause_time_s: w[11], repaired_bytes: w[12], errors: w[13],
        start_txg: Txg(w[14]), min_txg: Txg(w[15]), bookmark, unrepaired_devices, unrepaired_all, targets, ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_status_round_trips_through_the_scan_record() {
        let s = ScanStatus {
            func: ScanFunc::Resilver,
            state: ScanState::Paused,
            start_time_s: 10,
            examined_bytes: 1 << 30,
            start_txg: Txg(77),
            min_txg: Txg(5),
            bookmark: Bookmark { phase: 1, volume_id: 9, blkid: crate::BlockId(12345) },
            unrepaired_devices: vec![Guid(3)],
            unrepaired_all: true,
            targets: vec![ResilverTarget { guid: Guid(4), dtl: vec![(Txg(2), Txg(9))], lost: vec![] }],
            ..Default::default()
        };
        let json = serde_json::to_string(&s).unwrap();
        let (w, tail) = scan_record(&json).unwrap();
        let back = scan_status(&w, &tail).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        // a tail cut or padded is refused, never read past
        for cut in 0..tail.len() {
            assert!(scan_status(&w, &tail[..cut]).is_err(), "tail cut to {cut}");
        }
        let mut long = tail.clone();
        long.push(0);
        assert!(scan_status(&w, &long).is_err());
        let mut obj = w;
        obj[17] = 7;
        assert!(scan_status(&obj, &tail).is_err());
    }
}
