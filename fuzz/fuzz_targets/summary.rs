//! libFuzzer's driver for `granary_fuzz::targets::summary`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_fuzz::targets::summary(data));
