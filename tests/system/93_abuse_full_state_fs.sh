#!/usr/bin/env bash
# Goal (issue 14 row 5): admin operations are all or nothing. With the state directory
# on a full file system (a 256 KiB tmpfs), `pool create` fails saying why and leaves no
# pool: not in `pool list`, not importable from its devices (the labels were wiped),
# and not after a daemon restart. `pool destroy` on a full file system changes nothing.
. "$(dirname "$0")/lib.sh"

mkdir -p "$STATE"
mount -t tmpfs -o size=256k,mode=0700 zilla-state-test "$STATE" || skip "cannot mount a tmpfs"
on_exit "umount -l '$STATE'"
start_daemon

fill() { dd if=/dev/zero of="$STATE/filler" bs=4k 2>/dev/null || true; }
fill
for d in a0 a1 b0 b1; do truncate -s 128M "$T/disks/tank-$d"; done
create() {
    z pool create tank mirror "$T/disks/tank-a0" "$T/disks/tank-a1" mirror "$T/disks/tank-b0" "$T/disks/tank-b1"
}
expect_error "cannot create 'tank': cannot write the cache file $STATE/zilla.cache: No space left on device.*the pool was destroyed again" create
[ -z "$(z pool list -H)" ] || fail "a pool exists after the failed create: $(z pool list -H)"
z pool import -d "$T/disks" >"$T/importable" 2>&1 || true
! grep -q tank "$T/importable" || fail "the failed pool is still importable from its devices: $(cat "$T/importable")"
log "failed create left no pool (not listed, not importable)"

# A retry does not say "already exists"; after a restart there is still no pool.
expect_error "No space left on device" create
stop_daemon
rm -f "$STATE/filler"
start_daemon
[ -z "$(z pool list -H)" ] || fail "a pool exists after restart: $(z pool list -H)"
grep -q tank "$STATE/zilla.cache" && fail "zilla.cache lists the failed pool"
log "no pool after restart"

# With space, the same create works (the devices were left free).
create
z pool list -H | grep -q '^tank' || fail "create with space failed"

# Destroy on a full file system: refused, and nothing changed.
fill
expect_error "cannot destroy 'tank': cannot write the cache file .*No space left on device.*nothing was changed" z pool destroy tank
z pool list -H | grep -q '^tank' || fail "tank gone after the refused destroy"
z pool status tank | grep -q ONLINE || fail "tank not ONLINE after the refused destroy"
rm -f "$STATE/filler"
stop_daemon
start_daemon
z pool list -H | grep -q '^tank' || fail "tank not imported after restart"
z pool destroy tank
[ -z "$(z pool list -H)" ] || fail "destroy with space failed"
log "destroy refused on a full state fs, then done with space"
