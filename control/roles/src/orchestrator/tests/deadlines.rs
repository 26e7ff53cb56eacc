//! Validation deadlines: validators that go quiet or never finish do not
//! stall the run, and a round's deadline follows the size of what its
//! draws must upload.

use super::validation::{commit_all, start, until_held, validated_spec, validator};
use super::*;

#[test]
fn validators_that_go_quiet_or_never_finish_do_not_stall_the_run() {
    // Validator 1 stops heartbeating: only validator 0 is waited for, and
    // it never says done: the merge goes on at the validation timeout.
    let (mut s, held) = held_by_a_silent_validator(|_| {});
    assert!((5_000..30_000).contains(&held), "freed after {held} ms");
    assert_eq!(s.o.counters().validation_timeouts, 1);
    s.run_until_done(200);

    // No validator at all live: the epoch goes on unchecked, and says so.
    let mut spec = validated_spec();
    spec.epochs = 1;
    let mut s = Sim::new(spec);
    for i in 0..4 {
        s.ev(register(i, format!("a{i}")));
    }
    commit_all(&mut s, 0);
    s.run_until_done(200);
    assert_eq!(s.o.counters().unvalidated_epochs, 1);

    // An identity the run does not list cannot register as a validator.
    let r = s.o.step(s.now, Event::RegisterValidator { peer: peer(50), device: "cpu".into() }, &mut s.rng);
    assert!(matches!(r, Err(Refusal::NotYours(_))));
}

/// The round's deadline grows with what the draws must upload: stages of
/// 12.5 MB, every miner's draw at least one bundle of up to two states for
/// each of the two validators (50 MB, 4 s at 100 Mbit/s) on top of the
/// 5 s base. A `1.5b` stage's draws take minutes; a fixed deadline moved
/// the merge on before the verdicts.
#[test]
fn the_validation_deadline_follows_the_size_of_the_evidence() {
    let (s, held) = held_by_a_silent_validator(|spec| spec.merge.stage_params = vec![3_125_000; 2]);
    assert!((9_000..60_000).contains(&held), "freed after {held} ms");
    assert_eq!(s.o.counters().validation_timeouts, 1);
}

/// One epoch validated with a 5 s base timeout (`change` changes the spec
/// further): validator 1 goes quiet and validator 0 never says done.
/// Returns the run once the validation round let the merge go, and how
/// long the round held it.
fn held_by_a_silent_validator(change: impl FnOnce(&mut RunSpec)) -> (Sim, Ms) {
    let mut spec = validated_spec();
    spec.validation.timeout_ms = 5_000;
    spec.epochs = 1;
    change(&mut spec);
    let mut s = start(spec);
    s.quiet_validators.insert(validator(1));
    until_held(&mut s);
    let held_at = s.now;
    while *s.o.phase() == Phase::Uploading {
        s.tick(500);
        s.drain();
        assert!(s.now - held_at < 120_000, "the validation timeout did not free the merge");
    }
    let held = s.now - held_at;
    (s, held)
}
