//! Crafted disk images: every field of a label config, an uberblock, the block pointer
//! an uberblock holds, the block pointers of a volume's tree (its root in the object
//! directory, an indirect's, a data block's) and a log block header, set to boundary and
//! hostile values with the checksums above it resealed (tests/craft). Import must
//! either refuse with a message that names the field (or says which structure is
//! corrupt), or import and serve what the image holds: every read matches the data
//! written before the image was taken (or is a clear I/O error, and a scrub finishes
//! counting it), and a write acknowledged after import survives export and import
//! (a wrapped txg counter once lost it). Nothing may panic, and the process stays under
//! `MEMORY_BOUND_BYTES` of peak resident memory (a crafted ashift once made one
//! allocation grow by gigabytes).

mod common;
mod craft;

use std::sync::Arc;

use common::*;
use zilla_core::spa::{Pool, TopSpec};
use zilla_core::vdev::fault::{CrashDevice, CrashMode};
use zilla_core::vdev::Role;

const DEV_SIZE: u64 = 10 << 20;
const VOLSIZE: u64 = 2 << 20;
const NAMES: [&str; 3] = ["a", "b", "l"];
/// Peak resident memory the test process may reach (VmHWM): the images (3 x 10 MiB,
/// a few copies at a time), the pools and the test harness fit well below it.
const MEMORY_BOUND_BYTES: u64 = 1 << 30;

type Images = Vec<(String, Vec<u8>)>;

fn tops() -> Vec<TopSpec> {
    vec![
        TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("a"), leaf("b")] },
        TopSpec { role: Role::Log, mirror: false, leaves: vec![leaf("l")] },
    ]
}

/// A run that hangs (a pool thread died on a crafted value) fails in bounded time.
fn watchdog() {
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(240));
        eprintln!("crafted_images: no progress in 240 s (a pool thread hung or died)");
        std::process::abort();
    });
}

fn vm_hwm_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb << 10)
}

fn check_memory() {
    let hwm = vm_hwm_bytes();
    eprintln!("VmHWM {} MiB", hwm >> 20);
    assert!(hwm < MEMORY_BOUND_BYTES, "peak memory {hwm} bytes, bound {MEMORY_BOUND_BYTES}");
}

fn devset(images: &Images) -> DevSet {
    let set = DevSet::default();
    for (n, img) in images {
        set.insert(n, Arc::new(CrashDevice::from_image(img.clone())));
    }
    set
}

/// What an image set holds: the volume's bytes after replay with the intent log, and
/// without it (the records a damaged chain loses).
#[derive(Clone)]
struct Expected {
    with_log: Vec<u8>,
    synced: Vec<u8>,
    /// False when the crafted field is a log record's offset or length: in range, the
    /// record is replayed where it says, and the volume holds what the image says.
    check_content: bool,
}

/// An exported pool: the volume holds `pattern(1)`; its txg is followed by two more (a
/// second volume, the export), so the txg before the newest holds the data too.
fn exported_pool() -> (Images, Expected) {
    let rig = CrashRig::new(&NAMES, DEV_SIZE);
    let pool = Pool::create_with("tank", tops(), Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("vol", VOLSIZE, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let data = pattern(1, VOLSIZE as usize);
    v.write(0, &data, false).unwrap();
    v.flush().unwrap();
    pool.sync().unwrap();
    drop(v);
    pool.volume_create("pad", 1 << 20, 16384, &[]).unwrap();
    pool.sync().unwrap();
    pool.export().unwrap();
    let images = rig.devs.iter().map(|(n, d)| (n.clone(), d.image_if_cut_now(CrashMode::DropAll, 0))).collect();
    (images, Expected { with_log: data.clone(), synced: data, check_content: true })
}

/// A pool cut while its intent log holds acknowledged writes the txgs have not synced.
fn pool_with_log_chain() -> (Images, Expected) {
    zilla_core::txg::ZFS_TXG_TIMEOUT.set(3600).unwrap();
    let rig = CrashRig::new(&NAMES, DEV_SIZE);
    let pool = Pool::create_with("tank", tops(), Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("vol", VOLSIZE, 16384, &[]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let synced = pattern(2, VOLSIZE as usize);
    v.write(0, &synced, false).unwrap();
    v.flush().unwrap();
    pool.sync().unwrap();
    let mut with_log = synced.clone();
    for (i, off) in [0u64, 64 << 10, 200 << 10].into_iter().enumerate() {
        let d = pattern(10 + i as u64, 12288);
        v.write(off, &d, false).unwrap();
        v.flush().unwrap();
        with_log[off as usize..off as usize + d.len()].copy_from_slice(&d);
    }
    let images = rig.devs.iter().map(|(n, d)| (n.clone(), d.power_cut(CrashMode::DropAll, 0))).collect();
    drop(v);
    pool.abandon();
    (images, Expected { with_log, synced, check_content: true })
}

/// Import `images` after `craft` changed them. A refusal must contain one of `words`
/// (the field's name, or the structure found corrupt); an import must serve the image.
fn try_crafted(case: &str, base: &Images, expected: &Expected, words: &[&str], craft: &dyn Fn(&mut Images) -> bool) {
    let mut images = base.clone();
    if !craft(&mut images) {
        eprintln!("{case}: cannot be crafted (does not fit), skipped");
        return;
    }
    let set = devset(&images);
    match Pool::import_with(&set.specs(), set.opener()) {
        Err(e) => {
            let msg = e.to_string();
            eprintln!("{case}: refused: {msg}");
            assert!(words.iter().any(|w| msg.contains(w)), "{case}: the refusal names none of {words:?}: {msg}");
        }
        Ok(pool) => {
            eprintln!("{case}: imported");
            serve_check(case, &pool, &set, expected);
        }
    }
}

/// An imported crafted pool serves what its image holds, and a write acknowledged now
/// is there after export and import.
fn serve_check(case: &str, pool: &Arc<Pool>, set: &DevSet, expected: &Expected) {
    let v = pool.open_volume("vol").unwrap_or_else(|e| panic!("{case}: volume not served: {e}"));
    let mut buf = vec![0u8; VOLSIZE as usize];
    match v.read(0, &mut buf) {
        Ok(()) if !expected.check_content => {}
        Ok(()) => {
            for (i, chunk) in buf.chunks(4096).enumerate() {
                let r = i * 4096..(i + 1) * 4096;
                assert!(chunk == &expected.with_log[r.clone()] || chunk == &expected.synced[r], "{case}: block {i} reads back wrong");
            }
        }
        Err(e) => eprintln!("{case}: read error (accepted): {e}"),
    }
    let fresh = pattern(99, 65536);
    let w = v.write(1 << 20, &fresh, false).and_then(|_| v.flush());
    drop(v);
    if let Err(e) = w {
        // a pool whose txg counter is at its end refuses writes with an error saying so
        assert!(e.to_string().contains("txg"), "{case}: write failed without naming the txg: {e}");
        pool.abandon();
        return;
    }
    pool.export().unwrap_or_else(|e| panic!("{case}: export: {e}"));
    let again = match Pool::import_with(&set.specs(), set.opener()) {
        Ok(p) => p,
        // a pool imported just below the txg limit has passed it: refused, saying so
        Err(e) if e.to_string().contains("field txg") => return eprintln!("{case}: import after export refused: {e}"),
        Err(e) => panic!("{case}: import after export: {e}"),
    };
    let v = again.open_volume("vol").unwrap();
    let mut b = vec![0u8; fresh.len()];
    v.read(1 << 20, &mut b).unwrap_or_else(|e| panic!("{case}: read after reimport: {e}"));
    assert!(b == fresh, "{case}: a write acknowledged with FLUSH is gone after export and import");
    drop(v);
    again.export().unwrap();
}

fn all_leaves(images: &mut Images, f: &dyn Fn(&mut Vec<u8>) -> bool) -> bool {
    images.iter_mut().map(|(_, img)| f(img)).fold(true, |a, b| a && b)
}

fn config_case(base: &Images, exp: &Expected, case: &str, words: &[&str], edit: &dyn Fn(&mut serde_json::Value)) {
    try_crafted(case, base, exp, words, &|imgs| all_leaves(imgs, &|img| craft::edit_config(img, edit)));
}

#[test]
fn label_config_fields() {
    watchdog();
    let (base, exp) = exported_pool();
    use serde_json::{json, Value};
    for a in [0u64, 1, 11, 14, 31, 32, 63, 255] {
        config_case(&base, &exp, &format!("tops[0].ashift={a}"), &["ashift"], &|v| v["config"]["tops"][0]["ashift"] = json!(a));
        config_case(&base, &exp, &format!("tops[1].ashift={a}"), &["ashift"], &|v| v["config"]["tops"][1]["ashift"] = json!(a));
        config_case(&base, &exp, &format!("props.ashift={a}"), &["ashift"], &|v| v["config"]["props"]["ashift"] = json!(a.to_string()));
    }
    for name in ["", "a/b", "../../etc", "x\n\u{1b}[31mred", "mirror0", &"n".repeat(300)] {
        config_case(&base, &exp, &format!("name={name:?}"), &["name"], &|v| v["config"]["name"] = json!(name));
    }
    for n in [0u64, 2, 1 << 63, u64::MAX] {
        // 2 is in range: a config naming vdevs or guids the devices and uberblocks do
        // not have is refused as a pool whose structures do not match
        // (and so is any non-zero guid: guids have no range, only uniqueness)
        let w = |field: &'static str| -> Vec<&'static str> {
            if n == 2 || field.contains("guid") || field == "id" { vec![field, "object directory", "uberblock", "missing", "parse"] } else { vec![field, "parse"] }
        };
        config_case(&base, &exp, &format!("version={n}"), &w("version"), &|v| v["config"]["version"] = json!(n));
        config_case(&base, &exp, &format!("txg={n}"), &w("txg"), &|v| v["config"]["txg"] = json!(n));
        config_case(&base, &exp, &format!("guid={n}"), &w("guid"), &|v| v["config"]["guid"] = json!(n));
        config_case(&base, &exp, &format!("this_guid={n}"), &w("this_guid"), &|v| v["this_guid"] = json!(n));
        config_case(&base, &exp, &format!("top id={n}"), &w("id"), &|v| v["config"]["tops"][0]["id"] = json!(n));
        config_case(&base, &exp, &format!("child guid={n}"), &w("guid"), &|v| v["config"]["tops"][0]["children"][0]["guid"] = json!(n));
        config_case(&base, &exp, &format!("offline_since={n}"), &w("offline_since"), &|v| v["config"]["tops"][0]["children"][0]["offline_since"] = json!(n));
        config_case(&base, &exp, &format!("hostid={n}"), &w("hostid"), &|v| v["config"]["hostid"] = json!(n));
        config_case(&base, &exp, &format!("dtl=[[1,{n}]]"), &w("dtl"), &|v| v["config"]["tops"][0]["children"][0]["dtl"] = json!([[1, n]]));
    }
    config_case(&base, &exp, "dtl reversed", &["dtl"], &|v| v["config"]["tops"][0]["children"][0]["dtl"] = json!([[9, 3]]));
    config_case(&base, &exp, "dtl 65 ranges", &["dtl"], &|v| {
        v["config"]["tops"][0]["children"][0]["dtl"] = Value::Array((0..65u64).map(|i| json!([i * 10 + 1, i * 10 + 2])).collect())
    });
    config_case(&base, &exp, "state=bogus", &["state"], &|v| v["config"]["state"] = json!("bogus"));
    config_case(&base, &exp, "hostname escape", &["hostname"], &|v| v["config"]["hostname"] = json!("\u{1b}[2J"));
    config_case(&base, &exp, "tops=[]", &["tops"], &|v| v["config"]["tops"] = json!([]));
    config_case(&base, &exp, "top repeated", &["id", "guid"], &|v| {
        let t = v["config"]["tops"][0].clone();
        v["config"]["tops"].as_array_mut().unwrap().push(t);
    });
    config_case(&base, &exp, "65 children", &["children"], &|v| {
        let c = v["config"]["tops"][0]["children"][0].clone();
        let kids: Vec<Value> = (0..65u64).map(|i| {
            let mut k = c.clone();
            k["guid"] = json!(1000 + i);
            k
        }).collect();
        v["config"]["tops"][0]["children"] = Value::Array(kids);
    });
    config_case(&base, &exp, "no children", &["children"], &|v| v["config"]["tops"][0]["children"] = json!([]));
    config_case(&base, &exp, "mirror=false, 2 children", &["children"], &|v| v["config"]["tops"][0]["mirror"] = json!(false));
    config_case(&base, &exp, "role=bogus", &["parse"], &|v| v["config"]["tops"][0]["role"] = json!("bogus"));
    config_case(&base, &exp, "only a log vdev", &["data vdev", "missing"], &|v| {
        v["config"]["tops"][0]["role"] = json!("log");
    });
    config_case(&base, &exp, "path with escape", &["path"], &|v| v["config"]["tops"][0]["children"][0]["spec"]["path"] = json!("/tmp/\u{1b}]0;x\u{7}"));
    config_case(&base, &exp, "props bogus failmode", &["props"], &|v| v["config"]["props"]["failmode"] = json!("panic"));
    // harmless values import and serve
    config_case(&base, &exp, "hostid=7", &[], &|v| v["config"]["hostid"] = json!(7));
    config_case(&base, &exp, "unknown prop", &[], &|v| v["config"]["props"]["newer_prop"] = json!("on"));
    check_memory();
}

fn ub_case(base: &Images, exp: &Expected, case: &str, words: &[&str], field: usize, len: usize, value: u64) {
    try_crafted(case, base, exp, words, &|imgs| all_leaves(imgs, &|img| craft::set_uberblock_field(img, field, len, value) > 0));
}

/// Uberblock fields: one out of range makes that uberblock corrupt, and import loads
/// the one before (which holds the data: see `exported_pool`); the txg counter never
/// wraps.
#[test]
fn uberblock_fields() {
    watchdog();
    let (base, exp) = exported_pool();
    let limit = zilla_core::Txg::POOL_LIMIT.get();
    let hostile = [0u64, 1, 2, limit - 1, limit, (1 << 63) - 1, 1 << 63, u64::MAX - 1, u64::MAX];
    let w: &[&str] = &["uberblock", "txg", "guid sum", "-F"];
    let only: Option<u64> = std::env::var("CRAFT_ONLY").ok().and_then(|v| v.parse().ok());
    for v in hostile.into_iter().filter(|v| only.map_or(true, |o| o == *v)) {
        ub_case(&base, &exp, &format!("ub version={v}"), w, 8, 8, v);
        ub_case(&base, &exp, &format!("ub txg={v}"), w, 16, 8, v);
        ub_case(&base, &exp, &format!("ub guid_sum={v}"), w, 24, 8, v);
        ub_case(&base, &exp, &format!("ub timestamp={v}"), w, 32, 8, v);
        ub_case(&base, &exp, &format!("ub pool_guid={v}"), w, 40, 8, v);
    }
    for interval in [0u64, 60_001, u32::MAX as u64] {
        try_crafted(&format!("heartbeat interval {interval}"), &base, &exp, w, &|imgs| {
            all_leaves(imgs, &|img| {
                craft::set_uberblock_field(img, 1044, 4, interval);
                craft::set_uberblock_field(img, 1024, 8, zilla_core::vdev::label::HEARTBEAT_MAGIC) > 0
            })
        });
    }
    check_memory();
}

/// Every field of a block pointer: (name, byte offset, length).
const BP_FIELDS: [(&str, usize, usize); 16] = [
    ("dva0.vdev", 0, 4),
    ("dva0.asize", 4, 4),
    ("dva0.offset", 8, 8),
    ("dva1.vdev", 16, 4),
    ("dva1.asize", 20, 4),
    ("dva1.offset", 24, 8),
    ("lsize", 48, 4),
    ("psize", 52, 4),
    ("birth", 56, 8),
    ("fill", 64, 8),
    ("checksum", 72, 1),
    ("compression", 73, 1),
    ("kind", 74, 1),
    ("level", 75, 1),
    ("reserved76", 76, 4),
    ("reserved112", 112, 8),
];

/// Boundary and hostile values written into each block pointer field (cut to its width).
const BP_VALUES: [u64; 10] = [0, 1, 5, 0xff, 4096, 0xfffff000, (16 << 20) + 4096, 1 << 40, 1 << 63, u64::MAX];

/// The MOS index block pointer every uberblock holds (its parent checksum is the
/// uberblock's): every field, boundary and hostile values.
#[test]
fn block_pointer_fields() {
    watchdog();
    let (base, exp) = exported_pool();
    let w: &[&str] = &["uberblock", "object directory", "MOS", "-F", "txg"];
    let (fields, values) = (BP_FIELDS, BP_VALUES);
    for (name, at, len) in fields {
        for v in values {
            let v = if len < 8 { v & ((1u64 << (len * 8)) - 1) } else { v };
            try_crafted(&format!("root bp {name}={v:#x}"), &base, &exp, w, &|imgs| {
                all_leaves(imgs, &|img| craft::set_root_bp_field(img, at, len, v) > 0)
            });
        }
    }
    check_memory();
}

/// Log block header and record fields of every block of a chain holding acknowledged
/// writes: a block whose fields are impossible is corruption (import fails naming the
/// field); a next pointer with an impossible size and one beyond the device are
/// handled alike.
#[test]
fn log_block_fields() {
    watchdog();
    let (base, exp) = pool_with_log_chain();
    let l = base.iter().position(|(n, _)| n == "l").unwrap();
    let blocks = craft::find_log_blocks(&base[l].1);
    assert!(!blocks.is_empty(), "no log block on the log device");
    // the chain as written replays
    try_crafted("log chain unchanged", &base, &exp, &[], &|_| true);
    let w: &[&str] = &["intent log"];
    let fields: [(&str, usize, usize); 11] = [
        ("body length", 32, 4),
        ("written", 36, 4),
        ("next.vdev", 40, 4),
        ("next.asize", 44, 4),
        ("next.offset", 48, 8),
        ("record type", 96, 1),
        ("record length", 100, 4),
        ("record txg", 104, 8),
        ("record offset", 112, 8),
        ("record len", 120, 8),
        ("record data length", 128, 8),
    ];
    let values = [0u64, 1, 4097, 1 << 20, 0xfffff000, 1 << 40, 1 << 63, u64::MAX - 6, u64::MAX];
    // the head and the block after it: every header field is read the same way in both
    for &at in blocks.iter().take(2) {
        for (name, f, len) in fields {
            for v in values {
                let v = if len < 8 { v & ((1u64 << (len * 8)) - 1) } else { v };
                let exp = Expected { check_content: f < 112, ..exp.clone() };
                try_crafted(&format!("log block {at:#x} {name}={v:#x}"), &base, &exp, w, &|imgs| {
                    craft::set_log_block_field(&mut imgs[l].1, at, f, len, v)
                });
            }
        }
    }
    // the two the log once told apart: an impossible size ended the chain silently,
    // an offset beyond the device was refused
    for (name, f, len, v) in [("next.asize", 44, 4, 0xfffff000u64), ("next.offset", 48, 8, 1 << 40)] {
        let mut images = base.clone();
        assert!(craft::set_log_block_field(&mut images[l].1, blocks[0], f, len, v));
        let set = devset(&images);
        let e = Pool::import_with(&set.specs(), set.opener()).map(|_| ()).expect_err(name);
        let msg = e.to_string();
        assert!(msg.contains("volume vol") && msg.contains("next") && (msg.contains("out of range") || msg.contains("beyond")), "{name}: {msg}");
    }
    // a written length the block cannot hold (beyond its largest size, or inside its
    // header: the checksum cannot be checked) once ended the chain silently, where one
    // it can hold but that leaves no room for the body was refused: both are refused,
    // naming the field
    let body_len = |at: usize| u32::from_le_bytes(base[l].1[at + 32..at + 36].try_into().unwrap()) as usize;
    let full = *blocks.iter().max_by_key(|&&at| body_len(at)).unwrap();
    assert!(body_len(full) > 512, "no log block holds more than 512 bytes of records");
    for (v, field) in [(1u64, "written"), (512, "body length"), ((128 << 10) + 512, "written"), (0xfffff000, "written")] {
        let mut images = base.clone();
        craft::set_log_block_field(&mut images[l].1, full, 36, 4, v);
        let set = devset(&images);
        let e = Pool::import_with(&set.specs(), set.opener()).map(|_| ()).expect_err("crafted written length");
        let msg = e.to_string();
        eprintln!("log block written={v:#x}: refused: {msg}");
        assert!(msg.contains("volume vol") && msg.contains(&format!("field {field} = ")), "written={v:#x}: {msg}");
    }
    check_memory();
}

/// Volume size of `tree_pool`: 2048 blocks of 4 KiB need three levels (root L2, L1
/// indirects, L0 data).
const TREE_VOLSIZE: u64 = 8 << 20;
/// Where `tree_pool` wrote: 16 KiB of incompressible data (stored raw) at 0, 16 KiB of
/// compressible data (stored lz4) under the second L1 indirect.
const TREE_WRITES: [u64; 2] = [0, 4 << 20];

/// An exported pool whose volume `vol` has a three-level tree with data under two L1
/// indirects; the volume's expected content.
fn tree_pool() -> (Images, Vec<u8>) {
    // the crafter (tests/craft/tree.rs) finds the volume's root in a format 1 object
    // directory
    zilla_core::spa::ZILLA_POOL_CREATE_FORMAT.set(1).unwrap();
    let rig = CrashRig::new(&NAMES, DEV_SIZE);
    let pool = Pool::create_with("tank", tops(), Default::default(), rig.set.opener()).unwrap();
    pool.volume_create("vol", TREE_VOLSIZE, 4096, &[("compression".into(), "lz4".into())]).unwrap();
    let v = pool.open_volume("vol").unwrap();
    let mut expected = vec![0u8; TREE_VOLSIZE as usize];
    let raw = pattern(3, 16384);
    let compressible = pattern(4, 64).repeat(256);
    for (off, d) in TREE_WRITES.into_iter().zip([raw, compressible]) {
        v.write(off, &d, false).unwrap();
        expected[off as usize..off as usize + d.len()].copy_from_slice(&d);
    }
    v.flush().unwrap();
    drop(v);
    pool.sync().unwrap();
    pool.export().unwrap();
    let images = rig.devs.iter().map(|(n, d)| (n.clone(), d.image_if_cut_now(CrashMode::DropAll, 0))).collect();
    (images, expected)
}

/// Import a pool whose tree pointer was crafted: a refusal names the field (or the
/// structure found corrupt); an imported pool reads every byte of the volume back as
/// written or fails that read with EIO, and a scrub finishes. False if the field could
/// not be crafted.
fn tree_case(case: &str, base: &Images, expected: &[u8], craft: &dyn Fn(&mut Images) -> bool) -> bool {
    let mut images = base.clone();
    if !craft(&mut images) {
        eprintln!("{case}: cannot be crafted (does not fit), skipped");
        return false;
    }
    let set = devset(&images);
    let pool = match Pool::import_with(&set.specs(), set.opener()) {
        Err(e) => {
            let msg = e.to_string();
            eprintln!("{case}: refused: {msg}");
            assert!(msg.contains("volume vol") && msg.contains("field "), "{case}: the refusal names no volume and field: {msg}");
            return true;
        }
        Ok(p) => p,
    };
    let v = pool.open_volume("vol").unwrap_or_else(|e| panic!("{case}: volume not served: {e}"));
    let piece = 64 << 10;
    let mut errors = 0;
    for at in (0..TREE_VOLSIZE as usize).step_by(piece) {
        let mut buf = vec![0u8; piece];
        match v.read(at as u64, &mut buf) {
            Ok(()) => assert!(buf == expected[at..at + piece], "{case}: bytes {at:#x}+{piece:#x} read back other bytes than were written"),
            Err(e) => {
                assert_eq!(e.errno(), libc::EIO, "{case}: read at {at:#x} failed with another error than EIO: {e}");
                if errors == 0 {
                    eprintln!("{case}: read error at {at:#x} (accepted): {e}");
                }
                errors += 1;
            }
        }
    }
    drop(v);
    pool.scrub(zilla_core::spa::ScrubCmd::Start).unwrap_or_else(|e| panic!("{case}: scrub: {e}"));
    pool.scrub_wait().unwrap();
    let s = pool.scan_status();
    eprintln!("{case}: imported, {errors} read errors, scrub {:?} with {} errors", s.state, s.errors);
    assert_eq!(s.state, zilla_core::scan::ScanState::Finished, "{case}: the scrub did not finish");
    pool.export().unwrap_or_else(|e| panic!("{case}: export: {e}"));
    true
}

/// Block pointers inside a volume's tree, each field set to boundary and hostile values
/// with every checksum above it resealed (tests/craft/tree.rs): the volume's root
/// pointer in the object directory, an L1 indirect's pointer in the L2 block, and the
/// pointers of a raw and of a compressed data block in their L1 blocks.
#[test]
fn tree_block_pointer_fields() {
    watchdog();
    let (base, expected) = tree_pool();
    let target = |level: u8, blkid: u64| craft::tree::TreeTarget { volume: "vol", level, blkid };
    let targets = [
        ("root", target(2, 0)),
        ("L1", target(1, 0)),
        ("L0 raw", target(0, 0)),
        ("L0 lz4", target(0, TREE_WRITES[1] / 4096)),
    ];
    let (fields, values) = (BP_FIELDS, BP_VALUES);
    // the tree as written is served
    assert!(tree_case("tree unchanged", &base, &expected, &|_| true));
    // every value on the root and the L1 pointer; half of them (alternating) on each
    // data pointer, all of them with CRAFT_ALL=1
    let all = std::env::var("CRAFT_ALL").is_ok();
    let only = std::env::var("CRAFT_CASE").unwrap_or_default();
    for (ti, (what, t)) in targets.into_iter().enumerate() {
        let (mut tried, mut crafted) = (0, 0);
        for (name, at, len) in fields {
            let mut seen = Vec::new();
            for v in values {
                let v = if len < 8 { v & ((1u64 << (len * 8)) - 1) } else { v };
                if seen.contains(&v) {
                    continue;
                }
                seen.push(v);
                if !all && ti >= 2 && (seen.len() + ti) % 2 == 1 {
                    continue;
                }
                let case = format!("{what} bp {name}={v:#x}");
                if !case.contains(&only) {
                    continue;
                }
                tried += 1;
                crafted += tree_case(&case, &base, &expected, &|imgs| craft::tree::set_tree_bp_field(imgs, t, at, len, v)) as usize;
            }
        }
        assert!(crafted * 10 >= tried * 9, "{what}: only {crafted} of {tried} cases could be crafted");
    }
    check_memory();
}

/// One device's labels name the pool otherwise (a crafted label, a disk relabelled
/// elsewhere), at the same config txg: import refuses naming both names and the devices,
/// instead of taking the name of whichever device it read last.
#[test]
fn labels_disagreeing_on_the_pool_name_are_refused() {
    watchdog();
    let (base, _exp) = exported_pool();
    let mut images = base.clone();
    assert!(craft::edit_config(&mut images[1].1, &|v| v["config"]["name"] = serde_json::json!("evil")));
    let set = devset(&images);
    let e = Pool::import_with(&set.specs(), set.opener()).map(|_| ()).expect_err("imported under one of two names");
    let msg = e.to_string();
    assert!(msg.contains("disagree on its name") && msg.contains("'evil'") && msg.contains("'tank'"), "{msg}");
    assert!(msg.contains(&images[1].0), "the device is not named: {msg}");
}
