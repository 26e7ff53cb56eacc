//! A replica lying about the weights its merge ended with is convicted,
//! and does not get its honest replicas convicted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use iota_control::validation::quorum::Check;
use iota_dataplane::miner::Adversary;

use super::*;

/// `merge-lie`: one of stage 0's two replicas merges honestly but reports
/// a false hash of its merged weights, the greatest there is. The
/// orchestrator records each stage's next start as the most reported hash,
/// so at R = 2 the tie goes to the lie, and its honest replica's true
/// starting weights no longer match the record. The validators load every
/// merge they keep from the store and hash it themselves, and accept that
/// start too: with every attempt drawn (the ones before the first inner
/// step included), over three epochs no honest miner is accused. The liar
/// is: its report contradicts the stored merge its honest replica
/// confirmed, so both validators vote it guilty on its first merge; the
/// epoch waits for the second vote, so the conviction is the epoch's (out
/// of its pay) and a strike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_lying_about_its_merged_weights_is_convicted_and_no_honest_replica_accused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(2, 2, 3, 12, WireCodec::Int8Row);
    let ids = iota_tests::with_validators(&mut cfg, 2);
    // Every attempt of every miner is drawn.
    cfg.spec.validation.min_per_miner = 64;
    let swarm = iota_tests::Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let vs: Vec<_> = ids.into_iter().enumerate().map(|(i, id)| swarm.validator(id, i as u64, stop.clone())).collect();
    let liar = swarm.miner_with(|o| o.adversary = Some(Adversary::MergeLie), stop.clone());
    let liar_peer = swarm.first_registered().await;
    let honest: Vec<_> = (0..3).map(|_| swarm.miner(stop.clone())).collect();
    for m in honest {
        tokio::time::timeout(Duration::from_secs(120), m).await.expect("miner finished in time").unwrap().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(10), liar).await;
    for v in vs {
        tokio::time::timeout(Duration::from_secs(10), v).await.expect("validator ended").unwrap().unwrap();
    }
    let (history, counters, verdicts, stage0, strikes) = swarm.service.with_state(|o| {
        let stage0: Vec<_> = o.miners().filter(|m| m.stage == 0).map(|m| m.peer).collect();
        let strikes = o.miners().find(|m| m.peer == liar_peer).map(|m| m.convicted_epochs);
        (o.history().to_vec(), o.counters().clone(), o.verdicts().to_vec(), stage0, strikes)
    });
    assert_eq!(history.len(), 3, "the run completes");
    assert!(counters.divergent_merges >= 1, "the lie was told: {counters:?}");
    let against_honest: Vec<_> = verdicts.iter().filter(|v| v.guilty && v.miner != liar_peer).collect();
    assert!(against_honest.is_empty(), "honest miners accused: {against_honest:?}");
    // The liar: convicted on its first merge's report, by both validators.
    let against_liar: Vec<_> = verdicts.iter().filter(|v| v.guilty && v.miner == liar_peer).collect();
    assert!(
        against_liar.iter().filter(|v| v.epoch == 0 && v.check == Check::Merge).count() == 2,
        "the liar was not voted down for epoch 0's merge by both validators: {verdicts:?}"
    );
    assert!(against_liar.iter().all(|v| v.check == Check::Merge), "{against_liar:?}");
    assert!(strikes.is_some_and(|n| n >= 1), "the liar took no strike: {strikes:?}");
    assert_eq!(history[0].convicted, vec![liar_peer], "convicted in the epoch it lied in");
    // The honest replica of the liar's stage was checked after a lied-about
    // merge, and cleared.
    let replica = stage0.iter().copied().find(|p| *p != liar_peer).expect("stage 0's honest replica");
    assert!(
        verdicts.iter().any(|v| v.miner == replica && v.epoch >= 1 && !v.guilty),
        "the honest replica was never judged after the first merge: {verdicts:?}"
    );
}
