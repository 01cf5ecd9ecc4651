#!/usr/bin/env bash
# Goal: no write the daemon acknowledged (FUA, or followed by an acknowledged FLUSH) is
# lost in a power cut, with the cut made through the real system calls: the daemon's
# mirror pool lives on two files in zilla-lazyfs, a FUSE file system that keeps every
# write in its own cache until the file is fsynced/fdatasynced and then, on command,
# drops all unsynced data ("drop") or keeps a seeded random subset with one page torn
# ("tear"). Method: a ledger client (tests/tools/ledger_client.py) writes over NBD and
# records in a ledger outside the mount what was acknowledged; the daemon is killed -9
# mid-write; the unsynced data is dropped or torn; the daemon restarts (imports) and
# every acknowledged write must read back byte for byte. Then a failed fdatasync (EIO,
# the file's dirty pages dropped, as Linux does) is injected on one child mid-write
# before the cut. Last, a self-check: with both children's fsyncs ignored (a lying
# device, the same as a daemon whose fdatasync is a no-op) the ledger MUST see losses,
# which proves the harness can fail.
#
# ZILLA_FUSE_ROUNDS (default 5) sets the number of drop rounds and of tear rounds.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lazyfs.sh"
ROUNDS=${ZILLA_FUSE_ROUNDS:-5}

# After kill -9, requests the dead daemon had queued (io_uring workers) may still
# arrive; the cut happens once the write counter has been still for 0.5 s.
wait_writes_quiet() {
    local before after i
    for ((i = 0; i < 50; i++)); do
        before=$(stat_of writes); sleep 0.5; after=$(stat_of writes)
        [ "$before" = "$after" ] && return 0
    done
    fail "writes still reaching lazyfs 25 s after kill -9"
}

# Dead = gone or a zombie (the shell has not reaped it yet; kill -0 still succeeds).
daemon_dead() {
    local state
    state=$(awk '{ print $3 }' "/proc/$DAEMON_PID/stat" 2>/dev/null) || return 0
    [ -z "$state" ] || [ "$state" = Z ] || [ "$state" = X ]
}

# cut NAME CUT-COMMAND: write, kill the daemon mid-I/O, cut, restart.
# The daemon writes to its devices only in a txg sync, which ends in fdatasync of
# each child; lazyfs itself sends the SIGKILL just before the Nth device write
# (mid-sync, unsynced pages pending) or the Nth device sync (e.g. after d0's sync,
# before d1's). Set INJECT to a lazyfs command to run 1.5 s before the cut.
cut() {
    local name=$1 cut_cmd=$2 wpid durable plan i
    : >"$T/writer.log"
    "${CLIENT[@]}" write "$LEDGER" "$STATE/nbd.sock" tank/vol 120 >"$T/writer.log" 2>&1 &
    wpid=$!
    wait_acks 100
    if [ -n "${INJECT:-}" ]; then
        local failed_before
        failed_before=$(stat_of syncs_failed)
        ctl "$INJECT"
        for ((i = 0; i < 100; i++)); do
            [ "$(stat_of syncs_failed)" -gt "$failed_before" ] && break; sleep 0.1
        done
        [ "$(stat_of syncs_failed)" -gt "$failed_before" ] || fail "$name: injected fdatasync failure never hit"
        log "$name: fdatasync EIO delivered; writing on for 1.5 s"
        sleep 1.5
    fi
    # The two plans alternate (a random pick made all five drop rounds kill-after-writes
    # one run in 32). Most device writes are O_DSYNC intent-log writes, so a kill
    # before a write often leaves nothing unsynced; a kill at a sync always does.
    CUTS=$((CUTS + 1))
    if ((CUTS % 2 == 0)); then plan="kill-after-writes $DAEMON_PID $((1 + RANDOM % 200))"
    else plan="kill-at-sync $DAEMON_PID $((1 + RANDOM % 3))"; fi
    ctl "$plan"
    for ((i = 0; i < 150; i++)); do daemon_dead && break; sleep 0.1; done
    daemon_dead || { log "$name: planned cut ($plan) did not come in 15 s; kill -9 from here"; ctl clear; }
    kill -9 "$DAEMON_PID" 2>/dev/null || true # reaped already if lazyfs killed it
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=
    wait "$wpid" || fail "$name: ledger writer failed: $(cat "$T/writer.log")"
    durable=$(sed -n 's/^durable writes this run: \([0-9]*\).*/\1/p' "$T/writer.log")
    [ "${durable:-0}" -gt 0 ] || fail "$name: no write was acknowledged before the cut: $(cat "$T/writer.log")"
    wait_writes_quiet
    ctl "$cut_cmd"
    log "$name: $durable writes acknowledged, $plan, then $(grep '^last' "$M/.lazyfs-ctl")"
    start_daemon
}

verify() {
    "${CLIENT[@]}" verify "$LEDGER" "$STATE/nbd.sock" tank/vol && return 0
    echo "--- lazyfs log (last 5 lines)"; tail -n 5 "$T/lazyfs.log"
    [ -z "${ZILLA_FUSE_KEEP:-}" ] || cp "$T/daemon.log" "$T/lazyfs.log" "$LEDGER" "$ZILLA_FUSE_KEEP/"
    return 1
}

start_daemon
truncate -s 256M "$M/d0" "$M/d1"
z pool create tank mirror "$M/d0" "$M/d1"
make_volume tank/vol 64M
"${CLIENT[@]}" init "$LEDGER" 4096 "$RANDOM"

lost_total=0
CUTS=0
for ((r = 1; r <= ROUNDS; r++)); do
    cut "drop round $r" drop
    verify || fail "drop round $r: acknowledged writes lost after kill -9 + drop of unsynced data"
    lost_total=$((lost_total + $(grep '^last' "$M/.lazyfs-ctl" | grep -o 'lost [0-9]*' | awk '{print $2}')))
done
((lost_total > 0)) || fail "the drops never removed an unsynced page: the cut tested nothing"
for ((r = 1; r <= ROUNDS; r++)); do
    seed=$RANDOM$RANDOM
    cut "tear round $r" "tear $seed"
    verify || fail "tear round $r (seed $seed): acknowledged writes lost after kill -9 + torn unsynced data"
done

# A failed fdatasync on one child mid-run (EIO, its dirty pages dropped, as Linux does).
INJECT="fail-fsync /d0 1" cut "fdatasync EIO round" drop
verify || fail "fdatasync EIO round: acknowledged writes lost after a failed fdatasync on d0 + cut"
z pool status tank >"$T/status"
log "after the fdatasync EIO round: $(grep -E '^\s+\S+/d[01] ' "$T/status" | awk '{ print $1, $2, $3, $4, $5 }' | tr '\n' ';')"
z pool status tank | grep -q 'state: ONLINE' || fail "pool not ONLINE after the cuts"

# The double-eio case: d1 refuses its next writes, then one fdatasync of d0 fails (its dirty
# pages dropped). A FLUSH must not be acknowledged for a txg that no child holds (before
# the mirror flush/DTL fix this lost acknowledged writes in 4 of 4 runs).
INJECT=$'fail-write /d1 3\nfail-fsync /d0 1' cut "row-1 round" $'clear\ndrop'
verify || fail "row-1 round: acknowledged writes lost (d1 refusing writes, one fdatasync EIO on d0, cut)"
z pool status tank >"$T/status"
log "after the row-1 round: $(grep -E '^\s+(state|\S+/d[01] )' "$T/status" | tr -s ' \t' ' ' | tr '\n' ';')"

# Self-check: both children ignore fsync (a daemon whose fdatasync is a no-op looks the
# same from here). The ledger must report lost acknowledged writes.
ctl "lie-fsync /d0"
ctl "lie-fsync /d1"
cut "self-check (lying fsync)" drop
ctl clear
if verify >"$T/selfcheck.log" 2>&1; then
    cat "$T/selfcheck.log"
    fail "self-check: with every fsync ignored the ledger still saw all writes: the harness cannot fail"
fi
grep -q 'LOST ACKNOWLEDGED WRITES' "$T/selfcheck.log" || { cat "$T/selfcheck.log"; fail "self-check: verify failed for another reason"; }
log "self-check: lying fsync detected: $(head -n 2 "$T/selfcheck.log" | tr '\n' ' ')"
stop_daemon
log "power loss through FUSE OK: $ROUNDS drop + $ROUNDS tear rounds, $lost_total unsynced pages dropped"
