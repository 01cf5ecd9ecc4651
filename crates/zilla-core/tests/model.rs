//! Model-based test: random operations on engine volumes, checked against MemVolume.
mod common;
use common::*;
use proptest::prelude::*;
use std::sync::Arc;
use zilla_core::memvol::MemVolume;
use zilla_core::zvol::BlockVolume;

#[derive(Debug, Clone)]
enum Op {
    Write { vol: usize, off: u64, len: u64, seed: u64, fua: bool },
    Unmap { vol: usize, off: u64, len: u64 },
    WriteZeroes { vol: usize, off: u64, len: u64 },
    Read { vol: usize, off: u64, len: u64 },
    Flush { vol: usize },
    BlockStatus { vol: usize, off: u64, len: u64 },
    Sync,
    ExportImport,
    /// Flush every volume, then lose the pool without an export (no final sync) and
    /// import it: what the flushes acknowledged comes back from the intent log's
    /// claim and replay, so the engine must still match the model exactly.
    CrashReplay,
}

/// (name, volsize, volblocksize)
const VOLS: [(&str, u64, u32); 2] = [("v4k", 2 << 20, 4096), ("v16k", 4 << 20, 16384)];

/// An (offset, length) in volume `vol`: mostly small unaligned, sometimes aligned
/// multi-block, sometimes touching the end.
fn range(vol: usize) -> impl Strategy<Value = (u64, u64)> {
    let size = VOLS[vol].1;
    let bs = VOLS[vol].2 as u64;
    prop_oneof![
        // unaligned, small (within/between blocks)
        (0..size, 1u64..(3 * bs)).prop_map(move |(o, l)| (o, l.min(size - o))),
        // aligned, multi-block
        (0..size / bs, 1u64..8).prop_map(move |(b, n)| (b * bs, (n * bs).min(size - b * bs))),
        // a hot spot so ops overlap
        (0u64..4 * bs, 1u64..(2 * bs)).prop_map(move |(o, l)| (o, l)),
        // the tail of the volume
        (1u64..(2 * bs)).prop_map(move |l| (size - l, l)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let vol_range = (0usize..2).prop_flat_map(|v| (Just(v), range(v)));
    prop_oneof![
        6 => (vol_range.clone(), any::<u64>(), prop::bool::weighted(0.1))
            .prop_map(|((vol, (off, len)), seed, fua)| Op::Write { vol, off, len, seed, fua }),
        2 => vol_range.clone().prop_map(|(vol, (off, len))| Op::Unmap { vol, off, len }),
        2 => vol_range.clone().prop_map(|(vol, (off, len))| Op::WriteZeroes { vol, off, len }),
        4 => vol_range.clone().prop_map(|(vol, (off, len))| Op::Read { vol, off, len }),
        1 => (0usize..2).prop_map(|vol| Op::Flush { vol }),
        2 => vol_range.prop_map(|(vol, (off, len))| Op::BlockStatus { vol, off, len }),
        1 => Just(Op::Sync),
        1 => Just(Op::ExportImport),
        1 => Just(Op::CrashReplay),
    ]
}

fn check_read(vols: &[Arc<dyn BlockVolume>], model: &[MemVolume], vol: usize, off: u64, len: u64, what: &str) {
    let mut a = vec![0u8; len as usize];
    let mut b = vec![0u8; len as usize];
    vols[vol].read(off, &mut a).expect("engine read");
    model[vol].read(off, &mut b).unwrap();
    if a != b {
        let first = a.iter().zip(&b).position(|(x, y)| x != y).unwrap();
        panic!("{what}: vol {} read {off}+{len} differs at byte {} (abs {})", VOLS[vol].0, first, off + first as u64);
    }
    // the front ends' non-blocking path must agree whenever it answers
    let mut c = vec![0xa5u8; len as usize];
    let shared_answers = vols[vol].try_read_cached_shared(off, len).is_some();
    if let Some(r) = vols[vol].try_read_cached(off, &mut c) {
        // a volume that says its shared path answers every cached read of this length
        // must not leave one to the copying path (the front end would skip it)
        assert!(shared_answers || !vols[vol].cached_reads_are_shared(len),
                "{what}: vol {} read {off}+{len}: the copying path answered, the shared one did not", VOLS[vol].0);
        r.expect("cached read");
        if c != b {
            let first = c.iter().zip(&b).position(|(x, y)| x != y).unwrap();
            panic!("{what}: vol {} cached read {off}+{len} differs at byte {}", VOLS[vol].0, first);
        }
    }
    // ... and so must the zero-copy path: its pieces, in order, are exactly the bytes
    if let Some(r) = vols[vol].try_read_cached_shared(off, len) {
        let pieces = r.expect("shared cached read");
        let d: Vec<u8> = pieces.iter().flat_map(|p| p.as_slice().iter().copied()).collect();
        if d != b {
            let first = d.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(d.len().min(b.len()));
            panic!("{what}: vol {} shared read {off}+{len} ({} bytes) differs at byte {first}", VOLS[vol].0, d.len());
        }
    }
}

fn check_block_status(vols: &[Arc<dyn BlockVolume>], model: &[MemVolume], vol: usize, off: u64, len: u64) {
    let ext = vols[vol].block_status(off, len).expect("block_status");
    let mut pos = off;
    for e in &ext {
        assert_eq!(e.offset, pos, "extents must be contiguous: {ext:?}");
        assert!(e.length > 0);
        if e.hole {
            let mut b = vec![0u8; e.length as usize];
            model[vol].read(e.offset, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == 0), "hole reported at {}+{} where the oracle has data", e.offset, e.length);
        }
        pos += e.length;
    }
    assert_eq!(pos, off + len, "extents must cover the range: {ext:?}");
    for w in ext.windows(2) {
        assert_ne!(w[0].hole, w[1].hole, "adjacent extents of one kind must be merged: {ext:?}");
    }
}

fn open_all(pool: &zilla_core::spa::Pool) -> Vec<Arc<dyn BlockVolume>> {
    VOLS.iter().map(|(n, _, _)| pool.open_volume(n).unwrap()).collect()
}

fn run(ops: Vec<Op>) {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 32 << 20);
    let mut pool = create(&devs, two_mirrors());
    for (n, s, b) in VOLS {
        // the 16K volume has logbias=throughput: its whole-block writes are written in
        // place at commit (WR_INDIRECT), so CrashReplay replays them through pointers
        let props: Vec<(String, String)> = if b == 16384 { vec![("logbias".into(), "throughput".into())] } else { vec![] };
        pool.volume_create(n, s, b, &props).unwrap();
    }
    let model: Vec<MemVolume> = VOLS.iter().map(|(n, s, b)| MemVolume::new(n, *s, *b)).collect();
    let mut vols = open_all(&pool);
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Write { vol, off, len, seed, fua } => {
                let data = pattern(seed, len as usize);
                vols[vol].write(off, &data, fua).unwrap();
                model[vol].write(off, &data, fua).unwrap();
            }
            Op::Unmap { vol, off, len } => {
                vols[vol].unmap(off, len).unwrap();
                model[vol].unmap(off, len).unwrap();
            }
            Op::WriteZeroes { vol, off, len } => {
                vols[vol].write_zeroes(off, len).unwrap();
                model[vol].write_zeroes(off, len).unwrap();
            }
            Op::Read { vol, off, len } => check_read(&vols, &model, vol, off, len, &format!("op {i}")),
            Op::Flush { vol } => vols[vol].flush().unwrap(),
            Op::BlockStatus { vol, off, len } => check_block_status(&vols, &model, vol, off, len),
            Op::Sync => pool.sync().unwrap(),
            Op::ExportImport => {
                drop(std::mem::take(&mut vols));
                pool.export().unwrap();
                drop(pool);
                pool = import(&devs);
                vols = open_all(&pool);
            }
            Op::CrashReplay => {
                for v in &vols {
                    v.flush().unwrap();
                }
                drop(std::mem::take(&mut vols));
                pool.abandon();
                drop(pool);
                pool = import(&devs);
                vols = open_all(&pool);
                for v in 0..VOLS.len() {
                    check_read(&vols, &model, v, 0, VOLS[v].1, &format!("op {i}: after replay"));
                }
            }
        }
    }
    // full compare, live and after a round trip
    for v in 0..VOLS.len() {
        check_read(&vols, &model, v, 0, VOLS[v].1, "final");
        check_block_status(&vols, &model, v, 0, VOLS[v].1);
    }
    drop(std::mem::take(&mut vols));
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    let vols = open_all(&pool);
    for v in 0..VOLS.len() {
        check_read(&vols, &model, v, 0, VOLS[v].1, "final after import");
        check_block_status(&vols, &model, v, 0, VOLS[v].1);
    }
    drop(vols);
    pool.export().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 200, ..ProptestConfig::default() })]
    #[test]
    fn engine_matches_memvolume(ops in prop::collection::vec(op(), 1..60)) {
        run(ops);
    }
}
