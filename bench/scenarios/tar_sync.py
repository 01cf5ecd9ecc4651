"""Scenario tar-sync: extracting many small files onto a synchronously mounted ext4.

Theory of operation: like the NFS clients of seed 000 (each file create is a
synchronous operation), ext4 is mounted `-o sync,dirsync` on a Zilla volume reached
through nbdfuse (the volume as a file) and a loop device, so every create, write and
directory change ends in an NBD FLUSH. A tarball of small files is generated
reproducibly (seeded sizes 1 byte .. 8 KiB and contents, 100 files per directory,
fixed mtimes): 4,300 files with --quick, 43,000 in full. The same tarball is
extracted (`tar -xf`, timed, then `sync`) onto a fresh file system on the pool without
and with a sim-ssd log mirror (two sim-hdd mirrors each, as in the slog scenario), in
one run. Without the log one file costs several txg syncs; a --quick run stops that
side after `NOLOG_LIMIT_S` and reports its rate (files per second) over the part it
did, which is what the ratio compares. Afterwards the files are checked against the
tarball (`tar -d`).

Goal (seed 000): with the log mirror, at least 10x faster.

Also reported, not part of the goal: the *client floor*, the same extraction through
nbdfuse and loop onto `nbdkit memory` (no storage, a free flush): what ext4, the loop
device, FUSE and nbdfuse cost per file whatever the server does.
"""

import contextlib
import io
import os
import random
import subprocess
import tarfile
import time

from lib.daemon import Zilla
from lib.goals import goal
from lib.machine import loadavg, wait_idle
from lib.packages import ensure_tools
from lib.proc import BenchError, log, make_memdir, make_workdir, run
from lib.syncio import ZilDelta
from lib.tables import fmt, ratio, table

NAME = "tar-sync"
DESCRIPTION = ("tar -x of small files onto ext4 -o sync,dirsync (nbdfuse + loop): "
               "two sim-hdd mirrors without vs with a sim-ssd log mirror")
MiB, GiB = 1 << 20, 1 << 30
# Each log SSD (sparse, in /dev/shm). A freed log block is reusable only after its txg
# syncs and two more pass (deferred frees): with the 5 s txg timeout that is ~20 s of
# log writes, and this extraction writes ~19 MB/s of lwbs (~400 MB held). At 512 MiB
# the log class filled and ~500 lwbs per quick run spilled to the HDDs (~10 ms each:
# zil_lwb_slog_full_count); seed 000's Logzillas are 18 GB.
LOG_DEVICE_BYTES = 2 * GiB
NOLOG_LIMIT_S = 90


def run_scenario(ctx):
    ensure_tools(["nbdfuse", "nbdkit", "mkfs.ext4", "losetup", "tar"])
    nfiles = 4300 if ctx.quick else 43000
    vol = 2 * GiB
    wd = make_workdir()
    tarball = os.path.join(wd, "small.tar")
    total_bytes = make_tarball(tarball, nfiles)
    log(f"workdir {wd}; {nfiles} files ({total_bytes / MiB:.1f} MiB) in {tarball}")
    z = Zilla(ctx.new, wd)
    results = {}
    for pool in ("nolog", "slog"):
        make_pool(z, wd, pool, vol)
        limit = NOLOG_LIMIT_S if (ctx.quick and pool == "nolog") else None
        results[pool] = extract(z, wd, pool, tarball, nfiles, limit)
    z.stop()
    floor = extract_floor(wd, tarball, nfiles, vol)
    a, b = results["nolog"], results["slog"]
    speedup = ratio(b["files_per_s"], a["files_per_s"])
    print(table(["tar -x, ext4 -o sync,dirsync", "files", "seconds", "files/s", "flushes (commits)",
                 "itxs/lwb"],
                [[p, fmt(r["files_done"]), fmt(r["seconds"]), fmt(r["files_per_s"]),
                  fmt(r["zil"]["commits"]), fmt(r["zil"]["itxs_per_lwb"], 2)] for p, r in results.items()]))
    print(f"\nwith the log mirror: {fmt(speedup, 2)}x the files per second")
    print(f"client floor (the same extraction on nbdkit memory: no storage, flush free): "
          f"{floor['seconds']} s, {floor['ms_per_file']} ms per file; the goal needs the log "
          f"mirror at <= {round(1000 / (a['files_per_s'] * 10), 2) if a['files_per_s'] else '?'} ms per file, "
          f"it took {round(1000 / b['files_per_s'], 2) if b['files_per_s'] else '?'}")
    config = {"files": nfiles, "tar_bytes": total_bytes, "volume_bytes": vol,
              "mount": "ext4 -o sync,dirsync on loop on nbdfuse (unix socket)",
              "nolog_time_limit_s": NOLOG_LIMIT_S if ctx.quick else None,
              "pools": {"nolog": "mirror sim-hdd sim-hdd mirror sim-hdd sim-hdd",
                        "slog": "the same + log mirror sim-ssd sim-ssd"}}
    return {"config": config, "results": results, "client_floor_nbdkit_memory": floor,
            "goals": [goal("tar -x files/s on ext4 -o sync, log mirror / no log", ">=", 10, speedup)]}


def extract_floor(wd, tarball, nfiles, vol):
    """The extraction onto nbdkit's memory plugin over a unix socket, timed like
    `extract` (tar -xf, then sync)."""
    sock = os.path.join(wd, "floor.sock")
    kit = subprocess.Popen(["nbdkit", "-f", "-U", sock, "memory", str(vol)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        with sync_ext4(wd, "floor", f"nbd+unix:///?socket={sock}") as mnt:
            t0 = time.time()
            run(["tar", "-xf", tarball, "-C", mnt])
            run(["sync", "-f", mnt])
            secs = time.time() - t0
        log(f"client floor (nbdkit memory): {nfiles} files in {secs:.1f}s")
        return {"seconds": round(secs, 2), "ms_per_file": round(secs * 1000 / nfiles, 3)}
    finally:
        kit.terminate()
        kit.wait(timeout=30)


@contextlib.contextmanager
def sync_ext4(wd, tag, uri):
    """A fresh ext4 mounted -o sync,dirsync on a loop device over nbdfuse's view of the
    NBD export `uri`; yields the mount point, and takes it all down afterwards."""
    fuse, mnt = os.path.join(wd, f"fuse-{tag}"), os.path.join(wd, f"mnt-{tag}")
    os.makedirs(fuse)
    os.makedirs(mnt)
    fuse_proc = subprocess.Popen(["nbdfuse", fuse, uri], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    loop = None
    try:
        for _ in range(100):
            if os.path.exists(os.path.join(fuse, "nbd")):
                break
            time.sleep(0.1)
        else:
            raise BenchError(f"nbdfuse did not expose {fuse}/nbd")
        loop = run(["losetup", "-f", "--show", os.path.join(fuse, "nbd")]).stdout.strip()
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop])
        run(["mount", "-o", "sync,dirsync", loop, mnt])
        yield mnt
    finally:
        run(["umount", mnt], check=False)
        if loop:
            run(["losetup", "-d", loop], check=False)
        run(["fusermount3", "-u", fuse], check=False)
        fuse_proc.wait(timeout=30)


def make_tarball(path, nfiles):
    """Seeded: the same bytes every run (sizes 1..8192, 100 files per directory)."""
    rnd = random.Random(43000)
    total = 0
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for d in range((nfiles + 99) // 100):
            ti = tarfile.TarInfo(f"src/d{d:04d}")
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 1_000_000_000
            tf.addfile(ti)
        for i in range(nfiles):
            n = rnd.randint(1, 8192)
            data = rnd.randbytes(n)
            ti = tarfile.TarInfo(f"src/d{i // 100:04d}/f{i:05d}.c")
            ti.size, ti.mode, ti.mtime = n, 0o644, 1_000_000_000
            tf.addfile(ti, io.BytesIO(data))
            total += n
    return total


def make_pool(z, wd, name, vol):
    d = []
    for i in range(4):
        p = os.path.join(wd, f"{name}-d{i}.img")
        with open(p, "wb") as f:
            f.truncate(vol + 2 * GiB)
        d.append("sim-hdd:" + p)
    args = ["pool", "create", name, "mirror", d[0], d[1], "mirror", d[2], d[3]]
    if name == "slog":
        logs = []
        md = make_memdir(need_bytes=2 * LOG_DEVICE_BYTES)  # the log SSDs' bytes in memory (lib.proc.make_memdir)
        for i in range(2):
            p = os.path.join(md, f"{name}-log{i}.img")
            with open(p, "wb") as f:
                f.truncate(LOG_DEVICE_BYTES)
            logs.append("sim-ssd:" + p)
        args += ["log", "mirror"] + logs
    z.cli(*args)
    z.cli("volume", "create", "-s", "-V", str(vol), f"{name}/fs")


def extract(z, wd, pool, tarball, nfiles, limit_s):
    with sync_ext4(wd, pool, f"nbd+unix:///{pool}/fs?socket={z.state}/nbd.sock") as mnt:
        wait_idle(z.pid)
        la = loadavg()
        with ZilDelta(z) as zd:
            t0 = time.time()
            p = subprocess.Popen(["tar", "-xf", tarball, "-C", mnt])
            try:
                p.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            run(["sync", "-f", mnt])
            secs = time.time() - t0
        done = int(run(["sh", "-c", f"find '{mnt}/src' -type f | wc -l"]).stdout.strip() or 0)
        complete = done == nfiles
        if complete:
            r = run(["tar", "-df", tarball, "-C", mnt], check=False)
            if r.returncode != 0:
                raise BenchError(f"{pool}: extracted files differ from the tarball: {r.stdout[-300:]}")
    res = {"files_done": done, "complete": complete, "verified": complete,
           "seconds": round(secs, 2), "files_per_s": round(done / secs, 2) if secs else None,
           "zil": zd.summary(), "loadavg_before": la}
    log(f"{pool}: {done} files in {secs:.1f}s ({res['files_per_s']} files/s)"
        f"{'' if complete else ' (stopped at the time limit)'}; commits {res['zil']['commits']}")
    return res
