//! Merge codecs end to end: an in-process swarm (orchestrator over gRPC,
//! miners over QUIC on 127.0.0.1) whose replicas send sparse contributions.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

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
    for e in &history {
        println!("  epoch {} losses {:?}", e.epoch, e.losses);
    }
    assert_eq!(history.len(), 3);
    // Each merge carries a thirty-second of what the replicas trained (the
    // rest waits in their backlogs), so an epoch starts well above where
    // the last one ended (docs/BENCHMARKS.md: the loss it costs); over the
    // run the model still learns.
    assert!(history.iter().all(|e| e.completed == 24 && e.losses.len() == 24), "{history:?}");
    // Where the run starts: the median of the first six micro-batches
    // issued (one re-issued after a timeout completes on trained weights,
    // so not the first alone); where it ends: the last epoch's mean (one
    // micro-batch's loss swings by a unit with its pathway and its data).
    let mut start: Vec<f32> = history[0].losses[..6].to_vec();
    start.sort_by(f32::total_cmp);
    let (first, last) = (start[3], history[2].mean_loss);
    assert!(last < first - 0.6, "the loss falls over the run: {first} -> {last}");
    for stage in 0..3 {
        let w: Vec<&Vec<f32>> = summaries.iter().filter(|s| s.stage == stage).map(|s| &s.params).collect();
        assert_eq!(w.len(), 2, "two replicas of stage {stage}");
        assert!(w[0] == w[1], "stage {stage} replicas differ after the merge");
    }
}

/// Validated sparse contributions (PROTOCOL.md, "Sparse contributions
/// bound to the backlog"): every replica commits to the backlog its
/// contributions start from, and the merge audit holds each stored
/// contribution against it and the backlog against the merge before. Over
/// three merges (the last two carrying backlogs) no honest replica is
/// accused or convicted; a replica that inflates the backlog it carries
/// (fourfold, committed to and contributed from consistently) is convicted
/// at the first merge where it carries one, and nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn validated_sparse_contributions_convict_an_inflated_backlog_and_no_honest_replica() {
    use iota_dataplane::miner::Adversary;
    use iota_tests::validation::{Place, Scenario};
    let sparse = |c: &mut iota_protocol::RunConfig| c.spec.merge.sparse_density = 1.0 / 20.0;
    for adversary in [None, Some((Adversary::InflatedBacklog, Place::Head))] {
        let r = Scenario { config: sparse, ..Scenario::new(adversary, 3, 16) }.run().await;
        let convicted: Vec<_> = r.history.iter().map(|h| h.convicted.clone()).collect();
        println!(
            "sparse validated {adversary:?}: {:?} {convicted:?}",
            r.history.iter().map(|h| h.mean_loss).collect::<Vec<_>>()
        );
        assert_eq!(r.history.len(), 3, "{adversary:?}: the run completes");
        let against_honest: Vec<_> = r.verdicts.iter().filter(|v| v.guilty && Some(v.miner) != r.bad).collect();
        assert!(against_honest.is_empty(), "{adversary:?}: honest miners accused: {against_honest:?}");
        match r.bad {
            None => assert!(convicted.iter().all(Vec::is_empty), "honest run: {convicted:?}"),
            Some(bad) => {
                // Its first merge carries nothing to inflate (a fresh backlog).
                assert!(convicted[0].is_empty(), "{convicted:?}");
                assert_eq!(convicted[1], vec![bad], "convicted at its first carried backlog, nobody else");
                assert!(convicted.iter().flatten().all(|p| *p == bad), "{convicted:?}");
            }
        }
    }
}

/// After a rollback the next epoch starts from the seed's weights again;
/// its contributions are held against them (the orchestrator says the
/// epoch started from the seed: `MergeAuditContext.seed_start`), not left
/// unjudged. Both validators roll epoch 0's merge back (a test tool): the
/// replica that inflates its backlog is convicted at epoch 1 all the same,
/// and no honest replica is accused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_rollback_an_inflated_backlog_is_still_convicted_and_no_honest_replica() {
    use iota_dataplane::miner::Adversary;
    use iota_tests::validation::{Place, Scenario};
    let r = Scenario {
        config: |c| c.spec.merge.sparse_density = 1.0 / 20.0,
        every_validator: |o| o.roll_back_epochs = vec![0],
        ..Scenario::new(Some((Adversary::InflatedBacklog, Place::Head)), 3, 16)
    }
    .run()
    .await;
    let convicted: Vec<_> = r.history.iter().map(|h| h.convicted.clone()).collect();
    let rolled: Vec<bool> = r.history.iter().map(|h| h.rolled_back).collect();
    println!("rolled back {rolled:?}, convicted {convicted:?}");
    assert_eq!(rolled, vec![true, false, false], "epoch 0's merge is rolled back, and only it");
    let bad = r.bad.expect("the adversary registered");
    let against_honest: Vec<_> = r.verdicts.iter().filter(|v| v.guilty && v.miner != bad).collect();
    assert!(against_honest.is_empty(), "honest miners accused: {against_honest:?}");
    assert!(convicted[0].is_empty(), "{convicted:?}");
    assert_eq!(convicted[1], vec![bad], "convicted in the epoch after the rollback, nobody else");
    assert!(convicted.iter().flatten().all(|p| *p == bad), "{convicted:?}");
}
