//! The thread hand-offs of a cold READ, counted: a real pool on file leaves (the
//! io_uring engine), the L1 indirects cached and the data blocks not, one client reading
//! one 16K block at a time (queue depth 1, so every wake-up belongs to one read).
//!
//! Counted from the kernel's per-thread `voluntary_ctxt_switches` (each is one sleep,
//! so one wake-up to continue), by thread. The path (docs/design.md, "Read"):
//!
//! ```text
//!   reactor: woken by the request, submits the device read (io_uring)   1 sleep
//!   reactor: woken again by the kernel to post the completion when the
//!            device answers after it went to sleep (io_uring runs a
//!            request's completion in its submitter's context)       0 or 1 sleep
//!   engine (the leaf's reaper): woken by the completion; verifies,
//!            decompresses, inserts into the ARC, writes the reply          1 sleep
//! ```
//!
//! Any other thread that takes part (the blocking pool, the connection's writer task,
//! a worker pool for the verification) is one more hand-off and fails the test.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::net::TcpListener;
use tokio::sync::watch;
use zilla_core::spa::Pool;
use zilla_nbd::proto::*;
use zilla_nbd::{Frontend, FrontendConfig, NbdConfig, NbdServer, StaticRegistry};

const DEV_SIZE: u64 = 64 << 20;
const VOLSIZE: u64 = 16 << 20;
const BS: u64 = 16 << 10;
const DATA: u64 = 8 << 20;
const REACTOR: &str = "nbd-reactor";

/// Voluntary context switches of every thread of this process: thread id -> (name, count).
fn switches_by_thread() -> HashMap<String, (String, u64)> {
    let mut by_thread = HashMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let (Ok(comm), Ok(status)) = (std::fs::read_to_string(task.path().join("comm")), std::fs::read_to_string(task.path().join("status"))) else {
            continue; // the thread ended meanwhile
        };
        let n: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        by_thread.insert(task.file_name().to_string_lossy().into_owned(), (comm.trim().to_string(), n));
    }
    by_thread
}

/// Sleeps per read of each thread that slept at all between `before` and `after`:
/// (thread id, name, sleeps per read), most first.
fn sleeps_per_read(before: &HashMap<String, (String, u64)>, after: &HashMap<String, (String, u64)>, reads: f64) -> Vec<(String, String, f64)> {
    let mut out: Vec<(String, String, f64)> = after
        .iter()
        .map(|(tid, (name, n))| (tid.clone(), name.clone(), (n - before.get(tid).map_or(0, |b| b.1)) as f64 / reads))
        .filter(|t| t.2 > 0.0)
        .collect();
    out.sort_by(|a, b| b.2.total_cmp(&a.2));
    out
}

/// A pool written, exported and imported again (nothing in the ARC), its indirects
/// read back so a cold READ of a data block is one device read.
fn cold_pool(dir: &std::path::Path) -> Option<Arc<Pool>> {
    let fill = |off: u64, len: u64| (0..len).map(|i| ((off + i) / 512) as u8 ^ 0x5a).collect();
    cold_uring_pool(dir, "hand", DEV_SIZE, VOLSIZE, BS, DATA, fill).map(|(pool, _)| pool)
}

#[test]
fn a_cold_read_is_one_hand_off_from_the_reactor_to_the_engine_thread_that_replies() {
    let dir = tempfile::tempdir().unwrap();
    let Some(pool) = cold_pool(dir.path()) else {
        eprintln!("no io_uring here: skipped");
        return;
    };
    let server_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name(REACTOR).enable_all().build().unwrap();
    let mut registry = StaticRegistry::new();
    registry.insert("pool/vol", "", pool.open_volume("vol").unwrap());
    let frontend = Frontend::new(Arc::new(registry), FrontendConfig::default());
    let (shutdown, shutdown_rx) = watch::channel(false);
    let listener = server_rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = NbdServer::with_frontend(frontend.clone(), NbdConfig::default());
    let nbd_stats = server.stats().clone();
    let task = server_rt.spawn(async move { server.serve_tcp(listener, shutdown_rx).await });

    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let blocks: Vec<u64> = (0..DATA / BS).map(|i| (i * 97) % (DATA / BS)).collect();
    // SAFETY: gettid takes no arguments and cannot fail.
    let client_tid = unsafe { libc::gettid() }.to_string();
    let (before, after, direct) = client_rt.block_on(async {
        let mut client = RawClient::open(addr, "pool/vol").await;
        // settle: the handshake's tasks are done before counting
        tokio::time::sleep(Duration::from_millis(100)).await;
        let direct = nbd_stats.replies_written_direct.load(std::sync::atomic::Ordering::Relaxed);
        let before = switches_by_thread();
        for &b in &blocks {
            client.send_request(0, CMD_READ, b, b * BS, BS as u32, &[]).await;
            let chunk = client.read_chunk().await;
            assert_eq!((chunk.cookie, chunk.chunk_type), (b, REPLY_TYPE_OFFSET_DATA), "block {b}");
            let want: Vec<u8> = (0..BS).map(|i| ((b * BS + i) / 512) as u8 ^ 0x5a).collect();
            assert!(chunk.payload[8..] == want[..], "block {b}: wrong bytes");
        }
        let after = switches_by_thread();
        // the finishing thread counts its reply just after the client may have read it
        tokio::time::sleep(Duration::from_millis(50)).await;
        let direct = nbd_stats.replies_written_direct.load(std::sync::atomic::Ordering::Relaxed) - direct;
        drop(client);
        (before, after, direct)
    });
    let reads = blocks.len() as f64;
    let threads: Vec<_> = sleeps_per_read(&before, &after, reads).into_iter().filter(|t| t.0 != client_tid).collect();
    eprintln!("sleeps per cold 16K read at QD1, by server thread: {threads:?}");
    let of = |prefix: &str| threads.iter().filter(|t| t.1.starts_with(prefix)).map(|t| t.2).collect::<Vec<_>>();
    let (reactor, engine) = (of(REACTOR), of("zio_uring"));

    // every reply written by the thread that finished its read, none by the writer task
    assert_eq!(direct, blocks.len() as u64, "replies written by the finishing thread");
    // one reactor thread: no blocking-pool thread took part
    assert_eq!(reactor.len(), 1, "front-end threads that slept: {threads:?}");
    assert!(reactor[0] <= 2.1, "the reactor slept {:.2} times per cold read: {threads:?}", reactor[0]);
    // the engine thread that completes the device read is woken once and finishes the
    // request there (both leaves' reapers together: the mirror reads one child)
    let engine_total: f64 = engine.iter().sum();
    assert!((0.9..=1.1).contains(&engine_total), "engine threads slept {engine_total:.2} times per cold read: {threads:?}");
    // no other thread of the server takes part in a read
    let others: Vec<_> = threads.iter().filter(|t| !t.1.starts_with(REACTOR) && !t.1.starts_with("zio_uring")).collect();
    assert!(others.iter().all(|t| t.2 < 0.05), "other threads took part in cold reads: {others:?}");

    shutdown.send(true).unwrap();
    server_rt.block_on(async { tokio::time::timeout(Duration::from_secs(15), task).await.expect("server did not stop") }).unwrap().unwrap();
    drop(server_rt);
    pool.export().unwrap();
}
