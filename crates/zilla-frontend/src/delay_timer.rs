//! delay_timer: precise asynchronous sleeps for the write throttle's delays.
//!
//! Theory of operation
//! -------------------
//! The write throttle delays each write by tens to hundreds of microseconds when dirty
//! data passes `zfs_delay_min_dirty_percent` (dsl_pool's delay curve; 80 us at the
//! throttle bench's operating point). A front end on the async runtime must not sleep
//! a thread per write (a blocking-pool hand-off and a nanosleep per write cost the
//! txg sync the CPU it needed), and tokio's own timer wheel rounds every sleep up to
//! the next millisecond, which would turn an 80 us delay into up to 1 ms.
//!
//! So one thread, `throttle-timer`, keeps the pending wakeups in a min-heap, sleeps
//! until the earliest (a condvar timed wait), and wakes every waiter due within
//! `SLACK` of it at once: OpenZFS's `zfs_delay_resolution_ns` (100 us), the slack it
//! gives the kernel timer of each delayed tx. The throttle spaces delayed writes
//! (each wakeup after the previous one), so a new wakeup is nearly always the latest
//! and is pushed without waking the thread; only a wakeup earlier than the head does.
//!
//! Bounds: the heap holds one entry per waiting [`Delay`] poll, and every delayed
//! write holds a request permit and memory budget of its connection, so the entries
//! are bounded by the front ends' in-flight request limits. A dropped `Delay` leaves
//! its entry until its deadline, when waking it is a no-op.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Waiters due within this of the earliest are woken together (zfs_delay_resolution_ns).
pub const SLACK: Duration = Duration::from_micros(100);

/// A future that completes at `deadline` (or up to [`SLACK`] before it).
pub struct Delay {
    deadline: Instant,
    fired: Option<Arc<AtomicBool>>,
}

/// Wait `d` on the throttle timer.
pub fn sleep(d: Duration) -> Delay {
    Delay { deadline: Instant::now() + d, fired: None }
}

impl Future for Delay {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(fired) = &self.fired {
            if fired.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
        }
        if Instant::now() + SLACK >= self.deadline {
            return Poll::Ready(());
        }
        let fired = Arc::new(AtomicBool::new(false));
        timer().push(Entry { deadline: self.deadline, fired: fired.clone(), waker: cx.waker().clone() });
        self.fired = Some(fired);
        Poll::Pending
    }
}

struct Entry {
    deadline: Instant,
    fired: Arc<AtomicBool>,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed: the heap's top is the earliest deadline.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        other.deadline.cmp(&self.deadline)
    }
}

struct Timer {
    heap: Mutex<BinaryHeap<Entry>>,
    cv: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer { heap: Mutex::new(BinaryHeap::new()), cv: Condvar::new() }));
        std::thread::Builder::new()
            .name("throttle-timer".into())
            .spawn(move || t.run())
            .expect("spawn the throttle timer thread");
        t
    })
}

impl Timer {
    fn push(&self, entry: Entry) {
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = heap.peek().is_none_or(|head| entry.deadline < head.deadline);
        heap.push(entry);
        drop(heap);
        if earliest {
            self.cv.notify_one();
        }
    }

    fn run(&self) -> ! {
        let mut due = Vec::new();
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            while heap.peek().is_some_and(|head| head.deadline <= now + SLACK) {
                due.push(heap.pop().expect("peeked"));
            }
            if !due.is_empty() {
                drop(heap);
                for entry in due.drain(..) {
                    entry.fired.store(true, Ordering::Release);
                    entry.waker.wake();
                }
                heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            heap = match heap.peek().map(|head| head.deadline) {
                None => self.cv.wait(heap).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let wait = deadline.saturating_duration_since(now);
                    self.cv.wait_timeout(heap, wait).unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delays_end_at_their_deadline_within_the_slack() {
        // Goal: each sleep lasts at least its length minus the slack, and not much
        // more (the scheduler's jitter on a loaded box, bounded generously here).
        for us in [50u64, 200, 1_000, 3_000] {
            let d = Duration::from_micros(us);
            let t = Instant::now();
            sleep(d).await;
            let took = t.elapsed();
            assert!(took + SLACK >= d, "{us} us sleep ended after {took:?}");
            assert!(took < d + Duration::from_millis(50), "{us} us sleep took {took:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_sleeps_wake_in_deadline_order() {
        // Goal: an earlier sleep pushed after later ones still ends first (the timer
        // is woken for a new head), and every sleep ends.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, ms) in [30u64, 20, 10, 5].into_iter().enumerate() {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                sleep(Duration::from_millis(ms)).await;
                order.lock().unwrap().push(i);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![3, 2, 1, 0]);
    }
}
