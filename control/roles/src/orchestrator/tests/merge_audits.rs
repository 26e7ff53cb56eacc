//! Merge audits: validators recompute an owner pair's result (or check
//! its flags) from the participants' stored contributions; a majority of
//! the run's stake that recomputes another result convicts the owners.

use iota_wire::ValidatorStake;

use super::validation::{commit_all, done, until_held, validator};
use super::*;

/// One stage of three butterfly replicas, 8 micro-batches an epoch,
/// `epochs` epochs; validators 0 (60) and 1 (40), subscribed.
fn three_replicas_with_validators(epochs: u64) -> Sim {
    let mut spec = butterfly_spec(1, 3);
    spec.micro_batches_per_epoch = 8;
    spec.epochs = epochs;
    spec.validation.validators =
        vec![ValidatorStake { peer: validator(0), stake: 60 }, ValidatorStake { peer: validator(1), stake: 40 }];
    spec.validation.timeout_ms = 20_000;
    let mut s = Sim::new(spec);
    for v in [validator(0), validator(1)] {
        s.ev(Event::RegisterValidator { peer: v, device: "cpu".into() });
        s.ev(Event::Subscribed { peer: v });
    }
    for i in 0..3 {
        s.ev(register(i, format!("a{i}")));
    }
    s
}

/// Two epochs: each trains, the merge is held for its audits, replicas 0
/// and 1 finish; then the run goes to its end.
fn run_two_audited_epochs(s: &mut Sim) {
    commit_all(s, 0);
    for e in 0..2 {
        until_held(s);
        done(s, 0, e);
        done(s, 1, e);
        commit_all(s, e + 1);
    }
    s.run_until_done(400);
}

/// Issue 13, `collude` in the orchestrator's terms: two of three replicas
/// publish the same wrong result for every partition they own together.
/// The hash comparison cannot see it (they agree); their pair's audit
/// does: the validators recompute another result, both owners are
/// convicted in the epoch, none of their results is ever applied, the
/// honest pairs' audits pass, and the run completes.
#[test]
fn colluding_owners_are_convicted_by_their_audit_before_any_of_their_results_is_applied() {
    let mut s = three_replicas_with_validators(2);
    s.colluders.extend([peer(0), peer(1)]);
    run_two_audited_epochs(&mut s);
    assert_eq!(*s.o.phase(), Phase::Done);
    let c = s.o.counters();
    assert_eq!(c.colluding_owners, 2, "{c:?}");
    assert!(c.merge_audits_passed >= 1, "the honest pairs' audits pass: {c:?}");
    assert_eq!(c.withheld_contributions, 0);
    assert!(s.audits_heard >= 2 * 3, "each of the three owner pairs audited by both validators");
    let first = &s.o.history()[0];
    assert_eq!(first.convicted, vec![peer(0), peer(1)]);
    assert!(!s.verdict_hashes.is_empty());
    assert!(s.verdict_hashes.iter().all(|h| h[..] != [0xcc; 32]), "a colluders' result was applied");
    assert_eq!(c.divergent_merges, 0);
}

/// A merge audit's majority is of the run's whole stake: a lying validator
/// with 40% of it, the only one registered (the 60% one never came up),
/// cannot convict honest owners by answering every audit with another
/// result. (Counted over registered validators only, its 40 of 40 did.)
#[test]
fn a_minority_validator_alone_cannot_convict_honest_owners_by_audit() {
    let mut spec = butterfly_spec(1, 3);
    spec.micro_batches_per_epoch = 8;
    spec.epochs = 1;
    spec.validation.validators =
        vec![ValidatorStake { peer: validator(0), stake: 60 }, ValidatorStake { peer: validator(1), stake: 40 }];
    spec.validation.timeout_ms = 5_000;
    let mut s = Sim::new(spec);
    s.ev(Event::RegisterValidator { peer: validator(1), device: "cpu".into() });
    s.ev(Event::Subscribed { peer: validator(1) });
    s.audit_liars.insert(validator(1));
    for i in 0..3 {
        s.ev(register(i, format!("a{i}")));
    }
    commit_all(&mut s, 0);
    for _ in 0..200 {
        s.drain();
        if s.validation_heard.iter().any(|o| matches!(o.cmd, pb::command::Kind::EpochWork(_))) {
            break;
        }
        s.tick(500);
    }
    done(&mut s, 1, 0);
    s.run_until_done(400);
    assert_eq!(*s.o.phase(), Phase::Done);
    let c = s.o.counters();
    assert!(s.audits_heard >= 1, "the liar was asked: {c:?}");
    assert_eq!((c.colluding_owners, c.convictions), (0, 0), "{c:?}");
    assert!(s.o.history()[0].convicted.is_empty());
}

/// Without the validators' answers (both quiet), audits hold the merge no
/// longer than `validation.timeout_ms`: the owners' results are released
/// and the run goes on, as with no audits.
#[test]
fn unanswered_merge_audits_are_released_at_the_timeout() {
    let mut spec = butterfly_spec(1, 3);
    spec.micro_batches_per_epoch = 8;
    spec.epochs = 1;
    spec.validation.validators = vec![ValidatorStake { peer: validator(0), stake: 1 }];
    spec.validation.timeout_ms = 5_000;
    let mut s = Sim::new(spec);
    s.ev(Event::RegisterValidator { peer: validator(0), device: "cpu".into() });
    s.ev(Event::Subscribed { peer: validator(0) });
    for i in 0..3 {
        s.ev(register(i, format!("a{i}")));
    }
    commit_all(&mut s, 0);
    until_held(&mut s);
    s.quiet_validators.insert(validator(0));
    done(&mut s, 0, 0);
    s.run_until_done(400);
    assert_eq!(*s.o.phase(), Phase::Done);
    let c = s.o.counters();
    assert!(s.audits_heard >= 3 && c.merge_audits_released >= 3, "{c:?}");
    assert_eq!((c.merge_audits_passed, c.colluding_owners), (0, 0));
    assert!(s.o.history()[0].convicted.is_empty());
}

/// Two colluding owners that flag an honest third sender (which would
/// convict it on their word alone) are caught by the flags' audit: the
/// validators' recompute flags nobody, so the two owners are convicted
/// and the framed sender is not.
#[test]
fn owners_that_frame_an_honest_sender_with_flags_are_convicted_and_it_is_not() {
    let mut s = three_replicas_with_validators(1);
    s.colluders.extend([peer(0), peer(1)]);
    s.frame = Some(peer(2));
    commit_all(&mut s, 0);
    until_held(&mut s);
    done(&mut s, 0, 0);
    done(&mut s, 1, 0);
    s.run_until_done(400);
    assert_eq!(*s.o.phase(), Phase::Done);
    let c = s.o.counters();
    assert_eq!((c.colluding_owners, c.flawed_contributions), (2, 0), "{c:?}");
    assert_eq!(s.o.history()[0].convicted, vec![peer(0), peer(1)]);
}

/// `lying-owner` at R = 2: an owner publishing a wrong result for every
/// partition disputes each with its honest co-owner, and no third replica
/// can referee. The validators' recompute of the dispute names it in the
/// first merge; the honest owner's results stand (before, every slice
/// kept its previous weights, every epoch). Without validators nobody can
/// tell, and nobody is named.
#[test]
fn at_two_replicas_a_lying_owner_is_named_by_the_audit_of_its_dispute() {
    let mut s = super::withholding::one_stage(2, true);
    s.liars.insert(peer(0));
    s.run_until_done(400);
    assert_eq!(*s.o.phase(), Phase::Done);
    let c = s.o.counters().clone();
    assert_eq!(c.deviant_owners, 1, "{c:?}");
    assert_eq!(s.o.history()[0].convicted, vec![peer(0)]);
    assert!(s.o.history()[1].convicted.is_empty(), "named once");
    assert!(s.verdict_hashes.iter().any(|h| h[..] != [0; 32]), "the honest results were applied");
    assert!(s.verdict_hashes.iter().all(|h| h[..] != [0xee; 32]), "a lie was applied");

    let mut s = super::withholding::one_stage(2, false);
    s.liars.insert(peer(0));
    s.run_until_done(400);
    assert!(s.o.history().iter().all(|e| e.convicted.is_empty()));
    assert!(s.verdict_hashes.iter().all(|h| h[..] == [0; 32]), "previous weights kept");
}

/// The plan, momentum and chains every audit of a merge shares go to each
/// validator once per plan, before the first audit that names them (the
/// harness fails an audit whose context its validator was never sent); a
/// validator that subscribes again is sent them again.
#[test]
fn each_validator_is_sent_an_audit_context_once_per_plan_and_again_after_it_resubscribes() {
    let mut s = three_replicas_with_validators(2);
    run_two_audited_epochs(&mut s);
    assert_eq!(*s.o.phase(), Phase::Done);
    assert!(s.audits_heard >= 2 * 3, "every owner pair audited by both validators: {}", s.audits_heard);
    assert_eq!(s.contexts_heard, s.audit_plans.len(), "a context sent twice to one validator");
    assert!(
        s.contexts_heard < s.audits_heard,
        "the audits of a plan share its context: {} contexts for {} audits",
        s.contexts_heard,
        s.audits_heard
    );
    for v in [validator(0), validator(1)] {
        let plans = s.audit_plans.keys().filter(|(to, _)| *to == v).count();
        assert!(plans >= 2, "one context per merge at least: {plans}");
    }
    let sent_to = |s: &Sim, v: PeerId| s.o.validation.audit_contexts_sent.keys().filter(|(to, _)| *to == v).count();
    assert!(sent_to(&s, validator(0)) >= 1 && sent_to(&s, validator(1)) >= 1);
    s.ev(Event::Subscribed { peer: validator(0) });
    assert_eq!(sent_to(&s, validator(0)), 0, "a new stream is sent the context again");
    assert!(sent_to(&s, validator(1)) >= 1, "the other validator's stream is the same");
}
