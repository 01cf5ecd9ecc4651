//! env: the engine's clock, sleeps, thread spawns and randomness.
//!
//! Theory of operation
//! -------------------
//! Everything the engine needs from the world besides its devices comes through one
//! [`Env`] it is given at pool create or import (`Arc<dyn Env>`): a monotonic clock
//! (`now_ns`), a wall clock for timestamps written to disk (`unix_time_ns`), sleeps,
//! named thread spawns, and random numbers. Nothing below spa reads `Instant::now`,
//! calls `thread::sleep`, waits on a condvar with a timeout of its own or draws from a
//! global RNG on its own: a test can then swap the world (`tests/tidy.rs` refuses those
//! clock calls in every module of a row below spa's in `LAYERS`; this module is where
//! they live). A hot path that reads the clock per request (the vdev queue) keeps a
//! [`Clock`], a handle that reads the OS clock directly when the Env is the real one.
//! The few waits that are about the operating system rather than the pool (retrying a
//! device claim another process still holds) use [`real`], whatever the pool's Env.
//!
//! ```text
//!                 RealEnv (default)                 SimEnv (tests, the simulator)
//!   now_ns        Instant since process start       virtual clock, starts at 0
//!   unix_time_ns  SystemTime                        fixed epoch + virtual clock
//!   sleep_until   thread::sleep                     clock = max(clock, deadline); returns
//!   timed waits   Condvar::wait_for(left)           poll the caller's condvar in short
//!                                                   real slices until the clock passes
//!   spawn         named std thread                  named std thread (counted)
//!                 (both inherit the spawner's pool: `working_for_pool`)
//!   random_u64    OS-seeded RNG                     one seeded RNG (StdRng)
//! ```
//!
//! SimEnv's clock is a *warp* clock: a sleep never blocks, it moves virtual time forward
//! to its deadline (or leaves it where it is if another thread already moved it further).
//! So concurrent sleepers overlap (each completes at its own deadline, virtual time is the
//! latest of them), and a device that serialises its requests (sim-hdd) does so by its
//! own `busy until` bookkeeping against this clock, not by sleeping. Under SimEnv a pool
//! of sim devices runs as fast as the CPU allows while its clock shows the modelled time.
//!
//! The engine still runs on real threads under SimEnv (txg sync, scan, the I/O workers),
//! so the order in which threads interleave is the OS scheduler's. What is deterministic
//! for a seed is everything one driver thread does and sees: its operations, their
//! results and the bytes read (docs/design.md, "The Env seam").

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

// ------------------------------------------------------------------------------------
// Which pool a thread works for
// ------------------------------------------------------------------------------------

thread_local! {
    static WORKING_FOR_POOL: std::cell::RefCell<Option<Arc<str>>> = const { std::cell::RefCell::new(None) };
}

/// The pool the current thread works for, if one was named: set by the caller around a
/// pool operation ([`WorkingForPool::enter`]) and inherited by every thread started
/// through [`Env::spawn`] meanwhile (a pool's txg, checksum, scan and I/O threads are
/// all started from its import or create, or from one of its own threads). A fail-stop
/// reads it to record which pool it stopped in (the daemon's panic hook).
pub fn working_for_pool() -> Option<Arc<str>> {
    WORKING_FOR_POOL.with(|w| w.borrow().clone())
}

/// While alive, the current thread works for one pool; dropping it restores what was
/// there before.
pub struct WorkingForPool {
    before: Option<Arc<str>>,
}

impl WorkingForPool {
    pub fn enter(pool: &str) -> WorkingForPool {
        let before = WORKING_FOR_POOL.with(|w| w.borrow_mut().replace(Arc::from(pool)));
        WorkingForPool { before }
    }
}

impl Drop for WorkingForPool {
    fn drop(&mut self) {
        let before = self.before.take();
        WORKING_FOR_POOL.with(|w| *w.borrow_mut() = before);
    }
}

/// Start a named std thread that works for the same pool as its spawner.
fn spawn_inheriting_pool(name: String, body: ThreadBody) -> std::io::Result<JoinHandle<()>> {
    let pool = working_for_pool();
    std::thread::Builder::new().name(name).spawn(move || {
        WORKING_FOR_POOL.with(|w| *w.borrow_mut() = pool);
        body()
    })
}

/// A thread body handed to [`Env::spawn`].
pub type ThreadBody = Box<dyn FnOnce() + Send + 'static>;

/// The engine's view of time, threads and randomness. All methods may be called from
/// any thread.
pub trait Env: Send + Sync + 'static {
    /// Monotonic nanoseconds since an arbitrary origin (never goes backwards).
    fn now_ns(&self) -> u64;
    /// Nanoseconds since the Unix epoch, for timestamps stored on disk.
    fn unix_time_ns(&self) -> u64;
    /// Block (or, simulated, advance the clock) until `now_ns() >= deadline_ns`.
    fn sleep_until_ns(&self, deadline_ns: u64);
    /// Start a named thread running `body`.
    fn spawn(&self, name: String, body: ThreadBody) -> std::io::Result<JoinHandle<()>>;
    /// A uniformly random 64-bit number (seeded under simulation).
    fn random_u64(&self) -> u64;
    /// True for a virtual clock: sleeps return at once and timed waits poll.
    fn is_simulated(&self) -> bool;
    /// Threads started through `spawn` so far.
    fn threads_spawned(&self) -> u64;

    /// Sleep for `ns` nanoseconds of this Env's time.
    fn sleep_ns(&self, ns: u64) {
        self.sleep_until_ns(self.now_ns().saturating_add(ns));
    }

    /// The origin of `now_ns` if it is the OS's monotonic clock (`Instant` since this
    /// instant): a [`Clock`] then reads it without a call through the Env. None (the
    /// default) for any other clock.
    fn os_clock_origin(&self) -> Option<Instant> {
        None
    }

    /// This host's id, written into the labels of the pools it imports (import refuses
    /// an active pool of another host id without force). Tests override it to play
    /// another host.
    fn hostid(&self) -> u32 {
        system_hostid()
    }

    /// Memory the system can still give this process without swapping: the smaller of
    /// MemAvailable and what the cgroup's memory limit leaves (None: unknown). The ARC
    /// shrinks when it runs short; tests play a shortage through a simulated Env.
    fn memory_available_bytes(&self) -> Option<u64> {
        system_memory_available_bytes()
    }
}

/// See [`Env::memory_available_bytes`]: /proc/meminfo's MemAvailable, and, under a
/// cgroup v2 memory limit, memory.max − memory.current of this process's cgroup plus
/// its inactive file pages (page cache the kernel reclaims first: the pool's device
/// files fill it, and it must not read as a shortage).
pub fn system_memory_available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let avail = meminfo.as_deref().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    let cgroup = (|| {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        // cgroup v2: one line "0::/path"
        let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
        let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        let max: u64 = std::fs::read_to_string(dir.join("memory.max")).ok()?.trim().parse().ok()?; // "max": no limit
        let current: u64 = std::fs::read_to_string(dir.join("memory.current")).ok()?.trim().parse().ok()?;
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let inactive_file: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("inactive_file "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Some(max.saturating_sub(current.saturating_sub(inactive_file)))
    })();
    match (avail, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// The host id, read once: `/etc/hostid` (4 bytes, host order, as glibc `gethostid`
/// and OpenZFS read it) when present and non-zero; else derived from `/etc/machine-id`
/// (its first 8 hex digits); else from the kernel host name (FNV-1a). Never 0.
pub fn system_hostid() -> u32 {
    static HOSTID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *HOSTID.get_or_init(|| {
        let from_file = std::fs::read("/etc/hostid").ok().filter(|b| b.len() >= 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        let from_machine_id = || {
            let s = std::fs::read_to_string("/etc/machine-id").ok()?;
            u32::from_str_radix(s.trim().get(..8)?, 16).ok()
        };
        let from_hostname = || {
            let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            name.trim().bytes().fold(0x811c9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x01000193))
        };
        from_file.filter(|&h| h != 0).or_else(|| from_machine_id().filter(|&h| h != 0)).unwrap_or_else(from_hostname).max(1)
    })
}

/// The kernel's host name (shown in "pool is active on host ..." errors).
pub fn system_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

impl fmt::Debug for dyn Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_simulated() { "SimEnv" } else { "RealEnv" };
        write!(f, "{kind}(now_ns={})", self.now_ns())
    }
}

/// Largest real time a simulated timed wait blocks before it re-reads the virtual clock.
const SIM_POLL: Duration = Duration::from_millis(2);

/// Wait on `cv` (releasing `guard`) until notified or until this Env's clock reaches
/// `deadline_ns`. Returns true if the deadline has passed. Spurious returns happen (as
/// with any condvar): callers re-check their condition in a loop.
pub fn wait_until<T>(env: &dyn Env, cv: &Condvar, guard: &mut MutexGuard<'_, T>, deadline_ns: u64) -> bool {
    let now = env.now_ns();
    if now >= deadline_ns {
        return true;
    }
    let left = Duration::from_nanos(deadline_ns - now);
    if env.is_simulated() {
        // Virtual time moves only when some thread sleeps; look again shortly.
        cv.wait_for(guard, left.min(SIM_POLL));
    } else {
        cv.wait_for(guard, left);
    }
    env.now_ns() >= deadline_ns
}

/// [`wait_until`] `ns` from now on this Env's clock: a bounded wait for a caller that
/// re-checks its condition in a loop (a poll that also wakes on a notify).
pub fn wait_ns<T>(env: &dyn Env, cv: &Condvar, guard: &mut MutexGuard<'_, T>, ns: u64) -> bool {
    wait_until(env, cv, guard, env.now_ns().saturating_add(ns))
}

/// An Env's monotonic clock for a hot path (a timestamp per I/O): made once from the
/// Env, it reads the OS clock directly when the Env is the real one (the same value
/// `now_ns` gives, without the call through the Env) and asks the Env otherwise. No
/// lock, no allocation per read.
#[derive(Clone)]
pub struct Clock(ClockSource);

#[derive(Clone)]
enum ClockSource {
    /// `Instant` since this origin (RealEnv's `now_ns`).
    Os(Instant),
    Env(Arc<dyn Env>),
}

impl Clock {
    pub fn of(env: &Arc<dyn Env>) -> Clock {
        match env.os_clock_origin() {
            Some(origin) => Clock(ClockSource::Os(origin)),
            None => Clock(ClockSource::Env(env.clone())),
        }
    }

    /// The Env's `now_ns`.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match &self.0 {
            ClockSource::Os(origin) => origin.elapsed().as_nanos() as u64,
            ClockSource::Env(env) => env.now_ns(),
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            ClockSource::Os(_) => write!(f, "Clock(os, now_ns={})", self.now_ns()),
            ClockSource::Env(env) => write!(f, "Clock({env:?})"),
        }
    }
}

/// The process-wide real Env, shared by every pool that was not given another one.
pub fn real() -> Arc<dyn Env> {
    static REAL: OnceLock<Arc<RealEnv>> = OnceLock::new();
    REAL.get_or_init(|| Arc::new(RealEnv::new())).clone()
}

// ------------------------------------------------------------------------------------
// RealEnv
// ------------------------------------------------------------------------------------

/// The operating system's clock, threads and randomness.
#[derive(Debug)]
pub struct RealEnv {
    origin: Instant,
    threads_spawned: AtomicU64,
}

impl Default for RealEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl RealEnv {
    pub fn new() -> RealEnv {
        RealEnv { origin: Instant::now(), threads_spawned: AtomicU64::new(0) }
    }
}

impl Env for RealEnv {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn unix_time_ns(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    }

    fn sleep_until_ns(&self, deadline_ns: u64) {
        let now = self.now_ns();
        if deadline_ns > now {
            std::thread::sleep(Duration::from_nanos(deadline_ns - now));
        }
    }

    fn spawn(&self, name: String, body: ThreadBody) -> std::io::Result<JoinHandle<()>> {
        let h = spawn_inheriting_pool(name, body)?;
        self.threads_spawned.fetch_add(1, Ordering::Relaxed);
        Ok(h)
    }

    fn random_u64(&self) -> u64 {
        rand::random()
    }

    fn is_simulated(&self) -> bool {
        false
    }

    fn threads_spawned(&self) -> u64 {
        self.threads_spawned.load(Ordering::Relaxed)
    }

    fn os_clock_origin(&self) -> Option<Instant> {
        Some(self.origin)
    }
}

// ------------------------------------------------------------------------------------
// SimEnv
// ------------------------------------------------------------------------------------

/// Unix time the virtual clock's zero corresponds to (2008-11-10, the day Fishworks
/// shipped; any fixed value keeps on-disk timestamps reproducible).
pub const SIM_EPOCH_UNIX_NS: u64 = 1_226_275_200_000_000_000;

/// A virtual clock (see "warp clock" above) and one seeded RNG.
#[derive(Debug)]
pub struct SimEnv {
    seed: u64,
    clock_ns: AtomicU64,
    rng: Mutex<StdRng>,
    threads_spawned: AtomicU64,
    /// What `memory_available_bytes` answers (u64::MAX: unknown).
    memory_available: AtomicU64,
}

impl SimEnv {
    pub fn new(seed: u64) -> SimEnv {
        SimEnv {
            seed,
            clock_ns: AtomicU64::new(0),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            threads_spawned: AtomicU64::new(0),
            memory_available: AtomicU64::new(u64::MAX),
        }
    }

    /// Play the system's available memory (None: unknown, the default).
    pub fn set_memory_available_bytes(&self, bytes: Option<u64>) {
        self.memory_available.store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Move the clock forward by `ns` (a driver's think time).
    pub fn advance_ns(&self, ns: u64) {
        self.clock_ns.fetch_add(ns, Ordering::AcqRel);
    }
}

impl Env for SimEnv {
    fn now_ns(&self) -> u64 {
        self.clock_ns.load(Ordering::Acquire)
    }

    fn unix_time_ns(&self) -> u64 {
        SIM_EPOCH_UNIX_NS + self.now_ns()
    }

    fn sleep_until_ns(&self, deadline_ns: u64) {
        self.clock_ns.fetch_max(deadline_ns, Ordering::AcqRel);
    }

    fn spawn(&self, name: String, body: ThreadBody) -> std::io::Result<JoinHandle<()>> {
        let h = spawn_inheriting_pool(name, body)?;
        self.threads_spawned.fetch_add(1, Ordering::Relaxed);
        Ok(h)
    }

    fn random_u64(&self) -> u64 {
        self.rng.lock().next_u64()
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn threads_spawned(&self) -> u64 {
        self.threads_spawned.load(Ordering::Relaxed)
    }

    fn memory_available_bytes(&self) -> Option<u64> {
        Some(self.memory_available.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_sleeps_move_the_clock_not_the_thread() {
        // Goal: an hour of simulated sleeping takes no real time; the clock is the
        // latest deadline any sleeper asked for and never goes backwards.
        let env = SimEnv::new(1);
        let t = Instant::now();
        env.sleep_ns(3_600_000_000_000);
        assert_eq!(env.now_ns(), 3_600_000_000_000);
        env.sleep_until_ns(5);
        assert_eq!(env.now_ns(), 3_600_000_000_000, "an earlier deadline leaves the clock alone");
        env.advance_ns(10);
        assert_eq!(env.now_ns(), 3_600_000_000_010);
        assert_eq!(env.unix_time_ns(), SIM_EPOCH_UNIX_NS + 3_600_000_000_010);
        assert!(t.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn sim_rng_is_seeded() {
        let draw = |seed| {
            let e = SimEnv::new(seed);
            (0..4).map(|_| e.random_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn timed_wait_follows_the_env_clock() {
        // Goal: a timed wait under SimEnv ends when virtual time passes its deadline
        // (moved by another thread's sleep), not after real time.
        let env = Arc::new(SimEnv::new(3));
        let cv = Condvar::new();
        let mu = Mutex::new(());
        let e2 = env.clone();
        let mover = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            e2.sleep_ns(5_000_000_000);
        });
        let mut g = mu.lock();
        let t = Instant::now();
        while !wait_until(&*env, &cv, &mut g, 5_000_000_000) {}
        mover.join().unwrap();
        assert!(env.now_ns() >= 5_000_000_000);
        assert!(t.elapsed() < Duration::from_secs(2));
        // RealEnv: the deadline is real time.
        let real = RealEnv::new();
        let t = Instant::now();
        let d = real.now_ns() + 30_000_000;
        while !wait_until(&real, &cv, &mut g, d) {}
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_clock_reads_its_envs_time() {
        // Goal: a Clock gives its Env's now_ns: the OS clock read directly for
        // RealEnv (same origin), the Env's own for any other.
        let real: Arc<dyn Env> = Arc::new(RealEnv::new());
        let clock = Clock::of(&real);
        assert!(matches!(clock.0, ClockSource::Os(_)));
        let (before, read, after) = (real.now_ns(), clock.now_ns(), real.now_ns());
        assert!(before <= read && read <= after, "{before} {read} {after}");
        let sim = Arc::new(SimEnv::new(5));
        let clock = Clock::of(&(sim.clone() as Arc<dyn Env>));
        assert!(matches!(clock.0, ClockSource::Env(_)));
        sim.advance_ns(7);
        sim.sleep_ns(3);
        assert_eq!(clock.now_ns(), 10);
    }

    #[test]
    fn spawn_names_and_counts_threads() {
        for env in [real(), Arc::new(SimEnv::new(1)) as Arc<dyn Env>] {
            let before = env.threads_spawned();
            let h = env
                .spawn("env_test".into(), Box::new(|| assert_eq!(std::thread::current().name(), Some("env_test"))))
                .unwrap();
            h.join().unwrap();
            assert_eq!(env.threads_spawned(), before + 1);
        }
    }

    #[test]
    fn spawned_threads_work_for_the_spawners_pool() {
        // its own env: the spawn counter of `real()` is another test's
        let env: Arc<dyn Env> = Arc::new(RealEnv::new());
        assert_eq!(working_for_pool(), None);
        {
            let _w = WorkingForPool::enter("tank");
            let e2 = env.clone();
            let h = env.spawn("env_pool".into(), Box::new(move || {
                assert_eq!(working_for_pool().as_deref(), Some("tank"));
                // and its own children too
                e2.spawn("env_pool2".into(), Box::new(|| assert_eq!(working_for_pool().as_deref(), Some("tank")))).unwrap().join().unwrap();
            }));
            h.unwrap().join().unwrap();
            let _inner = WorkingForPool::enter("other");
            assert_eq!(working_for_pool().as_deref(), Some("other"));
        }
        assert_eq!(working_for_pool(), None);
        env.spawn("env_none".into(), Box::new(|| assert_eq!(working_for_pool(), None))).unwrap().join().unwrap();
    }
}
