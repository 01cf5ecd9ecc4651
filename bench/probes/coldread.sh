#!/bin/bash
# Probe (not a benchmark): pool-vs-direct's cold-read phase alone. Four plain files in
# two mirrors (on the lab disk, as the bench has them), a 640 MiB volume written once,
# ARC max 64 MiB, then fio nbd 16K random reads at QD32 over the written span. Prints
# IOPS, latency, the daemon's CPU per read and its threads' sleeps per read (voluntary
# context switches: each is a wake-up to continue, see docs/design.md); PERF=1 records a profile of the daemon
# ($W/perf.data), SCHED=1 a scheduler trace. EXTRA="name=value ..." adds tunables.
# SYNCW=1 runs, beside the reads, one writer doing 4K random writes each followed by a
# flush on a second volume of the same pool (no log device: the intent log writes to
# the same leaves the reads come from), and prints its latency too.
#
#   bench/probes/coldread.sh 8          # 8 s of reads
#   PERF=1 bench/probes/coldread.sh 8
set -e
SECS=${1:-8}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${ZILLA_BIN:-$ROOT/target/release/zilla}
W=${PROBE_DIR:-/tmp/zilla-probe-coldread}; rm -rf "$W"; mkdir -p "$W"
S=$W/state
NBD_PORT=${NBD_PORT:-10929}; HTTP_PORT=${HTTP_PORT:-18929}
pkill -f "state-dir $S" || true
RUST_LOG=${RUST_LOG:-info} "$BIN" --state-dir "$S" serve --nbd 127.0.0.1:$NBD_PORT --http 127.0.0.1:$HTTP_PORT > "$W/daemon.log" 2>&1 &
trap 'pkill -f "state-dir $S" && while pgrep -f "state-dir $S" > /dev/null; do sleep 0.1; done' EXIT
Z="$BIN --state-dir $S"
for _ in $(seq 50); do $Z pool list > /dev/null 2>&1 && break; sleep 0.2; done
for kv in zfs_dirty_data_max=134217728 zfs_arc_max=67108864 $EXTRA; do $Z tunable set "$kv" > /dev/null; done
for i in 0 1 2 3; do fallocate -l 512M "$W/f$i.img"; done
$Z pool create -f p mirror $W/f0.img $W/f1.img mirror $W/f2.img $W/f3.img > /dev/null
$Z volume create -s -V 805306368 p/vol > /dev/null
URI=nbd://127.0.0.1:$NBD_PORT/p/vol
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=671088640 --end_fsync=1 > "$W/fill.txt" 2>&1
sleep 3
DPID=$(pgrep -f "state-dir $S serve" | head -1)
stats() { curl -s --unix-socket "$S/zilla.sock" http://zilla/v1/arcstats; }
stats > "$W/arc0.json"
c0=$(awk '{print $14+$15}' /proc/$DPID/stat)
sleeps() { cat /proc/$DPID/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/{n+=$2} END{print n+0}'; }
v0=$(sleeps)
BG=()
if [ -n "$SCHED" ]; then
    ( sleep 2; perf sched record -o "$W/sched.data" -- sleep 2 > "$W/perf.log" 2>&1
      perf sched timehist -i "$W/sched.data" -w > "$W/sched.txt" 2>/dev/null ) &
    BG+=($!)
fi
( sleep 2; $Z pool iostat -q -l -v p 2 2 > "$W/iostat.txt" 2>&1 ) &
BG+=($!)
( sleep 2; top -H -b -n 2 -d 3 -p $DPID > "$W/top.txt" 2>&1 ) &
BG+=($!)
if [ -n "$PERF" ]; then
    ( sleep 2; perf record ${PERF_ARGS:--F 2999 -g} -p $DPID -o "$W/perf.data" -- sleep 4 > "$W/perf.log" 2>&1 ) &
    BG+=($!)
fi
if [ -n "$SYNCW" ]; then
    $Z volume create -s -V 268435456 p/sw > /dev/null
    fio --name=sw --ioengine=nbd --uri=nbd://127.0.0.1:$NBD_PORT/p/sw --rw=randwrite --bs=4k --iodepth=1 --fsync=1 \
        --time_based --runtime=$((SECS + 1)) --output-format=json --output="$W/syncw.json" > "$W/syncw.err" 2>&1 &
    BG+=($!)
fi
fio --name=r --ioengine=nbd --uri=$URI --rw=randread --bs=16k --iodepth=${QD:-32} --numjobs=${JOBS:-1} --group_reporting --size=671088640 \
    --time_based --runtime=$SECS --randrepeat=0 --output-format=json --output="$W/fio.json" > "$W/fio.err" 2>&1 || true
[ ${#BG[@]} -eq 0 ] || wait "${BG[@]}"
c1=$(awk '{print $14+$15}' /proc/$DPID/stat)
v1=$(sleeps)
stats > "$W/arc1.json"
python3 - "$W/fio.json" $(( c1-c0 )) $(( v1-v0 )) <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]; r = j["read"]
n = r["total_ios"]
print(f"IOPS {r['iops']:.0f}  mean {r['lat_ns']['mean']/1e3:.1f} us  p99 {r['clat_ns']['percentile']['99.000000']/1e3:.0f} us  "
      f"daemon CPU {int(sys.argv[2])*1e4/max(n,1):.1f} us/read  daemon sleeps {int(sys.argv[3])/max(n,1):.2f}/read  "
      f"fio CPU usr {j['usr_cpu']:.0f}% sys {j['sys_cpu']:.0f}%")
PY
python3 - "$W" <<'PY'
import json, sys
a0, a1 = (json.load(open(f"{sys.argv[1]}/arc{i}.json")) for i in (0, 1))
keys = ("demand_data_misses", "prefetch_data_misses", "arc_prefetch_used", "zfetch_hits", "zfetch_misses", "zfetch_io_issued")
print("  " + " ".join(f"{k}={a1.get(k, 0) - a0.get(k, 0)}" for k in keys if k in a1))
PY
if [ -n "$SYNCW" ]; then
    python3 - "$W/syncw.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
w, s = j["write"], j["sync"]
print(f"sync writer: IOPS {w['iops']:.0f}  write {w['lat_ns']['mean']/1e3:.1f} us  flush {s['lat_ns']['mean']/1e3:.1f} us")
PY
fi
awk -v PIDX=$DPID '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $1 != PIDX && $9 > 0.5 {print "  thread", $12, $9 "% CPU"}' "$W/top.txt"
echo "files: $W"
