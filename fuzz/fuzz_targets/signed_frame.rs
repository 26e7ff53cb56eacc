//! Frames signed by a merge participant's real key, fields and payload from
//! the fuzzer, through `decode_frame` into a butterfly replica mid-merge or
//! the CPU backend's `decode_wire` (see `iota_tests::fuzz_bodies::signed_frame`).
//! The body is a library function so that CI replays `fuzz/seeds/signed_frame/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::signed_frame(data));
