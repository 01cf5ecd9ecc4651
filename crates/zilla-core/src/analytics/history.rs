//! One dataset's history: a ring of per-second points, a ring of per-minute points,
//! the minute being summed, and the table of the breakdown keys the points name.
//!
//! A point is stored encoded (all integers LEB128 varints):
//!
//! ```text
//!   seconds        1 for a second; 1..=60 for a minute (seconds that had a sample)
//!   n              series in the point, <= 65 (64 keys + `other`)
//!   n x series     in ascending key id, each:
//!     key id       < KEY_TABLE_MAX (index into the dataset's key table)
//!     counter:     value (events or bytes in the interval) > 0
//!     histogram:   m (1..=98) pairs of bucket (one byte, ascending, < 98) and
//!                  count (events in the interval, 1..=u32::MAX)
//! ```
//!
//! A point never exceeds its dataset's `point_bytes_max`: the encoder keeps the busiest
//! keys and sums the rest into `other` until it fits (one histogram with every bucket
//! always fits), so the rings' memory has a bound, stated before a dataset is enabled.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::buckets::BUCKETS;
use super::catalog::{DatasetId, Kind, KEYS_PER_POINT_MAX, OTHER_KEY};

/// Per-second points kept (one hour).
pub const SECOND_POINTS: usize = 3600;
/// Per-minute points kept (seven days).
pub const MINUTE_POINTS: usize = 10080;
/// Distinct keys a dataset's points can name at once; a key beyond them is summed
/// into `other` until old points that named other keys have aged out.
pub const KEY_TABLE_MAX: usize = 512;
/// Longest key kept (longer ones are summed into `other`).
pub const KEY_BYTES_MAX: usize = 255;
/// Most keys the minute being summed holds (the rest go into `other`).
const ACC_KEYS_MAX: usize = 2 * KEYS_PER_POINT_MAX;
/// The key id of `other` (always present, never freed).
const OTHER_ID: u16 = 0;

/// Largest point header: seconds (<= 60) and series count (<= 65), one byte each.
pub const POINT_HEADER_BYTES_MAX: usize = 2;
/// Largest counter series: key id (2 bytes below 16384) and a u64 varint.
pub const COUNTER_SERIES_BYTES_MAX: usize = 2 + 10;
/// Largest histogram series: key id, pair count, 98 pairs of a bucket byte and a
/// u32 varint.
const HISTOGRAM_SERIES_BYTES_MAX: usize = 2 + 1 + BUCKETS * (1 + 5);
/// Smallest histogram point budget: room for one series with every bucket.
pub const HISTOGRAM_POINT_BYTES_MIN: usize = POINT_HEADER_BYTES_MAX + HISTOGRAM_SERIES_BYTES_MAX;

/// Memory charged per stored point beside its bytes (allocator header and rounding).
const POINT_OVERHEAD_BYTES: usize = 16;
/// Memory charged per key beside its bytes (held twice: table and index).
const KEY_OVERHEAD_BYTES: usize = 64;

/// The history bound of a dataset whose points encode to at most `point_bytes_max`.
pub fn memory_max_bytes(point_bytes_max: usize) -> u64 {
    let points = SECOND_POINTS + MINUTE_POINTS;
    let slots = points * std::mem::size_of::<Slot>();
    let blobs = points * (point_bytes_max.next_multiple_of(16) + POINT_OVERHEAD_BYTES);
    let keys = KEY_TABLE_MAX * (2 * KEY_BYTES_MAX + KEY_OVERHEAD_BYTES);
    let acc = (ACC_KEYS_MAX + 1) * acc_series_bytes(Kind::Histogram);
    (slots + blobs + keys + acc + std::mem::size_of::<History>()) as u64
}

fn acc_series_bytes(kind: Kind) -> usize {
    let buckets = if kind == Kind::Histogram { BUCKETS * 4 } else { 0 };
    std::mem::size_of::<Series>() + buckets + 32
}

/// Sparse histogram counts: (bucket, count) pairs, ascending, no zero counts.
pub type SparseBuckets = Vec<(u8, u64)>;
/// A saved key table: (key id, key).
pub(super) type SavedKeys = Vec<(u16, String)>;
/// Saved minute points: (minute end in unix s, encoded point), oldest first.
pub(super) type SavedMinutes = Vec<(u64, Vec<u8>)>;

/// What a collector measured in one second for one key of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Events (or bytes) in the second.
    Counter(u64),
    /// Events in the second per bucket (see `buckets`): sparse (bucket, count) pairs.
    Histogram(Vec<(u8, u64)>),
}

/// One second's measurements: per dataset name, its (key, value) list. A dataset
/// present with an empty list had nothing happen (zero); an enabled dataset missing
/// from the sample gets a hole (nothing collected) at that second.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub datasets: Vec<(String, Vec<(String, Value)>)>,
}

impl Sample {
    /// Add one key's value to `dataset`.
    pub fn add(&mut self, dataset: &str, key: &str, value: Value) {
        match self.datasets.iter_mut().find(|(d, _)| d == dataset) {
            Some((_, list)) => list.push((key.to_string(), value)),
            None => self.datasets.push((dataset.to_string(), vec![(key.to_string(), value)])),
        }
    }

    /// Mark `dataset` as collected this second, even if nothing happened.
    pub fn touch(&mut self, dataset: &str) {
        if !self.datasets.iter().any(|(d, _)| d == dataset) {
            self.datasets.push((dataset.to_string(), Vec::new()));
        }
    }

    /// This sample's events spread evenly over `seconds` seconds (a collector that woke
    /// late took that many seconds' sums at once), oldest first. Every value is a
    /// count of events, so the parts add up exactly to the whole: part `i` of `n`
    /// takes `v / n`, plus one of the remainder for the first `v % n` parts.
    pub fn split(&self, seconds: u64) -> Vec<Sample> {
        let n = seconds.max(1);
        let part = |i| Sample {
            datasets: self.datasets.iter().map(|(name, list)| (name.clone(), list.iter().map(|(k, v)| (k.clone(), v.share(i, n))).collect())).collect(),
        };
        (0..n).map(part).collect()
    }
}

impl Value {
    /// Part `i` of this count split into `n` (see [`Sample::split`]); a histogram
    /// keeps only its buckets with a count in that part.
    fn share(&self, i: u64, n: u64) -> Value {
        let share = |v: u64| v / n + u64::from(i < v % n);
        match self {
            Value::Counter(v) => Value::Counter(share(*v)),
            Value::Histogram(b) => Value::Histogram(b.iter().map(|&(bucket, c)| (bucket, share(c))).filter(|&(_, c)| c > 0).collect()),
        }
    }
}

/// A decoded series: a key id, its total (counter value, or histogram events) and,
/// for a histogram, the count of every bucket (dense, `BUCKETS` long).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Series {
    pub key: u16,
    pub value: u64,
    pub buckets: Vec<u32>,
}

impl Series {
    fn new(key: u16, kind: Kind) -> Series {
        Series { key, value: 0, buckets: if kind == Kind::Histogram { vec![0; BUCKETS] } else { Vec::new() } }
    }

    fn merge(&mut self, other: &Series) {
        self.value = self.value.saturating_add(other.value);
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a = a.saturating_add(*b);
        }
    }

    /// Sparse pairs of the non-empty buckets.
    pub fn pairs(&self) -> Vec<(u8, u64)> {
        self.buckets.iter().enumerate().filter(|(_, c)| **c > 0).map(|(b, c)| (b as u8, *c as u64)).collect()
    }
}

/// A decoded point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Point {
    pub seconds: u32,
    pub series: Vec<Series>,
}

// ------------------------------------------------------------------------------------
// Encoding
// ------------------------------------------------------------------------------------

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        let bits = (byte & 0x7f) as u64;
        if shift == 63 && bits > 1 {
            return None;
        }
        v |= bits << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Encode `series` (distinct keys, ascending) of a point of `seconds`.
fn encode(kind: Kind, seconds: u32, series: &[Series]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, seconds as u64);
    put_varint(&mut out, series.len() as u64);
    for s in series {
        put_varint(&mut out, s.key as u64);
        match kind {
            Kind::Counter => put_varint(&mut out, s.value),
            Kind::Histogram => {
                let pairs = s.pairs();
                put_varint(&mut out, pairs.len() as u64);
                for (b, c) in pairs {
                    out.push(b);
                    put_varint(&mut out, c);
                }
            }
        }
    }
    out
}

/// Decode and check a point; None for anything that is not a well-formed point whose
/// key ids pass `key_ok`.
pub(super) fn decode(kind: Kind, b: &[u8], key_ok: impl Fn(u16) -> bool) -> Option<Point> {
    let mut pos = 0;
    let seconds = get_varint(b, &mut pos)?;
    let n = get_varint(b, &mut pos)?;
    if !(1..=60).contains(&seconds) || n > KEYS_PER_POINT_MAX as u64 + 1 {
        return None;
    }
    let mut series: Vec<Series> = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let key = get_varint(b, &mut pos)?;
        if key >= KEY_TABLE_MAX as u64 || !key_ok(key as u16) || series.last().is_some_and(|s| s.key as u64 >= key) {
            return None;
        }
        let mut s = Series::new(key as u16, kind);
        match kind {
            Kind::Counter => s.value = get_varint(b, &mut pos).filter(|v| *v > 0)?,
            Kind::Histogram => decode_pairs(b, &mut pos, &mut s)?,
        }
        series.push(s);
    }
    (pos == b.len()).then_some(Point { seconds: seconds as u32, series })
}

fn decode_pairs(b: &[u8], pos: &mut usize, s: &mut Series) -> Option<()> {
    let m = get_varint(b, pos)?;
    if !(1..=BUCKETS as u64).contains(&m) {
        return None;
    }
    let mut last: Option<u8> = None;
    for _ in 0..m {
        let bucket = *b.get(*pos)?;
        *pos += 1;
        let count = get_varint(b, pos)?;
        if bucket as usize >= BUCKETS || last.is_some_and(|l| l >= bucket) || count == 0 || count > u32::MAX as u64 {
            return None;
        }
        last = Some(bucket);
        s.buckets[bucket as usize] = count as u32;
        s.value += count;
    }
    Some(())
}

/// Encode a point of at most `budget` bytes: empty series dropped, the busiest
/// `KEYS_PER_POINT_MAX` keys kept, the rest summed into `other`, then the least busy
/// kept key moved into `other` while the point is too large.
fn encode_bounded(kind: Kind, seconds: u32, mut series: Vec<Series>, budget: usize) -> Vec<u8> {
    series.retain(|s| s.value > 0);
    series.sort_by(|a, b| b.value.cmp(&a.value).then(a.key.cmp(&b.key)));
    let mut other = Series::new(OTHER_ID, kind);
    let mut kept: Vec<Series> = Vec::with_capacity(series.len().min(KEYS_PER_POINT_MAX));
    for s in series {
        if s.key == OTHER_ID || kept.len() >= KEYS_PER_POINT_MAX {
            other.merge(&s);
        } else {
            kept.push(s);
        }
    }
    // sizes known per series: each move into `other` costs one size computation
    let header = |n: usize| varint_len(seconds as u64) + varint_len(n as u64);
    let mut kept_bytes: usize = kept.iter().map(|s| series_bytes(kind, s)).sum();
    while let Some(least) = kept.last() {
        let other_bytes = if other.value > 0 { series_bytes(kind, &other) } else { 0 };
        let n = kept.len() + usize::from(other.value > 0);
        if header(n) + kept_bytes + other_bytes <= budget {
            break;
        }
        kept_bytes -= series_bytes(kind, least);
        other.merge(least);
        kept.pop();
    }
    if other.value > 0 {
        kept.push(other);
    }
    kept.sort_by_key(|s| s.key);
    encode(kind, seconds, &kept)
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// The encoded size of one series (see `encode`).
fn series_bytes(kind: Kind, s: &Series) -> usize {
    varint_len(s.key as u64)
        + match kind {
            Kind::Counter => varint_len(s.value),
            Kind::Histogram => {
                let pairs = s.buckets.iter().filter(|c| **c > 0);
                varint_len(pairs.clone().count() as u64) + pairs.map(|c| 1 + varint_len(*c as u64)).sum::<usize>()
            }
        }
}

// ------------------------------------------------------------------------------------
// The key table
// ------------------------------------------------------------------------------------

/// The keys points name, by id, with how many stored points name each.
#[derive(Debug)]
struct KeyTable {
    names: Vec<Option<Box<str>>>,
    refs: Vec<u32>,
    index: HashMap<Box<str>, u16>,
    free: Vec<u16>,
    bytes: usize,
}

impl KeyTable {
    fn new() -> KeyTable {
        let mut t = KeyTable { names: Vec::new(), refs: Vec::new(), index: HashMap::new(), free: Vec::new(), bytes: 0 };
        t.insert_at(OTHER_ID, OTHER_KEY);
        t
    }

    fn insert_at(&mut self, id: u16, key: &str) {
        let i = id as usize;
        if self.names.len() <= i {
            self.names.resize(i + 1, None);
            self.refs.resize(i + 1, 0);
        }
        self.names[i] = Some(key.into());
        self.index.insert(key.into(), id);
        self.bytes += 2 * key.len() + KEY_OVERHEAD_BYTES;
    }

    /// The id of `key`, added if new; `other`'s when the key is too long or the table
    /// is full.
    fn intern(&mut self, key: &str) -> u16 {
        if let Some(id) = self.index.get(key) {
            return *id;
        }
        if key.len() > KEY_BYTES_MAX {
            return OTHER_ID;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None if self.names.len() < KEY_TABLE_MAX => self.names.len() as u16,
            None => return OTHER_ID,
        };
        self.insert_at(id, key);
        id
    }

    fn name(&self, id: u16) -> &str {
        self.names.get(id as usize).and_then(|n| n.as_deref()).unwrap_or(OTHER_KEY)
    }

    fn live(&self, id: u16) -> bool {
        self.names.get(id as usize).is_some_and(|n| n.is_some())
    }

    fn retain(&mut self, point: &Point) {
        for s in &point.series {
            self.refs[s.key as usize] += 1;
        }
    }

    fn release(&mut self, point: &Point) {
        for s in &point.series {
            self.refs[s.key as usize] = self.refs[s.key as usize].saturating_sub(1);
            self.free_if_unused(s.key);
        }
    }

    fn free_if_unused(&mut self, id: u16) {
        if id == OTHER_ID || self.refs.get(id as usize) != Some(&0) {
            return;
        }
        if let Some(name) = self.names[id as usize].take() {
            self.index.remove(&name);
            self.bytes -= 2 * name.len() + KEY_OVERHEAD_BYTES;
            self.free.push(id);
        }
    }
}

// ------------------------------------------------------------------------------------
// Rings
// ------------------------------------------------------------------------------------

/// A ring slot: the end of its interval (unix s) and its point (None: empty).
#[derive(Debug, Default)]
struct Slot {
    time: u64,
    point: Option<Box<[u8]>>,
}

fn blob_bytes(len: usize) -> usize {
    len.next_multiple_of(16) + POINT_OVERHEAD_BYTES
}

#[derive(Debug)]
struct Ring {
    slots: Vec<Slot>,
    step_s: u64,
    blob_bytes: usize,
}

impl Ring {
    fn new(points: usize, step_s: u64) -> Ring {
        Ring { slots: (0..points).map(|_| Slot::default()).collect(), step_s, blob_bytes: 0 }
    }

    fn index(&self, time: u64) -> usize {
        ((time / self.step_s) % self.slots.len() as u64) as usize
    }

    fn get(&self, time: u64) -> Option<&[u8]> {
        let slot = &self.slots[self.index(time)];
        if slot.time == time { slot.point.as_deref() } else { None }
    }

    /// Put `point` at `time`; the point it replaces is returned.
    fn put(&mut self, time: u64, point: Box<[u8]>) -> Option<Box<[u8]>> {
        self.blob_bytes += blob_bytes(point.len());
        let i = self.index(time);
        let slot = &mut self.slots[i];
        slot.time = time;
        let old = slot.point.replace(point);
        if let Some(o) = &old {
            self.blob_bytes -= blob_bytes(o.len());
        }
        old
    }

    fn memory_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>() + self.blob_bytes
    }
}

/// The end (unix s) of the minute second `s` belongs to: a second point at `s` covers
/// `[s-1, s)`, a minute point at `m` covers `[m-60, m)`.
pub fn minute_end(s: u64) -> u64 {
    s.div_ceil(60).saturating_mul(60)
}

// ------------------------------------------------------------------------------------
// History
// ------------------------------------------------------------------------------------

/// The minute being summed.
#[derive(Debug)]
struct Acc {
    minute_end: u64,
    seconds: u32,
    series: BTreeMap<u16, Series>,
}

/// One enabled dataset's history.
#[derive(Debug)]
pub(super) struct History {
    pub id: DatasetId,
    kind: Kind,
    point_bytes_max: usize,
    keys: KeyTable,
    seconds: Ring,
    minutes: Ring,
    acc: Option<Acc>,
}

impl History {
    pub fn new(id: DatasetId) -> History {
        History {
            id,
            kind: id.kind(),
            point_bytes_max: id.point_bytes_max(),
            keys: KeyTable::new(),
            seconds: Ring::new(SECOND_POINTS, 1),
            minutes: Ring::new(MINUTE_POINTS, 60),
            acc: None,
        }
    }

    /// Memory the history takes now (the same accounting as [`memory_max_bytes`]).
    pub fn memory_bytes(&self) -> u64 {
        let acc = self.acc.as_ref().map_or(0, |a| a.series.len() * acc_series_bytes(self.kind));
        (self.seconds.memory_bytes() + self.minutes.memory_bytes() + self.keys.bytes + acc + std::mem::size_of::<History>()) as u64
    }

    /// Record the second ending at `time` (unix s, after every second recorded before).
    pub fn ingest(&mut self, time: u64, input: &[(String, Value)]) {
        if self.acc.as_ref().is_some_and(|a| a.minute_end != minute_end(time)) {
            self.finish_minute();
        }
        let mut series: BTreeMap<u16, Series> = BTreeMap::new();
        let mut fresh = Vec::new();
        for (key, value) in input {
            let known = self.keys.index.contains_key(key.as_str());
            let id = self.keys.intern(key);
            if !known && id != OTHER_ID {
                fresh.push(id);
            }
            let s = series.entry(id).or_insert_with(|| Series::new(id, self.kind));
            add_value(s, value);
        }
        let blob = encode_bounded(self.kind, 1, series.into_values().collect(), self.point_bytes_max);
        if let Some(point) = self.store(time, blob, false) {
            self.add_to_minute(time, &point);
        }
        for id in fresh {
            self.keys.free_if_unused(id);
        }
    }

    /// Put an encoded point into a ring, keeping the key references right; the decoded
    /// point, or None if it broke the size bound (not stored: a hole).
    fn store(&mut self, time: u64, blob: Vec<u8>, minute: bool) -> Option<Point> {
        let point = decode(self.kind, &blob, |id| self.keys.live(id));
        let Some(point) = point.filter(|_| blob.len() <= self.point_bytes_max) else {
            tracing::error!("analytics {}: a point of {} bytes (bound {}) was not stored", self.id.name(), blob.len(), self.point_bytes_max);
            return None;
        };
        self.keys.retain(&point);
        let ring = if minute { &mut self.minutes } else { &mut self.seconds };
        if let Some(old) = ring.put(time, blob.into_boxed_slice()) {
            if let Some(old) = decode(self.kind, &old, |_| true) {
                self.keys.release(&old);
            }
        }
        Some(point)
    }

    fn add_to_minute(&mut self, time: u64, point: &Point) {
        let kind = self.kind;
        let acc = self.acc.get_or_insert_with(|| Acc { minute_end: minute_end(time), seconds: 0, series: BTreeMap::new() });
        acc.seconds += 1;
        for s in &point.series {
            let key = if acc.series.len() >= ACC_KEYS_MAX && !acc.series.contains_key(&s.key) { OTHER_ID } else { s.key };
            acc.series.entry(key).or_insert_with(|| Series::new(key, kind)).merge(s);
        }
    }

    /// The minute being summed as an encoded point (None if no second yet).
    fn minute_in_progress(&self) -> Option<(u64, Vec<u8>)> {
        let acc = self.acc.as_ref()?;
        let series = acc.series.values().cloned().collect();
        Some((acc.minute_end, encode_bounded(self.kind, acc.seconds, series, self.point_bytes_max)))
    }

    fn finish_minute(&mut self) {
        if let Some((time, blob)) = self.minute_in_progress() {
            self.store(time, blob, true);
        }
        self.acc = None;
    }

    /// The saved minute ending at `minute_end` can take `seconds_to_come` more seconds
    /// (a minute point holds at most 60); true when there is no such point.
    pub fn can_resume_minute(&self, minute_end: u64, seconds_to_come: u64) -> bool {
        match self.minutes.get(minute_end).and_then(|b| decode(self.kind, b, |id| self.keys.live(id))) {
            Some(p) => u64::from(p.seconds) + seconds_to_come <= 60,
            None => true,
        }
    }

    /// Go on summing the saved minute ending at `minute_end` (a restart within it): its
    /// point becomes the minute being summed. The point stays in the minute ring, holding
    /// its keys, until the minute is finished and replaces it.
    pub fn resume_minute(&mut self, minute_end: u64) {
        let Some(p) = self.minutes.get(minute_end).and_then(|b| decode(self.kind, b, |id| self.keys.live(id))) else { return };
        let series = p.series.into_iter().map(|s| (s.key, s)).collect();
        self.acc = Some(Acc { minute_end, seconds: p.seconds, series });
    }

    /// The point at `time` of resolution `step_s` (1 or 60), the minute being summed
    /// included.
    pub fn point(&self, time: u64, step_s: u64) -> Option<Point> {
        let blob;
        let in_progress = self.acc.as_ref().is_some_and(|a| a.minute_end == time);
        let bytes = match step_s {
            1 => self.seconds.get(time)?,
            _ if in_progress => {
                blob = self.minute_in_progress()?.1;
                &blob
            }
            _ => self.minutes.get(time)?,
        };
        decode(self.kind, bytes, |id| self.keys.live(id))
    }

    pub fn key_name(&self, id: u16) -> &str {
        self.keys.name(id)
    }

    /// The newest minute point's end (the minute being summed included), if any.
    pub fn newest_minute(&self) -> Option<u64> {
        let stored = self.minutes.slots.iter().filter(|s| s.point.is_some()).map(|s| s.time).max();
        stored.max(self.acc.as_ref().map(|a| a.minute_end))
    }

    /// Every minute point, oldest first (the minute being summed last), and the keys
    /// they name: what is saved.
    pub fn export_minutes(&self) -> (SavedKeys, SavedMinutes) {
        // a resumed minute's saved point is still in the ring: the one in progress replaces it
        let in_progress = self.acc.as_ref().map(|a| a.minute_end);
        let mut minutes: SavedMinutes = self
            .minutes
            .slots
            .iter()
            .filter(|s| Some(s.time) != in_progress)
            .filter_map(|s| Some((s.time, s.point.as_deref()?.to_vec())))
            .collect();
        minutes.sort_by_key(|m| m.0);
        minutes.extend(self.minute_in_progress());
        let keys = self.keys.names.iter().enumerate().filter_map(|(i, n)| Some((i as u16, n.as_deref()?.to_string()))).collect();
        (keys, minutes)
    }

    /// A history holding saved minutes. Each minute must be a well-formed point within
    /// the dataset's bound naming only the given keys, times strictly increasing
    /// multiples of 60; an error says what is wrong.
    pub fn import_minutes(id: DatasetId, keys: &[(u16, String)], minutes: SavedMinutes) -> Result<History, String> {
        let mut h = History::new(id);
        for (kid, name) in keys {
            if *kid == OTHER_ID {
                if name != OTHER_KEY {
                    return Err(format!("key 0 is {name:?}, not `{OTHER_KEY}`"));
                }
                continue;
            }
            let taken = h.keys.live(*kid) || h.keys.index.contains_key(name.as_str());
            if *kid as usize >= KEY_TABLE_MAX || name.len() > KEY_BYTES_MAX || taken {
                return Err(format!("key {kid} ({} bytes) is out of range or named twice", name.len()));
            }
            h.keys.insert_at(*kid, name);
        }
        h.keys.free = (1..h.keys.names.len() as u16).filter(|i| !h.keys.live(*i)).collect();
        let mut last = 0;
        for (time, blob) in minutes {
            if time % 60 != 0 || time <= last || blob.len() > h.point_bytes_max {
                return Err(format!("minute {time} is out of order or over the size bound ({} bytes)", blob.len()));
            }
            last = time;
            h.store(time, blob, true).ok_or_else(|| format!("minute {time} is not a well-formed point"))?;
        }
        for i in 0..h.keys.names.len() as u16 {
            h.keys.free_if_unused(i);
        }
        Ok(h)
    }
}

fn add_value(s: &mut Series, value: &Value) {
    match value {
        Value::Counter(v) if s.buckets.is_empty() => s.value = s.value.saturating_add(*v),
        Value::Histogram(pairs) if !s.buckets.is_empty() => {
            for (b, c) in pairs.iter().filter(|(b, _)| (*b as usize) < BUCKETS) {
                let count = &mut s.buckets[*b as usize];
                *count = count.saturating_add((*c).min(u32::MAX as u64) as u32);
            }
            s.value = s.buckets.iter().map(|c| *c as u64).sum();
        }
        _ => {} // the other kind than the dataset's: not this dataset's value
    }
}

/// The series of a query or live answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuerySeries {
    pub key: String,
    /// Counter: per-second rate; histogram: events per second. At resolution 60, the
    /// average over the seconds of the minute that were collected. None (null) where
    /// nothing was collected.
    pub values: Vec<Option<f64>>,
    /// Histogram only: per time, the sparse (bucket, events in the interval) pairs
    /// (None where nothing was collected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<Option<SparseBuckets>>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hist(pairs: &[(u8, u64)]) -> Value {
        Value::Histogram(pairs.to_vec())
    }

    proptest! {
        /// A late collector's sample spread over its seconds: the parts add up to the
        /// whole for every key and bucket, and no two parts differ by more than one.
        #[test]
        fn a_split_sample_adds_up_to_the_whole(v in 0u64..10_000, c in 1u64..500, seconds in 0u64..70) {
            let mut whole = Sample::default();
            whole.add("io.ops/op", "read", Value::Counter(v));
            whole.add("io.latency/op", "read", hist(&[(3, c), (9, v)]));
            whole.touch("txg.syncs/none");
            let parts = whole.split(seconds);
            prop_assert_eq!(parts.len() as u64, seconds.max(1));
            let counter = |s: &Sample| match &s.datasets[0].1[0].1 { Value::Counter(x) => *x, _ => unreachable!() };
            let bucket = |s: &Sample, b: u8| match &s.datasets[1].1[0].1 {
                Value::Histogram(h) => h.iter().filter(|e| e.0 == b).map(|e| e.1).sum::<u64>(),
                _ => unreachable!(),
            };
            prop_assert_eq!(parts.iter().map(counter).sum::<u64>(), v);
            prop_assert_eq!(parts.iter().map(|p| bucket(p, 3)).sum::<u64>(), c);
            prop_assert_eq!(parts.iter().map(|p| bucket(p, 9)).sum::<u64>(), v);
            let (lo, hi) = (parts.iter().map(counter).min().unwrap(), parts.iter().map(counter).max().unwrap());
            prop_assert!(hi - lo <= 1, "{} .. {}", lo, hi);
            prop_assert!(parts.iter().all(|p| p.datasets.len() == 3 && p.datasets[2].1.is_empty()), "a touched dataset stays touched");
        }
    }

    #[test]
    fn varints_round_trip_and_refuse_overlong() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut pos = 0;
            assert_eq!(get_varint(&b, &mut pos), Some(v));
            assert_eq!(pos, b.len());
            assert_eq!(varint_len(v), b.len());
        }
        let mut pos = 0;
        assert_eq!(get_varint(&[0xff; 11], &mut pos), None);
        let mut pos = 0;
        assert_eq!(get_varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], &mut pos), None);
    }

    #[test]
    fn a_full_histogram_fits_the_smallest_budget() {
        let mut s = Series::new(7, Kind::Histogram);
        s.buckets.iter_mut().for_each(|c| *c = u32::MAX);
        s.value = u64::MAX;
        let b = encode(Kind::Histogram, 60, &[s]);
        assert!(b.len() <= HISTOGRAM_POINT_BYTES_MIN, "{} > {}", b.len(), HISTOGRAM_POINT_BYTES_MIN);
        let wide = Series { key: 500, value: u64::MAX, buckets: vec![] };
        assert!(encode(Kind::Counter, 60, &[wide]).len() <= POINT_HEADER_BYTES_MAX + COUNTER_SERIES_BYTES_MAX);
    }

    #[test]
    fn over_budget_keys_go_into_other() {
        let id = DatasetId::parse("disk.latency/device").unwrap();
        let mut h = History::new(id);
        // 200 devices, each with 40 buckets: far over any point budget
        let input: Vec<(String, Value)> =
            (0..200u64).map(|d| (format!("tank/mirror-0/d{d}"), hist(&(10..50).map(|b| (b as u8, 1000 + d)).collect::<Vec<_>>()))).collect();
        h.ingest(1000, &input);
        let p = h.point(1000, 1).unwrap();
        assert!(p.series.len() <= KEYS_PER_POINT_MAX + 1);
        let total: u64 = p.series.iter().map(|s| s.value).sum();
        assert_eq!(total, (0..200u64).map(|d| 40 * (1000 + d)).sum::<u64>(), "no event lost");
        let names: Vec<&str> = p.series.iter().map(|s| h.key_name(s.key)).collect();
        assert!(names.contains(&"other") && names.contains(&"tank/mirror-0/d199"), "{names:?}");
        assert!(!names.contains(&"tank/mirror-0/d0"), "the least busy is summed into other");
    }

    #[test]
    fn long_keys_and_keys_past_the_table_go_into_other() {
        let id = DatasetId::parse("io.ops/client").unwrap();
        let mut h = History::new(id);
        let long = "x".repeat(KEY_BYTES_MAX + 1);
        h.ingest(1, &[(long, Value::Counter(5)), ("tcp 192.0.2.7".into(), Value::Counter(3)), ("uid 0".into(), Value::Histogram(vec![(1, 1)]))]);
        let p = h.point(1, 1).unwrap();
        let got: Vec<(&str, u64)> = p.series.iter().map(|s| (h.key_name(s.key), s.value)).collect();
        assert_eq!(got, [("other", 5), ("tcp 192.0.2.7", 3)], "a histogram value for a counter is not this dataset's");
        // 64 new clients a second: the table fills at KEY_TABLE_MAX, later keys count as other
        for sec in 2..=20u64 {
            let input: Vec<(String, Value)> = (0..64).map(|k| (format!("tcp 10.0.{sec}.{k}"), Value::Counter(1))).collect();
            h.ingest(sec, &input);
            let p = h.point(sec, 1).unwrap();
            assert_eq!(p.series.iter().map(|s| s.value).sum::<u64>(), 64, "second {sec}");
        }
        assert_eq!(h.keys.names.len(), KEY_TABLE_MAX);
        let p = h.point(20, 1).unwrap();
        assert_eq!((p.series.len(), h.key_name(p.series[0].key), p.series[0].value), (1, "other", 64));
        // a key whose points aged out is freed and its id reused
        let mut t = KeyTable::new();
        let a = t.intern("a");
        let pt = Point { seconds: 1, series: vec![Series { key: a, value: 1, buckets: vec![] }] };
        t.retain(&pt);
        t.release(&pt);
        assert!(!t.live(a));
        assert_eq!(t.intern("b"), a);
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2000), hist in any::<bool>()) {
            let kind = if hist { Kind::Histogram } else { Kind::Counter };
            let _ = decode(kind, &bytes, |_| true);
        }

        #[test]
        fn encode_bounded_fits_and_round_trips(keys in 1usize..150, buckets in 1usize..98, budget_hist in any::<bool>()) {
            let kind = if budget_hist { Kind::Histogram } else { Kind::Counter };
            let series: Vec<Series> = (0..keys).map(|k| {
                let mut s = Series::new(k as u16, kind);
                match kind {
                    Kind::Counter => s.value = 1 + k as u64 * 1_000_003,
                    Kind::Histogram => { for b in 0..buckets { s.buckets[b] = 1 + k as u32; } s.value = buckets as u64 * (1 + k as u64); }
                }
                s
            }).collect();
            let total: u64 = series.iter().map(|s| s.value).sum();
            let budget = if kind == Kind::Histogram { HISTOGRAM_POINT_BYTES_MIN } else { 64 };
            let whole: usize = POINT_HEADER_BYTES_MAX.min(2) + series.iter().map(|s| series_bytes(kind, s)).sum::<usize>();
            let mut sorted = series.clone();
            sorted.sort_by_key(|s| s.key);
            if keys < 127 {
                prop_assert_eq!(encode(kind, 1, &sorted).len(), whole, "series_bytes agrees with encode");
            }
            let b = encode_bounded(kind, 1, series, budget);
            prop_assert!(b.len() <= budget);
            let p = decode(kind, &b, |_| true).unwrap();
            prop_assert_eq!(p.series.iter().map(|s| s.value).sum::<u64>(), total);
        }
    }
}
