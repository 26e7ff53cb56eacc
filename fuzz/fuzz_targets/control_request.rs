//! The orchestrator's request path, before and past the signature (see `iota_tests::fuzz_bodies::control_request`).
//! The body is a library function so that CI replays `fuzz/seeds/control_request/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::control_request(data));
