//! Presigned-URL grants: who may write which store key, when.

use super::*;
use iota_protocol::store_keys::{contrib_prefix, merged_key, weights_parts_prefix};

/// A presigned PUT is granted only for what the merge asks of that miner
/// now: its own contribution to a planned partition of its own stage, the
/// slice and momentum of a partition whose verdict names it the writer.
#[test]
fn a_put_is_granted_only_for_what_the_merge_asks_of_that_miner() {
    let mut sim = Sim::new(butterfly_spec(2, 3));
    for i in 0..6 {
        sim.ev(Event::Register { peer: peer(i), addr: format!("a{i}"), tokens_per_s: 1.0, device: "cpu".into() });
    }
    let stage0: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 0).map(|m| m.peer).collect();
    let other = sim.o.miners().find(|m| m.stage == 1).unwrap().peer;
    sim.stalled.extend(stage0.iter().copied());
    for _ in 0..100 {
        sim.drain();
        if *sim.o.phase() == Phase::Merging && !sim.held.is_empty() {
            break;
        }
        sim.tick(500);
    }
    let plan = sim.o.merge_plan(0).expect("stage 0 is merging").clone();
    let (e, a, b) = (plan.epoch, stage0[0], stage0[1]);
    let contrib = |p: PeerId, k: usize| format!("{}{k:06}/{}.frame", contrib_prefix(e, 0), p.to_hex());
    let not_yours = |r: Result<(), Refusal>| matches!(r, Err(Refusal::NotYours(_)));
    assert_eq!(sim.o.may_write(a, &contrib(a, 0)), Ok(()));
    assert!(not_yours(sim.o.may_write(a, &contrib(b, 0))), "another participant's contribution");
    assert!(not_yours(sim.o.may_write(a, &contrib(a, plan.partitions.len()))), "a partition not in the plan");
    assert!(not_yours(sim.o.may_write(other, &contrib(other, 0))), "another stage's merge");
    assert!(not_yours(sim.o.may_write(a, &format!("{}000000/../x.frame", contrib_prefix(e, 0)))));
    assert_eq!(sim.o.may_write(peer(99), &contrib(a, 0)), Err(Refusal::Unknown(peer(99))));
    let p0 = &plan.partitions[0];
    let weights = format!("{}{}", weights_parts_prefix(e, 0), part_name(p0.offset, p0.len));
    let momentum = format!("{}{}", momentum_parts_prefix(e, 0), part_name(p0.offset, p0.len));
    assert!(stage0.iter().all(|p| not_yours(sim.o.may_write(*p, &weights))), "nobody before a verdict");
    assert!(not_yours(sim.o.may_write(a, &merged_key(e, 0))), "no parameter-server keys in a butterfly run");
    // The replicas act on their plans; their verdicts are held back.
    sim.stall_verdicts_only = true;
    let held = std::mem::take(&mut sim.held);
    sim.inbox.extend(held);
    sim.drain();
    let verdict = sim
        .held
        .iter()
        .find_map(|o| match &o.cmd {
            pb::command::Kind::Verdict(v) if v.partition == 0 && v.stage == 0 => Some(v.clone()),
            _ => None,
        })
        .expect("partition 0 has a verdict");
    let writer = PeerId(verdict.writer.as_slice().try_into().unwrap());
    for key in [&weights, &momentum] {
        assert_eq!(sim.o.may_write(writer, key), Ok(()));
        for p in stage0.iter().filter(|p| **p != writer) {
            assert!(not_yours(sim.o.may_write(*p, key)), "{key} by a non-writer");
        }
    }
}
