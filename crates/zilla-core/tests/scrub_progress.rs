//! Scrub progress is counted against the allocated bytes (what `pool list` shows as
//! ALLOC), each block once however many mirror children hold it, so a finished scrub
//! is at (about) 100 % on a single disk and on a 3-way mirror alike, and the total is
//! ALLOC, not ALLOC times the children.
mod common;
use common::*;
use zilla_core::spa::{ScrubCmd, TopSpec};
use zilla_core::vdev::Role;

fn finished_scrub_percent(names: &[&str], mirror: bool) -> f64 {
    let devs = mem_devs(names, 64 << 20);
    let tops = vec![TopSpec { role: Role::Normal, mirror, leaves: names.iter().map(|n| leaf(n)).collect() }];
    let pool = create(&devs, tops);
    pool.volume_create("vol", 16 << 20, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    v.write(0, &pattern(5, 16 << 20), false).unwrap();
    v.flush().unwrap();
    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    let s = pool.scan_status();
    assert_eq!(s.state, "finished", "{s:?}");
    assert!(s.to_examine_bytes > 0, "{s:?}");
    // the total is the allocated bytes: the 16 MiB volume and some metadata
    assert!(s.to_examine_bytes >= 16 << 20 && s.to_examine_bytes < 20 << 20, "{} children: total {s:?}", names.len());
    assert_eq!(s.issued_bytes, s.examined_bytes, "a finished scrub issued what it scanned: {s:?}");
    s.issued_bytes as f64 * 100.0 / s.to_examine_bytes as f64
}

#[test]
fn single_disk_and_three_way_mirror_both_reach_100_percent() {
    for (names, mirror) in [(&["d0"][..], false), (&["m0", "m1"][..], true), (&["t0", "t1", "t2"][..], true)] {
        let pct = finished_scrub_percent(names, mirror);
        eprintln!("{} children: {pct:.2} %", names.len());
        // metadata blocks outside the volume trees are allocated but not walked
        assert!((90.0..=100.0).contains(&pct), "{} children: scrub finished at {pct:.1} %", names.len());
    }
}
