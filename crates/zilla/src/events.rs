//! events: the daemon's side of pool events (`zilla pool events`), the role zed plays.
//!
//! Theory of operation
//! -------------------
//! The engine posts events into its bounded queue (zilla_core::fm). One thread here
//! (the pump) takes each new one, names the pool of a device event (the engine's vdev
//! layer knows the device, not its pool), writes it to the daemon's log (error reports
//! and state changes away from ONLINE at warn, the rest at info), and keeps it in the
//! [`EventStore`]:
//!
//! ```text
//!   fm queue ──pump (200 ms)──► EventStore: ring of at most zfs_zevent_len_max
//!                               │   events, each with the store's own id (eid)
//!                               └─► DIR/events.jsonl: one JSON event per line,
//!                                   appended; rewritten from the ring once it
//!                                   passes EVENTS_FILE_MAX_BYTES
//! ```
//!
//! The store's ids continue across restarts (the file's largest id + 1), so a follower
//! (`pool events -f`, which asks for the events after the last id it printed) never
//! sees an event twice. A torn last line (a crash mid-append) is skipped when the file
//! is read; a file that cannot be written costs the persistence, not the events: they
//! stay in memory and the failure is logged once.

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use zilla_core::fm::{Event, Value};

pub const EVENTS_FILE_NAME: &str = "events.jsonl";
const EVENTS_TMP_NAME: &str = "events.jsonl.tmp";
/// Bound of DIR/events.jsonl; past it the file is rewritten from the newest events
/// (at most half of it).
pub const EVENTS_FILE_MAX_BYTES: usize = 1 << 20;
/// Bound of one stored event line (longer ones are not kept).
const EVENT_LINE_MAX_BYTES: usize = 16 << 10;
/// How often the pump looks at the engine's queue when nothing was posted.
const PUMP_WAIT: Duration = Duration::from_millis(200);

/// The events this daemon keeps, oldest first.
pub struct EventStore {
    dir: PathBuf,
    inner: Mutex<StoreInner>,
    added: Condvar,
}

#[derive(Default)]
struct StoreInner {
    events: VecDeque<Event>,
    next_eid: u64,
    file_bytes: usize,
    /// A write of the file failed (logged once; the events stay in memory).
    write_failed: bool,
}

fn max_events() -> usize {
    zilla_core::fm::ZFS_ZEVENT_LEN_MAX.get().max(1) as usize
}

/// The events a file's bytes hold: every line that parses (a torn one does not).
fn parse_lines(bytes: &[u8]) -> Vec<Event> {
    bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty() && l.len() <= EVENT_LINE_MAX_BYTES).filter_map(|l| serde_json::from_slice(l).ok()).collect()
}

impl EventStore {
    /// The store of `dir`, with the events DIR/events.jsonl holds.
    pub fn open(dir: &Path) -> Arc<EventStore> {
        let path = dir.join(EVENTS_FILE_NAME);
        let mut inner = StoreInner::default();
        match crate::state_dir::read_regular_file(&path, (2 * EVENTS_FILE_MAX_BYTES) as u64) {
            Ok(bytes) => {
                inner.file_bytes = bytes.len();
                for e in parse_lines(&bytes) {
                    inner.next_eid = inner.next_eid.max(e.eid);
                    inner.events.push_back(e);
                }
                while inner.events.len() > max_events() {
                    inner.events.pop_front();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("cannot read the events file {}: {e}; starting with no events", path.display()),
        }
        Arc::new(EventStore { dir: dir.to_path_buf(), inner: Mutex::new(inner), added: Condvar::new() })
    }

    /// Keep `e` (it gets the store's next id) and append it to the file.
    pub fn add(&self, mut e: Event) {
        let mut g = self.inner.lock();
        g.next_eid += 1;
        e.eid = g.next_eid;
        let Ok(mut line) = serde_json::to_vec(&e) else { return };
        line.push(b'\n');
        while g.events.len() >= max_events() {
            g.events.pop_front();
        }
        g.events.push_back(e);
        if line.len() <= EVENT_LINE_MAX_BYTES {
            if g.file_bytes + line.len() > EVENTS_FILE_MAX_BYTES {
                self.rewrite(&mut g);
            } else {
                let r = self.append_line(&line);
                self.note_write(&mut g, r, line.len());
            }
        }
        drop(g);
        self.added.notify_all();
    }

    fn append_line(&self, line: &[u8]) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.dir.join(EVENTS_FILE_NAME))?;
        f.write_all(line)
    }

    fn note_write(&self, g: &mut StoreInner, r: std::io::Result<()>, bytes: usize) {
        match r {
            Ok(()) => {
                g.file_bytes += bytes;
                if g.write_failed {
                    g.write_failed = false;
                    tracing::info!("the events file {} is written again", self.dir.join(EVENTS_FILE_NAME).display());
                }
            }
            Err(e) if !g.write_failed => {
                g.write_failed = true;
                tracing::warn!("cannot write the events file {}: {e}; events are kept in memory only", self.dir.join(EVENTS_FILE_NAME).display());
            }
            Err(_) => {}
        }
    }

    /// Replace the file with the newest events that fit in half its bound.
    fn rewrite(&self, g: &mut StoreInner) {
        let mut lines: Vec<Vec<u8>> = Vec::new();
        let mut total = 0;
        for e in g.events.iter().rev() {
            let Ok(mut l) = serde_json::to_vec(e) else { continue };
            l.push(b'\n');
            if total + l.len() > EVENTS_FILE_MAX_BYTES / 2 {
                break;
            }
            total += l.len();
            lines.push(l);
        }
        let bytes: Vec<u8> = lines.into_iter().rev().flatten().collect();
        let r = crate::state_dir::replace_private(&self.dir, EVENTS_FILE_NAME, EVENTS_TMP_NAME, &bytes);
        g.file_bytes = 0;
        self.note_write(g, r, bytes.len());
    }

    /// The events of `pool` (every pool when `None`) with an id above `after`.
    fn select(g: &StoreInner, pool: Option<&str>, after: u64) -> Vec<Event> {
        g.events.iter().filter(|e| e.eid > after && pool.is_none_or(|p| e.pool == p)).cloned().collect()
    }

    /// The events of `pool` (every pool when `None`) with an id above `after`,
    /// waiting up to `timeout` for one when there is none yet.
    pub fn wait_list(&self, pool: Option<&str>, after: u64, timeout: Duration) -> Vec<Event> {
        let deadline = std::time::Instant::now() + timeout;
        let mut g = self.inner.lock();
        loop {
            let got = Self::select(&g, pool, after);
            if !got.is_empty() || self.added.wait_until(&mut g, deadline).timed_out() {
                return got;
            }
        }
    }

    /// Forget every event (`pool events -c`); returns how many there were.
    pub fn clear(&self) -> usize {
        let mut g = self.inner.lock();
        let n = g.events.len();
        g.events.clear();
        self.rewrite(&mut g);
        n
    }
}

/// One line for the log: the class, then the pool, the device and the fields.
pub fn summary(e: &Event) -> String {
    let mut s = e.class.clone();
    if !e.pool.is_empty() {
        s.push_str(&format!(" pool={}", crate::clip::clip(&e.pool)));
    }
    if !e.vdev_path.is_empty() {
        s.push_str(&format!(" vdev={}", zilla_core::spa::printable(&e.vdev_path)));
    }
    for (k, v) in &e.fields {
        match v {
            Value::U64(n) if k.starts_with("zio_offset") || k.starts_with("zio_size") => s.push_str(&format!(" {k}={n:#x}")),
            Value::U64(n) => s.push_str(&format!(" {k}={n}")),
            Value::Str(t) => s.push_str(&format!(" {k}={}", zilla_core::spa::printable(t))),
        }
    }
    s
}

/// Name the pool of `e` when the poster did not (a device event: the pool that has
/// the device), and its guid.
fn name_pool(e: &mut Event, pools: &crate::pools::PoolTable) {
    if e.pool.is_empty() && e.vdev_guid != 0 {
        let g = zilla_core::Guid(e.vdev_guid);
        if let Some((name, p)) = pools.all().into_iter().find(|(_, p)| p.has_leaf(g)) {
            e.pool = name;
            e.pool_guid = p.guid().get();
        }
    }
    if e.pool_guid == 0 && !e.pool.is_empty() {
        if let Some(p) = pools.get(&e.pool) {
            e.pool_guid = p.guid().get();
        }
    }
}

/// The id of the last engine event the pump took (one pump at a time: the thread, or
/// the flush before the daemon exits).
static PUMPED: Mutex<u64> = Mutex::new(0);

/// Take every event the engine posted since the last time, waiting up to `wait` for
/// one: name its pool, log it, keep it.
pub fn pump_once(store: &EventStore, pools: &crate::pools::PoolTable, wait: Duration) {
    let mut seen = PUMPED.lock();
    for mut e in zilla_core::fm::wait_after(*seen, wait) {
        *seen = (*seen).max(e.eid);
        name_pool(&mut e, pools);
        if e.is_error() {
            tracing::warn!("event: {}", summary(&e));
        } else {
            tracing::info!("event: {}", summary(&e));
        }
        store.add(e);
    }
}

/// Take what the engine posted and the pump has not taken yet (before the daemon exits).
pub fn flush(store: &EventStore, pools: &crate::pools::PoolTable) {
    pump_once(store, pools, Duration::ZERO);
}

/// The pump thread: runs for the daemon's life.
pub fn spawn_pump(store: Arc<EventStore>, pools: Arc<crate::pools::PoolTable>) {
    let r = std::thread::Builder::new().name("zilla-events".into()).spawn(move || loop {
        pump_once(&store, &pools, PUMP_WAIT);
    });
    if let Err(e) = r {
        tracing::error!("cannot start the events thread: {e}; pool events are not recorded");
    }
}

/// `zpool events` time: "Dec  2 2026 04:55:01.123456789" (UTC).
pub fn event_time(ns: u64) -> String {
    let t = crate::status_text::fmt_time(ns / 1_000_000_000);
    // "Wed Dec  2 04:55:01 2026" -> "Dec  2 2026 04:55:01"
    let (month_day, rest) = (&t[4..10], &t[11..]);
    let (clock, year) = rest.split_at(8);
    format!("{month_day} {} {clock}.{:09}", year.trim(), ns % 1_000_000_000)
}

/// `zpool events -v`: the event's line, then its fields indented by 8, then a blank line.
pub fn verbose_text(e: &Event) -> String {
    let mut s = format!("{} {}\n", event_time(e.time_ns), e.class);
    let q = |t: &str| format!("\"{}\"", zilla_core::spa::printable(t));
    s.push_str(&format!("        class = {}\n", q(&e.class)));
    if !e.pool.is_empty() {
        s.push_str(&format!("        pool = {}\n", q(&e.pool)));
        s.push_str(&format!("        pool_guid = {:#x}\n", e.pool_guid));
    }
    if e.vdev_guid != 0 {
        s.push_str(&format!("        vdev_guid = {:#x}\n", e.vdev_guid));
    }
    if !e.vdev_path.is_empty() {
        s.push_str(&format!("        vdev_path = {}\n", q(&e.vdev_path)));
    }
    for (k, v) in &e.fields {
        match v {
            Value::U64(n) => s.push_str(&format!("        {k} = {n:#x}\n")),
            Value::Str(t) => s.push_str(&format!("        {k} = {}\n", q(t))),
        }
    }
    s.push_str(&format!("        time = {:#x} {:#x}\n", e.time_ns / 1_000_000_000, e.time_ns % 1_000_000_000));
    s.push_str(&format!("        eid = {:#x}\n\n", e.eid));
    s
}

/// What the event and history routes read.
#[derive(Clone)]
pub struct EventsApi {
    pub store: Arc<EventStore>,
    pub pools: Arc<crate::pools::PoolTable>,
}

/// Longest wait a follower (`pool events -f`) may ask for.
const FOLLOW_WAIT_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, Default, serde::Deserialize)]
pub struct EventsQuery {
    /// Only events with a larger id.
    #[serde(default)]
    pub after: u64,
    /// Wait up to this long (ms, at most 30 s) for one when there is none yet.
    #[serde(default)]
    pub wait_ms: u64,
    #[serde(default)]
    pub pool: Option<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ClearedEvents {
    pub cleared: usize,
}

/// `/v1/pools/{pool}/history`: the pool's command history, oldest first.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct HistoryReply {
    pub pool: String,
    pub records: Vec<zilla_core::spa_history::HistoryRecord>,
    /// Records dropped to keep the history's bound.
    pub dropped: u64,
}

type ApiResult<T> = Result<axum::Json<T>, crate::api_error::ApiError>;

/// The event and history routes of the admin socket.
pub fn routes(api: EventsApi) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/v1/events", get(events_all).delete(events_clear))
        .route("/v1/pools/{pool}/events", get(events_of_pool))
        .route("/v1/pools/{pool}/history", get(history_of_pool))
        .with_state(api)
}

async fn events_list(api: EventsApi, pool: Option<String>, q: EventsQuery) -> ApiResult<Vec<Event>> {
    let wait = Duration::from_millis(q.wait_ms).min(FOLLOW_WAIT_MAX);
    let got = tokio::task::spawn_blocking(move || api.store.wait_list(pool.as_deref(), q.after, wait)).await;
    got.map(axum::Json).map_err(|e| crate::api_error::ApiError(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn events_all(axum::extract::State(api): axum::extract::State<EventsApi>, axum::extract::Query(q): axum::extract::Query<EventsQuery>) -> ApiResult<Vec<Event>> {
    if let Some(p) = &q.pool {
        crate::reads::pool_named(&api.pools, p)?;
    }
    let pool = q.pool.clone();
    events_list(api, pool, q).await
}

async fn events_of_pool(
    axum::extract::State(api): axum::extract::State<EventsApi>,
    axum::extract::Path(pool): axum::extract::Path<String>,
    axum::extract::Query(q): axum::extract::Query<EventsQuery>,
) -> ApiResult<Vec<Event>> {
    crate::reads::pool_named(&api.pools, &pool)?;
    events_list(api, Some(pool), q).await
}

async fn events_clear(axum::extract::State(api): axum::extract::State<EventsApi>) -> ApiResult<ClearedEvents> {
    let store = api.store.clone();
    let n = tokio::task::spawn_blocking(move || store.clear()).await.unwrap_or(0);
    tracing::info!("cleared {n} events");
    Ok(axum::Json(ClearedEvents { cleared: n }))
}

async fn history_of_pool(axum::extract::State(api): axum::extract::State<EventsApi>, axum::extract::Path(pool): axum::extract::Path<String>) -> ApiResult<HistoryReply> {
    let p = crate::reads::pool_named(&api.pools, &pool)?;
    let (records, dropped) = p.history();
    Ok(axum::Json(HistoryReply { pool, records, dropped }))
}

/// Post an event the daemon itself sees (a pool created, imported, exported or
/// destroyed; a device added, attached, detached, replaced, brought online, cleared).
pub fn post_admin(class: &str, pool: &str, device: Option<&str>, replacing: Option<&str>) {
    let mut e = Event::new(class).pool(pool);
    if let Some(d) = device {
        e.vdev_path = d.to_string();
    }
    if let Some(old) = replacing {
        e = e.str("vdev_replacing", old);
    }
    zilla_core::fm::post(e);
}

/// The event of a device operation that succeeded (`pool attach`, `detach`, ...).
pub fn post_device_op(pool: &str, op: &str, device: Option<&str>, new: Option<&str>) {
    match op {
        "attach" => post_admin("sysevent.fs.zfs.vdev_attach", pool, new, None),
        "replace" => post_admin("sysevent.fs.zfs.vdev_attach", pool, new.or(device), device),
        "detach" | "remove" => post_admin("sysevent.fs.zfs.vdev_remove", pool, device, None),
        "online" => post_admin("sysevent.fs.zfs.vdev_online", pool, device, None),
        "clear" => post_admin("sysevent.fs.zfs.vdev_clear", pool, device, None),
        _ => {}
    }
}

/// `zilla pool events` and `zilla pool history` (flattened into the pool commands).
#[derive(Debug, clap::Subcommand)]
pub enum LogCmd {
    /// Show the events the daemon saw (as zpool events): scrubs, repairs, errors,
    /// device changes
    Events {
        /// Verbose: every field of each event
        #[arg(short = 'v')]
        verbose: bool,
        /// Follow: print new events as they happen, until interrupted
        #[arg(short = 'f')]
        follow: bool,
        /// Clear every event
        #[arg(short = 'c', conflicts_with_all = ["verbose", "follow", "pool"])]
        clear: bool,
        /// Scripted: no header, fields separated by a tab
        #[arg(short = 'H')]
        scripted: bool,
        pool: Option<String>,
    },
    /// Show the commands that changed a pool (as zpool history)
    History {
        /// Long format: the user, host and origin of each command
        #[arg(short = 'l')]
        long: bool,
        pools: Vec<String>,
    },
}

/// How long one follow request waits for an event.
const FOLLOW_POLL_MS: u64 = 10_000;

fn event_line(e: &Event, verbose: bool, scripted: bool) -> String {
    if verbose {
        return verbose_text(e);
    }
    let sep = if scripted { "\t" } else { " " };
    format!("{}{sep}{}\n", event_time(e.time_ns), e.class)
}

pub async fn log_cmd(c: &crate::client::Client, cmd: LogCmd) -> Result<(), String> {
    use crate::client::enc;
    match cmd {
        LogCmd::Events { clear: true, .. } => {
            let r: ClearedEvents = c.delete("/v1/events").await?;
            println!("cleared {} events", r.cleared);
        }
        LogCmd::Events { verbose, follow, scripted, pool, .. } => {
            let route = match &pool {
                Some(p) => format!("/v1/pools/{}/events", enc(p)),
                None => "/v1/events".to_string(),
            };
            let cannot = |e: String| match &pool {
                Some(p) => format!("cannot get events for '{p}': {e}"),
                None => e,
            };
            let (mut after, mut first) = (0, true);
            loop {
                let wait = if follow && !first { FOLLOW_POLL_MS } else { 0 };
                let got: Vec<Event> = c.get(&format!("{route}?after={after}&wait_ms={wait}")).await.map_err(cannot)?;
                let mut out = String::new();
                if first && !scripted && !verbose {
                    out.push_str(&format!("{:<30} CLASS\n", "TIME"));
                }
                first = false;
                for e in &got {
                    after = after.max(e.eid);
                    out.push_str(&event_line(e, verbose, scripted));
                }
                print!("{out}");
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
                if !follow {
                    break;
                }
            }
        }
        LogCmd::History { long, pools } => {
            let pools = if pools.is_empty() {
                let rows: Vec<zilla_core::spa::PoolListRow> = c.get("/v1/pools").await?;
                if rows.is_empty() {
                    println!("no pools available");
                    return Ok(());
                }
                rows.into_iter().map(|r| r.name).collect()
            } else {
                pools
            };
            for p in pools {
                let h: HistoryReply = c.get(&format!("/v1/pools/{}/history", enc(&p))).await.map_err(|e| format!("cannot open '{p}': {e}"))?;
                print!("{}", crate::history::history_text(&h.pool, &h.records, long));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_survives_reopen_keeps_ids_and_skips_a_torn_line() {
        let t = tempfile::tempdir().unwrap();
        let s = EventStore::open(t.path());
        s.add(Event::new(zilla_core::fm::CLASS_SCRUB_START).pool("tank"));
        s.add(Event::new(zilla_core::fm::CLASS_CHECKSUM).pool("tank").u64("zio_offset", 4096));
        s.add(Event::new(zilla_core::fm::CLASS_SCRUB_START).pool("other"));
        let mut f = std::fs::OpenOptions::new().append(true).open(t.path().join(EVENTS_FILE_NAME)).unwrap();
        f.write_all(b"{\"eid\":99,\"class\":\"torn").unwrap();
        let s = EventStore::open(t.path());
        let all = s.wait_list(None, 0, Duration::ZERO);
        assert_eq!(all.iter().map(|e| e.eid).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(s.wait_list(Some("tank"), 0, Duration::ZERO).len(), 2);
        assert_eq!(s.wait_list(Some("tank"), 1, Duration::ZERO)[0].field_u64("zio_offset"), Some(4096));
        s.add(Event::new("x"));
        assert_eq!(s.wait_list(None, 3, Duration::ZERO)[0].eid, 4, "ids continue after a restart");
        assert_eq!(s.clear(), 4);
        assert!(EventStore::open(t.path()).wait_list(None, 0, Duration::ZERO).is_empty());
    }

    #[test]
    fn the_file_stays_within_its_bound() {
        let t = tempfile::tempdir().unwrap();
        let s = EventStore::open(t.path());
        let pad = "p".repeat(2000);
        for i in 0..2000u64 {
            s.add(Event::new(zilla_core::fm::CLASS_IO).pool("tank").u64("i", i).str("pad", &pad));
            let len = std::fs::metadata(t.path().join(EVENTS_FILE_NAME)).unwrap().len() as usize;
            assert!(len <= EVENTS_FILE_MAX_BYTES, "{len}");
        }
        assert!(s.wait_list(None, 0, Duration::ZERO).len() <= max_events());
        let back = EventStore::open(t.path()).wait_list(None, 0, Duration::ZERO);
        assert_eq!(back.last().unwrap().field_u64("i"), Some(1999));
    }

    #[test]
    fn formats_as_zpool_events() {
        assert_eq!(event_time(1_795_290_300_000_000_123), "Nov 21 2026 19:45:00.000000123");
        let mut e = Event::new(zilla_core::fm::CLASS_CHECKSUM).pool("tank").vdev(zilla_core::Guid(0xab), "/d/1").u64("zio_offset", 0x1000);
        e.eid = 7;
        e.time_ns = 1_795_290_300_000_000_123;
        let v = verbose_text(&e);
        assert!(v.starts_with("Nov 21 2026 19:45:00.000000123 ereport.fs.zfs.checksum\n        class = \"ereport.fs.zfs.checksum\"\n"), "{v}");
        assert!(v.contains("        vdev_path = \"/d/1\"\n        zio_offset = 0x1000\n"), "{v}");
        assert!(v.ends_with("        eid = 0x7\n\n"), "{v}");
        assert_eq!(summary(&e), "ereport.fs.zfs.checksum pool=tank vdev=/d/1 zio_offset=0x1000");
    }
}
