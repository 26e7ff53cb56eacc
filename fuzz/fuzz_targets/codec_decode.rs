//! Wire codec decoding (see `iota_tests::fuzz_bodies::codec_decode`).
//! The body is a library function so that CI replays `fuzz/seeds/codec_decode/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::codec_decode(data));
