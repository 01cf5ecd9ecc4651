"""Scenario pool-vs-direct: a Zilla volume against the raw files it is built on.

Theory of operation: four files are written once (untimed) so both sides work on
allocated extents. *Direct*: fio with one libaio direct=1 job per file, 1 MiB
sequential write (with end_fsync) and 16K random read. *Zilla*: a daemon makes
`mirror f0 f1 mirror f2 f3` on the same files with a small ARC and dirty limit, and fio's
nbd engine writes 1 MiB sequentially (several times the dirty limit, end_fsync) and
reads 16K at random over the written region (ARC cold) and over a region that fits the
ARC (warm); device bytes come from the admin API, leaf queue depth is sampled, memory
is read from /proc. Rounds alternate so the machine's drift shows: direct, Zilla,
direct. With an old build: direct, new, old, direct (quick), or direct, new, old,
direct, old, new, direct (full), each build's figure the median of its rounds.
"""

import os
import statistics

from lib.admin import arc_delta
from lib.daemon import Zilla
from lib.fio import QueueSampler, fio
from lib.goals import goal, new_over_old
from lib.machine import loadavg, proc_status_kib, wait_idle
from lib.packages import ensure_tools
from lib.proc import log, make_workdir, run
from lib.tables import fmt, ratio, table

NAME = "pool-vs-direct"
DESCRIPTION = ("1M seq write (end_fsync) and 16K rand read: fio direct=1 on four files "
               "vs a Zilla volume on a pool of those files as two 2-way mirrors")
MiB, GiB = 1 << 20, 1 << 30
FIGURES = (("seqwrite_1M", "MBps", "1 MiB sequential write MB/s"),
           ("randread_16K_cold", "iops", "16K random read IOPS, ARC cold"),
           ("randread_16K_warm", "iops", "16K random read IOPS, ARC warm"))


def settings(quick):
    return {"file_bytes": 512 * MiB if quick else 2 * GiB, "files": 4,
            "zfs_dirty_data_max": 128 * MiB if quick else 256 * MiB, "zfs_arc_max": 64 * MiB,
            "volume_bytes": 768 * MiB if quick else 3 * GiB, "volblocksize": "16K (default)",
            "zilla_write_bytes": 640 * MiB if quick else 2 * GiB,
            "read_runtime_s": 8 if quick else 15, "warm_working_set_bytes": 32 * MiB,
            "direct": "fio on the 4 files at once, one job per file, libaio direct=1: "
                      "write iodepth=2 per file (8 x 1 MiB in flight), randread iodepth=8 "
                      "per file (32 in flight), group_reporting (aggregate)",
            "zilla": "fio ioengine=nbd, one connection: write bs=1M iodepth=8 end_fsync=1; "
                     "randread bs=16k iodepth=32"}


def schedule(ctx):
    """The rounds in order: "direct" or a Build."""
    if ctx.old is None:
        return ["direct", ctx.new, "direct"]
    if ctx.quick:
        return ["direct", ctx.new, ctx.old, "direct"]
    return ["direct", ctx.new, ctx.old, "direct", ctx.old, ctx.new, "direct"]


def run_scenario(ctx):
    ensure_tools(["fio"])
    cfg = settings(ctx.quick)
    wd = make_workdir()
    files = [os.path.join(wd, f"f{i}.img") for i in range(4)]
    log(f"workdir {wd}; 4 x {cfg['file_bytes'] // MiB} MiB files; zilla writes "
        f"{cfg['zilla_write_bytes'] // MiB} MiB with dirty max {cfg['zfs_dirty_data_max'] // MiB}"
        f" MiB, ARC max {cfg['zfs_arc_max'] // MiB} MiB")
    prefill(files, cfg, wd)
    loads = {"start": loadavg()}
    direct, runs = [], {b.label: [] for b in ctx.builds}
    for i, step in enumerate(schedule(ctx)):
        if step == "direct":
            direct.append(direct_round(files, cfg, wd, chr(ord("a") + len(direct))))
        else:
            runs[step.label].append(zilla_round(step, files, cfg, wd, i))
        loads[f"after_{i}_{step if step == 'direct' else step.label}"] = loadavg()
    d_w = statistics.median(d["seqwrite_1M"]["MBps"] for d in direct)
    d_r = statistics.median(d["randread_16K"]["iops"] for d in direct)
    med = {label: build_medians(rs) for label, rs in runs.items()}
    results = results_for(med, d_w, d_r, ctx)
    print_tables(med, results, direct, runs["zilla"][0], cfg, ctx)
    out = {"config": cfg, "results": results, "direct": direct,
           "zilla": runs["zilla"][0]["figures"], "memory": runs["zilla"][0]["memory"],
           "medians": med, "loadavg": loads, "goals": goals(results, runs["zilla"][0]["memory"], ctx)}
    if ctx.old is not None or len(runs["zilla"]) > 1:
        out["zilla_runs"] = runs    # every round of every build ("zilla" is the first new one)
    return out


def prefill(files, cfg, wd):
    """Write every file once (untimed) so both sides work on allocated extents and
    direct reads hit real blocks, not unwritten extents."""
    for p in files:
        with open(p, "wb") as f:
            f.truncate(cfg["file_bytes"])
    fio(["--ioengine=libaio", "--direct=1", "--rw=write", "--bs=1M", "--iodepth=4"]
        + per_file_jobs(files, cfg, "pre"), wd, "prefill")


def per_file_jobs(files, cfg, prefix):
    return [x for i, p in enumerate(files)
            for x in (f"--name={prefix}{i}", f"--filename={p}", f"--size={cfg['file_bytes']}")]


def direct_round(files, cfg, wd, tag):
    w = fio(["--ioengine=libaio", "--direct=1", "--rw=write", "--bs=1M", "--iodepth=2",
             "--end_fsync=1", "--group_reporting"] + per_file_jobs(files, cfg, "w"),
            wd, f"direct-write-{tag}")
    # end_fsync time is inside the job runtime; recompute from bytes and wall time too.
    w["MBps_incl_wall"] = round(w["bytes"] / w["wall_s"] / 1e6, 2)
    r = fio(["--ioengine=libaio", "--direct=1", "--rw=randread", "--bs=16k", "--iodepth=8",
             f"--runtime={cfg['read_runtime_s']}", "--time_based", "--group_reporting"]
            + per_file_jobs(files, cfg, "r"), wd, f"direct-randread-{tag}")
    log(f"direct {tag}: write {w['MBps']:.0f} MB/s, randread 16K {r['iops']:,.0f} IOPS")
    return {"seqwrite_1M": w, "randread_16K": r}


def zilla_round(build, files, cfg, wd, step):
    """One daemon of `build` on the files: write, cold reads, warm reads, then export."""
    z = Zilla(build, wd)
    rss = {"idle_before_pool_kib": proc_status_kib(z.pid, "VmRSS")}
    z.cli("tunable", "set", f"zfs_dirty_data_max={cfg['zfs_dirty_data_max']}")
    z.cli("tunable", "set", f"zfs_arc_max={cfg['zfs_arc_max']}")  # read when the pool is created
    z.cli("pool", "create", "-f", "bench", "mirror", files[0], files[1], "mirror", files[2], files[3])
    z.cli("volume", "create", "-V", str(cfg["volume_bytes"]), "bench/vol")
    rss["after_pool_create_kib"] = proc_status_kib(z.pid, "VmRSS")
    tag = f"{build.label}-{step}"
    w = zilla_write(z, cfg, wd, tag)
    rss["hwm_after_write_kib"] = proc_status_kib(z.pid, "VmHWM")
    wait_idle(z.pid)
    rc = zilla_randread(z, cfg["zilla_write_bytes"], cfg, wd, f"{tag}-cold", sample=True)
    # Warm reads: a working set that fits the ARC, read once first.
    run(["fio", "--name=warm", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=read",
         "--bs=128k", "--iodepth=8", f"--size={cfg['warm_working_set_bytes']}",
         f"--output={os.path.join(wd, f'warmup-{tag}.txt')}"])
    rwm = zilla_randread(z, cfg["warm_working_set_bytes"], cfg, wd, f"{tag}-warm", sample=False)
    rss["hwm_end_kib"] = proc_status_kib(z.pid, "VmHWM")
    rss["rss_end_kib"] = proc_status_kib(z.pid, "VmRSS")
    z.cli("pool", "export", "bench")
    z.stop()
    budget = cfg["zfs_arc_max"] + cfg["zfs_dirty_data_max"]
    hwm = rss["hwm_end_kib"] * 1024
    rss.update({"budget_arc_plus_dirty_bytes": budget, "measured_overhead_bytes": hwm - budget,
                "idle_overhead_bytes": rss["after_pool_create_kib"] * 1024})
    return {"build": build.label, "step": step, "memory": rss,
            "figures": {"seqwrite_1M": w, "randread_16K_cold": rc, "randread_16K_warm": rwm}}


def zilla_write(z, cfg, wd, tag):
    dev0, la = z.admin.device_bytes("bench"), loadavg()
    with QueueSampler(z, "bench") as qs:
        w = fio(["--name=zw", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=write",
                 "--bs=1M", "--iodepth=8", f"--size={cfg['zilla_write_bytes']}", "--end_fsync=1"],
                wd, f"{tag}-write", cpu_pid=z.pid)
    dev1 = z.admin.device_bytes("bench")
    w["leaf_queue"] = qs.summary()
    w["MBps_incl_wall"] = round(w["bytes"] / w["wall_s"] / 1e6, 2)
    w["loadavg_before"] = la
    w["device_bytes_written"] = dev1["write"] - dev0["write"]
    w["device_write_ops"] = dev1["write_ops"] - dev0["write_ops"]
    w["device_bytes_read"] = dev1["read"] - dev0["read"]
    w["device_MBps"] = (round(w["device_bytes_written"] / w["runtime_s"] / 1e6, 2)
                        if w["runtime_s"] else None)
    w["write_amplification"] = round(w["device_bytes_written"] / w["bytes"], 3)
    w["device_avg_write_bytes"] = w["device_bytes_written"] // max(1, w["device_write_ops"])
    log(f"{z.label} write: {w['MBps']:.0f} MB/s volume, {w['device_MBps']} MB/s at the devices "
        f"(x{w['write_amplification']}), {w['server_cpu_us_per_io']} CPU-us per 1 MiB; "
        f"leaf queues {w['leaf_queue']}")
    return w


def zilla_randread(z, span, cfg, wd, tag, sample):
    dev0, la, arc0 = z.admin.device_bytes("bench"), loadavg(), z.admin.arc_counters()
    args = ["--name=zr", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=randread",
            "--bs=16k", "--iodepth=32", f"--size={span}", f"--runtime={cfg['read_runtime_s']}",
            "--time_based"]
    if sample:
        with QueueSampler(z, "bench", period_s=0.2) as qs:
            r = fio(args, wd, f"{tag}-randread", cpu_pid=z.pid)
        r["leaf_queue"] = qs.summary()
    else:
        r = fio(args, wd, f"{tag}-randread", cpu_pid=z.pid)
    r["arc"] = arc_delta(arc0, z.admin.arc_counters())
    r["loadavg_before"] = la
    r["device_bytes_read"] = z.admin.device_bytes("bench")["read"] - dev0["read"]
    r["device_read_fraction"] = round(r["device_bytes_read"] / max(1, r["bytes"]), 4)
    log(f"{z.label} {tag} randread 16K: {r['iops']:,.0f} IOPS, device read "
        f"{r['device_read_fraction']:.2f} x the volume bytes; {r['server_cpu_us_per_io']} CPU-us/IO")
    return r


def build_medians(rounds):
    """{figure test: median value} over one build's rounds, plus the device MB/s."""
    m = {t: statistics.median(r["figures"][t][k] for r in rounds) for t, k, _ in FIGURES}
    m["seqwrite_1M_device_MBps"] = statistics.median(
        r["figures"]["seqwrite_1M"]["device_MBps"] or 0 for r in rounds)
    m["rounds"] = len(rounds)
    return m


def results_for(med, d_w, d_r, ctx):
    n = med["zilla"]
    res = {"seqwrite_1M": {"direct_MBps_median": d_w, "zilla_volume_MBps": n["seqwrite_1M"],
                           "zilla_device_MBps": n["seqwrite_1M_device_MBps"],
                           "ratio_volume_over_direct": ratio(n["seqwrite_1M"], d_w),
                           "ratio_device_over_direct": ratio(n["seqwrite_1M_device_MBps"], d_w),
                           "target": "volume >= 0.5 x direct",
                           "target_met": (n["seqwrite_1M"] / d_w) >= 0.5 if d_w else None},
           "randread_16K_cold": {"direct_iops_median": d_r, "zilla_iops": n["randread_16K_cold"],
                                 "ratio_zilla_over_direct": ratio(n["randread_16K_cold"], d_r)},
           "randread_16K_warm": {"direct_iops_median": d_r, "zilla_iops": n["randread_16K_warm"],
                                 "ratio_zilla_over_direct": ratio(n["randread_16K_warm"], d_r)}}
    if ctx.old is not None:
        o = med["zilla_old"]
        for t, _, _ in FIGURES:
            res[t]["zilla_old"] = o[t]
            res[t]["ratio_new_over_old"] = ratio(n[t], o[t])
    return res


def print_tables(med, results, direct, first, cfg, ctx):
    n = med["zilla"]
    d_w = results["seqwrite_1M"]["direct_MBps_median"]
    d_r = results["randread_16K_cold"]["direct_iops_median"]
    d_p99 = statistics.median(d["randread_16K"]["lat_p99_us"] or 0 for d in direct)
    fw, fc = first["figures"]["seqwrite_1M"], first["figures"]["randread_16K_cold"]
    rows = [["1M seq write MB/s (end_fsync)", fmt(d_w), fmt(n["seqwrite_1M"]),
             fmt(ratio(n["seqwrite_1M"], d_w), 2),
             f"devices {fmt(n['seqwrite_1M_device_MBps'])} MB/s (x{fw['write_amplification']})"],
            ["16K rand read IOPS, ARC cold", fmt(d_r), fmt(n["randread_16K_cold"]),
             fmt(ratio(n["randread_16K_cold"], d_r), 2),
             f"p99 {fmt(fc['lat_p99_us'])} us vs {fmt(d_p99)} us"],
            ["16K rand read IOPS, ARC warm", fmt(d_r), fmt(n["randread_16K_warm"]),
             fmt(ratio(n["randread_16K_warm"], d_r), 2),
             f"{cfg['warm_working_set_bytes'] // MiB} MiB working set"]]
    print(table(["test", f"direct (median of {len(direct)})",
                 f"zilla volume (median of {n['rounds']})", "ratio", "note"], rows))
    mem = first["memory"]
    hwm = mem["hwm_end_kib"] * 1024
    print(f"daemon VmHWM {hwm / MiB:.0f} MiB = ARC max {cfg['zfs_arc_max'] // MiB} MiB + dirty "
          f"max {cfg['zfs_dirty_data_max'] // MiB} MiB + {mem['measured_overhead_bytes'] / MiB:.0f}"
          f" MiB (idle RSS with the pool imported: {mem['after_pool_create_kib'] / 1024:.0f} MiB)")
    if ctx.old is None:
        return
    o = med["zilla_old"]
    rows = [[name, fmt(n[t]), fmt(o[t]), fmt(results[t]["ratio_new_over_old"], 2)]
            for t, _, name in FIGURES]
    print()
    print(table([f"new {ctx.new.commit} vs old {ctx.old.commit}", f"new (median of {n['rounds']})",
                 f"old (median of {o['rounds']})", "new/old"], rows))


def goals(results, memory, ctx):
    """The volume's goal (0.5, a perfect 2-way mirror's ceiling), and the data path's:
    device bytes >= 0.8 of direct and so the volume >= 0.4 (a 2-way mirror writes every
    byte twice), cold random reads >= 0.8 of direct, and peak RSS within ARC max +
    dirty max + 48 MiB."""
    g = [goal("1 MiB sequential write with checksums, volume / direct (a 2-way mirror's ceiling)", ">=", 0.5,
              results["seqwrite_1M"]["ratio_volume_over_direct"]),
         goal("1 MiB sequential write, volume / direct (0.8 of a 2-way mirror's ceiling)", ">=", 0.4,
              results["seqwrite_1M"]["ratio_volume_over_direct"]),
         goal("1 MiB sequential write, bytes reaching the devices / direct", ">=", 0.8,
              results["seqwrite_1M"]["ratio_device_over_direct"]),
         goal("16K random read IOPS, ARC cold, volume / direct", ">=", 0.8,
              results["randread_16K_cold"]["ratio_zilla_over_direct"]),
         goal("daemon peak RSS beyond ARC max + dirty max", "<=", 48,
              round(memory["measured_overhead_bytes"] / MiB, 1), unit="MiB")]
    if ctx.old is not None:
        g += [new_over_old(name, results[t]["ratio_new_over_old"], ctx.old.rev)
              for t, _, name in FIGURES]
    return g
