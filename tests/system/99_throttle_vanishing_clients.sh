#!/usr/bin/env bash
# Goal: writes the throttle delays wait in the front end's delay timer
# (no thread, no volume call). Clients that vanish while their writes wait there, an
# export and a SIGTERM with delayed writes pending: the daemon stays up, acknowledged
# data survives the export and import, SIGTERM exits 0 within 10 s, nothing panics.
# Method: a 20 MB/s sim-ssd pool with a 32 MiB dirty limit, so 8x16 random 8K writers
# are delayed (the dmu_tx delay counter must rise, else the test proves nothing);
# three rounds of fio killed -9 after 3 s; a verified 64 MiB pattern written and
# flushed; an export with writers delayed; import; the pattern verified; SIGTERM with
# writers delayed.
. "$(dirname "$0")/lib.sh"
command -v fio >/dev/null || skip "fio missing"
start_daemon
for kv in sim_flush_backing=0 sim_ssd_cache_write_mb_s=20 sim_ssd_cache_write_latency_us=0 \
          sim_ssd_cache_channels=1 zfs_dirty_data_max=33554432; do
    z tunable set "$kv" >/dev/null
done
truncate -s 4G "$T/disks/ssd"
z pool create -f p "sim-ssd:$T/disks/ssd" >/dev/null
make_volume p/v 1G -o volblocksize=8K >/dev/null 2>&1
delayed() { curl -s "http://127.0.0.1:$HTTP_PORT/metrics" | awk '/^zilla_dmu_tx_dirty_delay_total/ { s += $2 } END { print s + 0 }'; }
writers() { # SECONDS: 8 jobs x 16 random 8K writes in flight, in the background
    fio --name=w --ioengine=nbd --uri="$(nbd_tcp_uri p/v)" --rw=randwrite --bs=8k --numjobs=8 --iodepth=16 \
        --size=256M --time_based --runtime="$1" >/dev/null 2>&1 &
    FIO=$!
}
kill_writers() { kill -9 "$FIO" 2>/dev/null || true; pkill -9 -f "uri=nbd://127.0.0.1:$NBD_PORT/" || true; wait "$FIO" 2>/dev/null || true; }
on_exit "pkill -9 -f uri=nbd://127.0.0.1:$NBD_PORT/ || true"

before=$(delayed)
for round in 1 2 3; do
    writers 30; sleep 3; kill_writers
    kill -0 "$DAEMON_PID" || fail "daemon died after clients vanished with delayed writes (round $round)"
done
after=$(delayed)
log "delayed writes over three vanished-client rounds: $((after - before))"
[ "$after" -gt "$before" ] || fail "no write was delayed: the test did not exercise the delay timer"

fio --name=pat --ioengine=nbd --uri="$(nbd_unix_uri p/v)" --rw=write --bs=64k --size=64M --offset=512M \
    --verify=crc32c --do_verify=0 --verify_state_save=0 --end_fsync=1 >"$T/pat.out" 2>&1 || fail "pattern write failed"
writers 30; sleep 3
z pool export -f p >"$T/export.out" 2>&1 || fail "export -f with delayed writes pending: $(cat "$T/export.out")"
kill_writers
z pool import -d "$T/disks" p >/dev/null 2>&1 || z pool import p >/dev/null || fail "import after the export failed"
fio --name=pat --ioengine=nbd --uri="$(nbd_unix_uri p/v)" --rw=read --bs=64k --size=64M --offset=512M \
    --verify=crc32c --verify_only=1 >"$T/verify.out" 2>&1 || fail "pattern lost across export/import: $(grep -m3 -i verify "$T/verify.out")"

writers 30; sleep 3
start=$(date +%s.%N)
kill -TERM "$DAEMON_PID"
rc=0
wait_pid_gone "$DAEMON_PID" 10 || fail "daemon still running 10 s after SIGTERM with delayed writes pending"
wait "$DAEMON_PID" || rc=$?
DAEMON_PID=
kill_writers
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
log "SIGTERM with delayed writes pending: ${took} s, status $rc"
[ $rc -eq 0 ] || fail "daemon exited with status $rc"
if grep -qiE "panicked|broken invariant" "$T/daemon.log"; then fail "daemon log: $(grep -m2 -iE 'panicked|broken invariant' "$T/daemon.log")"; fi
log "vanishing clients with delayed writes OK"
