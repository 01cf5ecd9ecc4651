//! `zilla-lazyfs BACKING_DIR MOUNTPOINT`: mount the lazy file system (foreground).
//!
//! Runs until the mount is unmounted (`fusermount3 -u MOUNTPOINT`); then exits 0.
//! Control: write commands to MOUNTPOINT/.lazyfs-ctl (see the `ctl` module).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fuser::{Config, MountOption};

#[derive(Parser)]
#[command(name = "zilla-lazyfs", about = "FUSE pass-through that loses unsynced data on command (test tool)")]
struct Args {
    /// Directory whose files are served (and receive data on fsync).
    backing_dir: PathBuf,
    /// Where to mount.
    mountpoint: PathBuf,
    /// Bound of the unsynced-data cache; when full, the oldest pages are written back
    /// without a sync.
    #[arg(long, default_value_t = 256)]
    cache_mib: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let backing = match std::fs::canonicalize(&args.backing_dir) {
        Ok(p) if p.is_dir() => p,
        Ok(p) => return fail(&format!("{} is not a directory", p.display())),
        Err(e) => return fail(&format!("cannot use {}: {e}", args.backing_dir.display())),
    };
    if args.cache_mib == 0 {
        return fail("--cache-mib must be at least 1");
    }
    let fs = zilla_lazyfs::fs::LazyFs::new(backing, args.cache_mib << 20);
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("zilla-lazyfs".into()),
        MountOption::Subtype("zilla-lazyfs".into()),
        MountOption::DefaultPermissions,
    ];
    match fuser::mount(fs, &args.mountpoint, &config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("mount on {}: {e}", args.mountpoint.display())),
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("zilla-lazyfs: {msg}");
    ExitCode::FAILURE
}
