#!/usr/bin/env bash
# Goal: a write acknowledged by FLUSH survives kill -9 of the daemon. Method: write
# random data with nbdcopy --flush and a pattern with qemu-io write + flush, kill -9
# at once, restart (the pool is re-imported from the cache file at its last synced txg;
# the intent log is replayed at import; tests/system/61_zil_kill9.sh covers it), read
# everything back.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 256M
make_volume tank/crash 128M
uri=$(nbd_unix_uri tank/crash)
head -c $((32 << 20)) /dev/urandom >"$T/data"
for round in 1 2 3; do
    nbdcopy --flush "$T/data" "$uri"
    qemu-io -f raw -c "write -P 0xab $((64 << 20)) 1M" -c flush "$uri" >/dev/null
    kill9_daemon
    start_daemon
    nbdcopy "$uri" "$T/back"
    cmp -n $((32 << 20)) "$T/data" "$T/back" || fail "round $round: flushed nbdcopy data lost"
    qemu-io -f raw -c "read -P 0xab $((64 << 20)) 1M" "$uri" | tee "$T/qio"
    grep -q 'Pattern verification failed' "$T/qio" && fail "round $round: flushed 0xab block lost"
    head -c $((32 << 20)) /dev/urandom >"$T/data"
done
z pool status tank | grep -q 'state: ONLINE' || fail "pool not ONLINE after crashes"
stop_daemon
log "kill -9 after FLUSH OK"
