//! A contribution as its sender stored it for an audit, held against the
//! one the partition's owners reported reducing.
//!
//! A sender could send the owners one contribution and store another for
//! the validators: their recompute would then differ from the honest
//! owners' result and convict the owners, never the sender. Both are
//! signed by the sender, so two payload hashes for one partition under its
//! signature are an equivocation proof, the same as two owners reporting
//! different headers: the sender is planned out and convicted, and the
//! owners reduce again without it.

use super::{Equivocation, SignedContribution, StageMerge};
use crate::identity::PeerId;
use crate::merge::PartitionOf;

impl StageMerge {
    /// The payload hash each sender's contribution to partition `k` had as
    /// the owners reported it (what a validator must find in the store).
    pub fn reported_contributions(&self, k: u32) -> Vec<(PeerId, [u8; 32])> {
        self.contributions.get(k as usize).map_or_else(Vec::new, |c| c.iter().map(|(p, (h, _))| (*p, *h)).collect())
    }

    /// `header`, the archived header of the contribution a sender stored for
    /// partition `k`'s audit: if it is a signed contribution to `k` whose
    /// payload differs from the one the owners reported for that sender,
    /// the proof is recorded and the sender returned (the caller plans it
    /// out and convicts it). Anything else (not a contribution to `k`, not
    /// signed, the same payload, a sender nobody reported) proves nothing.
    pub fn stored_contradicts(&mut self, run_id: u64, k: u32, header: &[u8]) -> Option<PeerId> {
        let to = PartitionOf::of(&self.plan, run_id, k)?;
        // The cheap tests first: every validator that read the partition
        // hands on the same stored headers, and the signatures matter only
        // for a payload that differs and is not proven yet.
        let (sender, payload_hash) = SignedContribution::unverified(header, &to).ok()?;
        let (reported_hash, reported_header) = self.contributions.get(k as usize)?.get(&sender)?;
        if *reported_hash == payload_hash {
            return None;
        }
        if self.equivocations.iter().any(|e| e.partition == k && e.sender == sender) {
            return None; // proven already: one proof, one conviction
        }
        let proof = Equivocation {
            epoch: self.plan.epoch,
            stage: self.plan.stage,
            partition: k,
            sender,
            headers: [reported_header.clone(), header.to_vec()],
        };
        // Both headers' signatures, the partition and the differing payloads.
        if proof.verify(run_id).is_err() {
            return None;
        }
        self.equivocations.push(proof);
        Some(sender)
    }
}
