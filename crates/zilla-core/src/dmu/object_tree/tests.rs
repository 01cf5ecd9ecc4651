//! Object tree tests: a block store over a map that checks every read and free
//! against what is live, and a model-based test of many txgs of writes and frees in
//! trees of several shapes, growing from one level to many (replayable:
//! `OBJECT_TREE_SEED=N` reruns one seed).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::block::blkptr::Dva;
use crate::dmu::dnode::{ObjectSpec, ObjectType, DnodePhys};

/// Blocks in memory. A block pointer's offset names its block; reads and frees of a
/// block that is not live fail the test, so a tree that frees twice, frees what it
/// still uses or leaks is caught.
pub(crate) struct MemBlocks {
    pub txg: AtomicU64,
    next_offset: AtomicU64,
    pub live: Mutex<HashMap<u64, (BlockSpec, Arc<AlignedBuf>)>>,
    pub writes: AtomicU64,
    pub reads: AtomicU64,
}

impl MemBlocks {
    pub fn new() -> MemBlocks {
        MemBlocks { txg: AtomicU64::new(1), next_offset: AtomicU64::new(4096), live: Mutex::new(HashMap::new()), writes: AtomicU64::new(0), reads: AtomicU64::new(0) }
    }
    pub fn set_txg(&self, txg: u64) {
        self.txg.store(txg, Ordering::Relaxed);
    }
}

impl BlockIo for MemBlocks {
    fn txg(&self) -> Txg {
        Txg(self.txg.load(Ordering::Relaxed))
    }
    fn read(&self, bp: &BlockPointer) -> Result<Arc<AlignedBuf>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let live = self.live.lock();
        let (spec, d) = live.get(&bp.dva[0].offset).unwrap_or_else(|| panic!("read of a block that is not live: {bp:?}"));
        assert_eq!((spec.kind, spec.level), (bp.kind, bp.level));
        Ok(d.clone())
    }
    fn write(&self, data: Arc<AlignedBuf>, spec: BlockSpec) -> Result<BlockPointer> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let asize = (data.len() as u32).div_ceil(512) * 512;
        let offset = self.next_offset.fetch_add(asize as u64, Ordering::Relaxed);
        let bp = BlockPointer {
            dva: [Dva { vdev: crate::VdevId(0), asize, offset }, Dva::default(), Dva::default()],
            lsize: data.len() as u32,
            psize: data.len() as u32,
            birth: self.txg(),
            fill: spec.fill,
            checksum_code: spec.checksum as u8,
            compression_code: 0,
            kind: spec.kind,
            level: spec.level,
            checksum: [0; 32],
        };
        self.live.lock().insert(offset, (spec, data));
        Ok(bp)
    }
    fn free(&self, bp: &BlockPointer) {
        assert!(self.live.lock().remove(&bp.dva[0].offset).is_some(), "free of a block that is not live: {bp:?}");
    }
}

pub(crate) fn data_block(io: &MemBlocks, shape: &Shape, stamp: u64) -> BlockPointer {
    let mut d = vec![0u8; shape.data_block_bytes as usize];
    d[..8].copy_from_slice(&stamp.to_le_bytes());
    let spec = BlockSpec { kind: shape.data_kind, level: 0, fill: 1, checksum: ChecksumAlgo::Fletcher4, compression: Compression::Off };
    io.write(Arc::new(AlignedBuf::from(&d[..])), spec).unwrap()
}

fn stamp_of(io: &MemBlocks, bp: &BlockPointer) -> u64 {
    u64::from_le_bytes(io.read(bp).unwrap()[..8].try_into().unwrap())
}

struct Object {
    shape: Shape,
    nlevels: u8,
    roots: Vec<BlockPointer>,
    used: i64,
}

impl Object {
    fn new(indblkshift: u8, nblkptr: u8) -> Object {
        let mut spec = ObjectSpec::metadata(ObjectType::U64Array, 4096);
        (spec.indblkshift, spec.nblkptr) = (indblkshift, nblkptr);
        let d = DnodePhys::new(&spec, Txg(1));
        Object { shape: d.shape(), nlevels: 1, roots: d.blkptr.clone(), used: 0 }
    }
    fn tree(&self) -> Tree<'_> {
        Tree { shape: self.shape, nlevels: self.nlevels, roots: &self.roots }
    }
    fn sync(&mut self, io: &MemBlocks, changes: &[(u64, BlockPointer)]) {
        let a = apply(io, &self.tree(), changes).unwrap();
        assert!(a.nlevels >= self.nlevels);
        self.nlevels = a.nlevels;
        self.roots = a.roots;
        self.used += a.used_delta;
    }
}

/// Everything the tree reaches must be exactly what is live; `used` is their bytes.
fn check_against(io: &MemBlocks, obj: &Object, model: &BTreeMap<u64, u64>) {
    let mut seen = Vec::new();
    obj.tree().walk(io, 0, u64::MAX, &mut |blkid, bp| {
        seen.push((blkid, stamp_of(io, bp)));
        Ok(true)
    })
    .unwrap();
    let want: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(seen, want, "walk differs from the model");
    let mut reached = 0u64;
    let mut bytes = 0i64;
    obj.tree()
        .visit_post_order(io, &mut |bp, level| {
            assert_eq!(bp.level as u32, level);
            reached += 1;
            bytes += allocated_bytes(bp) as i64;
            Ok(())
        })
        .unwrap();
    assert_eq!(reached as usize, io.live.lock().len(), "blocks reached vs live (a leak or a lost block)");
    assert_eq!(bytes, obj.used, "used bytes");
    let fill: u64 = obj.roots.iter().map(|b| b.fill).sum();
    assert_eq!(fill, model.len() as u64, "fill");
}

#[test]
fn grows_from_one_level_keeping_what_it_held() {
    let io = MemBlocks::new();
    let mut obj = Object::new(12, 1); // 32 pointers per indirect, one root
    let mut model = BTreeMap::new();
    io.set_txg(2);
    let b0 = data_block(&io, &obj.shape, 100);
    obj.sync(&io, &[(0, b0)]);
    model.insert(0, 100);
    assert_eq!(obj.nlevels, 1);
    // one write far out: three new levels, the old root becomes entry 0 of a chain
    io.set_txg(3);
    let far = 32 * 32 * 5 + 7;
    let b1 = data_block(&io, &obj.shape, 200);
    obj.sync(&io, &[(far, b1)]);
    model.insert(far, 200);
    assert_eq!(obj.nlevels, 4);
    check_against(&io, &obj, &model);
    assert_eq!(stamp_of(&io, &obj.tree().lookup(&io, 0).unwrap()), 100);
    assert!(obj.tree().lookup(&io, 1).unwrap().is_hole());
    assert!(obj.tree().lookup(&io, u64::MAX).unwrap().is_hole());
    // freeing everything leaves holes (levels stay)
    io.set_txg(4);
    obj.sync(&io, &[(0, BlockPointer::hole()), (far, BlockPointer::hole())]);
    model.clear();
    check_against(&io, &obj, &model);
    assert!(obj.roots.iter().all(|b| b.is_hole()));
    assert!(io.live.lock().is_empty());
}

#[test]
fn beyond_the_largest_tree_is_refused() {
    let io = MemBlocks::new();
    let obj = Object::new(12, 1);
    let cap = obj.shape.capacity(crate::dmu::dnode::MAX_NLEVELS);
    let b = data_block(&io, &obj.shape, 1);
    assert!(apply(&io, &obj.tree(), &[(cap, b)]).is_err());
}

#[test]
fn crafted_indirect_pointers_are_errors() {
    let io = MemBlocks::new();
    let mut obj = Object::new(12, 3); // root 1 covers blocks 32 … 63
    io.set_txg(2);
    let b = data_block(&io, &obj.shape, 1);
    obj.sync(&io, &[(40, b)]);
    assert_eq!(obj.nlevels, 2);
    // corrupt entry 8 (block 40) of the level-1 indirect: every field in turn
    let off = obj.roots[1].dva[0].offset;
    let good = io.live.lock()[&off].1.clone();
    for (at, val) in [(74usize, 9u8), (75, 3), (48, 1), (64, 0), (56, 0xff)] {
        let mut d = good.to_vec();
        d[8 * 128 + at] = val;
        io.live.lock().get_mut(&off).unwrap().1 = Arc::new(AlignedBuf::from(&d[..]));
        let e = obj.tree().lookup(&io, 40).unwrap_err().to_string();
        assert!(e.contains("block pointer 8 of a level 1 indirect"), "{e}");
    }
}

fn run_model(seed: u64, indblkshift: u8, nblkptr: u8, txgs: u64, spread: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = MemBlocks::new();
    let mut obj = Object::new(indblkshift, nblkptr);
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    for txg in 2..2 + txgs {
        io.set_txg(txg);
        let mut changes: BTreeMap<u64, BlockPointer> = BTreeMap::new();
        // the reach grows with time, so the tree grows level by level
        let reach = (spread >> (txgs + 1 - txg).min(40)).max(8);
        for _ in 0..rng.gen_range(0..40) {
            let blkid = if rng.gen_bool(0.5) { rng.gen_range(0..reach) } else { rng.gen_range(0..64) };
            if let Some(old) = changes.get(&blkid) {
                if !old.is_hole() {
                    io.free(old); // rewritten in the same txg: the earlier version never reaches the tree
                }
            }
            if rng.gen_bool(0.3) {
                changes.insert(blkid, BlockPointer::hole());
                model.remove(&blkid);
            } else {
                let stamp = txg << 32 | rng.gen_range(0..1u64 << 32);
                changes.insert(blkid, data_block(&io, &obj.shape, stamp));
                model.insert(blkid, stamp);
            }
        }
        let changes: Vec<(u64, BlockPointer)> = changes.into_iter().collect();
        obj.sync(&io, &changes);
        if txg % 7 == 0 || txg == txgs + 1 {
            check_against(&io, &obj, &model);
            for _ in 0..20 {
                let blkid = rng.gen_range(0..reach);
                let bp = obj.tree().lookup(&io, blkid).unwrap();
                assert_eq!(model.get(&blkid).copied(), (!bp.is_hole()).then(|| stamp_of(&io, &bp)), "seed {seed} txg {txg} blkid {blkid}");
            }
        }
    }
    assert!(obj.nlevels >= 3, "seed {seed}: the tree never grew past {} levels", obj.nlevels);
}

#[test]
fn model_of_writes_and_frees_over_many_txgs() {
    let seeds: Vec<u64> = match std::env::var("OBJECT_TREE_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (1..=24).collect(),
    };
    for seed in seeds {
        let (indblkshift, nblkptr) = [(12, 1), (12, 3), (14, 2), (17, 1)][(seed % 4) as usize];
        run_model(seed, indblkshift, nblkptr, 60, 1 << 30);
    }
}
