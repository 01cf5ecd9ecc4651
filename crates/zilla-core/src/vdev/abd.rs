//! abd: the one aligned buffer type of device I/O, and a bounded pool of them.
//!
//! Theory of operation
//! -------------------
//! O_DIRECT needs the buffer address aligned (512 or 4096 bytes); a plain `Vec<u8>` is
//! not, which would force the file leaf to bounce every I/O through a fresh copy. Every
//! request of the I/O pipeline ([`super::queue`]) therefore owns an [`AlignedBuf`]: a read
//! request carries the buffer the device fills, a write request shares one (`Arc`) among
//! the children of a mirror.
//!
//! An `AlignedBuf` is a plain `Vec<u8>` over-allocated by the alignment, whose usable
//! slice starts at the first aligned address inside it: no unsafe code. Bytes
//! `[0, len)` are always initialised (the storage is zeroed at allocation; `vec![0; n]`
//! costs no page faults until touched).
//!
//! [`BufPool`] keeps idle buffers in power-of-two size classes, at most a byte bound of
//! them, for the txg sync's prepared blocks: each is copied once, on a checksum worker,
//! into a buffer whose pages are already faulted in and that no allocator lock hands out.

use parking_lot::Mutex;

/// Default alignment: safe for every device's O_DIRECT.
pub const ALIGN: usize = 4096;

/// A byte buffer whose start is aligned (default [`ALIGN`]) and whose capacity is fixed.
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
    cap: usize,
}

impl AlignedBuf {
    /// `len` zero bytes, the start aligned to `align` (a power of two).
    pub fn zeroed_aligned(len: usize, align: usize) -> AlignedBuf {
        assert!(align.is_power_of_two(), "alignment {align} not a power of two");
        let storage = vec![0u8; len + align];
        let misalign = storage.as_ptr() as usize % align;
        let start = if misalign == 0 { 0 } else { align - misalign };
        AlignedBuf { storage, start, len, cap: len }
    }

    /// `len` zero bytes aligned to [`ALIGN`].
    pub fn zeroed(len: usize) -> AlignedBuf {
        Self::zeroed_aligned(len, ALIGN)
    }

    /// An empty buffer that can grow (by `extend_from_slice`) up to `cap` bytes.
    pub fn with_capacity(cap: usize) -> AlignedBuf {
        let mut b = Self::zeroed(cap);
        b.len = 0;
        b
    }

    /// A copy of `s` in an aligned buffer.
    pub fn copy_of(s: &[u8]) -> AlignedBuf {
        Self::copy_padded(s, s.len(), ALIGN)
    }

    /// `s` followed by zeros up to `len` bytes (`len >= s.len()`), the start aligned to
    /// `align`. Each byte is written once: the copy does not zero the buffer first (the
    /// txg sync's prepare copies every block it writes through here).
    pub fn copy_padded(s: &[u8], len: usize, align: usize) -> AlignedBuf {
        assert!(align.is_power_of_two(), "alignment {align} not a power of two");
        assert!(len >= s.len(), "padded length {len} below the data's {}", s.len());
        let mut storage: Vec<u8> = Vec::with_capacity(len + align);
        // The heap block does not move while the Vec stays within its capacity.
        let misalign = storage.as_ptr() as usize % align;
        let start = if misalign == 0 { 0 } else { align - misalign };
        storage.resize(start, 0);
        storage.extend_from_slice(s);
        storage.resize(start + len, 0);
        debug_assert_eq!(storage.as_ptr() as usize % align, misalign, "the storage moved");
        AlignedBuf { storage, start, len, cap: len }
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
        let at = self.start + self.len;
        self.storage[at..at + s.len()].copy_from_slice(s);
        self.len += s.len();
    }

    /// Grow (zero-filled) or shrink to `len` bytes, within the capacity.
    pub fn resize(&mut self, len: usize) {
        assert!(len <= self.cap, "AlignedBuf resize {len} beyond capacity {}", self.cap);
        if len > self.len {
            self.storage[self.start + self.len..self.start + len].fill(0);
        }
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
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

/// Smallest size class of a [`BufPool`] (the smallest allocation unit).
const CLASS_MIN_BYTES: usize = 4096;
/// Largest size class kept (SPA_OLD_MAXBLOCKSIZE: the largest volblocksize); larger
/// buffers are made and freed as needed.
const CLASS_MAX_BYTES: usize = 128 << 10;
const CLASSES: usize = (CLASS_MAX_BYTES / CLASS_MIN_BYTES).trailing_zeros() as usize + 1;

/// A bounded pool of aligned buffers in power-of-two size classes (4 KiB to 128 KiB):
/// the txg sync's prepared blocks (zio::prepare) are copied into them on the checksum
/// workers and given back when their writes complete, so a sync of a gigabyte does not
/// ask the allocator (and its arena locks, shared with the front ends) for a quarter of
/// a million buffers. At most `max_idle_bytes` wait idle in all; more may be in use.
pub struct BufPool {
    align: usize,
    max_idle_bytes: usize,
    classes: [Mutex<Vec<AlignedBuf>>; CLASSES],
    idle_bytes: std::sync::atomic::AtomicUsize,
}

impl BufPool {
    pub fn new(align: usize, max_idle_bytes: usize) -> BufPool {
        assert!(align.is_power_of_two(), "alignment {align} not a power of two");
        BufPool { align, max_idle_bytes, classes: std::array::from_fn(|_| Mutex::new(Vec::new())), idle_bytes: Default::default() }
    }

    /// The class whose buffers hold `len` bytes (None: larger than every class).
    fn class_of(len: usize) -> Option<usize> {
        let size = len.max(CLASS_MIN_BYTES).checked_next_power_of_two()?;
        (size <= CLASS_MAX_BYTES).then(|| (size / CLASS_MIN_BYTES).trailing_zeros() as usize)
    }

    /// `s` followed by zeros up to `len` bytes (as [`AlignedBuf::copy_padded`]), in a
    /// pooled buffer when one of the size is idle.
    pub fn copy_padded(&self, s: &[u8], len: usize) -> AlignedBuf {
        let Some(class) = Self::class_of(len) else {
            return AlignedBuf::copy_padded(s, len, self.align);
        };
        let pooled = self.classes[class].lock().pop();
        let mut b = match pooled {
            Some(b) => {
                self.idle_bytes.fetch_sub(b.capacity(), std::sync::atomic::Ordering::Relaxed);
                b
            }
            None => AlignedBuf::zeroed_aligned(CLASS_MIN_BYTES << class, self.align),
        };
        b.clear();
        b.extend_from_slice(s);
        b.resize(len);
        b
    }

    /// Give a buffer back: kept if it is one of the pool's classes and the idle bound
    /// allows it, freed otherwise.
    pub fn put(&self, b: AlignedBuf) {
        let cap = b.capacity();
        let Some(class) = Self::class_of(cap).filter(|&c| CLASS_MIN_BYTES << c == cap) else { return };
        if !(b.as_slice().as_ptr() as usize).is_multiple_of(self.align) {
            return;
        }
        let idle = self.idle_bytes.fetch_add(cap, std::sync::atomic::Ordering::Relaxed);
        if idle + cap > self.max_idle_bytes {
            self.idle_bytes.fetch_sub(cap, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        self.classes[class].lock().push(b);
    }

    /// Bytes idle in the pool (memory accounting).
    pub fn idle_bytes(&self) -> usize {
        self.idle_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn aligned_and_bounded() {
        let pool = BufPool::new(512, 64 << 10);
        let a = pool.copy_padded(&[1, 2, 3], 4096);
        assert_eq!(a.as_slice().as_ptr() as usize % 512, 0);
        assert_eq!((a.len(), a.capacity()), (4096, 4096));
        assert_eq!(&a.as_slice()[..4], &[1, 2, 3, 0]);
        let b = pool.copy_padded(&[5u8; 20000], 24576);
        assert_eq!((b.len(), b.capacity()), (24576, 32768), "a 24 KiB block takes a 32 KiB class buffer");
        assert!(b.as_slice()[20000..].iter().all(|&x| x == 0), "the padding is zero");
        pool.put(a);
        pool.put(b);
        assert_eq!(pool.idle_bytes(), 4096 + 32768);
        // a reused buffer carries nothing of its last use
        let c = pool.copy_padded(&[9u8; 100], 30000);
        assert_eq!(pool.idle_bytes(), 4096, "the 32 KiB buffer was reused");
        assert!(c.as_slice()[..100].iter().all(|&x| x == 9) && c.as_slice()[100..].iter().all(|&x| x == 0));
        pool.put(c);
        // the idle bound holds; buffers of no class are not kept
        for _ in 0..4 {
            pool.put(AlignedBuf::zeroed_aligned(32768, 512));
        }
        assert!(pool.idle_bytes() <= 64 << 10, "idle {} over the bound", pool.idle_bytes());
        pool.put(AlignedBuf::zeroed_aligned(5000, 512));
        pool.put(AlignedBuf::zeroed_aligned(256 << 10, 512));
        assert!(pool.idle_bytes() <= 64 << 10);
        let big = pool.copy_padded(&[1u8; 10], 1 << 20);
        assert_eq!(big.len(), 1 << 20);
        for align in [512, 4096, 65536] {
            let z = AlignedBuf::zeroed_aligned(1000, align);
            assert_eq!(z.as_slice().as_ptr() as usize % align, 0);
            assert!(z.as_slice().iter().all(|&b| b == 0));
        }
        for align in [512, 4096] {
            let c = AlignedBuf::copy_padded(&[7u8; 1000], 1536, align);
            assert_eq!(c.as_slice().as_ptr() as usize % align, 0);
            assert_eq!((c.len(), c.capacity()), (1536, 1536));
            assert!(c.as_slice()[..1000].iter().all(|&b| b == 7) && c.as_slice()[1000..].iter().all(|&b| b == 0));
        }
        let mut r = AlignedBuf::copy_of(&[9u8; 100]);
        r.resize(50);
        r.resize(100);
        assert_eq!(&r.as_slice()[..50], &[9u8; 50]);
        assert_eq!(&r.as_slice()[50..], &[0u8; 50], "regrown bytes are zeroed");
    }
    #[test]
    #[should_panic(expected = "overflow")]
    fn overflow_is_caught() {
        let mut a = AlignedBuf::with_capacity(4096);
        a.extend_from_slice(&[0u8; 4097]);
    }
}
