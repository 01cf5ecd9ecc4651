//! executor: the one request path of every front end.
//!
//! A protocol (NBD, iSCSI, the in-tree test front end) parses its wire format into an
//! owned [`Request`] (a [`Command`] with its buffers), takes an [`Admission`] for it
//! from its connection's [`Executor`], and submits it with a [`Completer`]. The
//! request then has exactly one completion ([`Completion`]: the result and the
//! admission back), which the protocol encodes into its reply. The completer is made
//! only when the request leaves the caller (a closure builds it), so a request served
//! inline costs no completer:
//!
//! ```text
//!   protocol reader --admit--> Admission (request slot + memory units)
//!        |
//!        +--submit(Request, Admission, Completer)
//!              |
//!              +-- inline: served from memory / taken without blocking
//!              |     -> returned to the caller with its completer (no hop, no task)
//!              +-- throttled write: claims its delay, waits on the delay timer
//!              |     (no thread, no volume call), then applied as below
//!              +-- volume call permit, then
//!                    +-- async engine completion (a cache-miss read of one block, a
//!                    |   FLUSH, a FUA or sync=always write): the engine thread that
//!                    |   completes the device I/O calls the completer
//!                    +-- the blocking pool (everything else, and every async start
//!                        that reports it cannot finish without blocking)
//! ```
//!
//! Which way a request goes is decided here only, from the engine's answers
//! ([`BlockVolume`]'s `try_`, `_async` and `_after_delay` calls); a protocol never
//! calls the engine's volume for I/O. Statistics are recorded here only: every
//! completion, and every request a protocol refuses before submitting
//! ([`Executor::refuse`]), is counted once on the session's [`Recorder`], which the
//! [`crate::iostats`] table sums per volume, client and protocol.
//!
//! Exactly once. Inline, the completion is returned to the caller (which batches its
//! reply) and no completer exists. Otherwise the completer travels inside a [`Pending`] that
//! calls it when the work is done; if the work is dropped without a result (a
//! blocking task that panicked, an engine that dropped its completion, a runtime
//! shutting down) the `Pending`'s drop completes it with an I/O error, so a client
//! always gets an answer and the admission always comes back.
//!
//! Bounds. An [`Admission`] holds one of the connection's `requests_max` request slots
//! and a share of the daemon-wide memory budget from before the request's payload is
//! read until the protocol drops it (after its reply is on the wire). A request that
//! needs a thread or an engine completion also holds a permit of the daemon-wide
//! volume-call budget ([`SharedBudget`]) until its completion; a write the throttle
//! delayed holds none while it waits, and one of `Frontend::delayed_write_calls` if it
//! then still needs a thread. UNMAP, WRITE ZEROES and WRITE SAME run one at a time per
//! connection, in calls of at most [`ZERO_CALL_MAX_BYTES`]; BLOCK STATUS looks at most
//! [`BLOCK_STATUS_SPAN_MAX_BYTES`] ahead; WRITE SAME's pattern buffer is at most
//! [`WRITE_SAME_BUFFER_MAX_BYTES`]. COMPARE AND WRITE is atomic against every write
//! to its volume, from any connection or protocol: every volume call that applies
//! data does it inside the volume's [`WriteGate`] (write_gate.rs), which a write
//! passes with two atomic adds while no COMPARE AND WRITE is in flight.
//!
//! Waiting. `submit` never waits: a request whose volume call or zero-call slot is not
//! free comes back `Blocked`, and `resume` waits for it. `admit` and `resume` call the
//! caller's `before_wait` before they wait, where a protocol hands the replies it
//! batched to its writer (they hold budget the wait may need). Waiting stalls only
//! that connection's reader. The hot paths (inline, started at once) build no future.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use zilla_core::zvol::{BlockVolume, Extent, SharedSlice, WriteData, WriteDelay};
use zilla_core::Error;

use crate::budget::{BudgetPermit, BudgetShare};
use crate::iostats::{IoKind, Recorder, SessionLabels};
use crate::write_gate::WriteGate;
use crate::Frontend;

/// Largest range one BLOCK STATUS request examines; clients ask again for the rest.
pub const BLOCK_STATUS_SPAN_MAX_BYTES: u64 = 1 << 30;
/// UNMAP / WRITE ZEROES / WRITE SAME are applied in volume calls of at most this many
/// bytes, so a 1 GiB TRIM never holds the volume for one long call.
pub const ZERO_CALL_MAX_BYTES: u64 = 64 << 20;
/// Largest buffer WRITE SAME fills with its pattern (it writes the range in pieces).
pub const WRITE_SAME_BUFFER_MAX_BYTES: usize = 1 << 20;
/// UNMAP / WRITE ZEROES / WRITE SAME requests one connection may have running at once:
/// they are long and dirty much metadata, so a flood of them must not crowd the txg.
const ZERO_CALLS_PER_CONNECTION: usize = 1;

/// What a front end asks of a volume, with its buffers.
#[derive(Debug)]
pub enum Command {
    /// `length` bytes at `offset`. A copied reply buffer starts with `prefix_bytes`
    /// bytes left for the protocol's header. `holes`: a range that is one hole may be
    /// answered [`ReadData::Hole`] instead of zeros.
    Read { offset: u64, length: u32, prefix_bytes: usize, holes: bool },
    /// `data` (a buffer of the front ends' pool; given back here) at `offset`. `fua`:
    /// durable before the completion.
    Write { offset: u64, data: WriteData, fua: bool },
    /// Every write completed before the FLUSH was submitted becomes durable.
    Flush,
    /// Deallocate (reads return zeros afterwards).
    Unmap { offset: u64, length: u64, fua: bool },
    /// Deallocate each `(offset, length)` (SCSI UNMAP's descriptors), in order.
    UnmapList { ranges: Vec<(u64, u64)>, fua: bool },
    WriteZeroes { offset: u64, length: u64, fua: bool },
    /// `pattern` repeated over `[offset, offset+length)`; `length` is a multiple of
    /// the pattern's length.
    WriteSame { offset: u64, length: u64, pattern: Vec<u8>, fua: bool },
    /// Atomically: if `[offset, offset+compare.len())` holds `compare`, write `data`
    /// (of the same length) there; else [`Output::Miscompare`].
    CompareAndWrite { offset: u64, compare: Vec<u8>, data: Vec<u8>, fua: bool },
    /// Atomically: `[offset, offset+data.len())` becomes its bitwise OR with `data`.
    OrWrite { offset: u64, data: Vec<u8>, fua: bool },
    /// Allocation of `[offset, offset+length)` (at most `BLOCK_STATUS_SPAN_MAX_BYTES`).
    BlockStatus { offset: u64, length: u64 },
    /// A hint that the range will be read; acknowledged at once.
    Prefetch { offset: u64, length: u64 },
}

impl Command {
    /// How the statistics count this command, and its bytes.
    pub fn io_kind(&self) -> (IoKind, u64) {
        match self {
            Command::Read { length, .. } => (IoKind::Read, u64::from(*length)),
            Command::Write { data, .. } => (IoKind::Write, data.len() as u64),
            Command::CompareAndWrite { data, .. } | Command::OrWrite { data, .. } => (IoKind::Write, data.len() as u64),
            Command::Flush => (IoKind::Flush, 0),
            Command::Unmap { length, .. } => (IoKind::Trim, *length),
            Command::UnmapList { ranges, .. } => (IoKind::Trim, ranges.iter().map(|r| r.1).sum()),
            Command::WriteZeroes { length, .. } | Command::WriteSame { length, .. } => (IoKind::WriteZeroes, *length),
            Command::BlockStatus { length, .. } | Command::Prefetch { length, .. } => (IoKind::Other, *length),
        }
    }
}

/// A command and when the front end received it (the statistics' start), on the
/// front end's clock ([`Executor::now_ns`]).
#[derive(Debug)]
pub struct Request {
    pub command: Command,
    pub started_ns: u64,
}

/// Read data as the completion carries it.
#[derive(Debug)]
pub enum ReadData {
    /// A buffer of the front ends' pool: `prefix_bytes` for the header, then the data.
    /// The protocol gives it back to `Frontend::buffers` once it is on the wire.
    Copied(Vec<u8>),
    /// The volume's own immutable block buffers, in order (no copy).
    Shared(Vec<SharedSlice>),
    /// The whole range is a hole (only when the read allowed it).
    Hole,
}

/// What a successful request produced.
#[derive(Debug)]
pub enum Output {
    Done,
    Data(ReadData),
    Extents(Vec<Extent>),
    /// COMPARE AND WRITE found a difference at this byte of the range; nothing written.
    Miscompare { offset: u64 },
}

/// The one completion of a request: its result and the admission it held, which the
/// protocol keeps until the reply is on the wire.
#[derive(Debug)]
pub struct Completion {
    pub result: zilla_core::Result<Output>,
    pub admission: Admission,
}

/// Receives a request's completion; called at most once (by value), from any thread.
/// `complete` must not block: it runs on engine threads too.
pub trait Completer: Send + 'static {
    fn complete(self, completion: Completion);
}

/// A request slot of the connection and a share of the memory budget, held from
/// admission until the protocol drops it (after the reply is written).
pub struct Admission {
    _request: OwnedSemaphorePermit,
    _memory: BudgetPermit,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Admission({} memory units)", self._memory.units())
    }
}

impl Admission {
    /// An admission from permits taken elsewhere (a protocol's own tests).
    pub fn from_parts(request: OwnedSemaphorePermit, memory: BudgetPermit) -> Admission {
        Admission { _request: request, _memory: memory }
    }
}

/// What every request of a session shares; one `Arc` clone per request that leaves
/// the reader.
struct Shared {
    volume: Arc<dyn BlockVolume>,
    frontend: Arc<Frontend>,
    /// The session's statistics (see [`crate::iostats`]); retired when the last
    /// request and the executor are gone.
    recorder: Arc<Recorder>,
    recorder_id: u64,
    /// The volume's [`WriteGate`] in `frontend.write_gates`.
    gate_index: usize,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.frontend.io_stats.retire(self.recorder_id);
    }
}

impl Shared {
    fn gate(&self) -> &WriteGate {
        self.frontend.write_gates.get(self.gate_index)
    }

    fn record(&self, kind: IoKind, bytes: u64, started_ns: u64, failed: bool) {
        let latency_ns = self.frontend.clock.now_ns().saturating_sub(started_ns);
        self.recorder.record(kind, bytes, latency_ns, failed);
    }

    /// Record and build the completion.
    fn finish(&self, kind: (IoKind, u64), started_ns: u64, result: zilla_core::Result<Output>, admission: Admission) -> Completion {
        self.record(kind.0, kind.1, started_ns, result.is_err());
        Completion { result, admission }
    }
}

/// The request path of one connection to one volume: its budgets, its volume, its
/// counters. Used by the connection's reader; completions may come from any thread.
pub struct Executor {
    shared: Arc<Shared>,
    requests: Arc<Semaphore>,
    requests_max: usize,
    memory: BudgetShare,
    volume_calls: BudgetShare,
    zero_calls: Arc<Semaphore>,
}

/// What a submitted request holds until its completion.
enum CallPermit {
    Budget(#[allow(dead_code)] BudgetPermit),
    AfterDelay(#[allow(dead_code)] OwnedSemaphorePermit),
    None,
}

/// A request on its way (in a task, a blocking thread or an engine completion). Its
/// drop completes it with an I/O error if nothing else did.
pub struct Pending<C: Completer> {
    inner: Option<PendingInner<C>>,
}

struct PendingInner<C> {
    completer: C,
    admission: Admission,
    kind: (IoKind, u64),
    started_ns: u64,
    shared: Arc<Shared>,
    _call: CallPermit,
    _zero_call: Option<OwnedSemaphorePermit>,
}

impl<C: Completer> Pending<C> {
    fn complete(mut self, result: zilla_core::Result<Output>) {
        if let Some(inner) = self.inner.take() {
            let PendingInner { completer, admission, kind, started_ns, shared, _call, _zero_call } = inner;
            // the volume call ends before the completion is handed on
            drop((_call, _zero_call));
            completer.complete(shared.finish(kind, started_ns, result, admission));
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.inner.as_ref().expect("a pending request is completed only once").shared
    }

    fn set_call(&mut self, call: CallPermit) {
        if let Some(inner) = self.inner.as_mut() {
            inner._call = call;
        }
    }
}

impl<C: Completer> Drop for Pending<C> {
    fn drop(&mut self) {
        if self.inner.is_some() {
            tracing::warn!("front end: a request's work ended without a result; answering it with an I/O error");
            let error = std::io::Error::other("the request's work ended without a result");
            Pending { inner: self.inner.take() }.complete(Err(Error::Io(error)));
        }
    }
}

impl Executor {
    /// The executor of one connection to `volume` (exported as `export`), with at most
    /// `requests_max` requests in flight, recording on a recorder registered with
    /// `labels` (see [`crate::iostats`]).
    pub fn new(
        frontend: &Arc<Frontend>,
        volume: Arc<dyn BlockVolume>,
        export: &str,
        requests_max: usize,
        labels: SessionLabels,
    ) -> Executor {
        // Clamped so that idle()'s acquire_many(u32) can take every slot.
        let requests_max = requests_max.clamp(1, u32::MAX as usize);
        let registration = frontend.io_stats.register(export, labels);
        Executor {
            shared: Arc::new(Shared {
                gate_index: frontend.write_gates.index_of(&volume.name()),
                volume,
                recorder: registration.recorder,
                recorder_id: registration.id,
                frontend: frontend.clone(),
            }),
            requests: Arc::new(Semaphore::new(requests_max)),
            requests_max,
            memory: frontend.memory.share(),
            volume_calls: frontend.volume_calls.share(),
            zero_calls: Arc::new(Semaphore::new(ZERO_CALLS_PER_CONNECTION)),
        }
    }

    /// The volume's block size: a front end cuts a WRITE's payload at these boundaries
    /// as it reads it ([`WriteData::cut`]) so whole blocks are taken by reference.
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.shared.volume.block_size())
    }

    /// A request slot and `memory_units` of memory, if available without waiting.
    pub fn try_admit(&self, memory_units: usize) -> Option<Admission> {
        let request = self.requests.clone().try_acquire_owned().ok()?;
        let memory = self.memory.try_acquire(memory_units)?;
        Some(Admission { _request: request, _memory: memory })
    }

    /// A request slot and `memory_units` of memory; `before_wait` runs first if that
    /// means waiting. Cancel-safe.
    pub async fn admit(&self, memory_units: usize, before_wait: impl FnOnce()) -> Admission {
        if let Some(admission) = self.try_admit(memory_units) {
            return admission;
        }
        before_wait();
        let memory = self.memory.acquire(memory_units).await;
        // The semaphore is never closed; if it were, waiting forever would be wrong, so
        // make a fresh permit rather than panic.
        let request = match self.requests.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => Arc::new(Semaphore::new(1)).try_acquire_owned().expect("fresh semaphore has a permit"),
        };
        Admission { _request: request, _memory: memory }
    }

    /// Count a request the protocol answered without submitting it (refused by
    /// validation, the server stopping).
    pub fn refuse(&self, kind: IoKind, bytes: u64, started_ns: u64) {
        self.shared.record(kind, bytes, started_ns, true);
    }

    /// Now on the front end's clock: a request's `started_ns`.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.shared.frontend.clock.now_ns()
    }

    /// True when no admission of this connection is held.
    pub fn nothing_in_flight(&self) -> bool {
        self.requests.available_permits() >= self.requests_max
    }

    /// Resolves when no admission of this connection is held.
    pub async fn idle(&self) {
        let _all = self.requests.acquire_many(self.requests_max as u32).await;
    }

    /// Start `request` without waiting: served inline ([`Submitted::Inline`], the
    /// completion comes back; `completer` is never called), started ([`Submitted::Started`], the
    /// completer gets the completion later, exactly once), or waiting for a permit
    /// ([`Submitted::Blocked`]: pass it to [`Executor::resume`]). Not async, so the
    /// common paths build no future.
    pub fn submit<C: Completer>(&self, request: Request, admission: Admission, completer: impl FnOnce() -> C) -> Submitted<C> {
        let shared = &self.shared;
        let kind = request.command.io_kind();
        let Request { command, started_ns } = request;
        let command = match try_inline(shared, command) {
            Inline::Done(result) => return Submitted::Inline(shared.finish(kind, started_ns, result, admission)),
            Inline::No(command) => command,
        };
        let pending = Pending {
            inner: Some(PendingInner {
                completer: completer(),
                admission,
                kind,
                started_ns,
                shared: shared.clone(),
                _call: CallPermit::None,
                _zero_call: None,
            }),
        };
        if let Command::Write { offset, data, fua } = command {
            if let WriteDelay::After(delay) = shared.volume.claim_write_delay(data.len() as u64) {
                tokio::spawn(delayed_write(pending, offset, data, fua, delay));
                return Submitted::Started;
            }
            return self.try_start_call(pending, Command::Write { offset, data, fua });
        }
        self.try_start_call(pending, command)
    }

    /// Wait for the permits a [`Submitted::Blocked`] request lacks, then start it.
    /// `before_wait` runs first. Dropping the future before it is done completes the
    /// request with an I/O error.
    pub async fn resume<C: Completer>(&self, blocked: Blocked<C>, before_wait: impl FnOnce()) {
        let Blocked { mut pending, command } = blocked;
        before_wait();
        if is_zero_call(&command) {
            let zero_call = self.zero_calls.clone().acquire_owned().await.ok();
            if let Some(inner) = pending.inner.as_mut() {
                inner._zero_call = zero_call;
            }
        }
        let call = self.volume_calls.acquire(1).await;
        pending.set_call(CallPermit::Budget(call));
        start_call(pending, command);
    }

    /// Take the permits a volume call needs if they are free, and start it.
    fn try_start_call<C: Completer>(&self, mut pending: Pending<C>, command: Command) -> Submitted<C> {
        if is_zero_call(&command) {
            match self.zero_calls.clone().try_acquire_owned() {
                Ok(zero_call) => {
                    if let Some(inner) = pending.inner.as_mut() {
                        inner._zero_call = Some(zero_call);
                    }
                }
                Err(_) => return Submitted::Blocked(Blocked { pending, command }),
            }
        }
        let Some(call) = self.volume_calls.try_acquire(1) else {
            if let Some(inner) = pending.inner.as_mut() {
                inner._zero_call = None; // taken again by resume, in order
            }
            return Submitted::Blocked(Blocked { pending, command });
        };
        pending.set_call(CallPermit::Budget(call));
        start_call(pending, command);
        Submitted::Started
    }
}

/// What [`Executor::submit`] did with a request.
pub enum Submitted<C: Completer> {
    /// Served inline: its completion (the completer was not made).
    Inline(Completion),
    /// Under way; the completer gets the completion.
    Started,
    /// Waiting for a volume call or the connection's zero-call slot: hand it to
    /// [`Executor::resume`] (dropping it completes the request with an I/O error).
    Blocked(Blocked<C>),
}

/// A request waiting for a permit (see [`Submitted::Blocked`]).
pub struct Blocked<C: Completer> {
    pending: Pending<C>,
    command: Command,
}

/// UNMAP / WRITE ZEROES / WRITE SAME: one at a time per connection.
fn is_zero_call(command: &Command) -> bool {
    matches!(command, Command::Unmap { .. } | Command::UnmapList { .. } | Command::WriteZeroes { .. } | Command::WriteSame { .. })
}

/// Start a request that holds its permits the cheapest way it goes: an async engine
/// read or commit, else the blocking pool.
fn start_call<C: Completer>(pending: Pending<C>, command: Command) {
    let (pending, command) = match try_read_async(pending, command) {
        Ok(()) => return,
        Err(back) => back,
    };
    if let Err((pending, command)) = try_commit_async(pending, command) {
        tokio::task::spawn_blocking(move || {
            let result = execute_blocking(pending.shared(), &command);
            give_buffers(pending.shared(), command);
            pending.complete(result);
        });
    }
}

/// The outcome of [`try_inline`].
enum Inline {
    Done(zilla_core::Result<Output>),
    No(Command),
}

/// Requests answered on the caller's (reactor) thread: cached reads, writes the volume
/// takes without blocking, prefetch hints.
fn try_inline(shared: &Shared, command: Command) -> Inline {
    match command {
        Command::Read { offset, length, prefix_bytes, holes } => match try_read_inline(shared, offset, length, prefix_bytes) {
            Some(result) => Inline::Done(result),
            None => Inline::No(Command::Read { offset, length, prefix_bytes, holes }),
        },
        // A write the volume can take without blocking (no throttle delay, no device
        // read) is applied here.
        Command::Write { offset, data, fua: false } => {
            let applied = shared.gate().try_enter().and_then(|_token| shared.volume.try_write_nonblocking(offset, &data));
            match applied {
                Some(result) => Inline::Done(result.map(|()| Output::Done)),
                None => Inline::No(Command::Write { offset, data, fua: false }),
            }
        }
        // The ARC decides what stays in memory: acknowledged at once.
        Command::Prefetch { .. } => Inline::Done(Ok(Output::Done)),
        command => Inline::No(command),
    }
}

/// A READ from memory: the volume's block buffers as they are when it can share them
/// (no copy), else copied into a reply buffer. `None`: not all in memory.
fn try_read_inline(shared: &Shared, offset: u64, length: u32, prefix_bytes: usize) -> Option<zilla_core::Result<Output>> {
    let volume = &*shared.volume;
    if length == 0 {
        return Some(Ok(Output::Data(ReadData::Copied(shared.frontend.buffers.take(prefix_bytes)))));
    }
    if let Some(result) = volume.try_read_cached_shared(offset, u64::from(length)) {
        return Some(result.map(|pieces| Output::Data(ReadData::Shared(pieces))));
    }
    if volume.cached_reads_are_shared(u64::from(length)) {
        return None; // a block is not in memory: the copying way would miss as well
    }
    let mut buffer = shared.frontend.buffers.take(prefix_bytes + length as usize);
    match volume.try_read_cached(offset, &mut buffer[prefix_bytes..]) {
        Some(Ok(())) => Some(Ok(Output::Data(ReadData::Copied(buffer)))),
        Some(Err(error)) => {
            shared.frontend.buffers.give(buffer);
            Some(Err(error))
        }
        None => {
            shared.frontend.buffers.give(buffer);
            None
        }
    }
}

/// A READ that missed the cache, without a blocking thread: the volume issues the one
/// block it lacks and the engine thread that completes the device read completes the
/// request. When the read cannot finish that way (several blocks, an indirect block not
/// cached, a copy that failed or did not verify: the blocking read tries every copy and
/// heals), its completion hands it to the blocking pool. `Err` gives it back (another
/// command).
fn try_read_async<C: Completer>(pending: Pending<C>, command: Command) -> Result<(), (Pending<C>, Command)> {
    let Command::Read { offset, length, prefix_bytes, holes } = command else {
        return Err((pending, command));
    };
    let handle = tokio::runtime::Handle::current();
    let volume = pending.shared().volume.clone();
    volume.read_async(offset, u64::from(length), Box::new(move |result| match result {
        Some(result) => pending.complete(result.map(|pieces| Output::Data(ReadData::Shared(pieces)))),
        None => to_blocking_pool(&handle, pending, Command::Read { offset, length, prefix_bytes, holes }),
    }));
    Ok(())
}

/// Run `command` on the blocking pool from a completion that may run on an engine
/// thread: the hand-off happens inside a task, so a blocking pool that cannot start a
/// thread (spawn_blocking panics then) fails this request's task, never the engine
/// thread that completes device I/O.
fn to_blocking_pool<C: Completer>(handle: &tokio::runtime::Handle, pending: Pending<C>, command: Command) {
    handle.spawn(async move {
        let _ = tokio::task::spawn_blocking(move || {
            let result = execute_blocking(pending.shared(), &command);
            give_buffers(pending.shared(), command);
            pending.complete(result);
        })
        .await;
    });
}

/// FLUSH, and a WRITE that must be durable before its completion (FUA, or any write
/// to a `sync=always` volume), without a blocking thread: the write is applied here
/// when the volume can take it at once, the commit is started here, and the engine
/// thread that completes the intent-log write completes the request. When the commit
/// cannot finish without blocking (another commit holds the log: batching; a txg to
/// wait for), it runs the blocking `flush` on the blocking pool. `Err` gives the
/// request back (a write the volume cannot take at once, other commands).
fn try_commit_async<C: Completer>(pending: Pending<C>, command: Command) -> Result<(), (Pending<C>, Command)> {
    match command {
        Command::Flush => {}
        Command::Write { offset, data, fua } => {
            let shared = pending.shared().clone();
            let applied = shared.gate().try_enter().and_then(|_token| shared.volume.try_write_nonblocking_sync(offset, &data, fua));
            match applied {
                None => return Err((pending, Command::Write { offset, data, fua })),
                Some(Ok(true)) => {}
                Some(done) => {
                    pending.complete(done.map(|_| Output::Done));
                    return Ok(());
                }
            }
        }
        command => return Err((pending, command)),
    }
    commit_then_complete(pending);
    Ok(())
}

/// Start the commit a FLUSH or a durable write needs; its engine completion completes
/// the request (through the blocking pool when the commit cannot finish without
/// blocking).
fn commit_then_complete<C: Completer>(pending: Pending<C>) {
    let handle = tokio::runtime::Handle::current();
    let volume = pending.shared().volume.clone();
    volume.flush_async(Box::new(move |result| match result {
        Some(result) => pending.complete(result.map(|()| Output::Done)),
        None => to_blocking_pool(&handle, pending, Command::Flush),
    }));
}

/// A WRITE the write throttle delays: it waits on the throttle timer holding its
/// admission but no thread and no volume call; then it is applied without a second
/// delay, inline when the volume can take it at once (and committed without a thread
/// when it must be durable), else on the blocking pool under one of the front ends'
/// `delayed_write_calls`.
async fn delayed_write<C: Completer>(mut pending: Pending<C>, offset: u64, data: WriteData, fua: bool, delay: Duration) {
    crate::delay_timer::sleep(delay).await;
    let shared = pending.shared().clone();
    let applied = shared.gate().try_enter().and_then(|_token| shared.volume.try_write_after_delay(offset, &data, fua));
    let needs_commit = match applied {
        Some(Ok(true)) => true,
        Some(done) => return pending.complete(done.map(|_| Output::Done)),
        None => false,
    };
    if let Ok(permit) = shared.frontend.delayed_write_calls.clone().acquire_owned().await {
        pending.set_call(CallPermit::AfterDelay(permit));
    }
    if needs_commit {
        return commit_then_complete(pending);
    }
    tokio::task::spawn_blocking(move || {
        let result = {
            let _token = shared.gate().enter();
            shared.volume.write_after_delay(offset, &data, fua)
        };
        pending.complete(result.map(|()| Output::Done));
    });
}

/// Give a finished command's buffers back to the front ends' pool.
fn give_buffers(shared: &Shared, command: Command) {
    match command {
        // a write's pieces may be blocks of the dirty set now: they go when the last
        // owner lets go
        Command::Write { data, .. } => drop(data),
        Command::WriteSame { pattern, .. } => shared.frontend.buffers.give(pattern),
        Command::CompareAndWrite { compare, data, .. } => {
            shared.frontend.buffers.give(compare);
            shared.frontend.buffers.give(data);
        }
        Command::OrWrite { data, .. } => shared.frontend.buffers.give(data),
        _ => {}
    }
}

/// Run a command that may block on the volume.
fn execute_blocking(shared: &Shared, command: &Command) -> zilla_core::Result<Output> {
    let volume = &*shared.volume;
    let then_flush = |fua: bool| if fua { volume.flush() } else { Ok(()) };
    match *command {
        Command::Read { offset, length, prefix_bytes, holes } => read_blocking(shared, offset, length, prefix_bytes, holes),
        Command::BlockStatus { offset, length } => {
            volume.block_status(offset, length.min(BLOCK_STATUS_SPAN_MAX_BYTES)).map(Output::Extents)
        }
        Command::Write { offset, ref data, fua } => {
            // (a durable write holds the gate through its commit: a COMPARE AND WRITE
            // may wait that long, plain writes never do)
            let _token = shared.gate().enter();
            volume.write_data(offset, data, fua).map(|()| Output::Done)
        }
        Command::Flush => volume.flush().map(|()| Output::Done),
        Command::Unmap { offset, length, fua } => {
            in_pieces(offset, length, |at, len| gated(shared, || volume.unmap(at, len))).and_then(|()| then_flush(fua)).map(|()| Output::Done)
        }
        Command::UnmapList { ref ranges, fua } => ranges
            .iter()
            .try_for_each(|&(offset, length)| in_pieces(offset, length, |at, len| gated(shared, || volume.unmap(at, len))))
            .and_then(|()| then_flush(fua))
            .map(|()| Output::Done),
        // Zeroing is done the cheap way (blocks freed, partial ones zeroed): a
        // copy-on-write pool cannot promise space for future overwrites either way.
        Command::WriteZeroes { offset, length, fua } => in_pieces(offset, length, |at, len| gated(shared, || volume.write_zeroes(at, len)))
            .and_then(|()| then_flush(fua))
            .map(|()| Output::Done),
        Command::WriteSame { offset, length, ref pattern, fua } => {
            write_same(shared, offset, length, pattern).and_then(|()| then_flush(fua)).map(|()| Output::Done)
        }
        Command::CompareAndWrite { offset, ref compare, ref data, fua } => compare_and_write(shared, offset, compare, data, fua),
        Command::OrWrite { offset, ref data, fua } => or_write(shared, offset, data, fua),
        Command::Prefetch { .. } => Ok(Output::Done),
    }
}

/// A write-like volume call inside the volume's write gate (a blocking thread).
fn gated<T>(shared: &Shared, call: impl FnOnce() -> T) -> T {
    let _token = shared.gate().enter();
    call()
}

/// Apply `op` to `[offset, offset+length)` in pieces of at most `ZERO_CALL_MAX_BYTES`.
fn in_pieces(offset: u64, length: u64, mut op: impl FnMut(u64, u64) -> zilla_core::Result<()>) -> zilla_core::Result<()> {
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

/// A READ that missed the cache, on the blocking pool. A range that is one hole is
/// answered `Hole` when the read allows it.
fn read_blocking(shared: &Shared, offset: u64, length: u32, prefix_bytes: usize, holes: bool) -> zilla_core::Result<Output> {
    if holes && length > 0 {
        if let Ok(extents) = shared.volume.block_status(offset, u64::from(length)) {
            if let [only] = extents.as_slice() {
                if only.hole && only.length >= u64::from(length) {
                    return Ok(Output::Data(ReadData::Hole));
                }
            }
        }
    }
    let mut buffer = shared.frontend.buffers.take(prefix_bytes + length as usize);
    match shared.volume.read(offset, &mut buffer[prefix_bytes..]) {
        Ok(()) => Ok(Output::Data(ReadData::Copied(buffer))),
        Err(error) => {
            shared.frontend.buffers.give(buffer);
            Err(error)
        }
    }
}

/// WRITE SAME: an all-zero pattern zeroes the range the cheap way; any other is
/// repeated into one buffer of at most `WRITE_SAME_BUFFER_MAX_BYTES` written piece by
/// piece.
fn write_same(shared: &Shared, offset: u64, length: u64, pattern: &[u8]) -> zilla_core::Result<()> {
    let volume = &*shared.volume;
    if pattern.is_empty() || pattern.len() > WRITE_SAME_BUFFER_MAX_BYTES || length % pattern.len() as u64 != 0 {
        return Err(Error::invalid(format!("write same: {length} bytes is not a multiple of a {}-byte pattern", pattern.len())));
    }
    if pattern.iter().all(|&b| b == 0) {
        return in_pieces(offset, length, |at, len| gated(shared, || volume.write_zeroes(at, len)));
    }
    let repeats = (WRITE_SAME_BUFFER_MAX_BYTES / pattern.len()).max(1) as u64;
    let piece_max = (repeats * pattern.len() as u64).min(length);
    let mut buffer = shared.frontend.buffers.take(piece_max as usize);
    for chunk in buffer.chunks_mut(pattern.len()) {
        chunk.copy_from_slice(pattern);
    }
    let mut done = 0;
    let mut result = Ok(());
    while done < length && result.is_ok() {
        let piece = (length - done).min(piece_max);
        result = gated(shared, || volume.write(offset + done, &buffer[..piece as usize], false));
        done += piece;
    }
    shared.frontend.buffers.give(buffer);
    result
}

/// OR WRITE inside the volume's write gate: read, OR, write, with no write between.
fn or_write(shared: &Shared, offset: u64, data: &[u8], fua: bool) -> zilla_core::Result<Output> {
    let volume = &*shared.volume;
    shared.gate().exclusive(|| {
        let mut current = shared.frontend.buffers.take(data.len());
        let result = volume.read(offset, &mut current).and_then(|()| {
            current.iter_mut().zip(data).for_each(|(c, d)| *c |= d);
            volume.write(offset, &current, false)
        });
        shared.frontend.buffers.give(current);
        result
    })?;
    if fua {
        volume.flush()?;
    }
    Ok(Output::Done)
}

/// COMPARE AND WRITE under the volume's lock: read, compare, write if equal.
fn compare_and_write(shared: &Shared, offset: u64, compare: &[u8], data: &[u8], fua: bool) -> zilla_core::Result<Output> {
    if compare.len() != data.len() {
        return Err(Error::invalid(format!("compare and write: {} bytes to compare, {} to write", compare.len(), data.len())));
    }
    let volume = &*shared.volume;
    // the write is applied inside the gate; its commit (FUA) after it
    let applied = shared.gate().exclusive(|| {
        let mut current = shared.frontend.buffers.take(compare.len());
        let read = volume.read(offset, &mut current);
        let differs = current.iter().zip(compare).position(|(a, b)| a != b);
        shared.frontend.buffers.give(current);
        read?;
        if let Some(at) = differs {
            return Ok(Some(at as u64));
        }
        volume.write(offset, data, false).map(|()| None)
    })?;
    match applied {
        Some(at) => Ok(Output::Miscompare { offset: at }),
        None if fua => volume.flush().map(|()| Output::Done),
        None => Ok(Output::Done),
    }
}
