//! Block compression.
//!
//! Theory of operation
//! -------------------
//! A block is compressed once, when it is written by txg sync, and its physical size
//! (psize) recorded in the block pointer next to its logical size (lsize). As in ZFS, a
//! compressed result is kept only if it saves at least 1/8 of the logical size
//! (`zio_compress_data`: `d_len = s_len - s_len / 8`); otherwise the block is stored raw
//! and [`compress`] returns None.
//!
//! Physical encoding (both algorithms, our own bytes, little-endian):
//!
//! ```text
//!   0..4   compressed payload length in bytes (u32 LE)
//!   4..    payload: an LZ4 *block* (lz4_flex::block) or one zstd frame
//!   ...    anything after the payload is ignored (sector padding)
//! ```
//!
//! The length header exists because the caller rounds psize up to the sector size and
//! hands us the padded buffer; ZFS's lz4 stores a 4-byte length for the same reason.
//! Decompression must yield exactly `lsize` bytes; every malformed input is an
//! `io::ErrorKind::InvalidData` error, never a panic (the bytes come from a disk).
//!
//! Codes (stored in the block pointer): Off = 0, Lz4 = 1, Zstd(level) = 0x80 | level,
//! level 1..=19.

use std::io;

/// Compression algorithm of a block, from the `compression` property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Stored raw.
    Off,
    /// LZ4 block format.
    Lz4,
    /// zstd at the given level (1..=19).
    Zstd(u8),
}

/// Bytes of the compressed-length header in front of every compressed payload.
const HEADER_BYTES: usize = 4;
const ZSTD_FLAG: u8 = 0x80;
const ZSTD_LEVEL_MAX: u8 = 19;

impl Compression {
    /// The on-disk code: Off = 0, Lz4 = 1, Zstd(l) = 0x80 | l.
    pub fn code(self) -> u8 {
        match self {
            Compression::Off => 0,
            Compression::Lz4 => 1,
            Compression::Zstd(l) => ZSTD_FLAG | (l & 0x7f),
        }
    }

    /// Decode an on-disk code; None for unknown codes or zstd levels outside 1..=19.
    pub fn from_code(c: u8) -> Option<Compression> {
        match c {
            0 => Some(Compression::Off),
            1 => Some(Compression::Lz4),
            c if c & ZSTD_FLAG != 0 => {
                let level = c & !ZSTD_FLAG;
                (1..=ZSTD_LEVEL_MAX).contains(&level).then_some(Compression::Zstd(level))
            }
            _ => None,
        }
    }
}

/// Compress `src`. Some(bytes) only if the result (header included) saves at least 1/8
/// of `src`; None means "store raw" (also for `Off` and for empty input).
pub fn compress(c: Compression, src: &[u8]) -> Option<Vec<u8>> {
    let limit = src.len() - src.len() / 8;
    if src.is_empty() || limit <= HEADER_BYTES {
        return None;
    }
    let payload = match c {
        Compression::Off => return None,
        Compression::Lz4 => lz4_flex::block::compress(src),
        Compression::Zstd(level) => {
            let level = level.clamp(1, ZSTD_LEVEL_MAX) as i32;
            zstd::bulk::compress(src, level).ok()?
        }
    };
    if HEADER_BYTES + payload.len() > limit {
        return None;
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    debug_assert!(out.len() <= limit);
    Some(out)
}

/// Decompress `src` (as produced by [`compress`], possibly followed by padding) into
/// exactly `lsize` bytes. `Off` copies the first `lsize` bytes.
pub fn decompress(c: Compression, src: &[u8], lsize: usize) -> io::Result<Vec<u8>> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("decompress: {what}"));
    if c == Compression::Off {
        if src.len() < lsize {
            return Err(bad("raw block shorter than its logical size"));
        }
        return Ok(src[..lsize].to_vec());
    }
    if src.len() < HEADER_BYTES {
        return Err(bad("block shorter than its header"));
    }
    let payload_len = u32::from_le_bytes([src[0], src[1], src[2], src[3]]) as usize;
    let payload = src
        .get(HEADER_BYTES..HEADER_BYTES.saturating_add(payload_len))
        .ok_or_else(|| bad("payload length exceeds the block"))?;
    let mut out = vec![0u8; lsize];
    let n = match c {
        Compression::Off => unreachable!("handled above"),
        Compression::Lz4 => lz4_flex::block::decompress_into(payload, &mut out)
            .map_err(|e| bad(&format!("lz4: {e}")))?,
        Compression::Zstd(_) => zstd::bulk::decompress_to_buffer(payload, &mut out[..])
            .map_err(|e| bad(&format!("zstd: {e}")))?,
    };
    if n != lsize {
        return Err(bad(&format!("got {n} bytes, expected {lsize}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALGOS: [Compression; 4] =
        [Compression::Lz4, Compression::Zstd(1), Compression::Zstd(3), Compression::Zstd(19)];

    #[test]
    fn codes_round_trip() {
        for c in [Compression::Off, Compression::Lz4, Compression::Zstd(1), Compression::Zstd(19)] {
            assert_eq!(Compression::from_code(c.code()), Some(c));
        }
        assert_eq!(Compression::Zstd(7).code(), 0x87);
        assert_eq!(Compression::from_code(2), None);
        assert_eq!(Compression::from_code(0x80), None);
        assert_eq!(Compression::from_code(0x80 | 20), None);
    }

    #[test]
    fn saves_an_eighth_or_stores_raw() {
        // Goal: the ZFS 1/8 rule. Compressible data compresses; random data does not.
        let zeros = vec![0u8; 8192];
        let mut rng_state = 0x1234_5678_u64;
        let random: Vec<u8> = (0..8192)
            .map(|_| {
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 7;
                rng_state ^= rng_state << 17;
                rng_state as u8
            })
            .collect();
        for c in ALGOS {
            let z = compress(c, &zeros).expect("zeros compress");
            assert!(z.len() <= 8192 - 1024);
            // Padding after the payload (sector rounding) is ignored.
            let mut padded = z.clone();
            padded.resize(4096, 0);
            assert_eq!(decompress(c, &padded, 8192).unwrap(), zeros);
            assert!(compress(c, &random).is_none(), "{c:?}");
        }
        assert!(compress(Compression::Off, &zeros).is_none());
        assert!(compress(Compression::Lz4, &[]).is_none());
    }

    #[test]
    fn wrong_lsize_is_an_error() {
        let data = vec![7u8; 4096];
        let z = compress(Compression::Lz4, &data).unwrap();
        assert!(decompress(Compression::Lz4, &z, 4095).is_err());
        assert!(decompress(Compression::Lz4, &z, 4097).is_err());
        let z = compress(Compression::Zstd(3), &data).unwrap();
        assert!(decompress(Compression::Zstd(3), &z, 4095).is_err());
        assert!(decompress(Compression::Zstd(3), &z, 4097).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn round_trip(data in proptest::collection::vec(0u8..4, 0..20000), which in 0usize..4) {
            let c = ALGOS[which];
            if let Some(z) = compress(c, &data) {
                prop_assert!(z.len() <= data.len() - data.len() / 8);
                prop_assert_eq!(decompress(c, &z, data.len()).unwrap(), data);
            }
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..5000),
                                lsize in 0usize..20000, which in 0usize..4) {
            let _ = decompress(ALGOS[which], &data, lsize);
            let _ = decompress(Compression::Off, &data, lsize);
        }

        #[test]
        fn corrupted_compressed_never_panics(seed in any::<u64>(), flips in 1usize..8) {
            let data: Vec<u8> = (0..8192u32).map(|i| (i / 64) as u8).collect();
            for c in ALGOS {
                let mut z = compress(c, &data).unwrap();
                let mut s = seed;
                for _ in 0..flips {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let i = (s >> 33) as usize % z.len();
                    z[i] ^= (s >> 20) as u8 | 1;
                }
                let _ = decompress(c, &z, data.len());
            }
        }
    }
}
