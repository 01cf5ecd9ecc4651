"""Work per I/O of each build, counted: user-space instructions and system calls per
request, for the new/old CPU goals of a `--compare-old` run.

Theory of operation: per build, one daemon on its own pool (two 2-way mirrors of
sparse files, as the scenarios build) with one volume filled with the same seeded
pseudo-random bytes in every run and for every build, and read back (checked, and the
ARC warm). Copies go one request at a time (nbdcopy --connections=1 --requests=1): a
burst of parallel requests starts runtime threads that exit 10 idle seconds later,
and an exit inside a window costs ~0.5 M instructions. Then two passes of the same
windows (lib/valgrind.py says why windows, rates and slopes):

1. *System calls*: the daemon runs natively; `strace -f -c -p PID` is attached for
   each window (every thread, and any thread started during it) and detached after it.
2. *Instructions*: the daemon is stopped and started again on the same state dir
   under `valgrind --tool=callgrind --instr-atstart=no` (the pool is imported again,
   the volume read once more with instrumentation off); `callgrind_control` counts only
   the windows. Valgrind cannot run a thread that waits in io_uring_enter beside the
   others (it holds valgrind's lock while the kernel waits for requests the others
   would submit), so this pass sets ZILLA_IO_ENGINE=threads; the windows read only
   from the ARC, and no device I/O enters their count. It also sets GLIBC_TUNABLES so
   memcpy and memset never use rep movsb / rep stosb (NO_REP_STRINGS): valgrind counts
   every iteration of those as an instruction, one per byte, and a build that copies a
   block would count as if each byte were an instruction. Before its windows, fio reads at
   the first workload's higher rate for SETTLE_S seconds, so the threads the import
   started are gone; in a full run one idle window (no requests) shows what the daemon
   does on its own.

A window is fio's nbd engine at iodepth 1, `--rate_iops=R`, `--io_size=N x bs` (N = R x
the window's seconds), the same random sequence each time (fio's fixed seed), over a
span no window reads past (a sequential window never wraps). Before each window of a
sequential workload the read-ahead streams are parked (park_streams), so every such
window starts from the same detector state. The rates of a workload (r, 5r for cached
reads) give N and 5N requests in the same time; per I/O is the least-squares slope over
every window of the workload (`pairs` pairs).
"""

import glob
import os
import signal
import subprocess
import time

from . import valgrind as vg
from .daemon import Zilla
from .fio import fio
from .goals import goal
from .packages import ensure_tools
from .proc import BenchError, log, run, write_seeded_file
from .tables import fmt, table

MiB, GiB = 1 << 20, 1 << 30
SETTLE_S = 11       # tokio's blocking threads exit after 10 s idle
PARK_STREAMS = 8    # zfetch_max_streams (default)
REAP_DEFAULT_S = 1  # zfetch_min_sec_reap (default)
PARK_BYTES = 32 * MiB
QD1_COPY = ["--connections=1", "--requests=1"]
# glibc's memcpy/memmove and memset use rep movsb / rep stosb above ~2 KiB, and
# valgrind counts every iteration of a rep-prefixed instruction as one instruction: a
# 128 KiB copy counted 131,000, a 4 KiB memset 4,100, more than all the rest of a read.
# With these thresholds out of reach they run their vector loops at every size, and a
# copy counts the instructions it executes (about one per 16 bytes).
NO_REP_STRINGS = "glibc.cpu.x86_rep_movsb_threshold=0x10000000000:glibc.cpu.x86_rep_stosb_threshold=0x10000000000"
RATE_KEPT = 0.9     # a window whose fio fell below this share of its rate is flagged


class Workload:
    """One kind of request: fio `rw` of `bs` bytes over the first `span` bytes of the
    volume, counted at each rate of `rates` (requests per second)."""

    def __init__(self, key, name, rw, bs, span, rates, syscall_rates=None):
        """`syscall_rates` (default: `rates`) for the strace pass, where every system
        call stops the daemon for strace: at 1,000 4K reads/s it kept 433."""
        self.key, self.name, self.rw, self.bs, self.span, self.rates = key, name, rw, bs, span, rates
        self.rates, self.syscall_rates = tuple(rates), tuple(syscall_rates or rates)

    def describe(self):
        return {"name": self.name, "rw": self.rw, "bs": self.bs, "span_bytes": self.span,
                "rates_iops": list(self.rates), "syscall_rates_iops": list(self.syscall_rates),
                "iodepth": 1}


def settings(quick):
    """Window length, pairs of windows per workload, the settle time, and whether an
    idle window (no requests; what the daemon does on its own) is counted too."""
    return {"window_s": 3 if quick else 5, "pairs": 1 if quick else 2, "settle_s": SETTLE_S,
            "idle_window": not quick}


def valgrind_cmd(outdir):
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=no",
            f"--callgrind-out-file={os.path.join(outdir, 'callgrind.out')}"]


def count_builds(builds, wd, workloads, volume_bytes, quick, config=None):
    """{"config", "builds": {label: record}, "ratios": {workload key: {...}}} for every
    build in `builds` (the first is the new one, the second the old)."""
    ensure_tools(["valgrind", "callgrind_control", "strace", "fio", "nbdcopy"])
    s = settings(quick)
    span_max = max(w.span for w in workloads)
    if span_max > volume_bytes:
        raise BenchError("a workload's span is larger than the counted volume")
    for w in workloads:
        if w.rw == "read" and w.span > volume_bytes - PARK_BYTES:
            raise BenchError(f"{w.name}: a sequential span must leave the volume's last "
                             f"{PARK_BYTES // MiB} MiB for parking read-ahead streams")
    for w in workloads:
        if w.rw == "read" and max(w.rates + w.syscall_rates) * s["window_s"] * w.bs > w.span:
            raise BenchError(f"{w.name}: a window would read past its span")
    fill = os.path.join(wd, "count-fill.img")
    write_seeded_file(fill, volume_bytes, seed=1)
    out = {"config": dict(s, volume_bytes=volume_bytes, fill="seeded pseudo-random bytes (seed 1)",
                          workloads={w.key: w.describe() for w in workloads},
                          timed_work_excluded=list(vg.TIMED_WORK),
                          callgrind_env={"ZILLA_IO_ENGINE": "threads", "GLIBC_TUNABLES": NO_REP_STRINGS},
                          slope="least squares of counted work against requests over the "
                                "windows of a workload (the same length, different rates)",
                          **(config or {})),
           "builds": {}}
    for b in builds:
        out["builds"][b.label] = count_build(b, wd, fill, workloads, volume_bytes, s)
    os.unlink(fill)
    out["ratios"] = ratios(out["builds"], workloads)
    return out


def count_build(build, wd, fill, workloads, volume_bytes, s):
    d = os.path.join(wd, f"count-{build.label}")
    os.makedirs(d, exist_ok=True)
    log(f"{build.label}: counting work per I/O (strace pass, then callgrind pass)")
    z = Zilla(build, d, log_tag="count-native")
    z.create_mirror_pool(d, volume_bytes + GiB)
    z.cli("volume", "create", "-V", str(volume_bytes), "bench/vol")
    uri = z.uri("bench/vol")
    # one request at a time (QD1 nbdcopy): no runtime threads started for a burst that
    # then exit, 10 s later, inside a window
    run(["nbdcopy", "--flush"] + QD1_COPY + [fill, uri])
    r = run(["sh", "-c", f"nbdcopy {' '.join(QD1_COPY)} '{uri}' - | cmp - '{fill}'"], check=False)
    if r.returncode != 0:
        raise BenchError(f"{build.label}: the counted volume does not hold its fill")
    rec = {"git_commit": build.commit, "workloads": {}}
    for w in workloads:
        rec["workloads"][w.key] = {"syscall_windows": windows(
            w, s, lambda fn, tag: strace_window(z.pid, os.path.join(d, f"strace-{tag}.txt"), fn),
            z, d, "strace", rates=w.syscall_rates)}
    z.stop()

    cgdir = os.path.join(d, "callgrind")
    os.makedirs(cgdir, exist_ok=True)
    z = Zilla(build, d, log_tag="count-callgrind", wrapper=valgrind_cmd(cgdir),
              env={"ZILLA_IO_ENGINE": "threads", "GLIBC_TUNABLES": NO_REP_STRINGS})
    up = time.monotonic()
    run(["nbdcopy"] + QD1_COPY + [z.uri("bench/vol"), "null:"], timeout=600)
    # the QD1 warm-up keeps one thread busy: the settle counts from the daemon's start
    settle(z, workloads[0], max(2, round(s["settle_s"] - (time.monotonic() - up))), d, "callgrind")
    counter = lambda fn, tag: callgrind_window(z.pid, cgdir, fn)
    if s["idle_window"]:
        rec["idle"] = counter(lambda: time.sleep(s["window_s"]), "idle")
        rec["idle"]["instructions_per_s"] = round(rec["idle"]["instructions"] / rec["idle"]["window_s"])
    for w in workloads:
        wr = rec["workloads"][w.key]
        park_at = volume_bytes - PARK_BYTES if w.rw == "read" else None
        wr["windows"] = windows(w, s, counter, z, d, "callgrind", park_at=park_at)
        wr.update(per_io(wr))
        log(f"{build.label} {w.name}: {fmt(wr['instructions_per_io'])} instructions, "
            f"{fmt(wr['syscalls_per_io'], 2)} system calls per I/O")
    z.stop()
    return rec


def settle(z, w, seconds, d, tag):
    """QD1 reads at the workload's higher rate for `seconds`: threads that the pool's
    import and the warm-up started and no longer need exit before the windows, not
    inside one."""
    fio(fio_args(z, w, max(w.rates), None) + [f"--runtime={seconds}", "--time_based"],
        d, f"settle-{tag}")


def fio_args(z, w, rate, n):
    a = [f"--name=count-{w.key}", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}",
         f"--rw={w.rw}", f"--bs={w.bs}", "--iodepth=1", "--numjobs=1", f"--size={w.span}",
         f"--rate_iops={rate}", "--randrepeat=1"]
    return a + ([f"--io_size={n * w.bs}"] if n else [])


def windows(w, s, counter, z, d, tag, park_at=None, rates=None):
    """Every window of workload `w`: `pairs` x each rate (`rates`, default the
    workload's), counted by `counter`; with `park_at`, the read-ahead streams are
    parked there before each (park_streams)."""
    out = []
    for p in range(s["pairs"]):
        for rate in rates or w.rates:
            n = int(round(rate * s["window_s"]))
            t = f"{tag}-{w.key}-{rate}-{p}"
            res = {}

            def one():
                res["fio"] = fio(fio_args(z, w, rate, n), d, t)
            if park_at is not None:
                park_streams(z, d, t, park_at)
            rec = counter(one, t)
            if park_at is not None:
                unpark(z)
            f = res["fio"]
            rec.update({"rate_iops": rate, "ios": f["ios"], "fio_iops": f["iops"],
                        "fio_runtime_s": f["runtime_s"],
                        "rate_kept": bool(f["iops"] >= RATE_KEPT * rate)})
            if not rec["rate_kept"]:
                log(f"{t}: fio reached {f['iops']:.0f} of {rate} requests/s (the daemon did not keep up)")
            out.append(rec)
    return out


def park_streams(z, d, tag, park_at):
    """Put the volume's read-ahead detector in the same state before every window of a
    sequential workload. Its zfetch_max_streams (8) slots hold the streams earlier reads
    left (random reads, the last window's stream); one whose next block a window passes
    can take over from the window's own stream, and the slot the window's stream gets
    decides how far each of its reads scans the list. Which streams are left and in
    which slots depends on when slots were replaced (only once idle for
    zfetch_min_sec_reap, 1 s): one probe measured 24.6 k or 33.4 k instructions per 128K
    read from one run to the next, and 0.75 % apart with the slot alone. So, with
    single 4K reads 1 MiB apart in the volume's last PARK_BYTES (no window reads there),
    each a miss: with zfetch_max_streams at 1 and no stream old enough to replace
    (zfetch_min_sec_reap at an hour), one read leaves exactly one stream, in slot 0 (it
    cuts the list, or starts it); with zfetch_max_streams back at 8 and every stream
    replaceable (zfetch_min_sec_reap 0), 7 reads fill slots 1-7; the window's first read
    then replaces the oldest, slot 0, and its reads continue that stream alone.
    `unpark` puts zfetch_min_sec_reap back after the window. A build without these
    tunables (or without read-ahead) ignores the settings."""
    def reads(first, count):
        run(["fio", "--name=park", "--ioengine=nbd", f"--uri={z.uri('bench/vol')}",
             f"--rw=read:{MiB - 4096}", "--bs=4k", "--iodepth=1",
             f"--offset={park_at + first * MiB}", f"--size={count * MiB}",
             f"--io_size={count * 4096}", f"--output={os.path.join(d, f'park-{tag}-{first}.txt')}"])
    tunables(z, zfetch_max_streams=1, zfetch_min_sec_reap=3600)
    reads(0, 1)
    tunables(z, zfetch_max_streams=PARK_STREAMS, zfetch_min_sec_reap=0)
    reads(1, PARK_STREAMS - 1)


def unpark(z):
    """zfetch_min_sec_reap back at its default after a parked window."""
    tunables(z, zfetch_min_sec_reap=REAP_DEFAULT_S)


def tunables(z, **values):
    """Set the daemon's run-time tunables (a build without one ignores it)."""
    for k, v in values.items():
        run([z.build.binary, "--state-dir", z.state, "tunable", "set", f"{k}={v}"], check=False)


def per_io(wr):
    """The slopes of a workload's windows: instructions and system calls per I/O (and
    per I/O of each system call that makes at least 0.01 per I/O)."""
    ins = vg.slope([(x["ios"], x["instructions"]) for x in wr["windows"]])
    sys_ = vg.slope([(x["ios"], x["syscalls"]) for x in wr["syscall_windows"]])
    names = set()
    for x in wr["syscall_windows"]:
        names.update(x["by_call"])
    by = {}
    for n in sorted(names):
        v = vg.slope([(x["ios"], x["by_call"].get(n, 0)) for x in wr["syscall_windows"]])
        if v is not None and abs(v) >= 0.01:
            by[n] = round(v, 3)
    return {"instructions_per_io": round(ins, 1) if ins is not None else None,
            "syscalls_per_io": round(sys_, 3) if sys_ is not None else None,
            "syscalls_per_io_by_call": by,
            "rate_kept": all(x["rate_kept"] for x in wr["windows"] + wr["syscall_windows"])}


def callgrind_control(pid, *args):
    r = run(["callgrind_control"] + list(args) + [str(pid)], check=False, timeout=120)
    text = (r.stdout or "") + (r.stderr or "")
    if r.returncode != 0 or "Error" in text or "OK" not in text:
        raise BenchError(f"callgrind_control {' '.join(args)} {pid}: {text.strip()[-300:]}")


def callgrind_window(pid, outdir, fn):
    """Count `fn()`'s window: instrumentation on, counters zeroed, fn, dump, off.
    Returns {"window_s", "instructions_total", "instructions_timed_work",
    "instructions" (total minus timed work), "dump"}."""
    before = set(glob.glob(os.path.join(outdir, "callgrind.out*")))
    callgrind_control(pid, "--instr=on")
    callgrind_control(pid, "--zero")
    t0 = time.monotonic()
    fn()
    callgrind_control(pid, "--dump")
    t1 = time.monotonic()
    callgrind_control(pid, "--instr=off")
    prof, path = None, None
    deadline = time.time() + 30
    while prof is None:
        new = sorted(set(glob.glob(os.path.join(outdir, "callgrind.out*"))) - before,
                     key=os.path.getmtime)
        if new:
            path = new[-1]
            with open(path) as f:
                text = f.read()
            if "\ntotals:" in text or "\nsummary:" in text:
                prof = vg.parse_callgrind(text)
                break
        if time.time() > deadline:
            raise BenchError(f"no callgrind dump appeared in {outdir}")
        time.sleep(0.2)
    total, timed = prof.total("Ir"), prof.cost_under(vg.TIMED_WORK)
    return {"window_s": round(t1 - t0, 3), "instructions_total": total,
            "instructions_timed_work": timed, "instructions": total - timed,
            "dump": os.path.basename(path)}


def strace_window(pid, path, fn):
    """`strace -f -c` attached to every thread of `pid` for `fn()`'s window."""
    p = subprocess.Popen(["strace", "-f", "-c", "-o", path, "-p", str(pid)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()          # "strace: Process PID attached with N threads"
    if "attached" not in line:
        p.kill()
        raise BenchError(f"strace could not attach to {pid}: {line.strip()}")
    t0 = time.monotonic()
    try:
        fn()
    finally:
        t1 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    with open(path) as f:
        s = vg.parse_strace_summary(f.read())
    return {"window_s": round(t1 - t0, 3), "syscalls": s["total"], "by_call": s["calls"]}


def ratios(recs, workloads):
    """new / old per workload, when both builds were counted."""
    labels = list(recs)
    if len(labels) < 2:
        return {}
    new, old = recs[labels[0]]["workloads"], recs[labels[1]]["workloads"]
    return {w.key: {"instructions_per_io": ratio4(new[w.key]["instructions_per_io"],
                                                  old[w.key]["instructions_per_io"]),
                    "syscalls_per_io": ratio4(new[w.key]["syscalls_per_io"],
                                              old[w.key]["syscalls_per_io"])}
            for w in workloads}


def ratio4(a, b):
    """a / b to 4 places (a same-binary comparison is read to 0.1 %), None if either
    is missing."""
    return None if a is None or not b else round(a / b, 4)


def goal_for(counts, w, rev, wall_ratio=None):
    """The goal `new / old <= 1.0` for workload `w`, decided by instructions per I/O;
    the wall-clock CPU ratio of the scenario's own runs and both builds' counts stand
    beside it in the record."""
    labels = list(counts["builds"])
    new = counts["builds"][labels[0]]["workloads"][w.key]
    old = counts["builds"][labels[1]]["workloads"][w.key]
    g = goal(f"{w.name} daemon CPU per I/O, new / old ({rev}), by user-space instructions per I/O",
             "<=", 1.0, counts["ratios"][w.key]["instructions_per_io"])
    g.update({"instructions_per_io": {"new": new["instructions_per_io"], "old": old["instructions_per_io"]},
              "syscalls_per_io": {"new": new["syscalls_per_io"], "old": old["syscalls_per_io"]},
              "syscalls_ratio": counts["ratios"][w.key]["syscalls_per_io"],
              "wall_cpu_ratio": wall_ratio})
    return g


def print_counts(counts, workloads, wall=None):
    """One row per workload: both builds' instructions and system calls per I/O, the
    ratios, and the wall-clock CPU ratio of the scenario's runs (`wall`: {key: ratio})."""
    labels = list(counts["builds"])
    rows = []
    for w in workloads:
        n = counts["builds"][labels[0]]["workloads"][w.key]
        o = counts["builds"][labels[1]]["workloads"][w.key] if len(labels) > 1 else None
        q = counts["ratios"].get(w.key, {})
        rows.append([w.name, fmt(n["instructions_per_io"]), fmt(o and o["instructions_per_io"]),
                     fmt(q.get("instructions_per_io"), 3), fmt(n["syscalls_per_io"], 2),
                     fmt(o and o["syscalls_per_io"], 2), fmt(q.get("syscalls_per_io"), 3),
                     fmt((wall or {}).get(w.key), 3)])
    print(table(["work per I/O (QD1, fixed rate)", "instr new", "instr old", "new/old",
                 "syscalls new", "syscalls old", "new/old", "wall CPU new/old"], rows))
