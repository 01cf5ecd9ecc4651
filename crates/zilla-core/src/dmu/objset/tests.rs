//! Objset tests: allocation and reuse of object numbers against a model, with txgs in
//! flight while older ones sync, the objset reopened from its block and compared, and
//! every live block accounted for (replayable: `OBJSET_MODEL_SEED=N` reruns one seed);
//! a ZAP living in an object, growing from micro to fat across syncs.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dmu::object_tree::tests::MemBlocks;
use crate::dmu::zap_store::ObjectInTxg;

fn block_of(len: u32, stamp: u64) -> Arc<AlignedBuf> {
    let mut d = vec![0u8; len as usize];
    d[..8].copy_from_slice(&stamp.to_le_bytes());
    d[len as usize - 8..].copy_from_slice(&stamp.to_le_bytes());
    Arc::new(AlignedBuf::from(&d[..]))
}

fn stamp(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap())
}

/// What the model knows of one object.
#[derive(Clone, Debug)]
struct ModelObject {
    generation: Txg,
    object_type: ObjectType,
    blocks: BTreeMap<u64, u64>,
    bonus0: u8,
}

/// Blocks reachable from an objset block: the block itself, the meta-dnode's tree, and
/// every object's tree.
fn reachable(io: &MemBlocks, bp: &BlockPointer) -> usize {
    let os = Objset::open(io, bp).unwrap();
    let meta = os.inner.lock().phys.meta_dnode.clone();
    let mut n = 1;
    let mut objects = Vec::new();
    let meta_tree = Tree { shape: meta.shape(), nlevels: meta.nlevels, roots: &meta.blkptr };
    meta_tree
        .visit_post_order(io, &mut |_, _| {
            n += 1;
            Ok(())
        })
        .unwrap();
    meta_tree
        .walk(io, 0, u64::MAX, &mut |blkid, _| {
            objects.extend((0..DNODES_PER_BLOCK).map(|s| blkid * DNODES_PER_BLOCK + s).filter(|&o| o != 0));
            Ok(true)
        })
        .unwrap();
    for o in objects {
        if let Some(p) = os.dnode(io, o).unwrap().phys() {
            Tree { shape: p.shape(), nlevels: p.nlevels, roots: &p.blkptr }
                .visit_post_order(io, &mut |_, _| {
                    n += 1;
                    Ok(())
                })
                .unwrap();
        }
    }
    n
}

fn check_objset(io: &MemBlocks, os: &Objset, model: &BTreeMap<u64, ModelObject>, what: &str) {
    for (&o, m) in model {
        let p = os.dnode(io, o).unwrap().phys().unwrap_or_else(|| panic!("{what}: object {o} is free"));
        assert_eq!((p.generation, p.object_type, p.bonus.first().copied().unwrap_or(0)), (m.generation, m.object_type, m.bonus0), "{what}: object {o}");
        let mut seen = BTreeMap::new();
        let d = os.dnode(io, o).unwrap();
        // every block the model holds, its neighbours, and the first few
        let mut probe: std::collections::BTreeSet<u64> = (0..10).collect();
        probe.extend(m.blocks.keys().flat_map(|&b| [b.saturating_sub(1), b, b + 1]));
        for blkid in probe {
            if let Some(b) = os.read_block(io, o, blkid).unwrap() {
                seen.insert(blkid, stamp(&b));
            }
        }
        assert_eq!(seen, m.blocks, "{what}: blocks of object {o} (dnode {:?})", d.phys().map(|p| p.maxblkid));
    }
}

/// One random change in txg `t`: allocate, free, change a bonus, write or free a block.
fn random_change(rng: &mut StdRng, io: &MemBlocks, os: &Objset, t: Txg, model: &mut BTreeMap<u64, ModelObject>, freed_in: &mut BTreeMap<u64, Txg>, seed: u64) {
    let txg = t.get();
        match rng.gen_range(0..10) {
            0..=2 => {
                let ty = [ObjectType::U64Array, ObjectType::Bytes, ObjectType::PoolHistory][rng.gen_range(0..3)];
                let o = os.allocate(io, t, &ObjectSpec::metadata(ty, 4096)).unwrap();
                assert!(!model.contains_key(&o), "seed {seed}: object {o} handed out twice");
                if let Some(f) = freed_in.get(&o) {
                    assert!(*f < t, "seed {seed}: object {o} reused in the txg that freed it");
                }
                model.insert(o, ModelObject { generation: t, object_type: ty, blocks: BTreeMap::new(), bonus0: 0 });
            }
            3 if !model.is_empty() => {
                let o = *model.keys().nth(rng.gen_range(0..model.len())).unwrap();
                os.free_object(io, t, o).unwrap();
                model.remove(&o);
                freed_in.insert(o, t);
            }
            4 if !model.is_empty() => {
                let o = *model.keys().nth(rng.gen_range(0..model.len())).unwrap();
                let m = model.get_mut(&o).unwrap();
                if m.object_type != ObjectType::U64Array {
                    let v: u8 = rng.gen_range(1..255);
                    os.update_dnode(io, t, o, |p| {
                        p.bonus[0] = v;
                        Ok(())
                    })
                    .unwrap();
                    m.bonus0 = v;
                }
            }
            _ if !model.is_empty() => {
                let o = *model.keys().nth(rng.gen_range(0..model.len())).unwrap();
                let blkid = if rng.gen_bool(0.8) { rng.gen_range(0..8) } else { rng.gen_range(0..5000) };
                let m = model.get_mut(&o).unwrap();
                if rng.gen_bool(0.2) {
                    os.write_block(io, t, o, blkid, None).unwrap();
                    m.blocks.remove(&blkid);
                } else {
                    let s = txg << 32 | rng.gen_range(0..1u64 << 31);
                    os.write_block(io, t, o, blkid, Some(block_of(4096, s))).unwrap();
                    m.blocks.insert(blkid, s);
                }
            }
            _ => {}
        }
}

fn run_model(seed: u64, txgs: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = MemBlocks::new();
    let mut os = Objset::create(ObjsetType::FileSystem, Txg(1));
    io.set_txg(1);
    let mut root = os.sync(&io, Txg(1)).unwrap().unwrap().bp;
    let mut model: BTreeMap<u64, ModelObject> = BTreeMap::new();
    let mut freed_in: BTreeMap<u64, Txg> = BTreeMap::new();
    // txg t is open while t − 1 waits to sync: changes of two txgs are in flight
    for txg in 2..2 + txgs {
        let t = Txg(txg);
        for _ in 0..rng.gen_range(0..30) {
            random_change(&mut rng, &io, &os, t, &mut model, &mut freed_in, seed);
        }
        check_objset(&io, &os, &model, &format!("seed {seed} open txg {txg}"));
        // sync the previous txg while this one stays open
        let prev = Txg(txg - 1);
        if txg > 2 {
            io.set_txg(prev.get());
            if let Some(s) = os.sync(&io, prev).unwrap() {
                io.free(&root);
                root = s.bp;
            }
        }
        if txg % 10 == 0 {
            // sync this txg too, then reopen from the objset block alone
            io.set_txg(txg);
            if let Some(s) = os.sync(&io, t).unwrap() {
                io.free(&root);
                root = s.bp;
            }
            os = Objset::open(&io, &root).unwrap();
            check_objset(&io, &os, &model, &format!("seed {seed} reopened after txg {txg}"));
            assert_eq!(reachable(&io, &root), io.live.lock().len(), "seed {seed} txg {txg}: live blocks vs reachable (a leak or a lost block)");
            let fill = os.inner.lock().phys.meta_dnode.fill();
            assert_eq!(fill, model.len() as u64, "seed {seed} txg {txg}: the meta-dnode's fill counts the allocated objects");
        }
    }
}

#[test]
fn model_of_object_allocation_and_reuse() {
    let seeds: Vec<u64> = match std::env::var("OBJSET_MODEL_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (1..=12).collect(),
    };
    for seed in seeds {
        run_model(seed, 80);
    }
}

#[test]
fn numbers_are_reused_lowest_first_with_a_new_generation() {
    let io = MemBlocks::new();
    let os = Objset::create(ObjsetType::Mos, Txg(1));
    io.set_txg(1);
    let spec = ObjectSpec::metadata(ObjectType::U64Array, 512);
    let objs: Vec<u64> = (0..100).map(|_| os.allocate(&io, Txg(1), &spec).unwrap()).collect();
    assert_eq!(objs, (1..=100).collect::<Vec<_>>(), "object 0 is the meta-dnode; numbers start at 1");
    os.sync(&io, Txg(1)).unwrap().unwrap();
    io.set_txg(2);
    os.free_object(&io, Txg(2), 5).unwrap();
    os.free_object(&io, Txg(2), 40).unwrap();
    // not in the txg that freed them
    assert_eq!(os.allocate(&io, Txg(2), &spec).unwrap(), 101);
    os.sync(&io, Txg(2)).unwrap().unwrap();
    io.set_txg(3);
    assert_eq!(os.allocate(&io, Txg(3), &spec).unwrap(), 5);
    assert_eq!(os.allocate(&io, Txg(3), &spec).unwrap(), 40);
    assert_eq!(os.dnode(&io, 5).unwrap().phys().unwrap().generation, Txg(3));
    assert!(matches!(os.free_object(&io, Txg(3), 0), Err(Error::NotFound(_))));
    assert!(matches!(os.free_object(&io, Txg(3), 500), Err(Error::NotFound(_))));
}

#[test]
fn crafted_objset_blocks_are_refused_naming_the_field() {
    let good = ObjsetPhys::new(ObjsetType::Volume, Txg(3)).encode();
    assert!(ObjsetPhys::decode(&good, Txg(3)).is_ok());
    for (at, val, field) in [(0usize, 0u8, "magic"), (8, 2, "version"), (12, 9, "type"), (20, 1, "reserved"), (128, 12, "dnode array"), (129, 40, "indblkshift")] {
        let mut b = good.clone();
        b[at] = val;
        let e = ObjsetPhys::decode(&b, Txg(3)).unwrap_err();
        assert!(e.contains(field), "byte {at}: {e}");
    }
    assert!(ObjsetPhys::decode(&good, Txg(2)).unwrap_err().contains("generation"));
    for at in 0..OBJSET_BYTES {
        let mut b = good.clone();
        b[at] ^= 0x10;
        if let Ok(p) = ObjsetPhys::decode(&b, Txg(3)) {
            assert_eq!(p.encode(), b, "byte {at}");
        }
    }
}

#[test]
fn a_zap_in_an_object_grows_from_micro_to_fat_across_syncs() {
    let io = MemBlocks::new();
    let mut os = Objset::create(ObjsetType::Mos, Txg(1));
    io.set_txg(1);
    let zap_obj = os.allocate(&io, Txg(1), &ObjectSpec::metadata(ObjectType::ObjectDirectory, 512)).unwrap();
    crate::zap::create(&mut ObjectInTxg { objset: &os, io: &io, txg: Txg(1), object: zap_obj }, 0x1234).unwrap();
    let mut root = os.sync(&io, Txg(1)).unwrap().unwrap().bp;
    let mut want = BTreeMap::new();
    for txg in 2..40u64 {
        io.set_txg(txg);
        let mut z = ObjectInTxg { objset: &os, io: &io, txg: Txg(txg), object: zap_obj };
        for i in 0..200u64 {
            let k = format!("entry-{txg}-{i}");
            crate::zap::insert(&mut z, k.as_bytes(), &(txg * 1000 + i).to_le_bytes()).unwrap();
            want.insert(k, txg * 1000 + i);
        }
        if txg % 3 == 0 {
            let gone: Vec<String> = want.keys().take(50).cloned().collect();
            for k in gone {
                assert!(crate::zap::remove(&mut z, k.as_bytes()).unwrap());
                want.remove(&k);
            }
        }
        let s = os.sync(&io, Txg(txg)).unwrap().unwrap();
        io.free(&root);
        root = s.bp;
        if txg % 8 == 0 {
            os = Objset::open(&io, &root).unwrap();
        }
    }
    let z = ObjectInTxg { objset: &os, io: &io, txg: Txg(40), object: zap_obj };
    assert_eq!(crate::zap::form(&z).unwrap(), crate::zap::Form::Fat);
    assert_eq!(crate::zap::count(&z).unwrap(), want.len() as u64);
    for (k, v) in &want {
        assert_eq!(crate::zap::lookup_u64(&z, k.as_bytes()).unwrap(), Some(*v), "{k}");
    }
    assert_eq!(reachable(&io, &root), io.live.lock().len());
}

/// The pool's view of one sync attempt over [`MemBlocks`]: writes may fail after a
/// count; a block born in the attempt and freed in it is freed at once; older blocks'
/// frees wait for the commit; an abort drops what the attempt wrote.
struct Attempt<'a> {
    mem: &'a MemBlocks,
    fail_after: Option<u64>,
    writes: AtomicU64,
    written: Mutex<std::collections::BTreeSet<u64>>,
    deferred: Mutex<Vec<BlockPointer>>,
}

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

impl<'a> Attempt<'a> {
    fn new(mem: &'a MemBlocks, fail_after: Option<u64>) -> Attempt<'a> {
        Attempt { mem, fail_after, writes: AtomicU64::new(0), written: Mutex::new(Default::default()), deferred: Mutex::new(Vec::new()) }
    }
    fn abort(self) {
        for off in self.written.lock().iter() {
            self.mem.live.lock().remove(off);
        }
    }
    fn commit(self) {
        for bp in self.deferred.lock().iter() {
            self.mem.free(bp);
        }
    }
}

impl BlockIo for Attempt<'_> {
    fn txg(&self) -> Txg {
        self.mem.txg()
    }
    fn read(&self, bp: &BlockPointer) -> Result<Arc<AlignedBuf>> {
        self.mem.read(bp)
    }
    fn write(&self, data: Arc<AlignedBuf>, spec: BlockSpec) -> Result<BlockPointer> {
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        if self.fail_after.is_some_and(|f| n >= f) {
            return Err(Error::Io(std::io::Error::other("injected write failure")));
        }
        let bp = self.mem.write(data, spec)?;
        self.written.lock().insert(bp.dva[0].offset);
        Ok(bp)
    }
    fn free(&self, bp: &BlockPointer) {
        if bp.birth == self.txg() {
            assert!(self.written.lock().remove(&bp.dva[0].offset), "a block born in the attempt's txg that it did not write: {bp:?}");
            self.mem.free(bp);
        } else {
            self.deferred.lock().push(*bp);
        }
    }
}

/// Sync txg `t` of `os` in `passes` passes (a write to `log` before each later one),
/// the first attempt failing after `fail` writes; `check` after each aborted attempt.
/// Returns the aborted attempts; `root` is the objset's new root.
fn sync_in_attempts(io: &MemBlocks, os: &Objset, t: Txg, log: u64, passes: u64, mut fail: Option<u64>, root: &mut BlockPointer, check: &mut dyn FnMut(&Objset)) -> u32 {
    let mut aborted = 0;
    loop {
        let a = Attempt::new(io, fail.take());
        os.sync_begin(t);
        let mut r = Ok(None);
        let mut pass_root: Option<BlockPointer> = None;
        for pass in 0..passes {
            if pass > 0 {
                // the change a pass makes for the next one, the same in every attempt
                os.write_block(io, t, log, pass, Some(block_of(4096, t.get() << 8 | pass))).unwrap();
            }
            r = os.sync(&a, t).map(|s| {
                // the holder frees the root it replaces (one of this txg: at once)
                if let (Some(prev), Some(s)) = (pass_root, &s) {
                    a.free(&prev);
                    pass_root = Some(s.bp);
                }
                pass_root = pass_root.or(s.as_ref().map(|s| s.bp));
                s.or(pass_root.map(|bp| Synced { bp, dnodes_written: 0 }))
            });
            if r.is_err() {
                break;
            }
        }
        match r {
            Err(_) => {
                os.sync_abort(t);
                a.abort();
                aborted += 1;
                check(os);
            }
            Ok(s) => {
                os.sync_end(t);
                a.commit();
                if let Some(s) = s {
                    io.free(root);
                    *root = s.bp;
                }
                return aborted;
            }
        }
    }
}

/// Txgs synced in several passes (a change between them, as the pool's free list
/// appends are), with attempts that fail part way and are undone before the retry:
/// what stays is what the model says, and every live block is reachable exactly once.
fn run_attempts(seed: u64, txgs: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = MemBlocks::new();
    let os = Objset::create(ObjsetType::Mos, Txg(1));
    io.set_txg(1);
    let log = os.allocate(&io, Txg(1), &ObjectSpec::metadata(ObjectType::Bytes, 4096)).unwrap();
    let mut root = os.sync(&io, Txg(1)).unwrap().unwrap().bp;
    let mut model: BTreeMap<u64, ModelObject> = BTreeMap::new();
    let mut log_model = ModelObject { generation: Txg(1), object_type: ObjectType::Bytes, blocks: BTreeMap::new(), bonus0: 0 };
    let with_log = |m: &BTreeMap<u64, ModelObject>, l: &ModelObject| {
        let mut all = m.clone();
        all.insert(log, l.clone());
        all
    };
    let mut freed_in: BTreeMap<u64, Txg> = BTreeMap::new();
    let (mut aborted, mut multi) = (0, 0);
    for txg in 2..2 + txgs {
        let t = Txg(txg);
        io.set_txg(txg);
        for _ in 0..rng.gen_range(0..20) {
            random_change(&mut rng, &io, &os, t, &mut model, &mut freed_in, seed);
        }
        let passes = rng.gen_range(1..4u64);
        let fail = rng.gen_bool(0.3).then(|| rng.gen_range(0..12));
        let all = with_log(&model, &log_model);
        aborted += sync_in_attempts(&io, &os, t, log, passes, fail, &mut root, &mut |os: &Objset| {
            check_objset(&io, os, &all, &format!("seed {seed} txg {txg} after an aborted attempt"))
        });
        if passes > 1 {
            multi += 1;
            for pass in 1..passes {
                log_model.blocks.insert(pass, txg << 8 | pass);
            }
        }
        let all = with_log(&model, &log_model);
        check_objset(&io, &os, &all, &format!("seed {seed} txg {txg}"));
        let reopened = Objset::open(&io, &root).unwrap();
        check_objset(&io, &reopened, &all, &format!("seed {seed} txg {txg} reopened"));
        assert_eq!(reachable(&io, &root), io.live.lock().len(), "seed {seed} txg {txg}: live blocks vs reachable (a leak or a lost block)");
    }
    assert!(aborted > 0 && multi > 0, "seed {seed}: {aborted} aborted attempts, {multi} multi-pass txgs");
}

#[test]
fn sync_attempts_undo_and_passes() {
    match std::env::var("OBJSET_ATTEMPT_SEED") {
        Ok(s) => run_attempts(s.parse().expect("OBJSET_ATTEMPT_SEED is a number"), 60),
        Err(_) => (0..8).for_each(|s| run_attempts(s, 60)),
    }
}
