#!/usr/bin/env bash
# Goal: SIGTERM while hundreds of cold reads are answered from io_uring completions
# (and fsync'd writes run) stops the daemon within 10 s with status 0 and no panic
# (late completions must not touch a runtime that is gone), three times in a row; each
# restart imports the pool, a scrub finds nothing, and the data reads back.
. "$(dirname "$0")/lib.sh"
command -v fio >/dev/null || skip "fio missing"
no_panic() { ! grep -n "panicked" "$T/daemon.log" || fail "$1: the daemon panicked"; }
start_daemon
make_pool tank 256M
make_volume tank/cold 96M
make_volume tank/w 64M
head -c $((64 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/cold)"
for round in 1 2 3; do
    z pool export tank
    z pool import -d "$T/disks" tank >/dev/null
    fio --name=r --ioengine=nbd --uri="$(nbd_tcp_uri tank/cold)" --rw=randread --bs=16k --iodepth=128 \
        --numjobs=3 --size=64M --time_based --runtime=60 --group_reporting >"$T/fio-r.out" 2>&1 &
    R=$!
    fio --name=w --ioengine=nbd --uri="$(nbd_tcp_uri tank/w)" --rw=randwrite --bs=4k --iodepth=8 --fsync=1 \
        --size=32M --time_based --runtime=60 >"$T/fio-w.out" 2>&1 &
    W=$!
    on_exit "kill $R $W 2>/dev/null"
    sleep 3
    start=$(date +%s.%N)
    kill -TERM "$DAEMON_PID"
    wait_pid_gone "$DAEMON_PID" 10 || fail "round $round: daemon still running 10 s after SIGTERM with cold reads in flight"
    rc=0
    wait "$DAEMON_PID" || rc=$?
    DAEMON_PID=
    log "round $round: SIGTERM to exit $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s, status $rc"
    [ $rc -eq 0 ] || fail "round $round: daemon exited with status $rc"
    no_panic "round $round"
    kill "$R" "$W" 2>/dev/null || true
    wait "$R" "$W" 2>/dev/null || true
    NBD_PORT= HTTP_PORT= start_daemon
    nbdcopy "$(nbd_unix_uri tank/cold)" "$T/back"
    cmp -n $((64 << 20)) "$T/data" "$T/back" || fail "round $round: data differs after the restart"
done
z pool scrub -w tank
z pool status tank | grep -q "errors: No known data errors" || fail "errors: $(z pool status tank)"
stop_daemon
no_panic "stop"
log "SIGTERM under io_uring cold reads OK"
