//! dnode: the 512-byte description of one object of an objset (format 2).
//!
//! Theory of operation
//! -------------------
//! Every object of an objset (docs/on-disk-format.md §10) is a dnode: its type, the
//! shape of its block tree (data block size, indirect block size, levels, one to three
//! root pointers), the highest block id it ever held, the bytes it has allocated, the
//! txg that allocated it (its generation: a reused object number is told apart by it)
//! and a bonus area for typed attributes. The byte map is §11; the object and bonus
//! types §13. This module is the codec and the limits, nothing more: a dnode read from
//! a device is untrusted, and [`DnodePhys::decode`] names the first field out of range
//! instead of panicking or allocating what a crafted field asks for. The tree geometry
//! a dnode implies ([`Shape`]) is what [`super::object_tree`] walks.

use crate::block::blkptr::{self, BlockPointer};
use crate::Txg;

/// Bytes of one dnode.
pub const DNODE_BYTES: usize = 512;
/// Dnodes per dnode block (16 KiB).
pub const DNODES_PER_BLOCK: u64 = 32;
/// A dnode block's size.
pub const DNODE_BLOCK_BYTES: u32 = (DNODE_BYTES as u64 * DNODES_PER_BLOCK) as u32;
/// Offset of the root block pointers.
const BLKPTR_OFFSET: usize = 64;
/// The most root pointers a dnode holds.
pub const MAX_NBLKPTR: u8 = 3;
/// The bonus area when a dnode has one root pointer (each further pointer takes 128).
pub const MAX_BONUS_BYTES: usize = DNODE_BYTES - BLKPTR_OFFSET - BlockPointer::SIZE;
/// Indirect block sizes: 4 KiB … 128 KiB.
pub const MIN_INDBLKSHIFT: u8 = 12;
pub const MAX_INDBLKSHIFT: u8 = 17;
/// Levels of a tree, level 0 the data.
pub const MAX_NLEVELS: u8 = blkptr::MAX_LEVEL + 1;
/// Object numbers are below 2^48.
pub const MAX_OBJECT: u64 = (1 << 48) - 1;
/// Data block sizes: 512 B … 16 MiB.
pub const MIN_DATA_BLOCK_BYTES: u32 = 512;
pub const MAX_DATA_BLOCK_BYTES: u32 = 16 << 20;

/// An object's type (§13): what its data blocks and bonus hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ObjectType {
    ObjectDirectory = 1,
    U64Array = 2,
    SpaceMap = 3,
    FreeList = 4,
    DestroyQueue = 5,
    DslDir = 6,
    DslChildMap = 7,
    DslProps = 8,
    DslDataset = 9,
    DnodeArray = 10,
    SnapshotMap = 11,
    VolumeData = 12,
    VolumeProps = 13,
    FeatureCounts = 14,
    PoolHistory = 15,
    PoolProps = 16,
    LeafHealth = 17,
    MetaslabArray = 18,
    Bytes = 19,
}

impl ObjectType {
    pub const ALL: [ObjectType; 19] = [
        ObjectType::ObjectDirectory,
        ObjectType::U64Array,
        ObjectType::SpaceMap,
        ObjectType::FreeList,
        ObjectType::DestroyQueue,
        ObjectType::DslDir,
        ObjectType::DslChildMap,
        ObjectType::DslProps,
        ObjectType::DslDataset,
        ObjectType::DnodeArray,
        ObjectType::SnapshotMap,
        ObjectType::VolumeData,
        ObjectType::VolumeProps,
        ObjectType::FeatureCounts,
        ObjectType::PoolHistory,
        ObjectType::PoolProps,
        ObjectType::LeafHealth,
        ObjectType::MetaslabArray,
        ObjectType::Bytes,
    ];

    pub fn from_code(code: u8) -> Option<ObjectType> {
        Self::ALL.iter().copied().find(|t| *t as u8 == code)
    }
    pub fn code(self) -> u8 {
        self as u8
    }
    /// The block pointer kind of the object's data blocks (level 0); `None` for
    /// bonus-only objects, which hold no data blocks.
    pub fn data_kind(self) -> Option<u8> {
        match self {
            ObjectType::DslDir | ObjectType::DslDataset => None,
            ObjectType::DnodeArray => Some(blkptr::KIND_DNODE),
            ObjectType::VolumeData => Some(blkptr::KIND_DATA),
            _ => Some(blkptr::KIND_METADATA),
        }
    }
    /// The bonus type the object carries (0 = none) and its exact length, where fixed.
    pub fn bonus(self) -> (u8, Option<usize>) {
        match self {
            ObjectType::SpaceMap => (3, Some(272)),
            ObjectType::FreeList => (4, Some(16)),
            ObjectType::DestroyQueue => (5, Some(16)),
            ObjectType::DslDir => (6, Some(136)),
            ObjectType::DslDataset => (9, Some(288)),
            ObjectType::PoolHistory => (15, Some(40)),
            ObjectType::MetaslabArray => (18, Some(16)),
            ObjectType::Bytes => (19, Some(8)),
            _ => (0, Some(0)),
        }
    }
    /// Whether the object is a ZAP.
    pub fn is_zap(self) -> bool {
        matches!(
            self,
            ObjectType::ObjectDirectory
                | ObjectType::DslChildMap
                | ObjectType::DslProps
                | ObjectType::SnapshotMap
                | ObjectType::VolumeProps
                | ObjectType::FeatureCounts
                | ObjectType::PoolProps
                | ObjectType::LeafHealth
        )
    }
}

/// The geometry of an object's block tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Indirect blocks are `1 << indblkshift` bytes.
    pub indblkshift: u8,
    /// Root pointers in the dnode.
    pub nblkptr: u8,
    /// Data block size (level 0 `lsize`).
    pub data_block_bytes: u32,
    /// Kind of the level-0 pointers.
    pub data_kind: u8,
    /// The most a level-0 pointer's `fill` may be (dnode blocks: 32; others 1).
    pub data_fill_max: u64,
}

impl Shape {
    /// Block pointers per indirect block.
    pub const fn epb_shift(&self) -> u32 {
        self.indblkshift as u32 - 7
    }
    pub const fn indirect_bytes(&self) -> usize {
        1 << self.indblkshift
    }
    /// Block ids covered by one pointer at `level` (level 0: 1).
    pub fn span(&self, level: u32) -> u64 {
        1u64.checked_shl(self.epb_shift() * level).unwrap_or(u64::MAX)
    }
    /// Block ids a tree of `nlevels` covers: `nblkptr` roots, each spanning its level.
    pub fn capacity(&self, nlevels: u8) -> u64 {
        self.span(nlevels as u32 - 1).saturating_mul(self.nblkptr as u64)
    }
    /// The fewest levels whose tree covers block id `blkid`.
    pub fn levels_for(&self, blkid: u64) -> u8 {
        let mut n = 1u8;
        while self.capacity(n) <= blkid && n < MAX_NLEVELS {
            n += 1;
        }
        n
    }
    /// The most `fill` a pointer at `level` may carry.
    pub fn fill_max(&self, level: u32) -> u64 {
        self.span(level).saturating_mul(self.data_fill_max)
    }
}

/// A dnode as stored (§11). A free slot decodes to `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnodePhys {
    pub object_type: ObjectType,
    pub indblkshift: u8,
    pub nlevels: u8,
    pub nblkptr: u8,
    pub bonus_type: u8,
    pub checksum_code: u8,
    pub compression_code: u8,
    pub data_block_bytes: u32,
    pub maxblkid: u64,
    pub used_bytes: u64,
    pub generation: Txg,
    /// `nblkptr` root pointers, each at level `nlevels − 1`.
    pub blkptr: Vec<BlockPointer>,
    /// `bonus length` bytes.
    pub bonus: Vec<u8>,
}

/// What a caller asks for when it allocates an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSpec {
    pub object_type: ObjectType,
    pub data_block_bytes: u32,
    pub indblkshift: u8,
    pub nblkptr: u8,
    pub checksum_code: u8,
    pub compression_code: u8,
    pub bonus: Vec<u8>,
}

impl ObjectSpec {
    /// A metadata object of `object_type` (fletcher4 + lz4, 16 KiB indirects) with
    /// `data_block_bytes` blocks and a zeroed bonus of its type's length.
    pub fn metadata(object_type: ObjectType, data_block_bytes: u32) -> ObjectSpec {
        let bonus_len = object_type.bonus().1.unwrap_or(0);
        let nblkptr = if bonus_len > MAX_BONUS_BYTES { 1 } else { (1 + (MAX_BONUS_BYTES - bonus_len) / BlockPointer::SIZE).min(MAX_NBLKPTR as usize) as u8 };
        ObjectSpec { object_type, data_block_bytes, indblkshift: 14, nblkptr, checksum_code: 1, compression_code: 1, bonus: vec![0; bonus_len] }
    }
}

impl DnodePhys {
    /// A new object of `spec` allocated in `generation`: one level, no blocks.
    pub fn new(spec: &ObjectSpec, generation: Txg) -> DnodePhys {
        DnodePhys {
            object_type: spec.object_type,
            indblkshift: spec.indblkshift,
            nlevels: 1,
            nblkptr: spec.nblkptr,
            bonus_type: spec.object_type.bonus().0,
            checksum_code: spec.checksum_code,
            compression_code: spec.compression_code,
            data_block_bytes: spec.data_block_bytes,
            maxblkid: 0,
            used_bytes: 0,
            generation,
            blkptr: vec![BlockPointer::hole(); spec.nblkptr as usize],
            bonus: spec.bonus.clone(),
        }
    }

    pub fn shape(&self) -> Shape {
        let data_kind = self.object_type.data_kind().unwrap_or(blkptr::KIND_METADATA);
        let data_fill_max = if self.object_type == ObjectType::DnodeArray { DNODES_PER_BLOCK } else { 1 };
        Shape { indblkshift: self.indblkshift, nblkptr: self.nblkptr, data_block_bytes: self.data_block_bytes, data_kind, data_fill_max }
    }

    /// The largest bonus a dnode with `nblkptr` root pointers holds.
    pub const fn bonus_room(nblkptr: u8) -> usize {
        DNODE_BYTES - BLKPTR_OFFSET - BlockPointer::SIZE * nblkptr as usize
    }

    /// `fill` of the object: its non-hole data blocks (dnode blocks: allocated dnodes).
    pub fn fill(&self) -> u64 {
        self.blkptr.iter().map(|b| b.fill).fold(0u64, u64::saturating_add)
    }

    pub fn encode(&self) -> [u8; DNODE_BYTES] {
        debug_assert!(self.check().is_ok(), "encoding a dnode out of its limits: {:?}", self.check());
        let mut b = [0u8; DNODE_BYTES];
        b[0] = self.object_type.code();
        b[1] = self.indblkshift;
        b[2] = self.nlevels;
        b[3] = self.nblkptr;
        b[4] = self.bonus_type;
        b[5] = self.checksum_code;
        b[6] = self.compression_code;
        b[8..12].copy_from_slice(&self.data_block_bytes.to_le_bytes());
        b[12..14].copy_from_slice(&(self.bonus.len() as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.maxblkid.to_le_bytes());
        b[24..32].copy_from_slice(&self.used_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.generation.get().to_le_bytes());
        for (i, bp) in self.blkptr.iter().enumerate() {
            let o = BLKPTR_OFFSET + i * BlockPointer::SIZE;
            b[o..o + BlockPointer::SIZE].copy_from_slice(&bp.encode());
        }
        let o = BLKPTR_OFFSET + self.blkptr.len() * BlockPointer::SIZE;
        b[o..o + self.bonus.len()].copy_from_slice(&self.bonus);
        b
    }

    /// Decode untrusted bytes: `Ok(None)` for a free slot (all zero), else the dnode
    /// with every limit of §11 checked, or the first field out of range and its value.
    /// `holder_birth` is the birth of the block the dnode was read from: a generation
    /// or a root pointer born after it is impossible.
    pub fn decode(b: &[u8], holder_birth: Txg) -> Result<Option<DnodePhys>, String> {
        let Some(b) = b.get(..DNODE_BYTES) else { return Err(format!("{} bytes, not {DNODE_BYTES}", b.len())) };
        if b[0] == 0 {
            return match b.iter().position(|&x| x != 0) {
                None => Ok(None),
                Some(at) => Err(format!("a free slot with byte {at} = {:#x}", b[at])),
            };
        }
        let bad = |field: &str, v: u64| Err(format!("field {field} = {v} is out of range"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let Some(object_type) = ObjectType::from_code(b[0]) else { return bad("type", b[0] as u64) };
        let nblkptr = b[3];
        if !(1..=MAX_NBLKPTR).contains(&nblkptr) {
            return bad("nblkptr", nblkptr as u64);
        }
        let bonus_len = u16::from_le_bytes([b[12], b[13]]) as usize;
        if bonus_len > Self::bonus_room(nblkptr) {
            return bad("bonus length", bonus_len as u64);
        }
        let mut blkptr = Vec::with_capacity(nblkptr as usize);
        for i in 0..nblkptr as usize {
            let o = BLKPTR_OFFSET + i * BlockPointer::SIZE;
            blkptr.push(BlockPointer::check(&b[o..o + BlockPointer::SIZE]).map_err(|e| format!("root block pointer {i}: {e}"))?);
        }
        let bonus_at = BLKPTR_OFFSET + nblkptr as usize * BlockPointer::SIZE;
        if let Some(at) = b[bonus_at + bonus_len..].iter().position(|&x| x != 0) {
            return bad("padding after the bonus", (bonus_at + bonus_len + at) as u64);
        }
        if b[7] != 0 || u16::from_le_bytes([b[14], b[15]]) != 0 || b[40..64].iter().any(|&x| x != 0) {
            return bad("reserved", 1);
        }
        let d = DnodePhys {
            object_type,
            indblkshift: b[1],
            nlevels: b[2],
            nblkptr,
            bonus_type: b[4],
            checksum_code: b[5],
            compression_code: b[6],
            data_block_bytes: u32_at(8),
            maxblkid: u64_at(16),
            used_bytes: u64_at(24),
            generation: Txg(u64_at(32)),
            blkptr,
            bonus: b[bonus_at..bonus_at + bonus_len].to_vec(),
        };
        d.check()?;
        if d.generation > holder_birth {
            return Err(format!("field generation = {} is out of range (after the block holding it, {holder_birth})", d.generation));
        }
        for (i, bp) in d.blkptr.iter().enumerate() {
            if bp.birth > holder_birth {
                return Err(format!("root block pointer {i}: field birth = {} is out of range (after the block holding it, {holder_birth})", bp.birth));
            }
        }
        Ok(Some(d))
    }

    /// The limits of §11 on a decoded (or about to be encoded) dnode.
    pub fn check(&self) -> Result<(), String> {
        self.check_attributes()?;
        self.check_tree()
    }

    /// The limits of §11 on everything but the tree (levels, `maxblkid`, roots): what
    /// open context changes, while the tree fields are the last synced ones.
    pub fn check_attributes(&self) -> Result<(), String> {
        let bad = |field: &str, v: u64| Err(format!("field {field} = {v} is out of range"));
        if !(MIN_INDBLKSHIFT..=MAX_INDBLKSHIFT).contains(&self.indblkshift) {
            return bad("indblkshift", self.indblkshift as u64);
        }
        if !(1..=MAX_NLEVELS).contains(&self.nlevels) {
            return bad("nlevels", self.nlevels as u64);
        }
        if !(1..=MAX_NBLKPTR).contains(&self.nblkptr) || self.blkptr.len() != self.nblkptr as usize {
            return bad("nblkptr", self.nblkptr as u64);
        }
        let (bonus_type, bonus_len) = self.object_type.bonus();
        if self.bonus_type != bonus_type {
            return bad("bonus type", self.bonus_type as u64);
        }
        if self.bonus.len() > Self::bonus_room(self.nblkptr) || bonus_len.is_some_and(|l| l != self.bonus.len()) {
            return bad("bonus length", self.bonus.len() as u64);
        }
        if !(1..=3).contains(&self.checksum_code) || (self.object_type != ObjectType::VolumeData && self.checksum_code != 1) {
            return bad("checksum", self.checksum_code as u64);
        }
        if crate::block::compress::Compression::from_code(self.compression_code).is_none() {
            return bad("compression", self.compression_code as u64);
        }
        let dbs = self.data_block_bytes;
        if !dbs.is_multiple_of(512) || !(MIN_DATA_BLOCK_BYTES..=MAX_DATA_BLOCK_BYTES).contains(&dbs) || (self.maxblkid > 0 && !dbs.is_power_of_two()) {
            return bad("data block size", dbs as u64);
        }
        if self.used_bytes >= 1 << 63 {
            return bad("used", self.used_bytes);
        }
        if self.generation.is_zero() || !self.generation.is_valid_on_disk() {
            return bad("generation", self.generation.get());
        }
        Ok(())
    }

    /// The limits of §11 on the tree: levels that cover `maxblkid`, root pointers of
    /// the tree's shape.
    pub fn check_tree(&self) -> Result<(), String> {
        let bad = |field: &str, v: u64| Err(format!("field {field} = {v} is out of range"));
        if !(1..=MAX_NLEVELS).contains(&self.nlevels) {
            return bad("nlevels", self.nlevels as u64);
        }
        let shape = self.shape();
        if self.maxblkid >= shape.capacity(self.nlevels) {
            return bad("maxblkid", self.maxblkid);
        }
        let top = self.nlevels as u32 - 1;
        if self.object_type.data_kind().is_none() && (self.maxblkid != 0 || self.blkptr.iter().any(|b| !b.is_hole())) {
            return Err(format!("a bonus-only object (type {}) with data blocks", self.object_type.code()));
        }
        for (i, bp) in self.blkptr.iter().enumerate() {
            super::object_tree::check_child(bp, &shape, top, Txg::LIMIT).map_err(|e| format!("root block pointer {i}: {e}"))?;
            if !bp.is_hole() && (i as u64).saturating_mul(shape.span(top)) > self.maxblkid {
                return Err(format!("root block pointer {i} lies beyond field maxblkid = {}", self.maxblkid));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::blkptr::Dva;

    fn data_bp(level: u8, kind: u8, lsize: u32, fill: u64, birth: u64) -> BlockPointer {
        BlockPointer {
            dva: [Dva { vdev: crate::VdevId(0), asize: 4096, offset: 8192 }, Dva::default(), Dva::default()],
            lsize,
            psize: lsize.min(4096),
            birth: Txg(birth),
            fill,
            checksum_code: 1,
            compression_code: 1,
            kind,
            level,
            checksum: [7; 32],
        }
    }

    fn sample() -> DnodePhys {
        let mut d = DnodePhys::new(&ObjectSpec::metadata(ObjectType::SpaceMap, 16384), Txg(5));
        d.nlevels = 2;
        d.maxblkid = 3;
        d.used_bytes = 8192;
        d.blkptr[0] = data_bp(1, blkptr::KIND_INDIRECT, 16384, 4, 7);
        d.bonus[0] = 0x55;
        d
    }

    #[test]
    fn round_trip_and_free_slot() {
        let d = sample();
        let b = d.encode();
        assert_eq!(DnodePhys::decode(&b, Txg(9)).unwrap(), Some(d.clone()));
        assert_eq!(DnodePhys::decode(&[0u8; DNODE_BYTES], Txg(9)).unwrap(), None);
        // born after the block that holds it
        assert!(DnodePhys::decode(&b, Txg(6)).unwrap_err().contains("birth"));
        assert!(DnodePhys::decode(&b, Txg(4)).unwrap_err().contains("generation"));
    }

    #[test]
    fn every_byte_flipped_is_refused_or_still_in_limits() {
        let good = sample().encode();
        for at in 0..DNODE_BYTES {
            for bit in 0..8 {
                let mut b = good;
                b[at] ^= 1 << bit;
                // never a panic; whatever decodes passes its own limits and re-encodes the same
                if let Ok(Some(d)) = DnodePhys::decode(&b, Txg(9)) {
                    assert!(d.check().is_ok());
                    assert_eq!(d.encode(), b, "byte {at} bit {bit}");
                }
            }
        }
    }

    #[test]
    fn limits_name_the_field() {
        let mut b = sample().encode();
        b[1] = 18;
        assert!(DnodePhys::decode(&b, Txg(9)).unwrap_err().contains("indblkshift"));
        let mut b = sample().encode();
        b[2] = 1; // a level-1 root in a one-level tree
        assert!(DnodePhys::decode(&b, Txg(9)).is_err());
        let mut b = sample().encode();
        b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(DnodePhys::decode(&b, Txg(9)).unwrap_err().contains("maxblkid"));
        let mut b = sample().encode();
        b[12] = 0xff;
        assert!(DnodePhys::decode(&b, Txg(9)).unwrap_err().contains("bonus length"));
        let mut b = sample().encode();
        b[0] = 99;
        assert!(DnodePhys::decode(&b, Txg(9)).unwrap_err().contains("type"));
    }

    #[test]
    fn shapes() {
        let s = DnodePhys::new(&ObjectSpec::metadata(ObjectType::U64Array, 16384), Txg(1)).shape();
        assert_eq!(s.nblkptr, 3);
        assert_eq!(s.capacity(1), 3);
        assert_eq!(s.levels_for(2), 1);
        assert_eq!(s.levels_for(3), 2);
        assert_eq!(s.capacity(2), 3 * 128);
        assert_eq!(s.levels_for(3 * 128), 3);
        let meta = Shape { indblkshift: 12, nblkptr: 3, data_block_bytes: DNODE_BLOCK_BYTES, data_kind: blkptr::KIND_DNODE, data_fill_max: 32 };
        assert_eq!(meta.span(1), 32);
        assert_eq!(meta.fill_max(1), 32 * 32);
        assert_eq!(meta.levels_for(u64::MAX), MAX_NLEVELS);
    }
}
