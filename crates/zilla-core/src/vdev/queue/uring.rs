//! uring: the io_uring device engine of a leaf queue.
//!
//! Theory of operation
//! -------------------
//! For a leaf whose device is a plain descriptor ([`Device::raw_target`]: a file or a
//! block device, O_DIRECT or buffered), the queue's selected requests become io_uring
//! submissions instead of calls on a worker thread:
//!
//! ```text
//!   submit / finish (any thread, queue lock held)
//!       └─ take_issuable(): requests the min/max_active selection allows now
//!   (queue lock released)
//!       └─ per request: aligned and in range?  yes -> SQE (READ / WRITE / FSYNC datasync)
//!                                              no  -> performed synchronously right here
//!          submit()                                   (O_DIRECT bounce path; rare)
//!   reaper thread (one per leaf): submit_and_wait(1), then per CQE:
//!       result < 0 -> IoError with the errno; short transfer, EAGAIN, EINTR or
//!       ECANCELED (not the device's verdict) -> redone synchronously
//!       finish(): statistics, completion, release the slot, take_issuable() again
//! ```
//!
//! The in-flight table (slab indexed by user_data) owns each request and its buffer
//! while the kernel uses it: the buffer's heap memory does not move until the CQE is
//! reaped. In flight at once is bounded by the queue's selection (max_active). The
//! submission queue is pushed under `sq_lock` by whichever thread issues; only the reaper
//! reads the completion queue. Shutdown pushes a NOP tagged [`STOP`]; the reaper exits
//! once every in-flight request has completed.
//!
//! Discards are performed synchronously (fallocate is cheap and rare). If the kernel
//! refuses io_uring (seccomp, old kernel), [`UringEngine::start`] returns None and the
//! leaf uses worker threads.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};
use parking_lot::{Mutex, MutexGuard};

use super::{IoData, Queued, QueueState, Shared, WriteBytes};
use crate::vdev::{IoError, IoOp, RawTarget};

/// The most buffers one vectored write takes (the kernel's UIO_MAXIOV).
const IOV_MAX: usize = 1024;
/// user_data of the shutdown NOP.
const STOP: u64 = u64::MAX;
/// Submission queue entries (the completion queue gets twice as many).
const RING_ENTRIES: u32 = 256;
/// The kernel's io-wq helper threads one ring may use for requests that would block
/// (bounded: regular-file I/O; unbounded: anything else), per leaf.
const IOWQ_BOUNDED_WORKERS_MAX: u32 = 8;
const IOWQ_UNBOUNDED_WORKERS_MAX: u32 = 2;

struct InFlight {
    q: Queued,
    data: IoData,
    /// The iovecs of a vectored write (pointing into `data`'s buffers), kept until the
    /// completion (held for the kernel, never read here).
    #[allow(dead_code)]
    iovecs: Iovecs,
    issued_at_ns: u64,
    /// Bytes the kernel must transfer (reads and writes).
    expect: u64,
}

/// The iovec array of a vectored write.
struct Iovecs(#[allow(dead_code)] Vec<libc::iovec>);
// SAFETY: the pointers are into buffers the same InFlight owns (its `data`); they are
// only read by the kernel while the request is in flight.
unsafe impl Send for Iovecs {}

/// Owners of in-flight requests, indexed by user_data.
#[derive(Default)]
struct Slab {
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    used: usize,
}

impl Slab {
    fn insert(&mut self, f: InFlight) -> u64 {
        self.used += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(f);
                i as u64
            }
            None => {
                self.slots.push(Some(f));
                (self.slots.len() - 1) as u64
            }
        }
    }
    fn take(&mut self, id: u64) -> Option<InFlight> {
        let f = self.slots.get_mut(id as usize)?.take()?;
        self.free.push(id as usize);
        self.used -= 1;
        Some(f)
    }
}

/// One leaf's io_uring instance and its reaper.
pub struct UringEngine {
    ring: IoUring,
    target: RawTarget,
    sq_lock: Mutex<()>,
    inflight: Mutex<Slab>,
    stopping: AtomicBool,
    /// The kernel has IORING_OP_WRITEV (else vectored writes use pwritev on a worker).
    writev: bool,
}

impl UringEngine {
    /// Set up a ring for the queue's device and start its reaper; None if the device is
    /// not a plain descriptor or the kernel refuses io_uring.
    pub(super) fn start(sh: &Arc<Shared>) -> Option<Arc<UringEngine>> {
        let target = sh.device().raw_target()?;
        let ring = match IoUring::new(RING_ENTRIES) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(device = %sh.name, "io_uring unavailable, using worker threads: {e}");
                return None;
            }
        };
        // Kernels 5.1-5.5 set up a ring but fail READ/WRITE with EINVAL: ask which
        // operations this one has (the probe itself is 5.6+) and use workers otherwise.
        let mut probe = io_uring::Probe::new();
        let ops = [opcode::Read::CODE, opcode::Write::CODE, opcode::Fsync::CODE, opcode::Nop::CODE];
        if ring.submitter().register_probe(&mut probe).is_err() || !ops.iter().all(|&op| probe.is_supported(op)) {
            tracing::warn!(device = %sh.name, "io_uring lacks READ/WRITE/FSYNC on this kernel, using worker threads");
            return None;
        }
        // The kernel runs requests that would block (an fsync, a write that allocates
        // in a sparse file) on its own io-wq helper threads (iou-wrk-*), created on
        // demand: bound them per ring (5.15+; older kernels keep their own limit).
        let mut iowq_max = [IOWQ_BOUNDED_WORKERS_MAX, IOWQ_UNBOUNDED_WORKERS_MAX];
        if let Err(e) = ring.submitter().register_iowq_max_workers(&mut iowq_max) {
            tracing::debug!(device = %sh.name, "io_uring io-wq worker bound not set: {e}");
        }
        let eng = Arc::new(UringEngine {
            ring,
            target,
            sq_lock: Mutex::new(()),
            inflight: Mutex::new(Slab::default()),
            stopping: AtomicBool::new(false),
            writev: probe.is_supported(opcode::Writev::CODE),
        });
        let (e2, sh2) = (eng.clone(), sh.clone());
        let name = format!("zio_uring_{}", sh.name.rsplit('/').next().unwrap_or("leaf"));
        let name: String = name.chars().take(15).collect();
        if let Err(e) = crate::env::real().spawn(name, Box::new(move || e2.reap(&sh2))) {
            tracing::warn!(device = %sh.name, "cannot start the io_uring reaper, using worker threads: {e}");
            return None;
        }
        Some(eng)
    }

    /// Issue whatever the selection allows now; `st` is the queue lock, released here.
    pub(super) fn dispatch(&self, sh: &Arc<Shared>, mut st: MutexGuard<'_, QueueState>) {
        let ready = sh.take_issuable(&mut st);
        drop(st);
        if ready.is_empty() {
            return;
        }
        let mut pushed = false;
        for mut q in ready {
            let data = q.take_device_data();
            let mut iovecs = Vec::new();
            match self.sqe_for(&q, &data, &mut iovecs) {
                Some((entry, expect)) => {
                    sh.note_issue(q.req.offset, q.req.len);
                    let id = self.inflight.lock().insert(InFlight { q, data, iovecs: Iovecs(iovecs), issued_at_ns: sh.clock.now_ns(), expect });
                    self.push(entry.user_data(id));
                    pushed = true;
                }
                None => {
                    let (issued_at_ns, r, data) = sh.perform_req(&q.req, data);
                    sh.finish(q, data, issued_at_ns, r);
                }
            }
        }
        if pushed {
            if let Err(e) = self.ring.submit() {
                tracing::error!(device = %sh.name, "io_uring submit failed: {e}");
            }
        }
    }

    /// The SQE for a request the kernel can do directly, with the bytes it must move.
    fn sqe_for(&self, q: &Queued, data: &IoData, iovecs: &mut Vec<libc::iovec>) -> Option<(io_uring::squeue::Entry, u64)> {
        let t = &self.target;
        let fd = types::Fd(t.fd);
        let (off, len) = (q.req.offset, q.req.len);
        let fits = |ptr: *const u8| {
            off.checked_add(len).is_some_and(|end| end <= t.size_bytes)
                && off.is_multiple_of(t.offset_align as u64)
                && len.is_multiple_of(t.offset_align as u64)
                && (ptr as usize).is_multiple_of(t.mem_align)
                && len <= u32::MAX as u64
        };
        match (q.req.op, data) {
            (IoOp::Read, IoData::Read(b)) if fits(b.as_slice().as_ptr()) => {
                // The buffer is owned by the in-flight slab until the CQE; its heap
                // memory does not move when the AlignedBuf value does.
                let ptr = b.as_slice().as_ptr() as *mut u8;
                Some((opcode::Read::new(fd, ptr, len as u32).offset(off).build(), len))
            }
            (IoOp::Write, IoData::Write(WriteBytes::One(b))) if fits(b.as_slice().as_ptr()) => {
                // RWF_DSYNC: the kernel makes this write durable before it completes
                // (FUA where the device has it, else the write and a cache flush; on a
                // file, with the metadata needed to read it back): no second request
                let flags = if q.req.durable { libc::RWF_DSYNC } else { 0 };
                Some((opcode::Write::new(fd, b.as_slice().as_ptr(), len as u32).offset(off).rw_flags(flags as _).build(), len))
            }
            (IoOp::Write, IoData::Write(WriteBytes::Vectored(bufs)))
                if self.writev && bufs.len() <= IOV_MAX && fits(std::ptr::null()) && bufs.iter().all(|b| b.len().is_multiple_of(t.offset_align) && (b.as_ptr() as usize).is_multiple_of(t.mem_align)) =>
            {
                // The buffers are shared (Arc) and owned by the in-flight slab until the
                // CQE; the iovec array lives there too.
                iovecs.extend(bufs.iter().map(|b| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }));
                let flags = if q.req.durable { libc::RWF_DSYNC } else { 0 };
                Some((opcode::Writev::new(fd, iovecs.as_ptr(), iovecs.len() as u32).offset(off).rw_flags(flags as _).build(), len))
            }
            (IoOp::Flush, _) => Some((opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(), 0)),
            _ => None,
        }
    }

    fn push(&self, entry: io_uring::squeue::Entry) {
        let _g = self.sq_lock.lock();
        loop {
            // SAFETY: sq_lock makes this the only SubmissionQueue alive; the entry's
            // buffer stays owned by the in-flight slab until its completion is reaped.
            let mut sq = unsafe { self.ring.submission_shared() };
            if unsafe { sq.push(&entry) }.is_ok() {
                return;
            }
            drop(sq);
            // Full: hand what is there to the kernel and try again.
            let _ = self.ring.submit();
        }
    }

    /// Stop the reaper once everything in flight has completed.
    pub(super) fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        self.push(opcode::Nop::new().build().user_data(STOP));
        let _ = self.ring.submit();
    }

    fn reap(self: Arc<Self>, sh: &Arc<Shared>) {
        let mut stop_seen = false;
        loop {
            if stop_seen && self.inflight.lock().used == 0 {
                return;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    tracing::error!(device = %sh.name, "io_uring wait failed: {e}");
                    std::thread::yield_now();
                }
            }
            // SAFETY: only this thread reads the completion queue.
            let done: Vec<(u64, i32)> = unsafe { self.ring.completion_shared() }.map(|c| (c.user_data(), c.result())).collect();
            for (id, res) in done {
                if id == STOP {
                    stop_seen = true;
                    continue;
                }
                let Some(f) = self.inflight.lock().take(id) else { continue };
                // A completion that panics (a bug) must not end this thread: it is the
                // leaf's only reaper, and every later I/O on the leaf would hang.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.complete(sh, f, res))).is_err() {
                    tracing::error!(device = %sh.name, "an I/O completion panicked; the reaper goes on");
                }
            }
        }
    }

    fn complete(&self, sh: &Arc<Shared>, f: InFlight, res: i32) {
        let InFlight { q, data, issued_at_ns, expect, iovecs: _ } = f;
        match Outcome::of(res, expect) {
            Outcome::Done => {
                if q.req.durable {
                    sh.count_flush();
                }
                sh.finish(q, data, issued_at_ns, Ok(()))
            }
            Outcome::Failed(errno) => {
                if q.req.op == IoOp::Flush || q.req.durable {
                    sh.note_device_flush_error();
                }
                let e = io::Error::from_raw_os_error(errno);
                let err = IoError::from_io(&sh.name, q.req.op, q.req.offset, q.req.len, &e);
                sh.finish(q, data, issued_at_ns, Err(err))
            }
            Outcome::Redo => {
                let (issued_at_ns, r, data) = sh.perform_req(&q.req, data);
                sh.finish(q, data, issued_at_ns, r)
            }
        }
    }
}

/// What a completion's result means for its request.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Every byte moved (or the flush is done).
    Done,
    /// The device failed it: the errno is the device's answer, counted against it.
    Failed(i32),
    /// Redo it the synchronous way, which handles the case; not a device error:
    /// - a short transfer (the end of a file whose length is not aligned);
    /// - an errno that says nothing about the device, only that the kernel could not
    ///   run the request this time: EAGAIN (a non-blocking attempt that would block,
    ///   where io-wq did not take it over), EINTR, ECANCELED (the ring's work cancelled,
    ///   as when an io-wq helper exits). Counted as an error, such a result would add
    ///   to the leaf's error counts and could fault a healthy device.
    Redo,
}

impl Outcome {
    fn of(res: i32, expect: u64) -> Outcome {
        if res < 0 {
            return match -res {
                libc::EAGAIN | libc::EINTR | libc::ECANCELED => Outcome::Redo,
                errno => Outcome::Failed(errno),
            };
        }
        if (res as u64) < expect {
            return Outcome::Redo;
        }
        Outcome::Done
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        debug_assert!(self.inflight.get_mut().used == 0, "io_uring engine dropped with requests in flight");
    }
}


#[cfg(test)]
mod tests {
    use super::Outcome;

    #[test]
    fn only_the_devices_own_errors_fail_a_request() {
        assert_eq!(Outcome::of(4096, 4096), Outcome::Done);
        assert_eq!(Outcome::of(0, 0), Outcome::Done); // a flush
        assert_eq!(Outcome::of(512, 4096), Outcome::Redo); // short: the end of the file
        for errno in [libc::EAGAIN, libc::EINTR, libc::ECANCELED] {
            assert_eq!(Outcome::of(-errno, 4096), Outcome::Redo, "errno {errno}");
        }
        for errno in [libc::EIO, libc::ENOSPC, libc::EINVAL, libc::ENODEV] {
            assert_eq!(Outcome::of(-errno, 4096), Outcome::Failed(errno), "errno {errno}");
        }
    }
}
