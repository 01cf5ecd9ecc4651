//! Background destroy tests: an objset of many objects with multi-level trees is
//! destroyed through the queue in steps of random budgets, the entry written and read
//! back between steps; every block is freed exactly once (the block store refuses a
//! second free and a read of a freed block), no step frees more than its budget, and
//! nothing is left (replayable: `DESTROY_SEED=N`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dmu::object_tree::tests::MemBlocks;
use crate::dmu::objset::ObjsetType;

fn block(stamp: u64) -> Arc<AlignedBuf> {
    let mut d = vec![0u8; 4096];
    d[..8].copy_from_slice(&stamp.to_le_bytes());
    Arc::new(AlignedBuf::from(&d[..]))
}

/// An objset with `objects` objects (some spanning levels), synced; its root.
fn objset_of(io: &MemBlocks, rng: &mut StdRng, objects: u64) -> BlockPointer {
    io.set_txg(1);
    let os = Objset::create(ObjsetType::Volume, Txg(1));
    for _ in 0..objects {
        let mut spec = ObjectSpec::metadata(ObjectType::Bytes, 4096);
        spec.indblkshift = 12;
        let o = os.allocate(io, Txg(1), &spec).unwrap();
        for _ in 0..rng.gen_range(0..12) {
            let blkid = if rng.gen_bool(0.7) { rng.gen_range(0..40) } else { rng.gen_range(0..20_000) };
            os.write_block(io, Txg(1), o, blkid, Some(block(o << 32 | blkid))).unwrap();
        }
    }
    os.sync(io, Txg(1)).unwrap().unwrap().bp
}

fn run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = MemBlocks::new();
    let n = rng.gen_range(1..120);
    let root = objset_of(&io, &mut rng, n);
    let live = io.live.lock().len();
    assert!(live > 10, "seed {seed}: a tree worth destroying");
    // the queue lives in another objset (the MOS) on another block store
    let mos_io = MemBlocks::new();
    let mos = Objset::create(ObjsetType::Mos, Txg(1));
    let q = DestroyQueue::create(&mos, &mos_io, Txg(1)).unwrap();
    q.push(Txg(1), &DestroyEntry::new(root, 1 << 30)).unwrap();
    let mut steps = 0;
    loop {
        let budget = rng.gen_range(1..20);
        let before = io.live.lock().len() as u64;
        let (freed, done) = q.step(&io, Txg(2 + steps), budget).unwrap();
        let after = io.live.lock().len() as u64;
        assert_eq!(before - after, freed, "seed {seed}: one copy per block here");
        assert!(freed <= budget, "seed {seed}: step {steps} freed {freed} of a budget of {budget}");
        steps += 1;
        if done {
            break;
        }
        assert!(q.freeing_bytes().unwrap() > 0);
        assert!(steps < 10_000, "seed {seed}: the destroy does not finish");
    }
    assert_eq!(io.live.lock().len(), 0, "seed {seed}: blocks left after the destroy");
    assert_eq!(q.counts().unwrap(), (1, 1));
    assert_eq!(q.freeing_bytes().unwrap(), 0);
}

#[test]
fn destroys_in_bounded_steps_free_everything_once() {
    match std::env::var("DESTROY_SEED") {
        Ok(s) => run(s.parse().expect("DESTROY_SEED is a number")),
        Err(_) => (0..12).for_each(run),
    }
}

#[test]
fn entries_round_trip_and_refuse_crafted_bytes() {
    let io = MemBlocks::new();
    let mut rng = StdRng::seed_from_u64(1);
    let root = objset_of(&io, &mut rng, 3);
    let e = DestroyEntry { root, floor: Txg(0), bytes_left: 99, object: 7, blkid: 1234, level: 2, phase: Phase::MetaDnode };
    let b = e.encode();
    assert_eq!(DestroyEntry::decode(&b).unwrap(), e);
    let mut bad = b;
    bad[161] = 3;
    assert!(DestroyEntry::decode(&bad).unwrap_err().contains("phase"));
    let mut bad = b;
    bad[170] = 1;
    assert!(DestroyEntry::decode(&bad).is_err());
}
