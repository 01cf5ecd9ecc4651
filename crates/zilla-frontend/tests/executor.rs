//! The executor against a model volume: every request kind, every way a request can
//! run (inline, throttle delay, engine completion now or later from another thread,
//! an engine that gives up and sends it to the blocking pool, an engine that drops the
//! completion, engine errors, a panicking blocking call), and the invariants:
//! - every submitted request is completed exactly once;
//! - every admission and volume-call permit comes back, also when the connection is
//!   gone before its requests finish;
//! - the statistics count every request once;
//! - data read back equals an oracle (a plain in-memory volume).
//!
//! Randomised but replayable: `ZILLA_EXECUTOR_SEED=N` replays one run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use zilla_core::memvol::MemVolume;
use zilla_core::zvol::{BlockVolume, CommitDone, Extent, ReadDone, SharedSlice, WriteData, WriteDelay};
use zilla_core::{Error, Result};
use zilla_frontend::{
    Admission, Command, Completer, Completion, Executor, Frontend, FrontendConfig, Output, ReadData, Request, StaticRegistry, Submitted,
};

const VOLUME_BYTES: u64 = 4 << 20;
const BLOCK_BYTES: u32 = 4096;

/// How the model answers one call: chosen by the test's random stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// `try_*`: answer at once; `_async`: complete before returning.
    Now,
    /// `try_*`: "would block"; `_async`: complete from another thread a little later.
    Later,
    /// `_async`: "cannot finish without blocking" (`done(None)`).
    GiveUp,
    /// `_async`: drop the completion without calling it (a broken engine).
    Drop,
    /// Fail with an I/O error.
    Fail,
}

/// A volume whose every non-blocking answer is decided by a seeded random stream, over
/// a [`MemVolume`] that holds the data. Blocking calls always work (but for `Fail`).
struct ModelVolume {
    data: MemVolume,
    rng: Mutex<rand::rngs::StdRng>,
    /// Completions a `Later` answer runs from other threads (joined by the test).
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Fail blocking calls this often (percent); panic in `write` when `panic_writes`.
    fail_percent: u32,
    panic_writes: bool,
    /// A blocking `write` takes this long on this simulated clock.
    sim_write: Option<(Arc<zilla_core::env::SimEnv>, u64)>,
    delays: AtomicU64,
}

impl ModelVolume {
    fn new(seed: u64, fail_percent: u32) -> ModelVolume {
        ModelVolume {
            data: MemVolume::new("model/vol", VOLUME_BYTES, BLOCK_BYTES),
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
            threads: Mutex::new(Vec::new()),
            fail_percent,
            panic_writes: false,
            sim_write: None,
            delays: AtomicU64::new(0),
        }
    }

    fn way(&self) -> Way {
        match self.rng.lock().gen_range(0..100) {
            0..=29 => Way::Now,
            30..=59 => Way::Later,
            60..=84 => Way::GiveUp,
            85..=89 => Way::Drop,
            _ => Way::Fail,
        }
    }

    fn fails(&self) -> bool {
        self.fail_percent > 0 && self.rng.lock().gen_range(0..100) < self.fail_percent
    }

    fn later(&self, work: impl FnOnce() + Send + 'static) {
        let pause_us = self.rng.lock().gen_range(0..500);
        self.threads.lock().push(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(pause_us));
            work()
        }));
    }

    fn join(&self) {
        loop {
            let Some(thread) = self.threads.lock().pop() else { break };
            thread.join().unwrap();
        }
    }

    fn io_error() -> Error {
        Error::Io(std::io::Error::from_raw_os_error(libc_eio()))
    }

    fn shared_copy(&self, offset: u64, len: u64) -> Result<Vec<SharedSlice>> {
        let mut buffer = vec![0u8; len as usize];
        self.data.read(offset, &mut buffer)?;
        Ok(vec![SharedSlice::new(std::sync::Arc::new(zilla_frontend::volume::AlignedBuf::from(buffer)), 0, len as usize).unwrap()])
    }
}

fn libc_eio() -> i32 {
    5
}

impl BlockVolume for ModelVolume {
    fn name(&self) -> String {
        self.data.name()
    }
    fn size(&self) -> u64 {
        self.data.size()
    }
    fn block_size(&self) -> u32 {
        self.data.block_size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if self.fails() {
            return Err(ModelVolume::io_error());
        }
        self.data.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        assert!(!self.panic_writes, "model volume: a write panics");
        if let Some((env, took_ns)) = &self.sim_write {
            zilla_core::env::Env::sleep_ns(&**env, *took_ns);
        }
        if self.fails() {
            return Err(ModelVolume::io_error());
        }
        self.data.write(offset, data, fua)
    }
    fn flush(&self) -> Result<()> {
        if self.fails() {
            return Err(ModelVolume::io_error());
        }
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> Result<()> {
        self.data.unmap(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.data.write_zeroes(offset, len)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.data.block_status(offset, len)
    }
    fn try_read_cached_shared(&self, offset: u64, len: u64) -> Option<Result<Vec<SharedSlice>>> {
        match self.way() {
            Way::Now => Some(self.shared_copy(offset, len)),
            Way::Fail => Some(Err(ModelVolume::io_error())),
            _ => None,
        }
    }
    fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<()>> {
        (self.way() == Way::Now).then(|| self.data.read(offset, buf))
    }
    fn try_write_nonblocking(&self, offset: u64, data: &WriteData) -> Option<Result<()>> {
        match self.way() {
            Way::Now => Some(self.data.write(offset, &data.to_vec(), false)),
            Way::Fail => Some(Err(ModelVolume::io_error())),
            _ => None,
        }
    }
    fn try_write_nonblocking_sync(&self, offset: u64, data: &WriteData, fua: bool) -> Option<Result<bool>> {
        match self.way() {
            Way::Now | Way::Later => Some(self.data.write(offset, &data.to_vec(), false).map(|()| fua)),
            Way::Fail => Some(Err(ModelVolume::io_error())),
            _ => None,
        }
    }
    fn flush_async(&self, done: CommitDone) {
        match self.way() {
            Way::Now => done(Some(Ok(()))),
            Way::Later => self.later(move || done(Some(Ok(())))),
            Way::GiveUp => done(None),
            Way::Drop => drop(done),
            Way::Fail => done(Some(Err(ModelVolume::io_error()))),
        }
    }
    fn read_async(&self, offset: u64, len: u64, done: ReadDone) {
        match self.way() {
            Way::Now => done(Some(self.shared_copy(offset, len))),
            Way::Later => {
                let result = self.shared_copy(offset, len);
                self.later(move || done(Some(result)))
            }
            Way::GiveUp => done(None),
            Way::Drop => drop(done),
            Way::Fail => done(Some(Err(ModelVolume::io_error()))),
        }
    }
    fn claim_write_delay(&self, _len: u64) -> WriteDelay {
        if self.rng.lock().gen_range(0..100) < 20 {
            self.delays.fetch_add(1, Ordering::Relaxed);
            WriteDelay::After(Duration::from_micros(200))
        } else {
            WriteDelay::None
        }
    }
}

/// A completer that sends its request's id and completion to the test ("the
/// connection"); counts how often it was called.
struct TestCompleter {
    id: u64,
    to: mpsc::Sender<(u64, Completion)>,
    calls: Arc<AtomicUsize>,
}

impl Completer for TestCompleter {
    fn complete(self, completion: Completion) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        // a closed connection: the completion (and its admission) is dropped here
        let _ = self.to.send((self.id, completion));
    }
}

fn frontend() -> Arc<Frontend> {
    Frontend::new(Arc::new(StaticRegistry::new()), FrontendConfig::default())
}

fn seed() -> u64 {
    std::env::var("ZILLA_EXECUTOR_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

/// A random request of any kind inside the volume, with the memory units it admits.
fn random_command(rng: &mut impl Rng, frontend: &Frontend) -> (Command, usize) {
    let block = u64::from(BLOCK_BYTES);
    let offset = rng.gen_range(0..VOLUME_BYTES / block - 8) * block;
    let length = rng.gen_range(1..=4u64) * block;
    let fua = rng.gen_bool(0.3);
    let data = |rng: &mut dyn rand::RngCore| {
        let mut data = frontend.buffers.take(length as usize);
        rng.fill_bytes(&mut data);
        data
    };
    let command = match rng.gen_range(0..9) {
        0 | 1 => Command::Read { offset, length: length as u32, prefix_bytes: 16, holes: rng.gen_bool(0.5) },
        2 | 3 => Command::Write { offset, data: WriteData::copy_of(&data(rng)), fua },
        4 => Command::Flush,
        5 => Command::Unmap { offset, length, fua },
        6 => Command::WriteZeroes { offset, length, fua },
        7 => Command::WriteSame { offset, length, pattern: vec![rng.gen(); 512], fua },
        _ => Command::CompareAndWrite { offset, compare: vec![0; length as usize], data: data(rng), fua },
    };
    (command, length as usize + 64)
}

/// Submit `count` random requests with up to `depth` in flight; returns the ids seen
/// completed and how many came back inline.
fn run_random(volume: Arc<ModelVolume>, frontend: &Arc<Frontend>, seed: u64, count: u64, drop_connection_at: Option<u64>) -> (HashMap<u64, usize>, usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (to, from) = mpsc::channel();
    let mut from = Some(from);
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut inline = 0;
    runtime.block_on(async {
        let executor = Executor::new(frontend, volume.clone(), "model/vol", 8, zilla_frontend::SessionLabels::anonymous("test"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for id in 0..count {
            if Some(id) == drop_connection_at {
                from = None; // the client disconnects: completions from now on go nowhere
            }
            let (command, units) = random_command(&mut rng, frontend);
            // completions not yet taken hold admissions: take them while waiting
            let admission = loop {
                if let Some(admission) = executor.try_admit(units) {
                    break admission;
                }
                drain(&from, &mut seen);
                tokio::time::sleep(Duration::from_micros(100)).await;
            };
            let request = Request { command, started_ns: executor.now_ns() };
            let completer_for = |id| TestCompleter { id, to: to.clone(), calls: calls.clone() };
            match executor.submit(request, admission, || completer_for(id)) {
                Submitted::Inline(completion) => {
                    inline += 1;
                    completer_for(id).complete(completion);
                }
                Submitted::Started => {}
                Submitted::Blocked(blocked) => executor.resume(blocked, || {}).await,
            }
            drain(&from, &mut seen);
        }
        drop(to);
        // the completions still on their way hold admissions: keep taking them
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !executor.nothing_in_flight() {
            assert!(tokio::time::Instant::now() < deadline, "seed {seed}: every admission comes back");
            tokio::time::sleep(Duration::from_millis(1)).await;
            drain(&from, &mut seen);
        }
        volume.join();
        drain(&from, &mut seen);
    });
    assert_eq!(calls.load(Ordering::SeqCst) as u64, count, "seed {seed}: completers called once per request");
    (seen, inline)
}

/// Take the completions delivered so far (dropping them returns their admissions).
fn drain(from: &Option<mpsc::Receiver<(u64, Completion)>>, seen: &mut HashMap<u64, usize>) {
    if let Some(from) = from {
        for (id, _completion) in from.try_iter() {
            *seen.entry(id).or_default() += 1;
        }
    }
}

fn assert_budgets_returned(frontend: &Frontend, seed: u64) {
    let stats = frontend.stats();
    assert_eq!(stats.memory.in_use, 0, "seed {seed}: memory budget returned");
    assert_eq!(stats.volume_calls.in_use, 0, "seed {seed}: volume-call budget returned");
}

#[test]
fn every_request_kind_and_path_completes_exactly_once_and_returns_its_budget() {
    for round in 0..4 {
        let seed = seed().wrapping_add(round);
        let frontend = frontend();
        let volume = Arc::new(ModelVolume::new(seed, 10));
        let (seen, inline) = run_random(volume.clone(), &frontend, seed, 400, None);
        assert_eq!(seen.len(), 400, "seed {seed}: every request completed");
        assert!(seen.values().all(|&n| n == 1), "seed {seed}: no request completed twice");
        assert!(inline > 0 && inline < 400, "seed {seed}: both inline and later completions ({inline})");
        assert!(volume.delays.load(Ordering::Relaxed) > 0, "seed {seed}: some writes took the throttle delay");
        assert_budgets_returned(&frontend, seed);
        let snapshot = frontend.io_stats.volume_snapshot("model/vol");
        let ops = snapshot.read_ops + snapshot.write_ops + snapshot.flush_ops + snapshot.trim_ops + snapshot.other_ops;
        assert_eq!(ops, 400, "seed {seed}: the statistics count every request once: {snapshot:?}");
        assert!(snapshot.error_ops > 0, "seed {seed}: the injected errors are counted");
    }
}

#[test]
fn a_disconnected_client_still_gets_every_budget_back() {
    let seed = seed();
    let frontend = frontend();
    let volume = Arc::new(ModelVolume::new(seed, 5));
    let (seen, _inline) = run_random(volume, &frontend, seed, 300, Some(100));
    assert!(seen.len() <= 100, "seed {seed}: nothing delivered after the disconnect");
    assert_budgets_returned(&frontend, seed);
}

/// Run one request to its completion.
fn run_one(volume: Arc<dyn BlockVolume>, frontend: &Arc<Frontend>, command: Command) -> Completion {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    runtime.block_on(async {
        let executor = Executor::new(frontend, volume, "model/vol", 4, zilla_frontend::SessionLabels::anonymous("test"));
        let (to, from) = mpsc::channel();
        let admission: Admission = executor.admit(1 << 20, || {}).await;
        let request = Request { command, started_ns: executor.now_ns() };
        let completer = TestCompleter { id: 0, to, calls: Arc::new(AtomicUsize::new(0)) };
        match executor.submit(request, admission, || completer) {
            Submitted::Inline(completion) => completion,
            Submitted::Started => tokio::task::spawn_blocking(move || from.recv_timeout(Duration::from_secs(10)).unwrap().1).await.unwrap(),
            Submitted::Blocked(_) => panic!("one request cannot wait for a permit"),
        }
    })
}

#[test]
fn a_blocking_call_that_panics_is_answered_with_an_io_error() {
    let frontend = frontend();
    let mut model = ModelVolume::new(1, 0);
    model.panic_writes = true;
    let volume = Arc::new(model);
    // WriteSame always runs on the blocking pool, where `write` panics
    let command = Command::WriteSame { offset: 0, length: 8192, pattern: vec![7; 512], fua: false };
    let completion = run_one(volume, &frontend, command);
    assert!(matches!(completion.result, Err(Error::Io(_))), "{:?}", completion.result);
    drop(completion);
    assert_budgets_returned(&frontend, 1);
}

#[test]
fn latency_is_measured_on_the_front_ends_clock() {
    // Goal: a front end on a simulated Env records simulated latencies (what an
    // Analytics heat map of a simulated pool shows), not the OS clock's.
    // Method: WRITE SAME runs on the blocking pool, where the volume's write takes one
    // simulated second (and no real time); the session's recorder must put it in the
    // one-second bucket.
    let env = Arc::new(zilla_core::env::SimEnv::new(3));
    let env_dyn: Arc<dyn zilla_core::env::Env> = env.clone();
    let frontend = Frontend::with_env(Arc::new(StaticRegistry::new()), FrontendConfig::default(), &env_dyn);
    let mut model = ModelVolume::new(1, 0);
    model.sim_write = Some((env.clone(), 1_000_000_000));
    let real = std::time::Instant::now();
    let done = run_one(Arc::new(model), &frontend, Command::WriteSame { offset: 0, length: 8192, pattern: vec![7; 512], fua: false });
    assert!(matches!(done.result, Ok(Output::Done)), "{:?}", done.result);
    drop(done);
    let one_second = zilla_frontend::iostats::bucket_of(1_000_000_000);
    let totals = &frontend.io_stats.volume_totals()[0].1;
    let write_same = totals.kind(zilla_frontend::IoKind::WriteZeroes);
    assert_eq!((write_same.ops, write_same.latency[one_second]), (1, 1), "one request in the simulated second's bucket: {write_same:?}");
    assert!(real.elapsed() < Duration::from_secs(1), "a simulated second took {:?}", real.elapsed());
}

#[test]
fn write_same_compare_and_write_and_holes_do_what_scsi_and_nbd_expect() {
    let frontend = frontend();
    let volume: Arc<dyn BlockVolume> = Arc::new(MemVolume::new("model/vol", VOLUME_BYTES, BLOCK_BYTES));
    let pattern: Vec<u8> = (0..512u32).map(|i| (i % 251) as u8).collect();
    let done = run_one(volume.clone(), &frontend, Command::WriteSame { offset: 8192, length: 3 << 20, pattern: pattern.clone(), fua: true });
    assert!(matches!(done.result, Ok(Output::Done)), "{:?}", done.result);
    let mut back = vec![0u8; 3 << 20];
    volume.read(8192, &mut back).unwrap();
    assert!(back.chunks(512).all(|chunk| chunk == &pattern[..]), "the pattern fills the range");
    // a length that is not a multiple of the pattern is refused
    let bad = run_one(volume.clone(), &frontend, Command::WriteSame { offset: 0, length: 1000, pattern: vec![1; 512], fua: false });
    assert!(matches!(bad.result, Err(Error::InvalidArgument(_))), "{:?}", bad.result);

    let new: Vec<u8> = vec![0xab; 4096];
    let wrong = run_one(volume.clone(), &frontend, Command::CompareAndWrite { offset: 8192, compare: vec![0; 4096], data: new.clone(), fua: false });
    assert!(matches!(wrong.result, Ok(Output::Miscompare { offset: 1 })), "first differing byte: {:?}", wrong.result);
    let right = run_one(
        volume.clone(),
        &frontend,
        Command::CompareAndWrite { offset: 8192, compare: back[..4096].to_vec(), data: new.clone(), fua: true },
    );
    assert!(matches!(right.result, Ok(Output::Done)), "{:?}", right.result);
    volume.read(8192, &mut back[..4096]).unwrap();
    assert_eq!(&back[..4096], &new[..]);

    let hole = run_one(volume.clone(), &frontend, Command::Read { offset: (3 << 20) + (256 << 10), length: 8192, prefix_bytes: 0, holes: true });
    assert!(matches!(hole.result, Ok(Output::Data(ReadData::Hole))), "{:?}", hole.result);
    let data = run_one(volume.clone(), &frontend, Command::Read { offset: 8192, length: 4096, prefix_bytes: 16, holes: true });
    match data.result {
        Ok(Output::Data(ReadData::Copied(buffer))) => assert_eq!(&buffer[16..], &new[..]),
        other => panic!("read: {other:?}"),
    }
    let status = run_one(volume, &frontend, Command::BlockStatus { offset: 0, length: VOLUME_BYTES });
    match status.result {
        Ok(Output::Extents(extents)) => assert!(extents.iter().any(|e| e.hole) && extents.iter().any(|e| !e.hole)),
        other => panic!("block status: {other:?}"),
    }
}

#[test]
fn requests_a_protocol_refuses_are_counted_as_errors() {
    let frontend = frontend();
    let volume: Arc<dyn BlockVolume> = Arc::new(MemVolume::new("model/vol", VOLUME_BYTES, BLOCK_BYTES));
    let clients = zilla_frontend::ClientStatsTable::new(4);
    let client = clients.connect("test", "client");
    let labels = zilla_frontend::SessionLabels { protocol: "test", client: Some(client.stats().clone()) };
    let executor = Executor::new(&frontend, volume, "model/vol", 4, labels);
    executor.refuse(zilla_frontend::IoKind::Write, 4096, executor.now_ns());
    let snapshots = [
        ("volume", frontend.io_stats.volume_snapshot("model/vol")),
        ("protocol", frontend.io_stats.protocol_totals()["test"].snapshot()),
        ("client", clients.snapshot(&frontend.io_stats)[0].io.clone()),
    ];
    for (what, snapshot) in snapshots {
        assert_eq!((snapshot.write_ops, snapshot.error_ops), (1, 1), "{what}: {snapshot:?}");
    }
    drop(executor);
    assert_eq!(frontend.io_stats.volume_snapshot("model/vol").error_ops, 1, "the ended session's count stays");
}
