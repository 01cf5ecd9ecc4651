//! zio: the block pipeline — transforms on the way down and up, verified reads with
//! self-heal, allocation in syncing context, and the writes of a txg.
//!
//! Theory of operation
//! -------------------
//! A block travels down as logical bytes and is transformed on its way to the vdevs:
//!
//! ```text
//!  write: logical (lsize) ─compress?→ physical (psize) ─pad to 1<<ashift→ allocated (asize)
//!         ─checksum over the asize bytes→ block pointer {dva, lsize, psize, birth, cksum}
//!         ─allocate copies (metaslab)→ SyncWriter: sorted, merged runs → mirror writes
//!  read:  ARC hit? ─else→ asize bytes from a child ─verify cksum (per child, in the
//!         mirror)→ rewrite bad children / lost ditto copies ─decompress psize→ lsize → ARC
//! ```
//!
//! The checksum lives in the parent's block pointer (Merkle tree up to the uberblock), so
//! a child's copy can be judged on its own: the mirror tries the next child when a copy
//! fails. Blocks with no parent (labels, uberblocks) use embedded checksums instead
//! (vdev::label). The block format itself (block pointers, checksum and compression
//! codes) is the lower `block` module; this module adds the I/O: [`prepare`] and
//! [`finish_read`] are the transforms, [`PoolIo`] (pool_io.rs) the reads and writes
//! through the vdev tree, the allocators and the ARC, and `workers` the bounded pool of
//! threads that prepare a txg's blocks.

pub mod pool_io;
pub mod workers;

pub use pool_io::{PendingWrite, PoolIo, SyncWriter};

use crate::vdev::abd::AlignedBuf;
use crate::block::blkptr::BlockPointer;
use crate::block::checksum::{self, ChecksumAlgo, Checksum};
use crate::block::compress::{self, Compression};

/// The smallest allocation unit (ashift 12); a pool's unit is `1 << ashift` of its
/// largest-ashift data vdev ([`crate::dmu::PoolIo::alloc_unit`]), so a block never
/// shares a physical sector with another.
pub const ALLOC_UNIT: u64 = 4096;

pub fn round_up(n: u64, unit: u64) -> u64 {
    n.div_ceil(unit) * unit
}

/// A block ready to be allocated and written. `data` shares the caller's buffer when no
/// transform was needed (uncompressed and already a multiple of the allocation unit).
pub struct PreparedBlock {
    pub data: std::sync::Arc<AlignedBuf>,
    pub lsize: u32,
    pub psize: u32,
    pub compression: Compression,
    pub algo: ChecksumAlgo,
    pub checksum: Checksum,
}

impl PreparedBlock {
    pub fn asize(&self) -> u64 {
        self.data.len() as u64
    }
}

/// Compress (if asked and worth it), pad to the allocation unit `unit` (a power of two,
/// at least [`ALLOC_UNIT`]), checksum.
pub fn prepare(logical: &std::sync::Arc<AlignedBuf>, algo: ChecksumAlgo, comp: Compression, unit: u64) -> PreparedBlock {
    let lsize = logical.len() as u32;
    let compressed = match comp {
        Compression::Off => None,
        c => compress::compress(c, logical).map(|z| (z, c)),
    };
    if compressed.is_none() && logical.len() as u64 % unit == 0 {
        let checksum = checksum::compute(algo, logical);
        return PreparedBlock { data: logical.clone(), lsize, psize: lsize, compression: Compression::Off, algo, checksum };
    }
    let (bytes, psize, used): (&[u8], u32, Compression) = match &compressed {
        Some((z, c)) => (z, z.len() as u32, *c),
        None => (logical, lsize, Compression::Off),
    };
    let asize = round_up(bytes.len() as u64, unit) as usize;
    let mut data = AlignedBuf::with_capacity(asize);
    data.extend_from_slice(bytes);
    data.resize(asize);
    let checksum = checksum::compute(algo, &data);
    PreparedBlock { data: std::sync::Arc::new(data), lsize, psize, compression: used, algo, checksum }
}

/// Does `phys` (asize bytes read from a device) match `bp`?
pub fn verify(bp: &BlockPointer, phys: &[u8]) -> bool {
    match bp.checksum_algo() {
        Some(ChecksumAlgo::Off) => true,
        Some(a) => checksum::compute(a, phys) == bp.checksum,
        None => false,
    }
}

/// [`verify`] in the form the mirror's verified reads take (`read_verified`,
/// `scrub_block`): one copy's bytes judged against `bp`.
pub fn verify_copy(bp: &BlockPointer, phys: &[u8]) -> crate::vdev::mirror::VerifyResult {
    use crate::vdev::mirror::VerifyResult;
    if verify(bp, phys) { VerifyResult::Good } else { VerifyResult::Bad }
}

/// Turn verified physical bytes into logical bytes, the buffer the ARC and the callers
/// keep: an uncompressed block is the read buffer itself (its padding cut off, no
/// copy); a compressed one is decompressed into a new buffer.
pub fn finish_read(bp: &BlockPointer, mut phys: AlignedBuf) -> std::io::Result<std::sync::Arc<AlignedBuf>> {
    match bp.compression() {
        Some(Compression::Off) => {
            phys.resize((bp.lsize as usize).min(phys.len()));
            Ok(std::sync::Arc::new(phys))
        }
        Some(c) => {
            let p = (bp.psize as usize).min(phys.len());
            compress::decompress(c, &phys[..p], bp.lsize as usize).map(|v| std::sync::Arc::new(AlignedBuf::from(v)))
        }
        None => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "unknown compression code")),
    }
}
