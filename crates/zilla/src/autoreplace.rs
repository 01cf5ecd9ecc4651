//! autoreplace: the daemon's side of the `autoreplace` pool property.
//!
//! Theory of operation
//! -------------------
//! zpool documents `autoreplace=on` as: a new device found in the physical location of
//! a device that belonged to the pool is formatted and replaces it, with no `zpool
//! replace`. On Linux, zed does this on a udev "disk added" event. Zilla's devices are
//! paths (files, block devices), so a task looks instead: every
//! [`AUTOREPLACE_INTERVAL`] it runs the engine's pass (`Pool::autoreplace_pass`) on each
//! pool that has the property on. The pass decides (a blank device at an unusable
//! device's path replaces it in place; the pool's own device back at its path is
//! reopened; anything else is refused and not written); this task makes the outcome
//! durable and visible as an admin command would be: the cache file is rewritten, an
//! event posted (`sysevent.fs.zfs.vdev_attach` / `vdev_online`), a history record
//! written (`zilla pool replace POOL PATH (autoreplace)`), the replacement finished
//! when its resilver ends, and the log says what happened. A refusal is logged once
//! per device and reason, not every pass.
//!
//! The pass runs under the daemon's admin lock, so it never races an admin command.
//! The daemon is seen through [`Host`] (this module is below it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use zilla_core::spa::AutoreplaceOutcome;
use zilla_core::spa_history::HistoryRecord;

use zilla_core::spa::Pool;

/// What the task needs of the daemon.
pub trait Host: Send + Sync + 'static {
    /// The imported pools.
    fn pools(&self) -> Vec<(String, Arc<Pool>)>;
    /// The lock every configuration change holds.
    fn admin_lock(&self) -> &tokio::sync::Mutex<()>;
    /// After a device change of `pool` (the admin lock held): the cache file rewritten
    /// (an error logged), the replacement finished once its resilver ends.
    fn device_changed(self: Arc<Self>, pool: String, p: Arc<Pool>) -> impl std::future::Future<Output = ()> + Send;
}

/// How often the pools with `autoreplace=on` are looked at.
pub const AUTOREPLACE_INTERVAL: Duration = Duration::from_secs(5);

/// Run [`pass`] every [`AUTOREPLACE_INTERVAL`] until `stop`.
pub async fn run<H: Host>(d: Arc<H>, mut stop: watch::Receiver<bool>) {
    let mut refused: HashMap<(String, String), String> = HashMap::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(AUTOREPLACE_INTERVAL) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        pass(&d, &mut refused).await;
    }
}

/// One pass over every pool with `autoreplace=on`. `refused`: the last refusal logged
/// per (pool, device), so each is logged once until it changes.
pub async fn pass<H: Host>(d: &Arc<H>, refused: &mut HashMap<(String, String), String>) {
    for (name, pool) in d.pools() {
        if !pool.autoreplace() {
            refused.retain(|(p, _), _| *p != name);
            continue;
        }
        let admin = d.admin_lock().lock().await;
        let p = pool.clone();
        let Ok(outcomes) = tokio::task::spawn_blocking(move || p.autoreplace_pass()).await else { continue };
        let shown = crate::clip::clip(&name);
        let mut changed = false;
        for (dev, outcome) in outcomes {
            let key = (name.clone(), dev.clone());
            match outcome {
                AutoreplaceOutcome::Refused(why) => {
                    if refused.get(&key) != Some(&why) {
                        tracing::warn!(pool = %shown, device = %crate::clip::clip(&dev), "autoreplace: not replacing: {why}");
                        refused.insert(key, why);
                    }
                }
                AutoreplaceOutcome::Replaced => {
                    refused.remove(&key);
                    changed = true;
                    tracing::info!(pool = %shown, device = %crate::clip::clip(&dev), "autoreplace: a new device at the path of an unusable device replaces it; resilvering");
                    crate::events::post_admin("sysevent.fs.zfs.vdev_attach", &name, Some(&dev), Some(&dev));
                    record(&pool, format!("zilla pool replace {name} {dev} (autoreplace)"));
                }
                AutoreplaceOutcome::Onlined => {
                    refused.remove(&key);
                    changed = true;
                    tracing::info!(pool = %shown, device = %crate::clip::clip(&dev), "autoreplace: the pool's device is back at its path; reopened");
                    crate::events::post_admin("sysevent.fs.zfs.vdev_online", &name, Some(&dev), None);
                    record(&pool, format!("zilla pool online {name} {dev} (autoreplace)"));
                }
            }
        }
        if changed {
            d.clone().device_changed(name.clone(), pool.clone()).await;
            drop(admin);
            let p = pool.clone();
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || p.sync()).await {
                tracing::warn!("pool '{shown}': the history record of an autoreplace is not on disk yet: {e}");
            }
        }
    }
}

/// Record what autoreplace did in the pool's history, as the daemon itself did it.
fn record(pool: &zilla_core::spa::Pool, cmd: String) {
    let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    pool.log_history(HistoryRecord { time, cmd, who: Some(0), user: "autoreplace".into(), host: zilla_core::env::system_hostname(), client: "local".into() }, false);
}
