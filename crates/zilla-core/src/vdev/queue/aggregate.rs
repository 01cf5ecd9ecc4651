//! aggregate: adjacent queued requests become one device I/O (OpenZFS
//! vdev_queue_aggregate).
//!
//! Theory of operation
//! -------------------
//! When selection has chosen a read or a write, its neighbours in the offset-sorted
//! tree of queued requests of the same type are looked at, backwards then forwards:
//!
//! ```text
//!   take a neighbour while: same family (sync with sync, async with async, scrub
//!                           with scrub: a ZIL write never carries txg-sync bytes)
//!                           no overlap, and the hole to it <= max gap
//!                           span(first .. last) <= limit
//!   max gap: reads zfs_vdev_read_gap_limit (32 KiB; the hole is read into the
//!            aggregate's buffer and dropped); writes 0: writes must be contiguous
//!   limit:   zfs_vdev_aggregation_limit (1 MiB) on rotating leaves,
//!            zfs_vdev_aggregation_limit_non_rotating (128 KiB) otherwise,
//!            never above 16 MiB; 0 turns aggregation off
//! ```
//!
//! Writes are never padded: OpenZFS only bridges write holes with *optional* zero
//! writes it queues itself (gang and alignment fill, `zfs_vdev_write_gap_limit`), and
//! Zilla issues none, so a Zilla write aggregate is always exactly its children's
//! bytes, back to back.
//!
//! If at least one neighbour joined, the children leave the queue and one request takes
//! their place: class of the chosen request (one active slot of that class), the span
//! as offset and length, and the children kept inside it. Its buffer is made outside
//! the queue lock ([`build_data`]): a fresh span-sized buffer for reads, the children's
//! own buffers in offset order for writes (one vectored write, no copy). When the device I/O completes, every child
//! completes with its own buffer (reads get their slice copied in, [`scatter_read`]).
//! When the aggregate fails, each child is redone alone, so one bad sector fails only
//! the child that covers it. Children keep their write sequence numbers until their
//! own completion has run, so a flush still waits for every write queued before it.

use std::sync::Arc;

use super::select::{QueueLimits, QueueState};
use super::{IoData, IoOp, Queued, WriteBytes};
use crate::vdev::abd::AlignedBuf;
use crate::vdev::IoClass;

/// Never more than this in one aggregate (SPA_MAXBLOCKSIZE).
pub const AGGREGATE_MAX_BYTES: u64 = 16 << 20;

/// The family a request aggregates within: sync reads and writes (FIFO classes) only
/// with each other, async reads and writes only with each other, scrub only with scrub.
/// OpenZFS separates scrub by its AGG_INHERIT flags and would let a ZIL block merge
/// with an adjacent txg-sync write; Zilla keeps them apart so a sync write (an lwb the
/// intent log waits on) is never enlarged and slowed by bulk txg bytes, and an async
/// write is never issued under a sync class's slot.
fn family(class: IoClass) -> u8 {
    match class {
        IoClass::SyncRead | IoClass::SyncWrite => 0,
        IoClass::AsyncRead | IoClass::AsyncWrite => 1,
        IoClass::Scrub => 2,
        IoClass::Trim => 3,
    }
}

/// The aggregate that queued request `id` heads, taken out of the queue with its
/// children; None (and nothing removed) if no neighbour qualifies.
pub(super) fn aggregate(st: &mut QueueState, id: u64, l: &QueueLimits) -> Option<Queued> {
    let limit = l.aggregation_limit_bytes.min(AGGREGATE_MAX_BYTES);
    let primary = st.queued.get(&id)?;
    let (op, class, fam) = (primary.req.op, primary.req.class, family(primary.req.class));
    let (tree, max_gap) = match op {
        IoOp::Read => (&st.read_tree, l.read_gap_limit_bytes),
        IoOp::Write => (&st.write_tree, 0),
        _ => return None,
    };
    if limit == 0 || primary.req.len == 0 || primary.req.len >= limit || primary.req.durable {
        return None;
    }
    let start_key = (primary.req.offset, id);
    let (mut first, mut last) = (start_key, start_key);
    let mut first_off = primary.req.offset;
    let mut last_end = primary.req.offset.saturating_add(primary.req.len);
    for &key in tree.range(..start_key).rev() {
        let d = &st.queued[&key.1].req;
        let d_end = d.offset.saturating_add(d.len);
        if family(d.class) != fam || d.durable || d.len == 0 || d_end > first_off || first_off - d_end > max_gap || last_end - d.offset > limit {
            break;
        }
        (first, first_off) = (key, d.offset);
    }
    for &key in tree.range((std::ops::Bound::Excluded(start_key), std::ops::Bound::Unbounded)) {
        let d = &st.queued[&key.1].req;
        let d_end = d.offset.saturating_add(d.len);
        if family(d.class) != fam || d.durable || d.len == 0 || d.offset < last_end || d.offset - last_end > max_gap || d_end - first_off > limit {
            break;
        }
        (last, last_end) = (key, d_end);
    }
    if first == last {
        return None;
    }
    let ids: Vec<u64> = tree.range(first..=last).map(|k| k.1).collect();
    let children: Vec<Queued> = ids.into_iter().map(|i| st.remove(i)).collect();
    Some(Queued::aggregate(class, op, first_off, last_end - first_off, children))
}

/// The device buffer of aggregate `agg` (built outside the queue lock).
pub(super) fn build_data(agg: &Queued) -> IoData {
    let len = agg.req.len as usize;
    match agg.req.op {
        IoOp::Read => IoData::Read(AlignedBuf::zeroed(len)),
        _ => {
            // the children's own buffers, written by one vectored write: no copy
            let mut bufs = Vec::with_capacity(agg.children.len());
            for c in &agg.children {
                if let IoData::Write(d) = &c.req.data {
                    bufs.extend(d.buffers().iter().cloned());
                }
            }
            let w = WriteBytes::Vectored(Arc::new(bufs));
            debug_assert_eq!(w.len(), len, "write aggregate with a hole");
            IoData::Write(w)
        }
    }
}

/// Copy child `child`'s bytes out of the completed read aggregate at `agg_offset`.
pub(super) fn scatter_read(agg_offset: u64, agg: &IoData, child: &mut Queued) {
    let (IoData::Read(src), IoData::Read(dst)) = (agg, &mut child.req.data) else { return };
    let at = (child.req.offset - agg_offset) as usize;
    let n = dst.len();
    dst.as_mut_slice().copy_from_slice(&src.as_slice()[at..at + n]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::queue::{IoRequest, CLASSES};

    fn limits(limit: u64) -> QueueLimits {
        QueueLimits { aggregation_limit_bytes: limit, ..QueueLimits::with_active([10; CLASSES], [10; CLASSES], 1000) }
    }

    fn push(st: &mut QueueState, class: IoClass, offset: u64, len: usize) {
        let done = Box::new(|_| {});
        let req = if class.is_read() {
            IoRequest::read(class, offset, AlignedBuf::zeroed(len), done)
        } else {
            IoRequest::write(class, offset, Arc::new(AlignedBuf::copy_of(&vec![(offset >> 12) as u8; len])), done)
        };
        st.push(Queued::new(req, 0, 0), super::super::SchedulerMode::OpenZfs, 0);
    }

    /// (offset, len, children) of each issued request.
    fn issued(st: &mut QueueState, l: &QueueLimits) -> Vec<(u64, u64, usize)> {
        std::iter::from_fn(|| st.next(l)).map(|q| (q.req.offset, q.req.len, q.children.len())).collect()
    }

    const K: u64 = 1024;

    #[test]
    fn contiguous_writes_aggregate_and_a_write_gap_stops_them() {
        // Goal: writes merge only when contiguous (write gap 0, no zero padding),
        // walking backwards from the chosen request too; a sync write (ZIL) between
        // async ones neither joins them nor is joined by them, and sync writes merge
        // with each other.
        let l = limits(128 * K);
        let mut st = QueueState::default();
        push(&mut st, IoClass::SyncWrite, 8 * K, 4096);
        push(&mut st, IoClass::AsyncWrite, 0, 4096);
        push(&mut st, IoClass::AsyncWrite, 4 * K, 4096);
        push(&mut st, IoClass::AsyncWrite, 12 * K, 4096);
        push(&mut st, IoClass::AsyncWrite, 20 * K, 4096);
        let mut got = issued(&mut st, &l);
        got.sort();
        assert_eq!(got, vec![(0, 8 * K, 2), (8 * K, 4 * K, 0), (12 * K, 4 * K, 0), (20 * K, 4 * K, 0)]);
        let mut st = QueueState::default();
        push(&mut st, IoClass::SyncWrite, 4 * K, 4096);
        push(&mut st, IoClass::SyncWrite, 0, 4096);
        push(&mut st, IoClass::AsyncWrite, 8 * K, 4096);
        let mut got = issued(&mut st, &l);
        got.sort();
        assert_eq!(got, vec![(0, 8 * K, 2), (8 * K, 4 * K, 0)]);
        let mut st = QueueState::default();
        for off in [0, 4 * K, 8 * K] {
            push(&mut st, IoClass::AsyncWrite, off, 4096);
        }
        let agg = st.next(&l).unwrap();
        let IoData::Write(w) = build_data(&agg) else { panic!("write aggregate without bytes") };
        assert_eq!(w.buffers().len(), 3, "an aggregate writes its children's own buffers");
        let b: Vec<u8> = w.slices().concat();
        assert_eq!(b.len(), 12 * 1024);
        assert!(b[..4096].iter().all(|&x| x == 0) && b[4096..8192].iter().all(|&x| x == 1) && b[8192..].iter().all(|&x| x == 2));
    }

    #[test]
    fn reads_span_gaps_up_to_the_read_gap_limit() {
        // Goal: reads merge across holes up to zfs_vdev_read_gap_limit (32 KiB), not
        // one byte more; each child gets its own bytes back.
        let l = limits(1024 * K);
        let mut st = QueueState::default();
        push(&mut st, IoClass::AsyncRead, 0, 4096);
        push(&mut st, IoClass::AsyncRead, 36 * K, 4096); // gap 32 KiB
        push(&mut st, IoClass::AsyncRead, 72 * K + 512, 4096); // gap 32 KiB + 512
        let mut agg = st.next(&l).unwrap();
        assert_eq!((agg.req.offset, agg.req.len, agg.children.len()), (0, 40 * K, 2));
        let mut data = AlignedBuf::zeroed(40 * 1024);
        data[36 * 1024..].fill(7);
        let data = IoData::Read(data);
        for c in agg.children.iter_mut() {
            scatter_read(0, &data, c);
        }
        let IoData::Read(second) = &agg.children[1].req.data else { panic!() };
        assert!(second.iter().all(|&x| x == 7));
        assert_eq!(issued(&mut st, &l), vec![(72 * K + 512, 4 * K, 0)]);
    }

    #[test]
    fn aggregates_stop_at_the_limit_and_at_another_family() {
        // Goal: an aggregate never spans more than the limit; scrub does not merge with
        // other reads, nor sync reads with async ones; limit 0 turns aggregation off.
        let l = limits(128 * K);
        let mut st = QueueState::default();
        for i in 0..40 {
            push(&mut st, IoClass::AsyncWrite, i * 4 * K, 4096);
        }
        assert_eq!(issued(&mut st, &l), vec![(0, 128 * K, 32), (128 * K, 32 * K, 8)]);
        push(&mut st, IoClass::AsyncRead, 0, 4096);
        push(&mut st, IoClass::Scrub, 4 * K, 4096);
        push(&mut st, IoClass::Scrub, 8 * K, 4096);
        let mut got = issued(&mut st, &l);
        got.sort();
        assert_eq!(got, vec![(0, 4 * K, 0), (4 * K, 8 * K, 2)]);
        push(&mut st, IoClass::SyncRead, 0, 4096);
        push(&mut st, IoClass::AsyncRead, 4 * K, 4096);
        push(&mut st, IoClass::SyncRead, 8 * K, 4096);
        let mut got = issued(&mut st, &l);
        got.sort();
        assert_eq!(got, vec![(0, 4 * K, 0), (4 * K, 4 * K, 0), (8 * K, 4 * K, 0)], "sync and async reads stay apart");
        for i in 0..4 {
            push(&mut st, IoClass::AsyncWrite, i * 4 * K, 4096);
        }
        assert_eq!(issued(&mut st, &limits(0)).len(), 4, "limit 0: no aggregation");
        let legacy = QueueLimits { mode: super::super::SchedulerMode::Legacy, ..l };
        for i in 0..4 {
            push(&mut st, IoClass::AsyncWrite, i * 4 * K, 4096);
        }
        assert_eq!(issued(&mut st, &legacy).len(), 4, "legacy: no aggregation");
    }
}
