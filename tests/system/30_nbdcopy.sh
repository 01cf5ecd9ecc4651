#!/usr/bin/env bash
# Goal: bulk data goes in and comes back bit for bit. Method: nbdcopy 256 MiB of
# random data into a volume over TCP, copy it out over the unix socket, compare
# sha256; repeat after a daemon restart.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 512M
make_volume tank/big 256M
head -c $((256 << 20)) /dev/urandom >"$T/in"
sum_in=$(sha256sum <"$T/in" | cut -d' ' -f1)
nbdcopy --flush -p "$T/in" "$(nbd_tcp_uri tank/big)"
nbdcopy "$(nbd_unix_uri tank/big)" "$T/out"
[ "$(sha256sum <"$T/out" | cut -d' ' -f1)" = "$sum_in" ] || fail "checksum differs"
rm -f "$T/out"
stop_daemon
start_daemon
nbdcopy "$(nbd_tcp_uri tank/big)" "$T/out"
[ "$(sha256sum <"$T/out" | cut -d' ' -f1)" = "$sum_in" ] || fail "checksum differs after restart"
z pool list tank
stop_daemon
log "nbdcopy OK"
