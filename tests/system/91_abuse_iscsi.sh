#!/usr/bin/env bash
# Goal: unfriendly iSCSI clients (garbage bytes, a login stuffed with unknown keys, a
# WRITE whose Data-Out stops halfway before the client vanishes, a flood of immediate
# commands whose replies are never read, commands outside the CmdSN window, more
# silent connections from one address than the connection cap) get a
# clear refusal or a closed connection; none harms another session, writes part of an
# unfinished WRITE, or keeps front-end memory after it is gone.
# Method: a well-behaved initiator writes and verifies 256 KiB rounds in the background
# the whole time (each round's data is its ledger); each abuser runs from
# iscsi_abuse.py; afterwards the half-written range still holds what was there before,
# the front-end memory in use returns to zero, and the daemon serves a new session.
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
TARGET=iqn.2026-11.io.zilla:tank.vol
CLIENT="python3 $(dirname "$0")/iscsi_client.py 127.0.0.1:$ISCSI_PORT $TARGET"
ABUSE="env ISCSI_INITIATOR=iqn.2026-11.io.zilla:abuser python3 $(dirname "$0")/iscsi_abuse.py 127.0.0.1:$ISCSI_PORT $TARGET"
start_daemon
make_pool tank 256M
make_volume tank/vol 64M

# what the half-written WRITE would overwrite
head -c 1M /dev/urandom >"$T/before"
$CLIENT write 4096 "$T/before"

# the well-behaved session: write, read back, compare, until told to stop
good() {
    local n=0
    while [ ! -e "$T/stop" ]; do
        head -c 256K /dev/urandom >"$T/good-$n"
        $CLIENT write 65536 "$T/good-$n" || { echo "good session: write $n failed" >"$T/good-failed"; return; }
        $CLIENT read 65536 512 "$T/good-back" || { echo "good session: read $n failed" >"$T/good-failed"; return; }
        cmp -s "$T/good-$n" "$T/good-back" || { echo "good session: round $n read back other data" >"$T/good-failed"; return; }
        rm -f "$T/good-$n"
        n=$((n + 1))
    done
    echo "$n" >"$T/good-rounds"
}
good &
GOOD_PID=$!

$ABUSE garbage | tee -a "$T/abuse"
$ABUSE keys | tee -a "$T/abuse"
$ABUSE half-write 4096 | tee -a "$T/abuse"
$ABUSE flood | tee -a "$T/abuse"
$ABUSE window | tee -a "$T/abuse"
# more silent connections from one address than the target's connection cap (1,024):
# the target keeps at most 16 of them in the login phase, so a login from another
# address still gets in
$ABUSE login-flood 1100 | tee -a "$T/abuse"
# session reinstatement: the same initiator name and ISID log in again (RFC 7143 §6.3.5)
env ISCSI_INITIATOR=iqn.2026-11.io.zilla:reinstated python3 "$(dirname "$0")/iscsi_abuse.py" \
    "127.0.0.1:$ISCSI_PORT" "$TARGET" reinstate | tee -a "$T/abuse"
kept=$(sed -n 's/^login-flood: [0-9]* connections made, \([0-9]*\) kept.*/\1/p' "$T/abuse")
[ "${kept:-9999}" -le 16 ] || fail "the target kept $kept silent connections of one address in the login phase"
sleep 1
touch "$T/stop"
wait "$GOOD_PID"
[ ! -e "$T/good-failed" ] || fail "$(cat "$T/good-failed")"
rounds=$(cat "$T/good-rounds")
[ "$rounds" -ge 1 ] || fail "the well-behaved session made no round"
log "well-behaved session: $rounds write/verify rounds while the abusers ran"

# nothing of the unfinished WRITE reached the volume
$CLIENT read 4096 2048 "$T/after"
cmp "$T/before" "$T/after" || fail "part of a WRITE whose Data-Out never finished was written"

# the abusers' budget is back (their connections are gone)
in_use=-1
for _ in $(seq 100); do
    in_use=$(curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" | awk '$1 == "zilla_frontend_memory_in_use_bytes" { print $2 }')
    [ "$in_use" = 0 ] && break
    sleep 0.2
done
[ "$in_use" = 0 ] || fail "front-end memory still in use after every client left: $in_use bytes"
grep -q "login refused: more unknown keys" "$T/daemon.log" || fail "the key-stuffed login left no log line"

# and a new session works
iscsi-inq "iscsi://127.0.0.1:$ISCSI_PORT/$TARGET/0" >/dev/null || fail "no new session after the abuse"
stop_daemon
log "iSCSI abuse OK"
