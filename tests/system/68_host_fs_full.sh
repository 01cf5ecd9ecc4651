#!/usr/bin/env bash
# Goal: a pool on files whose host file system fills up suspends, says so, loses nothing
# a flush acknowledged, comes back by itself when the admin frees space on the host, and
# never keeps SIGTERM from stopping the daemon.
# Method: a mirror of two sparse 512 MiB files on a 96 MiB tmpfs. A flushed 1 MiB pattern
# first, then 160 MiB of unflushed writes: the txg sync hits ENOSPC on the files, and the
# pool must show SUSPENDED (the writes then wait, as with failmode=wait). Growing the tmpfs and `pool clear` bring it back: ONLINE again,
# and a write + flush works. Fill it again (another file takes the rest of the tmpfs: suspended), then SIGTERM: the daemon must exit
# within 25 s (10 s NBD drain + 5 s suspended-export grace + slack). After the admin removes
# that file and restarts, the pool imports and the flushed pattern reads back.
. "$(dirname "$0")/lib.sh"
SMALL=$T/small
mkdir -p "$SMALL"
mount -t tmpfs -o size=96M tmpfs "$SMALL" || skip "cannot mount a tmpfs"
on_exit "umount -l $SMALL"
truncate -s 512M "$SMALL/a" "$SMALL/b"
start_daemon
z pool create hf mirror "$SMALL/a" "$SMALL/b"
z volume create -s -V 400M hf/v 2>/dev/null
uri=$(nbd_tcp_uri hf/v)

qio() { timeout 60 qemu-io -f raw "$@" "$uri"; }
qio -c "write -P 0xab 0 1M" -c flush >/dev/null || fail "flushed pattern write"

fill() { # unflushed writes of $1 MiB at 16 MiB + $2 MiB, in the background: once the pool
    # suspends they wait (failmode=wait) until it resumes or the daemon goes away
    timeout 300 qemu-io -f raw -c "write -P 0x5a $((16 + $2))M $1M" "$uri" >"$T/fill-$2.out" 2>&1 &
    FILL_PID=$!
    on_exit "kill $FILL_PID 2>/dev/null"
}
wait_state() { # STATE SECONDS
    for ((i = 0; i < $2 * 2; i++)); do
        z pool status hf | grep -q "^ state: $1\$" && return 0
        sleep 0.5
    done
    z pool status hf
    fail "pool did not become $1 within $2 s"
}

fill 160 0
wait_state SUSPENDED 60
log "host file system full: pool SUSPENDED"
mount -o remount,size=1G "$SMALL" || fail "cannot grow the tmpfs"
# The sync retries by itself; a child that failed too often is FAULTED and stays so
# until the admin clears it (as zpool clear), which resilvers it.
z pool clear hf
wait_state ONLINE 60
log "space freed on the host, pool cleared: ONLINE again"
wait "$FILL_PID" || { cat "$T/fill-0.out"; fail "writes held while suspended failed after the pool resumed"; }
qio -c "write -P 0xcd 8M 4k" -c flush >/dev/null || fail "write + flush after recovery"

dd if=/dev/zero of="$SMALL/filler" bs=1M status=none 2>/dev/null || true # another tenant fills the host fs
fill 150 200
wait_state SUSPENDED 60
start=$(date +%s.%N)
kill -TERM "$DAEMON_PID"
wait_pid_gone "$DAEMON_PID" 25 || fail "daemon still running 25 s after SIGTERM with a suspended pool"
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
DAEMON_PID=
grep -q "is suspended (its txg syncs fail) and cannot finish its final sync" "$T/daemon.log" \
    || fail "shutdown did not say why the pool was left unexported"
log "SIGTERM with a suspended pool: exited in ${took} s"

rm "$SMALL/filler"
start_daemon
wait_state ONLINE 30
qio -c "read -P 0xab 0 1M" -c "read -P 0xcd 8M 4k" >"$T/qio" || fail "read back after the restart"
grep -q 'Pattern verification failed' "$T/qio" && fail "a write acknowledged by a flush did not read back after the restart"
stop_daemon
log "host file system full: suspended, recovered, nothing flushed lost OK"
