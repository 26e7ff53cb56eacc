//! The orchestrator's records.

use std::collections::BTreeMap;

use iota_core::PeerId;
use iota_core::commitment::EpochHeads;
use iota_wire::MbRef;
use iota_wire::StoredObject;
use serde::{Deserialize, Serialize};

use iota_wire::pb;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Waiting,
    Training,
    Uploading,
    Merging,
    Done,
}

impl Phase {
    pub fn to_pb(&self) -> pb::Phase {
        match self {
            Phase::Waiting => pb::Phase::Waiting,
            Phase::Training => pb::Phase::Training,
            Phase::Uploading => pb::Phase::Uploading,
            Phase::Merging => pb::Phase::Merging,
            Phase::Done => pb::Phase::Done,
        }
    }
}

/// A hedge: the same micro-batch issued again, on a pathway sharing no
/// miner with the first attempt's, while the first is still out. Whichever
/// completes first completes the micro-batch; the other is cancelled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hedge {
    pub attempt: u32,
    pub pathway: Vec<PeerId>,
    pub deadline_ms: u64,
    pub loss: Option<f32>,
    pub backward_done: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MbStatus {
    InFlight {
        attempt: u32,
        pathway: Vec<PeerId>,
        deadline_ms: u64,
        loss: Option<f32>,
        backward_done: bool,
        /// Failed attempts nobody could be blamed for (these count toward
        /// `max_attempts`; failures pinned on a miner do not).
        #[serde(default)]
        strikes: u32,
        /// `NO_INPUT` reports of this attempt: (reporter, the neighbour it waits on).
        #[serde(default)]
        waiting: Vec<(PeerId, PeerId)>,
        /// When the first of them arrived.
        #[serde(default)]
        waiting_since: Option<u64>,
        /// Issued before any live miner had delivered, so its route told
        /// the pathway's miners the ceiling overdue time (see
        /// `reissue_unmeasured`).
        #[serde(default)]
        unmeasured: bool,
        /// A second attempt on a disjoint pathway, issued near the epoch's
        /// end while this one is late (see hedging.rs).
        #[serde(default)]
        hedge: Option<Hedge>,
        /// The highest attempt number issued for this micro-batch (a
        /// dropped hedge's included), so none is issued twice.
        #[serde(default)]
        last_attempt: u32,
    },
    Done {
        loss: f32,
        /// The attempt that completed, and its pathway (what validators
        /// sample; absent in states saved before validation).
        #[serde(default)]
        attempt: u32,
        #[serde(default)]
        pathway: Vec<PeerId>,
    },
    Dropped,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct MbRecord {
    pub seq: u64,
    pub mb: MbRef,
    pub samples: u32,
    pub status: MbStatus,
    /// The tokens its tail reported with a loss: counted as trained when
    /// the micro-batch completes, once, whichever attempt completes it (an
    /// attempt that reported a loss and was then re-issued trained
    /// nothing).
    #[serde(default)]
    pub tokens: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinerState {
    pub peer: PeerId,
    pub index: u32,
    pub addr: String,
    pub stage: u32,
    pub healthy: bool,
    /// It has opened its command stream at least once. Until it does it is
    /// a claim, not a miner: not counted, not routed, not announced to
    /// peers, and forgotten after `registration_timeout_ms`.
    #[serde(default = "yes")]
    pub subscribed: bool,
    /// When it registered (ms).
    #[serde(default)]
    pub registered_ms: u64,
    /// Registered (or came back) mid-epoch: holds no current weights, so it
    /// carries no micro-batches until the next epoch starts from the merge.
    pub joining: bool,
    pub last_seen_ms: u64,
    pub tokens_per_s: f64,
    /// What it computes on, as it says (`cpu`, `cuda:0 (bf16 gemms)`).
    #[serde(default)]
    pub device: String,
    /// Micro-batches routed through it and not finished (the orchestrator's count).
    pub in_flight: u32,
    /// The same, as the miner last reported it.
    #[serde(default)]
    pub reported_in_flight: u32,
    /// Micro-batches it helped complete this epoch (weights the merge).
    pub work: u64,
    /// Micro-batches whose failure was pinned on it this epoch, and those
    /// it reported a neighbour UNREACHABLE on that nobody bore out (for
    /// routing only: they do not bench it).
    #[serde(default)]
    pub failures: u32,
    /// Failures pinned on it since its last delivery.
    #[serde(default)]
    pub failures_in_a_row: u32,
    /// Out of routing, merging and phase waits for the rest of the epoch.
    #[serde(default)]
    pub benched: bool,
    /// Epochs in which it was benched.
    #[serde(default)]
    pub benched_epochs: u32,
    /// Removed from the run (benched in too many epochs): never routed
    /// again, and its registrations are refused.
    #[serde(default)]
    pub removed: bool,
    /// At most one micro-batch in flight until it delivers one (new
    /// miners, and benched ones coming back).
    #[serde(default)]
    pub probation: bool,
    /// Micro-batches completed through it, over the run.
    #[serde(default)]
    pub delivered: u64,
    /// Measured: moving average of the time from issue to completion of
    /// the micro-batches it took part in (ms; 0 before the first).
    #[serde(default)]
    pub latency_ms: f64,
    /// The same average over deliveries only, failed attempts' penalties
    /// left out: how long its work takes when it works, which sets how long
    /// its neighbours wait before reporting it overdue.
    #[serde(default)]
    pub delivery_ms: f64,
    /// Validators convicted its work of the current epoch: out of the
    /// epoch's merge, its work counted as zero.
    #[serde(default)]
    pub convicted: bool,
    /// Epochs whose work validators convicted, over the run.
    #[serde(default)]
    pub convicted_epochs: u32,
    /// A conviction suspends the miner through the next epoch: the damage
    /// a cheater does between its conviction and its ejection stays small.
    #[serde(default)]
    pub suspended_through: Option<u64>,
    /// Ejected by validators (too many convictions): removed, and its
    /// identity refused.
    #[serde(default)]
    pub ejected: bool,
    /// The heads of its commitment chains, as last reported, per epoch
    /// (the current and the previous one).
    #[serde(default)]
    pub commitments: BTreeMap<u64, EpochHeads>,
    /// The memory it stated when it registered.
    #[serde(default)]
    pub memory: MemoryStated,
    /// Neighbours that reported it UNREACHABLE since its last delivery this
    /// epoch (at most `liveness::CORROBORATING_REPORTERS`): a failure is
    /// pinned on it only once that many distinct miners say so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable_by: Vec<PeerId>,
    /// This epoch's UNREACHABLE reports of its that the named miner's own
    /// deliveries then contradicted; at `liveness::FALSE_REPORTS_DISCOUNTED`
    /// its reports corroborate nothing for the rest of the epoch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub false_reports: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The memory a miner states at registration: what its stage may use, and
/// what it computes with (the memory plan differs by backend).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStated {
    /// Bytes; 0: not stated (never checked).
    pub bytes: u64,
    pub compute: iota_core::memory_plan::ComputeBackend,
}

/// Miners in states saved before subscription was tracked had subscribed.
fn yes() -> bool {
    true
}

impl MinerState {
    /// A miner registering for the first time: on probation, healthy, not
    /// yet listening (a claim until it subscribes).
    pub(crate) fn newcomer(
        peer: PeerId,
        index: u32,
        (addr, stage): (String, u32),
        now: u64,
        joining: bool,
        (tokens_per_s, device, memory): (f64, String, MemoryStated),
    ) -> MinerState {
        MinerState {
            peer,
            index,
            addr,
            stage,
            healthy: true,
            subscribed: false,
            registered_ms: now,
            joining,
            last_seen_ms: now,
            tokens_per_s,
            device,
            in_flight: 0,
            reported_in_flight: 0,
            work: 0,
            failures: 0,
            failures_in_a_row: 0,
            benched: false,
            benched_epochs: 0,
            removed: false,
            probation: true,
            delivered: 0,
            latency_ms: 0.0,
            delivery_ms: 0.0,
            convicted: false,
            convicted_epochs: 0,
            suspended_through: None,
            ejected: false,
            commitments: BTreeMap::new(),
            memory,
            unreachable_by: Vec::new(),
            false_reports: 0,
        }
    }

    /// Takes part in the run: subscribed and heard from recently.
    pub fn live(&self) -> bool {
        self.healthy && self.subscribed && !self.removed
    }

    /// Whether it holds one of its stage's places: live, a claim not yet
    /// expired, or silent for at most `hold_ms`; never once ejected or
    /// removed.
    pub fn holds_place(&self, now: u64, hold_ms: u64) -> bool {
        !self.ejected
            && !self.removed
            && (self.live() || !self.subscribed || now.saturating_sub(self.last_seen_ms) <= hold_ms)
    }

    /// Takes part in this epoch's merge if it uploads: not benched, or
    /// benched after doing work. A benched miner that worked holds honest
    /// weights, and leaving it out would shrink the merge (with two
    /// participants left, a robust rule cannot tell an outlier from the
    /// honest one); one that never worked (silent) would only stall it.
    pub fn merges(&self, epoch: u64) -> bool {
        !self.excluded(epoch) && (!self.benched || self.work > 0)
    }

    /// Out of `epoch` by validators' verdicts: convicted for its work of
    /// the epoch, or serving the suspension of an earlier conviction (no
    /// routes, no part in the merge).
    pub fn excluded(&self, epoch: u64) -> bool {
        self.convicted || self.suspended_through.is_some_and(|e| e >= epoch)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Upload {
    pub key: String,
    pub work: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochSummary {
    pub epoch: u64,
    pub mean_loss: f32,
    /// Loss of every completed micro-batch, in issue order (NaN if dropped).
    pub losses: Vec<f32>,
    pub completed: u64,
    pub dropped: u64,
    /// Miners whose work of the epoch validators convicted.
    #[serde(default)]
    pub convicted: Vec<PeerId>,
    /// Completed micro-batches that went through a convicted miner: out of
    /// `mean_loss` and `losses` (NaN there).
    #[serde(default)]
    pub excluded: u64,
    /// The validators rolled the epoch's merge back: the next epoch started
    /// from the weights this one started from.
    #[serde(default)]
    pub rolled_back: bool,
    /// The merged model's loss on held-out data, as the validators that
    /// checked it measured it (their median; None without validators).
    #[serde(default)]
    pub held_out_loss: Option<f32>,
    /// Every miner's account of the epoch (what attribution and settlement
    /// start from), in peer order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub miners: Vec<MinerEpoch>,
}

/// One miner's work in one epoch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinerEpoch {
    pub peer: PeerId,
    pub stage: u32,
    /// Completed micro-batches whose pathway went through it.
    pub completed: u64,
    /// Of those, the ones it is credited with (0 once convicted).
    pub credited: u64,
    /// It uploaded and was counted into its stage's merge.
    pub merged: bool,
    pub convicted: bool,
}

/// Most bad-object reports the run keeps (the oldest are forgotten).
pub const MAX_BAD_OBJECTS: usize = 1024;
/// Contradicting commitment reports a run keeps (the newest).
pub const MAX_COMMITMENT_BREAKS: usize = 1024;

/// A miner reported chain heads that contradict what it reported before
/// for the same epoch (a chain shrank, forked or vanished): it claimed two
/// histories. Evidence for validators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommitmentBreak {
    pub epoch: u64,
    pub miner: PeerId,
    pub what: String,
    pub earlier: EpochHeads,
    pub later: EpochHeads,
}

/// A stage's accepted objects of one epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageObjects {
    /// Butterfly: merged weights, one part per partition, by offset.
    pub weights: BTreeMap<u64, StoredObject>,
    /// Butterfly: outer momentum after the merge, by offset.
    pub momentum: BTreeMap<u64, StoredObject>,
    /// Parameter server: each replica's upload.
    pub uploads: BTreeMap<PeerId, StoredObject>,
    /// Parameter server: the aggregator's merged stage.
    pub merged: Option<StoredObject>,
}

/// A reader's report that an object did not match its announcement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BadObjectRecord {
    pub epoch: u64,
    pub stage: u32,
    pub key: String,
    pub writer: PeerId,
    pub reporter: PeerId,
    pub reason: String,
}

/// Settled epochs kept in the state (the ledger in the state database
/// keeps them all; these wait there until saved).
pub const MAX_RECENT_SETTLEMENTS: usize = 16;
/// Settled epochs kept while they are not yet in the ledger (saves
/// failing): past this the oldest is lost, counted and logged as an error.
pub const MAX_UNWRITTEN_SETTLEMENTS: usize = 256;
/// Most miner columns settlement tracks (Yuma's bound on uids).
pub const MAX_SETTLED_MINERS: usize = 65_536;

/// What settlement carries from epoch to epoch (settling.rs).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SettlementBook {
    /// The operator's identity: the only "validator" of a run without any
    /// (it rates miners by the work it counted). Set by the service.
    pub operator: Option<PeerId>,
    /// Miner columns in order of first appearance.
    pub miners: Vec<PeerId>,
    /// Yuma bonds after the last settled epoch (validators x `miners` then).
    pub bonds: Option<Vec<Vec<f64>>>,
    /// The latest settlements, oldest first.
    pub recent: Vec<crate::settlement::ledger::Settlement>,
    /// Epochs Yuma refused to settle (nothing was paid for them).
    pub failed: u64,
    /// Emission paid so far per identity (miners and validators).
    #[serde(default)]
    pub balances: BTreeMap<PeerId, f64>,
    /// The last epoch whose settlement the state database wrote to its
    /// ledger (None: none yet, or no database).
    #[serde(default)]
    pub written_through: Option<u64>,
    /// Settlements dropped before the ledger had them (saves failing for
    /// `MAX_UNWRITTEN_SETTLEMENTS` epochs): the ledger has a gap there.
    #[serde(default)]
    pub lost: u64,
    /// Miner columns at most (None: `MAX_SETTLED_MINERS`; tests set fewer).
    #[serde(default)]
    pub max_columns: Option<usize>,
}

impl SettlementBook {
    /// Miner columns settlement tracks at most.
    pub fn column_cap(&self) -> usize {
        self.max_columns.unwrap_or(MAX_SETTLED_MINERS).min(MAX_SETTLED_MINERS)
    }
}

/// One miner's line in the payout table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PayoutRow {
    pub peer: PeerId,
    pub stage: u32,
    /// Completed micro-batches through it, over the run.
    pub completed: u64,
    /// Guilty votes validators cast on its work, over the run.
    pub guilty_votes: u64,
    /// Epochs in which the validators' stake convicted it.
    pub convictions: u64,
    /// Its Yuma consensus weight in the last settled epoch.
    pub weight: f64,
    /// Its share of the miners' emission in the last settled epoch.
    pub incentive: f64,
    /// Its CLASP effect on loss in the last settled epoch (nats per
    /// sample against its stage's other replicas; None: not estimable).
    pub clasp_effect: Option<f64>,
    /// Emission paid to it over the run.
    pub emission: f64,
}

/// What happened over a run, counted (in the state, shown by `status`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    pub completed: u64,
    /// Time spent in the Training phase over the run (ms; the current
    /// phase not yet counted, see `Orchestrator::training_ms`).
    #[serde(default)]
    pub training_ms: u64,
    /// Time spent in the Uploading and Merging phases (ms; the current
    /// phase not yet counted): with validators, their round is in these.
    #[serde(default)]
    pub uploading_ms: u64,
    #[serde(default)]
    pub merging_ms: u64,
    /// When the first epoch's training began (the run's every stage had a
    /// miner), and when its first micro-batch completed (orchestrator ms).
    #[serde(default)]
    pub first_training_at_ms: Option<u64>,
    #[serde(default)]
    pub first_completed_at_ms: Option<u64>,
    pub rerouted: u64,
    pub dropped: u64,
    pub tokens: u64,
    pub stale_reports: u64,
    pub last_loss: f32,
    /// Butterfly partitions whose two owners published different results.
    #[serde(default)]
    pub hash_mismatches: u64,
    /// Butterfly merges after which the replicas' weights differed.
    #[serde(default)]
    pub divergent_merges: u64,
    /// Objects a reader found different from their announcement.
    #[serde(default)]
    pub bad_objects: u64,
    /// Merged slices written again by another holder after a reader found
    /// the first writer's bad.
    #[serde(default)]
    pub rewritten_slices: u64,
    /// Heartbeats whose commitment heads contradicted the same miner's
    /// earlier ones.
    #[serde(default)]
    pub commitment_breaks: u64,
    /// Announcements of objects the announcer was not asked to write.
    #[serde(default)]
    pub foreign_objects: u64,
    /// Micro-batch failures pinned on a miner.
    #[serde(default)]
    pub failures_pinned: u64,
    /// Owners of a disputed partition whose referee's result a validators'
    /// recompute confirmed (the owner proven wrong, convicted).
    #[serde(default)]
    pub deviant_owners: u64,
    /// UNREACHABLE reports that pinned nothing: no second miner (yet) bore
    /// them out, or their reporter's earlier reports were contradicted.
    #[serde(default)]
    pub uncorroborated_reports: u64,
    /// UNREACHABLE reports whose target then delivered (the reporter's
    /// word contradicted).
    #[serde(default)]
    pub false_reports: u64,
    /// Attempts issued before anything was measured (so with the ceiling
    /// overdue time) and re-issued once the measured one had passed.
    #[serde(default)]
    pub reissued_unmeasured: u64,
    /// Late attempts hedged near an epoch's end, and hedges that completed
    /// first.
    #[serde(default)]
    pub hedged: u64,
    #[serde(default)]
    pub hedges_won: u64,
    /// Times a miner was benched.
    #[serde(default)]
    pub benched: u64,
    /// Miners removed from the run.
    #[serde(default)]
    pub removed: u64,
    /// (epoch, miner) works convicted by validator stake.
    #[serde(default)]
    pub convictions: u64,
    /// Miners ejected by validators.
    #[serde(default)]
    pub ejected: u64,
    /// Merge participants proven to send two owners different
    /// contributions to one partition.
    #[serde(default)]
    pub equivocations: u64,
    /// Miners convicted on a validator's proof that they signed two
    /// different pipeline frames for one attempt and direction.
    #[serde(default)]
    pub frame_equivocations: u64,
    /// Miners convicted on a validator's proof of a failed inner step.
    #[serde(default)]
    pub step_proofs: u64,
    /// Merge participants whose contribution two other owners flagged.
    #[serde(default)]
    pub flawed_contributions: u64,
    /// Merge audits the validators' stake passed, and released undecided.
    #[serde(default)]
    pub merge_audits_passed: u64,
    #[serde(default)]
    pub merge_audits_released: u64,
    /// Partition owners a merge audit convicted of agreeing on a wrong result.
    #[serde(default)]
    pub colluding_owners: u64,
    /// Merge participants convicted of withholding a contribution from an
    /// audit, or from a partition's owners (two owners' claims, or the
    /// validators' recompute found it not stored).
    #[serde(default)]
    pub withheld_contributions: u64,
    /// Merge participants convicted because a merge audit found their
    /// contribution is not the pseudo-gradient of the weights they
    /// committed to (`iota_checks::contribution`).
    #[serde(default)]
    pub unbound_contributions: u64,
    /// Merge participants planned out for a contribution an owner missed,
    /// not convicted then: on one owner's claim (R = 2: one word against
    /// another), or on two while the validators' finding is awaited.
    #[serde(default)]
    pub withheld_planned_out: u64,
    /// Claims of a missing contribution the validators found stored.
    #[serde(default)]
    pub missing_claims_refuted: u64,
    /// Epochs merged with no validator live to check them.
    #[serde(default)]
    pub unvalidated_epochs: u64,
    /// Validation rounds that ran out of time.
    #[serde(default)]
    pub validation_timeouts: u64,
    /// Merges the validators' stake rolled back.
    #[serde(default)]
    pub rollbacks: u64,
    /// Butterfly slices replicas read from the object store instead of
    /// the data plane: contributions a participant could not deliver to
    /// an owner, and merged updates that never reached a replica.
    #[serde(default)]
    pub merge_contributions_from_store: u64,
    #[serde(default)]
    pub merge_updates_from_store: u64,
    /// Merges that ran behind the next epoch's training (`merge.overlap`).
    #[serde(default)]
    pub merges_behind_compute: u64,
}
