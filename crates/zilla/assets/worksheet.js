// The analytics worksheet: datasets (a statistic broken down by one breakdown) drawn
// live, counters as stacked areas per breakdown key, histograms (latency, size) as
// heat maps (time on x, log value on y, colour for the count).
//
// Data: /api/v1/analytics/datasets (catalog, bucket edges), one
// /api/v1/analytics/query per chart for the history (last 5 minutes, or the zoomed
// range), then one /api/v1/analytics/live event stream for all charts (one point a
// second). Every request goes to this page's origin.
//
// State lives in the URL hash so a saved URL reopens the same worksheet:
//   #ds=io.latency/op&ds=io.ops/volume+op|tank/v1:*&from=T&to=T&hl=read
// (ds: a dataset, optionally `|` and a filter of comma-separated keys, `*` matching
// any text; from/to: the zoomed range in unix seconds, absent when following live;
// hl: the highlighted breakdown key.)
//
// For tests the DOM says what is drawn: each chart `[data-dataset]` with
// `data-kind`, `data-points` (times with data), heat maps `data-cells-nonzero`
// (cells drawn), legend rows `[data-key]` with `data-value`, the hover box
// `.hover[data-time]`, the range average panel `.range-average` with `[data-key]` rows
// (a histogram's with `data-mean`, `data-p50`, `data-p99` in its unit, and a
// `tr.total` row for all its keys together).
//
// Legends list what exists now: a key of a destroyed pool or volume, or of a device
// no longer in its pool (replaced, detached, removed), leaves the legend (its history
// stays drawn); the pools, their devices and the volumes are read every 5 s.
"use strict";
(() => {
  const { el } = Z;
  const LIVE_WINDOW_S = 300;
  const POINTS_MAX = 3600; // per chart, as the query answers at most
  const LIVE_DATASETS_MAX = 8; // per event stream (contract)
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#7b4173", "#3182bd", "#e6550d"];
  // black, blue, cyan, yellow, red, white: faint cells are blue, not black
  const HEAT_STOPS = [[0, 0, 0], [20, 40, 200], [0, 220, 255], [255, 230, 0], [230, 20, 20], [255, 255, 255]];
  const HEAT_MIN = 0.14; // a cell with a count of 1 still shows

  const S = { catalog: null, charts: [], hl: null, from: null, to: null, now: null, stream: null, streamKey: "", present: null };
  const PRESENT_REFRESH_MS = 5000;
  const LABEL_CHARS_MAX = 24; // longer legend names are shortened from the left
  const AVERAGE_LABEL_CHARS_MAX = 16; // in a histogram's range average (four more columns)
  const $ = (id) => document.getElementById(id);
  window.zillaWorksheet = S; // for tests and the console: charts, their data and plots

  // ---------------------------------------------------------------- URL hash state
  function decode(s) { try { return decodeURIComponent(s); } catch (e) { return s; } }
  function readHash() {
    const st = { ds: [], from: null, to: null, hl: null };
    for (const part of location.hash.replace(/^#/, "").split("&")) {
      if (!part) continue;
      const i = part.indexOf("=");
      const k = i < 0 ? part : part.slice(0, i);
      const v = i < 0 ? "" : decode(part.slice(i + 1));
      if (k === "ds" && v) {
        const j = v.indexOf("|");
        st.ds.push({ name: j < 0 ? v : v.slice(0, j), filter: j < 0 || j === v.length - 1 ? null : v.slice(j + 1) });
      } else if ((k === "from" || k === "to") && /^\d+$/.test(v)) st[k] = Number(v);
      else if (k === "hl" && v) st.hl = v;
    }
    if (st.from == null || st.to == null || st.to <= st.from) st.from = st.to = null;
    return st;
  }
  function enc(s) {
    return encodeURIComponent(s).replace(/%2F/g, "/").replace(/%2B/g, "+").replace(/%7C/g, "|")
      .replace(/%3A/g, ":").replace(/%2C/g, ",").replace(/%2A/g, "*");
  }
  function writeHash() {
    const parts = S.charts.map((c) => "ds=" + enc(c.name + (c.filter ? "|" + c.filter : "")));
    if (S.from != null) parts.push("from=" + S.from, "to=" + S.to);
    if (S.hl != null) parts.push("hl=" + enc(S.hl));
    const h = "#" + parts.join("&");
    if (location.hash !== h) history.replaceState(null, "", h);
  }

  // ---------------------------------------------------------------- helpers
  function globMatch(pattern, key) {
    const re = new RegExp("^" + pattern.split("*").map((p) => p.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*") + "$");
    return re.test(key);
  }
  function passes(filter, key) {
    return !filter || filter.split(",").some((p) => globMatch(p, key)) || key === "other";
  }
  function fmt(unit, v) {
    if (v == null) return "-";
    if (unit === "ns") return Z.ns(v);
    if (unit === "bytes") return Z.bytes(v);
    if (unit === "B/s") return Z.bytes(v) + "/s";
    return Z.num(v) + (unit ? " " + unit : "");
  }
  // colour `c` (#rrggbb) mixed with white, fraction f of white
  function whiten(c, f) {
    const n = parseInt(c.slice(1), 16);
    return "rgb(" + [16, 8, 0].map((sh) => Math.round(((n >> sh) & 255) * (1 - f) + 255 * f)).join(",") + ")";
  }
  function heatColor(t) {
    const x = Math.max(0, Math.min(1, t)) * (HEAT_STOPS.length - 1);
    const i = Math.min(HEAT_STOPS.length - 2, Math.floor(x)), f = x - i;
    const a = HEAT_STOPS[i], b = HEAT_STOPS[i + 1];
    return "rgb(" + [0, 1, 2].map((k) => Math.round(a[k] + (b[k] - a[k]) * f)).join(",") + ")";
  }
  // key highlighted: the key itself or, for the device tree, a node above it
  // (or, in a drill-down's keys, the key it was drilled from: `tank/v1` in `tank/v1:read`)
  function isHl(key) {
    return S.hl != null && (key === S.hl || key.startsWith(S.hl + "/") || key.startsWith(S.hl + ":") || key.endsWith(":" + S.hl));
  }

  const { CLASS_RE, devicePath } = Z;
  const CLASS_ORDER = ["dedup", "special", "logs", "cache", "spares"];

  // ---------------------------------------------------------------- what exists now
  // {pools: Map pool -> Set of its vdev names (every level), volumes: Set}, or null
  async function readPresent() {
    try {
      const [status, volumes] = await Promise.all([Z.json("/api/v1/status"), Z.json("/api/v1/volumes")]);
      const pools = new Map();
      const names = (nodes, into) => (nodes || []).forEach((n) => { into.add(n.name); names(n.children, into); });
      for (const st of status) {
        const set = new Set();
        names(st.config, set);
        pools.set(st.name, set);
      }
      S.present = { pools, volumes: new Set(volumes.map((v) => v.name)) };
    } catch (e) {
      return; // not known: keep what was known
    }
    for (const c of S.charts) c.renderLegend();
  }
  // Does `key` of chart `c` name something that exists now (or that is not known)?
  function present(c, key) {
    const p = S.present;
    if (!p || key === "other") return true;
    const volume = (v) => p.volumes.has(v);
    switch (c.breakdown) {
      case "pool": return p.pools.has(key);
      case "device": {
        const path = devicePath(key), names = p.pools.get(path[0]);
        return !!names && names.has(path[path.length - 1]);
      }
      case "volume": return volume(key);
      case "volume+op": return volume(key.slice(0, key.lastIndexOf(":")));
      default: return true;
    }
  }

  // ---------------------------------------------------------------- one chart
  class Chart {
    constructor(name, filter) {
      this.name = name;
      this.filter = filter;
      const [statistic, breakdown] = name.split("/");
      this.statistic = statistic;
      this.breakdown = breakdown;
      this.meta = (S.catalog.datasets || []).find((d) => d.name === name) || null;
      this.kind = this.meta ? this.meta.kind : "counter";
      this.unit = this.meta ? this.meta.unit : "";
      this.times = [];
      this.series = new Map(); // key -> {values: [], buckets: [], color}
      this.resolution = 1;
      this.plot = null;
      this.build();
    }
    build() {
      this.hover = el("div", { class: "hover" });
      this.plotBox = el("div", { class: "plot" }, this.hover);
      this.legend = el("table", { class: "legend" });
      this.average = el("div", { class: "range-average", hidden: true });
      this.note = el("span", { class: "muted" });
      this.root = el("section", {
        class: "card chart-card", "data-dataset": this.name, "data-filter": this.filter || "", "data-kind": this.kind,
        "data-points": 0,
      },
      el("div", { class: "chart-head" },
        el("h2", {}, this.name + (this.filter ? " (" + this.filter + ")" : "")),
        el("span", { class: "muted" }, this.meta ? this.meta.description + " (" + this.unit + ")" : ""),
        this.note,
        el("button", { class: "close", title: "Remove", onclick: () => removeChart(this) }, "✕")),
      el("div", { class: "chart" }, this.plotBox, el("div", { class: "side" }, this.legend, this.average)));
      if (this.kind === "histogram") {
        this.root.dataset.cellsNonzero = "0";
        // the colour key: a count of 1 .. the largest cell count, log-scaled
        const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => heatColor(HEAT_MIN + (1 - HEAT_MIN) * t));
        this.heatMax = el("span", {}, "");
        this.legend.before(el("div", { class: "muted heat-key" }, "events per cell: 1 ",
          el("span", { class: "heat-scale", style: "background:linear-gradient(to right," + stops.join(",") + ")" }), " ", this.heatMax));
      }
      if (!this.meta) this.note.textContent = "unknown dataset";
      else if (!this.meta.enabled) this.showEnable();
    }
    showEnable() {
      this.note.replaceChildren("off (not collected) ", el("button", { class: "enable", onclick: () => this.enable() }, "Enable"));
    }
    async enable() {
      try {
        this.meta = await setEnabled(this.statistic, this.breakdown, true);
        this.note.textContent = "";
        await this.load();
        restartStream();
      } catch (e) {
        this.note.textContent = "cannot enable: " + e.message;
      }
    }
    // history: the zoomed range, or the last 5 minutes
    async load() {
      const to = S.from != null ? S.to : S.now;
      const from = S.from != null ? S.from : S.now - LIVE_WINDOW_S;
      let url = "/api/v1/analytics/query?dataset=" + encodeURIComponent(this.name) + "&from=" + from + "&to=" + to;
      if (to - from > POINTS_MAX) url += "&resolution=60"; // a long saved range: minutes
      if (this.filter) url += "&filter=" + encodeURIComponent(this.filter);
      try {
        const q = await Z.json(url);
        this.resolution = q.resolution || 1;
        this.times = q.times.slice(-POINTS_MAX);
        const skip = q.times.length - this.times.length;
        this.series = new Map();
        for (const s of q.series) {
          if (!passes(this.filter, s.key)) continue;
          this.series.set(s.key, {
            values: s.values.slice(skip),
            buckets: s.buckets ? s.buckets.slice(skip) : null,
            color: COLORS[this.series.size % COLORS.length],
          });
        }
      } catch (e) {
        this.note.textContent = e.message;
      }
      this.render();
    }
    // one live point: {series: [{key, value, buckets}]}, or undefined (not collected)
    ingest(time, d) {
      const n = this.times.length;
      if (n && time <= this.times[n - 1]) return;
      this.times.push(time);
      const seen = new Set();
      for (const s of d ? d.series : []) {
        if (!passes(this.filter, s.key)) continue;
        let ser = this.series.get(s.key);
        if (!ser) {
          ser = { values: new Array(n).fill(null), buckets: new Array(n).fill(null), color: COLORS[this.series.size % COLORS.length] };
          this.series.set(s.key, ser);
        }
        ser.values.push(s.value);
        if (ser.buckets) ser.buckets.push(s.buckets || []);
        seen.add(s.key);
      }
      for (const [k, ser] of this.series) {
        if (seen.has(k)) continue;
        ser.values.push(d ? 0 : null);
        if (ser.buckets) ser.buckets.push(d ? [] : null);
      }
      // bounded: the live window (or the zoomed range), at most POINTS_MAX points
      const keepFrom = S.from != null ? Math.min(S.from, time - POINTS_MAX) : time - LIVE_WINDOW_S - 5;
      let drop = 0;
      while (drop < this.times.length && (this.times[drop] < keepFrom || this.times.length - drop > POINTS_MAX)) drop++;
      if (drop) {
        this.times.splice(0, drop);
        for (const ser of this.series.values()) {
          ser.values.splice(0, drop);
          if (ser.buckets) ser.buckets.splice(0, drop);
        }
      }
    }
    xRange() { return S.from != null ? [S.from, S.to] : [S.now - LIVE_WINDOW_S, S.now]; }
    pointsWithData() {
      let n = 0;
      for (let i = 0; i < this.times.length; i++) {
        for (const ser of this.series.values()) if (ser.values[i] != null) { n++; break; }
      }
      return n;
    }
    keys() { return [...this.series.keys()]; }
    // ------------------------------------------------ counters: stacked areas
    counterData() {
      const keys = this.keys();
      const cum = [];
      let below = this.times.map(() => 0);
      for (const k of keys) {
        const v = this.series.get(k).values;
        below = below.map((b, i) => (v[i] == null || b == null ? null : b + v[i]));
        cum.push(below);
      }
      // drawn top first, so each lower area covers the one above it down to zero
      return [this.times, ...cum.reverse()];
    }
    counterOpts() {
      const keys = this.keys().reverse();
      return {
        series: [{}, ...keys.map((k) => {
          const c = this.series.get(k).color;
          const dim = () => S.hl != null && !isHl(k) && this.keys().some(isHl);
          return {
            // opaque fills: each area covers the one drawn before it without blending
            label: k, stroke: () => (dim() ? whiten(c, 0.7) : c), width: 1,
            fill: () => whiten(c, dim() ? 0.88 : 0.25), points: { show: false },
          };
        })],
        scales: { x: { time: true, range: () => this.xRange() }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.05)] } },
        axes: [{}, { values: (u, vals) => vals.map((v) => (v == null ? "" : fmt(this.unit, v))), size: 90 }],
      };
    }
    // ------------------------------------------------ histograms: heat map
    mergedBuckets(i) {
      const m = new Map();
      let any = false;
      for (const [k, ser] of this.series) {
        if (S.hl != null && this.keys().some(isHl) && !isHl(k)) continue;
        const b = ser.buckets && ser.buckets[i];
        if (!b) continue;
        any = true;
        for (const [bucket, count] of b) m.set(bucket, (m.get(bucket) || 0) + count);
      }
      return any ? m : null;
    }
    edges(bucket) {
      const lower = S.catalog.buckets.lower, upper = S.catalog.buckets.upper;
      let lo = lower[bucket], hi = upper[bucket];
      if (hi == null) hi = lo * 2;
      if (!lo) lo = hi / 2;
      return [lo, hi];
    }
    bucketAt(value) {
      const lower = S.catalog.buckets.lower;
      let lo = 0, hi = lower.length - 1;
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (lower[mid] <= value) lo = mid; else hi = mid - 1;
      }
      return lo;
    }
    heatRange() {
      let bmin = Infinity, bmax = -Infinity;
      for (const ser of this.series.values()) {
        for (const b of ser.buckets || []) for (const [bucket, count] of b || []) {
          if (count > 0) { bmin = Math.min(bmin, bucket); bmax = Math.max(bmax, bucket); }
        }
      }
      if (bmin === Infinity) return [1024, 1 << 24];
      const lo = this.edges(Math.max(0, bmin - 2))[0], hi = this.edges(Math.min(S.catalog.buckets.lower.length - 1, bmax + 2))[1];
      return [lo, hi];
    }
    drawHeat(u) {
      const ctx = u.ctx, bb = u.bbox;
      ctx.save();
      ctx.fillStyle = "#000";
      ctx.fillRect(bb.left, bb.top, bb.width, bb.height);
      ctx.beginPath();
      ctx.rect(bb.left, bb.top, bb.width, bb.height);
      ctx.clip();
      const [xmin, xmax] = [u.scales.x.min, u.scales.x.max];
      const cols = [];
      let max = 0;
      for (let i = 0; i < this.times.length; i++) {
        const t = this.times[i];
        if (t < xmin || t - this.resolution > xmax) continue;
        const m = this.mergedBuckets(i);
        if (!m) continue;
        cols.push([t, m]);
        for (const c of m.values()) max = Math.max(max, c);
      }
      let cells = 0;
      const logMax = Math.log1p(max);
      for (const [t, m] of cols) {
        const x0 = u.valToPos(t - this.resolution, "x", true), x1 = u.valToPos(t, "x", true);
        for (const [bucket, count] of m) {
          if (count <= 0) continue;
          const [lo, hi] = this.edges(bucket);
          const y0 = u.valToPos(lo, "y", true), y1 = u.valToPos(hi, "y", true);
          ctx.fillStyle = heatColor(HEAT_MIN + (1 - HEAT_MIN) * (logMax > 0 ? Math.log1p(count) / logMax : 1));
          ctx.fillRect(Math.floor(x0), Math.floor(y1), Math.max(1, Math.ceil(x1 - x0)), Math.max(1, Math.ceil(y0 - y1)));
          cells++;
        }
      }
      ctx.restore();
      this.root.dataset.cellsNonzero = String(cells);
      this.root.dataset.countMax = String(max);
      this.heatMax.textContent = String(max);
    }
    heatOpts() {
      return {
        series: [{}, { label: "count", stroke: "transparent", points: { show: false } }],
        scales: {
          x: { time: true, range: () => this.xRange() },
          y: { distr: 3, log: 2, range: () => this.heatRange() },
        },
        axes: [{}, { values: (u, vals) => vals.map((v) => (v == null ? "" : fmt(this.unit === "bytes" ? "bytes" : "ns", v))), size: 90 }],
        hooks: { drawSeries: [], draw: [(u) => this.drawHeat(u)] },
      };
    }
    // ------------------------------------------------ the plot, hover, selection
    render() {
      if (S.now == null) return;
      const data = this.kind === "histogram" ? [this.times, this.times.map(() => null)] : this.counterData();
      const keys = this.keys().join("\n");
      if (!this.plot || this.plotKeys !== keys) {
        if (this.plot) this.plot.destroy();
        this.plotKeys = keys;
        const base = this.kind === "histogram" ? this.heatOpts() : this.counterOpts();
        const opts = Object.assign(base, {
          width: Math.max(300, this.plotBox.clientWidth || 800), height: 260,
          legend: { show: false },
          cursor: { drag: { x: true, y: false, setScale: false }, points: { show: false } },
          select: { show: true },
        });
        opts.hooks = Object.assign(opts.hooks || {}, {
          setCursor: [(u) => this.showHover(u)],
          setSelect: [(u) => this.selected(u)],
        });
        this.plot = new uPlot(opts, data, this.plotBox);
      } else {
        this.plot.setData(data);
      }
      this.root.dataset.points = String(this.pointsWithData());
      this.renderLegend();
      this.renderAverage();
    }
    showHover(u) {
      const i = u.cursor.idx, h = this.hover;
      if (i == null || u.cursor.left < 0 || this.times[i] == null) {
        h.style.display = "none";
        return;
      }
      const t = this.times[i];
      h.dataset.time = String(t);
      let text = Z.time(t);
      if (this.kind === "histogram") {
        const v = u.posToVal(u.cursor.top, "y");
        const bucket = this.bucketAt(v);
        const [lo, hi] = this.edges(bucket);
        const m = this.mergedBuckets(i);
        const count = m ? m.get(bucket) || 0 : 0;
        const upper = S.catalog.buckets.upper[bucket];
        const f = (x) => fmt(this.unit === "bytes" ? "bytes" : "ns", x);
        text += "  " + f(S.catalog.buckets.lower[bucket]) + " .. " + (upper == null ? "∞" : f(hi)) + ": " + count;
        Object.assign(h.dataset, { bucket: String(bucket), lower: String(lo), count: String(count) });
      } else {
        const rows = this.legendKeys().map((k) => [k, this.series.get(k).values[i]]).filter((r) => r[1] != null)
          .sort((a, b) => b[1] - a[1]).slice(0, 6);
        text += rows.map(([k, v]) => "  " + k + " " + fmt(this.unit, v)).join("");
        h.dataset.values = String(rows.length);
      }
      h.textContent = Z.printable(text);
      h.style.display = "block";
      h.style.left = Math.min(u.cursor.left + u.bbox.left / devicePixelRatio + 12, this.plotBox.clientWidth - 200) + "px";
      h.style.top = Math.max(0, u.cursor.top - 24) + "px";
    }
    selected(u) {
      if (u.select.width < 3) return;
      const from = Math.floor(u.posToVal(u.select.left, "x")), to = Math.ceil(u.posToVal(u.select.left + u.select.width, "x"));
      u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
      if (to > from) zoom(from, to);
    }
    // ------------------------------------------------ legend (and device tree)
    current(key) {
      const v = this.series.get(key).values;
      for (let i = v.length - 1; i >= 0; i--) if (v[i] != null) return v[i];
      return null;
    }
    valueUnit() { return this.kind === "histogram" ? "ops/s" : this.unit; }
    legendRow(key, label, value, depth, color, node) {
      const cls = [isHl(key) || key === S.hl ? "hl" : S.hl != null && this.keys().some(isHl) ? "dim" : "", "tree-" + depth].join(" ");
      return el("tr", {
        class: cls, "data-key": key, "data-value": value == null ? "" : value, "data-tree": node ? "node" : null,
        onclick: () => clickKey(this, key),
      },
      el("td", { class: "swatch" }, color ? el("span", { style: "background:" + color }) : null),
      el("td", { class: "label", title: Z.printable(label) }, Z.tail(label, LABEL_CHARS_MAX)), el("td", {}, fmt(this.valueUnit(), value)));
    }
    // the keys that exist now (all of them while that is not known)
    legendKeys() { return this.keys().filter((k) => present(this, k)); }
    renderLegend() {
      const rows = [];
      if (this.breakdown === "device") {
        // the pool's tree from the `/`-separated keys: pool, [logs|cache|...], vdev, leaf
        const root = { children: new Map() };
        for (const k of this.legendKeys()) {
          let node = root, path = "";
          for (const part of devicePath(k)) {
            path = path ? path + "/" + part : part;
            if (!node.children.has(part)) node.children.set(part, { name: part, path, children: new Map(), sum: 0 });
            node = node.children.get(part);
            node.sum += this.current(k) || 0;
          }
          node.leaf = k;
        }
        // zpool status's order: data vdevs, then the classes (dedup, special, logs, cache, spares)
        const rank = (n) => { const m = CLASS_RE.exec(n.name); return m ? 1 + CLASS_ORDER.indexOf(m[1]) : 0; };
        const walk = (node, depth) => {
          const kids = [...node.children.values()].sort((a, b) => (rank(a) - rank(b)) || a.name.localeCompare(b.name));
          for (const n of kids) {
            const leaf = n.leaf != null && !n.children.size;
            rows.push(this.legendRow(n.path, n.name, leaf ? this.current(n.leaf) : n.sum, depth, leaf ? this.series.get(n.leaf).color : null, !leaf));
            walk(n, depth + 1);
          }
        };
        walk(root, 0);
      } else {
        for (const k of this.legendKeys()) rows.push(this.legendRow(k, k, this.current(k), 0, this.series.get(k).color, false));
      }
      this.legend.replaceChildren(el("tr", {}, el("th", {}), el("th", {}, this.breakdown), el("th", {}, "now")), ...rows);
    }
    renderAverage() {
      if (S.from == null) {
        this.average.hidden = true;
        return;
      }
      const inRange = (t) => t > S.from && t <= S.to;
      const hist = this.kind === "histogram", edges = S.catalog.buckets;
      const all = new Map();
      let allSeconds = 0;
      const rows = [];
      for (const k of this.keys()) {
        const ser = this.series.get(k);
        let sum = 0, n = 0;
        const merged = new Map();
        this.times.forEach((t, i) => {
          if (!inRange(t) || ser.values[i] == null) return;
          sum += ser.values[i];
          n++;
          if (hist && ser.buckets) Z.addBuckets(merged, ser.buckets[i]);
        });
        allSeconds = Math.max(allSeconds, n);
        const avg = n ? sum / n : null;
        if (hist) merged.forEach((c, b) => all.set(b, (all.get(b) || 0) + c));
        const label = this.breakdown === "device" ? devicePath(k).pop() : k; // a device by its leaf's name
        rows.push(this.averageRow({ "data-key": k, title: k }, label, avg, hist ? Z.histStats(merged, edges) : null));
      }
      if (hist && rows.length > 1) {
        const st = Z.histStats(all, edges);
        rows.push(this.averageRow({ class: "total" }, "all", allSeconds ? st.count / allSeconds : null, st));
      }
      const head = el("tr", {}, el("th", {}), el("th", {}, this.valueUnit()), hist ? ["mean", "p50", "p99"].map((h) => el("th", {}, h)) : null);
      this.average.hidden = false;
      this.average.replaceChildren(el("h3", {}, "Range average " + Z.time(S.from) + " – " + Z.time(S.to)), el("table", {}, head, rows));
    }
    // one row of the range average: the key's rate, and a histogram's mean and percentiles
    averageRow(attrs, label, avg, st) {
      const unit = this.unit === "bytes" ? "bytes" : "ns";
      const stat = (name) => (st ? [el("td", {}, fmt(unit, st[name]))] : []);
      const data = st ? { "data-mean": st.mean == null ? "" : st.mean, "data-p50": st.p50 == null ? "" : st.p50, "data-p99": st.p99 == null ? "" : st.p99 } : {};
      return el("tr", Object.assign({ "data-value": avg == null ? "" : avg }, data, attrs, { title: null }),
        el("td", { class: "label", title: Z.printable(attrs.title || label) }, Z.tail(label, st ? AVERAGE_LABEL_CHARS_MAX : LABEL_CHARS_MAX)),
        el("td", {}, st ? Z.num(avg) : fmt(this.valueUnit(), avg)), stat("mean"), stat("p50"), stat("p99"));
    }
    resize() { if (this.plot) this.plot.setSize({ width: Math.max(300, this.plotBox.clientWidth), height: 260 }); }
    destroy() { if (this.plot) this.plot.destroy(); this.root.remove(); }
  }

  // ---------------------------------------------------------------- worksheet actions
  async function setEnabled(statistic, breakdown, enabled) {
    const d = await Z.json("/api/v1/analytics/datasets/" + statistic + "/" + breakdown, {
      method: "PUT", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify({ enabled }),
    });
    const i = S.catalog.datasets.findIndex((x) => x.name === d.name);
    if (i >= 0) S.catalog.datasets[i] = d; else S.catalog.datasets.push(d);
    renderPicker();
    return d;
  }

  function addChart(name, filter, opts) {
    const existing = S.charts.find((c) => c.name === name && (c.filter || null) === (filter || null));
    if (existing) return existing;
    const c = new Chart(name, filter || null);
    if (opts && opts.drilledFrom) c.root.dataset.drilledFrom = opts.drilledFrom;
    S.charts.push(c);
    $("charts").append(c.root);
    writeHash();
    return c;
  }

  function removeChart(c) {
    S.charts = S.charts.filter((x) => x !== c);
    c.destroy();
    writeHash();
    restartStream();
  }

  // the dataset one level further: STAT/A+B filtered to `key:*` (or `*:key`)
  function drillTarget(c, key) {
    const stat = (S.catalog.statistics || []).find((s) => s.name === c.statistic);
    if (!stat || key === "other") return null;
    if (c.breakdown === "none") return stat.breakdowns.includes("op") ? { name: c.statistic + "/op", filter: null } : null;
    for (const b of stat.breakdowns) {
      const parts = b.split("+");
      if (parts.length !== 2) continue;
      if (parts[0] === c.breakdown) return { name: c.statistic + "/" + b, filter: key + ":*" };
      if (parts[1] === c.breakdown) return { name: c.statistic + "/" + b, filter: "*:" + key };
    }
    return null;
  }

  async function clickKey(c, key) {
    S.hl = S.hl === key ? null : key;
    writeHash();
    renderAll();
    if (S.hl == null) return;
    const t = drillTarget(c, key);
    if (!t) return;
    const d = addChart(t.name, t.filter, { drilledFrom: c.name + ":" + key });
    // a drill-down asks for the dataset: turn it on when it is off
    if (d.meta && !d.meta.enabled) await d.enable(); else { await d.load(); restartStream(); }
  }

  function zoom(from, to) {
    S.from = from;
    S.to = to;
    writeHash();
    showMode();
    renderAll();
  }

  async function backToLive() {
    S.from = S.to = null;
    writeHash();
    showMode();
    await Promise.all(S.charts.map((c) => c.load()));
  }

  function showMode() {
    $("mode").textContent = S.from != null ? "zoomed: " + Z.time(S.from) + " – " + Z.time(S.to) : "live, last 5 minutes";
    $("live").hidden = S.from == null;
  }

  function renderAll() { for (const c of S.charts) c.render(); }

  // one event stream for every chart's dataset (at most LIVE_DATASETS_MAX)
  function restartStream() {
    const names = [...new Set(S.charts.filter((c) => c.meta && c.meta.enabled).map((c) => c.name))].slice(0, LIVE_DATASETS_MAX);
    const key = names.join("&");
    if (key === S.streamKey && S.stream) return;
    if (S.stream) S.stream.close();
    S.stream = null;
    S.streamKey = key;
    if (!names.length) return;
    const es = new EventSource("/api/v1/analytics/live?" + names.map((n) => "dataset=" + encodeURIComponent(n)).join("&"));
    es.addEventListener("point", (e) => {
      let p;
      try { p = JSON.parse(e.data); } catch (err) { return; }
      S.now = Math.max(S.now || 0, p.time);
      $("clock").textContent = Z.time(p.time);
      for (const c of S.charts) {
        if (names.includes(c.name)) c.ingest(p.time, p.datasets && p.datasets[c.name]);
      }
      renderAll();
      $("error").textContent = "";
    });
    es.onerror = () => {
      $("error").textContent = "live stream interrupted; reconnecting";
      // a refused stream (503: too many subscribers) is not retried by the browser
      if (es.readyState === EventSource.CLOSED && S.stream === es) {
        S.stream = null;
        setTimeout(() => { if (!S.stream) { S.streamKey = ""; restartStream(); } }, 5000);
      }
    };
    S.stream = es;
  }

  // ---------------------------------------------------------------- picker
  function renderPicker() {
    const stats = S.catalog.statistics || [];
    const sel = $("statistic"), bsel = $("breakdown");
    const cur = sel.value;
    sel.replaceChildren(...stats.map((s) => el("option", { value: s.name, selected: s.name === cur }, s.name + " (" + s.unit + ")")));
    const stat = stats.find((s) => s.name === sel.value) || stats[0];
    const bcur = bsel.value;
    bsel.replaceChildren(...(stat ? stat.breakdowns : []).map((b) => {
      const d = S.catalog.datasets.find((x) => x.name === stat.name + "/" + b);
      return el("option", { value: b, selected: b === bcur }, b + (d && d.enabled ? "" : " (off)"));
    }));
    $("memory").textContent = S.catalog.memory_max_bytes
      ? "analytics memory " + Z.bytes(S.catalog.memory_bytes) + " of " + Z.bytes(S.catalog.memory_max_bytes) : "";
    pickerChanged();
  }

  function pickerChanged() {
    const name = $("statistic").value + "/" + $("breakdown").value;
    const d = S.catalog.datasets.find((x) => x.name === name);
    const box = $("enable-box");
    box.replaceChildren();
    if (d && !d.enabled) {
      box.append(el("span", { class: "muted" }, name + " is off "), el("button", {
        id: "enable", onclick: async () => {
          try { await setEnabled(d.statistic, d.breakdown, true); } catch (e) { $("error").textContent = e.message; }
        },
      }, "Enable"));
    }
  }

  async function addFromPicker() {
    const name = $("statistic").value + "/" + $("breakdown").value;
    const c = addChart(name, null);
    await c.load();
    restartStream();
  }

  // ---------------------------------------------------------------- start
  async function start() {
    try {
      S.catalog = await Z.json("/api/v1/analytics/datasets");
    } catch (e) {
      $("error").textContent = "Analytics are not available: " + e.message;
      $("worksheet").dataset.ready = "error";
      return;
    }
    S.now = S.catalog.now;
    $("statistic").addEventListener("change", () => { $("breakdown").value = ""; renderPicker(); });
    $("breakdown").addEventListener("change", pickerChanged);
    $("add").addEventListener("click", addFromPicker);
    $("live").addEventListener("click", backToLive);
    renderPicker();
    const st = readHash();
    S.from = st.from;
    S.to = st.to;
    S.hl = st.hl;
    const specs = st.ds.length ? st.ds : S.catalog.datasets.filter((d) => d.enabled && d.default).map((d) => ({ name: d.name, filter: null }));
    for (const s of specs) addChart(s.name, s.filter);
    showMode();
    await Promise.all(S.charts.map((c) => c.load()));
    restartStream();
    readPresent();
    setInterval(readPresent, PRESENT_REFRESH_MS);
    window.addEventListener("resize", () => S.charts.forEach((c) => c.resize()));
    // a hash typed or pasted by hand (ours are written with replaceState, no event)
    window.addEventListener("hashchange", () => location.reload());
    $("worksheet").dataset.ready = "1";
  }
  start();
})();
