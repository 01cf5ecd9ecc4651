#!/usr/bin/env bash
# Goal: the admin commands work end to end through the daemon, with zpool/zfs-shaped
# output. Method: create, status, list, export, import (listing and by name), data
# kept across export/import and a daemon restart, volume create/list/get/set/destroy,
# destroy.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 256M

z pool status tank | tee "$T/st"
grep -q '^  pool: tank$' "$T/st" || fail "status: no pool line"
grep -q '^ state: ONLINE$' "$T/st" || fail "status: not ONLINE"
grep -Eq '^\s+NAME\s+STATE\s+READ\s+WRITE\s+CKSUM$' "$T/st" || fail "status: no header"
grep -Eq '^\s+mirror-0\s+ONLINE\s+0\s+0\s+0$' "$T/st" || fail "status: no mirror-0"
grep -Eq '^\s+mirror-1\s+ONLINE' "$T/st" || fail "status: no mirror-1"
grep -q '^errors: No known data errors$' "$T/st" || fail "status: no errors line"
[ "$(z pool status -x)" = "all pools are healthy" ] || fail "status -x"

z pool list | tee "$T/list"
head -1 "$T/list" | grep -Eq '^NAME +SIZE +ALLOC +FREE +CKPOINT +EXPANDSZ +FRAG +CAP +DEDUP +HEALTH +ALTROOT$' || fail "list header"
z pool list -H -p -o name,size,health | tee "$T/listH"
IFS=$'\t' read -r n s h <"$T/listH"
[ "$n" = tank ] && [ "$h" = ONLINE ] || fail "list -H fields: $(cat "$T/listH")"
[[ $s =~ ^[0-9]+$ ]] && [ "$s" -gt $((400 << 20)) ] || fail "list -p size '$s'"
z pool iostat -v tank | tee "$T/io"
grep -q 'capacity' "$T/io" && grep -q mirror-1 "$T/io" || fail "iostat -v"
z pool iostat -l -q tank 1 2 >/dev/null || fail "iostat -l -q with interval"
z pool iostat -w tank >/dev/null || fail "iostat -w"

# Volumes and properties.
make_volume tank/v1 64M
make_volume tank/v2 32M -b 4K -o sync=always
z volume list | tee "$T/vols"
grep -Eq '^tank/v1 ' "$T/vols" && grep -Eq '^tank/v2 ' "$T/vols" || fail "volume list"
[ "$(z volume list -H -p | awk -F'\t' '$1=="tank/v1"{print $6}')" = $((64 << 20)) ] || fail "volume list -Hp volsize"
z get all tank/v1 | tee "$T/get"
head -1 "$T/get" | grep -Eq '^NAME +PROPERTY +VALUE +SOURCE$' || fail "get header"
[ "$(z get -H -p volsize tank/v1 | cut -f1-3)" = "$(printf 'tank/v1\tvolsize\t%s' $((64 << 20)))" ] || fail "get -Hp volsize"
[ "$(z get -H volsize tank/v1 | cut -f3)" = 64M ] || fail "get volsize nicenum"
[ "$(z get -H sync tank/v2 | cut -f3,4)" = "$(printf 'always\tlocal')" ] || fail "create -o sync=always"
[ "$(z get -H volblocksize tank/v2 | cut -f3)" = 4K ] || fail "volblocksize 4K"
z set logbias=throughput tank/v1
[ "$(z get -H logbias tank/v1 | cut -f3,4)" = "$(printf 'throughput\tlocal')" ] || fail "set logbias"
z get logbias tank/v1 | grep -q "^note:" && fail "logbias (in effect since the intent log) flagged as inert"
z set secondarycache=metadata tank/v1
z get secondarycache tank/v1 | grep -q "^note:" && fail "secondarycache (in effect since the L2ARC) flagged as inert"
z set wce=on tank/v1
z get wce tank/v1 | grep -q "^note:" && fail "wce (in effect since the iSCSI target) flagged as inert"
z get sync tank/v1 | grep -q "^note:" && fail "sync flagged as inert"
z set compression=lz4 tank/v1
[ "$(z get -H compression,logbias tank/v1 | wc -l)" = 2 ] || fail "get with a list"
z get -H all tank | grep -q $'^tank\thealth\tONLINE' || fail "pool properties"

# Data survives export/import.
head -c $((8 << 20)) /dev/urandom >"$T/data"
nbdcopy "$T/data" "$(nbd_unix_uri tank/v1)"
z volume destroy tank/v2
z volume list -H | grep -q '^tank/v2' && fail "v2 still listed after destroy"
z pool export tank
z pool list -H | grep -q '^tank' && fail "tank listed after export"
z pool import -d "$T/disks" | tee "$T/imp"
grep -q '   pool: tank' "$T/imp" || fail "import listing"
z pool import -d "$T/disks" tank
z pool status tank | grep -q 'state: ONLINE' || fail "imported pool not ONLINE"
nbdcopy "$(nbd_unix_uri tank/v1)" "$T/back"
cmp -n $((8 << 20)) "$T/data" "$T/back" || fail "data differs after export/import"
[ "$(z get -H logbias tank/v1 | cut -f3)" = throughput ] || fail "property lost across export/import"

# Scrub, device state changes, detach/attach.
z pool scrub -w tank
z pool status tank | grep -q 'scan: scrub repaired' || fail "no scrub result in status"
z pool offline tank "$T/disks/tank-b1"
z pool status tank | grep -q 'state: DEGRADED' || fail "offline did not degrade the pool"
z pool status -x | grep -q 'pool: tank' || fail "status -x does not show the degraded pool"
z pool online tank "$T/disks/tank-b1"
z pool clear tank
z pool detach tank "$T/disks/tank-b1"
z pool status tank | grep -q 'tank-b1' && fail "detached leaf still listed"
z pool attach tank "$T/disks/tank-b0" "$T/disks/tank-b1"
for i in $(seq 100); do z pool status -x | grep -q 'all pools are healthy' && break; sleep 0.2; done
z pool status tank | tee "$T/st2"
grep -q 'tank-b1' "$T/st2" || fail "attached leaf not listed"
grep -q 'state: ONLINE' "$T/st2" || fail "pool not ONLINE after attach"
grep -q '"tank-b1"\|tank-b1' "$STATE/zilla.cache" || fail "cache file not updated after attach"

# The daemon re-imports its pools after a restart (cache file).
stop_daemon
grep -q '"tank"' "$STATE/zilla.cache" || fail "cache file does not list tank"
start_daemon
z pool list -H -o name | grep -qx tank || fail "tank not re-imported at start"

z pool destroy tank
z pool list -H | grep -q . && fail "pools left after destroy"
expect_error 'no pools available to import' z pool import -d "$T/disks"
stop_daemon
log "pool lifecycle OK"
