#!/usr/bin/env bash
# Goal: the web UI works from the binary alone: the dashboard shows the pool, its
# vdev tree and the volume; the analytics worksheet draws live data under fio load
# (counter charts have points, the latency heat map non-zero cells), hover, drag to
# zoom (range average), click a legend key (drill-down chart), a saved URL reopens
# the same worksheet, each statistic of the catalog draws in a worksheet, and no
# request leaves the daemon's origin. The dashboard's I/O panel shows non-zero ops/s,
# bandwidth and latency (mean, p50, p99) for the pool and the volume under load; the
# vdev tree shows whole device names, with log, cache and spare devices in sections
# as zpool status has them; the scan line shows the finished scrub; the heat map's range average gives mean, p50 and p99;
# the device legend shows distinct names (whole names as titles) and leaves out a
# destroyed pool and a removed cache device that had I/O minutes before.
# Method: the real daemon, fio (nbd engine) in the background, headless chromium
# driven over CDP by tests/tools/web_ui_check.py; the read-only /api/v1 routes and
# the compiled-in assets checked with curl first. Screenshots go to
# $ZILLA_SCREENSHOTS (default: a directory in the test's temp dir, printed; kept).
# WEB_UI_PARTS=dashboard checks the dashboard only.
. "$(dirname "$0")/lib.sh"
command -v chromium >/dev/null || skip "chromium is not installed (tests/packages.txt)"
start_daemon
make_pool tank 256M
for d in log0 c0 c1 s0; do truncate -s 128M "$T/disks/tank-$d"; done
z pool add tank log "$T/disks/tank-log0" cache "$T/disks/tank-c0" "$T/disks/tank-c1" spare "$T/disks/tank-s0"
make_volume tank/vol0 64M
BASE="http://127.0.0.1:$HTTP_PORT"

# a pool with I/O in the analytics history, destroyed: it must leave the legends
make_pool gone 128M
make_volume gone/v 16M
fio --name=gone --ioengine=nbd --uri="$(nbd_tcp_uri gone/v)" --rw=write --bs=64k --size=8M --fsync=16 >"$T/fio-gone.out" 2>&1 ||
    fail "fio on gone/v: $(tail -3 "$T/fio-gone.out")"
seen_in_history() { # DATASET KEY-GLOB: the key has had data in the last 5 minutes
    curl -sf "$BASE/api/v1/analytics/query?dataset=$1&filter=$2" |
        python3 -c 'import json,sys; a=json.load(sys.stdin); sys.exit(0 if any(v for s in a["series"] for v in s["values"]) else 1)'
}
for i in $(seq 20); do seen_in_history disk.latency/device 'gone/*' && break; sleep 0.5; done
seen_in_history disk.latency/device 'gone/*' || fail "no device I/O of pool gone in the analytics history"
z pool destroy gone

# The read-only routes answer the socket's JSON; nothing that changes state is on HTTP.
for r in info pools status iostat volumes arcstats zilstats clients pools/tank/props pools/tank/txgs; do
    curl -sf "$BASE/api/v1/$r" -o "$T/http.json" || fail "GET /api/v1/$r failed"
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/http.json" || fail "/api/v1/$r is not JSON"
done
curl -sf "$BASE/api/v1/volumes" >"$T/v.json" && grep -q '"name":"tank/vol0"' "$T/v.json" || fail "/api/v1/volumes does not list tank/vol0"
# same answers as the socket (idle pool: nothing changes between the two reads)
for r in volumes pools/tank/props "pools?pool=tank" "status?pool=nosuchpool"; do
    curl -s --unix-socket "$STATE/zilla.sock" "http://zilla/v1/$r" >"$T/socket.json"
    curl -s "$BASE/api/v1/$r" >"$T/http.json"
    cmp -s "$T/socket.json" "$T/http.json" || fail "/api/v1/$r differs from the socket's /v1/$r: $(head -c 300 "$T/http.json")"
done
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{"name":"x","tops":[]}' "$BASE/api/v1/pools")
[ "$code" = 405 ] || fail "POST /api/v1/pools answered $code, not 405"
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$BASE/api/v1/pools/tank")
[ "$code" = 405 ] || [ "$code" = 404 ] || fail "DELETE /api/v1/pools/tank answered $code"
z pool list -H | grep -q '^tank' || fail "the socket's GET /v1/pools broke"
# pages and assets: content types, validators, the text status page, /metrics
curl -sfI "$BASE/ui/assets/vendor/uplot/uPlot.iife.min.js" | tr -d '\r' >"$T/h"
grep -qi '^content-type: text/javascript' "$T/h" && grep -qi '^etag: ' "$T/h" || fail "uPlot served without type or ETag"
etag=$(grep -i '^etag: ' "$T/h" | cut -d' ' -f2-)
[ "$(curl -s -o /dev/null -w '%{http_code}' -H "If-None-Match: $etag" "$BASE/ui/assets/vendor/uplot/uPlot.iife.min.js")" = 304 ] ||
    fail "If-None-Match did not answer 304"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/ui/assets/../../etc/passwd")" = 404 ] || fail "asset path escape not refused"
# (into files: grep -q would close the pipe early and pipefail see curl's SIGPIPE)
curl -sf "$BASE/" >"$T/index.html" && grep -q 'dashboard.js' "$T/index.html" || fail "/ is not the dashboard"
curl -sf "$BASE/status" >"$T/status.html" && grep -q 'tank/vol0' "$T/status.html" || fail "/status does not show the volume"
curl -sf "$BASE/metrics" >"$T/metrics" && grep -q '^zfs_pool_health{pool="tank"} 0' "$T/metrics" || fail "/metrics changed"

# a finished scrub for the dashboard's scan line
z pool scrub -w tank
# load for the charts: random reads and writes for the rest of the test
fio --name=webui --ioengine=nbd --uri="$(nbd_tcp_uri tank/vol0)" --rw=randrw --bs=4k --iodepth=4 \
    --size=32M --time_based --runtime=600 --rate_iops=300 --fsync=64 >"$T/fio.out" 2>&1 &
FIO_PID=$!
on_exit "kill $FIO_PID"
sleep 3
# a cache device with I/O (the L2ARC feed under load), then removed
for i in $(seq 40); do seen_in_history disk.latency/device "tank/cache/*tank-c1" && break; sleep 0.5; done
seen_in_history disk.latency/device "tank/cache/*tank-c1" || fail "no I/O of cache device tank-c1 in the analytics history"
z pool remove tank "$T/disks/tank-c1"

SHOTS=${ZILLA_SCREENSHOTS:-$(mktemp -d /tmp/zilla-webui-shots.XXXXXX)}
log "screenshots: $SHOTS"
python3 "$ROOT/tests/tools/web_ui_check.py" --base "$BASE" --pool tank --volume tank/vol0 --gone gone --removed "$T/disks/tank-c1" \
    --parts "${WEB_UI_PARTS:-dashboard,worksheet,statistics}" --screenshots "$SHOTS" || fail "web UI checks failed (screenshots in $SHOTS)"
kill "$FIO_PID" 2>/dev/null || true
wait "$FIO_PID" 2>/dev/null || true
stop_daemon
log "web UI OK"
