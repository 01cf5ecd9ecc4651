"""Scenario picket-fence: seed 000's figure. Sync-read latency under a moderate async
write stream, per 100 ms interval, with the OpenZFS I/O scheduler and the legacy one.

Theory of operation: one daemon, one pool built like the demo's: two sim-hdd mirrors
and a sim-ssd log mirror. Volume `rd` is filled once with sequential 1M writes and
has `primarycache=metadata`, so every data read misses the ARC and reaches a disk.
Volume `wr` (1 GiB) takes the stream, which wraps around it (fio `--size` = the
volume, `--time_based`): after the first pass every write overwrites a block. In
this order:

1. idle: one client does QD1 4K random reads on `rd` (fio nbd engine) with nothing
   else running: the read latency the disks give on their own;
2. the pool's write bandwidth: 1M sequential async writes to `wr` for a while and
   an NBD FLUSH, bytes / (time including the flush): what a txg sync can sustain;
3. per scheduler mode (`zfs_vdev_scheduler_mode`, openzfs then legacy): the same
   QD1 reader, and beside it a second fio streaming 1M async writes to `wr` at half
   the measured bandwidth (`--rate`), for several txgs (`zfs_txg_timeout`). That is
   the moderate load under which seed 000 saw the fence: each txg sync floods the
   disks with async writes, and a read that arrives then waits behind them.

The devices' bytes live in memory. All six backing files (4 sim-hdd, 2 sim-ssd) are
in a /dev/shm dir (`lib.proc.make_memdir`, removed at exit, even with BENCH_KEEP=1;
BENCH_MEMDIR=0 or too little room in /dev/shm puts them in the work dir on the lab
disk, and the JSON says so: `config.backing`). Why: a sim device runs the backing
file's I/O first and then waits out the rest of its modelled service time, so the
model sets the device's time only while the real I/O is shorter than the model. On
the lab VM's one virtual disk a sim-hdd's 1 MiB O_DIRECT pwrite into a 12 GB sparse
file overran its model by more than 2 ms for 36 % of writes (up to 0.81 s), and a QD1
read queued behind such a write waited for the lab disk: the 1.4 s stalls of
docs/BENCHMARKS.md (picket-fence). In tmpfs a 1 MiB overwrite takes ~0.3 ms (p50), under
the model's 3.5 ms cache write. The first write into a tmpfs page was slow, though
(a hole: 2-4 ms per 1 MiB, p90 up to 13 ms; even a posix_fallocate'd page 1.1-2.2 ms),
so the sim-hdd files are written with zeros once before the pool is created
(`preallocated`, ~1 s per GiB); the log SSDs' files stay sparse (the async stream
barely uses the log).

Memory is bounded by the device sizes, not by the volume written: there is no TRIM of
freed blocks, and under a COW overwrite stream the allocator's cursor walks the whole
device (a txg's blocks go after the previous txg's, freed space comes back 3 txgs
later), so every page of the sim-hdds would be touched within the run anyway: 4 x 2
GiB resident from the start, plus the few MB the logs take; 9 GiB at the very most.
The JSON records the files' allocated bytes after each phase and the backing file
system's df Used at the end (`backing_memory`). 2 GiB fits the worst case: per mirror
128 MiB of `rd` + 512 MiB of `wr` + the blocks of the two txgs whose frees are still
deferred and of the txg being written (~250 MiB each: txgs close at ~500 MB of dirty
data) + metadata; the runs end at 2.68 of 4.0 GiB allocated (67 %, `pool_list_end`).
The write volume is 1 GiB so that one txg never holds it twice over: the stream
(76-126 MB/s in the runs) wraps every 8-14 s, the bandwidth probe every 4-7 s, and a
txg is ~500 MB, so no block is written twice in one txg and the pool writes what fio
writes.

Device size and the seek model: a sim-hdd's seek is settle + (full_stroke - settle) x
sqrt(d / device_size) (vdev/sim.rs), i.e. the backing file is the whole platter. The
same byte distance is a longer seek on a smaller device: `rd`'s 128 MiB per leaf
spans 6 % of a 2 GiB device's stroke and 1 % of a 12 GiB one's, so the idle random
read's modelled positioning grows. A Monte Carlo of the model (uniform reads over
128 MiB, seek + uniform rotation + transfer + 0.6 ms of protocol, which reproduces
the 12 GiB runs' measured idle mean 6.56 ms and p99 10.9 ms) gives for 2 GiB devices
a mean of 7.7 ms and a p99 of 12.5 ms (+15 %); the runs measure 7.6-7.9 ms and
12.4-13.7 ms. The model of the disk is unchanged (a 7200 rpm mechanism whose platter
is the backing file), but the idle p99, the denominator of the second goal, is ~15 %
higher than with the old 12 GiB devices, so that goal is that much easier for the
same reads under the stream; docs/BENCHMARKS.md gives the ratio both ways. Seeks
between the write stream and `rd` stay long either way (the stream's blocks spread
over the whole device).

fio logs every read's latency (`--write_lat_log`, `--log_avg_msec=0`); the bench cuts
the reader's timeline into 100 ms intervals and takes each interval's p99 (at QD1 on
a disk about 10-20 reads per interval, so an interval's p99 is nearly its slowest
read; intervals with fewer than 3 reads are left out). The figure plots the interval
p99 over time for both modes (an SVG next to the JSON). The OpenZFS scheduler keeps
the async-write concurrency low while dirty data is low (`zfs_vdev_async_write_
active_min_dirty_percent`) and gives the sync-read class its own slots, so a read
waits behind at most a few writes; legacy gives async writes a fixed 10 slots from
the first byte, and the reads of each sync wait behind all of them: the square wave.

The daemon's analytics history gives the pictures: the worksheet's heat map of the
reader's latency (`io.latency/op` filtered to `read`, one column a second) for each
mode's run and for both runs on one axis, saved in bench/results/picket-fence-heatmap-
{default,legacy}.png and picket-fence-heatmap.png (headless chromium; skipped without
it); the JSON's `heatmaps` record has their time ranges and each second's read p99
bucket from the query API.

Goals: in openzfs mode the highest interval p99 is at most 3x the lowest,
and the reader's p99 under the writer stays within 3x of its idle p99. The legacy
ratio is reported, not judged (it is the baseline the fence is seen in).
"""

import json
import os
import statistics
import subprocess
import time

from lib.daemon import Zilla
from lib.fio import nbd_flush
from lib.goals import goal
from lib.heatmap import analytics_catalog, analytics_enable, analytics_now, analytics_query, screenshot_worksheet
from lib.packages import ensure_tools
from lib.proc import ROOT, BenchError, allocated_bytes, fs_used_bytes, is_memdir, log, make_memdir, make_workdir, run
from lib.tables import fmt, table

from .slog import sparse

NAME = "picket-fence"
DESCRIPTION = ("QD1 4K sync reads beside a 1M async write stream at half the pool's bandwidth: "
               "p99 per 100 ms, OpenZFS scheduler vs legacy (seed 000's picket fence)")
MiB, GiB = 1 << 20, 1 << 30
MODES = ("openzfs", "legacy")
INTERVAL_MS = 100
MIN_READS_PER_INTERVAL = 3


def settings(quick):
    return {"read_volume_bytes": 256 * MiB, "write_volume_bytes": 1 * GiB,
            "sim_hdd_bytes": 2 * GiB, "log_ssd_bytes": 512 * MiB, "zfs_txg_timeout_s": 5,
            "idle_s": 10 if quick else 30, "bandwidth_probe_s": 10 if quick else 20,
            "runtime_s": 30 if quick else 90, "write_rate_fraction": 0.5,
            "reader": "fio ioengine=nbd rw=randread bs=4k iodepth=1, primarycache=metadata",
            "writer": "fio ioengine=nbd rw=write bs=1M iodepth=4 --size=(write volume) --time_based "
                      "--rate=(fraction x measured bandwidth): wraps, overwriting the volume",
            "pool": "mirror sim-hdd sim-hdd mirror sim-hdd sim-hdd log mirror sim-ssd sim-ssd",
            # PICKET_TUNABLES="name=value,...": extra tunables for experiments (set before
            # the pool is created, so device models see them); recorded in the JSON
            "extra_tunables": [kv for kv in os.environ.get("PICKET_TUNABLES", "").split(",") if kv]}


def run_scenario(ctx):
    ensure_tools(["fio"])
    cfg = settings(ctx.quick)
    wd = make_workdir()
    z = Zilla(ctx.new, wd)
    z.cli("tunable", "set", f"zfs_txg_timeout={cfg['zfs_txg_timeout_s']}")
    for name, _ in HEATMAP_DATASETS:
        analytics_enable(z.http_port, name)      # the pictures' datasets are collected
    for kv in cfg["extra_tunables"]:
        z.cli("tunable", "set", kv)
    # every device's bytes in memory: the model, not the lab disk, sets their time
    md = make_memdir(need_bytes=backing_worst_case(cfg))
    cfg["backing"] = backing_record(md, cfg)
    log(f"device backing files in {md} ({cfg['backing']['where']})")
    disks = [preallocated(os.path.join(md, f"d{i}.img"), cfg["sim_hdd_bytes"]) for i in range(4)]
    logs = [sparse(os.path.join(md, f"log{i}.img"), cfg["log_ssd_bytes"]) for i in range(2)]
    files = disks + logs
    memory = {}
    z.cli("pool", "create", "-f", "bench", "mirror", f"sim-hdd:{disks[0]}", f"sim-hdd:{disks[1]}",
          "mirror", f"sim-hdd:{disks[2]}", f"sim-hdd:{disks[3]}",
          "log", "mirror", f"sim-ssd:{logs[0]}", f"sim-ssd:{logs[1]}")
    memory["after_create"] = allocated_bytes(files)
    z.cli("volume", "create", "-V", str(cfg["read_volume_bytes"]), "-o", "primarycache=metadata", "bench/rd")
    z.cli("volume", "create", "-s", "-V", str(cfg["write_volume_bytes"]), "bench/wr")
    log(f"workdir {wd}; filling bench/rd ({cfg['read_volume_bytes'] >> 20} MiB)")
    fill(z, wd, cfg)
    memory["after_fill"] = allocated_bytes(files)

    idle = reader(z, wd, cfg, "idle", cfg["idle_s"])
    log(f"idle reader: {idle['reads']} reads, mean {idle['mean_us']} us, p99 {idle['p99_us']} us")
    bw = write_bandwidth(z, wd, cfg)
    memory["after_bandwidth_probe"] = allocated_bytes(files)
    rate = int(bw * cfg["write_rate_fraction"])
    log(f"pool write bandwidth {bw / 1e6:.1f} MB/s; the stream writes at {rate / 1e6:.1f} MB/s")

    runs, spans = {}, {}
    for mode in MODES:
        z.cli("tunable", "set", f"zfs_vdev_scheduler_mode={mode}")
        nbd_flush(z.uri("bench/wr"), wd, f"before-{mode}")
        t0 = analytics_now(z.http_port)
        runs[mode] = under_writer(z, wd, cfg, mode, rate)
        spans[mode] = (t0, analytics_now(z.http_port))
        memory[f"after_{mode}"] = allocated_bytes(files)
        r = runs[mode]
        log(f"{mode:>7}: {r['reads']} reads, p99 {r['p99_us']} us; interval p99 "
            f"{r['interval_p99_min_us']}..{r['interval_p99_max_us']} us (x{r['interval_p99_ratio']}); "
            f"writer {r['writer_MBps']} MB/s")
    z.cli("tunable", "set", "zfs_vdev_scheduler_mode=openzfs")
    time.sleep(2)          # the last second's point is collected
    heatmaps = heatmap_pictures(z, spans, cfg)
    txgs = txg_history(z)
    pool_list = pool_capacity(z)
    z.cli("pool", "export", "bench")
    z.stop()
    backing_memory = {"allocated_bytes_by_phase": memory, "allocated_GiB_end": round(memory["after_legacy"] / GiB, 2),
                      "worst_case_GiB": round(backing_worst_case(cfg) / GiB, 2),
                      "backing_fs_used_GiB_end": round(fs_used_bytes(md) / GiB, 2)}
    log(f"backing files hold {backing_memory['allocated_GiB_end']} GiB "
        f"(worst case {backing_memory['worst_case_GiB']}); {md}'s file system has "
        f"{backing_memory['backing_fs_used_GiB_end']} GiB in use (every user's)")

    plot = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "picket-fence.svg")
    write_svg(runs, idle, plot)
    print_table(idle, runs)
    series = {m: r.pop("series") for m, r in runs.items()}
    return {"config": cfg, "pool_write_bandwidth_MBps": round(bw / 1e6, 1),
            "writer_rate_MBps": round(rate / 1e6, 1), "idle": idle, "results": runs,
            "legacy_interval_p99_ratio": runs["legacy"]["interval_p99_ratio"],
            "interval_p99_series_us": series, "txgs_after": txgs, "pool_list_end": pool_list,
            "backing_memory": backing_memory, "plot": os.path.relpath(plot, ROOT), "heatmaps": heatmaps,
            "goals": goals(idle, runs)}


# the reader's latency as the front end saw it: every read beside the stream is the
# reader's (disk.latency/op|read draws the same picture; disk.latency/device mixes in
# the stream's writes)
HEATMAP_DATASETS = [("io.latency/op", "read")]
HEATMAP_NAMES = {"openzfs": "default", "legacy": "legacy"}


def heatmap_pictures(z, spans, cfg):
    """The worksheet's heat maps of each mode's run (daemon-clock `spans`) as
    bench/results/picket-fence-heatmap-{default,legacy}.png (each with its own latency
    axis), of both runs in one as picket-fence-heatmap.png, and per mode the read
    latency per second from the query API (the bucket of each second's p99), so the
    fence can be checked in numbers."""
    port = z.http_port
    edges = analytics_catalog(port)["buckets"]
    out = {"datasets": ["|".join(x for x in d if x) for d in HEATMAP_DATASETS],
           "clock": "daemon analytics clock, unix s"}
    for mode, (t0, t1) in spans.items():
        png = os.path.join(ROOT, "bench", "results", f"picket-fence-heatmap-{HEATMAP_NAMES[mode]}.png")
        label = "OpenZFS (default)" if mode == "openzfs" else "legacy"
        got = screenshot_worksheet(port, HEATMAP_DATASETS, t0, t1, png,
                                   caption=f"{label} I/O scheduler: QD1 4K reads beside a 1M async write stream "
                                           f"(zfs_txg_timeout={cfg['zfs_txg_timeout_s']} s)")
        q = analytics_query(port, "io.latency/op", t0, t1, "read")
        p99s = per_second_p99_us(q, edges)
        out[mode] = {"picture": os.path.relpath(got, ROOT) if got else None, "from": t0, "to": t1,
                     "read_p99_us_per_second_median": (statistics.median(v for _, v in p99s) if p99s else None),
                     "read_p99_us_per_second": p99s}
        log(f"{mode:>7}: per-second read p99 (bucket upper edge) median "
            f"{out[mode]['read_p99_us_per_second_median']} us over {len(p99s)} s")
    # both runs in one chart: one latency axis for both modes
    t0, t1, switch = spans["openzfs"][0], spans["legacy"][1], spans["legacy"][0]
    png = os.path.join(ROOT, "bench", "results", "picket-fence-heatmap.png")
    got = screenshot_worksheet(port, HEATMAP_DATASETS, t0, t1, png,
                               caption=f"QD1 4K reads beside a 1M async write stream: OpenZFS (default) I/O scheduler, "
                                       f"then legacy from {time.strftime('%H:%M:%S', time.localtime(switch))}")
    out["both"] = {"picture": os.path.relpath(got, ROOT) if got else None, "from": t0, "to": t1,
                   "legacy_from": switch}
    return out


def per_second_p99_us(query, edges):
    """[[time, upper edge (us) of the bucket holding that second's p99 read]] over the
    query's keys; seconds without reads are left out."""
    out = []
    for i, t in enumerate(query.get("times", [])):
        counts = {}
        for s in query.get("series", []):
            b = (s.get("buckets") or [None] * (i + 1))[i]
            for bucket, n in b or []:
                counts[bucket] = counts.get(bucket, 0) + n
        total = sum(counts.values())
        if not total:
            continue
        seen = 0
        for bucket in sorted(counts):
            seen += counts[bucket]
            if seen >= 0.99 * total:
                hi = edges["upper"][bucket] if edges["upper"][bucket] is not None else 2 * edges["lower"][bucket]
                out.append([t, round(hi / 1000, 1)])
                break
    return out


def backing_worst_case(cfg):
    """Bytes the backing files can come to hold: all of every device (see the docstring)."""
    return 4 * cfg["sim_hdd_bytes"] + 2 * cfg["log_ssd_bytes"]


def preallocated(path, size):
    """A device file with every page written once (zeros) before the pool exists: in
    tmpfs the first write into a page was slow (see the docstring), and the run touches
    every page of the sim-hdds anyway, so this costs no extra memory, ~1 s per GiB."""
    sparse(path, size)
    zeros = bytes(MiB)
    with open(path, "r+b") as f:
        for _ in range(size // MiB):
            f.write(zeros)
    return path


def backing_record(md, cfg):
    """Where the sim devices' bytes live, for the JSON."""
    mem = is_memdir(md)
    return {"dir": md, "where": "memory (tmpfs)" if mem else "work dir on the lab disk (no room in /dev/shm or BENCH_MEMDIR=0)",
            "in_memory": mem, "sim_hdd_bytes": cfg["sim_hdd_bytes"], "log_ssd_bytes": cfg["log_ssd_bytes"],
            "worst_case_bytes": backing_worst_case(cfg)}


def pool_capacity(z):
    """`pool list` at the end (how full the small devices got), as text."""
    try:
        return z.cli("pool", "list").splitlines()
    except Exception as e:          # informational only
        return [f"zilla pool list failed: {e}"]


def fio_cmd(z, export, name, extra):
    return ["fio", f"--name={name}", "--ioengine=nbd", f"--uri={z.uri(export)}"] + extra


def fill(z, wd, cfg):
    out = os.path.join(wd, "fill.txt")
    run(fio_cmd(z, "bench/rd", "fill", ["--rw=write", "--bs=1M", "--iodepth=4",
                                        f"--size={cfg['read_volume_bytes']}", "--end_fsync=1",
                                        f"--output={out}"]))


def reader(z, wd, cfg, tag, seconds):
    """QD1 4K random reads on bench/rd for `seconds`; per-read latencies from fio's log."""
    prefix = os.path.join(wd, f"rd-{tag}")
    cmd = fio_cmd(z, "bench/rd", f"rd-{tag}", [
        "--rw=randread", "--bs=4k", "--iodepth=1", f"--size={cfg['read_volume_bytes']}",
        "--time_based", f"--runtime={seconds}", "--randrepeat=0", f"--write_lat_log={prefix}",
        "--log_avg_msec=0", f"--output={prefix}.txt"])
    r = run(cmd, check=False)
    if r.returncode != 0:
        raise BenchError(f"fio reader {tag} failed ({r.returncode}); see {prefix}.txt")
    return summarise_reads(read_lat_log(prefix), seconds)


def read_lat_log(prefix):
    """[(time_ms, latency_us)] of the reads in fio's per-I/O latency log."""
    path = f"{prefix}_lat.1.log"
    if not os.path.exists(path):
        raise BenchError(f"fio wrote no latency log {path}")
    out = []
    with open(path) as f:
        for line in f:
            p = [x.strip() for x in line.split(",")]
            if len(p) >= 3 and p[2] == "0":          # direction 0: read
                out.append((int(p[0]), int(p[1]) / 1000.0))
    if not out:
        raise BenchError(f"no reads in {path}")
    return out


def pct(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


def summarise_reads(samples, seconds):
    lat = sorted(us for _, us in samples)
    by_interval = {}
    for t_ms, us in samples:
        by_interval.setdefault(t_ms // INTERVAL_MS, []).append(us)
    series = []
    for k in sorted(by_interval):
        v = sorted(by_interval[k])
        if len(v) >= MIN_READS_PER_INTERVAL:
            series.append([k * INTERVAL_MS / 1000.0, round(pct(v, 0.99), 1), len(v)])
    p99s = [s[1] for s in series]
    if not p99s:
        raise BenchError("no 100 ms interval had enough reads")
    return {"reads": len(lat), "iops": round(len(lat) / seconds, 1), "mean_us": round(statistics.mean(lat), 1),
            "p50_us": round(pct(lat, 0.5), 1), "p99_us": round(pct(lat, 0.99), 1),
            "p99_9_us": round(pct(lat, 0.999), 1), "max_us": round(lat[-1], 1),
            "intervals": len(series), "interval_p99_min_us": min(p99s), "interval_p99_max_us": max(p99s),
            "interval_p99_ratio": round(max(p99s) / max(1e-9, min(p99s)), 2),
            "interval_p99_median_us": round(statistics.median(p99s), 1), "series": series}


def write_bandwidth(z, wd, cfg):
    """Bytes/s the pool sustains for 1M sequential async writes, the final flush included."""
    out = os.path.join(wd, "bw.json")
    t0 = time.time()
    r = run(fio_cmd(z, "bench/wr", "bw", ["--rw=write", "--bs=1M", "--iodepth=4",
                                          f"--size={cfg['write_volume_bytes']}", "--time_based",
                                          f"--runtime={cfg['bandwidth_probe_s']}", "--end_fsync=1",
                                          "--output-format=json", f"--output={out}"]), check=False)
    elapsed = time.time() - t0
    if r.returncode != 0:
        raise BenchError(f"fio bandwidth probe failed ({r.returncode}); see {out}")
    with open(out) as f:
        text = f.read()
    written = json.loads(text[text.index("{"):])["jobs"][0]["write"]["io_bytes"]
    if written <= 0:
        raise BenchError("the bandwidth probe wrote nothing")
    return written / elapsed


def under_writer(z, wd, cfg, mode, rate):
    """The QD1 reader for runtime_s beside the rate-limited stream (started first, ends
    after the reader)."""
    wout = os.path.join(wd, f"wr-{mode}.json")
    wlog = open(os.path.join(wd, f"wr-{mode}.err"), "w")
    writer = subprocess.Popen(fio_cmd(z, "bench/wr", f"wr-{mode}", [
        "--rw=write", "--bs=1M", "--iodepth=4", f"--size={cfg['write_volume_bytes']}", "--time_based",
        f"--runtime={cfg['runtime_s'] + 4}", f"--rate={rate}", "--output-format=json", f"--output={wout}"]),
        stdout=wlog, stderr=wlog)
    try:
        time.sleep(2)          # the stream is running and dirtying the first txg
        if writer.poll() is not None:
            raise BenchError(f"the write stream exited early ({writer.returncode}); see {wout}")
        r = reader(z, wd, cfg, mode, cfg["runtime_s"])
        writer.wait(timeout=cfg["runtime_s"] + 120)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        wlog.close()
    if writer.returncode != 0:
        raise BenchError(f"the write stream failed ({writer.returncode}); see {wout}")
    with open(wout) as f:
        text = f.read()
    w = json.loads(text[text.index("{"):])["jobs"][0]["write"]
    r["writer_MBps"] = round(w["bw_bytes"] / 1e6, 1)
    return r


def txg_history(z):
    """The pool's last txgs (`zilla txgs`), as text: how long each sync took."""
    try:
        return z.cli("txgs", "bench").splitlines()[-12:]
    except Exception as e:          # informational only
        return [f"zilla txgs failed: {e}"]


def goals(idle, runs):
    o = runs["openzfs"]
    return [
        goal("openzfs: highest / lowest 100 ms interval p99 of QD1 reads under the stream", "<=", 3.0,
             o["interval_p99_ratio"]),
        goal("openzfs: QD1 read p99 under the stream / idle p99", "<=", 3.0,
             round(o["p99_us"] / max(1e-9, idle["p99_us"]), 3)),
    ]


def print_table(idle, runs):
    rows = [["no writer", "-", fmt(idle["iops"], 1), fmt(idle["mean_us"], 0), fmt(idle["p99_us"], 0),
             fmt(idle["interval_p99_min_us"], 0), fmt(idle["interval_p99_max_us"], 0), fmt(idle["interval_p99_ratio"], 2), "-"]]
    for m in MODES:
        r = runs[m]
        rows.append(["1M stream", m, fmt(r["iops"], 1), fmt(r["mean_us"], 0), fmt(r["p99_us"], 0),
                     fmt(r["interval_p99_min_us"], 0), fmt(r["interval_p99_max_us"], 0),
                     fmt(r["interval_p99_ratio"], 2), fmt(r["writer_MBps"], 1)])
    print(table(["load", "scheduler", "read IOPS", "mean us", "p99 us", "min ivl p99", "max ivl p99",
                 "max/min", "writer MB/s"], rows))


def write_svg(runs, idle, path):
    """Interval p99 over time, one line per mode, log y axis; the idle p99 as a line."""
    w, h, pad = 900, 320, 60
    colours = {"openzfs": "#1f77b4", "legacy": "#d62728"}
    tmax = max(s[0] for r in runs.values() for s in r["series"]) or 1
    top = max(max(s[1] for r in runs.values() for s in r["series"]), idle["p99_us"]) * 1.2
    bottom = min(min(s[1] for r in runs.values() for s in r["series"]), idle["p99_us"]) / 1.2
    import math
    lx = lambda t: pad + t / tmax * (w - pad - 20)
    ly = lambda us: h - 40 - (math.log10(us / bottom) / math.log10(top / bottom)) * (h - 80)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{w / 2}" y="16" text-anchor="middle">QD1 4K read p99 per {INTERVAL_MS} ms under a 1M async '
             f'write stream (picket-fence)</text>',
             f'<line x1="{pad}" y1="{h - 40}" x2="{w - 20}" y2="{h - 40}" stroke="black"/>',
             f'<line x1="{pad}" y1="{h - 40}" x2="{pad}" y2="30" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle">seconds</text>']
    for t in range(0, int(tmax) + 1, max(1, int(tmax) // 10)):
        parts.append(f'<text x="{lx(t):.1f}" y="{h - 26}" text-anchor="middle">{t}</text>')
    for e in range(int(math.floor(math.log10(bottom))), int(math.ceil(math.log10(top))) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if bottom <= v <= top:
                label = f"{v / 1000:g} ms" if v >= 1000 else f"{v:g} us"
                parts.append(f'<text x="{pad - 5}" y="{ly(v) + 4:.1f}" text-anchor="end">{label}</text>'
                             f'<line x1="{pad}" y1="{ly(v):.1f}" x2="{w - 20}" y2="{ly(v):.1f}" stroke="#eee"/>')
    parts.append(f'<line x1="{pad}" y1="{ly(idle["p99_us"]):.1f}" x2="{w - 20}" y2="{ly(idle["p99_us"]):.1f}" '
                 f'stroke="#2ca02c" stroke-dasharray="4 3"/><text x="{w - 25}" y="{ly(idle["p99_us"]) - 4:.1f}" '
                 f'text-anchor="end" fill="#2ca02c">idle p99</text>')
    for j, (m, r) in enumerate(runs.items()):
        pts = " ".join(f"{lx(t):.1f},{ly(p):.1f}" for t, p, _ in r["series"])
        parts.append(f'<polyline fill="none" stroke="{colours[m]}" stroke-width="1.2" points="{pts}"/>'
                     f'<text x="{pad + 10}" y="{40 + 14 * j}" fill="{colours[m]}">{m} (max/min {r["interval_p99_ratio"]})</text>')
    parts.append("</svg>")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")
