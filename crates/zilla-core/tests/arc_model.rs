//! Model test of the ARC against a simple oracle: random inserts, lookups, frees,
//! releases to writers, sync reservations, limit changes and pools coming and going,
//! on one cache shared by several pools. Whatever the replacement policy, the ARC must:
//!
//! - serve a key only the buffer last cached under it, in the same pool, and nothing
//!   after the block was freed, released to a writer or its pool detached;
//! - stay within its limit (c_max less the sync reservations, plus the ARC's stated
//!   overshoot) after every operation, and account data and metadata bytes exactly;
//! - count each lookup once, as a hit or a miss;
//! - leave a buffer released to a writer with the writer alone.
//!
//! The policy itself (which blocks stay) is the business of the ARC's own tests; the
//! oracle only knows which blocks *may* be cached. A failing case is shrunk and stored
//! by proptest (arc_model.proptest-regressions), so it replays.
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use zilla_core::arc::{overshoot_max_bytes, ArcCache, BlockKey, BufKind, CacheHint, PoolArc};
use zilla_core::vdev::abd::AlignedBuf;
use zilla_core::{Txg, VdevId};

const POOLS: usize = 3;
const KEYS: u64 = 48;

#[derive(Debug, Clone)]
enum Op {
    Insert { pool: usize, key: u64, prefetched: bool },
    Lookup { pool: usize, key: u64 },
    Free { pool: usize, key: u64 },
    Release { pool: usize, key: u64 },
    Reserve { bytes_4k: u64 },
    EndReservation,
    Limit { c_max_4k: u64 },
    Reattach { pool: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let pool = 0..POOLS;
    prop_oneof![
        8 => (pool.clone(), 0..KEYS, any::<bool>()).prop_map(|(pool, key, prefetched)| Op::Insert { pool, key, prefetched }),
        8 => (pool.clone(), 0..KEYS).prop_map(|(pool, key)| Op::Lookup { pool, key }),
        2 => (pool.clone(), 0..KEYS).prop_map(|(pool, key)| Op::Free { pool, key }),
        2 => (pool.clone(), 0..KEYS).prop_map(|(pool, key)| Op::Release { pool, key }),
        1 => (0u64..64).prop_map(|bytes_4k| Op::Reserve { bytes_4k }),
        1 => Just(Op::EndReservation),
        1 => (16u64..160).prop_map(|c_max_4k| Op::Limit { c_max_4k }),
        1 => pool.prop_map(|pool| Op::Reattach { pool }),
    ]
}

fn key(k: u64) -> BlockKey {
    // a few vdevs and births, so equal offsets of different blocks occur
    BlockKey { vdev: VdevId((k % 3) as u32), offset: (k / 3) << 17, birth: Txg(1 + k % 5) }
}

/// A block's size and kind: fixed by its key, as a block pointer fixes them.
fn shape(k: u64) -> (usize, BufKind) {
    let len = (1 + k as usize % 8) * 4096;
    (len, if k % 3 == 0 { BufKind::Metadata } else { BufKind::Data })
}

/// The bytes of block `k` of pool `pool` in its life `version`. A block's content never
/// changes under its key (copy-on-write); a key comes back only for a new block after
/// the old one was freed, which the model plays as a new version.
fn content(pool: usize, k: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        let word = (pool as u64) << 56 ^ k << 40 ^ version << 20 ^ i as u64;
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
    v
}

/// What the oracle knows of a block: the buffer last cached under its key (it may be
/// cached or evicted) and its kind.
struct Known {
    data: Arc<AlignedBuf>,
    kind: BufKind,
}

/// A mutable cache (a limit that can change) with the ops' view of it.
struct Model {
    cache: Arc<ArcCache>,
    c_max: Arc<std::sync::atomic::AtomicU64>,
    pools: Vec<PoolArc>,
    known: Vec<HashMap<u64, Known>>,
    /// Each (pool, key)'s current life; bumped when the block is freed or its pool goes.
    lives: Vec<HashMap<u64, u64>>,
    version: u64,
    lookups: u64,
}

fn check_bounds(m: &Model, reserved: u64, when: &str) -> Result<(), TestCaseError> {
    let st = m.cache.stats();
    prop_assert_eq!(st.size, st.data_size + st.metadata_size, "size is data + metadata ({})", when);
    prop_assert_eq!(st.reserved, reserved, "reservations ({})", when);
    let c_max = m.c_max.load(std::sync::atomic::Ordering::Relaxed);
    prop_assert!(
        st.size <= c_max.saturating_sub(reserved) + overshoot_max_bytes(c_max),
        "size {} over c_max {} - reserved {} + overshoot {} ({})",
        st.size,
        c_max,
        reserved,
        overshoot_max_bytes(c_max),
        when
    );
    // at most what the oracle says may be cached, per kind
    let (mut data, mut meta) = (0, 0);
    for k in &m.known {
        for v in k.values() {
            match v.kind {
                BufKind::Data => data += v.data.len() as u64,
                BufKind::Metadata => meta += v.data.len() as u64,
            }
        }
    }
    prop_assert!(st.data_size <= data, "data {} > {} cacheable ({})", st.data_size, data, when);
    prop_assert!(st.metadata_size <= meta, "metadata {} > {} cacheable ({})", st.metadata_size, meta, when);
    prop_assert_eq!(st.hits + st.misses, m.lookups, "lookups counted once ({})", when);
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let c_max = Arc::new(std::sync::atomic::AtomicU64::new(96 * 4096));
    let cache = ArcCache::with_limit_fn(
        {
            let c = c_max.clone();
            move || c.load(std::sync::atomic::Ordering::Relaxed)
        },
        zilla_core::env::real(),
    );
    let mut m = Model {
        pools: (0..POOLS).map(|_| PoolArc::attach(cache.clone())).collect(),
        cache,
        c_max,
        known: (0..POOLS).map(|_| HashMap::new()).collect(),
        lives: (0..POOLS).map(|_| HashMap::new()).collect(),
        version: 0,
        lookups: 0,
    };
    // one reservation at a time, as one txg sync holds one
    let cache = m.cache.clone();
    let mut reservation_bytes = 0u64;
    let mut reservation = None;
    for (i, op) in ops.into_iter().enumerate() {
        let when = format!("op {i}: {op:?}");
        match op {
            Op::Insert { pool, key: k, prefetched } => {
                let (len, kind) = shape(k);
                let life = *m.lives[pool].entry(k).or_insert_with(|| {
                    m.version += 1;
                    m.version
                });
                let data = Arc::new(AlignedBuf::from(content(pool, k, life, len)));
                let hint = CacheHint { kind, prefetched, l2_eligible: true };
                m.pools[pool].insert(key(k), data.clone(), hint);
                m.known[pool].insert(k, Known { data, kind });
            }
            Op::Lookup { pool, key: k } => {
                m.lookups += 1;
                if let Some(got) = m.pools[pool].lookup(&key(k), CacheHint::DATA) {
                    let Some(want) = m.known[pool].get(&k) else {
                        return Err(TestCaseError::fail(format!("{when}: a hit on a block not cached in this pool")));
                    };
                    prop_assert!(Arc::ptr_eq(&got, &want.data) || *got == *want.data, "{}: served other bytes", when);
                    prop_assert_eq!(&got[..], &want.data[..], "{}: served other bytes", when);
                }
            }
            Op::Free { pool, key: k } => {
                m.pools[pool].evict(&key(k));
                m.known[pool].remove(&k);
                m.lives[pool].remove(&k);
            }
            Op::Release { pool, key: k } => {
                m.lookups += 1;
                if let Some(held) = m.pools[pool].lookup(&key(k), CacheHint::DATA) {
                    let mut held = held;
                    if m.pools[pool].release_to_writer(&key(k), &held) {
                        // the writer alone holds it, and the block is no longer cached
                        prop_assert!(Arc::get_mut(&mut held).is_some(), "{}: released but shared", when);
                        // the writer changes it: the block's next version has a new key
                        m.known[pool].remove(&k);
                        m.lives[pool].remove(&k);
                        m.lookups += 1;
                        prop_assert!(m.pools[pool].lookup(&key(k), CacheHint::DATA).is_none(), "{}: released block still served", when);
                    }
                }
            }
            Op::Reserve { bytes_4k } => {
                let r = reservation.get_or_insert_with(|| cache.reservation());
                reservation_bytes += r.take_up_to(bytes_4k * 4096);
                prop_assert_eq!(r.bytes(), reservation_bytes);
            }
            Op::EndReservation => {
                reservation = None;
                reservation_bytes = 0;
            }
            Op::Limit { c_max_4k } => {
                m.c_max.store(c_max_4k * 4096, std::sync::atomic::Ordering::Relaxed);
                // a lower limit applies at the next insert or reservation; make one
                m.version += 1;
                let k = KEYS + 1;
                m.pools[0].insert(key(k), Arc::new(AlignedBuf::from(content(0, k, m.version, shape(k).0))), CacheHint::of(shape(k).1));
                m.pools[0].evict(&key(k));
            }
            Op::Reattach { pool } => {
                // export and import: the pool's blocks leave with it
                let before = m.cache.stats().size;
                m.pools[pool] = PoolArc::attach(m.cache.clone());
                m.known[pool].clear();
                m.lives[pool].clear();
                prop_assert!(m.cache.stats().size <= before, "{}: size grew on detach", when);
            }
        }
        check_bounds(&m, reservation.as_ref().map_or(0, |_| reservation_bytes), &when)?;
    }
    drop(reservation);
    drop(m.pools);
    prop_assert_eq!(cache.stats().size, 0, "blocks left after every pool detached");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn the_arc_serves_only_what_was_cached_and_stays_within_its_limit(ops in proptest::collection::vec(op(), 1..400)) {
        run(ops)?;
    }
}
