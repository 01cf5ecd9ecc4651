//! A mirror child that dies (every I/O fails) is faulted, the pool stays writable and
//! DEGRADED, and after `clear` the child is resilvered with what it missed.
mod common;
use std::sync::Arc;

use common::*;
use zilla_core::vdev::fault::{FaultDevice, MemDevice};
use zilla_core::vdev::Device;

#[test]
fn dead_child_is_faulted_then_resilvered_after_clear() {
    let devs = DevSet::default();
    let mut faults = Vec::new();
    for n in ["m0a", "m0b", "m1a", "m1b"] {
        let f = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(64 << 20))));
        faults.push((n, f.clone()));
        devs.insert(n, f);
    }
    let dev = |name: &str| faults.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 16 << 20, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let first = pattern(1, 8 << 20);
    v.write(0, &first, false).unwrap();
    v.flush().unwrap();

    // m0b dies
    dev("m0b").offline(true);
    let second = pattern(2, 8 << 20);
    v.write(8 << 20, &second, false).unwrap();
    v.flush().expect("a mirror with one dead child still commits");
    // (a flush commits the intent log; the txg sync is what this test is about)
    pool.sync().expect("a mirror with one dead child still syncs");
    let st = pool.status();
    assert_eq!(st.state, "DEGRADED", "{st:?}");
    let m0b = &st.config[0].children[1];
    assert_eq!(m0b.state, "FAULTED", "{m0b:?}");
    assert!(m0b.write_errors > 0);

    // it comes back; clear brings it online and resilvers the txgs it missed
    dev("m0b").offline(false);
    pool.clear(None).unwrap();
    pool.scrub_wait().unwrap();
    let st = pool.status();
    assert_eq!(st.state, "ONLINE", "{st:?}");
    assert!(st.scan.func == "resilver" && st.scan.state != "scanning", "{:?}", st.scan);

    // prove m0b holds everything: wreck m0a's data area and read through a fresh import
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let a = dev("m0a");
    let size = a.size();
    a.corrupt(1 << 20, size - (2 << 20), 99).unwrap();
    let pool = import(&devs);
    let v = pool.open_volume("vol").unwrap();
    let mut back = vec![0u8; 8 << 20];
    v.read(0, &mut back).unwrap();
    assert!(back == first, "first half");
    v.read(8 << 20, &mut back).unwrap();
    assert!(back == second, "second half (written while m0b was dead) must have been resilvered");
    pool.export().unwrap();
}
