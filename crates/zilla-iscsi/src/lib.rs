//! zilla-iscsi: an iSCSI target (RFC 7143) serving every volume as LUN 0 of its own
//! target, over [`zilla_frontend::volume::BlockVolume`], through the one request path
//! of every front end ([`zilla_frontend::Executor`]).
//!
//! Modules, in reading order:
//! - [`pdu`]: the wire format (headers, digests, text keys), pure (fuzzed);
//! - [`login`]: the login phase's key negotiation, pure;
//! - [`auth`]: who may log in to which target, and CHAP, pure;
//! - [`security`]: the security stage of a login (None or CHAP, initiator lists), pure;
//! - [`sessions`]: the live sessions, for the admin's listing;
//! - `access`: the authentication store in use, the sessions, logins in progress per address;
//! - [`sense`]: the unit's description, status and sense data (what the SCSI modules share);
//! - [`thin`], [`pr`]: provisioning and atomic commands, reservations and unit attentions;
//! - [`scsi`]: CDB decoding, INQUIRY/VPD/MODE pages, pure (fuzzed);
//! - [`names`]: target names and the unit's stable identifiers;
//! - `framing`: a cancel-safe PDU reader;
//! - `tags`: the task tags of commands that ended before their Data-Out did;
//! - `writer`: the write side of a connection (StatSN, CmdSN window, digests);
//! - `connection`: login, discovery and the full-feature phase of one connection;
//! - [`server`]: accept loop, connection cap, graceful shutdown.
//!
//! The daemon builds an [`IscsiServer`] from the shared [`Frontend`] and an
//! [`IscsiConfig`], binds the listener itself and calls [`IscsiServer::serve_tcp`]
//! with a `watch::Receiver<bool>` that turns true on shutdown.
//!
//! Task management: ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET,
//! TARGET WARM RESET on the session's commands, with unit attentions to every session of
//! the volume ([`pr`]: persistent reservations, RESERVE/RELEASE, unit attentions).
//! Authentication: CHAP (MD5, one-way and mutual) and initiator lists per target, from
//! an [`auth::AuthStore`] the daemon sets and may replace at any time
//! ([`IscsiServer::set_auth_store`]). Not in this build: several connections per
//! session, error recovery levels above 0, WRITE ATOMIC, EXTENDED COPY.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod access;
pub mod auth;
pub mod login;
pub mod names;
pub mod pdu;
pub mod pr;
pub mod scsi;
pub mod security;
pub mod sense;
pub mod server;
pub mod sessions;
pub mod thin;

mod connection;
mod framing;
mod tags;
mod writer;

pub use server::IscsiServer;
pub use zilla_frontend::{ExportRegistry, Frontend, FrontendConfig, StaticRegistry};

/// Tunables of the target (the daemon-wide memory and volume-call budgets are in
/// [`FrontendConfig`]). Every field bounds something.
#[derive(Debug, Clone)]
pub struct IscsiConfig {
    /// Commands a session may have in flight: the CmdSN window (MaxCmdSN - ExpCmdSN + 1).
    pub command_window: u32,
    /// Largest data segment we receive (declared MaxRecvDataSegmentLength): the
    /// connection's read buffer is this plus headers.
    pub max_recv_data_segment_bytes: usize,
    /// Our MaxBurstLength (largest R2T, Data-In sequence).
    pub max_burst_bytes: usize,
    /// Our FirstBurstLength (immediate plus unsolicited data of one command).
    pub first_burst_bytes: usize,
    /// Time a client has to finish logging in.
    pub login_timeout: Duration,
    /// A client whose socket accepts no bytes for this long is disconnected.
    pub reply_stall_timeout: Duration,
    /// A command waiting for Data-Out that gets none for this long ends the connection
    /// (its budget and window slot return): an initiator that stops sending mid-burst
    /// cannot hold memory the other sessions need.
    pub data_out_timeout: Duration,
    /// How long shutdown waits for in-flight commands before closing connections.
    pub shutdown_grace: Duration,
    /// Simultaneous connections; beyond it new clients wait in the listen backlog.
    pub connections_max: usize,
    /// A target without a CHAP user takes logins without authentication on every
    /// listener. When false (the default) it does so on a loopback listener only, and
    /// elsewhere refuses them (authentication failure).
    pub unauthenticated_logins: bool,
}

impl Default for IscsiConfig {
    fn default() -> IscsiConfig {
        IscsiConfig {
            command_window: 128,
            max_recv_data_segment_bytes: 64 << 10,
            max_burst_bytes: 8 << 20,
            first_burst_bytes: 256 << 10,
            login_timeout: Duration::from_secs(30),
            reply_stall_timeout: Duration::from_secs(60),
            data_out_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
            connections_max: 1024,
            unauthenticated_logins: false,
        }
    }
}

impl IscsiConfig {
    /// Check the fields' ranges; call before serving.
    pub fn validate(&self) -> Result<(), String> {
        if self.command_window == 0 || self.command_window > 4096 {
            return Err(format!("command_window {} out of range 1..=4096", self.command_window));
        }
        if !(512..=(1 << 24) - 1).contains(&self.max_recv_data_segment_bytes) {
            return Err(format!("max_recv_data_segment_bytes {} out of range 512..=16777215", self.max_recv_data_segment_bytes));
        }
        if !(512..=zilla_frontend::REQUEST_MAX_BYTES.min((1 << 24) - 1)).contains(&self.max_burst_bytes) {
            return Err(format!("max_burst_bytes {} out of range", self.max_burst_bytes));
        }
        if self.first_burst_bytes < 512 || self.first_burst_bytes > self.max_burst_bytes {
            return Err(format!("first_burst_bytes {} out of range 512..=max_burst_bytes", self.first_burst_bytes));
        }
        if self.connections_max == 0 || self.connections_max > 1 << 20 {
            return Err(format!("connections_max {} out of range 1..=1048576", self.connections_max));
        }
        if self.data_out_timeout.is_zero() || self.data_out_timeout > Duration::from_secs(3600) {
            return Err(format!("data_out_timeout {:?} out of range (0, 3600 s]", self.data_out_timeout));
        }
        if self.shutdown_grace > Duration::from_secs(60) {
            return Err("shutdown_grace above 60 s".into());
        }
        Ok(())
    }
}

/// Counters of the target for the admin API / metrics (relaxed atomics).
#[derive(Debug, Default)]
pub struct IscsiStats {
    pub connections_accepted: AtomicU64,
    pub connections_active: AtomicU64,
    /// Normal sessions that reached the full-feature phase.
    pub sessions_started: AtomicU64,
    pub discovery_sessions: AtomicU64,
    /// Logins refused (unknown target, bad keys, authentication, timeout).
    pub logins_refused: AtomicU64,
    /// Of those, refused for failed authentication (wrong or missing CHAP
    /// credentials) or authorization (an initiator not on the target's list).
    pub logins_auth_failed: AtomicU64,
    /// PDUs answered with a Reject, connections closed on a malformed PDU, and
    /// connections closed for a command whose Data-Out stopped coming.
    pub protocol_errors: AtomicU64,
    /// Commands ignored for a CmdSN outside the window.
    pub commands_out_of_window: AtomicU64,
    /// Task management requests answered.
    pub task_management: AtomicU64,
}

/// Plain copy of [`IscsiStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IscsiStatsSnapshot {
    pub connections_accepted: u64,
    pub connections_active: u64,
    pub sessions_started: u64,
    pub discovery_sessions: u64,
    pub logins_refused: u64,
    pub logins_auth_failed: u64,
    pub protocol_errors: u64,
    pub commands_out_of_window: u64,
    pub task_management: u64,
    pub io: zilla_frontend::VolumeIoSnapshot,
}

impl IscsiStats {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters, with the iSCSI sessions' I/O totals from `io`.
    pub fn snapshot(&self, io: &zilla_frontend::IoStatsTable) -> IscsiStatsSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IscsiStatsSnapshot {
            connections_accepted: load(&self.connections_accepted),
            connections_active: load(&self.connections_active),
            sessions_started: load(&self.sessions_started),
            discovery_sessions: load(&self.discovery_sessions),
            logins_refused: load(&self.logins_refused),
            logins_auth_failed: load(&self.logins_auth_failed),
            protocol_errors: load(&self.protocol_errors),
            commands_out_of_window: load(&self.commands_out_of_window),
            task_management: load(&self.task_management),
            io: io.protocol_totals().get("iscsi").map(|t| t.snapshot()).unwrap_or_default(),
        }
    }
}
