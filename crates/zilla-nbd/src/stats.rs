//! stats: the NBD server's counters (connections by fate, requests and bytes), kept
//! by the accept loop and the transmission loops and read by the daemon's /metrics.
//! Requests and bytes are not here: each session records them on its own recorder
//! (zilla-frontend's iostats), which the snapshot sums for the protocol.
//! Relaxed atomics only; nothing here allocates after start.

use std::sync::atomic::{AtomicU64, Ordering};

use zilla_frontend::{IoStatsTable, VolumeIoSnapshot};

/// Counters for the admin API / metrics.
#[derive(Debug, Default)]
pub struct NbdStats {
    /// Connections accepted since start.
    pub connections_accepted: AtomicU64,
    /// Connections currently open.
    pub connections_active: AtomicU64,
    /// Connections that reached the transmission phase.
    pub sessions_started: AtomicU64,
    /// Idle connections closed to make room at the connection cap.
    pub connections_evicted: AtomicU64,
    /// Failed accept calls (EMFILE, ENFILE, ...).
    pub accept_errors: AtomicU64,
    /// Connections closed before transmission: a refused or unknown export, an
    /// aborted or timed-out handshake, a protocol error.
    pub connections_refused: AtomicU64,
    /// Connections closed by the idle timeout.
    pub connections_idle_timed_out: AtomicU64,
    /// Replies written by the thread that finished the request (the connection's
    /// write side was idle: no hand-off to the writer task).
    pub replies_written_direct: AtomicU64,
    /// Replies written by a connection's writer task (the socket was full or busy).
    pub replies_written_by_writer: AtomicU64,
}

/// Plain copy of [`NbdStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NbdStatsSnapshot {
    pub connections_accepted: u64,
    pub connections_active: u64,
    pub sessions_started: u64,
    pub connections_evicted: u64,
    pub accept_errors: u64,
    pub connections_refused: u64,
    pub connections_idle_timed_out: u64,
    pub replies_written_direct: u64,
    pub replies_written_by_writer: u64,
    /// Requests and bytes of every NBD session (the sum over clients and volumes).
    pub io: VolumeIoSnapshot,
}

impl NbdStats {
    /// The counters, with the NBD sessions' I/O totals from `io`.
    pub fn snapshot(&self, io: &IoStatsTable) -> NbdStatsSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NbdStatsSnapshot {
            connections_accepted: load(&self.connections_accepted),
            connections_active: load(&self.connections_active),
            sessions_started: load(&self.sessions_started),
            connections_evicted: load(&self.connections_evicted),
            accept_errors: load(&self.accept_errors),
            connections_refused: load(&self.connections_refused),
            connections_idle_timed_out: load(&self.connections_idle_timed_out),
            replies_written_direct: load(&self.replies_written_direct),
            replies_written_by_writer: load(&self.replies_written_by_writer),
            io: io.protocol_totals().get("nbd").map(|t| t.snapshot()).unwrap_or_default(),
        }
    }
}
