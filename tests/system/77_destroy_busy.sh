#!/usr/bin/env bash
# Goal (issue 15, "destroy refuses while clients are attached, unless -f"): `zilla
# volume destroy`, `zilla pool destroy` and `zilla pool export` refuse while NBD clients
# are attached to the volume's / pool's exports (as zpool export refuses while a zvol is
# open), with an error that says how many; `-f` disconnects
# them first and then destroys; clients of other volumes are not touched.
# Method: idle NBD clients (tests/tools/nbd_abuse.py idle: handshake done, then
# silent) hold 2 sessions on tank/a and 1 on tank/b; the plain destroys must fail and
# change nothing; `volume destroy -f tank/a` must leave exactly tank/b's client (the
# pool destroy error then counts 1); a volume without clients is destroyed without -f;
# with two more clients that never read their replies, `pool destroy -f` ends with no
# pool.
. "$(dirname "$0")/lib.sh"
TOOL="$(dirname "$0")/../tools/nbd_abuse.py"
start_daemon
make_pool tank 256M
make_volume tank/a 64M
make_volume tank/b 64M
make_volume tank/c 64M

hold() { # EXPORT N: N idle sessions on EXPORT, kept until the test ends
    python3 "$TOOL" idle 127.0.0.1 "$NBD_PORT" "$1" "$2" >"$T/hold-${1//\//_}.out" 2>&1 &
    on_exit "kill $! 2>/dev/null"
    local i
    for ((i = 0; i < 100; i++)); do grep -q ready "$T/hold-${1//\//_}.out" && return 0; sleep 0.1; done
    cat "$T/hold-${1//\//_}.out"; fail "clients of $1 did not connect"
}
hold tank/a 2
hold tank/b 1

expect_error "volume 'tank/a' is busy: 2 clients are attached \(use -f" z volume destroy tank/a
z volume list -H | awk "{print \$1}" | grep -qx tank/a || fail "tank/a is gone after a refused destroy"
expect_error "pool 'tank' is busy: 3 clients are attached \(use -f" z pool destroy tank
z pool list -H -o name | grep -qx tank || fail "tank is gone after a refused destroy"
expect_error "cannot export 'tank': pool 'tank' is busy: 3 clients are attached \(use -f" z pool export tank
z pool list -H -o name | grep -qx tank || fail "tank is gone after a refused export"

# a volume nobody is attached to needs no -f
z volume destroy tank/c
! z volume list -H | awk "{print \$1}" | grep -qx tank/c || fail "tank/c still listed"

start=$(date +%s.%N)
timeout 30 "$ZILLA" --state-dir "$STATE" volume destroy -f tank/a 2>"$T/err" || fail "volume destroy -f failed: $(cat "$T/err")"
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
log "volume destroy -f with 2 clients attached: ${took} s"
! z volume list -H | awk "{print \$1}" | grep -qx tank/a || fail "tank/a still listed after destroy -f"
# tank/b's client was not disconnected; a new client of tank/b works
expect_error "pool 'tank' is busy: 1 client is attached \(use -f" z pool destroy tank
took=$(timeout 10 python3 "$TOOL" writeflush 127.0.0.1 "$NBD_PORT" tank/b) || fail "write+flush to tank/b failed"

# export: refused with tank/b's idle client attached; -f disconnects it and exports
expect_error "cannot export 'tank': pool 'tank' is busy: 1 client is attached \(use -f" z pool export tank
timeout 30 "$ZILLA" --state-dir "$STATE" pool export -f tank 2>"$T/err" || fail "pool export -f failed: $(cat "$T/err")"
! z pool list -H -o name | grep -qx tank || fail "tank still listed after export -f"
z pool import -d "$T/disks" tank >/dev/null
# a client that has just exited is not "attached": the next export needs no -f
nbdinfo "$(nbd_tcp_uri tank/b)" >/dev/null || fail "nbdinfo tank/b after the import"
z pool export tank
z pool import -d "$T/disks" tank >/dev/null
took=$(timeout 10 python3 "$TOOL" writeflush 127.0.0.1 "$NBD_PORT" tank/b) || fail "write+flush to tank/b after export/import failed"

# clients that send requests and never read the replies must not hold -f up either
python3 "$TOOL" stall 127.0.0.1 "$NBD_PORT" tank/b 2 >"$T/stall.out" 2>&1 &
on_exit "kill $! 2>/dev/null"
for ((i = 0; i < 100; i++)); do grep -q ready "$T/stall.out" && break; sleep 0.1; done
grep -q ready "$T/stall.out" || { cat "$T/stall.out"; fail "stalling clients did not connect"; }
expect_error "pool 'tank' is busy: 2 clients are attached \(use -f" z pool destroy tank
start=$(date +%s.%N)
timeout 30 "$ZILLA" --state-dir "$STATE" pool destroy -f tank 2>"$T/err" || fail "pool destroy -f failed: $(cat "$T/err")"
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
log "pool destroy -f with 2 non-reading clients attached: ${took} s"
! z pool list -H -o name | grep -qx tank || fail "tank still listed after destroy -f"
log "destroy refuses with clients attached, -f disconnects them OK"
