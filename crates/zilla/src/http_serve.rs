//! One HTTP/1.1 server loop with limits, for the admin socket and the web/API port.
//!
//! Theory of operation
//! -------------------
//! `axum::serve` accepts without bound and waits forever for a request's headers, so
//! 1,100 clients that each send half a request exhaust the descriptors of the whole
//! daemon (issue 14 row 3). Here every listener has its own limits:
//!
//! ```text
//!   accept ──► permit (connections_max per listener; the rest wait in the kernel's
//!   │          backlog and cost the daemon no descriptor)
//!   ├─ headers must arrive within header_timeout (hyper's header_read_timeout;
//!   │  it also runs while a kept-alive connection sits idle, so idle ones close too)
//!   ├─ the body must arrive within header_timeout as well and be at most
//!   │  body_max_bytes (413 / 408 otherwise), read before the handler runs
//!   ├─ a client that takes no byte of a response for write_stall_timeout is
//!   │  disconnected ([`StallGuard`]): a live stream it stopped reading ends, and its
//!   │  slot and connection come back. "Takes no byte" is seen two ways: a write
//!   │  stays pending (the socket buffer is full), or, on TCP, bytes wait in the send
//!   │  queue and the peer acknowledges none of them (its receive window is closed:
//!   │  it does not read). The second catches a client with a small receive buffer
//!   │  that a slow stream (one event a second) would take hours to back up into our
//!   │  large send buffer
//!   ├─ each request carries the peer's address ([`PeerAddr`], TCP only), for
//!   │  per-client shares (analytics' live streams)
//!   └─ at stop: no new connections; in-flight requests finish (hyper graceful
//!      shutdown) within the caller's bound
//! ```
//!
//! Accept errors (EMFILE, ENFILE, ENOBUFS) back off from 10 ms to 1 s and are logged
//! at most once per [`ACCEPT_LOG_INTERVAL`] with the count since the last line.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};

use crate::api_error::ApiError;

/// Limits of one HTTP listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Connections served at once; more wait in the listen backlog.
    pub connections_max: usize,
    /// Time a client has to send a request's headers (and, separately, its body).
    pub header_timeout: Duration,
    /// Largest request body accepted.
    pub body_max_bytes: usize,
    /// Time a client may leave a response unread (no byte taken from the socket
    /// buffer, or on TCP none acknowledged while some wait) before it is disconnected.
    pub write_stall_timeout: Duration,
}

/// The address of the client a request came from (TCP connections), a request
/// extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub IpAddr);

/// The user of a Unix-socket peer (SO_PEERCRED), carried by each of its requests: who
/// ran an admin command (`pool history -l`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: Option<u32>,
}

impl PeerAddr {
    /// What counts as one client for a per-client share: the IPv4 address (also when
    /// it arrives IPv4-mapped), or the /64 prefix of an IPv6 address (one host may
    /// use any address of its /64).
    pub fn client_key(&self) -> IpAddr {
        match self.0.to_canonical() {
            IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            v4 => v4,
        }
    }
}

/// How often at most an accept error is logged.
pub const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// Backoff and rate-limited logging for a failing accept loop.
pub struct AcceptBackoff {
    what: &'static str,
    delay: Duration,
    last_log: Option<Instant>,
    suppressed: u64,
}

impl AcceptBackoff {
    pub fn new(what: &'static str) -> AcceptBackoff {
        AcceptBackoff { what, delay: ACCEPT_BACKOFF_MIN, last_log: None, suppressed: 0 }
    }

    pub fn succeeded(&mut self) {
        self.delay = ACCEPT_BACKOFF_MIN;
    }

    /// Log (at most once per interval) and sleep, doubling the delay.
    pub async fn failed(&mut self, e: &std::io::Error) {
        let now = Instant::now();
        if self.last_log.map_or(true, |t| now.duration_since(t) >= ACCEPT_LOG_INTERVAL) {
            let more = if self.suppressed > 0 { format!(" ({} more since the last report)", self.suppressed) } else { String::new() };
            tracing::warn!("{}: cannot accept connections: {e}{more}; backing off", self.what);
            self.last_log = Some(now);
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(ACCEPT_BACKOFF_MAX);
    }
}

/// Errors of one connection that do not mean the listener is in trouble.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(e.kind(), K::ConnectionRefused | K::ConnectionAborted | K::ConnectionReset | K::Interrupted)
}

/// Add the body limit and body timeout to a router.
pub fn with_body_limits(router: Router, limits: HttpLimits) -> Router {
    router.layer(axum::middleware::from_fn_with_state(limits, read_body_bounded))
}

/// Read the whole body within the time and size limits before the handler runs.
async fn read_body_bounded(State(limits): State<HttpLimits>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, limits.body_max_bytes);
    match tokio::time::timeout(limits.header_timeout, read).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError(StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {} bytes", limits.body_max_bytes))
                    .into_response()
            } else {
                ApiError(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}")).into_response()
            }
        }
        Err(_) => ApiError(
            StatusCode::REQUEST_TIMEOUT,
            format!("request body not received within {} s", limits.header_timeout.as_secs()),
        )
        .into_response(),
    }
}

/// Serve `router` on `listener` until `stop` turns true, then let in-flight requests
/// finish for at most `drain`.
pub async fn serve(
    what: &'static str,
    listener: Listener,
    router: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) {
    let permits = Arc::new(Semaphore::new(limits.connections_max.max(1)));
    let graceful = GracefulShutdown::new();
    let mut backoff = AcceptBackoff::new(what);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("semaphore never closed"),
            _ = stop.wait_for(|s| *s) => break,
        };
        let accepted = tokio::select! {
            r = accept(&listener) => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        let io = match accepted {
            Ok(io) => io,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                drop(permit);
                backoff.failed(&e).await;
                continue;
            }
        };
        backoff.succeeded();
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
        let stall = limits.write_stall_timeout;
        match io {
            Stream::Tcp(s, peer) => {
                let router = TowerToHyperService::new(router.clone());
                let peer = PeerAddr(peer.ip());
                let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(peer);
                    router.call(req)
                });
                spawn_conn(&graceful, builder.serve_connection(TokioIo::new(StallGuard::new(s, stall)), service), permit)
            }
            Stream::Unix(s) => {
                let router = TowerToHyperService::new(router.clone());
                let cred = PeerCred { uid: s.peer_cred().ok().map(|c| c.uid()) };
                let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(cred);
                    router.call(req)
                });
                spawn_conn(&graceful, builder.serve_connection(TokioIo::new(StallGuard::new(s, stall)), service), permit)
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!("{what}: requests still running after {drain:?}; closing their connections");
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream, SocketAddr),
    Unix(tokio::net::UnixStream),
}

/// Bytes sent on a connection that the peer has not acknowledged yet (plus those not
/// yet sent), where the kernel tells: SIOCOUTQ on TCP.
pub trait SendQueue {
    fn unacknowledged_bytes(&self) -> Option<u64>;
}

impl SendQueue for tokio::net::TcpStream {
    fn unacknowledged_bytes(&self) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (= SIOCOUTQ on a socket) writes one c_int to the pointer,
        // which points at a live c_int; the descriptor is open while `self` lives.
        let r = unsafe { libc::ioctl(self.as_raw_fd(), libc::TIOCOUTQ, &mut queued as *mut libc::c_int) };
        (r == 0).then(|| u64::try_from(queued).unwrap_or(0))
    }
}

impl SendQueue for tokio::net::UnixStream {
    /// Not used: a Unix socket's peer is a local program; a full buffer is seen by
    /// the pending write.
    fn unacknowledged_bytes(&self) -> Option<u64> {
        None
    }
}

/// What the peer had acknowledged when bytes were last seen waiting without progress.
#[derive(Debug, Clone, Copy)]
struct AckProgress {
    acknowledged_bytes: u64,
    since: tokio::time::Instant,
}

/// A connection whose writes fail with `TimedOut` once the peer has taken no byte for
/// `stall`: a write stays pending that long, or (where the kernel tells,
/// [`SendQueue`]) bytes have waited that long without the peer acknowledging any.
/// Reads pass through.
pub struct StallGuard<S> {
    inner: S,
    stall: Duration,
    /// Set while a write is pending: when the stall is over.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Bytes the kernel took from us on this connection.
    written_bytes: u64,
    /// Set while bytes wait unacknowledged: since when the acknowledged count stands.
    waiting: Option<AckProgress>,
}

impl<S> StallGuard<S> {
    pub fn new(inner: S, stall: Duration) -> StallGuard<S> {
        StallGuard { inner, stall, deadline: None, written_bytes: 0, waiting: None }
    }

    /// Before a write: has the peer acknowledged nothing of what waits for `stall`?
    /// `unacknowledged` is the send queue now. A queue that drained, or any newly
    /// acknowledged byte, restarts the clock; so a client whose reads reopen its
    /// receive window is not cut, and one whose window stays closed is. (A client
    /// reading a byte at a time from a full buffer does not reopen it: TCP waits for a
    /// segment's worth of room before it advertises more, so such a client is cut too.)
    fn peer_stalled(&mut self, unacknowledged: Option<u64>, now: tokio::time::Instant) -> bool {
        let Some(queued) = unacknowledged.filter(|&q| q > 0) else {
            self.waiting = None;
            return false;
        };
        let acknowledged_bytes = self.written_bytes.saturating_sub(queued);
        match self.waiting {
            Some(w) if w.acknowledged_bytes >= acknowledged_bytes => now.duration_since(w.since) >= self.stall,
            _ => {
                self.waiting = Some(AckProgress { acknowledged_bytes, since: now });
                false
            }
        }
    }

    /// After a write returned `r`: clear the deadline on progress, arm it on Pending,
    /// and fail once it has passed.
    fn watch<T>(&mut self, cx: &mut std::task::Context<'_>, r: std::task::Poll<std::io::Result<T>>) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        use std::task::Poll;
        if !r.is_pending() {
            self.deadline = None;
            return r;
        }
        let stall = self.stall;
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client took no response byte for the stall timeout"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for StallGuard<S> {
    fn poll_read(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

fn peer_stall_error() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "the client acknowledged no response byte for the stall timeout")
}

impl<S: tokio::io::AsyncWrite + SendQueue + Unpin> tokio::io::AsyncWrite for StallGuard<S> {
    fn poll_write(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        let queued = self.inner.unacknowledged_bytes();
        if self.peer_stalled(queued, tokio::time::Instant::now()) {
            return std::task::Poll::Ready(Err(peer_stall_error()));
        }
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = r {
            self.written_bytes += n as u64;
        }
        self.watch(cx, r)
    }

    fn poll_write_vectored(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> std::task::Poll<std::io::Result<usize>> {
        let queued = self.inner.unacknowledged_bytes();
        if self.peer_stalled(queued, tokio::time::Instant::now()) {
            return std::task::Poll::Ready(Err(peer_stall_error()));
        }
        let r = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let std::task::Poll::Ready(Ok(n)) = r {
            self.written_bytes += n as u64;
        }
        self.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn accept(l: &Listener) -> std::io::Result<Stream> {
    match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, peer)| {
            let _ = s.set_nodelay(true);
            Stream::Tcp(s, peer)
        }),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
    }
}

/// Run one connection, watched for graceful shutdown; its permit is returned when it
/// ends.
fn spawn_conn<C>(graceful: &GracefulShutdown, conn: C, permit: tokio::sync::OwnedSemaphorePermit)
where
    C: hyper_util::server::graceful::GracefulConnection + Send + 'static,
    C::Output: Send,
{
    let fut = graceful.watch(conn);
    tokio::spawn(async move {
        let _ = fut.await;
        drop(permit);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_acknowledges_nothing_for_the_stall_is_stalled() {
        let t0 = tokio::time::Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut g = StallGuard::new((), Duration::from_secs(5));
        // a reading peer: the queue drains between writes
        g.written_bytes = 1000;
        assert!(!g.peer_stalled(Some(0), s(0)));
        assert!(!g.peer_stalled(Some(0), s(100)));
        // bytes wait, nothing acknowledged: stalled once the bound has passed
        g.written_bytes = 3000;
        assert!(!g.peer_stalled(Some(500), s(101)));
        g.written_bytes = 3500;
        assert!(!g.peer_stalled(Some(1000), s(105)));
        assert!(g.peer_stalled(Some(1000), s(106)));
        // a slow reader: every look finds a byte more acknowledged
        let mut g = StallGuard::new((), Duration::from_secs(5));
        g.written_bytes = 10_000;
        for i in 0..100 {
            assert!(!g.peer_stalled(Some(9000 - i), s(i * 10)), "{i}");
        }
        // a queue that drained restarts the clock, even with no write in between
        let mut g = StallGuard::new((), Duration::from_secs(5));
        g.written_bytes = 100;
        assert!(!g.peer_stalled(Some(100), s(0)));
        assert!(!g.peer_stalled(Some(0), s(4)));
        assert!(!g.peer_stalled(Some(0), s(60)));
        g.written_bytes = 200;
        assert!(!g.peer_stalled(Some(100), s(61)));
        assert!(!g.peer_stalled(Some(100), s(65)));
        assert!(g.peer_stalled(Some(100), s(66)));
        // no kernel answer: never stalled by this rule
        assert!(!StallGuard::new((), Duration::ZERO).peer_stalled(None, s(0)));
    }

    #[test]
    fn clients_by_address_and_ipv6_prefix() {
        let key = |s: &str| PeerAddr(s.parse().unwrap()).client_key().to_string();
        assert_eq!(key("127.0.0.2"), "127.0.0.2");
        assert_eq!(key("::ffff:10.0.0.1"), "10.0.0.1");
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2:bbbb::7"), key("2001:db8:1:2::9"));
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
    }
}
