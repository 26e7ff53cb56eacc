//! Hostile evidence bundles under chosen limits (see `iota_tests::fuzz_bodies::evidence_bundle`).
//! The body is a library function so that CI replays `fuzz/seeds/evidence_bundle/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::evidence_bundle(data));
