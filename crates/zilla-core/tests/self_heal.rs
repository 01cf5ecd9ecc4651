//! Self-heal and scrub: damage one copy of each kind of block on one mirror child and
//! check the pool reads correct data, counts the checksum error and rewrites the bad copy.
mod common;
use common::*;
use std::collections::HashMap;
use std::sync::Arc;
use zilla_core::arc::BlockKey;
use zilla_core::scan::ScanStatus;
use zilla_core::dmu;
use zilla_core::spa::{Pool, ScrubCmd};
use zilla_core::vdev::fault::{FaultDevice, MemDevice};
use zilla_core::vdev::label::{self, DATA_START};
use zilla_core::vdev::{Device, IoClass};
use zilla_core::block::blkptr::{BlockPointer, Dva};
use zilla_core::Error;

const DEV_SIZE: u64 = 64 << 20;
const VOLSIZE: u64 = 16 << 20;
const BS: u64 = 16384;

struct Rig {
    devs: DevSet,
    faults: HashMap<String, Arc<FaultDevice>>,
    /// (offset, data) written to "vol"
    written: Vec<(u64, Vec<u8>)>,
}

impl Rig {
    fn fd(&self, name: &str) -> &Arc<FaultDevice> {
        &self.faults[name]
    }
    fn import(&self) -> Arc<Pool> {
        import(&self.devs)
    }
    /// Every byte written reads back through `pool`.
    fn check_all(&self, pool: &Pool) {
        let v = pool.open_volume("vol").unwrap();
        for (off, data) in &self.written {
            let mut b = vec![0u8; data.len()];
            v.read(*off, &mut b).expect("read");
            assert!(&b == data, "data at {off} differs");
        }
    }
}

/// Two 2-way mirrors of FaultDevice(MemDevice), a 16 MiB volume (16K blocks, one L1
/// indirect) with 2 MiB of known data, synced.
fn setup() -> (Rig, Arc<Pool>) {
    let devs = DevSet::default();
    let mut faults = HashMap::new();
    for n in ["m0a", "m0b", "m1a", "m1b"] {
        let f = Arc::new(FaultDevice::new(Arc::new(MemDevice::new(DEV_SIZE))));
        devs.insert(n, f.clone());
        faults.insert(n.to_string(), f);
    }
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", VOLSIZE, BS as u32, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let mut written = vec![];
    for (i, off) in [0u64, 8 << 20].into_iter().enumerate() {
        let data = pattern(100 + i as u64, 1 << 20);
        v.write(off, &data, false).unwrap();
        written.push((off, data));
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    (Rig { devs, faults, written }, pool)
}

fn root(pool: &Pool) -> dmu::TreeRoot {
    pool.debug_volume_root("vol").unwrap()
}

fn l0(pool: &Pool, blkid: u64) -> BlockPointer {
    let bp = dmu::lookup(pool.debug_io(), &root(pool), zilla_core::BlockId(blkid), IoClass::SyncRead).unwrap();
    assert!(!bp.is_hole());
    bp
}

fn children(pool: &Pool, vdev: zilla_core::VdevId) -> Vec<String> {
    pool.debug_io().top(vdev).unwrap().children().iter().map(|c| c.spec.display()).collect()
}

/// The child the mirror reads first for a block at data offset `off` of top `vdev`
/// (mirror.rs read_order on an idle, non-rotating pool; `last` overrides the queues'
/// last offsets, for a pool not imported yet).
fn first_reader(pool: Option<&Pool>, names: &[String], last: &HashMap<String, u64>, off: u64) -> String {
    let phys = DATA_START + off;
    let loads: Vec<u64> = names
        .iter()
        .map(|n| {
            let l = match pool {
                Some(p) => p.debug_leaves().iter().find(|c| &c.spec.display() == n).unwrap().queue.last_offset(),
                None => last.get(n).copied().unwrap_or(0),
            };
            if l == phys { 0 } else { 1 }
        })
        .collect();
    let min = *loads.iter().min().unwrap();
    let ties: Vec<usize> = (0..names.len()).filter(|&i| loads[i] == min).collect();
    names[ties[((phys >> 21) as usize) % ties.len()]].clone()
}

fn corrupt(rig: &Rig, name: &str, d: &Dva, seed: u64) {
    rig.fd(name).corrupt(DATA_START + d.offset, d.asize as u64, seed).unwrap();
}

fn bytes(rig: &Rig, name: &str, d: &Dva) -> Vec<u8> {
    let mut b = vec![0u8; d.asize as usize];
    rig.fd(name).read_at(&mut b, DATA_START + d.offset).unwrap();
    b
}

fn cksum(pool: &Pool, name: &str) -> u64 {
    pool.status().config.iter().flat_map(|t| t.children.iter()).find(|c| c.name == name).unwrap().cksum_errors
}

/// The copy of `d` on `bad` equals the copy on every other child of its top vdev, and
/// that copy verifies against `bp`.
fn assert_repaired(rig: &Rig, pool: &Pool, bp: &BlockPointer, d: &Dva, bad: &str) {
    let b = bytes(rig, bad, d);
    assert!(zilla_core::zio::verify(bp, &b), "copy on {bad} was not rewritten");
    for other in children(pool, d.vdev) {
        assert_eq!(bytes(rig, &other, d), b, "{other} and {bad} differ");
    }
}

fn other(names: &[String], n: &str) -> String {
    names.iter().find(|x| *x != n).unwrap().clone()
}

fn scrub(pool: &Pool) -> ScanStatus {
    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    pool.status().scan
}

fn assert_scrub_repaired(line: &ScanStatus) {
    assert!(line.func == "scrub" && line.state == "finished", "{line:?}");
    assert!(line.repaired_bytes > 0, "scrub repaired nothing: {line:?}");
    assert_eq!(line.errors, 0, "{line:?}");
}

// ---- data (L0) --------------------------------------------------------------------

#[test]
fn data_block_heals_on_read_after_import() {
    let (rig, pool) = setup();
    pool.abandon();
    drop(pool);
    let pool = rig.import();
    let bp = l0(&pool, 3); // reads the indirect into the ARC
    let d = bp.dva[0];
    let names = children(&pool, d.vdev);
    let bad = first_reader(Some(&pool), &names, &HashMap::new(), d.offset);
    let good = bytes(&rig, &other(&names, &bad), &d);
    corrupt(&rig, &bad, &d, 1);
    assert_ne!(bytes(&rig, &bad, &d), good);
    let before = cksum(&pool, &bad);
    rig.check_all(&pool);
    assert!(cksum(&pool, &bad) > before, "CKSUM of {bad} did not rise");
    assert_repaired(&rig, &pool, &bp, &d, &bad);
    assert_eq!(pool.status().data_errors, 0, "known data errors");

    // live pool: evict the block from the ARC, damage the copy read first, read again
    let bp = l0(&pool, 60);
    let d = bp.dva[0];
    pool.debug_io().forget_cached(&BlockKey { vdev: d.vdev, offset: d.offset, birth: bp.birth });
    let names = children(&pool, d.vdev);
    let bad = first_reader(Some(&pool), &names, &HashMap::new(), d.offset);
    corrupt(&rig, &bad, &d, 2);
    let before = cksum(&pool, &bad);
    let v = pool.open_volume("vol").unwrap();
    let mut b = vec![0u8; BS as usize];
    v.read(60 * BS, &mut b).unwrap();
    assert_eq!(&b[..], &rig.written[0].1[60 * BS as usize..61 * BS as usize]);
    assert!(cksum(&pool, &bad) > before, "CKSUM of {bad} did not rise (live pool)");
    assert_repaired(&rig, &pool, &bp, &d, &bad);
    drop(v);
    pool.export().unwrap();
}

/// `read_async` as a front end calls it: the answer, and whether it came without
/// blocking (`Some`) or asked for the blocking path (`None`).
fn read_async(v: &dyn zilla_core::zvol::BlockVolume, off: u64, len: u64) -> Option<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    v.read_async(off, len, Box::new(move |r| tx.send(r.map(|r| r.map(|ps| ps.iter().flat_map(|p| p.as_slice().to_vec()).collect::<Vec<u8>>()))).unwrap()));
    let r = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("read_async never answered");
    assert!(rx.try_recv().is_err(), "read_async answered twice");
    r.map(|r| r.expect("read_async failed"))
}

#[test]
fn asynchronous_reads_serve_one_missing_block_and_leave_bad_copies_to_the_blocking_path() {
    // Goal: a cache-miss READ answered from the device completion returns the block's
    // bytes and caches it; a read that needs two device blocks, or whose first copy
    // does not verify, is sent to the blocking path, which heals the bad copy; nothing
    // is answered twice. Method: evict blocks, damage the copy read first, compare.
    let (rig, pool) = setup();
    let v = pool.open_volume("vol").unwrap();
    let want = |blk: u64, n: u64| rig.written[0].1[(blk * BS) as usize..((blk + n) * BS) as usize].to_vec();
    let evict = |blk: u64| {
        let bp = l0(&pool, blk);
        let d = bp.dva[0];
        pool.debug_io().forget_cached(&BlockKey { vdev: d.vdev, offset: d.offset, birth: bp.birth });
        bp
    };
    // one block, not cached: served by the device completion, then cached
    let bp = evict(20);
    assert_eq!(read_async(&*v, 20 * BS + 100, 5000), Some(want(20, 1)[100..5100].to_vec()));
    let d = bp.dva[0];
    assert!(pool.debug_io().cached(&BlockKey { vdev: d.vdev, offset: d.offset, birth: bp.birth }, zilla_core::arc::BufKind::Data).is_some(), "the block read was not cached");
    // a cached block and a missing one: one device read
    evict(22);
    assert_eq!(read_async(&*v, 21 * BS, 2 * BS), Some(want(21, 2)));
    // two missing blocks: the blocking path
    evict(24);
    evict(25);
    assert_eq!(read_async(&*v, 24 * BS, 2 * BS), None);
    // a hole reads as zeros without any device read
    assert_eq!(read_async(&*v, 4 << 20, 4096), Some(vec![0u8; 4096]));
    // the copy read first is bad: the blocking path, which heals it
    let bp = evict(30);
    let d = bp.dva[0];
    let names = children(&pool, d.vdev);
    let bad = first_reader(Some(&pool), &names, &HashMap::new(), d.offset);
    corrupt(&rig, &bad, &d, 7);
    let before = cksum(&pool, &bad);
    assert_eq!(read_async(&*v, 30 * BS, BS), None, "a copy that does not verify was served");
    assert!(cksum(&pool, &bad) > before, "the asynchronous try did not count the bad copy on {bad}");
    let mut b = vec![0u8; BS as usize];
    v.read(30 * BS, &mut b).unwrap();
    assert_eq!(b, want(30, 1));
    assert_repaired(&rig, &pool, &bp, &d, &bad);
    // out of range: an error at once
    let (tx, rx) = std::sync::mpsc::channel();
    v.read_async(VOLSIZE - 512, 4096, Box::new(move |r| tx.send(matches!(r, Some(Err(_)))).unwrap()));
    assert!(rx.recv().unwrap(), "a read past the end was not refused");
    drop(v);
    pool.export().unwrap();
}

#[test]
fn data_block_repaired_by_scrub() {
    let (rig, pool) = setup();
    let bp = l0(&pool, 5);
    let d = bp.dva[0];
    let names = children(&pool, d.vdev);
    let bad = names[1].clone();
    corrupt(&rig, &bad, &d, 3);
    let line = scrub(&pool);
    assert_scrub_repaired(&line);
    assert!(cksum(&pool, &bad) >= 1);
    assert_repaired(&rig, &pool, &bp, &d, &bad);
    rig.check_all(&pool);
    pool.export().unwrap();
}

// ---- indirect ---------------------------------------------------------------------

#[test]
fn indirect_block_heals_on_read_after_import() {
    let (rig, pool) = setup();
    pool.abandon();
    drop(pool);
    let pool = rig.import();
    let bp = root(&pool).bp;
    assert_eq!(bp.level, 1);
    assert_eq!(bp.copies().count(), 2, "indirect blocks carry two DVAs");
    let d = bp.dva[0];
    let names = children(&pool, d.vdev);
    let bad = first_reader(Some(&pool), &names, &HashMap::new(), d.offset);
    corrupt(&rig, &bad, &d, 4);
    let before = cksum(&pool, &bad);
    rig.check_all(&pool);
    assert!(cksum(&pool, &bad) > before, "CKSUM of {bad} did not rise");
    assert_repaired(&rig, &pool, &bp, &d, &bad);
    pool.export().unwrap();
}

#[test]
fn indirect_block_repaired_by_scrub() {
    let (rig, pool) = setup();
    let bp = root(&pool).bp;
    let d = bp.dva[0];
    let names = children(&pool, d.vdev);
    let bad = names[0].clone();
    corrupt(&rig, &bad, &d, 5);
    let line = scrub(&pool);
    assert_scrub_repaired(&line);
    assert!(cksum(&pool, &bad) >= 1);
    assert_repaired(&rig, &pool, &bp, &d, &bad);
    pool.export().unwrap();
    let pool = rig.import();
    rig.check_all(&pool);
    pool.export().unwrap();
}

// ---- MOS --------------------------------------------------------------------------

/// Damage the copy of MOS block `which` (0 = index, 1 = first chunk) that import reads
/// first; import must succeed, count the error and rewrite the copy.
fn mos_heal_on_import(which: usize) {
    let (rig, pool) = setup();
    let bps = pool.debug_mos_blocks().unwrap();
    assert!(bps.len() >= 2);
    let tops: Vec<Vec<String>> = (0..2).map(|v| children(&pool, zilla_core::VdevId(v))).collect();
    pool.abandon();
    drop(pool);
    // simulate import's reads up to block `which`: index, then chunks, dva[0] each
    let mut last: HashMap<String, u64> = HashMap::new();
    for bp in &bps[..which] {
        let d = bp.dva[0];
        let r = first_reader(None, &tops[d.vdev.index()], &last, d.offset);
        last.insert(r, DATA_START + d.offset + d.asize as u64);
    }
    let bp = bps[which];
    let d = bp.dva[0];
    let bad = first_reader(None, &tops[d.vdev.index()], &last, d.offset);
    corrupt(&rig, &bad, &d, 6);
    let pool = rig.import();
    assert!(cksum(&pool, &bad) >= 1, "CKSUM of {bad} did not rise");
    assert_repaired(&rig, &pool, &bp, &d, &bad);
    rig.check_all(&pool);
    pool.export().unwrap();
}

#[test]
fn mos_index_heals_on_import() {
    mos_heal_on_import(0);
}

#[test]
fn mos_chunk_heals_on_import() {
    mos_heal_on_import(1);
}

#[test]
fn mos_blocks_repaired_by_scrub() {
    let (rig, pool) = setup();
    let bps = pool.debug_mos_blocks().unwrap();
    let mut damaged = vec![];
    for (i, bp) in bps.iter().enumerate() {
        let d = bp.dva[0];
        let bad = children(&pool, d.vdev)[i % 2].clone();
        corrupt(&rig, &bad, &d, 7 + i as u64);
        damaged.push((*bp, d, bad));
    }
    let line = scrub(&pool);
    // Starting a scrub syncs a txg that records it (the start is durable when the
    // command returns), and that txg replaces the MOS: a damaged block the walk read
    // before the replacement is repaired; one replaced first is freed, not part of any
    // tree the scrub walks, and left as it is. No errors either way.
    assert!(line.state == "finished" && line.errors == 0, "{line:?}");
    let current = pool.debug_mos_blocks().unwrap();
    for (bp, d, bad) in &damaged {
        if current.iter().any(|c| c.dva[0] == *d) {
            assert!(cksum(&pool, bad) >= 1, "CKSUM of {bad} did not rise");
            assert_repaired(&rig, &pool, bp, d, bad);
        }
    }
    pool.export().unwrap();
    let pool = rig.import();
    rig.check_all(&pool);
    pool.export().unwrap();
}

// ---- labels and uberblocks --------------------------------------------------------

fn bad_labels(rig: &Rig, name: &str) -> usize {
    label::scan_labels(&**rig.fd(name)).unwrap().bad_labels
}

#[test]
fn damaged_config_label_imports_and_is_rewritten() {
    let (rig, pool) = setup();
    pool.abandon();
    drop(pool);
    rig.fd("m0a").corrupt(label::label_offset(DEV_SIZE, 0), label::CONFIG_REGION_SIZE as u64, 9).unwrap();
    rig.fd("m1b").corrupt(label::label_offset(DEV_SIZE, 3) + 100, 4096, 10).unwrap();
    assert_eq!(bad_labels(&rig, "m0a"), 1);
    assert_eq!(bad_labels(&rig, "m1b"), 1);
    let pool = rig.import();
    assert_eq!(pool.status().state, "ONLINE");
    rig.check_all(&pool);
    assert_eq!(bad_labels(&rig, "m0a"), 0, "import rewrites labels");
    assert_eq!(bad_labels(&rig, "m1b"), 0);
    pool.export().unwrap();
}

#[test]
fn damaged_config_label_repaired_by_scrub() {
    let (rig, pool) = setup();
    rig.fd("m0b").corrupt(label::label_offset(DEV_SIZE, 1), label::CONFIG_REGION_SIZE as u64, 11).unwrap();
    rig.fd("m1a").corrupt(label::label_offset(DEV_SIZE, 2), 512, 12).unwrap();
    assert_eq!(bad_labels(&rig, "m0b"), 1);
    let line = scrub(&pool);
    assert_scrub_repaired(&line);
    assert_eq!(bad_labels(&rig, "m0b"), 0);
    assert_eq!(bad_labels(&rig, "m1a"), 0);
    pool.export().unwrap();
    let pool = rig.import();
    rig.check_all(&pool);
    pool.export().unwrap();
}

#[test]
fn damaged_uberblock_slot_still_imports_newest_txg() {
    let (rig, pool) = setup();
    let txg = pool.synced_txg();
    pool.abandon();
    drop(pool);
    // the newest uberblock's slot in label 0 of m0a, and in every label of m1a
    rig.fd("m0a").corrupt(label::ub_offset(DEV_SIZE, 0, txg), label::UB_SLOT_SIZE as u64, 13).unwrap();
    for l in 0..label::LABELS {
        rig.fd("m1a").corrupt(label::ub_offset(DEV_SIZE, l, txg) + 64, 64, 14 + l as u64).unwrap();
    }
    let pool = rig.import();
    // the newest valid uberblock is loaded, and m1a, which shows no uberblock of it, is
    // recorded as missing it by one txg synced at import
    assert_eq!(pool.synced_txg().get(), txg.get() + 1, "import must pick the newest valid uberblock");
    rig.check_all(&pool);
    // m1a shows no uberblock of the newest txg: it may have missed that txg, and the
    // import resilvers it first
    pool.scrub_wait().unwrap();
    let line = scrub(&pool);
    assert!(line.state == "finished" && line.errors == 0, "{line:?}");
    pool.export().unwrap();
}

// ---- both copies bad --------------------------------------------------------------

/// The pool of `setup`, reimported with block 9's copy corrupted on every child of its
/// mirror (`seed` picks the garbage).
fn block_9_bad_on_every_copy(seed: u64) -> (Rig, Arc<Pool>) {
    let (rig, pool) = setup();
    pool.abandon();
    drop(pool);
    let pool = rig.import();
    let d = l0(&pool, 9).dva[0];
    for (i, n) in children(&pool, d.vdev).iter().enumerate() {
        corrupt(&rig, n, &d, seed + i as u64);
    }
    (rig, pool)
}

#[test]
fn both_copies_bad_is_an_error_never_wrong_data() {
    let (rig, pool) = block_9_bad_on_every_copy(20);
    let v = pool.open_volume("vol").unwrap();
    let mut b = vec![0u8; 4096];
    let e = v.read(9 * BS + 4096, &mut b).expect_err("reading a block bad on every copy must fail");
    assert!(matches!(e, Error::Checksum(_) | Error::Io(_)), "{e:?}");
    assert_eq!(e.errno(), libc::EIO);
    // a second read fails too (nothing bad was cached)
    assert!(v.read(9 * BS, &mut b).is_err());
    // neighbours are fine
    v.read(8 * BS, &mut b).unwrap();
    assert_eq!(&b[..], &rig.written[0].1[8 * BS as usize..8 * BS as usize + 4096]);
    let line = scrub(&pool);
    assert!(line.func == "scrub" && line.state == "finished", "{line:?}");
    assert!(line.errors != 0, "scrub must report the error: {line:?}");
    let st = pool.status();
    assert!(st.data_errors > 0, "{}", st.data_errors);
    assert!(!st.error_list.is_empty());
    // a partial write over the bad block cannot read-modify-write it: must fail, not
    // silently zero the rest of the block
    let w = v.write(9 * BS + 100, &[7u8; 100], false);
    assert!(w.is_err(), "partial write over an unreadable block must fail");
    // a full-block overwrite replaces it
    let fresh = pattern(77, BS as usize);
    v.write(9 * BS, &fresh, false).unwrap();
    v.flush().unwrap();
    let mut b = vec![0u8; BS as usize];
    v.read(9 * BS, &mut b).unwrap();
    assert_eq!(b, fresh);
    // the bad block is gone: the next scrub finds nothing, and the list says so (as
    // OpenZFS keeps only what the last scrub, and reads since, found)
    pool.sync().unwrap();
    let line = scrub(&pool);
    assert!(line.state == "finished" && line.errors == 0, "{line:?}");
    let st = pool.status();
    assert!(st.data_errors == 0 && st.error_list.is_empty(), "a replaced block still listed: {} {:?}", st.data_errors, st.error_list);
    drop(v);
    pool.export().unwrap();
}

// ---- ditto copies -----------------------------------------------------------------

/// An indirect block has two DVAs on different top-level vdevs. With dva[0] bad on
/// every child of its mirror, reads use dva[1]; a scrub must rewrite dva[0] from the
/// good ditto copy (otherwise one more failure loses the block).
#[test]
fn indirect_ditto_copy_bad_on_whole_mirror_is_repaired_by_scrub() {
    let (rig, pool) = setup();
    let bp = root(&pool).bp;
    let d = bp.dva[0];
    assert_ne!(bp.dva[1].vdev, d.vdev);
    for (i, n) in children(&pool, d.vdev).iter().enumerate() {
        corrupt(&rig, n, &d, 30 + i as u64);
    }
    pool.export().unwrap();
    let pool = rig.import();
    rig.check_all(&pool);
    // the read path already rewrote the bad ditto copy from the good one
    for n in children(&pool, d.vdev) {
        assert!(zilla_core::zio::verify(&bp, &bytes(&rig, &n, &d)), "ditto copy dva[0] on {n} still bad after a read");
    }
    let line = scrub(&pool);
    assert!(line.state == "finished" && line.errors == 0, "{line:?}");
    pool.export().unwrap();
}

#[test]
fn indirect_ditto_copy_bad_on_whole_mirror_is_repaired_by_scrub_alone() {
    let (rig, pool) = setup();
    let bp = root(&pool).bp;
    let d = bp.dva[0];
    assert_ne!(bp.dva[1].vdev, d.vdev);
    for (i, n) in children(&pool, d.vdev).iter().enumerate() {
        corrupt(&rig, n, &d, 30 + i as u64);
    }
    pool.export().unwrap();
    let pool = rig.import();
    // no reads first: the scrub must find and repair it
    let line = scrub(&pool);
    assert_scrub_repaired(&line);
    for n in children(&pool, d.vdev) {
        assert!(zilla_core::zio::verify(&bp, &bytes(&rig, &n, &d)), "ditto copy dva[0] on {n} still bad after scrub ({line:?})");
    }
    rig.check_all(&pool);
    pool.export().unwrap();
}

#[test]
fn a_read_error_met_by_a_cold_read_counts_once_toward_a_fault() {
    // Goal: an I/O error the asynchronous first try of a cold read meets is one error
    // on that child: the blocking retry must not count the same failure again, or a
    // disk is faulted after half the errors (FAULT_AFTER_CONSECUTIVE_ERRORS), and it
    // reads the other child without asking the failing one again (a dying disk may
    // take seconds per read). Method: reads of a few blocks fail on
    // the child each is read from first; read each once as the NBD layer does.
    let (rig, pool) = setup();
    let v = pool.open_volume("vol").unwrap();
    for blk in [40u64, 41, 42, 43] {
        let bp = l0(&pool, blk);
        let d = bp.dva[0];
        pool.debug_io().forget_cached(&BlockKey { vdev: d.vdev, offset: d.offset, birth: bp.birth });
        let names = children(&pool, d.vdev);
        let bad = first_reader(Some(&pool), &names, &HashMap::new(), d.offset);
        rig.fd(&bad).fail_reads_in(DATA_START + d.offset..DATA_START + d.offset + d.asize as u64);
        let read_errors = |n: &str| pool.status().config.iter().flat_map(|t| t.children.iter()).find(|c| c.name == n).unwrap().read_errors;
        let before = read_errors(&bad);
        let asked_before = rig.fd(&bad).counts().read_errors;
        assert_eq!(read_async(&*v, blk * BS, BS), None, "block {blk}: a failed read was served");
        let mut b = vec![0u8; BS as usize];
        v.read(blk * BS, &mut b).unwrap();
        assert_eq!(&b[..], &rig.written[0].1[(blk * BS) as usize..((blk + 1) * BS) as usize]);
        assert_eq!(read_errors(&bad) - before, 1, "block {blk}: one failed read counted {} times on {bad}", read_errors(&bad) - before);
        // the retry reads the good child and does not ask the failing one again
        let asked = rig.fd(&bad).counts().read_errors - asked_before;
        assert_eq!(asked, 1, "block {blk}: the failing child was read {asked} times for one read");
    }
    drop(v);
    pool.export().unwrap();
}

// ---- error list -------------------------------------------------------------------

/// The error list is per block (cffd240): a block bad on every copy, found by a scrub
/// and then read by a client, is one damaged block, listed and counted once.
#[test]
fn a_damaged_block_found_by_scrub_and_by_a_read_is_listed_once() {
    let (_rig, pool) = block_9_bad_on_every_copy(40);
    let line = scrub(&pool);
    assert!(line.state == "finished" && line.errors == 1, "{line:?}");
    let v = pool.open_volume("vol").unwrap();
    let mut b = vec![0u8; 4096];
    assert!(v.read(9 * BS, &mut b).is_err());
    let st = pool.status();
    assert_eq!((st.data_errors, st.error_list.len()), (1, 1), "one damaged block listed twice: {:?}", st.error_list);
    drop(v);
    pool.export().unwrap();
}
