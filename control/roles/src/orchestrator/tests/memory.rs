//! Miners' stated memory: a stage is assigned only where the memory plan
//! holds it, a miner whose memory holds no stage is refused with the
//! reason, and routing gives a miner no more micro-batches than fit.

use iota_core::memory_fit::RunMemoryNeeds;
use iota_core::memory_plan::{ComputeBackend, InnerOptimizer};

use super::*;

const SEQ: usize = 128;

/// `small` in 3 stages at the sim's batch of 4 x `SEQ`, up to 4 held.
fn needs() -> RunMemoryNeeds {
    let small = iota_core::ModelConfig::preset("small").unwrap();
    RunMemoryNeeds::new(&small, 3, 4, SEQ, 4, InnerOptimizer::AdamW).unwrap()
}

/// Bytes whose usable part holds exactly `held` micro-batches of `stage`.
fn memory_for(n: &RunMemoryNeeds, stage: usize, held: usize) -> u64 {
    let mut bytes = 1u64 << 20;
    while n.max_held(ComputeBackend::Cpu, stage, bytes) < held {
        bytes += 1 << 16;
    }
    assert_eq!(n.max_held(ComputeBackend::Cpu, stage, bytes), held, "no memory holds exactly {held}");
    bytes
}

fn stating(i: u8, bytes: u64) -> Event {
    Event::Register {
        peer: peer(i),
        addr: format!("a{i}"),
        tokens_per_s: 1.0,
        device: "cpu".into(),
        memory: MemoryStated { bytes, compute: ComputeBackend::Cpu },
    }
}

#[test]
fn a_miner_whose_memory_holds_no_stage_is_refused_saying_what_a_stage_needs() {
    let mut s = Sim::new(spec(3, 1, 1, 6, 4));
    s.o.set_memory_needs(needs());
    let e = s.o.step(0, stating(0, 1 << 20), &mut s.rng).unwrap_err();
    let Refusal::DoesNotFit(why) = &e else { panic!("{e:?}") };
    assert!(why.contains("needs") && why.contains("GiB") && why.contains("4 x 128"), "{why}");
    assert!(s.o.miner(&peer(0)).is_none(), "a refused miner is not registered");
    // Stating nothing is never checked.
    s.ev(register(1, "a1".into()));
    assert!(s.o.miner(&peer(1)).is_some());
}

#[test]
fn a_miner_gets_a_stage_its_memory_holds_even_where_another_needs_miners_more() {
    let n = needs();
    let (head, body, tail) =
        (n.least(ComputeBackend::Cpu, 0), n.least(ComputeBackend::Cpu, 1), n.least(ComputeBackend::Cpu, 2));
    assert!(body < head && body < tail, "small's body is its smallest stage: {head} {body} {tail}");
    let mut s = Sim::new(spec(3, 2, 1, 6, 4));
    s.o.set_memory_needs(n.clone());
    // Memory for the body only: it goes there every time, though the
    // head and tail stages have fewer miners.
    let just_body = memory_for(&n, 1, 1);
    assert_eq!(n.max_held(ComputeBackend::Cpu, 0, just_body), 0);
    for i in 0..2 {
        s.ev(stating(i, just_body));
        assert_eq!(s.o.miner(&peer(i)).unwrap().stage, 1);
    }
    // Restarting with less memory than its stage needs is refused.
    let e = s.o.step(0, stating(0, 1 << 20), &mut s.rng).unwrap_err();
    assert!(matches!(e, Refusal::DoesNotFit(_)), "{e:?}");
}

/// The most micro-batches the body miner held at once over a whole run,
/// its memory stated as `body` bytes (0: not stated).
fn most_held_by_the_body(n: &RunMemoryNeeds, body: u64) -> usize {
    let mut s = Sim::new(spec(3, 1, 2, 12, 4));
    s.o.set_memory_needs(n.clone());
    let plenty = 1u64 << 40;
    s.ev(stating(0, plenty));
    s.ev(stating(1, body));
    s.ev(stating(2, plenty));
    let stages: Vec<u32> = (0..3).map(|i| s.o.miner(&peer(i)).unwrap().stage).collect();
    assert_eq!(stages, vec![0, 1, 2]);
    let mut most = 0;
    for _ in 0..20_000 {
        if *s.o.phase() == Phase::Done {
            break;
        }
        if s.inbox.is_empty() {
            s.tick(100);
        } else {
            s.drain_at_most(1);
        }
        most = most.max(s.o.miner(&peer(1)).unwrap().in_flight as usize);
    }
    assert_eq!(s.o.phase(), &Phase::Done);
    assert!(s.o.history().iter().all(|e| e.completed == 12), "every micro-batch completed");
    most
}

#[test]
fn routing_gives_a_miner_no_more_micro_batches_than_its_memory_holds() {
    let n = needs();
    // Unstated, the body takes as many as the run has in flight.
    assert_eq!(most_held_by_the_body(&n, 0), 4);
    for held in [1usize, 2, 3] {
        assert_eq!(most_held_by_the_body(&n, memory_for(&n, 1, held)), held);
    }
}
