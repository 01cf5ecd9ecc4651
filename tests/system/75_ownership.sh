#!/usr/bin/env bash
# Goal: device ownership through the real daemon and CLI (issue 15 rows 7-9). Method: a
# second daemon on the same disk files cannot import or reuse a live pool's leaves (each
# error names the leaf); after export it can. `pool create` refuses, naming what it
# found, a file with an ext4 file system, a file given twice (once through a symlink),
# a mounted loop device and the file behind it; -f overrides the signature only.
. "$(dirname "$0")/lib.sh"
start_daemon
D=$T/disks
for f in a b c fs; do truncate -s 256M "$D/$f"; done
z pool create tank mirror "$D/a" "$D/b"
make_volume tank/v 16M

# A second daemon (own state dir, own ports) on the same files.
STATE1=$STATE PID1=$DAEMON_PID NBD1=$NBD_PORT HTTP1=$HTTP_PORT
STATE=$T/state2 NBD_PORT= HTTP_PORT=
mkdir -p "$STATE"
start_daemon
PID2=$DAEMON_PID
z pool import -d "$D" | grep -q 'pool: tank' || fail "listing importable pools reads the labels of held leaves"
expect_error "cannot import 'tank'.*$D/(a|b) is in use by another pool or process" z pool import -d "$D" tank
expect_error "$D/a is in use by another pool or process" z pool create -f other "$D/a"
z pool list -H | grep -q tank && fail "daemon two imported the live pool"

# Daemon one exports: daemon two can take the pool over.
STATE=$STATE1 z pool export tank
z pool import -d "$D" tank
z pool status tank | grep -q '^ state: ONLINE$' || fail "import after export"
z pool export tank
kill -TERM "$PID2"; wait "$PID2" || true
STATE=$STATE1 DAEMON_PID=$PID1 NBD_PORT=$NBD1 HTTP_PORT=$HTTP1
z pool import -d "$D" tank

# Signatures and identity.
mkfs.ext4 -q -F "$D/fs" || skip "mkfs.ext4 missing"
expect_error "$D/fs has an existing ext2/ext3/ext4 file system; use -f" z pool create fsp "$D/fs"
ln -s "$D/c" "$D/c-link"
ln -s "$D/a" "$D/a-link"
expect_error "same device" z pool create twice mirror "$D/c" "$D/c-link"
expect_error "a-link is already in pool 'tank'" z pool attach -f tank "$D/b" "$D/a-link"
expect_error "a-link is already in pool 'tank'" z pool add -f tank "$D/a-link"
z pool create -f fsp "$D/fs"
z pool destroy fsp

# A mounted loop device, and the file behind it.
truncate -s 256M "$D/lo"
LOOP=$(losetup -f --show "$D/lo" 2>/dev/null) || skip "no loop devices"
on_exit "losetup -d $LOOP"
mkfs.ext4 -q -F "$LOOP"
mkdir -p "$T/mnt"
mount "$LOOP" "$T/mnt" || skip "cannot mount"
on_exit "umount $T/mnt"
expect_error "$LOOP is in use: $LOOP is mounted at $T/mnt$" z pool create lp "$LOOP"
expect_error "$LOOP is in use: $LOOP is mounted at $T/mnt$" z pool create -f lp "$LOOP"
expect_error "backs $LOOP, which is mounted at $T/mnt" z pool create lp "$D/lo"
log "ownership checks passed"
