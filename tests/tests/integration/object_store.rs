//! Every `ObjectStore` implementation against one conformance suite, and
//! presigned URLs (what a miner without credentials gets) against a real
//! S3-compatible server (`s3s-fs` on 127.0.0.1).

use std::time::Duration;

use iota_control::s3_store::{PART_SIZE, S3Location, S3Secret, S3Store};
use iota_dataplane::fileio::FileIo;
use iota_dataplane::local_store::LocalDirStore;
use iota_protocol::object_store::ObjectStore;
use iota_tests::s3::{S3Server, conformance, send_presigned};

/// Large enough that the S3 store uploads it in two parts.
const LARGE: usize = PART_SIZE + (1 << 20) + 7;

#[tokio::test]
async fn the_local_directory_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
    conformance(store.as_ref(), LARGE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_store_passes_the_conformance_suite() {
    let Some(server) = S3Server::start() else { return };
    conformance(&server.store("iota-conformance", "run-1").await, LARGE).await;
    // Two stores in one bucket under different prefixes do not see each other.
    let other = server.store("iota-conformance", "run-2").await;
    assert!(other.list("e1/stage-000/").await.unwrap().is_empty());
    assert_eq!(other.get("e1/stage-000/a.st").await.unwrap_err().kind(), std::io::ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_clear_error() {
    let Some(server) = S3Server::start() else { return };
    server.store("iota-creds", "").await;
    let loc = S3Location::parse("s3://iota-creds", Some(server.endpoint.clone()), "us-east-1".into(), true).unwrap();
    let forged = S3Store::new(loc, S3Secret { access_key: "iota-test-access".into(), secret_key: "guessed".into() });
    let e = forged.put("k", vec![1]).await.unwrap_err();
    assert!(e.to_string().contains("S3 put k"), "{e}");
    assert!(!e.to_string().contains("guessed"), "the secret must not reach an error message: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presigned_url_grants_one_key_one_method_for_a_while() {
    let Some(server) = S3Server::start() else { return };
    let store = server.store("iota-presign", "run").await;
    let body = b"a miner's upload".to_vec();

    let put =
        store.presign_put("epoch-000001/stage-000/up.st", body.len() as u64, Duration::from_secs(60)).await.unwrap();
    assert!(put.url.contains("X-Amz-Signature="), "{}", put.url);
    assert!(!put.url.contains(iota_tests::s3::SECRET_KEY));
    // The length is signed: a grant for n bytes does not write n + 9.
    let longer = [body.as_slice(), b" and more"].concat();
    assert_eq!(send_presigned(&put, &longer).await.unwrap().status, 403);
    let r = send_presigned(&put, &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(store.get("epoch-000001/stage-000/up.st").await.unwrap(), body);

    let get = store.presign_get("epoch-000001/stage-000/up.st", Duration::from_secs(60)).await.unwrap();
    let r = send_presigned(&get, &[]).await.unwrap();
    assert_eq!((r.status, r.body), (200, body.clone()));

    // The same signature on another key, another method, or with the
    // signature stripped: refused, and nothing is written.
    let mut elsewhere = put.clone();
    elsewhere.url = put.url.replace("up.st", "merged.st");
    assert_eq!(send_presigned(&elsewhere, &body).await.unwrap().status, 403);
    let mut as_get = put.clone();
    as_get.method = "GET".into();
    assert_eq!(send_presigned(&as_get, &[]).await.unwrap().status, 403);
    let mut unsigned = put.clone();
    unsigned.url = put.url.split('?').next().unwrap().to_string();
    assert_eq!(send_presigned(&unsigned, &body).await.unwrap().status, 403);
    assert_eq!(store.get("epoch-000001/stage-000/merged.st").await.unwrap_err().kind(), std::io::ErrorKind::NotFound);

    // A grant expires.
    let brief = store.presign_get("epoch-000001/stage-000/up.st", Duration::from_secs(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(send_presigned(&brief, &[]).await.unwrap().status, 403, "an expired URL still worked");
}

/// A miner with no store credentials reads and writes through grants: the
/// orchestrator presigns what the run asks of it and refuses the rest
/// before anything reaches the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_miner_without_credentials_reads_and_writes_only_through_grants() {
    use std::sync::Arc;

    use iota_core::Identity;
    use iota_dataplane::granted_store::GrantedStore;
    use iota_protocol::client::ControlClient;
    use iota_protocol::store_keys::{contrib_prefix, merged_key, upload_prefix};

    let Some(server) = S3Server::start() else { return };
    let bucket = Arc::new(server.store("iota-grants", "run-99").await);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = iota_tests::tiny_run(2, 2, 1, 8, iota_core::WireCodec::Int8Row);
    cfg.spec.merge.method = iota_protocol::MergeMethod::ParameterServer;
    let swarm = iota_tests::Swarm::start_on_bucket(&cfg, dir.path().join("state.sqlite"), bucket.clone()).await;
    let key = swarm.service.identity().peer_id();
    let join = |seed: u8| {
        let url = swarm.url.clone();
        async move {
            let id = Arc::new(Identity::from_seed([seed; 32]));
            let mut c = ControlClient::connect(url, id.clone(), Some(key)).await.unwrap();
            c.register(format!("127.0.0.1:{}", 40_000 + seed as u16), 1.0, "cpu".into()).await.unwrap();
            (id.peer_id(), GrantedStore::new(c).unwrap())
        }
    };
    let (a, store_a) = join(1).await;
    let (b, _) = join(2).await;
    let stage_of = |p| swarm.service.with_state(|o| o.miner(&p).unwrap().stage);
    let (sa, sb) = (stage_of(a), stage_of(b));

    // Its own upload: granted, written, read back (by it and through the bucket).
    let own = format!("{}stage-{sa:03}/{}.safetensors", upload_prefix(0), a.to_hex());
    store_a.put(&own, b"replica a's weights".to_vec()).await.unwrap();
    assert_eq!(bucket.get(&own).await.unwrap(), b"replica a's weights");
    assert_eq!(store_a.get(&own).await.unwrap(), b"replica a's weights");
    assert_eq!(store_a.get("epoch-000000/missing.st").await.unwrap_err().kind(), std::io::ErrorKind::NotFound);

    // Another replica's upload, the merged stage (a is no aggregator yet),
    // another stage's contributions: refused, and the bucket is untouched.
    let theirs = format!("{}stage-{sb:03}/{}.safetensors", upload_prefix(0), b.to_hex());
    for k in [theirs.as_str(), &merged_key(0, sa)] {
        let e = store_a.put(k, b"overwrite".to_vec()).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{k}: {e}");
        assert!(e.to_string().contains("not a key this miner is asked to write"), "{e}");
        assert_eq!(bucket.get(k).await.unwrap_err().kind(), std::io::ErrorKind::NotFound, "{k} was written");
    }
    let other_stage = contrib_prefix(0, (sa + 1) % 2);
    assert_eq!(store_a.list(&other_stage).await.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);

    // A stranger gets nothing, not even a read.
    let stranger = Arc::new(Identity::from_seed([9; 32]));
    let c = ControlClient::connect(swarm.url.clone(), stranger, Some(key)).await.unwrap();
    let e = GrantedStore::new(c).unwrap().get(&own).await.unwrap_err();
    assert!(e.to_string().contains("must register first"), "{e}");
    assert!(swarm.service.refusals().get("not_yours").copied().unwrap_or(0) >= 3, "{:?}", swarm.service.refusals());
}

/// On a directory-store run there is nothing to grant: a clear refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_run_refuses_grants_and_says_why() {
    use std::sync::Arc;

    use iota_core::Identity;
    use iota_dataplane::granted_store::GrantedStore;
    use iota_protocol::client::ControlClient;

    let dir = tempfile::tempdir().unwrap();
    let cfg = iota_tests::tiny_run(2, 1, 1, 8, iota_core::WireCodec::Int8Row);
    let swarm = iota_tests::Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let id = Arc::new(Identity::from_seed([1; 32]));
    let mut c = ControlClient::connect(swarm.url.clone(), id, Some(swarm.service.identity().peer_id())).await.unwrap();
    c.register("127.0.0.1:40001".into(), 1.0, "cpu".into()).await.unwrap();
    let e = GrantedStore::new(c).unwrap().get("epoch-000000/x.st").await.unwrap_err();
    assert!(e.to_string().contains("miners open it with --store"), "{e}");
}

/// 2 stages x 2 replicas train for 2 epochs on a bucket with no shared
/// directory: miners hold no store credentials and no `--store`, every
/// object goes through a grant, and the outer momentum lands in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swarm_on_a_bucket_trains_with_no_shared_directory() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use iota_core::merge::OuterOpt;
    use iota_protocol::run_config::StoreAccess;
    use iota_protocol::store_keys::{momentum_parts_prefix, weights_parts_prefix};

    let Some(server) = S3Server::start() else { return };
    let bucket = Arc::new(server.store("iota-swarm", "run-99").await);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = iota_tests::tiny_run(2, 2, 2, 16, iota_core::WireCodec::Int8Row);
    cfg.store = StoreAccess::Granted;
    cfg.spec.merge.outer = OuterOpt { lr: 0.8, momentum: 0.5 };
    let swarm = iota_tests::Swarm::start_on_bucket(&cfg, dir.path().join("state.sqlite"), bucket.clone()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..4).map(|_| swarm.miner_with(|o| o.store = None, stop.clone())).collect();
    let mut summaries = Vec::new();
    for m in miners {
        summaries
            .push(tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap());
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history.len(), 2);
    assert!(history.iter().all(|e| e.completed + e.dropped == 16));
    assert!(history[1].mean_loss < history[0].mean_loss, "{history:?}");
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2);
        assert!(w[0] == w[1], "stage {stage} replicas differ after the merge");
        // The merged slices and a non-zero outer momentum are in the bucket.
        for prefix in [weights_parts_prefix(1, stage), momentum_parts_prefix(1, stage)] {
            let parts = bucket.list(&prefix).await.unwrap();
            assert!(!parts.is_empty(), "nothing under {prefix}");
            let mut nonzero = false;
            for k in parts {
                nonzero |=
                    bucket.get(&k).await.unwrap().chunks(4).any(|b| f32::from_le_bytes(b.try_into().unwrap()) != 0.0);
            }
            assert!(nonzero, "{prefix} holds only zeros");
        }
    }
    // Every write was granted: no honest miner was refused one.
    let refusals = swarm.service.refusals();
    assert_eq!(refusals.get("not_yours"), None, "{refusals:?}");
    assert!(!dir.path().join("store").exists(), "a store directory was made");
}

/// Issue 15, "no shared paths" for a real corpus: `data prepare` writes a
/// corpus (not the run's generated one) into the bucket; 2 x 2 miners with
/// no `--data`, no `--store` and no credentials fetch it through grants,
/// check it chunk by chunk, cache it, and train on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prepared_corpus_in_the_bucket_trains_miners_that_hold_no_copy() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use iota_core::train_config::TokenizerKind;
    use iota_dataplane::prepared_corpus;
    use iota_protocol::run_config::StoreAccess;

    let Some(server) = S3Server::start() else { return };
    let bucket = Arc::new(server.store("iota-data", "run-99").await);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = iota_tests::tiny_run(2, 2, 2, 16, iota_core::WireCodec::Int8Row);
    // Another text than the run's generated corpus: another seed.
    let text = iota_model::data::synthetic::grammar_text(cfg.train.seed + 1, 400_000);
    let tokens = iota_model::data::Tokenizer::new(TokenizerKind::Byte).unwrap().encode(&text);
    let m = prepared_corpus::prepare(&*bucket, &tokens, TokenizerKind::Byte, 100_000, |_| {}).await.unwrap();
    assert_eq!(m.chunks.len(), tokens.len().div_ceil(100_000));
    let chunks = m.chunks.len();
    let toy = cfg.corpus.clone();
    cfg.store = StoreAccess::Granted;
    cfg.corpus_in_store = true;
    let corpus = iota_model::data::Corpus::new(tokens, cfg.train.seq, cfg.max_shards, cfg.val_fraction).unwrap();
    iota_dataplane::corpus::fix_shards_of(&mut cfg, corpus).unwrap();
    assert_ne!(cfg.corpus, toy, "the prepared corpus is not the generated one");

    let swarm = iota_tests::Swarm::start_on_bucket(&cfg, dir.path().join("state.sqlite"), bucket.clone()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let caches: Vec<std::path::PathBuf> = (0..4).map(|i| dir.path().join(format!("cache-{i}"))).collect();
    let miners: Vec<_> = caches
        .iter()
        .map(|c| {
            let c = c.clone();
            swarm.miner_with(
                move |o| {
                    o.store = None;
                    o.data = None;
                    o.corpus_cache = Some(c);
                },
                stop.clone(),
            )
        })
        .collect();
    for m in miners {
        tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap();
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history.len(), 2);
    assert!(history.iter().all(|e| e.completed + e.dropped == 16), "{history:?}");
    assert!(history[1].mean_loss < history[0].mean_loss, "{history:?}");
    // Every miner needs tokens (the head its inputs, the tail its targets):
    // each cached every chunk, fetched through its grants.
    for c in &caches {
        let cached = std::fs::read_dir(c).map(|d| d.count()).unwrap_or(0);
        assert_eq!(cached, chunks, "{} holds {cached} chunks", c.display());
    }
}
