#!/usr/bin/env bash
# Goal: SCSI persistent reservations fence a volume between initiators, and with APTPL
# the reservation survives kill -9 of the daemon and a pool export/import; without
# APTPL it does not outlive the daemon. The state is kept in the volume but never shown
# by `zilla get all` nor settable by `zilla set`.
# Method: a raw-socket initiator (iscsi_client.py) under two initiator names, A and B.
# A registers (APTPL=1) and reserves Write Exclusive; B's WRITE gets RESERVATION
# CONFLICT, its READ succeeds; kill -9 right after the PR OUT returned; after the
# restart (and an export/import) B still sees A's key and reservation and still
# conflicts; A releases and B writes. Then a registration without APTPL is gone after
# a restart. Last, libiscsi's reservation families and its multipath LUN reset (a unit
# attention on every path).
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
CLIENT="python3 $(dirname "$0")/iscsi_client.py 127.0.0.1:$ISCSI_PORT iqn.2026-11.io.zilla:tank.vol"
A="env ISCSI_INITIATOR=iqn.2026-11.io.zilla:host-a $CLIENT"
B="env ISCSI_INITIATOR=iqn.2026-11.io.zilla:host-b $CLIENT"
start_daemon
make_pool tank 256M
make_volume tank/vol 64M
head -c 64K /dev/urandom >"$T/data"

# B's WRITE conflicts with A's Write Exclusive reservation; reads stay open.
expect_conflict() {
    if $B write 0 "$T/data" 2>"$T/err"; then fail "B wrote through A's reservation ($1)"; fi
    grep -q "status 0x18" "$T/err" || fail "B's WRITE did not get RESERVATION CONFLICT ($1): $(cat "$T/err")"
    $B read 0 128 "$T/out" || fail "B cannot read under a Write Exclusive reservation ($1)"
    [ "$($B pr-keys)" = 000000000000000a ] || fail "B does not see A's key ($1): $($B pr-keys)"
    [ "$($B pr-reservation)" = "000000000000000a 1" ] || fail "no Write Exclusive reservation by A ($1): $($B pr-reservation)"
}

$A pr-register a 1
$A pr-reserve a 1
expect_conflict "before the restart"
kill9_daemon
start_daemon
expect_conflict "after kill -9"
z pool export tank
z pool import -d "$T/disks" tank
expect_conflict "after export/import"
log "a Write Exclusive reservation with APTPL survived kill -9 and export/import"

# The state is internal: not listed, not settable.
if z get all tank/vol | grep -q _iscsi_pr; then fail "get all shows the internal reservation property"; fi
if z set _iscsi_pr=x tank/vol 2>"$T/err"; then fail "set accepted the internal reservation property"; fi
grep -q "unknown property" "$T/err" || fail "set of the internal property: $(cat "$T/err")"
if z get _iscsi_pr tank/vol >/dev/null 2>&1; then fail "get shows the internal reservation property"; fi

$A pr-release a 1
[ "$($B pr-reservation)" = none ] || fail "the reservation is still there after A released it"
$B write 0 "$T/data" || fail "B cannot write once A released"
$B read 0 128 "$T/out"
cmp "$T/data" "$T/out" || fail "B's write does not read back"

# Without APTPL (the last REGISTER's bit) registrations live in memory only.
$A pr-register b 0
[ "$($B pr-keys)" = 000000000000000b ] || fail "the re-registration is not listed"
kill9_daemon
start_daemon
[ -z "$($B pr-keys)" ] || fail "registrations without APTPL survived a restart: $($B pr-keys)"

# libiscsi's conformance families for reservations, with two initiators (the URL twice:
# a second session under its second initiator name). A family whose command is not
# implemented "passes" as skipped: that counts as a failure here.
LUN=iscsi://127.0.0.1:$ISCSI_PORT/iqn.2026-11.io.zilla:tank.vol/0
for family in SCSI.PrinReadKeys SCSI.PrinServiceactionRange SCSI.PrinReportCapabilities SCSI.ProutRegister \
    SCSI.ProutReserve SCSI.ProutClear SCSI.ProutPreempt SCSI.Reserve6 ALL.MultipathIO.Reset; do
    if ! timeout 120 iscsi-test-cu --dataloss -t "$family" "$LUN" "$LUN" >"$T/cu" 2>&1; then
        grep -E "FAILED|tests " "$T/cu" | head -20
        fail "iscsi-test-cu $family failed"
    fi
    if grep "SKIPPED" "$T/cu" | grep -v "ColdReset" | grep -q .; then
        grep SKIPPED "$T/cu"
        fail "iscsi-test-cu $family skipped tests"
    fi
    grep -qE "^ *tests +[0-9]+ +[0-9]+ +[0-9]+ +0 " "$T/cu" || fail "iscsi-test-cu $family: $(grep 'tests ' "$T/cu")"
    log "iscsi-test-cu $family: $(awk '/^ *tests /{print $4 " of " $2 " passed"}' "$T/cu")"
done
echo PASS
