//! space_map: the on-disk log of a metaslab's allocations and frees (format 2).
//!
//! Theory of operation
//! -------------------
//! A top-level vdev's data area is cut into metaslabs (docs/on-disk-format.md §16); its
//! **metaslab array** (a MOS object) names one **space map** object per metaslab that was
//! ever allocated from. A space map is a log: every txg that allocated or freed in the
//! metaslab appends a txg marker and one 16-byte entry per extent, so a txg writes what
//! it changed (the map's last block and the bonus), never the whole map. Loading replays
//! the log into the metaslab's allocated segments ([`Segments`]), checking every entry:
//! an allocation of allocated space, a free of free space, an extent outside the
//! metaslab, a marker whose txg goes backwards, or a total that disagrees with the
//! bonus makes the map corrupt, named with the entry and its value.
//!
//! **Condensing.** A log of a busy metaslab grows without bound while what it describes
//! does not. When the entries pass twice what the allocated segments alone would take
//! (and [`CONDENSE_MIN_BYTES`]), the append is replaced by a rewrite: one marker and one
//! allocated entry per segment of what the map would replay to after this txg. The
//! rewrite is the object's content in that txg, copy on write like any object change:
//! a crash leaves the old log (the txg did not commit) or the new one (it did).
//!
//! **The histogram** of free segments (by power of two of 512-byte units) is kept in
//! the bonus, so a metaslab's fragmentation is known without loading its map.
//!
//! **Bounds.** A map's length is bounded by condensing: at most
//! `max(CONDENSE_MIN_BYTES, 2 × (segments + 1) × 16)` plus one txg's entries; a
//! metaslab holds at most `size / 512 / 2 + 1` segments. Loading reads at most the
//! bonus's length, which must lie within the object's blocks.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dmu::dnode::{ObjectSpec, ObjectType};
use crate::dmu::object_tree::BlockIo;
use crate::dmu::objset::Objset;
use crate::vdev::abd::AlignedBuf;
use crate::{Error, Result, Txg};

/// Bytes of an entry.
pub const ENTRY_BYTES: usize = 16;
/// Data block size of a space map object.
pub const BLOCK_BYTES: u32 = 16 << 10;
/// The unit of offsets and lengths.
pub const UNIT: u64 = 512;
/// The longest extent one entry records, in units (48 bits).
pub const MAX_RUN_UNITS: u64 = (1 << 48) - 1;
/// Bytes of the bonus.
pub const BONUS_BYTES: usize = 272;
/// Histogram buckets.
pub const HISTOGRAM_BUCKETS: usize = 32;
/// A map is not condensed below this length.
pub const CONDENSE_MIN_BYTES: u64 = 64 << 10;
/// Metaslab sizes: `1 << ms_shift`.
pub const MS_SHIFT_MIN: u8 = 24;
pub const MS_SHIFT_MAX: u8 = 34;
/// Most metaslabs per top-level vdev.
pub const MAX_METASLABS: u64 = 1 << 20;
/// About this many metaslabs per vdev (OpenZFS's metaslab_target_count is 200).
pub const METASLABS_TARGET: u64 = 200;
/// Data block size of a metaslab array.
pub const ARRAY_BLOCK_BYTES: u32 = 4096;

const FREED_BIT: u64 = 1 << 62;
const MARKER_BIT: u64 = 1 << 63;
const RESERVED_BITS: u64 = ((1 << 62) - 1) & !MAX_RUN_UNITS;

/// One entry of a space map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Opens the entries of a txg.
    Txg(Txg),
    Alloc { offset: u64, len: u64 },
    Free { offset: u64, len: u64 },
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let (w0, w1) = match *self {
            Entry::Txg(t) => (t.get(), MARKER_BIT),
            Entry::Alloc { offset, len } => (offset, len / UNIT),
            Entry::Free { offset, len } => (offset, FREED_BIT | len / UNIT),
        };
        debug_assert!(!matches!(self, Entry::Alloc { len, offset } | Entry::Free { len, offset } if len % UNIT != 0 || offset % UNIT != 0 || *len == 0 || len / UNIT > MAX_RUN_UNITS));
        let mut b = [0u8; ENTRY_BYTES];
        b[..8].copy_from_slice(&w0.to_le_bytes());
        b[8..].copy_from_slice(&w1.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Entry, String> {
        let w0 = u64::from_le_bytes(b[..8].try_into().expect("16-byte entry"));
        let w1 = u64::from_le_bytes(b[8..16].try_into().expect("16-byte entry"));
        if w1 == MARKER_BIT {
            return if w0 < Txg::LIMIT.get() { Ok(Entry::Txg(Txg(w0))) } else { Err(format!("txg marker {w0:#x} beyond the txg limit")) };
        }
        if w1 & MARKER_BIT != 0 || w1 & RESERVED_BITS != 0 {
            return Err(format!("reserved bits set in word 1 {w1:#018x}"));
        }
        let units = w1 & MAX_RUN_UNITS;
        if units == 0 {
            return Err("an extent of length 0".into());
        }
        if w0 % UNIT != 0 {
            return Err(format!("offset {w0:#x} not a multiple of {UNIT}"));
        }
        let len = units * UNIT;
        Ok(if w1 & FREED_BIT != 0 { Entry::Free { offset: w0, len } } else { Entry::Alloc { offset: w0, len } })
    }
}

/// The allocated segments of a metaslab: start → length, adjacent ones merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    map: BTreeMap<u64, u64>,
    bytes: u64,
}

impl Segments {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(s, l)| (*s, *l))
    }

    /// Whether any byte of `[at, at + len)` is in the set.
    pub fn overlaps(&self, at: u64, len: u64) -> bool {
        let end = at + len;
        if let Some((s, l)) = self.map.range(..end).next_back() {
            return s + l > at;
        }
        false
    }

    /// Add `[at, at + len)`, which must not overlap the set.
    pub fn add(&mut self, at: u64, len: u64) -> std::result::Result<(), String> {
        if len == 0 || self.overlaps(at, len) {
            return Err(format!("[{at:#x}, +{len:#x}) is already allocated"));
        }
        let (mut start, mut end) = (at, at + len);
        if let Some((s, l)) = self.map.range(..at).next_back().map(|(s, l)| (*s, *l)) {
            if s + l == at {
                self.map.remove(&s);
                start = s;
            }
        }
        if let Some(l) = self.map.remove(&end) {
            end += l;
        }
        self.map.insert(start, end - start);
        self.bytes += len;
        Ok(())
    }

    /// Remove `[at, at + len)`, which must lie within one segment.
    pub fn remove(&mut self, at: u64, len: u64) -> std::result::Result<(), String> {
        let end = at + len;
        let hit = self.map.range(..=at).next_back().map(|(s, l)| (*s, *l));
        let Some((s, l)) = hit.filter(|(s, l)| len > 0 && *s <= at && end <= s + l) else {
            return Err(format!("[{at:#x}, +{len:#x}) is not allocated"));
        };
        self.map.remove(&s);
        if s < at {
            self.map.insert(s, at - s);
        }
        if end < s + l {
            self.map.insert(end, s + l - end);
        }
        self.bytes -= len;
        Ok(())
    }

    /// The free-segment histogram of `[start, end)` given these allocated segments.
    pub fn free_histogram(&self, start: u64, end: u64) -> [u64; HISTOGRAM_BUCKETS] {
        let mut h = [0u64; HISTOGRAM_BUCKETS];
        let mut note = |len: u64| {
            if len >= UNIT {
                h[((len / UNIT).ilog2() as usize).min(HISTOGRAM_BUCKETS - 1)] += 1;
            }
        };
        let mut at = start;
        for (s, l) in self.iter() {
            note(s.saturating_sub(at));
            at = s + l;
        }
        note(end.saturating_sub(at));
        h
    }
}

/// A space map's bonus (§16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceMapPhys {
    pub length_bytes: u64,
    pub allocated_bytes: u64,
    pub histogram: [u64; HISTOGRAM_BUCKETS],
}

impl SpaceMapPhys {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BONUS_BYTES);
        b.extend_from_slice(&self.length_bytes.to_le_bytes());
        b.extend_from_slice(&self.allocated_bytes.to_le_bytes());
        self.histogram.iter().for_each(|h| b.extend_from_slice(&h.to_le_bytes()));
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<SpaceMapPhys, String> {
        if b.len() != BONUS_BYTES {
            return Err(format!("space map bonus of {} bytes, not {BONUS_BYTES}", b.len()));
        }
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let length_bytes = w(0);
        if length_bytes % ENTRY_BYTES as u64 != 0 {
            return Err(format!("entries length {length_bytes} not a multiple of {ENTRY_BYTES}"));
        }
        let mut histogram = [0u64; HISTOGRAM_BUCKETS];
        for (i, h) in histogram.iter_mut().enumerate() {
            *h = w(2 + i);
        }
        Ok(SpaceMapPhys { length_bytes, allocated_bytes: w(1), histogram })
    }
}

/// One metaslab's place in its vdev: `[start, start + size)` of the data area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaslabRange {
    pub start: u64,
    pub size: u64,
}

impl MetaslabRange {
    fn check(&self, offset: u64, len: u64) -> std::result::Result<(), String> {
        let end = offset.checked_add(len).ok_or("extent wraps")?;
        if offset < self.start || end > self.start + self.size {
            return Err(format!("extent [{offset:#x}, +{len:#x}) lies outside the metaslab [{:#x}, +{:#x})", self.start, self.size));
        }
        Ok(())
    }
}

/// Replay `entries` onto `segments`. The error names the entry's index and value.
pub fn replay(entries: &[u8], ms: MetaslabRange, segments: &mut Segments, last_txg: &mut Txg) -> std::result::Result<(), String> {
    for (i, e) in entries.chunks_exact(ENTRY_BYTES).enumerate() {
        let fail = |why: String| format!("entry {i} ({}): {why}", hex(e));
        match Entry::decode(e).map_err(fail)? {
            Entry::Txg(t) => {
                if t < *last_txg {
                    return Err(fail(format!("txg {} after txg {}", t.get(), last_txg.get())));
                }
                *last_txg = t;
            }
            Entry::Alloc { offset, len } => {
                ms.check(offset, len).map_err(fail)?;
                segments.add(offset, len).map_err(|w| fail(format!("allocation: {w}")))?;
            }
            Entry::Free { offset, len } => {
                ms.check(offset, len).map_err(fail)?;
                segments.remove(offset, len).map_err(|w| fail(format!("free: {w}")))?;
            }
        }
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether a map of `length_bytes` describing `segments` segments is to be rewritten.
pub fn needs_condense(length_bytes: u64, segments: usize) -> bool {
    let condensed = (segments as u64 + 1) * ENTRY_BYTES as u64;
    length_bytes > CONDENSE_MIN_BYTES && length_bytes > 2 * condensed
}

/// Entries of a whole extent list, split at [`MAX_RUN_UNITS`].
fn push_extents(out: &mut Vec<u8>, extents: impl Iterator<Item = (u64, u64)>, freed: bool) {
    for (mut at, mut len) in extents {
        while len > 0 {
            let run = len.min(MAX_RUN_UNITS * UNIT);
            let e = if freed { Entry::Free { offset: at, len: run } } else { Entry::Alloc { offset: at, len: run } };
            out.extend_from_slice(&e.encode());
            at += run;
            len -= run;
        }
    }
}

/// A space map object in the MOS.
pub struct SpaceMap<'a> {
    pub mos: &'a Objset,
    pub io: &'a dyn BlockIo,
    pub object: u64,
}

/// What one txg changed in a metaslab, net: `allocs` were free before the txg and are
/// allocated after it, `frees` the reverse (so the two are disjoint, and an extent
/// allocated and freed within the txg is in neither).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TxgDelta {
    pub allocs: Vec<(u64, u64)>,
    pub frees: Vec<(u64, u64)>,
}

impl TxgDelta {
    pub fn is_empty(&self) -> bool {
        self.allocs.is_empty() && self.frees.is_empty()
    }

    /// The net change from `before` to `after`.
    pub fn between(before: &Segments, after: &Segments) -> TxgDelta {
        TxgDelta { allocs: difference(after, before), frees: difference(before, after) }
    }
}

impl Segments {
    /// Take the parts of `[at, at + len)` that are in the set out of it; they are
    /// returned in order.
    pub fn take_overlap(&mut self, at: u64, len: u64) -> Vec<(u64, u64)> {
        let end = at + len;
        let first = self.map.range(..at).next_back().filter(|(s, l)| *s + *l > at).map_or(at, |(s, _)| *s);
        let hits: Vec<(u64, u64)> = self.map.range(first..end).map(|(s, l)| (*s, *l)).collect();
        let mut out = Vec::with_capacity(hits.len());
        for (s, l) in hits {
            let (a, b) = (s.max(at), (s + l).min(end));
            if a < b {
                self.remove(a, b - a).expect("a part of a segment");
                out.push((a, b - a));
            }
        }
        out
    }
}

/// The gaps of `[at, at + len)` between `taken` (sorted parts of it).
fn gaps(at: u64, len: u64, taken: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut cur = at;
    for (s, l) in taken {
        if *s > cur {
            out.push((cur, s - cur));
        }
        cur = s + l;
    }
    if cur < at + len {
        out.push((cur, at + len - cur));
    }
    out
}

/// The net change per top-level vdev of an allocator's journal (metaslab.rs, "The
/// journal"): allocations (`true`) and immediate frees in order. An allocation of
/// what the journal already allocated, or a free of what it already freed, is an
/// engine bug, reported.
pub fn net_journal(entries: &[(crate::block::blkptr::Dva, bool)]) -> std::result::Result<BTreeMap<crate::VdevId, TxgDelta>, String> {
    let mut per: BTreeMap<crate::VdevId, (Segments, Segments)> = BTreeMap::new();
    for (d, allocated) in entries {
        let (added, removed) = per.entry(d.vdev).or_default();
        let (at, len) = (d.offset, d.asize as u64);
        let (undo, into) = if *allocated { (removed, added) } else { (added, removed) };
        let back = undo.take_overlap(at, len);
        for (s, l) in gaps(at, len, &back) {
            into.add(s, l).map_err(|w| format!("journal {} of {d:?}: {w}", if *allocated { "allocation" } else { "free" }))?;
        }
    }
    Ok(per.into_iter().map(|(v, (a, r))| (v, TxgDelta { allocs: a.iter().collect(), frees: r.iter().collect() })).filter(|(_, d)| !d.is_empty()).collect())
}

/// The extents of `a` not in `b`.
fn difference(a: &Segments, b: &Segments) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (s, l) in a.iter() {
        let mut at = s;
        let end = s + l;
        let first = b.map.range(..s).next_back().map_or(s, |(bs, _)| *bs);
        for (bs, bl) in b.map.range(first..end) {
            let (bs, be) = (*bs, bs + bl);
            if be <= at {
                continue;
            }
            if bs > at {
                out.push((at, bs - at));
            }
            at = be.min(end);
        }
        if at < end {
            out.push((at, end - at));
        }
    }
    out
}

impl<'a> SpaceMap<'a> {
    /// A new, empty space map object, allocated in `txg`.
    pub fn create(mos: &'a Objset, io: &'a dyn BlockIo, txg: Txg) -> Result<SpaceMap<'a>> {
        let object = mos.allocate(io, txg, &ObjectSpec::metadata(ObjectType::SpaceMap, BLOCK_BYTES))?;
        let sm = SpaceMap { mos, io, object };
        sm.set_phys(txg, &SpaceMapPhys { length_bytes: 0, allocated_bytes: 0, histogram: [0; HISTOGRAM_BUCKETS] })?;
        Ok(sm)
    }

    pub fn phys(&self) -> Result<SpaceMapPhys> {
        let p = self.mos.typed_dnode(self.io, self.object, ObjectType::SpaceMap)?;
        SpaceMapPhys::decode(&p.bonus).map_err(|e| self.corrupt(e))
    }

    fn corrupt(&self, why: String) -> Error {
        Error::Corrupt(format!("space map object {}: {why}", self.object))
    }

    fn set_phys(&self, txg: Txg, p: &SpaceMapPhys) -> Result<()> {
        self.mos.update_dnode(self.io, txg, self.object, |d| {
            d.bonus = p.encode();
            Ok(())
        })
    }

    /// The map's entries, `length_bytes` of them.
    fn read_entries(&self, length_bytes: u64) -> Result<Vec<u8>> {
        let d = self.mos.typed_dnode(self.io, self.object, ObjectType::SpaceMap)?;
        let blocks = length_bytes.div_ceil(BLOCK_BYTES as u64);
        if d.data_block_bytes != BLOCK_BYTES || (blocks > 0 && blocks - 1 > d.maxblkid) {
            return Err(self.corrupt(format!("entries of {length_bytes} bytes beyond its blocks")));
        }
        let mut out = Vec::with_capacity(length_bytes as usize);
        for blkid in 0..blocks {
            match self.mos.read_block(self.io, self.object, blkid)? {
                Some(b) => out.extend_from_slice(&b),
                None => out.resize(out.len() + BLOCK_BYTES as usize, 0),
            }
        }
        out.truncate(length_bytes as usize);
        Ok(out)
    }

    /// The segments the map replays to.
    pub fn load(&self, ms: MetaslabRange) -> Result<Segments> {
        let p = self.phys()?;
        let entries = self.read_entries(p.length_bytes)?;
        let mut segments = Segments::default();
        replay(&entries, ms, &mut segments, &mut Txg(0)).map_err(|e| self.corrupt(e))?;
        if segments.bytes() != p.allocated_bytes {
            return Err(self.corrupt(format!("replays to {} allocated bytes, its bonus says {}", segments.bytes(), p.allocated_bytes)));
        }
        Ok(segments)
    }

    /// Write `bytes` at byte `at` of the entries (whole blocks, the first one read).
    fn write_entries_at(&self, txg: Txg, at: u64, bytes: &[u8]) -> Result<()> {
        let bs = BLOCK_BYTES as u64;
        let (mut blkid, mut within) = (at / bs, (at % bs) as usize);
        let mut rest = bytes;
        while !rest.is_empty() {
            let mut block = match within {
                0 => vec![0u8; bs as usize],
                _ => self.mos.read_block(self.io, self.object, blkid)?.map(|b| b.to_vec()).unwrap_or_else(|| vec![0u8; bs as usize]),
            };
            let n = rest.len().min(bs as usize - within);
            block[within..within + n].copy_from_slice(&rest[..n]);
            self.mos.write_block(self.io, txg, self.object, blkid, Some(Arc::new(AlignedBuf::from(&block[..]))))?;
            rest = &rest[n..];
            (blkid, within) = (blkid + 1, 0);
        }
        Ok(())
    }

    /// Record `txg`'s changes to the metaslab: appended to the log, or (when the log has
    /// grown past its bound) the whole map rewritten as `after`, the segments the
    /// metaslab holds once `delta` is applied. Returns whether it condensed.
    pub fn sync_txg(&self, txg: Txg, delta: &TxgDelta, after: &Segments, ms: MetaslabRange) -> Result<bool> {
        let p = self.phys()?;
        let histogram = after.free_histogram(ms.start, ms.start + ms.size);
        let mut out = Entry::Txg(txg).encode().to_vec();
        let condense = needs_condense(p.length_bytes, after.len());
        if condense {
            push_extents(&mut out, after.iter(), false);
            self.write_entries_at(txg, 0, &out)?;
            let old_blocks = p.length_bytes.div_ceil(BLOCK_BYTES as u64);
            for blkid in (out.len() as u64).div_ceil(BLOCK_BYTES as u64)..old_blocks {
                self.mos.write_block(self.io, txg, self.object, blkid, None)?;
            }
            self.set_phys(txg, &SpaceMapPhys { length_bytes: out.len() as u64, allocated_bytes: after.bytes(), histogram })?;
        } else {
            push_extents(&mut out, delta.allocs.iter().copied(), false);
            push_extents(&mut out, delta.frees.iter().copied(), true);
            self.write_entries_at(txg, p.length_bytes, &out)?;
            self.set_phys(txg, &SpaceMapPhys { length_bytes: p.length_bytes + out.len() as u64, allocated_bytes: after.bytes(), histogram })?;
        }
        Ok(condense)
    }

    /// Free the object (its metaslab's array entry is cleared by the caller).
    pub fn destroy(self, txg: Txg) -> Result<()> {
        self.mos.free_object(self.io, txg, self.object)
    }
}

/// The metaslab size exponent for a data area of `bytes`: about
/// [`METASLABS_TARGET`] metaslabs, within [`MS_SHIFT_MIN`] … [`MS_SHIFT_MAX`].
pub fn ms_shift_for(bytes: u64) -> u8 {
    let target = (bytes / METASLABS_TARGET).max(1);
    (target.ilog2() as u8).clamp(MS_SHIFT_MIN, MS_SHIFT_MAX)
}

/// A metaslab array's bonus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaslabArrayPhys {
    pub ms_shift: u8,
    pub count: u64,
}

impl MetaslabArrayPhys {
    /// The layout of a data area of `bytes`: every byte in some metaslab.
    pub fn for_area(bytes: u64) -> MetaslabArrayPhys {
        let ms_shift = ms_shift_for(bytes);
        MetaslabArrayPhys { ms_shift, count: bytes.div_ceil(1 << ms_shift) }
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut b = (self.ms_shift as u64).to_le_bytes().to_vec();
        b.extend_from_slice(&self.count.to_le_bytes());
        b
    }
    /// Decoded and checked against the data area it describes (0: unknown, a log
    /// vdev whose every device is missing: then only its own limits are checked).
    pub fn decode(b: &[u8], area_bytes: u64) -> std::result::Result<MetaslabArrayPhys, String> {
        if b.len() != 16 {
            return Err(format!("metaslab array bonus of {} bytes", b.len()));
        }
        let shift = u64::from_le_bytes(b[..8].try_into().expect("8"));
        let count = u64::from_le_bytes(b[8..].try_into().expect("8"));
        if !(MS_SHIFT_MIN as u64..=MS_SHIFT_MAX as u64).contains(&shift) {
            return Err(format!("ms_shift {shift} outside {MS_SHIFT_MIN} … {MS_SHIFT_MAX}"));
        }
        let want = if area_bytes == 0 { count.clamp(1, MAX_METASLABS) } else { area_bytes.div_ceil(1 << shift) };
        if count != want || count > MAX_METASLABS {
            return Err(format!("{count} metaslabs of 2^{shift} bytes for a data area of {area_bytes} bytes (needs {want})"));
        }
        Ok(MetaslabArrayPhys { ms_shift: shift as u8, count })
    }
    /// Metaslab `i`'s range in a data area of `area_bytes`.
    pub fn range(&self, i: u64, area_bytes: u64) -> MetaslabRange {
        let start = i << self.ms_shift;
        MetaslabRange { start, size: (1u64 << self.ms_shift).min(area_bytes - start) }
    }
    /// The metaslabs `[at, at + len)` covers, with the part in each.
    pub fn split(&self, at: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let end = at + len;
        let size = 1u64 << self.ms_shift;
        (at >> self.ms_shift..end.div_ceil(size)).map(move |i| {
            let (s, e) = (at.max(i * size), end.min((i + 1) * size));
            (i, s, e - s)
        })
    }
}

/// A top-level vdev's metaslab array object.
pub struct MetaslabArray<'a> {
    pub mos: &'a Objset,
    pub io: &'a dyn BlockIo,
    pub object: u64,
}

const ENTRIES_PER_ARRAY_BLOCK: u64 = ARRAY_BLOCK_BYTES as u64 / 8;

impl<'a> MetaslabArray<'a> {
    /// A new array for a data area of `area_bytes`, every entry 0.
    pub fn create(mos: &'a Objset, io: &'a dyn BlockIo, txg: Txg, area_bytes: u64) -> Result<MetaslabArray<'a>> {
        let mut spec = ObjectSpec::metadata(ObjectType::MetaslabArray, ARRAY_BLOCK_BYTES);
        spec.bonus = MetaslabArrayPhys::for_area(area_bytes).encode();
        let object = mos.allocate(io, txg, &spec)?;
        Ok(MetaslabArray { mos, io, object })
    }

    pub fn phys(&self, area_bytes: u64) -> Result<MetaslabArrayPhys> {
        let corrupt = |w: String| Error::Corrupt(format!("metaslab array object {}: {w}", self.object));
        let d = self.mos.typed_dnode(self.io, self.object, ObjectType::MetaslabArray)?;
        MetaslabArrayPhys::decode(&d.bonus, area_bytes).map_err(corrupt)
    }

    /// Every entry (the space map object of each metaslab, 0 for none).
    pub fn entries(&self, count: u64) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(count as usize);
        for blkid in 0..count.div_ceil(ENTRIES_PER_ARRAY_BLOCK) {
            let n = (count - blkid * ENTRIES_PER_ARRAY_BLOCK).min(ENTRIES_PER_ARRAY_BLOCK) as usize;
            match self.mos.read_block(self.io, self.object, blkid)? {
                Some(b) => out.extend(b.chunks_exact(8).take(n).map(|c| u64::from_le_bytes(c.try_into().expect("8")))),
                None => out.resize(out.len() + n, 0),
            }
        }
        Ok(out)
    }

    /// Set entry `i` in `txg`.
    pub fn set(&self, txg: Txg, i: u64, space_map: u64) -> Result<()> {
        let blkid = i / ENTRIES_PER_ARRAY_BLOCK;
        let mut block = self.mos.read_block(self.io, self.object, blkid)?.map(|b| b.to_vec()).unwrap_or_else(|| vec![0; ARRAY_BLOCK_BYTES as usize]);
        let at = (i % ENTRIES_PER_ARRAY_BLOCK) as usize * 8;
        block[at..at + 8].copy_from_slice(&space_map.to_le_bytes());
        self.mos.write_block(self.io, txg, self.object, blkid, Some(Arc::new(AlignedBuf::from(&block[..]))))
    }
}

#[cfg(test)]
mod tests;
