//! Protocol conformance tests with a raw byte-level client.
//!
//! Goal: every handshake and transmission rule the server promises, including its
//! answers to malformed and hostile input. Method: an in-process server on an
//! ephemeral port over MemVolume-backed exports, driven by `common::RawClient`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zilla_core::memvol::MemVolume;
use zilla_nbd::proto::*;
use zilla_nbd::{NbdConfig, StaticRegistry};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_happy_path_and_data_round_trip() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut client = RawClient::connect(server.addr).await;
    client.structured_reply().await;
    client.send_option(OPT_INFO, &export_request_data("pool/vol", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE])).await;
    let mut infos = Vec::new();
    loop {
        let reply = client.read_option_reply().await;
        assert_eq!(reply.option, OPT_INFO);
        if reply.reply_type == REP_ACK {
            break;
        }
        assert_eq!(reply.reply_type, REP_INFO);
        infos.push(reply.data);
    }
    let export = infos.iter().find(|d| d[0..2] == INFO_EXPORT.to_be_bytes()).unwrap();
    assert_eq!(u64::from_be_bytes(export[2..10].try_into().unwrap()), VOLUME_BYTES);
    let name = infos.iter().find(|d| d[0..2] == INFO_NAME.to_be_bytes()).unwrap();
    assert_eq!(&name[2..], b"pool/vol");
    let description = infos.iter().find(|d| d[0..2] == INFO_DESCRIPTION.to_be_bytes()).unwrap();
    assert_eq!(&description[2..], b"test volume");
    let block_size = infos.iter().find(|d| d[0..2] == INFO_BLOCK_SIZE.to_be_bytes()).unwrap();
    assert_eq!(u32::from_be_bytes(block_size[2..6].try_into().unwrap()), 1);
    assert_eq!(u32::from_be_bytes(block_size[6..10].try_into().unwrap()), 4096);
    assert_eq!(u32::from_be_bytes(block_size[10..14].try_into().unwrap()), 32 << 20);

    let (size, flags) = client.go("pool/vol").await.unwrap();
    assert_eq!(size, VOLUME_BYTES);
    let expected = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_DF | FLAG_CAN_MULTI_CONN | FLAG_SEND_CACHE | FLAG_SEND_FAST_ZERO;
    assert_eq!(flags, expected, "flags {flags:#06x}");

    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(client.write(1, 4096, &data).await, 0);
    assert_eq!(client.read_data(2, 4096, 8192).await, data);
    // Unaligned I/O is allowed: we advertise a minimum block size of 1.
    assert_eq!(client.read_data(3, 4097, 3).await, data[1..4]);
    client.send_request(CMD_FLAG_FUA, CMD_WRITE, 4, 100, 3, b"abc").await;
    assert_eq!(client.read_simple_reply().await, (0, 4));
    client.send_request(0, CMD_FLUSH, 5, 0, 0, &[]).await;
    assert_eq!(client.read_simple_reply().await, (0, 5));
    client.send_request(0, CMD_CACHE, 6, 0, 4096, &[]).await;
    assert_eq!(client.read_simple_reply().await, (0, 6));
    client.send_request(0, CMD_DISC, 7, 0, 0, &[]).await;
    assert!(client.closed_within(2 * SECOND).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_unknown_export_then_list_then_unknown_option() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut client = RawClient::connect(server.addr).await;
    assert_eq!(client.go("pool/nope").await, Err(REP_ERR_UNKNOWN));
    // Several exports exist, so the empty name is ambiguous.
    assert_eq!(client.go("").await, Err(REP_ERR_UNKNOWN));

    client.send_option(OPT_LIST, &[]).await;
    let mut names = Vec::new();
    loop {
        let reply = client.read_option_reply().await;
        if reply.reply_type == REP_ACK {
            break;
        }
        assert_eq!(reply.reply_type, REP_SERVER);
        let length = u32::from_be_bytes(reply.data[0..4].try_into().unwrap()) as usize;
        names.push(String::from_utf8(reply.data[4..4 + length].to_vec()).unwrap());
    }
    assert_eq!(names, vec!["pool/ro", "pool/slow", "pool/vol"]);
    client.send_option(OPT_LIST, b"junk").await;
    assert_eq!(client.read_option_reply().await.reply_type, REP_ERR_INVALID);

    for option in [99u32, OPT_STARTTLS, 11, 0xdead_beef] {
        client.send_option(option, b"some data").await;
        let reply = client.read_option_reply().await;
        assert_eq!((reply.option, reply.reply_type), (option, REP_ERR_UNSUP));
    }
    // Malformed INFO data is ERR_INVALID, and the handshake goes on.
    client.send_option(OPT_GO, &[0, 0, 0, 9, b'x']).await;
    assert_eq!(client.read_option_reply().await.reply_type, REP_ERR_INVALID);
    // Oversized option data is skipped without allocation and refused.
    client.send_option(OPT_INFO, &vec![0u8; 70_000]).await;
    assert_eq!(client.read_option_reply().await.reply_type, REP_ERR_TOO_BIG);
    // Without structured replies, GO still works and reads get simple replies.
    let (_, flags) = client.go("pool/vol").await.unwrap();
    assert_eq!(flags & FLAG_SEND_DF, 0, "DF must not be offered without structured replies");
    client.send_request(0, CMD_READ, 9, 0, 512, &[]).await;
    assert_eq!(client.read_simple_reply().await, (0, 9));
    let mut data = vec![0u8; 512];
    tokio::io::AsyncReadExt::read_exact(&mut client.stream, &mut data).await.unwrap();
    assert!(data.iter().all(|&b| b == 0));
    // DF without structured replies is an invalid flag.
    client.send_request(CMD_FLAG_DF, CMD_READ, 10, 0, 512, &[]).await;
    assert_eq!(client.read_simple_reply().await, (NBD_EINVAL, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_export_name_and_legacy_export_name_option() {
    let mut registry = StaticRegistry::new();
    registry.insert("tank/only", "", Arc::new(MemVolume::new("tank/only", 65536, 4096)));
    let server = start(registry, NbdConfig::default()).await;
    let mut client = RawClient::connect(server.addr).await;
    client.send_option(OPT_EXPORT_NAME, b"").await;
    let mut reply = [0u8; 10];
    tokio::io::AsyncReadExt::read_exact(&mut client.stream, &mut reply).await.unwrap();
    assert_eq!(u64::from_be_bytes(reply[0..8].try_into().unwrap()), 65536);
    // NO_ZEROES was negotiated: the next bytes are replies, not 124 zeros.
    client.send_request(0, CMD_FLUSH, 1, 0, 0, &[]).await;
    assert_eq!(client.read_simple_reply().await, (0, 1));

    let mut client = RawClient::connect(server.addr).await;
    client.send_option(OPT_EXPORT_NAME, b"tank/missing").await;
    assert!(client.closed_within(2 * SECOND).await, "unknown EXPORT_NAME closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_magic_disconnects_cleanly() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut client = RawClient::connect(server.addr).await;
    client.stream.write_all(&[0xAB; 16]).await.unwrap();
    assert!(client.closed_within(2 * SECOND).await, "bad option magic closes");

    let mut client = RawClient::open(server.addr, "pool/vol").await;
    client.stream.write_all(&[0xCD; 28]).await.unwrap();
    assert!(client.closed_within(2 * SECOND).await, "bad request magic closes");

    // Unknown client flags close the connection before any option.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut greeting = [0u8; 18];
    tokio::io::AsyncReadExt::read_exact(&mut stream, &mut greeting).await.unwrap();
    stream.write_all(&0x8000_0001u32.to_be_bytes()).await.unwrap();
    let mut client = RawClient { stream };
    assert!(client.closed_within(2 * SECOND).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut client = RawClient::open(server.addr, "pool/vol").await;
    // Unknown command.
    client.send_request(0, 42, 1, 0, 0, &[]).await;
    assert_eq!(client.read_simple_reply().await, (NBD_EINVAL, 1));
    // Out-of-range read: structured error chunk.
    client.send_request(0, CMD_READ, 2, VOLUME_BYTES - 10, 4096, &[]).await;
    let chunk = client.read_chunk().await;
    assert_eq!((chunk.cookie, chunk.chunk_type, chunk.flags), (2, REPLY_TYPE_ERROR, REPLY_FLAG_DONE));
    assert_eq!(u32::from_be_bytes(chunk.payload[0..4].try_into().unwrap()), NBD_EINVAL);
    // Write past the end: the payload is consumed, ENOSPC returned.
    assert_eq!(client.write(3, VOLUME_BYTES - 10, &[1u8; 4096]).await, NBD_ENOSPC);
    // Flag not valid for the command.
    client.send_request(CMD_FLAG_REQ_ONE, CMD_WRITE, 4, 0, 4, b"abcd").await;
    assert_eq!(client.read_simple_reply().await, (NBD_EINVAL, 4));
    // Read longer than the payload cap: EINVAL, connection stays usable.
    client.send_request(0, CMD_READ, 5, 0, 64 << 20, &[]).await;
    let chunk = client.read_chunk().await;
    assert_eq!((chunk.cookie, chunk.chunk_type), (5, REPLY_TYPE_ERROR));
    // BLOCK_STATUS without a selected context.
    client.send_request(0, CMD_BLOCK_STATUS, 6, 0, 4096, &[]).await;
    let chunk = client.read_chunk().await;
    assert_eq!((chunk.cookie, chunk.chunk_type), (6, REPLY_TYPE_ERROR));
    // Still alive.
    assert_eq!(client.write(7, 0, b"fine").await, 0);
    // Write longer than the cap: EINVAL, then the server hangs up (payload unskippable).
    client.send_request(0, CMD_WRITE, 8, 0, (32 << 20) + 1, &[]).await;
    assert_eq!(client.read_simple_reply().await, (NBD_EINVAL, 8));
    assert!(client.closed_within(2 * SECOND).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_export_refuses_writes() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut client = RawClient::connect(server.addr).await;
    client.structured_reply().await;
    let (_, flags) = client.go("pool/ro").await.unwrap();
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    assert_eq!(flags & FLAG_SEND_TRIM, 0);
    assert_eq!(client.write(1, 0, &[1u8; 512]).await, NBD_EPERM);
    for (cookie, command) in [(2, CMD_TRIM), (3, CMD_WRITE_ZEROES)] {
        client.send_request(0, command, cookie, 0, 4096, &[]).await;
        assert_eq!(client.read_simple_reply().await, (NBD_EPERM, cookie));
    }
    assert_eq!(client.read_data(4, 0, 512).await, vec![0u8; 512]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_payload_and_hang_up_do_not_disturb_others() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut healthy = RawClient::open(server.addr, "pool/vol").await;
    assert_eq!(healthy.write(1, 0, &[9u8; 4096]).await, 0);

    // A client announces 4 KiB, sends 100 bytes and hangs up.
    let mut truncated = RawClient::open(server.addr, "pool/vol").await;
    truncated.send_request(0, CMD_WRITE, 1, 8192, 4096, &[7u8; 100]).await;
    drop(truncated);
    // A client hangs up in the middle of a request header.
    let mut half = RawClient::open(server.addr, "pool/vol").await;
    half.stream.write_all(&REQUEST_MAGIC.to_be_bytes()).await.unwrap();
    drop(half);
    // A client hangs up in the middle of the handshake.
    let mut early = RawClient::connect(server.addr).await;
    early.stream.write_all(&IHAVEOPT.to_be_bytes()).await.unwrap();
    drop(early);

    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(healthy.read_data(2, 0, 4096).await, vec![9u8; 4096]);
    // The truncated write never happened.
    assert_eq!(healthy.read_data(3, 8192, 4096).await, vec![0u8; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_complete_out_of_order() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut client = RawClient::open(server.addr, "pool/slow").await;
    assert_eq!(client.write(100, 8192, b"fast").await, 0);
    assert_eq!(client.write(101, 0, b"slow").await, 0); // data, so the read is not a hole
    // Cookie 1 reads offset 0, which the SlowVolume delays; cookies 2..=5 are quick.
    client.send_request(0, CMD_READ, 1, 0, 4096, &[]).await;
    for cookie in 2..=5u64 {
        client.send_request(0, CMD_READ, cookie, 8192, 4, &[]).await;
    }
    let mut order = Vec::new();
    for _ in 0..5 {
        let chunk = client.read_chunk().await;
        assert_eq!(chunk.flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
        if chunk.cookie != 1 {
            assert_eq!(&chunk.payload[8..], b"fast");
        }
        order.push(chunk.cookie);
    }
    assert_eq!(order.last(), Some(&1), "slow read must finish last: {order:?}");
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(sorted, vec![1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holes_zeroes_and_block_status() {
    let server = start(standard_registry(), NbdConfig::default()).await;
    let mut client = RawClient::connect(server.addr).await;
    // SET_META_CONTEXT before STRUCTURED_REPLY is invalid.
    client.send_option(OPT_SET_META_CONTEXT, &meta_context_data("pool/vol", &["base:allocation"])).await;
    assert_eq!(client.read_option_reply().await.reply_type, REP_ERR_INVALID);
    client.structured_reply().await;
    // LIST with no queries lists base:allocation; unknown namespaces are ignored.
    client.send_option(OPT_LIST_META_CONTEXT, &meta_context_data("pool/vol", &[])).await;
    let reply = client.read_option_reply().await;
    assert_eq!(reply.reply_type, REP_META_CONTEXT);
    assert_eq!(&reply.data[4..], b"base:allocation");
    assert_eq!(client.read_option_reply().await.reply_type, REP_ACK);
    assert!(client.set_meta_context("pool/vol", &["qemu:dirty-bitmap:x"]).await.is_empty());
    let selected = client.set_meta_context("pool/vol", &["qemu:allocation-depth", "base:allocation"]).await;
    assert_eq!(selected.len(), 1);
    let context_id = selected[0].0;
    client.go("pool/vol").await.unwrap();

    // A read of never-written space comes back as one OFFSET_HOLE chunk.
    client.send_request(0, CMD_READ, 1, 0, 65536, &[]).await;
    let chunk = client.read_chunk().await;
    assert_eq!((chunk.chunk_type, chunk.flags), (REPLY_TYPE_OFFSET_HOLE, REPLY_FLAG_DONE));
    assert_eq!(u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap()), 0);
    assert_eq!(u32::from_be_bytes(chunk.payload[8..12].try_into().unwrap()), 65536);

    assert_eq!(client.write(2, 65536, &[5u8; 65536]).await, 0);
    client.send_request(0, CMD_BLOCK_STATUS, 3, 0, VOLUME_BYTES as u32, &[]).await;
    let chunk = client.read_chunk().await;
    assert_eq!((chunk.cookie, chunk.chunk_type, chunk.flags), (3, REPLY_TYPE_BLOCK_STATUS, REPLY_FLAG_DONE));
    assert_eq!(u32::from_be_bytes(chunk.payload[0..4].try_into().unwrap()), context_id);
    let extents: Vec<(u32, u32)> = chunk.payload[4..]
        .chunks(8)
        .map(|e| (u32::from_be_bytes(e[0..4].try_into().unwrap()), u32::from_be_bytes(e[4..8].try_into().unwrap())))
        .collect();
    let rest = VOLUME_BYTES as u32 - 131072;
    assert_eq!(extents, vec![(65536, STATE_HOLE | STATE_ZERO), (65536, 0), (rest, STATE_HOLE | STATE_ZERO)]);
    client.send_request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 4, 0, VOLUME_BYTES as u32, &[]).await;
    let chunk = client.read_chunk().await;
    assert_eq!(chunk.payload.len(), 4 + 8, "REQ_ONE returns exactly one extent");

    // WRITE_ZEROES (with NO_HOLE and FAST_ZERO) and TRIM read back as zeros.
    client.send_request(CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 5, 65536, 4096, &[]).await;
    assert_eq!(client.read_simple_reply().await, (0, 5));
    assert_eq!(client.read_data(6, 65536, 4096).await, vec![0u8; 4096]);
    client.send_request(CMD_FLAG_FUA, CMD_TRIM, 7, 69632, 100, &[]).await;
    assert_eq!(client.read_simple_reply().await, (0, 7));
    let data = client.read_data(8, 69632, 4096).await;
    assert!(data[..100].iter().all(|&b| b == 0) && data[100..].iter().all(|&b| b == 5));
    // DF read of mixed data/hole: exactly one data chunk.
    client.send_request(CMD_FLAG_DF, CMD_READ, 9, 65536 + 4096, 131072, &[]).await;
    let chunk = client.read_chunk().await;
    assert_eq!((chunk.chunk_type, chunk.flags), (REPLY_TYPE_OFFSET_DATA, REPLY_FLAG_DONE));
    assert_eq!(chunk.payload.len(), 8 + 131072);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_fast_path_serves_reads() {
    let mut registry = StaticRegistry::new();
    registry.insert("pool/fast", "", Arc::new(CachedVolume(MemVolume::new("pool/fast", VOLUME_BYTES, 4096))));
    let server = start(registry, NbdConfig::default()).await;
    let mut client = RawClient::open(server.addr, "").await;
    assert_eq!(client.write(1, 1000, b"hello").await, 0);
    assert_eq!(client.read_data(2, 1000, 5).await, b"hello");
    // Many pipelined reads on the inline path.
    for cookie in 10..200u64 {
        client.send_request(0, CMD_READ, cookie, 1000, 5, &[]).await;
    }
    for _ in 10..200u64 {
        let chunk = client.read_chunk().await;
        assert_eq!(&chunk.payload[8..], b"hello");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_reads_arrive_whole_and_in_order() {
    // Reads served as shared pieces (one per 4 KiB block, unaligned ends), pipelined
    // faster than the client reads the replies, so the writer sees partial vectored
    // writes across piece and reply boundaries.
    let mut registry = StaticRegistry::new();
    registry.insert("pool/shared", "", Arc::new(SharedVolume(MemVolume::new("pool/shared", VOLUME_BYTES, 4096))));
    let server = start(registry, NbdConfig::default()).await;
    let mut client = RawClient::open(server.addr, "").await;
    let pattern: Vec<u8> = (0..VOLUME_BYTES as usize).map(|i| (i * 7 + i / 4096) as u8).collect();
    assert_eq!(client.write(1, 0, &pattern[..]).await, 0);
    let reads: Vec<(u64, u32)> = (0..120u64).map(|i| ((i * 12_345) % (VOLUME_BYTES / 2), 1 + ((i * 40_503) % 131_072) as u32)).collect();
    for (i, &(offset, length)) in reads.iter().enumerate() {
        client.send_request(0, CMD_READ, 100 + i as u64, offset, length, &[]).await;
    }
    for _ in 0..reads.len() {
        let chunk = client.read_chunk().await;
        let (offset, length) = reads[(chunk.cookie - 100) as usize];
        assert_eq!((chunk.chunk_type, chunk.flags), (REPLY_TYPE_OFFSET_DATA, REPLY_FLAG_DONE));
        assert_eq!(u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap()), offset);
        assert!(chunk.payload[8..] == pattern[offset as usize..(offset + u64::from(length)) as usize], "cookie {}", chunk.cookie);
    }
    // Without structured replies: a simple reply header, then the pieces.
    let mut simple = RawClient::connect(server.addr).await;
    simple.go("pool/shared").await.unwrap();
    simple.send_request(0, CMD_READ, 7, 4095, 8194, &[]).await;
    assert_eq!(simple.read_simple_reply().await, (0, 7));
    let mut data = vec![0u8; 8194];
    simple.stream.read_exact(&mut data).await.unwrap();
    assert!(data == pattern[4095..4095 + 8194]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_eshutdown_and_drains() {
    let config = NbdConfig { shutdown_grace: Duration::from_secs(3), ..NbdConfig::default() };
    let server = start(standard_registry(), config).await;
    let mut idle = RawClient::open(server.addr, "pool/vol").await;
    let mut busy = RawClient::open(server.addr, "pool/slow").await;
    assert_eq!(busy.write(100, 0, b"slow").await, 0); // data, so the read is not a hole
    busy.send_request(0, CMD_READ, 1, 0, 4096, &[]).await; // takes 400 ms
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown.send(true).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    busy.send_request(0, CMD_FLUSH, 2, 0, 0, &[]).await;
    assert_eq!(busy.read_simple_reply().await, (NBD_ESHUTDOWN, 2));
    let chunk = busy.read_chunk().await;
    assert_eq!((chunk.cookie, chunk.chunk_type), (1, REPLY_TYPE_OFFSET_DATA));
    assert!(busy.closed_within(2 * SECOND).await, "drained connection closes");
    assert!(idle.closed_within(2 * SECOND).await, "idle connection closes at once");
    let result = tokio::time::timeout(3 * SECOND, server.task).await.expect("server stops");
    result.unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(server.addr).await.is_err(), "listener closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_options_closes() {
    let config = NbdConfig { options_max: 8, ..NbdConfig::default() };
    let server = start(standard_registry(), config).await;
    let mut client = RawClient::connect(server.addr).await;
    for _ in 0..8 {
        client.send_option(99, &[]).await;
        assert_eq!(client.read_option_reply().await.reply_type, REP_ERR_UNSUP);
    }
    assert!(client.closed_within(2 * SECOND).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_after_handshake_never_kill_the_server() {
    // Goal: hostile transmission bytes end only their own connection.
    // Method: 50 connections each send seeded random bytes after GO (seed printed).
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("NBD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("random_bytes seed={seed} (rerun with NBD_TEST_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = start(standard_registry(), NbdConfig::default()).await;
    for _ in 0..50 {
        let mut client = RawClient::open(server.addr, "pool/vol").await;
        let mut bytes = vec![0u8; rng.gen_range(0..2000)];
        rng.fill(&mut bytes[..]);
        if rng.gen_bool(0.5) && bytes.len() >= 28 {
            bytes[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        let _ = client.stream.write_all(&bytes).await;
        drop(client);
    }
    let mut client = RawClient::open(server.addr, "pool/vol").await;
    assert_eq!(client.write(1, 0, b"alive").await, 0);
}

#[test]
fn whole_connection_survives_random_client_bytes() {
    // Goal: the fuzz target's path (handshake + transmission from arbitrary bytes)
    // runs in every default test run. Method: seeded random inputs, with and without
    // a valid handshake prefix; half of the later ones get a request magic planted.
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("NBD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("whole_connection seed={seed} (rerun with NBD_TEST_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for round in 0..200 {
        let mut bytes = vec![0u8; rng.gen_range(0..600)];
        rng.fill(&mut bytes[..]);
        let with_prefix = round % 2 == 0;
        if with_prefix && bytes.len() >= 28 && rng.gen_bool(0.5) {
            bytes[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            bytes[24..28].copy_from_slice(&(rng.gen_range(0..64u32)).to_be_bytes());
        }
        zilla_nbd::fuzzing::drive_connection(&bytes, with_prefix);
    }
}
