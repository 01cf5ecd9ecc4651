#!/usr/bin/env bash
# Goal: qemu's NBD client works against our volumes. Method: qemu-img info, convert
# a raw and a qcow2 image onto the volume (nbd URI), qemu-img compare.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 256M
make_volume tank/vm 64M
uri=$(nbd_tcp_uri tank/vm)
qemu-img info "$uri" | tee "$T/info"
grep -q 'virtual size: 64 MiB' "$T/info" || fail "qemu-img info size"

head -c $((48 << 20)) /dev/urandom >"$T/src.raw"
truncate -s 64M "$T/src.raw"          # a sparse tail, like a real disk image
qemu-img convert -n -p -f raw -O raw "$T/src.raw" "$uri"
qemu-img compare -f raw -F raw "$T/src.raw" "$uri" || fail "raw compare"

qemu-img create -q -f qcow2 "$T/src.qcow2" 64M
qemu-io -f qcow2 -c 'write -P 0x11 0 1M' -c 'write -P 0x22 10M 3M' "$T/src.qcow2" >/dev/null
qemu-img convert -n -f qcow2 -O raw "$T/src.qcow2" "$(nbd_unix_uri tank/vm)"
qemu-img compare -f qcow2 -F raw "$T/src.qcow2" "$uri" || fail "qcow2 compare"
stop_daemon
log "qemu-img OK"
