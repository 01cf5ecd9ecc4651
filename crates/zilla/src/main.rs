//! zilla: the daemon (`serve`, `demo`) and the admin CLI, one binary.
//!
//! The CLI contract is ARCHITECTURE.md section 5 (docs/cli.md is the admin guide).
//! Admin commands are thin clients of the daemon serving `--state-dir` (JSON over
//! HTTP on DIR/zilla.sock); they print in the shapes of zpool(8) and zfs(8). Every
//! failure is one line on stderr, `zilla: ...`, and exit status 1 (2 for bad usage).

mod api;
mod analytics;
mod api_error;
mod arcstats;
mod autoreplace;
mod client;
mod clip;
mod config;
mod datasets;
mod daemon;
mod demo;
mod events;
mod exports;
mod format;
mod memory;
mod history;
mod http_host;
mod http_serve;
mod iscsi_admin;
mod iscsi_glue;
#[cfg(test)]
mod manuals;
mod nbd_glue;
mod pools;
mod reads;
mod state_dir;
mod sd_notify;
mod status_text;
mod tunables;
mod units;
mod vdev_grammar;
mod web;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use zilla_core::spa::{ImportablePool, PoolListRow, ScrubCmd, TopSpec, VolumeInfo};
use zilla_core::vdev::LeafSpec;

use crate::api::*;
use crate::client::{enc, force_query, Client};
use crate::format::IostatFlags;

#[derive(Parser)]
#[command(
    name = "zilla",
    version,
    about = "Zilla: a hybrid storage pool (mirrors, SLOG, L2ARC) serving block volumes over NBD and iSCSI",
    disable_help_subcommand = true,
    propagate_version = false
)]
struct Cli {
    /// State directory of the daemon to run or talk to [default: /var/lib/zilla as
    /// root, ./zilla-state otherwise]
    #[arg(long, global = true, env = "ZILLA_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon in the foreground
    Serve(ServeArgs),
    /// Create (or reuse) a demo pool with emulated disks and serve it
    Demo {
        /// Directory for the backing files and state [default: ./zilla-demo]
        dir: Option<PathBuf>,
        #[command(flatten)]
        listen: ListenArgs,
    },
    /// Pool commands (as zpool)
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Volume commands (as zfs for volumes)
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// Show properties (as zfs get): NAME PROPERTY VALUE SOURCE
    Get(datasets::GetArgs),
    /// List volumes (as zfs list): NAME USED AVAIL REFER MOUNTPOINT
    List(datasets::ListArgs),
    /// Rename a volume within its pool: POOL/NAME POOL/NEWNAME (its NBD export and
    /// iSCSI target follow the name; refused while clients are attached, unless -f)
    Rename {
        /// Disconnect attached clients first
        #[arg(short = 'f')]
        force: bool,
        /// The volume
        name: String,
        /// Its new name, in the same pool
        new_name: String,
    },
    /// Set a property: PROP=VALUE POOL/NAME (a volume's) or POOL (the pool's, e.g. autotrim=on)
    Set {
        assignment: String,
        name: String,
    },
    /// ARC statistics every INTERVAL seconds, arcstat's fields
    Arcstat {
        /// Fields to print, comma-separated (arcstat field names; list them with -v)
        #[arg(short = 'f', value_name = "FIELDS")]
        fields: Option<String>,
        /// List the fields with their descriptions
        #[arg(short = 'v')]
        verbose: bool,
        interval: Option<f64>,
        count: Option<u64>,
    },
    /// A report of the ARC: sizes, targets, efficiency (as arc_summary)
    ArcSummary,
    /// Intent log (ZIL) statistics, zilstat's columns, every INTERVAL seconds
    Zilstat {
        interval: Option<f64>,
        count: Option<u64>,
    },
    /// The last txgs of a pool: OpenZFS's kstat txgs columns (txg birth state ndirty
    /// nread nwritten reads writes otime qtime wtime stime; bytes and ns)
    Txgs {
        /// Scripted: no header, tab-separated
        #[arg(short = 'H')]
        scripted: bool,
        /// Only the last N txgs [default: all kept, zfs_txg_history]
        #[arg(short = 'n', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        pool: String,
    },
    /// Read or change run-time tunables
    #[command(subcommand)]
    Tunable(TunableCmd),
    /// iSCSI target: CHAP users, allowed initiators, targets and sessions
    #[command(subcommand)]
    Iscsi(IscsiCmd),
}

#[derive(Subcommand)]
enum IscsiCmd {
    /// Set (or show) who may log in to a target: CHAP users and secrets, allowed
    /// initiators. With no option, show the target's settings (never its secrets)
    #[command(group(clap::ArgGroup::new("which").required(true).args(["target", "default"])))]
    Auth {
        /// The target: its name (iqn.2026-11.io.zilla:POOL.NAME) or POOL/NAME
        target: Option<String>,
        /// The default entry: targets without settings of their own, and discovery
        #[arg(long)]
        default: bool,
        /// CHAP user the initiator logs in as (with --secret-file)
        #[arg(long, value_name = "USER", requires = "secret_file")]
        user: Option<String>,
        /// File holding the CHAP secret (12 to 255 bytes; one trailing newline is ignored)
        #[arg(long, value_name = "FILE", requires = "user")]
        secret_file: Option<PathBuf>,
        /// Mutual CHAP: the user the target answers as (with --mutual-secret-file)
        #[arg(long, value_name = "USER", requires = "mutual_secret_file")]
        mutual_user: Option<String>,
        /// File holding the target's mutual CHAP secret (not the initiator's secret)
        #[arg(long, value_name = "FILE", requires = "mutual_user")]
        mutual_secret_file: Option<PathBuf>,
        /// Allow this initiator (repeatable; replaces the list; none given: any initiator)
        #[arg(long = "initiator", value_name = "IQN")]
        initiators: Vec<String>,
        /// Remove the settings first (alone: remove them all)
        #[arg(long)]
        clear: bool,
    },
    /// The targets with their authentication, and the logged-in sessions
    List {
        /// Scripted: no headers, tab-separated
        #[arg(short = 'H')]
        scripted: bool,
        /// Exact numbers
        #[arg(short = 'p')]
        parsable: bool,
        /// Only one table: targets or sessions
        #[arg(value_parser = ["targets", "sessions"])]
        what: Option<String>,
    },
}

#[derive(Args, Clone)]
struct ListenArgs {
    /// NBD TCP address ("off" to disable; the unix socket DIR/nbd.sock is always served)
    #[arg(long, value_name = "ADDR", default_value = daemon::DEFAULT_NBD)]
    nbd: String,
    /// iSCSI address (the target serves every volume as iqn.2026-11.io.zilla:POOL.NAME, LUN 0)
    #[arg(long, value_name = "ADDR", default_value = daemon::DEFAULT_ISCSI)]
    iscsi: String,
    /// HTTP address for the dashboard, analytics, status page and /metrics ("off" to disable)
    #[arg(long, value_name = "ADDR", default_value = daemon::DEFAULT_HTTP)]
    http: String,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    listen: ListenArgs,
    /// Config file: `key = value` lines: nbd, iscsi, http (addresses; options given
    /// on the command line win), iscsi_auth, admin_group, admin_connections_max,
    /// http_connections_max, nbd_connections_max, http_header_timeout_s,
    /// http_body_max_bytes, http_allowed_hosts, fd_reserve, tunable.NAME (see
    /// docs/cli.md and contrib/zilla.conf)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Start with no pool imported (the pools of the cache file show as UNAVAIL until
    /// imported by hand; the cache file is kept as it is)
    #[arg(long)]
    no_import: bool,
    /// Set a tunable before any pool is imported (repeatable), e.g.
    /// `--tunable zil_replay_disable=1`: for those read at import; wins over the
    /// config file and `tunable set -p`
    #[arg(long = "tunable", value_name = "NAME=VALUE")]
    tunables: Vec<String>,
    /// iSCSI logins to a target without a CHAP user: `chap` (the default) refuses them
    /// unless the iSCSI address is a loopback one; `none` takes them on any address
    #[arg(long, value_name = "MODE", value_parser = ["chap", "none"])]
    iscsi_auth: Option<String>,
}

#[derive(Subcommand)]
enum PoolCmd {
    /// Create a pool: POOL VDEV... (mirror A B, log [mirror] C D, cache E, spare F)
    Create {
        #[arg(short = 'f')]
        force: bool,
        /// Pool property, e.g. ashift=12
        #[arg(short = 'o', value_name = "PROP=VAL")]
        props: Vec<String>,
        pool: String,
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        vdevs: Vec<String>,
    },
    /// Show pool health and the device tree
    Status {
        #[arg(short = 'v')]
        verbose: bool,
        /// Only pools with problems
        #[arg(short = 'x')]
        problems: bool,
        pools: Vec<String>,
    },
    /// One line per pool
    List {
        #[arg(short = 'H')]
        scripted: bool,
        #[arg(short = 'p')]
        parsable: bool,
        /// Columns: name,size,alloc,free,ckpoint,expandsz,frag,cap,dedup,health,altroot,ashift,avail (free less the slop and unused reservations)
        #[arg(short = 'o', value_name = "COLS")]
        columns: Option<String>,
        pools: Vec<String>,
    },
    /// I/O statistics: [POOL] [INTERVAL [COUNT]]
    Iostat {
        #[arg(short = 'v')]
        verbose: bool,
        /// Average latencies
        #[arg(short = 'l')]
        latency: bool,
        /// Queue depths
        #[arg(short = 'q')]
        queues: bool,
        /// Latency histograms
        #[arg(short = 'w')]
        histograms: bool,
        #[arg(short = 'H')]
        scripted: bool,
        #[arg(short = 'p')]
        parsable: bool,
        args: Vec<String>,
    },
    /// Set a pool property: PROP=VALUE POOL (autotrim, autoreplace, failmode, multihost)
    Set {
        assignment: String,
        pool: String,
    },
    /// Show pool properties: PROP[,PROP...]|all POOL
    Get {
        #[arg(short = 'H')]
        scripted: bool,
        #[arg(short = 'p')]
        parsable: bool,
        props: String,
        pool: String,
    },
    /// Start, pause (-p) or stop (-s) a scrub; -w waits for it
    Scrub {
        #[arg(short = 'w')]
        wait: bool,
        #[arg(short = 'p', conflicts_with = "stop")]
        pause: bool,
        #[arg(short = 's')]
        stop: bool,
        pool: String,
    },
    /// Discard the pool's free space on its devices (TRIM); -w waits, -s suspends
    /// (a later trim resumes), -c cancels
    Trim {
        #[arg(short = 'w')]
        wait: bool,
        #[arg(short = 's', conflicts_with = "cancel")]
        suspend: bool,
        #[arg(short = 'c')]
        cancel: bool,
        pool: String,
    },
    /// Import a pool, or list importable pools when POOL is not given
    Import {
        /// Search this directory or device (repeatable) [default: /dev]
        #[arg(short = 'd', value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Import even if the pool seems to be in use by another host or daemon
        #[arg(short = 'f')]
        force: bool,
        /// Recovery: if the newest txg cannot be read, rewind to the newest older txg
        /// that can, discarding the writes after it (zpool import -F)
        #[arg(short = 'F')]
        rewind: bool,
        /// With -F: say which txg would be loaded and how much would be discarded, and
        /// import nothing
        #[arg(short = 'n', requires = "rewind")]
        dry_run: bool,
        /// Import even though a log device is missing, discarding the synchronous
        /// writes its intent log held (zpool import -m)
        #[arg(short = 'm')]
        missing_log: bool,
        /// Pool name or numeric id
        pool: Option<String>,
    },
    /// Export a pool (sync, close its devices, forget it; refused while clients are
    /// attached to its volumes, unless -f)
    Export {
        /// Disconnect attached clients first
        #[arg(short = 'f')]
        force: bool,
        pool: String,
    },
    /// Destroy a pool (wipe its labels; refused while clients are attached to its
    /// volumes, unless -f)
    Destroy {
        /// Disconnect attached clients first
        #[arg(short = 'f')]
        force: bool,
        pool: String,
    },
    /// Add top-level vdevs: POOL VDEV... (refused when their replication differs from
    /// the pool's, unless -f)
    Add {
        /// Add even if the new vdevs' replication level differs from the pool's
        #[arg(short = 'f')]
        force: bool,
        /// Dry run: print the configuration the pool would have, change nothing
        #[arg(short = 'n')]
        dry_run: bool,
        pool: String,
        #[arg(required = true, num_args = 1..)]
        vdevs: Vec<String>,
    },
    /// Attach NEW_DEVICE as a mirror of DEVICE; returns once the resilver has started
    Attach {
        #[arg(short = 'f')]
        force: bool,
        /// Wait until the resilver has finished
        #[arg(short = 'w')]
        wait: bool,
        pool: String,
        device: String,
        new_device: String,
    },
    /// Detach DEVICE from its mirror
    Detach { pool: String, device: String },
    /// Remove a log device (a leaf, or mirror-N for a log mirror), a cache or a spare
    Remove { pool: String, device: String },
    /// Take DEVICE offline
    Offline { pool: String, device: String },
    /// Bring DEVICE online
    Online { pool: String, device: String },
    /// Replace DEVICE with NEW_DEVICE (or with itself); returns once the resilver has
    /// started, the old device is detached when it has finished
    Replace {
        #[arg(short = 'f')]
        force: bool,
        /// Wait until the replace has finished (resilvered, old device detached)
        #[arg(short = 'w')]
        wait: bool,
        pool: String,
        device: String,
        new_device: Option<String>,
    },
    /// Clear device error counters (and retry opening devices missing since import)
    Clear { pool: String, device: Option<String> },
    /// Upgrade POOL to the newest on-disk format this build writes (format 2: objsets,
    /// datasets, space maps); a pool already there is left as it is. Older builds
    /// cannot import an upgraded pool.
    Upgrade { pool: String },
    /// Wait until the activities (-t scrub,resilver,replace,trim; default all) have
    /// ended in POOL
    Wait {
        /// Activities to wait for, comma-separated: replace, resilver, scrub, trim
        #[arg(short = 't', value_name = "ACTIVITY", value_delimiter = ',')]
        activities: Vec<String>,
        pool: String,
    },
    #[command(flatten)]
    Log(crate::events::LogCmd),
}

#[derive(Subcommand)]
enum VolumeCmd {
    /// Create a volume: -V SIZE POOL/NAME
    Create {
        /// Sparse: reserve nothing (refreservation=none). Without -s the pool
        /// reserves the volume's size and metadata (refreservation), as zfs
        #[arg(short = 's')]
        sparse: bool,
        /// Size, e.g. 10G
        #[arg(short = 'V', value_name = "SIZE", value_parser = units::parse_size)]
        size: u64,
        /// volblocksize [default: 16K]
        #[arg(short = 'b', value_name = "BLOCKSIZE", value_parser = units::parse_size)]
        blocksize: Option<u64>,
        #[arg(short = 'o', value_name = "PROP=VAL")]
        props: Vec<String>,
        name: String,
    },
    /// List volumes
    List {
        #[arg(short = 'H')]
        scripted: bool,
        #[arg(short = 'p')]
        parsable: bool,
        pools: Vec<String>,
    },
    /// Destroy a volume (refused while clients are attached to it, unless -f)
    Destroy {
        /// Disconnect attached clients first
        #[arg(short = 'f')]
        force: bool,
        name: String,
    },
}

#[derive(Subcommand)]
enum TunableCmd {
    /// Show one tunable or all: NAME VALUE DEFAULT SOURCE RANGE APPLIES (sizes as 4G),
    /// with each description under its row for one NAME or with -v
    Get {
        /// Scripted: no header, tab-separated, the description last
        #[arg(short = 'H')]
        scripted: bool,
        /// Exact numbers
        #[arg(short = 'p')]
        parsable: bool,
        /// Descriptions under every row
        #[arg(short = 'v')]
        verbose: bool,
        name: Option<String>,
    },
    /// Set NAME=VALUE (sizes like 1G accepted; NAME=default: the config file's value or
    /// the built-in default); the change is lost at restart unless -p
    Set {
        /// Persistent: also keep it across restarts (in DIR/tunables.conf; with
        /// NAME=default, remove it from there)
        #[arg(short = 'p')]
        persistent: bool,
        assignment: String,
    },
}

/// Exit with one line on stderr (zpool's multi-line refusal of a vdev specification
/// keeps its lines, each made printable).
fn die(msg: impl std::fmt::Display) -> ! {
    let msg = msg.to_string();
    match msg.starts_with("invalid vdev specification\n") {
        true => eprintln!("zilla: {}", msg.lines().map(clip::clip_message).collect::<Vec<_>>().join("\n")),
        false => eprintln!("zilla: {}", clip::clip_message(&msg)),
    }
    std::process::exit(1)
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let _ = e.print();
                std::process::exit(if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand { 2 } else { 0 });
            }
            // One line: clap's first line without its "error: " prefix, and the
            // indented lines it introduces (which arguments are missing)
            let text = e.render().to_string();
            let mut lines = text.lines();
            let mut first = lines.next().unwrap_or("bad arguments").trim_start_matches("error: ").to_string();
            if first.ends_with(':') {
                let listed: Vec<&str> = lines.take_while(|l| l.starts_with("  ")).map(str::trim).collect();
                if !listed.is_empty() {
                    first = format!("{first} {}", listed.join(", "));
                }
            }
            eprintln!("zilla: {first} (see 'zilla --help')");
            std::process::exit(2);
        }
    };
    let state_dir = cli.state_dir.clone().unwrap_or_else(default_state_dir);
    match cli.cmd {
        Cmd::Serve(args) => serve(state_dir, args),
        Cmd::Demo { dir, listen } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from("zilla-demo"));
            limit_malloc_arenas();
            init_tracing();
            stop_on_broken_invariant();
            let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| die(format!("cannot start runtime: {e}")));
            if let Err(e) = rt.block_on(demo::run(dir, listen_opts(&listen))) {
                die(format!("{e:#}"));
            }
        }
        Cmd::Arcstat { verbose: true, .. } => print!("{}", arcstats::field_descriptions()),
        cmd => {
            if let Cmd::Arcstat { fields, .. } = &cmd {
                // a bad field is bad usage, like a bad option: exit 2 before any daemon
                if let Err(e) = arcstats::parse_fields(fields.as_deref()) {
                    eprintln!("zilla: {}", clip::clip_message(&e));
                    std::process::exit(2);
                }
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| die(format!("cannot start runtime: {e}")));
            let client = Client::new(&state_dir);
            if let Err(e) = rt.block_on(admin(&client, cmd)) {
                die(e);
            }
        }
    }
}

fn default_state_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        PathBuf::from("/var/lib/zilla")
    } else {
        PathBuf::from("zilla-state")
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn off(addr: &str) -> Option<String> {
    match addr {
        "off" | "none" | "" => None,
        a => Some(a.to_string()),
    }
}

struct Listen {
    nbd: Option<String>,
    iscsi: Option<String>,
    http: Option<String>,
}

fn listen_opts(l: &ListenArgs) -> Listen {
    Listen { nbd: off(&l.nbd), iscsi: off(&l.iscsi), http: off(&l.http) }
}

/// The pool a per-pool engine thread works for, from its name (`txg_sync_POOL`, ...):
/// the fallback when no pool was named for the thread.
fn pool_of_thread(thread: &str) -> Option<String> {
    ["txg_sync_", "txg_quiesce_", "mmp_", "scan_", "resilver_start_"]
        .iter()
        .find_map(|prefix| thread.strip_prefix(prefix))
        .filter(|p| !p.is_empty())
        .map(str::to_string)
}

/// The broken-invariant policy (docs/design.md "Broken invariants"): a panic anywhere
/// in the daemon is a failed assertion, and the daemon stops at once with one clear log
/// line instead of serving on with state it can no longer trust. Nothing is lost: the
/// on-disk state is always the last synced txg, and the next start imports the pools,
/// except the one the failing thread worked for (`zilla_core::env::working_for_pool`):
/// the stop is recorded in the state directory and that pool waits, UNAVAIL, for the
/// admin to import it by hand, so a pool that trips an assertion cannot crash-loop the
/// daemon.
fn stop_on_broken_invariant() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let msg = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned());
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_else(|| "?".into());
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        let msg = msg.as_deref().unwrap_or("panic");
        let pool = zilla_core::env::working_for_pool().map(|p| p.to_string()).or_else(|| pool_of_thread(&thread));
        let next_start = match &pool {
            Some(p) => format!(
                "the next start imports the other pools and leaves pool '{}' for the admin to import by hand",
                clip::clip(p)
            ),
            None => "the next start imports the pools".to_string(),
        };
        tracing::error!(
            "internal error (broken invariant) in thread {thread} at {at}: {msg}; stopping the daemon (on-disk state is the last synced txg; {next_start})"
        );
        if let Some(Err(e)) = state_dir::record_stop(pool, &thread, &format!("{msg} (at {at}, thread {thread})")) {
            tracing::error!("cannot record the stop in the state directory: {e}");
        }
        let bt = std::backtrace::Backtrace::capture();
        if bt.status() == std::backtrace::BacktraceStatus::Captured {
            eprintln!("{bt}");
        }
        std::process::abort();
    }));
}

/// Most glibc malloc arenas the daemon uses: one. glibc binds each thread to an arena
/// (up to 8 per core by default) and an arena keeps what is freed into it for its own
/// threads. The daemon's data buffers (dirty blocks, ARC buffers, request, log and
/// write buffers) are allocated by whichever NBD, blocking-pool or engine thread
/// handles a request and freed later by the sync thread or the ARC, and the threads
/// come and go, so with several arenas each one grows to its own peak share of the live
/// data and keeps it: the sum of the arenas' peaks is resident, not the peak of the
/// live data. `bench/run pool-vs-direct --quick`'s write phase (ARC max 64 MiB, dirty
/// max 128 MiB) peaked this far beyond ARC max + dirty max: 4 arenas 88 and
/// 105 MiB (three 64 MiB arena heaps full, besides the main heap), 2 arenas 53 and
/// 64 MiB, 1 arena 15 and 19 MiB (heaptrack: live heap 160–190 MiB throughout). An
/// earlier soak measured 2 arenas at about 60 MiB less than glibc's default.
/// Contention stays low: allocations up to 1 KiB come from glibc's per-thread cache
/// without the arena lock, and a data buffer's allocation is short next to filling it.
/// `MALLOC_ARENA_MAX` (or `glibc.malloc.arena_max` in `GLIBC_TUNABLES`) in the
/// environment overrides it.
const MALLOC_ARENAS_MAX: i32 = 1;

fn limit_malloc_arenas() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() || tunables.contains("arena_max") {
        return; // the operator's choice, read by glibc at start
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS_MAX);
    }
}

fn serve(state_dir: PathBuf, args: ServeArgs) {
    limit_malloc_arenas();
    init_tracing();
    memory::spawn_heap_returner();
    stop_on_broken_invariant();
    let mut listen = args.listen.clone();
    let mut settings = config::Settings::default();
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| die(format!("cannot read {}: {e}", path.display())));
        settings = config::Settings::parse(&text).unwrap_or_else(|e| die(format!("{}: {e}", path.display())));
        let explicit = |name: &str| std::env::args().any(|a| a == format!("--{name}") || a.starts_with(&format!("--{name}=")));
        for (name, from_file, arg) in [
            ("nbd", &settings.nbd, &mut listen.nbd),
            ("iscsi", &settings.iscsi, &mut listen.iscsi),
            ("http", &settings.http, &mut listen.http),
        ] {
            if let (Some(v), false) = (from_file, explicit(name)) {
                *arg = v.clone();
            }
        }
    }
    let iscsi_auth_from_file = settings.iscsi_auth.clone();
    let l = listen_opts(&listen);
    let lock = daemon::lock_state_dir(&state_dir, &settings).unwrap_or_else(|e| die(format!("{e:#}")));
    let config_path = args.config.clone().unwrap_or_default();
    if let Err(e) = tunables::apply_at_start(&config_path, &settings.tunables, &lock.dir, &args.tunables) {
        die(e);
    }
    let opts = daemon::ServeOpts {
        nbd: l.nbd,
        iscsi: l.iscsi,
        http: l.http,
        settings,
        no_import: args.no_import,
        iscsi_unauthenticated: args.iscsi_auth.as_deref().or(iscsi_auth_from_file.as_deref()) == Some("none"),
    };
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| die(format!("cannot start runtime: {e}")));
    // a service manager (Type=notify) hears when the daemon serves (sd_notify.rs)
    let ready = |info: &api::DaemonInfo| sd_notify::ready(&format!("serving {}", info.state_dir));
    if let Err(e) = rt.block_on(daemon::run(opts, lock, vec![], ready)) {
        die(format!("{e:#}"));
    }
    // Engine threads blocked in I/O must not keep a stopped daemon alive.
    rt.shutdown_timeout(Duration::from_secs(2));
}

// ---------------------------------------------------------------------------------
// Admin commands

/// "cannot VERB 'X': why", except that "no daemon" stands alone.
fn ctx(what: String) -> impl FnOnce(String) -> String {
    // the engine's message may already start with the same words ("cannot offline X: ...")
    move |e| if e.starts_with("no daemon is serving") || e.starts_with(&format!("{what}: ")) { e } else { format!("{what}: {e}") }
}

fn absolutize(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|c| c.join(p)).unwrap_or_else(|_| p.to_path_buf())
    }
}

fn resolve_leaf(mut l: LeafSpec) -> Result<LeafSpec, String> {
    l.path = absolutize(&l.path);
    if !l.path.exists() {
        let p = l.path.display();
        return Err(format!("cannot open '{p}': no such device or file (create it first, e.g. `truncate -s 1G {p}`)"));
    }
    Ok(l)
}

/// Parse the zpool vdev grammar here, so relative paths mean the caller's cwd.
fn parse_tops(args: &[String]) -> Result<Vec<TopSpec>, String> {
    let mut tops = crate::vdev_grammar::parse_vdev_args(args).map_err(|e| e.to_string())?;
    for t in &mut tops {
        for l in &mut t.leaves {
            *l = resolve_leaf(l.clone())?;
        }
    }
    Ok(tops)
}

/// A device name as the user typed it: an existing relative path becomes absolute
/// (the daemon's cwd is not ours); anything else is passed on as a vdev name.
fn device_name(d: &str) -> String {
    match LeafSpec::parse(d) {
        Ok(l) if l.path.is_relative() && l.path.exists() => LeafSpec { path: absolutize(&l.path), model: l.model }.display(),
        _ => d.to_string(),
    }
}

fn parse_assignment(a: &str) -> Result<(String, String), String> {
    match a.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("bad property assignment '{a}': expected PROP=VALUE")),
    }
}

fn pool_query(pools: &[String]) -> Vec<Option<String>> {
    if pools.is_empty() {
        vec![None]
    } else {
        pools.iter().cloned().map(Some).collect()
    }
}

async fn fetch<T: serde::de::DeserializeOwned>(c: &Client, route: &str, pools: &[String]) -> Result<Vec<T>, String> {
    let mut out = vec![];
    for p in pool_query(pools) {
        let r: Vec<T> = match &p {
            Some(p) => c.get(&format!("{route}?pool={}", enc(p))).await.map_err(ctx(format!("cannot open '{p}'")))?,
            None => c.get(route).await?,
        };
        out.extend(r);
    }
    Ok(out)
}

async fn admin(c: &Client, cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Pool(p) => pool_cmd(c, p).await,
        Cmd::Volume(v) => volume_cmd(c, v).await,
        Cmd::Get(args) => datasets::get(c, args).await,
        Cmd::List(args) => datasets::list(c, args).await,
        Cmd::Rename { force, name, new_name } => {
            let req = RenameReq { from: name.clone(), to: new_name.clone(), force };
            let _: Empty = c.post("/v1/rename", &req).await.map_err(ctx(format!("cannot rename '{name}'")))?;
            Ok(())
        }
        Cmd::Set { assignment, name } => set_cmd(c, &assignment, name).await,
        Cmd::Arcstat { fields, verbose: _, interval, count } => arcstat(c, fields.as_deref(), interval, count).await,
        Cmd::ArcSummary => {
            let m: std::collections::BTreeMap<String, u64> = c.get("/v1/arcstats").await?;
            let _ = write_stdout(&arcstats::summary(&m));
            Ok(())
        }
        Cmd::Zilstat { interval, count } => zilstat(c, interval, count).await,
        Cmd::Txgs { scripted, count, pool } => {
            let q = count.map_or(String::new(), |n| format!("?n={n}"));
            let rows: Vec<TxgEntry> = c.get(&format!("/v1/pools/{}/txgs{q}", enc(&pool))).await.map_err(ctx(format!("cannot open '{pool}'")))?;
            print!("{}", format::txgs_table(&rows, scripted));
            Ok(())
        }
        Cmd::Tunable(t) => tunable_cmd(c, t).await,
        Cmd::Iscsi(i) => iscsi_cmd(c, i).await,
        Cmd::Serve(_) | Cmd::Demo { .. } => unreachable!("handled in main"),
    }
}

/// `get PROPS NAME`: a volume's properties (POOL/NAME) or a pool's (POOL).
async fn get_cmd(c: &Client, scripted: bool, parsable: bool, props: &str, name: String) -> Result<(), String> {
    let props: Vec<String> =
        if props == "all" { vec![] } else { props.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect() };
    let rows: Vec<zilla_core::props::PropRow> = c.post("/v1/get", &GetReq { name: name.clone(), props }).await.map_err(ctx(format!("cannot open '{name}'")))?;
    print!("{}", format::prop_rows(&rows, scripted, parsable));
    Ok(())
}

/// `name` if it names a pool (`pool set` / `pool get`), else the error for `what`.
fn only_pool(name: String, what: &str, volume_cmd: &str) -> Result<String, String> {
    if name.contains('/') {
        return Err(format!("cannot {what} '{name}': not a pool (use 'zilla {volume_cmd}' for volumes)"));
    }
    Ok(name)
}

/// `pool trim`: start (or resume), suspend (-s) or cancel (-c) the manual trim; -w
/// waits for the pass to end.
async fn trim_cmd(c: &Client, wait: bool, suspend: bool, cancel: bool, pool: &str) -> Result<(), String> {
    use zilla_core::spa::trim::TrimCmd;
    let cmd = if cancel { TrimCmd::Cancel } else if suspend { TrimCmd::Suspend } else { TrimCmd::Start };
    let _: Empty = c.post(&format!("/v1/pools/{}/trim", enc(pool)), &TrimReq { cmd, wait }).await.map_err(ctx(format!("cannot trim '{pool}'")))?;
    Ok(())
}

/// `set PROP=VALUE NAME`: a volume property (POOL/NAME) or a pool property (POOL).
async fn set_cmd(c: &Client, assignment: &str, name: String) -> Result<(), String> {
    let (property, value) = parse_assignment(assignment)?;
    let _: Empty = c.post("/v1/set", &SetReq { name: name.clone(), property, value }).await.map_err(ctx(format!("cannot set property for '{name}'")))?;
    Ok(())
}

/// `pool status [-v] [-x] [POOL]...` (the daemon's notices first when no pool is named).
async fn status_cmd(c: &Client, verbose: bool, problems: bool, pools: &[String]) -> Result<(), String> {
    let st: Vec<PoolStatusEntry> = fetch(c, "/v1/status", pools).await?;
    if pools.is_empty() {
        print_notices(c).await;
    }
    if st.is_empty() {
        println!("no pools available");
        return Ok(());
    }
    let shown: Vec<&PoolStatusEntry> = st.iter().filter(|s| !problems || !format::is_healthy_entry(s)).collect();
    if shown.is_empty() {
        match pools {
            [one] => println!("pool '{one}' is healthy"),
            _ => println!("all pools are healthy"),
        }
        return Ok(());
    }
    let text: Vec<String> = shown.iter().map(|s| format::pool_status(&s.status, s.unavailable.as_deref(), verbose)).collect();
    print!("{}", text.join("\n"));
    Ok(())
}

async fn pool_cmd(c: &Client, cmd: PoolCmd) -> Result<(), String> {
    match cmd {
        PoolCmd::Create { force, props, pool, vdevs } => {
            let err = ctx(format!("cannot create '{pool}'"));
            let props = props.iter().map(|p| parse_assignment(p)).collect::<Result<Vec<_>, _>>().map_err(ctx(format!("cannot create '{pool}'")))?;
            let tops = match parse_tops(&vdevs) {
                Ok(t) => t,
                Err(e) => return Err(err(e)),
            };
            let _: Empty = c.post("/v1/pools", &CreatePool { name: pool.clone(), tops, force, props }).await.map_err(err)?;
        }
        PoolCmd::Status { verbose, problems, pools } => status_cmd(c, verbose, problems, &pools).await?,
        PoolCmd::List { scripted, parsable, columns, pools } => {
            let cols = format::list_columns(columns.as_deref())?;
            let rows: Vec<PoolListRow> = fetch(c, "/v1/pools", &pools).await?;
            if rows.is_empty() && !scripted {
                println!("no pools available");
                return Ok(());
            }
            print!("{}", format::pool_list(&rows, &cols, scripted, parsable));
        }
        PoolCmd::Iostat { verbose, latency, queues, histograms, scripted, parsable, args } => {
            let f = IostatFlags { verbose, latency, queues, histograms, scripted, parsable };
            iostat(c, f, &args).await?;
        }
        PoolCmd::Set { assignment, pool } => set_cmd(c, &assignment, only_pool(pool, "set property for", "set")?).await?,
        PoolCmd::Get { scripted, parsable, props, pool } => get_cmd(c, scripted, parsable, &props, only_pool(pool, "get properties of", "get")?).await?,
        PoolCmd::Scrub { wait, pause, stop, pool } => {
            let cmd = if stop { ScrubCmd::Stop } else if pause { ScrubCmd::Pause } else { ScrubCmd::Start };
            let _: Empty = c.post(&format!("/v1/pools/{}/scrub", enc(&pool)), &ScrubReq { cmd, wait }).await.map_err(ctx(format!("cannot scrub '{pool}'")))?;
        }
        PoolCmd::Trim { wait, suspend, cancel, pool } => trim_cmd(c, wait, suspend, cancel, &pool).await?,
        PoolCmd::Import { dirs, force, rewind, dry_run, missing_log, pool } => import_cmd(c, dirs, ImportFlags { force, rewind, dry_run, missing_log }, pool).await?,
        PoolCmd::Export { force, pool } => {
            let _: Empty = c.post(&format!("/v1/pools/{}/export{}", enc(&pool), force_query(force)), &Empty {}).await.map_err(ctx(format!("cannot export '{pool}'")))?;
        }
        PoolCmd::Destroy { force, pool } => {
            let _: Empty = c.delete(&format!("/v1/pools/{}{}", enc(&pool), force_query(force))).await.map_err(ctx(format!("cannot destroy '{pool}'")))?;
        }
        PoolCmd::Add { force, dry_run, pool, vdevs } => add_cmd(c, force, dry_run, &pool, &vdevs).await?,
        PoolCmd::Attach { force, wait, pool, device, new_device } => device_change_cmd(c, "attach", force, wait, &pool, &device, Some(&new_device)).await?,
        PoolCmd::Replace { force, wait, pool, device, new_device } => device_change_cmd(c, "replace", force, wait, &pool, &device, new_device.as_deref()).await?,
        PoolCmd::Wait { activities, pool } => wait_cmd(c, &activities, &pool).await?,
        PoolCmd::Detach { pool, device } => device_op(c, "detach", &pool, Some(device)).await?,
        PoolCmd::Remove { pool, device } => device_op(c, "remove", &pool, Some(device)).await?,
        PoolCmd::Offline { pool, device } => device_op(c, "offline", &pool, Some(device)).await?,
        PoolCmd::Online { pool, device } => device_op(c, "online", &pool, Some(device)).await?,
        PoolCmd::Clear { pool, device } => device_op(c, "clear", &pool, device).await?,
        PoolCmd::Upgrade { pool } => {
            let req = DeviceReq { device: None, new: None, force: false, wait: false };
            let _: Empty = c.post(&format!("/v1/pools/{}/upgrade", enc(&pool)), &req).await.map_err(ctx(format!("cannot upgrade '{pool}'")))?;
            println!("pool '{pool}' is at format 2, the newest this build writes");
        }
        PoolCmd::Log(l) => crate::events::log_cmd(c, l).await?,
    }
    Ok(())
}

/// `pool add [-f] [-n] POOL VDEV...`; -n prints the layout the pool would have, as
/// `zpool add -n` does. A replication mismatch is zpool's message as it is.
async fn add_cmd(c: &Client, force: bool, dry_run: bool, pool: &str, vdevs: &[String]) -> Result<(), String> {
    let what = format!("cannot add to '{pool}'");
    // the daemon's answer is one line (newlines escaped); zpool prints this one on three
    let err = |e: String| if e.starts_with("invalid vdev specification") { e.replace("\\n", "\n") } else { ctx(what.clone())(e) };
    let tops = parse_tops(vdevs).map_err(err)?;
    let reply: AddReply = c.post(&format!("/v1/pools/{}/add", enc(pool)), &AddReq { tops, force, dry_run }).await.map_err(err)?;
    if dry_run {
        print!("would update '{pool}' to the following configuration:\n{}", format::layout_tree(pool, &reply.would_be));
    }
    Ok(())
}

/// `pool attach [-f] [-w]` and `pool replace [-f] [-w]` (op "attach" or "replace"; a
/// replace with no new device is in place).
async fn device_change_cmd(c: &Client, op: &str, force: bool, wait: bool, pool: &str, device: &str, new_device: Option<&str>) -> Result<(), String> {
    let new_name = new_device.unwrap_or(device);
    let what = if op == "attach" { format!("cannot attach {new_name} to {device}") } else { format!("cannot replace {device} with {new_name}") };
    let err = || ctx(what.clone());
    let new = new_device.map(|n| LeafSpec::parse(n).map_err(|e| e.to_string()).and_then(resolve_leaf)).transpose().map_err(err())?;
    let req = DeviceReq { device: Some(device_name(device)), new, force, wait };
    let _: Empty = c.post(&format!("/v1/pools/{}/{op}", enc(pool)), &req).await.map_err(err())?;
    Ok(())
}

/// `pool wait [-t ACTIVITY,...] POOL`.
async fn wait_cmd(c: &Client, activities: &[String], pool: &str) -> Result<(), String> {
    let err = |e: String| ctx(format!("cannot wait for '{pool}'"))(e);
    let activities = activities.iter().map(|a| zilla_core::spa::Activity::parse(a).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>().map_err(err)?;
    let _: Empty = c.post(&format!("/v1/pools/{}/wait", enc(pool)), &WaitReq { activities }).await.map_err(err)?;
    Ok(())
}

/// What the daemon says the admin should know about its start (a cache file it could
/// not read), one `note:` line each; nothing when it cannot be asked.
async fn print_notices(c: &Client) {
    let Ok(info) = c.get::<DaemonInfo>("/v1/info").await else { return };
    for n in &info.notices {
        println!("note: {}", clip::clip_message(n));
    }
}

/// `zilla pool import` flags: -f, -F, -n, -m.
struct ImportFlags {
    force: bool,
    rewind: bool,
    dry_run: bool,
    missing_log: bool,
}

/// `zilla pool import`: list the importable pools, import one, or plan a rewind (-F -n).
async fn import_cmd(c: &Client, dirs: Vec<PathBuf>, flags: ImportFlags, pool: Option<String>) -> Result<(), String> {
    let ImportFlags { force, rewind, dry_run, missing_log } = flags;
    let dirs: Vec<String> = dirs.iter().map(|d| absolutize(d).display().to_string()).collect();
    match pool {
        Some(name) if dry_run => {
            let plan: zilla_core::spa::RewindPlan = c
                .post("/v1/import/rewind-plan", &ImportReq { dirs, name: Some(name.clone()), force, rewind, missing_log })
                .await
                .map_err(ctx(format!("cannot plan a rewind of '{name}'")))?;
            println!("{}", format_rewind_plan(&plan));
        }
        Some(name) => {
            let _: Empty = c
                .post("/v1/import", &ImportReq { dirs, name: Some(name.clone()), force, rewind, missing_log })
                .await
                .map_err(ctx(format!("cannot import '{name}'")))?;
        }
        None => {
            print_notices(c).await;
            let found: zilla_core::spa::ImportScan = c
                .post("/v1/importable", &ImportReq { dirs, name: None, ..Default::default() })
                .await
                .map_err(ctx("cannot discover pools".to_string()))?;
            for (i, p) in found.pools.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print!("{}", format_importable(p));
            }
            for (i, u) in found.unusable.iter().enumerate() {
                if i > 0 || !found.pools.is_empty() {
                    println!();
                }
                print!("{}", format_unusable(u));
            }
            if found.pools.is_empty() {
                return Err("no pools available to import".into());
            }
        }
    }
    Ok(())
}

async fn device_op(c: &Client, op: &str, pool: &str, device: Option<String>) -> Result<(), String> {
    let what = match &device {
        Some(d) if op == "clear" => format!("cannot clear errors for {d}"),
        Some(d) => format!("cannot {op} {d}"),
        None => format!("cannot clear errors for '{pool}'"),
    };
    let req = DeviceReq { device: device.as_deref().map(device_name), new: None, force: false, wait: false };
    let _: Empty = c.post(&format!("/v1/pools/{}/{op}", enc(pool)), &req).await.map_err(ctx(what))?;
    Ok(())
}

/// `zilla pool import -F -n`, as an admin reads it.
fn format_rewind_plan(p: &zilla_core::spa::RewindPlan) -> String {
    if p.load_txg == p.newest_txg {
        return format!("pool '{}': its newest txg {} reads back; no rewind is needed", p.pool, p.newest_txg.get());
    }
    format!(
        "pool '{}': {}\nWould rewind from txg {} to txg {}, discarding about {:.1} seconds of acknowledged writes.\nRun the same command without -n to do it.",
        p.pool,
        p.reason,
        p.newest_txg.get(),
        p.load_txg.get(),
        p.dropped_seconds
    )
}

/// A device of the listing whose label cannot be used, as `zpool import` shows one.
fn format_unusable(u: &zilla_core::spa::UnusableLabel) -> String {
    let reason = crate::clip::clip_message(&u.reason);
    let mut chars = reason.chars();
    let reason: String = chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default();
    format!(
        " device: {}\n  state: UNAVAIL\n status: {reason}.\n action: No pool can be imported from this device; import its pool from its other devices,\n\tif any, and replace this one.\n",
        format::safe(&u.device.display()),
    )
}

/// The listing's status line for a log vdev none of whose devices can be used.
fn log_devices_status(p: &ImportablePool) -> String {
    let logs: Vec<String> = p
        .missing
        .iter()
        .filter(|(r, _)| *r == zilla_core::vdev::Role::Log)
        .map(|(_, l)| format!("{} ({})", format::safe(&l.display()), if l.path.exists() { "has no valid label" } else { "missing" }))
        .collect();
    format!(
        "The log device(s) {} cannot be used; the synchronous writes acknowledged after\n\tthe last synced txg are in the intent log records on them.",
        logs.join(", ")
    )
}

fn format_importable(p: &ImportablePool) -> String {
    use zilla_core::spa::PoolHealth;
    use zilla_core::vdev::Role;
    let name = format::safe(&p.name);
    let names = |role: Role| -> Vec<String> { p.missing.iter().filter(|(r, _)| *r == role).map(|(_, l)| format::safe(&l.display())).collect() };
    let absent = |role: Role| -> Vec<String> { p.absent_vdevs.iter().filter(|(r, _)| *r == role).map(|(_, v)| format::safe(v)).collect() };
    let (absent_data, absent_log, missing_data, missing_log) = (absent(Role::Normal), absent(Role::Log), names(Role::Normal), names(Role::Log));
    // a daemon that does not say (older): as before, any missing data device is fatal
    let health = p.health.unwrap_or(if missing_data.is_empty() && missing_log.is_empty() { PoolHealth::Online } else { PoolHealth::Unavail });
    let mut o = format!("   pool: {name}\n     id: {}\n  state: {health}\n", p.guid);
    // devices missing from vdevs that still have one (a whole log vdev missing: below)
    let mut missing = missing_data.clone();
    if absent_log.is_empty() {
        missing.extend(missing_log.iter().cloned());
    }
    // a device the config names whose path exists holds no label of this pool (wiped,
    // relabelled, or another file now): not "missing from the system"
    let exists = |shown: &String| p.missing.iter().any(|(_, l)| format::safe(&l.display()) == *shown && l.path.exists());
    let (unlabelled, missing): (Vec<String>, Vec<String>) = missing.into_iter().partition(|m| exists(m));
    let mut status = vec![];
    if !missing.is_empty() {
        status.push(format!("One or more devices are missing from the system: {}.", missing.join(", ")));
    }
    if !unlabelled.is_empty() {
        status.push(format!("One or more devices exist but hold no valid label of this pool: {}.", unlabelled.join(", ")));
    }
    if !absent_log.is_empty() {
        status.push(log_devices_status(p));
    }
    for (guid, specs) in &p.duplicates {
        let shown: Vec<String> = specs.iter().map(|s| format::safe(&s.display())).collect();
        status.push(format!("The devices {} claim to be the same device (guid {guid}):\n\ta copied disk, or a crafted label.", shown.join(" and ")));
    }
    if !status.is_empty() {
        o.push_str(&format!(" status: {}\n", status.join("\n\t")));
    }
    let action = if !p.duplicates.is_empty() {
        "The pool cannot be imported while two devices claim to be the same one: take out\n\tthe ones that are not the pool's (or name the devices to use with -d) and import again.".to_string()
    } else if !absent_data.is_empty() {
        format!("The pool cannot be imported: every device of {} is missing. Attach the missing\n\tdevices and try again.", absent_data.join(", "))
    } else if !absent_log.is_empty() {
        "Attach the missing log device(s) and import, or import with 'zilla pool import -m' to\n\tdiscard the log records on them (those synchronous writes are lost).".to_string()
    } else if health == PoolHealth::Degraded {
        "The pool can be imported using its name or numeric identifier. It will be DEGRADED:\n\tits redundancy is reduced until the missing devices come back or are replaced.".to_string()
    } else {
        "The pool can be imported using its name or numeric identifier.".to_string()
    };
    o.push_str(&format!(" action: {action}\n config:\n\n\t{name}  {health}\n"));
    for l in &p.leaves {
        o.push_str(&format!("\t  {}\n", format::safe(&l.display())));
    }
    for (role, l) in &p.missing {
        let class = match role {
            Role::Log => "log ",
            Role::Cache => "cache ",
            Role::Spare => "spare ",
            _ => "",
        };
        let what = if l.path.exists() { "has no valid label" } else { "missing" };
        o.push_str(&format!("\t  {}  {class}device {what}\n", format::safe(&l.display())));
    }
    o
}

/// `[POOL] [INTERVAL [COUNT]]`, as zpool: trailing numbers are interval and count.
fn iostat_args(args: &[String]) -> Result<(Vec<String>, Option<f64>, Option<u64>), String> {
    let mut pools: Vec<String> = args.to_vec();
    let mut nums = vec![];
    while let Some(last) = pools.last() {
        if nums.len() < 2 && last.parse::<f64>().is_ok() {
            nums.insert(0, pools.pop().unwrap());
        } else {
            break;
        }
    }
    let interval = match nums.first() {
        Some(s) => {
            let v: f64 = s.parse().map_err(|_| format!("bad interval '{s}'"))?;
            check_interval(Some(v))?;
            Some(v)
        }
        None => None,
    };
    let count = match nums.get(1) {
        Some(s) => Some(s.parse::<u64>().map_err(|_| format!("bad count '{s}': expected a whole number"))?),
        None => None,
    };
    Ok((pools, interval, count))
}

async fn iostat(c: &Client, f: IostatFlags, args: &[String]) -> Result<(), String> {
    let (pools, interval, count) = iostat_args(args)?;
    let mut prev: Option<Vec<IostatEntry>> = None;
    let mut n = 0u64;
    loop {
        let cur: Vec<IostatEntry> = fetch(c, "/v1/iostat", &pools).await?;
        if cur.is_empty() {
            println!("no pools available");
            return Ok(());
        }
        print!("{}", format::iostat_report(&cur, prev.as_deref(), f));
        n += 1;
        let Some(iv) = interval else { return Ok(()) };
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        prev = Some(cur);
        tokio::time::sleep(Duration::from_secs_f64(iv)).await;
    }
}

/// INTERVAL of iostat, arcstat, zilstat: a positive number of seconds a sleep can take
/// (NaN, 0, negative or 1e300 seconds panicked in the sleep after the first row).
fn check_interval(interval: Option<f64>) -> Result<(), String> {
    match interval {
        Some(v) if !(v > 0.0 && Duration::try_from_secs_f64(v).is_ok()) => {
            Err(format!("bad interval '{v}': must be greater than zero and at most {} seconds", u64::MAX))
        }
        _ => Ok(()),
    }
}

/// Write to stdout and flush (a row shows when it is taken); false when stdout is gone
/// (a closed pipe), where `print!` would panic.
fn write_stdout(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_ok()
}

/// `zilla arcstat`: arcstat.py's fields (the default columns unless `-f`). The first
/// row is the totals since the daemon started; later rows are per-second rates over
/// each INTERVAL (sizes are current values).
async fn arcstat(c: &Client, fields: Option<&str>, interval: Option<f64>, count: Option<u64>) -> Result<(), String> {
    check_interval(interval)?;
    let fields = arcstats::parse_fields(fields)?;
    let mut prev: Option<std::collections::BTreeMap<String, u64>> = None;
    let mut n = 0;
    if !write_stdout(&format!("{}\n", arcstats::header(&fields))) {
        return Ok(());
    }
    loop {
        let cur: std::collections::BTreeMap<String, u64> = c.get("/v1/arcstats").await?;
        let time = {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs() % 86400;
            format!("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
        };
        let secs = if prev.is_some() { interval.unwrap_or(1.0) } else { 1.0 };
        if !write_stdout(&format!("{}\n", arcstats::row(&fields, &cur, prev.as_ref(), secs, &time))) {
            return Ok(()); // the reader went away (`| head`): done, as arcstat.py
        }
        n += 1;
        let Some(iv) = interval else { break };
        if count.is_some_and(|c| n >= c) {
            break;
        }
        prev = Some(cur);
        tokio::time::sleep(Duration::from_secs_f64(iv)).await;
    }
    Ok(())
}

/// `zilla zilstat`: OpenZFS zilstat's default columns (time, then cc ic idc idb iic iib
/// imnc imnw imsc imsw). The first row is the totals since the pools were imported;
/// later rows are per-second rates over each interval.
async fn zilstat(c: &Client, interval: Option<f64>, count: Option<u64>) -> Result<(), String> {
    check_interval(interval)?;
    let mut prev: Option<std::collections::BTreeMap<String, u64>> = None;
    let mut n = 0;
    println!("{}", format::zilstat_header());
    loop {
        let cur: std::collections::BTreeMap<String, u64> = c.get("/v1/zilstats").await?;
        let secs = if prev.is_some() { interval.unwrap_or(1.0) } else { 1.0 };
        println!("{}", format::zilstat_row(&cur, prev.as_ref(), secs));
        n += 1;
        let Some(iv) = interval else { break };
        if count.is_some_and(|c| n >= c) {
            break;
        }
        prev = Some(cur);
        tokio::time::sleep(Duration::from_secs_f64(iv)).await;
    }
    Ok(())
}

async fn volume_cmd(c: &Client, cmd: VolumeCmd) -> Result<(), String> {
    match cmd {
        VolumeCmd::Create { sparse, size, blocksize, props, name } => {
            let err = ctx(format!("cannot create '{name}'"));
            let mut volblocksize = blocksize.unwrap_or(16 * 1024);
            let mut rest = vec![];
            for p in &props {
                let (k, v) = parse_assignment(p).map_err(ctx(format!("cannot create '{name}'")))?;
                if k == "volblocksize" {
                    volblocksize = units::parse_size(&v).map_err(ctx(format!("cannot create '{name}'")))?;
                } else {
                    rest.push((k, v));
                }
            }
            let volblocksize = u32::try_from(volblocksize).map_err(|_| err(format!("bad volblocksize {volblocksize}")))?;
            let req = CreateVolume { name: name.clone(), volsize: size, volblocksize, sparse, props: rest };
            let _: Empty = c.post("/v1/volumes", &req).await.map_err(ctx(format!("cannot create '{name}'")))?;
        }
        VolumeCmd::List { scripted, parsable, pools } => {
            let vols: Vec<VolumeInfo> = fetch(c, "/v1/volumes", &pools).await?;
            if vols.is_empty() && !scripted {
                println!("no datasets available");
                return Ok(());
            }
            print!("{}", format::volume_list(&vols, scripted, parsable));
        }
        VolumeCmd::Destroy { force, name } => {
            let err = ctx(format!("cannot destroy '{name}'"));
            let Some((pool, vol)) = name.split_once('/') else {
                return Err(err("not a volume name (expected POOL/NAME)".into()));
            };
            let path = format!("/v1/volumes/{}/{}{}", enc(pool), enc(vol), force_query(force));
            let _: Empty = c.delete(&path).await.map_err(err)?;
        }
    }
    Ok(())
}

async fn tunable_cmd(c: &Client, cmd: TunableCmd) -> Result<(), String> {
    match cmd {
        TunableCmd::Get { scripted, parsable, verbose, name } => {
            let mut rows: Vec<TunableRow> = c.get("/v1/tunables").await?;
            if let Some(n) = &name {
                rows.retain(|r| &r.name == n);
                if rows.is_empty() {
                    return Err(format!("unknown tunable '{n}'"));
                }
            }
            print!("{}", tunables::listing(&rows, scripted, parsable, verbose || name.is_some()));
        }
        TunableCmd::Set { persistent, assignment } => {
            let (name, v) = parse_assignment(&assignment)?;
            let err = ctx(format!("cannot set tunable '{name}'"));
            let reset = v == "default";
            let value = match zilla_core::tunables().find(&name) {
                Some(_) if reset => 0,
                Some(t) => tunables::parse_value(t, &v).map_err(ctx(format!("cannot set tunable '{name}'")))?,
                None => return Err(err(format!("unknown tunable '{}'", clip::clip(&name)))),
            };
            let req = TunableSet { name: name.clone(), value, persistent, reset };
            let _: Empty = c.post("/v1/tunables", &req).await.map_err(err)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// iSCSI

/// A CHAP secret from a file: its bytes less one trailing newline, as text.
fn read_secret(path: &Path) -> Result<String, String> {
    use std::io::Read;
    // a secret has at most 255 bytes (and a line end): read no more than that, so a
    // device or a pipe named by mistake cannot fill memory
    const READ_MAX_BYTES: u64 = 258;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(READ_MAX_BYTES).read_to_end(&mut bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 == READ_MAX_BYTES {
        return Err(format!("{}: a CHAP secret has 12 to 255 bytes; the file is longer", path.display()));
    }
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    String::from_utf8(bytes.to_vec()).map_err(|_| format!("{}: a CHAP secret must be text (UTF-8)", path.display()))
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

async fn iscsi_cmd(c: &Client, cmd: IscsiCmd) -> Result<(), String> {
    match cmd {
        IscsiCmd::Auth { target, default: _, user, secret_file, mutual_user, mutual_secret_file, initiators, clear } => {
            let shown = target.clone().unwrap_or_else(|| "default".into());
            let err = |e: String| format!("cannot set iSCSI authentication of '{shown}': {e}");
            let secret = secret_file.as_deref().map(read_secret).transpose().map_err(err)?;
            let mutual_secret = mutual_secret_file.as_deref().map(read_secret).transpose().map_err(err)?;
            let changes = clear || user.is_some() || mutual_user.is_some() || !initiators.is_empty();
            let view: IscsiAuthView = if changes {
                let req = IscsiAuthRequest {
                    target,
                    clear,
                    user,
                    secret,
                    mutual_user,
                    mutual_secret,
                    initiators: (!initiators.is_empty()).then_some(initiators),
                };
                c.post("/v1/iscsi/auth", &req).await.map_err(err)?
            } else {
                let listing: IscsiListing = c.get("/v1/iscsi").await?;
                match &target {
                    None => listing.default,
                    Some(t) => {
                        let name = iscsi_admin::target_name(t).map_err(ctx(format!("cannot show '{shown}'")))?;
                        listing.entries.into_iter().find(|e| e.target == name).unwrap_or(IscsiAuthView {
                            target: name,
                            auth: listing.default.auth.clone(),
                            user: listing.default.user.clone(),
                            mutual_user: listing.default.mutual_user.clone(),
                            initiators: listing.default.initiators.clone(),
                            own_entry: false,
                        })
                    }
                }
            };
            println!("target       {}", view.target);
            println!("auth         {}{}", view.auth, if view.own_entry { "" } else { " (from the default entry)" });
            println!("user         {}", view.user.as_deref().unwrap_or("-"));
            println!("mutual user  {}", view.mutual_user.as_deref().unwrap_or("-"));
            let list = if view.initiators.is_empty() { "any".to_string() } else { view.initiators.join(", ") };
            println!("initiators   {list}");
            Ok(())
        }
        IscsiCmd::List { scripted, parsable, what } => {
            let listing: IscsiListing = c.get("/v1/iscsi").await?;
            print_iscsi_listing(&listing, scripted, parsable, what.as_deref());
            Ok(())
        }
    }
}


/// `zilla iscsi list`: the targets and the sessions (`what`: only one of them).
fn print_iscsi_listing(listing: &IscsiListing, scripted: bool, parsable: bool, what: Option<&str>) {
    let size = |n: usize| if parsable { n.to_string() } else { units::nicebytes(n as u64) };
    let show_targets = what != Some("sessions");
    let show_sessions = what != Some("targets");
    if show_targets {
        let mut rows = vec![vec![
            "default".to_string(),
            "-".to_string(),
            "-".to_string(),
            listing.default.auth.clone(),
            listing.default.initiators.len().to_string(),
        ]];
        for t in &listing.targets {
            rows.push(vec![t.iqn.clone(), t.volume.clone(), yes_no(t.shared), t.auth.clone(), t.initiators.to_string()]);
        }
        let a = [format::Align::Left, format::Align::Left, format::Align::Left, format::Align::Left, format::Align::Right];
        print!("{}", format::table(&["TARGET", "VOLUME", "SHARED", "AUTH", "ACL"], &a, &rows, scripted));
    }
    if show_sessions {
        if show_targets && !scripted {
            println!();
        }
        let rows: Vec<Vec<String>> = listing
            .sessions
            .iter()
            .map(|s| {
                let digest = |on: bool| if on { "CRC32C" } else { "None" }.to_string();
                vec![
                    s.initiator.clone(),
                    s.isid.clone(),
                    s.tsih.to_string(),
                    s.peer.clone(),
                    if s.discovery { "discovery".to_string() } else { s.target.clone() },
                    s.auth.clone(),
                    size(s.max_recv_data_segment_length),
                    size(s.max_burst_length),
                    size(s.first_burst_length),
                    yes_no(s.immediate_data),
                    yes_no(s.initial_r2t),
                    digest(s.header_digest),
                    digest(s.data_digest),
                ]
            })
            .collect();
        if rows.is_empty() && !scripted {
            println!("no iSCSI sessions");
        } else {
            use format::Align::{Left, Right};
            let a = [Left, Left, Right, Left, Left, Left, Right, Right, Right, Left, Left, Left, Left];
            let h = ["INITIATOR", "ISID", "TSIH", "PEER", "TARGET", "AUTH", "MAXRECVDSL", "MAXBURST", "FIRSTBURST", "IMMDATA", "INITR2T", "HDRDIGEST", "DATADIGEST"];
            print!("{}", format::table(&h, &a, &rows, scripted));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The checked-in man pages and completions match the CLI definition (manuals.rs).
    #[test]
    fn manuals_are_current() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let generated = manuals::generate(Cli::command()).unwrap();
        if std::env::var_os("ZILLA_REGENERATE_MANUALS").is_some() {
            manuals::write(&root, &generated).unwrap();
        }
        let stale = manuals::stale(&root, &generated);
        assert!(stale.is_empty(), "man pages or completions are stale:\n  {}\nregenerate them with:\n  {}", stale.join("\n  "), manuals::REGENERATE);
    }

    #[test]
    fn iostat_positional_args() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(iostat_args(&s(&["tank", "1", "3"])).unwrap(), (s(&["tank"]), Some(1.0), Some(3)));
        assert_eq!(iostat_args(&s(&["2"])).unwrap(), (vec![], Some(2.0), None));
        assert_eq!(iostat_args(&s(&[])).unwrap(), (vec![], None, None));
        assert!(iostat_args(&s(&["0"])).is_err());
    }

    #[test]
    fn config_lines() {
        let c = config::parse_lines("# x\nnbd = \"127.0.0.1:1\"\nhttp=off\n").unwrap();
        assert_eq!(c, vec![("nbd".into(), "127.0.0.1:1".into()), ("http".into(), "off".into())]);
        assert!(config::parse_lines("garbage").is_err());
    }
}

