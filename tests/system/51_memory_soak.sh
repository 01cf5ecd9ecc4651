#!/usr/bin/env bash
# Goal: an idle daemon gives back the memory a day's work used. Method: with a small
# ARC (zfs_arc_max=64M) write 256 MiB of random data to a volume of a 2-way mirror over
# NBD, scrub three times, replace a disk three times (each a full resilver), then leave
# the daemon idle: 60 s after the load stops its RSS is within the ARC's current size
# + 64 MiB (at rest it holds no dirty data), and the memory report (arcstats
# zilla_overhead_*) accounts for what it holds.
. "$(dirname "$0")/lib.sh"
DATA_MB=256
SLACK_MB=64
start_daemon
z tunable set zfs_arc_max=64M
for d in d0 d1 d2 d3 d4; do truncate -s 1G "$T/disks/$d"; done
z pool create tank mirror "$T/disks/d0" "$T/disks/d1"
make_volume tank/vol ${DATA_MB}M

rss_mb() { awk '/^VmRSS/ { print int($2 / 1024) }' "/proc/$DAEMON_PID/status"; }
# arcstats key KEY in MiB
arcstat_mb() {
    curl -sf "http://127.0.0.1:$HTTP_PORT/api/v1/arcstats" |
        python3 -c "import json, sys; d = json.load(sys.stdin); d = d.get('arcstats', d); print(d['$1'] >> 20)"
}
report() {
    log "$1: RSS $(rss_mb) MiB, ARC $(arcstat_mb size) MiB, overhead $(arcstat_mb zilla_overhead_bytes) MiB" \
        "(block buffers $(arcstat_mb zilla_overhead_block_buffers_bytes), other $(arcstat_mb zilla_overhead_other_bytes)," \
        "max $(arcstat_mb zilla_overhead_max_bytes))"
}
wait_scan_done() { # WHAT: scrub or resilver
    local i
    for ((i = 0; i < 1200; i++)); do
        z pool status tank >"$T/st"
        grep -q "scan: $1 in progress" "$T/st" || return 0
        sleep 0.25
    done
    cat "$T/st"; fail "$1 did not finish within 5 minutes"
}

head -c $((DATA_MB << 20)) /dev/urandom >"$T/in"
sum_in=$(sha256sum <"$T/in" | cut -d' ' -f1)
nbdcopy --flush "$T/in" "$(nbd_tcp_uri tank/vol)"
rm -f "$T/in"
report "after ${DATA_MB} MiB of writes"
for i in 1 2 3; do
    z pool scrub tank
    wait_scan_done scrub
    grep -Eq 'scan: scrub repaired 0B .* with 0 errors' "$T/st" || { cat "$T/st"; fail "scrub $i did not finish cleanly"; }
done
report "after three scrubs"
old=d1
for new in d2 d3 d4; do
    z pool replace -w tank "$T/disks/$old" "$T/disks/$new"
    wait_scan_done resilver
    grep -q "$T/disks/$new" "$T/st" || { cat "$T/st"; fail "$new is not in the pool after the replace"; }
    rm -f "$T/disks/$old"
    old=$new
done
report "after three resilvers"
[ "$(z pool status -x)" = "all pools are healthy" ] || { z pool status tank; fail "the pool is not healthy after the replaces"; }

sleep 60
report "60 s idle"
rss=$(rss_mb) arc=$(arcstat_mb size)
[ "$rss" -le $((arc + SLACK_MB)) ] ||
    fail "60 s after the load stopped the daemon holds $rss MiB: more than the ARC's $arc MiB + $SLACK_MB MiB"
# the memory report's overhead is what the RSS holds beyond the ARC and dirty data, and
# stays within its own bound
overhead=$(arcstat_mb zilla_overhead_bytes) overhead_max=$(arcstat_mb zilla_overhead_max_bytes)
[ "$overhead" -le "$overhead_max" ] || fail "overhead $overhead MiB above the report's bound $overhead_max MiB"
# the data came through the scrubs and resilvers intact
[ "$(nbdcopy "$(nbd_tcp_uri tank/vol)" - | sha256sum | cut -d' ' -f1)" = "$sum_in" ] || fail "the volume's data differs"
stop_daemon
log "idle daemon: $rss MiB RSS with $arc MiB of ARC"
