//! The FUSE side: a pass-through file system whose file data goes through the lazy
//! page cache.
//!
//! Theory of operation
//! -------------------
//! Every inode the kernel knows is a path relative to the backing directory
//! ([`InodeTable`]); inode 1 is the backing directory itself and inode 2 the control
//! file. Metadata calls (lookup, getattr, create, mkdir, unlink, rename, truncate,
//! fallocate, readdir, statfs) go straight to the backing file system. File data goes
//! through [`PageCache`]: `write` stays in memory, `read` merges memory and the backing
//! file, `fsync`/`fdatasync` (FUSE_FSYNC, whatever issued it: fsync(2), fdatasync(2),
//! an io_uring IORING_OP_FSYNC) write back and sync, and so does a synchronous write
//! (O_DSYNC / RWF_DSYNC, seen in the write's flags) before it is answered.
//!
//! Every open gets FOPEN_DIRECT_IO, so the kernel keeps no page cache of its own for
//! these files: each read and write reaches this process, O_DIRECT opens work, and
//! after a `drop` nothing stale is served from the kernel. Attributes and entries have
//! a zero TTL for the same reason (sizes change when unsynced extensions are dropped).
//! flock and POSIX locks are not forwarded (the init reply does not ask for them), so
//! the kernel applies them locally, which is exactly right for one host.
//!
//! All state sits behind one mutex; the session runs one thread. A test tool does not
//! need more, and a single order of events keeps `tear` reproducible.
//!
//! Bounds: the page cache has its byte limit; the inode table holds an entry per inode
//! the kernel has looked up and not forgotten (the kernel's own dentry cache bounds it);
//! control-file snapshots live only while the control file is open.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::cache::{PageCache, SyncFault};
use crate::ctl::{self, Command, KillOn, CTL_NAME};

const TTL: Duration = Duration::ZERO;
const ROOT_INO: u64 = 1;
const CTL_INO: u64 = 2;
const FIRST_INO: u64 = 3;

/// Inode numbers <-> mount-relative paths ("" is the root).
struct InodeTable {
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    lookups: HashMap<u64, u64>,
    next_ino: u64,
}

impl InodeTable {
    fn new() -> InodeTable {
        let mut t = InodeTable { paths: HashMap::new(), inos: HashMap::new(), lookups: HashMap::new(), next_ino: FIRST_INO };
        t.paths.insert(ROOT_INO, PathBuf::new());
        t.inos.insert(PathBuf::new(), ROOT_INO);
        t
    }

    fn path(&self, ino: u64) -> Option<&Path> {
        self.paths.get(&ino).map(|p| p.as_path())
    }

    /// The inode of `rel`, allocated if new.
    fn ino_of(&mut self, rel: &Path) -> u64 {
        if let Some(&ino) = self.inos.get(rel) {
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.paths.insert(ino, rel.to_path_buf());
        self.inos.insert(rel.to_path_buf(), ino);
        ino
    }

    fn remove_path(&mut self, rel: &Path) -> Option<u64> {
        let ino = self.inos.remove(rel)?;
        self.paths.remove(&ino);
        self.lookups.remove(&ino);
        Some(ino)
    }

    /// Move `from` (and everything under it) to `to`; returns the moved inodes.
    fn rename(&mut self, from: &Path, to: &Path) -> Vec<(u64, PathBuf)> {
        let moved: Vec<(PathBuf, u64)> =
            self.inos.iter().filter(|(p, _)| p.starts_with(from)).map(|(p, &i)| (p.clone(), i)).collect();
        let mut out = Vec::new();
        for (old, ino) in moved {
            let new = to.join(old.strip_prefix(from).expect("filtered by prefix"));
            self.inos.remove(&old);
            self.inos.insert(new.clone(), ino);
            self.paths.insert(ino, new.clone());
            out.push((ino, new));
        }
        out
    }
}

struct State {
    inodes: InodeTable,
    cache: PageCache,
    /// Open handles per inode (a clean file with none is detached from the cache).
    open_handles: HashMap<u64, u64>,
    /// Control-file snapshots by handle.
    ctl_snapshots: HashMap<u64, Vec<u8>>,
    next_fh: u64,
    last_result: String,
    /// A planned SIGKILL: (pid, what it counts, operations left).
    kill_plan: Option<(i32, KillOn, u64)>,
}

/// The lazy file system over one backing directory.
pub struct LazyFs {
    backing_root: PathBuf,
    state: Mutex<State>,
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn file_type(ft: std::fs::FileType) -> FileType {
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn system_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr_of(ino: u64, meta: &std::fs::Metadata, size: Option<u64>) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: size.unwrap_or(meta.len()),
        blocks: meta.blocks(),
        atime: system_time(meta.atime(), meta.atime_nsec()),
        mtime: system_time(meta.mtime(), meta.mtime_nsec()),
        ctime: system_time(meta.ctime(), meta.ctime_nsec()),
        crtime: system_time(meta.ctime(), meta.ctime_nsec()),
        kind: file_type(meta.file_type()),
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev() as u32,
        flags: 0,
        blksize: 4096,
    }
}

fn ctl_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(CTL_INO),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o600,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl LazyFs {
    pub fn new(backing_root: PathBuf, cache_limit_bytes: u64) -> LazyFs {
        let state = State {
            inodes: InodeTable::new(),
            cache: PageCache::new(cache_limit_bytes),
            open_handles: HashMap::new(),
            ctl_snapshots: HashMap::new(),
            next_fh: 1,
            last_result: "none".into(),
            kill_plan: None,
        };
        LazyFs { backing_root, state: Mutex::new(state) }
    }

    fn full(&self, rel: &Path) -> PathBuf {
        self.backing_root.join(rel)
    }

    /// Attributes of `ino` with the cache's logical size.
    fn attr(&self, st: &State, ino: u64) -> Result<FileAttr, Errno> {
        if ino == CTL_INO {
            return Ok(ctl_attr());
        }
        let rel = st.inodes.path(ino).ok_or(Errno::ENOENT)?;
        let meta = std::fs::symlink_metadata(self.full(rel)).map_err(errno)?;
        Ok(attr_of(ino, &meta, st.cache.size(ino)))
    }

    /// Look `name` up under `parent`, counting a kernel lookup reference.
    fn entry(&self, st: &mut State, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        if parent == ROOT_INO && name.as_bytes() == CTL_NAME.as_bytes() {
            return Ok(ctl_attr());
        }
        let rel = st.inodes.path(parent).ok_or(Errno::ENOENT)?.join(name);
        let meta = std::fs::symlink_metadata(self.full(&rel)).map_err(errno)?;
        let ino = st.inodes.ino_of(&rel);
        *st.inodes.lookups.entry(ino).or_insert(0) += 1;
        Ok(attr_of(ino, &meta, st.cache.size(ino)))
    }

    /// Open the backing file of `ino` into the cache if it is not there yet.
    fn attach(&self, st: &mut State, ino: u64) -> Result<(), Errno> {
        if st.cache.is_attached(ino) {
            return Ok(());
        }
        let rel = st.inodes.path(ino).ok_or(Errno::ENOENT)?.to_path_buf();
        let full = self.full(&rel);
        let file = match OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&full) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EROFS) => {
                File::open(&full).map_err(errno)?
            }
            Err(e) => return Err(errno(e)),
        };
        if !file.metadata().map_err(errno)?.is_file() {
            return Err(Errno::EISDIR);
        }
        st.cache.attach(ino, &rel.to_string_lossy(), file).map_err(errno)
    }

    fn new_handle(st: &mut State, ino: u64) -> u64 {
        let fh = st.next_fh;
        st.next_fh += 1;
        *st.open_handles.entry(ino).or_insert(0) += 1;
        fh
    }

    /// Run control commands (one per line); returns the text for `last`.
    fn run_ctl(&self, st: &mut State, text: &str) -> Result<String, String> {
        let mut results = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let result = match ctl::parse(line)? {
                Command::Drop => format!("drop: {}", st.cache.drop_all()),
                Command::Tear(seed) => {
                    let seed = seed.unwrap_or_else(|| {
                        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
                    });
                    let report = st.cache.tear(seed).map_err(|e| format!("tear failed: {e}"))?;
                    format!("tear {seed}: {report}")
                }
                Command::Fault { path, fault, count } => {
                    st.cache.set_fault(&path, fault, count);
                    format!("{} {path} {count}", if fault == SyncFault::Fail { "fail-fsync" } else { "lie-fsync" })
                }
                Command::FailWrite { path, count } => {
                    st.cache.set_write_fault(&path, count);
                    format!("fail-write {path} {count}")
                }
                Command::Kill { pid, on, count } => {
                    st.kill_plan = Some((pid, on, count));
                    format!("kill {pid} at {on:?} {count}")
                }
                Command::Clear => {
                    st.cache.clear_faults();
                    st.kill_plan = None;
                    "clear".into()
                }
                Command::Stats => "stats".into(),
            };
            eprintln!("zilla-lazyfs: {result}");
            results.push(result);
        }
        Ok(results.join("; "))
    }

    fn ctl_snapshot(st: &State) -> Vec<u8> {
        let c = &st.cache;
        let s = &c.stats;
        let mut out = format!(
            "dirty_pages {}\ndirty_bytes {}\ndirty_files {}\ncache_limit_bytes {}\nwrites {}\nwrites_failed {}\nreads {}\n\
             syncs {}\nsyncs_failed {}\nsyncs_lied {}\npages_synced {}\npages_evicted {}\ndrops {}\n\
             tears {}\npages_lost {}\npages_torn {}\n",
            c.dirty_pages(),
            c.dirty_pages() * crate::cache::PAGE_BYTES,
            c.dirty_files(),
            c.limit_pages() * crate::cache::PAGE_BYTES,
            s.writes,
            s.writes_failed,
            s.reads,
            s.syncs,
            s.syncs_failed,
            s.syncs_lied,
            s.pages_synced,
            s.pages_evicted,
            s.drops,
            s.tears,
            s.pages_lost,
            s.pages_torn,
        );
        for (name, fault, left) in c.faults() {
            let kind = if fault == SyncFault::Fail { "fail-fsync" } else { "lie-fsync" };
            out.push_str(&format!("fault {kind} /{name} {left}\n"));
        }
        for (name, left) in c.write_faults() {
            out.push_str(&format!("fault fail-write /{name} {left}\n"));
        }
        if let Some((pid, on, left)) = st.kill_plan {
            out.push_str(&format!("kill_plan pid {pid} {on:?} {left}\n"));
        }
        out.push_str(&format!("last {}\n", st.last_result));
        out.into_bytes()
    }

    /// Count one `op` against the planned kill; true if the process was just killed
    /// (the operation must then fail without effect, as if the power went first).
    fn kill_due(st: &mut State, op: KillOn) -> bool {
        let Some((pid, on, left)) = st.kill_plan.as_mut() else { return false };
        if *on != op {
            return false;
        }
        *left -= 1;
        if *left > 0 {
            return false;
        }
        let pid = *pid;
        st.kill_plan = None;
        let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
        let how = if rc == 0 { "killed".to_string() } else { format!("kill failed: {}", io::Error::last_os_error()) };
        eprintln!("zilla-lazyfs: planned cut at {op:?}: pid {pid} {how}");
        st.last_result = format!("cut at {op:?}: pid {pid} {how}");
        true
    }

    /// setattr's size part: through the cache if the file is cached.
    fn set_size(&self, st: &mut State, ino: u64, size: u64) -> Result<(), Errno> {
        self.attach(st, ino)?;
        st.cache.truncate(ino, size).map_err(errno)?;
        if !st.open_handles.contains_key(&ino) {
            st.cache.detach_if_clean(ino);
        }
        Ok(())
    }
}

fn set_times(path: &Path, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>) -> io::Result<()> {
    use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD};
    let ts = |t: Option<TimeOrNow>| match t {
        None => Timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT as _ },
        Some(TimeOrNow::Now) => Timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW as _ },
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            Timespec { tv_sec: d.as_secs() as _, tv_nsec: d.subsec_nanos() as _ }
        }
    };
    let times = Timestamps { last_access: ts(atime), last_modification: ts(mtime) };
    utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(io::Error::from)
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.state.lock();
        match self.entry(&mut st, parent.0, name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut st = self.state.lock();
        let left = match st.inodes.lookups.get_mut(&ino.0) {
            Some(n) => {
                *n = n.saturating_sub(nlookup);
                *n
            }
            None => return,
        };
        let busy = st.open_handles.contains_key(&ino.0) || st.cache.is_attached(ino.0);
        if left == 0 && !busy && ino.0 != ROOT_INO {
            if let Some(rel) = st.inodes.path(ino.0).map(Path::to_path_buf) {
                st.inodes.remove_path(&rel);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.state.lock();
        match self.attr(&st, ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.state.lock();
        if ino.0 == CTL_INO {
            return reply.attr(&TTL, &ctl_attr()); // `echo cmd > ctl` truncates first
        }
        let result = (|| -> Result<FileAttr, Errno> {
            let full = self.full(st.inodes.path(ino.0).ok_or(Errno::ENOENT)?);
            if let Some(mode) = mode {
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&full, uid, gid).map_err(errno)?;
            }
            if atime.is_some() || mtime.is_some() {
                set_times(&full, atime, mtime).map_err(errno)?;
            }
            if let Some(size) = size {
                self.set_size(&mut st, ino.0, size)?;
            }
            self.attr(&st, ino.0)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let st = self.state.lock();
        let Some(rel) = st.inodes.path(ino.0) else { return reply.error(Errno::ENOENT) };
        match std::fs::read_link(self.full(rel)) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut st = self.state.lock();
        let Some(rel) = st.inodes.path(parent.0).map(|p| p.join(name)) else { return reply.error(Errno::ENOENT) };
        let made = std::fs::DirBuilder::new().mode(mode & !umask & 0o7777).create(self.full(&rel));
        match made.map_err(errno).and_then(|_| self.entry(&mut st, parent.0, name)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.state.lock();
        if parent.0 == ROOT_INO && name.as_bytes() == CTL_NAME.as_bytes() {
            return reply.error(Errno::EPERM);
        }
        let Some(rel) = st.inodes.path(parent.0).map(|p| p.join(name)) else { return reply.error(Errno::ENOENT) };
        match std::fs::remove_file(self.full(&rel)) {
            Ok(()) => {
                if let Some(ino) = st.inodes.remove_path(&rel) {
                    st.cache.forget(ino);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.state.lock();
        let Some(rel) = st.inodes.path(parent.0).map(|p| p.join(name)) else { return reply.error(Errno::ENOENT) };
        match std::fs::remove_dir(self.full(&rel)) {
            Ok(()) => {
                st.inodes.remove_path(&rel);
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn symlink(&self, _req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let mut st = self.state.lock();
        let Some(rel) = st.inodes.path(parent.0).map(|p| p.join(link_name)) else {
            return reply.error(Errno::ENOENT);
        };
        let made = std::os::unix::fs::symlink(target, self.full(&rel)).map_err(errno);
        match made.and_then(|_| self.entry(&mut st, parent.0, link_name)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state.lock();
        if flags.bits() != 0 {
            return reply.error(Errno::EINVAL);
        }
        let (Some(from), Some(to)) =
            (st.inodes.path(parent.0).map(|p| p.join(name)), st.inodes.path(newparent.0).map(|p| p.join(newname)))
        else {
            return reply.error(Errno::ENOENT);
        };
        if let Err(e) = std::fs::rename(self.full(&from), self.full(&to)) {
            return reply.error(errno(e));
        }
        if let Some(replaced) = st.inodes.remove_path(&to) {
            st.cache.forget(replaced);
        }
        for (ino, path) in st.inodes.rename(&from, &to) {
            st.cache.rename(ino, &path.to_string_lossy());
        }
        reply.ok()
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.state.lock();
        if ino.0 == CTL_INO {
            let fh = st.next_fh;
            st.next_fh += 1;
            let snapshot = Self::ctl_snapshot(&st);
            st.ctl_snapshots.insert(fh, snapshot);
            return reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
        }
        match self.attach(&mut st, ino.0) {
            Ok(()) => {
                let fh = Self::new_handle(&mut st, ino.0);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.state.lock();
        let Some(rel) = st.inodes.path(parent.0).map(|p| p.join(name)) else { return reply.error(Errno::ENOENT) };
        let mut opts = OpenOptions::new();
        opts.write(true).mode(mode & !umask & 0o7777);
        if flags & libc::O_EXCL != 0 { opts.create_new(true) } else { opts.create(true) };
        let result = opts.open(self.full(&rel)).map_err(errno).and_then(|_| {
            let attr = self.entry(&mut st, parent.0, name)?;
            self.attach(&mut st, attr.ino.0)?;
            Ok(attr)
        });
        match result {
            Ok(attr) => {
                let fh = Self::new_handle(&mut st, attr.ino.0);
                reply.created(&TTL, &attr, Generation(0), FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut st = self.state.lock();
        if ino.0 == CTL_INO {
            let snap = st.ctl_snapshots.get(&fh.0).map(Vec::as_slice).unwrap_or(&[]);
            let from = (offset as usize).min(snap.len());
            let to = from.saturating_add(size as usize).min(snap.len());
            return reply.data(&snap[from..to]);
        }
        match st.cache.read(ino.0, offset, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.state.lock();
        if ino.0 == CTL_INO {
            let text = String::from_utf8_lossy(data).into_owned();
            return match self.run_ctl(&mut st, &text) {
                Ok(result) => {
                    st.last_result = result;
                    reply.written(data.len() as u32)
                }
                Err(reason) => {
                    eprintln!("zilla-lazyfs: {reason}");
                    st.last_result = format!("error: {reason}");
                    reply.error(Errno::EINVAL)
                }
            };
        }
        if Self::kill_due(&mut st, KillOn::Write) {
            return reply.error(Errno::EIO);
        }
        if let Err(e) = st.cache.write(ino.0, offset, data) {
            return reply.error(errno(e));
        }
        // A synchronous write (O_DSYNC/O_SYNC on the open, or RWF_DSYNC/RWF_SYNC on this
        // write: the kernel passes either in the write's flags) is durable when it
        // returns, as on any file system: with FOPEN_DIRECT_IO the kernel sends no
        // FUSE_FSYNC after it, so the sync is this file system's to do.
        if flags.0 & (libc::O_DSYNC | libc::O_SYNC) != 0 {
            if Self::kill_due(&mut st, KillOn::Sync) {
                return reply.error(Errno::EIO);
            }
            if let Err(e) = st.cache.sync(ino.0, flags.0 & libc::O_SYNC != libc::O_SYNC) {
                return reply.error(errno(e));
            }
        }
        reply.written(data.len() as u32)
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok() // close(2) is not a sync
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state.lock();
        if ino.0 == CTL_INO {
            st.ctl_snapshots.remove(&fh.0);
            return reply.ok();
        }
        let left = st.open_handles.get_mut(&ino.0).map(|n| {
            *n -= 1;
            *n
        });
        if left == Some(0) {
            st.open_handles.remove(&ino.0);
            st.cache.detach_if_clean(ino.0); // dirty pages outlive the descriptor
        }
        reply.ok()
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let mut st = self.state.lock();
        if ino.0 == CTL_INO {
            return reply.ok();
        }
        if Self::kill_due(&mut st, KillOn::Sync) {
            return reply.error(Errno::EIO);
        }
        match st.cache.sync(ino.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok() // directory entries are written through
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let mut st = self.state.lock();
        let Some(rel) = st.inodes.path(ino.0).map(Path::to_path_buf) else { return reply.error(Errno::ENOENT) };
        let dir = match std::fs::read_dir(self.full(&rel)) {
            Ok(d) => d,
            Err(e) => return reply.error(errno(e)),
        };
        let mut entries: Vec<(u64, FileType, std::ffi::OsString)> =
            vec![(ino.0, FileType::Directory, ".".into()), (ROOT_INO, FileType::Directory, "..".into())];
        if ino.0 == ROOT_INO {
            entries.push((CTL_INO, FileType::RegularFile, CTL_NAME.into()));
        }
        let mut names: Vec<(std::ffi::OsString, FileType)> = dir
            .filter_map(Result::ok)
            .map(|e| (e.file_name(), e.file_type().map(file_type).unwrap_or(FileType::RegularFile)))
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, kind) in names {
            let child = st.inodes.ino_of(&rel.join(&name));
            entries.push((child, kind, name));
        }
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match rustix::fs::statvfs(&self.backing_root) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e.into())),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok() // mounted with default_permissions: the kernel checks modes
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state.lock();
        let result = (|| -> Result<(), Errno> {
            self.attach(&mut st, ino.0)?;
            let rel = st.inodes.path(ino.0).ok_or(Errno::ENOENT)?;
            let file = OpenOptions::new().write(true).open(self.full(rel)).map_err(errno)?;
            let flags = rustix::fs::FallocateFlags::from_bits(mode as u32).ok_or(Errno::EOPNOTSUPP)?;
            rustix::fs::fallocate(&file, flags, offset, length).map_err(|e| errno(e.into()))?;
            let zeroes = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::ZERO_RANGE;
            if flags.intersects(zeroes) {
                st.cache.punch_hole(ino.0, offset, length);
            }
            st.cache.refresh_size(ino.0).map_err(errno)
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
