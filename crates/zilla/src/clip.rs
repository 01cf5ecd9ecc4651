//! Error messages quote bad values, and a value can be anything a client sent (a
//! 1.5 MB "volume name"). Every message that leaves the daemon or the CLI passes
//! through [`clip_message`]: a quoted part ('...' or "...") longer than
//! [`QUOTE_MAX_CHARS`] is cut to that length and marked, control characters and the
//! characters that reorder or hide text (bidi overrides and isolates, zero-width and
//! other invisible format characters: `zilla_core::spa::is_unsafe_char`) are shown
//! escaped (a message stays one line and reads as it is), and the whole message is
//! bounded. A name on its own ([`clip`]) follows the rule of `zilla_core::spa::printable`,
//! which escapes the backslash as well; a whole message leaves backslashes as they are,
//! as the names in it are escaped already.

/// Longest part of a bad value quoted back.
pub const QUOTE_MAX_CHARS: usize = 100;
/// Longest message as a whole (many quoted parts, or long unquoted text).
const MESSAGE_MAX_CHARS: usize = 1000;
const CUT_MARK: &str = "...(truncated)";

/// A name (from a device or a client) fit to print: escaped by the one rule of
/// `zilla_core::spa::printable` and cut to [`QUOTE_MAX_CHARS`] characters (marked
/// when cut).
pub fn clip(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().take(QUOTE_MAX_CHARS) {
        zilla_core::spa::push_printable_char(&mut out, c);
    }
    if s.chars().nth(QUOTE_MAX_CHARS).is_some() {
        out.push_str(CUT_MARK);
    }
    out
}

/// A character of a message: escaped when unsafe, else as it is (backslash included).
fn printable(c: char) -> String {
    if zilla_core::spa::is_unsafe_char(c) {
        c.escape_default().to_string()
    } else {
        c.to_string()
    }
}

/// A message with every over-long quoted part cut and control characters escaped.
pub fn clip_message(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(MESSAGE_MAX_CHARS + 64));
    let mut chars = msg.chars().peekable();
    let mut total = 0usize;
    while let Some(c) = chars.next() {
        if total >= MESSAGE_MAX_CHARS {
            out.push_str(CUT_MARK);
            break;
        }
        out.push_str(&printable(c));
        total += 1;
        if c != '\'' && c != '"' {
            continue;
        }
        // Inside a quote: copy up to QUOTE_MAX_CHARS, skip the rest up to the close.
        let mut quoted = 0usize;
        let mut cut = false;
        while let Some(&q) = chars.peek() {
            if q == c {
                break;
            }
            chars.next();
            if quoted < QUOTE_MAX_CHARS {
                out.push_str(&printable(q));
                total += 1;
            } else {
                cut = true;
            }
            quoted += 1;
        }
        if cut {
            out.push_str(CUT_MARK);
        }
        if let Some(close) = chars.next() {
            out.push(close);
            total += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_quoted_values_are_cut() {
        let v = "x".repeat(1_500_000);
        let m = clip_message(&format!("invalid volume name '{v}': use letters"));
        assert!(m.len() < 200, "{}", m.len());
        assert!(m.starts_with("invalid volume name 'xxx"));
        assert!(m.ends_with("...(truncated)': use letters"), "{m}");
        assert_eq!(m.matches('x').count(), QUOTE_MAX_CHARS);
    }

    #[test]
    fn short_messages_unchanged_and_one_line() {
        assert_eq!(clip_message("no such pool 'tank'"), "no such pool 'tank'");
        assert_eq!(clip_message("bad 'a\nb'"), "bad 'a\\nb'");
        assert_eq!(clip(&"y".repeat(101)).len(), 100 + CUT_MARK.len());
        assert_eq!(clip("short"), "short");
        // An apostrophe with no closing quote does not swallow the message.
        assert_eq!(clip_message("can't open it"), "can't open it");
    }

    #[test]
    fn names_and_messages_hide_nothing() {
        // a right-to-left override, an isolate, a zero-width space, a BOM, a backslash
        let name = "ev\u{202e}il\u{2066}\\x\u{200b}\u{feff}";
        assert_eq!(clip(name), "ev\\u{202e}il\\u{2066}\\\\x\\u{200b}\\u{feff}");
        assert_eq!(clip(name), zilla_core::spa::printable(name), "one rule for every name");
        assert_eq!(clip("café"), "café", "other characters stay readable");
        // a message keeps its backslashes (its names are escaped already) but hides nothing
        assert_eq!(clip_message(&format!("pool '{}'", clip(name))), format!("pool '{}'", clip(name)));
        assert_eq!(clip_message("a\u{202e}b\\c"), "a\\u{202e}b\\c");
    }

    #[test]
    fn whole_message_bounded() {
        let m = clip_message(&"z".repeat(5000));
        assert!(m.chars().count() <= MESSAGE_MAX_CHARS + CUT_MARK.len());
    }
}
