//! zap: name → value objects (OpenZFS's ZAP), the directory structure of format 2.
//!
//! Theory of operation
//! -------------------
//! A ZAP object maps names (1 … [`NAME_MAX_BYTES`] bytes, no NUL) to values (byte
//! strings of at most [`VALUE_MAX_BYTES`]; a u64 is 8 little-endian bytes). The MOS's
//! object directory, the dataset directory's child maps, properties and (with file
//! systems) directories are ZAPs. The byte maps are docs/on-disk-format.md §12.
//!
//! **The seam.** A ZAP is code over an object's data blocks and nothing else: it reads,
//! writes and frees whole blocks by block id through [`ZapStore`], which the DMU
//! implements for a dnode inside a transaction (the blocks a change writes become dirty
//! records of that txg) and a test implements over a map ([`MemStore`]). The ZAP keeps
//! no state between calls: every call starts from block 0, so a ZAP is exactly what its
//! blocks say, and caching is the DMU's (the ARC and the dirty records).
//!
//! **Two forms.** A micro ZAP ([`micro`]) is one block of 64-byte entries: names of at
//! most 49 bytes, u64 values, no order on disk; it doubles its block from 512 bytes
//! up to 16 KiB as it fills. Anything it cannot hold (a longer name, a value that is
//! not 8 bytes, a 256th entry) turns it into a fat ZAP ([`fat`]), in the same call:
//! a header block with a pointer table of 2^p leaf block ids indexed by the top p bits
//! of the name's hash, and 16 KiB leaf blocks of entries sorted by hash (extendible
//! hashing: a full leaf splits on the next hash bit; the table doubles when a leaf
//! with as many prefix bits as the table splits). A fat ZAP stays fat.
//!
//! **Hash, position, cursor.** Every entry has a position `hash32 << 32 | cd`: the top
//! 32 bits of a salted CRC-64 of its name, and a collision differentiator unique among
//! the entries of that hash, kept when the object changes form. Positions order the
//! entries the same way in both forms; [`list`] returns entries from a position on, so
//! a cursor is one u64 (as zap_cursor_serialize) that stays valid while the object
//! changes: an entry present throughout is returned once, never skipped. No entry's
//! position is 0, 1 or 2 (a cd of hash 0 starts at 3), so positions can be NFS
//! READDIR cookies, where 0 starts and 1, 2 are `.` and `..`.
//!
//! **Bounds.** Names 256 bytes, values 2048 bytes, at most 2^20 entries of one hash
//! (cd), a table of at most 2^20 leaves (16 GiB of leaves, far above the entry counts
//! the layers above reach); a leaf that cannot split further refuses the insert. Every
//! block read is decoded with its limits checked: a crafted or damaged block is a
//! `Corrupt` error naming the block and field, never a panic.
//!
//! **Crash safety** is the DMU's: a call's block writes belong to one transaction and
//! reach the pool in one txg or not at all; a ZAP is never seen half changed (a split
//! writes both leaves, the table and the header in the same txg).

pub mod fat;
pub mod micro;

use crate::{Error, Result};

/// Longest name.
pub const NAME_MAX_BYTES: usize = 256;
/// Largest value.
pub const VALUE_MAX_BYTES: usize = 2048;
/// Collision differentiators are below this (entries of one hash32).
pub const CD_LIMIT: u32 = 1 << 20;
/// The block size of a fat ZAP, and the largest micro block.
pub const FAT_BLOCK_BYTES: usize = 16 << 10;
/// The first micro block size.
pub const MICRO_MIN_BLOCK_BYTES: usize = 512;

/// Where ZAP blocks live: one object's data blocks (the DMU's dnode in a transaction,
/// or a test's map). Blocks are `block_bytes()` long.
pub trait ZapStore {
    /// The object's data block size.
    fn block_bytes(&self) -> usize;
    /// Change the data block size; only while the object holds no block but block 0
    /// (the micro form growing, or turning fat).
    fn set_block_bytes(&mut self, bytes: usize) -> Result<()>;
    /// Block `blkid`, `block_bytes()` long; `None` for a hole.
    fn read(&self, blkid: u64) -> Result<Option<std::borrow::Cow<'_, [u8]>>>;
    /// Write block `blkid` (`data` is `block_bytes()` long).
    fn write(&mut self, blkid: u64, data: &[u8]) -> Result<()>;
    /// Free block `blkid` (it reads as a hole after).
    fn free(&mut self, blkid: u64) -> Result<()>;
}

/// One entry as [`list`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZapEntry {
    /// `hash32 << 32 | cd`: never 0, 1 or 2; a cursor at `position + 1` resumes after it.
    pub position: u64,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// The form of a ZAP object, as block 0 says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Micro,
    Fat,
}

/// The salted hash of `name` (§12): CRC-64 (ECMA-182, reflected) from `salt`.
pub fn hash64(salt: u64, name: &[u8]) -> u64 {
    let table = crc64_table();
    let mut h = salt;
    for &b in name {
        h = (h >> 8) ^ table[((h ^ u64::from(b)) & 0xff) as usize];
    }
    h
}

/// The top 32 bits of [`hash64`]: what orders entries and picks their leaf.
pub fn hash32(salt: u64, name: &[u8]) -> u32 {
    (hash64(salt, name) >> 32) as u32
}

fn crc64_table() -> &'static [u64; 256] {
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        const POLY: u64 = 0xC96C_5795_D787_0F42;
        let mut t = [0u64; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u64;
            for _ in 0..8 {
                c = if c & 1 == 1 { (c >> 1) ^ POLY } else { c >> 1 };
            }
            *e = c;
        }
        t
    })
}

/// An entry's position.
pub fn position(hash32: u32, cd: u32) -> u64 {
    u64::from(hash32) << 32 | u64::from(cd)
}

/// The lowest cd of `hash` not in `used` (at least 3 for hash 0, so no position is
/// 0, 1 or 2).
pub(crate) fn lowest_free_cd(hash: u32, used: impl Iterator<Item = u32>) -> Result<u32> {
    let mut taken: Vec<u32> = used.collect();
    taken.sort_unstable();
    let mut cd = if hash == 0 { 3 } else { 0 };
    for t in taken {
        if t == cd {
            cd += 1;
        } else if t > cd {
            break;
        }
    }
    if cd >= CD_LIMIT {
        return Err(Error::invalid(format!("too many names with hash {hash:08x} in one ZAP object")));
    }
    Ok(cd)
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX_BYTES {
        return Err(Error::invalid(format!("a ZAP name is 1 to {NAME_MAX_BYTES} bytes, not {}", name.len())));
    }
    if name.contains(&0) {
        return Err(Error::invalid("a ZAP name holds no NUL byte"));
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > VALUE_MAX_BYTES {
        return Err(Error::invalid(format!("a ZAP value is at most {VALUE_MAX_BYTES} bytes, not {}", value.len())));
    }
    Ok(())
}

/// Every byte of `b` is zero (without an early exit, so it vectorizes: padding checks
/// of whole blocks run at memory speed).
pub(crate) fn all_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |acc, &x| acc | x) == 0
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// Block 0, or a corrupt-object error (a ZAP always has block 0).
pub(crate) fn read_block<'a>(store: &'a dyn ZapStore, blkid: u64, what: &str) -> Result<std::borrow::Cow<'a, [u8]>> {
    let b = store.read(blkid)?.ok_or_else(|| Error::Corrupt(format!("ZAP {what} block {blkid} is a hole")))?;
    if b.len() != store.block_bytes() {
        return Err(Error::Corrupt(format!("ZAP block {blkid} is {} bytes, the object's blocks {}", b.len(), store.block_bytes())));
    }
    Ok(b)
}

/// The form block 0 says the object is in.
pub fn form(store: &dyn ZapStore) -> Result<Form> {
    let b = read_block(store, 0, "first")?;
    if b.len() < 64 {
        return Err(Error::Corrupt(format!("ZAP block 0 is {} bytes", b.len())));
    }
    match u64_at(&b, 0) {
        micro::MAGIC => Ok(Form::Micro),
        fat::HEADER_MAGIC => Ok(Form::Fat),
        m => Err(Error::Corrupt(format!("ZAP block 0: magic {m:#018x} is neither a micro ZAP's nor a fat ZAP's"))),
    }
}

/// Make the object an empty micro ZAP with hash salt `salt` (non-zero).
pub fn create(store: &mut dyn ZapStore, salt: u64) -> Result<()> {
    assert!(salt != 0, "a ZAP's salt is non-zero");
    store.set_block_bytes(MICRO_MIN_BLOCK_BYTES)?;
    micro::write(store, &micro::Micro { salt, entries: vec![] })
}

/// The value of `name`, if present.
pub fn lookup(store: &dyn ZapStore, name: &[u8]) -> Result<Option<Vec<u8>>> {
    check_name(name)?;
    match form(store)? {
        Form::Micro => Ok(micro::read(store)?.entries.into_iter().find(|e| e.name == name).map(|e| e.value.to_le_bytes().to_vec())),
        Form::Fat => fat::lookup(store, name),
    }
}

/// The value of `name` as a u64 (an error if it is not 8 bytes).
pub fn lookup_u64(store: &dyn ZapStore, name: &[u8]) -> Result<Option<u64>> {
    match lookup(store, name)? {
        None => Ok(None),
        Some(v) if v.len() == 8 => Ok(Some(u64::from_le_bytes(v[..].try_into().expect("8 bytes")))),
        Some(v) => Err(Error::Corrupt(format!("ZAP entry '{}' is {} bytes, not a u64", String::from_utf8_lossy(name), v.len()))),
    }
}

/// Add `name` → `value`; `Exists` if the name is there.
pub fn insert(store: &mut dyn ZapStore, name: &[u8], value: &[u8]) -> Result<()> {
    put(store, name, value, false)
}

/// Set `name` → `value`, whether or not it was there (its position is kept).
pub fn update(store: &mut dyn ZapStore, name: &[u8], value: &[u8]) -> Result<()> {
    put(store, name, value, true)
}

fn put(store: &mut dyn ZapStore, name: &[u8], value: &[u8], replace: bool) -> Result<()> {
    check_name(name)?;
    check_value(value)?;
    if form(store)? == Form::Micro {
        let mut m = micro::read(store)?;
        match micro::put(store, &mut m, name, value, replace)? {
            micro::Put::Done => return Ok(()),
            micro::Put::NeedsFat => fat::upgrade(store, &m)?,
        }
    }
    fat::put(store, name, value, replace)
}

/// Remove `name`; `false` if it was not there.
pub fn remove(store: &mut dyn ZapStore, name: &[u8]) -> Result<bool> {
    check_name(name)?;
    match form(store)? {
        Form::Micro => {
            let mut m = micro::read(store)?;
            let before = m.entries.len();
            m.entries.retain(|e| e.name != name);
            if m.entries.len() == before {
                return Ok(false);
            }
            micro::write(store, &m)?;
            Ok(true)
        }
        Form::Fat => fat::remove(store, name),
    }
}

/// How many entries the object holds.
pub fn count(store: &dyn ZapStore) -> Result<u64> {
    match form(store)? {
        Form::Micro => Ok(micro::read(store)?.entries.len() as u64),
        Form::Fat => Ok(fat::read_header(store)?.entries),
    }
}

/// Up to `max` entries in position order, from the first whose position is ≥ `from`
/// (0: the first entry). A cursor resumes with `from` = the last position + 1.
pub fn list(store: &dyn ZapStore, from: u64, max: usize) -> Result<Vec<ZapEntry>> {
    match form(store)? {
        Form::Micro => {
            let m = micro::read(store)?;
            let mut out: Vec<ZapEntry> = m
                .entries
                .into_iter()
                .map(|e| ZapEntry { position: position(hash32(m.salt, &e.name), e.cd), name: e.name, value: e.value.to_le_bytes().to_vec() })
                .filter(|e| e.position >= from)
                .collect();
            out.sort_by_key(|e| e.position);
            out.truncate(max);
            Ok(out)
        }
        Form::Fat => fat::list(store, from, max),
    }
}

/// Every block id the object uses (for freeing it and for checks).
pub fn blocks(store: &dyn ZapStore) -> Result<Vec<u64>> {
    match form(store)? {
        Form::Micro => Ok(vec![0]),
        Form::Fat => fat::blocks(store),
    }
}

/// A [`ZapStore`] over a map: tests, and tools that build a ZAP in memory.
#[derive(Debug, Clone, Default)]
pub struct MemStore {
    pub block_bytes: usize,
    pub blocks: std::collections::HashMap<u64, Vec<u8>>,
    /// Block writes so far (what a change costs).
    pub writes: u64,
}

impl ZapStore for MemStore {
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }
    fn set_block_bytes(&mut self, bytes: usize) -> Result<()> {
        if self.blocks.keys().any(|&b| b != 0) {
            return Err(Error::invalid("the block size of an object with more than one block cannot change"));
        }
        if let Some(b) = self.blocks.get_mut(&0) {
            b.resize(bytes, 0);
        }
        self.block_bytes = bytes;
        Ok(())
    }
    fn read(&self, blkid: u64) -> Result<Option<std::borrow::Cow<'_, [u8]>>> {
        Ok(self.blocks.get(&blkid).map(|b| std::borrow::Cow::Borrowed(&b[..])))
    }
    fn write(&mut self, blkid: u64, data: &[u8]) -> Result<()> {
        assert_eq!(data.len(), self.block_bytes, "a block write is one whole block");
        self.writes += 1;
        self.blocks.insert(blkid, data.to_vec());
        Ok(())
    }
    fn free(&mut self, blkid: u64) -> Result<()> {
        self.blocks.remove(&blkid);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
