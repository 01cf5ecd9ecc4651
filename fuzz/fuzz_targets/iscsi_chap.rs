//! Fuzz the security stage of a login: text keys from untrusted bytes offered to a
//! CHAP target (one-way and mutual) in three rounds, and binary values decoded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zilla_iscsi::auth::{decode_binary, Credential, TargetAuth};
use zilla_iscsi::pdu;
use zilla_iscsi::security::{requirement, SecurityStage};

fuzz_target!(|data: &[u8]| {
    let keys = pdu::parse_text(data);
    for (_, value) in &keys {
        let _ = decode_binary(value, 1024);
    }
    let entry = TargetAuth {
        chap: Credential::new("alice", b"secretpass12").ok(),
        mutual: Credential::new("tgt", b"targetsecret34").ok(),
        initiators: vec![],
    };
    for open in [false, true] {
        let mut stage = SecurityStage::with_challenge(requirement(&entry, open), 1, [7; 16]);
        for _ in 0..3 {
            if stage.offer(&keys).is_err() {
                break;
            }
        }
        let _ = stage.may_leave(false);
        let _ = stage.may_leave(true);
    }
});
