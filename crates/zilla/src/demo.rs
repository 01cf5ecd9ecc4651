//! `zilla demo [DIR]`: a first look in one command.
//!
//! Lays out sparse backing files in DIR (four 1 GiB emulated HDDs, a 256 MiB log SSD
//! and a 256 MiB cache SSD), creates the pool `demo` =
//! `mirror d0 d1 mirror d2 d3 log log0 cache cache0`, a thick 512 MiB volume
//! `demo/vol0` with a recognisable header and some data, then runs the daemon in the
//! foreground on DIR/state. Run again, it reuses the pool (re-imported from the state
//! directory's cache file, or found by its labels in DIR). Ctrl-C stops it the same
//! way SIGTERM stops `zilla serve`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use zilla_core::spa::{CreateOptions, Pool};

use crate::daemon::{self, ApiError};
use crate::Listen;

const POOL: &str = "demo";
const VOLUME: &str = "vol0";
const VOLSIZE: u64 = 512 << 20;
const HDD_SIZE: u64 = 1 << 30;
const SSD_SIZE: u64 = 256 << 20;
/// Pseudo-random data written after the header so the pool is not empty.
const DATA_BYTES: usize = 8 << 20;
const DATA_OFFSET: u64 = 1 << 20;

fn leaf_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(PathBuf, u64)> = (0..4).map(|i| (dir.join(format!("d{i}.img")), HDD_SIZE)).collect();
    v.push((dir.join("log0.img"), SSD_SIZE));
    v.push((dir.join("cache0.img"), SSD_SIZE));
    v
}

fn vdev_args(dir: &Path) -> Vec<String> {
    let f = |n: &str| dir.join(n).display().to_string();
    vec![
        "mirror".into(),
        format!("sim-hdd:{}", f("d0.img")),
        format!("sim-hdd:{}", f("d1.img")),
        "mirror".into(),
        format!("sim-hdd:{}", f("d2.img")),
        format!("sim-hdd:{}", f("d3.img")),
        "log".into(),
        format!("sim-ssd:{}", f("log0.img")),
        "cache".into(),
        format!("sim-ssd:{}", f("cache0.img")),
    ]
}

async fn engine<T: Send + 'static>(
    f: impl FnOnce() -> zilla_core::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    crate::api_error::blocking(move || f().map_err(ApiError::from)).await.map_err(|ApiError(_, m)| anyhow!(m))
}

/// Find or make the pool. None = the state directory's cache file has it, so the
/// daemon imports it at start.
async fn prepare_pool(dir: &Path, state: &Path) -> anyhow::Result<Option<Arc<Pool>>> {
    // (a cache file that cannot be read is moved aside by the daemon at start)
    if daemon::read_cache(state).is_ok_and(|c| c.pools.iter().any(|p| p.name == POOL)) {
        return Ok(None);
    }
    let files = leaf_files(dir);
    if files.iter().all(|(p, _)| p.exists()) {
        let search = vec![dir.to_path_buf()];
        match engine(move || Pool::import(&search, Some(POOL))).await {
            Ok(p) => {
                eprintln!("zilla demo: imported the existing pool '{POOL}' from {}", dir.display());
                return Ok(Some(p));
            }
            Err(e) => tracing::info!("no importable demo pool in {}: {e}; creating one", dir.display()),
        }
    }
    for (path, size) in &files {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        f.set_len(*size).with_context(|| format!("cannot size {}", path.display()))?;
    }
    let tops = crate::vdev_grammar::parse_vdev_args(&vdev_args(dir)).map_err(|e| anyhow!(e))?;
    let pool = engine(move || Pool::create(POOL, tops, CreateOptions { force: true, ..Default::default() }))
        .await
        .context("cannot create the demo pool")?;
    eprintln!("zilla demo: created pool '{POOL}' in {}", dir.display());
    Ok(Some(pool))
}

/// Create demo/vol0 with a header and some data if it does not exist yet.
async fn prepare_volume(pool: Arc<Pool>) -> anyhow::Result<()> {
    engine(move || {
        if pool.volumes().iter().any(|v| v.name == format!("{POOL}/{VOLUME}")) {
            return Ok(());
        }
        // thick, as `zilla volume create` without -s: the pool keeps its size for it
        pool.volume_create(VOLUME, VOLSIZE, 16 * 1024, &[("refreservation".into(), "auto".into())])?;
        let vol = pool.open_volume(VOLUME)?;
        let mut header = vec![0u8; 4096];
        let text = b"ZILLA DEMO VOLUME demo/vol0\nThis block was written by `zilla demo`.\n";
        header[..text.len()].copy_from_slice(text);
        vol.write(0, &header, false)?;
        // xorshift: incompressible but reproducible.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut data = vec![0u8; DATA_BYTES];
        for chunk in data.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        vol.write(DATA_OFFSET, &data, false)?;
        vol.flush()?;
        pool.sync()
    })
    .await
    .context("cannot prepare demo/vol0")
}

pub async fn run(dir: PathBuf, listen: Listen) -> anyhow::Result<()> {
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let state = dir.join("state");
    let lock = daemon::lock_state_dir(&state, &Default::default())?;
    let pre = prepare_pool(&dir, &lock.dir).await?;
    if let Some(p) = &pre {
        prepare_volume(p.clone()).await?;
    }
    let opts = daemon::ServeOpts::new(listen.nbd, listen.iscsi, listen.http);
    let state_dir = lock.dir.clone();
    daemon::run(opts, lock, pre.into_iter().collect(), move |info| print_banner(&dir, &state_dir, info)).await
}

fn print_banner(dir: &Path, state: &Path, info: &crate::api::DaemonInfo) {
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "zilla".into());
    let export = format!("{POOL}/{VOLUME}");
    let nbd = match &info.nbd_tcp {
        Some(a) => format!("nbd://{}/{export}", a.replace("0.0.0.0", "127.0.0.1")),
        None => format!("'nbd+unix:///{export}?socket={}'", info.nbd_unix.as_deref().unwrap_or("")),
    };
    let mut o = String::new();
    o.push_str(&format!("\nZilla demo: pool '{POOL}' on emulated disks in {}\n\n", dir.display()));
    o.push_str(&format!("  pool status:  {exe} --state-dir {} pool status {POOL}\n", state.display()));
    o.push_str(&format!("  iostat:       {exe} --state-dir {} pool iostat -v {POOL} 1\n", state.display()));
    o.push_str(&format!("  NBD export:   nbdinfo {nbd}\n"));
    o.push_str(&format!("                nbdinfo --map {nbd}\n"));
    o.push_str(&format!("  qemu:         qemu-img info {nbd}\n"));
    o.push_str(&format!("                qemu-img convert -p -O raw {nbd} /tmp/vol0.raw\n"));
    o.push_str(&format!(
        "  fio:          fio --name=demo --ioengine=nbd --uri={nbd} --rw=randrw --bs=4k --iodepth=16 --offset=256M --size=64M --runtime=10 --time_based\n"
    ));
    if let Some(h) = &info.http {
        let h = h.replace("0.0.0.0", "127.0.0.1");
        o.push_str(&format!("  browser:      http://{h}/  (dashboard)\n"));
        o.push_str(&format!("                http://{h}/ui/worksheet#ds=io.latency/op&ds=io.ops/op&ds=disk.latency/device  (latency heat maps)\n"));
    }
    if let Some(i) = &info.iscsi {
        let portal = i.replace("0.0.0.0", "127.0.0.1");
        let target = zilla_iscsi::names::target_name(&export);
        o.push_str(&format!("  iSCSI:        iscsi-ls -s iscsi://{portal}\n"));
        o.push_str(&format!("                iscsi-inq iscsi://{portal}/{target}/0\n"));
        o.push_str(&format!("                qemu-img info iscsi://{portal}/{target}/0\n"));
    }
    o.push_str("\nCtrl-C stops the daemon; the pool is exported cleanly and reused next time.\n");
    println!("{o}");
}
