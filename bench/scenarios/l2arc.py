"""Scenario l2arc: 8K random reads over a working set far larger than the ARC, from two
sim-hdd mirrors alone and with a sim-ssd cache device (seed 004, the Readzilla).

Theory of operation: one daemon with `zfs_arc_max` at its floor (64 MiB, set with
`serve --tunable` before the pool exists) holds `pool`: two sim-hdd mirrors of sparse
files plus one sim-ssd cache device whose backing file is in /dev/shm (make_memdir),
twice the working set. A thin volume with volblocksize=8K and secondarycache=none is
filled once (1 MiB sequential writes, end_fsync), so the ARC holds at most 1/4 of it.
The txg sync caches what it wrote as L2-eligible whatever secondarycache says, so the
fill feeds the cache device; the daemon is restarted after it (recorded first: the
l2_* counters after the fill), which leaves the cache device and the ARC empty.

1. Baseline (secondarycache=none): fio's nbd engine, 8K random reads over the working
   set, iodepth 16, time-based. IOPS, client latency, daemon CPU, ARC deltas, and the
   leaves' read latency from the per-leaf histograms of /v1/iostat (the disks).
2. Warm-up (secondarycache=all): one sequential pass over the working set (1 MiB
   reads, paced at l2arc_write_max per l2arc_feed_secs, what the feed writes per
   interval), then the baseline's random reads, while every 2 s the sampler reads
   arcstats and the NBD read count: l2_size as a share of the working set, the hit
   ratio ((ARC hits + L2 hits) / ARC reads of the interval) and IOPS. It stops once
   >= 90 % of the working set is on the cache device (after at least 10 s of random
   reads) or 60 s after the pass ended (the feed's goal: the share when 90 % was
   reached, or at 60 s); the curve goes to bench/results/l2arc-warmup.svg.
3. Warm: the baseline's fio job again: IOPS and latency ratios, and the cache
   device's read latency (its histograms over the run) against the disks' (baseline).
4. Persistence: the daemon is stopped (SIGTERM: export) and started on the same state
   dir (it re-imports the pool), and the same job runs for 10 s; then kill -9 and the
   same. Each is held to >= 0.8 of the warm IOPS: the cache device's log is read back
   at import while the pool is served.

Device latency: a leaf's mean from its log2 histograms (bucket i = [2^i, 2^(i+1)) ns,
counted at 1.5 x 2^i), read classes only, the difference of two snapshots; `total`
includes the time queued in the leaf (seed 004's wsvc_t + asvc_t), `disk` is the
device's own time. Sizes come from arcstats' l2_size (logical bytes of the copies,
metadata included: a little over the working set's data once all of it is there).
"""

import os
import time

from lib.admin import arc_delta
from lib.daemon import Zilla
from lib.fio import fio
from lib.goals import goal
from lib.machine import wait_idle
from lib.packages import ensure_tools
from lib.proc import ROOT, BenchError, is_memdir, log, make_memdir, make_workdir, spawn, stop
from lib.syncio import tunables
from lib.tables import fmt, ratio, table

NAME = "l2arc"
DESCRIPTION = ("fio nbd 8K random reads over a working set 4-8x the ARC: two sim-hdd mirrors "
               "alone vs with a sim-ssd cache device (warm-up curve, restart, kill -9)")
MiB = 1 << 20
ARC_MAX = 64 * MiB
POOL, VOL = "l2", "l2/vol"
SAMPLE_S = 2.0
FEED_WINDOW_S = 60       # the feed goal: >= FILL_TARGET of the set on the cache device within it
FILL_TARGET = 0.9
RESTART_WINDOW_S = 10
MIN_RANDOM_S = 10        # random reads sampled at least this long, so the curve shows them
IOPS_GOAL = 8.3          # seed 004: 8.3x the NFS ops with the L2ARC warm
LATENCY_GOAL = 20        # seed 004: 9-10 ms on the disks, 0.4-0.6 ms on the cache devices
RESTART_GOAL = 0.8
HDR_GOAL_BYTES = 64
READ_CLASSES = ("sync_read", "async_read")


def settings(quick):
    ws = 256 * MiB if quick else 512 * MiB
    return {"working_set_bytes": ws, "zfs_arc_max": ARC_MAX, "volblocksize": "8K",
            "cache_device_bytes": 2 * ws, "disk_bytes": ws + 1024 * MiB,
            "runtime_s": 20 if quick else 40, "iodepth": 16, "bs": "8k",
            "restart_window_s": RESTART_WINDOW_S, "sample_period_s": SAMPLE_S,
            "feed_window_s": FEED_WINDOW_S, "fill_target": FILL_TARGET,
            "pool": "mirror sim-hdd sim-hdd mirror sim-hdd sim-hdd cache sim-ssd "
                    "(cache backing file in /dev/shm unless BENCH_MEMDIR=0)",
            "fio": "--ioengine=nbd --rw=randread --bs=8k --iodepth=16 --time_based, one "
                   "connection, over the whole working set"}


def run_scenario(ctx):
    ensure_tools(["fio"])
    cfg = settings(ctx.quick)
    ws = cfg["working_set_bytes"]
    wd, md = make_workdir(), make_memdir(need_bytes=cfg["cache_device_bytes"] + 256 * MiB)
    cfg["cache_device_in_memory"] = is_memdir(md)
    log(f"workdir {wd}; working set {ws // MiB} MiB, ARC max {ARC_MAX // MiB} MiB, cache device "
        f"{cfg['cache_device_bytes'] // MiB} MiB in {md}; {cfg['runtime_s']}s per test")
    z = Zilla(ctx.new, wd, tunables=[f"zfs_arc_max={ARC_MAX}"])
    disks, cache = make_pool(z, wd, md, cfg)
    cfg["tunables"] = {k: v for k, v in tunables(z).items()
                       if k.startswith(("l2arc_", "sim_ssd_cache", "sim_hdd_", "zfs_arc_max"))}
    fill(z, wd, ws)
    # The txg sync caches the blocks it wrote as L2-eligible whatever the volume's
    # secondarycache says, so the fill alone puts much of the set on the cache device:
    # recorded, then cleared by a restart (the cache devices come back empty, the ARC
    # too), so the baseline reads from the disks only.
    after_fill = l2_counters(z)
    log(f"after the fill (secondarycache=none): l2_size {after_fill['l2_size']} bytes, "
        f"l2_write_bytes {after_fill['l2_write_bytes']}")
    z.stop()
    z = Zilla(ctx.new, wd, tunables=[f"zfs_arc_max={ARC_MAX}"], log_tag="baseline")
    base = measure(z, wd, cfg, "baseline", disks, cache)
    base["l2_after_fill_secondarycache_none"] = after_fill
    z.cli("set", "secondarycache=all", VOL)
    warmup = warm_up(z, wd, cfg)
    plot = os.path.join(ROOT, "bench", "results", "l2arc-warmup.svg")
    write_svg(warmup, cfg, plot)
    log(f"wrote {plot}")
    warm = measure(z, wd, cfg, "warm", disks, cache)
    status_warm = z.cli("pool", "status", POOL)
    z.stop()
    restart = after_restart(ctx, wd, cfg, "restart", disks, cache)
    restart["daemon"].kill()
    killed = after_restart(ctx, wd, cfg, "kill9", disks, cache)
    killed["daemon"].stop()
    for r in (restart, killed):
        del r["daemon"]
    res = results(base, warm, warmup, restart, killed, cfg)
    print_tables(res, base, warm, warmup, restart, killed, cfg)
    return {"config": cfg, "results": res, "baseline": base, "warm": warm,
            "warmup": warmup, "restart": restart, "kill9": killed,
            "pool_status_warm": status_warm.splitlines(), "goals": goals(res)}


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def make_pool(z, wd, md, cfg):
    """The pool and the volume; returns (disk leaf names, cache leaf names) as the admin
    API names them."""
    d = ["sim-hdd:" + sparse(os.path.join(wd, f"d{i}.img"), cfg["disk_bytes"]) for i in range(4)]
    c = "sim-ssd:" + sparse(os.path.join(md, "cache0.img"), cfg["cache_device_bytes"])
    z.cli("pool", "create", "-f", POOL, "mirror", d[0], d[1], "mirror", d[2], d[3], "cache", c)
    z.cli("volume", "create", "-s", "-V", str(cfg["working_set_bytes"]), "-b", "8K",
          "-o", "secondarycache=none", VOL)
    disks, cache = [], []
    for top in z.admin.iostat(POOL)["vdevs"]:
        leaves = [x["name"] for x in top.get("children") or []] or [top["name"]]
        (cache if top.get("role") == "cache" else disks).extend(leaves)
    if not cache:
        raise BenchError(f"pool {POOL} has no cache vdev in /v1/iostat")
    return disks, cache


def fill(z, wd, ws):
    fio(["--name=fill", "--ioengine=nbd", f"--uri={z.uri(VOL)}", "--rw=write", "--bs=1M",
         "--iodepth=8", f"--size={ws}", "--end_fsync=1"], wd, "fill")
    wait_idle(z.pid, timeout_s=30)


def randread_args(z, cfg, runtime_s):
    return ["--name=rr", "--ioengine=nbd", f"--uri={z.uri(VOL)}", "--rw=randread",
            f"--bs={cfg['bs']}", f"--iodepth={cfg['iodepth']}", f"--size={cfg['working_set_bytes']}",
            f"--runtime={runtime_s}", "--time_based", "--randrepeat=0"]


def leaf_read_latency(z, names):
    """{leaf: {"ops", "total_hist", "disk_hist"}} of the read classes, for `names`."""
    out = {}

    def walk(n):
        if n.get("children"):
            for c in n["children"]:
                walk(c)
        elif n["name"] in names:
            cl = n["stats"].get("classes", {})
            rec = {"ops": 0, "total_hist": [], "disk_hist": []}
            for k in READ_CLASSES:
                x = cl.get(k) or {}
                rec["ops"] += x.get("ops", 0)
                rec["total_hist"] = add(rec["total_hist"], x.get("total_latency_hist") or [])
                rec["disk_hist"] = add(rec["disk_hist"], x.get("disk_latency_hist") or [])
            out[n["name"]] = rec
    for v in z.admin.iostat(POOL)["vdevs"]:
        walk(v)
    return out


def add(a, b):
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def sub(a, b):
    return [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]


def hist_mean_us(h):
    """Mean of a log2 histogram of ns (bucket i = [2^i, 2^(i+1)), counted at 1.5 x 2^i)."""
    n = sum(h)
    if n <= 0:
        return None
    return round(sum(c * 1.5 * (1 << i) for i, c in enumerate(h)) / n / 1000, 1)


def latency_delta(before, after, names):
    """Read ops and mean total / disk latency (us) of the leaves `names` together."""
    ops, tot, dsk = 0, [], []
    for n in names:
        a, b = before.get(n), after.get(n)
        if not a or not b:
            continue
        ops += b["ops"] - a["ops"]
        tot = add(tot, sub(b["total_hist"], a["total_hist"]))
        dsk = add(dsk, sub(b["disk_hist"], a["disk_hist"]))
    return {"read_ops": ops, "total_mean_us": hist_mean_us(tot), "disk_mean_us": hist_mean_us(dsk)}


def l2_counters(z):
    a = z.admin.get("/v1/arcstats")
    keys = ("hits", "misses", "size", "c", "l2_hits", "l2_misses", "l2_size", "l2_asize",
            "l2_hdr_size", "l2_blocks", "l2_feeds", "l2_writes_sent", "l2_writes_done", "l2_write_bytes",
            "l2_feed_dropped", "l2_abort_lowmem", "l2_cksum_bad", "l2_io_error", "l2_writes_error")
    return {k: a.get(k) for k in keys}


def counter_delta(a, b):
    d = {k: (b[k] - a[k]) if isinstance(a.get(k), int) and isinstance(b.get(k), int) else b.get(k)
         for k in b}
    for k in ("size", "c", "l2_size", "l2_asize", "l2_hdr_size", "l2_blocks"):
        d[k] = b.get(k)    # sizes: the value at the end
    reads = (d.get("hits") or 0) + (d.get("misses") or 0)
    d["hit_ratio_arc_plus_l2"] = (round(((d.get("hits") or 0) + (d.get("l2_hits") or 0)) / reads, 4)
                                  if reads else None)
    return d


def nbd_read_ops(z):
    try:
        return sum(c.get("read_ops", 0) for c in z.admin.get("/v1/clients"))
    except Exception:
        return None


def measure(z, wd, cfg, tag, disks, cache, runtime_s=None):
    """The random-read job; IOPS, latency, CPU, arcstats and leaf latency deltas."""
    wait_idle(z.pid, timeout_s=30)
    names = disks + cache
    lat0, arc0 = leaf_read_latency(z, names), l2_counters(z)
    r = fio(randread_args(z, cfg, runtime_s or cfg["runtime_s"]), wd, tag, cpu_pid=z.pid)
    lat1, arc1 = leaf_read_latency(z, names), l2_counters(z)
    r["arcstats_delta"] = counter_delta(arc0, arc1)
    r["disks"] = latency_delta(lat0, lat1, disks)
    r["cache_device"] = latency_delta(lat0, lat1, cache)
    a = r["arcstats_delta"]
    log(f"{tag}: {r['iops']:,.0f} IOPS, lat {r['lat_mean_us']} us (p99 {r['lat_p99_us']}); "
        f"hit ratio {a['hit_ratio_arc_plus_l2']} (l2_hits {a['l2_hits']}); disks "
        f"{r['disks']['read_ops']} reads at {r['disks']['total_mean_us']} us, cache device "
        f"{r['cache_device']['read_ops']} reads at {r['cache_device']['total_mean_us']} us; "
        f"daemon {r['server_cpu_us_per_io']} CPU-us/IO")
    return r


def warm_up(z, wd, cfg):
    """The sequential pass, then random reads, sampled every SAMPLE_S until the cache
    device holds FILL_TARGET of the set or FEED_WINDOW_S after the pass."""
    ws = cfg["working_set_bytes"]
    t = tunables(z)
    pace = max(1, t.get("l2arc_write_max", 32 * MiB) // max(1, t.get("l2arc_feed_secs", 1)))
    cfg["warm_pass"] = f"--rw=read --bs=1M --iodepth=4 --rate={pace} (l2arc_write_max per l2arc_feed_secs)"
    seq = spawn(["fio", "--name=pass", "--ioengine=nbd", f"--uri={z.uri(VOL)}", "--rw=read",
                 "--bs=1M", "--iodepth=4", f"--size={ws}", f"--rate={pace}",
                 f"--output={os.path.join(wd, 'fio-warm-pass.txt')}"], os.path.join(wd, "warm-pass.log"))
    samples, t0 = [], time.time()
    prev = (t0, l2_counters(z), nbd_read_ops(z))
    rnd = None
    pass_end_s = reached_s = fraction_at_goal = None
    try:
        while True:
            time.sleep(SAMPLE_S)
            now = time.time()
            cur = (now, l2_counters(z), nbd_read_ops(z))
            s = sample(prev, cur, t0, ws, "random" if rnd else "pass")
            samples.append(s)
            prev = cur
            if rnd is None and seq.poll() is not None:
                if seq.returncode != 0:
                    raise BenchError(f"the sequential pass failed ({seq.returncode}); see {wd}/warm-pass.log")
                pass_end_s = round(now - t0, 1)
                log(f"warm-up: sequential pass done at {pass_end_s}s, l2_size {s['l2_fraction']:.2f} of the set")
                rnd = spawn(["fio", "--output-format=json",
                             f"--output={os.path.join(wd, 'fio-warm-random.json')}"]
                            + randread_args(z, cfg, FEED_WINDOW_S + 30), os.path.join(wd, "warm-random.log"))
            if rnd is not None and s["l2_fraction"] >= FILL_TARGET and reached_s is None:
                reached_s = round(now - t0, 1)
                fraction_at_goal = s["l2_fraction"]
            if rnd is not None and now - t0 - pass_end_s >= FEED_WINDOW_S and reached_s is None:
                fraction_at_goal = s["l2_fraction"]
                break
            if rnd is not None and (rnd.poll() is not None or
                                    (reached_s is not None and now - t0 - pass_end_s >= MIN_RANDOM_S)):
                break
            if rnd is None and now - t0 > 10 * FEED_WINDOW_S:
                raise BenchError("the sequential warm-up pass did not end in time")
    finally:
        for p in (seq, rnd):
            if p is not None:
                stop(p, grace_s=10)
    end = samples[-1]
    log(f"warm-up: {end['l2_fraction']:.3f} of the set on the cache device "
        + (f"{reached_s - pass_end_s:.0f}s after the pass" if reached_s else
           f"after {end['t_s'] - pass_end_s:.0f}s of random reads (target {FILL_TARGET} not reached)"))
    return {"samples": samples, "pass_end_s": pass_end_s,
            "fill_target_reached_s_after_pass": round(reached_s - pass_end_s, 1) if reached_s else None,
            "l2_fraction_end": end["l2_fraction"],
            "l2_fraction_for_goal": fraction_at_goal,
            "arcstats_end": prev[1]}


def sample(prev, cur, t0, ws, phase):
    (ta, a, na), (tb, b, nb) = prev, cur
    dt = tb - ta
    d = counter_delta(a, b)
    return {"t_s": round(tb - t0, 1), "phase": phase,
            "l2_size": b.get("l2_size"), "l2_fraction": round((b.get("l2_size") or 0) / ws, 4),
            "hit_ratio": d["hit_ratio_arc_plus_l2"],
            "iops": round((nb - na) / dt, 1) if na is not None and nb is not None else None,
            "l2_hits": d.get("l2_hits"), "l2_feed_dropped": d.get("l2_feed_dropped"),
            "l2_writes_sent": d.get("l2_writes_sent"), "l2_cksum_bad": d.get("l2_cksum_bad"),
            "l2_io_error": d.get("l2_io_error"), "arc_size": b.get("size")}


def after_restart(ctx, wd, cfg, tag, disks, cache):
    """A daemon on the same state dir (the pool re-imported) and the random-read job's
    first RESTART_WINDOW_S seconds."""
    z = Zilla(ctx.new, wd, tunables=[f"zfs_arc_max={ARC_MAX}"], log_tag=tag)
    status = z.cli("pool", "status", POOL)
    arc = l2_counters(z)
    r = measure(z, wd, cfg, tag, disks, cache, runtime_s=RESTART_WINDOW_S)
    r["l2_size_at_import"] = arc.get("l2_size")
    r["pool_status"] = status.splitlines()
    r["daemon"] = z
    return r


def results(base, warm, warmup, restart, killed, cfg):
    dlat = base["disks"]["total_mean_us"]
    clat = warm["cache_device"]["total_mean_us"]
    return {
        "baseline_iops": base["iops"], "warm_iops": warm["iops"],
        "iops_warm_over_baseline": ratio(warm["iops"], base["iops"]),
        "baseline_lat_mean_us": base["lat_mean_us"], "warm_lat_mean_us": warm["lat_mean_us"],
        "client_latency_baseline_over_warm": ratio(base["lat_mean_us"], warm["lat_mean_us"]),
        "disk_read_total_mean_us_baseline": dlat,
        "disk_read_disk_mean_us_baseline": base["disks"]["disk_mean_us"],
        "cache_read_total_mean_us_warm": clat,
        "cache_read_disk_mean_us_warm": warm["cache_device"]["disk_mean_us"],
        "device_latency_disks_over_cache": ratio(dlat, clat),
        "warm_reads_served_by_cache_device": warm["cache_device"]["read_ops"],
        "warm_reads_served_by_disks": warm["disks"]["read_ops"],
        "baseline_cpu_us_per_io": base.get("server_cpu_us_per_io"),
        "warm_cpu_us_per_io": warm.get("server_cpu_us_per_io"),
        "l2_fraction_within_window": warmup["l2_fraction_for_goal"],
        "l2_fraction_end_of_warmup": warmup["l2_fraction_end"],
        "fill_target_reached_s_after_pass": warmup["fill_target_reached_s_after_pass"],
        "restart_iops_first_10s": restart["iops"],
        "restart_over_warm": ratio(restart["iops"], warm["iops"]),
        "restart_l2_size_at_import": restart["l2_size_at_import"],
        "kill9_iops_first_10s": killed["iops"],
        "kill9_over_warm": ratio(killed["iops"], warm["iops"]),
        "kill9_l2_size_at_import": killed["l2_size_at_import"],
        "l2_hdr_bytes_per_block_warm": hdr_bytes_per_block(warm["arcstats_delta"]),
    }


def hdr_bytes_per_block(a):
    """DRAM per block on the cache device: l2_hdr_size / l2_blocks (None without blocks)."""
    blocks, hdr = a.get("l2_blocks"), a.get("l2_hdr_size")
    return round(hdr / blocks, 1) if blocks and hdr is not None else None


def goals(res):
    return [
        goal("8K random read IOPS over a working set 4x+ the ARC, L2ARC warm / disks only",
             ">=", IOPS_GOAL, res["iops_warm_over_baseline"]),
        goal("mean device read latency (incl. queue), disks (baseline) / cache device (warm)",
             ">=", LATENCY_GOAL, res["device_latency_disks_over_cache"]),
        goal(f"share of the working set on the cache device within {FEED_WINDOW_S}s of its "
             "first full read", ">=", FILL_TARGET, res["l2_fraction_within_window"], unit="of set"),
        goal(f"8K random read IOPS in the first {RESTART_WINDOW_S}s after a clean restart / warm",
             ">=", RESTART_GOAL, res["restart_over_warm"]),
        goal(f"8K random read IOPS in the first {RESTART_WINDOW_S}s after kill -9 and restart / warm",
             ">=", RESTART_GOAL, res["kill9_over_warm"]),
        goal("DRAM per block on the cache device (l2_hdr_size / blocks, every slack included; "
             "OpenZFS 96)", "<=", HDR_GOAL_BYTES, res["l2_hdr_bytes_per_block_warm"], unit="B"),
    ]


def print_tables(res, base, warm, warmup, restart, killed, cfg):
    rows = []
    for name, r in (("disks only (secondarycache=none)", base), ("L2ARC warm", warm),
                    (f"first {RESTART_WINDOW_S}s after restart", restart),
                    (f"first {RESTART_WINDOW_S}s after kill -9", killed)):
        a = r["arcstats_delta"]
        rows.append([name, fmt(r["iops"]), fmt(r["lat_mean_us"]), fmt(r["lat_p99_us"]),
                     fmt(a["hit_ratio_arc_plus_l2"], 3), fmt(a.get("l2_hits")),
                     fmt(r["disks"]["read_ops"]), fmt(r["disks"]["total_mean_us"]),
                     fmt(r["cache_device"]["read_ops"]), fmt(r["cache_device"]["total_mean_us"]),
                     fmt(r.get("server_cpu_us_per_io"))])
    print(table(["8K random reads, QD16", "IOPS", "lat us", "p99 us", "hit ratio", "l2_hits",
                 "disk reads", "disk lat us", "cache reads", "cache lat us", "CPU us/IO"], rows))
    print(f"\nIOPS warm / baseline {fmt(res['iops_warm_over_baseline'], 2)}x; client latency "
          f"baseline / warm {fmt(res['client_latency_baseline_over_warm'], 2)}x; device read latency "
          f"disks {fmt(res['disk_read_total_mean_us_baseline'])} us / cache device "
          f"{fmt(res['cache_read_total_mean_us_warm'])} us = {fmt(res['device_latency_disks_over_cache'], 2)}x")
    pts = warmup["samples"]
    step = max(1, len(pts) // 12)
    print("warm-up (t s: share of the set on the cache device / hit ratio / IOPS): "
          + ", ".join(f"{p['t_s']:.0f}: {p['l2_fraction']:.2f}/{fmt(p['hit_ratio'], 2)}/{fmt(p['iops'])}"
                      for p in pts[::step] + ([pts[-1]] if (len(pts) - 1) % step else [])))
    print(f"sequential pass ended at {warmup['pass_end_s']}s; "
          + (f"{FILL_TARGET:.0%} of the set reached {warmup['fill_target_reached_s_after_pass']}s later"
             if warmup["fill_target_reached_s_after_pass"] is not None else
             f"{warmup['l2_fraction_end']:.2f} of the set after {FEED_WINDOW_S}s of random reads"))
    print(f"l2_size as the pool came back (before the cache device's log was read back): "
          f"{restart['l2_size_at_import']} after the restart, {killed['l2_size_at_import']} after kill -9; "
          f"in the first 10 s the cache device served {restart['arcstats_delta'].get('l2_hits', 0)} and "
          f"{killed['arcstats_delta'].get('l2_hits', 0)} reads")


def write_svg(warmup, cfg, path):
    """Hit ratio and share of the set on the cache device (left axis, 0..1) and IOPS
    (right axis) over the warm-up, as hand-written SVG."""
    pts = [p for p in warmup["samples"] if p["t_s"] is not None]
    w, h, left, right, top, bottom = 760, 380, 60, 70, 40, 70
    pw, ph = w - left - right, h - top - bottom
    tmax = max([p["t_s"] for p in pts] + [1])
    imax = max([p["iops"] or 0 for p in pts] + [1])
    imax = nice_ceiling(imax)
    x = lambda t: left + pw * t / tmax
    y1 = lambda v: top + ph * (1 - v)
    y2 = lambda v: top + ph * (1 - v / imax)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">L2ARC warm-up: 8K random reads '
           f'over {cfg["working_set_bytes"] // MiB} MiB, ARC {ARC_MAX // MiB} MiB, one sim-ssd cache device</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    if warmup.get("pass_end_s"):
        px = x(warmup["pass_end_s"])
        out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + ph}" stroke="#aaa" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{px + 4:.1f}" y="{top + 12}" fill="#666">sequential pass ends</text>')
    for i in range(6):
        v = i / 5
        out.append(f'<line x1="{left}" y1="{y1(v):.1f}" x2="{left + pw}" y2="{y1(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{y1(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
        out.append(f'<text x="{left + pw + 6}" y="{y1(v) + 4:.1f}">{imax * v:,.0f}</text>')
    for i in range(7):
        t = tmax * i / 6
        out.append(f'<text x="{x(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{t:.0f}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 32}" text-anchor="middle">seconds since the warm-up began</text>')
    out.append(f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" text-anchor="middle">ratio (0..1)</text>')
    out.append(f'<text x="{w - 14}" y="{top + ph / 2}" transform="rotate(90 {w - 14} {top + ph / 2})" text-anchor="middle">IOPS</text>')
    series = (("hit ratio (ARC + L2)", "#1f77b4", [(p["t_s"], y1(p["hit_ratio"])) for p in pts if p["hit_ratio"] is not None]),
              ("share of the set on the cache device", "#2ca02c", [(p["t_s"], y1(min(1.0, p["l2_fraction"]))) for p in pts]),
              ("IOPS (right axis)", "#d62728", [(p["t_s"], y2(p["iops"])) for p in pts if p["iops"] is not None]))
    for i, (label, colour, xy) in enumerate(series):
        if xy:
            d = " ".join(f"{x(t):.1f},{yy:.1f}" for t, yy in xy)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{d}"/>')
        lx, ly = left + 215 * i, h - 14
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 20}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 26}" y="{ly}">{label}</text>')
    out.append("</svg>")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def nice_ceiling(v):
    """The smallest 1, 2 or 5 x 10^k at or above v."""
    k = 1
    while True:
        for m in (1, 2, 5):
            if m * k >= v:
                return m * k
        k *= 10
