#!/usr/bin/env bash
# Goal: one client cannot lock everyone else out of the live analytics streams, and a
# stream its client does not read is closed, even when the socket buffers never fill.
# Method: http_write_stall_timeout_s = 3. One client (127.0.0.1) opens 16 live streams
# with a 2 KB receive buffer (set before connect) and never reads them: at one event
# a second the daemon's send buffer (megabytes) never fills, only the client's
# receive window closes. A client from another address (127.0.0.2) must still get a
# stream at once; the flooding client gets its share (4) and 429 beyond; the unread
# streams must be closed within the stall bound once their window is shut (their
# slots come back, and reading them then ends in EOF); a client with the same small
# buffer that reads every event (127.0.0.3) keeps its stream all along.
. "$(dirname "$0")/lib.sh"
cat >"$T/zilla.conf" <<'EOF'
http_write_stall_timeout_s = 3
EOF
start_daemon --config "$T/zilla.conf"
# eight datasets a stream, all on (an event shows only the enabled ones): events of
# ~350 bytes, so a 2 KB receive window shuts within seconds
DATASETS="io.ops/op io.latency/op disk.latency/device io.ops/protocol io.bytes/op io.bytes/protocol io.size/op io.latency/protocol"
for d in $DATASETS; do
    curl -sf -o /dev/null -X PUT -H 'content-type: application/json' -d '{"enabled": true}' \
        "http://127.0.0.1:$HTTP_PORT/api/v1/analytics/datasets/$d" || fail "cannot enable $d"
done
python3 - "$HTTP_PORT" $DATASETS <<'EOF' || fail "live streams flooded by one client"
import socket, sys, threading, time
port = int(sys.argv[1])
STALL_S = 3
QUERY = "&".join("dataset=" + n for n in sys.argv[2:])

def open_stream(source, rcvbuf=None):
    """A live stream from `source`: the socket and the HTTP status."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /api/v1/analytics/live?{QUERY} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(256)
        if not chunk:
            break
        head += chunk
    return s, int(head.split()[1]), head

# a client with the same small buffer that reads every event: never cut
reader_events, reader_end = [], []
def read_all():
    s, status, _ = open_stream("127.0.0.3", 2048)
    assert status == 200, status
    s.settimeout(10)
    try:
        while not reader_end:
            chunk = s.recv(4096)
            if not chunk:
                reader_end.append("EOF")
                break
            reader_events.append((time.time(), chunk.count(b"event: point")))
    except OSError as e:
        reader_end.append(repr(e))
    s.close()
reader = threading.Thread(target=read_all, daemon=True)
reader.start()

t0 = time.time()
flood = [open_stream("127.0.0.1", 2048) for _ in range(16)]
other, status, head = open_stream("127.0.0.2")
assert status == 200, f"a client from another address got {status} with 16 streams opened by one client: {head[:200]!r}"
assert b"event: point" in head or b"event: point" in other.recv(4096), "no event on the other client's stream"
other.close()
statuses = [st for _, st, _ in flood]
served = [s for s, st, _ in flood if st == 200]
print(f"one client asked for 16 streams: {statuses.count(200)} served, {statuses.count(429)} refused with 429; another address was served")
assert len(served) == 4 and statuses.count(429) == 12, statuses
refusal = [h for _, st, h in flood if st == 429][0]
assert b"per client address" in refusal, refusal
for s, st, _ in flood:
    if st != 200:
        s.close()

# the unread streams: their slots come back once the daemon closed them
while True:
    got = [open_stream("127.0.0.1") for _ in range(4)]
    ok = sum(1 for _, st, _ in got if st == 200)
    for s, _, _ in got:
        s.close()
    if ok == 4:
        break
    assert time.time() - t0 < 30, f"unread streams still held after {time.time() - t0:.1f} s ({ok} of 4 slots free)"
    time.sleep(0.5)
freed_s = time.time() - t0
print(f"the 4 unread streams were closed {freed_s:.1f} s after they opened (stall bound {STALL_S} s)")
# reading them now drains what the buffers held, then EOF (a stream still served
# would go on sending an event a second)
for s in served:
    s.settimeout(5)
    deadline = time.time() + 8
    while True:
        assert time.time() < deadline, "an unread stream was not closed by the daemon"
        chunk = s.recv(65536)
        if not chunk:
            break
    s.close()
# the reading client kept its stream, an event a second, all along
reader_end.append("done")
reader.join(12)
events = sum(n for _, n in reader_events)
gaps = [b[0] - a[0] for a, b in zip(reader_events, reader_events[1:])]
print(f"the reading client got {events} events in {time.time() - t0:.1f} s, longest gap {max(gaps, default=0):.1f} s")
assert reader_end == ["done"], f"the reading client's stream ended: {reader_end}"
# (about one a second; half of that leaves room for a busy machine's late ticks)
assert events >= freed_s / 2, f"the reading client got only {events} events in {freed_s:.1f} s"
EOF
grep -q 'panicked' "$T/daemon.log" && fail "the daemon panicked: $(grep -m1 'panicked' "$T/daemon.log")"
stop_daemon
log "one client holds at most its share of live streams; unread streams are closed after the stall bound"
