//! Signed requests: every control-plane call is a `Signed` envelope.
//!
//! The caller signs `"iota-rs rpc v1\0" || method || "\0" || timestamp ||
//! nonce || blake3(body)` with its identity key. The server checks, in order:
//! the envelope's shape, the signature, the timestamp window, the nonce
//! (never seen within the window), and a per-identity rate limit. Each
//! failure maps to a gRPC status a client can act on.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use iota_core::{Identity, PeerId};
use prost::Message;
use tonic::{Code, Status};

use crate::pb::Signed;

const DOMAIN: &[u8] = b"iota-rs rpc v1\0";
pub const NONCE_LEN: usize = 16;

/// The bytes a caller signs.
pub fn signing_bytes(method: &str, timestamp_ms: u64, nonce: &[u8], body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(DOMAIN.len() + method.len() + 1 + 8 + nonce.len() + 32);
    v.extend_from_slice(DOMAIN);
    v.extend_from_slice(method.as_bytes());
    v.push(0);
    v.extend_from_slice(&timestamp_ms.to_le_bytes());
    v.extend_from_slice(nonce);
    v.extend_from_slice(blake3::hash(body).as_bytes());
    v
}

/// Wraps `body` for `method`, signed by `id` at `now_ms` with a fresh nonce.
pub fn sign<M: Message>(id: &Identity, method: &str, body: &M, now_ms: u64) -> Signed {
    let mut nonce = [0u8; NONCE_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce).expect("OS random generator");
    sign_with_nonce(id, method, body, now_ms, nonce)
}

pub fn sign_with_nonce<M: Message>(
    id: &Identity,
    method: &str,
    body: &M,
    now_ms: u64,
    nonce: [u8; NONCE_LEN],
) -> Signed {
    let body = body.encode_to_vec();
    let sig = id.sign(&signing_bytes(method, now_ms, &nonce, &body));
    Signed {
        peer_id: id.peer_id().0.to_vec(),
        timestamp_ms: now_ms,
        nonce: nonce.to_vec(),
        body,
        signature: sig.to_vec(),
    }
}

/// Server-side policy for signed requests.
#[derive(Clone, Debug)]
pub struct AuthPolicy {
    /// Accept timestamps within this much of the server's clock.
    pub max_skew: Duration,
    /// Requests per second per identity (token bucket refill rate).
    pub rate_per_s: f64,
    /// Bucket size (burst).
    pub burst: f64,
    /// Largest body accepted.
    pub max_body: usize,
}

impl Default for AuthPolicy {
    fn default() -> Self {
        AuthPolicy { max_skew: Duration::from_secs(30), rate_per_s: 200.0, burst: 400.0, max_body: 1 << 20 }
    }
}

struct Bucket {
    tokens: f64,
    at_ms: u64,
}

/// Identities with a rate-limit bucket at once. Buckets refill within
/// `burst / rate_per_s` seconds and are then forgotten (a full bucket is the
/// same as none), so only identities active in that window count.
pub const MAX_BUCKETS: usize = 1 << 16;

/// Per-identity token buckets, pruned as they refill.
#[derive(Default)]
struct Buckets {
    map: HashMap<PeerId, Bucket>,
    /// Prune when the map grows past this (amortises the sweep).
    prune_at: usize,
}

/// Replay and rate-limit state of a server.
pub struct Verifier {
    policy: AuthPolicy,
    seen: Mutex<Seen>,
    buckets: Mutex<Buckets>,
}

/// Nonces seen within the skew window, oldest first.
#[derive(Default)]
struct Seen {
    set: HashMap<(PeerId, [u8; NONCE_LEN]), u64>,
    order: VecDeque<(u64, PeerId, [u8; NONCE_LEN])>,
}

impl Verifier {
    pub fn new(policy: AuthPolicy) -> Self {
        Verifier {
            policy,
            seen: Mutex::new(Seen::default()),
            buckets: Mutex::new(Buckets { map: HashMap::new(), prune_at: 1024 }),
        }
    }

    /// Verifies an envelope for `method` at server time `now_ms`; returns the
    /// caller and the decoded body.
    pub fn verify<M: Message + Default>(&self, method: &str, s: &Signed, now_ms: u64) -> Result<(PeerId, M), Status> {
        let peer: [u8; 32] =
            s.peer_id.as_slice().try_into().map_err(|_| Status::invalid_argument("peer_id must be 32 bytes"))?;
        let peer = PeerId(peer);
        if !peer.is_acceptable() {
            return Err(Status::unauthenticated(
                "peer_id is not an acceptable Ed25519 key (small order or non-canonical)",
            ));
        }
        let nonce: [u8; NONCE_LEN] =
            s.nonce.as_slice().try_into().map_err(|_| Status::invalid_argument("nonce must be 16 bytes"))?;
        let sig: [u8; 64] =
            s.signature.as_slice().try_into().map_err(|_| Status::unauthenticated("signature must be 64 bytes"))?;
        if s.body.len() > self.policy.max_body {
            return Err(Status::invalid_argument(format!(
                "body of {} bytes exceeds {}",
                s.body.len(),
                self.policy.max_body
            )));
        }
        if !peer.verify(&signing_bytes(method, s.timestamp_ms, &nonce, &s.body), &sig) {
            return Err(Status::unauthenticated("bad signature"));
        }
        let skew = self.policy.max_skew.as_millis() as u64;
        if s.timestamp_ms + skew < now_ms || s.timestamp_ms > now_ms + skew {
            return Err(Status::unauthenticated(format!(
                "stale timestamp: {} ms from server time (window {} ms)",
                s.timestamp_ms as i128 - now_ms as i128,
                skew
            )));
        }
        self.check_nonce(peer, nonce, s.timestamp_ms, now_ms)?;
        self.check_rate(peer, now_ms)?;
        let body =
            M::decode(s.body.as_slice()).map_err(|e| Status::invalid_argument(format!("body does not decode: {e}")))?;
        Ok((peer, body))
    }

    fn check_nonce(&self, peer: PeerId, nonce: [u8; NONCE_LEN], ts: u64, now_ms: u64) -> Result<(), Status> {
        let mut seen = self.seen.lock();
        // Forget nonces whose timestamps left the window: a replay of them is
        // refused by the timestamp check instead.
        let horizon = now_ms.saturating_sub(2 * self.policy.max_skew.as_millis() as u64);
        while let Some(&(t, p, n)) = seen.order.front() {
            if t >= horizon {
                break;
            }
            seen.order.pop_front();
            seen.set.remove(&(p, n));
        }
        if seen.set.contains_key(&(peer, nonce)) {
            return Err(Status::already_exists("replayed nonce"));
        }
        seen.set.insert((peer, nonce), ts);
        seen.order.push_back((ts.max(horizon), peer, nonce));
        Ok(())
    }

    fn check_rate(&self, peer: PeerId, now_ms: u64) -> Result<(), Status> {
        let mut b = self.buckets.lock();
        let refill_ms = (self.policy.burst / self.policy.rate_per_s * 1000.0).ceil() as u64;
        if b.map.len() >= b.prune_at {
            // A bucket idle for a whole refill is full again: forget it.
            b.map.retain(|_, e| now_ms.saturating_sub(e.at_ms) < refill_ms);
            b.prune_at = (2 * b.map.len()).max(1024);
        }
        if b.map.len() >= MAX_BUCKETS && !b.map.contains_key(&peer) {
            return Err(Status::new(Code::ResourceExhausted, "too many active identities; retry shortly"));
        }
        let e = b.map.entry(peer).or_insert(Bucket { tokens: self.policy.burst, at_ms: now_ms });
        let dt = now_ms.saturating_sub(e.at_ms) as f64 / 1000.0;
        e.tokens = (e.tokens + dt * self.policy.rate_per_s).min(self.policy.burst);
        e.at_ms = now_ms.max(e.at_ms);
        if e.tokens < 1.0 {
            return Err(Status::new(Code::ResourceExhausted, "rate limit exceeded"));
        }
        e.tokens -= 1.0;
        Ok(())
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::HeartbeatRequest;

    const M: &str = "/iota.v1.Orchestrator/Heartbeat";

    fn body() -> HeartbeatRequest {
        HeartbeatRequest { epoch: 3, in_flight: 1, tokens_per_s: 10.0 }
    }

    #[test]
    fn accepts_good_rejects_each_defect_with_its_code() {
        let v = Verifier::new(AuthPolicy::default());
        let id = Identity::from_seed([5; 32]);
        let now = 1_000_000;
        let s = sign(&id, M, &body(), now);
        let (peer, b): (PeerId, HeartbeatRequest) = v.verify(M, &s, now + 5).unwrap();
        assert_eq!(peer, id.peer_id());
        assert_eq!(b, body());
        // replay
        assert_eq!(v.verify::<HeartbeatRequest>(M, &s, now + 6).unwrap_err().code(), Code::AlreadyExists);
        // bad signature: body tampered
        let mut t = sign(&id, M, &body(), now);
        t.body[0] ^= 1;
        assert_eq!(v.verify::<HeartbeatRequest>(M, &t, now).unwrap_err().code(), Code::Unauthenticated);
        // signature for another method
        let other = sign(&id, "/iota.v1.Orchestrator/Report", &body(), now);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &other, now).unwrap_err().code(), Code::Unauthenticated);
        // stale and future timestamps
        let old = sign(&id, M, &body(), now - 31_000);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &old, now).unwrap_err().code(), Code::Unauthenticated);
        let future = sign(&id, M, &body(), now + 31_000);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &future, now).unwrap_err().code(), Code::Unauthenticated);
        // malformed envelope
        let mut short = sign(&id, M, &body(), now);
        short.peer_id.pop();
        assert_eq!(v.verify::<HeartbeatRequest>(M, &short, now).unwrap_err().code(), Code::InvalidArgument);
    }

    #[test]
    fn rate_limit_per_identity() {
        let v = Verifier::new(AuthPolicy { rate_per_s: 10.0, burst: 5.0, ..AuthPolicy::default() });
        let (a, b) = (Identity::from_seed([1; 32]), Identity::from_seed([2; 32]));
        let now = 50_000;
        for _ in 0..5 {
            v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now), now).unwrap();
        }
        let e = v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now), now).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        // Another identity has its own bucket; time refills the first.
        v.verify::<HeartbeatRequest>(M, &sign(&b, M, &body(), now), now).unwrap();
        v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now + 200), now + 200).unwrap();
    }

    #[test]
    fn rate_buckets_of_idle_identities_are_forgotten() {
        let v = Verifier::new(AuthPolicy { rate_per_s: 10.0, burst: 5.0, ..AuthPolicy::default() });
        // 5,000 identities, one request each, spread over 50 s: buckets
        // refill in 0.5 s, so only the recent ones may stay.
        let mut now = 1_000_000u64;
        for i in 0..5_000u32 {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&i.to_le_bytes());
            let id = Identity::from_seed(seed);
            v.verify::<HeartbeatRequest>(M, &sign(&id, M, &body(), now), now).unwrap();
            now += 10;
        }
        let held = v.buckets.lock().map.len();
        assert!(held <= 2 * 1024, "{held} buckets held for identities idle for seconds");
        // A busy identity keeps its (empty) bucket through a prune.
        let a = Identity::from_seed([1; 32]);
        for _ in 0..5 {
            v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now), now).unwrap();
        }
        v.buckets.lock().prune_at = 0;
        let e = v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now), now).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
    }

    #[test]
    fn old_nonces_are_forgotten_but_stay_refused_by_time() {
        let v = Verifier::new(AuthPolicy::default());
        let id = Identity::from_seed([3; 32]);
        let s = sign_with_nonce(&id, M, &body(), 0, [9; NONCE_LEN]);
        v.verify::<HeartbeatRequest>(M, &s, 0).unwrap();
        // Much later the nonce table is pruned, yet the replay still fails (timestamp).
        let later = 10 * 60_000;
        let _ = v.verify::<HeartbeatRequest>(M, &sign(&id, M, &body(), later), later);
        assert!(v.seen.lock().set.len() == 1);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &s, later).unwrap_err().code(), Code::Unauthenticated);
    }
}
