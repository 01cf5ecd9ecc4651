#!/usr/bin/env bash
# Goal (issue 14 row 4): the state directory is private whatever the umask: created
# 0700, admin and NBD sockets 0600, lock and cache files 0600; a symlink planted at the
# cache's temp-file name is not followed; a directory another user owns or can write is
# refused; another user cannot reach the admin API.
. "$(dirname "$0")/lib.sh"

mode() { stat -c %a "$1"; }
umask 000
start_daemon
umask 022
[ "$(mode "$STATE")" = 700 ] || fail "state dir mode $(mode "$STATE"), want 700"
[ "$(mode "$STATE/zilla.sock")" = 600 ] || fail "admin socket mode $(mode "$STATE/zilla.sock"), want 600"
[ "$(mode "$STATE/nbd.sock")" = 600 ] || fail "NBD socket mode $(mode "$STATE/nbd.sock"), want 600"
[ "$(mode "$STATE/zilla.lock")" = 600 ] || fail "lock file mode $(mode "$STATE/zilla.lock"), want 600"
log "umask 000: dir 700, sockets 600, lock 600"

# A symlink at the temp-file name, pointing at a file the daemon must not overwrite.
printf 'precious\n' >"$T/victim"
ln -s "$T/victim" "$STATE/zilla.cache.tmp"
make_pool tank 128M
[ "$(cat "$T/victim")" = precious ] || fail "the daemon wrote through the planted symlink: $(head -c 200 "$T/victim")"
[ -f "$STATE/zilla.cache" ] && [ ! -L "$STATE/zilla.cache" ] || fail "zilla.cache is not a regular file"
grep -q '"tank"' "$STATE/zilla.cache" || fail "zilla.cache does not list tank"
[ ! -e "$STATE/zilla.cache.tmp" ] || fail "zilla.cache.tmp left behind"
[ "$(mode "$STATE/zilla.cache")" = 600 ] || fail "cache file mode $(mode "$STATE/zilla.cache"), want 600"
grep -q "removing a symlink at $STATE/zilla.cache.tmp" "$T/daemon.log" || fail "no log line about the planted symlink"
log "planted symlink not followed; cache written"

# Another user cannot use the admin API (needs an unprivileged account).
if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
    rc=0
    setpriv --reuid=nobody --regid=nogroup --clear-groups "$ZILLA" --state-dir "$STATE" pool list \
        >"$T/nobody.out" 2>&1 || rc=$?
    [ $rc -ne 0 ] || fail "user nobody listed pools through the admin socket: $(cat "$T/nobody.out")"
    log "user nobody refused: $(cat "$T/nobody.out")"
fi
stop_daemon

# A directory others can write, or another user owns, is refused at start.
refused() { # PATTERN
    local rc=0
    timeout 20 "$ZILLA" --state-dir "$STATE" serve --nbd off --http off --iscsi off >"$T/start.out" 2>&1 || rc=$?
    [ $rc -ne 0 ] || fail "daemon started on a bad state directory"
    grep -Eq -- "$1" "$T/start.out" || fail "start error '$(cat "$T/start.out")' does not match /$1/"
    log "refused: $(grep zilla: "$T/start.out")"
}
chmod 777 "$STATE"
refused "state directory .* is writable by other users \(mode 0777\)"
chmod 770 "$STATE"
refused "writable by other users \(mode 0770\)"
chmod 700 "$STATE"
if id nobody >/dev/null 2>&1; then
    chown nobody "$STATE"
    refused "state directory .* is owned by uid [0-9]+, not by this user"
    chown root "$STATE"
fi
start_daemon
z pool list -H | grep -q '^tank' || fail "tank not imported after restart"
