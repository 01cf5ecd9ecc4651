//! A probe, not a pass/fail test (performance goals are checked by `bench/run slog`):
//! the engine-level latency of a 4K write and its commit on the demo layout (two
//! sim-hdd mirrors and a sim-ssd log mirror), without NBD in between. It splits the
//! sync-write latency the bench reports into what the engine adds over the sim-ssd
//! model and what the front end adds. Run:
//!   cargo test --release -p zilla-core --test zil_latency -- --ignored --nocapture
use std::time::Instant;

use zilla_core::spa::{CreateOptions, Pool, TopSpec};
use zilla_core::vdev::{LeafSpec, Role};

fn leaves(dir: &std::path::Path, model: &str, names: &[&str], bytes: u64) -> Vec<LeafSpec> {
    names
        .iter()
        .map(|n| {
            let p = dir.join(n);
            std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
            LeafSpec::parse(&format!("{model}:{}", p.display())).unwrap()
        })
        .collect()
}

fn summary(name: &str, mut ns: Vec<u64>) {
    ns.sort_unstable();
    let mean = ns.iter().sum::<u64>() / ns.len() as u64;
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize];
    println!("{name:>12}: mean {:>6} us  p50 {:>6}  p90 {:>6}  p99 {:>6}  max {:>6}", mean / 1000, at(0.5) / 1000, at(0.9) / 1000, at(0.99) / 1000, ns[ns.len() - 1] / 1000);
}

#[test]
#[ignore]
fn zil_commit_latency_probe() {
    let t = zilla_core::tunables();
    t.set("sim_flush_backing", 0).unwrap();
    t.set("zfs_txg_timeout", 3600).unwrap();
    // ZIL_PROBE_SET="name=value,...": try a tunable (e.g. sim_spin_us=200)
    for kv in std::env::var("ZIL_PROBE_SET").unwrap_or_default().split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').expect("ZIL_PROBE_SET wants name=value");
        t.set(k, v.parse().expect("a number")).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("zilla-zil-latency-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gib = 1u64 << 30;
    let tops = vec![
        TopSpec { role: Role::Normal, mirror: true, leaves: leaves(&dir, "sim-hdd", &["a0", "a1"], gib) },
        TopSpec { role: Role::Normal, mirror: true, leaves: leaves(&dir, "sim-hdd", &["b0", "b1"], gib) },
        TopSpec { role: Role::Log, mirror: true, leaves: leaves(&dir, "sim-ssd", &["l0", "l1"], gib / 4) },
    ];
    let pool = Pool::create("probe", tops, CreateOptions::default()).unwrap();
    pool.volume_create("vol", 256 << 20, 8192, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let n: u64 = std::env::var("ZIL_PROBE_N").ok().and_then(|s| s.parse().ok()).unwrap_or(3000);
    let buf = vec![0x5au8; 4096];
    let (mut w, mut f) = (Vec::new(), Vec::new());
    for i in 0..n {
        let off = (i * 7919 % 60000) * 4096;
        let t0 = Instant::now();
        v.write(off, &buf, false).unwrap();
        let t1 = Instant::now();
        v.flush().unwrap();
        let t2 = Instant::now();
        if i >= 50 {
            w.push((t1 - t0).as_nanos() as u64);
            f.push((t2 - t1).as_nanos() as u64);
        }
    }
    println!("{n} x (4K write + commit), sim-ssd log mirror");
    summary("write", w.clone());
    summary("commit", f.clone());
    summary("sync write", w.iter().zip(&f).map(|(a, b)| a + b).collect());
    drop(v);
    pool.export().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
