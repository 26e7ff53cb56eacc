//! Withheld merge contributions (withholding.rs): a sender that keeps its
//! contribution to one partition from the owners, while it reports
//! everything else, is planned out instead of holding the stage hostage;
//! convicted on two owners' claims or the validators' finding; never an
//! honest owner in its place. A false claim is refuted by the validators.

use iota_wire::ValidatorStake;

use super::validation::validator;
use super::*;

/// One stage of `replicas` butterfly replicas, 2 epochs of 8 micro-batches;
/// with `validators`, validators 0 (60) and 1 (40), subscribed.
pub(super) fn one_stage(replicas: u8, validators: bool) -> Sim {
    let mut spec = butterfly_spec(1, u32::from(replicas));
    spec.micro_batches_per_epoch = 8;
    if validators {
        spec.validation.validators =
            vec![ValidatorStake { peer: validator(0), stake: 60 }, ValidatorStake { peer: validator(1), stake: 40 }];
        spec.validation.timeout_ms = 20_000;
    }
    let mut s = Sim::new(spec);
    if validators {
        for v in [validator(0), validator(1)] {
            s.ev(Event::RegisterValidator { peer: v, device: "cpu".into() });
            s.ev(Event::Subscribed { peer: v });
        }
    }
    register_all(&mut s, replicas);
    s
}

/// The epochs in which `p` was convicted.
fn convicted_in(s: &Sim, p: PeerId) -> Vec<u64> {
    s.o.history().iter().filter(|e| e.convicted.contains(&p)).map(|e| e.epoch).collect()
}

/// Every merge completed with the replicas agreeing, and nobody but `bad`
/// was convicted.
fn only_convicted(s: &Sim, bad: Option<PeerId>) {
    assert_eq!(*s.o.phase(), Phase::Done, "the run completes");
    assert_eq!(s.o.counters().divergent_merges, 0);
    for e in s.o.history() {
        assert!(e.convicted.iter().all(|c| Some(*c) == bad), "epoch {}: {:?} convicted", e.epoch, e.convicted);
    }
}

#[test]
fn a_sender_both_owners_miss_is_planned_out_and_convicted_without_validators() {
    let mut s = one_stage(3, false);
    s.withholders.insert(peer(0));
    s.run_until_done(400);
    only_convicted(&s, Some(peer(0)));
    let c = s.o.counters();
    assert_eq!(c.withheld_contributions, 1, "named once, then out of the run's merges: {c:?}");
    assert_eq!(c.withheld_planned_out, 0);
    assert_eq!(convicted_in(&s, peer(0)), vec![0], "named in the epoch it withheld");
}

/// With validators, two owners' claims plan the withholder out at once:
/// the stage merges without it and never waits for the validators. Their
/// finding convicts it in its epoch when it comes during the merge, and
/// in the next (its pay for that one) when it comes after.
#[test]
fn the_validators_convict_a_withholder_without_holding_the_merge() {
    let mut s = one_stage(3, true);
    s.withholders.insert(peer(0));
    s.run_until_done(400);
    only_convicted(&s, Some(peer(0)));
    let c = s.o.counters();
    assert_eq!(c.withheld_contributions, 1, "{c:?}");
    assert_eq!(c.withheld_planned_out, 1, "planned out at the second claim, before the finding: {c:?}");
    assert_eq!(convicted_in(&s, peer(0)), vec![0]);
    assert_eq!(c.missing_claims_refuted, 0);

    // The validators answer only after merge 0 is over (epoch 1's merge is
    // held so that the run is still going when they do).
    let mut s = one_stage(3, true);
    s.withholders.insert(peer(0));
    s.slow_audits = true;
    s.stall_from = 1;
    s.until_merging_held(&[peer(0), peer(1), peer(2)]);
    assert_eq!(s.o.epoch(), 1, "merge 0 did not wait for the finding");
    assert_eq!(s.o.counters().withheld_contributions, 0);
    assert!(s.o.miner(&peer(0)).is_some_and(|m| !m.convicted));
    s.tick(500);
    assert_eq!(s.o.counters().withheld_contributions, 1, "the finding outlived its merge");
    let m = s.o.miner(&peer(0)).unwrap();
    assert!(m.convicted && m.excluded(2), "late: out of the epoch it lands in and the next");
    s.stalled.clear();
    let held = std::mem::take(&mut s.held);
    s.inbox.extend(held);
    s.run_until_done(400);
    only_convicted(&s, Some(peer(0)));
    assert_eq!(convicted_in(&s, peer(0)), vec![1], "unpaid for epoch 1 instead");
    assert!(s.o.history()[0].miners.iter().all(|m| m.peer == peer(0) || m.credited > 0), "the honest were paid");
}

/// R = 2: the withholder owns the partition with the honest replica and
/// reports it itself. Before, the honest owner was planned out as the
/// laggard and the withholder merged alone.
#[test]
fn at_two_replicas_the_withholder_not_the_honest_co_owner_leaves_the_merge() {
    // With validators: their finding convicts it.
    let mut s = one_stage(2, true);
    s.withholders.insert(peer(0));
    s.run_until_done(400);
    only_convicted(&s, Some(peer(0)));
    assert_eq!(s.o.counters().withheld_contributions, 1);
    assert_eq!(convicted_in(&s, peer(0)), vec![0]);
    assert!(s.o.miner(&peer(1)).is_some_and(|m| m.live()), "the honest co-owner stays");

    // Without: one owner's word against the other's. The withholder is
    // planned out of the merge, and convicted of nothing.
    let mut s = one_stage(2, false);
    s.withholders.insert(peer(0));
    s.run_until_done(400);
    only_convicted(&s, None);
    let c = s.o.counters();
    assert_eq!((c.withheld_contributions, c.withheld_planned_out), (0, 2), "planned out in each merge: {c:?}");
    assert!(s.o.history().iter().all(|e| e.miners.iter().all(|m| m.peer != peer(1) || m.credited > 0)));
}

/// An owner claiming contributions missing that are stored: the
/// validators refute it, nobody it named is convicted, and the claimant
/// itself is the laggard (planned out, not convicted: an honest owner
/// whose store reads fail looks the same).
#[test]
fn a_false_claim_is_refuted_and_names_nobody() {
    let mut s = one_stage(3, true);
    s.false_claimants.insert(peer(2));
    s.run_until_done(400);
    only_convicted(&s, None);
    let c = s.o.counters();
    assert!(c.missing_claims_refuted >= 2, "both senders it named were found stored: {c:?}");
    assert_eq!((c.withheld_contributions, c.withheld_planned_out), (0, 0), "{c:?}");
}

/// The store's patience is 3 s plus one slice up and down at the run's
/// `--store-mbit`: a slower store waits longer, in proportion, and no
/// slice or bandwidth makes it unbounded.
#[test]
fn the_stores_patience_follows_the_runs_store_bandwidth() {
    use super::super::withholding::store_patience;
    let slice = 25_000_000; // 25 MB: 2 s each way at 100 Mbit/s
    assert_eq!(store_patience(slice, 100), 3_000 + 4_000);
    assert_eq!(store_patience(slice, 10), 3_000 + 40_000);
    assert_eq!(store_patience(0, 10), 3_000);
    assert_eq!(store_patience(u64::MAX, 1), 3_600_000);
    assert_eq!(store_patience(slice, 0), store_patience(slice, 1), "0 is taken as 1 Mbit/s, never a division by zero");
}
