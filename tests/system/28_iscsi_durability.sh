#!/usr/bin/env bash
# Goal: over iSCSI, what SYNCHRONIZE CACHE acknowledged survives kill -9 with the write
# cache on; with it off every acknowledged WRITE does; and a WCE change by MODE SELECT
# is the volume's `wce` property, kept across a restart.
# Method: zfs_txg_timeout raised so no txg commits the data; a raw-socket initiator
# (iscsi_client.py) turns WCE on with MODE SELECT, writes 1 MiB, sends SYNCHRONIZE
# CACHE, writes 256 KiB more without one; kill -9; after the restart the 1 MiB reads
# back (the ledger is the file it wrote), `wce` is on and MODE SENSE says so. Then WCE
# off, 512 KiB written without any flush, kill -9: it reads back.
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
CLIENT="python3 $(dirname "$0")/iscsi_client.py 127.0.0.1:$ISCSI_PORT iqn.2026-11.io.zilla:tank.vol"
start_daemon
make_pool tank 256M
make_volume tank/vol 64M
z tunable set zfs_txg_timeout=3600 >/dev/null

[ "$($CLIENT wce)" = 0 ] || fail "the write cache is not off by default"
$CLIENT set-wce 1
[ "$(z get -H wce tank/vol | cut -f3)" = on ] || fail "MODE SELECT did not set the wce property"
head -c 1M /dev/urandom >"$T/synced"
$CLIENT write 2048 "$T/synced"
$CLIENT sync
head -c 256K /dev/urandom >"$T/unsynced"
$CLIENT write 8192 "$T/unsynced"
kill9_daemon
start_daemon
[ "$(z get -H wce tank/vol | cut -f3)" = on ] || fail "wce=on lost at restart"
[ "$($CLIENT wce)" = 1 ] || fail "MODE SENSE does not report the write cache on after a restart"
$CLIENT read 2048 2048 "$T/back"
cmp "$T/synced" "$T/back" || fail "data acknowledged by SYNCHRONIZE CACHE lost at kill -9"
log "1 MiB acknowledged by SYNCHRONIZE CACHE read back after kill -9"

# Write cache off: each WRITE's status follows its commit.
z tunable set zfs_txg_timeout=3600 >/dev/null
$CLIENT set-wce 0
head -c 512K /dev/urandom >"$T/stable"
$CLIENT write 16384 "$T/stable"
kill9_daemon
start_daemon
$CLIENT read 16384 1024 "$T/back2"
cmp "$T/stable" "$T/back2" || fail "a WRITE acknowledged with the write cache off lost at kill -9"
[ "$(z get -H wce tank/vol | cut -f3)" = off ] || fail "wce=off lost at restart"
echo PASS
