//! Butterfly merges as the orchestrator coordinates them: plans and
//! verdicts, hash mismatches refereed, participants dying or slow.

use super::*;

#[test]
fn butterfly_epochs_merge_by_plan_and_verdicts() {
    let mut sim = Sim::new(butterfly_spec(2, 3));
    for i in 0..6 {
        sim.ev(register(i, format!("a{i}")));
    }
    sim.run_until_done(200);
    assert_eq!(sim.o.phase(), &Phase::Done);
    assert_eq!(sim.o.history().len(), 2);
    assert_eq!(sim.o.counters().hash_mismatches, 0);
    assert_eq!(sim.o.counters().divergent_merges, 0);
    assert_eq!(sim.o.counters().merge_contributions_from_store, 0);
}

#[test]
fn slices_read_from_the_store_are_counted_and_bounded() {
    let mut sim = Sim::new(butterfly_spec(2, 3));
    for i in 0..6 {
        sim.ev(register(i, format!("a{i}")));
    }
    sim.from_store.insert(peer(0), (2, 1));
    // A replica cannot have read more slices than a few per partition.
    sim.from_store.insert(peer(1), (u32::MAX, 0));
    sim.run_until_done(200);
    assert_eq!(sim.o.phase(), &Phase::Done);
    let c = sim.o.counters();
    // Two epochs: peer(0) said (2, 1) each time; peer(1)'s claim is cut to
    // 4 per partition of its 3-partition plan.
    assert_eq!(c.merge_updates_from_store, 2);
    assert_eq!(c.merge_contributions_from_store, 2 * 2 + 2 * 4 * 3);

    // A participant repeating its MergeDone is counted once (peer(2) sits
    // on its verdicts, so the sim sends none for it).
    let mut sim = Sim::new(butterfly_spec(1, 3));
    register_all(&mut sim, 3);
    sim.stalled.insert(peer(2));
    sim.stall_verdicts_only = true;
    for _ in 0..20 {
        sim.drain();
        sim.tick(100);
    }
    let done = |sim: &mut Sim| {
        let ev = Event::MergeDone {
            peer: peer(2),
            epoch: 0,
            stage: 0,
            key: String::new(),
            weights_hash: vec![7; 32],
            object: None,
            from_store: (3, 1),
        };
        sim.o.step(sim.now, ev, &mut sim.rng).unwrap();
        sim.o.counters().merge_contributions_from_store
    };
    let first = done(&mut sim);
    assert_eq!(first, 3, "{:?}", sim.o.counters());
    assert_eq!(done(&mut sim), first, "the repeat adds nothing");
}

#[test]
fn butterfly_mismatch_is_recorded_with_both_owners_and_refereed() {
    let mut sim = Sim::new(butterfly_spec(1, 3));
    for i in 0..3 {
        sim.ev(register(i, format!("a{i}")));
    }
    sim.liars.insert(peer(1));
    sim.run_until_done(200);
    assert_eq!(sim.o.phase(), &Phase::Done);
    // peer(1) owns two partitions per epoch; each is disputed, refereed by the third replica.
    let ms = sim.o.mismatches();
    assert_eq!(ms.len(), 4, "{ms:?}");
    for m in ms {
        assert_eq!(m.owners.len(), 2);
        assert!(m.owners.iter().any(|(p, _)| *p == peer(1)));
        assert_eq!(m.deviants, vec![peer(1)], "the referee names the liar");
    }
    assert_eq!(sim.o.counters().hash_mismatches, 4);
}

#[test]
fn an_equivocating_replica_is_proven_convicted_and_no_honest_owner_is_named() {
    let mut sim = Sim::new(butterfly_spec(1, 3));
    for i in 0..3 {
        sim.ev(register(i, format!("a{i}")));
    }
    sim.equivocators.insert(peer(1));
    sim.run_until_done(400);
    assert_eq!(sim.o.phase(), &Phase::Done);
    assert_eq!(sim.o.history().len(), 2);
    assert!(sim.o.counters().equivocations >= 1, "{:?}", sim.o.counters());
    let run_id = sim.o.spec().run_id;
    for proof in sim.o.equivocations() {
        assert_eq!(proof.sender, peer(1));
        assert_eq!(proof.verify(run_id), Ok(()), "the kept proof stands on its own");
    }
    let first = &sim.o.history()[0];
    assert_eq!(first.convicted, vec![peer(1)], "its epoch's work is out");
    for m in sim.o.mismatches() {
        assert!(m.deviants.iter().all(|d| *d == peer(1)), "an honest owner named: {m:?}");
    }
    assert_eq!(sim.o.counters().divergent_merges, 0);
}

#[test]
fn butterfly_participant_dying_mid_merge_is_planned_out() {
    let mut sim = Sim::new(butterfly_spec(1, 3));
    for i in 0..3 {
        sim.ev(register(i, format!("a{i}")));
    }
    // One replica dies when the first merge plan reaches it.
    sim.die_on_plan = Some(peer(2));
    sim.run_until_done(400);
    assert_eq!(sim.o.phase(), &Phase::Done);
    assert_eq!(sim.o.history().len(), 2);
}

#[test]
fn butterfly_waits_for_a_slow_survivor_instead_of_planning_everyone_out() {
    let mut sim = Sim::new(butterfly_spec(1, 2));
    for i in 0..2 {
        sim.ev(register(i, format!("a{i}")));
    }
    // peer(1) dies on the plan; peer(0) is alive but slow (its deliveries to
    // the dead peer time out), so nobody finishes before the phase timeout.
    sim.die_on_plan = Some(peer(1));
    sim.until_merging_held(&[peer(0)]);
    // Three phase timeouts pass (10 s each).
    for _ in 0..60 {
        sim.drain();
        sim.tick(500);
    }
    assert_eq!(sim.o.phase(), &Phase::Merging, "the stage is not completed with nobody's weights");
    let plan = sim.o.merge_plan(0).expect("stage 0 still merging");
    assert_eq!(plan.participants.iter().map(|p| p.peer).collect::<Vec<_>>(), vec![peer(0)]);
    // The survivor finishes: the epoch completes and the run goes on.
    sim.stalled.clear();
    let held = std::mem::take(&mut sim.held);
    sim.inbox.extend(held);
    sim.run_until_done(400);
    assert_eq!(sim.o.history().len(), 2);
}

/// A participant that reports some partitions it owns and sits on another
/// holds the stage hostage (nobody can finish without that partition's
/// result); it has reported, so it is not "silent". At the merge's
/// timeout it is planned out as the laggard owner, and the merge and the
/// run complete without it.
#[test]
fn an_owner_sitting_on_one_partition_is_planned_out_at_the_timeout() {
    let mut sp = butterfly_spec(1, 3);
    sp.epochs = 1;
    let mut sim = Sim::new(sp);
    register_all(&mut sim, 3);
    let hostage_taker = sim.o.miners().next().unwrap().peer;
    sim.sit_on.insert(hostage_taker);
    sim.run_until_done(400);
    assert_eq!(*sim.o.phase(), Phase::Done, "the merge completed: {:?}", sim.o.counters());
    let plan = sim.o.merge_plan(0).unwrap();
    assert!(!plan.is_participant(&hostage_taker), "planned out");
    assert_eq!(plan.participants.len(), 2);
}
