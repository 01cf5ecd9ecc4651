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
//! So a connection always gets its minimum (its first request, up to the largest
//! request there is) in the order it asked, a greedy or stalled connection holds at most
//! `per_share_max`, and extra units beyond the first request never eat the reserve the
//! next connection needs. A client that stops reading keeps only what it already holds;
//! its own reader waits on its own share, nobody else's.
//!
//! Units are released when the [`BudgetPermit`] drops (the writer has taken the reply,
//! the volume call returned). Bound: at most `total` units are ever held; one
//! acquisition asks for at most `u32::MAX` units (tokio's semaphore limit).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// One daemon-wide budget (bytes or calls).
pub struct SharedBudget {
    name: &'static str,
    total: usize,
    reserve: usize,
    per_share_max: usize,
    pool: Arc<Semaphore>,
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
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(SharedBudget {
            name,
            total,
            reserve: reserve.min(total - 1),
            per_share_max: per_share_max.clamp(1, total),
            pool: Arc::new(Semaphore::new(total)),
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
        self.total - self.pool.available_permits().min(self.total)
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
            state: Arc::new(ShareState { budget: self.clone(), held: AtomicUsize::new(0), released: Notify::new() }),
        }
    }
}

struct ShareState {
    budget: Arc<SharedBudget>,
    held: AtomicUsize,
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
        self.state.held.fetch_sub(self.units, Ordering::AcqRel);
        self.state.released.notify_waiters();
    }
}

impl BudgetShare {
    /// Units this share holds now.
    pub fn held(&self) -> usize {
        self.state.held.load(Ordering::Acquire)
    }

    /// Take `units` at once if the fairness rules allow it without waiting.
    pub fn try_acquire(&self, units: usize) -> Option<BudgetPermit> {
        let budget = &self.state.budget;
        let units = units.clamp(1, budget.total.min(u32::MAX as usize));
        let held = self.held();
        if held > 0 {
            let room = budget.pool.available_permits().saturating_sub(budget.reserve);
            if held + units > budget.per_share_max || room < units {
                return None;
            }
        }
        let permit = budget.pool.clone().try_acquire_many_owned(units as u32).ok()?;
        Some(self.granted(units, permit))
    }

    /// Take `units`, waiting as the rules in the module comment say. Cancel-safe.
    pub async fn acquire(&self, units: usize) -> BudgetPermit {
        let budget = &self.state.budget;
        let units = units.clamp(1, budget.total.min(u32::MAX as usize));
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
            if self.held() == 0 {
                // Nothing of ours in flight: queue for the units in FIFO order. The
                // semaphore is never closed, so this cannot fail.
                if let Ok(permit) = budget.pool.clone().acquire_many_owned(units as u32).await {
                    budget.waits.fetch_add(1, Ordering::Relaxed);
                    return self.granted(units, permit);
                }
                continue;
            }
            released.await;
        }
    }

    fn granted(&self, units: usize, permit: OwnedSemaphorePermit) -> BudgetPermit {
        self.state.held.fetch_add(units, Ordering::AcqRel);
        BudgetPermit { units, state: self.state.clone(), _permit: permit }
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
}
