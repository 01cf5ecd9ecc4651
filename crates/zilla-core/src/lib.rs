//! zilla-core: the pool engine.
//!
//! Layers, bottom to top (a module only uses modules listed above it):
//!
//! ```text
//!   error, kstat, env     errors; counters and log2 latency histograms; tunables;
//!                         clock, sleeps, thread spawns, randomness (real or simulated)
//!   vdev                  leaves (file, sim-hdd, sim-ssd, crash, fault), per-leaf queue,
//!                         mirror, labels
//!   zio                   checksums, compression, block pointers
//!   metaslab              space allocation per top-level vdev, deferred frees
//!   arc                   DRAM block cache keyed by block identity
//!   dmu                   object directory, volume block-pointer trees, dirty records
//!   txg, dsl_pool         transaction groups, dirty accounting, write throttle
//!   spa                   the pool: create/import/export, sync, uberblocks
//!   scan                  scrub and resilver
//!   zvol                  the Volume API the front ends use
//! ```
//!
//! No sockets, no HTTP, no async runtime here: front ends live in their own crates.

pub mod error;
pub mod kstat;
pub mod env;
pub mod vdev;
pub mod zio;
pub mod metaslab;
pub mod arc;
pub mod dmu;
pub mod txg;
pub mod dsl_pool;
pub mod spa;
pub mod scan;
pub mod zvol;
pub mod props;
pub mod memvol;

pub use error::{Error, Result};

/// Feed arbitrary bytes to every decoder of on-disk structures (block pointers,
/// uberblocks, label config regions, the MOS stream, compressed payloads). Used by the
/// fuzz target `ondisk_decoders` and by a property test in the default test run; must
/// never panic.
pub fn fuzz_ondisk_decoders(data: &[u8]) {
    use vdev::label;
    let _ = zio::blkptr::BlockPointer::decode(data);
    let mut slot = vec![0u8; label::UB_SLOT_SIZE];
    let n = data.len().min(slot.len());
    slot[..n].copy_from_slice(&data[..n]);
    let _ = label::Uberblock::decode(&slot, 0);
    let mut region = vec![0u8; label::CONFIG_REGION_SIZE];
    let n = data.len().min(region.len());
    region[..n].copy_from_slice(&data[..n]);
    if let Some((_, json)) = label::decode_config(&region, 0) {
        let _ = serde_json::from_slice::<spa::LabelJson>(&json);
    }
    let mut ms = metaslab::Metaslabs::new();
    ms.add_vdev(0, vdev::Role::Normal, 1 << 30);
    ms.add_vdev(1, vdev::Role::Normal, 1 << 30);
    // with and without a valid header, so the decoder gets past the magic
    let _ = dmu::Mos::decode(data, &mut ms);
    let mut framed = Vec::with_capacity(data.len() + 24);
    framed.extend_from_slice(&dmu::MOS_MAGIC.to_le_bytes());
    framed.extend_from_slice(&dmu::MOS_VERSION.to_le_bytes());
    framed.extend_from_slice(data);
    let mut ms2 = metaslab::Metaslabs::new();
    ms2.add_vdev(0, vdev::Role::Normal, 1 << 30);
    let _ = dmu::Mos::decode(&framed, &mut ms2);
    for c in [zio::compress::Compression::Lz4, zio::compress::Compression::Zstd(3)] {
        let _ = zio::compress::decompress(c, data, 16384);
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
        let mut ms = crate::metaslab::Metaslabs::new();
        ms.add_vdev(0, crate::vdev::Role::Normal, 1 << 30);
        let mos = crate::dmu::Mos { txg: 9, next_volume_id: 2, volumes: vec![], scan_state: "{}".into(), pool_props: "{}".into() };
        let blob = mos.encode(&ms);
        for i in 0..blob.len() {
            for v in [0u8, 0xff, 0x7f] {
                let mut b = blob.clone();
                b[i] = v;
                let mut m = crate::metaslab::Metaslabs::new();
                m.add_vdev(0, crate::vdev::Role::Normal, 1 << 30);
                let _ = crate::dmu::Mos::decode(&b, &mut m);
            }
        }
    }
}
