//! zilla-frontend: the narrow interface every front end (NBD today, iSCSI later) and
//! the web layer share. Only the daemon knows pools, front ends and the web together;
//! each of them sees this crate:
//!
//! - [`registry`]: volumes by export name ([`ExportRegistry`], [`resolve_export`]);
//! - [`budget`]: daemon-wide budgets for in-flight bytes and volume calls, shared
//!   fairly by connections ([`SharedBudget`], [`BudgetShare`]);
//! - [`buffers`]: one byte-bounded, idle-trimmed pool of reply buffers;
//! - [`delay_timer`]: precise async sleeps for the write throttle's delays;
//! - [`iostats`]: each session's recorder of its requests, summed per volume, client
//!   and protocol for the admin API, /metrics and analytics;
//! - [`sessions`]: the live sessions by export, which destroy counts and disconnects;
//! - [`executor`]: the one request path: a protocol submits owned requests and gets
//!   exactly one completion each ([`Executor`]).
//!
//! [`Frontend`] bundles them; the daemon builds one from a [`FrontendConfig`] and hands
//! the same `Arc<Frontend>` to every front end, so a second protocol shares the same
//! memory budget rather than adding its own.
//!
//! Memory bound of the front ends (see docs/design.md, "Memory bound"):
//! `memory_budget_bytes + buffer_pool_bytes_max + connections * per-connection fixed
//! buffers`; nothing a client sends can make a front end hold more.

use std::sync::Arc;
use std::time::Duration;
use zilla_core::env::{Clock, Env};

pub mod budget;
pub mod buffers;
pub mod delay_timer;
pub mod executor;
pub mod iostats;
pub mod registry;
pub mod sessions;
pub mod write_gate;

/// What a protocol sees of the engine's volumes: the front-end contract and its data
/// types, and an in-memory stand-in volume for protocol tests. A protocol crate
/// depends on this crate only, never on the engine's internals.
pub mod volume {
    pub use zilla_core::memvol::MemVolume;
    pub use zilla_core::vdev::abd::AlignedBuf;
    pub use zilla_core::zvol::{BlockVolume, Extent, SharedSlice, WriteData};
    pub use zilla_core::{Error, Result};
}

pub use executor::{Admission, Blocked, Command, Completer, Completion, Executor, Output, ReadData, Request, Submitted};
pub use budget::{BudgetPermit, BudgetShare, BudgetStats, SharedBudget};
pub use buffers::{BufferPool, BufferPoolStats};
pub use iostats::{
    ClientIoSnapshot, ClientIoStats, ClientSession, ClientStatsTable, IoKind, IoStatsTable, IoTotals, LatencySnapshot, Recorder,
    SessionLabels, VolumeIoSnapshot,
};
pub use registry::{resolve_export, ExportInfo, ExportRegistry, ResolvedExport, StaticRegistry};

/// Largest single request any front end accepts (NBD advertises it as its maximum
/// block size); the unit of the per-connection minimum.
pub const REQUEST_MAX_BYTES: usize = 32 << 20;

/// Largest request (data plus reply header) that may use the memory budget's
/// small-request lane (see [`budget`]).
pub const LANE_REQUEST_MAX_BYTES: usize = (256 << 10) + 4096;

/// The small-request lane of a memory budget: 1/16 of it, 1 to 16 MiB.
pub fn lane_bytes(memory_budget_bytes: usize) -> usize {
    (memory_budget_bytes / 16).clamp(1 << 20, 16 << 20)
}

/// Daemon-wide front-end limits. Every field bounds something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontendConfig {
    /// Bytes of request and reply data in flight across all connections.
    pub memory_budget_bytes: usize,
    /// Part of the memory budget kept for connections that hold nothing yet.
    pub memory_reserve_bytes: usize,
    /// Most bytes one connection may hold in flight.
    pub memory_per_connection_max_bytes: usize,
    /// Volume calls (blocking-pool threads) in flight across all connections.
    pub volume_calls_max: usize,
    /// Most volume calls one connection may have in flight.
    pub volume_calls_per_connection_max: usize,
    /// Bytes of idle reply buffers kept for reuse.
    pub buffer_pool_bytes_max: usize,
    /// Idle pooled buffers are freed after this long.
    pub buffer_idle_trim: Duration,
    /// Clients (protocol + peer host) whose counters are kept.
    pub clients_max: usize,
}

impl Default for FrontendConfig {
    fn default() -> FrontendConfig {
        FrontendConfig {
            memory_budget_bytes: 256 << 20,
            memory_reserve_bytes: 2 * REQUEST_MAX_BYTES,
            memory_per_connection_max_bytes: 2 * REQUEST_MAX_BYTES,
            // A QD32 client reading a cold volume keeps 32 reads in flight at the
            // devices (as many as the engine before the owned-request pipeline did).
            volume_calls_max: 128,
            volume_calls_per_connection_max: 32,
            buffer_pool_bytes_max: 64 << 20,
            buffer_idle_trim: Duration::from_secs(10),
            clients_max: 256,
        }
    }
}

impl FrontendConfig {
    /// Check the relations between fields; a one-line reason on failure.
    pub fn validate(&self) -> Result<(), String> {
        let min_budget = 2 * REQUEST_MAX_BYTES + 64 * 1024;
        if self.memory_budget_bytes < min_budget {
            return Err(format!("memory budget {} bytes is below the minimum {min_budget}", self.memory_budget_bytes));
        }
        let pool = self.memory_budget_bytes - lane_bytes(self.memory_budget_bytes);
        if self.memory_reserve_bytes < REQUEST_MAX_BYTES || self.memory_reserve_bytes >= pool {
            return Err(format!(
                "memory reserve {} bytes must be at least one request ({REQUEST_MAX_BYTES}) and below the budget \
                 less its small-request lane ({pool})",
                self.memory_reserve_bytes
            ));
        }
        if self.memory_per_connection_max_bytes < REQUEST_MAX_BYTES {
            return Err(format!(
                "per-connection memory {} bytes is below one request ({REQUEST_MAX_BYTES})",
                self.memory_per_connection_max_bytes
            ));
        }
        if self.volume_calls_max < 2 || self.volume_calls_max > 4096 {
            return Err(format!("volume calls {} out of range 2..=4096", self.volume_calls_max));
        }
        if self.volume_calls_per_connection_max == 0 || self.volume_calls_per_connection_max > self.volume_calls_max {
            return Err(format!(
                "volume calls per connection {} out of range 1..={}",
                self.volume_calls_per_connection_max, self.volume_calls_max
            ));
        }
        if self.clients_max == 0 || self.clients_max > 65_536 {
            return Err(format!("clients_max {} out of range 1..=65536", self.clients_max));
        }
        Ok(())
    }
}

/// What the front ends share; one per daemon.
pub struct Frontend {
    pub config: FrontendConfig,
    pub registry: Arc<dyn ExportRegistry>,
    /// Bytes of request and reply data in flight.
    pub memory: Arc<SharedBudget>,
    /// Volume calls in flight (each may hold a blocking-pool thread).
    pub volume_calls: Arc<SharedBudget>,
    /// Blocking work of writes the write throttle delayed (`delay_timer`), once their
    /// delay is over: a delayed write holds no volume call while it waits (it holds no
    /// thread), and the few that then still need a thread (a read-modify-write of an
    /// uncached block, the dirty max, a commit that must block) take one of these, in
    /// FIFO order, any task may wait. `volume_calls_max / 4` (at least 2).
    pub delayed_write_calls: Arc<tokio::sync::Semaphore>,
    pub buffers: BufferPool,
    /// The sessions' recorders and what ended sessions left (see [`iostats`]).
    pub io_stats: IoStatsTable,
    /// Per-client rows (bounded; see [`iostats`]).
    pub clients: ClientStatsTable,
    /// Live sessions by export (destroy refuses while clients are attached).
    pub sessions: sessions::SessionTable,
    /// COMPARE AND WRITE's gates against every other write (see [`write_gate`]).
    pub write_gates: write_gate::WriteGates,
    /// The clock request latencies are measured on: the daemon's Env (a simulated
    /// Env's front end records simulated latencies).
    pub clock: Clock,
}

/// Everything /metrics shows about the front ends.
#[derive(Debug, Clone)]
pub struct FrontendStats {
    pub memory: BudgetStats,
    pub volume_calls: BudgetStats,
    pub buffers: BufferPoolStats,
}

impl Frontend {
    /// Build from a config; out-of-range values are clamped (call
    /// [`FrontendConfig::validate`] first to refuse them instead).
    pub fn new(registry: Arc<dyn ExportRegistry>, config: FrontendConfig) -> Arc<Frontend> {
        Frontend::with_env(registry, config, &zilla_core::env::real())
    }

    /// [`Frontend::new`] timing requests on `env`'s clock.
    pub fn with_env(registry: Arc<dyn ExportRegistry>, config: FrontendConfig, env: &Arc<dyn Env>) -> Arc<Frontend> {
        let calls_reserve = (config.volume_calls_max / 8).max(1);
        Arc::new(Frontend {
            memory: SharedBudget::with_lane(
                "memory_bytes",
                config.memory_budget_bytes,
                config.memory_reserve_bytes,
                config.memory_per_connection_max_bytes,
                lane_bytes(config.memory_budget_bytes),
                LANE_REQUEST_MAX_BYTES,
            ),
            volume_calls: SharedBudget::new(
                "volume_calls",
                config.volume_calls_max,
                calls_reserve,
                config.volume_calls_per_connection_max,
            ),
            delayed_write_calls: Arc::new(tokio::sync::Semaphore::new((config.volume_calls_max / 4).max(2))),
            buffers: BufferPool::new(
                config.buffer_pool_bytes_max,
                REQUEST_MAX_BYTES + 4096,
                config.buffer_idle_trim,
            ),
            io_stats: IoStatsTable::default(),
            clients: ClientStatsTable::new(config.clients_max),
            sessions: sessions::SessionTable::default(),
            write_gates: write_gate::WriteGates::default(),
            clock: Clock::of(env),
            registry,
            config,
        })
    }

    pub fn stats(&self) -> FrontendStats {
        FrontendStats {
            memory: self.memory.stats(),
            volume_calls: self.volume_calls.stats(),
            buffers: self.buffers.stats(),
        }
    }
}
