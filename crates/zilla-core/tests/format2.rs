//! Format 2 pools end to end: created, written, their volumes created, renamed,
//! grown, given properties and destroyed, scrubbed, exported and imported; after every
//! step what the space maps say is what the trees reference, and the data reads back.

mod common;
use common::*;
use zilla_core::block::blkptr::KIND_OBJSET;

fn create_version(devs: &DevSet, version: &str) -> std::sync::Arc<zilla_core::spa::Pool> {
    let opts = zilla_core::spa::CreateOptions { props: vec![("version".into(), version.into())], ..Default::default() };
    zilla_core::spa::Pool::create_with("tank", two_mirrors(), opts, devs.opener()).expect("create pool")
}

fn format2_pool(devs: &DevSet) -> std::sync::Arc<zilla_core::spa::Pool> {
    let pool = create_version(devs, "2");
    assert_eq!(pool.format(), 2);
    assert_eq!(pool.debug_mos_root().kind, KIND_OBJSET, "a format 2 pool's uberblock points at the MOS objset");
    pool
}

fn check(pool: &zilla_core::spa::Pool, what: &str) {
    pool.check_space_accounting().unwrap_or_else(|e| panic!("{what}: {e}"));
}

fn write_pattern(pool: &zilla_core::spa::Pool, vol: &str, seed: u64, off: u64, len: usize) -> Vec<u8> {
    let v = pool.open_volume(vol).unwrap();
    let data = pattern(seed, len);
    v.write(off, &data, false).unwrap();
    v.flush().unwrap();
    data
}

fn read_back(pool: &zilla_core::spa::Pool, vol: &str, off: u64, want: &[u8], what: &str) {
    let v = pool.open_volume(vol).unwrap();
    let mut back = vec![0u8; want.len()];
    v.read(off, &mut back).unwrap();
    assert!(back == want, "{what}: {vol} at {off} reads back other bytes");
}

#[test]
fn a_format_2_pool_keeps_its_volumes_data_and_space_across_imports() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 128 << 20);
    let pool = format2_pool(&devs);
    check(&pool, "new pool");
    pool.volume_create("a", 32 << 20, 16384, &[]).unwrap();
    pool.volume_create("b", 16 << 20, 4096, &[("compression".into(), "off".into())]).unwrap();
    let da = write_pattern(&pool, "a", 1, 4096, 1 << 20);
    let db = write_pattern(&pool, "b", 2, 0, 256 << 10);
    check(&pool, "written");
    pool.volume_rename("b", "b2").unwrap();
    pool.set_prop("a", "volsize", "48M").unwrap();
    pool.set_prop("a", "checksum", "sha256").unwrap();
    for i in 0..5 {
        pool.sync().unwrap();
        check(&pool, &format!("idle sync {i}"));
    }
    pool.export().unwrap();
    drop(pool);

    let pool = import(&devs);
    assert_eq!(pool.debug_mos_root().kind, KIND_OBJSET);
    check(&pool, "imported");
    read_back(&pool, "a", 4096, &da, "after import");
    read_back(&pool, "b2", 0, &db, "renamed, after import");
    assert!(pool.open_volume("b").is_err(), "the old name is gone");
    let names: Vec<String> = pool.volumes().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["tank/a", "tank/b2"]);
    let rows = pool.get_props("a", &["volsize".into(), "checksum".into()]).unwrap();
    let shown = format!("{rows:?}");
    assert!(shown.contains("sha256"), "a property survives import: {shown}");
    assert!(shown.contains("50331648") || shown.contains("48M"), "the grown size survives import: {shown}");

    // overwrite, destroy, keep syncing until the destroy queue is done
    let da2 = write_pattern(&pool, "a", 3, 0, 2 << 20);
    pool.volume_destroy("b2").unwrap();
    for i in 0..8 {
        pool.sync().unwrap();
        check(&pool, &format!("after destroy, sync {i}"));
    }
    pool.scrub(zilla_core::spa::ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    pool.export().unwrap();
    drop(pool);

    let pool = import(&devs);
    check(&pool, "imported after destroy");
    read_back(&pool, "a", 0, &da2, "after a second import");
    assert!(pool.open_volume("b2").is_err());
    pool.volume_create("c", 8 << 20, 16384, &[]).unwrap();
    let dc = write_pattern(&pool, "c", 4, 8192, 64 << 10);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    read_back(&pool, "c", 8192, &dc, "a volume created after import");
    check(&pool, "third import");
    pool.export().unwrap();
}

/// `pool upgrade`: a format 1 pool with volumes, frees still deferred, a finished scrub
/// and history becomes format 2 in one txg; every byte, name, property and the space
/// accounting survive it and the imports after it.
#[test]
fn a_format_1_pool_upgrades_to_format_2_keeping_everything() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 128 << 20);
    let pool = create_version(&devs, "1");
    assert_eq!((pool.format(), pool.debug_mos_root().kind), (1, zilla_core::block::blkptr::KIND_MOS_INDEX));
    pool.volume_create("a", 32 << 20, 16384, &[("checksum".into(), "sha256".into())]).unwrap();
    pool.volume_create("b", 16 << 20, 4096, &[]).unwrap();
    let _ = write_pattern(&pool, "a", 1, 0, 1 << 20);
    let da = write_pattern(&pool, "a", 2, 0, 1 << 20); // the first version's blocks are deferred frees now
    let db = write_pattern(&pool, "b", 3, 4096, 128 << 10);
    pool.scrub(zilla_core::spa::ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    let history = pool.history().0.len();
    assert!(pool.upgrade().unwrap(), "a format 1 pool upgrades");
    assert!(!pool.upgrade().unwrap(), "a format 2 pool is up to date");
    assert_eq!((pool.format(), pool.debug_mos_root().kind), (2, KIND_OBJSET));
    check(&pool, "upgraded");
    read_back(&pool, "a", 0, &da, "upgraded");
    for i in 0..4 {
        pool.sync().unwrap();
        check(&pool, &format!("sync {i} after the upgrade"));
    }
    pool.export().unwrap();
    drop(pool);

    let pool = import(&devs);
    assert_eq!(pool.format(), 2);
    check(&pool, "imported after the upgrade");
    read_back(&pool, "a", 0, &da, "imported after the upgrade");
    read_back(&pool, "b", 4096, &db, "imported after the upgrade");
    assert!(format!("{:?}", pool.get_props("a", &["checksum".into()]).unwrap()).contains("sha256"));
    assert_eq!(pool.history().0.len(), history, "the history is carried over");
    assert_eq!(pool.scan_status().state, zilla_core::scan::ScanState::Finished, "the scrub's record is carried over");
    pool.volume_create("c", 8 << 20, 16384, &[]).unwrap();
    let dc = write_pattern(&pool, "c", 4, 0, 64 << 10);
    pool.volume_destroy("b").unwrap();
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    check(&pool, "second import");
    read_back(&pool, "c", 0, &dc, "a volume made after the upgrade");
    let names: Vec<String> = pool.volumes().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["tank/a", "tank/c"]);
    pool.export().unwrap();
}

#[test]
fn create_refuses_a_version_it_does_not_write() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 << 20);
    let opts = zilla_core::spa::CreateOptions { props: vec![("version".into(), "28".into())], ..Default::default() };
    let e = zilla_core::spa::Pool::create_with("tank", two_mirrors(), opts, devs.opener()).err().expect("refused");
    assert!(e.to_string().contains("'version'"), "{e}");
}
