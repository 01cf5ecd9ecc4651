//! buffers: one daemon-wide pool of large reply buffers, bounded by bytes.
//!
//! A front end that answers reads hands the reply buffer back once the reply is on
//! the wire; the next read of the same size or smaller reuses that initialised memory
//! instead of zero-filling a fresh allocation. The pool is shared by every connection,
//! so its bound is one number for the whole daemon:
//!
//! - only buffers of `BUFFER_MIN_BYTES..=buffer_max_bytes` are kept;
//! - at most `bytes_max` bytes are pooled; a buffer that does not fit is freed;
//! - a buffer unused for `idle_trim` is freed (on the next take/give, or by [`BufferPool::trim`]
//!   which the server calls periodically), so an idle daemon returns the memory.
//!
//! Free buffers are kept oldest first; takes search from the newest end (warm memory).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Smaller buffers are cheaper to allocate than to pool.
pub const BUFFER_MIN_BYTES: usize = 32 * 1024;
/// Buffers searched per take (the pool is bounded by bytes, so this bounds the scan).
const TAKE_SCAN_MAX: usize = 16;

pub struct BufferPool {
    free: Mutex<VecDeque<(Instant, Vec<u8>)>>,
    pooled_bytes: AtomicUsize,
    bytes_max: usize,
    buffer_max_bytes: usize,
    idle_trim: Duration,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// A point-in-time view of the pool for /metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferPoolStats {
    pub pooled_bytes: u64,
    pub bytes_max: u64,
    pub hits: u64,
    pub misses: u64,
}

impl BufferPool {
    pub fn new(bytes_max: usize, buffer_max_bytes: usize, idle_trim: Duration) -> BufferPool {
        BufferPool {
            free: Mutex::new(VecDeque::new()),
            pooled_bytes: AtomicUsize::new(0),
            bytes_max,
            buffer_max_bytes,
            idle_trim,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// A buffer of exactly `len` bytes (contents unspecified).
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len >= BUFFER_MIN_BYTES && len <= self.buffer_max_bytes {
            if let Ok(mut free) = self.free.lock() {
                let newest_first = (0..free.len()).rev().take(TAKE_SCAN_MAX);
                let found = newest_first.into_iter().find(|&i| free[i].1.len() >= len);
                if let Some(i) = found {
                    if let Some((_, mut buffer)) = free.remove(i) {
                        self.pooled_bytes.fetch_sub(buffer.len(), Ordering::Relaxed);
                        self.hits.fetch_add(1, Ordering::Relaxed);
                        buffer.truncate(len);
                        return buffer;
                    }
                }
            }
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        vec![0u8; len]
    }

    /// Hand a buffer back; kept if it fits the bounds, freed otherwise.
    pub fn give(&self, buffer: Vec<u8>) {
        let len = buffer.len();
        if !(BUFFER_MIN_BYTES..=self.buffer_max_bytes).contains(&len) {
            return;
        }
        let now = Instant::now();
        let Ok(mut free) = self.free.lock() else { return };
        self.trim_locked(&mut free, now);
        if self.pooled_bytes.load(Ordering::Relaxed) + len > self.bytes_max {
            return;
        }
        self.pooled_bytes.fetch_add(len, Ordering::Relaxed);
        free.push_back((now, buffer));
    }

    /// Free every buffer idle longer than the trim interval.
    pub fn trim(&self) {
        let now = Instant::now();
        let dropped: Vec<Vec<u8>> = match self.free.lock() {
            Ok(mut free) => self.trim_locked(&mut free, now),
            Err(_) => return,
        };
        drop(dropped); // freed outside the lock
    }

    fn trim_locked(&self, free: &mut VecDeque<(Instant, Vec<u8>)>, now: Instant) -> Vec<Vec<u8>> {
        let mut dropped = Vec::new();
        while let Some((since, _)) = free.front() {
            if now.duration_since(*since) < self.idle_trim {
                break;
            }
            if let Some((_, buffer)) = free.pop_front() {
                self.pooled_bytes.fetch_sub(buffer.len(), Ordering::Relaxed);
                dropped.push(buffer);
            }
        }
        dropped
    }

    pub fn stats(&self) -> BufferPoolStats {
        BufferPoolStats {
            pooled_bytes: self.pooled_bytes.load(Ordering::Relaxed) as u64,
            bytes_max: self.bytes_max as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_by_bytes_and_reused() {
        let pool = BufferPool::new(3 << 20, 4 << 20, Duration::from_secs(60));
        pool.give(vec![1u8; 1 << 20]);
        pool.give(vec![2u8; 1 << 20]);
        pool.give(vec![3u8; 2 << 20]); // would exceed 3 MiB: freed
        assert_eq!(pool.stats().pooled_bytes, 2 << 20);
        let b = pool.take(512 * 1024);
        assert_eq!(b.len(), 512 * 1024);
        assert_eq!(b[0], 2, "newest first");
        assert_eq!(pool.stats().pooled_bytes, 1 << 20);
        pool.give(vec![0u8; 8 << 20]); // over the per-buffer cap: freed
        pool.give(vec![0u8; 100]); // too small to pool
        assert_eq!(pool.stats().pooled_bytes, 1 << 20);
    }

    #[test]
    fn idle_buffers_are_trimmed() {
        let pool = BufferPool::new(64 << 20, 4 << 20, Duration::from_millis(10));
        for _ in 0..8 {
            pool.give(vec![0u8; 1 << 20]);
        }
        assert_eq!(pool.stats().pooled_bytes, 8 << 20);
        std::thread::sleep(Duration::from_millis(20));
        pool.trim();
        assert_eq!(pool.stats().pooled_bytes, 0);
    }
}
