//! A child that is the only one holding some txgs is never faulted (found by the
//! power-cut test, seed 1936005523615235176): a single disk gets a mirror partner
//! attached, and before the resilver has copied everything the old disk starts failing
//! its writes. Faulting it "because a sibling is online" made every block the new
//! partner had not received yet unreadable. Its own binary: the resilver is held
//! part-way with a process-wide tunable.
mod common;

use std::sync::Arc;

use common::*;
use zilla_core::spa::{ScrubCmd, TopSpec};
use zilla_core::vdev::fault::{FaultDevice, MemDevice};
use zilla_core::vdev::Role;

const SIZE: u64 = 64 << 20;
const VOL: u64 = 12 << 20;

fn leaf_state(pool: &zilla_core::spa::Pool, name: &str) -> String {
    let st = pool.status();
    let l = st.config.iter().flat_map(|t| std::iter::once(t).chain(t.children.iter())).find(|l| l.name == name).cloned().unwrap();
    l.state
}

#[test]
fn the_only_holder_of_some_txgs_stays_online_through_write_errors() {
    let devs = DevSet::default();
    let mut f = Vec::new();
    for n in ["a", "b"] {
        let d = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(SIZE))));
        devs.insert(n, d.clone());
        f.push(d);
    }
    let pool = create(&devs, vec![TopSpec { role: Role::Normal, mirror: false, leaves: vec![leaf("a")] }]);
    // three L1 spans of 4K blocks: the resilver below stops after the first
    pool.volume_create("vol", VOL, 4096, &[]).unwrap();
    let old = pattern(1, VOL as usize);
    {
        let v = pool.open_volume("vol").unwrap();
        v.write(0, &old, false).unwrap();
        v.flush().unwrap();
    }
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 1).unwrap();
    pool.attach("a", &leaf("b"), false).unwrap();
    pool.scrub_wait().unwrap();
    assert_eq!(pool.scan_status().state, "paused", "{:?}", pool.scan_status());

    // a fails every write from now on; b takes them, so flushes are acknowledged
    f[0].fail_writes(true);
    let mut new = Vec::new();
    {
        let v = pool.open_volume("vol").unwrap();
        for i in 0..24u64 {
            let d = pattern(100 + i, 4096);
            let off = i * 4096;
            v.write(off, &d, false).unwrap();
            v.flush().unwrap();
            new.push((off, d));
        }
    }
    assert!(f[0].counts().write_errors >= 10, "a's writes did not fail: {:?}", f[0].counts());
    assert_ne!(leaf_state(&pool, "a"), "FAULTED", "a holds the only copy of most blocks and was faulted");

    // after an export and import (cold ARC) every block reads back: the old ones from
    // a, the new ones from b
    pool.export().unwrap();
    drop(pool);
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 0).unwrap();
    let pool = import(&devs);
    assert_ne!(leaf_state(&pool, "a"), "FAULTED", "a is faulted after the import");
    let mut want = old.clone();
    for (off, d) in &new {
        want[*off as usize..*off as usize + d.len()].copy_from_slice(d);
    }
    let v = pool.open_volume("vol").unwrap();
    let mut got = vec![0u8; VOL as usize];
    v.read(0, &mut got).expect("read after import");
    assert!(got == want, "data differs after import");
    drop(v);

    // the resilver finishes from a's copies and b then holds everything
    pool.scrub(ScrubCmd::Start).ok();
    pool.scrub_wait().unwrap();
    f[0].fail_writes(false);
    pool.export().unwrap();
}
