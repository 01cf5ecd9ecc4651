#!/usr/bin/env python3
"""A stand-in for the daemon's HTTP side, for developing and testing the web UI.

Serves the analytics API of docs (the analytics contract: datasets, PUT enable, query,
live SSE) with synthetic data, the dashboard's read-only /api/v1 routes with a fixed
pool, and the page assets straight from crates/zilla/assets/ at the paths the daemon
uses (/, /ui/worksheet, /ui/assets/...). It proxies nothing and fetches nothing.

Synthetic data (a function of the second, so every run draws the same):
  io.ops / io.bytes   by op, volume, volume+op, ... (read ~200/s, write ~120/s)
  io.latency          a main band around 100-300 us and a faint second band around
                      5 ms (a count of 1 to 2 in some seconds)
  disk.latency/device the tree tank/mirror-0/{a0,a1}, tank/mirror-1/{b0,b1},
                      tank/logs/l0, tank/cache/c0

    python3 tests/tools/analytics_mock.py [--port N] [--bind ADDR]
prints `listening on http://ADDR:PORT` when ready.
"""

import argparse
import json
import math
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ASSETS = os.path.join(ROOT, "crates", "zilla", "assets")
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8"}

# ---------------------------------------------------------------- buckets (contract)
LOWER = [0] + [(1 << (10 + k)) * (4 + q) // 4 for k in range(24) for q in range(4)] + [1 << 34]
UPPER = LOWER[1:] + [None]


def bucket_of(value):
    if value < 1024:
        return 0
    if value >= 1 << 34:
        return 97
    k = value.bit_length() - 1 - 10
    q = (value >> (k + 10 - 2)) & 3
    return 1 + 4 * k + q


# ---------------------------------------------------------------- catalog
STATS = [
    ("io.ops", "counter", "ops/s", ["none", "op", "volume", "client", "protocol", "volume+op"], "Front-end requests"),
    ("io.bytes", "counter", "B/s", ["none", "op", "volume", "client", "protocol", "volume+op"], "Front-end bytes"),
    ("io.latency", "histogram", "ns", ["none", "op", "volume", "client", "protocol", "volume+op"], "Front-end request latency"),
    ("io.size", "histogram", "bytes", ["none", "op", "volume", "client", "protocol", "volume+op"], "Front-end request size"),
    ("disk.ops", "counter", "ops/s", ["none", "device", "class", "op"], "Device operations"),
    ("disk.bytes", "counter", "B/s", ["none", "device", "class", "op"], "Device bytes"),
    ("disk.latency", "histogram", "ns", ["none", "device", "class", "op"], "Device latency"),
    ("arc.accesses", "counter", "/s", ["none", "result"], "ARC accesses"),
    ("zil.commits", "counter", "/s", ["none", "volume"], "ZIL commits"),
    ("txg.syncs", "counter", "/s", ["none", "pool"], "Transaction group syncs"),
]
DEFAULTS = {"io.ops/op", "io.latency/op", "disk.latency/device"}
# the daemon also enables the dashboard's I/O datasets in a new history
ENABLED = set(DEFAULTS) | {"disk.bytes/device", "io.latency/volume", "io.bytes/volume"}
LOCK = threading.Lock()
MEMORY_MAX = 64 << 20
PER_DATASET = 1 << 20

KEYS = {
    "none": ["all"],
    "op": ["read", "write", "flush"],
    "volume": ["tank/v1", "tank/v2"],
    "volume+op": ["tank/v1:read", "tank/v1:write", "tank/v2:read", "tank/v2:write"],
    "client": ["tcp 127.0.0.1", "uid 0"],
    "protocol": ["nbd", "iscsi"],
    "device": ["tank/mirror-0/a0", "tank/mirror-0/a1", "tank/mirror-1/b0", "tank/mirror-1/b1", "tank/logs/l0", "tank/cache/c0"],
    "class": ["sync_read", "sync_write", "async_read", "async_write", "scrub", "trim"],
    "result": ["hit", "miss", "l2_hit", "l2_miss"],
    "pool": ["tank"],
}


def dataset_obj(stat, breakdown):
    s = next(x for x in STATS if x[0] == stat)
    name = f"{stat}/{breakdown}"
    return {"name": name, "statistic": stat, "breakdown": breakdown, "kind": s[1], "unit": s[2],
            "enabled": name in ENABLED, "default": name in DEFAULTS,
            "memory_bytes": PER_DATASET if name in ENABLED else 0, "memory_max_bytes": PER_DATASET,
            "description": f"{s[4]}, by {breakdown}"}


def catalog():
    with LOCK:
        datasets = [dataset_obj(s[0], b) for s in STATS for b in s[3]]
        return {"datasets": datasets,
                "statistics": [{"name": s[0], "kind": s[1], "unit": s[2], "breakdowns": s[3], "description": s[4]} for s in STATS],
                "memory_bytes": PER_DATASET * len(ENABLED), "memory_max_bytes": MEMORY_MAX,
                "history": {"second_points": 3600, "minute_points": 10080},
                "buckets": {"lower": LOWER, "upper": UPPER}, "now": int(time.time())}


# ---------------------------------------------------------------- synthetic points
def rng(t, *parts):
    return random.Random(hash((t,) + parts) & 0xFFFFFFFF)


def rate(stat, key, t):
    """Per-second rate of `key` at second t (a counter, or a histogram's ops/s)."""
    base = 1.0
    for part in key.split(":"):
        base *= {"read": 200, "write": 120, "flush": 5, "tank/v1": 0.7, "tank/v2": 0.3}.get(part, 1)
    if key in KEYS["device"]:
        base = {"l0": 40, "c0": 15}.get(key.rsplit("/", 1)[1], 80)
    if key in ("hit", "miss", "l2_hit", "l2_miss"):
        base = {"hit": 900, "miss": 60, "l2_hit": 30, "l2_miss": 30}[key]
    if stat.endswith(".bytes"):
        base *= 4096
    wave = 1 + 0.3 * math.sin(t / 20.0 + len(key))
    return round(base * wave * (0.9 + 0.2 * rng(t, stat, key).random()), 1)


def histogram(stat, key, t, ops):
    """Sparse [bucket, count] pairs for `ops` events: a main band and a faint one."""
    r = rng(t, stat, key, "h")
    centre = 150_000 if "write" in key else 90_000
    if stat == "io.size":
        centre = 4096 if "read" in key else 65536
    if stat == "disk.latency":
        centre = 400_000
    counts = {}
    for _ in range(int(ops)):
        b = bucket_of(int(centre * math.exp(r.gauss(0, 0.35))))
        counts[b] = counts.get(b, 0) + 1
    if stat.endswith("latency") and r.random() < 0.5:  # the faint second band, ~5 ms
        b = bucket_of(int(5_000_000 * math.exp(r.gauss(0, 0.2))))
        counts[b] = counts.get(b, 0) + r.choice([1, 1, 2])
    return sorted([b, c] for b, c in counts.items())


def point(name, t, filt=None):
    stat, breakdown = name.split("/")
    kind = next(s[1] for s in STATS if s[0] == stat)
    series = []
    for key in KEYS.get(breakdown, ["all"]):
        if filt and not any(match(p, key) for p in filt):
            continue
        v = rate(stat, key, t)
        s = {"key": key, "value": v}
        if kind == "histogram":
            s["buckets"] = histogram(stat, key, t, v)
        series.append(s)
    return kind, series


def match(pattern, key):
    import fnmatch
    return fnmatch.fnmatchcase(key, pattern)


# ---------------------------------------------------------------- dashboard data
def leaf(name, role="normal"):
    return {"name": name, "kind": "file", "role": role, "state": "ONLINE", "read_errors": 0,
            "write_errors": 0, "cksum_errors": 0, "note": "", "children": []}


DASHBOARD = {
    "pools": [{"name": "tank", "size": 534773760, "alloc": 104857600, "free": 429916160, "frag_percent": 3,
               "cap_percent": 19, "health": "ONLINE", "ashift": 12, "avail": 417665840}],
    "status": [{"name": "tank", "state": "ONLINE",
                "scan": {"func": "scrub", "state": "scanning", "start_time_s": 1764390000, "end_time_s": 0,
                         "examined_bytes": 52428800, "to_examine_bytes": 209715200, "repaired_bytes": 0, "errors": 0},
                "trim": {"state": "none"},
                "config": [{"name": "mirror-0", "kind": "mirror", "role": "normal", "state": "ONLINE", "read_errors": 0,
                            "write_errors": 0, "cksum_errors": 2, "note": "", "children": [leaf("a0"), leaf("a1")]},
                           {"name": "mirror-1", "kind": "mirror", "role": "normal", "state": "ONLINE", "read_errors": 0,
                            "write_errors": 0, "cksum_errors": 0, "note": "", "children": [leaf("b0"), leaf("b1")]},
                           leaf("l0", "log"), leaf("c0", "cache")],
                "data_errors": 0, "error_list": []}],
    "volumes": [{"name": "tank/v1", "volsize": 67108864, "volblocksize": 16384, "used": 52428800, "readonly": False,
                 "available": 417665840, "referenced": 52428800, "refreservation": 0, "logicalused": 52428800},
                {"name": "tank/v2", "volsize": 33554432, "volblocksize": 16384, "used": 33554432, "readonly": False,
                 "available": 417665840, "referenced": 1048576, "refreservation": 33554432, "logicalused": 1048576}],
    "arcstats": {"size": 50 << 20, "c": 3 << 30, "c_max": 3 << 30, "hits": 9000, "misses": 600, "mru_size": 30 << 20,
                 "mfu_size": 20 << 20, "l2_size": 10 << 20, "l2_asize": 9 << 20, "l2_hits": 30, "l2_misses": 570,
                 "l2_read_bytes": 1 << 20, "l2_write_bytes": 10 << 20, "zilla_rss_bytes": 200 << 20},
    "zilstats": {"zil_commit_count": 42, "zil_itx_count": 300, "zil_lwb_write_count": 40, "zil_itx_metaslab_slog_bytes": 1 << 20},
    "info": {"version": "mock", "pid": os.getpid(), "state_dir": "/mock", "nbd_tcp": None, "nbd_unix": None, "iscsi": None, "http": None},
    "clients": [],
    "iostat": [],
}

LIVE_SUBSCRIBERS = [0]
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        if os.environ.get("MOCK_LOG"):
            sys.stderr.write("mock: " + fmt % args + "\n")

    def send(self, code, body, ctype="application/json"):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")
        if ctype.startswith("text/html"):  # as the daemon (web.rs PAGE_POLICY)
            self.send_header("Content-Security-Policy", PAGE_POLICY)
        self.end_headers()
        self.wfile.write(body)

    def error(self, code, msg):
        self.send(code, {"error": msg})

    def do_GET(self):
        u = urlsplit(self.path)
        q = parse_qs(u.query)
        p = u.path
        if p in ("/", "/ui/worksheet"):
            return self.file("dashboard.html" if p == "/" else "worksheet.html")
        if p.startswith("/ui/assets/"):
            return self.file(p[len("/ui/assets/"):])
        if p == "/api/v1/analytics/datasets":
            return self.send(200, catalog())
        if p == "/api/v1/analytics/query":
            return self.query(q)
        if p == "/api/v1/analytics/live":
            return self.live(q)
        if p.startswith("/api/v1/") and p[len("/api/v1/"):] in DASHBOARD:
            return self.send(200, DASHBOARD[p[len("/api/v1/"):]])
        self.error(404, "no such route")

    def do_PUT(self):
        p = urlsplit(self.path).path
        parts = p.split("/")
        if len(parts) != 7 or parts[:5] != ["", "api", "v1", "analytics", "datasets"]:
            return self.error(404, "no such route")
        stat, breakdown = parts[5], parts[6]
        s = next((x for x in STATS if x[0] == stat), None)
        if not s or breakdown not in s[3]:
            return self.error(404, f"unknown dataset {stat}/{breakdown}")
        n = int(self.headers.get("Content-Length") or 0)
        try:
            enabled = bool(json.loads(self.rfile.read(n) or b"{}")["enabled"])
        except (ValueError, KeyError, TypeError):
            return self.error(400, "body must be {\"enabled\": true|false}")
        with LOCK:
            name = f"{stat}/{breakdown}"
            if enabled and name not in ENABLED and PER_DATASET * (len(ENABLED) + 1) > MEMORY_MAX:
                return self.error(409, "not enough analytics memory")
            (ENABLED.add if enabled else ENABLED.discard)(name)
        self.send(200, dataset_obj(stat, breakdown))

    def file(self, rel):
        path = os.path.realpath(os.path.join(ASSETS, rel))
        if not path.startswith(ASSETS + os.sep) or not os.path.isfile(path):
            return self.error(404, "no such asset")
        with open(path, "rb") as f:
            body = f.read()
        self.send(200, body, TYPES.get(os.path.splitext(path)[1], "text/plain; charset=utf-8"))

    def query(self, q):
        name = (q.get("dataset") or [""])[0]
        stat = name.split("/")[0]
        s = next((x for x in STATS if x[0] == stat), None)
        if not s or "/" not in name or name.split("/")[1] not in s[3]:
            return self.error(404, f"unknown dataset {name}")
        now = int(time.time())
        try:
            to = int((q.get("to") or [now])[0])
            frm = int((q.get("from") or [to - 300])[0])
        except ValueError:
            return self.error(400, "from and to are unix seconds")
        res = int((q.get("resolution") or [1 if frm >= now - 3600 else 60])[0])
        if res not in (1, 60):
            return self.error(400, "resolution is 1 or 60")
        n = (to - frm) // res
        if n > 3600:
            return self.error(400, "at most 3600 points per query")
        filt = [k for k in (q.get("filter") or [""])[0].split(",") if k] or None
        times = [frm + res * (i + 1) for i in range(max(0, n))]
        enabled = name in ENABLED
        by_key = {}
        kind = s[1]
        for t in times:
            k, series = point(name, t, filt)
            for ser in series:
                e = by_key.setdefault(ser["key"], {"key": ser["key"], "values": []})
                e["values"].append(ser["value"] if enabled and t <= now else None)
                if kind == "histogram":
                    e.setdefault("buckets", []).append(ser["buckets"] if enabled and t <= now else None)
        self.send(200, {"dataset": name, "kind": kind, "unit": s[2], "resolution": res, "from": frm, "to": to,
                        "times": times, "series": list(by_key.values())})

    def live(self, q):
        names = q.get("dataset") or []
        if not names or len(names) > 8:
            return self.error(400, "one to 8 datasets")
        with LOCK:
            if LIVE_SUBSCRIBERS[0] >= 16:
                return self.error(503, "too many live subscribers")
            LIVE_SUBSCRIBERS[0] += 1
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            last = int(time.time())
            while True:
                now = int(time.time())
                if now > last:
                    last = now
                    data = {}
                    for name in names:
                        if name in ENABLED:
                            _, series = point(name, now)
                            data[name] = {"series": series}
                    msg = "event: point\ndata: " + json.dumps({"time": now, "datasets": data}) + "\n\n"
                    self.wfile.write(msg.encode())
                    self.wfile.flush()
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with LOCK:
                LIVE_SUBSCRIBERS[0] -= 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bind", default="127.0.0.1")
    a = ap.parse_args()
    srv = ThreadingHTTPServer((a.bind, a.port), Handler)
    srv.daemon_threads = True
    print(f"listening on http://{a.bind}:{srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
