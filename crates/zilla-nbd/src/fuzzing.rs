//! fuzzing: drive a whole connection (handshake and transmission) from arbitrary
//! client bytes. Shared by the `nbd_connection` fuzz target and a property test, so
//! the default `cargo test` run exercises the same path the fuzzer does.
//!
//! The client bytes are written into an in-memory duplex pipe against a server with a
//! 1 MiB MemVolume export "pool/vol"; whatever the server answers is drained and
//! discarded. When `with_valid_prefix` is set, a correct handshake (client flags,
//! STRUCTURED_REPLY, SET_META_CONTEXT base:allocation, GO) precedes the bytes, so the
//! fuzzer spends its time in the transmission phase. Bounds: the run is capped at two
//! seconds of (virtual-free) wall time; short grace and handshake timeouts.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zilla_frontend::volume::MemVolume;

use crate::proto::*;
use crate::{NbdConfig, NbdServer, StaticRegistry};

/// The bytes of a correct client handshake that ends in transmission on "pool/vol".
pub fn valid_handshake_prefix() -> Vec<u8> {
    fn option(out: &mut Vec<u8>, code: u32, data: &[u8]) {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    }
    let name = b"pool/vol";
    let mut bytes = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes().to_vec();
    option(&mut bytes, OPT_STRUCTURED_REPLY, &[]);
    let mut meta = (name.len() as u32).to_be_bytes().to_vec();
    meta.extend_from_slice(name);
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&(META_CONTEXT_BASE_ALLOCATION.len() as u32).to_be_bytes());
    meta.extend_from_slice(META_CONTEXT_BASE_ALLOCATION.as_bytes());
    option(&mut bytes, OPT_SET_META_CONTEXT, &meta);
    let mut go = (name.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(name);
    go.extend_from_slice(&0u16.to_be_bytes());
    option(&mut bytes, OPT_GO, &go);
    bytes
}

/// Run one connection fed with `client_bytes`; returns when the server closes it.
pub fn drive_connection(client_bytes: &[u8], with_valid_prefix: bool) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(_) => return,
    };
    let mut input = if with_valid_prefix { valid_handshake_prefix() } else { Vec::new() };
    input.extend_from_slice(client_bytes);
    runtime.block_on(async move {
        let volume = Arc::new(MemVolume::new("pool/vol", 1 << 20, 4096));
        let registry = StaticRegistry::new().with("pool/vol", volume);
        let config = NbdConfig {
            handshake_timeout: Duration::from_millis(500),
            shutdown_grace: Duration::from_millis(200),
            ..NbdConfig::default()
        };
        let server = NbdServer::new(Arc::new(registry), config);
        let (client, server_side) = tokio::io::duplex(256 * 1024);
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        let connection = tokio::spawn(async move { server.serve_stream(server_side, stop_rx).await });
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let drain = tokio::spawn(async move {
            let mut sink = [0u8; 64 * 1024];
            while let Ok(n) = client_read.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        });
        let _ = client_write.write_all(&input).await;
        let _ = client_write.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), connection).await;
        drain.abort();
    });
}
