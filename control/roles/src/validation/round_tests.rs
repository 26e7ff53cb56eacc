//! `ValidatorCore`'s rounds, driven by hand-made epoch work.

use iota_core::commitment::Commitments;

use super::*;
use crate::validation::lanes::{LaneRecord, ShownFrame};

const STAGES: u32 = 3;

fn p(i: u8) -> PeerId {
    PeerId([i; 32])
}

/// Miners 1..=3 in stages 0, 1, 2; `n` attempts each, on one pathway.
fn work(epoch: u64, n: u64) -> pb::EpochWork {
    let mut heads = BTreeMap::new();
    let mut miners = Vec::new();
    for s in 0..STAGES {
        let me = p(s as u8 + 1);
        let mut c = Commitments::default();
        c.weights(epoch, &[s as u8; 32]);
        let h = c.heads().into_iter().find(|h| h.epoch == epoch).unwrap();
        heads.insert(me, h.clone());
        let items = (0..n)
            .map(|i| pb::WorkItem {
                mb: Some(pb::WorkRef { shard: 0, first_sample: i * 8, attempt: 0, inner_step: false, trace_step: 0 }),
                samples: 8,
                pathway: (1..=STAGES as u8).map(|q| p(q).0.to_vec()).collect(),
                loss: 2.5,
                order: i,
            })
            .collect();
        let commitments = iota_wire::commitments_pb::to_pb(&[h]).into_iter().next();
        miners.push(pb::MinerWork {
            peer: me.0.to_vec(),
            stage: s,
            commitments,
            items,
            device: "cpu".into(),
            previous: None,
        });
    }
    pb::EpochWork {
        epoch,
        beacon: beacon(9, epoch, &heads).to_vec(),
        miners,
        // Started from the previous epoch's merge (no rollback).
        starts: vec![pb::StageStart { stage: 1, weights_hash: vec![4; 32], weights_from: epoch }],
    }
}

/// Two head replicas (p(1), p(4)) taking turns, then p(2) and the
/// tail p(3); each attempt's reported loss is `loss(order, head)`.
fn work_two_heads(epoch: u64, n: u64, loss: impl Fn(u64, PeerId) -> f32) -> pb::EpochWork {
    let mut heads = BTreeMap::new();
    let mut miners = Vec::new();
    let head_of = |i: u64| if i.is_multiple_of(2) { p(1) } else { p(4) };
    for (me, stage) in [(p(1), 0), (p(4), 0), (p(2), 1), (p(3), 2)] {
        let mut c = Commitments::default();
        c.weights(epoch, &[me.0[0]; 32]);
        let h = c.heads().into_iter().find(|h| h.epoch == epoch).unwrap();
        heads.insert(me, h.clone());
        let items = (0..n)
            .filter(|i| stage > 0 || head_of(*i) == me)
            .map(|i| pb::WorkItem {
                mb: Some(pb::WorkRef { shard: 0, first_sample: i * 8, attempt: 0, inner_step: false, trace_step: 0 }),
                samples: 8,
                pathway: [head_of(i), p(2), p(3)].iter().map(|q| q.0.to_vec()).collect(),
                loss: loss(i, head_of(i)),
                order: i,
            })
            .collect();
        let commitments = iota_wire::commitments_pb::to_pb(&[h]).into_iter().next();
        miners.push(pb::MinerWork {
            peer: me.0.to_vec(),
            stage,
            commitments,
            items,
            device: "cpu".into(),
            previous: None,
        });
    }
    pb::EpochWork {
        epoch,
        beacon: beacon(9, epoch, &heads).to_vec(),
        miners,
        starts: (0..STAGES).map(|s| pb::StageStart { stage: s, weights_hash: Vec::new(), weights_from: 0 }).collect(),
    }
}

/// Runs a round in which every drawn attempt passes its recompute;
/// returns the weights sent with Done.
fn weights_after_clean_round(w: &pb::EpochWork) -> Vec<f32> {
    let mut c = core();
    let mut out = Vec::new();
    for (m, keys) in asks(&c.on_work(0, w).unwrap()) {
        for k in keys {
            for a in c.on_evidence(w.epoch, evidence(w.epoch, m, k)) {
                let Action::Check(job) = a else { panic!("{a:?}") };
                out.extend(c.checked(&job, Ok(())));
            }
        }
    }
    let Some(Action::Done { weights, .. }) = out.last() else { panic!("{out:?}") };
    assert!(out.iter().all(|a| !matches!(a, Action::Vote { guilty: true, .. })), "every recompute passed");
    weights.clone()
}

/// CLASP: a head replica whose pathways lose 0.4 nats more than its
/// peer's (over a falling trend, with noise) passes every sampled
/// recompute (its evidence is consistent) yet gets weight 0; with the
/// same noise and no harm it is paid by its work.
#[test]
fn a_miner_clasp_finds_harmful_is_weighted_zero_though_its_sample_passed() {
    let noise = |i: u64| ((i.wrapping_mul(2_654_435_761) % 1000) as f32 / 1000.0 - 0.5) * 0.1;
    let trend = |i: u64| 4.0 - 0.002 * i as f32;
    let harmful = work_two_heads(0, 400, |i, head| trend(i) + noise(i) + if head == p(4) { 0.4 } else { 0.0 });
    let w = weights_after_clean_round(&harmful);
    let order: Vec<PeerId> = harmful.miners.iter().map(|m| PeerId(m.peer.as_slice().try_into().unwrap())).collect();
    let at = |p: PeerId| w[order.iter().position(|q| *q == p).unwrap()];
    assert_eq!(at(p(4)), 0.0, "{w:?}");
    assert!(at(p(1)) > 0.0 && at(p(2)) > 0.0 && at(p(3)) > 0.0, "{w:?}");
    let honest = work_two_heads(0, 400, |i, _| trend(i) + noise(i));
    let w = weights_after_clean_round(&honest);
    assert!((at_of(&honest, &w, p(4)) - at_of(&honest, &w, p(1))).abs() < 1e-6, "equal work, equal weight: {w:?}");
}

fn at_of(work: &pb::EpochWork, w: &[f32], who: PeerId) -> f32 {
    w[work.miners.iter().position(|m| m.peer == who.0.to_vec()).unwrap()]
}

fn core() -> ValidatorCore {
    ValidatorCore::new(9, STAGES, 77, SampleRate { rate: 0.0, min_per_miner: 2 }, 1_000)
}

fn evidence(epoch: u64, miner: PeerId, k: WorkKey) -> StoredObject {
    let key = iota_wire::store_keys::evidence_key(epoch, &miner, k.0, k.1, k.2);
    StoredObject { key, size: 10, hash: [k.1 as u8; 32], offset: 0, values: 0, writer: miner, work: 0 }
}

fn asks(a: &[Action]) -> Vec<(PeerId, Vec<WorkKey>)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Ask { miner, items, .. } => Some((*miner, items.clone())),
            _ => None,
        })
        .collect()
}

/// The keys asked of `m`, as a set.
fn asked_of(asked: &[(PeerId, Vec<WorkKey>)], m: PeerId) -> BTreeSet<WorkKey> {
    asked.iter().filter(|(q, _)| *q == m).flat_map(|(_, k)| k.iter().copied()).collect()
}

#[test]
fn draws_every_stage_checks_what_it_drew_and_votes_once_per_miner() {
    let mut c = core();
    let a = c.on_work(0, &work(2, 10)).unwrap();
    let asked = asks(&a);
    // Senders before their receivers: the tail, then the middle stage
    // (its own draw and the tail's, whose gradients it received), then
    // the head (its own and the middle stage's own).
    assert_eq!(asked.iter().map(|(m, _)| *m).collect::<Vec<_>>(), vec![p(3), p(2), p(1)]);
    let (tail, middle, head) = (asked_of(&asked, p(3)), asked_of(&asked, p(2)), asked_of(&asked, p(1)));
    assert_eq!(tail.len(), 2, "the tail's own draw");
    assert!(tail.is_subset(&middle) && (2..=4).contains(&middle.len()), "{middle:?}");
    assert!((2..=4).contains(&head.len()) && head.len() + 2 >= middle.len(), "{head:?}");
    // Evidence nobody drew, or from another epoch, is ignored.
    let undrawn = (0..10).map(|i| (0, i * 8, 0)).find(|k| !head.contains(k)).unwrap();
    assert!(c.on_evidence(2, evidence(2, p(1), undrawn)).is_empty());
    assert!(c.on_evidence(3, evidence(3, p(1), *head.first().unwrap())).is_empty());
    // Every check passes but the middle stage's second.
    let mut votes = Vec::new();
    for (m, keys) in &asked {
        for (i, k) in keys.iter().enumerate() {
            let jobs = c.on_evidence(2, evidence(2, *m, *k));
            if *m == p(2) && i > 1 {
                assert!(jobs.is_empty(), "voted guilty: nothing more of it is checked");
                continue;
            }
            let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
            let upstream = [None, Some(p(1)), Some(p(2))][m.0[0] as usize - 1];
            assert_eq!(job.upstream, upstream);
            let downstream = [Some(p(2)), Some(p(3)), None][m.0[0] as usize - 1];
            assert_eq!(job.downstream, downstream);
            assert_eq!(job.epoch_start, if *m == p(2) { Some([4; 32]) } else { None });
            assert_eq!(job.reported_loss, (*m == p(3)).then_some(2.5), "the tail's claimed loss");
            assert!(c.on_evidence(2, evidence(2, *m, *k)).is_empty(), "announced twice: checked once");
            let res = if *m == p(2) && i == 1 { Err("recomputed output differs".into()) } else { Ok(()) };
            votes.extend(c.checked(job, res));
        }
    }
    let mut summary: Vec<_> = votes
        .iter()
        .filter_map(|v| match v {
            Action::Vote { miner, guilty, samples, .. } => Some(format!("{miner:?} {guilty} {samples}")),
            _ => None,
        })
        .collect();
    summary.sort();
    let mut want =
        vec![format!("{:?} false {}", p(1), head.len()), format!("{:?} true 2", p(2)), format!("{:?} false 2", p(3))];
    want.sort();
    assert_eq!(summary, want, "one vote a miner: {votes:?}");
    // Its weights: by work, in the work's order, the guilty miner's zero.
    let Some(Action::Done { weights, .. }) = votes.last() else { panic!("{votes:?}") };
    assert_eq!(weights, &vec![0.5, 0.0, 0.5]);
    assert!(c.tick(10_000).is_empty(), "everyone has a vote");
}

#[test]
fn missing_evidence_is_voted_guilty_after_the_timeout() {
    let mut c = core();
    let asked = asks(&c.on_work(0, &work(0, 5)).unwrap());
    let head: Vec<WorkKey> = asked_of(&asked, p(1)).into_iter().collect();
    let (last, rest) = head.split_last().unwrap();
    for k in rest {
        let jobs = c.on_evidence(0, evidence(0, p(1), *k));
        let [Action::Check(job)] = jobs.as_slice() else { panic!() };
        assert!(c.checked(job, Ok(())).is_empty(), "not all of the head's");
    }
    assert!(c.tick(500).is_empty(), "not yet half the timeout");
    // Half-way, whatever is still pending is asked for once more (a lost
    // request or announcement, a failed upload, is not the miner's doing).
    let again = c.tick(501);
    assert_eq!(again.len(), 3, "{again:?}");
    assert!(
        again.contains(&Action::Ask { epoch: 0, miner: p(1), items: vec![*last], inner_step: None, trace: None }),
        "{again:?}"
    );
    assert!(c.tick(1_000).is_empty(), "asked again once; not yet overdue");
    let a = c.tick(1_001);
    assert_eq!(a.len(), 4, "{a:?}");
    let checked = rest.len() as u32;
    assert!(matches!(&a[0], Action::Vote { miner, guilty: true, samples, reason, .. }
        if *miner == p(1) && *samples == checked && reason.contains("no evidence for 1")));
    assert!(matches!(&a[1], Action::Vote { miner, guilty: true, samples: 0, .. } if *miner == p(2)));
    assert!(matches!(&a[2], Action::Vote { miner, guilty: true, samples: 0, .. } if *miner == p(3)));
    let order = [p(1), p(2), p(3)];
    let miners_hash = super::super::sample::work_miners_hash(0, &order);
    assert_eq!(a[3], Action::Done { epoch: 0, weights: Vec::new(), miners_hash }, "nobody left to pay: it abstains");
    assert_eq!(c.found_guilty(0), BTreeSet::from([p(1), p(2), p(3)]));
    assert!(c.found_guilty(1).is_empty(), "another epoch's round");
}

#[test]
fn the_merge_this_validator_kept_is_offered_as_a_start_beside_the_recorded_one() {
    let mut c = core();
    c.merge_kept(0, BTreeMap::from([(1, [8; 32])]));
    c.merge_kept(1, BTreeMap::from([(1, [9; 32])]));
    let asked = asks(&c.on_work(0, &work(2, 10)).unwrap());
    let start_of = |c: &mut ValidatorCore, m: PeerId| {
        let keys = &asked.iter().find(|(p, _)| *p == m).unwrap().1;
        let jobs = c.on_evidence(2, evidence(2, m, keys[0]));
        let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
        (job.epoch_start, job.merged_start)
    };
    // Epoch 2's attempts start from epoch 1's merge: the orchestrator's
    // record and this validator's own, not epoch 0's.
    assert_eq!(start_of(&mut c, p(2)), (Some([4; 32]), Some([9; 32])));
    assert_eq!(start_of(&mut c, p(1)), (None, None), "stage 0's merge was not loaded");

    // Epoch 1's merge rolled back: epoch 2 starts from epoch 0's, and
    // the merge of epoch 1 this validator kept is no start.
    for (weights_from, kept) in [(1, Some([8; 32])), (0, None)] {
        let mut c = core();
        c.merge_kept(0, BTreeMap::from([(1, [8; 32])]));
        c.merge_kept(1, BTreeMap::from([(1, [9; 32])]));
        let mut w = work(2, 10);
        w.starts[0].weights_from = weights_from;
        let asked = asks(&c.on_work(0, &w).unwrap());
        let keys = &asked.iter().find(|(q, _)| *q == p(2)).unwrap().1;
        let jobs = c.on_evidence(2, evidence(2, p(2), keys[0]));
        let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
        assert_eq!(job.merged_start, kept, "weights from {weights_from}");
    }
    for e in 2..10 {
        c.merge_kept(e, BTreeMap::new());
    }
    assert_eq!(c.merged.len(), MERGED_KEPT, "bounded");
}

#[test]
fn an_unreadable_object_is_asked_for_again_and_judges_nobody() {
    let mut c = core();
    let asked = asks(&c.on_work(0, &work(0, 5)).unwrap());
    let head: Vec<WorkKey> = asked_of(&asked, p(1)).into_iter().collect();
    let key = head[0];
    let jobs = c.on_evidence(0, evidence(0, p(1), key));
    let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
    let again = c.unreadable(job);
    assert_eq!(again, vec![Action::Ask { epoch: 0, miner: p(1), items: vec![key], inner_step: None, trace: None }]);
    assert!(c.unreadable(job).is_empty(), "reported twice: asked once");
    // Announced again, it is checked again and counts.
    let mut votes = Vec::new();
    for k in &head {
        let jobs = c.on_evidence(0, evidence(0, p(1), *k));
        let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
        votes.extend(c.checked(job, Ok(())));
    }
    let n = head.len() as u32;
    assert!(
        matches!(&votes[..], [Action::Vote { miner, guilty: false, samples, .. }]
        if *miner == p(1) && *samples == n),
        "{votes:?}"
    );
    // Never readable: the timeout, not the read, votes.
    let mut c = core();
    let asked = asks(&c.on_work(0, &work(0, 5)).unwrap());
    let head: Vec<WorkKey> = asked_of(&asked, p(1)).into_iter().collect();
    let jobs = c.on_evidence(0, evidence(0, p(1), head[0]));
    let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
    c.unreadable(job);
    let a = c.tick(1_001);
    let missing = format!("no evidence for {}", head.len());
    assert!(
        a.iter().any(|v| matches!(v, Action::Vote { miner, guilty: true, samples: 0, reason, .. }
        if *miner == p(1) && reason.contains(&missing))),
        "{a:?}"
    );
}

#[test]
fn a_forged_beacon_or_pathway_is_refused_and_a_repeat_changes_nothing() {
    let mut w = work(1, 4);
    w.beacon[0] ^= 1;
    assert!(core().on_work(0, &w).unwrap_err().contains("beacon"));
    let mut w = work(1, 4);
    w.miners[1].items[0].pathway.swap(0, 1);
    assert!(core().on_work(0, &w).unwrap_err().contains("pathway"));
    let mut c = core();
    assert!(!c.on_work(0, &work(1, 4)).unwrap().is_empty());
    assert!(c.on_work(5, &work(1, 4)).unwrap().is_empty(), "the same round again");
    // The draw depends on the validator's seed.
    let mut other = ValidatorCore::new(9, STAGES, 78, SampleRate { rate: 0.0, min_per_miner: 2 }, 1_000);
    let (a, b) = (asks(&core().on_work(0, &work(1, 40)).unwrap()), asks(&other.on_work(0, &work(1, 40)).unwrap()));
    assert_ne!(a, b);
}

#[test]
fn the_evidence_timeout_grows_with_what_the_draw_must_upload() {
    // Stage 1's weights are 25 MB: two drawn bundles of up to two states
    // each are 100 MB, 8 s at 100 Mbit/s, on top of the 1 s base.
    assert_eq!(evidence_allowance_ms(25_000_000, 2), 8_000);
    // Two validators draw from each miner: its uploads are both draws
    // (12.5 MB a state, 2 validators x its asked bundles).
    let mut c = core().with_stage_params(&[10, 3_125_000, 10], 2);
    let asked = asks(&c.on_work(0, &work(0, 5)).unwrap());
    let middle = asked_of(&asked, p(2)).len();
    let timeout = 1_000 + evidence_allowance_ms(12_500_000, middle * 2);
    assert!(timeout >= 9_000, "at least its own two bundles: {timeout}");
    // Miners 1 and 3 deliver; miner 2 (the big stage) is uploading.
    for (m, keys) in &asked {
        if *m == p(2) {
            continue;
        }
        for k in keys {
            let jobs = c.on_evidence(0, evidence(0, *m, *k));
            let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
            let _ = c.checked(job, Ok(()));
        }
    }
    assert!(c.tick(1_001).is_empty(), "past the base timeout, within the allowance: no vote");
    let again = c.tick(timeout / 2 + 100);
    assert_eq!(asks(&again).len(), 1, "half-way: asked again ({again:?})");
    assert!(c.tick(timeout).is_empty(), "still within the allowance");
    let late = c.tick(timeout + 1);
    let within = format!("within {timeout} ms");
    assert!(
        matches!(&late[0], Action::Vote { miner, guilty: true, reason, .. }
        if *miner == p(2) && reason.contains(&within)),
        "{late:?}"
    );
    // The tail's lanes waited for the middle stage's records; without them
    // it is judged on its own evidence.
    assert!(late.iter().any(|v| matches!(v, Action::Vote { miner, guilty: false, .. } if *miner == p(3))), "{late:?}");
    // Without the stage sizes the base timeout alone holds.
    let mut plain = core();
    let _ = plain.on_work(0, &work(0, 5)).unwrap();
    assert!(plain.tick(1_001).iter().any(|a| matches!(a, Action::Vote { guilty: true, .. })));
}

/// Both ends of a gradient lane: the tail's drawn attempts are asked of
/// the middle stage too; a tail whose shown gradient is not the one the
/// middle stage received (two frames it signed for the attempt) is voted
/// guilty, however its own recompute went; matching ends clear it; the
/// middle stage, whose record convicted it, is cleared on its own checks.
#[test]
fn a_sender_whose_shown_gradient_is_not_the_received_one_is_voted_guilty() {
    for lie in [false, true] {
        let mut c = core();
        let asked = asks(&c.on_work(0, &work(0, 10)).unwrap());
        let tail = asked_of(&asked, p(3));
        let lied_on = *tail.first().unwrap();
        let mut votes = Vec::new();
        for (m, keys) in &asked {
            for k in keys {
                let jobs = c.on_evidence(0, evidence(0, *m, *k));
                let [Action::Check(job)] = jobs.as_slice() else { panic!("{jobs:?}") };
                let id = |x: u8| Some(ShownFrame { id: [x ^ k.1 as u8; 32], header: vec![x; 4] });
                let rec = match m.0[0] {
                    3 => LaneRecord {
                        sent_grad: if lie && *k == lied_on { id(7) } else { id(1) },
                        received_grad: None,
                        failed_step: None,
                    },
                    2 => LaneRecord { sent_grad: id(2), received_grad: id(1), failed_step: None },
                    _ => LaneRecord { sent_grad: None, received_grad: id(2), failed_step: None },
                };
                votes.extend(c.checked_lanes(job, Ok(()), rec));
            }
        }
        let vote = |who: PeerId| {
            votes.iter().find_map(|v| match v {
                Action::Vote { miner, guilty, reason, .. } if *miner == who => Some((*guilty, reason.clone())),
                _ => None,
            })
        };
        let (guilty, reason) = vote(p(3)).expect("the tail was judged");
        assert_eq!(guilty, lie, "{reason}");
        let proof = votes.iter().find_map(|v| match v {
            Action::Vote { miner, proof, .. } if *miner == p(3) => Some(proof.clone()),
            _ => None,
        });
        if lie {
            assert!(reason.contains("not the one its upstream neighbour received"), "{reason}");
            assert!(reason.contains(&format!("{lied_on:?}")), "{reason}");
            assert_eq!(proof, Some(vec![vec![7; 4], vec![1; 4]]), "the shown header, then the received one");
        } else {
            assert_eq!(proof, Some(Vec::new()), "no proof with a clearing vote");
        }
        assert_eq!(vote(p(2)).map(|v| v.0), Some(false), "the middle stage's ends all match");
        assert_eq!(vote(p(1)).map(|v| v.0), Some(false));
        assert!(matches!(votes.last(), Some(Action::Done { .. })), "{votes:?}");
        assert_eq!(votes.iter().filter(|v| matches!(v, Action::Vote { .. })).count(), 3, "one vote a miner");
    }
}

/// With inner steps checked, one drawn attempt of each miner is asked
/// with its steps, and only the object that shows them is checked for it
/// (a plain one, asked by another validator, is waited past); the other
/// attempts take either object and are checked without steps.
#[test]
fn one_drawn_attempt_per_miner_is_asked_and_checked_with_its_inner_steps() {
    let mut c = core().with_inner_steps(true);
    let a = c.on_work(0, &work(0, 10)).unwrap();
    let mut step_of = BTreeMap::new();
    for x in &a {
        let Action::Ask { miner, items, inner_step, .. } = x else { continue };
        if let Some(k) = inner_step {
            assert!(items.contains(k), "the step attempt is among the items asked");
            assert!(step_of.insert(*miner, *k).is_none(), "one step attempt per miner");
        }
    }
    assert_eq!(step_of.len(), STAGES as usize, "every drawn miner has one: {a:?}");
    let step_object = |m: PeerId, k: WorkKey| StoredObject {
        key: iota_wire::store_keys::step_evidence_key(0, &m, k.0, k.1, k.2),
        ..evidence(0, m, k)
    };
    let (mut checks, mut step_checks) = (0, 0);
    for (m, keys) in asks(&a) {
        for k in keys {
            let jobs = match step_of.get(&m) == Some(&k) {
                true => {
                    assert!(c.on_evidence(0, evidence(0, m, k)).is_empty(), "the plain object does not show the steps");
                    c.on_evidence(0, step_object(m, k))
                }
                false => c.on_evidence(0, step_object(m, k)),
            };
            let Some(Action::Check(job)) = jobs.first() else { continue };
            assert_eq!(job.inner_step, step_of.get(&m) == Some(&k), "{m:?} {k:?}");
            checks += 1;
            step_checks += usize::from(job.inner_step);
        }
    }
    assert_eq!(step_checks, STAGES as usize, "each step attempt checked once, with its steps");
    assert!(checks >= 2 * STAGES as usize, "and the other drawn attempts: {checks}");
    // Without the setting, nothing is asked with its steps.
    let plain = core().on_work(0, &work(0, 10)).unwrap();
    assert!(plain.iter().all(|x| !matches!(x, Action::Ask { inner_step: Some(_), .. })), "{plain:?}");
}

/// With step proofs on, a failed step is not voted at once: the miner's
/// trace of it is asked, handed to the shell to prove, and the vote
/// carries the proof; a trace that proves nothing, or none in time, leaves
/// the vote without one. Off, the vote goes at once.
#[test]
fn a_failed_step_is_proven_with_the_miners_trace_before_the_vote() {
    let step_object = |m: PeerId, k: WorkKey| StoredObject {
        key: iota_wire::store_keys::step_evidence_key(0, &m, k.0, k.1, k.2),
        ..evidence(0, m, k)
    };
    let failed = LaneRecord { failed_step: Some(2), ..LaneRecord::default() };
    let why = || Err::<(), String>("inner step 2: recomputed, the step reaches other weights".into());
    // The check of miner p(2)'s step attempt, failed at step 2.
    let start = |proofs: bool| {
        let mut c = core().with_inner_steps(true).with_step_proofs(proofs);
        let a = c.on_work(0, &work(0, 10)).unwrap();
        let k = a
            .iter()
            .find_map(|x| match x {
                Action::Ask { miner, inner_step: Some(k), .. } if *miner == p(2) => Some(*k),
                _ => None,
            })
            .unwrap();
        let Some(Action::Check(job)) = c.on_evidence(0, step_object(p(2), k)).pop() else { panic!("a check") };
        let out = c.checked_lanes(&job, why(), failed.clone());
        (c, k, out)
    };
    let vote_of = |out: &[Action]| {
        out.iter().find_map(|x| match x {
            Action::Vote { miner, guilty, reason, step_proof, .. } if *miner == p(2) => {
                Some((*guilty, reason.clone(), step_proof.clone()))
            }
            _ => None,
        })
    };
    let (_, _, out) = start(false);
    assert_eq!(vote_of(&out).map(|v| (v.0, v.2)), Some((true, Vec::new())), "off: voted at once");
    let (mut c, k, out) = start(true);
    assert!(vote_of(&out).is_none(), "not voted before the trace: {out:?}");
    let asked = out.iter().find(|x| matches!(x, Action::Ask { trace: Some(2), .. }));
    assert!(
        matches!(asked, Some(Action::Ask { miner, items, inner_step: Some(s), .. }) if *miner == p(2) && items == &vec![k] && *s == k),
        "{out:?}"
    );
    let trace = StoredObject { key: iota_wire::store_keys::trace_evidence_key(0, &p(2), k, 2), ..evidence(0, p(2), k) };
    let other_step = StoredObject { key: iota_wire::store_keys::trace_evidence_key(0, &p(2), k, 1), ..trace.clone() };
    assert!(c.on_evidence(0, other_step).is_empty(), "a trace of another step proves nothing here");
    let Some(Action::Prove(job)) = c.on_evidence(0, trace.clone()).pop() else { panic!("a proof to build") };
    assert_eq!((job.step, job.job.key, &job.trace), (2, k, &trace));
    assert!(c.on_evidence(0, trace).is_empty(), "proven once");
    let out = c.proved(&job, Ok(vec![1, 2, 3]));
    let (guilty, reason, proof) = vote_of(&out).expect("the vote");
    assert!(guilty && reason.contains("proven from its trace of inner step 2"), "{reason}");
    assert_eq!(proof, vec![1, 2, 3], "the vote carries the proof");
    // A trace that proves nothing.
    let (mut c, k, _) = start(true);
    let trace = StoredObject { key: iota_wire::store_keys::trace_evidence_key(0, &p(2), k, 2), ..evidence(0, p(2), k) };
    let Some(Action::Prove(job)) = c.on_evidence(0, trace).pop() else { panic!("a proof to build") };
    let (guilty, reason, proof) = vote_of(&c.proved(&job, Err("it does not bind".into()))).expect("the vote");
    assert!(guilty && proof.is_empty() && reason.contains("proves nothing: it does not bind"), "{reason}");
    // No trace in time: half the round's timeout (1 s here) after the ask.
    let (mut c, _, _) = start(true);
    assert!(vote_of(&c.tick(100)).is_none(), "the ask is seen out");
    assert!(vote_of(&c.tick(500)).is_none(), "still within the allowance");
    let (guilty, reason, proof) = vote_of(&c.tick(700)).expect("voted when overdue");
    assert!(guilty && proof.is_empty() && reason.contains("no trace of inner step 2"), "{reason}");
}
