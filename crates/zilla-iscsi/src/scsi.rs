//! scsi: the SCSI block command set of LUN 0 (SPC-4 / SBC-3), pure.
//!
//! Theory of operation
//! -------------------
//! [`decode`] turns a CDB into an [`Operation`] or a [`Sense`] (CHECK CONDITION),
//! checking every field against the unit's [`Geometry`]: ranges past the end give
//! LBA OUT OF RANGE, reserved or unsupported bits INVALID FIELD IN CDB, unknown
//! opcodes INVALID COMMAND OPERATION CODE. The connection then runs the operation:
//! reads, writes and cache flushes go to the volume through the front end's executor;
//! everything answered from the unit's description (INQUIRY and its VPD pages, READ
//! CAPACITY, MODE SENSE, REPORT LUNS, REQUEST SENSE) is built here into a small
//! buffer, cut to the CDB's allocation length. Logical and physical blocks are 512
//! bytes: a write of part of a volume block is correct and atomic (the pool reads,
//! modifies and writes the block), only slower. The volume's block size is reported as
//! the optimal transfer and unmap granularity (Block Limits VPD: Linux takes it as
//! the device's minimum I/O size), so initiators align to it.
//! Sense data is fixed format (0x70), autosensed in the SCSI Response.

use crate::thin;

pub use crate::sense::{FieldPointer, Geometry, Sense, LOGICAL_BLOCK_BYTES, STATUS_CHECK_CONDITION, STATUS_GOOD};

/// A decoded CDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    TestUnitReady,
    /// Answered with these bytes (already cut to the allocation length).
    DataIn(Vec<u8>),
    Read { lba: u64, blocks: u32, fua: bool },
    Write { lba: u64, blocks: u32, fua: bool },
    /// VERIFY with BYTCHK 0: the range is checked, nothing transferred.
    Verify,
    /// VERIFY with BYTCHK 1: the range is read and compared with the data sent.
    VerifyCompare { lba: u64, blocks: u32 },
    SynchronizeCache,
    /// MODE SELECT of `parameter_bytes` bytes (6 or 10 byte header).
    ModeSelect { parameter_bytes: u32, ten: bool, save: bool },
    /// UNMAP with a parameter list of `parameter_bytes` (Data-Out).
    Unmap { parameter_bytes: u32 },
    /// WRITE SAME of one block (Data-Out, none with `ndob`) over `blocks` at `lba`.
    WriteSame { lba: u64, blocks: u64, unmap: bool, ndob: bool },
    /// COMPARE AND WRITE: Data-Out of `2 * blocks` blocks (compare, then write).
    CompareAndWrite { lba: u64, blocks: u8, fua: bool },
    /// PRE-FETCH of a checked range: answered GOOD (the ARC and read-ahead decide
    /// what is cached).
    Prefetch,
    /// OR WRITE: the blocks at `lba` become their OR with the data sent, atomically.
    OrWrite { lba: u64, blocks: u32, fua: bool },
    /// GET LBA STATUS from `lba`, answered in at most `allocation` bytes.
    GetLbaStatus { lba: u64, allocation: u32 },
    /// MODE SENSE: built by the caller (it needs the live WCE).
    ModeSense { ten: bool, dbd: bool, llbaa: bool, page_control: u8, page: u8, subpage: u8, allocation: u32 },
    /// RESERVE/RELEASE and PERSISTENT RESERVE IN/OUT: run against the unit's shared
    /// reservation state (`pr`).
    Reservation(crate::pr::Command),
}

impl From<thin::Command> for Operation {
    fn from(command: thin::Command) -> Operation {
        match command {
            thin::Command::Unmap { parameter_bytes } => Operation::Unmap { parameter_bytes },
            thin::Command::WriteSame { lba, blocks, unmap, ndob } => Operation::WriteSame { lba, blocks, unmap, ndob },
            thin::Command::CompareAndWrite { lba, blocks, fua } => Operation::CompareAndWrite { lba, blocks, fua },
            thin::Command::GetLbaStatus { lba, allocation } => Operation::GetLbaStatus { lba, allocation },
        }
    }
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b))
}

/// Bytes of the CDB for `opcode` (by its group code).
pub fn cdb_bytes(opcode: u8) -> usize {
    match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 16,
    }
}

/// Decode `cdb` (16 bytes as carried in the SCSI Command PDU) for LUN 0 when `lun0`.
pub fn decode(cdb: &[u8], lun0: bool, geometry: &Geometry) -> Result<Operation, Sense> {
    let mut c = [0u8; 16];
    let n = cdb.len().min(16);
    c[..n].copy_from_slice(&cdb[..n]);
    let opcode = c[0];
    // the control byte's vendor/NACA/LINK bits: NACA and LINK are unsupported
    let control = c[cdb_bytes(opcode) - 1];
    if control & 0x05 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    match opcode {
        0x12 => return inquiry(&c, lun0, geometry),
        0xa0 => return report_luns(&c),
        0x03 => return request_sense(&c),
        _ => {}
    }
    if !lun0 {
        return Err(Sense::LUN_NOT_SUPPORTED);
    }
    if let Some(decoded) = decode_block_io(opcode, &c, geometry) {
        return decoded;
    }
    if let Some(decoded) = decode_provisioning(opcode, &c, geometry) {
        return decoded;
    }
    match opcode {
        0x00 => Ok(Operation::TestUnitReady),
        0x16 | 0x17 | 0x56 | 0x57 | 0x5e | 0x5f => crate::pr::decode(&c).map(Operation::Reservation),
        0x25 => {
            // READ CAPACITY 10: PMI/LBA fields obsolete in SBC-3, must be zero
            if c[8] & 0x01 != 0 || be(&c[2..6]) != 0 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            let last = geometry.blocks.saturating_sub(1).min(0xffff_ffff) as u32;
            let mut d = Vec::with_capacity(8);
            d.extend_from_slice(&last.to_be_bytes());
            d.extend_from_slice(&LOGICAL_BLOCK_BYTES.to_be_bytes());
            Ok(Operation::DataIn(d))
        }
        0xa3 if c[1] & 0x1f == 0x0c => report_supported_operation_codes(&c),
        0x9e if c[1] & 0x1f == 0x10 => {
            let allocation = be(&c[10..14]) as usize;
            Ok(Operation::DataIn(cut(read_capacity16(geometry), allocation)))
        }
        0x35 | 0x91 => {
            let (lba, blocks) = if opcode == 0x35 { (be(&c[2..6]), be(&c[7..9])) } else { (be(&c[2..10]), be(&c[10..14])) };
            check_range(lba, blocks, geometry)?;
            Ok(Operation::SynchronizeCache)
        }
        0x1a | 0x5a => Ok(mode_sense_cdb(&c)),
        0x15 | 0x55 => {
            let ten = opcode == 0x55;
            let parameter_bytes = if ten { be(&c[7..9]) as u32 } else { u32::from(c[4]) };
            if geometry.read_only {
                return Err(Sense::WRITE_PROTECTED);
            }
            Ok(Operation::ModeSelect { parameter_bytes, ten, save: c[1] & 0x01 != 0 })
        }
        _ => Err(Sense::INVALID_OPCODE),
    }
}

/// MODE SENSE 6 or 10, its fields.
fn mode_sense_cdb(c: &[u8; 16]) -> Operation {
    let ten = c[0] == 0x5a;
    let allocation = if ten { be(&c[7..9]) as u32 } else { u32::from(c[4]) };
    Operation::ModeSense {
        ten,
        dbd: c[1] & 0x08 != 0,
        llbaa: ten && c[1] & 0x10 != 0,
        page_control: c[2] >> 6,
        page: c[2] & 0x3f,
        subpage: c[3],
        allocation,
    }
}

/// UNMAP, WRITE SAME, COMPARE AND WRITE, GET LBA STATUS (thin.rs), PRE-FETCH, OR WRITE
/// and READ DEFECT DATA; `None`: another opcode.
fn decode_provisioning(opcode: u8, c: &[u8; 16], geometry: &Geometry) -> Option<Result<Operation, Sense>> {
    let known = matches!(opcode, 0x42 | 0x34 | 0x90 | 0x37 | 0xb7 | 0x8b | 0x41 | 0x93 | 0x89) || (opcode == 0x9e && c[1] & 0x1f == 0x12);
    if !known {
        return None;
    }
    let decoded = (|| match opcode {
        0x42 => thin::decode_unmap(c, geometry).map(Operation::from),
        0x34 | 0x90 => {
            let (lba, blocks) = if opcode == 0x34 { (be(&c[2..6]), be(&c[7..9])) } else { (be(&c[2..10]), be(&c[10..14])) };
            check_range(lba, blocks, geometry)?;
            Ok(Operation::Prefetch)
        }
        0x37 | 0xb7 => Ok(Operation::DataIn(read_defect_data(c))),
        0x8b => {
            if c[1] & 0xe0 != 0 || c[14] & 0x07 != 0 {
                return Err(Sense::INVALID_FIELD_IN_CDB); // ORPROTECT, BMOP other than OR
            }
            let (lba, blocks) = (be(&c[2..10]), be(&c[10..14]));
            check_range(lba, blocks, geometry)?;
            if blocks * u64::from(LOGICAL_BLOCK_BYTES) > u64::from(geometry.transfer_max_bytes) {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            if geometry.read_only {
                return Err(Sense::WRITE_PROTECTED);
            }
            Ok(Operation::OrWrite { lba, blocks: blocks as u32, fua: c[1] & 0x08 != 0 })
        }
        0x41 | 0x93 => thin::decode_write_same(c, geometry).map(Operation::from),
        0x89 => thin::decode_compare_and_write(c, geometry).map(Operation::from),
        0x9e if c[1] & 0x1f == 0x12 => thin::decode_get_lba_status(c, geometry).map(Operation::from),
        _ => Err(Sense::INVALID_OPCODE),
    })();
    Some(decoded)
}

/// READ, WRITE, WRITE AND VERIFY and VERIFY of every size; `None`: another opcode.
fn decode_block_io(opcode: u8, c: &[u8; 16], geometry: &Geometry) -> Option<Result<Operation, Sense>> {
    let decoded = (|| match opcode {
        0x08 | 0x0a => {
            let lba = be(&c[1..4]) & 0x1f_ffff;
            let blocks = if c[4] == 0 { 256 } else { u32::from(c[4]) };
            rw(opcode == 0x0a, lba, blocks, false, geometry)
        }
        0x28 | 0x2a => {
            rw_flags(c, geometry)?;
            rw(opcode == 0x2a, be(&c[2..6]), be(&c[7..9]) as u32, c[1] & 0x08 != 0, geometry)
        }
        0xa8 | 0xaa => {
            rw_flags(c, geometry)?;
            rw(opcode == 0xaa, be(&c[2..6]), be(&c[6..10]) as u32, c[1] & 0x08 != 0, geometry)
        }
        0x88 | 0x8a => {
            rw_flags(c, geometry)?;
            rw(opcode == 0x8a, be(&c[2..10]), be(&c[10..14]) as u32, c[1] & 0x08 != 0, geometry)
        }
        // WRITE AND VERIFY: written durably before the status; the compare of BYTCHK 1
        // would read back what the write just placed (the pool checksums every block)
        0x2e | 0xae | 0x8e => {
            if c[1] & 0xe0 != 0 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            let (lba, blocks) = match opcode {
                0x2e => (be(&c[2..6]), be(&c[7..9])),
                0xae => (be(&c[2..6]), be(&c[6..10])),
                _ => (be(&c[2..10]), be(&c[10..14])),
            };
            rw(true, lba, blocks as u32, true, geometry)
        }
        0x2f | 0xaf | 0x8f => {
            let (lba, blocks) = match opcode {
                0x2f => (be(&c[2..6]), be(&c[7..9])),
                0xaf => (be(&c[2..6]), be(&c[6..10])),
                _ => (be(&c[2..10]), be(&c[10..14])),
            };
            // VRPROTECT is not supported, nor BYTCHK 11 (one block compared to all)
            let bytchk = (c[1] >> 1) & 0x03;
            if c[1] & 0xe0 != 0 || bytchk > 1 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            check_range(lba, blocks, geometry)?;
            if bytchk == 0 {
                return Ok(Operation::Verify);
            }
            if blocks * u64::from(LOGICAL_BLOCK_BYTES) > u64::from(geometry.transfer_max_bytes) {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            Ok(Operation::VerifyCompare { lba, blocks: blocks as u32 })
        }
        _ => Err(Sense::INVALID_OPCODE),
    })();
    let known = matches!(opcode, 0x08 | 0x0a | 0x28 | 0x2a | 0xa8 | 0xaa | 0x88 | 0x8a | 0x2e | 0xae | 0x8e | 0x2f | 0xaf | 0x8f);
    known.then_some(decoded)
}

const RW10: [u8; 10] = [0, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0];
const RW12: [u8; 12] = [0, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0];
const RW16: [u8; 16] = [0, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0];

/// The CDB usage bitmap of `opcode` (service action `sa`): the bits a CDB may set
/// (its first byte the opcode). `None`: not supported.
fn cdb_usage(opcode: u8, sa: Option<u16>) -> Option<Vec<u8>> {
    let with = |mut usage: Vec<u8>, byte1: u8| {
        usage[0] = opcode;
        usage[1] = byte1;
        usage
    };
    let usage = match (opcode, sa) {
        (0x00, None) => vec![0x00, 0, 0, 0, 0, 0],
        (0x03, None) => vec![0x03, 0x01, 0, 0, 0xff, 0],
        (0x08 | 0x0a, None) => vec![opcode, 0x1f, 0xff, 0xff, 0xff, 0],
        (0x12, None) => vec![0x12, 0x01, 0xff, 0xff, 0xff, 0],
        (0x15, None) => vec![0x15, 0x11, 0, 0, 0xff, 0],
        (0x1a, None) => vec![0x1a, 0x08, 0xff, 0xff, 0xff, 0],
        (0x25, None) => vec![0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        (0x16 | 0x17, None) => vec![opcode, 0, 0, 0, 0, 0],
        (0x56 | 0x57, None) => vec![opcode, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        (0x5e, Some(sa @ 0..=3)) => vec![0x5e, sa as u8, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
        (0x5f, Some(sa @ (0..=6))) => vec![0x5f, sa as u8, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
        (0x34, None) => with(RW10.to_vec(), 0x02),
        (0x37, None) => vec![0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0],
        (0x41, None) => with(RW10.to_vec(), 0x08),
        (0x42, None) => vec![0x42, 0, 0, 0, 0, 0, 0x1f, 0xff, 0xff, 0],
        (0x8b, None) => {
            let mut usage = with(RW16.to_vec(), 0x18);
            usage[14] = 0x07;
            usage
        }
        (0x90, None) => with(RW16.to_vec(), 0x02),
        (0xb7, None) => vec![0xb7, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        (0x89, None) => vec![0x89, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0, 0],
        (0x93, None) => with(RW16.to_vec(), 0x09),
        (0x9e, Some(0x12)) => vec![0x9e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0],
        (0x28 | 0x2a, None) => with(RW10.to_vec(), 0x18),
        (0x2e | 0x2f, None) => with(RW10.to_vec(), 0x12),
        (0x35, None) => with(RW10.to_vec(), 0x02),
        (0x55, None) => vec![0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
        (0x5a, None) => vec![0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0],
        (0x88 | 0x8a, None) => with(RW16.to_vec(), 0x18),
        (0x8e | 0x8f, None) => with(RW16.to_vec(), 0x12),
        (0x91, None) => with(RW16.to_vec(), 0x02),
        (0x9e, Some(0x10)) => vec![0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        (0xa0, None) => vec![0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        (0xa3, Some(0x0c)) => vec![0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0],
        (0xa8 | 0xaa, None) => with(RW12.to_vec(), 0x18),
        (0xae | 0xaf, None) => with(RW12.to_vec(), 0x12),
        _ => return None,
    };
    Some(usage)
}

/// Opcodes that take a service action (in CDB byte 1).
fn has_service_action(opcode: u8) -> bool {
    matches!(opcode, 0x5e | 0x5f | 0x9e | 0xa3)
}

/// Every supported (opcode, service action).
const SUPPORTED_COMMANDS: &[(u8, Option<u16>)] = &[
    (0x00, None), (0x03, None), (0x08, None), (0x0a, None), (0x12, None), (0x15, None), (0x1a, None),
    (0x25, None), (0x28, None), (0x2a, None), (0x2e, None), (0x2f, None), (0x34, None), (0x35, None),
    (0x37, None), (0x41, None), (0x42, None), (0x55, None), (0x5a, None), (0x88, None), (0x89, None),
    (0x8a, None), (0x8b, None), (0x8e, None), (0x8f, None), (0x90, None), (0x91, None), (0x93, None),
    (0x9e, Some(0x10)), (0x9e, Some(0x12)), (0xb7, None), (0x16, None), (0x17, None), (0x56, None),
    (0x57, None), (0x5e, Some(0)), (0x5e, Some(1)), (0x5e, Some(2)), (0x5e, Some(3)), (0x5f, Some(0)),
    (0x5f, Some(1)), (0x5f, Some(2)), (0x5f, Some(3)), (0x5f, Some(4)), (0x5f, Some(5)), (0x5f, Some(6)),
    (0xa0, None), (0xa3, Some(0x0c)), (0xa8, None), (0xaa, None), (0xae, None), (0xaf, None),
];

/// A command timeouts descriptor (no timeouts given).
const TIMEOUTS_DESCRIPTOR: [u8; 12] = [0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// REPORT SUPPORTED OPERATION CODES: all commands (option 0) or one (options 1, 2).
fn report_supported_operation_codes(c: &[u8; 16]) -> Result<Operation, Sense> {
    let rctd = c[2] & 0x80 != 0;
    let (opcode, sa) = (c[3], be(&c[4..6]) as u16);
    let allocation = be(&c[6..10]) as usize;
    let mut d = Vec::new();
    match c[2] & 0x07 {
        0 => {
            d.extend_from_slice(&[0; 4]);
            for &(op, service) in SUPPORTED_COMMANDS {
                let length = cdb_usage(op, service).map_or(0, |u| u.len()) as u16;
                let flags = u8::from(service.is_some()) | if rctd { 0x02 } else { 0 };
                d.extend_from_slice(&[op, 0]);
                d.extend_from_slice(&service.unwrap_or(0).to_be_bytes());
                d.extend_from_slice(&[0, flags]);
                d.extend_from_slice(&length.to_be_bytes());
                if rctd {
                    d.extend_from_slice(&TIMEOUTS_DESCRIPTOR);
                }
            }
            let length = (d.len() - 4) as u32;
            d[0..4].copy_from_slice(&length.to_be_bytes());
        }
        option @ (1 | 2) => {
            // asking by service action for an opcode without them, or the reverse: the
            // REQUESTED OPERATION CODE (byte 3) is in error
            if (option == 1) == has_service_action(opcode) {
                return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb_byte(3));
            }
            let usage = cdb_usage(opcode, (option == 2).then_some(sa));
            let support = if usage.is_some() { 0x03 } else { 0x01 };
            let usage = usage.unwrap_or_default();
            d.extend_from_slice(&[0, support | if rctd { 0x80 } else { 0 }]);
            d.extend_from_slice(&(usage.len() as u16).to_be_bytes());
            d.extend_from_slice(&usage);
            if rctd {
                d.extend_from_slice(&TIMEOUTS_DESCRIPTOR);
            }
        }
        _ => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb_byte(2)),
    }
    Ok(Operation::DataIn(cut(d, allocation)))
}

/// RDPROTECT/WRPROTECT are not supported (no protection information).
fn rw_flags(c: &[u8; 16], _geometry: &Geometry) -> Result<(), Sense> {
    if c[1] & 0xe0 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    Ok(())
}

fn check_range(lba: u64, blocks: u64, geometry: &Geometry) -> Result<(), Sense> {
    match lba.checked_add(blocks) {
        Some(end) if end <= geometry.blocks => Ok(()),
        _ => Err(Sense::LBA_OUT_OF_RANGE),
    }
}

fn rw(write: bool, lba: u64, blocks: u32, fua: bool, geometry: &Geometry) -> Result<Operation, Sense> {
    check_range(lba, u64::from(blocks), geometry)?;
    if u64::from(blocks) * u64::from(LOGICAL_BLOCK_BYTES) > u64::from(geometry.transfer_max_bytes) {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    if write {
        if geometry.read_only {
            return Err(Sense::WRITE_PROTECTED);
        }
        Ok(Operation::Write { lba, blocks, fua })
    } else {
        Ok(Operation::Read { lba, blocks, fua })
    }
}

/// READ DEFECT DATA 10 / 12: the lists asked for, empty (a volume has no defects),
/// in the format asked for.
fn read_defect_data(c: &[u8; 16]) -> Vec<u8> {
    if c[0] == 0x37 {
        let allocation = be(&c[7..9]) as usize;
        cut(vec![0, c[2] & 0x1f, 0, 0], allocation)
    } else {
        let allocation = be(&c[6..10]) as usize;
        cut(vec![0, c[1] & 0x1f, 0, 0, 0, 0, 0, 0], allocation)
    }
}

/// `data` cut to `allocation` bytes.
fn cut(mut data: Vec<u8>, allocation: usize) -> Vec<u8> {
    data.truncate(allocation);
    data
}

fn read_capacity16(g: &Geometry) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0..8].copy_from_slice(&g.blocks.saturating_sub(1).to_be_bytes());
    d[8..12].copy_from_slice(&LOGICAL_BLOCK_BYTES.to_be_bytes());
    // physical block exponent 0: every 512-byte block is addressed, written, unmapped
    // and reported (GET LBA STATUS) on its own; the volume block is a performance
    // hint, given in the Block Limits page (see the module comment)
    d[13] = 0;
    d[14] = 0xc0; // LBPME, LBPRZ
    d
}

fn inquiry(c: &[u8; 16], lun0: bool, g: &Geometry) -> Result<Operation, Sense> {
    let evpd = c[1] & 0x01 != 0;
    let page = c[2];
    let allocation = be(&c[3..5]) as usize;
    if c[1] & 0xfe != 0 || (!evpd && page != 0) {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    // peripheral qualifier 3: no unit at this LUN
    let peripheral = if lun0 { 0x00 } else { 0x7f };
    if !evpd {
        let mut d = vec![0u8; 66];
        d[0] = peripheral;
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HISUP, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[7] = 0x02; // CMDQUE
        d[8..16].copy_from_slice(b"ZILLA   ");
        d[16..32].copy_from_slice(b"VOLUME          ");
        d[32..36].copy_from_slice(b"0001");
        // version descriptors: SAM-5, iSCSI, SPC-4, SBC-3
        for (i, v) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        return Ok(Operation::DataIn(cut(d, allocation)));
    }
    if !lun0 {
        return Err(Sense::LUN_NOT_SUPPORTED);
    }
    let body: Vec<u8> = match page {
        0x00 => vec![0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2],
        0x80 => g.serial.as_bytes().to_vec(),
        0x83 => device_identification(g),
        0xb0 => block_limits(g),
        0xb1 => {
            let mut b = vec![0u8; 0x3c];
            b[1] = 0x00; // medium rotation rate: not reported (a hybrid pool)
            b
        }
        0xb2 => thin::provisioning_vpd(g),
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    let mut d = vec![peripheral, page];
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.extend_from_slice(&body);
    Ok(Operation::DataIn(cut(d, allocation)))
}

/// VPD 0x83 descriptors: the NAA of the logical unit, a T10 vendor id, and the target
/// name (SCSI name string of the target device).
fn device_identification(g: &Geometry) -> Vec<u8> {
    let mut d = Vec::new();
    // NAA, binary, associated with the logical unit
    d.extend_from_slice(&[0x01, 0x03, 0x00, 0x08]);
    d.extend_from_slice(&g.naa.to_be_bytes());
    // T10 vendor id, ASCII: vendor then serial
    let t10 = format!("ZILLA   {}", g.serial);
    d.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
    d.extend_from_slice(t10.as_bytes());
    // SCSI name string, UTF-8, target device, iSCSI (PIV)
    let mut name = g.target_name.as_bytes().to_vec();
    name.truncate(251);
    name.push(0);
    while !name.len().is_multiple_of(4) {
        name.push(0);
    }
    d.extend_from_slice(&[0x53, 0xa8, 0x00, name.len() as u8]);
    d.extend_from_slice(&name);
    d
}

fn block_limits(g: &Geometry) -> Vec<u8> {
    let mut b = vec![0u8; 0x3c];
    let granularity = (g.volume_block_bytes / LOGICAL_BLOCK_BYTES).clamp(1, 0xffff) as u16;
    b[2..4].copy_from_slice(&granularity.to_be_bytes());
    let max_blocks = g.transfer_max_bytes / LOGICAL_BLOCK_BYTES;
    b[4..8].copy_from_slice(&max_blocks.to_be_bytes());
    let optimal = ((1u32 << 20) / LOGICAL_BLOCK_BYTES).max(u32::from(granularity)).min(max_blocks);
    b[8..12].copy_from_slice(&optimal.to_be_bytes());
    thin::block_limits_thin(g, &mut b);
    b
}

fn report_luns(c: &[u8; 16]) -> Result<Operation, Sense> {
    let allocation = be(&c[6..10]) as usize;
    if allocation < 16 || c[2] > 0x02 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let mut d = vec![0u8; 16];
    d[3] = 8; // one LUN: 0
    Ok(Operation::DataIn(cut(d, allocation)))
}

fn request_sense(c: &[u8; 16]) -> Result<Operation, Sense> {
    let allocation = usize::from(c[4]);
    if c[1] & 0x01 != 0 {
        // descriptor format: NO SENSE, no descriptors
        return Ok(Operation::DataIn(cut(vec![0x72, 0, 0, 0, 0, 0, 0, 0], allocation)));
    }
    Ok(Operation::DataIn(cut(Sense { key: 0, asc: 0, ascq: 0, field: None }.fixed().to_vec(), allocation)))
}

/// Caching mode page (0x08) with WCE as given.
pub fn caching_page(wce: bool) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = 0x08 | 0x80; // PS: saveable (the wce property persists)
    p[1] = 0x12;
    if wce {
        p[2] = 0x04;
    }
    p
}

/// Control mode page (0x0A): unrestricted reordering, fixed-format sense.
pub fn control_page() -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p[0] = 0x0a;
    p[1] = 0x0a;
    p[3] = 0x10;
    p[8..10].copy_from_slice(&0xffffu16.to_be_bytes());
    p
}

/// MODE SENSE data for a decoded [`Operation::ModeSense`]; `wce` the current setting.
#[allow(clippy::too_many_arguments)]
pub fn mode_sense(
    g: &Geometry,
    wce: bool,
    ten: bool,
    dbd: bool,
    llbaa: bool,
    page_control: u8,
    page: u8,
    subpage: u8,
    allocation: u32,
) -> Result<Vec<u8>, Sense> {
    if subpage != 0 && subpage != 0xff {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let caching = |pc: u8| match pc {
        1 => {
            let mut p = caching_page(false);
            p[2] = 0x04; // WCE is changeable
            p
        }
        2 => caching_page(false),
        _ => caching_page(wce),
    };
    let control = |pc: u8| match pc {
        1 => {
            let mut p = vec![0u8; 12];
            p[0] = 0x0a;
            p[1] = 0x0a;
            p
        }
        _ => control_page(),
    };
    let mut pages = Vec::new();
    match page {
        0x08 => pages.extend(caching(page_control)),
        0x0a => pages.extend(control(page_control)),
        0x3f => {
            pages.extend(caching(page_control));
            pages.extend(control(page_control));
        }
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    }
    let device_specific = if g.read_only { 0x80 } else { 0x00 } | 0x10; // WP, DPOFUA
    let long = ten && llbaa;
    let descriptor = if dbd {
        Vec::new()
    } else if long {
        let mut d = vec![0u8; 16];
        d[0..8].copy_from_slice(&g.blocks.to_be_bytes());
        d[12..16].copy_from_slice(&LOGICAL_BLOCK_BYTES.to_be_bytes());
        d
    } else {
        let mut d = vec![0u8; 8];
        d[0..4].copy_from_slice(&(g.blocks.min(0xffff_ffff) as u32).to_be_bytes());
        d[5..8].copy_from_slice(&LOGICAL_BLOCK_BYTES.to_be_bytes()[1..4]);
        d
    };
    let mut out = mode_header(ten, long, device_specific, descriptor.len(), pages.len());
    out.extend(descriptor);
    out.extend(pages);
    out.truncate(allocation as usize);
    Ok(out)
}

/// The mode parameter header (6 or 10 byte form).
fn mode_header(ten: bool, long: bool, device_specific: u8, descriptor_bytes: usize, pages_bytes: usize) -> Vec<u8> {
    if ten {
        let mut h = vec![0u8; 8];
        let len = (6 + descriptor_bytes + pages_bytes) as u16;
        h[0..2].copy_from_slice(&len.to_be_bytes());
        h[3] = device_specific;
        h[4] = u8::from(long);
        h[6..8].copy_from_slice(&(descriptor_bytes as u16).to_be_bytes());
        h
    } else {
        vec![(3 + descriptor_bytes + pages_bytes) as u8, 0, device_specific, descriptor_bytes as u8]
    }
}

/// The WCE a MODE SELECT parameter list asks for (`None`: it leaves the caching page
/// alone). Anything else than a change of WCE is refused: block descriptors must
/// describe 512-byte blocks, the control page must be as reported.
pub fn mode_select(parameters: &[u8], ten: bool, current_wce: bool) -> Result<Option<bool>, Sense> {
    let header_bytes = if ten { 8 } else { 4 };
    if parameters.len() < header_bytes {
        return if parameters.is_empty() { Ok(None) } else { Err(Sense::PARAMETER_LIST_LENGTH_ERROR) };
    }
    let descriptor_bytes = if ten { be(&parameters[6..8]) as usize } else { usize::from(parameters[3]) };
    let pages_at = header_bytes + descriptor_bytes;
    let Some(descriptors) = parameters.get(header_bytes..pages_at) else {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    };
    for d in descriptors.chunks(if ten && parameters[4] & 1 != 0 { 16 } else { 8 }) {
        let length = be(&d[d.len().saturating_sub(3)..]);
        if length != u64::from(LOGICAL_BLOCK_BYTES) {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
    }
    let mut at = pages_at;
    let mut wce = None;
    while at < parameters.len() {
        let (Some(&code), Some(&len)) = (parameters.get(at), parameters.get(at + 1)) else {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
        };
        let code = code & 0x3f;
        let Some(page) = parameters.get(at..at + 2 + usize::from(len)) else {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
        };
        match code {
            0x08 => {
                let reference = caching_page(current_wce);
                if page.len() != reference.len() {
                    return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
                }
                // every bit but WCE (byte 2, 0x04) must be as reported (PS ignored)
                for (i, (&got, &want)) in page.iter().zip(&reference).enumerate().skip(1) {
                    let mask = if i == 2 { !0x04u8 } else { 0xff };
                    if got & mask != want & mask {
                        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
                    }
                }
                wce = Some(page[2] & 0x04 != 0);
            }
            0x0a => {
                let reference = control_page();
                if page.len() != reference.len() || page[1..] != reference[1..] {
                    return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST);
                }
            }
            _ => return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST),
        }
        at += page.len();
    }
    Ok(wce)
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
            naa: 0x3123_4567_89ab_cdef,
            serial: "0123456789abcdef".into(),
            target_name: "iqn.2026-11.io.zilla:tank.vol".into(),
        }
    }

    fn cdb(bytes: &[u8]) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..bytes.len()].copy_from_slice(bytes);
        c
    }

    #[test]
    fn reads_and_writes_decode_with_ranges_checked() {
        let g = geometry();
        assert_eq!(
            decode(&cdb(&[0x28, 0, 0, 0, 0, 10, 0, 0, 8, 0]), true, &g),
            Ok(Operation::Read { lba: 10, blocks: 8, fua: false })
        );
        assert_eq!(
            decode(&cdb(&[0x2a, 0x08, 0, 0, 0x07, 0xf8, 0, 0, 8, 0]), true, &g),
            Ok(Operation::Write { lba: 2040, blocks: 8, fua: true })
        );
        assert_eq!(decode(&cdb(&[0x2a, 0, 0, 0, 0x07, 0xf9, 0, 0, 8, 0]), true, &g), Err(Sense::LBA_OUT_OF_RANGE));
        let mut r16 = cdb(&[0x88]);
        r16[2..10].copy_from_slice(&u64::MAX.to_be_bytes());
        r16[13] = 1;
        assert_eq!(decode(&r16, true, &g), Err(Sense::LBA_OUT_OF_RANGE));
        assert_eq!(decode(&cdb(&[0x08, 0, 0, 1, 0, 0]), true, &g), Ok(Operation::Read { lba: 1, blocks: 256, fua: false }));
        assert_eq!(decode(&cdb(&[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0]), true, &g), Err(Sense::INVALID_FIELD_IN_CDB));
        assert_eq!(decode(&cdb(&[0xff]), true, &g), Err(Sense::INVALID_OPCODE));
        assert_eq!(decode(&cdb(&[0x00]), false, &g), Err(Sense::LUN_NOT_SUPPORTED));
        let ro = Geometry { read_only: true, ..geometry() };
        assert_eq!(decode(&cdb(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0]), true, &ro), Err(Sense::WRITE_PROTECTED));
        assert_eq!(decode(&cdb(&[0x2f, 0, 0, 0, 0, 1, 0, 0, 2, 0]), true, &g), Ok(Operation::Verify));
        assert_eq!(decode(&cdb(&[0x2f, 0x02, 0, 0, 0, 1, 0, 0, 2, 0]), true, &g), Ok(Operation::VerifyCompare { lba: 1, blocks: 2 }));
        assert_eq!(decode(&cdb(&[0x2f, 0x06, 0, 0, 0, 1, 0, 0, 2, 0]), true, &g), Err(Sense::INVALID_FIELD_IN_CDB));
        assert_eq!(decode(&cdb(&[0xaf, 0x02, 0, 0, 0x07, 0xff, 0, 0, 0, 2, 0, 0]), true, &g), Err(Sense::LBA_OUT_OF_RANGE));
        assert_eq!(
            decode(&cdb(&[0x2e, 0x10, 0, 0, 0, 3, 0, 0, 1, 0]), true, &g),
            Ok(Operation::Write { lba: 3, blocks: 1, fua: true }),
            "WRITE AND VERIFY is a durable write"
        );
        let mut big = cdb(&[0xaa]);
        big[6..10].copy_from_slice(&(70_000u32).to_be_bytes());
        let huge = Geometry { blocks: 1 << 30, ..geometry() };
        assert_eq!(decode(&big, true, &huge), Err(Sense::INVALID_FIELD_IN_CDB));
    }

    #[test]
    fn inquiry_and_vpd_pages() {
        let g = geometry();
        let Ok(Operation::DataIn(std)) = decode(&cdb(&[0x12, 0, 0, 0, 255, 0]), true, &g) else { panic!() };
        assert_eq!(std.len(), 66);
        assert_eq!(&std[8..16], b"ZILLA   ");
        assert_eq!(usize::from(std[4]) + 5, std.len());
        let Ok(Operation::DataIn(short)) = decode(&cdb(&[0x12, 0, 0, 0, 5, 0]), true, &g) else { panic!() };
        assert_eq!(short.len(), 5);
        let Ok(Operation::DataIn(none)) = decode(&cdb(&[0x12, 0, 0, 0, 36, 0]), false, &g) else { panic!() };
        assert_eq!(none[0], 0x7f);
        let Ok(Operation::DataIn(pages)) = decode(&cdb(&[0x12, 1, 0, 0, 255, 0]), true, &g) else { panic!() };
        assert_eq!(&pages[4..], &[0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]);
        for page in [0x80u8, 0x83, 0xb0, 0xb1, 0xb2] {
            let Ok(Operation::DataIn(d)) = decode(&cdb(&[0x12, 1, page, 1, 0, 0]), true, &g) else { panic!() };
            assert_eq!(d[1], page);
            assert_eq!(usize::from(u16::from_be_bytes([d[2], d[3]])) + 4, d.len(), "page {page:#x}");
        }
        let Ok(Operation::DataIn(id)) = decode(&cdb(&[0x12, 1, 0x83, 1, 0, 0]), true, &g) else { panic!() };
        assert_eq!(&id[8..16], &g.naa.to_be_bytes());
        let Ok(Operation::DataIn(bl)) = decode(&cdb(&[0x12, 1, 0xb0, 0, 255, 0]), true, &g) else { panic!() };
        assert_eq!(u16::from_be_bytes([bl[6], bl[7]]), 32, "optimal granularity: 16K in 512-byte blocks");
        assert_eq!(decode(&cdb(&[0x12, 0, 0x80, 0, 255, 0]), true, &g), Err(Sense::INVALID_FIELD_IN_CDB));
        assert_eq!(decode(&cdb(&[0x12, 1, 0x55, 0, 255, 0]), true, &g), Err(Sense::INVALID_FIELD_IN_CDB));
    }

    #[test]
    fn capacity_luns_and_sense() {
        let g = geometry();
        let Ok(Operation::DataIn(c10)) = decode(&cdb(&[0x25]), true, &g) else { panic!() };
        assert_eq!(c10, [0, 0, 0x07, 0xff, 0, 0, 2, 0]);
        let Ok(Operation::DataIn(c16)) = decode(&cdb(&[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0]), true, &g) else {
            panic!()
        };
        assert_eq!(u64::from_be_bytes(c16[0..8].try_into().unwrap()), 2047);
        assert_eq!(c16[13], 0, "512-byte physical blocks");
        assert_eq!(c16[14] & 0xc0, 0xc0, "LBPME and LBPRZ");
        let Ok(Operation::DataIn(luns)) = decode(&cdb(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0]), true, &g) else { panic!() };
        assert_eq!(luns, [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decode(&cdb(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0]), true, &g), Err(Sense::INVALID_FIELD_IN_CDB));
        let s = Sense::LBA_OUT_OF_RANGE.fixed();
        assert_eq!((s[0], s[2], s[7], s[12], s[13]), (0x70, 5, 10, 0x21, 0));
    }

    #[test]
    fn supported_operation_codes_are_reported() {
        let g = geometry();
        let Ok(Operation::DataIn(all)) = decode(&cdb(&[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0]), true, &g) else { panic!() };
        let length = u32::from_be_bytes(all[0..4].try_into().unwrap()) as usize;
        assert_eq!(length, SUPPORTED_COMMANDS.len() * 8);
        assert!(all[4..].chunks(8).any(|d| d[0] == 0x28 && u16::from_be_bytes([d[6], d[7]]) == 10));
        assert!(all[4..].chunks(8).any(|d| d[0] == 0x9e && d[5] & 0x01 != 0 && d[3] == 0x10));
        let Ok(Operation::DataIn(one)) = decode(&cdb(&[0xa3, 0x0c, 0x01, 0x2a, 0, 0, 0, 0, 1, 0, 0, 0]), true, &g) else { panic!() };
        assert_eq!(one[1] & 0x07, 0x03);
        assert_eq!(&one[4..6], &[0x2a, 0x18], "WRITE 10 takes DPO and FUA");
        let Ok(Operation::DataIn(none)) = decode(&cdb(&[0xa3, 0x0c, 0x01, 0x04, 0, 0, 0, 0, 1, 0, 0, 0]), true, &g) else { panic!() };
        assert_eq!(none[1] & 0x07, 0x01, "FORMAT UNIT is not supported");
        let Ok(Operation::DataIn(unmap)) = decode(&cdb(&[0xa3, 0x0c, 0x01, 0x42, 0, 0, 0, 0, 1, 0, 0, 0]), true, &g) else { panic!() };
        assert_eq!(unmap[1] & 0x07, 0x03, "UNMAP is supported");
        let by_opcode_only = decode(&cdb(&[0xa3, 0x0c, 0x01, 0x9e, 0, 0, 0, 0, 1, 0, 0, 0]), true, &g);
        assert_eq!(by_opcode_only, Err(Sense::INVALID_FIELD_IN_CDB.at_cdb_byte(3)));
        let sense = Sense::INVALID_FIELD_IN_CDB.at_cdb_byte(3).fixed();
        assert_eq!(&sense[15..18], &[0xc0, 0, 3], "SKSV, C/D: the field pointer names CDB byte 3");
        let Ok(Operation::DataIn(sa)) = decode(&cdb(&[0xa3, 0x0c, 0x02, 0x9e, 0, 0x10, 0, 0, 1, 0, 0, 0]), true, &g) else { panic!() };
        assert_eq!(sa[1] & 0x07, 0x03);
        // every supported command decodes to something other than INVALID OPCODE
        for &(op, service) in SUPPORTED_COMMANDS {
            let mut c = cdb(&[op]);
            if let Some(sa) = service {
                c[1] = sa as u8;
            }
            assert_ne!(decode(&c, true, &g), Err(Sense::INVALID_OPCODE), "opcode {op:#x}");
        }
    }

    #[test]
    fn mode_sense_and_select_carry_wce() {
        let g = geometry();
        let current = mode_sense(&g, true, false, false, false, 0, 0x08, 0, 255).unwrap();
        assert_eq!(usize::from(current[0]) + 1, current.len());
        assert_eq!(current[3], 8);
        assert_eq!(current[4 + 8] & 0x3f, 0x08);
        assert_eq!(current[4 + 8 + 2] & 0x04, 0x04);
        let all = mode_sense(&g, false, true, true, false, 0, 0x3f, 0, 1024).unwrap();
        assert_eq!(all.len(), 8 + 20 + 12);
        let changeable = mode_sense(&g, false, false, true, false, 1, 0x08, 0, 255).unwrap();
        assert_eq!(changeable[4 + 2], 0x04);
        assert_eq!(mode_sense(&g, false, false, true, false, 0, 0x19, 0, 255), Err(Sense::INVALID_FIELD_IN_CDB));
        // MODE SELECT 6 turning WCE on
        let mut params = vec![0u8, 0, 0, 0];
        let mut page = caching_page(true);
        page[0] &= 0x3f;
        params.extend(&page);
        assert_eq!(mode_select(&params, false, false), Ok(Some(true)));
        // a change outside WCE is refused
        let mut bad = params.clone();
        bad[4 + 3] = 0x01;
        assert_eq!(mode_select(&bad, false, false), Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
        assert_eq!(mode_select(&params[..10], false, false), Err(Sense::PARAMETER_LIST_LENGTH_ERROR));
        assert_eq!(mode_select(&[], false, false), Ok(None));
    }
}
