//! zap::fat: the fat form (on-disk-format.md §12.2): a header block with the pointer
//! table, 16 KiB leaf blocks of entries sorted by position, extendible hashing.
//!
//! A lookup reads the header, the table entry (embedded in the header up to 1024
//! entries, else in its own blocks) and one leaf, and searches the leaf's encoded bytes
//! without decoding it. A change decodes that one leaf, changes it, and writes it and
//! the header; an insert into a full leaf splits it first (and doubles the table when
//! the leaf has as many prefix bits as the table).

use super::micro::Micro;
use super::{hash32, lowest_free_cd, position, u16_at, u32_at, u64_at, ZapEntry, ZapStore, FAT_BLOCK_BYTES, NAME_MAX_BYTES, VALUE_MAX_BYTES};
use crate::{Error, Result};

/// "ZLZAPHDR" read as little-endian bytes.
pub const HEADER_MAGIC: u64 = 0x5244_4850_415a_4c5a;
/// "ZLZAPLEF" read as little-endian bytes.
pub const LEAF_MAGIC: u64 = 0x4645_4c50_415a_4c5a;
/// The table's bound: 2^20 entries.
pub const TABLE_SHIFT_MAX: u32 = 20;
/// Table entries embedded in the header block (at offset [`EMBEDDED_TABLE_AT`]).
const EMBEDDED_ENTRIES: usize = 1024;
const EMBEDDED_TABLE_AT: usize = 8192;
/// Table entries per external table block.
const ENTRIES_PER_TABLE_BLOCK: usize = FAT_BLOCK_BYTES / 8;
const LEAF_HEADER_BYTES: usize = 64;
const ENTRY_HEADER_BYTES: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub salt: u64,
    pub entries: u64,
    pub leaves: u64,
    pub next_free_blk: u64,
    /// 0: embedded.
    pub table_blk: u64,
    pub table_blocks: u64,
    pub table_shift: u32,
    /// The embedded table (its first 2^p entries), when embedded.
    embedded: Vec<u64>,
}

impl Header {
    fn table_len(&self) -> usize {
        1usize << self.table_shift
    }
}

pub fn read_header(store: &dyn ZapStore) -> Result<Header> {
    let b = super::read_block(store, 0, "header")?;
    decode_header(&b)
}

fn decode_header(b: &[u8]) -> Result<Header> {
    let bad = |why: String| Error::Corrupt(format!("fat ZAP header: {why}"));
    if b.len() != FAT_BLOCK_BYTES {
        return Err(bad(format!("block size {} (fat ZAP blocks are 16384 bytes)", b.len())));
    }
    if u64_at(b, 0) != HEADER_MAGIC {
        return Err(bad(format!("magic {:#018x}", u64_at(b, 0))));
    }
    let h = Header {
        salt: u64_at(b, 8),
        entries: u64_at(b, 16),
        leaves: u64_at(b, 24),
        next_free_blk: u64_at(b, 32),
        table_blk: u64_at(b, 40),
        table_blocks: u64_at(b, 48),
        table_shift: u32_at(b, 56),
        embedded: vec![],
    };
    if h.salt == 0 {
        return Err(bad("salt is zero".into()));
    }
    if h.table_shift > TABLE_SHIFT_MAX {
        return Err(bad(format!("table shift {} above {TABLE_SHIFT_MAX}", h.table_shift)));
    }
    if !super::all_zero(&b[60..EMBEDDED_TABLE_AT]) {
        return Err(bad("reserved bytes are not zero".into()));
    }
    if h.leaves == 0 || h.leaves > 1 << TABLE_SHIFT_MAX || h.next_free_blk < 2 || h.next_free_blk > 1 << 40 {
        return Err(bad(format!("{} leaves, next free block {}", h.leaves, h.next_free_blk)));
    }
    let embedded = h.table_len() <= EMBEDDED_ENTRIES;
    let mut h = h;
    if embedded {
        if h.table_blk != 0 || h.table_blocks != 0 {
            return Err(bad("a table of at most 1024 entries names blocks".into()));
        }
        h.embedded = (0..h.table_len()).map(|i| u64_at(b, EMBEDDED_TABLE_AT + 8 * i)).collect();
        if !super::all_zero(&b[EMBEDDED_TABLE_AT + 8 * h.table_len()..]) {
            return Err(bad("bytes after the embedded table are not zero".into()));
        }
    } else {
        let want = (h.table_len() / ENTRIES_PER_TABLE_BLOCK) as u64;
        if h.table_blocks != want || h.table_blk == 0 || h.table_blk.saturating_add(want) > h.next_free_blk {
            return Err(bad(format!("table of 2^{} entries at block {} ({} blocks)", h.table_shift, h.table_blk, h.table_blocks)));
        }
        if !super::all_zero(&b[EMBEDDED_TABLE_AT..]) {
            return Err(bad("an external table with an embedded one".into()));
        }
    }
    Ok(h)
}

fn encode_header(h: &Header) -> Vec<u8> {
    let mut b = vec![0u8; FAT_BLOCK_BYTES];
    b[0..8].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
    for (at, v) in [(8, h.salt), (16, h.entries), (24, h.leaves), (32, h.next_free_blk), (40, h.table_blk), (48, h.table_blocks)] {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    b[56..60].copy_from_slice(&h.table_shift.to_le_bytes());
    if h.table_blk == 0 {
        for (i, v) in h.embedded.iter().enumerate() {
            b[EMBEDDED_TABLE_AT + 8 * i..EMBEDDED_TABLE_AT + 8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    b
}

/// Table entry `i`: the leaf block id.
fn table_entry(store: &dyn ZapStore, h: &Header, i: usize) -> Result<u64> {
    let leaf = if h.table_blk == 0 {
        h.embedded[i]
    } else {
        let blk = h.table_blk + (i / ENTRIES_PER_TABLE_BLOCK) as u64;
        let b = super::read_block(store, blk, "pointer table")?;
        u64_at(&b, 8 * (i % ENTRIES_PER_TABLE_BLOCK))
    };
    if leaf == 0 || leaf >= h.next_free_blk {
        return Err(Error::Corrupt(format!("fat ZAP pointer table entry {i} names block {leaf}")));
    }
    Ok(leaf)
}

/// The whole table (for a change of it).
fn read_table(store: &dyn ZapStore, h: &Header) -> Result<Vec<u64>> {
    if h.table_blk == 0 {
        return Ok(h.embedded.clone());
    }
    let mut t = Vec::with_capacity(h.table_len());
    for k in 0..h.table_blocks {
        let b = super::read_block(store, h.table_blk + k, "pointer table")?;
        t.extend((0..ENTRIES_PER_TABLE_BLOCK).map(|i| u64_at(&b, 8 * i)));
    }
    Ok(t)
}

/// Write `table` (2^p entries) where the header says: embedded, or its external
/// blocks (`blocks`: only those that changed, by index; `None`: all).
fn write_table(store: &mut dyn ZapStore, h: &mut Header, table: &[u64], changed: Option<std::ops::Range<usize>>) -> Result<()> {
    if h.table_blk == 0 {
        h.embedded = table.to_vec();
        return Ok(());
    }
    let blocks = match changed {
        Some(r) if !r.is_empty() => (r.start / ENTRIES_PER_TABLE_BLOCK)..((r.end - 1) / ENTRIES_PER_TABLE_BLOCK + 1),
        Some(_) => 0..0,
        None => 0..h.table_blocks as usize,
    };
    for k in blocks {
        let mut b = vec![0u8; FAT_BLOCK_BYTES];
        for (i, v) in table[k * ENTRIES_PER_TABLE_BLOCK..(k + 1) * ENTRIES_PER_TABLE_BLOCK].iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        store.write(h.table_blk + k as u64, &b)?;
    }
    Ok(())
}

/// A decoded leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Leaf {
    prefix_len: u32,
    prefix: u32,
    /// In position order.
    entries: Vec<LeafEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LeafEntry {
    hash: u32,
    cd: u32,
    name: Vec<u8>,
    value: Vec<u8>,
}

impl LeafEntry {
    fn bytes(&self) -> usize {
        ENTRY_HEADER_BYTES + self.name.len() + self.value.len()
    }
    fn position(&self) -> u64 {
        position(self.hash, self.cd)
    }
}

impl Leaf {
    fn used_bytes(&self) -> usize {
        LEAF_HEADER_BYTES + self.entries.iter().map(LeafEntry::bytes).sum::<usize>()
    }
}

/// Walk a leaf block's entries without decoding them: (hash, cd, name, value) each.
/// Checks every limit; `salt` and the prefix are checked by [`decode_leaf`].
fn leaf_entries<'a>(b: &'a [u8], blk: u64) -> Result<(u32, u32, Vec<(u32, u32, &'a [u8], &'a [u8])>)> {
    let bad = |why: String| Error::Corrupt(format!("fat ZAP leaf block {blk}: {why}"));
    if b.len() != FAT_BLOCK_BYTES || u64_at(b, 0) != LEAF_MAGIC {
        return Err(bad("not a leaf (magic or size)".into()));
    }
    let (q, prefix, n, used) = (u32_at(b, 8), u32_at(b, 12), u32_at(b, 16) as usize, u32_at(b, 20) as usize);
    if q > TABLE_SHIFT_MAX || (q < 32 && u64::from(prefix) >> q != 0) || used < LEAF_HEADER_BYTES || used > FAT_BLOCK_BYTES {
        return Err(bad(format!("prefix {prefix} of {q} bits, {used} bytes used")));
    }
    if !super::all_zero(&b[24..LEAF_HEADER_BYTES]) || !super::all_zero(&b[used..]) {
        return Err(bad("reserved or unused bytes are not zero".into()));
    }
    if n > (used - LEAF_HEADER_BYTES) / ENTRY_HEADER_BYTES {
        return Err(bad(format!("{n} entries cannot fit {used} bytes")));
    }
    let mut out = Vec::with_capacity(n);
    let mut at = LEAF_HEADER_BYTES;
    let mut last: Option<u64> = None;
    for i in 0..n {
        if at + ENTRY_HEADER_BYTES > used {
            return Err(bad(format!("entry {i} runs past the bytes used")));
        }
        let (hash, cd, nl, vl) = (u32_at(b, at), u32_at(b, at + 4), u16_at(b, at + 8) as usize, u16_at(b, at + 10) as usize);
        let end = at + ENTRY_HEADER_BYTES + nl + vl;
        if nl == 0 || nl > NAME_MAX_BYTES || vl > VALUE_MAX_BYTES || end > used {
            return Err(bad(format!("entry {i}: name {nl} bytes, value {vl} bytes")));
        }
        if cd >= super::CD_LIMIT || (hash == 0 && cd < 3) || (q > 0 && hash >> (32 - q) != prefix) {
            return Err(bad(format!("entry {i}: hash {hash:08x} cd {cd} outside the leaf's prefix")));
        }
        let pos = position(hash, cd);
        if last.is_some_and(|l| l >= pos) {
            return Err(bad(format!("entry {i}: positions out of order")));
        }
        last = Some(pos);
        let name = &b[at + ENTRY_HEADER_BYTES..at + ENTRY_HEADER_BYTES + nl];
        if name.contains(&0) {
            return Err(bad(format!("entry {i}: name holds a NUL")));
        }
        out.push((hash, cd, name, &b[at + ENTRY_HEADER_BYTES + nl..end]));
        at = end;
    }
    if at != used {
        return Err(bad(format!("{used} bytes used, the entries fill {at}")));
    }
    Ok((q, prefix, out))
}

fn decode_leaf(b: &[u8], blk: u64, salt: u64) -> Result<Leaf> {
    let (prefix_len, prefix, raw) = leaf_entries(b, blk)?;
    let mut entries: Vec<LeafEntry> = Vec::with_capacity(raw.len());
    for (i, (hash, cd, name, value)) in raw.into_iter().enumerate() {
        if super::hash32(salt, name) != hash {
            return Err(Error::Corrupt(format!("fat ZAP leaf block {blk}: entry {i}: hash does not match its name")));
        }
        // same name, same hash: a repeat would sit among the entries of its hash
        if entries.iter().rev().take_while(|e| e.hash == hash).any(|e| e.name == name) {
            return Err(Error::Corrupt(format!("fat ZAP leaf block {blk}: entry {i}: name repeated")));
        }
        entries.push(LeafEntry { hash, cd, name: name.to_vec(), value: value.to_vec() });
    }
    Ok(Leaf { prefix_len, prefix, entries })
}

fn encode_leaf(l: &Leaf) -> Vec<u8> {
    let used = l.used_bytes();
    assert!(used <= FAT_BLOCK_BYTES, "a leaf fits its block");
    let mut b = vec![0u8; FAT_BLOCK_BYTES];
    b[0..8].copy_from_slice(&LEAF_MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&l.prefix_len.to_le_bytes());
    b[12..16].copy_from_slice(&l.prefix.to_le_bytes());
    b[16..20].copy_from_slice(&(l.entries.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&(used as u32).to_le_bytes());
    let mut at = LEAF_HEADER_BYTES;
    for e in &l.entries {
        b[at..at + 4].copy_from_slice(&e.hash.to_le_bytes());
        b[at + 4..at + 8].copy_from_slice(&e.cd.to_le_bytes());
        b[at + 8..at + 10].copy_from_slice(&(e.name.len() as u16).to_le_bytes());
        b[at + 10..at + 12].copy_from_slice(&(e.value.len() as u16).to_le_bytes());
        b[at + 12..at + 12 + e.name.len()].copy_from_slice(&e.name);
        b[at + 12 + e.name.len()..at + e.bytes()].copy_from_slice(&e.value);
        at += e.bytes();
    }
    b
}

/// The table index of `hash`.
fn index_of(h: &Header, hash: u32) -> usize {
    if h.table_shift == 0 {
        0
    } else {
        (hash >> (32 - h.table_shift)) as usize
    }
}


/// Check that a leaf's prefix agrees with the table index that led to it.
fn check_leaf_index(h: &Header, blk: u64, q: u32, prefix: u32, index: usize) -> Result<()> {
    let ok = q <= h.table_shift && (q == 0 || (index >> (h.table_shift - q)) as u32 == prefix);
    if !ok {
        return Err(Error::Corrupt(format!("fat ZAP leaf block {blk}: prefix {prefix} of {q} bits, reached by table entry {index} of 2^{}", h.table_shift)));
    }
    Ok(())
}

pub fn lookup(store: &dyn ZapStore, name: &[u8]) -> Result<Option<Vec<u8>>> {
    let h = read_header(store)?;
    let hash = hash32(h.salt, name);
    let blk = table_entry(store, &h, index_of(&h, hash))?;
    let b = super::read_block(store, blk, "leaf")?;
    let (q, prefix, entries) = leaf_entries(&b, blk)?;
    check_leaf_index(&h, blk, q, prefix, index_of(&h, hash))?;
    Ok(entries.into_iter().find(|&(eh, _, n, _)| eh == hash && n == name).map(|(_, _, _, v)| v.to_vec()))
}

/// Turn the micro ZAP `m` (block 0 of `store`) into a fat one holding the same
/// entries at the same positions.
pub fn upgrade(store: &mut dyn ZapStore, m: &Micro) -> Result<()> {
    store.set_block_bytes(FAT_BLOCK_BYTES)?;
    let mut entries: Vec<LeafEntry> =
        m.entries.iter().map(|e| LeafEntry { hash: hash32(m.salt, &e.name), cd: e.cd, name: e.name.clone(), value: e.value.to_le_bytes().to_vec() }).collect();
    entries.sort_by_key(LeafEntry::position);
    let leaf = Leaf { prefix_len: 0, prefix: 0, entries };
    // 255 micro entries of at most 12 + 49 + 8 bytes fit one leaf
    assert!(leaf.used_bytes() <= FAT_BLOCK_BYTES, "a micro ZAP's entries fit one leaf");
    let h = Header { salt: m.salt, entries: m.entries.len() as u64, leaves: 1, next_free_blk: 2, table_blk: 0, table_blocks: 0, table_shift: 0, embedded: vec![1] };
    store.write(1, &encode_leaf(&leaf))?;
    store.write(0, &encode_header(&h))
}

pub fn put(store: &mut dyn ZapStore, name: &[u8], value: &[u8], replace: bool) -> Result<()> {
    let mut h = read_header(store)?;
    let hash = hash32(h.salt, name);
    loop {
        let index = index_of(&h, hash);
        let blk = table_entry(store, &h, index)?;
        let b = super::read_block(store, blk, "leaf")?;
        let (q, prefix, entries) = leaf_entries(&b, blk)?;
        check_leaf_index(&h, blk, q, prefix, index)?;
        let used = u32_at(&b, 20) as usize;
        // where each entry starts, to edit the encoded block in place
        let mut offsets = Vec::with_capacity(entries.len() + 1);
        let mut at = LEAF_HEADER_BYTES;
        for &(_, _, n, v) in &entries {
            offsets.push(at);
            at += ENTRY_HEADER_BYTES + n.len() + v.len();
        }
        offsets.push(at);
        let existing = entries.iter().position(|&(eh, _, n, _)| eh == hash && n == name);
        let new_entry = |cd: u32| {
            let mut e = Vec::with_capacity(ENTRY_HEADER_BYTES + name.len() + value.len());
            e.extend_from_slice(&hash.to_le_bytes());
            e.extend_from_slice(&cd.to_le_bytes());
            e.extend_from_slice(&(name.len() as u16).to_le_bytes());
            e.extend_from_slice(&(value.len() as u16).to_le_bytes());
            e.extend_from_slice(name);
            e.extend_from_slice(value);
            e
        };
        let (slot, old_bytes, encoded, added) = match existing {
            Some(_) if !replace => return Err(Error::Exists(format!("ZAP entry '{}'", String::from_utf8_lossy(name)))),
            Some(i) => (i, offsets[i + 1] - offsets[i], new_entry(entries[i].1), false),
            None => {
                let cd = lowest_free_cd(hash, entries.iter().filter(|e| e.0 == hash).map(|e| e.1))?;
                let pos = position(hash, cd);
                (entries.partition_point(|e| position(e.0, e.1) < pos), 0, new_entry(cd), true)
            }
        };
        let new_used = used - old_bytes + encoded.len();
        if new_used <= FAT_BLOCK_BYTES {
            let n = entries.len() + usize::from(added);
            let mut nb = Vec::with_capacity(FAT_BLOCK_BYTES);
            nb.extend_from_slice(&b[..offsets[slot]]);
            nb.extend_from_slice(&encoded);
            nb.extend_from_slice(&b[offsets[slot] + old_bytes..used]);
            nb.resize(FAT_BLOCK_BYTES, 0);
            nb[16..20].copy_from_slice(&(n as u32).to_le_bytes());
            nb[20..24].copy_from_slice(&(new_used as u32).to_le_bytes());
            drop(entries);
            drop(b);
            store.write(blk, &nb)?;
            if added {
                h.entries += 1;
                store.write(0, &encode_header(&h))?;
            }
            return Ok(());
        }
        let leaf = decode_leaf(&b, blk, h.salt)?;
        drop(entries);
        drop(b);
        split(store, &mut h, blk, leaf, index)?;
    }
}

/// Split the full leaf `blk` (reached through table entry `index`) on its next hash
/// bit, doubling the table first when the leaf has as many prefix bits as the table.
/// Writes both leaves, the table's changed part and the header.
fn split(store: &mut dyn ZapStore, h: &mut Header, blk: u64, leaf: Leaf, index: usize) -> Result<()> {
    let q = leaf.prefix_len;
    if q >= TABLE_SHIFT_MAX {
        return Err(Error::NoSpaceFor(format!("ZAP leaf block {blk}: too many names with one hash prefix ({q} bits)")));
    }
    let mut table = read_table(store, h)?;
    let mut index = index;
    if q == h.table_shift {
        table = table.iter().flat_map(|&l| [l, l]).collect();
        index *= 2;
        let old_blk = (h.table_blk, h.table_blocks);
        h.table_shift += 1;
        if h.table_len() > EMBEDDED_ENTRIES {
            h.table_blocks = (h.table_len() / ENTRIES_PER_TABLE_BLOCK) as u64;
            h.table_blk = h.next_free_blk;
            h.next_free_blk += h.table_blocks;
            write_table(store, h, &table, None)?;
            for k in 0..old_blk.1 {
                store.free(old_blk.0 + k)?;
            }
        } else {
            h.embedded = table.clone();
        }
    }
    let bit = 31 - q;
    let (high, low): (Vec<LeafEntry>, Vec<LeafEntry>) = leaf.entries.into_iter().partition(|e| e.hash >> bit & 1 == 1);
    let new_blk = h.next_free_blk;
    h.next_free_blk += 1;
    h.leaves += 1;
    let lo = Leaf { prefix_len: q + 1, prefix: leaf.prefix << 1, entries: low };
    let hi = Leaf { prefix_len: q + 1, prefix: leaf.prefix << 1 | 1, entries: high };
    // the table entries the old leaf covered: the upper half now names the new leaf
    let span = 1usize << (h.table_shift - q);
    let first = (index >> (h.table_shift - q)) << (h.table_shift - q);
    for e in &mut table[first + span / 2..first + span] {
        *e = new_blk;
    }
    store.write(blk, &encode_leaf(&lo))?;
    store.write(new_blk, &encode_leaf(&hi))?;
    write_table(store, h, &table, Some(first + span / 2..first + span))?;
    store.write(0, &encode_header(h))?;
    Ok(())
}

pub fn remove(store: &mut dyn ZapStore, name: &[u8]) -> Result<bool> {
    let mut h = read_header(store)?;
    let hash = hash32(h.salt, name);
    let index = index_of(&h, hash);
    let blk = table_entry(store, &h, index)?;
    let b = super::read_block(store, blk, "leaf")?;
    let (q, prefix, entries) = leaf_entries(&b, blk)?;
    check_leaf_index(&h, blk, q, prefix, index)?;
    let mut at = LEAF_HEADER_BYTES;
    let mut found = None;
    for &(eh, _, n, v) in &entries {
        let len = ENTRY_HEADER_BYTES + n.len() + v.len();
        if eh == hash && n == name {
            found = Some((at, len));
            break;
        }
        at += len;
    }
    let Some((at, len)) = found else { return Ok(false) };
    let (n, used) = (entries.len() - 1, u32_at(&b, 20) as usize - len);
    let mut nb = Vec::with_capacity(FAT_BLOCK_BYTES);
    nb.extend_from_slice(&b[..at]);
    nb.extend_from_slice(&b[at + len..used + len]);
    nb.resize(FAT_BLOCK_BYTES, 0);
    nb[16..20].copy_from_slice(&(n as u32).to_le_bytes());
    nb[20..24].copy_from_slice(&(used as u32).to_le_bytes());
    drop(entries);
    drop(b);
    h.entries = h.entries.checked_sub(1).ok_or_else(|| Error::Corrupt("fat ZAP header: entry count is zero with an entry present".into()))?;
    store.write(blk, &nb)?;
    store.write(0, &encode_header(&h))?;
    Ok(true)
}

pub fn list(store: &dyn ZapStore, from: u64, max: usize) -> Result<Vec<ZapEntry>> {
    let h = read_header(store)?;
    let mut out = Vec::new();
    let mut index = index_of(&h, (from >> 32) as u32);
    while index < h.table_len() && out.len() < max {
        let blk = table_entry(store, &h, index)?;
        let b = super::read_block(store, blk, "leaf")?;
        let (q, prefix, entries) = leaf_entries(&b, blk)?;
        check_leaf_index(&h, blk, q, prefix, index)?;
        for (hash, cd, name, value) in entries {
            let pos = position(hash, cd);
            if pos >= from && out.len() < max {
                out.push(ZapEntry { position: pos, name: name.to_vec(), value: value.to_vec() });
            }
        }
        // the next leaf starts after the table entries this one covers
        index = ((index >> (h.table_shift - q)) + 1) << (h.table_shift - q);
    }
    Ok(out)
}

pub fn blocks(store: &dyn ZapStore) -> Result<Vec<u64>> {
    let h = read_header(store)?;
    let mut out: Vec<u64> = read_table(store, &h)?;
    out.sort_unstable();
    out.dedup();
    out.insert(0, 0);
    out.extend(h.table_blk..h.table_blk + h.table_blocks);
    out.sort_unstable();
    Ok(out)
}
