#!/usr/bin/env python3
"""A small Chrome DevTools Protocol client for browser tests (standard library only).

Starts Debian's `chromium --headless=new` with its own profile directory and a
DevTools port, talks to the first page over a minimal WebSocket client (RFC 6455:
client frames masked, text and continuation frames, ping/pong, close), and offers
what the web UI tests need:

    with Browser() as b:
        b.open("http://127.0.0.1:8080/")            # navigate, wait for the load event
        b.eval("document.title")                     # JS expression -> Python value
        b.wait("document.querySelector('#x')", 10)   # until truthy, or TimeoutError
        x, y = b.center("#pool-table")               # element centre, CSS pixels
        b.hover(x, y); b.click(x, y); b.drag(x0, y0, x1, y1)
        b.screenshot("/tmp/page.png")
        b.requests                                   # every request URL the page made
        b.console                                    # console messages, exceptions, browser log
"""

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from urllib.parse import urlsplit


class WebSocket:
    """A client WebSocket over one TCP connection (no extensions, no TLS)."""

    def __init__(self, url, timeout=30):
        u = urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = u.path + ("?" + u.query if u.query else "")
        req = (f"GET {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("WebSocket handshake: connection closed")
            head += chunk
        head, self.buf = head.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise ConnectionError(f"WebSocket handshake refused: {status.decode(errors='replace')}")

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise ConnectionError("WebSocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def send(self, text):
        self._send_frame(0x1, text.encode())

    def recv(self, timeout=None):
        """The next text message (str); socket.timeout when none within `timeout`."""
        self.sock.settimeout(timeout)
        message = b""
        while True:
            b0, b1 = self._read(2)
            opcode, fin = b0 & 0x0F, b0 & 0x80
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            if opcode == 0x8:
                raise ConnectionError("WebSocket closed by the browser")
            message += payload
            if fin:
                return message.decode()

    def close(self):
        try:
            self._send_frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Browser:
    """One headless chromium with one page, driven over CDP."""

    def __init__(self, chromium=None, width=1400, height=1000, timeout=30):
        self.chromium = chromium or os.environ.get("CHROMIUM") or shutil.which("chromium") or "chromium"
        self.profile = tempfile.mkdtemp(prefix="zilla-chromium.")
        self.port = free_port()
        self.timeout = timeout
        self.requests = []  # every request URL the page made (Network.requestWillBeSent)
        self.console = []  # console messages and uncaught exceptions
        self._next_id = 0
        self._events = []
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            [self.chromium, "--headless=new", f"--remote-debugging-port={self.port}", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "--no-first-run",
             "--no-default-browser-check", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-features=Translate,OptimizationHints,MediaRouter", "--metrics-recording-only",
             "--hide-scrollbars", "--mute-audio", "about:blank"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.ws = WebSocket(self._page_ws_url(), timeout=timeout)
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _page_ws_url(self):
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self.proc.returncode} (log: {self.log.name})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                    for t in json.load(r):
                        if t.get("type") == "page":
                            return t["webSocketDebuggerUrl"]
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("chromium's DevTools port did not answer")

    # ------------------------------------------------------------ protocol
    def _dispatch(self, msg):
        method = msg.get("method")
        p = msg.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requests.append(p["request"]["url"])
        elif method == "Runtime.consoleAPICalled":
            self.console.append(p.get("type", "log") + ": " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Log.entryAdded":  # browser messages: CSP violations, failed loads
            e = p.get("entry", {})
            self.console.append(f"log-{e.get('level')}: {e.get('source')}: {e.get('text')} {e.get('url', '')}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.console.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
        self._events.append(msg)
        del self._events[:-200]

    def call(self, method, **params):
        self._next_id += 1
        mid = self._next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.time() + self.timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError(f"no answer to {method}")
            msg = json.loads(self.ws.recv(timeout=left))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._dispatch(msg)

    def pump(self, seconds):
        """Process events for `seconds` (requests keep being recorded)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                self._dispatch(json.loads(self.ws.recv(timeout=max(0.01, deadline - time.time()))))
            except socket.timeout:
                break

    # ------------------------------------------------------------ page
    def open(self, url, timeout=None):
        self._events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.time() + (timeout or self.timeout)
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            if time.time() > deadline:
                raise TimeoutError(f"{url} did not load")
            self.pump(0.2)

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise RuntimeError(f"JS error in {expression!r}: {d.get('exception', {}).get('description') or d.get('text')}")
        return r.get("result", {}).get("value")

    def wait(self, expression, timeout=10, what=None):
        """Evaluate until truthy; its value, or TimeoutError saying what was awaited."""
        deadline = time.time() + timeout
        while True:
            v = self.eval(expression)
            if v:
                return v
            if time.time() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what or expression}")
            self.pump(0.25)

    def center(self, selector):
        r = self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                      " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                      " return [r.left + r.width / 2, r.top + r.height / 2, r.left, r.top, r.width, r.height]; })()")
        if r is None:
            raise LookupError(f"no element {selector}")
        return r

    def _mouse(self, kind, x, y, **kw):
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **kw)

    def hover(self, x, y):
        self._mouse("mouseMoved", x, y)

    def click(self, x, y):
        self._mouse("mouseMoved", x, y)
        self._mouse("mousePressed", x, y, button="left", buttons=1, clickCount=1)
        self._mouse("mouseReleased", x, y, button="left", buttons=0, clickCount=1)

    def drag(self, x0, y0, x1, y1, steps=10):
        self._mouse("mouseMoved", x0, y0)
        self._mouse("mousePressed", x0, y0, button="left", buttons=1, clickCount=1)
        for i in range(1, steps + 1):
            self._mouse("mouseMoved", x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps, button="left", buttons=1)
        self._mouse("mouseReleased", x1, y1, button="left", buttons=0, clickCount=1)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def close(self):
        try:
            self.ws.close()
        except (OSError, AttributeError):
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        # chromium's helper processes may still write the profile for a moment after
        # the browser process exits
        for _ in range(10):
            shutil.rmtree(self.profile, ignore_errors=True)
            if not os.path.exists(self.profile):
                break
            time.sleep(0.2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
