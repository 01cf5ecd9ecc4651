//! writer: the write side of one connection, and the session's command window.
//!
//! Theory of operation
//! -------------------
//! Everything a connection sends (login and text responses, R2Ts, Data-In, SCSI
//! Responses, NOP-Ins, Rejects) is an [`OutPdu`] handed to one writer task through a
//! channel; completions on any thread (engine, blocking pool) only build the PDUs and
//! send them, they never wait for the client. The channel is bounded by what feeds it:
//! every command holds a slot of the CmdSN window (and its admission, with its share
//! of the memory budget) until its last PDU is on the wire; what holds no slot
//! (immediate commands, NOP-Outs, rejects) is bounded by the count of queued PDUs: the
//! connection's reader takes no new PDU from the client while more than
//! `QUEUED_PDUS_MAX` wait here ([`OutSender::room`]), so a client that sends without
//! reading its replies stalls itself, and `reply_stall_timeout` ends it.
//!
//! The writer fills in the sequence numbers as each PDU leaves, so they are in wire
//! order whatever thread finished the command: StatSN (advanced by every PDU that
//! carries a status, told to an R2T without advancing), ExpCmdSN and MaxCmdSN from
//! the [`CommandWindow`]. MaxCmdSN = ExpCmdSN - 1 + window - commands in flight, so a
//! command's slot reopens only when its response is written, and MaxCmdSN never goes
//! back. Digests are computed here too. A client whose socket takes nothing for
//! `reply_stall_timeout` ends the connection.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use std::io::IoSlice;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{mpsc, Notify};
use zilla_frontend::volume::SharedSlice;
use zilla_frontend::{Admission, Frontend};

use crate::pdu::{self, Bhs, Digests};

/// The CmdSN window of a session (one connection per session here).
#[derive(Debug)]
pub(crate) struct CommandWindow {
    pub(crate) exp_cmd_sn: u32,
    pub(crate) in_flight: u32,
    pub(crate) size: u32,
}

impl CommandWindow {
    pub(crate) fn max_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn.wrapping_sub(1).wrapping_add(self.size.saturating_sub(self.in_flight))
    }
}

/// How a PDU treats StatSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatSn {
    /// Not carried (Data-In without status).
    None,
    /// Carries the current StatSN and advances it.
    Advance,
    /// Carries the next StatSN without advancing (R2T, Reject of a data PDU).
    Peek,
}

/// Read data shared by the Data-In PDUs of one command.
pub(crate) enum ReadBody {
    Copied { buffer: Vec<u8>, frontend: Arc<Frontend> },
    Shared(Vec<SharedSlice>),
    Owned(Vec<u8>),
}

impl ReadBody {
    /// The pieces of `[start, start+len)`.
    fn pieces(&self, start: usize, len: usize) -> Vec<&[u8]> {
        let end = start + len;
        let mut out = Vec::new();
        let mut f = |p| out.push(p);
        match self {
            ReadBody::Copied { buffer, .. } | ReadBody::Owned(buffer) => f(buffer.get(start..end).unwrap_or(&[])),
            ReadBody::Shared(slices) => {
                let mut at = 0;
                for s in slices {
                    let (from, to) = (at, at + s.len());
                    at = to;
                    if to <= start || from >= end {
                        continue;
                    }
                    let a = start.max(from) - from;
                    let b = end.min(to) - from;
                    f(&s.as_slice()[a..b]);
                }
            }
        }
        out
    }
}

impl ReadBody {
    /// Do the body's first `expected.len()` bytes equal `expected`?
    pub(crate) fn equals(&self, expected: &[u8]) -> bool {
        let mut at = 0;
        for piece in self.pieces(0, expected.len()) {
            if expected.get(at..at + piece.len()) != Some(piece) {
                return false;
            }
            at += piece.len();
        }
        at == expected.len()
    }
}

impl Drop for ReadBody {
    fn drop(&mut self) {
        if let ReadBody::Copied { buffer, frontend } = self {
            frontend.buffers.give(std::mem::take(buffer));
        }
    }
}

/// A PDU's data segment.
pub(crate) enum Payload {
    None,
    Bytes(Vec<u8>),
    Range { body: Arc<ReadBody>, start: usize, len: usize },
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::Bytes(b) => b.len(),
            Payload::Range { len, .. } => *len,
        }
    }
}

/// One PDU to send.
pub(crate) struct OutPdu {
    pub(crate) bhs: Bhs,
    pub(crate) data: Payload,
    pub(crate) stat_sn: StatSn,
    /// The last PDU of a non-immediate command: its window slot reopens once written.
    pub(crate) ends_command: bool,
    /// Held until the PDU is on the wire (budget, request slot).
    pub(crate) admission: Option<Admission>,
    /// Close the connection after this PDU (Logout Response, fatal Reject).
    pub(crate) then_close: bool,
}

impl OutPdu {
    pub(crate) fn new(bhs: Bhs, data: Payload, stat_sn: StatSn) -> OutPdu {
        OutPdu { bhs, data, stat_sn, ends_command: false, admission: None, then_close: false }
    }
}

/// PDUs queued for the writer above which the reader takes no new PDU.
pub(crate) const QUEUED_PDUS_MAX: usize = 4096;

/// How many PDUs wait for the writer, and a wake-up when it wrote some.
#[derive(Default)]
struct QueueDepth {
    pdus: AtomicUsize,
    drained: Notify,
}

/// The sending side of a connection's PDU queue (cloned by every completion).
#[derive(Clone)]
pub(crate) struct OutSender {
    tx: mpsc::UnboundedSender<OutPdu>,
    depth: Arc<QueueDepth>,
}

/// The writer's side of the queue.
pub(crate) struct OutReceiver {
    rx: mpsc::UnboundedReceiver<OutPdu>,
    depth: Arc<QueueDepth>,
}

/// A connection's PDU queue.
pub(crate) fn queue() -> (OutSender, OutReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let depth = Arc::new(QueueDepth::default());
    (OutSender { tx, depth: depth.clone() }, OutReceiver { rx, depth })
}

impl OutSender {
    /// Queue `pdu` for the writer; `Err` once the writer is gone.
    pub(crate) fn send(&self, pdu: OutPdu) -> Result<(), mpsc::error::SendError<OutPdu>> {
        self.depth.pdus.fetch_add(1, Ordering::Relaxed);
        let sent = self.tx.send(pdu);
        if sent.is_err() {
            self.depth.pdus.fetch_sub(1, Ordering::Relaxed);
        }
        sent
    }

    /// Wait until at most `QUEUED_PDUS_MAX` PDUs are queued.
    pub(crate) async fn room(&self) {
        loop {
            let drained = self.depth.drained.notified();
            if self.depth.pdus.load(Ordering::Relaxed) <= QUEUED_PDUS_MAX {
                return;
            }
            drained.await;
        }
    }

    /// Resolves when the writer has stopped (the client stalled, the socket failed).
    pub(crate) async fn closed(&self) {
        self.tx.closed().await
    }

    /// PDUs queued now.
    pub(crate) fn queued(&self) -> usize {
        self.depth.pdus.load(Ordering::Relaxed)
    }
}

/// Most PDUs gathered into one vectored write.
const GATHER_MAX: usize = 64;

/// Gathering stops once this many data bytes are in the batch (NBD's bound). A long
/// write holds the socket's lock, and the client's ACKs that arrive meanwhile wait in
/// the socket's backlog for this thread to process, and to push the rest of the data
/// from, when the write ends: 64 Data-In PDUs of 128 KiB each made the writer do the
/// receive side's work too.
const GATHER_BYTES_MAX: usize = 1 << 20;

/// Write PDUs until the channel closes (every sender dropped) or a PDU asks to close.
/// The PDUs waiting when the writer wakes (up to `GATHER_MAX`) go out in vectored
/// writes: headers, digests and padding from small arrays, data segments straight
/// from the read's buffers (a volume block shared with the ARC is never copied).
pub(crate) async fn run<W: AsyncWrite + Unpin>(
    mut out: W,
    queue: OutReceiver,
    window: Arc<Mutex<CommandWindow>>,
    mut stat_sn: u32,
    digests: Digests,
    stall: Duration,
) -> io::Result<()> {
    let stall = if stall.is_zero() { Duration::from_secs(100 * 365 * 86_400) } else { stall };
    let OutReceiver { rx: mut queue, depth } = queue;
    let mut batch: Vec<OutPdu> = Vec::with_capacity(GATHER_MAX);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        let mut close = false;
        let mut gathered_bytes = 0usize;
        while let Some(mut pdu) = next.take() {
            // fill the sequence numbers in wire order
            {
                let mut w = window.lock();
                if pdu.ends_command {
                    w.in_flight = w.in_flight.saturating_sub(1);
                }
                match pdu.stat_sn {
                    StatSn::None => {}
                    StatSn::Advance => {
                        pdu.bhs.set_u32(24, stat_sn);
                        stat_sn = stat_sn.wrapping_add(1);
                    }
                    StatSn::Peek => pdu.bhs.set_u32(24, stat_sn),
                }
                pdu.bhs.set_u32(28, w.exp_cmd_sn);
                pdu.bhs.set_u32(32, w.max_cmd_sn());
            }
            pdu.bhs.set_data_segment_bytes(pdu.data.len());
            close |= pdu.then_close;
            gathered_bytes += pdu.data.len();
            batch.push(pdu);
            if close || batch.len() >= GATHER_MAX || gathered_bytes >= GATHER_BYTES_MAX {
                break;
            }
            next = queue.try_recv().ok();
        }
        tokio::time::timeout(stall, write_batch(&mut out, &batch, digests)).await.map_err(|_| stalled())??;
        let written = batch.len();
        batch.clear(); // admissions and buffers go back now that the bytes are on the wire
        let before = depth.pdus.fetch_sub(written, Ordering::Relaxed);
        if before > QUEUED_PDUS_MAX && before - written <= QUEUED_PDUS_MAX {
            depth.drained.notify_waiters();
        }
        if close {
            break;
        }
    }
    let _ = out.shutdown().await;
    Ok(())
}

/// What a PDU adds around its data: the header (and its digest), then the padding and
/// the data digest.
struct Framing {
    head: [u8; 52],
    head_len: usize,
    tail: [u8; 7],
    tail_len: usize,
}

fn framing(pdu: &OutPdu, digests: Digests) -> Framing {
    let mut f = Framing { head: [0; 52], head_len: 48, tail: [0; 7], tail_len: 0 };
    f.head[..48].copy_from_slice(&pdu.bhs.0);
    if digests.header {
        f.head[48..52].copy_from_slice(&pdu::crc32c(&pdu.bhs.0).to_le_bytes());
        f.head_len = 52;
    }
    let len = pdu.data.len();
    if len > 0 {
        let pad = pdu::padded(len) - len;
        f.tail_len = pad; // zeros
        if digests.data {
            let mut crc = 0u32;
            for piece in payload_pieces(&pdu.data) {
                crc = pdu::crc32c_append(crc, piece);
            }
            crc = pdu::crc32c_append(crc, &[0u8; 3][..pad]);
            f.tail[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
            f.tail_len = pad + 4;
        }
    }
    f
}

fn payload_pieces(data: &Payload) -> Vec<&[u8]> {
    match data {
        Payload::None => Vec::new(),
        Payload::Bytes(b) => vec![b.as_slice()],
        Payload::Range { body, start, len } => body.pieces(*start, *len),
    }
}

/// Write every byte of `batch` with as few (vectored) system calls as the socket takes.
async fn write_batch<W: AsyncWrite + Unpin>(out: &mut W, batch: &[OutPdu], digests: Digests) -> io::Result<()> {
    let framings: Vec<Framing> = batch.iter().map(|pdu| framing(pdu, digests)).collect();
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(batch.len() * 3);
    for (pdu, f) in batch.iter().zip(&framings) {
        slices.push(IoSlice::new(&f.head[..f.head_len]));
        for piece in payload_pieces(&pdu.data) {
            if !piece.is_empty() {
                slices.push(IoSlice::new(piece));
            }
        }
        if f.tail_len > 0 {
            slices.push(IoSlice::new(&f.tail[..f.tail_len]));
        }
    }
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = out.write_vectored(rest).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "the connection took no bytes"));
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    out.flush().await
}

fn stalled() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the client took no bytes for the stall timeout")
}

