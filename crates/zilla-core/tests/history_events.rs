//! The pool history in the object directory and the events the engine posts: the
//! history section is optional (an object directory without it, as every pool before
//! it wrote, decodes with an empty history) and round-trips; a corrupt one fails with an
//! error naming it; a pool's history survives export and import; a scrub and a device
//! taken offline post their events with the pool and the device.
mod common;
use common::*;
use zilla_core::dmu::Mos;
use zilla_core::fm;
use zilla_core::metaslab::Metaslabs;
use zilla_core::spa::ScrubCmd;
use zilla_core::spa_history::{History, HistoryRecord};

fn ms() -> Metaslabs {
    let ms = Metaslabs::new();
    ms.add_vdev(zilla_core::VdevId(0), zilla_core::vdev::Role::Normal, 1 << 30);
    ms
}

fn mos(history: History) -> Mos {
    Mos {
        txg: zilla_core::Txg(9),
        next_volume_id: 1,
        volumes: vec![],
        scan_state: String::new(),
        pool_props: "{}".into(),
        leaf_health: Some(vec![]),
        zil_headers: vec![],
        history,
    }
}

fn rec(cmd: &str) -> HistoryRecord {
    HistoryRecord { time: 1_795_290_300, cmd: cmd.into(), who: Some(0), user: "root".into(), host: "h".into(), client: "local".into() }
}

#[test]
fn history_section_is_optional_and_round_trips() {
    // without a record: the bytes a build before the section wrote (it ends after the
    // leaf health), and they decode with an empty history
    let empty = mos(History::default()).encode(&ms());
    let old = Mos::decode(&empty, &mut ms()).unwrap();
    assert!(old.history.is_empty());
    let mut h = History::default();
    h.append(rec("zilla pool create tank mirror a b"), true);
    h.append(rec("zilla pool scrub tank"), false);
    let blob = mos(h.clone()).encode(&ms());
    assert!(blob.len() > empty.len() + 4, "the history follows a ZIL header count of 0");
    assert_eq!(&blob[..empty.len()], &empty[..], "the sections before it are unchanged");
    let back = Mos::decode(&blob, &mut ms()).unwrap();
    assert_eq!(back.history, h);
    assert!(back.zil_headers.is_empty());
    // a corrupt section fails the decode with an error that names it
    let mut bad = blob.clone();
    let at = empty.len() + 4; // the section's magic
    bad[at] ^= 0xff;
    let e = Mos::decode(&bad, &mut ms()).unwrap_err().to_string();
    assert!(e.contains("pool history: bad magic"), "{e}");
    let e = Mos::decode(&blob[..blob.len() - 3], &mut ms()).unwrap_err().to_string();
    assert!(e.contains("pool history: truncated"), "{e}");
}

#[test]
fn history_survives_export_and_import() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    pool.log_history(rec("zilla pool create tank mirror m0a m0b mirror m1a m1b"), true);
    pool.sync().unwrap();
    pool.log_history(rec("zilla pool export tank"), false);
    pool.export().unwrap();
    let pool = import(&devs);
    let (records, dropped) = pool.history();
    assert_eq!(records.iter().map(|r| r.cmd.as_str()).collect::<Vec<_>>(), ["zilla pool create tank mirror m0a m0b mirror m1a m1b", "zilla pool export tank"]);
    assert_eq!(dropped, 0);
    assert_eq!(records[0].who, Some(0));
    pool.export().unwrap();
}

#[test]
fn scrub_and_offline_post_events() {
    let devs = mem_devs(&["m0a", "m0b", "m1a", "m1b"], 24 << 20);
    let pool = create(&devs, two_mirrors());
    let seen = fm::last_eid();
    pool.scrub(ScrubCmd::Start).unwrap();
    pool.scrub_wait().unwrap();
    pool.offline("m0b").unwrap();
    pool.online("m0b").unwrap();
    let mine = |class: &str| fm::after(seen).0.into_iter().filter(|e| e.class == class && (e.pool == "tank" || e.vdev_path == "m0b")).collect::<Vec<_>>();
    // other tests of this binary post too (pools named tank): look for ours after `seen`
    assert!(!mine(fm::CLASS_SCRUB_START).is_empty());
    let fin = mine(fm::CLASS_SCRUB_FINISH);
    assert!(fin.iter().any(|e| e.field_u64("scan_errors") == Some(0) && e.field_u64("scan_examined").is_some()));
    let changes = mine(fm::CLASS_STATECHANGE);
    assert!(changes.iter().any(|e| e.field_str("vdev_state") == Some("OFFLINE") && e.field_str("vdev_laststate") == Some("ONLINE")));
    assert!(changes.iter().any(|e| e.field_str("vdev_state") == Some("ONLINE") && e.field_str("vdev_laststate") == Some("OFFLINE")));
    assert!(changes.iter().all(|e| e.vdev_guid != 0));
    pool.export().unwrap();
}
