// The dashboard: pools, the vdev tree with error counters, volumes, scrub/resilver
// progress, ARC/L2ARC/ZIL, from the read-only /api/v1 routes, refreshed every 3 s.
"use strict";
(() => {
  const { el, bytes, num } = Z;
  const REFRESH_MS = 3000;
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
        el("td", {}, pool), el("td", { style: "text-align:left" }, n.name + (n.role && n.role !== "normal" && depth === 1 ? " (" + n.role + ")" : "")),
        el("td", { class: "health-" + n.state }, n.state),
        errs.map((e) => el("td", { class: e ? "nonzero" : "" }, num(e))),
        el("td", { class: "muted", style: "text-align:left" }, n.note || "")));
      vdevRows(pool, n.children, depth + 1, out);
    }
  }

  function vdevTable(status) {
    const rows = [];
    for (const st of status) {
      rows.push(el("tr", { "data-vdev": st.name, "data-state": st.state },
        el("td", {}, st.name), el("td", { style: "text-align:left" }, st.name), el("td", { class: "health-" + st.state }, st.state),
        el("td", {}), el("td", {}), el("td", {}), el("td", { class: "muted", style: "text-align:left" }, st.unavailable || "")));
      vdevRows(st.name, st.config, 1, rows);
    }
    return el("table", { id: "vdev-table" },
      el("tr", {}, ["Pool", "Device", "State", "Read", "Write", "Cksum", ""].map((h, i) => el("th", i === 1 ? { style: "text-align:left" } : {}, h))), rows);
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
      const [pools, status, volumes, arc, zil] = await Promise.all(
        ["pools", "status", "volumes", "arcstats", "zilstats"].map((r) => Z.json("/api/v1/" + r)));
      replace("pools", poolsTable(pools));
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
