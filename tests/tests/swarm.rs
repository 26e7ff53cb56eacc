//! In-process swarms: an orchestrator over gRPC and miners over QUIC on
//! 127.0.0.1, training `tiny` end to end.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use iota_core::WireCodec;
use iota_tests::{Swarm, tiny_run};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_stages_two_replicas_train_and_merge() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(dir.path(), 3, 2, 3, 24, WireCodec::Int8Row);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequential_swarm_equals_the_single_process_trainer() {
    use iota_model::CpuBackend;
    use iota_model::train::Pipeline;

    let dir = tempfile::tempdir().unwrap();
    // 3 stages x 1 replica, no bottleneck (exact f32 boundaries), one
    // micro-batch at a time.
    let mut cfg = tiny_run(dir.path(), 3, 1, 2, 12, WireCodec::F32);
    cfg.spec.max_in_flight = 1;
    // One replica: the parameter server's "average" of it is exact.
    cfg.spec.merge = Default::default();
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..3).map(|_| swarm.miner(stop.clone())).collect();
    for m in miners {
        tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap();
    }
    let swarm_losses: Vec<f32> =
        swarm.service.with_state(|o| o.history().iter().flat_map(|e| e.losses.clone()).collect());
    assert_eq!(swarm_losses.len(), 24);

    // The same run in one process.
    let corpus = iota_dataplane::corpus::load_corpus(&cfg).unwrap();
    let mut p = Pipeline::new(Arc::new(CpuBackend::new()), cfg.train.clone()).unwrap();
    let trainer: Vec<f32> = (0..24).map(|_| p.train_step(&corpus).unwrap().loss).collect();
    for (i, (a, b)) in swarm_losses.iter().zip(&trainer).enumerate() {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "micro-batch {i}: swarm {a} vs trainer {b}");
    }
    assert!(trainer[23] < trainer[0], "and it learns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_miner_work_is_rerouted_and_the_epoch_completes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(dir.path(), 3, 2, 2, 40, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let flags: Vec<Arc<AtomicBool>> = (0..6).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let miners: Vec<_> = flags.iter().map(|f| swarm.miner(f.clone())).collect();
    // Once training is under way, kill a miner of the middle stage.
    let deadline = Instant::now() + Duration::from_secs(30);
    while swarm.service.with_state(|o| o.counters().completed) < 5 {
        assert!(Instant::now() < deadline, "training did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = swarm.service.with_state(|o| o.miners().find(|m| m.stage == 1).map(|m| m.index).unwrap());
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
    assert!(counters.rerouted > 0, "the victim's micro-batches were re-routed");
    assert!(counters.completed >= 70, "{counters:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarted_orchestrator_resumes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(dir.path(), 2, 1, 3, 16, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..2).map(|_| swarm.miner(stop.clone())).collect();
    // Wait until the first epoch is complete, then crash and restart the orchestrator.
    let deadline = Instant::now() + Duration::from_secs(60);
    while swarm.service.with_state(|o| o.epoch()) < 1 {
        assert!(Instant::now() < deadline, "first epoch did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let swarm = swarm.restart(&cfg).await;
    assert!(swarm.service.with_state(|o| o.epoch()) >= 1, "the completed epoch survived the crash");
    for m in miners {
        tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner finished").unwrap().unwrap();
    }
    let history = swarm.service.with_state(|o| o.history().to_vec());
    assert_eq!(history.len(), 3, "the run went on to its end");
    assert!(history.iter().all(|e| e.completed + e.dropped == 16));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byzantine_replica_is_contained_by_the_robust_merge() {
    use iota_dataplane::miner::merge::MergeFault;
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(dir.path(), 2, 3, 3, 18, WireCodec::Int8Row);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_crashing_in_the_merge_is_planned_out_and_a_newcomer_rejoins_by_download() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(dir.path(), 2, 2, 3, 16, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let crasher = swarm.miner_with(|o| o.crash_on_merge_plan = true, stop.clone());
    let others: Vec<_> = (0..3).map(|_| swarm.miner(stop.clone())).collect();
    // The crasher stops when the first merge plan reaches it.
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
    assert_eq!(summaries[3].stage, crashed_stage, "the newcomer took the empty place");
    for stage in 0..2 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2);
        assert!(w[0] == w[1], "stage {stage}: the newcomer holds the merged weights like its replica");
    }
}

/// A role whose copy of the corpus differs from the launcher's refuses to
/// train on it (the run configuration carries the corpus's hash).
#[test]
fn a_miner_with_another_corpus_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("corpus.txt");
    std::fs::write(&data, iota_model::data::synthetic::grammar_text(1, 50_000)).unwrap();
    let mut cfg = tiny_run(dir.path(), 2, 1, 1, 4, WireCodec::Int8Row);
    cfg.data = Some(data.clone());
    iota_dataplane::corpus::fix_shards(&mut cfg).unwrap();
    assert!(iota_dataplane::corpus::load_corpus(&cfg).is_ok());
    // Same length, other text: the shard count matches, the content does not.
    std::fs::write(&data, iota_model::data::synthetic::grammar_text(2, 50_000)).unwrap();
    let err = iota_dataplane::corpus::load_corpus(&cfg).err().expect("refused").to_string();
    assert!(err.contains("not the run's"), "{err}");
}
