//! budget: daemon-wide budgets shared fairly by every connection of every front end.
//!
//! Two resources are budgeted this way: bytes of request and reply data in flight
//! (the front ends' memory) and volume calls in flight (blocking-pool threads). Each is
//! a [`SharedBudget`]: one counting semaphore of `total` units, plus a `reserve` that
//! only a holder with nothing in flight may dip into. Every connection takes its share
//! through its own [`BudgetShare`]:
//!
//! ```text
//!   share holds 0 units  --> waits in FIFO order for the units (may use the reserve)
//!   share holds >0 units --> takes more at once only if it stays under `per_share_max`
//!                            AND the pool keeps `reserve` free afterwards;
//!                            otherwise waits until its own units come back
//! ```
//!
//! Small-request lane. First requests wait in FIFO order, so once stalled clients
//! hold the whole pool, a newcomer's 4 KiB write would queue behind their 32 MiB
//! reads until the stall timeout drops them. So a budget may carve out a *lane*:
//! `lane_total` units that only requests of at most `lane_request_max` units use,
//! one at a time per share, taken whenever the main pool cannot serve them at once
//! (a separate FIFO of small requests only). A stalled client holds at most one lane
//! request, so a new client's small requests keep being served unless
//! `lane_total / lane_request_max` stalled clients each hold one.
//!
//! So a connection always gets its minimum (its first request, up to the largest
//! request there is) in the order it asked, a greedy or stalled connection holds at most
//! `per_share_max`, and extra units beyond the first request never eat the reserve the
//! next connection needs. A client that stops reading keeps only what it already holds;
//! its own reader waits on its own share, nobody else's.
//!
//! Units are released when the [`BudgetPermit`] drops (the writer has taken the reply,
//! the volume call returned). Bound: at most `total` units are ever held; one
//! acquisition asks for at most `u32::MAX` units (tokio's semaphore limit).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// One daemon-wide budget (bytes or calls).
pub struct SharedBudget {
    name: &'static str,
    total: usize,
    reserve: usize,
    per_share_max: usize,
    /// `total - lane_total` units.
    pool: Arc<Semaphore>,
    pool_total: usize,
    /// The small-request lane (see the module comment); may be empty.
    lane: Arc<Semaphore>,
    lane_total: usize,
    lane_request_max: usize,
    /// Acquisitions that had to wait, since start.
    waits: AtomicU64,
    /// Shares (connections) currently attached.
    shares: AtomicUsize,
}

/// A point-in-time view of a budget, for /metrics and `zilla` status output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetStats {
    pub name: &'static str,
    pub total: u64,
    pub in_use: u64,
    pub reserve: u64,
    pub per_share_max: u64,
    pub waits: u64,
    pub shares: u64,
}

impl SharedBudget {
    /// A budget of `total` units. `reserve` is clamped below `total`; `per_share_max`
    /// to at least 1 and at most `total`.
    pub fn new(name: &'static str, total: usize, reserve: usize, per_share_max: usize) -> Arc<SharedBudget> {
        SharedBudget::with_lane(name, total, reserve, per_share_max, 0, 0)
    }

    /// As [`SharedBudget::new`], with `lane_total` of the `total` units set aside for
    /// requests of at most `lane_request_max` units (clamped to half of `total`).
    pub fn with_lane(
        name: &'static str,
        total: usize,
        reserve: usize,
        per_share_max: usize,
        lane_total: usize,
        lane_request_max: usize,
    ) -> Arc<SharedBudget> {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        let lane_total = lane_total.min(total / 2);
        let pool_total = total - lane_total;
        Arc::new(SharedBudget {
            name,
            total,
            reserve: reserve.min(pool_total - 1),
            per_share_max: per_share_max.clamp(1, pool_total),
            pool: Arc::new(Semaphore::new(pool_total)),
            pool_total,
            lane: Arc::new(Semaphore::new(lane_total)),
            lane_total,
            lane_request_max: lane_request_max.min(lane_total),
            waits: AtomicU64::new(0),
            shares: AtomicUsize::new(0),
        })
    }

    /// Units one share may hold beyond its first acquisition.
    pub fn per_share_max(&self) -> usize {
        self.per_share_max
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn in_use(&self) -> usize {
        let pool = self.pool_total - self.pool.available_permits().min(self.pool_total);
        pool + self.lane_total - self.lane.available_permits().min(self.lane_total)
    }

    /// Units set aside for small requests.
    pub fn lane_total(&self) -> usize {
        self.lane_total
    }

    pub fn stats(&self) -> BudgetStats {
        BudgetStats {
            name: self.name,
            total: self.total as u64,
            in_use: self.in_use() as u64,
            reserve: self.reserve as u64,
            per_share_max: self.per_share_max as u64,
            waits: self.waits.load(Ordering::Relaxed),
            shares: self.shares.load(Ordering::Relaxed) as u64,
        }
    }

    /// A new share for one connection.
    pub fn share(self: &Arc<SharedBudget>) -> BudgetShare {
        self.shares.fetch_add(1, Ordering::Relaxed);
        BudgetShare {
            state: Arc::new(ShareState {
                budget: self.clone(),
                held: AtomicUsize::new(0),
                lane_held: AtomicBool::new(false),
                released: Notify::new(),
            }),
        }
    }
}

struct ShareState {
    budget: Arc<SharedBudget>,
    /// Units held from the main pool.
    held: AtomicUsize,
    /// Whether a lane permit is held (at most one per share).
    lane_held: AtomicBool,
    released: Notify,
}

impl Drop for ShareState {
    fn drop(&mut self) {
        self.budget.shares.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection's claim on a [`SharedBudget`]. Acquire from one task at a time (the
/// connection's reader); permits may be dropped anywhere.
pub struct BudgetShare {
    state: Arc<ShareState>,
}

/// Units held until dropped.
pub struct BudgetPermit {
    units: usize,
    from_lane: bool,
    state: Arc<ShareState>,
    _permit: OwnedSemaphorePermit,
}

impl BudgetPermit {
    pub fn units(&self) -> usize {
        self.units
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        if self.from_lane {
            self.state.lane_held.store(false, Ordering::Release);
        } else {
            self.state.held.fetch_sub(self.units, Ordering::AcqRel);
        }
        self.state.released.notify_waiters();
    }
}

impl BudgetShare {
    /// Units this share holds now.
    pub fn held(&self) -> usize {
        self.state.held.load(Ordering::Acquire)
    }

    /// Take `units` at once if the fairness rules allow it without waiting: from the
    /// main pool, else (a small request) from the lane.
    pub fn try_acquire(&self, units: usize) -> Option<BudgetPermit> {
        let units = self.clamp_units(units);
        self.try_pool(units).or_else(|| self.try_lane(units))
    }

    fn clamp_units(&self, units: usize) -> usize {
        units.clamp(1, self.state.budget.pool_total.min(u32::MAX as usize))
    }

    fn try_pool(&self, units: usize) -> Option<BudgetPermit> {
        let budget = &self.state.budget;
        let held = self.held();
        if held > 0 {
            let room = budget.pool.available_permits().saturating_sub(budget.reserve);
            if held + units > budget.per_share_max || room < units {
                return None;
            }
        }
        let permit = budget.pool.clone().try_acquire_many_owned(units as u32).ok()?;
        Some(self.granted(units, permit, false))
    }

    /// Whether a request of `units` may use the lane now.
    fn lane_eligible(&self, units: usize) -> bool {
        units <= self.state.budget.lane_request_max && !self.state.lane_held.load(Ordering::Acquire)
    }

    fn try_lane(&self, units: usize) -> Option<BudgetPermit> {
        if !self.lane_eligible(units) {
            return None;
        }
        let permit = self.state.budget.lane.clone().try_acquire_many_owned(units as u32).ok()?;
        Some(self.granted(units, permit, true))
    }

    /// Take `units`, waiting as the rules in the module comment say. Cancel-safe.
    pub async fn acquire(&self, units: usize) -> BudgetPermit {
        let budget = &self.state.budget;
        let units = self.clamp_units(units);
        let mut waited = false;
        loop {
            let released = self.state.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(permit) = self.try_acquire(units) {
                if waited {
                    budget.waits.fetch_add(1, Ordering::Relaxed);
                }
                return permit;
            }
            waited = true;
            let lane_ok = self.lane_eligible(units);
            let lane = budget.lane.clone().acquire_many_owned(units as u32);
            // Nothing of ours in flight: queue for the units in FIFO order. The
            // semaphores are never closed, so the acquisitions cannot fail.
            let first = self.held() == 0;
            let pool = budget.pool.clone().acquire_many_owned(units as u32);
            // Our own release can make room: in the main pool (not first) or the lane
            // (a small request whose lane permit is ours).
            let retry_on_release = !first || units <= budget.lane_request_max;
            let (permit, from_lane) = tokio::select! {
                Ok(permit) = pool, if first => (permit, false),
                Ok(permit) = lane, if lane_ok => (permit, true),
                _ = released.as_mut(), if retry_on_release => continue,
                else => continue,
            };
            budget.waits.fetch_add(1, Ordering::Relaxed);
            return self.granted(units, permit, from_lane);
        }
    }

    fn granted(&self, units: usize, permit: OwnedSemaphorePermit, from_lane: bool) -> BudgetPermit {
        if from_lane {
            self.state.lane_held.store(true, Ordering::Release);
        } else {
            self.state.held.fetch_add(units, Ordering::AcqRel);
        }
        BudgetPermit { units, from_lane, state: self.state.clone(), _permit: permit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn first_acquisition_may_use_the_reserve_later_ones_may_not() {
        let budget = SharedBudget::new("bytes", 100, 40, 80);
        let greedy = budget.share();
        let first = greedy.try_acquire(50).expect("first take is allowed");
        // 50 left, 40 reserved: only 10 more for a share that already holds something.
        assert!(greedy.try_acquire(11).is_none());
        let second = greedy.try_acquire(10).expect("within the unreserved room");
        let newcomer = budget.share();
        let third = newcomer.try_acquire(40).expect("a share holding nothing may use the reserve");
        assert_eq!(budget.in_use(), 100);
        drop((first, second, third));
        assert_eq!(budget.in_use(), 0);
        assert_eq!(budget.stats().shares, 2);
    }

    #[tokio::test]
    async fn per_share_max_holds_even_with_room() {
        let budget = SharedBudget::new("calls", 100, 0, 3);
        let share = budget.share();
        let permits: Vec<_> = (0..3).map(|_| share.try_acquire(1).unwrap()).collect();
        assert!(share.try_acquire(1).is_none());
        // A waiting acquire completes once one of its own units comes back.
        let waiter = async { share.acquire(1).await };
        let release = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(permits);
        };
        let (permit, ()) = tokio::join!(waiter, release);
        assert_eq!(permit.units(), 1);
        assert_eq!(budget.stats().waits, 1);
    }

    #[tokio::test]
    async fn a_stalled_share_cannot_starve_a_new_one() {
        let budget = SharedBudget::new("bytes", 64, 16, 64);
        let stalled = budget.share();
        let mut held = Vec::new();
        while let Some(p) = stalled.try_acquire(8) {
            held.push(p);
        }
        assert_eq!(budget.in_use(), 48, "the reserve stays free");
        let other = budget.share();
        let permit = tokio::time::timeout(Duration::from_secs(1), other.acquire(16)).await;
        assert!(permit.is_ok(), "the new share gets its minimum from the reserve");
    }

    #[tokio::test]
    async fn oversized_requests_are_clamped_not_hung() {
        let budget = SharedBudget::new("bytes", 10, 0, 10);
        let share = budget.share();
        let permit = tokio::time::timeout(Duration::from_secs(1), share.acquire(1000)).await.unwrap();
        assert_eq!(permit.units(), 10);
    }

    #[tokio::test]
    async fn small_requests_pass_stalled_big_ones_through_the_lane() {
        // 100 units, 10 of them a lane for requests of at most 4 units.
        let budget = SharedBudget::with_lane("bytes", 100, 30, 100, 10, 4);
        let stalled: Vec<_> = (0..3).map(|_| budget.share()).collect();
        let held: Vec<_> = stalled.iter().filter_map(|s| s.try_acquire(30)).collect();
        assert_eq!(held.len(), 3, "90 units of the main pool taken");
        // A fourth big first request queues FIFO on the main pool ...
        let queued = budget.share();
        let big = tokio::spawn(async move { queued.acquire(30).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // ... and a newcomer's small requests are still served, one lane permit at a time.
        let newcomer = budget.share();
        let first = tokio::time::timeout(Duration::from_secs(1), newcomer.acquire(4)).await.expect("lane");
        assert!(newcomer.try_acquire(4).is_none(), "one lane permit per share");
        assert!(newcomer.try_acquire(5).is_none(), "too big for the lane");
        let waiter = async { newcomer.acquire(4).await };
        let release = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(first);
        };
        let (second, ()) = tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(waiter, release) })
            .await
            .expect("the second small request gets the lane back");
        assert_eq!(budget.in_use(), 94);
        assert!(!big.is_finished());
        drop((held, second));
        assert_eq!(tokio::time::timeout(Duration::from_secs(1), big).await.unwrap().unwrap().units(), 30);
    }
}
