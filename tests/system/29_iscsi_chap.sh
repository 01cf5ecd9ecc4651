#!/usr/bin/env bash
# Goal: CHAP and initiator lists keep unauthorised initiators off a target, with
# libiscsi as the initiator; settings live in a private file, survive a restart and
# never reach the log; `zilla iscsi list` shows targets and live sessions; a target
# without CHAP is open on loopback only unless the daemon runs with --iscsi-auth none.
# Method: tank/vol gets a CHAP user: a login with the right secret works, with a wrong
# secret or none it fails, tank/open (no CHAP) stays open; an initiator list without
# our initiator name refuses it; mutual CHAP with libiscsi's target credentials works;
# the default entry guards discovery; iscsi-perf keeps a session open while
# `zilla iscsi list sessions` shows it; the daemon is restarted on 0.0.0.0 (not
# loopback): tank/open refuses, then with --iscsi-auth none (or iscsi_auth = none in
# the config file) takes logins and the log warns once.
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
start_daemon
make_pool tank 128M
make_volume tank/vol 16M
make_volume tank/open 16M
HOST=127.0.0.1:$ISCSI_PORT
TARGET=iqn.2026-11.io.zilla:tank.vol
OPEN=iqn.2026-11.io.zilla:tank.open
SECRET=Chap-Secret-0123
MUTUAL_SECRET=Mutual-Secret-4567
DEFAULT_SECRET=Default-Secret-89ab
printf '%s\n' "$SECRET" >"$T/secret"
printf '%s' "$MUTUAL_SECRET" >"$T/mutual"
printf '%s\n' "$DEFAULT_SECRET" >"$T/default"
printf 'short\n' >"$T/short"
ALLOWED=iqn.2026-11.org.example:allowed
OTHER=iqn.2026-11.org.example:other

# inq URL [extra iscsi-inq args...]: one INQUIRY; output in $T/inq
inq() { local url=$1; shift; timeout 20 iscsi-inq "$@" "$url" >"$T/inq" 2>&1; }
auth_failed() { grep -qi "authentication failure\|authorization failure\|login failed\|failed to log in" "$T/inq"; }
metric() { curl -s "http://127.0.0.1:$HTTP_PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# No CHAP yet: open on a loopback address.
inq "iscsi://$HOST/$TARGET/0" || fail "login without CHAP configured failed: $(cat "$T/inq")"

# Bad settings are refused with one line and change nothing.
expect_error "12 to 255 bytes" z iscsi auth tank/vol --user alice --secret-file "$T/short"
# a device named by mistake: read no further than a secret can be
expect_error "12 to 255 bytes" timeout 10 "$ZILLA" --state-dir "$STATE" iscsi auth tank/vol --user alice --secret-file /dev/zero
expect_error "not an iSCSI name" z iscsi auth tank/vol --user alice --secret-file "$T/secret" --initiator bogus
expect_error "mutual CHAP needs" z iscsi auth tank/vol --mutual-user tgt --mutual-secret-file "$T/mutual"
inq "iscsi://$HOST/$TARGET/0" || fail "a refused change took effect: $(cat "$T/inq")"

# One-way CHAP on tank/vol.
z iscsi auth tank/vol --user alice --secret-file "$T/secret" | tee "$T/auth"
grep -q "^auth *chap$" "$T/auth" || fail "auth summary: $(cat "$T/auth")"
if grep -qF "$SECRET" "$T/auth"; then fail "the CLI printed the secret"; fi
[ "$(stat -c %a "$STATE/iscsi-auth.json")" = 600 ] || fail "iscsi-auth.json mode $(stat -c %a "$STATE/iscsi-auth.json")"
[ ! -e "$STATE/iscsi-auth.json.tmp" ] || fail "a temp file was left behind"

inq "iscsi://alice%$SECRET@$HOST/$TARGET/0" || fail "CHAP login with the right secret failed: $(cat "$T/inq")"
grep -qi "vendor\|Peripheral" "$T/inq" || fail "no INQUIRY data: $(cat "$T/inq")"
if inq "iscsi://alice%Wrong-Secret-000@$HOST/$TARGET/0"; then fail "CHAP login with a wrong secret succeeded"; fi
auth_failed || fail "wrong secret: no authentication failure: $(cat "$T/inq")"
if inq "iscsi://bob%$SECRET@$HOST/$TARGET/0"; then fail "CHAP login as a wrong user succeeded"; fi
if inq "iscsi://$HOST/$TARGET/0"; then fail "login without credentials to a CHAP target succeeded"; fi
auth_failed || fail "no credentials: no authentication failure: $(cat "$T/inq")"
inq "iscsi://$HOST/$OPEN/0" || fail "the target without CHAP stopped serving: $(cat "$T/inq")"
timeout 20 iscsi-ls -s "iscsi://alice%$SECRET@$HOST" >"$T/ls" 2>&1 || fail "iscsi-ls with credentials failed: $(cat "$T/ls")"
grep -q "^Target:$TARGET " "$T/ls" || fail "iscsi-ls does not list $TARGET: $(cat "$T/ls")"
grep -A3 "^Target:$TARGET " "$T/ls" | grep -q "Lun:0" || fail "iscsi-ls -s shows no LUN of $TARGET: $(cat "$T/ls")"
[ "$(metric zilla_iscsi_logins_auth_failed_total)" -ge 3 ] || fail "logins_auth_failed $(metric zilla_iscsi_logins_auth_failed_total), expected >= 3"

# An initiator list (the CHAP user stays).
z iscsi auth "$TARGET" --initiator "$ALLOWED" >/dev/null
inq "iscsi://alice%$SECRET@$HOST/$TARGET/0" -i "$ALLOWED" || fail "an allowed initiator was refused: $(cat "$T/inq")"
if inq "iscsi://alice%$SECRET@$HOST/$TARGET/0" -i "$OTHER"; then fail "an initiator off the list logged in"; fi
auth_failed || fail "initiator off the list: no authorization failure: $(cat "$T/inq")"
# discovery shows the target to the allowed initiator only
timeout 20 iscsi-ls -i "$ALLOWED" "iscsi://alice%$SECRET@$HOST" >"$T/ls-allowed" 2>&1 || fail "discovery by the allowed initiator failed: $(cat "$T/ls-allowed")"
grep -q "^Target:$TARGET " "$T/ls-allowed" || fail "discovery hides $TARGET from the allowed initiator"
timeout 20 iscsi-ls -i "$OTHER" "iscsi://alice%$SECRET@$HOST" >"$T/ls-other" 2>&1 || true
if grep -q "^Target:$TARGET " "$T/ls-other"; then fail "discovery shows $TARGET to an initiator off its list"; fi

# Mutual CHAP: the target proves its own secret to libiscsi.
z iscsi auth "$TARGET" --mutual-user tgt --mutual-secret-file "$T/mutual" | tee "$T/auth"
grep -q "^auth *mutual$" "$T/auth" || fail "auth summary: $(cat "$T/auth")"
LIBISCSI_CHAP_TARGET_USERNAME=tgt LIBISCSI_CHAP_TARGET_PASSWORD=$MUTUAL_SECRET \
    inq "iscsi://alice%$SECRET@$HOST/$TARGET/0" -i "$ALLOWED" || fail "mutual CHAP login failed: $(cat "$T/inq")"
if LIBISCSI_CHAP_TARGET_USERNAME=tgt LIBISCSI_CHAP_TARGET_PASSWORD=Not-The-Target-1 \
    inq "iscsi://alice%$SECRET@$HOST/$TARGET/0" -i "$ALLOWED"; then
    fail "libiscsi accepted a target that proved the wrong mutual secret"
fi

# The listing: targets, then a live session held by iscsi-perf.
z iscsi list targets -H >"$T/targets"
grep -qP "^$TARGET\ttank/vol\tyes\tmutual\t1$" "$T/targets" || fail "targets listing: $(cat "$T/targets")"
grep -qP "^$OPEN\ttank/open\tyes\tnone\t0$" "$T/targets" || fail "targets listing: $(cat "$T/targets")"
timeout 30 iscsi-perf -i "$ALLOWED" -t 6 "iscsi://alice%$SECRET@$HOST/$TARGET/0" >"$T/perf" 2>&1 &
PERF=$!
on_exit "kill $PERF"
seen=
for _ in $(seq 50); do
    z iscsi list -H sessions >"$T/sessions"
    if grep -qP "^$ALLOWED\t[0-9a-f]{12}\t[1-9][0-9]*\t127\.0\.0\.1:[0-9]+\t$TARGET\tchap\t" "$T/sessions"; then seen=1; break; fi
    sleep 0.1
done
[ -n "$seen" ] || fail "no session of $ALLOWED listed: $(cat "$T/sessions")"
z iscsi list sessions | tee "$T/sessions_table"
head -1 "$T/sessions_table" | grep -q "INITIATOR *ISID *TSIH *PEER *TARGET *AUTH *MAXRECVDSL *MAXBURST *FIRSTBURST *IMMDATA *INITR2T *HDRDIGEST *DATADIGEST" ||
    fail "sessions header: $(head -1 "$T/sessions_table")"
wait "$PERF" || true
for _ in $(seq 50); do
    z iscsi list -H sessions >"$T/sessions"
    grep -q "$ALLOWED" "$T/sessions" || break
    sleep 0.1
done
if grep -q "$ALLOWED" "$T/sessions"; then fail "a closed session is still listed: $(cat "$T/sessions")"; fi

# The default entry guards discovery (and targets without settings of their own).
z iscsi auth --default --user disco --secret-file "$T/default" >/dev/null
if timeout 20 iscsi-ls "iscsi://$HOST" >"$T/ls" 2>&1; then fail "discovery without credentials succeeded"; fi
timeout 20 iscsi-ls "iscsi://disco%$DEFAULT_SECRET@$HOST" >"$T/ls" 2>&1 || fail "discovery with the default credentials failed: $(cat "$T/ls")"
grep -q "^Target:$OPEN" "$T/ls" || fail "discovery lists no $OPEN: $(cat "$T/ls")"
if inq "iscsi://$HOST/$OPEN/0"; then fail "a target under the default entry took a login without credentials"; fi

# Settings survive a restart; secrets are in the file only, never in the log.
stop_daemon
start_daemon
inq "iscsi://alice%$SECRET@$HOST/$TARGET/0" -i "$ALLOWED" || fail "after restart: CHAP login failed: $(cat "$T/inq")"
if inq "iscsi://$HOST/$TARGET/0" -i "$ALLOWED"; then fail "after restart: login without credentials succeeded"; fi
grep -qF "$SECRET" "$STATE/iscsi-auth.json" || fail "the auth file does not hold the secret"
for s in "$SECRET" "$MUTUAL_SECRET" "$DEFAULT_SECRET"; do
    if grep -qF "$s" "$T/daemon.log"; then fail "a secret is in the daemon log"; fi
done

# --clear: tank/vol and the default are open again.
z iscsi auth tank/vol --clear >/dev/null
z iscsi auth --default --clear >/dev/null
inq "iscsi://$HOST/$TARGET/0" || fail "after --clear: login without credentials failed: $(cat "$T/inq")"

# Not on loopback: a target without CHAP refuses logins unless --iscsi-auth none.
stop_daemon
ISCSI_ADDR=0.0.0.0:$ISCSI_PORT
start_daemon
if inq "iscsi://$HOST/$OPEN/0"; then fail "on 0.0.0.0 a target without CHAP took an unauthenticated login"; fi
auth_failed || fail "on 0.0.0.0: no authentication failure: $(cat "$T/inq")"
z iscsi auth tank/open --user alice --secret-file "$T/secret" >/dev/null
inq "iscsi://alice%$SECRET@$HOST/$OPEN/0" || fail "on 0.0.0.0: CHAP login failed: $(cat "$T/inq")"
z iscsi auth tank/open --clear >/dev/null
if grep -q "not authenticated (--iscsi-auth none)" "$T/daemon.log"; then fail "warned of unauthenticated logins without --iscsi-auth none"; fi
stop_daemon
start_daemon --iscsi-auth none
inq "iscsi://$HOST/$OPEN/0" || fail "with --iscsi-auth none: login failed: $(cat "$T/inq")"
[ "$(grep -c "not authenticated (--iscsi-auth none)" "$T/daemon.log")" -eq 1 ] || fail "no single warning of unauthenticated logins"
# the same from the config file; the command line wins over it
printf 'iscsi_auth = none\n' >"$T/zilla.conf"
stop_daemon
start_daemon --config "$T/zilla.conf"
inq "iscsi://$HOST/$OPEN/0" || fail "with iscsi_auth = none in the config file: login failed: $(cat "$T/inq")"
stop_daemon
start_daemon --config "$T/zilla.conf" --iscsi-auth chap
if inq "iscsi://$HOST/$OPEN/0"; then fail "--iscsi-auth chap did not win over the config file"; fi
echo PASS
