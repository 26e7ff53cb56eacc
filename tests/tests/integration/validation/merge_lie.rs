//! A replica lying about the weights its merge ended with is convicted,
//! and does not get its honest replicas convicted.

use iota_control::validation::quorum::Check;

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
    // Every attempt of every miner is drawn.
    let r = run_merge_cheat(Adversary::MergeLie, (2, 2), (3, 12), 3, |c| c.spec.validation.min_per_miner = 64).await;
    let (liar, history, verdicts) = (r.bad, &r.history, &r.verdicts);
    assert_eq!(history.len(), 3, "the run completes");
    assert!(r.counters.divergent_merges >= 1, "the lie was told: {:?}", r.counters);
    let against_honest: Vec<_> = verdicts.iter().filter(|v| v.guilty && v.miner != liar).collect();
    assert!(against_honest.is_empty(), "honest miners accused: {against_honest:?}");
    // The liar: convicted on its first merge's report, by both validators.
    let against_liar: Vec<_> = verdicts.iter().filter(|v| v.guilty && v.miner == liar).collect();
    assert!(
        against_liar.iter().filter(|v| v.epoch == 0 && v.check == Check::Merge).count() == 2,
        "the liar was not voted down for epoch 0's merge by both validators: {verdicts:?}"
    );
    assert!(against_liar.iter().all(|v| v.check == Check::Merge), "{against_liar:?}");
    let strikes = r.miners.iter().find(|m| m.0 == liar).map(|m| m.2);
    assert!(strikes.is_some_and(|n| n >= 1), "the liar took no strike: {strikes:?}");
    assert_eq!(history[0].convicted, vec![liar], "convicted in the epoch it lied in");
    // The honest replica of the liar's stage was checked after a lied-about
    // merge, and cleared.
    let replica = r.miners.iter().find(|m| m.1 == 0 && m.0 != liar).expect("stage 0's honest replica").0;
    assert!(
        verdicts.iter().any(|v| v.miner == replica && v.epoch >= 1 && !v.guilty),
        "the honest replica was never judged after the first merge: {verdicts:?}"
    );
}
