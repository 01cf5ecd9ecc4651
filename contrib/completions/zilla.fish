# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_zilla_global_optspecs
    string join \n state-dir= h/help V/version
end

function __fish_zilla_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_zilla_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_zilla_using_subcommand
    set -l cmd (__fish_zilla_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c zilla -n "__fish_zilla_needs_command" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_needs_command" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_needs_command" -s V -l version -d 'Print version'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "serve" -d 'Run the daemon in the foreground'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "demo" -d 'Create (or reuse) a demo pool with emulated disks and serve it'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "pool" -d 'Pool commands (as zpool)'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "volume" -d 'Volume commands (as zfs for volumes)'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "get" -d 'Show properties (as zfs get): NAME PROPERTY VALUE SOURCE'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "list" -d 'List volumes (as zfs list): NAME USED AVAIL REFER MOUNTPOINT'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "rename" -d 'Rename a volume within its pool: POOL/NAME POOL/NEWNAME (its NBD export and iSCSI target follow the name; refused while clients are attached, unless -f)'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "set" -d 'Set a property: PROP=VALUE POOL/NAME (a volume\'s) or POOL (the pool\'s, e.g. autotrim=on)'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "arcstat" -d 'ARC statistics every INTERVAL seconds, arcstat\'s fields'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "arc-summary" -d 'A report of the ARC: sizes, targets, efficiency (as arc_summary)'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "zilstat" -d 'Intent log (ZIL) statistics, zilstat\'s columns, every INTERVAL seconds'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "txgs" -d 'The last txgs of a pool: OpenZFS\'s kstat txgs columns (txg birth state ndirty nread nwritten reads writes otime qtime wtime stime; bytes and ns)'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "tunable" -d 'Read or change run-time tunables'
complete -c zilla -n "__fish_zilla_needs_command" -f -a "iscsi" -d 'iSCSI target: CHAP users, allowed initiators, targets and sessions'
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l nbd -d 'NBD TCP address ("off" to disable; the unix socket DIR/nbd.sock is always served)' -r
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l iscsi -d 'iSCSI address (the target serves every volume as iqn.2026-11.io.zilla:POOL.NAME, LUN 0)' -r
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l http -d 'HTTP address for the dashboard, analytics, status page and /metrics ("off" to disable)' -r
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l config -d 'Config file: `key = value` lines: nbd, iscsi, http (addresses; options given on the command line win), iscsi_auth, admin_group, admin_connections_max, http_connections_max, nbd_connections_max, http_header_timeout_s, http_body_max_bytes, http_allowed_hosts, fd_reserve, tunable.NAME (see docs/cli.md and contrib/zilla.conf)' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l tunable -d 'Set a tunable before any pool is imported (repeatable), e.g. `--tunable zil_replay_disable=1`: for those read at import; wins over the config file and `tunable set -p`' -r
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l iscsi-auth -d 'iSCSI logins to a target without a CHAP user: `chap` (the default) refuses them unless the iSCSI address is a loopback one; `none` takes them on any address' -r -f -a "chap\t''
none\t''"
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand serve" -l no-import -d 'Start with no pool imported (the pools of the cache file show as UNAVAIL until imported by hand; the cache file is kept as it is)'
complete -c zilla -n "__fish_zilla_using_subcommand serve" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand demo" -l nbd -d 'NBD TCP address ("off" to disable; the unix socket DIR/nbd.sock is always served)' -r
complete -c zilla -n "__fish_zilla_using_subcommand demo" -l iscsi -d 'iSCSI address (the target serves every volume as iqn.2026-11.io.zilla:POOL.NAME, LUN 0)' -r
complete -c zilla -n "__fish_zilla_using_subcommand demo" -l http -d 'HTTP address for the dashboard, analytics, status page and /metrics ("off" to disable)' -r
complete -c zilla -n "__fish_zilla_using_subcommand demo" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand demo" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "create" -d 'Create a pool: POOL VDEV... (mirror A B, log [mirror] C D, cache E, spare F)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "status" -d 'Show pool health and the device tree'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "list" -d 'One line per pool'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "iostat" -d 'I/O statistics: [POOL] [INTERVAL [COUNT]]'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "set" -d 'Set a pool property: PROP=VALUE POOL (autotrim, autoreplace, failmode, multihost)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "get" -d 'Show pool properties: PROP[,PROP...]|all POOL'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "scrub" -d 'Start, pause (-p) or stop (-s) a scrub; -w waits for it'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "trim" -d 'Discard the pool\'s free space on its devices (TRIM); -w waits, -s suspends (a later trim resumes), -c cancels'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "import" -d 'Import a pool, or list importable pools when POOL is not given'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "export" -d 'Export a pool (sync, close its devices, forget it; refused while clients are attached to its volumes, unless -f)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "destroy" -d 'Destroy a pool (wipe its labels; refused while clients are attached to its volumes, unless -f)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "add" -d 'Add top-level vdevs: POOL VDEV... (refused when their replication differs from the pool\'s, unless -f)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "attach" -d 'Attach NEW_DEVICE as a mirror of DEVICE; returns once the resilver has started'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "detach" -d 'Detach DEVICE from its mirror'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "remove" -d 'Remove a log device (a leaf, or mirror-N for a log mirror), a cache or a spare'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "offline" -d 'Take DEVICE offline'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "online" -d 'Bring DEVICE online'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "replace" -d 'Replace DEVICE with NEW_DEVICE (or with itself); returns once the resilver has started, the old device is detached when it has finished'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "clear" -d 'Clear device error counters (and retry opening devices missing since import)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "upgrade" -d 'Upgrade POOL to the newest on-disk format this build writes (format 2: objsets, datasets, space maps); a pool already there is left as it is. Older builds cannot import an upgraded pool'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "wait" -d 'Wait until the activities (-t scrub,resilver,replace,trim; default all) have ended in POOL'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "events" -d 'Show the events the daemon saw (as zpool events): scrubs, repairs, errors, device changes'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and not __fish_seen_subcommand_from create status list iostat set get scrub trim import export destroy add attach detach remove offline online replace clear upgrade wait events history" -f -a "history" -d 'Show the commands that changed a pool (as zpool history)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from create" -s o -d 'Pool property, e.g. ashift=12' -r
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from create" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from create" -s f
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from create" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from status" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from status" -s v
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from status" -s x -d 'Only pools with problems'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from status" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from list" -s o -d 'Columns: name,size,alloc,free,ckpoint,expandsz,frag,cap,dedup,health,altroot,ashift,avail (free less the slop and unused reservations)' -r
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from list" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from list" -s H
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from list" -s p
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -s v
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -s l -d 'Average latencies'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -s q -d 'Queue depths'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -s w -d 'Latency histograms'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -s H
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -s p
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from iostat" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from set" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from set" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from get" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from get" -s H
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from get" -s p
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from get" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from scrub" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from scrub" -s w
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from scrub" -s p
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from scrub" -s s
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from scrub" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from trim" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from trim" -s w
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from trim" -s s
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from trim" -s c
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from trim" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from import" -s d -d 'Search this directory or device (repeatable) [default: /dev]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from import" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from import" -s f -d 'Import even if the pool seems to be in use by another host or daemon'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from import" -s F -d 'Recovery: if the newest txg cannot be read, rewind to the newest older txg that can, discarding the writes after it (zpool import -F)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from import" -s n -d 'With -F: say which txg would be loaded and how much would be discarded, and import nothing'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from import" -s m -d 'Import even though a log device is missing, discarding the synchronous writes its intent log held (zpool import -m)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from import" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from export" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from export" -s f -d 'Disconnect attached clients first'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from export" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from destroy" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from destroy" -s f -d 'Disconnect attached clients first'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from destroy" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from add" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from add" -s f -d 'Add even if the new vdevs\' replication level differs from the pool\'s'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from add" -s n -d 'Dry run: print the configuration the pool would have, change nothing'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from add" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from attach" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from attach" -s f
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from attach" -s w -d 'Wait until the resilver has finished'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from attach" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from detach" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from detach" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from remove" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from remove" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from offline" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from offline" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from online" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from online" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from replace" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from replace" -s f
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from replace" -s w -d 'Wait until the replace has finished (resilvered, old device detached)'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from replace" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from clear" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from clear" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from upgrade" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from upgrade" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from wait" -s t -d 'Activities to wait for, comma-separated: replace, resilver, scrub, trim' -r
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from wait" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from wait" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from events" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from events" -s v -d 'Verbose: every field of each event'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from events" -s f -d 'Follow: print new events as they happen, until interrupted'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from events" -s c -d 'Clear every event'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from events" -s H -d 'Scripted: no header, fields separated by a tab'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from events" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from history" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from history" -s l -d 'Long format: the user, host and origin of each command'
complete -c zilla -n "__fish_zilla_using_subcommand pool; and __fish_seen_subcommand_from history" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and not __fish_seen_subcommand_from create list destroy" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand volume; and not __fish_seen_subcommand_from create list destroy" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and not __fish_seen_subcommand_from create list destroy" -f -a "create" -d 'Create a volume: -V SIZE POOL/NAME'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and not __fish_seen_subcommand_from create list destroy" -f -a "list" -d 'List volumes'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and not __fish_seen_subcommand_from create list destroy" -f -a "destroy" -d 'Destroy a volume (refused while clients are attached to it, unless -f)'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from create" -s V -d 'Size, e.g. 10G' -r
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from create" -s b -d 'volblocksize [default: 16K]' -r
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from create" -s o -r
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from create" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from create" -s s -d 'Sparse: reserve nothing (refreservation=none). Without -s the pool reserves the volume\'s size and metadata (refreservation), as zfs'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from create" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from list" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from list" -s H
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from list" -s p
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from destroy" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from destroy" -s f -d 'Disconnect attached clients first'
complete -c zilla -n "__fish_zilla_using_subcommand volume; and __fish_seen_subcommand_from destroy" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand get" -s o -d 'Fields to show: name,property,value,received,source [default: name,property,value,source]' -r
complete -c zilla -n "__fish_zilla_using_subcommand get" -s s -d 'Only properties whose source is one of: local,default,inherited,temporary,received,none' -r
complete -c zilla -n "__fish_zilla_using_subcommand get" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand get" -s H -d 'Scripted: no header, one tab between fields'
complete -c zilla -n "__fish_zilla_using_subcommand get" -s p -d 'Exact values: bytes, unix seconds, ratios without the x'
complete -c zilla -n "__fish_zilla_using_subcommand get" -s r -d 'A pool named stands for itself and its volumes'
complete -c zilla -n "__fish_zilla_using_subcommand get" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand list" -s o -d 'Properties to show [default: name,used,available,referenced,mountpoint]' -r
complete -c zilla -n "__fish_zilla_using_subcommand list" -s t -d 'Types to show: filesystem,volume,snapshot,all [default: filesystem,volume]' -r
complete -c zilla -n "__fish_zilla_using_subcommand list" -s s -d 'Sort by this property, ascending (repeatable: later ones break ties)' -r
complete -c zilla -n "__fish_zilla_using_subcommand list" -s S -d 'Sort by this property, descending (repeatable)' -r
complete -c zilla -n "__fish_zilla_using_subcommand list" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand list" -s H -d 'Scripted: no header, one tab between fields'
complete -c zilla -n "__fish_zilla_using_subcommand list" -s p -d 'Exact values: bytes, unix seconds, ratios without the x'
complete -c zilla -n "__fish_zilla_using_subcommand list" -s r -d 'Recursive (a pool named always stands for its volumes; volumes have no children)'
complete -c zilla -n "__fish_zilla_using_subcommand list" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand rename" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand rename" -s f -d 'Disconnect attached clients first'
complete -c zilla -n "__fish_zilla_using_subcommand rename" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand set" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand set" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand arcstat" -s f -d 'Fields to print, comma-separated (arcstat field names; list them with -v)' -r
complete -c zilla -n "__fish_zilla_using_subcommand arcstat" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand arcstat" -s v -d 'List the fields with their descriptions'
complete -c zilla -n "__fish_zilla_using_subcommand arcstat" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand arc-summary" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand arc-summary" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand zilstat" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand zilstat" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand txgs" -s n -d 'Only the last N txgs [default: all kept, zfs_txg_history]' -r
complete -c zilla -n "__fish_zilla_using_subcommand txgs" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand txgs" -s H -d 'Scripted: no header, tab-separated'
complete -c zilla -n "__fish_zilla_using_subcommand txgs" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and not __fish_seen_subcommand_from get set" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and not __fish_seen_subcommand_from get set" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and not __fish_seen_subcommand_from get set" -f -a "get" -d 'Show one tunable or all: NAME VALUE DEFAULT SOURCE RANGE APPLIES (sizes as 4G), with each description under its row for one NAME or with -v'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and not __fish_seen_subcommand_from get set" -f -a "set" -d 'Set NAME=VALUE (sizes like 1G accepted; NAME=default: the config file\'s value or the built-in default); the change is lost at restart unless -p'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from get" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from get" -s H -d 'Scripted: no header, tab-separated, the description last'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from get" -s p -d 'Exact numbers'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from get" -s v -d 'Descriptions under every row'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from get" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from set" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from set" -s p -d 'Persistent: also keep it across restarts (in DIR/tunables.conf; with NAME=default, remove it from there)'
complete -c zilla -n "__fish_zilla_using_subcommand tunable; and __fish_seen_subcommand_from set" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and not __fish_seen_subcommand_from auth list" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and not __fish_seen_subcommand_from auth list" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and not __fish_seen_subcommand_from auth list" -f -a "auth" -d 'Set (or show) who may log in to a target: CHAP users and secrets, allowed initiators. With no option, show the target\'s settings (never its secrets)'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and not __fish_seen_subcommand_from auth list" -f -a "list" -d 'The targets with their authentication, and the logged-in sessions'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l user -d 'CHAP user the initiator logs in as (with --secret-file)' -r
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l secret-file -d 'File holding the CHAP secret (12 to 255 bytes; one trailing newline is ignored)' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l mutual-user -d 'Mutual CHAP: the user the target answers as (with --mutual-secret-file)' -r
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l mutual-secret-file -d 'File holding the target\'s mutual CHAP secret (not the initiator\'s secret)' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l initiator -d 'Allow this initiator (repeatable; replaces the list; none given: any initiator)' -r
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l default -d 'The default entry: targets without settings of their own, and discovery'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -l clear -d 'Remove the settings first (alone: remove them all)'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from auth" -s h -l help -d 'Print help'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from list" -l state-dir -d 'State directory of the daemon to run or talk to [default: /var/lib/zilla as root, ./zilla-state otherwise]' -r -F
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from list" -s H -d 'Scripted: no headers, tab-separated'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from list" -s p -d 'Exact numbers'
complete -c zilla -n "__fish_zilla_using_subcommand iscsi; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
