//! Offline a mirror child, write while it is away, online it: resilver must copy what
//! it missed, so the other child can then be lost without losing data.
mod common;
use common::*;
use std::sync::Arc;
use zilla_core::spa::Pool;
use zilla_core::vdev::fault::{FaultDevice, MemDevice};
use zilla_core::vdev::label::{self, DATA_START};

const SIZE: u64 = 48 << 20;

fn setup() -> (DevSet, Vec<Arc<FaultDevice>>) {
    let devs = DevSet::default();
    let mut v = vec![];
    for n in ["m0a", "m0b", "m1a", "m1b"] {
        let f = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(SIZE))));
        devs.insert(n, f.clone());
        v.push(f);
    }
    (devs, v)
}

fn check(pool: &Pool, written: &[(u64, Vec<u8>)]) {
    let v = pool.open_volume("vol").unwrap();
    for (off, data) in written {
        let mut b = vec![0u8; data.len()];
        v.read(*off, &mut b).unwrap_or_else(|e| panic!("read at {off}: {e}"));
        assert!(&b == data, "data at {off} differs");
    }
}

/// Destroy m0a's whole data area (every block copy it holds).
fn wreck_m0a(f: &FaultDevice) {
    let end = label::usable_end(SIZE);
    f.corrupt(DATA_START, end - DATA_START, 99).unwrap();
}

fn offline_write_online(export_while_offline: bool) {
    let (devs, f) = setup();
    let mut pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 16 << 20, 16384, &[]).unwrap();
    let mut written = vec![];
    {
        let v = pool.open_volume("vol").unwrap();
        let d = pattern(1, 1 << 20);
        v.write(0, &d, false).unwrap();
        v.flush().unwrap();
        written.push((0u64, d));
    }
    pool.offline("m0b").unwrap();
    assert_eq!(pool.status().state, "DEGRADED");
    {
        let v = pool.open_volume("vol").unwrap();
        for i in 1..6u64 {
            let d = pattern(10 + i, 512 << 10);
            v.write(i * (2 << 20) + 4096, &d, false).unwrap();
            v.flush().unwrap();
            written.push((i * (2 << 20) + 4096, d));
        }
        // overwrite part of the old data too
        let d = pattern(50, 64 << 10);
        v.write(100 << 10, &d, true).unwrap();
        written[0].1[100 << 10..(100 << 10) + d.len()].copy_from_slice(&d);
    }
    if export_while_offline {
        pool.export().unwrap();
        drop(pool);
        pool = import(&devs);
        assert_eq!(pool.status().state, "DEGRADED", "m0b stays offline across export/import");
    }
    // a flush commits the intent log now, not a txg: sync, so the writes made while m0b
    // was away are in the block tree this walk reads (and in the DTL's txgs)
    pool.sync().unwrap();
    {
        let root = pool.debug_volume_root("vol").unwrap();
        let (mut bad, mut total) = (0, 0);
        zilla_core::dmu::walk_all(pool.debug_io(), &root, zilla_core::vdev::IoClass::SyncRead, &mut |bp, _| {
            for d in bp.copies() { if d.vdev == zilla_core::VdevId(0) { total += 1;
                let mut b = vec![0u8; d.asize as usize];
                zilla_core::vdev::Device::read_at(&*f[1], &mut b, DATA_START + d.offset).unwrap();
                if !zilla_core::zio::verify(bp, &b) { bad += 1; } } }
            Ok(())
        }).unwrap();
        assert!(bad > 0, "m0b should be missing some of the {total} block copies on mirror-0");
    }
    pool.online("m0b").unwrap();
    pool.scrub_wait().unwrap();
    let st = pool.status();
    check(&pool, &written);
    assert_eq!(st.state, "ONLINE", "after resilver: {st:?}");
    assert!(st.scan.func == "resilver" && st.scan.state != "scanning", "{:?}", st.scan);
    assert!(st.scan.state == "finished" && st.scan.errors == 0, "{:?}", st.scan);
    check(&pool, &written);
    // now lose m0a's copies: m0b must have everything (export first: cold ARC on import)
    pool.export().unwrap();
    drop(pool);
    wreck_m0a(&f[0]);
    let pool = import(&devs);
    check(&pool, &written);
    assert_eq!(pool.status().data_errors, 0, "known data errors");
    // a scrub repairs m0a from m0b and finds nothing unrecoverable
    pool.scrub(zilla_core::spa::ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    let st = pool.status();
    assert!(st.scan.state == "finished" && st.scan.errors == 0, "{:?}", st.scan);
    assert_eq!(st.state, "ONLINE");
    pool.export().unwrap();
}

#[test]
fn offlined_child_is_resilvered_on_online() {
    offline_write_online(false);
}

#[test]
fn offlined_child_is_resilvered_after_export_import() {
    offline_write_online(true);
}

/// A mirror child whose failed flush lost writes that it still serves to reads (Linux
/// keeps the pages of a failed fdatasync in its page cache, clean: they read back and
/// are never written again; `flush-eio-cached` of the crash test) has those txgs in its
/// DTL. The resilver that the DTL starts must rewrite the child's copy, not read it
/// back, find it good and clear the DTL: the copy is gone at the next power cut, and
/// the engine, believing the child holds everything, lets its sibling be faulted,
/// detached or lost. Crash soak seed 4675065709196258009, boot 1416 ("checksum mismatch
/// on every copy" of a block on a mirror whose child b had failed a flush with the page
/// cache kept, while a refused writes and was faulted). Here the lost write is a block
/// an intent-log commit wrote in place (dmu_sync), whose txg's sync uses it as is.
#[test]
fn a_resilver_rewrites_a_dtl_child_whose_lost_copy_still_reads_back() {
    use zilla_core::spa::TopSpec;
    use zilla_core::vdev::fault::{CrashMode, DeviceFault};
    use zilla_core::vdev::Role;
    zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
    let rig = CrashRig::new(&["a", "b"], 32 << 20);
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }];
    let pool = Pool::create_with("tank", tops, Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("v", 1 << 20, 4096, &[("logbias".to_string(), "throughput".to_string())]).unwrap();
    let v = pool.open_volume("v").unwrap();
    // a first commit starts the volume's log chain (it waits for a sync to record it)
    v.write(0, &pattern(1, 4096), false).unwrap();
    v.flush().unwrap();
    pool.sync().unwrap();
    let dtl_of = |p: &Pool, name: &str| p.debug_leaves().iter().find(|l| l.spec.display() == name).expect("leaf").dtl();
    assert!(dtl_of(&pool, "b").is_empty());
    // b's next flush fails; what it covered is lost but reads back until the cut
    rig.dev("b").arm(DeviceFault::FlushEio { nth: 0, keep_cached: true });
    let data = pattern(2, 4096);
    v.write(8192, &data, false).unwrap();
    // the commit writes the block in place and flushes each child: a holds it, b failed
    v.flush().unwrap();
    assert_eq!(rig.dev("b").fired().flush_eio, 1, "b's flush after the in-place write failed");
    assert!(!dtl_of(&pool, "b").is_empty(), "b's DTL names what its failed flush lost");
    // the sync uses the block as written; its DTL entry on a readable child starts a resilver
    pool.sync().unwrap();
    let start = std::time::Instant::now();
    loop {
        let s = pool.scan_status();
        if s.func == "resilver" && s.state == "finished" {
            break;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "no resilver finished: {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // the resilver's result on disk
    pool.sync().unwrap();
    assert!(dtl_of(&pool, "b").is_empty(), "the resilver repaired b: {:?}", dtl_of(&pool, "b"));
    // b holds everything, the engine says: a power cut, then b alone must serve the data
    let cut = rig.power_cut(CrashMode::DropAll, 1);
    cut.set.devs.lock().remove("a");
    let p = cut.import();
    let mut got = vec![0u8; 4096];
    p.open_volume("v").unwrap().read(8192, &mut got).expect("b's copy of the block the commit wrote reads back after the cut");
    assert!(got == data, "b's copy after the cut is not what was acknowledged");
    p.abandon();
}
