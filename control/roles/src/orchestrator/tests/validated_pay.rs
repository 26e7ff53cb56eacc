//! Settlement after validated rounds: validators' weights through Yuma by
//! stake, the ledger sealed and verified, and a validator paid only for
//! rounds it verified.

use iota_core::commitment::Commitments;
use iota_wire::pb;

use super::validation::{start, until_held, validated_spec, validator, vote};
use super::*;

/// Settlement: each epoch, the validators' weights (by work, zero for a
/// miner both caught) go through Yuma with their stakes; the cheat earns
/// nothing, honest miners earn in proportion to their work, each epoch
/// pays out its emission exactly, and the sealed ledger verifies.
#[test]
fn settlement_pays_work_by_stake_weighted_consensus_and_the_ledger_verifies() {
    let mut s = start(validated_spec());
    let orchestrator = Identity::from_seed([42; 32]);
    let cheat = peer(0);
    // Every miner's heads for both epochs (each epoch's round then holds
    // its merge for the validators).
    for i in 0..4 {
        let mut c = Commitments::default();
        c.weights(0, &[i; 32]);
        c.weights(1, &[i + 10; 32]);
        s.heads.insert(peer(i), c.heads());
    }
    for epoch in 0..2 {
        let w = until_held(&mut s);
        assert_eq!(w.epoch, epoch);
        let weights: Vec<f32> =
            w.miners.iter().map(|m| if m.peer == cheat.0.to_vec() { 0.0 } else { m.items.len() as f32 }).collect();
        for v in 0..2 {
            let work_miners: Vec<PeerId> =
                w.miners.iter().map(|m| PeerId(m.peer.as_slice().try_into().unwrap())).collect();
            // Paid for what it verified: a verdict on every miner.
            for m in &work_miners {
                vote(&mut s, v, epoch, *m, *m == cheat).unwrap();
            }
            let hash = crate::validation::sample::work_miners_hash(epoch, &work_miners);
            let signed = signed_done(&s, v, epoch, &weights, hash, orchestrator.peer_id());
            let ev = Event::ValidationDone {
                validator: validator(v),
                epoch,
                weights: weights.clone(),
                miners_hash: Some(hash),
                signed,
            };
            let out = s.o.step(s.now, ev, &mut s.rng).unwrap();
            s.inbox.extend(out);
        }
        for _ in 0..200 {
            if s.o.history().len() as u64 > epoch {
                break;
            }
            s.drain();
            s.tick(100);
        }
        assert_eq!(s.o.history().len() as u64, epoch + 1, "epoch {epoch} ended");
    }
    let settled = s.o.settlements();
    assert_eq!(settled.len(), 2);
    for (st, summary) in settled.iter().zip(s.o.history()) {
        assert_eq!(st.validators, vec![validator(0), validator(1)]);
        let pay: std::collections::BTreeMap<PeerId, f64> = st.payouts().into_iter().collect();
        let total: f64 = pay.values().sum();
        assert!((total - 1.0).abs() < 1e-9, "epoch {}: pays {total}", st.epoch);
        assert_eq!(pay[&cheat], 0.0, "epoch {}: the cheat earns nothing", st.epoch);
        // Honest miners: incentive in proportion to their completed work.
        let honest: Vec<&MinerEpoch> = summary.miners.iter().filter(|m| m.peer != cheat && m.completed > 0).collect();
        assert!(honest.len() >= 2);
        let per_work: Vec<f64> = honest.iter().map(|m| pay[&m.peer] / m.completed as f64).collect();
        let (lo, hi) = per_work.iter().fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(*x), b.max(*x)));
        assert!(hi / lo < 1.01, "epoch {}: pay per micro-batch {per_work:?}", st.epoch);
        // Validators' dividends follow their stake (they agreed).
        let (d0, d1) = (pay[&validator(0)], pay[&validator(1)]);
        assert!(d0 > d1 && d1 > 0.0, "dividends {d0} {d1}");
    }
    let seal_all = |settled: &[crate::settlement::ledger::Settlement]| {
        let mut entries: Vec<crate::settlement::ledger::Entry> = Vec::new();
        for st in settled {
            let e = crate::settlement::ledger::seal(entries.last(), st, &orchestrator);
            entries.push(e);
        }
        entries
    };
    let entries = seal_all(settled);
    let v = crate::settlement::ledger::verify(&entries, Some(orchestrator.peer_id())).unwrap();
    assert_eq!(v.entries, 2);
    assert_eq!(v.balances.get(&cheat).copied().unwrap_or(0.0), 0.0);
    // The orchestrator cannot put weights in a validator's name: a row
    // changed and re-sealed (Yuma recomputed, so everything else holds)
    // no longer matches the validator's signed request.
    let mut forged = settled.to_vec();
    forged[0].input.weights[1] = forged[0].input.weights[0].iter().rev().copied().collect();
    forged[0].output = crate::settlement::yuma::run(&forged[0].input).unwrap();
    forged.truncate(1);
    let e = crate::settlement::ledger::verify(&seal_all(&forged), None).unwrap_err();
    assert!(e.what.contains("not the weights it signed"), "{e}");
}

/// Issue 55: a validator is paid for a round it verified. One that sends
/// weights (the honest ones, copied) without a verdict on half of the
/// round's miners neither votes in consensus nor earns dividends for the
/// epoch; the entry holds no weights in its name, and the ledger verifies.
#[test]
fn a_validator_that_verified_nothing_earns_nothing_for_the_epoch() {
    let mut s = start(validated_spec());
    let orchestrator = Identity::from_seed([42; 32]);
    for i in 0..4 {
        let mut c = Commitments::default();
        c.weights(0, &[i; 32]);
        s.heads.insert(peer(i), c.heads());
    }
    let w = until_held(&mut s);
    let work_miners: Vec<PeerId> = w.miners.iter().map(|m| PeerId(m.peer.as_slice().try_into().unwrap())).collect();
    let weights: Vec<f32> = w.miners.iter().map(|m| m.items.len() as f32).collect();
    let hash = crate::validation::sample::work_miners_hash(0, &work_miners);
    // Validator 0 (the larger stake) checks nothing and copies; validator
    // 1 verifies every miner.
    for m in &work_miners {
        vote(&mut s, 1, 0, *m, false).unwrap();
    }
    for v in 0..2 {
        let signed = signed_done(&s, v, 0, &weights, hash, orchestrator.peer_id());
        let ev = Event::ValidationDone {
            validator: validator(v),
            epoch: 0,
            weights: weights.clone(),
            miners_hash: Some(hash),
            signed,
        };
        let out = s.o.step(s.now, ev, &mut s.rng).unwrap();
        s.inbox.extend(out);
    }
    for _ in 0..200 {
        if !s.o.history().is_empty() {
            break;
        }
        s.drain();
        s.tick(100);
    }
    let st = s.o.settlements().iter().find(|st| st.epoch == 0).expect("epoch 0 settled").clone();
    assert_eq!(st.input.active, Some(vec![false, true]), "only the verifying validator votes");
    assert!(st.input.weights[0].iter().all(|x| *x == 0.0), "no weights in the copier's name");
    assert!(st.signed_weights[0].is_empty() && !st.signed_weights[1].is_empty());
    let pay: std::collections::BTreeMap<PeerId, f64> = st.payouts().into_iter().collect();
    assert_eq!(pay.get(&validator(0)).copied().unwrap_or(0.0), 0.0, "the copier earns nothing");
    assert!(pay[&validator(1)] > 0.0, "the verifier earns");
    let entry = crate::settlement::ledger::seal(None, &st, &orchestrator);
    crate::settlement::ledger::verify(&[entry], Some(orchestrator.peer_id())).unwrap();
}

/// A validator's `Validate(ValidationDone)` request, signed as its client
/// signs it, for the run's orchestrator `orchestrator`.
fn signed_done(s: &Sim, v: u8, epoch: u64, weights: &[f32], miners_hash: [u8; 32], orchestrator: PeerId) -> Vec<u8> {
    use prost::Message;
    let id = Identity::from_seed([200 + v; 32]);
    let done = pb::ValidationDone { epoch, weights: weights.to_vec(), miners_hash: miners_hash.to_vec() };
    let report = pb::ValidatorReport { kind: Some(pb::validator_report::Kind::Done(done)) };
    let body = report.encode_to_vec();
    let aud = iota_wire::auth::Audience { run_id: s.o.spec().run_id, orchestrator };
    let (timestamp_ms, nonce) = (1_000 + epoch, vec![v; 16]);
    let signing = iota_wire::auth::signing_bytes(&aud, iota_wire::methods::VALIDATE, timestamp_ms, &nonce, &body);
    let env = pb::Signed {
        peer_id: id.peer_id().0.to_vec(),
        timestamp_ms,
        nonce,
        body,
        signature: id.sign(&signing).to_vec(),
    };
    env.encode_to_vec()
}
