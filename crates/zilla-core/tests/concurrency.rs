//! Many writers doing partial-block writes into the *same* blocks while txgs sync
//! underneath: every thread owns a 512-byte lane of each 4 KiB block, so a lost update
//! (a read-modify-write racing a sync or another writer) shows up as a wrong lane.
mod common;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use rand::{Rng, SeedableRng};

const THREADS: usize = 8;
const LANE: usize = 512;
const BS: usize = 4096;

#[test]
fn partial_writes_into_shared_blocks_lose_nothing() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 << 20);
    let pool = create(&devs, two_mirrors());
    let volsize: u64 = 2 << 20;
    pool.volume_create("vol", volsize, BS as u32, &[]).unwrap();
    let vol = pool.open_volume("vol").unwrap();
    let nblocks = volsize as usize / BS;
    let stop = Arc::new(AtomicBool::new(false));
    // a syncer forcing txgs to turn over constantly
    let syncer = {
        let pool = pool.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                pool.sync().unwrap();
            }
        })
    };
    let seed: u64 = rand::random();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let vol = vol.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ t as u64);
                let mut mine = vec![vec![0u8; LANE]; nblocks];
                for i in 0..20000 {
                    let blk = rng.gen_range(0..nblocks);
                    let data = pattern(rng.gen(), LANE);
                    let off = (blk * BS + t * LANE) as u64;
                    if i % 7 == 0 {
                        vol.write_zeroes(off, LANE as u64).unwrap();
                        mine[blk].fill(0);
                    } else {
                        vol.write(off, &data, false).unwrap();
                        mine[blk].copy_from_slice(&data);
                    }
                    if i % 50 == 0 {
                        let mut back = vec![0u8; LANE];
                        vol.read(off, &mut back).unwrap();
                        assert_eq!(back, mine[blk], "thread {t} block {blk}: own lane changed under it (seed {seed})");
                    }
                }
                mine
            })
        })
        .collect();
    let lanes: Vec<Vec<Vec<u8>>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    syncer.join().unwrap();
    let check = |vol: &dyn zilla_core::zvol::BlockVolume, when: &str| {
        let mut all = vec![0u8; volsize as usize];
        vol.read(0, &mut all).unwrap();
        for blk in 0..nblocks {
            for (t, lane) in lanes.iter().enumerate() {
                let off = blk * BS + t * LANE;
                assert_eq!(&all[off..off + LANE], &lane[blk][..], "{when}: thread {t} block {blk} lost an update (seed {seed})");
            }
        }
    };
    check(&*vol, "live");
    drop(vol);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    check(&*pool.open_volume("vol").unwrap(), "after import");
    pool.check_space_accounting().unwrap();
    pool.export().unwrap();
}
