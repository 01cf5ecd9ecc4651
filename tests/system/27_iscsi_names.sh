#!/usr/bin/env bash
# Goal: no two volumes are ever served under one iSCSI target name, and shareiscsi=off
# takes a volume off iSCSI (not off NBD).
# Method: tank/Vol_1 maps to target tank.vol-1; creating tank/vol-1 is refused with a
# message naming both; with -o shareiscsi=off it is created, and sharing it later is
# refused; shareiscsi=off on tank/Vol_1 drops it from discovery and refuses its login
# while NBD still serves it; after a restart the property holds.
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
start_daemon
make_pool tank 128M
PORTAL=iscsi://127.0.0.1:$ISCSI_PORT
TARGET=iqn.2026-11.io.zilla:tank.vol-1

make_volume tank/Vol_1 16M
if make_volume tank/vol-1 16M >"$T/clash" 2>&1; then fail "a second volume named to target $TARGET was created"; fi
grep -q "would be iSCSI target $TARGET, which 'tank/Vol_1' already is" "$T/clash" || fail "clash message: $(cat "$T/clash")"
make_volume tank/vol-1 16M -o shareiscsi=off
if z set shareiscsi=on tank/vol-1 >"$T/share" 2>&1; then fail "sharing tank/vol-1 under a taken target name succeeded"; fi
grep -q "which 'tank/Vol_1' already is" "$T/share" || fail "share message: $(cat "$T/share")"

# Discovery lists the one shared volume under that name, and it serves.
iscsi-ls -s "$PORTAL" | tee "$T/ls"
[ "$(grep -c "^Target:$TARGET " "$T/ls")" -eq 1 ] || fail "target $TARGET listed $(grep -c "^Target:$TARGET " "$T/ls") times"
iscsi-readcapacity16 "$PORTAL/$TARGET/0" | grep -q "^Total size:$((16 << 20))$" || fail "$TARGET does not serve tank/Vol_1"

# shareiscsi=off: gone from iSCSI, still on NBD.
z set shareiscsi=off tank/Vol_1
iscsi-ls -s "$PORTAL" >"$T/ls2"
if grep -q "^Target:$TARGET " "$T/ls2"; then fail "an unshared volume is still discovered"; fi
if iscsi-inq "$PORTAL/$TARGET/0" >"$T/inq" 2>&1; then fail "login to an unshared volume succeeded"; fi
nbdinfo --size "$(nbd_unix_uri tank/Vol_1)" | grep -q "^$((16 << 20))$" || fail "NBD stopped serving the unshared volume"

# Now tank/vol-1 may take the name; after a restart both settings hold.
z set shareiscsi=on tank/vol-1
stop_daemon
start_daemon
[ "$(z get -H shareiscsi tank/Vol_1 | cut -f3)" = off ] || fail "shareiscsi=off lost at restart"
iscsi-ls -s "$PORTAL" >"$T/ls3"
[ "$(grep -c "^Target:$TARGET " "$T/ls3")" -eq 1 ] || fail "after restart: $TARGET not listed once"
echo PASS
