// The dashboard: pools, their I/O and their volumes' (from the analytics history),
// the vdev tree with error counters, volumes, scrub/resilver progress, ARC/L2ARC/ZIL,
// from the read-only /api/v1 routes, refreshed every 3 s.
//
// I/O: the last IO_WINDOW_S seconds of the analytics history, averaged. A pool's
// figures are its devices' (as zpool iostat's pool row: every device but the cache
// devices), from disk.latency/device (operations are its counts) and
// disk.bytes/device; a volume's are its front-end requests', from io.latency/volume
// and io.bytes/volume. Mean and percentiles come from the latency histograms.
//
// For tests the DOM says what is shown: `#io-table tr[data-io]` (a pool or volume
// name) with `data-ops` (per second), `data-bytes` (per second), `data-mean`,
// `data-p50`, `data-p99` (ns; empty when nothing completed); `#vdev-table` section
// rows `tr[data-section="POOL/logs"]` (cache, spares) before their devices.
"use strict";
(() => {
  const { el, bytes, num } = Z;
  const REFRESH_MS = 3000;
  const IO_WINDOW_S = 5;
  const IO_DATASETS = {
    devLatency: "disk.latency/device", devBytes: "disk.bytes/device",
    volLatency: "io.latency/volume", volBytes: "io.bytes/volume",
  };
  const $ = (id) => document.getElementById(id);

  function replace(id, node) { const c = $(id); c.replaceChildren(node); }

  function bar(percent) {
    const p = Math.max(0, Math.min(100, percent));
    return el("span", { class: "bar" + (p >= 90 ? " full" : ""), title: p + "%" }, el("span", { style: "width:" + p + "%" }));
  }

  function poolsTable(pools) {
    if (!pools.length) return el("p", { class: "muted" }, "No pools.");
    return el("table", { id: "pool-table" },
      el("tr", {}, ["Name", "Health", "Size", "Allocated", "Free", "Capacity", "", "Frag"].map((h) => el("th", {}, h))),
      pools.map((p) => el("tr", { "data-pool": p.name },
        el("td", {}, p.name), el("td", { class: "health-" + p.health }, p.health),
        el("td", {}, bytes(p.size)), el("td", {}, bytes(p.alloc)), el("td", {}, bytes(p.free)),
        el("td", {}, p.cap_percent + "%"), el("td", {}, bar(p.cap_percent)), el("td", {}, p.frag_percent + "%"))));
  }

  /** zpool's secs_to_dhms: "00:01:05", "2 days 03:00:00". */
  function dhms(t) {
    const two = (n) => String(Math.floor(n)).padStart(2, "0");
    const days = Math.floor(t / 86400);
    const hms = two((t / 3600) % 24) + ":" + two((t / 60) % 60) + ":" + two(t % 60);
    return days > 0 ? days + " days " + hms : hms;
  }

  function scanRow(st) {
    const s = st.scan || {};
    const what = s.func || "scan";
    if (!s.state) return el("div", { "data-scan": st.name }, st.name + ": no scrub or resilver has run");
    const p = s.progress || null;
    const pct = p ? p.percent_done : 0;
    const parts = [st.name + ": " + what + " " + s.state];
    if (p) {
      // as zpool status: scanned and issued of the allocated bytes, rates, time to go
      const at = (r) => (r && s.state === "scanning" ? " at " + bytes(r) + "/s" : "");
      parts.push(bytes(s.examined_bytes) + " / " + bytes(s.to_examine_bytes) + " scanned" + at(p.scan_rate_bytes_per_s) +
        ", " + bytes(s.issued_bytes) + " / " + bytes(p.issue_total_bytes) + " issued" + at(p.issue_rate_bytes_per_s));
      parts.push(bytes(s.repaired_bytes) + (what === "resilver" ? " resilvered" : " repaired"));
      parts.push(pct.toFixed(2) + "% done");
      if (s.state === "scanning") parts.push(p.seconds_left != null ? dhms(p.seconds_left) + " to go" : "no estimated completion time");
    } else if (s.repaired_bytes) parts.push(bytes(s.repaired_bytes) + " repaired");
    parts.push(s.errors + " errors");
    if (s.end_time_s && s.state !== "scanning") parts.push("ended " + new Date(s.end_time_s * 1000).toLocaleString());
    return el("div", { "data-scan": st.name, "data-scan-state": s.state },
      (s.state === "scanning" || s.state === "paused") ? [bar(Math.round(pct)), " "] : null, parts.join(", "),
      st.trim && st.trim.state && st.trim.state !== "none" ? el("div", { class: "muted" }, "trim " + st.trim.state + ": " + bytes(st.trim.bytes_trimmed) + " trimmed") : null);
  }

  function vdevRows(pool, nodes, depth, out) {
    for (const n of nodes || []) {
      const errs = [n.read_errors, n.write_errors, n.cksum_errors];
      out.push(el("tr", { class: "tree-" + Math.min(depth, 3), "data-vdev": pool + "/" + n.name, "data-state": n.state },
        el("td", {}, pool), el("td", { class: "device", title: n.name }, n.name),
        el("td", { class: "health-" + n.state }, n.state),
        errs.map((e) => el("td", { class: e ? "nonzero" : "" }, num(e))),
        el("td", { class: "muted", style: "text-align:left" }, n.note || "")));
      vdevRows(pool, n.children, depth + 1, out);
    }
  }

  // zpool status's sections: the data vdevs under the pool, then logs, cache, spares
  const SECTIONS = [["log", "logs"], ["cache", "cache"], ["spare", "spares"]];

  function vdevTable(status) {
    const rows = [];
    for (const st of status) {
      rows.push(el("tr", { "data-vdev": st.name, "data-state": st.state },
        el("td", {}, st.name), el("td", { class: "device" }, st.name), el("td", { class: "health-" + st.state }, st.state),
        el("td", {}), el("td", {}), el("td", {}), el("td", { class: "muted", style: "text-align:left" }, st.unavailable || "")));
      const tops = st.config || [];
      vdevRows(st.name, tops.filter((n) => !SECTIONS.some(([role]) => role === n.role)), 1, rows);
      for (const [role, section] of SECTIONS) {
        const members = tops.filter((n) => n.role === role);
        if (!members.length) continue;
        rows.push(el("tr", { class: "section", "data-section": st.name + "/" + section },
          el("td", {}, st.name), el("td", { class: "device" }, section), el("td", { colspan: 5 })));
        vdevRows(st.name, members, 1, rows);
      }
    }
    return el("table", { id: "vdev-table" },
      el("tr", {}, ["Pool", "Device", "State", "Read", "Write", "Cksum", ""].map((h, i) => el("th", i === 1 ? { style: "text-align:left" } : {}, h))), rows);
  }

  // ------------------------------------------------------------ I/O from the history
  async function ioHistory() {
    const cat = await Z.json("/api/v1/analytics/datasets");
    const enabled = new Set(cat.datasets.filter((d) => d.enabled).map((d) => d.name));
    const answers = {};
    await Promise.all(Object.entries(IO_DATASETS).filter(([, name]) => enabled.has(name)).map(async ([k, name]) => {
      answers[k] = await Z.json("/api/v1/analytics/query?dataset=" + encodeURIComponent(name) +
        "&from=" + (cat.now - IO_WINDOW_S) + "&to=" + cat.now);
    }));
    return { cat, answers, off: Object.values(IO_DATASETS).filter((n) => !enabled.has(n)) };
  }

  // Seconds of `answer` with a point (a hole is no second); 0 without any key.
  function secondsWithData(answer) {
    if (!answer) return 0;
    return answer.times.filter((t, i) => answer.series.some((s) => s.values[i] != null)).length;
  }

  // The figures of the keys of the latency and bytes answers that `mine` picks:
  // {ops, bytes} per second, and the latency histogram's {mean, p50, p99}.
  function figures(latency, bytesAnswer, mine, edges) {
    const buckets = new Map();
    let bytesSum = 0;
    for (const s of latency ? latency.series : []) {
      if (mine(s.key)) (s.buckets || []).forEach((b) => Z.addBuckets(buckets, b));
    }
    for (const s of bytesAnswer ? bytesAnswer.series : []) {
      if (mine(s.key)) s.values.forEach((v) => { bytesSum += v || 0; });
    }
    const st = Z.histStats(buckets, edges);
    const ls = secondsWithData(latency), bs = secondsWithData(bytesAnswer);
    return { ops: ls ? st.count / ls : 0, bytes: bs ? bytesSum / bs : 0, mean: st.mean, p50: st.p50, p99: st.p99 };
  }

  function ioRow(kind, name, f, href, depth) {
    const cell = (v, text) => el("td", {}, v == null ? "-" : text);
    return el("tr", {
      class: "tree-" + depth, "data-io": name, "data-io-kind": kind, "data-ops": f.ops, "data-bytes": f.bytes,
      "data-mean": f.mean == null ? "" : f.mean, "data-p50": f.p50 == null ? "" : f.p50, "data-p99": f.p99 == null ? "" : f.p99,
    },
    el("td", {}, el("a", { href, title: "in the analytics worksheet" }, name)), el("td", { class: "muted" }, kind),
    cell(f.ops, num(f.ops)), cell(f.bytes, bytes(f.bytes) + "/s"),
    cell(f.mean, Z.ns(f.mean)), cell(f.p50, Z.ns(f.p50)), cell(f.p99, Z.ns(f.p99)));
  }

  function ioTable(pools, volumes, io) {
    const edges = io.cat.buckets, a = io.answers;
    const rows = [];
    for (const p of pools) {
      const mine = (key) => { const path = Z.devicePath(key); return path[0] === p.name && path[1] !== "cache"; };
      const ds = "ds=" + encodeURIComponent("disk.latency/device|" + p.name + "/*") + "&ds=" + encodeURIComponent("disk.bytes/device|" + p.name + "/*");
      rows.push(ioRow("pool", p.name, figures(a.devLatency, a.devBytes, mine, edges), "/ui/worksheet#" + ds, 0));
      for (const v of volumes.filter((v) => v.name.startsWith(p.name + "/"))) {
        const vds = "ds=" + encodeURIComponent("io.latency/volume|" + v.name) + "&ds=" + encodeURIComponent("io.bytes/volume|" + v.name);
        rows.push(ioRow("volume", v.name, figures(a.volLatency, a.volBytes, (key) => key === v.name, edges), "/ui/worksheet#" + vds, 1));
      }
    }
    const table = pools.length ? el("table", { id: "io-table" },
      el("tr", {}, ["Name", "", "Ops/s", "Bandwidth", "Latency mean", "p50", "p99"].map((h) => el("th", {}, h))), rows)
      : el("p", { class: "muted" }, "No pools.");
    const off = io.off.length ? el("p", { class: "muted", id: "io-off" }, "Not collected: " + io.off.join(", ") + " ",
      el("button", { onclick: () => enableIo(io.off) }, "Enable")) : null;
    return [table, off, el("p", { class: "muted" }, "Average of the last " + IO_WINDOW_S + " s. Pools: their devices (cache devices apart), as zpool iostat; volumes: client requests (NBD, iSCSI).")];
  }

  async function enableIo(names) {
    try {
      for (const n of names) {
        await Z.json("/api/v1/analytics/datasets/" + n, {
          method: "PUT", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify({ enabled: true }),
        });
      }
    } catch (e) {
      $("error").textContent = "Cannot enable: " + e.message;
    }
    refresh();
  }

  function volumesTable(volumes) {
    if (!volumes.length) return el("p", { class: "muted" }, "No volumes.");
    return el("table", { id: "volume-table" },
      el("tr", {}, ["Name", "Size", "Block", "Used", "Referenced", "Logical", "Reservation", "Available", "Read-only"].map((h) => el("th", {}, h))),
      volumes.map((v) => el("tr", { "data-volume": v.name },
        el("td", {}, el("a", { href: "/ui/worksheet#ds=" + encodeURIComponent("io.ops/volume+op|" + v.name + ":*") }, v.name)),
        el("td", {}, bytes(v.volsize)), el("td", {}, bytes(v.volblocksize)), el("td", {}, bytes(v.used)),
        el("td", {}, bytes(v.referenced)), el("td", {}, bytes(v.logicalused)),
        el("td", {}, v.refreservation ? bytes(v.refreservation) : "none"), el("td", {}, bytes(v.available)),
        el("td", {}, v.readonly ? "yes" : "no"))));
  }

  function kv(label, value, key) { return el("div", { class: "kv", "data-stat": key || label }, el("span", {}, label), el("span", {}, value)); }

  function ratio(h, m) { return h + m ? ((100 * h) / (h + m)).toFixed(1) + "%" : "-"; }

  function caches(arc, zil) {
    return [
      kv("ARC size", bytes(arc.size) + " of " + bytes(arc.c), "arc_size"),
      kv("ARC target max", bytes(arc.c_max)),
      kv("ARC hit ratio", ratio(arc.hits || 0, arc.misses || 0), "arc_hit_ratio"),
      kv("ARC hits / misses", num(arc.hits) + " / " + num(arc.misses)),
      kv("MRU / MFU", bytes(arc.mru_size) + " / " + bytes(arc.mfu_size)),
      kv("L2ARC size", arc.l2_size == null ? "no cache device" : bytes(arc.l2_size) + " (" + bytes(arc.l2_asize) + " allocated)", "l2_size"),
      kv("L2ARC hit ratio", ratio(arc.l2_hits || 0, arc.l2_misses || 0), "l2_hit_ratio"),
      kv("L2ARC read / written", bytes(arc.l2_read_bytes) + " / " + bytes(arc.l2_write_bytes)),
      kv("ZIL commits", num(zil.zil_commit_count), "zil_commit_count"),
      kv("ZIL records (itx)", num(zil.zil_itx_count)),
      kv("ZIL log blocks written", num(zil.zil_lwb_write_count)),
      kv("ZIL to slog", bytes(zil.zil_itx_metaslab_slog_bytes)),
      kv("Daemon RSS", bytes(arc.zilla_rss_bytes), "rss"),
    ];
  }

  async function refresh() {
    try {
      const [pools, status, volumes, arc, zil, io] = await Promise.all(
        ["pools", "status", "volumes", "arcstats", "zilstats"].map((r) => Z.json("/api/v1/" + r)).concat([ioHistory()]));
      replace("pools", poolsTable(pools));
      $("io").replaceChildren(...ioTable(pools, volumes, io).filter((n) => n));
      $("scans").replaceChildren(...(status.length ? status.map(scanRow) : [el("p", { class: "muted" }, "No pools.")]));
      replace("vdevs", vdevTable(status));
      replace("volumes", volumesTable(volumes));
      $("caches").replaceChildren(...caches(arc, zil));
      $("error").textContent = "";
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      const d = $("dashboard");
      d.dataset.loaded = String(Number(d.dataset.loaded) + 1);
    } catch (e) {
      $("error").textContent = "Cannot read the daemon: " + e.message;
    }
  }
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
