#!/usr/bin/env bash
# Goal: `zilla pool upgrade` turns a format 1 pool into format 2 through the daemon,
# keeping every byte of its volumes, and the upgraded pool imports as format 2.
# Method: create with -o version=1, write random data over NBD, upgrade, read it back,
# export/import, read it back again; upgrade again (nothing to do); a version this
# build does not write is refused.
. "$(dirname "$0")/lib.sh"
start_daemon
for d in a0 a1 b0 b1; do truncate -s 256M "$T/disks/tank-$d"; done
z pool create -o version=1 tank mirror "$T/disks/tank-a0" "$T/disks/tank-a1" mirror "$T/disks/tank-b0" "$T/disks/tank-b1"
make_volume tank/v1 64M
head -c $((4 << 20)) /dev/urandom >"$T/data"
nbdcopy "$T/data" "$(nbd_unix_uri tank/v1)"
z pool upgrade tank | tee "$T/up"
grep -q "format 2" "$T/up" || fail "upgrade: $(cat "$T/up")"
nbdcopy "$(nbd_unix_uri tank/v1)" "$T/back"
cmp -n $((4 << 20)) "$T/back" "$T/data" || fail "data after the upgrade"
z pool export tank
z pool import -d "$T/disks" tank
nbdcopy "$(nbd_unix_uri tank/v1)" "$T/back"
cmp -n $((4 << 20)) "$T/back" "$T/data" || fail "data after import of the upgraded pool"
z pool upgrade tank >/dev/null || fail "a second upgrade is not an error"
z pool scrub -w tank
z pool status tank | grep -q "errors: No known data errors" || fail "scrub of the upgraded pool found errors"
for d in a0 a1 b0 b1; do truncate -s 256M "$T/disks/bad-$d"; done
if z pool create -o version=28 bad mirror "$T/disks/bad-a0" "$T/disks/bad-a1" 2>"$T/err"; then fail "version=28 accepted"; fi
grep -q "version" "$T/err" || fail "version=28 refusal: $(cat "$T/err")"
stop_daemon
log "pool upgrade OK"
