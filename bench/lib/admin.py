"""Admin API client (HTTP/1.1 over the daemon's unix socket).

Theory of operation: statistics are read by name. `GET /v1/iostat` gives each vdev's
`stats.classes`, a map from I/O class name ("sync_read", "async_write", "scrub", ...) to
that class's counters and its direction (read/write); totals here sum every class of a
direction, so a class added later (or scrub) is counted and none is dropped. Daemons
built before the by-name API (up to 204d980, used as the old build of a comparison)
answer per-class arrays; `class_stats` decodes those through the fixed class order of
that format (LEGACY_CLASSES) and nothing else in the harness looks at positions.
"""

import http.client
import json
import socket

from .proc import BenchError

# The per-class array order of the iostat API before classes were keyed by name.
LEGACY_CLASSES = (("sync_read", "read"), ("sync_write", "write"), ("async_read", "read"),
                  ("async_write", "write"), ("scrub", "read"))


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path, timeout_s=120):
        super().__init__("zilla", timeout=timeout_s)
        self.sock_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.sock_path)


class AdminClient:
    def __init__(self, sock_path):
        self.sock_path = sock_path

    def get(self, path):
        return _json_request(_UnixHTTP(self.sock_path), "GET", path, None, "admin API")

    def http(self, port, method, path, body=None):
        """A request to the daemon's HTTP port (the web API); the JSON answer."""
        return _json_request(http.client.HTTPConnection("127.0.0.1", port, timeout=30),
                             method, path, body, "HTTP")

    def iostat(self, pool):
        snaps = self.get(f"/v1/iostat?pool={pool}")
        return snaps[0] if isinstance(snaps, list) else snaps

    def leaves(self, pool):
        """[(leaf name, {class name: counters})] for every leaf vdev of `pool`."""
        out = []

        def walk(n):
            if n.get("children"):
                for c in n["children"]:
                    walk(c)
            else:
                out.append((n["name"], class_stats(n["stats"])))
        for v in self.iostat(pool)["vdevs"]:
            walk(v)
        return out

    def device_bytes(self, pool):
        """Bytes and ops read and written by the leaves of `pool` since import, every
        I/O class included."""
        leaves = self.leaves(pool)
        tot = {"read": 0, "write": 0, "read_ops": 0, "write_ops": 0}
        for _, classes in leaves:
            for c in classes.values():
                d = c.get("direction")
                if d in ("read", "write"):
                    tot[d] += c.get("bytes", 0)
                    tot[d + "_ops"] += c.get("ops", 0)
        tot["leaves"] = len(leaves)
        return tot

    def leaf_queues(self, pool):
        """{leaf: (queued, active)} I/Os right now, all classes."""
        return {name: (sum(c.get("queued", 0) for c in cl.values()),
                       sum(c.get("active", 0) for c in cl.values()))
                for name, cl in self.leaves(pool)}

    def arc_counters(self):
        """ARC hits/misses/size from /v1/arcstats ({} when the daemon has none)."""
        try:
            a = self.get("/v1/arcstats")
        except Exception:
            return {}
        return {k: a[k] for k in ("hits", "misses", "size", "c_max") if k in a}


def _json_request(c, method, path, body, what):
    """`method path` on connection `c` (a JSON body if given); the JSON answer, or a
    BenchError saying what came back instead of 200."""
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"} if body is not None else {})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise BenchError(f"{what} {method} {path}: HTTP {r.status}: {data[:300]!r}")
        return json.loads(data)
    finally:
        c.close()


def class_stats(stats):
    """{class name: {"direction", "ops", "bytes", ...}} of one vdev's `stats`."""
    if "classes" in stats:
        return stats["classes"]
    out = {}
    for i, (name, direction) in enumerate(LEGACY_CLASSES):
        rec = {"direction": direction}
        for k in ("ops", "bytes", "errors", "queued", "active"):
            arr = stats.get(k) or []
            rec[k] = arr[i] if i < len(arr) else 0
        out[name] = rec
    return out


def arc_delta(a, b):
    if not a or not b or "hits" not in a:
        return None
    h, m = b["hits"] - a["hits"], b["misses"] - a["misses"]
    return {"hits": h, "misses": m, "hit_ratio": round(h / (h + m), 4) if h + m else None,
            "size_end": b.get("size"), "c_max": b.get("c_max")}
