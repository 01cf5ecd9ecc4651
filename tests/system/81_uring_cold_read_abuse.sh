#!/usr/bin/env bash
# Goal: cold reads answered from io_uring completions (the default engine for file
# leaves) stay correct and the daemon stays healthy when a disk goes bad under them,
# when an admin offlines a disk and exports the pool with the clients still reading,
# and when the daemon is killed -9 in the middle; no panic in the daemon log anywhere.
# Method: a cold pool (export + import empties the ARC), nbdcopy/fio readers at high
# queue depth, and: (A) the data region of the *second* child of each mirror
# overwritten with garbage, then (B) of the first child, every byte read must match and
# the pool must heal; (C) offline/online and an export while fio reads (refused without
# -f, the readers going on; with -f it must finish, the daemon answer, the pool import
# intact); (D) kill -9 while fio reads and
# another volume is written + flushed; after the restart the flushed data reads back.
. "$(dirname "$0")/lib.sh"
command -v fio >/dev/null || skip "fio missing"
no_panic() { ! grep -n "panicked" "$T/daemon.log" || fail "$1: the daemon panicked"; }
cold() { z pool export tank; z pool import -d "$T/disks" tank >/dev/null; }
# cold_readers JOBS OUT: empty the ARC, then JOBS fio readers at depth 64 on tank/cold in
# the background for up to 60 s ($FIO; killed at exit)
cold_readers() {
    cold
    fio --name=cold --ioengine=nbd --uri="$(nbd_tcp_uri tank/cold)" --rw=randread --bs=16k --iodepth=64 \
        --numjobs="$1" --size=64M --time_based --runtime=60 --group_reporting >"$2" 2>&1 &
    FIO=$!
    on_exit "kill $FIO 2>/dev/null"
}
DATA_START=$((512 << 10))
start_daemon
make_pool tank 256M
make_volume tank/cold 96M
head -c $((64 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/cold)"
z pool list -H -o name,health

readers() { # N TAG: N parallel full reads, each compared with the data
    local i pids=()
    for ((i = 0; i < $1; i++)); do
        (nbdcopy --requests=64 "$(nbd_unix_uri tank/cold)" "$T/back$i" && cmp -n $((64 << 20)) "$T/data" "$T/back$i") &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "$2: a reader got wrong bytes or failed"; done
    rm -f "$T"/back*
}

garbage() { # FILE: overwrite 160 MiB of the data region (labels kept)
    dd if=/dev/urandom of="$1" bs=1M count=160 seek=$((DATA_START)) oflag=seek_bytes conv=notrunc status=none
}

# --- A, B: bad copies under cold reads, second child then first -----------------
for victim in a1 a0; do
    cold
    garbage "$T/disks/tank-$victim"
    garbage "$T/disks/tank-${victim/a/b}"
    readers 4 "bad $victim"
    z pool status tank | tee "$T/status-$victim"
    grep -q "errors: No known data errors" "$T/status-$victim" || fail "bad $victim: data errors reported"
    z pool scrub -w tank
    z pool status tank | tee "$T/status-$victim-scrub"
    grep -q "errors: No known data errors" "$T/status-$victim-scrub" || fail "bad $victim: errors after the scrub"
    z pool clear tank
    no_panic "bad $victim"
done

# --- C: offline/online and export while fio reads at depth -----------------------
cold_readers 3 "$T/fio-c.out"
sleep 2
z pool offline tank "$T/disks/tank-a0"
sleep 1
z pool online tank "$T/disks/tank-a0"
z pool offline tank "$T/disks/tank-b1"
sleep 1
z pool online tank "$T/disks/tank-b1"
sleep 1
# without -f the export is refused while the readers are attached, and they go on
if timeout 30 "$ZILLA" --state-dir "$STATE" pool export tank >"$T/busy.out" 2>&1; then
    fail "export without -f went ahead with 3 readers attached"
fi
grep -q "cannot export 'tank': pool 'tank' is busy: 3 clients are attached (use -f" "$T/busy.out" \
    || fail "refused export said: $(cat "$T/busy.out")"
z pool list -H | grep -q '^tank' || fail "tank gone after a refused export"
sleep 1
kill -0 "$FIO" 2>/dev/null || fail "the readers stopped after a refused export: $(tail -5 "$T/fio-c.out")"
start=$SECONDS
timeout 60 "$ZILLA" --state-dir "$STATE" pool export -f tank || fail "export -f with readers attached failed or hung ($((SECONDS - start)) s)"
log "export under cold reads took $((SECONDS - start)) s"
timeout 10 "$ZILLA" --state-dir "$STATE" pool list >/dev/null || fail "daemon unresponsive after the export"
kill "$FIO" 2>/dev/null || true
wait "$FIO" 2>/dev/null || true
z pool import -d "$T/disks" tank >/dev/null
readers 2 "after export"
no_panic "export under reads"

# --- D: kill -9 during heavy reads and a flushed write --------------------------
make_volume tank/w 64M
head -c $((32 << 20)) /dev/urandom >"$T/wdata"
cold_readers 2 "$T/fio-d.out"
sleep 1
nbdcopy --flush "$T/wdata" "$(nbd_unix_uri tank/w)"
fio --name=w --ioengine=nbd --uri="$(nbd_tcp_uri tank/w)" --rw=randwrite --bs=64k --iodepth=16 \
    --offset=40M --size=24M --time_based --runtime=60 >"$T/fio-w.out" 2>&1 &
FIOW=$!
on_exit "kill $FIOW 2>/dev/null"
sleep 2
no_panic "before kill -9"
kill9_daemon
kill "$FIO" "$FIOW" 2>/dev/null || true
wait 2>/dev/null || true
start_daemon
z pool list -H -o name | grep -qx tank || fail "tank not imported after kill -9"
nbdcopy "$(nbd_unix_uri tank/w)" "$T/wback"
cmp -n $((32 << 20)) "$T/wdata" "$T/wback" || fail "flushed data lost after kill -9"
readers 2 "after kill -9"
z pool scrub -w tank
z pool status tank | grep -q "errors: No known data errors" || fail "errors after kill -9: $(z pool status tank)"
no_panic "after kill -9"
stop_daemon
no_panic "stop"
log "io_uring cold-read abuse OK"
