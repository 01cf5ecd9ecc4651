#!/usr/bin/env bash
# Goal: attach and replace show the tree zpool shows, at once, in every view, and do
# not block: after `attach tank d7 d8` the CLI status, /api/v1/status and iostat -v show
# mirror-0 with d7 and d8 (not two top-level vdevs); `replace` answers once the
# resilver has started, the tree shows replacing-N with the old and new device, the
# pool stays ONLINE with zpool's resilvering status/action lines, and `pool wait -t
# replace` returns when the old device is gone. `scrub -w` on a running scrub waits.
# Detaching a resilver's only target ends the resilver.
. "$(dirname "$0")/lib.sh"
start_daemon
d=$T/disks
truncate -s 256M "$d/d7" "$d/d8" "$d/d9"
z pool create tank "$d/d7"
make_volume tank/v 96M
head -c $((64 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/v)"

z pool attach -w tank "$d/d7" "$d/d8"
z pool status tank | tee "$T/st"
grep -Pzq '\n\ttank +ONLINE[^\n]*\n\t  mirror-0 +ONLINE[^\n]*\n\t    \S*d7 +ONLINE[^\n]*\n\t    \S*d8 +ONLINE' "$T/st" || fail "status after attach: no mirror-0 of d7 and d8"
curl -sf "http://127.0.0.1:$HTTP_PORT/api/v1/status" >"$T/st.json" || fail "/api/v1/status"
python3 - "$T/st.json" <<'PY' || fail "/api/v1/status after attach: not one mirror-0 of d7, d8"
import json, sys
st = json.load(open(sys.argv[1]))
e = st[0] if isinstance(st, list) else st
cfg = (e.get("status") or e)["config"]
assert [v["name"] for v in cfg] == ["mirror-0"], cfg
assert [c["name"].rsplit("/", 1)[-1] for c in cfg[0]["children"]] == ["d7", "d8"], cfg
PY
z pool iostat -v tank | tee "$T/io"
grep -Eq '^\s+mirror-0\s' "$T/io" && grep -Eq '^\s+\S*d7\s' "$T/io" && grep -Eq '^\s+\S*d8\s' "$T/io" || fail "iostat -v after attach: no mirror-0 with d7 and d8"

start=$(date +%s%N)
z pool replace tank "$d/d8" "$d/d9"
took=$(( ($(date +%s%N) - start) / 1000000 ))
z pool status tank | tee "$T/st"
grep -q "resilver in progress" "$T/st" || fail "replace returned after ${took} ms but no resilver is in progress (it blocked until the end)"
grep -Pzq '\n\t  mirror-0 +ONLINE[^\n]*\n\t    \S*d7 +ONLINE[^\n]*\n\t    replacing-1 +ONLINE[^\n]*\n\t      \S*d8 +ONLINE[^\n]*\n\t      \S*d9 +ONLINE +0 +0 +0  \(resilvering\)' "$T/st" \
    || fail "status during replace: no replacing-1 with d8 and d9 (resilvering)"
grep -q "^ state: ONLINE" "$T/st" || fail "a healthy pool being resilvered onto a new disk is not ONLINE"
grep -q "^status: One or more devices is currently being resilvered" "$T/st" || fail "status line"
grep -q "^action: Wait for the resilver to complete." "$T/st" || fail "action line"
z pool wait -t replace tank
z pool status tank | tee "$T/st"
grep -Pzq '\n\t  mirror-0 +ONLINE[^\n]*\n\t    \S*d7 +ONLINE[^\n]*\n\t    \S*d9 +ONLINE[^\n]*\n\nerrors' "$T/st" || fail "after pool wait -t replace: not mirror-0 of d7, d9"
grep -q "d8" "$T/st" && fail "d8 still in the pool after the replace finished"

# scrub -w on a running scrub waits for it
z pool scrub tank
z pool scrub -w tank || fail "scrub -w on a running scrub failed instead of waiting"
z pool status tank | grep -q "scrub repaired" || fail "scrub -w returned before the scrub finished"
z pool wait tank

# detaching the device a resilver writes to ends that resilver (nothing is left to write)
truncate -s 256M "$d/d10"
z tunable set zfs_scan_pause_every_spans=1
z pool attach tank "$d/d7" "$d/d10"
z pool status tank | grep -q "resilver in progress" || fail "no resilver in progress after attach"
z pool detach tank "$d/d10"
z tunable set zfs_scan_pause_every_spans=0
z pool status tank | tee "$T/st"
grep -q "resilver in progress" "$T/st" && fail "the resilver goes on after its device was detached"
z pool wait -t resilver tank
z pool events tank | awk '/resilver_start/{s=NR} /resilver_finish/{f=NR} END{exit !(f > s)}' || fail "no resilver_finish after the detach"
expect_error "invalid activity 'bogus'" z pool wait -t bogus tank
log "ok"
