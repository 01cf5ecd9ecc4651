//! l2arc/persist: what a cache device records of its own contents, so the L2ARC is warm
//! again after an export, a restart or a crash (OpenZFS's persistent L2ARC, simplified).
//!
//! Byte maps (little-endian; docs/on-disk-format.md has them too):
//!
//! ```text
//! device header: 4 KiB at the start of the data area (the ring begins after it)
//!   0  magic "ZLL2DEV1"      8  version u32 (1)     12 flags u32 (bit 0: first sweep)
//!   16 top vdev guid u64     24 leaf guid u64       32 ring start u64   40 ring end u64
//!   48 hand u64: where the newest batch's log block ends (the next write goes there)
//!   56 evict from u64, 64 evict to u64: the range a batch in progress may be
//!      overwriting (empty when none is)
//!   72 newest log address u64 (0: none)              80 newest log length u32, pad u32
//!   88 sequence u64 (bumped per header write)
//!   96 fletcher4 of bytes 0..96 (32 bytes)
//!
//! log block: right after its batch's copies, in the ring, one per feed batch
//!   0  magic "ZLL2LOG1"      8  top vdev guid u64   16 batch sequence u64
//!   24 previous log address u64 (0: none)           32 previous log length u32
//!   36 entry count u32       40 batch start u64     48 batch end u64 (= this block's address)
//!   56 fletcher4 of bytes 0..56 and of the entries (32 bytes)
//!   88 entries, 48 bytes each: vdev u32, kind u8, 3 pad, offset u64, birth u64,
//!      address u64, length u32, 4 pad, 8 reserved (0; a copy is verified against its
//!      block pointer when read)
//! ```
//!
//! A feed batch is written in three steps, each durable before the next: (1) the header
//! gets the range the batch will overwrite (copies and log block) as [evict from,
//! evict to), (2) the copies and the log block go out as one write at the hand, (3) the
//! header names the new log block, moves the hand and clears the range. Crash analysis:
//! after (1) only, the rebuild ignores every batch that touches the range, so nothing
//! the batch may have half-overwritten is trusted;
//! after (2), the same (the new batch is simply not known); after (3) the new batch is
//! the newest. A torn header fails its checksum and the device starts empty.
//!
//! Rebuild (at import, on the feed thread before its first feed; reads are served
//! meanwhile and miss what is not back yet): read the header; if its magic, checksum,
//! guids or geometry do not match this cache vdev, the device starts empty. Else walk
//! the log chain from the newest block back: a block is used only if its checksum,
//! magic, guid and sequence (strictly decreasing) hold, it and its batch lie inside
//! the ring, its batch does not touch [hand, evict), and it is less than one ring
//! behind the hand (older ones were overwritten). Every entry is checked against its
//! batch's range and the ring before it becomes a header; at most `max_headers` are
//! restored (the header memory cap) and at most ring / 4 KiB blocks are read. The log
//! is untrusted input: no count, size or address in it drives an allocation or a read
//! beyond these bounds, and a restored copy is still checked on every read.

use crate::arc::{BlockKey, BufKind};
use crate::block::checksum::fletcher4;
use crate::{Txg, VdevId};

pub const DEV_HDR_BYTES: u64 = 4096;
const DEV_MAGIC: &[u8; 8] = b"ZLL2DEV1";
const LOG_MAGIC: &[u8; 8] = b"ZLL2LOG1";
const LOG_HDR_BYTES: usize = 88;
pub const LOG_ENTRY_BYTES: usize = 48;
/// Entries one log block may hold (a batch holds at most this many copies).
pub const LOG_ENTRIES_MAX: usize = 16384;
/// The largest copy a log entry may describe.
pub const COPY_MAX_BYTES: u32 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DevHeader {
    pub first_sweep: bool,
    pub top_guid: u64,
    pub leaf_guid: u64,
    pub ring_start: u64,
    pub ring_end: u64,
    pub hand: u64,
    pub evict_from: u64,
    pub evict_to: u64,
    pub newest_log: u64,
    pub newest_log_len: u32,
    pub seq: u64,
}

fn fold(c: [u64; 4]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, w) in c.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl DevHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; DEV_HDR_BYTES as usize];
        b[0..8].copy_from_slice(DEV_MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&(self.first_sweep as u32).to_le_bytes());
        let words = [
            (16, self.top_guid),
            (24, self.leaf_guid),
            (32, self.ring_start),
            (40, self.ring_end),
            (48, self.hand),
            (56, self.evict_from),
            (64, self.evict_to),
            (72, self.newest_log),
            (88, self.seq),
        ];
        for (at, v) in words {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[80..84].copy_from_slice(&self.newest_log_len.to_le_bytes());
        let c = fold(fletcher4(&b[0..96]));
        b[96..128].copy_from_slice(&c);
        b
    }

    /// The header in `b`, if it is one (magic, version, checksum); not yet checked
    /// against a device.
    pub fn decode(b: &[u8]) -> Option<DevHeader> {
        if b.len() < 128 || &b[0..8] != DEV_MAGIC || u32_at(b, 8) != 1 {
            return None;
        }
        if b[96..128] != fold(fletcher4(&b[0..96])) {
            return None;
        }
        Some(DevHeader {
            first_sweep: u32_at(b, 12) & 1 != 0,
            top_guid: u64_at(b, 16),
            leaf_guid: u64_at(b, 24),
            ring_start: u64_at(b, 32),
            ring_end: u64_at(b, 40),
            hand: u64_at(b, 48),
            evict_from: u64_at(b, 56),
            evict_to: u64_at(b, 64),
            newest_log: u64_at(b, 72),
            newest_log_len: u32_at(b, 80),
            seq: u64_at(b, 88),
        })
    }
}

/// One copy a log block describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEntry {
    pub key: BlockKey,
    pub kind: BufKind,
    pub addr: u64,
    pub len: u32,
    /// Reserved (written 0; older devices hold a check of the bytes, not used).
    pub reserved: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogBlock {
    pub top_guid: u64,
    pub seq: u64,
    pub prev: u64,
    pub prev_len: u32,
    pub batch_start: u64,
    pub batch_end: u64,
    pub entries: Vec<LogEntry>,
}

/// Bytes a log block of `n` entries takes on the device (rounded to 4 KiB).
pub fn log_block_bytes(n: usize) -> u64 {
    ((LOG_HDR_BYTES + n * LOG_ENTRY_BYTES) as u64).next_multiple_of(4096)
}

impl LogBlock {
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.entries.len() <= LOG_ENTRIES_MAX, "a log block over its entry bound");
        let mut b = vec![0u8; log_block_bytes(self.entries.len()) as usize];
        b[0..8].copy_from_slice(LOG_MAGIC);
        for (at, v) in [(8, self.top_guid), (16, self.seq), (24, self.prev), (40, self.batch_start), (48, self.batch_end)] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[32..36].copy_from_slice(&self.prev_len.to_le_bytes());
        b[36..40].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let o = LOG_HDR_BYTES + i * LOG_ENTRY_BYTES;
            b[o..o + 4].copy_from_slice(&e.key.vdev.get().to_le_bytes());
            b[o + 4] = match e.kind {
                BufKind::Data => 0,
                BufKind::Metadata => 1,
            };
            b[o + 8..o + 16].copy_from_slice(&e.key.offset.to_le_bytes());
            b[o + 16..o + 24].copy_from_slice(&e.key.birth.get().to_le_bytes());
            b[o + 24..o + 32].copy_from_slice(&e.addr.to_le_bytes());
            b[o + 32..o + 36].copy_from_slice(&e.len.to_le_bytes());
            b[o + 40..o + 48].copy_from_slice(&e.reserved.to_le_bytes());
        }
        let end = LOG_HDR_BYTES + self.entries.len() * LOG_ENTRY_BYTES;
        let c = Self::checksum(&b, end);
        b[56..88].copy_from_slice(&c);
        b
    }

    fn checksum(b: &[u8], end: usize) -> [u8; 32] {
        let h = fletcher4(&b[0..56]);
        let e = fletcher4(&b[LOG_HDR_BYTES..end]);
        fold([h[0] ^ e[0], h[1] ^ e[1].rotate_left(1), h[2] ^ e[2].rotate_left(2), h[3] ^ e[3].rotate_left(3)])
    }

    /// The log block in `b` (untrusted): magic, entry count within the buffer and the
    /// bound, checksum. Entries are decoded as they are; the caller checks them.
    pub fn decode(b: &[u8]) -> Option<LogBlock> {
        if b.len() < LOG_HDR_BYTES || &b[0..8] != LOG_MAGIC {
            return None;
        }
        let n = u32_at(b, 36) as usize;
        if n > LOG_ENTRIES_MAX {
            return None;
        }
        let end = LOG_HDR_BYTES.checked_add(n.checked_mul(LOG_ENTRY_BYTES)?)?;
        if end > b.len() || b[56..88] != Self::checksum(b, end) {
            return None;
        }
        let mut entries = Vec::with_capacity(n);
        for i in 0..n {
            let o = LOG_HDR_BYTES + i * LOG_ENTRY_BYTES;
            let kind = match b[o + 4] {
                0 => BufKind::Data,
                1 => BufKind::Metadata,
                _ => return None,
            };
            entries.push(LogEntry {
                key: BlockKey { vdev: VdevId(u32_at(b, o)), offset: u64_at(b, o + 8), birth: Txg(u64_at(b, o + 16)) },
                kind,
                addr: u64_at(b, o + 24),
                len: u32_at(b, o + 32),
                reserved: u64_at(b, o + 40),
            });
        }
        Some(LogBlock {
            top_guid: u64_at(b, 8),
            seq: u64_at(b, 16),
            prev: u64_at(b, 24),
            prev_len: u32_at(b, 32),
            batch_start: u64_at(b, 40),
            batch_end: u64_at(b, 48),
            entries,
        })
    }
}

/// The ring's geometry, for the rebuild's checks.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub start: u64,
    pub end: u64,
}

impl Geometry {
    pub fn size(&self) -> u64 {
        self.end - self.start
    }

    /// Whether [a, b) lies inside the ring.
    pub fn holds(&self, a: u64, b: u64) -> bool {
        self.start <= a && a <= b && b <= self.end
    }

    /// How far behind `hand` address `a` lies, going back around the ring.
    pub fn behind(&self, hand: u64, a: u64) -> u64 {
        if a <= hand { hand - a } else { hand - self.start + (self.end - a) }
    }
}

/// Whether [a, b) and [c, d) overlap (plain intervals; no range wraps: a batch that
/// would pass the end is placed at the start).
pub fn overlaps(a: u64, b: u64, c: u64, d: u64) -> bool {
    a < d && c < b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> LogEntry {
        LogEntry { key: BlockKey { vdev: VdevId(1), offset: i << 14, birth: Txg(7) }, kind: BufKind::Data, addr: 8 << 20 | i << 14, len: 16384, reserved: i * 31 }
    }

    #[test]
    fn headers_and_log_blocks_round_trip_and_reject_damage() {
        let h = DevHeader { first_sweep: true, top_guid: 1, leaf_guid: 2, ring_start: 3, ring_end: 4, hand: 5, evict_from: 6, evict_to: 7, newest_log: 8, newest_log_len: 9, seq: 10 };
        let mut b = h.encode();
        assert_eq!(DevHeader::decode(&b), Some(h));
        b[50] ^= 1;
        assert_eq!(DevHeader::decode(&b), None, "a damaged header decoded");
        let l = LogBlock { top_guid: 1, seq: 2, prev: 3, prev_len: 4096, batch_start: 5, batch_end: 6, entries: (0..100).map(entry).collect() };
        let mut b = l.encode();
        assert_eq!(b.len() as u64, log_block_bytes(100));
        assert_eq!(LogBlock::decode(&b), Some(l.clone()));
        b[LOG_HDR_BYTES + 5 * LOG_ENTRY_BYTES + 9] ^= 4;
        assert_eq!(LogBlock::decode(&b), None, "a damaged entry decoded");
    }

    #[test]
    fn crafted_counts_never_read_or_allocate_beyond_the_buffer() {
        let l = LogBlock { top_guid: 1, seq: 2, prev: 0, prev_len: 0, batch_start: 0, batch_end: 0, entries: vec![entry(1)] };
        let mut b = l.encode();
        for n in [2u32, 1000, LOG_ENTRIES_MAX as u32 + 1, u32::MAX] {
            b[36..40].copy_from_slice(&n.to_le_bytes());
            assert_eq!(LogBlock::decode(&b), None, "count {n} decoded");
        }
        assert_eq!(LogBlock::decode(&b[..40]), None);
        assert_eq!(DevHeader::decode(&[0u8; 10]), None);
    }

    #[test]
    fn ring_distances_wrap() {
        let g = Geometry { start: 100, end: 200 };
        assert_eq!(g.behind(150, 120), 30);
        assert_eq!(g.behind(150, 180), 50 + 20);
        assert!(g.holds(100, 200) && !g.holds(99, 150) && !g.holds(150, 201) && !g.holds(160, 150));
        assert!(overlaps(10, 20, 15, 25) && !overlaps(10, 20, 20, 30));
    }
}
