//! connection: one iSCSI connection, from the first Login Request to the close.
//!
//! Theory of operation
//! -------------------
//! ```text
//!   login (reader writes its responses itself, bounded by login_timeout)
//!     security stage (None or CHAP, security.rs) -> operational stage -> full feature phase
//!   full feature phase:
//!   socket read half                                              socket write half
//!        |                                                               ^
//!   [reader loop] -- CmdSN window check, CDB decode                      |
//!        |  answered from the unit's description --> OutPdu ----------> [writer task]
//!        |  READ / WRITE / SYNCHRONIZE CACHE --> Executor::submit         ^ (StatSN,
//!        |        (WRITE once its data is in: immediate, unsolicited,    |  MaxCmdSN,
//!        |         then R2T by R2T)                                      |  digests)
//!        |        completion on any thread --> IoCompleter --> OutPdus --+
//! ```
//!
//! The reader decodes the next PDU while earlier commands' I/O is in flight; it never
//! waits for a command, only for budget (an admission) or, for a request the executor
//! gives back `Blocked`, for a volume call. While it waits for budget it keeps reading
//! Data-Out PDUs of writes already admitted (their data is what frees the budget) and
//! holds every other PDU in a queue of at most `command_window + DEFERRED_EXTRA`.
//!
//! Bounds: commands in flight are at most the CmdSN window (a command out of the
//! window is dropped, as RFC 7143 says); each holds its admission (a share of the
//! daemon-wide memory budget, counted for its whole transfer) from when its data is
//! first buffered until its last PDU is written. Data segments are at most our
//! declared MaxRecvDataSegmentLength (the reader refuses longer ones), immediate data
//! at most FirstBurstLength, a transfer at most `REQUEST_MAX_BYTES`.
//!
//! Errors: a malformed header (a length above our limit, a wrong header digest)
//! closes the connection with a log line; a PDU we do not take (SNACK, an unknown
//! opcode, a Login in the full-feature phase, a bad data digest, a Data-Out for no
//! command) gets a Reject; a data phase out of order fails its command with ABORTED
//! COMMAND / DATA PHASE ERROR; Data-Out still on the way for a command that ended
//! early is dropped (`tags`). A bidirectional command (R and W both set) is refused:
//! INVALID FIELD IN CDB. Every SCSI error is a CHECK CONDITION with fixed-format sense
//! and the residual count of what was not transferred.
//!
//! A command waiting for Data-Out waits at most `data_out_timeout` for each next PDU
//! (while the reader is reading), counted from its own last Data-Out or, if later, the
//! last Data-Out of any command (initiators answer R2Ts in order: a command queued
//! behind one being fed is not stalled): then the connection ends with a log line, and the
//! commands' budget and window slots return. Ending the connection is what RFC 7143
//! allows a target at error recovery level 0, and it is safe: nothing of an unfinished
//! WRITE reaches the volume.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use zilla_frontend::volume::{AlignedBuf, BlockVolume, WriteData};
use zilla_frontend::{
    Admission, Command, Completer, Completion, Executor, Frontend, IoKind, Output, ReadData, Request, Submitted,
};

use crate::framing::{Frame, PduReader};
use crate::login::{LoginRefusal, Negotiation, SessionParams, SessionType};
use crate::security::{self, SecurityStage};
use crate::sessions::SessionInfo;
use crate::tags::EndedTags;
use crate::pdu::{self, op, reject, Bhs, Digests, Pdu, NO_TAG};
use crate::pr;
use crate::scsi::{self, Geometry, Operation, Sense, LOGICAL_BLOCK_BYTES};
use crate::writer::{self, CommandWindow, OutPdu, OutSender, Payload, ReadBody, StatSn};
use crate::{names, thin, IscsiConfig, IscsiStats};

/// PDUs held back (beyond the window) while the reader waits for budget.
const DEFERRED_EXTRA: usize = 16;
/// Bytes of text a login may spread over PDUs with the C bit.
const LOGIN_TEXT_MAX_BYTES: usize = 64 << 10;
/// Largest UNMAP parameter list read: the header, `UNMAP_DESCRIPTORS_MAX` descriptors and
/// one more, so a list with too many is refused whole instead of losing its tail.
const UNMAP_LIST_MAX_BYTES: usize = 8 + 16 * (thin::UNMAP_DESCRIPTORS_MAX as usize + 1);
/// Memory units charged on top of a transfer (headers, bookkeeping).
const COMMAND_OVERHEAD_UNITS: usize = 1024;

/// What every connection of the server shares.
pub(crate) struct ServerShared {
    pub(crate) frontend: Arc<Frontend>,
    pub(crate) config: IscsiConfig,
    pub(crate) stats: Arc<IscsiStats>,
    pub(crate) next_tsih: AtomicU16,
    /// Who may log in (read at each login) and the live sessions.
    pub(crate) access: crate::access::Access,
    /// Reservation state and unit attentions of each served volume.
    pub(crate) units: pr::Units,
    /// Connections in the login phase, per client address.
    pub(crate) logins: Arc<crate::access::LoginsInProgress>,
}

/// Where a connection is, for its logs and SendTargets.
pub(crate) struct Peer {
    pub(crate) client: String,
    /// "ip:port" of the initiator, for the session listing.
    pub(crate) address: String,
    /// The listener is on a loopback address (a target with no CHAP user is open here).
    pub(crate) listener_loopback: bool,
    /// "ip:port" of our end, for TargetAddress; `None` for a plain stream.
    pub(crate) portal: Option<String>,
    /// Held while the connection is in the login phase (the per-address bound).
    pub(crate) login_slot: Option<crate::access::LoginSlot>,
}

/// The logical unit of a normal session.
struct Unit {
    executor: Executor,
    /// What the SCSI answers describe; `blocks` follows the volume's size
    /// ([`Connection::notice_capacity`]).
    geometry: parking_lot::RwLock<Geometry>,
    volume: Arc<dyn BlockVolume>,
    export: String,
    wce: AtomicBool,
    replies: Arc<Replies>,
    /// This session's I_T nexus and the unit's shared reservation state.
    nexus: String,
    reservations: Arc<pr::SharedUnit>,
}

/// What a completion needs to answer.
struct Replies {
    out: OutSender,
    frontend: Arc<Frontend>,
    data_in_segment_bytes: usize,
    burst_bytes: usize,
}

/// A residual of a command (RFC 7143 §11.4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Residual {
    None,
    Under(u32),
    Over(u32),
}

impl Residual {
    /// `expected` bytes the initiator said, `wanted` bytes the command moves.
    fn of(expected: usize, wanted: usize) -> Residual {
        match expected.cmp(&wanted) {
            std::cmp::Ordering::Equal => Residual::None,
            std::cmp::Ordering::Greater => Residual::Under(clamp32(expected - wanted)),
            std::cmp::Ordering::Less => Residual::Over(clamp32(wanted - expected)),
        }
    }

    fn apply(self, bhs: &mut Bhs) {
        match self {
            Residual::None => {}
            Residual::Under(n) => {
                bhs.0[1] |= 0x02;
                bhs.set_u32(44, n);
            }
            Residual::Over(n) => {
                bhs.0[1] |= 0x04;
                bhs.set_u32(44, n);
            }
        }
    }
}

fn clamp32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A SCSI Response PDU.
fn scsi_response(itt: u32, status: u8, sense: Option<Sense>, residual: Residual, counted: bool) -> OutPdu {
    scsi_response_with_sense(itt, status, sense.map(|s| s.fixed()), residual, counted)
}

/// A SCSI Response PDU with these fixed-format sense bytes.
fn scsi_response_with_sense(itt: u32, status: u8, sense: Option<[u8; 18]>, residual: Residual, counted: bool) -> OutPdu {
    let mut bhs = Bhs::new(op::SCSI_RESPONSE, true);
    bhs.0[3] = status;
    bhs.set_u32(16, itt);
    residual.apply(&mut bhs);
    let data = match sense {
        Some(fixed) => {
            let mut d = Vec::with_capacity(2 + fixed.len());
            d.extend_from_slice(&(fixed.len() as u16).to_be_bytes());
            d.extend_from_slice(&fixed);
            Payload::Bytes(d)
        }
        None => Payload::None,
    };
    let mut pdu = OutPdu::new(bhs, data, StatSn::Advance);
    pdu.ends_command = counted;
    pdu
}

fn check_condition(itt: u32, sense: Sense, expected: usize, counted: bool) -> OutPdu {
    let residual = if expected > 0 { Residual::Under(clamp32(expected)) } else { Residual::None };
    scsi_response(itt, scsi::STATUS_CHECK_CONDITION, Some(sense), residual, counted)
}

/// Data-In PDUs for `len` bytes of `body`, the last with status GOOD (phase collapse).
#[allow(clippy::too_many_arguments)]
fn data_in(
    itt: u32,
    lun: [u8; 8],
    body: Arc<ReadBody>,
    len: usize,
    residual: Residual,
    segment_bytes: usize,
    burst_bytes: usize,
    counted: bool,
) -> Vec<OutPdu> {
    let segment_bytes = segment_bytes.max(512);
    let burst_bytes = burst_bytes.max(512);
    let mut pdus = Vec::with_capacity(len / segment_bytes + 1);
    let (mut at, mut data_sn, mut burst_end) = (0usize, 0u32, burst_bytes.min(len));
    while at < len {
        let n = segment_bytes.min(burst_end - at);
        let last = at + n == len;
        let mut bhs = Bhs::new(op::DATA_IN, at + n == burst_end);
        bhs.set_lun(lun);
        bhs.set_u32(16, itt);
        bhs.set_u32(20, NO_TAG);
        bhs.set_u32(36, data_sn);
        bhs.set_u32(40, clamp32(at));
        let stat = if last {
            bhs.0[1] |= 0x80 | 0x01; // F, S
            bhs.0[3] = scsi::STATUS_GOOD;
            residual.apply(&mut bhs);
            StatSn::Advance
        } else {
            StatSn::None
        };
        let mut pdu = OutPdu::new(bhs, Payload::Range { body: body.clone(), start: at, len: n }, stat);
        pdu.ends_command = last && counted;
        pdus.push(pdu);
        at += n;
        data_sn += 1;
        if at == burst_end {
            burst_end = (burst_end + burst_bytes).min(len);
        }
    }
    pdus
}

/// What a submitted command answers when it completes.
#[derive(Clone)]
enum Answer {
    /// COMPARE AND WRITE: a miscompare is reported with its byte offset.
    CompareAndWrite { residual: Residual },
    /// GET LBA STATUS from `lba`, at most `allocation` bytes.
    LbaStatus { lba: u64, allocation: usize, residual_of: usize },
    /// READ of `len` bytes.
    Read { len: usize, residual: Residual },
    /// VERIFY with BYTCHK 1: the read is compared with `data`.
    Compare { data: Arc<Vec<u8>>, residual: Residual },
    /// WRITE or SYNCHRONIZE CACHE.
    Done { residual: Residual, sense: Sense },
}

/// The completer of one command.
struct IoCompleter {
    replies: Arc<Replies>,
    itt: u32,
    lun: [u8; 8],
    expected: usize,
    counted: bool,
    answer: Answer,
}

impl IoCompleter {
    fn pdus(self, completion: Completion) -> Vec<OutPdu> {
        let Completion { result, admission } = completion;
        let r = &self.replies;
        let mut pdus = match (result, self.answer.clone()) {
            (Ok(Output::Data(data)), Answer::Read { len, residual }) => {
                let body = match data {
                    ReadData::Copied(buffer) => ReadBody::Copied { buffer, frontend: r.frontend.clone() },
                    ReadData::Shared(slices) => ReadBody::Shared(slices),
                    ReadData::Hole => ReadBody::Owned(vec![0; len]),
                };
                data_in(self.itt, self.lun, Arc::new(body), len, residual, r.data_in_segment_bytes, r.burst_bytes, self.counted)
            }
            (Ok(Output::Data(read)), Answer::Compare { data, residual }) => {
                let body = match read {
                    ReadData::Copied(buffer) => ReadBody::Copied { buffer, frontend: r.frontend.clone() },
                    ReadData::Shared(slices) => ReadBody::Shared(slices),
                    ReadData::Hole => ReadBody::Owned(vec![0; data.len()]),
                };
                if body.equals(&data) {
                    vec![scsi_response(self.itt, scsi::STATUS_GOOD, None, residual, self.counted)]
                } else {
                    vec![check_condition(self.itt, Sense::MISCOMPARE, 0, self.counted)]
                }
            }
            (Ok(Output::Miscompare { offset }), Answer::CompareAndWrite { .. }) => {
                let sense = Sense::MISCOMPARE.fixed_with_information(clamp32(offset as usize));
                vec![scsi_response_with_sense(self.itt, scsi::STATUS_CHECK_CONDITION, Some(sense), Residual::None, self.counted)]
            }
            (Ok(Output::Extents(extents)), Answer::LbaStatus { lba, allocation, residual_of }) => {
                let extents: Vec<(u64, u64, bool)> = extents.iter().map(|e| (e.offset, e.length, e.hole)).collect();
                let mut data = thin::lba_status(lba, &extents, allocation);
                let len = data.len().min(residual_of);
                let residual = Residual::of(residual_of, data.len());
                data.truncate(len);
                if data.is_empty() {
                    vec![scsi_response(self.itt, scsi::STATUS_GOOD, None, residual, self.counted)]
                } else {
                    let body = Arc::new(ReadBody::Owned(data));
                    data_in(self.itt, self.lun, body, len, residual, r.data_in_segment_bytes, r.burst_bytes, self.counted)
                }
            }
            (Ok(_), Answer::Done { residual, .. } | Answer::CompareAndWrite { residual }) => {
                vec![scsi_response(self.itt, scsi::STATUS_GOOD, None, residual, self.counted)]
            }
            (Ok(_), Answer::Read { .. } | Answer::Compare { .. } | Answer::LbaStatus { .. }) => {
                vec![check_condition(self.itt, Sense::INTERNAL_FAILURE, self.expected, self.counted)]
            }
            (Err(error), answer) => {
                let sense = match (&error, answer) {
                    (zilla_frontend::volume::Error::NoSpace, _) => Sense::NO_SPACE,
                    (zilla_frontend::volume::Error::ReadOnly(_), _) => Sense::WRITE_PROTECTED,
                    (_, Answer::Read { .. } | Answer::Compare { .. } | Answer::LbaStatus { .. }) => Sense::UNRECOVERED_READ_ERROR,
                    (_, Answer::Done { sense, .. }) => sense,
                    (_, Answer::CompareAndWrite { .. }) => Sense::WRITE_ERROR,
                };
                tracing::debug!(%error, itt = self.itt, "iscsi: command failed");
                vec![check_condition(self.itt, sense, self.expected, self.counted)]
            }
        };
        if let Some(last) = pdus.last_mut() {
            last.admission = Some(admission);
        }
        pdus
    }
}

impl Completer for IoCompleter {
    fn complete(self, completion: Completion) {
        let out = self.replies.out.clone();
        for pdu in self.pdus(completion) {
            let _ = out.send(pdu);
        }
    }
}

/// Where a command's data goes as it arrives.
enum Sink {
    Write { offset: u64, fua: bool, pieces: Vec<AlignedBuf>, starts: Vec<usize> },
    ModeSelect { ten: bool, buffer: Vec<u8> },
    /// VERIFY's data, compared with what the volume holds at `offset`.
    Compare { offset: u64, buffer: Vec<u8> },
    /// UNMAP's parameter list.
    Unmap { buffer: Vec<u8> },
    /// WRITE SAME's one block, to repeat over `length` bytes at `offset`.
    WriteSame { offset: u64, length: u64, unmap: bool, fua: bool, buffer: Vec<u8> },
    /// COMPARE AND WRITE's data: the blocks to compare, then those to write.
    CompareAndWrite { offset: u64, fua: bool, buffer: Vec<u8> },
    /// OR WRITE's data.
    OrWrite { offset: u64, fua: bool, buffer: Vec<u8> },
    /// PERSISTENT RESERVE OUT's parameter list.
    ReservationOut { service_action: u8, kind: u8, parameter_bytes: u32, buffer: Vec<u8> },
}

/// A WRITE's buffers for `keep` bytes at `offset`: cut at the volume's block
/// boundaries, so whole blocks go to the volume by reference.
fn write_sink(offset: u64, keep: usize, fua: bool, block_bytes: u64) -> Sink {
    let mut starts = Vec::new();
    let mut pieces = Vec::new();
    let mut at = 0;
    for n in WriteData::cut(offset, keep as u64, block_bytes) {
        starts.push(at);
        pieces.push(AlignedBuf::zeroed(n));
        at += n;
    }
    Sink::Write { offset, fua, pieces, starts }
}

/// A command waiting for its data (immediate, unsolicited Data-Out, then R2Ts).
struct PendingData {
    lun: [u8; 8],
    counted: bool,
    expected: usize,
    /// Bytes kept (the command's transfer, at most `expected`).
    keep: usize,
    /// Bytes the initiator will send in all (unsolicited, then solicited).
    total: usize,
    received: usize,
    unsolicited_end: usize,
    /// The outstanding R2T: (TTT, end offset).
    r2t: Option<(u32, usize)>,
    next_r2t_sn: u32,
    next_data_sn: u32,
    residual: Residual,
    sink: Sink,
    admission: Option<Admission>,
    started_ns: u64,
    /// When the command gives up waiting for its next Data-Out.
    due: tokio::time::Instant,
}

impl PendingData {
    /// Copy `bytes` received at stream offset `at` into the sink (what lies below `keep`).
    fn store(&mut self, at: usize, bytes: &[u8]) {
        let end = (at + bytes.len()).min(self.keep);
        if at >= end {
            return;
        }
        let bytes = &bytes[..end - at];
        match &mut self.sink {
            Sink::ModeSelect { buffer, .. }
            | Sink::Compare { buffer, .. }
            | Sink::Unmap { buffer }
            | Sink::WriteSame { buffer, .. }
            | Sink::CompareAndWrite { buffer, .. }
            | Sink::OrWrite { buffer, .. }
            | Sink::ReservationOut { buffer, .. } => buffer[at..end].copy_from_slice(bytes),
            Sink::Write { pieces, starts, .. } => {
                for (piece, &start) in pieces.iter_mut().zip(starts.iter()) {
                    let piece_end = start + piece.len();
                    if piece_end <= at || start >= end {
                        continue;
                    }
                    let from = at.max(start);
                    let to = end.min(piece_end);
                    piece.as_mut_slice()[from - start..to - start].copy_from_slice(&bytes[from - at..to - at]);
                }
            }
        }
    }
}

/// What a command whose Data-Out is all in does next.
enum Collected {
    /// Submit this request; answer it so.
    Submit(Command, Answer),
    /// Nothing to do (no data): GOOD.
    Good,
    /// CHECK CONDITION with this sense; nothing done.
    Check(Sense),
    /// The session applies these itself.
    ModeSelect { ten: bool, buffer: Vec<u8> },
    ReservationOut { service_action: u8, kind: u8, parameter_bytes: u32, buffer: Vec<u8> },
}

/// The request a sink's data makes (pure: the unit's geometry and write cache).
fn collected(sink: Sink, residual: Residual, geometry: &Geometry, wce: bool) -> Collected {
    let done = Answer::Done { residual, sense: Sense::WRITE_ERROR };
    match sink {
        Sink::Write { pieces, .. } if pieces.is_empty() => Collected::Good,
        Sink::Write { offset, fua, pieces, .. } => {
            let data = WriteData::from_pieces(pieces.into_iter().map(Arc::new).collect());
            Collected::Submit(Command::Write { offset, data, fua }, done)
        }
        Sink::Compare { buffer, .. } | Sink::OrWrite { buffer, .. } | Sink::CompareAndWrite { buffer, .. } if buffer.is_empty() => {
            Collected::Good
        }
        Sink::Compare { offset, buffer } => {
            let command = Command::Read { offset, length: buffer.len() as u32, prefix_bytes: 0, holes: false };
            Collected::Submit(command, Answer::Compare { data: Arc::new(buffer), residual })
        }
        Sink::OrWrite { offset, fua, buffer } => Collected::Submit(Command::OrWrite { offset, data: buffer, fua }, done),
        // the initiator sent less than both halves: nothing is compared
        Sink::CompareAndWrite { buffer, .. } if buffer.len() % (2 * LOGICAL_BLOCK_BYTES as usize) != 0 => {
            Collected::Check(Sense::INVALID_FIELD_IN_CDB)
        }
        Sink::CompareAndWrite { offset, fua, mut buffer } => {
            let data = buffer.split_off(buffer.len() / 2);
            Collected::Submit(Command::CompareAndWrite { offset, compare: buffer, data, fua }, Answer::CompareAndWrite { residual })
        }
        Sink::Unmap { buffer } => match thin::unmap_ranges(&buffer, geometry) {
            Err(sense) => Collected::Check(sense),
            Ok(ranges) if ranges.is_empty() => Collected::Good,
            Ok(ranges) => {
                let block = u64::from(LOGICAL_BLOCK_BYTES);
                let ranges = ranges.into_iter().map(|(lba, blocks)| (lba * block, blocks * block)).collect();
                Collected::Submit(Command::UnmapList { ranges, fua: !wce }, done)
            }
        },
        // UNMAP set: the blocks are deallocated (they read zeros, LBPRZ) and the block
        // sent is not written, as SBC-4 allows and initiators expect
        Sink::WriteSame { offset, length, unmap: true, fua, .. } => Collected::Submit(Command::Unmap { offset, length, fua }, done),
        Sink::WriteSame { offset, length, fua, buffer, .. } if buffer.iter().all(|&b| b == 0) => {
            Collected::Submit(Command::WriteZeroes { offset, length, fua }, done)
        }
        Sink::WriteSame { buffer, .. } if buffer.len() < LOGICAL_BLOCK_BYTES as usize => Collected::Check(Sense::INVALID_FIELD_IN_CDB),
        Sink::WriteSame { offset, length, fua, buffer, .. } => Collected::Submit(Command::WriteSame { offset, length, pattern: buffer, fua }, done),
        Sink::ModeSelect { ten, buffer } => Collected::ModeSelect { ten, buffer },
        Sink::ReservationOut { service_action, kind, parameter_bytes, buffer } => {
            Collected::ReservationOut { service_action, kind, parameter_bytes, buffer }
        }
    }
}

/// What a command's Data-Out becomes.
enum DataOutPlan {
    /// Collect `keep` bytes into `sink` (the rest, up to the expected length, is read
    /// and dropped), then run it.
    Collect { keep: usize, residual: Residual, sink: Sink },
    /// The expected length contradicts the CDB: INVALID FIELD IN CDB, counted as `kind`.
    Refuse(IoKind),
    /// The command takes no Data-Out.
    NoData(Operation),
}

/// Where the Data-Out of `operation` goes, given the initiator's expected length, the
/// unit's write cache setting and the volume's block size.
fn data_out_plan(operation: Operation, expected: usize, wce: bool, block_bytes: u64) -> DataOutPlan {
    let block = LOGICAL_BLOCK_BYTES as usize;
    let at = |lba: u64| lba * u64::from(LOGICAL_BLOCK_BYTES);
    // an expected length below the command's: only whole blocks of it are taken
    let whole = |wanted: usize| wanted.min(expected) / block * block;
    let collect = |keep: usize, wanted: usize, sink: Sink| DataOutPlan::Collect { keep, residual: Residual::of(expected, wanted), sink };
    match operation {
        Operation::Write { lba, blocks, fua } => {
            let wanted = blocks as usize * block;
            let keep = whole(wanted);
            collect(keep, wanted, write_sink(at(lba), keep, fua || !wce, block_bytes))
        }
        Operation::VerifyCompare { lba, blocks } => {
            let wanted = blocks as usize * block;
            collect(whole(wanted), wanted, Sink::Compare { offset: at(lba), buffer: vec![0; whole(wanted)] })
        }
        Operation::OrWrite { lba, blocks, fua } => {
            let wanted = blocks as usize * block;
            collect(whole(wanted), wanted, Sink::OrWrite { offset: at(lba), fua: fua || !wce, buffer: vec![0; whole(wanted)] })
        }
        Operation::Unmap { parameter_bytes } => {
            let keep = (parameter_bytes as usize).min(expected).min(UNMAP_LIST_MAX_BYTES);
            collect(keep, parameter_bytes as usize, Sink::Unmap { buffer: vec![0; keep] })
        }
        // the data is one block (none with NDOB): another length is an error in the
        // command, not a residual; NDOB and UNMAP unmap (the blocks read zeros)
        Operation::WriteSame { ndob, .. } if expected != if ndob { 0 } else { block } => DataOutPlan::Refuse(IoKind::WriteZeroes),
        Operation::WriteSame { lba, blocks, unmap, ndob } => {
            let wanted = if ndob { 0 } else { block };
            let length = blocks * u64::from(LOGICAL_BLOCK_BYTES);
            collect(wanted, wanted, Sink::WriteSame { offset: at(lba), length, unmap: unmap || ndob, fua: !wce, buffer: vec![0; wanted] })
        }
        // the data must be exactly the blocks to compare and those to write
        Operation::CompareAndWrite { blocks, .. } if expected != 2 * usize::from(blocks) * block => DataOutPlan::Refuse(IoKind::Write),
        Operation::CompareAndWrite { lba, blocks, fua } => {
            let wanted = 2 * usize::from(blocks) * block;
            collect(wanted, wanted, Sink::CompareAndWrite { offset: at(lba), fua: fua || !wce, buffer: vec![0; wanted] })
        }
        Operation::Reservation(pr::Command::Out { service_action, kind, parameter_bytes }) => {
            let keep = (parameter_bytes as usize).min(expected).min(pr::PARAMETER_LIST_BYTES * 2);
            collect(keep, parameter_bytes as usize, Sink::ReservationOut { service_action, kind, parameter_bytes, buffer: vec![0; keep] })
        }
        Operation::ModeSelect { parameter_bytes, ten, save: _ } => {
            let keep = (parameter_bytes as usize).min(expected).min(4096);
            collect(keep, parameter_bytes as usize, Sink::ModeSelect { ten, buffer: vec![0; keep] })
        }
        operation => DataOutPlan::NoData(operation),
    }
}

/// The outcome of the login phase.
struct LoggedIn {
    params: SessionParams,
    session_type: SessionType,
    export: Option<(String, Arc<dyn BlockVolume>)>,
    stat_sn: u32,
    exp_cmd_sn: u32,
    target_name: String,
    /// The session as the admin's listing shows it.
    info: SessionInfo,
    /// The initiator port (`InitiatorName,i,0xISID`).
    nexus: String,
}

fn login_response(request: &Bhs, transit: bool, nsg: u8, tsih: u16, status: (u8, u8)) -> Bhs {
    let csg = (request.flags() >> 2) & 0x03;
    let mut bhs = Bhs::new(op::LOGIN_RESPONSE, false);
    bhs.0[1] = if transit { 0x80 | (csg << 2) | (nsg & 0x03) } else { csg << 2 };
    bhs.0[2] = 0x00; // VersionMax
    bhs.0[3] = 0x00; // VersionActive
    bhs.0[8..14].copy_from_slice(&request.0[8..14]); // ISID
    bhs.set_u16(14, tsih);
    bhs.set_u32(16, request.itt());
    bhs.0[36] = status.0;
    bhs.0[37] = status.1;
    bhs
}

async fn write_login<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut bhs: Bhs,
    data: &[u8],
    stat_sn: &mut u32,
    exp_cmd_sn: u32,
    window: u32,
) -> io::Result<()> {
    bhs.set_u32(24, *stat_sn);
    *stat_sn = stat_sn.wrapping_add(1);
    bhs.set_u32(28, exp_cmd_sn);
    bhs.set_u32(32, exp_cmd_sn.wrapping_add(window.saturating_sub(1)));
    bhs.set_data_segment_bytes(data.len());
    let mut bytes = bhs.0.to_vec();
    bytes.extend_from_slice(data);
    bytes.resize(pdu::BHS_BYTES + pdu::padded(data.len()), 0);
    w.write_all(&bytes).await?;
    w.flush().await
}

/// The login status refusing a Login Request for its header alone (`None`: go on):
/// a version above 0, a TSIH (adding a connection to a session: one connection per
/// session here), keys spread over more than `LOGIN_TEXT_MAX_BYTES`, an invalid stage.
fn login_request_refusal(bhs: &Bhs, text_bytes: usize) -> Option<(u8, u8)> {
    let (transit, csg, nsg) = (bhs.flags() & 0x80 != 0, (bhs.flags() >> 2) & 0x03, bhs.flags() & 0x03);
    if bhs.0[3] > 0 {
        return Some((2, 5)); // VersionMin above 0
    }
    if bhs.u16_at(14) != 0 {
        return Some((2, 10));
    }
    if text_bytes > LOGIN_TEXT_MAX_BYTES {
        return Some((2, 0));
    }
    if csg == 2 || csg == 3 || (transit && (nsg == 2 || nsg <= csg)) {
        tracing::info!(csg, nsg, "iscsi: login asks for an invalid stage transition");
        return Some((2, 0));
    }
    None
}

fn refusal_reason(refusal: &LoginRefusal) -> String {
    match refusal {
        LoginRefusal::Authentication => "no shared AuthMethod (only None is offered)".to_string(),
        LoginRefusal::MissingParameter(key) => format!("missing {key}"),
        LoginRefusal::InitiatorError(why) => why.clone(),
    }
}

/// The target the first Login Request names: its name, for a normal session the
/// export and volume, and what its security stage requires (the current
/// authentication store's entry); `Err`: the login status refusing it (an initiator
/// not on the target's list: authorization failure).
#[allow(clippy::type_complexity)]
fn identify(
    negotiation: &Negotiation,
    server: &ServerShared,
    peer: &Peer,
) -> Result<(String, Option<(String, Arc<dyn BlockVolume>)>, SecurityStage), (u8, u8)> {
    if let Err(refusal) = negotiation.check_required() {
        tracing::info!(client = %peer.client, reason = %refusal_reason(&refusal), "iscsi: login refused");
        return Err(refusal.status());
    }
    let store = server.access.store();
    let unauthenticated_allowed = peer.listener_loopback || server.config.unauthenticated_logins;
    if negotiation.session_type == SessionType::Discovery {
        let stage = SecurityStage::new(security::requirement(&store.default, unauthenticated_allowed));
        return Ok(("discovery".to_string(), None, stage));
    }
    let requested = negotiation.target_name.clone().unwrap_or_default();
    match resolve_target(server, &requested) {
        Some(found) => {
            let name = names::target_name(&found.0);
            let entry = store.entry(&name);
            let initiator = negotiation.initiator_name.as_deref().unwrap_or_default();
            if !entry.allows(initiator) {
                tracing::info!(client = %peer.client, %initiator, target = %name, "iscsi: login refused: initiator not allowed on this target");
                return Err((2, 2));
            }
            let stage = SecurityStage::new(security::requirement(entry, unauthenticated_allowed));
            Ok((name, Some(found), stage))
        }
        None => {
            tracing::info!(client = %peer.client, target = %requested, "iscsi: login to an unknown target");
            Err((2, 3))
        }
    }
}

/// The export (and its volume) a normal login names.
fn resolve_target(server: &ServerShared, requested: &str) -> Option<(String, Arc<dyn BlockVolume>)> {
    let registry = &*server.frontend.registry;
    let listed = registry.list();
    // a volume's property is read only when its name maps to the requested target
    let candidates = listed.iter().map(|e| e.name.as_str()).filter(|name| {
        names::target_name(name).eq_ignore_ascii_case(requested) && names::is_shared(registry, name)
    });
    let name = names::export_for_target(requested, candidates)?;
    registry.open(name).map(|volume| (name.to_string(), volume))
}

/// What a login has settled so far.
struct LoginState {
    negotiation: Negotiation,
    export: Option<(String, Arc<dyn BlockVolume>)>,
    target_name: String,
    portal_group_sent: bool,
    /// Set by the first request (once the target is known).
    security: Option<SecurityStage>,
    tsih: u16,
}

impl LoginState {
    /// Answer one complete Login Request (its keys gathered): the response header, its
    /// text, and whether the full-feature phase starts; `Err`: the refusing status.
    fn step(&mut self, keys: &[(String, String)], bhs: &Bhs, server: &ServerShared, peer: &Peer) -> Result<(Bhs, Vec<u8>, bool), (u8, u8)> {
        let (transit, csg, nsg) = (bhs.flags() & 0x80 != 0, (bhs.flags() >> 2) & 0x03, bhs.flags() & 0x03);
        let refused = |refusal: LoginRefusal| {
            tracing::info!(client = %peer.client, reason = %refusal_reason(&refusal), "iscsi: login refused");
            refusal.status()
        };
        // every key once per login (the identity keys may repeat their first value)
        self.negotiation.declare(keys).map_err(refused)?;
        // the security stage's keys go to the security stage (once the target is known)
        let (security_keys, keys): (Vec<_>, Vec<_>) = keys.iter().cloned().partition(|(k, _)| csg == 0 && security::is_security_key(k));
        let mut answers = self.negotiation.offer(&keys, csg, transit && nsg == 3).map_err(refused)?;
        // the first request names the initiator and the target
        if self.target_name.is_empty() {
            let (name, found, stage) = identify(&self.negotiation, server, peer)?;
            self.target_name = name;
            self.export = found;
            self.security = Some(stage);
        }
        let may_go = self.security_step(&security_keys, &mut answers, csg, transit, peer)?;
        let transit = transit && may_go;
        if self.negotiation.session_type == SessionType::Normal && !self.portal_group_sent {
            self.portal_group_sent = true;
            answers.push(("TargetPortalGroupTag".into(), "1".into()));
        }
        let done = transit && nsg == 3;
        let tsih = if done { server.next_tsih.fetch_add(1, Ordering::Relaxed).max(1) } else { 0 };
        self.tsih = tsih;
        let data = pdu::encode_text(&answers);
        if data.len() > self.negotiation.params.initiator_max_recv_data_segment_bytes.max(8192) {
            // only keys we do not know can make the answer this long: the initiator's error
            tracing::info!(client = %peer.client, keys = keys.len(), "iscsi: login refused: more unknown keys than one response can answer");
            return Err((2, 0));
        }
        Ok((login_response(bhs, transit, nsg, tsih, (0, 0)), data, done))
    }

    /// Answer the security keys of a request in stage `csg` into `answers`; whether
    /// the login may leave the security stage now (when `transit` asks it to, or it
    /// is past it already); `Err`: authentication failure (logged without secrets).
    fn security_step(
        &mut self,
        security_keys: &[(String, String)],
        answers: &mut Vec<(String, String)>,
        csg: u8,
        transit: bool,
        peer: &Peer,
    ) -> Result<bool, (u8, u8)> {
        let (initiator, target) = (self.negotiation.initiator_name.as_deref().unwrap_or_default(), &self.target_name);
        let Some(stage) = self.security.as_mut() else {
            return Err((3, 0));
        };
        let refuse = |failure: security::SecurityFailure| {
            tracing::info!(client = %peer.client, %initiator, %target, reason = %failure, "iscsi: login refused: authentication failure");
            failure.refusal().status()
        };
        if csg == 0 {
            answers.extend(stage.offer(security_keys).map_err(refuse)?);
        }
        if csg == 0 && !transit {
            return Ok(false);
        }
        stage.may_leave(csg != 0).map_err(refuse)
    }
}

/// The login phase. `Ok(None)`: refused (the response said why) or closed.
async fn login<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut PduReader<R>,
    w: &mut W,
    server: &ServerShared,
    peer: &Peer,
) -> io::Result<Option<LoggedIn>> {
    let mut state = LoginState {
        negotiation: Negotiation::new(&server.config),
        export: None,
        target_name: String::new(),
        portal_group_sent: false,
        security: None,
        tsih: 0,
    };
    let window = server.config.command_window;
    let mut stat_sn = 0u32;
    let mut first = true;
    let mut text = Vec::new();
    let mut isid = [0u8; 6];
    loop {
        let pdu = match reader.read_pdu().await? {
            Frame::Pdu(pdu) => pdu,
            Frame::DataDigestError(_) => return Err(io::Error::new(io::ErrorKind::InvalidData, "digest error during login")),
        };
        let bhs = &pdu.bhs;
        if bhs.opcode() != op::LOGIN {
            tracing::info!(client = %peer.client, opcode = bhs.opcode(), "iscsi: a PDU other than Login before the login completed; closing");
            return Ok(None);
        }
        let exp_cmd_sn = bhs.u32_at(24);
        let refuse = |status: (u8, u8)| login_response(bhs, false, 0, 0, status);
        if first {
            stat_sn = bhs.u32_at(28);
            isid.copy_from_slice(&bhs.0[8..14]);
            first = false;
        } else if bhs.0[8..14] != isid {
            // the ISID is the session's identity: one value for the whole login (RFC 7143 §11.12.5)
            tracing::info!(client = %peer.client, "iscsi: the ISID changed during the login; refused");
            write_login(w, refuse((2, 0)), &[], &mut stat_sn, exp_cmd_sn, window).await?;
            return Ok(None);
        }
        let cont = bhs.flags() & 0x40 != 0;
        if let Some(status) = login_request_refusal(bhs, text.len() + pdu.data.len()) {
            write_login(w, refuse(status), &[], &mut stat_sn, exp_cmd_sn, window).await?;
            return Ok(None);
        }
        text.extend_from_slice(&pdu.data);
        if cont {
            // the rest of the keys follows; answer empty
            write_login(w, login_response(bhs, false, 0, 0, (0, 0)), &[], &mut stat_sn, exp_cmd_sn, window).await?;
            continue;
        }
        let keys = pdu::parse_text(&std::mem::take(&mut text));
        let (response, data, done) = match state.step(&keys, bhs, server, peer) {
            Ok(step) => step,
            Err(status) => {
                if status == (2, 1) || status == (2, 2) {
                    IscsiStats::count(&server.stats.logins_auth_failed);
                }
                write_login(w, refuse(status), &[], &mut stat_sn, exp_cmd_sn, window).await?;
                return Ok(None);
            }
        };
        write_login(w, response, &data, &mut stat_sn, exp_cmd_sn, window).await?;
        if done {
            return Ok(Some(state.logged_in(isid, peer, stat_sn, exp_cmd_sn)));
        }
    }
}

impl LoginState {
    /// The session the finished login starts.
    fn logged_in(self, isid: [u8; 6], peer: &Peer, stat_sn: u32, exp_cmd_sn: u32) -> LoggedIn {
        let LoginState { negotiation, export, target_name, security, tsih, .. } = self;
        let initiator = negotiation.initiator_name.as_deref().unwrap_or_default();
        let info = SessionInfo::new(
            initiator,
            isid,
            tsih,
            &peer.address,
            &target_name,
            negotiation.session_type,
            security.as_ref().map_or("none", |s| s.method()),
            &negotiation.params,
        );
        LoggedIn {
            info,
            nexus: pr::nexus_name(initiator, isid),
            params: negotiation.params,
            session_type: negotiation.session_type,
            export,
            stat_sn,
            exp_cmd_sn,
            target_name,
        }
    }
}

/// The login phase within the login timeout, counted when refused; `None`: refused,
/// closed, timed out or stopped.
async fn login_in_time<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut PduReader<R>,
    write_half: &mut W,
    server: &ServerShared,
    peer: &Peer,
    stop: &mut watch::Receiver<bool>,
) -> io::Result<Option<LoggedIn>> {
    let refused = || IscsiStats::count(&server.stats.logins_refused);
    tokio::select! {
        result = tokio::time::timeout(server.config.login_timeout, login(reader, write_half, server, peer)) => match result {
            Ok(Ok(Some(session))) => Ok(Some(session)),
            Ok(Ok(None)) => {
                refused();
                Ok(None)
            }
            Ok(Err(error)) => {
                refused();
                if error.kind() == io::ErrorKind::UnexpectedEof { Ok(None) } else { Err(error) }
            }
            Err(_) => {
                refused();
                tracing::info!(client = %peer.client, "iscsi: login timed out");
                Ok(None)
            }
        },
        _ = stop.wait_for(|s| *s) => Ok(None),
    }
}

/// The logical unit of a normal session on `export`.
#[allow(clippy::too_many_arguments)]
fn open_unit(
    server: &Arc<ServerShared>,
    export: String,
    volume: Arc<dyn BlockVolume>,
    target_name: String,
    params: &SessionParams,
    out: &OutSender,
    client: Arc<zilla_frontend::ClientIoStats>,
    nexus: String,
) -> Unit {
    let registry = &server.frontend.registry;
    // the volume's identity: its objset id and creation txg (a StaticRegistry has none)
    let identity = format!(
        "{}@{}",
        registry.property(&export, "objsetid").unwrap_or_default(),
        registry.property(&export, "createtxg").unwrap_or_default()
    );
    let reservations = server.units.attach(&export, &identity, &nexus, || registry.property(&export, pr::PROPERTY));
    let pool_id = registry.pool_id(&export);
    let wce = registry.property(&export, "wce").is_some_and(|v| v == "on");
    let geometry = Geometry {
        blocks: volume.size() / u64::from(LOGICAL_BLOCK_BYTES),
        volume_block_bytes: volume.block_size(),
        read_only: volume.read_only(),
        thin: registry.property(&export, "refreservation").is_none_or(|v| v == "none"),
        transfer_max_bytes: zilla_frontend::REQUEST_MAX_BYTES as u32,
        naa: names::naa(pool_id, &export),
        serial: names::serial(pool_id, &export),
        target_name,
    };
    let labels = zilla_frontend::SessionLabels { protocol: "iscsi", client: Some(client) };
    let executor = Executor::new(&server.frontend, volume.clone(), &export, server.config.command_window as usize, labels);
    Unit {
        executor,
        geometry: parking_lot::RwLock::new(geometry),
        volume,
        export,
        wce: AtomicBool::new(wce),
        replies: Arc::new(Replies {
            out: out.clone(),
            frontend: server.frontend.clone(),
            data_in_segment_bytes: params.initiator_max_recv_data_segment_bytes,
            burst_bytes: params.max_burst_bytes,
        }),
        nexus,
        reservations,
    }
}

/// Serve one connection until it logs out, closes, fails or `stop` turns true.
pub(crate) async fn serve<R, W>(
    read_half: R,
    mut write_half: W,
    server: Arc<ServerShared>,
    mut peer: Peer,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let config = &server.config;
    let mut reader = PduReader::new(read_half, config.max_recv_data_segment_bytes);
    let logged_in = login_in_time(&mut reader, &mut write_half, &server, &peer, &mut stop).await;
    drop(peer.login_slot.take());
    let Some(logged_in) = logged_in? else {
        return Ok(());
    };
    let LoggedIn { params, session_type, export, stat_sn, exp_cmd_sn, target_name, info, nexus } = logged_in;
    // listed for the admin until the connection ends (not when the registry is full)
    let initiator_name = info.initiator_name.clone();
    let listed_session = server.access.sessions.register(info);
    let digests = Digests { header: params.header_digest, data: params.data_digest };
    reader.digests = digests;
    let window = Arc::new(Mutex::new(CommandWindow { exp_cmd_sn, in_flight: 0, size: config.command_window }));
    let (out, queue) = writer::queue();
    let writer = tokio::spawn(writer::run(write_half, queue, window.clone(), stat_sn, digests, config.reply_stall_timeout));

    // a normal session: its unit, listed among the sessions, counted per initiator name
    let client = server.frontend.clients.connect("iscsi", &initiator_name);
    let mut listed = None;
    let unit = match export {
        Some((export, volume)) => {
            IscsiStats::count(&server.stats.sessions_started);
            listed = Some(server.frontend.sessions.attach(&export));
            tracing::debug!(client = %peer.client, %export, "iscsi: session started");
            Some(open_unit(&server, export, volume, target_name, &params, &out, client.stats().clone(), nexus))
        }
        None => {
            IscsiStats::count(&server.stats.discovery_sessions);
            None
        }
    };
    let disconnect = listed.as_ref().map(|l| l.disconnect_requested());
    let mut session = Session {
        reader,
        out,
        window,
        params,
        server: server.clone(),
        peer,
        unit,
        pending: HashMap::new(),
        data_out_progress: None,
        deferred: VecDeque::new(),
        next_ttt: 1,
        text_rest: None,
        session_type,
        initiator_name,
        ended: EndedTags::new(config.command_window as usize + DEFERRED_EXTRA),
    };
    let reinstated = listed_session.as_ref().map(|l| l.reinstated.clone());
    let result = session.run(stop, disconnect, reinstated).await;
    session.close(writer).await;
    drop(listed);
    result
}

/// Wait (bounded) for a connection's writer to put its last PDUs on the wire.
async fn writer_finished(writer: tokio::task::JoinHandle<io::Result<()>>, config: &IscsiConfig) {
    match tokio::time::timeout(config.shutdown_grace + config.reply_stall_timeout, writer).await {
        Ok(Ok(Err(error))) => tracing::debug!(%error, "iscsi: writer ended with an error"),
        Err(_) => tracing::warn!("iscsi: a connection's writer did not finish; dropping it"),
        _ => {}
    }
}

/// Whether the reader goes on.
enum Flow {
    Continue,
    Close,
}

struct Session<R> {
    reader: PduReader<R>,
    out: OutSender,
    window: Arc<Mutex<CommandWindow>>,
    params: SessionParams,
    server: Arc<ServerShared>,
    peer: Peer,
    unit: Option<Unit>,
    pending: HashMap<u32, PendingData>,
    /// When the last Data-Out of any command was taken: initiators serve R2Ts in
    /// order, so a command queued behind a command being fed is waiting, not stalled.
    data_out_progress: Option<tokio::time::Instant>,
    deferred: VecDeque<Pdu>,
    next_ttt: u32,
    /// SendTargets text still to send: (TTT, bytes).
    text_rest: Option<(u32, Vec<u8>)>,
    session_type: SessionType,
    /// The initiator's name (discovery lists only the targets whose list allows it).
    initiator_name: String,
    /// Commands that ended with Data-Out perhaps still on the way (dropped, not rejected).
    ended: EndedTags,
}

/// Sleep until `due`; without one, never wake.
async fn until(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl<R: AsyncRead + Unpin> Session<R> {
    fn send(&self, pdu: OutPdu) {
        let _ = self.out.send(pdu);
    }

    fn reject(&self, bhs: &Bhs, reason: u8, counted: bool) {
        IscsiStats::count(&self.server.stats.protocol_errors);
        let mut r = Bhs::new(op::REJECT, true);
        r.0[2] = reason;
        r.set_u32(16, NO_TAG);
        let mut pdu = OutPdu::new(r, Payload::Bytes(bhs.0.to_vec()), StatSn::Advance);
        pdu.ends_command = counted;
        self.send(pdu);
    }

    async fn run(
        &mut self,
        mut stop: watch::Receiver<bool>,
        disconnect: Option<watch::Receiver<bool>>,
        reinstated: Option<watch::Receiver<bool>>,
    ) -> io::Result<()> {
        // a discovery session is not listed: nothing asks it to go but the shutdown
        let (_keep, unlisted) = watch::channel(false);
        let mut disconnect = disconnect.unwrap_or_else(|| unlisted.clone());
        // a new login of the same initiator and ISID ends this session
        let mut reinstated = reinstated.unwrap_or(unlisted);
        loop {
            let frame = match self.deferred.pop_front() {
                Some(pdu) => Ok(Frame::Pdu(pdu)),
                None => {
                    // a client that does not read its replies gets no more of its PDUs read
                    if self.out.queued() > writer::QUEUED_PDUS_MAX {
                        tokio::select! {
                            _ = stop.wait_for(|s| *s) => return Ok(()),
                            Ok(_) = disconnect.wait_for(|s| *s) => return Ok(()),
                            _ = self.out.closed() => return Ok(()),
                            _ = self.out.room() => {}
                        }
                    }
                    let due = self.data_out_due();
                    tokio::select! {
                        biased;
                        _ = stop.wait_for(|s| *s) => return Ok(()),
                        Ok(_) = disconnect.wait_for(|s| *s) => return Ok(()),
                        Ok(_) = reinstated.wait_for(|r| *r) => {
                            tracing::info!(client = %self.peer.client, "iscsi: session reinstated by a new login of its initiator and ISID to its target; closing");
                            return Ok(());
                        }
                        // the writer stopped (a client that took no reply for the stall
                        // timeout): nothing can be answered any more
                        _ = self.out.closed() => return Ok(()),
                        // what has arrived is read before a Data-Out is given up
                        frame = self.reader.read_pdu() => frame,
                        () = until(due) => return Err(self.data_out_expired()),
                    }
                }
            };
            let pdu = match frame {
                Ok(Frame::Pdu(pdu)) => pdu,
                Ok(Frame::DataDigestError(bhs)) => {
                    tracing::info!(client = %self.peer.client, "iscsi: data digest error; PDU rejected");
                    self.reject(&bhs, reject::DATA_DIGEST_ERROR, false);
                    if bhs.opcode() == op::DATA_OUT {
                        // its command cannot complete: fail it
                        if let Some(p) = self.pending.remove(&bhs.itt()) {
                            self.send(check_condition(bhs.itt(), Sense::DATA_PHASE_ERROR, p.expected, p.counted));
                            self.ended.note(bhs.itt());
                        }
                    }
                    continue;
                }
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::InvalidData => {
                    IscsiStats::count(&self.server.stats.protocol_errors);
                    tracing::warn!(client = %self.peer.client, %error, "iscsi: malformed PDU; closing the connection");
                    return Ok(());
                }
                Err(error) => return Err(error),
            };
            match self.dispatch(pdu).await? {
                Flow::Continue => {}
                Flow::Close => return Ok(()),
            }
        }
    }

    /// Accept a command's CmdSN: `Some(counted)` if it is to be run (counted: it holds
    /// a window slot), `None` if it is outside the window (dropped).
    fn accept_cmd_sn(&self, bhs: &Bhs) -> Option<bool> {
        if bhs.immediate() {
            return Some(false);
        }
        let cmd_sn = bhs.u32_at(24);
        let mut w = self.window.lock();
        if pdu::sn_le(w.exp_cmd_sn, cmd_sn) && pdu::sn_le(cmd_sn, w.max_cmd_sn()) {
            w.exp_cmd_sn = cmd_sn.wrapping_add(1);
            w.in_flight += 1;
            Some(true)
        } else {
            IscsiStats::count(&self.server.stats.commands_out_of_window);
            tracing::debug!(cmd_sn, exp_cmd_sn = w.exp_cmd_sn, max_cmd_sn = w.max_cmd_sn(), "iscsi: command outside the CmdSN window dropped");
            None
        }
    }

    async fn dispatch(&mut self, pdu: Pdu) -> io::Result<Flow> {
        let opcode = pdu.bhs.opcode();
        if opcode == op::DATA_OUT {
            self.on_data_out(pdu).await;
            return Ok(Flow::Continue);
        }
        if opcode == op::SNACK {
            self.reject(&pdu.bhs, reject::COMMAND_NOT_SUPPORTED, false);
            return Ok(Flow::Continue);
        }
        let known = matches!(opcode, op::NOP_OUT | op::SCSI_COMMAND | op::TASK_MANAGEMENT | op::TEXT | op::LOGOUT);
        if !known {
            tracing::info!(client = %self.peer.client, opcode, "iscsi: unexpected opcode; rejected");
            self.reject(&pdu.bhs, if opcode == op::LOGIN { reject::PROTOCOL_ERROR } else { reject::COMMAND_NOT_SUPPORTED }, false);
            return Ok(Flow::Continue);
        }
        // NOP-Out answering a NOP-In of ours: no CmdSN to check, nothing to answer
        if opcode == op::NOP_OUT && pdu.bhs.itt() == NO_TAG {
            return Ok(Flow::Continue);
        }
        let Some(counted) = self.accept_cmd_sn(&pdu.bhs) else {
            if opcode == op::SCSI_COMMAND && !pdu.bhs.final_bit() {
                self.ended.note(pdu.bhs.itt()); // its unsolicited Data-Out follows
            }
            return Ok(Flow::Continue);
        };
        match opcode {
            op::NOP_OUT => {
                let mut bhs = Bhs::new(op::NOP_IN, true);
                bhs.set_lun(pdu.bhs.lun());
                bhs.set_u32(16, pdu.bhs.itt());
                bhs.set_u32(20, NO_TAG);
                let mut data = pdu.data;
                data.truncate(self.params.initiator_max_recv_data_segment_bytes);
                let mut out = OutPdu::new(bhs, if data.is_empty() { Payload::None } else { Payload::Bytes(data) }, StatSn::Advance);
                out.ends_command = counted;
                self.send(out);
            }
            op::SCSI_COMMAND => self.on_scsi_command(pdu, counted).await?,
            op::TASK_MANAGEMENT => self.on_task_management(&pdu.bhs, counted).await,
            op::TEXT => self.on_text(pdu, counted),
            op::LOGOUT => {
                let reason = pdu.bhs.flags() & 0x7f;
                self.drain().await;
                let mut bhs = Bhs::new(op::LOGOUT_RESPONSE, true);
                bhs.0[2] = if reason <= 1 { 0 } else { 2 }; // recovery is not supported
                bhs.set_u32(16, pdu.bhs.itt());
                let mut out = OutPdu::new(bhs, Payload::None, StatSn::Advance);
                out.ends_command = counted;
                out.then_close = true;
                self.send(out);
                return Ok(Flow::Close);
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }

    /// Task management (RFC 7143 §11.5) for a session of one connection at error
    /// recovery level 0. ABORT TASK drops the referenced command if it still waits for
    /// Data-Out (it gets no response of its own; its window slot and budget are freed);
    /// a command whose I/O is already in flight runs to its end and answers first, and
    /// the abort answers "task does not exist", as for a tag no command has (commands of
    /// one connection arrive in CmdSN order, so a referenced command was seen and
    /// answered).
    /// ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET and TARGET WARM RESET drop
    /// every command of the session waiting for data and wait for those in flight. The
    /// response comes after the affected commands' own (bounded by the shutdown grace).
    /// CLEAR ACA, TARGET COLD RESET and TASK REASSIGN are not supported.
    async fn on_task_management(&mut self, bhs: &Bhs, counted: bool) {
        const COMPLETE: u8 = 0;
        const NO_TASK: u8 = 1;
        const NO_LUN: u8 = 2;
        const NO_REASSIGN: u8 = 4;
        const NOT_SUPPORTED: u8 = 5;
        let function = bhs.flags() & 0x7f;
        let lun0 = bhs.lun() == [0u8; 8];
        let response = match function {
            1 | 2 | 4 | 5 if self.unit.is_none() || !lun0 => NO_LUN,
            1 => {
                let ref_itt = bhs.u32_at(20);
                if let Some(p) = self.pending.remove(&ref_itt) {
                    self.forget(ref_itt, p);
                    COMPLETE
                } else {
                    // answered already, or its I/O in flight: let it answer first
                    self.settle().await;
                    NO_TASK
                }
            }
            2 | 4 | 5 | 6 => {
                for (itt, p) in std::mem::take(&mut self.pending) {
                    self.forget(itt, p);
                }
                self.settle().await;
                if let (Some(unit), 5 | 6) = (&self.unit, function) {
                    let attention = if function == 5 { pr::UA_LUN_RESET } else { pr::UA_TARGET_RESET };
                    unit.reservations.update(|state| state.reset(attention));
                }
                tracing::info!(client = %self.peer.client, function, "iscsi: task management: the session's commands were aborted");
                COMPLETE
            }
            8 => NO_REASSIGN,
            _ => NOT_SUPPORTED,
        };
        IscsiStats::count(&self.server.stats.task_management);
        let mut out = Bhs::new(op::TASK_MANAGEMENT_RESPONSE, true);
        out.0[2] = response;
        out.set_u32(16, bhs.itt());
        let mut pdu = OutPdu::new(out, Payload::None, StatSn::Advance);
        pdu.ends_command = counted;
        self.send(pdu);
    }

    /// Drop a command waiting for its data without answering it: its budget goes back
    /// and its CmdSN window slot reopens; Data-Out still on the way for it is dropped.
    fn forget(&mut self, itt: u32, pending: PendingData) {
        if pending.counted {
            let mut w = self.window.lock();
            w.in_flight = w.in_flight.saturating_sub(1);
        }
        drop(pending);
        self.ended.note(itt);
    }

    /// When the command that has waited longest for its next Data-Out gives up: its own
    /// deadline, or later while Data-Out for another command keeps coming (the
    /// connection is making progress).
    fn data_out_due(&self) -> Option<tokio::time::Instant> {
        let progress_due = self.data_out_progress.map(|t| t + self.server.config.data_out_timeout);
        self.pending.values().map(|p| progress_due.map_or(p.due, |d| d.max(p.due))).min()
    }

    /// A command's next Data-Out did not come in time: the connection ends (the
    /// commands waiting for data are dropped with it, their budget returned).
    fn data_out_expired(&self) -> io::Error {
        IscsiStats::count(&self.server.stats.protocol_errors);
        let timeout_s = self.server.config.data_out_timeout.as_secs_f64();
        tracing::warn!(
            client = %self.peer.client, waiting = self.pending.len(), timeout_s,
            "iscsi: a command got no Data-Out within the data-out timeout; closing the connection"
        );
        io::Error::new(io::ErrorKind::TimedOut, "no Data-Out within the data-out timeout")
    }

    /// Wait (bounded by the shutdown grace) until the unit's commands in flight have
    /// completed and queued their responses (task management, logout, close).
    async fn settle(&self) {
        if let Some(unit) = &self.unit {
            if tokio::time::timeout(self.server.config.shutdown_grace, unit.executor.idle()).await.is_err() {
                tracing::warn!(client = %self.peer.client, "iscsi: commands still in flight after the shutdown grace");
            }
        }
    }

    /// SendTargets (the only text key we answer in the full-feature phase).
    fn on_text(&mut self, pdu: Pdu, counted: bool) {
        let itt = pdu.bhs.itt();
        let ttt = pdu.bhs.u32_at(20);
        let body = if ttt != NO_TAG {
            match self.text_rest.take() {
                Some((t, rest)) if t == ttt => rest,
                _ => {
                    self.reject(&pdu.bhs, reject::INVALID_PDU_FIELD, counted);
                    return;
                }
            }
        } else {
            self.text_rest = None;
            let mut answers = Vec::new();
            for (key, value) in pdu::parse_text(&pdu.data) {
                if key == "SendTargets" {
                    answers.extend(self.send_targets(&value));
                } else {
                    answers.push((key, "NotUnderstood".to_string()));
                }
            }
            pdu::encode_text(&answers)
        };
        let limit = self.params.initiator_max_recv_data_segment_bytes;
        let mut bhs = Bhs::new(op::TEXT_RESPONSE, false);
        bhs.set_u32(16, itt);
        let (now, rest) = if body.len() > limit {
            // cut at a key boundary when one is inside the limit
            let cut = body[..limit].iter().rposition(|&b| b == 0).map(|p| p + 1).filter(|&p| p > 0).unwrap_or(limit);
            (body[..cut].to_vec(), Some(body[cut..].to_vec()))
        } else {
            (body, None)
        };
        match rest {
            Some(rest) => {
                let t = self.take_ttt();
                bhs.0[1] = 0x40; // C
                bhs.set_u32(20, t);
                self.text_rest = Some((t, rest));
            }
            None => {
                bhs.0[1] = 0x80; // F
                bhs.set_u32(20, NO_TAG);
            }
        }
        let mut out = OutPdu::new(bhs, Payload::Bytes(now), StatSn::Advance);
        out.ends_command = counted;
        self.send(out);
    }

    fn send_targets(&self, value: &str) -> Vec<(String, String)> {
        let registry = &self.server.frontend.registry;
        let exports: Vec<String> = match (&self.unit, self.session_type) {
            (Some(unit), _) => vec![unit.export.clone()],
            (None, SessionType::Discovery) => names::shared_exports(&**registry),
            (None, SessionType::Normal) => Vec::new(),
        };
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let store = self.server.access.store();
        for export in exports {
            let name = names::target_name(&export);
            if value != "All" && !value.is_empty() && !value.eq_ignore_ascii_case(&name) {
                continue;
            }
            // a target whose initiator list leaves this initiator out is not shown to it
            if !store.entry(&name).allows(&self.initiator_name) {
                continue;
            }
            if !seen.insert(name.clone()) {
                continue; // a name two volumes map to: the first is served
            }
            out.push(("TargetName".to_string(), name));
            if let Some(portal) = &self.peer.portal {
                out.push(("TargetAddress".to_string(), format!("{portal},1")));
            }
        }
        out
    }

    fn take_ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == NO_TAG {
            self.next_ttt = 1;
        }
        t
    }

    /// An admission for `units`; while it waits, Data-Out PDUs of commands already
    /// admitted are taken in (they free budget), everything else is deferred.
    async fn admit(&mut self, units: usize) -> io::Result<Option<Admission>> {
        let Some(unit) = &self.unit else { return Ok(None) };
        let units = units.min(self.server.frontend.memory.per_share_max());
        if let Some(admission) = unit.executor.try_admit(units) {
            return Ok(Some(admission));
        }
        loop {
            let due = self.data_out_due();
            let Some(unit) = &self.unit else { return Ok(None) };
            let frame = tokio::select! {
                biased;
                admission = unit.executor.admit(units, || {}) => return Ok(Some(admission)),
                frame = self.reader.read_pdu() => frame?,
                () = until(due) => return Err(self.data_out_expired()),
            };
            match frame {
                Frame::Pdu(pdu) if pdu.bhs.opcode() == op::DATA_OUT && self.pending.contains_key(&pdu.bhs.itt()) => {
                    self.on_data_out(pdu).await;
                }
                Frame::Pdu(pdu) => {
                    if self.deferred.len() >= self.server.config.command_window as usize + DEFERRED_EXTRA {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "too many PDUs while waiting for budget"));
                    }
                    self.deferred.push_back(pdu);
                }
                Frame::DataDigestError(bhs) => self.reject(&bhs, reject::DATA_DIGEST_ERROR, false),
            }
        }
    }

    /// A SCSI Command: answered, submitted or waiting for its data. One that ends
    /// without waiting for data while unsolicited Data-Out follows it (no F bit) has
    /// that Data-Out dropped.
    async fn on_scsi_command(&mut self, pdu: Pdu, counted: bool) -> io::Result<()> {
        let (itt, unsolicited_follows) = (pdu.bhs.itt(), !pdu.bhs.final_bit());
        self.ended.reuse(itt);
        self.scsi_command(pdu, counted).await?;
        if unsolicited_follows && !self.pending.contains_key(&itt) {
            self.ended.note(itt);
        }
        Ok(())
    }

    async fn scsi_command(&mut self, pdu: Pdu, counted: bool) -> io::Result<()> {
        let bhs = &pdu.bhs;
        let itt = bhs.itt();
        let expected = bhs.u32_at(20) as usize;
        let lun = bhs.lun();
        let Some(unit) = &self.unit else {
            tracing::info!(client = %self.peer.client, "iscsi: SCSI command in a discovery session; rejected");
            self.reject(bhs, reject::PROTOCOL_ERROR, counted);
            return Ok(());
        };
        let immediate = pdu.data.len();
        if immediate > 0 && (!self.params.immediate_data || immediate > self.params.first_burst_bytes || immediate > expected) {
            tracing::info!(client = %self.peer.client, immediate, expected, "iscsi: immediate data beyond what was negotiated; rejected");
            self.reject(bhs, reject::PROTOCOL_ERROR, counted);
            return Ok(());
        }
        if bhs.flags() & 0x60 == 0x60 {
            // R and W: a bidirectional command, which no command of this unit is
            tracing::debug!(client = %self.peer.client, itt, opcode = bhs.cdb()[0], "iscsi: bidirectional command refused");
            self.send(check_condition(itt, Sense::INVALID_FIELD_IN_CDB, expected, counted));
            return Ok(());
        }
        let started_ns = self.server.frontend.clock.now_ns();
        let lun0 = lun == [0; 8];
        if lun0 {
            Self::notice_capacity(unit);
        }
        if lun0 && self.reservations_refuse(bhs.cdb(), itt, lun, expected, counted) {
            return Ok(());
        }
        let operation = match scsi::decode(bhs.cdb(), lun0, &unit.geometry.read()) {
            Ok(op) => op,
            Err(sense) => {
                if matches!(bhs.cdb()[0], 0x08 | 0x28 | 0xa8 | 0x88 | 0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e) {
                    let kind = if matches!(bhs.cdb()[0], 0x08 | 0x28 | 0xa8 | 0x88) { IoKind::Read } else { IoKind::Write };
                    unit.executor.refuse(kind, expected as u64, started_ns);
                }
                self.send(check_condition(itt, sense, expected, counted));
                return Ok(());
            }
        };
        let wce = unit.wce.load(Ordering::Relaxed);
        match data_out_plan(operation, expected, wce, unit.executor.block_bytes()) {
            DataOutPlan::Collect { keep, residual, sink } => {
                self.start_data_out(pdu, counted, expected, keep, residual, sink, started_ns).await?;
            }
            DataOutPlan::Refuse(kind) => {
                unit.executor.refuse(kind, expected as u64, started_ns);
                self.send(check_condition(itt, Sense::INVALID_FIELD_IN_CDB, expected, counted));
            }
            DataOutPlan::NoData(operation) => self.run_operation(operation, started_ns, itt, lun, expected, counted).await?,
        }
        Ok(())
    }

    /// A command that takes no Data-Out: answered at once or submitted.
    async fn run_operation(&mut self, operation: Operation, started_ns: u64, itt: u32, lun: [u8; 8], expected: usize, counted: bool) -> io::Result<()> {
        let Some(unit) = &self.unit else { return Ok(()) };
        match operation {
            Operation::DataIn(data) => self.send_small_data_in(itt, lun, data, expected, counted),
            Operation::ModeSense { ten, dbd, llbaa, page_control, page, subpage, allocation } => {
                let wce = unit.wce.load(Ordering::Relaxed);
                match scsi::mode_sense(&unit.geometry.read(), wce, ten, dbd, llbaa, page_control, page, subpage, allocation) {
                    Ok(data) => self.send_small_data_in(itt, lun, data, expected, counted),
                    Err(sense) => self.send(check_condition(itt, sense, expected, counted)),
                }
            }
            Operation::Read { lba, blocks, .. } => self.start_read(lba, blocks, started_ns, itt, lun, expected, counted).await?,
            Operation::SynchronizeCache => {
                let Some(admission) = self.admit(COMMAND_OVERHEAD_UNITS).await? else { return Ok(()) };
                let answer = Answer::Done { residual: Residual::of(expected, 0), sense: Sense::WRITE_ERROR };
                self.submit(Command::Flush, admission, started_ns, itt, lun, expected, counted, answer).await;
            }
            Operation::GetLbaStatus { lba, allocation } => {
                let Some(admission) = self.admit(COMMAND_OVERHEAD_UNITS + allocation.min(1 << 16) as usize).await? else {
                    return Ok(());
                };
                let Some(unit) = &self.unit else { return Ok(()) };
                let (offset, end) = (lba * u64::from(LOGICAL_BLOCK_BYTES), unit.geometry.read().blocks * u64::from(LOGICAL_BLOCK_BYTES));
                let length = (end - offset).min(zilla_frontend::executor::BLOCK_STATUS_SPAN_MAX_BYTES);
                let answer = Answer::LbaStatus { lba, allocation: allocation as usize, residual_of: expected };
                self.submit(Command::BlockStatus { offset, length }, admission, started_ns, itt, lun, expected, counted, answer).await;
            }
            Operation::Reservation(command) => self.on_reservation(unit, command, itt, lun, expected, counted),
            // TEST UNIT READY, VERIFY (BYTCHK 0), PRE-FETCH; the Data-Out commands are
            // not here (data_out_plan took them)
            _ => self.send(scsi_response(itt, scsi::STATUS_GOOD, None, Residual::of(expected, 0), counted)),
        }
        Ok(())
    }

    /// A READ: `blocks` at `lba`, at most `expected` bytes of them.
    #[allow(clippy::too_many_arguments)]
    async fn start_read(
        &mut self,
        lba: u64,
        blocks: u32,
        started_ns: u64,
        itt: u32,
        lun: [u8; 8],
        expected: usize,
        counted: bool,
    ) -> io::Result<()> {
        let wanted = blocks as usize * LOGICAL_BLOCK_BYTES as usize;
        let len = wanted.min(expected);
        let residual = Residual::of(expected, wanted);
        if len == 0 {
            self.send(scsi_response(itt, scsi::STATUS_GOOD, None, residual, counted));
            return Ok(());
        }
        let Some(admission) = self.admit(len + COMMAND_OVERHEAD_UNITS).await? else { return Ok(()) };
        let command = Command::Read { offset: lba * u64::from(LOGICAL_BLOCK_BYTES), length: len as u32, prefix_bytes: 0, holes: false };
        self.submit(command, admission, started_ns, itt, lun, expected, counted, Answer::Read { len, residual }).await;
        Ok(())
    }

    fn send_small_data_in(&self, itt: u32, lun: [u8; 8], mut data: Vec<u8>, expected: usize, counted: bool) {
        let residual = Residual::of(expected, data.len());
        data.truncate(expected);
        if data.is_empty() {
            self.send(scsi_response(itt, scsi::STATUS_GOOD, None, residual, counted));
            return;
        }
        let len = data.len();
        let segment = self.params.initiator_max_recv_data_segment_bytes;
        for pdu in data_in(itt, lun, Arc::new(ReadBody::Owned(data)), len, residual, segment, self.params.max_burst_bytes, counted) {
            self.send(pdu);
        }
    }

    /// Start collecting a command's data: immediate data now, the rest as it comes.
    #[allow(clippy::too_many_arguments)]
    async fn start_data_out(
        &mut self,
        pdu: Pdu,
        counted: bool,
        expected: usize,
        keep: usize,
        residual: Residual,
        sink: Sink,
        started_ns: u64,
    ) -> io::Result<()> {
        let itt = pdu.bhs.itt();
        let unsolicited_end = if !self.params.initial_r2t && !pdu.bhs.final_bit() {
            self.params.first_burst_bytes.min(expected).max(pdu.data.len())
        } else {
            pdu.data.len()
        };
        let admission = self.admit(keep + COMMAND_OVERHEAD_UNITS).await?;
        if self.unit.is_none() {
            return Ok(());
        }
        if self.pending.contains_key(&itt) {
            tracing::info!(client = %self.peer.client, itt, "iscsi: a task tag already in use; rejected");
            self.reject(&pdu.bhs, reject::INVALID_PDU_FIELD, counted);
            return Ok(());
        }
        let mut pending = PendingData {
            lun: pdu.bhs.lun(),
            counted,
            expected,
            keep,
            total: keep.max(unsolicited_end),
            received: 0,
            unsolicited_end,
            r2t: None,
            next_r2t_sn: 0,
            next_data_sn: 0,
            residual,
            sink,
            admission,
            started_ns,
            due: tokio::time::Instant::now() + self.server.config.data_out_timeout,
        };
        pending.store(0, &pdu.data);
        pending.received = pdu.data.len();
        self.advance(itt, pending).await;
        Ok(())
    }

    /// After data arrived: submit when all is in, else send the next R2T or wait.
    async fn advance(&mut self, itt: u32, mut pending: PendingData) {
        if pending.received >= pending.total {
            self.data_complete(itt, pending).await;
            return;
        }
        let phase_done = match pending.r2t {
            None => pending.received >= pending.unsolicited_end,
            Some((_, end)) => pending.received >= end,
        };
        if phase_done {
            let ttt = self.take_ttt();
            let end = (pending.received + self.params.max_burst_bytes).min(pending.total);
            let mut bhs = Bhs::new(op::R2T, true);
            bhs.set_lun(pending.lun);
            bhs.set_u32(16, itt);
            bhs.set_u32(20, ttt);
            bhs.set_u32(36, pending.next_r2t_sn);
            bhs.set_u32(40, clamp32(pending.received));
            bhs.set_u32(44, clamp32(end - pending.received));
            pending.next_r2t_sn = pending.next_r2t_sn.wrapping_add(1);
            pending.next_data_sn = 0;
            pending.r2t = Some((ttt, end));
            self.send(OutPdu::new(bhs, Payload::None, StatSn::Peek));
        }
        self.pending.insert(itt, pending);
    }

    async fn on_data_out(&mut self, pdu: Pdu) {
        let bhs = &pdu.bhs;
        let itt = bhs.itt();
        let Some(mut pending) = self.pending.remove(&itt) else {
            if self.ended.contains(itt) {
                tracing::debug!(itt, "iscsi: Data-Out for a command that ended before its data; dropped");
            } else {
                tracing::debug!(client = %self.peer.client, itt, "iscsi: Data-Out for no command; rejected");
                self.reject(bhs, reject::INVALID_PDU_FIELD, false);
            }
            return;
        };
        let (ttt, data_sn, offset) = (bhs.u32_at(20), bhs.u32_at(36), bhs.u32_at(40) as usize);
        let phase_end = match pending.r2t {
            None => pending.unsolicited_end,
            Some((_, end)) => end,
        };
        let expected_ttt = pending.r2t.map_or(NO_TAG, |(t, _)| t);
        let in_order = ttt == expected_ttt
            && data_sn == pending.next_data_sn
            && offset == pending.received
            && offset + pdu.data.len() <= phase_end;
        if !in_order {
            tracing::info!(
                client = %self.peer.client, itt, ttt, data_sn, offset, len = pdu.data.len(),
                "iscsi: Data-Out out of sequence; the command fails"
            );
            IscsiStats::count(&self.server.stats.protocol_errors);
            self.send(check_condition(itt, Sense::DATA_PHASE_ERROR, pending.expected, pending.counted));
            self.ended.note(itt);
            return;
        }
        pending.store(offset, &pdu.data);
        pending.received += pdu.data.len();
        pending.next_data_sn = pending.next_data_sn.wrapping_add(1);
        let now = tokio::time::Instant::now();
        pending.due = now + self.server.config.data_out_timeout;
        self.data_out_progress = Some(now);
        self.advance(itt, pending).await;
    }

    /// All of a command's data is in: run it.
    async fn data_complete(&mut self, itt: u32, pending: PendingData) {
        let PendingData { lun, counted, expected, residual, sink, admission, started_ns, .. } = pending;
        let Some(unit) = &self.unit else { return };
        let wce = unit.wce.load(Ordering::Relaxed);
        let collected = collected(sink, residual, &unit.geometry.read(), wce);
        match collected {
            Collected::Submit(command, answer) => {
                let Some(admission) = admission else { return };
                self.submit(command, admission, started_ns, itt, lun, expected, counted, answer).await;
            }
            Collected::Good => self.send(scsi_response(itt, scsi::STATUS_GOOD, None, residual, counted)),
            Collected::Check(sense) => self.send(check_condition(itt, sense, expected, counted)),
            Collected::ModeSelect { ten, buffer } => {
                let pdu = self.mode_select(ten, &buffer, itt, residual, expected, counted).await;
                self.send(pdu);
                drop(admission);
            }
            Collected::ReservationOut { service_action, kind, parameter_bytes, buffer } => {
                let pdu = self.reservation_out(service_action, kind, parameter_bytes, buffer, itt, residual, expected, counted).await;
                self.send(pdu);
                drop(admission);
            }
        }
    }

    /// MODE SELECT's parameter list is in: a WCE change is applied, saved as the
    /// volume's `wce` property and announced to the other sessions.
    async fn mode_select(&self, ten: bool, buffer: &[u8], itt: u32, residual: Residual, expected: usize, counted: bool) -> OutPdu {
        let Some(unit) = &self.unit else { return check_condition(itt, Sense::INTERNAL_FAILURE, expected, counted) };
        let current = unit.wce.load(Ordering::Relaxed);
        match scsi::mode_select(buffer, ten, current) {
            Ok(Some(wce)) if wce != current => {
                unit.wce.store(wce, Ordering::Relaxed);
                unit.reservations.update(|state| state.raise_for_others(&unit.nexus, pr::UA_MODE_PARAMETERS_CHANGED));
                let registry = self.server.frontend.registry.clone();
                let export = unit.export.clone();
                let value = if wce { "on" } else { "off" };
                let saved = tokio::task::spawn_blocking(move || registry.set_property(&export, "wce", value)).await;
                match saved {
                    Ok(Ok(())) => tracing::info!(export = %unit.export, wce = value, "iscsi: write cache changed by MODE SELECT"),
                    Ok(Err(error)) => tracing::warn!(export = %unit.export, %error, "iscsi: the wce property could not be saved"),
                    Err(_) => {}
                }
                scsi_response(itt, scsi::STATUS_GOOD, None, residual, counted)
            }
            Ok(_) => scsi_response(itt, scsi::STATUS_GOOD, None, residual, counted),
            Err(sense) => check_condition(itt, sense, expected, counted),
        }
    }

    /// Before a command of LUN 0 runs: a volume grown since this session last looked
    /// (`zilla set volsize=`) is the size its answers give from now on, and the session's
    /// nexus gets the unit attention CAPACITY DATA HAS CHANGED (SBC-4 §4.10), so the
    /// initiator reads the capacity again (Linux rescans the disk on it).
    fn notice_capacity(unit: &Unit) {
        let blocks = unit.volume.size() / u64::from(LOGICAL_BLOCK_BYTES);
        if blocks == unit.geometry.read().blocks {
            return;
        }
        unit.geometry.write().blocks = blocks;
        unit.reservations.update(|s| s.raise(&unit.nexus, pr::UA_CAPACITY_DATA_CHANGED));
    }

    /// Before a command of LUN 0 runs: a pending unit attention, or a reservation the
    /// command conflicts with, answers it instead (`true`).
    fn reservations_refuse(&self, cdb: &[u8], itt: u32, lun: [u8; 8], expected: usize, counted: bool) -> bool {
        let Some(unit) = &self.unit else { return false };
        let verdict = unit.reservations.check(&unit.nexus, cdb);
        match verdict {
            pr::Verdict::Run => return false,
            pr::Verdict::Refuse(pr::Refusal::Conflict) => {
                self.send(scsi_response(itt, pr::STATUS_RESERVATION_CONFLICT, None, Residual::of(expected, 0), counted));
            }
            pr::Verdict::Refuse(pr::Refusal::Check(sense)) => self.send(check_condition(itt, sense, expected, counted)),
            pr::Verdict::SenseData(sense) => {
                let mut data = sense.fixed().to_vec();
                data.truncate(usize::from(cdb[4]));
                self.send_small_data_in(itt, lun, data, expected, counted);
            }
        }
        true
    }

    /// RESERVE, RELEASE and PERSISTENT RESERVE IN (they need no data).
    fn on_reservation(&self, unit: &Unit, command: pr::Command, itt: u32, lun: [u8; 8], expected: usize, counted: bool) {
        let answer = unit.reservations.update(|state| match command {
            pr::Command::Reserve => state.reserve6(&unit.nexus).map(|()| None),
            pr::Command::Release => {
                state.release6(&unit.nexus);
                Ok(None)
            }
            pr::Command::In { service_action, allocation } => {
                state.pr.read(service_action, usize::from(allocation)).map(Some).map_err(pr::Refusal::Check)
            }
            pr::Command::Out { .. } => Err(pr::Refusal::Check(Sense::INTERNAL_FAILURE)),
        });
        match answer {
            Ok(None) => self.send(scsi_response(itt, scsi::STATUS_GOOD, None, Residual::of(expected, 0), counted)),
            Ok(Some(data)) => self.send_small_data_in(itt, lun, data, expected, counted),
            Err(pr::Refusal::Conflict) => {
                self.send(scsi_response(itt, pr::STATUS_RESERVATION_CONFLICT, None, Residual::of(expected, 0), counted))
            }
            Err(pr::Refusal::Check(sense)) => self.send(check_condition(itt, sense, expected, counted)),
        }
    }

    /// PERSISTENT RESERVE OUT with its parameter list in: applied to the unit's state
    /// and, with APTPL, stored in the volume before the answer.
    #[allow(clippy::too_many_arguments)]
    async fn reservation_out(&self, service_action: u8, kind: u8, parameter_bytes: u32, buffer: Vec<u8>, itt: u32, residual: Residual, expected: usize, counted: bool) -> OutPdu {
        let Some(unit) = &self.unit else { return check_condition(itt, Sense::INTERNAL_FAILURE, expected, counted) };
        let shared = unit.reservations.clone();
        let _serial = shared.out_serial.lock().await;
        let result = shared.update(|state| state.persistent_reserve_out(&unit.nexus, service_action, kind, parameter_bytes, &buffer));
        match result {
            Ok(None) => scsi_response(itt, scsi::STATUS_GOOD, None, residual, counted),
            Ok(Some(text)) => {
                let registry = self.server.frontend.registry.clone();
                let export = unit.export.clone();
                let saved = tokio::task::spawn_blocking(move || registry.set_property(&export, pr::PROPERTY, &text)).await;
                match saved {
                    Ok(Ok(())) => scsi_response(itt, scsi::STATUS_GOOD, None, residual, counted),
                    Ok(Err(error)) => {
                        tracing::warn!(export = %unit.export, %error, "iscsi: persistent reservations could not be stored");
                        check_condition(itt, Sense::INTERNAL_FAILURE, expected, counted)
                    }
                    Err(_) => check_condition(itt, Sense::INTERNAL_FAILURE, expected, counted),
                }
            }
            Err(pr::Refusal::Conflict) => scsi_response(itt, pr::STATUS_RESERVATION_CONFLICT, None, residual, counted),
            Err(pr::Refusal::Check(sense)) => check_condition(itt, sense, expected, counted),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn submit(
        &mut self,
        command: Command,
        admission: Admission,
        started_ns: u64,
        itt: u32,
        lun: [u8; 8],
        expected: usize,
        counted: bool,
        answer: Answer,
    ) {
        let Some(unit) = &self.unit else { return };
        let completer = || IoCompleter { replies: unit.replies.clone(), itt, lun, expected, counted, answer: answer.clone() };
        match unit.executor.submit(Request { command, started_ns }, admission, completer) {
            Submitted::Inline(completion) => completer().complete(completion),
            Submitted::Started => {}
            Submitted::Blocked(blocked) => unit.executor.resume(blocked, || {}).await,
        }
    }

    /// Wait (bounded by the shutdown grace) for the commands in flight.
    async fn drain(&mut self) {
        self.pending.clear();
        self.settle().await;
    }

    /// The connection is over: its commands finish (bounded), the unit lets go of this
    /// session's I_T nexus, and the writer puts the last PDUs on the wire.
    async fn close(mut self, writer: tokio::task::JoinHandle<io::Result<()>>) {
        self.drain().await;
        if let Some(unit) = &self.unit {
            self.server.units.detach(&unit.export, &unit.nexus, &unit.reservations);
        }
        let server = self.server.clone();
        drop(self);
        writer_finished(writer, &server.config).await;
    }
}
