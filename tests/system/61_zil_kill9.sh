#!/usr/bin/env bash
# Goal (issue 7): a write acknowledged by FLUSH or FUA lives in the intent log until its
# txg syncs, and survives kill -9 of the daemon through claim and replay at import.
# Method: a pool with a log device; zfs_txg_timeout raised to an hour so nothing syncs
# on its own; one qemu-io session over nbd:// writes slots of distinct patterns, each
# either followed by a FLUSH or written with FUA (`write -f`), and the test keeps the
# ledger of those acknowledged. The daemon is killed -9 while qemu-io is still
# connected (qemu-io's own flush at close never happens), restarted, and every slot of
# the ledger must read back. Then the same with zil_replay_disable=1 at restart: those
# writes must be missing, which shows they lived only in the log.
. "$(dirname "$0")/lib.sh"
start_daemon
for d in a0 a1 b0 b1 log; do truncate -s 256M "$T/disks/tank-$d"; done
z pool create tank mirror "$T/disks/tank-a0" "$T/disks/tank-a1" \
    mirror "$T/disks/tank-b0" "$T/disks/tank-b1" log "$T/disks/tank-log"
make_volume tank/zv 128M
uri=$(nbd_tcp_uri tank/zv)

SLOT=$((1 << 20))
# slot I: offset I MiB + (I * 4 KiB mod 256 KiB), length 4..64 KiB, pattern byte I+1
slot_off() { echo $(($1 * SLOT + ($1 * 4096) % (256 << 10))); }
slot_len() { echo $(((($1 * 7) % 16 + 1) * 4096)); }

# write_slots FIRST LAST: one qemu-io session writes the slots, even ones followed by a
# flush, odd ones with FUA; returns (session still open) once every write and flush is
# acknowledged, appending the slots to the ledger.
write_slots() {
    local first=$1 last=$2 i n=0
    rm -f "$T/qin" "$T/qout"
    mkfifo "$T/qin"
    qemu-io -f raw "$uri" <"$T/qin" >"$T/qout" 2>&1 &
    QEMU_PID=$!
    exec 3>"$T/qin"
    for ((i = first; i <= last; i++)); do
        if ((i % 2 == 0)); then
            printf 'write -P %d %d %d\nflush\n' $((i + 1)) "$(slot_off $i)" "$(slot_len $i)" >&3
        else
            printf 'write -f -P %d %d %d\n' $((i + 1)) "$(slot_off $i)" "$(slot_len $i)" >&3
        fi
        # a marker after each acknowledgement: qemu-io runs commands in order
        printf 'length\n' >&3
        n=$((n + 1))
        local k
        for ((k = 0; k < 300; k++)); do
            [ "$(grep -c '128 MiB$' "$T/qout" 2>/dev/null || true)" -ge "$n" ] && break
            sleep 0.1
        done
        [ "$(grep -c '128 MiB$' "$T/qout")" -ge "$n" ] || fail "slot $i not acknowledged: $(tail -n 5 "$T/qout")"
        grep -qi 'error\|failed' "$T/qout" && fail "qemu-io: $(cat "$T/qout")"
        echo "$i" >>"$T/ledger"
    done
}

end_session() {
    exec 3>&-
    wait "$QEMU_PID" 2>/dev/null || true
}

# check_slots FILE EXPECT: every slot listed reads back (EXPECT=present) or at least
# one does not (EXPECT=lost)
check_slots() {
    local file=$1 expect=$2 i bad=0 good=0
    while read -r i; do
        if qemu-io -f raw -c "read -P $((i + 1)) $(slot_off $i) $(slot_len $i)" "$uri" | grep -q 'Pattern verification failed'; then
            bad=$((bad + 1))
            [ "$expect" = present ] && echo "slot $i lost" >&2
        else
            good=$((good + 1))
        fi
    done <"$file"
    log "$good slots read back, $bad lost (expected: $expect)"
    if [ "$expect" = present ]; then [ $bad -eq 0 ]; else [ $bad -gt 0 ]; fi
}

# round 1: acknowledged writes survive kill -9 through replay
z tunable set zfs_txg_timeout=3600
: >"$T/ledger"
write_slots 0 39
kill9_daemon
end_session
start_daemon
check_slots "$T/ledger" present || fail "acknowledged writes lost after kill -9 and replay"
grep -q 'intent log replayed' "$T/daemon.log" || fail "the restart replayed no intent log"
cp "$T/ledger" "$T/ledger1"

# round 2: the same with replay disabled loses them (they were only in the log), while
# round 1's writes, synced by that replay, stay
z tunable set zfs_txg_timeout=3600
: >"$T/ledger"
write_slots 40 59
kill9_daemon
end_session
start_daemon --tunable zil_replay_disable=1
check_slots "$T/ledger" lost || fail "with zil_replay_disable=1 the writes survived: they were not only in the log"
check_slots "$T/ledger1" present || fail "round 1's replayed writes lost"
z pool status tank | grep -q 'state: ONLINE' || fail "pool not ONLINE"
stop_daemon
log "kill -9 after FLUSH/FUA with the intent log OK"
