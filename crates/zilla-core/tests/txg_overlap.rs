//! txg overlap in a real pool: while one txg syncs, a dirty-data kick closes the next
//! one, so open, quiesced and syncing txgs are active at once; and what was written
//! through all of it reads back after export and import.
mod common;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zilla_core::vdev::fault::MemDevice;
use zilla_core::vdev::{Device, Role};
use zilla_core::spa::TopSpec;

/// A memory device whose flush takes a while, so a sync lasts long enough to overlap.
struct SlowFlush(MemDevice);

impl Device for SlowFlush {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        std::thread::sleep(Duration::from_millis(15));
        self.0.flush()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn rotational(&self) -> bool {
        false
    }
    fn kind(&self) -> zilla_core::vdev::DeviceKind {
        zilla_core::vdev::DeviceKind::Test("slow-flush")
    }
}

#[test]
fn three_txgs_active_under_write_load() {
    // kick at 20 % of 4 MiB: a txg closes every ~800 KiB of dirty data
    zilla_core::tunables().set("zfs_dirty_data_max", 4 << 20).unwrap();
    let devs = DevSet::default();
    for n in ["a", "b"] {
        devs.insert(n, Arc::new(SlowFlush(MemDevice::new(256 << 20))));
    }
    let pool = create(&devs, vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] }]);
    pool.volume_create("vol", 64 << 20, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let done = AtomicBool::new(false);
    let mut seen_three = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..2048u64 {
                v.write((i % 4096) * 16384, &pattern(i, 16384), false).unwrap();
            }
            done.store(true, Ordering::Release);
        });
        while !done.load(Ordering::Acquire) {
            let (open, quiesced, syncing) = pool.debug_txg_states();
            if quiesced != 0 && syncing != 0 {
                assert!(syncing < quiesced && quiesced < open, "out of order: {open} {quiesced} {syncing}");
                seen_three += 1;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    assert!(seen_three > 0, "never saw open, quiesced and syncing txgs at once");
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let v = pool.open_volume("vol").unwrap();
    let mut b = vec![0u8; 16384];
    for i in 2048 - 64..2048u64 {
        v.read((i % 4096) * 16384, &mut b).unwrap();
        assert_eq!(b, pattern(i, 16384), "block {i}");
    }
    pool.export().unwrap();
}
