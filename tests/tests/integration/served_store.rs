//! The store the orchestrator serves itself (a run with no bucket, issue
//! 59): its grants and refusals over raw HTTP, and a whole swarm whose
//! miners hold no directory and no corpus of their own training through it
//! over TLS.

use std::sync::Arc;
use std::time::Duration;

use iota_control::served_store::{ServedStore, serve};
use iota_core::Identity;
use iota_tests::s3::send_presigned;

/// Raw requests against the server (plaintext, so the test can write
/// hostile ones byte by byte): what was granted is served, whole or in
/// ranges; anything else is refused with a status that says why, and a
/// refused or broken upload leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_store_serves_what_was_granted_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let id = Identity::from_seed([3; 32]);
    let store = Arc::new(ServedStore::new(dir.path(), &id, base.clone()).unwrap());
    let _server = serve(listener, None, store.clone(), Duration::from_secs(900));
    let soon = iota_protocol::auth::now_ms() + 60_000;
    let key = "epoch-000001/stage-000/weights part.st";
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();

    // A PUT of exactly the granted length lands, atomically.
    let put = store.presign(key, Some(data.len() as u64), soon).unwrap();
    assert_eq!(send_presigned(&put, &data).await.unwrap().status, 200);
    assert_eq!(std::fs::read(dir.path().join(key)).unwrap(), data);
    // A GET streams it whole; a range is a 206 of those bytes.
    let get = store.presign(key, None, soon).unwrap();
    let whole = send_presigned(&get, &[]).await.unwrap();
    assert_eq!((whole.status, whole.body.len()), (200, data.len()));
    assert!(whole.body == data);
    let mut ranged = get.clone();
    ranged.headers.push(("range".into(), "bytes=1048570-1048580".into()));
    let part = send_presigned(&ranged, &[]).await.unwrap();
    assert_eq!((part.status, part.body.as_slice()), (206, &data[1_048_570..=1_048_580]));
    ranged.headers.last_mut().unwrap().1 = format!("bytes={}-", data.len());
    assert_eq!(send_presigned(&ranged, &[]).await.unwrap().status, 416);
    // The listing the Grant RPC hands out.
    assert_eq!(store.list("epoch-000001/stage-000/").await.unwrap(), vec![key.to_string()]);

    // Refusals: a body longer or shorter than granted (nothing written),
    // another key under the same grant, an expired grant, a grant of another
    // orchestrator, a GET grant used to PUT, a missing object.
    let other = "epoch-000001/stage-000/other.st";
    let short = store.presign(other, Some(10), soon).unwrap();
    assert_eq!(send_presigned(&short, &[0; 11]).await.unwrap().status, 400);
    assert_eq!(send_presigned(&short, &[0; 9]).await.unwrap().status, 400);
    assert!(!dir.path().join(other).exists());
    let mut moved = short.clone();
    moved.url = moved.url.replace("other.st", "weights%20part.st");
    assert_eq!(send_presigned(&moved, &[0; 10]).await.unwrap().status, 403);
    assert_eq!(std::fs::read(dir.path().join(key)).unwrap(), data, "a refused PUT changed the object");
    let expired = store.presign(other, Some(10), iota_protocol::auth::now_ms() - 120_000).unwrap();
    assert_eq!(send_presigned(&expired, &[0; 10]).await.unwrap().status, 403);
    let far = store.presign(other, Some(10), iota_protocol::auth::now_ms() + 24 * 3_600_000).unwrap();
    assert_eq!(send_presigned(&far, &[0; 10]).await.unwrap().status, 403);
    let stranger = ServedStore::new(dir.path(), &Identity::from_seed([4; 32]), base).unwrap();
    let forged = stranger.presign(other, Some(10), soon).unwrap();
    assert_eq!(send_presigned(&forged, &[0; 10]).await.unwrap().status, 403);
    let mut get_as_put = store.presign(other, None, soon).unwrap();
    get_as_put.method = "PUT".into();
    assert_eq!(send_presigned(&get_as_put, &[0; 10]).await.unwrap().status, 400);
    let missing = store.presign("epoch-000001/none.st", None, soon).unwrap();
    assert_eq!(send_presigned(&missing, &[]).await.unwrap().status, 404);
    // Not a grant at all.
    let mut bare = get.clone();
    bare.url = bare.url.split('?').next().unwrap().to_string();
    assert_eq!(send_presigned(&bare, &[]).await.unwrap().status, 400);
    // No temporary file is left by the refused and broken uploads.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("epoch-000001/stage-000"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// 2 stages x 2 replicas, outer momentum on, for 2 epochs on a run whose
/// store the orchestrator serves: miners hold no store directory and no
/// corpus (it is in the run's store, fetched through grants over TLS with
/// the orchestrator's identity certificate), and every object they write
/// lands in the orchestrator's directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swarm_on_the_orchestrators_own_store_trains_miners_that_hold_nothing() {
    use std::sync::atomic::AtomicBool;

    use iota_core::merge::OuterOpt;
    use iota_core::train_config::TokenizerKind;
    use iota_dataplane::prepared_corpus;
    use iota_protocol::run_config::StoreAccess;
    use iota_protocol::store_keys::momentum_parts_prefix;

    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut cfg = iota_tests::tiny_run(2, 2, 2, 16, iota_core::WireCodec::Int8Row);
    cfg.spec.merge.outer = OuterOpt { lr: 0.8, momentum: 0.5 };
    // A corpus of the test's own, in the orchestrator's store only.
    let text = iota_model::data::synthetic::grammar_text(cfg.train.seed + 2, 300_000);
    let tokens = iota_model::data::Tokenizer::new(TokenizerKind::Byte).unwrap().encode(&text);
    let local =
        iota_dataplane::local_store::LocalDirStore::open(&store_dir, iota_dataplane::fileio::FileIo::start(false))
            .unwrap();
    prepared_corpus::prepare(&local, &tokens, TokenizerKind::Byte, 100_000, |_| {}).await.unwrap();
    cfg.store = StoreAccess::Served;
    cfg.corpus_in_store = true;
    let corpus = iota_model::data::Corpus::new(tokens, cfg.train.seq, cfg.max_shards, cfg.val_fraction).unwrap();
    iota_dataplane::corpus::fix_shards_of(&mut cfg, corpus).unwrap();

    let swarm = iota_tests::Swarm::start_served(&cfg, dir.path().join("state.sqlite")).await;
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
    let mut summaries = Vec::new();
    for m in miners {
        summaries
            .push(tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap());
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history.len(), 2);
    assert!(history.iter().all(|e| e.completed + e.dropped == 16), "{history:?}");
    assert!(history[1].mean_loss < history[0].mean_loss, "{history:?}");
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2);
        assert!(w[0] == w[1], "stage {stage} replicas differ after the merge");
        // The outer momentum the miners wrote is in the orchestrator's directory.
        let parts = iota_protocol::ObjectStore::list(&local, &momentum_parts_prefix(1, stage)).await.unwrap();
        assert!(!parts.is_empty(), "no momentum of stage {stage} in the served store");
    }
    // Every miner fetched the corpus through its grants and cached it.
    for c in &caches {
        assert!(std::fs::read_dir(c).map(|d| d.count()).unwrap_or(0) > 0, "{} holds no chunk", c.display());
    }
    let refusals = swarm.service.refusals();
    assert_eq!(refusals.get("not_yours"), None, "{refusals:?}");
}
