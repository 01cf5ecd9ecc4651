//! The state directory: who may touch it, its lock, and the cache file.
//!
//! Theory of operation
//! -------------------
//! The admin socket in the state directory is root-equivalent (it creates pools on
//! any file the daemon can open), so the directory is the security boundary:
//!
//! ```text
//!   DIR               0700 (0710 with admin_group), owned by the daemon's user;
//!                     refused at start if another user owns it or can write it
//!   DIR/zilla.lock    0600, opened O_NOFOLLOW, flock'd for the daemon's lifetime
//!   DIR/zilla.cache   0600, replaced atomically: zilla.cache.tmp is created with
//!                     O_CREAT|O_EXCL|O_NOFOLLOW (a file or symlink planted at that
//!                     name is removed, never followed), fsync, rename, fsync DIR
//!   DIR/zilla.cache.bad  a cache file that could not be read, moved aside at start
//!                     (.bad.1 ... .bad.9 when taken); the start goes on without it
//!   DIR/zilla.sock    admin API, chmod 0600 right after bind (0660 + chgrp with
//!                     admin_group)
//!   DIR/nbd.sock      NBD, the same mode as the admin socket: volume data is no
//!                     less private than the admin API
//!   DIR/iscsi-auth.json 0600, the iSCSI CHAP users, secrets and initiator lists
//!                     (iscsi_admin.rs); replaced atomically as the cache file is
//!   DIR/events.jsonl  0600, the pool events (events.rs), appended; rewritten
//!                     atomically as the cache file is once it passes its bound
//!   DIR/zilla.stopped 0600, written by the panic hook when the daemon stops on a
//!                     broken invariant: the pool it was working for, when, why. The
//!                     next start marks that pool held in the cache file (not imported
//!                     until the admin imports it by hand), then removes the record
//! ```
//!
//! Modes are set explicitly (mkdir mode, open mode, chmod after bind), so the umask the
//! daemon was started under does not matter. A socket's mode is fixed before any
//! client could reach it, because only the owner (and admin_group) can traverse DIR.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};
use zilla_core::vdev::LeafSpec;

/// Mode of the state directory without and with an admin group.
const DIR_MODE: u32 = 0o700;
const DIR_MODE_GROUP: u32 = 0o710;
/// Mode of the sockets without and with an admin group.
const SOCKET_MODE: u32 = 0o600;
const SOCKET_MODE_GROUP: u32 = 0o660;
/// Mode of the lock and cache files.
const FILE_MODE: u32 = 0o600;

/// Create DIR (0700, or 0710 + group `admin_gid`) if missing, then check that it is
/// ours and that nobody else can write it. Returns the canonical path.
pub fn prepare(dir: &Path, admin_gid: Option<u32>) -> anyhow::Result<PathBuf> {
    let want_mode = if admin_gid.is_some() { DIR_MODE_GROUP } else { DIR_MODE };
    let created = !dir.exists();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(want_mode)
        .create(dir)
        .with_context(|| format!("cannot create state directory {}", dir.display()))?;
    let dir = dir.canonicalize().with_context(|| format!("state directory {}", dir.display()))?;
    if created {
        // mkdir's mode went through the umask; set it exactly.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(want_mode))
            .with_context(|| format!("cannot chmod state directory {}", dir.display()))?;
    }
    if let Some(gid) = admin_gid {
        rustix::fs::chown(&dir, None, Some(rustix::fs::Gid::from_raw(gid)))
            .with_context(|| format!("cannot give state directory {} to group {gid}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(want_mode))
            .with_context(|| format!("cannot chmod state directory {}", dir.display()))?;
    }
    check_private(&dir)?;
    Ok(dir)
}

/// Refuse a directory another user owns or can write.
fn check_private(dir: &Path) -> anyhow::Result<()> {
    let md = std::fs::metadata(dir).with_context(|| format!("state directory {}", dir.display()))?;
    if !md.is_dir() {
        bail!("state directory {} is not a directory", dir.display());
    }
    let me = rustix::process::geteuid().as_raw();
    if md.uid() != me {
        bail!(
            "state directory {} is owned by uid {}, not by this user (uid {me}); refusing to use it",
            dir.display(),
            md.uid()
        );
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        bail!(
            "state directory {} is writable by other users (mode {mode:04o}); refusing to use it (chmod 700 {})",
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

/// Set a freshly bound socket's mode (and group).
pub fn secure_socket(path: &Path, admin_gid: Option<u32>) -> anyhow::Result<()> {
    if let Some(gid) = admin_gid {
        rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(gid)))
            .with_context(|| format!("cannot give {} to group {gid}", path.display()))?;
    }
    let mode = if admin_gid.is_some() { SOCKET_MODE_GROUP } else { SOCKET_MODE };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

/// The gid of a group name (or a numeric gid), for `admin_group`.
pub fn group_id(name: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let cname = std::ffi::CString::new(name).map_err(|_| anyhow!("bad group name"))?;
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getgrnam_r writes only into grp/buf.
    let rc = unsafe { libc::getgrnam_r(cname.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        bail!("admin_group: no group named '{}'", crate::clip::clip(name));
    }
    Ok(grp.gr_gid)
}

/// The exclusive lock on DIR/zilla.lock; released when dropped (the fd closes).
pub struct StateLock {
    _file: File,
    pub dir: PathBuf,
}

/// Take the state directory's lock (DIR must have passed [`prepare`]), or say who
/// holds it.
pub fn lock(dir: &Path) -> anyhow::Result<StateLock> {
    let path = dir.join("zilla.lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if let Err(e) = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        if e == rustix::io::Errno::WOULDBLOCK {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            let who = if pid.is_empty() { String::new() } else { format!(" (pid {pid})") };
            bail!("another zilla daemon{who} is already serving {}", dir.display());
        }
        return Err(anyhow!("cannot lock {}: {e}", path.display()));
    }
    // The pid is for the "already serving" message only: a full file system must not
    // keep the daemon from starting.
    let pid = (|| {
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())
    })();
    if let Err(e) = pid {
        tracing::warn!("cannot write the pid to {}: {e}", path.display());
    }
    Ok(StateLock { _file: file, dir: dir.to_path_buf() })
}

/// DIR/zilla.cache: the pools to import at start.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CacheFile {
    pub version: u32,
    pub pools: Vec<CacheEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheEntry {
    pub name: String,
    pub guid: zilla_core::Guid,
    pub leaves: Vec<LeafSpec>,
    /// Set while `pool export` runs: a pool whose export did not finish (the daemon
    /// was killed meanwhile) is imported again at the next start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exporting: bool,
    /// Why the daemon does not import this pool at start: it stopped on a broken
    /// invariant while working for it. Cleared when the admin imports it by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

impl CacheEntry {
    pub fn new(name: String, guid: zilla_core::Guid, leaves: Vec<LeafSpec>) -> CacheEntry {
        CacheEntry { name, guid, leaves, exporting: false, held: None }
    }
}

pub const CACHE_VERSION: u32 = 1;
const CACHE_NAME: &str = "zilla.cache";
const CACHE_TMP_NAME: &str = "zilla.cache.tmp";

/// Largest cache file read: far beyond any real one (a pool's entry is its leaf list).
const CACHE_MAX_BYTES: u64 = 64 << 20;

/// The bytes of a regular file of at most `max_bytes`, opened so that a FIFO or a
/// device put in its place cannot block or flood the reader.
pub(crate) fn read_regular_file(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.len() > max_bytes {
        return Err(std::io::Error::other(format!("{} bytes, more than the {max_bytes} a cache file may hold", meta.len())));
    }
    let mut bytes = vec![];
    file.take(max_bytes).read_to_end(&mut bytes)?;
    Ok(bytes)
}

pub fn read_cache(dir: &Path) -> anyhow::Result<CacheFile> {
    let path = dir.join(CACHE_NAME);
    match read_regular_file(&path, CACHE_MAX_BYTES) {
        Ok(bytes) => {
            let c: CacheFile =
                serde_json::from_slice(&bytes).with_context(|| format!("{} is not a valid cache file", path.display()))?;
            if c.version != CACHE_VERSION {
                bail!("{}: unsupported cache file version {}", path.display(), c.version);
            }
            Ok(c)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CacheFile { version: CACHE_VERSION, pools: vec![] }),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Most unreadable cache files kept aside (zilla.cache.bad, .bad.1, ...): the last
/// name is reused once every one is taken.
const CACHE_BAD_KEPT_MAX: usize = 10;

/// The cache file to start from. One that cannot be read (empty, cut short, not JSON,
/// another version, not a regular file) never keeps the daemon from starting: it is
/// moved aside to DIR/zilla.cache.bad (kept for the admin to look at) and the start
/// goes on with no pool from it; the second value says what happened, for the log and
/// for `pool status`. A new cache file is written as pools are created and imported.
pub fn load_cache(dir: &Path) -> (CacheFile, Option<String>) {
    let err = match read_cache(dir) {
        Ok(c) => return (c, None),
        Err(e) => crate::clip::clip_message(&format!("{e:#}")),
    };
    let kept = match set_aside(dir) {
        Ok(bad) => format!("the file was kept as {}", bad.display()),
        Err(e) => format!("moving the file aside failed as well ({e})"),
    };
    let problem = format!(
        "{err}; {kept} and no pool was imported from it: find its pools with \
         `zilla pool import -d DIR` and import them by hand (a new cache file is written as \
         pools are created and imported)"
    );
    (CacheFile { version: CACHE_VERSION, pools: vec![] }, Some(problem))
}

/// Rename DIR/zilla.cache to the first free name of zilla.cache.bad, .bad.1, ...
fn set_aside(dir: &Path) -> std::io::Result<PathBuf> {
    let names = (0..CACHE_BAD_KEPT_MAX).map(|i| if i == 0 { format!("{CACHE_NAME}.bad") } else { format!("{CACHE_NAME}.bad.{i}") });
    let names: Vec<PathBuf> = names.map(|n| dir.join(n)).collect();
    let bad = names.iter().find(|p| std::fs::symlink_metadata(p).is_err()).unwrap_or(&names[CACHE_BAD_KEPT_MAX - 1]);
    std::fs::rename(dir.join(CACHE_NAME), bad)?;
    File::open(dir)?.sync_all()?;
    Ok(bad.clone())
}

/// What the daemon was doing when it stopped on a broken invariant (DIR/zilla.stopped).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopRecord {
    /// The pool the failing thread worked for; None when it worked for no one pool.
    pub pool: Option<String>,
    pub time_unix_s: u64,
    pub thread: String,
    pub message: String,
}

const STOP_NAME: &str = "zilla.stopped";
/// Longest stop record read back (a larger file is not one this daemon wrote).
const STOP_RECORD_MAX_BYTES: u64 = 64 * 1024;

/// Write the stop record and make it durable (called from the panic hook, just before
/// the process aborts).
pub fn write_stop_record(dir: &Path, rec: &StopRecord) -> std::io::Result<()> {
    let path = dir.join(STOP_NAME);
    let mut f = create_private(&path)?;
    f.write_all(&serde_json::to_vec(rec).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    File::open(dir)?.sync_all()
}

/// The stop record a previous daemon left, if any. An unreadable one is reported as a
/// stop for no known pool, so the start goes on.
pub fn read_stop_record(dir: &Path) -> Option<StopRecord> {
    let path = dir.join(STOP_NAME);
    // O_NONBLOCK: a FIFO put there must not hold the start (a regular file ignores it)
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK).open(&path).ok()?;
    if !file.metadata().map(|m| m.is_file()).unwrap_or(false) {
        tracing::warn!("{} is not a regular file; ignoring it", path.display());
        return Some(StopRecord { pool: None, time_unix_s: 0, thread: String::new(), message: String::new() });
    }
    let mut bytes = vec![];
    let read = file.take(STOP_RECORD_MAX_BYTES).read_to_end(&mut bytes);
    match read.ok().and_then(|_| serde_json::from_slice::<StopRecord>(&bytes).ok()) {
        Some(r) => Some(r),
        None => {
            tracing::warn!("{} is not a stop record this daemon wrote; ignoring it", path.display());
            Some(StopRecord { pool: None, time_unix_s: 0, thread: String::new(), message: String::new() })
        }
    }
}

/// The state directory the panic hook records a stop in (set once the daemon holds
/// its lock).
static STOP_RECORD_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

pub fn record_stops_in(dir: &Path) {
    let _ = STOP_RECORD_DIR.set(dir.to_path_buf());
}

/// Record a stop on a broken invariant for the next start (see [`StopRecord`]); None
/// when no daemon state directory is set (an embedder, a test).
pub fn record_stop(pool: Option<String>, thread: &str, message: &str) -> Option<std::io::Result<()>> {
    let dir = STOP_RECORD_DIR.get()?;
    let time_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let message: String = message.chars().take(1000).collect();
    Some(write_stop_record(dir, &StopRecord { pool, time_unix_s, thread: thread.to_string(), message }))
}

pub fn remove_stop_record(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(STOP_NAME)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => File::open(dir)?.sync_all(),
    }
}

/// Create `path` new, never following a symlink there. Something already at the
/// name (a temp file left by a crash, or a planted symlink) is unlinked (unlink does
/// not follow links) and the create retried once.
fn create_private(path: &Path) -> std::io::Result<File> {
    let open = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let what = match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_symlink() => "a symlink",
                _ => "a stale file",
            };
            tracing::warn!("removing {what} at {} (not following it)", path.display());
            std::fs::remove_file(path)?;
            open()
        }
        r => r,
    }
}

/// Replace DIR/zilla.cache atomically (temp file, fsync, rename, fsync DIR). On
/// failure the old cache file is untouched and the temp file removed.
pub fn write_cache(dir: &Path, cache: &CacheFile) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(cache).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    replace_private(dir, CACHE_NAME, CACHE_TMP_NAME, &bytes)
}

/// Replace DIR/`name` with `bytes` atomically, mode 0600: `tmp_name` is created new
/// (never following a link), written, fsync'd, renamed over `name`, then DIR is
/// fsync'd. On failure the old file is untouched and the temp file removed.
pub(crate) fn replace_private(dir: &Path, name: &str, tmp_name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(tmp_name);
    let r = (|| {
        let mut f = create_private(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_private_whatever_the_umask() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/state");
        let old = rustix::process::umask(rustix::fs::Mode::empty());
        let r = prepare(&d, None);
        rustix::process::umask(old);
        let d = r.unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o700);
    }

    #[test]
    fn refuses_a_world_writable_directory() {
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(t.path(), None).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(prepare(t.path(), None).is_err());
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(prepare(t.path(), None).is_ok());
    }

    #[test]
    fn an_unreadable_cache_file_is_kept_aside_not_fatal() {
        let t = tempfile::tempdir().unwrap();
        let dir = prepare(&t.path().join("state"), None).unwrap();
        for (i, bytes) in [&b""[..], b"{\"version\":1,\"pools\":[{", b"{\"version\":7,\"pools\":[]}"].iter().enumerate() {
            std::fs::write(dir.join(CACHE_NAME), bytes).unwrap();
            let (cache, problem) = load_cache(&dir);
            assert!(cache.pools.is_empty());
            let problem = problem.expect("a problem is reported");
            let bad = if i == 0 { dir.join("zilla.cache.bad") } else { dir.join(format!("zilla.cache.bad.{i}")) };
            assert!(problem.contains(&format!("kept as {}", bad.display())), "{problem}");
            assert_eq!(std::fs::read(&bad).unwrap(), *bytes);
            assert!(!dir.join(CACHE_NAME).exists());
        }
        assert!(load_cache(&dir).1.is_none(), "no cache file is no problem");
    }

    #[test]
    fn cache_write_does_not_follow_a_planted_symlink() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let dir = t.path().join("state");
        let dir = prepare(&dir, None).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(CACHE_TMP_NAME)).unwrap();
        write_cache(&dir, &CacheFile { version: CACHE_VERSION, pools: vec![] }).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(read_cache(&dir).unwrap().pools.len(), 0);
        let md = std::fs::symlink_metadata(dir.join(CACHE_NAME)).unwrap();
        assert!(md.file_type().is_file());
        assert_eq!(md.mode() & 0o777, 0o600);
        assert!(!dir.join(CACHE_TMP_NAME).exists());
    }
}
