#!/usr/bin/env bash
# Flame graphs of the two data paths pool-vs-direct measures (docs/BENCHMARKS.md):
# 1 MiB sequential writes at QD8 and cold 16K random reads at QD32, through NBD, on a
# pool of two 2-way mirrors of 512 MiB files with pool-vs-direct's quick settings
# (dirty max 128 MiB, ARC max 64 MiB).
#
#   bench/flamegraph.sh [ZILLA_BIN [TAG]]   -> docs/flamegraphs/{seqwrite,randread-cold}-TAG.svg
#
# The release binary has symbols but no debug info, so inlined functions fold into
# their callers; for inlined frames use the profiling build (line tables):
#   cargo build --profile profiling -p zilla && bench/flamegraph.sh target/profiling/zilla
#
# Needs perf (linux-perf), fio and inferno (`cargo install inferno`, installed here if
# missing). Work files go to $BENCH_TMPDIR or /tmp (a real file system, for O_DIRECT).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/zilla}
TAG=${2:-$(git rev-parse --short HEAD)}
OUT=docs/flamegraphs
command -v perf >/dev/null || { echo "perf is missing (apt-get install linux-perf)"; exit 1; }
command -v fio >/dev/null || { echo "fio is missing (apt-get install fio)"; exit 1; }
command -v inferno-flamegraph >/dev/null || cargo install inferno --locked
mkdir -p "$OUT"
WD=$(mktemp -d "${BENCH_TMPDIR:-/tmp}/zilla-flame.XXXXXX")
trap 'kill $(cat "$WD/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$WD"' EXIT
for i in 0 1 2 3; do fallocate -l 512M "$WD/f$i.img"; done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NBD=$(port); HTTP=$(port)
Z="$BIN --state-dir $WD/state"
RUST_LOG=warn $Z serve --nbd 127.0.0.1:$NBD --http 127.0.0.1:$HTTP >"$WD/daemon.log" 2>&1 &
echo $! >"$WD/pid"
for _ in $(seq 100); do [ -S "$WD/state/zilla.sock" ] && break; sleep 0.1; done
$Z tunable set zfs_dirty_data_max=$((128 << 20)) >/dev/null
$Z tunable set zfs_arc_max=$((64 << 20)) >/dev/null
$Z pool create -f flame mirror "$WD/f0.img" "$WD/f1.img" mirror "$WD/f2.img" "$WD/f3.img" >/dev/null
$Z volume create -s -V $((768 << 20)) flame/vol >/dev/null 2>&1
URI=nbd://127.0.0.1:$NBD/flame/vol
PID=$(cat "$WD/pid")
profile() { # NAME SECONDS FIO-ARGS...
  local name=$1 secs=$2; shift 2
  perf record -F 1999 --call-graph dwarf,16384 -p "$PID" -o "$WD/$name.data" -- sleep "$secs" >/dev/null 2>&1 &
  local rec=$!
  sleep 0.2
  fio --name="$name" --ioengine=nbd --uri="$URI" "$@" | grep -E "WRITE:| read: IOPS"
  wait $rec
  perf script -i "$WD/$name.data" 2>/dev/null | inferno-collapse-perf --all >"$WD/$name.folded"
}
profile seqwrite 2.2 --rw=write --bs=1M --iodepth=8 --size=640M --end_fsync=1
sleep 1
profile randread-cold 3 --rw=randread --bs=16k --iodepth=32 --size=640M --runtime=3 --time_based
inferno-flamegraph --title "1 MiB sequential write, QD8 ($TAG)" --minwidth 0.2 --width 1400 <"$WD/seqwrite.folded" >"$OUT/seqwrite-$TAG.svg"
inferno-flamegraph --title "16K random read, ARC cold, QD32 ($TAG)" --minwidth 0.2 --width 1400 <"$WD/randread-cold.folded" >"$OUT/randread-cold-$TAG.svg"
$Z pool export flame >/dev/null 2>&1 || true
ls -l "$OUT"/*-"$TAG".svg
