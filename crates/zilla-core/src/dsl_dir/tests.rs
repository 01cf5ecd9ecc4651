//! Dataset tree tests: the bonus byte maps, and a model of zfs's property rules
//! (local, inherited from the nearest ancestor, default; non-inheritable properties;
//! `inherit` and `inherit -r`) against the tree in a MOS objset, synced and reopened as
//! it goes (replayable: `DSL_MODEL_SEED=N` reruns one seed).

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::phys::*;
use super::*;
use crate::dmu::object_tree::tests::MemBlocks;
use crate::dmu::objset::ObjsetType;

#[test]
fn bonus_byte_maps_round_trip_and_refuse_crafted_fields() {
    let d = DirPhys { creation_time_s: 1, head_dataset: 2, parent: 3, child_map: 5, props: 6, used_bytes: 7, used: UsedBreakdown { children: 9, ..Default::default() }, ..Default::default() };
    let b = d.encode();
    assert_eq!(b.len(), DIR_BONUS_BYTES);
    assert_eq!(u64::from_le_bytes(b[104..112].try_into().unwrap()), 9, "used by children at offset 104");
    assert_eq!(DirPhys::decode(&b).unwrap(), d);
    let mut bad = b.clone();
    bad[55] = 0x80;
    assert!(DirPhys::decode(&bad).unwrap_err().contains("used"));
    let mut bad = b.clone();
    bad[130] = 1;
    assert!(DirPhys::decode(&bad).unwrap_err().contains("reserved"));

    let ds = DatasetPhys { dir: 4, creation_txg: Txg(7), objsetid: 3, guid: 0xabc, ..Default::default() };
    let b = ds.encode();
    assert_eq!(b.len(), DATASET_BONUS_BYTES);
    assert_eq!(DatasetPhys::decode(&b, Txg(7)).unwrap(), ds);
    assert!(DatasetPhys::decode(&b, Txg(6)).unwrap_err().contains("creation txg"));
    let mut bad = b.clone();
    bad[120] = 4;
    assert!(DatasetPhys::decode(&bad, Txg(9)).unwrap_err().contains("flags"));
    let mut bad = b.clone();
    bad[112..120].fill(0);
    assert!(DatasetPhys::decode(&bad, Txg(9)).unwrap_err().contains("guid"));
    for at in 0..DATASET_BONUS_BYTES {
        let mut f = b.clone();
        f[at] ^= 0x41;
        if let Ok(p) = DatasetPhys::decode(&f, Txg(9)) {
            assert_eq!(p.encode(), f, "byte {at}");
        }
    }
}

#[test]
fn names_are_checked() {
    for ok in ["vm", "disk-1", "a.b:c_d", "with space"] {
        check_component(ok).unwrap();
    }
    for bad in ["", "-x", "a/b", "a@b", "é", ".", "..", &"x".repeat(256)] {
        assert!(check_component(bad).is_err(), "{bad:?}");
    }
}

const PROPS: &[&str] = &["compression", "sync", "checksum", "refreservation", "quota", "com.example:tag"];
const VALUES: &[&str] = &["lz4", "always", "off", "1048576", "on", "blue"];

/// zfs's rules over plain maps.
fn model_get(model: &BTreeMap<String, BTreeMap<String, String>>, ds: &str, prop: &str) -> Option<(String, String)> {
    if let Some(v) = model[ds].get(prop) {
        return Some((v.clone(), "local".into()));
    }
    if crate::props::inheritable(prop) {
        let mut p = ds;
        while let Some(i) = p.rfind('/') {
            p = &p[..i];
            if let Some(v) = model[p].get(prop) {
                return Some((v.clone(), format!("inherited from {p}")));
            }
        }
    }
    crate::props::find(prop).map(|d| (d.default.to_string(), "default".into()))
}

fn tree_get(t: &DslTree<'_>, root: u64, ds: &str, prop: &str) -> Option<(String, String)> {
    let path: Vec<&str> = ds.split('/').skip(1).collect();
    let dir = t.lookup(root, &path).unwrap().unwrap_or_else(|| panic!("{ds} not found"));
    t.get_prop(dir, prop).unwrap().map(|(v, s)| {
        let s = match s {
            Source::Local => "local".to_string(),
            Source::Default => "default".to_string(),
            Source::Inherited(d) => format!("inherited from {}", t.full_name(d, "tank").unwrap()),
        };
        (v, s)
    })
}

fn dir_of(t: &DslTree<'_>, root: u64, ds: &str) -> u64 {
    let path: Vec<&str> = ds.split('/').skip(1).collect();
    t.lookup(root, &path).unwrap().unwrap()
}

/// One random operation, applied to the tree and the model alike.
fn random_op(rng: &mut StdRng, t: &DslTree<'_>, txg: Txg, root: u64, model: &mut BTreeMap<String, BTreeMap<String, String>>, next_id: &mut u64) {
    let names: Vec<String> = model.keys().cloned().collect();
    let ds = names[rng.gen_range(0..names.len())].clone();
    let dir = dir_of(t, root, &ds);
    match rng.gen_range(0..10) {
        0..=2 if ds.matches('/').count() < 4 => {
            let name = ["a", "b", "c", "vm", "db"][rng.gen_range(0..5)];
            let full = format!("{ds}/{name}");
            *next_id += 1;
            let r = t.create_child(txg, dir, name, &NewDataset { creation_time_s: 1, objsetid: *next_id, guid: *next_id });
            if model.contains_key(&full) {
                assert!(matches!(r, Err(Error::Exists(_))), "{full} created twice");
            } else {
                r.unwrap();
                model.insert(full, BTreeMap::new());
            }
        }
        3 if ds != "tank" => {
            let has_children = model.keys().any(|k| k.starts_with(&format!("{ds}/")));
            let r = t.remove_leaf(txg, dir);
            if has_children {
                assert!(matches!(r, Err(Error::Busy(_))));
            } else {
                r.unwrap();
                model.remove(&ds);
            }
        }
        4..=7 => {
            let i = rng.gen_range(0..PROPS.len());
            t.set_prop(txg, dir, PROPS[i], VALUES[i]).unwrap();
            model.get_mut(&ds).unwrap().insert(PROPS[i].into(), VALUES[i].into());
        }
        _ => {
            let p = PROPS[rng.gen_range(0..PROPS.len())];
            let recursive = rng.gen_bool(0.4);
            t.inherit_prop(txg, dir, p, recursive).unwrap();
            for (k, m) in model.iter_mut() {
                if *k == ds || (recursive && k.starts_with(&format!("{ds}/"))) {
                    m.remove(p);
                }
            }
        }
    }
}

fn run_model(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = MemBlocks::new();
    let mut mos = Objset::create(ObjsetType::Mos, Txg(1));
    io.set_txg(1);
    let root = DslTree { mos: &mos, io: &io }.create_root(Txg(1), &NewDataset { creation_time_s: 1, objsetid: 1, guid: 1 }).unwrap().0;
    let mut os_bp = mos.sync(&io, Txg(1)).unwrap().unwrap().bp;
    let mut model: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::from([("tank".to_string(), BTreeMap::new())]);
    let mut next_id = 1;
    for txg in 2..60u64 {
        io.set_txg(txg);
        {
            let t = DslTree { mos: &mos, io: &io };
            for _ in 0..rng.gen_range(1..12) {
                random_op(&mut rng, &t, Txg(txg), root, &mut model, &mut next_id);
            }
        }
        if let Some(s) = mos.sync(&io, Txg(txg)).unwrap() {
            io.free(&os_bp);
            os_bp = s.bp;
        }
        if txg % 5 == 0 {
            mos = Objset::open(&io, &os_bp).unwrap();
        }
        let t = DslTree { mos: &mos, io: &io };
        for ds in model.keys() {
            for p in PROPS {
                assert_eq!(tree_get(&t, root, ds, p), model_get(&model, ds, p), "seed {seed} txg {txg}: {p} of {ds}");
            }
            let kids: Vec<String> = t.children(dir_of(&t, root, ds)).unwrap().into_keys().map(|k| format!("{ds}/{k}")).collect();
            let want: Vec<String> = model.keys().filter(|k| k.starts_with(&format!("{ds}/")) && !k[ds.len() + 1..].contains('/')).cloned().collect();
            assert_eq!(kids, want, "seed {seed} txg {txg}: children of {ds}");
        }
    }
}

#[test]
fn model_of_zfs_property_inheritance() {
    let seeds: Vec<u64> = match std::env::var("DSL_MODEL_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (1..=16).collect(),
    };
    for seed in seeds {
        run_model(seed);
    }
}

#[test]
fn refusals() {
    let io = MemBlocks::new();
    let mos = Objset::create(ObjsetType::Mos, Txg(1));
    io.set_txg(1);
    let t = DslTree { mos: &mos, io: &io };
    let nd = NewDataset { creation_time_s: 1, objsetid: 1, guid: 1 };
    let root = t.create_root(Txg(1), &nd).unwrap().0;
    assert!(t.remove_leaf(Txg(1), root).is_err(), "the root cannot go");
    let mut d = root;
    for i in 0..MAX_DEPTH - 1 {
        d = t.create_child(Txg(1), d, &format!("l{i}"), &nd).unwrap().0;
    }
    assert!(t.create_child(Txg(1), d, "deeper", &nd).is_err());
    assert!(t.create_child(Txg(1), root, "bad/name", &nd).is_err());
    // a parent chain that loops is an error, not a hang
    let mut p = t.dir(root).unwrap();
    p.parent = d;
    t.set_dir(Txg(1), root, &p).unwrap();
    assert!(t.get_prop(d, "compression").is_err());
    assert!(t.full_name(d, "tank").is_err());
}
