#!/usr/bin/env bash
# Goal: the README's first command works: `zilla demo` creates a pool on emulated disks,
# serves its volume over NBD, iSCSI and HTTP (dashboard and analytics), stops cleanly on
# Ctrl-C, and a second run reuses the pool with its data.
# Method: run the demo on free ports in a temp dir; nbdinfo, a write and read back with
# qemu-io, iscsi-inq, the dashboard page and analytics datasets; SIGINT; run it again and
# read the data back.
. "$(dirname "$0")/lib.sh"
NBD=$(free_port); ISCSI=$(free_port); HTTP=$(free_port)
DIR="$T/demo"

start_demo() {
    "$ZILLA" demo --nbd "127.0.0.1:$NBD" --iscsi "127.0.0.1:$ISCSI" --http "127.0.0.1:$HTTP" "$DIR" >"$T/demo.$1.log" 2>&1 &
    DEMO_PID=$!
    on_exit "kill $DEMO_PID 2>/dev/null || true"
    for _ in $(seq 300); do
        nbdinfo --size "nbd://127.0.0.1:$NBD/demo/vol0" >/dev/null 2>&1 && return 0
        kill -0 "$DEMO_PID" 2>/dev/null || { cat "$T/demo.$1.log"; fail "zilla demo exited"; }
        sleep 0.1
    done
    cat "$T/demo.$1.log"
    fail "zilla demo does not serve demo/vol0 over NBD"
}

stop_demo() {
    kill -INT "$DEMO_PID"
    wait_pid_gone "$DEMO_PID" 30 || fail "zilla demo did not stop on SIGINT"
    wait "$DEMO_PID"; rc=$?
    [ "$rc" -eq 0 ] || { cat "$T/demo.$1.log"; fail "zilla demo exited $rc on SIGINT"; }
}

start_demo 1
grep -q "nbdinfo nbd://127.0.0.1:$NBD/demo/vol0" "$T/demo.1.log" || fail "the demo does not print its NBD command"
grep -q "http://127.0.0.1:$HTTP/" "$T/demo.1.log" || fail "the demo does not print its dashboard address"
qemu-io -f raw -c "write -P 0xa7 1M 64k" -c flush "nbd://127.0.0.1:$NBD/demo/vol0" >/dev/null || fail "write to the demo volume"
iscsi-inq "iscsi://127.0.0.1:$ISCSI/iqn.2026-11.io.zilla:demo.vol0/0" >"$T/inq" || fail "iscsi-inq of the demo volume"
curl -sf "http://127.0.0.1:$HTTP/" | grep -qi "<html" || fail "no dashboard page"
curl -sf "http://127.0.0.1:$HTTP/api/v1/analytics/datasets" | grep -q '"io.latency"' || fail "no analytics datasets"
"$ZILLA" --state-dir "$DIR/state" pool status demo | grep -q ONLINE || fail "pool status of the demo pool"
stop_demo 1

start_demo 2
grep -q "created pool" "$T/demo.2.log" && fail "the second run created the pool again instead of reusing it"
qemu-io -f raw -c "read -P 0xa7 1M 64k" "nbd://127.0.0.1:$NBD/demo/vol0" >"$T/read" || fail "read back"
grep -q "read 65536/65536" "$T/read" || fail "the data written before the restart is not there: $(cat "$T/read")"
stop_demo 2
log "zilla demo OK"
