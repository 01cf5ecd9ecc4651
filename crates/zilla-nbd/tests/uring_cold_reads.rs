//! Unfriendly clients against cold reads answered from io_uring completions: a real
//! pool on file leaves (the io_uring engine), the ARC emptied by export/import, and
//! clients that pipeline hundreds of cold READs and then vanish, stop reading, or read
//! while the copies the asynchronous path picks first are bad.
//!
//! Every reply is checked whole (cookie once, every byte); budgets must come back.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use zilla_core::spa::Pool;
use zilla_core::vdev::label::DATA_START;
use zilla_core::vdev::IoClass;
use zilla_nbd::proto::*;
use zilla_nbd::{Frontend, FrontendConfig, NbdConfig, NbdServer, StaticRegistry};

const DEV_SIZE: u64 = 96 << 20;
const VOLSIZE: u64 = 32 << 20;
const BS: u64 = 16384;
const DATA: u64 = 16 << 20;

fn pattern_at(off: u64) -> u8 {
    ((off / 512).wrapping_mul(2654435761) >> 7) as u8 ^ (off as u8)
}

fn expected(off: u64, len: u64) -> Vec<u8> {
    (off..off + len).map(pattern_at).collect()
}

struct Rig {
    _dir: tempfile::TempDir,
    paths: Vec<PathBuf>,
    pool: Arc<Pool>,
    frontend: Arc<Frontend>,
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// A cold pool (imported again after the data was written), the L1 indirects cached
/// so reads take the asynchronous path, served over NBD. None without io_uring.
async fn rig(name: &str, config: NbdConfig) -> Option<Rig> {
    let dir = tempfile::tempdir().unwrap();
    let Some((pool, paths)) = cold_uring_pool(dir.path(), name, DEV_SIZE, VOLSIZE, BS, DATA, expected) else {
        eprintln!("no io_uring here: skipped");
        return None;
    };
    let mut registry = StaticRegistry::new();
    registry.insert("pool/vol", "", pool.open_volume("vol").unwrap());
    let frontend = Frontend::new(Arc::new(registry), FrontendConfig::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let server = NbdServer::with_frontend(frontend.clone(), config);
    let task = tokio::spawn(async move { server.serve_tcp(listener, shutdown_rx).await });
    Some(Rig { _dir: dir, paths, pool, frontend, addr, shutdown, task })
}

impl Rig {
    /// Empty the ARC of data blocks (keeps the indirects: evict only L0s).
    fn evict_data(&self) {
        let root = self.pool.debug_volume_root("vol").unwrap();
        for blk in 0..DATA / BS {
            let bp = zilla_core::dmu::lookup(self.pool.debug_io(), &root, zilla_core::BlockId(blk), IoClass::SyncRead).unwrap();
            let d = bp.dva[0];
            self.pool.debug_io().forget_cached(&zilla_core::arc::BlockKey { vdev: d.vdev, offset: d.offset, birth: bp.birth });
        }
    }

    async fn budgets_return(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (m, c) = (self.frontend.memory.stats(), self.frontend.volume_calls.stats());
            if m.in_use == 0 && c.in_use == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: budgets still held: memory {m:?}, calls {c:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Pipeline reads of every block in `blocks`, then read and check every reply.
    async fn read_all_checked(&self, blocks: &[u64]) {
        let mut client = RawClient::open(self.addr, "pool/vol").await;
        let mut bytes = Vec::new();
        for &b in blocks {
            bytes.extend(req(CMD_READ, b, b * BS, BS as u32));
        }
        let writer = {
            let (mut rd, mut wr) = client.stream.into_split();
            let w = tokio::spawn(async move {
                wr.write_all(&bytes).await.unwrap();
                wr
            });
            let mut seen = HashSet::new();
            while seen.len() < blocks.len() {
                let chunk = tokio::time::timeout(Duration::from_secs(30), read_chunk(&mut rd)).await.expect("a reply never came");
                assert_eq!(chunk.flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
                assert!(seen.insert(chunk.cookie), "cookie {} answered twice", chunk.cookie);
                let b = chunk.cookie;
                match chunk.chunk_type {
                    REPLY_TYPE_OFFSET_DATA => {
                        assert_eq!(u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap()), b * BS);
                        assert!(chunk.payload[8..] == expected(b * BS, BS)[..], "block {b}: wrong bytes");
                    }
                    other => panic!("block {b}: chunk type {other:#x} (an error?) payload {:?}", &chunk.payload[..chunk.payload.len().min(16)]),
                }
            }
            let wr = w.await.unwrap();
            rd.reunite(wr).unwrap()
        };
        client.stream = writer;
        drop(client);
    }

    async fn stop(self) {
        self.shutdown.send(true).unwrap();
        let stopped = tokio::time::timeout(Duration::from_secs(15), self.task).await;
        assert!(stopped.is_ok(), "server did not stop");
        let pool = self.pool.clone();
        let exported = tokio::task::spawn_blocking(move || pool.export());
        let r = tokio::time::timeout(Duration::from_secs(30), exported).await.expect("export hangs");
        r.unwrap().expect("export");
    }
}

async fn read_chunk(rd: &mut tokio::net::tcp::OwnedReadHalf) -> Chunk {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 20];
    rd.read_exact(&mut header).await.unwrap();
    assert_eq!(u32::from_be_bytes(header[0..4].try_into().unwrap()), STRUCTURED_REPLY_MAGIC);
    let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
    let mut payload = vec![0u8; length as usize];
    rd.read_exact(&mut payload).await.unwrap();
    Chunk {
        flags: u16::from_be_bytes(header[4..6].try_into().unwrap()),
        chunk_type: u16::from_be_bytes(header[6..8].try_into().unwrap()),
        cookie: u64::from_be_bytes(header[8..16].try_into().unwrap()),
        payload,
    }
}

fn req(command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    request_bytes(0, command, cookie, offset, length, &[])
}

fn all_blocks() -> Vec<u64> {
    // a spread order, so consecutive requests hit different places
    let n = DATA / BS;
    (0..n).map(|i| (i * 389) % n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_vanish_or_stop_reading_mid_cold_reads_return_their_budgets() {
    let config = NbdConfig { reply_stall_timeout: Duration::from_millis(800), ..NbdConfig::default() };
    let Some(rig) = rig("nvan", config).await else { return };
    for round in 0..3 {
        rig.evict_data();
        // vanishers: pipeline every block cold, then reset (linger 0) at once
        for _ in 0..4 {
            let mut c = RawClient::open(rig.addr, "pool/vol").await;
            let mut bytes = Vec::new();
            for b in all_blocks() {
                bytes.extend(req(CMD_READ, b, b * BS, BS as u32));
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), c.stream.write_all(&bytes)).await;
            #[allow(deprecated)] // the point: a reset with replies in flight
            c.stream.set_linger(Some(Duration::ZERO)).unwrap();
            drop(c);
        }
        // a staller: sends everything, never reads
        let mut staller = RawClient::open(rig.addr, "pool/vol").await;
        let mut bytes = Vec::new();
        for b in all_blocks() {
            bytes.extend(req(CMD_READ, b, b * BS, BS as u32));
        }
        let staller = tokio::spawn(async move {
            let _ = staller.stream.write_all(&bytes).await;
            staller
        });
        // a well-behaved client meanwhile gets every byte right
        rig.evict_data();
        rig.read_all_checked(&all_blocks()[..256]).await;
        rig.budgets_return(&format!("round {round}")).await;
        staller.abort();
    }
    rig.evict_data();
    rig.read_all_checked(&all_blocks()).await;
    rig.budgets_return("end").await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_reads_over_bad_copies_return_good_bytes_and_heal() {
    // Goal: with every data copy on one child bad (then on the other), pipelined cold
    // READs all return the right bytes (the blocking fallback reads the other child),
    // the bad copies are healed, and each bad copy is counted at most once.
    let Some(rig) = rig("nbad", NbdConfig::default()).await else { return };
    let root = rig.pool.debug_volume_root("vol").unwrap();
    for (round, victim) in [1usize, 0].into_iter().enumerate() {
        rig.evict_data();
        let path = rig.paths[victim].clone();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut damaged = 0u64;
        for blk in 0..DATA / BS {
            if blk % 3 != round as u64 {
                continue;
            }
            let bp = zilla_core::dmu::lookup(rig.pool.debug_io(), &root, zilla_core::BlockId(blk), IoClass::SyncRead).unwrap();
            let d = bp.dva[0];
            f.write_all_at(&vec![0xa5 ^ blk as u8; d.asize as usize], DATA_START + d.offset).unwrap();
            damaged += 1;
        }
        f.sync_all().unwrap();
        drop(f);
        let name = path.display().to_string();
        let cksum = |rig: &Rig| {
            let s = rig.pool.status();
            s.config.iter().flat_map(|t| t.children.iter()).find(|c| c.name == name).map(|c| c.cksum_errors).unwrap()
        };
        let before = cksum(&rig);
        rig.read_all_checked(&all_blocks()).await;
        let counted = cksum(&rig) - before;
        assert!(counted <= damaged, "round {round}: {damaged} bad copies, {counted} checksum errors counted on {name}");
        assert!(counted > 0, "round {round}: no bad copy was met");
        // reading again cold meets no bad copy that was met before (healed)
        rig.evict_data();
        let before = cksum(&rig);
        rig.read_all_checked(&all_blocks()).await;
        let again = cksum(&rig) - before;
        assert!(again <= damaged - counted, "round {round}: {again} checksum errors on a second pass ({counted} healed of {damaged})");
        rig.budgets_return(&format!("bad copies round {round}")).await;
        // heal the rest for the next round
        rig.pool.scrub(zilla_core::spa::ScrubCmd::Start).unwrap();
        rig.pool.scrub_wait().unwrap();
    }
    assert_eq!(rig.pool.status().data_errors, 0);
    rig.stop().await;
}
