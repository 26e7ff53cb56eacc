//! Issue 56's hostile participants that take more than one miner, or a
//! validator: a referee colluding with a lying owner, and a validator
//! flooding the orchestrator with evidence asks. (The one-miner modes run
//! in `validation.rs` through `a_merge_cheat_among`.)

use iota_dataplane::miner::Adversary;
use iota_tests::validation::{Place, Scenario, ScenarioReport};

/// No honest miner accused or convicted, and the run completes.
fn nobody_honest_punished(r: &ScenarioReport, epochs: usize) {
    let bad = |p: &iota_core::PeerId| Some(*p) == r.bad || Some(*p) == r.accomplice;
    assert_eq!(r.history.len(), epochs, "the run completes");
    let accused: Vec<_> = r.verdicts.iter().filter(|v| v.guilty && !bad(&v.miner)).collect();
    assert!(accused.is_empty(), "honest miners accused: {accused:?}");
    for e in &r.history {
        assert!(e.convicted.iter().all(bad), "epoch {}: honest miners convicted: {:?}", e.epoch, e.convicted);
    }
}

/// `referee-collusion`: two of stage 0's three replicas publish the same
/// wrong update for every partition they own or referee. Where one owns a
/// partition with the honest replica, the other is the only possible
/// referee and sides with it; where they own one together, they agree.
/// The validators' recompute of the referee's side and of the pair's
/// partition convicts both in the first merge; the honest replica is never
/// named, and nothing of theirs is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_referee_siding_with_a_lying_owner_is_convicted_with_it_in_the_first_merge() {
    let r = Scenario::new(Some((Adversary::RefereeCollusion, Place::Head)), 2, 16).shaped((2, 3)).run().await;
    nobody_honest_punished(&r, 2);
    let (bad, accomplice) = (r.bad.unwrap(), r.accomplice.unwrap());
    let mut first = r.history[0].convicted.clone();
    first.sort();
    let mut both = vec![bad, accomplice];
    both.sort();
    assert_eq!(first, both, "both colluders convicted in the first merge: {:?}", r.history);
    assert!(r.history[1].mean_loss.is_finite() && r.history[1].mean_loss < 5.4, "the run learns: {:?}", r.history);
}

/// `ask-flood`: a validator that asks, besides its draw, for the evidence
/// of every attempt of every miner. The orchestrator serves none past its
/// draw, so the miners upload no more and the honest validator's draw is
/// checked in time: nobody is accused, every epoch is validated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_validator_flooding_evidence_asks_gets_no_more_than_its_draw_and_stalls_nobody() {
    let mut sc = Scenario::new(None, 2, 16);
    sc.first_validator = |v| v.ask_flood = true;
    let r = sc.run().await;
    nobody_honest_punished(&r, 2);
    // Each miner's draw (3 a validator an epoch, of about 16 attempts) is
    // what was checked: a flood served would have been every attempt.
    let most = 2 * 2 * 6 * 16;
    assert!(r.checked > 0 && r.checked < most as u64 / 2, "checked {} evidence objects", r.checked);
    assert!(r.asks_refused >= 2, "the flood was asked, and refused, every epoch: {}", r.asks_refused);
}
