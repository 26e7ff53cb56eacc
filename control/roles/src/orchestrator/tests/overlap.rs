//! The merge behind compute (`merge.overlap`): an epoch's butterfly merge
//! runs while the next epoch trains, and that epoch cannot end before it.

use iota_wire::store_keys::contrib_prefix;

use super::*;

fn overlap_spec(epochs: u64) -> RunSpec {
    let mut s = butterfly_spec(2, 3);
    s.epochs = epochs;
    s.merge.overlap = true;
    s
}

/// The phase commands `p` heard of `phase` in `epoch`.
fn heard(sim: &Sim, p: PeerId, phase: pb::Phase, epoch: u64) -> Vec<pb::PhaseChange> {
    sim.phases_heard
        .iter()
        .filter(|(to, c)| *to == p && c.phase == phase as i32 && c.epoch == epoch)
        .map(|(_, c)| c.clone())
        .collect()
}

/// A 3-epoch overlapped run 1.2 s in, where peer(0) acts on its merge plan
/// but sits on its verdicts: merge 0 cannot complete while it does.
fn merge_zero_held_open() -> Sim {
    let mut sim = Sim::new(overlap_spec(3));
    register_all(&mut sim, 6);
    sim.stalled.insert(peer(0));
    sim.stall_verdicts_only = true;
    for _ in 0..12 {
        sim.drain();
        sim.tick(100);
    }
    sim
}

#[test]
fn a_merge_runs_behind_the_next_epochs_training_which_waits_for_it_to_end() {
    let mut sim = merge_zero_held_open();
    // Epoch 1 trained to its end while merge 0 is still open.
    assert_eq!(sim.o.epoch(), 1);
    assert_eq!(sim.o.phase(), &Phase::Training, "training's end waits for the merge behind it");
    assert_eq!(sim.o.history().len(), 1, "epoch 0 is summarised when its merge starts");
    let done = sim.o.micro_batches().filter(|(_, s)| matches!(s, MbStatus::Done { .. })).count() as u64;
    assert_eq!(done, sim.o.spec().micro_batches_per_epoch, "every micro-batch of epoch 1 went through");
    assert_eq!(sim.o.merge_plan(0).map(|p| p.epoch), Some(0), "merge 0 is still the one in progress");
    // Its participants got merge 0's plan with epoch 1's Training phase,
    // which starts from no merged weights yet (the seed's).
    let training = heard(&sim, peer(3), pb::Phase::Training, 1);
    let plan = training.iter().find_map(|c| c.merge_plan.as_ref()).expect("the plan came with Training");
    assert_eq!(plan_from_pb(plan).unwrap().epoch, 0);
    assert_eq!(training[0].weights_from, 0);
    assert!(heard(&sim, peer(3), pb::Phase::Merging, 0).is_empty(), "no Merging phase for an overlapped merge");
    // Through a presigned store (S3), merge 0's keys are granted while epoch
    // 1 trains: they are merge 0's, not the current epoch's.
    let p3 = peer(3);
    let stage = sim.o.miner(&p3).unwrap().stage;
    let contrib = format!("{}000000/{}.frame", contrib_prefix(0, stage), p3.to_hex());
    assert!(sim.o.may_write(p3, &contrib).is_ok(), "its contribution to merge 0");
    assert!(sim.o.may_list(p3, &contrib_prefix(0, stage)).is_ok(), "merge 0's contributions");
    let now_epoch = format!("{}000000/{}.frame", contrib_prefix(1, stage), p3.to_hex());
    assert!(sim.o.may_write(p3, &now_epoch).is_err(), "epoch 1 has no merge yet");

    // Released, merge 0 completes and epoch 1 ends: each replica lands
    // merge 0 as it uploads.
    let held = std::mem::take(&mut sim.held);
    sim.inbox.extend(held);
    sim.stalled.clear();
    sim.drain();
    sim.tick(100);
    sim.drain();
    let uploading = heard(&sim, peer(3), pb::Phase::Uploading, 1);
    assert_eq!(uploading.first().map(|c| c.weights_from), Some(1), "land merge 0's weights");
    assert!(!uploading[0].weights.is_empty(), "with their objects");
    // Epoch 0's own Uploading phase had nothing to land.
    assert_eq!(heard(&sim, peer(3), pb::Phase::Uploading, 0)[0].weights_from, 0);

    sim.run_until_done(400);
    let c = sim.o.counters();
    assert_eq!(sim.o.history().len(), 3);
    // Epochs 0 and 1 merged behind compute; the last one synchronously.
    assert_eq!(c.merges_behind_compute, 2);
    assert_eq!(heard(&sim, peer(3), pb::Phase::Merging, 2).len(), 1);
    assert_eq!(c.divergent_merges, 0);
    assert_eq!(c.hash_mismatches, 0);
    assert!(c.merging_ms > 0, "the wait for merge 0 is the merge's visible time");
    // The run ends on the last merge's weights.
    let done = heard(&sim, peer(3), pb::Phase::Done, 3);
    assert_eq!(done[0].weights_from, 3);
}

#[test]
fn a_merge_behind_compute_that_never_waits_costs_no_visible_time() {
    let mut sim = Sim::new(overlap_spec(3));
    register_all(&mut sim, 6);
    sim.run_until_done(400);
    let c = sim.o.counters();
    assert_eq!(c.merges_behind_compute, 2);
    assert_eq!(sim.o.history().len(), 3);
    // The simulated miners merge at once: only the last, synchronous
    // merge is visible, and it took no simulated time either.
    assert_eq!(c.merging_ms, 0, "{c:?}");
    // Every Training phase after the first carried the previous merge.
    for e in 1..3 {
        let t = heard(&sim, peer(1), pb::Phase::Training, e);
        let plan = t.iter().find_map(|c| c.merge_plan.as_ref()).map(|p| plan_from_pb(p).unwrap().epoch);
        assert_eq!(plan, Some(e - 1), "epoch {e}");
    }
}

#[test]
fn a_merge_behind_compute_needs_the_butterfly_and_no_validators() {
    let mut s = overlap_spec(3);
    assert_eq!(s.validate(), Ok(()));
    s.merge.method = MergeMethod::ParameterServer;
    assert!(s.validate().unwrap_err().contains("butterfly"));
    let mut s = overlap_spec(3);
    s.validation.validators = vec![iota_wire::ValidatorStake { peer: peer(9), stake: 1 }];
    assert!(s.validate().unwrap_err().contains("validators"));
}

#[test]
fn an_orchestrator_restarted_while_a_merge_runs_behind_training_resumes_it() {
    let sim = merge_zero_held_open();
    assert_eq!((sim.o.epoch(), sim.o.phase()), (1, &Phase::Training));
    // "Crash": only the saved state survives; the verdicts peer(0) sat on
    // died with the old process.
    let json = serde_json::to_string(&sim.o).unwrap();
    let restored: Orchestrator = serde_json::from_str(&json).unwrap();
    assert_eq!(restored.merge_plan(0).map(|p| p.epoch), Some(0), "merge 0 is still behind training");
    assert_eq!(restored.weights_epoch(), None, "and the run's weights are still the seed's");
    let mut t = Sim::new(overlap_spec(3));
    t.o = restored;
    t.now = sim.now;
    // Merge 0 completes (peer(0), never done, is planned out at the
    // merge's timeout) and the run goes on to its end.
    t.run_until_done(400);
    assert_eq!(t.o.history().len(), 3);
    assert_eq!(t.o.counters().merges_behind_compute, 2);
    assert_eq!(t.o.counters().divergent_merges, 0);
}
