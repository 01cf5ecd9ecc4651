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
//! [`BufPool`] keeps at most `max_pooled` idle buffers of one size for reuse (the txg
//! sync's aggregation buffers), so a merged write is copied exactly once and its pages
//! are not faulted in again for every write. More may be in use than are pooled.

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
        let mut b = Self::with_capacity(s.len());
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
    fn aligned_and_bounded() {
        let pool = BufPool::new(1 << 20, 2);
        let mut a = pool.get(4096);
        assert_eq!(a.as_slice().as_ptr() as usize % ALIGN, 0);
        a.extend_from_slice(&[1, 2, 3]);
        a.extend_from_slice(&[4]);
        assert_eq!(a.as_slice(), &[1, 2, 3, 4]);
        let b = pool.get(10);
        let c = pool.get(10);
        pool.put(a);
        pool.put(b);
        pool.put(c);
        assert_eq!(pool.free.lock().len(), 2, "pool keeps at most max_pooled idle buffers");
        let big = pool.get(3 << 20);
        assert!(big.capacity() >= 3 << 20);
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
    #[should_panic(expected = "overflow")]
    fn overflow_is_caught() {
        let mut a = AlignedBuf::with_capacity(4096);
        a.extend_from_slice(&[0u8; 4097]);
    }
}
