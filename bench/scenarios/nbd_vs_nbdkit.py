"""Scenario nbd-vs-nbdkit: the NBD front end against nbdkit's file plugin.

Theory of operation: a Zilla volume on a pool of two 2-way mirrors (sparse files) and
an nbdkit file export of the same size are filled with the same random bytes (checked
with cmp), then fio's nbd engine runs 4K random read/write and 128K sequential
read/write at QD32 on one connection against each. Per rep and test the servers run
back to back, their order rotated every rep; read tests start with every export read
once (untimed), write tests end with an NBD FLUSH and a wait for the server to go idle,
so one server's write-back does not run during another's test. With an old build, its
daemon is a third server in the same rotation, and each figure gets a new/old ratio.

Analytics overhead: on the new build's daemon, 4K random reads at QD32 run with only the
default analytics datasets on and with every dataset of the catalog on (enabled over
the HTTP API; the daemon's history bound raised so they fit), alternating, the order
swapped every rep; the goal compares the daemon's CPU per read (/proc/PID/stat).

Work per I/O (with an old build): the daemon's CPU per request measured from
/proc/PID/stat moves by 15-20 % between identical runs on a shared VM, more than the
differences a new/old goal is about, so the new/old CPU goals of 4K random reads and
128K sequential reads are decided by user-space instructions per request instead,
counted with callgrind for each build on its own daemon and volume (lib/countio.py:
COUNT_VOLUME, seeded contents, ARC warm, one request at a time at fixed rates, per I/O
the slope over windows of the same length), with system calls per request counted with
strace beside them; the wall-clock CPU ratio of the QD32 runs stays in the record.
"""

import os
import time

from lib import countio
from lib.admin import arc_delta
from lib.daemon import Nbdkit, Zilla
from lib.fio import fio, nbd_flush
from lib.goals import goal, new_over_old
from lib.machine import loadavg, proc_status_kib, wait_idle
from lib.packages import ensure_tools
from lib.proc import BenchError, log, make_workdir, run, write_random_file
from lib.tables import fmt, median_of, ratio, table

NAME = "nbd-vs-nbdkit"
DESCRIPTION = ("fio nbd engine, 4K rand read/write and 128K seq read/write at QD32: "
               "Zilla volume (file pool, two 2-way mirrors) vs nbdkit file")
MiB, GiB = 1 << 20, 1 << 30
TESTS = [("4K randread QD32", "randread", "4k"), ("4K randwrite QD32", "randwrite", "4k"),
         ("128K seqread QD32", "read", "128k"), ("128K seqwrite QD32", "write", "128k")]
FIGURES = ("iops", "MBps", "lat_mean_us", "lat_p99_us", "server_cpu_us_per_io", "server_cores")
# work per I/O of each build (--compare-old): the requests whose new/old CPU goal it decides
COUNT_VOLUME = 256 * MiB
COUNTED = (countio.Workload("randread4k", "4K random read", "randread", 4096, 256 * MiB, (200, 1000),
                             (100, 500)),
           countio.Workload("read128k", "128K sequential read", "read", 128 << 10, 224 * MiB, (40, 200),
                            (40, 300)))


def run_scenario(ctx):
    ensure_tools(["fio", "nbdkit", "nbdcopy"])
    size = 512 * MiB if ctx.quick else 1 * GiB
    runtime = 8 if ctx.quick else 15
    reps = 1 if ctx.quick else 3
    wd = make_workdir()
    log(f"workdir {wd}; volume {size // MiB} MiB; {reps} rep(s) x {runtime}s per test; "
        f"builds {', '.join(b.label for b in ctx.builds)}")
    config = {"volume_bytes": size, "volblocksize": "16K (default)", "runtime_s": runtime,
              "reps": reps, "iodepth": 32, "numjobs": 1, "fio_engine": "nbd",
              "pool": "mirror d0 d1 mirror d2 d3 (plain files, O_DIRECT when available)",
              "nbdkit": "nbdkit file (page cache), default threads", "transport": "TCP loopback",
              "order": "per test, the servers back to back; the order rotates every rep",
              "warmup": "whole export read once (nbdcopy to null:) before every read test; "
                        "NBD FLUSH and wait for the server to go idle after every write test"}
    rand = os.path.join(wd, "rand.img")
    write_random_file(rand, size)
    servers = [start_zilla(b, wd, size) for b in ctx.builds] + [start_nbdkit(wd, size)]
    fill = {s.label: fill_export(s, rand) for s in servers}
    samples = measure(servers, size, runtime, reps, wd)
    overhead = analytics_overhead(servers[0], size, runtime, reps, wd)
    hwm = {s.label: proc_status_kib(s.pid, "VmHWM") for s in servers if isinstance(s, Zilla)}
    results = summarise(samples, [s.label for s in servers], reps)
    print_tables(results, reps, ctx)
    for s in servers:
        s.stop()
    counts = None
    if ctx.old is not None:
        counts = countio.count_builds(ctx.builds, wd, COUNTED, COUNT_VOLUME, ctx.quick)
        countio.print_counts(counts, COUNTED, wall_cpu_ratios(results))
    out = {"config": config, "fill": fill, "results": results, "analytics_overhead": overhead,
           "zilla_vmhwm_kib": hwm["zilla"], "vmhwm_kib": hwm,
           "goals": goals(results, ctx, counts) + overhead_goals(overhead)}
    if counts is not None:
        out["work_per_io"] = counts
    return out


def wall_cpu_ratios(results):
    """{counted workload key: daemon CPU per I/O new / old from /proc/PID/stat over the
    QD32 runs}."""
    by = {r["rw"] + r["bs"]: r for r in results}
    return {w.key: by[w.key]["ratio_new_over_old"]["server_cpu_us_per_io"]
            for w in COUNTED if "ratio_new_over_old" in by.get(w.key, {})}


def start_zilla(build, wd, size):
    # the new build: room for every analytics dataset (the overhead test enables them all)
    z = Zilla(build, wd, config={"analytics_memory_max_bytes": "2G"} if build.label == "zilla" else None)
    # Sparse leaves with room for the default zfs_dirty_data_max (10% of RAM, <= 4 GiB)
    # on top of the volume, so a full volume plus a txg of dirty data always fits.
    leaves = []
    for i in range(4):
        p = os.path.join(wd, f"{build.label}-d{i}.img")
        with open(p, "wb") as f:
            f.truncate(size + 5 * GiB)
        leaves.append(p)
    z.cli("pool", "create", "bench", "mirror", leaves[0], leaves[1], "mirror", leaves[2], leaves[3])
    z.cli("volume", "create", "-V", str(size), "bench/vol")
    z.export_uri = z.uri("bench/vol")
    return z


def start_nbdkit(wd, size):
    img = os.path.join(wd, "nbdkit.img")
    with open(img, "wb") as f:
        f.truncate(size)
    k = Nbdkit(wd, img)
    k.export_uri = k.uri()
    return k


def fill_export(server, rand):
    """Copy the random bytes in, read them twice (caches warm), check they read back."""
    uri = server.export_uri
    t0 = time.time()
    run(["nbdcopy", "--flush", rand, uri])
    t1 = time.time()
    run(["nbdcopy", uri, "null:"])
    t2 = time.time()
    run(["nbdcopy", uri, "null:"])
    t3 = time.time()
    r = run(["sh", "-c", f"nbdcopy '{uri}' - | cmp - '{rand}'"], check=False)
    if r.returncode != 0:
        raise BenchError(f"{server.label} does not hold the fill data: {r.stdout}{r.stderr}")
    log(f"{server.label}: filled in {t1 - t0:.1f}s, read twice in {t2 - t1:.1f}s / {t3 - t2:.1f}s")
    return {"fill_s": round(t1 - t0, 2), "first_read_s": round(t2 - t1, 2),
            "second_read_s": round(t3 - t2, 2)}


def measure(servers, size, runtime, reps, wd):
    """{test label: {server label: [fio summary per rep]}}, servers rotated per rep."""
    samples = {t[0]: {s.label: [] for s in servers} for t in TESTS}
    for rep in range(reps):
        k = rep % len(servers)
        order = servers[k:] + servers[:k]
        for label, rw, bs in TESTS:
            if rw in ("randread", "read"):
                # Re-read everything (untimed) so a read test starts warm even after a
                # write test moved blocks (copy-on-write gives them new ARC keys).
                for s in order:
                    run(["nbdcopy", s.export_uri, "null:"])
            for s in order:
                smp = one_test(s, rw, bs, size, runtime, wd, rep)
                samples[label][s.label].append(smp)
                log(f"rep {rep + 1}/{reps} {label:20} {s.label:9}: {smp['iops']:>10,.0f} IOPS "
                    f"{smp['MBps']:>8.1f} MB/s  p99 {smp['lat_p99_us']} us  "
                    f"{smp['server_cpu_us_per_io']} CPU-us/IO  load {smp['loadavg_before'][0]}")
                if rw in ("randwrite", "write"):
                    nbd_flush(s.export_uri, wd, f"{s.label}-{rw}-{rep}")
                    wait_idle(s.pid)
    return samples


def set_datasets(z, every):
    """Every dataset of the catalog on (`every`), or only the defaults."""
    cat = z.admin.http(z.http_port, "GET", "/api/v1/analytics/datasets")
    for d in cat["datasets"]:
        want = every or d["default"]
        if d["enabled"] != want:
            z.admin.http(z.http_port, "PUT", f"/api/v1/analytics/datasets/{d['name']}", {"enabled": want})
    on = [d["name"] for d in z.admin.http(z.http_port, "GET", "/api/v1/analytics/datasets")["datasets"]
          if d["enabled"]]
    return on


def analytics_overhead(z, size, runtime, reps, wd):
    """4K random reads with the default datasets and with every dataset, alternating."""
    runs = {"default": [], "every": []}
    enabled = {}
    for rep in range(reps):
        order = ["default", "every"] if rep % 2 == 0 else ["every", "default"]
        run(["nbdcopy", z.export_uri, "null:"])
        for mode in order:
            enabled[mode] = len(set_datasets(z, mode == "every"))
            time.sleep(2)  # a collector second with the new set
            smp = one_test(z, "randread", "4k", size, runtime, wd, f"analytics-{mode}-{rep}")
            runs[mode].append(smp)
            log(f"rep {rep + 1}/{reps} 4K randread QD32 analytics {mode:7} ({enabled[mode]:2} datasets): "
                f"{smp['iops']:>10,.0f} IOPS  {smp['server_cpu_us_per_io']} CPU-us/IO")
    set_datasets(z, False)
    out = {m: {"datasets_enabled": enabled[m], "iops": median_of(runs[m], "iops"),
               "server_cpu_us_per_io": median_of(runs[m], "server_cpu_us_per_io"),
               "samples": runs[m]} for m in runs}
    out["cpu_ratio_every_over_default"] = ratio(out["every"]["server_cpu_us_per_io"],
                                                out["default"]["server_cpu_us_per_io"])
    print(table(["4K randread QD32, analytics", "datasets on", "IOPS", "daemon CPU us/IO"],
                [[m, str(out[m]["datasets_enabled"]), fmt(out[m]["iops"]),
                  fmt(out[m]["server_cpu_us_per_io"], 2)] for m in ("default", "every")]))
    return out


def overhead_goals(o):
    return [goal("4K random read daemon CPU per I/O, every analytics dataset / defaults", "<=", 1.03,
                 o["cpu_ratio_every_over_default"])]


def one_test(s, rw, bs, size, runtime, wd, rep):
    zilla = isinstance(s, Zilla)
    la = loadavg()
    dev0 = s.admin.device_bytes("bench") if zilla else None
    arc0 = s.admin.arc_counters() if zilla else None
    smp = fio([f"--name={s.label}", "--ioengine=nbd", f"--uri={s.export_uri}", f"--rw={rw}",
               f"--bs={bs}", "--iodepth=32", "--numjobs=1", f"--size={size}",
               f"--runtime={runtime}", "--time_based", "--group_reporting"],
              wd, f"{s.label}-{rw}-{bs}-{rep}", cpu_pid=s.pid)
    smp["loadavg_before"] = la
    smp["rep"] = rep
    if zilla:   # ARC hits leave the devices idle
        dev1 = s.admin.device_bytes("bench")
        smp["device_bytes_read"] = dev1["read"] - dev0["read"]
        smp["device_bytes_written"] = dev1["write"] - dev0["write"]
        smp["arc"] = arc_delta(arc0, s.admin.arc_counters())
    return smp


def summarise(samples, labels, reps):
    results = []
    for label, rw, bs in TESTS:
        med = {n: {k: median_of(samples[label][n], k) for k in FIGURES} for n in labels}
        r = {"test": label, "rw": rw, "bs": bs, "iodepth": 32, "samples": samples[label]}
        r.update(med)
        r["ratio_zilla_over_nbdkit"] = {k: ratio(med["zilla"][k], med["nbdkit"][k]) for k in FIGURES}
        if "zilla_old" in med:
            r["ratio_zilla_old_over_nbdkit"] = {k: ratio(med["zilla_old"][k], med["nbdkit"][k])
                                                for k in FIGURES}
            nw = {k: ratio(med["zilla"][k], med["zilla_old"][k]) for k in FIGURES}
            nw["per_rep_iops"] = [ratio(a["iops"], b["iops"]) for a, b in
                                  zip(samples[label]["zilla"], samples[label]["zilla_old"])]
            r["ratio_new_over_old"] = nw
        results.append(r)
    return results


def print_tables(results, reps, ctx):
    rows = []
    for r in results:
        z, k, q = r["zilla"], r["nbdkit"], r["ratio_zilla_over_nbdkit"]
        rows.append([r["test"], fmt(z["iops"]), fmt(k["iops"]), fmt(q["iops"], 2),
                     fmt(z["MBps"]), fmt(k["MBps"]),
                     f"{fmt(z['lat_mean_us'])}/{fmt(z['lat_p99_us'])}",
                     f"{fmt(k['lat_mean_us'])}/{fmt(k['lat_p99_us'])}",
                     fmt(z["server_cpu_us_per_io"], 2), fmt(k["server_cpu_us_per_io"], 2),
                     fmt(q["server_cpu_us_per_io"], 2)])
    print(table([f"test (median of {reps})", "zilla IOPS", "nbdkit IOPS", "ratio", "zilla MB/s",
                 "nbdkit MB/s", "zilla lat mean/p99 us", "nbdkit lat mean/p99 us",
                 "zilla CPU us/IO", "nbdkit CPU us/IO", "CPU ratio"], rows))
    if ctx.old is None:
        return
    rows = []
    for r in results:
        n, o, q = r["zilla"], r["zilla_old"], r["ratio_new_over_old"]
        rows.append([r["test"], fmt(n["iops"]), fmt(o["iops"]), fmt(q["iops"], 2),
                     ", ".join(fmt(x, 2) for x in q["per_rep_iops"]),
                     fmt(r["ratio_zilla_over_nbdkit"]["iops"], 2),
                     fmt(r["ratio_zilla_old_over_nbdkit"]["iops"], 2),
                     f"{fmt(n['lat_p99_us'])}/{fmt(o['lat_p99_us'])}",
                     f"{fmt(n['server_cpu_us_per_io'], 2)}/{fmt(o['server_cpu_us_per_io'], 2)}"])
    print()
    print(table([f"new {ctx.new.commit} vs old {ctx.old.commit}", "new IOPS", "old IOPS",
                 "new/old", "per rep", "new/nbdkit", "old/nbdkit", "p99 us new/old",
                 "CPU us/IO new/old"], rows))


def goals(results, ctx, counts=None):
    by = {r["rw"] + r["bs"]: r for r in results}
    g = [goal("4K random read IOPS, Zilla / nbdkit", ">=", 1.0,
              by["randread4k"]["ratio_zilla_over_nbdkit"]["iops"]),
         goal("128K sequential read IOPS, Zilla / nbdkit", ">=", 1.0,
              by["read128k"]["ratio_zilla_over_nbdkit"]["iops"]),
         # the write path keeps up, and random reads stay well ahead
         goal("4K random read IOPS, Zilla / nbdkit, well ahead", ">=", 1.2,
              by["randread4k"]["ratio_zilla_over_nbdkit"]["iops"]),
         goal("4K random write IOPS, Zilla / nbdkit", ">=", 0.9,
              by["randwrite4k"]["ratio_zilla_over_nbdkit"]["iops"]),
         goal("4K random write IOPS, Zilla / nbdkit, at par", ">=", 1.0,
              by["randwrite4k"]["ratio_zilla_over_nbdkit"]["iops"]),
         # the daemon's CPU per 4K write (/proc/PID/stat over the run) against nbdkit's
         # in the same run: no more work per write than a server that only hands it
         # to the page cache
         goal("4K random write daemon CPU per I/O, Zilla / nbdkit", "<=", 1.0,
              by["randwrite4k"]["ratio_zilla_over_nbdkit"]["server_cpu_us_per_io"]),
         goal("128K sequential write IOPS, Zilla / nbdkit", ">=", 0.9,
              by["write128k"]["ratio_zilla_over_nbdkit"]["iops"])]
    if ctx.old is not None:
        g += [new_over_old(f"{r['test']} IOPS", r["ratio_new_over_old"]["iops"], ctx.old.rev)
              for r in results]
        # the daemon's CPU per request is no higher than the old build's: for reads
        # from the ARC decided by user-space instructions per request (countio), the
        # wall-clock ratio beside it; for 4K writes (whose count the txg sync makes
        # time-dependent) from /proc/PID/stat over each run
        wall = wall_cpu_ratios(results)
        g += [countio.goal_for(counts, w, ctx.old.rev, wall.get(w.key)) for w in COUNTED]
        g.append(goal(f"{by['randwrite4k']['test']} daemon CPU per I/O, new / old ({ctx.old.rev})",
                      "<=", 1.0, by["randwrite4k"]["ratio_new_over_old"]["server_cpu_us_per_io"]))
    return g

