//! Space map tests: the entry and bonus byte maps; the checks a crafted map trips; and a
//! model of a metaslab's allocations and frees over many txgs against the map synced,
//! reopened and loaded as it goes, condensing included (replayable:
//! `SPACE_MAP_SEED=N` reruns one seed).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dmu::object_tree::tests::MemBlocks;
use crate::dmu::objset::ObjsetType;

#[test]
fn entries_round_trip_and_refuse_crafted_words() {
    for e in [Entry::Txg(Txg(7)), Entry::Alloc { offset: 4096, len: 512 }, Entry::Free { offset: 1 << 40, len: MAX_RUN_UNITS * UNIT }] {
        assert_eq!(Entry::decode(&e.encode()).unwrap(), e);
    }
    let b = Entry::Free { offset: 512, len: 1024 }.encode();
    assert_eq!(u64::from_le_bytes(b[8..].try_into().unwrap()), (1 << 62) | 2, "freed bit 62, length in units");
    let mut bad = b;
    bad[14] = 1; // bit 48 of word 1: reserved
    assert!(Entry::decode(&bad).unwrap_err().contains("reserved"));
    let mut bad = b;
    bad[8..].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(Entry::decode(&bad).unwrap_err().contains("length 0"));
    let mut bad = b;
    bad[0] = 1;
    assert!(Entry::decode(&bad).unwrap_err().contains("multiple"));
    let mut marker = Entry::Txg(Txg(1)).encode();
    marker[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(Entry::decode(&marker).unwrap_err().contains("txg limit"));
    let mut bad = b;
    bad[15] |= 0x80;
    assert!(Entry::decode(&bad).is_err(), "bit 63 with other bits is neither a marker nor an extent");
}

#[test]
fn replay_refuses_what_cannot_happen() {
    let ms = MetaslabRange { start: 1 << 20, size: 1 << 20 };
    let run = |es: &[Entry]| {
        let bytes: Vec<u8> = es.iter().flat_map(|e| e.encode()).collect();
        replay(&bytes, ms, &mut Segments::default(), &mut Txg(0))
    };
    let a = |o: u64, l: u64| Entry::Alloc { offset: (1 << 20) + o, len: l };
    let f = |o: u64, l: u64| Entry::Free { offset: (1 << 20) + o, len: l };
    run(&[Entry::Txg(Txg(3)), a(0, 4096), Entry::Txg(Txg(3)), f(512, 512), Entry::Txg(Txg(4)), a(512, 512)]).unwrap();
    assert!(run(&[a(0, 4096), a(1024, 512)]).unwrap_err().contains("entry 1"), "double allocation");
    assert!(run(&[a(0, 4096), f(4096, 512)]).unwrap_err().contains("not allocated"), "free of free space");
    assert!(run(&[a(0, 4096), f(3584, 1024)]).unwrap_err().contains("not allocated"), "free running past a segment");
    assert!(run(&[Entry::Alloc { offset: 0, len: 512 }]).unwrap_err().contains("outside"));
    assert!(run(&[a((1 << 20) - 512, 1024)]).unwrap_err().contains("outside"));
    assert!(run(&[Entry::Txg(Txg(5)), Entry::Txg(Txg(4))]).unwrap_err().contains("txg 4 after txg 5"));
}

#[test]
fn segments_merge_and_split() {
    let mut s = Segments::default();
    s.add(0, 512).unwrap();
    s.add(1024, 512).unwrap();
    s.add(512, 512).unwrap();
    assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 1536)]);
    s.remove(512, 512).unwrap();
    assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 512), (1024, 512)]);
    assert_eq!(s.bytes(), 1024);
    assert!(s.add(256, 512).is_err());
    assert!(s.remove(0, 1024).is_err());
    assert_eq!(s.free_histogram(0, 8192), {
        let mut h = [0; HISTOGRAM_BUCKETS];
        h[0] = 1; // [512, 1024): one unit
        h[3] = 1; // [1536, 8192): 13 units
        h
    });
}

#[test]
fn metaslab_layout_covers_the_whole_area() {
    assert_eq!(ms_shift_for(64 << 20), MS_SHIFT_MIN);
    assert_eq!(ms_shift_for(1 << 40), 32, "about 200 metaslabs of 4 GiB in 1 TiB");
    assert_eq!(ms_shift_for(u64::MAX), MS_SHIFT_MAX);
    let area = (100 << 20) + 4096;
    let a = MetaslabArrayPhys::for_area(area);
    assert_eq!((a.ms_shift, a.count), (24, 7));
    assert_eq!(a.range(6, area), MetaslabRange { start: 6 << 24, size: area - (6 << 24) }, "the last one is partial");
    assert_eq!(MetaslabArrayPhys::decode(&a.encode(), area).unwrap(), a);
    assert!(MetaslabArrayPhys::decode(&a.encode(), area + (16 << 20)).unwrap_err().contains("needs 8"));
    let mut bad = a.encode();
    bad[0] = 40;
    assert!(MetaslabArrayPhys::decode(&bad, area).unwrap_err().contains("ms_shift"));
    let parts: Vec<_> = a.split((1 << 24) - 512, 1024).collect();
    assert_eq!(parts, vec![(0, (1 << 24) - 512, 512), (1, 1 << 24, 512)]);
}

/// A metaslab's history of allocations and frees, kept in a model and in a space map
/// synced every txg; reopened from its objset and loaded every few txgs.
fn model_run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = MemBlocks::new();
    let ms = MetaslabRange { start: 16 << 20, size: 16 << 20 };
    io.set_txg(1);
    let mut mos = Objset::create(ObjsetType::Mos, Txg(1));
    let sm = SpaceMap::create(&mos, &io, Txg(1)).unwrap().object;
    let mut os_bp = mos.sync(&io, Txg(1)).unwrap().unwrap().bp;
    let mut model = Segments::default();
    let (mut condensed, mut appended) = (0, 0);
    for txg in 2..400u64 {
        io.set_txg(txg);
        let before = model.clone();
        for _ in 0..rng.gen_range(0..40) {
            let len = UNIT * rng.gen_range(1..64u64);
            let at = ms.start + UNIT * rng.gen_range(0..(ms.size - len) / UNIT);
            if rng.gen_bool(0.55) {
                let _ = model.add(at, len);
            } else if let Some((s, l)) = {
                let i = rng.gen_range(0..model.len().max(1));
                let hit = model.iter().nth(i);
                hit
            } {
                let cut = UNIT * rng.gen_range(0..l / UNIT);
                let len = (l - cut).min(len);
                model.remove(s + cut, len).unwrap();
            }
        }
        let delta = TxgDelta::between(&before, &model);
        let mut check = before.clone();
        delta.allocs.iter().for_each(|(s, l)| check.add(*s, *l).unwrap());
        delta.frees.iter().for_each(|(s, l)| check.remove(*s, *l).unwrap());
        assert_eq!(check, model, "the net delta applies");
        let map = SpaceMap { mos: &mos, io: &io, object: sm };
        if map.sync_txg(Txg(txg), &delta, &model, ms).unwrap() {
            condensed += 1;
        } else {
            appended += 1;
        }
        if let Some(s) = mos.sync(&io, Txg(txg)).unwrap() {
            os_bp = s.bp;
        }
        if rng.gen_bool(0.1) {
            mos = Objset::open(&io, &os_bp).unwrap();
        }
        let map = SpaceMap { mos: &mos, io: &io, object: sm };
        if txg % 7 == 0 {
            assert_eq!(map.load(ms).unwrap(), model, "seed {seed} txg {txg}");
            let p = map.phys().unwrap();
            assert_eq!(p.histogram, model.free_histogram(ms.start, ms.start + ms.size));
            assert!(p.length_bytes <= CONDENSE_MIN_BYTES.max(2 * (model.len() as u64 + 1) * 16) + 41 * 16, "seed {seed} txg {txg}: map length {} is bounded", p.length_bytes);
        }
    }
    assert!(condensed > 0 && appended > condensed, "seed {seed}: {condensed} condensed, {appended} appended");
}

#[test]
fn space_map_model() {
    match std::env::var("SPACE_MAP_SEED") {
        Ok(s) => model_run(s.parse().expect("SPACE_MAP_SEED is a number")),
        Err(_) => (0..6).for_each(model_run),
    }
}

#[test]
fn crafted_map_is_refused_naming_the_entry() {
    let io = MemBlocks::new();
    let ms = MetaslabRange { start: 0, size: 16 << 20 };
    io.set_txg(1);
    let mos = Objset::create(ObjsetType::Mos, Txg(1));
    let map = SpaceMap::create(&mos, &io, Txg(1)).unwrap();
    let mut after = Segments::default();
    after.add(0, 8192).unwrap();
    map.sync_txg(Txg(1), &TxgDelta { allocs: vec![(0, 8192)], frees: vec![] }, &after, ms).unwrap();
    assert_eq!(map.load(ms).unwrap(), after);
    // a second allocation of the same extent, and a bonus that disagrees
    map.write_entries_at(Txg(1), 32, &Entry::Alloc { offset: 4096, len: 512 }.encode()).unwrap();
    map.set_phys(Txg(1), &SpaceMapPhys { length_bytes: 48, allocated_bytes: 8192, histogram: [0; HISTOGRAM_BUCKETS] }).unwrap();
    let e = map.load(ms).unwrap_err().to_string();
    assert!(e.contains("entry 2") && e.contains("already allocated"), "{e}");
    map.set_phys(Txg(1), &SpaceMapPhys { length_bytes: 32, allocated_bytes: 4096, histogram: [0; HISTOGRAM_BUCKETS] }).unwrap();
    assert!(map.load(ms).unwrap_err().to_string().contains("bonus says 4096"));
    map.set_phys(Txg(1), &SpaceMapPhys { length_bytes: 1 << 20, allocated_bytes: 8192, histogram: [0; HISTOGRAM_BUCKETS] }).unwrap();
    assert!(map.load(ms).unwrap_err().to_string().contains("beyond its blocks"));
}

#[test]
fn metaslab_array_entries() {
    let io = MemBlocks::new();
    io.set_txg(1);
    let mos = Objset::create(ObjsetType::Mos, Txg(1));
    let area = 1u64 << 40;
    let a = MetaslabArray::create(&mos, &io, Txg(1), area).unwrap();
    let p = a.phys(area).unwrap();
    assert_eq!(p.count, 256);
    a.set(Txg(1), 3, 77).unwrap();
    a.set(Txg(1), 255, 99).unwrap();
    let e = a.entries(p.count).unwrap();
    assert_eq!((e.len(), e[3], e[255], e.iter().filter(|x| **x != 0).count()), (256, 77, 99, 2));
    assert!(a.phys(area / 2).unwrap_err().to_string().contains("needs 128"));
}

#[test]
fn the_journal_nets_to_what_changed() {
    use crate::block::blkptr::Dva;
    use crate::VdevId;
    let d = |v: u32, o: u64, l: u32| Dva { vdev: VdevId(v), asize: l, offset: o };
    let j = vec![
        (d(0, 0, 4096), true),
        (d(0, 0, 4096), false), // allocated and freed within the cut: nothing
        (d(0, 8192, 1024), true),
        (d(1, 1 << 20, 512), false), // a free of space allocated before
        (d(1, 1 << 20, 512), true), // and allocated again: nothing
        (d(1, 4096, 512), false),
        (d(0, 7168, 1024), true), // next to the earlier one: one extent
    ];
    let net = net_journal(&j).unwrap();
    assert_eq!(net.len(), 2);
    assert_eq!(net[&VdevId(0)], TxgDelta { allocs: vec![(7168, 2048)], frees: vec![] });
    assert_eq!(net[&VdevId(1)], TxgDelta { allocs: vec![], frees: vec![(4096, 512)] });
    // an allocation half over freed space: the freed half comes back, the rest is new
    let net = net_journal(&[(d(2, 0, 1024), false), (d(2, 512, 1024), true)]).unwrap();
    assert_eq!(net[&VdevId(2)], TxgDelta { allocs: vec![(1024, 512)], frees: vec![(0, 512)] });
    assert!(net_journal(&[(d(0, 0, 1024), true), (d(0, 512, 512), true)]).unwrap_err().contains("allocation"));
}
