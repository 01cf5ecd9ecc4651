//! The lazy file system through the kernel: real open(O_DIRECT)/pwrite/fdatasync/flock
//! on a mounted instance, and the control file's drop and fail-fsync.
//! Skipped (with a message) where /dev/fuse or mount permission is missing.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use zilla_lazyfs::fs::LazyFs;

fn mount(backing: &Path, mnt: &Path) -> Option<fuser::BackgroundSession> {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: no /dev/fuse");
        return None;
    }
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("zilla-lazyfs-test".into())];
    match fuser::spawn_mount(LazyFs::new(backing.to_path_buf(), 1 << 20), mnt, &config) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("SKIP: cannot mount FUSE here: {e}");
            None
        }
    }
}

fn ctl(mnt: &Path, cmd: &str) -> std::io::Result<()> {
    std::fs::write(mnt.join(".lazyfs-ctl"), format!("{cmd}\n"))
}

/// A 4 KiB-aligned buffer for O_DIRECT.
fn aligned(fill: u8) -> (Vec<u8>, usize) {
    let v = vec![fill; 3 * 4096];
    let skip = (4096 - (v.as_ptr() as usize % 4096)) % 4096;
    (v, skip)
}

#[test]
fn syscalls_see_lazy_semantics() {
    let backing = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let Some(session) = mount(backing.path(), mnt.path()) else { return };
    let disk = mnt.path().join("disk");
    std::fs::File::create(&disk).unwrap().set_len(1 << 20).unwrap();

    let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&disk).unwrap();
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "flock on a lazyfs file");
    let (buf, skip) = aligned(0xa1);
    f.write_all_at(&buf[skip..skip + 4096], 0).unwrap();
    f.sync_data().unwrap();
    let (buf, skip) = aligned(0xb2);
    f.write_all_at(&buf[skip..skip + 4096], 4096).unwrap();
    let mut back = vec![0u8; 8192];
    std::fs::File::open(&disk).unwrap().read_exact_at(&mut back, 0).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0xa1) && back[4096..].iter().all(|&b| b == 0xb2));
    assert!(std::fs::read(backing.path().join("disk")).unwrap()[4096..8192].iter().all(|&b| b == 0));

    ctl(mnt.path(), "drop").unwrap();
    std::fs::File::open(&disk).unwrap().read_exact_at(&mut back, 0).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0xa1), "synced page survives drop");
    assert!(back[4096..].iter().all(|&b| b == 0), "unsynced page is dropped");

    // synchronous writes are durable when they return: RWF_DSYNC on one write (what
    // the io_uring leaves use for log blocks) and a descriptor opened O_DSYNC
    let (buf, skip) = aligned(0xc3);
    let iov = libc::iovec { iov_base: buf[skip..].as_ptr() as *mut libc::c_void, iov_len: 4096 };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let n = unsafe { libc::pwritev2(fd, &iov, 1, 4096, libc::RWF_DSYNC) };
    assert_eq!(n, 4096, "pwritev2 RWF_DSYNC: {}", std::io::Error::last_os_error());
    let dsync = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT | libc::O_DSYNC).open(&disk).unwrap();
    let (buf, skip) = aligned(0xd4);
    dsync.write_all_at(&buf[skip..skip + 4096], 12288).unwrap();
    f.write_all_at(&buf[skip..skip + 4096], 16384).unwrap(); // plain: not durable
    ctl(mnt.path(), "drop").unwrap();
    let mut more = vec![0u8; 4 * 4096];
    std::fs::File::open(&disk).unwrap().read_exact_at(&mut more, 4096).unwrap();
    assert!(more[..4096].iter().all(|&b| b == 0xc3), "an RWF_DSYNC write survives drop");
    assert!(more[8192..12288].iter().all(|&b| b == 0xd4), "an O_DSYNC write survives drop");
    assert!(more[12288..].iter().all(|&b| b == 0), "a plain write after them is dropped");
    drop(dsync);
    let (buf, skip) = aligned(0xb2);

    ctl(mnt.path(), "fail-fsync /disk 1").unwrap();
    f.write_all_at(&buf[skip..skip + 4096], 8192).unwrap();
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "injected fdatasync failure");
    let mut page = vec![0u8; 4096];
    f.read_exact_at(&mut page, 8192).unwrap_or_else(|_| panic!("read after failed sync"));
    assert!(page.iter().all(|&b| b == 0), "a failed fdatasync dropped the dirty page");
    f.sync_data().unwrap();

    assert!(ctl(mnt.path(), "no-such-command").is_err(), "bad command fails the write");
    let stats = std::fs::read_to_string(mnt.path().join(".lazyfs-ctl")).unwrap();
    assert!(stats.contains("syncs_failed 1"), "{stats}");
    assert!(stats.contains("last error: unknown command"), "{stats}");
    drop(f);
    session.umount_and_join().unwrap();
}
