//! How many times a cold READ wakes the server's threads: a real pool on file leaves
//! (the io_uring engine), the L1 indirects cached and the data blocks not, one client
//! reading one block at a time (queue depth 1, so every wake-up belongs to one read).
//!
//! Counted from the kernel's per-thread `voluntary_ctxt_switches` (each is one sleep,
//! so one wake-up to continue): the reactor thread that reads the requests must sleep
//! once per read (waiting for the next request) and not a second time, which it did
//! while it submitted the device read itself (the kernel then woke it to post the
//! completion, and it woke the engine thread). The engine thread that completes the
//! device read verifies the block, inserts it in the ARC and writes the reply.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::net::TcpListener;
use tokio::sync::watch;
use zilla_core::spa::{CreateOptions, Pool, TopSpec};
use zilla_core::vdev::queue::EngineKind;
use zilla_core::vdev::{IoClass, LeafSpec, Role};
use zilla_nbd::proto::*;
use zilla_nbd::{Frontend, FrontendConfig, NbdConfig, NbdServer, StaticRegistry};

const DEV_SIZE: u64 = 64 << 20;
const VOLSIZE: u64 = 16 << 20;
const BS: u64 = 16384;
const DATA: u64 = 8 << 20;
const REACTOR: &str = "nbd-reactor";

fn specs(paths: &[PathBuf]) -> Vec<LeafSpec> {
    paths.iter().map(|p| LeafSpec { path: p.clone(), model: None }).collect()
}

/// Voluntary context switches of every thread of this process, by thread name.
fn switches_by_name() -> HashMap<String, u64> {
    let mut by_name = HashMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let (Ok(comm), Ok(status)) = (std::fs::read_to_string(task.path().join("comm")), std::fs::read_to_string(task.path().join("status"))) else {
            continue; // the thread ended meanwhile
        };
        let n: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let name = comm.trim().to_string();
        let name = if name.starts_with("zio_uring") { "zio_uring".to_string() } else { name };
        *by_name.entry(name).or_insert(0) += n;
    }
    by_name
}

/// A pool written, exported and imported again (nothing in the ARC), its indirects
/// read back so a cold READ of a data block is one device read.
fn cold_pool(dir: &std::path::Path) -> Option<Arc<Pool>> {
    let paths: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("hand{i}"))).collect();
    for p in &paths {
        std::fs::File::create(p).unwrap().set_len(DEV_SIZE).unwrap();
    }
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: specs(&paths) }];
    let pool = Pool::create("hand", tops, CreateOptions::default()).expect("create");
    if pool.debug_leaves().iter().any(|l| l.queue.engine() != EngineKind::Uring) {
        pool.export().unwrap();
        return None;
    }
    pool.volume_create("vol", VOLSIZE, BS as u32, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    for off in (0..DATA).step_by(1 << 20) {
        let data: Vec<u8> = (0..1u64 << 20).map(|i| ((off + i) / 512) as u8 ^ 0x5a).collect();
        v.write(off, &data, false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = Pool::import_leaves(&specs(&paths)).expect("import");
    let root = pool.debug_volume_root("vol").unwrap();
    for blk in (0..DATA / BS).step_by(64) {
        zilla_core::dmu::lookup(pool.debug_io(), &root, zilla_core::BlockId(blk), IoClass::SyncRead).unwrap();
    }
    Some(pool)
}

#[test]
fn a_cold_read_wakes_the_reactor_once_and_the_engine_thread_replies() {
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
    let task = server_rt.spawn(async move { server.serve_tcp(listener, shutdown_rx).await });

    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let blocks: Vec<u64> = (0..DATA / BS).map(|i| (i * 97) % (DATA / BS)).collect();
    let (before, after) = client_rt.block_on(async {
        let mut client = RawClient::open(addr, "pool/vol").await;
        // settle: the handshake's tasks are done before counting
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = switches_by_name();
        for &b in &blocks {
            client.send_request(0, CMD_READ, b, b * BS, BS as u32, &[]).await;
            let chunk = client.read_chunk().await;
            assert_eq!((chunk.cookie, chunk.chunk_type), (b, REPLY_TYPE_OFFSET_DATA), "block {b}");
            let want: Vec<u8> = (0..BS).map(|i| ((b * BS + i) / 512) as u8 ^ 0x5a).collect();
            assert!(chunk.payload[8..] == want[..], "block {b}: wrong bytes");
        }
        let after = switches_by_name();
        drop(client);
        (before, after)
    });
    let reads = blocks.len() as f64;
    let per_read = |name: &str| (after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)) as f64 / reads;
    let (reactor, engine) = (per_read(REACTOR), per_read("zio_uring"));
    eprintln!("per cold read at QD1: reactor sleeps {reactor:.2}, engine threads sleep {engine:.2}, server total {:.2}", reactor + engine);
    let io = pool.debug_io().arc.stats();
    eprintln!("ARC after the reads: {io:?}");

    // the reactor reads a request, hands the device read to the engine and sleeps until
    // the next request: once per read (a little slack for timers and the odd batch)
    assert!(reactor <= 1.25, "the reactor thread slept {reactor:.2} times per cold read (one hand-off allows 1)");
    // the engine thread: woken with the read to issue, woken by the device, replies
    assert!(engine <= 2.25, "the engine threads slept {engine:.2} times per cold read");

    shutdown.send(true).unwrap();
    server_rt.block_on(async { tokio::time::timeout(Duration::from_secs(15), task).await.expect("server did not stop") }).unwrap().unwrap();
    drop(server_rt);
    pool.export().unwrap();
}
