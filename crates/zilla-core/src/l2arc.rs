//! l2arc: the second-level ARC on a pool's cache devices (OpenZFS's L2ARC).
//!
//! Theory of operation
//! -------------------
//! Reads go ARC → L2ARC → pool. A pool's `cache` vdevs (striped, never mirrored: losing
//! one costs hits, never data) each hold a *ring*: a write hand sweeps the device's data
//! area from start to end and wraps, overwriting the oldest copies; there is no
//! allocator.
//!
//! ```text
//!   cache device:  [labels][ ring: start ........ hand ........ end ][labels]
//!                           oldest copies ahead of the hand, newest behind it
//! ```
//!
//! The feed. Each feed first scans the eviction ends of the ARC's lists for this pool's
//! blocks no cache device holds yet (`l2arc_headroom` × `l2arc_write_max` bytes per
//! list, [`ArcCache::tail_blocks`]), so a block is written before it leaves DRAM.
//! When the daemon's ARC evicts a block whose [`crate::arc::CacheHint`]
//! allows a cache device (the volume's `secondarycache`, and not a prefetch nobody used
//! while `l2arc_noprefetch` is on), it hands the block to the pool's L2ARC
//! ([`crate::arc::EvictSink`]) instead of dropping it: a bounded queue (two feeds'
//! worth of bytes; beyond it blocks are dropped and counted, the pressure valve of
//! OpenZFS's design). The feed thread takes up to `l2arc_write_max` bytes from it every
//! `l2arc_feed_secs` (plus `l2arc_write_boost` while the ARC has not evicted anything
//! for long, i.e. warming), metadata and MFU blocks first (all of them, or MFU only
//! with `l2arc_mfuonly`), and writes them to the devices round-robin: for each device,
//! the copies ahead of the hand that the batch overwrites are forgotten first, then the
//! batch goes out as one vectored write at the hand, and only once it is on the device
//! are its headers published for readers.
//!
//! Headers. Each copy is a small header in DRAM (headers.rs: 32 bytes and a 4-byte
//! index slot, at most 64 bytes per copy with every slack): the block's key, where it
//! is, its length and kind. A block is stored in its logical (decompressed) form. A
//! read that finds a header reads the copy and returns it only if it matches the block
//! pointer's checksum (compressed again first if the block was, [`verify_copy`]); a bad, stale
//! (overwritten by the ring since the lookup) or unreadable copy is counted
//! (`l2_cksum_bad`, `l2_io_error`), its header dropped, and the read goes to the pool.
//! Keys carry the birth txg and the pool is the L2ARC's own, so a freed or rewritten
//! block is never served; a freed block's header is dropped at once. Header memory is
//! capped at `l2arc_meta_percent` of the ARC's c_max: past it the feed adds nothing.
//!
//! Faults. A cache device whose reads, or whose writes, fail `FAULT_AFTER_ERRORS` times
//! in a row (each direction counted on its own) is FAULTED (shown so in `pool
//! status`): its headers are dropped and the feed skips it; the pool carries on.
//! `pool clear` (or `pool online`) of the device brings it back, empty.
//!
//! Bounds: the feed queue ≤ 2 × (write_max + write_boost) bytes; headers ≤
//! l2arc_meta_percent of c_max; one feed thread per pool with cache devices.

pub mod headers;
pub mod persist;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::arc::{ArcCache, BlockKey, BufKind, EvictSink};
use crate::block::blkptr::BlockPointer;
use crate::block::checksum::{self, ChecksumAlgo};
use crate::block::compress::{self, Compression};
use headers::{Headers, Loc};
use crate::kstat::{Applies, Tunable};
use crate::vdev::abd::AlignedBuf;
use crate::vdev::mirror::{Leaf, LeafState, TopVdev};
use crate::vdev::queue::{IoRequest, WriteBytes};
use crate::vdev::IoClass;

pub static L2ARC_WRITE_MAX: Tunable = Tunable::new(
    "l2arc_write_max",
    32 << 20,
    4096,
    1 << 34,
    Applies::Live,
    "Bytes the L2ARC feed writes to a pool's cache devices per feed interval (OpenZFS 2.3: 32 MiB)",
);
pub static L2ARC_WRITE_BOOST: Tunable = Tunable::new(
    "l2arc_write_boost",
    32 << 20,
    0,
    1 << 34,
    Applies::Live,
    "Extra bytes per feed while the ARC is warming (it has evicted nothing for a while) (OpenZFS 2.3: 32 MiB)",
);
pub static L2ARC_FEED_SECS: Tunable = Tunable::new(
    "l2arc_feed_secs",
    1,
    1,
    3600,
    Applies::Live,
    "Seconds between L2ARC feeds (OpenZFS: 1)",
);
pub static L2ARC_HEADROOM: Tunable = Tunable::new(
    "l2arc_headroom",
    8,
    0,
    1024,
    Applies::Live,
    "Each feed also scans the ARC lists' eviction ends for this many times l2arc_write_max bytes of blocks not yet on a cache device; 0: only what eviction hands over (OpenZFS: 8)",
);
pub static L2ARC_NOPREFETCH: Tunable = Tunable::new(
    "l2arc_noprefetch",
    1,
    0,
    1,
    Applies::Live,
    "1: prefetched blocks no demand read used are not written to cache devices (OpenZFS: 1)",
);
pub static L2ARC_MFUONLY: Tunable = Tunable::new(
    "l2arc_mfuonly",
    0,
    0,
    2,
    Applies::Live,
    "Which evicted blocks the L2ARC takes: 0 MRU and MFU, 1 MFU only, 2 all metadata and MFU data (OpenZFS: 0)",
);
pub static L2ARC_REBUILD_ENABLED: Tunable = Tunable::new(
    "l2arc_rebuild_enabled",
    1,
    0,
    1,
    Applies::NextPoolOpen,
    "1: at import, restore what a cache device held from its log blocks (persistent L2ARC); 0: start it empty (OpenZFS: 1)",
);
pub static L2ARC_META_PERCENT: Tunable = Tunable::new(
    "l2arc_meta_percent",
    33,
    1,
    100,
    Applies::Live,
    "L2ARC headers may take at most this percent of zfs_arc_max in DRAM; past it the feed adds nothing (OpenZFS: 33)",
);

/// Consecutive I/O errors that fault a cache device.
pub const FAULT_AFTER_ERRORS: u64 = 10;
/// The ring's unit: every copy starts and ends on it.
const RING_UNIT_BYTES: u64 = headers::UNIT_BYTES;
/// The most DRAM a header takes, slack included (headers.rs): the rebuild's bound on
/// how many it restores within the `l2arc_meta_percent` cap.
pub const HDR_BYTES_MAX: u64 = 64;

/// A cache device's ring (under its mutex).
struct Ring {
    hand: u64,
    /// The newest log block (address, length; 0: none) and the header's sequence.
    newest_log: u64,
    newest_log_len: u32,
    header_seq: u64,
    /// Feed batches written so far (their log blocks' sequence).
    batch_seq: u64,
    /// The rebuild has run (or was not wanted): the feed may write.
    rebuilt: bool,
    /// Still on the first sweep (nothing ahead of the hand yet).
    first_sweep: bool,
    /// The copies, in write order (= address order within a sweep), and their index.
    hdrs: Headers,
}

struct CacheDev {
    top: Arc<TopVdev>,
    leaf: Arc<Leaf>,
    start: u64,
    end: u64,
    ring: Mutex<Ring>,
    faulted: AtomicBool,
    /// Taken out of the pool (`pool remove`): no more writes or reads.
    removed: AtomicBool,
    /// Held by the feed while it writes to the device: a removal waits for it, so no
    /// write of the feed lands on a device after it left the pool.
    writing: Mutex<()>,
    read_errors_in_a_row: AtomicU64,
    write_errors_in_a_row: AtomicU64,
}

/// A copy about to be written: key, bytes (padded to the ring's unit), kind, length.
type Item = (BlockKey, Arc<AlignedBuf>, BufKind, u64);

/// A block handed over by the ARC's eviction.
struct Fed {
    key: BlockKey,
    data: Arc<AlignedBuf>,
    kind: BufKind,
    mfu: bool,
}

#[derive(Default)]
struct FeedQueue {
    blocks: VecDeque<Fed>,
    bytes: u64,
    stop: bool,
}

/// Counters with OpenZFS's arcstats names (`l2_*`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct L2Stats {
    pub l2_hits: u64,
    pub l2_misses: u64,
    pub l2_feeds: u64,
    pub l2_writes_sent: u64,
    pub l2_writes_done: u64,
    pub l2_writes_error: u64,
    pub l2_write_bytes: u64,
    pub l2_read_bytes: u64,
    pub l2_cksum_bad: u64,
    pub l2_io_error: u64,
    pub l2_abort_lowmem: u64,
    /// Blocks the ARC handed over that the queue had no room for.
    pub l2_feed_dropped: u64,
    pub l2_size: u64,
    pub l2_asize: u64,
    pub l2_hdr_size: u64,
    /// Copies on the cache devices (headers).
    pub l2_blocks: u64,
    /// Cache devices whose contents a rebuild restored (at least one log block).
    pub l2_rebuild_success: u64,
    pub l2_rebuild_log_blks: u64,
    pub l2_rebuild_bufs: u64,
    /// Device headers that could not be read (an I/O error): the device started empty
    /// (OpenZFS's `l2_rebuild_dh_errors`).
    pub l2_rebuild_dh_errors: u64,
    /// Device headers read but not this device's (none written yet, another pool's,
    /// another geometry, overwritten, torn): the device started empty (OpenZFS's
    /// `l2_rebuild_unsupported`).
    pub l2_rebuild_unsupported: u64,
    /// Log blocks that failed their checks (checksum, magic, geometry, sequence).
    pub l2_rebuild_cksum_lb_errors: u64,
    pub l2_rebuild_io_errors: u64,
    /// Rebuilds stopped by the header memory cap.
    pub l2_rebuild_lowmem: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    feeds: AtomicU64,
    writes_sent: AtomicU64,
    writes_done: AtomicU64,
    writes_error: AtomicU64,
    write_bytes: AtomicU64,
    read_bytes: AtomicU64,
    cksum_bad: AtomicU64,
    io_error: AtomicU64,
    abort_lowmem: AtomicU64,
    feed_dropped: AtomicU64,
    rebuild_success: AtomicU64,
    rebuild_log_blks: AtomicU64,
    rebuild_bufs: AtomicU64,
    rebuild_dh_errors: AtomicU64,
    rebuild_unsupported: AtomicU64,
    rebuild_cksum_lb_errors: AtomicU64,
    rebuild_io_errors: AtomicU64,
    rebuild_lowmem: AtomicU64,
}

/// A pool's L2ARC (module comment).
pub struct L2Arc {
    load_id: u32,
    env: Arc<dyn crate::env::Env>,
    arc: Arc<ArcCache>,
    devs: RwLock<Vec<Arc<CacheDev>>>,
    queue: Mutex<FeedQueue>,
    feed_cv: Condvar,
    counters: Counters,
    /// The device the next feed starts with.
    next_dev: AtomicU64,
}

/// The ARC's sink: hands each evicted block to its pool's L2ARC.
struct Router {
    pools: RwLock<HashMap<u32, Weak<L2Arc>>>,
}

impl EvictSink for Router {
    fn evicted(&self, pool: u32, key: BlockKey, data: Arc<AlignedBuf>, kind: BufKind, mfu: bool, prefetched: bool) {
        let l2 = self.pools.read().get(&pool).and_then(Weak::upgrade);
        if let Some(l2) = l2 {
            l2.offer(key, data, kind, mfu, prefetched);
        }
    }
}

fn router() -> &'static Arc<Router> {
    static ROUTER: std::sync::OnceLock<Arc<Router>> = std::sync::OnceLock::new();
    ROUTER.get_or_init(|| Arc::new(Router { pools: RwLock::new(HashMap::new()) }))
}

/// Whether `copy` (a cache device's copy of `bp`'s block: its logical bytes, zero
/// padded to the ring's unit) is that block: the block pointer's checksum over the
/// block as the pool wrote it (compressed again with its algorithm if it was
/// compressed, zero padded to its allocated size). Cut to the logical size.
fn verify_copy(bp: &BlockPointer, copy: &mut AlignedBuf) -> bool {
    let lsize = bp.lsize as usize;
    let asize = bp.dva[0].asize as usize;
    let ok = copy.len() >= lsize
        && match (bp.checksum_algo(), bp.compression()) {
            (Some(ChecksumAlgo::Off), Some(_)) => true,
            (Some(algo), Some(Compression::Off)) if copy.len() == asize => checksum::compute(algo, copy) == bp.checksum,
            (Some(algo), Some(Compression::Off)) => {
                let mut phys = AlignedBuf::zeroed(asize.max(lsize));
                phys[..lsize].copy_from_slice(&copy[..lsize]);
                checksum::compute(algo, &phys) == bp.checksum
            }
            (Some(algo), Some(c)) => match compress::compress(c, &copy[..lsize]) {
                Some(z) if z.len() == bp.psize as usize && z.len() <= asize => {
                    let mut phys = AlignedBuf::zeroed(asize);
                    phys[..z.len()].copy_from_slice(&z);
                    checksum::compute(algo, &phys) == bp.checksum
                }
                _ => false,
            },
            _ => false,
        };
    copy.resize(lsize.min(copy.len()));
    ok
}

impl CacheDev {
    fn new(top: Arc<TopVdev>) -> Option<Arc<CacheDev>> {
        let leaf = top.children().into_iter().next()?;
        let size = leaf.device().size();
        // the device header's slot, then the ring
        let start = (crate::vdev::label::DATA_START + persist::DEV_HDR_BYTES).next_multiple_of(RING_UNIT_BYTES);
        let end = crate::vdev::label::usable_end(size).min(headers::ADDR_MAX) / RING_UNIT_BYTES * RING_UNIT_BYTES;
        if end <= start + 4 * RING_UNIT_BYTES {
            return None;
        }
        let faulted = !leaf.readable();
        Some(Arc::new(CacheDev {
            top,
            leaf,
            start,
            end,
            ring: Mutex::new(Ring {
                hand: start,
                newest_log: 0,
                newest_log_len: 0,
                header_seq: 0,
                batch_seq: 0,
                rebuilt: false,
                first_sweep: true,
                hdrs: Headers::default(),
            }),
            faulted: AtomicBool::new(faulted),
            removed: AtomicBool::new(false),
            writing: Mutex::new(()),
            read_errors_in_a_row: AtomicU64::new(0),
            write_errors_in_a_row: AtomicU64::new(0),
        }))
    }

    fn usable(&self) -> bool {
        if self.faulted.load(Ordering::Relaxed) && self.leaf.readable() {
            // `pool clear` or `pool online` brought a faulted device back: it starts
            // over empty (its headers were dropped at the fault) with no errors counted
            self.read_errors_in_a_row.store(0, Ordering::Relaxed);
            self.write_errors_in_a_row.store(0, Ordering::Relaxed);
            self.faulted.store(false, Ordering::Relaxed);
        }
        !self.faulted.load(Ordering::Relaxed) && !self.removed.load(Ordering::Relaxed) && self.leaf.readable()
    }

    /// Forget every copy in [from, to) ahead of the hand (the ring is about to write
    /// there): they are the oldest, at the front of the write order.
    fn evict_ahead(ring: &mut Ring, from: u64, to: u64) {
        ring.hdrs.forget_front_in(from, to);
    }

    /// Reserve `asize` bytes at the hand: forget what lies there, wrap at the end.
    /// Returns the address.
    fn claim(&self, ring: &mut Ring, asize: u64) -> u64 {
        debug_assert!(asize <= (self.end - self.start) / 4, "a feed write beyond a quarter of the device");
        if ring.hand + asize > self.end {
            // the tail end is left unused this sweep; what lies there is forgotten
            if !ring.first_sweep {
                let hand = ring.hand;
                Self::evict_ahead(ring, hand, self.end);
            }
            ring.hand = self.start;
            ring.first_sweep = false;
        }
        let at = ring.hand;
        if !ring.first_sweep {
            Self::evict_ahead(ring, at, at + asize);
        }
        ring.hand = at + asize;
        at
    }

    fn drop_all(&self) {
        self.ring.lock().hdrs.clear();
    }

    /// A read's outcome. Reads and writes keep separate runs of errors: a device whose
    /// every write fails is faulted even while reads of its older copies still work
    /// (each success would otherwise end the run).
    fn note_read(&self, ok: bool) {
        self.note_io(&self.read_errors_in_a_row, ok);
    }

    fn note_write(&self, ok: bool) {
        self.note_io(&self.write_errors_in_a_row, ok);
    }

    fn note_io(&self, errors_in_a_row: &AtomicU64, ok: bool) {
        if ok {
            errors_in_a_row.store(0, Ordering::Relaxed);
            return;
        }
        let n = errors_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= FAULT_AFTER_ERRORS && !self.faulted.swap(true, Ordering::Relaxed) {
            self.leaf.set_state(LeafState::Faulted);
            tracing::warn!(device = %self.leaf.spec.shown(), errors = n, "cache device faulted after I/O errors; the pool carries on without it");
            self.drop_all();
        }
    }
}

impl L2Arc {
    /// The L2ARC of the pool whose ARC handle has load id `load_id`, on its cache vdevs
    /// `caches`; None without usable cache devices. Starts the feed thread. `restore`:
    /// the devices may hold copies to rebuild (an import); a new pool's or a device just
    /// added has none, so no rebuild is tried and no rebuild counter moves.
    pub fn start(load_id: u32, arc: &Arc<ArcCache>, caches: Vec<Arc<TopVdev>>, env: &Arc<dyn crate::env::Env>, restore: bool) -> Option<Arc<L2Arc>> {
        let devs: Vec<Arc<CacheDev>> = caches.into_iter().filter_map(CacheDev::new).collect();
        if devs.is_empty() {
            return None;
        }
        if !restore {
            for d in &devs {
                d.ring.lock().rebuilt = true;
            }
        }
        let l2 = Arc::new(L2Arc {
            load_id,
            env: env.clone(),
            arc: arc.clone(),
            devs: RwLock::new(devs),
            queue: Mutex::new(FeedQueue::default()),
            feed_cv: Condvar::new(),
            counters: Counters::default(),
            next_dev: AtomicU64::new(0),
        });
        router().pools.write().insert(load_id, Arc::downgrade(&l2));
        arc.set_evict_sink(Some(router().clone() as Arc<dyn EvictSink>));
        let weak = Arc::downgrade(&l2);
        let spawned = env.spawn(
            "l2arc_feed".into(),
            Box::new(move || {
                if let Some(l2) = weak.upgrade().filter(|_| restore) {
                    l2.rebuild_all();
                }
                loop {
                    let Some(l2) = weak.upgrade() else { return };
                    if !l2.feed_once() {
                        return;
                    }
                }
            }),
        );
        if let Err(e) = spawned {
            tracing::warn!("cannot start the L2ARC feed thread: {e}; the cache devices stay empty");
        }
        Some(l2)
    }

    /// Stop the feed (export); the thread ends at its next wake-up.
    pub fn stop(&self) {
        router().pools.write().remove(&self.load_id);
        let mut q = self.queue.lock();
        q.stop = true;
        q.blocks.clear();
        q.bytes = 0;
        self.feed_cv.notify_all();
    }

    fn queue_max_bytes() -> u64 {
        2 * (L2ARC_WRITE_MAX.get() + L2ARC_WRITE_BOOST.get())
    }

    /// A block the ARC evicted, or found near its eviction end (module comment, "The
    /// feed"). Returns whether it was queued.
    fn offer(&self, key: BlockKey, data: Arc<AlignedBuf>, kind: BufKind, mfu: bool, prefetched: bool) -> bool {
        if prefetched && L2ARC_NOPREFETCH.get() == 1 {
            return false;
        }
        let wanted = match L2ARC_MFUONLY.get() {
            1 => mfu,
            2 => mfu || kind == BufKind::Metadata,
            _ => true,
        };
        if !wanted {
            return false;
        }
        let len = data.len() as u64;
        if len == 0 || len > u32::MAX as u64 {
            return false;
        }
        let mut q = self.queue.lock();
        if q.stop {
            return false;
        }
        if q.bytes + len > Self::queue_max_bytes() {
            self.counters.feed_dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        q.bytes += len;
        q.blocks.push_back(Fed { key, data, kind, mfu });
        true
    }

    /// Queue blocks from the ARC lists' eviction ends that no cache device holds yet,
    /// until the queue holds `budget` bytes, walking at most `l2arc_headroom` ×
    /// `l2arc_write_max` bytes per list: the blocks about to be evicted are on a cache
    /// device before they leave DRAM (OpenZFS feeds only this way).
    fn scan_arc_tails(&self, budget: u64) {
        let walk = L2ARC_WRITE_MAX.get().saturating_mul(L2ARC_HEADROOM.get());
        let mut want = budget.saturating_sub(self.queue.lock().bytes);
        if walk == 0 || want == 0 {
            return;
        }
        self.arc.tail_blocks(self.load_id, walk, &mut |key, data, kind, mfu, prefetched| {
            let len = data.len() as u64;
            if !self.holds(&key) && self.offer(key, data, kind, mfu, prefetched) {
                want = want.saturating_sub(len);
            }
            want > 0
        });
    }

    /// DRAM the headers of every cache device take (`l2_hdr_size`).
    fn hdr_bytes(&self) -> u64 {
        self.devs.read().iter().map(|d| d.ring.lock().hdrs.memory_bytes()).sum()
    }

    /// One feed: wait the interval (or stop), then write a batch. False when stopped.
    fn feed_once(&self) -> bool {
        let secs = L2ARC_FEED_SECS.get().max(1);
        {
            let mut q = self.queue.lock();
            if !q.stop {
                crate::env::wait_ns(&*self.env, &self.feed_cv, &mut q, secs * 1_000_000_000);
            }
            if q.stop {
                return false;
            }
        }
        let arc = self.arc.stats();
        let warming = arc.evictions == 0 || arc.size < arc.c / 2;
        let budget = L2ARC_WRITE_MAX.get() + if warming { L2ARC_WRITE_BOOST.get() } else { 0 };
        self.scan_arc_tails(budget);
        let batch: Vec<Fed> = {
            let mut q = self.queue.lock();
            // metadata and MFU first, then the rest, oldest first within each
            let mut taken = Vec::new();
            let mut bytes = 0;
            for pass in 0..3 {
                let mut rest = VecDeque::with_capacity(q.blocks.len());
                while let Some(f) = q.blocks.pop_front() {
                    let first = match pass {
                        0 => f.kind == BufKind::Metadata,
                        1 => f.mfu,
                        _ => true,
                    };
                    if first && bytes + f.data.len() as u64 <= budget {
                        bytes += f.data.len() as u64;
                        taken.push(f);
                    } else {
                        rest.push_back(f);
                    }
                }
                q.blocks = rest;
            }
            q.bytes = q.blocks.iter().map(|f| f.data.len() as u64).sum();
            taken
        };
        if batch.is_empty() {
            return true;
        }
        // the header cap (l2arc_meta_percent of c_max)
        let cap = self.arc.c_max() / 100 * L2ARC_META_PERCENT.get();
        if self.hdr_bytes() >= cap {
            self.counters.abort_lowmem.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.counters.feeds.fetch_add(1, Ordering::Relaxed);
        let devs: Vec<Arc<CacheDev>> = self.devs.read().iter().filter(|d| d.usable()).cloned().collect();
        if devs.is_empty() {
            return true;
        }
        // round-robin: each device gets a share of the batch, in order
        let first = self.next_dev.fetch_add(1, Ordering::Relaxed) as usize;
        let mut per_dev: Vec<Vec<Fed>> = (0..devs.len()).map(|_| Vec::new()).collect();
        for (i, f) in batch.into_iter().enumerate() {
            per_dev[(first + i) % devs.len()].push(f);
        }
        for (dev, blocks) in devs.iter().zip(per_dev) {
            self.write_batch(dev, blocks);
        }
        true
    }

    /// Write `blocks` at `dev`'s hand as one vectored write; publish their headers once
    /// it completed.
    fn write_batch(&self, dev: &Arc<CacheDev>, blocks: Vec<Fed>) {
        let _writing = dev.writing.lock();
        if !dev.usable() {
            return;
        }
        let Some((items, at, total)) = Self::place(dev, blocks) else { return };
        // (1) the range this batch overwrites, in the header; (2) the copies and the
        // batch's log block in one write; (3) the header names the log block (persist.rs)
        let (log, log_at, log_len) = Self::log_block(dev, &items, at, total);
        if !self.write_header(dev, Some((at, log_at + log_len))) {
            return;
        }
        let mut bufs: Vec<Arc<AlignedBuf>> = items.iter().map(|(_, d, ..)| d.clone()).collect();
        bufs.push(log);
        self.counters.writes_sent.fetch_add(1, Ordering::Relaxed);
        let w = crate::vdev::queue::Waiter::new();
        dev.leaf.queue.submit(IoRequest::write(IoClass::AsyncWrite, at, WriteBytes::Vectored(Arc::new(bufs)), w.completion()).durable());
        let ok = w.wait().result.is_ok();
        dev.note_write(ok);
        if !ok {
            self.counters.writes_error.fetch_add(1, Ordering::Relaxed);
            return;
        }
        {
            let mut r = dev.ring.lock();
            r.newest_log = log_at;
            r.newest_log_len = log_len as u32;
        }
        if !self.write_header(dev, None) {
            return;
        }
        self.counters.writes_done.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(total, Ordering::Relaxed);
        // one feed thread claims and writes: nothing reclaimed [at, at + total) meanwhile
        let mut r = dev.ring.lock();
        // faulted by a read while this batch was written: the fault dropped every header
        // (under this lock, after setting the flag), and these must not come back
        if dev.faulted.load(Ordering::Relaxed) {
            return;
        }
        let mut addr = at;
        for (key, data, kind, len) in items {
            if !r.hdrs.contains(&key) {
                r.hdrs.push(key, Loc { addr, len: len as u32, kind });
            }
            addr += (data.len() as u64).max(len);
        }
    }

    /// The blocks of a batch `dev` does not hold yet (padded to the ring's unit, at
    /// most a quarter of the ring and `LOG_ENTRIES_MAX` of them), placed at the hand
    /// with room for their log block: (items, address, bytes of copies).
    fn place(dev: &CacheDev, blocks: Vec<Fed>) -> Option<(Vec<Item>, u64, u64)> {
        let mut items: Vec<Item> = Vec::new();
        let mut seen: std::collections::HashSet<BlockKey, foldhash::fast::RandomState> = Default::default();
        {
            let mut r = dev.ring.lock();
            let mut total = 0u64;
            let quarter = (dev.end - dev.start) / 4;
            for f in blocks {
                if items.len() >= persist::LOG_ENTRIES_MAX {
                    break;
                }
                if r.hdrs.contains(&f.key) || !seen.insert(f.key) {
                    continue;
                }
                let len = f.data.len() as u64;
                let asize = len.next_multiple_of(RING_UNIT_BYTES);
                if total + asize + persist::log_block_bytes(items.len() + 1) > quarter {
                    break;
                }
                let data = if asize == len {
                    f.data
                } else {
                    let mut b = AlignedBuf::zeroed(asize as usize);
                    b[..len as usize].copy_from_slice(&f.data);
                    Arc::new(b)
                };
                items.push((f.key, data, f.kind, len));
                total += asize;
            }
            if items.is_empty() || !r.rebuilt {
                return None;
            }
            let log_bytes = persist::log_block_bytes(items.len());
            let at = dev.claim(&mut r, total + log_bytes);
            Some((items, at, total))
        }
    }

    /// The log block of a batch placed at `at` (`total` bytes of copies): (its bytes,
    /// its address, its length).
    fn log_block(dev: &CacheDev, items: &[Item], at: u64, total: u64) -> (Arc<AlignedBuf>, u64, u64) {
        {
            let mut r = dev.ring.lock();
            let entries: Vec<persist::LogEntry> = {
                let mut addr = at;
                items
                    .iter()
                    .map(|(key, data, kind, len)| {
                        let e = persist::LogEntry { key: *key, kind: *kind, addr, len: *len as u32, reserved: 0 };
                        addr += data.len() as u64;
                        e
                    })
                    .collect()
            };
            r.batch_seq += 1;
            let log = persist::LogBlock { top_guid: dev.top.guid.get(), seq: r.batch_seq, prev: r.newest_log, prev_len: r.newest_log_len, batch_start: at, batch_end: at + total, entries };
            let bytes = log.encode();
            let log_len = bytes.len() as u64;
            (Arc::new(AlignedBuf::from(bytes)), at + total, log_len)
        }
    }

    /// Write `dev`'s header (persist.rs): the ring as it is, with `evict` the range a
    /// batch is about to overwrite. Durable before it returns. False on an error (the
    /// batch is then not written, or not recorded).
    fn write_header(&self, dev: &CacheDev, evict: Option<(u64, u64)>) -> bool {
        let bytes = {
            let mut r = dev.ring.lock();
            r.header_seq += 1;
            let (evict_from, evict_to) = evict.unwrap_or((0, 0));
            persist::DevHeader {
                first_sweep: r.first_sweep,
                top_guid: dev.top.guid.get(),
                leaf_guid: dev.leaf.guid.get(),
                ring_start: dev.start,
                ring_end: dev.end,
                hand: if evict.is_some() { r.newest_log + r.newest_log_len as u64 } else { r.hand },
                evict_from,
                evict_to,
                newest_log: r.newest_log,
                newest_log_len: r.newest_log_len,
                seq: r.header_seq,
            }
            .encode()
        };
        let w = crate::vdev::queue::Waiter::new();
        let at = dev.start - persist::DEV_HDR_BYTES;
        dev.leaf.queue.submit(IoRequest::write(IoClass::AsyncWrite, at, Arc::new(AlignedBuf::from(bytes)), w.completion()).durable());
        let ok = w.wait().result.is_ok();
        dev.note_write(ok);
        if !ok {
            self.counters.writes_error.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Restore every cache device's copies from its log blocks, or start it empty.
    fn rebuild_all(&self) {
        let devs: Vec<Arc<CacheDev>> = self.devs.read().clone();
        for dev in devs {
            if L2ARC_REBUILD_ENABLED.get() == 1 && dev.usable() {
                self.rebuild(&dev);
            }
            let mut r = dev.ring.lock();
            r.rebuilt = true;
        }
    }

    /// The rebuild of one device (persist.rs, "Rebuild").
    fn rebuild(&self, dev: &CacheDev) {
        let geo = persist::Geometry { start: dev.start, end: dev.end };
        let Some(h) = self.read_header(dev, &geo) else { return };
        let batches = self.walk_logs(dev, &h, &geo);
        self.restore(dev, &h, &batches);
    }

    /// `dev`'s header if it is this cache vdev's (else counted: the device starts empty).
    fn read_header(&self, dev: &CacheDev, geo: &persist::Geometry) -> Option<persist::DevHeader> {
        let hdr_at = dev.start - persist::DEV_HDR_BYTES;
        let hdr = match dev.leaf.queue.read_buf(IoClass::AsyncRead, persist::DEV_HDR_BYTES as usize, hdr_at) {
            Ok(b) => persist::DevHeader::decode(&b),
            Err(_) => {
                // as OpenZFS counts a header it cannot read
                self.counters.rebuild_dh_errors.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let h = hdr.filter(|h| {
            h.top_guid == dev.top.guid.get() && h.leaf_guid == dev.leaf.guid.get() && h.ring_start == dev.start && h.ring_end == dev.end && geo.holds(h.hand, h.hand)
        });
        if h.is_none() {
            // empty, another pool's, overwritten or torn: the device starts empty
            self.counters.rebuild_unsupported.fetch_add(1, Ordering::Relaxed);
        }
        h
    }

    /// The log blocks a rebuild may trust, newest first (persist.rs, "Rebuild").
    fn walk_logs(&self, dev: &CacheDev, h: &persist::DevHeader, geo: &persist::Geometry) -> Vec<persist::LogBlock> {
        let max_headers = (self.arc.c_max() / 100 * L2ARC_META_PERCENT.get() / HDR_BYTES_MAX) as usize;
        let mut batches: Vec<persist::LogBlock> = Vec::new();
        let (mut at, mut len) = (h.newest_log, h.newest_log_len as u64);
        let mut last_seq = u64::MAX;
        let mut last_behind = 0u64;
        let mut restored = 0usize;
        let blocks_max = geo.size() / RING_UNIT_BYTES;
        while at != 0 && (batches.len() as u64) < blocks_max {
            // the block and its batch inside the ring, clear of an interrupted batch,
            // and less than one ring behind the hand
            let max_len = persist::log_block_bytes(persist::LOG_ENTRIES_MAX);
            if len == 0 || len > max_len || !geo.holds(at, at.saturating_add(len)) {
                self.counters.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let b = match dev.leaf.queue.read_buf(IoClass::AsyncRead, len as usize, at) {
                Ok(b) => b,
                Err(_) => {
                    self.counters.rebuild_io_errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            };
            let Some(lb) = persist::LogBlock::decode(&b) else {
                self.counters.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            };
            let behind = geo.behind(h.hand, lb.batch_start);
            let sane = lb.top_guid == dev.top.guid.get()
                && lb.seq < last_seq
                && lb.batch_end == at
                && geo.holds(lb.batch_start, lb.batch_end)
                && !persist::overlaps(lb.batch_start, at + len, h.evict_from, h.evict_to)
                && behind >= last_behind
                && behind < geo.size()
                && (!h.first_sweep || at + len <= h.hand);
            if !sane {
                self.counters.rebuild_cksum_lb_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if restored + lb.entries.len() > max_headers {
                self.counters.rebuild_lowmem.fetch_add(1, Ordering::Relaxed);
                break;
            }
            restored += lb.entries.len();
            last_seq = lb.seq;
            last_behind = behind;
            (at, len) = (lb.prev, lb.prev_len as u64);
            batches.push(lb);
        }
        batches
    }

    /// Headers for the entries of `batches` (newest first) that lie inside their batch,
    /// and the ring as the header left it.
    fn restore(&self, dev: &CacheDev, h: &persist::DevHeader, batches: &[persist::LogBlock]) {
        let mut r = dev.ring.lock();
        r.hand = h.hand;
        r.first_sweep = h.first_sweep;
        // the next batch continues the chain only if the walk trusted its newest block:
        // a refused one (a crafted length, a torn block) is not named again
        (r.newest_log, r.newest_log_len) = if batches.is_empty() { (0, 0) } else { (h.newest_log, h.newest_log_len) };
        r.header_seq = h.seq;
        r.batch_seq = batches.first().map_or(0, |b| b.seq);
        // oldest first, as the ring's write order; each entry inside its batch
        let mut bufs = 0u64;
        for lb in batches.iter().rev() {
            // the feed lays a batch's copies one after another, on the ring's unit: an
            // entry that starts before the previous one ended (a crafted log piling
            // entries on one copy) is refused, so the bytes counted never exceed the
            // batch's
            let mut next_free = lb.batch_start;
            for e in &lb.entries {
                let asize = (e.len as u64).next_multiple_of(RING_UNIT_BYTES);
                let inside = e.len > 0
                    && e.len <= persist::COPY_MAX_BYTES
                    && e.addr % RING_UNIT_BYTES == 0
                    && next_free <= e.addr
                    && e.addr.saturating_add(asize) <= lb.batch_end;
                if !inside {
                    continue;
                }
                next_free = e.addr + asize;
                if r.hdrs.contains(&e.key) {
                    continue;
                }
                r.hdrs.push(e.key, Loc { addr: e.addr, len: e.len, kind: e.kind });
                bufs += 1;
            }
        }
        drop(r);
        if !batches.is_empty() {
            self.counters.rebuild_success.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.rebuild_log_blks.fetch_add(batches.len() as u64, Ordering::Relaxed);
        self.counters.rebuild_bufs.fetch_add(bufs, Ordering::Relaxed);
    }

    /// The copy of `bp`'s block on a cache device, verified against `bp`'s checksum, or
    /// None (a miss, or a bad or unreadable copy: counted, forgotten, and the caller
    /// reads the pool).
    pub fn read(&self, bp: &BlockPointer) -> Option<AlignedBuf> {
        let key = &BlockKey::of(bp);
        let devs: Vec<Arc<CacheDev>> = self.devs.read().clone();
        for dev in &devs {
            let loc = dev.ring.lock().hdrs.get(key);
            let Some(loc) = loc else { continue };
            if !dev.usable() {
                continue;
            }
            let asize = (loc.len as u64).next_multiple_of(RING_UNIT_BYTES) as usize;
            match dev.leaf.queue.read_buf(IoClass::SyncRead, asize, loc.addr) {
                Ok(mut buf) => {
                    dev.note_read(true);
                    if loc.len == bp.lsize && verify_copy(bp, &mut buf) {
                        self.counters.hits.fetch_add(1, Ordering::Relaxed);
                        self.counters.read_bytes.fetch_add(loc.len as u64, Ordering::Relaxed);
                        return Some(buf);
                    }
                    self.counters.cksum_bad.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(device = %dev.leaf.spec.shown(), addr = loc.addr, "L2ARC copy failed its check; read from the pool");
                }
                Err(e) => {
                    self.counters.io_error.fetch_add(1, Ordering::Relaxed);
                    dev.note_read(false);
                    tracing::debug!(device = %dev.leaf.spec.shown(), "L2ARC read failed: {e}; read from the pool");
                }
            }
            Self::forget_on(dev, key, loc.addr);
            return None;
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Whether a cache device holds block `key`.
    pub fn holds(&self, key: &BlockKey) -> bool {
        self.devs.read().iter().any(|d| d.ring.lock().hdrs.contains(key))
    }

    fn forget_on(dev: &CacheDev, key: &BlockKey, addr: u64) {
        dev.ring.lock().hdrs.forget(key, addr);
    }

    /// Block `key` was freed: forget its copies.
    pub fn forget(&self, key: &BlockKey) {
        for dev in self.devs.read().iter() {
            let addr = dev.ring.lock().hdrs.get(key).map(|l| l.addr);
            if let Some(addr) = addr {
                Self::forget_on(dev, key, addr);
            }
        }
    }

    /// A cache vdev added to the pool (`pool add POOL cache DEV`): used from the next
    /// feed on.
    pub fn add_device(&self, top: Arc<TopVdev>) {
        if let Some(d) = CacheDev::new(top) {
            // a device added live is new to the pool (fresh guids, labels just
            // written): nothing on it to restore, so the feed may write at once (the
            // rebuild that sets this runs only when the feed thread starts)
            d.ring.lock().rebuilt = true;
            self.devs.write().push(d);
        }
    }

    /// Cache vdev `id` leaves the pool: once this returns, no read or write of the
    /// L2ARC touches it (a feed write in progress is waited for) and its copies are
    /// forgotten.
    pub fn remove_device(&self, id: crate::VdevId) {
        let gone: Vec<Arc<CacheDev>> = {
            let mut devs = self.devs.write();
            let (gone, kept): (Vec<_>, Vec<_>) = devs.drain(..).partition(|d| d.top.id == id);
            *devs = kept;
            gone
        };
        for d in gone {
            d.removed.store(true, Ordering::Relaxed);
            drop(d.writing.lock());
            d.drop_all();
        }
    }

    /// Cache vdev `id`'s space as `zpool iostat -v` shows it: the ring's size and the
    /// bytes its copies take there (each rounded up to the ring's unit, as `l2_asize`);
    /// None when the L2ARC does not use the device (missing or unusable at import).
    pub fn device_space(&self, id: crate::VdevId) -> Option<(u64, u64)> {
        self.devs.read().iter().find(|d| d.top.id == id).map(|d| (d.end - d.start, d.ring.lock().hdrs.asize))
    }

    pub fn stats(&self) -> L2Stats {
        let c = &self.counters;
        let (mut size, mut asize, mut blocks, mut hdr_size) = (0, 0, 0, 0);
        for d in self.devs.read().iter() {
            let r = d.ring.lock();
            size += r.hdrs.lsize;
            asize += r.hdrs.asize;
            blocks += r.hdrs.len() as u64;
            hdr_size += r.hdrs.memory_bytes();
        }
        L2Stats {
            l2_hits: c.hits.load(Ordering::Relaxed),
            l2_misses: c.misses.load(Ordering::Relaxed),
            l2_feeds: c.feeds.load(Ordering::Relaxed),
            l2_writes_sent: c.writes_sent.load(Ordering::Relaxed),
            l2_writes_done: c.writes_done.load(Ordering::Relaxed),
            l2_writes_error: c.writes_error.load(Ordering::Relaxed),
            l2_write_bytes: c.write_bytes.load(Ordering::Relaxed),
            l2_read_bytes: c.read_bytes.load(Ordering::Relaxed),
            l2_cksum_bad: c.cksum_bad.load(Ordering::Relaxed),
            l2_io_error: c.io_error.load(Ordering::Relaxed),
            l2_abort_lowmem: c.abort_lowmem.load(Ordering::Relaxed),
            l2_feed_dropped: c.feed_dropped.load(Ordering::Relaxed),
            l2_size: size,
            l2_asize: asize,
            l2_hdr_size: hdr_size,
            l2_blocks: blocks,
            l2_rebuild_success: c.rebuild_success.load(Ordering::Relaxed),
            l2_rebuild_log_blks: c.rebuild_log_blks.load(Ordering::Relaxed),
            l2_rebuild_bufs: c.rebuild_bufs.load(Ordering::Relaxed),
            l2_rebuild_dh_errors: c.rebuild_dh_errors.load(Ordering::Relaxed),
            l2_rebuild_unsupported: c.rebuild_unsupported.load(Ordering::Relaxed),
            l2_rebuild_cksum_lb_errors: c.rebuild_cksum_lb_errors.load(Ordering::Relaxed),
            l2_rebuild_io_errors: c.rebuild_io_errors.load(Ordering::Relaxed),
            l2_rebuild_lowmem: c.rebuild_lowmem.load(Ordering::Relaxed),
        }
    }
}

impl Drop for L2Arc {
    fn drop(&mut self) {
        router().pools.write().remove(&self.load_id);
    }
}
