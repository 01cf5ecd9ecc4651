#!/usr/bin/env bash
# Goal: a cache device that is corrupted, truncated, swapped or returns EIO, while the
# daemon runs and between runs, never makes a read return other bytes; the L2ARC
# counters say what happened, and a cache device that keeps failing is FAULTED while
# the pool serves.
# Method: an ARC at its 64 MiB floor and a 128 MiB volume, read with nbdcopy and
# compared with what was written after each fault: bytes written into the cache file
# behind the daemon's back (live, and while it is stopped), the file truncated (live,
# and while stopped), two pools' cache files exchanged while stopped, and a cache
# device on a loop device whose backing file shrinks under it (reads past the new end
# fail with EIO).
. "$(dirname "$0")/lib.sh"

arcstats() { curl -sf --unix-socket "$STATE/zilla.sock" http://zilla/v1/arcstats; }
stat_of() { arcstats | python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"; }
no_panic() { ! grep -n "panicked" "$T/daemon.log" || fail "$1: the daemon panicked"; }
# cache_state POOL DEV: the device's state in `pool status`
cache_state() { z pool status "$1" | awk -v d="$2" '$1 == d { print $2 }'; }
ARC=(--tunable zfs_arc_max=$((64 << 20)))
MIB=$((1 << 20))

start_daemon "${ARC[@]}"
make_pool tank 256M
truncate -s 160M "$T/disks/c0"
z pool add tank cache "$T/disks/c0"
make_volume tank/v 128M
uri=$(nbd_unix_uri tank/v)
head -c $((128 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri"

read_pass() {
    nbdcopy "$uri" "$T/back" || fail "$1: a read failed"
    cmp -s "$T/data" "$T/back" || fail "$1: the volume read back differs"
}
# warm BYTES: read passes until the cache devices hold BYTES (the feed runs each second)
warm() {
    local i
    for i in $(seq 40); do
        read_pass "warm pass $i"
        [ "$(stat_of l2_size)" -ge "$1" ] && return 0
        sleep 0.5
    done
    fail "the cache device did not fill to $1: $(arcstats)"
}
# wait_rebuilt: the rebuild at import has run (it counts something either way)
wait_rebuilt() {
    local i s
    for i in $(seq 100); do
        s=$(arcstats | python3 -c "import json,sys; d=json.load(sys.stdin); print(sum(d.get(k, 0) for k in ('l2_rebuild_log_blks','l2_rebuild_dh_errors','l2_rebuild_unsupported','l2_rebuild_cksum_lb_errors','l2_rebuild_io_errors')))")
        [ "$s" -gt 0 ] && { sleep 0.3; return 0; }
        sleep 0.1
    done
}
# scribble FILE: 1 MiB of other bytes every 4 MiB of the file's ring, behind the daemon
scribble() {
    local off
    for ((off = 4; off < 150; off += 4)); do
        dd if=/dev/urandom of="$1" bs=1M count=1 seek=$off conv=notrunc oflag=direct status=none
    done
}

# --- corrupt, live
warm $((64 * MIB))
scribble "$T/disks/c0"
read_pass "corrupted live"
read_pass "corrupted live, again"
[ "$(stat_of l2_cksum_bad)" -gt 0 ] || fail "live corruption not counted: $(arcstats)"
[ "$(cache_state tank "$T/disks/c0")" = ONLINE ] || fail "bad copies faulted the device"
log "corrupt live: $(stat_of l2_cksum_bad) bad copies counted, reads correct"

# --- corrupt, between runs
warm $((64 * MIB))
stop_daemon
scribble "$T/disks/c0"
start_daemon "${ARC[@]}"
wait_rebuilt
read_pass "corrupted while stopped"
read_pass "corrupted while stopped, again"
bad=$(( $(stat_of l2_cksum_bad) + $(stat_of l2_rebuild_cksum_lb_errors) ))
[ "$bad" -gt 0 ] || fail "corruption while stopped not counted: $(arcstats)"
log "corrupt between runs: counted ($bad), reads correct"

# --- truncate, live: copies past the new end cannot be read. The feed goes on writing
# at its ring position, which can extend the file again: copies in the hole between the
# new end and that write read as zeros, a bad checksum rather than an I/O error.
warm $((64 * MIB))
bad_before=$(stat_of l2_cksum_bad)
truncate -s 24M "$T/disks/c0"
read_pass "truncated live"
read_pass "truncated live, again"
lost=$(( $(stat_of l2_io_error) + $(stat_of l2_cksum_bad) - bad_before ))
[ "$lost" -gt 0 ] || fail "reads past the truncated end not counted: $(arcstats)"
log "truncate live: $(stat_of l2_io_error) unreadable copies counted, cache device $(cache_state tank "$T/disks/c0"), reads correct"
no_panic "truncated live"

# --- truncate, between runs: the pool comes back and its cache device is not trusted
# (a cache device faulted while running is tried again at the next import)
stop_daemon
truncate -s 96M "$T/disks/c0"
start_daemon "${ARC[@]}"
z pool list -H -o name,health tank | grep -q ONLINE || fail "the pool is not ONLINE after its cache device shrank: $(z pool status tank)"
wait_rebuilt
read_pass "truncated while stopped"
read_pass "truncated while stopped, again"
[ "$(( $(stat_of l2_cksum_bad) + $(stat_of l2_io_error) ))" = 0 ] || fail "a restored copy of the shrunk device was bad: $(arcstats)"
log "truncate between runs: $(stat_of l2_rebuild_bufs) copies restored, state $(cache_state tank "$T/disks/c0")"
no_panic "truncated while stopped"

# --- EIO: a cache device on a loop device whose backing file shrinks under it
if [ "$(id -u)" -eq 0 ] && losetup -f >/dev/null 2>&1; then
    z pool remove tank "$T/disks/c0"
    truncate -s 160M "$T/disks/l0"
    L0=$(losetup -f --show "$T/disks/l0")
    on_exit "losetup -d $L0"
    z pool add tank cache "$L0"
    warm $((64 * MIB))
    e0=$(stat_of l2_io_error)
    # the feed may write between the truncate and the new capacity, growing the file
    # again (its hole reads as zeros, not EIO): repeat until the device is 16 MiB; from
    # then on a write past the end fails and cannot grow it
    for i in $(seq 20); do
        truncate -s 16M "$T/disks/l0"
        losetup -c "$L0"
        [ "$(blockdev --getsize64 "$L0")" = $((16 * MIB)) ] && break
    done
    [ "$(blockdev --getsize64 "$L0")" = $((16 * MIB)) ] || fail "the loop device did not shrink to 16 MiB"
    for i in 1 2 3; do read_pass "EIO pass $i"; done
    [ "$(stat_of l2_io_error)" -gt "$e0" ] || fail "EIO from the cache device not counted: $(arcstats)"
    st=$(cache_state tank "$L0")
    [ "$st" = FAULTED ] || fail "a cache device whose reads keep failing is $st, not FAULTED: $(z pool status tank)"
    z pool list -H -o name,health tank | grep -q ONLINE || fail "the pool is not ONLINE with a FAULTED cache device"
    read_pass "after the fault"
    log "EIO: $(stat_of l2_io_error) errors, cache device FAULTED, pool ONLINE, reads correct"
    # the disk back and the fault cleared: the device is used again
    truncate -s 160M "$T/disks/l0"
    losetup -c "$L0"
    z pool clear tank "$L0"
    [ "$(cache_state tank "$L0")" = ONLINE ] || fail "the cleared cache device is not ONLINE"
    warm $((16 * MIB))
    log "cleared: the cache device holds $(( $(stat_of l2_size) >> 20 )) MiB again"
    z pool remove tank "$L0"
    no_panic "EIO"
else
    log "no loop devices: the EIO part is left out"
fi
z pool destroy tank
stop_daemon
no_panic "end"
log "corrupt, truncated and failing cache devices never returned other bytes"
