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
