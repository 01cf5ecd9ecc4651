//! transmission: the pipelined request loop of one connection.
//!
//! ```text
//!   socket read half                                             socket write half
//!        |                                                              ^
//!   [reader loop] --admit--> zilla_frontend::Executor::submit           |
//!        |                     inline completion -> reply batch --------+
//!        |                     later completion (engine thread, blocking |
//!        |                     pool, delay task) -> NbdCompleter --------+
//!        |                                                    (writes at once if the
//!        |                                                     socket is idle, else
//!        |                                                     queues for [writer task])
//! ```
//!
//! This module is the NBD protocol only: the reader parses one 28-byte header at a
//! time, validates it against the session ([`proto::validate_request`]), reads a WRITE
//! payload into a buffer of the front ends' pool, turns the request into an owned
//! [`zilla_frontend::Command`] and submits it to the connection's
//! [`zilla_frontend::Executor`], which decides how it runs (inline, on the throttle
//! timer, through an engine completion or on the blocking pool), takes the volume-call
//! budget and records the statistics. The one completion of each request comes back
//! either at once (then its reply joins the reader's batch) or later on any thread
//! (then [`NbdCompleter`] encodes and sends it). Each reply is one contiguous `Reply`
//! (header and data together, or the header and the volume's shared block buffers), so
//! no reply interleaves with another; the connection's writer puts whatever is queued
//! on the wire with vectored writes (one system call per burst, no copy into a staging
//! buffer). Replies leave in completion order; the cookie ties them to requests.
//!
//! Bounds. Every request, refused ones included, holds an admission (one of
//! `in_flight_requests_max` request slots and a share of the daemon-wide memory budget,
//! [`zilla_frontend::SharedBudget`]; READ/WRITE count their length) from the moment the
//! reader takes it until the writer has put its reply on the wire. The reply queue is
//! unbounded because the admissions already bound it, so a finishing thread never
//! waits for a client: when a client stops reading, its replies wait in its own queue,
//! its budget runs out, and its own reader stops reading requests. Nobody else waits
//! for it. Its writer gives up when the socket accepts nothing for
//! `reply_stall_timeout` and the connection closes, returning its budget.
//!
//! READ/WRITE lengths above `payload_max_bytes` get EINVAL; for a WRITE the payload
//! cannot be skipped safely, so the connection is then closed. BLOCK_STATUS returns at
//! most `BLOCK_STATUS_EXTENTS_MAX` extents of at most
//! [`zilla_frontend::executor::BLOCK_STATUS_SPAN_MAX_BYTES`].
//!
//! Ending: NBD_CMD_DISC, EOF, a bad magic, an I/O error, the idle timeout (nothing in
//! flight and no request for `idle_timeout`: the client sees the connection closed, as
//! on a server restart) or an eviction by the accept loop stop the reader; then the
//! connection waits for in-flight requests (bounded by `shutdown_grace`) and lets the
//! writer drain before closing. When the server's shutdown signal fires, new requests
//! are answered ESHUTDOWN while in-flight ones finish, and the connection closes as
//! soon as nothing is in flight or the grace period ends, whichever is first; a writer
//! still stuck on a client that does not read is then aborted.
//!
//! Errors on the wire: EINVAL (bad range, bad flags, unknown command, BLOCK_STATUS
//! without a negotiated context), ENOSPC (write past end), EPERM (read-only), the
//! volume's errno mapped by [`proto::nbd_error_from_errno`], ESHUTDOWN when stopping.
//! READ and BLOCK_STATUS errors use structured ERROR chunks once structured replies are
//! negotiated; everything else uses simple replies, which the spec allows.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;
use zilla_frontend::volume::{AlignedBuf, Extent, WriteData};
use zilla_frontend::executor::BLOCK_STATUS_SPAN_MAX_BYTES;
use zilla_frontend::{
    Admission, Blocked, ClientIoStats, Command, Completer, Completion, Executor, Frontend, IoKind, Output, ReadData, Submitted,
};

use crate::connection_slot::ConnectionSlot;
use crate::framing::FrameReader;
use crate::handshake::Session;
use crate::proto::*;
use crate::reply_line::{DirectFd, Reply, ReplyLine, ReplySender, Take, WriterGuard, IOV_MAX};
use crate::stats::NbdStats;
use crate::NbdConfig;

/// Most extents returned in one BLOCK_STATUS reply (the spec allows up to 2^20).
pub const BLOCK_STATUS_EXTENTS_MAX: usize = 1 << 16;
/// Inline replies gathered before the reader hands them to the writer.
const REPLY_BATCH_MAX: usize = 64;
/// Replies the writer puts on the wire with one vectored write, at most.
const GATHER_REPLIES_MAX: usize = 64;
/// Bytes the writer gathers into one vectored write, at most (a larger reply goes alone).
const GATHER_BYTES_MAX: usize = 1 << 20;
/// Memory units charged for a reply without data (header, error text, bookkeeping).
const SMALL_REPLY_UNITS: usize = 256;
/// Memory units charged for a BLOCK_STATUS reply (its largest size).
const BLOCK_STATUS_REPLY_UNITS: usize = 32 + 8 * BLOCK_STATUS_EXTENTS_MAX;
/// "Never" for a disabled idle timeout.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// How a session's replies are encoded and where they go; shared by its requests'
/// completions.
struct ReplyContext {
    structured_replies: bool,
    base_allocation_context_id: Option<u32>,
    replies: ReplySender,
    frontend: Arc<Frontend>,
}

/// What a session's statistics are kept with: its client's row (the labels of its
/// recorder) and the server's connection counters.
#[derive(Clone)]
pub(crate) struct SessionRecorders {
    pub(crate) client: Arc<ClientIoStats>,
    pub(crate) server: Arc<NbdStats>,
}

/// The completer of one submitted request: encodes its completion and sends the reply.
struct NbdCompleter {
    context: Arc<ReplyContext>,
    request: Request,
}

impl Completer for NbdCompleter {
    fn complete(self, completion: Completion) {
        let reply = self.context.reply(&self.request, completion);
        self.context.send(vec![reply]);
    }
}

impl ReplyContext {
    /// Write the replies now if the connection's write side is idle, else queue them
    /// for the writer ([`crate::reply_line`]). Never blocks; if the writer is gone the
    /// replies (and their budget) are dropped.
    fn send(&self, replies: Vec<Reply>) {
        self.replies.send(replies, &self.frontend);
    }

    fn read_prefix_bytes(&self) -> usize {
        if self.structured_replies { OFFSET_DATA_PREFIX_BYTES } else { SIMPLE_REPLY_HEADER_BYTES }
    }

    /// The executor's command for a validated request (`None`: not one it runs).
    fn command(&self, request: &Request, payload: WriteData) -> Option<Command> {
        let (offset, length) = (request.offset, u64::from(request.length));
        let fua = request.flags & CMD_FLAG_FUA != 0;
        Some(match request.command {
            CMD_READ => Command::Read {
                offset,
                length: request.length,
                prefix_bytes: self.read_prefix_bytes(),
                holes: self.structured_replies,
            },
            CMD_WRITE => Command::Write { offset, data: payload, fua },
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Unmap { offset, length, fua },
            // NO_HOLE asks for provisioned zeros; a copy-on-write pool cannot promise
            // space for future overwrites either way, so zeroing is done the cheap way
            // (which also makes FAST_ZERO always succeed).
            CMD_WRITE_ZEROES => Command::WriteZeroes { offset, length, fua },
            CMD_BLOCK_STATUS => Command::BlockStatus { offset, length },
            CMD_CACHE => Command::Prefetch { offset, length },
            _ => return None,
        })
    }

    /// Encode a request's completion as its reply.
    fn reply(&self, request: &Request, completion: Completion) -> Reply {
        let Completion { result, admission } = completion;
        let bytes = match result {
            Ok(Output::Data(data)) => return self.read_reply(request, data, admission),
            Ok(Output::Extents(extents)) => self.block_status_reply(request, &extents),
            Ok(Output::Done) => return simple_reply_inline(0, request.cookie, admission),
            Ok(Output::Miscompare { .. }) => return simple_reply_inline(NBD_EIO, request.cookie, admission),
            Err(error) => self.error_reply_bytes(request, nbd_error_from_errno(error.errno()), "request failed"),
        };
        Reply::new(bytes, admission)
    }

    /// The reply to a READ: the header in front of the data the executor placed after
    /// the prefix, or the header followed by the volume's shared block buffers.
    fn read_reply(&self, request: &Request, data: ReadData, admission: Admission) -> Reply {
        match data {
            ReadData::Copied(buffer) if request.length == 0 => {
                self.frontend.buffers.give(buffer);
                let empty = self.read_reply_empty(request.cookie);
                Reply::with_head(&empty, Vec::new(), admission)
            }
            ReadData::Copied(mut buffer) => {
                self.finish_read_reply(request, &mut buffer);
                Reply::new(buffer, admission)
            }
            ReadData::Shared(pieces) => {
                let mut head = [0u8; OFFSET_DATA_PREFIX_BYTES];
                let head = &mut head[..self.read_prefix_bytes()];
                self.finish_read_reply(request, head);
                Reply::with_head(head, pieces, admission)
            }
            ReadData::Hole => {
                let mut payload = [0u8; 12];
                payload[..8].copy_from_slice(&request.offset.to_be_bytes());
                payload[8..].copy_from_slice(&request.length.to_be_bytes());
                let mut reply = Vec::with_capacity(CHUNK_HEADER_BYTES + 12);
                push_chunk(&mut reply, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE, request.cookie, &payload);
                Reply::with_head(&reply, Vec::new(), admission)
            }
        }
    }

    /// Fill in the header in front of read data already placed after the prefix.
    fn finish_read_reply(&self, request: &Request, buffer: &mut [u8]) {
        if self.structured_replies {
            let chunk_bytes = 8 + request.length; // offset + data; length <= payload cap
            encode_chunk_header(buffer, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, request.cookie, chunk_bytes);
            buffer[CHUNK_HEADER_BYTES..OFFSET_DATA_PREFIX_BYTES].copy_from_slice(&request.offset.to_be_bytes());
        } else {
            encode_simple_reply_header(buffer, 0, request.cookie);
        }
    }

    fn read_reply_empty(&self, cookie: u64) -> Vec<u8> {
        if self.structured_replies {
            let mut reply = Vec::with_capacity(CHUNK_HEADER_BYTES);
            push_chunk(&mut reply, REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, &[]);
            reply
        } else {
            simple_reply(0, cookie)
        }
    }

    /// An error reply: a structured ERROR chunk for READ and BLOCK_STATUS once
    /// structured replies are negotiated, a simple reply otherwise.
    fn error_reply_bytes(&self, request: &Request, error: u32, message: &str) -> Vec<u8> {
        if self.structured_replies && matches!(request.command, CMD_READ | CMD_BLOCK_STATUS) {
            let mut reply = Vec::new();
            push_error_chunk(&mut reply, request.cookie, error, message);
            reply
        } else {
            simple_reply(error, request.cookie)
        }
    }

    /// BLOCK_STATUS for base:allocation: holes are HOLE|ZERO, data is 0.
    fn block_status_reply(&self, request: &Request, extents: &[Extent]) -> Vec<u8> {
        let Some(context_id) = self.base_allocation_context_id else {
            return self.error_reply_bytes(request, NBD_EINVAL, "no meta context selected");
        };
        let span_bytes = u64::from(request.length).min(BLOCK_STATUS_SPAN_MAX_BYTES);
        let extents_max = if request.flags & CMD_FLAG_REQ_ONE != 0 { 1 } else { BLOCK_STATUS_EXTENTS_MAX };
        let mut payload = Vec::with_capacity(4 + 8 * extents.len().min(extents_max));
        payload.extend_from_slice(&context_id.to_be_bytes());
        let mut described = 0usize;
        for extent in extents.iter().filter(|e| e.length > 0).take(extents_max) {
            // Extents lie inside the span (<= 1 GiB), so their length fits 32 bits.
            let length = u32::try_from(extent.length).unwrap_or(u32::MAX);
            let flags = if extent.hole { STATE_HOLE | STATE_ZERO } else { 0 };
            payload.extend_from_slice(&length.to_be_bytes());
            payload.extend_from_slice(&flags.to_be_bytes());
            described += 1;
        }
        if described == 0 {
            // The volume returned nothing usable: describe the span as allocated data,
            // which is always a truthful answer.
            payload.extend_from_slice(&(span_bytes as u32).to_be_bytes());
            payload.extend_from_slice(&0u32.to_be_bytes());
        }
        let mut reply = Vec::with_capacity(CHUNK_HEADER_BYTES + payload.len());
        push_chunk(&mut reply, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, request.cookie, &payload);
        reply
    }
}

/// A simple reply kept inline in its [`Reply`] (no allocation).
fn simple_reply_inline(error: u32, cookie: u64, admission: Admission) -> Reply {
    let mut head = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    encode_simple_reply_header(&mut head, error, cookie);
    Reply::with_head(&head, Vec::new(), admission)
}

fn simple_reply(error: u32, cookie: u64) -> Vec<u8> {
    let mut reply = vec![0u8; SIMPLE_REPLY_HEADER_BYTES];
    encode_simple_reply_header(&mut reply, error, cookie);
    reply
}

/// How the statistics count an NBD command.
fn io_kind(command: u16) -> IoKind {
    match command {
        CMD_READ => IoKind::Read,
        CMD_WRITE => IoKind::Write,
        CMD_FLUSH => IoKind::Flush,
        CMD_TRIM => IoKind::Trim,
        CMD_WRITE_ZEROES => IoKind::WriteZeroes,
        _ => IoKind::Other,
    }
}

/// Why the reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReaderEnd {
    Disconnect,
    ClientGone,
    ProtocolError,
    Shutdown,
    IdleTimeout,
    Evicted,
    WriterGone,
}

/// Run the transmission phase until the client leaves or the server stops.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run<R, W>(
    mut reader: FrameReader<R>,
    writer: W,
    session: Session,
    config: &NbdConfig,
    frontend: &Arc<Frontend>,
    slot: &ConnectionSlot,
    recorders: SessionRecorders,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + DirectFd + Unpin + Send + 'static,
{
    let (line, reply_sender) = ReplyLine::new(writer.direct_fd(), recorders.server.clone());
    let writer_task = spawn_writer(writer, line, frontend.clone(), config.reply_stall_timeout);
    let (limits, context, executor) = session_context(&session, config, frontend, reply_sender, &recorders);

    let mut watch = ReaderWatch::new(shutdown, config);
    slot.touch();
    // Replies produced inline by the reader, handed to the writer as one batch when the
    // reader runs out of buffered requests (one wake-up and one write per batch).
    let mut batch: Vec<Reply> = Vec::new();
    let end = loop {
        if !batch.is_empty() && (reader.buffered_bytes() < REQUEST_HEADER_BYTES || batch.len() >= REPLY_BATCH_MAX) {
            context.send(std::mem::take(&mut batch));
        }
        let header = match watch.next_header(&mut reader, &executor, &context, slot).await {
            NextHeader::Header(header) => header,
            NextHeader::Again => continue,
            NextHeader::End(end) => break end,
        };
        let started_ns = executor.now_ns();
        watch.last_request = Instant::now();
        slot.touch();
        let Ok(header) = header else { break ReaderEnd::ClientGone };
        let Ok(request) = parse_request(&header) else {
            tracing::debug!("nbd: bad request magic, closing");
            break ReaderEnd::ProtocolError;
        };
        if request.command == CMD_DISC {
            break ReaderEnd::Disconnect;
        }
        let verdict = if watch.stopping { Err(NBD_ESHUTDOWN) } else { validate_request(&request, &limits) };
        let step = take_request(&mut reader, &context, &executor, &mut batch, request, verdict, config, started_ns);
        if let Err(end) = step.await {
            break end;
        }
    };
    context.send(std::mem::take(&mut batch));
    if end == ReaderEnd::IdleTimeout {
        recorders.server.connections_idle_timed_out.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!("nbd: closing a connection idle for {:?}", config.idle_timeout);
    } else {
        tracing::debug!(?end, "nbd: connection reader stopped");
    }
    finish(context, executor, writer_task, end, watch.stop_deadline, config).await
}

/// What the reader waits for besides the next request: the server's shutdown signal,
/// the shutdown grace period, the writer going away, an eviction, the idle timeout.
struct ReaderWatch {
    shutdown: watch::Receiver<bool>,
    stopping: bool,
    stop_deadline: Instant,
    shutdown_grace: Duration,
    idle_timeout: Duration,
    /// Armed once and re-armed only when it fires: no timer is touched per request.
    idle_timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    last_request: Instant,
}

/// The outcome of [`ReaderWatch::next_header`].
enum NextHeader {
    Header(io::Result<[u8; REQUEST_HEADER_BYTES]>),
    /// Something was handled; ask again.
    Again,
    End(ReaderEnd),
}

impl ReaderWatch {
    fn new(shutdown: watch::Receiver<bool>, config: &NbdConfig) -> ReaderWatch {
        let idle_timeout = if config.idle_timeout.is_zero() { FAR_FUTURE } else { config.idle_timeout };
        let now = Instant::now();
        let stopping = *shutdown.borrow();
        ReaderWatch {
            stopping,
            shutdown,
            stop_deadline: now + config.shutdown_grace,
            shutdown_grace: config.shutdown_grace,
            idle_timeout,
            idle_timer: Box::pin(tokio::time::sleep_until(now + idle_timeout)),
            last_request: now,
        }
    }

    /// The next request header, or what happened instead. A header already buffered
    /// while nothing is signalled is taken without polling the other events (they are
    /// looked at again once the buffered requests are used up).
    async fn next_header<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut FrameReader<R>,
        executor: &Executor,
        context: &ReplyContext,
        slot: &ConnectionSlot,
    ) -> NextHeader {
        if context.replies.line().is_closed() {
            // the client is gone: requests it left buffered are not run
            return NextHeader::End(ReaderEnd::WriterGone);
        }
        if !self.stopping && reader.buffered_bytes() >= REQUEST_HEADER_BYTES && matches!(self.shutdown.has_changed(), Ok(false)) {
            return NextHeader::Header(reader.read_array::<REQUEST_HEADER_BYTES>().await);
        }
        tokio::select! {
            biased;
            changed = self.shutdown.changed(), if !self.stopping => {
                // A dropped sender means the server itself is gone: stop as well.
                if changed.is_err() || *self.shutdown.borrow() {
                    self.stopping = true;
                    self.stop_deadline = Instant::now() + self.shutdown_grace;
                }
                NextHeader::Again
            }
            _ = executor.idle(), if self.stopping => NextHeader::End(ReaderEnd::Shutdown),
            _ = tokio::time::sleep_until(self.stop_deadline), if self.stopping => NextHeader::End(ReaderEnd::Shutdown),
            _ = context.replies.line().closed() => NextHeader::End(ReaderEnd::WriterGone),
            _ = slot.evict.notified() => {
                if executor.nothing_in_flight() { NextHeader::End(ReaderEnd::Evicted) } else { NextHeader::Again }
            }
            _ = self.idle_timer.as_mut() => {
                // The timer is not moved per request: when it fires, a later request
                // moves it to that request's deadline.
                let now = Instant::now();
                let idle_until = self.last_request + self.idle_timeout;
                if now < idle_until {
                    self.idle_timer.as_mut().reset(idle_until);
                    return NextHeader::Again;
                }
                if executor.nothing_in_flight() {
                    return NextHeader::End(ReaderEnd::IdleTimeout);
                }
                self.idle_timer.as_mut().reset(now + self.idle_timeout);
                NextHeader::Again
            }
            header = reader.read_array::<REQUEST_HEADER_BYTES>() => NextHeader::Header(header),
        }
    }
}

/// The request limits, the reply context and the executor of one session.
fn session_context(
    session: &Session,
    config: &NbdConfig,
    frontend: &Arc<Frontend>,
    replies: ReplySender,
    recorders: &SessionRecorders,
) -> (RequestLimits, Arc<ReplyContext>, Executor) {
    let volume = session.export.volume.clone();
    let limits = RequestLimits {
        export_bytes: volume.size(),
        read_only: volume.read_only(),
        structured_replies: session.structured_replies,
        block_status_enabled: session.base_allocation_context_id.is_some(),
        payload_max_bytes: config.payload_max_bytes,
    };
    let context = Arc::new(ReplyContext {
        structured_replies: session.structured_replies,
        base_allocation_context_id: session.base_allocation_context_id,
        replies,
        frontend: frontend.clone(),
    });
    let labels = zilla_frontend::SessionLabels { protocol: "nbd", client: Some(recorders.client.clone()) };
    let executor = Executor::new(frontend, volume, &session.export.name, config.in_flight_requests_max, labels);
    (limits, context, executor)
}

/// After the reader stopped: let in-flight requests finish and the writer drain, both
/// bounded by the grace period; then abort a writer stuck on a client that does not read.
async fn finish(
    context: Arc<ReplyContext>,
    executor: Executor,
    writer_task: tokio::task::JoinHandle<io::Result<()>>,
    end: ReaderEnd,
    stop_deadline: Instant,
    config: &NbdConfig,
) -> io::Result<()> {
    let deadline = if end == ReaderEnd::Shutdown { stop_deadline } else { Instant::now() + config.shutdown_grace };
    if end != ReaderEnd::WriterGone {
        let _ = tokio::time::timeout_at(deadline, executor.idle()).await;
    }
    drop((context, executor));
    let writer_abort = writer_task.abort_handle();
    match tokio::time::timeout_at(deadline + Duration::from_millis(500), writer_task).await {
        Ok(Ok(result)) => result,
        Ok(Err(_join_error)) => Ok(()),
        Err(_elapsed) => {
            writer_abort.abort();
            Ok(())
        }
    }
}

/// Memory units a request holds until its reply is written.
fn memory_units(context: &ReplyContext, request: &Request) -> usize {
    match request.command {
        CMD_READ => request.length as usize + context.read_prefix_bytes(),
        CMD_WRITE => request.length as usize + SMALL_REPLY_UNITS,
        CMD_BLOCK_STATUS => BLOCK_STATUS_REPLY_UNITS,
        _ => SMALL_REPLY_UNITS,
    }
}

/// Take an admission of `units`: at once if possible, otherwise hand the inline batch
/// (which holds budget) to the writer first and wait. Waiting stalls only this reader.
async fn admit(executor: &Executor, context: &ReplyContext, batch: &mut Vec<Reply>, units: usize) -> Admission {
    executor.admit(units, || context.send(std::mem::take(batch))).await
}

/// Read the rest of one request (its payload) and answer or submit it. `Err` ends the
/// connection.
#[allow(clippy::too_many_arguments)]
async fn take_request<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    context: &Arc<ReplyContext>,
    executor: &Executor,
    batch: &mut Vec<Reply>,
    request: Request,
    verdict: Result<(), u32>,
    config: &NbdConfig,
    started_ns: u64,
) -> Result<(), ReaderEnd> {
    let has_payload = request.command == CMD_WRITE;
    if has_payload && request.length > config.payload_max_bytes {
        tracing::debug!(length = request.length, "nbd: write payload over the cap, closing");
        let admission = admit(executor, context, batch, SMALL_REPLY_UNITS).await;
        batch.push(Reply::new(context.error_reply_bytes(&request, NBD_EINVAL, "payload too large"), admission));
        return Err(ReaderEnd::ProtocolError);
    }
    if let Err(error) = verdict {
        if has_payload && reader.skip(u64::from(request.length)).await.is_err() {
            return Err(ReaderEnd::ClientGone);
        }
        let admission = admit(executor, context, batch, SMALL_REPLY_UNITS).await;
        executor.refuse(io_kind(request.command), u64::from(request.length), started_ns);
        batch.push(Reply::new(context.error_reply_bytes(&request, error, ""), admission));
        return Ok(());
    }
    let units = memory_units(context, &request);
    let admission = match executor.try_admit(units) {
        Some(admission) => admission,
        None => admit(executor, context, batch, units).await,
    };
    let payload = if has_payload {
        // read off the socket into block buffers of the slab, cut at the volume's
        // block boundaries: a whole block's buffer becomes the block itself. A client
        // gone mid-payload leaves nothing behind (the pieces are dropped unseen).
        let mut pieces = Vec::new();
        for n in WriteData::cut(request.offset, u64::from(request.length), executor.block_bytes()) {
            let mut piece = AlignedBuf::for_overwrite(n);
            if reader.read_into(&mut piece).await.is_err() {
                return Err(ReaderEnd::ClientGone);
            }
            pieces.push(std::sync::Arc::new(piece));
        }
        WriteData::from_pieces(pieces)
    } else {
        WriteData::default()
    };
    if let Some(blocked) = submit(context, executor, request, payload, admission, batch, started_ns) {
        executor.resume(blocked, || context.send(std::mem::take(batch))).await;
    }
    Ok(())
}

/// Hand one validated request to the executor. An inline completion's reply goes into
/// `batch`; a later one is sent by its [`NbdCompleter`]. Not async: a request that
/// must wait for a permit comes back for the caller to `resume`.
fn submit(
    context: &Arc<ReplyContext>,
    executor: &Executor,
    request: Request,
    payload: WriteData,
    admission: Admission,
    batch: &mut Vec<Reply>,
    started_ns: u64,
) -> Option<Blocked<NbdCompleter>> {
    let Some(command) = context.command(&request, payload) else {
        executor.refuse(io_kind(request.command), u64::from(request.length), started_ns);
        batch.push(simple_reply_inline(NBD_EINVAL, request.cookie, admission));
        return None;
    };
    let completer = || NbdCompleter { context: context.clone(), request };
    match executor.submit(zilla_frontend::Request { command, started_ns }, admission, completer) {
        Submitted::Inline(completion) => {
            batch.push(context.reply(&request, completion));
            None
        }
        Submitted::Started => None,
        Submitted::Blocked(blocked) => Some(blocked),
    }
}

fn stalled() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "client stopped reading replies")
}

/// The writer task: write the replies queued on the line ([`crate::reply_line`]) in
/// the order they completed: those the finishing threads could not write at once (the
/// socket was full, or another write was in progress). Each group of at most
/// `GATHER_REPLIES_MAX` replies and `GATHER_BYTES_MAX` bytes goes out by vectored writes
/// straight from the reply buffers: one system call for a burst of replies, and read
/// data is copied once (volume -> reply), never again into a staging buffer. A group's
/// reply buffers go back to the daemon-wide pool, and its budget is released, once the
/// group is on the wire. A socket that accepts nothing for `stall` ends the task (and
/// with it the connection); the queued replies and their budget are dropped.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut guard: WriterGuard<W>,
    line: Arc<ReplyLine>,
    frontend: Arc<Frontend>,
    stall: Duration,
) -> io::Result<()> {
    let stall = if stall.is_zero() { FAR_FUTURE } else { stall };
    loop {
        let (group, skip) = match line.take(GATHER_REPLIES_MAX, GATHER_BYTES_MAX) {
            Take::Group(group, skip) => (group, skip),
            Take::Wait => {
                line.wait_for_replies().await;
                continue;
            }
            Take::Done => break,
        };
        let written = write_gathered(guard.writer(), &group, skip, stall).await;
        for reply in group {
            reply.recycle(&frontend);
        }
        if let Err(error) = written {
            tracing::info!(%error, "nbd: closing connection");
            return Err(error);
        }
    }
    let _ = tokio::time::timeout(stall, guard.writer().shutdown()).await;
    Ok(())
}

/// Start the writer task. The write half goes into its [`WriterGuard`] here, before
/// the spawn: a task dropped before its first poll (aborted early, or spawned while the
/// runtime shuts down) drops the guard too, and so closes the line before the half. A
/// guard made inside the task would not exist then, and once the read half went as
/// well, finishing threads would write replies to a closed, perhaps reused, descriptor.
fn spawn_writer<W>(writer: W, line: Arc<ReplyLine>, frontend: Arc<Frontend>, stall: Duration) -> tokio::task::JoinHandle<io::Result<()>>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let guard = WriterGuard::new(line.clone(), frontend.clone(), writer);
    tokio::spawn(write_replies(guard, line, frontend, stall))
}

/// Write every byte of `group` in order, but the first `skip` (already on the wire),
/// with vectored writes; each write must make progress within `stall`.
async fn write_gathered<W: AsyncWrite + Unpin>(writer: &mut W, group: &[Reply], mut skip: usize, stall: Duration) -> io::Result<()> {
    let mut segments: Vec<&[u8]> = Vec::new();
    for piece in group.iter().flat_map(Reply::pieces) {
        if skip >= piece.len() {
            skip -= piece.len();
        } else {
            segments.push(&piece[skip..]);
            skip = 0;
        }
    }
    // The first unwritten byte is segments[index][offset].
    let (mut index, mut offset) = (0, 0);
    while index < segments.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(&segments[index][offset..])
            .chain(segments[index + 1..].iter().copied())
            .take(IOV_MAX)
            .map(IoSlice::new)
            .collect();
        let mut written = tokio::time::timeout(stall, writer.write_vectored(&slices)).await.map_err(|_| stalled())??;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        // `written` never exceeds what is left, so `index` stays in range.
        while written > 0 {
            let left = segments[index].len() - offset;
            if written < left {
                offset += written;
                written = 0;
            } else {
                written -= left;
                index += 1;
                offset = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A writer task dropped before it ever ran (aborted at once here; spawned on a
    /// runtime that is shutting down, in the daemon) must still close the line: once
    /// both halves are gone the descriptor number is free, and a reply finished later
    /// (an engine thread's commit) must not be written to whatever socket or file took
    /// that number.
    #[test]
    fn a_writer_dropped_before_its_first_poll_closes_the_line() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let frontend = Frontend::new(Arc::new(zilla_frontend::StaticRegistry::new()), zilla_frontend::FrontendConfig::default());
        let sender = runtime.block_on(async {
            let (server, client) = tokio::net::UnixStream::pair().unwrap();
            let (read_half, write_half) = server.into_split();
            let (line, sender) = ReplyLine::new(write_half.direct_fd(), Arc::new(NbdStats::default()));
            // current-thread runtime: the task cannot run before this task yields
            let task = spawn_writer(write_half, line, frontend.clone(), Duration::from_secs(1));
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            drop((read_half, client));
            sender
        });
        // the connection's descriptor number goes to a new, unrelated socket pair
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        let budget = Admission::from_parts(
            Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().unwrap(),
            frontend.memory.share().try_acquire(SMALL_REPLY_UNITS).unwrap(),
        );
        sender.send(vec![Reply::new(simple_reply(0, 7), budget)], &frontend);
        let mut byte = [0u8; 64];
        for (name, socket) in [("a", &mut a), ("b", &mut b)] {
            match socket.read(&mut byte) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                other => panic!("a reply went to an unrelated socket ({name}): {other:?}"),
            }
        }
        assert_eq!(frontend.memory.stats().in_use, 0, "the dropped reply released its memory");
    }
}
