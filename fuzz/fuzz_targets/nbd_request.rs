//! Fuzz the transmission request parser and its validation against a session.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zilla_nbd::proto::{parse_request, validate_request, RequestLimits, REQUEST_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some(header) = data.get(..REQUEST_HEADER_BYTES) else { return };
    let mut fixed = [0u8; REQUEST_HEADER_BYTES];
    fixed.copy_from_slice(header);
    let Ok(request) = parse_request(&fixed) else { return };
    let knobs = data.get(REQUEST_HEADER_BYTES).copied().unwrap_or(0);
    let limits = RequestLimits {
        export_bytes: 1 << 30,
        read_only: knobs & 1 != 0,
        structured_replies: knobs & 2 != 0,
        block_status_enabled: knobs & 4 != 0,
        payload_max_bytes: 32 << 20,
    };
    if validate_request(&request, &limits).is_ok() {
        // Whatever passes validation is inside the export.
        let end = request.offset.checked_add(u64::from(request.length));
        assert!(request.command == 2 || request.command == 3 || end.is_some_and(|e| e <= limits.export_bytes));
    }
});
