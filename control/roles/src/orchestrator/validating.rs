//! Validation as the orchestrator runs it (issue 13; PROTOCOL.md,
//! "Validation").
//!
//! Once every miner's final commitment heads for an epoch are in (the
//! Uploading phase's uploads), the orchestrator opens a **round**: it
//! sends each live validator the epoch's work (`EpochWork`: who completed
//! which attempts along which pathways, their heads, the beacon, the
//! weights each stage started from) and holds the merge. Validators draw
//! their samples from the beacon and their own seed, ask for the evidence
//! (`EvidenceAsk`, relayed to the miner as an `EvidenceRequest`), are
//! handed each evidence object its miner announces, check it, and vote
//! (`Verdict`). Votes count by stake ([`Quorum`]): a conviction takes the
//! miner's work out of the epoch (out of the merge, its recorded work set
//! to zero) and is a strike; enough strikes eject it. The round ends when
//! every validator it was sent to has said `ValidationDone` (or went
//! silent), or at the run's validation timeout; then the merge goes on
//! without the convicted.
//!
//! A run with no validators never holds its merge. A run whose validators
//! are all away goes on unvalidated (counted): liveness first, and the
//! unchecked epoch is on record.

use std::collections::{BTreeMap, BTreeSet};

use iota_core::PeerId;
use iota_core::frame_equivocation::FrameEquivocation;
use iota_wire::{StoredObject, pb};
use tracing::{info, warn};

use crate::validation::quorum::{Accusation, Check, Consequence};
use crate::validation::round::evidence_allowance_ms;
use crate::validation::sample::{SampleRate, beacon};

use super::step_proofs::push_latest;
use super::validation_state::{
    MAX_SIGNED_VERDICT, MAX_VERDICT_RECORDS, MAX_WORK_ITEMS, MergeRound, Quorum, Round, ValidatorState, VerdictIn,
    VerdictRecord,
};
use super::{MbStatus, Ms, Orchestrator, Out, Phase, Refusal};

impl Orchestrator {
    pub fn validators(&self) -> impl Iterator<Item = &ValidatorState> {
        self.validation.validators.values()
    }

    /// Every vote on record, oldest first.
    pub fn verdicts(&self) -> &[VerdictRecord] {
        &self.validation.verdicts
    }

    pub fn is_validator(&self, p: &PeerId) -> bool {
        self.validation.validators.contains_key(p)
    }

    /// The run's stake-weighted verdicts (None: the run has no validators).
    pub fn quorum(&self) -> Option<&Quorum> {
        self.validation.quorum.as_ref()
    }

    fn validator_live(&self, v: &ValidatorState, now: Ms) -> bool {
        v.subscribed && now.saturating_sub(v.last_seen_ms) <= self.spec.heartbeat_timeout_ms
    }

    pub(super) fn live_validators(&self, now: Ms) -> usize {
        self.validation.validators.values().filter(|v| self.validator_live(v, now)).count()
    }

    pub(super) fn register_validator(&mut self, now: Ms, peer: PeerId, device: String) -> Result<(), Refusal> {
        let stake = self.spec.validation.stake_of(&peer).ok_or_else(|| {
            Refusal::NotYours(format!("peer {peer} is not one of this run's validators (it lists each with a stake)"))
        })?;
        if self.miners.contains_key(&peer) {
            return Err(Refusal::Invalid(format!("peer {peer} is registered as a miner")));
        }
        let v = self.validation.validators.entry(peer).or_insert(ValidatorState {
            peer,
            stake,
            device: String::new(),
            subscribed: false,
            last_seen_ms: now,
        });
        v.device = device;
        v.last_seen_ms = now;
        Ok(())
    }

    /// A validator's heartbeat; false if `peer` is no validator.
    pub(super) fn validator_heartbeat(&mut self, now: Ms, peer: &PeerId) -> bool {
        match self.validation.validators.get_mut(peer) {
            Some(v) => {
                v.last_seen_ms = now;
                true
            }
            None => false,
        }
    }

    /// A validator opened its command stream: it gets the open round's
    /// work (again, if it restarted).
    pub(super) fn validator_subscribed(&mut self, now: Ms, peer: PeerId, out: &mut Vec<Out>) {
        let Some(v) = self.validation.validators.get_mut(&peer) else { return };
        v.subscribed = true;
        v.last_seen_ms = now;
        self.validation.audit_contexts_sent.retain(|(v, _), _| *v != peer);
        let open = self.validation.round.as_ref().is_some_and(|r| r.epoch == self.epoch && !r.timed_out);
        if open && self.phase == Phase::Uploading {
            let work = self.epoch_work();
            out.push(Out { to: peer, cmd: pb::command::Kind::EpochWork(work) });
            // A validator that said done stays done: its round goes on
            // (a stream re-opened) or, restarted, it re-checks and says
            // done again; the merge does not wait for it meanwhile.
            if let Some(r) = self.validation.round.as_mut() {
                r.sent_to.insert(peer);
            }
        }
    }

    /// What the validators sample from: each miner's completed attempts of
    /// this epoch (the stage it held on their pathways) and its final heads.
    fn epoch_work(&self) -> pb::EpochWork {
        let mut heads = BTreeMap::new();
        let mut miners = Vec::new();
        for m in self.miners.values() {
            let Some(h) = m.commitments.get(&self.epoch) else { continue };
            let items: Vec<pb::WorkItem> = self
                .mbs
                .values()
                .filter_map(|r| match &r.status {
                    MbStatus::Done { attempt, pathway, loss } if pathway.get(m.stage as usize) == Some(&m.peer) => {
                        Some(pb::WorkItem {
                            mb: Some(pb::WorkRef {
                                shard: r.mb.shard,
                                first_sample: r.mb.first_sample,
                                attempt: *attempt,
                                inner_step: false,
                                trace_step: 0,
                            }),
                            samples: r.samples,
                            pathway: pathway.iter().map(|p| p.0.to_vec()).collect(),
                            loss: *loss,
                            order: r.seq,
                        })
                    }
                    _ => None,
                })
                .take(MAX_WORK_ITEMS)
                .collect();
            if items.is_empty() {
                continue;
            }
            heads.insert(m.peer, h.clone());
            let commitments = iota_wire::commitments_pb::to_pb(std::slice::from_ref(h)).into_iter().next();
            let previous = self
                .epoch
                .checked_sub(1)
                .and_then(|e| m.commitments.get(&e))
                .and_then(|h| iota_wire::commitments_pb::to_pb(std::slice::from_ref(h)).into_iter().next());
            miners.push(pb::MinerWork {
                peer: m.peer.0.to_vec(),
                stage: m.stage,
                commitments,
                items,
                device: m.device.clone(),
                previous,
            });
        }
        pb::EpochWork {
            epoch: self.epoch,
            beacon: beacon(self.spec.run_id, self.epoch, &heads).to_vec(),
            miners,
            starts: (0..self.spec.stages)
                .map(|s| pb::StageStart {
                    stage: s,
                    weights_hash: self.validation.starts.get(&s).map(|h| h.to_vec()).unwrap_or_default(),
                    weights_from: self.started_from_epoch().map_or(0, |e| e + 1),
                })
                .collect(),
        }
    }

    /// In Uploading, once the uploads are in: opens the epoch's round, and
    /// says whether it still holds the merge.
    pub(super) fn validation_holds_merge(&mut self, now: Ms, out: &mut Vec<Out>) -> bool {
        if self.validation.quorum.is_none() {
            return false;
        }
        let epoch = self.epoch;
        if self.validation.round.as_ref().is_none_or(|r| r.epoch != epoch) {
            let work = self.epoch_work();
            let live: BTreeSet<PeerId> =
                self.validation.validators.values().filter(|v| self.validator_live(v, now)).map(|v| v.peer).collect();
            let mut round = Round { epoch, started_ms: now, ..Round::default() };
            if live.is_empty() || work.miners.is_empty() {
                self.counters.unvalidated_epochs += 1;
                warn!(epoch, "no validator is live: this epoch's work goes unchecked");
                round.timed_out = true;
                self.validation.round = Some(round);
                return false;
            }
            round.timeout_ms = self.round_timeout_ms(&work);
            info!(
                epoch,
                validators = live.len(),
                miners = work.miners.len(),
                timeout_ms = round.timeout_ms,
                "validation round opened"
            );
            for v in &live {
                out.push(Out { to: *v, cmd: pb::command::Kind::EpochWork(work.clone()) });
            }
            round.sent_to = live;
            round.miners = work.miners.iter().filter_map(|m| m.peer.as_slice().try_into().ok().map(PeerId)).collect();
            self.validation.round = Some(round);
            return true;
        }
        let Some(r) = self.validation.round.as_ref() else { return false };
        if r.timed_out {
            return false;
        }
        let waiting = r
            .sent_to
            .iter()
            .filter(|v| !r.done.contains(v))
            .any(|v| self.validation.validators.get(v).is_some_and(|s| self.validator_live(s, now)));
        if waiting && now.saturating_sub(r.started_ms) > r.timeout_ms.max(self.spec.validation.timeout_ms) {
            self.counters.validation_timeouts += 1;
            warn!(epoch, "validation timed out; the merge goes on with the verdicts in");
            if let Some(r) = self.validation.round.as_mut() {
                r.timed_out = true;
            }
            return false;
        }
        waiting
    }

    /// A validation round's deadline: `validation.timeout_ms` plus what
    /// the largest draw takes to upload: each validator's draw of a miner
    /// (the run's sample rate of its completed attempts), as bundles of up
    /// to two weights states of its stage, at 100 Mbit/s (as the
    /// validators allow, `evidence_allowance_ms`). A `1.5b` stage's
    /// evidence takes minutes to upload: a fixed deadline would move the
    /// merge on before the verdicts.
    fn round_timeout_ms(&self, work: &pb::EpochWork) -> Ms {
        let v = &self.spec.validation;
        let rate = SampleRate { rate: v.rate, min_per_miner: v.min_per_miner as usize };
        let validators = v.validators.len().max(1);
        let most = work
            .miners
            .iter()
            .map(|m| {
                let params = self.spec.merge.stage_params.get(m.stage as usize).copied().unwrap_or(0);
                let drawn = rate.count(m.items.len().min(MAX_WORK_ITEMS)).saturating_mul(validators);
                evidence_allowance_ms(params.saturating_mul(4), drawn)
            })
            .max()
            .unwrap_or(0);
        v.timeout_ms.saturating_add(most)
    }

    pub(super) fn open_round(&self, validator: &PeerId, epoch: u64) -> Result<(), Refusal> {
        if !self.is_validator(validator) {
            return Err(Refusal::Unknown(*validator));
        }
        match &self.validation.round {
            Some(r) if r.epoch == epoch && r.sent_to.contains(validator) => Ok(()),
            _ => Err(Refusal::Invalid(format!("no validation round of epoch {epoch} is open for {validator}"))),
        }
    }

    /// A validator is done with the round; its weights over the epoch's
    /// miners (in the `EpochWork` order) are kept for settlement. A vector
    /// that does not fit the epoch is refused whole: nothing is recorded,
    /// and the validator is not counted done.
    pub(super) fn on_validation_done(
        &mut self,
        validator: PeerId,
        epoch: u64,
        weights: Vec<f32>,
        miners_hash: Option<[u8; 32]>,
        signed: Vec<u8>,
    ) -> Result<(), Refusal> {
        self.open_round(&validator, epoch)?;
        let Some(r) = self.validation.round.as_mut() else { return Ok(()) };
        if !weights.is_empty() {
            // The signed weights must name the miners they rate, so the
            // ledger can show whose they are.
            if miners_hash != Some(crate::validation::sample::work_miners_hash(epoch, &r.miners)) {
                return Err(Refusal::Invalid(format!(
                    "the weights' miners_hash does not name epoch {epoch}'s miners in the work's order"
                )));
            }
            if weights.len() != r.miners.len() {
                return Err(Refusal::Invalid(format!(
                    "{} weights for the {} miners of epoch {epoch}'s work",
                    weights.len(),
                    r.miners.len()
                )));
            }
            if let Some(i) = weights.iter().position(|w| !w.is_finite() || *w < 0.0) {
                return Err(Refusal::Invalid(format!("weight {i} is {}: weights must be finite and >= 0", weights[i])));
            }
            if weights.iter().all(|w| *w == 0.0) {
                return Err(Refusal::Invalid("all weights are zero: to rate nobody, send none".into()));
            }
            match r.weights.get(&validator) {
                // The same weights again (a restarted validator's round): done.
                Some(w) if *w == weights => {
                    r.done.insert(validator);
                    return Ok(());
                }
                Some(_) => return Err(Refusal::Invalid(format!("weights for epoch {epoch} were already submitted"))),
                None => {}
            }
            r.weights.insert(validator, weights);
            r.signed_weights.insert(validator, signed);
        }
        r.done.insert(validator);
        Ok(())
    }

    /// A validator's vote, weighed by stake; a decided conviction takes
    /// effect at once.
    pub(super) fn on_verdict(&mut self, now: Ms, v: VerdictIn, out: &mut Vec<Out>) -> Result<(), Refusal> {
        if !self.is_validator(&v.validator) {
            return Err(Refusal::Unknown(v.validator));
        }
        if v.epoch > self.epoch {
            return Err(Refusal::Invalid(format!("a verdict on epoch {}, which has not happened", v.epoch)));
        }
        if !self.miners.contains_key(&v.miner) {
            return Err(Refusal::Invalid(format!("{} is no miner of this run", v.miner)));
        }
        if v.signed.len() > MAX_SIGNED_VERDICT {
            return Err(Refusal::Invalid(format!(
                "a verdict's signed request of {} bytes (at most {MAX_SIGNED_VERDICT})",
                v.signed.len()
            )));
        }
        // A proof is checked before anything of the verdict counts: a
        // forged or altered one refuses the whole verdict.
        let proof = match v.proof.as_slice() {
            [] => None,
            [a, b] if v.guilty && v.check == Check::Recompute => Some(
                FrameEquivocation::check(self.spec.run_id, v.miner, a, b)
                    .map_err(|why| Refusal::Invalid(format!("the verdict's proof does not hold: {why}")))?,
            ),
            _ => return Err(Refusal::Invalid("a proof is two headers on a guilty recompute verdict".into())),
        };
        if proof.as_ref().is_some_and(|p| p.epoch != v.epoch) {
            return Err(Refusal::Invalid("the verdict's proof is of another epoch".into()));
        }
        if v.step_proven.is_some() && !(v.guilty && v.check == Check::Recompute && v.proof.is_empty()) {
            return Err(Refusal::Invalid("a step proof goes alone with a guilty recompute verdict".into()));
        }
        let q = self.validation.quorum.as_mut().ok_or_else(|| Refusal::Invalid("this run has no validators".into()))?;
        let acc = Accusation { epoch: v.epoch, miner: v.miner, check: v.check };
        let forgotten = v.epoch < q.forgotten_before();
        let mut consequences = q.vote(v.validator, acc, v.guilty).map_err(|e| Refusal::Invalid(e.to_string()))?;
        // A proven failed step (the shell re-checked it), or two signatures,
        // decide it, whatever the stake voted or will vote.
        let step_proven = v.step_proven.filter(|_| !forgotten);
        let proof = proof.filter(|_| !forgotten);
        if step_proven.is_some() || proof.is_some() {
            consequences.extend(q.proven(acc));
        }
        if let Some(hash) = step_proven {
            self.record_step_proof((v.epoch, v.miner, v.validator), hash);
        }
        if let Some(p) = proof
            && push_latest(&mut self.validation.frame_equivocations, p)
        {
            self.counters.frame_equivocations += 1;
            warn!(epoch = v.epoch, miner = %v.miner, validator = %v.validator, "proven: two frames signed for one attempt");
        }
        if v.guilty {
            warn!(epoch = v.epoch, miner = %v.miner, validator = %v.validator, reason = %v.reason, "verdict: guilty");
        }
        // Only a validator's first vote on an accusation of a live epoch
        // goes on record: repeats and votes on forgotten epochs count for
        // nothing, and must not push other validators' records out.
        let repeat = self.verdict_recorded((v.epoch, v.miner, v.validator, v.check));
        if forgotten || repeat {
            self.apply_consequences(now, consequences, out);
            return Ok(());
        }
        if let Some(r) = self.validation.round.as_mut().filter(|r| r.epoch == v.epoch)
            && v.check == Check::Recompute
            && v.samples >= 1
            && r.miners.contains(&v.miner)
        {
            r.verified.entry(v.validator).or_default().insert(v.miner);
        }
        if self.validation.verdicts.len() >= MAX_VERDICT_RECORDS {
            // The oldest eighth goes at once: one move of the rest per
            // 2,048 votes, not one per vote.
            for r in self.validation.verdicts.drain(..MAX_VERDICT_RECORDS / 8) {
                self.validation.verdict_keys.remove(&(r.epoch, r.miner, r.validator, r.check));
            }
        }
        self.validation.verdict_keys.insert((v.epoch, v.miner, v.validator, v.check));
        self.validation.verdicts.push(VerdictRecord {
            epoch: v.epoch,
            miner: v.miner,
            validator: v.validator,
            check: v.check,
            guilty: v.guilty,
            samples: v.samples,
            evidence_hash: v.evidence_hash,
            reason: v.reason,
            at_ms: now,
            signed: v.signed,
        });
        self.apply_consequences(now, consequences, out);
        Ok(())
    }

    /// Carries out what a decided accusation asks. Work convicted while
    /// its epoch is still training or uploading is out of the epoch's
    /// merge and pay; a merge conviction (a proven equivocation) during
    /// the merge too, since the merge has already planned the miner out.
    pub(super) fn apply_consequences(&mut self, now: Ms, consequences: Vec<Consequence>, out: &mut Vec<Out>) {
        for c in consequences {
            match c {
                Consequence::Exclude { epoch, miner, check } => {
                    self.counters.convictions += 1;
                    let current = epoch == self.epoch
                        && (matches!(self.phase, Phase::Training | Phase::Uploading)
                            || (check == Check::Merge && self.phase == Phase::Merging));
                    // A merge cheat found after its epoch was settled (a
                    // withholding audit outlives its merge) costs the epoch
                    // it is found in instead: the same two epochs out.
                    let late = check == Check::Merge && epoch < self.epoch && self.phase != Phase::Done;
                    let served_from = if late { self.epoch } else { epoch };
                    if let Some(m) = self.miners.get_mut(&miner) {
                        m.convicted_epochs += 1;
                        if current || late {
                            // Out of this epoch's merge, and paid nothing for it.
                            m.convicted = true;
                            m.work = 0;
                        }
                        // No routes until the epoch after next.
                        m.suspended_through = Some(m.suspended_through.unwrap_or(0).max(served_from + 1));
                    }
                    warn!(epoch, miner = %miner, ?check, excluded = current || late, late, "a miner's work is convicted");
                }
                Consequence::Eject { miner } => {
                    self.counters.ejected += 1;
                    let lost = self.in_flight_through(miner);
                    if let Some(m) = self.miners.get_mut(&miner) {
                        m.removed = true;
                        m.ejected = true;
                    }
                    self.reroute_all(now, lost, Some(miner), true, out);
                    warn!(miner = %miner, "miner ejected: its identity is refused from now on");
                }
            }
        }
    }
}

impl Orchestrator {
    /// Whether a record of `key` (epoch, miner, validator, check) is kept.
    fn verdict_recorded(&mut self, key: (u64, PeerId, PeerId, Check)) -> bool {
        let v = &mut self.validation;
        if v.verdict_keys.len() != v.verdicts.len() {
            v.verdict_keys = v.verdicts.iter().map(|r| (r.epoch, r.miner, r.validator, r.check)).collect();
        }
        v.verdict_keys.contains(&key)
    }
}

/// What a merge vote is about: the epoch's merged model (no miner).
fn merge_accusation(epoch: u64) -> Accusation {
    Accusation { epoch, miner: PeerId([0; 32]), check: crate::validation::quorum::Check::Merge }
}

impl Orchestrator {
    /// The epoch's merge is complete and stored: whether it stands
    /// (`Some(false)`), is rolled back (`Some(true)`: more than half the
    /// validator stake voted so), or the votes of live validators are
    /// still awaited (None; at most `validation.timeout_ms`).
    pub(super) fn merge_verdict(&mut self, now: Ms, out: &mut Vec<Out>) -> Option<bool> {
        if self.validation.merge_quorum.is_none() {
            return Some(false); // nobody validates: the merge stands
        }
        let epoch = self.epoch;
        if self.validation.merge_round.as_ref().is_none_or(|r| r.epoch != epoch) {
            let live: BTreeSet<PeerId> =
                self.validation.validators.values().filter(|v| self.validator_live(v, now)).map(|v| v.peer).collect();
            if live.is_empty() {
                return Some(false);
            }
            let stages = (0..self.spec.stages)
                .map(|s| pb::StageWeights {
                    stage: s,
                    objects: self.merged_objects(epoch, s).iter().map(StoredObject::to_pb).collect(),
                    reported: self.butterfly.get(&s).filter(|bm| bm.plan.epoch == epoch).map_or_else(Vec::new, |bm| {
                        bm.done
                            .iter()
                            .map(|(p, h)| pb::MergeReport { peer: p.0.to_vec(), weights_hash: h.to_vec() })
                            .collect()
                    }),
                })
                .collect();
            let check = pb::MergeCheck { epoch, stages };
            for v in &live {
                out.push(Out { to: *v, cmd: pb::command::Kind::MergeCheck(check.clone()) });
            }
            info!(epoch, validators = live.len(), "merged model sent to the validators");
            self.validation.merge_round =
                Some(MergeRound { epoch, started_ms: now, sent_to: live, ..MergeRound::default() });
            return None;
        }
        let outcome = self.validation.merge_quorum.as_ref().and_then(|q| q.outcome(&merge_accusation(epoch)));
        let decided = outcome.map(|o| o == crate::validation::quorum::Outcome::Guilty);
        // A participant accused of a false merge report, its conviction
        // not yet decided: the validators still to vote send their
        // verdicts before their merge votes, so the epoch waits for them
        // (a conviction now takes the epoch's pay; after, only a strike).
        let accused = self.validation.quorum.as_ref().is_some_and(|q| q.open_with_guilty(epoch, Check::Merge));
        if let Some(rollback) = decided
            && !accused
        {
            return Some(rollback);
        }
        let r = self.validation.merge_round.as_ref()?;
        let waiting = r
            .sent_to
            .iter()
            .filter(|v| !r.voted.contains(v))
            .any(|v| self.validation.validators.get(v).is_some_and(|s| self.validator_live(s, now)));
        if !waiting {
            return Some(decided.unwrap_or(false)); // every vote is in
        }
        if now.saturating_sub(r.started_ms) > self.spec.validation.timeout_ms {
            if decided.is_none() {
                self.counters.validation_timeouts += 1;
                warn!(epoch, "the merged model's check timed out; it stands");
            }
            return Some(decided.unwrap_or(false));
        }
        None
    }

    /// The run's whole validator stake, registered or not: a majority is
    /// more than half of it (as the quorum counts), so validators that are
    /// down cannot hand the rest a majority.
    pub(super) fn total_stake(&self) -> u128 {
        self.spec.validation.validators.iter().map(|v| u128::from(v.stake)).sum()
    }

    /// Each stage's merged-weights hashes the current epoch's merge voters
    /// loaded from the store, with the stake behind each.
    pub(super) fn loaded_merge_hashes(&self) -> BTreeMap<u32, BTreeMap<[u8; 32], u64>> {
        let mut out: BTreeMap<u32, BTreeMap<[u8; 32], u64>> = BTreeMap::new();
        let Some(r) = self.validation.merge_round.as_ref().filter(|r| r.epoch == self.epoch) else { return out };
        for (v, stages) in &r.merged {
            let stake = self.validation.validators.get(v).map_or(0, |s| s.stake);
            for (s, h) in stages {
                let e = out.entry(*s).or_default().entry(*h).or_default();
                *e = e.saturating_add(stake);
            }
        }
        out
    }

    /// The current epoch's merged model's held-out loss: the median of
    /// what its voters measured (None before any vote, or without
    /// validators).
    pub(super) fn held_out_loss(&self) -> Option<f32> {
        let r = self.validation.merge_round.as_ref().filter(|r| r.epoch == self.epoch)?;
        let mut l = r.losses.clone();
        l.sort_by(f32::total_cmp);
        match l.len() {
            0 => None,
            n if n % 2 == 1 => Some(l[n / 2]),
            n => Some(0.5 * (l[n / 2 - 1] + l[n / 2])),
        }
    }

    /// A validator's vote on the epoch's merged model.
    pub(super) fn on_merge_vote(
        &mut self,
        validator: PeerId,
        epoch: u64,
        rollback: bool,
        loss: f32,
        reason: String,
        merged: Vec<(u32, [u8; 32])>,
    ) -> Result<(), Refusal> {
        if !self.is_validator(&validator) {
            return Err(Refusal::Unknown(validator));
        }
        let stages = self.spec.stages;
        if let Some((s, _)) = merged.iter().find(|(s, _)| *s >= stages) {
            return Err(Refusal::Invalid(format!("a merge vote names stage {s}; the run has {stages}")));
        }
        let r = self
            .validation
            .merge_round
            .as_mut()
            .filter(|r| r.epoch == epoch && r.sent_to.contains(&validator))
            .ok_or_else(|| Refusal::Invalid(format!("no check of epoch {epoch}'s merge is open for {validator}")))?;
        if r.voted.insert(validator) {
            if loss.is_finite() {
                r.losses.push(loss);
            }
            if !merged.is_empty() {
                r.merged.insert(validator, merged.into_iter().collect());
            }
        }
        let q = self.validation.merge_quorum.as_mut().ok_or_else(|| Refusal::Invalid("no validators".into()))?;
        q.vote(validator, merge_accusation(epoch), rollback).map_err(|e| Refusal::Invalid(e.to_string()))?;
        if rollback {
            warn!(epoch, validator = %validator, loss, reason = %reason, "a validator votes to roll the merge back");
        } else {
            info!(epoch, validator = %validator, loss, "a validator keeps the merge");
        }
        Ok(())
    }
}

pub(super) fn stored_cmd(epoch: u64, stage: u32, o: &StoredObject) -> pb::Stored {
    pb::Stored { epoch, stage, object: Some(o.to_pb()) }
}
