//! Space and scans on an idle pool: frees come back to FREE (and to space admission)
//! within three txg timeouts although nothing else happens, after which the pool stops
//! syncing; and a scrub's start (or cancel) is on disk when the call returns, so a crash
//! right after it resumes (or keeps canceled) the scrub at the next import.
//!
//! Method: the space tests run the pool on a SimEnv clock that only the test moves, in
//! steps of `STEP_NS`, waiting after each step until no txg is closing or syncing, so
//! `zfs_txg_timeout` keeps its default (5 s) and a test takes well under a second of
//! real time. The scrub test crashes with `Pool::abandon` (the process dies: nothing
//! more is written, what was written stays) right after the call returns, long before
//! the (real-clock) txg timeout could have synced anything.
mod common;
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zilla_core::env::{Env, SimEnv};
use zilla_core::spa::{CreateOptions, Pool, ScrubCmd, TopSpec};
use zilla_core::txg::{TxgPhase, ZFS_TXG_TIMEOUT};
use zilla_core::vdev::Role;

const MIB: u64 = 1 << 20;
/// How far the test moves the clock at a time.
const STEP_NS: u64 = 250_000_000;

/// One 2-way mirror of 64 MiB devices on a simulated clock: about 55 MiB usable, so a
/// second 32 MiB fits only once the first 32 MiB freed are back.
fn sim_pool() -> (Arc<SimEnv>, Arc<Pool>) {
    let env = Arc::new(SimEnv::new(35));
    let devs = mem_devs(&["a", "b"], 64 * MIB);
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }];
    let opts = CreateOptions { env: Some(env.clone()), ..Default::default() };
    let pool = Pool::create_with("tank", tops, opts, devs.opener()).expect("create pool");
    (env, pool)
}

fn free(pool: &Pool) -> u64 {
    pool.list_row().free
}

/// Wait (real time) until no txg of the pool is closing, waiting for the sync thread
/// or syncing: what the clock's last step started has finished.
fn settle(pool: &Pool) {
    std::thread::sleep(Duration::from_millis(10));
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.txg_history(4).iter().any(|r| !matches!(r.state, TxgPhase::Open | TxgPhase::Committed)) {
        assert!(Instant::now() < deadline, "a txg did not finish syncing in 60 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Move the clock forward `ns` in steps, letting the pool sync what each step makes
/// due; returns the virtual ns after which `done()` first held (None: not within `ns`).
fn run_clock(env: &SimEnv, pool: &Pool, ns: u64, done: &dyn Fn() -> bool) -> Option<u64> {
    let start = env.now_ns();
    loop {
        settle(pool);
        let elapsed = env.now_ns() - start;
        if done() {
            return Some(elapsed);
        }
        if elapsed >= ns {
            return None;
        }
        env.advance_ns(STEP_NS);
    }
}

fn timeout_ns() -> u64 {
    ZFS_TXG_TIMEOUT.get() * 1_000_000_000
}

/// The pool stays idle: no txg syncs in `timeouts` txg timeouts.
fn assert_idle(env: &SimEnv, pool: &Pool, timeouts: u64, what: &str) {
    let synced = pool.synced_txg();
    run_clock(env, pool, timeouts * timeout_ns(), &|| false);
    assert_eq!(pool.synced_txg(), synced, "{what}: the pool kept syncing after its frees came back");
}

#[test]
fn an_unmap_reaches_free_and_admission_within_three_txg_timeouts_then_the_pool_idles() {
    let (env, pool) = sim_pool();
    pool.volume_create("vol", 256 * MIB, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let empty = free(&pool);
    v.write(0, &pattern(1, (32 * MIB) as usize), false).unwrap();
    v.flush().unwrap();
    pool.sync().unwrap();
    assert_idle(&env, &pool, 2, "after the write");
    let written = free(&pool);
    assert!(empty - written >= 32 * MIB, "the write took {} bytes", empty - written);

    // TRIM the 32 MiB on an idle pool: FREE must show them within three timeouts
    v.unmap(0, 32 * MIB).unwrap();
    let back = || free(&pool) + MIB >= empty;
    let took = run_clock(&env, &pool, 3 * timeout_ns() + 2 * STEP_NS, &back);
    assert!(
        took.is_some(),
        "FREE {} MiB three txg timeouts after an unmap of 32 MiB on an idle pool (before the write: {} MiB; \
         synced txg {}): the freed space did not come back",
        free(&pool) / MIB,
        empty / MIB,
        pool.synced_txg()
    );
    let synced = pool.synced_txg();
    assert_idle(&env, &pool, 4, "after the unmap");

    // space admission sees the space too: another 32 MiB (which fits only with the
    // freed space) is admitted without waiting for a sync
    let waits = pool.throttle_stats().space_waits;
    v.write(64 * MIB, &pattern(2, (32 * MIB) as usize), false).unwrap();
    v.flush().unwrap();
    assert_eq!(pool.throttle_stats().space_waits, waits, "admission did not see the freed space (synced txg {synced})");
    pool.export().unwrap();
}

#[test]
fn a_volume_destroy_reaches_free_within_three_txg_timeouts_then_the_pool_idles() {
    let (env, pool) = sim_pool();
    let empty = free(&pool);
    pool.volume_create("doomed", 64 * MIB, 16384, &[]).unwrap();
    let v = pool.open_volume("doomed").unwrap();
    v.write(0, &pattern(3, (32 * MIB) as usize), false).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.sync().unwrap();
    assert_idle(&env, &pool, 2, "after the write");
    assert!(empty - free(&pool) >= 32 * MIB);

    pool.volume_destroy("doomed").unwrap();
    let back = || free(&pool) + MIB >= empty;
    let took = run_clock(&env, &pool, 3 * timeout_ns() + 2 * STEP_NS, &back);
    assert!(
        took.is_some(),
        "FREE {} MiB three txg timeouts after destroying a volume of 32 MiB on an idle pool (before it: {} MiB)",
        free(&pool) / MIB,
        empty / MIB
    );
    assert_idle(&env, &pool, 4, "after the destroy");
    pool.export().unwrap();
}

/// A scrub started (and one canceled) is on disk when the call returns: a crash right
/// after it and an import find it resumed (canceled). Both in one test: the pause
/// tunable is process-wide.
#[test]
fn a_scrub_is_resumable_from_the_moment_it_is_acknowledged() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 * MIB);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 12 * MIB, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    v.write(0, &pattern(7, (12 * MIB) as usize), false).unwrap();
    v.flush().unwrap();
    drop(v);
    pool.sync().unwrap();

    // start, crash at once: the scrub resumes after the import
    pool.scrub(ScrubCmd::Start).unwrap();
    pool.abandon();
    drop(pool);
    let pool = import(&devs);
    let s = pool.scan_status();
    assert!(s.func == "scrub" && (s.state == "scanning" || s.state == "finished"), "a scrub acknowledged before the crash is gone: {s:?}");
    pool.scrub_wait().unwrap();
    let s = pool.scan_status();
    assert!(s.state == "finished" && s.errors == 0, "{s:?}");

    // a scrub paused part-way, recorded by a sync; canceled, crash at once: it stays
    // canceled (it does not resume from the bookmark)
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 1).unwrap();
    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 0).unwrap();
    assert_eq!(pool.scan_status().state, "paused");
    pool.sync().unwrap();
    pool.scrub(ScrubCmd::Stop).unwrap();
    pool.abandon();
    drop(pool);
    let pool = import(&devs);
    let s = pool.scan_status();
    assert!(s.func == "scrub" && s.state == "canceled", "a cancel acknowledged before the crash is gone: {s:?}");
    pool.export().unwrap();
}
