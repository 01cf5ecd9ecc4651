//! free_list: a txg's deferred frees as a MOS object (format 2).
//!
//! Theory of operation
//! -------------------
//! A block freed in txg T is still referenced by the trees of T − 1 and T − 2, which an
//! import may fall back to, so its space is reused only after T + 2 has committed
//! (docs/on-disk-format.md §17; metaslab.rs keeps the same window in memory). The pool
//! keeps three free lists, one per txg modulo 3: T's frees are appended to list
//! `T % 3`, whose previous content (the frees of T − 3) went into the space maps in
//! T − 1's sync and is dropped when T first appends. An import reads the lists of the
//! newest uberblock's txg and the one before as still deferred.
//!
//! Entries are the DVAs of §3, 16 bytes, appended; the bonus says which txg the list
//! holds and how many entries it has. A txg writes only the blocks its entries land in
//! (and the bonus), so a txg that frees little writes little whatever the lists held.
//!
//! **Bounds.** A list holds at most [`MAX_ENTRIES`] (2^32) entries; loading checks the
//! count against the object's blocks and every entry against the caller's view of the
//! pool (a DVA in no metaslab of an existing vdev, or not allocated there, is corrupt).

use std::sync::Arc;

use crate::block::blkptr::Dva;
use crate::dmu::dnode::{ObjectSpec, ObjectType};
use crate::dmu::object_tree::BlockIo;
use crate::dmu::objset::Objset;
use crate::vdev::abd::AlignedBuf;
use crate::{Error, Result, Txg, VdevId};

/// Bytes of an entry.
pub const ENTRY_BYTES: usize = 16;
/// Data block size of a free list.
pub const BLOCK_BYTES: u32 = 16 << 10;
/// Most entries of one list.
pub const MAX_ENTRIES: u64 = 1 << 32;
/// Free lists a pool keeps (one per txg modulo this).
pub const LISTS: u64 = 3;

const ENTRIES_PER_BLOCK: u64 = BLOCK_BYTES as u64 / ENTRY_BYTES as u64;

pub fn encode_dva(d: &Dva) -> [u8; ENTRY_BYTES] {
    let mut b = [0u8; ENTRY_BYTES];
    b[..4].copy_from_slice(&d.vdev.0.to_le_bytes());
    b[4..8].copy_from_slice(&d.asize.to_le_bytes());
    b[8..].copy_from_slice(&d.offset.to_le_bytes());
    b
}

pub fn decode_dva(b: &[u8]) -> std::result::Result<Dva, String> {
    let vdev = u32::from_le_bytes(b[..4].try_into().expect("16 bytes"));
    let asize = u32::from_le_bytes(b[4..8].try_into().expect("16 bytes"));
    let offset = u64::from_le_bytes(b[8..16].try_into().expect("16 bytes"));
    if asize == 0 || asize % 512 != 0 || offset % 512 != 0 {
        return Err(format!("DVA {vdev}:{offset:#x}:{asize:#x} is not a 512-byte-aligned extent"));
    }
    Ok(Dva { vdev: VdevId(vdev), asize, offset })
}

/// A free list's bonus: the txg its frees are of, and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FreeListPhys {
    pub txg: Txg,
    pub count: u64,
}

impl FreeListPhys {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.txg.get().to_le_bytes().to_vec();
        b.extend_from_slice(&self.count.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8]) -> std::result::Result<FreeListPhys, String> {
        if b.len() != 16 {
            return Err(format!("free list bonus of {} bytes", b.len()));
        }
        let txg = u64::from_le_bytes(b[..8].try_into().expect("8"));
        let count = u64::from_le_bytes(b[8..].try_into().expect("8"));
        if txg >= Txg::LIMIT.get() || count > MAX_ENTRIES {
            return Err(format!("txg {txg}, count {count}: beyond the limits"));
        }
        Ok(FreeListPhys { txg: Txg(txg), count })
    }
}

/// One free list object in the MOS.
pub struct FreeList<'a> {
    pub mos: &'a Objset,
    pub io: &'a dyn BlockIo,
    pub object: u64,
}

impl<'a> FreeList<'a> {
    /// A new, empty list, allocated in `txg`.
    pub fn create(mos: &'a Objset, io: &'a dyn BlockIo, txg: Txg) -> Result<FreeList<'a>> {
        let object = mos.allocate(io, txg, &ObjectSpec::metadata(ObjectType::FreeList, BLOCK_BYTES))?;
        Ok(FreeList { mos, io, object })
    }

    fn corrupt(&self, why: String) -> Error {
        Error::Corrupt(format!("free list object {}: {why}", self.object))
    }

    pub fn phys(&self) -> Result<FreeListPhys> {
        let d = self.mos.typed_dnode(self.io, self.object, ObjectType::FreeList)?;
        FreeListPhys::decode(&d.bonus).map_err(|e| self.corrupt(e))
    }

    fn set_phys(&self, txg: Txg, p: FreeListPhys) -> Result<()> {
        self.mos.update_dnode(self.io, txg, self.object, |d| {
            d.bonus = p.encode();
            Ok(())
        })
    }

    /// Append `frees` as frees of `txg`, in `txg`. The list's older content (another
    /// txg's, already in the space maps) is dropped first.
    pub fn append(&self, txg: Txg, frees: &[Dva]) -> Result<()> {
        let mut p = self.phys()?;
        if p.txg != txg {
            for blkid in 0..p.count.div_ceil(ENTRIES_PER_BLOCK) {
                self.mos.write_block(self.io, txg, self.object, blkid, None)?;
            }
            p = FreeListPhys { txg, count: 0 };
        }
        if p.count + frees.len() as u64 > MAX_ENTRIES {
            return Err(Error::NoSpaceFor(format!("more than {MAX_ENTRIES} frees in txg {txg}")));
        }
        let mut rest = frees;
        let mut at = p.count;
        while !rest.is_empty() {
            let blkid = at / ENTRIES_PER_BLOCK;
            let within = (at % ENTRIES_PER_BLOCK) as usize;
            let mut block = match within {
                0 => vec![0u8; BLOCK_BYTES as usize],
                _ => self.mos.read_block(self.io, self.object, blkid)?.map(|b| b.to_vec()).unwrap_or_else(|| vec![0u8; BLOCK_BYTES as usize]),
            };
            let n = rest.len().min(ENTRIES_PER_BLOCK as usize - within);
            for (i, d) in rest[..n].iter().enumerate() {
                let o = (within + i) * ENTRY_BYTES;
                block[o..o + ENTRY_BYTES].copy_from_slice(&encode_dva(d));
            }
            self.mos.write_block(self.io, txg, self.object, blkid, Some(Arc::new(AlignedBuf::from(&block[..]))))?;
            rest = &rest[n..];
            at += n as u64;
        }
        self.set_phys(txg, FreeListPhys { txg, count: at })
    }

    /// The list's txg and entries, each passed to `check` (which says why a DVA cannot
    /// be a deferred free of this pool).
    pub fn load(&self, check: &mut dyn FnMut(&Dva) -> std::result::Result<(), String>) -> Result<(Txg, Vec<Dva>)> {
        let p = self.phys()?;
        let d = self.mos.typed_dnode(self.io, self.object, ObjectType::FreeList)?;
        let blocks = p.count.div_ceil(ENTRIES_PER_BLOCK);
        if d.data_block_bytes != BLOCK_BYTES || (blocks > 0 && blocks - 1 > d.maxblkid) {
            return Err(self.corrupt(format!("{} entries beyond its blocks", p.count)));
        }
        let mut out = Vec::with_capacity(p.count.min(1 << 20) as usize);
        for blkid in 0..blocks {
            let Some(b) = self.mos.read_block(self.io, self.object, blkid)? else {
                return Err(self.corrupt(format!("block {blkid} of its entries is a hole")));
            };
            let n = (p.count - blkid * ENTRIES_PER_BLOCK).min(ENTRIES_PER_BLOCK) as usize;
            for (i, e) in b.chunks_exact(ENTRY_BYTES).take(n).enumerate() {
                let index = blkid * ENTRIES_PER_BLOCK + i as u64;
                let dva = decode_dva(e).and_then(|d| check(&d).map(|()| d)).map_err(|w| self.corrupt(format!("entry {index}: {w}")))?;
                out.push(dva);
            }
        }
        Ok((p.txg, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dmu::object_tree::tests::MemBlocks;
    use crate::dmu::objset::ObjsetType;

    fn dva(i: u64) -> Dva {
        Dva { vdev: VdevId((i % 3) as u32), asize: 512 * (1 + (i % 7) as u32), offset: 4096 * i }
    }

    #[test]
    fn lists_append_per_txg_and_drop_older_content() {
        let io = MemBlocks::new();
        io.set_txg(1);
        let mut mos = Objset::create(ObjsetType::Mos, Txg(1));
        let fl = FreeList::create(&mos, &io, Txg(1)).unwrap().object;
        let mut bp = mos.sync(&io, Txg(1)).unwrap().unwrap().bp;
        let all: Vec<Dva> = (0..3000).map(dva).collect();
        // txg 2: 1500 frees in three appends (crossing a block), txg 5: 10 more
        io.set_txg(2);
        let list = FreeList { mos: &mos, io: &io, object: fl };
        list.append(Txg(2), &all[..100]).unwrap();
        list.append(Txg(2), &all[100..1100]).unwrap();
        list.append(Txg(2), &all[1100..1500]).unwrap();
        bp = mos.sync(&io, Txg(2)).map(|s| s.unwrap().bp).unwrap_or(bp);
        mos = Objset::open(&io, &bp).unwrap();
        let list = FreeList { mos: &mos, io: &io, object: fl };
        assert_eq!(list.load(&mut |_| Ok(())).unwrap(), (Txg(2), all[..1500].to_vec()));
        io.set_txg(5);
        list.append(Txg(5), &all[2000..2010]).unwrap();
        bp = mos.sync(&io, Txg(5)).unwrap().unwrap().bp;
        mos = Objset::open(&io, &bp).unwrap();
        let list = FreeList { mos: &mos, io: &io, object: fl };
        assert_eq!(list.load(&mut |_| Ok(())).unwrap(), (Txg(5), all[2000..2010].to_vec()));
        let d = mos.dnode(&io, fl).unwrap().phys().unwrap();
        assert_eq!(d.used_bytes, 16 << 10, "the older txg's blocks were freed: one block left ({} bytes)", d.used_bytes);
        let e = list.load(&mut |d| if d.offset == 4096 * 2005 { Err("not allocated".into()) } else { Ok(()) }).unwrap_err().to_string();
        assert!(e.contains("entry 5") && e.contains("not allocated"), "{e}");
    }

    #[test]
    fn crafted_lists_are_refused() {
        assert!(decode_dva(&encode_dva(&Dva { vdev: VdevId(1), asize: 0, offset: 0 })).is_err());
        assert!(decode_dva(&encode_dva(&Dva { vdev: VdevId(1), asize: 512, offset: 100 })).is_err());
        assert!(FreeListPhys::decode(&FreeListPhys { txg: Txg(1), count: MAX_ENTRIES + 1 }.encode()).is_err());
        let io = MemBlocks::new();
        io.set_txg(1);
        let mos = Objset::create(ObjsetType::Mos, Txg(1));
        let list = FreeList::create(&mos, &io, Txg(1)).unwrap();
        list.append(Txg(1), &[dva(1)]).unwrap();
        list.set_phys(Txg(1), FreeListPhys { txg: Txg(1), count: 5000 }).unwrap();
        assert!(list.load(&mut |_| Ok(())).unwrap_err().to_string().contains("beyond its blocks"));
    }
}
