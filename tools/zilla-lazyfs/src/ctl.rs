//! The control file `/.lazyfs-ctl`: commands in, state out.
//!
//! Theory of operation
//! -------------------
//! A test drives the file system with plain shell I/O on one file in the mount root:
//!
//! ```text
//!   echo drop                  > MNT/.lazyfs-ctl   every unsynced page is lost
//!   echo "tear 42"             > MNT/.lazyfs-ctl   seeded random subset persists, one torn
//!   echo "fail-fsync /a 1"     > MNT/.lazyfs-ctl   next sync of /a: EIO + its pages lost
//!   echo "lie-fsync /a"        > MNT/.lazyfs-ctl   syncs of /a succeed, persist nothing
//!   echo "kill-after-writes P N" > MNT/.lazyfs-ctl SIGKILL process P just before the
//!                                                 N-th file write from now (it fails)
//!   echo "kill-at-sync P N"    > MNT/.lazyfs-ctl   ... just before the N-th sync
//!   echo "fail-write /a 100"   > MNT/.lazyfs-ctl   next 100 writes to /a: EIO, no effect
//!   echo clear                 > MNT/.lazyfs-ctl   disarm every fault and planned kill
//!   cat MNT/.lazyfs-ctl                           stats, armed faults, last result
//! ```
//!
//! Each line written is one command; a bad command fails the write with EINVAL (the
//! shell prints "Invalid argument") and the reason is the `last` line of the next read.
//! A read returns a snapshot taken when the file was opened.

use crate::cache::SyncFault;

/// Name of the control file in the mount root.
pub const CTL_NAME: &str = ".lazyfs-ctl";

/// One parsed control command.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Drop,
    /// Tear with this seed (None: seeded from the clock, reported back).
    Tear(Option<u64>),
    /// Arm `fault` for the next `count` syncs of the file at this path (mount-relative).
    Fault { path: String, fault: SyncFault, count: u64 },
    /// Fail the next `count` writes to the file at this path.
    FailWrite { path: String, count: u64 },
    /// SIGKILL `pid` at the `count`-th file write (or sync) from now, before that
    /// write (or sync) happens: a power cut at a chosen point of the application's I/O.
    Kill { pid: i32, on: KillOn, count: u64 },
    Clear,
    Stats,
}

/// Which operation a planned kill counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillOn {
    Write,
    Sync,
}

/// A mount-relative path as the cache names files: no leading '/', no '.' or '..'.
pub fn normalize_path(path: &str) -> Result<String, String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.is_empty() || parts.contains(&"..") {
        return Err(format!("bad path '{path}': want a file inside the mount, e.g. /disk0"));
    }
    Ok(parts.join("/"))
}

fn parse_count(word: Option<&str>, default: u64) -> Result<u64, String> {
    match word {
        None => Ok(default),
        Some(w) => w.parse::<u64>().map_err(|_| format!("bad count '{w}': want a whole number")),
    }
}

fn parse_pid(word: &str) -> Result<i32, String> {
    match word.parse::<i32>() {
        Ok(pid) if pid > 1 => Ok(pid),
        _ => Err(format!("bad pid '{word}': want a process id above 1")),
    }
}

fn parse_n(word: &str) -> Result<u64, String> {
    match parse_count(Some(word), 0)? {
        0 => Err("bad count '0': want 1 or more".into()),
        n => Ok(n),
    }
}

/// Parse one command line.
pub fn parse(line: &str) -> Result<Command, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let cmd = match words.as_slice() {
        ["drop"] => Command::Drop,
        ["tear"] => Command::Tear(None),
        ["tear", seed] => {
            Command::Tear(Some(seed.parse().map_err(|_| format!("bad seed '{seed}': want a whole number"))?))
        }
        ["fail-fsync", path, rest @ ..] if rest.len() <= 1 => Command::Fault {
            path: normalize_path(path)?,
            fault: SyncFault::Fail,
            count: parse_count(rest.first().copied(), 1)?,
        },
        ["lie-fsync", path, rest @ ..] if rest.len() <= 1 => Command::Fault {
            path: normalize_path(path)?,
            fault: SyncFault::Lie,
            count: parse_count(rest.first().copied(), u64::MAX)?,
        },
        ["fail-write", path, rest @ ..] if rest.len() <= 1 => {
            Command::FailWrite { path: normalize_path(path)?, count: parse_count(rest.first().copied(), 1)? }
        }
        ["kill-after-writes", pid, n] => Command::Kill { pid: parse_pid(pid)?, on: KillOn::Write, count: parse_n(n)? },
        ["kill-at-sync", pid, n] => Command::Kill { pid: parse_pid(pid)?, on: KillOn::Sync, count: parse_n(n)? },
        ["clear"] => Command::Clear,
        ["stats"] => Command::Stats,
        [] => return Err("empty command".into()),
        _ => {
            return Err(format!(
                "unknown command '{}': want drop | tear [SEED] | fail-fsync PATH [N] | lie-fsync PATH [N] | fail-write PATH [N] | kill-after-writes PID N | kill-at-sync PID N | clear | stats",
                line.trim()
            ))
        }
    };
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        assert_eq!(parse("drop\n"), Ok(Command::Drop));
        assert_eq!(parse("tear"), Ok(Command::Tear(None)));
        assert_eq!(parse("tear 42"), Ok(Command::Tear(Some(42))));
        assert_eq!(
            parse("fail-fsync /d/a"),
            Ok(Command::Fault { path: "d/a".into(), fault: SyncFault::Fail, count: 1 })
        );
        assert_eq!(
            parse("fail-fsync a 3"),
            Ok(Command::Fault { path: "a".into(), fault: SyncFault::Fail, count: 3 })
        );
        assert_eq!(
            parse("lie-fsync //a"),
            Ok(Command::Fault { path: "a".into(), fault: SyncFault::Lie, count: u64::MAX })
        );
        assert_eq!(parse("kill-after-writes 123 7"), Ok(Command::Kill { pid: 123, on: KillOn::Write, count: 7 }));
        assert_eq!(parse("kill-at-sync 123 2"), Ok(Command::Kill { pid: 123, on: KillOn::Sync, count: 2 }));
        assert_eq!(parse("fail-write /a 9"), Ok(Command::FailWrite { path: "a".into(), count: 9 }));
        assert_eq!(parse("clear"), Ok(Command::Clear));
        assert_eq!(parse(" stats "), Ok(Command::Stats));
    }

    #[test]
    fn rejects_bad_commands_with_a_reason() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("dorp").unwrap_err().contains("unknown command 'dorp'"));
        assert!(parse("tear x").unwrap_err().contains("bad seed"));
        assert!(parse("fail-fsync /a -1").unwrap_err().contains("bad count"));
        assert!(parse("fail-fsync /../etc/passwd").unwrap_err().contains("bad path"));
        assert!(parse("fail-fsync /").unwrap_err().contains("bad path"));
        assert!(parse("fail-fsync /a 1 2").unwrap_err().contains("unknown command"));
        assert!(parse("kill-at-sync 1 1").unwrap_err().contains("bad pid"));
        assert!(parse("kill-at-sync 100 0").unwrap_err().contains("bad count"));
    }
}
