#!/usr/bin/env bash
# Goal: what an administrator alerts on and watches is right. (1) A fresh pool with a
# cache device shows no L2ARC rebuild errors (there is nothing to rebuild). (2) /metrics
# has per-vdev error counters and states under the names ZFS exporters use
# (zpool_stats_{read,write,cksum}_errors, zpool_stats_state, node_zfs_zpool_state,
# zilla_vdev_state). (3) A scrub in progress shows zpool's progress lines (scanned and
# issued of the allocated bytes, rates, percentage, time to go) in `pool status` and
# the API, totals counted once per block, not once per mirror copy. (4) A disk
# scribbled behind the pool's back: the scrub repairs it and that vdev's checksum
# counter rises in /metrics, the other side's stays 0.
# Method: a mirror of two emulated disks slowed to 50 MB/s so a scrub of ~128 MiB is
# observably in progress; a cache device; random data through NBD; scrub and sample
# status, API and /metrics; scribble 16 MiB of one side's data area; scrub again.
. "$(dirname "$0")/lib.sh"
start_daemon
metrics() { curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$T/metrics" || fail "/metrics"; }
metric() { # metric REGEX: the value of the one sample whose line matches
    local v
    v=$(grep -E "$1" "$T/metrics" | awk '{print $NF}')
    [ -n "$v" ] && [ "$(printf '%s\n' "$v" | wc -l)" -eq 1 ] || fail "/metrics: not one sample matching /$1/: '$v'"
    echo "$v"
}
wait_scrub_done() {
    local i
    for ((i = 0; i < 300; i++)); do
        z pool status tank >"$T/st"
        grep -q 'scan: scrub repaired' "$T/st" && return 0
        sleep 0.2
    done
    cat "$T/st"; fail "the scrub did not finish in 60 s"
}

z tunable set sim_hdd_transfer_mb_s=50 >/dev/null
for d in a0 a1; do truncate -s 512M "$T/disks/$d"; done
truncate -s 256M "$T/disks/c0"
z pool create tank mirror "sim-hdd:$T/disks/a0" "sim-hdd:$T/disks/a1" cache "$T/disks/c0"

# (1) a fresh pool: the L2ARC has nothing to rebuild, and counts no error for it
sleep 1
metrics
[ "$(metric '^node_zfs_arc_l2_rebuild_dh_errors ')" = 0 ] || fail "a fresh pool shows L2ARC rebuild header errors: $(grep l2_rebuild "$T/metrics")"
[ "$(metric '^node_zfs_arc_l2_rebuild_unsupported ')" = 0 ] || fail "a fresh pool's cache device counted as unsupported"

# (2) state and error counters per vdev, for every vdev of the tree
A0='vdev="root/mirror-0/[^"]*disks/a0"'
A1='vdev="root/mirror-0/[^"]*disks/a1"'
[ "$(metric '^node_zfs_zpool_state\{zpool="tank",state="online"\}')" = 1 ] || fail "node_zfs_zpool_state online"
[ "$(metric '^node_zfs_zpool_state\{zpool="tank",state="degraded"\}')" = 0 ] || fail "node_zfs_zpool_state degraded"
[ "$(metric '^zilla_vdev_state\{pool="tank",vdev="root/mirror-0",state="online"\}')" = 1 ] || fail "zilla_vdev_state of mirror-0"
[ "$(metric "^zilla_vdev_state\\{pool=\"tank\",$A0,state=\"faulted\"\\}")" = 0 ] || fail "zilla_vdev_state of a0"
[ "$(metric "^zpool_stats_state\\{name=\"tank\",$A1,state=\"ONLINE\"\\}")" = 7 ] || fail "zpool_stats_state of a1"
[ "$(metric '^zpool_stats_state\{name="tank",vdev="root/[^"]*disks/c0",state="ONLINE"\}')" = 7 ] || fail "zpool_stats_state of the cache device"
for kind in read write cksum; do
    [ "$(metric "^zpool_stats_${kind}_errors_total\\{name=\"tank\",$A0\\}")" = 0 ] || fail "$kind errors of a0 on a fresh pool"
done
grep -q '^# TYPE zpool_stats_cksum_errors counter' "$T/metrics" || fail "zpool_stats_cksum_errors is not a counter"

# (3) data, then a scrub observed in progress
make_volume tank/v 256M
head -c $((128 << 20)) /dev/urandom >"$T/data"
nbdcopy --flush "$T/data" "$(nbd_unix_uri tank/v)"
sleep 6 # the txg with the data and its frees settle
alloc=$(z pool list -Hp -o alloc tank)
log "allocated: $alloc bytes"
z pool scrub tank
seen_rate= seen_to_go= seen_api=
for ((i = 0; i < 100; i++)); do
    z pool status tank >"$T/st" || fail "pool status"
    grep -q 'scan: scrub repaired' "$T/st" && break
    if grep -q 'scan: scrub in progress since' "$T/st"; then
        cp "$T/st" "$T/st.progress"
        # zpool's shape, line for line
        grep -Pzq 'scan: scrub in progress since [^\n]+\n\t\S+ / \S+ scanned( at \S+/s)?, \S+ / \S+ issued( at \S+/s)?\n\t\S+ repaired, [0-9]+\.[0-9]{2}% done, ([0-9:]+ to go|no estimated completion time)\n' "$T/st" ||
            { cat "$T/st"; fail "scan lines are not zpool's"; }
        grep -Eq 'issued at \S+/s' "$T/st" && seen_rate=1
        grep -Eq ', [0-9]{2}:[0-9]{2}:[0-9]{2} to go' "$T/st" && seen_to_go=1
        # zpool's rule: a time to go exactly when something was issued at >= 10 MiB/s
        python3 - "$T/st" <<'EOF' || { cat "$T/st"; fail "time to go given against zpool's rule"; }
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"issued at ([0-9.]+)([BKMGT])/s", t)
rate = float(m.group(1)) * 1024 ** "BKMGT".index(m.group(2)) if m else 0
# (the printed rate is rounded: no verdict within 2 % of the threshold)
assert abs(rate - 10 * 2**20) < 0.02 * 10 * 2**20 or (rate >= 10 * 2**20) == ("to go" in t), (rate, t)
EOF
        # the API: the same figures, the total the allocated bytes (once, not per copy)
        if curl -sf "http://127.0.0.1:$HTTP_PORT/api/v1/status" >"$T/status.json"; then
            python3 - "$T/status.json" "$alloc" <<'EOF' && seen_api=1
import json, sys
st = [p for p in json.load(open(sys.argv[1])) if p["name"] == "tank"][0]["scan"]
alloc = int(sys.argv[2])
if st["state"] != "scanning":
    sys.exit(1)
p = st["progress"]
assert 0.9 * alloc <= st["to_examine_bytes"] <= 1.1 * alloc, f"total {st['to_examine_bytes']} is not the allocated {alloc}"
assert st["issued_bytes"] <= st["to_examine_bytes"] and st["examined_bytes"] <= st["to_examine_bytes"], st
assert 0.0 <= p["percent_done"] <= 100.0, p
assert abs(p["percent_done"] - 100.0 * st["issued_bytes"] / p["issue_total_bytes"]) < 0.01, p
for k in ("scan_rate_bytes_per_s", "issue_rate_bytes_per_s", "seconds_left"):
    assert k in p, (k, p)
EOF
        fi
    fi
    sleep 0.3
done
[ -f "$T/st.progress" ] || fail "the scrub was never seen in progress"
cat "$T/st.progress"
[ -n "$seen_rate" ] || fail "no issue rate shown during the scrub"
[ -n "$seen_to_go" ] || log "note: the issue rate stayed under 10 MiB/s (a loaded machine): no time to go was due"
[ -n "$seen_api" ] || fail "/api/v1/status never showed the scrub's progress with the allocated total"
# the total shown is ALLOC (nicebytes of pool list's figure), not twice it
total=$(grep -Po '\t\S+ / \K\S+(?= scanned)' "$T/st.progress")
[ "$total" = "$(z pool list -H -o alloc tank)" ] || log "note: total $total, alloc now $(z pool list -H -o alloc tank)"
wait_scrub_done
grep -q 'scan: scrub repaired 0B in .* with 0 errors' "$T/st" || { cat "$T/st"; fail "a clean scrub repaired something"; }

# (4) one side of the mirror scribbled behind the pool: the scrub repairs it, and the
# checksum counter of that vdev (only) rises in /metrics
dd if=/dev/urandom of="$T/disks/a0" bs=1M count=16 seek=64 conv=notrunc oflag=direct status=none
z pool scrub tank
wait_scrub_done
cat "$T/st"
grep -Eq 'scan: scrub repaired [1-9][0-9.]*[KMG] in .* with 0 errors' "$T/st" || fail "the scrub repaired nothing"
grep -q 'errors: No known data errors' "$T/st" || fail "data errors after the repair"
cks=$(awk '$1 ~ /disks\/a0$/ {print $5}' "$T/st")
[ -n "$cks" ] && [ "$cks" != 0 ] || fail "pool status: no CKSUM errors on a0"
metrics
a0=$(metric "^zpool_stats_cksum_errors_total\\{name=\"tank\",$A0\\}")
a1=$(metric "^zpool_stats_cksum_errors_total\\{name=\"tank\",$A1\\}")
log "cksum errors on /metrics: a0 $a0, a1 $a1 (status: $cks)"
[ "$a0" -gt 0 ] || fail "/metrics: a0's checksum counter did not rise"
curl -sf "http://127.0.0.1:$HTTP_PORT/api/v1/status" >"$T/status.json" || fail "/api/v1/status"
exact=$(python3 - "$T/status.json" <<'EOF'
import json, sys
def walk(nodes):
    for n in nodes:
        yield n
        yield from walk(n["children"])
st = [p for p in json.load(open(sys.argv[1])) if p["name"] == "tank"][0]
print([n["cksum_errors"] for n in walk(st["config"]) if n["name"].endswith("disks/a0")][0])
EOF
)
[ "$a0" = "$exact" ] || fail "/metrics ($a0) and pool status ($exact, shown as $cks) disagree on a0's checksum errors"
[ "$a1" = 0 ] || fail "/metrics: a1's checksum counter rose: $a1"
[ "$(metric '^zfs_pool_scrub_repaired_bytes\{pool="tank"\}')" -gt 0 ] || fail "zfs_pool_scrub_repaired_bytes"
[ "$(metric '^zfs_pool_scrub_last_completed_timestamp_seconds\{pool="tank"\}')" -gt 0 ] || fail "no completion time"
nbdcopy "$(nbd_unix_uri tank/v)" "$T/back"
cmp -n $((128 << 20)) "$T/data" "$T/back" || fail "data differs after the repair"
stop_daemon
log "metrics, L2ARC rebuild counters and scan progress OK"
