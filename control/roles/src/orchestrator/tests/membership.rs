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
    // Both stages are at their cap of 3: the next identity is queued.
    assert_eq!(s.o.step(s.now, fake(6), &mut s.rng).unwrap_err(), Refusal::Queued { position: 1, length: 1 });
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

/// A full run queues newcomers (issue 58/59): each hears its place, keeps
/// it by asking again, and a freed place goes to the queue's head even
/// when someone behind asks first; positions only move up, and survive the
/// orchestrator's restart.
#[test]
fn a_full_run_queues_newcomers_and_a_freed_place_goes_to_the_head() {
    let mut sp = spec(2, 1, 3, 4, 1);
    sp.miners_per_stage_cap = 1;
    let mut s = Sim::new(sp);
    s.ev(register(0, "a".into()));
    s.ev(register(1, "b".into()));
    assert_eq!(*s.o.phase(), Phase::Training);
    let queued = |s: &mut Sim, i: u8| s.o.step(s.now, register(i, String::new()), &mut s.rng).unwrap_err();
    assert_eq!(queued(&mut s, 2), Refusal::Queued { position: 1, length: 1 });
    assert_eq!(queued(&mut s, 3), Refusal::Queued { position: 2, length: 2 });
    assert_eq!(queued(&mut s, 4), Refusal::Queued { position: 3, length: 3 });
    // Asking again keeps the place; the standing a queued miner is sent says it.
    s.tick(1_000);
    assert_eq!(queued(&mut s, 3), Refusal::Queued { position: 2, length: 3 });
    let st = s.o.queued_standing(2, 3);
    assert_eq!((st.state(), st.queue_position, st.queue_length), (pb::StandingState::Queued, 2, 3));
    // A restart (the state saved and restored): the same places.
    let saved = serde_json::to_string(&s.o).unwrap();
    let mut restored: Orchestrator = serde_json::from_str(&saved).unwrap();
    restored.resumed(s.now);
    for i in [2, 3, 4] {
        assert_eq!(restored.waitlist().position(&peer(i)), Some(i as usize - 2));
    }
    // Miner 1 goes silent: past the place hold its place frees. Miner 3
    // (second) asks first and stays queued; miner 2 (the head) takes it.
    s.dead.insert(peer(1));
    for _ in 0..13 {
        s.tick(1_000);
        for i in [3, 4] {
            assert!(matches!(queued(&mut s, i), Refusal::Queued { .. }));
        }
    }
    assert_eq!(queued(&mut s, 3), Refusal::Queued { position: 2, length: 3 });
    s.o.step(s.now, register(2, String::new()), &mut s.rng).expect("the head takes the freed place");
    assert_eq!(s.o.miner(&peer(2)).map(|m| m.stage), Some(1), "the silent miner's stage");
    assert_eq!(queued(&mut s, 3), Refusal::Queued { position: 1, length: 2 });
    s.o.step(s.now, Event::Subscribed { peer: peer(2) }, &mut s.rng).unwrap();
    // A queued miner that stops asking leaves; those behind move up.
    for _ in 0..=WAITING_TIMEOUT_MS / 1_000 {
        s.tick(1_000);
        assert!(matches!(queued(&mut s, 4), Refusal::Queued { .. }));
    }
    assert_eq!(queued(&mut s, 4), Refusal::Queued { position: 1, length: 1 });
    // The silent miner comes back: it keeps its stage, over the cap.
    s.o.step(s.now, register(1, "b".into()), &mut s.rng).expect("a known miner is taken back");
    assert_eq!(s.o.miner(&peer(1)).map(|m| m.stage), Some(1));
}
