//! abd: aligned buffers for device I/O, and a bounded pool of them.
//!
//! O_DIRECT needs the buffer address aligned (512 or 4096 bytes); a plain `Vec<u8>` is
//! not, which would force the file leaf to bounce every write through a fresh zeroed
//! copy. The txg sync merges blocks into [`AlignedBuf`]s taken from a [`BufPool`], so a
//! merged write is copied exactly once and the pages are reused (no page faults per
//! write). The pool holds at most `max_pooled` idle buffers; more may be in use.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

use parking_lot::Mutex;

pub const ALIGN: usize = 4096;

/// A fixed-capacity byte buffer whose start is ALIGN-aligned. Bytes `[0, len)` are
/// always initialised (written by `extend_from_slice`).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8] of initialised bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn with_capacity(cap: usize) -> AlignedBuf {
        let cap = cap.max(ALIGN).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else { handle_alloc_error(layout) };
        AlignedBuf { ptr, cap, len: 0 }
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
    pub fn extend_from_slice(&mut self, s: &[u8]) {
        assert!(self.len + s.len() <= self.cap, "AlignedBuf overflow: {} + {} > {}", self.len, s.len(), self.cap);
        // SAFETY: the destination range [len, len + s.len()) lies inside the allocation
        // (checked above) and cannot overlap `s`, which is borrowed from elsewhere.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), self.ptr.as_ptr().add(self.len), s.len()) };
        self.len += s.len();
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: bytes [0, len) were initialised by extend_from_slice.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, ALIGN).expect("valid layout");
        // SAFETY: allocated in with_capacity with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) };
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
    /// A cleared buffer of at least `len` bytes.
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
    }
    #[test]
    #[should_panic(expected = "overflow")]
    fn overflow_is_caught() {
        let mut a = AlignedBuf::with_capacity(4096);
        a.extend_from_slice(&[0u8; 4097]);
    }
}
