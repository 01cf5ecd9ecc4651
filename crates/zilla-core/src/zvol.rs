//! zvol: the block-volume API every front end (NBD, iSCSI) uses.
//!
//! [`BlockVolume`] is the contract: blocking calls, safe from many threads at once,
//! many requests in flight. Semantics:
//! - `read` of never-written or unmapped ranges returns zeros;
//! - `write(.., fua=true)` returns only when that write is durable;
//! - `flush` returns only when every write that returned before `flush` was called is
//!   durable;
//! - `unmap` and `write_zeroes` free whole blocks and zero partial ones;
//! - out-of-range reads are `InvalidArgument`, out-of-range writes `NoSpace`,
//!   writes to a read-only volume `ReadOnly`.

use crate::Result;

/// One run of the block-status map: `hole` = unallocated and reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
    pub hole: bool,
}

pub trait BlockVolume: Send + Sync + 'static {
    /// "pool/volume"
    fn name(&self) -> String;
    fn size(&self) -> u64;
    /// volblocksize
    fn block_size(&self) -> u32;
    fn read_only(&self) -> bool;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()>;
    fn flush(&self) -> Result<()>;
    fn unmap(&self, offset: u64, len: u64) -> Result<()>;
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()>;
    /// Extents covering `[offset, offset+len)` in order, adjacent extents of the same
    /// kind merged.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>>;
    /// Serve a read without any device I/O if every byte is in memory (ARC or dirty
    /// data); `None` means "would block, call `read` from a blocking context".
    fn try_read_cached(&self, _offset: u64, _buf: &mut [u8]) -> Option<Result<()>> {
        None
    }
}
