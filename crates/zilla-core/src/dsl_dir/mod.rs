//! dsl_dir: the dataset tree of a pool — names, inherited properties, space fields.
//!
//! Theory of operation
//! -------------------
//! A pool's datasets form a tree of DSL directories in the MOS (docs/on-disk-format.md
//! §15): the root directory carries the pool's name, every other one is an entry of
//! its parent's child map (a ZAP: name → directory object). Each directory has a head
//! dataset (the object that holds its objset's root pointer, later also its
//! snapshots' chain) and, once something was set on it, a properties ZAP of its local
//! values. All of it lives in the MOS objset and changes through it in a txg, so a
//! create, a set or a destroy reaches the pool whole in one txg or not at all.
//!
//! **Properties** follow zfs's rules: the value of a property on a dataset is its
//! local value, else (for an inheritable property) the nearest ancestor's local value,
//! shown as `inherited from NAME`, else the default. `inherit` removes the local value;
//! `inherit -r` removes it on the dataset and every descendant. Non-inheritable
//! properties (quotas, reservations, `volsize`) are local or default only. Values are
//! stored as the normalized strings `zilla set` accepted; names this build does not
//! know are kept (a later build may) and inherit like user properties.
//!
//! **Names and bounds.** A component is 1 … 255 bytes of letters, digits and `_-.:`
//! (not starting with `-`), a full name at most [`NAME_MAX_BYTES`], the tree at most
//! [`MAX_DEPTH`] deep; every walk up the parent chain stops there, so a crafted loop
//! is an error, not a hang.

pub mod phys;

use std::collections::BTreeMap;

use crate::dmu::dnode::{ObjectSpec, ObjectType};
use crate::dmu::object_tree::BlockIo;
use crate::dmu::objset::Objset;
use crate::dmu::zap_store::ObjectInTxg;
use crate::{zap, Error, Result, Txg};
use phys::{DatasetPhys, DirPhys};

/// Longest full dataset name (zfs's ZFS_MAX_DATASET_NAME_LEN − 1).
pub const NAME_MAX_BYTES: usize = 255;
/// Deepest tree (zfs: 50; the name bound is the tighter one in practice).
pub const MAX_DEPTH: usize = 64;
/// Data block size of the ZAPs here (they start micro at 512 bytes and grow).
const ZAP_BLOCK_BYTES: u32 = 512;

/// Where a property's value comes from, as the SOURCE column shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Local,
    /// The directory object the value was inherited from.
    Inherited(u64),
    Default,
}

/// A component of a dataset name is acceptable.
pub fn check_component(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX_BYTES
        && !name.starts_with('-')
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || b"_-.: ".contains(&c))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("invalid dataset name component '{}'", name.escape_debug())))
    }
}

/// The dataset tree of one MOS objset.
pub struct DslTree<'a> {
    pub mos: &'a Objset,
    pub io: &'a dyn BlockIo,
}

/// What a new dataset starts with.
#[derive(Debug, Clone, Copy)]
pub struct NewDataset {
    pub creation_time_s: u64,
    pub objsetid: u64,
    pub guid: u64,
}

fn zap_salt(object: u64, txg: Txg) -> u64 {
    (object.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ txg.get().rotate_left(17)) | 1
}

impl DslTree<'_> {
    fn bonus(&self, object: u64, want: ObjectType) -> Result<Vec<u8>> {
        Ok(self.mos.typed_dnode(self.io, object, want)?.bonus)
    }

    pub fn dir(&self, dir: u64) -> Result<DirPhys> {
        DirPhys::decode(&self.bonus(dir, ObjectType::DslDir)?).map_err(|e| Error::Corrupt(format!("MOS object {dir}: {e}")))
    }

    pub fn dataset(&self, ds: u64) -> Result<DatasetPhys> {
        // open context's view: the holder's birth bounds nothing more here
        DatasetPhys::decode(&self.bonus(ds, ObjectType::DslDataset)?, Txg::LIMIT).map_err(|e| Error::Corrupt(format!("MOS object {ds}: {e}")))
    }

    fn set_dir(&self, txg: Txg, dir: u64, d: &DirPhys) -> Result<()> {
        self.mos.update_dnode(self.io, txg, dir, |p| {
            p.bonus = d.encode();
            Ok(())
        })
    }

    pub fn set_dataset(&self, txg: Txg, ds: u64, d: &DatasetPhys) -> Result<()> {
        self.mos.update_dnode(self.io, txg, ds, |p| {
            p.bonus = d.encode();
            Ok(())
        })
    }

    fn zap(&self, txg: Txg, object: u64) -> ObjectInTxg<'_> {
        ObjectInTxg { objset: self.mos, io: self.io, txg, object }
    }

    fn new_zap(&self, txg: Txg, ty: ObjectType) -> Result<u64> {
        let o = self.mos.allocate(self.io, txg, &ObjectSpec::metadata(ty, ZAP_BLOCK_BYTES))?;
        zap::create(&mut self.zap(txg, o), zap_salt(o, txg))?;
        Ok(o)
    }

    /// A directory and its head dataset, under `parent` (0: the pool's root).
    fn new_dir(&self, txg: Txg, parent: u64, new: &NewDataset) -> Result<(u64, u64)> {
        let dir = self.mos.allocate(self.io, txg, &ObjectSpec::metadata(ObjectType::DslDir, 512))?;
        let ds = self.mos.allocate(self.io, txg, &ObjectSpec::metadata(ObjectType::DslDataset, 512))?;
        let d = DirPhys { creation_time_s: new.creation_time_s, head_dataset: ds, parent, ..Default::default() };
        self.set_dir(txg, dir, &d)?;
        let dsp = DatasetPhys { dir, creation_time_s: new.creation_time_s, creation_txg: txg, objsetid: new.objsetid, guid: new.guid, ..Default::default() };
        self.set_dataset(txg, ds, &dsp)?;
        Ok((dir, ds))
    }

    /// The root directory of a new pool.
    pub fn create_root(&self, txg: Txg, new: &NewDataset) -> Result<(u64, u64)> {
        self.new_dir(txg, 0, new)
    }

    /// Create `name` under `parent`.
    pub fn create_child(&self, txg: Txg, parent: u64, name: &str, new: &NewDataset) -> Result<(u64, u64)> {
        check_component(name)?;
        let depth = self.depth(parent)?;
        if depth + 1 >= MAX_DEPTH {
            return Err(Error::invalid(format!("a dataset may be at most {MAX_DEPTH} levels deep")));
        }
        let mut p = self.dir(parent)?;
        if p.child_map == 0 {
            p.child_map = self.new_zap(txg, ObjectType::DslChildMap)?;
            self.set_dir(txg, parent, &p)?;
        } else if zap::lookup(&self.zap(txg, p.child_map), name.as_bytes())?.is_some() {
            return Err(Error::Exists(format!("dataset '{name}' already exists")));
        }
        let (dir, ds) = self.new_dir(txg, parent, new)?;
        zap::insert(&mut self.zap(txg, p.child_map), name.as_bytes(), &dir.to_le_bytes())?;
        Ok((dir, ds))
    }

    /// Levels from `dir` up to the root (the root: 0).
    fn depth(&self, dir: u64) -> Result<usize> {
        let mut d = dir;
        for depth in 0..MAX_DEPTH {
            let p = self.dir(d)?.parent;
            if p == 0 {
                return Ok(depth);
            }
            d = p;
        }
        Err(Error::Corrupt(format!("DSL directory {dir}: the parent chain is longer than {MAX_DEPTH}")))
    }

    /// The child of `dir` named `name`.
    pub fn child(&self, dir: u64, name: &str) -> Result<Option<u64>> {
        let d = self.dir(dir)?;
        if d.child_map == 0 {
            return Ok(None);
        }
        match zap::lookup(&self.zap(Txg::ZERO, d.child_map), name.as_bytes())? {
            None => Ok(None),
            Some(v) => Ok(Some(u64::from_le_bytes(v.try_into().map_err(|_| Error::Corrupt(format!("child map of directory {dir}: a value that is not a u64")))?))),
        }
    }

    /// The directory at `path` (components below the root), if any.
    pub fn lookup(&self, root: u64, path: &[&str]) -> Result<Option<u64>> {
        let mut d = root;
        for c in path {
            match self.child(d, c)? {
                Some(n) => d = n,
                None => return Ok(None),
            }
        }
        Ok(Some(d))
    }

    /// Every entry of the committed ZAP `obj` (none when `obj` is 0: not made yet).
    fn zap_entries(&self, obj: u64) -> Result<Vec<zap::ZapEntry>> {
        if obj == 0 {
            return Ok(Vec::new());
        }
        zap::list(&self.zap(Txg::ZERO, obj), 0, usize::MAX)
    }

    /// The children of `dir`, by name.
    pub fn children(&self, dir: u64) -> Result<BTreeMap<String, u64>> {
        let d = self.dir(dir)?;
        let mut out = BTreeMap::new();
        for e in self.zap_entries(d.child_map)? {
            let name = String::from_utf8(e.name).map_err(|_| Error::Corrupt(format!("child map of directory {dir}: a name that is not UTF-8")))?;
            let v: [u8; 8] = e.value.try_into().map_err(|_| Error::Corrupt(format!("child map of directory {dir}: a value that is not a u64")))?;
            out.insert(name, u64::from_le_bytes(v));
        }
        Ok(out)
    }

    /// The full name of `dir`, the root named `pool`.
    pub fn full_name(&self, dir: u64, pool: &str) -> Result<String> {
        let mut parts = Vec::new();
        let mut d = dir;
        for _ in 0..MAX_DEPTH {
            let p = self.dir(d)?.parent;
            if p == 0 {
                parts.push(pool.to_string());
                parts.reverse();
                return Ok(parts.join("/"));
            }
            let name = self.children(p)?.into_iter().find(|(_, o)| *o == d).map(|(n, _)| n);
            parts.push(name.ok_or_else(|| Error::Corrupt(format!("DSL directory {d} is not in its parent's child map")))?);
            d = p;
        }
        Err(Error::Corrupt(format!("DSL directory {dir}: the parent chain is longer than {MAX_DEPTH}")))
    }

    /// Remove the childless `dir` (not the root) from the tree, freeing its objects
    /// but not its objset (the destroy queue frees that).
    pub fn remove_leaf(&self, txg: Txg, dir: u64) -> Result<DatasetPhys> {
        let d = self.dir(dir)?;
        if d.parent == 0 {
            return Err(Error::invalid("the pool's root dataset cannot be destroyed"));
        }
        if !self.children(dir)?.is_empty() {
            return Err(Error::Busy("the dataset has children".into()));
        }
        let name = self.children(d.parent)?.into_iter().find(|(_, o)| *o == dir).map(|(n, _)| n);
        let name = name.ok_or_else(|| Error::Corrupt(format!("DSL directory {dir} is not in its parent's child map")))?;
        let pmap = self.dir(d.parent)?.child_map;
        zap::remove(&mut self.zap(txg, pmap), name.as_bytes())?;
        let ds = self.dataset(d.head_dataset)?;
        for o in [d.child_map, d.props, d.head_dataset, dir] {
            if o != 0 {
                self.mos.free_object(self.io, txg, o)?;
            }
        }
        Ok(ds)
    }

    /// Rename child `old` of `parent` to `new` in `txg`.
    pub fn rename_child(&self, txg: Txg, parent: u64, old: &str, new: &str) -> Result<()> {
        check_component(new)?;
        let map = self.dir(parent)?.child_map;
        let dir = self.child(parent, old)?.ok_or_else(|| Error::NotFound(format!("dataset component '{}'", old.escape_debug())))?;
        if self.child(parent, new)?.is_some() {
            return Err(Error::Exists(format!("dataset component '{}'", new.escape_debug())));
        }
        let mut z = self.zap(txg, map);
        zap::remove(&mut z, old.as_bytes())?;
        zap::update(&mut z, new.as_bytes(), &dir.to_le_bytes())
    }

    /// The local property values of `dir`.
    pub fn local_props(&self, dir: u64) -> Result<BTreeMap<String, String>> {
        let d = self.dir(dir)?;
        let mut out = BTreeMap::new();
        for e in self.zap_entries(d.props)? {
            match (String::from_utf8(e.name), String::from_utf8(e.value)) {
                (Ok(n), Ok(v)) => {
                    out.insert(n, v);
                }
                _ => return Err(Error::Corrupt(format!("properties of directory {dir}: an entry that is not UTF-8"))),
            }
        }
        Ok(out)
    }

    /// Set `name` = `value` (already validated and normalized) on `dir` in `txg`.
    pub fn set_prop(&self, txg: Txg, dir: u64, name: &str, value: &str) -> Result<()> {
        let mut d = self.dir(dir)?;
        if d.props == 0 {
            d.props = self.new_zap(txg, ObjectType::DslProps)?;
            self.set_dir(txg, dir, &d)?;
        }
        zap::update(&mut self.zap(txg, d.props), name.as_bytes(), value.as_bytes())
    }

    /// Remove the local value of `name` on `dir` (`zfs inherit`); with `recursive`, on
    /// every descendant too (`zfs inherit -r`).
    pub fn inherit_prop(&self, txg: Txg, dir: u64, name: &str, recursive: bool) -> Result<()> {
        self.inherit_below(txg, dir, name, recursive, 0)
    }

    fn inherit_below(&self, txg: Txg, dir: u64, name: &str, recursive: bool, depth: usize) -> Result<()> {
        if depth >= MAX_DEPTH {
            return Err(Error::Corrupt(format!("DSL directory {dir}: the tree below is deeper than {MAX_DEPTH}")));
        }
        let d = self.dir(dir)?;
        if d.props != 0 {
            zap::remove(&mut self.zap(txg, d.props), name.as_bytes())?;
        }
        if recursive {
            for (_, c) in self.children(dir)? {
                self.inherit_below(txg, c, name, true, depth + 1)?;
            }
        }
        Ok(())
    }

    /// The effective value of `name` on `dir` and where it comes from; `None` when
    /// nothing is set and the property has no default (an unknown name).
    pub fn get_prop(&self, dir: u64, name: &str) -> Result<Option<(String, Source)>> {
        let inheritable = crate::props::inheritable(name);
        let mut d = dir;
        for _ in 0..MAX_DEPTH {
            let p = self.dir(d)?;
            if p.props != 0 {
                if let Some(v) = zap::lookup(&self.zap(Txg::ZERO, p.props), name.as_bytes())? {
                    let v = String::from_utf8(v).map_err(|_| Error::Corrupt(format!("properties of directory {d}: a value that is not UTF-8")))?;
                    return Ok(Some((v, if d == dir { Source::Local } else { Source::Inherited(d) })));
                }
            }
            if !inheritable || p.parent == 0 {
                return Ok(crate::props::find(name).map(|def| (def.default.to_string(), Source::Default)));
            }
            d = p.parent;
        }
        Err(Error::Corrupt(format!("DSL directory {dir}: the parent chain is longer than {MAX_DEPTH}")))
    }
}

#[cfg(test)]
mod tests;
