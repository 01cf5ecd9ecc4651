//! Crafting block pointers inside a pool's trees: a volume's root pointer (held in the
//! object directory), an indirect block's pointers, a data block's pointer. One field
//! of the chosen pointer is rewritten and every checksum above it resealed, bottom-up:
//! each indirect block on the path (recompressed in place, its new checksum in its
//! parent's pointer), the volume record in the object directory, the MOS chunk holding
//! it, the MOS index, and the newest uberblock of every leaf (its embedded checksum).
//! Blocks are rewritten where they are (every copy, every child of the mirror); a
//! block whose recompressed bytes no longer fit its allocated size cannot be crafted.
//! The transforms are the engine's own (`zio::prepare`, `zio::finish_read`,
//! `checksum::compute`).

use std::sync::Arc;

use zilla_core::block::blkptr::BlockPointer;
use zilla_core::block::checksum;
use zilla_core::block::compress::Compression;
use zilla_core::dmu::MOS_CHUNK_SIZE;
use zilla_core::vdev::label::{self, CONFIG_REGION_SIZE, LABELS};
use zilla_core::{zio, BlockId};

/// Leaf images by name, as the crafted-image tests hold them.
pub type Images = Vec<(String, Vec<u8>)>;

/// The top-level vdev id a leaf image belongs to, from its label config.
fn top_of(img: &[u8]) -> Option<u64> {
    let size = img.len() as u64;
    (0..LABELS).find_map(|l| {
        let off = label::label_offset(size, l) as usize;
        let (_, json) = label::decode_config(&img[off..off + CONFIG_REGION_SIZE], off as u64)?;
        let v: serde_json::Value = serde_json::from_slice(&json).ok()?;
        let me = v["this_guid"].as_u64()?;
        v["config"]["tops"].as_array()?.iter().find_map(|t| {
            let kids = t["children"].as_array()?;
            kids.iter().any(|c| c["guid"].as_u64() == Some(me)).then(|| t["id"].as_u64()).flatten()
        })
    })
}

fn phys_range(img: &[u8], offset: u64, asize: u32) -> Option<std::ops::Range<usize>> {
    let start = (label::DATA_START).checked_add(offset)? as usize;
    let end = start.checked_add(asize as usize)?;
    (end <= img.len()).then_some(start..end)
}

/// The logical bytes of `bp` (its first copy, checksum verified), read from the images.
fn read_logical(imgs: &Images, bp: &BlockPointer) -> Option<Vec<u8>> {
    let d = bp.dva[0];
    let img = imgs.iter().map(|(_, i)| i).find(|i| top_of(i) == Some(d.vdev.get() as u64))?;
    let phys = &img[phys_range(img, d.offset, d.asize)?];
    if !zio::verify(bp, phys) {
        return None;
    }
    zio::finish_read(bp, zilla_core::vdev::abd::AlignedBuf::copy_of(phys)).ok().map(|a| a.to_vec())
}

/// Store `logical` as the new content of metadata block `bp` in place (every copy, every
/// child): compressed (lz4) and padded to the block's allocated size. The pointer with
/// the new physical size, compression and checksum; None if it no longer fits.
fn rewrite_block(imgs: &mut Images, bp: &BlockPointer, logical: &[u8]) -> Option<BlockPointer> {
    let algo = bp.checksum_algo()?;
    let p = zio::prepare(&Arc::new(zilla_core::vdev::abd::AlignedBuf::copy_of(logical)), algo, Compression::Lz4, zio::ALLOC_UNIT);
    let asize = bp.dva[0].asize as usize;
    if p.data.len() > asize {
        return None;
    }
    let mut data = p.data.to_vec();
    data.resize(asize, 0);
    let mut new = *bp;
    new.psize = p.psize;
    new.compression_code = p.compression.code();
    new.checksum = checksum::compute(algo, &data);
    for d in bp.copies() {
        for (_, img) in imgs.iter_mut().filter(|(_, i)| top_of(i) == Some(d.vdev.get() as u64)) {
            let r = phys_range(img, d.offset, d.asize)?;
            img[r].copy_from_slice(&data);
        }
    }
    Some(new)
}

/// The object directory of the newest uberblock: its index pointer, the index block,
/// and its chunks (logical bytes), so that any byte of the stream can be changed.
struct Mos {
    index_bp: BlockPointer,
    index: Vec<u8>,
    chunks: Vec<(BlockPointer, Vec<u8>)>,
    dirty: Vec<bool>,
}

impl Mos {
    fn load(imgs: &Images) -> Option<Mos> {
        let img = &imgs.first()?.1;
        let &(at, slot) = super::newest_uberblock_slots(img).first()?;
        let index_bp = label::Uberblock::decode(&img[at..at + slot], at as u64)?.root;
        let index = read_logical(imgs, &index_bp)?;
        let n = (index_bp.fill as usize).div_ceil(MOS_CHUNK_SIZE);
        let mut chunks = Vec::new();
        for i in 0..n {
            let bp = BlockPointer::decode(index.get(i * 128..(i + 1) * 128)?)?;
            chunks.push((bp, read_logical(imgs, &bp)?));
        }
        Some(Mos { index_bp, index, dirty: vec![false; n], chunks })
    }
    fn read(&self, at: usize, len: usize) -> Option<Vec<u8>> {
        (at..at + len).map(|p| self.chunks.get(p / MOS_CHUNK_SIZE)?.1.get(p % MOS_CHUNK_SIZE).copied()).collect()
    }
    fn write(&mut self, at: usize, bytes: &[u8]) {
        for (i, &b) in bytes.iter().enumerate() {
            let p = at + i;
            self.chunks[p / MOS_CHUNK_SIZE].1[p % MOS_CHUNK_SIZE] = b;
            self.dirty[p / MOS_CHUNK_SIZE] = true;
        }
    }
    /// Where the root pointer of volume `name` is in the stream, and the tree's levels
    /// (docs/on-disk-format.md §5).
    fn volume_root(&self, name: &str) -> Option<(usize, u8)> {
        let u32_at = |p: usize| Some(u32::from_le_bytes(self.read(p, 4)?.try_into().ok()?) as usize);
        let count = u32_at(32)?;
        let mut p = 36;
        for _ in 0..count {
            let name_len = u32_at(p + 8)?;
            let this = self.read(p + 12, name_len)?;
            p += 12 + name_len + 8 + 4;
            let nlevels = self.read(p, 1)?[0];
            let root_at = p + 1;
            if this == name.as_bytes() {
                return Some((root_at, nlevels));
            }
            p = root_at + 128;
            p += 4 + u32_at(p)? + 8;
        }
        None
    }
    /// Reseal the changed chunks, the index, and every leaf's newest uberblock.
    fn store(mut self, imgs: &mut Images) -> Option<()> {
        for i in 0..self.chunks.len() {
            if self.dirty[i] {
                let (bp, data) = &self.chunks[i];
                let new = rewrite_block(imgs, bp, data)?;
                self.index[i * 128..(i + 1) * 128].copy_from_slice(&new.encode());
            }
        }
        let new = rewrite_block(imgs, &self.index_bp, &self.index)?;
        for (_, img) in imgs.iter_mut() {
            for (at, slot) in super::newest_uberblock_slots(img) {
                let o = at + super::UB_ROOT_AT;
                img[o..o + 128].copy_from_slice(&new.encode());
                label::seal(&mut img[at..at + slot], at as u64);
            }
        }
        Some(())
    }
}

/// Which pointer of a volume's tree to craft: the one at `level` on the path to data
/// block `blkid` (the tree's top level = the volume's root pointer in the object
/// directory).
#[derive(Debug, Clone, Copy)]
pub struct TreeTarget<'a> {
    pub volume: &'a str,
    pub level: u8,
    pub blkid: u64,
}

/// Rewrite `len` bytes at byte `field` of the target pointer with `value`
/// (little-endian, truncated to `len`) and reseal every checksum above it. False if the
/// target is not there (a hole on the way, no such level) or a rewritten block does not
/// fit its allocation.
pub fn set_tree_bp_field(imgs: &mut Images, t: TreeTarget<'_>, field: usize, len: usize, value: u64) -> bool {
    set_tree_bp(imgs, t, field, &value.to_le_bytes()[..len]).is_some()
}

fn set_tree_bp(imgs: &mut Images, t: TreeTarget<'_>, field: usize, bytes: &[u8]) -> Option<()> {
    let mut mos = Mos::load(imgs)?;
    let (root_at, nlevels) = mos.volume_root(t.volume)?;
    if t.level >= nlevels {
        return None;
    }
    // the indirect blocks from the root down to the one holding the target
    let mut path: Vec<(BlockPointer, Vec<u8>, usize)> = Vec::new();
    let mut bp = BlockPointer::decode(&mos.read(root_at, 128)?)?;
    for level in (t.level as u32 + 1..nlevels as u32).rev() {
        if bp.is_hole() {
            return None;
        }
        let ind = read_logical(imgs, &bp)?;
        let slot = BlockId(t.blkid).slot_in(level) as usize * 128;
        let child = BlockPointer::decode(ind.get(slot..slot + 128)?)?;
        path.push((bp, ind, slot));
        bp = child;
    }
    if bp.is_hole() {
        return None;
    }
    match path.last_mut() {
        Some((_, ind, slot)) => ind[*slot + field..*slot + field + bytes.len()].copy_from_slice(bytes),
        None => mos.write(root_at + field, bytes),
    }
    while let Some((bp, ind, _)) = path.pop() {
        let new = rewrite_block(imgs, &bp, &ind)?.encode();
        match path.last_mut() {
            Some((_, parent, slot)) => parent[*slot..*slot + 128].copy_from_slice(&new),
            None => mos.write(root_at, &new),
        }
    }
    mos.store(imgs)
}
