# Shared helpers for the system tests. Source it first:  . "$(dirname "$0")/lib.sh"
#
# Each test gets its own temporary directory $T (state dir $STATE, backing files in
# $T/disks), its own daemon on free ports, and a trap that tears everything down —
# registered cleanups (umount, losetup -d, fusermount -u) first, then the daemon.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ZILLA=${ZILLA_BIN:-$ROOT/target/release/zilla}
[ -x "$ZILLA" ] || { echo "no zilla binary at $ZILLA (cargo build --release)"; exit 1; }
ZILLA=$(realpath "$ZILLA")
T=$(mktemp -d /tmp/zilla-systest.XXXXXX)
STATE=$T/state
mkdir -p "$T/disks"
DAEMON_PID=
NBD_PORT=
HTTP_PORT=
CLEANUPS=()
export RUST_LOG=${RUST_LOG:-info}

log() { printf '[%s] %s\n' "$(date +%T)" "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# Exit code 77 = skipped (tests/run prints SKIP).
skip() { echo "SKIP: $*"; exit 77; }

# Run a cleanup command at exit (most recent first).
on_exit() { CLEANUPS+=("$*"); }

_teardown() {
    local rc=$?
    set +e
    for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do eval "${CLEANUPS[i]}" >/dev/null 2>&1; done
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID"; wait_pid_gone "$DAEMON_PID" 30 || kill -9 "$DAEMON_PID"
    fi
    if [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ -f "$T/daemon.log" ]; then
        echo "--- daemon log (last 40 lines)"; tail -n 40 "$T/daemon.log"
    fi
    rm -rf "$T"
    exit $rc
}
trap _teardown EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_pid_gone() { # PID SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
    return 1
}

# The CLI against this test's daemon.
z() { "$ZILLA" --state-dir "$STATE" "$@"; }

# Start a daemon on $STATE (extra serve args allowed) and wait for its socket.
# DAEMON_PREFIX (an array, e.g. (prlimit --nofile=1024:1024)) runs it under a wrapper
# that execs it.
DAEMON_PREFIX=()
start_daemon() {
    NBD_PORT=${NBD_PORT:-$(free_port)}
    HTTP_PORT=${HTTP_PORT:-$(free_port)}
    "${DAEMON_PREFIX[@]}" "$ZILLA" --state-dir "$STATE" serve --nbd "127.0.0.1:$NBD_PORT" --http "127.0.0.1:$HTTP_PORT" \
        --iscsi "${ISCSI_ADDR:-off}" "$@" >>"$T/daemon.log" 2>&1 &
    DAEMON_PID=$!
    local i
    for ((i = 0; i < 600; i++)); do
        if [ -S "$STATE/zilla.sock" ] && z pool list -H >/dev/null 2>&1; then return 0; fi
        kill -0 "$DAEMON_PID" 2>/dev/null || { tail -n 20 "$T/daemon.log"; fail "daemon exited at start"; }
        sleep 0.1
    done
    fail "daemon did not open $STATE/zilla.sock within 60 s"
}

# SIGTERM and wait for a clean exit (status 0).
stop_daemon() {
    kill -TERM "$DAEMON_PID"
    local rc=0
    wait "$DAEMON_PID" || rc=$?
    DAEMON_PID=
    [ $rc -eq 0 ] || fail "daemon exited with status $rc after SIGTERM"
    [ ! -e "$STATE/zilla.sock" ] || fail "daemon left $STATE/zilla.sock behind"
}

kill9_daemon() {
    kill -9 "$DAEMON_PID"
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=
}

# make_pool NAME [FILESIZE]: two 2-way mirrors of sparse plain files in $T/disks.
make_pool() {
    local name=$1 size=${2:-512M} d
    for d in a0 a1 b0 b1; do truncate -s "$size" "$T/disks/$name-$d"; done
    z pool create "$name" mirror "$T/disks/$name-a0" "$T/disks/$name-a1" \
        mirror "$T/disks/$name-b0" "$T/disks/$name-b1"
}

# make_volume POOL/NAME SIZE [volume create options...]
make_volume() {
    local name=$1 size=$2; shift 2
    z volume create -s -V "$size" "$@" "$name"
}

nbd_unix_uri() { echo "nbd+unix:///$1?socket=$STATE/nbd.sock"; }
nbd_tcp_uri() { echo "nbd://127.0.0.1:$NBD_PORT/$1"; }

# expect_error PATTERN CMD...: CMD fails, prints exactly one stderr line
# "zilla: ..." matching PATTERN (grep -E), nothing on stdout.
expect_error() {
    local pattern=$1; shift
    local out err rc=0
    out=$("$@" 2>"$T/err") || rc=$?
    err=$(cat "$T/err")
    [ $rc -ne 0 ] || fail "expected failure, got success: $*"
    [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "expected one stderr line from '$*', got: $err"
    [[ $err == zilla:* ]] || fail "stderr does not start with 'zilla:': $err"
    printf '%s\n' "$err" | grep -Eq -- "$pattern" || fail "stderr '$err' does not match /$pattern/"
    [ -z "$out" ] || fail "unexpected stdout from '$*': $out"
    log "ok (rc=$rc): $err"
}
