//! pdu: the iSCSI wire format (RFC 7143 §11): the 48-byte basic header segment (BHS),
//! additional header segments, the data segment padded to 4 bytes, the optional
//! CRC32C digests, and the text key=value format of Login and Text PDUs.
//!
//! Theory of operation
//! -------------------
//! Everything here is pure: [`parse_frame`] looks at bytes already read and says how
//! long the PDU is (or that it is malformed, or that more bytes are needed); the
//! connection's reader ([`crate::framing`]) owns the socket. Header fields are read and
//! written through [`Bhs`] accessors by byte offset, as the RFC draws them. Lengths
//! come from the peer, so each is checked against the negotiated limit before any
//! buffer is sized from it; nothing here panics on any input (fuzzed in
//! `tests/parsers.rs`).

/// Bytes of the basic header segment.
pub const BHS_BYTES: usize = 48;
/// Largest data segment length field (24 bits).
pub const DATA_SEGMENT_FIELD_MAX: usize = (1 << 24) - 1;
/// The reserved "no task tag" value.
pub const NO_TAG: u32 = 0xffff_ffff;

/// Initiator opcodes.
pub mod op {
    pub const NOP_OUT: u8 = 0x00;
    pub const SCSI_COMMAND: u8 = 0x01;
    pub const TASK_MANAGEMENT: u8 = 0x02;
    pub const LOGIN: u8 = 0x03;
    pub const TEXT: u8 = 0x04;
    pub const DATA_OUT: u8 = 0x05;
    pub const LOGOUT: u8 = 0x06;
    pub const SNACK: u8 = 0x10;
    // target opcodes
    pub const NOP_IN: u8 = 0x20;
    pub const SCSI_RESPONSE: u8 = 0x21;
    pub const TASK_MANAGEMENT_RESPONSE: u8 = 0x22;
    pub const LOGIN_RESPONSE: u8 = 0x23;
    pub const TEXT_RESPONSE: u8 = 0x24;
    pub const DATA_IN: u8 = 0x25;
    pub const LOGOUT_RESPONSE: u8 = 0x26;
    pub const R2T: u8 = 0x31;
    pub const REJECT: u8 = 0x3f;
}

/// Reject reasons (RFC 7143 §11.17.1).
pub mod reject {
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
}

/// A basic header segment.
#[derive(Clone, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_BYTES]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bhs(opcode {:#04x}, itt {:#x}, {} data bytes)", self.opcode(), self.itt(), self.data_segment_bytes())
    }
}

impl Default for Bhs {
    fn default() -> Bhs {
        Bhs([0; BHS_BYTES])
    }
}

impl Bhs {
    /// A header with `opcode` (a target opcode) and the F bit set when `final_bit`.
    pub fn new(opcode: u8, final_bit: bool) -> Bhs {
        let mut b = Bhs::default();
        b.0[0] = opcode & 0x3f;
        if final_bit {
            b.0[1] = 0x80;
        }
        b
    }
    pub fn opcode(&self) -> u8 {
        self.0[0] & 0x3f
    }
    /// The I bit: an immediate command (does not advance CmdSN).
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }
    pub fn total_ahs_bytes(&self) -> usize {
        usize::from(self.0[4]) * 4
    }
    pub fn data_segment_bytes(&self) -> usize {
        (usize::from(self.0[5]) << 16) | (usize::from(self.0[6]) << 8) | usize::from(self.0[7])
    }
    pub fn set_data_segment_bytes(&mut self, len: usize) {
        let len = len.min(DATA_SEGMENT_FIELD_MAX);
        self.0[5] = (len >> 16) as u8;
        self.0[6] = (len >> 8) as u8;
        self.0[7] = len as u8;
    }
    pub fn lun(&self) -> [u8; 8] {
        let mut l = [0; 8];
        l.copy_from_slice(&self.0[8..16]);
        l
    }
    pub fn set_lun(&mut self, lun: [u8; 8]) {
        self.0[8..16].copy_from_slice(&lun);
    }
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }
    pub fn u32_at(&self, at: usize) -> u32 {
        match self.0.get(at..at + 4) {
            Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            None => 0,
        }
    }
    pub fn set_u32(&mut self, at: usize, value: u32) {
        if let Some(b) = self.0.get_mut(at..at + 4) {
            b.copy_from_slice(&value.to_be_bytes());
        }
    }
    pub fn u16_at(&self, at: usize) -> u16 {
        match self.0.get(at..at + 2) {
            Some(b) => u16::from_be_bytes([b[0], b[1]]),
            None => 0,
        }
    }
    pub fn set_u16(&mut self, at: usize, value: u16) {
        if let Some(b) = self.0.get_mut(at..at + 2) {
            b.copy_from_slice(&value.to_be_bytes());
        }
    }
    /// The 16-byte CDB of a SCSI Command PDU.
    pub fn cdb(&self) -> &[u8] {
        &self.0[32..48]
    }
}

/// Bytes `len` takes on the wire once padded to a multiple of 4.
pub fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// Digests in force on a connection (off during login).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// Where the parts of one PDU lie in a buffer that starts with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    pub ahs_bytes: usize,
    pub data_bytes: usize,
    /// Offset of the data segment.
    pub data_at: usize,
    /// Bytes of the whole PDU (digests and padding included).
    pub total_bytes: usize,
}

/// Why bytes are not a PDU we accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The data segment is longer than we declared we receive.
    DataSegmentTooLong { bytes: usize, max: usize },
    HeaderDigest { expected: u32, got: u32 },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::DataSegmentTooLong { bytes, max } => {
                write!(f, "data segment of {bytes} bytes is longer than MaxRecvDataSegmentLength {max}")
            }
            FrameError::HeaderDigest { expected, got } => write!(f, "header digest {got:#010x}, expected {expected:#010x}"),
        }
    }
}

/// The layout of the PDU at the start of `bytes`: `Ok(None)` when fewer than 48 bytes
/// are there, an error when it is one we refuse (a data segment above
/// `data_segment_max`, a wrong header digest once the whole header is there).
pub fn parse_frame(bytes: &[u8], digests: Digests, data_segment_max: usize) -> Result<Option<FrameLayout>, FrameError> {
    let Some(head) = bytes.get(..BHS_BYTES) else { return Ok(None) };
    let mut bhs = Bhs::default();
    bhs.0.copy_from_slice(head);
    let ahs_bytes = bhs.total_ahs_bytes();
    let data_bytes = bhs.data_segment_bytes();
    if data_bytes > data_segment_max {
        return Err(FrameError::DataSegmentTooLong { bytes: data_bytes, max: data_segment_max });
    }
    let header_end = BHS_BYTES + ahs_bytes;
    let data_at = header_end + if digests.header { 4 } else { 0 };
    let data_digest = if digests.data && data_bytes > 0 { 4 } else { 0 };
    let total_bytes = data_at + padded(data_bytes) + data_digest;
    if digests.header {
        if let Some(d) = bytes.get(header_end..header_end + 4) {
            let got = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
            let expected = crc32c(&bytes[..header_end]);
            if got != expected {
                return Err(FrameError::HeaderDigest { expected, got });
            }
        }
    }
    Ok(Some(FrameLayout { ahs_bytes, data_bytes, data_at, total_bytes }))
}

/// Does the data digest of a complete PDU `bytes` with `layout` match? (True when
/// data digests are off or there is no data.)
pub fn data_digest_ok(bytes: &[u8], layout: &FrameLayout, digests: Digests) -> bool {
    if !digests.data || layout.data_bytes == 0 {
        return true;
    }
    let end = layout.data_at + padded(layout.data_bytes);
    match (bytes.get(layout.data_at..end), bytes.get(end..end + 4)) {
        (Some(data), Some(d)) => crc32c(data) == u32::from_le_bytes([d[0], d[1], d[2], d[3]]),
        _ => false,
    }
}

/// One PDU received: header, AHS and data segment (padding and digests stripped).
#[derive(Debug, Clone, Default)]
pub struct Pdu {
    pub bhs: Bhs,
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

/// CRC32C (Castagnoli), as iSCSI digests use it; the digest goes on the wire
/// little-endian (RFC 7143 §13.1 and its examples).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c_append(0, bytes)
}

/// Continue a CRC32C over more bytes (`crc` is a previous result).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    const TABLE: [[u32; 256]; 8] = crc32c_tables();
    let mut c = !crc;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let lo = c ^ u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let hi = u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
        c = TABLE[7][(lo & 0xff) as usize]
            ^ TABLE[6][((lo >> 8) & 0xff) as usize]
            ^ TABLE[5][((lo >> 16) & 0xff) as usize]
            ^ TABLE[4][(lo >> 24) as usize]
            ^ TABLE[3][(hi & 0xff) as usize]
            ^ TABLE[2][((hi >> 8) & 0xff) as usize]
            ^ TABLE[1][((hi >> 16) & 0xff) as usize]
            ^ TABLE[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        c = TABLE[0][((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// Slicing-by-8 tables of the reflected Castagnoli polynomial.
const fn crc32c_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0x82f6_3b78 } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut k = 1;
        while k < 8 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            k += 1;
        }
        i += 1;
    }
    t
}

/// Text keys of a Login or Text PDU: `key=value` strings each ended by a NUL. A key
/// without '=' or with an empty key is kept with an empty name so the caller can
/// refuse it; the order is kept.
pub fn parse_text(data: &[u8]) -> Vec<(String, String)> {
    data.split(|&b| b == 0)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let text = String::from_utf8_lossy(pair);
            match text.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (String::new(), text.into_owned()),
            }
        })
        .collect()
}

/// Encode key=value pairs, each NUL-terminated.
pub fn encode_text(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Serial number arithmetic (RFC 1982, 32 bits): is `a` before `b`?
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}

/// `a <= b` in serial arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_known_vectors() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        // RFC 7143 B.4: 32 bytes of zeros, of 0xff
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let inc: Vec<u8> = (0..32u8).collect();
        assert_eq!(crc32c(&inc), 0x46dd_794e);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
    }

    #[test]
    fn frames_are_measured_and_bounded() {
        let mut b = Bhs::new(op::SCSI_COMMAND, true);
        b.0[4] = 1; // 4 AHS bytes
        b.set_data_segment_bytes(5);
        let mut bytes = b.0.to_vec();
        bytes.extend_from_slice(&[1, 2, 3, 4]); // the AHS
        let layout = parse_frame(&bytes, Digests::default(), 8192).unwrap().unwrap();
        assert_eq!(layout, FrameLayout { ahs_bytes: 4, data_bytes: 5, data_at: 52, total_bytes: 60 });
        let with = parse_frame(&bytes, Digests { header: false, data: true }, 8192).unwrap().unwrap();
        assert_eq!(with.total_bytes, 64);
        assert!(matches!(parse_frame(&bytes, Digests::default(), 4), Err(FrameError::DataSegmentTooLong { .. })));
        assert_eq!(parse_frame(&bytes[..47], Digests::default(), 8192), Ok(None));
        // header digest: right, then wrong
        let digest = crc32c(&bytes[..52]);
        bytes.extend_from_slice(&digest.to_le_bytes());
        let d = Digests { header: true, data: false };
        assert_eq!(parse_frame(&bytes, d, 8192).unwrap().unwrap().data_at, 56);
        bytes[10] ^= 1;
        assert!(matches!(parse_frame(&bytes, d, 8192), Err(FrameError::HeaderDigest { .. })));
    }

    #[test]
    fn header_fields_round_trip() {
        let mut b = Bhs::new(op::DATA_IN, true);
        b.set_data_segment_bytes(0x12_3456);
        b.set_u32(16, 0xdead_beef);
        assert_eq!(b.opcode(), op::DATA_IN);
        assert!(b.final_bit());
        assert_eq!(b.data_segment_bytes(), 0x12_3456);
        assert_eq!(b.itt(), 0xdead_beef);
        b.set_data_segment_bytes(usize::MAX);
        assert_eq!(b.data_segment_bytes(), DATA_SEGMENT_FIELD_MAX);
    }

    #[test]
    fn text_keys_parse_and_encode() {
        let keys = parse_text(b"InitiatorName=iqn.x\0SessionType=Normal\0junk\0\0");
        assert_eq!(keys[0], ("InitiatorName".into(), "iqn.x".into()));
        assert_eq!(keys[1], ("SessionType".into(), "Normal".into()));
        assert_eq!(keys[2], ("".into(), "junk".into()));
        assert_eq!(keys.len(), 3);
        assert_eq!(encode_text(&keys[..1]), b"InitiatorName=iqn.x\0");
    }

    #[test]
    fn serial_numbers_wrap() {
        assert!(sn_lt(0xffff_fffe, 1));
        assert!(!sn_lt(1, 0xffff_fffe));
        assert!(sn_le(5, 5));
        assert!(!sn_lt(5, 5));
    }
}
