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
software speed (to the dirty max in legacy mode, to ~65 % in openzfs mode): that is a
burst absorbed by memory, not throughput. So each run has an unmeasured ramp that
ends, by the same rule in both modes, once the run is in its steady state: when the
pool's dirty data (sampled every `ramp.sample_s` from /metrics) grew by less than
`ramp.steady_fraction` of the dirty max over the last `ramp.steady_window_s` (a least-
squares trend over more than one txg, so a txg's sawtooth does not decide it), after
at least `ramp.min_s` and at most `ramp.max_s` (the table marks a ramp that hit the
cap). A fixed ramp was not that: legacy's dirty data still grew 746 -> 1,066 MB
through a 20 s window after an 8 s ramp, so it acknowledged 115 MB/s while sustaining
99 and its mean latency was that of a pool still filling memory. One fio process runs
the whole load (no restart between ramp and window): the bench sends it SIGUSR1 when
the ramp ends and again `runtime_s` later, fio prints its cumulative json+ statistics
each time, and the window's figures are the difference of the two (counts, bytes, the
latency sum and sum of squares, the latency histogram; the percentiles are read from
the window's histogram the way fio reads its own). The throughput compared is still
the *sustained* rate: acknowledged bytes less the growth of dirty data over the window
(what reached the device or was overwritten in memory; the growth is the least-squares
trend of the dirty samples taken through the window, since legacy's swings by ~200 MB
within each txg and two point readings are that noisy), with the device's own write
rate over the window beside it. fio reports each write's latency (submission to
acknowledgement) as mean, stddev, percentiles and a histogram (json+ bins); the
histograms of both modes are drawn on one log-log plot per load (an SVG next to the
JSON) - seed 002's figure.

By Little's law both modes have about the same mean at the same throughput (writers /
rate); what the throttle decides is the spread: legacy runs at software speed, then
10 ms per write past 7/8 of the txg's write limit, then stalls a whole sync; OpenZFS
delays every write a little as dirty data grows.
"""

import json
import math
import os
import signal
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
            "zfs_txg_synctime_ms": 5000, "runtime_s": 20 if quick else 60,
            "ramp": {"min_s": 6, "max_s": 30 if quick else 60, "sample_s": 0.25, "steady_window_s": 6,
                     "steady_fraction": 0.02},
            "loads": [[10, 1], [10, 10], [10, 100]],
            "fio": "ioengine=nbd rw=randwrite bs=8k, numjobs x iodepth writers, time_based, group_reporting, "
                   "json+; SIGUSR1 at the ramp's end and runtime_s later, the window = the difference"}


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
        f"a ramp until dirty data is steady ({cfg['ramp']['min_s']}-{cfg['ramp']['max_s']} s) + "
        f"{cfg['runtime_s']} s measured per load and mode")
    results = {}
    for jobs, depth in cfg["loads"]:
        writers = jobs * depth
        for i, mode in enumerate(MODES if writers != 100 else reversed(MODES)):
            z.cli("tunable", "set", f"zfs_write_throttle_mode={mode}")
            r = fio_writers(z, jobs, depth, cfg, wd, f"{mode}-{writers}")
            results.setdefault(str(writers), {})[mode] = r
            nbd_flush(z.uri("bench/vol"), wd, f"{mode}-{writers}")
            log(f"{writers:>4} writers {mode:>7}: ramp {r['ramp']['seconds']:4.1f} s "
                f"({'steady' if r['ramp']['steady'] else 'capped'}), dirty MB "
                f"{r['window']['dirty_start_bytes'] / 1e6:.0f} -> {r['window']['dirty_end_bytes'] / 1e6:.0f} "
                f"(trend {r['window']['dirty_growth_bytes'] / 1e6:+.0f}); "
                f"{r['MBps']:6.1f} MB/s ({r['sustained_MBps']:.1f} sustained, "
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
    """One load: one fio process, unmeasured until the pool's dirty data is steady
    (`ramp_until_steady`), then `runtime_s` measured between two SIGUSR1 status dumps;
    the pool's counters are read at both ends of the window."""
    out = os.path.join(wd, f"fio-{tag}.json")
    ramp = cfg["ramp"]
    cmd = ["fio", "--output-format=json+", f"--output={out}", "--lat_percentiles=1",
           "--percentile_list=50:99:99.9", "--name=w", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}",
           "--rw=randwrite", "--bs=8k", f"--numjobs={jobs}", f"--iodepth={depth}",
           f"--size={cfg['volume_bytes']}", "--time_based",
           f"--runtime={ramp['max_s'] + cfg['runtime_s'] + 30}", "--group_reporting", "--randrepeat=0"]
    err_path = os.path.join(wd, f"fio-{tag}.err")
    with open(err_path, "w") as err_f:
        p = subprocess.Popen(cmd, stdout=err_f, stderr=subprocess.STDOUT)
    try:
        ramp_s, steady, samples = ramp_until_steady(z, p, ramp, err_path)
        start = (time.monotonic(), dmu_tx(z), z.admin.device_bytes("bench"))
        p.send_signal(signal.SIGUSR1)
        in_window = sample_dirty(z, start[0], start[0] + cfg["runtime_s"], ramp["sample_s"])
        end = (time.monotonic(), dmu_tx(z), z.admin.device_bytes("bench"))
        p.send_signal(signal.SIGUSR1)
        time.sleep(0.5)                 # fio writes the dump between its I/Os
        p.send_signal(signal.SIGINT)    # the run's own end: in-flight writes drain
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    with open(out) as f:
        dumps = json_objects(f.read())
    if len(dumps) < 2:
        err = last_line(err_path)
        raise BenchError(f"fio {tag}: {len(dumps)} status dumps, not 2 ({p.returncode}): {err}")
    w = window_stats(dumps[0], dumps[1])
    window_s = end[0] - start[0]
    dirty = "zilla_dmu_tx_dirty_bytes"
    in_window = [(0.0, start[1].get(dirty, 0.0))] + in_window + [(window_s, end[1].get(dirty, 0.0))]
    growth = trend_growth(in_window, window_s)
    window = {"seconds": round(window_s, 2), "fio_seconds": w["seconds"],
              "device_write_MBps": round((end[2]["write"] - start[2]["write"]) / 1e6 / window_s, 2),
              "dirty_start_bytes": int(start[1].get(dirty, 0)), "dirty_end_bytes": int(end[1].get(dirty, 0)),
              "dirty_growth_bytes": int(growth),
              "dirty_samples": [[round(t, 2), int(d)] for t, d in in_window]}
    # counters as the window's increase; gauges (dirty, limits) as at its end
    tx = {k: (v - start[1].get(k, 0) if k.endswith("_total") else v) for k, v in end[1].items()}
    # what the pool sustains: the acknowledged rate less what the window left buffered
    # in dirty data (a run whose dirty data grows wrote that much into memory, not to
    # the device). The growth is the trend of the samples over the window (least
    # squares), not end minus start: legacy's dirty data swings by ~200 MB within each
    # txg, so two point readings differ by that much in a steady state.
    sustained = w["MBps"] - growth / 1e6 / window_s
    ramp_rec = {"seconds": round(ramp_s, 2), "steady": steady,
                "dirty_start_bytes": int(samples[0][1]) if samples else 0,
                "dirty_end_bytes": int(samples[-1][1]) if samples else 0,
                "dirty_samples": [[round(t, 2), int(d)] for t, d in samples]}
    return {"writers": jobs * depth, "ios": w["ios"], "MBps": w["MBps"], "sustained_MBps": round(sustained, 2),
            "ramp": ramp_rec, "window": window, "dmu_tx": tx, "iops": w["iops"], "mean_us": w["mean_us"],
            "stddev_us": w["stddev_us"], "p50_us": w["p50_us"], "p99_us": w["p99_us"],
            "p99_9_us": w["p99_9_us"], "max_us": w["max_us"], "histogram": log2_histogram(w["bins"])}


def last_line(path):
    with open(path) as f:
        lines = f.read().strip().splitlines()
    return lines[-1] if lines else ""


def ramp_until_steady(z, p, ramp, err_path):
    """Sample the pool's dirty bytes every `sample_s` while fio runs; return (ramp
    seconds, steady?, [(t, dirty bytes)]) once `is_steady` says so (not before
    `min_s`), or at `max_s`."""
    t0 = time.monotonic()
    samples = []
    while True:
        time.sleep(ramp["sample_s"])
        if p.poll() is not None:
            raise BenchError(f"fio ended during its ramp ({p.returncode}): {last_line(err_path)}")
        t = time.monotonic() - t0
        tx = dmu_tx(z)
        samples.append((t, tx.get("zilla_dmu_tx_dirty_bytes", 0.0)))
        if t >= ramp["min_s"] and is_steady(samples, ramp["steady_window_s"],
                                            ramp["steady_fraction"] * tx.get("zilla_dmu_tx_dirty_max_bytes", 1 << 30)):
            return t, True, samples
        if t >= ramp["max_s"]:
            return t, False, samples


def sample_dirty(z, t0, until, period_s):
    """[(seconds since t0, dirty bytes)] every `period_s` until the monotonic time `until`."""
    out = []
    while True:
        now = time.monotonic()
        if now >= until:
            return out
        time.sleep(min(period_s, until - now))
        if time.monotonic() < until:
            out.append((time.monotonic() - t0, dmu_tx(z).get("zilla_dmu_tx_dirty_bytes", 0.0)))


def trend_growth(pts, span_s):
    """Growth over `span_s` of the least-squares line through [(t, bytes)]."""
    n = len(pts)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in pts) / n
    md = sum(d for _, d in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    return (sum((t - mt) * (d - md) for t, d in pts) / var if var else 0.0) * span_s


def is_steady(samples, window_s, max_growth):
    """Whether dirty data grew (or shrank) by at most `max_growth` bytes over the last
    `window_s` (its least-squares trend). The window is longer than one txg
    (zfs_txg_timeout 5 s), so a txg's sawtooth and a sync-long plateau of legacy's
    stalled writers are not taken for a steady state."""
    t_end = samples[-1][0]
    pts = [(t, d) for t, d in samples if t >= t_end - window_s]
    if len(pts) < 3 or pts[-1][0] - pts[0][0] < 0.8 * window_s:
        return False
    return abs(trend_growth(pts, window_s)) <= max_growth


def json_objects(text):
    """The JSON objects of a fio output file: one per status dump, then the final one."""
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        i = text.find("{", i)
        if i < 0:
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def window_stats(a, b):
    """The writes between two cumulative fio json+ dumps `a` and `b` (group_reporting,
    one job): counts and bytes subtracted; mean and stddev from the sums and sums of
    squares that each dump's N, mean and stddev imply; percentiles and max from the
    difference of the latency histograms, read as fio reads its own (the first bin at
    which the cumulative count reaches the percentile)."""
    wa, wb = a["jobs"][0]["write"], b["jobs"][0]["write"]
    seconds = (b["timestamp_ms"] - a["timestamp_ms"]) / 1000
    la, lb = wa.get("lat_ns") or wa["clat_ns"], wb.get("lat_ns") or wb["clat_ns"]

    def sums(lat):
        n, mean, sd = lat.get("N", 0), lat.get("mean", 0.0), lat.get("stddev", 0.0)
        return n, mean * n, sd * sd * max(n - 1, 0) + n * mean * mean

    na, sa, qa = sums(la)
    nb, sb, qb = sums(lb)
    n = nb - na
    mean = (sb - sa) / n if n else 0.0
    var = ((qb - qa) - n * mean * mean) / (n - 1) if n > 1 else 0.0
    ba, bb = la.get("bins") or {}, lb.get("bins") or {}
    bins = {k: v - ba.get(k, 0) for k, v in bb.items() if v - ba.get(k, 0) > 0}
    ordered = sorted((int(k), v) for k, v in bins.items())
    total = sum(v for _, v in ordered)

    def pct(p):
        cum = 0
        for ns, c in ordered:
            cum += c
            if cum >= p / 100 * total:
                return ns
        return 0

    us = lambda ns: round(ns / 1000, 1)
    return {"seconds": round(seconds, 3), "ios": wb["total_ios"] - wa["total_ios"],
            "MBps": round((wb["io_bytes"] - wa["io_bytes"]) / 1e6 / seconds, 2) if seconds > 0 else 0.0,
            "iops": round((wb["total_ios"] - wa["total_ios"]) / seconds, 1) if seconds > 0 else 0.0,
            "mean_us": us(mean), "stddev_us": us(math.sqrt(max(var, 0.0))),
            "p50_us": us(pct(50)), "p99_us": us(pct(99)), "p99_9_us": us(pct(99.9)),
            "max_us": us(ordered[-1][0]) if ordered else 0.0, "bins": bins}


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
            rows.append([w, m, fmt(r["ramp"]["seconds"], 1) + ("" if r["ramp"]["steady"] else " (cap)"),
                         fmt(r["MBps"]), fmt(r["sustained_MBps"]), fmt(r["window"]["device_write_MBps"]),
                         fmt(r["window"]["dirty_start_bytes"] / 1e6, 0), fmt(r["window"]["dirty_end_bytes"] / 1e6, 0),
                         fmt(r["window"]["dirty_growth_bytes"] / 1e6, 0),
                         fmt(r["mean_us"], 0), fmt(r["stddev_us"], 0), fmt(r["p50_us"], 0),
                         fmt(r["p99_us"], 0), fmt(r["p99_9_us"], 0), fmt(r["max_us"], 0)])
    print(table(["writers", "throttle", "ramp s", "MB/s", "sustained MB/s", "device MB/s", "dirty MB start",
                 "dirty MB end", "dirty trend MB", "mean us", "stddev us", "p50 us", "p99 us", "p99.9 us", "max us"], rows))


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
