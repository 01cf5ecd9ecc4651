//! Where the engine's tunables get their values: the config file, the persistent
//! settings of `zilla tunable set -p`, `serve --tunable`, and live changes.
//!
//! Theory of operation
//! -------------------
//! The engine's tunables are process-wide values (`zilla_core::tunables()`), each with
//! a default, a range and, where OpenZFS bounds one by the machine (zfs_arc_max below
//! RAM), a bound. At start the daemon applies, in this order, each later one winning:
//!
//! ```text
//!   default  <  config file (`tunable.NAME = VALUE`)  <  DIR/tunables.conf
//!            <  serve --tunable NAME=VALUE
//! ```
//!
//! DIR/tunables.conf holds what `zilla tunable set -p` set (`NAME = VALUE` lines,
//! replaced atomically on each change). A plain `tunable set` changes the live value
//! only (source `temporary`, gone at restart), as an OpenZFS module parameter written
//! in /sys/module/zfs/parameters is. `NAME=default` sets the value a start without a
//! persistent setting would give (the config file's, else the built-in default); with
//! `-p` it also removes NAME from DIR/tunables.conf.
//!
//! A bad value in the config file or on the command line refuses the start with the
//! reason; a persistent value the machine no longer allows (less RAM since) is logged
//! and left at the config file's value or the default, so a smaller machine still
//! starts. The source of every value is kept here for `tunable get` (SOURCE).

use std::collections::HashMap;
use std::path::Path;

use parking_lot::Mutex;
use zilla_core::kstat::Tunable;

use crate::config::TUNABLE_PREFIX as CONFIG_PREFIX;

/// The persistent settings' file in the state directory.
pub const PERSISTENT_FILE_NAME: &str = "tunables.conf";
const PERSISTENT_TMP_NAME: &str = ".tunables.conf.tmp";
/// Longest persistent file read (a few hundred tunables fit in a few KiB).
const PERSISTENT_FILE_MAX_BYTES: u64 = 1 << 20;

/// Where a tunable's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Default,
    Config,
    Persistent,
    CommandLine,
    Temporary,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::Config => "config",
            Source::Persistent => "persistent",
            Source::CommandLine => "cmdline",
            Source::Temporary => "temporary",
        }
    }
}

#[derive(Default)]
struct Origins {
    /// Tunables not at their default, by name.
    sources: HashMap<&'static str, Source>,
    /// The config file's values (what `NAME=default` returns to).
    config_values: HashMap<&'static str, u64>,
}

static ORIGINS: Mutex<Option<Origins>> = Mutex::new(None);
/// Serializes the read-modify-write of DIR/tunables.conf.
static PERSISTENT_LOCK: Mutex<()> = Mutex::new(());

fn with_origins<R>(f: impl FnOnce(&mut Origins) -> R) -> R {
    f(ORIGINS.lock().get_or_insert_with(Origins::default))
}

/// The source of `name`'s current value.
pub fn source(name: &str) -> Source {
    with_origins(|o| o.sources.get(name).copied().unwrap_or(Source::Default))
}

/// A tunable by name, or the error naming it.
fn find(name: &str) -> Result<&'static Tunable, String> {
    zilla_core::tunables().find(name).ok_or_else(|| format!("unknown tunable '{}'", crate::clip::clip(name)))
}

/// A value as an admin writes it: a choice's name, or a number with size suffixes.
pub fn parse_value(t: &Tunable, text: &str) -> Result<u64, String> {
    if let Some(v) = t.value_of(text) {
        return Ok(v);
    }
    crate::units::parse_size(text).map_err(|_| {
        if t.choices.is_empty() {
            format!("bad value '{}': expected a number (size suffixes K, M, G allowed)", crate::clip::clip(text))
        } else {
            format!("bad value '{}': expected one of {}", crate::clip::clip(text), t.choices.join(", "))
        }
    })
}

fn set_from(t: &'static Tunable, value: u64, source: Source) -> Result<(), String> {
    t.set(value).map_err(|e| e.to_string())?;
    with_origins(|o| {
        o.sources.insert(t.name, source);
        if source == Source::Config {
            o.config_values.insert(t.name, value);
        }
    });
    Ok(())
}

/// `NAME = VALUE` lines of DIR/tunables.conf (missing file: none).
fn read_persistent(dir: &Path) -> Result<Vec<(String, String)>, String> {
    let path = dir.join(PERSISTENT_FILE_NAME);
    match crate::state_dir::read_regular_file(&path, PERSISTENT_FILE_MAX_BYTES) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| format!("{}: not text", path.display()))?;
            crate::config::parse_lines(&text).map_err(|e| format!("{}: {e}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Apply the config file's tunables, DIR/tunables.conf and `serve --tunable`, in
/// that order (see the module comment). `config` holds the file's `tunable.*` lines
/// without the prefix.
pub fn apply_at_start(config_path: &Path, config: &[(String, String)], dir: &Path, command_line: &[String]) -> Result<(), String> {
    for (name, text) in config {
        let at = |e: String| format!("{}: {CONFIG_PREFIX}{}: {e}", config_path.display(), crate::clip::clip(name));
        let t = find(name).map_err(at)?;
        let value = parse_value(t, text).map_err(at)?;
        set_from(t, value, Source::Config).map_err(at)?;
    }
    for (name, text) in read_persistent(dir)? {
        let applied = find(&name).and_then(|t| set_from(t, parse_value(t, &text)?, Source::Persistent));
        match applied {
            Ok(()) => tracing::info!("tunable {name} = {text} (persistent, {})", dir.join(PERSISTENT_FILE_NAME).display()),
            Err(e) => tracing::error!("{}: ignoring {name} = {text}: {e}", dir.join(PERSISTENT_FILE_NAME).display()),
        }
    }
    for a in command_line {
        let (name, text) = a.split_once('=').ok_or_else(|| format!("--tunable {a}: expected NAME=VALUE"))?;
        let t = find(name.trim()).map_err(|e| format!("--tunable {a}: {e}"))?;
        let value = parse_value(t, text.trim()).map_err(|e| format!("--tunable {a}: cannot set tunable '{}': {e}", t.name))?;
        set_from(t, value, Source::CommandLine).map_err(|e| format!("--tunable {a}: cannot set tunable '{}': {e}", t.name))?;
    }
    Ok(())
}

/// Write DIR/tunables.conf with `name` set to `text` (None: removed).
fn persist(dir: &Path, name: &str, text: Option<&str>) -> Result<(), String> {
    let _g = PERSISTENT_LOCK.lock();
    let mut lines = read_persistent(dir)?;
    lines.retain(|(n, _)| n != name);
    if let Some(t) = text {
        lines.push((name.to_string(), t.to_string()));
    }
    let mut out = String::from(
        "# Tunables set with `zilla tunable set -p NAME=VALUE`, applied at every start after\n\
         # the config file's tunable.NAME lines and before `serve --tunable`.\n",
    );
    for (n, v) in &lines {
        out.push_str(&format!("{n} = {v}\n"));
    }
    crate::state_dir::replace_private(dir, PERSISTENT_FILE_NAME, PERSISTENT_TMP_NAME, out.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", dir.join(PERSISTENT_FILE_NAME).display()))
}

/// `tunable set [-p] NAME=VALUE` (`value` None: `NAME=default`). A persistent change
/// is written first, so a value the file cannot hold is not set either.
pub fn set_live(dir: &Path, name: &str, value: Option<u64>, persistent: bool) -> Result<(), String> {
    let t = find(name)?;
    let (value, source) = match value {
        Some(v) => (v, if persistent { Source::Persistent } else { Source::Temporary }),
        None => match with_origins(|o| o.config_values.get(t.name).copied()) {
            Some(v) => (v, Source::Config),
            None => (t.default, Source::Default),
        },
    };
    t.check(value).map_err(|e| e.to_string())?;
    if persistent {
        let text = (source == Source::Persistent).then(|| t.choices.get(value as usize).map_or(value.to_string(), |c| c.to_string()));
        persist(dir, t.name, text.as_deref())?;
    }
    t.set(value).map_err(|e| e.to_string())?;
    with_origins(|o| match source {
        Source::Default => o.sources.remove(t.name),
        s => o.sources.insert(t.name, s),
    });
    Ok(())
}

// ---------------------------------------------------------------------------------
// `tunable get`: the listing

/// Width a description is wrapped to under its row (after its indent).
const DESCRIPTION_WIDTH: usize = 76;
const DESCRIPTION_INDENT: &str = "    ";

/// Byte counts whose description does not say "bytes".
const BYTE_COUNTS_UNSAID: &[&str] = &["zfs_vdev_mirror_rotating_seek_offset"];
/// Descriptions that say "bytes" of something else (a rate, a multiple).
const NOT_BYTE_COUNTS: &[&str] = &["l2arc_headroom"];

/// Whether a tunable counts bytes (shown as 4G unless -p): its name or its
/// description says so (a rate in MB/s is not one).
fn counts_bytes(r: &crate::api::TunableRow) -> bool {
    let name = r.name.as_str();
    let says_bytes = r.description.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w.eq_ignore_ascii_case("bytes"));
    r.choices.is_empty()
        && !name.ends_with("_mb_s")
        && !NOT_BYTE_COUNTS.contains(&name)
        && (name.ends_with("_bytes") || name.contains("_bytes_") || name.ends_with("_sz") || says_bytes || BYTE_COUNTS_UNSAID.contains(&name))
}

/// One value as `tunable get` shows it: a choice's name, 4G for a byte count (exact
/// with -p), or the number.
fn shown(r: &crate::api::TunableRow, v: u64, parsable: bool) -> String {
    if let Some(c) = r.choices.get(v as usize) {
        return c.clone();
    }
    if counts_bytes(r) && !parsable {
        return crate::units::nicenum(v);
    }
    v.to_string()
}

/// `text` wrapped at word boundaries to [`DESCRIPTION_WIDTH`], each line indented.
fn wrapped(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > DESCRIPTION_WIDTH {
            out.push_str(&format!("{DESCRIPTION_INDENT}{line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{DESCRIPTION_INDENT}{line}\n"));
    }
    out
}

/// The `tunable get` table: NAME VALUE DEFAULT SOURCE RANGE APPLIES, sizes in zfs's
/// short form (exact with `parsable`), each description wrapped under its row when
/// `describe`. Scripted: one tab-separated line per tunable, its description last.
pub fn listing(rows: &[crate::api::TunableRow], scripted: bool, parsable: bool, describe: bool) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let auto = if r.zero_is_auto { "0," } else { "" };
            let range = if r.choices.is_empty() {
                format!("{auto}{}..{}", shown(r, r.min, parsable), shown(r, r.max, parsable))
            } else {
                r.choices.join("|")
            };
            let mut row = vec![r.name.clone(), shown(r, r.value, parsable), shown(r, r.default, parsable), r.source.clone(), range, r.applies.clone()];
            if scripted {
                row.push(r.description.clone());
            }
            row
        })
        .collect();
    use crate::format::Align::*;
    let headers = ["NAME", "VALUE", "DEFAULT", "SOURCE", "RANGE", "APPLIES"];
    let table = crate::format::table(&headers, &[Left, Right, Right, Left, Left, Left, Left], &cells, scripted);
    if scripted || !describe {
        return table;
    }
    let mut lines = table.lines();
    let mut out = lines.next().map(|h| format!("{h}\n")).unwrap_or_default();
    for (line, r) in lines.zip(rows) {
        out.push_str(line);
        out.push('\n');
        out.push_str(&wrapped(&r.description));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, value: u64, description: &str) -> crate::api::TunableRow {
        crate::api::TunableRow {
            name: name.into(),
            value,
            default: 0,
            min: 64 << 20,
            max: 1 << 50,
            zero_is_auto: true,
            applies: "live".into(),
            description: description.into(),
            choices: vec![],
            source: "persistent".into(),
        }
    }

    #[test]
    fn the_listing_shows_sizes_short_and_wraps_descriptions() {
        let long = "ARC size limit in bytes, one ARC for every pool of the daemon; ".repeat(6);
        let rows = vec![row("zfs_arc_max", 4 << 30, &long), row("zfs_txg_timeout", 5 << 30, "seconds")];
        let text = listing(&rows, false, false, true);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME") && lines[0].contains("SOURCE") && !lines[0].contains("DESCRIPTION"), "{text}");
        assert!(lines[1].starts_with("zfs_arc_max") && lines[1].contains(" 4G ") && lines[1].contains("0,64M..1P"), "{text}");
        assert!(text.contains("5368709120"), "a count that is not bytes stays exact: {text}");
        assert!(lines.iter().all(|l| l.len() <= 100), "bounded width: {text}");
        assert!(lines[2].starts_with("    ARC size limit in bytes"), "{text}");
        let exact = listing(&rows, true, true, false);
        assert!(exact.starts_with("zfs_arc_max\t4294967296\t0\tpersistent\t0,67108864..1125899906842624\tlive\tARC"), "{exact}");
        assert_eq!(listing(&rows, false, false, false).lines().count(), 3, "no descriptions unless asked");
    }

    #[test]
    fn byte_counts_are_told_from_other_numbers() {
        let rows = zilla_core::tunables().list();
        let by_name = |n: &str| {
            let t = rows.iter().find(|t| t.name == n).unwrap();
            let mut r = row(t.name, 0, t.description);
            r.choices = t.choices.iter().map(|c| c.to_string()).collect();
            counts_bytes(&r)
        };
        for n in ["zfs_arc_max", "zfs_arc_min", "zfs_dirty_data_max", "l2arc_write_max", "zil_maxblocksize", "zfs_trim_extent_bytes_min", "zfs_vdev_mirror_rotating_seek_offset"] {
            assert!(by_name(n), "{n} counts bytes");
        }
        for n in ["zfs_txg_timeout", "sim_ssd_log_write_mb_s", "l2arc_headroom", "zfs_delay_scale", "zfs_write_throttle_mode", "sim_seed"] {
            assert!(!by_name(n), "{n} does not count bytes");
        }
    }

    #[test]
    fn later_sources_win_and_persistent_settings_survive_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // zfs_txg_history and zfs_txg_timeout are not read by this crate's other tests
        let config = vec![("zfs_txg_history".to_string(), "50".to_string()), ("zfs_txg_timeout".to_string(), "7".to_string())];
        set_live(dir.path(), "zfs_txg_timeout", Some(9), true).unwrap();
        apply_at_start(Path::new("z.conf"), &config, dir.path(), &["zfs_txg_history=60".to_string()]).unwrap();
        let t = zilla_core::tunables();
        assert_eq!((t.get("zfs_txg_timeout"), source("zfs_txg_timeout")), (Some(9), Source::Persistent));
        assert_eq!((t.get("zfs_txg_history"), source("zfs_txg_history")), (Some(60), Source::CommandLine));
        let text = std::fs::read_to_string(dir.path().join(PERSISTENT_FILE_NAME)).unwrap();
        assert!(text.contains("zfs_txg_timeout = 9\n"), "{text}");
        // `-p NAME=default`: back to the config file's value, and out of the file
        set_live(dir.path(), "zfs_txg_timeout", None, true).unwrap();
        assert_eq!((t.get("zfs_txg_timeout"), source("zfs_txg_timeout")), (Some(7), Source::Config));
        assert!(!std::fs::read_to_string(dir.path().join(PERSISTENT_FILE_NAME)).unwrap().contains("zfs_txg_timeout"));
        let e = apply_at_start(Path::new("z.conf"), &[("zfs_nope".into(), "1".into())], dir.path(), &[]).unwrap_err();
        assert_eq!(e, "z.conf: tunable.zfs_nope: unknown tunable 'zfs_nope'");
        let e = set_live(dir.path(), "zfs_txg_timeout", Some(0), true).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        set_live(dir.path(), "zfs_txg_timeout", None, false).unwrap();
        set_live(dir.path(), "zfs_txg_history", None, false).unwrap();
    }
}
