//! access: who may log in (the authentication store, replaced whole by the daemon),
//! who is logged in (the session registry), and how many connections each client
//! address may have in the login phase at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::auth::AuthStore;
use crate::sessions::SessionRegistry;

/// Who may log in, and who is logged in.
pub(crate) struct Access {
    /// Replaced whole by the daemon; each login reads the current one.
    pub(crate) store: Mutex<Arc<AuthStore>>,
    pub(crate) sessions: Arc<SessionRegistry>,
}

impl Access {
    pub(crate) fn store(&self) -> Arc<AuthStore> {
        self.store.lock().clone()
    }
}

/// Connections one address may have in the login phase at once (beyond: closed at
/// accept, counted as refused logins).
pub(crate) const LOGINS_PER_ADDRESS_MAX: usize = 16;

/// Connections in the login phase per client address. Every entry has at least one
/// connection, so the map is bounded by the connection cap.
#[derive(Default)]
pub(crate) struct LoginsInProgress {
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place among its address's logins in progress; dropped when the
/// login ends (the session starts, or the connection is refused or closed).
pub(crate) struct LoginSlot {
    logins: Arc<LoginsInProgress>,
    address: IpAddr,
}

impl LoginsInProgress {
    pub(crate) fn try_take(logins: &Arc<LoginsInProgress>, address: IpAddr) -> Option<LoginSlot> {
        let mut map = logins.by_address.lock();
        let count = map.entry(address).or_insert(0);
        if *count >= LOGINS_PER_ADDRESS_MAX {
            return None;
        }
        *count += 1;
        Some(LoginSlot { logins: logins.clone(), address })
    }
}

impl Drop for LoginSlot {
    fn drop(&mut self) {
        let mut map = self.logins.by_address.lock();
        if let Some(count) = map.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod login_tests {
    use super::*;

    #[test]
    fn one_address_holds_a_bounded_number_of_logins_and_others_are_not_held_back() {
        let logins = Arc::new(LoginsInProgress::default());
        let flood: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        let held: Vec<LoginSlot> = (0..LOGINS_PER_ADDRESS_MAX).map(|_| LoginsInProgress::try_take(&logins, flood).unwrap()).collect();
        assert!(LoginsInProgress::try_take(&logins, flood).is_none(), "the flooding address is capped");
        assert!(LoginsInProgress::try_take(&logins, other).is_some(), "another address still logs in");
        drop(held);
        assert!(LoginsInProgress::try_take(&logins, flood).is_some(), "slots come back when logins end");
        assert!(logins.by_address.lock().is_empty(), "no entry is left for addresses with no login in progress");
    }
}
