//! spa_history: the pool's command history (`zilla pool history`), as zpool keeps it.
//!
//! Theory of operation
//! -------------------
//! Every admin command that changed a pool is recorded in the pool itself, so the
//! history travels with the disks (export, import on another host) and survives every
//! restart. The records form a bounded ring: at most [`HISTORY_MAX_RECORDS`] records
//! and [`HISTORY_MAX_BYTES`] of encoded records; appending past either bound drops the
//! oldest records, except the first one when it is pinned (the pool's creation, which
//! zpool also keeps for ever).
//!
//! The ring is a trailing section of the object directory (docs/on-disk-format.md
//! §5.1), so it is committed with the txg that carries it and never torn. Each record is
//! a small JSON object (time, command line, user, host, client), extensible as zpool's
//! nvlists are. Decoding checks every count, length and field against its documented
//! limit and answers `Error::Corrupt` naming it: no byte of a crafted section makes it
//! panic or allocate beyond the bound.

use crate::block::reader::Reader;
use crate::{Error, Result};

/// "ZILLHIS" read as little-endian bytes.
pub const HISTORY_MAGIC: u64 = 0x0053_4948_4c4c_495a;
pub const HISTORY_VERSION: u32 = 1;
/// Bound of the encoded records (4-byte length + JSON each).
pub const HISTORY_MAX_BYTES: usize = 128 << 10;
pub const HISTORY_MAX_RECORDS: usize = 4096;
/// Bound of one encoded record.
pub const RECORD_MAX_BYTES: usize = 8192;
/// Bound of a command line; a longer one is cut (and says so).
pub const CMD_MAX_BYTES: usize = 4096;
/// Bound of the short strings (user, host, client).
pub const NAME_MAX_BYTES: usize = 256;

const FLAG_FIRST_PINNED: u32 = 1;

/// One command, as recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HistoryRecord {
    /// Seconds since the epoch (UTC).
    pub time: u64,
    /// The command line, e.g. `zilla pool create tank mirror /dev/sdb /dev/sdc`.
    pub cmd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub who: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client: String,
}

/// The ring of records, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    records: Vec<HistoryRecord>,
    /// Encoded size of each record (4 + JSON), parallel to `records`.
    sizes: Vec<usize>,
    first_pinned: bool,
    /// Records dropped so far to keep the bounds.
    pub dropped: u64,
}

/// `s` cut to at most `max` bytes on a character boundary, control characters replaced.
fn clean(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for c in s.chars() {
        let c = if c.is_control() { '?' } else { c };
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

fn check_str(field: &str, s: &str, max: usize) -> Result<()> {
    if s.len() > max {
        return Err(Error::Corrupt(format!("pool history: field {field} is {} bytes (at most {max})", s.len())));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(Error::Corrupt(format!("pool history: field {field} holds a control character")));
    }
    Ok(())
}

impl HistoryRecord {
    /// A record with every string within its bound and printable.
    pub fn cleaned(mut self) -> HistoryRecord {
        if self.cmd.len() > CMD_MAX_BYTES {
            self.cmd = format!("{}...", clean(&self.cmd, CMD_MAX_BYTES - 3));
        } else {
            self.cmd = clean(&self.cmd, CMD_MAX_BYTES);
        }
        if self.cmd.is_empty() {
            self.cmd = "?".into();
        }
        self.user = clean(&self.user, NAME_MAX_BYTES);
        self.host = clean(&self.host, NAME_MAX_BYTES);
        self.client = clean(&self.client, NAME_MAX_BYTES);
        self.time = self.time.min(i64::MAX as u64);
        self
    }

    fn check(&self) -> Result<()> {
        if self.time > i64::MAX as u64 {
            return Err(Error::Corrupt(format!("pool history: field time = {} is out of range", self.time)));
        }
        if self.cmd.is_empty() {
            return Err(Error::Corrupt("pool history: field cmd is empty".into()));
        }
        check_str("cmd", &self.cmd, CMD_MAX_BYTES)?;
        check_str("user", &self.user, NAME_MAX_BYTES)?;
        check_str("host", &self.host, NAME_MAX_BYTES)?;
        check_str("client", &self.client, NAME_MAX_BYTES)
    }

    pub fn json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl History {
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
    pub fn records(&self) -> &[HistoryRecord] {
        &self.records
    }
    /// Encoded bytes of the records (what [`HISTORY_MAX_BYTES`] bounds).
    pub fn bytes(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Append `rec` (cleaned to its bounds), dropping the oldest unpinned records until
    /// the ring is within its bounds. The first record of an empty ring is pinned when
    /// `pin` (the pool's creation).
    pub fn append(&mut self, rec: HistoryRecord, pin: bool) {
        let rec = rec.cleaned();
        let size = 4 + rec.json().len();
        if self.records.is_empty() {
            self.first_pinned = pin;
        }
        let keep = usize::from(self.first_pinned);
        while self.records.len() > keep && (self.records.len() + 1 > HISTORY_MAX_RECORDS || self.bytes() + size > HISTORY_MAX_BYTES) {
            self.records.remove(keep);
            self.sizes.remove(keep);
            self.dropped += 1;
        }
        self.records.push(rec);
        self.sizes.push(size);
    }

    /// The section's bytes (§5.1), appended to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&HISTORY_MAGIC.to_le_bytes());
        out.extend_from_slice(&HISTORY_VERSION.to_le_bytes());
        out.extend_from_slice(&(if self.first_pinned { FLAG_FIRST_PINNED } else { 0 }).to_le_bytes());
        out.extend_from_slice(&self.dropped.to_le_bytes());
        out.extend_from_slice(&(self.records.len() as u32).to_le_bytes());
        for r in &self.records {
            let j = r.json();
            out.extend_from_slice(&(j.len() as u32).to_le_bytes());
            out.extend_from_slice(&j);
        }
    }

    /// Decode a section from `r`, checking every bound.
    pub fn decode(r: &mut Reader<'_>) -> Result<History> {
        let magic = r.u64().map_err(|_| truncated())?;
        if magic != HISTORY_MAGIC {
            return Err(Error::Corrupt(format!("pool history: bad magic {magic:#x}")));
        }
        let version = r.u32().map_err(|_| truncated())?;
        if version != HISTORY_VERSION {
            return Err(Error::Corrupt(format!("pool history: unsupported version {version} (this build reads version {HISTORY_VERSION})")));
        }
        let flags = r.u32().map_err(|_| truncated())?;
        if flags & !FLAG_FIRST_PINNED != 0 {
            return Err(Error::Corrupt(format!("pool history: field flags = {flags:#x} has unknown bits")));
        }
        let dropped = r.u64().map_err(|_| truncated())?;
        if dropped > i64::MAX as u64 {
            return Err(Error::Corrupt(format!("pool history: field dropped = {dropped} is out of range")));
        }
        let n = r.u32().map_err(|_| truncated())? as usize;
        if n > HISTORY_MAX_RECORDS {
            return Err(Error::Corrupt(format!("pool history: {n} records (at most {HISTORY_MAX_RECORDS})")));
        }
        let mut h = History { first_pinned: flags & FLAG_FIRST_PINNED != 0 && n > 0, dropped, ..Default::default() };
        for i in 0..n {
            let len = r.u32().map_err(|_| truncated())? as usize;
            if !(2..=RECORD_MAX_BYTES).contains(&len) {
                return Err(Error::Corrupt(format!("pool history: record {i}: length {len} is out of range (2 … {RECORD_MAX_BYTES})")));
            }
            if h.bytes() + 4 + len > HISTORY_MAX_BYTES {
                return Err(Error::Corrupt(format!("pool history: the records pass {HISTORY_MAX_BYTES} bytes")));
            }
            let body = r.bytes(len).map_err(|_| truncated())?;
            let rec: HistoryRecord = serde_json::from_slice(body).map_err(|e| Error::Corrupt(format!("pool history: record {i}: {e}")))?;
            rec.check().map_err(|e| Error::Corrupt(format!("record {i}: {e}")))?;
            h.records.push(rec);
            h.sizes.push(4 + len);
        }
        Ok(h)
    }
}

fn truncated() -> Error {
    Error::Corrupt("pool history: truncated".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: usize) -> HistoryRecord {
        HistoryRecord { time: 1_700_000_000 + i as u64, cmd: format!("zilla pool set autotrim=on tank #{i}"), who: Some(0), user: "root".into(), host: "h".into(), client: "local".into() }
    }

    fn roundtrip(h: &History) -> History {
        let mut b = Vec::new();
        h.encode(&mut b);
        let mut r = Reader::new(&b);
        let back = History::decode(&mut r).unwrap();
        assert_eq!(r.remaining(), 0);
        back
    }

    #[test]
    fn ring_keeps_the_pinned_creation_and_the_newest_within_the_byte_bound() {
        let mut h = History::default();
        h.append(HistoryRecord { cmd: "zilla pool create tank mirror a b".into(), ..rec(0) }, true);
        for i in 1..5000 {
            h.append(rec(i), false);
            assert!(h.bytes() <= HISTORY_MAX_BYTES && h.records().len() <= HISTORY_MAX_RECORDS);
        }
        assert_eq!(h.records()[0].cmd, "zilla pool create tank mirror a b");
        assert_eq!(h.records().last().unwrap().cmd, rec(4999).cmd);
        // consecutive: nothing but the oldest unpinned records went
        let n = h.records().len();
        assert_eq!(h.records()[1].cmd, rec(5000 - (n - 1)).cmd);
        assert_eq!(h.dropped as usize, 5000 - n);
        assert_eq!(roundtrip(&h), h);
    }

    #[test]
    fn ring_bound_by_count() {
        let mut h = History::default();
        for i in 0..HISTORY_MAX_RECORDS + 10 {
            h.append(HistoryRecord { cmd: "x".into(), who: None, user: String::new(), host: String::new(), client: String::new(), time: i as u64 }, false);
        }
        assert_eq!(h.records().len(), HISTORY_MAX_RECORDS);
        assert_eq!(h.records()[0].time, 10, "unpinned: the oldest went");
        assert_eq!(roundtrip(&h), h);
    }

    #[test]
    fn long_and_unprintable_commands_are_cut_and_cleaned() {
        let mut h = History::default();
        h.append(HistoryRecord { cmd: format!("zilla pool create t {}\n\u{1b}[31m", "é".repeat(5000)), ..rec(0) }, true);
        let c = &h.records()[0].cmd;
        assert!(c.len() <= CMD_MAX_BYTES && c.ends_with("..."));
        assert!(!c.chars().any(|c| c.is_control()));
        assert_eq!(roundtrip(&h), h);
    }

    fn decode_err(b: &[u8]) -> String {
        match History::decode(&mut Reader::new(b)) {
            Ok(h) => panic!("decoded {h:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn header(version: u32, flags: u32, count: u32) -> Vec<u8> {
        let mut b = HISTORY_MAGIC.to_le_bytes().to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b
    }

    fn with_record(mut b: Vec<u8>, json: &[u8]) -> Vec<u8> {
        b.extend_from_slice(&(json.len() as u32).to_le_bytes());
        b.extend_from_slice(json);
        b
    }

    #[test]
    fn crafted_sections_fail_with_a_clear_error() {
        assert!(decode_err(&[0u8; 8]).contains("bad magic"));
        assert!(decode_err(&header(2, 0, 0)).contains("unsupported version 2"));
        assert!(decode_err(&header(1, 6, 0)).contains("flags"));
        assert!(decode_err(&header(1, 0, 100_000)).contains("100000 records"));
        assert!(decode_err(&header(1, 0, 1)).contains("truncated"));
        let mut b = header(1, 0, 1);
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_err(&b).contains("length 4294967295 is out of range"));
        assert!(decode_err(&with_record(header(1, 0, 1), b"{not json")).contains("record 0"));
        assert!(decode_err(&with_record(header(1, 0, 1), br#"{"time":1}"#)).contains("cmd"));
        assert!(decode_err(&with_record(header(1, 0, 1), br#"{"time":1,"cmd":""}"#)).contains("cmd is empty"));
        assert!(decode_err(&with_record(header(1, 0, 1), br#"{"time":1,"cmd":"a\u001b[2J"}"#)).contains("control character"));
        assert!(decode_err(&with_record(header(1, 0, 1), br#"{"time":18446744073709551615,"cmd":"a"}"#)).contains("time"));
        let long = format!(r#"{{"time":1,"cmd":"a","host":"{}"}}"#, "h".repeat(300));
        assert!(decode_err(&with_record(header(1, 0, 1), long.as_bytes())).contains("host is 300 bytes"));
        // a record declaring more bytes than remain
        let mut b = header(1, 0, 1);
        b.extend_from_slice(&100u32.to_le_bytes());
        b.extend_from_slice(b"{}");
        assert!(decode_err(&b).contains("truncated"));
        // the total bound: 17 records of 8 KiB pass 128 KiB
        let big = format!(r#"{{"time":1,"cmd":"{}"}}"#, "c".repeat(4000));
        let mut b = header(1, 0, 40);
        for _ in 0..40 {
            b = with_record(b, big.as_bytes());
        }
        assert!(decode_err(&b).contains("records pass"), "{}", decode_err(&b));
    }

    #[test]
    fn unknown_record_keys_are_ignored() {
        let b = with_record(header(1, 1, 1), br#"{"time":5,"cmd":"zilla pool create t d","txg":9,"later":{"x":1}}"#);
        let h = History::decode(&mut Reader::new(&b)).unwrap();
        assert_eq!(h.records()[0].cmd, "zilla pool create t d");
        assert!(h.first_pinned);
    }

    /// Every truncation and every single-byte change of a valid section decodes or
    /// fails cleanly (no panic).
    #[test]
    fn every_cut_and_byte_flip_is_handled() {
        let mut h = History::default();
        h.append(rec(0), true);
        h.append(rec(1), false);
        let mut b = Vec::new();
        h.encode(&mut b);
        for cut in 0..b.len() {
            assert!(History::decode(&mut Reader::new(&b[..cut])).is_err());
        }
        for i in 0..b.len() {
            for v in [0u8, 0xff, b'"', b'\\', 0x80] {
                let mut c = b.clone();
                c[i] = v;
                let _ = History::decode(&mut Reader::new(&c));
            }
        }
    }
}
