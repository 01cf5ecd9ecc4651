#!/usr/bin/env bash
# Goal: thick and thin volumes as zfs has them. `volume create -V` without -s reserves
# the volume's size (refreservation); a reservation the pool cannot hold is refused
# with ENOSPC; a sparse volume filled over NBD until ENOSPC leaves the thick volume's
# reservation alone, and every byte of the thick volume can still be written over NBD
# and reads back; `zilla get`, `volume list` and `pool list` agree on every figure;
# the reservation survives export/import; `set refreservation=` works and refuses a
# value the pool cannot hold.
. "$(dirname "$0")/lib.sh"
start_daemon
z tunable set zfs_txg_timeout=1 >/dev/null
make_pool tank 64M
THICK=$((24 << 20))
z volume create -V 24M tank/thick 2>"$T/create.err"
[ ! -s "$T/create.err" ] || fail "volume create printed: $(cat "$T/create.err")"
z volume create -s -V 1G tank/thin
expect_error "cannot create 'tank/huge': out of space: a refreservation of .* does not fit" z volume create -V 1G tank/huge
z volume list -H | awk '{print $1}' | grep -qx tank/huge && fail "a refused thick volume was created"

getp() { z get -H -p "$2" "$1" | cut -f3; }
rr=$(getp tank/thick refreservation)
[ "$rr" -gt "$THICK" ] && [ "$rr" -lt $((THICK + THICK / 8)) ] || fail "refreservation of a 24M thick volume: $rr"
[ "$(getp tank/thin refreservation)" = none ] || fail "a -s volume has refreservation $(getp tank/thin refreservation)"
z get refreservation,used,available,referenced,logicalused tank/thick

# every figure agrees: get (volume and pool), volume list, pool list
check_figures() {
    local pool_avail list_avail v r used avail refer lu unused row
    pool_avail=$(z get -H -p available tank | cut -f3)
    list_avail=$(z pool list -H -p -o avail tank)
    [ "$pool_avail" = "$list_avail" ] || fail "pool available: get $pool_avail, pool list $list_avail"
    [ "$(z get -H -p size tank | cut -f3)" = "$(z pool list -H -p -o size tank)" ] || fail "pool size disagrees"
    [ "$(z get -H -p allocated tank | cut -f3)" = "$(z pool list -H -p -o alloc tank)" ] || fail "pool allocated disagrees"
    for v in tank/thick tank/thin; do
        r=$(getp $v refreservation); [ "$r" = none ] && r=0
        used=$(getp $v used); avail=$(getp $v available); refer=$(getp $v referenced); lu=$(getp $v logicalused)
        unused=$((r > refer ? r - refer : 0))
        [ "$used" -eq $((refer + unused)) ] || fail "$v: used $used, referenced $refer, refreservation $r"
        [ "$avail" -eq $((pool_avail + unused)) ] || fail "$v: available $avail, pool available $pool_avail, unused reservation $unused"
        [ "$lu" -eq "$refer" ] || fail "$v: logicalused $lu, referenced $refer"
        row=$(z volume list -H -p | awk -F'\t' -v n=$v '$1==n {print $2, $3, $4, $5}')
        [ "$r" = 0 ] && r=none
        [ "$row" = "$used $avail $refer $r" ] || fail "$v: volume list says '$row', get says '$used $avail $refer $r'"
    done
    log "figures agree: pool available $pool_avail"
}
check_figures

# the sparse volume fills the pool through NBD until ENOSPC
head -c $((160 << 20)) /dev/urandom >"$T/fill"
if nbdcopy --flush "$T/fill" "$(nbd_tcp_uri tank/thin)" 2>"$T/fill.err"; then
    fail "160 MiB went into a 64 MiB-mirror pool"
fi
grep -qi "space" "$T/fill.err" || fail "the sparse volume's writes failed, but not for space: $(cat "$T/fill.err")"
rm -f "$T/fill"
sleep 3 # a few txg timeouts: the failed writes' txgs sync
[ "$(getp tank/thick used)" = "$rr" ] || fail "the unwritten thick volume uses $(getp tank/thick used), not its reservation $rr"
check_figures
z pool list -o name,size,alloc,free,avail tank

# every byte of the thick volume can be written and reads back
head -c "$THICK" /dev/urandom >"$T/in"
nbdcopy --flush "$T/in" "$(nbd_tcp_uri tank/thick)" || fail "writing the thick volume over NBD failed while the pool is full"
nbdcopy "$(nbd_unix_uri tank/thick)" "$T/out"
cmp -s "$T/in" "$T/out" || fail "the thick volume reads back different data"
rm -f "$T/out"
sleep 3 # a few txg timeouts: referenced follows the sync
[ "$(getp tank/thick referenced)" -eq "$THICK" ] || fail "thick referenced $(getp tank/thick referenced) after writing all of it"
check_figures

# export/import keeps the reservation
z pool export tank
z pool import -d "$T/disks" tank
[ "$(getp tank/thick refreservation)" = "$rr" ] || fail "refreservation after import: $(getp tank/thick refreservation)"
[ "$(getp tank/thin refreservation)" = none ] || fail "the sparse volume got a reservation at import"
nbdcopy "$(nbd_unix_uri tank/thick)" "$T/out"
cmp -s "$T/in" "$T/out" || fail "the thick volume reads back different data after import"
check_figures

# set refreservation: a value the pool cannot hold is refused, none releases it
expect_error "cannot set property for 'tank/thick'.*out of space|out of space" z set refreservation=10G tank/thick
[ "$(getp tank/thick refreservation)" = "$rr" ] || fail "a refused set changed the reservation"
z set refreservation=none tank/thick
[ "$(getp tank/thick refreservation)" = none ] || fail "refreservation=none did not stick"
[ "$(getp tank/thick used)" -eq "$THICK" ] || fail "thick used $(getp tank/thick used) without a reservation"
z set refreservation=24M tank/thick
[ "$(getp tank/thick refreservation)" -eq "$THICK" ] || fail "refreservation=24M reads $(getp tank/thick refreservation)"
check_figures
z volume list
stop_daemon
log "thick and thin volumes OK"
