#!/bin/bash
# Probe (not a benchmark): the throttle bench's pool and tunables, one load in one
# throttle mode, then what explains it: daemon CPU, `top`, `zilla txgs`, a `pool
# iostat -q` series, the sync's phase timings in the daemon log (zilla::txg debug),
# the daemon's CPU per acknowledged write, optionally a perf profile (PERF=1;
# PERF_T=THREADNAME for one thread; PERF_EV="-e EVENT"; PERF_ARGS replaces the
# sampling options, e.g. PERF_ARGS="-F 499 --call-graph dwarf,16384" for DWARF stacks)
# and fio's per-write latency log (LATLOG=1; bench/probes/latency_phase.py
# folds it by completion time mod 100 ms). EXTRA="name=value ..." adds tunables;
# PLAIN=1 uses a plain file instead of the 100 MB/s sim-ssd.
#
#   bench/probes/throttle.sh openzfs 10 10 30        # 100 writers, 30 s
#   LATLOG=1 bench/probes/throttle.sh legacy 10 1 20 # 10 writers, latency log
#   bench/probes/throttle.sh openzfs 10 1 20          # CPU us per write at 10 writers
#
# The CPU per write is the daemon's user+system time from just before fio starts until
# the pool has no dirty data left after it (the sync of every write counted), over
# fio's write count; run it without PERF for that figure.
#
# Output and files stay in $PROBE_DIR (default /tmp/zilla-probe-throttle).
set -e
MODE=$1; JOBS=$2; DEPTH=$3; SECS=$4
[ -n "$SECS" ] || { echo "usage: $0 openzfs|legacy JOBS DEPTH SECONDS" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${ZILLA_BIN:-$ROOT/target/release/zilla}
W=${PROBE_DIR:-/tmp/zilla-probe-throttle}; rm -rf "$W"; mkdir -p "$W"
S=$W/state
NBD_PORT=${NBD_PORT:-10909}; HTTP_PORT=${HTTP_PORT:-18909}
pkill -f "state-dir $S" || true
RUST_LOG=info,zilla::txg=debug "$BIN" --state-dir "$S" serve --nbd 127.0.0.1:$NBD_PORT --http 127.0.0.1:$HTTP_PORT > "$W/daemon.log" 2>&1 &
trap 'pkill -f "state-dir $S" || true' EXIT
sleep 1
Z="$BIN --state-dir $S"
truncate -s 16G "$W/ssd.img"
for kv in sim_flush_backing=0 sim_ssd_cache_write_mb_s=100 sim_ssd_cache_write_latency_us=0 sim_ssd_cache_channels=1 \
          zfs_dirty_data_max=1073741824 zfs_txg_timeout=5 zfs_txg_synctime_ms=5000 zfs_write_throttle_mode=$MODE $EXTRA; do
    $Z tunable set "$kv" > /dev/null
done
DEV="sim-ssd:$W/ssd.img"; [ -n "$PLAIN" ] && DEV="$W/ssd.img"
$Z pool create -f bench "$DEV" > /dev/null
$Z volume create -s -V 2147483648 -o volblocksize=8K bench/vol > /dev/null 2>&1
DPID=$(pgrep -f "state-dir $S serve" | head -1)
c0=$(awk '{print $14+$15}' /proc/$DPID/stat)
( sleep 5; top -b -d 10 -n 2 > "$W/top.txt" ) &
BG=($!)
if [ -n "$PERF" ]; then
    ( sleep 8
      if [ -n "$PERF_T" ]; then
          TID=$(for t in $(ls /proc/$DPID/task); do [ "$(cat /proc/$DPID/task/$t/comm)" = "$PERF_T" ] && echo $t; done | head -1)
          TGT="-t $TID"
      else TGT="-p $DPID"; fi
      perf record ${PERF_ARGS:-${PERF_EV:--F 999} -g} $TGT -o "$W/perf.data" -- sleep 10 > "$W/perf.log" 2>&1 ) &
    BG+=($!)
fi
( sleep 6; $Z pool iostat -q bench 1 20 > "$W/iostat.txt" 2>&1 ) &
BG+=($!)
fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:$NBD_PORT/bench/vol --rw=randwrite --bs=8k --numjobs=$JOBS \
    --iodepth=$DEPTH --size=2G --time_based --runtime=$SECS --group_reporting --randrepeat=0 \
    ${LATLOG:+--write_lat_log=$W/lat --log_offset=0 --log_avg_msec=0} \
    --output-format=normal,json --output="$W/fio.out" > "$W/fio.err" 2>&1 || true
# the writes' sync is part of their cost: wait (up to 30 s) until no dirty data is left
for _ in $(seq 300); do
    d=$(curl -s http://127.0.0.1:$HTTP_PORT/metrics | awk '/^zilla_dmu_tx_dirty_bytes\{/{print $2}')
    [ "${d:-1}" = 0 ] && break; sleep 0.1
done
c1=$(awk '{print $14+$15}' /proc/$DPID/stat)
# the helpers only: a bare `wait` would also wait for the daemon
wait "${BG[@]}"
python3 - "$W/fio.out" "$W/fio.txt" <<'PY'
import json, sys
t = open(sys.argv[1]).read()       # fio's header, its JSON, then its normal report
i = t.index("{\n")
j, end = json.JSONDecoder().raw_decode(t, i)
open(sys.argv[2], "w").write(t[:i] + t[end:])
w = j["jobs"][0]["write"]
open(sys.argv[2] + ".ios", "w").write(f"{w['total_ios']}\n")
PY
IOS=$(cat "$W/fio.txt.ios")
echo "daemon CPU: $(( (c1-c0)/100 )) s over $SECS s; $IOS writes; $(( (c1-c0)*10000/(IOS>0?IOS:1) )) us per write"
grep -A12 '^top' "$W/top.txt" | tail -14
grep -E "WRITE:|lat \(usec\)|clat percentiles" -A0 "$W/fio.txt" | head -4
$Z txgs bench | tail -12
grep "txg synced" "$W/daemon.log" | sed 's/.*txg synced//' | tail -8
echo "files: $W"
