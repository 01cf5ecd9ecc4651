#!/usr/bin/env bash
# Goal: Zilla installs as a service a service manager can run. The systemd unit
# (contrib/systemd/zilla.service) passes `systemd-analyze verify` with its man pages
# found; the daemon speaks sd_notify: READY=1 once it serves (the admin socket
# answers), WATCHDOG=1 every WATCHDOG_USEC/2, STOPPING=1 on SIGTERM. The example config
# (contrib/zilla.conf, every example line in force) starts the daemon; tunables come
# from it, `tunable set -p` keeps one across a restart, in the documented order; a
# zfs_arc_max beyond the machine's RAM is refused; `tunable get` prints sizes short
# in bounded lines (-p exact).
. "$(dirname "$0")/lib.sh"

# --- the unit file
unit=$ROOT/contrib/systemd/zilla.service
grep -qx 'Type=notify' "$unit" || fail "unit: not Type=notify"
grep -q '^ExecStart=/usr/local/bin/zilla --state-dir /var/lib/zilla serve --config /etc/zilla/zilla.conf$' "$unit" || fail "unit: ExecStart"
grep -q '^WatchdogSec=' "$unit" || fail "unit: no WatchdogSec"
mkdir -p "$T/man/man1"
cp "$ROOT"/contrib/man/*.1 "$T/man/man1/"
# verify wants the binary where ExecStart says; test the unit with this build's path
sed "s|^ExecStart=/usr/local/bin/zilla |ExecStart=$ZILLA |" "$unit" >"$T/zilla.service"
MANPATH=$T/man systemd-analyze verify "$T/zilla.service" >"$T/verify" 2>&1 || { cat "$T/verify"; fail "systemd-analyze verify"; }
# verify exits 0 on an unknown key or a bad value, with a warning: there must be none
[ ! -s "$T/verify" ] || { cat "$T/verify"; fail "systemd-analyze verify warned"; }
log "ok: systemd-analyze verify"

# --- sd_notify: a unix datagram socket as systemd's NOTIFY_SOCKET
python3 -u - "$T/notify.sock" >"$T/notify.log" 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    for line in s.recv(4096).decode().split("\n"):
        print(f"{time.monotonic():.3f} {line}")
PY
LISTENER=$!
on_exit "kill $LISTENER"
for ((i = 0; i < 50; i++)); do [ -S "$T/notify.sock" ] && break; sleep 0.1; done
export NOTIFY_SOCKET=$T/notify.sock WATCHDOG_USEC=400000
# the example config with every example line in force (the admin group may not exist
# here); command-line listeners win over its addresses
sed -E 's/^#([a-z_.]+ = )/\1/; /^admin_group/d' "$ROOT/contrib/zilla.conf" >"$T/zilla.conf"
grep -q '^tunable.zfs_arc_max = 4G$' "$T/zilla.conf" || fail "example config: no tunable example"
# (its nbd_connections_max = 4096 needs about 8800 descriptors: the daemon raises its
# soft limit to the hard one, as under the unit's LimitNOFILE=65536)
start_daemon --config "$T/zilla.conf"
unset NOTIFY_SOCKET WATCHDOG_USEC
for ((i = 0; i < 50; i++)); do grep -q ' READY=1$' "$T/notify.log" && break; sleep 0.1; done
grep -q ' READY=1$' "$T/notify.log" || { cat "$T/notify.log"; fail "no READY=1"; }
grep -q " STATUS=serving $STATE" "$T/notify.log" || fail "no STATUS=serving line"
grep -q " MAINPID=$DAEMON_PID$" "$T/notify.log" || fail "MAINPID is not the daemon"
sleep 1.5
pings=$(grep -c ' WATCHDOG=1$' "$T/notify.log" || true)
((pings >= 4 && pings <= 12)) || { cat "$T/notify.log"; fail "$pings watchdog pings in 1.5 s at WATCHDOG_USEC=400000 (every 0.2 s)"; }
log "ok: READY=1, $pings watchdog pings"

# --- tunables: the example config, set -p, restart
z tunable get -H zfs_arc_max | tee "$T/t"
[ "$(cut -f2,4 "$T/t")" = "$(printf '4G\tconfig')" ] || fail "zfs_arc_max from the config file: $(cat "$T/t")"
[ "$(z tunable get -Hp zfs_arc_max | cut -f2)" = $((4 << 30)) ] || fail "-p: exact bytes"
z tunable set -p zfs_txg_timeout=9
z tunable set zfs_txg_history=77
[ "$(z tunable get -H zfs_txg_timeout | cut -f2,4)" = "$(printf '9\tpersistent')" ] || fail "set -p source"
[ "$(z tunable get -H zfs_txg_history | cut -f2,4)" = "$(printf '77\ttemporary')" ] || fail "set source"
grep -qx 'zfs_txg_timeout = 9' "$STATE/tunables.conf" || fail "DIR/tunables.conf: $(cat "$STATE/tunables.conf")"

kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" || fail "daemon exit status after SIGTERM"
DAEMON_PID=
grep -q ' STOPPING=1$' "$T/notify.log" || { cat "$T/notify.log"; fail "no STOPPING=1 on SIGTERM"; }
log "ok: STOPPING=1"

start_daemon --config "$T/zilla.conf"
[ "$(z tunable get -H zfs_txg_timeout | cut -f2,4)" = "$(printf '9\tpersistent')" ] || fail "set -p lost at restart (persistent wins over the config file's 5)"
[ "$(z tunable get -H zfs_txg_history | cut -f2,4)" = "$(printf '100\tdefault')" ] || fail "a plain set must not survive a restart"
z tunable set -p zfs_txg_timeout=default
[ "$(z tunable get -H zfs_txg_timeout | cut -f2,4)" = "$(printf '5\tconfig')" ] || fail "set -p NAME=default: back to the config file's value"
grep -q zfs_txg_timeout "$STATE/tunables.conf" && fail "set -p NAME=default left it in tunables.conf"
stop_daemon
start_daemon --config "$T/zilla.conf" --tunable zfs_txg_timeout=11
[ "$(z tunable get -H zfs_txg_timeout | cut -f2,4)" = "$(printf '11\tcmdline')" ] || fail "serve --tunable wins"

# --- bounded by the machine
ram=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024))
((ram < (1 << 40))) || fail "this test needs a machine with less than 1T of RAM"
expect_error "cannot set tunable 'zfs_arc_max': zfs_arc_max: value 1T is not below the machine's physical memory \([0-9.]+G\)" z tunable set zfs_arc_max=1T
expect_error "zfs_arc_max: value 1T is not below" z tunable set -p zfs_arc_max=1T
grep -q zfs_arc_max "$STATE/tunables.conf" && fail "a refused value was persisted"
[ "$(z tunable get -H zfs_arc_max | cut -f2)" = 4G ] || fail "a refused value changed zfs_arc_max"
expect_error "zfs_dirty_data_max: value [0-9.]+G is above 25% of the machine's physical memory" z tunable set zfs_dirty_data_max=$((ram / 2))
stop_daemon
printf 'tunable.zfs_arc_max = 1T\n' >"$T/big.conf"
if "$ZILLA" --state-dir "$STATE" serve --config "$T/big.conf" --nbd off --http off >"$T/big.out" 2>&1; then fail "a config with zfs_arc_max=1T started"; fi
grep -q "zilla: $T/big.conf: tunable.zfs_arc_max: zfs_arc_max: value 1T is not below" "$T/big.out" || fail "config refusal: $(cat "$T/big.out")"
log "ok: 1T refused"

# --- tunable get: short sizes, bounded lines
start_daemon
z tunable get >"$T/all"
widest=$(awk '{ if (length($0) > w) w = length($0) } END { print w }' "$T/all")
((widest <= 120)) || { grep -E ".{121}" "$T/all" | head -3; fail "tunable get: $widest-character lines"; }
grep -Eq '^zfs_arc_max +0 +0 +default +0,64M\.\.1P +live$' "$T/all" || fail "zfs_arc_max row: $(grep ^zfs_arc_max "$T/all")"
z tunable get zfs_dirty_data_max >"$T/one"
sed -n 3p "$T/one" | grep -q '^    dirty data limit in bytes' || fail "one tunable: its description under it: $(cat "$T/one")"
awk '{ if (length($0) > 110) exit 1 }' "$T/one" || fail "description not wrapped"
log "ok: tunable get ($widest columns)"
