//! The orchestrator over real gRPC on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use iota_control::orchestrator::{Orchestrator, Phase};
use iota_control::service::OrchestratorService;
use iota_control::state_db::StateDb;
use iota_core::Identity;
use iota_protocol::RunSpec;
use iota_protocol::auth::{AuthPolicy, now_ms, sign, sign_with_nonce};
use iota_protocol::client::ControlClient;
use iota_protocol::pb;
use tonic::Code;

fn spec() -> RunSpec {
    RunSpec {
        run_id: 42,
        stages: 2,
        epochs: 2,
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

/// The orchestrator's identity in these tests.
fn orch_id() -> Arc<Identity> {
    Arc::new(Identity::from_seed([100; 32]))
}

/// The orchestrator service of these tests (its state in `db` when given).
fn service(db: Option<&std::path::Path>) -> OrchestratorService {
    OrchestratorService::new(
        Orchestrator::new(spec()).unwrap(),
        db.map(|d| StateDb::open(d).unwrap()),
        "{}".into(),
        AuthPolicy::default(),
        orch_id(),
    )
    .unwrap()
}

/// Serves `svc` on a free port over TLS, as the orchestrator does; returns
/// its URL and the server task.
async fn serve(svc: OrchestratorService) -> (String, tokio::task::JoinHandle<()>) {
    iota_control::swarm::serve(svc, "127.0.0.1:0".parse().unwrap(), false).await.unwrap()
}

async fn client(url: &str, seed: u8) -> ControlClient {
    ControlClient::connect(url.to_string(), Arc::new(Identity::from_seed([seed; 32])), Some(orch_id().peer_id()))
        .await
        .unwrap()
}

#[tokio::test]
async fn hostile_requests_get_the_right_status() {
    let svc = service(None);
    let (url, _server) = serve(svc).await;
    let mut c = client(&url, 1).await;
    let id = c.identity().clone();

    // Not registered yet.
    let e = c.heartbeat(0, 0, 1.0, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");

    let reply = c.register("127.0.0.1:9000".into(), 10.0, "cpu".into()).await.unwrap();
    assert_eq!(reply.run_id, 42);
    assert_eq!(reply.run_config_json, "{}");

    let m = "/iota.v1.Orchestrator/Heartbeat";
    let body = pb::HeartbeatRequest { epoch: 0, in_flight: 0, tokens_per_s: 1.0, ..Default::default() };
    // A good request, then the very same envelope again.
    let good = sign(&id, c.audience(), m, &body, now_ms());
    c.raw_heartbeat(good.clone()).await.unwrap();
    assert_eq!(c.raw_heartbeat(good).await.unwrap_err().code(), Code::AlreadyExists);
    // Bad signature.
    let mut bad = sign(&id, c.audience(), m, &body, now_ms());
    bad.signature[3] ^= 0x10;
    assert_eq!(c.raw_heartbeat(bad).await.unwrap_err().code(), Code::Unauthenticated);
    // Stale timestamp (an hour old), correctly signed.
    let stale = sign_with_nonce(&id, c.audience(), m, &body, now_ms() - 3_600_000, [7; 16]);
    let e = c.raw_heartbeat(stale).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("stale timestamp"), "{}", e.message());
    // Someone else's identity with our signature.
    let mut forged = sign(&id, c.audience(), m, &body, now_ms());
    forged.peer_id = Identity::from_seed([2; 32]).peer_id().0.to_vec();
    assert_eq!(c.raw_heartbeat(forged).await.unwrap_err().code(), Code::Unauthenticated);
    // Garbage body under a valid signature.
    let mut junk = sign(&id, c.audience(), m, &body, now_ms());
    junk.body = vec![0xff; 3];
    junk.signature = id
        .sign(&iota_protocol::auth::signing_bytes(c.audience(), m, junk.timestamp_ms, &junk.nonce, &junk.body))
        .to_vec();
    assert_eq!(c.raw_heartbeat(junk).await.unwrap_err().code(), Code::InvalidArgument);
    // Status works for anyone with a valid signature.
    let st = client(&url, 3).await.status().await.unwrap();
    assert_eq!(st.run_id, 42);
}

#[tokio::test]
async fn subscribers_receive_assignments_and_routes() {
    let svc = service(None);
    let (url, _server) = serve(svc.clone()).await;
    let mut a = client(&url, 1).await;
    let mut b = client(&url, 2).await;
    a.register("127.0.0.1:1".into(), 1.0, "cpu".into()).await.unwrap();
    let mut sa = a.subscribe().await.unwrap();
    b.register("127.0.0.1:2".into(), 1.0, "cpu".into()).await.unwrap();
    let mut sb = b.subscribe().await.unwrap();
    // Both stages filled: training starts and the first micro-batch is routed.
    let mut kinds = Vec::new();
    for s in [&mut sa, &mut sb] {
        loop {
            let cmd = tokio::time::timeout(Duration::from_secs(5), s.next()).await.unwrap().unwrap().unwrap();
            let k = cmd.kind.unwrap();
            let is_route = matches!(k, pb::command::Kind::Route(_));
            kinds.push(k);
            if is_route {
                break;
            }
        }
    }
    assert!(kinds.iter().any(|k| matches!(k, pb::command::Kind::Assign(a) if a.peers.len() == 2)));
    assert!(kinds.iter().any(|k| matches!(k, pb::command::Kind::Phase(p) if p.phase == pb::Phase::Training as i32)));
    assert_eq!(svc.with_state(|o| o.phase().clone()), Phase::Training);
}

#[tokio::test]
async fn restarted_orchestrator_resumes_from_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.sqlite");
    let svc = service(Some(db.as_path()));
    let (url, server) = serve(svc.clone()).await;
    let mut a = client(&url, 1).await;
    let mut b = client(&url, 2).await;
    a.register("127.0.0.1:1".into(), 1.0, "cpu".into()).await.unwrap();
    b.register("127.0.0.1:2".into(), 1.0, "cpu".into()).await.unwrap();
    // Registered but not listening: not yet miners of the run.
    assert_eq!(svc.with_state(|o| o.phase().clone()), Phase::Waiting);
    let _sa = a.subscribe().await.unwrap();
    let _sb = b.subscribe().await.unwrap();
    let before = svc.with_state(|o| (o.epoch(), o.phase().clone(), o.miners().count()));
    assert_eq!(before, (0, Phase::Training, 2));
    // Crash: the server goes away without a chance to save anything more.
    server.abort();
    drop(svc);
    let svc2 = service(Some(db.as_path()));
    let after = svc2.with_state(|o| (o.epoch(), o.phase().clone(), o.miners().count()));
    assert_eq!(after, before, "the run resumes where it was");
    // Its miners are still known: they heartbeat without registering again,
    // once the resumed server's first 5 s are over (until then it takes no
    // envelope: the process before it may have taken one dated that late).
    let (url2, _server2) = serve(svc2).await;
    let mut c = client(&url2, 1).await;
    let t0 = std::time::Instant::now();
    while let Err(e) = c.heartbeat(0, 0, 1.0, &[]).await {
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(8), "still refused: {e}");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    // A database holding another run is refused.
    let mut other = spec();
    other.run_id = 7;
    assert!(
        OrchestratorService::new(
            Orchestrator::new(other).unwrap(),
            Some(StateDb::open(&db).unwrap()),
            "{}".into(),
            AuthPolicy::default(),
            orch_id(),
        )
        .is_err()
    );
}

/// A panic while the service holds its state lock (a bug somewhere in the
/// state machine) must not turn every later request into a panic: the lock
/// does not poison.
#[tokio::test]
async fn a_panic_under_the_state_lock_does_not_take_the_service_down() {
    let svc = service(None);
    let s = svc.clone();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.with_state(|_| panic!("a bug"))));
    assert!(r.is_err());
    let (url, _server) = serve(svc.clone()).await;
    let mut c = client(&url, 1).await;
    c.register("127.0.0.1:9000".into(), 10.0, "cuda:0 (bf16 gemms)".into()).await.unwrap();
    c.heartbeat(0, 3, 250.0, &[]).await.unwrap();
    // What the miner says about itself is kept (it was dropped before).
    let m = svc.with_state(|o| o.miners().next().cloned()).unwrap();
    assert_eq!((m.device.as_str(), m.reported_in_flight, m.tokens_per_s), ("cuda:0 (bf16 gemms)", 3, 250.0));
}

/// The control plane is TLS with the orchestrator's identity certificate: a
/// client pinned to another key refuses it, a plaintext client is refused,
/// an http:// URL needs an explicit opt-in, and clients that connect and
/// never finish a handshake hold no one else up.
#[tokio::test]
async fn the_control_plane_is_tls_bound_to_the_orchestrators_key() {
    let svc = service(None);
    let (url, _server) = serve(svc).await;
    assert!(url.starts_with("https://"), "{url}");
    let me = Arc::new(Identity::from_seed([1; 32]));

    let impostor = Identity::from_seed([0x99; 32]).peer_id();
    let e = ControlClient::connect(url.clone(), me.clone(), Some(impostor)).await.err().expect("wrong key accepted");
    assert!(format!("{e:#}").contains("not the pinned"), "{e:#}");

    let plain = url.replace("https://", "http://");
    let e = ControlClient::connect(plain.clone(), me.clone(), Some(orch_id().peer_id())).await.err().unwrap();
    assert!(format!("{e:#}").contains("--insecure-plaintext"), "{e:#}");
    let e = ControlClient::connect_insecure_plaintext(plain, me.clone(), Some(orch_id().peer_id())).await.err();
    assert!(e.is_some(), "a plaintext client was served by the TLS port");

    // Silent connections (no ClientHello) while a real client connects.
    let addr = url.trim_start_matches("https://").to_string();
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // Were handshakes served one at a time, this client would wait for the
    // silent ones' handshake timeout first.
    let bound = iota_control::tls_server::HANDSHAKE_TIMEOUT / 2;
    let c = tokio::time::timeout(bound, ControlClient::connect(url, me, Some(orch_id().peer_id())))
        .await
        .expect("silent connections held up a client")
        .unwrap();
    assert_eq!(c.audience().orchestrator, orch_id().peer_id());
    drop(silent);
}

/// Per-address and server-wide limits over real gRPC: one address gets its
/// burst and then RESOURCE_EXHAUSTED (before its signatures are checked: a
/// forged envelope is refused for the rate, not the signature), and it may
/// register only as many identities as the cap, while a known one may
/// register again.
#[tokio::test]
async fn one_address_is_held_to_its_budget_and_its_identity_cap() {
    use iota_protocol::source_limits::SourcePolicy;
    let policy = SourcePolicy {
        per_address_rate_per_s: 0.001,
        per_address_burst: 12.0,
        global_rate_per_s: 1_000.0,
        global_burst: 1_000.0,
        identities_per_address: 2,
    };
    let (url, _server) = serve(service(None).with_source_policy(policy)).await;
    // Each connect says hello (1 request): 3 clients, 3 registrations, one
    // re-registration = 7 of the 12.
    let mut a = client(&url, 1).await;
    let mut b = client(&url, 2).await;
    let mut c = client(&url, 3).await;
    a.register("127.0.0.1:1".into(), 1.0, "cpu".into()).await.unwrap();
    b.register("127.0.0.1:2".into(), 1.0, "cpu".into()).await.unwrap();
    let e = c.register("127.0.0.1:3".into(), 1.0, "cpu".into()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("identities"), "{}", e.message());
    a.register("127.0.0.1:1".into(), 1.0, "cpu".into()).await.unwrap();
    // Spend the rest of the burst (5 left), then every request is refused,
    // a forged one included, with the budget's status.
    for _ in 0..5 {
        a.heartbeat(0, 0, 1.0, &[]).await.unwrap();
    }
    let e = a.heartbeat(0, 0, 1.0, &[]).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("this address"), "{}", e.message());
    let m = "/iota.v1.Orchestrator/Heartbeat";
    let body = pb::HeartbeatRequest::default();
    let mut forged = sign(a.identity(), a.audience(), m, &body, now_ms());
    forged.signature[0] ^= 1;
    assert_eq!(a.raw_heartbeat(forged).await.unwrap_err().code(), Code::ResourceExhausted);
}

/// Issue 15: an orchestrator with a CA-issued certificate (the operator's,
/// instead of its identity certificate). A caller given the CA connects by
/// host name and still pins the orchestrator's key in Hello; a caller with
/// another CA, one expecting an identity certificate, or one with the CA but
/// a pin on another key are all refused.
#[tokio::test]
async fn an_orchestrator_with_a_ca_issued_certificate_is_checked_by_its_chain_and_its_key() {
    use iota_protocol::tls_identity::{load_ca_roots, server_config_pem};
    let dir = tempfile::tempdir().unwrap();
    // A CA, and a leaf for localhost that it signs.
    let ca = |name: &str| {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate().unwrap()).unwrap()
    };
    let (ours, theirs) = (ca("our CA"), ca("another CA"));
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&leaf_key, &ours).unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cert = write("cert.pem", format!("{}{}", leaf.pem(), ours.pem()));
    let key = write("key.pem", leaf_key.serialize_pem());
    let (our_ca, their_ca) = (write("ca.pem", ours.pem()), write("other-ca.pem", theirs.pem()));

    let tls = server_config_pem(&cert, &key).unwrap();
    let (url, _server) =
        iota_control::swarm::serve_with(service(None), "127.0.0.1:0".parse().unwrap(), Some(tls)).await.unwrap();
    let by_name = url.replace("127.0.0.1", "localhost");
    let me = Arc::new(Identity::from_seed([1; 32]));
    let pinned = Some(orch_id().peer_id());
    let ok = ControlClient::connect_ca(by_name.clone(), me.clone(), pinned, load_ca_roots(&our_ca).unwrap()).await;
    let st = ok.expect("the CA's certificate for localhost").status().await.unwrap();
    assert_eq!(st.run_id, 42);
    // Another CA: the chain leads nowhere it trusts.
    let e = ControlClient::connect_ca(by_name.clone(), me.clone(), pinned, load_ca_roots(&their_ca).unwrap())
        .await
        .err()
        .expect("another CA refused");
    assert!(format!("{e:#}").to_lowercase().contains("certificate"), "{e:#}");
    // The right CA, but the orchestrator is not the key pinned.
    let other = Some(Identity::from_seed([99; 32]).peer_id());
    let e = ControlClient::connect_ca(by_name.clone(), me.clone(), other, load_ca_roots(&our_ca).unwrap())
        .await
        .err()
        .expect("another pinned key refused");
    assert!(format!("{e:#}").contains("pinned"), "{e:#}");
    // A caller that expects the identity certificate refuses a CA's.
    assert!(ControlClient::connect(by_name, me.clone(), pinned).await.is_err());
    // And a caller with a CA refuses an identity certificate.
    let (plain_url, _s2) = serve(service(None)).await;
    let e =
        ControlClient::connect_ca(plain_url, me, pinned, load_ca_roots(&our_ca).unwrap()).await.err().expect("refused");
    assert!(format!("{e:#}").to_lowercase().contains("certificate"), "{e:#}");
}
