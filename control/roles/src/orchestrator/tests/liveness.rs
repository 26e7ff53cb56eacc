//! Liveness: blame for stalls and disputes, benching, probation, overdue
//! times, and routing by measured speed.

use super::*;

#[test]
fn timeouts_are_pinned_on_the_miner_that_waits_on_nobody() {
    let [a, b, c, d] = [peer(1), peer(2), peer(3), peer(4)];
    let path = [a, b, c, d];
    // c stalls: b waits on it for the gradient, d for the activation; a
    // waits on b, which is itself waiting.
    assert_eq!(Orchestrator::blame_for_timeout(&path, &[(a, b), (b, c), (d, c)]), Some(c));
    // The head stalls: only its successor waits on it.
    assert_eq!(Orchestrator::blame_for_timeout(&path, &[(b, a)]), Some(a));
    // Nobody reported: nobody is blamed.
    assert_eq!(Orchestrator::blame_for_timeout(&path, &[]), None);
    // A stalled miner that claims to wait too clears itself and its
    // accuser alike: nobody is blamed (the attempt counts as a strike).
    assert_eq!(Orchestrator::blame_for_timeout(&path, &[(b, c), (c, b)]), None);
}

#[test]
fn a_silent_miner_is_benched_never_merged_and_removed_after_three_benched_epochs() {
    for (butterfly, unreachable) in [(true, false), (false, false), (true, true)] {
        let mut sp = if butterfly { butterfly_spec(2, 2) } else { spec(2, 2, 2, 6, 2) };
        sp.epochs = 5;
        sp.micro_batches_per_epoch = 12;
        let mut sim = Sim::new(sp);
        sim.report_unreachable = unreachable;
        register_all(&mut sim, 4);
        let silent = sim.o.miners().find(|m| m.stage == 1).unwrap().peer;
        sim.silent.insert(silent);
        sim.run_until_done(400);
        let c = sim.o.counters().clone();
        assert_eq!(c.dropped, 0, "no micro-batch dropped ({butterfly}, {unreachable}): {c:?}");
        assert!(sim.o.history().iter().all(|e| e.completed == 12));
        // Its streak of failures never ends (it never delivers): benched as
        // soon as it reaches 2, at once when it comes back on probation and
        // fails again, and removed after 3 benched epochs.
        let m = sim.o.miner(&silent).unwrap();
        assert!(m.removed, "{m:?}");
        assert_eq!((m.delivered, m.work), (0, 0));
        assert!(c.benched >= 3 && c.removed == 1, "{c:?}");
        // It never merged: never in a butterfly plan, never an upload the
        // aggregator was handed, never waited for.
        for (_, p) in &sim.phases_heard {
            if let Some(plan) = &p.merge_plan {
                assert!(plan.participants.iter().all(|q| q.peer_id != silent.0.to_vec()));
            }
        }
        for ups in sim.aggregated.values() {
            assert!(ups.iter().all(|u| u.writer != silent.0.to_vec()));
        }
        // Each epoch took well under the phase timeout: nobody waited for it.
        assert!(sim.now < 5 * 10_000, "the run took {} ms", sim.now);
    }
}

#[test]
fn a_newcomer_carries_one_micro_batch_until_it_delivers() {
    let mut sim = Sim::new(spec(1, 2, 1, 40, 6));
    register_all(&mut sim, 2);
    // Nothing delivered yet: both start on probation, one in flight each.
    let in_flight: Vec<u32> = sim.o.miners().map(|m| m.in_flight).collect();
    assert_eq!(in_flight, vec![1, 1], "max_in_flight 6, but two newcomers take one each");
    sim.drain();
    // Once they have delivered, they take more.
    assert!(sim.o.miners().all(|m| !m.probation && m.delivered > 0));
    assert!(sim.o.miners().map(|m| m.in_flight).sum::<u32>() > 2 || sim.o.history().len() == 1);
}

/// A replica measured slow once (a cold first micro-batch, a penalised
/// failure) is routed one micro-batch again once its peer is queued two
/// deep, so its latency is measured anew: routing by the stale figure
/// would never pick it again and leave it idle (and unpaid) for the rest
/// of the run. With that one in flight, its own latency counts again.
#[test]
fn a_replica_measured_slow_once_is_tried_again_when_its_peer_is_queued() {
    let mut sim = Sim::new(spec(1, 2, 1, 40, 6));
    register_all(&mut sim, 2);
    sim.drain();
    let peers: Vec<PeerId> = sim.o.miners().map(|m| m.peer).collect();
    let (slow, fast) = (peers[0], peers[1]);
    let set = |sim: &mut Sim, slow_in_flight: u32, fast_in_flight: u32| {
        for m in sim.o.miners.values_mut() {
            m.probation = false;
            let mine = m.peer == slow;
            m.latency_ms = if mine { 2_000.0 } else { 100.0 };
            m.in_flight = if mine { slow_in_flight } else { fast_in_flight };
        }
    };
    // The share of draws that go to the slow replica (drawn in proportion
    // to 1 / cost).
    let mut rng = Rng::new(3);
    let mut share = |sim: &Sim| {
        let n = 2_000;
        (0..n).filter(|_| sim.o.pathway(&mut rng, &[], true).unwrap()[0] == slow).count() as f64 / n as f64
    };
    set(&mut sim, 0, 1);
    let s = share(&sim);
    assert!((0.45..0.55).contains(&s), "one deep: a tie between the idle one's capped cost and the queue: {s}");
    set(&mut sim, 0, 2);
    let s = share(&sim);
    assert!((0.55..0.65).contains(&s), "two deep: the idle replica is the likelier: {s}");
    set(&mut sim, 1, 2);
    let s = share(&sim);
    assert_eq!(s, 0.0, "with one in flight its own latency counts: 13x the other's, it is not drawn");
    // A replica whose work failed this epoch gets no cap: idle, its
    // penalised latency stands (a flaky miner is not retried each time it
    // falls idle).
    set(&mut sim, 0, 2);
    sim.o.miners.get_mut(&slow).unwrap().failures = 1;
    let s = share(&sim);
    assert_eq!(s, 0.0, "a failing replica is not drawn beside one 7x cheaper");
    let _ = fast;
}

/// A stage whose only replica is benched still gets its micro-batches
/// while that replica heartbeats: routing around it would stall the epoch
/// (the stage has nobody else), as it did on CI after an orchestrator
/// restart pinned two failures on a sole tail.
#[test]
fn a_stage_whose_only_replica_is_benched_is_still_routed_while_it_heartbeats() {
    let mut sim = Sim::new(spec(2, 1, 1, 10, 2));
    register_all(&mut sim, 2);
    sim.drain();
    let tail = sim.o.miners().find(|m| m.stage == 1).unwrap().peer;
    for m in sim.o.miners.values_mut() {
        m.in_flight = 0;
        m.probation = false;
        m.benched = m.peer == tail;
    }
    let mut rng = Rng::new(9);
    let p = sim.o.pathway(&mut rng, &[], true).expect("a pathway through the benched tail");
    assert_eq!(p[1], tail);
    // Once it stops heartbeating it is no longer tried.
    sim.o.miners.get_mut(&tail).unwrap().healthy = false;
    assert!(sim.o.pathway(&mut rng, &[], true).is_none());
}

/// The routes in `sim`'s inbox, taken out: (pathway, attempt, overdue_ms,
/// micro-batch), one per attempt.
fn take_routes(sim: &mut Sim) -> Vec<(Vec<PeerId>, u32, u64, MbRef)> {
    let mut seen = Vec::new();
    for Out { cmd, .. } in std::mem::take(&mut sim.inbox) {
        if let pb::command::Kind::Route(r) = cmd {
            let path: Vec<PeerId> = r.pathway.iter().map(|b| PeerId(b.as_slice().try_into().unwrap())).collect();
            let mb = MbRef { epoch: r.epoch, shard: r.shard, first_sample: r.first_sample };
            if !seen.iter().any(|(_, a, _, m): &(Vec<PeerId>, u32, u64, MbRef)| *m == mb && *a == r.attempt) {
                seen.push((path, r.attempt, r.overdue_ms, mb));
            }
        }
    }
    seen
}

/// An attempt issued before anything was measured told its miners to wait
/// the ceiling (half the route timeout) before reporting a silent
/// neighbour; a silent head in the first epoch held the epoch's end that
/// long. Once a delivery is measured, the attempt is issued again after
/// the measured overdue time and its grace: nobody is blamed or penalised,
/// and it is no strike.
#[test]
fn an_attempt_issued_before_any_measurement_is_reissued_once_the_measured_overdue_time_passes() {
    let mut sp = spec(2, 2, 1, 40, 4);
    sp.route_timeout_ms = 20_000;
    let mut sim = Sim::new(sp);
    register_all(&mut sim, 4);
    let routes = take_routes(&mut sim);
    assert_eq!(routes.len(), 2, "two newcomers per stage, one micro-batch each");
    assert!(routes.iter().all(|r| r.2 == 10_000), "nothing measured: the ceiling");
    // One pathway delivers in 100 ms; the other says nothing.
    let (done, quiet) = (&routes[0], &routes[1]);
    sim.now = 100;
    sim.ev(Event::Loss { peer: done.0[1], mb: done.3, attempt: 0, loss: 2.0, tokens: 8 });
    sim.ev(Event::BackwardDone { peer: done.0[0], mb: done.3, attempt: 0 });
    let measured = sim.o.overdue_ms(&quiet.0);
    let grace = sim.o.waiting_grace_ms_given(&quiet.0, sim.o.slowest_live_delivery_ms());
    assert_eq!(measured, 400, "four times the 100 ms delivery");
    let latency = |sim: &Sim| quiet.0.iter().map(|p| sim.o.miner(p).unwrap().latency_ms).collect::<Vec<_>>();
    let before = latency(&sim);
    // Not before the measured overdue time and its grace...
    sim.now = measured + grace - 1;
    sim.ev(Event::Tick);
    assert_eq!(sim.o.counters().reissued_unmeasured, 0);
    // ... and at once after.
    sim.now = measured + grace;
    sim.ev(Event::Tick);
    let c = sim.o.counters().clone();
    assert_eq!((c.reissued_unmeasured, c.failures_pinned, c.dropped), (1, 0, 0), "{c:?}");
    assert_eq!(latency(&sim), before, "nobody is penalised");
    let again = take_routes(&mut sim);
    let r = again.iter().find(|r| r.3 == quiet.3).expect("the quiet micro-batch is routed again");
    assert_eq!(r.1, 1);
    assert!(r.2 <= measured, "with the measured overdue time: {}", r.2);
    assert!(r.0.iter().all(|p| !quiet.0.contains(p)), "{:?} avoids {:?}", r.0, quiet.0);
    match &sim.o.mbs.values().find(|m| m.mb == quiet.3).unwrap().status {
        MbStatus::InFlight { strikes, unmeasured, .. } => assert_eq!((*strikes, *unmeasured), (0, false)),
        s => panic!("{s:?}"),
    }
    // An attempt issued with a measured time is not re-issued, even when
    // deliveries have since got faster (a first version compared with the
    // overdue time it was issued with: as latencies fell, measured attempts
    // looked late and were issued again, their work cancelled): its
    // neighbours report a silent miner themselves.
    for m in sim.o.miners.values_mut().filter(|m| m.delivery_ms > 0.0) {
        m.delivery_ms = 10.0;
    }
    assert!(sim.o.overdue_ms(&r.0) < r.2);
    sim.now += measured + grace;
    sim.ev(Event::Tick);
    assert_eq!(sim.o.counters().reissued_unmeasured, 1);
}

/// A failed attempt's penalty steers routing away from the miner, but it
/// does not raise the time neighbours wait before reporting: one failure
/// of a flaky miner used to put every later failure at the ceiling.
#[test]
fn a_failure_penalty_does_not_raise_the_overdue_time() {
    let mut sim = Sim::new(spec(2, 2, 1, 40, 4));
    register_all(&mut sim, 4);
    sim.drain();
    let peers: Vec<PeerId> = sim.o.miners().map(|m| m.peer).collect();
    let path = vec![peers[0], peers[1]];
    let before = sim.o.overdue_ms(&path);
    assert!(before < 500, "measured deliveries: {before}");
    let flaky = sim.o.miners().find(|m| m.stage == 0).unwrap().peer;
    let latency = sim.o.miner(&flaky).unwrap().latency_ms;
    sim.o.penalize(flaky, 1_000.0);
    assert!(sim.o.miner(&flaky).unwrap().latency_ms > latency, "routing sees the penalty");
    assert_eq!(sim.o.overdue_ms(&path), before, "the overdue time does not");
}

/// A miner that drops the frames it receives reports its honest
/// neighbours, which wait on nobody: one word against another. The one that
/// keeps turning up in disputes with different miners is pinned.
#[test]
fn stalls_are_pinned_on_the_miner_common_to_the_disputes() {
    let mut sim = Sim::new(spec(2, 2, 1, 40, 4));
    let [f, h, t1, t2] = [peer(1), peer(2), peer(3), peer(4)];
    // A head that drops gradients accuses the tails it was paired with.
    assert_eq!(sim.o.pin_stall(&[f, t1], &[(f, t1)]), Some(t1), "a first accusation is believed");
    assert_eq!(sim.o.pin_stall(&[f, t2], &[(f, t2)]), Some(f), "its second, of another miner, is not");
    assert_eq!(sim.o.pin_stall(&[f, t1], &[(f, t1)]), Some(f));
    // An honest tail that accuses the head nobody else accused is believed.
    assert_eq!(sim.o.pin_stall(&[h, t2], &[(t2, h)]), Some(h));
    sim.o.liveness_new_epoch();
    // A silent head accused by both tails is pinned each time, and a tail
    // that accused it is still believed about another miner.
    assert_eq!(sim.o.pin_stall(&[f, t1], &[(t1, f)]), Some(f));
    assert_eq!(sim.o.pin_stall(&[f, t2], &[(t2, f)]), Some(f));
    assert_eq!(sim.o.pin_stall(&[h, t1], &[(t1, h)]), Some(h), "its accusation of f was corroborated");
    sim.o.liveness_new_epoch();
    // A tail that drops activations: it and the head wait on each other.
    // The first such dispute is nobody's; the tail is in the second too.
    assert_eq!(sim.o.pin_stall(&[f, t1], &[(f, t1), (t1, f)]), None);
    assert_eq!(sim.o.pin_stall(&[h, t1], &[(t1, h), (h, t1)]), Some(t1));
    assert_eq!(sim.o.pin_stall(&[f, t1], &[(t1, f), (f, t1)]), Some(t1));
    // Nobody reported: nobody is pinned.
    assert_eq!(sim.o.pin_stall(&[f, t2], &[]), None);
}

/// Most micro-batches in flight at once while each twelve of the run's
/// micro-batches are issued (every miner acting on its commands one at a
/// time).
fn most_in_flight_per_twelve(sp: RunSpec) -> Vec<usize> {
    let per_epoch = sp.micro_batches_per_epoch;
    let buckets = (sp.epochs * per_epoch / 12) as usize;
    let mut sim = Sim::new(sp);
    register_all(&mut sim, 6);
    let mut most = vec![0; buckets];
    for _ in 0..400 {
        loop {
            let now = sim.o.mbs.values().filter(|r| matches!(r.status, MbStatus::InFlight { .. })).count();
            let issued = sim.o.epoch() * per_epoch + sim.o.issued;
            let b = ((issued / 12) as usize).min(buckets - 1);
            most[b] = most[b].max(now);
            if sim.inbox.is_empty() {
                break;
            }
            sim.drain_at_most(1);
        }
        if *sim.o.phase() == Phase::Done {
            return most;
        }
        sim.tick(500);
    }
    panic!("run did not finish: phase {:?}, epoch {}", sim.o.phase(), sim.o.epoch());
}

/// The pipeline's warm-up: the run's first micro-batches go out with one
/// per pathway (per replica) in flight, across epochs if need be; then the
/// pipeline fills to max_in_flight.
#[test]
fn the_first_micro_batches_go_out_one_per_pathway() {
    let mut sp = spec(3, 2, 3, 24, 4);
    sp.pipeline_warmup_micro_batches = 36;
    assert_eq!(most_in_flight_per_twelve(sp.clone()), vec![2, 2, 2, 4, 4, 4]);
    sp.pipeline_warmup_micro_batches = 12;
    assert_eq!(most_in_flight_per_twelve(sp.clone()), vec![2, 4, 4, 4, 4, 4]);
    sp.pipeline_warmup_micro_batches = 0;
    assert_eq!(most_in_flight_per_twelve(sp), vec![4, 4, 4, 4, 4, 4]);
}

/// `hostile-unreachable`: a head replica reports whichever stage-1 miner
/// its pathway names UNREACHABLE, every time, and does no work. One
/// miner's word pins nothing: the micro-batches go round it, nothing is
/// dropped, no honest miner is benched; a genuinely unreachable miner
/// (two neighbours say so) still is.
#[test]
fn one_hostile_neighbour_reporting_unreachable_benches_nobody() {
    let mut sp = butterfly_spec(2, 2);
    sp.epochs = 3;
    sp.micro_batches_per_epoch = 12;
    let mut sim = Sim::new(sp);
    register_all(&mut sim, 4);
    let hostile = sim.o.miners().find(|m| m.stage == 0).unwrap().peer;
    sim.hostile_reporter = Some(hostile);
    sim.run_until_done(400);
    let c = sim.o.counters().clone();
    assert_eq!(c.dropped, 0, "{c:?}");
    assert!(sim.o.history().iter().all(|e| e.completed == 12), "{:?}", sim.o.history());
    assert!(c.uncorroborated_reports > 0, "the hostile reports were made: {c:?}");
    let honest_benched: Vec<_> = sim.o.miners().filter(|m| m.peer != hostile && m.benched_epochs > 0).collect();
    assert!(honest_benched.is_empty(), "{honest_benched:?}");
    assert!(sim.o.miners().filter(|m| m.stage == 1).all(|m| m.delivered > 0 && !m.removed));
    // Its word was contradicted: the stage-1 miners it named delivered.
    assert!(c.false_reports > 0, "{c:?}");
}

/// Two distinct neighbours reporting a miner UNREACHABLE pin a failure on
/// it; one reporter repeating itself does not, and a reporter whose
/// targets keep delivering loses its standing.
#[test]
fn unreachable_is_pinned_only_when_two_neighbours_say_so() {
    let mut sim = Sim::new(butterfly_spec(2, 2));
    register_all(&mut sim, 4);
    let heads: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 0).map(|m| m.peer).collect();
    let bodies: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 1).map(|m| m.peer).collect();
    let pinned0 = sim.o.counters().failures_pinned;
    let mut out = Vec::new();
    for _ in 0..3 {
        sim.o.unreachable_reported(sim.now, heads[0], bodies[0], &mut out);
    }
    assert_eq!(sim.o.counters().failures_pinned, pinned0, "one reporter, three reports: nothing pinned");
    sim.o.unreachable_reported(sim.now, heads[1], bodies[0], &mut out);
    assert_eq!(sim.o.counters().failures_pinned, pinned0 + 1, "borne out by a second neighbour");
    // Borne out, so its delivery holds nothing against the reporters.
    sim.o.delivered(&[heads[0], bodies[0]], 10.0);
    assert_eq!(sim.o.miner(&heads[0]).unwrap().false_reports, 0);
    // Three lone reports its target's deliveries contradict...
    for _ in 0..3 {
        sim.o.unreachable_reported(sim.now, heads[0], bodies[1], &mut out);
        sim.o.delivered(&[heads[1], bodies[1]], 10.0);
    }
    assert_eq!(sim.o.miner(&heads[0]).unwrap().false_reports, 3);
    // ... and its word no longer counts toward a second one's.
    sim.o.unreachable_reported(sim.now, heads[0], bodies[1], &mut out);
    sim.o.unreachable_reported(sim.now, heads[1], bodies[1], &mut out);
    assert_eq!(sim.o.counters().failures_pinned, pinned0 + 1, "the discredited reporter corroborates nothing");
}

/// Issue 58 (found by the suite's measured-scale test under load): a
/// micro-batch whose first attempt reported its loss but never its
/// backward, and was issued again, trained its tokens once: they are
/// counted when it completes, not with each attempt's loss.
#[test]
fn an_attempt_re_issued_after_its_loss_counts_the_micro_batch_tokens_once() {
    let mut sp = spec(2, 2, 1, 40, 4);
    sp.route_timeout_ms = 20_000;
    let mut sim = Sim::new(sp);
    register_all(&mut sim, 4);
    let routes = take_routes(&mut sim);
    let (done, quiet) = (&routes[0], &routes[1]);
    sim.now = 100;
    sim.ev(Event::Loss { peer: done.0[1], mb: done.3, attempt: 0, loss: 2.0, tokens: 8 });
    sim.ev(Event::BackwardDone { peer: done.0[0], mb: done.3, attempt: 0 });
    assert_eq!(sim.o.counters().tokens, 8);
    // The quiet pathway's tail reports a loss; its head never finishes.
    sim.ev(Event::Loss { peer: quiet.0[1], mb: quiet.3, attempt: 0, loss: 2.0, tokens: 8 });
    assert_eq!(sim.o.counters().tokens, 8, "not trained until the micro-batch completes");
    let overdue = sim.o.overdue_ms(&quiet.0) + sim.o.waiting_grace_ms_given(&quiet.0, sim.o.slowest_live_delivery_ms());
    sim.now = overdue + 1;
    sim.ev(Event::Tick);
    let again = take_routes(&mut sim);
    let r = again.iter().find(|r| r.3 == quiet.3 && r.1 >= 1).expect("the quiet micro-batch is issued again");
    sim.ev(Event::Loss { peer: r.0[1], mb: r.3, attempt: r.1, loss: 2.0, tokens: 8 });
    sim.ev(Event::BackwardDone { peer: r.0[0], mb: r.3, attempt: r.1 });
    assert!(matches!(sim.o.mbs.values().find(|m| m.mb == quiet.3).unwrap().status, MbStatus::Done { .. }));
    assert_eq!(sim.o.counters().completed, 2);
    assert_eq!(sim.o.counters().tokens, 16, "two micro-batches of 8 tokens, each counted once");
}
