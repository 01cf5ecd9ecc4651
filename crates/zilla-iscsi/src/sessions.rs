//! sessions: the live sessions of the target, for the admin's listing and session
//! reinstatement.
//!
//! A connection registers its session once logged in (its login has passed the
//! target's authentication and initiator list) and the [`Listed`] guard it keeps
//! removes it when the connection ends. The registry holds at most `capacity` entries
//! (the connection cap: one session per connection here); a session beyond it is
//! served but not listed.
//!
//! Session identity (RFC 7143 §4.4.3): initiator name, ISID and target name (our one
//! portal group). A new normal session with the identity of a listed one reinstates it
//! (§6.3.5): the old session is told to end. The same initiator name and ISID on
//! another target is another session and ends nothing; a login that was refused never
//! reaches the registry, so it ends nothing either. Names compare without regard to
//! case, as the initiator lists do.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::login::{SessionParams, SessionType};

/// One live session as the admin sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub initiator_name: String,
    /// The initiator's session id, 12 hex digits.
    pub isid: String,
    /// The target's session handle.
    pub tsih: u16,
    /// "ip:port" of the initiator.
    pub peer: String,
    /// The target name; "discovery" for a discovery session.
    pub target: String,
    pub discovery: bool,
    /// "none" or "chap".
    pub auth: String,
    /// Largest data segment the initiator receives (what we send).
    pub initiator_max_recv_data_segment_bytes: usize,
    /// Largest data segment we receive.
    pub target_max_recv_data_segment_bytes: usize,
    pub max_burst_bytes: usize,
    pub first_burst_bytes: usize,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub header_digest: bool,
    pub data_digest: bool,
    /// Seconds since the Unix epoch when the session logged in.
    pub started_unix_s: u64,
}

impl SessionInfo {
    /// Both are normal sessions with one identity: initiator name, ISID and target.
    pub fn same_session(&self, other: &SessionInfo) -> bool {
        !self.discovery
            && !other.discovery
            && self.isid == other.isid
            && self.initiator_name.eq_ignore_ascii_case(&other.initiator_name)
            && self.target.eq_ignore_ascii_case(&other.target)
    }

    /// The listing entry of a session just logged in.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        initiator_name: &str,
        isid: [u8; 6],
        tsih: u16,
        peer: &str,
        target: &str,
        session_type: SessionType,
        auth: &str,
        params: &SessionParams,
    ) -> SessionInfo {
        let started_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        SessionInfo {
            initiator_name: initiator_name.to_string(),
            isid: isid.iter().map(|b| format!("{b:02x}")).collect(),
            tsih,
            peer: peer.to_string(),
            target: target.to_string(),
            discovery: session_type == SessionType::Discovery,
            auth: auth.to_string(),
            initiator_max_recv_data_segment_bytes: params.initiator_max_recv_data_segment_bytes,
            target_max_recv_data_segment_bytes: params.target_max_recv_data_segment_bytes,
            max_burst_bytes: params.max_burst_bytes,
            first_burst_bytes: params.first_burst_bytes,
            immediate_data: params.immediate_data,
            initial_r2t: params.initial_r2t,
            header_digest: params.header_digest,
            data_digest: params.data_digest,
            started_unix_s,
        }
    }
}

/// The bounded registry of live sessions.
pub(crate) struct SessionRegistry {
    /// Each live session and the signal that ends it when a new login reinstates it.
    entries: Mutex<BTreeMap<u64, (SessionInfo, tokio::sync::watch::Sender<bool>)>>,
    next_id: AtomicU64,
    capacity: usize,
}

/// Keeps a session listed; removes it when dropped.
pub(crate) struct Listed {
    registry: Arc<SessionRegistry>,
    id: u64,
    /// Turns true when a later login with the session's identity (initiator name,
    /// ISID, target) reinstates it (RFC 7143 §6.3.5): it is to end.
    pub(crate) reinstated: tokio::sync::watch::Receiver<bool>,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.registry.entries.lock().remove(&self.id);
    }
}

impl SessionRegistry {
    pub(crate) fn new(capacity: usize) -> SessionRegistry {
        SessionRegistry { entries: Mutex::new(BTreeMap::new()), next_id: AtomicU64::new(1), capacity: capacity.max(1) }
    }

    /// List `info` (a session whose login succeeded) until the guard is dropped;
    /// `None` when the registry is full. A normal session listed with the same identity
    /// is told to end (session reinstatement).
    pub(crate) fn register(self: &Arc<Self>, info: SessionInfo) -> Option<Listed> {
        let mut entries = self.entries.lock();
        for (old, end) in entries.values() {
            if old.same_session(&info) {
                end.send_replace(true);
            }
        }
        if entries.len() >= self.capacity {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (end, reinstated) = tokio::sync::watch::channel(false);
        entries.insert(id, (info, end));
        Some(Listed { registry: self.clone(), id, reinstated })
    }

    /// The live sessions, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<SessionInfo> {
        self.entries.lock().values().map(|(info, _)| info.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IscsiConfig;

    fn info(name: &str) -> SessionInfo {
        session(name, "iqn.t", SessionType::Normal)
    }

    fn session(name: &str, target: &str, session_type: SessionType) -> SessionInfo {
        let params = SessionParams::defaults(&IscsiConfig::default());
        SessionInfo::new(name, [0x80, 0, 0x12, 0x34, 0, 1], 7, "10.0.0.1:5000", target, session_type, "chap", &params)
    }

    #[test]
    fn only_a_session_of_the_same_initiator_isid_and_target_is_reinstated() {
        let registry = Arc::new(SessionRegistry::new(16));
        let victim = registry.register(session("iqn.n", "iqn.a", SessionType::Normal)).unwrap();
        // the same initiator name and ISID on another target, or in discovery: another session
        let other_target = registry.register(session("iqn.n", "iqn.b", SessionType::Normal)).unwrap();
        let discovery = registry.register(session("iqn.n", "discovery", SessionType::Discovery)).unwrap();
        let other_name = registry.register(session("iqn.m", "iqn.a", SessionType::Normal)).unwrap();
        let mut other_isid = session("iqn.n", "iqn.a", SessionType::Normal);
        other_isid.isid = "800012340002".into();
        let other_isid = registry.register(other_isid).unwrap();
        assert!(!*victim.reinstated.borrow(), "a session of another target, name or ISID ended the victim");
        // the same identity (names in another case): the victim is reinstated, nothing else
        let again = registry.register(session("IQN.N", "iqn.A", SessionType::Normal)).unwrap();
        assert!(*victim.reinstated.borrow());
        for kept in [&other_target, &discovery, &other_name, &other_isid, &again] {
            assert!(!*kept.reinstated.borrow());
        }
    }

    #[test]
    fn sessions_are_listed_while_held_and_bounded() {
        let registry = Arc::new(SessionRegistry::new(2));
        let a = registry.register(info("iqn.a")).unwrap();
        let b = registry.register(info("iqn.b")).unwrap();
        assert!(registry.register(info("iqn.c")).is_none());
        let listed = registry.snapshot();
        assert_eq!(listed.iter().map(|s| s.initiator_name.as_str()).collect::<Vec<_>>(), ["iqn.a", "iqn.b"]);
        assert_eq!(listed[0].isid, "800012340001");
        drop(a);
        assert_eq!(registry.snapshot().len(), 1);
        drop(b);
        assert!(registry.snapshot().is_empty());
    }
}
