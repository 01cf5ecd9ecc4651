//! A misdirected write (issue 15's fault model): one write of a mirror child lands at a
//! wrong offset. Two blocks are then bad on that child: the one the write was meant
//! for (its own place keeps old bytes) and the live block it landed on. Neither can be
//! known until read. A scrub must find both, count them as checksum errors on that
//! child and rewrite them, so that afterwards the child alone holds every block.
mod common;
use common::*;
use std::sync::Arc;
use zilla_core::dmu;
use zilla_core::spa::{Pool, ScrubCmd, TopSpec};
use zilla_core::vdev::fault::{CrashDevice, DeviceFault};
use zilla_core::vdev::label::DATA_START;
use zilla_core::vdev::{IoClass, Role};

const DEV_SIZE: u64 = 64 << 20;
const VOLSIZE: u64 = 16 << 20;
const BS: usize = 16384;

fn cksum(pool: &Pool, name: &str) -> u64 {
    pool.status().config.iter().flat_map(|t| t.children.iter()).find(|c| c.name == name).map(|c| c.cksum_errors).unwrap_or(0)
}

#[test]
fn scrub_finds_both_victims_of_a_misdirected_write_and_repairs_them() {
    let devs = DevSet::default();
    let b = Arc::new(CrashDevice::new(DEV_SIZE));
    devs.insert("a", Arc::new(CrashDevice::new(DEV_SIZE)));
    devs.insert("b", b.clone());
    let pool = create(&devs, vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }]);
    pool.volume_create("vol", VOLSIZE, BS as u32, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let old = pattern(1, 1 << 20);
    v.write(0, &old, false).unwrap();
    v.flush().unwrap();
    pool.sync().unwrap();

    // the next write b gets lands on the copy of block 3 instead
    let root = pool.debug_volume_root("vol").unwrap();
    let victim = dmu::lookup(pool.debug_io(), &root, zilla_core::BlockId(3), IoClass::SyncRead).unwrap();
    b.arm(DeviceFault::Misdirect { nth: 0, to: DATA_START + victim.dva[0].offset });
    let new = pattern(2, BS);
    v.write(4 << 20, &new, false).unwrap();
    // synced, not flushed: a flush commits the intent log, and its log block would be
    // the write b misdirects (a block freed once the txg syncs, so one victim only)
    pool.sync().unwrap();
    assert_eq!(b.fired().misdirected, 1, "the misdirect did not fire");

    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    let scan = pool.status().scan;
    assert!(scan.func == "scrub" && scan.state == "finished", "{scan:?}");
    assert_eq!(scan.errors, 0, "a good copy existed for every block: {scan:?}");
    assert!(scan.repaired_bytes >= 2 * BS as u64, "both victims rewritten: {scan:?}");
    assert!(cksum(&pool, "b") >= 2, "the misdirected write's two victims are checksum errors on b");
    assert_eq!(cksum(&pool, "a"), 0);

    // b alone now holds everything
    pool.detach("a").unwrap();
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let only_b = DevSet::default();
    only_b.insert("b", b.clone());
    let pool = import(&only_b);
    let v = pool.open_volume("vol").unwrap();
    let mut got = vec![0u8; old.len()];
    v.read(0, &mut got).expect("read the old data from b alone");
    assert!(got == old, "old data differs on b after the scrub");
    let mut got = vec![0u8; BS];
    v.read(4 << 20, &mut got).expect("read the new block from b alone");
    assert!(got == new, "new block differs on b after the scrub");
}
