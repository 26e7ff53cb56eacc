//! Hostile store objects and announcements through verification and `read_parts`/`load_weights` (see `iota_tests::fuzz_bodies::store_objects`).
//! The body is a library function so that CI replays `fuzz/seeds/store_objects/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| iota_tests::fuzz_bodies::store_objects(data));
