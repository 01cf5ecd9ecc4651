//! sd_notify: telling a service manager (systemd, `Type=notify`) how the daemon is.
//!
//! Theory of operation
//! -------------------
//! A service manager that wants to hear from the daemon sets `NOTIFY_SOCKET` to a unix
//! datagram socket (a path, or `@name` for the abstract namespace) and the daemon sends
//! it newline-separated `KEY=VALUE` datagrams (sd_notify(3)); no libsystemd is needed:
//!
//! ```text
//!   start ── sockets bound, pools imported ──▶ READY=1, STATUS=serving ...
//!   every WATCHDOG_USEC / 2 (when set)     ──▶ WATCHDOG=1
//!   SIGTERM / SIGINT                        ──▶ STOPPING=1, STATUS=exporting pools
//! ```
//!
//! The watchdog pings come from a task on the daemon's async runtime, so a runtime
//! that stops making progress stops the pings and the manager restarts the daemon
//! (`WatchdogSec=` in the unit). `WATCHDOG_PID`, when set, must be this process (a
//! child started by the daemon would otherwise ping for it). Without `NOTIFY_SOCKET`
//! every call does nothing. A datagram that cannot be sent is logged once at debug
//! level: the daemon serves on whether or not anyone listens.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where to send, from `NOTIFY_SOCKET` (None: nobody listens).
fn socket_address() -> Option<std::os::unix::net::SocketAddr> {
    let name = std::env::var_os("NOTIFY_SOCKET")?;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
    if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        return std::os::unix::net::SocketAddr::from_abstract_name(abstract_name).ok();
    }
    if bytes.first() == Some(&b'/') {
        return std::os::unix::net::SocketAddr::from_pathname(std::path::Path::new(&name)).ok();
    }
    None
}

/// Send one notification (`KEY=VALUE` lines); false when nobody listens or it failed.
pub fn notify(state: &str) -> bool {
    let Some(addr) = socket_address() else { return false };
    let sent = UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), &addr));
    if let Err(e) = &sent {
        tracing::debug!("cannot notify the service manager ({state:?}): {e}");
    }
    sent.is_ok()
}

/// A STATUS= line has no line breaks and a bounded length.
fn status_line(status: &str) -> String {
    const STATUS_MAX_CHARS: usize = 200;
    status.chars().map(|c| if c.is_control() { ' ' } else { c }).take(STATUS_MAX_CHARS).collect()
}

/// The daemon serves: READY=1 with a status line; starts the watchdog pings.
pub fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={}\nMAINPID={}", status_line(status), std::process::id()));
    spawn_watchdog();
}

/// The daemon is stopping (a signal arrived): STOPPING=1.
pub fn stopping(status: &str) {
    notify(&format!("STOPPING=1\nSTATUS={}", status_line(status)));
}

/// The watchdog interval the manager asks for: half of WATCHDOG_USEC, as sd_watchdog_enabled(3)
/// advises; None when no watchdog is set for this process.
fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Ping WATCHDOG=1 every half watchdog interval from the async runtime (must be
/// called inside it).
fn spawn_watchdog() {
    let Some(every) = watchdog_interval() else { return };
    if socket_address().is_none() {
        return;
    }
    tracing::info!("service manager watchdog: pinging every {} ms", every.as_millis());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            notify("WATCHDOG=1");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_one_bounded_line() {
        assert_eq!(status_line("a\nb"), "a b");
        assert_eq!(status_line(&"x".repeat(500)).len(), 200);
    }
}
