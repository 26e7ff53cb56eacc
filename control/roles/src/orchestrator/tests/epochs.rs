//! Epochs as the orchestrator runs them: training, uploads and merges to
//! the end of the run, the merge ramp, re-routing, stale reports, phase
//! timeouts and commitment heads.

use super::*;

#[test]
fn epochs_run_through_upload_and_merge_to_done() {
    let mut s = Sim::new(spec(3, 2, 3, 10, 3));
    for i in 0..6 {
        s.ev(register(i, String::new()));
    }
    s.run_until_done(200);
    let h = s.o.history();
    assert_eq!(h.len(), 3);
    for e in h {
        assert_eq!((e.completed, e.dropped), (10, 0));
        assert!((e.mean_loss - 2.0).abs() < 1e-6);
    }
    assert_eq!(s.o.counters().completed, 30);
    assert_eq!(s.o.counters().tokens, 30 * 8);
    assert_eq!(s.o.counters().stale_reports, 0);
}

#[test]
fn the_merge_ramp_runs_short_epochs_first_and_the_same_micro_batches_in_all() {
    let mut sp = spec(3, 2, 3, 10, 3);
    sp.ramp_first_epoch = 2;
    let mut s = Sim::new(sp);
    for i in 0..6 {
        s.ev(register(i, String::new()));
    }
    s.run_until_done(400);
    let done: Vec<(u64, u64)> = s.o.history().iter().map(|e| (e.completed, e.dropped)).collect();
    assert_eq!(done, vec![(2, 0), (4, 0), (8, 0), (10, 0), (6, 0)]);
    assert_eq!(s.o.counters().completed, 30);
    assert_eq!(s.o.counters().tokens, 30 * 8);
}

#[test]
fn micro_batch_addresses_follow_the_trainer() {
    let sp = spec(1, 1, 2, 5, 1);
    // g = epoch * 5 + seq; shard g % 3; first sample (g / 3) * batch.
    assert_eq!(sp.micro_batch(0, 0), MbRef { epoch: 0, shard: 0, first_sample: 0 });
    assert_eq!(sp.micro_batch(0, 4), MbRef { epoch: 0, shard: 1, first_sample: 4 });
    assert_eq!(sp.micro_batch(1, 2), MbRef { epoch: 1, shard: 1, first_sample: 8 });
}

#[test]
fn dead_miner_work_is_rerouted_to_its_replica() {
    let mut s = Sim::new(spec(3, 2, 1, 12, 4));
    for i in 0..6 {
        s.ev(register(i, String::new()));
    }
    // A body miner dies before doing anything.
    let victim = s.o.miners().find(|m| m.stage == 1).unwrap().peer;
    s.dead.insert(victim);
    s.run_until_done(200);
    let c = s.o.counters().clone();
    assert_eq!(c.completed + c.dropped, 12, "every micro-batch accounted for");
    assert_eq!(c.dropped, 0, "its replica took the work");
    assert!(c.rerouted > 0);
    assert!(s.cancels_seen > 0, "old pathways were told to cancel");
    // On probation it held one micro-batch at a time, so the run did not
    // wait for its heartbeat to lapse; it does lapse.
    s.tick(4_000);
    assert!(!s.o.miner(&victim).unwrap().healthy);
    // The merge went on with the survivor of stage 1.
    assert_eq!(s.o.history()[0].completed, 12);
}

#[test]
fn a_stage_with_no_live_miner_drops_after_max_attempts() {
    let mut s = Sim::new(spec(2, 1, 1, 3, 1));
    s.ev(register(0, String::new()));
    s.ev(register(1, String::new()));
    let tail = s.o.miners().find(|m| m.stage == 1).unwrap().peer;
    s.dead.insert(tail);
    for _ in 0..40 {
        s.drain();
        s.tick(500);
    }
    let c = s.o.counters();
    // With no tail at all no pathway exists: what was issued is dropped, nothing completes.
    assert_eq!(c.completed, 0);
    assert!(c.dropped >= 1);
    assert_eq!(*s.o.phase(), Phase::Training, "an epoch cannot finish without a live tail");
}

#[test]
fn stale_and_foreign_reports_are_not_applied() {
    let mut s = Sim::new(spec(2, 1, 1, 2, 1));
    s.ev(register(0, String::new()));
    s.ev(register(1, String::new()));
    let mb = s.o.spec().micro_batch(0, 0);
    let (head, tail) =
        (s.o.miners().find(|m| m.stage == 0).unwrap().peer, s.o.miners().find(|m| m.stage == 1).unwrap().peer);
    s.ev(Event::Loss { peer: head, mb, attempt: 0, loss: 1.0, tokens: 1 }); // not the tail
    s.ev(Event::Loss { peer: tail, mb, attempt: 7, loss: 1.0, tokens: 1 }); // wrong attempt
    s.ev(Event::BackwardDone { peer: tail, mb, attempt: 0 }); // not the head
    assert_eq!(s.o.counters().stale_reports, 3);
    assert_eq!(s.o.counters().completed, 0);
    let stranger = peer(9);
    let r = s.o.step(
        0,
        Event::Heartbeat { peer: stranger, tokens_per_s: 1.0, in_flight: 0, commitments: Vec::new() },
        &mut Rng::new(1),
    );
    assert_eq!(r.unwrap_err(), Refusal::Unknown(stranger));
}

/// The signed header of `sender`'s contribution to partition `k` of
/// `plan`, for a payload hashing to `payload_hash` (senders are `peer(i)`).

#[test]
fn phase_timeouts_follow_measured_durations_not_the_ceiling() {
    let mut sp = butterfly_spec(1, 3);
    sp.phase_timeout_ms = 120_000;
    let mut sim = Sim::new(sp);
    register_all(&mut sim, 3);
    // Epoch 0 merges at once (a measured merge of ~0 ms). In epoch 1 one
    // participant sits on its merge commands: it is planned out after the
    // measured timeout (the floor, 10 s), not after the 120 s ceiling.
    let slow = sim.o.miners().next().unwrap().peer;
    sim.stalled.insert(slow);
    sim.stall_from = 1;
    sim.run_until_done(200);
    assert_eq!(sim.o.history().len(), 2);
    assert!(sim.now < 40_000, "the run took {} ms of simulated time", sim.now);
    assert!(sim.now >= 10_000, "the laggard had the floor's 10 s: {} ms", sim.now);
}

/// Commitment heads are kept per miner for the current and previous epoch;
/// a report that shrinks or forks a chain it reported before is kept as
/// evidence and does not replace the earlier heads.
#[test]
fn commitment_heads_are_kept_and_a_rewritten_history_is_on_record() {
    use iota_core::commitment::{Commitments, Side};
    let mut sim = Sim::new(spec(2, 1, 3, 8, 4));
    register_all(&mut sim, 2);
    let (a, b) = (peer(0), peer(1));
    let mut honest = Commitments::default();
    honest.frame(0, b, 0, Side::Sent, &[1; 32]);
    honest.weights(0, &[2; 32]);
    sim.heads.insert(a, honest.heads());
    sim.tick(100);
    assert_eq!(sim.o.commitments_of(&a, 0), Some(&honest.heads()[0]));
    // Growth replaces the heads.
    honest.frame(0, b, 0, Side::Sent, &[3; 32]);
    sim.heads.insert(a, honest.heads());
    sim.tick(100);
    assert_eq!(sim.o.commitments_of(&a, 0).unwrap().lanes.values().next().unwrap().len, 2);
    assert_eq!(sim.o.counters().commitment_breaks, 0);
    // A different history of the same length: on record, not accepted.
    let mut forked = Commitments::default();
    forked.frame(0, b, 0, Side::Sent, &[1; 32]);
    forked.frame(0, b, 0, Side::Sent, &[9; 32]);
    forked.weights(0, &[2; 32]);
    sim.heads.insert(a, forked.heads());
    sim.tick(100);
    assert_eq!(sim.o.counters().commitment_breaks, 1);
    assert_eq!(sim.o.commitments_of(&a, 0), Some(&honest.heads()[0]), "the earlier heads stay");
    let br = &sim.o.commitment_breaks()[0];
    assert_eq!((br.miner, br.epoch), (a, 0));
    assert_eq!(br.later, forked.heads()[0]);
    // Heads of epochs far from the current one are not kept.
    let mut future = Commitments::default();
    future.frame(7, b, 0, Side::Sent, &[1; 32]);
    sim.heads.insert(b, future.heads());
    sim.heads.insert(a, honest.heads());
    sim.tick(100);
    assert_eq!(sim.o.commitments_of(&b, 7), None);
    assert_eq!(sim.o.counters().commitment_breaks, 1);
    // Heads and breaks survive a save and a load of the state (JSON).
    let json = serde_json::to_string(&sim.o).expect("the state saves");
    let back: Orchestrator = serde_json::from_str(&json).expect("and loads");
    assert_eq!(back.commitments_of(&a, 0), Some(&honest.heads()[0]));
    assert_eq!(back.commitment_breaks(), sim.o.commitment_breaks());
}
