//! label: the four labels of every leaf, the pool config and the uberblock ring.
//!
//! Theory of operation
//! -------------------
//! Every leaf carries four 256 KiB labels, two at each end, so a damaged start or end of a
//! device leaves copies elsewhere (vdev_label.c):
//!
//! ```text
//!  0        256K       512K                                end-512K   end-256K    end
//!  | L0     | L1       | data area (allocatable) ...        | L2       | L3       |
//!  (end = device size aligned down to 256 KiB)
//!
//!  one label:
//!  0                                   128K                                   256K
//!  | config header + JSON config ... trailer | uberblock ring: 32 slots x 4 KiB |
//! ```
//!
//! The config region and each uberblock slot carry an *embedded checksum* whose verifier
//! is the block's own byte offset on the device: the 40-byte trailer `{magic u64,
//! checksum [u8;32]}` is computed with the verifier in the checksum slot, so a block read
//! from the wrong place (misdirected write, a stale copy at another offset) fails.
//!
//! Commit protocol (spa_sync): data flushed → uberblock for txg T written to slot
//! `T % 32` of all four labels of every leaf → flush. Config changes rewrite the config
//! regions: even labels (L0, L2), flush, odd labels (L1, L3), flush, so a crash leaves at
//! least one intact pair. Import reads every slot of every label of every leaf and takes
//! the valid uberblock with the highest txg.

use std::io;

use crate::block::blkptr::BlockPointer;
use crate::block::checksum::fletcher4;
use crate::{Guid, Txg};

pub const LABEL_SIZE: u64 = 256 << 10;
pub const LABELS: usize = 4;
pub const CONFIG_REGION_SIZE: usize = 128 << 10;
pub const UB_SLOT_SIZE: usize = 4096;
pub const UB_SLOTS: u64 = 32;
/// First byte of the data area on every leaf.
pub const DATA_START: u64 = 2 * LABEL_SIZE;

pub const LABEL_MAGIC: u64 = 0x5a494c4c_414c424c; // "ZILLALBL"
pub const UB_MAGIC: u64 = 0x00bab10c;
pub const TRAILER_MAGIC: u64 = 0x0210da7ab10c7a11;
pub const FORMAT_VERSION: u64 = 1;
const TRAILER_SIZE: usize = 40;
const CONFIG_HEADER_SIZE: usize = 32;

/// Size aligned down to a label boundary.
fn aligned_size(dev_size: u64) -> u64 {
    dev_size / LABEL_SIZE * LABEL_SIZE
}

/// End of the data area (exclusive) for a device of `dev_size` bytes.
pub fn usable_end(dev_size: u64) -> u64 {
    aligned_size(dev_size).saturating_sub(2 * LABEL_SIZE)
}

/// Smallest device we accept: labels plus 8 MiB of data.
pub const MIN_DEVICE_SIZE: u64 = 4 * LABEL_SIZE + (8 << 20);

pub fn label_offset(dev_size: u64, l: usize) -> u64 {
    let end = aligned_size(dev_size);
    match l {
        0 => 0,
        1 => LABEL_SIZE,
        2 => end - 2 * LABEL_SIZE,
        _ => end - LABEL_SIZE,
    }
}

pub fn ub_offset(dev_size: u64, l: usize, txg: Txg) -> u64 {
    label_offset(dev_size, l) + CONFIG_REGION_SIZE as u64 + (txg.get() % UB_SLOTS) * UB_SLOT_SIZE as u64
}

/// Seal `block` with an embedded checksum whose verifier is `offset`.
pub fn seal(block: &mut [u8], offset: u64) {
    let n = block.len();
    assert!(n > TRAILER_SIZE && n % 4 == 0);
    block[n - 40..n - 32].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
    let ck = &mut block[n - 32..];
    ck.fill(0);
    ck[..8].copy_from_slice(&offset.to_le_bytes());
    let f = fletcher4(block);
    for (i, w) in f.iter().enumerate() {
        block[n - 32 + i * 8..n - 24 + i * 8].copy_from_slice(&w.to_le_bytes());
    }
}

/// Check a sealed block read from `offset`.
pub fn verify_sealed(block: &[u8], offset: u64) -> bool {
    let n = block.len();
    if n <= TRAILER_SIZE || n % 4 != 0 {
        return false;
    }
    if block[n - 40..n - 32] != TRAILER_MAGIC.to_le_bytes() {
        return false;
    }
    let mut copy = block.to_vec();
    let stored: Vec<u8> = block[n - 32..].to_vec();
    let ck = &mut copy[n - 32..];
    ck.fill(0);
    ck[..8].copy_from_slice(&offset.to_le_bytes());
    let f = fletcher4(&copy);
    let mut computed = [0u8; 32];
    for (i, w) in f.iter().enumerate() {
        computed[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    computed[..] == stored[..]
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uberblock {
    pub txg: Txg,
    pub guid_sum: u64,
    pub timestamp_ns: u64,
    pub pool_guid: Guid,
    /// Root of the object directory (MOS) for this txg.
    pub root: BlockPointer,
}

impl Uberblock {
    pub fn encode(&self, offset: u64) -> Vec<u8> {
        let mut b = vec![0u8; UB_SLOT_SIZE];
        b[0..8].copy_from_slice(&UB_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.txg.get().to_le_bytes());
        b[24..32].copy_from_slice(&self.guid_sum.to_le_bytes());
        b[32..40].copy_from_slice(&self.timestamp_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.pool_guid.get().to_le_bytes());
        b[48..48 + BlockPointer::SIZE].copy_from_slice(&self.root.encode());
        seal(&mut b, offset);
        b
    }
    pub fn decode(b: &[u8], offset: u64) -> Option<Uberblock> {
        if b.len() != UB_SLOT_SIZE || !verify_sealed(b, offset) {
            return None;
        }
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u(0) != UB_MAGIC || u(8) != FORMAT_VERSION {
            return None;
        }
        Some(Uberblock {
            txg: Txg(u(16)),
            guid_sum: u(24),
            timestamp_ns: u(32),
            pool_guid: Guid(u(40)),
            root: BlockPointer::decode(&b[48..48 + BlockPointer::SIZE])?,
        })
    }
}

/// Encode a config region: header + JSON, sealed with the region's offset.
pub fn encode_config(json: &[u8], config_txg: Txg, offset: u64) -> io::Result<Vec<u8>> {
    if json.len() > CONFIG_REGION_SIZE - CONFIG_HEADER_SIZE - TRAILER_SIZE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "pool config too large for label"));
    }
    let mut b = vec![0u8; CONFIG_REGION_SIZE];
    b[0..8].copy_from_slice(&LABEL_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&config_txg.get().to_le_bytes());
    b[24..28].copy_from_slice(&(json.len() as u32).to_le_bytes());
    b[CONFIG_HEADER_SIZE..CONFIG_HEADER_SIZE + json.len()].copy_from_slice(json);
    seal(&mut b, offset);
    Ok(b)
}

/// Decode a config region: (config_txg, json bytes).
pub fn decode_config(b: &[u8], offset: u64) -> Option<(Txg, Vec<u8>)> {
    if b.len() != CONFIG_REGION_SIZE || !verify_sealed(b, offset) {
        return None;
    }
    let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    if u(0) != LABEL_MAGIC || u(8) != FORMAT_VERSION {
        return None;
    }
    let len = u32::from_le_bytes(b[24..28].try_into().unwrap()) as usize;
    if len > CONFIG_REGION_SIZE - CONFIG_HEADER_SIZE - TRAILER_SIZE {
        return None;
    }
    Some((Txg(u(16)), b[CONFIG_HEADER_SIZE..CONFIG_HEADER_SIZE + len].to_vec()))
}

/// What one leaf's labels hold.
#[derive(Debug, Clone)]
pub struct LabelScan {
    /// Highest-txg valid config: (config_txg, json).
    pub config: Option<(Txg, Vec<u8>)>,
    pub valid_configs: usize,
    pub uberblocks: Vec<Uberblock>,
    pub bad_labels: usize,
}

/// Read all four labels of a device (not through the queue: import time only).
pub fn scan_labels(dev: &dyn super::Device) -> io::Result<LabelScan> {
    let size = dev.size();
    if size < MIN_DEVICE_SIZE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("device too small ({size} bytes)")));
    }
    let mut out = LabelScan { config: None, valid_configs: 0, uberblocks: Vec::new(), bad_labels: 0 };
    for l in 0..LABELS {
        let off = label_offset(size, l);
        let mut buf = vec![0u8; LABEL_SIZE as usize];
        if dev.read_at(&mut buf, off).is_err() {
            out.bad_labels += 1;
            continue;
        }
        match decode_config(&buf[..CONFIG_REGION_SIZE], off) {
            Some((txg, json)) => {
                out.valid_configs += 1;
                if out.config.as_ref().map_or(true, |(t, _)| txg > *t) {
                    out.config = Some((txg, json));
                }
            }
            None => out.bad_labels += 1,
        }
        for s in 0..UB_SLOTS as usize {
            let so = CONFIG_REGION_SIZE + s * UB_SLOT_SIZE;
            if let Some(ub) = Uberblock::decode(&buf[so..so + UB_SLOT_SIZE], off + so as u64) {
                out.uberblocks.push(ub);
            }
        }
    }
    Ok(out)
}

/// Wipe all four labels (pool destroy, or `create -f` over an old pool).
pub fn wipe_labels(dev: &dyn super::Device) -> io::Result<()> {
    let size = dev.size();
    let zeros = vec![0u8; LABEL_SIZE as usize];
    for l in 0..LABELS {
        dev.write_at(&zeros, label_offset(size, l))?;
    }
    dev.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sealed_roundtrip_and_verifier() {
        let mut b = vec![7u8; 4096];
        seal(&mut b, 8192);
        assert!(verify_sealed(&b, 8192));
        assert!(!verify_sealed(&b, 4096), "a block read from another offset must fail");
        b[100] ^= 1;
        assert!(!verify_sealed(&b, 8192));
    }
    #[test]
    fn config_roundtrip() {
        let b = encode_config(b"{\"a\":1}", Txg(9), 0).unwrap();
        assert_eq!(decode_config(&b, 0), Some((Txg(9), b"{\"a\":1}".to_vec())));
        assert_eq!(decode_config(&b, LABEL_SIZE), None);
    }
}
