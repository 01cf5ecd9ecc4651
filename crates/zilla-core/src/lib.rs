//! zilla-core: the pool engine.
//!
//! Layers: see [`LAYERS`], the one table of them (a module imports only from rows
//! below its own; `tests/tidy.rs` enforces it in the default test run).
//!
//! No sockets, no HTTP, no async runtime here: front ends live in their own crates.

pub mod types;
pub mod error;
pub mod fm;
pub mod kstat;
pub mod env;
pub mod block;
pub mod vdev;
pub mod metaslab;
pub mod arc;
pub mod l2arc;
pub mod zio;
pub mod dmu;
pub mod dsl_dir;
pub mod space_map;
pub mod free_list;
pub mod zfeature;
pub mod dsl_destroy;
pub mod pool_mos;
pub mod txg;
pub mod dsl_pool;
pub mod zil;
pub mod zfetch;
pub mod spa_history;
pub mod spa;
pub mod scan;
pub mod zvol;
pub mod zap;
pub mod props;
pub mod memvol;
pub mod analytics;

pub use error::{Error, Result};
pub use types::{BlockId, Guid, Txg, VdevId};

/// The engine's layers, bottom row first (shared/ARCHITECTURE.md section 2). A module
/// may import only modules of lower rows: not sideways within its row, never upward.
/// News travels up as return values and completions. The tidy test
/// (`tests/tidy.rs`) parses every `crate::` path and fails on any other edge that is not
/// in its shrinking allow-list of known violations.
pub const LAYERS: &[&[&str]] = &[
    &["kstat", "env", "types"], // counters, histograms, tunables; clock, sleep, spawn, randomness; Txg, Guid, VdevId, BlockId
    &["error"],        // engine errors (one errno each)
    &["fm"],           // fault-management events (zevents): the bounded queue every layer posts to
    &["block", "zap"], // on-disk block format: block pointers, checksums, compression; ZAP codec (over a block seam)
    &["vdev", "txg"],  // leaves, per-leaf queue, mirror, labels; txg state machine
    &["metaslab", "props"], // space allocation per top-level vdev; typed volume properties
    &["arc"],          // DRAM block cache
    &["l2arc"],        // the second-level cache on a pool's cache devices
    &["zio"],          // the block pipeline: prepare, verified reads + self-heal, allocation, write issue
    &["dsl_pool", "zil"], // dirty accounting and the write throttle; the intent log
    &["zfetch", "spa_history"], // sequential-stream detection for read-ahead, per volume; the pool's command history ring
    &["dmu"],          // object directory, volume block-pointer trees, dirty records; format 2 objsets
    &["dsl_dir", "space_map", "free_list", "zfeature", "dsl_destroy"], // over the MOS (format 2): the dataset tree (names, inherited properties, space fields); metaslab space maps; deferred frees; feature flags; background destroy
    &["pool_mos"],     // a format 2 pool's MOS: the object directory, what it names, the sync in passes
    &["zvol", "scan"], // the Volume API the front ends use; scrub and resilver
    &["memvol"],       // an in-memory Volume with the same semantics (tests, demos)
    &["spa"],          // the pool: create/import/export, sync, uberblocks
    &["analytics"],    // the history of the statistics the web UI draws (no engine internals)
];

/// Every tunable of the engine by name: the admin API's `tunable get` / `tunable set`.
/// Each module declares its own as typed statics and reads them directly; this list is
/// the one place that gathers them (a unit test checks that no name is declared twice).
pub static TUNABLES: kstat::Registry = kstat::Registry::new(&[
    &vdev::queue::ZFS_VDEV_SYNC_READ_MIN_ACTIVE,
    &vdev::queue::ZFS_VDEV_SYNC_READ_MAX_ACTIVE,
    &vdev::queue::ZFS_VDEV_SYNC_WRITE_MIN_ACTIVE,
    &vdev::queue::ZFS_VDEV_SYNC_WRITE_MAX_ACTIVE,
    &vdev::queue::ZFS_VDEV_ASYNC_READ_MIN_ACTIVE,
    &vdev::queue::ZFS_VDEV_ASYNC_READ_MAX_ACTIVE,
    &vdev::queue::ZFS_VDEV_ASYNC_WRITE_MIN_ACTIVE,
    &vdev::queue::ZFS_VDEV_ASYNC_WRITE_MAX_ACTIVE,
    &vdev::queue::ZFS_VDEV_SCRUB_MIN_ACTIVE,
    &vdev::queue::ZFS_VDEV_SCRUB_MAX_ACTIVE,
    &vdev::queue::ZFS_VDEV_MAX_ACTIVE,
    &vdev::queue::ZFS_VDEV_TRIM_MIN_ACTIVE,
    &vdev::queue::ZFS_VDEV_TRIM_MAX_ACTIVE,
    &vdev::queue::ZFS_VDEV_AGGREGATION_LIMIT,
    &vdev::queue::ZFS_VDEV_AGGREGATION_LIMIT_NON_ROTATING,
    &vdev::queue::ZFS_VDEV_READ_GAP_LIMIT,
    &vdev::queue::ZFS_VDEV_NIA_CREDIT,
    &vdev::queue::ZFS_VDEV_NIA_DELAY,
    &vdev::queue::ZFS_VDEV_ASYNC_WRITE_ACTIVE_MIN_DIRTY_PERCENT,
    &vdev::queue::ZFS_VDEV_ASYNC_WRITE_ACTIVE_MAX_DIRTY_PERCENT,
    &vdev::queue::ZFS_VDEV_SCHEDULER_MODE,
    &vdev::queue::ZILLA_VDEV_IO_ENGINE,
    &vdev::sim::SIM_HDD_RPM,
    &vdev::sim::SIM_HDD_SEEK_SETTLE_US,
    &vdev::sim::SIM_HDD_SEEK_FULL_STROKE_US,
    &vdev::sim::SIM_HDD_TRANSFER_MB_S,
    &vdev::sim::SIM_HDD_WRITE_CACHE_BYTES,
    &vdev::sim::SIM_HDD_CACHE_WRITE_US,
    &vdev::sim::SIM_HDD_NCQ_DEPTH,
    &vdev::sim::SIM_HDD_HOST_READS_FIRST,
    &vdev::sim::SIM_HDD_INTERFACE_MB_S,
    &vdev::sim::SIM_HDD_IDLE_DESTAGE,
    &vdev::sim::SIM_HDD_DESTAGE_CHUNK_BYTES,
    &vdev::sim::SIM_SSD_LOG_WRITE_LATENCY_US,
    &vdev::sim::SIM_SSD_LOG_WRITE_MB_S,
    &vdev::sim::SIM_SSD_LOG_READ_LATENCY_US,
    &vdev::sim::SIM_SSD_LOG_READ_MB_S,
    &vdev::sim::SIM_SSD_LOG_FLUSH_US,
    &vdev::sim::SIM_SSD_LOG_CHANNELS,
    &vdev::sim::SIM_SSD_CACHE_READ_LATENCY_US,
    &vdev::sim::SIM_SSD_CACHE_READ_MB_S,
    &vdev::sim::SIM_SSD_CACHE_WRITE_LATENCY_US,
    &vdev::sim::SIM_SSD_CACHE_WRITE_MB_S,
    &vdev::sim::SIM_SSD_CACHE_FLUSH_US,
    &vdev::sim::SIM_SSD_CACHE_CHANNELS,
    &vdev::sim::SIM_SEED,
    &vdev::sim::SIM_FLUSH_BACKING,
    &vdev::sim::SIM_SPIN_US,
    &vdev::ZILLA_LOG_REGION_FILL,
    &vdev::ZFS_VDEV_MIRROR_ROTATING_INC,
    &vdev::ZFS_VDEV_MIRROR_ROTATING_SEEK_INC,
    &vdev::ZFS_VDEV_MIRROR_ROTATING_SEEK_OFFSET,
    &vdev::ZFS_VDEV_MIRROR_NON_ROTATING_INC,
    &vdev::ZFS_VDEV_MIRROR_NON_ROTATING_SEEK_INC,
    &txg::ZFS_TXG_TIMEOUT,
    &fm::ZFS_ZEVENT_LEN_MAX,
    &fm::ZFS_CHECKSUM_EVENTS_PER_SECOND,
    &zio::workers::ZILLA_BACKGROUND_NICE,
    &txg::ZFS_TXG_HISTORY,
    &dsl_pool::ZFS_DIRTY_DATA_MAX,
    &dsl_pool::ZFS_DIRTY_DATA_SYNC_PERCENT,
    &dsl_pool::ZFS_DELAY_MIN_DIRTY_PERCENT,
    &dsl_pool::ZFS_DELAY_SCALE,
    &dsl_pool::ZFS_DELAY_MAX_NS,
    &zil::ZIL_MAXBLOCKSIZE,
    &zil::ZIL_NOCACHEFLUSH,
    &zil::ZIL_REPLAY_DISABLE,
    &zil::ZFS_IMMEDIATE_WRITE_SZ,
    &zil::ZIL_SLOG_BULK,
    &zil::ZILLA_ZIL_COMMIT_BYTES_MAX,
    &zil::ZFS_COMMIT_TIMEOUT_PCT,
    &dsl_pool::ZFS_WRITE_THROTTLE_MODE,
    &dsl_pool::ZFS_TXG_SYNCTIME_MS,
    &dsl_pool::ZFS_WRITE_LIMIT_MIN,
    &dsl_pool::ZFS_WRITE_LIMIT_OVERRIDE,
    &metaslab::ZILLA_METASLAB_FIRST_FIT,
    &vdev::trim::ZFS_TRIM_EXTENT_BYTES_MIN,
    &vdev::trim::ZFS_TRIM_EXTENT_BYTES_MAX,
    &vdev::trim::ZFS_TRIM_QUEUE_LIMIT,
    &spa::trim::ZILLA_TRIM_TXG_EXTENTS,
    &spa::trim::ZILLA_TRIM_TXG_BYTES,
    &spa::trim::ZILLA_TRIM_TXG_INTERVAL_MS,
    &scan::ZFS_SCAN_PAUSE_EVERY_SPANS,
    &arc::ZFS_ARC_MAX,
    &arc::ZFS_ARC_MIN,
    &arc::ZFS_ARC_META_BALANCE,
    &arc::ZFS_ARC_MIN_PREFETCH_MS,
    &arc::ZFS_ARC_SYS_FREE,
    &l2arc::L2ARC_WRITE_MAX,
    &l2arc::L2ARC_WRITE_BOOST,
    &l2arc::L2ARC_FEED_SECS,
    &l2arc::L2ARC_NOPREFETCH,
    &l2arc::L2ARC_HEADROOM,
    &l2arc::L2ARC_MFUONLY,
    &l2arc::L2ARC_META_PERCENT,
    &l2arc::L2ARC_REBUILD_ENABLED,
    &zfetch::ZFS_PREFETCH_DISABLE,
    &zfetch::ZFETCH_MAX_DISTANCE,
    &zfetch::ZFETCH_MAX_STREAMS,
    &zfetch::ZFETCH_MIN_SEC_REAP,
    &spa::ZFS_DEBUG_FAIL_SYNC_ASSERTION,
    &spa::ZFS_MULTIHOST_INTERVAL_MS,
    &spa::ZILLA_POOL_CREATE_FORMAT,
    &pool_mos::ZFS_ASYNC_BLOCK_MAX_BLOCKS,
]);

/// The registry of every engine tunable.
pub fn tunables() -> &'static kstat::Registry {
    &TUNABLES
}

/// Feed arbitrary bytes to every decoder of on-disk structures (block pointers,
/// uberblocks, label config regions, the MOS stream, compressed payloads). Used by the
/// fuzz target `ondisk_decoders` and by a property test in the default test run; must
/// never panic.
pub fn fuzz_ondisk_decoders(data: &[u8]) {
    // (block pointers, uberblocks, config regions and their JSON, the MOS stream, log
    // blocks and ZIL headers, compressed payloads)
    use vdev::label;
    let _ = block::blkptr::BlockPointer::decode(data);
    let mut slot = vec![0u8; label::UB_SLOT_SIZE];
    let n = data.len().min(slot.len());
    slot[..n].copy_from_slice(&data[..n]);
    let _ = label::Uberblock::decode(&slot, 0);
    let mut region = vec![0u8; label::CONFIG_REGION_SIZE];
    let n = data.len().min(region.len());
    region[..n].copy_from_slice(&data[..n]);
    if let Some((_, json)) = label::decode_config(&region, 0) {
        let _ = spa::parse_label(&json);
    }
    // the config decoder and its checks over the bytes as JSON
    let _ = spa::parse_label(data);
    // the log block decoder: the bytes as a block, and behind a header of a chain that
    // verifies (resealed), so the fields and records behind it are reached
    let _ = zil::decode_lwb(data, 0, 0, 0);
    let mut lwb = vec![0u8; zil::LWB_MIN_SIZE];
    let n = data.len().min(lwb.len() - 32);
    lwb[32..32 + n].copy_from_slice(&data[..n]);
    lwb[..8].copy_from_slice(&zil::LWB_MAGIC.to_le_bytes());
    lwb[8..32].fill(0);
    if zil::reseal_lwb(&mut lwb) {
        let _ = zil::decode_lwb(&lwb, 0, 0, 0);
    }
    let _ = zil::ZilHeader::decode(&mut block::reader::Reader::new(data));
    let mut ms = metaslab::Metaslabs::new();
    ms.add_vdev(VdevId(0), vdev::Role::Normal, 1 << 30);
    ms.add_vdev(VdevId(1), vdev::Role::Normal, 1 << 30);
    // with and without a valid header, so the decoder gets past the magic
    let _ = dmu::Mos::decode(data, &mut ms);
    let mut framed = Vec::with_capacity(data.len() + 24);
    framed.extend_from_slice(&dmu::MOS_MAGIC.to_le_bytes());
    framed.extend_from_slice(&dmu::MOS_VERSION.to_le_bytes());
    framed.extend_from_slice(data);
    let mut ms2 = metaslab::Metaslabs::new();
    ms2.add_vdev(VdevId(0), vdev::Role::Normal, 1 << 30);
    let _ = dmu::Mos::decode(&framed, &mut ms2);
    for c in [block::compress::Compression::Lz4, block::compress::Compression::Zstd(3)] {
        let _ = block::compress::decompress(c, data, 16384);
    }
}

#[cfg(test)]
mod tunable_registry {
    #[test]
    fn every_tunable_once_with_a_sane_range() {
        let reg = super::tunables();
        assert!(reg.duplicate_names().is_empty(), "declared twice: {:?}", reg.duplicate_names());
        for t in reg.list() {
            assert!(t.in_range(t.default), "{}: default outside its range", t.name);
            assert!(!t.description.is_empty(), "{}: no description", t.name);
        }
        assert!(reg.get("zfs_txg_timeout").is_some());
        assert!(reg.set("no_such_tunable", 1).is_err());
        // the examples: nonsense values are refused and leave the value alone
        let e = reg.set("zfs_vdev_max_active", 0).unwrap_err().to_string();
        assert!(e.contains("out of range") && e.contains("1 to 10000"), "{e}");
        assert_eq!(reg.get("zfs_vdev_max_active"), Some(1000));
        let e = reg.set("zfs_arc_max", 4096).unwrap_err().to_string();
        assert!(e.contains("0 (auto) or 67108864"), "{e}");
    }
}

#[cfg(test)]
mod fuzz_smoke {
    use proptest::prelude::*;
    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn ondisk_decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            super::fuzz_ondisk_decoders(&data);
        }
    }
    #[test]
    fn mos_decoder_rejects_bit_flips() {
        // a real MOS with every single-byte corruption: decode must not panic
        let ms = crate::metaslab::Metaslabs::new();
        ms.add_vdev(crate::VdevId(0), crate::vdev::Role::Normal, 1 << 30);
        let mos = crate::dmu::Mos { txg: crate::Txg(9), next_volume_id: 2, volumes: vec![], scan_state: "{}".into(), pool_props: "{}".into(), leaf_health: None, zil_headers: vec![], history: Default::default() };
        let blob = mos.encode(&ms);
        for i in 0..blob.len() {
            for v in [0u8, 0xff, 0x7f] {
                let mut b = blob.clone();
                b[i] = v;
                let mut m = crate::metaslab::Metaslabs::new();
                m.add_vdev(crate::VdevId(0), crate::vdev::Role::Normal, 1 << 30);
                let _ = crate::dmu::Mos::decode(&b, &mut m);
            }
        }
    }

    /// A volume record whose tree height does not follow from its geometry is corrupt
    /// (nlevels = 8 used to be accepted and overflow EPB^7 in the walkers); and the leaf
    /// health section round-trips.
    #[test]
    fn mos_decoder_checks_tree_height_and_leaf_health() {
        let mk = |nlevels: u8| {
            let ms = crate::metaslab::Metaslabs::new();
            ms.add_vdev(crate::VdevId(0), crate::vdev::Role::Normal, 1 << 30);
            let vol = crate::dmu::VolumeRecord {
                id: 1,
                name: "v".into(),
                volsize: 64 << 20,
                volblocksize: 16384,
                root: crate::dmu::TreeRoot { bp: crate::block::blkptr::BlockPointer::hole(), nlevels },
                props: crate::props::PropSet::from_local(Default::default()),
                created_txg: crate::Txg(4),
            };
            let health = vec![crate::dmu::LeafHealth { guid: crate::Guid(77), faulted: true, dtl: vec![(crate::Txg(5), crate::Txg(9))] }];
            let mos = crate::dmu::Mos { txg: crate::Txg(9), next_volume_id: 2, volumes: vec![vol], scan_state: "{}".into(), pool_props: "{}".into(), leaf_health: Some(health), zil_headers: vec![], history: Default::default() };
            let blob = mos.encode(&ms);
            let mut m = crate::metaslab::Metaslabs::new();
            m.add_vdev(crate::VdevId(0), crate::vdev::Role::Normal, 1 << 30);
            crate::dmu::Mos::decode(&blob, &mut m)
        };
        let good = crate::dmu::levels_for((64 << 20) / 16384);
        let m = mk(good).expect("a well-formed MOS");
        assert_eq!(m.leaf_health.unwrap()[0].dtl, vec![(crate::Txg(5), crate::Txg(9))]);
        assert!(mk(8).is_err(), "nlevels 8 accepted");
        assert!(mk(good + 1).is_err(), "a tree taller than its geometry accepted");
    }
}
