//! Crafting hostile disk images: rewrite one field of a label config, an uberblock, the
//! block pointer an uberblock holds, or a log block header, and reseal the embedded
//! checksum that covers it (the label's trailer, the uberblock slot's trailer, the log
//! block's header checksum), so the image passes every checksum and only the field's
//! value can stop it. `tree` does the same for the block pointers inside a volume's
//! tree, resealing the whole chain of checksums up to the uberblock.
#![allow(dead_code)]

pub mod tree;

use zilla_core::vdev::label::{self, CONFIG_REGION_SIZE, LABELS, LABEL_SIZE};
use zilla_core::zil;

/// Every label's config JSON of a leaf image, changed by `edit` (a JSON value) and
/// resealed. False if the image has no config or the new JSON does not fit.
pub fn edit_config(img: &mut [u8], edit: &dyn Fn(&mut serde_json::Value)) -> bool {
    let size = img.len() as u64;
    let mut done = false;
    for l in 0..LABELS {
        let off = label::label_offset(size, l) as usize;
        let region = &img[off..off + CONFIG_REGION_SIZE];
        let Some((txg, json)) = label::decode_config(region, off as u64) else { continue };
        let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&json) else { continue };
        edit(&mut v);
        let Ok(new) = label::encode_config(&serde_json::to_vec(&v).unwrap(), txg, off as u64) else { return false };
        img[off..off + CONFIG_REGION_SIZE].copy_from_slice(&new);
        done = true;
    }
    done
}

/// Byte offsets and sizes of every slot holding the newest ring uberblock of `img`.
pub fn newest_uberblock_slots(img: &[u8]) -> Vec<(usize, usize)> {
    let size = img.len() as u64;
    let mut found: Vec<(u64, usize, usize)> = Vec::new();
    for l in 0..LABELS {
        let base = label::label_offset(size, l) as usize;
        for ashift in label::MIN_ASHIFT..=label::MAX_ASHIFT {
            let slot = label::ub_slot_size(ashift);
            for so in (CONFIG_REGION_SIZE..LABEL_SIZE as usize).step_by(slot) {
                let at = base + so;
                if let Some(ub) = label::Uberblock::decode(&img[at..at + slot], at as u64) {
                    if ub.heartbeat.is_none() {
                        found.push((ub.txg.get(), at, slot));
                    }
                }
            }
        }
    }
    let newest = found.iter().map(|f| f.0).max().unwrap_or(0);
    found.into_iter().filter(|f| f.0 == newest).map(|f| (f.1, f.2)).collect()
}

/// Rewrite `len` bytes at byte `field` of every newest uberblock slot with `value`
/// (little-endian, truncated to `len`) and reseal the slot.
pub fn set_uberblock_field(img: &mut [u8], field: usize, len: usize, value: u64) -> usize {
    let slots = newest_uberblock_slots(img);
    for &(at, slot) in &slots {
        img[at + field..at + field + len].copy_from_slice(&value.to_le_bytes()[..len]);
        label::seal(&mut img[at..at + slot], at as u64);
    }
    slots.len()
}

/// Byte offset of the MOS index block pointer inside an uberblock slot.
pub const UB_ROOT_AT: usize = 48;

/// Rewrite a field of the MOS index block pointer every newest uberblock holds
/// (`field` is the byte offset within the 128-byte pointer): the parent's checksum is
/// the uberblock slot's, resealed.
pub fn set_root_bp_field(img: &mut [u8], field: usize, len: usize, value: u64) -> usize {
    set_uberblock_field(img, UB_ROOT_AT + field, len, value)
}

/// Offsets of blocks in the data area of `img` that start with the log block magic.
pub fn find_log_blocks(img: &[u8]) -> Vec<usize> {
    let start = label::DATA_START as usize;
    let end = label::usable_end(img.len() as u64) as usize + start;
    (start..end.min(img.len()))
        .step_by(4096)
        .filter(|&o| img[o..o + 8] == zil::LWB_MAGIC.to_le_bytes())
        .collect()
}

/// Rewrite `len` bytes at byte `field` of the log block at `at` and reseal its
/// checksum over the bytes its `written` field covers; false when that length (perhaps
/// the field just written) cannot be resealed: the block then keeps the old checksum.
pub fn set_log_block_field(img: &mut [u8], at: usize, field: usize, len: usize, value: u64) -> bool {
    img[at + field..at + field + len].copy_from_slice(&value.to_le_bytes()[..len]);
    let avail = (img.len() - at).min(128 << 10);
    zil::reseal_lwb(&mut img[at..at + avail])
}
