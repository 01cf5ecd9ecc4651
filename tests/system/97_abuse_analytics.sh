#!/usr/bin/env bash
# Goal: the analytics API and its history file survive an unfriendly client, a
# careless admin and a damaged state directory.
# 1. Queries with ranges, resolutions, dataset names and filters that are wrong or
#    huge (10 years, to < from, 10 KB names, control characters, 10,000 filter keys,
#    patterns of stars) are refused with a short 4xx at once or answered; PUT with bad
#    JSON, a 3 MB body or an unknown dataset is refused; enabling every dataset stops
#    at 409 and memory_bytes stays under memory_max_bytes.
# 2. Live streams: 0 or 9 datasets are refused; 16 streams (4 from each of four
#    addresses, a client's share) are served, the 17th gets 503; 16 clients that drop
#    their connections without a word free their slots.
# 3. 600 NBD clients, each from its own address, one read each, spread over about 3 s
#    with io.ops/client on: every read is counted once (the clients table keeps 256:
#    the evicted ones count as `other`, also those the collector had seen under their
#    own address), at most 64 keys a point, every dataset under its memory bound.
# 4. A pool exported and imported again shows no spike in txg.syncs/pool (a txg number
#    is not a count from zero), and the syncs after the import are counted; a volume
#    destroyed leaves no totals behind (/metrics, the collector's sums).
# 5. SIGTERM with live streams open: the daemon exits within 1.5 s, without waiting
#    out the HTTP drain.
# 6. A history file of random bytes, empty, a directory, a symlink to /dev/zero or a
#    FIFO: the daemon starts, serves, moves it aside and saves a good file at exit.
. "$(dirname "$0")/lib.sh"
start_daemon
BASE=http://127.0.0.1:$HTTP_PORT
make_pool tank 128M
make_volume tank/vol 16M

# --- 1. queries and PUTs ----------------------------------------------------------------
python3 - "$HTTP_PORT" <<'EOF' || fail "API abuse"
import http.client, json, sys, time, urllib.parse
port = int(sys.argv[1])
def req(method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    t0 = time.time()
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, time.time() - t0
Q = "/api/v1/analytics/query?"
now = int(time.time())
cases = [
    ("to before from", f"dataset=io.ops/op&from={now}&to={now-10}", 400),
    ("from in the future", f"dataset=io.ops/op&from={now+3600}", 400),
    ("10 years, per second", f"dataset=io.ops/op&from={now-315360000}&to={now}&resolution=1", 400),
    ("10 years, per minute", f"dataset=io.ops/op&from={now-315360000}&to={now}&resolution=60", 400),
    ("10 years, default", f"dataset=io.ops/op&from={now-315360000}", 400),
    ("resolution 0", "dataset=io.ops/op&resolution=0", 400),
    ("resolution 7", "dataset=io.ops/op&resolution=7", 400),
    ("resolution huge", "dataset=io.ops/op&resolution=99999999999999999999999", 400),
    ("from not a number", "dataset=io.ops/op&from=yesterday", 400),
    ("negative to", "dataset=io.ops/op&to=-5", 400),
    ("u64 max range", f"dataset=io.ops/op&from={2**64-100}&to={2**64-1}", 200),
    ("no dataset", "from=1", 400),
    ("unknown parameter", "dataset=io.ops/op&bogus=1", 400),
    ("10 KB dataset name", "dataset=" + "x" * 10240, 404),
    ("control characters", "dataset=" + urllib.parse.quote("io.ops/op\x1b[2J\n\x00"), 404),
    ("10,000 filter keys", "dataset=io.ops/op&filter=" + ",".join(f"k{i}" for i in range(10000)), 400),
    ("10,000 filter parameters", "dataset=io.ops/op&" + "&".join(f"filter=k{i}" for i in range(5000)), 400),
    ("star patterns", "dataset=io.ops/op&filter=" + ",".join(["*********a", "*", "**", "a*b*c*d*e*f*"] + ["*" * 600 + "x" + str(i) for i in range(40)]), 200),
    ("a + left unescaped", "dataset=io.ops/volume+op", 200),
    ("filter of duplicates", "dataset=io.ops/op&filter=" + ",".join(["read"] * 5000), 200),
]
for name, q, want in cases:
    status, data, took = req("GET", Q + q)
    assert status == want, f"{name}: HTTP {status}, expected {want}: {data[:300]!r}"
    assert took < 1.0, f"{name}: took {took:.2f} s"
    if status != 200:
        assert len(data) < 2048, f"{name}: a {len(data)}-byte error"
        msg = json.loads(data)["error"]
        assert "\x1b" not in msg and "\n" not in msg and "\x00" not in msg, f"{name}: raw control characters in {msg!r}"
    print(f"ok {name}: {status} in {took*1000:.0f} ms")
# the live stream refuses what the query refuses (answers before any event is sent)
for name, q in [("unknown parameter", "dataset=io.ops/op&bogus=1"), ("no dataset", ""), ("unknown dataset", "dataset=io.ops/nope")]:
    status, data, took = req("GET", "/api/v1/analytics/live?" + q)
    assert status in (400, 404), f"live, {name}: HTTP {status}: {data[:200]!r}"
    print(f"ok live, {name}: {status}")

D = "/api/v1/analytics/datasets/"
for name, path, body, want in [
    ("bad JSON", "io.ops/volume", b"{enabled: yes", 400),
    ("wrong type", "io.ops/volume", b'{"enabled": "yes"}', 400),
    ("empty body", "io.ops/volume", b"", 400),
    ("3 MB body", "io.ops/volume", b'{"enabled": true, "x": "' + b"a" * (3 << 20) + b'"}', 413),
    ("unknown dataset", "io.ops/nope", b'{"enabled": true}', 404),
    ("unknown statistic", "x" * 5000 + "/none", b'{"enabled": true}', 404),
]:
    status, data, took = req("PUT", D + path, body, {"content-type": "application/json"})
    assert status == want, f"PUT {name}: HTTP {status}, expected {want}: {data[:200]!r}"
    print(f"ok PUT {name}: {status}")

# every dataset, until the memory bound refuses one
info = json.loads(req("GET", "/api/v1/analytics/datasets")[1])
enabled_by_us, refused = [], 0
for d in info["datasets"]:
    if d["enabled"]:
        continue
    status, data, _ = req("PUT", D + d["name"], b'{"enabled": true}', {"content-type": "application/json"})
    assert status in (200, 409), f"enable {d['name']}: {status} {data[:200]!r}"
    if status == 409:
        refused += 1
        assert b"bytes" in data, data
    else:
        enabled_by_us.append(d["name"])
info = json.loads(req("GET", "/api/v1/analytics/datasets")[1])
committed = sum(d["memory_max_bytes"] for d in info["datasets"] if d["enabled"])
assert committed <= info["memory_max_bytes"], (committed, info["memory_max_bytes"])
assert info["memory_bytes"] <= committed, (info["memory_bytes"], committed)
print(f"enabled {len(enabled_by_us)} more datasets, {refused} refused with 409; committed {committed} of {info['memory_max_bytes']}")
for name in enabled_by_us:
    if name != "txg.syncs/pool":
        assert req("PUT", D + name, b'{"enabled": false}', {"content-type": "application/json"})[0] == 200
assert req("PUT", D + "txg.syncs/pool", b'{"enabled": true}', {"content-type": "application/json"})[0] == 200
EOF

# --- 2. live streams: limits, and slots freed by clients that vanish ---------------------
python3 - "$HTTP_PORT" <<'EOF' || fail "live stream limits"
import socket, sys, time
port = int(sys.argv[1])
def open_stream(query="dataset=io.ops/op", source="127.0.0.1"):
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    s.sendall(f"GET /api/v1/analytics/live?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    return s, int(head.split()[1])
for q, want in [("", 400), ("&".join(["dataset=io.ops/op"] * 9), 400), ("dataset=nope/none", 404)]:
    s, status = open_stream(q)
    s.close()
    assert status == want, f"live {q[:40]!r}: {status}, expected {want}"
# at most 4 streams per client address: 16 from four addresses fill every slot
sources = [f"127.0.0.{1 + i // 4}" for i in range(16)]
streams = [open_stream(source=src) for src in sources]
assert all(st == 200 for _, st in streams), [st for _, st in streams]
s, status = open_stream(source="127.0.0.5")
s.close()
assert status == 503, f"the 17th stream got {status}"
# vanish: reset the connections (no FIN handshake, never read again)
for s, _ in streams:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
deadline = time.time() + 6
while True:
    got = []
    for src in sources:
        s, status = open_stream(source=src)
        got.append((s, status))
    ok = sum(1 for _, st in got if st == 200)
    for s, _ in got:
        s.close()
    if ok == 16:
        break
    assert time.time() < deadline, f"only {ok} of 16 slots free 6 s after the clients vanished"
    time.sleep(0.5)
print("live: 16 served (4 per address), the 17th refused, slots freed after abrupt disconnects")
EOF

# --- 3. hundreds of clients: at most 64 keys a point, every read counted ------------------
curl -sf -X PUT -H 'content-type: application/json' -d '{"enabled":true}' \
    "$BASE/api/v1/analytics/datasets/io.ops/client" >/dev/null || fail "enable io.ops/client"
sleep 1.2
t_clients=$(date +%s)
python3 - "$NBD_PORT" "$ROOT/tests/tools" <<'EOF' || fail "600 NBD clients"
import socket, sys, time
sys.path.insert(0, sys.argv[2])
import nbd_abuse as nb
port, connect = int(sys.argv[1]), socket.create_connection
t0 = time.time()
for i in range(600):  # each from its own address, 127.0.1.2 ... 127.0.3.101
    time.sleep(max(0, t0 + i * 0.005 - time.time()))  # rows seen, then evicted
    src = f"127.0.{1 + i // 250}.{2 + i % 250}"
    socket.create_connection = lambda addr, timeout=None, src=src: connect(addr, timeout=timeout, source_address=(src, 0))
    s = nb.open_export("127.0.0.1", port, "tank/vol")
    s.sendall(nb.request(nb.CMD_READ, i, 0, 4096))
    nb.recv_exact(s, 16 + 4096)
    s.close()
EOF
sleep 2.2
curl -sf "$BASE/api/v1/analytics/query?dataset=io.ops/client&from=$((t_clients - 2))" >"$T/clients.q" || fail "query io.ops/client"
curl -sf "$BASE/api/v1/analytics/datasets" >"$T/ds.json" || fail "datasets"
python3 - "$T/clients.q" "$T/ds.json" <<'EOF' || fail "io.ops/client with 600 clients"
import json, sys
q, ds = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
total = sum(v for s in q["series"] for v in s["values"] if v)
print(f"io.ops/client: {len(q['series'])} series, {total:.0f} reads counted of 600")
assert len(q["series"]) <= 65, len(q["series"])
assert any(s["key"] == "other" for s in q["series"]), "no other"
assert total == 600, f"{total} reads counted (clients evicted from the table must still count)"
for d in ds["datasets"]:
    assert d["memory_bytes"] <= d["memory_max_bytes"], d
EOF

# --- 4. export and import: no txg spike ---------------------------------------------------
# a volume destroyed takes its front-end totals with it (a name created and destroyed
# in a loop must not grow the table); one of the same name counts from zero
make_volume tank/gone 4M
head -c 1M /dev/urandom >"$T/data"
nbdcopy "$T/data" "$(nbd_tcp_uri tank/gone)" || fail "nbdcopy to tank/gone"
sleep 0.3
curl -sf "$BASE/metrics" >"$T/metrics" || fail "/metrics"
grep -q 'volume="tank/gone"' "$T/metrics" || fail "no metrics for tank/gone after a write"
z volume destroy tank/gone
sleep 0.3
curl -sf "$BASE/metrics" >"$T/metrics" || fail "/metrics"
grep -q 'volume="tank/gone"' "$T/metrics" && fail "the destroyed volume's totals are still kept"
make_volume tank/gone 4M
z volume destroy tank/gone

for i in $(seq 1 12); do z volume create -s -V 1M "tank/t$i" >/dev/null; done
z pool export tank
sleep 1.5
z pool import -d "$T/disks" tank
t_import=$(date +%s)
# a write after the import: its txg sync (within zfs_txg_timeout, 5 s) must be counted
head -c 1M /dev/urandom >"$T/data"
nbdcopy "$T/data" "$(nbd_tcp_uri tank/vol)" || fail "nbdcopy to tank/vol"
sleep 7
# from the import on: the volume creates before the export sync a txg each, more than
# ten in one second on a fast machine, which are real syncs and no spike
curl -sf "$BASE/api/v1/analytics/query?dataset=txg.syncs/pool&from=$((t_import - 1))" >"$T/txg.q" || fail "query txg.syncs/pool"
curl -sf "$BASE/api/v1/pools/tank/txgs" >"$T/txgs.json" || true
python3 - "$T/txg.q" <<'EOF' || fail "txg.syncs/pool spiked at import"
import json, sys
q = json.load(open(sys.argv[1]))
values = [v for s in q["series"] for v in s["values"] if v is not None]
print(f"txg.syncs/pool since the import: max {max(values, default=0)} per second")
assert max(values, default=0) <= 10, f"a spike: {values}"
assert sum(values) >= 1, f"the sync after the write was not counted: {values}"
EOF

# --- 4b. a stalled daemon (SIGSTOP for 3 s, as a VM pause or an overloaded host would):
# the collector wakes late and spreads what it took over the seconds it missed, so the
# per-second reads have no hole and add up to what fio completed
if command -v fio >/dev/null; then
    sleep 1.5
    t_stall=$(date +%s)
    fio --name=stall --ioengine=nbd --uri="$(nbd_tcp_uri tank/vol)" --rw=randread --bs=4k --iodepth=4 \
        --size=8M --time_based --runtime=8 --rate_iops=200 --output-format=json >"$T/stall.json" 2>"$T/stall.err" &
    fio_pid=$!
    sleep 3
    kill -STOP "$DAEMON_PID"
    sleep 3
    kill -CONT "$DAEMON_PID"
    wait "$fio_pid" || fail "fio across the stall: $(cat "$T/stall.err")"
    sleep 2.5
    curl -sf "$BASE/api/v1/analytics/query?dataset=io.ops/op&filter=read&from=$((t_stall - 1))" >"$T/stall.q" || fail "query after the stall"
    python3 - "$T/stall.json" "$T/stall.q" <<'EOF' || fail "a stalled collector lost or lumped seconds"
import json, sys
text = open(sys.argv[1]).read()
fio = json.loads(text[text.index("{"):])["jobs"][0]["read"]["total_ios"]
q = json.load(open(sys.argv[2]))
values = [s for s in q["series"] if s["key"] == "read"][0]["values"]
busy = [i for i, v in enumerate(values) if v]
first, last = busy[0], busy[-1]
print(f"after a 3 s stall: fio {fio} reads, analytics {sum(v for v in values if v):.0f}: {values[first:last + 1]}")
assert sum(v for v in values if v) == fio, "reads lost or counted twice"
assert all(v is not None for v in values[first:last + 1]), f"a hole: {values}"
EOF
fi

# --- 5. SIGTERM with live streams open ----------------------------------------------------
python3 - "$HTTP_PORT" "$DAEMON_PID" <<'EOF' || fail "SIGTERM with live streams open"
import os, signal, socket, sys, time
port, pid = int(sys.argv[1]), int(sys.argv[2])
streams = []
for _ in range(4):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /api/v1/analytics/live?dataset=io.ops/op HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert b" 200 " in s.recv(4096)
    streams.append(s)
time.sleep(1.2)
t0 = time.time()
os.kill(pid, signal.SIGTERM)
while time.time() - t0 < 10:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
        break
    time.sleep(0.05)
took = time.time() - t0
print(f"exited {took:.2f} s after SIGTERM with 4 live streams open")
assert took < 1.5, f"took {took:.2f} s"
EOF
wait "$DAEMON_PID" || fail "daemon exited with an error after SIGTERM"
DAEMON_PID=
grep -q "requests still running" "$T/daemon.log" && fail "the HTTP drain waited on live streams"

# --- 6. bad history files -----------------------------------------------------------------
H=$STATE/analytics-history
for damage in random empty directory symlink fifo; do
    rm -rf "$H" "$H.bad" "$H.tmp"
    case $damage in
        random) head -c 100000 /dev/urandom >"$H" ;;
        empty) : >"$H" ;;
        directory) mkdir -p "$H/sub" ;;
        symlink) ln -s /dev/zero "$H" ;;
        fifo) mkfifo "$H" ;;
    esac
    lines_before=$(wc -l <"$T/daemon.log")
    start_daemon
    tail -n +$((lines_before + 1)) "$T/daemon.log" | grep -q 'analytics: .*starting an empty history' ||
        fail "$damage: the bad history file was not reported"
    [ -e "$H.bad" ] || [ -L "$H.bad" ] || fail "$damage: the bad file was not moved aside"
    curl -sf "$BASE/api/v1/analytics/datasets" >/dev/null || fail "$damage: analytics does not answer"
    stop_daemon
    [ -f "$H" ] && [ ! -L "$H" ] && [ -s "$H" ] || fail "$damage: no good history file saved at exit"
    log "ok: history file $damage"
done
log "analytics abuse: queries, PUTs, live limits, import, SIGTERM and bad history files all held"
