//! abd: the aligned buffers of device I/O and of blocks, the bytes of a write, and a
//! bounded pool of write buffers.
//!
//! Theory of operation
//! -------------------
//! O_DIRECT needs the buffer address aligned (512 or 4096 bytes); a plain `Vec<u8>` is
//! not, which would force the file leaf to bounce every I/O through a fresh copy. Every
//! request of the I/O pipeline ([`super::queue`]) therefore owns an [`AlignedBuf`]: a read
//! request carries the buffer the device fills, a write request shares one (`Arc`) among
//! the children of a mirror.
//!
//! An `AlignedBuf` is one allocation of exactly its capacity, made with the alignment
//! it needs (`std::alloc` with a [`Layout`] of that alignment), so a buffer costs no
//! slack: a 16 KiB block is 16 KiB of heap, not 20. Bytes `[0, len)` are always
//! initialised: `zeroed` allocates zeroed memory, `with_capacity` starts empty and only
//! `extend_from_slice` (a copy) and `resize` (zeros) make it longer.
//!
//! [`BlockBuf`] is a block's bytes shared without copying: the dirty data of a txg, the
//! ARC's buffers, prepared blocks. A block read from a device becomes the ARC's buffer
//! as read (no copy). [`WriteData`] is the bytes of one device write: one or more
//! segments, written with one call (pwritev, io_uring WRITEV), so the queue aggregates
//! writes without copying them.
//!
//! Why the txg sync still copies a run of blocks into one pooled 4 KiB-aligned buffer
//! instead of writing the blocks' own buffers vectored: block buffers are at most
//! 512-aligned ([`BLOCK_ALIGN`], [`HEAP_ALIGN`]; 4096 costs 25% of their memory in
//! memalign slack), and ext4 treats a
//! direct write whose memory is not aligned to its 4 KiB block as unaligned I/O: it
//! takes the inode lock exclusively and waits for every direct I/O in flight. Measured
//! (stop 33): vectored runs of 512-aligned blocks made 128K NBD writes 0.77x as fast,
//! the kernel's share of the daemon's CPU rising from 48% to 62% (context switches,
//! rwsem_down_write_slowpath). [`BufPool`] keeps the run buffers (their pages are not
//! faulted in again).

use parking_lot::Mutex;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

/// Default alignment: safe for every device's O_DIRECT.
pub const ALIGN: usize = 4096;

/// Alignment of a block read buffer: what O_DIRECT asks of memory on most devices
/// (statx `dio_mem_align`; 512 on ext4 and XFS over virtio and NVMe), so a block is
/// read straight into the buffer the ARC keeps. A block buffer lives as long as its
/// txg or its ARC entry, so its alignment is paid in heap: glibc's memalign leaves up
/// to `align` bytes before each buffer, which 512 keeps at 3% of a 16 KiB block where
/// 4096 cost 25% (measured: +1 GB of RSS for 2.5 GB of dirty data).
pub const BLOCK_ALIGN: usize = 512;

/// Alignment of a block made in memory (dirty data, log records): plain malloc. Measured
/// (stop 33, 128K NBD writes): dirty blocks from memalign(512) instead of malloc cost
/// 7% of the throughput and 200 MB of peak RSS (one glibc arena; memalign splits
/// chunks under its lock and fragments the heap).
pub const HEAP_ALIGN: usize = 16;

/// A byte buffer whose start is aligned (default [`ALIGN`]) and whose capacity is fixed.
pub struct AlignedBuf {
    /// `layout.size()` bytes (at least 1) aligned to `layout.align()`, owned.
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
    cap: usize,
}

// SAFETY: an AlignedBuf owns its allocation exclusively, like a Vec<u8>; &AlignedBuf
// gives only shared access to initialised bytes.
unsafe impl Send for AlignedBuf {}
// SAFETY: see Send; no interior mutability.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn allocate(cap: usize, align: usize, zeroed: bool) -> AlignedBuf {
        assert!(align.is_power_of_two(), "alignment {align} not a power of two");
        let layout = Layout::from_size_align(cap.max(1), align).expect("buffer layout within isize");
        // SAFETY: the layout's size is non-zero.
        let raw = unsafe { if zeroed { std::alloc::alloc_zeroed(layout) } else { std::alloc::alloc(layout) } };
        let Some(ptr) = NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        debug_assert_eq!(ptr.as_ptr() as usize % align, 0);
        AlignedBuf { ptr, layout, len: if zeroed { cap } else { 0 }, cap }
    }

    /// `len` zero bytes, the start aligned to `align` (a power of two).
    pub fn zeroed_aligned(len: usize, align: usize) -> AlignedBuf {
        Self::allocate(len, align, true)
    }

    /// `len` zero bytes aligned to [`ALIGN`].
    pub fn zeroed(len: usize) -> AlignedBuf {
        Self::zeroed_aligned(len, ALIGN)
    }

    /// An empty buffer that can grow (by `extend_from_slice`) up to `cap` bytes.
    pub fn with_capacity(cap: usize) -> AlignedBuf {
        Self::allocate(cap, ALIGN, false)
    }

    /// A copy of `s` in an aligned buffer.
    pub fn copy_of(s: &[u8]) -> AlignedBuf {
        Self::copy_of_aligned(s, ALIGN)
    }

    /// A copy of `s`, its start aligned to `align` (a power of two).
    pub fn copy_of_aligned(s: &[u8], align: usize) -> AlignedBuf {
        let mut b = Self::allocate(s.len(), align, false);
        b.extend_from_slice(s);
        b
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Append `s`; panics if it does not fit (a caller bug, never data-dependent).
    pub fn extend_from_slice(&mut self, s: &[u8]) {
        assert!(self.len + s.len() <= self.cap, "AlignedBuf overflow: {} + {} > {}", self.len, s.len(), self.cap);
        // SAFETY: [len, len + s.len()) lies inside the allocation (checked above) and
        // cannot overlap `s`, which is borrowed while we hold &mut self.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), self.ptr.as_ptr().add(self.len), s.len()) };
        self.len += s.len();
    }

    /// Grow (zero-filled) or shrink to `len` bytes, within the capacity.
    pub fn resize(&mut self, len: usize) {
        assert!(len <= self.cap, "AlignedBuf resize {len} beyond capacity {}", self.cap);
        if len > self.len {
            // SAFETY: [self.len, len) lies inside the allocation.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, len - self.len) };
        }
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: [0, len) is inside the allocation and initialised (type invariant).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `allocate` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf(len={}, cap={})", self.len, self.cap)
    }
}

/// A block's bytes, shared without copying (an `Arc` of an aligned buffer).
#[derive(Clone)]
pub struct BlockBuf(Arc<AlignedBuf>);

impl BlockBuf {
    /// A shared copy of `s`, aligned like any heap allocation ([`HEAP_ALIGN`]: a
    /// block made in memory is copied into a 4 KiB-aligned run before it is written).
    pub fn copy_of(s: &[u8]) -> BlockBuf {
        BlockBuf(Arc::new(AlignedBuf::copy_of_aligned(s, HEAP_ALIGN)))
    }
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> BlockBuf {
        BlockBuf(Arc::new(AlignedBuf::zeroed_aligned(len, HEAP_ALIGN)))
    }
    /// Whether `a` and `b` are the same buffer (not merely equal bytes).
    pub fn ptr_eq(a: &BlockBuf, b: &BlockBuf) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
    /// How many owners share the buffer (tests of who lets go).
    pub fn strong_count(b: &BlockBuf) -> usize {
        Arc::strong_count(&b.0)
    }
    /// The buffer, if this is its only owner (a write's bytes handed back).
    pub fn try_unwrap(b: BlockBuf) -> Result<AlignedBuf, BlockBuf> {
        Arc::try_unwrap(b.0).map_err(BlockBuf)
    }
    /// The buffer to change, if this is its only owner.
    pub fn get_mut(b: &mut BlockBuf) -> Option<&mut AlignedBuf> {
        Arc::get_mut(&mut b.0)
    }
}

impl From<AlignedBuf> for BlockBuf {
    fn from(b: AlignedBuf) -> BlockBuf {
        BlockBuf(Arc::new(b))
    }
}
impl From<Arc<AlignedBuf>> for BlockBuf {
    fn from(b: Arc<AlignedBuf>) -> BlockBuf {
        BlockBuf(b)
    }
}
impl From<&[u8]> for BlockBuf {
    fn from(s: &[u8]) -> BlockBuf {
        BlockBuf::copy_of(s)
    }
}
impl From<Vec<u8>> for BlockBuf {
    fn from(v: Vec<u8>) -> BlockBuf {
        BlockBuf::copy_of(&v)
    }
}

impl std::ops::Deref for BlockBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_slice()
    }
}
impl AsRef<[u8]> for BlockBuf {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}
impl std::borrow::Borrow<[u8]> for BlockBuf {
    fn borrow(&self) -> &[u8] {
        self.0.as_slice()
    }
}
impl PartialEq for BlockBuf {
    fn eq(&self, o: &BlockBuf) -> bool {
        self[..] == o[..]
    }
}
impl Eq for BlockBuf {}
impl std::fmt::Debug for BlockBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockBuf(len={})", self.len())
    }
}

/// Most memory pages one device write's buffers may touch. A direct write whose pages
/// need more than one bio, or a bio the block layer must split (virtio-blk takes 254
/// segments, Linux's BIO_MAX_VECS is 256), cannot be issued without blocking: iomap
/// and the block layer answer a REQ_NOWAIT write with EAGAIN and io_uring hands it to a
/// worker thread. Measured: 1 MiB runs of 512-aligned 16 KiB blocks (5 pages each)
/// put 14% of the daemon's CPU in io-wq workers and slowed 128K writes by a quarter.
/// The queue's write aggregates on a raw leaf stop at this many pages.
pub const WRITE_PAGES_MAX: usize = 240;

/// Memory pages `[ptr, ptr + len)` touches.
pub fn pages_spanned(ptr: *const u8, len: usize) -> usize {
    const PAGE: usize = 4096;
    if len == 0 {
        return 0;
    }
    let start = ptr as usize / PAGE;
    let end = (ptr as usize + len - 1) / PAGE;
    end - start + 1
}

/// The bytes of one device write: aligned segments written back to back (a run of
/// blocks, an aggregate), shared by every child of a mirror without copying.
#[derive(Clone)]
pub struct WriteData {
    segs: Arc<[BlockBuf]>,
    len: usize,
    pages: usize,
}

impl WriteData {
    /// Segments written in order; empty ones are allowed.
    pub fn segments(segs: Vec<BlockBuf>) -> WriteData {
        let len = segs.iter().map(|s| s.len()).sum();
        let pages = segs.iter().map(|s| pages_spanned(s.as_ptr(), s.len())).sum();
        WriteData { segs: segs.into(), len, pages }
    }
    /// Memory pages the segments touch (see [`WRITE_PAGES_MAX`]).
    pub fn pages(&self) -> usize {
        self.pages
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The segments, in order.
    pub fn parts(&self) -> &[BlockBuf] {
        &self.segs
    }
    /// The bytes as one slice: borrowed when there is one segment, else a copy.
    pub fn contiguous(&self) -> std::borrow::Cow<'_, [u8]> {
        match &self.segs[..] {
            [one] => std::borrow::Cow::Borrowed(&one[..]),
            many => {
                let mut v = Vec::with_capacity(self.len);
                for s in many {
                    v.extend_from_slice(s);
                }
                std::borrow::Cow::Owned(v)
            }
        }
    }
    /// The bytes in one aligned buffer: the segment itself when there is one, else a copy.
    pub fn to_aligned(&self) -> BlockBuf {
        match &self.segs[..] {
            [one] => one.clone(),
            many => {
                let mut b = AlignedBuf::with_capacity(self.len);
                for s in many {
                    b.extend_from_slice(s);
                }
                b.into()
            }
        }
    }
    /// The only segment's buffer back, when this was its last owner (buffer pools).
    pub fn into_single(self) -> Option<AlignedBuf> {
        if self.segs.len() != 1 {
            return None;
        }
        let one = self.segs[0].clone();
        drop(self);
        BlockBuf::try_unwrap(one).ok()
    }
}

impl From<AlignedBuf> for WriteData {
    fn from(b: AlignedBuf) -> WriteData {
        WriteData::segments(vec![b.into()])
    }
}
impl From<Arc<AlignedBuf>> for WriteData {
    fn from(b: Arc<AlignedBuf>) -> WriteData {
        WriteData::segments(vec![b.into()])
    }
}
impl From<BlockBuf> for WriteData {
    fn from(b: BlockBuf) -> WriteData {
        WriteData::segments(vec![b])
    }
}
impl std::fmt::Debug for WriteData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteData(len={}, segments={})", self.len, self.segs.len())
    }
}

/// A bounded free list of equally sized aligned buffers.
pub struct BufPool {
    buf_bytes: usize,
    max_pooled: usize,
    free: Mutex<Vec<AlignedBuf>>,
}

impl BufPool {
    pub fn new(buf_bytes: usize, max_pooled: usize) -> BufPool {
        BufPool { buf_bytes, max_pooled, free: Mutex::new(Vec::new()) }
    }
    /// A cleared buffer of at least `len` bytes capacity.
    pub fn get(&self, len: usize) -> AlignedBuf {
        if len <= self.buf_bytes {
            if let Some(mut b) = self.free.lock().pop() {
                b.clear();
                return b;
            }
            return AlignedBuf::with_capacity(self.buf_bytes);
        }
        AlignedBuf::with_capacity(len)
    }
    /// Give a buffer back; kept only if it has the pool's size and the pool is not full.
    pub fn put(&self, b: AlignedBuf) {
        if b.capacity() == self.buf_bytes {
            let mut f = self.free.lock();
            if f.len() < self.max_pooled {
                f.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn aligned_and_exact() {
        let mut a = AlignedBuf::with_capacity(4096);
        assert_eq!(a.as_slice().as_ptr() as usize % ALIGN, 0);
        a.extend_from_slice(&[1, 2, 3]);
        a.extend_from_slice(&[4]);
        assert_eq!(a.as_slice(), &[1, 2, 3, 4]);
        assert_eq!(a.capacity(), 4096);
        for align in [512, 4096, 65536] {
            let z = AlignedBuf::zeroed_aligned(1000, align);
            assert_eq!(z.as_slice().as_ptr() as usize % align, 0);
            assert!(z.as_slice().iter().all(|&b| b == 0));
        }
        let mut r = AlignedBuf::copy_of(&[9u8; 100]);
        r.resize(50);
        r.resize(100);
        assert_eq!(&r.as_slice()[..50], &[9u8; 50]);
        assert_eq!(&r.as_slice()[50..], &[0u8; 50], "regrown bytes are zeroed");
    }
    #[test]
    fn block_buffers_and_write_data() {
        // Goal: block buffers made in memory are heap-aligned, read buffers aligned for
        // O_DIRECT; a write's segments keep their order, length and page count;
        // the only owner gets its buffer back.
        let b = BlockBuf::copy_of(&[5u8; 16384]);
        assert_eq!(b.as_ptr() as usize % HEAP_ALIGN, 0);
        assert_eq!(b.len(), 16384);
        assert_eq!(AlignedBuf::zeroed_aligned(16384, BLOCK_ALIGN).as_ptr() as usize % BLOCK_ALIGN, 0);
        let small = BlockBuf::copy_of(b"abc");
        assert_eq!(&small[..], b"abc");
        assert_eq!(BlockBuf::copy_of(&[]).len(), 0);
        assert_eq!(pages_spanned(4096 as *const u8, 4096), 1);
        assert_eq!(pages_spanned(4096 as *const u8, 4097), 2);
        assert_eq!(pages_spanned(4095 as *const u8, 2), 2);
        assert_eq!(pages_spanned(512 as *const u8, 16384), 5);
        assert_eq!(pages_spanned(0 as *const u8, 0), 0);
        let w = WriteData::segments(vec![b.clone(), small.clone(), BlockBuf::zeroed(512)]);
        assert_eq!(w.len(), 16384 + 3 + 512);
        assert_eq!(w.pages(), pages_spanned(b.as_ptr(), 16384) + pages_spanned(small.as_ptr(), 3) + 1);
        let c = w.contiguous();
        assert!(c[..16384].iter().all(|&x| x == 5) && &c[16384..16387] == b"abc" && c[16387..].iter().all(|&x| x == 0));
        assert!(w.clone().into_single().is_none(), "three segments are not one buffer");
        let one = WriteData::from(AlignedBuf::copy_of(&[1u8; 4096]));
        assert!(matches!(one.contiguous(), std::borrow::Cow::Borrowed(_)));
        let kept = one.clone();
        assert!(one.into_single().is_none(), "a clone still shares it");
        assert_eq!(kept.into_single().map(|b| b.len()), Some(4096));
        let mut z = AlignedBuf::zeroed(100);
        z.resize(10);
        assert_eq!(z.capacity(), 100);
        assert!(BlockBuf::get_mut(&mut BlockBuf::from(z)).is_some());
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn overflow_is_caught() {
        let mut a = AlignedBuf::with_capacity(4096);
        a.extend_from_slice(&[0u8; 4097]);
    }
}
