//! fm: fault-management events (zevents), as OpenZFS's fm.c and zfs_fm.c post them.
//!
//! Theory of operation
//! -------------------
//! The engine posts an [`Event`] wherever something an administrator would want to
//! know happens: a scrub or resilver starts or finishes, a copy fails its checksum, a
//! device returns an I/O error, a device changes state. Events carry the class names
//! ZFS uses (`sysevent.fs.zfs.scrub_start`, `ereport.fs.zfs.checksum`,
//! `resource.fs.zfs.statechange`, ...) so scripts and habits written for `zpool events`
//! and zed carry over, and named fields (`vdev_path`, `zio_offset`, `zio_size`, ...).
//!
//! ```text
//!  engine threads ──post──► [ queue: at most zfs_zevent_len_max, oldest dropped ]
//!                                   │ after(eid) / wait_after(eid, timeout)
//!                                   ▼
//!                        the daemon (zed's role): names the pool, logs, keeps
//! ```
//!
//! There is one queue per process, as the kernel has one: a device does not know its
//! pool's name, so an event posted from the vdev layer names the device (its guid and
//! path) and whoever drains the queue names the pool. Every event gets an id (`eid`),
//! increasing; a reader asks for the events after the last id it saw, so two readers
//! never steal each other's events.
//!
//! Bounds: the queue holds at most `zfs_zevent_len_max` events; checksum and I/O error
//! reports are limited to `zfs_checksum_events_per_second` per device (as ZFS's
//! `zfs_checksum_events_per_second` and `zfs_slow_io_events_per_second`), so a scrub
//! over a scribbled disk reports a sample of its bad blocks, not a flood that pushes
//! the scrub's own start out of the queue. The rate table is bounded too.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::kstat::{Applies, Tunable};

pub static ZFS_ZEVENT_LEN_MAX: Tunable =
    Tunable::new("zfs_zevent_len_max", 512, 16, 1 << 16, Applies::Live, "most events the event queue keeps (the oldest are dropped first)");

pub static ZFS_CHECKSUM_EVENTS_PER_SECOND: Tunable = Tunable::new(
    "zfs_checksum_events_per_second",
    20,
    1,
    1 << 20,
    Applies::Live,
    "most checksum and I/O error events posted per second for one device (the errors are all counted)",
);

pub const CLASS_SCRUB_START: &str = "sysevent.fs.zfs.scrub_start";
pub const CLASS_SCRUB_RESUME: &str = "sysevent.fs.zfs.scrub_resume";
pub const CLASS_SCRUB_PAUSED: &str = "sysevent.fs.zfs.scrub_paused";
pub const CLASS_SCRUB_ABORT: &str = "sysevent.fs.zfs.scrub_abort";
pub const CLASS_SCRUB_FINISH: &str = "sysevent.fs.zfs.scrub_finish";
pub const CLASS_RESILVER_START: &str = "sysevent.fs.zfs.resilver_start";
pub const CLASS_RESILVER_FINISH: &str = "sysevent.fs.zfs.resilver_finish";
pub const CLASS_CHECKSUM: &str = "ereport.fs.zfs.checksum";
pub const CLASS_IO: &str = "ereport.fs.zfs.io";
pub const CLASS_STATECHANGE: &str = "resource.fs.zfs.statechange";

/// Most distinct devices the rate limiter tracks; beyond it the table starts over.
const RATE_TABLE_MAX: usize = 4096;

/// One field value, as the nvlist values `zpool events -v` prints.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Value {
    U64(u64),
    Str(String),
}

/// One event. `pool` is empty (and `pool_guid` 0) when the poster did not know it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Event {
    pub eid: u64,
    /// Wall-clock time of the post, ns since the epoch.
    pub time_ns: u64,
    pub class: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub pool_guid: u64,
    #[serde(default)]
    pub vdev_guid: u64,
    #[serde(default)]
    pub vdev_path: String,
    /// Further fields in the order they were added.
    #[serde(default)]
    pub fields: Vec<(String, Value)>,
}

impl Event {
    pub fn new(class: &str) -> Event {
        Event { eid: 0, time_ns: 0, class: class.to_string(), pool: String::new(), pool_guid: 0, vdev_guid: 0, vdev_path: String::new(), fields: Vec::new() }
    }
    pub fn pool(mut self, name: &str) -> Event {
        self.pool = name.to_string();
        self
    }
    pub fn vdev(mut self, guid: crate::Guid, path: &str) -> Event {
        self.vdev_guid = guid.get();
        self.vdev_path = path.to_string();
        self
    }
    pub fn u64(mut self, key: &str, v: u64) -> Event {
        self.fields.push((key.to_string(), Value::U64(v)));
        self
    }
    pub fn str(mut self, key: &str, v: &str) -> Event {
        self.fields.push((key.to_string(), Value::Str(v.to_string())));
        self
    }
    /// An error report or a repair: what the log shows at warn level.
    pub fn is_error(&self) -> bool {
        self.class.starts_with("ereport.") || (self.class == CLASS_STATECHANGE && !matches!(self.field_str("vdev_state"), Some("ONLINE")))
    }
    pub fn field_str(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).and_then(|(_, v)| match v {
            Value::Str(s) => Some(s.as_str()),
            Value::U64(_) => None,
        })
    }
    pub fn field_u64(&self, key: &str) -> Option<u64> {
        self.fields.iter().find(|(k, _)| k == key).and_then(|(_, v)| match v {
            Value::U64(n) => Some(*n),
            Value::Str(_) => None,
        })
    }
}

#[derive(Default)]
struct Queue {
    events: VecDeque<Event>,
    next_eid: u64,
    /// Events dropped from the front to keep the bound.
    dropped: u64,
    /// Per device guid: (second, reports posted in it).
    rate: HashMap<u64, (u64, u64)>,
}

static QUEUE: Mutex<Option<Queue>> = Mutex::new(None);
static POSTED: Condvar = Condvar::new();

/// Wall-clock time of a post, ns since the epoch. The queue is the process's, not a
/// pool's, so its clock is the process's real Env.
fn now_ns() -> u64 {
    crate::env::real().unix_time_ns()
}

impl Queue {
    /// Append `e` with the next id, dropping the oldest events beyond `max`.
    fn push(&mut self, mut e: Event, time_ns: u64, max: usize) -> u64 {
        self.next_eid += 1;
        e.eid = self.next_eid;
        e.time_ns = time_ns;
        while self.events.len() >= max.max(1) {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(e);
        self.next_eid
    }

    /// May device `guid` post another report in `second`, `limit` per second?
    fn admit(&mut self, guid: u64, second: u64, limit: u64) -> bool {
        if self.rate.len() >= RATE_TABLE_MAX && !self.rate.contains_key(&guid) {
            self.rate.clear();
        }
        let slot = self.rate.entry(guid).or_insert((second, 0));
        if slot.0 != second {
            *slot = (second, 0);
        }
        if slot.1 >= limit {
            return false;
        }
        slot.1 += 1;
        true
    }
}

/// Post `e`: it gets the next id and the time now. Returns the id.
pub fn post(e: Event) -> u64 {
    let eid = QUEUE.lock().get_or_insert_with(Queue::default).push(e, now_ns(), ZFS_ZEVENT_LEN_MAX.get() as usize);
    POSTED.notify_all();
    eid
}

/// Post a device's error report unless the device already posted
/// `zfs_checksum_events_per_second` of them this second.
pub fn post_rate_limited(e: Event) -> Option<u64> {
    let second = now_ns() / 1_000_000_000;
    let admitted = QUEUE.lock().get_or_insert_with(Queue::default).admit(e.vdev_guid, second, ZFS_CHECKSUM_EVENTS_PER_SECOND.get());
    admitted.then(|| post(e))
}

/// The events with an id above `eid`, oldest first, and how many were dropped in all.
pub fn after(eid: u64) -> (Vec<Event>, u64) {
    let g = QUEUE.lock();
    match g.as_ref() {
        Some(q) => (q.events.iter().filter(|e| e.eid > eid).cloned().collect(), q.dropped),
        None => (Vec::new(), 0),
    }
}

/// [`after`], waiting up to `timeout` for one to be posted when there is none yet.
pub fn wait_after(eid: u64, timeout: Duration) -> Vec<Event> {
    let env = crate::env::real();
    let deadline_ns = env.now_ns().saturating_add(timeout.as_nanos().min(u64::MAX as u128) as u64);
    let mut g = QUEUE.lock();
    loop {
        if let Some(q) = g.as_ref() {
            if q.next_eid > eid {
                return q.events.iter().filter(|e| e.eid > eid).cloned().collect();
            }
        }
        if crate::env::wait_until(&*env, &POSTED, &mut g, deadline_ns) {
            return Vec::new();
        }
    }
}

/// The id of the newest event posted (0: none yet).
pub fn last_eid() -> u64 {
    QUEUE.lock().as_ref().map_or(0, |q| q.next_eid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queue is shared by the whole test binary: each test looks only at its own
    /// events (its own class or device guid).
    #[test]
    fn events_get_increasing_ids_and_fields_in_order() {
        let first = post(Event::new("test.fm.order").pool("tank").u64("a", 1).str("b", "x"));
        let second = post(Event::new("test.fm.order"));
        assert!(second > first);
        let (got, _) = after(first - 1);
        let mine: Vec<&Event> = got.iter().filter(|e| e.class == "test.fm.order").collect();
        assert_eq!(mine[0].eid, first);
        assert_eq!(mine[0].pool, "tank");
        assert_eq!(mine[0].fields, vec![("a".to_string(), Value::U64(1)), ("b".to_string(), Value::Str("x".into()))]);
        assert_eq!(mine[0].field_u64("a"), Some(1));
        assert_eq!(mine[0].field_str("b"), Some("x"));
        assert!(mine[0].time_ns > 0);
    }

    #[test]
    fn reports_of_one_device_are_rate_limited_per_second() {
        let mut q = Queue::default();
        let admitted = (0..50).filter(|_| q.admit(7, 100, 20)).count();
        assert_eq!(admitted, 20);
        assert!(q.admit(8, 100, 20), "another device has its own budget");
        assert!(q.admit(7, 101, 20), "the next second starts over");
        for g in 0..RATE_TABLE_MAX as u64 + 5 {
            q.admit(1000 + g, 101, 20);
        }
        assert!(q.rate.len() <= RATE_TABLE_MAX, "the rate table is bounded");
    }

    #[test]
    fn the_queue_is_bounded_and_drops_the_oldest() {
        let mut q = Queue::default();
        for i in 0..30u64 {
            q.push(Event::new("test.fm.bound").u64("i", i), i, 16);
        }
        assert_eq!(q.events.len(), 16);
        assert_eq!(q.dropped, 14);
        assert_eq!(q.events.front().unwrap().field_u64("i"), Some(14));
        assert_eq!(q.events.back().unwrap().eid, 30);
        assert_eq!(q.events.back().unwrap().time_ns, 29);
    }

    #[test]
    fn wait_after_returns_what_is_posted_meanwhile_or_nothing_at_the_deadline() {
        let t = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            post(Event::new("test.fm.wait"))
        });
        let seen = last_eid();
        let mut got = Vec::new();
        while !got.iter().any(|e: &Event| e.class == "test.fm.wait") {
            let batch = wait_after(seen, Duration::from_secs(5));
            assert!(!batch.is_empty(), "nothing posted within 5 s");
            got.extend(batch);
        }
        t.join().unwrap();
        let quiet = wait_after(u64::MAX - 1, Duration::from_millis(20));
        assert!(quiet.is_empty());
    }

    #[test]
    fn error_classes_are_warnings() {
        assert!(Event::new(CLASS_CHECKSUM).is_error());
        assert!(Event::new(CLASS_STATECHANGE).str("vdev_state", "OFFLINE").is_error());
        assert!(!Event::new(CLASS_STATECHANGE).str("vdev_state", "ONLINE").is_error());
        assert!(!Event::new(CLASS_SCRUB_START).is_error());
        let e = Event::new(CLASS_IO).pool("p").u64("zio_offset", 4096);
        let back: Event = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back, e);
    }
}
