//! metaslab fragmentation: the FRAG figure of `pool list`, as OpenZFS computes it.
//!
//! Theory of operation
//! -------------------
//! FRAG says how much of the free space is in small pieces, not how many pieces there
//! are: a pool with one huge free extent and a thousand 4K holes is barely fragmented.
//! OpenZFS (`metaslab_set_fragmentation`, `metaslab_group_fragmentation`,
//! `metaslab_class_fragmentation` in metaslab.c) computes it in three steps, and so
//! does this module:
//!
//! 1. A top-level vdev is cut into metaslabs of `2^ms_shift` bytes, sized as
//!    `vdev_metaslab_set_size` sizes them (about 16 for a vdev under 8 GiB, one per
//!    512 MiB up to 100 GiB, about 200 above, at most 16 GiB each, never under 16 MiB;
//!    see [`metaslab_shift`]). Zilla keeps one free tree per vdev, not per metaslab, so
//!    a free extent that crosses a metaslab boundary is counted as one segment in each.
//! 2. Per metaslab: the free segments go into a histogram by power-of-two size class
//!    (a segment of `len` bytes is in class `floor(log2 len)`), each class holds
//!    `count << class` bytes (its lower bound, as the space map histogram counts), and
//!    the metaslab's fragmentation is `sum(space[class] * FRAG_TABLE[class - 9]) /
//!    sum(space[class])`, in whole percent (integer division). Classes past the table
//!    use its last entry (0 %, 512 MiB and up). A metaslab wholly free has never been
//!    written (OpenZFS: no space map yet) and is 0 %; one with no free space is 0 % and
//!    weighs nothing in the next step.
//! 3. Per vdev: the metaslabs' figures weighted by their free space (in 512-byte
//!    units, as OpenZFS does). Per pool: the normal class's vdevs' figures weighted by
//!    their size. A vdev with no free space at all has no figure (OpenZFS then prints
//!    `-` for the whole pool); here it is left out of the average, and a pool whose
//!    vdevs are all full shows 0.
//!
//! The table is OpenZFS 2.4's `zfs_frag_table` (0 % at 512 MiB segments; releases
//! before 2.4 ended the table at 16 MiB). The figure is never stored: it is computed
//! from the free trees each time it is asked for (one pass over the normal class's
//! free extents under its lock).

/// Fragmentation in percent by segment size class, 512 B (index 0) to 512 MiB and up
/// (OpenZFS 2.4's `zfs_frag_table`).
pub const FRAG_TABLE: [u64; 21] = [100, 99, 97, 93, 88, 83, 77, 71, 64, 57, 50, 43, 36, 29, 23, 17, 12, 7, 3, 1, 0];

/// log2 of the smallest segment the table describes (SPA_MINBLOCKSHIFT, 512 B).
const MIN_SEGMENT_SHIFT: u32 = 9;
/// OpenZFS's metaslab sizing tunables (vdev.c) and SPA_MAXBLOCKSHIFT.
const DEFAULT_MS_COUNT: u64 = 200;
const MIN_MS_COUNT: u64 = 16;
const MS_COUNT_LIMIT: u64 = 1 << 17;
const DEFAULT_MS_SHIFT: u32 = 29;
const MAX_MS_SHIFT: u32 = 34;
const MIN_MS_SHIFT: u32 = 24;

/// OpenZFS's highbit64: the 1-based position of the highest set bit (0 for 0).
fn highbit(x: u64) -> u32 {
    64 - x.leading_zeros()
}

/// log2 of the metaslab size of a top-level vdev of `asize` bytes
/// (`vdev_metaslab_set_size`).
pub fn metaslab_shift(asize: u64) -> u32 {
    let ms_count = asize >> DEFAULT_MS_SHIFT;
    let shift = if ms_count < MIN_MS_COUNT {
        highbit(asize / MIN_MS_COUNT)
    } else if ms_count > DEFAULT_MS_COUNT {
        highbit(asize / DEFAULT_MS_COUNT)
    } else {
        DEFAULT_MS_SHIFT
    };
    if shift < MIN_MS_SHIFT {
        MIN_MS_SHIFT
    } else if shift > MAX_MS_SHIFT {
        if (asize >> MAX_MS_SHIFT) > MS_COUNT_LIMIT {
            highbit(asize / MS_COUNT_LIMIT)
        } else {
            MAX_MS_SHIFT
        }
    } else {
        shift
    }
}

/// One metaslab's free segments, by size class (`floor(log2 len)`).
struct Histogram {
    counts: [u64; 64],
    free_bytes: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { counts: [0; 64], free_bytes: 0 }
    }
}

impl Histogram {
    fn add(&mut self, len: u64) {
        if len > 0 {
            self.counts[(63 - len.leading_zeros()) as usize] += 1;
            self.free_bytes += len;
        }
    }

    /// The metaslab's fragmentation in percent (`metaslab_set_fragmentation`); a
    /// metaslab wholly free (`ms_size` bytes) has no space map yet: 0.
    fn fragmentation(&self, ms_size: u64) -> u64 {
        if self.free_bytes == ms_size {
            return 0;
        }
        let (mut weighted, mut total) = (0u128, 0u128);
        for (class, &n) in self.counts.iter().enumerate().filter(|(_, &n)| n > 0) {
            let space = (n as u128) << class;
            let idx = (class as u32).saturating_sub(MIN_SEGMENT_SHIFT) as usize;
            weighted += space * FRAG_TABLE[idx.min(FRAG_TABLE.len() - 1)] as u128;
            total += space;
        }
        if total == 0 {
            0
        } else {
            (weighted / total) as u64
        }
    }
}

/// Running free-space-weighted sum over a vdev's metaslabs
/// (`metaslab_group_fragmentation`).
#[derive(Default)]
struct GroupSum {
    weighted: u128,
    free_units: u128,
}

impl GroupSum {
    fn add(&mut self, h: &Histogram, ms_size: u64) {
        let free = (h.free_bytes / 512) as u128;
        self.weighted += h.fragmentation(ms_size) as u128 * free;
        self.free_units += free;
    }
}

/// The fragmentation of a top-level vdev of `size` bytes whose free extents are
/// `free` (sorted by offset, not overlapping), in percent; None with no free space.
pub fn vdev_fragmentation(size: u64, free: impl Iterator<Item = (u64, u64)>) -> Option<u64> {
    let shift = metaslab_shift(size);
    let ms_bytes = 1u64 << shift;
    // the metaslab being filled, its histogram, the sum so far
    let (mut ms, mut h, mut sum) = (0u64, Histogram::default(), GroupSum::default());
    let ms_size = |m: u64| ms_bytes.min(size.saturating_sub(m << shift));
    for (mut at, len) in free {
        let end = at.saturating_add(len).min(size);
        while at < end {
            let here = at >> shift;
            if here != ms {
                sum.add(&h, ms_size(ms));
                (ms, h) = (here, Histogram::default());
            }
            let piece_end = end.min((here + 1) << shift);
            h.add(piece_end - at);
            at = piece_end;
        }
    }
    sum.add(&h, ms_size(ms));
    if sum.free_units == 0 {
        return None;
    }
    Some((sum.weighted / sum.free_units) as u64)
}

/// The pool's fragmentation from its normal vdevs' `(fragmentation, size)`, weighted
/// by size (`metaslab_class_fragmentation`); vdevs without a figure are left out.
pub fn class_fragmentation(vdevs: impl Iterator<Item = (Option<u64>, u64)>) -> u64 {
    let (mut weighted, mut space) = (0u128, 0u128);
    for (frag, size) in vdevs {
        if let Some(f) = frag {
            weighted += f as u128 * size as u128;
            space += size as u128;
        }
    }
    if space == 0 {
        0
    } else {
        (weighted / space) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metaslab::RangeAllocator;

    const K: u64 = 1024;
    const M: u64 = 1024 * 1024;

    #[test]
    fn metaslab_sizes_follow_vdev_metaslab_set_size() {
        // < 8 GiB: 16-ish metaslabs (highbit of size/16), never under 16 MiB
        assert_eq!(metaslab_shift(256 * M), 25); // 256M/16 = 16M = 2^24, highbit 25: 32 MiB
        assert_eq!(metaslab_shift(64 * M), 24); // 4 MiB would be too small: 16 MiB
        assert_eq!(metaslab_shift(1 << 30), 27); // 1G/16 = 2^26: 128 MiB
        // 8 GiB .. 100 GiB: 512 MiB
        assert_eq!(metaslab_shift(50 << 30), 29);
        // past 200 metaslabs of 512 MiB: about 200
        assert_eq!(metaslab_shift(1 << 40), highbit((1u64 << 40) / 200));
        // capped at 16 GiB
        assert_eq!(metaslab_shift(1 << 50), 34);
    }

    /// A vdev of 256 MiB, fully allocated but for these holes, frees them.
    fn layout(holes: &[(u64, u64)]) -> RangeAllocator {
        let mut a = RangeAllocator::new(256 * M);
        a.claim(0, 256 * M).unwrap();
        for &(at, len) in holes {
            a.free(at, len);
        }
        a
    }

    #[test]
    fn a_known_layout_gives_openzfs_figure() {
        // 256 MiB: eight metaslabs of 32 MiB (metaslab_shift 25).
        let mut holes = vec![];
        // ms0: 1000 holes of 8K every 16K (class 8K: 88 %) and one of 1 MiB at 20 MiB
        // (class 1M: 43 %): (8,192,000 * 88 + 1,048,576 * 43) / 9,240,576
        // = 765,984,768 / 9,240,576 = 82.9 -> 82; weight 9,240,576 / 512 = 18,048
        holes.extend((0..1000).map(|i| (i * 16 * K, 8 * K)));
        holes.push((20 * M, M));
        // ms1: ten holes of 48K (class 32K: 77 %, counted as 32K each) -> 77; weight
        // 491,520 / 512 = 960
        holes.extend((0..10).map(|i| (32 * M + i * 64 * K, 48 * K)));
        // one hole 80M..100M across ms2 and ms3: ms2 holds 16 MiB (class 16M: 17 %),
        // weight 32,768; ms3 holds 4 MiB (class 4M: 29 %), weight 8,192
        holes.push((80 * M, 20 * M));
        // ms4..ms7 full: no weight
        let a = layout(&holes);
        // vdev: (82*18048 + 77*960 + 17*32768 + 29*8192) / (18048 + 960 + 32768 + 8192)
        //     = 2,348,480 / 59,968 = 39.2 -> 39
        assert_eq!(a.fragmentation(), Some(39));
        // the figure this replaces (100 - mean free extent / 16 MiB) said 100 here
    }

    #[test]
    fn a_few_small_holes_beside_a_large_free_extent_are_not_fragmentation() {
        // ms0: 100 holes of 4K (93 %) and one of 8 MiB (23 %):
        // (409,600 * 93 + 8,388,608 * 23) / 8,798,208 = 26.3 -> 26, weight 17,184;
        // ms4..ms7 wholly free: 0 %, weight 65,536 each
        let mut holes: Vec<(u64, u64)> = (0..100).map(|i| (i * 8 * K, 4 * K)).collect();
        holes.push((16 * M, 8 * M));
        holes.push((128 * M, 128 * M));
        let a = layout(&holes);
        // (26 * 17,184) / (17,184 + 4 * 65,536) = 446,784 / 279,328 = 1.6 -> 1
        assert_eq!(a.fragmentation(), Some(1));
        // a fresh vdev: 0; a full one: no figure
        assert_eq!(RangeAllocator::new(256 * M).fragmentation(), Some(0));
        assert_eq!(layout(&[]).fragmentation(), None);
    }

    #[test]
    fn the_pool_weighs_its_vdevs_by_size() {
        // 39 % on 256 MiB and 0 % on 768 MiB: 39 * 256 / 1024 = 9.75 -> 9; a full vdev
        // (no figure) is left out
        assert_eq!(class_fragmentation([(Some(39), 256 * M), (Some(0), 768 * M), (None, 512 * M)].into_iter()), 9);
        assert_eq!(class_fragmentation([(None, 512 * M)].into_iter()), 0);
    }
}
