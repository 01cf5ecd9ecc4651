#!/usr/bin/env python3
"""Drive the web UI in headless chromium and check what it draws (used by
tests/system/45_web_ui.sh; runs alone against the analytics mock with --mock).

    web_ui_check.py --base http://127.0.0.1:8080 --pool tank --volume tank/vol0 \
        [--parts dashboard,worksheet] [--screenshots DIR]
    web_ui_check.py --mock [--screenshots DIR]     # tests/tools/analytics_mock.py

Dashboard: the pool (with health), its vdev tree and the volume are shown.
Worksheet: charts of io.ops/op, io.latency/op, disk.latency/device and io.ops/volume
get data points (the heat map non-zero cells) and keep getting live points; hover
over a heat-map cell shows its time, bucket and count; enabling io.ops/volume (PUT)
and clicking the volume's legend row highlights it and adds the drill-down chart
io.ops/volume+op filtered to VOLUME:*; dragging across a chart zooms every chart
and shows the range average panel; reopening the saved URL shows the same charts,
zoom and highlight. Every request the page made went to the page's origin.
Each check prints `ok: ...`; the first failure prints `FAIL: ...` and exits 1.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp import Browser  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class Failed(Exception):
    pass


def ok(msg):
    print("ok:", msg, flush=True)


def check(cond, msg):
    if not cond:
        raise Failed(msg)
    ok(msg)


def chart(ds, flt=None):
    sel = f'[data-dataset="{ds}"]'
    if flt is not None:
        sel += f'[data-filter="{flt}"]'
    return sel


def q(sel):
    return "document.querySelector(" + json.dumps(sel) + ")"


def attr_num(b, sel, name):
    return b.eval(f"(() => {{ const e = {q(sel)}; return e ? Number(e.dataset.{name} || 0) : -1; }})()")


def dashboard(b, base, shots, pool, volume):
    b.open(base + "/")
    b.wait("Number(document.getElementById('dashboard').dataset.loaded) >= 1", 15, "the dashboard's first refresh")
    pool_row = q(f'#pool-table tr[data-pool="{pool}"]')
    check(b.eval(f"!!{pool_row}"), f"dashboard lists pool {pool}")
    health = b.eval(f"{pool_row}.children[1].textContent")
    check(health == "ONLINE", f"pool {pool} shows health ONLINE (shows {health})")
    leaves = b.eval("document.querySelectorAll(" + json.dumps(f'#vdev-table tr[data-vdev^="{pool}/"]') + ").length")
    check(leaves >= 3, f"vdev tree of {pool} has {leaves} rows with error counters")
    volume_row = q(f'#volume-table tr[data-volume="{volume}"]')
    check(b.eval(f"!!{volume_row}"), f"dashboard lists volume {volume}")
    check(b.eval(f"!!{q('[data-stat=arc_size]')}") and b.eval(f"!!{q('[data-stat=zil_commit_count]')}"), "ARC and ZIL figures shown")
    n = b.eval("Number(document.getElementById('dashboard').dataset.loaded)")
    b.wait(f"Number(document.getElementById('dashboard').dataset.loaded) > {n}", 10, "a refresh after a few seconds")
    ok("dashboard refreshes")
    b.screenshot(os.path.join(shots, "dashboard.png"))


def heat_cell_js(ds):
    """JS: viewport coordinates of the hottest cell of the newest column with data."""
    return f"""(() => {{
      const c = window.zillaWorksheet.charts.find((c) => c.name === {json.dumps(ds)} && !c.filter);
      if (!c || !c.plot) return null;
      const u = c.plot, over = c.root.querySelector('.u-over').getBoundingClientRect();
      for (let i = c.times.length - 1; i >= 0; i--) {{
        const m = c.mergedBuckets(i);
        if (!m || !m.size) continue;
        let best = null;
        for (const [b, n] of m) if (n > 0 && (!best || n > best[1])) best = [b, n];
        if (!best) continue;
        const [lo, hi] = c.edges(best[0]);
        const x = u.valToPos(c.times[i] - c.resolution / 2, 'x'), y = u.valToPos(Math.sqrt(lo * hi), 'y');
        if (x < 2) return null;
        return [over.left + x, over.top + y, c.times[i], best[0], best[1]];
      }}
      return null; }})()"""


def worksheet(b, base, shots, volume):
    origin = base
    url = base + "/ui/worksheet#ds=io.ops/op&ds=io.latency/op&ds=disk.latency/device&ds=io.ops/volume"
    b.open(url)
    b.wait("['1', 'error'].includes(document.getElementById('worksheet').dataset.ready)", 20, "the worksheet to start")
    err = b.eval("document.getElementById('error').textContent")
    check(b.eval("document.getElementById('worksheet').dataset.ready") == "1", f"worksheet read the analytics catalog {err!r}")
    for ds in ("io.ops/op", "io.latency/op", "disk.latency/device"):
        b.wait(f"Number(({q(chart(ds))} || {{dataset: {{}}}}).dataset.points) > 0", 20, f"data points in {ds}")
        ok(f"{ds} chart has {attr_num(b, chart(ds), 'points')} points with data")
    b.wait(f"Number({q(chart('io.latency/op'))}.dataset.cellsNonzero) > 0", 15, "non-zero heat map cells")
    ok(f"io.latency/op heat map has {attr_num(b, chart('io.latency/op'), 'cellsNonzero')} non-zero cells")
    check(b.eval(f"{q(chart('io.ops/op'))}.querySelectorAll('.legend tr[data-key]').length") >= 1, "io.ops/op legend lists keys")
    pool = volume.split("/")[0]
    root = q(chart("disk.latency/device") + f' .legend tr[data-tree=node][data-key="{pool}"]')
    b.wait(f"!!{root}", 10, "device tree root")
    depth = b.eval(f"Math.max(...[...{q(chart('disk.latency/device'))}.querySelectorAll('.legend tr[data-key]')].map((r) => r.dataset.key.split('/').length))")
    check(depth >= 3, f"device legend is the pool's tree (depth {depth})")
    n = attr_num(b, chart("io.ops/op"), "points")
    b.wait(f"Number({q(chart('io.ops/op'))}.dataset.points) > {n}", 10, "live points")
    ok("live points arrive")
    b.screenshot(os.path.join(shots, "worksheet.png"))

    # hover over a heat map cell: time, bucket range and count
    cell = b.wait(heat_cell_js("io.latency/op"), 10, "a heat map cell to hover")
    b.hover(cell[0], cell[1])
    b.pump(0.3)
    b.wait(f"{q(chart('io.latency/op') + ' .hover')}.style.display === 'block'", 5, "the hover box")
    hv = b.eval(f"Object.assign({{text: {q(chart('io.latency/op') + ' .hover')}.textContent}}, {q(chart('io.latency/op') + ' .hover')}.dataset)")
    check(int(hv.get("time", 0)) > 0 and int(hv.get("count", 0)) > 0 and hv.get("bucket") is not None,
          f"hover over a cell shows time, bucket and count: {hv.get('text')!r}")
    b.screenshot(os.path.join(shots, "worksheet-hover.png"))

    # drill-down: enable io.ops/volume (PUT), click the volume's legend row
    vchart = chart("io.ops/volume")
    if b.eval(f"!!{q(vchart + ' button.enable')}"):
        x, y = b.center(vchart + " button.enable")[:2]
        b.click(x, y)
        ok("clicked Enable on io.ops/volume")
    row = vchart + f' .legend tr[data-key="{volume}"]'
    b.wait(f"!!{q(row)}", 20, f"legend row {volume} in io.ops/volume")
    x, y = b.center(row)[:2]
    b.click(x, y)
    drill = chart("io.ops/volume+op", volume + ":*")
    b.wait(f"!!{q(drill)}", 10, "the drill-down chart")
    check(b.eval(f"{q(row)}.classList.contains('hl')"), f"legend row {volume} is highlighted")
    b.wait(f"Number({q(drill)}.dataset.points) > 0", 20, "data points in the drill-down chart")
    keys = b.eval(f"[...{q(drill)}.querySelectorAll('.legend tr[data-key]')].map((r) => r.dataset.key)")
    check(keys and all(k.startswith(volume + ":") or k == "other" for k in keys), f"drill-down keys are {volume}'s: {keys}")
    b.screenshot(os.path.join(shots, "worksheet-drill.png"))

    # drag across io.ops/op: every chart zooms, the range average panel appears
    over = b.center(chart("io.ops/op") + " .u-over")
    left, top, width, height = over[2:]
    b.drag(left + width * 0.55, top + height / 2, left + width * 0.97, top + height / 2)
    b.wait(f"!{q(chart('io.ops/op') + ' .range-average')}.hidden", 5, "the range average panel")
    avg_rows = b.eval(f"{q(chart('io.ops/op'))}.querySelectorAll('.range-average tr[data-key]').length")
    check(avg_rows >= 1, f"range average panel lists {avg_rows} keys")
    check("from=" in b.eval("location.hash") and "to=" in b.eval("location.hash"), "the zoomed range is in the URL")
    zoom = b.eval("(() => { const u = window.zillaWorksheet.charts[0].plot; return [u.scales.x.min, u.scales.x.max]; })()")
    check(zoom[1] - zoom[0] < 300, f"charts zoomed to {zoom[1] - zoom[0]:.0f} s")
    b.screenshot(os.path.join(shots, "worksheet-zoom.png"))

    # the saved URL reopens the same worksheet
    saved = b.eval("location.href")
    before = b.eval("[...document.querySelectorAll('[data-dataset]')].map((c) => c.dataset.dataset + '|' + c.dataset.filter)")
    b.open("about:blank")
    b.open(saved)
    b.wait("document.getElementById('worksheet').dataset.ready === '1'", 20, "the reopened worksheet")
    after = b.eval("[...document.querySelectorAll('[data-dataset]')].map((c) => c.dataset.dataset + '|' + c.dataset.filter)")
    check(after == before, f"reopened URL shows the same charts {after}")
    b.wait(f"!{q(chart('io.ops/op') + ' .range-average')}.hidden", 10, "the range average panel after reopening")
    b.wait(f"!!{q(row + '.hl')}", 10, "the highlighted row after reopening")
    ok("reopened URL keeps zoom and highlight")
    b.wait(f"Number({q(chart('io.ops/op'))}.dataset.points) > 0", 10, "data points after reopening")
    b.screenshot(os.path.join(shots, "worksheet-reopened.png"))


def every_statistic(b, base, shots):
    """Each statistic of the catalog in a worksheet (broken down by none, turned on
    through the API first): every chart gets points with data."""
    def put(name, enabled):
        req = urllib.request.Request(base + "/api/v1/analytics/datasets/" + name, method="PUT",
                                     data=json.dumps({"enabled": enabled}).encode(), headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()

    cat = json.load(urllib.request.urlopen(base + "/api/v1/analytics/datasets", timeout=10))
    for d in cat["datasets"]:  # room under the memory bound: the earlier drill-downs off
        if d["enabled"] and not d["default"]:
            put(d["name"], False)
    names = [f"{st['name']}/none" for st in cat["statistics"]]
    for name in names:
        put(name, True)
    for i in range(0, len(names), 5):  # a worksheet's live stream follows at most 8 datasets
        batch = names[i:i + 5]
        b.open("about:blank")
        b.open(base + "/ui/worksheet#" + "&".join("ds=" + n for n in batch))
        b.wait("document.getElementById('worksheet').dataset.ready === '1'", 20, "the worksheet")
        for ds in batch:
            b.wait(f"Number(({q(chart(ds))} || {{dataset: {{}}}}).dataset.points) > 0", 20, f"data points in {ds}")
        ok(f"charts with data: {', '.join(batch)}")
        b.screenshot(os.path.join(shots, f"statistics-{i // 5 + 1}.png"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="the daemon's HTTP address, e.g. http://127.0.0.1:8080")
    ap.add_argument("--mock", action="store_true", help="start tests/tools/analytics_mock.py and check against it")
    ap.add_argument("--pool", default="tank")
    ap.add_argument("--volume", default="tank/v1")
    ap.add_argument("--parts", default="dashboard,worksheet")
    ap.add_argument("--screenshots", default=os.environ.get("ZILLA_SCREENSHOTS"))
    a = ap.parse_args()
    mock = None
    if a.mock:
        mock = subprocess.Popen([sys.executable, os.path.join(HERE, "analytics_mock.py")], stdout=subprocess.PIPE, text=True)
        line = mock.stdout.readline()
        if not line.startswith("listening on "):
            print("FAIL: the mock did not start", file=sys.stderr)
            return 1
        a.base = line.split()[-1]
    if not a.base:
        ap.error("--base or --mock")
    a.base = a.base.rstrip("/")
    shots = a.screenshots or tempfile.mkdtemp(prefix="zilla-webui-shots.")
    os.makedirs(shots, exist_ok=True)
    print("screenshots in", shots, flush=True)
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(a.base))
    b = Browser()
    rc = 0
    try:
        parts = a.parts.split(",")
        if "dashboard" in parts:
            dashboard(b, a.base, shots, a.pool, a.volume)
        if "worksheet" in parts:
            worksheet(b, a.base, shots, a.volume)
        if "statistics" in parts:
            every_statistic(b, a.base, shots)
        b.pump(0.5)
        foreign = [u for u in b.requests if not (u.startswith(origin + "/") or u.startswith(("about:", "data:")))]
        check(b.requests and not foreign, f"all {len(b.requests)} requests went to {origin}" + (f"; not these: {foreign[:5]}" if foreign else ""))
        exceptions = [c for c in b.console if c.startswith("exception") or "Content Security Policy" in c or "Failed to load resource" in c]
        check(not exceptions, f"no uncaught exceptions, policy violations or failed loads in the pages {exceptions[:3]}")
    except (Failed, TimeoutError, LookupError, RuntimeError) as e:
        print("FAIL:", e, file=sys.stderr)
        for c in b.console[-10:]:
            print("  console:", c, file=sys.stderr)
        try:
            b.screenshot(os.path.join(shots, "failure.png"))
            print("  screenshot of the failure:", os.path.join(shots, "failure.png"), file=sys.stderr)
        except Exception:  # the browser may be gone
            pass
        rc = 1
    finally:
        b.close()
        if mock:
            mock.terminate()
            mock.wait()
    return rc


if __name__ == "__main__":
    sys.exit(main())
