"""Scenario throttle: seed 002's experiment, the OpenZFS write throttle against the
legacy (2008-2013) one, side by side in one run.

Theory of operation: one daemon, one pool on a single sim-ssd leaf whose model is set
to a fixed bandwidth (100 MB/s, no per-I/O latency, one channel), so the device, not
the CPU, limits the write rate. A volume with 8K blocks (no read-modify-write) takes
8K random async writes (no FUA, no flush) from fio's nbd engine: 10 connections with
1, 10 and 100 writes in flight each, that is 10, 100 and 1000 writers. Each load runs
for several txgs in `openzfs` mode, then in `legacy` mode (`zfs_write_throttle_mode`),
alternating, with an NBD FLUSH between runs so one run's write-back is not the next
one's. Each run starts with an empty dirty set, and its first seconds fill it at
software speed (to the dirty max in legacy mode, to ~65 % in openzfs mode): that is
a burst absorbed by memory, not throughput, and measured with the rest it credited
legacy with the 0.37 GB more it held dirty at the end (15 MB/s of a 25 s run). So fio
runs `ramp_s` first, unmeasured, and measures `runtime_s`. Legacy's dirty data still
grows through the window (its txg limit follows the measured bandwidth), so the
throughput compared is the *sustained* rate: acknowledged bytes less the growth of
dirty data over the window (what reached the device or was overwritten in memory),
with the device's own write rate over the window beside it. fio
reports each write's latency (submission to acknowledgement) as mean,
stddev, percentiles and a histogram (json+ bins); the histograms of both modes are
drawn on one log-log plot per load (an SVG next to the JSON) - seed 002's figure.

By Little's law both modes have about the same mean at the same throughput (writers /
rate); what the throttle decides is the spread: legacy runs at software speed, then
10 ms per write past 7/8 of the txg's write limit, then stalls a whole sync; OpenZFS
delays every write a little as dirty data grows.
"""

import json
import math
import os
import subprocess
import time

from lib.daemon import Zilla
from lib.fio import nbd_flush
from lib.goals import goal
from lib.packages import ensure_tools
from lib.proc import BenchError, log, make_workdir, run
from lib.tables import fmt, table

NAME = "throttle"
DESCRIPTION = ("8K async random writes from 10/100/1000 writers on a 100 MB/s device: "
               "write latency under the OpenZFS throttle vs the legacy one (seed 002)")
MiB, GiB = 1 << 20, 1 << 30
MODES = ("openzfs", "legacy")


def settings(quick):
    return {"device_MBps": 100, "device_file_bytes": 16 * GiB, "volume_bytes": 2 * GiB,
            "volblocksize": "8K", "zfs_dirty_data_max": 1 * GiB, "zfs_txg_timeout_s": 5,
            "zfs_txg_synctime_ms": 5000, "ramp_s": 8 if quick else 15, "runtime_s": 20 if quick else 60,
            "loads": [[10, 1], [10, 10], [10, 100]],
            "fio": "ioengine=nbd rw=randwrite bs=8k, numjobs x iodepth writers, ramp_time "
                   "(not measured) then runtime, time_based, group_reporting, json+ (latency histogram)"}


def run_scenario(ctx):
    ensure_tools(["fio"])
    cfg = settings(ctx.quick)
    wd = make_workdir()
    z = Zilla(ctx.new, wd)
    dev = os.path.join(wd, "ssd.img")
    with open(dev, "wb") as f:
        f.truncate(cfg["device_file_bytes"])
    for k, v in (("sim_ssd_cache_write_mb_s", cfg["device_MBps"]), ("sim_ssd_cache_write_latency_us", 0),
                 ("sim_ssd_cache_channels", 1), ("zfs_dirty_data_max", cfg["zfs_dirty_data_max"]),
                 ("zfs_txg_timeout", cfg["zfs_txg_timeout_s"]),
                 ("zfs_txg_synctime_ms", cfg["zfs_txg_synctime_ms"])):
        z.cli("tunable", "set", f"{k}={v}")
    z.cli("pool", "create", "-f", "bench", f"sim-ssd:{dev}")
    z.cli("volume", "create", "-V", str(cfg["volume_bytes"]), "-o", "volblocksize=8K", "bench/vol")
    log(f"workdir {wd}; one sim-ssd at {cfg['device_MBps']} MB/s; "
        f"{cfg['ramp_s']} s ramp + {cfg['runtime_s']} s measured per load and mode")
    results = {}
    for jobs, depth in cfg["loads"]:
        writers = jobs * depth
        for i, mode in enumerate(MODES if writers != 100 else reversed(MODES)):
            z.cli("tunable", "set", f"zfs_write_throttle_mode={mode}")
            r = fio_writers(z, jobs, depth, cfg, wd, f"{mode}-{writers}")
            results.setdefault(str(writers), {})[mode] = r
            nbd_flush(z.uri("bench/vol"), wd, f"{mode}-{writers}")
            log(f"{writers:>4} writers {mode:>7}: {r['MBps']:6.1f} MB/s ({r['sustained_MBps']:.1f} sustained, "
                f"device {r['window']['device_write_MBps']:.1f}), mean {r['mean_us']:9.0f} us, "
                f"stddev {r['stddev_us']:9.0f} us, p50 {r['p50_us']:8.0f} us, p99.9 {r['p99_9_us']:9.0f} us, "
                f"max {r['max_us']:9.0f} us")
    z.cli("tunable", "set", "zfs_write_throttle_mode=openzfs")
    z.cli("pool", "export", "bench")
    z.stop()
    plot = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "throttle.svg")
    write_svg(results, plot)
    print_table(results)
    hist = {w: {m: r.pop("histogram") for m, r in per.items()} for w, per in results.items()}
    return {"config": cfg, "results": results, "histograms_us": hist, "plot": os.path.relpath(plot),
            "goals": goals(results)}


def fio_writers(z, jobs, depth, cfg, wd, tag):
    """One load: fio runs `ramp_s` unmeasured, then `runtime_s` measured; the pool's
    counters are read when the measured window starts and when fio ends."""
    out = os.path.join(wd, f"fio-{tag}.json")
    cmd = ["fio", "--output-format=json+", f"--output={out}", "--lat_percentiles=1",
           "--percentile_list=50:99:99.9", "--name=w", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}",
           "--rw=randwrite", "--bs=8k", f"--numjobs={jobs}", f"--iodepth={depth}",
           f"--size={cfg['volume_bytes']}", "--time_based", f"--ramp_time={cfg['ramp_s']}",
           f"--runtime={cfg['runtime_s']}", "--group_reporting", "--randrepeat=0"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(cfg["ramp_s"])
    start = (time.monotonic(), dmu_tx(z), z.admin.device_bytes("bench"))
    stdout, stderr = p.communicate()
    end = (time.monotonic(), dmu_tx(z), z.admin.device_bytes("bench"))
    if p.returncode != 0:
        err = (stderr or stdout or "").strip().splitlines()
        raise BenchError(f"fio {tag} failed ({p.returncode}): {err[-1] if err else ''}")
    window_s = end[0] - start[0]
    dirty = "zilla_dmu_tx_dirty_bytes"
    window = {"seconds": round(window_s, 2),
              "device_write_MBps": round((end[2]["write"] - start[2]["write"]) / 1e6 / window_s, 2),
              "dirty_start_bytes": int(start[1].get(dirty, 0)), "dirty_end_bytes": int(end[1].get(dirty, 0))}
    # counters as the window's increase; gauges (dirty, limits) as at its end
    tx = {k: (v - start[1].get(k, 0) if k.endswith("_total") else v) for k, v in end[1].items()}
    with open(out) as f:
        text = f.read()
    w = json.loads(text[text.index("{"):])["jobs"][0]["write"]
    lat = w.get("lat_ns") or w["clat_ns"]
    pct = lat.get("percentile", {})
    bins = lat.get("bins") or w.get("clat_ns", {}).get("bins") or {}
    us = lambda ns: round(ns / 1000, 1)
    mbps = w["bw_bytes"] / 1e6
    # what the pool sustains: the acknowledged rate less what the window left buffered
    # in dirty data (a run that ends with more dirty data than it began with wrote that
    # much into memory, not to the device)
    sustained = mbps - (window["dirty_end_bytes"] - window["dirty_start_bytes"]) / 1e6 / window_s
    return {"writers": jobs * depth, "ios": w["total_ios"], "MBps": round(mbps, 2),
            "sustained_MBps": round(sustained, 2), "window": window, "dmu_tx": tx,
            "iops": round(w["iops"], 1), "mean_us": us(lat["mean"]), "stddev_us": us(lat["stddev"]),
            "p50_us": us(pct.get("50.000000", 0)), "p99_us": us(pct.get("99.000000", 0)),
            "p99_9_us": us(pct.get("99.900000", 0)), "max_us": us(lat["max"]),
            "histogram": log2_histogram(bins)}


def log2_histogram(bins):
    """fio's fine bins (ns -> count) folded into power-of-two microsecond buckets."""
    h = {}
    for ns, n in bins.items():
        b = 1 << max(0, int(math.log2(max(1.0, int(ns) / 1000))))
        h[b] = h.get(b, 0) + n
    return {str(k): h[k] for k in sorted(h)}


def dmu_tx(z):
    """The pool's write-throttle counters from /metrics."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{z.http_port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("zilla_dmu_tx_") and 'pool="bench"' in line:
            name = line.split("{")[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def goals(results):
    g = []
    for w, per in results.items():
        o, l = per["openzfs"], per["legacy"]
        g.append(goal(f"{w} writers: openzfs mean / legacy mean", "<=", 1.0, round(o["mean_us"] / max(1e-9, l["mean_us"]), 3)))
        g.append(goal(f"{w} writers: legacy stddev / openzfs stddev", ">=", 5.0, round(l["stddev_us"] / max(1e-9, o["stddev_us"]), 3)))
        g.append(goal(f"{w} writers: openzfs p99.9 / p50", "<=", 10.0, round(o["p99_9_us"] / max(1e-9, o["p50_us"]), 3)))
        g.append(goal(f"{w} writers: openzfs sustained throughput / legacy", ">=", 0.95,
                      round(o["sustained_MBps"] / max(1e-9, l["sustained_MBps"]), 3)))
    return g


def print_table(results):
    rows = []
    for w, per in results.items():
        for m in MODES:
            r = per[m]
            rows.append([w, m, fmt(r["MBps"]), fmt(r["sustained_MBps"]), fmt(r["window"]["device_write_MBps"]),
                         fmt(r["window"]["dirty_start_bytes"] / 1e6, 0), fmt(r["window"]["dirty_end_bytes"] / 1e6, 0),
                         fmt(r["mean_us"], 0), fmt(r["stddev_us"], 0), fmt(r["p50_us"], 0),
                         fmt(r["p99_us"], 0), fmt(r["p99_9_us"], 0), fmt(r["max_us"], 0)])
    print(table(["writers", "throttle", "MB/s", "sustained MB/s", "device MB/s", "dirty MB start",
                 "dirty MB end", "mean us", "stddev us", "p50 us", "p99 us", "p99.9 us", "max us"], rows))


def write_svg(results, path):
    """One log-log panel per load: write count per latency bucket, both modes."""
    pw, ph, pad = 360, 260, 50
    loads = list(results)
    colours = {"openzfs": "#1f77b4", "legacy": "#d62728"}
    lx = lambda us: pad + (math.log10(max(us, 1)) / 7) * (pw - pad - 10)     # 1 us .. 10 s
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{pw * len(loads)}" height="{ph + 40}" '
             f'font-family="sans-serif" font-size="11">']
    for i, w in enumerate(loads):
        ox = i * pw
        hs = {m: results[w][m]["histogram"] for m in MODES}
        top = max([n for h in hs.values() for n in h.values()] + [10])
        ly = lambda n: ph - 30 - (math.log10(max(n, 1)) / math.log10(top)) * (ph - 60)
        parts.append(f'<g transform="translate({ox},20)"><text x="{pw / 2}" y="0" text-anchor="middle">'
                     f'{w} writers: 8K async write latency</text>')
        parts.append(f'<line x1="{pad}" y1="{ph - 30}" x2="{pw - 10}" y2="{ph - 30}" stroke="black"/>'
                     f'<line x1="{pad}" y1="{ph - 30}" x2="{pad}" y2="30" stroke="black"/>')
        for e, lab in ((0, "1us"), (3, "1ms"), (6, "1s")):
            x = lx(10 ** e)
            parts.append(f'<text x="{x}" y="{ph - 15}" text-anchor="middle">{lab}</text>')
        parts.append(f'<text x="{pad - 5}" y="{ly(top)}" text-anchor="end">{top}</text>'
                     f'<text x="{pad - 5}" y="{ph - 30}" text-anchor="end">1</text>')
        for j, m in enumerate(MODES):
            pts = " ".join(f"{lx(int(b) * 1.41):.1f},{ly(n):.1f}" for b, n in hs[m].items() if n > 0)
            parts.append(f'<polyline fill="none" stroke="{colours[m]}" stroke-width="1.5" points="{pts}"/>'
                         f'<text x="{pw - 80}" y="{40 + 14 * j}" fill="{colours[m]}">{m}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")
