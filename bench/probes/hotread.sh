#!/bin/bash
# Probe (not a benchmark): cached sequential reads alone. A 256 MiB volume on a mirror of
# two files, written and read once (ARC max 1 GiB: it all stays cached), then fio nbd
# sequential reads of BS (128k) at QD8 for SECS seconds. Prints IOPS and the daemon's
# CPU per read; PERF=1 records a profile ($W/perf.data). BIN= another build to compare;
# EXTRA="name=value ..." adds tunables (e.g. zfs_prefetch_disable=1).
#
#   bench/probes/hotread.sh 8
#   BIN=/tmp/old/zilla BS=4k RW=randread bench/probes/hotread.sh 8
set -e
SECS=${1:-8}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release/zilla}
W=${PROBE_DIR:-/tmp/zilla-probe-hotread}; rm -rf "$W"; mkdir -p "$W"
S=$W/state; P=${NBD_PORT:-10931}
"$BIN" --state-dir "$S" serve --nbd 127.0.0.1:$P > "$W/daemon.log" 2>&1 &
trap 'pkill -f "state-dir $S" && while pgrep -f "state-dir $S" > /dev/null; do sleep 0.1; done' EXIT
Z="$BIN --state-dir $S"
for _ in $(seq 50); do $Z pool list > /dev/null 2>&1 && break; sleep 0.2; done
for kv in zfs_arc_max=$((1 << 30)) $EXTRA; do $Z tunable set "$kv" > /dev/null; done
for i in 0 1; do truncate -s 1G "$W/f$i.img"; done
$Z pool create -f p mirror $W/f0.img $W/f1.img > /dev/null
$Z volume create -s -V $((256 << 20)) p/vol > /dev/null
URI=nbd://127.0.0.1:$P/p/vol
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=256M --end_fsync=1 > /dev/null 2>&1
fio --name=warm --ioengine=nbd --uri=$URI --rw=read --bs=1M --iodepth=8 --size=256M > /dev/null 2>&1
DPID=$(pgrep -f "state-dir $S serve" | head -1)
PP=
if [ -n "$PERF" ]; then ( sleep 2; perf record -F 2999 -g -p $DPID -o "$W/perf.data" -- sleep 4 > "$W/perf.log" 2>&1 ) & PP=$!; fi
c0=$(awk '{print $14+$15}' /proc/$DPID/stat)
fio --name=r --ioengine=nbd --uri=$URI --rw=${RW:-read} --bs=${BS:-128k} --iodepth=8 --size=256M --time_based --runtime=$SECS \
    --output-format=json --output="$W/fio.json" > /dev/null 2>&1
c1=$(awk '{print $14+$15}' /proc/$DPID/stat)
[ -z "$PP" ] || wait $PP
python3 - "$W/fio.json" $((c1 - c0)) <<'PY'
import json, os, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
ios = j["total_ios"]; cpu_s = int(sys.argv[2]) / os.sysconf("SC_CLK_TCK")
print(f"IOPS {j['iops']:.0f}  daemon CPU {cpu_s * 1e6 / max(ios, 1):.1f} us/read")
PY
