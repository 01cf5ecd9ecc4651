# Helpers for the daemon's memory bound (docs/design.md §5), sourced by system tests
# and tests/soak after lib.sh:
#
#   RSS <= ARC max + dirty max + front-end budget + reply-buffer pool cap
#          + 192 MiB + 128 KiB per open NBD connection
#
# Every term is read from the running daemon: ARC max (c_max of the daemon's one ARC) from
# GET /v1/arcstats, dirty max from `zilla tunable get`, the front-end terms and the
# open connections from /metrics.

# metric NAME: the value of an unlabelled sample in /metrics.
metric() {
    local body
    body=$(curl -sf --max-time 5 "http://127.0.0.1:$HTTP_PORT/metrics") || fail "GET /metrics failed"
    awk -v n="$1" '$1 == n && !done { print $2; done = 1 }' <<<"$body"
}

# api_get PATH: GET on the admin socket.
api_get() {
    curl -sf --max-time 5 --unix-socket "$STATE/zilla.sock" "http://zilla$1"
}

# memory_bound_bytes: the bound for the daemon as configured right now.
memory_bound_bytes() {
    local arc dirty budget pool conns
    arc=$(api_get /v1/arcstats | python3 -c 'import json,sys; print(json.load(sys.stdin).get("c_max", 0))')
    dirty=$(z tunable get -H -p zfs_dirty_data_max | awk '{ print $2 }')
    if [ "$dirty" = 0 ]; then # auto: min(10% of RAM, 4 GiB)
        dirty=$(awk '$1 == "MemTotal:" { d = $2 * 1024 / 10; if (d > 4294967296) d = 4294967296; printf "%d", d }' /proc/meminfo)
    fi
    budget=$(metric zilla_frontend_memory_budget_bytes)
    pool=$(metric zilla_frontend_buffer_pool_max_bytes)
    conns=$(metric zilla_nbd_connections_open)
    [ -n "$arc" ] && [ -n "$dirty" ] && [ -n "$budget" ] && [ -n "$pool" ] && [ -n "$conns" ] ||
        fail "cannot read the memory bound terms (arc=$arc dirty=$dirty budget=$budget pool=$pool conns=$conns)"
    echo $((arc + dirty + budget + pool + (192 << 20) + conns * (128 << 10)))
}

# rss_kib FIELD: VmRSS or VmHWM of the daemon in KiB.
rss_kib() {
    awk -v f="$1:" '$1 == f { print $2 }' "/proc/$DAEMON_PID/status"
}
