//! abd: the one aligned buffer type of block data and device I/O, from a slab.
//!
//! Theory of operation
//! -------------------
//! O_DIRECT needs the buffer address aligned (512 or 4096 bytes) and a block travels
//! from the socket to the device by reference (the dirty set, the intent log, the txg
//! sync and the device write share one buffer), so every block's bytes live in an
//! [`AlignedBuf`] whose start is 4096-aligned. A block is `Arc<AlignedBuf>`; a device
//! read fills an owned `AlignedBuf` that becomes the block itself.
//!
//! The memory comes from a slab, not from the allocator per buffer (memalign of a 16 KiB
//! buffer costs a quarter more than a `Vec`, and a `Vec` over-allocated by the alignment
//! as much):
//!
//! ```text
//!   size classes:  4 KiB steps up to 128 KiB (32 classes: 4K 8K 12K ... 128K),
//!                  then powers of two 256 KiB ... 16 MiB (7 classes);
//!                  larger or more strictly aligned buffers: one allocation each
//!   chunk:         one anonymous mapping (zeroed, page-aligned) of max(1, 256 KiB / class)
//!                  slots of one class; a buffer is a slot
//!   class state:   its chunks, each with its free slots; the chunks with a free slot
//!                  (LIFO: the most recently freed slot is the warmest)
//! ```
//!
//! A buffer returns its slot when dropped. A chunk whose slots are all free is released
//! at once when the slab's idle bytes (free slots of every class) exceed
//! [`IDLE_MAX_BYTES`], and by [`trim`] once it has stayed all free for
//! [`IDLE_RELEASE_AFTER`] (trim is called when a pool syncs an empty txg); so the slab
//! holds what its users hold, the free slots of chunks still partly in use, and at most
//! that bound of whole free chunks (1 GiB: what a txg sync frees at once, kept for the
//! next txg's blocks), given back to the system half a minute after the writes that
//! used them stopped. A burst that follows a pause shorter than that reuses the slots;
//! giving them back at the first empty txg made every burst fault its memory in again
//! (fresh pages cleared by the kernel, then by calloc: a quarter of the daemon's CPU in
//! the first seconds of 4K random writes). What users hold is bounded by their own
//! budgets (the front ends' memory budget, dirty data, the ARC), which wait when full:
//! the slab never refuses and never allocates around them. Whole free chunks are kept
//! only while the slab fits its users' budget ([`set_budget_fn`]: ARC max + dirty data
//! max): past it a chunk that comes free goes back at once, and a new chunk first
//! releases whole free chunks of other classes. [`stats`] feeds the memory report.
//!
//! Memory from the kernel. Each chunk (and each oversized buffer) is an anonymous
//! mapping of its own, unmapped when it is released: the pages go back to the system at
//! once. Chunks taken from the allocator instead (as they once were) went back to it
//! when released, and the allocator kept them: 256 KiB blocks carved from its heap
//! among small allocations cannot be returned while one neighbour lives, and glibc
//! raises its mapping threshold past 256 KiB after the first such free. A daemon that
//! had written 1 GiB and scrubbed it held 290 MiB that no cache or pool accounted for
//! (`zilla_overhead_other_bytes`), and 2 GiB after heavier days. A mapping the kernel
//! refuses (vm.max_map_count) falls back to the allocator. The kernel merges adjacent
//! mappings, so a slab of many chunks costs few map entries.
//!
//! Bytes `[0, len)` are always initialised: chunks are allocated zeroed and a reused
//! slot holds the bytes of its previous buffer; [`AlignedBuf::zeroed`] clears them,
//! [`AlignedBuf::for_overwrite`] leaves them for a caller that writes every byte.

use parking_lot::Mutex;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Default alignment: safe for every device's O_DIRECT.
pub const ALIGN: usize = 4096;
/// The largest class in 4 KiB steps.
const STEP_CLASSES_MAX_BYTES: usize = 128 << 10;
const STEP_CLASSES: usize = STEP_CLASSES_MAX_BYTES / ALIGN;
/// Power-of-two classes above the stepped ones: 256 KiB ... 16 MiB.
const POW2_CLASSES: usize = 7;
const CLASSES: usize = STEP_CLASSES + POW2_CLASSES;
/// The largest slab buffer; larger ones are allocated one by one.
pub const SLAB_MAX_BYTES: usize = 16 << 20;
/// A chunk holds this many bytes of slots (at least one slot).
const CHUNK_TARGET_BYTES: usize = 256 << 10;
/// Free slots the slab keeps before it releases chunks whose slots are all free. A txg
/// sync frees a whole txg of dirty blocks at once while the next txg's are allocated at
/// the client's pace: the slab keeps that memory for them (as OpenZFS's kmem caches
/// keep their free slabs until reaped) instead of returning it and faulting fresh,
/// zeroed pages back in (6 % of the daemon's CPU under 1 MiB writes with a 16 MiB
/// bound). Dirty data and the ARC stay within their own maxima, so what the slab keeps
/// is memory they held a moment ago; an idle pool's trim returns it.
pub const IDLE_MAX_BYTES: u64 = 1 << 30;
/// How long a chunk stays all free before [`trim`] gives it back.
pub const IDLE_RELEASE_AFTER: Duration = Duration::from_secs(30);

/// Bytes of size class `class`.
fn class_bytes(class: usize) -> usize {
    if class < STEP_CLASSES {
        (class + 1) * ALIGN
    } else {
        STEP_CLASSES_MAX_BYTES << (class - STEP_CLASSES + 1)
    }
}

/// The smallest class that holds `len` bytes, None above [`SLAB_MAX_BYTES`].
fn class_of(len: usize) -> Option<usize> {
    if len <= STEP_CLASSES_MAX_BYTES {
        return Some(len.max(1).div_ceil(ALIGN) - 1);
    }
    if len > SLAB_MAX_BYTES {
        return None;
    }
    let pow = len.next_power_of_two().trailing_zeros() as usize;
    Some(STEP_CLASSES + pow - (STEP_CLASSES_MAX_BYTES.trailing_zeros() as usize + 1))
}

struct Chunk {
    base: NonNull<u8>,
    layout: Layout,
    backing: Backing,
    /// Free slot indexes (LIFO).
    free: Vec<u32>,
    in_partial: bool,
    /// Bytes of its free slots whose pages [`release_free_slots`] gave back (0 once a
    /// slot of it is taken again).
    released_bytes: u64,
    /// When its last slot in use was freed, as the slab's trim clock then read (None
    /// while a slot is in use).
    all_free_since: Option<u64>,
}

struct ClassState {
    slot_bytes: usize,
    slots_per_chunk: u32,
    /// Chunk id → chunk (None: released; its id is reused).
    chunks: Vec<Option<Chunk>>,
    released_ids: Vec<u32>,
    /// Chunks with at least one free slot.
    partial: Vec<u32>,
}

// SAFETY: a chunk's memory is owned by the class state (behind its mutex); the raw
// pointer is only dereferenced through the buffers handed out, each a disjoint slot.
unsafe impl Send for ClassState {}

struct Slab {
    classes: Vec<Mutex<ClassState>>,
    /// Bytes of free slots in live chunks.
    idle_bytes: AtomicU64,
    /// Bytes of live chunks.
    chunk_bytes: AtomicU64,
    /// Bytes of buffers in use (their class sizes), slab and oversized.
    in_use_bytes: AtomicU64,
    /// Bytes of oversized buffers in use.
    oversized_bytes: AtomicU64,
    /// Bytes of free slots whose pages were given back (counted in `idle_bytes` too).
    released_bytes: AtomicU64,
    /// Whole free chunks are released beyond this many idle bytes.
    idle_max_bytes: u64,
    /// What the slab's users may hold together ([`set_budget_fn`]): whole free chunks
    /// are released while the slab's chunks exceed it.
    budget: parking_lot::RwLock<Option<BudgetFn>>,
    /// The latest time (ns of its caller's Env clock) a trim was called with: the slab
    /// has no clock of its own, so a chunk freed between two trims counts as freed at
    /// the first (it is given back at most one trim interval early).
    trim_clock_ns: AtomicU64,
}

/// The budget of the slab's users, in bytes (see [`set_budget_fn`]).
pub type BudgetFn = std::sync::Arc<dyn Fn() -> u64 + Send + Sync>;

/// Keep whole free chunks only while every chunk of the slab fits `budget()` (the
/// engine sets it to ARC max + dirty data max: what the slab's users may hold
/// together). Idle slots are then memory the budgets have room for; once the ARC and
/// the dirty data are full, a chunk whose slots all come free goes back at once
/// instead of waiting out [`IDLE_RELEASE_AFTER`].
pub fn set_budget_fn(budget: BudgetFn) {
    *slab().budget.write() = Some(budget);
}

fn over_budget(s: &Slab) -> bool {
    let chunks = s.chunk_bytes.load(Ordering::Relaxed);
    s.budget.read().as_ref().is_some_and(|b| chunks > b())
}

/// Release whole free chunks of classes other than `class` (whose lock the caller
/// holds) while the slab is over its budget; a class busy with another thread is
/// skipped (try_lock: two threads doing this cannot wait on each other).
fn release_over_budget(s: &Slab, class: usize) {
    for (c, m) in s.classes.iter().enumerate() {
        if c == class {
            continue;
        }
        let Some(mut st) = m.try_lock() else { continue };
        let ids: Vec<u32> = st.partial.clone();
        for id in ids {
            if !over_budget(s) {
                return;
            }
            if st.chunks[id as usize].as_ref().is_some_and(|ch| ch.free.len() as u32 == st.slots_per_chunk) {
                release_chunk(s, &mut st, id);
            }
        }
    }
}

fn slab() -> &'static Slab {
    static SLAB: std::sync::OnceLock<Slab> = std::sync::OnceLock::new();
    SLAB.get_or_init(|| Slab::new(IDLE_MAX_BYTES))
}

impl Slab {
    fn new(idle_max_bytes: u64) -> Slab {
        Slab {
        idle_max_bytes,
        budget: parking_lot::RwLock::new(None),
        classes: (0..CLASSES)
            .map(|c| {
                let slot_bytes = class_bytes(c);
                let slots_per_chunk = (CHUNK_TARGET_BYTES / slot_bytes).max(1) as u32;
                Mutex::new(ClassState { slot_bytes, slots_per_chunk, chunks: Vec::new(), released_ids: Vec::new(), partial: Vec::new() })
            })
            .collect(),
        idle_bytes: AtomicU64::new(0),
        chunk_bytes: AtomicU64::new(0),
        in_use_bytes: AtomicU64::new(0),
        oversized_bytes: AtomicU64::new(0),
        released_bytes: AtomicU64::new(0),
        trim_clock_ns: AtomicU64::new(0),
        }
    }
}

/// What the slab holds, for the memory report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlabStats {
    /// Bytes of buffers in use (rounded to their classes).
    pub in_use_bytes: u64,
    /// Bytes of free slots kept for reuse.
    pub idle_bytes: u64,
    /// Bytes of chunks allocated (in use + idle slab slots).
    pub chunk_bytes: u64,
    /// Bytes of buffers too large for the slab, in use.
    pub oversized_bytes: u64,
    /// Bytes of free slots (of `idle_bytes`) whose pages went back to the system.
    pub released_bytes: u64,
}

pub fn stats() -> SlabStats {
    stats_of(slab())
}

fn stats_of(s: &Slab) -> SlabStats {
    SlabStats {
        in_use_bytes: s.in_use_bytes.load(Ordering::Relaxed),
        idle_bytes: s.idle_bytes.load(Ordering::Relaxed),
        chunk_bytes: s.chunk_bytes.load(Ordering::Relaxed),
        oversized_bytes: s.oversized_bytes.load(Ordering::Relaxed),
        released_bytes: s.released_bytes.load(Ordering::Relaxed),
    }
}

/// Release every chunk whose slots have all been free for [`IDLE_RELEASE_AFTER`] (a
/// pool went idle; `now_ns` is its Env's clock). Returns the bytes released.
pub fn trim(now_ns: u64) -> u64 {
    trim_slab(slab(), now_ns, IDLE_RELEASE_AFTER)
}

/// Release every chunk whose slots are all free, now (the system runs short of memory).
/// Returns the bytes released.
pub fn trim_now() -> u64 {
    let s = slab();
    trim_slab(s, s.trim_clock_ns.load(Ordering::Relaxed), Duration::ZERO)
}

/// The system's page size.
fn page_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(usize::MAX)
}

/// Give the pages of every free slot of the slab's mapped chunks back to the system
/// (`MADV_DONTNEED`; a slot's pages read as zeros when touched again, so its bytes stay
/// initialised): for a daemon that has been idle, whose cached blocks keep chunks
/// partly in use. Returns the bytes newly given back.
pub fn release_free_slots() -> u64 {
    let s = slab();
    let mut released = 0;
    for class in &s.classes {
        let mut st = class.lock();
        let slot_bytes = st.slot_bytes;
        let ids: Vec<u32> = st.partial.clone();
        for id in ids {
            let Some(chunk) = st.chunks[id as usize].as_mut() else { continue };
            // a page larger than a slot could hold a slot in use: leave such chunks
            if chunk.backing != Backing::Mapped || chunk.released_bytes > 0 || slot_bytes % page_bytes() != 0 {
                continue;
            }
            let mut free = chunk.free.clone();
            free.sort_unstable();
            for run in free.chunk_by(|a, b| b == &(a + 1)) {
                // SAFETY: the run's slots are free (no buffer refers to them) and inside
                // the chunk's mapping; DONTNEED on private anonymous memory only drops pages.
                unsafe {
                    libc::madvise(chunk.base.as_ptr().add(run[0] as usize * slot_bytes).cast(), run.len() * slot_bytes, libc::MADV_DONTNEED);
                }
            }
            chunk.released_bytes = (free.len() * slot_bytes) as u64;
            released += chunk.released_bytes;
        }
    }
    s.released_bytes.fetch_add(released, Ordering::Relaxed);
    released
}

/// Release the chunks of `s` all free since before `now_ns - idle_for`.
fn trim_slab(s: &Slab, now_ns: u64, idle_for: Duration) -> u64 {
    let now_ns = s.trim_clock_ns.fetch_max(now_ns, Ordering::Relaxed).max(now_ns);
    let mut released = 0;
    for class in &s.classes {
        let mut st = class.lock();
        let ids: Vec<u32> = st.partial.clone();
        for id in ids {
            let chunk = st.chunks[id as usize].as_ref();
            let full_free = chunk.is_some_and(|c| c.free.len() as u32 == st.slots_per_chunk);
            let idle_long = chunk.and_then(|c| c.all_free_since).is_some_and(|t| now_ns.saturating_sub(t) >= idle_for.as_nanos() as u64);
            debug_assert!(!idle_long || full_free, "a chunk with a slot in use has a free-since time");
            if full_free && idle_long {
                released += release_chunk(s, &mut st, id);
            }
        }
    }
    released
}

/// Free chunk `id` (all its slots free); returns its bytes.
fn release_chunk(s: &Slab, st: &mut ClassState, id: u32) -> u64 {
    let chunk = st.chunks[id as usize].take().expect("a chunk released twice");
    debug_assert_eq!(chunk.free.len() as u32, st.slots_per_chunk, "a chunk released with slots in use");
    if let Some(at) = st.partial.iter().position(|&p| p == id) {
        st.partial.swap_remove(at);
    }
    st.released_ids.push(id);
    let bytes = chunk.layout.size() as u64;
    s.idle_bytes.fetch_sub(bytes, Ordering::Relaxed);
    s.chunk_bytes.fetch_sub(bytes, Ordering::Relaxed);
    s.released_bytes.fetch_sub(chunk.released_bytes, Ordering::Relaxed);
    // SAFETY: the chunk came from alloc_pages with this layout; no slot of it is in use.
    unsafe { free_pages(chunk.base, chunk.layout, chunk.backing) };
    bytes
}

/// Where a chunk's or an oversized buffer's memory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// Its own anonymous mapping: zero pages from the kernel, unmapped when freed.
    Mapped,
    /// The allocator (alignment above a page, or the mapping was refused).
    Heap,
}

/// Zeroed memory for `layout`: an anonymous mapping of its own where the alignment
/// allows (module comment, "Memory from the kernel"), else the allocator.
fn alloc_pages(layout: Layout) -> (NonNull<u8>, Backing) {
    if layout.align() <= ALIGN {
        // SAFETY: an anonymous private mapping of a non-zero length, no fixed address.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), layout.size(), libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p != libc::MAP_FAILED {
            if let Some(p) = NonNull::new(p.cast::<u8>()) {
                return (p, Backing::Mapped);
            }
        }
        // out of mappings (vm.max_map_count): the allocator still serves
    }
    // SAFETY: the layout has a non-zero size.
    let p = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
    (p, Backing::Heap)
}

/// Give back memory from [`alloc_pages`].
///
/// # Safety
/// `ptr` came from `alloc_pages(layout)` with `backing`, and nothing uses it any more.
unsafe fn free_pages(ptr: NonNull<u8>, layout: Layout, backing: Backing) {
    match backing {
        // SAFETY (both arms): the caller's contract.
        Backing::Mapped => unsafe {
            let rc = libc::munmap(ptr.as_ptr().cast(), layout.size());
            debug_assert_eq!(rc, 0, "munmap of a slab mapping failed");
        },
        Backing::Heap => unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) },
    }
}

/// Take a slot of class `class`: (address, chunk id, slot index).
fn take_slot(s: &Slab, class: usize) -> (NonNull<u8>, u32, u32) {
    let mut st = s.classes[class].lock();
    if st.partial.is_empty() {
        new_chunk(s, &mut st);
    }
    let id = *st.partial.last().expect("a chunk with a free slot");
    let slot_bytes = st.slot_bytes;
    let chunk = st.chunks[id as usize].as_mut().expect("a partial chunk is live");
    let slot = chunk.free.pop().expect("a partial chunk has a free slot");
    chunk.all_free_since = None;
    if chunk.released_bytes > 0 {
        // its pages come back as they are touched: count them resident again
        s.released_bytes.fetch_sub(std::mem::take(&mut chunk.released_bytes), Ordering::Relaxed);
    }
    let now_full = chunk.free.is_empty();
    // SAFETY: slot < slots_per_chunk, so the address is inside the chunk's allocation.
    let ptr = unsafe { NonNull::new_unchecked(chunk.base.as_ptr().add(slot as usize * slot_bytes)) };
    if now_full {
        chunk.in_partial = false;
        st.partial.pop();
    }
    s.idle_bytes.fetch_sub(slot_bytes as u64, Ordering::Relaxed);
    s.in_use_bytes.fetch_add(slot_bytes as u64, Ordering::Relaxed);
    (ptr, id, slot)
}

fn new_chunk(s: &Slab, st: &mut ClassState) {
    let bytes = st.slot_bytes * st.slots_per_chunk as usize;
    let layout = Layout::from_size_align(bytes, ALIGN).expect("a chunk layout");
    let (base, backing) = alloc_pages(layout);
    let chunk = Chunk { base, layout, backing, free: (0..st.slots_per_chunk).rev().collect(), in_partial: true, released_bytes: 0, all_free_since: None };
    let id = match st.released_ids.pop() {
        Some(id) => {
            st.chunks[id as usize] = Some(chunk);
            id
        }
        None => {
            st.chunks.push(Some(chunk));
            (st.chunks.len() - 1) as u32
        }
    };
    st.partial.push(id);
    s.idle_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    s.chunk_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    if over_budget(s) {
        release_over_budget(s, class_index(s, &*st));
    }
}

/// The index of class state `st` in `s` (by its slot size).
fn class_index(s: &Slab, st: &ClassState) -> usize {
    class_of(st.slot_bytes).filter(|&c| c < s.classes.len()).unwrap_or(usize::MAX)
}

fn give_slot(s: &Slab, class: usize, id: u32, slot: u32) {
    let mut st = s.classes[class].lock();
    let slot_bytes = st.slot_bytes as u64;
    let per_chunk = st.slots_per_chunk;
    let chunk = st.chunks[id as usize].as_mut().expect("a buffer's chunk is live");
    debug_assert!(!chunk.free.contains(&slot), "slot {slot} of class {class} freed twice");
    chunk.free.push(slot);
    let was_partial = std::mem::replace(&mut chunk.in_partial, true);
    let all_free = chunk.free.len() as u32 == per_chunk;
    if all_free {
        chunk.all_free_since = Some(s.trim_clock_ns.load(Ordering::Relaxed));
    }
    if !was_partial {
        st.partial.push(id);
    }
    s.in_use_bytes.fetch_sub(slot_bytes, Ordering::Relaxed);
    let idle = s.idle_bytes.fetch_add(slot_bytes, Ordering::Relaxed) + slot_bytes;
    if all_free && (idle > s.idle_max_bytes || over_budget(s)) {
        release_chunk(s, &mut st, id);
    }
}

/// Where a buffer's memory came from.
#[derive(Debug, Clone, Copy)]
enum Home {
    /// No memory (capacity 0).
    Empty,
    /// A slot of the slab.
    Slab { class: u8, chunk: u32, slot: u32 },
    /// Its own allocation (too large or too strictly aligned for the slab).
    Own(Layout, Backing),
}

/// A byte buffer whose start is aligned (default [`ALIGN`]) and whose capacity is fixed.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    home: Home,
}

// SAFETY: an AlignedBuf owns its memory exclusively, as a Vec<u8> does.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` bytes with whatever the memory held (initialised, possibly another buffer's
    /// old bytes), aligned to `align`: for a caller that overwrites all of them.
    fn raw(len: usize, align: usize) -> AlignedBuf {
        assert!(align.is_power_of_two(), "alignment {align} not a power of two");
        if len == 0 {
            return AlignedBuf { ptr: NonNull::dangling(), len: 0, cap: 0, home: Home::Empty };
        }
        match class_of(len) {
            Some(class) if align <= ALIGN => {
                let (ptr, chunk, slot) = take_slot(slab(), class);
                AlignedBuf { ptr, len, cap: class_bytes(class), home: Home::Slab { class: class as u8, chunk, slot } }
            }
            _ => {
                let layout = Layout::from_size_align(len, align.max(ALIGN)).expect("a buffer layout");
                let (ptr, backing) = alloc_pages(layout);
                let s = slab();
                s.in_use_bytes.fetch_add(len as u64, Ordering::Relaxed);
                s.oversized_bytes.fetch_add(len as u64, Ordering::Relaxed);
                AlignedBuf { ptr, len, cap: len, home: Home::Own(layout, backing) }
            }
        }
    }

    /// `len` zero bytes, the start aligned to `align` (a power of two).
    pub fn zeroed_aligned(len: usize, align: usize) -> AlignedBuf {
        let mut b = Self::raw(len, align);
        if matches!(b.home, Home::Slab { .. }) {
            b.as_mut_slice().fill(0);
        }
        b
    }

    /// `len` zero bytes aligned to [`ALIGN`].
    pub fn zeroed(len: usize) -> AlignedBuf {
        Self::zeroed_aligned(len, ALIGN)
    }

    /// `len` bytes aligned to [`ALIGN`] holding old bytes of the slab: only for a caller
    /// that overwrites every one of them before anything reads them (a copy, a device
    /// read whose short or failed result discards the buffer).
    pub fn for_overwrite(len: usize) -> AlignedBuf {
        Self::raw(len, ALIGN)
    }

    /// An empty buffer that can grow (by `extend_from_slice`) up to `cap` bytes.
    pub fn with_capacity(cap: usize) -> AlignedBuf {
        let mut b = Self::raw(cap, ALIGN);
        b.len = 0;
        b
    }

    /// A copy of `s` in an aligned buffer.
    pub fn copy_of(s: &[u8]) -> AlignedBuf {
        let mut b = Self::raw(s.len(), ALIGN);
        b.as_mut_slice().copy_from_slice(s);
        b
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Append `s`; panics if it does not fit (a caller bug, never data-dependent).
    pub fn extend_from_slice(&mut self, s: &[u8]) {
        assert!(self.len + s.len() <= self.cap, "AlignedBuf overflow: {} + {} > {}", self.len, s.len(), self.cap);
        let at = self.len;
        self.len += s.len();
        self.as_mut_slice()[at..].copy_from_slice(s);
    }

    /// Grow (zero-filled) or shrink to `len` bytes, within the capacity.
    pub fn resize(&mut self, len: usize) {
        assert!(len <= self.cap, "AlignedBuf resize {len} beyond capacity {}", self.cap);
        let old = self.len;
        self.len = len;
        if len > old {
            self.as_mut_slice()[old..].fill(0);
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.home {
            Home::Empty => {}
            Home::Slab { class, chunk, slot } => give_slot(slab(), class as usize, chunk, slot),
            Home::Own(layout, backing) => {
                let s = slab();
                s.in_use_bytes.fetch_sub(self.cap as u64, Ordering::Relaxed);
                s.oversized_bytes.fetch_sub(self.cap as u64, Ordering::Relaxed);
                // SAFETY: allocated by alloc_pages with this layout in `raw`, dropped once.
                unsafe { free_pages(self.ptr, layout, backing) };
            }
        }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        AlignedBuf::copy_of(self.as_slice())
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &AlignedBuf) -> bool {
        self.as_slice() == other.as_slice()
    }
}
impl Eq for AlignedBuf {}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf(len={}, cap={})", self.len, self.cap)
    }
}

impl From<&[u8]> for AlignedBuf {
    fn from(s: &[u8]) -> AlignedBuf {
        AlignedBuf::copy_of(s)
    }
}

impl From<Vec<u8>> for AlignedBuf {
    fn from(v: Vec<u8>) -> AlignedBuf {
        AlignedBuf::copy_of(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_length_tightly() {
        for len in [1, 4095, 4096, 4097, 12 << 10, (128 << 10) - 1, 128 << 10, (128 << 10) + 1, 1 << 20, (1 << 20) + 1, SLAB_MAX_BYTES] {
            let c = class_of(len).expect("a slab length has a class");
            assert!(class_bytes(c) >= len, "class {c} ({}) holds {len}", class_bytes(c));
            assert!(c == 0 || class_bytes(c - 1) < len, "class {c} is the smallest for {len}");
            assert_eq!(class_bytes(c) % ALIGN, 0);
        }
        assert_eq!(class_of(SLAB_MAX_BYTES + 1), None);
        assert_eq!(class_bytes(CLASSES - 1), SLAB_MAX_BYTES);
    }

    #[test]
    fn aligned_initialised_and_disjoint() {
        let mut live = Vec::new();
        for i in 0..200usize {
            let len = 1 + (i * 7919) % (300 << 10);
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert!(b.iter().all(|&x| x == 0), "a zeroed buffer of {len} bytes holds old bytes");
            b.fill(i as u8);
            live.push(b);
        }
        for (i, b) in live.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8), "buffer {i} was overwritten by another");
        }
        drop(live);
        let mut r = AlignedBuf::copy_of(&[9u8; 100]);
        r.resize(50);
        r.resize(100);
        assert_eq!(&r[..50], &[9u8; 50]);
        assert_eq!(&r[50..], &[0u8; 50], "regrown bytes are zeroed");
        for align in [512, 4096, 65536] {
            let z = AlignedBuf::zeroed_aligned(1000, align);
            assert_eq!(z.as_ptr() as usize % align, 0);
            assert!(z.iter().all(|&b| b == 0));
        }
        let big = AlignedBuf::copy_of(&vec![3u8; SLAB_MAX_BYTES + 5]);
        assert_eq!(big.len(), SLAB_MAX_BYTES + 5);
        assert!(big.iter().all(|&b| b == 3));
        assert_eq!(AlignedBuf::with_capacity(0).len(), 0);
    }

    #[test]
    fn slots_are_reused_and_idle_chunks_released() {
        // a slab of its own (the global one is shared with every other test)
        let s = Slab::new(64 << 20);
        let class = class_of(124 << 10).unwrap(); // 2 slots per chunk
        let mut held: Vec<(NonNull<u8>, u32, u32)> = (0..8).map(|_| take_slot(&s, class)).collect();
        let chunks = || s.classes[class].lock().chunks.iter().filter(|c| c.is_some()).count();
        assert_eq!(chunks(), 4);
        assert_eq!(stats_of(&s).in_use_bytes, 8 * (124 << 10));
        let (addr, chunk, slot) = held.pop().unwrap();
        give_slot(&s, class, chunk, slot);
        let again = take_slot(&s, class);
        assert_eq!(again.0, addr, "the most recently freed slot is reused first");
        held.push(again);
        // the slab's clock comes from its trims: at 100 s every slot is freed
        let sec = 1_000_000_000u64;
        assert_eq!(trim_slab(&s, 100 * sec, Duration::from_secs(30)), 0, "nothing is free yet");
        for (_, chunk, slot) in held {
            give_slot(&s, class, chunk, slot);
        }
        assert_eq!(stats_of(&s).idle_bytes, 8 * (124 << 10));
        assert_eq!(trim_slab(&s, 110 * sec, Duration::from_secs(30)), 0, "chunks freed just now are kept for the next burst");
        let (_, chunk, slot) = take_slot(&s, class); // one chunk busy again, free at 110 s
        give_slot(&s, class, chunk, slot);
        assert_eq!(trim_slab(&s, 135 * sec, Duration::from_secs(30)), 6 * (124 << 10), "the chunk used again stays");
        assert_eq!(trim_slab(&s, 141 * sec, Duration::from_secs(30)), 2 * (124 << 10));
        assert_eq!(chunks(), 0, "trim releases every chunk whose slots are all free");
        assert_eq!(stats_of(&s), SlabStats::default());
        // past the idle bound, a chunk whose slots are all free goes at once
        let big = class_of(SLAB_MAX_BYTES).unwrap();
        let n = (s.idle_max_bytes as usize / SLAB_MAX_BYTES) + 2;
        let held: Vec<_> = (0..n).map(|_| take_slot(&s, big)).collect();
        for (_, chunk, slot) in held {
            give_slot(&s, big, chunk, slot);
        }
        assert!(stats_of(&s).idle_bytes <= s.idle_max_bytes, "idle bytes over the bound: {:?}", stats_of(&s));
    }

    #[test]
    fn past_its_users_budget_the_slab_keeps_no_whole_free_chunk() {
        let s = Slab::new(1 << 30);
        let small = class_of(124 << 10).unwrap(); // 2 slots of 124 KiB per chunk
        let large = class_of(4 << 20).unwrap();
        let budget = (4u64 << 20) + (512 << 10);
        let held: Vec<_> = (0..8).map(|_| take_slot(&s, small)).collect();
        for (_, chunk, slot) in held {
            give_slot(&s, small, chunk, slot);
        }
        assert_eq!(stats_of(&s).idle_bytes, 8 * (124 << 10), "no budget: the free chunks are kept");
        *s.budget.write() = Some(std::sync::Arc::new(move || budget));
        // a chunk of another class takes the slab past the budget: idle ones go
        let big = take_slot(&s, large);
        let st = stats_of(&s);
        assert!(st.chunk_bytes <= budget && st.idle_bytes < 8 * (124 << 10), "whole free chunks of other classes released: {st:?}");
        // under the budget a chunk that comes free stays
        give_slot(&s, large, big.1, big.2);
        assert_eq!(stats_of(&s).chunk_bytes, st.chunk_bytes, "under the budget a free chunk stays");
        // new small chunks take it past the budget again: the idle large chunk goes
        let held: Vec<_> = (0..8).map(|_| take_slot(&s, small)).collect();
        let st = stats_of(&s);
        assert_eq!(st.chunk_bytes, 4 * 2 * (124 << 10), "the idle large chunk was released: {st:?}");
        for (_, chunk, slot) in held {
            give_slot(&s, small, chunk, slot);
        }
        assert_eq!(stats_of(&s).idle_bytes, 8 * (124 << 10));
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn overflow_is_caught() {
        let mut a = AlignedBuf::with_capacity(4096);
        a.extend_from_slice(&[0u8; 4097]);
    }
}
