//! Device ownership (issue 15 rows 7-10): leaves are locked while a pool uses them, an
//! active pool of another host is not imported without force, the heartbeat of a live
//! multihost pool refuses even a forced import, devices with a file system or in another
//! pool are refused at create/add, leaves are compared by device and inode, and ashift
//! sets the allocation unit and the uberblock slot size.
//!
//! All on real files (the default opener: flock, stat identity), in a temp dir.
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zilla_core::env::{Env, ThreadBody};
use zilla_core::spa::{default_opener, CreateOptions, ImportOptions, Opener, Pool, TopSpec, ZFS_MULTIHOST_INTERVAL_MS};
use zilla_core::vdev::file::FileDevice;
use zilla_core::vdev::{LeafSpec, Role};
use zilla_core::Error;

const SIZE: u64 = 64 << 20;

fn files(dir: &Path, names: &[&str]) -> Vec<LeafSpec> {
    names
        .iter()
        .map(|n| {
            let p = dir.join(n);
            std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
            LeafSpec { path: p, model: None }
        })
        .collect()
}

fn mirror(leaves: Vec<LeafSpec>) -> Vec<TopSpec> {
    vec![TopSpec { role: Role::Normal, mirror: leaves.len() > 1, leaves }]
}

fn spec(p: PathBuf) -> LeafSpec {
    LeafSpec { path: p, model: None }
}

fn write_and_sync(pool: &Pool, seed: u64) -> Vec<u8> {
    pool.volume_create("v", 8 << 20, 8192, &[]).ok();
    let vol = pool.open_volume("v").unwrap();
    let data = common::pattern(seed, 64 << 10);
    vol.write(0, &data, false).unwrap();
    vol.flush().unwrap();
    data
}

// ---- row 9: leaves compared by identity, in the engine ----------------------------------

#[test]
fn one_file_twice_is_refused_by_path_symlink_and_on_add_attach() {
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["a", "b", "c"]);
    let link = dir.path().join("a-link");
    std::os::unix::fs::symlink(&l[0].path, &link).unwrap();
    // the same path twice, through the API
    let e = Pool::create("tank", mirror(vec![l[0].clone(), l[0].clone()]), CreateOptions::default()).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("same device"), "{e:?}");
    // once through a symlink
    let e = Pool::create("tank", mirror(vec![l[0].clone(), spec(link.clone())]), CreateOptions::default()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("same device"), "{e}");
    // a hard link, across top-level vdevs
    let hard = dir.path().join("a-hard");
    std::fs::hard_link(&l[0].path, &hard).unwrap();
    let tops = vec![
        TopSpec { role: Role::Normal, mirror: false, leaves: vec![l[0].clone()] },
        TopSpec { role: Role::Normal, mirror: false, leaves: vec![spec(hard.clone())] },
    ];
    let e = Pool::create("tank", tops, CreateOptions::default()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("same device"), "{e}");
    // a leaf already in the pool, named through another path, on add and attach
    let pool = Pool::create("tank", mirror(vec![l[0].clone(), l[1].clone()]), CreateOptions::default()).unwrap();
    let e = pool.add(mirror(vec![spec(link.clone())]), true).unwrap_err();
    assert!(e.to_string().contains("already in pool"), "{e}");
    let e = pool.attach(&l[0].display(), &spec(hard.clone()), true).unwrap_err();
    assert!(e.to_string().contains("already in pool"), "{e}");
    assert_eq!(pool.leaf_specs().len(), 2);
    pool.attach(&l[0].display(), &l[2], false).unwrap();
    pool.scrub_wait().unwrap();
    pool.export().unwrap();
}

// ---- row 7: a leaf in use by a live pool is locked ---------------------------------------

#[test]
fn second_import_of_a_live_pool_fails_naming_the_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["a", "b"]);
    let pool = Pool::create("tank", mirror(l.clone()), CreateOptions::default()).unwrap();
    let data = write_and_sync(&pool, 1);
    // a second importer (another daemon: the same open as a second process does)
    let e = Pool::import_leaves(&l).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");
    assert!(e.to_string().contains(&*l[0].path.to_string_lossy()), "the error names the leaf: {e}");
    // a create -f over it is refused the same way
    let e = Pool::create("other", mirror(vec![l[1].clone()]), CreateOptions { force: true, ..Default::default() }).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");
    // listing importable pools still reads the labels of a held leaf
    assert!(Pool::find_importable(&[dir.path().to_path_buf()]).unwrap().iter().any(|p| p.name == "tank"));
    let vol = pool.open_volume("v").unwrap();
    let mut back = vec![0u8; data.len()];
    vol.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    drop(vol);
    pool.export().unwrap();
    drop(pool);
    let pool = Pool::import_leaves(&l).expect("after export the leaves are free");
    pool.export().unwrap();
}

// ---- row 7: hostid, state and the multihost heartbeat -----------------------------------

/// The real world, except for the host id: plays another system in one process.
struct HostEnv {
    real: Arc<dyn Env>,
    hostid: u32,
}

fn host(hostid: u32) -> Arc<dyn Env> {
    Arc::new(HostEnv { real: zilla_core::env::real(), hostid })
}

impl Env for HostEnv {
    fn now_ns(&self) -> u64 {
        self.real.now_ns()
    }
    fn unix_time_ns(&self) -> u64 {
        self.real.unix_time_ns()
    }
    fn sleep_until_ns(&self, deadline_ns: u64) {
        self.real.sleep_until_ns(deadline_ns)
    }
    fn spawn(&self, name: String, body: ThreadBody) -> std::io::Result<std::thread::JoinHandle<()>> {
        self.real.spawn(name, body)
    }
    fn random_u64(&self) -> u64 {
        self.real.random_u64()
    }
    fn is_simulated(&self) -> bool {
        false
    }
    fn threads_spawned(&self) -> u64 {
        self.real.threads_spawned()
    }
    fn hostid(&self) -> u32 {
        self.hostid
    }
}

fn import_as(l: &[LeafSpec], hostid: u32, force: bool) -> zilla_core::Result<Arc<Pool>> {
    Pool::import_with_options(l, default_opener(), host(hostid), &ImportOptions { force, ..Default::default() })
}

fn read_back(pool: &Pool, data: &[u8]) {
    let vol = pool.open_volume("v").unwrap();
    let mut back = vec![0u8; data.len()];
    vol.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn active_pool_of_another_host_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["a", "b"]);
    let opts = CreateOptions { env: Some(host(0x1111)), ..Default::default() };
    let pool = Pool::create("tank", mirror(l.clone()), opts).unwrap();
    let data = write_and_sync(&pool, 2);
    // the host dies (no export): its labels say ACTIVE, hostid 1111
    pool.abandon();
    drop(pool);
    let e = import_as(&l, 0x2222, false).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("another system") && msg.contains("00001111") && msg.contains("-f"), "{msg}");
    // the same host after its crash imports without -f
    let pool = import_as(&l, 0x1111, false).expect("same host");
    read_back(&pool, &data);
    pool.abandon();
    drop(pool);
    // the other host with -f takes it over; its hostid is now in the labels
    let pool = import_as(&l, 0x2222, true).expect("forced import");
    read_back(&pool, &data);
    pool.abandon();
    drop(pool);
    let e = import_as(&l, 0x1111, false).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("00002222"), "{e}");
    // an exported pool imports anywhere without -f
    let pool = import_as(&l, 0x2222, false).unwrap();
    pool.export().unwrap();
    drop(pool);
    let pool = import_as(&l, 0x3333, false).expect("exported pool, another host");
    read_back(&pool, &data);
    pool.export().unwrap();
}

#[test]
fn multihost_heartbeat_refuses_a_live_pool_even_forced() {
    ZFS_MULTIHOST_INTERVAL_MS.set(100).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["a", "b"]);
    let props = vec![("multihost".to_string(), "on".to_string())];
    let pool = Pool::create("tank", mirror(l.clone()), CreateOptions { env: Some(host(0x1111)), props, ..Default::default() }).unwrap();
    let data = write_and_sync(&pool, 3);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // another host reaching the same storage (no lock shared with us: the devices are
    // opened without one), forcing: the heartbeat moves while it watches
    let unlocked: Opener = Arc::new(|spec: &LeafSpec, _| {
        Ok(Arc::new(FileDevice::open_shared(&spec.path).map_err(Error::Io)?) as Arc<dyn zilla_core::vdev::Device>)
    });
    let started = std::time::Instant::now();
    let e = Pool::import_with_options(&l, unlocked.clone(), host(0x2222), &ImportOptions { force: true, ..Default::default() })
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, Error::Busy(_)) && e.to_string().contains("heartbeat moved"), "{e:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(200), "it waited two intervals");
    // same host id, a process that bypassed the lock: refused as well
    let e = Pool::import_with_options(&l, unlocked, host(0x1111), &ImportOptions::default()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("heartbeat moved"), "{e}");
    read_back(&pool, &data);
    // the first host dies: the heartbeat stops, a forced import by the other succeeds
    pool.abandon();
    drop(pool);
    let pool = import_as(&l, 0x2222, true).expect("heartbeat stopped");
    read_back(&pool, &data);
    pool.export().unwrap();
}

// ---- row 8: devices in use or with a signature are refused without -f -------------------

fn single(l: &LeafSpec) -> Vec<TopSpec> {
    mirror(vec![l.clone()])
}

#[test]
fn create_and_add_refuse_signatures_without_force() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["ext4", "gpt", "swap", "plain", "xfs"]);
    let put = |s: &LeafSpec, off: u64, b: &[u8]| std::fs::OpenOptions::new().write(true).open(&s.path).unwrap().write_all_at(b, off).unwrap();
    put(&l[0], 1080, &[0x53, 0xEF]);
    put(&l[1], 512, b"EFI PART");
    put(&l[2], 4086, b"SWAPSPACE2");
    put(&l[4], 0, b"XFSB");
    for (s, what) in [(&l[0], "ext2/ext3/ext4"), (&l[1], "GPT"), (&l[2], "swap"), (&l[4], "xfs")] {
        let e = Pool::create("tank", single(s), CreateOptions::default()).map(|_| ()).unwrap_err();
        assert!(matches!(e, Error::Busy(_)), "{e:?}");
        assert!(e.to_string().contains(what) && e.to_string().contains("-f"), "{what}: {e}");
    }
    let pool = Pool::create("tank", single(&l[3]), CreateOptions::default()).unwrap();
    let e = pool.add(single(&l[0]), false).unwrap_err();
    assert!(e.to_string().contains("ext2/ext3/ext4"), "add: {e}");
    let e = pool.attach(&l[3].display(), &l[1], false).unwrap_err();
    assert!(e.to_string().contains("GPT"), "attach: {e}");
    pool.add(single(&l[0]), true).expect("add -f overwrites the signature");
    pool.export().unwrap();
    drop(pool);
    // and the pool's own devices now carry a Zilla label, refused by name
    let e = Pool::create("other", single(&l[3]), CreateOptions::default()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("exported pool 'tank'"), "{e}");
    Pool::create("other", single(&l[2]), CreateOptions { force: true, ..Default::default() }).unwrap().export().unwrap();
}

fn sh(cmd: &str) -> Option<String> {
    let out = std::process::Command::new("sh").arg("-c").arg(cmd).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn mounted_devices_and_their_backing_files_are_refused() {
    // Needs root, losetup and mkfs.ext4 (tests/run installs them); skipped otherwise.
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["fs"]);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let Some(loopdev) = sh(&format!("losetup -f --show {}", l[0].path.display())) else {
        eprintln!("skipped: no loop devices");
        return;
    };
    let cleanup = |m: bool| {
        if m {
            sh(&format!("umount {}", mnt.display()));
        }
        sh(&format!("losetup -d {loopdev}"));
    };
    if sh(&format!("mkfs.ext4 -q -F {loopdev} && mount {loopdev} {}", mnt.display())).is_none() {
        cleanup(false);
        eprintln!("skipped: cannot mkfs.ext4/mount");
        return;
    }
    let blk = spec(PathBuf::from(&loopdev));
    let r1 = Pool::create("tank", single(&blk), CreateOptions::default()).map(|_| ());
    let r2 = Pool::create("tank", single(&blk), CreateOptions { force: true, ..Default::default() }).map(|_| ());
    let r3 = Pool::create("tank", single(&l[0]), CreateOptions::default()).map(|_| ());
    cleanup(true);
    let e1 = r1.unwrap_err().to_string();
    assert!(e1.contains("mounted at") && e1.contains(&*mnt.to_string_lossy()), "{e1}");
    assert!(r2.is_err(), "a mounted block device is refused even with -f");
    let e3 = r3.unwrap_err().to_string();
    assert!(e3.contains("backs") && e3.contains("mounted at"), "{e3}");
    // unmounted and detached: only the ext4 signature is left, and -f takes it
    let e = Pool::create("tank", single(&l[0]), CreateOptions::default()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("ext2/ext3/ext4"), "{e}");
    Pool::create("tank", single(&l[0]), CreateOptions { force: true, ..Default::default() }).unwrap().export().unwrap();
}

// ---- row 10: ashift honoured --------------------------------------------------------------

/// A device with 8 KiB physical sectors that counts writes not covering whole sectors
/// (each would be a read-modify-write that a torn write turns into lost neighbours).
struct Sector8k {
    mem: zilla_core::vdev::fault::MemDevice,
    partial_writes: std::sync::atomic::AtomicU64,
}

impl zilla_core::vdev::Device for Sector8k {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if offset % 8192 != 0 || buf.len() % 8192 != 0 {
            eprintln!("partial-sector write at {offset:#x}+{}", buf.len());
            self.partial_writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.mem.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.mem.flush()
    }
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn rotational(&self) -> bool {
        false
    }
    fn logical_sector_size(&self) -> u32 {
        512
    }
    fn physical_sector_size(&self) -> u32 {
        8192
    }
    fn kind(&self) -> zilla_core::vdev::DeviceKind {
        zilla_core::vdev::DeviceKind::Test("sector8k")
    }
}

#[test]
fn ashift_13_no_write_shares_a_physical_sector() {

    let devs = common::DevSet::default();
    let big: Vec<Arc<Sector8k>> = (0..2)
        .map(|_| Arc::new(Sector8k { mem: zilla_core::vdev::fault::MemDevice::new(SIZE), partial_writes: 0.into() }))
        .collect();
    devs.insert("s0", big[0].clone());
    devs.insert("s1", big[1].clone());
    devs.insert("m4k", Arc::new(zilla_core::vdev::fault::MemDevice::new(SIZE)));
    let tops = vec![TopSpec { role: Role::Normal, mirror: true, leaves: vec![common::leaf("s0"), common::leaf("s1")] }];
    // ashift=12 on 8K sectors is refused
    let opts12 = CreateOptions { ashift: Some(12), ..Default::default() };
    let e = Pool::create_with("tank", tops.clone(), opts12, devs.opener()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("8192-byte sectors"), "{e}");
    let pool = Pool::create_with("tank", tops, CreateOptions::default(), devs.opener()).unwrap();
    assert_eq!(pool.list_row().ashift, 13, "detected from the physical sector size");
    // 4 KiB blocks, compressible and not: every one is padded to 8 KiB
    pool.volume_create("v", 4 << 20, 4096, &[("compression".into(), "lz4".into())]).unwrap();
    let vol = pool.open_volume("v").unwrap();
    let mut expect = vec![0u8; 1 << 20];
    for i in 0..256u64 {
        let b = if i % 2 == 0 { vec![i as u8; 4096] } else { common::pattern(i, 4096) };
        vol.write(i * 4096 * 3 % (1 << 20), &b, false).unwrap();
        expect[(i * 4096 * 3 % (1 << 20)) as usize..][..4096].copy_from_slice(&b);
    }
    vol.flush().unwrap();
    drop(vol);
    pool.export().unwrap();
    drop(pool);
    let pool = Pool::import_with(&[common::leaf("s0"), common::leaf("s1")], devs.opener()).unwrap();
    assert_eq!(pool.list_row().ashift, 13);
    let vol = pool.open_volume("v").unwrap();
    let mut back = vec![0u8; 1 << 20];
    vol.read(0, &mut back).unwrap();
    assert!(back == expect, "data after import");
    vol.write(8192, &common::pattern(99, 4096), true).unwrap();
    // a 4K-sector device fits an 8K vdev; the other way round is refused below
    pool.attach("s0", &common::leaf("m4k"), false).unwrap();
    pool.scrub_wait().unwrap();
    pool.export().unwrap();
    for (i, d) in big.iter().enumerate() {
        assert_eq!(d.partial_writes.load(std::sync::atomic::Ordering::Relaxed), 0, "s{i}: a write shared an 8K sector");
    }
    let devs4 = common::mem_devs(&["a"], SIZE);
    devs4.insert("b8", Arc::new(Sector8k { mem: zilla_core::vdev::fault::MemDevice::new(SIZE), partial_writes: 0.into() }));
    let pool = Pool::create_with("small", vec![TopSpec { role: Role::Normal, mirror: false, leaves: vec![common::leaf("a")] }], CreateOptions::default(), devs4.opener()).unwrap();
    assert_eq!(pool.list_row().ashift, 12);
    let e = pool.attach("a", &common::leaf("b8"), false).unwrap_err();
    assert!(e.to_string().contains("8192-byte sectors"), "{e}");
    // added as its own top-level vdev it gets ashift 13, and the pool's unit follows
    pool.add(vec![TopSpec { role: Role::Normal, mirror: false, leaves: vec![common::leaf("b8")] }], false).unwrap();
    let _ = devs4.get("b8").size();
    pool.export().unwrap();
}

/// Listing importable pools names each pool's state from its newest config: a device
/// holding an older one (a copy taken while the pool was active; a log device whose
/// removal could not write the new config keeps its labels the same way) must not make
/// an exported pool list as "active". Before, the first device scanned set the state.
#[test]
fn the_importable_list_shows_the_state_of_the_newest_config() {
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["b", "c"]);
    let pool = Pool::create("tank", mirror(l.clone()), CreateOptions::default()).unwrap();
    write_and_sync(&pool, 3);
    // sorted before b and c, so it is scanned first
    std::fs::copy(&l[0].path, dir.path().join("a-copy-while-active")).unwrap();
    pool.export().unwrap();
    let found = Pool::find_importable(&[dir.path().to_path_buf()]).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].state, "exported", "an older config's state was listed: {found:?}");
    assert_eq!(found[0].leaves.len(), 3);
}

/// Two devices claiming to be the same device of a pool (a copy of one beside it) are
/// named in the listing (the pool UNAVAIL) and the import refuses, naming both and the
/// guid: which one is the pool's cannot be told. Without the copy it imports.
#[test]
fn two_devices_claiming_one_guid_are_named_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["b", "c"]);
    let pool = Pool::create("tank", mirror(l.clone()), CreateOptions::default()).unwrap();
    write_and_sync(&pool, 4);
    pool.export().unwrap();
    let copy = dir.path().join("b-copy");
    std::fs::copy(&l[0].path, &copy).unwrap();
    let scan = Pool::scan_importable(&[dir.path().to_path_buf()]).unwrap();
    let p = &scan.pools[0];
    assert_eq!(p.health, Some(zilla_core::spa::PoolHealth::Unavail), "{p:?}");
    assert_eq!(p.duplicates.len(), 1, "{p:?}");
    let mut claimed: Vec<PathBuf> = p.duplicates[0].1.iter().map(|s| s.path.clone()).collect();
    claimed.sort();
    assert_eq!(claimed, vec![l[0].path.clone(), copy.clone()]);
    let e = Pool::import(&[dir.path().to_path_buf()], Some("tank")).err().expect("import with two devices claiming one guid").to_string();
    let guid = p.duplicates[0].0;
    assert!(e.contains(&format!("both claim to be its device with guid {guid}")), "{e}");
    assert!(e.contains(&copy.display().to_string()) && e.contains(&l[0].path.display().to_string()), "{e}");
    std::fs::remove_file(&copy).unwrap();
    Pool::import(&[dir.path().to_path_buf()], Some("tank")).expect("import without the copy").export().unwrap();
}

/// The embedded log region of a plain-file leaf is filled (no holes) when a pool is
/// created on it and when it is imported, not by a dry run (`import -F -n` writes
/// nothing). Method: create on sparse files; punch a hole in the region of an
/// exported pool's leaf; plan a rewind; import.
#[test]
fn a_plain_file_leaf_has_its_log_region_filled_by_create_and_import_only() {
    use rustix::fs::{FallocateFlags, SeekFrom};
    let dir = tempfile::tempdir().unwrap();
    let l = files(dir.path(), &["a", "b"]);
    let (start, region) = {
        let usable = zilla_core::vdev::label::usable_end(SIZE) - zilla_core::vdev::label::DATA_START;
        (zilla_core::vdev::label::DATA_START, zilla_core::vdev::embedded_log_bytes(usable))
    };
    assert!(region > 0);
    let first_hole = |path: &Path| {
        let f = std::fs::File::open(path).unwrap();
        rustix::fs::seek(&f, SeekFrom::Hole(start)).unwrap()
    };
    if first_hole(&l[0].path) >= start + region {
        eprintln!("this file system reports no holes: nothing to check");
        return;
    }
    let pool = Pool::create("tank", mirror(l.clone()), CreateOptions::default()).unwrap();
    for leaf in &l {
        assert!(first_hole(&leaf.path) >= start + region, "create left a hole in {}'s log region", leaf.path.display());
    }
    write_and_sync(&pool, 5);
    pool.export().unwrap();
    let punch = std::fs::OpenOptions::new().write(true).open(&l[0].path).unwrap();
    rustix::fs::fallocate(&punch, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, start + region - (1 << 20), 1 << 20).unwrap();
    drop(punch);
    let hole = first_hole(&l[0].path);
    assert!(hole < start + region, "the punched hole is not there");
    Pool::rewind_plan(&l, default_opener()).unwrap();
    assert_eq!(first_hole(&l[0].path), hole, "a dry run filled the hole");
    let pool = Pool::import_leaves(&l).unwrap();
    assert!(first_hole(&l[0].path) >= start + region, "import left the hole");
    pool.export().unwrap();
}
