//! In-process swarms: an orchestrator over gRPC and miners over QUIC on
//! 127.0.0.1, training `tiny` end to end.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use iota_core::PeerId;
use iota_core::WireCodec;
use iota_core::commitment::{Chain, EpochHeads, Lane, Side};
use iota_tests::{Swarm, tiny_run, tiny_run_batch};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_stages_two_replicas_train_and_merge() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(3, 2, 3, 24, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let miners: Vec<_> = (0..6).map(|_| swarm.miner(stop.clone())).collect();
    let mut summaries = Vec::new();
    for m in miners {
        let s =
            tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished in time").unwrap().unwrap();
        summaries.push(s);
    }
    let elapsed = t0.elapsed();
    let history = swarm.service.with_state(|o| o.history().to_vec());
    println!("swarm 3x2 tiny: {:?} in {elapsed:?}", history.iter().map(|e| e.mean_loss).collect::<Vec<_>>());
    assert_eq!(history.len(), 3);
    // Every micro-batch completed or counted as dropped.
    for e in &history {
        assert_eq!(e.completed + e.dropped, 24, "epoch {}", e.epoch);
    }
    assert!(history.iter().map(|e| e.completed).sum::<u64>() >= 60, "most micro-batches complete");
    // The loss falls.
    assert!(history[2].mean_loss < history[0].mean_loss - 0.3, "{:?}", history);
    // After the last merge, the replicas of each stage hold identical weights.
    for stage in 0..3 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2, "two replicas of stage {stage}");
        assert!(!w[0].is_empty());
        assert!(w[0] == w[1], "stage {stage} replicas differ after the merge");
    }
}

/// The merge ramp: short epochs first (one inner step per replica, then
/// doubling), each ending in a real merge, and the run's micro-batches
/// unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_merge_ramp_merges_after_one_step_then_doubling() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(3, 2, 2, 16, WireCodec::Int8Row);
    cfg.spec.ramp_first_epoch = 2;
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..6).map(|_| swarm.miner(stop.clone())).collect();
    let mut summaries = Vec::new();
    for m in miners {
        summaries.push(
            tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished in time").unwrap().unwrap(),
        );
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    let sizes: Vec<u64> = history.iter().map(|e| e.completed + e.dropped).collect();
    assert_eq!(sizes, vec![2, 4, 8, 16, 2], "{history:?}");
    for stage in 0..3 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert!(w.len() == 2 && !w[0].is_empty() && w[0] == w[1], "stage {stage}'s replicas differ after the merge");
    }
}

/// 3 stages x 1 replica, no bottleneck (exact f32 boundaries), one
/// micro-batch at a time, with `optimizer` and the blocks split as
/// `stage_layers` says (None: evenly): the swarm's 24 losses and the
/// single-process trainer's must agree to 1e-6. Returns the finished swarm.
async fn sequential_swarm_against_the_trainer(
    optimizer: &str,
    stage_layers: Option<Vec<usize>>,
    dir: &std::path::Path,
) -> Swarm {
    use iota_model::CpuBackend;
    use iota_model::train::Pipeline;

    let mut cfg = tiny_run(3, 1, 2, 12, WireCodec::F32);
    cfg.spec.max_in_flight = 1;
    // One replica: the parameter server's "average" of it is exact.
    cfg.spec.merge = Default::default();
    cfg.train.adamw.set_optimizer(optimizer).unwrap();
    cfg.train.model.stage_layers = stage_layers;
    cfg.validate().unwrap();
    let swarm = Swarm::start(&cfg, dir.join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..3).map(|_| swarm.miner(stop.clone())).collect();
    let specs = iota_core::StageSpec::split(&cfg.train.model, 3).unwrap();
    for m in miners {
        let s = tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap();
        // Each miner held the blocks the run's split gives its stage.
        let layout = iota_core::ParamLayout::for_stage(&cfg.train.model, &specs[s.stage as usize]);
        assert_eq!(s.params.len(), layout.total(), "stage {}", s.stage);
    }
    let swarm_losses: Vec<f32> =
        swarm.service.with_state(|o| o.history().iter().flat_map(|e| e.losses.clone()).collect());
    assert_eq!(swarm_losses.len(), 24);

    // The same run in one process.
    let corpus = iota_dataplane::corpus::load_corpus(&cfg, None).unwrap();
    let mut p = Pipeline::new(Arc::new(CpuBackend::new()), cfg.train.clone()).unwrap();
    let trainer: Vec<f32> = (0..24).map(|_| p.train_step(&corpus).unwrap().loss).collect();
    for (i, (a, b)) in swarm_losses.iter().zip(&trainer).enumerate() {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "micro-batch {i}: swarm {a} vs trainer {b}");
    }
    assert!(trainer[23] < trainer[0], "and it learns");
    swarm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequential_swarm_equals_the_single_process_trainer() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = sequential_swarm_against_the_trainer("adamw", None, dir.path()).await;
    // What each miner committed to for the last epoch, as the orchestrator
    // recorded it from its heartbeats. This run has no validators, so no
    // miner hashed its weights after its inner steps (the weights chain's
    // only readers are validators, whose evidence check binds a miner's
    // weights to it: `dataplane/src/evidence`): the chain is empty.
    let (by_stage, heads): (Vec<PeerId>, Vec<Option<EpochHeads>>) = swarm.service.with_state(|o| {
        let mut ms: Vec<_> = o.miners().map(|m| (m.stage, m.peer)).collect();
        ms.sort();
        let peers: Vec<PeerId> = ms.iter().map(|(_, p)| *p).collect();
        let heads = peers.iter().map(|p| o.commitments_of(p, 1).cloned()).collect();
        (peers, heads)
    });
    let heads: Vec<EpochHeads> = heads.into_iter().map(|h| h.expect("every miner reported its heads")).collect();
    for (stage, h) in heads.iter().enumerate() {
        assert_eq!(h.weights, Chain::default(), "stage {stage}'s weights chain, in a run without validators");
    }
    // Both ends of every pipeline lane commit to the same frames.
    for (a, b, dir) in [(0, 1, 0u8), (1, 2, 0), (2, 1, 1), (1, 0, 1)] {
        let sent = heads[a].lanes[&Lane { peer: by_stage[b], direction: dir, side: Side::Sent }];
        let got = heads[b].lanes[&Lane { peer: by_stage[a], direction: dir, side: Side::Received }];
        assert_eq!(sent.len, 12, "stage {a} -> {b}, direction {dir}: one frame per micro-batch");
        assert_eq!(sent, got, "stage {a} -> {b}, direction {dir}");
    }
    assert_eq!(swarm.service.with_state(|o| o.counters().commitment_breaks), 0);
}

/// The miners apply Muon exactly as the one-process trainer does (its
/// Newton-Schulz steps included), micro-batch for micro-batch; and with
/// the blocks split unevenly (`--stage-layers 1,1,2`, the even split being
/// 2,1,1), every role cuts the model the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequential_swarm_with_muon_and_an_uneven_split_equals_the_single_process_trainer() {
    let dir = tempfile::tempdir().unwrap();
    sequential_swarm_against_the_trainer("muon", Some(vec![1, 1, 2]), dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_miner_work_is_rerouted_and_the_epoch_completes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(3, 2, 2, 40, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let flags: Vec<Arc<AtomicBool>> = (0..6).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let miners: Vec<_> = flags.iter().map(|f| swarm.miner(f.clone())).collect();
    // Once training is under way, kill a miner of the middle stage.
    let deadline = Instant::now() + Duration::from_secs(30);
    while swarm.service.with_state(|o| o.counters().completed) < 5 {
        assert!(Instant::now() < deadline, "training did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The middle miner with the most work in flight, so that there is work
    // to take over.
    let victim = swarm
        .service
        .with_state(|o| o.miners().filter(|m| m.stage == 1).max_by_key(|m| m.in_flight).map(|m| m.index).unwrap());
    // Miners register in spawn order, so index i is the i-th task.
    flags[victim as usize].store(true, std::sync::atomic::Ordering::SeqCst);
    for (i, m) in miners.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished");
        if i != victim as usize {
            r.unwrap().unwrap();
        }
    }
    let (history, counters) = swarm.service.with_state(|o| (o.history().to_vec(), o.counters().clone()));
    assert_eq!(history.len(), 2, "both epochs completed");
    for e in &history {
        assert_eq!(e.completed + e.dropped, 40);
    }
    // Once an epoch's micro-batches are all issued, late attempts are
    // hedged; a hedge that wins takes the victim's work over with no
    // re-route, so either counts.
    assert!(counters.rerouted + counters.hedges_won > 0, "the victim's micro-batches were taken over: {counters:?}");
    assert!(counters.completed >= 70, "{counters:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarted_orchestrator_resumes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 1, 3, 16, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    crash_mid_run_and_resume(swarm, &cfg).await;
}

/// The same crash and restart with the state in PostgreSQL
/// (`--state-db postgres://...`), on a server the test starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarted_orchestrator_resumes_the_run_from_postgres() {
    let server = match tokio::task::spawn_blocking(iota_tests::postgres::start).await.unwrap() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIPPED restarted_orchestrator_resumes_the_run_from_postgres: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 1, 3, 16, WireCodec::Int8Row);
    let swarm = Swarm::start_on_postgres(&cfg, dir.path(), &server.url).await;
    crash_mid_run_and_resume(swarm, &cfg).await;
    assert!(!dir.path().join("state.sqlite").exists(), "no SQLite file beside a PostgreSQL state");
    // The run's rows, under its id: the last snapshot and every epoch.
    let (url, run) = (server.url.clone(), cfg.spec.run_id as i64);
    let (saved_epoch, epochs): (i64, i64) = tokio::task::spawn_blocking(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let e = c.query_one("SELECT epoch FROM iota_snapshot WHERE run_id = $1", &[&run]).unwrap().get(0);
        let n = c.query_one("SELECT count(*) FROM iota_epochs WHERE run_id = $1", &[&run]).unwrap().get(0);
        (e, n)
    })
    .await
    .unwrap();
    assert_eq!((saved_epoch, epochs), (3, 3));
}

/// Crashes the orchestrator once the first epoch is done, starts it again
/// from its saved state, and checks the run goes on to its end.
async fn crash_mid_run_and_resume(swarm: Swarm, cfg: &iota_protocol::RunConfig) {
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..2).map(|_| swarm.miner(stop.clone())).collect();
    // Wait until the first epoch is complete, then crash and restart the orchestrator.
    let deadline = Instant::now() + Duration::from_secs(60);
    while swarm.service.with_state(|o| o.epoch()) < 1 {
        assert!(Instant::now() < deadline, "first epoch did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let swarm = swarm.restart(cfg).await;
    assert!(swarm.service.with_state(|o| o.epoch()) >= 1, "the completed epoch survived the crash");
    for m in miners {
        let Ok(finished) = tokio::time::timeout(Duration::from_secs(90), m).await else {
            // Say where the run stood, so a hang on a loaded machine can be read from CI's log.
            let state = swarm.service.with_state(|o| {
                let miners: Vec<_> = o
                    .miners()
                    .map(|m| (m.stage, m.healthy, m.subscribed, m.joining, m.benched, m.in_flight, m.last_seen_ms))
                    .collect();
                format!("phase {:?} epoch {} {:?}\n(stage, healthy, subscribed, joining, benched, in flight, last seen): {miners:?}", o.phase(), o.epoch(), o.counters())
            });
            panic!("a miner did not finish within 90 s of the restart: {state}");
        };
        finished.unwrap().unwrap();
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history.len(), 3, "the run went on to its end");
    assert!(history.iter().all(|e| e.completed + e.dropped == 16));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byzantine_replica_is_contained_by_the_robust_merge() {
    use iota_dataplane::miner::merge::MergeFault;
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 3, 3, 18, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    // The first miner (stage 0) sends pseudo-gradients a million times too large.
    let mut miners = vec![swarm.miner_with(|o| o.merge_fault = Some(MergeFault::HugeDelta), stop.clone())];
    miners.extend((0..5).map(|_| swarm.miner(stop.clone())));
    let mut summaries = Vec::new();
    for m in miners {
        summaries
            .push(tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap());
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    println!("byzantine 2x3 tiny: {:?}", history.iter().map(|e| e.mean_loss).collect::<Vec<_>>());
    assert_eq!(history.len(), 3);
    assert!(history[2].mean_loss < history[0].mean_loss - 0.3, "the loss still falls: {history:?}");
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 3);
        assert!(w[0].iter().all(|x| x.is_finite()), "stage {stage} weights stay finite");
        assert!(w.iter().all(|x| *x == w[0]), "stage {stage} replicas identical");
    }
}

/// Issue 15's chaos: a replica killed (it stops dead: no goodbye, no more
/// heartbeats) at `at` in the first epoch; the epoch completes without it,
/// a newcomer takes its place and rejoins by downloading the merged
/// weights, and no committed epoch is lost.
async fn a_replica_crashing_is_planned_out_and_a_newcomer_rejoins_by_download(at: iota_dataplane::miner::CrashPoint) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 2, 3, 16, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let crasher = swarm.miner_with(|o| o.crash_at = Some(at), stop.clone());
    let others: Vec<_> = (0..3).map(|_| swarm.miner(stop.clone())).collect();
    // The crasher stops at its point of the first epoch.
    let crashed = tokio::time::timeout(Duration::from_secs(60), crasher).await.expect("crasher stopped").unwrap();
    let crashed_stage = crashed.unwrap().stage;
    // Once the orchestrator has noticed, a new miner joins and takes its place.
    let deadline = Instant::now() + Duration::from_secs(30);
    while swarm.service.with_state(|o| o.miners().all(|m| m.healthy)) {
        assert!(Instant::now() < deadline, "the crash was not noticed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let newcomer = swarm.miner(stop.clone());
    let mut summaries = Vec::new();
    for m in others.into_iter().chain([newcomer]) {
        summaries
            .push(tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap());
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history.len(), 3, "every epoch completed: {history:?}");
    assert!(history.iter().all(|e| e.completed + e.dropped == 16), "{history:?}");
    assert_eq!(summaries[3].stage, crashed_stage, "the newcomer took the empty place");
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2);
        assert!(w[0] == w[1], "stage {stage}: the newcomer holds the merged weights like its replica");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_crashing_in_the_merge_is_planned_out_and_a_newcomer_rejoins_by_download() {
    a_replica_crashing_is_planned_out_and_a_newcomer_rejoins_by_download(iota_dataplane::miner::CrashPoint::MergePlan)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_crashing_in_the_upload_phase_is_not_waited_for_and_a_newcomer_rejoins_by_download() {
    a_replica_crashing_is_planned_out_and_a_newcomer_rejoins_by_download(iota_dataplane::miner::CrashPoint::Uploading)
        .await;
}

/// A role whose copy of the corpus differs from the launcher's refuses to
/// train on it (the run configuration carries the corpus's hash).
#[test]
fn a_miner_with_another_corpus_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("corpus.txt");
    std::fs::write(&data, iota_model::data::synthetic::grammar_text(1, 50_000)).unwrap();
    let mut cfg = tiny_run(2, 1, 1, 4, WireCodec::Int8Row);
    iota_dataplane::corpus::fix_shards(&mut cfg, Some(&data)).unwrap();
    assert!(iota_dataplane::corpus::load_corpus(&cfg, Some(&data)).is_ok());
    // Same length, other text: the shard count matches, the content does not.
    std::fs::write(&data, iota_model::data::synthetic::grammar_text(2, 50_000)).unwrap();
    let err = iota_dataplane::corpus::load_corpus(&cfg, Some(&data)).err().expect("refused").to_string();
    assert!(err.contains("not the run's"), "{err}");
}

/// The frames a miner sends carry the real hash chain: the head's forward
/// frame answers the hash of its input tokens, a body's forward frame the
/// forward frame it was computed from, and a gradient the forward frame it
/// is the gradient of (was always zeros). The heartbeat's in-flight count
/// follows the micro-batches routed through the miner.
#[test]
fn frames_answer_what_they_were_computed_from() {
    use iota_core::Identity;
    use iota_core::wire::Direction;
    use iota_dataplane::frame::{FrameLimits, FrameMeta, RunContext, build_header};
    use iota_dataplane::miner::events::{Input, Output};
    use iota_dataplane::miner::worker::{Worker, tokens_hash};
    use iota_dataplane::pool::BufferPool;
    use iota_dataplane::{HostPool, PeerDirectory, ReceivedFrame};
    use iota_protocol::pb;

    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(3, 1, 1, 4, WireCodec::Int8Row);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let store = iota_dataplane::local_store::LocalDirStore::shared(
        dir.path().join("store"),
        iota_dataplane::fileio::FileIo::start(false),
    )
    .unwrap();
    let ids: Vec<Identity> = (1..=3u8).map(|i| Identity::from_seed([i; 32])).collect();
    let peers: Vec<pb::PeerInfo> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| pb::PeerInfo {
            peer_id: id.peer_id().0.to_vec(),
            data_addr: format!("127.0.0.1:{}", 9000 + i),
            stage: i as u32,
        })
        .collect();
    let ctx = Arc::new(RunContext::new(cfg.spec.run_id, FrameLimits::default()));
    let worker = |stage: u32| {
        let me = ids[stage as usize].peer_id();
        let mut w = Worker::new(
            Arc::new(iota_model::CpuBackend::new()),
            me,
            cfg.clone(),
            None,
            store.clone(),
            rt.handle().clone(),
            PeerDirectory::new(),
            ctx.clone(),
        );
        let mut out = Vec::new();
        let assign =
            pb::Assignment { stage, num_stages: 3, weights_key: String::new(), peers: peers.clone(), weights: vec![] };
        w.handle(Input::Command(pb::command::Kind::Assign(assign)), &mut out).unwrap();
        let training = pb::PhaseChange { epoch: 0, phase: pb::Phase::Training as i32, ..Default::default() };
        w.handle(Input::Command(pb::command::Kind::Phase(training)), &mut out).unwrap();
        w
    };
    let route = pb::Route {
        overdue_ms: 0,
        epoch: 0,
        shard: 0,
        first_sample: 0,
        samples: cfg.train.batch as u32,
        attempt: 0,
        pathway: ids.iter().map(|i| i.peer_id().0.to_vec()).collect(),
        seq: 0,
    };
    let sent = |out: &mut Vec<Output>| -> (iota_core::PeerId, FrameMeta, bytes::Bytes) {
        let frames: Vec<_> = out
            .drain(..)
            .filter_map(|o| match o {
                Output::Frame { to, meta, payload, .. } => Some((to, meta, payload)),
                Output::Report(_) | Output::Store { .. } | Output::StoreRaw { .. } | Output::FabricatedFrame { .. } => {
                    None
                }
            })
            .collect();
        assert_eq!(frames.len(), 1, "one frame out");
        frames.into_iter().next().unwrap()
    };
    let pool = HostPool::new(1 << 24);
    let received = |from: &Identity, meta: &FrameMeta, payload: &[u8]| {
        let header = build_header(meta, cfg.spec.run_id, 0, payload, from);
        let mut buf = pool.clone().try_take(payload.len()).unwrap();
        buf.copy_from_slice(payload);
        ReceivedFrame { header, payload: buf, peer: from.peer_id() }
    };

    // Head: the frame answers its tokens.
    let mut head = worker(0);
    let mut out = Vec::new();
    head.handle(Input::Command(pb::command::Kind::Route(route.clone())), &mut out).unwrap();
    let (to, act0, payload0) = sent(&mut out);
    assert_eq!(to, ids[1].peer_id());
    let corpus = iota_dataplane::corpus::load_corpus(&cfg, None).unwrap();
    let mb =
        iota_core::MicroBatchId { first: iota_core::SampleId { epoch: 0, shard: 0, index: 0 }, len: route.samples };
    let (x, _) = corpus.micro_batch(cfg.train.seed, mb, cfg.train.seq);
    assert_eq!(act0.answers, tokens_hash(&x));
    assert_eq!(head.in_flight.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Body: its forward frame answers the one it received ...
    let mut body = worker(1);
    body.handle(Input::Command(pb::command::Kind::Route(route.clone())), &mut out).unwrap();
    let f0 = received(&ids[0], &act0, &payload0);
    let id0 = f0.header.frame_id();
    body.handle(Input::Frame(Box::new(f0)), &mut out).unwrap();
    let (to, act1, payload1) = sent(&mut out);
    assert_eq!(to, ids[2].peer_id());
    assert_eq!(act1.direction, Direction::Activation);
    assert_eq!(act1.answers, id0);
    assert_eq!(body.in_flight.load(std::sync::atomic::Ordering::Relaxed), 1);

    // ... the tail's gradient answers the body's forward frame ...
    let mut tail = worker(2);
    tail.handle(Input::Command(pb::command::Kind::Route(route.clone())), &mut out).unwrap();
    let f1 = received(&ids[1], &act1, &payload1);
    let id1 = f1.header.frame_id();
    tail.handle(Input::Frame(Box::new(f1)), &mut out).unwrap();
    let (to, grad2, gpayload2) = sent(&mut out);
    assert_eq!((to, grad2.direction, grad2.answers), (ids[1].peer_id(), Direction::ActivationGrad, id1));
    assert_eq!(tail.in_flight.load(std::sync::atomic::Ordering::Relaxed), 0);

    // ... and the body's gradient answers the forward frame it came in.
    body.handle(Input::Frame(Box::new(received(&ids[2], &grad2, &gpayload2))), &mut out).unwrap();
    let (to, grad1, _) = sent(&mut out);
    assert_eq!((to, grad1.direction, grad1.answers), (ids[0].peer_id(), Direction::ActivationGrad, id0));
    assert_eq!(body.in_flight.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// Issue 21's planted objects in a real swarm: a miner plants part objects
/// with overflowing lengths and a part whose bytes differ from its
/// announcement under the other stage's `weights/` and `momentum/`
/// prefixes, and a writer stores other bytes than it announced. Nobody
/// stops, the run completes, and the orchestrator holds each offender by
/// name: the planter's announcements refused, the liar's objects reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn planted_and_lying_store_objects_stop_nobody_and_are_pinned_on_their_writers() {
    use iota_core::merge::OuterOpt;
    use iota_dataplane::miner::merge::MergeFault;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(2, 2, 3, 16, WireCodec::Int8Row);
    // With outer momentum, every merge reads the previous one's momentum parts.
    cfg.spec.merge.outer = OuterOpt { lr: 0.7, momentum: 0.9 };
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners = vec![
        swarm.miner_with(|o| o.merge_fault = Some(MergeFault::PlantObjects), stop.clone()),
        swarm.miner_with(|o| o.merge_fault = Some(MergeFault::LyingWriter), stop.clone()),
        swarm.miner(stop.clone()),
        swarm.miner(stop.clone()),
    ];
    let mut summaries = Vec::new();
    for m in miners {
        summaries
            .push(tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap());
    }
    let (planter, liar) = (summaries[0].peer, summaries[1].peer);
    let (history, counters, bad, status) = swarm
        .service
        .with_state(|o| (o.history().to_vec(), o.counters().clone(), o.bad_objects().to_vec(), o.status()));
    assert_eq!(history.len(), 3, "every epoch completed: {history:?}");
    assert!(history.iter().all(|e| e.completed + e.dropped == 16));
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2);
        assert!(w[0].iter().all(|x| x.is_finite()), "stage {stage} weights stay finite");
        assert!(w[0] == w[1], "stage {stage} replicas identical");
    }
    // Each merge, the planter announced 3 objects under 3 prefixes of the
    // other stage: the overflowing ones fail the field rules, the
    // mismatched ones are refused as not its to write.
    let refusals = swarm.service.refusals();
    assert!(refusals.get("invalid_field").copied().unwrap_or(0) >= 6, "{refusals:?}");
    assert!(refusals.get("not_yours").copied().unwrap_or(0) >= 3, "{refusals:?}");
    assert!(counters.foreign_objects >= 3 && status.foreign_objects == counters.foreign_objects);
    // No planted object is ever handed to a reader (the planter writes its
    // own stage's slices honestly).
    for stage in 0..2 {
        let objects = swarm.service.with_state(|o| o.stage_weights(stage));
        assert!(!objects.is_empty());
        let foreign = stage != summaries[0].stage;
        assert!(
            objects.iter().all(|o| !o.key.contains("4611686018427387") && (!foreign || o.writer != planter)),
            "{objects:?}"
        );
    }
    // The liar's objects were read (momentum) and reported against it, and
    // only against it.
    assert!(!bad.is_empty(), "the liar's stored objects were reported");
    assert!(bad.iter().all(|b| b.writer == liar), "{bad:?}");
}

/// A miner states its memory when it registers: one whose memory holds no
/// stage of the run stops at once saying what a stage needs; the others,
/// stating enough, are assigned and train the run to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_miner_whose_memory_holds_no_stage_stops_saying_so_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 1, 1, 8, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let small = swarm.miner_with(|o| o.memory_limit = Some(64 << 10), stop.clone());
    let err =
        tokio::time::timeout(Duration::from_secs(30), small).await.expect("it stops at once").unwrap().unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("refused this miner") && msg.contains("needs") && msg.contains("GiB"), "{msg}");
    assert_eq!(swarm.service.with_state(|o| o.miners().count()), 0, "it was not registered");
    let enough = 4u64 << 30;
    let miners: Vec<_> = (0..2).map(|_| swarm.miner_with(|o| o.memory_limit = Some(enough), stop.clone())).collect();
    for m in miners {
        tokio::time::timeout(Duration::from_secs(60), m).await.expect("miner finished in time").unwrap().unwrap();
    }
    let (history, stated) =
        swarm.service.with_state(|o| (o.history().to_vec(), o.miners().map(|m| m.memory.bytes).collect::<Vec<_>>()));
    assert_eq!(history[0].completed, 8);
    assert_eq!(stated, vec![enough; 2]);
}

/// Miners stating memory that holds each stage only if it recomputes its
/// activations in the backward turn recomputation on (`--recompute auto`)
/// and train the run; one stating plenty does not recompute. The memory is
/// taken from the run's plan, not hard-coded: the least that holds every
/// stage recomputing, where some stage holds more that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn miners_whose_memory_needs_it_recompute_activations_and_train() {
    use iota_core::memory_fit::{RunMemoryNeeds, usable};
    use iota_core::memory_plan::{ComputeBackend, FIT_RESERVE, InnerOptimizer};
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run_batch(2, 1, 1, 8, WireCodec::Int8Row, 16);
    let t = &cfg.train;
    let held = cfg.spec.max_in_flight as usize;
    let needs = RunMemoryNeeds::new(&t.model, t.stages, t.batch, t.seq, held, InnerOptimizer::AdamW).unwrap();
    let cpu = ComputeBackend::Cpu;
    let least = (0..2).map(|s| needs.least(cpu, s)).max().unwrap();
    let tight = (least as f64 / (1.0 - FIT_RESERVE)) as u64 + (1 << 20);
    assert!(usable(tight) >= least);
    let recomputing: Vec<bool> = (0..2).map(|s| needs.recomputes(cpu, s, tight)).collect();
    assert!(recomputing.iter().any(|&r| r), "the plan gives no memory where recomputing holds more: {needs:?}");
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..2).map(|_| swarm.miner_with(|o| o.memory_limit = Some(tight), stop.clone())).collect();
    let mut summaries = Vec::new();
    for m in miners {
        summaries.push(
            tokio::time::timeout(Duration::from_secs(60), m).await.expect("miner finished in time").unwrap().unwrap(),
        );
    }
    for s in &summaries {
        assert_eq!(s.recomputed, recomputing[s.stage as usize], "stage {}", s.stage);
        assert!(s.optimizer_steps > 0);
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history[0].completed, 8);
    assert!(history[0].mean_loss.is_finite());
    assert!(!needs.recomputes(cpu, 0, 64 << 30) && !needs.recomputes(cpu, 1, 64 << 30), "plenty: no need");
}

/// The orchestrator crashes while a butterfly merge is running (at its
/// start, and again with some participants' reports in) and restarts from
/// its saved state: the merge completes and the run goes on to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_orchestrator_restarted_during_a_merge_finishes_it() {
    use iota_control::orchestrator::Phase;
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 2, 3, 16, WireCodec::Int8Row);
    let mut swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..4).map(|_| swarm.miner(stop.clone())).collect();
    for epoch in 0..2u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (e, merging, done) = swarm.service.with_state(|o| {
                (
                    o.epoch(),
                    matches!(o.phase(), Phase::Merging),
                    (0..2).map(|s| o.merge_progress(s).settled).sum::<usize>(),
                )
            });
            assert!(e <= epoch && Instant::now() < deadline, "epoch {epoch}'s merge was not seen (now epoch {e})");
            // Epoch 0: crash as the merge starts; epoch 1: once a partition is settled.
            if e == epoch && merging && (epoch == 0 || done > 0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        swarm = swarm.restart(&cfg).await;
    }
    for m in miners {
        let Ok(finished) = tokio::time::timeout(Duration::from_secs(90), m).await else {
            let state = swarm.service.with_state(|o| {
                let merges: Vec<_> = (0..2).map(|s| o.merge_progress(s)).collect();
                format!("phase {:?} epoch {} merges {merges:?} {:?}", o.phase(), o.epoch(), o.counters())
            });
            panic!("a miner did not finish within 90 s of the restarts: {state}");
        };
        finished.unwrap().unwrap();
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history.len(), 3, "the run went on to its end");
}

/// Weight prediction is a setting of the run: carried to the miners in its
/// configuration (and its id), and refused beside validators, whose
/// recompute runs a forward on committed weights, not predicted ones.
#[test]
fn weight_prediction_is_a_run_setting_refused_with_validators() {
    let plain = tiny_run(2, 1, 1, 4, WireCodec::Int8Row);
    let mut cfg = plain.clone();
    cfg.train.adamw.predict_weights = true;
    cfg.validate().unwrap();
    let json = cfg.to_json();
    assert!(json.contains("\"predict_weights\":true"), "{json}");
    assert!(!plain.to_json().contains("predict_weights"), "left out when off");
    assert!(iota_protocol::RunConfig::from_json(&json).unwrap().train.adamw.predict_weights);
    cfg.spec.validation.validators =
        vec![iota_protocol::ValidatorStake { peer: iota_core::PeerId([7; 32]), stake: 10 }];
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("weight prediction"), "{err}");
}

/// Muon is a setting of the run, carried to the miners in its
/// configuration and left out when off (older runs keep their id); a
/// setting a miner's build does not know is refused by name, where it used
/// to be dropped, leaving that miner on the default optimizer.
#[test]
fn muon_travels_in_the_run_config_and_unknown_settings_are_refused() {
    let plain = tiny_run(2, 1, 1, 4, WireCodec::Int8Row);
    let mut cfg = plain.clone();
    cfg.train.adamw.set_optimizer("muon").unwrap();
    let json = cfg.to_json();
    assert!(json.contains("\"muon\":true"), "{json}");
    assert!(!plain.to_json().contains("muon"), "left out when off");
    assert!(iota_protocol::RunConfig::from_json(&json).unwrap().train.adamw.muon);
    assert!(cfg.train.adamw.set_optimizer("lion").unwrap_err().to_string().contains("adamw, nadam, muon"));
    // A newer orchestrator's setting, as an older miner would see it.
    let newer = json.replacen("\"muon\":true", "\"muon\":true,\"look_ahead\":3", 1);
    assert!(newer != json);
    let err = iota_protocol::RunConfig::from_json(&newer).unwrap_err().to_string();
    assert!(err.contains("train.adamw.look_ahead") && err.contains("upgrade"), "{err}");
    let top = plain.to_json().replacen('{', "{\"sharding\":\"new\",", 1);
    let err = iota_protocol::RunConfig::from_json(&top).unwrap_err().to_string();
    assert!(err.contains("sharding"), "{err}");
}
