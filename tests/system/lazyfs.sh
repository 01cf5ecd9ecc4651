# Sourced after lib.sh by the tests whose pool lives in zilla-lazyfs, a FUSE file
# system that keeps writes in its own cache until fsync and fails, drops or tears them
# on command (tools/zilla-lazyfs). Mounts it on $M (backing files in $T/backing), and
# gives: ctl CMD (a lazyfs command), stat_of KEY (a lazyfs counter), the ledger client
# (CLIENT, LEDGER outside the mount) and wait_acks N. Cleanups: the daemon is killed
# before the mount goes (on_exit runs newest first).
LAZYFS=${ZILLA_LAZYFS_BIN:-$ROOT/target/release/zilla-lazyfs}
[ -x "$LAZYFS" ] || fail "no zilla-lazyfs binary at $LAZYFS (cargo build --release --workspace)"
[ -e /dev/fuse ] || skip "no /dev/fuse"
command -v fusermount3 >/dev/null || skip "no fusermount3 (Debian fuse3)"
LEDGER=$T/ledger.json # outside the mount
CLIENT=(python3 "$ROOT/tests/tools/ledger_client.py")
M=$T/mnt
mkdir -p "$M" "$T/backing"

"$LAZYFS" "$T/backing" "$M" 2>>"$T/lazyfs.log" &
LAZY_PID=$!
on_exit "fusermount3 -u -z '$M'; kill $LAZY_PID"
on_exit '[ -z "$DAEMON_PID" ] || { kill -9 $DAEMON_PID; wait $DAEMON_PID; DAEMON_PID=; }'
for ((i = 0; i < 100; i++)); do [ -e "$M/.lazyfs-ctl" ] && break; sleep 0.1; done
[ -e "$M/.lazyfs-ctl" ] || { cat "$T/lazyfs.log"; fail "zilla-lazyfs did not mount on $M"; }

ctl() { echo "$*" >"$M/.lazyfs-ctl" || fail "lazyfs command '$*' refused: $(grep '^last' "$M/.lazyfs-ctl")"; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$M/.lazyfs-ctl"; }

# wait_acks N: the ledger writer (output in $T/writer.log) has had at least N writes
# acknowledged (max 30 s).
wait_acks() {
    local i n
    for ((i = 0; i < 300; i++)); do
        n=$(sed -n 's/^durable \([0-9]*\)$/\1/p' "$T/writer.log" | tail -n 1)
        [ "${n:-0}" -ge "$1" ] && return 0
        grep -q '^writer stopped' "$T/writer.log" && fail "writer stopped early: $(cat "$T/writer.log")"
        sleep 0.1
    done
    fail "fewer than $1 writes acknowledged in 30 s: $(tail -n 3 "$T/writer.log")"
}
