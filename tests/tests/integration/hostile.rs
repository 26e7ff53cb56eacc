//! A hostile client of the orchestrator, written from docs/PROTOCOL.md: it
//! speaks raw gRPC (the generated stubs only) and signs with its own code,
//! not the project's client helpers, so these tests exercise the wire as
//! documented. One test per finding of the control-plane review.

use std::sync::Arc;
use std::time::Duration;

use iota_control::orchestrator::{Orchestrator, Phase};
use iota_control::service::OrchestratorService;
use iota_control::state_db::StateDb;
use iota_core::Identity;
use iota_protocol::RunSpec;
use iota_protocol::auth::AuthPolicy;
use iota_protocol::pb::orchestrator_client::OrchestratorClient;
use iota_protocol::pb::orchestrator_server::{Orchestrator as _, OrchestratorServer};
use iota_protocol::pb::{self};
use prost::Message;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::Channel;

use iota_model::alloc::live_on_this_thread;

const REGISTER: &str = "/iota.v1.Orchestrator/Register";
const HEARTBEAT: &str = "/iota.v1.Orchestrator/Heartbeat";
const SUBSCRIBE: &str = "/iota.v1.Orchestrator/Subscribe";
const STATUS: &str = "/iota.v1.Orchestrator/Status";

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// What a caller needs to know of the server, from its Hello.
#[derive(Clone, Copy)]
struct Server {
    run_id: u64,
    orchestrator: [u8; 32],
}

/// A caller with its own Ed25519 key (ring, not the project's Identity).
struct Caller {
    key: Ed25519KeyPair,
    id: [u8; 32],
}

impl Caller {
    fn new(seed: u64) -> Caller {
        let mut s = [7u8; 32];
        s[..8].copy_from_slice(&seed.to_le_bytes());
        let key = Ed25519KeyPair::from_seed_unchecked(&s).unwrap();
        let id = key.public_key().as_ref().try_into().unwrap();
        Caller { key, id }
    }

    /// PROTOCOL.md, "Signed requests": "iota-rs rpc v2\0" || run_id (u64 LE)
    /// || orchestrator id || method || "\0" || timestamp (u64 LE) || nonce
    /// || blake3(body).
    fn sign_at(&self, srv: Server, method: &str, body: &impl Message, ts: u64, nonce: [u8; 16]) -> pb::Signed {
        let body = body.encode_to_vec();
        let mut m = b"iota-rs rpc v2\0".to_vec();
        m.extend_from_slice(&srv.run_id.to_le_bytes());
        m.extend_from_slice(&srv.orchestrator);
        m.extend_from_slice(method.as_bytes());
        m.push(0);
        m.extend_from_slice(&ts.to_le_bytes());
        m.extend_from_slice(&nonce);
        m.extend_from_slice(blake3::hash(&body).as_bytes());
        pb::Signed {
            peer_id: self.id.to_vec(),
            timestamp_ms: ts,
            nonce: nonce.to_vec(),
            body,
            signature: self.key.sign(&m).as_ref().to_vec(),
        }
    }

    fn sign(&self, srv: Server, method: &str, body: &impl Message) -> pb::Signed {
        let nonce: [u8; 16] = rand_bytes();
        self.sign_at(srv, method, body, now_ms(), nonce)
    }
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).unwrap();
    b
}

/// PROTOCOL.md, "Signed replies and commands": the orchestrator signs
/// "iota-rs server v2\0" || run_id || orchestrator id || recipient id ||
/// method || "\0" || the request's nonce || seq (u64 LE) || blake3(body).
fn server_signature_ok(srv: Server, to: &[u8; 32], method: &str, nonce: &[u8], m: &pb::ServerSigned) -> bool {
    let mut b = b"iota-rs server v2\0".to_vec();
    b.extend_from_slice(&srv.run_id.to_le_bytes());
    b.extend_from_slice(&srv.orchestrator);
    b.extend_from_slice(to);
    b.extend_from_slice(method.as_bytes());
    b.push(0);
    b.extend_from_slice(nonce);
    b.extend_from_slice(&m.seq.to_le_bytes());
    b.extend_from_slice(blake3::hash(&m.body).as_bytes());
    UnparsedPublicKey::new(&ED25519, &srv.orchestrator).verify(&b, &m.signature).is_ok()
}

fn spec(run_id: u64, stages: u32, replicas: u32) -> RunSpec {
    RunSpec {
        run_id,
        stages,
        replicas,
        micro_batches_per_epoch: 4,
        batch: 2,
        n_shards: 2,
        route_timeout_ms: 60_000,
        heartbeat_timeout_ms: 60_000,
        phase_timeout_ms: 60_000,
        merge: Default::default(),
        ..RunSpec::default()
    }
}

fn service(spec: RunSpec, db: Option<&std::path::Path>, seed: u8) -> OrchestratorService {
    OrchestratorService::new(
        Orchestrator::new(spec).unwrap(),
        db.map(|d| StateDb::open(d).unwrap()),
        "{}".into(),
        AuthPolicy::default(),
        Arc::new(Identity::from_seed([seed; 32])),
    )
    .unwrap()
}

async fn serve(svc: OrchestratorService) -> (OrchestratorClient<Channel>, Server, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(OrchestratorServer::new(svc))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
    });
    let mut rpc = OrchestratorClient::connect(url).await.unwrap();
    let h = rpc.hello(pb::HelloRequest {}).await.unwrap().into_inner();
    assert_eq!(h.protocol, "iota-rs/2");
    let srv = Server { run_id: h.run_id, orchestrator: h.orchestrator_id.try_into().unwrap() };
    (rpc, srv, task)
}

fn register_body(addr: &str, tps: f64, device: &str) -> pb::RegisterRequest {
    pb::RegisterRequest {
        role: pb::Role::Miner as i32,
        data_addr: addr.into(),
        tokens_per_s: tps,
        device: device.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_small_order_key_with_a_universal_signature_is_refused() {
    let (mut rpc, srv, _t) = serve(service(spec(1, 2, 1), None, 1)).await;
    // The identity point as the key, and R = identity, S = 0: "valid" for
    // every message under a verifier that does not check the key's order.
    let mut weak = [0u8; 32];
    weak[0] = 1;
    let mut sig = vec![0u8; 64];
    sig[0] = 1;
    let body = register_body("127.0.0.1:9000", 1.0, "cpu").encode_to_vec();
    let env = pb::Signed { peer_id: weak.to_vec(), timestamp_ms: now_ms(), nonce: vec![1; 16], body, signature: sig };
    let e = rpc.register(env).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.message().contains("acceptable Ed25519 key"), "{}", e.message());
    let _ = srv;
}

#[tokio::test]
async fn envelopes_do_not_replay_across_restarts_or_runs() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.sqlite");
    let (mut rpc, srv, task) = serve(service(spec(1, 2, 1), Some(&db), 1)).await;
    let c = Caller::new(1);
    let env = c.sign(srv, REGISTER, &register_body("127.0.0.1:9000", 1.0, "cpu"));
    rpc.register(env.clone()).await.unwrap();
    assert_eq!(rpc.register(env.clone()).await.unwrap_err().code(), Code::AlreadyExists);
    // Dated ahead of the server's clock: 3 s is taken, 10 s is not.
    let hb = pb::HeartbeatRequest { tokens_per_s: 1.0, ..Default::default() };
    let ahead = c.sign_at(srv, HEARTBEAT, &hb, now_ms() + 3_000, rand_bytes());
    rpc.heartbeat(ahead.clone()).await.unwrap();
    let far = c.sign_at(srv, HEARTBEAT, &hb, now_ms() + 10_000, rand_bytes());
    assert_eq!(rpc.heartbeat(far).await.unwrap_err().code(), Code::Unauthenticated);
    // The orchestrator restarts from its state (same key, same run); its
    // nonce memory is gone, but the envelopes predate it: the one signed
    // before the restart, and (issue 61) the one dated ahead, signed
    // before it and dated after it, which the first process took.
    task.abort();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (mut rpc2, srv2, _t2) = serve(service(spec(1, 2, 1), Some(&db), 1)).await;
    assert_eq!((srv2.run_id, srv2.orchestrator), (srv.run_id, srv.orchestrator));
    let e = rpc2.register(env.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("before this orchestrator started"), "{}", e.message());
    let e = rpc2.heartbeat(ahead).await.unwrap_err();
    assert!(e.message().contains("before this orchestrator started"), "the replay dated ahead: {e}");
    // Freshly signed, it goes through once the restart's window (5 s,
    // `AuthPolicy::max_ahead`) has passed; until then it is asked again.
    let t0 = std::time::Instant::now();
    loop {
        match rpc2.register(c.sign(srv2, REGISTER, &register_body("127.0.0.1:9000", 1.0, "cpu"))).await {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e}");
                assert!(t0.elapsed() < Duration::from_secs(8), "still refused: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    // Another run's orchestrator (another key, another run id) refuses an
    // envelope signed for this one, even fresh.
    let (mut other, _srv3, _t3) = serve(service(spec(2, 2, 1), None, 2)).await;
    let fresh = c.sign(srv, REGISTER, &register_body("127.0.0.1:9000", 1.0, "cpu"));
    assert_eq!(other.register(fresh).await.unwrap_err().code(), Code::Unauthenticated);
}

#[tokio::test]
async fn every_field_is_checked_and_every_refusal_counted() {
    let (mut rpc, srv, _t) = serve(service(spec(1, 2, 1), None, 1)).await;
    let c = Caller::new(3);
    let huge = "x".repeat(512 << 10);
    for (body, field) in [
        (register_body("", 1.0, "cpu"), "data_addr"),
        (register_body("not an address", 1.0, "cpu"), "data_addr"),
        (register_body(&huge, 1.0, "cpu"), "data_addr"),
        (register_body("127.0.0.1:9000", 1.0, &huge), "device"),
        (register_body("127.0.0.1:9000", f64::NAN, "cpu"), "tokens_per_s"),
    ] {
        let e = rpc.register(c.sign(srv, REGISTER, &body)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    rpc.register(c.sign(srv, REGISTER, &register_body("127.0.0.1:9000", 1.0, "cpu"))).await.unwrap();
    for (epoch, tps, in_flight, field) in [
        (0, f64::NAN, 0, "tokens_per_s"),
        (0, -1.0, 0, "tokens_per_s"),
        (0, f64::INFINITY, 0, "tokens_per_s"),
        (0, 1.0, u32::MAX, "in_flight"),
        // Past the run's epoch (0) + 1 (issue 61: it was accepted).
        (u64::MAX, 1.0, 0, "epoch"),
        (2, 1.0, 0, "epoch"),
    ] {
        let body = pb::HeartbeatRequest { epoch, in_flight, tokens_per_s: tps, ..Default::default() };
        let e = rpc.heartbeat(c.sign(srv, HEARTBEAT, &body)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    // Bodies past the server's limits: 1 MiB (ours, counted) and gRPC's own
    // 4 MiB message limit (refused by tonic before anything else runs).
    let mut big = c.sign(srv, HEARTBEAT, &pb::HeartbeatRequest::default());
    big.body = vec![0; 2 << 20];
    assert_eq!(rpc.heartbeat(big).await.unwrap_err().code(), Code::InvalidArgument);
    let mut huge = c.sign(srv, HEARTBEAT, &pb::HeartbeatRequest::default());
    huge.body = vec![0; 5 << 20];
    let e = rpc.heartbeat(huge).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e}");
    // A forgery and a replay, then ask what was refused.
    let mut forged = c.sign(srv, HEARTBEAT, &pb::HeartbeatRequest::default());
    forged.body.push(1);
    assert_eq!(rpc.heartbeat(forged).await.unwrap_err().code(), Code::Unauthenticated);
    let once = c.sign(srv, HEARTBEAT, &pb::HeartbeatRequest::default());
    rpc.heartbeat(once.clone()).await.unwrap();
    assert_eq!(rpc.heartbeat(once).await.unwrap_err().code(), Code::AlreadyExists);
    let st = rpc.status(c.sign(srv, STATUS, &pb::StatusRequest {})).await.unwrap().into_inner();
    assert_eq!(st.refusals.get("invalid_field"), Some(&11), "{:?}", st.refusals);
    assert_eq!(st.refusals.get("bad_signature"), Some(&1), "{:?}", st.refusals);
    assert_eq!(st.refusals.get("replayed_nonce"), Some(&1), "{:?}", st.refusals);
    assert_eq!(st.refusals.get("body_too_large"), Some(&1), "{:?}", st.refusals);
}

#[tokio::test]
async fn replies_and_commands_are_signed_by_the_orchestrator() {
    let (mut rpc, srv, _t) = serve(service(spec(1, 1, 1), None, 1)).await;
    let c = Caller::new(4);
    let env = c.sign(srv, REGISTER, &register_body("127.0.0.1:9000", 1.0, "cpu"));
    let reply = rpc.register(env.clone()).await.unwrap().into_inner();
    assert_eq!(reply.seq, 0);
    assert!(server_signature_ok(srv, &c.id, REGISTER, &env.nonce, &reply));
    let r = pb::RegisterReply::decode(reply.body.as_slice()).unwrap();
    assert_eq!(r.run_id, 1);
    // The reply is bound to its request: under another nonce it does not verify.
    assert!(!server_signature_ok(srv, &c.id, REGISTER, &[0; 16], &reply));
    // Commands: numbered along the stream, each signed for this stream.
    let sub = c.sign(srv, SUBSCRIBE, &pb::SubscribeRequest {});
    let mut stream = rpc.subscribe(sub.clone()).await.unwrap().into_inner();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let m = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
        assert_eq!(m.seq, seen.len() as u64);
        assert!(server_signature_ok(srv, &c.id, SUBSCRIBE, &sub.nonce, &m));
        let mut tampered = m.clone();
        tampered.body[0] ^= 1;
        assert!(!server_signature_ok(srv, &c.id, SUBSCRIBE, &sub.nonce, &tampered));
        seen.push(pb::Command::decode(m.body.as_slice()).unwrap().kind.unwrap());
    }
    assert!(matches!(seen[0], pb::command::Kind::Assign(_)), "the assignment comes first");
}

#[tokio::test]
async fn registered_identities_that_never_listen_do_not_start_the_run() {
    let svc = service(spec(1, 3, 2), None, 1);
    let (mut rpc, srv, _t) = serve(svc.clone()).await;
    for i in 0..6 {
        let c = Caller::new(100 + i);
        rpc.register(c.sign(srv, REGISTER, &register_body(&format!("127.0.0.1:{}", 9100 + i), 1e6, "gpu")))
            .await
            .unwrap();
    }
    assert_eq!(svc.with_state(|o| o.phase().clone()), Phase::Waiting);
    assert_eq!(svc.with_state(|o| o.micro_batches().count()), 0, "nothing routed to them");
}

/// 2,000 fresh identities register against a run that takes 1,200: the
/// rest are queued in order (signed replies naming each one's place), and
/// what the orchestrator keeps grows linearly, well
/// under 64 KiB per registered miner (it grew super-linearly, to ~9 MiB per
/// miner at 500). Allocated bytes are counted on this thread, where the
/// service runs.
#[test]
fn registration_cost_is_bounded_and_linear() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut sp = spec(1, 2, 1);
        sp.miners_per_stage_cap = 600;
        let svc = service(sp, None, 1);
        let h = svc.hello(tonic::Request::new(pb::HelloRequest {})).await.unwrap().into_inner();
        let srv = Server { run_id: h.run_id, orchestrator: h.orchestrator_id.try_into().unwrap() };
        let base = live_on_this_thread();
        let (mut accepted, mut queued, mut marks) = (0u32, 0u32, Vec::new());
        for i in 0..2_000u64 {
            let c = Caller::new(10_000 + i);
            let body = register_body(&format!("127.0.0.1:{}", 10_000 + i), 100.0, "cuda:0 (bf16 gemms)");
            match svc.register(tonic::Request::new(c.sign(srv, REGISTER, &body))).await {
                Ok(r) => {
                    let reply = <pb::RegisterReply as prost::Message>::decode(r.into_inner().body.as_slice()).unwrap();
                    match reply.queued {
                        Some(q) => {
                            queued += 1;
                            assert_eq!((q.queue_position, q.queue_length), (queued, queued), "registration {i}");
                        }
                        None => accepted += 1,
                    }
                }
                Err(e) => panic!("registration {i}: {e}"),
            }
            if [300, 600, 1_200].contains(&accepted)
                && marks.len() < 3
                && marks.last().map(|m: &(u32, i64)| m.0) != Some(accepted)
            {
                marks.push((accepted, live_on_this_thread() - base));
            }
        }
        assert_eq!((accepted, queued), (1_200, 800));
        assert_eq!(svc.with_state(|o| o.waitlist().len()), 800);
        let per_miner: Vec<f64> = marks.iter().map(|&(n, b)| b as f64 / n as f64).collect();
        println!(
            "live bytes per registered miner at {:?}: {per_miner:?}",
            marks.iter().map(|m| m.0).collect::<Vec<_>>()
        );
        for &p in &per_miner {
            assert!(p < 64.0 * 1024.0, "{p} bytes per miner");
        }
        // Linear: the cost of a miner does not grow with how many came before.
        assert!(per_miner[2] < 2.0 * per_miner[0], "per-miner cost grew: {per_miner:?}");
    });
}

/// A run that admits listed identities only: a listed miner registers; an
/// unlisted one is refused PERMISSION_DENIED `not_admitted`; 2,000 fresh
/// identities are all refused and leave nothing behind (no rate bucket,
/// no nonce, no registration), measured by this thread's live bytes.
#[test]
fn unlisted_identities_are_refused_and_cost_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let listed = Caller::new(7);
        let admitted: std::collections::HashSet<iota_core::PeerId> = [iota_core::PeerId(listed.id)].into();
        let policy = AuthPolicy { admitted: Some(Arc::new(admitted)), ..AuthPolicy::default() };
        let svc = OrchestratorService::new(
            Orchestrator::new(spec(1, 2, 1)).unwrap(),
            None,
            "{}".into(),
            policy,
            Arc::new(Identity::from_seed([1; 32])),
        )
        .unwrap();
        let h = svc.hello(tonic::Request::new(pb::HelloRequest {})).await.unwrap().into_inner();
        let srv = Server { run_id: h.run_id, orchestrator: h.orchestrator_id.try_into().unwrap() };
        let body = register_body("127.0.0.1:9001", 1.0, "cpu");
        svc.register(tonic::Request::new(listed.sign(srv, REGISTER, &body))).await.expect("the listed miner");
        let stranger = Caller::new(8);
        let e = svc.register(tonic::Request::new(stranger.sign(srv, REGISTER, &body))).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e}");
        assert!(e.message().contains("not admitted"), "{e}");

        // The stranger above warmed up what a refusal allocates (the audit counters).
        let base = live_on_this_thread();
        for i in 0..2_000u64 {
            let c = Caller::new(20_000 + i);
            let body = register_body(&format!("127.0.0.1:{}", 20_000 + i), 1.0, "cpu");
            let e = svc.register(tonic::Request::new(c.sign(srv, REGISTER, &body))).await.unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied);
        }
        let kept = live_on_this_thread() - base;
        println!("live bytes after 2,000 refused identities: {kept}");
        assert!(kept < 16 * 1024, "{kept} bytes kept for identities that were never admitted");
        assert_eq!(svc.refusals().get("not_admitted"), Some(&2_001));
        assert_eq!(svc.with_state(|o| o.miners().count()), 1, "only the listed miner is known");
    });
}

const VALIDATE: &str = "/iota.v1.Orchestrator/Validate";

/// Issue 13: the Validate RPC takes votes only from validators the run
/// lists; malformed or out-of-place verdicts and asks get a clear status
/// and change nothing.
#[tokio::test]
async fn validator_reports_from_strangers_or_malformed_ones_change_nothing() {
    use pb::validator_report::Kind;
    let (v, stranger, miner) = (Caller::new(40), Caller::new(41), Caller::new(42));
    let mut sp = spec(5, 2, 1);
    sp.validation.validators = vec![iota_protocol::ValidatorStake { peer: iota_core::PeerId(v.id), stake: 10 }];
    let svc = service(sp, None, 4);
    let (mut rpc, srv, _t) = serve(svc.clone()).await;
    let vreg = pb::RegisterRequest { role: pb::Role::Validator as i32, device: "cpu".into(), ..Default::default() };
    // Only a listed identity registers as a validator, and without a data address.
    let e = rpc.register(stranger.sign(srv, REGISTER, &vreg)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    let with_addr = pb::RegisterRequest { data_addr: "127.0.0.1:9000".into(), ..vreg.clone() };
    assert_eq!(rpc.register(v.sign(srv, REGISTER, &with_addr)).await.unwrap_err().code(), Code::InvalidArgument);
    rpc.register(v.sign(srv, REGISTER, &vreg)).await.unwrap();
    rpc.register(miner.sign(srv, REGISTER, &register_body("127.0.0.1:9001", 1.0, "cpu"))).await.unwrap();

    let verdict = |miner: Vec<u8>, reason: &str| pb::ValidatorReport {
        kind: Some(Kind::Verdict(pb::Verdict {
            epoch: 0,
            miner,
            check: pb::Check::Recompute as i32,
            guilty: true,
            samples: 1,
            evidence_hash: Vec::new(),
            reason: reason.into(),
            proof: Vec::new(),
            step_proof_hash: Vec::new(),
        })),
    };
    // A miner (or anyone else) voting: refused for its role.
    let e = rpc.validate(miner.sign(srv, VALIDATE, &verdict(miner.id.to_vec(), ""))).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    // Malformed: a short miner id, a forged log line, an oversized reason, no kind.
    for (body, field) in [
        (verdict(vec![1; 5], ""), "verdict.miner"),
        (verdict(miner.id.to_vec(), "x\n[ERROR] forged"), "verdict.reason"),
        (verdict(miner.id.to_vec(), &"x".repeat(100_000)), "verdict.reason"),
        (pb::ValidatorReport { kind: None }, "kind"),
    ] {
        let e = rpc.validate(v.sign(srv, VALIDATE, &body)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    // Well-formed but out of place: a miner the run does not have, an ask
    // with no round open, a future epoch.
    let e = rpc.validate(v.sign(srv, VALIDATE, &verdict(vec![9; 32], ""))).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    let ask = pb::ValidatorReport {
        kind: Some(Kind::Ask(pb::EvidenceAsk {
            epoch: 0,
            miner: miner.id.to_vec(),
            items: vec![pb::WorkRef { shard: 0, first_sample: 0, attempt: 0, inner_step: false, trace_step: 0 }],
        })),
    };
    assert_eq!(rpc.validate(v.sign(srv, VALIDATE, &ask)).await.unwrap_err().code(), Code::FailedPrecondition);
    let mut future = verdict(miner.id.to_vec(), "");
    if let Some(Kind::Verdict(x)) = future.kind.as_mut() {
        x.epoch = 7;
    }
    assert_eq!(rpc.validate(v.sign(srv, VALIDATE, &future)).await.unwrap_err().code(), Code::FailedPrecondition);
    // Nothing changed.
    svc.with_state(|o| {
        assert!(o.verdicts().is_empty());
        assert_eq!(o.counters().convictions, 0);
        assert!(o.miners().all(|m| !m.convicted));
    });
    // A well-formed vote counts (one validator holds all the stake).
    rpc.validate(v.sign(srv, VALIDATE, &verdict(miner.id.to_vec(), "recomputed output differs"))).await.unwrap();
    svc.with_state(|o| {
        assert_eq!(o.verdicts().len(), 1);
        assert_eq!(o.counters().convictions, 1);
        // The stored vote is the validator's own signed request.
        let env = pb::Signed::decode(o.verdicts()[0].signed.as_slice()).unwrap();
        assert_eq!(env.peer_id, v.id.to_vec());
    });
}
