//! history: recording admin commands in the pool's history (`zilla pool history`).
//!
//! Theory of operation
//! -------------------
//! One layer around the admin routes ([`record`]) sees every request. A request that
//! changes a pool (the routes [`target`] lists) is recorded in that pool's history
//! (zilla_core::spa_history, kept in the pool) with the command line the CLI sent in
//! the `x-zilla-command` header (`zilla pool attach tank d1 d2`; a caller without it is
//! recorded as `POST /v1/...`), the caller's user id (SO_PEERCRED on the admin socket),
//! the host and where it came from. A command is recorded once it succeeded, and the
//! layer waits for the txg that carries the record before it answers; `export` is
//! recorded before it runs (the pool is gone after it), as zpool logs it.
//!
//! A route added later that changes a pool must be added to [`target`]; reads and
//! routes that change no pool (tunables, iSCSI authentication, events) are not
//! recorded.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use zilla_core::spa_history::HistoryRecord;

use crate::pools::PoolTable;

/// Bound of a request body looked at for a pool name (admin bodies are small; a larger
/// one is not recorded).
const BODY_PEEK_MAX_BYTES: usize = 1 << 20;

/// When a command is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before it runs (export: the pool is gone after it).
    Before,
    /// After it succeeded.
    After,
}

/// Where the pool's name is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolAt {
    Path(String),
    /// The body's `name` field (`POOL` or `POOL/VOLUME`).
    Body,
}

/// Operations of `/v1/pools/{pool}/{op}` that change the pool.
const POOL_OPS: &[&str] = &["scrub", "trim", "add", "attach", "detach", "replace", "remove", "offline", "online", "clear", "upgrade", "reguid"];

/// The pool a request changes (if it changes one) and when to record it.
pub fn target(method: &Method, path: &str) -> Option<(PoolAt, Phase)> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let seg = |i: usize| segs.get(i).map(|s| percent_decode(s));
    match (method.as_str(), segs.as_slice()) {
        ("POST", ["", "v1", "pools"]) | ("POST", ["", "v1", "import"]) | ("POST", ["", "v1", "volumes"]) | ("POST", ["", "v1", "set"]) | ("POST", ["", "v1", "rename"]) => {
            Some((PoolAt::Body, Phase::After))
        }
        ("POST", ["", "v1", "pools", _, "export"]) => Some((PoolAt::Path(seg(3)?), Phase::Before)),
        ("POST", ["", "v1", "pools", _, op]) if POOL_OPS.contains(op) => Some((PoolAt::Path(seg(3)?), Phase::After)),
        ("DELETE", ["", "v1", "volumes", _, _]) => Some((PoolAt::Path(seg(3)?), Phase::After)),
        _ => None,
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The pool named by a request body's `name` (`POOL` or `POOL/VOLUME`).
fn body_pool(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    // a dataset's name, or the old name of a rename
    let name = v.get("name").or_else(|| v.get("from"))?.as_str()?;
    Some(name.split(['/', '@']).next()?.to_string())
}

/// The user name of `uid` from /etc/passwd (empty when it has none).
fn user_name(uid: u32) -> String {
    let Ok(text) = crate::state_dir::read_regular_file(std::path::Path::new("/etc/passwd"), 16 << 20) else { return String::new() };
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2].parse::<u32>().ok() == Some(uid)).then(|| f[0].to_string())
        })
        .unwrap_or_default()
}

/// The record of `req`'s command.
fn record_of(req: &Request) -> HistoryRecord {
    let cmd = match req.headers().get(crate::client::COMMAND_HEADER).and_then(|v| v.to_str().ok()) {
        Some(c) => percent_decode(c),
        None => format!("{} {}", req.method(), req.uri().path()),
    };
    let who = req.extensions().get::<crate::http_serve::PeerCred>().and_then(|c| c.uid);
    let client = match req.extensions().get::<crate::http_serve::PeerAddr>() {
        Some(a) => a.0.to_string(),
        None => "local".into(),
    };
    let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    HistoryRecord { time, cmd, who, user: who.map(user_name).unwrap_or_default(), host: zilla_core::env::system_hostname(), client }
}

/// Log `rec` in `pool` and wait for the txg that carries it.
async fn log_in(pools: &PoolTable, pool: &str, rec: HistoryRecord, pin: bool) {
    let Some(p) = pools.get(pool) else { return };
    p.log_history(rec, pin);
    let name = pool.to_string();
    let r = tokio::task::spawn_blocking(move || p.sync()).await;
    if let Ok(Err(e)) = r {
        tracing::warn!("pool '{}': the history record of a command is not on disk yet: {e}", crate::clip::clip(&name));
    }
}

/// The layer around the admin routes: records the commands that change a pool.
pub async fn record(State(pools): State<Arc<PoolTable>>, req: Request, next: Next) -> Response {
    let Some((at, phase)) = target(req.method(), req.uri().path()) else { return next.run(req).await };
    let rec = record_of(&req);
    let create = req.method() == Method::POST && req.uri().path().trim_end_matches('/') == "/v1/pools";
    let (req, pool) = match at {
        PoolAt::Path(p) => (req, Some(p)),
        PoolAt::Body => {
            let (parts, body) = req.into_parts();
            let bytes = match axum::body::to_bytes(body, BODY_PEEK_MAX_BYTES).await {
                Ok(b) => b,
                Err(e) => return axum::response::IntoResponse::into_response(crate::api_error::ApiError::bad(format!("cannot read the request: {e}"))),
            };
            let pool = body_pool(&bytes);
            (Request::from_parts(parts, axum::body::Body::from(bytes)), pool)
        }
    };
    let Some(pool) = pool else { return next.run(req).await };
    if phase == Phase::Before {
        log_in(&pools, &pool, rec, false).await;
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    if resp.status().is_success() {
        log_in(&pools, &pool, rec, create).await;
    }
    resp
}

/// "2026-12-02.04:55:01" (UTC), as zpool history prints a record's time.
pub fn history_time(secs: u64) -> String {
    let t = crate::status_text::fmt_time(secs);
    // "Wed Dec  2 04:55:01 2026"
    const M: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = M.iter().position(|m| *m == &t[4..7]).unwrap_or(0) + 1;
    let day: u32 = t[8..10].trim().parse().unwrap_or(0);
    format!("{}-{month:02}-{day:02}.{}", t[20..].trim(), &t[11..19])
}

/// `zpool history [-l]` for one pool.
pub fn history_text(pool: &str, records: &[HistoryRecord], long: bool) -> String {
    let mut s = format!("History for '{}':\n", zilla_core::spa::printable(pool));
    for r in records {
        s.push_str(&format!("{} {}", history_time(r.time), zilla_core::spa::printable(&r.cmd)));
        if long {
            s.push_str(" [");
            if let Some(uid) = r.who {
                s.push_str(&format!("user {uid} "));
                if !r.user.is_empty() {
                    s.push_str(&format!("({}) ", zilla_core::spa::printable(&r.user)));
                }
            }
            s.push_str(&format!("on {}", zilla_core::spa::printable(&r.host)));
            if !r.client.is_empty() {
                s.push_str(&format!(":{}", zilla_core::spa::printable(&r.client)));
            }
            s.push(']');
        }
        s.push('\n');
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_that_change_a_pool_are_recorded() {
        let post = Method::POST;
        assert_eq!(target(&post, "/v1/pools"), Some((PoolAt::Body, Phase::After)));
        assert_eq!(target(&post, "/v1/pools/tank/attach"), Some((PoolAt::Path("tank".into()), Phase::After)));
        assert_eq!(target(&post, "/v1/pools/tank/export"), Some((PoolAt::Path("tank".into()), Phase::Before)));
        assert_eq!(target(&Method::DELETE, "/v1/volumes/tank/vm1"), Some((PoolAt::Path("tank".into()), Phase::After)));
        assert_eq!(target(&post, "/v1/pools/t%2Dx/scrub"), Some((PoolAt::Path("t-x".into()), Phase::After)));
        assert_eq!(target(&post, "/v1/get"), None);
        assert_eq!(target(&post, "/v1/importable"), None);
        assert_eq!(target(&post, "/v1/tunables"), None);
        assert_eq!(target(&post, "/v1/pools/tank/wait"), None);
        assert_eq!(target(&Method::GET, "/v1/pools/tank/history"), None);
        assert_eq!(body_pool(br#"{"name":"tank/vm1","volsize":1}"#).as_deref(), Some("tank"));
        assert_eq!(target(&post, "/v1/rename"), Some((PoolAt::Body, Phase::After)));
        assert_eq!(body_pool(br#"{"from":"tank/vm1","to":"tank/vm2"}"#).as_deref(), Some("tank"));
        assert_eq!(body_pool(br#"{"tops":[]}"#), None);
        assert_eq!(body_pool(b"not json"), None);
    }

    #[test]
    fn prints_as_zpool_history() {
        assert_eq!(history_time(1_795_290_300), "2026-11-21.19:45:00");
        assert_eq!(history_time(0), "1970-01-01.00:00:00");
        let r = HistoryRecord { time: 1_795_290_300, cmd: "zilla pool create tank mirror a b".into(), who: Some(0), user: "root".into(), host: "h1".into(), client: "local".into() };
        assert_eq!(history_text("tank", &[r.clone()], false), "History for 'tank':\n2026-11-21.19:45:00 zilla pool create tank mirror a b\n\n");
        assert_eq!(history_text("tank", &[r], true), "History for 'tank':\n2026-11-21.19:45:00 zilla pool create tank mirror a b [user 0 (root) on h1:local]\n\n");
        assert_eq!(percent_decode("zilla%20pool%20%E2%9C%93%zz"), "zilla pool ✓%zz");
    }
}
