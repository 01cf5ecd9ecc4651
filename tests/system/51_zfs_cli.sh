#!/usr/bin/env bash
# Goal: a ZFS administrator's scripting habits work, in zfs's exact output shapes:
# `zilla get` of several datasets and properties with -H (tab-separated, no header),
# -p (exact numbers), -o FIELD,..., -r and -s SOURCE; `zilla list` with its default
# columns NAME USED AVAIL REFER MOUNTPOINT, -H, -p, -o, -t, -s/-S; the read-only
# properties type, creation, name, compressratio, logicalreferenced (refused by set
# with zfs's message); a volume grows with `set volsize=` (its thick reservation
# follows; NBD clients see the new size; shrinking and odd sizes are refused); `zilla
# rename` (refused while a client is attached; the export follows the name; kept
# across a restart).
# Method: two volumes, one thick and one sparse, each output compared line by line.
. "$(dirname "$0")/lib.sh"
TOOL="$(dirname "$0")/../tools/nbd_abuse.py"
start_daemon
make_pool tank 256M
before=$(date +%s)
z volume create -V 32M tank/vm1 # thick: refreservation follows its size
make_volume tank/db 24M
after=$(date +%s)

# --- get: several datasets, several properties
z get sync,refreservation tank/vm1 tank/db | tee "$T/get"
[ "$(head -1 "$T/get" | tr -s ' ')" = "NAME PROPERTY VALUE SOURCE" ] || fail "get header: $(head -1 "$T/get")"
[ "$(awk 'NR > 1 { print $1 "/" $2 "/" $4 }' "$T/get" | tr '\n' ' ')" = \
    "tank/vm1/sync/default tank/vm1/refreservation/local tank/db/sync/default tank/db/refreservation/default " ] ||
    fail "get rows out of order or wrong: $(cat "$T/get")"
z get -H -p sync,refreservation tank/vm1 tank/db >"$T/getH"
cat -A "$T/getH"
refres=$(awk -F'\t' 'NR == 2 { print $3 }' "$T/getH")
[[ $refres =~ ^[0-9]+$ ]] && [ "$refres" -ge $((32 << 20)) ] || fail "thick refreservation not exact bytes >= 32M: $refres"
printf 'tank/vm1\tsync\tstandard\tdefault\ntank/vm1\trefreservation\t%s\tlocal\ntank/db\tsync\tstandard\tdefault\ntank/db\trefreservation\tnone\tdefault\n' "$refres" |
    cmp - "$T/getH" || fail "get -H -p is not the exact tab-separated rows"
[ "$(z get -H -o value volsize tank/vm1)" = 32M ] || fail "get -H -o value volsize"
[ "$(z get -Hp -o value volsize tank/vm1)" = $((32 << 20)) ] || fail "get -Hp -o value volsize"
[ "$(z get -H -o name,received,source sync tank/db)" = "$(printf 'tank/db\t-\tdefault')" ] || fail "get -o name,received,source"
z get -o property,value volsize tank/db | tee "$T/geto"
[ "$(head -1 "$T/geto" | tr -s ' ')" = "PROPERTY VALUE" ] || fail "get -o header"

# -s: only local properties; -r: the pool and its volumes
z set sync=always tank/db
[ "$(z get -H -o property -s local all tank/db | tr '\n' ' ')" = "volsize sync " ] || fail "get -s local all: $(z get -H -o property -s local all tank/db)"
z get -H -o property -s none all tank/db | grep -qx used || fail "get -s none lacks used"
! z get -H -o property -s default all tank/db | grep -qx sync || fail "get -s default shows the local sync"
[ "$(z get -H -o name -r type tank | tr '\n' ' ')" = "tank tank/db tank/vm1 " ] || fail "get -r: $(z get -H -o name -r type tank)"
[ "$(z get -H -o value -r type tank | tr '\n' ' ')" = "- volume volume " ] || fail "get -r type values"
expect_error "unknown property 'nosuch'" z get nosuch tank/vm1
expect_error "invalid source 'bogus'" z get -s bogus all tank/vm1

# --- the dataset statistics
[ "$(z get -H -o value type tank/vm1)" = volume ] || fail "type"
[ "$(z get -H -o value name tank/vm1)" = tank/vm1 ] || fail "name"
[ "$(z get -H -o value compressratio tank/vm1)" = 1.00x ] || fail "compressratio"
[ "$(z get -Hp -o value compressratio tank/vm1)" = 1.00 ] || fail "compressratio -p"
created=$(z get -Hp -o value creation tank/vm1)
[[ $created =~ ^[0-9]+$ ]] && [ "$created" -ge "$before" ] && [ "$created" -le "$after" ] || fail "creation -p $created not in [$before, $after]"
[ "$(z get -H -o value creation tank/vm1)" = "$(date -d "@$created" '+%a %b %e %k:%M %Y')" ] || fail "creation shape: $(z get -H -o value creation tank/vm1)"
z get -Hp -o property,value used,available,referenced,logicalreferenced,logicalused tank/vm1 | tee "$T/space"
[ "$(awk -F'\t' '$2 ~ /^[0-9]+$/' "$T/space" | wc -l)" -eq 5 ] || fail "space figures not exact numbers"
for p in type creation name compressratio used available referenced logicalreferenced; do
    expect_error "cannot set property for 'tank/vm1': '$p' is readonly" z set "$p=1" tank/vm1
done

# --- list
z list | tee "$T/list"
[ "$(head -1 "$T/list" | tr -s ' ')" = "NAME USED AVAIL REFER MOUNTPOINT" ] || fail "list header: $(head -1 "$T/list")"
[ "$(awk 'NR > 1 { print $1 "/" $5 }' "$T/list" | tr '\n' ' ')" = "tank/db/- tank/vm1/- " ] || fail "list rows: $(cat "$T/list")"
z list -H -p | tee "$T/listH"
awk -F'\t' 'NF != 5 || $2 !~ /^[0-9]+$/ || $3 !~ /^[0-9]+$/ || $4 !~ /^[0-9]+$/ || $5 != "-" { bad = 1 } END { exit bad }' "$T/listH" ||
    fail "list -H -p is not 5 tab-separated exact fields"
[ "$(z list -H -p -o name,type,volsize,volblocksize tank/vm1)" = "$(printf 'tank/vm1\tvolume\t%s\t16384' $((32 << 20)))" ] || fail "list -o"
[ "$(z list -H -o name -s volsize | tr '\n' ' ')" = "tank/db tank/vm1 " ] || fail "list -s volsize"
[ "$(z list -H -o name -S volsize | tr '\n' ' ')" = "tank/vm1 tank/db " ] || fail "list -S volsize"
[ "$(z list -H -o name -t volume tank | tr '\n' ' ')" = "tank/db tank/vm1 " ] || fail "list -t volume POOL"
[ "$(z list -H -o name -t all -r tank/db)" = tank/db ] || fail "list -t all -r VOLUME"
out=$(z list -t filesystem 2>"$T/err")
[ -z "$out" ] && [ "$(cat "$T/err")" = "no datasets available" ] || fail "list -t filesystem: '$out' / $(cat "$T/err")"
z list -o name,volsize,refreservation,compressratio,creation | tee "$T/listo"
[ "$(head -1 "$T/listo" | tr -s ' ')" = "NAME VOLSIZE REFRESERV RATIO CREATION" ] || fail "list -o headers"
expect_error "invalid property 'bogus'" z list -o name,bogus
expect_error "invalid type 'bogus'" z list -t bogus

# --- grow a volume; NBD clients see the new size
[ "$(nbdinfo --size "$(nbd_tcp_uri tank/vm1)")" = $((32 << 20)) ] || fail "nbdinfo size before the grow"
qemu-io -f raw -c "write -P 0x5a 0 1M" -c flush "$(nbd_unix_uri tank/vm1)" >/dev/null
z set volsize=64M tank/vm1
[ "$(nbdinfo --size "$(nbd_tcp_uri tank/vm1)")" = $((64 << 20)) ] || fail "nbdinfo size after the grow"
[ "$(z get -Hp -o value volsize tank/vm1)" = $((64 << 20)) ] || fail "volsize after the grow"
refres2=$(z get -Hp -o value refreservation tank/vm1)
[ "$refres2" -ge $((64 << 20)) ] && [ "$refres2" -gt "$refres" ] || fail "the thick reservation did not follow: $refres -> $refres2"
qemu-io -f raw -c "write -P 0xa5 $((60 << 20)) 1M" -c flush "$(nbd_unix_uri tank/vm1)" >/dev/null
qemu-io -f raw -c "read -P 0x5a 0 1M" -c "read -P 0xa5 $((60 << 20)) 1M" "$(nbd_unix_uri tank/vm1)" | grep -c '^read' | grep -qx 2 ||
    fail "data before and beyond the old end not read back"
expect_error "cannot set property for 'tank/vm1': cannot shrink a volume" z set volsize=32M tank/vm1
expect_error "multiple of volume block size" z set volsize=$(((64 << 20) + 512)) tank/vm1
expect_error "bad value 'lots' for property 'volsize'" z set volsize=lots tank/vm1
# a sparse volume stays sparse
z set volsize=32M tank/db
[ "$(z get -Hp -o value volsize,refreservation tank/db | tr '\n' ' ')" = "$((32 << 20)) none " ] || fail "sparse grow"
# a tree of 2 levels of 16K blocks holds at most 16M
make_volume tank/small 16M
expect_error "needs a taller block tree than this volume has: it can grow to at most 16.00M" z set volsize=32M tank/small
z volume destroy tank/small

# --- rename
python3 "$TOOL" idle 127.0.0.1 "$NBD_PORT" tank/vm1 1 >"$T/hold.out" 2>&1 &
HOLD=$!
on_exit "kill $HOLD 2>/dev/null"
for ((i = 0; i < 100; i++)); do grep -q ready "$T/hold.out" && break; sleep 0.1; done
grep -q ready "$T/hold.out" || fail "client did not connect"
expect_error "cannot rename 'tank/vm1': volume 'tank/vm1' is busy: 1 client is attached \(use -f" z rename tank/vm1 tank/vm2
kill "$HOLD"; wait "$HOLD" 2>/dev/null || true
expect_error "cannot rename 'tank/vm1': .*tank/db.* exists|already exists" z rename tank/vm1 tank/db
expect_error "cannot rename 'tank/vm1': volumes must stay within the same pool" z rename tank/vm1 other/vm2
z rename tank/vm1 tank/vm2
[ "$(z list -H -o name | tr '\n' ' ')" = "tank/db tank/vm2 " ] || fail "list after rename"
[ "$(nbdinfo --size "$(nbd_tcp_uri tank/vm2)")" = $((64 << 20)) ] || fail "the export did not follow the rename"
! nbdinfo --size "$(nbd_tcp_uri tank/vm1)" 2>/dev/null || fail "the old export name still serves"
qemu-io -f raw -c "read -P 0xa5 $((60 << 20)) 1M" "$(nbd_unix_uri tank/vm2)" | grep -q '^read' || fail "data lost by the rename"

# --- both changes survive a restart
stop_daemon
start_daemon
z get -H -p -o name,property,value volsize,type tank/vm2 tank/db | tee "$T/after"
printf 'tank/vm2\tvolsize\t%s\ntank/vm2\ttype\tvolume\ntank/db\tvolsize\t%s\ntank/db\ttype\tvolume\n' $((64 << 20)) $((32 << 20)) |
    cmp - "$T/after" || fail "sizes or names not kept across a restart"
[ "$(z get -Hp -o value creation tank/vm2)" = "$created" ] || fail "creation not kept across rename and restart"
stop_daemon
log "zfs-style CLI OK"
