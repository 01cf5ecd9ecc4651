//! Fuzz a whole connection: arbitrary client bytes into handshake and transmission
//! against a MemVolume. The first input byte chooses whether a valid handshake
//! prefix is sent first (so most time is spent in the transmission phase).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    zilla_nbd::fuzzing::drive_connection(rest, selector & 1 == 1);
});
