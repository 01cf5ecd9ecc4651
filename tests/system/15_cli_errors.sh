#!/usr/bin/env bash
# Goal: every kind of bad input ends in one clear stderr line and a non-zero exit.
# Method: bad sizes, unknown properties and values, unknown pools and volumes,
# missing devices, bad vdev grammar, a second daemon on the same state dir, no daemon.
. "$(dirname "$0")/lib.sh"

expect_error 'no daemon is serving .* \(start one with `zilla serve --state-dir' z pool list
start_daemon
make_pool tank 128M
make_volume tank/v 16M

# Sizes.
expect_error "bad size '10X'" z volume create -V 10X tank/x
expect_error "bad size 'ten'" z volume create -V ten tank/x
expect_error "bad size '1.2.3G'" z volume create -V 1.2.3G tank/x
expect_error "bad size '-5M'" z volume create -V=-5M tank/x
expect_error "volblocksize" z volume create -V 16M -b 3K tank/x
expect_error "greater than zero" z volume create -V 0 tank/x
expect_error "multiple of volume block size" z volume create -V 10000 tank/x

# Properties.
expect_error "cannot set property for 'tank/v': unknown property 'frobnicate'" z set frobnicate=1 tank/v
expect_error "bad value 'sometimes' for property 'sync'" z set sync=sometimes tank/v
expect_error "cannot set property for 'tank/v': 'used' is readonly" z set used=1G tank/v
expect_error "bad property assignment" z set sync tank/v
expect_error "unknown property" z volume create -V 16M -o bogus=1 tank/x
expect_error "cannot open 'tank/v'.*unknown property|unknown property" z get nosuchprop tank/v

# Unknown pools and volumes.
expect_error "cannot open 'nope': no such pool" z pool status nope
expect_error "cannot export 'nope': no such pool" z pool export nope
expect_error "cannot destroy 'nope': no such pool" z pool destroy nope
expect_error "cannot create 'nope/v': no such pool" z volume create -V 16M nope/v
expect_error "cannot open 'tank/nosuch'" z get all tank/nosuch
expect_error "cannot destroy 'tank/nosuch'" z volume destroy tank/nosuch
expect_error "cannot create 'tank/v'" z volume create -V 16M tank/v
expect_error "not a volume name|POOL/NAME" z volume create -V 16M justapool

# Devices and vdev grammar.
expect_error "cannot create 'p2': cannot open '$T/disks/missing0': no such device" \
    z pool create p2 mirror "$T/disks/missing0" "$T/disks/missing1"
truncate -s 128M "$T/disks/x0" "$T/disks/x1"
expect_error "cannot create 'p2': .*raidz" z pool create p2 raidz "$T/disks/x0" "$T/disks/x1"
expect_error "cannot create 'p2': a mirror needs at least two devices" z pool create p2 mirror "$T/disks/x0"
expect_error "cannot create 'p2': .*more than once" z pool create p2 mirror "$T/disks/x0" "$T/disks/x0"
expect_error "cannot create 'tank'" z pool create tank "$T/disks/x0"
expect_error "cannot create '1bad'" z pool create 1bad "$T/disks/x0"
expect_error "cannot create 'p3': .*" z pool create p3 "$T/disks/tank-a0"   # in use by tank
expect_error "cannot attach" z pool attach tank "$T/disks/nosuchdev" "$T/disks/x1"
truncate -s 64M "$T/disks/small"
expect_error "small is too small to attach: 67108864 bytes, the vdev needs at least [0-9]+ bytes" z pool attach tank "$T/disks/tank-a0" "$T/disks/small"

# Bad arguments to the CLI itself.
expect_error "unrecognized subcommand 'frob'" z pool frob
expect_error "unexpected argument" z pool list --bogus
expect_error "invalid column" z pool list -o name,bogus
expect_error "bad interval" z pool iostat tank 0
expect_error "bad interval" z pool iostat tank 1e300 2
expect_error "bad interval" z zilstat nan 2
expect_error "bad interval" z zilstat 1e300 2
expect_error "bad interval" z arcstat 0
expect_error "unknown tunable 'no_such_tunable'" z tunable set no_such_tunable=1
expect_error "bad value" z tunable set zfs_txg_timeout=soon
expect_error "unknown tunable" z tunable get no_such_tunable
expect_error "zfs_vdev_max_active: value 0 is out of range \(allowed 1 to 10000\)" z tunable set zfs_vdev_max_active=0
expect_error "zfs_arc_max: value 4096 is out of range \(allowed 0 \(auto\) or 67108864 to" z tunable set zfs_arc_max=4096

# A second daemon on the same state directory.
expect_error "another zilla daemon \(pid $DAEMON_PID\) is already serving" \
    "$ZILLA" --state-dir "$STATE" serve --nbd off --http off --iscsi off
kill -0 "$DAEMON_PID" || fail "first daemon died"
z pool list -H -o name | grep -qx tank || fail "first daemon no longer answers"

# Tunables round-trip (they are the daemon's, not the CLI process's).
z tunable set zfs_txg_timeout=7
[ "$(z tunable get -H zfs_txg_timeout | cut -f2)" = 7 ] || fail "tunable set/get"
# A mode switch is set and shown by name; a word naming no mode is refused with the list.
z tunable set zfs_write_throttle_mode=legacy
[ "$(z tunable get -H zfs_write_throttle_mode | cut -f2)" = legacy ] || fail "mode tunable by name"
expect_error "bad value 'fast': expected one of openzfs, legacy" z tunable set zfs_write_throttle_mode=fast
z tunable set zfs_write_throttle_mode=0
[ "$(z tunable get -H zfs_write_throttle_mode | cut -f2)" = openzfs ] || fail "mode tunable by number"
stop_daemon
log "CLI errors OK"
