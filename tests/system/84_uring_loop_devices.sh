#!/usr/bin/env bash
# Goal: block-device leaves (loop devices, one with 4 KiB sectors) on the io_uring
# engine: cold reads over garbage on one side of the mirror return the right bytes and
# heal; export releases the O_EXCL claims at once (import right after works, while
# the last reaper threads may still be winding down); a device shrunk under the pool
# (its reads past the new end fail) is faulted, never the good one, and every byte
# still reads back; no panic.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || skip "needs root for losetup"
losetup -f >/dev/null 2>&1 || skip "no free loop device"
no_panic() { ! grep -n "panicked" "$T/daemon.log" || fail "$1: the daemon panicked"; }
DATA_START=$((512 << 10))
truncate -s 256M "$T/disks/l0" "$T/disks/l1"
L0=$(losetup -f --show "$T/disks/l0")
on_exit "losetup -d $L0"
L1=$(losetup -f --show --sector-size 4096 "$T/disks/l1")
on_exit "losetup -d $L1"
log "loop devices $L0 (512) $L1 (4096)"
start_daemon
z pool create tank mirror "$L0" "$L1"
make_volume tank/cold 128M
head -c $((96 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/cold)"
readers() {
    local i pids=()
    for ((i = 0; i < 3; i++)); do
        (nbdcopy --requests=64 "$(nbd_unix_uri tank/cold)" "$T/back$i" && cmp -n $((96 << 20)) "$T/data" "$T/back$i") &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "$1: a reader got wrong bytes or failed"; done
    rm -f "$T"/back*
}
for victim in l1 l0; do
    for i in 1 2 3; do
        z pool export tank
        z pool import -d "$L0" -d "$L1" tank >/dev/null 2>"$T/imp.err" || fail "import right after export: $(cat "$T/imp.err")"
    done
    dd if=/dev/urandom of="$T/disks/$victim" bs=1M count=200 seek=$DATA_START oflag=seek_bytes conv=notrunc status=none
    sync "$T/disks/$victim"
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    readers "garbage on $victim"
    z pool status tank | tee "$T/st"
    grep -q "errors: No known data errors" "$T/st" || fail "garbage on $victim: data errors"
    z pool scrub -w tank
    z pool clear tank
    no_panic "garbage on $victim"
done
# shrink l1 under the pool
z pool export tank
z pool import -d "$L0" -d "$L1" tank >/dev/null
truncate -s 64M "$T/disks/l1"
losetup -c "$L1"
readers "shrunk l1"
z pool status tank | tee "$T/st"
grep -q "errors: No known data errors" "$T/st" || fail "shrunk l1: data errors"
grep "$L0" "$T/st" | grep -q ONLINE || fail "the good device is not ONLINE"
no_panic "shrunk"
stop_daemon
no_panic "stop"
log "io_uring on loop devices OK"
