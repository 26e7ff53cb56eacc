//! Safetensors parsing into a stage layout (see `iota_tests::fuzz_bodies::safetensors`).
//! The body is a library function so that CI replays `fuzz/seeds/safetensors/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::safetensors(data));
