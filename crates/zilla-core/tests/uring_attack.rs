//! Attacks on the io_uring engine and the asynchronous cold-read path with real file
//! leaves (the engine runs only for plain descriptors: a FaultDevice never gets it):
//! bad copies under cold reads, and admin operations (offline, detach, export) while
//! many asynchronous reads are in flight.
mod common;
use common::pattern;

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zilla_core::arc::BlockKey;
use zilla_core::block::blkptr::BlockPointer;
use zilla_core::dmu;
use zilla_core::spa::{CreateOptions, Pool, TopSpec};
use zilla_core::vdev::label::DATA_START;
use zilla_core::vdev::queue::EngineKind;
use zilla_core::vdev::{IoClass, LeafSpec, Role};
use zilla_core::zvol::BlockVolume;

const DEV_SIZE: u64 = 96 << 20;
const VOLSIZE: u64 = 32 << 20;
const BS: u64 = 16384;
const DATA: usize = 8 << 20;

struct Files {
    _dir: tempfile::TempDir,
    paths: Vec<PathBuf>,
}

/// Leaf files named `{tag}{i}`: the reaper threads are named after them
/// ("zio_uring_" + 5 characters), so a test can find its own.
fn files(tag: &str, n: usize) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("{tag}{i}"))).collect();
    for p in &paths {
        std::fs::File::create(p).unwrap().set_len(DEV_SIZE).unwrap();
    }
    Files { _dir: dir, paths }
}

fn spec(p: &Path) -> LeafSpec {
    LeafSpec { path: p.to_path_buf(), model: None }
}

/// A 2-way mirror of files with a volume holding DATA bytes of pattern(7), synced,
/// then exported and imported again (nothing in the ARC). None if the kernel does not
/// give the leaves io_uring.
fn setup(name: &str, tag: &str) -> Option<(Files, Arc<Pool>, Vec<u8>)> {
    let f = files(tag, 2);
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: f.paths.iter().map(|p| spec(p)).collect() }];
    let pool = Pool::create(name, tops, CreateOptions::default()).expect("create");
    if pool.debug_leaves().iter().any(|l| l.queue.engine() != EngineKind::Uring) {
        eprintln!("io_uring not available here: skipped");
        pool.export().unwrap();
        return None;
    }
    pool.volume_create("vol", VOLSIZE, BS as u32, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let data = pattern(7, DATA);
    for (i, c) in data.chunks(1 << 20).enumerate() {
        v.write((i as u64) << 20, c, false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = Pool::import_leaves(&f.paths.iter().map(|p| spec(p)).collect::<Vec<_>>()).expect("import");
    Some((f, pool, data))
}

fn l0(pool: &Pool, blkid: u64) -> BlockPointer {
    let root = pool.debug_volume_root("vol").unwrap();
    let bp = dmu::lookup(pool.debug_io(), &root, zilla_core::BlockId(blkid), IoClass::SyncRead).unwrap();
    assert!(!bp.is_hole());
    bp
}

fn evict(pool: &Pool, bp: &BlockPointer) {
    let d = bp.dva[0];
    pool.debug_io().forget_cached(&BlockKey { vdev: d.vdev, offset: d.offset, birth: bp.birth });
}

fn names(pool: &Pool) -> Vec<String> {
    pool.debug_io().top(zilla_core::VdevId(0)).unwrap().children().iter().map(|c| c.spec.display()).collect()
}

/// The child the mirror reads first for data offset `off` on an idle pool.
fn first_reader(pool: &Pool, names: &[String], off: u64) -> String {
    let phys = DATA_START + off;
    let loads: Vec<u64> = names
        .iter()
        .map(|n| {
            let l = pool.debug_leaves().iter().find(|c| &c.spec.display() == n).unwrap().queue.last_offset();
            if l == phys { 0 } else { 1 }
        })
        .collect();
    let min = *loads.iter().min().unwrap();
    let ties: Vec<usize> = (0..names.len()).filter(|&i| loads[i] == min).collect();
    names[ties[((phys >> 21) as usize) % ties.len()]].clone()
}

fn child_counts(pool: &Pool, name: &str) -> (u64, u64) {
    let s = pool.status();
    let c = s.config.iter().flat_map(|t| t.children.iter()).find(|c| c.name == name).unwrap();
    (c.read_errors, c.cksum_errors)
}

fn damage(path: &str, off: u64, len: u64, seed: u8) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let junk: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ 0x5a).collect();
    f.write_all_at(&junk, DATA_START + off).unwrap();
    f.sync_all().unwrap();
}

fn copy_bytes(path: &str, off: u64, len: u64) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, DATA_START + off).unwrap();
    b
}

/// `read_async` as the NBD layer calls it, then the blocking read when it says None.
fn read_as_front_end(v: &dyn BlockVolume, off: u64, len: u64) -> (bool, Vec<u8>) {
    let (tx, rx) = std::sync::mpsc::channel();
    v.read_async(off, len, Box::new(move |r| {
        tx.send(r.map(|r| r.map(|ps| ps.iter().flat_map(|p| p.as_slice().to_vec()).collect::<Vec<u8>>()))).unwrap()
    }));
    let r = rx.recv_timeout(Duration::from_secs(30)).expect("read_async never answered");
    match r {
        Some(r) => (true, r.expect("read_async failed")),
        None => {
            let mut b = vec![0u8; len as usize];
            v.read(off, &mut b).expect("blocking read");
            (false, b)
        }
    }
}

#[test]
fn one_bad_copy_met_once_counts_one_checksum_error() {
    // Goal: a client's cold read of a block whose first copy is bad returns the good
    // bytes, heals the copy and counts ONE checksum error on the child that has it (one
    // bad copy read once is one error, as zpool status shows it; double counting
    // faults a disk after half the errors). Method: for blocks whose first reader is
    // the second child and for blocks whose first reader is the first child, damage
    // that copy in the file under the running pool, read as the NBD layer does.
    let Some((_f, pool, data)) = setup("uatk_cksum", "ck") else { return };
    let v = pool.open_volume("vol").unwrap();
    let names = names(&pool);
    let mut per_child: HashMap<String, u64> = HashMap::new();
    for blk in (3..(DATA as u64 / BS)).step_by(37).take(12) {
        let bp = l0(&pool, blk);
        evict(&pool, &bp);
        let d = bp.dva[0];
        let bad = first_reader(&pool, &names, d.offset);
        damage(&bad, d.offset, d.asize as u64, blk as u8);
        let before = child_counts(&pool, &bad);
        let (fast, got) = read_as_front_end(&*v, blk * BS, BS);
        assert!(!fast, "block {blk}: a copy that does not verify was served without the blocking path");
        assert!(got == data[(blk * BS) as usize..((blk + 1) * BS) as usize], "block {blk}: wrong bytes");
        let after = child_counts(&pool, &bad);
        assert!(zilla_core::zio::verify(&bp, &copy_bytes(&bad, d.offset, d.asize as u64)), "block {blk}: copy on {bad} not healed");
        assert_eq!(after.1 - before.1, 1, "block {blk}: one bad copy read once counted {} checksum errors on {bad}", after.1 - before.1);
        *per_child.entry(bad).or_default() += 1;
    }
    assert!(per_child.len() == 2, "the test did not exercise both mirror positions: {per_child:?}");
    drop(v);
    pool.export().unwrap();
}

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    let mut v = vec![];
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(n) = std::fs::read_to_string(t.path().join("comm")) {
            if n.trim_end().starts_with(prefix) {
                v.push(n.trim_end().to_string());
            }
        }
    }
    v
}

/// Readers issuing batches of cold asynchronous reads (each answer checked, a None
/// answered by the blocking read), until `stop`. Returns (answered, fast, errors).
/// An error while `exporting` is false is recorded in `early_errors`.
fn cold_readers(
    pool: &Arc<Pool>,
    data: &Arc<Vec<u8>>,
    stop: &Arc<AtomicBool>,
    exporting: &Arc<AtomicBool>,
    early_errors: &Arc<parking_lot::Mutex<Vec<String>>>,
    outstanding: &Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<(u64, u64, u64)>> {
    let blocks = DATA as u64 / BS;
    (0..3u64)
        .map(|t| {
            let (pool, data, stop, outstanding) = (pool.clone(), data.clone(), stop.clone(), outstanding.clone());
            let (exporting, early_errors) = (exporting.clone(), early_errors.clone());
            let early = move |what: String| {
                if !exporting.load(Ordering::SeqCst) {
                    early_errors.lock().push(what);
                }
            };
            std::thread::spawn(move || {
                let Ok(v) = pool.open_volume("vol") else { return (0, 0, 0) };
                let (mut answered, mut fast, mut errors) = (0u64, 0u64, 0u64);
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                while !stop.load(Ordering::Relaxed) {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let batch = 48;
                    for _ in 0..batch {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let blk = seed % blocks;
                        let key = pool.debug_volume_root("vol").and_then(|r| dmu::lookup(pool.debug_io(), &r, zilla_core::BlockId(blk), IoClass::SyncRead).ok());
                        if let Some(bp) = key {
                            evict(&pool, &bp);
                        }
                        let tx = tx.clone();
                        outstanding.fetch_add(1, Ordering::SeqCst);
                        let out = outstanding.clone();
                        v.read_async(blk * BS, BS, Box::new(move |r| {
                            out.fetch_sub(1, Ordering::SeqCst);
                            let r = r.map(|r| r.map(|ps| ps.iter().flat_map(|p| p.as_slice().to_vec()).collect::<Vec<u8>>()));
                            let _ = tx.send((blk, r));
                        }));
                    }
                    drop(tx);
                    for _ in 0..batch {
                        let (blk, r) = rx.recv_timeout(Duration::from_secs(60)).expect("an asynchronous read never answered");
                        let want = &data[(blk * BS) as usize..((blk + 1) * BS) as usize];
                        answered += 1;
                        match r {
                            Some(Ok(b)) => {
                                assert!(b == want, "block {blk}: wrong bytes from the asynchronous read");
                                fast += 1;
                            }
                            Some(Err(e)) => {
                                early(format!("block {blk}: asynchronous read: {e}"));
                                errors += 1
                            }
                            None => {
                                let mut b = vec![0u8; BS as usize];
                                match v.read(blk * BS, &mut b) {
                                    Ok(()) => assert!(b == want, "block {blk}: wrong bytes from the blocking read"),
                                    Err(e) => {
                                        early(format!("block {blk}: blocking read: {e}"));
                                        errors += 1
                                    }
                                }
                            }
                        }
                    }
                }
                (answered, fast, errors)
            })
        })
        .collect()
}

#[test]
fn admin_operations_during_cold_async_reads_never_hang_or_return_wrong_bytes() {
    // Goal: offline/online of either child, detach and re-attach, and finally export
    // while three threads keep ~150 cold asynchronous reads in flight: every read is
    // answered (none stranded in a leaf queue whose engine was shut down), with the
    // right bytes or an error, the export finishes, and every reaper thread of the
    // pool exits (no leaf kept alive by a request that never completes).
    let Some((f, pool, data)) = setup("uatk_admin", "ad") else { return };
    let data = Arc::new(data);
    let names = names(&pool);
    // the indirects in the ARC, so the reads take the asynchronous path
    for blk in (0..DATA as u64 / BS).step_by(64) {
        l0(&pool, blk);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let outstanding = Arc::new(AtomicU64::new(0));
    let exporting = Arc::new(AtomicBool::new(false));
    let early_errors = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let readers = cold_readers(&pool, &data, &stop, &exporting, &early_errors, &outstanding);
    let pause = || std::thread::sleep(Duration::from_millis(300));
    pause();
    for round in 0..2 {
        let n = &names[round % 2];
        pool.offline(n).unwrap_or_else(|e| panic!("offline {n}: {e}"));
        pause();
        pool.online(n).unwrap_or_else(|e| panic!("online {n}: {e}"));
        pause();
    }
    // detach the second child and attach it again (a resilver under the readers)
    pool.detach(&names[1]).expect("detach");
    pause();
    pool.attach(&names[0], &spec(Path::new(&names[1])), true).expect("attach");
    pause();
    let t0 = Instant::now();
    exporting.store(true, Ordering::SeqCst);
    let exporter = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.export())
    };
    while !exporter.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(60), "export hangs with asynchronous reads in flight");
        std::thread::sleep(Duration::from_millis(50));
    }
    let exported = exporter.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let (answered, fast, errors) = r.join().expect("a reader panicked");
        eprintln!("reader: {answered} answered, {fast} without blocking, {errors} errors");
    }
    exported.expect("export");
    let early = early_errors.lock().clone();
    assert!(early.is_empty(), "reads failed while a good copy was readable: {} errors, first {:?}", early.len(), &early[..early.len().min(5)]);
    assert_eq!(outstanding.load(Ordering::SeqCst), 0, "asynchronous reads never answered");
    drop(pool);
    let t0 = Instant::now();
    while !threads_named("zio_uring_ad").is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "reaper threads still running after export: {:?}", threads_named("zio_uring_ad"));
        std::thread::sleep(Duration::from_millis(50));
    }
    // and the pool imports with every byte
    let pool = Pool::import_leaves(&f.paths.iter().map(|p| spec(p)).collect::<Vec<_>>()).expect("import after export");
    let v = pool.open_volume("vol").unwrap();
    let mut b = vec![0u8; DATA];
    v.read(0, &mut b).unwrap();
    assert!(b == *data, "data differs after export/import");
    drop(v);
    pool.export().unwrap();
}

#[test]
fn a_leaf_truncated_under_cold_reads_never_gives_wrong_bytes() {
    // Goal: a leaf file cut short under the running pool (its reads past the new end
    // come back short from io_uring, are redone synchronously and fail) makes every
    // cold read fall back to the other child with the right bytes; the errors are
    // counted once per failed read and fault the child once they add up, never the
    // good one. Method: truncate the child the reads go to first, read every block
    // the way the NBD layer does, from three threads.
    let Some((f, pool, data)) = setup("uatk_trunc", "tr") else { return };
    let data = Arc::new(data);
    let names = names(&pool);
    for blk in (0..DATA as u64 / BS).step_by(64) {
        l0(&pool, blk);
    }
    let victim = f.paths[1].clone();
    std::fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(DATA_START + (1 << 20)).unwrap();
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (pool, data) = (pool.clone(), data.clone());
            std::thread::spawn(move || {
                let v = pool.open_volume("vol").unwrap();
                let mut fast = 0;
                for blk in (t..DATA as u64 / BS).step_by(3) {
                    evict(&pool, &l0(&pool, blk));
                    let (f, got) = read_as_front_end(&*v, blk * BS, BS);
                    fast += f as u64;
                    assert!(got == data[(blk * BS) as usize..((blk + 1) * BS) as usize], "block {blk}: wrong bytes");
                }
                fast
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a reader failed");
    }
    let s = pool.status();
    for c in s.config.iter().flat_map(|t| t.children.iter()) {
        eprintln!("{}: state {:?} read {} cksum {}", c.name, c.state, c.read_errors, c.cksum_errors);
    }
    let good = s.config.iter().flat_map(|t| t.children.iter()).find(|c| c.name == names[0]).unwrap();
    assert_eq!((good.read_errors, good.cksum_errors), (0, 0), "errors counted on the good child");
    drop(s);
    pool.export().unwrap();
}
