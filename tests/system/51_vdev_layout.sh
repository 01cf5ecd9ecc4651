#!/usr/bin/env bash
# Goal: `pool add` keeps a pool's replication level as zpool does: a lone disk added to
# a pool of mirrors (the forgotten `log` or `cache`) is refused with zpool's words
# unless -f; log, cache and spare devices are not held to the data vdevs' level; -n
# prints the configuration the pool would have and changes nothing.
. "$(dirname "$0")/lib.sh"
start_daemon
make_pool tank 128M
d=$T/disks
truncate -s 128M "$d/d7" "$d/d8" "$d/d9" "$d/log0" "$d/cache0"

rc=0
z pool add tank "$d/d7" 2>"$T/err" || rc=$?
cat "$T/err"
[ $rc -ne 0 ] || fail "a lone disk was added to a pool of mirrors without -f"
grep -qx "zilla: invalid vdev specification" "$T/err" || fail "first line is not zpool's 'invalid vdev specification'"
grep -qx "use '-f' to override the following errors:" "$T/err" || fail "no -f hint line"
grep -qx "mismatched replication level: pool uses mirror and new vdev is disk" "$T/err" || fail "no mismatch line"
rc=0
z pool add tank mirror "$d/d7" "$d/d8" "$d/d9" 2>"$T/err" || rc=$?
[ $rc -ne 0 ] || fail "a 3-way mirror was added to a pool of 2-way mirrors without -f"
grep -qx "mismatched replication level: pool uses 2-way mirror and new vdev uses 3-way mirror" "$T/err" || { cat "$T/err"; fail "width mismatch line"; }
z pool status tank | grep -q d7 && fail "the refused add changed the pool"

# -n: the layout, nothing changed
z pool add -n tank mirror "$d/d7" "$d/d8" log "$d/log0" | tee "$T/n"
printf 'would update '"'"'tank'"'"' to the following configuration:\n\ttank\n\t  mirror-0\n\t    %s\n\t    %s\n\t  mirror-1\n\t    %s\n\t    %s\n\t  mirror-2\n\t    %s\n\t    %s\n\tlogs\n\t  %s\n' \
    "$d/tank-a0" "$d/tank-a1" "$d/tank-b0" "$d/tank-b1" "$d/d7" "$d/d8" "$d/log0" >"$T/n.want"
diff "$T/n.want" "$T/n" || fail "add -n output differs from zpool's shape"
z pool status tank | grep -Eq 'd7|log0' && fail "add -n changed the pool"
# -n still checks the replication
rc=0
z pool add -n tank "$d/d7" 2>"$T/err" >/dev/null || rc=$?
[ $rc -ne 0 ] && grep -q "mismatched replication level" "$T/err" || fail "add -n of a lone disk was not refused"

# log, cache and spare are not data: no -f needed
z pool add tank log "$d/log0" cache "$d/cache0"
z pool status tank | tee "$T/st"
grep -Pzq '\tlogs\n\t  \S*log0 +ONLINE' "$T/st" || fail "log not added"
# -f overrides
z pool add -f tank "$d/d9"
z pool status tank | grep -Eq "^\s+\S*d9 +ONLINE" || fail "add -f did not add d9"
log "ok"
