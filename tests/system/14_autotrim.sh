#!/usr/bin/env bash
# Goal: `autotrim=on` gives space the pool frees back to its devices, as zpool's does:
# after an NBD TRIM of most of a volume and a few txgs, the leaf files hold far fewer
# blocks (the discards are hole punches), while with autotrim off they keep them; the
# property is set with `pool set`, shown by `pool get` (local vs default), refused
# with a clear error for bad values, and kept across a restart; nothing still in use is
# discarded (the data left reads back exactly, also after the restart, and a scrub
# finds no errors). With autotrim off, `pool trim -w` discards the free space instead.
. "$(dirname "$0")/lib.sh"
start_daemon
z tunable set zfs_txg_timeout=1 >/dev/null
make_pool tank 256M
z pool get autotrim tank | tee "$T/get0"
grep -Eq '^tank +autotrim +off +default$' "$T/get0" || fail "autotrim is not off by default"
expect_error "bad value 'maybe' for autotrim: expected on or off" z pool set autotrim=maybe tank
expect_error "ashift is fixed" z pool set ashift=13 tank
expect_error "unknown pool property 'bogus'" z pool set bogus=1 tank
expect_error "not a pool" z pool set autotrim=on tank/v

make_volume tank/keep 16M
make_volume tank/v 192M
head -c $((16 << 20)) /dev/urandom >"$T/keep"
nbdcopy --flush "$T/keep" "$(nbd_unix_uri tank/keep)"
head -c $((160 << 20)) /dev/urandom >"$T/data"

# leaf blocks in KiB, summed over the four files
leaf_kib() { du -k "$T"/disks/tank-* | awk '{s += $1} END {print s}'; }
# a few txgs: small writes to tank/keep's first block (same bytes), one sync each
advance_txgs() {
    local i
    for i in 1 2 3 4 5 6; do
        head -c 4096 "$T/keep" | nbdcopy --flush - "$(nbd_unix_uri tank/keep)"
        sleep 1.2
    done
}
# fill tank/v, trim all but its first 8 MiB, let the frees leave the defer window
fill_and_trim() {
    nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/v)"
    advance_txgs
    full=$(leaf_kib)
    qemu-io -f raw -c "discard $((8 << 20)) $((152 << 20))" -c flush "$(nbd_unix_uri tank/v)" >/dev/null
    advance_txgs
    after=$(leaf_kib)
    log "leaf KiB: $full full, $after after the trim"
}

# the trim frees 152 MiB of the volume, twice that on the leaves (two-way mirrors)
freed_kib=$((2 * 152 * 1024))
# autotrim off: the devices keep the freed blocks
fill_and_trim
[ $((full - after)) -lt $((freed_kib / 10)) ] || fail "autotrim off, yet the leaves shrank from $full to $after KiB"
# until a manual trim (`zpool trim`) discards the pool's free space
expect_error "no active trim to suspend or cancel" z pool trim -c tank
z pool trim -w tank
manual=$(leaf_kib)
log "leaf KiB after pool trim: $manual"
[ $((after - manual)) -gt $((freed_kib * 8 / 10)) ] || fail "pool trim shrank the leaves only from $after to $manual KiB"
z pool status tank | tee "$T/st0"
grep -q 'trim: trim completed on' "$T/st0" || fail "pool status does not show the completed trim"
grep -Eq '^zilla_trim_manual_bytes_total\{pool="tank"\} [1-9]' <(curl -sf "http://127.0.0.1:$HTTP_PORT/metrics") || fail "/metrics: no manual trim bytes"
check_data_head() {
    nbdcopy "$(nbd_unix_uri tank/v)" "$T/v.back"
    cmp -n $((8 << 20)) "$T/data" "$T/v.back" || fail "the untrimmed head of tank/v changed"
    rm -f "$T/v.back"
}
check_data_head

z pool set autotrim=on tank
z pool get autotrim tank | grep -Eq '^tank +autotrim +on +local$' || fail "pool get after set"
fill_and_trim
# (space freed while autotrim was off stays on the devices, as with zpool's autotrim)
[ $((full - after)) -gt $((freed_kib * 8 / 10)) ] || fail "autotrim on, but the leaves shrank only from $full to $after KiB"
z pool iostat -q -p tank | tee "$T/q"
curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$T/metrics" || fail "/metrics"
grep -Eq '^zilla_autotrim_bytes_total\{pool="tank"\} [1-9]' "$T/metrics" || fail "/metrics: no autotrim bytes"

check_data() {
    nbdcopy "$(nbd_unix_uri tank/keep)" "$T/keep.back"
    cmp "$T/keep" "$T/keep.back" || fail "tank/keep changed"
    nbdcopy "$(nbd_unix_uri tank/v)" "$T/v.back"
    cmp -n $((8 << 20)) "$T/data" "$T/v.back" || fail "the untrimmed head of tank/v changed"
    cmp -n $((152 << 20)) -i $((8 << 20)):0 "$T/v.back" /dev/zero || fail "the trimmed range of tank/v does not read as zeros"
    rm -f "$T/keep.back" "$T/v.back"
}
check_data
z pool scrub -w tank
z pool status -v tank | tee "$T/st"
grep -q 'errors: No known data errors' "$T/st" || fail "scrub found errors after autotrim"

stop_daemon
start_daemon
z pool get autotrim tank | grep -Eq '^tank +autotrim +on +local$' || fail "autotrim not kept across a restart"
check_data
log "PASS"
