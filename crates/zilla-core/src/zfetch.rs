//! zfetch: read-ahead of sequential streams (OpenZFS dmu_zfetch.c), one detector per
//! volume.
//!
//! Theory of operation
//! -------------------
//! Every demand read of a volume tells its [`Zfetch`] which blocks it covers
//! ([`Zfetch::access`], once per read, whether the ARC held the blocks or not). The
//! detector keeps up to `zfetch_max_streams` *streams*, each a guess that somebody reads
//! forward from a place:
//!
//! ```text
//!   stream:  next (the block a sequential reader reads next)
//!            pf_end (read ahead up to here, exclusive)   distance (blocks)   atime
//!
//!   ... | read ....... | next | prefetched, maybe in flight | pf_end
//!                             |<------------ distance --------------->|
//! ```
//!
//! A read that starts at a stream's `next` (or overlaps it, or, once the stream has a
//! distance, starts at most `min(distance, ZFETCH_REORDER_BYTES)` ahead of it: requests
//! of one reader that a queue delivered out of order) is a *hit*: `next` moves to the
//! read's end, the distance doubles (from twice the read's blocks at the first hit) up
//! to `zfetch_max_distance`, and the blocks in `[max(pf_end, next), next + distance)`
//! are returned to be read ahead; `pf_end` moves there. Only a read that covers `next`
//! doubles the distance: one that skipped ahead keeps it. Random reads land ahead of
//! some stream now and then; if each such landing doubled its distance, a few would
//! grow a stream to the cap and every later landing would read megabytes ahead for
//! nothing (a random 16K reader at QD32 read 1.5 times its bytes from the devices). A read that matches no stream is
//! a *miss* and starts a stream at its end, with no distance: a new stream prefetches
//! nothing until a read continues it, so random reads issue no I/O. A new stream takes a
//! free slot, else the slot of the least recently used stream idle for
//! `zfetch_min_sec_reap` seconds, else it is not made (`max_streams` counts that).
//!
//! The distance is also capped at an eighth of the ARC's limit (`zfs_arc_max`): blocks
//! read ahead wait in the ARC (kept at least `zfs_arc_min_prefetch_ms`) until the reader
//! comes, so a distance as large as the cache would evict them, and the reader's other
//! data, before use. With OpenZFS's `zfetch_max_distance` of 64 MiB that cap is what a
//! small ARC sees (8 MiB for a 64 MiB ARC); an ARC of 512 MiB or more gets the full
//! 64 MiB.
//!
//! I/O. The volume (zvol/volume/prefetch.rs) reads the returned blocks without waiting:
//! each block not dirty, not a hole and not in the ARC is read from its first copy with
//! class AsyncRead (blocks whose first copies lie back to back on one vdev, born in one
//! txg, as one device read of up to 1 MiB: a run, each block verified against its own
//! pointer when the span is cut) and inserted into the ARC as prefetched (counted as
//! `prefetch_data_misses`; one the ARC holds counts as `prefetch_data_hits`); a demand
//! read that then finds it counts a demand hit and `arc_prefetch_used`. An indirect block
//! the walk needs and the ARC lacks is read the same way as prefetched metadata and the
//! walk stops there (the next hit continues it). No read waits for a prefetch, and a
//! failed or unverified prefetch is dropped (the demand read reads, verifies and heals).
//!
//! Bounds. Prefetch reads in flight hold at most `ZFETCH_VOLUME_INFLIGHT_MAX_BYTES`
//! (16 MiB) per volume and `ZFETCH_INFLIGHT_MAX_BYTES` (64 MiB) in the process
//! ([`Zfetch::try_begin_io`]); a walk that meets either bound stops and gives the rest
//! of its range back to its stream (`pf_end` moves back), so the next hit retries it.
//! Streams per volume: at most `zfetch_max_streams`.
//!
//! Cost on the read path. One relaxed load when `zfs_prefetch_disable` is set; else the
//! volume's detector lock, taken with `try_lock` (a read that finds it busy is not
//! counted and prefetches nothing, so readers of one volume on other threads never wait
//! for each other here) for a scan of at most `zfetch_max_streams` entries. The
//! counters (`hits`, `misses`, `max_streams`) live under that lock and `io_issued` in
//! the volume's own atomic: nothing is shared between volumes on a hit.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::kstat::{Applies, Tunable};

pub static ZFS_PREFETCH_DISABLE: Tunable = Tunable::new(
    "zfs_prefetch_disable",
    0,
    0,
    1,
    Applies::Live,
    "1 = no read-ahead of sequential streams (OpenZFS: 0)",
);
pub static ZFETCH_MAX_DISTANCE: Tunable = Tunable::new(
    "zfetch_max_distance",
    64 << 20,
    0,
    1 << 30,
    Applies::Live,
    "How far ahead of a sequential reader a stream reads at most, in bytes (OpenZFS 2.2: 64 MiB); also capped at zfs_arc_max / 8",
);
pub static ZFETCH_MAX_STREAMS: Tunable = Tunable::new(
    "zfetch_max_streams",
    8,
    1,
    64,
    Applies::Live,
    "Sequential streams tracked per volume (OpenZFS: 8)",
);
pub static ZFETCH_MIN_SEC_REAP: Tunable = Tunable::new(
    "zfetch_min_sec_reap",
    1,
    0,
    3600,
    Applies::Live,
    "A stream idle this many seconds may be replaced by a new one (OpenZFS: 1)",
);

/// Prefetch bytes in flight per volume at most.
pub const ZFETCH_VOLUME_INFLIGHT_MAX_BYTES: u64 = 16 << 20;
/// Prefetch bytes in flight in the process at most (every pool, every volume).
pub const ZFETCH_INFLIGHT_MAX_BYTES: u64 = 64 << 20;
/// How far ahead of a stream's next block a read may start and still continue it.
pub const ZFETCH_REORDER_BYTES: u64 = 1 << 20;

/// Prefetch bytes in flight in the process.
static INFLIGHT_BYTES: AtomicU64 = AtomicU64::new(0);

/// The zfetchstats of one volume (OpenZFS's /proc/spl/kstat/zfs/zfetchstats names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ZfetchStats {
    /// Reads that continued a stream.
    pub hits: u64,
    /// Reads that matched no stream.
    pub misses: u64,
    /// Misses that found every stream slot taken by a stream not idle long enough.
    pub max_streams: u64,
    /// Blocks read ahead (a run of blocks read as one device I/O counts each).
    pub io_issued: u64,
}

impl ZfetchStats {
    pub fn add(&mut self, o: &ZfetchStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.max_streams += o.max_streams;
        self.io_issued += o.io_issued;
    }
}

#[derive(Debug, Clone, Copy)]
struct Stream {
    next: u64,
    pf_end: u64,
    /// Blocks ahead of `next` to keep read; 0 until the first hit.
    distance: u64,
    atime_ns: u64,
}

#[derive(Default)]
struct Streams {
    list: Vec<Stream>,
    stats: ZfetchStats,
}

/// What bounds a stream of one volume: the largest distance (blocks), the volume's
/// size (blocks) and its block size.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_distance: u64,
    pub nblocks: u64,
    pub block_bytes: u64,
}

/// One volume's stream detector and prefetch accounting (module comment).
#[derive(Default)]
pub struct Zfetch {
    streams: Mutex<Streams>,
    inflight_bytes: AtomicU64,
    io_issued: AtomicU64,
}

/// Whether read-ahead is on (`zfs_prefetch_disable` = 0).
#[inline]
pub fn enabled() -> bool {
    ZFS_PREFETCH_DISABLE.get() == 0
}

/// The largest distance in blocks of `block_bytes` for an ARC limited to `arc_max_bytes`.
pub fn max_distance_blocks(block_bytes: u64, arc_max_bytes: u64) -> u64 {
    ZFETCH_MAX_DISTANCE.get().min(arc_max_bytes / 8) / block_bytes.max(1)
}

impl Zfetch {
    /// A demand read of blocks `[blkid, blkid + nblks)` at `now_ns`: the blocks to read
    /// ahead now (empty: none). `None` when the detector was busy (another reader holds
    /// it).
    pub fn access(&self, blkid: u64, nblks: u64, now_ns: u64, limits: Limits) -> Option<Range<u64>> {
        let mut s = self.streams.try_lock()?;
        let nblks = nblks.max(1);
        let end = blkid.saturating_add(nblks);
        let reorder = (4 * nblks).max(ZFETCH_REORDER_BYTES / limits.block_bytes.max(1));
        let found = s.list.iter().position(|st| continues(st, blkid, end, reorder));
        let Some(i) = found else {
            s.stats.misses += 1;
            new_stream(&mut s, end, now_ns);
            return Some(0..0);
        };
        s.stats.hits += 1;
        let st = &mut s.list[i];
        st.atime_ns = now_ns;
        if end <= st.next {
            return Some(0..0); // a straggler behind the stream: nothing new
        }
        // only a read that covers the stream's next block lengthens its reach: one that
        // skipped ahead (a reordered request, or a random read that happened to land
        // there) moves the stream on at its distance, so random reads never grow one
        let exact = blkid <= st.next;
        st.next = end;
        if exact {
            st.distance = if st.distance == 0 { 2 * nblks } else { st.distance.saturating_mul(2) };
        }
        st.distance = st.distance.min(limits.max_distance);
        let start = st.pf_end.max(st.next);
        let target = st.next.saturating_add(st.distance).min(limits.nblocks);
        if target <= start {
            return Some(0..0);
        }
        st.pf_end = target;
        Some(start..target)
    }

    /// A walk of `range` (from [`Zfetch::access`]) stopped at `stopped` (a bound, an
    /// indirect block being read): the stream that read ahead to `range.end` will read
    /// from `stopped` again at its next hit.
    pub fn give_back(&self, range: Range<u64>, stopped: u64) {
        let mut s = self.streams.lock();
        if let Some(st) = s.list.iter_mut().find(|st| st.pf_end == range.end) {
            st.pf_end = stopped.max(range.start).min(st.pf_end);
        }
    }

    /// Count `bytes` of prefetch I/O of `blocks` blocks about to be issued, if both
    /// bounds allow it (module comment, "Bounds"); pair with [`Zfetch::end_io`].
    pub fn try_begin_io(&self, bytes: u64, blocks: u64) -> bool {
        if self.inflight_bytes.load(Ordering::Relaxed) + bytes > ZFETCH_VOLUME_INFLIGHT_MAX_BYTES {
            return false;
        }
        if INFLIGHT_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes > ZFETCH_INFLIGHT_MAX_BYTES {
            INFLIGHT_BYTES.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        self.inflight_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.io_issued.fetch_add(blocks, Ordering::Relaxed);
        true
    }

    /// A prefetch read counted by [`Zfetch::try_begin_io`] completed (or failed).
    pub fn end_io(&self, bytes: u64) {
        self.inflight_bytes.fetch_sub(bytes, Ordering::Relaxed);
        INFLIGHT_BYTES.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Prefetch bytes of this volume in flight.
    pub fn inflight_bytes(&self) -> u64 {
        self.inflight_bytes.load(Ordering::Relaxed)
    }

    /// The volume's counters.
    pub fn stats(&self) -> ZfetchStats {
        let mut st = self.streams.lock().stats;
        st.io_issued = self.io_issued.load(Ordering::Relaxed);
        st
    }

    /// Streams tracked now.
    pub fn stream_count(&self) -> usize {
        self.streams.lock().list.len()
    }
}

/// Prefetch bytes in flight in the process.
pub fn inflight_bytes_total() -> u64 {
    INFLIGHT_BYTES.load(Ordering::Relaxed)
}

/// Does a read of `[blkid, end)` continue stream `st`: it covers the stream's next
/// block, or (a stream with a distance) starts at most `min(distance, reorder)` blocks
/// ahead of it, or ends at most that far behind it (requests of one reader delivered
/// out of order).
fn continues(st: &Stream, blkid: u64, end: u64, reorder: u64) -> bool {
    if blkid <= st.next && st.next < end {
        return true;
    }
    // (a read ending right at `next` is the stream's own last read seen again: a read
    // that went the blocking way after its asynchronous try)
    let window = st.distance.min(reorder);
    (blkid > st.next && blkid - st.next <= window) || (end <= st.next && st.next - end < window.max(1))
}

/// A miss at `end`: a new stream there, in a free slot or the slot of the least
/// recently used stream idle for `zfetch_min_sec_reap`.
fn new_stream(s: &mut Streams, end: u64, now_ns: u64) {
    let fresh = Stream { next: end, pf_end: end, distance: 0, atime_ns: now_ns };
    if s.list.len() < ZFETCH_MAX_STREAMS.get() as usize {
        s.list.push(fresh);
        return;
    }
    let reap_ns = ZFETCH_MIN_SEC_REAP.get().saturating_mul(1_000_000_000);
    let lru = s.list.iter().enumerate().filter(|(_, st)| now_ns.saturating_sub(st.atime_ns) >= reap_ns).min_by_key(|(_, st)| st.atime_ns).map(|(i, _)| i);
    match lru {
        Some(i) => s.list[i] = fresh,
        None => {
            // a lowered zfetch_max_streams: drop what is over it
            let max = ZFETCH_MAX_STREAMS.get() as usize;
            s.list.truncate(max.max(1));
            s.stats.max_streams += 1;
        }
    }
}
