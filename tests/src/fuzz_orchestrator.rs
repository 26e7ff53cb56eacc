//! The `orchestrator_events` fuzz target's body: the orchestrator's state
//! machine fed an arbitrary sequence of events, its invariants checked.

use iota_control::orchestrator::{Event, Orchestrator, Phase, VerdictIn};
use iota_control::validation::quorum::Check;
use iota_core::commitment::Commitments;
use iota_core::{PeerId, Rng, WireCodec};
use iota_protocol::{MbRef, MergeMethod, MergeSpec, RunSpec, StoredObject, ValidationSpec, ValidatorStake, pb};

use crate::fuzz_input::Bytes;

/// The orchestrator's state machine fed an arbitrary sequence of events
/// from 6 identities (registrations, heartbeats, reports about the routes
/// and plans it issued or about made-up ones, announcements, ticks).
/// With bit 1 of the first byte set, the run has two validators (stakes
/// 60 and 40) and ops from 0xC0 up are theirs: registration and
/// subscription, evidence asks about issued routes, verdicts, ValidationDone
/// with weights, merge votes with stage hashes, merge audits.
/// Invariants: no panic; no micro-batch counted twice (an epoch never
/// completes or drops more than it has); every route names registered
/// miners, one per stage; (epoch, phase) only moves forward; a miner
/// convicted in an epoch is not a participant of that epoch's merge plan
/// issued after the conviction; verdict records stay within their bound.
pub fn orchestrator_events(data: &[u8]) {
    orchestrator_run(data);
}

/// How far an [`orchestrator_run`] got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    pub epoch: u64,
    /// 0 Waiting .. 4 Done.
    pub phase: u8,
    /// Validators' verdicts the orchestrator recorded.
    pub verdicts: usize,
    /// Miners convicted (counter) and merge votes that rolled a merge back.
    pub convictions: u64,
    pub rollbacks: u64,
}

/// [`orchestrator_events`], returning how far the run got, so a test can
/// see that its seeds go deep.
pub fn orchestrator_run(data: &[u8]) -> Reached {
    let mut b = Bytes(data);
    let first = b.u8();
    let butterfly = first & 1 == 1;
    let validated = first & 2 == 2;
    let validators: Vec<PeerId> = (0..2u8).map(|i| PeerId([0xa0 + i; 32])).collect();
    let spec = RunSpec {
        run_id: 1,
        stages: 2,
        replicas: 2,
        epochs: 2,
        micro_batches_per_epoch: 4,
        batch: 2,
        n_shards: 2,
        max_in_flight: 2,
        route_timeout_ms: 1_000,
        heartbeat_timeout_ms: 3_000,
        max_attempts: 2,
        phase_timeout_ms: 5_000,
        merge: MergeSpec {
            method: if butterfly { MergeMethod::Butterfly } else { MergeMethod::ParameterServer },
            codec: WireCodec::F32,
            stage_params: vec![1_000, 1_000],
            ..MergeSpec::default()
        },
        miners_per_stage_cap: 3,
        registration_timeout_ms: 10_000,
        validation: if validated {
            ValidationSpec {
                validators: vec![
                    ValidatorStake { peer: validators[0], stake: 60 },
                    ValidatorStake { peer: validators[1], stake: 40 },
                ],
                timeout_ms: 4_000,
                ..Default::default()
            }
        } else {
            ValidationSpec::default()
        },
        ..RunSpec::default()
    };
    let mut o = Orchestrator::new(spec).unwrap();
    let mut rng = Rng::new(9);
    let peers: Vec<PeerId> = (0..6u8).map(|i| PeerId([i + 1; 32])).collect();
    let (mut now, mut routes) = (0u64, Vec::<pb::Route>::new());
    let order = |p: &Phase| match p {
        Phase::Waiting => 0,
        Phase::Training => 1,
        Phase::Uploading => 2,
        Phase::Merging => 3,
        Phase::Done => 4,
    };
    let mut work: (u64, Vec<PeerId>) = (0, Vec::new());
    let mut last = (0u64, 0u8);
    let mut steps = 0;
    while !b.is_empty() && steps < 400 {
        steps += 1;
        let op = b.u8();
        let peer = peers[b.u8() as usize % peers.len()];
        let ev = if validated && op >= 0xc0 {
            validator_event(&mut b, &o, validators[usize::from(op & 1)], peer, &routes, &work)
        } else {
            match op % 13 {
                0 | 1 => Event::Register {
                    peer,
                    addr: "198.18.0.1:4000".into(),
                    tokens_per_s: 1.0,
                    device: "cpu".into(),
                    memory: Default::default(),
                },
                2 => Event::Subscribed { peer },
                // With validators, a heartbeat may carry the miner's heads
                // for the epoch (what the validators' work needs).
                3 => {
                    let heads = if validated { b.u8() } else { 0 };
                    let commitments = if heads & 1 == 1 {
                        let mut c = Commitments::default();
                        c.weights(o.epoch(), &[heads; 32]);
                        c.heads()
                    } else {
                        Vec::new()
                    };
                    Event::Heartbeat { peer, tokens_per_s: 1.0, in_flight: 0, commitments }
                }
                // Reports about one of the 8 most recent routes.
                4 | 5 => match routes.iter().rev().nth(b.u8() as usize % routes.len().clamp(1, 8)) {
                    // A report about a route the orchestrator issued, by a miner
                    // on it (the tail's loss, the head's backward) or anyone.
                    Some(r) => {
                        let on = |i: usize| r.pathway.get(i).and_then(|p| p.as_slice().try_into().ok()).map(PeerId);
                        let mb = MbRef { epoch: r.epoch, shard: r.shard, first_sample: r.first_sample };
                        if op % 13 == 4 {
                            let by = if b.u8() & 1 == 0 { on(1).unwrap_or(peer) } else { peer };
                            Event::Loss { peer: by, mb, attempt: r.attempt, loss: b.u8() as f32 / 8.0, tokens: 4 }
                        } else {
                            let by = if b.u8() & 1 == 0 { on(0).unwrap_or(peer) } else { peer };
                            Event::BackwardDone { peer: by, mb, attempt: r.attempt }
                        }
                    }
                    None => Event::Tick,
                },
                6 => Event::UploadDone {
                    peer,
                    epoch: o.epoch(),
                    stage: b.u8() as u32 % 3,
                    key: String::new(),
                    work: b.u64(),
                    object: (!butterfly).then(|| {
                        let stage = o.miner(&peer).map_or(0, |m| m.stage);
                        let key = format!("epoch-{:06}/stage-{stage:03}/{}.safetensors", o.epoch(), peer.to_hex());
                        StoredObject::of(&key, &[b.u8()], peer)
                    }),
                    commitments: Vec::new(),
                },
                7 => {
                    let stage = b.u8() as u32 % 2;
                    let pick = b.u8() as usize;
                    match o.merge_plan(stage).filter(|p| !p.partitions.is_empty()) {
                        Some(p) => {
                            let k = pick % p.partitions.len();
                            let q = &p.partitions[k];
                            let by = if b.u8() & 1 == 0 { q.owners.first().copied().unwrap_or(peer) } else { peer };
                            // An owner claiming a sender's contribution
                            // missing, sometimes (the sender a participant
                            // or not, the claim current or stale).
                            if b.u8() % 4 == 0 {
                                let sender = p.participants.get(b.u8() as usize % p.participants.len().max(1));
                                Event::ContributionsMissing {
                                    peer: by,
                                    epoch: p.epoch,
                                    stage,
                                    partition: k as u32,
                                    generation: q.generation + u32::from(b.u8() % 8 == 0),
                                    senders: vec![sender.map_or(peer, |s| s.peer)],
                                }
                            } else {
                                Event::SliceDone {
                                    peer: by,
                                    epoch: p.epoch,
                                    stage,
                                    partition: k as u32,
                                    generation: q.generation,
                                    hash: vec![b.u8() % 2; 32],
                                    // Headers that are not signed contributions
                                    // (refused), sometimes.
                                    contributions: (0..b.u8() % 4 / 3)
                                        .map(|_| vec![b.u8(); iota_core::wire::header_len()])
                                        .collect(),
                                    flagged: (0..b.u8() % 4 / 3)
                                        .map(|_| q.owners.last().copied().unwrap_or(peer))
                                        .collect(),
                                }
                            }
                        }
                        None => Event::Tick,
                    }
                }
                8 => Event::MergeDone {
                    peer,
                    epoch: o.epoch(),
                    stage: b.u8() as u32 % 2,
                    key: String::new(),
                    weights_hash: vec![b.u8() % 2; 32],
                    object: (!butterfly).then(|| {
                        let stage = o.miner(&peer).map_or(0, |m| m.stage);
                        StoredObject::of(
                            &format!("epoch-{:06}/stage-{stage:03}/merged.safetensors", o.epoch()),
                            &[1],
                            peer,
                        )
                    }),
                    from_store: (b.u8() as u32 * 0x0101_0101, b.u8() as u32),
                },
                9 => {
                    let stage = b.u8() as u32 % 2;
                    let (offset, values) = match o.merge_plan(stage) {
                        Some(p) if b.u8() & 1 == 0 && !p.partitions.is_empty() => {
                            let q = &p.partitions[b.u8() as usize % p.partitions.len()];
                            (q.offset, q.len)
                        }
                        _ => (b.u16() as u64, 1 + b.u16() as u64),
                    };
                    let dir = if b.u8() & 1 == 0 { "weights" } else { "momentum" };
                    let key = format!("epoch-{:06}/stage-{stage:03}/{dir}/{offset:012}-{values:012}.f32", o.epoch());
                    let object = StoredObject::part(&key, &vec![0u8; values as usize * 4], offset, peer);
                    Event::Stored { peer, epoch: o.epoch(), stage, object }
                }
                10 => {
                    let stage = b.u8() as u32 % 2;
                    let object =
                        o.stage_weights(stage).into_iter().next().unwrap_or_else(|| {
                            StoredObject::of("epoch-000000/stage-000/merged.safetensors", &[2], peer)
                        });
                    Event::BadObject { peer, epoch: o.epoch(), stage, object, reason: "fuzz".into() }
                }
                11 => match routes.iter().rev().nth(b.u8() as usize % routes.len().clamp(1, 8)) {
                    // A miner on a route names a neighbour (or anyone) as failed.
                    Some(r) => {
                        let on = |i: usize| r.pathway.get(i).and_then(|p| p.as_slice().try_into().ok()).map(PeerId);
                        let pick = b.u8();
                        let (by, named) = match pick % 3 {
                            0 => (on(0).unwrap_or(peer), on(1).unwrap_or(peer)),
                            1 => (on(1).unwrap_or(peer), on(0).unwrap_or(peer)),
                            _ => (peer, peers[b.u8() as usize % peers.len()]),
                        };
                        let failure = [pb::Failure::Unreachable, pb::Failure::NoInput][(pick as usize >> 2) % 2];
                        let mb = MbRef { epoch: r.epoch, shard: r.shard, first_sample: r.first_sample };
                        Event::PeerFailed { peer: by, mb, attempt: r.attempt, named, failure }
                    }
                    None => Event::Tick,
                },
                _ => {
                    now += 100 * b.u8() as u64;
                    Event::Tick
                }
            }
        };
        // Miners convicted this epoch, and whether the merge is yet to plan.
        let convicted: Vec<PeerId> = o.miners().filter(|m| m.convicted).map(|m| m.peer).collect();
        let was_merging = *o.phase() == Phase::Merging;
        let Ok(outs) = o.step(now, ev, &mut rng) else { continue };
        if !was_merging && *o.phase() == Phase::Merging {
            for stage in 0..2 {
                for c in &convicted {
                    let planned = o.merge_plan(stage).is_some_and(|p| p.is_participant(c));
                    assert!(!planned, "miner {c}, convicted, is in the merge plan of stage {stage}");
                }
            }
        }
        for out in outs {
            if let pb::command::Kind::EpochWork(w) = &out.cmd {
                work =
                    (w.epoch, w.miners.iter().filter_map(|m| m.peer.as_slice().try_into().ok().map(PeerId)).collect());
            }
            if let pb::command::Kind::Route(r) = out.cmd {
                assert_eq!(r.pathway.len(), 2, "one miner per stage");
                for p in &r.pathway {
                    let id = PeerId(p.as_slice().try_into().expect("32-byte ids"));
                    assert!(o.miner(&id).is_some(), "routes name registered miners");
                }
                if routes.len() >= 256 {
                    routes.remove(0);
                }
                routes.push(r);
            }
        }
        let at = (o.epoch(), order(o.phase()));
        assert!(at >= last, "the phase moved back: {last:?} -> {at:?}");
        last = at;
        for e in o.history() {
            assert!(e.completed + e.dropped <= 4, "an epoch counted a micro-batch twice: {e:?}");
        }
        assert!(o.verdicts().len() <= iota_control::orchestrator::MAX_VERDICT_RECORDS);
    }
    Reached {
        epoch: last.0,
        phase: last.1,
        verdicts: o.verdicts().len(),
        convictions: o.counters().convictions,
        rollbacks: o.counters().rollbacks,
    }
}

/// One validator's event: `op`'s next byte picks which.
/// `work`: the latest EpochWork's epoch and miners (what a validator's
/// weights rate and name by hash).
fn validator_event(
    b: &mut Bytes,
    o: &Orchestrator,
    v: PeerId,
    peer: PeerId,
    routes: &[pb::Route],
    work: &(u64, Vec<PeerId>),
) -> Event {
    let epoch = o.epoch().saturating_sub(u64::from(b.u8() % 4 / 3));
    // An attempt of one of the 8 most recent routes, or a made-up one.
    let attempt = |b: &mut Bytes| match routes.iter().rev().nth(b.u8() as usize % routes.len().clamp(1, 8)) {
        Some(r) => (r.shard, r.first_sample, r.attempt),
        None => (u32::from(b.u8()), u64::from(b.u8()), 0),
    };
    match b.u8() % 8 {
        0 => Event::RegisterValidator { peer: v, device: "cpu".into() },
        1 => Event::Subscribed { peer: v },
        2 => {
            // One byte for the count and the step attempt (the stored seeds
            // predate the step attempt: no byte more is read for it).
            let a = attempt(b);
            let c = b.u8();
            let items = vec![a; 1 + c as usize % 2];
            let first = items.first().copied();
            let inner_step = match (c >> 1) % 4 {
                1 => first,
                2 => first.map(|k| (k.0, k.1.wrapping_add(1), k.2)),
                _ => None,
            };
            Event::EvidenceAsk { validator: v, epoch, miner: peer, items, inner_step, trace: None }
        }
        3 | 4 => {
            let check = if b.u8() & 1 == 0 { Check::Recompute } else { Check::Merge };
            let guilty = b.u8() & 1 == 0;
            let samples = b.u8();
            Event::Verdict(VerdictIn {
                validator: v,
                epoch,
                miner: peer,
                check,
                guilty,
                samples: u32::from(samples % 4),
                evidence_hash: Some([b.u8(); 32]),
                reason: "fuzz".into(),
                signed: vec![b.u8(); 4],
                // A proof (two byte strings, headers only by chance) on a
                // samples byte of 255: no byte more is read, so the seeds
                // recorded before proofs existed drive the runs they did.
                proof: if samples == u8::MAX { vec![vec![samples; 300], vec![!samples; 300]] } else { Vec::new() },
                // Set only by the service once it re-checked a stored step
                // proof (its own unit test drives it).
                step_proven: None,
            })
        }
        5 => {
            // Mostly weights that fit the work (one per miner, its hash);
            // sometimes any count, or a hash of nothing.
            let pick = b.u8();
            let n = if pick & 1 == 0 { work.1.len() } else { usize::from(pick >> 5) };
            let named = pick & 2 == 0;
            Event::ValidationDone {
                validator: v,
                epoch,
                weights: (0..n).map(|_| f32::from(b.u8()) / 16.0).collect(),
                miners_hash: named.then(|| iota_control::validation::sample::work_miners_hash(work.0, &work.1)),
                signed: vec![1; 4],
            }
        }
        6 => Event::MergeVote {
            validator: v,
            epoch,
            rollback: b.u8() & 1 == 0,
            loss: f32::from(b.u8()) / 8.0,
            reason: String::new(),
            merged: (0..b.u8() % 4).map(|s| (u32::from(s), [b.u8() % 2; 32])).collect(),
        },
        _ => {
            let stage = u32::from(b.u8() % 2);
            let (partition, generation) = match o.merge_plan(stage).filter(|p| !p.partitions.is_empty()) {
                Some(p) => {
                    let k = b.u8() as usize % p.partitions.len();
                    (k as u32, p.partitions[k].generation)
                }
                None => (u32::from(b.u8()), 0),
            };
            let answer = b.u8() % 3;
            let hash = (answer == 0).then(|| [b.u8() % 2; 32]);
            // One byte decides both lists (as many bytes read as before the
            // unbound list: recorded seeds replay the same events).
            let coin = if answer == 0 { b.u8() } else { 1 };
            Event::MergeAudit {
                validator: v,
                epoch,
                stage,
                partition,
                generation,
                hash,
                missing: if answer == 1 { vec![peer] } else { Vec::new() },
                flagged: if coin & 1 == 0 { vec![peer] } else { Vec::new() },
                unbound: if answer == 0 && coin & 2 != 0 { vec![peer] } else { Vec::new() },
                // Archived headers are fuzzed as bytes: almost all are no
                // proof of anything, and must be taken as none.
                contradicting: if answer == 2 && b.u8() & 1 == 0 { vec![vec![b.u8(); 64]] } else { Vec::new() },
                reason: String::new(),
            }
        }
    }
}
