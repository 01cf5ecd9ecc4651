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
//!
//! Fletcher-4 in lanes (as OpenZFS's fletcher_4 SIMD variants). One word at a time
//! costs four additions per word. Instead N lanes run the same four sums side by side,
//! lane j over words j, j+N, j+2N, ...: an AVX-512 register holds 8 lanes, so four
//! additions serve 8 words, an AVX2 one holds 4, and the portable "superscalar" versions
//! keep 2 or 4 lanes in plain registers (independent chains the CPU overlaps).
//!
//! Over M words, word i weighs 1 in a, M-i in b, C(M-i+1, 2) in c and C(M-i+2, 3) in d.
//! In a lane of K = M/N words its k-th word (data word i = Nk+j) weighs 1, t, C(t+1, 2),
//! C(t+2, 3) in a_j, b_j, c_j, d_j with t = K-k, and M-i = Nt-j; writing the whole-data
//! weights as polynomials in t over that basis gives the combine step (sums over the
//! lanes j, all mod 2^64, negative terms subtract):
//!
//! ```text
//! a = Σ a_j
//! b = Σ N b_j - j a_j
//! c = Σ N² c_j - N(N+2j-1)/2 b_j + j(j-1)/2 a_j
//! d = Σ N³ d_j - N²(N+j-1) c_j + N(N²+3Nj-3N+3j²-6j+2)/6 b_j - j(j-1)(j-2)/6 a_j
//! ```
//!
//! The lanes take the longest prefix of whole groups of N words; the rest (fewer than N
//! words and a partial word) continues one word at a time from the combined sums, so
//! every length gives the scalar result. The implementation is chosen once, at first
//! use, by CPU feature (AVX-512F, then AVX2, then the portable lanes; see
//! [`fletcher4_impl_name`]); a property test holds every one to the scalar loop.

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
/// Runs the fastest implementation this CPU supports (see [`fletcher4_impl_name`]); all
/// of them give the result of the one-word-at-a-time definition.
pub fn fletcher4(data: &[u8]) -> [u64; 4] {
    // The chosen implementation is always supported, so the fallback never runs.
    chosen_fletcher4_impl().run(data).unwrap_or_else(|| fletcher4_scalar(data))
}

/// Name of the fletcher4 implementation [`fletcher4`] runs on this CPU ("avx512", "avx2",
/// "superscalar2", "superscalar4" or "scalar"), chosen once at first use.
pub fn fletcher4_impl_name() -> &'static str {
    chosen_fletcher4_impl().name()
}

/// The ways this build computes fletcher4; all give the same result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fletcher4Impl {
    /// One word at a time: the reference.
    Scalar,
    /// Two lanes in plain Rust (any CPU).
    Superscalar2,
    /// Four lanes in plain Rust (any CPU; chosen on other architectures, only the tests
    /// run it on x86-64).
    #[cfg_attr(all(target_arch = "x86_64", not(test)), allow(dead_code))]
    Superscalar4,
    /// Four u64 lanes in one AVX2 register (x86-64 with AVX2).
    #[cfg_attr(all(not(target_arch = "x86_64"), not(test)), allow(dead_code))]
    Avx2,
    /// Eight u64 lanes in one AVX-512 register (x86-64 with AVX-512F).
    #[cfg_attr(all(not(target_arch = "x86_64"), not(test)), allow(dead_code))]
    Avx512,
}

impl Fletcher4Impl {
    /// Every implementation.
    #[cfg(test)]
    const ALL: [Fletcher4Impl; 5] = [
        Fletcher4Impl::Scalar,
        Fletcher4Impl::Superscalar2,
        Fletcher4Impl::Superscalar4,
        Fletcher4Impl::Avx2,
        Fletcher4Impl::Avx512,
    ];

    /// Fastest first: the first supported one is chosen. On x86-64 the sixteen sums of
    /// four portable lanes do not fit in the registers and run slower than the scalar
    /// loop; two lanes fit.
    #[cfg(target_arch = "x86_64")]
    const BY_PREFERENCE: [Fletcher4Impl; 4] =
        [Fletcher4Impl::Avx512, Fletcher4Impl::Avx2, Fletcher4Impl::Superscalar2, Fletcher4Impl::Scalar];
    #[cfg(not(target_arch = "x86_64"))]
    const BY_PREFERENCE: [Fletcher4Impl; 3] =
        [Fletcher4Impl::Superscalar4, Fletcher4Impl::Superscalar2, Fletcher4Impl::Scalar];

    fn name(self) -> &'static str {
        match self {
            Fletcher4Impl::Scalar => "scalar",
            Fletcher4Impl::Superscalar2 => "superscalar2",
            Fletcher4Impl::Superscalar4 => "superscalar4",
            Fletcher4Impl::Avx2 => "avx2",
            Fletcher4Impl::Avx512 => "avx512",
        }
    }

    /// Whether this CPU has the instructions the implementation needs.
    fn is_supported(self) -> bool {
        match self {
            Fletcher4Impl::Scalar | Fletcher4Impl::Superscalar2 | Fletcher4Impl::Superscalar4 => true,
            Fletcher4Impl::Avx2 => simd::has_avx2(),
            Fletcher4Impl::Avx512 => simd::has_avx512(),
        }
    }

    /// Fletcher-4 of `data`; None when this CPU lacks the instructions.
    fn run(self, data: &[u8]) -> Option<[u64; 4]> {
        match self {
            Fletcher4Impl::Scalar => Some(fletcher4_scalar(data)),
            Fletcher4Impl::Superscalar2 => Some(fletcher4_lanes(data, superscalar_lanes::<2>)),
            Fletcher4Impl::Superscalar4 => Some(fletcher4_lanes(data, superscalar_lanes::<4>)),
            Fletcher4Impl::Avx2 => simd::fletcher4_avx2(data),
            Fletcher4Impl::Avx512 => simd::fletcher4_avx512(data),
        }
    }
}

/// The implementation [`fletcher4`] runs: the first supported one, decided at first use.
fn chosen_fletcher4_impl() -> Fletcher4Impl {
    static CHOSEN: std::sync::OnceLock<Fletcher4Impl> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        Fletcher4Impl::BY_PREFERENCE.into_iter().find(|i| i.is_supported()).unwrap_or(Fletcher4Impl::Scalar)
    })
}

/// The reference: one word at a time.
fn fletcher4_scalar(data: &[u8]) -> [u64; 4] {
    fletcher4_continue([0; 4], data)
}

/// Continue the sums `[a, b, c, d]` over `data`, one word at a time; a trailing partial
/// word is padded with zeros.
///
/// The inner loop takes 16 bytes (4 words) per iteration so the compiler keeps the four
/// accumulators in registers and the bounds checks out of the loop; the result is
/// identical to the one-word-at-a-time definition.
fn fletcher4_continue(sums: [u64; 4], data: &[u8]) -> [u64; 4] {
    let [mut a, mut b, mut c, mut d] = sums;
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

/// The running sums `[a, b, c, d]` of N lanes, indexed `[sum][lane]`: lane j has summed
/// words j, j+N, j+2N, ... of the data.
type LaneSums<const N: usize> = [[u64; N]; 4];

/// Fletcher-4 of `data` where `lanes` sums the longest prefix of whole groups of N words
/// in N lanes; the sums are combined and the remaining words (fewer than N, and a
/// partial word) continue one at a time.
fn fletcher4_lanes<const N: usize>(data: &[u8], lanes: impl FnOnce(&[u8]) -> LaneSums<N>) -> [u64; 4] {
    let (body, tail) = data.split_at(data.len() - data.len() % (4 * N));
    fletcher4_continue(combine_lanes(&lanes(body)), tail)
}

/// The sums of the words the lanes covered, from the lanes' sums (see the module comment).
fn combine_lanes<const N: usize>(lanes: &LaneSums<N>) -> [u64; 4] {
    let weights = const { lane_weights::<N>() };
    let mut out = [0u64; 4];
    for (j, lane_weights) in weights.iter().enumerate() {
        for (sum, row) in lane_weights.iter().enumerate() {
            for (from, weight) in row.iter().enumerate().take(sum + 1) {
                out[sum] = out[sum].wrapping_add(weight.wrapping_mul(lanes[from][j]));
            }
        }
    }
    out
}

/// `[lane][sum][from]`: the weight of lane j's sum `from` (a, b, c, d) in the combined
/// sum `sum`; a negative weight is stored as its two's complement, which subtracts in
/// wrapping arithmetic. Every division is exact.
const fn lane_weights<const N: usize>() -> [[[u64; 4]; 4]; N] {
    let n = N as i64;
    let mut out = [[[0u64; 4]; 4]; N];
    let mut lane = 0;
    while lane < N {
        let j = lane as i64;
        let rows: [[i64; 4]; 4] = [
            [1, 0, 0, 0],
            [-j, n, 0, 0],
            [j * (j - 1) / 2, -n * (n + 2 * j - 1) / 2, n * n, 0],
            [
                -j * (j - 1) * (j - 2) / 6,
                n * (n * n + 3 * n * j - 3 * n + 3 * j * j - 6 * j + 2) / 6,
                -n * n * (n + j - 1),
                n * n * n,
            ],
        ];
        let mut sum = 0;
        while sum < 4 {
            let mut from = 0;
            while from < 4 {
                out[lane][sum][from] = rows[sum][from] as u64;
                from += 1;
            }
            sum += 1;
        }
        lane += 1;
    }
    out
}

/// N lanes in plain Rust: independent additions the CPU runs side by side.
fn superscalar_lanes<const N: usize>(body: &[u8]) -> LaneSums<N> {
    let [mut a, mut b, mut c, mut d] = [[0u64; N]; 4];
    for group in body.chunks_exact(4 * N) {
        for j in 0..N {
            let w = u32::from_le_bytes([group[4 * j], group[4 * j + 1], group[4 * j + 2], group[4 * j + 3]]) as u64;
            a[j] = a[j].wrapping_add(w);
            b[j] = b[j].wrapping_add(a[j]);
            c[j] = c[j].wrapping_add(b[j]);
            d[j] = d[j].wrapping_add(c[j]);
        }
    }
    [a, b, c, d]
}

/// The lanes in SIMD registers: one u64 lane per word of a group, each word
/// zero-extended from u32 (x86 is little-endian, so a plain load reads the words).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{fletcher4_lanes, LaneSums};
    use std::arch::x86_64::*;

    pub(super) fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2")
    }

    pub(super) fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    /// Fletcher-4 in four AVX2 lanes; None without AVX2.
    pub(super) fn fletcher4_avx2(data: &[u8]) -> Option<[u64; 4]> {
        if !has_avx2() {
            return None;
        }
        // SAFETY: the CPU has AVX2 (checked just above), all `avx2_lanes` needs.
        Some(fletcher4_lanes(data, |body| unsafe { avx2_lanes(body) }))
    }

    /// Fletcher-4 in eight AVX-512 lanes; None without AVX-512F.
    pub(super) fn fletcher4_avx512(data: &[u8]) -> Option<[u64; 4]> {
        if !has_avx512() {
            return None;
        }
        // SAFETY: the CPU has AVX-512F (checked just above), all `avx512_lanes` needs.
        Some(fletcher4_lanes(data, |body| unsafe { avx512_lanes(body) }))
    }

    #[target_feature(enable = "avx2")]
    fn avx2_lanes(body: &[u8]) -> LaneSums<4> {
        let zero = _mm256_setzero_si256();
        let [mut a, mut b, mut c, mut d] = [zero; 4];
        for group in body.chunks_exact(16) {
            // SAFETY: `group` is 16 readable bytes; the unaligned load needs no alignment.
            let words = unsafe { _mm_loadu_si128(group.as_ptr().cast::<__m128i>()) };
            a = _mm256_add_epi64(a, _mm256_cvtepu32_epi64(words));
            b = _mm256_add_epi64(b, a);
            c = _mm256_add_epi64(c, b);
            d = _mm256_add_epi64(d, c);
        }
        let mut out = [[0u64; 4]; 4];
        for (dst, sums) in out.iter_mut().zip([a, b, c, d]) {
            // SAFETY: `dst` is 4 u64s, the 32 writable bytes the unaligned store writes.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast::<__m256i>(), sums) };
        }
        out
    }

    #[target_feature(enable = "avx512f")]
    fn avx512_lanes(body: &[u8]) -> LaneSums<8> {
        let zero = _mm512_setzero_si512();
        let [mut a, mut b, mut c, mut d] = [zero; 4];
        for group in body.chunks_exact(32) {
            // SAFETY: `group` is 32 readable bytes; the unaligned load needs no alignment.
            let words = unsafe { _mm256_loadu_si256(group.as_ptr().cast::<__m256i>()) };
            a = _mm512_add_epi64(a, _mm512_cvtepu32_epi64(words));
            b = _mm512_add_epi64(b, a);
            c = _mm512_add_epi64(c, b);
            d = _mm512_add_epi64(d, c);
        }
        let mut out = [[0u64; 8]; 4];
        for (dst, sums) in out.iter_mut().zip([a, b, c, d]) {
            // SAFETY: `dst` is 8 u64s, the 64 writable bytes the unaligned store writes.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast::<__m512i>(), sums) };
        }
        out
    }
}

/// No SIMD implementations on other architectures: the portable lanes serve there.
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    pub(super) fn has_avx2() -> bool {
        false
    }

    pub(super) fn has_avx512() -> bool {
        false
    }

    pub(super) fn fletcher4_avx2(_data: &[u8]) -> Option<[u64; 4]> {
        None
    }

    pub(super) fn fletcher4_avx512(_data: &[u8]) -> Option<[u64; 4]> {
        None
    }
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

    /// Every fletcher4 implementation this CPU can run.
    fn supported_impls() -> Vec<Fletcher4Impl> {
        Fletcher4Impl::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    /// Run `imp` on `data`; it must be supported.
    fn run(imp: Fletcher4Impl, data: &[u8]) -> [u64; 4] {
        imp.run(data).unwrap_or_else(|| panic!("{} is supported but did not run", imp.name()))
    }

    /// `len` bytes from `seed`: 0 random, 1 all 0xFF, 2 words each 0xFFFFFFFF or random.
    fn test_data(len: usize, seed: u64, mode: u8) -> Vec<u8> {
        let mut state = seed;
        let mut next = move || {
            // splitmix64
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            let r = next();
            let word = match mode {
                0 => r as u32,
                1 => u32::MAX,
                _ if r & (1 << 40) != 0 => u32::MAX,
                _ => r as u32,
            };
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.truncate(len);
        out
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
        for imp in supported_impls() {
            assert_eq!(run(imp, &data), [3, 4, 5, 6], "{}", imp.name());
            assert_eq!(run(imp, &[]), [0, 0, 0, 0], "{}", imp.name());
            // A trailing partial word is padded with zeros: words 1, 2, 5.
            assert_eq!(run(imp, &[1, 0, 0, 0, 2, 0, 0, 0, 5]), [8, 12, 17, 23], "{}", imp.name());
        }
    }

    #[test]
    fn fletcher4_of_equal_words_matches_closed_form() {
        // Goal: check every implementation against sums computed without running the
        // algorithm, including ones that wrap. M equal words w give a = M w,
        // b = w C(M+1, 2), c = w C(M+2, 3), d = w C(M+3, 4) (mod 2^64).
        for (word, words) in [(u32::MAX, 1u128), (u32::MAX, 37), (0x0102_0304, 1000), (u32::MAX, 1 << 18)] {
            let data: Vec<u8> = (0..words).flat_map(|_| word.to_le_bytes()).collect();
            let (w, m) = (word as u128, words);
            let expect = [
                m * w,
                m * (m + 1) / 2 * w,
                m * (m + 1) * (m + 2) / 6 * w,
                m * (m + 1) * (m + 2) * (m + 3) / 24 * w,
            ]
            .map(|x| x as u64);
            for imp in supported_impls() {
                assert_eq!(run(imp, &data), expect, "{} over {words} words", imp.name());
            }
        }
    }

    #[test]
    fn fletcher4_matches_reference_on_all_lengths() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for imp in supported_impls() {
            for len in 0..200 {
                assert_eq!(run(imp, &data[..len]), fletcher4_reference(&data[..len]), "{} len {len}", imp.name());
            }
            // Large enough that u64 accumulators wrap.
            let big = vec![0xffu8; 1 << 20];
            assert_eq!(run(imp, &big), fletcher4_reference(&big), "{}", imp.name());
        }
    }

    #[test]
    fn fletcher4_runs_the_fastest_supported_impl() {
        let chosen = chosen_fletcher4_impl();
        assert!(chosen.is_supported());
        let preferred = Fletcher4Impl::BY_PREFERENCE.into_iter().find(|i| i.is_supported());
        assert_eq!(Some(chosen), preferred);
        assert_eq!(fletcher4_impl_name(), chosen.name());
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") {
            assert_eq!(fletcher4_impl_name(), "avx512");
        } else if is_x86_feature_detected!("avx2") {
            assert_eq!(fletcher4_impl_name(), "avx2");
        }
    }

    proptest::proptest! {
        /// Every implementation this CPU runs equals the scalar one on any length (also
        /// not a multiple of 4 or of the lane group) and on data that wraps the sums.
        #[test]
        fn fletcher4_impls_match_scalar(
            len in proptest::prop_oneof![0..=256usize, 0..=70 * 1024usize],
            seed in proptest::prelude::any::<u64>(),
            mode in 0..3u8,
        ) {
            let data = test_data(len, seed, mode);
            let scalar = fletcher4_scalar(&data);
            for imp in supported_impls() {
                proptest::prop_assert_eq!(run(imp, &data), scalar, "{} len {} mode {}", imp.name(), len, mode);
            }
            proptest::prop_assert_eq!(fletcher4(&data), scalar);
        }
    }

    /// Throughput of each implementation (a measurement, not a check): run with
    /// `cargo test --release -p zilla-core --lib fletcher4_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn fletcher4_throughput() {
        for size in [4 << 10, 16 << 10, 128 << 10, 1 << 20] {
            let data = test_data(size, 7, 0);
            let rounds = (512 << 20) / size;
            for imp in supported_impls() {
                let started = std::time::Instant::now();
                for _ in 0..rounds {
                    std::hint::black_box(run(imp, std::hint::black_box(&data)));
                }
                let secs = started.elapsed().as_secs_f64();
                let gb_per_s = (rounds * size) as f64 / secs / 1e9;
                println!("fletcher4 {:>12} {:>8} B buffers: {gb_per_s:6.2} GB/s", imp.name(), size);
            }
        }
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
