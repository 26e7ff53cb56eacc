//! Frame decoding on arbitrary bytes: must never panic, and anything it
//! accepts must be internally consistent.
#![no_main]

use std::sync::OnceLock;

use iota_core::Identity;
use iota_dataplane::frame::{FrameLimits, RunContext, decode_frame, parse_header};
use libfuzzer_sys::fuzz_target;

fn ctx() -> &'static RunContext {
    static C: OnceLock<RunContext> = OnceLock::new();
    C.get_or_init(|| {
        let c = RunContext::new(7, FrameLimits { max_payload: 1 << 20, max_dim: 1 << 16 });
        c.set_epoch_window(0, 3);
        c
    })
}

fuzz_target!(|data: &[u8]| {
    let peer = Identity::from_seed([1; 32]).peer_id();
    if let Ok((h, payload)) = decode_frame(data, ctx(), peer) {
        assert_eq!(payload.len() as u64, h.payload_len);
        assert!(h.verify_signature());
    }
    // The header parser alone, on every prefix length.
    let _ = parse_header(data);
});
