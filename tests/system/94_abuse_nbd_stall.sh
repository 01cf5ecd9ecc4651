#!/usr/bin/env bash
# Goal (issue 14 row 1): clients that stop reading stall only themselves.
# Method: five NBD clients each send a 16 MiB read, 127 1 GiB TRIMs and 300 invalid
# requests and never read (tests/tools/nbd_abuse.py stall). While they stay connected:
# another client's 4 KiB write + FLUSH completes within 1 s, `zilla pool list` answers
# within 1 s, and SIGTERM stops the daemon within 10 s.
. "$(dirname "$0")/lib.sh"
TOOL="$(dirname "$0")/../tools/nbd_abuse.py"
start_daemon
make_pool tank 256M
make_volume tank/big 2G
make_volume tank/vol 64M

python3 "$TOOL" stall 127.0.0.1 "$NBD_PORT" tank/big 5 >"$T/abusers.out" 2>&1 &
ABUSERS=$!
on_exit "kill $ABUSERS 2>/dev/null"
for ((i = 0; i < 100; i++)); do grep -q ready "$T/abusers.out" && break; sleep 0.1; done
grep -q ready "$T/abusers.out" || { cat "$T/abusers.out"; fail "abusive clients did not connect"; }
log "abusers: $(ps -o nlwp= -p "$DAEMON_PID") daemon threads"

for round in 1 2 3; do
    took=$(timeout 10 python3 "$TOOL" writeflush 127.0.0.1 "$NBD_PORT" tank/vol) || fail "write+flush failed"
    log "write+flush round $round: ${took} s"
    awk -v t="$took" 'BEGIN { exit !(t < 1.0) }' || fail "write+flush took ${took} s (limit 1 s)"
    start=$(date +%s.%N)
    timeout 5 "$ZILLA" --state-dir "$STATE" pool list -H >/dev/null || fail "pool list failed"
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
    log "pool list round $round: ${took} s"
    awk -v t="$took" 'BEGIN { exit !(t < 1.0) }' || fail "pool list took ${took} s (limit 1 s)"
done
kill -0 "$ABUSERS" || fail "abusive clients went away early"

start=$(date +%s.%N)
kill -TERM "$DAEMON_PID"
wait_pid_gone "$DAEMON_PID" 10 || fail "daemon still running 10 s after SIGTERM with stalled clients"
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
DAEMON_PID=
log "SIGTERM to exit: ${took} s"
log "non-reading clients stall only themselves OK"
