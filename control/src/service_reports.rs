//! A validator's report, its fields already checked
//! (`fields::validator_report`), as the orchestrator's event.

use iota_core::PeerId;
use iota_protocol::pb;

use crate::orchestrator::{Event, VerdictIn};
use crate::validation::quorum::Check;

/// `signed`: the whole signed request, kept with verdicts and weights.
pub(super) fn validator_report_event(peer: PeerId, kind: pb::validator_report::Kind, signed: Vec<u8>) -> Event {
    let peer_of = |b: &[u8]| PeerId(b.try_into().expect("fields::validator_report checks 32 bytes"));
    match kind {
        pb::validator_report::Kind::Ask(a) => Event::EvidenceAsk {
            validator: peer,
            epoch: a.epoch,
            miner: peer_of(&a.miner),
            items: a.items.iter().map(|w| (w.shard, w.first_sample, w.attempt)).collect(),
            inner_step: a.items.iter().find(|w| w.inner_step).map(|w| (w.shard, w.first_sample, w.attempt)),
            trace: a
                .items
                .iter()
                .find(|w| w.trace_step > 0)
                .map(|w| ((w.shard, w.first_sample, w.attempt), w.trace_step - 1)),
        },
        pb::validator_report::Kind::Verdict(v) => Event::Verdict(VerdictIn {
            validator: peer,
            epoch: v.epoch,
            miner: peer_of(&v.miner),
            check: match v.check() {
                pb::Check::Merge => Check::Merge,
                _ => Check::Recompute,
            },
            guilty: v.guilty,
            samples: v.samples,
            evidence_hash: v.evidence_hash.as_slice().try_into().ok(),
            reason: v.reason,
            // The whole signed request: the verdict stays checkable
            // against the validator's key.
            signed,
            proof: v.proof,
            // Set by the service once it re-checked the stored proof.
            step_proven: None,
        }),
        pb::validator_report::Kind::Done(d) => Event::ValidationDone {
            validator: peer,
            epoch: d.epoch,
            weights: d.weights,
            miners_hash: d.miners_hash.as_slice().try_into().ok(),
            signed,
        },
        pb::validator_report::Kind::MergeAudit(a) => Event::MergeAudit {
            validator: peer,
            epoch: a.epoch,
            stage: a.stage,
            partition: a.partition,
            generation: a.generation,
            hash: a.hash.as_slice().try_into().ok(),
            missing: a.missing.iter().map(|m| peer_of(m)).collect(),
            flagged: a.flagged.iter().map(|m| peer_of(m)).collect(),
            contradicting: a.contradicting,
            unbound: a.unbound.iter().map(|m| peer_of(m)).collect(),
            reason: a.reason,
        },
        pb::validator_report::Kind::MergeVote(v) => Event::MergeVote {
            validator: peer,
            epoch: v.epoch,
            rollback: v.rollback,
            loss: v.loss,
            reason: v.reason,
            merged: v
                .merged
                .iter()
                .map(|st| {
                    (st.stage, st.weights_hash.as_slice().try_into().expect("fields::validator_report checks 32 bytes"))
                })
                .collect(),
        },
    }
}
