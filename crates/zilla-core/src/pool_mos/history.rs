//! The pool history ring of a format 2 pool (§14.2): records (u32 length, then the
//! JSON of §5.1) in an object's 16 KiB blocks, the pool's creation record pinned at the
//! start, the rest a ring that drops its oldest records to make room. An append writes
//! the blocks its record lands in and the bonus: a txg pays for its own records.

use super::*;

/// Data block size of the history object.
pub const HISTORY_BLOCK_BYTES: u64 = 16 << 10;
/// The ring's size: 1 % of the pool, within these bounds, a multiple of a block.
pub const HISTORY_RING_MIN_BYTES: u64 = 128 << 10;
pub const HISTORY_RING_MAX_BYTES: u64 = 1 << 30;
/// A record's JSON (§5.1).
pub const HISTORY_RECORD_MAX_BYTES: usize = 8192;
/// The pinned creation record.
pub const HISTORY_PINNED_MAX_BYTES: u64 = 64 << 10;

/// The history object's bonus (§14.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HistoryPhys {
    pub ring_bytes: u64,
    pub begin: u64,
    pub end: u64,
    pub pinned: u64,
    pub dropped: u64,
}

impl HistoryPhys {
    pub fn encode(&self) -> Vec<u8> {
        [self.ring_bytes, self.begin, self.end, self.pinned, self.dropped].iter().flat_map(|w| w.to_le_bytes()).collect()
    }
    pub fn decode(b: &[u8], object_bytes: u64) -> std::result::Result<HistoryPhys, String> {
        if b.len() != 40 {
            return Err(format!("history bonus of {} bytes", b.len()));
        }
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8"));
        let p = HistoryPhys { ring_bytes: w(0), begin: w(1), end: w(2), pinned: w(3), dropped: w(4) };
        let ok = p.ring_bytes % HISTORY_BLOCK_BYTES == 0
            && (HISTORY_RING_MIN_BYTES..=HISTORY_RING_MAX_BYTES).contains(&p.ring_bytes)
            && p.ring_bytes <= object_bytes
            && p.pinned <= HISTORY_PINNED_MAX_BYTES
            && p.pinned <= p.begin
            && p.begin <= p.end
            && p.end - p.begin <= p.ring_bytes - p.pinned
            && p.dropped < 1 << 63;
        if ok { Ok(p) } else { Err(format!("history bonus out of its limits: {p:?}")) }
    }
    /// Where logical offset `o` lives in the object.
    fn place(&self, o: u64) -> u64 {
        if o < self.pinned { o } else { self.pinned + (o - self.pinned) % (self.ring_bytes - self.pinned) }
    }
}

/// The ring size for a pool of `pool_bytes`.
pub fn history_ring_bytes(pool_bytes: u64) -> u64 {
    (pool_bytes / 100).clamp(HISTORY_RING_MIN_BYTES, HISTORY_RING_MAX_BYTES) / HISTORY_BLOCK_BYTES * HISTORY_BLOCK_BYTES
}

/// A history object in the MOS.
pub struct HistoryRing<'a> {
    pub mos: &'a Objset,
    pub io: &'a dyn BlockIo,
    pub object: u64,
}

impl<'a> HistoryRing<'a> {
    pub fn create(mos: &'a Objset, io: &'a dyn BlockIo, txg: Txg, ring_bytes: u64) -> Result<HistoryRing<'a>> {
        let mut spec = ObjectSpec::metadata(ObjectType::PoolHistory, HISTORY_BLOCK_BYTES as u32);
        spec.bonus = HistoryPhys { ring_bytes, ..Default::default() }.encode();
        let object = mos.allocate(io, txg, &spec)?;
        Ok(HistoryRing { mos, io, object })
    }

    pub fn phys(&self) -> Result<HistoryPhys> {
        let d = self.mos.typed_dnode(self.io, self.object, ObjectType::PoolHistory)?;
        HistoryPhys::decode(&d.bonus, HISTORY_RING_MAX_BYTES).map_err(|e| Error::Corrupt(format!("pool history: {e}")))
    }

    /// `len` bytes at logical offset `o`.
    fn read_at(&self, p: &HistoryPhys, o: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        let mut at = o;
        while out.len() < len {
            let pos = p.place(at);
            let (blkid, within) = (pos / HISTORY_BLOCK_BYTES, (pos % HISTORY_BLOCK_BYTES) as usize);
            let run = (len - out.len()).min(HISTORY_BLOCK_BYTES as usize - within).min(if at < p.pinned { (p.pinned - at) as usize } else { (p.ring_bytes - pos) as usize });
            match self.mos.read_block(self.io, self.object, blkid)? {
                Some(b) => out.extend_from_slice(&b[within..within + run]),
                None => out.resize(out.len() + run, 0),
            }
            at += run as u64;
        }
        Ok(out)
    }

    fn write_at(&self, txg: Txg, p: &HistoryPhys, o: u64, bytes: &[u8]) -> Result<()> {
        let mut done = 0;
        while done < bytes.len() {
            let at = o + done as u64;
            let pos = p.place(at);
            let (blkid, within) = (pos / HISTORY_BLOCK_BYTES, (pos % HISTORY_BLOCK_BYTES) as usize);
            let run = (bytes.len() - done).min(HISTORY_BLOCK_BYTES as usize - within).min(if at < p.pinned { (p.pinned - at) as usize } else { (p.ring_bytes - pos) as usize });
            let mut b = self.mos.read_block(self.io, self.object, blkid)?.map(|b| b.to_vec()).unwrap_or_else(|| vec![0; HISTORY_BLOCK_BYTES as usize]);
            b[within..within + run].copy_from_slice(&bytes[done..done + run]);
            self.mos.write_block(self.io, txg, self.object, blkid, Some(Arc::new(AlignedBuf::from(&b[..]))))?;
            done += run;
        }
        Ok(())
    }

    fn record_len(&self, p: &HistoryPhys, o: u64) -> Result<u64> {
        let l = u32::from_le_bytes(self.read_at(p, o, 4)?.try_into().expect("4 bytes")) as usize;
        if !(2..=HISTORY_RECORD_MAX_BYTES).contains(&l) {
            return Err(Error::Corrupt(format!("pool history: a record of {l} bytes at offset {o}")));
        }
        Ok(4 + l as u64)
    }

    /// Append `json` in `txg` (the first record of an empty ring pinned when `pin`),
    /// dropping the oldest unpinned records until it fits.
    pub fn append(&self, txg: Txg, json: &[u8], pin: bool) -> Result<()> {
        if !(2..=HISTORY_RECORD_MAX_BYTES).contains(&json.len()) {
            return Err(Error::invalid(format!("a history record of {} bytes", json.len())));
        }
        let mut p = self.phys()?;
        let size = 4 + json.len() as u64;
        if p.end == 0 && pin && size <= HISTORY_PINNED_MAX_BYTES {
            p.pinned = size;
            p.begin = size;
        }
        while p.end + size - p.begin > p.ring_bytes - p.pinned {
            if p.begin == p.end {
                return Err(Error::invalid("a history record larger than the ring"));
            }
            p.begin += self.record_len(&p, p.begin)?;
            p.dropped += 1;
        }
        let mut rec = (json.len() as u32).to_le_bytes().to_vec();
        rec.extend_from_slice(json);
        self.write_at(txg, &p, p.end, &rec)?;
        p.end += size;
        self.mos.update_dnode(self.io, txg, self.object, |d| {
            d.bonus = p.encode();
            Ok(())
        })
    }

    /// Every record's JSON, oldest first (the pinned one first of all).
    pub fn records(&self) -> Result<Vec<Vec<u8>>> {
        let p = self.phys()?;
        let mut out = Vec::new();
        let mut o = if p.pinned > 0 { 0 } else { p.begin };
        while o < p.end {
            let len = self.record_len(&p, o)?;
            if o + len > p.end.max(p.pinned) || (o < p.pinned && o + len != p.pinned) {
                return Err(Error::Corrupt(format!("pool history: a record at offset {o} runs past its end")));
            }
            out.push(self.read_at(&p, o + 4, (len - 4) as usize)?);
            o = if o + len == p.pinned { p.begin } else { o + len };
        }
        Ok(out)
    }
}
