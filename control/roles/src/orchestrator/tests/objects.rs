//! Store objects: announcements handed to readers, foreign ones refused,
//! uploads weighted by counted work, and presigned-URL grants (who may
//! write which key, when).

use super::*;
use iota_wire::store_keys::{contrib_prefix, merged_key, weights_parts_prefix};

/// A presigned PUT is granted only for what the merge asks of that miner
/// now: its own contribution to a planned partition of its own stage, the
/// slice and momentum of a partition whose verdict names it the writer.
#[test]
fn a_put_is_granted_only_for_what_the_merge_asks_of_that_miner() {
    let mut sim = Sim::new(butterfly_spec(2, 3));
    for i in 0..6 {
        sim.ev(register(i, format!("a{i}")));
    }
    let stage0: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 0).map(|m| m.peer).collect();
    let other = sim.o.miners().find(|m| m.stage == 1).unwrap().peer;
    sim.until_merging_held(&stage0);
    let plan = sim.o.merge_plan(0).expect("stage 0 is merging").clone();
    let (e, a, b) = (plan.epoch, stage0[0], stage0[1]);
    let contrib = |p: PeerId, k: usize| format!("{}{k:06}/{}.frame", contrib_prefix(e, 0), p.to_hex());
    let not_yours = |r: Result<(), Refusal>| matches!(r, Err(Refusal::NotYours(_)));
    assert_eq!(sim.o.may_write(a, &contrib(a, 0)), Ok(()));
    assert!(not_yours(sim.o.may_write(a, &contrib(b, 0))), "another participant's contribution");
    let witness = |p: PeerId| contrib(p, 0).replace(".frame", ".witness");
    assert_eq!(sim.o.may_write(a, &witness(a)), Ok(()), "its witness");
    assert!(not_yours(sim.o.may_write(a, &witness(b))), "another participant's witness");
    assert!(not_yours(sim.o.may_write(a, &contrib(a, 0).replace(".frame", ".other"))), "another kind of object");
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

/// The objects `to` was handed in its last phase command of `phase` for `epoch`.
fn handed(
    sim: &Sim,
    to: PeerId,
    epoch: u64,
    phase: pb::Phase,
    pick: fn(&pb::PhaseChange) -> &Vec<pb::StoredObject>,
) -> Vec<StoredObject> {
    let p =
        sim.phases_heard.iter().rev().find(|(t, p)| *t == to && p.epoch == epoch && p.phase == phase as i32).unwrap();
    iota_wire::manifest::from_pb_list(pick(&p.1)).unwrap()
}

#[test]
fn announced_slices_reach_readers_and_foreign_announcements_are_refused() {
    let mut sim = Sim::new(butterfly_spec(2, 2));
    for i in 0..4 {
        sim.ev(register(i, format!("a{i}")));
    }
    sim.run_until_done(200);
    let stage1: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 1).map(|m| m.peer).collect();
    let stage0: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 0).map(|m| m.peer).collect();
    // Epoch 1's training tells each replica what epoch 0's merge stored:
    // one part per partition, covering the stage, each by its writer.
    let weights = handed(&sim, stage1[0], 1, pb::Phase::Training, |p| &p.weights);
    let mut covered = 0;
    for w in &weights {
        assert_eq!(w.offset, covered);
        assert!(w.key.starts_with(&weights_parts_prefix(0, 1)), "{}", w.key);
        assert!(stage1.contains(&w.writer));
        covered += w.values;
    }
    assert_eq!(covered, 10_000);
    // Epoch 1's merge starts from epoch 0's momentum.
    let momentum = handed(&sim, stage1[0], 1, pb::Phase::Merging, |p| &p.momentum);
    assert_eq!(momentum.iter().map(|m| m.values).sum::<u64>(), 10_000);
    assert!(momentum.iter().all(|m| m.key.starts_with(&momentum_parts_prefix(0, 1))));
    // The other replica heard of each slice its peer wrote.
    assert!(sim.stored_heard.iter().any(|(to, st)| stage1.contains(to) && st.stage == 1));
    assert_eq!(sim.o.counters().foreign_objects, 0);

    // A stage-0 miner announces objects under stage 1's prefixes: a real
    // partition range, a range of its own making, and a key it made up.
    // All are refused as not its to write and none is handed to anyone.
    let intruder = stage0[0];
    let plan_part = weights[0].clone();
    let tries = [
        StoredObject { writer: intruder, ..plan_part.clone() },
        StoredObject::part(&format!("{}{}", weights_parts_prefix(1, 1), part_name(0, 4)), &[0; 16], 0, intruder),
        StoredObject::part("epoch-000001/stage-001/momentum/x.f32", &[0; 16], 0, intruder),
    ];
    let before = sim.o.objects.clone();
    for object in tries {
        let r = sim.o.step(sim.now, Event::Stored { peer: intruder, epoch: 1, stage: 1, object }, &mut sim.rng);
        assert!(matches!(r, Err(Refusal::NotYours(_))), "{r:?}");
    }
    assert_eq!(sim.o.counters().foreign_objects, 3);
    assert_eq!(sim.o.objects, before);

    // A reader's report against a handed-out object names its writer; a
    // report about an object nobody announced is refused.
    let reporter = stage1.iter().copied().find(|p| *p != weights[0].writer).unwrap();
    let ev =
        |object: StoredObject| Event::BadObject { peer: reporter, epoch: 0, stage: 1, object, reason: "hash".into() };
    sim.o.step(sim.now, ev(weights[0].clone()), &mut sim.rng).unwrap();
    // Said twice, counted once.
    sim.o.step(sim.now, ev(weights[0].clone()), &mut sim.rng).unwrap();
    let bad = sim.o.bad_objects();
    assert_eq!(bad.len(), 1);
    assert_eq!(
        (bad[0].writer, bad[0].reporter, bad[0].key.as_str()),
        (weights[0].writer, reporter, weights[0].key.as_str())
    );
    let made_up = StoredObject { hash: [9; 32], ..weights[0].clone() };
    assert!(sim.o.step(sim.now, ev(made_up), &mut sim.rng).is_err());
    assert_eq!(sim.o.counters().bad_objects, 1);
}

#[test]
fn parameter_server_uploads_are_weighted_by_counted_work_not_claims() {
    let mut sim = Sim::new(spec(1, 2, 2, 8, 2));
    for i in 0..2 {
        sim.ev(register(i, format!("a{i}")));
    }
    sim.run_until_done(200);
    let ups = iota_wire::manifest::from_pb_list(&sim.aggregated[&0]).unwrap();
    assert_eq!(ups.len(), 2);
    // Each replica claimed work * 1000 + 1; the aggregator is told the
    // orchestrator's count: every micro-batch of a 1-stage run passes
    // through one of the two replicas.
    assert_eq!(ups.iter().map(|u| u.work).sum::<u64>(), 8);
    for u in &ups {
        assert_eq!(u.key, format!("epoch-000001/stage-000/{}.safetensors", u.writer.to_hex()));
    }
    // The merged stage the aggregator announced is what the next epoch (here:
    // the end of the run) is handed.
    let last = sim.phases_heard.iter().rev().find(|(_, p)| p.phase == pb::Phase::Done as i32).unwrap();
    let merged = iota_wire::manifest::from_pb_list(&last.1.weights).unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].key, merged_key(1, 0));

    // An upload announced under another replica's key is refused.
    let mut s2 = Sim::new(spec(1, 2, 1, 4, 2));
    for i in 0..2 {
        s2.ev(register(i, format!("a{i}")));
    }
    s2.skip_uploads = true;
    for _ in 0..50 {
        s2.drain();
        if *s2.o.phase() == Phase::Uploading {
            break;
        }
        s2.tick(500);
    }
    assert_eq!(*s2.o.phase(), Phase::Uploading);
    let key = format!("epoch-000000/stage-000/{}.safetensors", peer(1).to_hex());
    let ev = Event::UploadDone {
        peer: peer(0),
        epoch: 0,
        stage: 0,
        key: key.clone(),
        work: 1,
        object: Some(StoredObject::of(&key, b"x", peer(0))),
        commitments: Vec::new(),
    };
    assert!(matches!(s2.o.step(s2.now, ev, &mut s2.rng), Err(Refusal::NotYours(_))));
    assert_eq!(s2.o.counters().foreign_objects, 1);
}

/// A participant that could not use the merged slice a writer stored (it
/// did not match its announcement) gets it from another holder: the
/// writing moves, the bad records are dropped, the stage completes only
/// once the new writer stored it, and the bad writer may no longer write it.
#[test]
fn a_bad_stored_slice_is_written_again_by_another_holder() {
    let mut sim = Sim::new(butterfly_spec(2, 3));
    for i in 0..6 {
        sim.ev(register(i, format!("a{i}")));
    }
    let stage0: Vec<PeerId> = sim.o.miners().filter(|m| m.stage == 0).map(|m| m.peer).collect();
    sim.until_merging_held(&stage0);
    let epoch = sim.o.merge_plan(0).unwrap().epoch;
    // The replicas act on their plans; their verdicts are held back.
    sim.stall_verdicts_only = true;
    let held = std::mem::take(&mut sim.held);
    sim.inbox.extend(held);
    sim.drain();
    let v0 = |sim: &Sim| {
        sim.held
            .iter()
            .rev()
            .find_map(|o| match &o.cmd {
                pb::command::Kind::Verdict(v) if v.partition == 0 && v.stage == 0 => Some(v.clone()),
                _ => None,
            })
            .unwrap()
    };
    let liar = PeerId(v0(&sim).writer.as_slice().try_into().unwrap());
    let plan = sim.o.merge_plan(0).unwrap().clone();
    // The reader: a participant that owns no copy of partition 0.
    let reader = *stage0.iter().find(|p| !plan.partitions[0].owners.contains(p)).unwrap();
    // Everyone but the reader acts on the verdicts (the writers store).
    sim.stalled = BTreeSet::from([reader]);
    let held = std::mem::take(&mut sim.held);
    sim.inbox.extend(held);
    sim.drain();
    let heard = |sim: &Sim| -> Vec<pb::StoredObject> {
        sim.stored_heard
            .iter()
            .filter(|(t, s)| *t == reader && s.epoch == epoch && s.stage == 0)
            .filter_map(|(_, s)| s.object.clone())
            .collect()
    };
    let p0 = &plan.partitions[0];
    let bad = StoredObject::from_pb(&heard(&sim).into_iter().find(|o| o.offset == p0.offset).unwrap(), None).unwrap();
    assert_eq!(bad.writer, liar);
    let ev = Event::BadObject { peer: reader, epoch, stage: 0, object: bad.clone(), reason: "hash".into() };
    sim.ev(ev);
    let moved = sim.inbox.iter().find_map(|o| match &o.cmd {
        pb::command::Kind::Verdict(v) if v.partition == 0 && o.to == reader => Some(v.clone()),
        _ => None,
    });
    let moved = moved.expect("the new writer is announced to every participant");
    let next = PeerId(moved.writer.as_slice().try_into().unwrap());
    assert!(next != liar && next != reader, "{next} holds the slice");
    assert_eq!(moved.hash, v0(&sim).hash, "the accepted result stays");
    assert_eq!(sim.o.counters().rewritten_slices, 1);
    let key = bad.key.clone();
    assert!(matches!(sim.o.may_write(liar, &key), Err(Refusal::NotYours(_))), "the bad writer is done writing it");
    assert_eq!(sim.o.may_write(next, &key), Ok(()));
    // The new writer stores it; the reader hears of the new object.
    sim.drain();
    let again =
        heard(&sim).into_iter().filter(|o| o.offset == p0.offset).map(|o| StoredObject::from_pb(&o, None).unwrap());
    assert!(again.clone().any(|o| o.writer == next), "{:?}", again.collect::<Vec<_>>());
    let second = sim.o.objects_of(epoch, 0).unwrap().weights.get(&p0.offset).cloned().unwrap();
    assert_eq!(second.writer, next, "partition 0 is recorded as the new writer's");
    // Reporting the same object twice moves nothing more.
    sim.ev(Event::BadObject { peer: reader, epoch, stage: 0, object: bad, reason: "hash".into() });
    assert_eq!(sim.o.counters().rewritten_slices, 1);
    // The new writer's object under the same key, bad too: the same
    // reader's report of it is a new one, not swallowed as a repeat (with
    // three replicas nobody else holds the slice to write it a third time).
    sim.ev(Event::BadObject { peer: reader, epoch, stage: 0, object: second, reason: "hash".into() });
    assert_eq!(sim.o.counters().bad_objects, 2);
    sim.stalled.clear();
    let held = std::mem::take(&mut sim.held);
    sim.inbox.extend(held);
    sim.run_until_done(200);
    assert_eq!(sim.o.counters().divergent_merges, 0);
}
