//! Frame decoding on arbitrary bytes (see `iota_tests::fuzz_bodies::frame_decode`).
//! The body is a library function so that CI replays `fuzz/seeds/frame_decode/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::frame_decode(data));
