//! Every on-disk decoder over arbitrary bytes: block pointers, uberblocks, config
//! regions and the label config's checks, the MOS stream, log blocks and ZIL headers,
//! compressed payloads. None may panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zilla_core::fuzz_ondisk_decoders(data);
});
