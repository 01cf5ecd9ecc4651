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

/// The tests of this file run one at a time: the first sets `zfs_scan_pause_every_spans`,
/// a process-wide tunable, and a resilver of the other running meanwhile paused after
/// its first span and never finished ("cannot offline a: it is the only device holding
/// txgs 7-8", CI 2026-11-26).
static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

#[test]
fn the_only_holder_of_some_txgs_stays_online_through_write_errors() {
    let _one = ONE_AT_A_TIME.lock();
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

/// Zero every uberblock slot newer than `txg` in all four labels (what `import -F` and
/// the power-cut test's rewind check do to reach an older txg).
fn drop_uberblocks_after(img: &mut [u8], txg: u64) {
    use zilla_core::vdev::label;
    let size = img.len() as u64;
    for l in 0..label::LABELS {
        for slot in 0..label::UB_SLOTS {
            let off = label::ub_offset(size, l, zilla_core::Txg(slot)) as usize;
            if label::Uberblock::decode(&img[off..off + label::UB_SLOT_SIZE], off as u64).is_some_and(|u| u.txg.get() > txg) {
                img[off..off + label::UB_SLOT_SIZE].fill(0);
            }
        }
    }
}

/// Found by the power-cut test (seed 3589508303476425221, boot 866): b was offline
/// while the volume's block was written and then rewritten, so the resilver after b
/// came back copied only the new block; a was then offlined. A rewind to the txg
/// before the rewrite loads a MOS in which b still lacks those txgs, but the labels
/// (newest config) say a is offline: a, the only device holding them, must be opened
/// anyway, or the rewound volume does not read back.
#[test]
fn a_rewind_reads_from_a_device_offlined_after_that_txg() {
    let _one = ONE_AT_A_TIME.lock();
    use zilla_core::vdev::fault::CrashMode;
    const DEV: u64 = 64 << 20;
    let rig = CrashRig::new(&["a", "b"], DEV);
    let pool = create(&rig.set, vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }]);
    pool.volume_create("vol", 1 << 20, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    v.write(0, &pattern(1, 65536), false).unwrap();
    pool.sync().unwrap();
    pool.offline("b").unwrap();
    let y = pattern(2, 65536);
    v.write(0, &y, false).unwrap();
    pool.sync().unwrap();
    let rewind_txg = pool.synced_txg().get();
    v.write(0, &pattern(3, 65536), false).unwrap();
    pool.sync().unwrap();
    pool.online("b").unwrap();
    assert_eq!(leaf_state(&pool, "b"), "ONLINE");
    // a txg syncing while b came back adds to its DTL after the resilver began, and a
    // second resilver follows: wait until the MOS records b complete
    let mut offlined = Err(zilla_core::Error::invalid("not tried"));
    for _ in 0..10 {
        pool.scrub_wait().unwrap();
        pool.sync().unwrap();
        offlined = pool.offline("a");
        if offlined.is_ok() {
            break;
        }
    }
    offlined.expect("a can go offline: b holds every live block");
    drop(v);
    pool.export().unwrap();
    drop(pool);

    let after = rig.power_cut(CrashMode::DropAll, 0);
    let rewound = CrashRig::new(&[], 0);
    for (n, d) in &after.devs {
        let mut img = d.power_cut(CrashMode::DropAll, 0);
        drop_uberblocks_after(&mut img, rewind_txg);
        rewound.set.insert(n, Arc::new(zilla_core::vdev::fault::CrashDevice::from_image(img)));
    }
    zilla_core::tunables().set("zil_replay_disable", 1).unwrap();
    let pool = zilla_core::spa::Pool::import_with(&rewound.set.specs(), rewound.set.opener()).expect("rewound import");
    zilla_core::tunables().set("zil_replay_disable", 0).unwrap();
    // the rewound txg is loaded; a device whose ring now lacks it is recorded stale by
    // one txg synced at import (the contents below tell the two txgs apart)
    let synced = pool.synced_txg().get();
    assert!(synced == rewind_txg || synced == rewind_txg + 1, "the import did not load the rewound txg: synced {synced}, rewound {rewind_txg}");
    let v = pool.open_volume("vol").unwrap();
    let mut got = vec![0u8; 65536];
    v.read(0, &mut got).expect("the rewound volume reads back");
    assert!(got == y, "the rewound volume does not hold that txg's data");
    assert_eq!(leaf_state(&pool, "a"), "ONLINE", "a was not brought online for the rewind");
}
