#!/usr/bin/env bash
# Goal: Analytics counts what clients did, and its history outlives the daemon.
# 1. Accuracy of rates: fio at a fixed 400 reads/s on one volume for 12 s (a pool of
#    plain files, so the volume keeps up); the
#    per-second read counts of io.ops/op in the steady seconds are within 2% of 400, and
#    their total over the run within 2% of the reads fio completed.
# 2. Accuracy of latency: on a mirror of emulated 7200 rpm disks (sim-hdd: milliseconds
#    per read, so the protocol's own cost is small), uncached random reads at QD1; the
#    median bucket of the io.latency/op heat map is within one bucket of fio's median.
# 3. History: the per-minute history is there after a restart (SIGTERM) and after
#    kill -9 (it is saved every minute); a truncated or corrupted history file is
#    reported, moved aside and replaced, and the daemon starts.
. "$(dirname "$0")/lib.sh"
command -v fio >/dev/null || skip "fio is not installed"
start_daemon
BASE=http://127.0.0.1:$HTTP_PORT
get() { curl -sf "$BASE/api/v1/analytics/$1"; }
now() { date +%s; }

# rates on a pool of plain files (it serves 400 reads/s with room to spare); latency on
# a mirror of emulated disks, uncached (primarycache=metadata)
make_pool fast 256M
make_volume fast/vol 64M
truncate -s 1G "$T/disks/h0" "$T/disks/h1"
z pool create tank mirror "sim-hdd:$T/disks/h0" "sim-hdd:$T/disks/h1"
make_volume tank/vol 256M -o primarycache=metadata
# data to read (reads of never-written blocks would not reach the disks)
head -c $((32 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_tcp_uri fast/vol)" || fail "nbdcopy to fast/vol"
nbdcopy --flush "$T/data" "$(nbd_tcp_uri tank/vol)" || fail "nbdcopy to tank/vol"
sleep 6 # the txg sync (zfs_txg_timeout 5 s) moves the data from the intent log

# --- 1. rates ----------------------------------------------------------------------
start_s=$(now)
fio --name=rate --ioengine=nbd --uri="$(nbd_tcp_uri fast/vol)" --rw=randread --bs=4k --iodepth=8 \
    --size=32M --time_based --runtime=12 --rate_iops=400 --output-format=json >"$T/rate.json" 2>"$T/rate.err" ||
    fail "fio: $(cat "$T/rate.err")"
end_s=$(now)
sleep 2.5 # the collector's next samples
get "query?dataset=io.ops/op&from=$((start_s - 2))&to=$((end_s + 2))&filter=read" >"$T/rate.q" || fail "query io.ops/op"
python3 - "$T/rate.json" "$T/rate.q" <<'EOF' || fail "per-second read rates do not match fio's"
import json, sys
text = open(sys.argv[1]).read()  # fio's nbd engine prints a line before the JSON
fio = json.loads(text[text.index("{"):])["jobs"][0]["read"]["total_ios"]
q = json.load(open(sys.argv[2]))
reads = [s for s in q["series"] if s["key"] == "read"]
assert reads, f"no read series: {q}"
values = [v for v in reads[0]["values"] if v is not None]
total = sum(values)
busy = [v for v in values if v > 0]
steady = busy[2:-2]  # fio ramps up in the first second and stops within the last
print(f"fio completed {fio} reads; analytics counted {total:.0f}; steady seconds {steady}")
assert abs(total - fio) <= 0.02 * fio, f"total {total} vs fio's {fio}"
assert len(steady) >= 6, f"too few steady seconds: {values}"
off = [v for v in steady if abs(v - 400) > 0.02 * 400]
assert not off, f"seconds off 400/s by more than 2%: {off}"
EOF

# --- 2. latency: the heat map's median against fio's ---------------------------------
start_s=$(now)
fio --name=lat --ioengine=nbd --uri="$(nbd_tcp_uri tank/vol)" --rw=randread --bs=4k --iodepth=1 \
    --size=32M --time_based --runtime=8 --output-format=json >"$T/lat.json" 2>"$T/lat.err" || fail "fio: $(cat "$T/lat.err")"
end_s=$(now)
sleep 2.5
get "query?dataset=io.latency/op&from=$((start_s - 2))&to=$((end_s + 2))&filter=read" >"$T/lat.q" || fail "query io.latency/op"
get datasets >"$T/ds.json"
python3 - "$T/lat.json" "$T/lat.q" "$T/ds.json" <<'EOF' || fail "the heat map's median is not fio's"
import json, sys
text = open(sys.argv[1]).read()  # fio's nbd engine prints a line before the JSON
job = json.loads(text[text.index("{"):])["jobs"][0]["read"]
fio_median_ns = job["clat_ns"]["percentile"]["50.000000"]
q = json.load(open(sys.argv[2]))
lower = json.load(open(sys.argv[3]))["buckets"]["lower"]
counts = [0] * len(lower)
for s in q["series"]:
    if s["key"] == "read":
        for point in s["buckets"]:
            for b, n in point or []:
                counts[b] += n
total = sum(counts)
assert total > 0, "no read latencies in the heat map"
acc, median_bucket = 0, None
for b, n in enumerate(counts):
    acc += n
    if acc * 2 >= total:
        median_bucket = b
        break
fio_bucket = max(i for i, lo in enumerate(lower) if lo <= fio_median_ns)
print(f"fio median {fio_median_ns / 1e6:.2f} ms (bucket {fio_bucket}); heat map median bucket {median_bucket} "
      f"[{lower[median_bucket] / 1e6:.2f} ms..), {total} reads")
assert fio_median_ns > 1e6, f"sim-hdd reads should take milliseconds, fio saw {fio_median_ns} ns"
assert abs(median_bucket - fio_bucket) <= 1, "more than one bucket apart"
EOF

# --- 3. history across restarts ----------------------------------------------------------
minutes_with_reads() { # the per-minute points of io.ops/op with reads in them
    get "query?dataset=io.ops/op&from=$(($(now) - 3600))&resolution=60&filter=read" |
        python3 -c 'import json,sys; q=json.load(sys.stdin); print(sum(1 for s in q["series"] if s["key"]=="read" for v in s["values"] if v))'
}
stop_daemon
[ -s "$STATE/analytics-history" ] || fail "no history file after SIGTERM"
start_daemon
n=$(minutes_with_reads)
log "after a restart: $n minute(s) with reads"
[ "$n" -ge 1 ] || fail "the per-minute history is gone after a restart"
# kill -9: the history saved in the last minute is what is left; wait for a save
before=$(stat -c %Y "$STATE/analytics-history")
for ((i = 0; i < 75; i++)); do
    [ "$(stat -c %Y "$STATE/analytics-history")" != "$before" ] && break
    sleep 1
done
[ "$(stat -c %Y "$STATE/analytics-history")" != "$before" ] || fail "the history was not saved within 75 s"
kill9_daemon
start_daemon
n=$(minutes_with_reads)
log "after kill -9: $n minute(s) with reads"
[ "$n" -ge 1 ] || fail "the per-minute history is gone after kill -9"

# damaged files: reported, moved aside, replaced; the daemon starts and collects
for damage in truncate flip; do
    stop_daemon
    size=$(stat -c %s "$STATE/analytics-history")
    case $damage in
        truncate) truncate -s $((size / 2)) "$STATE/analytics-history" ;;
        flip) printf '\xff\xff\xff\xff' | dd of="$STATE/analytics-history" bs=1 seek=$((size / 2)) conv=notrunc status=none ;;
    esac
    lines_before=$(wc -l <"$T/daemon.log")
    start_daemon
    tail -n +$((lines_before + 1)) "$T/daemon.log" | grep -q 'analytics: .*starting an empty history' ||
        fail "$damage: the damaged history file was not reported"
    [ -s "$STATE/analytics-history.bad" ] || fail "$damage: the damaged file was not moved aside"
    sleep 2.5
    get "query?dataset=io.ops/op" >/dev/null || fail "$damage: analytics does not answer after a damaged file"
    stop_daemon
    python3 - "$STATE/analytics-history" <<'EOF' || fail "$damage: the history file was not replaced by a good one"
import sys
data = open(sys.argv[1], "rb").read()
assert len(data) > 16, len(data)
EOF
    start_daemon
    tail -n +$((lines_before + 1)) "$T/daemon.log" | grep -c 'starting an empty history' | grep -qx 1 ||
        fail "$damage: the replaced history file was refused too"
done
log "analytics: rates and latency match fio; history kept across restart and kill -9; damaged files replaced"
