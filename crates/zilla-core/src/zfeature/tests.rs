//! Feature flag tests: name syntax, the import decision, and counts in a MOS that is
//! synced and reopened.

use super::*;
use crate::dmu::object_tree::tests::MemBlocks;
use crate::dmu::objset::ObjsetType;

#[test]
fn names() {
    for ok in ["org.zilla:async_destroy", "com.example:x", "com.delphix-labs:a_1"] {
        check_name(ok).unwrap();
    }
    for bad in ["async_destroy", "org.zilla:", "org.zilla:Big", "zilla:x", "org.zilla:a-b", &format!("org.zilla:{}", "a".repeat(65))] {
        assert!(check_name(bad).is_err(), "{bad}");
    }
    check_list("features_for_read", &["org.zilla:large_blocks".into()]).unwrap();
    assert!(check_list("f", &["org.zilla:a".into(), "org.zilla:a".into()]).unwrap_err().contains("twice"));
    assert!(check_list("f", &vec!["org.zilla:a".to_string(); 65]).unwrap_err().contains("at most 64"));
    assert!(find("feature@x").is_none());
    assert_eq!(find("async_destroy").map(|f| f.kind), Some(Kind::Write));
    assert_eq!(find("org.zilla:large_blocks").map(|f| f.kind), Some(Kind::Read));
}

#[test]
fn import_decision_follows_the_two_lists() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(import_access(&s(&["org.zilla:large_blocks"]), &s(&["org.zilla:async_destroy"])).unwrap(), Access::ReadWrite);
    let e = import_access(&s(&["com.example:fancy", "org.zilla:large_blocks", "org.zilla:nope"]), &[]).unwrap_err().to_string();
    assert!(e.contains("com.example:fancy, org.zilla:nope") && e.contains("cannot be imported"), "{e}");
    assert_eq!(import_access(&[], &s(&["com.example:w"])).unwrap(), Access::ReadOnly { unknown_write: s(&["com.example:w"]) });
    // a known feature listed under the other kind is not what this build knows
    assert!(import_access(&s(&["org.zilla:async_destroy"]), &[]).is_err());
}

#[test]
fn counts_enable_activate_and_survive_a_reopen() {
    let io = MemBlocks::new();
    io.set_txg(1);
    let mos = Objset::create(ObjsetType::Mos, Txg(1));
    let objects = Features::create(&mos, &io, Txg(1)).unwrap().objects;
    let bp = mos.sync(&io, Txg(1)).unwrap().unwrap().bp;
    let ad = find("async_destroy").unwrap();
    let lb = find("large_blocks").unwrap();
    io.set_txg(2);
    let mos = Objset::open(&io, &bp).unwrap();
    let f = Features { mos: &mos, io: &io, objects };
    assert_eq!(f.state(ad).unwrap(), State::Disabled);
    assert!(f.add_count(Txg(2), ad, 1).unwrap_err().to_string().contains("not enabled"));
    assert!(f.enable(Txg(2), ad).unwrap());
    assert!(!f.enable(Txg(2), ad).unwrap(), "enabling twice changes nothing");
    f.enable(Txg(2), lb).unwrap();
    assert_eq!(f.add_count(Txg(2), ad, 2).unwrap(), State::Active(2));
    let bp = mos.sync(&io, Txg(2)).unwrap().unwrap().bp;
    io.set_txg(3);
    let mos = Objset::open(&io, &bp).unwrap();
    let f = Features { mos: &mos, io: &io, objects };
    assert_eq!((f.state(ad).unwrap(), f.state(lb).unwrap()), (State::Active(2), State::Enabled));
    assert_eq!(f.active_lists().unwrap(), (vec![], vec!["org.zilla:async_destroy".to_string()]));
    assert_eq!(f.add_count(Txg(3), ad, -2).unwrap(), State::Enabled);
    assert_eq!(f.active_lists().unwrap(), (vec![], vec![]));
    assert_eq!(f.all().unwrap().len(), 2);
}

#[test]
#[should_panic(expected = "count 0 changed by -1")]
fn a_count_below_zero_is_a_bug() {
    let io = MemBlocks::new();
    io.set_txg(1);
    let mos = Objset::create(ObjsetType::Mos, Txg(1));
    let f = Features::create(&mos, &io, Txg(1)).unwrap();
    let ad = find("async_destroy").unwrap();
    f.enable(Txg(1), ad).unwrap();
    let _ = f.add_count(Txg(1), ad, -1);
}
