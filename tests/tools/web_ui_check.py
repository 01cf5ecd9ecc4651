#!/usr/bin/env python3
"""Drive the web UI in headless chromium and check what it draws (used by
tests/system/45_web_ui.sh; runs alone against the analytics mock with --mock).

    web_ui_check.py --base http://127.0.0.1:8080 --pool tank --volume tank/vol0 \
        [--parts dashboard,worksheet] [--screenshots DIR]
    web_ui_check.py --mock [--screenshots DIR]     # tests/tools/analytics_mock.py

Dashboard: the pool (with health), its vdev tree and the volume are shown; under load
the I/O panel shows non-zero ops/s, bandwidth and latency (mean, p50, p99) for the
pool and the volume; device names are whole (and titled); log, cache and spare
devices sit in their own sections in zpool status's order; --gone pools are absent.
Worksheet: charts of io.ops/op, io.latency/op, disk.latency/device and io.ops/volume
get data points (the heat map non-zero cells) and keep getting live points; hover
over a heat-map cell shows its time, bucket and count; enabling io.ops/volume (PUT)
and clicking the volume's legend row highlights it and adds the drill-down chart
io.ops/volume+op filtered to VOLUME:*; dragging across a chart zooms every chart
and shows the range average panel; reopening the saved URL shows the same charts,
zoom and highlight; the latency heat map's range average gives mean, p50 and p99; the
device legend shows every leaf's name (shortened from the left, distinct, the whole
name as its title) and nothing of a --gone pool or a --removed device.
Every request the page made went to the page's origin.
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


def status_leaves(base, pool):
    """(role, leaf name) of every leaf of POOL in /api/v1/status."""
    st = json.load(urllib.request.urlopen(base + "/api/v1/status?pool=" + pool, timeout=10))
    out = []

    def walk(n, role):
        if not n["children"]:
            out.append((role, n["name"]))
        for c in n["children"]:
            walk(c, role)
    for top in st[0]["config"]:
        walk(top, top["role"])
    return out


def dashboard(b, base, shots, pool, volume, gone):
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
    scan_row = q(f'[data-scan="{pool}"]')
    scan = b.eval(f"(() => {{ const r = {scan_row}; return r ? [r.dataset.scanState, r.textContent] : null; }})()")
    check(scan is not None and scan[0] == "finished" and f"{pool}: scrub finished" in scan[1] and "0 errors" in scan[1],
          f"the scan line shows {pool}'s finished scrub with 0 errors (shows {scan})")
    dashboard_io(b, pool, volume)
    dashboard_devices(b, base, pool)
    for g in gone:
        absent = b.eval(f"![...document.querySelectorAll('[data-pool],[data-vdev],[data-io],[data-scan]')].some((e) => "
                        f"Object.values(e.dataset).some((v) => v === {json.dumps(g)} || v.startsWith({json.dumps(g + '/')})))")
        check(absent, f"destroyed pool {g} is nowhere on the dashboard")
    b.screenshot(os.path.join(shots, "dashboard.png"))


def dashboard_io(b, pool, volume):
    """Under load: ops/s, bandwidth and latency (mean <= p99, p50 <= p99) for the pool and the volume."""
    for kind, name in (("pool", pool), ("volume", volume)):
        row = q(f'#io-table tr[data-io="{name}"][data-io-kind="{kind}"]')
        b.wait(f"(() => {{ const r = {row}; return r && ['ops', 'bytes', 'mean', 'p50', 'p99'].every((k) => Number(r.dataset[k]) > 0); }})()",
               20, f"non-zero ops, bandwidth and latency for {kind} {name} in the I/O panel")
        d = b.eval(f"Object.assign({{text: {row}.textContent}}, {row}.dataset)")
        p50, p99, mean = float(d["p50"]), float(d["p99"]), float(d["mean"])
        check(p50 <= p99 and mean <= p99 * 1.01, f"{kind} {name}: {float(d['ops']):.0f} ops/s, {float(d['bytes']):.0f} B/s, "
              f"latency mean {mean:.0f} p50 {p50:.0f} p99 {p99:.0f} ns: {d['text']!r}")


def dashboard_devices(b, base, pool):
    """Every leaf's whole name shown (and as title); logs, cache, spares sections in zpool's order."""
    leaves = status_leaves(base, pool)
    shown = b.eval(f"[...document.querySelectorAll({json.dumps(f'#vdev-table tr[data-vdev^={chr(34)}{pool}/{chr(34)}] td.device')})]"
                   ".map((td) => [td.textContent, td.title, td.scrollWidth <= td.clientWidth + 1])")
    texts = [t for t, _, _ in shown]
    for _, name in leaves:
        check(name in texts and any(t == name and title == name and fits for t, title, fits in shown),
              f"device {name} shown whole in the vdev tree")
    order = b.eval("[...document.querySelectorAll('#vdev-table tr')].map((r) => r.dataset.section ? 'section:' + r.dataset.section : (r.dataset.vdev || ''))")
    sections = [o.split(":", 1)[1] for o in order if o.startswith("section:")]
    roles = {r for r, _ in leaves}
    want = [f"{pool}/{s}" for r, s in (("log", "logs"), ("cache", "cache"), ("spare", "spares")) if r in roles]
    check(sections == want, f"the vdev tree has the sections {want} in zpool status's order (has {sections})")
    for role, section in (("log", "logs"), ("cache", "cache"), ("spare", "spares")):
        if role not in roles:
            continue
        start = order.index(f"section:{pool}/{section}")
        end = next((i for i in range(start + 1, len(order)) if order[i].startswith("section:") or "/" not in order[i]), len(order))
        members = {o for o in order[start + 1:end]}
        for r, name in leaves:
            if r == role:
                check(any(m.endswith("/" + name) for m in members), f"{role} device {name} is under {section}")
            elif any(m.endswith("/" + name) for m in members):
                raise Failed(f"{r} device {name} is listed under {section}")


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


def device_legend(b, base, pool, gone, removed):
    """Each leaf of POOL in the device legend: distinct visible names that end as the
    whole name does, the whole name as title, the value column in view; nothing of a
    destroyed pool or a removed device."""
    dl = chart("disk.latency/device")
    with_roles = status_leaves(base, pool)
    leaves = [name for _, name in with_roles]
    busy = [name for role, name in with_roles if role in ("normal", "log")]  # under fio load with fsyncs
    b.wait(f"(() => {{ const have = [...{q(dl)}.querySelectorAll('.legend tr[data-key]')].map((r) => r.dataset.key); "
           f"return {json.dumps(busy)}.every((n) => have.some((k) => k.endsWith('/' + n))); }})()",
           20, f"every data and log device in the device legend {busy}")
    rows = b.eval(f"""(() => {{ const side = {q(dl)}.querySelector('.side').getBoundingClientRect();
        return [...{q(dl)}.querySelectorAll('.legend tr[data-key]:not([data-tree])')].map((r) => {{
          const label = r.children[1], value = r.lastElementChild.getBoundingClientRect();
          return [r.dataset.key, label.textContent, label.title,
                  [Math.round(value.right), Math.round(side.right), label.scrollWidth, label.clientWidth]]; }}); }})()""")
    mine = [r for r in rows if r[0].startswith(pool + "/")]
    texts = [t for _, t, _, _ in mine]
    check(len(set(texts)) == len(texts), f"device legend names are distinct: {texts}")
    for key, text, title, (value_right, side_right, label_scroll, label_client) in mine:
        fits = value_right <= side_right + 1 and label_scroll <= label_client + 1
        leaf = next((n for n in leaves if key.endswith("/" + n)), None)
        check(leaf is not None and title == leaf and fits and (text == leaf or (text.startswith("\u2026") and leaf.endswith(text[1:]))),
              f"legend row {key}: shows {text!r} in view, title {title!r} "
              f"(value column ends at {value_right} of {side_right} px; label {label_scroll} of {label_client} px)")
    keys = [r[0] for r in rows] + b.eval(f"[...{q(dl)}.querySelectorAll('.legend tr[data-key]')].map((r) => r.dataset.key)")
    for g in gone:
        check(not any(k == g or k.startswith(g + "/") for k in keys), f"destroyed pool {g} is not in the device legend")
    for r in removed:
        check(not any(k.endswith("/" + r) for k in keys), f"removed device {r} is not in the device legend")


def worksheet(b, base, shots, volume, gone=(), removed=()):
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
    device_legend(b, base, pool, gone, removed)
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
    lat = chart("io.latency/op") + " .range-average"
    b.wait(f"!{q(lat)}.hidden", 5, "the heat map's range average")
    stats = b.eval(f"[...{q(lat)}.querySelectorAll('tr[data-key], tr.total')].map((r) => Object.assign({{text: r.textContent}}, r.dataset))")
    good = [r for r in stats if all(float(r.get(k) or 0) > 0 for k in ("mean", "p50", "p99")) and float(r["p50"]) <= float(r["p99"])]
    check(good and len(good) >= len([r for r in stats if float(r.get("value") or 0) > 0]),
          f"the heat map's range average gives mean, p50 and p99: {[r['text'] for r in stats]}")
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
    ap.add_argument("--gone", action="append", default=[], help="a destroyed pool: absent from the dashboard and the legends")
    ap.add_argument("--removed", action="append", default=[], help="a device removed from --pool: absent from the legends")
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
            dashboard(b, a.base, shots, a.pool, a.volume, a.gone)
        if "worksheet" in parts:
            worksheet(b, a.base, shots, a.volume, a.gone, a.removed)
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
