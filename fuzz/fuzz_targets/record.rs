//! libFuzzer's driver for `granary_fuzz::targets::record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_fuzz::targets::record(data));
