"""Scenario scrub-impact: what a running scrub costs a client's random reads, with the
OpenZFS I/O scheduler (scrub class, non-interactive credit) and the legacy one.

Theory of operation: one daemon, one pool of two sim-hdd mirrors. Volume `vol` is
filled once with sequential 1M writes (the scrub has blocks to read) and has
`primarycache=metadata`, so every client read reaches a disk. Per scheduler mode
(`zfs_vdev_scheduler_mode`, openzfs then legacy), in this order:

1. idle: the client alone, 4K random reads with 8 in flight (fio nbd engine) for
   `window_s`;
2. scrub alone: `zilla pool scrub`, its progress (`examined_bytes` from the admin
   API's pool status, every copy on every mirror child) over `window_s`;
3. both: the client again while that scrub keeps running; the scrub's progress over
   the same window;
4. `zilla pool scrub -s` stops it (the next mode starts a fresh one).

The scrub must still be running at the end of step 3 (else the bench fails: make the
data bigger). Reported per mode: client IOPS idle and under the scrub, their ratio, the
client's p99, scrub MB/s alone and under the client. The goal is on openzfs:
client IOPS under the scrub >= 0.8 of idle; legacy is reported for comparison. With
the OpenZFS queue, scrub I/Os are a class of their own with few slots, and the
non-interactive credit (`zfs_vdev_nia_credit`, `zfs_vdev_nia_delay`) lets them through
only when the interactive classes are idle or after a bounded number of them.
"""

import json
import os
import time

from lib.daemon import Zilla
from lib.goals import goal
from lib.packages import ensure_tools
from lib.proc import BenchError, log, make_workdir, run
from lib.tables import fmt, table

from .slog import sparse

NAME = "scrub-impact"
DESCRIPTION = ("4K random reads at QD8 (ARC misses) idle vs while a scrub runs, two sim-hdd mirrors: "
               "client IOPS ratio and scrub MB/s, OpenZFS scheduler vs legacy")
MiB, GiB = 1 << 20, 1 << 30
MODES = ("openzfs", "legacy")


def settings(quick):
    # the scrub must outlast two windows (alone, then under the client): it reads
    # every copy at the disks' streaming rate, several hundred MB/s for the four
    return {"volume_bytes": 8 * GiB, "fill_bytes": (4 if quick else 7) * GiB,
            "device_file_bytes": 12 * GiB, "window_s": 10 if quick else 20,
            # 8 reads in flight keep all four disks busy (QD1 leaves them idle between
            # reads, and the scrub then loses nothing to give); SCRUB_CLIENT_IODEPTH=N
            "client_iodepth": int(os.environ.get("SCRUB_CLIENT_IODEPTH", "8")),
            "client": "fio ioengine=nbd rw=randread bs=4k over the filled range, primarycache=metadata",
            "pool": "mirror sim-hdd sim-hdd mirror sim-hdd sim-hdd"}


def run_scenario(ctx):
    ensure_tools(["fio"])
    cfg = settings(ctx.quick)
    wd = make_workdir()
    z = Zilla(ctx.new, wd)
    disks = [sparse(os.path.join(wd, f"d{i}.img"), cfg["device_file_bytes"]) for i in range(4)]
    z.cli("pool", "create", "-f", "bench", "mirror", f"sim-hdd:{disks[0]}", f"sim-hdd:{disks[1]}",
          "mirror", f"sim-hdd:{disks[2]}", f"sim-hdd:{disks[3]}")
    z.cli("volume", "create", "-V", str(cfg["volume_bytes"]), "-o", "primarycache=metadata", "bench/vol")
    log(f"workdir {wd}; filling {cfg['fill_bytes'] >> 20} MiB of bench/vol")
    run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=write", "--bs=1M",
         "--iodepth=4", f"--size={cfg['fill_bytes']}", "--end_fsync=1", f"--output={os.path.join(wd, 'fill.txt')}"])
    results = {}
    for mode in MODES:
        z.cli("tunable", "set", f"zfs_vdev_scheduler_mode={mode}")
        results[mode] = one_mode(z, wd, cfg, mode)
        r = results[mode]
        log(f"{mode:>7}: client {r['idle']['iops']} IOPS idle, {r['scrub']['iops']} under the scrub "
            f"(x{r['client_ratio']}); scrub {r['scrub_alone_MBps']} MB/s alone, "
            f"{r['scrub_loaded_MBps']} MB/s under the client")
    z.cli("tunable", "set", "zfs_vdev_scheduler_mode=openzfs")
    z.cli("pool", "export", "bench")
    z.stop()
    print_table(results)
    return {"config": cfg, "results": results, "goals": goals(results)}


def one_mode(z, wd, cfg, mode):
    w = cfg["window_s"]
    idle = client(z, wd, cfg, f"{mode}-idle")
    z.cli("pool", "scrub", "bench")
    t0, e0 = time.time(), scan(z)["examined_bytes"]
    time.sleep(w)
    t1, e1 = time.time(), scan(z)["examined_bytes"]
    loaded = client(z, wd, cfg, f"{mode}-scrub")
    t2, s2 = time.time(), scan(z)
    if s2.get("state") != "scanning":
        raise BenchError(f"{mode}: the scrub ended ({s2.get('state')}) before the loaded window did; "
                         f"make fill_bytes larger")
    z.cli("pool", "scrub", "-s", "bench")
    return {"idle": idle, "scrub": loaded,
            "client_ratio": round(loaded["iops"] / max(1e-9, idle["iops"]), 3),
            "scrub_alone_MBps": round((e1 - e0) / (t1 - t0) / 1e6, 1),
            "scrub_loaded_MBps": round((s2["examined_bytes"] - e1) / (t2 - t1) / 1e6, 1),
            "scrub_examined_bytes": s2["examined_bytes"], "scrub_to_examine_bytes": s2.get("to_examine_bytes")}


def scan(z):
    """The pool's scan status from the admin API (examined_bytes counts every copy)."""
    for p in z.admin.get("/v1/status"):
        if p.get("name") == "bench":
            return p["scan"]
    raise BenchError("pool bench missing from /v1/status")


def client(z, wd, cfg, tag):
    out = os.path.join(wd, f"client-{tag}.json")
    r = run(["fio", "--name=client", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=randread",
             "--bs=4k", f"--iodepth={cfg['client_iodepth']}", f"--size={cfg['fill_bytes']}", "--time_based",
             f"--runtime={cfg['window_s']}", "--randrepeat=0", "--output-format=json", f"--output={out}"],
            check=False)
    if r.returncode != 0:
        raise BenchError(f"fio client {tag} failed ({r.returncode}); see {out}")
    with open(out) as f:
        text = f.read()
    rd = json.loads(text[text.index("{"):])["jobs"][0]["read"]
    lat = rd.get("clat_ns") or rd["lat_ns"]
    pct = lat.get("percentile", {})
    return {"iops": round(rd["iops"], 1), "mean_us": round(lat["mean"] / 1000, 1),
            "p99_us": round(pct.get("99.000000", 0) / 1000, 1)}


def goals(results):
    return [goal("openzfs: client 4K random read IOPS during a scrub / idle", ">=", 0.8,
                 results["openzfs"]["client_ratio"])]


def print_table(results):
    rows = []
    for m in MODES:
        r = results[m]
        rows.append([m, fmt(r["idle"]["iops"], 1), fmt(r["scrub"]["iops"], 1), fmt(r["client_ratio"], 2),
                     fmt(r["idle"]["p99_us"], 0), fmt(r["scrub"]["p99_us"], 0),
                     fmt(r["scrub_alone_MBps"], 1), fmt(r["scrub_loaded_MBps"], 1)])
    print(table(["scheduler", "client IOPS idle", "client IOPS scrub", "ratio", "p99 idle us",
                 "p99 scrub us", "scrub MB/s alone", "scrub MB/s loaded"], rows))
