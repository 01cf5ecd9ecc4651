#!/usr/bin/env bash
# Goal: the edges of names, values and the exposition format.
# Method: a leaf path with a newline is refused at create (no label can hold it); a pool
# whose leaf paths hold a right-to-left override, a backslash and a double quote must
# still give a /metrics that a Prometheus parser accepts (python3-prometheus-client's
# text parser when installed, else a strict line parser) and that names the leaves;
# volume names '.', '..', '-V' are refused (CLI and API); volblocksize 512 and 2K are
# refused by the CLI and the API with the 4K..128K range the docs state, 4K and 128K
# accepted; a 900 kB bad value comes back clipped (an error under 400 bytes; 1.5 MB hits the body limit); an
# out-of-range tunable is refused with its range; `volume create` without -s makes a
# thick volume (refreservation set) and prints nothing.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../tools/memory_bound.sh"
start_daemon
NL=$'\n'
RLO=$'\u202e'
truncate -s 128M "$T/disks/new${NL}line" "$T/disks/plain0"
expect_error "control character" z pool create edge0 mirror "$T/disks/new${NL}line" "$T/disks/plain0"
odd=("$T/disks/rl${RLO}o" "$T/disks/back\\slash" "$T/disks/quo\"te" "$T/disks/plain")
for f in "${odd[@]}"; do truncate -s 128M "$f"; done
z pool create edge mirror "${odd[0]}" "${odd[1]}" mirror "${odd[2]}" "${odd[3]}"
curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$T/metrics"
grep -q '^zilla_dmu_tx_dirty_max_bytes{pool="edge"} [1-9]' "$T/metrics" || fail "no write-throttle gauges in /metrics"
grep -q '^zilla_dmu_tx_dirty_delay_total{pool="edge"} ' "$T/metrics" || fail "no dmu_tx counters in /metrics"
grep -q '^zilla_vdev_queue_active{name="edge",vdev="root",class="trim"} 0$' "$T/metrics" || fail "no per-class queue depth in /metrics"
grep -q '^zilla_vdev_aggregated_total{name="edge",vdev="root",class="async_write"} ' "$T/metrics" || fail "no aggregation counter in /metrics"
parser=/usr/bin/python3
$parser -c 'import prometheus_client' 2>/dev/null || parser=
METRICS="$T/metrics" PARSER=${parser:+yes} python3 - <<'PY' || fail "/metrics does not parse"
import os, re, sys
text = open(os.environ["METRICS"], encoding="utf-8").read()
assert text.endswith("# EOF\n"), "no # EOF at the end"
# Strict line grammar of the text format: comments, or name{labels} value.
label = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{(' + label + r')(,' + label + r')*\})? -?[0-9.eE+-]+(\.[0-9]+)?$')
for n, line in enumerate(text.splitlines(), 1):
    if line.startswith("# ") or line == "# EOF":
        continue
    assert sample.match(line), "line %d does not parse: %r" % (n, line)
print("strict line parser: %d lines OK" % len(text.splitlines()))
PY
if [ -n "$parser" ]; then
    METRICS="$T/metrics" $parser - <<'PY' || fail "/metrics rejected by prometheus_client"
import os
from prometheus_client.openmetrics.parser import text_string_to_metric_families
text = open(os.environ["METRICS"], encoding="utf-8").read()
vdevs = set()
for family in text_string_to_metric_families(text):
    for s in family.samples:
        if "vdev" in s.labels:
            vdevs.add(s.labels["vdev"])
for want in ("rl\\u{202e}o", "back\\slash", 'quo"te'):
    assert any(want in v for v in vdevs), "leaf %r not in the vdev labels %r" % (want, sorted(vdevs))
print("prometheus_client: parsed, %d vdev labels" % len(vdevs))
PY
else
    log "python3-prometheus-client not installed: strict line parser only"
fi
grep -q 'back\\\\slash' "$T/metrics" || fail "backslash not escaped in /metrics"
grep -q 'rl\\\\u{202e}o' "$T/metrics" || fail "right-to-left override not escaped in /metrics"

# Volume names.
for bad in . .. -V; do
    expect_error "invalid volume name" z volume create -s -V 16M -- "edge/$bad"
done
api_post() { # PATH JSON -> prints "STATUS BODY"
    curl -s --max-time 5 --unix-socket "$STATE/zilla.sock" -H 'content-type: application/json' \
        -o "$T/api.body" -w '%{http_code}' -d @- "http://zilla$1" <<<"$2"
}
for bad in . .. -V -x; do
    code=$(api_post /v1/volumes "{\"name\":\"edge/$bad\",\"volsize\":16777216,\"volblocksize\":16384,\"sparse\":true,\"props\":[]}")
    [ "$code" = 400 ] || fail "API accepted volume name '$bad' ($code $(cat "$T/api.body"))"
done

# volblocksize: what the docs say (4K..128K) is what the CLI, API and engine do.
grep -q "a power of two, 4K..128K" "$ROOT/docs/cli.md" || fail "docs/cli.md does not state volblocksize 4K..128K"
for bs in 512 2K 256K; do
    expect_error "from 4K to 128K" z volume create -s -V 16M -b "$bs" edge/bs
    expect_error "from 4K to 128K" z volume create -s -V 16M -o volblocksize="$bs" edge/bs
done
z volume create -s -V 16M -b 4K edge/bs4k
z volume create -s -V 16M -b 128K edge/bs128k
[ "$(z get -H -p volblocksize edge/bs4k | cut -f3)" = 4096 ] || fail "4K volblocksize not kept"

# A bad value comes back clipped: 1.5 MB is over the body limit (413, short), 900 kB
# reaches the validators, a 100 kB argument the CLI.
huge=$(head -c 1500000 /dev/zero | tr '\0' x)
code=$(api_post /v1/volumes "{\"name\":\"edge/$huge\",\"volsize\":16777216,\"volblocksize\":16384,\"sparse\":true,\"props\":[]}")
[ "$code" = 413 ] && (($(stat -c %s "$T/api.body") < 400)) || fail "1.5 MB body: $code, $(stat -c %s "$T/api.body") bytes back"
big=$(head -c 900000 /dev/zero | tr '\0' x)
for route in volumes pools; do
    code=$(api_post "/v1/$route" "{\"name\":\"edge/$big\",\"volsize\":16777216,\"volblocksize\":16384,\"sparse\":true,\"props\":[],\"tops\":[],\"force\":false}")
    size=$(stat -c %s "$T/api.body")
    log "900 kB name to /v1/$route: $code, $size bytes back: $(head -c 120 "$T/api.body")"
    [ "$code" -ge 400 ] && ((size < 400)) || fail "/v1/$route echoed $size bytes for a 900 kB value"
done
code=$(api_post /v1/set "{\"name\":\"edge/bs4k\",\"property\":\"sync\",\"value\":\"$big\"}")
size=$(stat -c %s "$T/api.body")
[ "$code" = 400 ] && ((size < 400)) || fail "/v1/set echoed $size bytes for a 900 kB value ($code)"
log "900 kB property value to /v1/set: $code, $size bytes back: $(head -c 120 "$T/api.body")"
z set "sync=${big:0:100000}" edge/bs4k 2>"$T/err" && fail "a 100 kB property value was accepted"
(($(stat -c %s "$T/err") < 400)) || fail "the CLI printed $(stat -c %s "$T/err") bytes for a 100 kB value"

# Tunables: out of range refused with the range.
expect_error "range|between|allowed" z tunable set zfs_vdev_max_active=0
expect_error "range|between|allowed" z tunable set zfs_arc_max=4096
z tunable set zfs_vdev_max_active=1000

# Without -s the volume is thick: it has a reservation, and the CLI prints nothing.
z volume create -V 16M edge/nos 2>"$T/note"
[ ! -s "$T/note" ] || fail "volume create without -s printed: $(cat "$T/note")"
[ "$(z get -H -p refreservation edge/nos | cut -f3)" -gt $((16 << 20)) ] || fail "a volume created without -s has no reservation"
[ "$(z get -H refreservation edge/bs4k | cut -f3)" = none ] || fail "a -s volume has a reservation"
log "edges OK"
