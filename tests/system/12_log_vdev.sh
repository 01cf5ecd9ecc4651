#!/usr/bin/env bash
# Goal: a log mirror is an admin object like in ZFS: `pool add POOL log mirror A B`
# puts it under "logs", flushed writes go to it (zilstat, iostat -v, /metrics say so),
# and `pool remove POOL mirror-N` takes it out again without losing an acknowledged
# write. Method: txgs only every hour, so flushed writes live only in the log; fio
# 4K random writes with an fsync after each; remove the log mirror; kill -9 the daemon
# at once; restart without the log files; every flushed byte reads back.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 256M
truncate -s 128M "$T/disks/log0" "$T/disks/log1"
z pool add tank log mirror "$T/disks/log0" "$T/disks/log1"
z pool status tank | tee "$T/st"
grep -Pzq '\n\tlogs\n\t  mirror-2 +ONLINE[^\n]*\n\t    \S*log0 +ONLINE' "$T/st" || fail "status: no logs section with mirror-2"
z tunable set zfs_txg_timeout=3600

make_volume tank/v 64M
uri=$(nbd_unix_uri tank/v)
# the first commit creates the chain (one txg); the rest go to the log only
head -c $((4 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$uri"
fio --name=sync --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --size=8M --offset=16M \
    --fsync=1 --number_ios=300 --randseed=7 --verify=crc32c --do_verify=0 --verify_state_save=0 \
    --output="$T/fio.txt" || { cat "$T/fio.txt"; fail "fio"; }

z zilstat | tee "$T/zs"
head -1 "$T/zs" | grep -Eq '^ +time +cc +ic +idc +idb +iic +iib +imnc +imnw +imsc +imsw$' || fail "zilstat header"
imsc=$(awk 'NR==2{print $10}' "$T/zs")
[ "$imsc" != 0 ] || fail "zilstat: no itx went to the log devices"
z zilstat 1 2 | wc -l | grep -qx 3 || fail "zilstat INTERVAL COUNT"
z pool iostat -v -p tank | tee "$T/io"
awk '/log0/ {found=1; if ($5 > 0) ok=1} END {exit !(found && ok)}' "$T/io" || fail "iostat -v: no writes on log0"
curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$T/metrics" || fail "/metrics"
grep -Eq '^zfs_zil_itx_metaslab_slog_count_total\{pool="tank"\} [1-9]' "$T/metrics" || fail "/metrics: no slog itx counter"
grep -Eq '^zfs_zil_commit_count_total\{pool="tank"\} [1-9]' "$T/metrics" || fail "/metrics: no commit counter"

expect_error "part of the log mirror mirror-2" z pool remove tank "$T/disks/log0"
expect_error "only log, cache and spare devices can be removed" z pool remove tank mirror-0
expect_error "no such|not found|NotFound|does not exist" z pool remove tank mirror-9
z pool remove tank mirror-2
z pool status tank | tee "$T/st2"
grep -q 'logs' "$T/st2" && fail "status: logs section after remove"
# commits still work (the log now lives in the pool's own vdevs)
qemu-io -f raw -c "write -P 0xcd $((40 << 20)) 64k" -c flush "$uri" >/dev/null
kill9_daemon
rm -f "$T/disks/log0" "$T/disks/log1"
start_daemon
z pool status tank | tee "$T/st3"
grep -q 'state: ONLINE' "$T/st3" || fail "pool not ONLINE after restart without the log files"
nbdcopy "$uri" "$T/back"
cmp -n $((4 << 20)) "$T/data" "$T/back" || fail "flushed nbdcopy data lost"
fio --name=sync --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --size=8M --offset=16M \
    --number_ios=300 --randseed=7 --verify=crc32c --verify_only --verify_state_save=0 \
    --output="$T/fio2.txt" || { cat "$T/fio2.txt"; fail "fio-verified writes lost"; }
qemu-io -f raw -c "read -P 0xcd $((40 << 20)) 64k" "$uri" | tee "$T/qio"
grep -q 'Pattern verification failed' "$T/qio" && fail "flushed 0xcd block lost"
stop_daemon
log "log vdev add/status/zilstat/remove OK"
