#!/usr/bin/env bash
# Goal: `zilla pool events` and `zilla pool history` as zpool's: a scrub's start and
# finish, a checksum error found on a scribbled mirror disk (with the device and the
# range), offline/online and attach are events, shown in short and -v form and in the
# daemon's log at the right level; every command that changed the pool is in its
# history ("History for 'tank':", `YYYY-MM-DD.HH:MM:SS zilla pool ...`, -l with the
# user and host). Both survive a daemon restart; the history lives in the pool and
# survives export/import; -f follows new events; a scrub ended by a resilver is
# aborted; -c clears them.
. "$(dirname "$0")/lib.sh"
start_daemon
D=$T/disks
truncate -s 256M "$D/d0" "$D/d1" "$D/d2"
z pool create tank mirror "$D/d0" "$D/d1"
make_volume tank/v 64M
head -c $((32 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/v)"
z pool scrub -w tank

# scribble 8 MiB of d1 inside the data written above: from the first MiB that holds it
first=$(python3 -c '
import sys
f = open(sys.argv[1], "rb"); f.seek(1 << 20); i = 1
while (b := f.read(1 << 20)):
    if sum(1 for x in b[::512] if x) > 1800: print(i); break
    i += 1' "$D/d1")
[ -n "$first" ] || fail "no data found on d1"
lo=$(((first + 2) << 20)); hi=$((lo + (8 << 20)))
dd if=/dev/urandom of="$D/d1" bs=1M seek=$((first + 2)) count=8 conv=notrunc,fsync status=none
z pool scrub -w tank
z pool status tank | tee "$T/st"
grep -Eq 'scan: scrub repaired [1-9][0-9.]*[KMG]' "$T/st" || fail "the scrub repaired nothing on the scribbled disk"
z pool offline tank "$D/d1"
z pool online tank "$D/d1"
z pool attach tank "$D/d0" "$D/d2"
# every resilver (the online's, the attach's) finished
for ((i = 0; i < 300; i++)); do
    z pool events tank >"$T/ev"
    grep -q vdev_attach "$T/ev" && [ "$(grep -c resilver_start "$T/ev")" -eq "$(grep -c resilver_finish "$T/ev")" ] && break
    sleep 0.1
done

z pool events tank | tee "$T/ev"
head -1 "$T/ev" | grep -Eq '^TIME {27}CLASS$' || fail "events: header"
for c in sysevent.fs.zfs.pool_create sysevent.fs.zfs.scrub_start sysevent.fs.zfs.scrub_finish ereport.fs.zfs.checksum \
    resource.fs.zfs.statechange sysevent.fs.zfs.vdev_online sysevent.fs.zfs.vdev_attach sysevent.fs.zfs.resilver_start \
    sysevent.fs.zfs.resilver_finish; do
    grep -Eq "^[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{9} $c\$" "$T/ev" || fail "events: no $c line"
done
[ "$(grep -c 'sysevent.fs.zfs.scrub_start' "$T/ev")" -eq 2 ] || fail "events: expected two scrub starts"
# the order: create, then the scrubs, then the attach
awk '/pool_create/{c=NR} /scrub_start/{if(!s)s=NR} /vdev_attach/{a=NR} END{exit !(c<s && s<a)}' "$T/ev" || fail "events out of order"

z pool events -v tank >"$T/evv"
# the checksum report names the scribbled device and a range inside the scribble
python3 - "$D/d1" "$lo" "$hi" "$T/evv" <<'PY' || { grep -A12 checksum "$T/evv" | head -30; fail "events -v: no checksum report on d1 inside the scribbled range"; }
import sys
dev, lo, hi, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ok = False
for ev in open(path).read().split("\n\n"):
    lines = ev.strip("\n").split("\n")
    if not lines[0].endswith(" ereport.fs.zfs.checksum"):
        continue
    f = dict(l.strip().split(" = ", 1) for l in lines[1:])
    off, size = int(f["zio_offset"], 16), int(f["zio_size"], 16)
    ok |= f["vdev_path"] == '"%s"' % dev and size > 0 and off < hi and off + size > lo
sys.exit(0 if ok else 1)
PY
grep -Pzq 'resource\.fs\.zfs\.statechange\n        class = "resource\.fs\.zfs\.statechange"\n        pool = "tank"\n        pool_guid = 0x[0-9a-f]+\n        vdev_guid = 0x[0-9a-f]+\n        vdev_path = "[^"]*/d1"\n        vdev_state = "OFFLINE"\n        vdev_laststate = "ONLINE"\n' "$T/evv" ||
    fail "events -v: no OFFLINE state change of d1"
grep -Pzq 'sysevent\.fs\.zfs\.vdev_attach\n        class = "sysevent\.fs\.zfs\.vdev_attach"\n        pool = "tank"\n        pool_guid = 0x[0-9a-f]+\n        vdev_path = "[^"]*/d2"\n' "$T/evv" ||
    fail "events -v: no attach of d2"
grep -Eq '^        eid = 0x[0-9a-f]+$' "$T/evv" || fail "events -v: no eid"
# the daemon's log: repairs at warn, scrub start and finish at info
grep -Eq 'WARN.*event: ereport\.fs\.zfs\.checksum pool=tank vdev=[^ ]*/d1 zio_offset=0x[0-9a-f]+ zio_size=0x' "$T/daemon.log" || fail "log: no warning for the checksum error"
grep -Eq 'INFO.*event: sysevent\.fs\.zfs\.scrub_start pool=tank' "$T/daemon.log" || fail "log: no scrub start"
grep -Eq 'INFO.*event: sysevent\.fs\.zfs\.scrub_finish pool=tank .*scan_repaired=[1-9]' "$T/daemon.log" || fail "log: no scrub finish with its repairs"
grep -Eq 'WARN.*event: resource\.fs\.zfs\.statechange pool=tank vdev=[^ ]*/d1 vdev_state=OFFLINE' "$T/daemon.log" || fail "log: no warning for the offline"

z pool history tank | tee "$T/hist"
ts='[0-9]{4}-[0-9]{2}-[0-9]{2}\.[0-9]{2}:[0-9]{2}:[0-9]{2}'
expected=(
    "History for 'tank':"
    "$ts zilla pool create tank mirror $D/d0 $D/d1"
    "$ts zilla volume create -s -V 64M tank/v"
    "$ts zilla pool scrub -w tank"
    "$ts zilla pool scrub -w tank"
    "$ts zilla pool offline tank $D/d1"
    "$ts zilla pool online tank $D/d1"
    "$ts zilla pool attach tank $D/d0 $D/d2"
)
[ "$(grep -c . "$T/hist")" -eq ${#expected[@]} ] || fail "history: expected ${#expected[@]} lines"
for ((i = 0; i < ${#expected[@]}; i++)); do
    sed -n "$((i + 1))p" "$T/hist" | grep -Eqx -- "${expected[i]}" || fail "history line $((i + 1)): want /${expected[i]}/"
done
z pool history -l tank | sed -n 2p | grep -Eqx "$ts zilla pool create tank mirror $D/d0 $D/d1 \[user $(id -u) \($(id -un)\) on $(hostname):local\]" ||
    fail "history -l: no user/host on the create line"
# reads are not recorded
z pool status tank >/dev/null
z pool history tank | cmp -s - "$T/hist" || fail "history: a read was recorded"

# both survive a restart
z pool events -v tank >"$T/evv1"
stop_daemon
start_daemon
z pool history tank | cmp - "$T/hist" || fail "history changed across a restart"
z pool events -v tank >"$T/evv2"
head -c "$(stat -c %s "$T/evv1")" "$T/evv2" | cmp -s - "$T/evv1" || fail "events changed across a restart"

# -f follows new events
z pool events -f tank >"$T/follow" 2>&1 &
fpid=$!
sleep 0.5
z pool scrub -w tank
for ((i = 0; i < 50; i++)); do grep -q scrub_finish "$T/follow" && break; sleep 0.1; done
kill "$fpid"; wait "$fpid" 2>/dev/null || true
[ "$(grep -c 'sysevent.fs.zfs.scrub_start' "$T/follow")" -eq 3 ] || { cat "$T/follow"; fail "events -f: the new scrub start was not followed"; }
[ "$(grep -c 'sysevent.fs.zfs.scrub_finish' "$T/follow")" -eq 3 ] || fail "events -f: the new scrub finish was not followed"

# the history lives in the pool: export, import, still there (and the two commands)
z pool export tank
z pool import -d "$D" tank
z pool history tank | tee "$T/hist2"
cmp -s <(head -n ${#expected[@]} "$T/hist2") <(head -n ${#expected[@]} "$T/hist") || fail "history lost across export/import"
tail -n +$((${#expected[@]} + 1)) "$T/hist2" | grep . >"$T/tail"
grep -Eqx "$ts zilla pool scrub -w tank" <(sed -n 1p "$T/tail") || fail "history: the last scrub"
grep -Eqx "$ts zilla pool export tank" <(sed -n 2p "$T/tail") || fail "history: no export line"
grep -Eqx "$ts zilla pool import -d $D tank" <(sed -n 3p "$T/tail") || fail "history: no import line"
z pool events tank | grep -q 'sysevent.fs.zfs.pool_export' || fail "events: no export"
z pool events tank | grep -q 'sysevent.fs.zfs.pool_import' || fail "events: no import"

# a resilver that takes over from a scrub ends it as zfs does: scrub_abort
truncate -s 256M "$D/d3"
z tunable set zfs_scan_pause_every_spans=1
z pool scrub tank
for ((i = 0; i < 100; i++)); do z pool status tank | grep -q 'scrub paused' && break; sleep 0.1; done
z tunable set zfs_scan_pause_every_spans=0
z pool attach -w tank "$D/d0" "$D/d3"
z pool events tank >"$T/ev"
tail -n 6 "$T/ev"
awk '/scrub_start/{s=NR} /scrub_abort/{a=NR} /vdev_attach/{t=NR} END{exit !(s && a > s && t > s)}' "$T/ev" || fail "events: the scrub the attach's resilver replaced has no scrub_abort"
z pool status tank | grep -q 'scrub paused' && fail "status still shows the replaced scrub"

n=$(z pool events | tail -n +2 | grep -c .)
z pool events -c | grep -qx "cleared $n events" || fail "events -c: count"
[ "$(z pool events | grep -c .)" -eq 1 ] || fail "events -c: events left"
expect_error "cannot get events for 'nope'" z pool events nope
expect_error "cannot open 'nope'" z pool history nope
log "PASS"
