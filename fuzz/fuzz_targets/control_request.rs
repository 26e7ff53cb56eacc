//! The orchestrator's request path on arbitrary bytes: envelope decoding and
//! verification, and, past the signature (bodies signed by a real identity
//! inside the harness), body decoding and every field rule; plus a client
//! opening arbitrary server messages. Must never panic.
#![no_main]

use iota_core::Identity;
use iota_protocol::auth::{Audience, AuthPolicy, Verifier, open_server, signing_bytes};
use iota_protocol::client::{HEARTBEAT, REGISTER, REPORT, SUBSCRIBE};
use iota_protocol::{fields, pb};
use libfuzzer_sys::fuzz_target;
use prost::Message;

const NOW: u64 = 1_700_000_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let orch = Identity::from_seed([2; 32]);
    let aud = Audience { run_id: 7, orchestrator: orch.peer_id() };
    let v = Verifier::new(AuthPolicy::default(), aud, 0);
    // 1. A whole hostile envelope.
    if let Ok(s) = pb::Signed::decode(rest) {
        let _ = v.verify::<pb::RegisterRequest>(REGISTER, &s, NOW);
        let _ = v.verify::<pb::Report>(REPORT, &s, NOW);
    }
    // 2. Past the signature: the bytes as the body of a correctly signed
    //    envelope from a real identity.
    let who = Identity::from_seed([3; 32]);
    let method = [REGISTER, HEARTBEAT, REPORT][sel as usize % 3];
    let nonce = [sel; 16];
    let sig = who.sign(&signing_bytes(&aud, method, NOW, &nonce, rest));
    let env = pb::Signed {
        peer_id: who.peer_id().0.to_vec(),
        timestamp_ms: NOW,
        nonce: nonce.to_vec(),
        body: rest.to_vec(),
        signature: sig.to_vec(),
    };
    match sel % 3 {
        0 => {
            if let Ok((_, b)) = v.verify::<pb::RegisterRequest>(method, &env, NOW) {
                let _ = fields::register(&b);
            }
        }
        1 => {
            if let Ok((_, b)) = v.verify::<pb::HeartbeatRequest>(method, &env, NOW) {
                let _ = fields::heartbeat(&b);
            }
        }
        _ => {
            if let Ok((_, b)) = v.verify::<pb::Report>(method, &env, NOW) {
                let _ = fields::report(&b);
            }
        }
    }
    // 3. A client opening an arbitrary server message.
    if let Ok(m) = pb::ServerSigned::decode(rest) {
        let _ = open_server::<pb::Command>(&aud, &who.peer_id(), SUBSCRIBE, &nonce, m.seq, &m);
    }
});
