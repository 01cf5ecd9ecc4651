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

use zilla_core::spa::{CreateOptions, Pool, TopSpec};
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
