#!/usr/bin/env bash
# Goal: concurrent pipelined random writes land intact. Method: fio's nbd engine,
# 4 jobs x iodepth 32 of 4K-64K random writes over separate regions, verify=crc32c.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 512M
make_volume tank/fio 256M
cd "$T"
fio --name=randwrite --ioengine=nbd --uri="$(nbd_tcp_uri tank/fio)" \
    --rw=randwrite --bsrange=4k-64k --iodepth=32 --numjobs=4 \
    --size=64M --offset_increment=64M --verify=crc32c --do_verify=1 \
    --verify_fatal=1 --verify_state_save=0 --group_reporting | tee "$T/fio.out"
grep -q 'err= 0' "$T/fio.out" || fail "fio reported errors"
z pool iostat -v tank
stop_daemon
log "fio verify OK"
