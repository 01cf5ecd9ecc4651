#!/usr/bin/env bash
# Goal: iSCSI initiators discover every volume, log in to its target, see a stable
# identity and the right size, read back what they wrote, and the SCSI and iSCSI core
# families of libiscsi's conformance suite pass.
# Method: a daemon with --iscsi; iscsi-ls (SendTargets), iscsi-inq (standard, VPD
# 0x80/0xb0/0xb2), iscsi-readcapacity16, a refused unknown target, qemu-img convert
# over iscsi:// (and compare after the restart), iscsi-test-cu families (thin provisioning and
# COMPARE AND WRITE must run, not skip), then a restart (same serial).
. "$(dirname "$0")/lib.sh"
ISCSI_PORT=$(free_port)
ISCSI_ADDR=127.0.0.1:$ISCSI_PORT
start_daemon
make_pool tank 256M
make_volume tank/vol0 64M
make_volume tank/Data_1 16M
PORTAL=iscsi://127.0.0.1:$ISCSI_PORT
TARGET=iqn.2026-11.io.zilla:tank.vol0
LUN=$PORTAL/$TARGET/0

# Discovery lists every volume, names lowercased and mapped.
iscsi-ls -s "$PORTAL" | tee "$T/ls"
grep -q "^Target:$TARGET Portal:127.0.0.1:$ISCSI_PORT,1$" "$T/ls" || fail "vol0 not discovered"
grep -q "^Target:iqn.2026-11.io.zilla:tank.data-1 " "$T/ls" || fail "tank/Data_1 not discovered as tank.data-1"
grep -q "Lun:0 *Type:DIRECT_ACCESS" "$T/ls" || fail "LUN 0 is not a direct-access unit"

# Identity and size.
iscsi-inq "$LUN" | tee "$T/inq"
grep -q "^Vendor:ZILLA" "$T/inq" || fail "vendor is not ZILLA"
grep -q "^CmdQue:1" "$T/inq" || fail "command queueing not reported"
serial=$(iscsi-inq --evpd=1 --pagecode=128 "$LUN" | sed -n 's/^Unit Serial Number:\[\(.*\)\]$/\1/p')
[ ${#serial} -eq 16 ] || fail "unit serial '$serial' is not 16 characters"
# every VPD page the target lists answers, and the list is the one documented
iscsi-inq --evpd=1 --pagecode=0 "$LUN" | tee "$T/vpd0"
for page in 0x00 0x80 0x83 0xb0 0xb1 0xb2; do
    grep -qi "$page" "$T/vpd0" || fail "VPD page $page is not in the supported pages list"
    iscsi-inq --evpd=1 --pagecode=$((page)) "$LUN" >"$T/vpd-$page" || fail "VPD page $page does not answer"
done
grep -q "iqn.2026-11.io.zilla:tank.vol0" "$T/vpd-0x83" || fail "VPD 0x83 does not name the target"
iscsi-inq --evpd=1 --pagecode=176 "$LUN" | tee "$T/limits"
grep -q "^optimal transfer length granularity:32$" "$T/limits" || fail "granularity is not the 16K volblocksize"
iscsi-readcapacity16 "$LUN" | tee "$T/cap"
grep -q "^Total size:$((64 << 20))$" "$T/cap" || fail "capacity is not 64M"
grep -q "LOGICAL BLOCK LENGTH IN BYTES:512" "$T/cap" || fail "logical block is not 512 bytes"

# An unknown target is refused at login.
if iscsi-inq "$PORTAL/iqn.2026-11.io.zilla:tank.nope/0" >"$T/nope" 2>&1; then fail "unknown target accepted"; fi
grep -qi "not found" "$T/nope" || fail "unknown target: no 'not found' status: $(cat "$T/nope")"

# Data written over iSCSI reads back (qemu's iscsi driver comes with qemu-block-extra).
qemu-img --help | grep -qw iscsi || fail "qemu-img has no iscsi driver (qemu-block-extra is not installed)"
head -c 8M /dev/urandom >"$T/src"
qemu-img convert -n -f raw -O raw "$T/src" "$LUN"
qemu-img convert -f raw -O raw "$LUN" "$T/back"
cmp -n $((8 << 20)) "$T/src" "$T/back" || fail "data read back over iSCSI differs"
# and over NBD: the same volume, the same request path
qemu-img convert -f raw -O raw "$(nbd_unix_uri tank/vol0)" "$T/back-nbd"
cmp -n $((8 << 20)) "$T/src" "$T/back-nbd" || fail "data written over iSCSI differs over NBD"
# an image onto the other volume, compared after a restart (below)
DATA_LUN=$PORTAL/iqn.2026-11.io.zilla:tank.data-1/0
qemu-img convert -n -f raw -O raw "$T/src" "$DATA_LUN"
log "qemu-img round trip over iscsi:// OK"

# libiscsi's conformance suite: the families this target implements (--dataloss: the
# write tests run instead of skipping).
families=(SCSI.TestUnitReady SCSI.Inquiry SCSI.ReadCapacity10 SCSI.ReadCapacity16 SCSI.Read6 SCSI.Read10
    SCSI.Read12 SCSI.Read16 SCSI.Write10 SCSI.Write12 SCSI.Write16 SCSI.WriteVerify10 SCSI.WriteVerify16
    SCSI.Verify10 SCSI.Verify12 SCSI.Verify16 SCSI.ModeSense6 SCSI.Mandatory SCSI.ReportSupportedOpcodes
    iSCSI.iSCSIcmdsn iSCSI.iSCSIdatasn iSCSI.iSCSIResiduals iSCSI.iSCSITMF)
# thin provisioning and COMPARE AND WRITE: these must run, not skip as unsupported
implemented=(SCSI.Unmap SCSI.WriteSame10 SCSI.WriteSame16 SCSI.GetLBAStatus SCSI.CompareAndWrite)
for family in "${families[@]}" "${implemented[@]}"; do
    if ! timeout 120 iscsi-test-cu --dataloss -t "$family" "$LUN" >"$T/cu" 2>&1; then
        grep -E "FAILED|Run Summary|tests " "$T/cu" | head -20
        fail "iscsi-test-cu $family failed"
    fi
    if [[ " ${implemented[*]} " == *" $family "* ]] &&
        grep -E "SKIPPED" "$T/cu" | grep -vE "LBPPB < 2|PERSISTENT RESERVE" | grep -q .; then
        grep SKIPPED "$T/cu" | head
        fail "iscsi-test-cu $family skipped tests as unsupported"
    fi
    log "iscsi-test-cu $family: $(awk '/^ *tests /{print $4 " of " $2 " passed"}' "$T/cu")"
done

# The provisioning page: UNMAP and WRITE SAME with UNMAP, zeros after unmap, thin.
iscsi-inq --evpd=1 --pagecode=178 "$LUN" | tee "$T/lbp"
grep -qi "LBPU:1" "$T/lbp" || fail "VPD 0xB2 does not report UNMAP"
grep -qi "LBPRZ:1" "$T/lbp" || fail "VPD 0xB2 does not report that unmapped blocks read zeros"

# /metrics counts the target's sessions and requests.
curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$T/metrics"
awk '$1 == "zilla_iscsi_sessions_started_total" && $2 > 0 { ok = 1 } END { exit !ok }' "$T/metrics" ||
    fail "zilla_iscsi_sessions_started_total is not above 0"
awk '$1 == "zilla_iscsi_requests_total{op=\"write\"}" && $2 > 0 { ok = 1 } END { exit !ok }' "$T/metrics" ||
    fail "no iSCSI write counted in /metrics"
# per target (volume) and per initiator (client): counts and latency histograms
grep -qE '^zilla_volume_request_latency_seconds_count\{volume="tank/vol0",op="write"\} [1-9]' "$T/metrics" ||
    fail "no write latency histogram for the target tank/vol0"
grep -qE '^zilla_volume_request_latency_seconds_bucket\{le="\+Inf",volume="tank/vol0",op="read"\} [1-9]' "$T/metrics" ||
    fail "the read latency histogram of tank/vol0 has no +Inf bucket"
grep -qE '^zilla_client_requests_total\{protocol="iscsi",client="iqn\.[^"]+",op="read"\} [1-9]' "$T/metrics" ||
    fail "no per-initiator read count (an iSCSI client is its initiator name)"

# The identity survives a restart.
stop_daemon
start_daemon
again=$(iscsi-inq --evpd=1 --pagecode=128 "$LUN" | sed -n 's/^Unit Serial Number:\[\(.*\)\]$/\1/p')
[ "$again" = "$serial" ] || fail "unit serial changed across a restart: $serial -> $again"
qemu-img compare -f raw -F raw "$T/src" "$DATA_LUN" || fail "the image written over iSCSI differs after a restart"
stop_daemon
log "iSCSI OK"
