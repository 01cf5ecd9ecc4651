//! Shared helpers for the zilla-nbd integration tests: volume wrappers, an in-process
//! server on an ephemeral port, and a raw NBD client that speaks bytes, so tests can
//! send exactly what a broken or hostile client would.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use zilla_core::memvol::MemVolume;
use zilla_core::zvol::{BlockVolume, Extent, SharedSlice};
use zilla_nbd::proto::*;
use zilla_nbd::{NbdConfig, NbdServer, StaticRegistry};

/// One NBD request on the wire: the 28-byte header, then `payload`.
pub fn request_bytes(flags: u16, command: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(28 + payload.len());
    bytes.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(&command.to_be_bytes());
    bytes.extend_from_slice(&cookie.to_be_bytes());
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// A MemVolume whose `try_read_cached` serves every read (it is all memory), so the
/// server's inline fast path is exercised.
pub struct CachedVolume(pub MemVolume);

/// A MemVolume that serves every read as shared pieces (`try_read_cached_shared`), one
/// per 4 KiB block, each a slice of its own buffer, so the server's zero-copy path and
/// its vectored writes of many pieces are exercised.
pub struct SharedVolume(pub MemVolume);

/// A MemVolume whose reads at offset 0 take `delay`, to force out-of-order replies.
pub struct SlowVolume {
    pub inner: MemVolume,
    pub delay: Duration,
}

macro_rules! forward_volume {
    ($ty:ty, $inner:tt) => {
        impl BlockVolume for $ty {
            fn name(&self) -> String { self.$inner.name() }
            fn size(&self) -> u64 { self.$inner.size() }
            fn block_size(&self) -> u32 { self.$inner.block_size() }
            fn read_only(&self) -> bool { self.$inner.read_only() }
            fn write(&self, offset: u64, data: &[u8], fua: bool) -> zilla_core::Result<()> { self.$inner.write(offset, data, fua) }
            fn flush(&self) -> zilla_core::Result<()> { self.$inner.flush() }
            fn unmap(&self, offset: u64, len: u64) -> zilla_core::Result<()> { self.$inner.unmap(offset, len) }
            fn write_zeroes(&self, offset: u64, len: u64) -> zilla_core::Result<()> { self.$inner.write_zeroes(offset, len) }
            fn block_status(&self, offset: u64, len: u64) -> zilla_core::Result<Vec<Extent>> { self.$inner.block_status(offset, len) }
            fn read(&self, offset: u64, buf: &mut [u8]) -> zilla_core::Result<()> { self.slow_read(offset, buf) }
            fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<zilla_core::Result<()>> { self.cached_read(offset, buf) }
            fn try_read_cached_shared(&self, offset: u64, len: u64) -> Option<zilla_core::Result<Vec<SharedSlice>>> { self.shared_read(offset, len) }
        }
    };
}

impl CachedVolume {
    fn slow_read(&self, offset: u64, buf: &mut [u8]) -> zilla_core::Result<()> {
        self.0.read(offset, buf)
    }
    fn cached_read(&self, offset: u64, buf: &mut [u8]) -> Option<zilla_core::Result<()>> {
        Some(self.0.read(offset, buf))
    }
    fn shared_read(&self, _offset: u64, _len: u64) -> Option<zilla_core::Result<Vec<SharedSlice>>> {
        None
    }
}
forward_volume!(CachedVolume, 0);

impl SharedVolume {
    fn slow_read(&self, offset: u64, buf: &mut [u8]) -> zilla_core::Result<()> {
        self.0.read(offset, buf)
    }
    fn cached_read(&self, _offset: u64, _buf: &mut [u8]) -> Option<zilla_core::Result<()>> {
        None
    }
    fn shared_read(&self, offset: u64, len: u64) -> Option<zilla_core::Result<Vec<SharedSlice>>> {
        const BLOCK: u64 = 4096;
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let block_start = at / BLOCK * BLOCK;
            let mut block = vec![0u8; BLOCK as usize];
            if let Err(error) = self.0.read(block_start, &mut block) {
                return Some(Err(error));
            }
            let piece_len = (block_start + BLOCK).min(offset + len) - at;
            pieces.push(SharedSlice::new(Arc::new(zilla_core::vdev::abd::AlignedBuf::from(block)), (at - block_start) as usize, piece_len as usize).unwrap());
            at += piece_len;
        }
        Some(Ok(pieces))
    }
}
forward_volume!(SharedVolume, 0);

impl SlowVolume {
    fn slow_read(&self, offset: u64, buf: &mut [u8]) -> zilla_core::Result<()> {
        if offset == 0 {
            std::thread::sleep(self.delay);
        }
        self.inner.read(offset, buf)
    }
    fn cached_read(&self, _offset: u64, _buf: &mut [u8]) -> Option<zilla_core::Result<()>> {
        None
    }
    fn shared_read(&self, _offset: u64, _len: u64) -> Option<zilla_core::Result<Vec<SharedSlice>>> {
        None
    }
}
forward_volume!(SlowVolume, inner);

pub const VOLUME_BYTES: u64 = 1 << 20;

/// A server on 127.0.0.1:ephemeral serving the given registry.
pub struct TestServer {
    pub addr: SocketAddr,
    pub shutdown: watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub async fn start(registry: StaticRegistry, config: NbdConfig) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let server = NbdServer::new(Arc::new(registry), config);
    let task = tokio::spawn(async move { server.serve_tcp(listener, shutdown_rx).await });
    TestServer { addr, shutdown, task }
}

/// The standard registry: pool/vol (1 MiB, rw), pool/ro (read-only), pool/slow.
pub fn standard_registry() -> StaticRegistry {
    let mut registry = StaticRegistry::new();
    registry.insert("pool/vol", "test volume", Arc::new(MemVolume::new("pool/vol", VOLUME_BYTES, 4096)));
    let mut ro = MemVolume::new("pool/ro", VOLUME_BYTES, 4096);
    ro.set_read_only(true);
    registry.insert("pool/ro", "", Arc::new(ro));
    let slow = SlowVolume { inner: MemVolume::new("pool/slow", VOLUME_BYTES, 4096), delay: Duration::from_millis(400) };
    registry.insert("pool/slow", "", Arc::new(slow));
    registry
}

pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

pub struct Chunk {
    pub flags: u16,
    pub chunk_type: u16,
    pub cookie: u64,
    pub payload: Vec<u8>,
}

/// A byte-level NBD client.
pub struct RawClient {
    pub stream: TcpStream,
}

impl RawClient {
    /// Connect and complete the greeting (client flags FIXED_NEWSTYLE|NO_ZEROES).
    pub async fn connect(addr: SocketAddr) -> RawClient {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).await.unwrap();
        assert_eq!(u64::from_be_bytes(greeting[0..8].try_into().unwrap()), NBD_MAGIC);
        assert_eq!(u64::from_be_bytes(greeting[8..16].try_into().unwrap()), IHAVEOPT);
        assert_eq!(u16::from_be_bytes(greeting[16..18].try_into().unwrap()), 3);
        stream.write_all(&3u32.to_be_bytes()).await.unwrap();
        RawClient { stream }
    }

    pub async fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&IHAVEOPT.to_be_bytes());
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(data);
        self.stream.write_all(&bytes).await.unwrap();
    }

    pub async fn read_option_reply(&mut self) -> OptionReply {
        let mut header = [0u8; 20];
        self.stream.read_exact(&mut header).await.unwrap();
        assert_eq!(u64::from_be_bytes(header[0..8].try_into().unwrap()), OPTION_REPLY_MAGIC);
        let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
        let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
        let mut data = vec![0u8; length as usize];
        self.stream.read_exact(&mut data).await.unwrap();
        OptionReply { option, reply_type, data }
    }

    pub async fn structured_reply(&mut self) {
        self.send_option(OPT_STRUCTURED_REPLY, &[]).await;
        assert_eq!(self.read_option_reply().await.reply_type, REP_ACK);
    }

    /// SET_META_CONTEXT with the given queries; returns the selected context ids.
    pub async fn set_meta_context(&mut self, export: &str, queries: &[&str]) -> Vec<(u32, String)> {
        self.send_option(OPT_SET_META_CONTEXT, &meta_context_data(export, queries)).await;
        let mut selected = Vec::new();
        loop {
            let reply = self.read_option_reply().await;
            match reply.reply_type {
                REP_META_CONTEXT => {
                    let id = u32::from_be_bytes(reply.data[0..4].try_into().unwrap());
                    selected.push((id, String::from_utf8(reply.data[4..].to_vec()).unwrap()));
                }
                REP_ACK => return selected,
                other => panic!("unexpected reply {other:#x}"),
            }
        }
    }

    /// OPT_GO; returns (size, transmission flags) or the error reply type.
    pub async fn go(&mut self, export: &str) -> Result<(u64, u16), u32> {
        self.send_option(OPT_GO, &export_request_data(export, &[INFO_NAME, INFO_BLOCK_SIZE])).await;
        let mut export_info = None;
        loop {
            let reply = self.read_option_reply().await;
            match reply.reply_type {
                REP_INFO => {
                    let info_type = u16::from_be_bytes(reply.data[0..2].try_into().unwrap());
                    if info_type == INFO_EXPORT {
                        assert_eq!(reply.data.len(), 12);
                        let size = u64::from_be_bytes(reply.data[2..10].try_into().unwrap());
                        let flags = u16::from_be_bytes(reply.data[10..12].try_into().unwrap());
                        export_info = Some((size, flags));
                    }
                }
                REP_ACK => return Ok(export_info.expect("INFO_EXPORT before ACK")),
                error => return Err(error),
            }
        }
    }

    /// Structured replies on, then GO.
    pub async fn open(addr: SocketAddr, export: &str) -> RawClient {
        let mut client = RawClient::connect(addr).await;
        client.structured_reply().await;
        client.go(export).await.unwrap();
        client
    }

    pub async fn send_request(&mut self, flags: u16, command: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) {
        self.stream.write_all(&request_bytes(flags, command, cookie, offset, length, payload)).await.unwrap();
    }

    /// Read a simple reply header: (error, cookie).
    pub async fn read_simple_reply(&mut self) -> (u32, u64) {
        let mut header = [0u8; 16];
        self.stream.read_exact(&mut header).await.unwrap();
        assert_eq!(u32::from_be_bytes(header[0..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
        (u32::from_be_bytes(header[4..8].try_into().unwrap()), u64::from_be_bytes(header[8..16].try_into().unwrap()))
    }

    pub async fn read_chunk(&mut self) -> Chunk {
        let mut header = [0u8; 20];
        self.stream.read_exact(&mut header).await.unwrap();
        assert_eq!(u32::from_be_bytes(header[0..4].try_into().unwrap()), STRUCTURED_REPLY_MAGIC);
        let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
        let mut payload = vec![0u8; length as usize];
        self.stream.read_exact(&mut payload).await.unwrap();
        Chunk {
            flags: u16::from_be_bytes(header[4..6].try_into().unwrap()),
            chunk_type: u16::from_be_bytes(header[6..8].try_into().unwrap()),
            cookie: u64::from_be_bytes(header[8..16].try_into().unwrap()),
            payload,
        }
    }

    /// Structured read of `length` bytes expecting one DONE data chunk.
    pub async fn read_data(&mut self, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
        self.send_request(0, CMD_READ, cookie, offset, length, &[]).await;
        let chunk = self.read_chunk().await;
        assert_eq!(chunk.cookie, cookie);
        assert_eq!(chunk.flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
        match chunk.chunk_type {
            REPLY_TYPE_OFFSET_DATA => {
                assert_eq!(u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap()), offset);
                chunk.payload[8..].to_vec()
            }
            REPLY_TYPE_OFFSET_HOLE => vec![0u8; length as usize],
            other => panic!("unexpected chunk type {other:#x}"),
        }
    }

    pub async fn write(&mut self, cookie: u64, offset: u64, data: &[u8]) -> u32 {
        self.send_request(0, CMD_WRITE, cookie, offset, data.len() as u32, data).await;
        let (error, reply_cookie) = self.read_simple_reply().await;
        assert_eq!(reply_cookie, cookie);
        error
    }

    /// True once the server has closed the connection (EOF within `wait`).
    pub async fn closed_within(&mut self, wait: Duration) -> bool {
        let mut byte = [0u8; 1];
        matches!(tokio::time::timeout(wait, self.stream.read(&mut byte)).await, Ok(Ok(0)) | Ok(Err(_)))
    }
}

pub fn export_request_data(export: &str, info_types: &[u16]) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend_from_slice(&(export.len() as u32).to_be_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&(info_types.len() as u16).to_be_bytes());
    for info in info_types {
        data.extend_from_slice(&info.to_be_bytes());
    }
    data
}

pub fn meta_context_data(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend_from_slice(&(export.len() as u32).to_be_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// A cold pool for io_uring read tests: `name` on a mirror of two files of `dev_bytes`
/// in `dir`, volume "vol" of `volsize` bytes in blocks of `bs`, its first `data` bytes
/// written 1 MiB at a time with `fill(offset, len)`, synced, exported and imported again
/// (ARC empty), then the L1 indirects read so a cold read of one block takes the
/// asynchronous path. None (the pool exported) where a leaf does not run io_uring.
pub fn cold_uring_pool(
    dir: &std::path::Path,
    name: &str,
    dev_bytes: u64,
    volsize: u64,
    bs: u64,
    data: u64,
    fill: impl Fn(u64, u64) -> Vec<u8>,
) -> Option<(Arc<zilla_core::spa::Pool>, Vec<std::path::PathBuf>)> {
    use zilla_core::spa::{CreateOptions, Pool, TopSpec};
    use zilla_core::vdev::{IoClass, LeafSpec, Role};
    let paths: Vec<std::path::PathBuf> = (0..2).map(|i| dir.join(format!("{name}{i}"))).collect();
    for p in &paths {
        std::fs::File::create(p).unwrap().set_len(dev_bytes).unwrap();
    }
    let specs = || -> Vec<LeafSpec> { paths.iter().map(|p| LeafSpec { path: p.clone(), model: None }).collect() };
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: specs() }];
    let pool = Pool::create(name, tops, CreateOptions::default()).expect("create");
    if pool.debug_leaves().iter().any(|l| l.queue.engine() != zilla_core::vdev::queue::EngineKind::Uring) {
        pool.export().unwrap();
        return None;
    }
    pool.volume_create("vol", volsize, bs as u32, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    for off in (0..data).step_by(1 << 20) {
        v.write(off, &fill(off, 1 << 20), false).unwrap();
    }
    v.flush().unwrap();
    pool.sync().unwrap();
    drop(v);
    pool.export().unwrap();
    drop(pool);
    let pool = Pool::import_leaves(&specs()).expect("import");
    let root = pool.debug_volume_root("vol").unwrap();
    for blk in (0..data / bs).step_by(64) {
        zilla_core::dmu::lookup(pool.debug_io(), &root, zilla_core::BlockId(blk), IoClass::SyncRead).unwrap();
    }
    Some((pool, paths))
}
