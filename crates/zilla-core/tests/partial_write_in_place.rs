//! A partial write to a committed block takes the ARC's buffer and changes it in place
//! when nobody else holds it (OpenZFS's arc_release on dirtying a dbuf), and copies it
//! when a reader does: a reply holding a slice of the old block (a zero-copy READ on
//! its way to the client) must still see the old bytes, and the cache must never serve
//! changed bytes under the old block's key.
mod common;
use common::*;

const BS: usize = 16384;

#[test]
fn a_partial_write_changes_an_unshared_cached_block_in_place_and_copies_a_shared_one() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 96 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("v", 8 << 20, BS as u32, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    let old = pattern(1, 4 * BS);
    v.write(0, &old, false).unwrap();
    v.flush().unwrap();
    pool.sync().unwrap();
    // cache the four committed blocks
    let mut b = vec![0u8; 4 * BS];
    v.read(0, &mut b).unwrap();
    assert_eq!(b, old);
    let cached = pool.arc_stats().data_size;
    assert!(cached >= 4 * BS as u64, "the four blocks are cached ({cached})");

    // a reader holds block 1's buffer (a zero-copy reply not yet on the wire)
    let held = v.try_read_cached_shared(BS as u64, BS as u64).expect("cached").unwrap();
    assert_eq!(held.iter().map(|s| s.as_slice().len()).sum::<usize>(), BS);

    // partial writes to block 0 (unshared) and block 1 (shared)
    let patch = pattern(2, 4096);
    v.write(100, &patch, false).unwrap();
    v.write(BS as u64 + 100, &patch, false).unwrap();

    // the reader's bytes did not change
    let seen: Vec<u8> = held.iter().flat_map(|s| s.as_slice().to_vec()).collect();
    assert_eq!(seen, old[BS..2 * BS], "a reply's slice of the old block changed under it");
    drop(held);
    // block 0 left the cache (its buffer became the dirty version), block 1 stayed
    let after = pool.arc_stats().data_size;
    assert_eq!(after, cached - BS as u64, "exactly the unshared block's buffer left the ARC");

    // both read back new, before and after the sync, and the untouched blocks old
    let mut want = old.clone();
    want[100..100 + 4096].copy_from_slice(&patch);
    want[BS + 100..BS + 100 + 4096].copy_from_slice(&patch);
    v.read(0, &mut b).unwrap();
    assert_eq!(b, want);
    v.flush().unwrap();
    pool.sync().unwrap();
    v.read(0, &mut b).unwrap();
    assert_eq!(b, want);
    // and from the devices, with the cache dropped
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let v = pool.open_volume("v").unwrap();
    v.read(0, &mut b).unwrap();
    assert_eq!(b, want, "the devices hold the changed blocks");
}
