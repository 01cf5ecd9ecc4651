#!/usr/bin/env bash
# Goal: NBD clients see the volume's size, its capability flags and base:allocation.
# Method: nbdinfo over TCP and the unix socket; --map before and after a write.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 256M
make_volume tank/vol0 64M

for uri in "$(nbd_tcp_uri tank/vol0)" "$(nbd_unix_uri tank/vol0)"; do
    nbdinfo "$uri" | tee "$T/info"
    grep -Eq "export-size: $((64 << 20)) " "$T/info" || fail "size not 64M in $uri"
    for flag in can_flush can_fua can_trim can_zero can_multi_conn can_cache; do
        grep -Eq "^\s*$flag: true$" "$T/info" || fail "$flag is not true in $uri"
    done
    grep -q 'base:allocation' "$T/info" || fail "no base:allocation context"
done
nbdinfo --list "nbd://127.0.0.1:$NBD_PORT" | grep -q 'export="tank/vol0"' || fail "export not listed"

# A new volume is exported at once.
make_volume tank/vol1 16M
nbdinfo --size "$(nbd_tcp_uri tank/vol1)" | grep -qx $((16 << 20)) || fail "new volume not exported at once"

# base:allocation: a fresh volume is one hole; after writing 1M at 4M there is data.
nbdinfo --map "$(nbd_unix_uri tank/vol0)" | tee "$T/map0"
[ "$(wc -l <"$T/map0")" -eq 1 ] && grep -q 'hole,zero' "$T/map0" || fail "fresh volume is not one hole"
qemu-io -f raw -c "write -P 0x5a $((4 << 20)) 1M" -c flush "$(nbd_unix_uri tank/vol0)" >/dev/null
nbdinfo --map "$(nbd_unix_uri tank/vol0)" | tee "$T/map1"
awk '$1 == 4194304 && $3 == 0 { found = 1 } END { exit !found }' "$T/map1" ||
    fail "no data extent at 4M after writing there"
nbdinfo --map --totals "$(nbd_unix_uri tank/vol0)"
stop_daemon
log "nbdinfo OK"
