//! zil: the intent log — per-volume log of writes not yet in a synced txg, so a FLUSH
//! or FUA write is durable after one small log write instead of a whole txg sync.
//!
//! Theory of operation
//! -------------------
//! In memory (open context). Every change to a volume becomes an *itx* (intent-log
//! transaction) appended to the volume's [`Zilog`] under the dirty-shard lock of the
//! block it changes, so per block the itx order is the order of the dirty versions.
//! Itxs are kept per txg (`BTreeMap<Txg, Vec<Itx>>`): a commit takes them in txg order,
//! and the itxs of a txg that syncs are dropped, so the lists hold at most the three
//! unsynced txgs. An itx refers to the immutable new version of its block and nothing
//! is copied until a commit takes it (OpenZFS's `WR_NEED_COPY`): a whole-block write's
//! block is copied into the log block at commit; a partial write's bytes are cut out of
//! its block's version then and logged as `WR_COPIED`. A txg that syncs before any
//! commit drops its itxs without a copy. A whole-block itx that a later
//! whole-block write of the same block in the same txg replaces before any commit took
//! it is dropped (`Superseded`): it would only keep an old buffer alive until the sync,
//! and replaying the newer record makes it moot. A partial write of such a block is
//! logged as the whole new block for the same reason (`pending_whole_block`), and an
//! unmap of the whole block supersedes it too (`log_truncate_block`), so a pending itx
//! keeps a block buffer the dirty set has let go only behind a partial unmap (until a
//! commit takes it). The bytes the itxs hold are bounded
//! by `ZIL_ITX_BYTES_MAX`: past it new itxs are not kept and the next commit falls back
//! to a txg sync (everything is then on disk anyway).
//!
//! On disk. A chain of log write blocks (lwbs) starts at the *ZIL header*, kept per
//! volume in the object directory (MOS) and written by every txg sync. Each lwb holds a
//! header with an embedded checksum, the pointer to the next block (allocated before
//! this one is written, so a block's successor is known when it is written), and
//! records. The checksum's verifier is the chain's random guid, the volume id and the
//! block's sequence number: a block left at that address by an older chain, or by an
//! earlier block of this one, never verifies, and the first block that does not verify
//! ends the chain. Byte maps: docs/on-disk-format.md, "Intent log".
//!
//! zil_commit. One issuer at a time (`issuer` lock), many waiters: a commit notes the
//! newest itx sequence number it must cover; if an earlier issuer already made it
//! durable it returns at once (that is the batching: the waiters of a commit that is
//! being written find their itxs written when they get the lock). The issuer takes
//! every pending itx, packs them into lwbs (adaptive size: each lwb allocates its
//! successor for the rest of the commit, or for the largest of the last 16 commits, so a
//! commit usually fits the block allocated before it; 4 KiB to `zil_maxblocksize`; an lwb
//! is written only as far as it is used, rounded to the allocation unit), writes every lwb at once and flushes the devices written (unless
//! `zil_nocacheflush`), then publishes the new durable sequence number. Each child of a
//! log vdev flushes in the completion of its own last lwb write, on the engine thread
//! that finished it (`TopVdev::write_blocks_then_flush`): one hand-off to the devices
//! and one back per commit, and a child whose write failed is never flushed or counted. A commit with
//! nothing pending returns at once. A commit's records share the itxs' buffers and each lwb
//! is encoded straight into its aligned write buffer (a logged byte is copied once); a
//! commit that would copy more than `zilla_zil_commit_bytes_max` waits for a txg sync
//! instead (a flush after a burst of writes as large as the dirty limit would hold as
//! much again in lwb buffers; the sync writes those bytes once, not twice).
//!
//! Commit waiters without threads (the NBD FLUSH path, `commit_start`). A commit that
//! finds the issuer role free packs and issues its lwbs and returns; the device
//! completion finishes it. One that finds the role held queues a *waiter* (its target
//! sequence number and a callback) under the same lock and returns: no thread waits.
//! When a round's writes complete, the completing engine thread calls every waiter
//! whose target is now durable and, if some remain (their itxs arrived while the round
//! was in flight), keeps the role and starts the next round itself with every itx
//! pending by then: that is the batching, as OpenZFS's lwb completion wakes its commit
//! waiters and the next zil_commit_writer takes what queued meanwhile. A blocking commit
//! (or `evacuate`) that waits for the role stops the chaining: the round in flight
//! releases the role and hands its leftover waiters to the blocking path, so nobody
//! waits behind an endless chain. Every release of the role settles the queue the same
//! way (durable ones answered, the rest told to commit blocking), so no waiter is ever
//! left behind by an early exit. Blocks come from the log class when the pool has log
//! vdevs, else from the normal class. If a log write fails, the chain is abandoned (its
//! blocks are freed by the next sync) and the commit waits for a txg sync instead; so do
//! the commits after it until that txg is on disk (they may have found their itxs taken
//! by it: `sync_fallback`).
//!
//! Sync (`header_for_sync` / `synced`). Txg T's sync writes each volume's ZIL header:
//! its head is the first lwb whose records are not all in txgs <= T; lwbs before it are
//! freed in T. When T is on disk the itxs of txgs <= T are dropped. A volume whose
//! chain is new gets its header written by the next sync: the first commit on a chain
//! waits for that sync (as `zil_create` does), later ones only for their lwbs.
//!
//! Space. Log blocks are allocated outside any sync. A block is *unreferenced* until the
//! lwb that points at it (or the header) is durable; the metaslab encoder leaves such
//! blocks out of the space maps, so a power cut never leaks one. At import `claim`
//! takes every block of a valid chain (and its pre-allocated successor) back out of the
//! free trees and defer lists.
//!
//! Indirect writes (dmu_sync). A WR_INDIRECT itx keeps the whole block's buffer; the
//! commit prepares it as the sync would (checksum, compression), allocates it in the
//! normal class, writes it with the lwbs (one flush round for both) and logs a record
//! holding its block pointer, born in the itx's txg T. The block is kept in
//! `overrides` until T syncs: the sync of T closes T to new dmu_syncs, waits for those
//! of T in flight (`overrides_for_sync`), then uses each block whose dirty version is
//! still the buffer written (no second write) and frees the others in T. Claim takes
//! the pointed-to blocks born after the claim txg; replay reads them verified.
//!
//! Lock order: `issuer` -> `chain` -> `itxs` (each of the last two is held only for
//! memory work; no lock is held across a txg wait); `sync_fallback` is taken alone. `overrides` is taken alone, or
//! before the allocator's locks (a dmu_sync allocates under it); the sync waits on it
//! only for dmu_sync I/O, which never waits for a sync.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::block::blkptr::{BlockPointer, Dva};
use crate::block::checksum::ChecksumAlgo;
use crate::block::compress::Compression;
use crate::block::checksum::fletcher4;
use crate::block::reader::Reader;
use crate::kstat::{Applies, Tunable};
use crate::metaslab::Purpose;
use crate::vdev::abd::AlignedBuf;
use crate::vdev::mirror::BlockWrite;
use crate::vdev::{IoClass, Role};
use crate::zio::PoolIo;
use crate::{Error, Result, Txg};

pub static ZIL_MAXBLOCKSIZE: Tunable =
    Tunable::new("zil_maxblocksize", 128 << 10, 4096, 128 << 10, Applies::Live, "largest log write block (bytes)");
pub static ZIL_NOCACHEFLUSH: Tunable =
    Tunable::new("zil_nocacheflush", 0, 0, 1, Applies::Live, "1: do not flush the devices' write caches after log writes (unsafe on power loss)");
pub static ZIL_REPLAY_DISABLE: Tunable =
    Tunable::new("zil_replay_disable", 0, 0, 1, Applies::Live, "1: discard the intent logs at import instead of replaying them (loses acknowledged writes)");
pub static ZFS_IMMEDIATE_WRITE_SZ: Tunable = Tunable::new(
    "zfs_immediate_write_sz",
    32 << 10,
    512,
    16 << 20,
    Applies::Live,
    "on a pool without log vdevs, whole-block writes of volumes whose volblocksize is larger than this are written in place at commit (WR_INDIRECT) instead of into the log (logbias=throughput: all whole-block writes)",
);
pub static ZIL_SLOG_BULK: Tunable = Tunable::new(
    "zil_slog_bulk",
    64 << 20,
    0,
    1 << 40,
    Applies::Live,
    "a commit writing more log bytes than this issues them at async-write priority, so one bulk writer does not starve other sync I/O (OpenZFS 2.2 default 64 MiB)",
);
pub static ZILLA_ZIL_COMMIT_BYTES_MAX: Tunable = Tunable::new(
    "zilla_zil_commit_bytes_max",
    16 << 20,
    0,
    1 << 40,
    Applies::Live,
    "a commit that would copy more data than this into log blocks and in-place writes waits for a txg sync instead, which writes those bytes once (Zilla: bounds the buffers a commit holds); 0 = no bound",
);
pub static ZFS_COMMIT_TIMEOUT_PCT: Tunable = Tunable::new(
    "zfs_commit_timeout_pct",
    10,
    0,
    100,
    Applies::Live,
    "when other commits wait for the issuer, it waits this percentage of the last lwb's write latency for more itxs before packing (OpenZFS 2.2 default 10)",
);
/// Space admission of a normal-class log block of the given bytes (true: admitted and
/// counted; see `alloc_log_block`).
pub type AdmitLogBlock<'a> = &'a dyn Fn(u64) -> bool;
/// Reads the pool's open txg *now*. A commit reads it only after it holds the issuer
/// role and has taken the pending itxs: a value read before the wait for the role can
/// be older than itxs taken after it (a txg opened meanwhile), and a fallback or a
/// broken chain recorded with it would call those itxs durable once an older txg syncs.
/// Txgs only go up, so the value read after `take_pending` is at least the txg of every
/// itx taken, by this round and by every earlier one.
pub type OpenTxg<'a> = &'a dyn Fn() -> Txg;

/// Longest wait `zfs_commit_timeout_pct` may ask for.
pub const ZIL_COMMIT_TIMEOUT_MAX_NS: u64 = 1_000_000;
/// Bytes one volume's itxs may hold before new itxs are dropped and the next commit
/// syncs a txg instead.
pub const ZIL_ITX_BYTES_MAX: u64 = 256 << 20;

pub const LWB_MAGIC: u64 = 0x4c49_5a41_4c4c_495a; // "ZILLAZIL" little-endian
pub const LWB_HEADER_SIZE: usize = 96;
pub const LWB_MIN_SIZE: usize = 4096;
const LWB_CKSUM_AT: usize = 56;
pub const RECORD_HEADER_SIZE: usize = 40;
pub const TX_WRITE: u8 = 1;
pub const TX_TRUNCATE: u8 = 2;
pub const WR_COPIED: u8 = 1;
pub const WR_NEED_COPY: u8 = 2;
pub const WR_INDIRECT: u8 = 3;

/// Where a log block is: its DVA (one copy; a mirror log vdev keeps it twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogPtr {
    pub dva: Dva,
}

impl LogPtr {
    pub fn is_none(&self) -> bool {
        self.dva.asize == 0
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.dva.vdev.get().to_le_bytes());
        out.extend_from_slice(&self.dva.asize.to_le_bytes());
        out.extend_from_slice(&self.dva.offset.to_le_bytes());
    }
    fn decode(r: &mut Reader<'_>) -> Result<LogPtr> {
        let (vdev, asize, offset) = (r.u32()?, r.u32()?, r.u64()?);
        if asize != 0 && (asize as usize % LWB_MIN_SIZE != 0 || asize as usize > (128 << 10) || offset % 512 != 0) {
            return Err(Error::Corrupt(format!("log block pointer {vdev}:{offset:#x}:{asize} is malformed")));
        }
        Ok(LogPtr { dva: Dva { vdev: crate::VdevId(vdev), asize, offset } })
    }
}

/// The ZIL header of a volume, in the MOS: the chain's guid and its first block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ZilHeader {
    pub guid: u64,
    pub head: LogPtr,
    pub head_seq: u64,
    /// The last synced txg when this chain was first claimed (0: never claimed).
    /// Replay skips records of txgs up to it; a replay cut short by a crash replays
    /// the same records again, because its own syncs do not move this.
    pub claim_txg: Txg,
}

pub const ZIL_HEADER_SIZE: usize = 40;

impl ZilHeader {
    pub fn is_empty(&self) -> bool {
        self.head.is_none()
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.guid.to_le_bytes());
        self.head.encode(out);
        out.extend_from_slice(&self.head_seq.to_le_bytes());
        out.extend_from_slice(&self.claim_txg.get().to_le_bytes());
    }
    pub fn decode(r: &mut Reader<'_>) -> Result<ZilHeader> {
        let guid = r.u64()?;
        let head = LogPtr::decode(r)?;
        let head_seq = r.u64()?;
        let claim_txg = Txg(r.u64()?);
        Ok(ZilHeader { guid, head, head_seq, claim_txg })
    }
}

/// One log record, as written and as replayed. `data` is the bytes of a TX_WRITE
/// (`len` of them; for WR_INDIRECT the 128-byte block pointer of the block holding
/// them), empty for TX_TRUNCATE. A commit's records share the itxs' buffers (a
/// WR_NEED_COPY record is the block's own buffer): the bytes are copied once, into
/// the log block that is written (a partial write's bytes once more, out of their
/// block's version, when the commit takes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub rtype: u8,
    pub wr: u8,
    pub txg: Txg,
    pub offset: u64,
    pub len: u64,
    pub data: Arc<AlignedBuf>,
}

impl LogRecord {
    /// The block a WR_INDIRECT record points at (None for other records).
    pub fn indirect_bp(&self) -> Option<BlockPointer> {
        if self.rtype != TX_WRITE || self.wr != WR_INDIRECT {
            return None;
        }
        BlockPointer::decode(&self.data).filter(|bp| !bp.is_hole())
    }
}

/// The content an itx carries.
#[derive(Clone)]
enum ItxData {
    /// TX_WRITE, WR_COPIED: the bytes, copied when the write was applied.
    Copied(Arc<AlignedBuf>),
    /// TX_WRITE, WR_NEED_COPY: a whole block's immutable buffer, copied into the log
    /// block at commit.
    Block(Arc<AlignedBuf>),
    /// TX_WRITE of part of a block (OpenZFS's WR_NEED_COPY): the block's new dirty
    /// version, immutable while shared, whose bytes `[in_block, in_block + len)` are
    /// the write's; copied out only when a commit takes the record, so a txg that syncs
    /// first discards it without any copy. Written as WR_COPIED.
    Partial { block: Arc<AlignedBuf>, in_block: usize, len: usize },
    /// TX_TRUNCATE: the range reads as zeros.
    Truncate(u64),
    /// TX_WRITE, WR_INDIRECT (whole blocks, see `zvol::log_itx`): the block's immutable
    /// buffer; at commit it is written in place to the pool (dmu_sync) and the log
    /// record carries only its block pointer.
    Indirect(Arc<AlignedBuf>),
    /// A whole-block write (`Block` or `Indirect`) that a later whole-block write of the
    /// same block in the same txg replaced before any commit took it: it writes no
    /// record, and its buffer is released at once (see `ItxLists::whole_blocks`).
    Superseded,
}

#[derive(Clone)]
struct Itx {
    offset: u64,
    data: ItxData,
}

impl Itx {
    fn len(&self) -> u64 {
        match &self.data {
            ItxData::Copied(d) | ItxData::Block(d) | ItxData::Indirect(d) => d.len() as u64,
            ItxData::Partial { len, .. } => *len as u64,
            ItxData::Truncate(n) => *n,
            ItxData::Superseded => 0,
        }
    }
    fn mem_bytes(&self) -> u64 {
        match &self.data {
            ItxData::Copied(d) => d.len() as u64 + 64,
            ItxData::Partial { len, .. } => *len as u64 + 64,
            _ => 64,
        }
    }
}

#[derive(Default)]
struct ItxLists {
    by_txg: BTreeMap<Txg, Vec<Itx>>,
    /// Where the newest pending whole-block itx of each block offset is: its txg and
    /// its index in `by_txg[txg]`. A whole-block itx keeps the block's buffer, which the
    /// dirty set drops when the block is written again; without this, every write of a
    /// block rewritten within a txg would stay in memory until that txg synced (a
    /// stream rewriting a 512 MiB volume held 5 GiB). A newer whole-block itx of the
    /// same block and txg makes the older one `Superseded`: every commit takes all
    /// pending itxs, so the two are always taken together, and replay applies the newer
    /// one after whatever lay between them. At most one entry per dirty block.
    whole_blocks: HashMap<u64, (Txg, usize)>,
    bytes: u64,
    /// Sequence number of the newest itx appended (or dropped for the bound).
    last_seq: u64,
    /// An itx was dropped for the memory bound: the next commit syncs a txg.
    overflowed_txg: Txg,
}

/// A block of the chain, allocated (and maybe written).
#[derive(Debug, Clone, Copy)]
struct ChainBlock {
    ptr: LogPtr,
    seq: u64,
    /// Newest txg among its records.
    max_txg: Txg,
    written: bool,
    /// Records in it and their bytes (headers and data), for the counters.
    records: u32,
    record_bytes: u32,
}

impl Chain {
    /// The block of sequence number `seq`. Blocks are pushed in seq order, one apart,
    /// and leave from the front, so its index is `seq` minus the first one's: a
    /// search from the front cost O(blocks) per commit, and a chain holds every lwb
    /// written since the last sync (thousands at QD1 on fast devices).
    fn block_mut(&mut self, seq: u64) -> Option<&mut ChainBlock> {
        let first = self.blocks.front()?.seq;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        match self.blocks.get(i) {
            Some(b) if b.seq == seq => {}
            _ => return self.blocks.iter_mut().find(|b| b.seq == seq),
        }
        self.blocks.get_mut(i)
    }
}

#[derive(Default)]
struct Chain {
    guid: u64,
    /// Blocks in chain order; `next` is the allocated successor of the last one.
    blocks: VecDeque<ChainBlock>,
    next: Option<(LogPtr, u64)>,
    /// The header naming this chain is on disk.
    on_disk: bool,
    /// Blocks of an abandoned or replayed chain, freed by the next sync.
    to_free: Vec<LogPtr>,
    /// Import is replaying the chain of this header: every sync writes it unchanged
    /// until the replay ends.
    replaying: Option<ZilHeader>,
    /// A log block could not be allocated or written: the chain takes no more records,
    /// and the first sync of this txg or a later one (which holds every record the
    /// chain has, all of txgs up to it) frees the whole chain and writes an empty
    /// header. Until then the syncs keep naming the chain as before: its written blocks
    /// hold acknowledged writes of txgs not on disk yet.
    broken_at: Option<Txg>,
    /// Record bytes of the last `ZIL_PREV_COMMITS` commits (ring, `recent_commits`
    /// is the count so far): the next lwb is allocated to hold the largest.
    recent_commit_bytes: [u32; ZIL_PREV_COMMITS],
    recent_commits: usize,
    /// The volume was destroyed (`take_all_blocks`): no block is allocated for it any
    /// more. A commit round that passed the volume's liveness check just before the
    /// destroy would otherwise start a new chain whose head nobody frees.
    closed: bool,
}

/// Commits remembered for lwb sizing (OpenZFS: ZIL_PREV_BLKS).
const ZIL_PREV_COMMITS: usize = 16;

/// What a sync did to the chain, handed back to [`Zilog::synced`] once it committed.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncToken {
    txg: Txg,
    freed_blocks: usize,
    freed_orphans: usize,
    names_chain: bool,
    /// The sync retired a broken chain: forget it in memory.
    retired_broken: bool,
}

/// Counters with OpenZFS names (/proc/spl/kstat/zfs/zil): `_count` of itxs (log
/// records), `_bytes` of record bytes (header and data), `_write` of log block bytes
/// written (records plus block header and padding). `zil_lwb_write_count` (Zilla's) counts
/// log blocks written, so itxs per lwb says how well commits batch.
#[derive(Debug, Default)]
pub struct ZilStats {
    pub zil_commit_count: AtomicU64,
    pub zil_commit_writer_count: AtomicU64,
    pub zil_itx_count: AtomicU64,
    pub zil_itx_indirect_count: AtomicU64,
    pub zil_itx_indirect_bytes: AtomicU64,
    pub zil_itx_copied_count: AtomicU64,
    pub zil_itx_copied_bytes: AtomicU64,
    pub zil_itx_needcopy_count: AtomicU64,
    pub zil_itx_needcopy_bytes: AtomicU64,
    pub zil_itx_metaslab_normal_count: AtomicU64,
    pub zil_itx_metaslab_normal_bytes: AtomicU64,
    pub zil_itx_metaslab_normal_write: AtomicU64,
    pub zil_itx_metaslab_slog_count: AtomicU64,
    pub zil_itx_metaslab_slog_bytes: AtomicU64,
    pub zil_itx_metaslab_slog_write: AtomicU64,
    pub zil_lwb_write_count: AtomicU64,
    /// (Zilla) Log blocks the log class could not allocate while usable (full or too
    /// fragmented for the size asked): the block came from the normal class instead.
    pub zil_lwb_slog_full_count: AtomicU64,
    /// Records replayed from this volume's log at import.
    pub replayed_records: AtomicU64,
    /// (Zilla) Commits that waited for a txg sync because they would have copied
    /// more than `zilla_zil_commit_bytes_max`.
    pub zil_commit_txg_fallback_count: AtomicU64,
    /// (Zilla) Whole-block itxs released before any commit took them, because the same
    /// block was written whole again in the same txg (`ItxData::Superseded`).
    pub zil_itx_superseded_count: AtomicU64,
}

impl ZilStats {
    /// (kstat name, value) of every counter, in /proc/spl/kstat/zfs/zil order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("zil_commit_count", l(&self.zil_commit_count)),
            ("zil_commit_writer_count", l(&self.zil_commit_writer_count)),
            ("zil_itx_count", l(&self.zil_itx_count)),
            ("zil_itx_indirect_count", l(&self.zil_itx_indirect_count)),
            ("zil_itx_indirect_bytes", l(&self.zil_itx_indirect_bytes)),
            ("zil_itx_copied_count", l(&self.zil_itx_copied_count)),
            ("zil_itx_copied_bytes", l(&self.zil_itx_copied_bytes)),
            ("zil_itx_needcopy_count", l(&self.zil_itx_needcopy_count)),
            ("zil_itx_needcopy_bytes", l(&self.zil_itx_needcopy_bytes)),
            ("zil_itx_metaslab_normal_count", l(&self.zil_itx_metaslab_normal_count)),
            ("zil_itx_metaslab_normal_bytes", l(&self.zil_itx_metaslab_normal_bytes)),
            ("zil_itx_metaslab_normal_write", l(&self.zil_itx_metaslab_normal_write)),
            ("zil_itx_metaslab_slog_count", l(&self.zil_itx_metaslab_slog_count)),
            ("zil_itx_metaslab_slog_bytes", l(&self.zil_itx_metaslab_slog_bytes)),
            ("zil_itx_metaslab_slog_write", l(&self.zil_itx_metaslab_slog_write)),
            ("zil_lwb_write_count", l(&self.zil_lwb_write_count)),
            ("zil_lwb_slog_full_count", l(&self.zil_lwb_slog_full_count)),
            ("zil_commit_txg_fallback_count", l(&self.zil_commit_txg_fallback_count)),
            ("zil_itx_superseded_count", l(&self.zil_itx_superseded_count)),
        ]
    }
}

/// A pending itx, taken by a commit.
enum Pending {
    Record(LogRecord),
    /// A WR_INDIRECT itx: its block is written in place by the commit.
    Indirect { txg: Txg, offset: u64, block: Arc<AlignedBuf> },
}

impl Pending {
    /// Bytes a commit copies for it: record header and data into an lwb, or the
    /// block into the buffer of its in-place write.
    fn copy_bytes(&self) -> u64 {
        match self {
            Pending::Record(r) => (RECORD_HEADER_SIZE + r.data.len()) as u64,
            Pending::Indirect { block, .. } => block.len() as u64,
        }
    }

    /// The txg of the write this itx logs.
    fn txg(&self) -> Txg {
        match self {
            Pending::Record(r) => r.txg,
            Pending::Indirect { txg, .. } => *txg,
        }
    }
}

/// A data block a commit writes in place for a WR_INDIRECT record (prepared bytes).
struct DataWrite {
    dva: Dva,
    txg: Txg,
    data: Arc<AlignedBuf>,
}

/// How a volume checksums and compresses its data blocks (for dmu_sync).
#[derive(Debug, Clone, Copy)]
pub struct DataPolicy {
    pub algo: ChecksumAlgo,
    pub comp: Compression,
}

/// A block a commit wrote in place for a dirty version of txg `txg` (dmu_sync), and
/// the override the sync of `txg` may use instead of writing the block again.
#[derive(Clone)]
pub struct DmuSynced {
    pub txg: Txg,
    pub blkid: crate::BlockId,
    /// The dirty version written (compared by identity at sync).
    pub data: Arc<AlignedBuf>,
    pub bp: BlockPointer,
    /// Its write and the lwb with its record are flushed.
    pub durable: bool,
}

impl DmuSynced {
    /// The sync may use this block for block `blkid` whose dirty version of its txg is
    /// `data`: the very version written, and durable.
    pub fn matches(&self, blkid: crate::BlockId, data: &Arc<AlignedBuf>) -> bool {
        self.durable && self.blkid == blkid && !self.data.is_empty() && Arc::ptr_eq(&self.data, data)
    }
}

/// The dmu_sync state of one volume. Bounded by the indirect itxs of the unsynced
/// txgs (each holds a dirty block, bounded by the dirty-data limit).
#[derive(Default)]
struct Overrides {
    /// By the block's address.
    blocks: std::collections::HashMap<Dva, DmuSynced>,
    /// The newest block written for each (txg, block id): an older one for the same
    /// block and txg can never be used (the dirty version moved on, as the itx order
    /// per block is the dirty order), so its buffer is let go at once (a block
    /// rewritten and flushed many times in one txg keeps one buffer alive, not all).
    latest: std::collections::HashMap<(Txg, crate::BlockId), Dva>,
    /// The syncs of txgs up to this one took their overrides: no new dmu_sync for them.
    closed_through: Txg,
    /// dmu_syncs begun and not ended, by txg.
    in_flight: BTreeMap<Txg, u32>,
}

impl Overrides {
    fn end_in_flight(&mut self, txg: Txg) {
        if let Some(n) = self.in_flight.get_mut(&txg) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&txg);
            }
        }
    }
}

/// How a commit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Every itx it had to cover is durable in the log (or was already).
    Durable,
    /// The log cannot take them now: the caller waits for this txg to sync.
    NeedTxgSync(Txg),
}

/// How [`Zilog::commit_start`] went.
pub enum CommitStart {
    /// Ended without writing: nothing was pending, or the log cannot take the itxs.
    Done(CommitOutcome),
    /// Another commit holds the issuer role and no waiter could be queued (none given,
    /// the queue is full, or a blocking commit waits for the role): commit blocking.
    Busy,
    /// Another commit holds the issuer role; the waiter was queued and is called once
    /// a later round (or the blocking path) settles it.
    Queued,
    /// This commit holds the issuer role: pass it to [`Zilog::issue_started`].
    Issue(Flight),
}

/// How a queued commit waiter ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Its itxs are durable.
    Durable,
    /// The chain of rounds stopped before its itxs: commit blocking for the result.
    CommitBlocking,
}

/// A commit queued behind the issuer (see [`Zilog::commit_start`]). Called exactly
/// once, from whichever thread settles it; it must not block.
pub type CommitWaiter = Box<dyn FnOnce(Waited) + Send>;

/// Waiters to call, outside every lock, with how each ended.
pub type SettledWaiters = Vec<(CommitWaiter, Waited)>;

/// Most commit waiters queued behind the issuer at once (the front ends' request
/// permits bound them long before this); more commit blocking.
pub const COMMIT_WAITERS_MAX: usize = 4096;

/// How [`Zilog::finish_async`] ended a round.
pub struct RoundEnd {
    /// How the round's own commit ended.
    pub outcome: CommitOutcome,
    /// Queued waiters settled by it.
    pub settled: SettledWaiters,
    /// The role is still held: waiters remain whose itxs came after this round; start
    /// the next round with [`Zilog::commit_round`].
    pub again: bool,
}

/// How [`Zilog::commit_round`] went.
pub enum RoundStart {
    /// The role is held: pass the flight to [`Zilog::issue_started`].
    Issue(Flight),
    /// The round ended without writing and the role was released.
    Ended(SettledWaiters),
}

/// The issuer role and what waits for it.
#[derive(Default)]
struct Issuer {
    busy: bool,
    /// (target sequence number, callback), queued while `busy`.
    waiters: VecDeque<(u64, CommitWaiter)>,
    /// Blocking commits waiting for the role: while any, rounds are not chained.
    blocking: u32,
}

/// A commit's writes in flight: its itxs up to `seq`, its lwbs and the blocks it
/// writes in place.
#[must_use = "a started commit holds the issuer role until its writes are issued and finished"]
pub struct Flight {
    seq: u64,
    synced: Txg,
    open: Txg,
    /// The lwbs with their written bytes (shared with the write requests).
    lwbs: Vec<(ChainBlock, Arc<AlignedBuf>)>,
    data: Vec<DataWrite>,
    /// The pool's clock (ns) when its writes were planned.
    started_ns: u64,
}

/// Completion of a commit's writes: the flight and how its writes went.
pub type IssueDone = Box<dyn FnOnce(Flight, Result<()>) + Send>;

enum Prepared {
    Outcome(CommitOutcome),
    Issue(Flight),
}

/// The issuer role (one commit at a time writes lwbs); released when dropped.
struct IssuerRole<'a>(&'a Zilog);

impl Drop for IssuerRole<'_> {
    fn drop(&mut self) {
        self.0.issuer_release();
    }
}

/// One volume's intent log.
pub struct Zilog {
    volume_id: u64,
    itxs: Mutex<ItxLists>,
    chain: Mutex<Chain>,
    /// A commit holds the issuer role (blocking: for its whole run; started
    /// asynchronously: until its writes complete, or through a chain of rounds), and the
    /// commit waiters queued behind it. Waited for with `issuer_cv`.
    issuer: Mutex<Issuer>,
    issuer_cv: Condvar,
    /// Commits waiting for the issuer role (for `zfs_commit_timeout_pct`).
    commits_waiting: AtomicU64,
    /// How long the last lwb write and flush took.
    last_lwb_latency_ns: AtomicU64,
    /// Every itx with a sequence number <= this is durable.
    durable_seq: AtomicU64,
    /// (sequence number, txg): a commit took the itxs up to this sequence number and
    /// could not log them (no chain on disk yet, or the chain broke), so they are durable
    /// only when this txg is; until then no commit calls anything durable (see
    /// `durable_through`). Taken alone.
    sync_fallback: Mutex<(u64, Txg)>,
    /// Blocks written in place by commits (dmu_sync), until their txg syncs.
    overrides: Mutex<Overrides>,
    /// Signalled when a dmu_sync ends (the sync of its txg may wait for it).
    overrides_cv: Condvar,
    pub stats: ZilStats,
}

/// The block at `block_offset` has a pending whole-block itx in `txg`: `Some(true)` if
/// it is WR_INDIRECT, `Some(false)` if WR_NEED_COPY.
fn pending_whole(l: &ItxLists, txg: Txg, block_offset: u64) -> Option<bool> {
    let &(t, i) = l.whole_blocks.get(&block_offset)?;
    if t != txg {
        return None;
    }
    match l.by_txg.get(&t)?.get(i)?.data {
        ItxData::Indirect(_) => Some(true),
        ItxData::Block(_) => Some(false),
        _ => None,
    }
}

impl Zilog {
    pub fn new(volume_id: u64) -> Zilog {
        Zilog {
            volume_id,
            itxs: Mutex::new(ItxLists::default()),
            chain: Mutex::new(Chain::default()),
            issuer: Mutex::new(Issuer::default()),
            issuer_cv: Condvar::new(),
            commits_waiting: AtomicU64::new(0),
            last_lwb_latency_ns: AtomicU64::new(0),
            durable_seq: AtomicU64::new(0),
            sync_fallback: Mutex::new((0, Txg::ZERO)),
            overrides: Mutex::new(Overrides::default()),
            overrides_cv: Condvar::new(),
            stats: ZilStats::default(),
        }
    }

    /// Log a write of `data` at byte `offset` in `txg`; `whole_block` = `data` is a
    /// whole block's immutable buffer (kept by reference, copied at commit).
    pub fn log_write(&self, txg: Txg, offset: u64, data: Arc<AlignedBuf>, whole_block: bool) {
        let d = if whole_block { ItxData::Block(data) } else { ItxData::Copied(data) };
        self.append(txg, Itx { offset, data: d });
    }

    /// Log a whole-block write that goes to the pool in place (WR_INDIRECT): `block` is
    /// the block's immutable buffer, written by the commit that covers it (dmu_sync).
    pub fn log_write_indirect(&self, txg: Txg, offset: u64, block: Arc<AlignedBuf>) {
        self.append(txg, Itx { offset, data: ItxData::Indirect(block) });
    }

    /// Log a partial write of the block at `block_offset`: `patch` is its bytes (at
    /// `offset`), `block` the block's new content. If the block has a whole-block itx
    /// pending in `txg`, the whole new block is logged instead (same kind, WR_NEED_COPY
    /// or WR_INDIRECT), superseding it: a copy of the bytes would leave the old buffer
    /// alive in that itx beside the new one. Logging the whole block is always right
    /// (it is the state after the write). One lock for the choice and the append.
    pub fn log_partial_write(&self, txg: Txg, block_offset: u64, offset: u64, block: &Arc<AlignedBuf>, in_block: usize, len: usize) {
        debug_assert!(in_block + len <= block.len(), "a partial write inside its block");
        self.stats.zil_itx_count.fetch_add(1, Ordering::Relaxed);
        let mut l = self.itxs.lock();
        let itx = match pending_whole(&l, txg, block_offset) {
            Some(true) => Itx { offset: block_offset, data: ItxData::Indirect(block.clone()) },
            Some(false) => Itx { offset: block_offset, data: ItxData::Block(block.clone()) },
            None => Itx { offset, data: ItxData::Partial { block: block.clone(), in_block, len } },
        };
        self.append_locked(&mut l, txg, itx);
    }

    /// [`pending_whole`] for tests.
    #[cfg(test)]
    fn pending_whole_block(&self, txg: Txg, block_offset: u64) -> Option<bool> {
        pending_whole(&self.itxs.lock(), txg, block_offset)
    }

    /// Log that `[offset, offset+len)` reads as zeros from `txg` on.
    pub fn log_truncate(&self, txg: Txg, offset: u64, len: u64) {
        self.append(txg, Itx { offset, data: ItxData::Truncate(len) });
    }

    /// Log that the whole block at `block_offset` (`len` bytes) reads as zeros from
    /// `txg` on (an unmap or write_zeroes of it). A whole-block itx of it pending in
    /// `txg` is superseded: replay zeroes the block after it anyway, and it would keep
    /// the old buffer alive until the sync, which the dirty set has let go.
    pub fn log_truncate_block(&self, txg: Txg, block_offset: u64, len: u64) {
        self.stats.zil_itx_count.fetch_add(1, Ordering::Relaxed);
        let mut l = self.itxs.lock();
        if pending_whole(&l, txg, block_offset).is_some() {
            let (t, i) = l.whole_blocks.remove(&block_offset).expect("pending_whole found the entry");
            let old = &mut l.by_txg.get_mut(&t).expect("an indexed itx's txg list exists")[i];
            debug_assert_eq!(old.offset, block_offset, "the whole-block index points at another block");
            debug_assert_eq!(old.len(), len, "a whole-block itx of another length");
            old.data = ItxData::Superseded;
            self.stats.zil_itx_superseded_count.fetch_add(1, Ordering::Relaxed);
        }
        self.append_locked(&mut l, txg, Itx { offset: block_offset, data: ItxData::Truncate(len) });
    }

    fn append(&self, txg: Txg, itx: Itx) {
        self.stats.zil_itx_count.fetch_add(1, Ordering::Relaxed);
        let mut l = self.itxs.lock();
        self.append_locked(&mut l, txg, itx);
    }

    fn append_locked(&self, l: &mut ItxLists, txg: Txg, itx: Itx) {
        l.last_seq += 1;
        let b = itx.mem_bytes();
        if l.bytes + b > ZIL_ITX_BYTES_MAX {
            l.overflowed_txg = l.overflowed_txg.max(txg);
            return;
        }
        l.bytes += b;
        let whole = matches!(itx.data, ItxData::Block(_) | ItxData::Indirect(_));
        let offset = itx.offset;
        let list = l.by_txg.entry(txg).or_default();
        list.push(itx);
        let index = list.len() - 1;
        if whole {
            if let Some((t, i)) = l.whole_blocks.insert(offset, (txg, index)) {
                if t == txg {
                    let old = &mut l.by_txg.get_mut(&t).expect("an indexed itx's txg list exists")[i];
                    debug_assert_eq!(old.offset, offset, "the whole-block index points at another block");
                    debug_assert!(matches!(old.data, ItxData::Block(_) | ItxData::Indirect(_) | ItxData::Superseded));
                    old.data = ItxData::Superseded;
                    self.stats.zil_itx_superseded_count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Nothing waits to be made durable.
    pub fn is_idle(&self) -> bool {
        self.itxs.lock().last_seq <= self.durable_seq.load(Ordering::Acquire)
    }

    /// A chain exists whose header is not on disk yet: the next sync must write it.
    pub fn needs_header_sync(&self) -> bool {
        let c = self.chain.lock();
        c.replaying.is_none() && ((!c.on_disk && (c.next.is_some() || !c.blocks.is_empty())) || !c.to_free.is_empty() || c.broken_at.is_some())
    }

    /// Make every itx appended before this call durable (zil_commit). `synced` is the
    /// newest synced txg (itxs of txgs up to it are on disk already).
    /// `admit_normal` admits log blocks allocated in the normal class (see
    /// `alloc_log_block`).
    /// `data_policy`: how the volume checksums and compresses its data blocks (for the
    /// blocks indirect itxs write in place).
    pub fn commit(&self, io: &PoolIo, synced: Txg, open_txg: OpenTxg<'_>, new_guid: &dyn Fn() -> u64, admit_normal: AdmitLogBlock<'_>, data_policy: DataPolicy) -> Result<CommitOutcome> {
        self.stats.zil_commit_count.fetch_add(1, Ordering::Relaxed);
        let target = self.itxs.lock().last_seq;
        if target <= self.durable_seq.load(Ordering::Acquire) {
            return Ok(CommitOutcome::Durable);
        }
        self.commits_waiting.fetch_add(1, Ordering::AcqRel);
        let issuer = self.issuer_acquire(target);
        let others_waiting = self.commits_waiting.fetch_sub(1, Ordering::AcqRel) > 1;
        let Some(_issuer) = issuer else {
            return Ok(CommitOutcome::Durable); // a round of queued waiters wrote ours too
        };
        if target <= self.durable_seq.load(Ordering::Acquire) {
            return Ok(CommitOutcome::Durable); // an earlier issuer wrote ours too
        }
        self.stats.zil_commit_writer_count.fetch_add(1, Ordering::Relaxed);
        if others_waiting {
            // concurrent committers: give the writers that are about to append a moment
            // to join this lwb (zfs_commit_timeout_pct of the last lwb's latency, on the
            // pool's clock)
            let pct = ZFS_COMMIT_TIMEOUT_PCT.get();
            let ns = (self.last_lwb_latency_ns.load(Ordering::Relaxed) * pct / 100).min(ZIL_COMMIT_TIMEOUT_MAX_NS);
            if ns > 0 {
                io.env().sleep_ns(ns);
            }
        }
        match self.prepare(io, synced, open_txg, new_guid, admit_normal, data_policy) {
            Prepared::Outcome(o) => Ok(o),
            Prepared::Issue(flight) => {
                let (tx, rx) = crossbeam_channel::bounded(1);
                self.issue(io, flight, Box::new(move |flight, result| {
                    let _ = tx.send((flight, result));
                }));
                let (flight, result) = rx.recv().map_err(|_| Error::Io(std::io::Error::other("intent log write completion lost")))?;
                Ok(self.finish(io, flight, result))
            }
        }
    }

    /// zil_commit without blocking the caller: the caller's thread only packs the
    /// lwbs; [`Zilog::issue_started`] submits them, and the engine thread whose device
    /// completion ends the commit tells the caller (OpenZFS wakes its commit waiters
    /// from the lwb's flush completion). `Issue` only when this commit became the
    /// issuer at once; it holds the issuer role until [`Zilog::finish_async`], so the
    /// caller must issue it. `Busy` when another commit holds the role (commit
    /// blocking then, batched behind it); `Queued` when another commit holds it and
    /// `waiter` was taken and queued behind it (see "Commit waiters without threads");
    /// `Done` when nothing had to be written, or the log cannot take the itxs (a txg
    /// to wait for). `waiter` is taken only for `Queued`.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_start(
        &self,
        io: &PoolIo,
        synced: Txg,
        open_txg: OpenTxg<'_>,
        new_guid: &dyn Fn() -> u64,
        admit_normal: AdmitLogBlock<'_>,
        data_policy: DataPolicy,
        waiter: &mut Option<CommitWaiter>,
    ) -> CommitStart {
        let target = self.itxs.lock().last_seq;
        if target <= self.durable_seq.load(Ordering::Acquire) {
            self.stats.zil_commit_count.fetch_add(1, Ordering::Relaxed);
            return CommitStart::Done(CommitOutcome::Durable);
        }
        let role = {
            let mut st = self.issuer.lock();
            if st.busy {
                if st.blocking > 0 || st.waiters.len() >= COMMIT_WAITERS_MAX {
                    return CommitStart::Busy; // the blocking commit counts it
                }
                let Some(w) = waiter.take() else { return CommitStart::Busy };
                st.waiters.push_back((target, w));
                self.stats.zil_commit_count.fetch_add(1, Ordering::Relaxed);
                return CommitStart::Queued;
            }
            st.busy = true;
            IssuerRole(self)
        };
        self.stats.zil_commit_count.fetch_add(1, Ordering::Relaxed);
        self.stats.zil_commit_writer_count.fetch_add(1, Ordering::Relaxed);
        match self.prepare(io, synced, open_txg, new_guid, admit_normal, data_policy) {
            Prepared::Outcome(o) => CommitStart::Done(o),
            Prepared::Issue(flight) => {
                // the role stays held until finish_async, from the completion
                std::mem::forget(role);
                CommitStart::Issue(flight)
            }
        }
    }

    /// Submit the writes of a commit from [`Zilog::commit_start`]. `done` runs once,
    /// from the completion of the last write-then-flush run (or here, when nothing
    /// could be submitted), with the flight to hand to [`Zilog::finish_async`]; it
    /// runs in a device completion, so it must not block.
    pub fn issue_started(&self, io: &PoolIo, flight: Flight, done: IssueDone) {
        self.issue(io, flight, done);
    }

    /// The writes of a round (a commit started by [`Zilog::commit_start`] or
    /// [`Zilog::commit_round`]) ended: publish what is durable and settle the waiters
    /// it made durable. If it succeeded and waiters remain (and no blocking commit
    /// waits for the role) the role stays held and `again` asks for the next round;
    /// otherwise the role is released and the rest are told to commit blocking.
    pub fn finish_async(&self, io: &PoolIo, flight: Flight, result: Result<()>) -> RoundEnd {
        let outcome = self.finish(io, flight, result);
        let (settled, again) = self.settle_waiters(outcome == CommitOutcome::Durable);
        RoundEnd { outcome, settled, again }
    }

    /// The next round of a chain (the role is held, from `finish_async`'s `again`):
    /// take every pending itx and pack it, as `commit_start` does.
    pub fn commit_round(&self, io: &PoolIo, synced: Txg, open_txg: OpenTxg<'_>, new_guid: &dyn Fn() -> u64, admit_normal: AdmitLogBlock<'_>, data_policy: DataPolicy) -> RoundStart {
        debug_assert!(self.issuer.lock().busy, "a round runs with the issuer role held");
        self.stats.zil_commit_writer_count.fetch_add(1, Ordering::Relaxed);
        match self.prepare(io, synced, open_txg, new_guid, admit_normal, data_policy) {
            Prepared::Issue(flight) => RoundStart::Issue(flight),
            Prepared::Outcome(_) => RoundStart::Ended(self.settle_waiters(false).0),
        }
    }

    /// End a chain of rounds without another one (the volume cannot commit without
    /// blocking now): release the role; waiters not yet durable commit blocking.
    pub fn abandon_round(&self) -> SettledWaiters {
        self.settle_waiters(false).0
    }

    /// Settle the queued waiters against the durable sequence number: the durable ones
    /// are returned as `Durable`. With `keep_role` and waiters left (and no blocking
    /// commit waiting) the role stays held (`true`); otherwise it is released and the
    /// rest are returned as `CommitBlocking`. The caller calls them, outside the lock.
    fn settle_waiters(&self, keep_role: bool) -> (SettledWaiters, bool) {
        let mut st = self.issuer.lock();
        debug_assert!(st.busy, "waiters are settled by the holder of the issuer role");
        let durable = self.durable_seq.load(Ordering::Acquire);
        let mut settled = Vec::new();
        let mut left = VecDeque::new();
        for (target, w) in std::mem::take(&mut st.waiters) {
            if target <= durable {
                settled.push((w, Waited::Durable));
            } else {
                left.push_back((target, w));
            }
        }
        if keep_role && !left.is_empty() && st.blocking == 0 {
            st.waiters = left;
            return (settled, true);
        }
        settled.extend(left.into_iter().map(|(_, w)| (w, Waited::CommitBlocking)));
        st.busy = false;
        drop(st);
        self.issuer_cv.notify_all();
        (settled, false)
    }

    /// The issuer role, waiting for it however long a chain of rounds holds it.
    fn issuer_acquire_role(&self) -> IssuerRole<'_> {
        loop {
            // no sequence number reaches u64::MAX, so this returns the first time
            if let Some(role) = self.issuer_acquire(u64::MAX) {
                return role;
            }
        }
    }

    /// The issuer role, waiting for it; `None` when every itx through `target` became
    /// durable meanwhile (a chain of rounds may hold the role for long; it is not
    /// waited out when it already wrote ours).
    fn issuer_acquire(&self, target: u64) -> Option<IssuerRole<'_>> {
        let mut st = self.issuer.lock();
        st.blocking += 1;
        while st.busy {
            if target <= self.durable_seq.load(Ordering::Acquire) {
                st.blocking -= 1;
                return None;
            }
            self.issuer_cv.wait(&mut st);
        }
        st.blocking -= 1;
        st.busy = true;
        Some(IssuerRole(self))
    }

    /// Give the role up (a blocking commit, `evacuate`, or a `commit_start` that ended
    /// without writing): waiters queued meanwhile are settled.
    fn issuer_release(&self) {
        for (w, how) in self.settle_waiters(false).0 {
            w(how);
        }
    }

    /// The issuer's work up to the device writes: take every pending itx, write the
    /// indirect ones' blocks in place (dmu_sync), pack the records into lwbs. Ends
    /// early when there is nothing to write or the log cannot take it.
    fn prepare(&self, io: &PoolIo, synced: Txg, open_txg: OpenTxg<'_>, new_guid: &dyn Fn() -> u64, admit_normal: AdmitLogBlock<'_>, data_policy: DataPolicy) -> Prepared {
        let (seq, pending, overflow) = self.take_pending(synced);
        // Read after taking the itxs (see OpenTxg): at least the txg of each of them.
        let open = open_txg();
        debug_assert!(pending.iter().all(|p| p.txg() <= open), "an itx of a txg newer than the open one");
        if !overflow.is_zero() {
            return Prepared::Outcome(CommitOutcome::NeedTxgSync(overflow.max(open)));
        }
        if pending.is_empty() {
            return Prepared::Outcome(self.durable_through(seq, synced));
        }
        if let Some(outcome) = self.chain_gate(io, seq, open, new_guid, admit_normal) {
            if let CommitOutcome::NeedTxgSync(t) = outcome {
                self.fall_back(seq, t);
            }
            return Prepared::Outcome(outcome);
        }
        // The commit's buffers hold a copy of every byte it logs, on top of the dirty
        // data that holds them too: a commit of much data (a flush after a long burst
        // of writes, up to the dirty limit) waits for the txg sync instead, which
        // writes them anyway (once, not twice).
        let max = ZILLA_ZIL_COMMIT_BYTES_MAX.get();
        if max > 0 && pending.iter().map(Pending::copy_bytes).sum::<u64>() > max {
            self.stats.zil_commit_txg_fallback_count.fetch_add(1, Ordering::Relaxed);
            self.fall_back(seq, open);
            return Prepared::Outcome(CommitOutcome::NeedTxgSync(open));
        }
        let (records, data) = self.dmu_sync_all(io, pending, data_policy, admit_normal);
        match self.plan_lwbs(io, &records, admit_normal) {
            Ok(lwbs) => Prepared::Issue(Flight { seq, synced, open, lwbs, data, started_ns: io.env().now_ns() }),
            Err(e) => {
                let flight = Flight { seq, synced, open, lwbs: Vec::new(), data, started_ns: io.env().now_ns() };
                Prepared::Outcome(self.finish(io, flight, Err(e)))
            }
        }
    }

    /// After the writes of `flight`: mark its lwbs written and publish the durable
    /// sequence number, or, when they failed, abandon the chain and fall back to a txg
    /// sync.
    fn finish(&self, io: &PoolIo, flight: Flight, result: Result<()>) -> CommitOutcome {
        if result.is_ok() {
            self.last_lwb_latency_ns.store(io.env().now_ns().saturating_sub(flight.started_ns), Ordering::Relaxed);
            self.lwbs_written(io, &flight.lwbs);
        }
        self.dmu_sync_done(io, &flight.data, result.is_ok());
        match result {
            Ok(()) => self.durable_through(flight.seq, flight.synced),
            Err(e) => {
                if !matches!(e, Error::NoSpace) {
                    tracing::warn!(volume = self.volume_id, "intent log write failed, falling back to a txg sync: {e}");
                }
                self.break_chain(flight.open);
                self.fall_back(flight.seq, flight.open);
                CommitOutcome::NeedTxgSync(flight.open)
            }
        }
    }

    /// The itxs through `seq` that this commit took are in durable lwbs (or it took
    /// none): they are durable, unless an earlier commit took itxs it could not log and
    /// waits for a txg sync instead (`sync_fallback`, which may hold this commit's own
    /// itxs: the waiters of a commit find its itxs gone from the lists). Then this
    /// commit waits for that txg too: returning at once acknowledged a write that was
    /// neither in the log nor in a synced txg (tests/zil.rs,
    /// a_flush_behind_a_commit_that_fell_back_waits_for_its_sync).
    fn durable_through(&self, seq: u64, synced: Txg) -> CommitOutcome {
        let (fb_seq, fb_txg) = *self.sync_fallback.lock();
        if fb_txg > synced && fb_seq > self.durable_seq.load(Ordering::Acquire) {
            return CommitOutcome::NeedTxgSync(fb_txg);
        }
        self.durable_seq.fetch_max(seq, Ordering::AcqRel);
        CommitOutcome::Durable
    }

    /// A commit took the itxs through `seq` and waits for txg `txg` to sync instead of
    /// logging them (OpenZFS: the commit waiters of a failed lwb fall back to
    /// txg_wait_synced; here the waiters are the later commits, see `durable_through`).
    fn fall_back(&self, seq: u64, txg: Txg) {
        let mut f = self.sync_fallback.lock();
        f.0 = f.0.max(seq);
        f.1 = f.1.max(txg);
    }

    /// Can the chain take records now? `Some`: how the commit ends instead (a broken
    /// chain or one whose header is not on disk yet: a txg sync; replay's own writes:
    /// durable already, the old chain holds them).
    fn chain_gate(&self, io: &PoolIo, seq: u64, open: Txg, new_guid: &dyn Fn() -> u64, admit_normal: AdmitLogBlock<'_>) -> Option<CommitOutcome> {
        let mut c = self.chain.lock();
        if c.closed {
            // the volume is gone with everything it held: nothing is left to make durable
            self.durable_seq.fetch_max(seq, Ordering::AcqRel);
            return Some(CommitOutcome::Durable);
        }
        if c.broken_at.is_some() {
            return Some(CommitOutcome::NeedTxgSync(open)); // until the sync retires it
        }
        if c.replaying.is_some() {
            // replay's own writes: the old chain still holds them until replay ends
            self.durable_seq.fetch_max(seq, Ordering::AcqRel);
            return Some(CommitOutcome::Durable);
        }
        if !c.on_disk {
            // zil_create: the header must reach disk before the chain is any use; the
            // sync that writes it also writes everything pending
            if c.next.is_none() && c.blocks.is_empty() {
                let Ok(head) = alloc_log_block(io, LWB_MIN_SIZE, admit_normal) else {
                    return Some(CommitOutcome::NeedTxgSync(open)); // no space: a txg sync
                };
                c.guid = new_guid();
                c.next = Some((head, 1));
            }
            return Some(CommitOutcome::NeedTxgSync(open));
        }
        None
    }

    /// The caller waited for the txg a commit asked for: everything up to `seq` is on
    /// disk. (Called with the sequence number noted before the wait.)
    pub fn note_synced_through(&self, seq: u64) {
        self.durable_seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// The newest itx sequence number appended so far.
    pub fn last_seq(&self) -> u64 {
        self.itxs.lock().last_seq
    }

    /// Take every pending itx newer than `synced`, in txg order, as records (indirect
    /// itxs as blocks to write in place); also the txg to sync instead when itxs were
    /// dropped for the memory bound (zero: none).
    fn take_pending(&self, synced: Txg) -> (u64, Vec<Pending>, Txg) {
        let mut l = self.itxs.lock();
        let seq = l.last_seq;
        if !l.overflowed_txg.is_zero() {
            let t = l.overflowed_txg;
            return (seq, Vec::new(), t);
        }
        let lists = std::mem::take(&mut l.by_txg);
        l.whole_blocks.clear();
        l.bytes = 0;
        drop(l);
        let mut out = Vec::new();
        for (txg, itxs) in lists.into_iter().filter(|(t, _)| *t > synced) {
            for itx in itxs {
                let len = itx.len();
                let (rtype, wr, data) = match itx.data {
                    ItxData::Copied(d) => {
                        self.stats.zil_itx_copied_count.fetch_add(1, Ordering::Relaxed);
                        self.stats.zil_itx_copied_bytes.fetch_add(d.len() as u64, Ordering::Relaxed);
                        (TX_WRITE, WR_COPIED, d)
                    }
                    ItxData::Partial { block, in_block, len } => {
                        // the commit's one copy of the write's bytes
                        self.stats.zil_itx_copied_count.fetch_add(1, Ordering::Relaxed);
                        self.stats.zil_itx_copied_bytes.fetch_add(len as u64, Ordering::Relaxed);
                        (TX_WRITE, WR_COPIED, Arc::new(AlignedBuf::copy_of(&block[in_block..in_block + len])))
                    }
                    ItxData::Block(d) => {
                        self.stats.zil_itx_needcopy_count.fetch_add(1, Ordering::Relaxed);
                        self.stats.zil_itx_needcopy_bytes.fetch_add(d.len() as u64, Ordering::Relaxed);
                        (TX_WRITE, WR_NEED_COPY, d)
                    }
                    ItxData::Truncate(_) => (TX_TRUNCATE, 0, Arc::new(AlignedBuf::zeroed(0))),
                    ItxData::Superseded => continue,
                    ItxData::Indirect(block) => {
                        self.stats.zil_itx_indirect_count.fetch_add(1, Ordering::Relaxed);
                        self.stats.zil_itx_indirect_bytes.fetch_add(block.len() as u64, Ordering::Relaxed);
                        out.push(Pending::Indirect { txg, offset: itx.offset, block });
                        continue;
                    }
                };
                out.push(Pending::Record(LogRecord { rtype, wr, txg, offset: itx.offset, len, data }));
            }
        }
        (seq, out, Txg::ZERO)
    }

    /// dmu_sync for every indirect itx of a commit: its block is prepared with the
    /// volume's checksum and compression, allocated in the normal class (admitted like
    /// a normal-class log block) and becomes a WR_INDIRECT record carrying the block
    /// pointer; its write goes out with the lwbs. A block whose txg is being synced
    /// already (that sync took its overrides), or that gets no space, is copied into
    /// the log instead (WR_NEED_COPY).
    fn dmu_sync_all(&self, io: &PoolIo, pending: Vec<Pending>, pol: DataPolicy, admit: AdmitLogBlock<'_>) -> (Vec<LogRecord>, Vec<DataWrite>) {
        let mut records = Vec::with_capacity(pending.len());
        let mut writes = Vec::new();
        for p in pending {
            let (txg, offset, block) = match p {
                Pending::Record(r) => {
                    records.push(r);
                    continue;
                }
                Pending::Indirect { txg, offset, block } => (txg, offset, block),
            };
            let len = block.len() as u64;
            if let Some((r, w)) = self.dmu_sync(io, txg, offset, &block, pol, admit) {
                records.push(r);
                writes.push(w);
                continue;
            }
            // counted as indirect when taken: it is copied after all
            self.stats.zil_itx_indirect_count.fetch_sub(1, Ordering::Relaxed);
            self.stats.zil_itx_indirect_bytes.fetch_sub(len, Ordering::Relaxed);
            self.stats.zil_itx_needcopy_count.fetch_add(1, Ordering::Relaxed);
            self.stats.zil_itx_needcopy_bytes.fetch_add(len, Ordering::Relaxed);
            records.push(LogRecord { rtype: TX_WRITE, wr: WR_NEED_COPY, txg, offset, len, data: block });
        }
        (records, writes)
    }

    /// One block written in place for txg `txg` (see `dmu_sync_all`); `None`: copy it
    /// into the log instead. Until [`Zilog::dmu_sync_done`] the sync of `txg` waits for
    /// it in `overrides_for_sync`.
    fn dmu_sync(&self, io: &PoolIo, txg: Txg, offset: u64, block: &Arc<AlignedBuf>, pol: DataPolicy, admit: AdmitLogBlock<'_>) -> Option<(LogRecord, DataWrite)> {
        {
            let mut o = self.overrides.lock();
            if txg <= o.closed_through {
                return None;
            }
            *o.in_flight.entry(txg).or_default() += 1;
        }
        // always a real checksum: replay tells a block the commit wrote from one it
        // did not (a cut before the flush) only by it; with checksum=off whatever the
        // space held (zeros, another volume's freed data) "verified" and was replayed
        // as the write (tests/zil.rs, an_unwritten_indirect_block_of_a_checksum_off_volume_is_not_replayed)
        let algo = if pol.algo == ChecksumAlgo::Off { ChecksumAlgo::Fletcher4 } else { pol.algo };
        let p = crate::zio::prepare(block, algo, pol.comp, io.alloc_unit());
        // allocated and listed under one lock: a volume destroyed meanwhile
        // (`take_all_blocks`) frees every block listed, and no other is allocated
        let mut o = self.overrides.lock();
        let dva = if admit(p.asize()) { io.ms.alloc_log(Role::Normal, p.asize(), Purpose::Data).ok() } else { None };
        let Some(dva) = dva else {
            o.end_in_flight(txg);
            drop(o);
            self.overrides_cv.notify_all();
            return None;
        };
        let bp = BlockPointer {
            dva: [dva, Dva::default(), Dva::default()],
            lsize: p.lsize,
            psize: p.psize,
            birth: txg,
            fill: 1,
            checksum_code: p.algo.code(),
            compression_code: p.compression.code(),
            kind: crate::block::blkptr::KIND_DATA,
            level: 0,
            checksum: p.checksum,
        };
        let blkid = crate::BlockId(offset / block.len() as u64);
        o.blocks.insert(dva, DmuSynced { txg, blkid, data: block.clone(), bp, durable: false });
        if let Some(older) = o.latest.insert((txg, blkid), dva) {
            if let Some(b) = o.blocks.get_mut(&older) {
                b.data = Arc::new(AlignedBuf::zeroed(0)); // superseded: never matches, freed by the sync
            }
        }
        drop(o);
        let record = LogRecord { rtype: TX_WRITE, wr: WR_INDIRECT, txg, offset, len: block.len() as u64, data: Arc::new(AlignedBuf::copy_of(&bp.encode())) };
        Some((record, DataWrite { dva, txg, data: p.data }))
    }

    /// The commit's writes ended; `durable`: its lwbs and the blocks written in place
    /// are written and flushed, so the blocks are referenced (by durable log records)
    /// and a sync may use them. Blocks of a failed commit stay allocated until the
    /// sync of their txg frees them.
    fn dmu_sync_done(&self, io: &PoolIo, writes: &[DataWrite], durable: bool) {
        if writes.is_empty() {
            return;
        }
        let mut o = self.overrides.lock();
        for w in writes {
            if durable {
                if let Some(b) = o.blocks.get_mut(&w.dva) {
                    b.durable = true;
                }
                io.ms.log_referenced(&w.dva);
            }
            o.end_in_flight(w.txg);
        }
        drop(o);
        self.overrides_cv.notify_all();
    }

    /// Syncing context of `txg` (dbuf_sync_leaf's override check): the blocks commits
    /// wrote in place for dirty versions of txgs up to `txg`, after waiting for those
    /// still being written. From now on no commit writes one for these txgs (it copies
    /// the block into the log instead), so every such block is decided by this sync:
    /// used as the new block pointer when the dirty version is still the one written
    /// ([`DmuSynced::matches`]), else freed ([`Zilog::free_unused_overrides`]).
    /// Nothing changes in memory until [`Zilog::synced`], so a retried sync gets the
    /// same list.
    pub fn overrides_for_sync(&self, txg: Txg) -> Vec<DmuSynced> {
        let mut o = self.overrides.lock();
        o.closed_through = o.closed_through.max(txg);
        while o.in_flight.range(..=txg).next().is_some() {
            self.overrides_cv.wait(&mut o);
        }
        let mut out: Vec<DmuSynced> = o.blocks.values().filter(|b| b.txg <= txg).cloned().collect();
        out.sort_by_key(|b| (b.blkid, b.bp.dva[0].offset));
        out
    }

    /// Free, in `txg`, the blocks of `list` the sync did not use (`used[i]` false): a
    /// dirty version rewritten after its commit, or a commit that failed.
    pub fn free_unused_overrides(io: &PoolIo, list: &[DmuSynced], used: &[bool], txg: Txg) {
        for (b, _) in list.iter().zip(used).filter(|(_, u)| !**u) {
            io.ms.log_referenced(&b.bp.dva[0]); // a deferred free names allocated space
            io.ms.free_deferred(txg, b.bp.dva[0]);
        }
    }

    /// Pack `records` into lwbs continuing the chain (each with its successor
    /// allocated); they are in the chain's list, not yet written.
    fn plan_lwbs(&self, io: &PoolIo, records: &[LogRecord], admit_normal: AdmitLogBlock<'_>) -> Result<Vec<(ChainBlock, Arc<AlignedBuf>)>> {
        let payload: usize = records.iter().flat_map(pieces).map(|p| p.encoded_len()).sum();
        let max_block = ZIL_MAXBLOCKSIZE.get() as usize;
        let mut planned: Vec<(ChainBlock, Arc<AlignedBuf>)> = Vec::new();
        {
            let mut c = self.chain.lock();
            let slot = c.recent_commits % ZIL_PREV_COMMITS;
            c.recent_commit_bytes[slot] = payload.min(u32::MAX as usize) as u32;
            c.recent_commits += 1;
            let mut rest = records.iter().flat_map(pieces).peekable();
            let mut left = payload;
            while rest.peek().is_some() {
                let (ptr, seq) = c.next.ok_or_else(|| Error::Corrupt("log chain has no next block".into()))?;
                let cap = ptr.dva.asize as usize - LWB_HEADER_SIZE;
                let mut body: Vec<Piece<'_>> = Vec::new();
                let mut body_len = 0;
                let mut max_txg = Txg::ZERO;
                while let Some(r) = rest.peek() {
                    if body_len + r.encoded_len() > cap {
                        break;
                    }
                    body_len += r.encoded_len();
                    max_txg = max_txg.max(r.txg);
                    body.extend(rest.next());
                }
                left = left.saturating_sub(body_len);
                // the successor holds what is left of this commit; after the last block
                // of a commit, the largest of the recent commits (zil_lwb_predict): a
                // burst after small commits then still takes one lwb, and since an lwb
                // is written only as far as it is used, a large block costs a small
                // commit nothing but space until the next sync frees it
                let need = (left + LWB_HEADER_SIZE).next_multiple_of(LWB_MIN_SIZE).clamp(LWB_MIN_SIZE, max_block);
                let predicted = (c.recent_commit_bytes.iter().copied().max().unwrap_or(0) as usize + LWB_HEADER_SIZE)
                    .next_multiple_of(LWB_MIN_SIZE)
                    .clamp(LWB_MIN_SIZE, max_block);
                let want = if left > 0 { need } else { predicted };
                // a log class too full for the prediction still takes what is needed
                // (a commit then spans more lwbs) before the log moves to the normal class
                let succ = alloc_log_block_sized(io, want, need, admit_normal, Some(&self.stats))?;
                c.next = Some((succ, seq + 1));
                // encoded straight into the buffer the write takes: one copy of the data
                let mut block = AlignedBuf::zeroed(lwb_written_len(&ptr, body_len, io.alloc_unit() as usize));
                fill_lwb(&mut block, c.guid, self.volume_id, seq, &succ, body_len, |out| {
                    let mut at = 0;
                    for p in &body {
                        at += p.encode_into(&mut out[at..]);
                    }
                });
                let cb = ChainBlock { ptr, seq, max_txg, written: false, records: body.len() as u32, record_bytes: body_len as u32 };
                debug_assert!(c.blocks.back().is_none_or(|b| b.seq + 1 == cb.seq), "chain blocks are one seq apart");
                c.blocks.push_back(cb);
                planned.push((cb, Arc::new(block)));
            }
        }
        Ok(planned)
    }

    /// The lwbs of a commit are written and flushed: each is referenced by the chain,
    /// and so is the successor of the last.
    fn lwbs_written(&self, io: &PoolIo, planned: &[(ChainBlock, Arc<AlignedBuf>)]) {
        let mut c = self.chain.lock();
        for (cb, _) in planned {
            if let Some(b) = c.block_mut(cb.seq) {
                b.written = true;
            }
            // its successor is now referenced by a durable block
            io.ms.log_referenced(&cb.ptr.dva);
        }
        if let Some((succ, _)) = c.next {
            if planned.last().is_some() {
                io.ms.log_referenced(&succ.dva);
            }
        }
    }

    /// Write the planned lwbs of `flight`, and the blocks written in place for its
    /// WR_INDIRECT records, and flush the devices that took them: per top-level vdev
    /// one write-then-flush run (each child flushes as soon as its own writes
    /// completed, in that completion), all vdevs at once. Ok when every vdev has at
    /// least one child holding all of its blocks. A child whose write failed is not
    /// flushed and does not count (a flush issued before a child's write failed must
    /// not count it as holding the lwb: device_faults row 1). `done` runs once, on the
    /// engine thread that completes the last run (or here, when nothing could be
    /// submitted), and gets the flight back.
    fn issue(&self, io: &PoolIo, flight: Flight, done: IssueDone) {
        match self.writes_for(io, &flight.lwbs, flight.open, &flight.data) {
            Ok(runs) => submit_runs(runs, Box::new(move |r| done(flight, r))),
            Err(e) => done(flight, Err(e)),
        }
    }

    /// The write-then-flush runs of a commit, per top-level vdev (see `issue`).
    fn writes_for(&self, io: &PoolIo, planned: &[(ChainBlock, Arc<AlignedBuf>)], open: Txg, data: &[DataWrite]) -> Result<Vec<(Arc<crate::vdev::mirror::TopVdev>, Vec<BlockWrite>)>> {
        let mut per_top: Vec<(Arc<crate::vdev::mirror::TopVdev>, Vec<BlockWrite>)> = Vec::new();
        let mut add = |top: Arc<crate::vdev::mirror::TopVdev>, w: BlockWrite| match per_top.iter_mut().find(|(t, _)| t.id == top.id) {
            Some((_, blocks)) => blocks.push(w),
            None => per_top.push((top, vec![w])),
        };
        for (cb, block) in planned {
            let top = io.top(cb.ptr.dva.vdev).ok_or_else(|| Error::Corrupt(format!("log block on unknown vdev {}", cb.ptr.dva.vdev)))?;
            self.count_lwb(top.role == Role::Log, cb, block.len());
            add(top, BlockWrite { offset: cb.ptr.dva.offset, data: block.clone(), txg: open });
        }
        for w in data {
            let top = io.top(w.dva.vdev).ok_or_else(|| Error::Corrupt(format!("data block on unknown vdev {}", w.dva.vdev)))?;
            add(top, BlockWrite { offset: w.dva.offset, data: Arc::new(AlignedBuf::copy_of(&w.data)), txg: w.txg });
        }
        Ok(per_top)
    }

    /// `issue` for the few lwbs of `evacuate`, waiting for them.
    fn issue_lwbs_blocking(&self, io: &PoolIo, planned: &[(ChainBlock, Arc<AlignedBuf>)], open: Txg) -> Result<()> {
        let runs = self.writes_for(io, planned, open, &[])?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        submit_runs(runs, Box::new(move |r| {
            let _ = tx.send(r);
        }));
        rx.recv().map_err(|_| Error::Io(std::io::Error::other("intent log write completion lost")))?
    }

    fn count_lwb(&self, slog: bool, cb: &ChainBlock, block_bytes: usize) {
        let st = &self.stats;
        let (count, bytes, write) = if slog {
            (&st.zil_itx_metaslab_slog_count, &st.zil_itx_metaslab_slog_bytes, &st.zil_itx_metaslab_slog_write)
        } else {
            (&st.zil_itx_metaslab_normal_count, &st.zil_itx_metaslab_normal_bytes, &st.zil_itx_metaslab_normal_write)
        };
        count.fetch_add(cb.records as u64, Ordering::Relaxed);
        bytes.fetch_add(cb.record_bytes as u64, Ordering::Relaxed);
        write.fetch_add(block_bytes as u64, Ordering::Relaxed);
        st.zil_lwb_write_count.fetch_add(1, Ordering::Relaxed);
    }

    /// A log block could not be allocated or written: the chain ends before it (a
    /// block the device did not take never verifies, and replay stops there). Nothing
    /// in memory says it was written; the chain takes no more records and is retired by
    /// the sync of `open` (every record in it is of txg `open` or older), which the
    /// caller waits for instead.
    fn break_chain(&self, open: Txg) {
        let mut c = self.chain.lock();
        c.broken_at = Some(c.broken_at.map_or(open, |b| b.max(open)));
    }

    /// Syncing context of txg `txg`: the header to write and the blocks freed in
    /// `txg` (passed to `free`). Nothing changes in memory until [`Zilog::synced`].
    pub fn header_for_sync(&self, io: &PoolIo, txg: Txg, free: &mut dyn FnMut(Dva)) -> (ZilHeader, SyncToken) {
        let c = self.chain.lock();
        let mut tok = SyncToken { txg, ..Default::default() };
        if let Some(h) = c.replaying {
            return (h, tok);
        }
        for p in &c.to_free {
            io.ms.log_referenced(&p.dva); // a deferred free names allocated space
            free(p.dva);
        }
        tok.freed_orphans = c.to_free.len();
        if c.broken_at.is_some_and(|b| txg >= b) {
            // every record of the broken chain is in this txg or an older one
            for d in c.blocks.iter().map(|b| b.ptr).chain(c.next.map(|(p, _)| p)) {
                io.ms.log_referenced(&d.dva);
                free(d.dva);
            }
            tok.retired_broken = true;
            return (ZilHeader::default(), tok);
        }
        for b in &c.blocks {
            if !b.written || b.max_txg > txg {
                break;
            }
            free(b.ptr.dva);
            tok.freed_blocks += 1;
        }
        let head = match c.blocks.get(tok.freed_blocks) {
            Some(b) => Some((b.ptr, b.seq)),
            None => c.next,
        };
        let Some((ptr, seq)) = head else {
            return (ZilHeader::default(), tok);
        };
        // the header references it from now on: it belongs in the space maps
        io.ms.log_referenced(&ptr.dva);
        tok.names_chain = true;
        (ZilHeader { guid: c.guid, head: ptr, head_seq: seq, claim_txg: Txg::ZERO }, tok)
    }

    /// Txg `tok.txg` is on disk: drop the blocks it freed and its itxs.
    pub fn synced(&self, tok: SyncToken) {
        {
            let mut c = self.chain.lock();
            let n = tok.freed_orphans.min(c.to_free.len());
            c.to_free.drain(..n);
            for _ in 0..tok.freed_blocks {
                c.blocks.pop_front();
            }
            if tok.retired_broken {
                let to_free = std::mem::take(&mut c.to_free);
                *c = Chain { to_free, ..Chain::default() };
            }
            if tok.names_chain {
                c.on_disk = true;
            }
        }
        {
            let mut o = self.overrides.lock();
            o.blocks.retain(|_, b| b.txg > tok.txg);
            o.latest.retain(|(t, _), _| *t > tok.txg);
        }
        let mut l = self.itxs.lock();
        let keep = l.by_txg.split_off(&tok.txg.next());
        l.by_txg = keep;
        let synced = tok.txg;
        l.whole_blocks.retain(|_, (t, _)| *t > synced);
        l.bytes = l.by_txg.values().flatten().map(|i| i.mem_bytes()).sum();
        if !l.overflowed_txg.is_zero() && l.overflowed_txg <= tok.txg {
            l.overflowed_txg = Txg::ZERO;
        }
    }

    /// Does the chain (or a block waiting to be freed) lie on top-level vdev `vdev`?
    pub fn references_vdev(&self, vdev: crate::VdevId) -> bool {
        let c = self.chain.lock();
        c.replaying.is_some_and(|h| h.head.dva.vdev == vdev)
            || c.blocks.iter().any(|b| b.ptr.dva.vdev == vdev)
            || c.next.is_some_and(|(p, _)| p.dva.vdev == vdev)
            || c.to_free.iter().any(|p| p.dva.vdev == vdev)
    }

    /// Log device removal: move the chain's tail off top-level vdev `vdev` (which
    /// takes no new allocations any more). When the pre-allocated next block lies on
    /// it, an lwb without records is written there pointing to a block allocated
    /// elsewhere; the syncs that follow free it with the blocks before it. Returns
    /// false when the header naming the chain is not on disk yet (the caller syncs and
    /// asks again).
    pub fn evacuate(&self, io: &PoolIo, vdev: crate::VdevId, open_txg: OpenTxg<'_>, admit_normal: AdmitLogBlock<'_>) -> Result<bool> {
        let _issuer = self.issuer_acquire_role();
        // Read with the role held (see OpenTxg): the chain's records are all of txgs
        // up to it, so breaking the chain at it is safe.
        let open = open_txg();
        let planned = {
            let mut c = self.chain.lock();
            if c.replaying.is_some() {
                return Err(Error::Busy("the intent log is being replayed".into()));
            }
            if c.broken_at.is_some() {
                return Ok(false); // the next syncs retire it
            }
            let Some((ptr, seq)) = c.next.filter(|(p, _)| p.dva.vdev == vdev) else { return Ok(true) };
            if !c.on_disk {
                return Ok(false);
            }
            let succ = alloc_log_block(io, LWB_MIN_SIZE, admit_normal)?;
            c.next = Some((succ, seq + 1));
            let cb = ChainBlock { ptr, seq, max_txg: Txg::ZERO, written: false, records: 0, record_bytes: 0 };
            debug_assert!(c.blocks.back().is_none_or(|b| b.seq + 1 == cb.seq), "chain blocks are one seq apart");
            c.blocks.push_back(cb);
            vec![(cb, Arc::new(AlignedBuf::copy_of(&encode_lwb(&ptr, c.guid, self.volume_id, seq, &succ, &[]))))]
        };
        if let Err(e) = self.issue_lwbs_blocking(io, &planned, open) {
            self.break_chain(open);
            return Err(e);
        }
        let mut c = self.chain.lock();
        if let Some(b) = c.block_mut(planned[0].0.seq) {
            b.written = true;
        }
        io.ms.log_referenced(&planned[0].0.ptr.dva);
        if let Some((succ, _)) = c.next {
            io.ms.log_referenced(&succ.dva);
        }
        Ok(true)
    }

    /// Every log block this volume's log holds allocated (the chain, its allocated
    /// successor, blocks waiting to be freed): the space check counts them as used.
    pub fn held_blocks(&self) -> Vec<Dva> {
        let c = self.chain.lock();
        let mut out: Vec<Dva> = c.blocks.iter().map(|b| b.ptr.dva).collect();
        out.extend(c.next.map(|(p, _)| p.dva));
        out.extend(c.to_free.iter().map(|p| p.dva));
        drop(c);
        out.extend(self.overrides.lock().blocks.keys().copied());
        out
    }

    /// The volume is destroyed: forget the chain and return every block it held, for
    /// the caller to free with the sync that removes the volume.
    pub fn take_all_blocks(&self) -> Vec<Dva> {
        let blocks = self.held_blocks();
        *self.chain.lock() = Chain { closed: true, ..Chain::default() };
        let mut o = self.overrides.lock();
        o.blocks.clear();
        o.latest.clear();
        drop(o);
        blocks
    }

    /// Import: replay of the chain `hdr` (with its claim txg set) begins; syncs keep
    /// writing `hdr` until [`Zilog::end_replay`].
    pub fn begin_replay(&self, hdr: ZilHeader) {
        self.chain.lock().replaying = Some(hdr);
    }

    /// Import: replay is applied (not yet synced); the claimed blocks are freed by the
    /// next sync, which writes an empty header in the same txg as the replayed writes
    /// or a later one.
    pub fn end_replay(&self, blocks: Vec<LogPtr>) {
        let mut c = self.chain.lock();
        c.replaying = None;
        c.to_free.extend(blocks);
    }
}

/// Submit write-then-flush runs, one per top-level vdev, all at once; `done` gets the
/// first error, or Ok when every run has a child holding all of its blocks, from the
/// completion of the last run.
fn submit_runs(runs: Vec<(Arc<crate::vdev::mirror::TopVdev>, Vec<BlockWrite>)>, done: Box<dyn FnOnce(Result<()>) + Send>) {
    if runs.is_empty() {
        return done(Ok(()));
    }
    let total: u64 = runs.iter().flat_map(|(_, b)| b.iter()).map(|b| b.data.len() as u64).sum();
    let class = if total > ZIL_SLOG_BULK.get() { IoClass::AsyncWrite } else { IoClass::SyncWrite };
    let flush = ZIL_NOCACHEFLUSH.get() == 0;
    struct Gather {
        left: usize,
        first_err: Option<Error>,
        done: Option<Box<dyn FnOnce(Result<()>) + Send>>,
    }
    let gather = Arc::new(Mutex::new(Gather { left: runs.len(), first_err: None, done: Some(done) }));
    for (top, blocks) in runs {
        let gather = gather.clone();
        top.write_blocks_then_flush(class, blocks, flush, Box::new(move |o| {
            let mut g = gather.lock();
            if let (Err(e), None) = (o.into_result(), &g.first_err) {
                g.first_err = Some(Error::Io(e.into()));
            }
            g.left -= 1;
            if g.left > 0 {
                return;
            }
            let (done, err) = (g.done.take(), g.first_err.take());
            drop(g);
            if let Some(done) = done {
                done(err.map_or(Ok(()), Err));
            }
        }));
    }
}

/// Allocate a log block: log class first, then normal. Unreferenced until its
/// referrer is durable. In the normal class the block must first pass `admit_normal`
/// (the volume's space admission: the block leaves the sync's slop free and is counted
/// against what later writes are admitted into): log blocks are freed only by a sync,
/// so a log that took the space a sync needs could never give it back (the enospc.rs
/// hang). Refused: NoSpace, and the commit waits for a txg instead (as zil_commit_writer
/// does when zio_alloc_zil fails).
fn alloc_log_block(io: &PoolIo, len: usize, admit_normal: AdmitLogBlock<'_>) -> Result<LogPtr> {
    alloc_log_block_sized(io, len, len, admit_normal, None)
}

/// A log block of `want` bytes, or of `need` (<= want) when the log class cannot give
/// `want`: the slog is tried at both sizes before the normal class gets `need`.
fn alloc_log_block_sized(io: &PoolIo, want: usize, need: usize, admit_normal: AdmitLogBlock<'_>, stats: Option<&ZilStats>) -> Result<LogPtr> {
    // the pool's allocation unit (a power of two, 4 KiB up to the largest ashift), so a
    // log block starts and ends on its vdev's sectors
    let unit = io.alloc_unit().max(LWB_MIN_SIZE as u64);
    let (want, need) = ((want as u64).next_multiple_of(unit), (need.min(want) as u64).next_multiple_of(unit));
    if log_class_usable(io) {
        // the prediction only while the log class is at most 3/4 full: log blocks stay
        // allocated until their txg syncs and two more pass (deferred frees), so a
        // small slog under a stream of commits would otherwise fill with the unwritten
        // tails of predicted blocks and send commits to the normal class
        let (size, allocated) = io.ms.space(Role::Log);
        let roomy = allocated.saturating_mul(4) <= size.saturating_mul(3);
        let sizes: &[u64] = if want > need && roomy { &[want, need] } else { &[need] };
        for &len in sizes {
            if let Ok(d) = io.ms.alloc_log(Role::Log, len, Purpose::IntentLog) {
                return Ok(LogPtr { dva: d });
            }
        }
        if let Some(st) = stats {
            st.zil_lwb_slog_full_count.fetch_add(1, Ordering::Relaxed);
        }
    }
    if !admit_normal(want) {
        return Err(Error::NoSpace);
    }
    Ok(LogPtr { dva: io.ms.alloc_log(Role::Normal, want, Purpose::IntentLog)? })
}

/// The pool has log vdevs and each can take a log block: some online child has not
/// failed a write since the last `pool clear`. A log vdev without one is left alone
/// (the normal class takes the log blocks) until `zilla pool clear` resets the error
/// counts.
fn log_class_usable(io: &PoolIo) -> bool {
    let tops: Vec<_> = io.vdevs.read().iter().filter(|t| t.role == Role::Log).cloned().collect();
    !tops.is_empty()
        && tops.iter().all(|t| t.children().iter().any(|c| c.readable() && c.write_errors.load(Ordering::Relaxed) == 0))
}

/// A record longer than fits an lwb of the largest size is split.
/// A record as it goes into an lwb: a whole record, or a piece of a write too large
/// for one block (its bytes borrowed from the record, not copied).
#[derive(Debug, Clone, Copy)]
struct Piece<'a> {
    rtype: u8,
    wr: u8,
    txg: Txg,
    offset: u64,
    len: u64,
    data: &'a [u8],
}

impl Piece<'_> {
    /// Header and data padded to 8 bytes.
    fn encoded_len(&self) -> usize {
        RECORD_HEADER_SIZE + self.data.len().div_ceil(8) * 8
    }

    /// Encode into the start of `out` (at least `encoded_len` bytes, the padding
    /// already zero); returns the bytes used.
    fn encode_into(&self, out: &mut [u8]) -> usize {
        let n = self.encoded_len();
        out[0] = self.rtype;
        out[1] = self.wr;
        out[2..4].fill(0);
        out[4..8].copy_from_slice(&(n as u32).to_le_bytes());
        out[8..16].copy_from_slice(&self.txg.get().to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.len.to_le_bytes());
        out[32..40].copy_from_slice(&(self.data.len() as u64).to_le_bytes());
        out[RECORD_HEADER_SIZE..RECORD_HEADER_SIZE + self.data.len()].copy_from_slice(self.data);
        n
    }
}

/// The pieces `r` is written as: itself, or for a write larger than fits a block,
/// pieces of at most a block's payload (whole 512-byte units).
fn pieces(r: &LogRecord) -> Vec<Piece<'_>> {
    let max = ZIL_MAXBLOCKSIZE.get() as usize - LWB_HEADER_SIZE - RECORD_HEADER_SIZE;
    let max = max / 512 * 512;
    let whole = Piece { rtype: r.rtype, wr: r.wr, txg: r.txg, offset: r.offset, len: r.len, data: &r.data };
    if r.rtype != TX_WRITE || r.data.len() <= max {
        return vec![whole];
    }
    r.data
        .chunks(max)
        .enumerate()
        .map(|(i, c)| Piece { offset: r.offset + (i * max) as u64, len: c.len() as u64, data: c, ..whole })
        .collect()
}

pub fn encode_record(r: &LogRecord, out: &mut Vec<u8>) {
    let p = Piece { rtype: r.rtype, wr: r.wr, txg: r.txg, offset: r.offset, len: r.len, data: &r.data };
    let at = out.len();
    out.resize(at + p.encoded_len(), 0);
    p.encode_into(&mut out[at..]);
}

/// An lwb of `at.asize` bytes: header (verifier, next pointer, embedded checksum) and
/// the records in `body`.
pub fn encode_lwb(at: &LogPtr, guid: u64, volume_id: u64, seq: u64, next: &LogPtr, body: &[u8]) -> Vec<u8> {
    encode_lwb_in(at, guid, volume_id, seq, next, body, at.dva.asize as usize)
}

/// An lwb written only as far as its records reach, rounded up to `write_unit` (the
/// pool's allocation unit, so the write stays on whole sectors): a block allocated
/// large for a burst costs only what a small commit put in it (OpenZFS writes the used
/// part of an lwb the same way). The written length is in the header and the checksum
/// covers exactly it; the rest of the block is not written and never read as records.
pub fn encode_lwb_in(at: &LogPtr, guid: u64, volume_id: u64, seq: u64, next: &LogPtr, body: &[u8], write_unit: usize) -> Vec<u8> {
    let mut b = vec![0; lwb_written_len(at, body.len(), write_unit)];
    fill_lwb(&mut b, guid, volume_id, seq, next, body.len(), |out| out.copy_from_slice(body));
    b
}

/// The bytes of block `at` an lwb with `body_len` bytes of records writes (see
/// [`encode_lwb_in`]).
fn lwb_written_len(at: &LogPtr, body_len: usize, write_unit: usize) -> usize {
    let block_len = at.dva.asize as usize;
    let used = (LWB_HEADER_SIZE + body_len).next_multiple_of(write_unit.max(512));
    used.clamp(LWB_MIN_SIZE.min(block_len), block_len)
}

/// Fill `b`, the written part of an lwb (zeroed, [`lwb_written_len`] bytes): the
/// header, `body_len` bytes of records put in place by `body`, the checksum.
fn fill_lwb(b: &mut [u8], guid: u64, volume_id: u64, seq: u64, next: &LogPtr, body_len: usize, body: impl FnOnce(&mut [u8])) {
    let mut h = Vec::with_capacity(LWB_CKSUM_AT);
    h.extend_from_slice(&LWB_MAGIC.to_le_bytes());
    h.extend_from_slice(&guid.to_le_bytes());
    h.extend_from_slice(&volume_id.to_le_bytes());
    h.extend_from_slice(&seq.to_le_bytes());
    h.extend_from_slice(&(body_len as u32).to_le_bytes());
    h.extend_from_slice(&(b.len() as u32).to_le_bytes());
    next.encode(&mut h);
    debug_assert_eq!(h.len(), LWB_CKSUM_AT);
    b[..LWB_CKSUM_AT].copy_from_slice(&h);
    body(&mut b[LWB_HEADER_SIZE..LWB_HEADER_SIZE + body_len]);
    let ck = lwb_checksum(b);
    b[LWB_CKSUM_AT..LWB_CKSUM_AT + 32].copy_from_slice(&ck);
}

/// Fletcher-4 of the block with the checksum field zeroed, plus the block's address
/// folded in (a copy read from elsewhere never verifies).
fn lwb_checksum(block: &[u8]) -> [u8; 32] {
    let mut words = fletcher4(&block[..LWB_CKSUM_AT]);
    let tail = fletcher4(&block[LWB_CKSUM_AT + 32..]);
    let mut out = [0u8; 32];
    for i in 0..4 {
        words[i] = words[i].wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(tail[i]);
        out[i * 8..i * 8 + 8].copy_from_slice(&words[i].to_le_bytes());
    }
    out
}

/// Recompute the embedded checksum of an lwb over the bytes its `written` field covers
/// (0: the whole block), as [`fill_lwb`] does: tools and tests that rewrite a header
/// field reseal with it. False when the field names a length the block cannot hold.
pub fn reseal_lwb(block: &mut [u8]) -> bool {
    if block.len() < LWB_HEADER_SIZE {
        return false;
    }
    let written = match u32::from_le_bytes(block[36..40].try_into().expect("4 bytes")) as usize {
        0 => block.len(),
        n if (LWB_CKSUM_AT + 32..=block.len()).contains(&n) => n,
        _ => return false,
    };
    block[LWB_CKSUM_AT..LWB_CKSUM_AT + 32].fill(0);
    let ck = lwb_checksum(&block[..written]);
    block[LWB_CKSUM_AT..LWB_CKSUM_AT + 32].copy_from_slice(&ck);
    true
}

/// A verified lwb: its records and its successor.
#[derive(Debug)]
pub struct ParsedLwb {
    pub next: LogPtr,
    pub records: Vec<LogRecord>,
}

/// Verify an lwb against the chain's verifier (`guid`, `volume_id`, `seq`). `None`: not
/// a block of this chain at this position (the end of the chain): its header names
/// another chain or position, or its checksum does not verify over the bytes its
/// `written` field covers. A block that verifies and holds an impossible field (body
/// length, written length, next pointer, a record) is corruption: the error names the
/// field and its value.
pub fn decode_lwb(block: &[u8], guid: u64, volume_id: u64, seq: u64) -> Result<Option<ParsedLwb>> {
    if block.len() < LWB_MIN_SIZE {
        return Ok(None);
    }
    let mut r = Reader::new(block);
    if r.u64()? != LWB_MAGIC || r.u64()? != guid || r.u64()? != volume_id || r.u64()? != seq {
        return Ok(None);
    }
    let body_len = r.u32()? as usize;
    let written_field = r.u32()? as usize;
    let bad = |field: &str, v: u64| Error::Corrupt(format!("intent log block {seq} of chain {guid:#x}: field {field} = {v} is out of range"));
    // bytes written (0: the whole block, as blocks written before the field existed).
    // A block whose header names this chain and position was written for it (the
    // header is in one sector, written whole): a length it cannot hold is corruption,
    // as any other impossible field, not the end of the chain.
    let written = match written_field {
        0 => block.len(),
        n if (LWB_CKSUM_AT + 32..=block.len()).contains(&n) => n,
        n => return Err(bad("written", n as u64)),
    };
    let stored: [u8; 32] = block[LWB_CKSUM_AT..LWB_CKSUM_AT + 32].try_into().expect("32 bytes");
    let mut copy = block[..written].to_vec();
    copy[LWB_CKSUM_AT..LWB_CKSUM_AT + 32].fill(0);
    if lwb_checksum(&copy) != stored {
        return Ok(None);
    }
    if written % 512 != 0 || written < LWB_HEADER_SIZE {
        return Err(bad("written", written_field as u64));
    }
    if LWB_HEADER_SIZE + body_len > written {
        return Err(bad("body length", body_len as u64));
    }
    let next = LogPtr::decode(&mut r).map_err(|_| {
        let v = |o: usize| u32::from_le_bytes(block[o..o + 4].try_into().expect("4 bytes"));
        let off = u64::from_le_bytes(block[48..56].try_into().expect("8 bytes"));
        Error::Corrupt(format!(
            "intent log block {seq} of chain {guid:#x}: field next = vdev {} asize {:#x} offset {off:#x} is out of range",
            v(40),
            v(44)
        ))
    })?;
    let records = decode_records(&block[LWB_HEADER_SIZE..LWB_HEADER_SIZE + body_len])?;
    Ok(Some(ParsedLwb { next, records }))
}

fn decode_records(body: &[u8]) -> Result<Vec<LogRecord>> {
    let mut out = Vec::new();
    let mut r = Reader::new(body);
    while r.remaining() > 0 {
        if r.remaining() < RECORD_HEADER_SIZE {
            return Err(Error::Corrupt(format!(
                "intent log record: field body length leaves {} bytes, less than a record header",
                r.remaining()
            )));
        }
        let rtype = r.u8()?;
        let wr = r.u8()?;
        r.bytes(2)?;
        let reclen = r.u32()? as usize;
        let txg = Txg(r.u64()?);
        let offset = r.u64()?;
        let len = r.u64()?;
        let dlen_field = r.u64()?;
        let malformed = || Error::Corrupt(format!("intent log record (type {rtype}, wr {wr}, {reclen} bytes) is malformed"));
        // the data must fit in what is left of the block: checked before any rounding,
        // so a length near 2^64 cannot wrap to a small one
        if dlen_field > r.remaining() as u64 {
            return Err(Error::Corrupt(format!(
                "intent log record (type {rtype}, wr {wr}): field data length = {dlen_field} exceeds the {} bytes left in the block",
                r.remaining()
            )));
        }
        let dlen = dlen_field as usize;
        let padded = dlen.div_ceil(8) * 8;
        if reclen != RECORD_HEADER_SIZE + padded || padded > r.remaining() {
            return Err(malformed());
        }
        let data = &r.bytes(padded)?[..dlen];
        let ok = match rtype {
            TX_WRITE if wr == WR_INDIRECT => dlen == BlockPointer::SIZE && indirect_bp_ok(data, len),
            TX_WRITE => matches!(wr, WR_COPIED | WR_NEED_COPY) && dlen as u64 == len && dlen > 0,
            TX_TRUNCATE => dlen == 0,
            _ => false,
        };
        if !ok {
            return Err(malformed());
        }
        if txg.is_zero() || !txg.is_valid_on_disk() || offset.checked_add(len).is_none() {
            return Err(Error::Corrupt(format!("intent log record (type {rtype}): field txg = {txg}, offset = {offset:#x}, length = {len:#x} is out of range")));
        }
        out.push(LogRecord { rtype, wr, txg, offset, len, data: Arc::new(AlignedBuf::from(data)) });
    }
    Ok(out)
}

/// A WR_INDIRECT record's block pointer: a data block of exactly `len` logical bytes,
/// one copy.
fn indirect_bp_ok(b: &[u8], len: u64) -> bool {
    let Some(bp) = BlockPointer::decode(b) else { return false };
    !bp.is_hole() && bp.lsize as u64 == len && len > 0 && bp.level == 0 && bp.copies().count() == 1 && bp.checksum_algo().is_some() && bp.compression().is_some()
}

/// Replay: the data of a WR_INDIRECT record, read through its block pointer from the
/// first child of its vdev holding a copy that verifies. `None`: no copy verifies (or
/// none could be read): the block was not written when the log record was (a commit
/// cut short, never acknowledged), and replay of the chain ends there.
pub fn read_indirect(io: &PoolIo, bp: &BlockPointer) -> Option<Vec<u8>> {
    let dva = bp.dva[0];
    let top = io.top(dva.vdev)?;
    let mut buf = AlignedBuf::zeroed(dva.asize as usize);
    for c in top.children().iter().filter(|c| c.readable()) {
        if c.device().read_at(buf.as_mut_slice(), crate::vdev::label::DATA_START + dva.offset).is_err() {
            continue;
        }
        if !crate::zio::verify(bp, buf.as_slice()) {
            continue;
        }
        match crate::zio::finish_read(bp, buf.clone()) {
            Ok(d) if d.len() == bp.lsize as usize => return Some(d.to_vec()),
            _ => continue,
        }
    }
    None
}

/// Read the lwb at `ptr` from the first child of its vdev that holds a valid one.
/// Directly from the devices: the block after the last one never verifies, and that is
/// the end of the chain, not a checksum error to count or repair. A block no child
/// could read (every read failed) is an error: the chain may go on past it, and
/// ending it there would drop acknowledged writes. A vdev with no readable child at
/// all (its devices missing: `import -m`) ends the chain.
fn read_lwb(io: &PoolIo, ptr: &LogPtr, guid: u64, volume_id: u64, seq: u64) -> Result<Option<ParsedLwb>> {
    let Some(top) = io.top(ptr.dva.vdev) else { return Ok(None) };
    let mut buf = AlignedBuf::zeroed(ptr.dva.asize as usize);
    let mut last_err = None;
    let mut read_any = false;
    for c in top.children().iter().filter(|c| c.readable()) {
        if let Err(e) = c.device().read_at(buf.as_mut_slice(), crate::vdev::label::DATA_START + ptr.dva.offset) {
            last_err = Some(e);
            continue;
        }
        read_any = true;
        if let Some(p) = decode_lwb(buf.as_slice(), guid, volume_id, seq)? {
            return Ok(Some(p));
        }
    }
    match last_err {
        Some(e) if !read_any => Err(Error::Io(std::io::Error::new(e.kind(), format!("reading intent log block {}:{:#x}: {e}", ptr.dva.vdev, ptr.dva.offset)))),
        _ => Ok(None),
    }
}

/// A log block pointer read from a verified block (or the ZIL header) names a vdev of
/// the pool and lies within it; else the chain is corrupt (`field` says which pointer).
/// A vdev whose every device is missing (`import -m`) has no known size: only its
/// existence is checked, and the read ends the chain.
fn check_log_ptr(io: &PoolIo, ptr: &LogPtr, field: String) -> Result<()> {
    let d = ptr.dva;
    let Some(top) = io.top(d.vdev) else {
        return Err(Error::Corrupt(format!("intent log: field {field} = vdev {} offset {:#x} asize {:#x}: the pool has no vdev {}", d.vdev, d.offset, d.asize, d.vdev)));
    };
    let size = top.asize();
    if size > 0 && d.offset.checked_add(d.asize as u64).map_or(true, |end| end > size) {
        return Err(Error::Corrupt(format!(
            "intent log: field {field} = vdev {} offset {:#x} asize {:#x} is beyond the vdev's {size} bytes",
            d.vdev, d.offset, d.asize
        )));
    }
    Ok(())
}

/// A chain read at import: its verified blocks in order (with their records) and the
/// allocated successor of the last one.
pub struct ClaimedChain {
    pub blocks: Vec<LogPtr>,
    pub records: Vec<LogRecord>,
    /// Blocks WR_INDIRECT records point at, born after the claim txg (claimed too).
    pub indirect_blocks: Vec<Dva>,
}

/// Longest chain walked at import (a loop in a corrupt chain ends here).
pub const ZIL_CHAIN_BLOCKS_MAX: usize = 1 << 20;

/// Walk the chain from `hdr` and claim its blocks (zil_claim): each valid block and the
/// block after the last one stay allocated, and so do the blocks WR_INDIRECT records
/// point at that were born after `claim_txg` (zil_claim_log_record: older ones are in
/// the synced trees, or were freed by the sync of their txg and may be reused).
/// Idempotent.
pub fn claim(io: &PoolIo, hdr: &ZilHeader, volume_id: u64, claim_txg: Txg) -> Result<ClaimedChain> {
    let mut out = ClaimedChain { blocks: Vec::new(), records: Vec::new(), indirect_blocks: Vec::new() };
    let mut claimed = std::collections::HashSet::new();
    let (mut ptr, mut seq) = (hdr.head, hdr.head_seq);
    // the chain's blocks by (vdev, offset) -> end: no two may overlap (a loop, or a
    // block named twice, would be claimed and later freed twice)
    let mut extents: std::collections::BTreeMap<(crate::VdevId, u64), u64> = Default::default();
    while !ptr.is_none() && out.blocks.len() < ZIL_CHAIN_BLOCKS_MAX {
        let field = if out.blocks.is_empty() { "head".to_string() } else { format!("next of intent log block {}", seq - 1) };
        check_log_ptr(io, &ptr, field.clone())?;
        let (d, end) = (ptr.dva, ptr.dva.offset + ptr.dva.asize as u64);
        let before = extents.range(..=(d.vdev, d.offset)).next_back().is_some_and(|(&(v, _), &e)| v == d.vdev && e > d.offset);
        let after = extents.range((d.vdev, d.offset)..).next().is_some_and(|(&(v, o), _)| v == d.vdev && o < end);
        if before || after {
            return Err(Error::Corrupt(format!(
                "intent log: field {field} = vdev {} offset {:#x} asize {:#x} overlaps a block already in the chain",
                d.vdev, d.offset, d.asize
            )));
        }
        extents.insert((d.vdev, d.offset), end);
        io.ms.claim_log(&ptr.dva)?;
        out.blocks.push(ptr);
        let Some(p) = read_lwb(io, &ptr, hdr.guid, volume_id, seq)? else { break };
        for bp in p.records.iter().filter_map(LogRecord::indirect_bp).filter(|bp| bp.birth > claim_txg) {
            if claimed.insert(bp.dva[0]) {
                io.ms.claim_log(&bp.dva[0])?;
                out.indirect_blocks.push(bp.dva[0]);
            }
        }
        out.records.extend(p.records);
        ptr = p.next;
        seq += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(off: u64, size: u32) -> LogPtr {
        LogPtr { dva: Dva { vdev: crate::VdevId(1), asize: size, offset: off } }
    }

    #[test]
    fn lwb_round_trips_and_rejects_other_chains() {
        let recs = vec![
            LogRecord { rtype: TX_WRITE, wr: WR_COPIED, txg: Txg(7), offset: 4096, len: 5, data: Arc::new(AlignedBuf::from(&b"hello"[..])) },
            LogRecord { rtype: TX_TRUNCATE, wr: 0, txg: Txg(8), offset: 0, len: 8192, data: Arc::new(AlignedBuf::zeroed(0)) },
        ];
        let mut body = Vec::new();
        for r in &recs {
            encode_record(r, &mut body);
        }
        let b = encode_lwb(&ptr(0x10000, 4096), 42, 3, 9, &ptr(0x20000, 8192), &body);
        assert_eq!(b.len(), 4096);
        let p = decode_lwb(&b, 42, 3, 9).unwrap().unwrap();
        assert_eq!(p.records, recs);
        assert_eq!(p.next, ptr(0x20000, 8192));
        // another chain, another volume, another position: not ours
        assert!(decode_lwb(&b, 43, 3, 9).unwrap().is_none());
        assert!(decode_lwb(&b, 42, 4, 9).unwrap().is_none());
        assert!(decode_lwb(&b, 42, 3, 10).unwrap().is_none());
        // any flipped bit ends the chain
        for i in [0usize, 60, 100, 4000] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(decode_lwb(&c, 42, 3, 9).unwrap().is_none(), "flip at {i}");
        }
        assert!(decode_lwb(&vec![0u8; 4096], 0, 0, 0).unwrap().is_none());
    }

    #[test]
    fn an_lwb_is_written_only_as_far_as_it_is_used() {
        let r = LogRecord { rtype: TX_WRITE, wr: WR_COPIED, txg: Txg(7), offset: 4096, len: 100, data: Arc::new(AlignedBuf::from(vec![9u8; 100])) };
        let mut body = Vec::new();
        encode_record(&r, &mut body);
        let at = ptr(0x10000, 16384);
        let b = encode_lwb_in(&at, 42, 3, 9, &ptr(0x20000, 8192), &body, 4096);
        assert_eq!(b.len(), 4096, "a small commit in a 16K block writes one 4K unit");
        // what the device holds beyond the written part is whatever was there before
        let mut on_disk = b.clone();
        on_disk.resize(16384, 0xee);
        let p = decode_lwb(&on_disk, 42, 3, 9).unwrap().expect("verifies");
        assert_eq!(p.records.len(), 1);
        for i in [0usize, 40, 100, 4095] {
            let mut c = on_disk.clone();
            c[i] ^= 1;
            assert!(decode_lwb(&c, 42, 3, 9).unwrap().is_none(), "flip at {i}");
        }
        // a written length that is not a whole number of sectors does not verify (the
        // checksum covers other bytes); one past the block, or inside the header, is
        // corruption naming the field, as is every impossible field of a block that is
        // this chain's at this position
        let mut c = on_disk.clone();
        c[36..40].copy_from_slice(&100u32.to_le_bytes());
        assert!(decode_lwb(&c, 42, 3, 9).unwrap().is_none(), "written length 100");
        for bad in [1u32, 20000, u32::MAX] {
            let mut c = on_disk.clone();
            c[36..40].copy_from_slice(&bad.to_le_bytes());
            let e = decode_lwb(&c, 42, 3, 9).expect_err("written beyond the block");
            assert!(e.to_string().contains(&format!("field written = {bad}")), "{e}");
        }
        // blocks written whole before the length field existed (0) still verify
        let mut old = b.clone();
        old[36..40].fill(0);
        old.resize(16384, 0);
        old[LWB_CKSUM_AT..LWB_CKSUM_AT + 32].fill(0);
        let ck = lwb_checksum(&old);
        old[LWB_CKSUM_AT..LWB_CKSUM_AT + 32].copy_from_slice(&ck);
        assert!(decode_lwb(&old, 42, 3, 9).unwrap().is_some());
    }

    #[test]
    fn big_writes_are_split_to_fit_a_block() {
        let r = LogRecord { rtype: TX_WRITE, wr: WR_NEED_COPY, txg: Txg(3), offset: 0, len: 256 << 10, data: Arc::new(AlignedBuf::from(vec![7u8; 256 << 10])) };
        let parts = pieces(&r);
        assert!(parts.len() >= 3);
        assert_eq!(parts.iter().map(|p| p.len).sum::<u64>(), 256 << 10);
        for p in &parts {
            assert!(RECORD_HEADER_SIZE + p.data.len() + LWB_HEADER_SIZE <= ZIL_MAXBLOCKSIZE.get() as usize);
        }
    }

    #[test]
    fn malformed_records_in_a_verified_block_are_corruption() {
        let mut body = Vec::new();
        encode_record(&LogRecord { rtype: TX_WRITE, wr: WR_COPIED, txg: Txg(1), offset: 0, len: 3, data: Arc::new(AlignedBuf::from(vec![1, 2, 3])) }, &mut body);
        body[0] = 9;
        let b = encode_lwb(&ptr(0, 4096), 1, 1, 1, &LogPtr::default(), &body);
        assert!(decode_lwb(&b, 1, 1, 1).is_err());
    }
}

#[cfg(test)]
mod superseded_tests {
    use super::*;

    fn block(fill: u8) -> Arc<AlignedBuf> {
        Arc::new(AlignedBuf::from(vec![fill; 16384]))
    }

    fn token(txg: Txg) -> SyncToken {
        SyncToken { txg, freed_blocks: 0, freed_orphans: 0, names_chain: false, retired_broken: false }
    }

    /// (wr, offset, first byte) of every record a commit would take now, in order.
    fn take_summary(z: &Zilog) -> Vec<(u8, u64, u8)> {
        let (_, pending, overflow) = z.take_pending(Txg(1));
        assert!(overflow.is_zero());
        pending
            .into_iter()
            .map(|p| match p {
                Pending::Record(r) => (if r.rtype == TX_TRUNCATE { 0 } else { r.wr }, r.offset, r.data.first().copied().unwrap_or(0)),
                Pending::Indirect { offset, block, .. } => (WR_INDIRECT, offset, block[0]),
            })
            .collect()
    }

    #[test]
    fn a_block_rewritten_whole_in_the_same_txg_releases_the_older_buffer() {
        let z = Zilog::new(1);
        let first = block(1);
        z.log_write(Txg(5), 0, first.clone(), true);
        assert_eq!(Arc::strong_count(&first), 2, "the pending itx keeps the buffer");
        let second = block(2);
        z.log_write(Txg(5), 0, second.clone(), true);
        assert_eq!(Arc::strong_count(&first), 1, "the superseded itx let go of its buffer");
        // another block, and the same block in the next txg, are kept
        z.log_write(Txg(5), 16384, block(3), true);
        z.log_write(Txg(6), 0, block(4), true);
        assert_eq!(Arc::strong_count(&second), 2);
        assert_eq!(z.stats.zil_itx_superseded_count.load(Ordering::Relaxed), 1);
        assert_eq!(take_summary(&z), vec![(WR_NEED_COPY, 0, 2), (WR_NEED_COPY, 16384, 3), (WR_NEED_COPY, 0, 4)]);
        assert_eq!(Arc::strong_count(&second), 1, "taken itxs are no longer held by the lists");
    }

    #[test]
    fn records_between_two_whole_writes_stay_in_order() {
        let z = Zilog::new(1);
        z.log_write_indirect(Txg(5), 0, block(1));
        z.log_write(Txg(5), 100, Arc::new(AlignedBuf::from(vec![7u8; 10])), false);
        z.log_truncate(Txg(5), 0, 16384);
        z.log_write(Txg(5), 0, block(2), true);
        assert_eq!(take_summary(&z), vec![(WR_COPIED, 100, 7), (0, 0, 0), (WR_NEED_COPY, 0, 2)]);
        // a commit took everything: a whole write after it supersedes nothing
        z.log_write(Txg(5), 0, block(3), true);
        assert_eq!(z.stats.zil_itx_superseded_count.load(Ordering::Relaxed), 1);
        assert_eq!(take_summary(&z), vec![(WR_NEED_COPY, 0, 3)]);
    }

    #[test]
    fn a_pending_whole_block_is_found_only_in_its_txg() {
        let z = Zilog::new(1);
        assert_eq!(z.pending_whole_block(Txg(5), 0), None);
        z.log_write(Txg(5), 0, block(1), true);
        z.log_write_indirect(Txg(5), 16384, block(2));
        assert_eq!(z.pending_whole_block(Txg(5), 0), Some(false));
        assert_eq!(z.pending_whole_block(Txg(5), 16384), Some(true));
        assert_eq!(z.pending_whole_block(Txg(6), 0), None);
        take_summary(&z);
        assert_eq!(z.pending_whole_block(Txg(5), 0), None, "a commit took it");
    }

    #[test]
    fn a_synced_txg_forgets_its_whole_block_index() {
        let z = Zilog::new(1);
        z.log_write(Txg(5), 0, block(1), true);
        z.log_write(Txg(6), 0, block(2), true);
        z.synced(token(Txg(5)));
        assert_eq!(z.itxs.lock().whole_blocks.get(&0), Some(&(Txg(6), 0)));
        z.synced(token(Txg(6)));
        assert!(z.itxs.lock().whole_blocks.is_empty());
        assert!(z.itxs.lock().by_txg.is_empty());
    }
}
