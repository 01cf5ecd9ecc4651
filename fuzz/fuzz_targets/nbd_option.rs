//! Fuzz the handshake parsers: option header, INFO/GO data, meta-context data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zilla_nbd::proto::{
    parse_export_request, parse_meta_context_request, parse_option_header, OPTION_HEADER_BYTES,
};

fuzz_target!(|data: &[u8]| {
    if let Some(header) = data.get(..OPTION_HEADER_BYTES) {
        let mut fixed = [0u8; OPTION_HEADER_BYTES];
        fixed.copy_from_slice(header);
        let _ = parse_option_header(&fixed);
    }
    if let Ok(request) = parse_export_request(data) {
        assert!(request.name.len() <= 4096);
    }
    if let Ok(request) = parse_meta_context_request(data) {
        assert!(request.export_name.len() <= 4096);
        assert!(request.queries.len() <= 128);
    }
});
