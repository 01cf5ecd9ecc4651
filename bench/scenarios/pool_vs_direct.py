"""Scenario pool-vs-direct: a Zilla volume against the raw files it is built on.

Theory of operation: four files are written once (untimed) so both sides work on
allocated extents. *Direct*: fio with one libaio direct=1 job per file, 1 MiB
sequential write (with end_fsync) and 16K random read. *Zilla*: a daemon makes
`mirror f0 f1 mirror f2 f3` on the same files with a small ARC and dirty limit, and fio's
nbd engine writes 1 MiB sequentially (several times the dirty limit, end_fsync) and
reads 16K at random over the written region (ARC cold) and over a region that fits the
ARC (warm), and 128K sequentially over the written region with the ARC dropped first
(the pool exported and imported again; read-ahead on, then once more with
`zfs_prefetch_disable=1` for comparison), against 128K sequential direct reads of the
four files (one job per file); device bytes come from the admin API, leaf queue depth is sampled, memory
is read from /proc. Then, in the same daemon, the write again *with company*: the pool
is exported, a second pool on its own files (`company`) gets a volume whose
`company_bytes` are written and read back, so they are in that pool's ARC (checked
with the ARC counters), and the same 1 MiB write runs on a fresh pool made again of the
first four files. The daemon's one ARC serves both pools, so for this part its limit is
raised to `company_arc_max` (the other pool's data plus the scenario's ARC max), and
the peak-RSS budget of this part is that ARC max plus the dirty max (builds before the
one ARC per daemon had an ARC per pool: for them this budget is one ARC short). Daemon CPU
(/proc/PID/stat over each fio run) is reported per MiB written and per read; for the
cold reads also fio's own CPU and the machine's steal and idle time (/proc/stat), so a
reader sees whether the CPU was there to be had. Rounds alternate so the machine's
drift shows: direct, Zilla, direct. With an old build: direct, new, old, direct (quick),
or direct, new, old, direct, old, new, direct (full), each build's figure the median of
its rounds. With an old build, the new/old goal of the daemon's CPU per warm 16K read is
decided by user-space instructions per read (lib/countio.py: each build on its own
daemon and COUNT_VOLUME, the reads over the warm working set at fixed rates, per read
the slope over windows of the same length; system calls per read beside them), since
the CPU measured from /proc/PID/stat moves by 15-20 % between identical runs here; the
wall-clock ratio of the rounds stays in the record.
"""

import os
import statistics

from lib import countio
from lib.admin import arc_delta
from lib.daemon import Zilla
from lib.fio import QueueSampler, fio
from lib.goals import goal, new_over_old
from lib.machine import loadavg, proc_status_kib, wait_idle
from lib.packages import ensure_tools
from lib.proc import log, make_workdir, run
from lib.tables import fmt, ratio, table

NAME = "pool-vs-direct"
DESCRIPTION = ("1M seq write (end_fsync; also with another pool holding cached data in the "
               "daemon) and 16K rand read: fio direct=1 on four files "
               "vs a Zilla volume on a pool of those files as two 2-way mirrors")
MiB, GiB = 1 << 20, 1 << 30
FIGURES = (("seqwrite_1M", "MBps", "1 MiB sequential write MB/s"),
           ("seqread_128K_cold", "MBps", "128K sequential read MB/s, ARC cold"),
           ("randread_16K_cold", "iops", "16K random read IOPS, ARC cold"),
           ("randread_16K_warm", "iops", "16K random read IOPS, ARC warm"))
# work per read of each build (--compare-old): the warm read over the warm working set
COUNT_VOLUME = 64 * MiB
COUNTED = (countio.Workload("randread_16K_warm", "16K random read with a warm ARC", "randread",
                            16 << 10, 32 * MiB, (200, 1000), (100, 500)),)


def settings(quick):
    return {"file_bytes": 512 * MiB if quick else 2 * GiB, "files": 4,
            "zfs_dirty_data_max": 128 * MiB if quick else 256 * MiB, "zfs_arc_max": 64 * MiB,
            "volume_bytes": 768 * MiB if quick else 3 * GiB, "volblocksize": "16K (default)",
            "zilla_write_bytes": 640 * MiB if quick else 2 * GiB,
            "read_runtime_s": 8 if quick else 15, "warm_working_set_bytes": 32 * MiB,
            "company_bytes": 512 * MiB if quick else 1 * GiB,
            "company_arc_max": (512 * MiB if quick else 1 * GiB) + 64 * MiB,
            "company": "a second pool (mirror of two files) in the same daemon whose volume's "
                       "company_bytes are written and read back (cached in its ARC) before the "
                       "1 MiB write runs again on a fresh pool of the four files; zfs_arc_max "
                       "(the daemon's, both pools') is company_arc_max for that part",
            "direct": "fio on the 4 files at once, one job per file, libaio direct=1: "
                      "write iodepth=2 per file (8 x 1 MiB in flight), randread iodepth=8 "
                      "per file (32 in flight), seqread bs=128k iodepth=1 per file (4 in "
                      "flight), group_reporting (aggregate)",
            "zilla": "fio ioengine=nbd, one connection: write bs=1M iodepth=8 end_fsync=1; "
                     "randread bs=16k iodepth=32; seqread bs=128k iodepth=4 over the "
                     "written region once, after the pool was exported and imported "
                     "(nothing of it in the ARC)"}


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
    d_s = statistics.median(d["seqread_128K"]["MBps"] for d in direct)
    med = {label: build_medians(rs) for label, rs in runs.items()}
    results = results_for(med, d_w, d_r, ctx, runs["zilla"][0])
    results["seqread_128K_cold"] = seqread_result(med, d_s, ctx, runs["zilla"][0])
    results["randread_16K_cold"]["direct_cpu_context"] = cpu_context(direct[0]["randread_16K"])
    print_tables(med, results, direct, runs["zilla"][0], cfg, ctx)
    counts = None
    if ctx.old is not None:
        counts = countio.count_builds(ctx.builds, wd, COUNTED, COUNT_VOLUME, ctx.quick)
        countio.print_counts(counts, COUNTED, {"randread_16K_warm": results["randread_16K_warm"].get(
            "cpu_ratio_new_over_old")})
    out = {"config": cfg, "results": results, "direct": direct,
           "zilla": runs["zilla"][0]["figures"], "memory": runs["zilla"][0]["memory"],
           "other_pool": runs["zilla"][0]["company"],
           "medians": med, "loadavg": loads,
           "goals": goals(results, runs["zilla"][0]["memory"], ctx, counts)}
    if counts is not None:
        out["work_per_io"] = counts
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
            + per_file_jobs(files, cfg, "r"), wd, f"direct-randread-{tag}", machine_cpu=True)
    s = fio(["--ioengine=libaio", "--direct=1", "--rw=read", "--bs=128k", "--iodepth=1",
             f"--runtime={cfg['read_runtime_s']}", "--time_based", "--group_reporting"]
            + per_file_jobs(files, cfg, "s"), wd, f"direct-seqread-{tag}")
    log(f"direct {tag}: write {w['MBps']:.0f} MB/s, randread 16K {r['iops']:,.0f} IOPS, "
        f"seqread 128K {s['MBps']:.0f} MB/s")
    return {"seqwrite_1M": w, "randread_16K": r, "seqread_128K": s}


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
    sc = zilla_seqread_cold(z, files, cfg, wd, tag, prefetch=True)
    sc_off = zilla_seqread_cold(z, files, cfg, wd, f"{tag}-noprefetch", prefetch=False)
    # Warm reads: a working set that fits the ARC, read once first.
    run(["fio", "--name=warm", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=read",
         "--bs=128k", "--iodepth=8", f"--size={cfg['warm_working_set_bytes']}",
         f"--output={os.path.join(wd, f'warmup-{tag}.txt')}"])
    rwm = zilla_randread(z, cfg["warm_working_set_bytes"], cfg, wd, f"{tag}-warm", sample=False)
    rss["hwm_end_kib"] = proc_status_kib(z.pid, "VmHWM")
    rss["rss_end_kib"] = proc_status_kib(z.pid, "VmRSS")
    z.cli("pool", "export", "bench")
    wc, company = write_with_company(z, files, cfg, wd, tag)
    rss["hwm_with_company_kib"] = proc_status_kib(z.pid, "VmHWM")
    z.stop()
    memory_overheads(rss, cfg)
    return {"build": build.label, "step": step, "memory": rss, "company": company,
            "figures": {"seqwrite_1M": w, "randread_16K_cold": rc, "randread_16K_warm": rwm,
                        "seqread_128K_cold": sc, "seqread_128K_cold_noprefetch": sc_off,
                        "seqwrite_1M_with_company": wc}}


def memory_overheads(rss, cfg):
    """Peak RSS beyond the ARC and dirty limits, per part of the round: alone (one pool:
    ARC max + dirty max) and with company (two pools sharing the daemon's ARC of
    company_arc_max, + dirty max). VmHWM only grows, so each part's figure is the peak up to its end
    against that part's budget; the goal takes the larger of the two."""
    budget = cfg["zfs_arc_max"] + cfg["zfs_dirty_data_max"]
    budget_c = cfg["company_arc_max"] + cfg["zfs_dirty_data_max"]
    alone = rss["hwm_end_kib"] * 1024 - budget
    with_company = rss["hwm_with_company_kib"] * 1024 - budget_c
    rss.update({"budget_arc_plus_dirty_bytes": budget, "overhead_alone_bytes": alone,
                "budget_with_company_bytes": budget_c, "overhead_with_company_bytes": with_company,
                "measured_overhead_bytes": max(alone, with_company),
                "idle_overhead_bytes": rss["after_pool_create_kib"] * 1024})
    return rss


def write_with_company(z, files, cfg, wd, tag):
    """With `bench` exported: a second pool whose volume's company_bytes are written and
    read back into its ARC, then the 1 MiB write on a fresh `bench` of the same files.
    Returns (the write's summary, what the other pool held in the ARC before and after)."""
    cb = cfg["company_bytes"]
    z.cli("tunable", "set", f"zfs_arc_max={cfg['company_arc_max']}")
    cfiles = []
    for i in range(2):
        cfiles.append(os.path.join(wd, f"company-{tag}-{i}.img"))
        with open(cfiles[-1], "wb") as f:
            f.truncate(cb + cb // 2 + 256 * MiB)
    z.cli("pool", "create", "-f", "company", "mirror", cfiles[0], cfiles[1])
    z.cli("volume", "create", "-V", str(cb), "company/vol")
    seq = ["--ioengine=nbd", f"--uri={z.uri('company/vol')}", "--bs=1M", "--iodepth=8",
           f"--size={cb}"]
    fio(["--name=cw", "--rw=write", "--end_fsync=1"] + seq, wd, f"{tag}-company-fill")
    arc0 = z.admin.arc_counters()
    fio(["--name=cr", "--rw=read"] + seq, wd, f"{tag}-company-readback")
    arc1 = z.admin.arc_counters()           # only the other pool is imported: its blocks
    wait_idle(z.pid)
    z.cli("pool", "create", "-f", "bench", "mirror", files[0], files[1], "mirror", files[2], files[3])
    z.cli("volume", "create", "-V", str(cfg["volume_bytes"]), "bench/vol")
    w = zilla_write(z, cfg, wd, f"{tag}-with-company")
    w["arc_during"] = arc_delta(arc1, z.admin.arc_counters())
    z.cli("pool", "export", "bench")
    arc2 = z.admin.arc_counters()           # the other pool's blocks again (bench's left with it)
    z.cli("pool", "export", "company")
    for p in cfiles:
        os.unlink(p)
    company = company_record(cb, cfg["company_arc_max"], arc0, arc1, arc2)
    mib = lambda b: "-" if b is None else b // MiB
    log(f"{z.label} write with another pool holding {mib(company['arc_bytes_before_write'])} MiB "
        f"in the ARC ({mib(company['arc_bytes_after_write'])} MiB after): "
        f"{w['MBps']:.0f} MB/s, {w['server_cpu_ms_per_MiB']} ms CPU per MiB"
        + ("" if company["cached"] else "; the other pool's data was NOT in the ARC as the write began"))
    return w, company


def company_record(cb, arc_max, arc0, arc1, arc2):
    """What the other pool held in the ARC: after its read-back (before the write) and
    after the write; `cached` when it held >= 0.9 of the bytes it was given as the
    write began. The daemon's one ARC serves both pools, so the write may evict some
    of the other pool's blocks, as OpenZFS's would (builds with an ARC per pool kept
    them all): what is left after is reported, not required."""
    before, after = arc1.get("size"), arc2.get("size")
    cached = before is not None and before >= 0.9 * cb
    return {"bytes": cb, "arc_max": arc_max, "read_back": arc_delta(arc0, arc1),
            "arc_bytes_before_write": before, "arc_bytes_after_write": after, "cached": cached}


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
    w["server_cpu_ms_per_MiB"] = (round(w["server_cpu_s"] * 1000 / (w["bytes"] / MiB), 3)
                                  if w["bytes"] else None)
    w["device_avg_write_bytes"] = w["device_bytes_written"] // max(1, w["device_write_ops"])
    log(f"{z.label} write: {w['MBps']:.0f} MB/s volume, {w['device_MBps']} MB/s at the devices "
        f"(x{w['write_amplification']}), {w['server_cpu_ms_per_MiB']} ms CPU per MiB; "
        f"leaf queues {w['leaf_queue']}")
    return w


def zilla_randread(z, span, cfg, wd, tag, sample):
    dev0, la, arc0 = z.admin.device_bytes("bench"), loadavg(), z.admin.arc_counters()
    args = ["--name=zr", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=randread",
            "--bs=16k", "--iodepth=32", f"--size={span}", f"--runtime={cfg['read_runtime_s']}",
            "--time_based"]
    if sample:
        with QueueSampler(z, "bench", period_s=0.2) as qs:
            r = fio(args, wd, f"{tag}-randread", cpu_pid=z.pid, machine_cpu=True)
        r["leaf_queue"] = qs.summary()
    else:
        r = fio(args, wd, f"{tag}-randread", cpu_pid=z.pid)
    r["arc"] = arc_delta(arc0, z.admin.arc_counters())
    r["loadavg_before"] = la
    r["device_bytes_read"] = z.admin.device_bytes("bench")["read"] - dev0["read"]
    r["device_read_fraction"] = round(r["device_bytes_read"] / max(1, r["bytes"]), 4)
    log(f"{z.label} {tag} randread 16K: {r['iops']:,.0f} IOPS, device read "
        f"{r['device_read_fraction']:.2f} x the volume bytes; {r['server_cpu_us_per_io']} CPU-us/IO"
        + (f"; fio {r['fio_cores']} cores, steal {r['machine_cpu']['steal_pct']}%" if sample else ""))
    return r


def zilla_seqread_cold(z, files, cfg, wd, tag, prefetch):
    """128K sequential reads of the written region with nothing of the pool in the ARC:
    the pool is exported and imported again first (the export drops its ARC entries).
    `prefetch=False`: with `zfs_prefetch_disable=1` (set back to 0 after); a build
    without that tunable gives None."""
    if not prefetch:
        try:
            z.cli("tunable", "set", "zfs_prefetch_disable=1")
        except Exception as e:          # an older build: no read-ahead to turn off
            log(f"{z.label}: no zfs_prefetch_disable ({e}); cold seqread without read-ahead skipped")
            return None
    z.cli("pool", "export", "bench")
    z.cli("pool", "import", "-d", os.path.dirname(files[0]), "bench")
    wait_idle(z.pid)
    dev0, stats0 = z.admin.device_bytes("bench"), arcstats(z)
    s = fio(["--name=zs", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}", "--rw=read",
             "--bs=128k", "--iodepth=4", f"--size={cfg['zilla_write_bytes']}",
             f"--runtime={cfg['read_runtime_s']}"], wd, f"{tag}-seqread-cold", cpu_pid=z.pid)
    stats1 = arcstats(z)
    if not prefetch:
        z.cli("tunable", "set", "zfs_prefetch_disable=0")
    s["device_bytes_read"] = z.admin.device_bytes("bench")["read"] - dev0["read"]
    s["device_read_fraction"] = round(s["device_bytes_read"] / max(1, s["bytes"]), 4)
    s["server_cpu_us_per_MiB"] = (round(s["server_cpu_s"] * 1e6 / (s["bytes"] / MiB), 1)
                                  if s["bytes"] else None)
    s["counters"] = {k: stats1[k] - stats0.get(k, 0) for k in SEQREAD_COUNTERS if k in stats1}
    log(f"{z.label} cold seqread 128K{'' if prefetch else ' (zfs_prefetch_disable=1)'}: "
        f"{s['MBps']:.0f} MB/s, device read {s['device_read_fraction']:.2f} x the volume "
        f"bytes, {s['server_cpu_us_per_MiB']} CPU-us/MiB; {s['counters']}")
    return s


# The arcstats and zfetchstats a cold sequential read reports (as deltas).
SEQREAD_COUNTERS = ("demand_data_hits", "demand_data_misses", "prefetch_data_hits",
                    "prefetch_data_misses", "arc_prefetch_used", "zfetch_hits",
                    "zfetch_misses", "zfetch_max_streams", "zfetch_io_issued")


def arcstats(z):
    try:
        return z.admin.get("/v1/arcstats")
    except Exception:
        return {}


def seqread_result(med, d_s, ctx, first):
    """The cold 128K sequential read's record: the volume against direct, and the same
    read without read-ahead (first round) for comparison."""
    n = med["zilla"]
    off = first["figures"].get("seqread_128K_cold_noprefetch")
    res = {"direct_MBps_median": d_s, "zilla_volume_MBps": n["seqread_128K_cold"],
           "ratio_volume_over_direct": ratio(n["seqread_128K_cold"], d_s),
           "zilla_cpu_us_per_MiB": first["figures"]["seqread_128K_cold"].get("server_cpu_us_per_MiB"),
           "counters": first["figures"]["seqread_128K_cold"].get("counters"),
           "zilla_noprefetch_MBps": off["MBps"] if off else None,
           "ratio_noprefetch_over_direct": ratio(off["MBps"], d_s) if off else None,
           "noprefetch_counters": off.get("counters") if off else None}
    if ctx.old is not None:
        res["zilla_old"] = med["zilla_old"]["seqread_128K_cold"]
        res["ratio_new_over_old"] = ratio(n["seqread_128K_cold"], res["zilla_old"])
    return res


def median_or_none(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def build_medians(rounds):
    """{figure test: median value} over one build's rounds, plus the device MB/s, the
    daemon's CPU per MiB written and per cold read, and the write with company (its CPU
    only from rounds where the other pool's data was in the ARC)."""
    m = {t: statistics.median(r["figures"][t][k] for r in rounds) for t, k, _ in FIGURES}
    m["seqwrite_1M_device_MBps"] = statistics.median(
        r["figures"]["seqwrite_1M"]["device_MBps"] or 0 for r in rounds)
    m["seqwrite_1M_cpu_ms_per_MiB"] = median_or_none(
        r["figures"]["seqwrite_1M"].get("server_cpu_ms_per_MiB") for r in rounds)
    m["randread_16K_cold_cpu_us_per_io"] = median_or_none(
        r["figures"]["randread_16K_cold"].get("server_cpu_us_per_io") for r in rounds)
    m["randread_16K_warm_cpu_us_per_io"] = median_or_none(
        r["figures"]["randread_16K_warm"].get("server_cpu_us_per_io") for r in rounds)
    cached = [r for r in rounds if r.get("company", {}).get("cached")]
    m["seqwrite_1M_with_company"] = median_or_none(
        r["figures"]["seqwrite_1M_with_company"]["MBps"] for r in cached)
    m["seqwrite_1M_with_company_cpu_ms_per_MiB"] = median_or_none(
        r["figures"]["seqwrite_1M_with_company"].get("server_cpu_ms_per_MiB") for r in cached)
    m["company_cached_rounds"] = len(cached)
    m["rounds"] = len(rounds)
    return m


def cpu_context(read):
    """Who had the CPUs during a cold read run: the daemon, fio (its usr/sys from its
    JSON, percent of one CPU), everything else that was busy (other processes, kernel
    threads, interrupts), and the machine's steal and idle time (/proc/stat)."""
    mc = read.get("machine_cpu") or {}
    busy, own = mc.get("busy_cores"), [read.get("server_cores") or 0, read.get("fio_cores")]
    rest = (round(max(0.0, busy - sum(own)), 3) if busy is not None and None not in own else None)
    return {"daemon_cores": read.get("server_cores"), "fio_usr_pct": read.get("fio_cpu_usr_pct"),
            "fio_sys_pct": read.get("fio_cpu_sys_pct"), "fio_cores": read.get("fio_cores"),
            "cpus": mc.get("cpus"), "steal_pct": mc.get("steal_pct"),
            "steal_cores": mc.get("steal_cores"), "idle_pct": mc.get("idle_pct"),
            "busy_cores": busy, "everything_else_cores": rest}


def results_for(med, d_w, d_r, ctx, first=None):
    """The comparison records; `first` is this build's first round (the cold read's CPU
    context comes from it)."""
    n = med["zilla"]
    res = {"seqwrite_1M": {"direct_MBps_median": d_w, "zilla_volume_MBps": n["seqwrite_1M"],
                           "zilla_device_MBps": n["seqwrite_1M_device_MBps"],
                           "zilla_cpu_ms_per_MiB": n["seqwrite_1M_cpu_ms_per_MiB"],
                           "ratio_volume_over_direct": ratio(n["seqwrite_1M"], d_w),
                           "ratio_device_over_direct": ratio(n["seqwrite_1M_device_MBps"], d_w),
                           "target": "volume >= 0.5 x direct",
                           "target_met": (n["seqwrite_1M"] / d_w) >= 0.5 if d_w else None},
           "seqwrite_1M_with_company": {
               "zilla_volume_MBps": n["seqwrite_1M_with_company"],
               "zilla_alone_MBps": n["seqwrite_1M"],
               "ratio_with_company_over_alone": ratio(n["seqwrite_1M_with_company"], n["seqwrite_1M"]),
               "zilla_cpu_ms_per_MiB": n["seqwrite_1M_with_company_cpu_ms_per_MiB"],
               "zilla_alone_cpu_ms_per_MiB": n["seqwrite_1M_cpu_ms_per_MiB"],
               "rounds_with_other_pool_cached": n["company_cached_rounds"], "rounds": n["rounds"]},
           "randread_16K_cold": {"direct_iops_median": d_r, "zilla_iops": n["randread_16K_cold"],
                                 "ratio_zilla_over_direct": ratio(n["randread_16K_cold"], d_r),
                                 "zilla_cpu_us_per_io": n["randread_16K_cold_cpu_us_per_io"],
                                 "cpu_context": (cpu_context(first["figures"]["randread_16K_cold"])
                                                 if first else None)},
           "randread_16K_warm": {"direct_iops_median": d_r, "zilla_iops": n["randread_16K_warm"],
                                 "ratio_zilla_over_direct": ratio(n["randread_16K_warm"], d_r),
                                 "zilla_cpu_us_per_io": n["randread_16K_warm_cpu_us_per_io"]}}
    if ctx.old is not None:
        o = med["zilla_old"]
        for t in (t for t, _, _ in FIGURES if t in res):   # the seqread's: seqread_result
            res[t]["zilla_old"] = o[t]
            res[t]["ratio_new_over_old"] = ratio(n[t], o[t])
        w = res["randread_16K_warm"]
        w["zilla_old_cpu_us_per_io"] = o["randread_16K_warm_cpu_us_per_io"]
        w["cpu_ratio_new_over_old"] = ratio(n["randread_16K_warm_cpu_us_per_io"],
                                            o["randread_16K_warm_cpu_us_per_io"])
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
            ["128K seq read MB/s, ARC cold", fmt(results["seqread_128K_cold"]["direct_MBps_median"]),
             fmt(n["seqread_128K_cold"]),
             fmt(results["seqread_128K_cold"]["ratio_volume_over_direct"], 2),
             f"without read-ahead {fmt(results['seqread_128K_cold']['zilla_noprefetch_MBps'])} MB/s"],
            ["16K rand read IOPS, ARC warm", fmt(d_r), fmt(n["randread_16K_warm"]),
             fmt(ratio(n["randread_16K_warm"], d_r), 2),
             f"{cfg['warm_working_set_bytes'] // MiB} MiB working set"],
            ["1M seq write MB/s, other pool cached", fmt(d_w), fmt(n["seqwrite_1M_with_company"]),
             fmt(ratio(n["seqwrite_1M_with_company"], d_w), 2),
             f"alone {fmt(n['seqwrite_1M'])} MB/s; other pool {cfg['company_bytes'] // MiB} MiB "
             f"in its ARC in {n['company_cached_rounds']} of {n['rounds']} rounds"]]
    print(table(["test", f"direct (median of {len(direct)})",
                 f"zilla volume (median of {n['rounds']})", "ratio", "note"], rows))
    print_cpu(results, cfg)
    mem = first["memory"]
    hwm, hwm_c = mem["hwm_end_kib"] * 1024, mem["hwm_with_company_kib"] * 1024
    print(f"daemon VmHWM alone {hwm / MiB:.0f} MiB = ARC max {cfg['zfs_arc_max'] // MiB} MiB + dirty "
          f"max {cfg['zfs_dirty_data_max'] // MiB} MiB + {mem['overhead_alone_bytes'] / MiB:.0f}"
          f" MiB (idle RSS with the pool imported: {mem['after_pool_create_kib'] / 1024:.0f} MiB); "
          f"whole run with the other pool {hwm_c / MiB:.0f} MiB = ARC max "
          f"{cfg['company_arc_max'] // MiB} MiB + dirty max {cfg['zfs_dirty_data_max'] // MiB} MiB + "
          f"{mem['overhead_with_company_bytes'] / MiB:.0f} MiB")
    if ctx.old is None:
        return
    o = med["zilla_old"]
    rows = [[name, fmt(n[t]), fmt(o[t]), fmt(results[t]["ratio_new_over_old"], 2)]
            for t, _, name in FIGURES]
    print()
    print(table([f"new {ctx.new.commit} vs old {ctx.old.commit}", f"new (median of {n['rounds']})",
                 f"old (median of {o['rounds']})", "new/old"], rows))


def print_cpu(results, cfg):
    """The daemon's CPU per MiB written (alone, with company) and per cold read, and who
    else had the CPUs during the cold reads."""
    w, wc = results["seqwrite_1M"], results["seqwrite_1M_with_company"]
    rc = results["randread_16K_cold"]
    print(f"daemon CPU per MiB written: {fmt(w['zilla_cpu_ms_per_MiB'], 3)} ms alone, "
          f"{fmt(wc['zilla_cpu_ms_per_MiB'], 3)} ms with another pool holding "
          f"{cfg['company_bytes'] // MiB} MiB cached ({fmt(wc['zilla_volume_MBps'])} MB/s vs "
          f"{fmt(wc['zilla_alone_MBps'])} MB/s alone); daemon CPU per cold 16K read: "
          f"{fmt(rc['zilla_cpu_us_per_io'], 1)} us")
    for who, c in (("zilla", rc.get("cpu_context")), ("direct", rc.get("direct_cpu_context"))):
        if not c:
            continue
        print(f"cold 16K reads, {who}: fio usr {fmt(c['fio_usr_pct'])}% + sys {fmt(c['fio_sys_pct'])}%"
              f" of one CPU ({fmt(c['fio_cores'], 2)} cores)"
              + (f", daemon {fmt(c['daemon_cores'], 2)} cores" if c.get("daemon_cores") is not None else "")
              + f", everything else {fmt(c['everything_else_cores'], 2)} cores; steal "
              f"{fmt(c['steal_pct'])}% of the {c['cpus']} CPUs ({fmt(c['steal_cores'], 2)} cores),"
              f" idle {fmt(c['idle_pct'])}%")


def goals(results, memory, ctx, counts=None):
    """The volume's goal (0.5, a perfect 2-way mirror's ceiling), and the data path's:
    device bytes >= 0.8 of direct and so the volume >= 0.4 (a 2-way mirror writes every
    byte twice), cold random reads >= 0.8 of direct, and peak RSS within ARC max +
    dirty max + 48 MiB over the whole round (the part with a second pool included); the
    daemon's CPU: <= 0.5 ms per MiB written, alone and with another pool holding cached
    data (not measured when that pool's data was not in its ARC), <= 25 us per cold 16K
    read; cold 128K sequential reads (what read-ahead is for) >= 0.8 of direct."""
    wc = results["seqwrite_1M_with_company"]
    g = [goal("1 MiB sequential write with checksums, volume / direct (a 2-way mirror's ceiling)", ">=", 0.5,
              results["seqwrite_1M"]["ratio_volume_over_direct"]),
         goal("1 MiB sequential write, volume / direct (0.8 of a 2-way mirror's ceiling)", ">=", 0.4,
              results["seqwrite_1M"]["ratio_volume_over_direct"]),
         goal("1 MiB sequential write, bytes reaching the devices / direct", ">=", 0.8,
              results["seqwrite_1M"]["ratio_device_over_direct"]),
         goal("16K random read IOPS, ARC cold, volume / direct", ">=", 0.8,
              results["randread_16K_cold"]["ratio_zilla_over_direct"]),
         goal("cold 128K sequential read, volume / direct", ">=", 0.8,
              results["seqread_128K_cold"]["ratio_volume_over_direct"]),
         goal("daemon peak RSS beyond ARC max + dirty max", "<=", 48,
              round(memory["measured_overhead_bytes"] / MiB, 1), unit="MiB"),
         goal("1 MiB sequential write, daemon CPU per MiB written", "<=", 0.5,
              results["seqwrite_1M"].get("zilla_cpu_ms_per_MiB"), unit="ms/MiB"),
         goal("1 MiB sequential write with another pool holding cached data in the daemon, "
              "daemon CPU per MiB written", "<=", 0.5, wc.get("zilla_cpu_ms_per_MiB"), unit="ms/MiB"),
         goal("16K random read, ARC cold, daemon CPU per read", "<=", 25,
              results["randread_16K_cold"].get("zilla_cpu_us_per_io"), unit="us")]
    if ctx.old is not None:
        g += [new_over_old(name, results[t]["ratio_new_over_old"], ctx.old.rev)
              for t, _, name in FIGURES]
        # no more work per warm read than the old build: user-space instructions per
        # read (countio), the wall-clock CPU ratio of the rounds beside it
        g += [countio.goal_for(counts, w, ctx.old.rev,
                               results["randread_16K_warm"].get("cpu_ratio_new_over_old"))
              for w in COUNTED]
    return g
