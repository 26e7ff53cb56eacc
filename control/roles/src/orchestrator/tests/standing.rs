//! A miner's standing (`Orchestrator::standing`): every state it can be in,
//! reached the way a run reaches it where a simulation can, and the pay
//! once an epoch is settled.

use super::*;

fn state_of(sim: &Sim, p: &PeerId) -> pb::StandingState {
    sim.o.standing(p).expect("a registered miner has a standing").state()
}

#[test]
fn a_miners_standing_follows_it_through_the_run() {
    let mut sp = spec(2, 2, 2, 12, 2);
    sp.epochs = 4;
    let mut sim = Sim::new(sp);
    // Registered before the run has enough miners: waiting, and why.
    sim.ev(register(0, "a0".into()));
    let first = peer(0);
    let st = sim.o.standing(&first).unwrap();
    assert_eq!(st.state(), pb::StandingState::Waiting);
    assert!(st.reason.contains("enough miners"), "{st:?}");
    assert_eq!((st.stages, st.settled), (2, false));
    // Strangers and validators are told nothing.
    assert_eq!(sim.o.standing(&peer(200)), None);
    // The run starts: newcomers carry one micro-batch until they deliver.
    for i in 1..4 {
        sim.ev(register(i, format!("a{i}")));
    }
    assert_eq!(state_of(&sim, &first), pb::StandingState::Probation);
    for _ in 0..200 {
        if state_of(&sim, &first) != pb::StandingState::Probation {
            break;
        }
        sim.drain_at_most(1);
    }
    assert_eq!(state_of(&sim, &first), pb::StandingState::Training, "probation ends at its first delivery");
    // One silent miner: benched, then removed after three benched epochs.
    let silent = sim.o.miners().find(|m| m.stage == 1).unwrap().peer;
    sim.silent.insert(silent);
    let mut seen = BTreeSet::new();
    for _ in 0..400 {
        sim.drain_at_most(4);
        if *sim.o.phase() == Phase::Done {
            break;
        }
        if sim.inbox.is_empty() {
            sim.tick(500);
        }
        let st = sim.o.standing(&silent).unwrap();
        if st.state() == pb::StandingState::Benched {
            assert!(st.reason.contains("failures in a row") && st.until_epoch == st.epoch, "{st:?}");
        }
        seen.insert(st.state);
        seen.insert(sim.o.standing(&first).unwrap().state);
    }
    let st = sim.o.standing(&silent).unwrap();
    assert_eq!(st.state(), pb::StandingState::Removed, "{st:?}");
    assert!(st.reason.contains("benched in 3 epochs"), "{st:?}");
    assert_eq!(state_of(&sim, &first), pb::StandingState::Done);
    for s in [pb::StandingState::Benched, pb::StandingState::Training, pb::StandingState::Merging] {
        assert!(seen.contains(&(s as i32)), "{s:?} never seen: {seen:?}");
    }
    // An honest miner was paid for its settled epochs; the silent one not.
    let honest = sim.o.miners().find(|m| m.peer != silent && m.delivered > 0).unwrap().peer;
    let st = sim.o.standing(&honest).unwrap();
    assert!(st.settled && st.paid_total > 0.0 && st.delivered > 0, "{st:?}");
    assert_eq!(st.paid_epoch, sim.o.settlements().last().unwrap().epoch);
    assert_eq!(sim.o.standing(&silent).unwrap().paid_total, 0.0);
    // Convicted: suspended through the epoch after, with the vote's reason;
    // then ejected.
    let through = sim.o.epoch() + 1;
    sim.o.miners.get_mut(&honest).unwrap().suspended_through = Some(through);
    let st = sim.o.standing(&honest).unwrap();
    assert_eq!((st.state(), st.until_epoch), (pb::StandingState::Suspended, sim.o.epoch() + 1));
    assert!(st.reason.contains("suspended through epoch"), "{st:?}");
    sim.o.miners.get_mut(&honest).unwrap().ejected = true;
    assert_eq!(state_of(&sim, &honest), pb::StandingState::Ejected);
    // A hostile-length reason is cut to 256 bytes.
    assert!(sim.o.standing(&honest).unwrap().reason.len() <= 256);
}
