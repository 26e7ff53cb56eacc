//! Validation rounds: the merge waits for the validators, evidence flows
//! only where it was asked for, votes count by stake, and a conviction
//! takes the miner out of the merge (and, repeated, out of the run).

use iota_core::commitment::Commitments;
use iota_wire::store_keys::evidence_key;
use iota_wire::{ValidatorStake, pb};

use super::*;
use crate::validation::quorum::Check;

pub(super) fn validator(i: u8) -> PeerId {
    peer(200 + i)
}

/// Butterfly, 2 stages x 2 replicas, 2 epochs; validators 0 (60) and 1 (40).
pub(super) fn validated_spec() -> RunSpec {
    let mut s = butterfly_spec(2, 2);
    s.micro_batches_per_epoch = 8;
    s.validation.validators =
        vec![ValidatorStake { peer: validator(0), stake: 60 }, ValidatorStake { peer: validator(1), stake: 40 }];
    s.validation.strikes_to_eject = 2;
    s.validation.timeout_ms = 20_000;
    s
}

/// Every miner commits to something for `epoch` (what its UploadDone and
/// heartbeats carry).
pub(super) fn commit_all(s: &mut Sim, epoch: u64) {
    for i in 0..4 {
        let mut c = Commitments::default();
        c.weights(epoch, &[i; 32]);
        s.heads.insert(peer(i), c.heads());
    }
}

pub(super) fn start(spec: RunSpec) -> Sim {
    let mut s = Sim::new(spec);
    for v in [validator(0), validator(1)] {
        s.ev(Event::RegisterValidator { peer: v, device: "cpu".into() });
        s.ev(Event::Subscribed { peer: v });
    }
    for i in 0..4 {
        s.ev(register(i, format!("a{i}")));
    }
    commit_all(&mut s, 0);
    s
}

/// Runs until the validators hold the merge of the current epoch.
pub(super) fn until_held(s: &mut Sim) -> pb::EpochWork {
    for _ in 0..200 {
        s.drain();
        let epoch = s.o.epoch();
        let work = s.validation_heard.iter().find_map(|o| match &o.cmd {
            pb::command::Kind::EpochWork(w) if w.epoch == epoch && o.to == validator(0) => Some(w.clone()),
            _ => None,
        });
        if let Some(w) = work {
            return w;
        }
        s.tick(500);
    }
    panic!("no validation round opened: {:?} {:?}", s.o.phase(), s.o.counters());
}

pub(super) fn vote(s: &mut Sim, v: u8, epoch: u64, miner: PeerId, guilty: bool) -> Result<(), Refusal> {
    let ev = Event::Verdict(VerdictIn {
        validator: validator(v),
        epoch,
        miner,
        check: Check::Recompute,
        guilty,
        samples: 4,
        evidence_hash: Some([9; 32]),
        reason: if guilty { "recomputed output differs".into() } else { String::new() },
        signed: vec![v; 8],
        proof: Vec::new(),
        step_proven: None,
    });
    let out = s.o.step(s.now, ev, &mut s.rng)?;
    s.inbox.extend(out);
    Ok(())
}

pub(super) fn done(s: &mut Sim, v: u8, epoch: u64) {
    let out =
        s.o.step(
            s.now,
            Event::ValidationDone {
                validator: validator(v),
                epoch,
                weights: Vec::new(),
                miners_hash: None,
                signed: Vec::new(),
            },
            &mut s.rng,
        )
        .unwrap();
    s.inbox.extend(out);
}

pub(super) fn completed_by(w: &pb::EpochWork, miner: PeerId) -> Vec<WorkKey> {
    let m = w.miners.iter().find(|m| m.peer == miner.0.to_vec()).expect("the miner's work");
    m.items.iter().map(|i| i.mb.map(|r| (r.shard, r.first_sample, r.attempt)).unwrap()).collect()
}

#[test]
fn the_merge_waits_for_the_validators_and_a_conviction_by_stake_excludes_the_miner() {
    let mut s = start(validated_spec());
    let w = until_held(&mut s);
    assert_eq!(*s.o.phase(), Phase::Uploading);
    assert_eq!(w.miners.len(), 4, "every miner that worked and committed");
    assert_eq!(w.beacon.len(), 32);
    assert!(w.starts.iter().all(|st| st.weights_hash.is_empty()), "epoch 0 starts from the seed");
    let total: usize = w.miners.iter().map(|m| m.items.len()).sum();
    assert_eq!(total, 2 * 8, "each completed micro-batch once per stage");
    // Held while the validators work.
    for _ in 0..6 {
        s.tick(500);
        s.drain();
    }
    assert_eq!(*s.o.phase(), Phase::Uploading);

    // Validator 0 asks miner 0 for evidence of two of its attempts: the
    // miner is asked, and may write exactly those keys.
    let (m0, m1) = (peer(0), peer(1));
    let stage_of = |s: &Sim, p: PeerId| s.o.miner(&p).unwrap().stage;
    let drawn: Vec<WorkKey> = completed_by(&w, m0).into_iter().take(2).collect();
    let ask = Event::EvidenceAsk {
        validator: validator(0),
        epoch: 0,
        miner: m0,
        items: drawn.clone(),
        inner_step: None,
        trace: None,
    };
    s.inbox.extend(s.o.step(s.now, ask, &mut s.rng).unwrap());
    s.drain();
    let asked: Vec<&pb::EvidenceRequest> = s
        .validation_heard
        .iter()
        .filter_map(|o| match &o.cmd {
            pb::command::Kind::EvidenceRequest(r) if o.to == m0 => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].items.len(), 2);
    let (k0, k1) = (drawn[0], drawn[1]);
    let key = evidence_key(0, &m0, k0.0, k0.1, k0.2);
    assert!(s.o.may_write(m0, &key).is_ok());
    assert!(s.o.may_write(m1, &evidence_key(0, &m1, k0.0, k0.1, k0.2)).is_err(), "not asked of miner 1");
    assert!(s.o.may_read(validator(0), &key).is_err(), "not announced yet");
    // An attempt the miner did not complete cannot be asked for.
    let bogus = Event::EvidenceAsk {
        validator: validator(0),
        epoch: 0,
        miner: m0,
        items: vec![(99, 999_999, 0)],
        inner_step: None,
        trace: None,
    };
    assert!(matches!(s.o.step(s.now, bogus, &mut s.rng), Err(Refusal::Invalid(_))));
    // Evidence nobody asked for is not the miner's to announce.
    let unasked = StoredObject::of(&evidence_key(0, &m0, 99, 0, 0), b"x", m0);
    let st = Event::Stored { peer: m0, epoch: 0, stage: stage_of(&s, m0), object: unasked };
    assert!(matches!(s.o.step(s.now, st, &mut s.rng), Err(Refusal::NotYours(_))));
    // The miner announces one: it goes to the validator that asked.
    let obj = StoredObject::of(&key, b"bundle", m0);
    let st = Event::Stored { peer: m0, epoch: 0, stage: stage_of(&s, m0), object: obj };
    s.inbox.extend(s.o.step(s.now, st, &mut s.rng).unwrap());
    s.drain();
    let handed: Vec<_> = s.stored_heard.iter().filter(|(to, _)| *to == validator(0)).collect();
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].1.object.as_ref().unwrap().writer, m0.0.to_vec(), "the writer is named");
    assert!(s.o.may_read(validator(0), &key).is_ok());
    // Validator 1 asks for the same attempt later: handed at once, the
    // miner not asked again.
    let ask = Event::EvidenceAsk {
        validator: validator(1),
        epoch: 0,
        miner: m0,
        items: vec![k0, k1],
        inner_step: None,
        trace: None,
    };
    s.inbox.extend(s.o.step(s.now, ask, &mut s.rng).unwrap());
    s.drain();
    assert_eq!(s.stored_heard.iter().filter(|(to, _)| *to == validator(1)).count(), 1);
    assert_eq!(s.validation_heard.iter().filter(|o| matches!(o.cmd, pb::command::Kind::EvidenceRequest(_))).count(), 1);
    // Validator 0 asks again (its re-ask half-way to its timeout): the
    // stored attempt is announced to it again, the other is asked of the
    // miner again (the request or the upload may have been lost).
    let ask = Event::EvidenceAsk {
        validator: validator(0),
        epoch: 0,
        miner: m0,
        items: vec![k0, k1],
        inner_step: None,
        trace: None,
    };
    s.inbox.extend(s.o.step(s.now, ask, &mut s.rng).unwrap());
    s.drain();
    assert_eq!(s.stored_heard.iter().filter(|(to, _)| *to == validator(0)).count(), 2);
    let requests: Vec<&pb::EvidenceRequest> = s
        .validation_heard
        .iter()
        .filter_map(|o| match &o.cmd {
            pb::command::Kind::EvidenceRequest(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].items,
        vec![pb::WorkRef { shard: k1.0, first_sample: k1.1, attempt: k1.2, inner_step: false, trace_step: 0 }]
    );

    // 40% of the stake alone decides nothing; 60% more convicts.
    vote(&mut s, 1, 0, m1, true).unwrap();
    assert_eq!(s.o.counters().convictions, 0);
    assert!(!s.o.miner(&m1).unwrap().convicted);
    assert!(matches!(vote(&mut s, 1, 0, m1, false), Err(Refusal::Invalid(_))), "a validator cannot vote both ways");
    vote(&mut s, 0, 0, m1, true).unwrap();
    assert_eq!(s.o.counters().convictions, 1);
    let m = s.o.miner(&m1).unwrap();
    assert!(m.convicted && m.work == 0, "out of the merge, and paid nothing");
    vote(&mut s, 0, 0, m0, false).unwrap();
    vote(&mut s, 1, 0, m0, false).unwrap();
    assert!(!s.o.miner(&m0).unwrap().convicted);
    // Strangers and unknown miners are refused.
    let stranger = Event::ValidationDone {
        validator: peer(77),
        epoch: 0,
        weights: Vec::new(),
        miners_hash: None,
        signed: Vec::new(),
    };
    assert!(s.o.step(s.now, stranger, &mut s.rng).is_err());
    assert!(matches!(vote(&mut s, 0, 5, m0, true), Err(Refusal::Invalid(_))), "a future epoch");

    // Both done: the merge goes on without the convicted miner.
    done(&mut s, 0, 0);
    s.drain();
    assert_eq!(*s.o.phase(), Phase::Uploading, "validator 1 is not done yet");
    done(&mut s, 1, 0);
    s.tick(100);
    assert_eq!(*s.o.phase(), Phase::Merging);
    let plan = s.o.merge_plan(stage_of(&s, m1)).unwrap();
    assert!(!plan.is_participant(&m1), "the convicted miner is out of the merge");
    assert_eq!(plan.participants.len(), 1);
    assert_eq!(s.o.verdicts().len(), 4);
    assert_eq!(s.o.verdicts()[0].signed, vec![1; 8], "the signed request is kept");

    // The state saves and loads (structured keys as pairs).
    let json = serde_json::to_string(&s.o).unwrap();
    let restored: Orchestrator = serde_json::from_str(&json).unwrap();
    assert_eq!(restored.verdicts(), s.o.verdicts());
    assert_eq!(restored.quorum().unwrap().strikes(&m1), 1);

    // Epoch 1: the conviction does not carry over; a second one ejects.
    commit_all(&mut s, 1);
    let w1 = until_held(&mut s);
    assert_eq!(w1.epoch, 1);
    assert!(w1.starts.iter().all(|st| st.weights_hash == vec![7; 32]), "the merged weights' hash");
    assert!(!s.o.miner(&m1).unwrap().convicted);
    // Suspended through epoch 1: it carried nothing, so it is not in the work.
    assert!(w1.miners.iter().all(|m| m.peer != m1.0.to_vec()), "a suspended miner is not routed");
    assert_eq!(w1.miners.len(), 3);
    vote(&mut s, 0, 1, m1, true).unwrap();
    vote(&mut s, 1, 1, m1, true).unwrap();
    assert_eq!(s.o.counters().ejected, 1);
    assert!(s.o.miner(&m1).unwrap().ejected);
    let again = Event::Register {
        peer: m1,
        addr: "a1".into(),
        tokens_per_s: 1.0,
        device: "cpu".into(),
        memory: Default::default(),
    };
    let e = s.o.step(s.now, again, &mut s.rng).unwrap_err();
    assert!(e.to_string().contains("ejected"), "{e}");
    done(&mut s, 0, 1);
    done(&mut s, 1, 1);
    s.run_until_done(200);
    assert_eq!(s.o.history()[0].convicted, vec![m1]);
    assert_eq!(s.o.history()[1].convicted, vec![m1]);
    // Each epoch's account: the convict's work is on record but credits
    // nothing, and it was out of the merge; the others' is credited.
    let account = &s.o.history()[0].miners;
    let convict = account.iter().find(|m| m.peer == m1).unwrap();
    assert!(convict.convicted && convict.completed > 0 && convict.credited == 0 && !convict.merged, "{convict:?}");
    for m in account.iter().filter(|m| m.peer != m1) {
        assert!(!m.convicted && m.credited == m.completed && m.merged, "{m:?}");
    }
    for stage in 0..2 {
        let done: u64 = account.iter().filter(|m| m.stage == stage).map(|m| m.completed).sum();
        assert_eq!(done, s.o.history()[0].completed, "stage {stage}: each micro-batch once per stage");
    }
}

#[test]
fn a_stage_whose_replicas_are_all_suspended_does_not_stall_the_run() {
    let mut spec = validated_spec();
    spec.epochs = 2;
    let mut s = start(spec);
    until_held(&mut s);
    // Both replicas of miner 1's stage are convicted in epoch 0.
    let stage = s.o.miner(&peer(1)).unwrap().stage;
    let both: Vec<PeerId> = s.o.miners().filter(|m| m.stage == stage).map(|m| m.peer).collect();
    assert_eq!(both.len(), 2);
    for m in &both {
        vote(&mut s, 0, 0, *m, true).unwrap();
    }
    assert_eq!(s.o.counters().convictions, 2);
    done(&mut s, 0, 0);
    done(&mut s, 1, 0);
    commit_all(&mut s, 1);
    // Epoch 1 still completes its micro-batches, through the suspended pair.
    for _ in 0..200 {
        s.drain();
        if s.o.epoch() == 1 && *s.o.phase() == Phase::Uploading {
            break;
        }
        s.tick(500);
    }
    assert_eq!(*s.o.phase(), Phase::Uploading, "epoch 1 trained: {:?}", s.o.counters());
    assert_eq!(s.o.counters().dropped, 0);
}

/// A validator repeating its vote fills no record: only its first vote on
/// an accusation is kept; a verdict whose signed request is larger than an
/// honest one can be is refused.
#[test]
fn repeated_or_oversized_verdicts_are_not_kept() {
    let mut s = start(validated_spec());
    until_held(&mut s);
    let m = peer(0);
    for _ in 0..50 {
        vote(&mut s, 1, 0, m, true).unwrap();
    }
    assert_eq!(s.o.verdicts().len(), 1, "one record of 50 identical votes");
    vote(&mut s, 1, 0, peer(1), true).unwrap();
    assert_eq!(s.o.verdicts().len(), 2, "another accusation is another record");
    let big = Event::Verdict(VerdictIn {
        validator: validator(0),
        epoch: 0,
        miner: m,
        check: Check::Recompute,
        guilty: true,
        samples: 4,
        evidence_hash: None,
        reason: String::new(),
        signed: vec![0; MAX_SIGNED_VERDICT + 1],
        proof: Vec::new(),
        step_proven: None,
    });
    assert!(matches!(s.o.step(s.now, big, &mut s.rng), Err(Refusal::Invalid(ref r)) if r.contains("signed")));
    assert_eq!((s.o.verdicts().len(), s.o.counters().convictions), (2, 0), "refused whole: no vote counted");
}

/// A validator that said done and then opened its command stream again
/// (a blip; its round is over) does not hold the merge back.
#[test]
fn a_validator_resubscribing_after_done_does_not_hold_the_merge() {
    let mut s = start(validated_spec());
    until_held(&mut s);
    done(&mut s, 0, 0);
    s.ev(Event::Subscribed { peer: validator(0) });
    done(&mut s, 1, 0);
    s.tick(100);
    assert_eq!(*s.o.phase(), Phase::Merging, "{:?}", s.o.counters());
    assert_eq!(s.o.counters().validation_timeouts, 0);
}

/// An orchestrator restored after a downtime longer than the validators'
/// heartbeat timeout and the validation timeout still waits for the round
/// it was holding the merge for: the downtime is nobody's silence.
#[test]
fn a_restart_during_a_validation_round_still_waits_for_the_validators() {
    let mut s = start(validated_spec());
    until_held(&mut s);
    let saved = serde_json::to_string(&s.o).unwrap();
    s.o = serde_json::from_str(&saved).unwrap();
    s.now += 60_000;
    s.o.resumed(s.now);
    s.tick(100);
    assert_eq!(*s.o.phase(), Phase::Uploading, "the round still holds the merge: {:?}", s.o.counters());
    assert_eq!(s.o.counters().validation_timeouts, 0);
    assert_eq!(s.o.counters().unvalidated_epochs, 0);
    done(&mut s, 0, 0);
    done(&mut s, 1, 0);
    s.tick(100);
    assert_eq!(*s.o.phase(), Phase::Merging);
}

/// The Training command each miner heard for `epoch`: (weights_from, objects).
fn training_weights(s: &Sim, epoch: u64) -> Vec<(u64, usize)> {
    s.phases_heard
        .iter()
        .filter(|(_, p)| p.epoch == epoch && p.phase == pb::Phase::Training as i32)
        .map(|(_, p)| (p.weights_from, p.weights.len()))
        .collect()
}

/// Each stage's `weights_from` in the EpochWork validator 0 heard for `epoch`.
fn work_from(s: &Sim, epoch: u64) -> Vec<u64> {
    let w = s.validation_heard.iter().find_map(|o| match &o.cmd {
        pb::command::Kind::EpochWork(w) if w.epoch == epoch && o.to == validator(0) => Some(w),
        _ => None,
    });
    w.map(|w| w.starts.iter().map(|st| st.weights_from).collect()).unwrap_or_default()
}

/// One of two replicas of stage 0 reports a false merged-weights hash: a
/// tie with its honest replica. The start recorded for the next epoch is
/// the hash the validators loaded from the store, not the liar's; a
/// minority validator's hashes decide nothing.
#[test]
fn a_false_merge_report_does_not_become_the_recorded_start() {
    for hashes in [true, false] {
        let mut s = start(validated_spec());
        if !hashes {
            s.vote_hashes.insert(validator(0), None);
            s.vote_hashes.insert(validator(1), None);
        }
        let liar = s.o.miners().find(|m| m.stage == 0).unwrap().peer;
        s.merge_liars.insert(liar);
        until_held(&mut s);
        done(&mut s, 0, 0);
        done(&mut s, 1, 0);
        commit_all(&mut s, 1);
        let w1 = until_held(&mut s);
        let start0 = w1.starts.iter().find(|st| st.stage == 0).unwrap();
        assert_eq!(start0.weights_from, 1, "epoch 0's merge");
        // Without the validators' hashes the tie goes to the greater hash,
        // the liar's: the record the validators' hashes now correct.
        let want = if hashes { vec![7; 32] } else { vec![0xff; 32] };
        assert_eq!(start0.weights_hash, want, "validators sent hashes: {hashes}");
        let start1 = w1.starts.iter().find(|st| st.stage == 1).unwrap();
        assert_eq!(start1.weights_hash, vec![7; 32], "stage 1's replicas agree");
    }
    // Validator 1 (40% of the stake) names a hash nobody else loaded;
    // validator 0 (60%) sends none: the participants' reports decide.
    let mut s = start(validated_spec());
    s.vote_hashes.insert(validator(0), None);
    s.vote_hashes.insert(validator(1), Some([0xee; 32]));
    until_held(&mut s);
    done(&mut s, 0, 0);
    done(&mut s, 1, 0);
    commit_all(&mut s, 1);
    let w1 = until_held(&mut s);
    assert!(w1.starts.iter().all(|st| st.weights_hash == vec![7; 32]), "{:?}", w1.starts);
}

/// Merge votes naming a stage the run does not have are refused whole.
#[test]
fn a_merge_vote_naming_a_stage_past_the_run_is_refused() {
    let mut s = start(validated_spec());
    // Validator 1 goes quiet; its votes below are made up by the test.
    s.quiet_validators.insert(validator(1));
    until_held(&mut s);
    done(&mut s, 0, 0);
    s.drain();
    s.tick(100);
    let vote = |stage: u32| Event::MergeVote {
        validator: validator(1),
        epoch: 0,
        rollback: false,
        loss: 2.0,
        reason: String::new(),
        merged: vec![(0, [7; 32]), (stage, [7; 32])],
    };
    let r = s.o.step(s.now, vote(2), &mut s.rng);
    assert!(matches!(r, Err(Refusal::Invalid(ref m)) if m.contains("names stage 2")), "{r:?}");
    // Within the run's stages the vote passes that rule (and is refused
    // here only because no check was sent to the quiet validator).
    let r = s.o.step(s.now, vote(1), &mut s.rng);
    assert!(matches!(r, Err(Refusal::Invalid(ref m)) if m.contains("no check")), "{r:?}");
}

/// Three epochs; both validators vote epoch 0's merge down, validator 1
/// alone (40%) epoch 1's.
fn epoch_0_rolled_back(mut spec: RunSpec) -> Sim {
    spec.epochs = 3;
    let mut s = start(spec);
    // Epoch 0's merge: both validators (100% of the stake) vote it down.
    s.rollback_votes.extend([(0, validator(0)), (0, validator(1))]);
    // Epoch 1's: only validator 1 (40%): it stands.
    s.rollback_votes.insert((1, validator(1)));
    for e in 0..3 {
        until_held(&mut s);
        done(&mut s, 0, e);
        done(&mut s, 1, e);
        if e < 2 {
            commit_all(&mut s, e + 1);
        }
    }
    s.run_until_done(200);
    s
}

#[test]
fn a_merge_the_stake_votes_down_is_rolled_back_and_a_minority_cannot_force_it() {
    let s = epoch_0_rolled_back(validated_spec());
    let h = s.o.history();
    assert_eq!(h.iter().map(|e| e.rolled_back).collect::<Vec<_>>(), vec![true, false, false]);
    assert_eq!(s.o.counters().rollbacks, 1);
    // The held-out loss kept per epoch is the median of the votes in at the
    // verdict (the sim's validators measure 99 when they vote a merge down,
    // 2 when not; validator 0's 60% decides each epoch as it votes).
    let held_out: Vec<Option<f32>> = h.iter().map(|e| e.held_out_loss).collect();
    assert_eq!(held_out, vec![Some(99.0), Some(2.0), Some(2.0)]);
    // Epoch 1 started again from the run seed's weights (not epoch 0's
    // merge); epoch 2 from epoch 1's merge, as usual.
    let e1 = training_weights(&s, 1);
    assert!(!e1.is_empty() && e1.iter().all(|&(from, objects)| from == 0 && objects == 0), "{e1:?}");
    let e2 = training_weights(&s, 2);
    assert!(!e2.is_empty() && e2.iter().all(|&(from, objects)| from == 2 && objects > 0), "{e2:?}");
    // The merge audits hold epochs 0 and 1 against the seed's weights
    // (epoch 1 started from them again), epoch 2 against a recorded start.
    // Dense: the epoch before is never read.
    let seeds: Vec<(u64, bool, bool)> = s.context_seeds.iter().copied().collect();
    assert_eq!(seeds, vec![(0, true, false), (1, true, false), (2, false, false)]);
    // The validators hear the same, so none takes a merge it kept for a
    // start the stake rolled back.
    assert_eq!(work_from(&s, 1), vec![0, 0]);
    assert_eq!(work_from(&s, 2), vec![2, 2]);
    // The minority's vote is on record as outvoted.
    assert!(s.o.quorum().is_some());
    let checks = s.validation_heard.iter().filter(|o| matches!(o.cmd, pb::command::Kind::MergeCheck(_))).count();
    assert_eq!(checks, 2 * 3, "every merge went to both validators");
}

/// Sparse contributions are held against the epoch before's start too:
/// after epoch 0's merge is rolled back, epoch 1 started from the seed
/// again, so epoch 2's audits hold the epoch before against the seed (a
/// start nobody recorded would otherwise judge nobody).
#[test]
fn after_a_rollback_sparse_audits_hold_the_epoch_before_against_the_seed() {
    let mut spec = validated_spec();
    spec.merge.sparse_density = 0.05;
    let s = epoch_0_rolled_back(spec);
    assert_eq!(s.o.history().iter().map(|e| e.rolled_back).collect::<Vec<_>>(), vec![true, false, false]);
    let seeds: Vec<(u64, bool, bool)> = s.context_seeds.iter().copied().collect();
    assert_eq!(seeds, vec![(0, true, false), (1, true, true), (2, false, true)]);
}

/// A validator's weights come with its ValidationDone, one per miner of the
/// epoch's work: a vector that does not fit (wrong length, NaN, negative,
/// all zero, sent twice, from a stranger) is refused whole, and nothing of
/// it is recorded; the validator is not counted done either.
#[test]
fn weight_vectors_that_do_not_fit_the_epoch_are_refused_whole() {
    let mut s = start(validated_spec());
    let w = until_held(&mut s);
    let n = w.miners.len();
    assert_eq!(n, 4);
    let work_miners: Vec<PeerId> = w.miners.iter().map(|m| PeerId(m.peer.as_slice().try_into().unwrap())).collect();
    let miners_hash = Some(crate::validation::sample::work_miners_hash(0, &work_miners));
    let send = |s: &mut Sim, v: PeerId, weights: Vec<f32>| {
        let ev = Event::ValidationDone { validator: v, epoch: 0, weights, miners_hash, signed: vec![1, 2, 3] };
        s.o.step(s.now, ev, &mut s.rng)
    };
    let bad: Vec<(Vec<f32>, &str)> = vec![
        (vec![0.25; n - 1], "3 weights for the 4 miners"),
        (vec![0.25, f32::NAN, 0.25, 0.25], "weight 1 is NaN"),
        (vec![0.5, -0.1, 0.3, 0.3], "weight 1 is -0.1"),
        (vec![0.0; n], "all weights are zero"),
    ];
    for (weights, why) in bad {
        let e = send(&mut s, validator(0), weights).unwrap_err();
        assert!(matches!(&e, Refusal::Invalid(m) if m.contains(why)), "{e} (wanted {why})");
    }
    assert!(matches!(send(&mut s, peer(77), vec![0.25; n]), Err(Refusal::Unknown(_))), "a stranger");
    // Weights that do not name the work's miners (no hash, or another
    // order's) are refused: the ledger could not show whose they are.
    let mut reordered = work_miners.clone();
    reordered.swap(0, 1);
    for hash in [None, Some(crate::validation::sample::work_miners_hash(0, &reordered))] {
        let ev = Event::ValidationDone {
            validator: validator(0),
            epoch: 0,
            weights: vec![0.25; n],
            miners_hash: hash,
            signed: vec![1, 2, 3],
        };
        let e = s.o.step(s.now, ev, &mut s.rng).unwrap_err();
        assert!(e.to_string().contains("miners_hash"), "{e}");
    }
    let r = s.o.validation.round.as_ref().unwrap();
    assert!(r.weights.is_empty() && r.done.is_empty(), "nothing was recorded");
    send(&mut s, validator(0), vec![0.1, 0.2, 0.3, 0.4]).unwrap();
    let e = send(&mut s, validator(0), vec![0.25; n]).unwrap_err();
    assert!(e.to_string().contains("already submitted"), "{e}");
    let r = s.o.validation.round.as_ref().unwrap();
    assert_eq!(r.weights[&validator(0)], vec![0.1, 0.2, 0.3, 0.4], "the first vector stands");
    assert!(r.done.contains(&validator(0)));
}
