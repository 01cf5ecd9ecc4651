//! A format 2 pool's volumes: a dataset each, with a volume objset (§15) whose object 1
//! is the volume data and object 2 its properties. The volume path writes its block
//! tree itself (zvol, today's dirty records); the objset adopts the tree's root in the
//! txg that wrote it, and the dataset's bonus records the objset's new block.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::dsl_dir::phys::DatasetPhys;

/// Object numbers in a volume objset.
pub const VOLUME_DATA_OBJECT: u64 = 1;
pub const VOLUME_PROPS_OBJECT: u64 = 2;
/// A volume's indirect blocks: 128 KiB (the format 1 tree's, so `upgrade` adopts it).
pub const VOLUME_INDBLKSHIFT: u8 = 17;

/// A volume as the MOS holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Below the pool: `vm/disk1`.
    pub path: String,
    pub dir: u64,
    pub dataset: u64,
    pub volsize: u64,
    pub volblocksize: u32,
    pub nlevels: u8,
    pub root: BlockPointer,
    pub zil_header: [u8; 40],
    pub creation_time_s: u64,
    /// The dataset's `objsetid` (never reused: a format 1 volume's id).
    pub objsetid: u64,
    pub creation_txg: Txg,
}

impl PoolMos {
    pub(super) fn dsl<'a>(&'a self, io: &'a dyn BlockIo) -> DslTree<'a> {
        DslTree { mos: &self.os, io }
    }

    /// The open objset of `dataset` (opened from its bonus the first time).
    pub fn dataset_objset(&self, io: &dyn BlockIo, dataset: u64) -> Result<Arc<Objset>> {
        if let Some(os) = self.datasets.lock().get(&dataset) {
            return Ok(os.clone());
        }
        let d = self.dsl(io).dataset(dataset)?;
        if d.objset_bp.is_hole() {
            return Err(Error::Corrupt(format!("dataset object {dataset} has no objset")));
        }
        let os = Arc::new(Objset::open(io, &d.objset_bp)?);
        Ok(self.datasets.lock().entry(dataset).or_insert(os).clone())
    }

    /// Create volume `name` under directory `parent` in `txg`.
    pub fn create_volume(&self, io: &dyn BlockIo, txg: Txg, parent: u64, name: &str, volsize: u64, volblocksize: u32, creation_time_s: u64, guid: u64) -> Result<VolumeInfo> {
        let objsetid = self.next_dataset_id(io)?;
        self.create_volume_numbered(io, txg, parent, name, (volsize, volblocksize), creation_time_s, guid, objsetid)
    }

    /// The next `objsetid` to hand out.
    pub fn next_dataset_id(&self, io: &dyn BlockIo) -> Result<u64> {
        get(&self.os, io, DIRECTORY_OBJECT, "next_dataset_id")
    }

    /// Hand out ids from `next` on (never lowers it).
    pub fn raise_next_dataset_id(&self, io: &dyn BlockIo, txg: Txg, next: u64) -> Result<()> {
        if next > self.next_dataset_id(io)? {
            put(&self.os, io, txg, DIRECTORY_OBJECT, "next_dataset_id", next)?;
        }
        Ok(())
    }

    /// As [`PoolMos::create_volume`], with the `objsetid` the caller chose (at least the
    /// next one: ids are never reused); `size` is (volsize, volblocksize).
    #[allow(clippy::too_many_arguments)]
    pub fn create_volume_numbered(&self, io: &dyn BlockIo, txg: Txg, parent: u64, name: &str, size: (u64, u32), creation_time_s: u64, guid: u64, objsetid: u64) -> Result<VolumeInfo> {
        let (volsize, volblocksize) = size;
        let next = self.next_dataset_id(io)?;
        if objsetid < next {
            return Err(Error::invalid(format!("objsetid {objsetid} was handed out already (next is {next})")));
        }
        put(&self.os, io, txg, DIRECTORY_OBJECT, "next_dataset_id", objsetid + 1)?;
        let (dir, dataset) = self.dsl(io).create_child(txg, parent, name, &NewDataset { creation_time_s, objsetid, guid })?;
        let os = Objset::create(ObjsetType::Volume, txg);
        let mut spec = ObjectSpec::metadata(ObjectType::VolumeData, volblocksize);
        (spec.indblkshift, spec.nblkptr) = (VOLUME_INDBLKSHIFT, 1);
        let data = os.allocate(io, txg, &spec)?;
        let props = new_zap(&os, io, txg, ObjectType::VolumeProps)?;
        assert_eq!((data, props), (VOLUME_DATA_OBJECT, VOLUME_PROPS_OBJECT), "a new volume objset's first objects");
        put(&os, io, txg, props, "size", volsize)?;
        put(&os, io, txg, props, "creation", creation_time_s)?;
        self.datasets.lock().insert(dataset, Arc::new(os));
        let path = self.dsl(io).full_name(dir, "")?.trim_start_matches('/').to_string();
        Ok(VolumeInfo { path, dir, dataset, volsize, volblocksize, nlevels: 1, root: BlockPointer::hole(), zil_header: [0; 40], creation_time_s, objsetid, creation_txg: txg })
    }

    /// The volume's tree as its path wrote it in `txg` (`nblocks` = volsize / volblocksize).
    pub fn set_volume_tree(&self, io: &dyn BlockIo, txg: Txg, dataset: u64, nlevels: u8, root: BlockPointer, used_bytes: u64, nblocks: u64) -> Result<()> {
        let os = self.dataset_objset(io, dataset)?;
        os.adopt_tree(io, txg, VOLUME_DATA_OBJECT, nlevels, vec![root], used_bytes, nblocks.saturating_sub(1))
    }

    pub fn set_volume_size(&self, io: &dyn BlockIo, txg: Txg, dataset: u64, volsize: u64) -> Result<()> {
        put(&*self.dataset_objset(io, dataset)?, io, txg, VOLUME_PROPS_OBJECT, "size", volsize)
    }

    pub fn set_zil_header(&self, io: &dyn BlockIo, txg: Txg, dataset: u64, header: [u8; 40]) -> Result<()> {
        self.dataset_objset(io, dataset)?.set_zil_header(txg, header);
        Ok(())
    }

    /// Sync every dataset objset dirty in `txg` and record its new block in its
    /// dataset (a MOS change of `txg`); the block it replaces is freed.
    pub fn sync_datasets(&self, io: &dyn BlockIo, txg: Txg) -> Result<()> {
        let open: Vec<(u64, Arc<Objset>)> = self.datasets.lock().iter().map(|(d, o)| (*d, o.clone())).collect();
        for (dataset, os) in open.into_iter().filter(|(_, o)| o.is_dirty(txg)) {
            let Some(s) = os.sync(io, txg)? else { continue };
            let dsl = self.dsl(io);
            let mut d: DatasetPhys = dsl.dataset(dataset)?;
            io.free(&d.objset_bp);
            d.objset_bp = s.bp;
            dsl.set_dataset(txg, dataset, &d)?;
        }
        Ok(())
    }

    /// Every volume in the pool, in name order.
    pub fn volumes(&self, io: &dyn BlockIo) -> Result<Vec<VolumeInfo>> {
        let mut out = Vec::new();
        let mut stack: Vec<(u64, String)> = vec![(self.dir.root_dataset, String::new())];
        while let Some((dir, path)) = stack.pop() {
            let dsl = self.dsl(io);
            for (name, child) in dsl.children(dir)? {
                let child_path = if path.is_empty() { name } else { format!("{path}/{name}") };
                if let Some(v) = self.volume_at(io, child, &child_path)? {
                    out.push(v);
                }
                if stack.len() + out.len() > 1 << 20 {
                    return Err(Error::Corrupt("the dataset tree has more than 2^20 entries".into()));
                }
                stack.push((child, child_path));
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn volume_at(&self, io: &dyn BlockIo, dir: u64, path: &str) -> Result<Option<VolumeInfo>> {
        let dsl = self.dsl(io);
        let dataset = dsl.dir(dir)?.head_dataset;
        let d = dsl.dataset(dataset)?;
        if d.objset_bp.is_hole() {
            return Ok(None);
        }
        let os = self.dataset_objset(io, dataset)?;
        if os.objset_type() != ObjsetType::Volume {
            return Ok(None);
        }
        let bad = |w: &str| Error::Corrupt(format!("volume {path}: {w}"));
        let data = os.dnode(io, VOLUME_DATA_OBJECT)?.phys().filter(|p| p.object_type == ObjectType::VolumeData).ok_or_else(|| bad("object 1 is not its data"))?;
        let volsize = get(&os, io, VOLUME_PROPS_OBJECT, "size")?;
        let creation_time_s = get(&os, io, VOLUME_PROPS_OBJECT, "creation")?;
        Ok(Some(VolumeInfo {
            path: path.to_string(),
            dir,
            dataset,
            volsize,
            volblocksize: data.data_block_bytes,
            nlevels: data.nlevels,
            root: data.blkptr[0],
            zil_header: os.zil_header(),
            creation_time_s,
            objsetid: d.objsetid,
            creation_txg: d.creation_txg,
        }))
    }

    /// Rename child `old` of directory `parent` to `new` in `txg` (same parent).
    pub fn rename_child(&self, io: &dyn BlockIo, txg: Txg, parent: u64, old: &str, new: &str) -> Result<()> {
        self.dsl(io).rename_child(txg, parent, old, new)
    }

    /// Directory `dir`'s local properties become `props` in `txg`: only what differs is
    /// written.
    pub fn set_local_props(&self, io: &dyn BlockIo, txg: Txg, dir: u64, props: &BTreeMap<String, String>) -> Result<()> {
        let dsl = self.dsl(io);
        let now = dsl.local_props(dir)?;
        for (k, v) in props.iter().filter(|(k, v)| now.get(*k) != Some(*v)) {
            dsl.set_prop(txg, dir, k, v)?;
        }
        for k in now.keys().filter(|k| !props.contains_key(*k)) {
            dsl.inherit_prop(txg, dir, k, false)?;
        }
        Ok(())
    }

    /// Forget the open objset of a destroyed dataset (after the txg that destroyed it
    /// committed).
    pub fn forget_dataset(&self, dataset: u64) {
        self.datasets.lock().remove(&dataset);
    }

    /// The local properties of each directory on the way (for the caller's PropSet).
    pub fn local_props(&self, io: &dyn BlockIo, dir: u64) -> Result<BTreeMap<String, String>> {
        self.dsl(io).local_props(dir)
    }
}

/// Most ranges of one leaf's DTL in its health entry (§14.1).
pub const LEAF_DTL_MAX_RANGES: usize = 64;

/// One leaf's health entry (§14.1): faulted, and its DTL ranges.
pub fn encode_leaf_health(faulted: bool, dtl: &[(Txg, Txg)]) -> Vec<u8> {
    debug_assert!(dtl.len() <= LEAF_DTL_MAX_RANGES);
    let mut b = vec![faulted as u8, dtl.len() as u8];
    for (a, z) in dtl {
        b.extend_from_slice(&a.get().to_le_bytes());
        b.extend_from_slice(&z.get().to_le_bytes());
    }
    b
}

/// Decode a leaf health entry, every limit of §14.1 checked.
pub fn decode_leaf_health(b: &[u8]) -> std::result::Result<(bool, Vec<(Txg, Txg)>), String> {
    let (&flags, &n) = match b {
        [f, n, ..] => (f, n),
        _ => return Err(format!("a leaf health entry of {} bytes", b.len())),
    };
    if flags > 1 || n as usize > LEAF_DTL_MAX_RANGES || b.len() != 2 + 16 * n as usize {
        return Err(format!("a leaf health entry with flags {flags}, {n} ranges, {} bytes", b.len()));
    }
    let mut dtl = Vec::with_capacity(n as usize);
    let mut prev_last = 0u64;
    for c in b[2..].chunks_exact(16) {
        let a = u64::from_le_bytes(c[..8].try_into().expect("8"));
        let z = u64::from_le_bytes(c[8..].try_into().expect("8"));
        if a == 0 || a > z || z >= Txg::LIMIT.get() || (!dtl.is_empty() && a <= prev_last) {
            return Err(format!("DTL range [{a}, {z}] out of order or out of range"));
        }
        prev_last = z;
        dtl.push((Txg(a), Txg(z)));
    }
    Ok((flags == 1, dtl))
}

impl PoolMos {
    /// Pool properties become `props` in `txg`: only the entries that differ are written.
    pub fn set_pool_props(&self, io: &dyn BlockIo, txg: Txg, props: &BTreeMap<String, String>) -> Result<()> {
        let now = self.pool_props(io)?;
        let mut z = ObjectInTxg { objset: &self.os, io, txg, object: self.dir.pool_props };
        for (k, v) in props.iter().filter(|(k, v)| now.get(*k) != Some(*v)) {
            zap::update(&mut z, k.as_bytes(), v.as_bytes())?;
        }
        for k in now.keys().filter(|k| !props.contains_key(*k)) {
            zap::remove(&mut z, k.as_bytes())?;
        }
        Ok(())
    }

    pub fn pool_props(&self, io: &dyn BlockIo) -> Result<BTreeMap<String, String>> {
        let z = ObjectInTxg { objset: &self.os, io, txg: Txg::ZERO, object: self.dir.pool_props };
        let mut out = BTreeMap::new();
        for e in zap::list(&z, 0, usize::MAX)? {
            match (String::from_utf8(e.name), String::from_utf8(e.value)) {
                (Ok(k), Ok(v)) => out.insert(k, v),
                _ => return Err(Error::Corrupt("pool properties: an entry that is not UTF-8".into())),
            };
        }
        Ok(out)
    }

    /// Leaf health becomes `health` (guid → faulted, DTL) in `txg`: an entry per leaf,
    /// clean ones too (a leaf without one joined after the txg). Only entries that
    /// differ are written; a leaf no longer listed loses its entry.
    pub fn set_leaf_health(&self, io: &dyn BlockIo, txg: Txg, health: &BTreeMap<Guid, (bool, Vec<(Txg, Txg)>)>) -> Result<()> {
        let now = self.leaf_health(io)?;
        let mut z = ObjectInTxg { objset: &self.os, io, txg, object: self.dir.leaf_health };
        for (g, h) in health {
            if now.get(g) != Some(h) {
                zap::update(&mut z, guid_name(*g).as_bytes(), &encode_leaf_health(h.0, &h.1))?;
            }
        }
        for g in now.keys().filter(|g| !health.contains_key(*g)) {
            zap::remove(&mut z, guid_name(*g).as_bytes())?;
        }
        Ok(())
    }

    pub fn leaf_health(&self, io: &dyn BlockIo) -> Result<BTreeMap<Guid, (bool, Vec<(Txg, Txg)>)>> {
        let z = ObjectInTxg { objset: &self.os, io, txg: Txg::ZERO, object: self.dir.leaf_health };
        let mut out = BTreeMap::new();
        for e in zap::list(&z, 0, usize::MAX)? {
            let name = String::from_utf8(e.name).ok().and_then(|n| u64::from_str_radix(&n, 16).ok().filter(|_| n.len() == 16));
            let g = name.ok_or_else(|| Error::Corrupt("leaf health: a name that is not a guid".into()))?;
            let h = decode_leaf_health(&e.value).map_err(|w| Error::Corrupt(format!("leaf health of {g:016x}: {w}")))?;
            out.insert(Guid(g), h);
        }
        Ok(out)
    }
}

/// Words of the scan record (§14.3).
pub const SCAN_RECORD_WORDS: usize = 20;

/// The scan record's limits (§14.3): function, state and txgs.
pub fn check_scan_record(w: &[u64; SCAN_RECORD_WORDS]) -> std::result::Result<(), String> {
    if w[0] > 2 || w[1] > 4 {
        return Err(format!("scan record: function {} state {}", w[0], w[1]));
    }
    if w[14] >= Txg::LIMIT.get() || w[15] >= Txg::LIMIT.get() {
        return Err(format!("scan record: txgs {} and {} beyond the limit", w[14], w[15]));
    }
    Ok(())
}

/// Most bytes of the scan record's tail (§14.3: the resilver's targets).
pub const SCAN_TAIL_MAX_BYTES: usize = 64 << 10;

impl PoolMos {
    /// Record the scan's state in `txg` (the `scan` entry of the object directory): the
    /// 20 words and the tail of §14.3.
    pub fn set_scan(&self, io: &dyn BlockIo, txg: Txg, w: &[u64; SCAN_RECORD_WORDS], tail: &[u8]) -> Result<()> {
        check_scan_record(w).map_err(Error::invalid)?;
        if tail.len() > SCAN_TAIL_MAX_BYTES {
            return Err(Error::invalid(format!("a scan record tail of {} bytes (at most {SCAN_TAIL_MAX_BYTES})", tail.len())));
        }
        let mut bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        bytes.extend_from_slice(tail);
        let z = &mut ObjectInTxg { objset: &self.os, io, txg, object: DIRECTORY_OBJECT };
        if zap::lookup(z, b"scan")?.as_deref() != Some(&bytes[..]) {
            zap::update(z, b"scan", &bytes)?;
        }
        Ok(())
    }

    /// The scan record and its tail, once a scan has run.
    #[allow(clippy::type_complexity)]
    pub fn scan(&self, io: &dyn BlockIo) -> Result<Option<([u64; SCAN_RECORD_WORDS], Vec<u8>)>> {
        let Some(b) = zap::lookup(&ObjectInTxg { objset: &self.os, io, txg: Txg::ZERO, object: DIRECTORY_OBJECT }, b"scan")? else { return Ok(None) };
        if b.len() < SCAN_RECORD_WORDS * 8 || b.len() > SCAN_RECORD_WORDS * 8 + SCAN_TAIL_MAX_BYTES {
            return Err(Error::Corrupt(format!("scan record of {} bytes", b.len())));
        }
        let mut w = [0u64; SCAN_RECORD_WORDS];
        for (i, c) in b[..SCAN_RECORD_WORDS * 8].chunks_exact(8).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().expect("8"));
        }
        check_scan_record(&w).map_err(Error::Corrupt)?;
        Ok(Some((w, b[SCAN_RECORD_WORDS * 8..].to_vec())))
    }
}
