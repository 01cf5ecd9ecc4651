//! Per-leaf I/O queue: the scheduler seam (OpenZFS vdev_queue.c).
//!
//! Theory of operation
//! -------------------
//! Every I/O to a leaf is tagged with an [`IoClass`] and must be *admitted* before it
//! reaches the device. Admission bounds concurrency per class and per leaf, which is
//! what keeps sync reads and ZIL writes fast while txg sync and scrub push bulk I/O:
//!
//! | class       | min_active | max_active |
//! |-------------|-----------:|-----------:|
//! | sync read   | 10         | 10         |
//! | sync write  | 10         | 10         |
//! | async read  | 1          | 3          |
//! | async write | 2          | 10         |
//! | scrub       | 1          | 3          |
//!
//! plus `zfs_vdev_max_active = 1000` active I/Os per leaf in total (OpenZFS defaults,
//! tunables `zfs_vdev_<class>_{min,max}_active`, read live on every selection).
//!
//! Selection runs on every enqueue and every completion, under one mutex:
//!
//! ```text
//!   while total_active < max_active_total:
//!     pass 1: first class in priority order with waiters and active < min_active
//!     pass 2: else first class in priority order with waiters and active < max_active
//!     none  -> stop
//!     grant the oldest waiter of that class (FIFO within a class)
//! ```
//!
//! (Pass 1 runs in priority order like OpenZFS <= 2.0; 2.1+ rotates its start.)
//! A waiter holds a per-class ticket; "granted" is just `granted[class] > ticket`, so no
//! per-waiter allocation is needed. The caller's own thread performs the I/O after
//! admission (no thread hop), then releases its slot, which re-runs selection and wakes
//! the granted waiters' class condvars.
//!
//! Not modelled (yet): sorted (LBA + time bucket) order inside async classes,
//! aggregation, dynamic async-write max_active, non-interactive (scrub) credit.
//!
//! Statistics are plain atomics (ops, bytes, errors, total and device latency log2
//! histograms per class, flushes); recording them never takes the queue lock.
//! Waiters are bounded by the callers' threads: the queue holds no buffers itself.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::{Device, IoClass};
use crate::kstat::{Applies, Histogram, Tunable};

const CLASSES: usize = IoClass::ALL.len();

pub static ZFS_VDEV_SYNC_READ_MIN_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_sync_read_min_active", 10, 1, 1000, Applies::Live, "sync read I/Os always admitted per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_SYNC_READ_MAX_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_sync_read_max_active", 10, 1, 1000, Applies::Live, "max active sync read I/Os per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_SYNC_WRITE_MIN_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_sync_write_min_active", 10, 1, 1000, Applies::Live, "sync write (ZIL) I/Os always admitted per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_SYNC_WRITE_MAX_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_sync_write_max_active", 10, 1, 1000, Applies::Live, "max active sync write I/Os per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_ASYNC_READ_MIN_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_async_read_min_active", 1, 1, 1000, Applies::Live, "async read (prefetch) I/Os always admitted per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_ASYNC_READ_MAX_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_async_read_max_active", 3, 1, 1000, Applies::Live, "max active async read I/Os per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_ASYNC_WRITE_MIN_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_async_write_min_active", 2, 1, 1000, Applies::Live, "async write (txg sync) I/Os always admitted per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_ASYNC_WRITE_MAX_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_async_write_max_active", 10, 1, 1000, Applies::Live, "max active async write I/Os per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_SCRUB_MIN_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_scrub_min_active", 1, 1, 1000, Applies::Live, "scrub/resilver I/Os always admitted per leaf (vdev_queue.c default)");
pub static ZFS_VDEV_SCRUB_MAX_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_scrub_max_active", 3, 1, 1000, Applies::Live, "max active scrub/resilver I/Os per leaf (vdev_queue.c code default; man page says 2)");
pub static ZFS_VDEV_MAX_ACTIVE: Tunable =
    Tunable::new("zfs_vdev_max_active", 1000, 1, 10000, Applies::Live, "max active I/Os per leaf, all classes (vdev_queue.c default)");

/// Per class (IoClass as usize): the `zfs_vdev_<class>_min_active` tunables.
pub static MIN_ACTIVE: [&Tunable; CLASSES] = [
    &ZFS_VDEV_SYNC_READ_MIN_ACTIVE,
    &ZFS_VDEV_SYNC_WRITE_MIN_ACTIVE,
    &ZFS_VDEV_ASYNC_READ_MIN_ACTIVE,
    &ZFS_VDEV_ASYNC_WRITE_MIN_ACTIVE,
    &ZFS_VDEV_SCRUB_MIN_ACTIVE,
];
/// Per class: the `zfs_vdev_<class>_max_active` tunables.
pub static MAX_ACTIVE: [&Tunable; CLASSES] = [
    &ZFS_VDEV_SYNC_READ_MAX_ACTIVE,
    &ZFS_VDEV_SYNC_WRITE_MAX_ACTIVE,
    &ZFS_VDEV_ASYNC_READ_MAX_ACTIVE,
    &ZFS_VDEV_ASYNC_WRITE_MAX_ACTIVE,
    &ZFS_VDEV_SCRUB_MAX_ACTIVE,
];

/// Snapshot of one leaf's statistics (cumulative since open).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LeafStats {
    /// Operations and bytes, indexed by IoClass as usize.
    pub ops: [u64; 5],
    pub bytes: [u64; 5],
    pub flushes: u64,
    /// Per class: total latency (queue + device) log2 histogram, zpool iostat -w buckets.
    pub total_latency_hist: Vec<Vec<u64>>,
    /// Per class: device service time log2 histogram.
    pub disk_latency_hist: Vec<Vec<u64>>,
    /// Per class: currently queued (waiting) and active (issued) I/Os.
    pub queued: [u32; 5],
    pub active: [u32; 5],
    /// Per class: I/Os the device failed (not counted in ops/bytes).
    #[serde(default)]
    pub errors: [u64; 5],
    /// Flush latency log2 histogram (ns).
    #[serde(default)]
    pub flush_latency_hist: Vec<u64>,
}

/// Admission limits of one leaf queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Per class (IoClass as usize): I/Os admitted ahead of higher-priority classes.
    pub min_active: [u32; CLASSES],
    /// Per class: most active I/Os.
    pub max_active: [u32; CLASSES],
    /// Most active I/Os on the leaf, all classes.
    pub max_active_total: u32,
}

impl QueueLimits {
    /// Current values of the `zfs_vdev_*_active` tunables.
    pub fn from_tunables() -> QueueLimits {
        let get = |t: &Tunable| t.get().min(u32::MAX as u64) as u32;
        QueueLimits {
            min_active: MIN_ACTIVE.map(get),
            max_active: MAX_ACTIVE.map(get),
            max_active_total: get(&ZFS_VDEV_MAX_ACTIVE),
        }
    }

    /// Clamp nonsense settings so every class can make progress: max >= 1, min <= max.
    fn sane(mut self) -> QueueLimits {
        self.max_active_total = self.max_active_total.max(1);
        for c in 0..CLASSES {
            self.max_active[c] = self.max_active[c].max(1);
            self.min_active[c] = self.min_active[c].min(self.max_active[c]);
        }
        self
    }
}

/// Where the limits come from: the live tunables (default) or fixed values (tests).
enum LimitSource {
    Tunables,
    Fixed(QueueLimits),
}

impl LimitSource {
    fn current(&self) -> QueueLimits {
        match self {
            LimitSource::Tunables => QueueLimits::from_tunables(),
            LimitSource::Fixed(l) => *l,
        }
        .sane()
    }
}

/// Admission state, guarded by `LeafQueue::state`.
#[derive(Default)]
struct Admission {
    /// Per class: tickets handed out (next waiter's ticket).
    enqueued: [u64; CLASSES],
    /// Per class: tickets granted; waiter `t` may run once `granted > t`.
    granted: [u64; CLASSES],
    active: [u32; CLASSES],
    active_total: u32,
}

impl Admission {
    fn waiting(&self, c: usize) -> u64 {
        self.enqueued[c] - self.granted[c]
    }

    /// Grant free slots (see the module essay). Returns a bitmask of classes granted.
    fn select(&mut self, limits: &QueueLimits) -> u32 {
        let mut woken = 0u32;
        while self.active_total < limits.max_active_total {
            let below = |s: &Self, c: usize, cap: &[u32; CLASSES]| s.waiting(c) > 0 && s.active[c] < cap[c];
            let pick = (0..CLASSES)
                .find(|&c| below(self, c, &limits.min_active))
                .or_else(|| (0..CLASSES).find(|&c| below(self, c, &limits.max_active)));
            let Some(c) = pick else { break };
            self.granted[c] += 1;
            self.active[c] += 1;
            self.active_total += 1;
            woken |= 1 << c;
        }
        woken
    }
}

struct ClassStats {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    total_latency: Histogram,
    disk_latency: Histogram,
}

/// One leaf's queue: admission by class, then the caller performs the I/O.
pub struct LeafQueue {
    dev: Arc<dyn Device>,
    limits: LimitSource,
    state: Mutex<Admission>,
    /// One condvar per class so a grant wakes only that class's waiters.
    wakeups: [Condvar; CLASSES],
    /// Queued + active I/Os (mirror read selection reads this without the lock).
    pending: AtomicU32,
    /// End offset of the last admitted I/O.
    last_offset: AtomicU64,
    stats: [ClassStats; CLASSES],
    flushes: AtomicU64,
    flush_latency: Histogram,
}

/// Releases an admitted slot when the I/O finishes, even if the device panics.
struct Slot<'a> {
    queue: &'a LeafQueue,
    class: usize,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let q = self.queue;
        let limits = q.limits.current();
        let woken = {
            let mut st = q.state.lock();
            assert!(st.active[self.class] > 0 && st.active_total > 0, "slot released twice");
            st.active[self.class] -= 1;
            st.active_total -= 1;
            st.select(&limits)
        };
        q.pending.fetch_sub(1, Ordering::Relaxed);
        q.wake(woken);
    }
}

impl LeafQueue {
    /// A queue whose limits follow the `zfs_vdev_*_active` tunables live.
    pub fn new(dev: Arc<dyn Device>) -> LeafQueue {
        Self::build(dev, LimitSource::Tunables)
    }

    /// A queue with fixed limits, independent of the tunables (tests, experiments).
    pub fn with_limits(dev: Arc<dyn Device>, limits: QueueLimits) -> LeafQueue {
        Self::build(dev, LimitSource::Fixed(limits))
    }

    fn build(dev: Arc<dyn Device>, limits: LimitSource) -> LeafQueue {
        LeafQueue {
            dev,
            limits,
            state: Mutex::new(Admission::default()),
            wakeups: std::array::from_fn(|_| Condvar::new()),
            pending: AtomicU32::new(0),
            last_offset: AtomicU64::new(0),
            stats: std::array::from_fn(|_| ClassStats {
                ops: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                total_latency: Histogram::default(),
                disk_latency: Histogram::default(),
            }),
            flushes: AtomicU64::new(0),
            flush_latency: Histogram::default(),
        }
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// Blocking read through the queue in class `class`.
    pub fn read(&self, class: IoClass, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let len = buf.len();
        self.issue(class, len, offset, || self.dev.read_at(buf, offset))
    }

    /// Blocking write through the queue in class `class`.
    pub fn write(&self, class: IoClass, buf: &[u8], offset: u64) -> io::Result<()> {
        self.issue(class, buf.len(), offset, || self.dev.write_at(buf, offset))
    }

    /// Flush the device's write cache. Flushes bypass admission (as ZFS's ioctl zios do).
    pub fn flush(&self) -> io::Result<()> {
        let start = Instant::now();
        let result = self.dev.flush();
        self.flush_latency.record(start.elapsed().as_nanos() as u64);
        if result.is_ok() {
            self.flushes.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Queued + active I/Os right now (mirror read selection load).
    pub fn pending(&self) -> u32 {
        self.pending.load(Ordering::Relaxed)
    }

    /// End offset of the last issued I/O (mirror locality).
    pub fn last_offset(&self) -> u64 {
        self.last_offset.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> LeafStats {
        let (queued, active) = {
            let st = self.state.lock();
            (
                std::array::from_fn(|c| st.waiting(c) as u32),
                st.active,
            )
        };
        let load = |f: fn(&ClassStats) -> &AtomicU64| std::array::from_fn(|c| f(&self.stats[c]).load(Ordering::Relaxed));
        LeafStats {
            ops: load(|s| &s.ops),
            bytes: load(|s| &s.bytes),
            errors: load(|s| &s.errors),
            flushes: self.flushes.load(Ordering::Relaxed),
            total_latency_hist: self.stats.iter().map(|s| s.total_latency.snapshot()).collect(),
            disk_latency_hist: self.stats.iter().map(|s| s.disk_latency.snapshot()).collect(),
            queued,
            active,
            flush_latency_hist: self.flush_latency.snapshot(),
        }
    }

    /// Admit, perform `io` on the caller's thread, release, record statistics.
    fn issue(&self, class: IoClass, len: usize, offset: u64, io: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let queued_at = Instant::now();
        let slot = self.admit(class as usize);
        self.last_offset.store(offset.saturating_add(len as u64), Ordering::Relaxed);
        let issued_at = Instant::now();
        let result = io();
        let done_at = Instant::now();
        drop(slot);
        let s = &self.stats[class as usize];
        if result.is_ok() {
            s.ops.fetch_add(1, Ordering::Relaxed);
            s.bytes.fetch_add(len as u64, Ordering::Relaxed);
        } else {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.disk_latency.record((done_at - issued_at).as_nanos() as u64);
        s.total_latency.record((done_at - queued_at).as_nanos() as u64);
        result
    }

    /// Block until class `c` has a slot for this caller.
    fn admit(&self, c: usize) -> Slot<'_> {
        let limits = self.limits.current();
        self.pending.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state.lock();
        let ticket = st.enqueued[c];
        st.enqueued[c] += 1;
        let woken = st.select(&limits);
        // Our enqueue may have granted others too (e.g. after a tunable was raised).
        self.wake(woken);
        while st.granted[c] <= ticket {
            self.wakeups[c].wait(&mut st);
        }
        Slot { queue: self, class: c }
    }

    fn wake(&self, woken: u32) {
        for c in 0..CLASSES {
            if woken & (1 << c) != 0 {
                self.wakeups[c].notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::fault::MemDevice;
    use std::time::Duration;

    /// Counts concurrent calls per offset band (offset / 1 MiB selects the class slot)
    /// and optionally blocks every I/O until the gate opens.
    struct ProbeDevice {
        inner: MemDevice,
        now: [AtomicU32; CLASSES + 1],
        peak: [AtomicU32; CLASSES + 1],
        hold: Duration,
        gate: Mutex<bool>,
        gate_cv: Condvar,
        order: Mutex<Vec<usize>>,
    }

    const BAND: u64 = 1 << 20;
    const ALL_BAND: usize = CLASSES;

    impl ProbeDevice {
        fn new(hold: Duration, gate_open: bool) -> ProbeDevice {
            ProbeDevice {
                inner: MemDevice::new(8 << 20),
                now: std::array::from_fn(|_| AtomicU32::new(0)),
                peak: std::array::from_fn(|_| AtomicU32::new(0)),
                hold,
                gate: Mutex::new(gate_open),
                gate_cv: Condvar::new(),
                order: Mutex::new(Vec::new()),
            }
        }
        fn open_gate(&self) {
            *self.gate.lock() = true;
            self.gate_cv.notify_all();
        }
        fn enter(&self, offset: u64) -> usize {
            let band = (offset / BAND) as usize;
            for i in [band, ALL_BAND] {
                let n = self.now[i].fetch_add(1, Ordering::SeqCst) + 1;
                self.peak[i].fetch_max(n, Ordering::SeqCst);
            }
            self.order.lock().push(band);
            let mut g = self.gate.lock();
            while !*g {
                self.gate_cv.wait(&mut g);
            }
            drop(g);
            std::thread::sleep(self.hold);
            band
        }
        fn leave(&self, band: usize) {
            self.now[band].fetch_sub(1, Ordering::SeqCst);
            self.now[ALL_BAND].fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Device for ProbeDevice {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let b = self.enter(offset);
            let r = self.inner.read_at(buf, offset);
            self.leave(b);
            r
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            let b = self.enter(offset);
            let r = self.inner.write_at(buf, offset);
            self.leave(b);
            r
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn rotational(&self) -> bool {
            false
        }
        fn kind(&self) -> String {
            "probe".into()
        }
    }

    fn run(q: &Arc<LeafQueue>, class: IoClass) -> std::thread::JoinHandle<()> {
        let q = q.clone();
        std::thread::spawn(move || {
            let off = class as u64 * BAND;
            if class.is_read() {
                q.read(class, &mut [0u8; 512], off).unwrap();
            } else {
                q.write(class, &[1u8; 512], off).unwrap();
            }
        })
    }

    #[test]
    fn admission_respects_max_active() {
        // Goal: no class exceeds its max_active and the leaf never exceeds the total.
        // Method: 24 threads per class against a device that holds each I/O 5 ms and
        // records peak concurrency per class; default limits, then total capped at 12.
        for total in [1000u32, 12] {
            let limits = QueueLimits {
                min_active: [10, 10, 1, 2, 1],
                max_active: [10, 10, 3, 10, 3],
                max_active_total: total,
            };
            let dev = Arc::new(ProbeDevice::new(Duration::from_millis(5), true));
            let q = Arc::new(LeafQueue::with_limits(dev.clone(), limits));
            let handles: Vec<_> =
                IoClass::ALL.iter().flat_map(|&c| (0..24).map(move |_| c)).map(|c| run(&q, c)).collect();
            handles.into_iter().for_each(|h| h.join().unwrap());
            for c in 0..CLASSES {
                let peak = dev.peak[c].load(Ordering::SeqCst);
                assert!(peak <= limits.max_active[c], "class {c} peak {peak}");
                assert!(peak >= 1);
            }
            let peak_all = dev.peak[ALL_BAND].load(Ordering::SeqCst);
            assert!(peak_all <= total, "total peak {peak_all} > {total}");
            assert_eq!(q.pending(), 0);
            let st = q.stats();
            assert_eq!(st.ops, [24; 5]);
            assert_eq!(st.active, [0; 5]);
            assert_eq!(st.queued, [0; 5]);
        }
        // Sync reads really do run 10 at a time with the default limits.
        let dev = Arc::new(ProbeDevice::new(Duration::from_millis(20), true));
        let q = Arc::new(LeafQueue::new(dev.clone()));
        let hs: Vec<_> = (0..20).map(|_| run(&q, IoClass::SyncRead)).collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(dev.peak[0].load(Ordering::SeqCst), 10);
    }

    #[test]
    fn waiting_ios_are_served_in_priority_order() {
        // Goal: with one slot, waiters are granted sync read, sync write, async read,
        // async write, scrub, whatever order they arrived in.
        // Method: a scrub I/O holds the only slot behind a closed gate; enqueue one I/O
        // per class in reverse priority order; open the gate and read the issue order.
        let limits = QueueLimits { min_active: [1; 5], max_active: [1; 5], max_active_total: 1 };
        let dev = Arc::new(ProbeDevice::new(Duration::ZERO, false));
        let q = Arc::new(LeafQueue::with_limits(dev.clone(), limits));
        let mut handles = vec![run(&q, IoClass::Scrub)];
        while dev.order.lock().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        for (i, &c) in IoClass::ALL.iter().rev().enumerate() {
            handles.push(run(&q, c));
            while q.pending() < i as u32 + 2 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(q.stats().queued, [1; 5]);
        dev.open_gate();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(*dev.order.lock(), vec![4, 0, 1, 2, 3, 4]);
    }

    #[test]
    fn min_active_goes_first() {
        // Goal: a class below its min_active beats a higher-priority class that is
        // merely below its max_active; then priority order decides.
        // Method: drive the selection state machine directly (deterministic): total 2,
        // sync read has one active I/O and one waiter, async write has one waiter.
        let limits = QueueLimits { min_active: [1; 5], max_active: [5; 5], max_active_total: 2 };
        let mut st = Admission::default();
        st.enqueued[0] = 2;
        st.granted[0] = 1;
        st.active[0] = 1;
        st.active_total = 1;
        st.enqueued[3] = 1;
        assert_eq!(st.select(&limits), 1 << 3, "async write is below min_active");
        assert_eq!(st.select(&limits), 0, "leaf is full");
        st.active[0] -= 1;
        st.active_total -= 1;
        assert_eq!(st.select(&limits), 1 << 0, "then the sync read");
        assert_eq!((st.waiting(0), st.waiting(3), st.active_total), (0, 0, 2));
    }

    #[test]
    fn stats_add_up() {
        // Goal: ops, bytes, errors, histograms and flushes account for every call.
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(1 << 20));
        let q = LeafQueue::new(dev);
        for (i, &c) in IoClass::ALL.iter().enumerate() {
            for k in 0..(i + 1) {
                let off = (k * 4096) as u64;
                if c.is_read() {
                    q.read(c, &mut vec![0u8; 4096], off).unwrap();
                } else {
                    q.write(c, &vec![1u8; 8192], off).unwrap();
                }
            }
        }
        assert!(q.write(IoClass::AsyncWrite, &[0u8; 512], 1 << 20).is_err());
        q.flush().unwrap();
        q.flush().unwrap();
        assert_eq!(q.last_offset(), (1 << 20) + 512);
        let st = q.stats();
        assert_eq!(st.ops, [1, 2, 3, 4, 5]);
        assert_eq!(st.bytes, [4096, 2 * 8192, 3 * 4096, 4 * 8192, 5 * 4096]);
        assert_eq!(st.errors, [0, 0, 0, 1, 0]);
        assert_eq!(st.flushes, 2);
        assert_eq!(st.flush_latency_hist.iter().sum::<u64>(), 2);
        for c in 0..CLASSES {
            let ios = st.ops[c] + st.errors[c];
            assert_eq!(st.total_latency_hist[c].iter().sum::<u64>(), ios);
            assert_eq!(st.disk_latency_hist[c].iter().sum::<u64>(), ios);
        }
        assert_eq!(q.pending(), 0);
    }
}
