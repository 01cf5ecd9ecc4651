//! Which `Host` and `Origin` the HTTP port answers: the guard against DNS rebinding and
//! cross-site writes.
//!
//! Theory of operation
//! -------------------
//! A web page on `attacker.example` whose name the attacker re-points at 127.0.0.1
//! (DNS rebinding) makes the browser talk to this port as if it were that site: the
//! page could read pools, device paths, volumes and client addresses, and turn
//! analytics datasets on and off. What gives it away is the `Host` header: the browser
//! sends the name it resolved, `attacker.example:PORT`. So every request on the HTTP
//! port (pages, assets, `/api/v1`, `/metrics`, unknown paths alike) passes
//! [`check_request`] before anything else runs:
//!
//! ```text
//!   Host (and an absolute request URI's authority)
//!     IP literal (1.2.3.4, [::1])      allowed   no name, nothing to rebind
//!     localhost, *.localhost           allowed   browsers resolve them to loopback
//!                                                themselves (RFC 6761)
//!     a name in http_allowed_hosts     allowed   the admin says it is this server
//!     any other name                   421 Misdirected Request
//!     malformed                        400
//!     absent                           400 for HTTP/1.1 (which requires it); an
//!                                      HTTP/1.0 request may omit it (no browser does)
//!   any port is accepted: the name is what a rebinding attack controls
//!
//!   Origin, on every method but GET, HEAD and OPTIONS, when the client sends one
//!     the same host and port as Host  allowed   the page came from this server
//!     (a missing port: the scheme's default)
//!     a name in http_allowed_hosts     allowed   (any port: a proxy in front)
//!     anything else, or "null"         403 Forbidden
//! ```
//!
//! An Origin is not accepted merely for being an IP literal or localhost: a page served
//! from the attacker's own address (`http://203.0.113.9`) or from another local
//! service (`http://localhost:3000`) may send a form or a `text/plain` fetch here
//! without a CORS preflight, and only the comparison with Host tells it from our own
//! page. Clients that send no Origin (curl, Prometheus, scripts) are not browsers
//! acting for a page, so they pass.
//!
//! The admin socket is not guarded: a browser cannot reach a Unix socket.
//! Bounds: at most [`ALLOWED_HOSTS_MAX`] configured names of at most
//! [`NAME_MAX_BYTES`] bytes; a refused value is quoted back clipped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::api_error::ApiError;

/// Most names `http_allowed_hosts` may list.
pub const ALLOWED_HOSTS_MAX: usize = 64;
/// Longest DNS name.
pub const NAME_MAX_BYTES: usize = 253;

/// The names (or addresses) the admin configured as this server's, beyond IP literals
/// and localhost: `http_allowed_hosts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Lower case, without a trailing dot.
    names: Vec<String>,
    addresses: Vec<IpAddr>,
}

/// A request's host, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostName {
    Ip(IpAddr),
    /// Lower case, without a trailing dot.
    Name(String),
}

/// `host[:port]` of a Host header or an origin.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    host: HostName,
    port: Option<u16>,
}

impl AllowedHosts {
    /// Parse the setting: names or IP addresses separated by commas or spaces, without
    /// ports.
    pub fn parse(list: &str) -> Result<AllowedHosts, String> {
        let mut allowed = AllowedHosts::default();
        for entry in list.split(|c: char| c == ',' || c.is_whitespace()).filter(|e| !e.is_empty()) {
            if allowed.names.len() + allowed.addresses.len() == ALLOWED_HOSTS_MAX {
                return Err(format!("http_allowed_hosts: more than {ALLOWED_HOSTS_MAX} names"));
            }
            let bare = entry.strip_prefix('[').and_then(|e| e.strip_suffix(']')).unwrap_or(entry);
            if let Ok(ip) = bare.parse::<IpAddr>() {
                allowed.addresses.push(ip);
                continue;
            }
            match parse_host(entry) {
                Some(HostName::Name(n)) => allowed.names.push(n),
                _ => {
                    return Err(format!(
                        "http_allowed_hosts: '{}' is not a host name (letters, digits, '-', '_' and dots; no port)",
                        crate::clip::clip(entry)
                    ))
                }
            }
        }
        Ok(allowed)
    }

    /// A name the admin configured (IP literals and localhost are not listed here).
    fn is_configured(&self, host: &HostName) -> bool {
        match host {
            HostName::Ip(ip) => self.addresses.contains(ip),
            HostName::Name(n) => self.names.iter().any(|c| c == n),
        }
    }

    /// A Host this server answers.
    fn host_allowed(&self, host: &HostName) -> bool {
        match host {
            HostName::Ip(_) => true,
            HostName::Name(n) => n == "localhost" || n.ends_with(".localhost") || self.is_configured(host),
        }
    }

    pub fn describe(&self) -> String {
        let all: Vec<String> = self.addresses.iter().map(|a| a.to_string()).chain(self.names.iter().cloned()).collect();
        if all.is_empty() { "IP addresses and localhost".into() } else { format!("IP addresses, localhost and {}", all.join(", ")) }
    }
}

/// A host name or IPv4 literal (no brackets, no port): `None` when it is neither.
fn parse_host(s: &str) -> Option<HostName> {
    if let Ok(v4) = s.parse::<Ipv4Addr>() {
        return Some(HostName::Ip(IpAddr::V4(v4)));
    }
    let name = s.strip_suffix('.').unwrap_or(s);
    let fits = !name.is_empty() && name.len() <= NAME_MAX_BYTES;
    let labels_ok = name.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    (fits && labels_ok).then(|| HostName::Name(name.to_ascii_lowercase()))
}

/// `host[:port]`, `[v6][:port]`: `None` when malformed.
fn parse_authority(s: &str) -> Option<Authority> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
        (HostName::Ip(IpAddr::V6(v6.parse::<Ipv6Addr>().ok()?)), port)
    } else {
        let (host, port) = match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        (parse_host(host)?, port)
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse::<u16>().ok()?),
        Some(_) => return None,
    };
    Some(Authority { host, port })
}

/// `scheme://host[:port]` of an Origin header, with the scheme's default port filled
/// in: `None` for "null", another scheme, or anything malformed.
fn parse_origin(s: &str) -> Option<(Authority, u16, u16)> {
    let (scheme, rest) = s.split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let origin = parse_authority(rest)?;
    let port = origin.port.unwrap_or(default_port);
    Some((origin, port, default_port))
}

/// Methods that change nothing (and so need no Origin check).
fn is_safe_method(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The verdict on a request: `Err` is the refusal to send.
fn check(allowed: &AllowedHosts, method: &Method, version: Version, uri_authority: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let refused_name = |what: &str, value: &str| {
        ApiError(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "{what} '{}' is not a name of this server: the HTTP port answers {} (add a name with http_allowed_hosts)",
                crate::clip::clip(value),
                allowed.describe()
            ),
        )
    };
    let mut hosts = headers.get_all(header::HOST).iter();
    let host_header = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(ApiError::bad("more than one Host header")),
        (Some(h), None) => Some(h.to_str().map_err(|_| ApiError::bad("the Host header is not text"))?),
        (None, _) => None,
    };
    let mut host: Option<Authority> = None;
    for (what, value) in [("Host", host_header), ("the request URI's host", uri_authority)] {
        let Some(value) = value else { continue };
        let a = parse_authority(value).ok_or_else(|| ApiError::bad(format!("malformed {what} '{}'", crate::clip::clip(value))))?;
        if !allowed.host_allowed(&a.host) {
            return Err(refused_name(what, value));
        }
        host.get_or_insert(a);
    }
    if host_header.is_none() && uri_authority.is_none() && version != Version::HTTP_10 && version != Version::HTTP_09 {
        return Err(ApiError::bad("an HTTP/1.1 request needs a Host header"));
    }
    if is_safe_method(method) {
        return Ok(());
    }
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin_text = origin.to_str().unwrap_or("");
    let forbidden = || {
        ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "a {method} from the page of origin '{}' is refused: only pages of this server (the origin of the Host, or a name in http_allowed_hosts) may change settings",
                crate::clip::clip(origin_text)
            ),
        )
    };
    let (o, o_port, scheme_port) = parse_origin(origin_text).ok_or_else(forbidden)?;
    // a Host without a port names the scheme's default port (80, or 443 behind a TLS proxy)
    let same_origin = host.as_ref().is_some_and(|h| h.host == o.host && h.port.map_or(o_port == scheme_port, |p| p == o_port));
    if same_origin || allowed.is_configured(&o.host) {
        Ok(())
    } else {
        Err(forbidden())
    }
}

/// Put the Host and Origin check in front of every route of `router`.
pub fn with_host_check(router: Router, allowed: Arc<AllowedHosts>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(allowed, check_request))
}

async fn check_request(State(allowed): State<Arc<AllowedHosts>>, req: Request, next: Next) -> Response {
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    match check(&allowed, req.method(), req.version(), authority.as_deref(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => {
            tracing::debug!("HTTP: {} {} refused ({}): {}", req.method(), crate::clip::clip(req.uri().path()), e.0, e.1);
            e.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn status(allowed: &AllowedHosts, method: Method, pairs: &[(&'static str, &str)]) -> u16 {
        match check(allowed, &method, Version::HTTP_11, None, &headers(pairs)) {
            Ok(()) => 200,
            Err(e) => e.0.as_u16(),
        }
    }

    #[test]
    fn hosts_by_kind() {
        let none = AllowedHosts::default();
        let nas = AllowedHosts::parse("NAS.example, zilla.lan 10.1.2.3").unwrap();
        for ok in ["127.0.0.1:8080", "127.0.0.1", "10.0.0.7:1", "[::1]:8080", "[::1]", "localhost:8080", "LOCALHOST", "localhost.", "a.b.localhost:9"] {
            assert_eq!(status(&none, Method::GET, &[("host", ok)]), 200, "{ok}");
        }
        for refused in ["attacker.example:8080", "attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io:80", "nas.example", "2130706433"] {
            assert_eq!(status(&none, Method::GET, &[("host", refused)]), 421, "{refused}");
        }
        for ok in ["nas.example:8080", "nas.EXAMPLE.", "zilla.lan"] {
            assert_eq!(status(&nas, Method::GET, &[("host", ok)]), 200, "{ok}");
        }
        assert_eq!(status(&nas, Method::GET, &[("host", "other.lan")]), 421);
        for bad in ["", ":80", "a b", "[::1", "[::1]x", "[zz]:1", "h:", "h:99999", "h:8a", "::1", "exa_mple..com", "é.example"] {
            assert_eq!(status(&none, Method::GET, &[("host", bad)]), 400, "{bad:?}");
        }
        assert_eq!(status(&none, Method::GET, &[]), 400, "HTTP/1.1 without Host");
        assert!(check(&none, &Method::GET, Version::HTTP_10, None, &HeaderMap::new()).is_ok(), "HTTP/1.0 without Host");
        assert_eq!(status(&none, Method::GET, &[("host", "127.0.0.1"), ("host", "127.0.0.1")]), 400);
        // an absolute request URI names the host too
        let e = check(&none, &Method::GET, Version::HTTP_11, Some("attacker.example"), &headers(&[("host", "127.0.0.1")])).unwrap_err();
        assert_eq!(e.0, StatusCode::MISDIRECTED_REQUEST);
        assert!(e.1.contains("'attacker.example'") && e.1.contains("http_allowed_hosts"), "{}", e.1);
    }

    #[test]
    fn origins_of_writes() {
        let none = AllowedHosts::default();
        let nas = AllowedHosts::parse("nas.example").unwrap();
        let put = |a: &AllowedHosts, host: &str, origin: &str| status(a, Method::PUT, &[("host", host), ("origin", origin)]);
        assert_eq!(status(&none, Method::PUT, &[("host", "127.0.0.1:8080")]), 200, "no Origin: not a browser page");
        assert_eq!(put(&none, "127.0.0.1:8080", "http://127.0.0.1:8080"), 200);
        assert_eq!(put(&none, "[::1]:8080", "http://[::1]:8080"), 200);
        assert_eq!(put(&none, "localhost:8080", "http://LOCALHOST:8080"), 200);
        assert_eq!(put(&none, "127.0.0.1", "http://127.0.0.1"), 200);
        assert_eq!(put(&none, "127.0.0.1", "https://127.0.0.1"), 200, "a missing Host port is the origin scheme's default");
        assert_eq!(put(&none, "127.0.0.1", "http://127.0.0.1:80"), 200);
        assert_eq!(put(&none, "127.0.0.1", "http://127.0.0.1:3000"), 403, "a page on another port of the host");
        assert_eq!(put(&none, "localhost", "http://localhost:8000"), 403, "a page on another port of the host");
        for refused in ["http://attacker.example:8080", "http://attacker.example", "http://127.0.0.1:3000", "http://localhost:8080", "http://203.0.113.9", "null", "file://", "ftp://127.0.0.1:8080", "garbage"] {
            assert_eq!(put(&none, "127.0.0.1:8080", refused), 403, "{refused}");
            assert_eq!(status(&none, Method::POST, &[("host", "127.0.0.1:8080"), ("origin", refused)]), 403, "{refused}");
            assert_eq!(status(&none, Method::DELETE, &[("host", "127.0.0.1:8080"), ("origin", refused)]), 403, "{refused}");
            assert_eq!(status(&none, Method::GET, &[("host", "127.0.0.1:8080"), ("origin", refused)]), 200, "GET {refused}");
        }
        // a proxy in front: Host is the backend address, the origin a configured name
        assert_eq!(put(&nas, "127.0.0.1:8080", "https://nas.example"), 200);
        assert_eq!(put(&nas, "127.0.0.1:8080", "https://other.example"), 403);
    }

    #[test]
    fn the_setting_is_checked() {
        assert_eq!(AllowedHosts::parse("").unwrap(), AllowedHosts::default());
        let a = AllowedHosts::parse(" a.example,,b.example  [::1] 10.0.0.1 ").unwrap();
        assert_eq!(a.names, ["a.example", "b.example"]);
        assert_eq!(a.addresses.len(), 2);
        assert!(a.describe().contains("a.example"));
        for bad in ["nas:8080", "http://nas", "a..b", "x/y"] {
            let e = AllowedHosts::parse(bad).unwrap_err();
            assert!(e.contains("is not a host name"), "{bad}: {e}");
        }
        let many: Vec<String> = (0..=ALLOWED_HOSTS_MAX).map(|i| format!("h{i}.example")).collect();
        assert!(AllowedHosts::parse(&many.join(",")).unwrap_err().contains("more than 64"));
        assert!(AllowedHosts::parse(&"a".repeat(NAME_MAX_BYTES + 1)).is_err());
    }
}
