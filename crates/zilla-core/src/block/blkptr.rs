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
        if b.len() < Self::SIZE {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let birth = Txg(u64_at(56));
        if birth.is_zero() {
            return if b[..Self::SIZE].iter().all(|&x| x == 0) { Some(BlockPointer::hole()) } else { None };
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
        if bp.dva[0].is_empty() || bp.checksum_algo().is_none() || bp.compression().is_none() {
            return None;
        }
        if bp.lsize == 0 || bp.lsize > (16 << 20) || bp.psize > bp.dva[0].asize || bp.dva[0].asize % 512 != 0 {
            return None;
        }
        // every further copy holds the same physical bytes: same allocated size
        if bp.dva[1..].iter().any(|d| !d.is_empty() && d.asize != bp.dva[0].asize) {
            return None;
        }
        Some(bp)
    }
}

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
