//! The swarm every merge adversary test runs in, and the one-miner merge
//! adversaries' tests (issue 13's and issue 56's).

use super::*;

/// What a run with one merge adversary ended with.
pub(super) struct MergeCheatRun {
    pub(super) bad: iota_core::PeerId,
    pub(super) history: Vec<iota_control::orchestrator::EpochSummary>,
    pub(super) counters: iota_control::orchestrator::Counters,
    pub(super) mismatches: Vec<iota_core::merge::Mismatch>,
    pub(super) verdicts: Vec<iota_control::orchestrator::VerdictRecord>,
    /// Every miner at the end: (peer, stage, epochs convicted).
    pub(super) miners: Vec<(iota_core::PeerId, u32, u32)>,
}

/// `tiny` over `shape` for `epochs` x `per_epoch` micro-batches, two
/// validators (`change` sets the run up further), the first miner to
/// register running `mode` and `honest` honest ones after it; returns once
/// the honest miners and the validators are done.
pub(super) async fn run_merge_cheat(
    mode: Adversary,
    (stages, replicas): (u32, u32),
    (epochs, per_epoch): (u64, u64),
    honest: usize,
    change: fn(&mut iota_protocol::RunConfig),
) -> MergeCheatRun {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(stages, replicas, epochs, per_epoch, WireCodec::Int8Row);
    let ids = iota_tests::with_validators(&mut cfg, 2);
    change(&mut cfg);
    let swarm = iota_tests::Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let vs: Vec<_> = ids.into_iter().enumerate().map(|(i, id)| swarm.validator(id, i as u64, stop.clone())).collect();
    let bad = swarm.miner_with(|o| o.adversary = Some(mode), stop.clone());
    let bad_peer = swarm.first_registered().await;
    let honest: Vec<_> = (0..honest).map(|_| swarm.miner(stop.clone())).collect();
    for m in honest {
        tokio::time::timeout(Duration::from_secs(120), m).await.expect("miner finished in time").unwrap().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(10), bad).await;
    for v in vs {
        tokio::time::timeout(Duration::from_secs(10), v).await.expect("validator ended").unwrap().unwrap();
    }
    swarm.service.with_state(|o| MergeCheatRun {
        bad: bad_peer,
        history: o.history().to_vec(),
        counters: o.counters().clone(),
        mismatches: o.mismatches().to_vec(),
        verdicts: o.verdicts().to_vec(),
        miners: o.miners().map(|m| (m.peer, m.stage, m.convicted_epochs)).collect(),
    })
}

/// Issue 13's merge adversaries: `tiny`, 2 stages x 3 replicas (with two,
/// every partition is owned by both replicas, so a sender is never a third
/// party to one), two validators, 2 epochs; `mode` is the first miner to
/// register. Checks what holds for every merge cheat: it is convicted in
/// the first merge it joins and never before, no honest owner is named for
/// a disagreement and no honest miner is accused, every merge leaves the
/// replicas with the same weights, and the run completes and learns.
async fn a_merge_cheat_is_convicted_in_its_first_merge(mode: Adversary) -> MergeCheatRun {
    a_merge_cheat_among(mode, 3).await
}

/// `a_merge_cheat_is_convicted_in_its_first_merge` with `replicas` a stage
/// (at 2, every partition is owned by the cheat and one honest replica,
/// and no third can referee).
async fn a_merge_cheat_among(mode: Adversary, replicas: u32) -> MergeCheatRun {
    a_merge_cheat_named_within(mode, replicas, 0).await
}

/// `a_merge_cheat_among`, the cheat convicted in its first merge or up to
/// `within` epochs after it (a withholding finding waits seconds for the
/// store and outlives its merge: it convicts in the epoch it lands in).
async fn a_merge_cheat_named_within(mode: Adversary, replicas: u32, within: usize) -> MergeCheatRun {
    let honest = 2 * replicas as usize - 1;
    let r = run_merge_cheat(mode, (2, replicas), (2, 16), honest, |_| {}).await;
    let (bad_peer, history, counters, mismatches, verdicts) =
        (r.bad, &r.history, &r.counters, &r.mismatches, &r.verdicts);
    println!("history: {:?}", history.iter().map(|e| (e.mean_loss, &e.convicted)).collect::<Vec<_>>());
    println!("{counters:?}");
    assert_eq!(history.len(), 2, "the run completes");
    // The first merge it joined with something to cheat with: epoch 0's,
    // unless a loaded machine kept it out of that one or routed it no
    // work (a zero pseudo-gradient tripled is the same zeros: nothing to
    // equivocate with).
    let joined = history
        .iter()
        .position(|e| e.miners.iter().any(|m| m.peer == bad_peer && ((m.merged && m.completed > 0) || m.convicted)));
    let first = joined.expect("the cheat joined a merge");
    let named = history.iter().position(|e| !e.convicted.is_empty()).expect("the cheat was convicted");
    assert!((first..=first + within).contains(&named), "convicted in merge {first} or {within} after: {history:?}");
    assert_eq!(history[named].convicted, vec![bad_peer], "only the cheat: {history:?}");
    for m in mismatches {
        assert!(m.deviants.iter().all(|d| *d == bad_peer), "an honest owner was named: {m:?}");
    }
    let against_honest: Vec<_> = verdicts.iter().filter(|v| v.guilty && v.miner != bad_peer).collect();
    assert!(against_honest.is_empty(), "honest miners accused: {against_honest:?}");
    assert_eq!(counters.divergent_merges, 0, "every merge left the replicas with the same weights");
    let last_loss = history[1].mean_loss;
    assert!(last_loss.is_finite() && last_loss < 5.4, "the run learns: {history:?}");
    r
}

/// `merge-equivocate`: a replica that sends the two owners of a partition
/// different slices is proven by the two headers it signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_equivocating_in_the_merge_is_proven_and_convicted_in_its_first_merge_and_honest_owners_never() {
    let r = a_merge_cheat_is_convicted_in_its_first_merge(Adversary::MergeEquivocate).await;
    assert!(r.counters.equivocations >= 1, "the equivocation was proven: {:?}", r.counters);
    assert_eq!(r.counters.flawed_contributions, 0);
    let _ = r.history;
}

/// `withholder`: a replica that keeps its contribution to one partition
/// from that partition's two owners, and never stores it, while it
/// reports everything else. The owners report it missing and the stage
/// merges without it instead of stalling or waiting; the validators find
/// it not stored and it is convicted in that epoch or, the finding coming
/// after the merge, the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_withholding_its_contribution_is_convicted_by_the_next_epoch_and_the_stage_does_not_stall() {
    let r = a_merge_cheat_named_within(Adversary::Withholder, 3, 1).await;
    assert!(r.counters.withheld_contributions >= 1, "{:?}", r.counters);
    assert_eq!((r.counters.equivocations, r.counters.missing_claims_refuted), (0, 0), "{:?}", r.counters);
}

/// `withholder` at two replicas: it withholds from its honest co-owner and
/// reports the partition itself. The honest owner's claim, and the
/// validators' finding, name it; before, the honest owner was planned
/// out as the laggard and the withholder merged alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_two_replicas_a_withholder_is_convicted_not_its_honest_co_owner() {
    let r = a_merge_cheat_named_within(Adversary::Withholder, 2, 1).await;
    assert!(r.counters.withheld_contributions >= 1, "{:?}", r.counters);
}

/// `lying-owner` at two replicas: it publishes a wrong update for every
/// partition it owns with the honest replica, and there is no third to
/// referee. The validators' recompute of the dispute names it in its
/// first merge (before, every slice kept its previous weights, every
/// epoch, and nobody was named).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_two_replicas_a_lying_owner_is_named_by_the_audit_of_its_disputes() {
    let r = a_merge_cheat_among(Adversary::LyingOwner, 2).await;
    assert!(r.counters.deviant_owners >= 1, "{:?}", r.counters);
    assert!(r.counters.hash_mismatches >= 1);
}

/// `framing-sender`: a replica that sends the owners its true contribution
/// and stores another, signed, when asked to for the audit, so that the
/// recompute from the store would name the honest owners. The stored
/// frame against the header the owners reported proves it: it is
/// convicted in its first merge and no owner is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sender_storing_another_contribution_than_it_sent_is_convicted_and_no_owner_named() {
    let r = a_merge_cheat_is_convicted_in_its_first_merge(Adversary::FramingSender).await;
    assert!(r.counters.equivocations >= 1, "the stored frame proved it: {:?}", r.counters);
    assert_eq!(r.counters.colluding_owners, 0, "{:?}", r.counters);
}

/// `nan`: a replica whose pseudo-gradient holds a NaN is flagged by the two
/// other owners of a partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_sending_nan_in_the_merge_is_convicted_in_its_first_merge_and_honest_miners_never() {
    let r = a_merge_cheat_is_convicted_in_its_first_merge(Adversary::Nan).await;
    // Flagged by the owners, or (whichever comes first) named by the
    // audit: not the pseudo-gradient of its committed weights.
    let c = &r.counters;
    assert!(c.flawed_contributions + c.unbound_contributions >= 1, "{c:?}");
    assert_eq!(r.counters.equivocations, 0);
}

/// `merge-garbage`: a pseudo-gradient a million times too large is flagged
/// as a far outlier by the two other owners of a partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_sending_garbage_in_the_merge_is_convicted_in_its_first_merge_and_honest_miners_never() {
    let r = a_merge_cheat_is_convicted_in_its_first_merge(Adversary::MergeGarbage).await;
    // Flagged, or named unbound by the audit, whichever comes first.
    let c = &r.counters;
    assert!(c.flawed_contributions + c.unbound_contributions >= 1, "{c:?}");
    assert_eq!(r.counters.equivocations, 0);
    let _ = r.bad;
}
