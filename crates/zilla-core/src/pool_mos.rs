//! pool_mos: a format 2 pool's MOS — the object directory, the pool-wide objects it
//! names, and its sync in passes.
//!
//! Theory of operation
//! -------------------
//! The MOS is an objset (docs/on-disk-format.md §14) whose object 1, the object
//! directory, names everything else: the root dataset, the feature objects, the
//! metaslab arrays (one per top-level vdev, by guid), the three free lists, the pool
//! properties and leaf health ZAPs. [`PoolMos`] owns the open MOS objset and, per
//! top-level vdev, what its space maps say (the allocated segments of each metaslab,
//! loaded at open and kept in step with every append), so a txg's space accounting is
//! checked against the maps before anything is written and a condense needs no read.
//!
//! **A txg's sync** (docs/design.md, "The format 2 sync"): the caller records the
//! txg's space changes ([`PoolMos::record_space`]: the allocator journal's cut, net,
//! plus the frees of T − 2 that are released after T) and its deferred frees so far
//! ([`PoolMos::append_frees`]), then [`PoolMos::sync`] writes the MOS in passes: every
//! block a pass replaces that an older tree references is appended to free list
//! `T % 3`, which dirties the MOS again; a pass that frees nothing older ends it.
//! Blocks born in T that a later pass replaces are freed at once by the block seam.
//!
//! **A failed attempt** is undone whole ([`PoolMos::sync_abort`]): the objset's undo
//! (objset.rs) and the metaslab segments the attempt changed.
//!
//! **Bounds.** [`MAX_SYNC_PASSES`] passes; in memory, the segments of every metaslab
//! (what the allocator holds anyway) and the undo of one attempt.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::block::blkptr::{BlockPointer, Dva};
use crate::dmu::dnode::{ObjectSpec, ObjectType};
use crate::dmu::object_tree::{BlockIo, BlockSpec, Tree};
use crate::dmu::objset::{Objset, ObjsetType};
use crate::dmu::zap_store::ObjectInTxg;
use crate::dsl_dir::{DslTree, NewDataset};
use crate::free_list::FreeList;
use crate::space_map::{MetaslabArray, MetaslabArrayPhys, Segments, SpaceMap, TxgDelta};
use crate::vdev::abd::AlignedBuf;
use crate::zfeature::{FeatureObjects, Features};
use crate::{zap, Error, Guid, Result, Txg, VdevId};

/// The object directory's object number.
pub const DIRECTORY_OBJECT: u64 = 1;
/// Most passes of one txg's MOS sync.
pub const MAX_SYNC_PASSES: usize = 8;

const ZAP_BLOCK_BYTES: u32 = 512;

/// A top-level vdev whose space the MOS accounts: its id, guid and data area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopSpace {
    pub id: VdevId,
    pub guid: Guid,
    pub area_bytes: u64,
}

/// The objects the directory names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Directory {
    pub root_dataset: u64,
    pub features: FeatureObjects,
    pub metaslab_arrays: u64,
    pub free_lists: [u64; 3],
    pub free_list_array: u64,
    pub pool_props: u64,
    pub leaf_health: u64,
    pub history: u64,
}

/// A vdev's space maps as the MOS holds them.
#[derive(Debug, Clone)]
struct VdevMaps {
    guid: Guid,
    area_bytes: u64,
    array: u64,
    layout: MetaslabArrayPhys,
    /// Space map object per metaslab (0: none yet).
    maps: Vec<u64>,
    /// What each metaslab's map replays to.
    segments: Vec<Segments>,
}

/// What a sync attempt changed outside the objset: metaslabs as they were.
#[derive(Default)]
struct SpaceUndo {
    metaslabs: HashMap<(VdevId, usize), (u64, Segments)>,
    /// The accounted vdevs before the attempt added or removed one.
    vdevs: Option<BTreeMap<VdevId, VdevMaps>>,
    /// Dataset objsets the attempt syncs (each with its own undo).
    datasets: Vec<Arc<Objset>>,
}

/// An open format 2 MOS.
pub struct PoolMos {
    pub os: Objset,
    pub dir: Directory,
    vdevs: Mutex<BTreeMap<VdevId, VdevMaps>>,
    undo: Mutex<Option<SpaceUndo>>,
    /// The open objsets of datasets, by dataset object. Bounded by the pool's datasets.
    datasets: Mutex<HashMap<u64, Arc<Objset>>>,
}

fn zap_salt(object: u64, txg: Txg) -> u64 {
    (object.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ txg.get().rotate_left(29)) | 1
}

fn guid_name(g: Guid) -> String {
    format!("{:016x}", g.get())
}

fn new_zap(os: &Objset, io: &dyn BlockIo, txg: Txg, ty: ObjectType) -> Result<u64> {
    let o = os.allocate(io, txg, &ObjectSpec::metadata(ty, ZAP_BLOCK_BYTES))?;
    zap::create(&mut ObjectInTxg { objset: os, io, txg, object: o }, zap_salt(o, txg))?;
    Ok(o)
}

fn put(os: &Objset, io: &dyn BlockIo, txg: Txg, zap_object: u64, name: &str, value: u64) -> Result<()> {
    zap::update(&mut ObjectInTxg { objset: os, io, txg, object: zap_object }, name.as_bytes(), &value.to_le_bytes())
}

fn get(os: &Objset, io: &dyn BlockIo, zap_object: u64, name: &str) -> Result<u64> {
    zap::lookup_u64(&ObjectInTxg { objset: os, io, txg: Txg::ZERO, object: zap_object }, name.as_bytes())?
        .ok_or_else(|| Error::Corrupt(format!("MOS object {zap_object}: no entry '{name}'")))
}

impl PoolMos {
    /// The MOS of a new pool in `txg`: every object of §14 that is always present.
    pub fn create(io: &dyn BlockIo, txg: Txg, tops: &[TopSpace], root: NewDataset) -> Result<PoolMos> {
        let os = Objset::create(ObjsetType::Mos, txg);
        let d = os.allocate(io, txg, &ObjectSpec::metadata(ObjectType::ObjectDirectory, ZAP_BLOCK_BYTES))?;
        assert_eq!(d, DIRECTORY_OBJECT, "the object directory is the MOS's first object");
        zap::create(&mut ObjectInTxg { objset: &os, io, txg, object: d }, zap_salt(d, txg))?;
        let (root_dir, _) = DslTree { mos: &os, io }.create_root(txg, &root)?;
        let features = Features::create(&os, io, txg)?.objects;
        let metaslab_arrays = new_zap(&os, io, txg, ObjectType::ObjectDirectory)?;
        let mut free_lists = [0u64; 3];
        for f in &mut free_lists {
            *f = FreeList::create(&os, io, txg)?.object;
        }
        let free_list_array = os.allocate(io, txg, &ObjectSpec::metadata(ObjectType::U64Array, 4096))?;
        let mut block = vec![0u8; 4096];
        for (i, f) in free_lists.iter().enumerate() {
            block[i * 8..i * 8 + 8].copy_from_slice(&f.to_le_bytes());
        }
        os.write_block(io, txg, free_list_array, 0, Some(Arc::new(AlignedBuf::from(&block[..]))))?;
        let pool_bytes = tops.iter().map(|t| t.area_bytes).sum();
        let history = history::HistoryRing::create(&os, io, txg, history::history_ring_bytes(pool_bytes))?.object;
        let (pool_props, leaf_health) = (new_zap(&os, io, txg, ObjectType::PoolProps)?, new_zap(&os, io, txg, ObjectType::LeafHealth)?);
        let dir = Directory { root_dataset: root_dir, features, metaslab_arrays, free_lists, free_list_array, pool_props, leaf_health, history };
        let mos = PoolMos { os, dir, vdevs: Mutex::new(BTreeMap::new()), undo: Mutex::new(None), datasets: Mutex::new(HashMap::new()) };
        mos.write_directory(io, txg, root.objsetid + 1)?;
        for t in tops {
            mos.add_vdev(io, txg, t)?;
        }
        Ok(mos)
    }

    fn write_directory(&self, io: &dyn BlockIo, txg: Txg, next_dataset_id: u64) -> Result<()> {
        let d = &self.dir;
        let entries = [
            ("root_dataset", d.root_dataset),
            ("features_for_read", d.features.for_read),
            ("features_for_write", d.features.for_write),
            ("feature_enabled_txg", d.features.enabled_txg),
            ("metaslab_arrays", d.metaslab_arrays),
            ("free_lists", d.free_list_array),
            ("pool_props", d.pool_props),
            ("leaf_health", d.leaf_health),
            ("history", d.history),
            ("next_dataset_id", next_dataset_id),
        ];
        for (name, value) in entries {
            put(&self.os, io, txg, DIRECTORY_OBJECT, name, value)?;
        }
        Ok(())
    }

    /// A new top-level vdev's metaslab array, in `txg`.
    pub fn add_vdev(&self, io: &dyn BlockIo, txg: Txg, t: &TopSpace) -> Result<()> {
        let array = MetaslabArray::create(&self.os, io, txg, t.area_bytes)?;
        put(&self.os, io, txg, self.dir.metaslab_arrays, &guid_name(t.guid), array.object)?;
        let layout = array.phys(t.area_bytes)?;
        let n = layout.count as usize;
        self.snapshot_vdevs();
        self.vdevs.lock().insert(t.id, VdevMaps { guid: t.guid, area_bytes: t.area_bytes, array: array.object, layout, maps: vec![0; n], segments: vec![Segments::default(); n] });
        Ok(())
    }

    /// Open the MOS `bp` points at, loading every space map of `tops`.
    pub fn open(io: &dyn BlockIo, bp: &BlockPointer, tops: &[TopSpace]) -> Result<PoolMos> {
        let os = Objset::open(io, bp)?;
        let g = |name: &str| get(&os, io, DIRECTORY_OBJECT, name);
        let free_list_array = g("free_lists")?;
        let block = os.read_block(io, free_list_array, 0)?.ok_or_else(|| Error::Corrupt("MOS: the free list array is empty".into()))?;
        let fl = |i: usize| u64::from_le_bytes(block[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let features = FeatureObjects { for_read: g("features_for_read")?, for_write: g("features_for_write")?, enabled_txg: g("feature_enabled_txg")? };
        let dir = Directory {
            root_dataset: g("root_dataset")?,
            features,
            metaslab_arrays: g("metaslab_arrays")?,
            free_lists: [fl(0), fl(1), fl(2)],
            free_list_array,
            pool_props: g("pool_props")?,
            leaf_health: g("leaf_health")?,
            history: g("history")?,
        };
        let mos = PoolMos { os, dir, vdevs: Mutex::new(BTreeMap::new()), undo: Mutex::new(None), datasets: Mutex::new(HashMap::new()) };
        for t in tops {
            // a vdev added after this txg (its config reached the labels first) has no
            // array yet, and nothing allocated on it: the next sync gives it one
            let z = ObjectInTxg { objset: &mos.os, io, txg: Txg::ZERO, object: mos.dir.metaslab_arrays };
            if zap::lookup_u64(&z, guid_name(t.guid).as_bytes())?.is_none() {
                continue;
            }
            let maps = mos.load_vdev(io, t).map_err(|e| Error::Corrupt(format!("top-level vdev {} (guid {}): {e}", t.id, guid_name(t.guid))))?;
            mos.vdevs.lock().insert(t.id, maps);
        }
        Ok(mos)
    }

    fn load_vdev(&self, io: &dyn BlockIo, t: &TopSpace) -> Result<VdevMaps> {
        let array = MetaslabArray { mos: &self.os, io, object: get(&self.os, io, self.dir.metaslab_arrays, &guid_name(t.guid))? };
        let layout = array.phys(t.area_bytes)?;
        // a log vdev with every device missing: its area as its array records it
        let area_bytes = if t.area_bytes == 0 { layout.count << layout.ms_shift } else { t.area_bytes };
        let maps = array.entries(layout.count)?;
        let mut segments = Vec::with_capacity(maps.len());
        for (i, &m) in maps.iter().enumerate() {
            let ms = layout.range(i as u64, area_bytes);
            segments.push(if m == 0 { Segments::default() } else { SpaceMap { mos: &self.os, io, object: m }.load(ms).map_err(|e| Error::Corrupt(format!("metaslab {i}: {e}")))? });
        }
        Ok(VdevMaps { guid: t.guid, area_bytes, array: array.object, layout, maps, segments })
    }

    /// The top-level vdevs this MOS accounts: (id, guid).
    pub fn vdev_guids(&self) -> Vec<(VdevId, Guid)> {
        self.vdevs.lock().iter().map(|(id, v)| (*id, v.guid)).collect()
    }

    /// Before the attempt's first change to which vdevs are accounted: the map as it
    /// was, for `sync_abort` (a rare, whole copy).
    fn snapshot_vdevs(&self) {
        let mut undo = self.undo.lock();
        if let Some(u) = undo.as_mut().filter(|u| u.vdevs.is_none()) {
            u.vdevs = Some(self.vdevs.lock().clone());
        }
    }

    /// Top-level vdev `id` left the pool in `txg`: its metaslab array and space maps
    /// are freed. Its maps must hold nothing allocated (removal evacuates it first).
    pub fn remove_vdev(&self, io: &dyn BlockIo, txg: Txg, id: VdevId) -> Result<()> {
        let Some(v) = self.vdevs.lock().get(&id).cloned() else { return Ok(()) };
        if let Some(i) = v.segments.iter().position(|s| s.iter().next().is_some()) {
            let left: Vec<(u64, u64)> = v.segments[i].iter().take(4).collect();
            return Err(Error::Busy(format!("vdev {id} metaslab {i}: its space map still lists allocated space ({left:x?} ...)")));
        }
        zap::remove(&mut ObjectInTxg { objset: &self.os, io, txg, object: self.dir.metaslab_arrays }, guid_name(v.guid).as_bytes())?;
        for m in v.maps.iter().copied().filter(|m| *m != 0).chain([v.array]) {
            self.os.free_object(io, txg, m)?;
        }
        self.snapshot_vdevs();
        self.vdevs.lock().remove(&id);
        Ok(())
    }

    /// The allocated segments of vdev `id` as its space maps say (for the allocator).
    pub fn allocated(&self, id: VdevId) -> Vec<(u64, u64)> {
        self.vdevs.lock().get(&id).map_or_else(Vec::new, |v| v.segments.iter().flat_map(|s| s.iter()).collect())
    }
}

impl PoolMos {
    /// Record `txg`'s space changes: `net` (the journal's cut, per vdev) and `released`
    /// (the frees of T − 2, freed in the maps now). Checked against the maps first; a
    /// change that does not apply is an engine bug, reported before anything is written.
    pub fn record_space(&self, io: &dyn BlockIo, txg: Txg, net: &BTreeMap<VdevId, TxgDelta>, released: &[Dva]) -> Result<()> {
        let mut per: BTreeMap<(VdevId, usize), TxgDelta> = BTreeMap::new();
        let mut vdevs = self.vdevs.lock();
        let split = |v: &VdevMaps, vdev: VdevId, at: u64, len: u64, out: &mut BTreeMap<(VdevId, usize), TxgDelta>, alloc: bool| {
            for (i, s, l) in v.layout.split(at, len) {
                let d = out.entry((vdev, i as usize)).or_default();
                if alloc { d.allocs.push((s, l)) } else { d.frees.push((s, l)) }
            }
        };
        for (vdev, delta) in net {
            let v = vdevs.get(vdev).ok_or_else(|| Error::Corrupt(format!("space change on vdev {vdev}, which the MOS does not account")))?;
            delta.allocs.iter().for_each(|(a, l)| split(v, *vdev, *a, *l, &mut per, true));
            delta.frees.iter().for_each(|(a, l)| split(v, *vdev, *a, *l, &mut per, false));
        }
        for d in released {
            let v = vdevs.get(&d.vdev).ok_or_else(|| Error::Corrupt(format!("a released free on vdev {}, which the MOS does not account", d.vdev)))?;
            split(v, d.vdev, d.offset, d.asize as u64, &mut per, false);
        }
        for ((vdev, i), mut delta) in per {
            delta.allocs.sort_unstable();
            delta.frees.sort_unstable();
            let v = vdevs.get_mut(&vdev).expect("checked above");
            self.record_metaslab(io, txg, v, vdev, i, &delta)?;
        }
        Ok(())
    }

    fn record_metaslab(&self, io: &dyn BlockIo, txg: Txg, v: &mut VdevMaps, vdev: VdevId, i: usize, delta: &TxgDelta) -> Result<()> {
        let bad = |w: String| Error::Corrupt(format!("vdev {vdev} metaslab {i}: txg {txg}'s space change does not apply to its map: {w}"));
        let mut after = v.segments[i].clone();
        delta.allocs.iter().try_for_each(|(a, l)| after.add(*a, *l)).map_err(bad)?;
        delta.frees.iter().try_for_each(|(a, l)| after.remove(*a, *l)).map_err(bad)?;
        if let Some(u) = self.undo.lock().as_mut() {
            u.metaslabs.entry((vdev, i)).or_insert_with(|| (v.maps[i], v.segments[i].clone()));
        }
        if v.maps[i] == 0 {
            v.maps[i] = SpaceMap::create(&self.os, io, txg)?.object;
            MetaslabArray { mos: &self.os, io, object: v.array }.set(txg, i as u64, v.maps[i])?;
        }
        let ms = v.layout.range(i as u64, v.area_bytes);
        SpaceMap { mos: &self.os, io, object: v.maps[i] }.sync_txg(txg, delta, &after, ms)?;
        v.segments[i] = after;
        Ok(())
    }

    /// Append `frees` (deferred frees of `txg`) to free list `txg % 3`.
    pub fn append_frees(&self, io: &dyn BlockIo, txg: Txg, frees: &[Dva]) -> Result<()> {
        let list = FreeList { mos: &self.os, io, object: self.dir.free_lists[(txg.get() % 3) as usize] };
        list.append(txg, frees)
    }

    /// The deferred frees the lists hold for txgs `txgs` (import: the newest two).
    pub fn deferred_frees(&self, io: &dyn BlockIo, txgs: &[Txg], check: &mut dyn FnMut(&Dva) -> std::result::Result<(), String>) -> Result<Vec<(Txg, Vec<Dva>)>> {
        let mut out = Vec::new();
        for t in txgs {
            let list = FreeList { mos: &self.os, io, object: self.dir.free_lists[(t.get() % 3) as usize] };
            let (lt, dvas) = list.load(check)?;
            if lt == *t && !dvas.is_empty() {
                out.push((lt, dvas));
            }
        }
        Ok(out)
    }

    /// A sync attempt of `txg` begins (see [`PoolMos::sync_abort`]).
    pub fn sync_begin(&self, txg: Txg) {
        self.os.sync_begin(txg);
        // every open one: the volumes' data pass adopts trees within the attempt
        let datasets: Vec<Arc<Objset>> = self.datasets.lock().values().cloned().collect();
        datasets.iter().for_each(|o| o.sync_begin(txg));
        *self.undo.lock() = Some(SpaceUndo { datasets, ..Default::default() });
    }

    pub fn sync_end(&self, txg: Txg) {
        self.os.sync_end(txg);
        if let Some(u) = self.undo.lock().take() {
            u.datasets.iter().for_each(|o| o.sync_end(txg));
        }
    }

    /// The attempt failed: the objset and the metaslabs it changed are as they were.
    pub fn sync_abort(&self, txg: Txg) {
        self.os.sync_abort(txg);
        let undo = self.undo.lock().take().unwrap_or_default();
        undo.datasets.iter().for_each(|o| o.sync_abort(txg));
        let mut vdevs = self.vdevs.lock();
        for ((vdev, i), (map, segments)) in undo.metaslabs {
            if let Some(v) = vdevs.get_mut(&vdev) {
                (v.maps[i], v.segments[i]) = (map, segments);
            }
        }
        if let Some(before) = undo.vdevs {
            *vdevs = before;
        }
    }

    /// Write the MOS of `txg` in passes; its new root. `io` frees a block born in `txg`
    /// at once and defers an older one.
    pub fn sync(&self, io: &dyn BlockIo, txg: Txg) -> Result<Option<BlockPointer>> {
        let mut root: Option<BlockPointer> = None;
        for _ in 0..MAX_SYNC_PASSES {
            let pass = PassIo { inner: io, older_frees: Mutex::new(Vec::new()) };
            if let Some(s) = self.os.sync(&pass, txg)? {
                if let Some(prev) = root.replace(s.bp) {
                    io.free(&prev);
                }
            }
            let frees = std::mem::take(&mut *pass.older_frees.lock());
            if frees.is_empty() {
                return Ok(root);
            }
            self.append_frees(io, txg, &frees)?;
        }
        Err(Error::Corrupt(format!("the MOS sync of txg {txg} did not converge in {MAX_SYNC_PASSES} passes")))
    }

    /// The MOS blocks born in `txg` (import: what no space map lists yet), each copy.
    pub fn blocks_born_in(&self, io: &dyn BlockIo, root: &BlockPointer, txg: Txg) -> Result<Vec<Dva>> {
        let mut bps = Vec::new();
        objset_blocks(io, root, txg, false, &mut bps)?;
        Ok(bps.iter().flat_map(|bp| bp.copies().copied()).collect())
    }
}

/// Every block of the MOS at `root` and of the dataset objsets it holds, except the
/// data trees of volumes (a scan walks those as volumes), each block once: what a
/// scrub reads and space accounting counts as metadata.
pub fn metadata_blocks(io: &dyn BlockIo, root: &BlockPointer) -> Result<Vec<BlockPointer>> {
    let mut out = Vec::new();
    objset_blocks(io, root, Txg::ZERO, true, &mut out)?;
    Ok(out)
}

/// The blocks born in `since` or later of the objset at `root` (its block, the
/// meta-dnode's tree, every object's tree but volume data), and with `follow`, of
/// every dataset objset its DSL datasets point at.
fn objset_blocks(io: &dyn BlockIo, root: &BlockPointer, since: Txg, follow: bool, out: &mut Vec<BlockPointer>) -> Result<()> {
    use crate::dmu::dnode::{DnodePhys, DNODE_BYTES};
    if root.is_hole() || root.birth < since {
        return Ok(());
    }
    out.push(*root);
    let os = Objset::open(io, root)?;
    let meta = os.dnode(io, 0)?.phys().ok_or_else(|| Error::Corrupt("an objset without a meta-dnode".into()))?;
    let mut dnode_blocks = Vec::new();
    Tree { shape: meta.shape(), nlevels: meta.nlevels, roots: &meta.blkptr }.visit_born_since(io, since, &mut |bp, level| {
        out.push(*bp);
        if level == 0 {
            dnode_blocks.push(*bp);
        }
        Ok(())
    })?;
    let mut datasets = Vec::new();
    for bp in dnode_blocks {
        let b = io.read(&bp)?;
        for d in b.chunks_exact(DNODE_BYTES) {
            let Some(p) = DnodePhys::decode(d, bp.birth).map_err(|e| Error::Corrupt(format!("dnode block: {e}")))? else { continue };
            if p.object_type == ObjectType::VolumeData {
                continue;
            }
            if follow && p.object_type == ObjectType::DslDataset {
                let ds = crate::dsl_dir::phys::DatasetPhys::decode(&p.bonus, bp.birth).map_err(|e| Error::Corrupt(format!("a DSL dataset: {e}")))?;
                datasets.push(ds.objset_bp);
            }
            Tree { shape: p.shape(), nlevels: p.nlevels, roots: &p.blkptr }.visit_born_since(io, since, &mut |bp, _| {
                out.push(*bp);
                Ok(())
            })?;
        }
    }
    for d in datasets {
        objset_blocks(io, &d, since, false, out)?;
    }
    Ok(())
}

impl PoolMos {
    /// Import: build the allocator `ms` (its vdevs added, nothing allocated) from the
    /// MOS of uberblock `txg` at `root`: what the space maps hold, the free lists of
    /// `txg` and `txg − 1` as still deferred, and the MOS blocks born in `txg`
    /// (journaled, for the next sync to append). Every listed free must lie in
    /// allocated space.
    pub fn load_allocator(&self, io: &dyn BlockIo, root: &BlockPointer, txg: Txg, ms: &crate::metaslab::Metaslabs) -> Result<()> {
        ms.set_journal(false);
        let ids: Vec<VdevId> = self.vdevs.lock().keys().copied().collect();
        for id in ids {
            for (at, len) in self.allocated(id) {
                ms.claim_extent(id, at, len)?;
            }
        }
        // a free on a vdev the pool no longer has (a log vdev removed since) is dropped
        // ... and one the maps list as free was carried into a newer list and released
        // since (spa/format2.rs)
        let keep = |d: &Dva| self.vdevs.lock().contains_key(&d.vdev) && ms.is_allocated(d);
        let mut check = |d: &Dva| if !keep(d) || ms.is_wholly_allocated(d) { Ok(()) } else { Err(format!("{d:?} is partly free")) };
        for (t, dvas) in self.deferred_frees(io, &[txg, txg.prev()], &mut check)? {
            dvas.into_iter().filter(|d| keep(d)).for_each(|d| ms.free_deferred(t, d));
        }
        ms.set_journal(true);
        for d in self.blocks_born_in(io, root, txg)? {
            ms.claim(&d).map_err(|e| Error::Corrupt(format!("a MOS block of txg {txg}: {e}")))?;
        }
        Ok(())
    }
}

impl PoolMos {
    /// The pool history ring.
    pub fn history<'a>(&'a self, io: &'a dyn BlockIo) -> HistoryRing<'a> {
        HistoryRing { mos: &self.os, io, object: self.dir.history }
    }
}

/// One MOS sync pass's block seam: frees of blocks older than the txg are noted (they
/// go to the txg's free list) and passed on.
struct PassIo<'a> {
    inner: &'a dyn BlockIo,
    older_frees: Mutex<Vec<Dva>>,
}

impl BlockIo for PassIo<'_> {
    fn txg(&self) -> Txg {
        self.inner.txg()
    }
    fn read(&self, bp: &BlockPointer) -> Result<Arc<AlignedBuf>> {
        self.inner.read(bp)
    }
    fn write(&self, data: Arc<AlignedBuf>, spec: BlockSpec) -> Result<BlockPointer> {
        self.inner.write(data, spec)
    }
    fn free(&self, bp: &BlockPointer) {
        if !bp.is_hole() && bp.birth < self.txg() {
            self.older_frees.lock().extend(bp.copies().copied());
        }
        self.inner.free(bp);
    }
}

mod destroy;
pub use destroy::ZFS_ASYNC_BLOCK_MAX_BLOCKS;
mod history;
pub use history::{history_ring_bytes, HistoryPhys, HistoryRing};
mod volumes;
pub use volumes::{check_scan_record, decode_leaf_health, encode_leaf_health, VolumeInfo, LEAF_DTL_MAX_RANGES, SCAN_RECORD_WORDS, SCAN_TAIL_MAX_BYTES, VOLUME_DATA_OBJECT, VOLUME_INDBLKSHIFT, VOLUME_PROPS_OBJECT};

#[cfg(test)]
mod tests;
