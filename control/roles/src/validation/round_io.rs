//! What a validator's round asks of its shell: the checks to run and the
//! messages to send (`round::ValidatorCore`'s output).

use std::collections::BTreeMap;

use iota_core::PeerId;
use iota_core::commitment::EpochHeads;
use iota_wire::StoredObject;

/// An attempt: (shard, first sample, attempt).
pub type WorkKey = (u32, u64, u32);

/// What the shell must check: one evidence object against what the
/// validator knows of the attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckJob {
    pub epoch: u64,
    pub miner: PeerId,
    pub stage: u32,
    pub key: WorkKey,
    pub samples: u32,
    /// The upstream neighbour on the attempt's pathway (None at the head).
    pub upstream: Option<PeerId>,
    /// The downstream neighbour on it (None at the tail).
    pub downstream: Option<PeerId>,
    pub heads: EpochHeads,
    /// The device the miner registered with.
    pub device: String,
    /// The merged weights the stage started the epoch from (None: the run
    /// seed's initial weights, epoch 0), as the orchestrator recorded them
    /// from the merge's participants.
    pub epoch_start: Option<[u8; 32]>,
    /// The same, as this validator computed them from the stored merge it
    /// evaluated (None where it did not): a start too, whatever the
    /// participants reported.
    pub merged_start: Option<[u8; 32]>,
    /// The tail: the mean loss it reported for the attempt (None for the
    /// other stages).
    pub reported_loss: Option<f32>,
    pub object: StoredObject,
    /// The miner's completed attempts of the epoch and their pathways, and
    /// the miners of the stages around its (what a shown inner step's
    /// micro-batches and their frames are held against).
    pub completed: std::sync::Arc<BTreeMap<WorkKey, Vec<PeerId>>>,
    /// (Shared by the round's checks: a stage of R miners, once.)
    pub upstream_miners: std::sync::Arc<Vec<PeerId>>,
    pub downstream_miners: std::sync::Arc<Vec<PeerId>>,
    /// The miner's steps chain of the epoch before, as the orchestrator
    /// holds it (None: it holds none).
    pub previous_steps: Option<iota_core::commitment::Chain>,
    /// The attempt whose inner steps this validator checks (one per miner
    /// a round): its object shows them.
    pub inner_step: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Ask {
        epoch: u64,
        miner: PeerId,
        items: Vec<WorkKey>,
        /// One of `items`, asked with the inner steps it went into.
        inner_step: Option<WorkKey>,
        /// With `inner_step` (the only item): the step whose signed trace
        /// is asked (its recompute failed).
        trace: Option<u32>,
    },
    Check(Box<CheckJob>),
    /// Prove the failed step of `job` with the miner's trace.
    Prove(Box<ProveJob>),
    Vote {
        epoch: u64,
        miner: PeerId,
        guilty: bool,
        samples: u32,
        evidence_hash: Option<[u8; 32]>,
        reason: String,
        /// Guilty on a proof (`iota_core::frame_equivocation`): the two
        /// headers; empty otherwise.
        proof: Vec<Vec<u8>>,
        /// Guilty on a failed inner step proven (`StepProof::encode`);
        /// empty otherwise.
        step_proof: Vec<u8>,
    },
    /// The round is over; `weights` rate the epoch's miners in the order
    /// of its work (empty: abstaining), `miners_hash` names that order
    /// (`sample::work_miners_hash`).
    Done {
        epoch: u64,
        weights: Vec<f32>,
        miners_hash: [u8; 32],
    },
}

/// What the shell must prove: the step `step` of the step object `job`
/// checked (whose recompute failed), against the miner's signed `trace`
/// (an object the orchestrator handed on).
#[derive(Clone, Debug, PartialEq)]
pub struct ProveJob {
    pub job: CheckJob,
    pub step: u32,
    pub trace: StoredObject,
}

/// A step object's failed step, waiting for the miner's trace of it
/// (`round::traces`).
pub(super) struct TraceWait {
    pub(super) job: Box<CheckJob>,
    pub(super) step: u32,
    /// The check's finding (the vote's reason).
    pub(super) reason: String,
    /// When the round first saw the ask out (its next tick).
    pub(super) asked_ms: Option<u64>,
    /// The trace came and is being proven.
    pub(super) proving: bool,
}
