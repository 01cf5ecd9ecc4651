//! nbd-memserve: serve one in-memory volume over NBD, for trying clients and for
//! benchmarks against `nbdkit memory`.
//!
//! Usage: nbd-memserve [--size BYTES] [--tcp ADDR] [--unix PATH] [--name POOL/NAME]
//!                     [--uncached]
//! Defaults: 1 GiB, 127.0.0.1:10809, export "pool/vol". The volume is a MemVolume; by
//! default its reads are offered to the server's inline `try_read_cached` fast path (it
//! is all memory, as an ARC hit would be); `--uncached` sends every read through the
//! blocking pool instead, as a cache miss would. Stops on SIGINT/SIGTERM (ctrl-c).

use std::sync::Arc;

use zilla_core::memvol::MemVolume;
use zilla_core::zvol::{BlockVolume, Extent};
use zilla_nbd::{NbdConfig, NbdServer, StaticRegistry};

/// MemVolume with every read offered to the inline fast path.
struct CachedMemVolume(MemVolume);

impl BlockVolume for CachedMemVolume {
    fn name(&self) -> String { self.0.name() }
    fn size(&self) -> u64 { self.0.size() }
    fn block_size(&self) -> u32 { self.0.block_size() }
    fn read_only(&self) -> bool { self.0.read_only() }
    fn read(&self, offset: u64, buf: &mut [u8]) -> zilla_core::Result<()> { self.0.read(offset, buf) }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> zilla_core::Result<()> { self.0.write(offset, data, fua) }
    fn flush(&self) -> zilla_core::Result<()> { self.0.flush() }
    fn unmap(&self, offset: u64, len: u64) -> zilla_core::Result<()> { self.0.unmap(offset, len) }
    fn write_zeroes(&self, offset: u64, len: u64) -> zilla_core::Result<()> { self.0.write_zeroes(offset, len) }
    fn block_status(&self, offset: u64, len: u64) -> zilla_core::Result<Vec<Extent>> { self.0.block_status(offset, len) }
    fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<zilla_core::Result<()>> {
        Some(self.0.read(offset, buf))
    }
}

fn main() -> std::io::Result<()> {
    let mut size_bytes: u64 = 1 << 30;
    let mut tcp = Some("127.0.0.1:10809".to_string());
    let mut unix: Option<String> = None;
    let mut name = "pool/vol".to_string();
    let mut cached = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--size" => size_bytes = value().parse().expect("--size BYTES"),
            "--tcp" => tcp = Some(value()),
            "--unix" => unix = Some(value()),
            "--no-tcp" => tcp = None,
            "--name" => name = value(),
            "--uncached" => cached = false,
            other => panic!("unknown argument {other}"),
        }
    }
    let memory = MemVolume::new(&name, size_bytes, 4096);
    let volume: Arc<dyn BlockVolume> = if cached { Arc::new(CachedMemVolume(memory)) } else { Arc::new(memory) };
    let registry = StaticRegistry::new().with(&name, volume);
    let server = NbdServer::new(Arc::new(registry), NbdConfig::default());
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        if let Some(addr) = tcp {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            println!("nbd-memserve: nbd://{}/{name}", listener.local_addr()?);
            let (server, stop_rx) = (server.clone(), stop_rx.clone());
            tasks.push(tokio::spawn(async move { server.serve_tcp(listener, stop_rx).await }));
        }
        if let Some(path) = unix {
            let _ = std::fs::remove_file(&path);
            let listener = tokio::net::UnixListener::bind(&path)?;
            println!("nbd-memserve: nbd+unix:///{name}?socket={path}");
            let (server, stop_rx) = (server.clone(), stop_rx.clone());
            tasks.push(tokio::spawn(async move { server.serve_unix(listener, stop_rx).await }));
        }
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        let _ = stop.send(true);
        for task in tasks {
            let _ = task.await;
        }
        Ok(())
    })
}
