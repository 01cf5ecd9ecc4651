#!/usr/bin/env bash
# Goal: import says what is wrong and what the way out costs. A pool whose log file
# was truncated after a kill -9 (its intent log held acknowledged synchronous writes):
# the start reports it UNAVAIL with a reason that says the log file has no valid label
# (not that it does not exist) and does not claim a loss window from today's
# zfs_txg_timeout; the import listing marks the log device missing and names -m; the
# import without -m refuses the same way; -m imports; the listing then no longer
# offers the imported pool. A mirror with one child missing is listed as importable,
# DEGRADED, naming the missing device, and imports; with a copy of its other child
# beside it, the listing and the import name both devices claiming to be one and the
# import refuses.
. "$(dirname "$0")/lib.sh"
start_daemon
for d in a0 a1 log0; do truncate -s 256M "$T/disks/$d"; done
z pool create tank mirror "$T/disks/a0" "$T/disks/a1" log "$T/disks/log0"
make_volume tank/v 32M -o sync=always
head -c $((2 << 20)) /dev/urandom | nbdcopy - "$(nbd_unix_uri tank/v)"
kill9_daemon
truncate -s 0 "$T/disks/log0"
truncate -s 256M "$T/disks/log0"

start_daemon
z pool status tank >"$T/st"
cat "$T/st"
grep -q 'state: UNAVAIL' "$T/st" || fail "tank not UNAVAIL at start"
grep -q 'log0 (has no valid label)' "$T/st" || fail "the reason does not say the log file has no valid label"
grep -q 'does not exist' "$T/st" && fail "the reason says 'does not exist' of a file that exists"
grep -q 'up to [0-9]* s of synchronous writes' "$T/st" && fail "the reason claims a loss window from zfs_txg_timeout"
grep -q 'acknowledged after txg [0-9]*' "$T/st" || fail "the reason does not say from which txg writes may be lost"
z pool export tank

z pool import -d "$T/disks" >"$T/listing"
cat "$T/listing"
grep -q 'log0  log device has no valid label' "$T/listing" || fail "the listing does not show the log device without a label"
grep -q 'log0 (has no valid label) cannot be used' "$T/listing" || fail "the listing's status does not say the log file has no valid label"
grep -q 'missing from the system' "$T/listing" && fail "the listing calls a file that exists missing from the system"
grep -q "zilla pool import -m" "$T/listing" || fail "the listing does not mention -m"

z pool import -d "$T/disks" tank >"$T/out" 2>&1 && fail "imported without its log and without -m"
cat "$T/out"
grep -q 'has no valid label' "$T/out" || fail "the refusal does not say the log file has no valid label"
grep -q 'does not exist' "$T/out" && fail "the refusal says 'does not exist'"
grep -q 'import with -m' "$T/out" || fail "the refusal does not name -m"

z pool import -d "$T/disks" -m tank
z pool status tank | grep -q 'state: ' || fail "no status after import -m"
if z pool import -d "$T/disks" >"$T/listing2" 2>&1; then
    grep -q 'pool: tank' "$T/listing2" && fail "the listing offers the pool this daemon has imported"
fi

# A mirror with one child missing imports DEGRADED: the listing says it can be imported,
# DEGRADED, and names the missing device.
mkdir "$T/mir"
truncate -s 128M "$T/mir/m0" "$T/mir/m1"
z pool create mir mirror "$T/mir/m0" "$T/mir/m1"
z pool export mir
mv "$T/mir/m1" "$T/m1.away"
z pool import -d "$T/mir" >"$T/listing3"
cat "$T/listing3"
grep -q '^  state: DEGRADED$' "$T/listing3" || fail "the listing does not say the pool would be DEGRADED"
grep -q 'cannot be imported' "$T/listing3" && fail "the listing says a mirror with one child left cannot be imported"
grep -q 'The pool can be imported' "$T/listing3" || fail "the listing does not say the pool can be imported"
grep -q "missing from the system: $T/mir/m1\." "$T/listing3" || fail "the listing does not name the missing device in its status"
grep -q "$T/mir/m1  device missing" "$T/listing3" || fail "the listing does not mark the missing device"
# Two devices claiming to be the same child (a copy of m0 beside it): the listing and
# the import say so, naming both and the guid; import refuses.
cp --sparse=always "$T/mir/m0" "$T/mir/m0-copy"
z pool import -d "$T/mir" >"$T/listing4"
cat "$T/listing4"
grep -q '^  state: UNAVAIL$' "$T/listing4" || fail "the listing offers a pool two of whose devices claim to be the same one"
grep -q "The devices $T/mir/m0 and $T/mir/m0-copy claim to be the same device (guid [0-9]*)" "$T/listing4" || fail "the listing does not name both devices and the guid"
expect_error "the devices $T/mir/m0 and $T/mir/m0-copy both claim to be its device with guid [0-9]+ \(a copied disk" z pool import -d "$T/mir" mir
rm "$T/mir/m0-copy"
z pool import -d "$T/mir" mir
z pool status mir | grep -q '^ state: DEGRADED$' || fail "mir not DEGRADED after the import"
stop_daemon
log "import messages OK"
