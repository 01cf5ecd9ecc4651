//! sense: what every SCSI module shares, at the bottom: the unit's description
//! ([`Geometry`]), the logical block size, status codes and sense data ([`Sense`],
//! fixed format, with the field pointer of an INVALID FIELD).

/// Bytes of a logical block.
pub const LOGICAL_BLOCK_BYTES: u32 = 512;

pub const STATUS_GOOD: u8 = 0x00;
pub const STATUS_CHECK_CONDITION: u8 = 0x02;

/// What the unit is, as the SCSI answers describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Logical blocks of the volume.
    pub blocks: u64,
    /// The volume's block size (volblocksize).
    pub volume_block_bytes: u32,
    pub read_only: bool,
    /// A sparse volume (no refreservation): reported thin provisioned.
    pub thin: bool,
    /// Largest READ/WRITE in bytes.
    pub transfer_max_bytes: u32,
    /// 8-byte NAA identifier (type 3, locally assigned).
    pub naa: u64,
    /// Unit serial number (VPD 0x80), ASCII.
    pub serial: String,
    /// The iSCSI target name (SCSI name string designator).
    pub target_name: String,
}

/// A CHECK CONDITION's sense key and additional sense code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// The field in error (sense-key specific): in the CDB (else the parameter list),
    /// its byte and bit.
    pub field: Option<FieldPointer>,
}

/// Where an INVALID FIELD lies (SPC-4 §4.5.2.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    pub in_cdb: bool,
    pub byte: u16,
    pub bit: Option<u8>,
}

impl Sense {
    pub const INVALID_OPCODE: Sense = Sense { key: 0x05, asc: 0x20, ascq: 0x00, field: None };
    pub const LBA_OUT_OF_RANGE: Sense = Sense { key: 0x05, asc: 0x21, ascq: 0x00, field: None };
    pub const INVALID_FIELD_IN_CDB: Sense = Sense { key: 0x05, asc: 0x24, ascq: 0x00, field: None };
    pub const LUN_NOT_SUPPORTED: Sense = Sense { key: 0x05, asc: 0x25, ascq: 0x00, field: None };
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Sense = Sense { key: 0x05, asc: 0x26, ascq: 0x00, field: None };
    pub const PARAMETER_LIST_LENGTH_ERROR: Sense = Sense { key: 0x05, asc: 0x1a, ascq: 0x00, field: None };
    pub const WRITE_PROTECTED: Sense = Sense { key: 0x07, asc: 0x27, ascq: 0x00, field: None };
    pub const UNRECOVERED_READ_ERROR: Sense = Sense { key: 0x03, asc: 0x11, ascq: 0x00, field: None };
    pub const WRITE_ERROR: Sense = Sense { key: 0x03, asc: 0x0c, ascq: 0x00, field: None };
    pub const NO_SPACE: Sense = Sense { key: 0x07, asc: 0x27, ascq: 0x07, field: None };
    pub const DATA_PHASE_ERROR: Sense = Sense { key: 0x0b, asc: 0x4b, ascq: 0x00, field: None };
    pub const INTERNAL_FAILURE: Sense = Sense { key: 0x04, asc: 0x44, ascq: 0x00, field: None };
    pub const SAVING_NOT_SUPPORTED: Sense = Sense { key: 0x05, asc: 0x39, ascq: 0x00, field: None };
    pub const MISCOMPARE: Sense = Sense { key: 0x0e, asc: 0x1d, ascq: 0x00, field: None };

    /// Fixed-format sense data with the INFORMATION field set (VALID).
    pub fn fixed_with_information(&self, information: u32) -> [u8; 18] {
        let mut s = self.fixed();
        s[0] |= 0x80;
        s[3..7].copy_from_slice(&information.to_be_bytes());
        s
    }

    /// Fixed-format sense data (18 bytes).
    pub fn fixed(&self) -> [u8; 18] {
        let mut s = [0u8; 18];
        s[0] = 0x70;
        s[2] = self.key & 0x0f;
        s[7] = 10;
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some(f) = self.field {
            s[15] = 0x80 | if f.in_cdb { 0x40 } else { 0 } | f.bit.map_or(0, |bit| 0x08 | (bit & 0x07));
            s[16..18].copy_from_slice(&f.byte.to_be_bytes());
        }
        s
    }

    /// This sense naming the CDB byte in error.
    pub const fn at_cdb_byte(self, byte: u16) -> Sense {
        Sense { field: Some(FieldPointer { in_cdb: true, byte, bit: None }), ..self }
    }
}

