//! Fuzz the login phase's key negotiation: text keys from untrusted bytes declared and
//! offered in both stages (the second time as a later request of the same login),
//! then the check for required keys.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zilla_iscsi::login::Negotiation;
use zilla_iscsi::pdu;
use zilla_iscsi::IscsiConfig;

fuzz_target!(|data: &[u8]| {
    let keys = pdu::parse_text(data);
    let mut n = Negotiation::new(&IscsiConfig::default());
    let _ = n.declare(&keys);
    let _ = n.offer(&keys, 0, false);
    let _ = n.declare(&keys);
    let _ = n.offer(&keys, 1, true);
    let _ = n.check_required();
});
