#!/usr/bin/env bash
# Goal: destroying what clients are reading cold (io_uring completions answering them)
# and removing a log mirror under FUA writes never hangs the daemon or panics it.
# Method: fio cold random reads at depth 64 on tank/cold and fio FUA-ish writes (fsync
# each) on tank/w; `pool remove` of the log mirror mid-write; `volume destroy -f` of
# the volume being read; then `pool destroy -f` with both still attached; the daemon
# must answer, a second pool on the same files must be creatable, SIGTERM exits 0.
. "$(dirname "$0")/lib.sh"
command -v fio >/dev/null || skip "fio missing"
no_panic() { ! grep -n "panicked" "$T/daemon.log" || fail "$1: the daemon panicked"; }
start_daemon
make_pool tank 256M
truncate -s 128M "$T/disks/log0" "$T/disks/log1"
z pool add tank log mirror "$T/disks/log0" "$T/disks/log1"
make_volume tank/cold 96M
make_volume tank/cold2 96M
make_volume tank/w 64M
head -c $((64 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/cold)"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/cold2)"
z pool export tank
z pool import -d "$T/disks" tank >/dev/null

rfio() { # VOLUME TAG
    fio --name=r --ioengine=nbd --uri="$(nbd_tcp_uri "$1")" --rw=randread --bs=16k --iodepth=64 \
        --numjobs=2 --size=64M --time_based --runtime=60 --group_reporting >"$T/fio-$2.out" 2>&1 &
    on_exit "kill $! 2>/dev/null"
}
rfio tank/cold c1
rfio tank/cold2 c2
fio --name=w --ioengine=nbd --uri="$(nbd_tcp_uri tank/w)" --rw=randwrite --bs=4k --iodepth=8 --fsync=1 \
    --size=32M --time_based --runtime=60 >"$T/fio-w.out" 2>&1 &
on_exit "kill $! 2>/dev/null"
sleep 2
start=$SECONDS
timeout 60 "$ZILLA" --state-dir "$STATE" pool remove tank mirror-2 || fail "log removal under I/O failed or hung"
log "log mirror removed under FUA writes and cold reads in $((SECONDS - start)) s"
sleep 1
start=$SECONDS
timeout 60 "$ZILLA" --state-dir "$STATE" volume destroy -f tank/cold || fail "volume destroy -f under cold reads failed or hung"
log "volume destroy -f under cold reads: $((SECONDS - start)) s"
timeout 10 "$ZILLA" --state-dir "$STATE" pool list >/dev/null || fail "daemon unresponsive"
sleep 1
start=$SECONDS
timeout 60 "$ZILLA" --state-dir "$STATE" pool destroy -f tank || fail "pool destroy -f under cold reads failed or hung"
log "pool destroy -f under cold reads and writes: $((SECONDS - start)) s"
no_panic "destroy"
# the leaves are free again: a new pool on them
z pool create -f again mirror "$T/disks/tank-a0" "$T/disks/tank-a1" || fail "the destroyed pool's files are still held"
z volume create -V 16M again/v
head -c $((8 << 20)) /dev/urandom >"$T/d2"
nbdcopy --flush "$T/d2" "$(nbd_unix_uri again/v)"
nbdcopy "$(nbd_unix_uri again/v)" "$T/d2back"
cmp -n $((8 << 20)) "$T/d2" "$T/d2back" || fail "new pool on the old files reads wrong"
no_panic "new pool"
stop_daemon
no_panic "stop"
log "destroy under io_uring cold reads OK"
