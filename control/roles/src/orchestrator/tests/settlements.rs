//! Settlement without validators, and the settlements the state keeps
//! until the ledger has them.

use super::*;

/// Without validators, the operator is the only rater: it pays the work it
/// credited, through the same Yuma step and ledger.
#[test]
fn without_validators_the_operator_pays_credited_work() {
    let mut sim = Sim::new(butterfly_spec(2, 2));
    sim.o.set_operator(peer(99));
    for i in 0..4 {
        sim.ev(register(i, format!("a{i}")));
    }
    sim.run_until_done(400);
    assert_eq!(sim.o.history().len(), 2);
    for (st, summary) in sim.o.settlements().iter().zip(sim.o.history()) {
        assert_eq!(st.validators, vec![peer(99)]);
        let pay: std::collections::BTreeMap<PeerId, f64> = st.payouts().into_iter().collect();
        let miners: f64 = summary.miners.iter().map(|m| pay[&m.peer]).sum();
        assert!((miners - 0.5).abs() < 1e-9, "half the emission to miners: {miners}");
        let credited: u64 = summary.miners.iter().map(|m| m.credited).sum();
        for m in &summary.miners {
            let want = 0.5 * m.credited as f64 / credited as f64;
            assert!(
                (pay[&m.peer] - want).abs() < 1e-6,
                "{} paid {} for {} of {credited}",
                m.peer,
                pay[&m.peer],
                m.credited
            );
        }
        assert!((pay[&peer(99)] - 0.5).abs() < 1e-9, "the operator's dividends");
    }
}

/// Settlements leave the state only once the ledger has them: with no
/// save (or failing ones) every epoch's waits; once written, 16 are kept.
#[test]
fn settlements_wait_in_the_state_until_the_ledger_has_them() {
    for written in [false, true] {
        let mut sp = butterfly_spec(1, 2);
        sp.epochs = 20;
        let mut sim = Sim::new(sp);
        sim.o.set_operator(peer(99));
        if written {
            sim.o.settlements_written(u64::MAX);
        }
        register_all(&mut sim, 2);
        sim.run_until_done(2000);
        assert_eq!(sim.o.history().len(), 20);
        let kept: Vec<u64> = sim.o.settlements().iter().map(|s| s.epoch).collect();
        if written {
            assert_eq!(kept, (4..20).collect::<Vec<_>>(), "the 16 latest");
        } else {
            assert_eq!(kept, (0..20).collect::<Vec<_>>(), "none dropped before the ledger has it");
        }
    }
}

/// Once every settlement column is taken, a newcomer gets the column of a
/// departed miner that earned nothing in the last settlement (flagged
/// newly registered, its bonds from zero), not before; and the ledger of
/// it verifies.
#[test]
fn a_departed_miners_column_goes_to_a_newcomer_once_it_earns_nothing() {
    use crate::settlement::ledger::{seal, verify};
    let mut o = Orchestrator::new(butterfly_spec(1, 2)).unwrap();
    let operator = Identity::from_seed([99; 32]);
    o.set_operator(operator.peer_id());
    o.settlement.max_columns = Some(3);
    let worked = |ps: &[u8]| -> Vec<MinerEpoch> {
        ps.iter()
            .map(|i| MinerEpoch { peer: peer(*i), stage: 0, completed: 4, credited: 4, merged: true, convicted: false })
            .collect()
    };
    let mut entries = Vec::new();
    let mut settle = |o: &mut Orchestrator, ps: &[u8]| {
        o.settle(&worked(ps), false, &[], 2.0);
        let s = o.settlements().last().unwrap().clone();
        assert_eq!(s.epoch, o.epoch, "settled");
        entries.push(seal(entries.last(), &s, &operator));
        o.epoch += 1;
        s
    };
    let paid =
        |s: &crate::settlement::ledger::Settlement, i: u8| s.payouts().iter().any(|(p, x)| *p == peer(i) && *x > 0.0);
    // Epoch 0: miners 1, 2, 3 take the three columns. Miner 3 leaves (none
    // is registered with this orchestrator) and does no more work;
    // newcomer 4 works from epoch 1. Miner 3 earned in epoch 0: its column
    // is not free yet, and miner 4 is not paid.
    let s = settle(&mut o, &[1, 2, 3]);
    assert!(paid(&s, 3));
    let s = settle(&mut o, &[1, 2, 4]);
    assert_eq!(o.settlement.miners, vec![peer(1), peer(2), peer(3)]);
    assert!(!paid(&s, 4), "no column, no pay");
    // Miner 3 earned nothing in epoch 1, but it is registered again (a
    // spare, say): it keeps its column.
    o.step(0, register(3, "a3".into()), &mut Rng::new(1)).unwrap();
    let s = settle(&mut o, &[1, 2, 4]);
    assert_eq!(o.settlement.miners[2], peer(3));
    assert!(!paid(&s, 4));
    // Gone for good: its column goes to miner 4.
    o.miners.remove(&peer(3));
    let s = settle(&mut o, &[1, 2, 4]);
    assert_eq!(o.settlement.miners, vec![peer(1), peer(2), peer(4)]);
    assert_eq!(s.input.recently_registered, Some(vec![false, false, true]));
    assert!(paid(&s, 4), "the newcomer is paid");
    let v = verify(&entries, Some(operator.peer_id())).unwrap();
    assert_eq!(v.entries as usize, entries.len());
}
