"""Pictures of the daemon's analytics worksheet, and the numbers behind them.

Theory of operation: `screenshot_worksheet` opens `/ui/worksheet` of a running daemon
in headless chromium (tests/tools/cdp.py, imported by path from the repo root), with
the charts and the time range in the URL hash (`#ds=NAME|FILTER&from=T&to=T`, unix
seconds on the daemon's analytics clock: take them from `analytics_now`, not from
time.time()). It waits until the worksheet has read its catalog and every chart
reports data (`data-points` > 0 and, for heat maps, `data-cells-nonzero` > 0), then
captures the charts (and an optional caption put above them) as one PNG. Without
chromium it logs and returns None: a bench still runs and records its numbers.

`analytics_query` and `median_latency_ns` read the same history through the query API
so that a scenario's JSON holds the figures a reader can check the picture against:
the histogram buckets of a time range summed over the range and its keys, and the
bucket holding the median event (its lower and upper edge, and their geometric mean as
the figure).
"""

import base64
import importlib.util
import json
import math
import os
import shutil
import urllib.parse
import urllib.request

from .proc import ROOT, log

CDP_PATH = os.path.join(ROOT, "tests", "tools", "cdp.py")
WIDTH_PX = 1300


def _cdp():
    """tests/tools/cdp.py as a module (it is not a package)."""
    spec = importlib.util.spec_from_file_location("zilla_cdp", CDP_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def chromium_binary():
    """$CHROMIUM or `chromium` on the PATH, if it is an executable; else None."""
    b = os.environ.get("CHROMIUM") or shutil.which("chromium")
    return b if b and os.path.isfile(b) and os.access(b, os.X_OK) else None


def _get(port, path, timeout_s=30):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
        return json.load(r)


def analytics_catalog(port):
    return _get(port, "/api/v1/analytics/datasets")


def analytics_now(port):
    """The daemon's analytics clock (unix seconds): the time of its newest point."""
    return int(analytics_catalog(port)["now"])


def analytics_query(port, dataset, from_s, to_s, filt=None):
    q = {"dataset": dataset, "from": int(from_s), "to": int(to_s), "resolution": 1}
    if filt:
        q["filter"] = filt
    return _get(port, "/api/v1/analytics/query?" + urllib.parse.urlencode(q))


def analytics_enable(port, dataset):
    """Turn a dataset (`STATISTIC/BREAKDOWN`) on; its catalog entry."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/analytics/datasets/{dataset}",
                                 data=b'{"enabled": true}', method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def summed_buckets(query, from_s=None, to_s=None):
    """{bucket: count} over every key and every point with from_s < time <= to_s."""
    out = {}
    for s in query.get("series", []):
        for t, b in zip(query.get("times", []), s.get("buckets") or []):
            if b is None or (from_s is not None and t <= from_s) or (to_s is not None and t > to_s):
                continue
            for bucket, count in b:
                out[bucket] = out.get(bucket, 0) + count
    return out


def median_latency_ns(buckets, edges):
    """The bucket holding the median event of {bucket: count}: {events, bucket,
    lower_ns, upper_ns, median_ns (geometric mean of the edges)}; None without events.
    `edges` is the catalog's `buckets` ({lower: [...], upper: [...]})."""
    total = sum(buckets.values())
    if total <= 0:
        return None
    seen = 0
    for b in sorted(buckets):
        seen += buckets[b]
        if 2 * seen >= total:
            lo = edges["lower"][b]
            hi = edges["upper"][b] if b < len(edges["upper"]) and edges["upper"][b] is not None else lo * 2
            mid = math.sqrt(max(lo, 1) * hi)
            return {"events": total, "bucket": b, "lower_ns": lo, "upper_ns": hi,
                    "median_ns": round(mid), "median_us": round(mid / 1000, 1)}
    return None


def worksheet_url(port, datasets, from_s, to_s):
    """`datasets`: "NAME", "NAME|FILTER" or (NAME, FILTER) items."""
    parts = []
    for d in datasets:
        if isinstance(d, (tuple, list)):
            d = d[0] + ("|" + d[1] if d[1] else "")
        parts.append("ds=" + urllib.parse.quote(d, safe="/|:,*+"))
    parts += [f"from={int(from_s)}", f"to={int(to_s)}"]
    return f"http://127.0.0.1:{port}/ui/worksheet#" + "&".join(parts)


def screenshot_worksheet(http_port, datasets, from_s, to_s, out_png, caption=None, timeout_s=40):
    """A PNG of the worksheet's charts of `datasets` over [from_s, to_s] (daemon
    clock) at `out_png`; the path, or None when chromium is missing or the page did
    not draw (logged: a picture is never worth failing a bench for)."""
    if not chromium_binary():
        log("no chromium: no worksheet picture (apt-get install chromium)")
        return None
    url = worksheet_url(http_port, datasets, from_s, to_s)
    try:
        cdp = _cdp()
        with cdp.Browser(width=WIDTH_PX, height=400 + 340 * len(datasets), timeout=timeout_s) as b:
            b.open(url)
            b.wait("['1', 'error'].includes(document.getElementById('worksheet').dataset.ready)",
                   timeout_s, "the worksheet to start")
            if b.eval("document.getElementById('worksheet').dataset.ready") != "1":
                err = b.eval("document.getElementById('error').textContent")
                log(f"worksheet picture: the worksheet did not start: {err}")
                return None
            b.wait(f"(() => {{ const cs = [...document.querySelectorAll('#charts [data-dataset]')];"
                   f" return cs.length === {len(datasets)} && cs.every((c) => Number(c.dataset.points) > 0"
                   f" && (c.dataset.kind !== 'histogram' || Number(c.dataset.cellsNonzero) > 0)); }})()",
                   timeout_s, "data in every chart")
            b.pump(0.5)    # the last draw
            rect = b.eval("""((caption) => {
              if (caption) {
                const p = document.createElement('p');
                p.className = 'bench-caption';
                p.style.cssText = 'font-weight:600;margin:4px 0 6px 0';
                p.textContent = caption;
                document.getElementById('charts').before(p);
              }
              for (const b of document.querySelectorAll('#charts button.close')) b.style.visibility = 'hidden';
              const first = document.querySelector('.bench-caption') || document.getElementById('charts');
              const a = first.getBoundingClientRect(), c = document.getElementById('charts').getBoundingClientRect();
              return [Math.max(0, Math.min(a.left, c.left) - 8), Math.max(0, a.top - 8),
                      Math.max(a.right, c.right) - Math.min(a.left, c.left) + 16, c.bottom - a.top + 16];
            })(""" + json.dumps(caption) + ")")
            b.pump(0.2)
            x, y, w, h = rect
            shot = b.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                          clip={"x": x, "y": y, "width": w, "height": h, "scale": 1})
            os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
            with open(out_png, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
    except (OSError, RuntimeError, TimeoutError, LookupError, ValueError) as e:
        log(f"worksheet picture of {url} failed: {e}")
        return None
    log(f"worksheet picture {out_png} ({url})")
    return out_png
