//! zilla-core: the pool engine.
//!
//! Layers, bottom to top (a module only uses modules listed above it):
//!
//! ```text
//!   error, kstat          errors; counters and log2 latency histograms; tunables
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
pub mod vdev;
pub mod zio;
pub mod metaslab;
pub mod arc;
pub mod dmu;
pub mod txg;
pub mod dsl_pool;
pub mod spa;
pub mod spa_impl;
pub mod scan;
pub mod zvol;
pub mod props;
pub mod memvol;

pub use error::{Error, Result};
