#!/usr/bin/env bash
# Goal: a disk missing when the daemon started (UNAVAIL) rejoins without export and
# import: `pool online` reopens it and resilvers what it missed; `pool clear` retries
# it as zpool clear does. Method: a mirror; stop; take one side away; start (DEGRADED);
# write; put it back; online; resilver; a scrub finds nothing to repair. Then the same
# with clear.
. "$(dirname "$0")/lib.sh"
start_daemon
d=$T/disks
truncate -s 256M "$d/d1" "$d/d2"
z pool create tank mirror "$d/d1" "$d/d2"
make_volume tank/v 128M
uri=$(nbd_unix_uri tank/v)
head -c $((32 << 20)) /dev/urandom >"$T/a"
nbdcopy --flush "$T/a" "$uri"

for how in online clear; do
    stop_daemon
    mv "$d/d2" "$d/d2.away"
    start_daemon
    z pool status tank | tee "$T/st"
    grep -Eq '^\s+\S*d2 +UNAVAIL' "$T/st" || fail "d2 not UNAVAIL while missing"
    # the import's state change names the pool and what the device was before (unknown)
    z pool events -v tank >"$T/ev"
    grep -Pzq 'resource\.fs\.zfs\.statechange\n        class = "resource\.fs\.zfs\.statechange"\n        pool = "tank"\n        pool_guid = 0x[0-9a-f]+\n        vdev_guid = 0x[0-9a-f]+\n        vdev_path = "[^"]*/d2"\n        vdev_state = "UNAVAIL"\n        vdev_laststate = "UNKNOWN"\n' "$T/ev" ||
        fail "no statechange naming the pool for the missing d2: $(cat "$T/ev")"
    head -c $((32 << 20)) /dev/urandom >"$T/a"
    nbdcopy --flush "$T/a" "$uri"
    mv "$d/d2.away" "$d/d2"
    case $how in
        online) z pool online tank "$d/d2" ;;
        clear) z pool clear tank ;;
    esac
    z pool wait -t resilver tank
    z pool status tank | tee "$T/st"
    grep -q "^ state: ONLINE" "$T/st" || fail "$how: pool not ONLINE after the device came back"
    grep -Eq '^\s+\S*d2 +ONLINE' "$T/st" || fail "$how: d2 not ONLINE"
    grep -q "resilvered" "$T/st" || fail "$how: no resilver of what d2 missed"
    # d2 alone holds everything: offline d1, read back
    z pool scrub -w tank
    z pool status tank | grep -q "scrub repaired 0B" || fail "$how: the scrub had to repair blocks"
    z pool offline tank "$d/d1"
    nbdcopy "$uri" "$T/b"
    cmp <(head -c $((32 << 20)) "$T/b") "$T/a" || fail "$how: data read from d2 alone differs"
    z pool online tank "$d/d1"
    z pool wait -t resilver tank
done
log "ok"
