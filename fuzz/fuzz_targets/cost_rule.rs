//! `cargo fuzz run cost_rule`: see [`sluice_fuzz::usage::cost_rule`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::usage::cost_rule(data));
