#!/usr/bin/env bash
# Goal: the broken-invariant policy (docs/design.md). A failed assertion inside the
# engine stops the daemon with one clear log line instead of serving on; the pool comes
# back on restart with every write that was flushed before. Method: write and flush,
# set the testing tunable zfs_debug_fail_sync_assertion=1 so the next txg sync (run by
# the engine's sync thread, not a request thread) fails an assertion, trigger a sync,
# check the daemon died of SIGABRT with the log line, restart, read the data back.
. "$(dirname "$0")/lib.sh"
ulimit -c 0
start_daemon
make_pool tank 256M
make_volume tank/v 64M
uri=$(nbd_unix_uri tank/v)
head -c $((8 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri"

z tunable set zfs_debug_fail_sync_assertion=1
z set sync=always tank/v >"$T/set.out" 2>&1 && fail "a property set whose sync failed an assertion succeeded"
rc=0
for ((i = 0; i < 100; i++)); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$DAEMON_PID" 2>/dev/null && fail "daemon still running after a failed assertion"
wait "$DAEMON_PID" || rc=$?
DAEMON_PID=
[ $rc -eq 134 ] || fail "daemon exit status $rc, expected 134 (SIGABRT)"
grep -q 'internal error (broken invariant) in thread .* zfs_debug_fail_sync_assertion is set: txg [0-9]* of pool tank stops at a failed assertion; stopping the daemon' "$T/daemon.log" \
    || fail "no broken-invariant log line"
log "daemon stopped: $(grep -o 'internal error (broken invariant).*' "$T/daemon.log" | head -1)"

start_daemon
z pool status tank | grep -q 'state: ONLINE' || fail "pool not ONLINE after restart"
nbdcopy "$uri" "$T/back"
cmp -n $((8 << 20)) "$T/data" "$T/back" || fail "flushed data lost after the stop"
[ "$(z get -H sync tank/v | cut -f3)" = standard ] || fail "the property set that never synced came back"
stop_daemon
log "broken invariant stops the daemon, restart recovers OK"
