//! `cargo fuzz run usage_stream`: see [`sluice_fuzz::usage::usage_stream`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::usage::usage_stream(data));
