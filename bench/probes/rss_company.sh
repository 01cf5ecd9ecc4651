#!/bin/bash
# Probe (not a benchmark): the daemon's memory through pool-vs-direct's "another pool
# holding cached data" sequence, outside the bench. Pool c (a mirror of two files) gets
# 1 GiB written and read back (ARC max 1096 MiB, dirty max 256 MiB); then pool b (two
# mirrors) gets 2 GiB of 1 MiB writes while /metrics is sampled every 0.5 s: RSS, the
# overhead beyond ARC and dirty data, and the block-buffer slab's free slots. Prints the
# last samples and the daemon's VmHWM. BIN= another build to compare.
#
#   bench/probes/rss_company.sh
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release/zilla}
W=${PROBE_DIR:-/tmp/zilla-probe-rss}; rm -rf $W; mkdir -p $W; S=$W/state
P=10951; H=18951
$BIN --state-dir $S serve --nbd 127.0.0.1:$P --http 127.0.0.1:$H > $W/d.log 2>&1 &
D=$!; trap "kill $D; wait $D" EXIT
for _ in $(seq 50); do $BIN --state-dir $S pool list >/dev/null 2>&1 && break; sleep 0.2; done
Z="$BIN --state-dir $S"
$Z tunable set zfs_dirty_data_max=$((256<<20)) >/dev/null; $Z tunable set zfs_arc_max=$((1096<<20)) >/dev/null
for i in 0 1 2 3 4 5; do truncate -s 3G $W/f$i.img; done
sample() { curl -s http://127.0.0.1:$H/metrics | awk -v t="$1" '/^zilla_memory_(rss|overhead|overhead_block_buffers)_bytes /{printf "%s %s=%.1fMiB ", t, $1, $2/1048576} END{print ""}'; }
$Z pool create -f c mirror $W/f4.img $W/f5.img >/dev/null; $Z volume create -s -V $((1<<30)) c/v >/dev/null
fio --name=cw --ioengine=nbd --uri=nbd://127.0.0.1:$P/c/v --rw=write --bs=1M --iodepth=8 --size=1G --end_fsync=1 >/dev/null 2>&1
fio --name=cr --ioengine=nbd --uri=nbd://127.0.0.1:$P/c/v --rw=read --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
sample after-company
$Z pool create -f b mirror $W/f0.img $W/f1.img mirror $W/f2.img $W/f3.img >/dev/null; $Z volume create -s -V $((2<<30)) b/v >/dev/null
( for k in $(seq 40); do sample w$k; sleep 0.5; done ) > $W/samples.txt &
fio --name=bw --ioengine=nbd --uri=nbd://127.0.0.1:$P/b/v --rw=write --bs=1M --iodepth=8 --size=2G --end_fsync=1 >/dev/null 2>&1
wait %2 2>/dev/null
tail -3 $W/samples.txt
grep VmHWM /proc/$D/status
