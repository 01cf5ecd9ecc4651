//! The analytics history file: every enabled dataset's per-minute points, saved in the
//! state directory and read back at start (byte map: docs/design.md, "Analytics
//! history file").
//!
//! The file is replaced whole (temp file, fsync, rename, fsync of the directory), so a
//! crash leaves the old file or the new one. One blake3 hash covers the header and the
//! body: a torn, truncated, corrupted or foreign file is refused with an error value,
//! never trusted; every count and length is checked against its bound before use.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::catalog::DatasetId;
use super::history::{SavedKeys, SavedMinutes, KEY_BYTES_MAX, KEY_TABLE_MAX, MINUTE_POINTS};

pub(super) const MAGIC: &[u8; 8] = b"ZLANHIS1";
pub(super) const VERSION: u32 = 1;
pub(super) const HEADER_BYTES: usize = 64;
/// Longest dataset name in the catalog is far below this.
const NAME_BYTES_MAX: usize = 64;
/// Latest minute end a file may name (unix s, far beyond any real clock).
const NEWEST_MINUTE_MAX: u64 = 1 << 40;
/// Room beside the datasets' memory bounds (header, names, counts).
pub(super) const FILE_SLACK_BYTES: u64 = 64 * 1024;

/// One dataset as saved: its key table (id, key) and its minute points (end time in
/// unix s, encoded point), oldest first.
pub(super) struct SavedDataset {
    pub id: DatasetId,
    pub keys: SavedKeys,
    pub minutes: SavedMinutes,
}

/// The whole file.
pub(super) struct Saved {
    /// End (unix s) of the newest minute saved; 0 when none.
    pub newest_minute: u64,
    pub datasets: Vec<SavedDataset>,
}

pub(super) fn encode(saved: &Saved) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(saved.datasets.len() as u32).to_le_bytes());
    for d in &saved.datasets {
        let name = d.id.name();
        body.push(name.len() as u8);
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&(d.keys.len() as u32).to_le_bytes());
        for (id, key) in &d.keys {
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&(key.len() as u16).to_le_bytes());
            body.extend_from_slice(key.as_bytes());
        }
        body.extend_from_slice(&(d.minutes.len() as u32).to_le_bytes());
        for (time, blob) in &d.minutes {
            body.extend_from_slice(&time.to_le_bytes());
            body.extend_from_slice(&(blob.len() as u32).to_le_bytes());
            body.extend_from_slice(blob);
        }
    }
    let mut out = vec![0u8; HEADER_BYTES];
    out[..8].copy_from_slice(MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    out[16..24].copy_from_slice(&(body.len() as u64).to_le_bytes());
    out[24..32].copy_from_slice(&saved.newest_minute.to_le_bytes());
    let hash = checksum(&out[..32], &body);
    out[32..64].copy_from_slice(&hash);
    out.extend_from_slice(&body);
    out
}

fn checksum(header: &[u8], body: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(header);
    h.update(body);
    *h.finalize().as_bytes()
}

/// Bytes read in order, every read checked against what is left.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.b.len()).ok_or_else(|| format!("cut short in {what}"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap_or_default()))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap_or_default()))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap_or_default()))
    }
    /// A count, refused above `max`.
    fn count(&mut self, max: usize, what: &str) -> Result<usize, String> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(format!("{what}: {n} is over the limit of {max}"));
        }
        Ok(n)
    }
}

/// Check the header and the hash and parse the body; an error says what is wrong.
/// The points themselves are checked when they are loaded into a history.
pub(super) fn decode(bytes: &[u8]) -> Result<Saved, String> {
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return Err("not an analytics history file (no magic)".into());
    }
    let mut c = Cursor { b: bytes, pos: 8 };
    let version = c.u32("header")?;
    let header_bytes = c.u32("header")?;
    if version != VERSION || header_bytes as usize != HEADER_BYTES {
        return Err(format!("version {version} (header {header_bytes} bytes) is not one this build reads (version {VERSION})"));
    }
    let body_len = c.u64("header")?;
    if body_len != (bytes.len() - HEADER_BYTES) as u64 {
        return Err(format!("the body is {} bytes, the header says {body_len}: torn or cut short", bytes.len() - HEADER_BYTES));
    }
    let newest_minute = c.u64("header")?;
    if newest_minute % 60 != 0 || newest_minute > NEWEST_MINUTE_MAX {
        return Err(format!("newest minute {newest_minute} is not a minute's end in range"));
    }
    if checksum(&bytes[..32], &bytes[HEADER_BYTES..]) != bytes[32..64] {
        return Err("checksum mismatch: the file is damaged".into());
    }
    let mut c = Cursor { b: bytes, pos: HEADER_BYTES };
    let n = c.count(DatasetId::all().count(), "dataset count")?;
    let mut datasets: Vec<SavedDataset> = Vec::with_capacity(n);
    for _ in 0..n {
        let d = decode_dataset(&mut c)?;
        if datasets.iter().any(|o| o.id == d.id) {
            return Err(format!("dataset {} saved twice", d.id.name()));
        }
        datasets.push(d);
    }
    if c.pos != bytes.len() {
        return Err(format!("{} bytes after the last dataset", bytes.len() - c.pos));
    }
    Ok(Saved { newest_minute, datasets })
}

fn decode_dataset(c: &mut Cursor<'_>) -> Result<SavedDataset, String> {
    let len = c.u8("dataset name")? as usize;
    let name = c.take(len.min(NAME_BYTES_MAX + 1), "dataset name")?;
    let id = std::str::from_utf8(name).ok().and_then(DatasetId::parse).ok_or("a dataset name not in the catalog")?;
    let nkeys = c.count(KEY_TABLE_MAX, "key count")?;
    let mut keys = Vec::with_capacity(nkeys);
    for _ in 0..nkeys {
        let kid = c.u16("key")?;
        let klen = c.u16("key")? as usize;
        if klen > KEY_BYTES_MAX {
            return Err(format!("a key of {klen} bytes (limit {KEY_BYTES_MAX})"));
        }
        let key = std::str::from_utf8(c.take(klen, "key")?).map_err(|_| "a key that is not UTF-8")?;
        keys.push((kid, key.to_string()));
    }
    let nminutes = c.count(MINUTE_POINTS + 1, "minute count")?;
    let mut minutes = Vec::with_capacity(nminutes);
    for _ in 0..nminutes {
        let time = c.u64("minute")?;
        let blen = c.u32("minute")? as usize;
        if blen > id.point_bytes_max() {
            return Err(format!("{}: a point of {blen} bytes (limit {})", id.name(), id.point_bytes_max()));
        }
        minutes.push((time, c.take(blen, "minute")?.to_vec()));
    }
    Ok(SavedDataset { id, keys, minutes })
}

/// Replace `path` with `bytes`: `path`.tmp created new (never following a link),
/// written, fsync'd, renamed over `path`, then the directory fsync'd.
pub(super) fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let r = (|| {
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r?;
    File::open(dir)?.sync_all()
}

/// The bytes of `path`: None if there is no file; an error if it is not a regular
/// file, larger than `max_bytes`, or unreadable.
pub(super) fn read_file(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, super::LoadError> {
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK).open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r.map_err(super::LoadError::Io)?,
    };
    let meta = file.metadata().map_err(super::LoadError::Io)?;
    if !meta.is_file() {
        return Err(super::LoadError::Corrupt("not a regular file".into()));
    }
    if meta.len() > max_bytes {
        return Err(super::LoadError::TooLarge { bytes: meta.len(), max_bytes });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(super::LoadError::Io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(super::LoadError::TooLarge { bytes: bytes.len() as u64, max_bytes });
    }
    Ok(Some(bytes))
}
