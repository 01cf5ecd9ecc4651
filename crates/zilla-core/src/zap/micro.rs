//! zap::micro: the micro form, one block of 64-byte entries (on-disk-format.md §12.1).
//!
//! The whole block is decoded into a [`Micro`] per call (at most 255 entries), changed
//! and encoded again; entries are kept in the order they sit in, a freed slot is
//! reused. The block doubles from 512 bytes to [`FAT_BLOCK_BYTES`] as it fills; past
//! that, or for a name or value the form cannot hold, the caller turns it fat.

use super::{hash32, lowest_free_cd, u32_at, u64_at, ZapStore, FAT_BLOCK_BYTES, MICRO_MIN_BLOCK_BYTES};
use crate::{Error, Result};

/// "ZLZAPMIC" read as little-endian bytes.
pub const MAGIC: u64 = 0x4349_4d50_415a_4c5a;
const HEADER_BYTES: usize = 64;
const ENTRY_BYTES: usize = 64;
/// Longest name of the micro form.
pub const NAME_MAX_BYTES: usize = 49;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroEntry {
    pub name: Vec<u8>,
    pub value: u64,
    pub cd: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Micro {
    pub salt: u64,
    pub entries: Vec<MicroEntry>,
}

/// Entries a block of `bytes` holds.
fn capacity(bytes: usize) -> usize {
    (bytes - HEADER_BYTES) / ENTRY_BYTES
}

/// Decode block 0 (its magic checked by the caller or here).
pub fn read(store: &dyn ZapStore) -> Result<Micro> {
    let b = super::read_block(store, 0, "micro")?;
    decode(&b)
}

pub fn decode(b: &[u8]) -> Result<Micro> {
    let bad = |why: String| Error::Corrupt(format!("micro ZAP block 0: {why}"));
    if b.len() < MICRO_MIN_BLOCK_BYTES || b.len() > FAT_BLOCK_BYTES || !b.len().is_power_of_two() {
        return Err(bad(format!("block size {} is not a power of two from 512 to 16384", b.len())));
    }
    if u64_at(b, 0) != MAGIC {
        return Err(bad(format!("magic {:#018x}", u64_at(b, 0))));
    }
    let salt = u64_at(b, 8);
    if salt == 0 {
        return Err(bad("salt is zero".into()));
    }
    if !super::all_zero(&b[16..HEADER_BYTES]) {
        return Err(bad("reserved header bytes are not zero".into()));
    }
    let mut entries = Vec::new();
    for (i, e) in b[HEADER_BYTES..].chunks_exact(ENTRY_BYTES).enumerate() {
        if e.iter().all(|&x| x == 0) {
            continue;
        }
        let (value, cd) = (u64_at(e, 0), u32_at(e, 8));
        let name_field = &e[14..64];
        let len = name_field.iter().position(|&x| x == 0).unwrap_or(name_field.len());
        if len == 0 || len > NAME_MAX_BYTES || name_field[len..].iter().any(|&x| x != 0) || e[12..14] != [0, 0] {
            return Err(bad(format!("entry {i}: name is not 1 to 49 bytes followed by NUL padding")));
        }
        let name = name_field[..len].to_vec();
        let h = hash32(salt, &name);
        if cd >= super::CD_LIMIT || (h == 0 && cd < 3) {
            return Err(bad(format!("entry {i}: cd {cd} out of range")));
        }
        if entries.iter().any(|x: &MicroEntry| x.name == name || (x.cd == cd && hash32(salt, &x.name) == h)) {
            return Err(bad(format!("entry {i}: name or position repeated")));
        }
        entries.push(MicroEntry { name, value, cd });
    }
    Ok(Micro { salt, entries })
}

/// Encode into a block of `bytes` (the entries fit).
pub fn encode(m: &Micro, bytes: usize) -> Vec<u8> {
    assert!(m.entries.len() <= capacity(bytes), "micro ZAP entries fit the block");
    let mut b = vec![0u8; bytes];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&m.salt.to_le_bytes());
    for (i, e) in m.entries.iter().enumerate() {
        let at = HEADER_BYTES + i * ENTRY_BYTES;
        b[at..at + 8].copy_from_slice(&e.value.to_le_bytes());
        b[at + 8..at + 12].copy_from_slice(&e.cd.to_le_bytes());
        b[at + 14..at + 14 + e.name.len()].copy_from_slice(&e.name);
    }
    b
}

/// Write `m` as block 0, doubling the block while it does not fit.
pub fn write(store: &mut dyn ZapStore, m: &Micro) -> Result<()> {
    let mut bytes = store.block_bytes().max(MICRO_MIN_BLOCK_BYTES);
    while capacity(bytes) < m.entries.len() {
        bytes *= 2;
    }
    assert!(bytes <= FAT_BLOCK_BYTES, "a micro ZAP is at most 16 KiB");
    if bytes != store.block_bytes() {
        store.set_block_bytes(bytes)?;
    }
    store.write(0, &encode(m, bytes))
}

pub enum Put {
    Done,
    /// The form cannot hold the change: the caller turns the object fat and retries.
    NeedsFat,
}

/// Insert or (with `replace`) update in the micro form.
pub fn put(store: &mut dyn ZapStore, m: &mut Micro, name: &[u8], value: &[u8], replace: bool) -> Result<Put> {
    if let Some(e) = m.entries.iter_mut().find(|e| e.name == name) {
        if !replace {
            return Err(Error::Exists(format!("ZAP entry '{}'", String::from_utf8_lossy(name))));
        }
        if value.len() != 8 {
            return Ok(Put::NeedsFat);
        }
        e.value = u64::from_le_bytes(value.try_into().expect("8 bytes"));
        write(store, m)?;
        return Ok(Put::Done);
    }
    if name.len() > NAME_MAX_BYTES || value.len() != 8 || m.entries.len() >= capacity(FAT_BLOCK_BYTES) {
        return Ok(Put::NeedsFat);
    }
    let h = hash32(m.salt, name);
    let salt = m.salt;
    let cd = lowest_free_cd(h, m.entries.iter().filter(|e| hash32(salt, &e.name) == h).map(|e| e.cd))?;
    m.entries.push(MicroEntry { name: name.to_vec(), value: u64::from_le_bytes(value.try_into().expect("8 bytes")), cd });
    write(store, m)?;
    Ok(Put::Done)
}
