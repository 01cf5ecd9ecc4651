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
//!   74   1  type     (0 none, 1 volume data, 2 indirect, 3 MOS index, 4 MOS chunk)
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
    pub fn decode(b: &[u8]) -> Option<BlockPointer> {
        Self::check(b).ok()
    }

    /// Decode untrusted bytes, or say which field is impossible and its value. Every
    /// limit is in docs/on-disk-format.md §3: a pointer that passes can be read
    /// without allocating more than [`MAX_ASIZE`] bytes; whether its vdev exists and its
    /// offset is within that vdev is checked where the pool is known (the read fails
    /// with an I/O error naming the block).
    pub fn check(b: &[u8]) -> Result<BlockPointer, String> {
        if b.len() < Self::SIZE {
            return Err(format!("{} bytes, not {}", b.len(), Self::SIZE));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let birth = Txg(u64_at(56));
        if birth.is_zero() {
            return match b[..Self::SIZE].iter().position(|&x| x != 0) {
                None => Ok(BlockPointer::hole()),
                Some(at) => Err(format!("field birth = 0 (a hole) with byte {at} = {:#x}", b[at])),
            };
        }
        let mut dva = [Dva::default(); 3];
        for (i, d) in dva.iter_mut().enumerate() {
            let o = i * 16;
            *d = Dva { vdev: VdevId(u32_at(o)), asize: u32_at(o + 4), offset: u64_at(o + 8) };
        }
        let mut checksum = [0u8; 32];
        checksum.copy_from_slice(&b[80..112]);
        let bp = BlockPointer {
            dva,
            lsize: u32_at(48),
            psize: u32_at(52),
            birth,
            fill: u64_at(64),
            checksum_code: b[72],
            compression_code: b[73],
            kind: b[74],
            level: b[75],
            checksum,
        };
        bp.check_fields(u32_at(76), u64_at(112) | u64_at(120))?;
        Ok(bp)
    }

    /// The limits of [`BlockPointer::check`] on a decoded non-hole pointer.
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
        if !(KIND_DATA..=KIND_MOS_CHUNK).contains(&self.kind) {
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
