#!/bin/bash
# Probe (not a benchmark): nbd-vs-nbdkit's 128K sequential write test alone (RW=, BS= for
# others, e.g. RW=randwrite BS=4k), against
# Zilla only. Four sparse files in two mirrors, a 512 MiB volume filled once, default
# tunables, then fio nbd 128K sequential writes at QD32 for SECS seconds. Prints IOPS,
# the daemon's CPU per write, the bytes that reached the devices and the txgs synced.
# PERF=1 records a profile of the daemon ($W/perf.data), PERF_SECS (4) long from PERF_DELAY (2) s in. EXTRA="name=value ..." adds
# tunables.
#
#   bench/probes/seqwrite.sh 8
set -e
SECS=${1:-8}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${ZILLA_BIN:-$ROOT/target/release/zilla}
W=${PROBE_DIR:-/tmp/zilla-probe-seqwrite}; rm -rf "$W"; mkdir -p "$W"
S=$W/state
NBD_PORT=${NBD_PORT:-10939}; HTTP_PORT=${HTTP_PORT:-18939}
pkill -f "state-dir $S" || true
RUST_LOG=${RUST_LOG:-info} "$BIN" --state-dir "$S" serve --nbd 127.0.0.1:$NBD_PORT --http 127.0.0.1:$HTTP_PORT > "$W/daemon.log" 2>&1 &
trap 'pkill -f "state-dir $S" && while pgrep -f "state-dir $S" > /dev/null; do sleep 0.1; done' EXIT
Z="$BIN --state-dir $S"
for _ in $(seq 50); do $Z pool list > /dev/null 2>&1 && break; sleep 0.2; done
for kv in $EXTRA; do $Z tunable set "$kv" > /dev/null; done
for i in 0 1 2 3; do truncate -s 5632M "$W/f$i.img"; done
$Z pool create -f p mirror $W/f0.img $W/f1.img mirror $W/f2.img $W/f3.img > /dev/null
$Z volume create -s -V 536870912 p/vol > /dev/null
URI=nbd://127.0.0.1:$NBD_PORT/p/vol
head -c 536870912 /dev/urandom > "$W/rand.img"
nbdcopy --flush "$W/rand.img" "$URI"
rm -f "$W/rand.img"
sleep 6
DPID=$(pgrep -f "state-dir $S serve" | head -1)
dev() { $Z pool iostat -p p 2>/dev/null | awk 'NR>1 && $1=="p" {print $0}' ; }
$Z pool iostat -H -p p > "$W/iostat0.txt" 2>&1 || true
curl -s http://127.0.0.1:$HTTP_PORT/metrics > "$W/metrics0.txt"
c0=$(awk '{print $14+$15}' /proc/$DPID/stat)
BG=()
vmstat 1 $((SECS + 1)) > "$W/vmstat.txt" &
BG+=($!)
( sleep 1; top -H -b -n 2 -d 3 -p $DPID > "$W/top.txt" 2>&1 ) &
BG+=($!)
if [ -n "$PERF" ]; then
    ( sleep ${PERF_DELAY:-2}; perf record ${PERF_ARGS:--F 2999 -g} -p $DPID -o "$W/perf.data" -- sleep ${PERF_SECS:-4} > "$W/perf.log" 2>&1 ) &
    BG+=($!)
fi
fio --name=w --ioengine=nbd --uri=$URI --rw=${RW:-write} --bs=${BS:-128k} --iodepth=32 --numjobs=1 --size=536870912 \
    --time_based --runtime=$SECS --write_bw_log="$W/bw" --log_avg_msec=200 --output-format=json --output="$W/fio.json" > "$W/fio.err" 2>&1 || true
c1=$(awk '{print $14+$15}' /proc/$DPID/stat)
grep VmHWM /proc/$DPID/status
curl -s http://127.0.0.1:$HTTP_PORT/metrics > "$W/metrics1.txt"
[ ${#BG[@]} -eq 0 ] || wait "${BG[@]}"
$Z pool iostat -H -p p > "$W/iostat1.txt" 2>&1 || true
$Z txgs p > "$W/txgs.txt" 2>&1 || true
python3 - "$W/fio.json" $(( c1-c0 )) <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]; r = j["write"]
n = r["total_ios"]
print(f"IOPS {r['iops']:.0f}  {r['bw_bytes']/1e6:.0f} MB/s  mean {r['lat_ns']['mean']/1e3:.1f} us  p99 {r['clat_ns']['percentile']['99.000000']/1e3:.0f} us  "
      f"daemon CPU {int(sys.argv[2])*1e4/max(n,1):.1f} us/write  fio CPU usr {j['usr_cpu']:.0f}% sys {j['sys_cpu']:.0f}%")
PY
awk -v PIDX=$DPID '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $1 != PIDX && $9 > 0.5 {print "  thread", $12, $9 "% CPU"}' "$W/top.txt"
tail -8 "$W/txgs.txt"
python3 - "$W/metrics0.txt" "$W/metrics1.txt" <<'PY'
import sys
def load(f):
    d = {}
    for l in open(f):
        if l.startswith("zilla_dmu_tx") or l.startswith("zilla_txg"):
            k, _, v = l.rpartition(" ")
            try: d[k] = float(v)
            except ValueError: pass
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
for k in sorted(b):
    if b[k] != a.get(k, 0) or "dirty" in k:
        print(f"  {k} {b[k] - a.get(k, 0):.0f}  (now {b[k]:.0f})")
PY
echo "files: $W"
