#!/usr/bin/env bash
# Goal: a volume grown with `zilla set volsize=` while an iSCSI session is logged in is
# seen by that session as a real disk's would be: its next command gets the unit
# attention CAPACITY DATA HAS CHANGED (2a/09, what makes Linux rescan), READ CAPACITY
# then gives the new size and the blocks past the old end can be written and read. The
# data below the old end is unchanged. A new NBD connection sees the new size.
# Method: the test's raw initiator (iscsi_client.py as a module) holds one session
# across the `zilla set`.
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
start_daemon
make_pool tank 256M
make_volume tank/vol 64M
head -c 1M /dev/urandom >"$T/data"
python3 "$(dirname "$0")/iscsi_client.py" "$ISCSI_ADDR" iqn.2026-11.io.zilla:tank.vol write 0 "$T/data"

cat >"$T/grow.py" <<PY
import struct, subprocess, sys
sys.path.insert(0, "$(dirname "$0")")
import iscsi_client as ic
i = ic.Initiator("$ISCSI_ADDR", "iqn.2026-11.io.zilla:tank.vol")
def capacity():
    d = i.command(bytes([0x9e, 0x10] + [0] * 8 + [0, 0, 0, 32, 0, 0]), expected=32, read=True)
    return struct.unpack_from(">Q", d, 0)[0] + 1
assert capacity() == (64 << 20) // 512, capacity()
subprocess.run(["$ZILLA", "--state-dir", "$STATE", "set", "volsize=128M", "tank/vol"], check=True)
try:
    i.command(bytes(6))                     # TEST UNIT READY
    raise SystemExit("no unit attention after the volume grew")
except SystemExit as e:
    if "asc/ascq 2a09" not in str(e):
        raise SystemExit(f"TEST UNIT READY after the grow: {e} (wanted CAPACITY DATA HAS CHANGED, 2a09)")
i.command(bytes(6))                         # reported once
assert capacity() == (128 << 20) // 512, capacity()
tail = (128 << 20) // 512 - 128
ic.write(i, tail, b"z" * 65536)
assert ic.read(i, tail, 128) == b"z" * 65536
open("$T/head", "wb").write(ic.read(i, 0, 2048))
print("ok")
PY
python3 "$T/grow.py" || fail "the logged-in iSCSI session did not see the volume grow as a disk does"
cmp "$T/head" "$T/data" || fail "data below the old end changed after the grow"
size=$(nbdinfo --size "$(nbd_unix_uri tank/vol)")
[ "$size" -eq $((128 << 20)) ] || fail "a new NBD connection sees $size bytes, not 128 MiB"
log "ok"
