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
//! Our values are the target's limits ([`crate::IscsiConfig`]); a value out of its
//! RFC range is answered `Reject` and the default kept.

use crate::IscsiConfig;

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

fn parse_number(value: &str) -> Option<u64> {
    if let Some(hex) = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else {
        value.parse().ok()
    }
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

impl Negotiation {
    pub fn new(config: &IscsiConfig) -> Negotiation {
        Negotiation {
            params: SessionParams::defaults(config),
            initiator_name: None,
            target_name: None,
            session_type: SessionType::Normal,
            declared_receive_limit: false,
            config: config.clone(),
        }
    }

    /// Answer the keys of one Login Request in stage `stage` (0 security, 1
    /// operational); `leaving_for_full_feature`: the initiator asks to go to the
    /// full-feature phase with this PDU (we then declare our receive limit if not yet).
    pub fn offer(
        &mut self,
        keys: &[(String, String)],
        stage: u8,
        leaving_for_full_feature: bool,
    ) -> Result<Vec<(String, String)>, LoginRefusal> {
        let mut answers = Vec::new();
        for (key, value) in keys {
            if key.is_empty() {
                return Err(LoginRefusal::InitiatorError(format!("text '{value}' is not key=value")));
            }
            if let Some(answer) = self.answer(key, value, stage)? {
                answers.push((key.clone(), answer));
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
            "InitiatorName" => {
                self.initiator_name = Some(value.to_string());
                return Ok(None);
            }
            "InitiatorAlias" => return Ok(None),
            "TargetName" => {
                self.target_name = Some(value.to_string());
                return Ok(None);
            }
            "SessionType" => match value {
                "Discovery" => {
                    self.session_type = SessionType::Discovery;
                    return Ok(None);
                }
                "Normal" => {
                    self.session_type = SessionType::Normal;
                    return Ok(None);
                }
                _ => "Reject".to_string(),
            },
            "AuthMethod" => {
                if stage != 0 {
                    "Irrelevant".to_string()
                } else if value.split(',').any(|m| m == "None") {
                    "None".to_string()
                } else {
                    return Err(LoginRefusal::Authentication);
                }
            }
            _ => return Ok(self.answer_operational(key, value)),
        };
        Ok(Some(answer))
    }

    /// The answer to an operational key (`None`: declarative).
    fn answer_operational(&mut self, key: &str, value: &str) -> Option<String> {
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
        Some(answer)
    }

    /// The answer to a numeric operational key (`None`: declarative).
    fn answer_numeric(&mut self, key: &str, value: &str) -> Option<String> {
        let p = &mut self.params;
        let numeric = |min: u64, max: u64| parse_number(value).filter(|n| (min..=max).contains(n));
        let answer = match key {
            "MaxConnections" => match numeric(1, 65_535) {
                Some(_) => "1".to_string(),
                None => "Reject".to_string(),
            },
            "MaxRecvDataSegmentLength" => {
                if let Some(n) = numeric(512, (1 << 24) - 1) {
                    p.initiator_max_recv_data_segment_bytes = n as usize;
                    return None;
                }
                "Reject".to_string()
            }
            "MaxBurstLength" => match numeric(512, (1 << 24) - 1) {
                Some(n) => {
                    p.max_burst_bytes = (n as usize).min(self.config.max_burst_bytes);
                    p.first_burst_bytes = p.first_burst_bytes.min(p.max_burst_bytes);
                    p.max_burst_bytes.to_string()
                }
                None => "Reject".to_string(),
            },
            "FirstBurstLength" => match numeric(512, (1 << 24) - 1) {
                Some(n) => {
                    p.first_burst_bytes = (n as usize).min(self.config.first_burst_bytes).min(p.max_burst_bytes);
                    p.first_burst_bytes.to_string()
                }
                None => "Reject".to_string(),
            },
            "DefaultTime2Wait" => match numeric(0, 3600) {
                Some(n) => {
                    p.default_time2wait_s = (n as u32).max(2);
                    p.default_time2wait_s.to_string()
                }
                None => "Reject".to_string(),
            },
            "DefaultTime2Retain" => match numeric(0, 3600) {
                Some(_) => {
                    p.default_time2retain_s = 0;
                    "0".to_string()
                }
                None => "Reject".to_string(),
            },
            "MaxOutstandingR2T" => match numeric(1, 65_535) {
                Some(_) => {
                    p.max_outstanding_r2t = 1;
                    "1".to_string()
                }
                None => "Reject".to_string(),
            },
            "ErrorRecoveryLevel" => match numeric(0, 2) {
                Some(_) => "0".to_string(),
                None => "Reject".to_string(),
            },
            _ => "NotUnderstood".to_string(),
        };
        Some(answer)
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
        n.offer(&keys(&[("SessionType", "Discovery")]), 0, false).unwrap();
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
        let a = n.offer(&keys(&[("MaxRecvDataSegmentLength", "12"), ("InitialR2T", "maybe"), ("HeaderDigest", "MD5")]), 1, false).unwrap();
        assert_eq!(find(&a, "InitialR2T"), Some("Reject"));
        assert_eq!(find(&a, "HeaderDigest"), Some("Reject"));
        assert_eq!(n.params.initiator_max_recv_data_segment_bytes, 8192);
        assert!(n.offer(&keys(&[("", "junk")]), 1, false).is_err());
    }
}
