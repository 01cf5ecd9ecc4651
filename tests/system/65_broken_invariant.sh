#!/usr/bin/env bash
# Goal: the broken-invariant policy (docs/design.md). A failed assertion inside the
# engine stops the daemon with one clear log line instead of serving on; the stop
# records the pool the failing thread worked for, and the next start does not import
# that pool (no crash loop): it shows UNAVAIL with the reason while the other pools are
# served, until the admin imports it by hand; then it has every write that was flushed
# before, and later starts import it again. Method: write and flush, set the testing
# tunable zfs_debug_fail_sync_assertion=1 so the next txg sync (run by the engine's
# sync thread, not a request thread) fails an assertion, trigger a sync, check the
# daemon died of SIGABRT with the log line, restart, check the hold, import, read back.
. "$(dirname "$0")/lib.sh"
ulimit -c 0
start_daemon
make_pool tank 256M
make_pool other 256M
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
z pool status other | grep -q 'state: ONLINE' || fail "the other pool is not imported after the stop"
z pool status tank >"$T/status.out"
cat "$T/status.out"
grep -q 'state: UNAVAIL' "$T/status.out" || fail "the pool the daemon stopped in is not UNAVAIL after restart"
grep -q 'stopped on a broken invariant while working for this pool at .*zfs_debug_fail_sync_assertion' "$T/status.out" \
    || fail "pool status does not say why the pool is not imported"
grep -q 'zilla pool import tank' "$T/status.out" || fail "pool status does not say how to import the pool"
z pool list -H -o name,health | grep -qx "tank	UNAVAIL" || fail "pool list does not show tank UNAVAIL"
[ ! -e "$STATE/zilla.stopped" ] || fail "the stop record was not folded into the cache file"
grep -q "pool 'tank' is not imported: the daemon stopped on a broken invariant" "$T/daemon.log" || fail "no log line for the held pool"
# still held after another restart (the hold is in the cache file, not the record)
stop_daemon
start_daemon
z pool list -H -o name,health | grep -qx "tank	UNAVAIL" || fail "tank is imported at the second start"
z get -H sync tank/v >/dev/null 2>&1 && fail "a volume of the held pool is served"
z pool import tank
z pool status tank | grep -q 'state: ONLINE' || fail "pool not ONLINE after the import by hand"
nbdcopy "$uri" "$T/back"
cmp -n $((8 << 20)) "$T/data" "$T/back" || fail "flushed data lost after the stop"
[ "$(z get -H sync tank/v | cut -f3)" = standard ] || fail "the property set that never synced came back"
# imported by hand: the next start imports it again
stop_daemon
start_daemon
z pool status tank | grep -q 'state: ONLINE' || fail "pool not imported at start after the import by hand"
stop_daemon
log "broken invariant stops the daemon, the pool waits for the admin, import by hand recovers OK"
