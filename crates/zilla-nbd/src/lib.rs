//! zilla-nbd: an NBD server (fixed newstyle, structured replies, `base:allocation`)
//! over [`zilla_frontend::volume::BlockVolume`], through the one request path
//! of every front end ([`zilla_frontend::Executor`]).
//!
//! Modules, in reading order:
//! - [`proto`]: wire constants, pure parsers and encoders (fuzzed);
//! - `framing`: a cancel-safe buffered reader;
//! - `registry` (in zilla-frontend, re-exported): export names to volumes;
//! - `handshake`: option haggling up to the transmission phase;
//! - `transmission`: the pipelined request loop of one connection;
//! - [`server`]: accept loops, connection lifecycle, graceful shutdown.
//!
//! The daemon builds an [`NbdServer`] from the shared [`Frontend`] (registry, memory
//! and volume-call budgets, I/O statistics) and an [`NbdConfig`], binds
//! listeners itself and calls [`NbdServer::serve_tcp`] / [`NbdServer::serve_unix`]
//! with a `watch::Receiver<bool>` that turns true on shutdown.

use std::time::Duration;

pub mod proto;
pub mod server;

#[doc(hidden)]
pub mod fuzzing;

mod connection_slot;
mod framing;
mod handshake;
mod reply_line;
mod stats;
mod transmission;

/// Export lookup lives in the shared front-end crate; re-exported for callers of
/// this crate.
pub use zilla_frontend::registry;
pub use zilla_frontend::{resolve_export, ExportInfo, ExportRegistry, Frontend, FrontendConfig, StaticRegistry};
pub use server::{NbdServer, NbdStats, NbdStatsSnapshot};

/// Tunables of the NBD server (per listener and per connection; the daemon-wide
/// memory and volume-call budgets are in [`FrontendConfig`]). Every field bounds
/// something.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    /// Requests in flight per connection (read, reply not yet written). Error replies
    /// count too.
    pub in_flight_requests_max: usize,
    /// Largest READ/WRITE length accepted, advertised as the maximum block size.
    pub payload_max_bytes: u32,
    /// Options accepted in one handshake before the server gives up on the client.
    pub options_max: u32,
    /// Time a client has to finish the handshake.
    pub handshake_timeout: Duration,
    /// A connection with nothing in flight that sends no request for this long is
    /// closed (zero: never). NBD has no keep-alive; the client sees the connection
    /// closed and reconnects (nbd-client -persist, qemu reconnect-delay) or fails.
    pub idle_timeout: Duration,
    /// A client whose socket accepts no reply bytes for this long is disconnected,
    /// returning the budget its unread replies hold (zero: never).
    pub reply_stall_timeout: Duration,
    /// How long shutdown waits for in-flight requests before closing connections.
    pub shutdown_grace: Duration,
    /// Simultaneous connections per listener. At the cap, the connection idle longest
    /// (nothing in flight) is closed to make room; if none is idle, new clients wait
    /// in the listen backlog. Each connection costs one file descriptor.
    pub connections_max: usize,
}

impl Default for NbdConfig {
    fn default() -> NbdConfig {
        NbdConfig {
            in_flight_requests_max: 128,
            payload_max_bytes: zilla_frontend::REQUEST_MAX_BYTES as u32,
            options_max: 1024,
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(600),
            reply_stall_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            connections_max: 4096,
        }
    }
}

impl NbdConfig {
    /// Check relations between the fields; call before serving.
    pub fn validate(&self) -> Result<(), String> {
        if self.in_flight_requests_max == 0 || self.in_flight_requests_max > 65_536 {
            return Err(format!("in_flight_requests_max {} out of range 1..=65536", self.in_flight_requests_max));
        }
        if self.payload_max_bytes < 4096 || self.payload_max_bytes as usize > zilla_frontend::REQUEST_MAX_BYTES {
            return Err(format!(
                "payload_max_bytes {} out of range 4096..={}",
                self.payload_max_bytes,
                zilla_frontend::REQUEST_MAX_BYTES
            ));
        }
        if self.connections_max == 0 || self.connections_max > 1 << 20 {
            return Err(format!("connections_max {} out of range 1..=1048576", self.connections_max));
        }
        if self.shutdown_grace > Duration::from_secs(60) {
            return Err("shutdown_grace above 60 s".into());
        }
        Ok(())
    }
}
