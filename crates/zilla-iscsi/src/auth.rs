//! auth: who may log in to which target, and CHAP (RFC 1994 as iSCSI uses it, RFC 7143
//! §12.1.3), pure.
//!
//! Theory of operation
//! -------------------
//! The [`AuthStore`] holds one [`TargetAuth`] per target name plus a default, used by
//! every target without its own entry and by discovery sessions. An entry may name a
//! CHAP user and secret the initiator must prove it knows (one-way CHAP), a second
//! user and secret the target proves to an initiator that asks (mutual CHAP), and a
//! list of initiator names allowed to log in (empty: any).
//!
//! One CHAP exchange ([`ChapTarget`]), MD5 only (CHAP_A=5):
//!
//! ```text
//!   initiator                                   target
//!   AuthMethod=CHAP,None              ──>
//!                                     <──  AuthMethod=CHAP
//!   CHAP_A=5                          ──>
//!                                     <──  CHAP_A=5 CHAP_I=id CHAP_C=0x<16 random bytes>
//!   CHAP_N=user CHAP_R=MD5(id‖secret‖C)
//!   [CHAP_I=id' CHAP_C=C' (mutual)]   ──>  check N and R (constant time)
//!                                     <──  [CHAP_N=mutual user CHAP_R=MD5(id'‖mutual secret‖C')]
//! ```
//!
//! Binary values are read in hex (`0x...`) or base64 (`0b...`) with bounded lengths;
//! anything malformed is an authentication failure. An initiator's challenge equal to
//! the one we sent (a reflection attack: it would make us compute the answer to our
//! own question), or shorter than [`PEER_CHALLENGE_MIN_BYTES`], is refused. Secrets
//! are never in a `Debug` output, a log line or an error message.

use std::collections::BTreeMap;
use std::fmt;

use md5::{Digest, Md5};

/// Shortest CHAP secret accepted (RFC 7143 §12.1.3 asks for 12 bytes at least).
pub const SECRET_MIN_BYTES: usize = 12;
/// Longest CHAP secret accepted.
pub const SECRET_MAX_BYTES: usize = 255;
/// Longest CHAP user name accepted.
pub const USER_MAX_BYTES: usize = 255;
/// Length of the challenges we send.
pub const CHALLENGE_BYTES: usize = 16;
/// Shortest challenge an initiator may send us (mutual CHAP).
pub const PEER_CHALLENGE_MIN_BYTES: usize = 16;
/// Longest challenge an initiator may send us (RFC 7143 §12.1.3: 1024 bytes).
pub const PEER_CHALLENGE_MAX_BYTES: usize = 1024;
/// Length of an MD5 CHAP response.
pub const RESPONSE_BYTES: usize = 16;
/// Most initiator names in one target's list.
pub const INITIATORS_MAX: usize = 1024;
/// Most per-target entries in a store.
pub const TARGETS_MAX: usize = 65_536;
/// Longest iSCSI name (RFC 7143 §4.2.7.1: 223 bytes).
pub const ISCSI_NAME_MAX_BYTES: usize = 223;

/// A CHAP user and its secret. `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub user: String,
    secret: Vec<u8>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential").field("user", &self.user).field("secret", &"<hidden>").finish()
    }
}

impl Credential {
    /// A credential, checked: a user of 1..=255 printable bytes with no `=`/NUL, a
    /// secret of `SECRET_MIN_BYTES..=SECRET_MAX_BYTES` bytes. The error never holds
    /// the secret.
    pub fn new(user: &str, secret: &[u8]) -> Result<Credential, String> {
        if user.is_empty() || user.len() > USER_MAX_BYTES {
            return Err(format!("a CHAP user name has 1 to {USER_MAX_BYTES} bytes"));
        }
        if user.chars().any(|c| c.is_control() || c == '\0') {
            return Err("a CHAP user name may not hold control characters".into());
        }
        if !(SECRET_MIN_BYTES..=SECRET_MAX_BYTES).contains(&secret.len()) {
            return Err(format!(
                "a CHAP secret has {SECRET_MIN_BYTES} to {SECRET_MAX_BYTES} bytes (this one has {})",
                secret.len()
            ));
        }
        if secret.contains(&0) {
            return Err("a CHAP secret may not hold a NUL byte".into());
        }
        Ok(Credential { user: user.to_string(), secret: secret.to_vec() })
    }

    pub fn secret(&self) -> &[u8] {
        &self.secret
    }
}

/// What one target (or the default) asks of initiators.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetAuth {
    /// The user and secret an initiator must prove (one-way CHAP); `None`: no CHAP.
    pub chap: Option<Credential>,
    /// The user and secret we prove to an initiator that asks (mutual CHAP).
    pub mutual: Option<Credential>,
    /// Initiator names allowed to log in (compared without case); empty: any.
    pub initiators: Vec<String>,
}

impl TargetAuth {
    /// "none", "chap" or "mutual".
    pub fn kind(&self) -> &'static str {
        match (&self.chap, &self.mutual) {
            (None, _) => "none",
            (Some(_), None) => "chap",
            (Some(_), Some(_)) => "mutual",
        }
    }

    pub fn is_empty(&self) -> bool {
        self.chap.is_none() && self.mutual.is_none() && self.initiators.is_empty()
    }

    /// Whether initiator `name` may log in.
    pub fn allows(&self, name: &str) -> bool {
        self.initiators.is_empty() || self.initiators.iter().any(|allowed| allowed.eq_ignore_ascii_case(name))
    }

    /// Check the entry as a whole: mutual CHAP needs one-way CHAP and a secret of its
    /// own (RFC 7143 §12.1.3: a secret authenticating initiators must not authenticate
    /// targets), initiator names are iSCSI names, at most `INITIATORS_MAX`.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(mutual) = &self.mutual {
            let Some(chap) = &self.chap else {
                return Err("mutual CHAP needs a CHAP user and secret for the initiator as well".into());
            };
            if mutual.secret == chap.secret {
                return Err("the mutual CHAP secret must differ from the initiator's CHAP secret".into());
            }
        }
        if self.initiators.len() > INITIATORS_MAX {
            return Err(format!("at most {INITIATORS_MAX} initiator names per target"));
        }
        for name in &self.initiators {
            check_iscsi_name(name)?;
        }
        Ok(())
    }
}

/// Check that `name` looks like an iSCSI name: `iqn.`, `eui.` or `naa.`, at most 223
/// bytes, printable ASCII without spaces.
pub fn check_iscsi_name(name: &str) -> Result<(), String> {
    let shown: String = name.chars().take(64).collect();
    let lower = name.to_ascii_lowercase();
    if !(lower.starts_with("iqn.") || lower.starts_with("eui.") || lower.starts_with("naa.")) {
        return Err(format!("'{shown}' is not an iSCSI name (iqn..., eui... or naa...)"));
    }
    if name.len() > ISCSI_NAME_MAX_BYTES || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("'{shown}' is not an iSCSI name (at most {ISCSI_NAME_MAX_BYTES} printable characters)"));
    }
    Ok(())
}

/// Every target's authentication settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthStore {
    /// Targets without an entry of their own, and discovery sessions.
    pub default: TargetAuth,
    /// Per target, keyed by the lowercased target name.
    targets: BTreeMap<String, TargetAuth>,
}

impl AuthStore {
    /// The entry that applies to target `name` (its own, else the default).
    pub fn entry(&self, name: &str) -> &TargetAuth {
        self.targets.get(&name.to_ascii_lowercase()).unwrap_or(&self.default)
    }

    /// Target `name`'s own entry, if it has one.
    pub fn own_entry(&self, name: &str) -> Option<&TargetAuth> {
        self.targets.get(&name.to_ascii_lowercase())
    }

    /// The per-target entries: (lowercased name, entry), in name order.
    pub fn targets(&self) -> impl Iterator<Item = (&str, &TargetAuth)> {
        self.targets.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Set (or, when `entry` is empty, remove) target `name`'s entry.
    pub fn set_target(&mut self, name: &str, entry: TargetAuth) -> Result<(), String> {
        check_iscsi_name(name)?;
        entry.validate()?;
        let key = name.to_ascii_lowercase();
        if entry.is_empty() {
            self.targets.remove(&key);
            return Ok(());
        }
        if !self.targets.contains_key(&key) && self.targets.len() >= TARGETS_MAX {
            return Err(format!("at most {TARGETS_MAX} targets may have settings of their own"));
        }
        self.targets.insert(key, entry);
        Ok(())
    }

    pub fn set_default(&mut self, entry: TargetAuth) -> Result<(), String> {
        entry.validate()?;
        self.default = entry;
        Ok(())
    }
}

/// The MD5 CHAP response (RFC 1994 §4.1): MD5(identifier ‖ secret ‖ challenge).
pub fn chap_response(identifier: u8, secret: &[u8], challenge: &[u8]) -> [u8; RESPONSE_BYTES] {
    let mut md5 = Md5::new();
    md5.update([identifier]);
    md5.update(secret);
    md5.update(challenge);
    md5.finalize().into()
}

/// `0x` and the bytes in lowercase hex.
pub fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 + 2 * bytes.len());
    out.push_str("0x");
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// A binary value of RFC 7143 §6.1: `0x`/`0X` hex (an odd digit count has an implied
/// leading zero) or `0b`/`0B` base64 (padding optional), of 1..=`max_bytes` bytes.
/// `None` for anything else.
pub fn decode_binary(value: &str, max_bytes: usize) -> Option<Vec<u8>> {
    let (prefix, body) = value.split_at_checked(2)?;
    let bytes = match prefix {
        "0x" | "0X" => {
            if body.len() > 2 * max_bytes + 1 {
                return None;
            }
            decode_hex(body)?
        }
        "0b" | "0B" => {
            if body.len() > max_bytes.div_ceil(3) * 4 + 4 {
                return None;
            }
            decode_base64(body)?
        }
        _ => return None,
    };
    if bytes.is_empty() || bytes.len() > max_bytes {
        return None;
    }
    Some(bytes)
}

fn decode_hex(digits: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let raw = digits.as_bytes();
    let mut out = Vec::with_capacity(raw.len() / 2 + 1);
    let (head, rest) = raw.split_at(raw.len() % 2);
    if let Some(&c) = head.first() {
        out.push(digit(c)?);
    }
    for pair in rest.chunks_exact(2) {
        out.push(digit(pair[0])? << 4 | digit(pair[1])?);
    }
    Some(out)
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let sextet = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let body = text.trim_end_matches('=');
    if text.len() - body.len() > 2 || (text.len() != body.len() && !text.len().is_multiple_of(4)) {
        return None;
    }
    let raw = body.as_bytes();
    if raw.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(raw.len() * 3 / 4);
    for chunk in raw.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = acc << 6 | sextet(c)?;
        }
        acc <<= 6 * (4 - chunk.len() as u32);
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// A CHAP identifier: a decimal or `0x` hex number of 0..=255.
fn parse_identifier(value: &str) -> Option<u8> {
    if let Some(hex) = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
        if hex.is_empty() || hex.len() > 4 {
            return None;
        }
        return u8::from_str_radix(hex, 16).ok();
    }
    if value.is_empty() || value.len() > 3 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// Equality whose time does not depend on where the bytes differ.
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a CHAP exchange failed: for the log, never holding a secret or a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChapFailure {
    /// CHAP_A names no algorithm we have (MD5, 5).
    NoSharedAlgorithm,
    /// A key came out of turn, or one expected is missing.
    OutOfOrder(&'static str),
    /// A value that cannot be read (bad encoding, wrong length).
    Malformed(&'static str),
    /// CHAP_N is not the configured user.
    UnknownUser,
    /// CHAP_R is not the answer to our challenge.
    WrongResponse,
    /// The initiator asks for mutual CHAP, which this target has no secret for.
    MutualNotConfigured,
    /// The initiator's challenge is ours sent back.
    ReflectedChallenge,
    /// The initiator's challenge is shorter than `PEER_CHALLENGE_MIN_BYTES`.
    ShortChallenge,
}

impl fmt::Display for ChapFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChapFailure::NoSharedAlgorithm => write!(f, "no shared CHAP algorithm (only MD5, CHAP_A=5)"),
            ChapFailure::OutOfOrder(what) => write!(f, "CHAP keys out of order: {what}"),
            ChapFailure::Malformed(key) => write!(f, "malformed {key}"),
            ChapFailure::UnknownUser => write!(f, "unknown CHAP user"),
            ChapFailure::WrongResponse => write!(f, "wrong CHAP response"),
            ChapFailure::MutualNotConfigured => write!(f, "mutual CHAP asked for, but the target has no mutual secret"),
            ChapFailure::ReflectedChallenge => write!(f, "the initiator's CHAP challenge is the target's own"),
            ChapFailure::ShortChallenge => write!(f, "the initiator's CHAP challenge is too short"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChapState {
    /// Waiting for CHAP_A.
    Algorithm,
    /// Challenge sent; waiting for CHAP_N and CHAP_R.
    Response,
    /// The initiator is authenticated.
    Done,
}

/// The target's side of one CHAP exchange.
#[derive(Clone)]
pub struct ChapTarget {
    credential: Credential,
    mutual: Option<Credential>,
    identifier: u8,
    challenge: [u8; CHALLENGE_BYTES],
    state: ChapState,
}

impl fmt::Debug for ChapTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapTarget").field("user", &self.credential.user).field("state", &self.state).finish()
    }
}

fn text(key: &str, value: impl Into<String>) -> (String, String) {
    (key.to_string(), value.into())
}

impl ChapTarget {
    /// An exchange proving `credential`, answering a mutual request with `mutual`;
    /// `identifier` and `challenge` must be fresh random values.
    pub fn new(credential: Credential, mutual: Option<Credential>, identifier: u8, challenge: [u8; CHALLENGE_BYTES]) -> ChapTarget {
        ChapTarget { credential, mutual, identifier, challenge, state: ChapState::Algorithm }
    }

    /// Whether the initiator has proved its secret.
    pub fn done(&self) -> bool {
        self.state == ChapState::Done
    }

    /// Answer the CHAP keys (`CHAP_*`) of one Login Request.
    pub fn offer(&mut self, keys: &[(String, String)]) -> Result<Vec<(String, String)>, ChapFailure> {
        let value = |name: &str| keys.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        if keys.iter().any(|(k, _)| !matches!(k.as_str(), "CHAP_A" | "CHAP_I" | "CHAP_C" | "CHAP_N" | "CHAP_R")) {
            return Err(ChapFailure::OutOfOrder("a CHAP key we do not know"));
        }
        match self.state {
            ChapState::Algorithm => {
                let Some(algorithms) = value("CHAP_A") else {
                    if keys.is_empty() {
                        return Ok(vec![]); // CHAP_A may come in the next request
                    }
                    return Err(ChapFailure::OutOfOrder("a CHAP response before CHAP_A"));
                };
                if keys.len() != 1 {
                    return Err(ChapFailure::OutOfOrder("other CHAP keys with CHAP_A"));
                }
                if !algorithms.split(',').any(|a| a == "5") {
                    return Err(ChapFailure::NoSharedAlgorithm);
                }
                self.state = ChapState::Response;
                Ok(vec![
                    text("CHAP_A", "5"),
                    text("CHAP_I", self.identifier.to_string()),
                    text("CHAP_C", encode_hex(&self.challenge)),
                ])
            }
            ChapState::Response => {
                let (Some(user), Some(response)) = (value("CHAP_N"), value("CHAP_R")) else {
                    return Err(ChapFailure::OutOfOrder("CHAP_N and CHAP_R expected"));
                };
                if value("CHAP_A").is_some() {
                    return Err(ChapFailure::OutOfOrder("CHAP_A again"));
                }
                let response = decode_binary(response, PEER_CHALLENGE_MAX_BYTES).ok_or(ChapFailure::Malformed("CHAP_R"))?;
                let expected = chap_response(self.identifier, &self.credential.secret, &self.challenge);
                // compare both, whatever the first gave, so timing tells nothing
                let user_ok = equal_in_constant_time(user.as_bytes(), self.credential.user.as_bytes());
                let response_ok = equal_in_constant_time(&response, &expected);
                if !user_ok {
                    return Err(ChapFailure::UnknownUser);
                }
                if !response_ok {
                    return Err(ChapFailure::WrongResponse);
                }
                let answers = match (value("CHAP_I"), value("CHAP_C")) {
                    (None, None) => vec![],
                    (Some(identifier), Some(challenge)) => self.answer_mutual(identifier, challenge)?,
                    _ => return Err(ChapFailure::OutOfOrder("mutual CHAP needs both CHAP_I and CHAP_C")),
                };
                self.state = ChapState::Done;
                Ok(answers)
            }
            ChapState::Done => {
                if keys.is_empty() {
                    Ok(vec![])
                } else {
                    Err(ChapFailure::OutOfOrder("CHAP keys after the exchange"))
                }
            }
        }
    }

    /// Our CHAP_N / CHAP_R for the initiator's challenge (mutual CHAP).
    fn answer_mutual(&self, identifier: &str, challenge: &str) -> Result<Vec<(String, String)>, ChapFailure> {
        let Some(mutual) = &self.mutual else {
            return Err(ChapFailure::MutualNotConfigured);
        };
        let identifier = parse_identifier(identifier).ok_or(ChapFailure::Malformed("CHAP_I"))?;
        let challenge = decode_binary(challenge, PEER_CHALLENGE_MAX_BYTES).ok_or(ChapFailure::Malformed("CHAP_C"))?;
        if challenge.len() < PEER_CHALLENGE_MIN_BYTES {
            return Err(ChapFailure::ShortChallenge);
        }
        if challenge == self.challenge {
            return Err(ChapFailure::ReflectedChallenge);
        }
        let response = chap_response(identifier, &mutual.secret, &challenge);
        Ok(vec![text("CHAP_N", mutual.user.clone()), text("CHAP_R", encode_hex(&response))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn find<'a>(answers: &'a [(String, String)], key: &str) -> Option<&'a str> {
        answers.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn alice() -> Credential {
        Credential::new("alice", b"secretpass12").unwrap()
    }

    fn target_side() -> Credential {
        Credential::new("tgt", b"targetsecret34").unwrap()
    }

    const CHALLENGE: [u8; 16] = *b"0123456789abcdef";

    #[test]
    fn md5_known_answers() {
        // RFC 1321 test suite, through the CHAP layout (id ‖ secret ‖ challenge)
        assert_eq!(encode_hex(&chap_response(b'a', b"", b"")), "0x0cc175b9c0f1b6a831c399e269772661");
        assert_eq!(encode_hex(&chap_response(b'a', b"b", b"c")), "0x900150983cd24fb0d6963f7d28e17f72");
        // a CHAP exchange computed independently (python3: hashlib.md5(bytes([1]) +
        // b"secretpass12" + bytes(range(16))).hexdigest())
        let challenge: Vec<u8> = (0u8..16).collect();
        assert_eq!(encode_hex(&chap_response(1, b"secretpass12", &challenge)), "0xf89dc4f43e7eec6f6002503448204022");
    }

    #[test]
    fn binary_values_decode_in_hex_and_base64_and_bounded() {
        assert_eq!(decode_binary("0x0102ff", 16), Some(vec![1, 2, 255]));
        assert_eq!(decode_binary("0X102", 16), Some(vec![1, 2]));
        assert_eq!(decode_binary("0bAQL/", 16), Some(vec![1, 2, 255]));
        assert_eq!(decode_binary("0bAQI=", 16), Some(vec![1, 2]));
        assert_eq!(decode_binary("0bAQ==", 16), Some(vec![1]));
        assert_eq!(decode_binary("0bAQ", 16), Some(vec![1]));
        for bad in ["", "0", "0x", "0b", "0xzz", "12", "0bA", "0b@@@@", "0bAQ=", "0bA===", "x0ab", "0x\u{e9}\u{e9}", "0\u{e9}"] {
            assert_eq!(decode_binary(bad, 16), None, "{bad:?}");
        }
        assert_eq!(decode_binary(&format!("0x{}", "ab".repeat(17)), 16), None);
        assert_eq!(decode_binary(&format!("0x{}", "ab".repeat(16)), 16).map(|v| v.len()), Some(16));
        assert_eq!(decode_binary(&format!("0x{}", "a".repeat(1 << 20)), 1024), None);
        assert_eq!(parse_identifier("255"), Some(255));
        assert_eq!(parse_identifier("0x1f"), Some(31));
        for bad in ["256", "-1", "", "0x", "1e3", "0x100"] {
            assert_eq!(parse_identifier(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn one_way_chap_accepts_the_right_response_only() {
        let mut t = ChapTarget::new(alice(), None, 7, CHALLENGE);
        assert_eq!(t.offer(&[]).unwrap(), vec![]);
        let a = t.offer(&keys(&[("CHAP_A", "7,5")])).unwrap();
        assert_eq!(find(&a, "CHAP_A"), Some("5"));
        assert_eq!(find(&a, "CHAP_I"), Some("7"));
        assert_eq!(find(&a, "CHAP_C"), Some(&*encode_hex(&CHALLENGE)));
        let right = encode_hex(&chap_response(7, b"secretpass12", &CHALLENGE));
        let mut wrong_user = t.clone();
        assert_eq!(wrong_user.offer(&keys(&[("CHAP_N", "bob"), ("CHAP_R", &right)])), Err(ChapFailure::UnknownUser));
        let mut wrong_secret = t.clone();
        let wrong = encode_hex(&chap_response(7, b"secretpass13", &CHALLENGE));
        assert_eq!(wrong_secret.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &wrong)])), Err(ChapFailure::WrongResponse));
        let mut wrong_id = t.clone();
        let other_id = encode_hex(&chap_response(8, b"secretpass12", &CHALLENGE));
        assert_eq!(wrong_id.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &other_id)])), Err(ChapFailure::WrongResponse));
        let mut garbage = t.clone();
        assert_eq!(garbage.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", "0xnothex")])), Err(ChapFailure::Malformed("CHAP_R")));
        let mut short = t.clone();
        assert_eq!(short.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &right[..20])])), Err(ChapFailure::WrongResponse));
        assert!(!t.done());
        // base64 is as good as hex
        let base64 = {
            let r = chap_response(7, b"secretpass12", &CHALLENGE);
            let mut b = t.clone();
            let mut out = String::from("0b");
            const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            for chunk in r.chunks(3) {
                let n = chunk.iter().fold(0u32, |acc, &x| acc << 8 | u32::from(x)) << (8 * (3 - chunk.len()));
                for i in 0..=chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                }
            }
            b.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &out)])).map(|_| b.done())
        };
        assert_eq!(base64, Ok(true));
        assert_eq!(t.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &right)])).unwrap(), vec![]);
        assert!(t.done());
        assert!(t.offer(&keys(&[("CHAP_A", "5")])).is_err());
    }

    #[test]
    fn out_of_order_and_unknown_algorithms_fail() {
        let mut t = ChapTarget::new(alice(), None, 1, CHALLENGE);
        assert_eq!(t.clone().offer(&keys(&[("CHAP_A", "6,7")])), Err(ChapFailure::NoSharedAlgorithm));
        assert!(matches!(t.clone().offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", "0x00")])), Err(ChapFailure::OutOfOrder(_))));
        assert!(matches!(t.clone().offer(&keys(&[("CHAP_X", "1")])), Err(ChapFailure::OutOfOrder(_))));
        t.offer(&keys(&[("CHAP_A", "5")])).unwrap();
        assert!(matches!(t.clone().offer(&[]), Err(ChapFailure::OutOfOrder(_))));
        assert!(matches!(t.offer(&keys(&[("CHAP_N", "alice")])), Err(ChapFailure::OutOfOrder(_))));
    }

    #[test]
    fn mutual_chap_answers_with_the_target_secret_and_refuses_reflection() {
        let mut t = ChapTarget::new(alice(), Some(target_side()), 3, CHALLENGE);
        t.offer(&keys(&[("CHAP_A", "5")])).unwrap();
        let right = encode_hex(&chap_response(3, b"secretpass12", &CHALLENGE));
        let theirs: Vec<u8> = (100u8..120).collect();
        let reply = |t: &mut ChapTarget, id: &str, c: &str| t.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &right), ("CHAP_I", id), ("CHAP_C", c)]));
        assert_eq!(reply(&mut t.clone(), "9", &encode_hex(&CHALLENGE)), Err(ChapFailure::ReflectedChallenge));
        assert_eq!(reply(&mut t.clone(), "9", &encode_hex(&theirs[..8])), Err(ChapFailure::ShortChallenge));
        assert_eq!(reply(&mut t.clone(), "9", "0x"), Err(ChapFailure::Malformed("CHAP_C")));
        assert_eq!(reply(&mut t.clone(), "300", &encode_hex(&theirs)), Err(ChapFailure::Malformed("CHAP_I")));
        let mut only_c = t.clone();
        assert!(matches!(
            only_c.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &right), ("CHAP_C", &encode_hex(&theirs))])),
            Err(ChapFailure::OutOfOrder(_))
        ));
        let a = reply(&mut t, "9", &encode_hex(&theirs)).unwrap();
        assert_eq!(find(&a, "CHAP_N"), Some("tgt"));
        assert_eq!(find(&a, "CHAP_R"), Some(&*encode_hex(&chap_response(9, b"targetsecret34", &theirs))));
        assert!(t.done());
        // no mutual secret: an initiator asking for it is refused
        let mut one_way = ChapTarget::new(alice(), None, 3, CHALLENGE);
        one_way.offer(&keys(&[("CHAP_A", "5")])).unwrap();
        assert_eq!(reply(&mut one_way, "9", &encode_hex(&theirs)), Err(ChapFailure::MutualNotConfigured));
    }

    #[test]
    fn credentials_and_entries_are_checked_and_secrets_never_shown() {
        assert!(Credential::new("u", b"short").is_err());
        assert!(Credential::new("u", &[b'x'; 256]).is_err());
        assert!(Credential::new("", b"secretpass12").is_err());
        assert!(Credential::new("u", b"secret\0pass12").is_err());
        let c = Credential::new("u", b"secretpass12").unwrap();
        assert!(!format!("{c:?}").contains("secretpass12"));
        let err = Credential::new("u", b"tiny").unwrap_err();
        assert!(!err.contains("tiny"));
        let mut entry = TargetAuth { chap: None, mutual: Some(target_side()), initiators: vec![] };
        assert!(entry.validate().is_err());
        entry.chap = Some(Credential::new("alice", b"targetsecret34").unwrap());
        assert!(entry.validate().is_err(), "same secret both ways");
        entry.chap = Some(alice());
        assert!(entry.validate().is_ok());
        assert_eq!(entry.kind(), "mutual");
        entry.initiators = vec!["not a name".into()];
        assert!(entry.validate().is_err());
        entry.initiators = vec!["iqn.2026-11.org.example:host1".into()];
        assert!(entry.allows("IQN.2026-11.org.example:HOST1"));
        assert!(!entry.allows("iqn.2026-11.org.example:host2"));
        assert!(TargetAuth::default().allows("anything"));
    }

    #[test]
    fn the_store_falls_back_to_the_default_entry() {
        let mut store = AuthStore::default();
        let chap = TargetAuth { chap: Some(alice()), ..Default::default() };
        store.set_target("iqn.2026-11.io.zilla:tank.vol", chap.clone()).unwrap();
        assert_eq!(store.entry("IQN.2026-11.io.zilla:TANK.VOL").kind(), "chap");
        assert_eq!(store.entry("iqn.2026-11.io.zilla:tank.other").kind(), "none");
        store.set_default(chap).unwrap();
        assert_eq!(store.entry("iqn.2026-11.io.zilla:tank.other").kind(), "chap");
        store.set_target("iqn.2026-11.io.zilla:tank.vol", TargetAuth::default()).unwrap();
        assert!(store.own_entry("iqn.2026-11.io.zilla:tank.vol").is_none());
        assert!(store.set_target("tank/vol", TargetAuth::default()).is_err());
    }
}
