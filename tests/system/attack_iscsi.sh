#!/usr/bin/env bash
# Adversarial iSCSI login / data-phase cases (not part of tests/run: no number prefix).
# Runs every case of iscsi_attack.py against one daemon and prints HELD/FAILED lines.
# Usage: tests/system/attack_iscsi.sh [CASE...]
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
TIMEOUT_S=2
printf 'iscsi_data_out_timeout_s = %s\n' "$TIMEOUT_S" >"$T/zilla.conf"
start_daemon --config "$T/zilla.conf"
make_pool tank 128M
make_volume tank/a 16M
make_volume tank/b 16M
A=iqn.2026-11.io.zilla:tank.a
B=iqn.2026-11.io.zilla:tank.b
GOOD=iqn.2026-11.org.good:h1
SECRET=Chap-Secret-0123
printf '%s\n' "$SECRET" >"$T/secret"
z iscsi auth tank/a --user alice --secret-file "$T/secret" --initiator "$GOOD" >/dev/null
z iscsi auth tank/b --initiator "$GOOD" >/dev/null
PY="python3 $(dirname "$0")/iscsi_attack.py 127.0.0.1:$ISCSI_PORT"
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(identity stage-case malformed burst cross-data-out abort-data-out slow-progress starve isid-change reject-flood)
bad=0
for c in "${cases[@]}"; do
    extra=()
    case $c in slow-progress | starve) extra=("$TIMEOUT_S") ;; reject-flood) extra=("$DAEMON_PID") ;; esac
    log "case $c"
    timeout 120 $PY "$c" "$A" "$B" "$GOOD" alice "$SECRET" "${extra[@]}" || bad=$((bad + 1))
    if [ "$c" = stage-case ]; then
        z iscsi list -H sessions | grep -i evil && { echo "FAILED stage-case: a session runs as EVIL"; bad=$((bad + 1)); }
    fi
    kill -0 "$DAEMON_PID" || fail "daemon died during $c"
done
grep -c "" "$T/daemon.log" | xargs echo "daemon log lines:"
grep -E "WARN|ERROR|panic" "$T/daemon.log" | sort | uniq -c | sort -rn | head -20
cp "$T/daemon.log" /tmp/attack-iscsi-daemon.log
stop_daemon
echo "cases failed: $bad"
