//! Newtypes for the numbers the engine passes around: transaction group, guid, top-level
//! vdev id and block id; and the one rule for printing a name read from a device or sent
//! by a client ([`printable`]).
//!
//! Theory of operation
//! -------------------
//! Each of these is a `u64` (a `u32` for [`VdevId`]) on disk and in the label JSON, and a
//! distinct type in memory, so that a txg cannot be passed where a block id is expected,
//! nor a leaf guid where a top-level vdev id is. The wrappers are `#[repr(transparent)]`
//! and `#[serde(transparent)]`: the on-disk encoding (little-endian of `.0`) and the
//! config JSON are byte-identical to the bare integers they replace. Display prints the
//! bare number, as the CLI and the logs always have.
//!
//! Arithmetic on txgs goes through named methods ([`Txg::next`], [`Txg::prev`],
//! [`Txg::plus`], [`Txg::minus`], [`Txg::since`]) that say what they mean and cannot
//! underflow. This module imports nothing from the crate: every layer may use it.

use std::fmt;

/// A transaction group number. Txg 0 is "never" (a hole's birth, no txg synced yet);
/// real txgs start at `txg::TXG_INITIAL`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
#[repr(transparent)]
pub struct Txg(pub u64);

impl Txg {
    /// "No txg": the birth of a hole, the synced txg of a pool that never synced.
    pub const ZERO: Txg = Txg(0);
    /// Txgs on disk are below 2^63 (docs/on-disk-format.md): a larger one read from a
    /// device is corrupt, and no txg after this one is ever opened.
    pub const LIMIT: Txg = Txg(1 << 63);

    pub const fn get(self) -> u64 {
        self.0
    }
    /// The txg after this one.
    pub const fn next(self) -> Txg {
        Txg(self.0 + 1)
    }
    /// The txg after this one, or None when it would reach [`Txg::LIMIT`] (the counter
    /// never wraps: an exhausted counter is an error, never txg 0 again).
    pub const fn checked_next(self) -> Option<Txg> {
        if self.0 >= Self::LIMIT.0 - 1 {
            None
        } else {
            Some(Txg(self.0 + 1))
        }
    }
    /// A pool's newest txg (its uberblock's, its config's) is below this: 2^32 txgs
    /// (136 years at one a second) below [`Txg::LIMIT`], so a pool loaded from any
    /// valid uberblock never reaches the end of the counter.
    pub const POOL_LIMIT: Txg = Txg(Self::LIMIT.0 - (1 << 32));
    /// Below [`Txg::LIMIT`]: a txg a block pointer, a log record or a DTL may hold.
    pub const fn is_valid_on_disk(self) -> bool {
        self.0 < Self::LIMIT.0
    }
    /// Below [`Txg::POOL_LIMIT`]: a txg an uberblock or a label config may hold.
    pub const fn is_valid_pool_txg(self) -> bool {
        self.0 < Self::POOL_LIMIT.0
    }
    /// The txg before this one (ZERO stays ZERO).
    pub const fn prev(self) -> Txg {
        Txg(self.0.saturating_sub(1))
    }
    /// The txg `n` after this one.
    pub const fn plus(self, n: u64) -> Txg {
        Txg(self.0 + n)
    }
    /// The txg `n` before this one, stopping at ZERO.
    pub const fn minus(self, n: u64) -> Txg {
        Txg(self.0.saturating_sub(n))
    }
    /// How many txgs `earlier` is behind this one (0 if it is not behind).
    pub const fn since(self, earlier: Txg) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
    /// Slot of this txg in a per-txg ring of `size` entries (`size` a power of two).
    pub const fn ring_slot(self, size: usize) -> usize {
        (self.0 as usize) & (size - 1)
    }
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

/// A pool, top-level vdev or leaf guid: random, non-zero, unique per object.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
#[repr(transparent)]
pub struct Guid(pub u64);

impl Guid {
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// A top-level vdev's index in the pool (the `vdev` field of a DVA).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
#[repr(transparent)]
pub struct VdevId(pub u32);

impl VdevId {
    pub const fn get(self) -> u32 {
        self.0
    }
    /// As an index into the pool's vector of top-level vdevs.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
    /// The id after this one (the next top-level vdev added).
    pub const fn next(self) -> VdevId {
        VdevId(self.0 + 1)
    }
}

/// A block's index within a volume (byte offset / volblocksize).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
#[repr(transparent)]
pub struct BlockId(pub u64);

impl BlockId {
    pub const fn get(self) -> u64 {
        self.0
    }
    pub const fn next(self) -> BlockId {
        BlockId(self.0 + 1)
    }
    /// The block holding byte `offset_bytes` of a volume of `block_size_bytes` blocks.
    pub const fn of_offset(offset_bytes: u64, block_size_bytes: u64) -> BlockId {
        BlockId(offset_bytes / block_size_bytes)
    }
    /// Byte offset of this block's first byte.
    pub const fn offset_bytes(self, block_size_bytes: u64) -> u64 {
        self.0 * block_size_bytes
    }
}

macro_rules! show_bare {
    ($($t:ident),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($t), "({})"), self.0)
            }
        }
    )*};
}
show_bare!(Txg, Guid, VdevId, BlockId);

// ---- names safe to print ----

/// Longest name [`printable`] shows, and longest text [`printable_text`] shows.
pub const PRINTABLE_NAME_MAX_CHARS: usize = 100;
pub const PRINTABLE_TEXT_MAX_CHARS: usize = 1000;

/// Whether `c` must not reach a terminal or a log line as it is: control characters
/// (C0, DEL, C1: escape sequences, line breaks), the line and paragraph separators,
/// the bidirectional embeddings, overrides, isolates and marks (U+202A-U+202E,
/// U+2066-U+2069, U+200E/F, U+061C: they reorder what follows) and the other invisible
/// format characters (zero-width spaces and joiners, soft hyphen, word joiner, BOM,
/// tags, ...), which make two different names look the same.
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c as u32,
            0x00AD | 0x034F | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891 | 0x08E2 | 0x115F..=0x1160
                | 0x17B4..=0x17B5 | 0x180B..=0x180F | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x206F
                | 0x3164 | 0xFE00..=0xFE0F | 0xFEFF | 0xFFA0 | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD
                | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0000..=0xE0FFF
        )
}

/// `c` as [`printable`] shows it: an unsafe character (see [`is_unsafe_char`]) as its
/// Rust escape (`\n`, `\u{202e}`), the backslash doubled (so a name cannot pass for
/// an escaped one), everything else as it is.
pub fn push_printable_char(out: &mut String, c: char) {
    if c == '\\' || is_unsafe_char(c) {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// A name read from a device (pool name, device path, host name, property) or sent by
/// a client, safe to print: one rule for every place that shows one (see
/// [`push_printable_char`]), at most [`PRINTABLE_NAME_MAX_CHARS`] characters.
pub fn printable(s: &str) -> String {
    printable_cut(s, PRINTABLE_NAME_MAX_CHARS)
}

/// Longer text that may quote a device's bytes (a decoder's error message), by the
/// same rule, at most [`PRINTABLE_TEXT_MAX_CHARS`] characters.
pub fn printable_text(s: &str) -> String {
    printable_cut(s, PRINTABLE_TEXT_MAX_CHARS)
}

fn printable_cut(s: &str, max_chars: usize) -> String {
    let mut out = String::new();
    for c in s.chars().take(max_chars) {
        push_printable_char(&mut out, c);
    }
    if s.chars().nth(max_chars).is_some() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txg_arithmetic_never_underflows() {
        assert_eq!(Txg(5).next(), Txg(6));
        assert_eq!(Txg(5).prev(), Txg(4));
        assert_eq!(Txg::ZERO.prev(), Txg::ZERO);
        assert_eq!(Txg(3).minus(10), Txg::ZERO);
        assert_eq!(Txg(3).plus(2), Txg(5));
        assert_eq!(Txg(9).since(Txg(4)), 5);
        assert_eq!(Txg(4).since(Txg(9)), 0);
        assert_eq!(Txg(13).ring_slot(4), 1);
    }

    #[test]
    fn json_and_display_are_the_bare_numbers() {
        assert_eq!(serde_json::to_string(&Txg(42)).unwrap(), "42");
        assert_eq!(serde_json::from_str::<Guid>("18446744073709551615").unwrap(), Guid(u64::MAX));
        assert_eq!(serde_json::to_string(&(Txg(1), Txg(2))).unwrap(), "[1,2]");
        assert_eq!(format!("{} {} {} {}", Txg(7), Guid(8), VdevId(9), BlockId(10)), "7 8 9 10");
        assert_eq!(format!("{:?}", Txg(7)), "Txg(7)");
    }
}
