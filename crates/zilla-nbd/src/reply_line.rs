//! reply_line: the write side of one connection, shared by every thread that finishes
//! one of its requests.
//!
//! Theory of operation
//! -------------------
//! A request finishes on the reactor (a cached read, an absorbed write), on a blocking
//! pool thread (a volume call), or on an engine thread (the device completion of an
//! intent-log commit). Handing each reply to a writer task costs a wake-up of a reactor
//! thread, and on a small machine that hand-off is a good part of a sync write's or a
//! cold read's latency (two `try_to_wake_up`s and a scheduler round per reply). So the
//! thread that finishes a request writes its reply itself when it can:
//!
//! ```text
//!   send(replies) ── lock ──┬─ line idle (nothing queued, writer not writing), and the
//!                           │  replies small (DIRECT_WRITE_BYTES_MAX: the lock is held)
//!                           │     └─ sendmsg(MSG_DONTWAIT) straight from the reply buffers
//!                           │          all taken  -> released at once (budget, buffers)
//!                           │          part taken -> the rest queued, writer woken
//!                           └─ otherwise: queued behind the others, writer woken if idle
//!   writer task: takes the queue in groups, writes them with the socket's async writer
//!                (the stall timeout applies), until the queue is empty; then idle again
//! ```
//!
//! Order and integrity: bytes of one reply never interleave with another's because a
//! direct write happens only under the lock, only when nothing is queued, and only while
//! the writer task holds no group; the task marks itself busy under the same lock
//! before it writes outside it. Replies leave in completion order, as before (the cookie
//! ties them to requests). A client that stops reading fills its socket buffer; the
//! direct write then takes part or nothing, the rest waits in the queue and the writer's
//! stall timeout ends the connection as before. No thread ever waits for a client:
//! the direct write never blocks.
//!
//! Descriptor lifetime. A direct write uses the socket's raw descriptor, which the
//! writer half owns. The writer task closes the line (under the lock) before it drops
//! its half, whether it ends, fails or is aborted ([`WriterGuard`]); a direct write
//! looks at `closed` under the same lock and holds it across the system call, so no
//! thread ever writes to a descriptor number that was closed (and perhaps reused by
//! another connection). Replies sent after the close are dropped with their budget,
//! as replies to a vanished writer always were.
//!
//! Streams without a descriptor (tests, the fuzz target) always go through the writer.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use zilla_frontend::Frontend;

use zilla_frontend::volume::SharedSlice;
use zilla_frontend::Admission;

use crate::stats::NbdStats;

/// Pieces passed to one vectored write (Linux's IOV_MAX is 1024).
pub(crate) const IOV_MAX: usize = 1024;
/// Largest burst of replies a finishing thread writes itself. The line's lock is held
/// across that copy into the socket, and the threads that wait for it include engine
/// threads completing other requests' device I/O: a 1 MiB read reply would hold them
/// for a copy of 1 MiB. Larger bursts go to the writer task (a hand-off is small next
/// to copying them).
pub(crate) const DIRECT_WRITE_BYTES_MAX: usize = 64 << 10;

/// Largest reply header kept inline in a [`Reply`] (a structured OFFSET_DATA chunk
/// header with its offset is 28 bytes, a simple reply 16). With the inline header a
/// `Reply` stays small enough to be moved without a call to memcpy.
pub(crate) const REPLY_HEAD_MAX_BYTES: usize = 30;

/// The first piece of a reply: a short header kept inline, or a buffer (header, or
/// header and data) that goes back to the front ends' pool once written.
enum Head {
    Inline(u8, [u8; REPLY_HEAD_MAX_BYTES]),
    Buffer(Vec<u8>),
}

/// One reply, ready to write, holding its budget until the writer has consumed it:
/// its head (see [`Head`]: a reply without data, or with shared data, allocates nothing
/// for its header), then the `shared` pieces of a zero-copy read (block buffers of the
/// volume, kept alive until they are on the wire).
pub(crate) struct Reply {
    head: Head,
    pub(crate) shared: Vec<SharedSlice>,
    pub(crate) _budget: Admission,
}

impl Reply {
    pub(crate) fn new(bytes: Vec<u8>, budget: Admission) -> Reply {
        Reply { head: Head::Buffer(bytes), shared: Vec::new(), _budget: budget }
    }
    /// A reply of a short header followed by `shared` pieces; a header longer than
    /// `REPLY_HEAD_MAX_BYTES` goes into a buffer.
    pub(crate) fn with_head(head: &[u8], shared: Vec<SharedSlice>, budget: Admission) -> Reply {
        let head = if head.len() <= REPLY_HEAD_MAX_BYTES {
            let mut inline = [0; REPLY_HEAD_MAX_BYTES];
            inline[..head.len()].copy_from_slice(head);
            Head::Inline(head.len() as u8, inline)
        } else {
            Head::Buffer(head.to_vec())
        };
        Reply { head, shared, _budget: budget }
    }
    #[cfg(test)]
    pub(crate) fn new_for_test(bytes: Vec<u8>, request: tokio::sync::OwnedSemaphorePermit, memory: zilla_frontend::BudgetPermit) -> Reply {
        Reply::new(bytes, Admission::from_parts(request, memory))
    }
    fn head(&self) -> &[u8] {
        match &self.head {
            Head::Inline(len, bytes) => &bytes[..usize::from(*len)],
            Head::Buffer(bytes) => bytes,
        }
    }
    /// Bytes this reply puts on the wire.
    pub(crate) fn wire_bytes(&self) -> usize {
        self.head().len() + self.shared.iter().map(SharedSlice::len).sum::<usize>()
    }
    /// The pieces this reply puts on the wire, in order.
    pub(crate) fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.head()).chain(self.shared.iter().map(SharedSlice::as_slice))
    }
    /// Give the reply's buffer (if it has one) back to the front ends' pool.
    pub(crate) fn recycle(self, frontend: &Frontend) {
        if let Head::Buffer(bytes) = self.head {
            frontend.buffers.give(bytes);
        }
    }
}

/// A write half that may expose its socket's descriptor for direct writes.
pub trait DirectFd {
    /// The connected socket's descriptor, if replies may be written to it directly.
    fn direct_fd(&self) -> Option<RawFd>;
}

impl DirectFd for tokio::net::tcp::OwnedWriteHalf {
    fn direct_fd(&self) -> Option<RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(self.as_ref()))
    }
}

impl DirectFd for tokio::net::unix::OwnedWriteHalf {
    fn direct_fd(&self) -> Option<RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(self.as_ref()))
    }
}

impl<S> DirectFd for tokio::io::WriteHalf<S> {
    fn direct_fd(&self) -> Option<RawFd> {
        None
    }
}

struct LineState {
    /// Replies waiting for the writer task, in completion order; bounded by the
    /// connection's request permits (every reply holds one).
    queued: VecDeque<Reply>,
    /// Bytes of `queued.front()` already on the wire (a direct write taken in part).
    head_written: usize,
    /// The writer task holds a group and writes it outside the lock.
    writer_busy: bool,
    /// The writer is gone: nothing more is written (see "Descriptor lifetime").
    closed: bool,
    /// Live [`ReplySender`]s; the writer ends once none is left and the queue is empty.
    senders: usize,
}

/// The shared write side of one connection.
pub(crate) struct ReplyLine {
    state: Mutex<LineState>,
    /// Wakes the writer task: replies queued while it was idle, or the last sender gone.
    wake: Notify,
    /// Wakes the reader when the writer is gone.
    gone: Notify,
    /// `LineState::closed`, readable without the lock (the reader looks per request).
    closed: std::sync::atomic::AtomicBool,
    fd: Option<RawFd>,
    stats: Arc<NbdStats>,
}

/// What the writer task does next.
pub(crate) enum Take {
    /// Write these replies; the first has this many bytes on the wire already.
    Group(Vec<Reply>, usize),
    /// Nothing queued: wait for `wake`.
    Wait,
    /// Nothing queued and no sender left: shut the socket's write side down.
    Done,
}

impl ReplyLine {
    /// A line for a write half with this descriptor (None: writer task only), with
    /// one sender.
    pub(crate) fn new(fd: Option<RawFd>, stats: Arc<NbdStats>) -> (Arc<ReplyLine>, ReplySender) {
        let line = Arc::new(ReplyLine {
            state: Mutex::new(LineState { queued: VecDeque::new(), head_written: 0, writer_busy: false, closed: false, senders: 1 }),
            wake: Notify::new(),
            gone: Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            fd,
            stats,
        });
        (line.clone(), ReplySender { line })
    }

    /// Whether the writer is gone (the connection can send nothing more).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Resolves once the writer is gone.
    pub(crate) async fn closed(&self) {
        loop {
            let notified = self.gone.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.state.lock().closed {
                return;
            }
            notified.await;
        }
    }

    /// The writer's next step; `gather_replies` / `gather_bytes` bound a group.
    pub(crate) fn take(&self, gather_replies: usize, gather_bytes: usize) -> Take {
        let mut st = self.state.lock();
        if st.queued.is_empty() {
            st.writer_busy = false;
            return if st.senders == 0 { Take::Done } else { Take::Wait };
        }
        st.writer_busy = true;
        let skip = std::mem::take(&mut st.head_written);
        let mut group = Vec::new();
        let mut bytes = 0;
        while let Some(reply) = st.queued.front() {
            let fits = group.len() < gather_replies && bytes + reply.wire_bytes() <= gather_bytes;
            if !group.is_empty() && !fits {
                break;
            }
            bytes += reply.wire_bytes();
            group.extend(st.queued.pop_front());
        }
        self.stats.replies_written_by_writer.fetch_add(group.len() as u64, Ordering::Relaxed);
        Take::Group(group, skip)
    }

    /// Wait until [`Self::take`] may have something (or the last sender is gone).
    pub(crate) async fn wait_for_replies(&self) {
        self.wake.notified().await;
    }

    /// The writer is gone: drop what is queued (with its budget) and refuse more.
    fn close(&self, frontend: &Frontend) {
        let dropped: Vec<Reply> = {
            let mut st = self.state.lock();
            st.closed = true;
            self.closed.store(true, Ordering::Release);
            st.head_written = 0;
            st.queued.drain(..).collect()
        };
        for reply in dropped {
            reply.recycle(frontend);
        }
        self.gone.notify_waiters();
    }

    /// Queue `replies`, or write them at once if the line is idle (see the module
    /// comment). Never blocks on the client. Returns the replies fully written, for the
    /// caller to release (their buffers go back to the pool, their budget is freed).
    fn send(&self, mut replies: Vec<Reply>) -> Vec<Reply> {
        let mut st = self.state.lock();
        if st.closed {
            return replies;
        }
        let idle = !st.writer_busy && st.queued.is_empty();
        let small = replies.iter().map(Reply::wire_bytes).sum::<usize>() <= DIRECT_WRITE_BYTES_MAX;
        let mut written = Vec::new();
        if let (true, true, Some(fd)) = (idle, small, self.fd) {
            let (whole, part) = write_now(fd, &replies);
            written = replies.drain(..whole).collect();
            st.head_written = part;
            self.stats.replies_written_direct.fetch_add(whole as u64, Ordering::Relaxed);
        }
        let wake = !replies.is_empty() && !st.writer_busy;
        st.queued.extend(replies);
        drop(st);
        if wake {
            self.wake.notify_one();
        }
        written
    }
}

/// One connection's handle for queueing replies; the writer ends once every handle is
/// dropped and the queue is written.
pub(crate) struct ReplySender {
    line: Arc<ReplyLine>,
}

impl ReplySender {
    /// Write or queue `replies` (never blocks); released replies go back to `frontend`.
    pub(crate) fn send(&self, replies: Vec<Reply>, frontend: &Frontend) {
        if replies.is_empty() {
            return;
        }
        for reply in self.line.send(replies) {
            reply.recycle(frontend);
        }
    }

    pub(crate) fn line(&self) -> &Arc<ReplyLine> {
        &self.line
    }
}

impl Clone for ReplySender {
    fn clone(&self) -> ReplySender {
        self.line.state.lock().senders += 1;
        ReplySender { line: self.line.clone() }
    }
}

impl Drop for ReplySender {
    fn drop(&mut self) {
        let last = {
            let mut st = self.line.state.lock();
            st.senders -= 1;
            st.senders == 0
        };
        if last {
            self.line.wake.notify_one();
        }
    }
}

/// Owns the writer task's half of the socket: closes the line before the half (and
/// with it, perhaps, the descriptor) is dropped, on every way out of the task, abort
/// included.
pub(crate) struct WriterGuard<W> {
    line: Arc<ReplyLine>,
    frontend: Arc<Frontend>,
    writer: Option<W>,
}

impl<W> WriterGuard<W> {
    pub(crate) fn new(line: Arc<ReplyLine>, frontend: Arc<Frontend>, writer: W) -> WriterGuard<W> {
        WriterGuard { line, frontend, writer: Some(writer) }
    }

    pub(crate) fn writer(&mut self) -> &mut W {
        self.writer.as_mut().expect("the writer is taken only in drop")
    }
}

impl<W> Drop for WriterGuard<W> {
    fn drop(&mut self) {
        self.line.close(&self.frontend);
        drop(self.writer.take());
    }
}

/// Write as much of `replies` as the socket takes now, without waiting. Returns the
/// replies written whole and the bytes written of the next one. Any error (a full
/// buffer, a reset) writes nothing more: the writer task retries and sees it.
fn write_now(fd: RawFd, replies: &[Reply]) -> (usize, usize) {
    let mut whole = 0;
    let mut part = 0;
    loop {
        let mut iov: Vec<libc::iovec> = Vec::new();
        let mut skip = part;
        'fill: for reply in &replies[whole..] {
            for piece in reply.pieces() {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                let rest = &piece[skip..];
                skip = 0;
                iov.push(libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: rest.len() });
                if iov.len() == IOV_MAX {
                    break 'fill;
                }
            }
        }
        if iov.is_empty() {
            return (whole, part);
        }
        let n = match send_iov(fd, &iov) {
            Ok(0) | Err(_) => return (whole, part),
            Ok(n) => n,
        };
        // advance over what was taken
        let mut left = n;
        while left > 0 && whole < replies.len() {
            let rest = replies[whole].wire_bytes() - part;
            if left >= rest {
                left -= rest;
                whole += 1;
                part = 0;
            } else {
                part += left;
                left = 0;
            }
        }
        // zero-length replies after the last byte written count as written
        while whole < replies.len() && part == 0 && replies[whole].wire_bytes() == 0 {
            whole += 1;
        }
        if whole == replies.len() {
            return (whole, 0);
        }
    }
}

/// One non-blocking sendmsg; EINTR is retried.
fn send_iov(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    loop {
        // SAFETY: every iovec points into a reply buffer that `replies` (borrowed by
        // the caller for the whole call) keeps alive and unmoved; msghdr is zeroed
        // and then given only the iovec array and its length. The descriptor is open:
        // the caller holds the line's lock and saw `closed == false` (module comment).
        let sent = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov.len() as _;
            libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use tokio::sync::Semaphore;

    fn reply(frontend: &Frontend, bytes: Vec<u8>) -> Reply {
        Reply::new_for_test(bytes, Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(), frontend.memory.share().try_acquire(256).unwrap())
    }

    fn pending(peer: &mut std::os::unix::net::UnixStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match peer.read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return got,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// While the writer task holds a group (it writes outside the lock), a finishing
    /// thread must queue its reply, not write it: its bytes would land in the middle of
    /// the writer's. And a burst above DIRECT_WRITE_BYTES_MAX goes to the writer even
    /// when the line is idle. Both decided on an idle socket with room, so a direct
    /// write, if made, would show at the peer at once.
    #[test]
    fn replies_queue_behind_a_busy_writer_and_large_bursts_go_to_the_writer() {
        let frontend = Frontend::new(Arc::new(zilla_frontend::StaticRegistry::new()), zilla_frontend::FrontendConfig::default());
        let (ours, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        peer.set_nonblocking(true).unwrap();
        let (line, sender) = ReplyLine::new(Some(std::os::fd::AsRawFd::as_raw_fd(&ours)), Arc::new(NbdStats::default()));

        // idle line, small reply: written at once by this thread
        sender.send(vec![reply(&frontend, b"first".to_vec())], &frontend);
        assert_eq!(pending(&mut peer), b"first");

        // a large burst: queued for the writer, nothing written here
        sender.send(vec![reply(&frontend, vec![7u8; DIRECT_WRITE_BYTES_MAX + 1])], &frontend);
        assert!(pending(&mut peer).is_empty(), "a burst above the cap was written by the finishing thread");
        let Take::Group(group, skip) = line.take(64, 1 << 20) else { panic!("the large reply was not queued") };
        assert_eq!((group.len(), skip), (1, 0));

        // the writer holds that group: a small reply now must queue behind it
        sender.send(vec![reply(&frontend, b"second".to_vec())], &frontend);
        assert!(pending(&mut peer).is_empty(), "a reply was written while the writer held a group");
        drop(group);
        let Take::Group(group, _) = line.take(64, 1 << 20) else { panic!("the small reply was not queued") };
        assert_eq!(group[0].head(), b"second");
        drop(group);

        // the writer found the queue empty: idle again, direct writes resume
        assert!(matches!(line.take(64, 1 << 20), Take::Wait));
        sender.send(vec![reply(&frontend, b"third".to_vec())], &frontend);
        assert_eq!(pending(&mut peer), b"third");
        drop(ours);
    }

    /// Many threads finishing at once, a writer thread taking what they queue (a
    /// direct write the socket took in part): every reply arrives whole, none lost,
    /// none interleaved with another, each thread's in its order (each reply is one
    /// 64-byte record of its thread and number).
    #[test]
    fn replies_from_many_finishing_threads_arrive_whole() {
        const THREADS: usize = 6;
        const EACH: usize = 2000;
        const RECORD: usize = 64;
        let frontend = Frontend::new(Arc::new(zilla_frontend::StaticRegistry::new()), zilla_frontend::FrontendConfig::default());
        let (ours, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        peer.set_nonblocking(true).unwrap();
        // a small send buffer, so direct writes are often taken in part
        let sndbuf: libc::c_int = 4096;
        // SAFETY: a valid descriptor and an int option of the right size.
        let rc = unsafe {
            libc::setsockopt(std::os::fd::AsRawFd::as_raw_fd(&ours), libc::SOL_SOCKET, libc::SO_SNDBUF,
                             &sndbuf as *const libc::c_int as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t)
        };
        assert_eq!(rc, 0);
        let stats = Arc::new(NbdStats::default());
        let (line, sender) = ReplyLine::new(Some(std::os::fd::AsRawFd::as_raw_fd(&ours)), stats.clone());
        let mut got = Vec::new();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (sender, frontend) = (sender.clone(), &frontend);
                s.spawn(move || {
                    for n in 0..EACH {
                        let mut record = vec![(t as u8) + 1; RECORD];
                        record[..8].copy_from_slice(&(n as u64).to_le_bytes());
                        sender.send(vec![reply(frontend, record)], frontend);
                    }
                });
            }
            drop(sender);
            // the writer task's part, on a thread: what it takes goes into the socket
            let (line, ours) = (&line, &ours);
            s.spawn(move || loop {
                match line.take(64, 1 << 20) {
                    Take::Group(group, skip) => {
                        let bytes: Vec<u8> = group.iter().flat_map(|r| r.pieces().flatten().copied()).collect();
                        std::io::Write::write_all(&mut &*ours, &bytes[skip..]).unwrap();
                    }
                    Take::Wait => std::thread::sleep(std::time::Duration::from_micros(50)),
                    Take::Done => return,
                }
            });
            // the client reads while they send
            while got.len() < THREADS * EACH * RECORD {
                got.extend(pending(&mut peer));
            }
        });
        assert_eq!(got.len(), THREADS * EACH * RECORD);
        let mut next = [0u64; THREADS];
        for record in got.chunks(RECORD) {
            let t = record[8] as usize - 1;
            assert!(record[8..].iter().all(|&b| b == record[8]), "a record was interleaved with another");
            assert_eq!(u64::from_le_bytes(record[..8].try_into().unwrap()), next[t], "thread {t}'s replies out of order or lost");
            next[t] += 1;
        }
        let (direct, by_writer) = (stats.replies_written_direct.load(Ordering::Relaxed), stats.replies_written_by_writer.load(Ordering::Relaxed));
        eprintln!("replies written directly {direct}, by the writer {by_writer}");
        assert!(direct > 0 && by_writer > 0, "one way was not used: direct {direct}, writer {by_writer}");
        drop(ours);
    }
}
