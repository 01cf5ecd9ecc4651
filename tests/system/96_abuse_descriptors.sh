#!/usr/bin/env bash
# Goal (issue 14 row 3): connections cannot use up the daemon's descriptors.
# Method: the daemon runs under RLIMIT_NOFILE 1024 (soft and hard, as `ulimit -n
# 1024`), so its connection caps must shrink to fit with room for devices. 1,100 HTTP
# clients send half a request line and hold; 1,100 NBD clients finish the handshake
# and idle. While they are connected: `pool list` answers within 1 s, a new pool can
# be created (devices still open), nbdinfo and a 4 KiB write + FLUSH from new NBD
# clients work (at the cap the connection idle longest makes room), and accept
# failures are not logged more than once per 10 s.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../tools/memory_bound.sh"
TOOL="$(dirname "$0")/../tools/nbd_abuse.py"
command -v prlimit >/dev/null || skip "prlimit (util-linux) missing"
DAEMON_PREFIX=(prlimit --nofile=1024:1024)
start_daemon
grep -q "RLIMIT_NOFILE\|descriptor limit 1024" "$T/daemon.log" || fail "the daemon did not report its descriptor limit"
log "$(grep -o "descriptor limit.*connections" "$T/daemon.log" | tail -1)"
make_pool tank 128M
make_volume tank/vol 64M
nbd_max=$(metric zilla_nbd_connections_max)
log "NBD connection cap per listener under 1024 descriptors: $nbd_max"
((nbd_max * 2 + 64 + 256 <= 1024 - 32)) || fail "the caps leave no room for devices: nbd $nbd_max x 2"

python3 "$TOOL" httphalf 127.0.0.1 "$HTTP_PORT" - 1100 >"$T/http.out" 2>&1 &
HALF=$!
on_exit "kill $HALF 2>/dev/null"
python3 "$TOOL" idle 127.0.0.1 "$NBD_PORT" tank/vol 1100 >"$T/idle.out" 2>&1 &
IDLE=$!
on_exit "kill $IDLE 2>/dev/null"
for ((i = 0; i < 450; i++)); do
    grep -q ready "$T/http.out" && grep -q ready "$T/idle.out" && break
    kill -0 "$IDLE" 2>/dev/null || { cat "$T/idle.out"; fail "the idle NBD clients failed"; }
    sleep 0.1
done
grep -q ready "$T/http.out" || { cat "$T/http.out"; fail "half-open HTTP clients did not connect"; }
grep -q ready "$T/idle.out" || { cat "$T/idle.out"; fail "idle NBD clients did not connect"; }
log "1,100 half-open HTTP + 1,100 idle NBD clients connected; daemon holds $(ls /proc/"$DAEMON_PID"/fd | wc -l) descriptors"

for round in 1 2 3; do
    start=$(date +%s.%N)
    timeout 5 "$ZILLA" --state-dir "$STATE" pool list -H >/dev/null || fail "pool list failed"
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
    log "pool list round $round: ${took} s"
    awk -v t="$took" 'BEGIN { exit !(t < 1.0) }' || fail "pool list took ${took} s (limit 1 s)"
done
for d in c0 c1; do truncate -s 128M "$T/disks/$d"; done
timeout 10 "$ZILLA" --state-dir "$STATE" pool create tank2 mirror "$T/disks/c0" "$T/disks/c1" || fail "pool create failed"
timeout 20 nbdinfo "nbd://127.0.0.1:$NBD_PORT/tank/vol" >"$T/nbdinfo.out" || fail "nbdinfo failed"
grep -q "export-size: 67108864" "$T/nbdinfo.out" || fail "nbdinfo: $(cat "$T/nbdinfo.out")"
took=$(timeout 20 python3 "$TOOL" writeflush 127.0.0.1 "$NBD_PORT" tank/vol) || fail "write+flush failed"
log "new NBD client's write+flush: ${took} s"
kill -0 "$IDLE" || fail "idle clients went away early"
# The HTTP port serves 256 connections at a time (the rest wait in the backlog for the
# 10 s header timeout to free a slot); once the half-open clients go, /metrics answers.
kill "$HALF"
for ((i = 0; i < 50; i++)); do curl -sf --max-time 2 "http://127.0.0.1:$HTTP_PORT/metrics" >/dev/null && break; sleep 0.1; done
evicted=$(metric zilla_nbd_connections_evicted_total)
log "idle NBD connections evicted at the cap: $evicted"
((evicted > 0)) || fail "no idle connection was evicted"
warnings=$(grep -c "accept" "$T/daemon.log" || true)
log "accept warnings in the log: $warnings"
((warnings <= 12)) || fail "accept failures logged $warnings times"
log "descriptors hold OK"
