//! The daemon's config file (`zilla serve --config FILE`) and the descriptor budget.
//!
//! Theory of operation
//! -------------------
//! The file is `key = value` lines (`#` comments, values optionally in double
//! quotes). Listen addresses given on the command line win over the file. Engine
//! tunables are `tunable.NAME = VALUE` lines (tunables.rs says how they combine with
//! `tunable set -p` and `serve --tunable`); contrib/zilla.conf is a commented example.
//!
//! Every connection costs a descriptor, and a daemon out of descriptors cannot open a
//! device, accept an admin call or write its cache file. So at start the soft
//! RLIMIT_NOFILE is raised to the hard limit, and the connection caps must fit under
//! it with `fd_reserve` descriptors left for devices, files and the runtime:
//!
//! ```text
//!   admin_connections_max + http_connections_max
//!     + nbd_connections_max * NBD listeners (unix socket, plus TCP when on)
//!     + fd_reserve                                    <= RLIMIT_NOFILE
//! ```
//!
//! Caps left at their defaults shrink to fit (NBD first, then HTTP; logged); caps set
//! in the file that do not fit refuse the start with the sum spelled out.
//!
//! The front-end memory budget, the NBD per-connection limits and the iSCSI target's
//! come from the same file ([`frontend_config`], [`nbd_config`], [`iscsi_config`]);
//! every value has a range, and a value out of range or inconsistent with another
//! refuses the start with the reason.

use std::time::Duration;

use anyhow::{anyhow, bail};

use crate::http_serve::HttpLimits;

pub const DEFAULT_ADMIN_CONNECTIONS_MAX: usize = 64;
pub const DEFAULT_HTTP_CONNECTIONS_MAX: usize = 256;
pub const DEFAULT_HTTP_HEADER_TIMEOUT_S: u64 = 10;
pub const DEFAULT_HTTP_WRITE_STALL_TIMEOUT_S: u64 = 60;
pub const DEFAULT_HTTP_BODY_MAX_BYTES: u64 = 1 << 20;
pub const DEFAULT_FD_RESERVE: usize = 256;
/// Smallest cap a default shrinks to; below it the start is refused.
const CONNECTIONS_MIN: usize = 16;

/// Settings read from the config file; `None` = not in the file (default applies).
#[derive(Debug, Default, Clone)]
pub struct Settings {
    pub nbd: Option<String>,
    pub iscsi: Option<String>,
    /// `chap` or `none` (as `serve --iscsi-auth`, which wins).
    pub iscsi_auth: Option<String>,
    pub http: Option<String>,
    pub admin_group: Option<String>,
    pub admin_connections_max: Option<usize>,
    pub http_connections_max: Option<usize>,
    pub nbd_connections_max: Option<usize>,
    pub http_header_timeout_s: Option<u64>,
    pub http_write_stall_timeout_s: Option<u64>,
    pub http_body_max_bytes: Option<u64>,
    /// Names the HTTP port answers besides IP addresses and localhost (http_host.rs).
    pub http_allowed_hosts: Option<crate::http_host::AllowedHosts>,
    pub fd_reserve: Option<usize>,
    pub frontend_memory_budget_bytes: Option<u64>,
    pub frontend_buffer_pool_bytes_max: Option<u64>,
    pub clients_max: Option<usize>,
    pub nbd_in_flight_requests_max: Option<usize>,
    pub nbd_idle_timeout_s: Option<u64>,
    pub nbd_reply_stall_timeout_s: Option<u64>,
    pub nbd_handshake_timeout_s: Option<u64>,
    /// How long an iSCSI command waits for its next Data-Out before the connection ends.
    pub iscsi_data_out_timeout_s: Option<u64>,
    /// Bound of the analytics history's memory (enabled datasets).
    pub analytics_memory_max_bytes: Option<u64>,
    /// `tunable.NAME = VALUE` lines (NAME without the prefix), in file order; applied
    /// at start by `tunables::apply_at_start`.
    pub tunables: Vec<(String, String)>,
}

/// The prefix of a tunable's key: `tunable.zfs_arc_max = 4G`.
pub const TUNABLE_PREFIX: &str = "tunable.";

pub const KEYS: &[&str] = &[
    "nbd",
    "iscsi",
    "iscsi_auth",
    "http",
    "admin_group",
    "admin_connections_max",
    "http_connections_max",
    "nbd_connections_max",
    "http_header_timeout_s",
    "http_write_stall_timeout_s",
    "http_body_max_bytes",
    "http_allowed_hosts",
    "fd_reserve",
    "frontend_memory_budget_bytes",
    "frontend_buffer_pool_bytes_max",
    "clients_max",
    "nbd_in_flight_requests_max",
    "nbd_idle_timeout_s",
    "nbd_reply_stall_timeout_s",
    "nbd_handshake_timeout_s",
    "iscsi_data_out_timeout_s",
    "analytics_memory_max_bytes",
];

/// `key = "value"` or `key = value` lines, `#` comments.
pub fn parse_lines(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| format!("line {}: expected key = \"value\"", i + 1))?;
        let v = v.trim().trim_matches('"').to_string();
        out.push((k.trim().to_string(), v));
    }
    Ok(out)
}

fn number(key: &str, v: &str, min: u64, max: u64) -> Result<u64, String> {
    let n = crate::units::parse_size(v).map_err(|_| format!("{key}: '{}' is not a number", crate::clip::clip(v)))?;
    if !(min..=max).contains(&n) {
        return Err(format!("{key}: {n} is out of range (allowed {min} to {max})"));
    }
    Ok(n)
}

impl Settings {
    pub fn parse(text: &str) -> Result<Settings, String> {
        let mut s = Settings::default();
        for (k, v) in parse_lines(text)? {
            match k.as_str() {
                "nbd" => s.nbd = Some(v),
                "iscsi" => s.iscsi = Some(v),
                "iscsi_auth" => match v.as_str() {
                    "chap" | "none" => s.iscsi_auth = Some(v),
                    _ => return Err(format!("iscsi_auth: '{}' is not chap or none", crate::clip::clip(&v))),
                },
                "http" => s.http = Some(v),
                "admin_group" => s.admin_group = Some(v),
                "admin_connections_max" => s.admin_connections_max = Some(number(&k, &v, 1, 1 << 20)? as usize),
                "http_connections_max" => s.http_connections_max = Some(number(&k, &v, 1, 1 << 20)? as usize),
                "nbd_connections_max" => s.nbd_connections_max = Some(number(&k, &v, 1, 1 << 20)? as usize),
                "http_header_timeout_s" => s.http_header_timeout_s = Some(number(&k, &v, 1, 3600)?),
                "http_write_stall_timeout_s" => s.http_write_stall_timeout_s = Some(number(&k, &v, 1, 86_400)?),
                "http_body_max_bytes" => s.http_body_max_bytes = Some(number(&k, &v, 4096, 1 << 30)?),
                "http_allowed_hosts" => s.http_allowed_hosts = Some(crate::http_host::AllowedHosts::parse(&v)?),
                "fd_reserve" => s.fd_reserve = Some(number(&k, &v, 32, 1 << 20)? as usize),
                "analytics_memory_max_bytes" => s.analytics_memory_max_bytes = Some(number(&k, &v, 1 << 20, 64 << 30)?),
                "frontend_memory_budget_bytes" => {
                    s.frontend_memory_budget_bytes = Some(number(&k, &v, FRONTEND_MEMORY_MIN_BYTES, 1 << 40)?)
                }
                "frontend_buffer_pool_bytes_max" => s.frontend_buffer_pool_bytes_max = Some(number(&k, &v, 0, 1 << 40)?),
                "clients_max" => s.clients_max = Some(number(&k, &v, 1, 65_536)? as usize),
                "nbd_in_flight_requests_max" => s.nbd_in_flight_requests_max = Some(number(&k, &v, 1, 65_536)? as usize),
                "nbd_idle_timeout_s" => s.nbd_idle_timeout_s = Some(number(&k, &v, 0, 7 * 86_400)?),
                "nbd_reply_stall_timeout_s" => s.nbd_reply_stall_timeout_s = Some(number(&k, &v, 0, 86_400)?),
                "nbd_handshake_timeout_s" => s.nbd_handshake_timeout_s = Some(number(&k, &v, 1, 3600)?),
                "iscsi_data_out_timeout_s" => s.iscsi_data_out_timeout_s = Some(number(&k, &v, 1, 3600)?),
                other if other.starts_with(TUNABLE_PREFIX) => s.tunables.push((other[TUNABLE_PREFIX.len()..].to_string(), v)),
                other => {
                    return Err(format!(
                        "unknown setting '{}' (expected one of: {}, or tunable.NAME)",
                        crate::clip::clip(other),
                        KEYS.join(", ")
                    ))
                }
            }
        }
        Ok(s)
    }
}

/// Smallest front-end memory budget: two largest requests plus room for small ones.
const FRONTEND_MEMORY_MIN_BYTES: u64 = 2 * zilla_frontend::REQUEST_MAX_BYTES as u64 + (64 << 10);

/// The front-end budgets from the file (defaults: [`zilla_frontend::FrontendConfig`]).
/// The part of the budget kept for connections holding nothing is two largest
/// requests, or one when the budget is below four.
pub fn frontend_config(s: &Settings) -> anyhow::Result<zilla_frontend::FrontendConfig> {
    let defaults = zilla_frontend::FrontendConfig::default();
    let request_max = zilla_frontend::REQUEST_MAX_BYTES;
    let budget = s.frontend_memory_budget_bytes.map_or(defaults.memory_budget_bytes, |b| b as usize);
    let reserve = if budget >= 4 * request_max { defaults.memory_reserve_bytes } else { request_max };
    let config = zilla_frontend::FrontendConfig {
        memory_budget_bytes: budget,
        memory_reserve_bytes: reserve,
        buffer_pool_bytes_max: s.frontend_buffer_pool_bytes_max.map_or(defaults.buffer_pool_bytes_max, |b| b as usize),
        clients_max: s.clients_max.unwrap_or(defaults.clients_max),
        ..defaults
    };
    config.validate().map_err(|e| anyhow!("front-end limits in the config file: {e}"))?;
    Ok(config)
}

/// The NBD limits from the file (defaults: [`zilla_nbd::NbdConfig`]); the connection
/// cap comes from [`Limits::resolve`].
pub fn nbd_config(s: &Settings, connections_max: usize) -> anyhow::Result<zilla_nbd::NbdConfig> {
    let defaults = zilla_nbd::NbdConfig::default();
    let seconds = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_secs);
    let config = zilla_nbd::NbdConfig {
        in_flight_requests_max: s.nbd_in_flight_requests_max.unwrap_or(defaults.in_flight_requests_max),
        idle_timeout: seconds(s.nbd_idle_timeout_s, defaults.idle_timeout),
        reply_stall_timeout: seconds(s.nbd_reply_stall_timeout_s, defaults.reply_stall_timeout),
        handshake_timeout: seconds(s.nbd_handshake_timeout_s, defaults.handshake_timeout),
        connections_max,
        ..defaults
    };
    config.validate().map_err(|e| anyhow!("NBD limits in the config file: {e}"))?;
    Ok(config)
}

/// The iSCSI target's limits from the file (defaults: [`zilla_iscsi::IscsiConfig`]);
/// `unauthenticated_logins` from `--iscsi-auth`.
pub fn iscsi_config(s: &Settings, unauthenticated_logins: bool) -> anyhow::Result<zilla_iscsi::IscsiConfig> {
    let defaults = zilla_iscsi::IscsiConfig::default();
    let config = zilla_iscsi::IscsiConfig {
        data_out_timeout: s.iscsi_data_out_timeout_s.map_or(defaults.data_out_timeout, Duration::from_secs),
        unauthenticated_logins,
        ..defaults
    };
    config.validate().map_err(|e| anyhow!("iSCSI limits in the config file: {e}"))?;
    Ok(config)
}

/// Raise the soft RLIMIT_NOFILE to the hard limit; returns the limit now in force.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    // Linux never reports an infinite RLIMIT_NOFILE; treat one as nr_open's default.
    let hard = cur.maximum.unwrap_or(1 << 20);
    let soft = cur.current.unwrap_or(hard);
    if soft < hard {
        match setrlimit(Resource::Nofile, Rlimit { current: Some(hard), maximum: cur.maximum }) {
            Ok(()) => return hard,
            Err(e) => tracing::warn!("cannot raise the descriptor limit from {soft} to {hard}: {e}"),
        }
    }
    soft
}

/// The connection caps and HTTP limits in force.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub fd_limit: u64,
    pub fd_reserve: usize,
    pub admin: HttpLimits,
    pub http: HttpLimits,
    /// Per NBD listener.
    pub nbd_connections_max: usize,
    pub nbd_listeners: usize,
}

impl Limits {
    /// Fit the caps under `fd_limit` (see the module comment).
    pub fn resolve(s: &Settings, fd_limit: u64, nbd_listeners: usize, nbd_default: usize) -> anyhow::Result<Limits> {
        let header_timeout = Duration::from_secs(s.http_header_timeout_s.unwrap_or(DEFAULT_HTTP_HEADER_TIMEOUT_S));
        let write_stall_timeout = Duration::from_secs(s.http_write_stall_timeout_s.unwrap_or(DEFAULT_HTTP_WRITE_STALL_TIMEOUT_S));
        let body_max_bytes = s.http_body_max_bytes.unwrap_or(DEFAULT_HTTP_BODY_MAX_BYTES) as usize;
        let reserve = s.fd_reserve.unwrap_or(DEFAULT_FD_RESERVE);
        let admin = s.admin_connections_max.unwrap_or(DEFAULT_ADMIN_CONNECTIONS_MAX);
        let mut http = s.http_connections_max.unwrap_or(DEFAULT_HTTP_CONNECTIONS_MAX);
        let mut nbd = s.nbd_connections_max.unwrap_or(nbd_default);
        let limit = usize::try_from(fd_limit).unwrap_or(usize::MAX);
        let sum = |http: usize, nbd: usize| admin + http + nbd * nbd_listeners + reserve;
        let spelled = |http: usize, nbd: usize| {
            format!(
                "admin {admin} + http {http} + nbd {nbd} x {nbd_listeners} listeners + fd_reserve {reserve} = {}",
                sum(http, nbd)
            )
        };
        if sum(http, nbd) > limit {
            let wanted = spelled(http, nbd);
            if s.nbd_connections_max.is_none() {
                let room = limit.saturating_sub(sum(http, 0)) / nbd_listeners.max(1);
                nbd = room.max(CONNECTIONS_MIN).min(nbd);
            }
            if sum(http, nbd) > limit && s.http_connections_max.is_none() {
                http = limit.saturating_sub(sum(0, nbd)).max(CONNECTIONS_MIN).min(http);
            }
            if sum(http, nbd) > limit {
                bail!(
                    "the connection caps do not fit under the descriptor limit {fd_limit} (RLIMIT_NOFILE): {}; \
                     lower them in the config file or raise the limit (ulimit -n / LimitNOFILE=)",
                    spelled(http, nbd)
                );
            }
            tracing::warn!("connection caps lowered to fit the descriptor limit {fd_limit}: wanted {wanted}, now {}", spelled(http, nbd));
        }
        Ok(Limits {
            fd_limit,
            fd_reserve: reserve,
            admin: HttpLimits { connections_max: admin, header_timeout, body_max_bytes, write_stall_timeout },
            http: HttpLimits { connections_max: http, header_timeout, body_max_bytes, write_stall_timeout },
            nbd_connections_max: nbd,
            nbd_listeners,
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "descriptor limit {}: admin {} + http {} + nbd {} x {} + reserve {} connections; \
             header timeout {} s, body max {} bytes",
            self.fd_limit,
            self.admin.connections_max,
            self.http.connections_max,
            self.nbd_connections_max,
            self.nbd_listeners,
            self.fd_reserve,
            self.http.header_timeout.as_secs(),
            self.http.body_max_bytes
        )
    }
}

/// Resolve `admin_group` to a gid.
pub fn admin_gid(s: &Settings) -> anyhow::Result<Option<u32>> {
    s.admin_group.as_deref().map(crate::state_dir::group_id).transpose().map_err(|e| anyhow!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_and_refuses_unknown_ones() {
        let s = Settings::parse("# x\nnbd = \"127.0.0.1:1\"\nhttp=off\nhttp_body_max_bytes = 64K\n").unwrap();
        assert_eq!(s.nbd.as_deref(), Some("127.0.0.1:1"));
        assert_eq!(s.http.as_deref(), Some("off"));
        assert_eq!(s.http_body_max_bytes, Some(65536));
        assert!(Settings::parse("garbage").is_err());
        assert!(Settings::parse("frob = 1").unwrap_err().contains("unknown setting 'frob'"));
        let s = Settings::parse("tunable.zfs_arc_max = 4G\ntunable.zfs_write_throttle_mode = legacy\n").unwrap();
        assert_eq!(s.tunables, vec![("zfs_arc_max".into(), "4G".into()), ("zfs_write_throttle_mode".into(), "legacy".into())]);
        assert!(Settings::parse("http_connections_max = 0").unwrap_err().contains("out of range"));
        assert_eq!(Settings::parse("iscsi_auth = none").unwrap().iscsi_auth.as_deref(), Some("none"));
        assert!(Settings::parse("iscsi_auth = off").unwrap_err().contains("not chap or none"));
        let s = Settings::parse("http_allowed_hosts = \"nas.example, zilla.lan\"").unwrap();
        assert_eq!(s.http_allowed_hosts, Some(crate::http_host::AllowedHosts::parse("nas.example zilla.lan").unwrap()));
        assert!(Settings::parse("http_allowed_hosts = nas:8080").unwrap_err().contains("is not a host name"));
    }

    #[test]
    fn the_iscsi_data_out_timeout_comes_from_the_file() {
        let s = Settings::parse("iscsi_data_out_timeout_s = 2\n").unwrap();
        let c = iscsi_config(&s, true).unwrap();
        assert_eq!((c.data_out_timeout, c.unauthenticated_logins), (Duration::from_secs(2), true));
        let c = iscsi_config(&Settings::default(), false).unwrap();
        assert_eq!(c.data_out_timeout, Duration::from_secs(30));
        assert!(Settings::parse("iscsi_data_out_timeout_s = 0").unwrap_err().contains("out of range"));
        assert!(Settings::parse("iscsi_data_out_timeout_s = 3601").unwrap_err().contains("out of range"));
    }

    #[test]
    fn frontend_and_nbd_limits_come_from_the_file() {
        let s = Settings::parse(
            "frontend_memory_budget_bytes = 96M\nfrontend_buffer_pool_bytes_max = 8M\nclients_max = 10\n\
             nbd_in_flight_requests_max = 16\nnbd_idle_timeout_s = 0\nnbd_reply_stall_timeout_s = 5\n",
        )
        .unwrap();
        let f = frontend_config(&s).unwrap();
        assert_eq!(f.memory_budget_bytes, 96 << 20);
        assert_eq!(f.memory_reserve_bytes, zilla_frontend::REQUEST_MAX_BYTES);
        assert_eq!(f.buffer_pool_bytes_max, 8 << 20);
        assert_eq!(f.clients_max, 10);
        let n = nbd_config(&s, 100).unwrap();
        assert_eq!(n.in_flight_requests_max, 16);
        assert_eq!(n.idle_timeout, Duration::ZERO);
        assert_eq!(n.reply_stall_timeout, Duration::from_secs(5));
        assert_eq!(n.connections_max, 100);
        let d = frontend_config(&Settings::default()).unwrap();
        assert_eq!(d, zilla_frontend::FrontendConfig::default());
        let e = Settings::parse("frontend_memory_budget_bytes = 1M").unwrap_err();
        assert!(e.contains("out of range (allowed 67174400 to"), "{e}");
        let e = Settings::parse("nbd_in_flight_requests_max = 100000").unwrap_err();
        assert!(e.contains("out of range (allowed 1 to 65536)"), "{e}");
    }

    #[test]
    fn defaults_shrink_to_fit_and_explicit_caps_refuse() {
        let s = Settings::default();
        let l = Limits::resolve(&s, 1024, 2, 1024).unwrap();
        let total = l.admin.connections_max + l.http.connections_max + l.nbd_connections_max * 2 + l.fd_reserve;
        assert!(total <= 1024, "{total}");
        assert!(l.nbd_connections_max >= CONNECTIONS_MIN);
        let big = Limits::resolve(&s, 1 << 20, 2, 1024).unwrap();
        assert_eq!(big.nbd_connections_max, 1024);
        let explicit = Settings { nbd_connections_max: Some(1000), ..Default::default() };
        let e = Limits::resolve(&explicit, 1024, 2, 1024).unwrap_err().to_string();
        assert!(e.contains("do not fit under the descriptor limit 1024"), "{e}");
        assert!(Limits::resolve(&s, 200, 2, 1024).is_err());
    }
}
