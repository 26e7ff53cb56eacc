//! Two real endpoints on 127.0.0.1: delivery, identity checks, hostile
//! frames and backpressure.

use std::sync::Arc;
use std::time::Duration;

use iota_core::wire::{Direction, FrameHeader, PROTOCOL_VERSION};
use iota_core::{Identity, WireCodec};
use iota_dataplane::frame::{self, FrameLimits, FrameMeta, RunContext};
use iota_dataplane::{Congestion, Endpoint, HostPool, PeerDirectory, TransportConfig};

const RUN: u64 = 77;

fn meta(direction: Direction, len: usize) -> FrameMeta {
    assert_eq!(len % 4, 0);
    FrameMeta {
        direction,
        codec: WireCodec::F32,
        stage: 1,
        epoch: 5,
        shard: 0,
        first_sample: 0,
        samples: 1,
        attempt: 0,
        shape: vec![(len / 4) as u32],
        answers: [0; 32],
    }
}

/// Deterministic payload of frame `i` on lane `d` (so the receiver can check it).
fn payload(d: Direction, i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (d as u64);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Mixed sizes: mostly small activations, every 97th a 256 KiB frame.
fn size_of(i: u64) -> usize {
    if i.is_multiple_of(97) { 256 << 10 } else { 64 + ((i * 2654435761) % 8192) as usize / 4 * 4 }
}

struct Node {
    ep: Endpoint,
    id_seed: [u8; 32],
}

impl Node {
    fn identity(&self) -> Identity {
        Identity::from_seed(self.id_seed)
    }
}

fn node(seed: u8, pool_bytes: usize, cfg: TransportConfig) -> Node {
    let id = Identity::from_seed([seed; 32]);
    let ctx = Arc::new(RunContext::new(RUN, FrameLimits::default()));
    ctx.set_epoch_window(5, 6);
    let ep =
        Endpoint::bind("127.0.0.1:0".parse().unwrap(), id, PeerDirectory::new(), ctx, HostPool::new(pool_bytes), cfg)
            .unwrap();
    Node { ep, id_seed: [seed; 32] }
}

/// Publishes each node to the other.
fn introduce(a: &Node, b: &Node) {
    a.ep.directory().insert(b.ep.peer_id(), Some(b.ep.local_addr().unwrap()));
    b.ep.directory().insert(a.ep.peer_id(), Some(a.ep.local_addr().unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_mixed_frames_both_ways_intact_once_in_order() {
    mixed_frames_both_ways(TransportConfig::default()).await;
}

/// The same under the model-based congestion controller miners use by
/// default (`iota-miner run --congestion bbr`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_mixed_frames_intact_under_bbr() {
    mixed_frames_both_ways(TransportConfig { congestion: Congestion::Bbr, ..TransportConfig::default() }).await;
}

async fn mixed_frames_both_ways(cfg: TransportConfig) {
    let a = Arc::new(node(1, 64 << 20, cfg.clone()));
    let b = Arc::new(node(2, 64 << 20, cfg));
    introduce(&a, &b);
    const PER_LANE: u64 = 2500; // 2 directions x 2 senders = 10,000 frames
    let mut senders = Vec::new();
    for (from, to) in [(a.clone(), b.clone()), (b.clone(), a.clone())] {
        for d in [Direction::Activation, Direction::ActivationGrad] {
            let (from, to) = (from.clone(), to.ep.peer_id());
            senders.push(tokio::spawn(async move {
                for i in 0..PER_LANE {
                    let len = size_of(i);
                    from.ep.send(to, &meta(d, len), payload(d, i, len).into()).await.unwrap();
                }
            }));
        }
    }
    let mut receivers = Vec::new();
    for (n, from) in [(a.clone(), b.ep.first_seq()), (b.clone(), a.ep.first_seq())] {
        receivers.push(tokio::spawn(async move {
            let mut next = [0u64; 2];
            for _ in 0..2 * PER_LANE {
                let f =
                    tokio::time::timeout(Duration::from_secs(60), n.ep.recv()).await.expect("frame in time").unwrap();
                let lane = f.header.direction as usize;
                let i = next[lane];
                assert_eq!(f.header.seq_no, from + i, "lane {lane}: in order, none lost or repeated");
                assert_eq!(&f.payload[..], &payload(f.header.direction, i, size_of(i))[..], "payload intact");
                next[lane] += 1;
            }
            next
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    for r in receivers {
        assert_eq!(r.await.unwrap(), [PER_LANE, PER_LANE]);
    }
    for n in [&a, &b] {
        let s = n.ep.stats();
        assert_eq!(s.frames_sent, 2 * PER_LANE);
        assert_eq!(s.frames_received, 2 * PER_LANE);
        assert_eq!(s.rejected_total(), 0);
        assert_eq!(s.payload_copies, s.frames_received, "one copy per frame: QUIC buffer -> pool buffer");
        assert_eq!(s.connects, 1, "one connection reused for all frames");
    }
}

#[tokio::test]
async fn peer_with_the_wrong_identity_is_refused() {
    let a = node(1, 1 << 20, TransportConfig::default());
    let b = node(2, 1 << 20, TransportConfig::default());
    introduce(&a, &b);
    // An impostor listens where a's directory says "b is here" (b's address
    // replaced), but holds another key.
    let impostor = node(3, 1 << 20, TransportConfig::default());
    impostor.ep.directory().insert(a.ep.peer_id(), Some(a.ep.local_addr().unwrap()));
    a.ep.directory().insert(b.ep.peer_id(), Some(impostor.ep.local_addr().unwrap()));
    let err = a.ep.send(b.ep.peer_id(), &meta(Direction::Activation, 16), vec![0; 16].into()).await.unwrap_err();
    assert!(err.to_string().contains("connecting"), "{err}");
    // A node nobody published cannot connect either (server refuses its certificate).
    let stranger = node(4, 1 << 20, TransportConfig::default());
    stranger.ep.directory().insert(b.ep.peer_id(), Some(b.ep.local_addr().unwrap()));
    let r = stranger.ep.send(b.ep.peer_id(), &meta(Direction::Activation, 16), vec![0; 16].into()).await;
    // The handshake fails, or the connection is closed before any frame is accepted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(r.is_err() || b.ep.stats().frames_received == 0);
    assert_eq!(b.ep.stats().frames_received, 0);
}

/// Builds one malformed frame of each class, signed by `id` unless the
/// defect is the signature.
fn malformed(id: &Identity, other: &Identity) -> Vec<(&'static str, Vec<u8>)> {
    let good_payload = payload(Direction::Activation, 0, 64);
    let base = frame::build_header(&meta(Direction::Activation, 64), RUN, 1000, &good_payload, id);
    let with = |h: &FrameHeader, p: &[u8]| {
        let mut v = frame::prefix_bytes(h);
        v.extend_from_slice(p);
        v
    };
    let resign = |f: &dyn Fn(&mut FrameHeader)| {
        let mut h = base.clone();
        f(&mut h);
        h.sign(id);
        h
    };
    let mut out = Vec::new();
    let mut bad_magic = with(&base, &good_payload);
    bad_magic[..4].copy_from_slice(b"NOPE");
    out.push(("bad_magic", bad_magic));
    let mut bad_len = with(&base, &good_payload);
    bad_len[4] ^= 0x40;
    out.push(("header_length", bad_len));
    let mut garbage = with(&base, &good_payload);
    let hl = iota_core::wire::header_len();
    for x in &mut garbage[8..8 + hl] {
        *x = 0xee;
    }
    out.push(("malformed", garbage));
    let mut wrong_hash = with(&base, &good_payload);
    let n = wrong_hash.len();
    wrong_hash[n - 1] ^= 1;
    out.push(("hash_mismatch", wrong_hash));
    let h = resign(&|h| h.shape[0] = 99);
    out.push(("shape", with(&h, &good_payload)));
    let h = resign(&|h| h.codec = 200);
    out.push(("unknown_codec", with(&h, &good_payload)));
    let h = resign(&|h| h.version = PROTOCOL_VERSION + 1);
    out.push(("version", with(&h, &good_payload)));
    let h = resign(&|h| h.epoch = 1);
    out.push(("stale_epoch", with(&h, &good_payload)));
    let h = resign(&|h| h.run_id = RUN + 1);
    out.push(("wrong_run", with(&h, &good_payload)));
    let mut h = base.clone();
    h.first_sample = 9; // changed after signing
    out.push(("bad_signature", with(&h, &good_payload)));
    let mut h = base.clone();
    h.sign(other); // a valid signature, but by someone other than the connection's peer
    out.push(("sender_mismatch", with(&h, &good_payload)));
    let h = frame::build_header(&meta(Direction::Activation, 64), RUN, 0, &good_payload, id);
    out.push(("replay", with(&h, &good_payload)));
    let mut truncated = with(&base, &good_payload);
    truncated.truncate(truncated.len() - 10);
    out.push(("truncated", truncated));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_frame_is_rejected_counted_and_the_next_valid_one_delivered() {
    let a = node(1, 1 << 20, TransportConfig::default());
    let b = node(2, 1 << 20, TransportConfig::default());
    introduce(&a, &b);
    let other = Identity::from_seed([42; 32]);
    let d = Direction::Activation;
    // Establish the lane so a replay of an older number is detectable.
    a.ep.send(b.ep.peer_id(), &meta(d, 64), payload(d, 0, 64).into()).await.unwrap();
    assert_eq!(b.ep.recv().await.unwrap().header.seq_no, a.ep.first_seq());
    let mut i = 1u64;
    for (kind, bytes) in malformed(&a.identity(), &other) {
        a.ep.send_raw(b.ep.peer_id(), &bytes).await.unwrap();
        // A valid frame right after, on the same connection.
        a.ep.send(b.ep.peer_id(), &meta(d, 64), payload(d, i, 64).into()).await.unwrap();
        let f =
            tokio::time::timeout(Duration::from_secs(10), b.ep.recv()).await.expect("valid frame delivered").unwrap();
        assert_eq!(f.header.seq_no, a.ep.first_seq() + i, "after {kind}");
        assert_eq!(&f.payload[..], &payload(d, i, 64)[..]);
        // The rejection is counted (it may land just after the valid frame).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while b.ep.stats().rejected(kind) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "{kind} not counted: {:?}", b.ep.stats().rejected);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        i += 1;
    }
    let s = b.ep.stats();
    assert_eq!(s.frames_received, i, "only the valid frames were delivered");
    assert_eq!(a.ep.stats().connects, 1, "the connection survived every hostile frame");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_receiver_bounds_memory() {
    let cfg = TransportConfig {
        recv_queue: 4,
        stream_window: 1 << 20,
        conn_window: 2 << 20,
        send_window: 2 << 20,
        frame_timeout: Duration::from_millis(1500),
        ..TransportConfig::default()
    };
    let pool_budget = 4 << 20;
    let a = Arc::new(node(1, pool_budget, cfg.clone()));
    let b = Arc::new(node(2, pool_budget, cfg));
    introduce(&a, &b);
    let d = Direction::WeightSlice;
    let len = 256 << 10;
    let body: bytes::Bytes = payload(d, 0, len).into();
    // b never calls recv(): the sender must stall instead of buffering.
    let mut sent = 0u64;
    let mut blocked = false;
    for _ in 0..200 {
        match a.ep.send(b.ep.peer_id(), &meta(d, len), body.clone()).await {
            Ok(_) => sent += 1,
            Err(e) => {
                assert!(e.to_string().contains("timed out"), "{e}");
                blocked = true;
                break;
            }
        }
    }
    assert!(blocked, "a stalled receiver must stall the sender ({sent} frames went through)");
    let pool = b.ep.pool();
    assert!(pool.high_water_bytes() <= pool_budget, "pool high water {} > budget", pool.high_water_bytes());
    assert!(b.ep.queued() <= 4);
    // Pool + queue + flow-control windows bound what was accepted.
    let bound = (pool_budget + (2 << 20) + (2 << 20)) / len + 8;
    assert!(sent as usize <= bound, "{sent} frames accepted, bound {bound}");
    // Draining the receiver frees the pool.
    let got = tokio::time::timeout(Duration::from_secs(5), b.ep.recv()).await.unwrap().unwrap();
    assert_eq!(got.header.seq_no, a.ep.first_seq());
    drop(got);
}

/// A miner restarted with the same identity numbers its frames after the
/// ones its peers already took (it does not start again at 0): they are
/// heard, not rejected as replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_restarted_with_the_same_identity_is_heard_again() {
    let b = node(2, 1 << 20, TransportConfig::default());
    let d = Direction::Activation;
    for life in 0..2u64 {
        let a = node(1, 1 << 20, TransportConfig::default());
        introduce(&a, &b);
        for i in 0..3 {
            a.ep.send(b.ep.peer_id(), &meta(d, 64), payload(d, i, 64).into()).await.unwrap();
            let f = tokio::time::timeout(Duration::from_secs(10), b.ep.recv())
                .await
                .unwrap_or_else(|_| panic!("life {life}: frame {i} not heard"))
                .unwrap();
            assert_eq!(f.header.seq_no, a.ep.first_seq() + i);
        }
        a.ep.close();
    }
    assert_eq!(b.ep.stats().rejected("replay"), 0);
}

/// The record of sent frames (a miner's evidence) holds exactly the frame
/// that went out, signed as sent, and nothing unless it was turned on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sent_frame_tap_records_exactly_the_frame_sent_and_only_when_on() {
    use iota_dataplane::sent_frames::{SentFrameKey, TapLimits};
    let a = node(1, 16 << 20, TransportConfig::default());
    let b = node(2, 16 << 20, TransportConfig::default());
    introduce(&a, &b);
    let key = |m: &FrameMeta| SentFrameKey {
        epoch: u64::from(m.epoch),
        shard: m.shard,
        first_sample: m.first_sample,
        attempt: m.attempt,
        direction: m.direction,
    };
    // Off: nothing is recorded.
    assert!(a.ep.sent_frames().is_none());
    let m0 = meta(Direction::Activation, 64);
    a.ep.send(b.ep.peer_id(), &m0, payload(Direction::Activation, 0, 64).into()).await.unwrap();
    b.ep.recv().await.unwrap();
    assert!(a.ep.sent_frames().is_none());

    let tap = a.ep.tap_sent_frames(TapLimits::default());
    assert!(Arc::ptr_eq(&tap, &a.ep.tap_sent_frames(TapLimits { max_frames: 1, max_bytes: 1 })), "turned on once");
    let mut m1 = meta(Direction::Activation, 256);
    (m1.shard, m1.first_sample, m1.attempt, m1.answers) = (3, 40, 1, [9; 32]);
    let p1 = payload(Direction::Activation, 1, 256);
    let id = a.ep.send(b.ep.peer_id(), &m1, p1.clone().into()).await.unwrap();
    let mut g1 = m1.clone();
    g1.direction = Direction::ActivationGrad;
    let pg = payload(Direction::ActivationGrad, 1, 256);
    a.ep.send(b.ep.peer_id(), &g1, pg.clone().into()).await.unwrap();
    // Merge traffic is not pipeline work: not recorded.
    let w = meta(Direction::WeightSlice, 64);
    a.ep.send(b.ep.peer_id(), &w, payload(Direction::WeightSlice, 2, 64).into()).await.unwrap();
    let mut received = Vec::new();
    for _ in 0..3 {
        received.push(tokio::time::timeout(Duration::from_secs(10), b.ep.recv()).await.unwrap().unwrap());
    }
    assert_eq!(tap.size().0, 2);
    assert!(tap.get(&key(&m0)).is_none(), "sent before the tap was on");
    assert!(tap.get(&key(&w)).is_none());

    let sent = tap.get(&key(&m1)).expect("the activation is recorded");
    let whole = sent.whole();
    let (h, p) = frame::decode_frame(&whole, b.ep.run_context(), a.ep.peer_id()).expect("a valid signed frame");
    assert_eq!(h.frame_id(), id, "the frame exactly as it went out");
    assert_eq!(p, &p1[..]);
    assert_eq!(h.payload_hash, *blake3::hash(&p1).as_bytes());
    assert_eq!((h.shard, h.first_sample, h.attempt, h.answers), (3, 40, 1, [9; 32]));
    assert_eq!((h.direction, h.epoch, h.run_id, h.sender), (Direction::Activation, 5, RUN, a.ep.peer_id().0));
    assert!(h.seq_no >= a.ep.first_seq());
    let got = received.iter().find(|f| f.header.direction == Direction::Activation).unwrap();
    assert_eq!(got.header, h, "what the receiver accepted");
    let grad = tap.get(&key(&g1)).expect("the gradient is recorded");
    assert_eq!(grad.payload, pg);
    assert_eq!(frame::decode_frame(&grad.whole(), b.ep.run_context(), a.ep.peer_id()).unwrap().1, &pg[..]);
}
