//! The orchestrator's validation records (see `validating.rs` for what
//! drives them): the run's validators, the current round, the verdicts.

use std::collections::{BTreeMap, BTreeSet};

use iota_core::PeerId;
use iota_wire::{StoredObject, pb};
use serde::{Deserialize, Serialize};

pub use crate::validation::quorum::{Check, Quorum};

type Ms = u64;

/// Verdicts kept on record (the oldest go first).
pub const MAX_VERDICT_RECORDS: usize = 16_384;
/// Largest signed request kept with a verdict: an honest `Validate(Verdict)`
/// envelope is under 1 KiB (ids, a hash, a reason of at most 256 bytes).
pub const MAX_SIGNED_VERDICT: usize = 4096;
/// Proofs of merge equivocation a run keeps (each a few hundred bytes).
pub const MAX_EQUIVOCATION_RECORDS: usize = 256;
/// Attempts of one miner listed in an `EpochWork`.
pub const MAX_WORK_ITEMS: usize = 65_536;

/// A micro-batch attempt of the round's epoch: (shard, first sample, attempt).
pub type WorkKey = (u32, u64, u32);

/// A validator of the run, as registered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValidatorState {
    pub peer: PeerId,
    pub stake: u64,
    pub device: String,
    pub subscribed: bool,
    pub last_seen_ms: Ms,
}

/// One validator's vote, as the orchestrator recorded it.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictRecord {
    pub epoch: u64,
    pub miner: PeerId,
    pub validator: PeerId,
    pub check: Check,
    pub guilty: bool,
    /// Attempts the validator judged.
    pub samples: u32,
    /// BLAKE3 over the hashes of the evidence objects it judged.
    pub evidence_hash: Option<[u8; 32]>,
    pub reason: String,
    pub at_ms: Ms,
    /// The validator's signed request that carried the vote (a protobuf
    /// `Signed`): anyone holding the validator's key can check it.
    pub signed: Vec<u8>,
}

/// Short enough for a failed test's message to show every vote whole: the
/// signed request is its size, the evidence hash a prefix.
impl std::fmt::Debug for VerdictRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = |h: &[u8]| h.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>();
        f.debug_struct("VerdictRecord")
            .field("epoch", &self.epoch)
            .field("miner", &self.miner)
            .field("validator", &self.validator)
            .field("check", &self.check)
            .field("guilty", &self.guilty)
            .field("samples", &self.samples)
            .field("evidence_hash", &self.evidence_hash.map(|h| short(&h)))
            .field("reason", &self.reason)
            .field("at_ms", &self.at_ms)
            .field("signed", &format_args!("{} bytes", self.signed.len()))
            .finish()
    }
}

/// A vote as the service hands it over.
#[derive(Clone, Debug, PartialEq)]
pub struct VerdictIn {
    pub validator: PeerId,
    pub epoch: u64,
    pub miner: PeerId,
    pub check: Check,
    pub guilty: bool,
    pub samples: u32,
    pub evidence_hash: Option<[u8; 32]>,
    pub reason: String,
    pub signed: Vec<u8>,
    /// Guilty on a proof: two archived headers (`FrameEquivocation`), or
    /// empty.
    pub proof: Vec<Vec<u8>>,
    /// Guilty on a failed inner step proven: the hash of the validator's
    /// stored `StepProof`, set by the shell only once it re-checked the
    /// proof and found it holds (`verify_step_proof`).
    pub step_proven: Option<[u8; 32]>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Round {
    pub(super) epoch: u64,
    pub(super) started_ms: Ms,
    /// Validators the work went to: each is waited for while it is live.
    pub(super) sent_to: BTreeSet<PeerId>,
    pub(super) done: BTreeSet<PeerId>,
    /// Per miner and attempt: the validators that asked for its evidence.
    #[serde(with = "crate::serde_pairs")]
    pub(super) asked: BTreeMap<(PeerId, WorkKey), BTreeSet<PeerId>>,
    /// The evidence objects miners announced.
    #[serde(with = "crate::serde_pairs")]
    pub(super) evidence: BTreeMap<(PeerId, WorkKey), StoredObject>,
    /// Per miner and attempt: the validators that asked for it with its
    /// inner steps (a subset of `asked`'s), and the objects that show them.
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) step_asked: BTreeMap<(PeerId, WorkKey), BTreeSet<PeerId>>,
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) step_evidence: BTreeMap<(PeerId, WorkKey), StoredObject>,
    /// Per miner, attempt and inner step: the validators that asked for
    /// the miner's signed trace of that step (one per miner and validator
    /// a round), and the objects that hold the traces.
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) trace_asked: BTreeMap<(PeerId, WorkKey, u32), BTreeSet<PeerId>>,
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) trace_evidence: BTreeMap<(PeerId, WorkKey, u32), StoredObject>,
    pub(super) timed_out: bool,
    /// How long the round may take: `validation.timeout_ms` plus the time
    /// the largest draw takes to upload (0: a round saved before it
    /// existed, `validation.timeout_ms`).
    #[serde(default)]
    pub(super) timeout_ms: Ms,
    /// The miners of the round's `EpochWork`, in its order.
    #[serde(default)]
    pub(super) miners: Vec<PeerId>,
    /// Each validator's weights over `miners` (sent with ValidationDone).
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) weights: BTreeMap<PeerId, Vec<f32>>,
    /// The signed requests that carried them.
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) signed_weights: BTreeMap<PeerId, Vec<u8>>,
    /// Per validator, the round's miners it voted on after judging their
    /// sampled work (a `Recompute` verdict of at least one attempt): what
    /// it is paid for (`settling.rs`).
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) verified: BTreeMap<PeerId, BTreeSet<PeerId>>,
}

/// The check of an epoch's merged model (see `validating.rs`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct MergeRound {
    pub(super) epoch: u64,
    pub(super) started_ms: Ms,
    pub(super) sent_to: BTreeSet<PeerId>,
    pub(super) voted: BTreeSet<PeerId>,
    /// The held-out losses the voters measured (one per voter).
    #[serde(default)]
    pub(super) losses: Vec<f32>,
    /// Each voter's hash of each stage's merged weights, as it loaded them
    /// (one entry per voter, its stages checked against the run's).
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) merged: BTreeMap<PeerId, BTreeMap<u32, [u8; 32]>>,
}

/// The orchestrator's validation records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Validation {
    pub(super) quorum: Option<Quorum>,
    /// Votes on merged models: guilty = roll back (strikes unused).
    #[serde(default)]
    pub(super) merge_quorum: Option<Quorum>,
    #[serde(default)]
    pub(super) merge_round: Option<MergeRound>,
    pub(super) validators: BTreeMap<PeerId, ValidatorState>,
    pub(super) round: Option<Round>,
    pub(super) verdicts: Vec<VerdictRecord>,
    /// What each record of `verdicts` is about, (epoch, miner, validator,
    /// check): a repeat vote is found without a scan of every record
    /// (rebuilt after a load, `verdict_recorded`).
    #[serde(skip)]
    pub(super) verdict_keys: std::collections::BTreeSet<(u64, PeerId, PeerId, Check)>,
    /// Proofs of merge equivocation, the latest `MAX_EQUIVOCATION_RECORDS`.
    #[serde(default)]
    pub(super) equivocations: Vec<iota_core::merge::Equivocation>,
    /// Proofs validators handed in of pipeline frames a miner signed twice
    /// for one attempt and direction, the latest `MAX_EQUIVOCATION_RECORDS`.
    #[serde(default)]
    pub(super) frame_equivocations: Vec<iota_core::frame_equivocation::FrameEquivocation>,
    /// Proofs of failed inner steps validators stored and the shell
    /// re-checked, the latest `MAX_EQUIVOCATION_RECORDS`.
    #[serde(default)]
    pub(super) step_proofs: Vec<crate::settlement::ledger::StepProofRecord>,
    /// The hash of the merged weights each stage started the current epoch
    /// from (none in epoch 0: the run seed's).
    pub(super) starts: BTreeMap<u32, [u8; 32]>,
    /// `starts` as it stood in the epoch before (a sparse sender's backlog
    /// is held against its contribution then).
    #[serde(default)]
    pub(super) starts_before: BTreeMap<u32, [u8; 32]>,
    /// Merge audits in progress (merge_audit.rs).
    #[serde(default)]
    pub(super) merge_audits: Vec<OpenAudit>,
    /// Per participant, the merge (epoch, stage) and partitions whose
    /// contributions audits opened since the last tick ask it to store: one
    /// request a tick each, not one per audit (`flush_contribution_requests`).
    #[serde(default, with = "crate::serde_pairs")]
    pub(super) contribution_requests: BTreeMap<PeerId, ((u64, u32), BTreeSet<u32>)>,
    /// Per validator and stage, the id of the last `MergeAuditContext` sent
    /// it: audits of the same plan go without it. Forgotten when the
    /// validator subscribes again and after a restart (its stream is new:
    /// the context is sent again).
    #[serde(skip)]
    pub(super) audit_contexts_sent: BTreeMap<(PeerId, u32), Vec<u8>>,
    /// Per stage, the last audit context built and what it was built from
    /// (epoch, plan revision, weights epoch, commitment changes).
    #[serde(skip)]
    pub(super) audit_context_cache: BTreeMap<u32, AuditContextKey>,
}

/// An audit context and what it was built from (merge_audit.rs).
// Shared, not cloned: every audit of a merge (about R a stage) reads it.
pub(super) type AuditContextKey = ((u64, u64, Option<u64>, u64), std::sync::Arc<pb::MergeAuditContext>);

impl Validation {
    pub(super) fn new(spec: &iota_wire::ValidationSpec) -> Validation {
        let stakes = || spec.validators.iter().map(|v| (v.peer, v.stake)).collect();
        let some = !spec.validators.is_empty();
        let quorum = some.then(|| Quorum::new(stakes(), spec.strikes_to_eject));
        let merge_quorum = some.then(|| Quorum::new(stakes(), u32::MAX));
        Validation { quorum, merge_quorum, ..Validation::default() }
    }
}

/// One validator's answer to a merge audit (merge_audit.rs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum AuditAnswer {
    /// The hash of the update it recomputed, and the senders its reduce
    /// flagged (`merge::flaws`).
    Hash([u8; 32], Vec<PeerId>),
    /// It could not recompute: these participants' contributions were not
    /// stored (or not theirs) in time.
    Missing(Vec<PeerId>),
    /// It could not recompute for another reason (the momentum, say).
    Unable,
}

/// An audit in progress.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct OpenAudit {
    pub(super) epoch: u64,
    pub(super) stage: u32,
    pub(super) partition: u32,
    pub(super) generation: u32,
    /// An audit of two owners' flags (`MergeOut::AuditFlags`) rather than
    /// of an owner pair's agreed result.
    #[serde(default)]
    pub(super) flags: bool,
    /// An audit of owners' claims that these senders withheld their
    /// contribution (`withholding.rs`): the recompute says whether each
    /// one's is stored.
    #[serde(default)]
    pub(super) withheld: Vec<PeerId>,
    /// When it was opened (set by the first `advance` after it).
    pub(super) since: Option<Ms>,
    pub(super) sent_to: Vec<PeerId>,
    pub(super) answers: BTreeMap<PeerId, AuditAnswer>,
    /// Per validator, the participants it found unbound (their stored
    /// contribution is not the slice of their committed weights).
    #[serde(default)]
    pub(super) unbound: BTreeMap<PeerId, Vec<PeerId>>,
}
