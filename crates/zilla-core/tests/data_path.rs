//! The data path's copies, held to what docs/design.md ("Data path") draws: a whole
//! block a front end received goes from its receive buffer to the devices by reference
//! (the dirty set, the intent log and the txg sync's vectored write share that buffer),
//! and a buffer shared that way is never changed under a reader, a log record or a
//! write in flight.
//!
//! Method: devices that record the address of every buffer they are asked to write; a
//! write of `WriteData` pieces (pseudo-random bytes no compressor shrinks) cut at block boundaries; the pool synced; the addresses
//! compared. A build that copies the block anywhere on the way (into a run buffer, into
//! a new block) writes from another address and fails.

mod common;

use std::sync::Arc;

use parking_lot::Mutex;
use zilla_core::spa::{CreateOptions, Pool, TopSpec};
use zilla_core::vdev::abd::AlignedBuf;
use zilla_core::vdev::fault::MemDevice;
use zilla_core::vdev::{Device, DeviceKind, Role};
use zilla_core::zvol::WriteData;

const BS: usize = 16 << 10;

/// A memory device that records the address of each buffer a write gives it.
struct Recording {
    inner: MemDevice,
    written_from: Mutex<Vec<usize>>,
}

impl Device for Recording {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.written_from.lock().push(buf.as_ptr() as usize);
        self.inner.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let mut at = offset;
        for b in bufs {
            self.written_from.lock().push(b.as_ptr() as usize);
            self.inner.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn rotational(&self) -> bool {
        false
    }
    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
}

fn pool_of_recorders() -> (Arc<Pool>, Vec<Arc<Recording>>) {
    let devs = common::DevSet::default();
    let mut recs = Vec::new();
    for n in ["a", "b"] {
        let r = Arc::new(Recording { inner: MemDevice::new(256 << 20), written_from: Mutex::new(Vec::new()) });
        devs.insert(n, r.clone());
        recs.push(r);
    }
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![common::leaf("a"), common::leaf("b")] }];
    let pool = Pool::create_with("tank", tops, CreateOptions::default(), devs.opener()).expect("create pool");
    (pool, recs)
}

#[test]
fn a_whole_block_goes_from_its_receive_buffer_to_the_devices_without_a_copy() {
    let (pool, recs) = pool_of_recorders();
    pool.volume_create("v", 8 << 20, BS as u32, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    // three whole blocks and a partial one, cut as a front end cuts what it receives
    let offset = 5 * BS as u64;
    let bytes = common::pattern(7, 3 * BS + 512);
    let cut: Vec<usize> = WriteData::cut(offset, bytes.len() as u64, BS as u64).collect();
    assert_eq!(cut, vec![BS, BS, BS, 512]);
    let mut pieces = Vec::new();
    let mut at = 0;
    for n in cut {
        pieces.push(Arc::new(AlignedBuf::copy_of(&bytes[at..at + n])));
        at += n;
    }
    let whole: Vec<usize> = pieces[..3].iter().map(|p| p.as_ptr() as usize).collect();
    v.write_data(offset, &WriteData::from_pieces(pieces), false).unwrap();
    pool.sync().unwrap();
    for (i, r) in recs.iter().enumerate() {
        let seen = r.written_from.lock().clone();
        for (b, addr) in whole.iter().enumerate() {
            assert!(seen.contains(addr), "device {i}: block {b} was copied on its way (not written from its receive buffer)");
        }
    }
    let mut back = vec![0u8; bytes.len()];
    v.read(offset, &mut back).unwrap();
    assert!(back == bytes, "the blocks read back as written");
    pool.export().unwrap();
}

#[test]
fn a_buffer_shared_by_reference_never_changes_under_its_readers() {
    // Goal: the block a front end handed over is shared with the dirty set, a reader's
    // zero-copy reply, an intent-log record and the sync's write; a later partial write
    // of that block makes a new version and leaves every sharer's bytes as they were.
    let (pool, _recs) = pool_of_recorders();
    pool.volume_create("v", 8 << 20, BS as u32, &[("sync".into(), "always".into())]).unwrap();
    let v = pool.open_volume("v").unwrap();
    let first = common::pattern(11, BS);
    let piece = Arc::new(AlignedBuf::copy_of(&first));
    // sync=always: the write is logged (its record refers to the block) and committed
    v.write_data(0, &WriteData::from_pieces(vec![piece.clone()]), false).unwrap();
    let reader = v.try_read_cached_shared(0, BS as u64).expect("in memory").unwrap();
    assert_eq!(reader.len(), 1);
    // a partial write of the same block, before and after a sync
    v.write(100, &[0xAB; 300], false).unwrap();
    assert_eq!(reader[0].as_slice(), &first[..], "a reader's reply changed under it");
    assert_eq!(piece.as_slice(), &first[..], "the received buffer changed under its sender");
    pool.sync().unwrap();
    v.write(9000, &[0xCD; 77], false).unwrap();
    assert_eq!(reader[0].as_slice(), &first[..], "a reader's reply changed after the sync");
    assert_eq!(piece.as_slice(), &first[..]);
    let mut back = vec![0u8; BS];
    v.read(0, &mut back).unwrap();
    let mut expect = first.clone();
    expect[100..400].fill(0xAB);
    expect[9000..9077].fill(0xCD);
    assert!(back == expect, "the volume holds both partial writes over the first");
    pool.export().unwrap();
}

#[test]
fn a_payload_cut_adds_up_to_its_length_at_any_offset() {
    // Goal: the front end reads exactly the payload's bytes off the wire whatever offset
    // a client sends (an overflowing one included: the volume refuses it afterwards),
    // cuts at block boundaries, and never finer than a slab slot.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..2000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bs = [512u64, 4096, 16384, 131072][(i % 4) as usize];
        let offset = if i % 10 == 0 { u64::MAX - (x % 100_000) } else { x % (1 << 40) };
        let len = x % (3 << 20);
        let cut: Vec<usize> = WriteData::cut(offset, len, bs).collect();
        assert_eq!(cut.iter().sum::<usize>() as u64, len, "offset {offset} len {len} bs {bs}");
        let step = bs.max(4096);
        let mut at = offset;
        for (k, &n) in cut.iter().enumerate() {
            assert!(n > 0 && n as u64 <= step);
            let end = at.wrapping_add(n as u64);
            if k + 1 < cut.len() {
                assert_eq!(end % step, 0, "a piece ends at a block boundary");
            }
            at = end;
        }
    }
}
