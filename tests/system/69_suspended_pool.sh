#!/usr/bin/env bash
# Goal: a pool whose devices fail every fsync (SUSPENDED) stays manageable: every admin
# command answers within seconds, `clear` says the devices still fail (and the pool stays
# SUSPENDED) or resumes it once they work again (writers held meanwhile go on), and
# `export -f` exports it without the final sync; after the devices heal, `import` brings
# it back without a daemon restart and every write a FLUSH or FUA acknowledged is there.
# Method: a mirror of two files in zilla-lazyfs (a FUSE file system that fails the fsyncs
# of a file on command); a ledger client (tests/tools/ledger_client.py) writes over NBD
# with FLUSH and FUA and records what was acknowledged, outside the mount. Round 1: both
# children fail every fsync, the pool suspends, `clear` must answer in seconds and fail,
# the devices heal, `clear` must resume the pool and the held writer must go on. Round 2:
# both fail again; a plain `export` is refused and says `-f`; `export -f` must export; the
# devices heal; `import` and the ledger's verify: nothing acknowledged is missing.
# Round 3: `destroy -f` of a suspended pool takes it out of the daemon but fails, saying
# its labels could not be cleared (an import still finds it); healed, it imports.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lazyfs.sh"
on_exit '[ -z "${WPID:-}" ] || kill $WPID'

# zt SECONDS CMD...: an admin command that must answer within SECONDS (any exit status);
# its status is in $ZRC, its output in $T/out (stdout and stderr).
zt() {
    local s=$1; shift
    local start took
    start=$(date +%s.%N)
    ZRC=0
    timeout "$s" "$ZILLA" --state-dir "$STATE" "$@" >"$T/out" 2>&1 || ZRC=$?
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    [ "$ZRC" -ne 124 ] || fail "'zilla $*' did not answer within $s s"
    log "zilla $* -> exit $ZRC in $took s: $(head -c 300 "$T/out" | tr '\n' ' ')"
}
state_is() { zt 5 pool status tank; [ "$ZRC" -eq 0 ] && grep -q "^ state: $1\$" "$T/out"; }
wait_state() { # STATE SECONDS
    for ((i = 0; i < $2 * 2; i++)); do state_is "$1" >/dev/null && return 0; sleep 0.5; done
    cat "$T/out"
    fail "pool did not become $1 within $2 s"
}
start_writer() { # SECONDS
    : >"$T/writer.log"
    "${CLIENT[@]}" write "$LEDGER" "$STATE/nbd.sock" tank/vol "$1" >"$T/writer.log" 2>&1 &
    WPID=$!
    wait_acks 100
}
fail_fsyncs() {
    ctl "fail-fsync /d0 1000000000"
    ctl "fail-fsync /d1 1000000000"
    wait_state SUSPENDED 30
}
every_command_answers() {
    local c
    for c in "pool status tank" "pool status -v tank" "pool list" "pool iostat -v tank" "pool get all tank" \
        "get all tank/vol" "volume list" "txgs tank"; do
        # shellcheck disable=SC2086
        zt 5 $c
        [ "$ZRC" -eq 0 ] || fail "'zilla $c' failed on a suspended pool: $(cat "$T/out")"
    done
    zt 10 set compression=lz4 tank/vol
    [ "$ZRC" -ne 0 ] || fail "set on a suspended pool said it was done"
    zt 10 pool scrub tank
}

start_daemon
truncate -s 256M "$M/d0" "$M/d1"
z pool create tank mirror "$M/d0" "$M/d1"
make_volume tank/vol 64M
"${CLIENT[@]}" init "$LEDGER" 4096 "$RANDOM"

# Round 1: clear while the devices fail, then after they heal.
start_writer 25
fail_fsyncs
log "both children fail every fsync: pool SUSPENDED"
zt 15 pool clear tank
[ "$ZRC" -ne 0 ] || fail "clear said the pool was cleared while its devices fail every fsync"
grep -qi "suspended" "$T/out" || fail "clear's error does not say the pool is still suspended: $(cat "$T/out")"
state_is SUSPENDED || fail "pool not SUSPENDED after a failed clear"
every_command_answers
ctl clear
zt 15 pool clear tank
[ "$ZRC" -eq 0 ] || fail "clear failed after the devices healed: $(cat "$T/out")"
wait_state ONLINE 15
log "devices healed, pool cleared: ONLINE"
wait "$WPID" || fail "writer held while suspended failed after the pool resumed: $(cat "$T/writer.log")"
WPID=
grep -q '^writer stopped' "$T/writer.log" && fail "writer lost its connection in round 1: $(cat "$T/writer.log")"
"${CLIENT[@]}" verify "$LEDGER" "$STATE/nbd.sock" tank/vol || fail "round 1: acknowledged writes lost after clear"

# Round 2: export -f of a suspended pool, heal, import.
start_writer 120
fail_fsyncs
log "both children fail every fsync again: pool SUSPENDED"
zt 10 pool export tank
[ "$ZRC" -ne 0 ] || fail "a plain export of a suspended pool said it was done"
grep -q -- "-f" "$T/out" && grep -qi "suspended" "$T/out" || fail "export's error does not point to -f: $(cat "$T/out")"
state_is SUSPENDED || fail "pool not SUSPENDED (and imported) after the refused export"
zt 30 pool export -f tank
[ "$ZRC" -eq 0 ] || fail "export -f of a suspended pool failed: $(cat "$T/out")"
wait "$WPID" || true # disconnected by export -f
WPID=
log "writer: $(tail -n 1 "$T/writer.log")"
zt 5 pool list -H
grep -q '^tank' "$T/out" && fail "tank still listed after export -f"
ctl clear
zt 30 pool import -d "$M" tank
[ "$ZRC" -eq 0 ] || fail "import after export -f and heal failed: $(cat "$T/out")"
wait_state ONLINE 15
"${CLIENT[@]}" verify "$LEDGER" "$STATE/nbd.sock" tank/vol || fail "round 2: acknowledged writes lost after export -f and import"

# Round 3: destroy -f of a suspended pool: gone from the daemon, but its labels could
# not be cleared, and the admin is told so (an import still finds it).
start_writer 60
fail_fsyncs
zt 30 pool destroy -f tank
[ "$ZRC" -ne 0 ] || fail "destroy -f of a suspended pool said it was done though no label could be cleared"
grep -q "removed from this daemon, but the labels on $M/d0 .*could not be cleared" "$T/out" || fail "destroy's error does not say the labels stay: $(cat "$T/out")"
grep -q "pool import" "$T/out" || fail "destroy's error does not say an import still finds the pool: $(cat "$T/out")"
wait "$WPID" || true # disconnected by destroy -f
WPID=
zt 5 pool list -H
grep -q '^tank' "$T/out" && fail "tank still listed after destroy -f"
ctl clear
zt 30 pool import -d "$M"
grep -q "pool: tank" "$T/out" || fail "the labels the destroy could not clear are gone: $(cat "$T/out")"
zt 30 pool import -d "$M" tank
zt 30 pool destroy tank
[ "$ZRC" -eq 0 ] || fail "destroy of the healed pool failed: $(cat "$T/out")"
stop_daemon
log "suspended pool: clear, export -f, heal and import, destroy -f all answered; nothing acknowledged lost"
