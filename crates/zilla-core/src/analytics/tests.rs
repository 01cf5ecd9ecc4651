//! Store-level tests: ingest and query, holes, minutes, memory bound, time anchor,
//! persistence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::env::{Env, ThreadBody};

/// An Env whose monotonic and wall clocks a test sets (seconds).
struct TestEnv {
    mono_s: AtomicU64,
    unix_s: AtomicU64,
}

impl TestEnv {
    fn new(mono_s: u64, unix_s: u64) -> Arc<TestEnv> {
        Arc::new(TestEnv { mono_s: AtomicU64::new(mono_s), unix_s: AtomicU64::new(unix_s) })
    }
    fn set(&self, mono_s: u64, unix_s: u64) {
        self.mono_s.store(mono_s, Ordering::Relaxed);
        self.unix_s.store(unix_s, Ordering::Relaxed);
    }
}

impl Env for TestEnv {
    fn now_ns(&self) -> u64 {
        self.mono_s.load(Ordering::Relaxed) * 1_000_000_000
    }
    fn unix_time_ns(&self) -> u64 {
        self.unix_s.load(Ordering::Relaxed) * 1_000_000_000
    }
    fn sleep_until_ns(&self, _: u64) {}
    fn spawn(&self, name: String, body: ThreadBody) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name(name).spawn(body)
    }
    fn random_u64(&self) -> u64 {
        4
    }
    fn is_simulated(&self) -> bool {
        true
    }
    fn threads_spawned(&self) -> u64 {
        0
    }
}

/// A unix time on a minute boundary.
const T0: u64 = 1_764_390_000;

fn ops(read: u64, write: u64) -> Sample {
    let mut s = Sample::default();
    s.add("io.ops/op", "read", Value::Counter(read));
    s.add("io.ops/op", "write", Value::Counter(write));
    s.add("io.latency/op", "read", Value::Histogram(vec![(17, read), (18, 1)]));
    s
}

fn query(store: &Store, dataset: &str, from: u64, to: u64, res: u64, filter: &[&str]) -> QueryAnswer {
    let q = Query { dataset: dataset.into(), from: Some(from), to: Some(to), resolution: Some(res), filter: filter.iter().map(|s| s.to_string()).collect() };
    store.query(&q).unwrap()
}

fn series<'a>(a: &'a QueryAnswer, key: &str) -> &'a QuerySeries {
    a.series.iter().find(|s| s.key == key).unwrap_or_else(|| panic!("no series {key} in {:?}", a.series))
}

#[test]
fn round_trip_holes_filter_and_minutes() {
    let env = TestEnv::new(100, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    // seconds T0+1 ..= T0+120, but T0+5 has no sample (a hole) and at T0+6 nothing happened
    for i in 1..=120u64 {
        match i {
            5 => {}
            6 => {
                let mut s = Sample::default();
                s.touch("io.ops/op");
                store.ingest(100 + i, &s).unwrap();
            }
            _ => store.ingest(100 + i, &ops(i, 2 * i)).unwrap(),
        }
    }
    env.set(220, T0 + 120);
    let a = query(&store, "io.ops/op", T0, T0 + 10, 1, &[]);
    assert_eq!(a.times, (T0 + 1..=T0 + 10).collect::<Vec<_>>());
    assert_eq!(a.series.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(), ["write", "read"], "busiest first");
    let r = series(&a, "read");
    assert_eq!(r.values[..7], [Some(1.0), Some(2.0), Some(3.0), Some(4.0), None, Some(0.0), Some(7.0)]);
    assert!(r.buckets.is_none(), "a counter has no buckets");
    let f = query(&store, "io.ops/op", T0, T0 + 10, 1, &["read", "flush"]);
    assert_eq!(f.series.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(), ["read", "flush"]);
    assert_eq!(series(&f, "flush").values[0], Some(0.0));
    assert_eq!(series(&f, "flush").values[4], None);
    // minutes are the sums of their seconds: minute T0+60 holds seconds 1..=60 less the hole
    let m = query(&store, "io.ops/op", T0, T0 + 120, 60, &[]);
    assert_eq!(m.times, [T0 + 60, T0 + 120]);
    let sum: u64 = (1..=60).filter(|i| *i != 5 && *i != 6).sum();
    assert_eq!(series(&m, "read").values[0], Some(sum as f64 / 59.0), "the average over the seconds collected");
    let sum2: u64 = (61..=120).sum();
    assert_eq!(series(&m, "read").values[1], Some(sum2 as f64 / 60.0), "the minute being summed is answered too");
    let h = query(&store, "io.latency/op", T0, T0 + 60, 60, &[]);
    let b = series(&h, "read").buckets.as_ref().unwrap();
    assert_eq!(b[0].as_ref().unwrap(), &vec![(17u8, sum), (18, 58)], "bucket counts are events in the interval");
    let (t, live) = store.latest("io.latency/op").unwrap().unwrap();
    assert_eq!(t, T0 + 120);
    assert_eq!(live.series[0].buckets.as_ref().unwrap(), &vec![(17u8, 120), (18, 1)]);
    assert_eq!(store.latest("disk.latency/device").unwrap(), None, "no sample: a hole");
}

#[test]
fn queries_are_checked_and_json_has_the_contracts_shape() {
    let env = TestEnv::new(0, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    store.ingest(1, &ops(3, 4)).unwrap();
    env.set(1, T0 + 1);
    let bad = |q: Query| store.query(&q).unwrap_err().to_string();
    let q = |from, to, res| Query { dataset: "io.ops/op".into(), from: Some(from), to: Some(to), resolution: Some(res), filter: vec![] };
    assert!(bad(q(T0, T0 + 3601, 1)).contains("limit is 3600"));
    assert!(bad(q(T0, T0, 1)).contains("before"));
    assert!(bad(q(T0, T0 + 5, 7)).contains("1 or 60"));
    assert!(matches!(store.query(&Query { dataset: "io.ops/nope".into(), ..q(T0, T0 + 1, 1) }), Err(AnalyticsError::UnknownDataset(_))));
    let many: Vec<String> = (0..65).map(|i| format!("k{i}")).collect();
    assert!(bad(Query { filter: many, ..q(T0, T0 + 5, 1) }).contains("limit is 64"));
    // defaults: the last five minutes at resolution 1
    let a = store.query(&Query { dataset: "io.ops/op".into(), ..Query::default() }).unwrap();
    assert_eq!((a.from, a.to, a.resolution, a.times.len()), (T0 + 1 - 300, T0 + 1, 1, 300));
    let json = serde_json::to_value(&a).unwrap();
    assert_eq!(json["kind"], "counter");
    assert_eq!(json["series"][0]["values"][299], 4.0);
    assert!(json["series"][0]["values"][0].is_null());
    let h = serde_json::to_value(query(&store, "io.latency/op", T0, T0 + 1, 1, &[])).unwrap();
    assert_eq!(h["series"][0]["buckets"][0], serde_json::json!([[17, 3], [18, 1]]));
    let d = serde_json::to_value(store.datasets()).unwrap();
    assert_eq!(d["history"], serde_json::json!({"second_points": 3600, "minute_points": 10080}));
    assert_eq!(d["buckets"]["lower"][1], 1024);
    assert!(d["buckets"]["upper"][97].is_null());
    assert_eq!(d["now"], T0 + 1);
    let ds = d["datasets"].as_array().unwrap().iter().find(|x| x["name"] == "io.latency/op").unwrap().clone();
    assert_eq!((ds["enabled"].clone(), ds["default"].clone(), ds["kind"].clone()), (true.into(), true.into(), "histogram".into()));
    assert_eq!(d["statistics"][0]["breakdowns"][5], "volume+op");
    // a disabled dataset answers with nothing collected; an older second is refused
    assert!(query(&store, "io.bytes/op", T0, T0 + 1, 1, &["read"]).series[0].values[0].is_none());
    assert!(matches!(store.ingest(1, &ops(1, 1)), Err(AnalyticsError::OutOfOrder { .. })));
    // a dataset named twice in one sample: the first entry counts
    let mut twice = ops(5, 5);
    twice.datasets.push(("io.ops/op".into(), vec![("read".into(), Value::Counter(1000))]));
    store.ingest(2, &twice).unwrap();
    let live = store.latest("io.ops/op").unwrap().unwrap().1;
    assert_eq!(live.series[0], LiveSeries { key: "read".into(), value: 5, buckets: None });
}

#[test]
fn query_keys_beyond_64_are_summed_into_other() {
    let env = TestEnv::new(0, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    store.set_enabled("io.ops/volume", true).unwrap();
    // 50 volumes in each of two seconds, different ones: 100 keys over the range
    for sec in 1..=2u64 {
        let mut s = Sample::default();
        for v in 0..50 {
            s.add("io.ops/volume", &format!("tank/v{}", v + 50 * (sec - 1)), Value::Counter(1000 + v + 50 * (sec - 1)));
        }
        store.ingest(sec, &s).unwrap();
    }
    let a = query(&store, "io.ops/volume", T0, T0 + 2, 1, &[]);
    assert_eq!(a.series.len(), 65);
    assert_eq!(a.series[0].key, "tank/v99");
    let other = series(&a, "other");
    let expect: u64 = (0..36).map(|v| 1000 + v).sum();
    assert_eq!(other.values[0], Some(expect as f64), "the 36 least busy keys");
    let total: f64 = a.series.iter().map(|s| s.values[0].unwrap() + s.values[1].unwrap()).sum();
    assert_eq!(total, (0..100u64).map(|v| 1000 + v).sum::<u64>() as f64);
}

/// Adversarial samples (hundreds of long keys, every bucket, huge counts) past a full
/// second ring: the history never passes its stated bound, and enabling past the total
/// bound is refused with the numbers.
#[test]
fn memory_bound_is_enforced() {
    let env = TestEnv::new(0, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    let names = ["disk.latency/device", "io.ops/client"];
    store.set_enabled("io.ops/client", true).unwrap();
    let every_bucket: Vec<(u8, u64)> = (0..98u8).map(|b| (b, u64::MAX / 3)).collect();
    for sec in 1..=3700u64 {
        let mut s = Sample::default();
        for k in 0..300u64 {
            let key = format!("{:0>200}", k + sec % 700);
            s.add(names[0], &key, Value::Histogram(every_bucket.clone()));
            s.add(names[1], &key, Value::Counter(u64::MAX / 2 + k));
        }
        store.ingest(sec, &s).unwrap();
    }
    for n in names {
        let info = store.dataset(n).unwrap();
        assert!(info.memory_bytes <= info.memory_max_bytes, "{n}: {} > {}", info.memory_bytes, info.memory_max_bytes);
        assert!(info.memory_bytes > info.memory_max_bytes / 20, "{n}: the test filled too little ({})", info.memory_bytes);
    }
    // fill the bound: some dataset must be refused, with the numbers
    let mut refused = None;
    for id in catalog::DatasetId::all() {
        if let Err(e) = store.set_enabled(&id.name(), true) {
            refused = Some(e);
            break;
        }
    }
    let e = refused.expect("64 MiB holds every dataset?").to_string();
    assert!(e.contains("bytes") && e.contains(&MEMORY_MAX_BYTES_DEFAULT.to_string()), "{e}");
    let committed: u64 = store.enabled().iter().map(|n| store.dataset(n).unwrap().memory_max_bytes).sum();
    assert!(committed <= MEMORY_MAX_BYTES_DEFAULT);
}

fn temp_path(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("analytics.history")
}

#[test]
fn persistence_round_trip_and_restart_after_the_wall_clock_went_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = temp_path(&dir);
    let env = TestEnv::new(1000, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    store.set_enabled("disk.latency/device", false).unwrap();
    store.set_enabled("io.bytes/volume", true).unwrap();
    // a wall clock jump back while running changes nothing: seconds follow the anchor
    for i in 1..=150u64 {
        env.set(1000 + i, T0 - 5000);
        let mut s = ops(i, 1);
        s.add("io.bytes/volume", "tank/vol1", Value::Counter(4096 * i));
        store.ingest(1000 + i, &s).unwrap();
    }
    assert_eq!(store.now_unix_s(), T0 + 150);
    store.save(&path).unwrap();
    let before = query(&store, "io.bytes/volume", T0, T0 + 180, 60, &[]);
    assert_eq!(before.series[0].values.iter().filter(|v| v.is_some()).count(), 3);
    // restart with the wall clock an hour behind
    let env2 = TestEnv::new(5, T0 - 3600);
    let mut store2 = Store::new(env2.clone(), MEMORY_MAX_BYTES_DEFAULT);
    let report = store2.load(&path).unwrap();
    assert!(report.file_found);
    assert_eq!(report.datasets, ["io.ops/op", "io.bytes/volume", "io.latency/op"]);
    assert_eq!(report.minutes, 9);
    assert_eq!(report.clock_shift_s, T0 + 180 + 1 - (T0 - 3600));
    assert!(!store2.enabled().contains(&"disk.latency/device".to_string()), "the file's datasets are the enabled ones");
    let after = query(&store2, "io.bytes/volume", T0, T0 + 180, 60, &[]);
    assert_eq!(before.series, after.series);
    // new seconds land after the newest saved minute, and their minute after it
    assert!(matches!(store2.ingest(4, &ops(7, 7)), Err(AnalyticsError::OutOfOrder { .. })), "a second of the saved minute");
    store2.ingest(5, &ops(7, 7)).unwrap();
    assert_eq!(store2.latest("io.ops/op").unwrap().unwrap().0, T0 + 181);
    let m = query(&store2, "io.ops/op", T0, T0 + 240, 60, &[]);
    assert_eq!(m.times, [T0 + 60, T0 + 120, T0 + 180, T0 + 240]);
    assert_eq!(series(&m, "read").values[3], Some(7.0));
    assert_eq!(series(&m, "read").values[2], Some((121..=150).sum::<u64>() as f64 / 30.0));
    // a load after the first sample is refused; a missing file is no error
    assert!(matches!(store2.load(&path), Err(LoadError::AfterIngest)));
    let mut store3 = Store::new(env2, MEMORY_MAX_BYTES_DEFAULT);
    assert_eq!(store3.load(&dir.path().join("none")).unwrap(), LoadReport::default());
    assert_eq!(store3.enabled().len(), 3);
}

fn saved_file() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::new(0, T0);
    let mut store = Store::new(env, MEMORY_MAX_BYTES_DEFAULT);
    for i in 1..=130u64 {
        store.ingest(i, &ops(i, 3)).unwrap();
    }
    store.save(&temp_path(&dir)).unwrap();
    std::fs::read(temp_path(&dir)).unwrap()
}

fn load_bytes(bytes: &[u8], memory_max_bytes: u64) -> Result<LoadReport, LoadError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(temp_path(&dir), bytes).unwrap();
    let mut store = Store::new(TestEnv::new(0, T0), memory_max_bytes);
    let before = store.enabled();
    let r = store.load(&temp_path(&dir));
    if r.is_err() {
        assert_eq!(store.enabled(), before, "a refused file leaves the store as it was");
    }
    r
}

#[test]
fn damaged_files_are_refused() {
    let good = saved_file();
    assert_eq!(load_bytes(&good, MEMORY_MAX_BYTES_DEFAULT).unwrap().minutes, 2 * 3, "two datasets had samples");
    for cut in [0, 7, 63, 64, 65, good.len() / 2, good.len() - 1] {
        assert!(matches!(load_bytes(&good[..cut], MEMORY_MAX_BYTES_DEFAULT), Err(LoadError::Corrupt(_))), "cut at {cut}");
    }
    // every single bit flip (sampled over the file) is caught
    for i in (0..good.len()).step_by(good.len() / 97 + 1) {
        for bit in [0, 3, 7] {
            let mut b = good.clone();
            b[i] ^= 1 << bit;
            assert!(load_bytes(&b, MEMORY_MAX_BYTES_DEFAULT).is_err(), "flip of bit {bit} at {i}");
        }
    }
    let mut long = good.clone();
    long.push(0);
    assert!(load_bytes(&long, MEMORY_MAX_BYTES_DEFAULT).is_err());
    assert!(matches!(load_bytes(b"{\"version\": 1}", MEMORY_MAX_BYTES_DEFAULT), Err(LoadError::Corrupt(_))));
    let mut big = good.clone();
    big.resize(200_000, 0);
    assert!(matches!(load_bytes(&big, 1000), Err(LoadError::TooLarge { bytes: 200_000, .. })));
    // another version, rehashed: refused by its version
    let mut v2 = good.clone();
    v2[8] = 2;
    let hash = {
        let mut h = blake3::Hasher::new();
        h.update(&v2[..32]);
        h.update(&v2[64..]);
        *h.finalize().as_bytes()
    };
    v2[32..64].copy_from_slice(&hash);
    let e = load_bytes(&v2, MEMORY_MAX_BYTES_DEFAULT).unwrap_err().to_string();
    assert!(e.contains("version 2"), "{e}");
}

/// Resealed (valid hash) bodies of random bytes and of a good file with bytes changed:
/// the body's checks must refuse or accept without a panic.
fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    if b.len() < 64 {
        return b;
    }
    let body = (b.len() - 64) as u64;
    b[..8].copy_from_slice(persist::MAGIC);
    b[8..12].copy_from_slice(&persist::VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&64u32.to_le_bytes());
    b[16..24].copy_from_slice(&body.to_le_bytes());
    let mut h = blake3::Hasher::new();
    h.update(&b[..32]);
    h.update(&b[64..]);
    let hash = *h.finalize().as_bytes();
    b[32..64].copy_from_slice(&hash);
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_files_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..3000), sealed in any::<bool>()) {
        let b = if sealed { reseal(bytes) } else { bytes };
        let _ = load_bytes(&b, MEMORY_MAX_BYTES_DEFAULT);
    }

    #[test]
    fn changed_good_files_never_panic(changes in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut b = GOOD.with(|g| g.clone());
        for (at, v) in changes {
            let i = 64 + at % (b.len() - 64);
            b[i] = v;
        }
        let _ = load_bytes(&reseal(b), MEMORY_MAX_BYTES_DEFAULT);
    }
}

thread_local! {
    static GOOD: Vec<u8> = saved_file();
}

#[test]
fn filter_patterns_expand_to_the_matching_keys() {
    assert!(query::glob_match("tank/v1:*", "tank/v1:read"));
    assert!(query::glob_match("*:read", "tank/v1:read"));
    assert!(query::glob_match("a*b*c", "a-b-c"));
    assert!(!query::glob_match("tank/v1:*", "tank/v10"));
    assert!(!query::glob_match("a*b*c", "a-c"));
    assert!(query::glob_match("exact", "exact") && !query::glob_match("exact", "exactly"));
    let env = TestEnv::new(100, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    store.set_enabled("io.ops/volume+op", true).unwrap();
    let mut s = Sample::default();
    for (k, n) in [("tank/v1:read", 5), ("tank/v1:write", 7), ("tank/v10:read", 9), ("pool/x:read", 1)] {
        s.add("io.ops/volume+op", k, Value::Counter(n));
    }
    store.ingest(101, &s).unwrap();
    env.set(101, T0 + 1);
    let a = query(&store, "io.ops/volume+op", T0, T0 + 1, 1, &["tank/v1:*"]);
    assert_eq!(a.series.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(), ["tank/v1:write", "tank/v1:read"], "matches, busiest first");
    let b = query(&store, "io.ops/volume+op", T0, T0 + 1, 1, &["*:read", "none:flush"]);
    assert_eq!(b.series.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(), ["none:flush", "tank/v10:read", "tank/v1:read", "pool/x:read"]);
}

#[test]
fn a_file_saved_under_a_clock_far_ahead_is_refused() {
    let good = saved_file(); // newest minute T0 + 180
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(temp_path(&dir), &good).unwrap();
    // an hour behind: the time axis moves past the file
    let mut store = Store::new(TestEnv::new(0, T0 - 3600), MEMORY_MAX_BYTES_DEFAULT);
    assert!(store.load(&temp_path(&dir)).unwrap().clock_shift_s > 3600);
    // a day and more behind (the file came from a clock set ahead): refused, the store
    // keeps its own time
    let env = TestEnv::new(0, T0 - CLOCK_BEHIND_MAX_S - 3600);
    let mut store = Store::new(env, MEMORY_MAX_BYTES_DEFAULT);
    let before = store.now_unix_s();
    assert!(matches!(store.load(&temp_path(&dir)), Err(LoadError::Corrupt(m)) if m.contains("ahead of the clock")));
    assert_eq!(store.now_unix_s(), before);
}

#[test]
fn a_filter_counts_distinct_keys_and_stops_at_the_limit() {
    let store = Store::new(TestEnv::new(0, T0), MEMORY_MAX_BYTES_DEFAULT);
    let q = |filter: Vec<String>| store.query(&Query { dataset: "io.ops/op".into(), from: Some(T0 - 60), to: Some(T0), resolution: Some(1), filter });
    let same: Vec<String> = vec!["read".to_string(); 10_000];
    assert_eq!(q(same).unwrap().series.len(), 1, "repeats of one key are one key");
    let many: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
    assert!(matches!(q(many), Err(AnalyticsError::BadQuery(m)) if m.contains("more than 64")));
    let limit: Vec<String> = (0..QUERY_KEYS_MAX).map(|i| format!("k{i}")).collect();
    assert_eq!(q(limit).unwrap().series.len(), QUERY_KEYS_MAX);
}

#[test]
fn a_restart_within_the_saved_minute_keeps_the_wall_clock() {
    // Goal: a daemon stopped and started again within a minute (the minute being summed
    // is saved with its end, still ahead) goes on with the wall clock: no shift, that
    // minute's seconds from before and after the restart in one point, and restarts in
    // a loop never move the time axis ahead.
    let dir = tempfile::tempdir().unwrap();
    let path = temp_path(&dir);
    let env = TestEnv::new(100, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    for i in 1..=70u64 {
        env.set(100 + i, T0 + i);
        store.ingest(100 + i, &ops(1, 0)).unwrap();
    }
    store.save(&path).unwrap(); // minute T0+60 done, T0+120 holds seconds 61..=70
    let mut mono = 7;
    let mut unix = T0 + 75;
    for restart in 0..3 {
        let env2 = TestEnv::new(mono, unix);
        let mut store2 = Store::new(env2.clone(), MEMORY_MAX_BYTES_DEFAULT);
        let report = store2.load(&path).unwrap();
        assert_eq!((restart, report.clock_shift_s), (restart, 0));
        assert_eq!(store2.now_unix_s(), unix, "restart {restart}: the time axis is the wall clock");
        assert!(matches!(store2.ingest(mono, &ops(9, 0)), Err(AnalyticsError::OutOfOrder { .. })), "a second before the restart");
        for _ in 0..3 {
            mono += 1;
            unix += 1;
            env2.set(mono, unix);
            store2.ingest(mono, &ops(3, 0)).unwrap();
        }
        assert_eq!(store2.latest("io.ops/op").unwrap().unwrap().0, unix);
        // a query up to now (within the minute) answers the minute being summed
        let now_q = query(&store2, "io.ops/op", T0, unix, 60, &[]);
        assert_eq!(now_q.times, [T0 + 60, T0 + 120], "restart {restart}: the minute in progress is in a query to now");
        let m = query(&store2, "io.ops/op", T0, T0 + 120, 60, &[]);
        assert_eq!(m.times, [T0 + 60, T0 + 120]);
        let after = 3 * (restart + 1) as u64;
        assert_eq!(series(&m, "read").values[0], Some(1.0));
        assert_eq!(series(&m, "read").values[1], Some((10 + 3 * after) as f64 / (10 + after) as f64), "restart {restart}");
        store2.save(&path).unwrap();
        mono += 2;
        unix += 2;
    }
    // the wall clock an hour behind: new seconds still come after the saved minute
    let env3 = TestEnv::new(5, T0 - 3600);
    let mut store3 = Store::new(env3, MEMORY_MAX_BYTES_DEFAULT);
    assert_eq!(store3.load(&path).unwrap().clock_shift_s, T0 + 120 + 1 - (T0 - 3600));
}

#[test]
fn the_default_resolution_fits_the_range() {
    // Goal: a query that names no resolution is answered: per second when its range
    // starts within the last hour and fits 3600 points, else per minute (a client
    // whose clock is a second ahead asks for the last hour as now-3600..now+1).
    let env = TestEnv::new(0, T0);
    let mut store = Store::new(env.clone(), MEMORY_MAX_BYTES_DEFAULT);
    for i in 1..=10u64 {
        env.set(i, T0 + i);
        store.ingest(i, &ops(i, 0)).unwrap();
    }
    let now = store.now_unix_s();
    let ask = |from: u64, to: u64| store.query(&Query { dataset: "io.ops/op".into(), from: Some(from), to: Some(to), ..Query::default() });
    assert_eq!(ask(now - 3600, now).unwrap().resolution, 1);
    assert_eq!(ask(now - 3600, now + 1).unwrap().resolution, 60);
    assert_eq!(ask(now - 100, now + 4000).unwrap().resolution, 60);
    assert_eq!(ask(now - 7200, now).unwrap().resolution, 60);
    assert!(store.query(&Query { dataset: "io.ops/op".into(), from: Some(now - 3600), to: Some(now + 1), resolution: Some(1), ..Query::default() }).is_err(), "asked for: refused");
}
