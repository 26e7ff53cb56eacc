//! The run configuration a miner receives at registration (see `iota_tests::fuzz_config::run_config`).
//! The body is a library function so that CI replays `fuzz/seeds/run_config/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_config::run_config(data));
