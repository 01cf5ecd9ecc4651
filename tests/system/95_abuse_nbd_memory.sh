#!/usr/bin/env bash
# Goal (issue 14 row 2): no client can make the daemon hold more memory than the bound
# of docs/design.md §5 (ARC max + dirty max + front-end budget + reply-buffer pool cap
# + 64 MiB + 128 KiB per NBD connection), computed from the running daemon's config.
# Method: a config file sets the front-end budget (192 MiB) and the tunables shrink
# the ARC and dirty limits (64 MiB each); 24 NBD clients each send four 32 MiB reads
# and never read a reply (3 GiB asked for; before the budget existed RSS grew
# linearly to 1.8 GiB). RSS is sampled for 8 s and the high-water mark checked, the
# budget in use (/metrics) never exceeds the budget, and another client's 4 KiB
# write + FLUSH is still served within 1 s.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../tools/memory_bound.sh"
TOOL="$(dirname "$0")/../tools/nbd_abuse.py"
cat >"$T/zilla.conf" <<CONF
frontend_memory_budget_bytes = 192M
frontend_buffer_pool_bytes_max = 32M
CONF
start_daemon --config "$T/zilla.conf"
make_pool tank 256M
make_volume tank/big 1G
make_volume tank/vol 64M
z tunable set zfs_arc_max=64M
z tunable set zfs_dirty_data_max=64M
budget=$(metric zilla_frontend_memory_budget_bytes)
[ "$budget" = $((192 << 20)) ] || fail "/metrics shows a budget of '$budget', the config file says 192M"
[ "$(metric zilla_frontend_buffer_pool_max_bytes)" = $((32 << 20)) ] || fail "reply-buffer pool cap not from the config file"
log "RSS before: $(rss_kib VmRSS) KiB"

python3 "$TOOL" bigreads 127.0.0.1 "$NBD_PORT" tank/big 24 >"$T/abusers.out" 2>&1 &
ABUSERS=$!
on_exit "kill $ABUSERS 2>/dev/null"
for ((i = 0; i < 200; i++)); do grep -q ready "$T/abusers.out" && break; sleep 0.1; done
grep -q ready "$T/abusers.out" || { cat "$T/abusers.out"; fail "abusive clients did not connect"; }

bound=$(memory_bound_bytes)
log "bound: $((bound >> 20)) MiB with $(metric zilla_nbd_connections_open) NBD connections open"
max_in_use=0
for ((i = 0; i < 16; i++)); do
    rss=$(rss_kib VmRSS)
    in_use=$(metric zilla_frontend_memory_in_use_bytes)
    ((in_use > max_in_use)) && max_in_use=$in_use
    log "RSS $((rss >> 10)) MiB, front-end budget in use $((in_use >> 20)) MiB"
    ((rss * 1024 <= bound)) || fail "RSS $((rss >> 10)) MiB above the bound $((bound >> 20)) MiB"
    ((in_use <= budget)) || fail "budget in use $in_use above the budget $budget"
    sleep 0.5
done
((max_in_use >= 64 << 20)) || fail "the abusers never held the budget ($max_in_use bytes): the test is not biting"

took=$(timeout 10 python3 "$TOOL" writeflush 127.0.0.1 "$NBD_PORT" tank/vol) || fail "write+flush failed"
log "another client's write+flush: ${took} s"
awk -v t="$took" 'BEGIN { exit !(t < 1.0) }' || fail "write+flush took ${took} s (limit 1 s)"
kill -0 "$ABUSERS" || fail "abusive clients went away early"

hwm=$(rss_kib VmHWM)
log "peak RSS (VmHWM) $((hwm >> 10)) MiB, bound $((bound >> 20)) MiB"
((hwm * 1024 <= bound)) || fail "peak RSS $((hwm >> 10)) MiB above the bound $((bound >> 20)) MiB"
clients=$(api_get /v1/clients)
echo "$clients" | python3 -c '
import json, sys
rows = json.load(sys.stdin)
tcp = [r for r in rows if r["protocol"] == "nbd" and r["address"] == "127.0.0.1"]
assert tcp and tcp[0]["connections_total"] >= 25 and tcp[0]["write_bytes"] >= 4096, rows
' || fail "GET /v1/clients does not show the clients: $clients"
log "memory stays under the bound OK"
