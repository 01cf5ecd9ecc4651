//! Format 2 MOS tests over a real allocator: every txg's space changes and frees are
//! recorded and the MOS synced in passes, some attempts failing and undone; after each
//! txg the MOS is reopened and what its space maps and free lists say is compared with
//! the allocator (replayable: `POOL_MOS_SEED=N` reruns one seed).

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::metaslab::Metaslabs;
use crate::vdev::Role;

/// Blocks in memory at the offsets a real allocator hands out, with the pool's rules:
/// a block born in the txg and freed in it goes at once, an older one is deferred.
struct AllocIo {
    ms: Metaslabs,
    txg: Mutex<Txg>,
    data: Mutex<HashMap<(u32, u64), Arc<AlignedBuf>>>,
    fail_after: Mutex<Option<u64>>,
    /// Blocks the attempt in progress wrote: gone if it is undone.
    attempt_writes: Mutex<Vec<(u32, u64)>>,
    /// Bytes written, every copy counted; and by (kind, level).
    bytes_written: Mutex<u64>,
    by_kind: Mutex<BTreeMap<(u8, u8), u64>>,
    sizes: Mutex<HashMap<(u32, u64), (u8, u8, u64)>>,
    /// Blocks may be crafted: a read of one never written is an error, not a bug.
    crafted: Mutex<bool>,
}

impl AllocIo {
    fn new(area: u64) -> AllocIo {
        let ms = Metaslabs::new();
        ms.add_vdev(VdevId(0), Role::Normal, area);
        ms.add_vdev(VdevId(1), Role::Normal, area);
        AllocIo { ms, txg: Mutex::new(Txg(1)), data: Mutex::new(HashMap::new()), fail_after: Mutex::new(None), attempt_writes: Mutex::new(Vec::new()), bytes_written: Mutex::new(0), by_kind: Mutex::new(BTreeMap::new()), sizes: Mutex::new(HashMap::new()), crafted: Mutex::new(false) }
    }
}

impl BlockIo for AllocIo {
    fn txg(&self) -> Txg {
        *self.txg.lock()
    }
    fn read(&self, bp: &BlockPointer) -> Result<Arc<AlignedBuf>> {
        match self.data.lock().get(&(bp.dva[0].vdev.0, bp.dva[0].offset)) {
            Some(b) => Ok(b.clone()),
            // a crafted pointer: what a device there holds fails its checksum
            None if *self.crafted.lock() => Err(Error::Checksum(format!("{bp:?}"))),
            None => panic!("read of a block not written: {bp:?}"),
        }
    }
    fn write(&self, data: Arc<AlignedBuf>, spec: BlockSpec) -> Result<BlockPointer> {
        if let Some(n) = self.fail_after.lock().as_mut() {
            if *n == 0 {
                return Err(Error::Io(std::io::Error::other("injected write failure")));
            }
            *n -= 1;
        }
        let asize = (data.len() as u32).div_ceil(512) * 512;
        let dvas = self.ms.alloc(Role::Normal, asize as u64, 2, Some(self.txg()))?;
        let mut dva = [Dva::default(); 3];
        dva[..dvas.len()].copy_from_slice(&dvas);
        let bp = BlockPointer { dva, lsize: data.len() as u32, psize: data.len() as u32, birth: self.txg(), fill: spec.fill, checksum_code: spec.checksum as u8, compression_code: 0, kind: spec.kind, level: spec.level, checksum: [0; 32] };
        let compressed = lz4_flex::compress(&data).len() as u64;
        self.data.lock().insert((dva[0].vdev.0, dva[0].offset), data);
        self.attempt_writes.lock().push((dva[0].vdev.0, dva[0].offset));
        // what reaches the devices: metadata is lz4-compressed, in 512-byte units
        let psize = if spec.kind == crate::block::blkptr::KIND_DATA { asize as u64 } else { compressed.div_ceil(512) * 512 };
        let bytes = psize.min(asize as u64) * dvas.len() as u64;
        *self.bytes_written.lock() += bytes;
        *self.by_kind.lock().entry((spec.kind, spec.level)).or_default() += bytes;
        self.sizes.lock().insert((dva[0].vdev.0, dva[0].offset), (spec.kind, spec.level, bytes));
        Ok(bp)
    }
    fn free(&self, bp: &BlockPointer) {
        if bp.birth == self.txg() {
            self.data.lock().remove(&(bp.dva[0].vdev.0, bp.dva[0].offset));
            // its write never leaves the batch (pool_block_io.rs): it costs nothing
            if let Some((kind, level, bytes)) = self.sizes.lock().remove(&(bp.dva[0].vdev.0, bp.dva[0].offset)) {
                *self.bytes_written.lock() -= bytes;
                *self.by_kind.lock().entry((kind, level)).or_default() -= bytes;
            }
            bp.copies().for_each(|d| self.ms.free_unused(d));
        } else {
            bp.copies().for_each(|d| self.ms.free_deferred(self.txg(), *d));
        }
    }
}

const AREA: u64 = 100 << 20;

fn tops() -> Vec<TopSpace> {
    vec![TopSpace { id: VdevId(0), guid: Guid(0xa1), area_bytes: AREA }, TopSpace { id: VdevId(1), guid: Guid(0xb2), area_bytes: AREA }]
}

/// One txg's sync as spa does it, attempts retried; the new MOS root.
fn sync_txg(io: &AllocIo, mos: &PoolMos, txg: Txg, old_root: Option<BlockPointer>, fail: Option<u64>) -> BlockPointer {
    sync_txg_with(io, mos, txg, old_root, fail, &|_| Ok(()))
}

/// As [`sync_txg`], with `data` run first in every attempt (the volumes' data pass).
fn sync_txg_with(io: &AllocIo, mos: &PoolMos, txg: Txg, old_root: Option<BlockPointer>, mut fail: Option<u64>, data: &dyn Fn(&AllocIo) -> Result<()>) -> BlockPointer {
    // T − 2's frees (and older ones a pin held): out of the defer lists, not yet
    // allocatable; freed in T's maps, reusable once T commits
    let released: Vec<Dva> = io.ms.take_released(txg.minus(2));
    for attempt_no in 0.. {
        assert!(attempt_no < 3, "txg {txg}: attempts keep failing");
        io.ms.begin_sync(txg);
        mos.sync_begin(txg);
        *io.fail_after.lock() = fail.take();
        io.attempt_writes.lock().clear();
        let mut taken = Vec::new();
        let attempt = (|| -> Result<BlockPointer> {
            if let Some(r) = old_root {
                io.free(&r);
            }
            data(io)?;
            mos.sync_datasets(io, txg)?;
            taken = io.ms.take_journal();
            let net = crate::space_map::net_journal(&taken).map_err(Error::Corrupt)?;
            mos.record_space(io, txg, &net, &released)?;
            mos.append_frees(io, txg, &io.ms.deferred_of(txg))?;
            Ok(mos.sync(io, txg)?.expect("the MOS is dirty every txg here"))
        })();
        *io.fail_after.lock() = None;
        match attempt {
            Ok(root) => {
                mos.sync_end(txg);
                io.ms.end_sync(txg);
                io.ms.free_released(&released);
                return root;
            }
            Err(e) => {
                assert!(attempt_no == 0, "txg {txg}: a retry failed: {e}");
                mos.sync_abort(txg);
                io.ms.undo_sync(txg);
                for k in io.attempt_writes.lock().drain(..) {
                    io.data.lock().remove(&k);
                }
                io.ms.restore_journal(taken);
            }
        }
    }
    unreachable!()
}

/// A new pool's MOS over a journaling allocator, its first txg synced.
fn new_pool() -> (AllocIo, PoolMos, BlockPointer) {
    let io = AllocIo::new(AREA);
    io.ms.set_journal(true);
    io.ms.begin_sync(Txg(1));
    let mos = PoolMos::create(&io, Txg(1), &tops(), NewDataset { creation_time_s: 1, objsetid: 1, guid: 7 }).unwrap();
    io.ms.end_sync(Txg(1));
    let root = sync_txg(&io, &mos, Txg(1), None, None);
    (io, mos, root)
}

/// What the maps and lists say must be what the allocator holds.
fn check_space(io: &AllocIo, root: &BlockPointer, txg: Txg, what: &str) {
    let reopened = PoolMos::open(io, root, &tops()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let born = reopened.blocks_born_in(io, root, txg).unwrap();
    for t in tops() {
        let mut maps = Segments::default();
        reopened.allocated(t.id).into_iter().for_each(|(a, l)| maps.add(a, l).unwrap());
        // the MOS blocks of this txg are recorded by the next one
        for d in born.iter().filter(|d| d.vdev == t.id) {
            maps.add(d.offset, d.asize as u64).unwrap_or_else(|e| panic!("{what}: a block born in txg {txg} is in the maps already: {e}"));
        }
        let mut alloc = Segments::default();
        io.ms.extents().get(&t.id).into_iter().flatten().for_each(|(a, l)| alloc.add(*a, *l).unwrap());
        assert_eq!(maps, alloc, "{what}: vdev {} maps + the txg's MOS blocks vs the allocator", t.id);
    }
    // an import builds the same allocator from the MOS alone
    let fresh = Metaslabs::new();
    fresh.add_vdev(VdevId(0), Role::Normal, AREA);
    fresh.add_vdev(VdevId(1), Role::Normal, AREA);
    reopened.load_allocator(io, root, txg, &fresh).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(fresh.extents(), io.ms.extents(), "{what}: the imported allocator");
    let mut imported = fresh.deferred();
    let mut now: Vec<Dva> = [txg, txg.prev()].iter().flat_map(|t| io.ms.deferred_of(*t)).collect();
    imported.sort_by_key(|d| (d.vdev, d.offset));
    now.sort_by_key(|d| (d.vdev, d.offset));
    assert_eq!(imported, now, "{what}: the imported defer lists");
    let lists = reopened.deferred_frees(io, &[txg, txg.prev()], &mut |_| Ok(())).unwrap();
    let mut listed: Vec<Dva> = lists.into_iter().flat_map(|(_, d)| d).collect();
    let mut deferred: Vec<Dva> = [txg, txg.prev()].iter().flat_map(|t| io.ms.deferred_of(*t)).collect();
    listed.sort_by_key(|d| (d.vdev, d.offset));
    deferred.sort_by_key(|d| (d.vdev, d.offset));
    assert_eq!(listed, deferred, "{what}: the free lists of the newest two txgs vs the defer lists");
}

fn run(seed: u64, txgs: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (io, mos, mut root) = new_pool();
    check_space(&io, &root, Txg(1), &format!("seed {seed} txg 1"));
    let mut live: Vec<Dva> = Vec::new();
    let mut aborted = 0;
    for t in 2..2 + txgs {
        let txg = Txg(t);
        *io.txg.lock() = txg;
        // open context: blocks allocated and freed, as data and log blocks are
        for _ in 0..rng.gen_range(0..40) {
            if rng.gen_bool(0.6) || live.is_empty() {
                live.extend(io.ms.alloc(Role::Normal, 512 * rng.gen_range(1..64u64), 1, None).unwrap());
            } else {
                let d = live.swap_remove(rng.gen_range(0..live.len()));
                if rng.gen_bool(0.5) { io.ms.free_now(&d) } else { io.ms.free_deferred(txg, d) }
            }
        }
        let fail = rng.gen_bool(0.25).then(|| rng.gen_range(0..6));
        aborted += fail.is_some() as u32;
        root = sync_txg(&io, &mos, txg, Some(root), fail);
        if t % 3 == 0 || t == 1 + txgs {
            check_space(&io, &root, txg, &format!("seed {seed} txg {t}"));
        }
    }
    assert!(aborted > 0, "seed {seed}: no attempt failed");
}

#[test]
fn mos_space_accounting_model() {
    match std::env::var("POOL_MOS_SEED") {
        Ok(s) => run(s.parse().expect("POOL_MOS_SEED is a number"), 80),
        Err(_) => (0..4).for_each(|s| run(s, 80)),
    }
}

#[test]
fn volumes_are_datasets_whose_objsets_adopt_their_trees() {
    use crate::dmu::object_tree::{self, Tree};
    let (io, mos, mut root) = new_pool();
    *io.txg.lock() = Txg(2);
    let top = mos.dir.root_dataset;
    let d0 = mos.create_volume(&io, Txg(2), top, "disk0", 1 << 20, 16384, 100, 11).unwrap();
    let (vm, _) = DslTree { mos: &mos.os, io: &io }.create_child(Txg(2), top, "vm", &NewDataset { creation_time_s: 100, objsetid: 99, guid: 12 }).unwrap();
    let d1 = mos.create_volume(&io, Txg(2), vm, "disk1", 64 << 20, 16384, 100, 13).unwrap();
    assert_eq!((d0.path.as_str(), d1.path.as_str()), ("disk0", "vm/disk1"));
    root = sync_txg(&io, &mos, Txg(2), Some(root), Some(3));
    // txg 3: the volume path writes block 3000 of disk1 (a two-level tree) and sets a log
    *io.txg.lock() = Txg(3);
    let tree_root = Mutex::new(None);
    let data_pass = |io: &AllocIo| -> Result<()> {
        let d = mos.dataset_objset(io, d1.dataset)?.dnode(io, VOLUME_DATA_OBJECT)?.phys().unwrap();
        let shape = d.shape();
        let bp = io.write(Arc::new(AlignedBuf::from(&vec![7u8; 16384][..])), BlockSpec { kind: shape.data_kind, level: 0, fill: 1, checksum: crate::block::checksum::ChecksumAlgo::Fletcher4, compression: crate::block::compress::Compression::Off })?;
        let a = object_tree::apply(io, &Tree { shape, nlevels: d.nlevels, roots: &d.blkptr }, &[(3000, bp)])?;
        mos.set_volume_tree(io, Txg(3), d1.dataset, a.nlevels, a.roots[0], a.used_delta as u64, (64 << 20) / 16384)?;
        *tree_root.lock() = Some((a.nlevels, a.roots[0]));
        Ok(())
    };
    mos.set_zil_header(&io, Txg(3), d0.dataset, [5; 40]).unwrap();
    root = sync_txg_with(&io, &mos, Txg(3), Some(root), Some(3), &data_pass);
    check_space(&io, &root, Txg(3), "after the volume writes");
    let reopened = PoolMos::open(&io, &root, &tops()).unwrap();
    let vols = reopened.volumes(&io).unwrap();
    assert_eq!(vols.iter().map(|v| v.path.as_str()).collect::<Vec<_>>(), ["disk0", "vm/disk1"]);
    let (nlevels, bp) = tree_root.lock().unwrap();
    assert_eq!((vols[1].nlevels, vols[1].root, vols[1].volsize, vols[1].volblocksize), (nlevels, bp, 64 << 20, 16384));
    assert!(nlevels >= 2, "block 3000 needs an indirect level");
    assert_eq!((vols[0].zil_header, vols[0].root.is_hole()), ([5; 40], true));
    assert_eq!(vols[1].zil_header, [0; 40]);
}

#[test]
fn pool_properties_and_leaf_health_write_what_changed() {
    let io = AllocIo::new(AREA);
    io.ms.begin_sync(Txg(1));
    let mos = PoolMos::create(&io, Txg(1), &tops(), NewDataset { creation_time_s: 1, objsetid: 1, guid: 7 }).unwrap();
    let props: BTreeMap<String, String> = [("autotrim", "on"), ("failmode", "wait")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    mos.set_pool_props(&io, Txg(1), &props).unwrap();
    let mut health = BTreeMap::new();
    health.insert(Guid(5), (false, vec![(Txg(3), Txg(9)), (Txg(12), Txg(12))]));
    health.insert(Guid(6), (true, vec![]));
    health.insert(Guid(7), (false, vec![]));
    mos.set_leaf_health(&io, Txg(1), &health).unwrap();
    let root = mos.sync(&io, Txg(1)).unwrap().unwrap();
    io.ms.end_sync(Txg(1));
    let m = PoolMos::open(&io, &root, &tops()).unwrap();
    assert_eq!(m.pool_props(&io).unwrap(), props);
    assert_eq!(m.history(&io).phys().unwrap().ring_bytes, 2 * AREA / 100 / (16 << 10) * (16 << 10), "1 % of the pool");
    assert_eq!(m.leaf_health(&io).unwrap(), health, "every leaf has an entry, a clean one too");
    assert_eq!(m.scan(&io).unwrap(), None);
    let mut w = [0u64; volumes::SCAN_RECORD_WORDS];
    (w[0], w[1], w[4], w[14]) = (1, 4, 12345, 9);
    *io.txg.lock() = Txg(2);
    m.set_scan(&io, Txg(2), &w, b"tail").unwrap();
    assert_eq!(m.scan(&io).unwrap(), Some((w, b"tail".to_vec())));
    w[1] = 5;
    assert!(m.set_scan(&io, Txg(2), &w, &[]).is_err(), "state 5 is refused");
    assert!(m.set_scan(&io, Txg(2), &[0; 20], &vec![0; volumes::SCAN_TAIL_MAX_BYTES + 1]).is_err(), "a tail beyond its bound");
    io.ms.begin_sync(Txg(2));
    let root = m.sync(&io, Txg(2)).unwrap().unwrap();
    io.ms.end_sync(Txg(2));
    let m = PoolMos::open(&io, &root, &tops()).unwrap();
    w[1] = 4;
    assert_eq!(m.scan(&io).unwrap(), Some((w, b"tail".to_vec())), "the scan record after a reopen");
    *io.txg.lock() = Txg(3);
    // a txg that changes nothing writes nothing
    m.set_pool_props(&io, Txg(3), &props).unwrap();
    m.set_leaf_health(&io, Txg(3), &health).unwrap();
    m.set_scan(&io, Txg(3), &w, b"tail").unwrap();
    assert!(!m.os.is_dirty(Txg(3)));
    health.insert(Guid(5), (false, vec![]));
    health.remove(&Guid(7));
    m.set_leaf_health(&io, Txg(3), &health).unwrap();
    assert_eq!(m.leaf_health(&io).unwrap(), health, "a repaired leaf's entry is clean, a detached leaf's goes");
    for bad in [vec![2u8, 0], vec![0, 1, 0], vec![0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]] {
        assert!(volumes::decode_leaf_health(&bad).is_err(), "{bad:?}");
    }
}

/// Metadata bytes one txg writes when it changes one volume's tree, in a pool of
/// `volumes` volumes.
fn metadata_bytes_for_one_change(volumes: usize) -> u64 {
    let (io, mos, mut root) = new_pool();
    *io.txg.lock() = Txg(2);
    let vols: Vec<VolumeInfo> = (0..volumes).map(|i| mos.create_volume(&io, Txg(2), mos.dir.root_dataset, &format!("vol{i}"), 1 << 30, 16384, 1, 100 + i as u64).unwrap()).collect();
    root = sync_txg(&io, &mos, Txg(2), Some(root), None);
    // settle: txg 3 and 4 append what txg 2 left (its MOS blocks, its frees)
    for t in 3..=4 {
        *io.txg.lock() = Txg(t);
        root = sync_txg(&io, &mos, Txg(t), Some(root), None);
    }
    let target = &vols[volumes / 2];
    let mut cost = 0;
    for t in 5..=8u64 {
        *io.txg.lock() = Txg(t);
        let before = *io.bytes_written.lock();
        io.by_kind.lock().clear();
        let data = |io: &AllocIo| -> Result<()> {
            // one 16 KiB data block rewritten (the volume path's write, not counted below)
            let bp = io.write(Arc::new(AlignedBuf::from(&vec![t as u8; 16384][..])), BlockSpec { kind: crate::block::blkptr::KIND_DATA, level: 0, fill: 1, checksum: crate::block::checksum::ChecksumAlgo::Fletcher4, compression: crate::block::compress::Compression::Off })?;
            mos.set_volume_tree(io, Txg(t), target.dataset, 1, bp, 16384, 1)
        };
        root = sync_txg_with(&io, &mos, Txg(t), Some(root), None, &data);
        cost = *io.bytes_written.lock() - before - 16384 * 2;
    }
    cost
}

#[test]
fn a_txg_writes_metadata_for_what_it_changed_not_for_the_pool() {
    // bytes as they reach the devices: lz4-compressed metadata, the superseded writes
    // of earlier passes never issued
    let one = metadata_bytes_for_one_change(1);
    let some = metadata_bytes_for_one_change(300);
    let many = metadata_bytes_for_one_change(2000);
    eprintln!("metadata bytes of a one-block txg: {one} with 1 volume, {some} with 300, {many} with 2000");
    // 300 and 2000 volumes both fill their dnode blocks (one volume's are almost empty
    // and compress to nothing); what grows is the MOS meta-dnode's tree, one 4 KiB
    // indirect level deeper at 2000 (two copies, compressed)
    assert!(many as f64 <= some as f64 * 1.35, "{many} bytes with 2000 volumes vs {some} with 300");
}

/// The history ring against a model: the pinned creation record stays, the oldest of
/// the rest go to make room, and a txg writes only the blocks its records land in.
#[test]
fn history_ring_keeps_the_creation_record_and_drops_the_oldest() {
    use crate::dmu::object_tree::tests::MemBlocks;
    let mut rng = StdRng::seed_from_u64(3);
    let io = MemBlocks::new();
    io.set_txg(1);
    let mut os = Objset::create(ObjsetType::Mos, Txg(1));
    let ring = HistoryRing::create(&os, &io, Txg(1), history_ring_bytes(1 << 20)).unwrap().object;
    assert_eq!(history_ring_bytes(1 << 20), 128 << 10);
    assert_eq!(history_ring_bytes(1 << 50), 1 << 30);
    let mut bp = os.sync(&io, Txg(1)).unwrap().unwrap().bp;
    let creation = b"{\"cmd\":\"zilla pool create tank\"}".to_vec();
    let mut model: std::collections::VecDeque<Vec<u8>> = Default::default();
    let mut dropped = 0u64;
    for t in 2..200u64 {
        io.set_txg(t);
        let r = HistoryRing { mos: &os, io: &io, object: ring };
        let writes_before = io.writes.load(std::sync::atomic::Ordering::Relaxed);
        let n = if t == 2 { 1 } else { rng.gen_range(0..4) };
        for i in 0..n {
            let rec = if t == 2 && i == 0 { creation.clone() } else { format!("{{\"cmd\":\"{}\"}}", "x".repeat(rng.gen_range(1..3000))).into_bytes() };
            r.append(Txg(t), &rec, true).unwrap();
            if t > 2 || i > 0 {
                model.push_back(rec);
                let total = |m: &std::collections::VecDeque<Vec<u8>>| m.iter().map(|x| 4 + x.len() as u64).sum::<u64>();
                while total(&model) > (128 << 10) - (4 + creation.len() as u64) {
                    model.pop_front();
                    dropped += 1;
                }
            }
        }
        if let Some(s) = os.sync(&io, Txg(t)).unwrap() {
            io.free(&bp);
            bp = s.bp;
            let written = io.writes.load(std::sync::atomic::Ordering::Relaxed) - writes_before;
            assert!(written <= 12, "txg {t}: {written} blocks written for a few records");
        }
        if t % 5 == 0 {
            os = Objset::open(&io, &bp).unwrap();
        }
        let r = HistoryRing { mos: &os, io: &io, object: ring };
        let got = r.records().unwrap();
        if t >= 2 {
            assert_eq!(got[0], creation, "txg {t}: the creation record is pinned");
            assert_eq!(&got[1..], model.iter().cloned().collect::<Vec<_>>().as_slice(), "txg {t}");
            assert_eq!(r.phys().unwrap().dropped, dropped);
        }
    }
    assert!(dropped > 20, "the ring wrapped: {dropped} dropped");
    let mut bad = HistoryPhys { ring_bytes: 128 << 10, begin: 10, end: 5, pinned: 0, dropped: 0 }.encode();
    assert!(HistoryPhys::decode(&bad, 1 << 30).is_err(), "end before begin");
    bad = HistoryPhys { ring_bytes: 100, begin: 0, end: 0, pinned: 0, dropped: 0 }.encode();
    assert!(HistoryPhys::decode(&bad, 1 << 30).is_err(), "a ring of 100 bytes");
}

/// A crafted image: bytes of the MOS's blocks flipped (past any checksum, which this
/// block store does not keep). Opening and reading it gives errors, never a panic.
#[test]
fn a_crafted_mos_is_an_error_not_a_panic() {
    let (io, mos, mut root) = new_pool();
    *io.txg.lock() = Txg(2);
    for i in 0..40 {
        mos.create_volume(&io, Txg(2), mos.dir.root_dataset, &format!("v{i}"), 1 << 30, 16384, 1, 100 + i).unwrap();
    }
    mos.history(&io).append(Txg(2), b"{\"cmd\":\"zilla pool create tank\"}", true).unwrap();
    root = sync_txg(&io, &mos, Txg(2), Some(root), None);
    *io.crafted.lock() = true;
    let pristine: Vec<((u32, u64), Arc<AlignedBuf>)> = io.data.lock().iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut rng = StdRng::seed_from_u64(9);
    let mut errors = 0;
    for round in 0..300 {
        let (key, block) = &pristine[rng.gen_range(0..pristine.len())];
        let mut bytes = block.to_vec();
        for _ in 0..rng.gen_range(1..8) {
            let at = rng.gen_range(0..bytes.len());
            bytes[at] ^= 1 << rng.gen_range(0..8);
        }
        io.data.lock().insert(*key, Arc::new(AlignedBuf::from(&bytes[..])));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
            let m = PoolMos::open(&io, &root, &tops())?;
            m.volumes(&io)?;
            m.history(&io).records()?;
            m.leaf_health(&io)?;
            m.pool_props(&io)?;
            m.scan(&io)?;
            let fresh = Metaslabs::new();
            fresh.add_vdev(VdevId(0), Role::Normal, AREA);
            fresh.add_vdev(VdevId(1), Role::Normal, AREA);
            m.load_allocator(&io, &root, Txg(2), &fresh)
        }));
        match r {
            Ok(Err(_)) => errors += 1,
            Ok(Ok(())) => {}
            Err(p) => {
                let why = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                panic!("round {round}: a crafted block of {key:?} panicked: {why:?}")
            }
        }
        io.data.lock().insert(*key, block.clone());
    }
    assert!(errors > 50, "{errors} of 300 crafted images were refused");
}
