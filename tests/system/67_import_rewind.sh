#!/usr/bin/env bash
# Goal (issue 15, row 5): import never rewinds silently. Method: wreck every block the
# pool's last txg wrote (its object directory among them) on every device, as a device
# that lost its newest writes would; import must fail and point to -F; `import -F -n`
# must say which txg it would load and import nothing; `import -F` loads it, and the data
# written before that txg reads back.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 64M
make_volume tank/v 16M
head -c $((4 << 20)) /dev/urandom >"$T/data"
nbdcopy "$T/data" "$(nbd_unix_uri tank/v)"

# -n without -F is refused by the CLI
z pool import -d "$T/disks" -n tank 2>"$T/err" && fail "import -n without -F accepted"
# a healthy pool: -F -n says no rewind is needed, and imports nothing
z pool export tank
z pool import -d "$T/disks" -F -n tank | tee "$T/plan0"
grep -q "no rewind is needed" "$T/plan0" || fail "plan on a healthy pool: $(cat "$T/plan0")"
z pool list -H | grep -q '^tank' && fail "import -F -n imported the pool"
z pool import -d "$T/disks" tank
# the txg to lose: the export's final sync (MOS, space maps, uberblocks)
mkdir -p "$T/before"
cp "$T"/disks/tank-* "$T/before/"
z pool export tank
python3 - "$T/disks" "$T/before" <<'PY'
import os, sys
disks, before = sys.argv[1], sys.argv[2]
LABEL = 256 << 10
wrecked = 0
for name in sorted(os.listdir(before)):
    a = open(os.path.join(before, name), 'rb').read()
    with open(os.path.join(disks, name), 'r+b') as f:
        b = f.read()
        end = len(b) - 2 * LABEL
        for off in range(2 * LABEL, end, 4096):
            if a[off:off + 4096] != b[off:off + 4096]:
                f.seek(off)
                f.write(bytes(x ^ 0x5A for x in b[off:off + 4096]))
                wrecked += 1
print(f"wrecked {wrecked} blocks")
assert wrecked > 0
PY
z pool import -d "$T/disks" tank 2>"$T/err" && fail "import of a pool whose newest txg is unreadable succeeded"
cat "$T/err"
grep -q -- "-F" "$T/err" || fail "the import error does not point to -F"
z pool import -d "$T/disks" -F -n tank | tee "$T/plan"
grep -q "Would rewind from txg" "$T/plan" || fail "no rewind plan"
z pool list -H | grep -q '^tank' && fail "import -F -n imported the pool"
z pool import -d "$T/disks" -F tank
z pool status tank | grep -q 'state: ONLINE' || fail "rewound pool not ONLINE"
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back"
cmp <(head -c $((4 << 20)) "$T/back") "$T/data" || fail "data written before the lost txg differs"
stop_daemon
log "import never rewinds silently; -F -n plans, -F rewinds"
