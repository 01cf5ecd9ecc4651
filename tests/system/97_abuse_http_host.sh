#!/usr/bin/env bash
# Goal: a web page whose name rebinds to 127.0.0.1 (DNS rebinding) can neither read nor
# change anything on the HTTP port, and another site's page cannot change settings
# (cross-site writes).
# Method: requests with `Host: attacker.example:PORT` on pages, static files, the API,
# /metrics and an unknown path must be refused with 421, also the PUT that turns an
# analytics dataset on (and the dataset stays off); IP literals, localhost and a name
# from http_allowed_hosts are answered. A PUT whose Origin is another site (or another
# port of this address, or "null") is refused with 403 and changes nothing; the
# page's own origin, and a configured name, may.
. "$(dirname "$0")/lib.sh"
start_daemon
BASE=http://127.0.0.1:$HTTP_PORT
DS=/api/v1/analytics/datasets/io.ops/client

# code HOST PATH [curl options...]: the status of a GET (or what the options make it);
# an empty HOST sends no Host header
code() {
    local host=$1 path=$2; shift 2
    curl -s -o "$T/body" -w '%{http_code}' --max-time 10 -H "Host:${host:+ $host}" "$@" "$BASE$path"
}
expect() { # WANT WHAT GOT
    [ "$3" = "$1" ] || fail "$2: HTTP $3, expected $1 ($(head -c 300 "$T/body"))"
}
enabled() { # is io.ops/client on?
    curl -sf "$BASE/api/v1/analytics/datasets" |
        python3 -c 'import json,sys; print([d["enabled"] for d in json.load(sys.stdin)["datasets"] if d["name"] == "io.ops/client"][0])'
}
put() { # HOST ORIGIN(or -) ENABLED
    local origin=()
    [ "$2" = - ] || origin=(-H "Origin: $2")
    code "$1" "$DS" -X PUT -H 'content-type: application/json' "${origin[@]}" -d "{\"enabled\": $3}"
}

# --- 1. a foreign name is refused on every route --------------------------------------
for path in / /status /ui/worksheet /ui/assets/dashboard.js /api/v1/info /api/v1/pools /api/v1/volumes \
    /api/v1/clients /api/v1/analytics/datasets "/api/v1/analytics/live?dataset=io.ops/op" /metrics /no/such/page; do
    expect 421 "GET $path with a foreign Host" "$(code "attacker.example:$HTTP_PORT" "$path")"
done
grep -q "not a name of this server" "$T/body" || fail "the refusal does not say why: $(cat "$T/body")"
expect 421 "GET /metrics with a foreign Host without a port" "$(code attacker.example /metrics)"
expect 421 "a name ending in an address" "$(code "127.0.0.1.nip.io:$HTTP_PORT" /api/v1/volumes)"
expect 421 "an absolute URI naming a foreign host" \
    "$(curl -s -o "$T/body" -w '%{http_code}' --request-target "http://attacker.example:$HTTP_PORT/api/v1/volumes" "$BASE/")"
[ "$(enabled)" = False ] || fail "io.ops/client is on before the test"
expect 421 "PUT with a foreign Host" "$(put "attacker.example:$HTTP_PORT" "http://attacker.example:$HTTP_PORT" true)"
expect 421 "PUT with a foreign Host and no Origin" "$(put "attacker.example:$HTTP_PORT" - true)"
[ "$(enabled)" = False ] || fail "a request for a foreign Host turned a dataset on"
log "a foreign Host is refused (421) on pages, assets, API, /metrics and the PUT"

# --- 2. IP literals and localhost are answered; a missing Host only for HTTP/1.0 --------
for host in "127.0.0.1:$HTTP_PORT" 127.0.0.1 "[::1]:$HTTP_PORT" "localhost:$HTTP_PORT" LOCALHOST. "ui.localhost:$HTTP_PORT"; do
    for path in / /api/v1/volumes /api/v1/clients /metrics /ui/assets/dashboard.js; do
        expect 200 "GET $path with Host $host" "$(code "$host" "$path")"
    done
done
expect 400 "HTTP/1.1 without a Host" "$(code '' /api/v1/volumes)"
expect 200 "HTTP/1.0 without a Host" "$(code '' /api/v1/volumes --http1.0)"
expect 400 "a malformed Host" "$(code 'a b:1' /api/v1/volumes)"
log "IP literals, localhost and *.localhost answered; HTTP/1.1 without Host refused (400)"

# --- 3. writes check the Origin a browser sends -------------------------------------
for origin in "http://attacker.example:$HTTP_PORT" http://attacker.example "http://127.0.0.1:$((HTTP_PORT + 1))" \
    "http://localhost:$HTTP_PORT" http://203.0.113.9 null; do
    expect 403 "PUT from origin $origin" "$(put "127.0.0.1:$HTTP_PORT" "$origin" true)"
done
[ "$(enabled)" = False ] || fail "a PUT from a foreign origin turned a dataset on"
expect 200 "PUT from the page's own origin" "$(put "127.0.0.1:$HTTP_PORT" "http://127.0.0.1:$HTTP_PORT" true)"
[ "$(enabled)" = True ] || fail "a same-origin PUT did not turn the dataset on"
expect 200 "PUT from localhost's own origin" "$(put "localhost:$HTTP_PORT" "http://localhost:$HTTP_PORT" false)"
expect 200 "PUT without an Origin (not a browser)" "$(put "127.0.0.1:$HTTP_PORT" - false)"
[ "$(enabled)" = False ] || fail "the dataset did not turn off again"
log "a PUT from a foreign origin is refused (403); the page's own origin works"

# --- 4. a configured name ----------------------------------------------------------
stop_daemon
cat >"$T/zilla.conf" <<'EOF'
http_allowed_hosts = "zilla.test, nas.example"
EOF
start_daemon --config "$T/zilla.conf"
for path in / /api/v1/volumes /metrics; do
    expect 200 "GET $path with a configured Host" "$(code "zilla.test:$HTTP_PORT" "$path")"
    expect 200 "GET $path with a configured Host in capitals" "$(code NAS.example "$path")"
    expect 421 "GET $path with a name not configured" "$(code "attacker.example:$HTTP_PORT" "$path")"
done
grep -q "zilla.test" "$T/body" || fail "the refusal does not name the allowed hosts: $(cat "$T/body")"
expect 200 "PUT through a proxy named in http_allowed_hosts" "$(put "127.0.0.1:$HTTP_PORT" https://nas.example true)"
expect 403 "PUT from a foreign origin with a configured Host" "$(put "zilla.test:$HTTP_PORT" "http://attacker.example:$HTTP_PORT" false)"
[ "$(enabled)" = True ] || fail "a PUT from a foreign origin changed the dataset"
echo 'http_allowed_hosts = "nas:8080"' >"$T/bad.conf"
timeout 20 "$ZILLA" --state-dir "$T/other" serve --nbd off --iscsi off --http "127.0.0.1:0" --config "$T/bad.conf" >"$T/bad.log" 2>&1 &&
    fail "a host with a port in http_allowed_hosts was accepted"
grep -q "is not a host name" "$T/bad.log" || fail "no reason for the refused setting: $(cat "$T/bad.log")"
stop_daemon
log "names from http_allowed_hosts answered, others refused; a bad entry refuses the start"
