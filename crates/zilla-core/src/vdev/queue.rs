//! Per-leaf I/O queue: the scheduler seam (HELPER: implement).
use std::io;
use std::sync::Arc;
use crate::kstat::TunableDef;
use super::{Device, IoClass};

pub const TUNABLES: &[TunableDef] = &[];

/// Snapshot of one leaf's statistics (cumulative since open).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LeafStats {
    /// Operations and bytes, indexed by IoClass as usize.
    pub ops: [u64; 5],
    pub bytes: [u64; 5],
    pub flushes: u64,
    /// Per class: total latency (queue + device) log2 histogram, zpool iostat -w buckets.
    pub total_latency_hist: Vec<Vec<u64>>,
    /// Per class: device service time log2 histogram.
    pub disk_latency_hist: Vec<Vec<u64>>,
    /// Per class: currently queued (waiting) and active (issued) I/Os.
    pub queued: [u32; 5],
    pub active: [u32; 5],
}

pub struct LeafQueue {}

impl LeafQueue {
    pub fn new(_dev: Arc<dyn Device>) -> LeafQueue { todo!() }
    pub fn device(&self) -> &Arc<dyn Device> { todo!() }
    /// Blocking read through the queue in class `class`.
    pub fn read(&self, _class: IoClass, _buf: &mut [u8], _offset: u64) -> io::Result<()> { todo!() }
    pub fn write(&self, _class: IoClass, _buf: &[u8], _offset: u64) -> io::Result<()> { todo!() }
    pub fn flush(&self) -> io::Result<()> { todo!() }
    /// Queued + active I/Os right now (mirror read selection load).
    pub fn pending(&self) -> u32 { todo!() }
    /// End offset of the last issued I/O (mirror locality).
    pub fn last_offset(&self) -> u64 { todo!() }
    pub fn stats(&self) -> LeafStats { todo!() }
}
