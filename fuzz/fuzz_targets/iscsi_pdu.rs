//! Fuzz the iSCSI frame parser (BHS, AHS, data segment, digests) and the text-key
//! parser of login and Text data segments.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zilla_iscsi::pdu::{self, Digests};

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, bytes)) = data.split_first() else { return };
    let digests = Digests { header: knobs & 1 != 0, data: knobs & 2 != 0 };
    let max = 512usize << (knobs >> 4);
    if let Ok(Some(layout)) = pdu::parse_frame(bytes, digests, max) {
        // a frame that parses lies within its bytes and within the segment limit
        assert!(layout.data_bytes <= max);
        assert!(layout.total_bytes <= bytes.len());
        assert!(layout.total_bytes >= layout.data_at + layout.data_bytes);
        let _ = pdu::data_digest_ok(bytes, &layout, digests);
    }
    let _ = pdu::parse_text(bytes);
});
