#!/usr/bin/env bash
# Goal: one pool that cannot be imported never keeps the daemon from serving the
# others, and a restart brings back what was there. (1) A pool of the cache file whose
# devices are gone is UNAVAIL with the reason in `pool status` and `pool list` while the
# other pool is served; `pool clear` of it names its state, the reason and the way out;
# `pool create` of its name is refused; `pool export` forgets it. (2) `serve --no-import` imports
# nothing and keeps the cache file; `pool import NAME` imports from the cached devices.
# (3) kill -9 while `pool export` runs: the pool whose export did not finish is
# imported at the next start. (4) kill -9 is not a broken invariant: every pool is back.
# (5) A cache file that cannot be read is kept aside as zilla.cache.bad and the daemon
# starts without it (with or without --no-import).
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool good 128M
make_pool gone 128M
make_volume good/v 32M
uri=$(nbd_unix_uri good/v)
head -c $((4 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri"
stop_daemon

# (1) the devices of 'gone' vanish
rm -f "$T/disks"/gone-*
start_daemon
z pool status good | grep -q 'state: ONLINE' || fail "good not imported"
z pool status gone >"$T/st" || fail "pool status of an unavailable pool fails"
cat "$T/st"
grep -q 'state: UNAVAIL' "$T/st" || fail "gone is not UNAVAIL"
grep -q 'cannot be imported from the cache file' "$T/st" || fail "no reason in pool status"
z pool status | grep -q 'pool: good' || fail "pool status without a name lacks good"
z pool list -H -o name,health,size >"$T/list"
grep -qx "gone	UNAVAIL	-" "$T/list" || fail "pool list does not show gone UNAVAIL: $(cat "$T/list")"
grep -q "cannot import pool 'gone' from the cache file" "$T/daemon.log" || fail "no log line for gone"
# an admin command on it says what state it is in, why, and the way out
expect_error "cannot clear errors for 'gone': pool 'gone' is UNAVAIL \(not imported\): .*gone-b1: does not exist; .*import it with .zilla pool import gone." z pool clear gone
# its name is still taken, as zpool's is (the devices may come back)
truncate -s 128M "$T/disks/new0"
expect_error "pool already exists: 'gone' is UNAVAIL .*zilla pool export gone. forgets it" z pool create gone "$T/disks/new0"
nbdcopy "$uri" "$T/back" && cmp -n $((4 << 20)) "$T/data" "$T/back" || fail "good does not serve its data"
z pool export gone
z pool list -H -o name | grep -qx gone && fail "gone still listed after export"
stop_daemon
grep -q '"gone"' "$STATE/zilla.cache" && fail "gone still in the cache file after export"

# (2) --no-import
cp "$STATE/zilla.cache" "$T/cache.before"
start_daemon --no-import
z pool list -H -o name,health | grep -qx "good	UNAVAIL" || fail "--no-import imported good"
z pool status good | grep -q 'started with --no-import' || fail "no --no-import reason"
cmp "$STATE/zilla.cache" "$T/cache.before" || fail "--no-import changed the cache file"
z pool import good
z pool status good | grep -q 'state: ONLINE' || fail "good not ONLINE after import by hand"

# (3) kill -9 while the export runs (sim-hdd leaves make its final sync take a while)
truncate -s 128M "$T/disks/ex0" "$T/disks/ex1"
z pool create ex mirror "sim-hdd:$T/disks/ex0" "sim-hdd:$T/disks/ex1"
make_volume ex/v 32M
head -c $((8 << 20)) /dev/urandom | nbdcopy - "$(nbd_unix_uri ex/v)"
ino=$(stat -c %i "$STATE/zilla.cache")
z pool export ex >/dev/null 2>&1 &
export_pid=$!
# SIGKILL the daemon the moment the cache file is first replaced
python3 - "$STATE/zilla.cache" "$ino" "$DAEMON_PID" <<'EOF' || fail "the cache file did not change within 20 s of the export"
import os, signal, sys, time
path, ino, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
end = time.time() + 20
while time.time() < end:
    try:
        if os.stat(path).st_ino != ino:
            os.kill(pid, signal.SIGKILL)
            sys.exit(0)
    except FileNotFoundError:
        pass
    time.sleep(0.0002)
sys.exit(1)
EOF
wait "$DAEMON_PID" 2>/dev/null || true
DAEMON_PID=
wait "$export_pid" 2>/dev/null || true
start_daemon
z pool status ex | grep -q 'state: ONLINE' || fail "the pool whose export was cut short is not imported at restart"
z pool status good | grep -q 'state: ONLINE' || fail "good not imported after kill -9"
grep -q "the export of pool 'ex' did not finish; importing it again" "$T/daemon.log" || fail "no log line for the interrupted export"

# (4) kill -9 is not a broken invariant: every pool comes back
kill9_daemon
[ ! -e "$STATE/zilla.stopped" ] || fail "kill -9 left a stop record"
start_daemon
z pool list -H -o name,health >"$T/list"
grep -qx "good	ONLINE" "$T/list" && grep -qx "ex	ONLINE" "$T/list" || fail "not every pool is back after kill -9: $(cat "$T/list")"
z pool export ex
stop_daemon

# (5) a cache file that cannot be read keeps no daemon from starting: it is moved aside
# to zilla.cache.bad, the log and `pool status` say so, pools are imported by hand
# and a new cache file is written
: >"$STATE/zilla.cache"
start_daemon --no-import
[ -f "$STATE/zilla.cache.bad" ] || fail "the empty cache file was not kept as zilla.cache.bad"
z pool status >"$T/st"
grep -q "^note: .*zilla.cache is not a valid cache file: EOF.*kept as $STATE/zilla.cache.bad" "$T/st" || fail "pool status does not say the cache file was unreadable: $(cat "$T/st")"
stop_daemon
printf '{"version":1,"pools":[{"name":"good"' >"$STATE/zilla.cache"
cp "$STATE/zilla.cache" "$T/cache.cut"
start_daemon
cmp "$STATE/zilla.cache.bad.1" "$T/cache.cut" || fail "the cut-short cache file was not kept as zilla.cache.bad.1"
grep -q "ERROR.*zilla.cache is not a valid cache file.*kept as $STATE/zilla.cache.bad.1" "$T/daemon.log" || fail "no log line for the unreadable cache file"
z pool import -d "$T/disks" good
grep -q '"good"' "$STATE/zilla.cache" || fail "no new cache file after the import"
z pool status good | grep -q 'state: ONLINE' || fail "good not ONLINE after the import by hand"
stop_daemon
log "unavailable pools, --no-import, interrupted export, kill -9, unreadable cache file OK"
