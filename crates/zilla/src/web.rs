//! The HTTP side for people and Prometheus (--http ADDR, default 127.0.0.1:8080):
//! `/` a small status page (the analytics UI with heat maps is a later issue) and
//! `/metrics` in Prometheus text format with the names ZFS exporters use
//! (pdf/zfs_exporter `zfs_pool_*`, richardelling/zpool_prometheus `zpool_stats_*`).

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use zilla_core::spa::{IostatNode, IostatSnapshot, PoolListRow, PoolStatus, VolumeInfo};
use zilla_core::vdev::IoClass;

use crate::daemon::Daemon;

pub fn router(d: Arc<Daemon>) -> Router {
    Router::new().route("/", get(index)).route("/metrics", get(metrics)).with_state(d)
}

/// Everything the page and the metrics need, gathered off the async threads.
struct Snapshot {
    rows: Vec<PoolListRow>,
    status: Vec<PoolStatus>,
    iostat: Vec<IostatSnapshot>,
    volumes: Vec<VolumeInfo>,
}

async fn snapshot(d: &Arc<Daemon>) -> Result<Snapshot, String> {
    let pools = d.pools.all();
    tokio::task::spawn_blocking(move || Snapshot {
        rows: pools.iter().map(|(_, p)| p.list_row()).collect(),
        status: pools.iter().map(|(_, p)| p.status()).collect(),
        iostat: pools.iter().map(|(_, p)| p.iostat()).collect(),
        volumes: pools.iter().flat_map(|(_, p)| p.volumes()).collect(),
    })
    .await
    .map_err(|e| format!("storage engine error: {e}"))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

async fn index(State(d): State<Arc<Daemon>>) -> Html<String> {
    let mut o = String::from(
        "<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=5>\
         <title>zilla</title><style>body{font-family:sans-serif;margin:2em}\
         pre{background:#f4f4f4;padding:1em}td,th{padding:0 1em;text-align:right}\
         td:first-child,th:first-child{text-align:left}</style></head><body><h1>zilla</h1>",
    );
    let _ = write!(
        o,
        "<p>state dir <code>{}</code> &middot; NBD {} &middot; <a href=/metrics>/metrics</a></p>",
        esc(&d.info.state_dir),
        esc(d.info.nbd_tcp.as_deref().unwrap_or("off"))
    );
    match snapshot(&d).await {
        Err(e) => {
            let _ = write!(o, "<p>{}</p>", esc(&e));
        }
        Ok(s) => {
            let cols = crate::format::list_columns(None).unwrap_or_default();
            let _ = write!(o, "<h2>Pools</h2><pre>{}</pre>", esc(&crate::format::pool_list(&s.rows, &cols, false, false)));
            let _ = write!(o, "<h2>Volumes</h2><pre>{}</pre>", esc(&crate::format::volume_list(&s.volumes, false, false)));
            for st in &s.status {
                let _ = write!(o, "<h2>{}</h2><pre>{}</pre>", esc(&st.name), esc(&crate::format::pool_status(st, true)));
            }
        }
    }
    o.push_str("</body></html>\n");
    Html(o)
}

fn health_code(h: &str) -> u8 {
    match h {
        "ONLINE" => 0,
        "DEGRADED" => 1,
        "FAULTED" => 2,
        "OFFLINE" => 3,
        "UNAVAIL" => 4,
        "REMOVED" => 5,
        _ => 6,
    }
}

async fn metrics(State(d): State<Arc<Daemon>>) -> impl IntoResponse {
    let body = match snapshot(&d).await {
        Ok(s) => render_metrics(&s),
        Err(e) => format!("# {e}\n"),
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
}

fn render_metrics(s: &Snapshot) -> String {
    let mut o = String::new();
    let gauge = |o: &mut String, name: &str, help: &str, kind: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(o, "{name}{{{labels}}} {v}");
        }
    };
    let pl = |r: &PoolListRow| format!("pool=\"{}\"", r.name);
    gauge(&mut o, "zfs_pool_health", "Health: 0 online, 1 degraded, 2 faulted, 3 offline, 4 unavail, 5 removed, 6 suspended", "gauge",
        s.rows.iter().map(|r| (pl(r), health_code(r.health.as_str()) as f64)).collect());
    gauge(&mut o, "zfs_pool_size_bytes", "Pool size in bytes", "gauge", s.rows.iter().map(|r| (pl(r), r.size as f64)).collect());
    gauge(&mut o, "zfs_pool_allocated_bytes", "Allocated bytes", "gauge", s.rows.iter().map(|r| (pl(r), r.alloc as f64)).collect());
    gauge(&mut o, "zfs_pool_free_bytes", "Free bytes", "gauge", s.rows.iter().map(|r| (pl(r), r.free as f64)).collect());
    gauge(&mut o, "zfs_pool_fragmentation_ratio", "Free space fragmentation (0..1)", "gauge",
        s.rows.iter().map(|r| (pl(r), r.frag_percent as f64 / 100.0)).collect());
    gauge(&mut o, "zfs_pool_readonly", "1 if the pool is read-only", "gauge", s.rows.iter().map(|r| (pl(r), 0.0)).collect());
    let vl = |v: &VolumeInfo| {
        let pool = v.name.split('/').next().unwrap_or("");
        format!("name=\"{}\",pool=\"{pool}\",type=\"volume\"", v.name)
    };
    gauge(&mut o, "zfs_dataset_used_bytes", "Bytes used by the volume", "gauge", s.volumes.iter().map(|v| (vl(v), v.used as f64)).collect());
    gauge(&mut o, "zfs_dataset_volume_size_bytes", "Volume size (volsize)", "gauge", s.volumes.iter().map(|v| (vl(v), v.volsize as f64)).collect());

    // zpool_prometheus-style per-vdev counters: labels name (pool) and vdev path.
    let mut rows: Vec<(String, &zilla_core::vdev::queue::LeafStats)> = vec![];
    for snap in &s.iostat {
        rows.push((format!("name=\"{}\",vdev=\"root\"", snap.pool), &snap.stats));
        fn walk<'a>(pool: &str, prefix: &str, v: &'a IostatNode, out: &mut Vec<(String, &'a zilla_core::vdev::queue::LeafStats)>) {
            let path = format!("{prefix}/{}", v.name.replace('"', "'"));
            out.push((format!("name=\"{pool}\",vdev=\"{path}\""), &v.stats));
            for c in &v.children {
                walk(pool, &path, c, out);
            }
        }
        for v in &snap.vdevs {
            walk(&snap.pool, "root", v, &mut rows);
        }
    }
    let sum = |st: &zilla_core::vdev::queue::LeafStats, bytes: bool, read: bool| -> f64 {
        IoClass::ALL
            .iter()
            .filter(|c| c.is_read() == read)
            .map(|&c| if bytes { st.bytes[c as usize] } else { st.ops[c as usize] })
            .sum::<u64>() as f64
    };
    for (name, bytes, read, help) in [
        ("zpool_stats_read_ops", false, true, "Read operations"),
        ("zpool_stats_write_ops", false, false, "Write operations"),
        ("zpool_stats_read_bytes", true, true, "Bytes read"),
        ("zpool_stats_write_bytes", true, false, "Bytes written"),
    ] {
        gauge(&mut o, name, help, "counter", rows.iter().map(|(l, st)| (l.clone(), sum(st, bytes, read))).collect());
    }
    gauge(&mut o, "zpool_stats_flushes", "Cache flushes", "counter", rows.iter().map(|(l, st)| (l.clone(), st.flushes as f64)).collect());
    o
}
