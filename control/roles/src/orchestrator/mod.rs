//! The orchestrator's state machine, free of I/O.
//!
//! `Orchestrator::step(now, event, rng)` takes one event (a miner registered,
//! reported, went quiet, or a clock tick) and returns the commands to send.
//! The gRPC service only translates; persistence stores `snapshot()`. Time and
//! randomness are inputs, so any run can be replayed from its events.
//!
//! An epoch: `Training` (issue `micro_batches_per_epoch` micro-batches along
//! pathways, at most `max_in_flight` at once, re-routing any that time out)
//! -> `Uploading` (every miner uploads its stage weights) -> `Merging` (one
//! aggregator per stage averages them) -> next epoch. Before the first epoch
//! the run is `Waiting` until every stage has `replicas` miners.

mod behind_compute;
mod commitments;
mod convictions;
mod done_index;
mod epochs;
mod event;
mod evidence_asks;
mod hedging;
mod liveness;
mod membership;
mod merge_audit;
mod merging;
mod objects;
mod observe;
mod overlap;
mod phase;
mod routing;
mod settling;
mod standing;
mod state;
mod step_proofs;
mod validating;
mod validation_state;
mod waitlist;
mod waitlist_state;
mod withholding;

use std::collections::{BTreeMap, BTreeSet};

use iota_core::merge::{Mismatch, StageMerge};
use iota_core::{PeerId, Rng};
use iota_wire::store_keys::{merged_key, weights_parts_prefix};
use iota_wire::{MbRef, MergeMethod, RunSpec, pb};

use self::behind_compute::BehindCompute;
pub use self::event::Event;
pub use self::observe::MergeProgress;
pub use self::state::{
    BadObjectRecord, CommitmentBreak, Counters, EpochSummary, MAX_BAD_OBJECTS, MAX_COMMITMENT_BREAKS, MbStatus,
    MemoryStated, MinerEpoch, MinerState, PayoutRow, Phase, SettlementBook, StageObjects,
};
use self::state::{MbRecord, Upload};
pub use self::step_proofs::StepRefereeInputs;
use self::validation_state::Validation;
pub use self::validation_state::{
    MAX_SIGNED_VERDICT, MAX_VERDICT_RECORDS, ValidatorState, VerdictIn, VerdictRecord, WorkKey,
};
pub use self::waitlist_state::{MAX_WAITING, QUEUE_RETRY_MS, WAITING_TIMEOUT_MS, Waitlist};

pub type Ms = u64;

/// A command for one miner.
#[derive(Clone, Debug, PartialEq)]
pub struct Out {
    pub to: PeerId,
    pub cmd: pb::command::Kind,
}

/// Why an event was refused (the service maps these to gRPC statuses).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("peer {0} has not registered")]
    Unknown(PeerId),
    #[error("{0}")]
    Invalid(String),
    #[error("the run holds {0} miners, as many as it takes")]
    Full(usize),
    /// The run is full: the newcomer is queued (waitlist.rs).
    #[error("the run is full: queued at position {position} of {length}")]
    Queued { position: usize, length: usize },
    /// The memory a miner states holds no stage it could take.
    #[error("{0}")]
    DoesNotFit(String),
    /// An announcement of a store object the announcer was not asked to write.
    #[error("{0}")]
    NotYours(String),
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Orchestrator {
    spec: RunSpec,
    epoch: u64,
    phase: Phase,
    phase_since: Ms,
    miners: BTreeMap<PeerId, MinerState>,
    next_index: u32,
    /// Micro-batches of the current epoch, by issue order.
    mbs: BTreeMap<u64, MbRecord>,
    issued: u64,
    uploads: BTreeMap<u32, BTreeMap<PeerId, Upload>>,
    merged: BTreeMap<u32, String>,
    /// Parameter server: the merged weights' hash per stage, as the aggregator reported it.
    #[serde(default)]
    merged_hash: BTreeMap<u32, [u8; 32]>,
    epoch_loss: (f64, u64),
    counters: Counters,
    history: Vec<EpochSummary>,
    /// Butterfly merges of the current epoch, per stage.
    #[serde(default)]
    butterfly: BTreeMap<u32, StageMerge>,
    /// Every hash mismatch of the run, for validators.
    #[serde(default)]
    mismatches: Vec<Mismatch>,
    /// Accepted store objects by epoch and stage (the current weights' epoch
    /// and later), which readers are handed.
    #[serde(default)]
    objects: BTreeMap<u64, BTreeMap<u32, StageObjects>>,
    #[serde(default)]
    bad_objects: Vec<BadObjectRecord>,
    /// Miners' reports that contradicted their earlier ones.
    #[serde(default)]
    commitment_breaks: Vec<CommitmentBreak>,
    /// When the current phase began (`phase_since` is re-armed by timeouts).
    #[serde(default)]
    phase_entered: Ms,
    /// How long the last upload and merge phases took (see `phase_timeout_ms`).
    #[serde(default)]
    last_upload_ms: Option<Ms>,
    #[serde(default)]
    last_merge_ms: Option<Ms>,
    /// Validators, their verdicts, the current round (validating.rs).
    #[serde(default)]
    validation: Validation,
    /// After a rollback: the epoch whose merge the current weights are
    /// (None inside: the seed's), instead of the previous epoch's.
    #[serde(default)]
    weights_override: Option<Option<u64>>,
    /// The weights each recent epoch started from (`weights_epoch` then):
    /// what a rollback of its merge returns to.
    #[serde(default)]
    started_from: BTreeMap<u64, Option<u64>>,
    /// Bonds and miner columns carried between epochs' settlements, and
    /// the settlements not yet old (settling.rs).
    #[serde(default)]
    settlement: SettlementBook,
    /// This epoch's stalls: each accused miner, and who reported waiting on
    /// it (liveness.rs, `pin_stall`). At most `MAX_ACCUSED` accused.
    #[serde(default)]
    accusations: BTreeMap<PeerId, BTreeSet<PeerId>>,
    /// Each stage's memory by backend and micro-batches held (set by the
    /// service from the run's configuration; without it nothing is checked).
    #[serde(skip)]
    memory_needs: Option<std::sync::Arc<iota_core::memory_fit::RunMemoryNeeds>>,
    /// With `merge.overlap`: the merge running behind the current epoch's
    /// training (overlap.rs).
    #[serde(flatten)]
    behind: BehindCompute,
    /// Newcomers waiting for a place in a full run (waitlist.rs).
    #[serde(default)]
    waitlist: waitlist_state::Waitlist,
    /// Bumped whenever a miner's health or joining flag changes, or merges
    /// are planned: the butterfly's scan of its participants for those to
    /// plan out runs again only then (or at a timeout), not on every event.
    #[serde(skip)]
    fitness_changes: u64,
    /// Counts the commitments taken (what a merge audit's context is built
    /// from moves with it; not saved).
    #[serde(skip)]
    commitments_changed: u64,
    #[serde(skip)]
    fitness_scanned: Option<u64>,
    /// The epoch's completed micro-batches by miner (derived from `mbs`,
    /// not saved; evidence_asks.rs).
    #[serde(skip)]
    done_index: done_index::DoneIndex,
    /// (epoch, seq): every micro-batch of that epoch issued before seq is
    /// done or dropped, for good (derived, not saved; see `open_mbs`).
    #[serde(skip)]
    settled_below: (u64, u64),
    /// Merge audits opened so far (not saved: it keys `merge_audits_quiet`).
    #[serde(skip)]
    audits_opened: u64,
    /// No open merge audit is due before this time, while its key holds:
    /// (audits opened, epoch, phase, merge behind compute, withholding
    /// audits only). Derived, not saved (merge_audit.rs,
    /// `expire_merge_audits`).
    #[serde(skip)]
    merge_audits_quiet: Option<(Ms, AuditsQuietKey)>,
}

type AuditsQuietKey = (u64, u64, Phase, Option<u64>, bool);

/// Miners listed in `RunStatus.payouts` (the most paid; a status must fit
/// one gRPC message).
pub const MAX_STATUS_PAYOUTS: usize = 1_024;

impl Orchestrator {
    pub fn new(spec: RunSpec) -> Result<Self, String> {
        spec.validate()?;
        let spec_validation = spec.validation.clone();
        Ok(Orchestrator {
            spec,
            epoch: 0,
            phase: Phase::Waiting,
            phase_since: 0,
            miners: BTreeMap::new(),
            next_index: 0,
            mbs: BTreeMap::new(),
            issued: 0,
            uploads: BTreeMap::new(),
            merged: BTreeMap::new(),
            merged_hash: BTreeMap::new(),
            epoch_loss: (0.0, 0),
            counters: Counters::default(),
            history: Vec::new(),
            butterfly: BTreeMap::new(),
            mismatches: Vec::new(),
            objects: BTreeMap::new(),
            bad_objects: Vec::new(),
            commitment_breaks: Vec::new(),
            phase_entered: 0,
            last_upload_ms: None,
            last_merge_ms: None,
            validation: Validation::new(&spec_validation),
            weights_override: None,
            started_from: BTreeMap::new(),
            settlement: SettlementBook::default(),
            accusations: BTreeMap::new(),
            memory_needs: None,
            behind: BehindCompute::default(),
            waitlist: waitlist_state::Waitlist::default(),
            fitness_changes: 0,
            commitments_changed: 0,
            fitness_scanned: None,
            done_index: Default::default(),
            settled_below: (0, 0),
            audits_opened: 0,
            merge_audits_quiet: None,
        })
    }

    pub fn spec(&self) -> &RunSpec {
        &self.spec
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn phase(&self) -> &Phase {
        &self.phase
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    pub fn history(&self) -> &[EpochSummary] {
        &self.history
    }
    pub fn miners(&self) -> impl Iterator<Item = &MinerState> {
        self.miners.values()
    }
    pub fn micro_batches(&self) -> impl Iterator<Item = (&MbRef, &MbStatus)> {
        self.mbs.values().map(|r| (&r.mb, &r.status))
    }
    pub fn miner(&self, p: &PeerId) -> Option<&MinerState> {
        self.miners.get(p)
    }

    /// Applies one event at time `now`.
    pub fn step(&mut self, now: Ms, ev: Event, rng: &mut Rng) -> Result<Vec<Out>, Refusal> {
        let mut out = Vec::new();
        match ev {
            Event::Register { peer, addr, tokens_per_s, device, memory } => {
                if self.register(now, peer, (addr, tokens_per_s, device, memory), &mut out)? {
                    // A new claim changes nothing until it subscribes.
                    return Ok(out);
                }
            }
            Event::Heartbeat { peer, .. } if self.validator_heartbeat(now, &peer) => {}
            Event::Heartbeat { peer, tokens_per_s, in_flight, commitments } => {
                if self.heartbeat_changes_nothing(now, peer, (tokens_per_s, in_flight), commitments)? {
                    return Ok(out);
                }
            }
            Event::Loss { peer, mb, attempt, loss, tokens } => {
                self.known(&peer)?;
                self.on_loss(now, peer, (mb, attempt), loss, tokens, &mut out);
            }
            Event::BackwardDone { peer, mb, attempt } => {
                self.known(&peer)?;
                self.on_backward_done(now, peer, (mb, attempt), &mut out);
            }
            Event::PeerFailed { peer, mb, attempt, named, failure } => {
                self.known(&peer)?;
                self.on_peer_failed(now, peer, (mb, attempt), named, failure, &mut out)?;
            }
            Event::UploadDone { peer, epoch, stage, key, work, object, commitments } => {
                self.known(&peer)?;
                self.on_commitments(peer, commitments)?;
                self.on_upload_done(peer, (epoch, stage), key, work, object)?;
            }
            Event::MergeDone { peer, epoch, stage, key, weights_hash, object, from_store } => {
                self.known(&peer)?;
                self.on_merge_done(peer, (epoch, stage), key, &weights_hash, object, from_store)?;
            }
            Event::SliceDone { peer, epoch, stage, partition, generation, hash, contributions, flagged } => {
                self.known(&peer)?;
                let h = <[u8; 32]>::try_from(hash.as_slice())
                    .map_err(|_| Refusal::Invalid("slice hash must be 32 bytes".into()))?;
                self.on_slice_done(
                    now,
                    peer,
                    (epoch, stage),
                    (partition, generation, h),
                    &contributions,
                    flagged,
                    &mut out,
                )?;
            }
            Event::ContributionsMissing { peer, epoch, stage, partition, generation, senders } => {
                self.known(&peer)?;
                self.on_contributions_missing(now, peer, (epoch, stage), (partition, generation), &senders, &mut out);
            }
            Event::Stored { peer, epoch, stage, object } => {
                self.known(&peer)?;
                if self.is_evidence_key(&object.key) {
                    self.on_evidence_stored(peer, epoch, stage, object, &mut out)
                } else {
                    self.on_stored(peer, epoch, stage, object, &mut out)
                }
                .inspect_err(|_| self.counters.foreign_objects += 1)?;
            }
            Event::RegisterValidator { peer, device } => {
                self.register_validator(now, peer, device)?;
                return Ok(out);
            }
            Event::EvidenceAsk { validator, epoch, miner, trace: Some((key, step)), .. } => {
                self.on_trace_ask(validator, (epoch, miner), (key, step), &mut out)?;
            }
            Event::EvidenceAsk { validator, epoch, miner, items, inner_step, trace: None } => {
                self.on_evidence_ask(validator, (epoch, miner), (items, inner_step), &mut out)?;
            }
            Event::Verdict(v) => self.on_verdict(now, v, &mut out)?,
            Event::ValidationDone { validator, epoch, weights, miners_hash, signed } => {
                self.on_validation_done(validator, epoch, weights, miners_hash, signed)?
            }
            Event::MergeVote { validator, epoch, rollback, loss, reason, merged } => {
                self.on_merge_vote(validator, epoch, rollback, loss, reason, merged)?
            }
            Event::MergeAudit {
                validator,
                epoch,
                stage,
                partition,
                generation,
                hash,
                missing,
                flagged,
                contradicting,
                unbound,
                reason,
            } => {
                let answer = match hash {
                    Some(h) => validation_state::AuditAnswer::Hash(h, flagged),
                    None if !missing.is_empty() => validation_state::AuditAnswer::Missing(missing),
                    None => validation_state::AuditAnswer::Unable,
                };
                let key = (epoch, stage, partition, generation);
                if hash.is_some() && !unbound.is_empty() {
                    self.on_unbound_contributions(now, validator, key, unbound, &mut out);
                }
                self.on_merge_audit(now, validator, key, (answer, &contradicting), &reason, &mut out)?
            }
            Event::BadObject { peer, epoch, stage, object, reason } => {
                self.known(&peer)?;
                self.on_bad_object(peer, epoch, stage, object, reason, &mut out)?;
            }
            Event::Subscribed { peer } if self.is_validator(&peer) => self.validator_subscribed(now, peer, &mut out),
            Event::Subscribed { peer } => self.subscribed(now, peer, &mut out)?,
            Event::Tick => {
                self.flush_contribution_requests(&mut out);
                self.expire_registrations(now);
                self.waitlist.expire(now);
                self.check_health(now, &mut out);
            }
        }
        self.advance(now, rng, &mut out);
        Ok(out)
    }

    /// The epoch whose merge made the weights the current epoch starts
    /// from (None: the run seed's initial weights): the previous epoch's,
    /// unless a rollback discarded it.
    pub fn weights_epoch(&self) -> Option<u64> {
        // While the previous epoch's merge runs behind training, the latest
        // merged weights are the one before it.
        let back = if self.behind.running().is_some() { 2 } else { 1 };
        self.weights_override.unwrap_or(self.epoch.checked_sub(back))
    }

    /// Where a stage's current weights are: empty for the run seed's.
    fn weights_key(&self, stage: u32) -> String {
        match (self.weights_epoch(), self.spec.merge.method) {
            (None, _) => String::new(),
            (Some(e), MergeMethod::ParameterServer) => merged_key(e, stage),
            (Some(e), MergeMethod::Butterfly) => weights_parts_prefix(e, stage),
        }
    }

    /// The miner that averages a stage: the lowest-index one that uploaded.
    fn aggregator(&self, stage: u32) -> Option<PeerId> {
        // The stage's uploaders, not every miner: it is asked once per miner
        // when a merge's phase goes out.
        let ups = self.uploads.get(&stage)?;
        ups.keys()
            .filter_map(|p| self.miners.get(p))
            .filter(|m| m.live() && m.merges(self.epoch))
            .min_by_key(|m| m.index)
            .map(|m| m.peer)
    }

    /// Moves the run along: issuing, timeouts, phase changes.
    fn advance(&mut self, now: Ms, rng: &mut Rng, out: &mut Vec<Out>) {
        match self.phase {
            Phase::Waiting => {
                let mut live = vec![0usize; self.spec.stages as usize];
                for m in self.miners.values().filter(|m| m.live()) {
                    live[m.stage as usize] += 1;
                }
                if live.iter().all(|&n| n >= self.spec.replicas as usize) {
                    for m in self.miners.values_mut() {
                        m.joining = false;
                    }
                    self.fitness_changes += 1;
                    self.start_epoch(now, rng, out);
                }
            }
            Phase::Training => {
                // Between merges only withholding audits are live (they
                // outlive their merge); behind compute, the merge's own.
                self.expire_merge_audits(now, self.behind.running().is_none(), out);
                self.tend_overlapped(now, out);
                self.advance_training(now, rng, out);
            }
            Phase::Uploading => {
                self.expire_merge_audits(now, self.behind.running().is_none(), out);
                // Only miners that worked this epoch and are not benched are
                // waited for: a silent one must not hold every epoch to the
                // phase timeout.
                let waiting_on = |s: u32| {
                    let ups = self.uploads.get(&s);
                    self.active_in(s)
                        .filter(|m| !m.benched && m.work > 0 && !ups.is_some_and(|u| u.contains_key(&m.peer)))
                        .count()
                };
                // Once the validators have the epoch's work, the uploads it
                // lists are settled and only their round is waited on (and
                // the scan of every miner on every event of the round, a
                // cost the simulator found at 1,000 miners, is skipped).
                let validating = self.validation.round.as_ref().is_some_and(|r| r.epoch == self.epoch && !r.timed_out);
                let ready = validating || {
                    let all_in = (0..self.spec.stages).all(|s| waiting_on(s) == 0);
                    let timed_out = now.saturating_sub(self.phase_since) > self.phase_timeout_ms();
                    let every_stage_has_one =
                        (0..self.spec.stages).all(|s| self.uploads.get(&s).is_some_and(|u| !u.is_empty()));
                    (all_in || timed_out) && every_stage_has_one
                };
                // The validators check the epoch's work before it is merged
                // (its final commitments are in once the uploads are).
                if ready && !self.validation_holds_merge(now, out) {
                    self.plan_merges(rng);
                    if self.merges_behind_compute() {
                        self.start_overlapped(now, rng, out);
                    } else {
                        self.set_phase(now, Phase::Merging, out);
                    }
                }
            }
            Phase::Merging if self.spec.merge.method == MergeMethod::Butterfly => {
                self.expire_merge_audits(now, false, out);
                let timed_out = now.saturating_sub(self.phase_since) > self.phase_timeout_ms();
                self.tend_butterfly(now, timed_out, out);
                if timed_out {
                    self.phase_since = now;
                }
                // The run's last merge waits for the withholding audits
                // still out (they outlive their merge, not the run).
                let last = self.epoch + 1 >= self.spec.epoch_count();
                if self.butterfly_complete(timed_out) && !(last && self.withholding_audits_pending()) {
                    // The validators judge the merged model first.
                    if let Some(rollback) = self.merge_verdict(now, out) {
                        self.counters.divergent_merges +=
                            self.butterfly.values().filter(|m| !m.consistent()).count() as u64;
                        self.finish_epoch(now, rng, out, rollback);
                    }
                }
            }
            Phase::Merging => {
                if (0..self.spec.stages).all(|s| self.merged.contains_key(&s)) {
                    if let Some(rollback) = self.merge_verdict(now, out) {
                        self.finish_epoch(now, rng, out, rollback);
                    }
                } else if now.saturating_sub(self.phase_since) > self.phase_timeout_ms() {
                    // An aggregator went quiet: the next uploader takes over.
                    for s in 0..self.spec.stages {
                        if self.merged.contains_key(&s) {
                            continue;
                        }
                        if let Some(a) = self.aggregator(s)
                            && let Some(ups) = self.uploads.get_mut(&s)
                        {
                            ups.remove(&a);
                        }
                    }
                    self.set_phase(now, Phase::Merging, out);
                }
            }
            Phase::Done => {}
        }
    }

    /// Live validators now.
    pub fn validators_live(&self, now: Ms) -> usize {
        self.live_validators(now)
    }

    /// The run's state for `Status`.
    pub fn status(&self) -> pb::RunStatus {
        pb::RunStatus {
            run_id: self.spec.run_id,
            epoch: self.epoch,
            phase: self.phase.to_pb() as i32,
            stages: (0..self.spec.stages)
                .map(|s| pb::StageStatus {
                    stage: s,
                    miners: self.miners.values().filter(|m| m.stage == s).count() as u32,
                    healthy: self.healthy_in(s).count() as u32,
                })
                .collect(),
            completed: self.counters.completed,
            rerouted: self.counters.rerouted,
            dropped: self.counters.dropped,
            // The service adds its own refusal counts.
            refusals: Default::default(),
            last_loss: self.counters.last_loss,
            tokens: self.counters.tokens,
            hash_mismatches: self.counters.hash_mismatches,
            bad_objects: self.counters.bad_objects,
            foreign_objects: self.counters.foreign_objects,
            benched: self.counters.benched,
            failures_pinned: self.counters.failures_pinned,
            // The service adds the live validators (it knows the time).
            validators: 0,
            convictions: self.counters.convictions,
            ejected: self.counters.ejected,
            rollbacks: self.counters.rollbacks,
            settled_epochs: self.settlements().last().map_or(0, |s| s.epoch + 1),
            payouts: self
                .payout_table()
                .into_iter()
                .take(MAX_STATUS_PAYOUTS)
                .map(|p| pb::Payout {
                    peer: p.peer.0.to_vec(),
                    stage: p.stage,
                    completed: p.completed,
                    guilty_votes: p.guilty_votes,
                    convictions: p.convictions,
                    has_clasp: p.clasp_effect.is_some(),
                    clasp_effect: p.clasp_effect.unwrap_or(0.0),
                    weight: p.weight,
                    incentive: p.incentive,
                    emission: p.emission,
                })
                .collect(),
            validator_pay: self
                .balances()
                .iter()
                .filter(|(p, _)| !self.settlement.miners.contains(p))
                .map(|(p, x)| pb::Balance { peer: p.0.to_vec(), emission: *x })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
