#!/usr/bin/env bash
# Goal: on an idle pool, space freed by an NBD TRIM of 32 MiB and by a volume destroy
# shows in FREE (`pool list` and /metrics) within three txg timeouts, with nothing else
# happening on the pool; and a scrub is resumable from the moment `pool scrub` returns:
# kill -9 right after it, restart, and the pool status shows the scrub (in progress,
# resumed, or finished), not "none requested".
. "$(dirname "$0")/lib.sh"
TXG_TIMEOUT=2
start_daemon
z tunable set zfs_txg_timeout=$TXG_TIMEOUT >/dev/null
make_pool tank 256M
make_volume tank/v 64M
make_volume tank/gone 64M
qemu-io -f raw -c "write -P 0x5a 0 32M" -c flush "$(nbd_unix_uri tank/v)" >/dev/null
qemu-io -f raw -c "write -P 0xa5 0 32M" -c flush "$(nbd_unix_uri tank/gone)" >/dev/null

pool_free() { z pool list -H -p -o free tank; }
metrics_free() { curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" | awk '/^zfs_pool_free_bytes\{pool="tank"\}/ {print $2}'; }
now_ms() { date +%s%3N; }
# wait_free_back WHAT BEFORE: FREE (pool list and /metrics) grows by 31 MiB from
# BEFORE within three txg timeouts (plus 1.5 s for the polling and the syncs themselves)
wait_free_back() {
    local what=$1 before=$2 start limit_ms f m
    start=$(now_ms)
    limit_ms=$((3 * TXG_TIMEOUT * 1000 + 1500))
    while :; do
        f=$(pool_free)
        m=$(metrics_free)
        if [ "$f" -ge $((before + (31 << 20))) ] && [ "${m%.*}" -ge $((before + (31 << 20))) ]; then
            log "$what: FREE back after $(($(now_ms) - start)) ms ($before -> $f bytes, /metrics $m)"
            return 0
        fi
        [ $(($(now_ms) - start)) -le "$limit_ms" ] || fail "$what: FREE $f (/metrics $m) bytes $((limit_ms / 1000)) s later, $before before it: the freed 32 MiB did not come back on an idle pool"
        sleep 0.2
    done
}

# let the writes' txgs sync and the pool go idle
sleep $((3 * TXG_TIMEOUT))
before=$(pool_free)
qemu-io -f raw -c "discard 0 32M" -c flush "$(nbd_unix_uri tank/v)" >/dev/null
wait_free_back "trim of 32 MiB" "$before"

sleep $((2 * TXG_TIMEOUT))
before=$(pool_free)
z volume destroy tank/gone
wait_free_back "destroy of a 32 MiB volume" "$before"
qemu-io -f raw -c "read -P 0 0 64M" "$(nbd_unix_uri tank/v)" | tee "$T/qio"
grep -q 'Pattern verification failed' "$T/qio" && fail "tank/v reads back wrong after the trim"

# a long txg timeout: nothing but the scrub command itself can make its start durable
z tunable set zfs_txg_timeout=600 >/dev/null
z pool scrub tank
kill9_daemon
start_daemon
z pool status tank | tee "$T/st"
grep -q 'scan: none requested' "$T/st" && fail "the scrub acknowledged before kill -9 is gone after the restart"
grep -Eq 'scan: scrub (in progress|repaired)' "$T/st" || fail "pool status shows no scrub after the restart"
for _ in $(seq 300); do
    z pool status tank >"$T/st"
    grep -q 'scan: scrub repaired' "$T/st" && break
    sleep 0.1
done
grep -Eq 'scan: scrub repaired .* with 0 errors' "$T/st" || { cat "$T/st"; fail "the resumed scrub did not finish cleanly"; }
stop_daemon
log "space and scans OK"
