//! `cargo fuzz run header_bytes`: see [`sluice_fuzz::header_bytes`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::header_bytes(data));
