//! Block pointers: 128 bytes, little-endian.
//!
//! ```text
//!  off size field
//!    0  16  dva[0]   { vdev u32, asize u32, offset u64 }  offset within the data area
//!   16  16  dva[1]   (ditto copy of metadata on another top-level vdev, or zero)
//!   32  16  dva[2]   (zero; reserved for copies=3)
//!   48   4  lsize    logical bytes
//!   52   4  psize    physical (compressed) bytes before padding
//!   56   8  birth    txg in which this block was written; 0 = hole
//!   64   8  fill     L0: 1 for data; indirect/MOS: number of non-hole L0 blocks below
//!   72   1  checksum algorithm (0 off, 1 fletcher4, 2 blake3, 3 sha256)
//!   73   1  compression (0 off, 1 lz4, 0x80|level zstd)
//!   74   1  type     (0 none, 1 volume data, 2 indirect, 3 MOS index, 4 MOS chunk;
//!                    format 2: 5 objset, 6 dnode block, 7 metadata object data)
//!   75   1  level    (0 = data)
//!   76   4  reserved
//!   80  32  checksum of the asize bytes on disk
//!  112  16  reserved (zero)
//! ```
//! A hole is 128 zero bytes.

use super::checksum::{ChecksumAlgo, Checksum};
use super::compress::Compression;
use crate::{Txg, VdevId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Dva {
    pub vdev: VdevId,
    pub asize: u32,
    pub offset: u64,
}

impl Dva {
    pub fn is_empty(&self) -> bool {
        self.asize == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockPointer {
    pub dva: [Dva; 3],
    pub lsize: u32,
    pub psize: u32,
    pub birth: Txg,
    pub fill: u64,
    pub checksum_code: u8,
    pub compression_code: u8,
    pub kind: u8,
    pub level: u8,
    pub checksum: Checksum,
}

pub const KIND_DATA: u8 = 1;
pub const KIND_INDIRECT: u8 = 2;
pub const KIND_MOS_INDEX: u8 = 3;
pub const KIND_MOS_CHUNK: u8 = 4;
/// Format 2 (docs/on-disk-format.md §13): an objset block.
pub const KIND_OBJSET: u8 = 5;
/// Format 2: a block of 32 dnodes (a meta-dnode's data).
pub const KIND_DNODE: u8 = 6;
/// Format 2: a metadata object's data block (ZAP, space map, free list, ...).
pub const KIND_METADATA: u8 = 7;
/// The highest kind a block pointer may have.
pub const KIND_MAX: u8 = KIND_METADATA;

impl BlockPointer {
    pub const SIZE: usize = 128;

    pub fn hole() -> BlockPointer {
        BlockPointer::default()
    }
    pub fn is_hole(&self) -> bool {
        self.birth.is_zero()
    }
    pub fn checksum_algo(&self) -> Option<ChecksumAlgo> {
        ChecksumAlgo::from_code(self.checksum_code)
    }
    pub fn compression(&self) -> Option<Compression> {
        Compression::from_code(self.compression_code)
    }
    pub fn copies(&self) -> impl Iterator<Item = &Dva> {
        self.dva.iter().filter(|d| !d.is_empty())
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        if self.is_hole() {
            return b;
        }
        for (i, d) in self.dva.iter().enumerate() {
            let o = i * 16;
            b[o..o + 4].copy_from_slice(&d.vdev.get().to_le_bytes());
            b[o + 4..o + 8].copy_from_slice(&d.asize.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&d.offset.to_le_bytes());
        }
        b[48..52].copy_from_slice(&self.lsize.to_le_bytes());
        b[52..56].copy_from_slice(&self.psize.to_le_bytes());
        b[56..64].copy_from_slice(&self.birth.get().to_le_bytes());
        b[64..72].copy_from_slice(&self.fill.to_le_bytes());
        b[72] = self.checksum_code;
        b[73] = self.compression_code;
        b[74] = self.kind;
        b[75] = self.level;
        b[80..112].copy_from_slice(&self.checksum);
        b
    }

    /// Decode; `None` if the bytes cannot be a block pointer (untrusted input).
    /// [`BlockPointer::check`] says why.
    #[inline]
    pub fn decode(b: &[u8]) -> Option<BlockPointer> {
        // every read of a cached block decodes its pointer: the limits are tested in one
        // predicate, and only a pointer that fails them pays for the field's name
        let b: &[u8; Self::SIZE] = b.get(..Self::SIZE)?.try_into().ok()?;
        let (bp, reserved) = Self::fields_of(b);
        if bp.birth.is_zero() {
            return (*b == [0u8; Self::SIZE]).then(BlockPointer::hole);
        }
        bp.fields_ok(reserved.0, reserved.1).then_some(bp)
    }

    /// Decode untrusted bytes, or say which field is impossible and its value. Every
    /// limit is in docs/on-disk-format.md §3: a pointer that passes can be read
    /// without allocating more than [`MAX_ASIZE`] bytes; whether its vdev exists and its
    /// offset is within that vdev is checked where the pool is known (the read fails
    /// with an I/O error naming the block).
    #[inline]
    pub fn check(b: &[u8]) -> Result<BlockPointer, String> {
        match Self::decode(b) {
            Some(bp) => Ok(bp),
            None => Err(Self::why_not(b)),
        }
    }

    /// Why [`BlockPointer::decode`] refused `b`: the first field out of range.
    #[cold]
    fn why_not(b: &[u8]) -> String {
        let Some(b) = b.get(..Self::SIZE).and_then(|b| <&[u8; Self::SIZE]>::try_from(b).ok()) else {
            return format!("{} bytes, not {}", b.len(), Self::SIZE);
        };
        let (bp, reserved) = Self::fields_of(b);
        if bp.birth.is_zero() {
            return match b.iter().position(|&x| x != 0) {
                Some(at) => format!("field birth = 0 (a hole) with byte {at} = {:#x}", b[at]),
                None => "a hole, which was refused (a bug)".into(),
            };
        }
        match bp.check_fields(reserved.0, reserved.1) {
            Err(why) => why,
            Ok(()) => format!("refused although every field is in range (a bug): {bp:?}"),
        }
    }

    /// The fields of `b` as they are, and its reserved words (offset 76, and 112 | 120).
    #[inline(always)]
    fn fields_of(b: &[u8; Self::SIZE]) -> (BlockPointer, (u32, u64)) {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let dva_at = |o: usize| Dva { vdev: VdevId(u32_at(o)), asize: u32_at(o + 4), offset: u64_at(o + 8) };
        let bp = BlockPointer {
            dva: [dva_at(0), dva_at(16), dva_at(32)],
            lsize: u32_at(48),
            psize: u32_at(52),
            birth: Txg(u64_at(56)),
            fill: u64_at(64),
            checksum_code: b[72],
            compression_code: b[73],
            kind: b[74],
            level: b[75],
            checksum: b[80..112].try_into().unwrap(),
        };
        (bp, (u32_at(76), u64_at(112) | u64_at(120)))
    }

    /// [`BlockPointer::check_fields`] as one predicate (no early exits, no message): the
    /// same limits, the same answer (a property test holds the two together).
    #[inline(always)]
    fn fields_ok(&self, reserved_76: u32, reserved_112: u64) -> bool {
        let [d0, d1, d2] = self.dva;
        // every copy holds the same physical bytes: one allocated size; an unused copy is
        // all zero
        let copy_ok = |d: Dva| {
            if d.asize == 0 {
                (d.vdev.get() == 0) & (d.offset == 0)
            } else {
                (d.asize == d0.asize) & (d.offset % 512 == 0) & (d.offset <= MAX_OFFSET - d0.asize as u64)
            }
        };
        let raw = self.compression_code == Compression::Off.code();
        self.birth.is_valid_on_disk()
            & (d0.asize != 0)
            & (d0.asize % 512 == 0)
            & (d0.asize <= MAX_ASIZE)
            & (d0.offset % 512 == 0)
            & (d0.offset <= MAX_OFFSET - d0.asize as u64)
            & copy_ok(d1)
            & copy_ok(d2)
            & ChecksumAlgo::from_code(self.checksum_code).is_some()
            & Compression::from_code(self.compression_code).is_some()
            & (KIND_DATA..=KIND_MAX).contains(&self.kind)
            & (self.level <= MAX_LEVEL)
            & (self.lsize != 0)
            & (self.lsize <= MAX_LSIZE)
            & ((reserved_76 as u64 | reserved_112) == 0)
            & (self.psize <= d0.asize)
            & if raw { self.psize == self.lsize } else { (self.psize != 0) & (self.psize <= self.lsize) }
    }

    /// The limits of [`BlockPointer::check`] on a decoded non-hole pointer, naming the
    /// first field out of range.
    fn check_fields(&self, reserved_76: u32, reserved_112: u64) -> Result<(), String> {
        let bad = |field: &str, v: u64| Err(format!("field {field} = {v} is out of range"));
        if !self.birth.is_valid_on_disk() {
            return bad("birth", self.birth.get());
        }
        if self.dva[0].is_empty() {
            return bad("dva[0].asize", 0);
        }
        if self.checksum_algo().is_none() {
            return bad("checksum", self.checksum_code as u64);
        }
        if self.compression().is_none() {
            return bad("compression", self.compression_code as u64);
        }
        if !(KIND_DATA..=KIND_MAX).contains(&self.kind) {
            return bad("kind", self.kind as u64);
        }
        if self.level > MAX_LEVEL {
            return bad("level", self.level as u64);
        }
        if self.lsize == 0 || self.lsize > MAX_LSIZE {
            return bad("lsize", self.lsize as u64);
        }
        if reserved_76 != 0 || reserved_112 != 0 {
            return bad("reserved", reserved_76 as u64 | reserved_112);
        }
        // an unused copy is all zero
        for (i, d) in self.dva.iter().enumerate().filter(|(_, d)| d.is_empty()) {
            if d.vdev.get() != 0 || d.offset != 0 {
                return bad(&format!("dva[{i}].{}", if d.offset != 0 { "offset" } else { "vdev" }), d.offset.max(d.vdev.get() as u64));
            }
        }
        for (i, d) in self.dva.iter().enumerate().filter(|(_, d)| !d.is_empty()) {
            // every further copy holds the same physical bytes: same allocated size
            if d.asize % 512 != 0 || d.asize > MAX_ASIZE || d.asize != self.dva[0].asize {
                return bad(&format!("dva[{i}].asize"), d.asize as u64);
            }
            if d.offset % 512 != 0 || d.offset.checked_add(d.asize as u64).map_or(true, |end| end > MAX_OFFSET) {
                return bad(&format!("dva[{i}].offset"), d.offset);
            }
        }
        // stored raw, the physical bytes are the logical ones; compressed, they are fewer
        let raw = self.compression_code == Compression::Off.code();
        if self.psize > self.dva[0].asize || (raw && self.psize != self.lsize) || (!raw && (self.psize == 0 || self.psize > self.lsize)) {
            return bad("psize", self.psize as u64);
        }
        Ok(())
    }
}

/// Largest logical size of a block (volume blocks are at most 128 KiB; the format
/// leaves room).
pub const MAX_LSIZE: u32 = 16 << 20;
/// Largest allocated size of a block: what one read of a block may allocate.
pub const MAX_ASIZE: u32 = 16 << 20;
/// DVA offsets (plus the block's size) stay below 2^56 bytes (64 PiB), the largest
/// vdev the format addresses.
pub const MAX_OFFSET: u64 = 1 << 56;
/// Highest block level (a volume tree has at most 8 levels, 0..=7).
pub const MAX_LEVEL: u8 = 7;

#[cfg(test)]
mod tests {
    use super::*;

    /// The second and third copies hold the same bytes as the first: a pointer whose
    /// copies claim different sizes is corrupt (a crafted asize could make a reader
    /// allocate or read far more than the block).
    #[test]
    fn copies_with_another_asize_are_refused() {
        let mut bp = BlockPointer::hole();
        bp.birth = Txg(7);
        bp.lsize = 4096;
        bp.psize = 4096;
        bp.dva[0] = Dva { vdev: VdevId(0), asize: 4096, offset: 1 << 20 };
        bp.dva[1] = Dva { vdev: VdevId(1), asize: 4096, offset: 1 << 20 };
        bp.checksum_code = 1;
        bp.compression_code = 0;
        bp.kind = KIND_DATA;
        assert!(BlockPointer::decode(&bp.encode()).is_some(), "a well-formed pointer");
        bp.dva[1].asize = 1 << 30;
        assert!(BlockPointer::decode(&bp.encode()).is_none(), "second copy with a different asize accepted");
    }
    /// Set field `f` (0..17) of `bp` to `v`.
    fn set_field(bp: &mut BlockPointer, f: usize, v: u64) {
        match f {
            0..=8 => {
                let d = &mut bp.dva[f / 3];
                match f % 3 {
                    0 => d.vdev = VdevId(v as u32),
                    1 => d.asize = v as u32,
                    _ => d.offset = v,
                }
            }
            9 => bp.lsize = v as u32,
            10 => bp.psize = v as u32,
            11 => bp.birth = Txg(v.max(1)),
            12 => bp.fill = v,
            13 => bp.checksum_code = v as u8,
            14 => bp.compression_code = v as u8,
            15 => bp.kind = v as u8,
            _ => bp.level = v as u8,
        }
    }

    /// The one-pass predicate and the field-naming check agree: every pair of fields set
    /// to every pair of boundary values, from well-formed pointers with one, two and three
    /// copies, raw and lz4.
    #[test]
    fn fields_ok_agrees_with_check_fields() {
        let values = [
            0u64, 1, 2, 3, 4, 7, 0x81, 0xff, 511, 512, 2048, 4096, 4097, 8192, MAX_ASIZE as u64, MAX_ASIZE as u64 + 512, MAX_LSIZE as u64 + 1,
            u32::MAX as u64, 1 << 20, MAX_OFFSET - 4096, MAX_OFFSET - 512, MAX_OFFSET, Txg::LIMIT.get() - 1, Txg::LIMIT.get(), u64::MAX - 511, u64::MAX,
        ];
        let mut bases = vec![];
        for copies in 1..=3 {
            for lz4 in [false, true] {
                let mut bp = BlockPointer::hole();
                for c in 0..copies {
                    bp.dva[c] = Dva { vdev: VdevId(c as u32), asize: 4096, offset: (c as u64 + 1) << 20 };
                }
                (bp.lsize, bp.psize, bp.birth, bp.fill) = (4096, if lz4 { 2048 } else { 4096 }, Txg(9), 1);
                (bp.checksum_code, bp.compression_code, bp.kind, bp.level) = (1, lz4 as u8, KIND_DATA, 0);
                assert!(bp.check_fields(0, 0).is_ok() && bp.fields_ok(0, 0), "base {bp:?}");
                bases.push(bp);
            }
        }
        let (mut checked, mut refused) = (0, 0);
        for base in &bases {
            for f in 0..17 {
                for g in f..17 {
                    for &v in &values {
                        for &w in &values {
                            let mut bp = *base;
                            set_field(&mut bp, f, v);
                            set_field(&mut bp, g, w);
                            for reserved in [(0u32, 0u64), (1, 0), (0, 1 << 63)] {
                                let slow = bp.check_fields(reserved.0, reserved.1).is_ok();
                                assert_eq!(bp.fields_ok(reserved.0, reserved.1), slow, "{bp:?} reserved {reserved:?}");
                                checked += 1;
                                refused += usize::from(!slow);
                            }
                        }
                    }
                }
            }
        }
        // the cases exercise both answers
        assert!(refused > checked / 4 && refused < checked, "{refused} of {checked} refused");
    }

    #[test]
    fn roundtrip() {
        let bp = BlockPointer {
            dva: [Dva { vdev: VdevId(1), asize: 16384, offset: 1 << 20 }, Dva::default(), Dva::default()],
            lsize: 16384,
            psize: 16384,
            birth: Txg(42),
            fill: 1,
            checksum_code: 1,
            compression_code: 0,
            kind: KIND_DATA,
            level: 0,
            checksum: [9; 32],
        };
        assert_eq!(BlockPointer::decode(&bp.encode()), Some(bp));
        assert_eq!(BlockPointer::decode(&[0u8; 128]), Some(BlockPointer::hole()));
        let mut junk = [0u8; 128];
        junk[3] = 1;
        assert_eq!(BlockPointer::decode(&junk), None);
    }
}
