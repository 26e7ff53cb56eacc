//! A validator's audit of one butterfly partition (PROTOCOL.md, "Merge
//! audits"): from the participants' stored contribution frames (each
//! checked against its sender's signature and the partition before
//! anything in it is used) and the outer momentum, the reduce an honest
//! owner does (`iota_checks::slices::reduce_partition`), and the
//! hash the owners should have published.

use std::collections::BTreeMap;

use iota_checks::frame::{FrameLimits, RunContext, decode_frame};
use iota_checks::slices::reduce_partition_published;
use iota_core::PeerId;
use iota_core::merge::MergePlan;
use iota_core::wire::Direction;
use iota_wire::MergeSpec;

/// What an audit found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditFinding {
    /// The hash of the update recomputed from every contribution, and the
    /// senders whose contribution its reduce flagged and left out.
    Recomputed([u8; 32], Vec<PeerId>),
    /// These participants' contributions were absent, or not a signed
    /// contribution of theirs to this partition.
    Missing(Vec<PeerId>),
    /// The archived headers of stored contributions, signed by their
    /// senders, whose payload is not the one the owners reported reducing:
    /// each, with the reported header the orchestrator holds, proves its
    /// sender equivocated (and the owners' result cannot be recomputed
    /// from what it stored).
    Contradicting(Vec<Vec<u8>>),
}

/// Recomputes partition `k` of `plan` from `frames` (each participant's
/// stored frame, by sender) with `momentum` (the stage's outer momentum
/// slice after the previous merge; zeros in epoch 0). `reported`: the
/// payload hash of each sender's contribution as the owners reported it;
/// a stored one with another payload is no input to recompute from, but
/// the proof of its sender's lie.
pub fn recompute_partition(
    spec: &MergeSpec,
    run_id: u64,
    plan: &MergePlan,
    k: u32,
    frames: &BTreeMap<PeerId, Vec<u8>>,
    reported: &BTreeMap<PeerId, [u8; 32]>,
    momentum: &mut [f32],
) -> Result<AuditFinding, String> {
    let part = plan.partitions.get(k as usize).ok_or_else(|| format!("partition {k} is not in the plan"))?;
    if momentum.len() as u64 != part.len {
        return Err(format!("momentum of {} values for a partition of {}", momentum.len(), part.len));
    }
    let epoch = u32::try_from(plan.epoch).map_err(|_| "an epoch past the frame's range")?;
    let ctx = RunContext::new(run_id, FrameLimits::default());
    ctx.set_epoch_window(epoch, epoch);
    let mut payloads: Vec<Option<&[u8]>> = Vec::with_capacity(plan.participants.len());
    let mut missing = Vec::new();
    let mut contradicting = Vec::new();
    for p in &plan.participants {
        let ok = frames.get(&p.peer).and_then(|bytes| {
            let (h, payload) = decode_frame(bytes, &ctx, p.peer).ok()?;
            let fits = h.direction == Direction::WeightSlice
                && u32::from(h.stage) == plan.stage
                && h.shard == k
                && h.first_sample == part.offset
                && h.samples == 0
                && h.codec == spec.contribution_codec().id()
                && h.rows_cols() == Some(spec.contribution_shape(part.len));
            fits.then_some((h.payload_hash, bytes, payload))
        });
        match ok {
            Some((hash, bytes, _)) if reported.get(&p.peer).is_some_and(|r| *r != hash) => {
                let header = bytes.get(8..8 + iota_core::wire::header_len()).ok_or("a frame without its header")?;
                contradicting.push(header.to_vec());
            }
            Some((_, _, payload)) => payloads.push(Some(payload)),
            None => missing.push(p.peer),
        }
    }
    if !contradicting.is_empty() {
        return Ok(AuditFinding::Contradicting(contradicting));
    }
    if !missing.is_empty() {
        return Ok(AuditFinding::Missing(missing));
    }
    let reduced = reduce_partition_published(spec, plan.epoch, part.len, &payloads, &plan.weights(), momentum)
        .map_err(|e| format!("encoding the update: {e}"))?;
    let flagged = reduced.flagged.iter().map(|(i, _)| plan.participants[*i].peer).collect();
    Ok(AuditFinding::Recomputed(reduced.hash, flagged))
}

#[cfg(test)]
mod tests {
    use iota_checks::frame::{FrameMeta, build_header, prefix_bytes};
    use iota_checks::slices::encode_slice;
    use iota_core::WireCodec;
    use iota_core::identity::Identity;
    use iota_core::merge::{BLOCK, Participant};
    use iota_wire::MergeMethod;

    use super::*;

    const RUN: u64 = 77;

    fn spec() -> MergeSpec {
        MergeSpec {
            method: MergeMethod::Butterfly,
            slices_per_replica: 2,
            codec: WireCodec::F32,
            stage_params: vec![3000],
            ..MergeSpec::default()
        }
    }

    fn frame(id: &Identity, plan: &MergePlan, k: u32, values: &[f32]) -> Vec<u8> {
        let part = &plan.partitions[k as usize];
        let payload = encode_slice(WireCodec::F32, values).unwrap();
        let meta = FrameMeta {
            direction: Direction::WeightSlice,
            codec: WireCodec::F32,
            stage: plan.stage as u16,
            epoch: plan.epoch as u32,
            shard: k,
            first_sample: part.offset,
            samples: 0,
            attempt: 0,
            shape: vec![part.len.div_ceil(BLOCK) as u32, BLOCK as u32],
            answers: [0; 32],
        };
        let mut v = prefix_bytes(&build_header(&meta, RUN, 0, &payload, id));
        v.extend_from_slice(&payload);
        v
    }

    /// The audit's hash is the hash of the work-weighted mean of the
    /// contributions computed here by hand; a changed contribution, a
    /// frame signed by someone else or one for another partition are
    /// caught.
    #[test]
    fn the_audit_recomputes_the_weighted_mean_and_refuses_frames_not_the_senders() {
        let ids: Vec<Identity> = (0..3).map(|i| Identity::from_seed([40 + i; 32])).collect();
        let works = [3u64, 1, 4];
        let ps = ids.iter().zip(works).map(|(id, work)| Participant { peer: id.peer_id(), work }).collect();
        let plan = MergePlan::new(2, 1, ps, 3000, RUN, 2);
        let k = 1u32;
        let len = plan.partitions[k as usize].len as usize;
        let slice = |i: usize| -> Vec<f32> { (0..len).map(|j| ((i * 31 + j) as f32 * 0.01).sin()).collect() };
        let mut frames = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            frames.insert(id.peer_id(), frame(id, &plan, k, &slice(i)));
        }
        // By hand: the plan orders participants by peer id; weights by work.
        let total: f64 = plan.participants.iter().map(|p| p.work as f64).sum();
        let mean: Vec<f32> = (0..len)
            .map(|j| {
                let s: f64 = plan
                    .participants
                    .iter()
                    .map(|p| {
                        let i = ids.iter().position(|id| id.peer_id() == p.peer).unwrap();
                        p.work as f64 / total * f64::from(slice(i)[j])
                    })
                    .sum();
                s as f32
            })
            .collect();
        let by_hand = *blake3::hash(&encode_slice(WireCodec::F32, &mean).unwrap()).as_bytes();
        let audit = |frames: &BTreeMap<PeerId, Vec<u8>>| {
            recompute_partition(&spec(), RUN, &plan, k, frames, &BTreeMap::new(), &mut vec![0.0; len]).unwrap()
        };
        assert_eq!(audit(&frames), AuditFinding::Recomputed(by_hand, Vec::new()));

        let mut changed = frames.clone();
        let mut other = slice(0);
        other[5] += 0.25;
        changed.insert(ids[0].peer_id(), frame(&ids[0], &plan, k, &other));
        assert!(matches!(audit(&changed), AuditFinding::Recomputed(h, _) if h != by_hand));
        // A contribution far outside the others' norm is flagged, as an
        // honest owner flags it.
        let mut huge = frames.clone();
        huge.insert(ids[2].peer_id(), frame(&ids[2], &plan, k, &vec![1e7; len]));
        assert!(matches!(audit(&huge), AuditFinding::Recomputed(_, f) if f == vec![ids[2].peer_id()]));

        let mut forged = frames.clone();
        forged.insert(ids[1].peer_id(), frame(&ids[2], &plan, k, &slice(1)));
        assert_eq!(audit(&forged), AuditFinding::Missing(vec![ids[1].peer_id()]));

        let mut wrong_part = frames.clone();
        let other_k = frame(&ids[2], &plan, 0, &vec![0.5; plan.partitions[0].len as usize]);
        wrong_part.insert(ids[2].peer_id(), other_k);
        assert_eq!(audit(&wrong_part), AuditFinding::Missing(vec![ids[2].peer_id()]));

        let mut absent = frames.clone();
        absent.remove(&ids[0].peer_id());
        absent.insert(ids[1].peer_id(), b"not a frame".to_vec());
        let AuditFinding::Missing(m) = audit(&absent) else { panic!("recomputed without two contributions") };
        assert_eq!(m.len(), 2);
        let none = BTreeMap::new();
        assert!(recompute_partition(&spec(), RUN, &plan, 9, &frames, &none, &mut vec![0.0; len]).is_err());
        assert!(recompute_partition(&spec(), RUN, &plan, k, &frames, &none, &mut vec![0.0; len + 1]).is_err());

        // `framing-sender`: the owners reported reducing another payload of
        // participant 0's than the one it stored. Its stored header is
        // handed back as the proof, and nothing is recomputed from it.
        let hash_of = |bytes: &[u8]| {
            iota_core::wire::parse_header(&bytes[8..8 + iota_core::wire::header_len()]).unwrap().payload_hash
        };
        let sent = frame(&ids[0], &plan, k, &other);
        let mut reported: BTreeMap<PeerId, [u8; 32]> = frames.iter().map(|(p, f)| (*p, hash_of(f))).collect();
        let full = |reported: &BTreeMap<PeerId, [u8; 32]>| {
            recompute_partition(&spec(), RUN, &plan, k, &frames, reported, &mut vec![0.0; len]).unwrap()
        };
        assert_eq!(full(&reported), AuditFinding::Recomputed(by_hand, Vec::new()), "what was reported is stored");
        reported.insert(ids[0].peer_id(), hash_of(&sent));
        let stored_header = frames[&ids[0].peer_id()][8..8 + iota_core::wire::header_len()].to_vec();
        assert_eq!(full(&reported), AuditFinding::Contradicting(vec![stored_header]));
    }
}
