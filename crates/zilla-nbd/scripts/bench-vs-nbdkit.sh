#!/bin/sh
# Compare zilla-nbd (nbd-memserve, MemVolume) with `nbdkit memory` on the same box:
# 4K random read and write at QD32 with fio's nbd engine, both exports filled with the
# same random data first so reads are not holes. Usage (from the workspace root):
#   cargo build --profile test -p zilla-nbd --example nbd-memserve
#   sh crates/zilla-nbd/scripts/bench-vs-nbdkit.sh [SIZE_MIB] [RUNTIME_S]
set -eu
size_mib=${1:-256}
runtime_s=${2:-8}
work=$(mktemp -d)
server=${NBD_MEMSERVE:-target/debug/examples/nbd-memserve}
dd if=/dev/urandom of="$work/rand.img" bs=1M count="$size_mib" status=none
"$server" --size $((size_mib * 1048576)) --tcp 127.0.0.1:10850 > "$work/zilla.log" 2>&1 &
zilla_pid=$!
nbdkit -f -i 127.0.0.1 -p 10851 memory "${size_mib}M" > "$work/nbdkit.log" 2>&1 &
nbdkit_pid=$!
trap 'kill $zilla_pid $nbdkit_pid 2>/dev/null; rm -rf "$work"' EXIT
sleep 1
nbdcopy "$work/rand.img" nbd://127.0.0.1:10850/pool/vol
nbdcopy "$work/rand.img" nbd://127.0.0.1:10851/
for round in 1 2; do
  for target in zilla:nbd://127.0.0.1:10850/pool/vol nbdkit:nbd://127.0.0.1:10851/; do
    name=${target%%:*}; uri=${target#*:}
    for rw in randread randwrite; do
      iops=$(fio --name=b --ioengine=nbd --uri="$uri" --rw=$rw --bs=4k --iodepth=32 \
        --numjobs=1 --runtime="$runtime_s" --time_based --size=${size_mib}m \
        --output-format=terse --terse-version=3 | awk -F';' -v rw=$rw \
        'NF > 40 { print (rw == "randread") ? $8 : $49 }' | tr -d '\n')
      echo "round=$round server=$name rw=$rw bs=4k qd=32 iops=$iops"
    done
  done
done
