"""Scenario slog: synchronous 4K writes on a hybrid pool with and without a log mirror.

Theory of operation: one daemon holds two pools built like the demo's: `nolog`, two
sim-hdd mirrors, and `slog`, the same plus a sim-ssd log mirror (the Logzilla-class
model). fio's nbd engine writes 4K blocks at random offsets with an NBD FLUSH after
every write (`--fsync=1`), with 1 (QD1), 8 and 32 concurrent writers, one connection
each; per writer count the two pools run back to back, and the daemon is left to go
idle between tests so one test's txg sync does not run during the next. A sync write's
latency is its write's plus its flush's. The intent-log counters give, per test, the
commits, the lwbs and the itxs per lwb (commit batching).

The second part is the cost of the log on plain files: a pool of two plain-file
mirrors (no sim model, no log: the log blocks go to the data vdevs) against
`nbdkit file` on a plain file, the same fio job at QD1. Last, the same job against
`nbdkit null` (no storage, the volume's size): the protocol floor, what the client, TCP
loopback and a server's request loop cost per sync write whatever the server does. The
QD1 latency with the log is held to two bounds: minus the sim-ssd model of its lwbs
<= 100 us, and minus that model and minus the floor <= 60 us (what the daemon itself
adds); all three numbers are printed.

Last, the picture (`heatmap_phase`): a fresh daemon, the `nolog` pool's layout, one
`sync=always` volume taking QD1 4K writes; halfway through, a sim-ssd log mirror is
added with `zilla pool add` while they go on. The analytics worksheet's write-latency
heat map of the run is saved as bench/results/slog-heatmap.png (headless chromium;
skipped without it), and the JSON's `heatmap` record has the times and the median
write latency before and after the add, from the analytics query API.

Goals (seed 000): QD1 sync-write IOPS with the log >= 12x without; mean
latency >= 20x lower; QD1 latency with the log within the sim-ssd model of the lwbs it
wrote + 100 us, and within that model + the nbdkit null floor + 60 us; IOPS rising from
1 to 8 to 32 writers; Zilla on plain files >= nbdkit.
"""

import os
import subprocess
import time

from lib.daemon import Nbdkit, Zilla
from lib.goals import goal
from lib.heatmap import (analytics_catalog, analytics_now, analytics_query, median_latency_ns,
                         screenshot_worksheet, summed_buckets)
from lib.machine import loadavg, wait_idle
from lib.packages import ensure_tools
from lib.proc import ROOT, BenchError, log, make_memdir, make_workdir
from lib.syncio import ZilDelta, log_model_us, sync_fio, tunables
from lib.tables import fmt, ratio, table

NAME = "slog"
DESCRIPTION = ("fio nbd 4K random writes with a flush after each (1, 8, 32 writers): "
               "two sim-hdd mirrors without vs with a sim-ssd log mirror; plain files vs nbdkit")
MiB, GiB = 1 << 20, 1 << 30
WRITERS = (1, 8, 32)
LATENCY_SLACK_US = 100
OWN_LATENCY_US = 60    # QD1 with the log, minus the model, minus the nbdkit null floor


def run_scenario(ctx):
    ensure_tools(["fio", "nbdkit"])
    runtime = 8 if ctx.quick else 20
    vol = 1 * GiB
    wd = make_workdir()
    log(f"workdir {wd}; volume {vol // MiB} MiB; {runtime}s per test")
    z = Zilla(ctx.new, wd)
    make_pools(z, wd, vol)
    t = tunables(z)
    rows = []
    for n in WRITERS:
        for pool in ("nolog", "slog"):
            rows.append(one_test(z, wd, pool, n, runtime, vol))
    plain = one_test(z, wd, "plain", 1, runtime, vol)
    k = Nbdkit(wd, sparse(os.path.join(wd, "nbdkit.img"), vol))
    kit = sync_fio(k.uri(), wd, "nbdkit-1", 1, runtime, vol, cpu_pid=k.pid)
    kit["server"] = "nbdkit"
    log(f"nbdkit file, 1 writer: {kit['iops']:,.0f} IOPS, {kit['lat_mean_us']} us")
    k.stop()
    # the floor: the same job against nbdkit's null plugin (no storage, no flush work):
    # what fio, libnbd, TCP loopback and one NBD server's request loop cost per sync write
    k = Nbdkit(wd, None, plugin=["null", str(vol)])
    floor = sync_fio(k.uri(), wd, "nbdkit-null-1", 1, runtime, vol, cpu_pid=k.pid)
    log(f"nbdkit null, 1 writer: {floor['iops']:,.0f} IOPS, {floor['lat_mean_us']} us (protocol floor)")
    k.stop()
    z.stop()
    heat = heatmap_phase(ctx, wd, 8 if ctx.quick else 12)
    by = {(r["pool"], r["writers"]): r for r in rows}
    qd1 = by[("slog", 1)]
    qd1["log_model_us"] = log_model_us(t, qd1["zil"])
    print_tables(rows, plain, kit)
    print(f"protocol floor (nbdkit null, same fio job): {floor['lat_mean_us']} us per sync write "
          f"(write {floor['write_lat_mean_us']} + flush {floor['flush_lat_mean_us']})")
    print(f"QD1 with the log: {fmt(qd1['lat_mean_us'])} us measured - {fmt(qd1['log_model_us'])} us "
          f"sim-ssd model of its lwbs - {fmt(floor['lat_mean_us'])} us nbdkit null = "
          f"{fmt(latency_beyond(qd1, floor))} us (<= {OWN_LATENCY_US} us allowed)")
    config = {"volume_bytes": vol, "volblocksize": "16K (default)", "runtime_s": runtime,
              "fio": "--ioengine=nbd --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=N",
              "pools": {"nolog": "mirror sim-hdd sim-hdd mirror sim-hdd sim-hdd",
                        "slog": "the same + log mirror sim-ssd sim-ssd (backing files in /dev/shm unless BENCH_MEMDIR=0)",
                        "plain": "mirror file file mirror file file (no models, no log)"},
              "nbdkit": "nbdkit file (one plain file)", "transport": "TCP loopback",
              "sim_tunables": {k2: v for k2, v in t.items() if k2.startswith("sim_ssd_log")}}
    return {"config": config, "results": rows, "plain_vs_nbdkit": {"zilla": plain, "nbdkit": kit},
            "protocol_floor_nbdkit_null": floor, "heatmap": heat,
            "goals": goals(by, plain, kit, floor)}


HEATMAP_PNG = os.path.join(ROOT, "bench", "results", "slog-heatmap.png")


def heatmap_phase(ctx, wd, half_s):
    """The picture: a fresh daemon and pool of two sim-hdd mirrors without a log, one
    `sync=always` volume taking 4K random writes at QD1 (each write is committed to the
    intent log before it is answered) for `half_s` seconds; then `pool add POOL log
    mirror sim-ssd sim-ssd` while the writes go on, `half_s` seconds more. The
    worksheet's `io.latency/op` heat map filtered to `write` over the whole run goes to
    bench/results/slog-heatmap.png; the JSON gets the daemon-clock times and the median
    write latency of each half from the query API (the bucket holding the median)."""
    hd = os.path.join(wd, "heatmap")
    os.makedirs(hd)
    z = Zilla(ctx.new, hd)
    vol = 1 * GiB
    d = ["sim-hdd:" + sparse(os.path.join(hd, f"d{i}.img"), vol + 2 * GiB) for i in range(4)]
    z.cli("pool", "create", "heat", "mirror", d[0], d[1], "mirror", d[2], d[3])
    z.cli("volume", "create", "-s", "-V", str(vol), "-o", "sync=always", "heat/vol")
    md = make_memdir(need_bytes=1 * GiB)
    logs = ["sim-ssd:" + sparse(os.path.join(md, f"heat-log{i}.img"), 512 * MiB) for i in range(2)]
    out = os.path.join(hd, "fio-heat.json")
    cmd = ["fio", "--output-format=json", f"--output={out}", "--name=heat", "--ioengine=nbd",
           f"--uri={z.uri('heat/vol')}", "--rw=randwrite", "--bs=4k", "--iodepth=1",
           f"--size={vol}", f"--runtime={2 * half_s}", "--time_based"]
    port = z.http_port
    t_start = analytics_now(port)
    w0 = time.time()
    fio = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(half_s)
        t_add = analytics_now(port)
        a0 = time.time()
        z.cli("pool", "add", "heat", "log", "mirror", *logs)
        add_s = time.time() - a0
        t_added = analytics_now(port)
        log(f"heat map: log mirror added {time.time() - w0:.1f}s into the writes (took {add_s:.2f}s)")
        _, err = fio.communicate(timeout=2 * half_s + 60)
    finally:
        if fio.poll() is None:
            fio.kill()
            fio.wait()
    if fio.returncode != 0:
        raise BenchError(f"fio heat map writer failed ({fio.returncode}): {(err or '').strip()[-200:]}")
    time.sleep(2)          # the last second's point is collected
    t_end = analytics_now(port)
    edges = analytics_catalog(port)["buckets"]
    q = analytics_query(port, "io.latency/op", t_start, t_end, "write")
    before = median_latency_ns(summed_buckets(q, t_start, t_add), edges)
    # the second the add returned in may hold writes of both kinds: left out
    after = median_latency_ns(summed_buckets(q, t_added + 1, t_end), edges)
    png = screenshot_worksheet(port, [("io.latency/op", "write")], t_start - 2, t_end + 1, HEATMAP_PNG,
                               caption=f"4K sync writes (sync=always, QD1) on two sim-hdd mirrors; "
                                       f"a sim-ssd log mirror added at {time.strftime('%H:%M:%S', time.localtime(t_add))}")
    z.stop()
    log(f"heat map: median write latency {fmt_bucket(before)} before the log, {fmt_bucket(after)} after")
    return {"picture": os.path.relpath(png, ROOT) if png else None,
            "worksheet": f"/ui/worksheet#ds=io.latency/op|write&from={t_start - 2}&to={t_end + 1}",
            "dataset": "io.latency/op", "filter": "write", "clock": "daemon analytics clock, unix s",
            "writes_from": t_start, "log_add_started": t_add, "log_add_returned": t_added,
            "add_duration_s": round(add_s, 2), "writes_to": t_end, "seconds_per_half": half_s,
            "fio": "--ioengine=nbd --rw=randwrite --bs=4k --iodepth=1, volume sync=always",
            "pool": "mirror sim-hdd sim-hdd mirror sim-hdd sim-hdd, then + log mirror sim-ssd sim-ssd",
            "median_write_latency_before": before, "median_write_latency_after": after,
            "median_ratio_before_after": (round(before["median_ns"] / after["median_ns"], 1)
                                          if before and after else None)}


def fmt_bucket(m):
    if not m:
        return "-"
    return f"{m['lower_ns'] / 1000:g}..{m['upper_ns'] / 1000:g} us ({m['events']} writes)"


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def make_pools(z, wd, vol):
    """nolog / slog: two sim-hdd mirrors (+ a sim-ssd log mirror); plain: files."""
    for name in ("nolog", "slog", "plain"):
        model = "" if name == "plain" else "sim-hdd:"
        d = [model + sparse(os.path.join(wd, f"{name}-d{i}.img"), vol + 2 * GiB) for i in range(4)]
        args = ["pool", "create", name, "mirror", d[0], d[1], "mirror", d[2], d[3]]
        if name == "slog":
            # the log SSDs' bytes in memory: their 0.1 ms model must set their time,
            # not the lab disk under them (lib.proc.make_memdir)
            md = make_memdir()
            logs = ["sim-ssd:" + sparse(os.path.join(md, f"slog-log{i}.img"), 512 * MiB) for i in range(2)]
            args += ["log", "mirror"] + logs
        z.cli(*args)
        z.cli("volume", "create", "-s", "-V", str(vol), f"{name}/vol")


def one_test(z, wd, pool, writers, runtime, vol):
    wait_idle(z.pid)
    la = loadavg()
    with ZilDelta(z) as zd:
        r = sync_fio(z.uri(f"{pool}/vol"), wd, f"{pool}-{writers}", writers, runtime, vol,
                     cpu_pid=z.pid)
    r["pool"] = pool
    r["zil"] = zd.summary()
    r["loadavg_before"] = la
    log(f"{pool:6} {writers:2} writer(s): {r['iops']:>9,.1f} IOPS  lat {r['lat_mean_us']} us "
        f"(write {r['write_lat_mean_us']} + flush {r['flush_lat_mean_us']})  "
        f"itxs/lwb {r['zil']['itxs_per_lwb']}  load {la[0]}")
    return r


def print_tables(rows, plain, kit):
    by = {(r["pool"], r["writers"]): r for r in rows}
    out = []
    for n in WRITERS:
        a, b = by[("nolog", n)], by[("slog", n)]
        out.append([f"{n} writer(s)", fmt(a["iops"]), fmt(b["iops"]), fmt(ratio(b["iops"], a["iops"]), 2),
                    fmt(a["lat_mean_us"]), fmt(b["lat_mean_us"]),
                    fmt(ratio(a["lat_mean_us"], b["lat_mean_us"]), 2),
                    fmt(b["zil"]["itxs_per_lwb"], 2), fmt(b["zil"]["log_bytes_slog"] // max(1, b["ios"]))])
    print(table(["4K sync writes", "no log IOPS", "log IOPS", "IOPS x", "no log lat us", "log lat us",
                 "lat x", "itxs/lwb", "log B/write"], out))
    print()
    print(table(["plain files, 1 writer", "IOPS", "lat mean us", "CPU us/IO"],
                [["zilla (2 mirrors of files)", fmt(plain["iops"]), fmt(plain["lat_mean_us"]),
                  fmt(plain.get("server_cpu_us_per_io"))],
                 ["nbdkit file", fmt(kit["iops"]), fmt(kit["lat_mean_us"]),
                  fmt(kit.get("server_cpu_us_per_io"))]]))
    q = by[("slog", 1)]
    print(f"\nQD1 with the log: {q['lat_mean_us']} us measured; sim-ssd model of its lwbs "
          f"{q.get('log_model_us')} us (+{LATENCY_SLACK_US} us allowed)")


def latency_beyond(qd1, floor=None):
    """QD1 sync-write latency with the log minus the sim-ssd model of its lwbs, and with
    `floor` also minus that run's mean latency (the same fio job on nbdkit null); None
    when a term is missing."""
    terms = [qd1.get("lat_mean_us"), qd1.get("log_model_us")]
    if floor is not None:
        terms.append(floor.get("lat_mean_us"))
    if any(t is None for t in terms):
        return None
    return round(terms[0] - sum(terms[1:]), 1)


def goals(by, plain, kit, floor):
    a1, b1 = by[("nolog", 1)], by[("slog", 1)]
    over = latency_beyond(b1)
    return [
        goal("sync 4K QD1 IOPS, log mirror / no log", ">=", 12, ratio(b1["iops"], a1["iops"])),
        goal("sync 4K QD1 mean latency, no log / log mirror", ">=", 20,
             ratio(a1["lat_mean_us"], b1["lat_mean_us"])),
        goal("sync 4K QD1 latency with the log minus the sim-ssd model of its lwbs", "<=",
             LATENCY_SLACK_US, over, unit="us"),
        goal("sync 4K QD1 latency with the log minus the sim-ssd model of its lwbs minus "
             "nbdkit null on the same fio job", "<=", OWN_LATENCY_US,
             latency_beyond(b1, floor), unit="us"),
        goal("log mirror IOPS, 8 writers / 1 writer", ">=", 1.1,
             ratio(by[("slog", 8)]["iops"], b1["iops"])),
        goal("log mirror IOPS, 32 writers / 8 writers", ">=", 1.1,
             ratio(by[("slog", 32)]["iops"], by[("slog", 8)]["iops"])),
        goal("sync 4K QD1 IOPS on plain files, Zilla / nbdkit file", ">=", 1.0,
             ratio(plain["iops"], kit["iops"])),
    ]
