//! libFuzzer's driver for `granary_fuzz::targets::stripe_label`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_fuzz::targets::stripe_label(data));
