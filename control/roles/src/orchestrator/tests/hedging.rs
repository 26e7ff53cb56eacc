//! Hedging an epoch's stragglers: a late attempt issued again on idle
//! miners, the first to complete winning, and the failures of either.

use super::*;

const LAST: u64 = 7;

/// 2 stages x 2 replicas, 8 micro-batches; every one but the last
/// completes at once, attempts of the last listed in `hold` are sat on.
/// Returns when the last one's first attempt is out and nothing else is.
fn swarm_with_a_straggler(hold: &[u32]) -> Sim {
    let mut sim = Sim::new(spec(2, 2, 1, LAST + 1, 4));
    sim.hold.extend(hold.iter().map(|a| (LAST, *a)));
    register_all(&mut sim, 4);
    for _ in 0..20 {
        sim.drain();
        if sim.o.micro_batches().filter(|(_, s)| matches!(s, MbStatus::Done { .. })).count() as u64 == LAST {
            break;
        }
        sim.tick(10);
    }
    assert_eq!(sim.held_routes.len(), 1, "the last micro-batch's first attempt is out");
    sim
}

fn status_of(sim: &Sim, seq: u64) -> MbStatus {
    sim.o.mbs[&seq].status.clone()
}

fn route_path(r: &pb::Route) -> Vec<PeerId> {
    r.pathway.iter().map(|b| PeerId(b.as_slice().try_into().unwrap())).collect()
}

fn complete(sim: &mut Sim, r: &pb::Route) {
    let path = route_path(r);
    let mb = MbRef { epoch: r.epoch, shard: r.shard, first_sample: r.first_sample };
    sim.ev(Event::Loss { peer: *path.last().unwrap(), mb, attempt: r.attempt, loss: 2.5, tokens: 8 });
    sim.ev(Event::BackwardDone { peer: path[0], mb, attempt: r.attempt });
}

/// Ticks until the hedge of the last micro-batch is issued; returns the
/// time it took.
fn until_hedged(sim: &mut Sim) -> Ms {
    let t0 = sim.now;
    for _ in 0..100 {
        if sim.o.counters().hedged > 0 {
            return sim.now - t0;
        }
        sim.tick(10);
        sim.drain();
    }
    panic!("never hedged: {:?}", sim.o.counters());
}

#[test]
fn a_late_micro_batch_is_hedged_on_idle_miners_and_the_hedge_can_win() {
    let mut sim = swarm_with_a_straggler(&[0]);
    let (_, first) = sim.held_routes[0].clone();
    let first_path = route_path(&first);
    let cancels = sim.cancels_seen;
    // Not before half the overdue time (300 ms here: nothing measured is
    // slow) has passed.
    let waited = until_hedged(&mut sim);
    assert!((150..=170).contains(&waited), "hedged after {waited} ms");
    // The hedge ran (it was not held) and completed the micro-batch.
    let MbStatus::Done { attempt, pathway, loss } = status_of(&sim, LAST) else { panic!("not done") };
    assert_eq!((attempt, loss), (1, 2.0));
    assert!(pathway.iter().all(|p| !first_path.contains(p)), "a disjoint pathway: {pathway:?} vs {first_path:?}");
    let c = sim.o.counters().clone();
    assert_eq!((c.hedged, c.hedges_won, c.completed, c.failures_pinned), (1, 1, LAST + 1, 0), "{c:?}");
    // The first attempt's miners were told to drop it, and its work counts
    // for nobody; the epoch ended with nothing in flight.
    assert_eq!(sim.cancels_seen, cancels + 2);
    assert!(sim.o.miners().all(|m| m.in_flight == 0));
    // Its late reports are stale.
    let stale = c.stale_reports;
    complete(&mut sim, &first);
    assert_eq!(sim.o.counters().stale_reports, stale + 2);
    assert_eq!(sim.o.counters().completed, LAST + 1);
}

#[test]
fn the_first_attempt_can_still_win_and_its_hedge_is_cancelled() {
    let mut sim = swarm_with_a_straggler(&[0, 1]);
    until_hedged(&mut sim);
    let (_, first) = sim.held_routes[0].clone();
    let (_, hedge) = sim.held_routes.iter().find(|(_, r)| r.attempt == 1).cloned().expect("the hedge's route");
    let work_before: u64 = sim.o.miners().map(|m| m.work).sum();
    let cancels = sim.cancels_seen;
    complete(&mut sim, &first);
    sim.drain();
    let MbStatus::Done { attempt, pathway, .. } = status_of(&sim, LAST) else { panic!("not done") };
    assert_eq!((attempt, pathway), (0, route_path(&first)));
    assert_eq!(sim.cancels_seen, cancels + 2, "the hedge's two miners cancel it");
    assert_eq!(sim.o.counters().hedges_won, 0);
    // Counted once: the tokens and the work of one pathway.
    assert_eq!(sim.o.miners().map(|m| m.work).sum::<u64>(), work_before + 2);
    assert!(sim.o.miners().all(|m| m.in_flight == 0));
    // The hedge's late reports change nothing.
    let tokens = sim.o.counters().tokens;
    complete(&mut sim, &hedge);
    assert_eq!(sim.o.counters().tokens, tokens);
}

#[test]
fn when_the_first_attempt_stalls_its_hedge_carries_on_without_a_new_route() {
    let mut sim = swarm_with_a_straggler(&[0, 1, 2]);
    until_hedged(&mut sim);
    let (_, first) = sim.held_routes[0].clone();
    let (_, hedge) = sim.held_routes.iter().find(|(_, r)| r.attempt == 1).cloned().unwrap();
    let path = route_path(&first);
    let mb = MbRef { epoch: first.epoch, shard: first.shard, first_sample: first.first_sample };
    // The first attempt's head reports its tail overdue; after the grace it
    // is pinned on the tail, and the hedge becomes the current attempt.
    let routes = sim.routes_seen;
    sim.ev(Event::PeerFailed { peer: path[0], mb, attempt: 0, named: path[1], failure: pb::Failure::NoInput });
    for _ in 0..30 {
        sim.tick(10);
        sim.drain();
    }
    assert_eq!(sim.o.counters().failures_pinned, 1);
    // No new route but the promoted attempt's own hedge (attempt 2, on the
    // first attempt's miners, idle again).
    let MbStatus::InFlight { attempt, pathway, hedge: h, .. } = status_of(&sim, LAST) else { panic!("in flight") };
    assert_eq!((attempt, pathway), (1, route_path(&hedge)));
    assert_eq!(sim.routes_seen, routes + 2 * u64::from(h.is_some()), "{h:?}");
    assert!(h.is_none_or(|h| h.attempt == 2));
    complete(&mut sim, &hedge);
    let MbStatus::Done { attempt, pathway, .. } = status_of(&sim, LAST) else { panic!("not done") };
    assert_eq!((attempt, pathway), (1, route_path(&hedge)));
    assert!(sim.o.miners().all(|m| m.in_flight == 0));
}

#[test]
fn a_stalled_hedge_is_dropped_blaming_nobody_and_its_attempt_number_is_not_reused() {
    let mut sim = swarm_with_a_straggler(&[0, 1, 2]);
    until_hedged(&mut sim);
    let (_, first) = sim.held_routes[0].clone();
    let (_, hedge) = sim.held_routes.iter().find(|(_, r)| r.attempt == 1).cloned().unwrap();
    let mb = MbRef { epoch: first.epoch, shard: first.shard, first_sample: first.first_sample };
    let hp = route_path(&hedge);
    sim.ev(Event::PeerFailed { peer: hp[1], mb, attempt: 1, named: hp[0], failure: pb::Failure::NoInput });
    sim.drain();
    let MbStatus::InFlight { attempt, hedge: h, last_attempt, .. } = status_of(&sim, LAST) else { panic!() };
    assert_eq!((attempt, h, last_attempt), (0, None, 1));
    assert_eq!(sim.o.counters().failures_pinned, 0);
    assert!(hp.iter().all(|p| sim.o.miner(p).unwrap().in_flight == 0));
    // A report about a miner off the hedge's pathway is refused.
    let off = route_path(&first)[0];
    let bad = Event::PeerFailed { peer: hp[1], mb, attempt: 1, named: off, failure: pb::Failure::NoInput };
    assert!(sim.o.step(sim.now, bad, &mut Rng::new(1)).is_ok(), "the hedge is gone: a stale report");
    // When the first attempt then fails, it is issued again as attempt 2.
    let fp = route_path(&first);
    sim.ev(Event::PeerFailed { peer: fp[0], mb, attempt: 0, named: fp[1], failure: pb::Failure::Unreachable });
    sim.drain();
    assert!(sim.held_routes.iter().any(|(_, r)| r.attempt == 2), "{:?}", sim.held_routes);
}
