//! The orchestrator's state machine on arbitrary event sequences, invariants checked (see `iota_tests::fuzz_bodies::orchestrator_events`).
//! The body is a library function so that CI replays `fuzz/seeds/orchestrator_events/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::orchestrator_events(data));
