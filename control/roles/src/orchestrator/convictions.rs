//! Convictions the orchestrator decides without a vote, and the proofs it
//! keeps: a merge participant proven to equivocate (two signed
//! contributions), one two owners flagged, a merge cheat a validators'
//! finding names; and the proofs of frames signed twice for one attempt
//! that validators hand in with their verdicts (`validating.rs`).

use iota_core::PeerId;
use iota_core::frame_equivocation::FrameEquivocation;
use iota_core::merge::Equivocation;
use tracing::warn;

use crate::validation::quorum::{Accusation, Check, Consequence};

use super::validation_state::MAX_EQUIVOCATION_RECORDS;
use super::{Ms, Orchestrator, Out};

impl Orchestrator {
    /// A participant of `stage`'s merge was proven to send two owners of a
    /// partition different contributions (the stage merge has planned it
    /// out and holds the proof). Two signatures decide it: no vote. It
    /// strikes like a validators' conviction, and the proof is kept.
    pub(super) fn convict_equivocator(&mut self, now: Ms, stage: u32, miner: PeerId, out: &mut Vec<Out>) {
        let proof = self.butterfly.get(&stage).and_then(|m| m.equivocations.iter().rev().find(|e| e.sender == miner));
        let Some(proof) = proof.cloned() else { return };
        self.counters.equivocations += 1;
        warn!(epoch = proof.epoch, stage, partition = proof.partition, miner = %miner, "proven merge equivocation");
        if self.validation.equivocations.len() >= MAX_EQUIVOCATION_RECORDS {
            self.validation.equivocations.remove(0);
        }
        self.validation.equivocations.push(proof);
        self.convict_merge(now, miner, out);
    }

    /// Two owners of a partition other than `miner` flagged its
    /// contribution to `stage`'s merge (undecodable, non-finite or a far
    /// outlier: see `iota_core::merge::flaws`); the stage merge has planned
    /// it out. Convicted as two agreeing owners' result is accepted: on
    /// their word, with no vote.
    pub(super) fn convict_flawed(&mut self, now: Ms, stage: u32, miner: PeerId, out: &mut Vec<Out>) {
        self.counters.flawed_contributions += 1;
        warn!(epoch = self.epoch, stage, miner = %miner, "two owners flagged a merge contribution");
        self.convict_merge(now, miner, out);
    }

    pub(super) fn convict_merge(&mut self, now: Ms, miner: PeerId, out: &mut Vec<Out>) {
        self.convict_merge_of(now, self.epoch, miner, out);
    }

    /// As `convict_merge`, for a merge cheat of `epoch` (a finding may come
    /// after its epoch was settled).
    pub(super) fn convict_merge_of(&mut self, now: Ms, epoch: u64, miner: PeerId, out: &mut Vec<Out>) {
        let acc = Accusation { epoch, miner, check: Check::Merge };
        let consequences = match self.validation.quorum.as_mut() {
            Some(q) => q.proven(acc),
            // No validators: no strikes to count, the epoch's work is out.
            None => vec![Consequence::Exclude { epoch, miner, check: Check::Merge }],
        };
        self.apply_consequences(now, consequences, out);
    }

    /// The proofs of merge equivocation this run kept (the latest).
    pub fn equivocations(&self) -> &[Equivocation] {
        &self.validation.equivocations
    }

    /// The proofs of frames signed twice for one attempt that validators
    /// handed in (the latest).
    pub fn frame_equivocations(&self) -> &[FrameEquivocation] {
        &self.validation.frame_equivocations
    }
}
