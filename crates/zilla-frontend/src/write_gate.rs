//! write_gate: COMPARE AND WRITE atomic against every write to its volume.
//!
//! Theory of operation
//! -------------------
//! COMPARE AND WRITE (SBC-3 §5.2) reads a range, compares it with the initiator's
//! data and, if equal, writes new data there, as one atomic operation: no other write
//! to those blocks, from any session or protocol, may land between its read and its
//! write. Plain writes must not pay for this while no COMPARE AND WRITE is in flight.
//! OR WRITE (read, OR, write) takes the gate the same way.
//!
//! Each volume maps (by name) to one of `GATES` gates. A gate counts the writes that
//! are applying their data (`writers`) and the COMPARE AND WRITEs waiting or running
//! (`caws`). Every write-like volume call (WRITE, UNMAP, WRITE ZEROES, WRITE SAME)
//! enters the gate for the time the volume takes its data (not for its throttle delay
//! or its intent-log commit: visibility to reads is what the compare needs) and
//! leaves it right after:
//!
//! ```text
//!   write:  writers += 1; if caws > 0 { writers -= 1; wait or go to a thread }
//!           ...apply...; writers -= 1 (wake a waiting CAW when caws > 0)
//!   CAW:    caws += 1; wait until writers == 0; (CAW mutex) read, compare, write;
//!           caws -= 1; wake waiting writes
//! ```
//!
//! Both sides use sequentially consistent operations: either the write sees the CAW's
//! increment (and backs off) or the CAW sees the write's (and waits for it). A write
//! on an async thread never waits: `try_enter` fails and the executor sends it to the
//! blocking pool, where `enter` waits. While none is in flight a write costs two
//! atomic adds and a load on the gate's cache line. COMPARE AND WRITEs of one gate run
//! one at a time (the gate's mutex); two volumes sharing a gate only wait for each
//! other's COMPARE AND WRITEs, never for wrong results. A waiting write or CAW
//! re-checks at least every `WAIT_SLICE` so a wake-up lost to a race costs that much at
//! most.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Gates of a front end; volumes map to them by name.
const GATES: usize = 16;
/// Longest a waiter sleeps before it looks again.
const WAIT_SLICE: Duration = Duration::from_millis(2);

/// One gate (see the module comment).
#[derive(Default)]
pub struct WriteGate {
    writers: AtomicUsize,
    caws: AtomicUsize,
    /// Held by the running COMPARE AND WRITE.
    caw_running: Mutex<()>,
    /// Guards the condition variable's waits (no data).
    waiting: Mutex<()>,
    changed: Condvar,
}

/// A write inside the gate; leaving is dropping it.
pub struct WriteToken<'a> {
    gate: &'a WriteGate,
}

impl Drop for WriteToken<'_> {
    fn drop(&mut self) {
        let before = self.gate.writers.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "write gate: a token left a gate no write was in");
        if before == 1 && self.gate.caws.load(Ordering::SeqCst) > 0 {
            self.gate.wake();
        }
    }
}

impl WriteGate {
    /// Enter without waiting; `None` while a COMPARE AND WRITE is waiting or running.
    pub fn try_enter(&self) -> Option<WriteToken<'_>> {
        self.writers.fetch_add(1, Ordering::SeqCst);
        if self.caws.load(Ordering::SeqCst) == 0 {
            return Some(WriteToken { gate: self });
        }
        drop(WriteToken { gate: self });
        None
    }

    /// Enter, waiting (on a blocking thread) for COMPARE AND WRITEs to finish.
    pub fn enter(&self) -> WriteToken<'_> {
        loop {
            if let Some(token) = self.try_enter() {
                return token;
            }
            let mut guard = self.waiting.lock();
            if self.caws.load(Ordering::SeqCst) > 0 {
                self.changed.wait_for(&mut guard, WAIT_SLICE);
            }
        }
    }

    /// Run `caw` with no write of this gate applying and no other COMPARE AND WRITE
    /// running (a blocking thread).
    pub fn exclusive<T>(&self, caw: impl FnOnce() -> T) -> T {
        self.caws.fetch_add(1, Ordering::SeqCst);
        let result = {
            let _running = self.caw_running.lock();
            loop {
                let mut guard = self.waiting.lock();
                if self.writers.load(Ordering::SeqCst) == 0 {
                    break;
                }
                self.changed.wait_for(&mut guard, WAIT_SLICE);
            }
            // (a write may count itself for an instant while it backs off: `writers`
            // is not asserted zero here; the test below checks no write applies)
            caw()
        };
        let before = self.caws.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0);
        self.wake();
        result
    }

    fn wake(&self) {
        let _guard = self.waiting.lock();
        self.changed.notify_all();
    }

    /// Writes applying now (for tests and assertions).
    pub fn writers(&self) -> usize {
        self.writers.load(Ordering::SeqCst)
    }
}

/// The gates of one front end.
pub struct WriteGates {
    gates: Box<[WriteGate]>,
}

impl Default for WriteGates {
    fn default() -> WriteGates {
        WriteGates { gates: (0..GATES).map(|_| WriteGate::default()).collect() }
    }
}

impl WriteGates {
    /// Which gate the volume named `volume_name` uses (hash once, keep the index).
    pub fn index_of(&self, volume_name: &str) -> usize {
        let hash = volume_name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        (hash % self.gates.len() as u64) as usize
    }

    /// Gate `index` (from [`WriteGates::index_of`]).
    pub fn get(&self, index: usize) -> &WriteGate {
        &self.gates[index % self.gates.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn writes_pass_freely_without_a_caw_and_are_refused_while_one_waits() {
        let gate = WriteGate::default();
        let a = gate.try_enter().expect("no CAW: a write enters");
        let b = gate.try_enter().expect("writes do not exclude each other");
        assert_eq!(gate.writers(), 2);
        drop((a, b));
        assert_eq!(gate.writers(), 0);
        gate.caws.fetch_add(1, Ordering::SeqCst);
        assert!(gate.try_enter().is_none(), "a waiting CAW closes the gate to new writes");
        assert_eq!(gate.writers(), 0, "a refused write leaves no count behind");
        gate.caws.fetch_sub(1, Ordering::SeqCst);
        assert!(gate.try_enter().is_some());
    }

    /// Each writer hammers its own pair of words (a write sets both to one value, so
    /// writers never tear each other's pairs); a CAW reads every pair, checks each
    /// agrees, and writes every pair with a pause between its two stores. Without the
    /// gate a writer lands between the CAW's read and write, or between its two
    /// stores, and the CAW sees or leaves a torn pair.
    #[test]
    fn no_write_lands_inside_a_compare_and_write() {
        const WRITERS: usize = 3;
        let gate = Arc::new(WriteGate::default());
        let pairs: Arc<Vec<(AtomicUsize, AtomicUsize)>> = Arc::new((0..WRITERS).map(|_| (AtomicUsize::new(0), AtomicUsize::new(0))).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (gate, pairs, stop) = (gate.clone(), pairs.clone(), stop.clone());
            writers.push(std::thread::spawn(move || {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let token = if n % 2 == 0 { gate.try_enter() } else { Some(gate.enter()) };
                    let Some(_token) = token else { continue };
                    pairs[w].0.store(n, Ordering::SeqCst);
                    std::hint::spin_loop();
                    pairs[w].1.store(n, Ordering::SeqCst);
                }
            }));
        }
        let mut torn = 0;
        for i in 0..2_000usize {
            gate.exclusive(|| {
                for pair in pairs.iter() {
                    if pair.0.load(Ordering::SeqCst) != pair.1.load(Ordering::SeqCst) {
                        torn += 1;
                    }
                    let value = usize::MAX - i;
                    pair.0.store(value, Ordering::SeqCst);
                    for _ in 0..50 {
                        std::hint::spin_loop();
                    }
                    if pair.0.load(Ordering::SeqCst) != value {
                        torn += 1;
                    }
                    pair.1.store(value, Ordering::SeqCst);
                }
            });
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(torn, 0, "a write landed inside a COMPARE AND WRITE");
        assert_eq!(gate.writers(), 0);
    }
}
