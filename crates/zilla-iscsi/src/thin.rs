//! thin: logical block provisioning (SBC-3 §4.7), pure: UNMAP, WRITE SAME 10/16 and
//! GET LBA STATUS, and COMPARE AND WRITE's CDB.
//!
//! Theory of operation
//! -------------------
//! Every volume is a logical-block-provisioning unit (LBPME): a copy-on-write pool
//! allocates a block when it is written and frees it when it is unmapped, sparse or
//! not. A sparse volume is reported thin provisioned (VPD 0xB2 type 2), a volume with
//! a `refreservation` resource provisioned (type 1: its space stays reserved after an
//! UNMAP). An unmapped block reads as zeros (LBPRZ). Blocks are 512 bytes; the pool
//! frees whole volume blocks, so the optimal unmap granularity is `volblocksize` and a
//! partial block is zeroed instead (the volume does that).
//!
//! UNMAP's parameter list is checked whole before anything is freed (SBC-3 §5.28: a
//! bad descriptor fails the command with nothing done). WRITE SAME with the UNMAP bit
//! or NDOB unmaps (the block sent is not written; unmapped blocks read zeros); with a
//! zero block and no UNMAP bit it zeroes the
//! cheap way (the executor frees the blocks: a copy-on-write pool cannot keep space
//! for future overwrites either way); any other block is repeated. GET LBA STATUS
//! answers from the volume's block map (the executor's BLOCK STATUS), mapped or
//! deallocated, in descriptors that start at the requested block.
//!
//! Limits (VPD 0xB0): at most `UNMAP_DESCRIPTORS_MAX` descriptors of at most
//! `UNMAP_BLOCKS_MAX` blocks each, WRITE SAME of at most `WRITE_SAME_BLOCKS_MAX`
//! blocks (zero blocks: to the end of the unit, within that limit), COMPARE AND WRITE of at
//! most `COMPARE_AND_WRITE_BLOCKS_MAX` blocks.

use crate::sense::{Geometry, Sense, LOGICAL_BLOCK_BYTES};

/// A decoded provisioning or atomic command (scsi.rs makes it an `Operation`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// UNMAP with a parameter list of `parameter_bytes` (Data-Out).
    Unmap { parameter_bytes: u32 },
    /// WRITE SAME of one block (Data-Out, none with `ndob`) over `blocks` at `lba`.
    WriteSame { lba: u64, blocks: u64, unmap: bool, ndob: bool },
    /// COMPARE AND WRITE: Data-Out of `2 * blocks` blocks (compare, then write).
    CompareAndWrite { lba: u64, blocks: u8, fua: bool },
    /// GET LBA STATUS from `lba`, answered in at most `allocation` bytes.
    GetLbaStatus { lba: u64, allocation: u32 },
}

/// Block descriptors one UNMAP may carry.
pub const UNMAP_DESCRIPTORS_MAX: u32 = 256;
/// Blocks one UNMAP descriptor (and one UNMAP in all) may name: 512 MiB (SBC-3
/// initiators expect at most 2^20).
pub const UNMAP_BLOCKS_MAX: u32 = 1 << 20;
/// Blocks one WRITE SAME may cover: 1 GiB.
pub const WRITE_SAME_BLOCKS_MAX: u64 = (1 << 30) / LOGICAL_BLOCK_BYTES as u64;
/// Blocks one COMPARE AND WRITE may cover.
pub const COMPARE_AND_WRITE_BLOCKS_MAX: u8 = 255;
/// Descriptors one GET LBA STATUS answer holds at most.
pub const LBA_STATUS_DESCRIPTORS_MAX: usize = 1024;

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b))
}

fn in_range(lba: u64, blocks: u64, g: &Geometry) -> Result<(), Sense> {
    match lba.checked_add(blocks) {
        Some(end) if end <= g.blocks => Ok(()),
        _ => Err(Sense::LBA_OUT_OF_RANGE),
    }
}

/// UNMAP (0x42): its parameter list comes as Data-Out.
pub fn decode_unmap(c: &[u8; 16], g: &Geometry) -> Result<Command, Sense> {
    if c[1] & 0x01 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB); // ANCHOR: anchored blocks are not supported
    }
    if g.read_only {
        return Err(Sense::WRITE_PROTECTED);
    }
    Ok(Command::Unmap { parameter_bytes: be(&c[7..9]) as u32 })
}

/// The ranges of an UNMAP parameter list, in blocks, checked whole.
pub fn unmap_ranges(list: &[u8], g: &Geometry) -> Result<Vec<(u64, u64)>, Sense> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    if list.len() < 8 {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let descriptor_bytes = be(&list[2..4]) as usize;
    // a partial last descriptor is ignored (SBC-3 §5.28.2); a list declaring more
    // descriptors than the limit is refused whole, even if less of it arrived
    let available = (list.len() - 8).min(descriptor_bytes) / 16;
    if available > UNMAP_DESCRIPTORS_MAX as usize || descriptor_bytes / 16 > UNMAP_DESCRIPTORS_MAX as usize {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    }
    let mut ranges = Vec::with_capacity(available);
    let mut total = 0u64;
    for d in list[8..8 + available * 16].chunks_exact(16) {
        let (lba, blocks) = (be(&d[0..8]), be(&d[8..12]));
        if blocks > u64::from(UNMAP_BLOCKS_MAX) {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        in_range(lba, blocks, g)?;
        total += blocks;
        if blocks > 0 {
            ranges.push((lba, blocks));
        }
    }
    if total > u64::from(UNMAP_BLOCKS_MAX) {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
    }
    Ok(ranges)
}

/// WRITE SAME 10 (0x41) and 16 (0x93).
pub fn decode_write_same(c: &[u8; 16], g: &Geometry) -> Result<Command, Sense> {
    let sixteen = c[0] == 0x93;
    // WRPROTECT, ANCHOR, PBDATA/LBDATA (obsolete): not supported
    if c[1] & 0xf6 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let unmap = c[1] & 0x08 != 0;
    let ndob = sixteen && c[1] & 0x01 != 0;
    let (lba, blocks) = if sixteen { (be(&c[2..10]), be(&c[10..14])) } else { (be(&c[2..6]), be(&c[7..9])) };
    // zero blocks: from `lba` to the end of the unit
    let blocks = if blocks == 0 { g.blocks.checked_sub(lba).filter(|&n| n > 0).ok_or(Sense::LBA_OUT_OF_RANGE)? } else { blocks };
    if blocks > WRITE_SAME_BLOCKS_MAX {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    in_range(lba, blocks, g)?;
    if g.read_only {
        return Err(Sense::WRITE_PROTECTED);
    }
    Ok(Command::WriteSame { lba, blocks, unmap, ndob })
}

/// COMPARE AND WRITE (0x89): `blocks` to compare, then as many to write.
pub fn decode_compare_and_write(c: &[u8; 16], g: &Geometry) -> Result<Command, Sense> {
    if c[1] & 0xe1 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB); // WRPROTECT, reserved
    }
    let (lba, blocks) = (be(&c[2..10]), c[13]);
    if blocks > COMPARE_AND_WRITE_BLOCKS_MAX {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    in_range(lba, u64::from(blocks), g)?;
    if g.read_only {
        return Err(Sense::WRITE_PROTECTED);
    }
    Ok(Command::CompareAndWrite { lba, blocks, fua: c[1] & 0x08 != 0 })
}

/// GET LBA STATUS (0x9E / 0x12).
pub fn decode_get_lba_status(c: &[u8; 16], g: &Geometry) -> Result<Command, Sense> {
    let lba = be(&c[2..10]);
    if lba >= g.blocks {
        return Err(Sense::LBA_OUT_OF_RANGE);
    }
    Ok(Command::GetLbaStatus { lba, allocation: be(&c[10..14]) as u32 })
}

/// The GET LBA STATUS answer for extents `(offset_bytes, length_bytes, hole)` read
/// from the volume from `lba` on: descriptors beginning at `lba`, adjacent ones of one
/// kind merged, cut to `allocation` bytes.
pub fn lba_status(lba: u64, extents: &[(u64, u64, bool)], allocation: usize) -> Vec<u8> {
    let block = u64::from(LOGICAL_BLOCK_BYTES);
    let mut descriptors: Vec<(u64, u64, bool)> = Vec::new();
    let mut next = lba;
    for &(offset, length, hole) in extents {
        let end = (offset + length) / block;
        if end <= next {
            continue;
        }
        let blocks = end - next;
        let full = descriptors.len() == LBA_STATUS_DESCRIPTORS_MAX;
        match descriptors.last_mut() {
            Some(last) if last.2 == hole && last.1 + blocks <= u64::from(u32::MAX) => last.1 += blocks,
            _ if full => break,
            _ => descriptors.push((next, blocks.min(u64::from(u32::MAX)), hole)),
        }
        next = end;
    }
    let mut d = vec![0u8; 8];
    for (start, blocks, hole) in descriptors {
        d.extend_from_slice(&start.to_be_bytes());
        d.extend_from_slice(&(blocks as u32).to_be_bytes());
        d.extend_from_slice(&[u8::from(hole), 0, 0, 0]);
    }
    let length = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&length.to_be_bytes());
    d.truncate(allocation);
    d
}

/// The body of VPD 0xB2 (Logical Block Provisioning): UNMAP, WRITE SAME 16 and 10
/// with UNMAP, unmapped blocks read zeros; thin or resource provisioned.
pub fn provisioning_vpd(g: &Geometry) -> Vec<u8> {
    vec![0x00, 0xe4, if g.thin { 0x02 } else { 0x01 }, 0x00]
}

/// The thin provisioning fields of VPD 0xB0 (`body`: the page without its 4-byte
/// header).
pub fn block_limits_thin(g: &Geometry, body: &mut [u8]) {
    body[1] = COMPARE_AND_WRITE_BLOCKS_MAX;
    body[16..20].copy_from_slice(&UNMAP_BLOCKS_MAX.to_be_bytes());
    body[20..24].copy_from_slice(&UNMAP_DESCRIPTORS_MAX.to_be_bytes());
    let granularity = (g.volume_block_bytes / LOGICAL_BLOCK_BYTES).max(1);
    body[24..28].copy_from_slice(&granularity.to_be_bytes());
    body[32..40].copy_from_slice(&WRITE_SAME_BLOCKS_MAX.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry {
            blocks: 2048,
            volume_block_bytes: 16384,
            read_only: false,
            thin: true,
            transfer_max_bytes: 32 << 20,
            naa: 1,
            serial: "s".into(),
            target_name: "t".into(),
        }
    }

    fn list(descriptors: &[(u64, u32)]) -> Vec<u8> {
        let mut l = vec![0u8; 8];
        l[0..2].copy_from_slice(&((6 + 16 * descriptors.len()) as u16).to_be_bytes());
        l[2..4].copy_from_slice(&((16 * descriptors.len()) as u16).to_be_bytes());
        for &(lba, n) in descriptors {
            l.extend_from_slice(&lba.to_be_bytes());
            l.extend_from_slice(&n.to_be_bytes());
            l.extend_from_slice(&[0; 4]);
        }
        l
    }

    #[test]
    fn unmap_lists_are_checked_whole() {
        let g = geometry();
        assert_eq!(unmap_ranges(&list(&[(0, 8), (100, 0), (2040, 8)]), &g), Ok(vec![(0, 8), (2040, 8)]));
        assert_eq!(unmap_ranges(&list(&[(0, 8), (2041, 8)]), &g), Err(Sense::LBA_OUT_OF_RANGE));
        assert_eq!(unmap_ranges(&list(&[(u64::MAX, 2)]), &g), Err(Sense::LBA_OUT_OF_RANGE));
        assert_eq!(unmap_ranges(&[0, 6, 0, 16], &g), Err(Sense::PARAMETER_LIST_LENGTH_ERROR));
        assert_eq!(unmap_ranges(&[], &g), Ok(vec![]));
        let many: Vec<(u64, u32)> = (0..=UNMAP_DESCRIPTORS_MAX as u64).map(|i| (i, 1)).collect();
        let big = Geometry { blocks: 1 << 40, ..geometry() };
        assert_eq!(unmap_ranges(&list(&many), &big), Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
        // the list as the connection reads it (cut after one descriptor past the limit)
        let read = list(&many);
        assert_eq!(unmap_ranges(&read[..8 + 16 * 257], &big), Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
        // a header declaring too many, however little of it arrived
        let mut short = list(&[(0, 1)]);
        short[2..4].copy_from_slice(&(16 * 300u16).to_be_bytes());
        assert_eq!(unmap_ranges(&short, &big), Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
        assert_eq!(unmap_ranges(&list(&[(0, UNMAP_BLOCKS_MAX + 1)]), &big), Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
        // a list longer than its descriptor length field: only the declared ones count
        let mut l = list(&[(0, 8)]);
        l.extend_from_slice(&list(&[(4000, 8)])[8..]);
        assert_eq!(unmap_ranges(&l, &g), Ok(vec![(0, 8)]));
    }

    #[test]
    fn write_same_and_caw_decode_with_limits() {
        let g = geometry();
        let mut c = [0u8; 16];
        c[0] = 0x93;
        c[1] = 0x08;
        c[9] = 16;
        c[13] = 32;
        assert_eq!(decode_write_same(&c, &g), Ok(Command::WriteSame { lba: 16, blocks: 32, unmap: true, ndob: false }));
        c[13] = 0;
        assert_eq!(
            decode_write_same(&c, &g),
            Ok(Command::WriteSame { lba: 16, blocks: 2048 - 16, unmap: true, ndob: false }),
            "zero blocks: to the end of the unit"
        );
        let huge = Geometry { blocks: 1 << 40, ..geometry() };
        assert_eq!(decode_write_same(&c, &huge), Err(Sense::INVALID_FIELD_IN_CDB), "beyond the maximum write same length");
        c[13] = 32;
        c[1] = 0x10;
        assert_eq!(decode_write_same(&c, &g), Err(Sense::INVALID_FIELD_IN_CDB), "ANCHOR refused");
        c[1] = 0;
        c[9] = 0xff;
        c[8] = 0x07;
        assert_eq!(decode_write_same(&c, &g), Err(Sense::LBA_OUT_OF_RANGE));
        let mut w = [0u8; 16];
        w[0] = 0x89;
        w[1] = 0x08;
        w[9] = 4;
        w[13] = 1;
        assert_eq!(decode_compare_and_write(&w, &g), Ok(Command::CompareAndWrite { lba: 4, blocks: 1, fua: true }));
        w[9] = 0xff;
        w[8] = 0x07;
        w[13] = 2;
        assert_eq!(decode_compare_and_write(&w, &g), Err(Sense::LBA_OUT_OF_RANGE));
        let ro = Geometry { read_only: true, ..geometry() };
        w[8] = 0;
        assert_eq!(decode_compare_and_write(&w, &ro), Err(Sense::WRITE_PROTECTED));
    }

    #[test]
    fn lba_status_starts_at_the_requested_block_and_merges() {
        // volume blocks of 16K: [0,16K) data, [16K,48K) hole, [48K,64K) data
        let extents = [(0, 16384, false), (16384, 16384, true), (32768, 16384, true), (49152, 16384, false)];
        let d = lba_status(10, &extents, 4096);
        assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 4 + 3 * 16);
        let desc = |i: usize| {
            let x = &d[8 + 16 * i..24 + 16 * i];
            (u64::from_be_bytes(x[0..8].try_into().unwrap()), u32::from_be_bytes(x[8..12].try_into().unwrap()), x[12])
        };
        assert_eq!(desc(0), (10, 22, 0));
        assert_eq!(desc(1), (32, 64, 1));
        assert_eq!(desc(2), (96, 32, 0));
        assert_eq!(lba_status(10, &extents, 20).len(), 20, "cut to the allocation length");
    }
}
