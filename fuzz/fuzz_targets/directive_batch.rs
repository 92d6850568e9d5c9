//! `cargo fuzz run directive_batch`: see [`sluice_fuzz::directive_batch`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::directive_batch(data));
