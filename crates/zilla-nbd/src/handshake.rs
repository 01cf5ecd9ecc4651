//! handshake: fixed-newstyle option haggling, from greeting to transmission.
//!
//! ```text
//!   S: NBDMAGIC IHAVEOPT flags=FIXED_NEWSTYLE|NO_ZEROES
//!   C: client flags            (unknown bits or no FIXED_NEWSTYLE -> close)
//!   loop, at most `options_max` times:
//!     C: IHAVEOPT option length data
//!        EXPORT_NAME  -> size+flags (+124 zeros unless NO_ZEROES) -> Transmission
//!                        (unknown name -> close: this legacy option has no error reply)
//!        GO           -> INFO* ACK -> Transmission   (unknown -> ERR_UNKNOWN, keep going)
//!        INFO         -> INFO* ACK                   (same as GO but stays here)
//!        LIST         -> SERVER* ACK
//!        STRUCTURED_REPLY        -> ACK, READ replies become structured
//!        LIST/SET_META_CONTEXT   -> META_CONTEXT* ACK (only base:allocation exists)
//!        ABORT        -> ACK, close
//!        anything else -> ERR_UNSUP, keep going
//! ```
//!
//! State kept across options: whether structured replies are on, and which export the
//! last SET_META_CONTEXT selected `base:allocation` for. A later GO on a different
//! export voids that selection (the spec ties the selection to the export name).
//!
//! Bounds: option data above [`proto::OPTION_DATA_MAX_BYTES`] is skipped without
//! allocation and answered ERR_TOO_BIG; strings are capped at 4096 bytes; at most
//! `options_max` options per connection; the caller applies a handshake timeout.
//!
//! Block sizes advertised: minimum 1, preferred = volblocksize (at least 4096),
//! maximum = payload cap (32 MiB). Minimum 1 because the volume does its own
//! read-modify-write for sub-block I/O, and libnbd's strict mode refuses requests
//! misaligned to an advertised minimum: a minimum of 512 would buy nothing and
//! break byte-granular clients. The same values qemu-nbd advertises.

use std::io;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::framing::FrameReader;
use crate::proto::{self, *};
use zilla_frontend::{resolve_export, ExportRegistry, ResolvedExport};
use crate::NbdConfig;

/// Context id we hand out for `base:allocation` on SET_META_CONTEXT.
pub(crate) const BASE_ALLOCATION_CONTEXT_ID: u32 = 1;

/// What the handshake hands to the transmission phase.
pub(crate) struct Session {
    pub export: ResolvedExport,
    pub transmission_flags: u16,
    pub structured_replies: bool,
    /// Set when `base:allocation` was selected for this export.
    pub base_allocation_context_id: Option<u32>,
}

/// Negotiation state carried between options.
#[derive(Default)]
struct Negotiation {
    no_zeroes: bool,
    structured_replies: bool,
    /// Export name (canonical) for which base:allocation is selected.
    base_allocation_for: Option<String>,
}

/// Result of handling one option.
enum Step {
    Continue,
    Close,
    Transmission(Session),
}

/// The 16-bit transmission flags for `export` given the negotiated state.
pub(crate) fn transmission_flags(export: &ResolvedExport, structured_replies: bool) -> u16 {
    let mut flags = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_CACHE
        // Every connection to an export shares one volume object, and the volume's
        // flush covers all writes completed before it: multi-conn is safe.
        | FLAG_CAN_MULTI_CONN;
    if export.volume.read_only() {
        flags |= FLAG_READ_ONLY;
    } else {
        flags |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
    }
    if structured_replies {
        flags |= FLAG_SEND_DF;
    }
    flags
}

/// Run the handshake. `Ok(None)` means the client left (ABORT, bad data, unknown
/// EXPORT_NAME) and the connection should be closed.
pub(crate) async fn negotiate<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    registry: &dyn ExportRegistry,
    config: &NbdConfig,
) -> io::Result<Option<Session>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(HANDSHAKE_FLAG_FIXED_NEWSTYLE | HANDSHAKE_FLAG_NO_ZEROES).to_be_bytes());
    writer.write_all(&greeting).await?;
    writer.flush().await?;

    let client_flags = u32::from_be_bytes(reader.read_array::<4>().await?);
    if client_flags & !CLIENT_FLAGS_KNOWN != 0 || client_flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 {
        tracing::debug!(client_flags, "nbd: unsupported client flags, closing");
        return Ok(None);
    }
    let mut state = Negotiation {
        no_zeroes: client_flags & CLIENT_FLAG_NO_ZEROES != 0,
        ..Negotiation::default()
    };

    for _ in 0..config.options_max {
        let header = reader.read_array::<OPTION_HEADER_BYTES>().await?;
        let header = match parse_option_header(&header) {
            Ok(header) => header,
            Err(_) => return Ok(None),
        };
        if header.data_bytes > OPTION_DATA_MAX_BYTES {
            if header.option == OPT_EXPORT_NAME {
                return Ok(None);
            }
            reader.skip(u64::from(header.data_bytes)).await?;
            send_error(writer, header.option, REP_ERR_TOO_BIG, "option data too large").await?;
            continue;
        }
        let mut data = vec![0u8; header.data_bytes as usize];
        reader.read_into(&mut data).await?;
        let mut reply = Vec::new();
        let step = handle_option(&mut state, header.option, &data, registry, config, &mut reply);
        writer.write_all(&reply).await?;
        writer.flush().await?;
        match step {
            Step::Continue => {}
            Step::Close => return Ok(None),
            Step::Transmission(session) => return Ok(Some(session)),
        }
    }
    tracing::debug!(options_max = config.options_max, "nbd: too many options, closing");
    Ok(None)
}

async fn send_error<W: AsyncWrite + Unpin>(writer: &mut W, option: u32, error: u32, message: &str) -> io::Result<()> {
    let mut reply = Vec::new();
    encode_option_reply(&mut reply, option, error, message.as_bytes());
    writer.write_all(&reply).await?;
    writer.flush().await
}

/// Handle one option: a pure function of the state and the option bytes, writing the
/// bytes to send into `reply`.
fn handle_option(
    state: &mut Negotiation,
    option: u32,
    data: &[u8],
    registry: &dyn ExportRegistry,
    config: &NbdConfig,
    reply: &mut Vec<u8>,
) -> Step {
    match option {
        OPT_EXPORT_NAME => export_name(state, data, registry, reply),
        OPT_ABORT => {
            encode_option_reply(reply, option, REP_ACK, &[]);
            Step::Close
        }
        OPT_LIST => {
            if !data.is_empty() {
                encode_option_reply(reply, option, REP_ERR_INVALID, b"LIST takes no data");
                return Step::Continue;
            }
            for export in registry.list() {
                let mut body = Vec::with_capacity(4 + export.name.len() + export.description.len());
                body.extend_from_slice(&(export.name.len() as u32).to_be_bytes());
                body.extend_from_slice(export.name.as_bytes());
                body.extend_from_slice(export.description.as_bytes());
                encode_option_reply(reply, option, REP_SERVER, &body);
            }
            encode_option_reply(reply, option, REP_ACK, &[]);
            Step::Continue
        }
        OPT_INFO | OPT_GO => info_or_go(state, option, data, registry, config, reply),
        OPT_STRUCTURED_REPLY => {
            if data.is_empty() {
                state.structured_replies = true;
                encode_option_reply(reply, option, REP_ACK, &[]);
            } else {
                encode_option_reply(reply, option, REP_ERR_INVALID, b"STRUCTURED_REPLY takes no data");
            }
            Step::Continue
        }
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => meta_context(state, option, data, registry, reply),
        _ => {
            encode_option_reply(reply, option, REP_ERR_UNSUP, b"option not supported");
            Step::Continue
        }
    }
}

fn export_name(state: &mut Negotiation, data: &[u8], registry: &dyn ExportRegistry, reply: &mut Vec<u8>) -> Step {
    if data.len() > STRING_MAX_BYTES as usize {
        return Step::Close;
    }
    let Ok(name) = std::str::from_utf8(data) else { return Step::Close };
    let Some(export) = resolve_export(registry, name) else {
        tracing::debug!(name, "nbd: EXPORT_NAME of unknown export, closing");
        return Step::Close;
    };
    let flags = transmission_flags(&export, state.structured_replies);
    reply.extend_from_slice(&export.volume.size().to_be_bytes());
    reply.extend_from_slice(&flags.to_be_bytes());
    if !state.no_zeroes {
        reply.extend_from_slice(&[0u8; 124]);
    }
    Step::Transmission(enter_transmission(state, export, flags))
}

fn enter_transmission(state: &Negotiation, export: ResolvedExport, flags: u16) -> Session {
    let selected = state.structured_replies && state.base_allocation_for.as_deref() == Some(export.name.as_str());
    Session {
        export,
        transmission_flags: flags,
        structured_replies: state.structured_replies,
        base_allocation_context_id: selected.then_some(BASE_ALLOCATION_CONTEXT_ID),
    }
}

fn info_or_go(
    state: &mut Negotiation,
    option: u32,
    data: &[u8],
    registry: &dyn ExportRegistry,
    config: &NbdConfig,
    reply: &mut Vec<u8>,
) -> Step {
    let request = match parse_export_request(data) {
        Ok(request) => request,
        Err(error) => {
            encode_option_reply(reply, option, parse_error_reply(&error), b"malformed INFO/GO request");
            return Step::Continue;
        }
    };
    let Some(export) = resolve_export(registry, &request.name) else {
        let message = format!("no export named {:?}", request.name);
        encode_option_reply(reply, option, REP_ERR_UNKNOWN, message.as_bytes());
        return Step::Continue;
    };
    let flags = transmission_flags(&export, state.structured_replies);
    let mut body = Vec::with_capacity(12);
    body.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    body.extend_from_slice(&export.volume.size().to_be_bytes());
    body.extend_from_slice(&flags.to_be_bytes());
    encode_option_reply(reply, option, REP_INFO, &body);
    if request.info_types.contains(&INFO_NAME) {
        let mut body = INFO_NAME.to_be_bytes().to_vec();
        body.extend_from_slice(export.name.as_bytes());
        encode_option_reply(reply, option, REP_INFO, &body);
    }
    if request.info_types.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
        let mut body = INFO_DESCRIPTION.to_be_bytes().to_vec();
        body.extend_from_slice(export.description.as_bytes());
        encode_option_reply(reply, option, REP_INFO, &body);
    }
    // Always sent: the spec allows unrequested info, and with a minimum of 1 no client
    // is constrained by it.
    let preferred_bytes = export.volume.block_size().max(4096).min(config.payload_max_bytes);
    let mut body = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    body.extend_from_slice(&1u32.to_be_bytes());
    body.extend_from_slice(&preferred_bytes.to_be_bytes());
    body.extend_from_slice(&config.payload_max_bytes.to_be_bytes());
    encode_option_reply(reply, option, REP_INFO, &body);
    encode_option_reply(reply, option, REP_ACK, &[]);
    if option == OPT_GO {
        Step::Transmission(enter_transmission(state, export, flags))
    } else {
        Step::Continue
    }
}

fn meta_context(
    state: &mut Negotiation,
    option: u32,
    data: &[u8],
    registry: &dyn ExportRegistry,
    reply: &mut Vec<u8>,
) -> Step {
    let is_set = option == OPT_SET_META_CONTEXT;
    if is_set {
        // SET replaces the selection even when it fails.
        state.base_allocation_for = None;
    }
    if !state.structured_replies {
        encode_option_reply(reply, option, REP_ERR_INVALID, b"negotiate STRUCTURED_REPLY first");
        return Step::Continue;
    }
    let request = match parse_meta_context_request(data) {
        Ok(request) => request,
        Err(error) => {
            encode_option_reply(reply, option, parse_error_reply(&error), b"malformed meta context request");
            return Step::Continue;
        }
    };
    let Some(export) = resolve_export(registry, &request.export_name) else {
        let message = format!("no export named {:?}", request.export_name);
        encode_option_reply(reply, option, REP_ERR_UNKNOWN, message.as_bytes());
        return Step::Continue;
    };
    // Queries in unknown namespaces are ignored, as the spec requires. LIST accepts
    // the "base:" wildcard; an empty LIST means "everything".
    let matches = if is_set {
        request.queries.iter().any(|q| q == META_CONTEXT_BASE_ALLOCATION)
    } else {
        request.queries.is_empty()
            || request.queries.iter().any(|q| q == "base:" || q == META_CONTEXT_BASE_ALLOCATION)
    };
    if matches {
        let context_id = if is_set { BASE_ALLOCATION_CONTEXT_ID } else { 0 };
        let mut body = context_id.to_be_bytes().to_vec();
        body.extend_from_slice(META_CONTEXT_BASE_ALLOCATION.as_bytes());
        encode_option_reply(reply, option, REP_META_CONTEXT, &body);
        if is_set {
            state.base_allocation_for = Some(export.name);
        }
    }
    encode_option_reply(reply, option, REP_ACK, &[]);
    Step::Continue
}

fn parse_error_reply(error: &proto::ParseError) -> u32 {
    match error {
        ParseError::TooBig => REP_ERR_TOO_BIG,
        _ => REP_ERR_INVALID,
    }
}
