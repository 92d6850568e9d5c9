//! `cargo fuzz run bucket_key`: see [`sluice_fuzz::bucket_key`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::bucket_key(data));
