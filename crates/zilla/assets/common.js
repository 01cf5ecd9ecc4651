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
  return { json, bytes, num, ns, el, time, printable };
})();
