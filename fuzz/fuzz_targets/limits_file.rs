//! `cargo fuzz run limits_file`: see [`sluice_fuzz::limits_file`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::limits_file(data));
