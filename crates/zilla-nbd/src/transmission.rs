//! transmission: the pipelined request loop of one connection.
//!
//! ```text
//!   socket read half                                             socket write half
//!        |                                                              ^
//!   [reader loop] --budget--> fast path: try_read_cached / try_write ---+
//!        |                     (inline on the reactor, no thread hop)   |
//!        +--call permit--> spawn_blocking(volume call) --> Reply --> [writer task]
//!        +--call permit--> read_async / flush_async: the engine thread that completes
//!                          the device I/O replies (a cache-miss READ, a FLUSH, a FUA write)
//!                          (never waits on a socket: the         (unbounded queue,
//!                           reply queue cannot block)             bounded by budget)
//! ```
//!
//! The reader parses one 28-byte header at a time, validates it against the session
//! ([`proto::validate_request`]), reads a WRITE payload, and dispatches: reads the
//! volume can serve from memory and writes it can take without blocking are answered
//! inline; a write the write throttle delays claims its turn
//! (`BlockVolume::claim_write_delay`) and waits in its own task on the throttle timer
//! (`zilla_frontend::delay_timer`), holding no thread and no volume call, then is
//! applied like the inline ones; everything else runs on tokio's blocking pool, because
//! `BlockVolume` calls block. Each finished request becomes one contiguous `Reply` buffer (header and data
//! together, so no reply interleaves with another) queued to the connection's own
//! writer task, which puts whatever is queued on the wire with vectored writes (one
//! system call per burst, no copy into a staging buffer). Replies leave in completion
//! order; the cookie ties them to requests.
//!
//! Bounds. Every reply, error replies included, holds a request permit (at most
//! `in_flight_requests_max` per connection) and a share of the daemon-wide memory
//! budget ([`zilla_frontend::SharedBudget`]; READ/WRITE count their length) from the
//! moment the reader takes the request until the writer has put the reply on the
//! wire. A volume call additionally holds a permit of the daemon-wide volume-call
//! budget while it runs on the blocking pool. The reply queue is unbounded because
//! the request permits already bound it, so a blocking thread never waits for a
//! client: when a client stops reading, its replies wait in its own queue, its budget
//! runs out, and its own reader stops reading requests. Nobody else waits for it.
//! Its writer gives up when the socket accepts nothing for `reply_stall_timeout` and
//! the connection closes, returning its budget.
//!
//! READ/WRITE lengths above `payload_max_bytes` get EINVAL; for a WRITE the payload
//! cannot be skipped safely, so the connection is then closed. TRIM and WRITE_ZEROES
//! run as volume calls of at most `ZERO_CALL_MAX_BYTES` each, so a 1 GiB TRIM never
//! holds the volume for one long call. BLOCK_STATUS looks at no more than
//! `BLOCK_STATUS_SPAN_MAX_BYTES` and returns at most `BLOCK_STATUS_EXTENTS_MAX` extents.
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
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use zilla_core::zvol::{BlockVolume, SharedSlice, WriteDelay};
use zilla_frontend::{BudgetPermit, BudgetShare, ClientIoStats, Frontend, IoKind, VolumeIoStats};

use crate::framing::FrameReader;
use crate::handshake::Session;
use crate::proto::*;
use crate::reply_line::{Budget, DirectFd, Reply, ReplyLine, ReplySender, Take, WriterGuard, IOV_MAX};
use crate::connection_slot::ConnectionSlot;
use crate::stats::NbdStats;
use crate::NbdConfig;

/// Largest range one BLOCK_STATUS request examines; clients ask again for the rest.
pub const BLOCK_STATUS_SPAN_MAX_BYTES: u64 = 1 << 30;
/// Most extents returned in one BLOCK_STATUS reply (the spec allows up to 2^20).
pub const BLOCK_STATUS_EXTENTS_MAX: usize = 1 << 16;
/// TRIM / WRITE_ZEROES are applied in volume calls of at most this many bytes.
pub const ZERO_CALL_MAX_BYTES: u64 = 64 << 20;
/// TRIM / WRITE_ZEROES requests one connection may have running at once: they are
/// long and dirty much metadata, so a flood of them must not crowd the txg.
const ZERO_CALLS_PER_CONNECTION: usize = 1;
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

/// The connection's budgets, used by its reader only.
struct Budgets {
    requests: Arc<Semaphore>,
    requests_max: usize,
    memory: BudgetShare,
    volume_calls: BudgetShare,
    /// TRIM / WRITE_ZEROES in flight on this connection (`ZERO_CALLS_PER_CONNECTION`).
    zero_calls: Arc<Semaphore>,
}

impl Budgets {
    fn new(config: &NbdConfig, frontend: &Frontend) -> Budgets {
        // Clamped so that wait_idle's acquire_many(u32) can take every slot.
        let requests_max = config.in_flight_requests_max.clamp(1, u32::MAX as usize);
        Budgets {
            requests: Arc::new(Semaphore::new(requests_max)),
            requests_max,
            memory: frontend.memory.share(),
            volume_calls: frontend.volume_calls.share(),
            zero_calls: Arc::new(Semaphore::new(ZERO_CALLS_PER_CONNECTION)),
        }
    }

    fn nothing_in_flight(&self) -> bool {
        self.requests.available_permits() >= self.requests_max
    }
}

/// Everything a request needs once dispatched; cheap to clone into a blocking task.
#[derive(Clone)]
struct RequestContext {
    volume: Arc<dyn BlockVolume>,
    structured_replies: bool,
    base_allocation_context_id: Option<u32>,
    replies: ReplySender,
    frontend: Arc<Frontend>,
    io_stats: Arc<VolumeIoStats>,
    recorders: SessionRecorders,
}

/// Where a session's requests are counted besides its volume: its client's row and
/// the server's totals.
#[derive(Clone)]
pub(crate) struct SessionRecorders {
    pub(crate) client: Arc<ClientIoStats>,
    pub(crate) server: Arc<NbdStats>,
}

impl RequestContext {
    /// Write the replies now if the connection's write side is idle, else queue them
    /// for the writer ([`crate::reply_line`]). Never blocks; if the writer is gone the
    /// replies (and their budget) are dropped.
    fn send(&self, replies: Vec<Reply>) {
        self.replies.send(replies, &self.frontend);
    }

    fn record(&self, request: &Request, reply: &[u8], started: Instant) {
        let kind = match request.command {
            CMD_READ => IoKind::Read,
            CMD_WRITE => IoKind::Write,
            CMD_FLUSH => IoKind::Flush,
            CMD_TRIM => IoKind::Trim,
            CMD_WRITE_ZEROES => IoKind::WriteZeroes,
            _ => IoKind::Other,
        };
        let latency_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let (bytes, failed) = (u64::from(request.length), reply_failed(reply));
        self.io_stats.record(kind, bytes, latency_ns, failed);
        self.recorders.client.io.record(kind, bytes, latency_ns, failed);
        self.recorders.server.io.record(kind, bytes, latency_ns, failed);
    }
}

/// Whether an encoded reply reports an error (simple reply error field, or a
/// structured chunk of an error type).
fn reply_failed(reply: &[u8]) -> bool {
    if reply.len() < 8 {
        return false;
    }
    match u32::from_be_bytes([reply[0], reply[1], reply[2], reply[3]]) {
        SIMPLE_REPLY_MAGIC => u32::from_be_bytes([reply[4], reply[5], reply[6], reply[7]]) != 0,
        STRUCTURED_REPLY_MAGIC => reply[6] & 0x80 != 0,
        _ => false,
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
    let budgets = Budgets::new(config, frontend);
    let (limits, context) = session_context(&session, config, frontend, reply_sender, recorders);

    let mut watch = ReaderWatch::new(shutdown, config);
    slot.touch();
    // Replies produced inline by the reader, handed to the writer as one batch when the
    // reader runs out of buffered requests (one wake-up and one write per batch).
    let mut batch: Vec<Reply> = Vec::new();
    let end = loop {
        if !batch.is_empty() && (reader.buffered_bytes() < REQUEST_HEADER_BYTES || batch.len() >= REPLY_BATCH_MAX) {
            context.send(std::mem::take(&mut batch));
        }
        let header = match watch.next_header(&mut reader, &budgets, &context, slot).await {
            NextHeader::Header(header) => header,
            NextHeader::Again => continue,
            NextHeader::End(end) => break end,
        };
        let started = Instant::now();
        watch.last_request = started;
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
        let step = take_request(&mut reader, &context, &budgets, &mut batch, request, verdict, config, started);
        if let Err(end) = step.await {
            break end;
        }
    };
    context.send(std::mem::take(&mut batch));
    if end == ReaderEnd::IdleTimeout {
        context.recorders.server.connections_idle_timed_out.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!("nbd: closing a connection idle for {:?}", config.idle_timeout);
    } else {
        tracing::debug!(?end, "nbd: connection reader stopped");
    }
    finish(context, budgets, writer_task, end, watch.stop_deadline, config).await
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
        budgets: &Budgets,
        context: &RequestContext,
        slot: &ConnectionSlot,
    ) -> NextHeader {
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
            _ = wait_idle(budgets), if self.stopping => NextHeader::End(ReaderEnd::Shutdown),
            _ = tokio::time::sleep_until(self.stop_deadline), if self.stopping => NextHeader::End(ReaderEnd::Shutdown),
            _ = context.replies.line().closed() => NextHeader::End(ReaderEnd::WriterGone),
            _ = slot.evict.notified() => {
                if budgets.nothing_in_flight() { NextHeader::End(ReaderEnd::Evicted) } else { NextHeader::Again }
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
                if budgets.nothing_in_flight() {
                    return NextHeader::End(ReaderEnd::IdleTimeout);
                }
                self.idle_timer.as_mut().reset(now + self.idle_timeout);
                NextHeader::Again
            }
            header = reader.read_array::<REQUEST_HEADER_BYTES>() => NextHeader::Header(header),
        }
    }
}

/// The request limits and the dispatch context of one session.
fn session_context(
    session: &Session,
    config: &NbdConfig,
    frontend: &Arc<Frontend>,
    replies: ReplySender,
    recorders: SessionRecorders,
) -> (RequestLimits, RequestContext) {
    let volume = session.export.volume.clone();
    let limits = RequestLimits {
        export_bytes: volume.size(),
        read_only: volume.read_only(),
        structured_replies: session.structured_replies,
        block_status_enabled: session.base_allocation_context_id.is_some(),
        payload_max_bytes: config.payload_max_bytes,
    };
    let context = RequestContext {
        volume,
        structured_replies: session.structured_replies,
        base_allocation_context_id: session.base_allocation_context_id,
        replies,
        frontend: frontend.clone(),
        io_stats: frontend.io_stats.volume(&session.export.name),
        recorders,
    };
    (limits, context)
}

/// After the reader stopped: let in-flight requests finish and the writer drain, both
/// bounded by the grace period; then abort a writer stuck on a client that does not read.
async fn finish(
    context: RequestContext,
    budgets: Budgets,
    writer_task: tokio::task::JoinHandle<io::Result<()>>,
    end: ReaderEnd,
    stop_deadline: Instant,
    config: &NbdConfig,
) -> io::Result<()> {
    let deadline = if end == ReaderEnd::Shutdown { stop_deadline } else { Instant::now() + config.shutdown_grace };
    if end != ReaderEnd::WriterGone {
        let _ = tokio::time::timeout_at(deadline, wait_idle(&budgets)).await;
    }
    drop(context);
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

/// Resolves when every request slot is free, i.e. nothing is in flight.
async fn wait_idle(budgets: &Budgets) {
    let _all = budgets.requests.acquire_many(budgets.requests_max as u32).await;
}

/// Memory units a request holds until its reply is written.
fn memory_units(context: &RequestContext, request: &Request) -> usize {
    match request.command {
        CMD_READ => request.length as usize + read_prefix_bytes(context),
        CMD_WRITE => request.length as usize + SMALL_REPLY_UNITS,
        CMD_BLOCK_STATUS => BLOCK_STATUS_REPLY_UNITS,
        _ => SMALL_REPLY_UNITS,
    }
}

/// Take a request permit and `units` of memory: at once if possible, otherwise hand
/// the inline batch (which holds budget) to the writer first and wait. Waiting here
/// stalls only this connection's reader.
async fn acquire_budget(budgets: &Budgets, context: &RequestContext, batch: &mut Vec<Reply>, units: usize) -> Budget {
    if let Ok(request) = budgets.requests.clone().try_acquire_owned() {
        if let Some(memory) = budgets.memory.try_acquire(units) {
            return Budget { _request: request, _memory: memory };
        }
    }
    context.send(std::mem::take(batch));
    let memory = budgets.memory.acquire(units).await;
    // The semaphore is never closed; if it were, waiting forever is wrong, so make a
    // fresh permit rather than panic.
    let request = match budgets.requests.clone().acquire_owned().await {
        Ok(permit) => permit,
        Err(_) => Arc::new(Semaphore::new(1)).try_acquire_owned().expect("fresh semaphore has a permit"),
    };
    Budget { _request: request, _memory: memory }
}

/// Read the rest of one request (its payload) and answer or dispatch it. `Err` ends
/// the connection.
#[allow(clippy::too_many_arguments)]
async fn take_request<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    context: &RequestContext,
    budgets: &Budgets,
    batch: &mut Vec<Reply>,
    request: Request,
    verdict: Result<(), u32>,
    config: &NbdConfig,
    started: Instant,
) -> Result<(), ReaderEnd> {
    let has_payload = request.command == CMD_WRITE;
    if has_payload && request.length > config.payload_max_bytes {
        tracing::debug!(length = request.length, "nbd: write payload over the cap, closing");
        let budget = acquire_budget(budgets, context, batch, SMALL_REPLY_UNITS).await;
        batch.push(error_reply(context, &request, NBD_EINVAL, "payload too large", budget));
        return Err(ReaderEnd::ProtocolError);
    }
    if let Err(error) = verdict {
        if has_payload && reader.skip(u64::from(request.length)).await.is_err() {
            return Err(ReaderEnd::ClientGone);
        }
        let budget = acquire_budget(budgets, context, batch, SMALL_REPLY_UNITS).await;
        let reply = error_reply(context, &request, error, "", budget);
        context.record(&request, &reply.bytes, started);
        batch.push(reply);
        return Ok(());
    }
    let budget = acquire_budget(budgets, context, batch, memory_units(context, &request)).await;
    let payload = if has_payload {
        // from the daemon-wide buffer pool: a fresh large Vec is zero pages from the
        // kernel on every request (37% of the daemon's CPU in clear_page under 128K
        // sequential writes); dispatch gives it back once the volume has the data
        let mut payload = context.frontend.buffers.take(request.length as usize);
        if reader.read_into(&mut payload).await.is_err() {
            return Err(ReaderEnd::ClientGone);
        }
        payload
    } else {
        Vec::new()
    };
    dispatch(context, budgets, request, payload, budget, batch, started).await;
    Ok(())
}

/// Start one validated request. Replies made inline go into `batch`; a volume call
/// waits for a volume-call permit (stalling only this reader) and then runs on the
/// blocking pool.
async fn dispatch(
    context: &RequestContext,
    budgets: &Budgets,
    request: Request,
    payload: Vec<u8>,
    budget: Budget,
    batch: &mut Vec<Reply>,
    started: Instant,
) {
    if let Some((bytes, shared)) = try_inline(context, &request, &payload) {
        context.frontend.buffers.give(payload);
        context.record(&request, &bytes, started);
        batch.push(Reply { bytes, shared, _budget: budget });
        return;
    }
    if request.command == CMD_WRITE {
        if let WriteDelay::After(delay) = context.volume.claim_write_delay(u64::from(request.length)) {
            tokio::spawn(delayed_write(context.clone(), request, payload, budget, delay, started));
            return;
        }
    }
    let zero_call = if matches!(request.command, CMD_TRIM | CMD_WRITE_ZEROES) {
        context.send(std::mem::take(batch));
        budgets.zero_calls.clone().acquire_owned().await.ok()
    } else {
        None
    };
    let call = match budgets.volume_calls.try_acquire(1) {
        Some(call) => call,
        None => {
            context.send(std::mem::take(batch));
            budgets.volume_calls.acquire(1).await
        }
    };
    let context = context.clone();
    let (budget, call) = match try_read_async(&context, &request, budget, call, started) {
        Ok(()) => return context.frontend.buffers.give(payload),
        Err(back) => back,
    };
    let (budget, call) = match try_commit_async(&context, &request, &payload, budget, call, started) {
        Ok(()) => return context.frontend.buffers.give(payload),
        Err(back) => back,
    };
    tokio::task::spawn_blocking(move || {
        let bytes = execute_blocking(&context, &request, &payload);
        context.frontend.buffers.give(payload);
        drop((call, zero_call));
        context.record(&request, &bytes, started);
        context.send(vec![Reply::new(bytes, budget)]);
    });
}

/// FLUSH, and a WRITE that must be durable before its reply (FUA, or any write to a
/// `sync=always` volume), without a blocking thread: the write is applied here when the
/// volume can take it at once, the commit is started here, and the engine thread that
/// completes the intent-log write queues the reply (one hand-off to the devices and one
/// back, instead of two more through the blocking pool). When the commit cannot finish
/// without blocking (another commit holds the log: batching; a txg to wait for), its
/// completion runs the blocking `flush` on the blocking pool. `Err` gives the request's
/// permits back for the blocking path (a write the volume cannot take at once, other
/// commands). The volume-call permit is held until the reply is made, as for a
/// blocking call.
fn try_commit_async(
    context: &RequestContext,
    request: &Request,
    payload: &[u8],
    budget: Budget,
    call: BudgetPermit,
    started: Instant,
) -> Result<(), (Budget, BudgetPermit)> {
    match request.command {
        CMD_FLUSH => {}
        CMD_WRITE => {
            let fua = request.flags & CMD_FLAG_FUA != 0;
            match context.volume.try_write_nonblocking_sync(request.offset, payload, fua) {
                None => return Err((budget, call)),
                Some(Ok(true)) => {}
                Some(done) => {
                    finish_reply(context, request, done.map(|_| ()), budget, CallPermit::Budget(call), started);
                    return Ok(());
                }
            }
        }
        _ => return Err((budget, call)),
    }
    commit_then_reply(context, request, budget, CallPermit::Budget(call), started);
    Ok(())
}

/// A READ that missed the cache, without a blocking thread: the volume issues the one
/// block it lacks and the engine thread that completes the device read replies (with
/// the io_uring engine, no thread hand-off at all on the way to the device). When the
/// read cannot finish that way (several blocks to fetch, an indirect block not cached,
/// a copy that failed or did not verify: the blocking read tries every copy and heals),
/// its completion runs the blocking `read` on the blocking pool. `Err` gives the
/// permits back for the blocking path (other commands). The volume-call permit is held
/// until the reply is made, as for a blocking call.
fn try_read_async(context: &RequestContext, request: &Request, budget: Budget, call: BudgetPermit, started: Instant) -> Result<(), (Budget, BudgetPermit)> {
    if request.command != CMD_READ {
        return Err((budget, call));
    }
    let handle = tokio::runtime::Handle::current();
    let (context, request) = (context.clone(), *request);
    let volume = context.volume.clone();
    volume.read_async(request.offset, u64::from(request.length), Box::new(move |result| match result {
        Some(result) => {
            drop(call);
            let reply = match result {
                Ok(pieces) => {
                    let mut head = vec![0u8; read_prefix_bytes(&context)];
                    finish_read_reply(&context, &request, &mut head);
                    Reply { bytes: head, shared: pieces, _budget: budget }
                }
                Err(error) => Reply::new(read_error_reply(&context, request.cookie, error.errno()), budget),
            };
            context.record(&request, &reply.bytes, started);
            context.send(vec![reply]);
        }
        // On the engine thread that completed the device read: handed to the blocking
        // pool from inside a task, as a FLUSH's commit is (`commit_then_reply`).
        None => {
            handle.spawn(async move {
                let _ = tokio::task::spawn_blocking(move || {
                    let bytes = execute_blocking(&context, &request, &[]);
                    drop(call);
                    context.record(&request, &bytes, started);
                    context.send(vec![Reply::new(bytes, budget)]);
                })
                .await;
            });
        }
    }));
    Ok(())
}

/// A WRITE the write throttle delays (`claim_write_delay`): it waits on the throttle
/// timer holding its request permit and memory, but no thread and no volume call; then
/// it is applied without a second delay, inline when the volume can take it at once
/// (and committed without a thread when FUA), else on the blocking pool under one of
/// the front ends' `delayed_write_calls`.
async fn delayed_write(context: RequestContext, request: Request, payload: Vec<u8>, budget: Budget, delay: Duration, started: Instant) {
    zilla_frontend::delay_timer::sleep(delay).await;
    let fua = request.flags & CMD_FLAG_FUA != 0;
    let needs_commit = match context.volume.try_write_after_delay(request.offset, &payload, fua) {
        Some(Ok(true)) => true,
        Some(done) => {
            context.frontend.buffers.give(payload);
            return finish_reply(&context, &request, done.map(|_| ()), budget, CallPermit::None, started);
        }
        None => false,
    };
    let call = match context.frontend.delayed_write_calls.clone().acquire_owned().await {
        Ok(permit) => CallPermit::AfterDelay(permit),
        Err(_closed) => CallPermit::None, // never closed
    };
    if needs_commit {
        context.frontend.buffers.give(payload);
        return commit_then_reply(&context, &request, budget, call, started);
    }
    tokio::task::spawn_blocking(move || {
        let result = context.volume.write_after_delay(request.offset, &payload, fua);
        context.frontend.buffers.give(payload);
        finish_reply(&context, &request, result, budget, call, started);
    });
}

/// What a request holds while its volume work may need a blocking thread; dropped with
/// the reply (held for its `Drop` only).
#[allow(dead_code)]
enum CallPermit {
    Budget(BudgetPermit),
    AfterDelay(OwnedSemaphorePermit),
    None,
}

/// Start the commit a FLUSH or a durable write needs; its completion replies (on the
/// blocking pool when the commit cannot finish without blocking).
fn commit_then_reply(context: &RequestContext, request: &Request, budget: Budget, call: CallPermit, started: Instant) {
    let handle = tokio::runtime::Handle::current();
    let (context, request) = (context.clone(), *request);
    let volume = context.volume.clone();
    volume.flush_async(Box::new(move |result| match result {
        Some(result) => finish_reply(&context, &request, result, budget, call, started),
        // This may run on an engine thread (a commit round settling its waiters):
        // the hand-off to the blocking pool happens inside a task, so that a blocking
        // pool that cannot start a thread (spawn_blocking panics then) fails this
        // request's task, never the engine thread that completes device I/O.
        None => {
            handle.spawn(async move {
                let _ = tokio::task::spawn_blocking(move || {
                    let result = context.volume.flush();
                    finish_reply(&context, &request, result, budget, call, started);
                })
                .await;
            });
        }
    }));
}

/// Reply to a request whose volume work is done (from any thread).
fn finish_reply(context: &RequestContext, request: &Request, result: zilla_core::Result<()>, budget: Budget, call: CallPermit, started: Instant) {
    drop(call);
    let bytes = match result {
        Ok(()) => simple_reply(0, request.cookie),
        Err(error) => simple_reply(nbd_error_from_errno(error.errno()), request.cookie),
    };
    context.record(request, &bytes, started);
    context.send(vec![Reply::new(bytes, budget)]);
}

/// Requests answered on the reactor thread: cached reads, writes the volume takes
/// without blocking, CACHE hints. `None`: needs a volume call. The reply is its bytes
/// and, for a zero-copy read, the shared data pieces that follow them.
fn try_inline(context: &RequestContext, request: &Request, payload: &[u8]) -> Option<(Vec<u8>, Vec<SharedSlice>)> {
    if request.command == CMD_READ {
        return try_read_inline(context, request);
    }
    let bytes = match request.command {
        // A write the volume can take without blocking (no throttle delay, no device
        // read) is applied here.
        CMD_WRITE if request.flags & CMD_FLAG_FUA == 0 => {
            let result = context.volume.try_write_nonblocking(request.offset, payload)?;
            Some(match result {
                Ok(()) => simple_reply(0, request.cookie),
                Err(error) => simple_reply(nbd_error_from_errno(error.errno()), request.cookie),
            })
        }
        // A prefetch hint; the ARC decides what stays in memory. Acknowledge at once.
        CMD_CACHE => Some(simple_reply(0, request.cookie)),
        _ => None,
    }?;
    Some((bytes, Vec::new()))
}

/// The fast path: answer a READ from memory without leaving the reactor thread. The
/// volume's block buffers are sent as they are when it can share them (no copy);
/// otherwise the data is copied into a reply buffer.
fn try_read_inline(context: &RequestContext, request: &Request) -> Option<(Vec<u8>, Vec<SharedSlice>)> {
    let length = request.length as usize;
    if length == 0 {
        return Some((read_reply_empty(context, request.cookie), Vec::new()));
    }
    let prefix = read_prefix_bytes(context);
    if let Some(result) = context.volume.try_read_cached_shared(request.offset, u64::from(request.length)) {
        return Some(match result {
            Ok(pieces) => {
                let mut head = vec![0u8; prefix];
                finish_read_reply(context, request, &mut head);
                (head, pieces)
            }
            Err(error) => (read_error_reply(context, request.cookie, error.errno()), Vec::new()),
        });
    }
    if context.volume.cached_reads_are_shared(u64::from(request.length)) {
        return None; // a block is not in memory: the copying way would miss as well
    }
    let mut buffer = context.frontend.buffers.take(prefix + length);
    let Some(result) = context.volume.try_read_cached(request.offset, &mut buffer[prefix..]) else {
        context.frontend.buffers.give(buffer);
        return None;
    };
    let bytes = match result {
        Ok(()) => {
            finish_read_reply(context, request, &mut buffer);
            buffer
        }
        Err(error) => read_error_reply(context, request.cookie, error.errno()),
    };
    Some((bytes, Vec::new()))
}

/// Run a request that may block on the volume. Returns the encoded reply.
fn execute_blocking(context: &RequestContext, request: &Request, payload: &[u8]) -> Vec<u8> {
    let volume = &*context.volume;
    let fua = request.flags & CMD_FLAG_FUA != 0;
    let offset = request.offset;
    let length = u64::from(request.length);
    let result = match request.command {
        CMD_READ => return read_blocking(context, request),
        CMD_BLOCK_STATUS => return block_status(context, request),
        CMD_WRITE => volume.write(offset, payload, fua),
        CMD_FLUSH => volume.flush(),
        CMD_TRIM => in_pieces(offset, length, |at, len| volume.unmap(at, len))
            .and_then(|()| if fua { volume.flush() } else { Ok(()) }),
        // NO_HOLE asks for provisioned zeros; a copy-on-write pool cannot promise
        // space for future overwrites either way, so zeroing is done the cheap way
        // (which also makes FAST_ZERO always succeed).
        CMD_WRITE_ZEROES => in_pieces(offset, length, |at, len| volume.write_zeroes(at, len))
            .and_then(|()| if fua { volume.flush() } else { Ok(()) }),
        _ => return simple_reply(NBD_EINVAL, request.cookie),
    };
    match result {
        Ok(()) => simple_reply(0, request.cookie),
        Err(error) => simple_reply(nbd_error_from_errno(error.errno()), request.cookie),
    }
}

/// Apply `op` to `[offset, offset+length)` in pieces of at most `ZERO_CALL_MAX_BYTES`,
/// so one huge TRIM does not hold the volume in one long call.
fn in_pieces(
    offset: u64,
    length: u64,
    mut op: impl FnMut(u64, u64) -> zilla_core::Result<()>,
) -> zilla_core::Result<()> {
    if length == 0 {
        return op(offset, 0);
    }
    let mut done = 0;
    while done < length {
        let piece = (length - done).min(ZERO_CALL_MAX_BYTES);
        op(offset + done, piece)?;
        done += piece;
    }
    Ok(())
}

/// A READ that missed the cache. With structured replies, a range that is entirely a
/// hole is answered with one OFFSET_HOLE chunk instead of zero-filled data.
fn read_blocking(context: &RequestContext, request: &Request) -> Vec<u8> {
    let length = request.length as usize;
    if length == 0 {
        return read_reply_empty(context, request.cookie);
    }
    if context.structured_replies {
        if let Ok(extents) = context.volume.block_status(request.offset, u64::from(request.length)) {
            if let [only] = extents.as_slice() {
                if only.hole && only.length >= u64::from(request.length) {
                    let mut payload = [0u8; 12];
                    payload[..8].copy_from_slice(&request.offset.to_be_bytes());
                    payload[8..].copy_from_slice(&request.length.to_be_bytes());
                    let mut reply = Vec::with_capacity(CHUNK_HEADER_BYTES + 12);
                    push_chunk(&mut reply, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE, request.cookie, &payload);
                    return reply;
                }
            }
        }
    }
    let prefix = read_prefix_bytes(context);
    let mut buffer = context.frontend.buffers.take(prefix + length);
    match context.volume.read(request.offset, &mut buffer[prefix..]) {
        Ok(()) => {
            finish_read_reply(context, request, &mut buffer);
            buffer
        }
        Err(error) => read_error_reply(context, request.cookie, error.errno()),
    }
}

fn read_prefix_bytes(context: &RequestContext) -> usize {
    if context.structured_replies { OFFSET_DATA_PREFIX_BYTES } else { SIMPLE_REPLY_HEADER_BYTES }
}

/// Fill in the header in front of read data already placed after the prefix.
fn finish_read_reply(context: &RequestContext, request: &Request, buffer: &mut [u8]) {
    if context.structured_replies {
        let chunk_bytes = 8 + request.length; // offset + data; length <= payload cap
        encode_chunk_header(buffer, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, request.cookie, chunk_bytes);
        buffer[CHUNK_HEADER_BYTES..OFFSET_DATA_PREFIX_BYTES].copy_from_slice(&request.offset.to_be_bytes());
    } else {
        encode_simple_reply_header(buffer, 0, request.cookie);
    }
}

fn read_reply_empty(context: &RequestContext, cookie: u64) -> Vec<u8> {
    if context.structured_replies {
        let mut reply = Vec::with_capacity(CHUNK_HEADER_BYTES);
        push_chunk(&mut reply, REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, &[]);
        reply
    } else {
        simple_reply(0, cookie)
    }
}

fn read_error_reply(context: &RequestContext, cookie: u64, errno: i32) -> Vec<u8> {
    let error = nbd_error_from_errno(errno);
    if context.structured_replies {
        let mut reply = Vec::new();
        push_error_chunk(&mut reply, cookie, error, "read failed");
        reply
    } else {
        simple_reply(error, cookie)
    }
}

fn simple_reply(error: u32, cookie: u64) -> Vec<u8> {
    let mut reply = vec![0u8; SIMPLE_REPLY_HEADER_BYTES];
    encode_simple_reply_header(&mut reply, error, cookie);
    reply
}

/// An error reply that does not touch the volume.
fn error_reply(context: &RequestContext, request: &Request, error: u32, message: &str, budget: Budget) -> Reply {
    let structured = context.structured_replies && matches!(request.command, CMD_READ | CMD_BLOCK_STATUS);
    let bytes = if structured {
        let mut reply = Vec::new();
        push_error_chunk(&mut reply, request.cookie, error, message);
        reply
    } else {
        simple_reply(error, request.cookie)
    };
    Reply::new(bytes, budget)
}

/// BLOCK_STATUS for base:allocation: holes are HOLE|ZERO, data is 0.
fn block_status(context: &RequestContext, request: &Request) -> Vec<u8> {
    let Some(context_id) = context.base_allocation_context_id else {
        let mut reply = Vec::new();
        push_error_chunk(&mut reply, request.cookie, NBD_EINVAL, "no meta context selected");
        return reply;
    };
    let span_bytes = u64::from(request.length).min(BLOCK_STATUS_SPAN_MAX_BYTES);
    let extents = match context.volume.block_status(request.offset, span_bytes) {
        Ok(extents) => extents,
        Err(error) => {
            let mut reply = Vec::new();
            push_error_chunk(&mut reply, request.cookie, nbd_error_from_errno(error.errno()), "block status failed");
            return reply;
        }
    };
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
            frontend.buffers.give(reply.bytes);
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
        let budget = Budget {
            _request: Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
            _memory: frontend.memory.share().try_acquire(SMALL_REPLY_UNITS).unwrap(),
        };
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
