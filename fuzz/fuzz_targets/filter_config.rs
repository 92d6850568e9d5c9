//! `cargo fuzz run filter_config`: see [`sluice_fuzz::filter_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::filter_config(data));
