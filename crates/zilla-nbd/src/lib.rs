//! zilla-nbd: an NBD server (fixed newstyle, structured replies, `base:allocation`)
//! over [`zilla_core::zvol::BlockVolume`].
//!
//! Modules, in reading order:
//! - [`proto`]: wire constants, pure parsers and encoders (fuzzed);
//! - `framing`: a cancel-safe buffered reader;
//! - [`registry`]: export names to volumes ([`ExportRegistry`], [`StaticRegistry`]);
//! - `handshake`: option haggling up to the transmission phase;
//! - `transmission`: the pipelined request loop of one connection;
//! - [`server`]: accept loops, connection lifecycle, graceful shutdown.
//!
//! The daemon builds an [`NbdServer`] from a registry and an [`NbdConfig`], binds
//! listeners itself and calls [`NbdServer::serve_tcp`] / [`NbdServer::serve_unix`]
//! with a `watch::Receiver<bool>` that turns true on shutdown.

use std::time::Duration;

pub mod proto;
pub mod registry;
pub mod server;

#[doc(hidden)]
pub mod fuzzing;

mod framing;
mod handshake;
mod transmission;

pub use registry::{resolve_export, ExportInfo, ExportRegistry, StaticRegistry};
pub use server::{NbdServer, NbdStats};

/// Tunables of the NBD server. Every field bounds something.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    /// Requests in flight per connection (dispatched, reply not yet written). More lets
    /// one client keep more I/O queued; each costs a blocking-pool slot at most.
    pub in_flight_requests_max: usize,
    /// READ/WRITE payload bytes in flight per connection: the memory one connection
    /// may pin. Must be at least `payload_max_bytes`.
    pub in_flight_bytes_max: usize,
    /// Largest READ/WRITE length accepted, advertised as the maximum block size.
    pub payload_max_bytes: u32,
    /// Options accepted in one handshake before the server gives up on the client.
    pub options_max: u32,
    /// Time a client has to finish the handshake.
    pub handshake_timeout: Duration,
    /// How long shutdown waits for in-flight requests before closing connections.
    pub shutdown_grace: Duration,
    /// Simultaneous connections per listener; further clients wait in the backlog.
    pub connections_max: usize,
}

impl Default for NbdConfig {
    fn default() -> NbdConfig {
        NbdConfig {
            in_flight_requests_max: 128,
            in_flight_bytes_max: 64 << 20,
            payload_max_bytes: 32 << 20,
            options_max: 1024,
            handshake_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            connections_max: 1024,
        }
    }
}

impl NbdConfig {
    /// Check relations between the fields; call before serving.
    pub fn validate(&self) -> Result<(), String> {
        if self.in_flight_requests_max == 0 || self.in_flight_requests_max > u32::MAX as usize {
            return Err(format!("in_flight_requests_max {} out of range", self.in_flight_requests_max));
        }
        if self.in_flight_bytes_max < self.payload_max_bytes as usize {
            return Err(format!(
                "in_flight_bytes_max {} < payload_max_bytes {}",
                self.in_flight_bytes_max, self.payload_max_bytes
            ));
        }
        if self.payload_max_bytes < 4096 {
            return Err(format!("payload_max_bytes {} < 4096", self.payload_max_bytes));
        }
        if self.connections_max == 0 {
            return Err("connections_max must be at least 1".into());
        }
        Ok(())
    }
}
