"""Scenario iscsi-vs-tgt: Zilla's iSCSI target against tgtd, and against Zilla over NBD.

Theory of operation: one Zilla daemon (`serve --iscsi 127.0.0.1:PORT`, a free port;
zfs_arc_max three times the volume size, so every block read is an ARC hit) holds a
pool of two 2-way mirrors of sparse files with two volumes: bench/vol for the reads and
bench/wvol (wce=on) for the writes, both filled through NBD with the same random bytes
and checked with a read back (cmp). tgtd runs in the foreground with its own management
socket and portal (lib/daemon.Tgtd) with LUN 1 and LUN 2 on copies of the same random
file, rdwr backing store, write cache on (tgt's default); the copies sit in the workdir,
next to Zilla's pool files (the same file system, named in the output; not tmpfs), and
are read through the page cache before each read test. The LU's block size comes from
READ CAPACITY(16); each target's contents are compared with the random file through
iSCSI (`qemu-img compare`) before anything is timed.

Three servers take turns, their order rotated every rep: Zilla over iSCSI (`zilla`),
the same daemon and volumes over NBD (`zilla_nbd`), and tgtd (`tgtd`). Timed read tests
(cache hits: 8K random with 100 outstanding, 4K random at QD1 and QD32, 128K sequential
at QD32) use iscsi-perf over iSCSI (one session, READ16, random LBAs at the LU's block
size; fio has no libiscsi engine here) and fio's nbd engine over NBD with the same
alignment (`--ba` = the LU block size). Because those are two different clients, 4K
sequential reads at QD1 and QD32 also run with `qemu-img bench` over iscsi:// and
nbd:// alike (qemu-img's iscsi driver comes with qemu-block-extra, which Debian 12 pins
to its qemu 7.2). Before each read test every server's data is read once (Zilla:
nbdcopy of the volume; tgtd: its file through the page cache). The write tests are
`qemu-img bench -w -t none -s 4k --flush-interval 1000` at QD1 and QD32 (a SYNCHRONIZE
CACHE / NBD FLUSH every 1,000 writes, a 0xa5 pattern) on the wce=on volume (iscsi:// and
nbd://) and tgt's LUN 2; after each the server's write-back is left to finish (wait for
it to go idle). Each run reads the serving process's CPU (utime + stime from
/proc/PID/stat) before and after: CPU per I/O, and IOPS per CPU = 1 / that. Latency:
fio's for NBD; in flight / IOPS (Little's law) for iscsi-perf and qemu-img bench, which
report none. Every client's output is kept in the workdir (BENCH_KEEP=1).

Goals: 8K cache-hit random read at 100 outstanding, Zilla / tgtd IOPS >= 1.5 and IOPS
per CPU >= 2.0; Zilla over iSCSI / Zilla over NBD >= 0.85 on every read and write test
one client runs over both protocols (qemu-img bench: 4K and 128K sequential reads, 4K
writes). The iscsi-perf / fio rows show that ratio too, but two different clients share
the CPUs with the server there, so it is not held to the goal.
A build that does not serve iSCSI (no `--iscsi` flag, nothing on the port, login or
READ CAPACITY failing, or other bytes read back) still gets tgtd's and its NBD figures;
its iSCSI goals are listed as not measured (measured null, met false) with the reason
in `zilla_iscsi` and in the log.
"""

import os
import shutil
import time

from lib import iscsi
from lib.admin import arc_delta
from lib.daemon import Tgtd, Zilla
from lib.fio import fio
from lib.goals import goal
from lib.machine import loadavg, wait_idle
from lib.packages import ensure_packages, ensure_tools, package_versions
from lib.proc import BenchError, log, make_workdir, run, write_random_file
from lib.tables import fmt, median_of, ratio, table

NAME = "iscsi-vs-tgt"
DESCRIPTION = ("iscsi-perf cache-hit reads (8K QD100, 4K QD1/QD32, 128K seq QD32) and qemu-img "
               "4K writes with a flush every 1000: Zilla iSCSI vs tgtd, and vs Zilla over NBD")
MiB, GiB = 1 << 20, 1 << 30
# (label, rw, bytes per I/O, outstanding, client): "perf" is iscsi-perf over iSCSI and
# fio's nbd engine over NBD (timed runs); "qemu" is qemu-img bench over iscsi:// and
# nbd:// alike (a count of requests, sequential), the same client on both protocols
READ_TESTS = [("8K randread QD100", "randread", 8192, 100, "perf"),
              ("4K randread QD1", "randread", 4096, 1, "perf"),
              ("4K randread QD32", "randread", 4096, 32, "perf"),
              ("128K seqread QD32", "read", 131072, 32, "perf"),
              ("4K seqread QD1, qemu-img", "read", 4096, 1, "qemu"),
              ("4K seqread QD32, qemu-img", "read", 4096, 32, "qemu"),
              ("128K seqread QD32, qemu-img", "read", 131072, 32, "qemu")]
WRITE_TESTS = [("4K write QD1, flush every 1000, wce=on", "write", 4096, 1, "qemu"),
               ("4K write QD32, flush every 1000, wce=on", "write", 4096, 32, "qemu")]
TESTS = READ_TESTS + WRITE_TESTS
FLUSH_INTERVAL = 1000
SEED_TEST = "8K randread QD100"
FIGURES = ("iops", "MBps", "lat_mean_us", "lat_p99_us", "server_cpu_us_per_io", "server_cores")
SERVERS = ("zilla", "zilla_nbd", "tgtd")
PACKAGES = ("tgt", "libiscsi-bin", "qemu-utils", "qemu-block-extra", "fio", "libnbd-bin")
CLIENTS = {"perf": "iscsi-perf (iSCSI), fio nbd engine (NBD)", "qemu": "qemu-img bench"}


def settings(quick):
    """Sizes and lengths; qemu-img bench runs a count of requests, not a time: the
    counts are a few seconds' worth at the rates seen on 2 cores."""
    return {"volume_bytes": 512 * MiB if quick else 1 * GiB, "runtime_s": 5 if quick else 10,
            "reps": 1 if quick else 3,
            "qemu_count": {1: 20_000 if quick else 60_000, 32: 50_000 if quick else 200_000},
            "qemu_count_min": 20_000 if quick else 40_000}


def fs_type(path):
    """The type of the file system holding `path` (/proc/self/mounts, longest mount
    point that is a prefix), or None."""
    path = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        return None
    return kind


def run_scenario(ctx):
    ensure_tools(["fio", "nbdcopy", "qemu-img", "tgtd", "tgtadm", "iscsi-perf",
                  "iscsi-readcapacity16"])
    if shutil.which("dpkg-query"):
        ensure_packages(["qemu-block-extra"], "qemu-img needs its iscsi:// driver")
    if not qemu_img_has_iscsi():
        raise BenchError("qemu-img has no iscsi driver (`qemu-img --help` does not list it): "
                         "install qemu-block-extra of the same version as qemu-utils")
    if ctx.old is not None:
        log("iscsi-vs-tgt compares this tree's build with tgtd; the old build is not run")
    cfg = settings(ctx.quick)
    size = cfg["volume_bytes"]
    wd = make_workdir()
    log(f"workdir {wd}; volumes {size // MiB} MiB; {cfg['reps']} rep(s) x {cfg['runtime_s']}s "
        f"per timed read test; qemu-img bench counts {cfg['qemu_count']} (by depth)")
    backing = (f"rdwr backing store on files in {wd} ({fs_type(wd) or 'unknown'} file system), "
               "the file system of Zilla's pool files (not tmpfs); read through the page cache "
               "before each read test")
    log(f"tgtd: {backing}")
    rand = os.path.join(wd, "rand.img")
    write_random_file(rand, size)

    tgt = Tgtd(wd)
    for lun, name in ((1, "tgt-read.img"), (2, "tgt-write.img")):
        path = os.path.join(wd, name)
        shutil.copyfile(rand, path)
        tgt.add_lun(lun, path)
    tgt_lu = iscsi.probe(tgt.url(1), tgt.port)
    if not tgt_lu["served"]:
        raise BenchError(f"tgtd does not serve its LUN 1: {tgt_lu['reason']}; see {tgt.logpath}")
    check_contents("tgtd", tgt.url(1), rand, fatal=True)

    arc_max = 3 * size + 256 * MiB
    z = Zilla(ctx.new, wd, tunables=[f"zfs_arc_max={arc_max}"])
    make_pool(z, wd, size)
    fill = {v: fill_volume(z, v, rand) for v in ("bench/vol", "bench/wvol")}
    zilla_lu = zilla_iscsi(z, rand, size)

    block = zilla_lu["block_bytes"] or tgt_lu["block_bytes"]
    servers = [tgt_server(tgt, tgt_lu["block_bytes"]), nbd_server(z, block)]
    if zilla_lu["served"]:
        servers.insert(0, iscsi_server(z, zilla_lu["block_bytes"]))
    config = {**cfg, "volblocksize": "16K (default)", "zfs_arc_max": arc_max,
              "pool": "mirror d0 d1 mirror d2 d3 (sparse files)",
              "zilla_volumes": {"reads": "bench/vol", "writes": "bench/wvol (wce=on)"},
              "tgtd": "tgtd -f, own control socket and portal; LUN 1 (reads) and LUN 2 (writes) "
                      "on copies of the random file; tgt's default write cache on",
              "tgtd_backing": backing,
              "lu_block_bytes": {"zilla": zilla_lu["block_bytes"], "tgtd": tgt_lu["block_bytes"]},
              "read_client": {"iscsi": "iscsi-perf (one session, READ16, random LBAs at the LU "
                                       "block size; fio has no libiscsi engine here)",
                              "nbd": f"fio nbd engine, --ba={block} (the same alignment)",
                              "qemu-img rows": "qemu-img bench -f raw -t none (sequential, "
                                               "iscsi:// and nbd://: one client for both)"},
              "write_client": "qemu-img bench -f raw -w -t none -s 4096 "
                              f"--flush-interval={FLUSH_INTERVAL} --pattern=0xa5 (qemu-img's "
                              "iscsi driver is qemu-block-extra's; Debian 12: qemu 7.2)",
              "latency": "fio's for NBD; in flight / IOPS for iscsi-perf and qemu-img bench",
              "order": "per test the servers back to back, the order rotating every rep",
              "warmup": "before each read test: Zilla's volume read once (nbdcopy to null:), "
                        "tgtd's file read through the page cache",
              "packages": package_versions(PACKAGES)}
    samples = measure(servers, tgt, z, cfg, wd)
    results = summarise(samples, cfg["reps"])
    print_tables(results, cfg["reps"], zilla_lu)
    tgt.stop()
    z.stop()
    return {"config": config, "fill": fill, "zilla_iscsi": zilla_lu, "tgtd_lu": tgt_lu,
            "results": results, "goals": goals(results)}


def make_pool(z, wd, size):
    """Two 2-way mirrors of sparse files with room for both volumes plus dirty data."""
    z.create_mirror_pool(wd, 2 * size + 5 * GiB)
    z.cli("volume", "create", "-V", str(size), "bench/vol")
    z.cli("volume", "create", "-V", str(size), "-o", "wce=on", "bench/wvol")


def fill_volume(z, volume, rand):
    """Copy the random bytes in through NBD, read them once, check they read back."""
    uri = z.uri(volume)
    t0 = time.time()
    run(["nbdcopy", "--flush", rand, uri])
    t1 = time.time()
    r = run(["sh", "-c", f"nbdcopy '{uri}' - | cmp - '{rand}'"], check=False)
    if r.returncode != 0:
        raise BenchError(f"{volume} does not hold the fill data: {r.stdout}{r.stderr}")
    log(f"{volume}: filled in {t1 - t0:.1f}s, read back and compared in {time.time() - t1:.1f}s")
    return {"fill_s": round(t1 - t0, 2), "read_back_s": round(time.time() - t1, 2)}


def check_contents(label, url, rand, fatal):
    """Whether the LU at `url` holds the random file's bytes (qemu-img compare)."""
    r = run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", url, rand], check=False,
            timeout=600)
    if r.returncode == 0:
        return True
    said = (r.stderr or r.stdout or "").strip().splitlines()
    msg = f"{label} over iSCSI does not read back the fill data ({r.returncode}): {said[-1] if said else ''}"
    if fatal:
        raise BenchError(msg)
    log(msg)
    return False


def zilla_iscsi(z, rand, size):
    """Whether this build serves the volumes over iSCSI, and the LU's geometry; every
    way it may not is a reason, logged, not an error."""
    url = z.iscsi_url("bench/vol")
    if url is None:
        lu = {"served": False, "block_bytes": None, "size_bytes": None,
              "reason": "this build's `serve` has no --iscsi flag"}
    else:
        lu = iscsi.probe(url, z.iscsi_port)
        for vol in ("bench/wvol",):
            if lu["served"]:
                w = iscsi.probe(z.iscsi_url(vol), z.iscsi_port, wait_s=1)
                if not w["served"]:
                    lu.update(served=False, reason=f"{vol}: {w['reason']}")
        if lu["served"] and lu["size_bytes"] != size:
            lu.update(served=False, reason=f"the LU has {lu['size_bytes']} bytes, the volume {size}")
        if lu["served"] and not check_contents("zilla", url, rand, fatal=False):
            lu.update(served=False, reason="the LU does not read back the volume's bytes")
    lu["url"] = url
    if lu["served"]:
        log(f"zilla serves iSCSI at {url} ({lu['block_bytes']}-byte blocks)")
    else:
        log(f"zilla does not serve iSCSI ({lu['reason']}): its iSCSI figures and goals are "
            "not measured; tgtd and Zilla over NBD run as usual")
    return lu


class Server:
    """One side of a comparison: how to read and write it, and whose CPU to count."""

    def __init__(self, label, pid, kind, read_url, write_url, block_bytes, warm, zilla=None):
        self.label, self.pid, self.kind = label, pid, kind
        self.read_url, self.write_url, self.block_bytes = read_url, write_url, block_bytes
        self.warm, self.zilla = warm, zilla


def iscsi_server(z, block):
    return Server("zilla", z.pid, "iscsi", z.iscsi_url("bench/vol"), z.iscsi_url("bench/wvol"),
                  block, lambda: run(["nbdcopy", z.uri("bench/vol"), "null:"]), z)


def nbd_server(z, block):
    return Server("zilla_nbd", z.pid, "nbd", z.uri("bench/vol"), z.uri("bench/wvol"), block,
                  lambda: run(["nbdcopy", z.uri("bench/vol"), "null:"]), z)


def tgt_server(tgt, block):
    def warm():
        with open(tgt.luns[1], "rb") as f:
            while f.read(8 * MiB):
                pass
    return Server("tgtd", tgt.pid, "iscsi", tgt.url(1), tgt.url(2), block, warm)


def measure(servers, tgt, z, cfg, wd):
    """{test label: {server label: [sample per rep]}}, servers rotated per rep."""
    tests = TESTS
    samples = {t[0]: {s: [] for s in SERVERS} for t in tests}
    reps = cfg["reps"]
    for rep in range(reps):
        k = rep % len(servers)
        order = servers[k:] + servers[:k]
        for test in tests:
            label, rw = test[0], test[1]
            if rw != "write":
                for s in order:
                    s.warm()
            for s in order:
                smp = one_test(s, test, cfg, wd, rep)
                if smp is None:
                    continue
                samples[label][s.label].append(smp)
                arc = (smp.get("arc") or {}).get("hit_ratio")
                log(f"rep {rep + 1}/{reps} {label:40} {s.label:9}: {smp['iops']:>10,.0f} IOPS "
                    f"{smp['MBps']:>8.1f} MB/s  lat {smp['lat_mean_us']} us  "
                    f"{smp['server_cpu_us_per_io']} CPU-us/IO  load {smp['loadavg_before'][0]}"
                    + (f"  ARC hits {arc:.1%}" if arc is not None and rw != "write" else ""))
                if rw == "write":
                    wait_idle(s.pid)
    return samples


def one_test(s, test, cfg, wd, rep):
    label, rw, io_bytes, depth, client = test
    tag = f"{s.label}-{rw}-{io_bytes}-qd{depth}-{client}-{rep}"
    la = loadavg()
    arc0 = s.zilla.admin.arc_counters() if s.zilla else None
    dev0 = s.zilla.admin.device_bytes("bench") if s.zilla else None
    try:
        if client == "qemu":
            write = rw == "write"
            # the same bytes as a 4K run, at least `qemu_count_min` requests (bench wraps
            # at the end of the image)
            count = max(cfg["qemu_count"][depth] * 4096 // io_bytes, cfg["qemu_count_min"])
            smp = iscsi.qemu_img_bench(s.write_url if write else s.read_url,
                                       count, io_bytes, depth,
                                       FLUSH_INTERVAL if write else 0, s.pid, tag, wd, write=write)
        elif s.kind == "iscsi":
            smp = iscsi.iscsi_perf(s.read_url, s.block_bytes, io_bytes, depth, cfg["runtime_s"],
                                   rw == "randread", s.pid, tag, wd)
        else:
            smp = fio([f"--name={s.label}", "--ioengine=nbd", f"--uri={s.read_url}", f"--rw={rw}",
                       f"--bs={io_bytes}", f"--ba={s.block_bytes}", f"--iodepth={depth}",
                       "--numjobs=1", "--norandommap", "--randrepeat=0",
                       f"--size={cfg['volume_bytes']}", f"--runtime={cfg['runtime_s']}",
                       "--time_based", "--group_reporting"], wd, tag, cpu_pid=s.pid)
            smp["client"] = "fio nbd"
    except BenchError as e:
        if s.label != "zilla":
            raise
        # the target under construction failing a run must not cost tgtd's figures
        log(f"rep {rep + 1} {label}: zilla over iSCSI failed: {e}")
        return None
    smp["loadavg_before"] = la
    smp["rep"] = rep
    if s.zilla:
        smp["arc"] = arc_delta(arc0, s.zilla.admin.arc_counters())
        dev1 = s.zilla.admin.device_bytes("bench")
        smp["device_bytes_read"] = dev1["read"] - dev0["read"]
        smp["device_bytes_written"] = dev1["write"] - dev0["write"]
    return smp


def iops_per_cpu(cpu_us_per_io):
    """I/Os per CPU-second from CPU microseconds per I/O."""
    return round(1e6 / cpu_us_per_io, 1) if cpu_us_per_io else None


def summarise(samples, reps):
    """Per test: each server's medians, and the ratios the goals read."""
    results = []
    for label, rw, io_bytes, depth, client in TESTS:
        per = samples[label]
        med = {s: {k: median_of(per.get(s, []), k) for k in FIGURES} for s in SERVERS}
        for s in SERVERS:
            med[s]["iops_per_cpu_s"] = iops_per_cpu(med[s]["server_cpu_us_per_io"])
            med[s]["reps_measured"] = len(per.get(s, []))
        z, n, t = med["zilla"], med["zilla_nbd"], med["tgtd"]
        r = {"test": label, "rw": rw, "bytes_per_io": io_bytes, "outstanding": depth,
             "client": CLIENTS[client], "reps": reps, "samples": per}
        r.update(med)
        r["ratio_zilla_over_tgtd"] = {"iops": ratio(z["iops"], t["iops"]),
                                      "server_cpu_us_per_io": ratio(z["server_cpu_us_per_io"],
                                                                    t["server_cpu_us_per_io"]),
                                      "iops_per_cpu": ratio(z["iops_per_cpu_s"], t["iops_per_cpu_s"])}
        r["ratio_iscsi_over_nbd"] = {"iops": ratio(z["iops"], n["iops"]),
                                     "server_cpu_us_per_io": ratio(z["server_cpu_us_per_io"],
                                                                   n["server_cpu_us_per_io"])}
        results.append(r)
    return results


def print_tables(results, reps, zilla_lu):
    rows = []
    for r in results:
        z, n, t = r["zilla"], r["zilla_nbd"], r["tgtd"]
        q, w = r["ratio_zilla_over_tgtd"], r["ratio_iscsi_over_nbd"]
        rows.append([r["test"], fmt(z["iops"]), fmt(t["iops"]), fmt(q["iops"], 2),
                     fmt(n["iops"]), fmt(w["iops"], 2),
                     fmt(z["server_cpu_us_per_io"], 2), fmt(t["server_cpu_us_per_io"], 2),
                     fmt(n["server_cpu_us_per_io"], 2), fmt(q["iops_per_cpu"], 2),
                     f"{fmt(z['lat_mean_us'])}/{fmt(t['lat_mean_us'])}/{fmt(n['lat_mean_us'])}"])
    print(table([f"test (median of {reps})", "zilla iSCSI IOPS", "tgtd IOPS", "zilla/tgtd",
                 "zilla NBD IOPS", "iSCSI/NBD", "zilla iSCSI CPU us/IO", "tgtd CPU us/IO",
                 "zilla NBD CPU us/IO", "IOPS/CPU zilla/tgtd", "lat mean us z/t/nbd"], rows))
    if not zilla_lu["served"]:
        print(f"zilla iSCSI: not measured ({zilla_lu['reason']})")


def goals(results):
    by = {r["test"]: r for r in results}
    seed = by[SEED_TEST]
    g = [goal("8K cache-hit random read at 100 outstanding, IOPS, Zilla iSCSI / tgtd", ">=", 1.5,
              seed["ratio_zilla_over_tgtd"]["iops"]),
         goal("8K cache-hit random read at 100 outstanding, IOPS per target CPU, Zilla iSCSI / tgtd",
              ">=", 2.0, seed["ratio_zilla_over_tgtd"]["iops_per_cpu"])]
    # iSCSI against NBD only where one client speaks both (qemu-img): iscsi-perf and fio
    # differ in their own cost per I/O, which the shared CPUs charge to the server's
    # rate; those rows are shown, not held to the goal
    g += [goal(f"{label} IOPS, Zilla iSCSI / Zilla NBD", ">=", 0.85,
               by[label]["ratio_iscsi_over_nbd"]["iops"]) for label, *_, client in TESTS if client == "qemu"]
    return g


def qemu_img_has_iscsi():
    """Whether qemu-img lists `iscsi` among its formats (qemu-block-extra's module)."""
    r = run(["qemu-img", "--help"], check=False)
    formats = [l for l in (r.stdout or "").splitlines() if l.startswith("Supported formats:")]
    return bool(formats) and "iscsi" in formats[0].split()
