//! Size parsing and ZFS-style number formatting.
//!
//! Input follows `zfs_nicestrtonum`: powers of 1024, case-insensitive suffixes
//! K/M/G/T/P/E with an optional `B` or `iB` (so `10G` = `10GB` = `10GiB`), decimals
//! allowed (`1.5T`), plain numbers are bytes. Output follows `zfs_nicenum`: at most
//! five characters, three significant digits (`1.50G`, `16K`, `117K`), exact with `-p`.

const SUFFIXES: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];

/// Parse a size such as `10G`, `512M`, `16K`, `1.5T` or `4096`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("bad size '{s}': expected a number with an optional K, M, G, T, P or E suffix (powers of 1024)");
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() || num.starts_with('.') && num.len() == 1 {
        return Err(bad());
    }
    let upper = suffix.trim().to_ascii_uppercase();
    let unit = match upper.as_str() {
        "" | "B" => 0,
        _ => {
            let letter = &upper[..1];
            let rest = &upper[1..];
            if !(rest.is_empty() || rest == "B" || rest == "IB") {
                return Err(bad());
            }
            SUFFIXES.iter().position(|x| *x == letter).filter(|&i| i > 0).ok_or_else(bad)?
        }
    };
    let mult = 1u128 << (10 * unit);
    let value: u128 = if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| bad())?;
        let v = f * mult as f64;
        if !v.is_finite() || v > u64::MAX as f64 {
            return Err(format!("bad size '{s}': too large"));
        }
        v.round() as u128
    } else {
        let n: u128 = num.parse().map_err(|_| bad())?;
        n.checked_mul(mult).ok_or_else(|| format!("bad size '{s}': too large"))?
    };
    u64::try_from(value).map_err(|_| format!("bad size '{s}': too large"))
}

/// `zfs_nicenum`: 1024-based, K/M/G..., no unit below 1024 (counts, ops).
pub fn nicenum(n: u64) -> String {
    nice(n, "")
}

/// `zfs_nicebytes`: like [`nicenum`] but `B` below 1024 (`512B`, `0B`).
pub fn nicebytes(n: u64) -> String {
    nice(n, "B")
}

fn nice(n: u64, unit0: &str) -> String {
    let mut index = 0;
    let mut v = n;
    while v >= 1024 && index < 6 {
        v /= 1024;
        index += 1;
    }
    let u = if index == 0 { unit0 } else { SUFFIXES[index] };
    let div = 1u128 << (10 * index);
    if index == 0 || (n as u128) % div == 0 {
        return format!("{v}{u}");
    }
    let x = n as f64 / div as f64;
    for precision in (0..=2).rev() {
        let s = format!("{x:.precision$}{u}");
        if s.len() <= 5 {
            return s;
        }
    }
    format!("{x:.0}{u}")
}

/// Time in nanoseconds as zpool iostat -l prints it (`zfs_nicenum` TIME format):
/// 1000-based ns/us/ms/s, whole numbers rounded down, so `4.17ms` shows as `4ms`.
pub fn nicetime_ns(ns: u64) -> String {
    const UNITS: [&str; 4] = ["ns", "us", "ms", "s"];
    let mut index = 0;
    let mut v = ns;
    while v >= 1000 && index < 3 {
        v /= 1000;
        index += 1;
    }
    format!("{v}{}", UNITS[index])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_zfs_sizes() {
        assert_eq!(parse_size("10G").unwrap(), 10 << 30);
        assert_eq!(parse_size("10GB").unwrap(), 10 << 30);
        assert_eq!(parse_size("10gib").unwrap(), 10 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("16k").unwrap(), 16384);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5T").unwrap(), 1649267441664);
        assert_eq!(parse_size("100B").unwrap(), 100);
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "G", "10X", "ten", "1.2.3G", "10GG", "-5M", "16EB0", "99999999E", "."] {
            assert!(parse_size(s).is_err(), "{s} should be rejected");
        }
    }

    #[test]
    fn formats_like_zfs() {
        assert_eq!(nicebytes(0), "0B");
        assert_eq!(nicebytes(512), "512B");
        assert_eq!(nicebytes(16384), "16K");
        assert_eq!(nicebytes(3 << 29), "1.50G");
        assert_eq!(nicebytes(119808), "117K");
        // zfs_nicenum falls back to precision 0 here, as we do.
        assert_eq!(nicebytes(1023 * 1024 + 1000), "1024K");
        assert_eq!(nicenum(1000), "1000");
        assert_eq!(nicenum(10 << 30), "10G");
        assert_eq!(nicetime_ns(4_170_000), "4ms");
        assert_eq!(nicetime_ns(999_999), "999us");
        assert_eq!(nicetime_ns(512), "512ns");
    }
}
