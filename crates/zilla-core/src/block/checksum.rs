//! Block checksums.
//!
//! Theory of operation
//! -------------------
//! Every block pointer carries a 256-bit checksum of the block's physical (post-compression)
//! bytes, verified after every read before the data is used; a mismatch makes the mirror
//! try another copy and heal the bad one. Four algorithms, chosen per volume by the
//! `checksum` property and recorded in the block pointer by [`ChecksumAlgo::code`]:
//!
//! | algo      | code | cost      | strength                                          |
//! |-----------|------|-----------|---------------------------------------------------|
//! | off       | 0    | none      | none: all-zero checksum (ZFS `checksum=off`)      |
//! | fletcher4 | 1    | ~1 add/B  | catches bit rot and misdirected writes; not crypto|
//! | blake3    | 2    | fast, SIMD| cryptographic                                     |
//! | sha256    | 3    | slowest   | cryptographic (ZFS `sha256`)                      |
//!
//! Fletcher-4 is ZFS `fletcher_4_native`: the data is read as little-endian u32 words
//! and four u64 accumulators run `a += w; b += a; c += b; d += c` with wrapping
//! arithmetic. A trailing partial word (length not a multiple of 4) is padded with zeros
//! to one full word; ZFS never produces such lengths. The checksum stores a, b, c, d
//! little-endian in bytes 0..8, 8..16, 16..24, 24..32 (ZFS `zio_cksum_t` word order).
//! The codes are part of the on-disk format: never renumber them.

use sha2::Digest;

/// Checksum algorithm of a block (its code is stored on disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ChecksumAlgo {
    /// No checksum: [`compute`] returns all zeros and verification always passes.
    Off = 0,
    /// ZFS fletcher_4_native (the ZFS default for data).
    Fletcher4 = 1,
    /// BLAKE3, 256-bit output.
    Blake3 = 2,
    /// SHA-256.
    Sha256 = 3,
}

impl ChecksumAlgo {
    /// Decode an on-disk code; None for unknown codes (a corrupt or newer block pointer).
    pub fn from_code(code: u8) -> Option<ChecksumAlgo> {
        match code {
            0 => Some(ChecksumAlgo::Off),
            1 => Some(ChecksumAlgo::Fletcher4),
            2 => Some(ChecksumAlgo::Blake3),
            3 => Some(ChecksumAlgo::Sha256),
            _ => None,
        }
    }

    /// The on-disk code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Parse the `checksum` property: "on" and "fletcher4" mean Fletcher4.
    pub fn from_prop(v: &str) -> Option<ChecksumAlgo> {
        match v {
            "on" | "fletcher4" => Some(ChecksumAlgo::Fletcher4),
            "blake3" => Some(ChecksumAlgo::Blake3),
            "sha256" => Some(ChecksumAlgo::Sha256),
            "off" => Some(ChecksumAlgo::Off),
            _ => None,
        }
    }

    /// Property-style name ("fletcher4", "blake3", "sha256", "off").
    pub fn name(self) -> &'static str {
        match self {
            ChecksumAlgo::Off => "off",
            ChecksumAlgo::Fletcher4 => "fletcher4",
            ChecksumAlgo::Blake3 => "blake3",
            ChecksumAlgo::Sha256 => "sha256",
        }
    }
}

/// A 256-bit checksum as stored in a block pointer.
pub type Checksum = [u8; 32];

/// 256-bit checksum of `data` with `algo`; `Off` returns all zeros.
pub fn compute(algo: ChecksumAlgo, data: &[u8]) -> Checksum {
    match algo {
        ChecksumAlgo::Off => [0u8; 32],
        ChecksumAlgo::Fletcher4 => {
            let words = fletcher4(data);
            let mut out = [0u8; 32];
            for (i, w) in words.iter().enumerate() {
                out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
            }
            out
        }
        ChecksumAlgo::Blake3 => *blake3::hash(data).as_bytes(),
        ChecksumAlgo::Sha256 => sha2::Sha256::digest(data).into(),
    }
}

/// ZFS fletcher_4_native over little-endian u32 words; returns [a, b, c, d].
///
/// The inner loop takes 16 bytes (4 words) per iteration so the compiler keeps the four
/// accumulators in registers and the bounds checks out of the loop; the result is
/// identical to the one-word-at-a-time definition.
pub fn fletcher4(data: &[u8]) -> [u64; 4] {
    let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
    let mut chunks = data.chunks_exact(16);
    for chunk in &mut chunks {
        for i in 0..4 {
            let w = u32::from_le_bytes([
                chunk[i * 4],
                chunk[i * 4 + 1],
                chunk[i * 4 + 2],
                chunk[i * 4 + 3],
            ]) as u64;
            a = a.wrapping_add(w);
            b = b.wrapping_add(a);
            c = c.wrapping_add(b);
            d = d.wrapping_add(c);
        }
    }
    let rest = chunks.remainder();
    for word in rest.chunks(4) {
        let mut bytes = [0u8; 4];
        bytes[..word.len()].copy_from_slice(word);
        let w = u32::from_le_bytes(bytes) as u64;
        a = a.wrapping_add(w);
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    }
    [a, b, c, d]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook one-word-at-a-time definition, for comparison.
    fn fletcher4_reference(data: &[u8]) -> [u64; 4] {
        let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
        let mut padded = data.to_vec();
        while !padded.len().is_multiple_of(4) {
            padded.push(0);
        }
        for w in padded.chunks_exact(4) {
            a = a.wrapping_add(u32::from_le_bytes(w.try_into().unwrap()) as u64);
            b = b.wrapping_add(a);
            c = c.wrapping_add(b);
            d = d.wrapping_add(c);
        }
        [a, b, c, d]
    }

    #[test]
    fn fletcher4_known_values() {
        // Goal: pin the definition. Words 1, 2: a=3, b=1+3=4, c=1+4=5, d=1+5=6.
        let data = [1u8, 0, 0, 0, 2, 0, 0, 0];
        assert_eq!(fletcher4(&data), [3, 4, 5, 6]);
        assert_eq!(fletcher4(&[]), [0, 0, 0, 0]);
        let cks = compute(ChecksumAlgo::Fletcher4, &data);
        assert_eq!(&cks[0..8], &3u64.to_le_bytes());
        assert_eq!(&cks[24..32], &6u64.to_le_bytes());
    }

    #[test]
    fn fletcher4_matches_reference_on_all_lengths() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for len in 0..200 {
            assert_eq!(fletcher4(&data[..len]), fletcher4_reference(&data[..len]), "len {len}");
        }
        // Large enough that u64 accumulators wrap.
        let big = vec![0xffu8; 1 << 20];
        assert_eq!(fletcher4(&big), fletcher4_reference(&big));
    }

    #[test]
    fn algos_and_codes() {
        for code in 0..=3u8 {
            let a = ChecksumAlgo::from_code(code).unwrap();
            assert_eq!(a.code(), code);
            assert_eq!(ChecksumAlgo::from_prop(a.name()), Some(a));
        }
        assert_eq!(ChecksumAlgo::from_code(4), None);
        assert_eq!(ChecksumAlgo::from_prop("on"), Some(ChecksumAlgo::Fletcher4));
        assert_eq!(ChecksumAlgo::from_prop("md5"), None);
        assert_eq!(compute(ChecksumAlgo::Off, b"abc"), [0u8; 32]);
        // sha256("abc") test vector (FIPS 180-2).
        let s = compute(ChecksumAlgo::Sha256, b"abc");
        assert_eq!(s[0..4], [0xba, 0x78, 0x16, 0xbf]);
        assert_eq!(compute(ChecksumAlgo::Blake3, b"abc"), *blake3::hash(b"abc").as_bytes());
        assert_ne!(compute(ChecksumAlgo::Blake3, b"abc"), compute(ChecksumAlgo::Blake3, b"abd"));
    }
}
