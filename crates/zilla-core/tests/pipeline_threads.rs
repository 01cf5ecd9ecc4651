//! The I/O pipeline starts its threads once: writing and syncing 1 GiB starts exactly
//! as many threads as 64 MiB (issue 13: nothing spawns a thread per I/O, per chunk, per
//! write, per mirror child or per txg).
//!
//! Method: a 2-way mirror pool on two sparse files; create it, write N bytes through a
//! volume in 1 MiB writes with a sync every 64 MiB, flush, export. Threads are counted
//! twice: by the Env seam's spawn counter (every engine thread is started through it),
//! and by a sampler that lists /proc/self/task every 200 µs and collects every thread id
//! it sees, which also catches threads not started through the Env (a scoped thread per
//! chunk or per mirror child would show up as thousands of ids). The kernel's io_uring
//! helper threads are left out of the sample (see `tids`). This file holds one
//! test so no other test's pools start threads meanwhile.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use zilla_core::spa::{CreateOptions, Pool, TopSpec};
use zilla_core::vdev::{LeafSpec, Role};

const MIB: u64 = 1 << 20;

/// The process's thread ids, without the kernel's io_uring helpers (`iou-wrk-*`): the
/// kernel starts and retires them on demand for a leaf's ring (each ring bounds them:
/// vdev/uring.rs, IOWQ_*_WORKERS_MAX), so their ids are new after every idle spell
/// however little is written; they are not engine threads. They carry PF_IO_WORKER in
/// /proc/.../stat's flags from creation (their name is set a moment later).
fn tids() -> HashSet<u64> {
    const PF_IO_WORKER: u64 = 0x10;
    // None: gone before its stat was read (an io-wq helper retiring; an engine thread
    // lives long enough to be seen by another sample)
    let engine_thread = |t: u64| -> Option<bool> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{t}/stat")).ok()?;
        // fields after the ")" closing comm: state ppid pgrp session tty_nr tpgid flags
        let flags = stat.rsplit_once(')')?.1.split_whitespace().nth(6)?.parse::<u64>().ok()?;
        Some(flags & PF_IO_WORKER == 0)
    };
    let Ok(d) = std::fs::read_dir("/proc/self/task") else { return HashSet::new() };
    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&t| engine_thread(t) == Some(true)).collect()
}

/// Collects the id of every thread alive while it runs.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<HashSet<u64>>,
}

impl Sampler {
    fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut seen = HashSet::new();
            let me = std::fs::read_link("/proc/thread-self").ok().and_then(|p| p.file_name()?.to_str()?.parse::<u64>().ok());
            while !s.load(Ordering::Relaxed) {
                for t in tids() {
                    if seen.insert(t) && std::env::var("ZILLA_THREADS_DEBUG").is_ok() {
                        let comm = std::fs::read_to_string(format!("/proc/self/task/{t}/comm")).unwrap_or_default();
                        eprintln!("thread {t}: {}", comm.trim());
                    }
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            if let Some(me) = me {
                seen.remove(&me);
            }
            seen
        });
        Sampler { stop, handle }
    }
    fn stop(self) -> HashSet<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// Threads started while a pool writes and syncs `bytes`: by the spawn counter, and
/// thread ids seen that were not there before.
fn threads_for(bytes: u64) -> (u64, usize) {
    let dir = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or_else(|_| "/var/tmp".into())).unwrap();
    let mut leaves = Vec::new();
    for n in ["a", "b"] {
        let p = dir.path().join(n);
        std::fs::File::create(&p).unwrap().set_len(bytes + 512 * MIB).unwrap();
        leaves.push(LeafSpec { path: p, model: None });
    }
    let env = zilla_core::env::real();
    // The daemon's one ARC and its evictor thread exist once per process, not per pool:
    // started before the count begins.
    let _ = zilla_core::arc::daemon_arc();
    // Threads alive now (this process's, and a previous pool's still exiting) are not
    // this run's; the sampler's own id is excluded below.
    let baseline = tids();
    let sampler = Sampler::start();
    let before = env.threads_spawned();
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves }];
    let pool: Arc<Pool> = Pool::create("threads", tops, CreateOptions::default()).expect("create");
    pool.volume_create("v", bytes, 131072, &[]).unwrap();
    let v = pool.open_volume("v").unwrap();
    let chunk: Vec<u8> = (0..MIB).map(|i| (i * 31 % 251) as u8).collect();
    for off in (0..bytes).step_by(MIB as usize) {
        v.write(off, &chunk, false).unwrap();
        if (off + MIB) % (64 * MIB) == 0 {
            v.flush().unwrap();
        }
    }
    v.flush().unwrap();
    let mut back = vec![0u8; MIB as usize];
    v.read(bytes - MIB, &mut back).unwrap();
    assert_eq!(back, chunk);
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let started = env.threads_spawned() - before;
    let seen = sampler.stop();
    (started, seen.difference(&baseline).count())
}

#[test]
fn thread_count_does_not_grow_with_data() {
    let (small, small_seen) = threads_for(64 * MIB);
    let (large, large_seen) = threads_for(1024 * MIB);
    eprintln!("threads started: 64 MiB {small} (thread ids seen {small_seen}), 1 GiB {large} (thread ids seen {large_seen})");
    assert!(small > 0, "the spawn counter saw no engine threads");
    assert_eq!(small, large, "threads started (Env counter) for 64 MiB vs 1 GiB");
    assert_eq!(small_seen, large_seen, "thread ids seen for 64 MiB vs 1 GiB");
    assert_eq!(large_seen as u64, large, "threads not started through the Env seam");
}
