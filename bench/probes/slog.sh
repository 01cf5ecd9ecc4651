#!/bin/bash
# Probe (not a benchmark): the slog bench's `slog` pool (two sim-hdd mirrors and a
# sim-ssd log mirror whose backing files are in /dev/shm) and one sync-write load: fio
# nbd 4K random writes with a flush after each, JOBS writers. Prints fio's write and
# flush latency, the daemon's CPU per sync write and `zilla zilstat`; optionally a
# scheduler trace of the daemon (SCHED=1: `perf sched timehist` in $W/sched.txt, to
# follow one commit's hand-offs thread by thread) or a perf profile (PERF=1).
# EXTRA="name=value ..." adds tunables; NOLOG=1 leaves the log mirror out; PLAIN=1 makes
# the pool the bench's plain one (two mirrors of plain files on the lab disk, no log).
# STRACE=1 traces the daemon's write/fsync syscalls for 2 s ($W/strace.txt).
#
#   bench/probes/slog.sh 1 10          # QD1, 10 s
#   SCHED=1 bench/probes/slog.sh 1 6
set -e
JOBS=$1; SECS=$2
[ -n "$SECS" ] || { echo "usage: $0 JOBS SECONDS" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${ZILLA_BIN:-$ROOT/target/release/zilla}
W=${PROBE_DIR:-/tmp/zilla-probe-slog}; rm -rf "$W"; mkdir -p "$W"
M=/dev/shm/zilla-probe-slog; rm -rf "$M"; mkdir -p "$M"
S=$W/state
NBD_PORT=${NBD_PORT:-10919}; HTTP_PORT=${HTTP_PORT:-18919}
pkill -f "state-dir $S" || true
RUST_LOG=${RUST_LOG:-info} "$BIN" --state-dir "$S" serve --nbd 127.0.0.1:$NBD_PORT --http 127.0.0.1:$HTTP_PORT > "$W/daemon.log" 2>&1 &
trap 'pkill -f "state-dir $S" && while pgrep -f "state-dir $S" > /dev/null; do sleep 0.1; done; rm -rf "$M"' EXIT
Z="$BIN --state-dir $S"
for _ in $(seq 50); do $Z pool list > /dev/null 2>&1 && break; sleep 0.2; done
for kv in sim_flush_backing=0 $EXTRA; do $Z tunable set "$kv" > /dev/null; done
for i in 0 1 2 3; do if [ -n "$PREFILL" ]; then dd if=/dev/zero of="$W/d$i.img" bs=1M count=2048 status=none; else truncate -s 3G "$W/d$i.img"; fi; done
for i in 0 1; do truncate -s 512M "$M/log$i.img"; done
LOG="log mirror sim-ssd:$M/log0.img sim-ssd:$M/log1.img"; [ -n "$NOLOG" ] && LOG=""
HDD=sim-hdd:; [ -n "$PLAIN" ] && { HDD=""; LOG=""; }
$Z pool create -f p mirror $HDD$W/d0.img $HDD$W/d1.img mirror $HDD$W/d2.img $HDD$W/d3.img $LOG > /dev/null
$Z volume create -s -V 1073741824 p/vol > /dev/null
DPID=$(pgrep -f "state-dir $S serve" | head -1)
c0=$(awk '{print $14+$15}' /proc/$DPID/stat)
BG=()
if [ -n "$SCHED" ]; then
    ( sleep 2; perf sched record -o "$W/sched.data" -- sleep 2 > "$W/perf.log" 2>&1
      perf sched timehist -i "$W/sched.data" -w > "$W/sched.txt" 2>/dev/null ) &
    BG+=($!)
fi
if [ -n "$STRACE" ]; then
    ( sleep 2; timeout 2 strace -f -tt -T -e trace=pwrite64,pwritev,pwritev2,fdatasync,fsync,io_uring_enter -p $DPID -o "$W/strace.txt" > /dev/null 2>&1 ) &
    BG+=($!)
fi
if [ -n "$PERF" ]; then
    ( sleep 2; perf record ${PERF_ARGS:--F 2999 -g} -p $DPID -o "$W/perf.data" -- sleep 4 > "$W/perf.log" 2>&1 ) &
    BG+=($!)
fi
fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:$NBD_PORT/p/vol --rw=randwrite --bs=4k --numjobs=$JOBS \
    --iodepth=1 --fsync=1 --size=1G --time_based --runtime=$SECS --group_reporting --randrepeat=0 \
    --output-format=json --output="$W/fio.json" > "$W/fio.err" 2>&1 || true
[ ${#BG[@]} -eq 0 ] || wait "${BG[@]}"
c1=$(awk '{print $14+$15}' /proc/$DPID/stat)
python3 - "$W/fio.json" $(( c1-c0 )) <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]; w = j["write"]; s = j["sync"]
n = w["total_ios"]
print(f"IOPS {w['iops']:.0f}  write mean {w['lat_ns']['mean']/1e3:.1f} us  flush mean {s['lat_ns']['mean']/1e3:.1f} us  "
      f"sum {(w['lat_ns']['mean']+s['lat_ns']['mean'])/1e3:.1f} us  daemon CPU {int(sys.argv[2])*1e4/max(n,1):.1f} us/write")
PY
$Z zilstat 2>/dev/null | head -3 || true
echo "files: $W"
