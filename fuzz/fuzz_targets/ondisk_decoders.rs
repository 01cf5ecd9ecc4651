//! Every on-disk decoder over arbitrary bytes: block pointers, uberblocks, config
//! regions, the MOS stream, compressed payloads. None may panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zilla_core::fuzz_ondisk_decoders(data);
});
