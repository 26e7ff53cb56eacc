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
