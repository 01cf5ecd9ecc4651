#!/usr/bin/env bash
# Adversarial HTTP cases (not part of tests/run): Host/Origin variants, live-stream
# shares and leaks, a slow live reader. Usage: tests/system/attack_http.sh [CASE...]
. "$(dirname "$0")/lib.sh"
printf 'http_write_stall_timeout_s = 3\n' >"$T/zilla.conf"
start_daemon --config "$T/zilla.conf"
curl -sf -o /dev/null -X PUT -H 'content-type: application/json' -d '{"enabled": true}' \
    "http://127.0.0.1:$HTTP_PORT/api/v1/analytics/datasets/io.ops/op" || fail "cannot enable io.ops/op"
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(hosts origins live-share live-slow)
bad=0
for c in "${cases[@]}"; do
    log "case $c"
    timeout 300 python3 "$(dirname "$0")/http_attack.py" "$HTTP_PORT" "$c" 3 || bad=$((bad + 1))
    kill -0 "$DAEMON_PID" || fail "daemon died during $c"
done
grep -E "WARN|ERROR|panic" "$T/daemon.log" | sed 's/^[^ ]* //' | sort | uniq -c | sort -rn | head
stop_daemon
echo "cases failed: $bad"
