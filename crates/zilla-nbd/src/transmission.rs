//! transmission: the pipelined request loop of one connection.
//!
//! ```text
//!   socket read half                                          socket write half
//!        |                                                           ^
//!   [reader loop] --parse/validate--> fast path: try_read_cached ----+
//!        |                            (inline, no thread hop)        |
//!        +--> spawn_blocking(volume call) --> Reply --> mpsc --> [writer task]
//! ```
//!
//! The reader parses one 28-byte header at a time, validates it against the session
//! ([`proto::validate_request`]), reads a WRITE payload, and dispatches: reads that the
//! volume can serve from memory (`try_read_cached`) are answered inline; everything
//! else runs on tokio's blocking pool, because `BlockVolume` calls block. Each finished
//! request becomes one contiguous `Reply` buffer (header and data together, so no reply
//! interleaves with another) sent to the connection's single writer task, which
//! batches whatever is queued into one flush. Replies therefore leave in completion
//! order, not request order; the cookie ties them together. Inline replies are gathered
//! while more requests are already buffered and handed over as one batch, so a burst
//! of cached reads costs one writer wake-up and one socket write, not one each.
//!
//! Bounds: at most `in_flight_requests_max` requests and `in_flight_bytes_max` payload
//! bytes are in flight per connection, counting from dispatch until the writer has
//! taken the reply; when either budget is spent the reader stops reading, which
//! pushes back on the client through TCP. READ/WRITE lengths above `payload_max_bytes`
//! get EINVAL; for a WRITE the payload cannot be skipped safely, so the connection is
//! then closed. BLOCK_STATUS looks at no more than `BLOCK_STATUS_SPAN_MAX_BYTES` and
//! returns at most `BLOCK_STATUS_EXTENTS_MAX` extents per request.
//!
//! Ending: NBD_CMD_DISC, EOF, a bad magic or an I/O error stop the reader; then the
//! connection waits for in-flight requests (bounded by `shutdown_grace`) and lets the
//! writer drain before closing. When the server's shutdown signal fires, new requests
//! are answered ESHUTDOWN while in-flight ones finish, and the connection closes as
//! soon as nothing is in flight (or the grace period ends).
//!
//! Errors on the wire: EINVAL (bad range, bad flags, unknown command, BLOCK_STATUS
//! without a negotiated context), ENOSPC (write past end), EPERM (read-only), the
//! volume's errno mapped by [`proto::nbd_error_from_errno`], ESHUTDOWN when stopping.
//! READ and BLOCK_STATUS errors use structured ERROR chunks once structured replies are
//! negotiated; everything else uses simple replies, which the spec allows.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use zilla_core::zvol::BlockVolume;

use crate::framing::FrameReader;
use crate::handshake::Session;
use crate::proto::*;
use crate::NbdConfig;

/// Largest range one BLOCK_STATUS request examines; clients ask again for the rest.
pub const BLOCK_STATUS_SPAN_MAX_BYTES: u64 = 1 << 30;
/// Most extents returned in one BLOCK_STATUS reply (the spec allows up to 2^20).
pub const BLOCK_STATUS_EXTENTS_MAX: usize = 1 << 16;
/// Inline replies gathered before the reader hands them to the writer.
const REPLY_BATCH_MAX: usize = 64;
/// Size of the buffered writer in front of the socket.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// One reply, ready to write, holding the in-flight budget it was given until the
/// writer has consumed it.
struct Reply {
    bytes: Vec<u8>,
    _budget: Budget,
}

/// The per-request share of the connection's in-flight budget.
struct Budget {
    _request: Option<OwnedSemaphorePermit>,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// Everything a request needs once dispatched; cheap to clone into a blocking task.
#[derive(Clone)]
struct RequestContext {
    volume: Arc<dyn BlockVolume>,
    structured_replies: bool,
    base_allocation_context_id: Option<u32>,
    replies: mpsc::Sender<Vec<Reply>>,
    buffers: Arc<ReplyBuffers>,
}

/// Large read-reply buffers the writer hands back after sending them, so the next read
/// of the same size reuses initialised memory instead of zero-filling a fresh one.
/// Bounded: at most REPLY_BUFFERS_POOLED buffers, each at most REPLY_BUFFER_MAX_BYTES.
#[derive(Default)]
struct ReplyBuffers {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

const REPLY_BUFFERS_POOLED: usize = 64;
const REPLY_BUFFER_MIN_BYTES: usize = 32 * 1024;
const REPLY_BUFFER_MAX_BYTES: usize = 4 << 20;

impl ReplyBuffers {
    /// A buffer of exactly `len` bytes (contents unspecified).
    fn take(&self, len: usize) -> Vec<u8> {
        if len >= REPLY_BUFFER_MIN_BYTES {
            if let Ok(mut free) = self.free.lock() {
                if let Some(i) = free.iter().position(|b| b.len() >= len) {
                    let mut b = free.swap_remove(i);
                    b.truncate(len);
                    return b;
                }
            }
        }
        vec![0u8; len]
    }
    fn give(&self, b: Vec<u8>) {
        if (REPLY_BUFFER_MIN_BYTES..=REPLY_BUFFER_MAX_BYTES).contains(&b.len()) {
            if let Ok(mut free) = self.free.lock() {
                if free.len() < REPLY_BUFFERS_POOLED {
                    free.push(b);
                }
            }
        }
    }
}

/// Why the reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReaderEnd {
    Disconnect,
    ClientGone,
    ProtocolError,
    Shutdown,
}

/// Run the transmission phase until the client leaves or the server stops.
pub(crate) async fn run<R, W>(
    mut reader: FrameReader<R>,
    writer: W,
    session: Session,
    config: &NbdConfig,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (reply_sender, reply_receiver) = mpsc::channel::<Vec<Reply>>(config.in_flight_requests_max.clamp(1, 4096) + 8);
    let buffers = Arc::new(ReplyBuffers::default());
    let writer_task = tokio::spawn(write_replies(writer, reply_receiver, buffers.clone()));
    // Clamped so that wait_idle's acquire_many(u32) can take every slot, and a single
    // request can never ask for more bytes than the budget holds (that would hang).
    let requests_max = config.in_flight_requests_max.clamp(1, u32::MAX as usize);
    let bytes_max = config.in_flight_bytes_max.max(config.payload_max_bytes as usize).min(u32::MAX as usize);
    let requests_budget = Arc::new(Semaphore::new(requests_max));
    let bytes_budget = Arc::new(Semaphore::new(bytes_max));
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
        replies: reply_sender,
        buffers,
    };

    let mut stopping = *shutdown.borrow();
    let mut stop_deadline = Instant::now() + config.shutdown_grace;
    // Replies produced inline by the reader, handed to the writer as one batch when the
    // reader runs out of buffered requests (one wake-up and one write per batch).
    let mut batch: Vec<Reply> = Vec::new();
    let end = loop {
        if !batch.is_empty() && (reader.buffered_bytes() < REQUEST_HEADER_BYTES || batch.len() >= REPLY_BATCH_MAX) {
            let _ = context.replies.send(std::mem::take(&mut batch)).await;
        }
        let header = tokio::select! {
            biased;
            changed = shutdown.changed(), if !stopping => {
                // A dropped sender means the server itself is gone: stop as well.
                if changed.is_err() || *shutdown.borrow() {
                    stopping = true;
                    stop_deadline = Instant::now() + config.shutdown_grace;
                }
                continue;
            }
            _ = wait_idle(&requests_budget, requests_max), if stopping => {
                break ReaderEnd::Shutdown;
            }
            _ = tokio::time::sleep_until(stop_deadline), if stopping => break ReaderEnd::Shutdown,
            header = reader.read_array::<REQUEST_HEADER_BYTES>() => header,
        };
        let Ok(header) = header else { break ReaderEnd::ClientGone };
        let Ok(request) = parse_request(&header) else {
            tracing::debug!("nbd: bad request magic, closing");
            break ReaderEnd::ProtocolError;
        };
        if request.command == CMD_DISC {
            break ReaderEnd::Disconnect;
        }
        let has_payload = request.command == CMD_WRITE;
        if has_payload && request.length > config.payload_max_bytes {
            tracing::debug!(length = request.length, "nbd: write payload over the cap, closing");
            send_error(&context, &request, NBD_EINVAL, "payload too large", no_budget()).await;
            break ReaderEnd::ProtocolError;
        }
        let verdict = if stopping { Err(NBD_ESHUTDOWN) } else { validate_request(&request, &limits) };
        if let Err(error) = verdict {
            if has_payload && reader.skip(u64::from(request.length)).await.is_err() {
                break ReaderEnd::ClientGone;
            }
            send_error(&context, &request, error, "", no_budget()).await;
            continue;
        }
        let budget = match try_acquire_budget(&requests_budget, &bytes_budget, &request) {
            Some(budget) => budget,
            None => {
                // The batch holds budget; hand it over before waiting for budget to free.
                let _ = context.replies.send(std::mem::take(&mut batch)).await;
                acquire_budget(&requests_budget, &bytes_budget, &request).await
            }
        };
        let payload = if has_payload {
            let mut payload = vec![0u8; request.length as usize];
            if reader.read_into(&mut payload).await.is_err() {
                break ReaderEnd::ClientGone;
            }
            payload
        } else {
            Vec::new()
        };
        dispatch(&context, request, payload, budget, &mut batch);
    };
    if !batch.is_empty() {
        let _ = context.replies.send(batch).await;
    }
    tracing::debug!(?end, "nbd: connection reader stopped");

    // Let in-flight requests finish and hand their replies to the writer, then close.
    let deadline = if end == ReaderEnd::Shutdown { stop_deadline } else { Instant::now() + config.shutdown_grace };
    let _ = tokio::time::timeout_at(deadline, wait_idle(&requests_budget, requests_max)).await;
    drop(context);
    let writer_abort = writer_task.abort_handle();
    match tokio::time::timeout_at(deadline + Duration::from_secs(1), writer_task).await {
        Ok(Ok(result)) => result,
        Ok(Err(_join_error)) => Ok(()),
        Err(_elapsed) => {
            // A client that stopped reading must not pin the writer task forever.
            writer_abort.abort();
            Ok(())
        }
    }
}

/// Resolves when every request slot is free, i.e. nothing is in flight.
async fn wait_idle(requests_budget: &Semaphore, requests_max: usize) {
    let _all = requests_budget.acquire_many(requests_max as u32).await;
}

fn no_budget() -> Budget {
    Budget { _request: None, _bytes: None }
}

fn budget_bytes(request: &Request) -> u32 {
    match request.command {
        CMD_READ | CMD_WRITE => request.length.max(1),
        _ => 1,
    }
}

fn try_acquire_budget(requests: &Arc<Semaphore>, bytes: &Arc<Semaphore>, request: &Request) -> Option<Budget> {
    let request_permit = requests.clone().try_acquire_owned().ok()?;
    let bytes_permit = bytes.clone().try_acquire_many_owned(budget_bytes(request)).ok()?;
    Some(Budget { _request: Some(request_permit), _bytes: Some(bytes_permit) })
}

async fn acquire_budget(requests: &Arc<Semaphore>, bytes: &Arc<Semaphore>, request: &Request) -> Budget {
    let payload_bytes = budget_bytes(request);
    // The semaphores are never closed, so acquisition only fails if they were; then
    // run without that budget rather than panic.
    let request_permit = requests.clone().acquire_owned().await.ok();
    let bytes_permit = bytes.clone().acquire_many_owned(payload_bytes).await.ok();
    Budget { _request: request_permit, _bytes: bytes_permit }
}

/// Start one validated request. Replies made inline go into `batch`.
fn dispatch(context: &RequestContext, request: Request, payload: Vec<u8>, budget: Budget, batch: &mut Vec<Reply>) {
    if request.command == CMD_READ {
        if let Some(reply) = try_read_inline(context, &request) {
            batch.push(Reply { bytes: reply, _budget: budget });
            return;
        }
    }
    if request.command == CMD_WRITE && request.flags & CMD_FLAG_FUA == 0 {
        // The fast path for writes: a write the volume can take without blocking (no
        // throttle delay, no device read) is applied on the reactor thread.
        if let Some(result) = context.volume.try_write_nonblocking(request.offset, &payload) {
            let bytes = match result {
                Ok(()) => simple_reply(0, request.cookie),
                Err(error) => simple_reply(nbd_error_from_errno(error.errno()), request.cookie),
            };
            batch.push(Reply { bytes, _budget: budget });
            return;
        }
    }
    if request.command == CMD_CACHE {
        // A prefetch hint; the ARC decides what stays in memory. Acknowledge at once.
        batch.push(Reply { bytes: simple_reply(0, request.cookie), _budget: budget });
        return;
    }
    let context = context.clone();
    tokio::task::spawn_blocking(move || {
        let bytes = execute_blocking(&context, &request, payload);
        let _ = context.replies.blocking_send(vec![Reply { bytes, _budget: budget }]);
    });
}

/// The fast path: answer a READ from memory without leaving the reactor thread.
fn try_read_inline(context: &RequestContext, request: &Request) -> Option<Vec<u8>> {
    let length = request.length as usize;
    if length == 0 {
        return Some(read_reply_empty(context, request.cookie));
    }
    let prefix = read_prefix_bytes(context);
    let mut buffer = context.buffers.take(prefix + length);
    let Some(result) = context.volume.try_read_cached(request.offset, &mut buffer[prefix..]) else {
        context.buffers.give(buffer);
        return None;
    };
    match result {
        Ok(()) => {
            finish_read_reply(context, request, &mut buffer);
            Some(buffer)
        }
        Err(error) => Some(read_error_reply(context, request.cookie, error.errno())),
    }
}

/// Run a request that may block on the volume. Returns the encoded reply.
fn execute_blocking(context: &RequestContext, request: &Request, payload: Vec<u8>) -> Vec<u8> {
    let volume = &*context.volume;
    let fua = request.flags & CMD_FLAG_FUA != 0;
    let offset = request.offset;
    let length = u64::from(request.length);
    let result = match request.command {
        CMD_READ => return read_blocking(context, request),
        CMD_BLOCK_STATUS => return block_status(context, request),
        CMD_WRITE => volume.write(offset, &payload, fua),
        CMD_FLUSH => volume.flush(),
        CMD_TRIM => volume.unmap(offset, length).and_then(|()| if fua { volume.flush() } else { Ok(()) }),
        // NO_HOLE asks for provisioned zeros; a copy-on-write pool cannot promise
        // space for future overwrites either way, so zeroing is done the cheap way
        // (which also makes FAST_ZERO always succeed).
        CMD_WRITE_ZEROES => {
            volume.write_zeroes(offset, length).and_then(|()| if fua { volume.flush() } else { Ok(()) })
        }
        _ => return simple_reply(NBD_EINVAL, request.cookie),
    };
    match result {
        Ok(()) => simple_reply(0, request.cookie),
        Err(error) => simple_reply(nbd_error_from_errno(error.errno()), request.cookie),
    }
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
    let mut buffer = vec![0u8; prefix + length];
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

/// Answer an error without touching the volume.
async fn send_error(context: &RequestContext, request: &Request, error: u32, message: &str, budget: Budget) {
    let structured = context.structured_replies && matches!(request.command, CMD_READ | CMD_BLOCK_STATUS);
    let bytes = if structured {
        let mut reply = Vec::new();
        push_error_chunk(&mut reply, request.cookie, error, message);
        reply
    } else {
        simple_reply(error, request.cookie)
    };
    let _ = context.replies.send(vec![Reply { bytes, _budget: budget }]).await;
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

/// Replies at least this large bypass the writer's buffer.
const DIRECT_REPLY_BYTES: usize = 32 * 1024;

async fn write_reply<W: AsyncWrite + Unpin>(out: &mut BufWriter<W>, bytes: &[u8]) -> io::Result<()> {
    if bytes.len() >= DIRECT_REPLY_BYTES {
        out.flush().await?;
        out.get_mut().write_all(bytes).await
    } else {
        out.write_all(bytes).await
    }
}

/// The writer task: write replies in the order they complete, batching whatever is
/// already queued into one flush. Small replies are gathered in a buffer; a large one
/// (read data) goes straight to the socket after the buffer, so its bytes are copied
/// once (volume -> reply) rather than again into the buffer.
async fn write_replies<W: AsyncWrite + Unpin>(
    writer: W,
    mut replies: mpsc::Receiver<Vec<Reply>>,
    buffers: Arc<ReplyBuffers>,
) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
    while let Some(batch) = replies.recv().await {
        for reply in batch {
            write_reply(&mut out, &reply.bytes).await?;
            buffers.give(reply.bytes);
        }
        while let Ok(batch) = replies.try_recv() {
            for reply in batch {
                write_reply(&mut out, &reply.bytes).await?;
                buffers.give(reply.bytes);
            }
        }
        out.flush().await?;
    }
    out.shutdown().await
}
