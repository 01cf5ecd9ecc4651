#!/usr/bin/env bash
# Goal: a failed disk swapped for a new one at the same path is replaced as zpool
# does: `pool replace POOL DEV` with no new device resilvers onto the new disk (shown
# as DEV/old and DEV under replacing-N); with autoreplace=on the daemon does it by
# itself. Refused: replacing a working device in place, a device at the path that
# holds another pool's label or a file system (autoreplace logs it and leaves it
# alone), and nothing at the path. Method: a mirror with data; stop; swap d2 for a
# blank file; start (d2 UNAVAIL); replace in place; data intact with d1 offline.
# Then autoreplace=on: swap again while running (d2 faulted by I/O errors is not
# simulated: UNAVAIL at start); the daemon replaces it within seconds.
. "$(dirname "$0")/lib.sh"
start_daemon
d=$T/disks
truncate -s 256M "$d/d1" "$d/d2"
z pool create tank mirror "$d/d1" "$d/d2"
make_volume tank/v 128M
uri=$(nbd_unix_uri tank/v)
head -c $((64 << 20)) /dev/urandom >"$T/a"
nbdcopy --flush "$T/a" "$uri"

check_data_on_d2() { # what: d2 alone holds everything
    z pool offline tank "$d/d1"
    nbdcopy "$uri" "$T/b"
    cmp <(head -c $((64 << 20)) "$T/b") "$T/a" || fail "$1: data read from the new d2 alone differs"
    z pool online tank "$d/d1"
    z pool wait -t resilver tank
}

# a working device cannot be replaced in place
expect_error "is busy" z pool replace tank "$d/d2"

swap_d2() { # replace d2 by a blank disk of the same size
    rm -f "$d/d2"
    truncate -s 256M "$d/d2"
}

stop_daemon
swap_d2
start_daemon
z pool status tank | tee "$T/st"
grep -Eq '^\s+\S*d2 +UNAVAIL' "$T/st" || fail "blank d2 not UNAVAIL"
# a blank disk is not this pool's: online refuses, saying what is there
expect_error "no valid label" z pool online tank "$d/d2"
# another pool's label or a file system at the path: refused without -f
mkfs.ext4 -q -F "$d/d2" >/dev/null
expect_error "existing ext4|use -f" z pool replace tank "$d/d2"
swap_d2
# the resilver pauses after its first span, so the restart below comes in the middle
z tunable set zfs_scan_pause_every_spans=1
z pool replace tank "$d/d2"
z pool status tank | tee "$T/st"
grep -Eq "replacing-[0-9]+" "$T/st" || fail "no replacing-N shown during the replace"
if grep -q "d2/old" "$T/st"; then
    # the path names the new device, PATH/old the old one
    z pool status tank | grep -Eq '^\s+\S*d2/old +(UNAVAIL|FAULTED)' || fail "PATH/old is not the missing old device"
else
    fail "the old device is not shown as PATH/old during a replace in place"
fi
# a restart in the middle: two leaves of the config share the path; the pool imports
stop_daemon
start_daemon
z pool status tank | tee "$T/st"
! grep -q "^ state: UNAVAIL" "$T/st" || fail "the pool is not imported after a restart during a replace in place"
z pool wait -t replace tank
z pool status tank | tee "$T/st"
grep -q "^ state: ONLINE" "$T/st" || fail "pool not ONLINE after the replace in place"
grep -Eq '^\s+\S*d2 +ONLINE' "$T/st" || fail "new d2 not ONLINE"
! grep -q "d2/old" "$T/st" || fail "the old d2 is still shown after the replace"
z pool history tank | grep -q "zilla pool replace tank $d/d2" || fail "replace in place not in history"
check_data_on_d2 "replace in place"
# the old half was missing throughout: keeping its DTL is no failure worth a warning
! grep -q "could not repair every block" "$T/daemon.log" || fail "a warning that the resilver could not repair the missing old device"

# autoreplace=on: the daemon replaces a blank disk put at the path by itself
z pool set autoreplace=on tank
z pool get autoreplace tank | grep -q "on" || fail "autoreplace not on"
stop_daemon
swap_d2
start_daemon
# another file system there first: left alone, the log says why
mkfs.ext4 -q -F "$d/d2" >/dev/null
sleep 12
z pool status tank | grep -Eq '^\s+\S*d2 +UNAVAIL' || fail "autoreplace took a device holding a file system"
grep -q "autoreplace: not replacing" "$T/daemon.log" || fail "autoreplace did not log why it left d2 alone"
[ "$(grep -c "autoreplace: not replacing" "$T/daemon.log")" -eq 1 ] || fail "autoreplace logged the same refusal more than once"
swap_d2
for i in $(seq 60); do
    z pool status tank | grep -Eq "replacing-[0-9]+|d2 +ONLINE" && break
    sleep 1
done
z pool wait -t replace tank
z pool status tank | tee "$T/st"
grep -q "^ state: ONLINE" "$T/st" || fail "pool not ONLINE after autoreplace"
grep -Eq '^\s+\S*d2 +ONLINE' "$T/st" || fail "autoreplaced d2 not ONLINE"
z pool history tank | grep -q "(autoreplace)" || fail "autoreplace not in history"
z pool events tank | grep -q "vdev_attach" || fail "no vdev_attach event"
check_data_on_d2 "autoreplace"
z pool scrub -w tank
z pool status tank | grep -q "scrub repaired 0B" || fail "the scrub had to repair blocks after autoreplace"
log "ok"
