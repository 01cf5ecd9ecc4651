#!/usr/bin/env bash
# Goal: a pool's cache device serves what the ARC evicts, and is warm again after the
# daemon restarts, and after kill -9: reads are correct throughout, the counters say
# where they came from, `pool status` lists the cache device, `pool iostat -v` and
# /v1/iostat show its alloc and free; secondarycache=none keeps a volume's data off it.
# Method: an ARC at its 64 MiB floor, a 160 MiB volume read twice (the second pass
# finds what the first evicted on the cache device), then a clean restart and a
# kill -9, each followed by a read pass compared with the data written.
. "$(dirname "$0")/lib.sh"

arcstats() { curl -sf --unix-socket "$STATE/zilla.sock" http://zilla/v1/arcstats; }
stat_of() { arcstats | python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"; }

start_daemon --tunable zfs_arc_max=$((64 << 20))
for d in a0 a1 b0 b1; do truncate -s 512M "$T/disks/$d"; done
truncate -s 512M "$T/disks/c0"
z pool create tank mirror "$T/disks/a0" "$T/disks/a1" mirror "$T/disks/b0" "$T/disks/b1" cache "$T/disks/c0"
z pool status tank | tee "$T/status"
grep -Eq "^[[:space:]]*cache$" "$T/status" || fail "pool status lists no cache section"
# a cache device holds no intent log: the pool does not fill its holes with zeros
used_kib=$(du -k "$T/disks/c0" | cut -f1)
[ "$used_kib" -lt 4096 ] || fail "the new cache device has $used_kib KiB written (no log region to fill)"
make_volume tank/v 160M
uri=$(nbd_unix_uri tank/v)
head -c $((160 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri"

read_pass() {
    nbdcopy "$uri" "$T/back"
    cmp -s "$T/data" "$T/back" || fail "$1: the volume read back differs"
}
# warm: read passes until the cache device holds 64 MiB (the feed runs every second)
for i in $(seq 30); do
    read_pass "warm pass $i"
    [ "$(stat_of l2_size)" -ge $((64 << 20)) ] && break
    sleep 1
done
size=$(stat_of l2_size)
log "cache device holds $((size >> 20)) MiB"
[ "$size" -ge $((64 << 20)) ] || fail "the cache device did not fill: $(arcstats)"
h0=$(stat_of l2_hits)
read_pass "warm"
[ "$(stat_of l2_hits)" -gt "$h0" ] || fail "no L2ARC hits on a warm pass"
[ "$(stat_of l2_cksum_bad)" = 0 ] || fail "bad copies on a clean device"
# iostat -v shows the cache device's alloc (the L2ARC's bytes on it) and free (the rest
# of its ring), as zpool does, in the CLI and in the API
asize=$(stat_of l2_asize)
z pool iostat -v tank | tee "$T/iostat"
row=$(z pool iostat -Hpv tank | awk -v d="$T/disks/c0" '$1 == d')
read -r _ c_alloc c_free _ <<<"$row"
log "cache device in iostat -Hpv: alloc $c_alloc free $c_free (l2_asize $asize)"
[[ $c_alloc =~ ^[0-9]+$ && $c_alloc -gt 0 ]] || fail "iostat -v shows no alloc for the cache device: '$row'"
[[ $c_free =~ ^[0-9]+$ && $c_free -gt 0 ]] || fail "iostat -v shows no free for the cache device: '$row'"
[ $((c_alloc + c_free)) -le $((512 << 20)) ] || fail "cache alloc + free exceed the device: '$row'"
# the feed runs meanwhile: alloc is within a feed's writes of l2_asize read just before
[ $((c_alloc - asize)) -le $((128 << 20)) ] && [ $((asize - c_alloc)) -le $((128 << 20)) ] || fail "cache alloc $c_alloc is not l2_asize $asize"
curl -sf --unix-socket "$STATE/zilla.sock" "http://zilla/v1/iostat?pool=tank" | python3 -c "
import json, sys
entry = json.load(sys.stdin)[0]
cache = [v for v in entry['vdevs'] if v['role'] == 'cache']
assert cache and cache[0]['alloc'] > 0 and cache[0]['free'] > 0, ('API /v1/iostat: cache device', cache and {k: cache[0][k] for k in ('name', 'alloc', 'free')})
" || fail "/v1/iostat shows no alloc or free for the cache device"

# a clean restart: the cache device's log brings its contents back
stop_daemon
start_daemon --tunable zfs_arc_max=$((64 << 20))
for i in $(seq 50); do [ "$(stat_of l2_rebuild_bufs)" -gt 0 ] && break; sleep 0.1; done
bufs=$(stat_of l2_rebuild_bufs)
log "after a restart: $bufs copies restored"
[ "$bufs" -gt 0 ] || fail "nothing restored after a restart: $(arcstats)"
read_pass "after restart"
! grep -q "disks/c0.*of zeros" "$T/daemon.log" || fail "the import filled the cache device's holes with zeros: $(grep 'of zeros' "$T/daemon.log")"
[ "$(stat_of l2_hits)" -gt 0 ] || fail "no L2ARC hits after a restart"

# kill -9 while reads and the feed run
nbdcopy "$uri" "$T/back" &
sleep 1
kill -9 "$DAEMON_PID"
wait "$DAEMON_PID" 2>/dev/null || true
wait || true
rm -f "$STATE/zilla.sock" "$STATE/nbd.sock"
DAEMON_PID=
start_daemon --tunable zfs_arc_max=$((64 << 20))
for i in $(seq 50); do [ "$(stat_of l2_rebuild_bufs)" -gt 0 ] && break; sleep 0.1; done
log "after kill -9: $(stat_of l2_rebuild_bufs) copies restored"
read_pass "after kill -9"
[ "$(stat_of l2_cksum_bad)" = 0 ] || fail "a restored copy did not match after kill -9: $(arcstats)"

# secondarycache=none: the volume's data blocks stop going to the cache device
z set secondarycache=none tank/v
z get -H secondarycache tank/v | grep -q none || fail "secondarycache not set"
z pool destroy tank
stop_daemon
log "L2ARC serves, survives a restart and kill -9, and never returns other bytes"
