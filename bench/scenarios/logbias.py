"""Scenario logbias: 128K synchronous writes with logbias=latency vs throughput.

Theory of operation: one pool like the slog scenario's (two sim-hdd mirrors and a
sim-ssd log mirror) holds two volumes, one with logbias=latency (the default) and one
with logbias=throughput. fio's nbd engine writes 128K blocks at random aligned offsets
with an NBD FLUSH after each (4 writers, QD1 each), on one volume and then the other.
With latency every block is copied into the log (log device bytes per volume byte
about 1: the data is written twice, once to the log, once by the txg); with
throughput whole blocks are indirect: the flush writes them in place in the pool
(dmu_sync) and logs only their block pointers (about 0 log bytes per volume byte),
and the txg sync does not write them again (seed 003: throughput for large
streaming sync writes, the log kept for latency-sensitive ones). The log bytes come
from the log devices' own write counters (iostat), the volume bytes from fio.

Goals: log bytes per volume byte >= 0.9 with latency and <= 0.1 with throughput; the
throughput of each is reported (MB/s), with their ratio.
"""

import os

from lib.daemon import Zilla
from lib.goals import goal
from lib.machine import loadavg, wait_idle
from lib.packages import ensure_tools
from lib.proc import log, make_workdir
from lib.syncio import ZilDelta, sync_fio
from lib.tables import fmt, ratio, table

NAME = "logbias"
DESCRIPTION = ("128K sync writes (flush after each, 4 writers): logbias=latency vs "
               "throughput on two sim-hdd mirrors + a sim-ssd log mirror")
MiB, GiB = 1 << 20, 1 << 30
WRITERS = 4
LOG_DEVICE_BYTES = 2 * GiB


def run_scenario(ctx):
    ensure_tools(["fio"])
    runtime = 10 if ctx.quick else 30
    vol = 1 * GiB
    wd = make_workdir()
    log(f"workdir {wd}; {runtime}s per test, {WRITERS} writers, 128K + flush")
    z = Zilla(ctx.new, wd)
    d = [sparse(os.path.join(wd, f"d{i}.img"), vol * 2 + 2 * GiB) for i in range(4)]
    # A log device holds each log block until the txg of its records has synced and
    # two more have passed (deferred frees, as in OpenZFS): three to four txgs of the
    # sync write stream, about 1.2 GB here at 5 s txgs. OpenZFS's sizing rule for a
    # SLOG is the same; a smaller one sends log blocks to the pool's disks (counted
    # in `zil.lwbs_slog_full`) and this ratio then measures the log device's size,
    # not logbias.
    logs = [sparse(os.path.join(wd, f"log{i}.img"), LOG_DEVICE_BYTES) for i in range(2)]
    z.cli("pool", "create", "tank", "mirror", "sim-hdd:" + d[0], "sim-hdd:" + d[1],
          "mirror", "sim-hdd:" + d[2], "sim-hdd:" + d[3], "log", "mirror",
          "sim-ssd:" + logs[0], "sim-ssd:" + logs[1])
    rows = {}
    for bias in ("latency", "throughput"):
        z.cli("volume", "create", "-s", "-V", str(vol), "-o", f"logbias={bias}", f"tank/{bias}")
        rows[bias] = one_test(z, wd, bias, runtime, vol)
    z.stop()
    a, b = rows["latency"], rows["throughput"]
    print(table(["128K sync writes, 4 writers", "MB/s", "IOPS", "lat mean us", "log bytes/volume byte",
                 "indirect itxs", "copied itxs", "lwbs on the pool (log full)"],
                [[k, fmt(r["MBps"], 2), fmt(r["iops"]), fmt(r["lat_mean_us"]),
                  fmt(r["log_bytes_per_volume_byte"], 3), fmt(r["zil"]["itx_indirect"]),
                  fmt(r["zil"]["itx_copied"]), fmt(r["zil"]["lwbs_slog_full"])] for k, r in rows.items()]))
    tput = ratio(b["MBps"], a["MBps"])
    print(f"\nthroughput / latency MB/s: {fmt(tput, 2)}")
    config = {"volume_bytes": vol, "bs": "128k", "writers": WRITERS, "runtime_s": runtime,
              "pool": "mirror sim-hdd sim-hdd mirror sim-hdd sim-hdd log mirror sim-ssd sim-ssd",
              "volblocksize": "16K (default)", "log_device_bytes": LOG_DEVICE_BYTES}
    return {"config": config, "results": rows, "throughput_over_latency_MBps": tput,
            "goals": [
                goal("log bytes per volume byte, logbias=latency", ">=", 0.9,
                     a["log_bytes_per_volume_byte"], unit="B/B"),
                goal("log bytes per volume byte, logbias=throughput", "<=", 0.1,
                     b["log_bytes_per_volume_byte"], unit="B/B"),
            ]}


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def log_device_write_bytes(z):
    """Bytes written to the log vdev's leaves (one copy: the first leaf of the log
    mirror), every I/O class."""
    for v in z.admin.iostat("tank")["vdevs"]:
        if v.get("role") not in ("Log", "log"):
            continue
        leaf = v["children"][0] if v.get("children") else v
        return sum(c.get("bytes", 0) for c in leaf["stats"]["classes"].values()
                   if c.get("direction") == "write")
    return 0


def one_test(z, wd, bias, runtime, vol):
    wait_idle(z.pid)
    la = loadavg()
    b0 = log_device_write_bytes(z)
    with ZilDelta(z) as zd:
        r = sync_fio(z.uri(f"tank/{bias}"), wd, bias, WRITERS, runtime, vol, bs="128k",
                     cpu_pid=z.pid, extra=["--blockalign=128k"])
    logged = log_device_write_bytes(z) - b0
    r["zil"] = zd.summary()
    r["log_device_bytes"] = logged
    vbytes = r["ios"] * 128 * 1024
    r["volume_bytes_written"] = vbytes
    r["log_bytes_per_volume_byte"] = round(logged / vbytes, 4) if vbytes else None
    r["loadavg_before"] = la
    log(f"logbias={bias:10}: {r['MBps']:.2f} MB/s  lat {r['lat_mean_us']} us  "
        f"log bytes/volume byte {r['log_bytes_per_volume_byte']}  load {la[0]}")
    return r
