//! Wire codec decoding of arbitrary payloads: never panics, and whatever it
//! accepts is finite and of the promised size.
#![no_main]

use iota_core::WireCodec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, u16, u16, &[u8])| {
    let (codec, rows, cols, bytes) = input;
    let Ok(codec) = WireCodec::from_id(codec % 4) else { return };
    if let Ok(v) = iota_model::codec::decode(codec, rows as usize, cols as usize, bytes) {
        assert_eq!(v.len(), rows as usize * cols as usize);
        assert!(v.iter().all(|x| x.is_finite()));
    }
});
