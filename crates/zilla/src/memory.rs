//! memory: the daemon's memory beyond the ARC and dirty data (its "overhead"),
//! measured and set against its bound.
//!
//! Theory of operation
//! -------------------
//! The daemon's resident memory (docs/design.md §5) is bounded by
//!
//! ```text
//!   RSS <= ARC max + dirty max + front-end budget + reply-buffer pool cap
//!          + 192 MiB fixed + 128 KiB per open NBD connection
//! ```
//!
//! The ARC and dirty data have their own tunables and counters; everything else is the
//! overhead, reported here as measured now:
//!
//! ```text
//!   overhead      = RSS - ARC size - dirty bytes           (saturating; the ARC size
//!                   includes its reservations: a syncing txg's written buffers,
//!                   held until the commit, arc.rs "Reservations")
//!   frontend      = front-end budget in use (request/reply data; <= the budget)
//!   reply_pool    = idle reply buffers kept for reuse        (<= the pool cap)
//!   block_buffers = free slots of the block-buffer slab (vdev/abd.rs: whole free
//!                   chunks <= 1 GiB, returned when the pool goes idle, plus the free
//!                   slots of chunks partly in use);
//!                   the slab's in-use bytes are the ARC's, dirty data's and the
//!                   front end's, counted there
//!   other         = overhead - frontend - reply_pool - block_buffers: engine buffers (sync write
//!                   windows, the MOS copy, allocator trees, queue and scan buffers,
//!                   intent-log itxs), thread stacks, and freed memory the allocator
//!                   keeps (<= the fixed term)
//!   overhead_max  = front-end budget + reply-pool cap + 192 MiB + 128 KiB x connections
//!   frontend_max, reply_pool_max, block_buffers_max
//!                 = each pool's own bound: the front-end budget, the reply-pool cap,
//!                   min(1 GiB, ARC max + dirty max) of whole free slab chunks
//! ```
//!
//! Giving memory back. Block buffers live in the slab's own mappings (vdev/abd.rs), so
//! a chunk the slab releases leaves RSS at once. The rest of the heap (engine buffers,
//! trees, queues) is glibc's, in one arena (main.rs), and glibc returns only the top of
//! its heap when memory is freed: free pages below a live allocation stay resident.
//! Every [`HEAP_RETURN_INTERVAL`] a thread gives the slab's whole free chunks that have
//! waited out their 30 s back (a pool with nothing dirty syncs no txg that would), once
//! the slab has not changed for 15 s the pages of its free slots in chunks still partly
//! in use (a cached block pins its chunk: 186 MiB of such slots after the soak's
//! scrubs and resilvers with a 64 MiB ARC), and asks glibc to return the free pages of its
//! heap (`malloc_trim`) once at least [`HEAP_RETURN_MIN_BYTES`] of it are free, so
//! memory freed after a burst of writes, a scrub or a resilver goes back to the system
//! within that interval even when nothing else runs.
//!
//! Every term is a number the daemon already has; RSS is read from /proc/self/statm.
//! Memory the allocator keeps after dirty data or the ARC shrank stays in RSS and so
//! shows as overhead until it is reused or returned: an overhead above `overhead_max`
//! while the ARC and dirty data are below their maxima is not yet a broken bound (the
//! bound is on RSS), but it is the number to watch.

use crate::pools::PoolTable;
use std::time::Duration;

/// How often the daemon returns the allocator's free heap pages to the system.
pub const HEAP_RETURN_INTERVAL: Duration = Duration::from_secs(5);
/// The allocator's free bytes below which nothing is returned (not worth a heap walk).
pub const HEAP_RETURN_MIN_BYTES: u64 = 4 << 20;

/// Ticks of [`HEAP_RETURN_INTERVAL`] with the block-buffer slab unchanged (15 s) after
/// which the pages of its free slots are given back.
const SLAB_QUIET_TICKS: u32 = 3;

/// Start the thread that returns the allocator's free heap pages (module comment).
pub fn spawn_heap_returner() {
    let spawned = std::thread::Builder::new().name("zilla-heap-return".into()).spawn(|| {
        let (mut last, mut quiet_ticks) = (zilla_core::vdev::abd::stats(), 0u32);
        loop {
            std::thread::sleep(HEAP_RETURN_INTERVAL);
            // whole free slab chunks past their 30 s (a pool with nothing dirty may not
            // sync a txg that would trim them), on the clock the daemon's pools use
            zilla_core::vdev::abd::trim(zilla_core::env::real().now_ns());
            let now = zilla_core::vdev::abd::stats();
            if (now.in_use_bytes, now.chunk_bytes) == (last.in_use_bytes, last.chunk_bytes) {
                quiet_ticks += 1;
            } else {
                (last, quiet_ticks) = (now, 0);
            }
            // the slab unchanged for SLAB_QUIET: the free slots of chunks the ARC
            // still holds a block of go back too, once
            if quiet_ticks == SLAB_QUIET_TICKS {
                zilla_core::vdev::abd::release_free_slots();
            }
            return_free_heap();
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the thread that returns free memory: {e}");
    }
}

/// Return the allocator's free heap pages to the system if it holds at least
/// [`HEAP_RETURN_MIN_BYTES`] free; returns the bytes the RSS fell by.
pub fn return_free_heap() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 and malloc_trim only read and adjust the allocator's own state.
        let free = unsafe { libc::mallinfo2() }.fordblks as u64;
        if free < HEAP_RETURN_MIN_BYTES {
            return 0;
        }
        let before = rss_bytes();
        // SAFETY: as above.
        unsafe { libc::malloc_trim(0) };
        let returned = before.saturating_sub(rss_bytes());
        if returned >= HEAP_RETURN_MIN_BYTES {
            tracing::debug!(returned_bytes = returned, heap_free_bytes = free, "returned free heap memory to the system");
        }
        returned
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0
}

/// The fixed term of the memory bound (design.md §5).
pub const FIXED_OVERHEAD_BYTES: u64 = 192 << 20;
/// Per open NBD or iSCSI connection: its read and write buffers.
pub const PER_CONNECTION_BYTES: u64 = 128 << 10;

/// What the overhead is computed from, all in bytes except `connections`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryInputs {
    pub rss: u64,
    pub arc_size: u64,
    pub dirty: u64,
    pub frontend_budget: u64,
    pub frontend_in_use: u64,
    pub reply_pool: u64,
    pub reply_pool_cap: u64,
    pub block_buffers_idle: u64,
    /// ARC max + dirty data max: the slab keeps whole free chunks only within it.
    pub arc_plus_dirty_max: u64,
    pub connections: u64,
}

/// The overhead and its parts (module comment), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryReport {
    pub rss: u64,
    pub overhead: u64,
    pub frontend: u64,
    pub reply_pool: u64,
    pub block_buffers_idle: u64,
    pub other: u64,
    pub overhead_max: u64,
    /// The bounds of the parts that are pools or caches: the front-end budget, the
    /// reply-pool cap, and what the slab keeps of whole free chunks (min(1 GiB,
    /// ARC max + dirty max), returned 30 s after their last use).
    pub frontend_max: u64,
    pub reply_pool_max: u64,
    pub block_buffers_max: u64,
}

pub fn report(i: MemoryInputs) -> MemoryReport {
    let overhead = i.rss.saturating_sub(i.arc_size).saturating_sub(i.dirty);
    MemoryReport {
        rss: i.rss,
        overhead,
        frontend: i.frontend_in_use,
        reply_pool: i.reply_pool,
        block_buffers_idle: i.block_buffers_idle,
        other: overhead.saturating_sub(i.frontend_in_use).saturating_sub(i.reply_pool).saturating_sub(i.block_buffers_idle),
        overhead_max: i.frontend_budget + i.reply_pool_cap + FIXED_OVERHEAD_BYTES + i.connections * PER_CONNECTION_BYTES,
        frontend_max: i.frontend_budget,
        reply_pool_max: i.reply_pool_cap,
        block_buffers_max: zilla_core::vdev::abd::IDLE_MAX_BYTES.min(i.arc_plus_dirty_max),
    }
}

/// The report now: RSS, the ARC and dirty data of every pool of `pools`, the shared
/// front end's budget and reply pool, `connections` open front-end connections.
pub fn measure(pools: &PoolTable, frontend: &zilla_frontend::FrontendStats, connections: u64) -> MemoryReport {
    // the daemon's one ARC; a syncing txg's written buffers are reserved in it until
    // their txg commits
    let arc = zilla_core::arc::daemon_arc().stats();
    let arc_size = arc.size + arc.reserved;
    let mut dirty = 0;
    for (_, pool) in pools.all() {
        dirty += pool.throttle_stats().dirty_bytes;
    }
    report(MemoryInputs {
        rss: rss_bytes(),
        arc_size,
        dirty,
        frontend_budget: frontend.memory.total,
        frontend_in_use: frontend.memory.in_use,
        reply_pool: frontend.buffers.pooled_bytes,
        reply_pool_cap: frontend.buffers.bytes_max,
        block_buffers_idle: { let st = zilla_core::vdev::abd::stats(); st.idle_bytes.saturating_sub(st.released_bytes) },
        arc_plus_dirty_max: zilla_core::arc::daemon_arc().c_max() + zilla_core::dsl_pool::dirty_data_max(),
        connections,
    })
}

/// This process's resident set size (0 if /proc cannot be read).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

impl MemoryReport {
    /// The `/v1/arcstats` keys (Zilla names, next to the arcstats kstat names).
    pub fn kstats(&self) -> [(&'static str, u64); 10] {
        [
            ("zilla_rss_bytes", self.rss),
            ("zilla_overhead_bytes", self.overhead),
            ("zilla_overhead_frontend_bytes", self.frontend),
            ("zilla_overhead_reply_pool_bytes", self.reply_pool),
            ("zilla_overhead_block_buffers_bytes", self.block_buffers_idle),
            ("zilla_overhead_other_bytes", self.other),
            ("zilla_overhead_max_bytes", self.overhead_max),
            ("zilla_overhead_frontend_max_bytes", self.frontend_max),
            ("zilla_overhead_reply_pool_max_bytes", self.reply_pool_max),
            ("zilla_overhead_block_buffers_max_bytes", self.block_buffers_max),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_is_rss_beyond_arc_and_dirty_and_its_parts_add_up() {
        let i = MemoryInputs {
            rss: 500 << 20,
            arc_size: 64 << 20,
            dirty: 100 << 20,
            frontend_budget: 256 << 20,
            frontend_in_use: 10 << 20,
            reply_pool: 6 << 20,
            reply_pool_cap: 32 << 20,
            block_buffers_idle: 3 << 20,
            arc_plus_dirty_max: 512 << 20,
            connections: 4,
        };
        let r = report(i);
        assert_eq!(r.overhead, 336 << 20);
        assert_eq!(r.frontend + r.reply_pool + r.block_buffers_idle + r.other, r.overhead);
        assert_eq!(r.overhead_max, (256 << 20) + (32 << 20) + (192 << 20) + 4 * (128 << 10));
        // every pool's bound is named: the slab keeps whole free chunks within ARC max +
        // dirty max, and never more than 1 GiB
        assert_eq!((r.frontend_max, r.reply_pool_max, r.block_buffers_max), (256 << 20, 32 << 20, 512 << 20));
        assert_eq!(report(MemoryInputs { arc_plus_dirty_max: 8 << 30, ..i }).block_buffers_max, 1 << 30);
        // more ARC and dirty than RSS (pages not touched yet): no underflow
        assert_eq!(report(MemoryInputs { rss: 10, arc_size: 64, dirty: 5, ..i }).overhead, 0);
    }

    #[test]
    fn rss_of_this_process_is_read() {
        assert!(rss_bytes() > 1 << 20, "{}", rss_bytes());
    }
}
