// Shared helpers of the dashboard and the worksheet. Every request goes to the page's
// own origin (relative URLs); nothing is fetched from anywhere else.
"use strict";
const Z = (() => {
  async function json(url, opts) {
    const r = await fetch(url, Object.assign({ headers: { Accept: "application/json" } }, opts || {}));
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) throw new Error((body && body.error) || (r.status + " " + r.statusText + " from " + url));
    return body;
  }
  const UNITS = ["B", "K", "M", "G", "T", "P", "E"];
  function bytes(n) {
    if (n == null) return "-";
    let i = 0;
    while (Math.abs(n) >= 1024 && i < UNITS.length - 1) { n /= 1024; i++; }
    return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)) + UNITS[i];
  }
  function num(n, digits) {
    if (n == null || !isFinite(n)) return "-";
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(2) + "G";
    if (a >= 1e6) return (n / 1e6).toFixed(2) + "M";
    if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
    return a >= 100 || Number.isInteger(n) ? String(Math.round(n)) : n.toFixed(digits == null ? 1 : digits);
  }
  function ns(n) {
    if (n == null) return "-";
    if (n < 1e3) return Math.round(n) + "ns";
    if (n < 1e6) return +(n / 1e3).toPrecision(3) + "us";
    if (n < 1e9) return +(n / 1e6).toPrecision(3) + "ms";
    return +(n / 1e9).toPrecision(3) + "s";
  }
  // Control characters, bidi overrides and invisible format characters in names are
  // shown as the text \u{...}, as every other output of Zilla shows them.
  const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]/g;
  function printable(s) {
    return String(s).replace(UNSAFE, (c) => "\\u{" + c.charCodeAt(0).toString(16) + "}");
  }
  // el("tag", {attr: v, class: "x", onclick: f}, child, "text", ...); text is printable()
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "class") e.className = v;
      else if (k === "style") e.style.cssText = v;
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) if (c != null) e.append(c instanceof Node ? c : printable(c));
    return e;
  }
  function time(t) { return new Date(t * 1000).toLocaleTimeString(); }
  // A long name shortened from the left to `max` characters ("…disks/d1"): the end of
  // a device path is what tells disks apart. Show the whole name as the title.
  function tail(s, max) {
    s = printable(s);
    return s.length <= max ? s : "\u2026" + s.slice(s.length - max + 1);
  }
  // Statistics of a histogram in the catalog's buckets (edges: {lower, upper}; counts:
  // a Map or [bucket, count] pairs): events, mean and percentiles, each event taken at
  // its bucket's middle (the mean) or placed evenly across its bucket (percentiles).
  // The open top bucket is taken as [lower, 2 x lower).
  function histStats(counts, edges) {
    const pairs = [...(counts instanceof Map ? counts.entries() : counts)].filter((p) => p[1] > 0).sort((a, b) => a[0] - b[0]);
    const range = (b) => {
      const lo = edges.lower[b] || 0, up = edges.upper[b];
      return [lo, up == null ? Math.max(2 * lo, 1) : up];
    };
    let n = 0, sum = 0;
    for (const [b, c] of pairs) { const [lo, hi] = range(b); n += c; sum += c * (lo + hi) / 2; }
    const pct = (q) => {
      if (!n) return null;
      const rank = q * n;
      let seen = 0;
      for (const [b, c] of pairs) {
        if (seen + c >= rank) { const [lo, hi] = range(b); return lo + (hi - lo) * Math.max(0, rank - seen) / c; }
        seen += c;
      }
      return range(pairs[pairs.length - 1][0])[1];
    };
    return { count: n, mean: n ? sum / n : null, p50: pct(0.5), p99: pct(0.99) };
  }
  // Add sparse [bucket, count] pairs into the Map `into`.
  function addBuckets(into, pairs) {
    for (const [b, c] of pairs || []) into.set(b, (into.get(b) || 0) + c);
    return into;
  }
  // A device key of the analytics (disk.*/device) as tree levels: the pool, a class of
  // devices (logs, cache, ...), a vdev (mirror-0, raidz1-0, ...), the leaf (its name
  // may hold `/`: a path).
  const CLASS_RE = /^(logs|cache|spares|special|dedup)$/;
  const VDEV_RE = /^(mirror|raidz[123]?|draid[123]?|replacing|spare)(-\d+)?$/;
  function devicePath(key) {
    const parts = key.split("/"), out = [parts[0]];
    let i = 1;
    if (i < parts.length - 1 && CLASS_RE.test(parts[i])) out.push(parts[i++]);
    if (i < parts.length - 1 && VDEV_RE.test(parts[i])) out.push(parts[i++]);
    if (i < parts.length) out.push(parts.slice(i).join("/"));
    return out;
  }
  return { json, bytes, num, ns, el, time, printable, tail, histStats, addBuckets, CLASS_RE, devicePath };
})();
