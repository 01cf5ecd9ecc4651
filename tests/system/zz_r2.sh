. "$(dirname "$0")/lib.sh"
LAZYFS=$ROOT/target/release/zilla-lazyfs
M=$T/mnt; mkdir -p "$M" "$T/backing"
"$LAZYFS" "$T/backing" "$M" 2>>"$T/lazyfs.log" &
LAZY_PID=$!
on_exit "fusermount3 -u -z '$M'; kill $LAZY_PID"
on_exit '[ -z "$DAEMON_PID" ] || { kill -9 $DAEMON_PID; wait $DAEMON_PID; DAEMON_PID=; }'
for ((i = 0; i < 100; i++)); do [ -e "$M/.lazyfs-ctl" ] && break; sleep 0.1; done
ctl() { echo "$*" >"$M/.lazyfs-ctl"; }
start_daemon
truncate -s 256M "$M/d0" "$M/d1"
z pool create tank mirror "$M/d0" "$M/d1"
make_volume tank/vol 64M
head -c 1M /dev/urandom | timeout 20 nbdcopy - "$(nbd_unix_uri tank/vol)" &
NPID=$!
ctl "fail-fsync /d0 1000000000"; ctl "fail-fsync /d1 1000000000"
for i in $(seq 30); do z pool status tank | grep -q SUSPENDED && break; sleep 0.5; done
z pool status tank | grep state
kill $NPID 2>/dev/null || true; wait $NPID || true
rc=0; time z pool destroy -f tank || rc=$?
echo "destroy rc=$rc"
z pool status tank || true
ctl clear
z pool import -d $M || true
