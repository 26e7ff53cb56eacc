//! Restarts: of the orchestrator (its saved state resumed, its downtime
//! charged to nobody) and of miners (re-registering with their identity).

use super::*;

#[test]
fn snapshot_round_trip_resumes_the_run() {
    let mut s = Sim::new(spec(2, 2, 2, 8, 2));
    for i in 0..4 {
        s.ev(register(i, String::new()));
    }
    // Run part of the first epoch, then "crash": keep only the snapshot.
    s.drain();
    s.tick(100);
    let json = serde_json::to_string(&s.o).unwrap();
    let restored: Orchestrator = serde_json::from_str(&json).unwrap();
    assert_eq!(restored.counters(), s.o.counters());
    let mut t = Sim::new(spec(2, 2, 2, 8, 2));
    t.o = restored;
    t.now = s.now;
    // In-flight routes were lost with the old process: they time out and are re-issued.
    t.run_until_done(300);
    assert_eq!(t.o.history().len(), 2);
    assert!(t.o.history().iter().all(|e| e.completed + e.dropped == 8));
}

#[test]
fn a_stage_whose_miners_all_restarted_does_not_stall() {
    let mut s = Sim::new(spec(2, 1, 1, 6, 1));
    s.ev(register(0, String::new()));
    s.ev(register(1, String::new()));
    s.drain();
    // Both miners restart mid-epoch and register again (same identities).
    s.ev(register(0, String::new()));
    s.ev(register(1, String::new()));
    assert!(s.o.miners().all(|m| m.joining));
    s.run_until_done(100);
    assert_eq!(s.o.history()[0].completed, 6);
}

/// The orchestrator crashes early in the second epoch, after miners had
/// finished work it never saved (`k` commands acted on after the save), and
/// is down for 4 s, longer than the heartbeat timeout. It ticks before any
/// miner has reached it again. Nothing may be dropped and nobody benched:
/// the silence was the orchestrator's.
#[test]
fn a_restart_charges_its_downtime_to_nobody() {
    for k in [0usize, 3, 13, 40] {
        let mut sp = spec(2, 1, 3, 16, 2);
        sp.route_timeout_ms = 5_000;
        let mut s = Sim::new(sp.clone());
        for i in 0..2 {
            s.ev(register(i, String::new()));
        }
        while s.o.epoch() < 1 {
            s.drain_at_most(1);
            if s.inbox.is_empty() {
                s.tick(100);
            }
        }
        let saved = serde_json::to_string(&s.o).unwrap();
        s.drain_at_most(k);
        let mut t = Sim::new(sp);
        t.o = serde_json::from_str(&saved).unwrap();
        t.now = s.now + 4_000;
        t.o.resumed(t.now);
        t.ev(Event::Tick);
        assert!(t.o.miners().all(|m| m.healthy), "k={k}: a miner was judged by the orchestrator's downtime");
        t.run_until_done(300);
        let c = t.o.counters();
        assert_eq!((c.dropped, c.benched, c.failures_pinned), (0, 0, 0), "k={k}: {c:?}");
        assert!(t.o.history().iter().all(|e| e.completed == 16), "k={k}");
    }
}

/// A participant that restarts during the butterfly merge (registers again
/// with the same identity) lost its part of the merge with its process: it
/// is planned out at the next tick, not after the phase timeout, and the
/// epoch completes without it.
#[test]
fn a_participant_restarting_mid_merge_is_planned_out_at_once() {
    let mut sim = Sim::new(butterfly_spec(2, 3));
    for i in 0..6 {
        sim.ev(register(i, format!("a{i}")));
    }
    let stage0: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 0).map(|m| m.peer).collect();
    sim.until_merging_held(&stage0);
    let restarted = stage0[1];
    assert!(sim.o.merge_plan(0).unwrap().is_participant(&restarted));
    let t0 = sim.now;
    sim.ev(Event::Register {
        peer: restarted,
        addr: "a1-again".into(),
        tokens_per_s: 1.0,
        device: "cpu".into(),
        memory: Default::default(),
    });
    sim.tick(100);
    assert!(!sim.o.merge_plan(0).unwrap().is_participant(&restarted), "still waited for after its restart");
    sim.stalled.clear();
    let held: Vec<Out> = std::mem::take(&mut sim.held).into_iter().filter(|o| o.to != restarted).collect();
    sim.inbox.extend(held);
    sim.run_until_done(200);
    assert_eq!(sim.o.history().len(), 2);
    assert!(sim.now - t0 < sim.o.spec().phase_timeout_ms, "the merge waited for the phase timeout");
}

/// The orchestrator crashes during a butterfly merge right after it saved
/// and sent verdicts that never reached their miners (they died in its
/// buffers). The restored orchestrator sends them again: to a miner that
/// subscribes (`butterfly_catch_up`, which the service calls) or, without
/// that, at the phase timeout to every participant still waited for. The
/// merge completes either way; before, it waited for ever, since every
/// participant had reported and so none was planned out.
#[test]
fn verdicts_lost_in_a_crash_are_sent_again() {
    for catch_up in [true, false] {
        let sp = butterfly_spec(1, 2);
        let mut s = Sim::new(sp.clone());
        for i in 0..2 {
            s.ev(register(i, format!("a{i}")));
        }
        let mut steps = 0;
        while !s.inbox.iter().any(|o| matches!(o.cmd, pb::command::Kind::Verdict(_))) {
            s.drain_at_most(1);
            if s.inbox.is_empty() {
                s.tick(100);
            }
            steps += 1;
            assert!(steps < 100_000, "no verdict was ever sent");
        }
        // Saved with the verdicts (as the service saves before sending);
        // everything still queued is lost.
        let saved = serde_json::to_string(&s.o).unwrap();
        let mut t = Sim::new(sp);
        t.o = serde_json::from_str(&saved).unwrap();
        t.now = s.now;
        t.o.resumed(t.now);
        assert_eq!(t.o.phase(), &Phase::Merging);
        if catch_up {
            for p in [peer(0), peer(1)] {
                let again = t.o.butterfly_catch_up(&p);
                assert!(
                    again.iter().any(|o| matches!(o.cmd, pb::command::Kind::Verdict(_))),
                    "{p} is not sent its verdicts again"
                );
                t.inbox.extend(again);
            }
        }
        // The merge of epoch 0 ends: at once with the catch-up, after the
        // 10 s phase timeout without it.
        let resumed_at = t.now;
        while t.o.epoch() == 0 {
            t.drain();
            t.tick(500);
            assert!(t.now - resumed_at < 60_000, "catch_up={catch_up}: the merge never ended");
        }
        let took = t.now - resumed_at;
        assert!(if catch_up { took < 10_000 } else { took > 10_000 }, "catch_up={catch_up}: {took} ms");
        t.run_until_done(300);
        assert_eq!(t.o.history().len(), 2, "catch_up={catch_up}");
    }
}
