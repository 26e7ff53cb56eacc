//! Signed requests and signed replies.
//!
//! A caller signs `"iota-rs rpc v2\0" || run_id (u64 LE) || orchestrator id
//! (32 bytes) || method || "\0" || timestamp (u64 LE) || nonce (16 bytes) ||
//! blake3(body)` with its identity key: a signature is good for one method,
//! one run and one orchestrator, so it cannot be replayed against another
//! run's server. The server checks, in order: the envelope's shape, the key
//! (canonical, not of small order), the signature (strict Ed25519), the
//! timestamp window, that it was signed after the server started (nonces are
//! not kept across restarts), the nonce (never seen within the window), and a
//! per-identity rate limit. Each failure is a [`Rejected`] with its reason.
//!
//! The orchestrator signs what it sends back that changes a miner's
//! behaviour (`ServerSigned`): `"iota-rs server v2\0" || run_id ||
//! orchestrator id || recipient id || method || "\0" || request nonce ||
//! seq (u64 LE) || blake3(body)`. A reply carries seq 0 and the nonce of the
//! request it answers; a Subscribe stream's commands carry the Subscribe
//! request's nonce and seq 0, 1, 2, ... so none can be replayed, reordered,
//! dropped or moved to another stream unnoticed. `Hello` is signed over
//! `"iota-rs hello v2\0" || orchestrator id || run_id || server time`.

// Input from peers: no unchecked arithmetic or indexing (issue 21).
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use iota_core::{Identity, PeerId};
use prost::Message;

use crate::pb::{self, Signed};
use crate::refusal::{Reason, Rejected};
use crate::source_limits::{Exhausted, TokenBuckets};

const RPC_DOMAIN: &[u8] = b"iota-rs rpc v2\0";
const SERVER_DOMAIN: &[u8] = b"iota-rs server v2\0";
const HELLO_DOMAIN: &[u8] = b"iota-rs hello v2\0";
/// What `Hello` says the protocol is.
pub const PROTOCOL: &str = "iota-rs/2";
pub const NONCE_LEN: usize = 16;

/// Whom a signature is for: one run of one orchestrator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Audience {
    pub run_id: u64,
    pub orchestrator: PeerId,
}

impl Audience {
    fn put(&self, v: &mut Vec<u8>) {
        v.extend_from_slice(&self.run_id.to_le_bytes());
        v.extend_from_slice(&self.orchestrator.0);
    }
}

/// The bytes a caller signs.
pub fn signing_bytes(aud: &Audience, method: &str, timestamp_ms: u64, nonce: &[u8], body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(RPC_DOMAIN);
    aud.put(&mut v);
    v.extend_from_slice(method.as_bytes());
    v.push(0);
    v.extend_from_slice(&timestamp_ms.to_le_bytes());
    v.extend_from_slice(nonce);
    v.extend_from_slice(blake3::hash(body).as_bytes());
    v
}

/// A fresh random nonce.
pub fn fresh_nonce() -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce).expect("OS random generator");
    nonce
}

/// Wraps `body` for `method` of `aud`, signed by `id` at `now_ms` with a fresh nonce.
pub fn sign<M: Message>(id: &Identity, aud: &Audience, method: &str, body: &M, now_ms: u64) -> Signed {
    sign_with_nonce(id, aud, method, body, now_ms, fresh_nonce())
}

pub fn sign_with_nonce<M: Message>(
    id: &Identity,
    aud: &Audience,
    method: &str,
    body: &M,
    now_ms: u64,
    nonce: [u8; NONCE_LEN],
) -> Signed {
    let body = body.encode_to_vec();
    let sig = id.sign(&signing_bytes(aud, method, now_ms, &nonce, &body));
    Signed {
        peer_id: id.peer_id().0.to_vec(),
        timestamp_ms: now_ms,
        nonce: nonce.to_vec(),
        body,
        signature: sig.to_vec(),
    }
}

/// The bytes the orchestrator signs for a reply or command to `recipient`.
pub fn server_signing_bytes(
    aud: &Audience,
    recipient: &PeerId,
    method: &str,
    request_nonce: &[u8],
    seq: u64,
    body: &[u8],
) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(SERVER_DOMAIN);
    aud.put(&mut v);
    v.extend_from_slice(&recipient.0);
    v.extend_from_slice(method.as_bytes());
    v.push(0);
    v.extend_from_slice(request_nonce);
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(blake3::hash(body).as_bytes());
    v
}

/// The orchestrator `id` signs `body` for `recipient`.
pub fn sign_server<M: Message>(
    id: &Identity,
    aud: &Audience,
    recipient: &PeerId,
    method: &str,
    request_nonce: &[u8],
    seq: u64,
    body: &M,
) -> pb::ServerSigned {
    let body = body.encode_to_vec();
    let sig = id.sign(&server_signing_bytes(aud, recipient, method, request_nonce, seq, &body));
    pb::ServerSigned { body, seq, signature: sig.to_vec() }
}

/// Checks a server message addressed to `me` (its signature by
/// `aud.orchestrator`, its binding to the request and its sequence number)
/// and decodes its body.
pub fn open_server<M: Message + Default>(
    aud: &Audience,
    me: &PeerId,
    method: &str,
    request_nonce: &[u8],
    seq: u64,
    m: &pb::ServerSigned,
) -> Result<M, String> {
    let sig: [u8; 64] = m.signature.as_slice().try_into().map_err(|_| "server signature must be 64 bytes")?;
    if m.seq != seq {
        return Err(format!("server message {} where {seq} was due (replayed, reordered or dropped)", m.seq));
    }
    if !aud.orchestrator.verify(&server_signing_bytes(aud, me, method, request_nonce, m.seq, &m.body), &sig) {
        return Err(format!("server message not signed by orchestrator {}", aud.orchestrator.to_hex()));
    }
    M::decode(m.body.as_slice()).map_err(|e| format!("server message does not decode: {e}"))
}

fn hello_bytes(orchestrator: &PeerId, run_id: u64, server_time_ms: u64) -> Vec<u8> {
    let mut v = HELLO_DOMAIN.to_vec();
    v.extend_from_slice(&orchestrator.0);
    v.extend_from_slice(&run_id.to_le_bytes());
    v.extend_from_slice(&server_time_ms.to_le_bytes());
    v
}

/// The orchestrator's answer to `Hello`.
pub fn sign_hello(id: &Identity, run_id: u64, now_ms: u64) -> pb::HelloReply {
    pb::HelloReply {
        orchestrator_id: id.peer_id().0.to_vec(),
        run_id,
        server_time_ms: now_ms,
        protocol: PROTOCOL.into(),
        signature: id.sign(&hello_bytes(&id.peer_id(), run_id, now_ms)).to_vec(),
    }
}

/// Checks a `Hello` reply (against the pinned orchestrator key when there
/// is one) and returns whom to sign for.
pub fn open_hello(h: &pb::HelloReply, pinned: Option<PeerId>) -> Result<Audience, String> {
    if h.protocol != PROTOCOL {
        return Err(format!("the orchestrator speaks '{}', this build speaks '{PROTOCOL}'", h.protocol));
    }
    let id: [u8; 32] = h.orchestrator_id.as_slice().try_into().map_err(|_| "orchestrator id must be 32 bytes")?;
    let id = PeerId(id);
    if let Some(p) = pinned
        && p != id
    {
        return Err(format!(
            "the server at this address is orchestrator {}, not the pinned {} (a wrong address, or an impostor)",
            id.to_hex(),
            p.to_hex()
        ));
    }
    let sig: [u8; 64] = h.signature.as_slice().try_into().map_err(|_| "hello signature must be 64 bytes")?;
    if !id.verify(&hello_bytes(&id, h.run_id, h.server_time_ms), &sig) {
        return Err("hello not signed by the orchestrator it names".into());
    }
    Ok(Audience { run_id: h.run_id, orchestrator: id })
}

/// Server-side policy for signed requests.
#[derive(Clone, Debug)]
pub struct AuthPolicy {
    /// Accept timestamps at most this much behind the server's clock.
    pub max_skew: Duration,
    /// Accept timestamps at most this much ahead of the server's clock. A
    /// restarted server refuses envelopes dated before its start plus this
    /// (the process before it may have seen them: its nonces are gone), so
    /// it is kept short; clients sign with a synchronized clock.
    pub max_ahead: Duration,
    /// Requests per second per identity (token bucket refill rate).
    pub rate_per_s: f64,
    /// Bucket size (burst).
    pub burst: f64,
    /// Largest body accepted.
    pub max_body: usize,
    /// The identities the run admits (None: any). Checked before anything
    /// else about a request, so an identity not on the list costs one hash
    /// lookup and is kept nowhere.
    pub admitted: Option<Arc<HashSet<PeerId>>>,
}

impl Default for AuthPolicy {
    fn default() -> Self {
        AuthPolicy {
            max_skew: Duration::from_secs(30),
            max_ahead: Duration::from_secs(5),
            rate_per_s: 200.0,
            burst: 400.0,
            max_body: 1 << 20,
            admitted: None,
        }
    }
}

/// Reads an admission list: one identity (64 hex characters) per line;
/// blank lines and text after '#' are ignored. An unreadable line is an
/// error naming it, never a silently shorter list.
pub fn load_admitted(path: &std::path::Path) -> anyhow::Result<HashSet<PeerId>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut set = HashSet::new();
    for (n, line) in (1u64..).zip(text.lines()) {
        let entry = line.split('#').next().unwrap_or("").trim();
        if entry.is_empty() {
            continue;
        }
        let peer = PeerId::from_hex(entry).with_context(|| {
            format!("{} line {n}: {entry:?} is not an identity (64 hex characters)", path.display())
        })?;
        set.insert(peer);
    }
    anyhow::ensure!(!set.is_empty(), "{} admits nobody", path.display());
    Ok(set)
}

/// Identities with a rate-limit bucket at once. Buckets refill within
/// `burst / rate_per_s` seconds and are then forgotten (a full bucket is the
/// same as none), so only identities active in that window count.
pub const MAX_BUCKETS: usize = 1 << 16;

/// Replay and rate-limit state of a server.
pub struct Verifier {
    policy: AuthPolicy,
    aud: Audience,
    /// Envelopes signed before this are refused: the nonces this process
    /// remembers start here.
    not_before_ms: u64,
    seen: Mutex<Seen>,
    buckets: Mutex<TokenBuckets<PeerId>>,
}

/// Nonces seen within the skew window, oldest first.
#[derive(Default)]
struct Seen {
    set: HashMap<(PeerId, [u8; NONCE_LEN]), u64>,
    order: VecDeque<(u64, PeerId, [u8; NONCE_LEN])>,
}

impl Verifier {
    /// A verifier for requests to `aud`, refusing any signed before `not_before_ms`
    /// (the server's start; a restarted server's start plus `max_ahead`,
    /// see `AuthPolicy::max_ahead`).
    pub fn new(policy: AuthPolicy, aud: Audience, not_before_ms: u64) -> Self {
        let buckets = Mutex::new(TokenBuckets::new(policy.rate_per_s, policy.burst, MAX_BUCKETS));
        Verifier { policy, aud, not_before_ms, seen: Mutex::new(Seen::default()), buckets }
    }

    /// Whom this verifier accepts requests for.
    pub fn audience(&self) -> &Audience {
        &self.aud
    }

    /// Verifies an envelope for `method` at server time `now_ms`; returns the
    /// caller and the decoded body.
    pub fn verify<M: Message + Default>(&self, method: &str, s: &Signed, now_ms: u64) -> Result<(PeerId, M), Rejected> {
        let malformed = |what: &str| Rejected::new(Reason::MalformedEnvelope, what.to_string());
        let peer: [u8; 32] = s.peer_id.as_slice().try_into().map_err(|_| malformed("peer_id must be 32 bytes"))?;
        let peer = PeerId(peer);
        let nonce: [u8; NONCE_LEN] = s.nonce.as_slice().try_into().map_err(|_| malformed("nonce must be 16 bytes"))?;
        let sig: [u8; 64] = s.signature.as_slice().try_into().map_err(|_| malformed("signature must be 64 bytes"))?;
        if let Some(list) = &self.policy.admitted
            && !list.contains(&peer)
        {
            // Not attributed (`from`): the signature is not checked yet.
            return Err(Rejected::new(Reason::NotAdmitted, format!("identity {peer} is not admitted to this run")));
        }
        if !peer.is_acceptable() {
            return Err(Rejected::new(
                Reason::WeakKey,
                "peer_id is not an acceptable Ed25519 key (small order or non-canonical)",
            ));
        }
        if s.body.len() > self.policy.max_body {
            let m = format!("body of {} bytes exceeds {}", s.body.len(), self.policy.max_body);
            return Err(Rejected::new(Reason::BodyTooLarge, m));
        }
        if !peer.verify(&signing_bytes(&self.aud, method, s.timestamp_ms, &nonce, &s.body), &sig) {
            return Err(Rejected::new(Reason::BadSignature, "bad signature (for this method, run and orchestrator)"));
        }
        // From here on the caller is who it says it is.
        let skew = self.policy.max_skew.as_millis() as u64;
        let ahead = self.policy.max_ahead.as_millis() as u64;
        if s.timestamp_ms.saturating_add(skew) < now_ms || s.timestamp_ms > now_ms.saturating_add(ahead) {
            let m = format!(
                "stale timestamp: {} ms from server time (window {} ms behind, {} ms ahead)",
                (s.timestamp_ms as i128).saturating_sub(now_ms as i128),
                skew,
                ahead
            );
            return Err(Rejected::new(Reason::StaleTimestamp, m).from(peer));
        }
        if s.timestamp_ms < self.not_before_ms {
            let m = "signed before this orchestrator started; sign again".to_string();
            return Err(Rejected::new(Reason::BeforeStart, m).from(peer));
        }
        self.check_nonce(peer, nonce, s.timestamp_ms, now_ms).map_err(|r| r.from(peer))?;
        self.check_rate(peer, now_ms).map_err(|r| r.from(peer))?;
        let body = M::decode(s.body.as_slice())
            .map_err(|e| Rejected::new(Reason::BadBody, format!("body does not decode: {e}")).from(peer))?;
        Ok((peer, body))
    }

    fn check_nonce(&self, peer: PeerId, nonce: [u8; NONCE_LEN], ts: u64, now_ms: u64) -> Result<(), Rejected> {
        let mut seen = self.seen.lock();
        // Forget nonces whose timestamps left the window: a replay of them is
        // refused by the timestamp check instead.
        let horizon = now_ms.saturating_sub((self.policy.max_skew.as_millis() as u64).saturating_mul(2));
        while let Some(&(t, p, n)) = seen.order.front() {
            if t >= horizon {
                break;
            }
            seen.order.pop_front();
            seen.set.remove(&(p, n));
        }
        if seen.set.contains_key(&(peer, nonce)) {
            return Err(Rejected::new(Reason::ReplayedNonce, "replayed nonce"));
        }
        seen.set.insert((peer, nonce), ts);
        seen.order.push_back((ts.max(horizon), peer, nonce));
        Ok(())
    }

    fn check_rate(&self, peer: PeerId, now_ms: u64) -> Result<(), Rejected> {
        self.buckets.lock().take(peer, now_ms).map_err(|e| match e {
            Exhausted::Empty => Rejected::new(Reason::RateLimited, "rate limit exceeded"),
            Exhausted::TooManyKeys => {
                Rejected::new(Reason::TooManyIdentities, "too many active identities; retry shortly")
            }
        })
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
    use crate::refusal::Code;

    const M: &str = "/iota.v1.Orchestrator/Heartbeat";

    fn aud() -> Audience {
        Audience { run_id: 77, orchestrator: Identity::from_seed([200; 32]).peer_id() }
    }

    fn verifier(policy: AuthPolicy) -> Verifier {
        Verifier::new(policy, aud(), 0)
    }

    fn sign<M: Message>(id: &Identity, method: &str, body: &M, now: u64) -> Signed {
        super::sign(id, &aud(), method, body, now)
    }

    fn body() -> HeartbeatRequest {
        HeartbeatRequest { epoch: 3, in_flight: 1, tokens_per_s: 10.0, commitments: Vec::new() }
    }

    #[test]
    fn accepts_good_rejects_each_defect_with_its_code() {
        let v = verifier(AuthPolicy::default());
        let id = Identity::from_seed([5; 32]);
        let now = 1_000_000;
        let s = sign(&id, M, &body(), now);
        let (peer, b): (PeerId, HeartbeatRequest) = v.verify(M, &s, now + 5).unwrap();
        assert_eq!(peer, id.peer_id());
        assert_eq!(b, body());
        // replay
        assert_eq!(v.verify::<HeartbeatRequest>(M, &s, now + 6).unwrap_err().reason.code(), Code::AlreadyExists);
        // bad signature: body tampered
        let mut t = sign(&id, M, &body(), now);
        t.body[0] ^= 1;
        assert_eq!(v.verify::<HeartbeatRequest>(M, &t, now).unwrap_err().reason.code(), Code::Unauthenticated);
        // signature for another method
        let other = sign(&id, "/iota.v1.Orchestrator/Report", &body(), now);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &other, now).unwrap_err().reason.code(), Code::Unauthenticated);
        // stale and future timestamps
        let old = sign(&id, M, &body(), now - 31_000);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &old, now).unwrap_err().reason.code(), Code::Unauthenticated);
        let future = sign(&id, M, &body(), now + 6_000);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &future, now).unwrap_err().reason.code(), Code::Unauthenticated);
        // malformed envelope
        let mut short = sign(&id, M, &body(), now);
        short.peer_id.pop();
        assert_eq!(v.verify::<HeartbeatRequest>(M, &short, now).unwrap_err().reason.code(), Code::InvalidArgument);
    }

    #[test]
    fn rate_limit_per_identity() {
        let v = verifier(AuthPolicy { rate_per_s: 10.0, burst: 5.0, ..AuthPolicy::default() });
        let (a, b) = (Identity::from_seed([1; 32]), Identity::from_seed([2; 32]));
        let now = 50_000;
        for _ in 0..5 {
            v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now), now).unwrap();
        }
        let e = v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now), now).unwrap_err();
        assert_eq!(e.reason, Reason::RateLimited);
        // Another identity has its own bucket; time refills the first.
        v.verify::<HeartbeatRequest>(M, &sign(&b, M, &body(), now), now).unwrap();
        v.verify::<HeartbeatRequest>(M, &sign(&a, M, &body(), now + 200), now + 200).unwrap();
    }

    #[test]
    fn rate_buckets_of_idle_identities_are_forgotten() {
        let v = verifier(AuthPolicy { rate_per_s: 10.0, burst: 5.0, ..AuthPolicy::default() });
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
        assert_eq!(e.reason, Reason::RateLimited);
    }

    #[test]
    fn old_nonces_are_forgotten_but_stay_refused_by_time() {
        let v = verifier(AuthPolicy::default());
        let id = Identity::from_seed([3; 32]);
        let s = sign_with_nonce(&id, &aud(), M, &body(), 0, [9; NONCE_LEN]);
        v.verify::<HeartbeatRequest>(M, &s, 0).unwrap();
        // Much later the nonce table is pruned, yet the replay still fails (timestamp).
        let later = 10 * 60_000;
        let _ = v.verify::<HeartbeatRequest>(M, &sign(&id, M, &body(), later), later);
        assert!(v.seen.lock().set.len() == 1);
        assert_eq!(v.verify::<HeartbeatRequest>(M, &s, later).unwrap_err().reason.code(), Code::Unauthenticated);
    }

    #[test]
    fn a_signature_binds_the_run_the_orchestrator_and_the_start() {
        let id = Identity::from_seed([5; 32]);
        let now = 1_000_000;
        let v = verifier(AuthPolicy::default());
        // Signed for another run, or for another orchestrator of this run id.
        let other_run = Audience { run_id: 78, ..aud() };
        let other_orch = Audience { orchestrator: Identity::from_seed([201; 32]).peer_id(), ..aud() };
        for a in [other_run, other_orch] {
            let s = super::sign(&id, &a, M, &body(), now);
            assert_eq!(v.verify::<HeartbeatRequest>(M, &s, now).unwrap_err().reason, Reason::BadSignature);
        }
        // Accepted by one server process, replayed to its successor (which
        // has no memory of the nonce): refused, signed before it started.
        let s = sign(&id, M, &body(), now);
        v.verify::<HeartbeatRequest>(M, &s, now).unwrap();
        let restarted = Verifier::new(AuthPolicy::default(), aud(), now + 1_000);
        let e = restarted.verify::<HeartbeatRequest>(M, &s, now + 2_000).unwrap_err();
        assert_eq!(e.reason, Reason::BeforeStart);
        assert_eq!(e.peer, Some(id.peer_id()));
        restarted.verify::<HeartbeatRequest>(M, &sign(&id, M, &body(), now + 2_000), now + 2_000).unwrap();
    }

    #[test]
    fn server_messages_are_bound_to_their_request_and_order() {
        let orch = Identity::from_seed([200; 32]);
        let me = Identity::from_seed([5; 32]).peer_id();
        let nonce = [3u8; NONCE_LEN];
        let cmd = |seq| sign_server(&orch, &aud(), &me, "/iota.v1.Orchestrator/Subscribe", &nonce, seq, &body());
        let open = |m: &pb::ServerSigned, n: &[u8], seq| {
            open_server::<HeartbeatRequest>(&aud(), &me, "/iota.v1.Orchestrator/Subscribe", n, seq, m)
        };
        assert_eq!(open(&cmd(0), &nonce, 0).unwrap(), body());
        assert!(open(&cmd(1), &nonce, 0).unwrap_err().contains("replayed, reordered or dropped"));
        assert!(open(&cmd(0), &[4u8; NONCE_LEN], 0).is_err(), "moved to another stream");
        let mut forged = cmd(0);
        forged.body[0] ^= 1;
        assert!(open(&forged, &nonce, 0).is_err());
        let other = Identity::from_seed([5; 32]).peer_id();
        let impostor = Identity::from_seed([9; 32]);
        let fake = sign_server(&impostor, &aud(), &other, "/iota.v1.Orchestrator/Subscribe", &nonce, 0, &body());
        assert!(open(&fake, &nonce, 0).is_err());
        // Hello: checked against the pinned key.
        let h = sign_hello(&orch, 77, 5);
        assert_eq!(open_hello(&h, Some(orch.peer_id())).unwrap(), aud());
        assert!(open_hello(&h, Some(impostor.peer_id())).unwrap_err().contains("not the pinned"));
        let mut lie = h.clone();
        lie.run_id = 78;
        assert!(open_hello(&lie, None).is_err());
    }

    #[test]
    fn admission_lists_parse_or_name_the_bad_line() {
        let dir = std::env::temp_dir().join(format!("iota-admit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (Identity::from_seed([1; 32]).peer_id(), Identity::from_seed([2; 32]).peer_id());
        let file = dir.join("ok.txt");
        std::fs::write(&file, format!("# miners of run 7\n{}\n\n  {}  # the second one\n", a.to_hex(), b.to_hex()))
            .unwrap();
        assert_eq!(load_admitted(&file).unwrap(), HashSet::from([a, b]));
        std::fs::write(&file, format!("{}\nnot-a-key\n", a.to_hex())).unwrap();
        let e = format!("{:#}", load_admitted(&file).unwrap_err());
        assert!(e.contains("line 2") && e.contains("not-a-key"), "{e}");
        std::fs::write(&file, "# nobody\n").unwrap();
        assert!(format!("{:#}", load_admitted(&file).unwrap_err()).contains("admits nobody"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
