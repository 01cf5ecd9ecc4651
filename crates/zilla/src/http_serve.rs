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
//!   │  slot and connection come back
//!   └─ at stop: no new connections; in-flight requests finish (hyper graceful
//!      shutdown) within the caller's bound
//! ```
//!
//! Accept errors (EMFILE, ENFILE, ENOBUFS) back off from 10 ms to 1 s and are logged
//! at most once per [`ACCEPT_LOG_INTERVAL`] with the count since the last line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
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
    /// Time a client may leave a response unread (no byte taken) before it is
    /// disconnected.
    pub write_stall_timeout: Duration,
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
        let service = TowerToHyperService::new(router.clone());
        let stall = limits.write_stall_timeout;
        match io {
            Stream::Tcp(s) => spawn_conn(&graceful, builder.serve_connection(TokioIo::new(StallGuard::new(s, stall)), service), permit),
            Stream::Unix(s) => spawn_conn(&graceful, builder.serve_connection(TokioIo::new(StallGuard::new(s, stall)), service), permit),
        }
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!("{what}: requests still running after {drain:?}; closing their connections");
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// A connection whose writes fail with `TimedOut` once the peer has taken no byte for
/// `stall` (a write stays pending that long); reads pass through.
pub struct StallGuard<S> {
    inner: S,
    stall: Duration,
    /// Set while a write is pending: when the stall is over.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> StallGuard<S> {
    pub fn new(inner: S, stall: Duration) -> StallGuard<S> {
        StallGuard { inner, stall, deadline: None }
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

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for StallGuard<S> {
    fn poll_write(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_write_vectored(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
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
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            Stream::Tcp(s)
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
