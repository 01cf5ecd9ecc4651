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
//!  | config header + JSON config ... trailer | uberblock slots: 128 KiB        |
//!
//!  uberblock slots (slot size = 1 << max(ashift, 12): 32 x 4 KiB, or 16 x 8 KiB):
//!  | ring slot 0 | ring slot 1 | ... | ring slot n-2 | heartbeat slot (n-1) |
//! ```
//!
//! The slot size follows the top-level vdev's ashift, so an uberblock write never shares
//! a physical sector with another slot (a torn read-modify-write cannot take a neighbour
//! with it). Txg `T` goes to ring slot `T % (n - 1)`; the last slot is the multihost
//! heartbeat: the newest uberblock rewritten with a sequence number every interval while
//! the pool is imported with `multihost=on` (OpenZFS MMP). A heartbeat carries the
//! `HEARTBEAT_MAGIC` block at byte 1024 of the slot, so import tells it from a ring
//! uberblock (pools written before the heartbeat existed used all 32 slots as the ring;
//! their slot 31 still decodes as a ring uberblock).
//!
//! The config region and each uberblock slot carry an *embedded checksum* whose verifier
//! is the block's own byte offset on the device: the 40-byte trailer `{magic u64,
//! checksum [u8;32]}` is computed with the verifier in the checksum slot, so a block read
//! from the wrong place (misdirected write, a stale copy at another offset) fails.
//!
//! Untrusted bytes: a slot that verifies is still checked field by field
//! (`Uberblock::decode_checked`: version, txg below 2^63, timestamp, pool guid, the
//! MOS pointer's every field, a heartbeat's interval); one out of range makes the slot
//! no import candidate, and the reason, naming the field and value, is kept
//! (`LabelScan::rejected`) for import to report. The config JSON is checked by
//! `spa::parse_label` against the limits of docs/on-disk-format.md §2.1.
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
/// Uberblock slot size at ashift 12 (the smallest slot).
pub const UB_SLOT_SIZE: usize = 4096;
/// Slots per label at ashift 12.
pub const UB_SLOTS: u64 = 32;
/// Bytes of each label holding uberblock slots.
pub const UB_REGION_SIZE: usize = LABEL_SIZE as usize - CONFIG_REGION_SIZE;
/// Largest ashift the label layout supports (two 64 KiB slots would leave a 1-slot ring).
pub const MAX_ASHIFT: u8 = 13;
pub const MIN_ASHIFT: u8 = 12;
pub const HEARTBEAT_MAGIC: u64 = 0x4d4d_5048_4541_5254; // "MMPHEART"
const HEARTBEAT_AT: usize = 1024;
/// Largest heartbeat interval a label may record (the `zfs_multihost_interval_ms`
/// tunable's maximum): import waits two of them, so a larger one would hang it.
pub const HEARTBEAT_INTERVAL_MAX_MS: u32 = 60_000;
/// Uberblock timestamps are below 2^63 ns (the year 2262): a larger one is corrupt.
pub const TIMESTAMP_LIMIT_NS: u64 = 1 << 63;
/// First byte of the data area on every leaf.
pub const DATA_START: u64 = 2 * LABEL_SIZE;

pub const LABEL_MAGIC: u64 = 0x5a494c4c_414c424c; // "ZILLALBL"
pub const UB_MAGIC: u64 = 0x00bab10c;
pub const TRAILER_MAGIC: u64 = 0x0210da7ab10c7a11;
pub const FORMAT_VERSION: u64 = 1;
/// An uberblock's version (§2.2, §9): 1 points at a MOS index, 2 at a MOS objset.
pub const UB_VERSION_MOS_INDEX: u64 = 1;
pub const UB_VERSION_OBJSET: u64 = 2;
/// The size of the objset block a version 2 uberblock points at (objset.rs checks it
/// is its `OBJSET_BYTES`).
pub const UB_OBJSET_BYTES: u32 = 4096;
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

/// Uberblock slot size for a vdev of `ashift`.
pub fn ub_slot_size(ashift: u8) -> usize {
    1usize << ashift.clamp(MIN_ASHIFT, MAX_ASHIFT)
}

/// Ring slots per label for `ashift` (all slots but the heartbeat slot).
pub fn ub_ring_slots(ashift: u8) -> u64 {
    (UB_REGION_SIZE / ub_slot_size(ashift)) as u64 - 1
}

/// Where txg `txg`'s uberblock goes in label `l`, at ashift 12.
pub fn ub_offset(dev_size: u64, l: usize, txg: Txg) -> u64 {
    ub_offset_at(dev_size, l, txg, MIN_ASHIFT)
}

/// Where txg `txg`'s uberblock goes in label `l` of a vdev of `ashift`.
pub fn ub_offset_at(dev_size: u64, l: usize, txg: Txg, ashift: u8) -> u64 {
    let slot = ub_slot_size(ashift) as u64;
    label_offset(dev_size, l) + CONFIG_REGION_SIZE as u64 + (txg.get() % ub_ring_slots(ashift)) * slot
}

/// The heartbeat slot of label `l` of a vdev of `ashift`.
pub fn heartbeat_offset(dev_size: u64, l: usize, ashift: u8) -> u64 {
    let slot = ub_slot_size(ashift) as u64;
    label_offset(dev_size, l) + CONFIG_REGION_SIZE as u64 + ub_ring_slots(ashift) * slot
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
    /// Set in the heartbeat slot only (multihost): who is writing it and how often.
    pub heartbeat: Option<Heartbeat>,
}

/// The multihost heartbeat fields (bytes 1024..1048 of a heartbeat slot):
/// `{magic u64, seq u64, hostid u32, interval_ms u32}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Incremented at every heartbeat write of this import.
    pub seq: u64,
    pub hostid: u32,
    pub interval_ms: u32,
}

impl Uberblock {
    /// Encode into a 4 KiB slot (ashift 12).
    pub fn encode(&self, offset: u64) -> Vec<u8> {
        self.encode_slot(offset, UB_SLOT_SIZE)
    }

    /// Encode into a slot of `slot_size` bytes (a power of two, 4 KiB or more).
    pub fn encode_slot(&self, offset: u64, slot_size: usize) -> Vec<u8> {
        let mut b = vec![0u8; slot_size];
        b[0..8].copy_from_slice(&UB_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.version().to_le_bytes());
        b[16..24].copy_from_slice(&self.txg.get().to_le_bytes());
        b[24..32].copy_from_slice(&self.guid_sum.to_le_bytes());
        b[32..40].copy_from_slice(&self.timestamp_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.pool_guid.get().to_le_bytes());
        b[48..48 + BlockPointer::SIZE].copy_from_slice(&self.root.encode());
        if let Some(h) = self.heartbeat {
            let at = HEARTBEAT_AT;
            b[at..at + 8].copy_from_slice(&HEARTBEAT_MAGIC.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&h.seq.to_le_bytes());
            b[at + 16..at + 20].copy_from_slice(&h.hostid.to_le_bytes());
            b[at + 20..at + 24].copy_from_slice(&h.interval_ms.to_le_bytes());
        }
        seal(&mut b, offset);
        b
    }

    /// The version its root says: 2 for a MOS objset (format 2), 1 for a MOS index.
    pub fn version(&self) -> u64 {
        if self.root.kind == crate::block::blkptr::KIND_OBJSET {
            UB_VERSION_OBJSET
        } else {
            UB_VERSION_MOS_INDEX
        }
    }

    /// Format 2: the root is a MOS objset.
    pub fn is_format2(&self) -> bool {
        self.version() == UB_VERSION_OBJSET
    }

    /// Decode a slot of any supported size (4 KiB .. 8 KiB); `None` if it is not a
    /// valid uberblock (see [`Uberblock::decode_checked`]).
    pub fn decode(b: &[u8], offset: u64) -> Option<Uberblock> {
        Self::decode_checked(b, offset).ok()
    }

    /// Decode a slot: `Err(None)` when it holds no sealed uberblock (an empty or torn
    /// slot: normal), `Err(Some(why))` when it is sealed but a field is impossible
    /// (the reason names the field and its value). Either way the slot is not an import
    /// candidate: import takes the newest uberblock that decodes.
    pub fn decode_checked(b: &[u8], offset: u64) -> std::result::Result<Uberblock, Option<String>> {
        let sizes = ub_slot_size(MIN_ASHIFT)..=ub_slot_size(MAX_ASHIFT);
        if !b.len().is_power_of_two() || !sizes.contains(&b.len()) || !verify_sealed(b, offset) {
            return Err(None);
        }
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u(0) != UB_MAGIC {
            return Err(None);
        }
        let bad = |field: &str, v: u64| Err(Some(format!("uberblock at offset {offset:#x}: field {field} = {v} is out of range")));
        let version = u(8);
        if version != UB_VERSION_MOS_INDEX && version != UB_VERSION_OBJSET {
            return bad("version", version);
        }
        let txg = Txg(u(16));
        if txg.is_zero() || !txg.is_valid_on_disk() {
            return bad("txg", txg.get());
        }
        if u(32) >= TIMESTAMP_LIMIT_NS {
            return bad("timestamp", u(32));
        }
        if u(40) == 0 {
            return bad("pool_guid", 0);
        }
        let root = BlockPointer::check(&b[48..48 + BlockPointer::SIZE])
            .map_err(|why| Some(format!("uberblock at offset {offset:#x}: MOS pointer: {why}")))?;
        // every txg, the first one included, writes an object directory before its
        // uberblock: a hole here is as impossible as a pointer of another kind
        let fits = match version {
            UB_VERSION_MOS_INDEX => root.kind == crate::block::blkptr::KIND_MOS_INDEX && root.checksum_code == 1,
            _ => root.kind == crate::block::blkptr::KIND_OBJSET && root.level == 0 && root.lsize == UB_OBJSET_BYTES,
        };
        if root.is_hole() || !fits || root.birth > txg {
            let expected = if version == UB_VERSION_MOS_INDEX { "a fletcher4 MOS index" } else { "a MOS objset block (kind 5, level 0, 4096 bytes)" };
            return Err(Some(format!(
                "uberblock at offset {offset:#x}: version {version} MOS pointer of kind {} level {} size {} born in txg {} with checksum {} (expected {expected} born by txg {txg})",
                root.kind, root.level, root.lsize, root.birth, root.checksum_code
            )));
        }
        let at = HEARTBEAT_AT;
        let heartbeat = (u(at) == HEARTBEAT_MAGIC).then(|| Heartbeat {
            seq: u(at + 8),
            hostid: u32::from_le_bytes(b[at + 16..at + 20].try_into().unwrap()),
            interval_ms: u32::from_le_bytes(b[at + 20..at + 24].try_into().unwrap()),
        });
        if let Some(h) = heartbeat {
            if !(1..=HEARTBEAT_INTERVAL_MAX_MS).contains(&h.interval_ms) {
                return bad("heartbeat interval_ms", h.interval_ms as u64);
            }
        }
        Ok(Uberblock { txg, guid_sum: u(24), timestamp_ns: u(32), pool_guid: Guid(u(40)), root, heartbeat })
    }
}

/// A pool whose newest txg is this close to the end of the txg counter is not imported:
/// the refusal names the uberblock's txg (no txg number ever wraps; see `Txg::POOL_LIMIT`).
pub fn check_pool_txg(ub: &Uberblock) -> std::result::Result<(), String> {
    if ub.txg.is_valid_pool_txg() {
        return Ok(());
    }
    Err(format!(
        "uberblock field txg = {} is out of range: at most {} (2^63 - 2^32) leaves the txg counter room to write",
        ub.txg,
        Txg::POOL_LIMIT.get() - 1
    ))
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
    if len > CONFIG_REGION_SIZE - CONFIG_HEADER_SIZE - TRAILER_SIZE || !Txg(u(16)).is_valid_on_disk() {
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
    /// Multihost heartbeats (from heartbeat slots; not import candidates).
    pub heartbeats: Vec<Uberblock>,
    pub bad_labels: usize,
    /// Sealed uberblocks with an impossible field (why, naming field and value), at
    /// most [`REJECTED_MAX`]: not import candidates, reported by import.
    pub rejected: Vec<String>,
}

/// Most rejected uberblocks a scan keeps the reason of.
pub const REJECTED_MAX: usize = 8;

/// Read all four labels of a device (not through the queue: import time only).
pub fn scan_labels(dev: &dyn super::Device) -> io::Result<LabelScan> {
    let size = dev.size();
    if size < MIN_DEVICE_SIZE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("device too small ({size} bytes)")));
    }
    let mut out = LabelScan { config: None, valid_configs: 0, uberblocks: Vec::new(), heartbeats: Vec::new(), bad_labels: 0, rejected: Vec::new() };
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
        // every slot size the layout supports: a slot decodes only at its own size
        for ashift in MIN_ASHIFT..=MAX_ASHIFT {
            let slot = ub_slot_size(ashift);
            for so in (CONFIG_REGION_SIZE..LABEL_SIZE as usize).step_by(slot) {
                match Uberblock::decode_checked(&buf[so..so + slot], off + so as u64) {
                    Ok(ub) if ub.heartbeat.is_some() => out.heartbeats.push(ub),
                    Ok(ub) => out.uberblocks.push(ub),
                    Err(Some(why)) if out.rejected.len() < REJECTED_MAX => out.rejected.push(why),
                    Err(_) => {}
                }
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
    fn uberblock_slots_decode_at_their_own_size_only() {
        let mut root = BlockPointer::hole();
        root.dva[0] = crate::block::blkptr::Dva { vdev: crate::types::VdevId(0), asize: 4096, offset: 8192 };
        (root.lsize, root.psize, root.birth, root.fill) = (4096, 4096, Txg(6), 1);
        (root.checksum_code, root.compression_code, root.kind) = (1, 1, crate::block::blkptr::KIND_MOS_INDEX);
        let ub = Uberblock { txg: Txg(7), guid_sum: 1, timestamp_ns: 2, pool_guid: Guid(3), root, heartbeat: None };
        let b8 = ub.encode_slot(8192, 8192);
        assert_eq!(Uberblock::decode(&b8, 8192), Some(ub.clone()));
        assert_eq!(Uberblock::decode(&b8[..4096], 8192), None, "a 4K read of an 8K slot");
        let b4 = ub.encode(8192);
        let mut pair = b4.clone();
        pair.extend_from_slice(&ub.encode(12288));
        assert_eq!(Uberblock::decode(&pair, 8192), None, "two 4K slots are not one 8K slot");
        let hb = Uberblock { heartbeat: Some(Heartbeat { seq: 9, hostid: 0xabcd, interval_ms: 1000 }), ..ub };
        assert_eq!(Uberblock::decode(&hb.encode(0), 0), Some(hb));
        assert_eq!(ub_ring_slots(12), 31);
        assert_eq!(ub_ring_slots(13), 15);
        assert_eq!(heartbeat_offset(1 << 30, 0, 13), CONFIG_REGION_SIZE as u64 + 15 * 8192);
        assert_eq!(ub_offset_at(1 << 30, 0, Txg(16), 13), CONFIG_REGION_SIZE as u64 + 8192);
    }

    /// Version 2 (§9): an objset root, decoded as version 2; a slot whose version and
    /// root kind disagree is corrupt, with the reason.
    #[test]
    fn version_2_uberblocks_point_at_an_objset_block() {
        use crate::block::blkptr::{KIND_MOS_INDEX, KIND_OBJSET};
        let mut root = BlockPointer::hole();
        root.dva[0] = crate::block::blkptr::Dva { vdev: crate::types::VdevId(0), asize: 4096, offset: 8192 };
        (root.lsize, root.psize, root.birth, root.fill) = (UB_OBJSET_BYTES, 4096, Txg(6), 1);
        (root.checksum_code, root.compression_code, root.kind) = (2, 1, KIND_OBJSET);
        let ub = Uberblock { txg: Txg(7), guid_sum: 1, timestamp_ns: 2, pool_guid: Guid(3), root, heartbeat: None };
        let b = ub.encode(8192);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), UB_VERSION_OBJSET);
        assert_eq!(Uberblock::decode(&b, 8192), Some(ub.clone()));
        assert!(ub.is_format2());
        // the version field and the root kind must agree
        let mut v1 = b.clone();
        v1[8..16].copy_from_slice(&UB_VERSION_MOS_INDEX.to_le_bytes());
        seal(&mut v1, 8192);
        assert!(matches!(Uberblock::decode_checked(&v1, 8192), Err(Some(w)) if w.contains("version 1") && w.contains("kind 5")));
        let bad = |f: &dyn Fn(&mut BlockPointer)| {
            let mut u = ub.clone();
            f(&mut u.root);
            Uberblock::decode_checked(&u.encode(8192), 8192)
        };
        assert!(matches!(bad(&|r| r.level = 1), Err(Some(_))), "an objset block is level 0");
        assert!(matches!(bad(&|r| r.lsize = 8192), Err(Some(_))), "an objset block is 4 KiB");
        assert!(matches!(bad(&|r| r.birth = Txg(8)), Err(Some(_))), "born after its uberblock");
        let mut v2_index = ub.encode(8192);
        let mut idx = ub.clone();
        (idx.root.kind, idx.root.checksum_code) = (KIND_MOS_INDEX, 1);
        v2_index[48..48 + BlockPointer::SIZE].copy_from_slice(&idx.root.encode());
        seal(&mut v2_index, 8192);
        assert!(matches!(Uberblock::decode_checked(&v2_index, 8192), Err(Some(w)) if w.contains("version 2")));
        let mut v3 = b.clone();
        v3[8..16].copy_from_slice(&3u64.to_le_bytes());
        seal(&mut v3, 8192);
        assert!(matches!(Uberblock::decode_checked(&v3, 8192), Err(Some(w)) if w.contains("version = 3")));
    }

    #[test]
    fn config_roundtrip() {
        let b = encode_config(b"{\"a\":1}", Txg(9), 0).unwrap();
        assert_eq!(decode_config(&b, 0), Some((Txg(9), b"{\"a\":1}".to_vec())));
        assert_eq!(decode_config(&b, LABEL_SIZE), None);
    }
}
