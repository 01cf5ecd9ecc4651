#!/usr/bin/env bash
# Goal: another pool's disk at a cache device's path (what a reboot that reshuffles
# /dev/sdX names does) costs the pool only that cache device: the pool imports ONLINE
# at daemon start and by hand, `pool status` shows the cache device UNAVAIL with whose
# label is there, the volume serves, and the other pool's disk is never written (I/O,
# txg syncs, trim, scrub, export); the other pool still imports. At a data device's
# path the same disk still keeps the pool from importing. Once the link is fixed,
# `pool online` brings the cache device back.
# Method: pools 'tank' (a mirror of two files and a cache file) and 'other' (one
# file); the cache file's path replaced by a symlink to other's file; sha256 of that
# file before and after everything tank does.
. "$(dirname "$0")/lib.sh"
D=$T/disks
for f in a0 a1 c0 o0; do truncate -s 256M "$D/$f"; done
start_daemon
z pool create tank mirror "$D/a0" "$D/a1" cache "$D/c0"
z pool create other "$D/o0"
make_volume tank/v 32M
make_volume other/v 16M
head -c $((32 << 20)) /dev/urandom >"$T/data"
head -c $((16 << 20)) /dev/urandom >"$T/odata"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/v)"
nbdcopy --flush "$T/odata" "$(nbd_unix_uri other/v)"
other_guid=$(z get -H guid other | cut -f3)
stop_daemon

# cache_line POOL DEV: the device's line in `pool status`
cache_line() { z pool status "$1" | awk -v d="$2" '$1 == d'; }
# check_tank WHEN: tank ONLINE, c0 UNAVAIL naming other's label, the volume reads back
check_tank() {
    z pool status tank | tee "$T/st"
    grep -q '^ state: ONLINE$' "$T/st" || fail "$1: tank is not ONLINE"
    local line
    line=$(cache_line tank "$D/c0")
    [[ $line == *UNAVAIL* ]] || fail "$1: the cache device is not UNAVAIL: '$line'"
    [[ $line == *"label belongs to pool 'other' (guid $other_guid)"* ]] || fail "$1: no reason beside the cache device: '$line'"
    nbdcopy "$(nbd_unix_uri tank/v)" "$T/back"
    cmp -s "$T/data" "$T/back" || fail "$1: tank/v reads back other bytes"
}
o0_sum() { sha256sum <"$D/o0" | cut -d' ' -f1; }

# --- 1. at daemon start, other imported alongside
mv "$D/c0" "$D/c0.real"
ln -s "$D/o0" "$D/c0"
start_daemon
check_tank "at daemon start"
z pool status other | grep -q '^ state: ONLINE$' || fail "other is not ONLINE"
nbdcopy "$(nbd_unix_uri other/v)" "$T/oback"
cmp -s "$T/odata" "$T/oback" || fail "other/v reads back other bytes"

# --- 2. nothing tank does writes other's disk (other exported: its own writes stop)
z pool export other
sum0=$(o0_sum)
head -c $((32 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/v)"
z pool trim -w tank
z pool scrub -w tank
z pool iostat -v tank >/dev/null
check_tank "after writes, trim and scrub"
stop_daemon # exports tank
[ "$(o0_sum)" = "$sum0" ] || fail "other's disk changed while it stood at tank's cache path"

# --- 3. by hand: `pool import` from the cached devices
start_daemon --no-import
z pool import tank
check_tank "imported by hand"
stop_daemon
[ "$(o0_sum)" = "$sum0" ] || fail "other's disk changed by tank's import by hand"

# --- 4. at a data device's path the foreign disk still refuses the import
mv "$D/a1" "$D/a1.real"
ln -s "$D/o0" "$D/a1"
start_daemon
z pool status tank | tee "$T/st"
grep -q '^ state: UNAVAIL$' "$T/st" || fail "tank imported with other's disk at a data path"
grep -q "a1 belongs to another pool ('other'" "$T/st" || fail "no reason for the refusal"
stop_daemon
[ "$(o0_sum)" = "$sum0" ] || fail "other's disk changed by a refused import"
rm "$D/a1"
mv "$D/a1.real" "$D/a1"

# --- 5. other still imports, its disk listed once although two paths lead to it
start_daemon
check_tank "again at daemon start"
z pool import -d "$D" | tee "$T/list"
grep -A2 'pool: other' "$T/list" | grep -q 'state: ONLINE' || fail "other is not listed ONLINE"
grep -q "^[[:space:]]*$D/c0\$" "$T/list" && fail "the symlink to other's disk is listed as a device of its own"
z pool import -d "$D" other
nbdcopy "$(nbd_unix_uri other/v)" "$T/oback"
cmp -s "$T/odata" "$T/oback" || fail "other/v reads back other bytes after all this"

# --- 6. the admin fixes the link: online brings the cache device back, and it serves
rm "$D/c0"
mv "$D/c0.real" "$D/c0"
z pool online tank "$D/c0"
line=$(cache_line tank "$D/c0")
[[ $line == *ONLINE* ]] || fail "the cache device is not ONLINE after online: '$line'"
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back"
cmp -s "$T/data" "$T/back" || fail "tank/v reads back other bytes after online"
stop_daemon
start_daemon
line=$(cache_line tank "$D/c0")
[[ $line == *ONLINE* ]] || fail "the cache device is not ONLINE after a restart: '$line'"
z pool status other | grep -q '^ state: ONLINE$' || fail "other is not ONLINE after a restart"
stop_daemon
log "another pool's disk at the cache path: tank imports, the disk is untouched; at a data path: refused"
