//! objset: a set of objects, their dirty records per txg, and its sync (format 2).
//!
//! Theory of operation
//! -------------------
//! An objset (docs/on-disk-format.md §10) is the objset block: a type, a ZIL header and
//! the meta-dnode, object 0, whose data blocks are the array of every other object's
//! dnode, 32 per 16 KiB block. The MOS is one, every dataset has one.
//!
//! **In memory.** An open [`Objset`] holds the dnodes that have been used, each an
//! [`Dnode`] with its own lock: its phys as of the last synced txg, its newest phys
//! (what open context sees: allocated, freed, resized, bonus changed), and per txg not
//! yet synced (at most [`MAX_DIRTY_TXGS`]: open, quiescing, syncing) the blocks written
//! in it, in block order (a `BTreeMap` by block id, newest content of that txg; `None`
//! = freed). A read looks at the newest txg's record for the block first, then the
//! older ones, then the synced tree. The objset keeps, per txg, the set of objects
//! dirtied in it, in object order.
//!
//! **Sync of txg T** ([`Objset::sync`]), for each object dirtied in T in object order:
//! write its blocks of T (the pipeline behind [`BlockIo`]), apply them to its tree
//! ([`object_tree::apply`]: indirects rewritten once per txg, levels grown), and record
//! its new dnode; a freed object's whole tree is freed. The changed dnodes are patched
//! into their dnode blocks, which are the meta-dnode's dirty blocks of T, and the
//! meta-dnode syncs the same way; last the objset block is written and its pointer
//! returned, for the holder (a dataset's bonus, or the uberblock) to record. Only then
//! are T's records dropped, so a reader always finds a block either dirty or in the
//! tree it reads. Nothing above this module sees a dirty record.
//!
//! **Object numbers.** Allocation looks for a dnode block with a free slot by
//! descending the meta-dnode's tree by `fill` (never reading a full subtree), then
//! checks the slots against what is in memory. A slot is free when the synced dnode
//! block says so and no open txg allocated it: an object freed in T is free on disk
//! only once T has synced, so its number is never handed out in T, and the new object
//! gets T' > T as its generation: (number, generation) never repeats.
//!
//! **Bounds.** [`MAX_DIRTY_TXGS`] txgs of records per dnode; clean dnodes beyond
//! [`CLEAN_DNODES_MAX`] are dropped at the end of a sync (a dirty one, or one a caller
//! holds, stays). The ARC below bounds the blocks.
//!
//! **Crash safety.** Every block a sync writes is new; what it replaces is freed in T
//! (deferred by the pool's free lists). The objset block's pointer is the commit of the
//! whole objset: until its holder is on disk, the previous objset block and everything
//! it references are intact.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use super::dnode::{DnodePhys, ObjectSpec, ObjectType, Shape, DNODES_PER_BLOCK, DNODE_BLOCK_BYTES, DNODE_BYTES, MAX_OBJECT};
use super::object_tree::{self, BlockIo, BlockSpec, Tree};
use crate::block::blkptr::{self, BlockPointer};
use crate::block::checksum::ChecksumAlgo;
use crate::block::compress::Compression;
use crate::vdev::abd::AlignedBuf;
use crate::{Error, Result, Txg};

/// Bytes of an objset block.
pub const OBJSET_BYTES: usize = 4096;
const _: () = assert!(OBJSET_BYTES == crate::vdev::label::UB_OBJSET_BYTES as usize, "a version 2 uberblock points at an objset block");
pub const OBJSET_MAGIC: u64 = 0x5445534a424f4c5a; // "ZLOBJSET" read as LE bytes
pub const OBJSET_VERSION: u32 = 1;
/// Txgs a dnode holds records for: open, quiescing, syncing.
pub const MAX_DIRTY_TXGS: usize = 3;
/// Clean dnodes an open objset keeps in memory.
pub const CLEAN_DNODES_MAX: usize = 4096;
/// The meta-dnode's indirect blocks: 4 KiB, 32 pointers (one level per 32^k dnode blocks).
pub const META_INDBLKSHIFT: u8 = 12;
const ZIL_HEADER_BYTES: usize = 40;

/// What an objset holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ObjsetType {
    Mos = 1,
    Volume = 2,
    FileSystem = 3,
}

/// The objset block as stored (§10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjsetPhys {
    pub objset_type: ObjsetType,
    pub zil_header: [u8; ZIL_HEADER_BYTES],
    pub meta_dnode: DnodePhys,
}

impl ObjsetPhys {
    /// An empty objset created in `txg`.
    pub fn new(objset_type: ObjsetType, txg: Txg) -> ObjsetPhys {
        let mut spec = ObjectSpec::metadata(ObjectType::DnodeArray, DNODE_BLOCK_BYTES);
        (spec.indblkshift, spec.nblkptr) = (META_INDBLKSHIFT, 3);
        ObjsetPhys { objset_type, zil_header: [0; ZIL_HEADER_BYTES], meta_dnode: DnodePhys::new(&spec, txg) }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; OBJSET_BYTES];
        b[0..8].copy_from_slice(&OBJSET_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&OBJSET_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.objset_type as u32).to_le_bytes());
        b[24..64].copy_from_slice(&self.zil_header);
        b[128..128 + DNODE_BYTES].copy_from_slice(&self.meta_dnode.encode());
        b
    }

    /// Decode an objset block read from a device (`birth`: its pointer's), every
    /// limit of §10 checked; the error names the field.
    pub fn decode(b: &[u8], birth: Txg) -> std::result::Result<ObjsetPhys, String> {
        if b.len() != OBJSET_BYTES {
            return Err(format!("{} bytes, not {OBJSET_BYTES}", b.len()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let bad = |field: &str, v: u64| Err(format!("objset block: field {field} = {v:#x} is out of range"));
        let magic = u64::from_le_bytes(b[0..8].try_into().unwrap());
        if magic != OBJSET_MAGIC {
            return bad("magic", magic);
        }
        if u32_at(8) != OBJSET_VERSION {
            return bad("version", u32_at(8) as u64);
        }
        let objset_type = match u32_at(12) {
            1 => ObjsetType::Mos,
            2 => ObjsetType::Volume,
            3 => ObjsetType::FileSystem,
            t => return bad("type", t as u64),
        };
        if let Some(at) = b[16..24].iter().chain(&b[64..128]).chain(&b[640..]).position(|&x| x != 0) {
            return bad("reserved bytes (non-zero at index)", at as u64);
        }
        let meta = DnodePhys::decode(&b[128..128 + DNODE_BYTES], birth).map_err(|e| format!("objset block: meta-dnode: {e}"))?;
        let Some(meta_dnode) = meta.filter(|m| m.object_type == ObjectType::DnodeArray && m.data_block_bytes == DNODE_BLOCK_BYTES) else {
            return Err("objset block: the meta-dnode is not a dnode array of 16 KiB blocks".into());
        };
        Ok(ObjsetPhys { objset_type, zil_header: b[24..64].try_into().unwrap(), meta_dnode })
    }
}

/// One txg's changes to a dnode.
#[derive(Default, Clone)]
struct TxgRecords {
    /// Newest content of each block written in the txg (`None`: freed).
    blocks: BTreeMap<u64, Option<Arc<AlignedBuf>>>,
    /// The object was freed in the txg (its whole tree goes).
    freed: bool,
    /// The dnode as the txg left it, when the txg changed it (allocated, freed, its
    /// bonus, block size or highest block id); its tree fields are not used.
    phys: Option<Option<DnodePhys>>,
    /// A tree written by its owner outside this objset's records (a format 1 volume
    /// path), adopted as the object's tree in the txg: levels, roots, used bytes,
    /// highest block id.
    adopted: Option<(u8, Vec<BlockPointer>, u64, u64)>,
}

impl DnodeInner {
    /// The records of `txg`, the dnode as it is now noted as what `txg` leaves.
    fn changed_in(&mut self, txg: Txg) -> &mut TxgRecords {
        debug_assert!(self.dirty.len() <= MAX_DIRTY_TXGS, "a dnode dirty in more than {MAX_DIRTY_TXGS} txgs");
        let now = self.current.clone();
        let r = self.dirty.entry(txg).or_default();
        r.phys = Some(now);
        r
    }
}

struct DnodeInner {
    /// As of the last synced txg (`None`: a free slot).
    synced: Option<DnodePhys>,
    /// What open context sees.
    current: Option<DnodePhys>,
    /// Records per txg not yet synced, oldest first.
    dirty: BTreeMap<Txg, TxgRecords>,
    /// Bumped by every change of a block's record: a read-modify-write that raced with
    /// another change of the dnode retries.
    change_gen: u64,
}

/// An object of an open objset.
pub struct Dnode {
    pub object: u64,
    inner: Mutex<DnodeInner>,
}

impl Dnode {
    fn is_clean(&self) -> bool {
        self.inner.lock().dirty.is_empty()
    }
    /// The dnode as open context sees it (`None`: free).
    pub fn phys(&self) -> Option<DnodePhys> {
        self.inner.lock().current.clone()
    }
}

struct ObjsetInner {
    phys: ObjsetPhys,
    dnodes: HashMap<u64, Arc<Dnode>>,
    /// Objects dirtied per txg, in object order.
    dirty: BTreeMap<Txg, BTreeSet<u64>>,
    /// The ZIL header and objset type changes of open txgs.
    zil_header: Option<(Txg, [u8; ZIL_HEADER_BYTES])>,
    /// Next dnode block the allocator looks in.
    alloc_hint: u64,
}

/// A dnode as a sync attempt found it.
struct SavedDnode {
    dnode: Arc<Dnode>,
    synced: Option<DnodePhys>,
    current: Option<DnodePhys>,
    records: Option<TxgRecords>,
}

/// The objset as a sync attempt of `txg` found it; see [`Objset::sync_begin`].
struct SyncUndo {
    txg: Txg,
    phys: ObjsetPhys,
    zil_header: Option<(Txg, [u8; ZIL_HEADER_BYTES])>,
    dirty_set: Option<BTreeSet<u64>>,
    alloc_hint: u64,
    saved: HashMap<u64, SavedDnode>,
}

/// An open objset. Reads and writes take the txg they belong to from the caller (the
/// DMU transaction); the syncing thread calls [`Objset::sync`] for each txg in order.
pub struct Objset {
    meta: Arc<Dnode>,
    inner: Mutex<ObjsetInner>,
    /// While a sync attempt runs (`sync_begin` .. `sync_end` / `sync_abort`): what it
    /// changed, as it was before. Lock order: a dnode, then this; never a dnode while
    /// this is held (nor `inner`: `inner` is taken before dnodes elsewhere).
    undo: Mutex<Option<SyncUndo>>,
    undo_active: std::sync::atomic::AtomicBool,
}

fn dnode_block_spec(fill: u64) -> BlockSpec {
    BlockSpec { kind: blkptr::KIND_DNODE, level: 0, fill, checksum: ChecksumAlgo::Fletcher4, compression: Compression::Lz4 }
}

impl Objset {
    /// Create an empty objset in `txg` (it is dirty in `txg`: the first sync writes it).
    pub fn create(objset_type: ObjsetType, txg: Txg) -> Objset {
        let os = Objset::open_phys(ObjsetPhys::new(objset_type, txg));
        os.inner.lock().dirty.entry(txg).or_default();
        os
    }

    /// Open the objset whose block `bp` points at.
    pub fn open(io: &dyn BlockIo, bp: &BlockPointer) -> Result<Objset> {
        if bp.is_hole() || bp.kind != blkptr::KIND_OBJSET || bp.level != 0 || bp.lsize as usize != OBJSET_BYTES {
            return Err(Error::Corrupt(format!("an objset pointer of kind {} level {} lsize {}", bp.kind, bp.level, bp.lsize)));
        }
        let b = io.read(bp)?;
        let phys = ObjsetPhys::decode(&b, bp.birth).map_err(Error::Corrupt)?;
        Ok(Objset::open_phys(phys))
    }

    fn open_phys(phys: ObjsetPhys) -> Objset {
        let meta = Arc::new(Dnode {
            object: 0,
            inner: Mutex::new(DnodeInner { synced: Some(phys.meta_dnode.clone()), current: Some(phys.meta_dnode.clone()), dirty: BTreeMap::new(), change_gen: 0 }),
        });
        let inner = Mutex::new(ObjsetInner { phys, dnodes: HashMap::new(), dirty: BTreeMap::new(), zil_header: None, alloc_hint: 0 });
        Objset { meta, inner, undo: Mutex::new(None), undo_active: std::sync::atomic::AtomicBool::new(false) }
    }

    pub fn objset_type(&self) -> ObjsetType {
        self.inner.lock().phys.objset_type
    }

    /// The ZIL header as open context sees it.
    pub fn zil_header(&self) -> [u8; ZIL_HEADER_BYTES] {
        let i = self.inner.lock();
        i.zil_header.map_or(i.phys.zil_header, |z| z.1)
    }

    /// Set the ZIL header in `txg`.
    pub fn set_zil_header(&self, txg: Txg, header: [u8; ZIL_HEADER_BYTES]) {
        let mut i = self.inner.lock();
        i.zil_header = Some((txg, header));
        i.dirty.entry(txg).or_default();
    }

    /// Whether anything changed in `txg`.
    pub fn is_dirty(&self, txg: Txg) -> bool {
        self.inner.lock().dirty.contains_key(&txg)
    }

    /// The dnode of `object` (loaded from its dnode block if not in memory).
    pub fn dnode(&self, io: &dyn BlockIo, object: u64) -> Result<Arc<Dnode>> {
        if object == 0 {
            return Ok(self.meta.clone());
        }
        if object > MAX_OBJECT {
            return Err(Error::invalid(format!("object {object} is beyond the largest object number")));
        }
        if let Some(d) = self.inner.lock().dnodes.get(&object) {
            return Ok(d.clone());
        }
        let phys = self.read_synced_dnode(io, object)?;
        let mut i = self.inner.lock();
        // another thread may have loaded (and changed) it meanwhile: keep the first
        let d = i.dnodes.entry(object).or_insert_with(|| {
            Arc::new(Dnode { object, inner: Mutex::new(DnodeInner { synced: phys.clone(), current: phys, dirty: BTreeMap::new(), change_gen: 0 }) })
        });
        Ok(d.clone())
    }

    /// The dnode of `object` as open context sees it, which must be an allocated object
    /// of type `want`; else the object is corrupt (the error names both).
    pub fn typed_dnode(&self, io: &dyn BlockIo, object: u64, want: ObjectType) -> Result<DnodePhys> {
        match self.dnode(io, object)?.phys() {
            Some(p) if p.object_type == want => Ok(p),
            Some(p) => Err(Error::Corrupt(format!("object {object} is of type {}, not {} ({want:?})", p.object_type.code(), want.code()))),
            None => Err(Error::Corrupt(format!("object {object} (a {want:?}) is free"))),
        }
    }

    /// The synced dnode of `object`, from its dnode block.
    fn read_synced_dnode(&self, io: &dyn BlockIo, object: u64) -> Result<Option<DnodePhys>> {
        let meta = self.meta.inner.lock().synced.clone().expect("an objset has a meta-dnode");
        let blkid = object / DNODES_PER_BLOCK;
        let bp = Tree { shape: meta.shape(), nlevels: meta.nlevels, roots: &meta.blkptr }.lookup(io, blkid)?;
        if bp.is_hole() {
            return Ok(None);
        }
        let b = io.read(&bp)?;
        let slot = (object % DNODES_PER_BLOCK) as usize * DNODE_BYTES;
        if b.len() != DNODE_BLOCK_BYTES as usize {
            return Err(Error::Corrupt(format!("dnode block {blkid} holds {} bytes", b.len())));
        }
        let phys = DnodePhys::decode(&b[slot..slot + DNODE_BYTES], bp.birth).map_err(|e| Error::Corrupt(format!("object {object}: {e}")))?;
        if phys.as_ref().is_some_and(|p| p.object_type == ObjectType::DnodeArray) {
            return Err(Error::Corrupt(format!("object {object}: a second dnode array")));
        }
        Ok(phys)
    }

    fn note_dirty(&self, txg: Txg, object: u64) {
        let mut i = self.inner.lock();
        let n = i.dirty.len();
        let set = i.dirty.entry(txg).or_default();
        set.insert(object);
        debug_assert!(n <= MAX_DIRTY_TXGS, "objset dirty in more than {MAX_DIRTY_TXGS} txgs");
    }

    /// Allocate an object of `spec` in `txg`: the lowest free number from the
    /// allocator's hint on (§11's reuse rule), with generation `txg`.
    pub fn allocate(&self, io: &dyn BlockIo, txg: Txg, spec: &ObjectSpec) -> Result<u64> {
        let phys = DnodePhys::new(spec, txg);
        phys.check_attributes().map_err(|e| Error::invalid(format!("object spec: {e}")))?;
        let mut blkid = self.inner.lock().alloc_hint;
        loop {
            let meta = self.meta.inner.lock().synced.clone().expect("meta-dnode");
            blkid = Tree { shape: meta.shape(), nlevels: meta.nlevels, roots: &meta.blkptr }.first_with_room(io, blkid, DNODES_PER_BLOCK)?;
            for slot in 0..DNODES_PER_BLOCK {
                let object = blkid * DNODES_PER_BLOCK + slot;
                if object == 0 {
                    continue;
                }
                if object > MAX_OBJECT {
                    return Err(Error::NoSpaceFor("no free object number in this objset".into()));
                }
                let d = self.dnode(io, object)?;
                let mut di = d.inner.lock();
                if di.current.is_none() && di.synced.is_none() && di.dirty.is_empty() {
                    self.save(&d, &di);
                    di.current = Some(phys.clone());
                    di.changed_in(txg);
                    drop(di);
                    self.note_dirty(txg, object);
                    self.inner.lock().alloc_hint = blkid;
                    return Ok(object);
                }
            }
            blkid += 1;
        }
    }

    /// Free `object` in `txg`: it reads as free at once; its blocks go in the sync.
    pub fn free_object(&self, io: &dyn BlockIo, txg: Txg, object: u64) -> Result<()> {
        let d = self.dnode(io, object)?;
        let mut di = d.inner.lock();
        if object == 0 || di.current.is_none() {
            return Err(Error::NotFound(format!("object {object}")));
        }
        self.save(&d, &di);
        di.current = None;
        let r = di.changed_in(txg);
        r.freed = true;
        r.blocks.clear();
        di.change_gen += 1;
        drop(di);
        self.note_dirty(txg, object);
        Ok(())
    }

    /// Change an object's dnode in `txg` (its bonus, data block size, ...): `f` gets
    /// the current dnode; what it leaves must pass §11's limits.
    pub fn update_dnode(&self, io: &dyn BlockIo, txg: Txg, object: u64, f: impl FnOnce(&mut DnodePhys) -> Result<()>) -> Result<()> {
        let d = self.dnode(io, object)?;
        let mut di = d.inner.lock();
        let Some(cur) = di.current.as_ref() else { return Err(Error::NotFound(format!("object {object}"))) };
        let mut new = cur.clone();
        f(&mut new)?;
        new.check_attributes().map_err(|e| Error::invalid(format!("object {object}: {e}")))?;
        self.save(&d, &di);
        di.current = Some(new);
        di.changed_in(txg);
        drop(di);
        self.note_dirty(txg, object);
        Ok(())
    }

    /// Change the data block size of `object` in `txg`; only while it holds no block
    /// but block 0, which is rewritten at the new size (cut or zero-extended).
    pub fn set_block_bytes(&self, io: &dyn BlockIo, txg: Txg, object: u64, bytes: u32) -> Result<()> {
        let old = self.read_block(io, object, 0)?;
        self.update_dnode(io, txg, object, |p| {
            if p.maxblkid > 0 {
                return Err(Error::invalid(format!("object {object}: the block size of an object with more than one block cannot change")));
            }
            p.data_block_bytes = bytes;
            Ok(())
        })?;
        if let Some(b) = old {
            let mut v = b.to_vec();
            v.resize(bytes as usize, 0);
            self.write_block(io, txg, object, 0, Some(Arc::new(AlignedBuf::from(&v[..]))))?;
        }
        Ok(())
    }

    /// Block `blkid` of `object` as open context sees it: `None` for a hole.
    pub fn read_block(&self, io: &dyn BlockIo, object: u64, blkid: u64) -> Result<Option<Arc<AlignedBuf>>> {
        let d = self.dnode(io, object)?;
        let di = d.inner.lock();
        if di.current.is_none() {
            return Err(Error::NotFound(format!("object {object}")));
        }
        for r in di.dirty.values().rev() {
            if let Some(b) = r.blocks.get(&blkid) {
                return Ok(b.clone());
            }
            if r.freed {
                return Ok(None);
            }
        }
        let Some(synced) = di.synced.clone() else { return Ok(None) };
        drop(di);
        let bp = Tree { shape: synced.shape(), nlevels: synced.nlevels, roots: &synced.blkptr }.lookup(io, blkid)?;
        if bp.is_hole() {
            return Ok(None);
        }
        let b = io.read(&bp)?;
        if b.len() != synced.data_block_bytes as usize {
            return Err(Error::Corrupt(format!("object {object} block {blkid}: {} bytes, not {}", b.len(), synced.data_block_bytes)));
        }
        Ok(Some(b))
    }

    /// Adopt a tree its owner wrote in `txg` (already copy on write, its replaced blocks
    /// already freed by the owner) as `object`'s tree: it replaces the object's tree
    /// when `txg` syncs. An object with adopted trees takes no block records.
    pub fn adopt_tree(&self, io: &dyn BlockIo, txg: Txg, object: u64, nlevels: u8, roots: Vec<BlockPointer>, used_bytes: u64, maxblkid: u64) -> Result<()> {
        let d = self.dnode(io, object)?;
        let mut di = d.inner.lock();
        let Some(cur) = di.current.as_ref() else { return Err(Error::NotFound(format!("object {object}"))) };
        if roots.len() != cur.nblkptr as usize || di.dirty.values().any(|r| !r.blocks.is_empty()) {
            return Err(Error::invalid(format!("object {object}: a tree of {} roots cannot be adopted here", roots.len())));
        }
        self.save(&d, &di);
        if let Some(cur) = di.current.as_mut() {
            (cur.nlevels, cur.blkptr, cur.used_bytes, cur.maxblkid) = (nlevels, roots.clone(), used_bytes, maxblkid);
        }
        di.dirty.entry(txg).or_default().adopted = Some((nlevels, roots, used_bytes, maxblkid));
        di.change_gen += 1;
        drop(di);
        self.note_dirty(txg, object);
        Ok(())
    }

    /// Write block `blkid` of `object` whole in `txg` (`None`: free it).
    pub fn write_block(&self, io: &dyn BlockIo, txg: Txg, object: u64, blkid: u64, data: Option<Arc<AlignedBuf>>) -> Result<()> {
        let d = self.dnode(io, object)?;
        let mut di = d.inner.lock();
        if di.current.is_none() {
            return Err(Error::NotFound(format!("object {object}")));
        }
        self.save(&d, &di);
        let Some(cur) = di.current.as_mut() else { unreachable!("checked above") };
        if let Some(b) = &data {
            if b.len() != cur.data_block_bytes as usize {
                return Err(Error::invalid(format!("object {object}: a block of {} bytes, not {}", b.len(), cur.data_block_bytes)));
            }
            if blkid >= cur.shape().capacity(super::dnode::MAX_NLEVELS) {
                return Err(Error::invalid(format!("object {object}: block {blkid} is beyond what it can hold")));
            }
            if blkid > 0 && !cur.data_block_bytes.is_power_of_two() {
                return Err(Error::invalid(format!("object {object}: a second block needs a power-of-two block size")));
            }
            if blkid > cur.maxblkid {
                cur.maxblkid = blkid;
                di.changed_in(txg);
            }
        }
        debug_assert!(di.dirty.len() <= MAX_DIRTY_TXGS, "a dnode dirty in more than {MAX_DIRTY_TXGS} txgs");
        di.dirty.entry(txg).or_default().blocks.insert(blkid, data);
        di.change_gen += 1;
        drop(di);
        if object != 0 {
            self.note_dirty(txg, object);
        }
        Ok(())
    }
}

/// A failed sync attempt, undone.
impl Objset {
    /// A sync attempt of `txg` begins: until [`Objset::sync_end`] or
    /// [`Objset::sync_abort`], every dnode it changes (its syncs, and the changes the
    /// syncing thread makes between passes) is kept as it was, and so is the objset
    /// block. Several [`Objset::sync`] passes may run within one attempt.
    pub fn sync_begin(&self, txg: Txg) {
        let undo = {
            let i = self.inner.lock();
            SyncUndo { txg, phys: i.phys.clone(), zil_header: i.zil_header, dirty_set: i.dirty.get(&txg).cloned(), alloc_hint: i.alloc_hint, saved: HashMap::new() }
        };
        let mut u = self.undo.lock();
        assert!(u.is_none(), "a sync attempt of txg {txg} begins while another runs");
        *u = Some(undo);
        self.undo_active.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The attempt's txg is committed: what it changed stays.
    pub fn sync_end(&self, txg: Txg) {
        self.undo_active.store(false, std::sync::atomic::Ordering::Release);
        let undo = self.undo.lock().take();
        assert!(undo.is_some_and(|u| u.txg == txg), "sync_end of txg {txg} without its sync_begin");
    }

    /// The attempt failed: every dnode it changed, and the objset block, are put back as
    /// they were at [`Objset::sync_begin`]. A dnode that open context changed for a
    /// later txg meanwhile keeps that change; only its tree, synced state and records of
    /// the attempt's txg go back.
    pub fn sync_abort(&self, txg: Txg) {
        self.undo_active.store(false, std::sync::atomic::Ordering::Release);
        let undo = self.undo.lock().take().filter(|u| u.txg == txg).unwrap_or_else(|| panic!("sync_abort of txg {txg} without its sync_begin"));
        let undo = {
            let mut i = self.inner.lock();
            i.phys = undo.phys.clone();
            i.zil_header = undo.zil_header;
            i.alloc_hint = undo.alloc_hint;
            match &undo.dirty_set {
                Some(set) => i.dirty.insert(txg, set.clone()),
                None => i.dirty.remove(&txg),
            };
            undo
        };
        for (object, s) in undo.saved {
            let mut di = s.dnode.inner.lock();
            di.synced = s.synced;
            match s.records {
                Some(r) => di.dirty.insert(txg, r),
                None => di.dirty.remove(&txg),
            };
            let newer = di.dirty.keys().any(|t| *t > txg);
            match (newer, di.current.as_mut(), s.current) {
                (false, _, saved) => di.current = saved,
                (true, Some(cur), Some(saved)) if cur.generation == saved.generation => {
                    (cur.nlevels, cur.blkptr, cur.used_bytes) = (saved.nlevels, saved.blkptr, saved.used_bytes);
                }
                _ => {}
            }
            di.change_gen += 1;
            drop(di);
            if object != 0 {
                self.inner.lock().dnodes.insert(object, s.dnode);
            }
        }
    }

    /// Keep `d` as it is now, if a sync attempt runs and has not kept it yet (`di` is
    /// its locked state).
    fn save(&self, d: &Arc<Dnode>, di: &DnodeInner) {
        if !self.undo_active.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut u = self.undo.lock();
        let Some(undo) = u.as_mut() else { return };
        let txg = undo.txg;
        undo.saved.entry(d.object).or_insert_with(|| SavedDnode { dnode: d.clone(), synced: di.synced.clone(), current: di.current.clone(), records: di.dirty.get(&txg).cloned() });
    }
}

/// The result of syncing an objset in a txg.
pub struct Synced {
    /// The new objset block.
    pub bp: BlockPointer,
    /// Objects whose dnodes were written.
    pub dnodes_written: u64,
}

impl Objset {
    /// Write everything `txg` changed (the oldest unsynced txg) and the objset block;
    /// its pointer is the new root. `None` when nothing changed in `txg`.
    pub fn sync(&self, io: &dyn BlockIo, txg: Txg) -> Result<Option<Synced>> {
        assert_eq!(io.txg(), txg, "syncing an objset in another txg than the pipeline's");
        let objects = {
            let i = self.inner.lock();
            if let Some((&oldest, _)) = i.dirty.first_key_value() {
                assert!(oldest >= txg, "txg {txg} synced before txg {oldest}");
            }
            match i.dirty.get(&txg) {
                None => return Ok(None),
                Some(set) => set.clone(),
            }
        };
        let mut changed: Vec<(u64, Option<DnodePhys>)> = Vec::with_capacity(objects.len());
        self.save(&self.meta, &self.meta.inner.lock());
        for &object in &objects {
            let d = self.dnode(io, object)?;
            self.save(&d, &d.inner.lock());
            changed.push((object, sync_dnode(io, &d, txg)?));
        }
        self.patch_dnode_blocks(io, txg, &changed)?;
        let meta = sync_dnode(io, &self.meta, txg)?.expect("meta-dnode");
        let mut i = self.inner.lock();
        let zil = match i.zil_header {
            Some((t, h)) if t <= txg => {
                i.zil_header = None;
                h
            }
            _ => i.phys.zil_header,
        };
        let phys = ObjsetPhys { objset_type: i.phys.objset_type, zil_header: zil, meta_dnode: meta };
        let spec = BlockSpec { kind: blkptr::KIND_OBJSET, level: 0, fill: phys.meta_dnode.fill().max(1), checksum: ChecksumAlgo::Fletcher4, compression: Compression::Lz4 };
        let bp = io.write(Arc::new(AlignedBuf::from(&phys.encode()[..])), spec)?;
        i.phys = phys;
        i.dirty.remove(&txg);
        drop(i);
        for (object, phys) in &changed {
            self.retire(io, txg, *object)?;
            if phys.is_none() {
                // free on disk now: the allocator looks there again
                let mut i = self.inner.lock();
                i.alloc_hint = i.alloc_hint.min(object / DNODES_PER_BLOCK);
            }
        }
        self.retire_meta(txg);
        self.drop_clean_dnodes();
        Ok(Some(Synced { bp, dnodes_written: changed.len() as u64 }))
    }

    /// The changed dnodes of `txg` patched into their dnode blocks: dirty blocks of the
    /// meta-dnode in `txg`, each with its new fill.
    fn patch_dnode_blocks(&self, io: &dyn BlockIo, txg: Txg, changed: &[(u64, Option<DnodePhys>)]) -> Result<()> {
        let mut i = 0;
        while i < changed.len() {
            let blkid = changed[i].0 / DNODES_PER_BLOCK;
            let j = i + changed[i..].iter().take_while(|c| c.0 / DNODES_PER_BLOCK == blkid).count();
            let mut block = match self.read_block(io, 0, blkid)? {
                Some(b) => b.to_vec(),
                None => vec![0u8; DNODE_BLOCK_BYTES as usize],
            };
            for (object, phys) in &changed[i..j] {
                let o = (object % DNODES_PER_BLOCK) as usize * DNODE_BYTES;
                let bytes = phys.as_ref().map_or([0u8; DNODE_BYTES], |p| p.encode());
                block[o..o + DNODE_BYTES].copy_from_slice(&bytes);
            }
            let all_free = block.iter().all(|&x| x == 0);
            self.write_block(io, txg, 0, blkid, (!all_free).then(|| Arc::new(AlignedBuf::from(&block[..]))))?;
            i = j;
        }
        Ok(())
    }

    /// After `txg` synced: drop its records of `object` (its tree now holds them).
    fn retire(&self, io: &dyn BlockIo, txg: Txg, object: u64) -> Result<()> {
        self.dnode(io, object)?.inner.lock().dirty.remove(&txg);
        Ok(())
    }

    fn retire_meta(&self, txg: Txg) {
        self.meta.inner.lock().dirty.remove(&txg);
    }

    /// Drop clean dnodes nobody holds beyond [`CLEAN_DNODES_MAX`].
    fn drop_clean_dnodes(&self) {
        let mut i = self.inner.lock();
        if i.dnodes.len() <= CLEAN_DNODES_MAX {
            return;
        }
        let excess = i.dnodes.len() - CLEAN_DNODES_MAX;
        let victims: Vec<u64> = i.dnodes.iter().filter(|(_, d)| Arc::strong_count(d) == 1 && d.is_clean()).map(|(&o, _)| o).take(excess).collect();
        for o in victims {
            i.dnodes.remove(&o);
        }
    }
}

/// Sync `d`'s records of `txg`: write its blocks, apply them to its tree, and return
/// its dnode as of `txg` (`None`: free), which becomes its synced phys.
fn sync_dnode(io: &dyn BlockIo, d: &Dnode, txg: Txg) -> Result<Option<DnodePhys>> {
    let (synced, freed, blocks, snapshot, adopted) = {
        let di = d.inner.lock();
        let Some(r) = di.dirty.get(&txg) else { return Ok(di.synced.clone()) };
        (di.synced.clone(), r.freed, r.blocks.clone(), r.phys.clone(), r.adopted.clone())
    };
    if freed {
        if let Some(old) = &synced {
            free_tree(io, old)?;
        }
    }
    // what txg leaves: its snapshot when it changed the dnode, else the synced dnode
    let base = match snapshot {
        Some(p) => p,
        None if freed => None,
        None => synced.clone(),
    };
    let Some(mut phys) = base else {
        d.inner.lock().synced = None;
        return Ok(None);
    };
    // the tree as synced, unless the object is new in txg
    let from = synced.as_ref().filter(|s| !freed && s.generation == phys.generation);
    let (nlevels, roots, used) = match (&adopted, from) {
        (Some((n, r, u, _)), _) => (*n, r.clone(), *u),
        (None, Some(s)) => (s.nlevels, s.blkptr.clone(), s.used_bytes),
        (None, None) => (1, vec![BlockPointer::hole(); phys.nblkptr as usize], 0),
    };
    let shape = phys.shape();
    let mut changes = Vec::with_capacity(blocks.len());
    for (blkid, data) in blocks {
        let bp = match data {
            None => BlockPointer::hole(),
            Some(b) => {
                let spec = data_spec(&phys, &shape, &b);
                io.write(b, spec)?
            }
        };
        changes.push((blkid, bp));
    }
    let applied = object_tree::apply(io, &Tree { shape, nlevels, roots: &roots }, &changes)?;
    phys.nlevels = applied.nlevels;
    phys.blkptr = applied.roots;
    phys.used_bytes = u64::try_from(used as i64 + applied.used_delta).map_err(|_| Error::Corrupt(format!("object {}: used bytes below zero", d.object)))?;
    // the highest block the tree has held (a block written and freed in one txg never was)
    let highest = changes.iter().rev().find(|c| !c.1.is_hole()).map_or(0, |c| c.0);
    phys.maxblkid = match &adopted {
        Some((.., maxblkid)) => *maxblkid,
        None => highest.max(from.map_or(0, |s| s.maxblkid)),
    };
    phys.check().map_err(|e| Error::Corrupt(format!("object {} after txg {txg}: {e}", d.object)))?;
    let mut di = d.inner.lock();
    // open context's dnode carries the tree it reads through
    if let Some(cur) = di.current.as_mut().filter(|c| c.generation == phys.generation) {
        (cur.nlevels, cur.blkptr, cur.used_bytes) = (phys.nlevels, phys.blkptr.clone(), phys.used_bytes);
        cur.maxblkid = cur.maxblkid.max(phys.maxblkid);
    }
    di.synced = Some(phys.clone());
    Ok(Some(phys))
}

/// How a data block of `phys` is written: a dnode block's fill is its allocated dnodes.
fn data_spec(phys: &DnodePhys, shape: &Shape, data: &[u8]) -> BlockSpec {
    let checksum = ChecksumAlgo::from_code(phys.checksum_code).unwrap_or(ChecksumAlgo::Fletcher4);
    let compression = Compression::from_code(phys.compression_code).unwrap_or(Compression::Lz4);
    if shape.data_kind == blkptr::KIND_DNODE {
        return dnode_block_spec(data.chunks_exact(DNODE_BYTES).filter(|d| d[0] != 0).count() as u64);
    }
    BlockSpec { kind: shape.data_kind, level: 0, fill: 1, checksum, compression }
}

/// Free every block of an object's tree (post-order).
fn free_tree(io: &dyn BlockIo, phys: &DnodePhys) -> Result<()> {
    let mut bps = Vec::new();
    Tree { shape: phys.shape(), nlevels: phys.nlevels, roots: &phys.blkptr }.visit_post_order(io, &mut |bp, _| {
        bps.push(*bp);
        Ok(())
    })?;
    for bp in &bps {
        io.free(bp);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
