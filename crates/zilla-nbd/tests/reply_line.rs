//! The shared write side of a connection (zilla_nbd's reply_line): replies are written
//! by whichever thread finishes a request (the reactor for inline answers, a blocking
//! pool thread for volume calls) when the socket is idle, else queued for the writer
//! task. These tests attack it as an unfriendly client would: replies from several
//! threads at once to a client that reads in dribbles, over TCP and unix sockets; a
//! client that half-closes; a client that resets with many replies in flight.
//!
//! Every reply is checked whole: its magic, its cookie (each exactly once) and, for a
//! read, every data byte against the volume's pattern, so bytes of two replies that
//! interleaved, a reply written twice or lost, or a wrong partial-write offset fail.

mod common;
use common::request_bytes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use zilla_core::memvol::MemVolume;
use zilla_nbd::proto::*;
use zilla_nbd::{Frontend, FrontendConfig, NbdConfig, NbdServer, StaticRegistry};

const VOLUME_BYTES: u64 = 16 << 20;
const BLOCK: u64 = 4096;

/// The byte the volume holds at `offset`: each 4 KiB block has its own.
fn pattern(offset: u64) -> u8 {
    ((offset / BLOCK) % 251) as u8 + 1
}

fn pattern_block(offset: u64) -> Vec<u8> {
    vec![pattern(offset); BLOCK as usize]
}

struct Harness {
    frontend: Arc<Frontend>,
    server: NbdServer,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

enum Listen {
    Tcp(std::net::SocketAddr),
    Unix(std::path::PathBuf, tempfile::TempDir),
}

async fn start(unix: bool) -> (Harness, Listen) {
    let mut registry = StaticRegistry::new();
    let volume = MemVolume::new("pool/pat", VOLUME_BYTES, BLOCK as u32);
    let mut data = Vec::with_capacity(VOLUME_BYTES as usize);
    for block in 0..VOLUME_BYTES / BLOCK {
        data.extend(pattern_block(block * BLOCK));
    }
    zilla_core::zvol::BlockVolume::write(&volume, 0, &data, false).unwrap();
    registry.insert("pool/pat", "", Arc::new(volume));
    let frontend = Frontend::new(Arc::new(registry), FrontendConfig::default());
    let config = NbdConfig { reply_stall_timeout: Duration::from_secs(5), ..NbdConfig::default() };
    let server = NbdServer::with_frontend(frontend.clone(), config);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let serving = server.clone();
    if unix {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let task = tokio::spawn(async move { serving.serve_unix(listener, shutdown_rx).await });
        (Harness { frontend, server, shutdown, task }, Listen::Unix(path, dir))
    } else {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move { serving.serve_tcp(listener, shutdown_rx).await });
        (Harness { frontend, server, shutdown, task }, Listen::Tcp(addr))
    }
}

/// Fixed newstyle handshake with structured replies, then GO pool/pat.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).await.unwrap();
    assert_eq!(u64::from_be_bytes(greeting[0..8].try_into().unwrap()), NBD_MAGIC);
    stream.write_all(&3u32.to_be_bytes()).await.unwrap();
    let option = |option: u32, data: &[u8]| {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&IHAVEOPT.to_be_bytes());
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(data);
        bytes
    };
    stream.write_all(&option(OPT_STRUCTURED_REPLY, &[])).await.unwrap();
    stream.write_all(&option(OPT_GO, &common::export_request_data("pool/pat", &[]))).await.unwrap();
    let mut acks = 0;
    while acks < 2 {
        let mut header = [0u8; 20];
        stream.read_exact(&mut header).await.unwrap();
        assert_eq!(u64::from_be_bytes(header[0..8].try_into().unwrap()), OPTION_REPLY_MAGIC);
        let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
        let mut data = vec![0u8; length as usize];
        stream.read_exact(&mut data).await.unwrap();
        match reply_type {
            REP_ACK => acks += 1,
            REP_INFO => {}
            other => panic!("option reply {other:#x}"),
        }
    }
}

/// What a cookie asked for, so its reply can be checked.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Asked {
    Read { offset: u64, length: u32 },
    BadRead,
    Flush,
    Write,
}

/// `count` requests of four kinds, finished on different threads: reads (blocking
/// pool, up to 256 KiB), out-of-range reads (an error chunk made on the reactor),
/// flushes and writes (blocking pool). Writes write the pattern again, so reads of the
/// same blocks see the same bytes whatever the order.
fn mixed_requests(count: u64) -> (Vec<u8>, Vec<Asked>) {
    let blocks = VOLUME_BYTES / BLOCK;
    let mut bytes = Vec::new();
    let mut asked = Vec::new();
    for cookie in 0..count {
        let kind = match cookie % 4 {
            0 | 1 => {
                let length = ((cookie * 7919 % 64) + 1) * BLOCK;
                let offset = (cookie * 31 % (blocks - 64)) * BLOCK + cookie % 7;
                bytes.extend(request_bytes(0, CMD_READ, cookie, offset, length as u32, &[]));
                Asked::Read { offset, length: length as u32 }
            }
            2 => {
                if cookie % 8 == 2 {
                    bytes.extend(request_bytes(0, CMD_READ, cookie, VOLUME_BYTES, 4096, &[]));
                    Asked::BadRead
                } else {
                    bytes.extend(request_bytes(0, CMD_FLUSH, cookie, 0, 0, &[]));
                    Asked::Flush
                }
            }
            _ => {
                let offset = (cookie * 13 % blocks) * BLOCK;
                bytes.extend(request_bytes(0, CMD_WRITE, cookie, offset, BLOCK as u32, &pattern_block(offset)));
                Asked::Write
            }
        };
        asked.push(kind);
    }
    (bytes, asked)
}

/// Read one reply (simple or structured) and check it against what was asked.
/// Returns its cookie.
async fn read_and_check<S: AsyncRead + Unpin>(stream: &mut S, asked: &[Asked]) -> u64 {
    let mut magic = [0u8; 4];
    stream.read_exact(&mut magic).await.unwrap();
    match u32::from_be_bytes(magic) {
        SIMPLE_REPLY_MAGIC => {
            let mut rest = [0u8; 12];
            stream.read_exact(&mut rest).await.unwrap();
            let error = u32::from_be_bytes(rest[0..4].try_into().unwrap());
            let cookie = u64::from_be_bytes(rest[4..12].try_into().unwrap());
            let kind = asked.get(cookie as usize).unwrap_or_else(|| panic!("simple reply with unknown cookie {cookie}"));
            assert!(matches!(kind, Asked::Flush | Asked::Write), "simple reply to {kind:?} (cookie {cookie})");
            assert_eq!(error, 0, "cookie {cookie}");
            cookie
        }
        STRUCTURED_REPLY_MAGIC => {
            let mut rest = [0u8; 16];
            stream.read_exact(&mut rest).await.unwrap();
            let flags = u16::from_be_bytes(rest[0..2].try_into().unwrap());
            let chunk_type = u16::from_be_bytes(rest[2..4].try_into().unwrap());
            let cookie = u64::from_be_bytes(rest[4..12].try_into().unwrap());
            let length = u32::from_be_bytes(rest[12..16].try_into().unwrap());
            let kind = *asked.get(cookie as usize).unwrap_or_else(|| panic!("chunk with unknown cookie {cookie}"));
            assert_eq!(flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE, "cookie {cookie}");
            let mut payload = vec![0u8; length as usize];
            stream.read_exact(&mut payload).await.unwrap();
            match kind {
                Asked::Read { offset, length } => {
                    assert_eq!(chunk_type, REPLY_TYPE_OFFSET_DATA, "cookie {cookie}");
                    assert_eq!(payload.len(), 8 + length as usize, "cookie {cookie}");
                    assert_eq!(u64::from_be_bytes(payload[0..8].try_into().unwrap()), offset, "cookie {cookie}");
                    for (i, &byte) in payload[8..].iter().enumerate() {
                        let at = offset + i as u64;
                        assert_eq!(byte, pattern(at), "cookie {cookie}: byte {i} (volume offset {at}) is another reply's");
                    }
                }
                Asked::BadRead => assert!(chunk_type & 0x8000 != 0, "cookie {cookie}: chunk {chunk_type:#x}"),
                other => panic!("structured chunk for {other:?} (cookie {cookie})"),
            }
            cookie
        }
        other => panic!("bad reply magic {other:#x}: replies interleaved or an offset is wrong"),
    }
}

/// Send `count` mixed requests from a background task while this one reads the
/// replies in dribbles (small reads with pauses, so the server's socket buffer keeps
/// filling and emptying: direct writes go in part, the writer takes over mid-reply,
/// and the reactor and blocking threads race for the line). Every reply must arrive
/// once, whole and correct; then the connection still works.
async fn dribbling_reader<S>(stream: S, count: u64)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (reader, mut writer) = tokio::io::split(stream);
    let (bytes, asked) = mixed_requests(count);
    let sending = tokio::spawn(async move {
        writer.write_all(&bytes).await.unwrap();
        writer
    });
    let mut reader = tokio::io::BufReader::with_capacity(8 << 10, Dribble { inner: reader, reads: 0 });
    let mut seen = vec![false; count as usize];
    for _ in 0..count {
        let cookie = read_and_check(&mut reader, &asked).await;
        assert!(!std::mem::replace(&mut seen[cookie as usize], true), "cookie {cookie} answered twice");
    }
    let writer = sending.await.unwrap();
    // nothing more arrives, and the connection still serves
    let mut stream = reader.into_inner().inner.unsplit(writer);
    let extra = tokio::time::timeout(Duration::from_millis(200), stream.read_u8()).await;
    assert!(extra.is_err(), "bytes after the last reply: {extra:?}");
    stream.write_all(&request_bytes(0, CMD_READ, 0, 4096, 4096, &[])).await.unwrap();
    assert_eq!(read_and_check(&mut stream, &[Asked::Read { offset: 4096, length: 4096 }]).await, 0);
}

/// A reader that takes at most 4 KiB per read and sleeps a little every 16 reads.
struct Dribble<R> {
    inner: R,
    reads: u64,
}

impl<R: AsyncRead + Unpin> AsyncRead for Dribble<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.reads += 1;
        if self.reads % 16 == 0 {
            // a pause: the socket fills meanwhile (woken by a short timer thread)
            let waker = cx.waker().clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2));
                waker.wake();
            });
            self.reads += 1;
            return std::task::Poll::Pending;
        }
        let mut small = [0u8; 4096];
        let want = buf.remaining().min(small.len());
        let mut small_buf = tokio::io::ReadBuf::new(&mut small[..want]);
        let inner = std::pin::Pin::new(&mut self.inner);
        let poll = inner.poll_read(cx, &mut small_buf);
        if let std::task::Poll::Ready(Ok(())) = &poll {
            buf.put_slice(small_buf.filled());
        }
        poll
    }
}

async fn stop(harness: Harness) {
    harness.shutdown.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), harness.task).await.expect("server stopped");
}

/// The dribbling reader made both reply paths work: written by the finishing thread,
/// and by the writer task.
fn assert_both_reply_paths_used(harness: &Harness) {
    let written = harness.server.stats().replies_written_by_writer.load(std::sync::atomic::Ordering::Relaxed);
    let direct = harness.server.stats().replies_written_direct.load(std::sync::atomic::Ordering::Relaxed);
    assert!(written > 0 && direct > 0, "both paths used: writer {written}, direct {direct}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_replies_to_a_dribbling_reader_arrive_whole_once_tcp() {
    let (harness, Listen::Tcp(addr)) = start(false).await else { unreachable!() };
    let mut stream = TcpStream::connect(addr).await.unwrap();
    handshake(&mut stream).await;
    dribbling_reader(stream, 1200).await;
    assert_both_reply_paths_used(&harness);
    stop(harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_replies_to_a_dribbling_reader_arrive_whole_once_unix() {
    let (harness, Listen::Unix(path, _dir)) = start(true).await else { unreachable!() };
    let mut stream = UnixStream::connect(&path).await.unwrap();
    handshake(&mut stream).await;
    dribbling_reader(stream, 1200).await;
    assert_both_reply_paths_used(&harness);
    stop(harness).await;
}

/// A client that sends its requests and then shuts its write side down (FIN) still
/// gets every reply, then an orderly close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_client_gets_every_reply_then_eof() {
    let (harness, Listen::Tcp(addr)) = start(false).await else { unreachable!() };
    let mut stream = TcpStream::connect(addr).await.unwrap();
    handshake(&mut stream).await;
    let count = 200;
    let (bytes, asked) = mixed_requests(count);
    let (mut reader, mut writer) = stream.into_split();
    let sending = tokio::spawn(async move {
        writer.write_all(&bytes).await.unwrap();
        writer.shutdown().await.unwrap();
        writer
    });
    let mut seen = vec![false; count as usize];
    for _ in 0..count {
        let cookie = read_and_check(&mut reader, &asked).await;
        assert!(!std::mem::replace(&mut seen[cookie as usize], true), "cookie {cookie} answered twice");
    }
    let _writer = sending.await.unwrap();
    let mut byte = [0u8; 1];
    let end = tokio::time::timeout(Duration::from_secs(5), reader.read(&mut byte)).await.expect("server closes");
    assert_eq!(end.unwrap(), 0, "EOF after the last reply");
    stop(harness).await;
}

/// Clients that reset their connection (RST) with many replies in flight, at
/// different moments: every reply's budget comes back (none is lost between a failed
/// direct write and the writer), the server stays up and serves the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_resetting_with_replies_in_flight_return_every_budget() {
    let (harness, Listen::Tcp(addr)) = start(false).await else { unreachable!() };
    for round in 0..12u64 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        handshake(&mut stream).await;
        let (bytes, asked) = mixed_requests(400);
        stream.write_all(&bytes).await.unwrap();
        // read a few replies, some rounds none
        for _ in 0..round % 4 {
            read_and_check(&mut stream, &asked).await;
        }
        tokio::time::sleep(Duration::from_millis(round * 7 % 30)).await;
        #[allow(deprecated)] // the blocking close is the point: an RST
        stream.set_linger(Some(Duration::ZERO)).unwrap();
        drop(stream);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let memory = harness.frontend.memory.stats();
        let calls = harness.frontend.volume_calls.stats();
        let active = harness.server.stats().connections_active.load(std::sync::atomic::Ordering::Relaxed);
        if memory.in_use == 0 && calls.in_use == 0 && active == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "budget or connections held after resets: {memory:?} {calls:?} active {active}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut stream = TcpStream::connect(addr).await.unwrap();
    handshake(&mut stream).await;
    stream.write_all(&request_bytes(0, CMD_READ, 0, 0, 4096, &[])).await.unwrap();
    assert_eq!(read_and_check(&mut stream, &[Asked::Read { offset: 0, length: 4096 }]).await, 0);
    stop(harness).await;
}
