#!/usr/bin/env bash
# Goal: the ARC can be watched as on OpenZFS: `zilla arcstat -f` with arcstat.py's
# field names (rates per interval, `-` for what the daemon does not report), `-v`,
# `zilla arc-summary`'s sections, node_exporter's node_zfs_arc_* names on /metrics.
# Method: write a small volume, read it back while arcstat samples, then compare the
# columns and metrics with GET /v1/arcstats.
. "$(dirname "$0")/lib.sh"

# -v needs no daemon; a bad field is bad usage (exit 2) before any daemon is asked
z arcstat -v >"$T/fields"
for f in time hits miss read hit% miss% ddh% dmh% ph% mh% size c mfu mru mfug mrug eskip mtxmis l2hits l2asize overhd; do
    awk -v f="$f" '$1 == f && $2 == ":" {ok=1} END {exit !ok}' "$T/fields" || fail "arcstat -v does not list $f"
done
rc=0
z arcstat -f hits,nosuch 2>"$T/err" >/dev/null || rc=$?
[ $rc -eq 2 ] || fail "arcstat -f nosuch: exit $rc, expected 2"
grep -q "invalid column 'nosuch'.*l2hits" "$T/err" || fail "arcstat -f nosuch: $(cat "$T/err")"

start_daemon
make_pool tank 256M
make_volume tank/v 32M
uri=$(nbd_unix_uri tank/v)
head -c $((16 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri"
expect_error "invalid column 'nosuch'" z arcstat -f hits,nosuch 1 2
arcstats() { curl -sf --unix-socket "$STATE/zilla.sock" http://zilla/v1/arcstats; }

# two rows: the totals, then the rate over 2 s while the volume is read back
z arcstat -f hits,miss,read,size,c,l2hits 2 2 >"$T/arc" &
arc=$!
sleep 0.5
nbdcopy "$uri" "$T/back"
wait $arc || fail "arcstat exited with an error"
cmp -s -n $((16 << 20)) "$T/data" "$T/back" || fail "read back differs"
cat "$T/arc"
[ "$(wc -l <"$T/arc")" = 3 ] || fail "arcstat 2 2: not a header and two rows"
head -1 "$T/arc" | grep -Eq '^ +hits +miss +read +size +c +l2hits$' || fail "arcstat -f header: $(head -1 "$T/arc")"
num='^[0-9]+(\.[0-9]+)?[KMGTPE]?$'
l2=$(arcstats | python3 -c 'import json,sys; print("yes" if "l2_hits" in json.load(sys.stdin) else "no")')
while read -r hits miss read size c l2hits; do
    for v in "$hits" "$miss" "$read" "$size" "$c"; do [[ $v =~ $num ]] || fail "arcstat: '$v' is not a number"; done
    if [ "$l2" = no ]; then [ "$l2hits" = - ] || fail "l2hits '$l2hits' without L2ARC statistics"; else [[ $l2hits =~ $num ]] || fail "l2hits '$l2hits'"; fi
done < <(tail -n 2 "$T/arc")
[ "$(sed -n 3p "$T/arc" | awk '{print $3}')" != 0 ] || fail "arcstat: no reads in the interval 16 MiB were read back"

# the default columns are unchanged; one column per name and width
z arcstat >"$T/default"
head -1 "$T/default" | grep -Eq '^ +time +read +miss +miss% +size +c +avail +overhd$' || fail "arcstat default header"
# a reader that stops early (head) ends arcstat quietly
z arcstat 0.2 | head -2 >/dev/null 2>"$T/pipe_err" || true
[ ! -s "$T/pipe_err" ] || fail "arcstat | head: $(head -3 "$T/pipe_err")"
z arcstat -f time,hit%,miss%,mfu%,mru%,mfusz,mrusz,mtxmis,waste,grow 1 1 | tee "$T/arc2"
sed -n 2p "$T/arc2" | awk '$8 == "-" && $9 == "-" && $10 == "-" && NF == 10 {ok=1} END {exit !ok}' ||
    fail "arcstat: mtxmis, waste, grow not '-' (the daemon has no source for them)"

z arc-summary | tee "$T/summary"
for s in "ARC size (current):" "Target size (adaptive):" "Min size (hard limit):" "Max size (high water):" \
    "Most Recently Used (MRU) cache size:" "Header size:" "ARC adaptive targets:" "Metadata share (meta):" \
    "ARC total accesses (hits + misses):" "Cache hit ratio:" "Cache hits by cache type:" "Cache misses by data type:"; do
    grep -qF "$s" "$T/summary" || fail "arc-summary: no '$s'"
done
if [ "$l2" = no ]; then
    ! grep -q L2ARC "$T/summary" || fail "arc-summary: an L2ARC section without L2ARC statistics"
fi

curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$T/metrics" || fail "/metrics"
hits=$(awk '$1 == "node_zfs_arc_hits" {print $2}' "$T/metrics")
api_hits=$(arcstats | python3 -c 'import json,sys; print(json.load(sys.stdin)["hits"])')
log "node_zfs_arc_hits $hits, /v1/arcstats hits $api_hits"
[ -n "$hits" ] && [ "$hits" -gt 0 ] && [ "$hits" -le "$api_hits" ] || fail "node_zfs_arc_hits '$hits' (api $api_hits)"
for k in size c c_max mfu_size pd; do
    grep -q "^node_zfs_arc_$k " "$T/metrics" || fail "/metrics: no node_zfs_arc_$k"
done
! grep -q '^node_zfs_arc_zilla_' "$T/metrics" || fail "/metrics: Zilla's memory keys under node_zfs_arc_"
grep -q '^zilla_memory_overhead_bytes ' "$T/metrics" || fail "/metrics: zilla_memory_overhead_bytes gone"
z pool destroy tank
stop_daemon
log "arcstat, arc-summary and node_zfs_arc metrics OK"
