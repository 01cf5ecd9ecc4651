//! The log-linear histogram buckets of analytics: four per power of two.
//!
//! Bucket 0 holds values below 1024 (2^10); for k in 0..24 and q in 0..4 bucket
//! 1 + 4k + q holds `[2^(10+k) * (4+q)/4, 2^(10+k) * (5+q)/4)` (q is the two bits below
//! the leading one); bucket 97 holds 2^34 and up. Latencies are in nanoseconds (1 us to
//! ~17 s resolved), sizes in bytes (1 KiB to 16 GiB). Integer arithmetic only.

use serde::Serialize;

/// Number of buckets.
pub const BUCKETS: usize = 98;
/// The last bucket: values from 2^34 up.
const LAST: usize = BUCKETS - 1;
/// log2 of the first edge (1024).
const FIRST_LOG2: usize = 10;
/// log2 of the last edge (2^34).
const LAST_LOG2: usize = 34;

/// The bucket `value` falls in.
pub fn bucket_of(value: u64) -> usize {
    if value < 1 << FIRST_LOG2 {
        return 0;
    }
    let log2 = 63 - value.leading_zeros() as usize;
    if log2 >= LAST_LOG2 {
        return LAST;
    }
    let q = ((value >> (log2 - 2)) & 3) as usize;
    1 + 4 * (log2 - FIRST_LOG2) + q
}

/// The smallest value of bucket `i` (an index past the last is read as the last).
pub fn lower_bound(i: usize) -> u64 {
    match i {
        0 => 0,
        1..LAST => {
            let (k, q) = ((i - 1) / 4, (i - 1) % 4);
            ((4 + q) as u64) << (FIRST_LOG2 - 2 + k)
        }
        _ => 1 << LAST_LOG2,
    }
}

/// The first value above bucket `i`; None for the last bucket (no upper edge).
pub fn upper_bound(i: usize) -> Option<u64> {
    match i {
        0 => Some(1 << FIRST_LOG2),
        1..LAST => {
            let (k, q) = ((i - 1) / 4, (i - 1) % 4);
            Some(((5 + q) as u64) << (FIRST_LOG2 - 2 + k))
        }
        _ => None,
    }
}

/// The `zpool iostat -w` power-of-two bucket (kstat's: `[2^i, 2^(i+1))`) that bucket
/// `i` folds into. Exact for buckets 1..=96 (into 10..=33). Bucket 0 (below 2^10) folds
/// into 9, the highest power-of-two bucket below 2^10, and bucket 97 (2^34 and up)
/// into 34: those two do not resolve their range any further.
pub fn fold_to_log2(i: usize) -> usize {
    match i {
        0 => FIRST_LOG2 - 1,
        1..LAST => FIRST_LOG2 + (i - 1) / 4,
        _ => LAST_LOG2,
    }
}

/// The bucket edges as the API lists them: `upper` is null for the last bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketEdges {
    pub lower: Vec<u64>,
    pub upper: Vec<Option<u64>>,
}

/// Every bucket's edges, bucket 0 first.
pub fn edges() -> BucketEdges {
    BucketEdges { lower: (0..BUCKETS).map(lower_bound).collect(), upper: (0..BUCKETS).map(upper_bound).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kstat::Histogram;
    use proptest::prelude::*;

    #[test]
    fn edges_are_the_contracts() {
        let e = edges();
        assert_eq!(&e.lower[..6], &[0, 1024, 1280, 1536, 1792, 2048]);
        assert_eq!(&e.upper[..5], &[Some(1024), Some(1280), Some(1536), Some(1792), Some(2048)]);
        assert_eq!(e.lower[5], 2048);
        assert_eq!(e.upper[5], Some(2560));
        assert_eq!(e.lower[LAST], 1 << 34);
        assert_eq!(e.upper[LAST], None);
        assert_eq!(e.upper[LAST - 1], Some(1 << 34));
        // contiguous: each upper edge is the next lower edge
        for i in 0..LAST {
            assert_eq!(e.upper[i], Some(e.lower[i + 1]), "bucket {i}");
        }
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1023), 0);
        assert_eq!(bucket_of(1024), 1);
        assert_eq!(bucket_of(1279), 1);
        assert_eq!(bucket_of(1280), 2);
        assert_eq!(bucket_of((1 << 34) - 1), LAST - 1);
        assert_eq!(bucket_of(1 << 34), LAST);
        assert_eq!(bucket_of(u64::MAX), LAST);
        assert_eq!(lower_bound(1000), 1 << 34);
        assert_eq!(upper_bound(1000), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn every_value_lies_in_its_bucket(shift in 0u32..64, value in any::<u64>()) {
            // spread the values over every magnitude
            let v = value >> shift;
            let b = bucket_of(v);
            prop_assert!(b < BUCKETS);
            prop_assert!(lower_bound(b) <= v, "{v} below bucket {b}");
            if let Some(u) = upper_bound(b) {
                prop_assert!(v < u, "{v} above bucket {b}");
            }
        }

        #[test]
        fn folding_agrees_with_kstat(shift in 0u32..64, value in any::<u64>()) {
            let v = value >> shift;
            let folded = fold_to_log2(bucket_of(v));
            let log2 = Histogram::bucket_of(v);
            if v < 1024 {
                prop_assert!(log2 <= folded && folded == 9);
            } else if v < 1 << 34 {
                prop_assert_eq!(folded, log2);
            } else {
                prop_assert!(log2 >= folded && folded == 34);
            }
        }
    }
}
