//! login: the login phase's key negotiation (RFC 7143 §6, §13), pure.
//!
//! Theory of operation
//! -------------------
//! The connection's reader feeds each Login Request's keys to [`Negotiation::offer`],
//! which answers every key the initiator sent (a value, `Irrelevant`, `Reject` or
//! `NotUnderstood`) and updates the [`SessionParams`] the full-feature phase will use.
//! Each key is negotiated by its RFC rule: lists pick the first value of the
//! initiator's list we support (digests, AuthMethod), "OR"/"AND" booleans combine
//! with our wish, numbers take the minimum (maximum for DefaultTime2Wait) of theirs
//! and ours. MaxRecvDataSegmentLength is declarative: the initiator's value bounds
//! the PDUs we send, and we declare ours once, unasked. Security: the connection
//! hands the security stage's keys (AuthMethod, CHAP_*) to [`crate::security`];
//! what reaches [`Negotiation::offer`] of them in stage 0 is answered as for a
//! target without authentication (AuthMethod=None).
//!
//! Our values are the target's limits ([`crate::IscsiConfig`]).
//!
//! What the initiator gets wrong (RFC 7143 §6.2, §13):
//!
//! ```text
//!   a key declared again in the same login ───────────> refused, initiator error (2/0)
//!     (InitiatorName, InitiatorAlias, TargetName, SessionType may be repeated with
//!      the value they were first declared with: some initiators send them again in
//!      the operational stage)
//!   an identity key (InitiatorName, TargetName,
//!     SessionType) in a later request that differs
//!     from what the first request settled ────────────> refused, initiator error
//!   MaxRecvDataSegmentLength not a number in
//!     512..2^24-1 (declarative: nothing to answer) ───> refused, initiator error
//!   a negotiated numeric key not a number in its
//!     range (§6.2.2: "MAY be answered with Reject") ──> answered Reject, default kept
//!   FirstBurstLength offered above MaxBurstLength ───> refused, initiator error
//! ```
//!
//! The identity keys are settled by the first request (the connection runs the
//! target's checks, initiator list and authentication, on them then), so no later
//! request can make the session run under another name than the one checked. Numbers
//! are decimal or `0x` hexadecimal constants, nothing else (no sign, no spaces).
//! The keys a login declares are kept for the duplicate check, at most
//! `DECLARED_TEXT_MAX_BYTES` of them.

use std::collections::BTreeMap;

use crate::IscsiConfig;

/// Keys a later request of the login may repeat with the value first declared.
const REPEATABLE_KEYS: [&str; 4] = ["InitiatorName", "InitiatorAlias", "TargetName", "SessionType"];

/// Bytes of text (`key=value` plus its NUL) one login may declare over all its requests.
pub const DECLARED_TEXT_MAX_BYTES: usize = 64 << 10;

/// Values the full-feature phase of a session uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub header_digest: bool,
    pub data_digest: bool,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    /// Largest data segment the initiator receives (bounds our Data-In, Text).
    pub initiator_max_recv_data_segment_bytes: usize,
    /// Largest data segment we receive (declared by us).
    pub target_max_recv_data_segment_bytes: usize,
    pub max_burst_bytes: usize,
    pub first_burst_bytes: usize,
    pub max_outstanding_r2t: u32,
    pub default_time2wait_s: u32,
    pub default_time2retain_s: u32,
}

impl SessionParams {
    /// The RFC defaults before negotiation, with our receive limit.
    pub fn defaults(config: &IscsiConfig) -> SessionParams {
        SessionParams {
            header_digest: false,
            data_digest: false,
            initial_r2t: true,
            immediate_data: true,
            initiator_max_recv_data_segment_bytes: 8192,
            target_max_recv_data_segment_bytes: config.max_recv_data_segment_bytes,
            max_burst_bytes: 262_144.min(config.max_burst_bytes),
            first_burst_bytes: 65_536.min(config.first_burst_bytes),
            max_outstanding_r2t: 1,
            default_time2wait_s: 2,
            default_time2retain_s: 0,
        }
    }
}

/// Discovery (SendTargets only) or a normal session to one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionType {
    Discovery,
    Normal,
}

/// The state of one connection's login.
#[derive(Debug, Clone)]
pub struct Negotiation {
    pub params: SessionParams,
    pub initiator_name: Option<String>,
    pub target_name: Option<String>,
    pub session_type: SessionType,
    declared_receive_limit: bool,
    config: IscsiConfig,
    /// Every key the login declared and its first value.
    declared: BTreeMap<String, String>,
    /// Bytes of `declared`, as text.
    declared_bytes: usize,
    /// The first request has been taken: the identity keys are settled.
    identity_settled: bool,
    /// The initiator's offers, checked against each other (FirstBurstLength <= MaxBurstLength).
    offered_max_burst_bytes: Option<u64>,
    offered_first_burst_bytes: Option<u64>,
}

/// Why a login cannot go on (answered with a Login Response status, then closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginRefusal {
    /// Status class 2 detail 1: no authentication method we share.
    Authentication,
    /// 2/7: a required key (InitiatorName, TargetName) is missing.
    MissingParameter(&'static str),
    /// 2/0: anything else the initiator got wrong.
    InitiatorError(String),
}

impl LoginRefusal {
    /// (status class, status detail)
    pub fn status(&self) -> (u8, u8) {
        match self {
            LoginRefusal::Authentication => (2, 1),
            LoginRefusal::MissingParameter(_) => (2, 7),
            LoginRefusal::InitiatorError(_) => (2, 0),
        }
    }
}

/// A numerical value (RFC 7143 §6.1): a decimal constant or `0x`/`0X` and hex digits.
fn parse_number(value: &str) -> Option<u64> {
    let (digits, radix) = match value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (value, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// The RFC 7143 §13 range of each numeric key.
fn numeric_range(key: &str) -> Option<(u64, u64)> {
    const LENGTH: (u64, u64) = (512, (1 << 24) - 1);
    Some(match key {
        "MaxRecvDataSegmentLength" | "MaxBurstLength" | "FirstBurstLength" => LENGTH,
        "DefaultTime2Wait" | "DefaultTime2Retain" => (0, 3600),
        "MaxOutstandingR2T" | "MaxConnections" => (1, 65_535),
        "ErrorRecoveryLevel" => (0, 2),
        _ => return None,
    })
}

/// Untrusted text for a log line: at most 64 characters, the unprintable ones as `?`.
fn printable(text: &str) -> String {
    text.chars().take(64).map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect()
}

fn initiator_error(why: String) -> LoginRefusal {
    LoginRefusal::InitiatorError(why)
}

fn yes_no(value: &str) -> Option<bool> {
    match value {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn word(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

fn session_type_word(session_type: SessionType) -> &'static str {
    match session_type {
        SessionType::Discovery => "Discovery",
        SessionType::Normal => "Normal",
    }
}

impl Negotiation {
    pub fn new(config: &IscsiConfig) -> Negotiation {
        Negotiation {
            params: SessionParams::defaults(config),
            initiator_name: None,
            target_name: None,
            session_type: SessionType::Normal,
            declared_receive_limit: false,
            config: config.clone(),
            declared: BTreeMap::new(),
            declared_bytes: 0,
            identity_settled: false,
            offered_max_burst_bytes: None,
            offered_first_burst_bytes: None,
        }
    }

    /// Note every key of one Login Request (the security stage's too) as declared,
    /// before any is answered: a key this login declared before refuses it, unless it
    /// is one of `REPEATABLE_KEYS` with its first value (RFC 7143 §6.2); so do keys
    /// beyond `DECLARED_TEXT_MAX_BYTES` in all.
    pub fn declare(&mut self, keys: &[(String, String)]) -> Result<(), LoginRefusal> {
        for (key, value) in keys {
            if key.is_empty() {
                return Err(initiator_error(format!("text '{}' is not key=value", printable(value))));
            }
            match self.declared.get(key) {
                Some(first) if first == value && REPEATABLE_KEYS.contains(&key.as_str()) => continue,
                Some(_) => return Err(initiator_error(format!("key {} declared twice in one login", printable(key)))),
                None => {}
            }
            self.declared_bytes += key.len() + value.len() + 2;
            if self.declared_bytes > DECLARED_TEXT_MAX_BYTES {
                return Err(initiator_error(format!("login keys beyond {DECLARED_TEXT_MAX_BYTES} bytes")));
            }
            self.declared.insert(key.clone(), value.clone());
        }
        Ok(())
    }

    /// Answer the keys of one Login Request in stage `stage` (0 security, 1
    /// operational); `leaving_for_full_feature`: the initiator asks to go to the
    /// full-feature phase with this PDU (we then declare our receive limit if not yet).
    /// The first call settles the identity keys. Call [`Negotiation::declare`] with the
    /// request's keys first.
    pub fn offer(
        &mut self,
        keys: &[(String, String)],
        stage: u8,
        leaving_for_full_feature: bool,
    ) -> Result<Vec<(String, String)>, LoginRefusal> {
        let mut answers = Vec::new();
        for (key, value) in keys {
            if key.is_empty() {
                return Err(initiator_error(format!("text '{}' is not key=value", printable(value))));
            }
            if let Some(answer) = self.answer(key, value, stage)? {
                answers.push((key.clone(), answer));
            }
        }
        self.identity_settled = true;
        if let (Some(first), Some(max)) = (self.offered_first_burst_bytes, self.offered_max_burst_bytes) {
            if first > max {
                return Err(initiator_error(format!("FirstBurstLength {first} above MaxBurstLength {max}")));
            }
        }
        if (stage == 1 || leaving_for_full_feature) && !self.declared_receive_limit {
            self.declared_receive_limit = true;
            answers.push(("MaxRecvDataSegmentLength".into(), self.params.target_max_recv_data_segment_bytes.to_string()));
        }
        Ok(answers)
    }

    /// The answer to one key (`None`: declarative, nothing to answer).
    fn answer(&mut self, key: &str, value: &str, stage: u8) -> Result<Option<String>, LoginRefusal> {
        let answer = match key {
            "InitiatorName" | "TargetName" | "SessionType" => return self.identity(key, value),
            "InitiatorAlias" => return Ok(None),
            "AuthMethod" => {
                if stage != 0 {
                    "Irrelevant".to_string()
                } else if value.split(',').any(|m| m == "None") {
                    "None".to_string()
                } else {
                    return Err(LoginRefusal::Authentication);
                }
            }
            _ => return self.answer_operational(key, value),
        };
        Ok(Some(answer))
    }

    /// An identity key: taken from the first request; a later request may only repeat
    /// what the first settled (the target checked the initiator and target on that).
    /// An unknown SessionType in the first request is answered `Reject` (Normal stays).
    fn identity(&mut self, key: &str, value: &str) -> Result<Option<String>, LoginRefusal> {
        if self.identity_settled {
            let same = match key {
                "InitiatorName" => self.initiator_name.as_deref() == Some(value),
                "TargetName" => self.target_name.as_deref() == Some(value),
                _ => session_type_word(self.session_type) == value,
            };
            if !same {
                return Err(initiator_error(format!("{key} after the first login request differs from the first")));
            }
            return Ok(None);
        }
        match (key, value) {
            ("InitiatorName", _) => self.initiator_name = Some(value.to_string()),
            ("TargetName", _) => self.target_name = Some(value.to_string()),
            (_, "Discovery") => self.session_type = SessionType::Discovery,
            (_, "Normal") => self.session_type = SessionType::Normal,
            _ => return Ok(Some("Reject".to_string())),
        }
        Ok(None)
    }

    /// The answer to an operational key (`None`: declarative).
    fn answer_operational(&mut self, key: &str, value: &str) -> Result<Option<String>, LoginRefusal> {
        let p = &mut self.params;
        let answer = match key {
            "HeaderDigest" | "DataDigest" => {
                let chosen = value.split(',').find(|v| *v == "None" || *v == "CRC32C");
                match chosen {
                    Some(v) => {
                        let on = v == "CRC32C";
                        if key == "HeaderDigest" {
                            p.header_digest = on;
                        } else {
                            p.data_digest = on;
                        }
                        v.to_string()
                    }
                    None => "Reject".to_string(),
                }
            }
            // OR: Yes if either side wants it; we do not.
            "InitialR2T" => match yes_no(value) {
                Some(theirs) => {
                    p.initial_r2t = theirs;
                    word(theirs)
                }
                None => "Reject".to_string(),
            },
            // AND: we want it.
            "ImmediateData" => match yes_no(value) {
                Some(theirs) => {
                    p.immediate_data = theirs;
                    word(theirs)
                }
                None => "Reject".to_string(),
            },
            // OR: we want both in order, so the answer is Yes whatever they said.
            "DataPDUInOrder" | "DataSequenceInOrder" => match yes_no(value) {
                Some(_) => "Yes".to_string(),
                None => "Reject".to_string(),
            },
            "IFMarker" | "OFMarker" => "No".to_string(),
            "OFMarkInt" | "IFMarkInt" => "Irrelevant".to_string(),
            "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => "Irrelevant".to_string(),
            _ => return self.answer_numeric(key, value),
        };
        Ok(Some(answer))
    }

    /// The answer to a numeric operational key (`None`: declarative; `NotUnderstood`
    /// for a key we do not know). Out of its range: `Reject` (the key keeps its
    /// default), except for the declarative MaxRecvDataSegmentLength, which has no
    /// answer and bounds what we send: the login is refused.
    fn answer_numeric(&mut self, key: &str, value: &str) -> Result<Option<String>, LoginRefusal> {
        let Some((min, max)) = numeric_range(key) else {
            return Ok(Some("NotUnderstood".to_string()));
        };
        let Some(n) = parse_number(value).filter(|n| (min..=max).contains(n)) else {
            if key == "MaxRecvDataSegmentLength" {
                return Err(initiator_error(format!("{key} '{}' is not a number in {min}..={max}", printable(value))));
            }
            return Ok(Some("Reject".to_string()));
        };
        let p = &mut self.params;
        let answer = match key {
            "MaxRecvDataSegmentLength" => {
                p.initiator_max_recv_data_segment_bytes = n as usize;
                return Ok(None);
            }
            "MaxBurstLength" => {
                self.offered_max_burst_bytes = Some(n);
                p.max_burst_bytes = (n as usize).min(self.config.max_burst_bytes);
                p.first_burst_bytes = p.first_burst_bytes.min(p.max_burst_bytes);
                p.max_burst_bytes
            }
            "FirstBurstLength" => {
                self.offered_first_burst_bytes = Some(n);
                p.first_burst_bytes = (n as usize).min(self.config.first_burst_bytes).min(p.max_burst_bytes);
                p.first_burst_bytes
            }
            "DefaultTime2Wait" => {
                p.default_time2wait_s = (n as u32).max(2);
                p.default_time2wait_s as usize
            }
            "DefaultTime2Retain" => {
                p.default_time2retain_s = 0;
                0
            }
            "MaxOutstandingR2T" => {
                p.max_outstanding_r2t = 1;
                1
            }
            // MaxConnections: one per session; ErrorRecoveryLevel: 0
            "MaxConnections" => 1,
            _ => 0,
        };
        Ok(Some(answer.to_string()))
    }

    /// Check what a session type requires before leaving the security stage.
    pub fn check_required(&self) -> Result<(), LoginRefusal> {
        if self.initiator_name.is_none() {
            return Err(LoginRefusal::MissingParameter("InitiatorName"));
        }
        if self.session_type == SessionType::Normal && self.target_name.is_none() {
            return Err(LoginRefusal::MissingParameter("TargetName"));
        }
        Ok(())
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

    #[test]
    fn security_stage_accepts_none_only() {
        let mut n = Negotiation::new(&IscsiConfig::default());
        let a = n.offer(&keys(&[("InitiatorName", "iqn.i"), ("AuthMethod", "CHAP,None"), ("TargetName", "iqn.t")]), 0, false).unwrap();
        assert_eq!(find(&a, "AuthMethod"), Some("None"));
        assert_eq!(n.target_name.as_deref(), Some("iqn.t"));
        assert!(n.check_required().is_ok());
        let mut n = Negotiation::new(&IscsiConfig::default());
        assert_eq!(n.offer(&keys(&[("AuthMethod", "CHAP")]), 0, false), Err(LoginRefusal::Authentication));
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.offer(&keys(&[("InitiatorName", "iqn.i")]), 0, false).unwrap();
        assert_eq!(n.check_required(), Err(LoginRefusal::MissingParameter("TargetName")));
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.offer(&keys(&[("InitiatorName", "iqn.i"), ("SessionType", "Discovery")]), 0, false).unwrap();
        assert!(n.check_required().is_ok());
    }

    #[test]
    fn operational_keys_follow_their_rules() {
        let config = IscsiConfig::default();
        let mut n = Negotiation::new(&config);
        let a = n
            .offer(
                &keys(&[
                    ("HeaderDigest", "CRC32C,None"),
                    ("DataDigest", "None"),
                    ("InitialR2T", "No"),
                    ("ImmediateData", "Yes"),
                    ("MaxRecvDataSegmentLength", "65536"),
                    ("MaxBurstLength", "16777215"),
                    ("FirstBurstLength", "1048576"),
                    ("DefaultTime2Wait", "0"),
                    ("DefaultTime2Retain", "20"),
                    ("MaxOutstandingR2T", "8"),
                    ("ErrorRecoveryLevel", "2"),
                    ("DataPDUInOrder", "No"),
                    ("X-com.example.thing", "1"),
                    ("MaxConnections", "4"),
                ]),
                1,
                false,
            )
            .unwrap();
        assert_eq!(find(&a, "HeaderDigest"), Some("CRC32C"));
        assert_eq!(find(&a, "DataDigest"), Some("None"));
        assert_eq!(find(&a, "InitialR2T"), Some("No"));
        assert_eq!(find(&a, "MaxBurstLength"), Some(&*config.max_burst_bytes.min(16_777_215).to_string()));
        assert_eq!(n.params.max_burst_bytes, config.max_burst_bytes.min(16_777_215));
        assert_eq!(n.params.first_burst_bytes, config.first_burst_bytes.min(1_048_576));
        assert_eq!(find(&a, "DefaultTime2Wait"), Some("2"));
        assert_eq!(find(&a, "DefaultTime2Retain"), Some("0"));
        assert_eq!(find(&a, "MaxOutstandingR2T"), Some("1"));
        assert_eq!(find(&a, "ErrorRecoveryLevel"), Some("0"));
        assert_eq!(find(&a, "DataPDUInOrder"), Some("Yes"));
        assert_eq!(find(&a, "X-com.example.thing"), Some("NotUnderstood"));
        assert_eq!(find(&a, "MaxConnections"), Some("1"));
        assert_eq!(find(&a, "MaxRecvDataSegmentLength"), Some(&*config.max_recv_data_segment_bytes.to_string()));
        assert_eq!(n.params.initiator_max_recv_data_segment_bytes, 65_536);
        assert!(n.params.header_digest && !n.params.data_digest);
        assert!(!n.params.initial_r2t && n.params.immediate_data);
        // declared once only
        let again = n.offer(&keys(&[("ImmediateData", "No")]), 1, true).unwrap();
        assert_eq!(find(&again, "MaxRecvDataSegmentLength"), None);
        assert!(!n.params.immediate_data);
    }

    #[test]
    fn bad_values_are_rejected_and_defaults_kept() {
        let mut n = Negotiation::new(&IscsiConfig::default());
        let a = n
            .offer(
                &keys(&[
                    ("InitialR2T", "maybe"),
                    ("HeaderDigest", "MD5"),
                    ("MaxBurstLength", "100"),
                    ("FirstBurstLength", "+4096"),
                    ("DefaultTime2Wait", "3601"),
                    ("DefaultTime2Retain", "0x"),
                    ("MaxOutstandingR2T", "0"),
                    ("MaxConnections", "65536"),
                    ("ErrorRecoveryLevel", "3"),
                ]),
                1,
                false,
            )
            .unwrap();
        for key in ["InitialR2T", "HeaderDigest", "MaxBurstLength", "FirstBurstLength", "DefaultTime2Wait"] {
            assert_eq!(find(&a, key), Some("Reject"), "{key}");
        }
        for key in ["DefaultTime2Retain", "MaxOutstandingR2T", "MaxConnections", "ErrorRecoveryLevel"] {
            assert_eq!(find(&a, key), Some("Reject"), "{key}");
        }
        let defaults = SessionParams::defaults(&IscsiConfig::default());
        assert_eq!(n.params, defaults);
        assert!(n.offer(&keys(&[("", "junk")]), 1, false).is_err());
    }

    #[test]
    fn numbers_are_decimal_or_hex_constants_only() {
        assert_eq!(parse_number("512"), Some(512));
        assert_eq!(parse_number("0x200"), Some(512));
        assert_eq!(parse_number("0X2aB"), Some(0x2ab));
        for bad in ["", "+512", "-1", " 512", "512 ", "0x", "0x+1", "1e3", "0b1", "99999999999999999999999"] {
            assert_eq!(parse_number(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_receive_limit_out_of_range_or_not_a_number_refuses_the_login() {
        for bad in ["12", "511", "16777216", "abc", "", "0x1000000"] {
            let mut n = Negotiation::new(&IscsiConfig::default());
            let refused = n.offer(&keys(&[("MaxRecvDataSegmentLength", bad)]), 1, false);
            assert!(matches!(refused, Err(LoginRefusal::InitiatorError(_))), "{bad:?}: {refused:?}");
            assert_eq!(refused.unwrap_err().status(), (2, 0));
        }
        for good in ["512", "16777215", "0x200"] {
            let mut n = Negotiation::new(&IscsiConfig::default());
            n.offer(&keys(&[("MaxRecvDataSegmentLength", good)]), 1, false).unwrap();
            assert_eq!(n.params.initiator_max_recv_data_segment_bytes as u64, parse_number(good).unwrap());
        }
    }

    #[test]
    fn a_first_burst_above_the_max_burst_refuses_the_login_in_any_order() {
        let mut n = Negotiation::new(&IscsiConfig::default());
        let refused = n.offer(&keys(&[("FirstBurstLength", "262144"), ("MaxBurstLength", "65536")]), 1, false);
        assert_eq!(refused.unwrap_err().status(), (2, 0));
        // over two requests
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.offer(&keys(&[("MaxBurstLength", "65536")]), 1, false).unwrap();
        assert!(n.offer(&keys(&[("FirstBurstLength", "65537")]), 1, false).is_err());
        let mut n = Negotiation::new(&IscsiConfig::default());
        let a = n.offer(&keys(&[("FirstBurstLength", "65536"), ("MaxBurstLength", "65536")]), 1, false).unwrap();
        assert_eq!((find(&a, "FirstBurstLength"), find(&a, "MaxBurstLength")), (Some("65536"), Some("65536")));
    }

    #[test]
    fn a_key_declared_twice_refuses_the_login() {
        let first = keys(&[("InitiatorName", "iqn.2026-11.org.good:h1"), ("TargetName", "iqn.t"), ("AuthMethod", "None")]);
        // in one request
        let mut n = Negotiation::new(&IscsiConfig::default());
        let twice = keys(&[("InitiatorName", "iqn.2026-11.org.good:h1"), ("InitiatorName", "iqn.2026-11.org.evil:h9")]);
        assert_eq!(n.declare(&twice).unwrap_err().status(), (2, 0));
        // in a later request, another value
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.declare(&first).unwrap();
        n.offer(&first, 0, false).unwrap();
        let evil = keys(&[("InitiatorName", "iqn.2026-11.org.evil:h9"), ("HeaderDigest", "None")]);
        assert_eq!(n.declare(&evil).unwrap_err().status(), (2, 0));
        // an operational or security key again, even with the same value
        for again in [("HeaderDigest", "None"), ("AuthMethod", "None"), ("X-com.example.k", "1")] {
            let mut n = Negotiation::new(&IscsiConfig::default());
            n.declare(&first).unwrap();
            n.declare(&keys(&[("HeaderDigest", "None"), ("X-com.example.k", "1")])).unwrap();
            assert!(n.declare(&keys(&[again])).is_err(), "{again:?}");
        }
        // the identity keys again with their first values: taken (libiscsi does this)
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.declare(&first).unwrap();
        n.offer(&first[..2], 0, false).unwrap();
        let same = keys(&[("InitiatorName", "iqn.2026-11.org.good:h1"), ("TargetName", "iqn.t"), ("SessionType", "Normal"), ("InitiatorAlias", "h1")]);
        n.declare(&same).unwrap();
        n.offer(&same, 1, true).unwrap();
        n.declare(&same).unwrap();
        assert_eq!(n.initiator_name.as_deref(), Some("iqn.2026-11.org.good:h1"));
    }

    #[test]
    fn a_later_request_cannot_change_the_identity_the_first_settled() {
        let first = keys(&[("InitiatorName", "iqn.i"), ("TargetName", "iqn.t")]);
        // SessionType first declared in a later request: only the settled one is taken
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.offer(&first, 0, false).unwrap();
        assert!(n.offer(&keys(&[("SessionType", "Discovery")]), 1, true).is_err());
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.offer(&first, 0, false).unwrap();
        n.offer(&keys(&[("SessionType", "Normal")]), 1, true).unwrap();
        assert_eq!(n.session_type, SessionType::Normal);
        // a discovery session cannot name a target afterwards
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.offer(&keys(&[("InitiatorName", "iqn.i"), ("SessionType", "Discovery")]), 0, false).unwrap();
        assert!(n.offer(&keys(&[("TargetName", "iqn.t")]), 1, true).is_err());
        // nor can the names change (offer alone, without declare)
        let mut n = Negotiation::new(&IscsiConfig::default());
        n.offer(&first, 0, false).unwrap();
        assert!(n.offer(&keys(&[("InitiatorName", "iqn.evil")]), 1, true).is_err());
        assert_eq!(n.initiator_name.as_deref(), Some("iqn.i"));
    }

    #[test]
    fn the_declared_keys_are_bounded() {
        let mut n = Negotiation::new(&IscsiConfig::default());
        let batch: Vec<(String, String)> = (0..1000).map(|i| (format!("X-k{i}"), "v".repeat(20))).collect();
        n.declare(&batch).unwrap();
        let more: Vec<(String, String)> = (1000..3000).map(|i| (format!("X-k{i}"), "v".repeat(20))).collect();
        assert!(n.declare(&more).is_err());
        assert!(n.declared_bytes <= DECLARED_TEXT_MAX_BYTES + 64);
    }
}
