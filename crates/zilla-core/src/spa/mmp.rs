//! mmp: multihost protection — the heartbeat of an imported pool and the activity check
//! at import (OpenZFS mmp.c, much simplified).
//!
//! Theory of operation
//! -------------------
//! Ownership has three layers, from cheapest to strongest:
//!
//! ```text
//!  1. leaf locks     flock(LOCK_EX|LOCK_NB) on files, O_EXCL on block devices: a second
//!                    importer on this host fails at once, naming the leaf (vdev::file)
//!  2. hostid+state   the config in the labels says ACTIVE and which host wrote it; import
//!                    of an ACTIVE pool last written by another hostid needs force (-f)
//!  3. heartbeat      multihost=on: while imported, every zfs_multihost_interval_ms the
//!                    newest uberblock is rewritten into the heartbeat slot of every label
//!                    of every online leaf with seq+1; import of an ACTIVE multihost pool
//!                    reads the heartbeats, waits 2 intervals (+ 10%), reads again, and
//!                    refuses - even with force - if any heartbeat or uberblock moved
//! ```
//!
//! Layer 1 covers processes on this host; layer 2 a pool moved between hosts without an
//! export; layer 3 storage shared between live hosts (and a same-host importer that
//! reaches the devices by a path the lock does not cover). Layer 3 costs the wait at
//! every import of a pool that was not exported, so it is a pool property (default off,
//! as in OpenZFS). A heartbeat is one slot-sized write per label; it is not flushed (a
//! reader on another host sees it once the device has it; O_DIRECT leaves write through).
//! The thread stops at export and at abandon (nothing is written after a simulated crash).
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{PoolConfig, PoolInner};
use crate::env::Env;
use crate::types::Guid;
use crate::kstat::{Applies, Tunable};
use crate::vdev::label::{self, Heartbeat, LabelScan, Uberblock};
use crate::vdev::mirror::LeafState;
use crate::vdev::Device;
use crate::{Error, Result};

/// Heartbeat interval (mmp.c zfs_multihost_interval).
pub static ZFS_MULTIHOST_INTERVAL_MS: Tunable = Tunable::new(
    "zfs_multihost_interval_ms",
    1000,
    50,
    60_000,
    Applies::Live,
    "multihost heartbeat interval; import waits 2 intervals for an active pool (mmp.c)",
);

/// Sleep granularity of the heartbeat thread (how fast it notices export).
const HEARTBEAT_POLL_NS: u64 = 50_000_000;

impl PoolInner {
    pub(super) fn multihost(&self) -> bool {
        self.config.lock().props.get("multihost").map(|v| v == "on").unwrap_or(false)
    }

    /// The heartbeat thread's body: until shutdown or abandon.
    pub(super) fn heartbeat_loop(self: &Arc<Self>) {
        let mut seq = 0u64;
        loop {
            let interval_ms = ZFS_MULTIHOST_INTERVAL_MS.get();
            let deadline = self.env.now_ns() + interval_ms * 1_000_000;
            while self.env.now_ns() < deadline {
                if self.txg.is_shutting_down() || self.abandoned.load(Ordering::Acquire) {
                    return;
                }
                self.env.sleep_ns(HEARTBEAT_POLL_NS.min(deadline - self.env.now_ns()).max(1));
            }
            seq += 1;
            self.write_heartbeat(seq, interval_ms as u32);
        }
    }

    /// The newest uberblock with heartbeat `seq` into the heartbeat slot of every label
    /// of every online leaf. Errors count as write errors of the leaf; nothing else.
    fn write_heartbeat(&self, seq: u64, interval_ms: u32) {
        let Some(ub) = self.last_ub.lock().clone() else { return };
        let hb = Uberblock {
            timestamp_ns: self.env.unix_time_ns(),
            heartbeat: Some(Heartbeat { seq, hostid: self.env.hostid(), interval_ms }),
            ..ub
        };
        for t in self.tops() {
            for leaf in t.children() {
                if leaf.state() != LeafState::Online || self.abandoned.load(Ordering::Acquire) {
                    continue;
                }
                let dev = leaf.device();
                for l in 0..label::LABELS {
                    let off = label::heartbeat_offset(dev.size(), l, t.ashift);
                    if dev.write_at(&hb.encode_slot(off, label::ub_slot_size(t.ashift)), off).is_err() {
                        leaf.write_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// What import compares before and after its wait: the newest heartbeat and uberblock.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Activity {
    heartbeat: Option<(u64, u64, u32)>,
    txg: u64,
}

fn activity_of(scans: &[&LabelScan], pool_guid: Guid) -> Activity {
    let heartbeat = scans
        .iter()
        .flat_map(|s| s.heartbeats.iter())
        .filter(|u| u.pool_guid == pool_guid)
        .filter_map(|u| u.heartbeat.map(|h| (u.timestamp_ns, h.seq, h.hostid)))
        .max();
    let txg = scans.iter().flat_map(|s| s.uberblocks.iter()).filter(|u| u.pool_guid == pool_guid).map(|u| u.txg.get()).max().unwrap_or(0);
    Activity { heartbeat, txg }
}

/// Import's ownership check of an ACTIVE pool, before anything is written: refuse a pool
/// last written by another host unless `force`; for multihost pools, wait two heartbeat
/// intervals and refuse (force or not) if the pool is alive somewhere.
pub(super) fn check_import_ownership(cfg: &PoolConfig, devs: &[(&dyn Device, &LabelScan)], env: &dyn Env, force: bool) -> Result<()> {
    if cfg.state != "active" {
        return Ok(());
    }
    let host = if cfg.hostname.is_empty() { String::new() } else { format!("host '{}', ", cfg.hostname) };
    if !force && cfg.hostid != 0 && cfg.hostid != env.hostid() {
        return Err(Error::Busy(format!(
            "pool '{}' is active on another system ({host}hostid {:08x}; this is {:08x}) or was not exported from it; \
             if that system no longer uses it, import with -f",
            cfg.name,
            cfg.hostid,
            env.hostid()
        )));
    }
    if cfg.props.get("multihost").map(|v| v != "on").unwrap_or(true) {
        return Ok(());
    }
    let scans: Vec<&LabelScan> = devs.iter().map(|(_, s)| *s).collect();
    let before = activity_of(&scans, cfg.guid);
    let interval_ms = ZFS_MULTIHOST_INTERVAL_MS.get();
    // the writer's own interval, if it is longer than ours
    let recorded = scans.iter().flat_map(|s| s.heartbeats.iter()).filter_map(|u| u.heartbeat).map(|h| h.interval_ms as u64).max().unwrap_or(0);
    let wait_ns = (interval_ms.max(recorded) * 2 + interval_ms.max(recorded) / 10) * 1_000_000;
    tracing::info!(pool = %cfg.name, wait_ms = wait_ns / 1_000_000, "multihost: pool was not exported; watching its heartbeat before import");
    env.sleep_ns(wait_ns);
    let mut rescans = Vec::new();
    for (dev, _) in devs {
        rescans.push(label::scan_labels(*dev).map_err(Error::Io)?);
    }
    let after = activity_of(&rescans.iter().collect::<Vec<_>>(), cfg.guid);
    if after != before {
        let who = after.heartbeat.map(|(_, seq, h)| format!("hostid {h:08x}, heartbeat seq {seq}")).unwrap_or_default();
        return Err(Error::Busy(format!(
            "pool '{}' is imported and alive on another system or process ({host}{who}; txg {} -> {}): \
             its heartbeat moved while we watched; refusing even with -f",
            cfg.name, before.txg, after.txg
        )));
    }
    Ok(())
}
