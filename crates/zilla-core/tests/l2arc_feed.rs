//! The L2ARC feed scans the ARC lists' eviction ends (`l2arc_headroom`): blocks reach the
//! cache device while they are still cached in DRAM, not only once evicted. A process of
//! its own: the test changes daemon-wide tunables.
mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::MemDevice;
use zilla_core::vdev::Role;

const MIB: u64 = 1 << 20;
const VOL: u64 = 32 * MIB;

#[test]
fn the_feed_writes_cached_blocks_before_they_are_evicted_and_headroom_0_turns_it_off() {
    zilla_core::arc::ZFS_ARC_MAX.set(512 * MIB).unwrap();
    zilla_core::l2arc::L2ARC_HEADROOM.set(0).unwrap();
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 256 * MIB);
    devs.insert("c0", Arc::new(MemDevice::new(256 * MIB)));
    let mut tops = two_mirrors();
    tops.push(TopSpec { role: Role::Cache, mirror: false, leaves: vec![leaf("c0")] });
    let pool = Pool::create_with("l2f", tops, zilla_core::spa::CreateOptions::default(), devs.opener()).expect("create");
    pool.volume_create("v", VOL, 16384, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    for off in (0..VOL).step_by(MIB as usize) {
        v.write(off, &pattern(off, MIB as usize), false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    let mut b = vec![0u8; MIB as usize];
    for off in (0..VOL).step_by(MIB as usize) {
        v.read(off, &mut b).unwrap();
        assert!(b == pattern(off, MIB as usize));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let arc = pool.arc_stats();
    assert_eq!(arc.evictions, 0, "the volume must fit the ARC for this test: {arc:?}");
    let off = pool.l2_stats().unwrap();
    assert_eq!(off.l2_size, 0, "l2arc_headroom=0: nothing evicted, nothing fed: {off:?}");
    zilla_core::l2arc::L2ARC_HEADROOM.set(8).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let on = pool.l2_stats().unwrap();
    assert_eq!(pool.arc_stats().evictions, 0);
    assert!(on.l2_size >= VOL * 9 / 10, "the feed did not write the cached volume: {on:?}");
    // and the copies are good: a read of each through the cache device
    for off in (0..VOL).step_by(MIB as usize) {
        v.read(off, &mut b).unwrap();
        assert!(b == pattern(off, MIB as usize));
    }
}
