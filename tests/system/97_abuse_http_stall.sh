#!/usr/bin/env bash
# Goal: HTTP clients that stop reading cannot hold the daemon's HTTP connections.
# Method: http_connections_max = 16 and http_write_stall_timeout_s = 2; 16 clients
# each pipeline 256 requests for a 50 KiB asset with a 4 KiB receive buffer and never
# read. Within a few seconds the daemon must disconnect them (their sockets see EOF
# or a reset) and answer a new client. With the guard off (the stall timeout at its
# 60 s default) the new client would wait in the listen backlog: the test checks
# the stalled clients were cut before that could happen.
. "$(dirname "$0")/lib.sh"
cat >"$T/zilla.conf" <<'EOF'
http_connections_max = 16
http_write_stall_timeout_s = 2
EOF
start_daemon --config "$T/zilla.conf"
python3 - "$HTTP_PORT" <<'EOF' || fail "clients that stopped reading held the HTTP port"
import socket, sys, time
port = int(sys.argv[1])
# 256 x 50 KiB: more than the socket buffers hold (loopback autotunes the sender's
# to 4 MiB), so every one of these connections stalls
req = b"GET /ui/assets/vendor/uplot/uPlot.iife.min.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 256
stalled = []
for _ in range(16):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(req)
    stalled.append(s)
t0 = time.time()
# every slot is taken: a new client is served only once the daemon cuts a stalled one
new = socket.create_connection(("127.0.0.1", port), timeout=15)
new.sendall(b"GET /api/v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
reply = b""
while b"\r\n\r\n" not in reply:
    chunk = new.recv(4096)
    if not chunk:
        break
    reply += chunk
waited = time.time() - t0
status_line = reply.split(b"\r\n", 1)[0].decode(errors="replace")
print(f"a new client was answered after {waited:.1f} s: {status_line}")
assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
assert waited < 10, f"waited {waited:.1f} s"
# the stalled clients were disconnected: reading drains what was sent, then EOF/reset
# (a connection served to the end would deliver all 12.8 MB; a cut one ends with
# what the buffers held, at most a few MB). Reading now would restart a connection
# whose stall began later than the first one's: give every one the stall timeout.
time.sleep(3)
cut = 0
for s in stalled:
    s.settimeout(10)
    got = 0
    try:
        while got < (8 << 20):
            chunk = s.recv(1 << 20)
            if not chunk:
                cut += 1
                break
            got += len(chunk)
    except (ConnectionResetError, BrokenPipeError):
        cut += 1
    except socket.timeout:
        pass
print(f"{cut} of {len(stalled)} stalled clients were disconnected")
assert cut == len(stalled), f"only {cut} of {len(stalled)} stalled clients were disconnected"
EOF
grep -q 'cannot\|panicked' "$T/daemon.log" && fail "the daemon logged an error: $(grep -m1 'cannot\|panicked' "$T/daemon.log")"
stop_daemon
log "stalled HTTP clients are disconnected after the write stall timeout"
