//! How simulated miners act out the adversary modes (`adversary.rs`):
//! what their neighbours report of them on a pathway, what the owners of
//! a merge partition report of their contributions, what they report of
//! their own merges, and what a validator's recompute finds in their
//! evidence. Each is what the real miner's mode makes its honest
//! counterparts see (the orchestrator and integration tests' findings).

use iota_core::merge::MergePlan;
use iota_core::wire::{Direction, FrameHeader, PROTOCOL_VERSION, header_bytes};
use iota_core::{Identity, PeerId};
use iota_wire::MbRef;
use iota_wire::pb;

use super::World;
use super::adversary::SimAdversary;
use super::validator_state::slice_hash;
use crate::orchestrator::{Event, Ms};
use crate::validation::round::CheckJob;

/// The hash a lying owner reports for every partition it owns.
const LIE: [u8; 32] = [0xee; 32];

impl World {
    fn mode(&self, i: usize) -> Option<SimAdversary> {
        self.miners[i].mode
    }

    fn mode_of(&self, p: &PeerId) -> Option<SimAdversary> {
        self.index.get(p).and_then(|&i| self.miners[i].mode)
    }

    /// A pathway through an unreliable miner: its neighbours' reports of
    /// it (or its reports of them), and whether the pathway still
    /// finishes. Returns the extra time a slow member takes, or None when
    /// the pathway fails.
    pub(super) fn pathway_faults(&mut self, path: &[usize], mb: MbRef, r: &pb::Route) -> Option<Ms> {
        use SimAdversary::*;
        let overdue = if r.overdue_ms > 0 { r.overdue_ms } else { 15_000 };
        let mut extra = 0;
        for (p, &i) in path.iter().enumerate() {
            let (up, down) = (p.checked_sub(1).map(|q| path[q]), path.get(p + 1).copied());
            let report =
                |reporter: usize, named: usize, failure: pb::Failure, after: Ms| (reporter, named, failure, after);
            let fail = match self.mode(i) {
                // It never sends: the one waiting on its output says so
                // (at the tail, its upstream's frame is never taken).
                Some(Silent) => match down {
                    Some(d) => report(d, i, pb::Failure::NoInput, overdue),
                    None => report(up.unwrap_or(i), i, pb::Failure::Unreachable, 3_000),
                },
                // Its port refuses: the sender knows at once.
                Some(Closed) => match up {
                    Some(u) => report(u, i, pb::Failure::Unreachable, self.cfg.stage_ms),
                    None => report(down.unwrap_or(i), i, pb::Failure::NoInput, overdue),
                },
                Some(Slow) => {
                    extra += 18 * self.cfg.stage_ms;
                    continue;
                }
                // It drops 30% of the frames it gets: it and the one
                // after it wait, each on the other's side of it.
                Some(Flaky) if self.rng.below(10) < 3 => match (up, down) {
                    (Some(u), Some(d)) => {
                        self.peer_failed(d, i, (mb, r.attempt), pb::Failure::NoInput, overdue);
                        report(i, u, pb::Failure::NoInput, overdue)
                    }
                    (Some(u), None) => report(i, u, pb::Failure::NoInput, overdue),
                    (None, Some(d)) => report(i, d, pb::Failure::NoInput, overdue),
                    (None, None) => continue,
                },
                // It sends nothing on and calls its neighbour unreachable.
                Some(HostileUnreachable) => match down.or(up) {
                    Some(n) => report(i, n, pb::Failure::Unreachable, self.cfg.stage_ms),
                    None => continue,
                },
                _ => continue,
            };
            let (reporter, named, failure, after) = fail;
            if reporter != named {
                self.peer_failed(reporter, named, (mb, r.attempt), failure, after);
            }
            return None;
        }
        Some(extra)
    }

    fn peer_failed(
        &mut self,
        reporter: usize,
        named: usize,
        (mb, attempt): (MbRef, u32),
        failure: pb::Failure,
        after: Ms,
    ) {
        let (peer, named) = (self.miners[reporter].peer, self.miners[named].peer);
        let ev = Event::PeerFailed { peer, mb, attempt, named, failure };
        self.send_after(reporter, after, ev);
    }

    /// What owner `i` reports of partition `k`: its `SliceDone`, or,
    /// where a withholder kept its contribution from it, which senders
    /// it misses.
    pub(super) fn slice_report(&mut self, i: usize, plan: &MergePlan, k: usize) -> Event {
        use SimAdversary::*;
        let me = self.miners[i].peer;
        let partition = &plan.partitions[k];
        let others = || plan.participants.iter().map(|q| q.peer).filter(move |q| *q != me);
        let withheld: Vec<PeerId> = others()
            .filter(|q| self.mode_of(q) == Some(Withholder) && withheld_partition(plan, q) == Some(k))
            .collect();
        if !withheld.is_empty() && partition.generation == 0 {
            return Event::ContributionsMissing {
                peer: me,
                epoch: plan.epoch,
                stage: plan.stage,
                partition: k as u32,
                generation: partition.generation,
                senders: withheld,
            };
        }
        // Owners flag a pseudo-gradient with a NaN or far too large.
        let flagged = others().filter(|q| matches!(self.mode_of(q), Some(Nan | MergeGarbage))).collect();
        // The signed headers of what it reduced, for the senders whose
        // frames a validator or a co-owner could hold against it.
        let first = partition.owners.first() == Some(&me);
        let at = ((plan.epoch, plan.stage), (k as u32, partition.offset));
        let contributions = others()
            .filter_map(|q| match self.mode_of(&q)? {
                MergeEquivocate => Some(self.contribution_header(q, at.0, at.1, if first { 1 } else { 3 })),
                FramingSender => Some(self.contribution_header(q, at.0, at.1, 1)),
                _ => None,
            })
            .collect();
        let hash = match self.mode(i) {
            Some(LyingOwner | RefereeCollusion) => LIE,
            _ => slice_hash(k as u32),
        };
        Event::SliceDone {
            peer: me,
            epoch: plan.epoch,
            stage: plan.stage,
            partition: k as u32,
            generation: partition.generation,
            hash: hash.to_vec(),
            contributions,
            flagged,
        }
    }

    /// The hash of its merged weights miner `i` reports (`honest`, unless
    /// it lies about it).
    pub(super) fn merged_report(&self, i: usize, honest: [u8; 32]) -> [u8; 32] {
        match self.mode(i) {
            Some(SimAdversary::MergeLie) => [0x1e; 32],
            _ => honest,
        }
    }

    /// A participant's signed header for its contribution to partition
    /// `k` at `offset` of a merge (`scale` names the payload: 1 the true
    /// one, 3 tripled).
    pub(super) fn contribution_header(
        &self,
        sender: PeerId,
        (epoch, stage): (u64, u32),
        (k, offset): (u32, u64),
        scale: u8,
    ) -> Vec<u8> {
        let Some(&i) = self.index.get(&sender) else { return Vec::new() };
        let id = Identity::from_seed(self.miners[i].seed);
        let mut payload_hash = slice_hash(k);
        payload_hash[31] = scale;
        let mut h = FrameHeader {
            version: PROTOCOL_VERSION,
            direction: Direction::WeightSlice,
            codec: iota_core::WireCodec::Int8Row.id(),
            ndim: 2,
            stage: stage as u16,
            run_id: self.o.spec().run_id,
            epoch: epoch as u32,
            shard: k,
            first_sample: offset,
            samples: 0,
            attempt: 0,
            seq_no: 1,
            shape: [1, 256, 0, 0],
            payload_len: 260,
            payload_hash,
            answers: [0; 32],
            sender: [0; 32],
            signature: [0; 64],
        };
        h.sign(&id);
        header_bytes(&h)
    }

    /// What a validator's recompute of `job`'s evidence finds: the
    /// reason it fails, as the real check words it, where the miner's
    /// mode cheats on its stage; Ok for everyone else. The inner-step
    /// cheats show only in an attempt asked with its steps.
    pub(super) fn recompute(&self, job: &CheckJob) -> Result<(), String> {
        use SimAdversary::*;
        let Some(mode) = self.mode_of(&job.miner) else { return Ok(()) };
        match compute_fault(mode, job.stage, self.cfg.stages) {
            Some(_) if matches!(mode, SkipWeightGrad | SkipOptimizer | SkipBackward) && !job.inner_step => Ok(()),
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    }

    /// Whether miner `i` stores its contribution when an audit asks, and
    /// whether the one it stores is the one it sent.
    pub(super) fn stores_contribution(&self, i: usize) -> (bool, bool) {
        match self.mode(i) {
            Some(SimAdversary::Withholder) => (false, false),
            Some(SimAdversary::FramingSender) => (true, false),
            _ => (true, true),
        }
    }

    /// A participant whose stored contribution is not the slice of the
    /// weights it committed to (what the contribution audit finds).
    pub(super) fn unbound(&self, p: &PeerId) -> bool {
        use SimAdversary::*;
        matches!(self.mode_of(p), Some(ScaledPoison | CopyPartner | NegatePartner))
    }

    /// A miner whose report of its merged weights a validator finds false.
    pub(super) fn lies_about_merge(&self, p: &PeerId) -> bool {
        self.mode_of(p) == Some(SimAdversary::MergeLie)
    }

    /// A participant the owners flag (its contribution is not finite or
    /// far too large).
    pub(super) fn flaggable(&self, p: &PeerId) -> bool {
        matches!(self.mode_of(p), Some(SimAdversary::Nan | SimAdversary::MergeGarbage))
    }
}

/// The partition a withholder keeps its contribution from: the first one
/// it does not own.
fn withheld_partition(plan: &MergePlan, sender: &PeerId) -> Option<usize> {
    plan.partitions.iter().position(|p| !p.owners.contains(sender))
}

/// The recompute's finding against `mode` on `stage` of `stages` (None:
/// the mode computes honestly there, or cheats elsewhere than in its
/// forward and backward).
pub(super) fn compute_fault(mode: SimAdversary, stage: u32, stages: u32) -> Option<&'static str> {
    use SimAdversary::*;
    let (head, tail) = (stage == 0, stage + 1 == stages);
    let middle = !head && !tail;
    Some(match mode {
        Noise | Zeros | Replay if tail => "recomputed gradient differs",
        Noise | Zeros | Replay => "recomputed output differs",
        Copy if middle => "recomputed output differs",
        GradNoise if middle => "recomputed upstream gradient differs",
        Lazy if middle => "recomputed upstream gradient differs",
        Lazy if tail => "recomputed gradient differs",
        LossLie if tail => "reported loss differs from the recomputed one",
        FabricatedEvidence if head => "the received gradient does not answer the output frame",
        FabricatedEvidence => "the gradient frame it showed is not the one its upstream neighbour received",
        SkipWeightGrad | SkipOptimizer | SkipBackward => "inner step: recomputed, the step reaches other weights",
        _ => return None,
    })
}
