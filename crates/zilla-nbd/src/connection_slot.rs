//! connection_slot: what the accept loop knows about one live connection (the age of
//! its last request) and the doorbell it rings to ask an idle connection to close.
//! The transmission loop updates the age and answers the doorbell; see server.rs for
//! the eviction policy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use tokio::sync::Notify;

/// Milliseconds since the first call (a coarse monotonic clock for idle ages); never 0.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// What the accept loop knows about one live connection.
#[derive(Default)]
pub(crate) struct ConnectionSlot {
    /// `now_ms()` of the last request read; 0 until transmission starts.
    pub(crate) last_request_ms: AtomicU64,
    /// Asks the connection to close if nothing is in flight.
    pub(crate) evict: Notify,
}

impl ConnectionSlot {
    pub(crate) fn touch(&self) {
        self.last_request_ms.store(now_ms(), Ordering::Relaxed);
    }
}

