//! arc: the DRAM block cache.
//!
//! Theory of operation
//! -------------------
//! Blocks are immutable (copy-on-write), so a block's identity — the first copy's
//! address plus its birth txg, [`BlockKey`] — names its content forever within its pool:
//! a cached buffer can never be stale, only unreachable. The cache holds *logical*
//! (verified, decompressed) buffers as `Arc<AlignedBuf>`, shared with readers without
//! copying.
//!
//! One ARC per process ([`daemon_arc`]), as in OpenZFS: `zfs_arc_max` is the daemon's
//! DRAM budget, shared by every imported pool. A pool reaches it only through its
//! [`PoolArc`], which puts the pool's *load id* in front of every key (a number given
//! to each pool when it is opened and never reused in the process, OpenZFS's
//! `spa_load_guid`): two pools, even two copies of one pool image imported under
//! different names, never see each other's blocks. Dropping the `PoolArc` (export)
//! drops the pool's entries. The pool's I/O layer (`zio::pool_io`) is the only owner of
//! a `PoolArc`; the rest of the engine asks it by name (look up, cache with a
//! [`CacheHint`], release to a writer, forget a freed block, reserve for a sync).
//!
//! This first version is a sharded CLOCK cache (second-chance LRU approximation)
//! bounded in bytes (`zfs_arc_max`, followed live: lowering it trims every shard at
//! the next insert): a hit only sets the entry's referenced bit, so the
//! hot read path is one hash lookup under a shard mutex; eviction walks the shard's ring,
//! giving referenced entries a second chance. The adaptive MRU/MFU lists with ghost
//! lists and the L2ARC feed replace it behind the same interface: `lookup`, `insert`,
//! `evict`, `release_to_writer` (a partial write takes a buffer nobody else holds and
//! changes it in place, OpenZFS's `arc_release`), `stats`. A shard mutex is held only
//! for the map operation, never across I/O.
//!
//! Bounds: total bytes ≤ c_max − reserved (per shard that / SHARDS, evicting on insert);
//! the ring holds at most 2 × entries + 1024 slots (stale slots of freed blocks are
//! compacted).
//!
//! Reservations. A txg sync holds the buffers it writes until the txg commits (readers
//! see them in the dirty set until then; the ARC may only take them after the commit,
//! see spa/sync.rs). It stops counting them as dirty once written, so that the write
//! throttle sees the dirty data drain as the sync proceeds (OpenZFS undirties on write
//! completion, when the dbuf's data becomes ARC data). Those bytes are still in memory:
//! the sync *reserves* them in the ARC ([`ArcReservation`]), the cache evicts down to
//! c_max − reserved at once, and the reservation ends when the txg commits and the
//! written blocks are inserted. A reservation is granted only up to what the ARC can
//! give (c_max − reserved): the sync keeps the rest dirty until the txg retires. So the
//! daemon's data memory stays within ARC max + dirty max, whichever of the two is the
//! larger (issue 8: peak RSS ≤ ARC max + dirty max + 48 MiB).

use crate::vdev::abd::AlignedBuf;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::kstat::{Applies, Tunable};
use crate::{Txg, VdevId};

/// There is no `zfs_arc_min`: the ARC never shrinks under memory pressure yet, so a
/// floor would have nothing to hold back. It comes with the adaptive ARC.
pub static ZFS_ARC_MAX: Tunable = Tunable::new_auto(
    "zfs_arc_max",
    64 << 20,
    1 << 50,
    Applies::Live,
    "ARC size limit in bytes, one ARC for every pool of the daemon; 0 = auto: 1/8 of RAM, at least 64 MiB (OpenZFS: 5/8 of RAM, min 64 MiB; Zilla shares the box with its clients). Lowering it evicts at once",
);

const SHARDS: usize = 16;

/// How far the cached bytes may exceed c_max − reserved after an operation returns: the
/// CLOCK cache evicts within every insert, so not at all.
pub const OVERSHOOT_MAX_BYTES: u64 = 0;

/// The process's ARC, following `zfs_arc_max` (every pool shares it).
pub fn daemon_arc() -> &'static Arc<ArcCache> {
    static ARC: std::sync::OnceLock<Arc<ArcCache>> = std::sync::OnceLock::new();
    ARC.get_or_init(|| Arc::new(ArcCache::following_tunable()))
}

/// The ARC's key: the pool's load id, then the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ArcKey {
    pool: u32,
    block: BlockKey,
}

/// How a buffer came to be cached: what it is and what may become of it. `prefetched`
/// (read ahead of demand) and `l2_eligible` (its volume's `secondarycache` lets it go to
/// a cache device) are recorded for the adaptive ARC and the L2ARC feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheHint {
    pub kind: BufKind,
    pub prefetched: bool,
    pub l2_eligible: bool,
}

impl CacheHint {
    /// A demand-read (or written) data block.
    pub const DATA: CacheHint = CacheHint { kind: BufKind::Data, prefetched: false, l2_eligible: true };
    /// A demand-read (or written) metadata block.
    pub const METADATA: CacheHint = CacheHint { kind: BufKind::Metadata, prefetched: false, l2_eligible: true };

    pub fn of(kind: BufKind) -> CacheHint {
        match kind {
            BufKind::Data => CacheHint::DATA,
            BufKind::Metadata => CacheHint::METADATA,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub vdev: VdevId,
    pub offset: u64,
    pub birth: Txg,
}

impl BlockKey {
    /// The key of the block `bp` points to: its first copy's address and its birth.
    pub fn of(bp: &crate::block::blkptr::BlockPointer) -> BlockKey {
        BlockKey { vdev: bp.dva[0].vdev, offset: bp.dva[0].offset, birth: bp.birth }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufKind {
    Data,
    Metadata,
}

struct Entry {
    data: Arc<AlignedBuf>,
    referenced: bool,
    /// Matches the ring slot that owns this entry; older slots for the key are stale.
    generation: u64,
    kind: BufKind,
}

#[derive(Default)]
struct Shard {
    /// Keyed by a seeded foldhash: every read looks up two or three keys here, and
    /// SipHash cost a 16K cache hit a tenth of its CPU; the per-process random seed keeps
    /// keys crafted into a disk image from colliding on purpose.
    map: HashMap<ArcKey, Entry, foldhash::fast::RandomState>,
    ring: VecDeque<(ArcKey, u64)>,
    bytes: u64,
    generation: u64,
}

impl Shard {
    fn compact_if_needed(&mut self) {
        if self.ring.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.ring.retain(|(k, g)| map.get(k).is_some_and(|e| e.generation == *g));
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ArcStats {
    pub hits: u64,
    pub misses: u64,
    pub data_size: u64,
    pub metadata_size: u64,
    pub size: u64,
    pub c_max: u64,
    pub evictions: u64,
    /// Bytes reserved for syncing txgs' written buffers (see "Reservations").
    pub reserved: u64,
}

/// Where the byte limit comes from.
enum SizeLimit {
    /// A fixed limit (tests, experiments).
    Fixed(u64),
    /// `zfs_arc_max`, read live; `auto_bytes` is its meaning when 0.
    Tunable { auto_bytes: u64 },
    /// Read live from a function (model tests that change the limit).
    Fn(Box<dyn Fn() -> u64 + Send + Sync>),
}

pub struct ArcCache {
    shards: Vec<Mutex<Shard>>,
    limit: SizeLimit,
    /// The limit the shards were last trimmed to; a change trims every shard.
    c_max_applied: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    data_bytes: AtomicU64,
    meta_bytes: AtomicU64,
    /// Bytes held for syncing txgs' written buffers (see "Reservations").
    reserved: AtomicU64,
}

/// A txg sync's reservation in the ARC (see "Reservations"); ends when dropped.
pub struct ArcReservation<'a> {
    arc: &'a ArcCache,
    bytes: AtomicU64,
}

impl ArcReservation<'_> {
    /// Reserve up to `want` more bytes; returns how many were granted.
    pub fn take_up_to(&self, want: u64) -> u64 {
        let granted = self.arc.reserve_up_to(want);
        self.bytes.fetch_add(granted, Ordering::Relaxed);
        granted
    }

    /// Bytes this reservation holds.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for ArcReservation<'_> {
    fn drop(&mut self) {
        self.arc.unreserve(self.bytes.load(Ordering::Relaxed));
    }
}

/// A pool's handle on the daemon's ARC (module comment): every key it passes is the
/// pool's, and dropping it drops the pool's entries.
pub struct PoolArc {
    cache: Arc<ArcCache>,
    /// The pool's load id (never reused in this process).
    pool: u32,
}

impl PoolArc {
    /// A new pool's handle on `cache`, with a load id of its own.
    pub fn attach(cache: Arc<ArcCache>) -> PoolArc {
        static NEXT_LOAD_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let pool = NEXT_LOAD_ID.fetch_add(1, Ordering::Relaxed);
        assert!(pool != 0, "pool load ids exhausted");
        PoolArc { cache, pool }
    }

    fn key(&self, k: &BlockKey) -> ArcKey {
        ArcKey { pool: self.pool, block: *k }
    }

    /// The cached buffer of block `k`, if any (a hit marks it used), for an access
    /// described by `access`.
    pub fn lookup(&self, k: &BlockKey, _access: CacheHint) -> Option<Arc<AlignedBuf>> {
        self.cache.lookup(&self.key(k))
    }

    /// Cache `data` as block `k`.
    pub fn insert(&self, k: BlockKey, data: Arc<AlignedBuf>, hint: CacheHint) {
        self.cache.insert(self.key(&k), data, hint)
    }

    /// See [`ArcCache::release_to_writer`].
    pub fn release_to_writer(&self, k: &BlockKey, held: &Arc<AlignedBuf>) -> bool {
        self.cache.release_to_writer(&self.key(k), held)
    }

    /// Drop block `k` (it was freed).
    pub fn evict(&self, k: &BlockKey) {
        self.cache.evict(&self.key(k))
    }

    /// A reservation in the daemon's ARC for a txg sync's written buffers.
    pub fn reservation(&self) -> ArcReservation<'_> {
        self.cache.reservation()
    }

    /// The daemon's ARC (sizes are the daemon's, not this pool's).
    pub fn stats(&self) -> ArcStats {
        self.cache.stats()
    }
}

impl Drop for PoolArc {
    fn drop(&mut self) {
        self.cache.evict_pool(self.pool);
    }
}

/// The machine's RAM, read once (sysconf(_SC_PHYS_PAGES) is a sysinfo system call,
/// and the auto dirty limit asks for it on every write).
pub fn physical_memory_bytes() -> u64 {
    static BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if pages > 0 && page > 0 { pages as u64 * page as u64 } else { 4 << 30 }
    })
}

impl ArcCache {
    /// A cache with a fixed byte limit, independent of `zfs_arc_max`.
    pub fn new(c_max: u64) -> ArcCache {
        Self::with_limit(SizeLimit::Fixed(c_max))
    }

    /// A cache whose byte limit is `c_max()`, read live (as from the tunable).
    pub fn with_limit_fn(c_max: impl Fn() -> u64 + Send + Sync + 'static) -> ArcCache {
        Self::with_limit(SizeLimit::Fn(Box::new(c_max)))
    }

    /// A cache bounded by the `zfs_arc_max` tunable, following changes live.
    pub fn following_tunable() -> ArcCache {
        Self::with_limit(SizeLimit::Tunable { auto_bytes: (physical_memory_bytes() / 8).max(64 << 20) })
    }

    fn with_limit(limit: SizeLimit) -> ArcCache {
        let cache = ArcCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            limit,
            c_max_applied: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            data_bytes: AtomicU64::new(0),
            meta_bytes: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
        };
        cache.c_max_applied.store(cache.c_max(), Ordering::Relaxed);
        cache
    }

    /// Current byte limit.
    pub fn c_max(&self) -> u64 {
        match &self.limit {
            SizeLimit::Fixed(b) => *b,
            SizeLimit::Fn(f) => f(),
            SizeLimit::Tunable { auto_bytes } => match ZFS_ARC_MAX.get() {
                0 => *auto_bytes,
                b => b,
            },
        }
    }

    /// A reservation for a txg sync's written buffers (see "Reservations").
    pub fn reservation(&self) -> ArcReservation<'_> {
        ArcReservation { arc: self, bytes: AtomicU64::new(0) }
    }

    /// Reserve up to `want` bytes (at most c_max − reserved) and evict down to the new
    /// limit at once; returns the bytes granted.
    fn reserve_up_to(&self, want: u64) -> u64 {
        let c_max = self.c_max();
        let mut granted = 0;
        let _ = self.reserved.fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
            granted = want.min(c_max.saturating_sub(r));
            Some(r + granted)
        });
        if granted > 0 {
            let limit = self.shard_limit();
            for shard in &self.shards {
                self.evict_to(&mut shard.lock(), limit);
            }
        }
        granted
    }

    fn unreserve(&self, bytes: u64) {
        let before = self.reserved.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "ARC reservation released twice");
    }

    /// Per-shard limit (c_max less the reservations); when c_max went down since the
    /// last call, every shard is trimmed to it now rather than at its next insert.
    fn shard_limit(&self) -> u64 {
        let c_max = self.c_max();
        let limit = c_max.saturating_sub(self.reserved.load(Ordering::Acquire)) / SHARDS as u64;
        // a plain load on the common path: no shared cache line written per insert
        if self.c_max_applied.load(Ordering::Relaxed) != c_max {
            let before = self.c_max_applied.swap(c_max, Ordering::Relaxed);
            if c_max < before {
                for shard in &self.shards {
                    self.evict_to(&mut shard.lock(), limit);
                }
            }
        }
        limit
    }

    fn shard(&self, k: &ArcKey) -> &Mutex<Shard> {
        // multiplicative hash of the whole key, top bits: block offsets are multiples of
        // the block size, so low bits of the raw offset would reach only a few shards
        let b = &k.block;
        let h = (b.offset ^ (b.vdev.get() as u64).rotate_left(48) ^ b.birth.get().rotate_left(24) ^ (k.pool as u64).rotate_left(36))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 60) as usize % SHARDS]
    }

    fn lookup(&self, k: &ArcKey) -> Option<Arc<AlignedBuf>> {
        let found = {
            let mut s = self.shard(k).lock();
            s.map.get_mut(k).map(|e| {
                e.referenced = true;
                e.data.clone()
            })
        };
        match &found {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    fn insert(&self, k: ArcKey, data: Arc<AlignedBuf>, hint: CacheHint) {
        let kind = hint.kind;
        let len = data.len() as u64;
        let limit = self.shard_limit();
        if len > limit {
            return;
        }
        let mut s = self.shard(&k).lock();
        s.generation += 1;
        let generation = s.generation;
        if let Some(old) = s.map.insert(k, Entry { data, referenced: false, generation, kind }) {
            s.bytes -= old.data.len() as u64;
            self.account(old.kind, old.data.len() as u64, false);
        }
        s.ring.push_back((k, generation));
        s.bytes += len;
        self.account(kind, len, true);
        self.evict_to(&mut s, limit);
        s.compact_if_needed();
    }

    /// CLOCK: evict unreferenced entries from the ring's head, second chance otherwise,
    /// until the shard holds at most `limit` bytes.
    fn evict_to(&self, s: &mut Shard, limit: u64) {
        let mut budget = 2 * s.ring.len() + 1;
        while s.bytes > limit && budget > 0 {
            budget -= 1;
            let Some((victim, g)) = s.ring.pop_front() else { break };
            let second_chance = match s.map.get_mut(&victim) {
                Some(e) if e.generation == g => {
                    if e.referenced {
                        e.referenced = false;
                        true
                    } else {
                        false
                    }
                }
                _ => continue, // stale slot
            };
            if second_chance {
                s.ring.push_back((victim, g));
            } else if let Some(e) = s.map.remove(&victim) {
                s.bytes -= e.data.len() as u64;
                self.account(e.kind, e.data.len() as u64, false);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn account(&self, kind: BufKind, len: u64, add: bool) {
        let c = match kind {
            BufKind::Data => &self.data_bytes,
            BufKind::Metadata => &self.meta_bytes,
        };
        if add {
            c.fetch_add(len, Ordering::Relaxed);
        } else {
            c.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// Give up the cached buffer `held` of block `k` to a writer that is about to
    /// modify it in place (OpenZFS's `arc_release` of a buffer nobody else holds): the
    /// entry is removed if it holds exactly `held` and nobody but the cache and the
    /// caller holds that buffer, and then the caller's `held` is the only reference
    /// (`Arc::get_mut` succeeds). Returns whether it was removed; when not (another
    /// reader holds the buffer, or it is not this entry's), the caller copies.
    ///
    /// Safe for every reader: blocks are immutable under their key, so removing an
    /// entry is an eviction (a later lookup misses and reads the device), and under the
    /// shard lock nobody can take a new reference through the cache; with the count at
    /// two (the entry's and `held`) no other reference exists to clone from.
    fn release_to_writer(&self, k: &ArcKey, held: &Arc<AlignedBuf>) -> bool {
        let mut s = self.shard(k).lock();
        let unshared = s.map.get(k).is_some_and(|e| Arc::ptr_eq(&e.data, held) && Arc::strong_count(held) == 2 && Arc::weak_count(held) == 0);
        if !unshared {
            return false;
        }
        let e = s.map.remove(k).expect("the entry was just found under the same lock");
        s.bytes -= e.data.len() as u64;
        self.account(e.kind, e.data.len() as u64, false);
        s.compact_if_needed();
        drop(s);
        drop(e);
        debug_assert_eq!(Arc::strong_count(held), 1, "a released buffer has one owner left");
        true
    }

    /// Drop a block (it was freed).
    fn evict(&self, k: &ArcKey) {
        let mut s = self.shard(k).lock();
        if let Some(e) = s.map.remove(k) {
            s.bytes -= e.data.len() as u64;
            self.account(e.kind, e.data.len() as u64, false);
        }
        s.compact_if_needed();
    }

    /// Drop every block of pool `pool` (it is being exported or closed).
    fn evict_pool(&self, pool: u32) {
        for shard in &self.shards {
            let mut s = shard.lock();
            let mut gone = Vec::new();
            s.map.retain(|k, e| {
                if k.pool == pool {
                    gone.push((e.kind, e.data.len() as u64));
                    false
                } else {
                    true
                }
            });
            for (kind, len) in gone {
                s.bytes -= len;
                self.account(kind, len, false);
            }
            s.compact_if_needed();
        }
    }

    pub fn stats(&self) -> ArcStats {
        let d = self.data_bytes.load(Ordering::Relaxed);
        let m = self.meta_bytes.load(Ordering::Relaxed);
        ArcStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            data_size: d,
            metadata_size: m,
            size: d + m,
            c_max: self.c_max(),
            evictions: self.evictions.load(Ordering::Relaxed),
            reserved: self.reserved.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_on(c_max: u64) -> PoolArc {
        PoolArc::attach(Arc::new(ArcCache::new(c_max)))
    }

    #[test]
    fn a_reservation_evicts_at_once_is_capped_and_ends_when_dropped() {
        let arc = pool_on(SHARDS as u64 * 8192);
        for i in 0..64u64 {
            arc.insert(BlockKey { vdev: VdevId(0), offset: i * 4096, birth: Txg(1) }, Arc::new(AlignedBuf::from(vec![0u8; 4096])), CacheHint::DATA);
        }
        let full = arc.stats().size;
        assert!(full > SHARDS as u64 * 4096, "the cache filled ({full})");
        let r = arc.reservation();
        assert_eq!(r.take_up_to(SHARDS as u64 * 4096), SHARDS as u64 * 4096);
        assert!(arc.stats().size <= SHARDS as u64 * 4096, "not evicted down to c_max - reserved: {}", arc.stats().size);
        assert_eq!(r.take_up_to(u64::MAX), SHARDS as u64 * 4096, "granted beyond c_max");
        assert_eq!(arc.stats().size, 0);
        assert_eq!(arc.stats().reserved, SHARDS as u64 * 8192);
        drop(r);
        assert_eq!(arc.stats().reserved, 0);
        arc.insert(BlockKey { vdev: VdevId(0), offset: 1 << 30, birth: Txg(2) }, Arc::new(AlignedBuf::from(vec![0u8; 4096])), CacheHint::DATA);
        assert_eq!(arc.stats().size, 4096, "the cache takes blocks again");
    }
    #[test]
    fn bounded_and_lru() {
        let arc = pool_on(SHARDS as u64 * 8192);
        for i in 0..1000u64 {
            arc.insert(BlockKey { vdev: VdevId(0), offset: i << 12, birth: Txg(1) }, Arc::new(AlignedBuf::from(vec![0u8; 4096])), CacheHint::DATA);
        }
        let st = arc.stats();
        assert!(st.size <= SHARDS as u64 * 8192, "{st:?}");
        assert!(st.evictions > 0);
        let k = BlockKey { vdev: VdevId(0), offset: 999 << 12, birth: Txg(1) };
        assert!(arc.lookup(&k, CacheHint::DATA).is_some());
        // 16K-aligned blocks of one txg must spread over (almost) every shard
        let used: std::collections::HashSet<usize> = (0..256u64)
            .map(|i| {
                let key = BlockKey { vdev: VdevId(1), offset: i << 14, birth: Txg(7) };
                arc.cache.shard(&arc.key(&key)) as *const _ as usize
            })
            .collect();
        assert!(used.len() >= SHARDS - 2, "only {} of {SHARDS} shards used", used.len());
        arc.evict(&k);
        assert!(arc.lookup(&k, CacheHint::DATA).is_none());
    }

    #[test]
    fn zfs_arc_max_applies_live() {
        let arc = PoolArc::attach(Arc::new(ArcCache::following_tunable()));
        let auto = arc.cache.c_max();
        assert!(auto >= 64 << 20);
        ZFS_ARC_MAX.set(128 << 20).unwrap();
        assert_eq!(arc.stats().c_max, 128 << 20);
        let block = 128 << 10;
        for i in 0..800u64 {
            arc.insert(BlockKey { vdev: VdevId(0), offset: i * block, birth: Txg(1) }, Arc::new(AlignedBuf::from(vec![0u8; block as usize])), CacheHint::DATA);
        }
        assert!(arc.stats().size > 64 << 20, "{:?}", arc.stats());
        ZFS_ARC_MAX.set(64 << 20).unwrap();
        arc.insert(BlockKey { vdev: VdevId(1), offset: 0, birth: Txg(1) }, Arc::new(AlignedBuf::from(vec![0u8; 4096])), CacheHint::METADATA);
        let st = arc.stats();
        assert!(st.size <= 64 << 20, "lowering zfs_arc_max must trim the ARC: {st:?}");
        assert!(ZFS_ARC_MAX.set(4096).is_err(), "below the 64 MiB floor");
        ZFS_ARC_MAX.set(0).unwrap();
        assert_eq!(arc.cache.c_max(), auto);
    }

    #[test]
    fn pools_never_see_each_others_blocks_and_leave_with_their_entries() {
        let cache = Arc::new(ArcCache::new(64 << 20));
        // two pools with the same block addresses (two copies of one pool image)
        let a = PoolArc::attach(cache.clone());
        let b = PoolArc::attach(cache.clone());
        let k = BlockKey { vdev: VdevId(0), offset: 4 << 20, birth: Txg(9) };
        a.insert(k, Arc::new(AlignedBuf::from(vec![1u8; 4096])), CacheHint::DATA);
        assert!(b.lookup(&k, CacheHint::DATA).is_none(), "pool b was served pool a's block");
        b.insert(k, Arc::new(AlignedBuf::from(vec![2u8; 4096])), CacheHint::DATA);
        assert_eq!(a.lookup(&k, CacheHint::DATA).unwrap()[0], 1);
        assert_eq!(b.lookup(&k, CacheHint::DATA).unwrap()[0], 2);
        assert!(!b.release_to_writer(&k, &a.lookup(&k, CacheHint::DATA).unwrap()), "b released a's buffer");
        b.evict(&k);
        assert_eq!(a.lookup(&k, CacheHint::DATA).unwrap()[0], 1, "b's free dropped a's block");
        assert_eq!(cache.stats().size, 4096);
        drop(a);
        assert_eq!(cache.stats().size, 0, "an exported pool's entries stay in the ARC");
        // a pool opened later gets a load id of its own
        let c = PoolArc::attach(cache.clone());
        assert!(c.lookup(&k, CacheHint::DATA).is_none());
    }
}
