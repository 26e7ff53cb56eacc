//! A conviction that carries its proof (issue 55): two pipeline frames a
//! miner signed for one attempt and direction convict it on one
//! validator's word, whatever the stake voted; a proof that does not hold
//! refuses the verdict whole.

use iota_core::frame_equivocation::signed_test_header;
use iota_core::wire::Direction;
use iota_core::{Identity, PeerId};

use super::validation::{start, until_held, validated_spec, validator};
use super::*;
use crate::validation::quorum::Check;

/// The archived header of a gradient frame miner `i` signed for `epoch`'s
/// attempt (0, 8, `attempt`) with payload hash `payload`.
fn signed_header(i: u8, run_id: u64, epoch: u32, attempt: u32, payload: u8) -> Vec<u8> {
    let id = Identity::from_seed([i; 32]);
    signed_test_header(&id, run_id, epoch, attempt, Direction::ActivationGrad, payload)
}

fn verdict(v: u8, miner: PeerId, guilty: bool, proof: Vec<Vec<u8>>) -> Event {
    Event::Verdict(VerdictIn {
        validator: validator(v),
        epoch: 0,
        miner,
        check: Check::Recompute,
        guilty,
        samples: 4,
        evidence_hash: None,
        reason: if guilty { "two frames it signed for the attempt".into() } else { String::new() },
        signed: vec![v; 8],
        proof,
        step_proven: None,
    })
}

#[test]
fn one_validator_with_a_proof_convicts_and_no_majority_clears_it_and_forgeries_are_refused() {
    let mut s = start(validated_spec());
    until_held(&mut s);
    let run = s.o.spec().run_id;
    let (m, i) = (peer(1), 1u8);
    // The majority (60 of 100) clears the miner on its own sample.
    s.inbox.extend(s.o.step(s.now, verdict(0, m, false, Vec::new()), &mut s.rng).unwrap());
    assert_eq!(s.o.counters().convictions, 0, "cleared by the majority");
    // The minority validator's proofs that do not hold: refused whole.
    let good = [signed_header(i, run, 0, 0, 1), signed_header(i, run, 0, 0, 2)];
    let mut altered = good[1].clone();
    let at = altered.len() - 70;
    altered[at] ^= 1; // inside the signature or the fields it covers
    let forged: [(Vec<Vec<u8>>, &str); 6] = [
        (vec![good[0].clone(), good[0].clone()], "same payload"),
        (vec![good[0].clone(), altered], "proof does not hold"),
        (vec![good[0].clone(), signed_header(2, run, 0, 0, 2)], "not sent by the accused"),
        (vec![good[0].clone(), signed_header(i, run, 0, 1, 2)], "not of one attempt"),
        (vec![good[0].clone(), signed_header(i, run + 1, 0, 0, 2)], "run"),
        (vec![signed_header(i, run, 1, 0, 1), signed_header(i, run, 1, 0, 2)], "another epoch"),
    ];
    for (proof, why) in forged {
        let r = s.o.step(s.now, verdict(1, m, true, proof), &mut s.rng);
        assert!(matches!(&r, Err(Refusal::Invalid(w)) if w.contains(why)), "{why}: {r:?}");
    }
    assert!(s.o.step(s.now, verdict(1, m, false, good.to_vec()), &mut s.rng).is_err(), "a proof clears nobody");
    assert_eq!(s.o.verdicts().iter().filter(|v| v.validator == validator(1)).count(), 0, "nothing of them counted");
    assert_eq!((s.o.counters().convictions, s.o.frame_equivocations().len()), (0, 0));
    // The proof that holds: convicted on the 40% validator's word, over
    // the majority's clearing vote.
    s.inbox.extend(s.o.step(s.now, verdict(1, m, true, good.to_vec()), &mut s.rng).unwrap());
    assert_eq!(s.o.counters().convictions, 1, "{:?}", s.o.counters());
    assert_eq!(s.o.counters().frame_equivocations, 1);
    let p = &s.o.frame_equivocations()[0];
    assert_eq!((p.miner, p.epoch, p.shard, p.first_sample, p.attempt), (m, 0, 0, 8, 0));
    // A later clearing vote changes nothing; the same proof again is
    // neither a second conviction nor a second record.
    s.inbox.extend(s.o.step(s.now, verdict(0, m, false, Vec::new()), &mut s.rng).unwrap());
    s.inbox.extend(s.o.step(s.now, verdict(1, m, true, good.to_vec()), &mut s.rng).unwrap());
    assert_eq!((s.o.counters().convictions, s.o.frame_equivocations().len()), (1, 1));
}

/// A verdict whose stored step proof the service re-checked
/// (`step_proven`) convicts on its own, whatever the other validator
/// votes; it is kept once and named in the settlement's ledger entry; a
/// step proof on a clearing verdict is refused.
#[test]
fn a_re_checked_step_proof_convicts_on_one_validators_word() {
    let mut s = start(validated_spec());
    until_held(&mut s);
    let m0 = peer(0);
    let proven = |v: u8, guilty: bool| {
        let Event::Verdict(mut x) = verdict(v, m0, guilty, Vec::new()) else { unreachable!() };
        x.step_proven = Some([7; 32]);
        x.reason = "inner step 1: recomputed (proven)".into();
        Event::Verdict(x)
    };
    let cleared = s.o.step(s.now, proven(1, false), &mut s.rng);
    assert!(matches!(&cleared, Err(Refusal::Invalid(w)) if w.contains("step proof")), "{cleared:?}");
    s.inbox.extend(s.o.step(s.now, verdict(1, m0, false, Vec::new()), &mut s.rng).unwrap());
    s.inbox.extend(s.o.step(s.now, proven(0, true), &mut s.rng).unwrap());
    s.drain();
    assert_eq!(s.o.counters().step_proofs, 1, "kept once");
    assert!(s.o.counters().convictions >= 1, "convicted on one validator's proof, the other's clearing vote outvoted");
}
