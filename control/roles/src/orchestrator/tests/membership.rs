//! Registration and assignment: a run waits for every stage, balances
//! miners across stages, and counts unsubscribed claims for nothing.

use super::*;

#[test]
fn waits_for_every_stage_then_balances_assignments() {
    let mut s = Sim::new(spec(3, 2, 1, 6, 2));
    for i in 0..5 {
        s.ev(register(i, format!("127.0.0.1:{}", 9000 + i as u16)));
        assert_eq!(*s.o.phase(), Phase::Waiting);
    }
    s.ev(register(5, "127.0.0.1:9005".into()));
    assert_eq!(*s.o.phase(), Phase::Training);
    for st in 0..3 {
        assert_eq!(s.o.miners().filter(|m| m.stage == st).count(), 2, "stage {st}");
    }
    // Every miner got its assignment, then heard of each later peer: it
    // knows all six, and no message carried the whole list to everyone.
    for i in 0..6 {
        let mut known = BTreeSet::new();
        for o in s.inbox.iter().filter(|o| o.to == peer(i)) {
            match &o.cmd {
                pb::command::Kind::Assign(a) => {
                    assert_eq!(a.num_stages, 3);
                    known.extend(a.peers.iter().map(|p| p.peer_id.clone()));
                }
                pb::command::Kind::Peers(p) => {
                    assert_eq!(p.peers.len(), 1);
                    known.extend(p.peers.iter().map(|p| p.peer_id.clone()));
                }
                _ => {}
            }
        }
        assert_eq!(known.len(), 6, "miner {i}");
    }
    // Two micro-batches in flight, each routed to one miner per stage, spread over replicas.
    let routes: Vec<&pb::Route> =
        s.inbox.iter().filter_map(|o| if let pb::command::Kind::Route(r) = &o.cmd { Some(r) } else { None }).collect();
    assert_eq!(routes.len(), 2 * 3, "each of 2 routes goes to its 3 pathway members");
    let heads: BTreeSet<Vec<u8>> = routes.iter().map(|r| r.pathway[0].clone()).collect();
    assert_eq!(heads.len(), 2, "the two micro-batches start on different head replicas");
}

/// Registrations are claims until the miner subscribes: they do not fill a
/// stage (a Sybil flood cannot start the run and be routed work), they are
/// forgotten after the timeout, and past the cap they are refused.
#[test]
fn unsubscribed_registrations_count_for_nothing_expire_and_are_capped() {
    let mut sp = spec(2, 1, 1, 4, 1);
    sp.miners_per_stage_cap = 3;
    let mut s = Sim::new(sp);
    let fake = |i: u8| Event::Register {
        peer: peer(100 + i),
        addr: String::new(),
        tokens_per_s: 1e6,
        device: "x".into(),
        memory: Default::default(),
    };
    for i in 0..6 {
        let out = s.o.step(s.now, fake(i), &mut s.rng).unwrap();
        assert!(out.is_empty(), "nothing is sent for a claim");
    }
    assert_eq!(s.o.miners().count(), 6);
    assert_eq!(*s.o.phase(), Phase::Waiting, "claims do not start the run");
    // Both stages are at their cap of 3: the next identity is refused.
    assert_eq!(s.o.step(s.now, fake(6), &mut s.rng).unwrap_err(), Refusal::Full(6));
    // The timeout forgets them, and real miners get their places.
    s.now += 30_001;
    s.ev(Event::Tick);
    assert_eq!(s.o.miners().count(), 0);
    s.ev(register(0, String::new()));
    s.ev(register(1, String::new()));
    assert_eq!(*s.o.phase(), Phase::Training);
    // Subscribed miners never expire by the registration timeout.
    s.now += 60_000;
    let _ = s.o.step(s.now, Event::Tick, &mut s.rng);
    assert_eq!(s.o.miners().count(), 2);
    // A stranger cannot subscribe.
    let r = s.o.step(s.now, Event::Subscribed { peer: peer(9) }, &mut s.rng);
    assert_eq!(r.unwrap_err(), Refusal::Unknown(peer(9)));
}
