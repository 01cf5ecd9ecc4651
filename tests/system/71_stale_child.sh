#!/usr/bin/env bash
# Goal: a mirror child put back with old contents (a disk pulled and reinserted, or
# restored from an image) is not taken for a current one. Method: copy one child's file
# aside, write more through NBD, export, put the old copy back, import: `pool status`
# must say the child missed txgs, `pool offline` of the only current child must be
# refused while the resilver has not finished, every block must read back right, and
# after the resilver the old child alone must serve everything. Then the halves of the
# mirror are imported alone and written apart (d0's half more): together, the pool is
# d0's, d1 is diverged (status says so, offline of d0 refused) and is rebuilt from d0,
# with nothing of d1's other life served.
. "$(dirname "$0")/lib.sh"
start_daemon
truncate -s 256M "$T/disks/d0" "$T/disks/d1"
z pool create tank mirror "$T/disks/d0" "$T/disks/d1"
make_volume tank/v 64M
head -c $((32 << 20)) /dev/urandom >"$T/data1"
head -c $((16 << 20)) /dev/urandom >"$T/data2"
nbdcopy "$T/data1" "$(nbd_unix_uri tank/v)"
z pool export tank
cp --sparse=always "$T/disks/d1" "$T/d1.old"

z pool import -d "$T/disks" tank
nbdcopy "$T/data2" "$(nbd_unix_uri tank/v)"
z pool export tank
{ cat "$T/data2"; tail -c +$(((16 << 20) + 1)) "$T/data1"; } >"$T/want"
mv "$T/d1.old" "$T/disks/d1"

# the resilver stops after its first L1 span (of four), so the check below sees it
# unfinished
z tunable set zfs_scan_pause_every_spans=1
z pool import -d "$T/disks" tank
z pool status tank | tee "$T/st1"
# as zpool: a pool resilvering onto a child that missed txgs is ONLINE, the status
# says the resilver is running and the child is marked
grep -q 'state: ONLINE' "$T/st1" || fail "a pool resilvering a stale child is not ONLINE"
grep -q 'currently being resilvered' "$T/st1" || fail "a stale child is shown as current"
grep -E "d1 .*\(missed txgs? " "$T/st1" || fail "status does not say that d1 missed txgs"
expect_error "only device holding" z pool offline tank "$T/disks/d0"
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back1"
cmp <(head -c $((32 << 20)) "$T/back1") "$T/want" || fail "data differs with the stale child back"

# the resilver runs to the end (export and import restart it), then d1 alone
z tunable set zfs_scan_pause_every_spans=0
z pool export tank
z pool import -d "$T/disks" tank
for ((i = 0; i < 300; i++)); do
    z pool status tank >"$T/st2"
    grep -q 'scan: resilvered' "$T/st2" && ! grep -q 'resilvering' "$T/st2" && break
    sleep 0.1
done
cat "$T/st2"
grep -q 'scan: resilvered .* with 0 errors' "$T/st2" || fail "the resilver did not finish cleanly"
z pool offline tank "$T/disks/d0"
z pool export tank
z pool import -d "$T/disks" tank
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back2"
cmp <(head -c $((32 << 20)) "$T/back2") "$T/want" || fail "the resilvered child alone serves other data"
z pool online tank "$T/disks/d0"
wait_resilvered() {
    for ((i = 0; i < 300; i++)); do
        z pool status tank >"$T/st"
        grep -q 'scan: resilvered' "$T/st" && ! grep -q 'resilvering' "$T/st" && return 0
        sleep 0.1
    done
    cat "$T/st"; fail "the resilver did not finish"
}
wait_resilvered
z pool export tank

# the halves apart: d0 alone (two imports, more txgs), then d1 alone
mkdir "$T/aside"
mv "$T/disks/d1" "$T/aside/"
z pool import -d "$T/disks" tank
head -c $((8 << 20)) /dev/urandom >"$T/c1"
nbdcopy "$T/c1" "$(nbd_unix_uri tank/v)"
z pool export tank
z pool import -d "$T/disks" tank
head -c $((4 << 20)) /dev/urandom >"$T/c2"
nbdcopy "$T/c2" "$(nbd_unix_uri tank/v)"
z pool export tank
mv "$T/disks/d0" "$T/aside/" && mv "$T/aside/d1" "$T/disks/"
z pool import -d "$T/disks" tank
head -c $((12 << 20)) /dev/urandom >"$T/d"
nbdcopy "$T/d" "$(nbd_unix_uri tank/v)"
z pool export tank
mv "$T/aside/d0" "$T/disks/"
{ cat "$T/c2"; tail -c +$(((4 << 20) + 1)) "$T/c1"; tail -c +$(((8 << 20) + 1)) "$T/want"; } >"$T/want2"

z tunable set zfs_scan_pause_every_spans=1
z pool import -d "$T/disks" tank
z pool status tank | tee "$T/st3"
grep -E "d1 .*\(diverged" "$T/st3" || fail "status does not say that d1 is diverged"
expect_error "only device holding" z pool offline tank "$T/disks/d0"
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back3"
cmp <(head -c $((32 << 20)) "$T/back3") "$T/want2" || fail "the pool serves other data than d0's half"
z tunable set zfs_scan_pause_every_spans=0
z pool export tank
z pool import -d "$T/disks" tank
wait_resilvered
z pool offline tank "$T/disks/d0"
z pool export tank
z pool import -d "$T/disks" tank
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back4"
cmp <(head -c $((32 << 20)) "$T/back4") "$T/want2" || fail "the rebuilt diverged child alone serves other data"
stop_daemon
log "a stale child is resilvered, a diverged one rebuilt; neither is taken for a current copy before"
