//! Hostile-client tests: clients that never read their replies, idle clients, and a
//! full connection table must stall only themselves.
//!
//! Method: an in-process server sharing a `Frontend` the test can inspect (budgets),
//! abusive raw clients whose request streams run in background tasks (they block once
//! the server stops reading them), and a well-behaved client whose latency is checked.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use zilla_core::memvol::MemVolume;
use zilla_nbd::proto::*;
use zilla_nbd::{Frontend, FrontendConfig, NbdConfig, NbdServer, StaticRegistry};

const BIG_VOLUME_BYTES: u64 = 64 << 20;

struct Harness {
    addr: SocketAddr,
    frontend: Arc<Frontend>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start_shared(config: NbdConfig, frontend_config: FrontendConfig) -> Harness {
    let mut registry = StaticRegistry::new();
    registry.insert("pool/vol", "", Arc::new(MemVolume::new("pool/vol", VOLUME_BYTES, 4096)));
    let big = MemVolume::new("pool/big", BIG_VOLUME_BYTES, 4096);
    // Data, not holes: reads must return full-size replies.
    zilla_core::zvol::BlockVolume::write(&big, 0, &vec![0x5a; BIG_VOLUME_BYTES as usize], false).unwrap();
    registry.insert("pool/big", "", Arc::new(big));
    let frontend = Frontend::new(Arc::new(registry), frontend_config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let server = NbdServer::with_frontend(frontend.clone(), config);
    let task = tokio::spawn(async move { server.serve_tcp(listener, shutdown_rx).await });
    Harness { addr, frontend, shutdown, task }
}

fn request(command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    request_bytes(0, command, cookie, offset, length, &[])
}

/// A client that opens pool/big, sends big reads, TRIMs and invalid requests, and
/// never reads a reply. Its writes run in the background (they block once the server
/// stops reading); the socket stays open until the returned handle is dropped/aborted.
async fn spawn_non_reader(addr: SocketAddr) -> tokio::task::JoinHandle<TcpStream> {
    let mut client = RawClient::open(addr, "pool/big").await;
    tokio::spawn(async move {
        let mut stream_bytes = Vec::new();
        for cookie in 0..8u64 {
            stream_bytes.extend(request(CMD_READ, cookie, 0, 16 << 20));
        }
        for cookie in 100..400u64 {
            stream_bytes.extend(request(CMD_READ, cookie, BIG_VOLUME_BYTES, 4096)); // out of range
        }
        for cookie in 1000..1127u64 {
            stream_bytes.extend(request(CMD_TRIM, cookie, 0, (BIG_VOLUME_BYTES - 4096) as u32));
        }
        let _ = client.stream.write_all(&stream_bytes).await;
        client.stream
    })
}

async fn write_and_flush_latency(addr: SocketAddr) -> Duration {
    let started = Instant::now();
    let mut client = RawClient::open(addr, "pool/vol").await;
    assert_eq!(client.write(1, 8192, &[7u8; 4096]).await, 0);
    client.send_request(0, CMD_FLUSH, 2, 0, 0, &[]).await;
    assert_eq!(client.read_simple_reply().await, (0, 2));
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_reading_clients_stall_only_themselves() {
    let harness = start_shared(NbdConfig::default(), FrontendConfig::default()).await;
    let mut abusers = Vec::new();
    for _ in 0..5 {
        abusers.push(spawn_non_reader(harness.addr).await);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let memory = harness.frontend.memory.stats();
    assert!(memory.in_use <= memory.total, "{memory:?}");
    assert!(memory.in_use > 0, "the abusers hold budget: {memory:?}");
    for _ in 0..3 {
        let latency = write_and_flush_latency(harness.addr).await;
        assert!(latency < Duration::from_secs(1), "write+flush took {latency:?} next to non-reading clients");
    }
    let calls = harness.frontend.volume_calls.stats();
    assert!(calls.in_use <= calls.total, "{calls:?}");
    // Shutdown completes while the abusers are still connected and not reading.
    let started = Instant::now();
    harness.shutdown.send(true).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(10), harness.task).await;
    assert!(stopped.is_ok(), "server did not stop within 10 s");
    assert!(started.elapsed() < Duration::from_secs(8), "stop took {:?}", started.elapsed());
    drop(abusers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_budget_is_shared_and_bounded() {
    // 24 connections, each asking for four 32 MiB reads and reading nothing, against a
    // 160 MiB budget: in use never exceeds it, and a newcomer still gets served.
    let frontend_config = FrontendConfig {
        memory_budget_bytes: 160 << 20,
        memory_reserve_bytes: 64 << 20,
        ..FrontendConfig::default()
    };
    let harness = start_shared(NbdConfig::default(), frontend_config).await;
    let mut abusers = Vec::new();
    for _ in 0..24 {
        let mut client = RawClient::open(harness.addr, "pool/big").await;
        abusers.push(tokio::spawn(async move {
            let mut bytes = Vec::new();
            for cookie in 0..4u64 {
                bytes.extend(request(CMD_READ, cookie, 0, 32 << 20));
            }
            let _ = client.stream.write_all(&bytes).await;
            client.stream
        }));
    }
    let mut peak = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(harness.frontend.memory.stats().in_use);
    }
    assert!(peak <= 160 << 20, "peak {peak}");
    assert!(peak >= 64 << 20, "abusers should have taken most of the budget: {peak}");
    let pooled = harness.frontend.buffers.stats();
    assert!(pooled.pooled_bytes <= pooled.bytes_max, "{pooled:?}");
    drop(abusers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reader_is_dropped_and_returns_its_budget() {
    let config = NbdConfig { reply_stall_timeout: Duration::from_millis(500), ..NbdConfig::default() };
    let harness = start_shared(config, FrontendConfig::default()).await;
    let abuser = spawn_non_reader(harness.addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(harness.frontend.memory.stats().in_use > 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while harness.frontend.memory.stats().in_use > 0 {
        assert!(Instant::now() < deadline, "budget still held: {:?}", harness.frontend.memory.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(abuser);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_is_closed_after_the_timeout() {
    let config = NbdConfig { idle_timeout: Duration::from_millis(400), ..NbdConfig::default() };
    let harness = start_shared(config, FrontendConfig::default()).await;
    let mut idle = RawClient::open(harness.addr, "pool/vol").await;
    let mut busy = RawClient::open(harness.addr, "pool/vol").await;
    for cookie in 0..8 {
        assert_eq!(busy.write(cookie, 0, &[1u8; 512]).await, 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(idle.closed_within(Duration::from_secs(1)).await, "idle connection still open");
    assert_eq!(busy.write(99, 0, &[2u8; 512]).await, 0, "a busy connection is not idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_connection_table_evicts_the_idlest() {
    let config = NbdConfig { connections_max: 4, ..NbdConfig::default() };
    let harness = start_shared(config, FrontendConfig::default()).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(RawClient::open(harness.addr, "pool/vol").await);
    }
    // Eviction needs the idle ones to be idle for a while (5 s).
    tokio::time::sleep(Duration::from_millis(5200)).await;
    let started = Instant::now();
    let mut newcomer = tokio::time::timeout(Duration::from_secs(3), RawClient::open(harness.addr, "pool/vol"))
        .await
        .expect("a new client gets in at the cap");
    assert_eq!(newcomer.write(1, 0, &[3u8; 4096]).await, 0);
    assert!(started.elapsed() < Duration::from_secs(2));
    let mut closed = 0;
    for client in &mut idle {
        if client.closed_within(Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 1, "exactly one idle connection made room");
}

/// Replies are written by the thread that finishes a request when the socket takes
/// them, else queued for the writer task (zilla_nbd's reply_line). A client that
/// pipelines reads far larger than the socket buffers and reads nothing for a while
/// makes the direct writes go in part and the writer take over mid-reply; once it
/// reads, every reply must arrive whole, unmixed with another, with its own data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_to_a_slow_reader_arrive_whole_and_unmixed() {
    const READS: u64 = 48;
    const READ_BYTES: u32 = 256 << 10;
    let harness = start_shared(NbdConfig::default(), FrontendConfig::default()).await;
    let mut client = RawClient::open(harness.addr, "pool/big").await;
    // each read's range gets its own byte value
    for i in 0..READS {
        let data = vec![(i % 251) as u8 + 1; READ_BYTES as usize];
        assert_eq!(client.write(10_000 + i, i * u64::from(READ_BYTES), &data).await, 0);
    }
    for i in 0..READS {
        client.send_request(0, CMD_READ, i, i * u64::from(READ_BYTES), READ_BYTES, &[]).await;
    }
    // nothing read: the socket buffers fill and the rest queue in the server
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..READS {
        let chunk = client.read_chunk().await;
        assert_eq!(chunk.chunk_type, REPLY_TYPE_OFFSET_DATA, "cookie {}", chunk.cookie);
        assert_eq!(chunk.flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
        let i = chunk.cookie;
        assert!(i < READS && seen.insert(i), "cookie {i} unexpected or twice");
        assert_eq!(u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap()), i * u64::from(READ_BYTES));
        let data = &chunk.payload[8..];
        assert_eq!(data.len(), READ_BYTES as usize);
        let want = (i % 251) as u8 + 1;
        assert!(data.iter().all(|&b| b == want), "reply {i} carries another reply's bytes");
    }
    // and the connection still works
    assert_eq!(client.write(99_999, 0, &[3u8; 4096]).await, 0);
    let memory = harness.frontend.memory.stats();
    assert!(memory.in_use <= memory.total, "{memory:?}");
    harness.shutdown.send(true).unwrap();
    let _ = harness.task.await;
}

/// A client that sends a burst of large reads, reads no reply and resets the
/// connection: the requests it left in the server's buffer are not run once its
/// replies can no longer be sent (they cost a 32 MiB copy each, for nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_a_client_that_reset_are_not_run() {
    let harness = start_shared(NbdConfig::default(), FrontendConfig::default()).await;
    let mut client = RawClient::connect(harness.addr).await;
    client.structured_reply().await;
    client.go("pool/big").await.unwrap();
    let burst: Vec<u8> = (0..2000u64).flat_map(|cookie| request(CMD_READ, cookie, 0, 32 << 20)).collect();
    client.stream.write_all(&burst).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // linger 0: the close sends a reset, as a client killed mid-stream does
    #[allow(deprecated)]
    client.stream.set_linger(Some(Duration::ZERO)).unwrap();
    drop(client);
    let reads = || harness.frontend.io_stats.volume_snapshot("pool/big").read_ops;
    let deadline = Instant::now() + Duration::from_secs(3);
    while harness.frontend.memory.stats().in_use > 0 {
        assert!(Instant::now() < deadline, "still serving a gone client after 3 s: {} reads run", reads());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reads() < 200, "{} of the 2000 reads were run for a client that was gone", reads());
    let _ = harness.shutdown.send(true);
}
