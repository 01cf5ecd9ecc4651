//! Thick and thin volumes: a volume with a `refreservation` keeps its writes while a
//! sparse one fills the pool; a reservation the pool cannot hold is refused; the
//! reservation survives export and import; a volume record without the property (every
//! volume written before reservations existed) is sparse. The space figures `get`
//! shows agree with the pool's.
mod common;
use common::*;
use zilla_core::spa::Pool;
use zilla_core::zvol::BlockVolume;
use zilla_core::Error;

const CHUNK: usize = 256 << 10;
const THICK_BYTES: u64 = 8 << 20;

fn prop(pool: &Pool, vol: &str, name: &str) -> (String, String) {
    let row = pool.get_props(vol, &[name.to_string()]).unwrap().remove(0);
    (row.value, row.source)
}

fn bytes(pool: &Pool, vol: &str, name: &str) -> u64 {
    let (v, _) = prop(pool, vol, name);
    v.parse().unwrap_or_else(|_| panic!("{vol} {name} = {v:?} is not a number"))
}

/// `get`'s figures for `vol` follow zfs from the pool's: used = referenced + unused
/// reservation, available = the pool's plus that unused part; `volumes()` (volume
/// list) shows the same numbers, and `list_row` (pool list) the pool's.
fn check_figures_agree(pool: &Pool, vol: &str) {
    let pool_avail: u64 = pool.get_pool_props().iter().find(|r| r.property == "available").unwrap().value.parse().unwrap();
    assert_eq!(pool_avail, pool.list_row().avail, "pool get and pool list disagree");
    let (rr, _) = prop(pool, vol, "refreservation");
    let refreservation = if rr == "none" { 0 } else { rr.parse::<u64>().unwrap() };
    let (used, referenced, available) = (bytes(pool, vol, "used"), bytes(pool, vol, "referenced"), bytes(pool, vol, "available"));
    let unused = refreservation.saturating_sub(referenced);
    assert_eq!(used, referenced + unused, "{vol}: used");
    assert_eq!(available, pool_avail + unused, "{vol}: available");
    assert_eq!(bytes(pool, vol, "usedbyrefreservation"), unused, "{vol}: usedbyrefreservation");
    let info = pool.volumes().into_iter().find(|i| i.name.ends_with(&format!("/{vol}"))).unwrap();
    assert_eq!((info.used, info.referenced, info.available, info.refreservation), (used, referenced, available, refreservation), "{vol}: volume list");
    assert_eq!(info.logicalused, bytes(pool, vol, "logicalused"));
}

/// Write `vol` in chunks from `from` until a write or its flush fails; the error and
/// the offset it stopped at.
fn fill(v: &dyn BlockVolume, from: u64, seed: u64) -> (Error, u64) {
    let mut off = from;
    loop {
        if let Err(e) = v.write(off, &pattern(seed + off, CHUNK), false).and_then(|()| v.flush()) {
            return (e, off);
        }
        off += CHUNK as u64;
        assert!(off < v.size(), "the sparse volume never ran out of space");
    }
}

#[test]
fn thick_volume_keeps_its_writes_while_a_thin_one_fills_the_pool() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    let auto = vec![("refreservation".to_string(), "auto".to_string())];
    pool.volume_create("thick", THICK_BYTES, 16384, &auto).unwrap();
    pool.volume_create("thin", 256 << 20, 16384, &[]).unwrap();
    // a thick volume larger than what is left is refused, and nothing is created
    match pool.volume_create("huge", 64 << 20, 16384, &auto) {
        Err(e @ Error::NoSpaceFor(_)) => {
            assert_eq!(e.errno(), libc::ENOSPC);
            assert!(e.to_string().contains("refreservation"), "{e}");
        }
        other => panic!("a 64 MiB reservation in a 46 MiB pool: {other:?}"),
    }
    assert!(pool.open_volume("huge").is_err());
    let reservation = bytes(&pool, "thick", "refreservation");
    assert!(reservation > THICK_BYTES && reservation < THICK_BYTES + THICK_BYTES / 8, "auto = volsize plus metadata, got {reservation}");
    assert_eq!(prop(&pool, "thick", "refreservation").1, "local");
    assert_eq!(prop(&pool, "thin", "refreservation"), ("none".to_string(), "default".to_string()));
    check_figures_agree(&pool, "thick");
    check_figures_agree(&pool, "thin");

    // the thin volume fills the pool: ENOSPC, the reservation untouched
    let thin = pool.open_volume("thin").unwrap();
    let (err, stopped) = fill(&*thin, 0, 1);
    assert!(matches!(err, Error::NoSpace), "expected NoSpace, got {err:?}");
    assert!(stopped >= 16 << 20, "the thin volume got only {stopped} bytes");
    pool.sync().unwrap();
    assert_eq!(bytes(&pool, "thick", "used"), reservation, "an unwritten thick volume uses its whole reservation");
    check_figures_agree(&pool, "thin");
    check_figures_agree(&pool, "thick");
    assert!(pool.list_row().avail < 4 << 20, "the pool still shows {} available", pool.list_row().avail);

    // every byte of the thick volume can be written while the pool is full
    let thick = pool.open_volume("thick").unwrap();
    for off in (0..THICK_BYTES).step_by(CHUNK) {
        thick.write(off, &pattern(7 + off, CHUNK), false).unwrap_or_else(|e| panic!("thick write at {off}: {e}"));
        thick.flush().unwrap();
    }
    pool.sync().unwrap();
    let mut b = vec![0u8; CHUNK];
    for off in (0..THICK_BYTES).step_by(CHUNK) {
        thick.read(off, &mut b).unwrap();
        assert!(b == pattern(7 + off, CHUNK), "thick chunk at {off} differs");
    }
    // and rewritten, all of it, while the pool stays full: a rewrite's new copy needs
    // room before its old copy comes back, so the writes wait for syncs instead of
    // failing
    // (eight writers at once, as a client with many requests in flight: they compete
    // for the room each sync returns)
    std::thread::scope(|scope| {
        for writer in 0..8u64 {
            let thick = &thick;
            scope.spawn(move || {
                for off in (0..THICK_BYTES).step_by(CHUNK).skip(writer as usize).step_by(8) {
                    for piece in (off..off + CHUNK as u64).step_by(16384) {
                        let data = &pattern(9 + off, CHUNK)[(piece - off) as usize..][..16384];
                        thick.write(piece, data, false).unwrap_or_else(|e| panic!("thick rewrite at {piece}: {e}"));
                    }
                }
            });
        }
    });
    thick.flush().unwrap();
    pool.sync().unwrap();
    for off in (0..THICK_BYTES).step_by(CHUNK) {
        thick.read(off, &mut b).unwrap();
        assert!(b == pattern(9 + off, CHUNK), "rewritten thick chunk at {off} differs");
    }
    assert_eq!(bytes(&pool, "thick", "referenced"), THICK_BYTES);
    assert_eq!(bytes(&pool, "thick", "logicalused"), THICK_BYTES);
    check_figures_agree(&pool, "thick");
    check_figures_agree(&pool, "thin");
    // the thin volume still cannot write
    assert!(matches!(thin.write(stopped, &pattern(3, CHUNK), false).and_then(|()| thin.flush()), Err(Error::NoSpace)));

    // growing the reservation past the free space is refused; giving it up frees
    // its unused part for the thin volume
    let more = (reservation + (16 << 20)).to_string();
    assert!(matches!(pool.set_prop("thick", "refreservation", &more), Err(Error::NoSpaceFor(_))));
    assert_eq!(bytes(&pool, "thick", "refreservation"), reservation, "a refused set changed the reservation");
    pool.set_prop("thick", "refreservation", "none").unwrap();
    assert_eq!(bytes(&pool, "thick", "used"), THICK_BYTES);
    check_figures_agree(&pool, "thick");
    // a reservation no larger than what the volume references needs no free space
    pool.set_prop("thick", "refreservation", &THICK_BYTES.to_string()).unwrap();
    assert_eq!(bytes(&pool, "thick", "used"), THICK_BYTES);
    check_figures_agree(&pool, "thick");
}

#[test]
fn reservation_survives_export_and_import() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    pool.volume_create("thick", THICK_BYTES, 16384, &[("refreservation".to_string(), "auto".to_string())]).unwrap();
    pool.volume_create("fixed", 4 << 20, 16384, &[("refreservation".to_string(), "2M".to_string())]).unwrap();
    pool.volume_create("thin", 256 << 20, 16384, &[]).unwrap();
    let reservation = bytes(&pool, "thick", "refreservation");
    let thick = pool.open_volume("thick").unwrap();
    thick.write(0, &pattern(1, CHUNK), true).unwrap();
    drop(thick);
    pool.sync().unwrap();
    let before = pool.list_row().avail;
    pool.export().unwrap();
    drop(pool);

    let pool = import(&devs);
    assert_eq!(bytes(&pool, "thick", "refreservation"), reservation);
    assert_eq!(bytes(&pool, "fixed", "refreservation"), 2 << 20);
    assert_eq!(bytes(&pool, "thick", "referenced"), CHUNK as u64);
    assert_eq!(bytes(&pool, "thick", "used"), reservation);
    assert_eq!(prop(&pool, "thin", "refreservation").0, "none");
    // (the export's final sync and the import rewrite the object directory: a few blocks)
    let after = pool.list_row().avail;
    assert!(after.abs_diff(before) < 256 << 10, "the pool's available space went from {before} to {after} across export/import");
    for v in ["thick", "fixed", "thin"] {
        check_figures_agree(&pool, v);
    }
    // the imported reservations are still kept: the thin volume stops short of them
    let thin = pool.open_volume("thin").unwrap();
    let (err, _) = fill(&*thin, 0, 9);
    assert!(matches!(err, Error::NoSpace), "{err:?}");
    let thick = pool.open_volume("thick").unwrap();
    for off in (0..THICK_BYTES).step_by(CHUNK) {
        thick.write(off, &pattern(off, CHUNK), false).unwrap_or_else(|e| panic!("thick write at {off} after import: {e}"));
    }
    thick.flush().unwrap();
}

/// A volume record as every image before reservations has it: no `refreservation` in
/// its property map. It imports as sparse (none, default) and reserves nothing.
#[test]
fn a_volume_record_without_the_property_is_sparse() {
    let ms = zilla_core::metaslab::Metaslabs::new();
    ms.add_vdev(zilla_core::VdevId(0), zilla_core::vdev::Role::Normal, 1 << 30);
    let record = zilla_core::dmu::VolumeRecord {
        id: 1,
        name: "old".into(),
        volsize: 64 << 20,
        volblocksize: 16384,
        root: zilla_core::dmu::TreeRoot { bp: zilla_core::block::blkptr::BlockPointer::hole(), nlevels: zilla_core::dmu::levels_for(4096) },
        props: zilla_core::props::PropSet::from_local([("sync".to_string(), "always".to_string())].into()),
        created_txg: zilla_core::Txg(4),
    };
    let mos = zilla_core::dmu::Mos { txg: zilla_core::Txg(9), next_volume_id: 2, volumes: vec![record], scan_state: String::new(), pool_props: "{}".into(), leaf_health: None, zil_headers: vec![], history: Default::default() };
    let blob = mos.encode(&ms);
    // the record's property map is the JSON object it always was
    assert!(!String::from_utf8_lossy(&blob).contains("refreservation"));
    let mut ms2 = zilla_core::metaslab::Metaslabs::new();
    ms2.add_vdev(zilla_core::VdevId(0), zilla_core::vdev::Role::Normal, 1 << 30);
    let decoded = zilla_core::dmu::Mos::decode(&blob, &mut ms2).unwrap();
    assert_eq!(decoded.volumes[0].props.get("refreservation"), ("none".to_string(), "default"));

    // and through a whole pool: a volume created without the property (what every
    // volume was) stays sparse across export/import and reserves nothing
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    let empty = pool.list_row().avail;
    pool.volume_create("old", 64 << 20, 16384, &[]).unwrap();
    pool.export().unwrap();
    drop(pool);
    let pool = import(&devs);
    assert_eq!(prop(&pool, "old", "refreservation"), ("none".to_string(), "default".to_string()));
    assert_eq!(bytes(&pool, "old", "used"), 0);
    let now = pool.list_row().avail;
    assert!(now + (1 << 20) > empty, "a sparse volume reserved {} bytes", empty - now);
    check_figures_agree(&pool, "old");
}
