#!/usr/bin/env bash
# Goal: a crafted label never takes the daemon down, and a crafted txg never wraps.
# Method: craft ashift=255 into every label of every leaf (checksums resealed) and
# start the daemon under an address-space limit: it must stay up and answer, the pool
# not imported, and the refusal (log, `pool import`) must name the field. Then put the
# ashift back and craft the newest uberblock's txg to 2^64-1: that uberblock is corrupt
# (txgs are below 2^63), the previous one is loaded, and 40 writes acknowledged with
# FLUSH after it read back after export and import. Last, a label that verifies but
# whose config does not decode is named in the listing and the import error, its
# decoder message shown escaped; names from labels holding bidi overrides, invisible
# characters and backslashes are shown escaped.
. "$(dirname "$0")/lib.sh"
CRAFT="$(dirname "$0")/../tools/craft_label.py"
AS_LIMIT=$((4 << 30)) # bytes of address space for the daemon
start_daemon
make_pool tank 64M
make_volume tank/v 16M
head -c $((4 << 20)) /dev/urandom >"$T/data"
nbdcopy "$T/data" "$(nbd_unix_uri tank/v)"
stop_daemon

for f in "$T"/disks/tank-*; do python3 "$CRAFT" config "$f" 'config.tops.*.ashift' 255 >/dev/null; done
DAEMON_PREFIX=(prlimit --as=$AS_LIMIT --)
start_daemon
z pool list -H | grep '^tank' | grep -qv UNAVAIL && fail "a pool with ashift 255 in its labels was imported"
z pool status tank | grep -q "ashift = 255" || fail "pool status does not say why tank is unavailable: $(z pool status tank)"
grep -q "ashift = 255" "$T/daemon.log" || fail "the daemon log does not name the field: $(tail -n 5 "$T/daemon.log")"
z pool import -d "$T/disks" tank 2>"$T/err" && fail "import of ashift 255 succeeded"
grep -q "ashift = 255" "$T/err" || fail "the import error does not name the field: $(cat "$T/err")"
sleep 1
kill -0 "$DAEMON_PID" || fail "the daemon died"
z pool list -H >/dev/null || fail "the daemon does not answer"
stop_daemon
log "ashift 255: refused, named, daemon up under a $((AS_LIMIT >> 30)) GiB address-space limit"

for f in "$T"/disks/tank-*; do python3 "$CRAFT" config "$f" 'config.tops.*.ashift' 12 >/dev/null; done
for f in "$T"/disks/tank-*; do python3 "$CRAFT" txg "$f" 0xffffffffffffffff >/dev/null; done
start_daemon
z pool list -H | grep '^tank' | grep -q ONLINE || z pool import -d "$T/disks" tank
z pool list -H | grep '^tank' | grep -q ONLINE || fail "pool not imported after its newest uberblock was crafted"
grep -q "field txg = 18446744073709551615" "$T/daemon.log" || fail "the crafted uberblock was not reported"
# 40 writes, each acknowledged with FLUSH
for i in $(seq 0 39); do
    qemu-io -f raw "$(nbd_unix_uri tank/v)" -c "write -P $((i + 1)) $(((8 << 20) + i * 4096)) 4k" -c flush >/dev/null ||
        fail "write $i failed"
done
z pool export tank
z pool import -d "$T/disks" tank
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back"
cmp <(head -c $((4 << 20)) "$T/back") "$T/data" || fail "data written before the crafted uberblock differs"
for i in $(seq 0 39); do
    cmp <(tail -c +$(((8 << 20) + i * 4096 + 1)) "$T/back" | head -c 4096) <(head -c 4096 /dev/zero | tr '\0' "\\$(printf %03o $((i + 1)))") ||
        fail "write $i acknowledged with FLUSH is lost"
done
kill -0 "$DAEMON_PID" || fail "the daemon died"
log "txg 2^64-1: uberblock refused as corrupt, previous one loaded, 40 flushed writes survive export and import"

# A label that verifies but whose config does not decode is named, never skipped: the
# role of the pool's vdev becomes an unknown word holding a terminal escape, a
# right-to-left override and a backslash, which must be shown escaped.
truncate -s 64M "$T/disks/odd0"
z pool create odd "$T/disks/odd0"
z pool export odd
python3 "$CRAFT" config "$T/disks/odd0" 'config.tops.*.role' '"\u202e\u001b[31mevil\\"' >/dev/null
z pool import -d "$T/disks" >"$T/list" 2>&1 || true
grep -q "device: $T/disks/odd0" "$T/list" || fail "the listing does not name the device whose config does not decode: $(cat "$T/list")"
grep -qF 'pool config cannot be decoded: unknown variant `\u{202e}\u{1b}[31mevil\\`' "$T/list" || fail "the listing does not give the decoder's message, escaped: $(cat -v "$T/list")"
LC_ALL=C grep -q "$(printf '\033')\|$(printf '\342\200\256')" "$T/list" && fail "the listing prints an escape or a bidi override raw: $(cat -v "$T/list")"
z pool import -d "$T/disks" odd 2>"$T/err" && fail "odd imported though its config does not decode"
grep -q "$T/disks/odd0: its label verifies but its pool config cannot be decoded" "$T/err" || fail "the import error does not name the device: $(cat "$T/err")"
log "a label whose config does not decode: named, with the decoder's message escaped"

# Names from a label are printed by one rule: a right-to-left override, an isolate, a
# zero-width space and a backslash in the pool name and in a missing device's path
# are shown escaped in the listing.
truncate -s 64M "$T/disks/bidi0" "$T/disks/bidi1"
z pool create bidi mirror "$T/disks/bidi0" "$T/disks/bidi1"
z pool export bidi
rm "$T/disks/bidi1"
python3 "$CRAFT" config "$T/disks/bidi0" 'config.name' '"ev\u202eil\\x\u200b"' >/dev/null
python3 "$CRAFT" config "$T/disks/bidi0" 'config.tops.0.children.1.spec.path' '"/gone\u202e\\n\u2066"' >/dev/null
z pool import -d "$T/disks" >"$T/list" 2>&1 || true
grep -qF 'pool: ev\u{202e}il\\x\u{200b}' "$T/list" || fail "the pool name is not shown escaped: $(cat -v "$T/list")"
grep -qF '/gone\u{202e}\\n\u{2066}  device missing' "$T/list" || fail "the missing device's path is not shown escaped: $(cat -v "$T/list")"
LC_ALL=C grep -q "$(printf '\342\200\256')\|$(printf '\342\201\246')\|$(printf '\342\200\213')" "$T/list" && fail "the listing prints a bidi or invisible character raw: $(cat -v "$T/list")"
stop_daemon
log "names from labels: bidi overrides, isolates, invisible characters and backslashes shown escaped"
