//! status_text: the prose `zpool status` prints around the engine's structured status:
//! the `status:` and `action:` paragraphs, the `scan:` line and the `errors:` line.
//!
//! Theory of operation
//! -------------------
//! The engine reports health, per-device error counters, the scan record and the
//! data-error count as data (`spa::PoolStatus`); the words an administrator reads are
//! chosen here, from those fields alone, so the daemon, the CLI and the web page agree.
use crate::units::nicebytes;
use zilla_core::scan::ScanStatus;
use zilla_core::spa::trim::{TrimState, TrimStatus};
use zilla_core::spa::{PoolStatus, VdevStatus};

/// `status:` and `action:` paragraphs; both empty when there is nothing to say.
pub fn status_action(s: &PoolStatus) -> (String, String) {
    let resilvering = s.scan.func == zilla_core::scan::ScanFunc::Resilver && s.scan.state == zilla_core::scan::ScanState::Scanning;
    if resilvering && matches!(s.state.as_str(), "ONLINE" | "DEGRADED") && !any_leaf_down(&s.config) {
        // zpool: a resilver with every device present, onto a new disk or one back
        return (
            "One or more devices is currently being resilvered.  The pool will\n\tcontinue to function, possibly in a degraded state.".to_string(),
            "Wait for the resilver to complete.".to_string(),
        );
    }
    let (status, action): (&str, &str) = match s.state.as_str() {
        "ONLINE" if device_errors(&s.config) > 0 => (
            "One or more devices has experienced an unrecoverable error.  An\n\tattempt was made to correct the error.  Applications are unaffected.",
            "Determine if the device needs to be replaced, and clear the errors\n\tusing 'zilla pool clear' or replace the device with 'zilla pool replace'.",
        ),
        "ONLINE" => ("", ""),
        "DEGRADED" => (
            "One or more devices is offline, missing or resilvering.  Sufficient replicas exist for\n\tthe pool to continue functioning in a degraded state.",
            "Online the device using 'zilla pool online' or replace it with 'zilla pool replace'.",
        ),
        "SUSPENDED" => (
            "The pool is suspended: a txg could not be written.",
            "Check the devices; writes wait until the pool can be synced (failmode=wait).\n\tOnce they work, 'zilla pool clear' resumes it; 'zilla pool export -f' exports it\n\twithout the final sync.",
        ),
        _ => ("One or more devices could not be used.", "Attach the missing device and import again."),
    };
    (status.to_string(), action.to_string())
}

/// Some device in the tree is offline, missing or faulted.
fn any_leaf_down(vdevs: &[VdevStatus]) -> bool {
    vdevs.iter().any(|v| if v.children.is_empty() { v.state != "ONLINE" } else { any_leaf_down(&v.children) })
}

/// Read + write + checksum errors over every device in the tree.
fn device_errors(vdevs: &[VdevStatus]) -> u64 {
    vdevs.iter().map(|v| v.read_errors + v.write_errors + v.cksum_errors + device_errors(&v.children)).sum()
}

/// `errors:` line.
pub fn errors_line(s: &PoolStatus) -> String {
    match s.data_errors {
        0 => "No known data errors".into(),
        n => format!("{n} data errors, use '-v' for a list"),
    }
}

/// `scan:` line of `zilla pool status`, in zpool's words
/// (`print_scan_scrub_resilver_status`); its lines are indented where it is printed.
pub fn scan_line(s: &ScanStatus) -> String {
    if s.func == zilla_core::scan::ScanFunc::None {
        return "none requested".into();
    }
    let hms = secs_to_dhms(s.end_time_s.saturating_sub(s.start_time_s));
    match (s.func.as_str(), s.state.as_str()) {
        ("scrub", "scanning") => format!("scrub in progress since {}\n{}", fmt_time(s.start_time_s), scan_progress(s)),
        ("scrub", "paused") => {
            format!("scrub paused since {}\nscrub started on {}\n{}", fmt_time(s.pause_time_s.max(s.start_time_s)), fmt_time(s.start_time_s), scan_progress(s))
        }
        ("scrub", "canceled") => format!("scrub canceled on {}", fmt_time(s.end_time_s)),
        ("scrub", _) => format!("scrub repaired {} in {hms} with {} errors on {}", nicebytes(s.repaired_bytes), s.errors, fmt_time(s.end_time_s)),
        ("resilver", "scanning" | "paused") => format!("resilver in progress since {}\n{}", fmt_time(s.start_time_s), scan_progress(s)),
        ("resilver", _) => format!("resilvered {} in {hms} with {} errors on {}", nicebytes(s.repaired_bytes), s.errors, fmt_time(s.end_time_s)),
        _ => "none requested".into(),
    }
}

/// The two progress lines of a scan in progress or paused: scanned and issued of the
/// allocated bytes with their rates, then repaired, percentage and time to go.
fn scan_progress(s: &ScanStatus) -> String {
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let p = s.progress.clone().unwrap_or_else(|| zilla_core::scan::progress(s, now_s));
    let paused = s.state == zilla_core::scan::ScanState::Paused;
    let rate = |r: u64| if paused || r == 0 { String::new() } else { format!(" at {}/s", nicebytes(r)) };
    let what = if s.func == zilla_core::scan::ScanFunc::Resilver { "resilvered" } else { "repaired" };
    let to_go = match (paused, p.seconds_left) {
        (true, _) => String::new(),
        (false, Some(secs)) => format!(", {} to go", secs_to_dhms(secs)),
        (false, None) => ", no estimated completion time".into(),
    };
    format!(
        "{} / {} scanned{}, {} / {} issued{}\n{} {what}, {:.2}% done{to_go}",
        nicebytes(s.examined_bytes),
        nicebytes(s.to_examine_bytes),
        rate(p.scan_rate_bytes_per_s),
        nicebytes(s.issued_bytes),
        nicebytes(p.issue_total_bytes),
        rate(p.issue_rate_bytes_per_s),
        nicebytes(s.repaired_bytes),
        p.percent_done,
    )
}

/// zpool's `secs_to_dhms`: "00:01:05", "2 days 03:00:00".
pub fn secs_to_dhms(total: u64) -> String {
    let (days, hours, mins, secs) = (total / 86400, total / 3600 % 24, total / 60 % 60, total % 60);
    if days > 0 {
        format!("{days} days {hours:02}:{mins:02}:{secs:02}")
    } else {
        format!("{hours:02}:{mins:02}:{secs:02}")
    }
}

/// `trim:` line of `zilla pool status` (none before the first `zilla pool trim`).
pub fn trim_line(t: &TrimStatus) -> Option<String> {
    let pct = if t.free_bytes_at_start == 0 { 100.0 } else { (t.bytes_trimmed as f64 * 100.0 / t.free_bytes_at_start as f64).min(100.0) };
    let done = format!("{} trimmed, {} errors", nicebytes(t.bytes_trimmed), t.errors);
    Some(match t.state {
        TrimState::None => return None,
        TrimState::Active => format!("trim in progress since {}\n\t{done}, about {pct:.0}% of the free space", fmt_time(t.start_time_s)),
        TrimState::Suspended => format!("trim suspended (since {})\n\t{done}", fmt_time(t.start_time_s)),
        TrimState::Canceled => format!("trim canceled on {}\n\t{done}", fmt_time(t.end_time_s)),
        TrimState::Complete => format!("trim completed on {}\n\t{done}", fmt_time(t.end_time_s)),
    })
}

/// "Sat Nov 21 19:45:00 2026" (UTC).
pub fn fmt_time(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // civil from days (Howard Hinnant)
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    let wd = ((days % 7 + 11) % 7) as usize; // 1970-01-01 was a Thursday
    const W: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const M: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!("{} {} {:2} {:02}:{:02}:{:02} {}", W[wd], M[(m - 1) as usize], d, rem / 3600, rem / 60 % 60, rem % 60, y)
}


#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn formats() {
        // one size formatter for the whole CLI (units::nicebytes, zfs_nicebytes rules):
        // exact multiples print without decimals, as zpool status does
        assert_eq!(nicebytes(0), "0B");
        assert_eq!(nicebytes(16384), "16K");
        assert_eq!(nicebytes(1536 << 20), "1.50G");
        assert_eq!(fmt_time(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(fmt_time(1_795_290_300), "Sat Nov 21 19:45:00 2026");
        assert_eq!(secs_to_dhms(65), "00:01:05");
        assert_eq!(secs_to_dhms(2 * 86400 + 3 * 3600), "2 days 03:00:00");
    }

    /// A scrub half-way on a 2-way mirror: totals are the allocated bytes (not both
    /// copies), with rates, percentage and time left as zpool prints them.
    #[test]
    fn scan_progress_reads_like_zpool() {
        use zilla_core::scan::{ScanFunc, ScanState};
        let g = 1u64 << 30;
        let mut s = ScanStatus {
            func: ScanFunc::Scrub,
            state: ScanState::Scanning,
            start_time_s: 1_795_290_300,
            pass_start_time_s: 1_795_290_300,
            examined_bytes: 3 * g / 2,
            to_examine_bytes: 2 * g,
            issued_bytes: g,
            pass_examined_bytes: 3 * g / 2,
            pass_issued_bytes: g,
            ..Default::default()
        };
        // 32 s in: 48 MiB/s scanned, 32 MiB/s issued, 1 GiB to go: 32 s
        s.progress = Some(zilla_core::scan::progress(&s, 1_795_290_300 + 32));
        assert_eq!(
            scan_line(&s),
            "scrub in progress since Sat Nov 21 19:45:00 2026\n1.50G / 2G scanned at 48M/s, 1G / 2G issued at 32M/s\n0B repaired, 50.00% done, 00:00:32 to go"
        );
        // a resilver under 10 MiB/s: no estimate
        s.func = ScanFunc::Resilver;
        s.repaired_bytes = g;
        s.progress = Some(zilla_core::scan::progress(&s, 1_795_290_300 + 200));
        let line = scan_line(&s);
        assert!(line.starts_with("resilver in progress since"), "{line}");
        assert!(line.ends_with("1G resilvered, 50.00% done, no estimated completion time"), "{line}");
        // paused: no rates, no estimate
        s.func = ScanFunc::Scrub;
        s.state = ScanState::Paused;
        s.pause_time_s = 1_795_290_300 + 60;
        s.progress = Some(zilla_core::scan::progress(&s, 1_795_290_300 + 90));
        assert_eq!(
            scan_line(&s),
            "scrub paused since Sat Nov 21 19:46:00 2026\nscrub started on Sat Nov 21 19:45:00 2026\n1.50G / 2G scanned, 1G / 2G issued\n1G repaired, 50.00% done"
        );
    }
}
