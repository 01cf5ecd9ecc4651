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
}

impl AllocIo {
    fn new(area: u64) -> AllocIo {
        let ms = Metaslabs::new();
        ms.add_vdev(VdevId(0), Role::Normal, area);
        ms.add_vdev(VdevId(1), Role::Normal, area);
        AllocIo { ms, txg: Mutex::new(Txg(1)), data: Mutex::new(HashMap::new()), fail_after: Mutex::new(None) }
    }
}

impl BlockIo for AllocIo {
    fn txg(&self) -> Txg {
        *self.txg.lock()
    }
    fn read(&self, bp: &BlockPointer) -> Result<Arc<AlignedBuf>> {
        Ok(self.data.lock().get(&(bp.dva[0].vdev.0, bp.dva[0].offset)).unwrap_or_else(|| panic!("read of a block not written: {bp:?}")).clone())
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
        self.data.lock().insert((dva[0].vdev.0, dva[0].offset), data);
        Ok(bp)
    }
    fn free(&self, bp: &BlockPointer) {
        if bp.birth == self.txg() {
            self.data.lock().remove(&(bp.dva[0].vdev.0, bp.dva[0].offset));
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
fn sync_txg(io: &AllocIo, mos: &PoolMos, txg: Txg, old_root: Option<BlockPointer>, mut fail: Option<u64>) -> BlockPointer {
    // T − 2's frees (and older ones a pin held): out of the defer lists, not yet
    // allocatable; freed in T's maps, reusable once T commits
    let released: Vec<Dva> = io.ms.take_released(txg.minus(2));
    for attempt_no in 0.. {
        assert!(attempt_no < 3, "txg {txg}: attempts keep failing");
        io.ms.begin_sync(txg);
        mos.sync_begin(txg);
        *io.fail_after.lock() = fail.take();
        let taken = io.ms.take_journal();
        let attempt = (|| -> Result<BlockPointer> {
            if let Some(r) = old_root {
                io.free(&r);
            }
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
                io.ms.restore_journal(taken);
            }
        }
    }
    unreachable!()
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
    let lists = reopened.deferred_frees(io, &[txg, txg.prev()], &mut |_| Ok(())).unwrap();
    let mut listed: Vec<Dva> = lists.into_iter().flat_map(|(_, d)| d).collect();
    let mut deferred: Vec<Dva> = [txg, txg.prev()].iter().flat_map(|t| io.ms.deferred_of(*t)).collect();
    listed.sort_by_key(|d| (d.vdev, d.offset));
    deferred.sort_by_key(|d| (d.vdev, d.offset));
    assert_eq!(listed, deferred, "{what}: the free lists of the newest two txgs vs the defer lists");
}

fn run(seed: u64, txgs: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = AllocIo::new(AREA);
    io.ms.set_journal(true);
    io.ms.begin_sync(Txg(1));
    let mos = PoolMos::create(&io, Txg(1), &tops(), NewDataset { creation_time_s: 1, objsetid: 1, guid: 7 }).unwrap();
    io.ms.end_sync(Txg(1));
    let mut root = sync_txg(&io, &mos, Txg(1), None, None);
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
