#!/bin/bash
# Probe (not a benchmark): pool-vs-direct's cold sequential read alone. Four plain files
# in two mirrors (on the lab disk, as the bench has them), a 640 MiB volume written once,
# ARC max 64 MiB, the pool exported and imported (nothing of it cached), then fio nbd
# 128K sequential reads at QD4 over the written span. Prints MB/s, the daemon's CPU per
# MiB and its sleeps per MiB, and the read-ahead counters; PERF=1 records a profile of
# the daemon ($W/perf.data). EXTRA="name=value ..." adds tunables (e.g.
# zfs_prefetch_disable=1). BIN= another build to compare.
#
#   bench/probes/coldseq.sh
#   PERF=1 bench/probes/coldseq.sh
set -e
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release/zilla}
W=${PROBE_DIR:-/tmp/zilla-probe-coldseq}; rm -rf "$W"; mkdir -p "$W"
S=$W/state
NBD_PORT=${NBD_PORT:-10933}; HTTP_PORT=${HTTP_PORT:-18933}
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
$Z pool export p > /dev/null
$Z pool import -d "$W" p > /dev/null
sleep 2
DPID=$(pgrep -f "state-dir $S serve" | head -1)
stats() { curl -s --unix-socket "$S/zilla.sock" http://zilla/v1/arcstats; }
stats > "$W/arc0.json"
c0=$(awk '{print $14+$15}' /proc/$DPID/stat)
sleeps() { cat /proc/$DPID/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/{n+=$2} END{print n+0}'; }
v0=$(sleeps)
( sleep 0.5; $Z pool iostat -v p 1 2 > "$W/iostat.txt" 2>&1 ) &
IO=$!
PP=
if [ -n "$PERF" ]; then ( sleep 0.3; perf record ${PERF_ARGS:--F 2999 -g} -p $DPID -o "$W/perf.data" -- sleep 2 > "$W/perf.log" 2>&1 ) & PP=$!; fi
fio --name=r --ioengine=nbd --uri=$URI --rw=read --bs=128k --iodepth=${QD:-4} --size=671088640 --loops=${LOOPS:-4} \
    --output-format=json --output="$W/fio.json" > "$W/fio.err" 2>&1 || true
[ -z "$PP" ] || wait $PP
wait $IO || true
c1=$(awk '{print $14+$15}' /proc/$DPID/stat)
v1=$(sleeps)
stats > "$W/arc1.json"
python3 - "$W" $(( c1-c0 )) $(( v1-v0 )) <<'PY'
import json, os, sys
w = sys.argv[1]
r = json.load(open(f"{w}/fio.json"))["jobs"][0]["read"]
mib = r["io_bytes"] / (1 << 20)
cpu_s = int(sys.argv[2]) / os.sysconf("SC_CLK_TCK")
a0, a1 = json.load(open(f"{w}/arc0.json")), json.load(open(f"{w}/arc1.json"))
keys = ("demand_data_hits", "demand_data_misses", "prefetch_data_misses", "arc_prefetch_used", "zfetch_io_issued")
print(f"{r['bw_bytes'] / 1e6:.0f} MB/s  daemon CPU {cpu_s * 1e6 / max(mib, 1):.0f} us/MiB  "
      f"sleeps {int(sys.argv[3]) / max(mib, 1):.1f}/MiB  "
      + " ".join(f"{k}={a1.get(k, 0) - a0.get(k, 0)}" for k in keys if k in a1))
PY
awk '/^-/{n++} n>=3' "$W/iostat.txt" | head -20
echo "files: $W"
