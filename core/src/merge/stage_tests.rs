//! Tests of `StageMerge` (stage.rs).
use crate::merge::Participant;

use super::*;

fn plan(r: usize) -> MergePlan {
    let ps = (0..r).map(|i| Participant { peer: PeerId([i as u8 + 1; 32]), work: 5 }).collect();
    MergePlan::new(2, 1, ps, 10_000, 9, 1)
}

fn report_all(m: &mut StageMerge, wrong: Option<(usize, PeerId)>, out: &mut Vec<MergeOut>) {
    for k in 0..m.plan.partitions.len() {
        let part = m.plan.partitions[k].clone();
        for o in &part.owners {
            let h = if wrong == Some((k, *o)) { [9; 32] } else { [k as u8 + 1; 32] };
            m.slice_done(*o, k as u32, part.generation, &SliceReport::of(h), out);
        }
    }
}

#[test]
fn agreeing_owners_settle_every_partition() {
    let mut m = StageMerge::new(plan(4));
    let mut out = Vec::new();
    report_all(&mut m, None, &mut out);
    assert_eq!(out.len(), 4);
    assert!(m.verdicts.iter().all(|v| v.is_some()));
    assert!(m.mismatches.is_empty());
    for p in m.plan.participants.clone() {
        assert!(!m.complete());
        assert!(m.merge_done(p.peer, [1; 32]));
    }
    assert!(m.complete() && m.consistent());
    assert!(!m.merge_done(PeerId([77; 32]), [1; 32]), "strangers are ignored");
}

#[test]
fn a_wrong_owner_is_refereed_and_named() {
    let mut m = StageMerge::new(plan(3));
    let liar = m.plan.partitions[1].owners[1];
    let mut out = Vec::new();
    report_all(&mut m, Some((1, liar)), &mut out);
    assert_eq!(m.mismatches.len(), 1);
    assert!(out.contains(&MergeOut::Plan));
    let part = m.plan.partitions[1].clone();
    assert_eq!(part.owners.len(), 1);
    assert!(!m.mismatches[0].owners.iter().any(|(p, _)| *p == part.owners[0]), "referee is a third replica");
    assert!(m.verdicts[1].is_none());
    // The referee computes the honest result.
    out.clear();
    assert!(m.slice_done(part.owners[0], 1, part.generation, &SliceReport::of([2; 32]), &mut out));
    assert_eq!(m.verdicts[1].as_ref().unwrap().hash, [2; 32]);
    assert_eq!(m.mismatches[0].deviants, vec![liar]);
    // A late report of the old generation changes nothing.
    assert!(!m.slice_done(liar, 1, 0, &SliceReport::of([9; 32]), &mut out));

    // A referee that sides with neither owner is no result to apply: the
    // slice keeps its previous weights.
    let mut m = StageMerge::new(plan(3));
    let mut out = Vec::new();
    report_all(&mut m, Some((1, liar)), &mut out);
    let part = m.plan.partitions[1].clone();
    assert!(m.slice_done(part.owners[0], 1, part.generation, &SliceReport::of([0x5a; 32]), &mut out));
    assert_eq!(m.verdicts[1].as_ref().unwrap().hash, KEEP_PREVIOUS);
    assert_eq!(m.mismatches[0].deviants.len(), 2, "neither owner confirmed");
}

#[test]
fn an_equivocating_sender_is_proven_and_planned_out_and_no_owner_is_named() {
    use crate::identity::Identity;
    use crate::merge::equivocation::tests::signed;
    use crate::merge::{PartitionOf, SignedContribution};

    let ids: Vec<Identity> = (0..4).map(|_| Identity::generate()).collect();
    let ps = ids.iter().map(|i| Participant { peer: i.peer_id(), work: 5 }).collect();
    let mut m = StageMerge::new(MergePlan::new(2, 1, ps, 10_000, 9, 1));
    let part = m.plan.partitions[1].clone();
    let senders: Vec<&Identity> = ids.iter().filter(|i| !part.owners.contains(&i.peer_id())).collect();
    let liar = senders[0].peer_id();
    let to = PartitionOf::of(&m.plan, 9, 1).unwrap();
    // What each owner received: the liar's slice differs between them.
    let received = |owner: u8| -> Vec<SignedContribution> {
        senders
            .iter()
            .map(|i| {
                let payload = if i.peer_id() == liar { 10 + owner } else { 1 };
                SignedContribution::check(&signed(i, 1, part.offset, payload), &to).unwrap()
            })
            .collect()
    };
    let mut out = Vec::new();
    let report = |hash, contributions| SliceReport { hash, contributions, flagged: Vec::new() };
    assert!(m.slice_done(part.owners[0], 1, 0, &report([5; 32], received(0)), &mut out));
    assert!(out.is_empty(), "one owner's report proves nothing");
    assert!(m.slice_done(part.owners[1], 1, 0, &report([6; 32], received(1)), &mut out));
    assert_eq!(out[0], MergeOut::Equivocated(liar));
    assert!(out.contains(&MergeOut::Plan));
    assert!(m.mismatches.is_empty(), "no owner is named for the sender's lie");
    assert!(!m.plan.is_participant(&liar));
    assert_eq!(m.plan.partitions[1].generation, 1, "reduced again without the liar");
    assert_eq!(m.equivocations.len(), 1);
    assert_eq!(m.equivocations[0].sender, liar);
    assert_eq!(m.equivocations[0].verify(9), Ok(()));
    // The same honest contributions reported again prove nothing; the
    // merge completes without the liar.
    out.clear();
    let honest: Vec<SignedContribution> = received(0).into_iter().filter(|c| c.sender != liar).collect();
    for k in 0..m.plan.partitions.len() {
        let p = m.plan.partitions[k].clone();
        for o in &p.owners {
            let c = if k == 1 { honest.clone() } else { Vec::new() };
            m.slice_done(*o, k as u32, p.generation, &report([k as u8 + 1; 32], c), &mut out);
        }
    }
    assert!(!out.iter().any(|o| matches!(o, MergeOut::Equivocated(_))));
    assert!(m.verdicts.iter().all(|v| v.is_some()));
    assert_eq!(m.equivocations.len(), 1);
}

#[test]
fn a_sender_two_other_owners_flag_is_planned_out_and_one_owners_word_is_not_enough() {
    let mut m = StageMerge::new(plan(3));
    let mut out = Vec::new();
    // With three replicas every participant owns two of the three
    // partitions: the third's owners are both others.
    let bad = m.plan.participants[0].peer;
    let k = (0..3).find(|k| !m.plan.partitions[*k].owners.contains(&bad)).unwrap();
    let owned = (0..3).find(|k| m.plan.partitions[*k].owners.contains(&bad)).unwrap();
    let flagging = |hash| SliceReport { hash, contributions: Vec::new(), flagged: vec![bad] };
    // In a partition it owns, only the other owner flags it (and it
    // cannot flag itself out of trouble, or flag itself at all).
    let po = m.plan.partitions[owned].clone();
    for o in &po.owners {
        m.slice_done(*o, owned as u32, 0, &flagging([owned as u8 + 1; 32]), &mut out);
    }
    assert!(!out.iter().any(|o| matches!(o, MergeOut::Flawed(_))), "one other owner's word");
    assert!(m.verdicts[owned].is_some());
    let pk = m.plan.partitions[k].clone();
    assert!(m.slice_done(pk.owners[0], k as u32, 0, &flagging([7; 32]), &mut out));
    assert!(!out.iter().any(|o| matches!(o, MergeOut::Flawed(_))));
    assert!(m.slice_done(pk.owners[1], k as u32, 0, &flagging([7; 32]), &mut out));
    assert!(out.contains(&MergeOut::Flawed(bad)));
    assert_eq!(m.flawed, vec![(k as u32, bad)]);
    assert!(!m.plan.is_participant(&bad));
    assert_eq!(m.plan.partitions[k].generation, 1, "reduced again without it");
    assert!(m.verdicts[k].is_none());
    assert!(m.mismatches.is_empty());
}

#[test]
fn two_replicas_keep_previous_weights_on_dispute() {
    let mut m = StageMerge::new(plan(2));
    let liar = m.plan.partitions[0].owners[0];
    let mut out = Vec::new();
    report_all(&mut m, Some((0, liar)), &mut out);
    assert_eq!(m.verdicts[0].as_ref().unwrap().hash, KEEP_PREVIOUS);
    assert_eq!(m.mismatches.len(), 1);
}

#[test]
fn dropouts_replan_open_partitions_and_move_writers() {
    let mut m = StageMerge::new(plan(4));
    let mut out = Vec::new();
    // Partition 0 settles; then its writer dies.
    let p0 = m.plan.partitions[0].clone();
    for o in &p0.owners {
        m.slice_done(*o, 0, 0, &SliceReport::of([1; 32]), &mut out);
    }
    let writer = m.verdicts[0].as_ref().unwrap().writer;
    out.clear();
    m.drop_participants(&[writer], &mut out);
    m.plan.validate(10_000).unwrap();
    assert_eq!(m.plan.participants.len(), 3);
    assert_ne!(m.verdicts[0].as_ref().unwrap().writer, writer);
    assert!(out.iter().any(|o| matches!(o, MergeOut::Verdict(_))));
    assert_eq!(m.plan.partitions[0].generation, 0, "settled partitions are not recomputed");
    for k in 1..4 {
        assert_eq!(m.plan.partitions[k].generation, 1);
        assert!(!m.plan.partitions[k].owners.contains(&writer));
    }
    report_all(&mut m, None, &mut out);
    assert!(m.verdicts.iter().all(|v| v.is_some()));
    for p in m.plan.participants.clone() {
        m.merge_done(p.peer, [3; 32]);
    }
    assert!(m.complete());
}

/// `complete` counts the finished: one planned out after it finished no
/// longer counts, and a stranger's report never does.
#[test]
fn a_merge_is_complete_when_every_participant_left_in_the_plan_has_finished() {
    let mut m = StageMerge::new(plan(4));
    let mut out = Vec::new();
    report_all(&mut m, None, &mut out);
    let ps: Vec<PeerId> = m.plan.participants.iter().map(|p| p.peer).collect();
    assert!(m.merge_done(ps[0], [3; 32]) && m.merge_done(ps[1], [3; 32]));
    assert!(!m.merge_done(PeerId([77; 32]), [3; 32]));
    assert!(!m.complete());
    m.drop_participants(&[ps[0]], &mut out);
    assert_eq!((m.plan.participants.len(), m.done.len()), (3, 1));
    assert!(!m.complete(), "the one planned out no longer counts");
    assert!(m.merge_done(ps[2], [3; 32]));
    assert!(!m.complete());
    assert!(m.merge_done(ps[3], [3; 32]));
    assert!(m.complete());
}

#[test]
fn a_writer_whose_stored_slice_is_bad_is_replaced_by_a_holder_and_never_comes_back() {
    let mut m = StageMerge::new(plan(3));
    let mut out = Vec::new();
    report_all(&mut m, None, &mut out);
    let liar = m.verdicts[0].as_ref().unwrap().writer;
    let other_owner = *m.plan.partitions[0].owners.iter().find(|o| **o != liar).unwrap();
    let third = m.plan.participants.iter().map(|p| p.peer).find(|p| *p != liar && *p != other_owner).unwrap();
    out.clear();
    assert_eq!(m.move_writer(0, other_owner, &[], &mut out), None, "only the writer's objects move the writing");
    assert!(out.is_empty());
    // The other owner reported the accepted hash: it holds the slice.
    assert_eq!(m.move_writer(0, liar, &[third], &mut out), Some(other_owner));
    assert_eq!(out, vec![MergeOut::Verdict(m.verdicts[0].clone().unwrap())]);
    // Then a participant that finished (and so applied every verdict);
    // never a writer already found bad.
    m.done.insert(liar, [1; 32]);
    assert_eq!(m.move_writer(0, other_owner, &[], &mut out), None, "nobody unspurned holds it yet");
    m.done.insert(third, [1; 32]);
    let again = m.verdicts[0].as_ref().unwrap().writer;
    assert_eq!(again, other_owner, "a failed move leaves the writer");
    assert_eq!(m.move_writer(0, other_owner, &[], &mut out), Some(third));
    assert_eq!(m.move_writer(0, third, &[], &mut out), None, "every holder was found bad");
}

/// Every owner pair's results wait for one audit; two owners that
/// agree on wrong results are convicted at it, before any of their
/// results is accepted, and their partitions are re-planned; honest
/// pairs are accepted when their audit passes or is released.
#[test]
fn colluding_owners_are_caught_by_their_pairs_audit_before_anything_of_theirs_is_accepted() {
    let ps = (0..4).map(|i| Participant { peer: PeerId([i as u8 + 1; 32]), work: 5 }).collect();
    let mut m = StageMerge::new(MergePlan::new(2, 1, ps, 100_000, 9, 3));
    m.audit_with(0x5eed);
    let (a, b) = (PeerId([1; 32]), PeerId([2; 32]));
    let shared: Vec<u32> = (0..m.plan.partitions.len() as u32).filter(|k| m.pair_of(*k) == Some((a, b))).collect();
    assert!(shared.len() >= 2, "the colluders share partitions: {shared:?}");
    let mut out = Vec::new();
    for k in 0..m.plan.partitions.len() as u32 {
        let part = m.plan.partitions[k as usize].clone();
        let h = if shared.contains(&k) { [99; 32] } else { [k as u8 + 1; 32] };
        for o in &part.owners {
            m.slice_done(*o, k, part.generation, &SliceReport::of(h), &mut out);
        }
    }
    assert!(out.iter().all(|o| matches!(o, MergeOut::Audit { .. })), "nothing accepted before its audit: {out:?}");
    let pairs: BTreeSet<_> = (0..m.plan.partitions.len() as u32).filter_map(|k| m.pair_of(k)).collect();
    assert_eq!(out.len(), pairs.len(), "one audit per owner pair");
    assert_eq!(m.audits_waiting().len(), pairs.len());
    let audits: Vec<(u32, u32)> = m.audits_waiting();
    let mut out = Vec::new();
    // The validators recompute the honest result everywhere.
    let mut honest_accepted = 0;
    for (k, g) in audits {
        assert!(!m.audit_result(k, g + 1, Some([k as u8 + 1; 32]), &mut out), "another generation is stale");
        if m.audit_result(k, g, Some([k as u8 + 1; 32]), &mut out) && !shared.contains(&k) {
            honest_accepted += 1;
        }
    }
    assert!(honest_accepted >= 1);
    assert_eq!(m.audited.failed, 1);
    assert_eq!(m.colluded, vec![(m.colluded[0].0, vec![a, b])]);
    assert!(out.contains(&MergeOut::Colluded(vec![a, b])));
    assert!(!m.plan.is_participant(&a) && !m.plan.is_participant(&b), "both planned out");
    for k in &shared {
        assert!(m.verdicts[*k as usize].is_none(), "a colluders' result was accepted");
        assert!(!m.plan.partitions[*k as usize].owners.iter().any(|o| *o == a || *o == b));
    }
    let accepted = m.verdicts.iter().flatten().count();
    assert!(accepted > 0 && accepted < m.plan.partitions.len());
    for v in m.verdicts.iter().flatten() {
        assert_eq!(v.hash, [v.partition as u8 + 1; 32], "only honest results are accepted");
    }
}

#[test]
fn an_audit_nobody_answers_releases_its_pair_and_a_merge_without_audits_holds_nothing() {
    let mut m = StageMerge::new(plan(3));
    m.audit_with(7);
    let mut out = Vec::new();
    report_all(&mut m, None, &mut out);
    assert!(m.verdicts.iter().all(|v| v.is_none()));
    for (k, g) in m.audits_waiting() {
        assert!(m.audit_result(k, g, None, &mut out));
    }
    assert!(m.verdicts.iter().all(|v| v.is_some()), "released audits accept their pairs' results");
    assert_eq!(m.audited.released as usize, out.iter().filter(|o| matches!(o, MergeOut::Audit { .. })).count());
    let mut plain = StageMerge::new(plan(3));
    let mut out = Vec::new();
    report_all(&mut plain, None, &mut out);
    assert!(plain.verdicts.iter().all(|v| v.is_some()) && plain.held.is_empty());
}

/// With audits on, two owners' flags convict nobody until the
/// validators have recomputed them: confirmed, the sender is convicted;
/// refuted, the two owners framed it and are convicted instead.
#[test]
fn flags_wait_for_their_audit_and_owners_that_frame_a_sender_are_convicted() {
    for confirmed in [Some(false), Some(true), None] {
        let mut m = StageMerge::new(plan(3));
        m.audit_with(3);
        let sender = m.plan.participants[0].peer;
        let k = (0..3).find(|k| !m.plan.partitions[*k].owners.contains(&sender)).unwrap() as u32;
        let mut owners = m.plan.partitions[k as usize].owners.clone();
        owners.sort();
        let framing = SliceReport { hash: [7; 32], contributions: Vec::new(), flagged: vec![sender] };
        let mut out = Vec::new();
        for o in &owners {
            m.slice_done(*o, k, 0, &framing, &mut out);
        }
        assert_eq!(out, vec![MergeOut::AuditFlags { partition: k, generation: 0 }], "nobody convicted yet");
        assert!(m.plan.is_participant(&sender));
        assert!(!m.flag_audit_result(k, 1, confirmed, &mut out), "another generation");
        assert!(m.flag_audit_result(k, 0, confirmed, &mut out));
        if confirmed == Some(false) {
            assert!(out.contains(&MergeOut::Colluded(owners.clone())), "{out:?}");
            assert!(m.plan.is_participant(&sender), "the framed sender stays");
            assert!(owners.iter().all(|o| !m.plan.is_participant(o)));
            assert!(m.flawed.is_empty());
        } else {
            assert!(out.contains(&MergeOut::Flawed(sender)));
            assert!(!m.plan.is_participant(&sender));
            assert_eq!(m.flawed, vec![(k, sender)]);
        }
        assert!(!m.flag_audit_result(k, 0, confirmed, &mut out), "decided once");
    }
}

/// Two replicas with audits on: one disputes only the partition drawn for
/// its pair's audit. There is no referee at R = 2, so the dispute waits
/// for the audit, and so do the results the pair agreed on. An audit
/// that settles nothing (no answer) keeps the disputed slice's previous
/// weights and passes the pair's audit on to another of its partitions:
/// the pair's results are neither held for good (a stalled merge) nor
/// accepted unaudited (a colluding pair's way around it).
#[test]
fn disputing_the_audited_partition_moves_the_audit_to_another() {
    let ps = (0..2).map(|i| Participant { peer: PeerId([i as u8 + 1; 32]), work: 5 }).collect();
    let mut m = StageMerge::new(MergePlan::new(2, 1, ps, 100_000, 9, 4));
    m.audit_with(0x5eed);
    let pair = m.pair_of(0).unwrap();
    let drawn = m.audited_of(pair).unwrap();
    let n = m.plan.partitions.len() as u32;
    assert!(n >= 2);
    let mut out = Vec::new();
    for k in 0..n {
        let part = m.plan.partitions[k as usize].clone();
        for (i, o) in part.owners.iter().enumerate() {
            let h = if k == drawn && i == 1 { [0xee; 32] } else { [k as u8 + 1; 32] };
            m.slice_done(*o, k, part.generation, &SliceReport::of(h), &mut out);
        }
    }
    let audits = |out: &[MergeOut]| -> Vec<(u32, u32)> {
        out.iter()
            .filter_map(|o| match o {
                MergeOut::Audit { partition, generation } => Some((*partition, *generation)),
                _ => None,
            })
            .collect()
    };
    let g = m.plan.partitions[drawn as usize].generation;
    assert_eq!(audits(&out), vec![(drawn, g)], "{out:?}");
    assert_eq!(m.audits_waiting(), vec![(drawn, g)]);
    assert!(m.verdicts.iter().all(|v| v.is_none()), "nothing applied before the audit");
    out.clear();
    assert!(m.audit_result(drawn, g, None, &mut out));
    assert_eq!(m.verdicts[drawn as usize].as_ref().unwrap().hash, KEEP_PREVIOUS);
    let next = audits(&out);
    assert_eq!(next.len(), 1, "{out:?}");
    assert_ne!(next[0].0, drawn);
    assert_eq!(m.audits_waiting(), next);
    assert!(m.audit_result(next[0].0, next[0].1, Some([next[0].0 as u8 + 1; 32]), &mut out));
    assert!(m.verdicts.iter().all(|v| v.is_some()), "the pair's results accepted after its audit");
}

/// Partition 1 of a 3-replica merge with audits on, disputed: its second
/// owner reports `liar_says`; the referee, drawn with the merge's seed,
/// reports `referee_says`. Returns the merge, the (honest owner, liar,
/// referee) and the referee's generation.
fn refereed(referee_says: [u8; 32]) -> (StageMerge, [PeerId; 3], u32) {
    let mut m = StageMerge::new(plan(3));
    m.audit_with(5);
    m.draw_referees_with(11);
    let part = m.plan.partitions[1].clone();
    let (honest, liar) = (part.owners[0], part.owners[1]);
    let mut out = Vec::new();
    m.slice_done(honest, 1, part.generation, &SliceReport::of([2; 32]), &mut out);
    m.slice_done(liar, 1, part.generation, &SliceReport::of([9; 32]), &mut out);
    let refd = m.plan.partitions[1].clone();
    let referee = refd.owners[0];
    assert!(referee != honest && referee != liar);
    out.clear();
    assert!(m.slice_done(referee, 1, refd.generation, &SliceReport::of(referee_says), &mut out));
    assert_eq!(out, vec![MergeOut::Audit { partition: 1, generation: refd.generation }], "held for its audit");
    assert!(m.verdicts[1].is_none(), "nothing applied before the audit");
    assert_eq!(m.audits_waiting(), vec![(1, refd.generation)]);
    (m, [honest, liar, referee], refd.generation)
}

/// Issue 56: a referee's side names the other owner deviant only once a
/// validator's recompute agrees; a referee siding with a lying owner is
/// convicted with it, and the honest owner is never named.
#[test]
fn a_referees_side_is_audited_before_it_names_anybody() {
    // An honest referee: the recompute agrees, the liar is proven wrong.
    let (mut m, [honest, liar, _], g) = refereed([2; 32]);
    let mut out = Vec::new();
    assert!(m.audit_result(1, g, Some([2; 32]), &mut out));
    assert_eq!(m.verdicts[1].as_ref().unwrap().hash, [2; 32]);
    assert!(out.contains(&MergeOut::Deviant(vec![liar])), "{out:?}");
    assert!(!m.plan.is_participant(&liar) && m.plan.is_participant(&honest));
    assert_eq!(m.audited.passed, 1);
    // A referee colluding with the liar: both convicted, the honest owner
    // stays, and the partition is reduced again without them.
    let (mut m, [honest, liar, referee], g) = refereed([9; 32]);
    let mut out = Vec::new();
    assert!(m.audit_result(1, g, Some([2; 32]), &mut out));
    assert!(out.contains(&MergeOut::Colluded(vec![referee, liar])), "{out:?}");
    assert!(!out.iter().any(|o| matches!(o, MergeOut::Deviant(_))), "{out:?}");
    assert!(m.plan.is_participant(&honest) && !m.plan.is_participant(&referee) && !m.plan.is_participant(&liar));
    assert!(m.verdicts[1].is_none(), "re-planned, not applied");
    assert_eq!(m.plan.partitions[1].owners, vec![honest]);
    // Nobody answered: the referee's side is applied, nobody is named.
    let (mut m, [_, liar, _], g) = refereed([2; 32]);
    let mut out = Vec::new();
    assert!(m.audit_result(1, g, None, &mut out));
    assert_eq!(m.verdicts[1].as_ref().unwrap().hash, [2; 32]);
    assert!(!out.iter().any(|o| matches!(o, MergeOut::Deviant(_) | MergeOut::Colluded(_))), "{out:?}");
    assert!(m.plan.is_participant(&liar));
    assert!(!m.audit_result(1, g, Some([2; 32]), &mut out), "answered once");
}

/// `framing-sender`: a sender gives both owners one contribution and
/// stores another, signed too, for the audit. The stored header against
/// the reported one is the proof: the sender is named, never the owners.
#[test]
fn a_sender_storing_another_contribution_than_it_sent_is_proven() {
    use crate::identity::Identity;
    use crate::merge::equivocation::tests::signed;
    use crate::merge::{PartitionOf, SignedContribution};

    let ids: Vec<Identity> = (0..4).map(|_| Identity::generate()).collect();
    let ps = ids.iter().map(|i| Participant { peer: i.peer_id(), work: 5 }).collect();
    let mut m = StageMerge::new(MergePlan::new(2, 1, ps, 10_000, 9, 1));
    m.audit_with(3);
    let part = m.plan.partitions[1].clone();
    let senders: Vec<&Identity> = ids.iter().filter(|i| !part.owners.contains(&i.peer_id())).collect();
    let framer = senders[0];
    let to = PartitionOf::of(&m.plan, 9, 1).unwrap();
    let sent: Vec<SignedContribution> =
        senders.iter().map(|i| SignedContribution::check(&signed(i, 1, part.offset, 1), &to).unwrap()).collect();
    let mut out = Vec::new();
    for o in &part.owners {
        let report = SliceReport { hash: [5; 32], contributions: sent.clone(), flagged: Vec::new() };
        assert!(m.slice_done(*o, 1, part.generation, &report, &mut out));
    }
    assert!(m.reported_contributions(1).contains(&(framer.peer_id(), [1; 32])));
    // What it sent, stored: nothing proven.
    assert_eq!(m.stored_contradicts(9, 1, &signed(framer, 1, part.offset, 1)), None);
    // Another payload under a signature that does not verify (the hash
    // changed after signing): nothing proven.
    let mut forged = signed(framer, 1, part.offset, 3);
    let at = forged.windows(32).position(|w| w == [3; 32]).unwrap();
    forged[at] = 4;
    assert_eq!(m.stored_contradicts(9, 1, &forged), None);
    assert!(m.equivocations.is_empty());
    // Another payload under its signature: proven.
    assert_eq!(m.stored_contradicts(9, 1, &signed(framer, 1, part.offset, 2)), Some(framer.peer_id()));
    assert_eq!(m.equivocations.last().unwrap().verify(9), Ok(()));
    // The same header handed on by the next validator: proven once.
    assert_eq!(m.stored_contradicts(9, 1, &signed(framer, 1, part.offset, 2)), None);
    // Not a contribution to this partition, not signed by a participant
    // the owners reported, or another run's: nothing proven.
    assert_eq!(m.stored_contradicts(9, 2, &signed(framer, 1, part.offset, 2)), None);
    assert_eq!(m.stored_contradicts(9, 1, &signed(&Identity::generate(), 1, part.offset, 2)), None);
    assert_eq!(m.stored_contradicts(8, 1, &signed(framer, 1, part.offset, 2)), None);
    assert_eq!(m.stored_contradicts(9, 1, b"not a header"), None);
    assert_eq!(m.equivocations.len(), 1);
}

/// A partition and a participant that is a third party to it (R >= 3).
fn third_party(m: &StageMerge) -> (u32, PeerId) {
    for (k, part) in m.plan.partitions.iter().enumerate() {
        if let Some(p) = m.plan.participants.iter().find(|p| !part.owners.contains(&p.peer)) {
            return (k as u32, p.peer);
        }
    }
    panic!("every participant owns every partition");
}

/// Every owner reports every partition but `k`; `k`'s owners other than
/// `skip` report it too.
fn report_all_but(m: &mut StageMerge, k: u32, skip: &[PeerId], out: &mut Vec<MergeOut>) {
    for j in 0..m.plan.partitions.len() {
        let part = m.plan.partitions[j].clone();
        for o in part.owners.iter().filter(|o| j as u32 != k || !skip.contains(o)) {
            m.slice_done(*o, j as u32, part.generation, &SliceReport::of([j as u8 + 1; 32]), out);
        }
    }
}

/// The open claims as (partition, sender, corroborated).
fn claims(m: &StageMerge) -> Vec<(u32, PeerId, bool)> {
    m.withheld_senders().iter().map(|c| (c.partition, c.sender, c.corroborated)).collect()
}

#[test]
fn a_contribution_both_owners_miss_names_its_sender_and_not_them() {
    let mut m = StageMerge::new(plan(3));
    let (k, withholder) = third_party(&m);
    let owners = m.plan.partitions[k as usize].owners.clone();
    let generation = m.plan.partitions[k as usize].generation;
    let mut out = Vec::new();
    // Everything else is reported; k's owners wait for the withholder.
    report_all_but(&mut m, k, &owners, &mut out);
    out.clear();
    assert!(m.contributions_missing(owners[0], k, generation, &[withholder], 100, &mut out));
    assert_eq!(out, vec![MergeOut::Missing { partition: k, generation, sender: withholder }]);
    assert_eq!(claims(&m), vec![(k, withholder, false)], "one owner's word");
    out.clear();
    assert!(m.contributions_missing(owners[1], k, generation, &[withholder], 500, &mut out));
    assert!(out.is_empty(), "the claim was passed on once");
    assert_eq!(m.withheld_senders()[0].since_ms, 100, "the store's patience counts from the first claim");
    assert_eq!(claims(&m), vec![(k, withholder, true)], "two owners corroborate");
    assert!(m.laggard_owners().is_empty(), "owners waiting on a missing contribution are no laggards");
    assert!(owners.iter().all(|o| m.reported(o)));
    // The merge times out: the withholder is planned out and k reduced again.
    let named = claims(&m);
    m.plan_out_withheld(&named, &mut out);
    assert!(!m.plan.is_participant(&withholder));
    assert_eq!(m.withheld, vec![(k, withholder, true)]);
    let part = m.plan.partitions[k as usize].clone();
    assert!(part.generation > generation && !part.owners.contains(&withholder));
    for o in &part.owners {
        m.slice_done(*o, k, part.generation, &SliceReport::of([7; 32]), &mut out);
    }
    assert!(m.verdicts.iter().all(|v| v.is_some()), "the stage merges without it");
    assert!(m.withheld_senders().is_empty());
}

#[test]
fn a_co_owner_withholding_at_two_replicas_no_longer_gets_the_honest_owner_planned_out() {
    let mut m = StageMerge::new(plan(2));
    let k = 0u32;
    let part = m.plan.partitions[0].clone();
    let (withholder, honest) = (part.owners[0], part.owners[1]);
    let mut out = Vec::new();
    // The withholder reports k (it has the honest owner's contribution);
    // the honest owner never gets the withholder's.
    report_all_but(&mut m, k, &[honest], &mut out);
    assert_eq!(m.laggard_owners(), [honest].into(), "before a claim, the honest owner looks the laggard");
    assert!(m.contributions_missing(honest, k, part.generation, &[withholder], 0, &mut out));
    assert!(m.laggard_owners().is_empty());
    assert_eq!(claims(&m), vec![(k, withholder, false)]);

    // The validators find the contribution stored after all: the claim
    // shields its owner no longer, and nobody is named withholding.
    let mut refuted = m.clone();
    refuted.refute_missing(k, withholder);
    assert_eq!(refuted.laggard_owners(), [honest].into());
    assert!(refuted.withheld_senders().is_empty());
    out.clear();
    assert!(!refuted.contributions_missing(honest, k, part.generation, &[withholder], 0, &mut out) && out.is_empty());
}

#[test]
fn claims_that_cannot_be_true_are_ignored() {
    let mut m = StageMerge::new(plan(3));
    let (k, sender) = third_party(&m);
    let part = m.plan.partitions[k as usize].clone();
    let mut out = Vec::new();
    let stranger = PeerId([99; 32]);
    assert!(!m.contributions_missing(sender, k, part.generation, &[part.owners[0]], 0, &mut out), "not an owner");
    assert!(!m.contributions_missing(part.owners[0], k, part.generation + 1, &[sender], 0, &mut out), "stale");
    assert!(!m.contributions_missing(part.owners[0], 999, 0, &[sender], 0, &mut out), "no such partition");
    assert!(!m.contributions_missing(part.owners[0], k, part.generation, &[stranger, part.owners[0]], 0, &mut out));
    m.slice_done(part.owners[0], k, part.generation, &SliceReport::of([1; 32]), &mut out);
    out.clear();
    assert!(!m.contributions_missing(part.owners[0], k, part.generation, &[sender], 0, &mut out), "it reduced already");
    assert!(out.is_empty() && m.withheld_senders().is_empty());
}

/// R = 2 with audits on: a dispute has no referee to go to, so the
/// validators' recompute settles it and names the owner that is wrong.
#[test]
fn at_two_replicas_a_dispute_is_settled_by_the_audit_and_names_the_lying_owner() {
    let setup = || {
        let mut m = StageMerge::new(plan(2));
        m.audit_with(11);
        let liar = m.plan.participants[1].peer;
        let mut out = Vec::new();
        for k in 0..m.plan.partitions.len() {
            let part = m.plan.partitions[k].clone();
            for o in &part.owners {
                let h = if *o == liar { [9; 32] } else { [k as u8 + 1; 32] };
                m.slice_done(*o, k as u32, part.generation, &SliceReport::of(h), &mut out);
            }
        }
        (m, liar, out)
    };
    let (mut m, liar, out) = setup();
    let n = m.plan.partitions.len();
    assert!(n >= 2, "the test wants two disputes");
    assert_eq!(m.mismatches.len(), n);
    assert_eq!(m.audits_waiting().len(), n, "every dispute waits for its audit");
    assert!(out.iter().filter(|o| matches!(o, MergeOut::Audit { .. })).count() == n);
    assert!(m.verdicts.iter().all(|v| v.is_none()), "nothing applied before the audit");
    assert!(m.laggard_owners().is_empty(), "owners of a held dispute are no laggards");

    // The first audit answers: the honest owner's result stands, the liar
    // is named and planned out, and the rest settle with the honest one.
    let mut out = Vec::new();
    let g = m.plan.partitions[0].generation;
    assert!(m.audit_result(0, g, Some([1; 32]), &mut out));
    assert_eq!(m.verdicts[0].as_ref().map(|v| v.hash), Some([1; 32]));
    assert!(out.contains(&MergeOut::Deviant(vec![liar])));
    assert!(!m.plan.is_participant(&liar));
    assert!(m.mismatches.iter().all(|x| x.deviants == vec![liar]), "{:?}", m.mismatches);
    let honest = m.plan.participants[0].peer;
    out.clear();
    for k in 1..n {
        let part = m.plan.partitions[k].clone();
        assert_eq!(part.owners, vec![honest]);
        assert!(m.slice_done(honest, k as u32, part.generation, &SliceReport::of([k as u8 + 1; 32]), &mut out));
    }
    assert!(m.verdicts.iter().all(|v| v.is_some()), "the stage merges with its honest replica");
    assert!(!out.iter().any(|o| matches!(o, MergeOut::Audit { .. } | MergeOut::Deviant(_))), "named once: {out:?}");

    // No answer in time, or one that matches neither owner: the slice
    // keeps its previous weights and nobody is named.
    for answer in [None, Some([0x55; 32])] {
        let (mut m, _, _) = setup();
        let mut out = Vec::new();
        let g = m.plan.partitions[0].generation;
        assert!(m.audit_result(0, g, answer, &mut out));
        assert_eq!(m.verdicts[0].as_ref().map(|v| v.hash), Some(KEEP_PREVIOUS));
        assert!(!out.iter().any(|o| matches!(o, MergeOut::Deviant(_) | MergeOut::Colluded(_))));
        assert_eq!(m.plan.participants.len(), 2);
    }

    // Without audits (no validators) nobody can tell: previous weights.
    let mut m = StageMerge::new(plan(2));
    let mut out = Vec::new();
    let second = m.plan.partitions[0].owners[1];
    report_all(&mut m, Some((0, second)), &mut out);
    assert_eq!(m.verdicts[0].as_ref().map(|v| v.hash), Some(KEEP_PREVIOUS));
}
