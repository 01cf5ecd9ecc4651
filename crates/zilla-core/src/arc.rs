//! arc: the adaptive replacement cache in DRAM (OpenZFS arc.c), one per daemon.
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
//! Headers and states
//! ------------------
//! Every cached identity is a header ([`Hdr`], 64 bytes) in one of four states, each
//! with a list per kind (data, metadata), newest at the head:
//!
//! ```text
//!   MRU        data in DRAM, used once (or again within ARC_MINTIME, 62.5 ms)
//!   MFU        data in DRAM, used again after ARC_MINTIME
//!   MRU ghost  header only: evicted from MRU
//!   MFU ghost  header only: evicted from MFU
//! ```
//!
//! A miss inserts into MRU. A hit in MRU at least 62.5 ms after the header's last use
//! moves it to MFU (a burst of hits counts as one use); a demand hit on a prefetched
//! buffer only clears its prefetch flag. A hit in MFU sets the header's referenced flag
//! (the list is not reordered on the hit path: the evictor gives a referenced MFU header
//! a second chance, moving it to the head, as CLOCK does), so a hit costs what it cost
//! the CLOCK cache this replaces: one probe under a shard lock and a flag. A lookup that
//! finds a ghost is a miss that counts a *ghost hit* (in bytes, per state and kind); the
//! read's insert then brings the header back to MFU (to MRU if its last life was only a
//! prefetch).
//!
//! Adaptation (OpenZFS 2.2+, see the openzfs brief §4.5). Three fixed-point fractions
//! (2^32 = 1): `meta` (metadata's share), `pd` (MRU's share of data), `pm` (MRU's share
//! of metadata). Each eviction round moves them by the ghost hits since the last round:
//! MRU-ghost hits push MRU's share up, MFU-ghost hits push it down, metadata ghost hits
//! push `meta` up and data ghost hits down (divided by `zfs_arc_meta_balance / 100`, so
//! metadata is favoured); a step is at most ~3 % and damped near 0 and 1. Eviction then
//! takes from MRU metadata, MFU metadata, MRU data and MFU data what each holds beyond
//! its share of what should remain, and from anything still over the target last. Each
//! ghost list is cut to half the sum of the other three live lists of the moment.
//!
//! Size. `c` is the target, between `c_min` (`zfs_arc_min`) and `c_max`
//! (`zfs_arc_max`); it grows by what is inserted while the cache is within 32 MiB of it
//! and memory is plentiful. The evictor checks the system's available memory
//! ([`crate::env::Env::memory_available_bytes`]: MemAvailable and the cgroup's limit)
//! every second; short of `zfs_arc_sys_free` it lowers `c` (by 1/128 of c − c_min plus
//! the shortfall), evicts, gives the block-buffer slab's idle memory back, and does not
//! grow again for 5 s.
//!
//! Eviction never runs on a reader's path: one evictor thread per cache does it. An
//! insert that takes the cache past its target wakes it; one that takes it past the
//! target plus `c_max >> 8` (OpenZFS's `zfs_arc_overflow_shift`) waits for it first
//! (bounded: [`overshoot_max_bytes`]). A round takes the cache a little below its target
//! ([`evict_slack_bytes`]), so one wake-up serves the inserts of many reads: without
//! it, every miss past the target cost a thread hand-off and a walk of the shards.
//! A prefetched buffer not yet used stays at least
//! `zfs_arc_min_prefetch_ms` (1 s). What eviction takes from DRAM goes, if the block may
//! go to a cache device, to the [`EvictSink`] (the L2ARC feed) instead of vanishing.
//!
//! Sharding. 16 shards by key hash, each with its own mutex, index, header slots,
//! lists and counters (a hit touches no shared cache line). The fractions and targets
//! are global; an eviction round walks the shards round-robin from a rotating start,
//! taking at most `EVICT_BATCH` headers per visit.
//!
//! Reservations. A txg sync holds the buffers it writes until the txg commits (readers
//! see them in the dirty set until then; the ARC may only take them after the commit,
//! see spa/sync.rs). It stops counting them as dirty once written, so that the write
//! throttle sees the dirty data drain as the sync proceeds (OpenZFS undirties on write
//! completion, when the dbuf's data becomes ARC data). Those bytes are still in memory:
//! the sync *reserves* them in the ARC ([`ArcReservation`]), the cache evicts down to
//! c_max − reserved at once (on the sync's thread), and the reservation ends when the
//! txg commits and the written blocks are inserted. A reservation is granted only up
//! to what the ARC can give (c_max − reserved): the sync keeps the rest dirty until the
//! txg retires. So the daemon's data memory stays within ARC max + dirty max.
//!
//! Bounds: live bytes ≤ min(c, c_max − reserved) + [`overshoot_max_bytes`] once an
//! insert returns; ghost bytes per list ≤ half the live bytes of the other lists;
//! headers ≤ (live + ghost bytes) / 512 B (the smallest block).

use crate::vdev::abd::AlignedBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex};

use crate::env::Env;
use crate::kstat::{Applies, Tunable};
use crate::{Txg, VdevId};

pub static ZFS_ARC_MAX: Tunable = Tunable::new_auto(
    "zfs_arc_max",
    64 << 20,
    1 << 50,
    Applies::Live,
    "ARC size limit in bytes, one ARC for every pool of the daemon; 0 = auto: 1/8 of RAM, at least 64 MiB (OpenZFS: 5/8 of RAM, min 64 MiB; Zilla shares the box with its clients); below RAM and not below zfs_arc_min. Lowering it evicts at once",
)
.bounded(arc_max_bound);
pub static ZFS_ARC_MIN: Tunable = Tunable::new_auto(
    "zfs_arc_min",
    32 << 20,
    1 << 50,
    Applies::Live,
    "The ARC's target never shrinks below this under memory pressure (bytes); 0 = auto: 1/32 of RAM, at least 32 MiB, at most zfs_arc_max (OpenZFS's default); not above zfs_arc_max",
)
.bounded(arc_min_bound);
pub static ZFS_ARC_META_BALANCE: Tunable = Tunable::new(
    "zfs_arc_meta_balance",
    500,
    1,
    100_000,
    Applies::Live,
    "How much more a metadata ghost hit moves the metadata share than a data ghost hit, in percent (OpenZFS 2.2: 500, metadata favoured 5:1)",
);
pub static ZFS_ARC_MIN_PREFETCH_MS: Tunable = Tunable::new(
    "zfs_arc_min_prefetch_ms",
    1000,
    0,
    60_000,
    Applies::Live,
    "A prefetched buffer no demand read has used yet is kept at least this long (ms; OpenZFS: 1000)",
);
pub static ZFS_ARC_SYS_FREE: Tunable = Tunable::new_auto(
    "zfs_arc_sys_free",
    1 << 20,
    1 << 50,
    Applies::Live,
    "The ARC shrinks when the system's available memory (MemAvailable, the cgroup's limit) falls below this (bytes); 0 = auto: 1/64 of RAM, at least 64 MiB; below RAM",
)
.bounded(below_physical_memory);

/// The start of a refusal: "value 1T is".
fn value_is(value: u64) -> String {
    format!("value {} is", crate::kstat::size_words(value))
}

/// The machine's RAM as a refusal names it: "physical memory (23.47G)".
fn physical_memory_words() -> String {
    format!("physical memory ({})", crate::kstat::size_words(physical_memory_bytes()))
}

/// OpenZFS's rule for zfs_arc_max (arc.c, the FreeBSD sysctl handler; Linux ignores
/// such a value with a warning): 0 (auto), or below physical memory and above
/// zfs_arc_min. Zilla's automatic zfs_arc_min follows zfs_arc_max down, so only an
/// explicit zfs_arc_min bounds it.
fn arc_max_bound(value: u64) -> Result<(), String> {
    let min = ZFS_ARC_MIN.get();
    if value == 0 {
        Ok(())
    } else if value >= physical_memory_bytes() {
        Err(format!("{} not below the machine's {}", value_is(value), physical_memory_words()))
    } else if min != 0 && value < min {
        Err(format!("{} below zfs_arc_min ({})", value_is(value), crate::kstat::size_words(min)))
    } else {
        Ok(())
    }
}

/// OpenZFS's rule for zfs_arc_min: 0 (auto), or at most the ARC's limit (zfs_arc_max,
/// or its automatic value).
fn arc_min_bound(value: u64) -> Result<(), String> {
    let max = match ZFS_ARC_MAX.get() {
        0 => (physical_memory_bytes() / 8).max(64 << 20),
        v => v,
    };
    if value > max {
        return Err(format!("{} above the ARC's limit zfs_arc_max ({})", value_is(value), crate::kstat::size_words(max)));
    }
    Ok(())
}

/// A size that must stay below the machine's RAM (zfs_arc_sys_free).
fn below_physical_memory(value: u64) -> Result<(), String> {
    if value >= physical_memory_bytes() {
        return Err(format!("{} not below the machine's {}", value_is(value), physical_memory_words()));
    }
    Ok(())
}

const SHARDS: usize = 16;
/// Headers an eviction round takes from one shard's list per visit (OpenZFS
/// `zfs_arc_evict_batch_limit`).
const EVICT_BATCH: usize = 10;
/// A hit in MRU this long after the last counted use promotes to MFU (OpenZFS
/// ARC_MINTIME, hz/16).
const ARC_MINTIME_MS: u32 = 62;
/// `c` grows only while the cache is within this of it (OpenZFS: 32 MiB).
const GROW_MARGIN_BYTES: u64 = 32 << 20;
/// The smallest growth step (OpenZFS: 128 KiB).
const GROW_MIN_BYTES: u64 = 128 << 10;
/// After a memory shortage, `c` does not grow for this long (OpenZFS arc_grow_retry).
const NO_GROW_AFTER_SHORTAGE_MS: u64 = 5_000;
/// The evictor checks memory this often even when nobody wakes it.
const EVICTOR_TICK_MS: u64 = 1_000;
/// An insert waits for the evictor at most this long before it goes on regardless (the
/// evictor thread could not be started, or the cache is being dropped).
const INSERT_WAIT_MAX_MS: u64 = 5_000;
/// An inserter waiting for the evictor looks again this often.
const INSERT_WAIT_STEP_MS: u64 = 50;
/// Fixed point one for the adaptive fractions.
const ONE: u64 = 1 << 32;

/// How far the cached bytes may exceed min(c, c_max − reserved) once an insert returns
/// (OpenZFS `zfs_arc_overflow_shift` = 8: an insert past this waits for the evictor).
pub fn overshoot_max_bytes(c_max: u64) -> u64 {
    c_max >> 8
}

/// How far below its target a round takes the cache (module comment, "Eviction"):
/// c_max >> 9, at least 1 MiB, at most 1/16 of the target. One wake-up of the evictor
/// then serves many inserts instead of one.
pub fn evict_slack_bytes(c_max: u64, target: u64) -> u64 {
    (c_max >> 9).max(1 << 20).min(target / 16)
}

/// The process's ARC, following `zfs_arc_max` (every pool shares it).
pub fn daemon_arc() -> &'static Arc<ArcCache> {
    static ARC: std::sync::OnceLock<Arc<ArcCache>> = std::sync::OnceLock::new();
    ARC.get_or_init(|| ArcCache::following_tunable(crate::env::real()))
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

/// The ARC's key: the pool's load id, then the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ArcKey {
    pool: u32,
    block: BlockKey,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufKind {
    Data,
    Metadata,
}

/// How a buffer came to be cached or looked up: what it is, whether the access is a
/// read ahead of demand (`prefetched`), and whether its volume's `secondarycache` lets
/// it go to a cache device (`l2_eligible`).
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

/// Where the ARC hands what eviction takes from DRAM (the L2ARC feed): blocks whose hint
/// allowed a cache device. Called without any ARC lock held; must not block for long.
pub trait EvictSink: Send + Sync {
    /// Block `key` of the pool with load id `pool` left DRAM; it was in MFU (`mfu`) and
    /// read ahead without a demand read using it (`prefetched`).
    fn evicted(&self, pool: u32, key: BlockKey, data: Arc<AlignedBuf>, kind: BufKind, mfu: bool, prefetched: bool);
}

/// The states of a header (OpenZFS arc_state_t without `anon`, `uncached` and
/// `l2c_only`, which come with the L2ARC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum State {
    /// Used once (or several times within `ARC_MINTIME_MS`); data in DRAM.
    Mru = 0,
    /// Used again after `ARC_MINTIME_MS`; data in DRAM.
    Mfu = 1,
    /// Evicted from MRU: the header only.
    MruGhost = 2,
    /// Evicted from MFU: the header only.
    MfuGhost = 3,
}

impl State {
    fn is_ghost(self) -> bool {
        matches!(self, State::MruGhost | State::MfuGhost)
    }
}

fn kind_index(kind: BufKind) -> usize {
    match kind {
        BufKind::Data => 0,
        BufKind::Metadata => 1,
    }
}

/// The list of (state, kind).
fn list_index(state: State, kind: BufKind) -> usize {
    state as usize * 2 + kind_index(kind)
}
const LISTS: usize = 8;
const NIL: u32 = u32::MAX;

/// A header flag: read ahead of demand and not yet used by a demand read.
const F_PREFETCH: u8 = 1;
/// A header flag: its volume lets it go to a cache device.
const F_L2_ELIGIBLE: u8 = 2;
/// A header flag: hit since the evictor last passed it (MFU second chance).
const F_REFERENCED: u8 = 4;
/// A header flag: its last life in MRU was only a prefetch (a ghost hit then goes to MRU).
const F_PREFETCH_ONLY: u8 = 8;

/// One cached block identity (OpenZFS arc_buf_hdr_t): where its bytes are (DRAM, or
/// nowhere for a ghost), its place in its list, and when it was last used.
struct Hdr {
    key: ArcKey,
    /// The logical block (None: a ghost).
    data: Option<Arc<AlignedBuf>>,
    /// Neighbours in its list (towards the head: newer; towards the tail: older).
    newer: u32,
    older: u32,
    /// Logical size in bytes (kept by a ghost: ghost hits count bytes).
    bytes: u32,
    /// Coarse clock (ms) of the last access that counted.
    access_ms: u32,
    state: State,
    kind: BufKind,
    flags: u8,
}

#[derive(Clone, Copy)]
struct List {
    /// The newest header (NIL: empty).
    head: u32,
    /// The oldest: eviction starts here.
    tail: u32,
    bytes: u64,
}

impl Default for List {
    fn default() -> List {
        List { head: NIL, tail: NIL, bytes: 0 }
    }
}

/// Per-shard counters, changed under the shard's lock (no shared cache line per hit).
#[derive(Default, Clone, Copy)]
struct ShardCounters {
    hits: u64,
    misses: u64,
    /// [demand data, demand metadata, prefetch data, prefetch metadata]
    hits_by: [u64; 4],
    misses_by: [u64; 4],
    mru_hits: u64,
    mfu_hits: u64,
    mru_ghost_hits: u64,
    mfu_ghost_hits: u64,
    /// Ghost hits in bytes, [mru ghost data, mru ghost meta, mfu ghost data, mfu ghost meta].
    ghost_hit_bytes: [u64; 4],
    /// Prefetched buffers a demand read used.
    prefetch_used: u64,
    evicted: u64,
    evict_skip: u64,
}

fn access_index(kind: BufKind, prefetch: bool) -> usize {
    kind_index(kind) + if prefetch { 2 } else { 0 }
}

/// A shard's index: header slot numbers in a hash table, keyed by their header's key
/// (stored once, in the header: 5 bytes per bucket instead of a key and a slot).
struct HdrIndex {
    table: hashbrown::HashTable<u32>,
    hasher: foldhash::fast::RandomState,
}

impl Default for HdrIndex {
    fn default() -> HdrIndex {
        HdrIndex { table: hashbrown::HashTable::new(), hasher: foldhash::fast::RandomState::default() }
    }
}

impl HdrIndex {
    fn hash(&self, k: &ArcKey) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, k)
    }
    fn get(&self, hdrs: &[Hdr], k: &ArcKey) -> Option<u32> {
        self.table.find(self.hash(k), |&i| hdrs[i as usize].key == *k).copied()
    }
    /// Index slot `i` (whose header holds `k`); `k` must not be indexed yet.
    fn insert(&mut self, hdrs: &[Hdr], k: &ArcKey, i: u32) {
        debug_assert!(hdrs[i as usize].key == *k && self.get(hdrs, k).is_none());
        let (h, hasher) = (self.hash(k), &self.hasher);
        self.table.insert_unique(h, i, |&j| std::hash::BuildHasher::hash_one(hasher, &hdrs[j as usize].key));
    }
    fn remove(&mut self, hdrs: &[Hdr], k: &ArcKey) -> Option<u32> {
        self.table.find_entry(self.hash(k), |&i| hdrs[i as usize].key == *k).ok().map(|e| e.remove().0)
    }
    fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.table.iter().copied()
    }
    fn allocation_bytes(&self) -> u64 {
        self.table.allocation_size() as u64
    }
}

#[derive(Default)]
struct Shard {
    /// Keyed by a seeded foldhash: every read looks up two or three keys here, and
    /// SipHash cost a 16K cache hit a tenth of its CPU; the per-process random seed keeps
    /// keys crafted into a disk image from colliding on purpose.
    map: HdrIndex,
    hdrs: Vec<Hdr>,
    free: Vec<u32>,
    lists: [List; LISTS],
    counters: ShardCounters,
}

impl Shard {
    fn link_head(&mut self, i: u32) {
        let (li, bytes) = {
            let h = &self.hdrs[i as usize];
            (list_index(h.state, h.kind), h.bytes as u64)
        };
        let old_head = self.lists[li].head;
        {
            let h = &mut self.hdrs[i as usize];
            h.newer = NIL;
            h.older = old_head;
        }
        if old_head != NIL {
            self.hdrs[old_head as usize].newer = i;
        } else {
            self.lists[li].tail = i;
        }
        self.lists[li].head = i;
        self.lists[li].bytes += bytes;
    }

    fn unlink(&mut self, i: u32) {
        let (li, bytes, newer, older) = {
            let h = &self.hdrs[i as usize];
            (list_index(h.state, h.kind), h.bytes as u64, h.newer, h.older)
        };
        if newer != NIL {
            self.hdrs[newer as usize].older = older;
        } else {
            debug_assert_eq!(self.lists[li].head, i);
            self.lists[li].head = older;
        }
        if older != NIL {
            self.hdrs[older as usize].newer = newer;
        } else {
            debug_assert_eq!(self.lists[li].tail, i);
            self.lists[li].tail = newer;
        }
        debug_assert!(self.lists[li].bytes >= bytes, "list bytes under its headers'");
        self.lists[li].bytes -= bytes;
    }

    fn alloc_hdr(&mut self, h: Hdr) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.hdrs[i as usize] = h;
                i
            }
            None => {
                self.hdrs.push(h);
                u32::try_from(self.hdrs.len() - 1).expect("ARC headers per shard fit u32")
            }
        }
    }

    /// Unlink and forget header `i`; returns its data.
    fn destroy(&mut self, i: u32) -> Option<Arc<AlignedBuf>> {
        self.unlink(i);
        let h = &mut self.hdrs[i as usize];
        let key = h.key;
        let data = h.data.take();
        h.state = State::MruGhost; // a dead slot holds no data
        let removed = self.map.remove(&self.hdrs, &key);
        debug_assert_eq!(removed, Some(i), "a header not in the map");
        self.free.push(i);
        if self.map.is_empty() {
            // every header gone: give the slot table back
            self.hdrs.clear();
            self.free.clear();
        }
        data
    }

    /// Move header `i` to `state` (at the head of its new list).
    fn move_to(&mut self, i: u32, state: State) {
        self.unlink(i);
        self.hdrs[i as usize].state = state;
        self.link_head(i);
    }
}

/// Statistics of the daemon's ARC, with OpenZFS's arcstats names.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ArcStats {
    pub hits: u64,
    pub misses: u64,
    pub demand_data_hits: u64,
    pub demand_data_misses: u64,
    pub demand_metadata_hits: u64,
    pub demand_metadata_misses: u64,
    pub prefetch_data_hits: u64,
    pub prefetch_data_misses: u64,
    pub prefetch_metadata_hits: u64,
    pub prefetch_metadata_misses: u64,
    pub mru_hits: u64,
    pub mfu_hits: u64,
    pub mru_ghost_hits: u64,
    pub mfu_ghost_hits: u64,
    /// Prefetched buffers a demand read then used.
    pub prefetch_used: u64,
    pub data_size: u64,
    pub metadata_size: u64,
    pub size: u64,
    pub mru_size: u64,
    pub mfu_size: u64,
    pub mru_ghost_size: u64,
    pub mfu_ghost_size: u64,
    /// The MRU target in bytes (OpenZFS ≤ 2.1's `p`; here c × the MRU shares).
    pub p: u64,
    pub c: u64,
    pub c_min: u64,
    pub c_max: u64,
    /// The adaptive fractions in fixed point, 2^32 = 1 (as OpenZFS's arcstats): the
    /// metadata share, MRU's share of data, MRU's share of metadata.
    pub meta: u64,
    pub pd: u64,
    pub pm: u64,
    /// Blocks evicted from DRAM (OpenZFS `deleted` counts destroyed headers).
    pub evictions: u64,
    pub evict_skip: u64,
    /// Inserts that waited for the evictor.
    pub memory_throttle_count: u64,
    /// Memory shortages seen (the target lowered).
    pub shrinks: u64,
    pub hdr_size: u64,
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

/// The evictor's wake-ups and an inserter's wait for it.
#[derive(Default)]
struct EvictSignal {
    state: Mutex<SignalState>,
    wake: Condvar,
    done: Condvar,
}

#[derive(Default)]
struct SignalState {
    wanted: bool,
    stop: bool,
    running: bool,
}

/// What one eviction round remembers of the last (under `ArcCache::round`).
#[derive(Default)]
struct RoundState {
    /// Ghost-hit byte totals at the last adaptation, [mrud, mrum, mfud, mfum].
    ghost_hit_bytes_seen: [u64; 4],
    /// Ghost list sizes at the last round.
    ghost_sizes: [u64; 4],
    /// The shard the next walk starts at.
    cursor: usize,
}

pub struct ArcCache {
    shards: Vec<Mutex<Shard>>,
    limit: SizeLimit,
    env: Arc<dyn Env>,
    /// The target size (OpenZFS arc_c).
    c: AtomicU64,
    /// Live bytes by kind (data, metadata): what DRAM holds.
    data_bytes: AtomicU64,
    meta_bytes: AtomicU64,
    /// Bytes held for syncing txgs' written buffers (see "Reservations").
    reserved: AtomicU64,
    /// The adaptive fractions (fixed point, ONE = 1).
    meta: AtomicU64,
    pd: AtomicU64,
    pm: AtomicU64,
    /// No growth before this time (ms of the Env clock).
    no_grow_until_ms: AtomicU64,
    /// When the evictor last read the system's available memory (ms of the Env clock).
    memory_checked_ms: AtomicU64,
    evict_wanted: AtomicBool,
    signal: Arc<EvictSignal>,
    round: Mutex<RoundState>,
    sink: parking_lot::RwLock<Option<Arc<dyn EvictSink>>>,
    memory_throttle_count: AtomicU64,
    shrinks: AtomicU64,
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

    /// The pool's load id (the first part of its keys).
    pub fn load_id(&self) -> u32 {
        self.pool
    }

    /// The cached buffer of block `k`, if any, for an access described by `access`
    /// (demand or prefetch, data or metadata: counted apart).
    pub fn lookup(&self, k: &BlockKey, access: CacheHint) -> Option<Arc<AlignedBuf>> {
        self.cache.lookup(&self.key(k), access, true)
    }

    /// [`PoolArc::lookup`] for a caller whose miss the read that follows counts
    /// ([`PoolArc::note_miss`], or its own counted lookup): one miss per read.
    pub fn lookup_hit_only(&self, k: &BlockKey, access: CacheHint) -> Option<Arc<AlignedBuf>> {
        self.cache.lookup(&self.key(k), access, false)
    }

    /// Count the miss of a read that goes to the devices after
    /// [`PoolArc::lookup_hit_only`].
    pub fn note_miss(&self, k: &BlockKey, access: CacheHint) {
        self.cache.note_miss(&self.key(k), access)
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

    /// The daemon's ARC limit in bytes.
    pub fn c_max(&self) -> u64 {
        self.cache.c_max()
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

/// `frac` moved by ghost hits: `up` bytes of hits on the ghost list it favours, `down`
/// on the other, `total` the ghost bytes both lists held; `balance` (percent) divides
/// the downward step. See the module comment; the step is capped near 1/32 of `total`
/// and damped by the distance from the end it moves towards.
fn adjust(frac: u64, total: u64, up: u64, down: u64, balance: u64) -> u64 {
    if total < 32 || up + down == 0 {
        return frac;
    }
    let (mut up, mut down) = (up as u128, down as u128);
    let total = total as u128;
    // never more hits than 1/16 of the lists: scale to 1/32 (a step of ~3 % at most)
    if up + down >= total / 16 {
        let scale = ((up + down) / (total / 32).max(1)).max(1);
        up /= scale;
        down /= scale;
    }
    let one = ONE as u128;
    let f = frac as u128;
    let of = one - f.min(one);
    // near the top (frac ≥ 80 %) a step up is divided by frac / (2 · (1 − frac))
    if f >= 4 * of {
        up /= (f / (2 * of + 1)).max(1);
    }
    if of >= 4 * f {
        down /= (of / (2 * f + 1)).max(1);
    }
    let step_up = up * one / total;
    let step_down = down * one / total * 100 / balance.max(1) as u128;
    (f + step_up).saturating_sub(step_down).min(one) as u64
}

/// What an eviction visit takes from a shard's list (see `ArcCache::visit_shard`).
struct Visit {
    state: State,
    li: usize,
    now: u32,
    min_prefetch_ms: u32,
    force: bool,
    to_sink: bool,
}

/// What a visit took from DRAM: handed to the sink (key, data, prefetched), or freed.
#[derive(Default)]
struct VisitOut {
    handed: Vec<(ArcKey, Arc<AlignedBuf>, bool)>,
    freed: Vec<Arc<AlignedBuf>>,
}

fn coarse_ms(env: &dyn Env) -> u64 {
    env.now_ns() / 1_000_000
}

impl ArcCache {
    /// A cache with a fixed byte limit, independent of `zfs_arc_max`.
    pub fn new(c_max: u64) -> Arc<ArcCache> {
        Self::with_limit(SizeLimit::Fixed(c_max), crate::env::real())
    }

    /// A cache whose byte limit is `c_max()`, read live, on `env`'s clock and memory.
    pub fn with_limit_fn(c_max: impl Fn() -> u64 + Send + Sync + 'static, env: Arc<dyn Env>) -> Arc<ArcCache> {
        Self::with_limit(SizeLimit::Fn(Box::new(c_max)), env)
    }

    /// A cache bounded by the `zfs_arc_max` tunable, following changes live.
    pub fn following_tunable(env: Arc<dyn Env>) -> Arc<ArcCache> {
        Self::with_limit(SizeLimit::Tunable { auto_bytes: (physical_memory_bytes() / 8).max(64 << 20) }, env)
    }

    fn with_limit(limit: SizeLimit, env: Arc<dyn Env>) -> Arc<ArcCache> {
        let cache = Arc::new(ArcCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            limit,
            env,
            c: AtomicU64::new(0),
            data_bytes: AtomicU64::new(0),
            meta_bytes: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            meta: AtomicU64::new(ONE / 4),
            pd: AtomicU64::new(ONE / 2),
            pm: AtomicU64::new(ONE / 2),
            no_grow_until_ms: AtomicU64::new(0),
            memory_checked_ms: AtomicU64::new(0),
            evict_wanted: AtomicBool::new(false),
            signal: Arc::new(EvictSignal::default()),
            round: Mutex::new(RoundState::default()),
            sink: parking_lot::RwLock::new(None),
            memory_throttle_count: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
        });
        cache.c.store(cache.c_max(), Ordering::Relaxed);
        Self::start_evictor(&cache);
        cache
    }

    /// The evictor thread: holds the cache only while it works, and ends when the
    /// cache is dropped.
    fn start_evictor(cache: &Arc<ArcCache>) {
        let weak: Weak<ArcCache> = Arc::downgrade(cache);
        let signal = cache.signal.clone();
        let env = cache.env.clone();
        let started = cache.env.spawn("arc_evict".into(), Box::new(move || {
            loop {
                {
                    let mut st = signal.state.lock();
                    if !st.wanted && !st.stop {
                        crate::env::wait_ns(&*env, &signal.wake, &mut st, EVICTOR_TICK_MS * 1_000_000);
                    }
                    if st.stop {
                        return;
                    }
                    st.wanted = false;
                }
                let Some(cache) = weak.upgrade() else { return };
                cache.evict_wanted.store(false, Ordering::Relaxed);
                // /proc and the cgroup files are read once a tick, not per wake-up
                let now = coarse_ms(&*cache.env);
                if now.saturating_sub(cache.memory_checked_ms.load(Ordering::Relaxed)) >= EVICTOR_TICK_MS {
                    cache.memory_checked_ms.store(now, Ordering::Relaxed);
                    cache.check_memory();
                }
                cache.evict_round();
                drop(cache);
                signal.done.notify_all();
            }
        }));
        if started.is_ok() {
            cache.signal.state.lock().running = true;
        }
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

    /// The floor of `c` (never above c_max): `zfs_arc_min` for the cache that follows
    /// the tunables, an eighth of the limit for the others (tests, experiments).
    pub fn c_min(&self) -> u64 {
        if !matches!(self.limit, SizeLimit::Tunable { .. }) {
            return self.c_max() / 8;
        }
        let auto = (physical_memory_bytes() / 32).max(32 << 20);
        let v = match ZFS_ARC_MIN.get() {
            0 => auto,
            b => b,
        };
        v.min(self.c_max())
    }

    /// What the live bytes should come down to: c, and never more than c_max − reserved.
    fn target(&self) -> u64 {
        let c_max = self.c_max();
        let c = self.c.load(Ordering::Relaxed).min(c_max);
        c.min(c_max.saturating_sub(self.reserved.load(Ordering::Acquire)))
    }

    fn live_bytes(&self) -> u64 {
        self.data_bytes.load(Ordering::Relaxed) + self.meta_bytes.load(Ordering::Relaxed)
    }

    /// Hand what eviction takes from DRAM to `sink` (the L2ARC feed), or stop (None).
    pub fn set_evict_sink(&self, sink: Option<Arc<dyn EvictSink>>) {
        *self.sink.write() = sink;
    }

    /// A reservation for a txg sync's written buffers (see "Reservations").
    pub fn reservation(&self) -> ArcReservation<'_> {
        ArcReservation { arc: self, bytes: AtomicU64::new(0) }
    }

    /// Reserve up to `want` bytes (at most c_max − reserved) and evict down to the new
    /// limit at once (on the caller's thread: the sync's, never a reader's); returns the
    /// bytes granted.
    fn reserve_up_to(&self, want: u64) -> u64 {
        let c_max = self.c_max();
        let mut granted = 0;
        let _ = self.reserved.fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
            granted = want.min(c_max.saturating_sub(r));
            Some(r + granted)
        });
        if granted > 0 {
            self.evict_round();
        }
        granted
    }

    fn unreserve(&self, bytes: u64) {
        let before = self.reserved.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "ARC reservation released twice");
    }

    fn shard(&self, k: &ArcKey) -> &Mutex<Shard> {
        // multiplicative hash of the whole key, top bits: block offsets are multiples of
        // the block size, so low bits of the raw offset would reach only a few shards
        let b = &k.block;
        let h = (b.offset ^ (b.vdev.get() as u64).rotate_left(48) ^ b.birth.get().rotate_left(24) ^ (k.pool as u64).rotate_left(36))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 60) as usize % SHARDS]
    }

    fn account(&self, kind: BufKind, len: u64, add: bool) {
        let c = match kind {
            BufKind::Data => &self.data_bytes,
            BufKind::Metadata => &self.meta_bytes,
        };
        if add {
            c.fetch_add(len, Ordering::Relaxed);
        } else {
            let before = c.fetch_sub(len, Ordering::Relaxed);
            debug_assert!(before >= len, "ARC byte count under zero");
        }
    }

    /// A miss counted by the read that follows a lookup that did not count it.
    fn note_miss(&self, k: &ArcKey, access: CacheHint) {
        let ai = access_index(access.kind, access.prefetched);
        let mut s = self.shard(k).lock();
        s.counters.misses += 1;
        s.counters.misses_by[ai] += 1;
    }

    /// The buffer of `k`; a miss (no header) is counted only with `count_miss`.
    fn lookup(&self, k: &ArcKey, access: CacheHint, count_miss: bool) -> Option<Arc<AlignedBuf>> {
        let ai = access_index(access.kind, access.prefetched);
        let mut s = self.shard(k).lock();
        let Some(i) = s.map.get(&s.hdrs, k) else {
            if count_miss {
                s.counters.misses += 1;
                s.counters.misses_by[ai] += 1;
            }
            return None;
        };
        let (state, kind, bytes) = {
            let h = &s.hdrs[i as usize];
            (h.state, h.kind, h.bytes as u64)
        };
        match state {
            State::MruGhost | State::MfuGhost => {
                s.counters.misses += 1;
                s.counters.misses_by[ai] += 1;
                let gi = if state == State::MruGhost { 0 } else { 2 } + kind_index(kind);
                s.counters.ghost_hit_bytes[gi] += bytes;
                if state == State::MruGhost {
                    s.counters.mru_ghost_hits += 1;
                } else {
                    s.counters.mfu_ghost_hits += 1;
                }
                None
            }
            State::Mru => {
                s.counters.hits += 1;
                s.counters.hits_by[ai] += 1;
                s.counters.mru_hits += 1;
                if !access.prefetched {
                    let now = coarse_ms(&*self.env) as u32;
                    let h = &mut s.hdrs[i as usize];
                    if h.flags & F_PREFETCH != 0 {
                        // a demand read uses what was read ahead: a first use
                        h.flags &= !(F_PREFETCH | F_PREFETCH_ONLY);
                        h.access_ms = now;
                        s.counters.prefetch_used += 1;
                    } else if now.wrapping_sub(h.access_ms) >= ARC_MINTIME_MS {
                        h.access_ms = now;
                        h.flags &= !F_PREFETCH_ONLY;
                        s.move_to(i, State::Mfu);
                    }
                }
                s.hdrs[i as usize].data.clone()
            }
            State::Mfu => {
                s.counters.hits += 1;
                s.counters.hits_by[ai] += 1;
                s.counters.mfu_hits += 1;
                let h = &mut s.hdrs[i as usize];
                h.flags |= F_REFERENCED;
                h.data.clone()
            }
        }
    }

    fn insert(&self, k: ArcKey, data: Arc<AlignedBuf>, hint: CacheHint) {
        let len = data.len() as u64;
        let c_max = self.c_max();
        if len == 0 || len > c_max / 2 || len > u32::MAX as u64 {
            return;
        }
        let now = coarse_ms(&*self.env);
        let mut flags = if hint.l2_eligible { F_L2_ELIGIBLE } else { 0 };
        if hint.prefetched {
            flags |= F_PREFETCH | F_PREFETCH_ONLY;
        }
        let replaced = {
            let mut s = self.shard(&k).lock();
            match s.map.get(&s.hdrs, &k) {
                Some(i) => {
                    let (state, old_kind, old_bytes) = {
                        let h = &s.hdrs[i as usize];
                        (h.state, h.kind, h.bytes as u64)
                    };
                    s.unlink(i);
                    let new_state = match state {
                        // the same block cached again (a sync caching what a reader
                        // read meanwhile): the newer buffer, same place
                        State::Mru | State::Mfu => state,
                        // a ghost hit's read completing
                        State::MruGhost if s.hdrs[i as usize].flags & F_PREFETCH_ONLY != 0 => State::Mru,
                        State::MruGhost | State::MfuGhost => State::Mfu,
                    };
                    let h = &mut s.hdrs[i as usize];
                    let old = h.data.replace(data);
                    h.bytes = len as u32;
                    h.kind = hint.kind;
                    h.state = new_state;
                    h.access_ms = now as u32;
                    h.flags = flags | (h.flags & F_REFERENCED);
                    s.link_head(i);
                    old.map(|_| (old_kind, old_bytes))
                }
                None => {
                    let i = s.alloc_hdr(Hdr {
                        key: k,
                        data: Some(data),
                        newer: NIL,
                        older: NIL,
                        bytes: len as u32,
                        access_ms: now as u32,
                        state: State::Mru,
                        kind: hint.kind,
                        flags,
                    });
                    let sh = &mut *s;
                    sh.map.insert(&sh.hdrs, &k, i);
                    s.link_head(i);
                    None
                }
            }
        };
        if let Some((kind, bytes)) = replaced {
            self.account(kind, bytes, false);
        }
        self.account(hint.kind, len, true);
        self.grow(len, now);
        self.after_insert(c_max);
    }

    /// Grow `c` towards c_max by `len` while the cache is near it and memory is
    /// plentiful (module comment, "Size").
    fn grow(&self, len: u64, now_ms: u64) {
        let c_max = self.c_max();
        let c = self.c.load(Ordering::Relaxed);
        if c > c_max {
            self.c.store(c_max, Ordering::Relaxed);
            return;
        }
        if c == c_max || now_ms < self.no_grow_until_ms.load(Ordering::Relaxed) {
            return;
        }
        if self.live_bytes() + GROW_MARGIN_BYTES >= c {
            let _ = self.c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some((c + len.max(GROW_MIN_BYTES)).min(c_max)));
        }
    }

    /// Wake the evictor past the target; past the target plus the overshoot, wait for
    /// it (module comment: eviction never runs on a reader's path).
    fn after_insert(&self, c_max: u64) {
        let target = self.target();
        if self.live_bytes() <= target {
            return;
        }
        if !self.evict_wanted.swap(true, Ordering::Relaxed) {
            let mut st = self.signal.state.lock();
            st.wanted = true;
            self.signal.wake.notify_one();
        }
        let bound = target + overshoot_max_bytes(c_max);
        if self.live_bytes() <= bound {
            return;
        }
        self.memory_throttle_count.fetch_add(1, Ordering::Relaxed);
        let mut st = self.signal.state.lock();
        let mut waits = 0;
        while self.live_bytes() > self.target() + overshoot_max_bytes(self.c_max()) {
            if !st.running || st.stop || waits >= INSERT_WAIT_MAX_MS / INSERT_WAIT_STEP_MS {
                drop(st);
                // no evictor to wait for: do its work here rather than grow unbounded
                self.evict_round();
                return;
            }
            st.wanted = true;
            self.signal.wake.notify_one();
            crate::env::wait_ns(&*self.env, &self.signal.done, &mut st, INSERT_WAIT_STEP_MS * 1_000_000);
            waits += 1;
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
        let Some(i) = s.map.get(&s.hdrs, k) else { return false };
        let unshared = s.hdrs[i as usize].data.as_ref().is_some_and(|d| Arc::ptr_eq(d, held) && Arc::strong_count(held) == 2 && Arc::weak_count(held) == 0);
        if !unshared {
            return false;
        }
        let kind = s.hdrs[i as usize].kind;
        let data = s.destroy(i).expect("a live header has data");
        drop(s);
        self.account(kind, data.len() as u64, false);
        drop(data);
        debug_assert_eq!(Arc::strong_count(held), 1, "a released buffer has one owner left");
        true
    }

    /// Drop a block (it was freed): its header too, ghost or live.
    fn evict(&self, k: &ArcKey) {
        let mut s = self.shard(k).lock();
        let Some(i) = s.map.get(&s.hdrs, k) else { return };
        let kind = s.hdrs[i as usize].kind;
        if let Some(d) = s.destroy(i) {
            drop(s);
            self.account(kind, d.len() as u64, false);
        }
    }

    /// Drop every block of pool `pool` (it is being exported or closed).
    fn evict_pool(&self, pool: u32) {
        for shard in &self.shards {
            let mut s = shard.lock();
            let doomed: Vec<u32> = s.map.iter().filter(|&i| s.hdrs[i as usize].key.pool == pool).collect();
            let mut freed = Vec::new();
            for i in doomed {
                let kind = s.hdrs[i as usize].kind;
                if let Some(d) = s.destroy(i) {
                    freed.push((kind, d));
                }
            }
            drop(s);
            for (kind, d) in freed {
                self.account(kind, d.len() as u64, false);
            }
        }
    }

    /// The cached blocks of pool `pool` nearest the eviction end of the live lists,
    /// metadata and MFU first (OpenZFS's `l2arc_write_buffers` scan: MFU metadata, MRU
    /// metadata, MFU data, MRU data), up to `max_bytes` walked per list (spread over the
    /// shards), L2-eligible ones only: `visit(key, data, kind, mfu, prefetched)`
    /// returns false to stop. Each shard's lock is held for its part of one list.
    pub fn tail_blocks(&self, pool: u32, max_bytes: u64, visit: &mut dyn FnMut(BlockKey, Arc<AlignedBuf>, BufKind, bool, bool) -> bool) {
        let per_shard = (max_bytes / SHARDS as u64).max(1);
        let mut found: Vec<(BlockKey, Arc<AlignedBuf>, BufKind, bool, bool)> = Vec::new();
        for (state, kind) in [(State::Mfu, BufKind::Metadata), (State::Mru, BufKind::Metadata), (State::Mfu, BufKind::Data), (State::Mru, BufKind::Data)] {
            for shard in &self.shards {
                found.clear();
                {
                    let s = shard.lock();
                    let mut i = s.lists[list_index(state, kind)].tail;
                    let mut walked = 0u64;
                    while i != NIL && walked < per_shard {
                        let h = &s.hdrs[i as usize];
                        walked += h.bytes as u64;
                        if let (true, true, Some(d)) = (h.key.pool == pool, h.flags & F_L2_ELIGIBLE != 0, h.data.as_ref()) {
                            found.push((h.key.block, d.clone(), h.kind, h.state == State::Mfu, h.flags & F_PREFETCH != 0));
                        }
                        i = h.newer;
                    }
                }
                for (k, d, kind, mfu, prefetched) in found.drain(..) {
                    if !visit(k, d, kind, mfu, prefetched) {
                        return;
                    }
                }
            }
        }
    }

    /// Sizes of the eight lists summed over the shards.
    fn list_bytes(&self) -> [u64; LISTS] {
        let mut out = [0u64; LISTS];
        for shard in &self.shards {
            let s = shard.lock();
            for (o, l) in out.iter_mut().zip(s.lists.iter()) {
                *o += l.bytes;
            }
        }
        out
    }

    /// Lower `c` when the system runs short of memory (module comment, "Size").
    fn check_memory(&self) {
        let Some(avail) = self.env.memory_available_bytes() else { return };
        let sys_free = match ZFS_ARC_SYS_FREE.get() {
            0 => (physical_memory_bytes() / 64).max(64 << 20),
            b => b,
        };
        if avail >= sys_free {
            return;
        }
        let shortfall = sys_free - avail;
        let c_min = self.c_min();
        let _ = self.c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
            let cut = (c.saturating_sub(c_min) >> 7) + shortfall;
            Some(c.saturating_sub(cut).max(c_min))
        });
        self.no_grow_until_ms.store(coarse_ms(&*self.env) + NO_GROW_AFTER_SHORTAGE_MS, Ordering::Relaxed);
        self.shrinks.fetch_add(1, Ordering::Relaxed);
        self.evict_round();
        // what eviction freed goes back to the system now, not after the slab's delay
        crate::vdev::abd::trim_now();
    }

    /// Move the fractions by the ghost hits since the last round (module comment,
    /// "Adaptation"); `sizes` are the eight lists now. Returns (meta, pd, pm).
    fn adapt(&self, round: &mut RoundState, sizes: &[u64; LISTS]) -> (u64, u64, u64) {
        let [.., gsrd, gsrm, gsfd, gsfm] = *sizes;
        let mut hits = [0u64; 4];
        for shard in &self.shards {
            let s = shard.lock();
            for (h, g) in hits.iter_mut().zip(s.counters.ghost_hit_bytes.iter()) {
                *h += g;
            }
        }
        let d: Vec<u64> = hits.iter().zip(round.ghost_hit_bytes_seen.iter()).map(|(h, s)| h.saturating_sub(*s)).collect();
        round.ghost_hit_bytes_seen = hits;
        let (grd, grm, gfd, gfm) = (d[0], d[1], d[2], d[3]);
        let [pgsrd, pgsrm, pgsfd, pgsfm] = round.ghost_sizes;
        round.ghost_sizes = [gsrd, gsrm, gsfd, gsfm];
        let balance = ZFS_ARC_META_BALANCE.get();
        let meta = adjust(self.meta.load(Ordering::Relaxed), pgsrd + pgsrm + pgsfd + pgsfm, grm + gfm, grd + gfd, balance);
        let pd = adjust(self.pd.load(Ordering::Relaxed), pgsrd + pgsfd, grd, gfd, 100);
        let pm = adjust(self.pm.load(Ordering::Relaxed), pgsrm + pgsfm, grm, gfm, 100);
        self.meta.store(meta, Ordering::Relaxed);
        self.pd.store(pd, Ordering::Relaxed);
        self.pm.store(pm, Ordering::Relaxed);
        (meta, pd, pm)
    }

    /// One eviction round (module comment, "Adaptation"): adapt the fractions, evict
    /// what is over the target from the four live lists in their order, cut the ghost
    /// lists. Rounds run one at a time.
    fn evict_round(&self) {
        let mut round = self.round.lock();
        let sizes = self.list_bytes();
        let [mrud, mrum, mfud, mfum, ..] = sizes;
        let (meta, pd, pm) = self.adapt(&mut round, &sizes);
        let target = self.target();
        let size = self.live_bytes();
        if size > target {
            let hard = target;
            let target = target - evict_slack_bytes(self.c_max(), target);
            let over = size - target;
            let t = mrud + mrum + mfud + mfum;
            let mut wt = t.saturating_sub(over) as u128;
            let frac = |x: u128, f: u64| (x * f as u128 / ONE as u128) as u64;
            let mut left = over;
            // MRU metadata beyond its share of what should remain
            let e = left.min(mrum.saturating_sub(frac(frac(wt, meta) as u128, pm)));
            left -= self.evict_list(State::Mru, BufKind::Metadata, e, false, &mut round);
            // MFU metadata: metadata beyond its share
            let meta_now = (mrum + mfum).saturating_sub(over - left);
            let e = left.min(meta_now.saturating_sub(frac(wt, meta)));
            left -= self.evict_list(State::Mfu, BufKind::Metadata, e, false, &mut round);
            // data gets what metadata leaves
            wt = wt.saturating_sub((mrum + mfum).saturating_sub(over - left) as u128);
            let e = left.min(mrud.saturating_sub(frac(wt, pd)));
            left -= self.evict_list(State::Mru, BufKind::Data, e, false, &mut round);
            self.evict_list(State::Mfu, BufKind::Data, left, false, &mut round);
            // whatever could not come from its list comes from any: down to the slack
            // as usual, then down to the target even from young prefetches and second
            // chances (the slack is not worth them; the target holds)
            for (goal, force) in [(target, false), (hard, true)] {
                for (state, kind) in [(State::Mru, BufKind::Data), (State::Mru, BufKind::Metadata), (State::Mfu, BufKind::Metadata), (State::Mfu, BufKind::Data)] {
                    if self.live_bytes() <= goal {
                        break;
                    }
                    let want = self.live_bytes() - goal;
                    self.evict_list(state, kind, want, force, &mut round);
                }
            }
        }
        // ghost lists: each at most half the other three live lists
        let sizes = self.list_bytes();
        let live = sizes[0] + sizes[1] + sizes[2] + sizes[3];
        for (state, kind, li) in [
            (State::MruGhost, BufKind::Data, 0),
            (State::MruGhost, BufKind::Metadata, 1),
            (State::MfuGhost, BufKind::Data, 2),
            (State::MfuGhost, BufKind::Metadata, 3),
        ] {
            let cap = live.saturating_sub(sizes[li]) / 2;
            let ghost = sizes[list_index(state, kind)];
            if ghost > cap {
                self.evict_list(state, kind, ghost - cap, false, &mut round);
            }
        }
    }

    /// Take up to `bytes` from the tails of list (state, kind) across the shards: live
    /// headers become ghosts (their data handed to the sink when L2-eligible), ghosts
    /// are destroyed. Referenced MFU headers and young prefetches get a second chance
    /// unless `force`. Returns the bytes taken.
    fn evict_list(&self, state: State, kind: BufKind, bytes: u64, force: bool, round: &mut RoundState) -> u64 {
        if bytes == 0 {
            return 0;
        }
        let sink = self.sink.read().clone();
        let visit = Visit {
            state,
            li: list_index(state, kind),
            now: coarse_ms(&*self.env) as u32,
            min_prefetch_ms: ZFS_ARC_MIN_PREFETCH_MS.get() as u32,
            force,
            to_sink: sink.is_some(),
        };
        let mut taken = 0u64;
        let mut empty_visits = 0;
        let mut shard_ix = round.cursor;
        while taken < bytes && empty_visits < SHARDS {
            let mut out = VisitOut::default();
            let progressed = {
                let mut s = self.shards[shard_ix].lock();
                let before = taken;
                taken += Self::visit_shard(&mut s, &visit, bytes - taken, &mut out);
                taken > before
            };
            for d in out.freed.iter().chain(out.handed.iter().map(|(_, d, _)| d)) {
                self.account(kind, d.len() as u64, false);
            }
            drop(out.freed);
            if let Some(sink) = &sink {
                for (k, d, prefetched) in out.handed {
                    sink.evicted(k.pool, k.block, d, kind, state == State::Mfu, prefetched);
                }
            }
            empty_visits = if progressed { 0 } else { empty_visits + 1 };
            shard_ix = (shard_ix + 1) % SHARDS;
        }
        round.cursor = shard_ix;
        taken
    }

    /// One visit of a shard by [`ArcCache::evict_list`]: at most 2 × `EVICT_BATCH`
    /// headers from the list's tail (each passed at most twice: a second chance, then
    /// its eviction), until `want` bytes are taken. Returns the bytes taken; what left
    /// DRAM is in `out`.
    fn visit_shard(s: &mut Shard, v: &Visit, want: u64, out: &mut VisitOut) -> u64 {
        let mut taken = 0;
        let mut visits = 0;
        while taken < want && visits < 2 * EVICT_BATCH {
            let i = s.lists[v.li].tail;
            if i == NIL {
                break;
            }
            visits += 1;
            let (flags, access_ms, hbytes, key) = {
                let h = &s.hdrs[i as usize];
                (h.flags, h.access_ms, h.bytes as u64, h.key)
            };
            if v.state.is_ghost() {
                s.destroy(i);
                taken += hbytes;
                continue;
            }
            if !v.force && v.state == State::Mfu && flags & F_REFERENCED != 0 {
                s.hdrs[i as usize].flags &= !F_REFERENCED;
                s.move_to(i, State::Mfu);
                s.counters.evict_skip += 1;
                continue;
            }
            if !v.force && flags & F_PREFETCH != 0 && v.now.wrapping_sub(access_ms) < v.min_prefetch_ms {
                s.move_to(i, v.state);
                s.counters.evict_skip += 1;
                continue;
            }
            let ghost = if v.state == State::Mru { State::MruGhost } else { State::MfuGhost };
            s.unlink(i);
            let h = &mut s.hdrs[i as usize];
            let data = h.data.take().expect("a live header has data");
            h.state = ghost;
            h.flags &= !F_REFERENCED;
            s.link_head(i);
            s.counters.evicted += 1;
            if flags & F_L2_ELIGIBLE != 0 && v.to_sink {
                out.handed.push((key, data, flags & F_PREFETCH != 0));
            } else {
                out.freed.push(data);
            }
            taken += hbytes;
        }
        taken
    }

    /// The shards' counters and list sizes summed, and the bytes their headers take.
    fn sum_shards(&self) -> (ShardCounters, [u64; LISTS], u64) {
        let mut c = ShardCounters::default();
        let mut lists = [0u64; LISTS];
        let mut hdrs = 0u64;
        for shard in &self.shards {
            let s = shard.lock();
            let x = &s.counters;
            c.hits += x.hits;
            c.misses += x.misses;
            for j in 0..4 {
                c.hits_by[j] += x.hits_by[j];
                c.misses_by[j] += x.misses_by[j];
            }
            c.mru_hits += x.mru_hits;
            c.mfu_hits += x.mfu_hits;
            c.mru_ghost_hits += x.mru_ghost_hits;
            c.mfu_ghost_hits += x.mfu_ghost_hits;
            c.prefetch_used += x.prefetch_used;
            c.evicted += x.evicted;
            c.evict_skip += x.evict_skip;
            for (l, b) in lists.iter_mut().zip(s.lists.iter()) {
                *l += b.bytes;
            }
            // header slots plus the index's buckets and control bytes
            hdrs += (s.hdrs.capacity() * std::mem::size_of::<Hdr>()) as u64
                + s.map.allocation_bytes()
                + (s.free.capacity() * 4) as u64;
        }
        (c, lists, hdrs)
    }

    pub fn stats(&self) -> ArcStats {
        let (c, lists, hdrs) = self.sum_shards();
        let d = self.data_bytes.load(Ordering::Relaxed);
        let m = self.meta_bytes.load(Ordering::Relaxed);
        let cc = self.c.load(Ordering::Relaxed);
        let (meta, pd, pm) = (self.meta.load(Ordering::Relaxed), self.pd.load(Ordering::Relaxed), self.pm.load(Ordering::Relaxed));
        let f = |x: u64, fr: u64| (x as u128 * fr as u128 / ONE as u128) as u64;
        ArcStats {
            hits: c.hits,
            misses: c.misses,
            demand_data_hits: c.hits_by[0],
            demand_metadata_hits: c.hits_by[1],
            prefetch_data_hits: c.hits_by[2],
            prefetch_metadata_hits: c.hits_by[3],
            demand_data_misses: c.misses_by[0],
            demand_metadata_misses: c.misses_by[1],
            prefetch_data_misses: c.misses_by[2],
            prefetch_metadata_misses: c.misses_by[3],
            mru_hits: c.mru_hits,
            mfu_hits: c.mfu_hits,
            mru_ghost_hits: c.mru_ghost_hits,
            mfu_ghost_hits: c.mfu_ghost_hits,
            prefetch_used: c.prefetch_used,
            data_size: d,
            metadata_size: m,
            size: d + m,
            mru_size: lists[0] + lists[1],
            mfu_size: lists[2] + lists[3],
            mru_ghost_size: lists[4] + lists[5],
            mfu_ghost_size: lists[6] + lists[7],
            p: f(f(cc, ONE - meta), pd) + f(f(cc, meta), pm),
            c: cc,
            c_min: self.c_min(),
            c_max: self.c_max(),
            meta,
            pd,
            pm,
            evictions: c.evicted,
            evict_skip: c.evict_skip,
            memory_throttle_count: self.memory_throttle_count.load(Ordering::Relaxed),
            shrinks: self.shrinks.load(Ordering::Relaxed),
            hdr_size: hdrs,
            reserved: self.reserved.load(Ordering::Relaxed),
        }
    }
}

impl Drop for ArcCache {
    fn drop(&mut self) {
        let mut st = self.signal.state.lock();
        st.stop = true;
        self.signal.wake.notify_all();
        self.signal.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::SimEnv;

    fn pool_on(c_max: u64) -> PoolArc {
        PoolArc::attach(ArcCache::new(c_max))
    }

    fn k(i: u64) -> BlockKey {
        BlockKey { vdev: VdevId(0), offset: i << 12, birth: Txg(1) }
    }

    fn buf(len: usize) -> Arc<AlignedBuf> {
        Arc::new(AlignedBuf::from(vec![0u8; len]))
    }

    /// A cache on a simulated clock and memory, limit `c_max`.
    fn sim_cache(c_max: u64) -> (Arc<SimEnv>, Arc<ArcCache>) {
        let env = Arc::new(SimEnv::new(1));
        let cache = ArcCache::with_limit_fn(move || c_max, env.clone());
        (env, cache)
    }

    /// Wait for the evictor to bring the cache to its target.
    fn settle(cache: &ArcCache) {
        for _ in 0..500 {
            if cache.live_bytes() <= cache.target() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        cache.evict_round();
    }

    #[test]
    fn arc_limits_are_bounded_by_the_machine_as_openzfs_bounds_them() {
        let ram = physical_memory_bytes();
        let e = ZFS_ARC_MAX.check(ram).unwrap_err().to_string();
        assert!(e.starts_with("zfs_arc_max: value ") && e.contains("is not below the machine's physical memory ("), "{e}");
        assert!(ZFS_ARC_MAX.check(1 << 50).is_err(), "far beyond any RAM");
        assert!(ZFS_ARC_MAX.check(0).is_ok(), "auto is always allowed");
        assert!(ZFS_ARC_MAX.check(64 << 20).is_ok());
        assert!(ZFS_ARC_SYS_FREE.check(ram).is_err());
        assert!(ZFS_ARC_MIN.check(ram).unwrap_err().to_string().contains("above the ARC's limit zfs_arc_max"));
        let e = crate::dsl_pool::ZFS_DIRTY_DATA_MAX.check(ram / 4 + (1 << 20)).unwrap_err().to_string();
        assert!(e.contains("above 25% of the machine's physical memory"), "{e}");
    }

    #[test]
    fn headers_stay_small() {
        assert!(std::mem::size_of::<Hdr>() <= 64, "a header grew to {} bytes", std::mem::size_of::<Hdr>());
    }

    #[test]
    fn a_round_takes_the_cache_below_its_target_so_one_wake_up_serves_many_inserts() {
        let c_max = 256u64 << 20;
        let (_env, cache) = sim_cache(c_max);
        let arc = PoolArc::attach(cache.clone());
        let mut i = 0u64;
        while cache.stats().evictions == 0 {
            arc.insert(k(i), buf(64 << 10), CacheHint::DATA);
            i += 1;
            assert!(i < 2 * c_max / (64 << 10), "never evicted");
        }
        settle(&cache);
        while cache.live_bytes() <= cache.target() {
            arc.insert(k(i), buf(64 << 10), CacheHint::DATA);
            i += 1;
        }
        cache.evict_round();
        let target = cache.target();
        let slack = evict_slack_bytes(c_max, target);
        assert!(slack >= 1 << 20);
        assert!(cache.live_bytes() <= target - slack, "a round stopped at {} (target {target}, slack {slack})", cache.live_bytes());
        assert!(cache.live_bytes() + slack + (64 << 10) > target - slack, "a round took far more than the slack: {}", cache.live_bytes());
    }

    #[test]
    fn a_reservation_evicts_at_once_is_capped_and_ends_when_dropped() {
        let arc = pool_on(SHARDS as u64 * 8192);
        for i in 0..64u64 {
            arc.insert(k(i), buf(4096), CacheHint::DATA);
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
        arc.insert(BlockKey { vdev: VdevId(0), offset: 1 << 30, birth: Txg(2) }, buf(4096), CacheHint::DATA);
        assert_eq!(arc.stats().size, 4096, "the cache takes blocks again");
    }

    #[test]
    fn bounded_and_spread_over_the_shards() {
        let c_max = SHARDS as u64 * 8192;
        let arc = pool_on(c_max);
        for i in 0..1000u64 {
            arc.insert(k(i), buf(4096), CacheHint::DATA);
            let st = arc.stats();
            assert!(st.size <= c_max + overshoot_max_bytes(c_max), "{st:?}");
        }
        let st = arc.stats();
        assert!(st.evictions > 0);
        assert!(arc.lookup(&k(999), CacheHint::DATA).is_some(), "the newest block was evicted");
        // 16K-aligned blocks of one txg must spread over (almost) every shard
        let used: std::collections::HashSet<usize> = (0..256u64)
            .map(|i| {
                let key = BlockKey { vdev: VdevId(1), offset: i << 14, birth: Txg(7) };
                arc.cache.shard(&arc.key(&key)) as *const _ as usize
            })
            .collect();
        assert!(used.len() >= SHARDS - 2, "only {} of {SHARDS} shards used", used.len());
        arc.evict(&k(999));
        assert!(arc.lookup(&k(999), CacheHint::DATA).is_none());
    }

    #[test]
    fn zfs_arc_max_applies_live() {
        let arc = PoolArc::attach(ArcCache::following_tunable(crate::env::real()));
        let auto = arc.cache.c_max();
        assert!(auto >= 64 << 20);
        ZFS_ARC_MAX.set(128 << 20).unwrap();
        assert_eq!(arc.stats().c_max, 128 << 20);
        let block = 128 << 10;
        for i in 0..800u64 {
            arc.insert(BlockKey { vdev: VdevId(0), offset: i * block, birth: Txg(1) }, buf(block as usize), CacheHint::DATA);
        }
        assert!(arc.stats().size > 64 << 20, "{:?}", arc.stats());
        ZFS_ARC_MAX.set(64 << 20).unwrap();
        arc.insert(BlockKey { vdev: VdevId(1), offset: 0, birth: Txg(1) }, buf(4096), CacheHint::METADATA);
        let st = arc.stats();
        assert!(st.size <= (64 << 20) + overshoot_max_bytes(64 << 20), "lowering zfs_arc_max must trim the ARC: {st:?}");
        assert!(ZFS_ARC_MAX.set(4096).is_err(), "below the 64 MiB floor");
        ZFS_ARC_MAX.set(0).unwrap();
        assert_eq!(arc.cache.c_max(), auto);
    }

    #[test]
    fn pools_never_see_each_others_blocks_and_leave_with_their_entries() {
        let cache = ArcCache::new(64 << 20);
        // two pools with the same block addresses (two copies of one pool image)
        let a = PoolArc::attach(cache.clone());
        let b = PoolArc::attach(cache.clone());
        let key = BlockKey { vdev: VdevId(0), offset: 4 << 20, birth: Txg(9) };
        a.insert(key, Arc::new(AlignedBuf::from(vec![1u8; 4096])), CacheHint::DATA);
        assert!(b.lookup(&key, CacheHint::DATA).is_none(), "pool b was served pool a's block");
        b.insert(key, Arc::new(AlignedBuf::from(vec![2u8; 4096])), CacheHint::DATA);
        assert_eq!(a.lookup(&key, CacheHint::DATA).unwrap()[0], 1);
        assert_eq!(b.lookup(&key, CacheHint::DATA).unwrap()[0], 2);
        assert!(!b.release_to_writer(&key, &a.lookup(&key, CacheHint::DATA).unwrap()), "b released a's buffer");
        b.evict(&key);
        assert_eq!(a.lookup(&key, CacheHint::DATA).unwrap()[0], 1, "b's free dropped a's block");
        assert_eq!(cache.stats().size, 4096);
        drop(a);
        assert_eq!(cache.stats().size, 0, "an exported pool's entries stay in the ARC");
        // a pool opened later gets a load id of its own
        let c = PoolArc::attach(cache.clone());
        assert!(c.lookup(&key, CacheHint::DATA).is_none());
    }

    #[test]
    fn a_second_use_after_mintime_moves_to_mfu_a_burst_does_not() {
        let (env, cache) = sim_cache(64 << 20);
        let p = PoolArc::attach(cache.clone());
        p.insert(k(1), buf(4096), CacheHint::DATA);
        p.insert(k(2), buf(4096), CacheHint::DATA);
        // a burst right after the read: one use
        env.advance_ns(10_000_000);
        assert!(p.lookup(&k(1), CacheHint::DATA).is_some());
        assert_eq!(cache.stats().mfu_size, 0, "a hit within 62.5 ms promoted");
        env.advance_ns(100_000_000);
        assert!(p.lookup(&k(1), CacheHint::DATA).is_some());
        let st = cache.stats();
        assert_eq!((st.mru_size, st.mfu_size), (4096, 4096), "{st:?}");
        assert_eq!((st.mru_hits, st.mfu_hits), (2, 0));
        assert!(p.lookup(&k(1), CacheHint::DATA).is_some());
        assert_eq!(cache.stats().mfu_hits, 1);
        // a prefetched block used once by demand stays in MRU
        p.insert(k(3), buf(4096), CacheHint { prefetched: true, ..CacheHint::DATA });
        env.advance_ns(500_000_000);
        assert!(p.lookup(&k(3), CacheHint::DATA).is_some());
        let st = cache.stats();
        assert_eq!((st.mru_size, st.prefetch_used), (8192, 1), "{st:?}");
    }

    /// The hit ratio of `hot` blocks read again, after a sequential scan of `scan`
    /// other blocks, on a cache of `cap` blocks (a sim clock: reads 1 ms apart).
    fn hot_hit_ratio_after_scan(cap: u64, hot: u64, scan: u64) -> f64 {
        let (env, cache) = sim_cache(cap * 4096);
        let p = PoolArc::attach(cache.clone());
        let read = |i: u64| {
            env.advance_ns(1_000_000);
            if p.lookup(&k(i), CacheHint::DATA).is_none() {
                p.insert(k(i), buf(4096), CacheHint::DATA);
            }
        };
        // the hot set, used over and over
        for _ in 0..4 {
            for i in 0..hot {
                read(i);
            }
            env.advance_ns(100_000_000);
        }
        // one big sequential read
        for i in 0..scan {
            read(1_000_000 + i);
            if i % 64 == 0 {
                settle(&cache);
            }
        }
        settle(&cache);
        let before = cache.stats();
        for i in 0..hot {
            env.advance_ns(1_000_000);
            let _ = p.lookup(&k(i), CacheHint::DATA);
        }
        let after = cache.stats();
        (after.hits - before.hits) as f64 / hot as f64
    }

    #[test]
    fn a_large_sequential_read_does_not_flush_the_hot_set() {
        // hot set half the cache, scan 4x the cache
        let ratio = hot_hit_ratio_after_scan(1024, 512, 4096);
        assert!(ratio >= 0.9, "hot set hit ratio after the scan {ratio:.2}");
    }

    #[test]
    fn p_moves_toward_the_list_whose_ghosts_are_hit() {
        // A hot set of 60 % of the cache, read again every 100 ms, between which a scan
        // of new blocks (read once) goes by: with MRU holding half, part of the hot set
        // falls out of MFU and its next read hits the MFU ghost list, so MRU's data
        // share (pd) must fall until the hot set fits.
        let cap = 512u64;
        let hot = cap * 6 / 10;
        let (env, cache) = sim_cache(cap * 4096);
        let p = PoolArc::attach(cache.clone());
        let read = |i: u64| {
            env.advance_ns(50_000);
            if p.lookup(&k(i), CacheHint::DATA).is_none() {
                p.insert(k(i), buf(4096), CacheHint::DATA);
            }
        };
        for i in 0..hot {
            read(i);
        }
        env.advance_ns(100_000_000);
        settle(&cache);
        let pd0 = cache.stats().pd;
        for pass in 0..16u64 {
            for i in 0..hot {
                read(i);
            }
            for i in 0..cap {
                read(1_000_000 + pass * cap + i);
            }
            env.advance_ns(100_000_000);
            settle(&cache);
        }
        let st = cache.stats();
        assert!(st.mfu_ghost_hits > 0, "{st:?}");
        assert!(st.pd < pd0, "pd did not fall under MFU ghost hits: {} -> {} ({st:?})", pd0, st.pd);

        // Scan of new blocks, each read twice within a second: MRU ghost hits push pd up
        let (env, cache) = sim_cache(cap * 4096);
        let p = PoolArc::attach(cache.clone());
        // fill MFU first so MRU is small
        for round in 0..2 {
            for i in 0..cap {
                env.advance_ns(100_000);
                if p.lookup(&k(i), CacheHint::DATA).is_none() {
                    p.insert(k(i), buf(4096), CacheHint::DATA);
                }
            }
            env.advance_ns(100_000_000 * (round + 1));
        }
        settle(&cache);
        let pd0 = cache.stats().pd;
        for pass in 0..8u64 {
            let base = 10_000 + pass * cap;
            for i in 0..cap {
                env.advance_ns(100_000);
                let key = k(base + i);
                if p.lookup(&key, CacheHint::DATA).is_none() {
                    p.insert(key, buf(4096), CacheHint::DATA);
                }
            }
            settle(&cache);
            // the same new blocks again, soon: those MRU lost are MRU ghost hits
            for i in 0..cap {
                env.advance_ns(10_000);
                let key = k(base + i);
                if p.lookup(&key, CacheHint::DATA).is_none() {
                    p.insert(key, buf(4096), CacheHint::DATA);
                }
            }
            settle(&cache);
        }
        let st = cache.stats();
        assert!(st.mru_ghost_hits > 0, "{st:?}");
        assert!(st.pd > pd0, "pd did not rise under MRU ghost hits: {} -> {} ({st:?})", pd0, st.pd);
    }

    #[test]
    fn the_target_shrinks_when_memory_runs_short_and_grows_back_later() {
        let c_max = 256u64 << 20;
        let (env, cache) = sim_cache(c_max);
        let p = PoolArc::attach(cache.clone());
        for i in 0..(200u64 << 20) / (128 << 10) {
            p.insert(BlockKey { vdev: VdevId(0), offset: i << 17, birth: Txg(1) }, buf(128 << 10), CacheHint::DATA);
        }
        assert_eq!(cache.stats().size, 200 << 20);
        // the system runs short: 1 MiB available
        env.set_memory_available_bytes(Some(1 << 20));
        cache.check_memory();
        let st = cache.stats();
        assert!(st.c < c_max && st.c >= st.c_min, "{st:?}");
        assert!(st.size <= st.c, "not evicted to the new target: {st:?}");
        assert_eq!(st.shrinks, 1);
        let c_low = st.c;
        // plenty again: no growth within 5 s, growth after
        env.set_memory_available_bytes(Some(u64::MAX - 1));
        cache.check_memory();
        p.insert(BlockKey { vdev: VdevId(1), offset: 0, birth: Txg(1) }, buf(128 << 10), CacheHint::DATA);
        assert_eq!(cache.stats().c, c_low, "grew during the shortage's back-off");
        env.advance_ns(6_000_000_000);
        for i in 0..64u64 {
            p.insert(BlockKey { vdev: VdevId(2), offset: i << 17, birth: Txg(1) }, buf(128 << 10), CacheHint::DATA);
        }
        assert!(cache.stats().c > c_low, "did not grow back: {:?}", cache.stats());
    }

    #[test]
    fn eviction_hands_l2_eligible_blocks_to_the_sink() {
        struct Count(Mutex<Vec<BlockKey>>);
        impl EvictSink for Count {
            fn evicted(&self, _pool: u32, key: BlockKey, _data: Arc<AlignedBuf>, _kind: BufKind, _mfu: bool, _prefetched: bool) {
                self.0.lock().push(key);
            }
        }
        let (_env, cache) = sim_cache(64 * 4096);
        let sink = Arc::new(Count(Mutex::new(Vec::new())));
        cache.set_evict_sink(Some(sink.clone()));
        let p = PoolArc::attach(cache.clone());
        for i in 0..256u64 {
            let hint = CacheHint { l2_eligible: i % 2 == 0, ..CacheHint::DATA };
            p.insert(k(i), buf(4096), hint);
        }
        settle(&cache);
        let handed = sink.0.lock().clone();
        assert!(handed.len() >= 64, "only {} handed", handed.len());
        assert!(handed.iter().all(|key| (key.offset >> 12) % 2 == 0), "a block not eligible for L2 was handed");
    }

    #[test]
    fn adjust_steps_are_bounded_and_damped() {
        let half = ONE / 2;
        assert_eq!(adjust(half, 16, 10, 0, 100), half, "too few ghosts to learn from");
        assert_eq!(adjust(half, 1 << 20, 0, 0, 100), half);
        let up = adjust(half, 1 << 20, 1 << 20, 0, 100);
        assert!(up > half && up - half <= ONE / 30, "step {}", up - half);
        let down = adjust(half, 1 << 20, 0, 1 << 20, 100);
        assert!(down < half && half - down <= ONE / 30);
        let down_balanced = adjust(half, 1 << 20, 0, 1 << 20, 500);
        assert!(half - down_balanced < half - down, "balance 500 must damp the step down");
        // near the top a step up is damped
        let top = ONE / 100 * 95;
        assert!(adjust(top, 1 << 20, 1 << 20, 0, 100) - top < up - half);
        assert!(adjust(ONE, 1 << 20, 1 << 20, 0, 100) <= ONE);
        assert_eq!(adjust(0, 1 << 20, 0, 1 << 20, 100), 0);
    }
}
