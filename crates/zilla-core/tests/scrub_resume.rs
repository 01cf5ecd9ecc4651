//! A scrub paused part-way survives export and import and resumes from its bookmark.
mod common;
use common::*;
use zilla_core::scan::ScanStatus;
use zilla_core::spa::ScrubCmd;

fn scan_status(pool: &zilla_core::spa::Pool) -> ScanStatus {
    pool.scan_status()
}

#[test]
fn scrub_pauses_and_resumes_across_export() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 << 20);
    let pool = create(&devs, two_mirrors());
    // 3 L1 spans of 4K blocks
    pool.volume_create("vol", 12 << 20, 4096, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    v.write(0, &pattern(7, 12 << 20), false).unwrap();
    v.flush().unwrap();
    drop(v);

    // pause after the first span
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 1).unwrap();
    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    let s = scan_status(&pool);
    assert_eq!(s.state, "paused", "{s:?}");
    assert_eq!(s.bookmark.blkid, zilla_core::BlockId(1024), "{s:?}");
    let examined_first = s.examined_bytes;
    assert!(examined_first > 0);
    let sc = pool.status().scan;
    assert!(sc.func == "scrub" && sc.state == "paused", "{sc:?}");

    pool.export().unwrap();
    drop(pool);
    zilla_core::tunables().set("zfs_scan_pause_every_spans", 0).unwrap();
    let pool = import(&devs);
    let s = scan_status(&pool);
    assert_eq!(s.state, "paused", "paused state must survive export: {s:?}");
    assert_eq!(s.bookmark.blkid, zilla_core::BlockId(1024));

    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    let s = scan_status(&pool);
    assert_eq!(s.state, "finished", "{s:?}");
    assert_eq!(s.errors, 0);
    // resumed, not restarted: the volume's 12 MiB of data were scanned and issued once
    // (each block once, however many mirror children hold it), plus metadata
    let data_bytes = 12u64 << 20;
    for (what, n) in [("scanned", s.examined_bytes), ("issued", s.issued_bytes)] {
        assert!(n >= data_bytes, "{what}: {s:?}");
        assert!(n < data_bytes + data_bytes / 3, "scrub restarted instead of resuming ({what}): {s:?}");
    }
    let sc = pool.status().scan;
    assert!(sc.func == "scrub" && sc.state == "finished" && sc.repaired_bytes == 0, "{sc:?}");
    pool.export().unwrap();
}
