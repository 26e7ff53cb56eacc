//! Merge codecs end to end: an in-process swarm (orchestrator over gRPC,
//! miners over QUIC on 127.0.0.1) whose replicas send sparse contributions.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use iota_core::PeerId;
use iota_core::WireCodec;
use iota_tests::{Swarm, tiny_run};

/// Sparse contributions end to end (`--merge-codec sparse`): a swarm whose
/// replicas send the largest 1/32 of their pseudo-gradients, holding back
/// the rest for their next merge, still trains, and after each merge the
/// replicas of a stage hold the same weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swarm_with_sparse_contributions_trains_and_its_replicas_agree() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(3, 2, 3, 24, WireCodec::Int8Row);
    cfg.spec.merge.sparse_density = 1.0 / 32.0;
    cfg.spec.validate().unwrap();
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
    println!("sparse swarm 3x2 tiny: {:?}", history.iter().map(|e| e.mean_loss).collect::<Vec<_>>());
    assert_eq!(history.len(), 3);
    // Each merge carries a thirty-second of what the replicas trained (the
    // rest waits in their backlogs), so an epoch starts well above where
    // the last one ended (docs/BENCHMARKS.md: the loss it costs); over the
    // run the model still learns.
    assert!(history.iter().all(|e| e.completed == 24 && e.losses.len() == 24), "{history:?}");
    let (first, last) = (history[0].losses[0], history[2].losses[23]);
    assert!(last < first - 0.8, "the loss falls over the run: {first} -> {last}");
    for stage in 0..3 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2, "two replicas of stage {stage}");
        assert!(w[0] == w[1], "stage {stage} replicas differ after the merge");
    }
    // With validators the run is refused, saying why.
    cfg.spec.validation.validators = vec![iota_protocol::ValidatorStake { peer: PeerId([9; 32]), stake: 1 }];
    let why = cfg.spec.validate().unwrap_err();
    assert!(why.contains("sparse contributions are not validated yet"), "{why}");
}
