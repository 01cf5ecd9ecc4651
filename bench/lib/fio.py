"""fio runs and what is sampled while they run.

Theory of operation: `fio` runs one fio command with JSON output and boils it down to
one summary (I/Os, IOPS, MB/s, mean and p99 latency, fio's own user and system CPU, and
the server's CPU per I/O when given its pid; with machine_cpu, also what the machine's
CPUs did over the run: steal and idle from /proc/stat). `QueueSampler` polls the
leaves' active I/O counts through the admin API while a test runs (its sample list is
bounded by the run time / period): the mean number of I/Os in flight per leaf says
whether the devices are kept busy.
"""

import json
import os
import statistics
import threading
import time

from .machine import cpu_seconds, machine_cpu_delta, system_cpu
from .proc import BenchError, run


def fio(args, workdir, tag, cpu_pid=None, machine_cpu=False):
    """Run fio with JSON output; return a summary dict (plus server CPU if cpu_pid, and
    the machine's steal and idle time over the run if machine_cpu)."""
    out = os.path.join(workdir, f"fio-{tag}.json")
    cmd = ["fio", "--output-format=json", f"--output={out}", "--lat_percentiles=1"] + args
    m0 = system_cpu() if machine_cpu else None
    c0 = cpu_seconds(cpu_pid) if cpu_pid else None
    t0 = time.time()
    r = run(cmd, check=False)
    wall = time.time() - t0
    c1 = cpu_seconds(cpu_pid) if cpu_pid else None
    m1 = system_cpu() if machine_cpu else None
    if r.returncode != 0:
        err = (r.stderr or r.stdout or "").strip().splitlines()
        raise BenchError(f"fio {tag} failed ({r.returncode}): {err[-1] if err else ''}")
    with open(out) as f:
        text = f.read()
    if "{" not in text:
        # fio said it succeeded but wrote no report: show what it did say
        said = " | ".join(x for x in (text.strip(), (r.stderr or "").strip(), (r.stdout or "").strip()) if x)
        raise BenchError(f"fio {tag} exited 0 without a JSON report: {said[-2000:] or 'nothing'}")
    s = summarise(json.loads(text[text.index("{"):])["jobs"])
    s["tag"] = tag
    s["wall_s"] = round(wall, 3)
    if machine_cpu:
        s["machine_cpu"] = machine_cpu_delta(m0, m1)
    if cpu_pid:
        ios = s["ios"]
        s["server_cpu_s"] = round(c1 - c0, 3)
        s["server_cpu_us_per_io"] = round((c1 - c0) / ios * 1e6, 3) if ios else None
        s["server_cores"] = round((c1 - c0) / wall, 3)
    return s


def summarise(jobs):
    """Totals over fio's jobs and directions: I/Os, bytes, IOPS, MB/s, latency."""
    ios = rw_bytes = 0
    iops = bw = 0.0
    lat_mean, p99 = [], []
    for j in jobs:
        for d in ("read", "write"):
            x = j[d]
            if x["total_ios"] == 0:
                continue
            ios += x["total_ios"]
            rw_bytes += x["io_bytes"]
            iops += x["iops"]
            bw += x["bw_bytes"]
            lat = x.get("lat_ns") or {}
            if lat.get("mean"):
                lat_mean.append((lat["mean"], x["total_ios"]))
            pct = lat.get("percentile") or x.get("clat_ns", {}).get("percentile") or {}
            if "99.000000" in pct:
                p99.append(pct["99.000000"])
    runtime_ms = max(max(j["read"]["runtime"], j["write"]["runtime"]) for j in jobs)
    n = sum(k for _, k in lat_mean)
    return {"ios": ios, "bytes": rw_bytes, "runtime_s": runtime_ms / 1000,
            "iops": round(iops, 1), "MBps": round(bw / 1e6, 2),
            "lat_mean_us": round(sum(m * k for m, k in lat_mean) / n / 1000, 2) if n else None,
            "lat_p99_us": round(max(p99) / 1000, 2) if p99 else None,
            "fio_cpu_usr_pct": round(sum(j["usr_cpu"] for j in jobs), 1),
            "fio_cpu_sys_pct": round(sum(j["sys_cpu"] for j in jobs), 1),
            # fio's usr/sys are percent of one CPU over its run: summed over jobs, cores
            "fio_cores": round(sum(j["usr_cpu"] + j["sys_cpu"] for j in jobs) / 100, 3)}


def nbd_flush(uri, workdir, tag):
    """Make the server write out what it holds (NBD FLUSH) so one test's write-back does
    not run during the next test."""
    run(["fio", "--name=flush", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=4k",
         "--size=4k", "--end_fsync=1",
         f"--output={os.path.join(workdir, 'flush-' + tag + '.txt')}"])


class QueueSampler:
    """Samples {leaf: (queued, active)} of `pool` every `period_s` while in a with block."""

    MAX_SAMPLES = 100_000

    def __init__(self, zilla, pool, period_s=0.05):
        self.admin, self.pool, self.period_s = zilla.admin, pool, period_s
        self.samples = []
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_ev.is_set() and len(self.samples) < self.MAX_SAMPLES:
            try:
                self.samples.append(self.admin.leaf_queues(self.pool))
            except Exception:
                pass
            self.stop_ev.wait(self.period_s)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.t.join()

    def summary(self):
        if not self.samples:
            return None
        n = len(self.samples)
        leaves = sorted(self.samples[0])
        per = {l: round(statistics.mean(s[l][1] for s in self.samples if l in s), 2)
               for l in leaves}
        idle = {l: round(sum(1 for s in self.samples if s.get(l, (0, 0))[1] == 0) / n, 3)
                for l in leaves}
        all_idle = sum(1 for s in self.samples if all(v[1] == 0 for v in s.values())) / n
        return {"samples": n, "mean_active_per_leaf": per,
                "mean_active_total": round(sum(per.values()), 2),
                "fraction_idle_per_leaf": idle, "fraction_all_leaves_idle": round(all_idle, 3)}
