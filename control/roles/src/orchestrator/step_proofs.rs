//! Proofs of failed inner steps at the orchestrator (PROTOCOL.md, "A
//! failed step as a proof"): where a validator may store one, what its
//! re-check is held against, and the record a conviction on one keeps
//! (for the ledger, which re-checks it).

use iota_core::PeerId;
use iota_wire::store_keys::step_proof_key;
use tracing::warn;

use super::Orchestrator;
use super::validation_state::MAX_EQUIVOCATION_RECORDS;
use crate::settlement::ledger::StepProofRecord;

/// Pushes `x` onto `v` unless it is there, keeping the latest
/// `MAX_EQUIVOCATION_RECORDS`; whether it was new.
pub(super) fn push_latest<T: PartialEq>(v: &mut Vec<T>, x: T) -> bool {
    if v.contains(&x) {
        return false;
    }
    if v.len() >= MAX_EQUIVOCATION_RECORDS {
        v.remove(0);
    }
    v.push(x);
    true
}

impl Orchestrator {
    /// Whether `peer` (a validator) may write `key`: its proof of a failed
    /// inner step of a miner whose trace it asked this round.
    pub(super) fn may_write_step_proof(&self, peer: &PeerId, key: &str) -> bool {
        let Some(r) = self.validation.round.as_ref() else { return false };
        self.is_validator(peer)
            && r.trace_asked.iter().any(|((m, _, _), vs)| vs.contains(peer) && step_proof_key(r.epoch, peer, m) == key)
    }

    /// What a referee of a step proof against `miner` for `epoch` needs
    /// from the run: its stage, its committed steps chain, and the miners
    /// of the stages around its (the frames a proof shows must be signed by
    /// one of them). None: no such miner or heads.
    pub fn step_referee_inputs(&self, epoch: u64, miner: &PeerId) -> Option<StepRefereeInputs> {
        let m = self.miners.get(miner)?;
        let steps = m.commitments.get(&epoch)?.steps;
        let at = |stage: Option<u32>| -> Vec<PeerId> {
            stage.map_or_else(Vec::new, |s| self.miners.values().filter(|o| o.stage == s).map(|o| o.peer).collect())
        };
        Some(StepRefereeInputs {
            stage: m.stage,
            steps,
            upstream: at(m.stage.checked_sub(1)),
            downstream: at(m.stage.checked_add(1)),
        })
    }

    /// Keeps the record of a conviction on a re-checked step proof
    /// (`hash`) and counts it once.
    pub(super) fn record_step_proof(&mut self, (epoch, miner, validator): (u64, PeerId, PeerId), hash: [u8; 32]) {
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        let (stage, steps, upstream, downstream) = self
            .step_referee_inputs(epoch, &miner)
            .map(|i| (i.stage, i.steps, i.upstream, i.downstream))
            .unwrap_or_default();
        let record = StepProofRecord { epoch, miner, validator, hash: hex, stage, steps, upstream, downstream };
        if push_latest(&mut self.validation.step_proofs, record) {
            self.counters.step_proofs += 1;
            warn!(epoch, miner = %miner, validator = %validator, "proven: a failed inner step");
        }
    }
}

/// What `step_referee_inputs` gives.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRefereeInputs {
    pub stage: u32,
    pub steps: iota_core::commitment::Chain,
    pub upstream: Vec<PeerId>,
    pub downstream: Vec<PeerId>,
}
