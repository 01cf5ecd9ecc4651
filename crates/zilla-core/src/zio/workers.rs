//! zio workers: a small fixed pool of threads that checksum and compress blocks.
//!
//! Theory of operation
//! -------------------
//! The txg sync prepares (compresses, pads, checksums) every dirty block before it is
//! allocated. That is CPU work worth spreading over the cores, but not worth a thread
//! per chunk: a pool owns one [`PrepareWorkers`], started once when the pool opens with
//! `min(cores, 8)` threads (none on one core: the caller prepares inline), which live
//! until the pool is closed. A call splits its blocks into one slice per worker, hands
//! the slices over a bounded channel and waits for them; results keep the input order.
//!
//! ```text
//!   prepare_all(recs) ──split──► job channel (bounded) ──► worker 0..n: zio::prepare
//!        ▲                                                     │
//!        └────────────── per-call result channel ◄──────────────┘
//! ```

use crate::vdev::abd::AlignedBuf;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::block::checksum::ChecksumAlgo;
use crate::block::compress::Compression;
use super::PreparedBlock;

/// Blocks below this count are prepared on the caller's thread.
const PARALLEL_MIN_BLOCKS: usize = 64;
/// Most worker threads per pool.
const MAX_WORKERS: usize = 8;

type Job = Box<dyn FnOnce() + Send>;

/// The pool's checksum/compress workers.
pub struct PrepareWorkers {
    jobs: Option<Sender<Job>>,
    workers: usize,
}

impl PrepareWorkers {
    /// Start `min(cores, 8)` workers through the Env seam (none on a single core).
    pub fn start(env: &Arc<dyn crate::env::Env>, pool: &str) -> PrepareWorkers {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(MAX_WORKERS);
        if cores < 2 {
            return PrepareWorkers { jobs: None, workers: 0 };
        }
        let (tx, rx) = crossbeam_channel::bounded::<Job>(cores * 2);
        let mut started = 0;
        for i in 0..cores {
            let rx: Receiver<Job> = rx.clone();
            let name: String = format!("zio_cksum_{i}_{pool}").chars().take(15).collect();
            if env.spawn(name, Box::new(move || {
                lower_thread_priority();
                rx.iter().for_each(|job| job())
            })).is_ok() {
                started += 1;
            }
        }
        PrepareWorkers { jobs: (started > 0).then_some(tx), workers: started }
    }

    /// Threads this pool started.
    pub fn threads(&self) -> usize {
        self.workers
    }

    /// Prepare every record's data (None stays None: a freed block), in order.
    pub fn prepare_all(&self, recs: &[(crate::BlockId, Option<Arc<AlignedBuf>>)], algo: ChecksumAlgo, comp: Compression, unit: u64) -> Vec<Option<PreparedBlock>> {
        let one = |d: &Option<Arc<AlignedBuf>>| d.as_ref().map(|d| super::prepare(d, algo, comp, unit));
        let Some(jobs) = self.jobs.as_ref().filter(|_| recs.len() >= PARALLEL_MIN_BLOCKS) else {
            return recs.iter().map(|(_, d)| one(d)).collect();
        };
        let per = recs.len().div_ceil(self.workers);
        let (tx, rx) = crossbeam_channel::bounded(self.workers);
        let mut parts = 0;
        for (i, slice) in recs.chunks(per).enumerate() {
            let data: Vec<Option<Arc<AlignedBuf>>> = slice.iter().map(|(_, d)| d.clone()).collect();
            let tx = tx.clone();
            let job: Job = Box::new(move || {
                let out: Vec<_> = data.iter().map(|d| d.as_ref().map(|d| super::prepare(d, algo, comp, unit))).collect();
                let _ = tx.send((i, out));
            });
            if jobs.send(job).is_err() {
                return recs.iter().map(|(_, d)| one(d)).collect();
            }
            parts += 1;
        }
        drop(tx);
        let mut results: Vec<(usize, Vec<Option<PreparedBlock>>)> = rx.iter().take(parts).collect();
        assert_eq!(results.len(), parts, "a checksum worker died");
        results.sort_by_key(|r| r.0);
        results.into_iter().flat_map(|r| r.1).collect()
    }
}

/// Nice value of the threads that do a txg sync's bulk work (the sync thread and the
/// checksum/compression workers): on a box whose cores the front ends and clients
/// share, the background must not delay the latency paths (a QD1 sync write, a cold
/// read) when both want a core; the throttle, not CPU priority, keeps the sync
/// abreast of the writers.
pub static ZILLA_BACKGROUND_NICE: crate::kstat::Tunable = crate::kstat::Tunable::new(
    "zilla_background_nice",
    5,
    0,
    19,
    crate::kstat::Applies::NextPoolOpen,
    "nice value of the txg sync thread and its checksum/compression workers (Zilla); 0 = as the front ends",
);

/// Lower the calling thread's CPU priority to `zilla_background_nice` (Linux nice
/// values are per thread). Best effort: a failure leaves it as it was.
pub fn lower_thread_priority() {
    let nice = ZILLA_BACKGROUND_NICE.get() as i32;
    if nice > 0 {
        let _ = rustix::process::setpriority_process(None, nice);
    }
}
