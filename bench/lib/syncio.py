"""Synchronous-write measurements shared by the intent-log scenarios (slog, logbias,
tar-sync).

Theory of operation: `sync_fio` runs fio's nbd engine with an NBD FLUSH after every
write (`--fsync=1`) and reports the *sync write* as one operation: its IOPS are the
writes per second and its latency is the write's plus the flush's mean latency (fio
reports the two separately; a sync write costs both). `ZilDelta` reads the daemon's
intent-log counters (`/v1/zilstats`, OpenZFS kstat names) before and after a test and
gives commits, lwbs, itxs per lwb and the log bytes written to the log class and to the
normal class; counters are summed over the daemon's pools, so a test must be the only
thing writing while it runs. `log_model_us` is the sim-ssd log device's service time
for the lwbs one commit wrote (from the sim tunables), the bound QD1 latency is held to.
"""

import json
import os
import time

from .proc import BenchError, run


def sync_fio(uri, workdir, tag, jobs, runtime_s, size, bs="4k", cpu_pid=None, extra=()):
    """`jobs` writers (one NBD connection each), QD1 each, a FLUSH after every write."""
    out = os.path.join(workdir, f"fio-{tag}.json")
    cmd = ["fio", "--output-format=json", f"--output={out}", f"--name={tag}", "--ioengine=nbd",
           f"--uri={uri}", "--rw=randwrite", f"--bs={bs}", "--iodepth=1", "--fsync=1",
           f"--numjobs={jobs}", f"--size={size}", f"--runtime={runtime_s}", "--time_based",
           "--group_reporting"] + list(extra)
    c0 = _cpu(cpu_pid)
    t0 = time.time()
    r = run(cmd, check=False)
    wall = time.time() - t0
    c1 = _cpu(cpu_pid)
    if r.returncode != 0:
        err = (r.stderr or r.stdout or "").strip().splitlines()
        raise BenchError(f"fio {tag} failed ({r.returncode}): {err[-1] if err else ''}")
    with open(out) as f:
        text = f.read()
    j = json.loads(text[text.index("{"):])["jobs"][0]
    w, s = j["write"], j.get("sync") or {}
    wlat = (w.get("lat_ns") or {}).get("mean")
    slat = (s.get("lat_ns") or {}).get("mean")
    ios = w["total_ios"]
    res = {"tag": tag, "writers": jobs, "bs": bs, "ios": ios, "flushes": s.get("total_ios"),
           "iops": round(w["iops"], 1), "MBps": round(w["bw_bytes"] / 1e6, 3),
           "write_lat_mean_us": round(wlat / 1000, 1) if wlat else None,
           "flush_lat_mean_us": round(slat / 1000, 1) if slat else None,
           "wall_s": round(wall, 2)}
    res["lat_mean_us"] = (round(res["write_lat_mean_us"] + res["flush_lat_mean_us"], 1)
                          if wlat and slat else None)
    if cpu_pid and c0 is not None and c1 is not None:
        res["server_cpu_us_per_io"] = round((c1 - c0) / ios * 1e6, 1) if ios else None
    return res


def _cpu(pid):
    if not pid:
        return None
    from .machine import cpu_seconds
    return cpu_seconds(pid)


class ZilDelta:
    """Intent-log counters of a daemon over a with-block."""

    def __init__(self, zilla):
        self.admin = zilla.admin

    def __enter__(self):
        self.before = self.admin.get("/v1/zilstats")
        return self

    def __exit__(self, *exc):
        self.after = self.admin.get("/v1/zilstats")

    def d(self, name):
        return self.after.get(name, 0) - self.before.get(name, 0)

    def summary(self):
        lwbs = self.d("zil_lwb_write_count")
        recs = self.d("zil_itx_metaslab_slog_count") + self.d("zil_itx_metaslab_normal_count")
        writers = self.d("zil_commit_writer_count")
        return {"commits": self.d("zil_commit_count"), "commit_writers": writers,
                "itxs": self.d("zil_itx_count"), "lwbs": lwbs,
                "itxs_per_lwb": round(recs / lwbs, 2) if lwbs else None,
                "lwbs_per_commit_writer": round(lwbs / writers, 3) if writers else None,
                "log_bytes_slog": self.d("zil_itx_metaslab_slog_write"),
                "log_bytes_normal": self.d("zil_itx_metaslab_normal_write"),
                "lwbs_slog_full": self.d("zil_lwb_slog_full_count"),
                "itx_indirect": self.d("zil_itx_indirect_count"),
                "itx_copied": self.d("zil_itx_copied_count") + self.d("zil_itx_needcopy_count")}


def tunables(zilla):
    """{name: value} of the daemon's tunables."""
    out = {}
    for line in zilla.cli("tunable", "get", "-H", "-p").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def log_model_us(t, zil):
    """Modelled sim-ssd log service time of one commit: each lwb pays the write latency
    and its bytes at the write rate (one channel: lwbs are served one after the other),
    then one cache flush. Uses the lwbs and bytes the commits of the test wrote."""
    writers = zil.get("commit_writers") or 0
    if not writers or not zil.get("lwbs"):
        return None
    lwbs = zil["lwbs"] / writers
    nbytes = zil["log_bytes_slog"] / writers
    lat = t.get("sim_ssd_log_write_latency_us")
    rate = t.get("sim_ssd_log_write_mb_s")
    flush = t.get("sim_ssd_log_flush_us")
    if None in (lat, rate, flush):
        return None
    return round(lwbs * lat + nbytes / rate + flush, 1)   # bytes / (MB/s) = us
