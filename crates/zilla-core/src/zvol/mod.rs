//! zvol: the front-end contract of a block volume, and the engine's volume behind it.
//!
//! This file is the contract ([`BlockVolume`] and the types it speaks); the engine's
//! implementation is `zvol/volume.rs` (its theory of operation opens that file), and the
//! space admission a change passes before it becomes dirty lives beside the dirty-data
//! accounting in `dsl_pool`. Front ends do not call this contract themselves: they
//! submit owned requests to zilla-frontend's executor, which does.
//!
//! [`BlockVolume`] is the contract: blocking calls, safe from many threads at once,
//! many requests in flight. Semantics:
//! - `read` of never-written or unmapped ranges returns zeros;
//! - `write(.., fua=true)` returns only when that write is durable;
//! - `flush` returns only when every write that returned before `flush` was called is
//!   durable; `flush_async` is the same without blocking its caller (the result
//!   arrives through a completion, see [`CommitDone`]);
//! - `unmap` and `write_zeroes` free whole blocks and zero partial ones;
//! - out-of-range reads are `InvalidArgument`, out-of-range writes `NoSpace`,
//!   writes to a read-only volume `ReadOnly`.

use crate::vdev::abd::AlignedBuf;
use crate::Result;

mod volume;
pub use volume::*;

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
    /// Like [`BlockVolume::try_read_cached`], but without copying: the in-memory block
    /// buffers themselves (immutable, shared), in order, covering exactly `len` bytes
    /// at `offset`. `None` also when the volume cannot share its buffers; then call
    /// `try_read_cached`.
    fn try_read_cached_shared(&self, _offset: u64, _len: u64) -> Option<Result<Vec<SharedSlice>>> {
        None
    }
    /// True when [`BlockVolume::try_read_cached_shared`] answers every read of `len`
    /// bytes that [`BlockVolume::try_read_cached`] would: its `None` then means "not all
    /// in memory", and a front end need not take a reply buffer to try the copying way
    /// (which would miss too) before it goes to the device.
    fn cached_reads_are_shared(&self, _len: u64) -> bool {
        false
    }
    /// Apply a non-FUA write without blocking (no throttle delay, no device read, no
    /// txg wait); `None` means "call `write` from a blocking context". A `None` may come
    /// after part of the write was applied: writes are idempotent, so the caller simply
    /// calls `write` with the same data.
    fn try_write_nonblocking(&self, _offset: u64, _data: &WriteData) -> Option<Result<()>> {
        None
    }
    /// [`BlockVolume::write`] of bytes a front end received into aligned buffers: a
    /// buffer that is a whole block (see [`WriteData::cut`]) becomes the block's new
    /// version itself, with no copy.
    fn write_data(&self, offset: u64, data: &WriteData, fua: bool) -> Result<()> {
        self.write(offset, &data.to_vec(), fua)
    }
    /// Like [`BlockVolume::try_write_nonblocking`], for any write: `Some(Ok(true))` =
    /// applied, and it must be made durable before it is acknowledged (a FUA write, or
    /// every write of a `sync=always` volume): the caller follows it with
    /// [`BlockVolume::flush_async`] (or `flush`). `Some(Ok(false))`: applied, done.
    fn try_write_nonblocking_sync(&self, offset: u64, data: &WriteData, fua: bool) -> Option<Result<bool>> {
        self.try_write_nonblocking(offset, data).map(|r| r.map(|()| fua))
    }
    /// Start a FLUSH without blocking the caller: `done` runs exactly once, before
    /// this returns or from the engine thread that completes the intent-log write,
    /// with `Some(result)`, or with `None` when the flush cannot finish without
    /// blocking (another commit holds the log, a txg sync must be waited for): the
    /// caller then calls `flush` from a blocking context. `done` must not block.
    fn flush_async(&self, done: CommitDone) {
        done(None)
    }
    /// Start a READ that missed the cache without blocking the caller: `done` runs
    /// exactly once, before this returns or from the engine thread that completes the
    /// device read, with `Some(result)` (the bytes as shared pieces, as
    /// [`BlockVolume::try_read_cached_shared`] gives them), or with `None` when the read
    /// cannot finish without blocking (more than one block to fetch, an indirect block
    /// not cached, a copy that failed or did not verify): the caller then calls `read`
    /// from a blocking context. `done` must not block.
    fn read_async(&self, _offset: u64, _len: u64, done: ReadDone) {
        done(None)
    }
    /// The write throttle's verdict for a write of `len` bytes about to be made, for a
    /// front end that waits on a timer instead of a thread (`DirtyAccounting::
    /// claim_delay`). `After(d)`: the write's turn is claimed; wait `d`, then write with
    /// `try_write_after_delay` / `write_after_delay`, which do not delay again.
    /// `None` and `Blocking`: the usual calls (a `Blocking` write will wait in `write`).
    fn claim_write_delay(&self, _len: u64) -> WriteDelay {
        WriteDelay::None
    }
    /// [`BlockVolume::try_write_nonblocking_sync`] for a write whose delay was claimed
    /// and waited (`None`: call `write_after_delay` from a blocking context).
    fn try_write_after_delay(&self, offset: u64, data: &WriteData, fua: bool) -> Option<Result<bool>> {
        self.try_write_nonblocking_sync(offset, data, fua)
    }
    /// [`BlockVolume::write`] for a write whose delay was claimed and waited: no second
    /// delay (the hard stop at the dirty max still applies).
    fn write_after_delay(&self, offset: u64, data: &WriteData, fua: bool) -> Result<()> {
        self.write_data(offset, data, fua)
    }
}

pub use crate::dsl_pool::WriteDelay;

/// Completion of [`BlockVolume::read_async`]: `Some(result)`, or `None` = "call `read`
/// from a blocking context for the result".
pub type ReadDone = Box<dyn FnOnce(Option<Result<Vec<SharedSlice>>>) + Send>;

/// Completion of [`BlockVolume::flush_async`]: `Some(result)`, or `None` = "call
/// `flush` from a blocking context for the result".
pub type CommitDone = Box<dyn FnOnce(Option<Result<()>>) + Send>;

/// The finest cut of a write's payload: the slab's smallest slot.
pub const WRITE_PIECE_MIN_BYTES: u64 = crate::vdev::abd::ALIGN as u64;

/// A write's bytes as a front end received them: aligned buffers back to back. A front
/// end that reads a payload off the wire into pieces cut by [`WriteData::cut`] (at the
/// volume's block boundaries) hands whole blocks over by reference: the block's new
/// version is the buffer the socket filled. Any other cut is accepted too (copied).
#[derive(Clone, Default)]
pub struct WriteData {
    pieces: Vec<std::sync::Arc<AlignedBuf>>,
    len: usize,
}

impl WriteData {
    pub fn from_pieces(pieces: Vec<std::sync::Arc<AlignedBuf>>) -> WriteData {
        let len = pieces.iter().map(|p| p.len()).sum();
        WriteData { pieces, len }
    }
    /// `bytes` copied into one aligned buffer.
    pub fn copy_of(bytes: &[u8]) -> WriteData {
        Self::from_pieces(vec![std::sync::Arc::new(AlignedBuf::copy_of(bytes))])
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn pieces(&self) -> &[std::sync::Arc<AlignedBuf>] {
        &self.pieces
    }
    /// All the bytes in one Vec.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for p in &self.pieces {
            v.extend_from_slice(p);
        }
        v
    }
    /// The piece lengths of a write of `len` bytes at `offset` on blocks of
    /// `block_bytes`: cut at every block boundary. They always add up to `len`, whatever
    /// the offset (a range past the volume's end is refused later, not here). Never cut
    /// finer than [`WRITE_PIECE_MIN_BYTES`]: each piece takes a slab slot of at least
    /// that size, so finer pieces would take more memory than the front end's budget
    /// counted for the payload (such a volume's writes are copied instead).
    pub fn cut(offset: u64, len: u64, block_bytes: u64) -> impl Iterator<Item = usize> + Clone {
        let bs = block_bytes.max(WRITE_PIECE_MIN_BYTES);
        let (mut at, mut left) = (offset, len);
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            let n = (bs - at % bs).min(left);
            at = at.wrapping_add(n);
            left -= n;
            Some(n as usize)
        })
    }
}

impl std::fmt::Debug for WriteData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteData({} bytes in {} pieces)", self.len, self.pieces.len())
    }
}

/// `len` bytes at `start` of an immutable buffer shared with the ARC or the dirty
/// set: what a zero-copy read hands to a front end, which keeps it alive until the
/// bytes are on the wire.
#[derive(Clone)]
pub struct SharedSlice {
    data: std::sync::Arc<AlignedBuf>,
    start: usize,
    len: usize,
}

impl SharedSlice {
    /// `None` if the range is not inside `data`.
    pub fn new(data: std::sync::Arc<AlignedBuf>, start: usize, len: usize) -> Option<SharedSlice> {
        (start.checked_add(len)? <= data.len()).then_some(SharedSlice { data, start, len })
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.data[self.start..self.start + self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for SharedSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedSlice({}..{} of {})", self.start, self.start + self.len, self.data.len())
    }
}
