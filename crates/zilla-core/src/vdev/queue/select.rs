//! select: which queued request a leaf issues next (OpenZFS vdev_queue_class_to_issue,
//! vdev_queue_io_to_issue, vdev_queue_max_async_writes, the non-interactive credit).
//!
//! Theory of operation
//! -------------------
//! The queued requests of a leaf live in one table keyed by a queue id, indexed twice:
//! per class (the order the class issues in) and per type (reads and writes in offset
//! order, where aggregation looks for neighbours, see [`super::aggregate`]).
//!
//! Class order. Sync read, sync write and trim are FIFO. Async read, async write and
//! scrub are *sorted*: keyed (enqueue time >> 29, offset), so within one ~0.54 s bucket
//! of enqueue time the class is an elevator: it issues the first request at or after
//! the end of the last issued I/O, else the lowest offset of the oldest bucket. A
//! request from an older bucket always goes before any newer one: that is the
//! starvation bound (a request waits at most about one bucket behind newer ones,
//! plus the queue ahead of it).
//!
//! Class choice, while the leaf has fewer than `zfs_vdev_max_active` active:
//!
//! ```text
//!   pass 1: starting after the class issued last, round robin over the classes;
//!           the first with queued requests and active < min_active(class)
//!   pass 2: else in priority order, the first with queued requests and
//!           active < max_active(class)
//! ```
//!
//! The rotating start (OpenZFS 2.1+) keeps a class that a lower `zfs_vdev_max_active`
//! or the non-interactive credit holds back from starving the classes after it.
//!
//! Async writes: max_active follows the pool's dirty data ([`async_write_max_active`]):
//! min_active below `zfs_vdev_async_write_active_min_dirty_percent` of
//! `zfs_dirty_data_max`, max_active above `..._max_dirty_percent`, linear between.
//!
//! Scrub is *non-interactive*. `ia_active` counts the other classes' active I/Os and
//! `nia_credit` the scrub I/Os allowed: while interactive I/O is active, scrub may have
//! at most min(credit, min_active) active; the credit is 1 when the first interactive
//! I/O starts, each scrub issue spends one, and each interactive completion that
//! leaves others active refills it to `zfs_vdev_nia_credit`. When the last interactive
//! I/O completes the credit is 0 and grows by one per scrub completion; scrub stays at
//! max(1, min_active) until it reaches `zfs_vdev_nia_delay` (the leaf is idle), then
//! may use its max_active.
//!
//! `zfs_vdev_scheduler_mode=1` (legacy, a Zilla tunable) is the queue before all this:
//! FIFO in every class, pass 1 in priority order, no aggregation, no credit, and async
//! writes at a fixed `zfs_vdev_async_write_max_active` (10) whatever the dirty data.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::{IoOp, Queued, CLASSES};
use crate::vdev::IoClass;

/// log2 of the time bucket of sorted classes in ns (2^29 ns = 0.54 s; VDQ_T_SHIFT).
pub const TIME_BUCKET_SHIFT: u32 = 29;

/// Which scheduler a leaf runs (`zfs_vdev_scheduler_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerMode {
    /// OpenZFS 2.2: round robin, sorted async classes, aggregation, dirty ramp, credit.
    OpenZfs,
    /// FIFO per class, priority-order pass 1, no aggregation, fixed async write max.
    Legacy,
}

/// Admission limits and scheduler parameters of one leaf queue, read on every selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Per class (IoClass as usize): I/Os admitted ahead of higher-priority classes.
    pub min_active: [u32; CLASSES],
    /// Per class: most active I/Os (async write: already the dirty-data ramp's value).
    pub max_active: [u32; CLASSES],
    /// Most active I/Os on the leaf, all classes.
    pub max_active_total: u32,
    pub mode: SchedulerMode,
    /// Largest aggregate in bytes (already chosen for rotating or not); 0 = none.
    pub aggregation_limit_bytes: u64,
    /// Largest hole between two reads that one aggregate may read through.
    pub read_gap_limit_bytes: u64,
    /// Scrub I/Os allowed between interactive completions (`zfs_vdev_nia_credit`).
    pub nia_credit: u32,
    /// Scrub completions with no interactive I/O before scrub may use its max_active.
    pub nia_delay: u32,
}

impl QueueLimits {
    /// Limits with the given per-class bounds and every other parameter at its OpenZFS
    /// default for a non-rotating leaf (tests, experiments).
    pub fn with_active(min_active: [u32; CLASSES], max_active: [u32; CLASSES], max_active_total: u32) -> QueueLimits {
        QueueLimits {
            min_active,
            max_active,
            max_active_total,
            mode: SchedulerMode::OpenZfs,
            aggregation_limit_bytes: 128 << 10,
            read_gap_limit_bytes: 32 << 10,
            nia_credit: 5,
            nia_delay: 5,
        }
    }

    /// Clamp nonsense settings so every class can make progress: max >= 1, min <= max.
    pub(super) fn sane(mut self) -> QueueLimits {
        self.max_active_total = self.max_active_total.max(1);
        for c in 0..CLASSES {
            self.max_active[c] = self.max_active[c].max(1);
            self.min_active[c] = self.min_active[c].min(self.max_active[c]);
        }
        self
    }
}

/// Async write max_active for `dirty` bytes of `dirty_max` (vdev_queue_max_async_writes):
/// `min_active` below `min_pct` % of max, `max_active` above `max_pct` %, linear between
/// (integer arithmetic, rounding down).
pub fn async_write_max_active(dirty: u64, dirty_max: u64, min_active: u32, max_active: u32, min_pct: u64, max_pct: u64) -> u32 {
    let lo = (dirty_max as u128 * min_pct as u128 / 100) as u64;
    let hi = (dirty_max as u128 * max_pct as u128 / 100) as u64;
    let max_active = max_active.max(min_active);
    if dirty > hi {
        return max_active;
    }
    if dirty < lo || hi <= lo {
        return min_active;
    }
    let step = (dirty - lo) as u128 * (max_active - min_active) as u128 / (hi - lo) as u128;
    min_active + step as u32
}

/// Sync read, sync write and trim issue in arrival order; the others by offset.
pub fn class_is_fifo(class: IoClass) -> bool {
    matches!(class, IoClass::SyncRead | IoClass::SyncWrite | IoClass::Trim)
}

/// Position of a queued request in its class index: (time bucket, offset, id) for
/// sorted classes, (0, 0, id) for FIFO ones (ids grow with arrival).
pub(super) type ClassKey = (u64, u64, u64);

/// Selection state, guarded by the queue lock.
#[derive(Default)]
pub(crate) struct QueueState {
    /// Queued requests by queue id.
    pub(super) queued: HashMap<u64, Queued>,
    /// Per class: its queued requests in issue order.
    pub(super) class_index: [BTreeSet<ClassKey>; CLASSES],
    /// Queued reads and writes by (offset, id): where aggregation finds neighbours.
    pub(super) read_tree: BTreeSet<(u64, u64)>,
    pub(super) write_tree: BTreeSet<(u64, u64)>,
    pub(super) flushes: VecDeque<Queued>,
    pub(super) active: [u32; CLASSES],
    pub(super) active_flushes: u32,
    pub(super) active_total: u32,
    /// Sequence numbers of writes submitted and not yet completed.
    pub(super) outstanding_writes: BTreeSet<u64>,
    pub(super) next_seq: u64,
    next_id: u64,
    /// Class issued last (start of the next pass-1 round robin).
    last_class: usize,
    /// End offset of the last issued I/O (the elevator's position).
    pub(super) last_offset: u64,
    /// Active interactive (non-scrub) I/Os, and the scrub credit (see module comment).
    ia_active: u32,
    nia_credit: u32,
    /// Worker engine: threads started, threads waiting for work.
    pub(super) workers: u32,
    pub(super) idle_workers: u32,
    pub(super) shutdown: bool,
    /// Tests: hold every request queued (to build a known queue on a live engine).
    #[cfg(test)]
    pub(super) paused: bool,
}

impl QueueState {
    /// Queue `q` (not a flush) at `now_ns` (any monotonic clock of this leaf).
    pub(super) fn push(&mut self, mut q: Queued, mode: SchedulerMode, now_ns: u64) {
        self.next_id += 1;
        let id = self.next_id;
        let class = q.req.class;
        q.key = if class_is_fifo(class) || mode == SchedulerMode::Legacy {
            (0, 0, id)
        } else {
            (now_ns >> TIME_BUCKET_SHIFT, q.req.offset, id)
        };
        self.class_index[class as usize].insert(q.key);
        match q.req.op {
            IoOp::Read => self.read_tree.insert((q.req.offset, id)),
            IoOp::Write => self.write_tree.insert((q.req.offset, id)),
            _ => false,
        };
        self.queued.insert(id, q);
    }

    /// Take queued request `id` out of every index.
    pub(super) fn remove(&mut self, id: u64) -> Queued {
        let q = self.queued.remove(&id).expect("queued request indexed but missing");
        self.class_index[q.req.class as usize].remove(&q.key);
        match q.req.op {
            IoOp::Read => self.read_tree.remove(&(q.req.offset, id)),
            IoOp::Write => self.write_tree.remove(&(q.req.offset, id)),
            _ => false,
        };
        q
    }

    pub(super) fn queued_count(&self) -> usize {
        self.queued.len() + self.flushes.len()
    }

    /// Most active I/Os `class` may have now (the scrub credit applies in OpenZFS mode).
    fn class_max(&self, c: usize, l: &QueueLimits) -> u32 {
        if c != IoClass::Scrub as usize || l.mode == SchedulerMode::Legacy {
            l.max_active[c]
        } else if self.ia_active > 0 {
            self.nia_credit.min(l.min_active[c])
        } else if self.nia_credit < l.nia_delay {
            l.min_active[c].max(1)
        } else {
            l.max_active[c]
        }
    }

    fn class_min(&self, c: usize, l: &QueueLimits) -> u32 {
        if c == IoClass::Scrub as usize && l.mode == SchedulerMode::OpenZfs && self.ia_active > 0 {
            self.nia_credit.min(l.min_active[c])
        } else {
            l.min_active[c]
        }
    }

    /// The class to issue from next, or None (module comment: pass 1, pass 2).
    pub(super) fn class_to_issue(&mut self, l: &QueueLimits) -> Option<usize> {
        if self.queued.is_empty() || self.active_total >= l.max_active_total {
            return None;
        }
        let has = |st: &Self, c: usize| !st.class_index[c].is_empty();
        let start = match l.mode {
            SchedulerMode::OpenZfs => (self.last_class + 1) % CLASSES,
            SchedulerMode::Legacy => 0,
        };
        let pass1 = (0..CLASSES).map(|i| (start + i) % CLASSES).find(|&c| has(self, c) && self.active[c] < self.class_min(c, l));
        let found = pass1.or_else(|| (0..CLASSES).find(|&c| has(self, c) && self.active[c] < self.class_max(c, l)))?;
        self.last_class = found;
        Some(found)
    }

    /// The request class `c` issues next: its head (FIFO), or the elevator's choice
    /// within the oldest time bucket (sorted).
    pub(super) fn pick_in_class(&self, c: usize) -> u64 {
        let index = &self.class_index[c];
        let first = *index.first().expect("class chosen with an empty queue");
        if class_is_fifo(IoClass::ALL[c]) || first.1 >= self.last_offset {
            return first.2;
        }
        match index.range((first.0, self.last_offset, 0)..).next() {
            Some(k) if k.0 == first.0 => k.2,
            _ => first.2,
        }
    }

    /// Account an issued request of `class` as active (credit bookkeeping included).
    pub(super) fn start_active(&mut self, class: IoClass) {
        self.active[class as usize] += 1;
        self.active_total += 1;
        if class != IoClass::Scrub {
            self.ia_active += 1;
            if self.ia_active == 1 {
                self.nia_credit = 1;
            }
        } else if self.ia_active > 0 {
            self.nia_credit = self.nia_credit.saturating_sub(1);
        }
    }

    /// Account a finished request's slot.
    pub(super) fn release_slot(&mut self, op: IoOp, class: IoClass, nia_credit: u32) {
        assert!(self.active_total > 0, "request released twice");
        self.active_total -= 1;
        if op == IoOp::Flush {
            self.active_flushes -= 1;
            return;
        }
        self.active[class as usize] -= 1;
        if class != IoClass::Scrub {
            self.ia_active -= 1;
            self.nia_credit = if self.ia_active == 0 { 0 } else { nia_credit };
        } else if self.ia_active == 0 {
            self.nia_credit = self.nia_credit.saturating_add(1);
        }
    }

    /// The next request to issue under `limits`, accounted as active, possibly an
    /// aggregate of several queued ones; None if the leaf is full or nothing may go.
    pub(super) fn next(&mut self, limits: &QueueLimits) -> Option<Queued> {
        #[cfg(test)]
        if self.paused {
            return None;
        }
        if self.active_total >= limits.max_active_total {
            return None;
        }
        // One flush at a time: Linux reports a failed write-back to one fdatasync only,
        // so a flush running beside a failing one could succeed without its writes
        // being durable (see `vdev::mirror::Leaf::submit_flush`).
        if let Some(f) = self.flushes.front().filter(|_| self.active_flushes == 0) {
            if self.outstanding_writes.first().is_none_or(|&w| w > f.seq) {
                self.active_flushes += 1;
                self.active_total += 1;
                return self.flushes.pop_front();
            }
        }
        let c = self.class_to_issue(limits)?;
        let id = self.pick_in_class(c);
        let q = match limits.mode {
            SchedulerMode::OpenZfs => super::aggregate::aggregate(self, id, limits),
            SchedulerMode::Legacy => None,
        };
        let q = q.unwrap_or_else(|| self.remove(id));
        self.start_active(q.req.class);
        if q.req.len > 0 {
            self.last_offset = q.req.offset.saturating_add(q.req.len);
        }
        Some(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::abd::AlignedBuf;
    use crate::vdev::queue::IoRequest;
    use std::sync::Arc;

    /// No aggregation: these tests look at selection alone.
    fn limits(min: u32, max: u32) -> QueueLimits {
        QueueLimits { aggregation_limit_bytes: 0, ..QueueLimits::with_active([min; CLASSES], [max; CLASSES], 1000) }
    }

    fn io(class: IoClass, offset: u64) -> Queued {
        let done = Box::new(|_| {});
        let req = match class {
            IoClass::Trim => IoRequest::discard(offset, 4096, done),
            c if c.is_read() => IoRequest::read(c, offset, AlignedBuf::zeroed(4096), done),
            c => IoRequest::write(c, offset, Arc::new(AlignedBuf::zeroed(4096)), done),
        };
        Queued::new(req, 0, 0)
    }

    fn classes_issued(st: &mut QueueState, l: &QueueLimits) -> Vec<usize> {
        std::iter::from_fn(|| st.next(l)).map(|q| q.req.class as usize).collect()
    }

    fn offsets_issued(st: &mut QueueState, l: &QueueLimits) -> Vec<u64> {
        std::iter::from_fn(|| st.next(l)).map(|q| q.req.offset).collect()
    }

    #[test]
    fn pass_one_round_robins_then_pass_two_goes_by_priority() {
        // Goal: pass 1 starts after the class issued last and goes round the classes
        // below min_active; pass 2 then fills in priority order up to max_active; scrub
        // under interactive load gets one I/O per credit.
        // Method: two requests per class, min 1, max 5; the last class issued starts at
        // 0, so pass 1 runs 1..5 then 0. Scrub's second request waits for credit, which
        // an interactive completion (others still active) refills.
        let l = limits(1, 5);
        let mut st = QueueState::default();
        for c in IoClass::ALL {
            for k in 0..2 {
                st.push(io(c, (c as u64) << 20 | k << 16), l.mode, 0);
            }
        }
        assert_eq!(classes_issued(&mut st, &l), vec![1, 2, 3, 4, 5, 0, 0, 1, 2, 3, 5]);
        assert_eq!(st.class_index[IoClass::Scrub as usize].len(), 1, "scrub waits for credit");
        st.release_slot(IoOp::Read, IoClass::SyncRead, l.nia_credit);
        assert!(st.next(&l).is_none(), "credit refilled, but scrub is at min(credit, min_active)");
        st.release_slot(IoOp::Read, IoClass::Scrub, l.nia_credit);
        assert_eq!(classes_issued(&mut st, &l), vec![4]);
        // The rotation goes on from the class issued last.
        st.push(io(IoClass::SyncWrite, 9 << 20), l.mode, 0);
        st.push(io(IoClass::AsyncRead, 9 << 20), l.mode, 0);
        st.active = [0; CLASSES];
        st.last_class = IoClass::SyncWrite as usize;
        assert_eq!(classes_issued(&mut st, &l)[0], IoClass::AsyncRead as usize, "starts after the last class");
    }

    #[test]
    fn class_bounds_min_and_max_and_total() {
        // Goal: a class at its max_active is skipped while another may go; the leaf's
        // total bound stops everything; a class below min_active beats priority.
        let mut l = limits(1, 2);
        let mut st = QueueState::default();
        for k in 0..4 {
            st.push(io(IoClass::SyncRead, k << 16), l.mode, 0);
            st.push(io(IoClass::AsyncWrite, k << 16), l.mode, 0);
        }
        // Pass 1 starts at class 1: async write (below min) goes before sync read.
        assert_eq!(classes_issued(&mut st, &l), vec![3, 0, 0, 3]);
        assert_eq!(st.active[0], 2);
        assert_eq!(st.active[3], 2);
        st.release_slot(IoOp::Read, IoClass::SyncRead, l.nia_credit);
        l.max_active_total = 4;
        assert_eq!(classes_issued(&mut st, &l), vec![0], "one slot left in the leaf");
        st.release_slot(IoOp::Write, IoClass::AsyncWrite, l.nia_credit);
        assert_eq!(classes_issued(&mut st, &l), vec![3], "the freed slot, and no more");
        assert_eq!((st.active_total, st.class_index[0].len(), st.class_index[3].len()), (4, 1, 1));
    }

    #[test]
    fn scrub_waits_for_an_idle_leaf_before_using_max_active() {
        // Goal: with no interactive I/O, scrub runs at max(1, min_active) until
        // zfs_vdev_nia_delay scrub completions, then at max_active.
        let l = QueueLimits { min_active: [1; CLASSES], max_active: [3; CLASSES], ..limits(1, 3) };
        let mut st = QueueState::default();
        for k in 0..20 {
            st.push(io(IoClass::Scrub, k << 16), l.mode, 0);
        }
        for done in 0..l.nia_delay {
            assert_eq!(classes_issued(&mut st, &l).len(), 1, "after {done} completions");
            st.release_slot(IoOp::Read, IoClass::Scrub, l.nia_credit);
        }
        assert_eq!(classes_issued(&mut st, &l).len(), 3, "idle: max_active");
        // Interactive I/O starts: credit 1, and scrub may not exceed min(credit, min).
        for _ in 0..3 {
            st.release_slot(IoOp::Read, IoClass::Scrub, l.nia_credit);
        }
        st.start_active(IoClass::SyncRead);
        assert_eq!(classes_issued(&mut st, &l).len(), 1);
        assert!(st.next(&l).is_none(), "credit spent");
    }

    #[test]
    fn sorted_classes_are_an_elevator_within_a_time_bucket() {
        // Goal: async classes issue by offset from the last issued end, wrapping to the
        // lowest offset; sync classes keep arrival order.
        let l = limits(10, 10);
        let mut st = QueueState::default();
        for off in [40u64, 10, 30, 20] {
            st.push(io(IoClass::AsyncWrite, off << 10), l.mode, 0);
        }
        st.last_offset = 25 << 10;
        assert_eq!(offsets_issued(&mut st, &l), [30u64, 40, 10, 20].map(|k| k << 10));
        for off in [30u64, 10, 20] {
            st.push(io(IoClass::SyncRead, off << 10), l.mode, 0);
        }
        assert_eq!(offsets_issued(&mut st, &l), [30u64, 10, 20].map(|k| k << 10), "sync reads are FIFO");
        let legacy = QueueLimits { mode: SchedulerMode::Legacy, ..l };
        for off in [40u64, 10] {
            st.push(io(IoClass::AsyncRead, off << 10), legacy.mode, 0);
        }
        assert_eq!(offsets_issued(&mut st, &legacy), [40u64, 10].map(|k| k << 10), "legacy: FIFO");
    }

    #[test]
    fn an_older_time_bucket_goes_first() {
        // Goal (starvation bound): a request queued in an earlier ~0.54 s bucket is
        // issued before newer ones, even at a lower offset than the elevator's position
        // and behind a stream of newer requests ahead of the head.
        let l = limits(100, 100);
        let mut st = QueueState::default();
        let bucket = 1u64 << TIME_BUCKET_SHIFT;
        st.push(io(IoClass::AsyncWrite, 0), l.mode, 0);
        for k in 1..50u64 {
            st.push(io(IoClass::AsyncWrite, k << 20), l.mode, bucket + k);
        }
        st.last_offset = 10 << 20;
        let order = offsets_issued(&mut st, &l);
        assert_eq!(order[0], 0, "the old request first");
        let rest: Vec<u64> = (1..50u64).map(|k| k << 20).collect();
        assert_eq!(order[1..], rest[..], "then the new bucket in offset order");
    }

    #[test]
    fn async_write_max_active_follows_dirty_data() {
        // Goal: the dirty-data ramp at 29/30/45/60/61 % of zfs_dirty_data_max with
        // min 2, max 10, 30 % .. 60 % (vdev_queue_max_async_writes).
        let max = 1000u64 << 20;
        let at = |pct: u64| async_write_max_active(max * pct / 100, max, 2, 10, 30, 60);
        assert_eq!([29, 30, 45, 60, 61].map(at), [2, 2, 6, 10, 10]);
        assert_eq!(async_write_max_active(max * 525 / 1000, max, 2, 10, 30, 60), 8, "52.5 % -> 8 (brief §3.3)");
        assert_eq!(async_write_max_active(0, 0, 2, 10, 30, 60), 2, "no limit known: min");
    }
}
