//! Interop tests with the real NBD clients installed on the machine (libnbd's nbdinfo
//! and nbdcopy, qemu-img, fio's nbd engine).
//!
//! Goal: the server works with the clients users will point at it. Method: serve
//! MemVolume exports on an ephemeral port from a runtime thread, run each tool as a
//! subprocess and check its output. A missing tool prints a notice and the check is
//! skipped rather than failed (install: `apt-get install -y fio libnbd-bin qemu-utils`).

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;

use zilla_core::memvol::MemVolume;
use zilla_nbd::{NbdConfig, NbdServer, StaticRegistry};

struct ThreadServer {
    addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ThreadServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(registry: StaticRegistry) -> ThreadServer {
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let server = NbdServer::new(Arc::new(registry), NbdConfig::default());
            server.serve_tcp(listener, stop_rx).await.unwrap();
        });
    });
    let addr = addr_rx.recv().unwrap();
    ThreadServer { addr, stop, thread: Some(thread) }
}

fn have(tool: &str) -> bool {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().map_or(false, |o| o.status.success());
    if !found {
        println!("NOTICE: {tool} not installed; skipping its checks (apt-get install -y fio libnbd-bin qemu-utils)");
    }
    found
}

fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    if !output.status.success() {
        panic!(
            "{program} {args:?} failed: {}\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

const VOLUME_BYTES: u64 = 32 << 20;

fn volume(name: &str) -> Arc<MemVolume> {
    Arc::new(MemVolume::new(name, VOLUME_BYTES, 4096))
}

#[test]
fn nbdinfo_reports_size_and_flags() {
    if !have("nbdinfo") {
        return;
    }
    let server = serve(StaticRegistry::new().with("pool/vol", volume("pool/vol")));
    let uri = format!("nbd://{}/pool/vol", server.addr);
    let json = String::from_utf8(run("nbdinfo", &["--json", &uri]).stdout).unwrap();
    println!("{json}");
    for expected in [
        "\"export-size\": 33554432",
        "\"structured\": true",
        "\"base:allocation\"",
        "\"can_multi_conn\": true",
        "\"can_fua\": true",
        "\"can_trim\": true",
        "\"can_zero\": true",
        "\"can_fast_zero\": true",
        "\"can_cache\": true",
        "\"can_df\": true",
        "\"can_flush\": true",
        "\"is_read_only\": false",
    ] {
        assert!(json.contains(expected), "nbdinfo output lacks {expected}");
    }
    // The empty export name reaches the only export.
    let plain = String::from_utf8(run("nbdinfo", &["--size", &format!("nbd://{}/", server.addr)]).stdout).unwrap();
    assert_eq!(plain.trim(), "33554432");
    let list = String::from_utf8(run("nbdinfo", &["--list", &format!("nbd://{}/", server.addr)]).stdout).unwrap();
    assert!(list.contains("pool/vol"), "{list}");
}

#[test]
fn nbdcopy_round_trip_map_and_qemu_img_compare() {
    if !have("nbdcopy") || !have("nbdinfo") {
        return;
    }
    let server = serve(StaticRegistry::new().with("pool/vol", volume("pool/vol")));
    let uri = format!("nbd://{}/pool/vol", server.addr);
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source.img");
    let copy = dir.path().join("copy.img");
    // 8 MiB random, 16 MiB zeros (left sparse by nbdcopy), 8 MiB random.
    let mut image = vec![0u8; VOLUME_BYTES as usize];
    let random: Vec<u8> = (0..8 << 20).map(|_| rand::random::<u8>()).collect();
    image[..8 << 20].copy_from_slice(&random);
    image[24 << 20..].copy_from_slice(&random);
    std::fs::File::create(&source).unwrap().write_all(&image).unwrap();

    run("nbdcopy", &[source.to_str().unwrap(), &uri]);
    run("nbdcopy", &[&uri, copy.to_str().unwrap()]);
    assert!(std::fs::read(&copy).unwrap() == image, "nbdcopy out differs from nbdcopy in");

    let map = String::from_utf8(run("nbdinfo", &["--map", &uri]).stdout).unwrap();
    println!("{map}");
    let lines: Vec<&str> = map.lines().collect();
    assert_eq!(lines.len(), 3, "data, hole, data: {map}");
    assert!(lines[0].contains("data") && lines[1].contains("hole,zero") && lines[2].contains("data"), "{map}");

    if have("qemu-img") {
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", source.to_str().unwrap(), &uri]);
        let info = String::from_utf8(run("qemu-img", &["info", &uri]).stdout).unwrap();
        assert!(info.contains("33554432"), "{info}");
    }
}

#[test]
fn fio_randwrite_verify_multi_conn() {
    if !have("fio") {
        return;
    }
    let server = serve(StaticRegistry::new().with("pool/fio", volume("pool/fio")));
    let uri = format!("nbd://{}/pool/fio", server.addr);
    // Four jobs = four connections, each writing and verifying its own 8 MiB slice.
    let output = run(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--numjobs=4",
            "--size=8m",
            "--offset_increment=8m",
            "--verify=crc32c",
            "--do_verify=1",
            "--group_reporting",
        ],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    println!("{text}");
    assert!(text.contains("err= 0"), "fio reported errors: {text}");
    assert!(!text.contains("verify: bad"), "fio verify failed: {text}");
}
