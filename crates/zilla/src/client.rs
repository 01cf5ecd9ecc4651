//! The admin client: HTTP/1.1 over DIR/zilla.sock, one connection per request.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub struct Client {
    state_dir: PathBuf,
}

impl Client {
    pub fn new(state_dir: &Path) -> Client {
        Client { state_dir: state_dir.to_path_buf() }
    }

    fn no_daemon(&self) -> String {
        let abs = std::env::current_dir().map(|c| c.join(&self.state_dir)).unwrap_or_else(|_| self.state_dir.clone());
        let d = abs.display();
        format!("no daemon is serving {d} (start one with `zilla serve --state-dir {d}`)")
    }

    /// Call one route. Errors are the one-line message to print.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, String> {
        let sock = self.state_dir.join("zilla.sock");
        let stream = match tokio::net::UnixStream::connect(&sock).await {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Err(self.no_daemon())
            }
            Err(e) => return Err(format!("cannot connect to {}: {e}", sock.display())),
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("admin socket handshake failed: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let bytes = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| e.to_string())?,
            None => vec![],
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "zilla")
            .header("content-type", "application/json")
            .header(COMMAND_HEADER, command_line())
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| format!("daemon did not answer: {e}"))?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if !status.is_success() {
            return Err(match serde_json::from_slice::<crate::api::ErrorBody>(&body) {
                Ok(e) => e.error,
                Err(_) => {
                    let text = String::from_utf8_lossy(&body);
                    let text = text.trim();
                    if text.is_empty() {
                        format!("daemon answered {status}")
                    } else {
                        text.lines().next().unwrap_or("").to_string()
                    }
                }
            });
        }
        serde_json::from_slice(&body).map_err(|e| format!("bad answer from daemon: {e}"))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        self.call(Method::GET, path, None::<&()>).await
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T, String> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        self.call(Method::DELETE, path, None::<&()>).await
    }
}

/// The header that carries the command line to the daemon (percent-encoded): what
/// `pool history` records.
pub const COMMAND_HEADER: &str = "x-zilla-command";

/// This process's command line as the history shows it: `zilla` and its arguments,
/// without the global `--state-dir DIR` (where the daemon is, not what was done).
pub fn command_line() -> String {
    let mut words = vec!["zilla".to_string()];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--state-dir" {
            args.next();
        } else if !a.starts_with("--state-dir=") {
            words.push(a);
        }
    }
    enc(&words.join(" "))
}

/// The query of an admin call that takes `-f` (disconnect attached clients first).
pub fn force_query(force: bool) -> &'static str {
    if force {
        "?force=true"
    } else {
        ""
    }
}

/// Percent-encode a path segment or query value.
pub fn enc(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}
