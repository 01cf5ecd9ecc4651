#!/usr/bin/env bash
# Goal: the L2ARC under a careless admin and a crashing daemon: kill -9 at random
# moments of the feed restores only valid copies; cache devices added and removed
# while nbdcopy reads never cost a read or a byte, an added one is fed and a removed
# one is never written again; two pools' cache files exchanged between runs never
# serve one pool's blocks to the other, nor do two cache devices of one pool
# exchanged; `pool iostat -v` lists the cache devices under `cache` with their I/O.
# Method: an ARC at its 64 MiB floor, 96 MiB volumes compared with what was written
# after each step; a 40 MiB cache device so the ring wraps during the kill -9 rounds.
. "$(dirname "$0")/lib.sh"

arcstats() { curl -sf --unix-socket "$STATE/zilla.sock" http://zilla/v1/arcstats; }
stat_of() { arcstats | python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"; }
no_panic() { ! grep -n "panicked" "$T/daemon.log" || fail "$1: the daemon panicked"; }
cache_state() { z pool status "$1" | awk -v d="$2" '$1 == d { print $2 }'; }
pool_health() { z pool list -H -o health "$1"; }
ARC=(--tunable zfs_arc_max=$((64 << 20)))
MIB=$((1 << 20))
VOL=$((96 * MIB))

start_daemon "${ARC[@]}"
make_pool tank 256M
truncate -s 40M "$T/disks/c0"
z pool add tank cache "$T/disks/c0"
make_volume tank/v 96M
uri=$(nbd_unix_uri tank/v)
head -c $VOL /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri"

read_pass() { # URI DATA WHAT
    local out
    out=$(mktemp "$T/back.XXXXXX")
    nbdcopy "$1" "$out" || fail "$3: a read failed"
    cmp -s "$2" "$out" || fail "$3: the volume read back differs"
    rm -f "$out"
}
warm() { # BYTES
    local i
    for i in $(seq 40); do
        read_pass "$uri" "$T/data" "warm pass $i"
        [ "$(stat_of l2_size)" -ge "$1" ] && return 0
        sleep 0.5
    done
    fail "the cache devices did not fill to $1: $(arcstats)"
}
wait_rebuilt() {
    local i s
    for i in $(seq 100); do
        s=$(arcstats | python3 -c "import json,sys; d=json.load(sys.stdin); print(sum(d.get(k, 0) for k in ('l2_rebuild_log_blks','l2_rebuild_dh_errors','l2_rebuild_unsupported','l2_rebuild_cksum_lb_errors','l2_rebuild_io_errors')))")
        [ "$s" -gt 0 ] && { sleep 0.3; return 0; }
        sleep 0.1
    done
}

# --- pool iostat -v: the cache device under `cache`, with its reads and writes
warm $((24 * MIB))
read_pass "$uri" "$T/data" "before iostat"
z pool iostat -v tank | tee "$T/iostat"
grep -Eq '^cache( |$)' "$T/iostat" || fail "pool iostat -v has no cache section"
z pool iostat -v -H -p tank >"$T/iostat.p"
read -r rops wops < <(awk -v d="$T/disks/c0" '$1 == d { print $4, $5 }' "$T/iostat.p")
[ "${rops:-0}" -gt 0 ] && [ "${wops:-0}" -gt 0 ] || fail "pool iostat -v shows no reads or writes of the cache device: $(cat "$T/iostat.p")"

# --- kill -9 at random moments of the feed, then the rebuild: only valid copies
for round in 1 2 3 4; do
    (for p in 1 2 3; do nbdcopy "$uri" "$T/kill.back" 2>/dev/null || exit 0; done) &
    reader=$!
    sleep "$(python3 -c "import random; print(round(random.uniform(0.3, 2.5), 2))")"
    kill9_daemon
    wait "$reader" 2>/dev/null || true
    rm -f "$STATE/zilla.sock" "$STATE/nbd.sock"
    start_daemon "${ARC[@]}"
    wait_rebuilt
    restored=$(stat_of l2_rebuild_bufs)
    read_pass "$uri" "$T/data" "after kill -9 round $round"
    [ "$(stat_of l2_cksum_bad)" = 0 ] || fail "kill -9 round $round: a restored copy did not match: $(arcstats)"
    log "kill -9 round $round: $restored copies restored, $(stat_of l2_hits) hits, no bad copy"
    no_panic "kill -9 round $round"
done

# --- cache devices added and removed under reads
truncate -s 96M "$T/disks/c1" "$T/disks/c2"
(for p in $(seq 8); do read_pass "$uri" "$T/data" "read $p under add/remove" || exit 1; done) &
reader=$!
z pool add tank cache "$T/disks/c1"
sleep 1
z pool remove tank "$T/disks/c0"
sum_c0=$(md5sum <"$T/disks/c0")
sleep 1
z pool add tank cache "$T/disks/c2"
sleep 1
z pool remove tank "$T/disks/c1"
wait "$reader" || fail "a read under add/remove failed or returned other bytes"
# the device added live carries the L2ARC alone now: it must fill
for i in $(seq 30); do
    [ "$(stat_of l2_size)" -ge $((16 * MIB)) ] && break
    read_pass "$uri" "$T/data" "filling c2"
    sleep 0.5
done
[ "$(stat_of l2_size)" -ge $((16 * MIB)) ] || fail "a cache device added live was never fed: $(arcstats)"
[ "$(md5sum <"$T/disks/c0")" = "$sum_c0" ] || fail "the L2ARC wrote to a cache device removed from the pool"
[ "$(cache_state tank "$T/disks/c2")" = ONLINE ] || fail "the added cache device is not ONLINE"
log "add/remove under reads: every read correct, the added device holds $(( $(stat_of l2_size) >> 20 )) MiB"
no_panic "add/remove"

# --- two cache devices of one pool exchanged between runs
z pool add tank cache "$T/disks/c1"
warm $((48 * MIB))
stop_daemon
mv "$T/disks/c1" "$T/disks/swap"; mv "$T/disks/c2" "$T/disks/c1"; mv "$T/disks/swap" "$T/disks/c2"
start_daemon "${ARC[@]}"
[ "$(pool_health tank)" = ONLINE ] || fail "the pool is $(pool_health tank) after its cache devices were exchanged: $(z pool status tank)"
wait_rebuilt
read_pass "$uri" "$T/data" "cache devices exchanged"
read_pass "$uri" "$T/data" "cache devices exchanged, again"
[ "$(stat_of l2_cksum_bad)" = 0 ] || fail "exchanged cache devices: a restored copy did not match: $(arcstats)"
log "one pool's cache devices exchanged: $(stat_of l2_rebuild_bufs) copies restored, reads correct"

# --- two pools' cache files exchanged between runs (same layout, different bytes)
make_pool other 256M
truncate -s 96M "$T/disks/d0"
z pool add other cache "$T/disks/d0"
make_volume other/v 96M
uri2=$(nbd_unix_uri other/v)
head -c $VOL /dev/urandom >"$T/data2"
nbdcopy --flush "$T/data2" "$uri2"
for i in 1 2 3 4; do read_pass "$uri" "$T/data" "two pools $i"; read_pass "$uri2" "$T/data2" "two pools $i"; sleep 0.5; done
stop_daemon
mv "$T/disks/c1" "$T/disks/swap"; mv "$T/disks/d0" "$T/disks/c1"; mv "$T/disks/swap" "$T/disks/d0"
start_daemon "${ARC[@]}"
# another pool's cache device is not used; the pool itself comes back from the cache file
for p in tank other; do
    h=$(pool_health $p)
    case "$h" in ONLINE|DEGRADED) ;; *) fail "pool $p is '$h' after its cache device was exchanged with another pool's" ;; esac
done
wait_rebuilt
for i in 1 2; do
    read_pass "$uri" "$T/data" "pools' cache files exchanged, tank $i"
    read_pass "$uri2" "$T/data2" "pools' cache files exchanged, other $i"
done
[ "$(stat_of l2_cksum_bad)" = 0 ] || fail "pools' cache files exchanged: a restored copy did not match: $(arcstats)"
log "two pools' cache files exchanged: reads correct in both"
no_panic "exchanged"
z pool destroy other
z pool destroy tank
stop_daemon
log "kill -9, add/remove under reads and exchanged cache devices never returned other bytes"
