//! What the orchestrator's state machine is fed: one `Event` a step.

use iota_core::PeerId;
use iota_core::commitment::EpochHeads;
use iota_wire::{MbRef, StoredObject, pb};

use super::state::MemoryStated;
use super::validation_state::{VerdictIn, WorkKey};

/// Something that happened, as the orchestrator sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Register {
        peer: PeerId,
        addr: String,
        tokens_per_s: f64,
        device: String,
        /// The memory it states and what it computes with (0: not stated).
        memory: MemoryStated,
    },
    /// `in_flight`: micro-batches the miner says it holds (its own count).
    Heartbeat {
        peer: PeerId,
        tokens_per_s: f64,
        in_flight: u32,
        /// Its commitment heads (checked by `fields::heartbeat`).
        commitments: Vec<EpochHeads>,
    },
    /// The miner opened its command stream (the service delivers what this
    /// returns on it).
    Subscribed {
        peer: PeerId,
    },
    Loss {
        peer: PeerId,
        mb: MbRef,
        attempt: u32,
        loss: f32,
        tokens: u32,
    },
    BackwardDone {
        peer: PeerId,
        mb: MbRef,
        attempt: u32,
    },
    /// `peer` names its neighbour `named` on `mb`'s pathway as the one
    /// that failed this attempt.
    PeerFailed {
        peer: PeerId,
        mb: MbRef,
        attempt: u32,
        named: PeerId,
        failure: pb::Failure,
    },
    UploadDone {
        peer: PeerId,
        epoch: u64,
        stage: u32,
        key: String,
        work: u64,
        /// Parameter server: the uploaded object.
        object: Option<StoredObject>,
        /// Its commitment heads, final for the epoch's training.
        commitments: Vec<EpochHeads>,
    },
    MergeDone {
        peer: PeerId,
        epoch: u64,
        stage: u32,
        key: String,
        weights_hash: Vec<u8>,
        /// Parameter server: the merged object.
        object: Option<StoredObject>,
        /// Butterfly: slices it read from the store (contributions,
        /// merged updates) instead of over the data plane.
        from_store: (u32, u32),
    },
    /// A butterfly writer stored a merged slice or its momentum.
    Stored {
        peer: PeerId,
        epoch: u64,
        stage: u32,
        object: StoredObject,
    },
    /// A reader found an object that does not match its announcement.
    BadObject {
        peer: PeerId,
        epoch: u64,
        stage: u32,
        object: StoredObject,
        reason: String,
    },
    SliceDone {
        peer: PeerId,
        epoch: u64,
        stage: u32,
        partition: u32,
        generation: u32,
        hash: Vec<u8>,
        /// Archived signed headers of the contributions the owner reduced.
        contributions: Vec<Vec<u8>>,
        /// Participants whose contribution it flagged.
        flagged: Vec<PeerId>,
    },
    /// An owner of a butterfly partition misses these senders'
    /// contributions (`withholding.rs`).
    ContributionsMissing {
        peer: PeerId,
        epoch: u64,
        stage: u32,
        partition: u32,
        generation: u32,
        senders: Vec<PeerId>,
    },
    /// One of the run's validators registered.
    RegisterValidator {
        peer: PeerId,
        device: String,
    },
    /// A validator asks for the evidence of a miner's attempts, and of
    /// `inner_step` (one of them) also the inner steps it went into.
    EvidenceAsk {
        validator: PeerId,
        epoch: u64,
        miner: PeerId,
        items: Vec<WorkKey>,
        inner_step: Option<WorkKey>,
        /// The attempt (asked alone) and the inner step whose signed trace
        /// is asked (`WorkRef.trace_step`).
        trace: Option<(WorkKey, u32)>,
    },
    Verdict(VerdictIn),
    /// A validator's recompute of an audited merge partition: the hash of
    /// its update (None: it could not), and who withheld a contribution.
    MergeAudit {
        validator: PeerId,
        epoch: u64,
        stage: u32,
        partition: u32,
        generation: u32,
        hash: Option<[u8; 32]>,
        missing: Vec<PeerId>,
        /// With a hash: the senders its reduce flagged.
        flagged: Vec<PeerId>,
        /// Archived headers of stored contributions that contradict what
        /// the owners reported reducing (proofs against their senders).
        contradicting: Vec<Vec<u8>>,
        /// With a hash: participants whose stored contribution is not the
        /// slice of their committed weights (`iota_checks::contribution`).
        unbound: Vec<PeerId>,
        reason: String,
    },
    /// A validator's judgement of `epoch`'s merged model.
    MergeVote {
        validator: PeerId,
        epoch: u64,
        rollback: bool,
        loss: f32,
        reason: String,
        /// Each stage's hash of the merged weights as the validator loaded
        /// them (none if it could not).
        merged: Vec<(u32, [u8; 32])>,
    },
    /// A validator voted on everything it drew for `epoch`; `weights` (one
    /// per miner of the epoch's work, or none) rate them for settlement.
    ValidationDone {
        validator: PeerId,
        epoch: u64,
        weights: Vec<f32>,
        /// The signed request's `miners_hash` (with weights: required).
        miners_hash: Option<[u8; 32]>,
        /// The validator's whole signed request (kept in the ledger with
        /// its weights).
        signed: Vec<u8>,
    },
    Tick,
}
