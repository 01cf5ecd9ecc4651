//! security: the security stage of a login (RFC 7143 §6.3.1, §12), pure.
//!
//! Theory of operation
//! -------------------
//! Once the first Login Request has named the initiator and the target, the
//! connection asks [`requirement`] what the target's [`TargetAuth`] entry (or, for a
//! discovery session, the default entry) demands:
//!
//! ```text
//!   entry has a CHAP user ─────────────────────────> Chap: AuthMethod=CHAP only
//!   no CHAP user, unauthenticated logins allowed ──> Open: AuthMethod=None
//!   no CHAP user, not allowed ─────────────────────> Refuse: authentication failure
//! ```
//!
//! Unauthenticated logins are allowed on a loopback listener, or anywhere when the
//! administrator says so (`IscsiConfig::unauthenticated_logins`). The initiator's name
//! must be on the entry's list when the list is not empty (else authorization
//! failure, status 2/2; not applied to discovery sessions).
//!
//! [`SecurityStage`] then answers the security keys (AuthMethod, CHAP_*) of each
//! request in stage 0 and says whether the login may leave the stage: only once the
//! CHAP exchange has proved the initiator's secret. A request asking to move on too
//! early is answered without the transit bit while the exchange is under way, and
//! refused (authentication failure) when the initiator skipped or failed it.

use crate::auth::{ChapFailure, ChapTarget, Credential, TargetAuth, CHALLENGE_BYTES};
use crate::login::LoginRefusal;

/// What a login must do to pass the security stage.
#[derive(Debug, Clone)]
pub enum Requirement {
    /// No authentication (AuthMethod=None).
    Open,
    /// CHAP with this user and secret; `mutual`: what we prove if asked.
    Chap { credential: Credential, mutual: Option<Credential> },
    /// No login can pass: the target has no CHAP user and unauthenticated logins are
    /// not allowed on this listener.
    Refuse,
}

/// The requirement of `entry` for a login on a listener where unauthenticated logins
/// are (`unauthenticated_allowed`) or are not allowed.
pub fn requirement(entry: &TargetAuth, unauthenticated_allowed: bool) -> Requirement {
    match &entry.chap {
        Some(credential) => Requirement::Chap { credential: credential.clone(), mutual: entry.mutual.clone() },
        None if unauthenticated_allowed => Requirement::Open,
        None => Requirement::Refuse,
    }
}

/// Whether a key belongs to the security stage.
pub fn is_security_key(key: &str) -> bool {
    key == "AuthMethod" || key.starts_with("CHAP_")
}

/// The security stage of one login.
#[derive(Debug)]
pub struct SecurityStage {
    requirement: Requirement,
    /// The exchange, once AuthMethod=CHAP was agreed.
    chap: Option<ChapTarget>,
    /// Fresh CHAP identifier and challenge for the exchange.
    identifier: u8,
    challenge: [u8; CHALLENGE_BYTES],
}

/// Why the security stage refused a login (for the log; never holds a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecurityFailure {
    /// The initiator offers no method we accept here.
    NoSharedMethod,
    /// The target allows no unauthenticated login on this listener and has no CHAP user.
    NotConfigured,
    /// The login tried to leave the security stage before authenticating.
    Skipped,
    Chap(ChapFailure),
}

impl std::fmt::Display for SecurityFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecurityFailure::NoSharedMethod => write!(f, "the initiator offers no authentication method the target accepts"),
            SecurityFailure::NotConfigured => write!(
                f,
                "the target has no CHAP user and logins without authentication are off on this address"
            ),
            SecurityFailure::Skipped => write!(f, "the initiator left the security stage without authenticating"),
            SecurityFailure::Chap(failure) => write!(f, "{failure}"),
        }
    }
}

impl SecurityFailure {
    pub fn refusal(&self) -> LoginRefusal {
        LoginRefusal::Authentication
    }
}

impl SecurityStage {
    /// The stage for `requirement`, with a fresh random CHAP identifier and challenge.
    pub fn new(requirement: Requirement) -> SecurityStage {
        use rand::RngCore;
        let mut challenge = [0u8; CHALLENGE_BYTES];
        let mut rng = rand::rngs::OsRng;
        rng.fill_bytes(&mut challenge);
        let mut identifier = [0u8; 1];
        rng.fill_bytes(&mut identifier);
        SecurityStage::with_challenge(requirement, identifier[0], challenge)
    }

    /// The stage with a given identifier and challenge (tests).
    pub fn with_challenge(requirement: Requirement, identifier: u8, challenge: [u8; CHALLENGE_BYTES]) -> SecurityStage {
        SecurityStage { requirement, chap: None, identifier, challenge }
    }

    /// "none" or "chap": what this login passes with.
    pub fn method(&self) -> &'static str {
        match self.requirement {
            Requirement::Chap { .. } => "chap",
            _ => "none",
        }
    }

    /// Answer the security keys of one request in stage 0.
    pub fn offer(&mut self, keys: &[(String, String)]) -> Result<Vec<(String, String)>, SecurityFailure> {
        let mut answers = Vec::new();
        let mut chap_keys = Vec::new();
        for (key, value) in keys {
            if key == "AuthMethod" {
                answers.push((key.clone(), self.choose_method(value)?.to_string()));
            } else {
                chap_keys.push((key.clone(), value.clone()));
            }
        }
        match (&mut self.chap, &self.requirement) {
            (Some(chap), _) => answers.extend(chap.offer(&chap_keys).map_err(SecurityFailure::Chap)?),
            (None, Requirement::Chap { .. }) if !chap_keys.is_empty() => {
                return Err(SecurityFailure::Chap(ChapFailure::OutOfOrder("CHAP keys before AuthMethod=CHAP")))
            }
            // an open target ignores CHAP keys offered anyway
            (None, _) => answers.extend(chap_keys.into_iter().map(|(k, _)| (k, "Irrelevant".to_string()))),
        }
        Ok(answers)
    }

    fn choose_method(&mut self, offered: &str) -> Result<&'static str, SecurityFailure> {
        let offers = |m: &str| offered.split(',').any(|o| o == m);
        match &self.requirement {
            Requirement::Open if offers("None") => Ok("None"),
            Requirement::Open => Err(SecurityFailure::NoSharedMethod),
            Requirement::Refuse => Err(SecurityFailure::NotConfigured),
            Requirement::Chap { credential, mutual } => {
                if !offers("CHAP") {
                    return Err(SecurityFailure::NoSharedMethod);
                }
                if self.chap.is_none() {
                    self.chap = Some(ChapTarget::new(credential.clone(), mutual.clone(), self.identifier, self.challenge));
                }
                Ok("CHAP")
            }
        }
    }

    /// Whether the login may leave the security stage now.
    pub fn passed(&self) -> bool {
        match &self.requirement {
            Requirement::Open => true,
            Requirement::Refuse => false,
            Requirement::Chap { .. } => self.chap.as_ref().is_some_and(|c| c.done()),
        }
    }

    /// The login asks to leave the security stage (or starts past it): `Ok(true)`
    /// go, `Ok(false)` stay (the CHAP exchange is under way: answer without the
    /// transit bit), `Err` refuse.
    pub fn may_leave(&self, starts_past_security: bool) -> Result<bool, SecurityFailure> {
        if self.passed() {
            return Ok(true);
        }
        match (&self.requirement, &self.chap) {
            (Requirement::Refuse, _) => Err(SecurityFailure::NotConfigured),
            (Requirement::Chap { .. }, Some(_)) if !starts_past_security => Ok(false),
            _ => Err(SecurityFailure::Skipped),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{chap_response, encode_hex};

    fn keys(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn chap_entry() -> TargetAuth {
        TargetAuth { chap: Some(Credential::new("alice", b"secretpass12").unwrap()), ..Default::default() }
    }

    #[test]
    fn requirement_follows_the_entry_and_the_listener() {
        assert!(matches!(requirement(&chap_entry(), false), Requirement::Chap { .. }));
        assert!(matches!(requirement(&chap_entry(), true), Requirement::Chap { .. }));
        assert!(matches!(requirement(&TargetAuth::default(), true), Requirement::Open));
        assert!(matches!(requirement(&TargetAuth::default(), false), Requirement::Refuse));
    }

    #[test]
    fn an_open_target_takes_none_and_may_be_skipped() {
        let mut s = SecurityStage::with_challenge(Requirement::Open, 1, [0; 16]);
        assert_eq!(s.offer(&keys(&[("AuthMethod", "CHAP,None")])).unwrap(), keys(&[("AuthMethod", "None")]));
        assert_eq!(s.may_leave(false), Ok(true));
        let s = SecurityStage::with_challenge(Requirement::Open, 1, [0; 16]);
        assert_eq!(s.may_leave(true), Ok(true));
        let mut s = SecurityStage::with_challenge(Requirement::Open, 1, [0; 16]);
        assert_eq!(s.offer(&keys(&[("AuthMethod", "CHAP")])), Err(SecurityFailure::NoSharedMethod));
    }

    #[test]
    fn a_refused_target_passes_no_login() {
        let mut s = SecurityStage::with_challenge(Requirement::Refuse, 1, [0; 16]);
        assert_eq!(s.offer(&keys(&[("AuthMethod", "None")])), Err(SecurityFailure::NotConfigured));
        assert!(s.may_leave(true).is_err());
        assert!(s.may_leave(false).is_err());
    }

    #[test]
    fn a_chap_target_needs_the_whole_exchange() {
        let req = requirement(&chap_entry(), true);
        // AuthMethod=None only: refused
        let mut s = SecurityStage::with_challenge(req.clone(), 9, [7; 16]);
        assert_eq!(s.offer(&keys(&[("AuthMethod", "None")])), Err(SecurityFailure::NoSharedMethod));
        // skipping the security stage: refused
        let s = SecurityStage::with_challenge(req.clone(), 9, [7; 16]);
        assert_eq!(s.may_leave(true), Err(SecurityFailure::Skipped));
        assert_eq!(s.may_leave(false), Err(SecurityFailure::Skipped));
        // CHAP keys before AuthMethod: refused
        let mut s = SecurityStage::with_challenge(req.clone(), 9, [7; 16]);
        assert!(s.offer(&keys(&[("CHAP_A", "5")])).is_err());
        // the exchange
        let mut s = SecurityStage::with_challenge(req, 9, [7; 16]);
        assert_eq!(s.offer(&keys(&[("AuthMethod", "CHAP,None")])).unwrap(), keys(&[("AuthMethod", "CHAP")]));
        assert_eq!(s.may_leave(false), Ok(false), "asked to move on before CHAP_A: stay");
        assert_eq!(s.may_leave(true), Err(SecurityFailure::Skipped));
        let a = s.offer(&keys(&[("CHAP_A", "5")])).unwrap();
        assert_eq!(a[1], ("CHAP_I".to_string(), "9".to_string()));
        assert_eq!(s.may_leave(false), Ok(false));
        let mut wrong = SecurityStage { chap: s.chap.clone(), requirement: s.requirement.clone(), ..s };
        let bad = encode_hex(&chap_response(9, b"secretpass13", &[7; 16]));
        assert!(matches!(
            wrong.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &bad)])),
            Err(SecurityFailure::Chap(ChapFailure::WrongResponse))
        ));
        let mut s = SecurityStage::with_challenge(requirement(&chap_entry(), true), 9, [7; 16]);
        s.offer(&keys(&[("AuthMethod", "CHAP")])).unwrap();
        s.offer(&keys(&[("CHAP_A", "5")])).unwrap();
        let good = encode_hex(&chap_response(9, b"secretpass12", &[7; 16]));
        assert_eq!(s.offer(&keys(&[("CHAP_N", "alice"), ("CHAP_R", &good)])).unwrap(), vec![]);
        assert_eq!(s.may_leave(false), Ok(true));
        assert_eq!(s.method(), "chap");
    }
}
