#!/usr/bin/env bash
# Goal: an iSCSI initiator cannot end another's session, change its name after the
# initiator list checked it, or make the target hold budget for a WRITE it stops
# feeding; malformed login keys and PDUs get a clear refusal and the session goes on.
# Method: tank/a has CHAP and an initiator list, tank/b is open (loopback) with a list;
# iscsi_abuse.py (a raw-socket initiator) runs each case:
# - a CHAP session to tank/a survives logins with its initiator name and ISID to
#   tank/b, to tank/a with a wrong secret, and to tank/a while its name is off the
#   list; a right login to tank/a then reinstates it;
# - InitiatorName, SessionType or TargetName changed in the operational stage is
#   refused (initiator error), the same identity repeated is taken;
# - MaxRecvDataSegmentLength out of range or not a number, FirstBurstLength above
#   MaxBurstLength: refused; a negotiated key out of range: answered Reject;
# - a Data-Out for no command: Reject (invalid PDU field), the session goes on;
# - a WRITE(10) with R and W: CHECK CONDITION, INVALID FIELD IN CDB, nothing written;
# - a WRITE whose Data-Out stops while the connection stays: closed after
#   iscsi_data_out_timeout_s (2 s here), its budget returned, nothing written; two
#   WRITEs with R2Ts out, the first fed one PDU every 0.6 s and the second after it:
#   not cut (the connection progresses);
# - an ISID changed between the login's requests: refused.
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
printf 'iscsi_data_out_timeout_s = 2\n' >"$T/zilla.conf"
start_daemon --config "$T/zilla.conf"
make_pool tank 128M
make_volume tank/a 16M
make_volume tank/b 16M
A=iqn.2026-11.io.zilla:tank.a
B=iqn.2026-11.io.zilla:tank.b
GOOD=iqn.2026-11.org.good:h1
EVIL=iqn.2026-11.org.evil:h9
SECRET=Chap-Secret-0123
printf '%s\n' "$SECRET" >"$T/secret"
z iscsi auth tank/a --user alice --secret-file "$T/secret" --initiator "$GOOD" >/dev/null
z iscsi auth tank/b --initiator "$GOOD" >/dev/null
ABUSE="env ISCSI_INITIATOR=$GOOD python3 $(dirname "$0")/iscsi_abuse.py 127.0.0.1:$ISCSI_PORT"
CLIENT="env ISCSI_INITIATOR=$GOOD python3 $(dirname "$0")/iscsi_client.py 127.0.0.1:$ISCSI_PORT $B"

# session identity is initiator name + ISID + target; only a login that passed the
# target's checks reinstates
deny="'$ZILLA' --state-dir '$STATE' iscsi auth tank/a --initiator iqn.2026-11.org.good:other"
allow="'$ZILLA' --state-dir '$STATE' iscsi auth tank/a --initiator $GOOD"
$ABUSE "$A" reinstate-targets "$B" alice "$SECRET" "$deny" "$allow"

# the initiator list checks the name the session runs as
$ABUSE "$B" redeclare "$EVIL"
z iscsi list -H sessions >"$T/sessions"
if grep -q "$EVIL" "$T/sessions"; then fail "a session runs as $EVIL: $(cat "$T/sessions")"; fi
grep -q "declared twice in one login" "$T/daemon.log" || fail "the refused login left no log line saying why"

$ABUSE "$B" numeric
$ABUSE "$B" stray-data-out

head -c 512 /dev/urandom >"$T/block"
$CLIENT write 100 "$T/block"
$ABUSE "$B" bidi 100
$CLIENT read 100 1 "$T/block-back"
cmp -s "$T/block" "$T/block-back" || fail "the block a refused bidirectional WRITE named changed"

head -c 1M /dev/urandom >"$T/before"
$CLIENT write 4096 "$T/before"
$ABUSE "$B" stall 4096 2
grep -q "no Data-Out within the data-out timeout; closing the connection" "$T/daemon.log" ||
    fail "the stalled WRITE's connection closed without a log line"
in_use=-1
for _ in $(seq 50); do
    in_use=$(curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" | awk '$1 == "zilla_frontend_memory_in_use_bytes" { print $2 }')
    [ "$in_use" = 0 ] && break
    sleep 0.2
done
[ "$in_use" = 0 ] || fail "front-end memory still in use after the stalled WRITE's connection closed: $in_use bytes"
$CLIENT read 4096 2048 "$T/after"
cmp -s "$T/before" "$T/after" || fail "part of a WRITE whose Data-Out stopped was written"

ATTACK="python3 $(dirname "$0")/iscsi_attack.py 127.0.0.1:$ISCSI_PORT"
$ATTACK starve "$A" "$B" "$GOOD" alice "$SECRET" 2 || fail "a WRITE queued behind one being fed was cut"
$ATTACK isid-change "$A" "$B" "$GOOD" alice "$SECRET" || fail "an ISID changed mid-login was taken"

# and a well-behaved initiator still gets in
iscsi-inq -i "$GOOD" "iscsi://127.0.0.1:$ISCSI_PORT/$B/0" >/dev/null || fail "no new session after the abuse"
stop_daemon
log "iSCSI login and data-phase abuse OK"
