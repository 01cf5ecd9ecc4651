#!/usr/bin/env python3
"""Adversarial HTTP cases against the web/API port (raw sockets, exact bytes).

    http_attack.py PORT hosts          # Host / absolute-URI variants: status per case
    http_attack.py PORT origins        # Origin on writes
    http_attack.py PORT live-share     # per-client and total live-stream shares, leaks
    http_attack.py PORT live-slow STALL_S   # a client reading 1 byte every few seconds

Prints "HELD ..." / "FAILED ..." lines; exits 1 when any FAILED.
"""

import socket
import sys
import time

PORT = int(sys.argv[1])
BAD = []
DS = "/api/v1/analytics/datasets/io.ops/client"
LIVE = "/api/v1/analytics/live?dataset=io.ops/op"


def verdict(ok, what):
    print(("HELD " if ok else "FAILED ") + what, flush=True)
    if not ok:
        BAD.append(what)


def raw(request, source="127.0.0.1", family=socket.AF_INET, dest="127.0.0.1"):
    """Send raw request bytes; return (status code or None, first 200 bytes of the body)."""
    s = socket.socket(family)
    s.bind((source, 0))
    s.settimeout(5)
    s.connect((dest, PORT))
    s.sendall(request)
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            part = s.recv(4096)
            if not part:
                break
            got += part
        head, _, body = got.partition(b"\r\n\r\n")
        try:
            body += s.recv(400)
        except socket.timeout:
            pass
    except (socket.timeout, ConnectionResetError):
        head, body = got, b""
    s.close()
    line = head.split(b"\r\n", 1)[0].split()
    return (int(line[1]) if len(line) > 1 else None), body[:200]


def get(target, headers, method="GET", version="HTTP/1.1", body=b""):
    lines = [f"{method} {target} {version}"] + headers + ["Connection: close"]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def hosts():
    p = PORT
    cases = [
        # (Host header value or None, request target, expected codes, note)
        ("localhost.evil.example", "/api/v1/volumes", {421}, "localhost. prefix"),
        (f"127.0.0.1.evil.example:{p}", "/api/v1/volumes", {421}, "address prefix"),
        (f"evil@127.0.0.1:{p}", "/api/v1/volumes", {400, 421}, "userinfo"),
        ("2130706433", "/api/v1/volumes", {400, 421}, "decimal IPv4"),
        ("0x7f.1", "/api/v1/volumes", {400, 421}, "hex IPv4"),
        ("0177.0.0.1", "/api/v1/volumes", {400, 421}, "octal IPv4"),
        ("127.1", "/api/v1/volumes", {400, 421}, "short IPv4"),
        (f"[fe80::1%25lo]:{p}", "/api/v1/volumes", {400, 421}, "IPv6 zone id"),
        (f"[::ffff:127.0.0.1]:{p}", "/api/v1/volumes", {200}, "IPv4-mapped literal"),
        ("LOCALHOST.", "/api/v1/volumes", {200}, "upper case with trailing dot"),
        ("evil.localhost", "/api/v1/volumes", {200}, "*.localhost (by design)"),
        (".localhost", "/api/v1/volumes", {400, 421}, "empty label"),
        ("localhost..", "/api/v1/volumes", {400, 421}, "two trailing dots"),
        ("localhost:80:80", "/api/v1/volumes", {400, 421}, "two ports"),
        ("localhost:99999", "/api/v1/volumes", {400}, "port out of range"),
        ("localhost:", "/api/v1/volumes", {400}, "empty port"),
        ("", "/api/v1/volumes", {400}, "empty Host"),
        ("attacker.example\t", "/api/v1/volumes", {421}, "trailing tab"),
        ("  attacker.example", "/api/v1/volumes", {421}, "leading spaces"),
        ("attacker.example, 127.0.0.1", "/api/v1/volumes", {400, 421}, "comma list"),
        ("127.0.0.1 attacker.example", "/api/v1/volumes", {400, 421}, "space inside"),
        ("attacker.example%2e", "/api/v1/volumes", {400, 421}, "percent"),
        ("xn--80ak6aa92e.com", "/api/v1/volumes", {421}, "punycode"),
        ("a" * 300 + ".localhost", "/api/v1/volumes", {400, 421}, "name over 253"),
        (f"127.0.0.1:{p}", "http://attacker.example/api/v1/volumes", {421}, "absolute URI foreign, Host ok"),
        ("attacker.example", f"http://127.0.0.1:{p}/api/v1/volumes", {421}, "absolute URI ok, Host foreign"),
        (f"127.0.0.1:{p}", f"http://attacker.example@127.0.0.1:{p}/api/v1/volumes", {200, 400, 421}, "absolute URI userinfo"),
        (f"127.0.0.1:{p}", f"http://127.0.0.1@attacker.example/api/v1/volumes", {400, 421}, "absolute URI userinfo foreign"),
        (None, "http://attacker.example/api/v1/volumes", {421, 400}, "absolute URI, no Host"),
        (f"127.0.0.1:{p}", "//attacker.example/api/v1/volumes", {200, 400, 404, 421}, "scheme-relative target"),
        (f"127.0.0.1:{p}", "attacker.example:80", {400, 404, 421}, "authority-form target on GET"),
    ]
    for host, target, want, note in cases:
        headers = [] if host is None else [f"Host: {host}"]
        code, body = raw(get(target, headers))
        verdict(code in want, f"hosts {note}: Host {host!r} target {target[:60]!r} -> {code} (want {sorted(want)})")
    # two Host headers, in both orders
    for pair in (["Host: 127.0.0.1", "Host: attacker.example"], ["Host: attacker.example", "Host: 127.0.0.1"]):
        code, _ = raw(get("/api/v1/volumes", pair))
        verdict(code in (400, 421), f"hosts two Host headers {pair} -> {code}")
    # X-Forwarded-Host ignored, and does not matter
    code, _ = raw(get("/api/v1/volumes", ["Host: attacker.example", "X-Forwarded-Host: 127.0.0.1"]))
    verdict(code == 421, f"hosts X-Forwarded-Host 127.0.0.1 with foreign Host -> {code}")
    # HTTP/1.0 without Host: allowed to read; a write with a browser Origin refused
    code, _ = raw(get("/api/v1/volumes", [], version="HTTP/1.0"))
    verdict(code == 200, f"hosts HTTP/1.0 without Host GET -> {code}")
    body = b'{"enabled": false}'
    code, _ = raw(get(DS, ["Origin: http://attacker.example", "Content-Type: application/json"], "PUT", "HTTP/1.0", body))
    verdict(code == 403, f"hosts HTTP/1.0 without Host, PUT with foreign Origin -> {code}")
    code, _ = raw(get(DS, ["Origin: http://127.0.0.1", "Content-Type: application/json"], "PUT", "HTTP/1.0", body))
    verdict(code == 403, f"hosts HTTP/1.0 without Host, PUT with Origin http://127.0.0.1 -> {code}")


def origins():
    p = PORT
    body = b'{"enabled": false}'
    cases = [
        # (Host, Origin, method, want, note)
        (f"127.0.0.1:{p}", f"http://127.0.0.1:{p}", "PUT", {200}, "same origin"),
        (f"127.0.0.1:{p}", f"HTTP://127.0.0.1:{p}", "PUT", {200}, "scheme upper case"),
        (f"127.0.0.1:{p}", "null", "PUT", {403}, "null"),
        (f"127.0.0.1:{p}", "NULL", "PUT", {403}, "NULL"),
        (f"127.0.0.1:{p}", "", "PUT", {403}, "empty Origin"),
        (f"127.0.0.1:{p}", f"http://127.0.0.1:{p}/", "PUT", {403, 200}, "trailing slash"),
        (f"127.0.0.1:{p}", f"http://localhost:{p}", "PUT", {403}, "localhost vs 127.0.0.1"),
        (f"127.0.0.1:{p}", f"http://[::ffff:127.0.0.1]:{p}", "PUT", {403}, "mapped v6 origin"),
        (f"127.0.0.1:{p}", f"http://127.0.0.1:{p + 1}", "PUT", {403}, "other port"),
        (f"127.0.0.1:{p}", f"ws://127.0.0.1:{p}", "PUT", {403}, "ws scheme"),
        (f"127.0.0.1:{p}", f"file://127.0.0.1:{p}", "PUT", {403}, "file scheme"),
        (f"127.0.0.1:{p}", f"http://127.0.0.1:0{p}", "PUT", {403, 200}, "port with leading zero"),
        (f"127.0.0.1:{p}", f"http://user@127.0.0.1:{p}", "PUT", {403}, "userinfo origin"),
        (f"localhost:{p}", f"http://LOCALHOST.:{p}", "PUT", {200, 403}, "localhost case and dot"),
        (f"evil.localhost:{p}", f"http://evil.localhost:{p}", "PUT", {200}, "*.localhost same origin"),
        # Host without a port: the browser omits it only for the scheme's default (80)
        ("127.0.0.1", "http://127.0.0.1:3000", "PUT", {403}, "Host without port vs Origin on another port"),
        ("localhost", "http://localhost:8000", "PUT", {403}, "Host localhost (port 80 implied) vs Origin localhost:8000"),
        ("127.0.0.1:80", "http://127.0.0.1", "PUT", {200}, "Host :80 vs Origin default port"),
        (f"127.0.0.1:{p}", "http://attacker.example", "FOO", {403, 405}, "custom method foreign Origin"),
        (f"127.0.0.1:{p}", "http://attacker.example", "DELETE", {403}, "DELETE foreign Origin"),
        (f"127.0.0.1:{p}", "http://attacker.example", "POST", {403}, "POST foreign Origin"),
        (f"127.0.0.1:{p}", "http://attacker.example", "PATCH", {403}, "PATCH foreign Origin"),
        (f"127.0.0.1:{p}", "http://attacker.example", "OPTIONS", {405, 200, 204}, "OPTIONS foreign Origin (safe)"),
        (f"127.0.0.1:{p}", "http://attacker.example", "TRACE", {405, 403}, "TRACE"),
    ]
    for host, origin, method, want, note in cases:
        headers = [f"Host: {host}", f"Origin: {origin}", "Content-Type: application/json"]
        code, resp = raw(get(DS, headers, method, body=body))
        verdict(code in want, f"origins {note}: {method} Host {host} Origin {origin!r} -> {code} (want {sorted(want)})")
    # two Origin headers: ours first, foreign second (browsers send one; informational)
    code, _ = raw(get(DS, [f"Host: 127.0.0.1:{p}", f"Origin: http://127.0.0.1:{p}", "Origin: http://attacker.example",
                           "Content-Type: application/json"], "PUT", body=body))
    print(f"INFO origins two Origin headers (own first) -> {code}")
    # does the PUT take text/plain (a no-preflight form body)? a cross-site one must be 403 anyway
    code, _ = raw(get(DS, [f"Host: 127.0.0.1:{p}", "Origin: http://attacker.example", "Content-Type: text/plain"], "PUT", body=body))
    verdict(code == 403, f"origins text/plain PUT foreign Origin -> {code}")


def open_live(source="127.0.0.1", family=socket.AF_INET, dest="127.0.0.1", rcvbuf=None):
    s = socket.socket(family)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((source, 0))
    s.settimeout(5)
    s.connect((dest, PORT))
    s.sendall(f"GET {LIVE} HTTP/1.1\r\nHost: 127.0.0.1:{PORT}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        part = s.recv(1)
        if not part:
            return s, None
        head += part
    return s, int(head.split()[1])


def live_share():
    # the share of one address
    held = []
    for n in range(4):
        s, code = open_live()
        held.append(s)
        verdict(code == 200, f"live-share stream {n + 1} from 127.0.0.1 -> {code}")
    s, code = open_live()
    verdict(code == 429, f"live-share 5th stream from 127.0.0.1 -> {code}")
    s.close()
    for s in held:
        s.close()
    time.sleep(2.5)
    # open and close many times, in several ways; then the full share must come back
    t0 = time.monotonic()
    refused = 0
    for n in range(1000):
        mode = n % 4
        s = socket.socket()
        s.settimeout(5)
        s.connect(("127.0.0.1", PORT))
        s.sendall(f"GET {LIVE} HTTP/1.1\r\nHost: 127.0.0.1:{PORT}\r\n\r\n".encode())
        if mode == 0:
            s.close()                                   # gone before the answer
        elif mode == 1:
            head = s.recv(200)                          # headers read, then close
            refused += b" 429 " in head or b" 503 " in head
            s.close()
        elif mode == 2:                                 # reset (SO_LINGER 0)
            import struct as st
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, st.pack("ii", 1, 0))
            s.close()
        else:                                           # half-close: FIN our side, keep reading
            s.shutdown(socket.SHUT_WR)
            s.recv(200)
            s.close()
        if n % 50 == 49:
            time.sleep(1.2)                             # let a tick notice the dead ones
    print(f"INFO live-share 1000 opens/closes in {time.monotonic() - t0:.0f} s, {refused} refused on the way")
    time.sleep(2.5)
    held = []
    codes = []
    for n in range(4):
        s, code = open_live()
        held.append(s)
        codes.append(code)
    verdict(codes == [200] * 4, f"live-share after 1000 open/close: 4 streams -> {codes}")
    # total: 16 over 4 addresses, the 17th refused
    more = []
    for src in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        for n in range(4):
            s, code = open_live(src)
            more.append((s, code))
    codes = [c for _, c in more]
    s, code = open_live("127.0.0.5")
    verdict(codes == [200] * 12 and code == 503, f"live-share total: 12 more -> {set(codes)}, 17th -> {code}")
    s.close()
    for s in held + [m[0] for m in more]:
        s.close()
    time.sleep(2.5)
    s, code = open_live("127.0.0.9")
    verdict(code == 200, f"live-share after closing all 16: new stream -> {code}")
    s.close()
    # refused requests take nothing: bad dataset, unknown parameter, foreign Host
    for req in (f"GET /api/v1/analytics/live?dataset=nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                f"GET /api/v1/analytics/live?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                f"GET {LIVE} HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"):
        for _ in range(50):
            raw(req.encode())
    time.sleep(1.5)
    codes = []
    held = []
    for n in range(4):
        s, code = open_live()
        held.append(s)
        codes.append(code)
    verdict(codes == [200] * 4, f"live-share after 150 refused live requests: 4 streams -> {codes}")
    for s in held:
        s.close()


def live_slow(stall_s):
    """A client that reads one byte every stall_s*0.8 seconds, small receive buffer."""
    time.sleep(2.5)
    s, code = open_live(rcvbuf=2048)
    got = 0
    t0 = time.monotonic()
    cut = None
    while time.monotonic() - t0 < stall_s * 8:
        time.sleep(stall_s * 0.8)
        try:
            b = s.recv(1)
        except (ConnectionResetError, socket.timeout) as e:
            cut = str(e)
            break
        if not b:
            cut = "EOF"
            break
        got += 1
    print(f"INFO live-slow 1 byte per {stall_s * 0.8:.1f} s: read {got} bytes in {time.monotonic() - t0:.0f} s, cut={cut}")
    s.close()
    # and a reader of 100 bytes every stall_s*0.8 seconds (slower than the ~300 B/s stream)
    s, code = open_live(rcvbuf=2048)
    got = 0
    t0 = time.monotonic()
    cut = None
    while time.monotonic() - t0 < stall_s * 8:
        time.sleep(stall_s * 0.8)
        try:
            b = s.recv(100)
        except (ConnectionResetError, socket.timeout) as e:
            cut = str(e)
            break
        if not b:
            cut = "EOF"
            break
        got += len(b)
    print(f"INFO live-slow 100 bytes per {stall_s * 0.8:.1f} s: read {got} bytes in {time.monotonic() - t0:.0f} s, cut={cut}")


if __name__ == "__main__":
    what = sys.argv[2]
    if what == "hosts":
        hosts()
    elif what == "origins":
        origins()
    elif what == "live-share":
        live_share()
    elif what == "live-slow":
        live_slow(float(sys.argv[3]))
    sys.exit(1 if BAD else 0)
