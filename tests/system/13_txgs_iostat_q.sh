#!/usr/bin/env bash
# Goal: the observability of issue 8 works end to end: `zilla txgs` prints OpenZFS's
# txgs kstat columns and its numbers follow the writes; `zilla pool iostat -q` prints
# zpool's per-class pending/active columns and they move while a txg sync writes;
# arcstat and /metrics report the memory beyond ARC and dirty data within its bound.
# Method: a mirror of emulated 7200 rpm disks (slow enough that a sync keeps queues
# busy); sample `iostat -q -Hp` while 96 MiB stream in; then read the txg history.
. "$(dirname "$0")/lib.sh"
start_daemon
truncate -s 1G "$T/disks/q0" "$T/disks/q1"
z pool create tank mirror "sim-hdd:$T/disks/q0" "sim-hdd:$T/disks/q1"
make_volume tank/v 256M
uri=$(nbd_unix_uri tank/v)

z txgs tank | tee "$T/txgs0"
head -1 "$T/txgs0" | grep -Eq '^ *txg +birth +state +ndirty +nread +nwritten +reads +writes +otime +qtime +wtime +stime$' || fail "txgs header"
[ "$(tail -1 "$T/txgs0" | awk '{print $3}')" = O ] || fail "txgs: the newest txg is not open"
first=$(tail -1 "$T/txgs0" | awk '{print $1}')

z pool iostat -q tank | tee "$T/q0"
head -1 "$T/q0" | grep -Eq 'syncq_read +syncq_write +asyncq_read +asyncq_write +scrubq_read +trimq_write$' || fail "iostat -q groups"
sed -n 2p "$T/q0" | grep -Eq '^pool +alloc +free +read +write +read +write( +pend +activ){6}$' || fail "iostat -q pend/activ columns"

head -c $((96 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri" &
copy=$!
# -Hp columns: pool alloc free rops wops rbw wbw, then pend/activ for syncq_read,
# syncq_write, asyncq_read, asyncq_write (14, 15), scrubq_read, trimq_write
: >"$T/qs"
while kill -0 $copy 2>/dev/null; do
    z pool iostat -q -H -p tank >>"$T/qs"
    sleep 0.05
done
wait $copy || fail "nbdcopy"
awk -F'\t' 'NF != 19 {bad=1} END {exit bad}' "$T/qs" || fail "iostat -q -Hp: not 19 fields: $(head -1 "$T/qs")"
busy=$(awk -F'\t' '$14 + $15 > 0' "$T/qs" | wc -l)
log "iostat -q: async writes pending or active in $busy of $(wc -l <"$T/qs") samples"
[ "$busy" -gt 0 ] || fail "iostat -q: asyncq_write never pending nor active while 96 MiB were written"

# the flush may have put the data in the intent log: wait (zfs_txg_timeout, 5 s) until
# committed txgs wrote both mirror sides of it
for i in $(seq 100); do
    z txgs -H tank >"$T/txgs"
    awk -F'\t' -v f="$first" '$1 >= f && $3 == "C" {w += $6} END {exit !(w >= 96 * 2^20 * 2)}' "$T/txgs" && break
    sleep 0.2
done
z txgs tank
awk -F'\t' 'NF != 12 {bad=1} $3 !~ /^[OQWSC]$/ {bad=1} END {exit bad}' "$T/txgs" || fail "txgs -H: 12 fields and a state letter: $(cat "$T/txgs")"
awk -F'\t' 'NR > 1 && ($1 != prev + 1 || $2 < pbirth) {bad=1} {prev=$1; pbirth=$2} END {exit bad}' "$T/txgs" ||
    fail "txgs: not consecutive txgs born in order"
awk -F'\t' -v f="$first" '$1 >= f && $3 == "C" && $4 > 0 && $8 > 0 && $12 > 0 {n++; w += $6} END {exit !(n > 0 && w >= 96 * 2^20 * 2)}' "$T/txgs" ||
    fail "txgs: no committed txgs with ndirty, nwritten (both mirror sides), writes and stime for 96 MiB: $(cat "$T/txgs")"
awk -F'\t' '$3 == "C" && $9 == 0 {bad=1} END {exit bad}' "$T/txgs" || fail "txgs: a committed txg with otime 0"
[ "$(z txgs -n 3 tank | wc -l)" = 4 ] || fail "txgs -n 3: not a header and 3 rows"
# the memory beyond ARC and dirty data: arcstat's overhd column, /metrics by part
z arcstat | tee "$T/arc"
head -1 "$T/arc" | grep -Eq '^ +time +read +miss +miss% +size +c +avail +overhd$' || fail "arcstat header"
[ "$(tail -1 "$T/arc" | awk '{print $8}')" != - ] || fail "arcstat: no overhead"
curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$T/metrics" || fail "/metrics"
m() { awk -v n="$1" '$1 == n {print $2}' "$T/metrics"; }
rss=$(m zilla_memory_rss_bytes) ovh=$(m zilla_memory_overhead_bytes) max=$(m zilla_memory_overhead_max_bytes)
parts=$(($(m zilla_memory_overhead_frontend_bytes) + $(m zilla_memory_overhead_reply_pool_bytes) + $(m zilla_memory_overhead_block_buffers_bytes) + $(m zilla_memory_overhead_other_bytes)))
log "memory: rss $rss overhead $ovh (parts $parts) max $max"
[ "$ovh" -gt $((1 << 20)) ] && [ "$ovh" -le "$rss" ] && [ "$parts" = "$ovh" ] && [ "$ovh" -le "$max" ] ||
    fail "memory overhead: rss $rss overhead $ovh parts $parts max $max"
expect_error "cannot open 'nope'" z txgs nope
z tunable set zfs_txg_history=2
[ "$(z txgs -H tank | wc -l)" = 2 ] || fail "zfs_txg_history=2: not the last 2 txgs"
z tunable set zfs_txg_history=100
z pool destroy tank
stop_daemon
log "txgs and iostat -q OK"
