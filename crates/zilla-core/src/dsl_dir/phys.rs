//! The bonus byte maps of DSL directories and datasets (docs/on-disk-format.md §15).

use crate::block::blkptr::BlockPointer;
use crate::Txg;

/// Bytes of a DSL directory's bonus.
pub const DIR_BONUS_BYTES: usize = 136;
/// Bytes of a DSL dataset's bonus.
pub const DATASET_BONUS_BYTES: usize = 288;
/// Dataset flag: being destroyed.
pub const DS_FLAG_DESTROYING: u64 = 1;
/// Dataset flag: inconsistent (a receive in progress).
pub const DS_FLAG_INCONSISTENT: u64 = 2;
/// Counters are below this.
const COUNTER_LIMIT: u64 = 1 << 63;

/// What `used` of a directory is made of (§15, offset 88).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsedBreakdown {
    pub head: u64,
    pub snapshots: u64,
    pub children: u64,
    pub children_reservation: u64,
    pub refreservation: u64,
}

/// A DSL directory's bonus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirPhys {
    pub creation_time_s: u64,
    pub head_dataset: u64,
    pub parent: u64,
    pub origin: u64,
    pub child_map: u64,
    pub props: u64,
    pub used_bytes: u64,
    pub compressed_bytes: u64,
    pub uncompressed_bytes: u64,
    pub quota_bytes: u64,
    pub reservation_bytes: u64,
    pub used: UsedBreakdown,
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn put(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

impl DirPhys {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; DIR_BONUS_BYTES];
        let u = &self.used;
        for (i, v) in [
            self.creation_time_s,
            self.head_dataset,
            self.parent,
            self.origin,
            self.child_map,
            self.props,
            self.used_bytes,
            self.compressed_bytes,
            self.uncompressed_bytes,
            self.quota_bytes,
            self.reservation_bytes,
            u.head,
            u.snapshots,
            u.children,
            u.children_reservation,
            u.refreservation,
        ]
        .into_iter()
        .enumerate()
        {
            put(&mut b, i * 8, v);
        }
        b
    }

    /// Decode a bonus read from a device: the length, the zero tail and the counters'
    /// range are checked here; whether the object numbers name objects of the right
    /// type is checked where they are followed.
    pub fn decode(b: &[u8]) -> Result<DirPhys, String> {
        if b.len() != DIR_BONUS_BYTES {
            return Err(format!("a DSL directory bonus of {} bytes, not {DIR_BONUS_BYTES}", b.len()));
        }
        if u64_at(b, 128) != 0 {
            return Err("DSL directory: reserved bytes are not zero".into());
        }
        let w = |i: usize| u64_at(b, i * 8);
        let d = DirPhys {
            creation_time_s: w(0),
            head_dataset: w(1),
            parent: w(2),
            origin: w(3),
            child_map: w(4),
            props: w(5),
            used_bytes: w(6),
            compressed_bytes: w(7),
            uncompressed_bytes: w(8),
            quota_bytes: w(9),
            reservation_bytes: w(10),
            used: UsedBreakdown { head: w(11), snapshots: w(12), children: w(13), children_reservation: w(14), refreservation: w(15) },
        };
        for (i, name) in [(6, "used"), (7, "compressed"), (8, "uncompressed"), (9, "quota"), (10, "reservation"), (11, "used by the head dataset"), (12, "used by snapshots"), (13, "used by children"), (14, "used by children's reservations"), (15, "used by the refreservation")] {
            if w(i) >= COUNTER_LIMIT {
                return Err(format!("DSL directory: field {name} = {} is out of range", w(i)));
            }
        }
        Ok(d)
    }
}

/// A DSL dataset's bonus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatasetPhys {
    pub dir: u64,
    pub prev_snapshot: u64,
    pub prev_snapshot_txg: Txg,
    pub next_snapshot: u64,
    pub snapshot_map: u64,
    pub num_children: u64,
    pub creation_time_s: u64,
    pub creation_txg: Txg,
    pub dead_list: u64,
    pub referenced_bytes: u64,
    pub compressed_bytes: u64,
    pub uncompressed_bytes: u64,
    pub unique_bytes: u64,
    pub objsetid: u64,
    pub guid: u64,
    pub flags: u64,
    pub objset_bp: BlockPointer,
    pub next_clones: u64,
    pub snapshot_props: u64,
    pub user_holds: u64,
}

impl DatasetPhys {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; DATASET_BONUS_BYTES];
        for (i, v) in [
            self.dir,
            self.prev_snapshot,
            self.prev_snapshot_txg.get(),
            self.next_snapshot,
            self.snapshot_map,
            self.num_children,
            self.creation_time_s,
            self.creation_txg.get(),
            self.dead_list,
            self.referenced_bytes,
            self.compressed_bytes,
            self.uncompressed_bytes,
            self.unique_bytes,
            self.objsetid,
            self.guid,
            self.flags,
        ]
        .into_iter()
        .enumerate()
        {
            put(&mut b, i * 8, v);
        }
        b[128..256].copy_from_slice(&self.objset_bp.encode());
        put(&mut b, 256, self.next_clones);
        put(&mut b, 264, self.snapshot_props);
        put(&mut b, 272, self.user_holds);
        b
    }

    /// Decode a bonus read from a device (`holder_birth`: the birth of the dnode block
    /// holding it; the objset pointer and the txgs cannot be newer).
    pub fn decode(b: &[u8], holder_birth: Txg) -> Result<DatasetPhys, String> {
        if b.len() != DATASET_BONUS_BYTES {
            return Err(format!("a DSL dataset bonus of {} bytes, not {DATASET_BONUS_BYTES}", b.len()));
        }
        let w = |i: usize| u64_at(b, i * 8);
        if u64_at(b, 280) != 0 {
            return Err("DSL dataset: reserved bytes are not zero".into());
        }
        let objset_bp = BlockPointer::check(&b[128..256]).map_err(|e| format!("DSL dataset: objset pointer: {e}"))?;
        let d = DatasetPhys {
            dir: w(0),
            prev_snapshot: w(1),
            prev_snapshot_txg: Txg(w(2)),
            next_snapshot: w(3),
            snapshot_map: w(4),
            num_children: w(5),
            creation_time_s: w(6),
            creation_txg: Txg(w(7)),
            dead_list: w(8),
            referenced_bytes: w(9),
            compressed_bytes: w(10),
            uncompressed_bytes: w(11),
            unique_bytes: w(12),
            objsetid: w(13),
            guid: w(14),
            flags: w(15),
            objset_bp,
            next_clones: u64_at(b, 256),
            snapshot_props: u64_at(b, 264),
            user_holds: u64_at(b, 272),
        };
        let bad = |field: &str, v: u64| Err(format!("DSL dataset: field {field} = {v} is out of range"));
        if d.flags & !(DS_FLAG_DESTROYING | DS_FLAG_INCONSISTENT) != 0 {
            return bad("flags", d.flags);
        }
        if d.guid == 0 {
            return bad("guid", 0);
        }
        if d.dir == 0 {
            return bad("directory", 0);
        }
        if d.creation_txg.is_zero() || d.creation_txg > holder_birth {
            return bad("creation txg", d.creation_txg.get());
        }
        if d.prev_snapshot_txg > holder_birth {
            return bad("previous snapshot txg", d.prev_snapshot_txg.get());
        }
        if !d.objset_bp.is_hole() && (d.objset_bp.kind != crate::block::blkptr::KIND_OBJSET || d.objset_bp.birth > holder_birth) {
            return bad("objset pointer kind or birth", d.objset_bp.kind as u64);
        }
        for (i, name) in [(9, "referenced"), (10, "compressed"), (11, "uncompressed"), (12, "unique")] {
            if w(i) >= COUNTER_LIMIT {
                return bad(name, w(i));
            }
        }
        Ok(d)
    }
}
