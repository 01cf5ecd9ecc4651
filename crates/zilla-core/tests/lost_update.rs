//! The lost update of `concurrency::partial_writes_into_shared_blocks_lose_nothing`,
//! forced deterministically (its own test binary: the hook it installs is global).
//!
//! A block update takes its txg hold, then locks the block's dirty shard. If txg T
//! closes in between and a writer of T+1 dirties the same block first, the update
//! (built on the newest version, T+1's) used to be pushed as a T version *after* the
//! T+1 one: versions [T, T+1, T]. Readers take the last version (right), but the sync
//! of T collects the first T version (stale) and retires both, and a later T+1 write
//! makes [.., T+1, T+1] of which the sync of T+1 writes the first (stale): live reads
//! are right, the pool after export and import has lost lanes.
mod common;

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use common::*;
use parking_lot::Mutex;
use zilla_core::txg::TxgPhase;
use zilla_core::zvol::{test_hooks, BlockVolume};
use zilla_core::Txg;

const BS: usize = 4096;
const LANE: usize = 512;

/// Pause the first update of each of `blocks` right after it took its txg hold: the
/// receivers get the held txg, the senders let the update go on.
fn pause_first_update_of(blocks: &[u64]) -> (HashMap<u64, Receiver<Txg>>, HashMap<u64, Sender<()>>) {
    let mut paused = HashMap::new();
    let mut release = HashMap::new();
    let mut hooks: HashMap<u64, (Sender<Txg>, Receiver<()>)> = HashMap::new();
    for &b in blocks {
        let (ptx, prx) = channel();
        let (rtx, rrx) = channel();
        paused.insert(b, prx);
        release.insert(b, rtx);
        hooks.insert(b, (ptx, rrx));
    }
    let hooks = Mutex::new(hooks);
    test_hooks::set_after_hold(Some(Box::new(move |blkid, txg| {
        let Some((paused, release)) = hooks.lock().remove(&blkid.get()) else { return };
        paused.send(txg).unwrap();
        release.recv_timeout(Duration::from_secs(30)).expect("released");
    })));
    (paused, release)
}

fn lane_off(blk: u64, lane: usize) -> u64 {
    (blk as usize * BS + lane * LANE) as u64
}

fn check_block(vol: &dyn BlockVolume, blk: u64, lanes: &[u8], when: &str) {
    let mut got = vec![0u8; BS];
    vol.read(blk * BS as u64, &mut got).unwrap();
    for (l, chunk) in got.chunks(LANE).enumerate() {
        let want = lanes.get(l).copied().unwrap_or(0);
        assert!(chunk.iter().all(|&x| x == want), "{when}: block {blk} lane {l} holds {:#x}, wants {want:#x}", chunk[0]);
    }
}

#[test]
fn update_held_in_a_closed_txg_after_the_next_txg_dirtied_the_block_is_kept() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 64 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("vol", 1 << 20, BS as u32, &[]).unwrap();
    let vol = pool.open_volume("vol").unwrap();
    let (b, c) = (5u64, 9u64);
    // 1. lane 0 of B dirty in the open txg T: B's versions [T]
    vol.write(lane_off(b, 0), &[0x10; LANE], false).unwrap();
    // 2. the writers of lane 1 of B and of C hold T and pause before the shard lock
    let (paused, release) = pause_first_update_of(&[b, c]);
    let spawn_write = |blk: u64, x: u8| {
        let vol = vol.clone();
        std::thread::spawn(move || vol.write(lane_off(blk, 1), &[x; LANE], false).unwrap())
    };
    let w_b = spawn_write(b, 0x11);
    let w_c = spawn_write(c, 0x21);
    let t = paused[&b].recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(paused[&c].recv_timeout(Duration::from_secs(10)).unwrap(), t);
    // 3. a sync closes T (and opens T+1); it waits for the two holders of T
    let syncer = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.sync().unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.txg_history(8).iter().any(|r| r.txg == t && r.state == TxgPhase::Open) {
        assert!(Instant::now() < deadline, "txg {t} never closed");
        std::thread::sleep(Duration::from_millis(1));
    }
    // 4. a writer of T+1 dirties B: [T, T+1]
    vol.write(lane_off(b, 2), &[0x12; LANE], false).unwrap();
    // 5. B's writer of T goes on (without the fix: [T, T+1, T])
    release[&b].send(()).unwrap();
    w_b.join().unwrap();
    // 6. another writer of T+1 (without the fix: [T, T+1, T, T+1])
    vol.write(lane_off(b, 3), &[0x13; LANE], false).unwrap();
    let want_b = [0x10, 0x11, 0x12, 0x13];
    check_block(&*vol, b, &want_b, "live, T held");
    // 7. T syncs
    release[&c].send(()).unwrap();
    w_c.join().unwrap();
    syncer.join().unwrap();
    test_hooks::set_after_hold(None);
    check_block(&*vol, b, &want_b, "live, T synced");
    check_block(&*vol, c, &[0, 0x21], "live, T synced");
    // 8. the export syncs T+1
    drop(vol);
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let vol = pool.open_volume("vol").unwrap();
    check_block(&*vol, b, &want_b, "after import");
    check_block(&*vol, c, &[0, 0x21], "after import");
    drop(vol);
    pool.export().unwrap();
}
