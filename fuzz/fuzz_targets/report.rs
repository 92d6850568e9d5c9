//! `cargo fuzz run report`: see [`sluice_fuzz::report`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::report(data));
