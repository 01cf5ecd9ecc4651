//! The broken-invariant policy, engine side (docs/design.md "Broken invariants"): a
//! failed assertion in a txg sync writes nothing more. The sync thread turns the panic
//! into a suspended pool whose waiters get an error; the on-disk state stays at the last
//! synced txg, and an import after the failure finds every synced write. (The daemon
//! goes further and stops the process at the assertion: tests/system/65_broken_invariant.sh.)
//! Its own test binary: it sets a process-wide tunable that would trip other tests.
mod common;
use common::*;

#[test]
fn failed_sync_assertion_suspends_the_pool_and_import_recovers() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 8 << 20, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let synced = pattern(1, 1 << 20);
    v.write(0, &synced, false).unwrap();
    v.flush().unwrap();

    zilla_core::tunables().set("zfs_debug_fail_sync_assertion", 1).unwrap();
    v.write(1 << 20, &pattern(2, 1 << 20), false).unwrap();
    // a flush commits the intent log and syncs no txg: start the sync that fails
    assert!(pool.sync().is_err(), "a sync that failed an assertion must not succeed");
    let r = v.flush();
    assert!(r.is_err(), "a flush whose sync failed an assertion must not succeed");
    assert_eq!(pool.status().state, "SUSPENDED", "{:?}", pool.status().state);
    assert!(v.write(0, &pattern(3, 4096), true).is_err(), "a suspended pool takes no more synchronous writes");
    zilla_core::tunables().set("zfs_debug_fail_sync_assertion", 0).unwrap();
    drop(v);
    pool.abandon();
    drop(pool);

    let pool = import(&devs);
    let v = pool.open_volume("vol").unwrap();
    let mut back = vec![0u8; 1 << 20];
    v.read(0, &mut back).unwrap();
    assert!(back == synced, "data synced before the failed assertion must survive");
}
