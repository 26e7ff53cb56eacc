//! Simulated validators: each registers, subscribes and heartbeats as the
//! validator daemon does, and runs the real round
//! (`validation::round::ValidatorCore`): it draws from the epoch's work,
//! asks for evidence, votes and rates the miners. What the simulator
//! stands in for is the recompute itself: a check's result is what the
//! miner really did (`adversary.rs`). Merged models and merge audits are
//! judged the same way, from what the owners and participants did.

use std::collections::BTreeMap;

use iota_core::PeerId;
use iota_wire::{StoredObject, pb};

use std::rc::Rc;

use super::validator_state::{AuditAsk, merged_hash, slice_hash};
use super::{Happening, World};
use crate::orchestrator::{Event, VerdictIn};
use crate::validation::quorum::Check;
use crate::validation::round::{Action, CheckJob};

impl World {
    /// Validator `j` registers (again, after a refusal it retries).
    pub(super) fn validator_join(&mut self, j: usize) {
        let peer = self.validators[j].peer;
        match self.step(Event::RegisterValidator { peer, device: "sim".into() }) {
            Ok(outs) => {
                self.deliver(outs);
                self.validators[j].joined = true;
                let d = self.delay();
                self.at(self.now + d, Happening::ToOrchestrator(Box::new(Event::Subscribed { peer })));
            }
            Err(e) => self.report.lost_reports.push(format!("validator {j} could not register: {e}")),
        }
    }

    /// Every joined validator's heartbeat, and its round's clock.
    pub(super) fn validators_beat(&mut self) {
        for j in 0..self.validators.len() {
            if !self.validators[j].joined {
                continue;
            }
            let peer = self.validators[j].peer;
            let hb = Event::Heartbeat { peer, tokens_per_s: 0.0, in_flight: 0, commitments: Vec::new() };
            self.send_in_order(j, 0, hb);
            let actions = self.validators[j].core.tick(self.now);
            self.act(j, actions);
        }
    }

    pub(super) fn reach_validator(&mut self, j: usize, cmd: pb::command::Kind) {
        match cmd {
            pb::command::Kind::EpochWork(w) => match self.validators[j].core.on_work(self.now, &w) {
                Ok(actions) => self.act(j, actions),
                Err(e) => self.report.lost_reports.push(format!("validator {j} refused epoch {}'s work: {e}", w.epoch)),
            },
            pb::command::Kind::Stored(s) => {
                let Some(obj) = s.object.as_ref().and_then(|o| StoredObject::from_pb(o, None).ok()) else { return };
                let actions = self.validators[j].core.on_evidence(s.epoch, obj);
                self.act(j, actions);
            }
            pb::command::Kind::MergeCheck(mc) => self.vote_on_merge(j, mc),
            _ => {}
        }
    }

    /// What a validator's round asks its shell to do.
    pub(super) fn act(&mut self, j: usize, actions: Vec<Action>) {
        let validator = self.validators[j].peer;
        for a in actions {
            let ev = match a {
                Action::Ask { epoch, miner, items, inner_step, trace } => {
                    let trace = trace.zip(items.first().copied()).map(|(s, k)| (k, s));
                    Event::EvidenceAsk { validator, epoch, miner, items, inner_step, trace }
                }
                Action::Check(job) => {
                    // The recompute takes its time; its result is the truth.
                    let result = self.recompute(&job);
                    self.report.checks += 1;
                    let t = self.now + self.cfg.check_ms;
                    self.at(t, Happening::Checked(j, job, result));
                    continue;
                }
                // The simulated checks fail with nothing to prove.
                Action::Prove(_) => continue,
                Action::Vote { epoch, miner, guilty, samples, evidence_hash, reason, proof, .. } => {
                    Event::Verdict(VerdictIn {
                        validator,
                        epoch,
                        miner,
                        check: Check::Recompute,
                        guilty,
                        samples,
                        evidence_hash,
                        reason,
                        signed: Vec::new(),
                        proof,
                        step_proven: None,
                    })
                }
                Action::Done { epoch, weights, miners_hash } => {
                    if !weights.is_empty() {
                        self.weights_sent.push((epoch, validator));
                    }
                    Event::ValidationDone {
                        validator,
                        epoch,
                        weights,
                        miners_hash: Some(miners_hash),
                        signed: Vec::new(),
                    }
                }
            };
            self.send_in_order(j, 0, ev);
        }
    }

    /// Sends validator `j`'s report `after` ms from now, behind those it
    /// sent before: a validator's reports go one after another on one
    /// connection (its asks must reach the orchestrator downstream
    /// miners first, as it sends them).
    fn send_in_order(&mut self, j: usize, after: u64, ev: Event) {
        let d = self.delay();
        let t = (self.now + after + d).max(self.validators[j].last_sent_ms);
        self.validators[j].last_sent_ms = t;
        self.at(t, Happening::FromValidator(j, Box::new(ev)));
    }

    /// A check's result is in.
    pub(super) fn checked(&mut self, j: usize, job: &CheckJob, result: Result<(), String>) {
        let actions = self.validators[j].core.checked(job, result);
        self.act(j, actions);
    }

    /// A validator's report reaches the orchestrator; one refused is lost
    /// (what a validator sends in time must count).
    pub(super) fn validator_report(&mut self, j: usize, ev: Event) {
        let what = match &ev {
            Event::EvidenceAsk { .. } => "evidence ask",
            Event::Verdict(_) => "verdict",
            Event::ValidationDone { .. } => "weights",
            Event::MergeVote { .. } => "merge vote",
            Event::MergeAudit { .. } => "merge audit",
            _ => "report",
        };
        let guilty = match &ev {
            Event::Verdict(v) if v.guilty => Some((v.miner, v.check)),
            _ => None,
        };
        match self.step(ev) {
            Ok(outs) => {
                if let Some((miner, check)) = guilty {
                    self.guilty.entry(miner).or_insert(check);
                }
                self.deliver(outs)
            }
            Err(e) => {
                self.report.validator_refusals += 1;
                if matches!(what, "weights" | "verdict" | "merge vote") {
                    self.report.lost_reports.push(format!("at {} ms: validator {j}'s {what}: {e}", self.now));
                }
            }
        }
    }

    /// The merged model as the validator loads it: each stage's hash is
    /// what its honest participants merged to. A participant that
    /// reported another is voted guilty (check Merge) before the vote on
    /// the model, which keeps it.
    fn vote_on_merge(&mut self, j: usize, mc: pb::MergeCheck) {
        let validator = self.validators[j].peer;
        let merged: BTreeMap<u32, [u8; 32]> =
            mc.stages.iter().map(|s| (s.stage, merged_hash(mc.epoch, s.stage))).collect();
        for s in &mc.stages {
            let loaded = merged_hash(mc.epoch, s.stage);
            for r in &s.reported {
                let Ok(miner) = <[u8; 32]>::try_from(r.peer.as_slice()).map(PeerId) else { continue };
                if r.weights_hash.as_slice() == loaded || !self.lies_about_merge(&miner) {
                    continue;
                }
                let reason = format!("reported stage {} merged weights that are not the stored merge", s.stage);
                let v = VerdictIn {
                    validator,
                    epoch: mc.epoch,
                    miner,
                    check: Check::Merge,
                    guilty: true,
                    samples: 0,
                    evidence_hash: None,
                    reason,
                    signed: Vec::new(),
                    proof: Vec::new(),
                    step_proven: None,
                };
                self.send_in_order(j, self.cfg.check_ms, Event::Verdict(v));
            }
        }
        self.validators[j].core.merge_kept(mc.epoch, merged.clone());
        let ev = Event::MergeVote {
            validator,
            epoch: mc.epoch,
            rollback: false,
            loss: 2.0,
            reason: String::new(),
            merged: merged.into_iter().collect(),
        };
        self.send_in_order(j, self.cfg.check_ms, ev);
    }

    /// Reads a merge audit's context: the plan its audits name.
    pub(super) fn audit_context(&mut self, c: pb::MergeAuditContext) {
        let Some(pl) = c.plan.as_ref() else { return };
        if self.audit_plans.get(&pl.stage).is_some_and(|(id, _)| *id == c.id) {
            return;
        }
        if let Ok(plan) = iota_wire::plan_from_pb(pl) {
            self.audit_plans.insert(plan.stage, (c.id, Rc::new(plan)));
        }
    }

    /// What a merge audit command asks (the last one read is reused: the
    /// orchestrator sends the same audit to every validator in a row).
    pub(super) fn audit_ask(&mut self, a: &pb::MergeAudit) -> Option<Rc<AuditAsk>> {
        if let Some(last) = &self.last_audit
            && (last.epoch, last.stage, last.partition, last.generation)
                == (a.epoch, a.stage, a.partition, a.generation)
            && last.context == a.context
        {
            return Some(last.clone());
        }
        let (id, plan) = self.audit_plans.get(&a.stage)?;
        if *id != a.context || plan.epoch != a.epoch {
            return None;
        }
        let part = plan.partitions.get(a.partition as usize)?;
        let ask = Rc::new(AuditAsk {
            epoch: plan.epoch,
            stage: plan.stage,
            partition: a.partition,
            generation: part.generation,
            offset: part.offset,
            context: a.context.clone(),
            flagged: plan.participants.iter().map(|p| p.peer).filter(|p| self.flaggable(p)).collect(),
            unbound: plan.participants.iter().map(|p| p.peer).filter(|p| self.unbound(p)).collect(),
            participants: plan.participants.iter().map(|p| p.peer).collect(),
        });
        self.last_audit = Some(ask.clone());
        Some(ask)
    }

    /// A merge audit arrives: the validator reads the partition's stored
    /// contributions (a store read) and recomputes (a check).
    pub(super) fn on_audit(&mut self, j: usize, a: Rc<AuditAsk>) {
        let t = self.now + self.cfg.store_ms + self.cfg.check_ms;
        self.at(t, Happening::Audited(j, a));
    }

    /// The audit's answer, from what the simulated store holds now: who
    /// stored nothing, whose stored contribution is not what the owners
    /// reduced, and otherwise the honest update's hash with the senders
    /// whose contributions are flagged or not bound to their weights.
    pub(super) fn answer_audit(&mut self, j: usize, a: &AuditAsk) {
        let k = a.partition;
        let (missing, contradicting) = match self.contributions.get(&(a.epoch, a.stage, k)) {
            Some((stored, framed)) => {
                let missing = a.participants.iter().filter(|p| !stored.contains(p)).copied().collect();
                let at = ((a.epoch, a.stage), (k, a.offset));
                (missing, framed.iter().map(|p| self.contribution_header(*p, at.0, at.1, 2)).collect::<Vec<_>>())
            }
            None => (a.participants.clone(), Vec::new()),
        };
        let hash = (missing.is_empty() && contradicting.is_empty()).then(|| slice_hash(k));
        let (flagged, unbound) = match hash {
            Some(_) => (a.flagged.clone(), a.unbound.clone()),
            None => (Vec::new(), Vec::new()),
        };
        let ev = Event::MergeAudit {
            validator: self.validators[j].peer,
            epoch: a.epoch,
            stage: a.stage,
            partition: k,
            generation: a.generation,
            hash,
            missing,
            flagged,
            contradicting,
            unbound,
            reason: String::new(),
        };
        self.send_in_order(j, 0, ev);
    }
}
