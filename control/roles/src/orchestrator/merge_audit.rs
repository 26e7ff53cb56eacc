//! Merge audits (PROTOCOL.md, "Merge audits"): the validators recompute one
//! partition per pair of owners from the participants' stored
//! contributions, and the stage merge (`iota_core::merge::StageMerge`)
//! holds the pair's agreed results until the validators' stake has
//! spoken. Two owners that agree on a wrong result are convicted (check
//! `Merge`) before anything of theirs is applied; a participant that
//! withholds its contribution from the audit is convicted too.
//!
//! The decision is by stake, like every verdict: more than half of all
//! validator stake reporting the owners' hash passes the audit, more than
//! half reporting another hash fails it, more than half naming a
//! participant as missing convicts that participant. An audit no majority
//! decides by the time every validator it went to has answered, or by
//! `validation.timeout_ms`, is released: the owners' result is accepted as
//! it would be without audits (a swarm whose validators are gone still
//! merges).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use iota_core::PeerId;
use iota_core::merge::MergeOut;
use iota_wire::{pb, plan_to_pb};
use tracing::{info, warn};

use super::validation_state::{AuditAnswer, OpenAudit};
use super::{Ms, Orchestrator, Out, Refusal};

/// Audits waiting at once (one per owner pair per stage; bounded).
pub(super) const MAX_OPEN_AUDITS: usize = 4096;

/// Asks `peer` to store its contributions to `partitions` of a merge.
fn contribution_request(peer: PeerId, (epoch, stage): (u64, u32), partitions: BTreeSet<u32>) -> Out {
    let req = pb::ContributionRequest { epoch, stage, partitions: partitions.into_iter().collect() };
    Out { to: peer, cmd: pb::command::Kind::ContributionRequest(req) }
}

impl Orchestrator {
    /// Sends each participant the contributions audits asked of it since
    /// the last tick, in one request.
    pub(super) fn flush_contribution_requests(&mut self, out: &mut Vec<Out>) {
        for (peer, (merge, partitions)) in std::mem::take(&mut self.validation.contribution_requests) {
            if !partitions.is_empty() {
                out.push(contribution_request(peer, merge, partitions));
            }
        }
    }

    /// A stage merge holds an agreed partition for its audit: every
    /// participant is asked to store its contribution, every subscribed
    /// validator to recompute.
    pub(super) fn open_merge_audit(
        &mut self,
        stage: u32,
        partition: u32,
        generation: u32,
        (flags, withheld): (bool, Vec<PeerId>),
        out: &mut Vec<Out>,
    ) {
        let Some(bm) = self.butterfly.get(&stage) else { return };
        let validators: Vec<PeerId> =
            self.validation.validators.values().filter(|v| v.subscribed).map(|v| v.peer).collect();
        // The merge's epoch (behind compute, the epoch before the one
        // training).
        let epoch = bm.plan.epoch;
        // Asked at the next tick, with every other partition audited by
        // then: a stage of R replicas opens about R audits a merge, and one
        // request per participant per audit was R^2 messages.
        for p in &bm.plan.participants {
            let asked = self.validation.contribution_requests.entry(p.peer).or_default();
            if asked.0 != (epoch, stage) && !asked.1.is_empty() {
                out.push(contribution_request(p.peer, asked.0, std::mem::take(&mut asked.1)));
            }
            asked.0 = (epoch, stage);
            asked.1.insert(partition);
        }
        let reported = bm
            .reported_contributions(partition)
            .into_iter()
            .map(|(p, h)| pb::ReportedContribution { sender: p.0.to_vec(), payload_hash: h.to_vec() })
            .collect();
        let generation_now = bm.plan.partitions.get(partition as usize).map_or(generation, |p| p.generation);
        let context = self.audit_context(stage, epoch);
        let audit = pb::MergeAudit {
            context: context.id.clone(),
            partition,
            epoch,
            stage,
            generation: generation_now,
            reported,
        };
        for v in &validators {
            // The plan, momentum and chains go once per validator and plan,
            // not with each of the merge's audits.
            let sent = self.validation.audit_contexts_sent.entry((*v, stage)).or_default();
            if *sent != context.id {
                sent.clone_from(&context.id);
                out.push(Out { to: *v, cmd: pb::command::Kind::MergeAuditContext((*context).clone()) });
            }
            out.push(Out { to: *v, cmd: pb::command::Kind::MergeAudit(audit.clone()) });
        }
        let audits = &mut self.validation.merge_audits;
        // A new audit of a partition replaces the one before it, except a
        // withholding audit of an earlier generation: the sender it names
        // is judged whatever became of the partition since. (One of the
        // same generation is moot: its owners got every contribution.)
        audits.retain(|a| {
            !(a.epoch == epoch
                && a.stage == stage
                && a.partition == partition
                && (a.withheld.is_empty() || a.generation == generation))
        });
        if audits.len() >= MAX_OPEN_AUDITS {
            audits.remove(0);
        }
        self.audits_opened += 1;
        audits.push(OpenAudit {
            epoch,
            stage,
            partition,
            generation,
            flags,
            withheld,
            since: None,
            sent_to: validators,
            answers: BTreeMap::new(),
            unbound: BTreeMap::new(),
        });
    }

    /// What every audit of a stage's current plan shares, with its id;
    /// built again only when something it is built from changed (the
    /// plan, the weights the merge started from, a commitment).
    fn audit_context(&mut self, stage: u32, epoch: u64) -> Arc<pb::MergeAuditContext> {
        let Some(bm) = self.butterfly.get(&stage) else { return Arc::default() };
        let key = (epoch, bm.plan_revision(), self.weights_epoch(), self.commitments_changed);
        if let Some((k, c)) = self.validation.audit_context_cache.get(&stage)
            && *k == key
        {
            return Arc::clone(c);
        }
        let context = Arc::new(self.build_audit_context(stage, epoch));
        self.validation.audit_context_cache.insert(stage, (key, Arc::clone(&context)));
        context
    }

    fn build_audit_context(&self, stage: u32, epoch: u64) -> pb::MergeAuditContext {
        let Some(bm) = self.butterfly.get(&stage) else { return pb::MergeAuditContext::default() };
        // Each participant's weights chain and the stage's start: what its
        // stored contribution is held against (not behind compute, where a
        // contribution is the landed weights', which no chain has).
        // A sparse sender's backlog hash too, and its chain and backlog of
        // the epoch before, which its backlog must follow from.
        let sparse = self.spec.merge.sparse_density > 0.0;
        let chain_of = |peer: &PeerId, epoch: u64| {
            let heads = self.miners.get(peer)?.commitments.get(&epoch)?;
            let w = &heads.weights;
            Some(pb::ParticipantChain {
                peer: peer.0.to_vec(),
                weights: Some(pb::ChainHead { len: w.len, head: w.head.to_vec() }),
                backlog: heads.backlog.filter(|_| sparse).map(|h| h.to_vec()).unwrap_or_default(),
                before: None,
            })
        };
        let stage_start = |starts: &BTreeMap<u32, [u8; 32]>| starts.get(&stage).map(|h| vec![h.to_vec()]);
        // Whether an epoch started from the run seed's weights (its entry
        // says so: epoch 0, and every epoch after merges all rolled back).
        // No entry (forgotten, or a state from before it was kept) is an
        // unknown start, which judges nobody: never assumed the seed's.
        let seeded = |e: u64| self.started_from.get(&e) == Some(&None);
        let bound = !self.spec.merge.overlap && self.spec.validation.bind_contributions;
        let seed_start = bound && seeded(epoch);
        let seed_start_before = bound && sparse && epoch.checked_sub(1).is_some_and(seeded);
        let (committed, starts, starts_before) = if !bound {
            (Vec::new(), Vec::new(), Vec::new())
        } else {
            let committed = bm
                .plan
                .participants
                .iter()
                .filter_map(|p| {
                    let mut c = chain_of(&p.peer, epoch)?;
                    if sparse && let Some(before) = epoch.checked_sub(1).and_then(|e| chain_of(&p.peer, e)) {
                        c.before = Some(Box::new(before));
                    }
                    Some(c)
                })
                .collect();
            let before = if sparse { stage_start(&self.validation.starts_before) } else { None };
            (committed, stage_start(&self.validation.starts).unwrap_or_default(), before.unwrap_or_default())
        };
        let mut context = pb::MergeAuditContext {
            id: Vec::new(),
            plan: Some(plan_to_pb(&bm.plan)),
            momentum: self.momentum_manifest(stage),
            committed,
            starts,
            starts_before,
            seed_start,
            seed_start_before,
        };
        context.id = blake3::hash(&prost::Message::encode_to_vec(&context)).as_bytes().to_vec();
        context
    }

    /// A validator found participants of an audited partition whose stored
    /// contribution is not the slice of their committed weights'
    /// pseudo-gradient (a copy, a negation, a scaled one). More than half
    /// of all validator stake naming one plans it out and convicts it
    /// (check `Merge`, counted in `unbound_contributions`).
    pub(super) fn on_unbound_contributions(
        &mut self,
        now: Ms,
        validator: PeerId,
        (epoch, stage, partition, generation): (u64, u32, u32, u32),
        unbound: Vec<PeerId>,
        out: &mut Vec<Out>,
    ) {
        if !self.is_validator(&validator) || !self.merge_is_current(epoch) {
            return;
        }
        let Some(open) =
            self.validation.merge_audits.iter_mut().find(|a| {
                a.epoch == epoch && a.stage == stage && a.partition == partition && a.generation == generation
            })
        else {
            return;
        };
        open.unbound.insert(validator, unbound);
        let mut named: BTreeMap<PeerId, u64> = BTreeMap::new();
        for (v, ps) in &open.unbound {
            let stake = self.validation.validators.get(v).map_or(0, |v| v.stake);
            for p in ps {
                *named.entry(*p).or_default() += stake;
            }
        }
        let total = self.total_stake();
        let Some(bm) = self.butterfly.get_mut(&stage) else { return };
        let convicted: Vec<PeerId> = named
            .into_iter()
            .filter(|(p, s)| 2 * u128::from(*s) > total && bm.plan.is_participant(p))
            .map(|(p, _)| p)
            .collect();
        if convicted.is_empty() {
            return;
        }
        let mut mo = Vec::new();
        bm.drop_participants(&convicted, &mut mo);
        self.merge_outs(stage, mo, out);
        for p in convicted {
            warn!(epoch, stage, partition, miner = %p, "a merge contribution is not the pseudo-gradient of its committed weights");
            self.counters.unbound_contributions += 1;
            self.convict_merge(now, p, out);
        }
    }

    /// A validator's answer to an audit; `contradicting`: stored
    /// contributions it found that are not the ones the owners reported
    /// (proofs, taken whatever the audit's state).
    #[allow(clippy::too_many_arguments, reason = "one report's fields")]
    pub(super) fn on_merge_audit(
        &mut self,
        now: Ms,
        validator: PeerId,
        (epoch, stage, partition, generation): (u64, u32, u32, u32),
        (answer, contradicting): (AuditAnswer, &[Vec<u8>]),
        reason: &str,
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        if !self.is_validator(&validator) {
            return Err(Refusal::Unknown(validator));
        }
        if !contradicting.is_empty() {
            self.on_contradicting_contributions(now, (epoch, stage, partition), contradicting, out);
        }
        let current = self.merge_is_current(epoch);
        let open =
            self.validation.merge_audits.iter_mut().find(|a| {
                a.epoch == epoch && a.stage == stage && a.partition == partition && a.generation == generation
            });
        // A withholding audit outlives its merge (see withholding.rs).
        let Some(open) = open.filter(|a| current || !a.withheld.is_empty()) else {
            self.counters.stale_reports += 1;
            return Ok(());
        };
        if !reason.is_empty() {
            info!(epoch, stage, partition, validator = %validator, reason, "merge audit answer");
        }
        open.answers.insert(validator, answer);
        self.decide_merge_audit(now, (epoch, stage, partition, generation), false, out);
        Ok(())
    }

    /// A validator found stored contributions to an audited partition that
    /// are not the ones its owners reported reducing. Each header, signed
    /// by its sender, against the one the owners reported is a proof: no
    /// vote is needed. The sender is planned out and convicted; the owners
    /// reduce again without it.
    fn on_contradicting_contributions(
        &mut self,
        now: Ms,
        (epoch, stage, partition): (u64, u32, u32),
        headers: &[Vec<u8>],
        out: &mut Vec<Out>,
    ) {
        let run_id = self.spec.run_id;
        let current = self.merge_is_current(epoch);
        let Some(bm) = self.butterfly.get_mut(&stage).filter(|m| current && m.plan.epoch == epoch) else { return };
        let proven: Vec<PeerId> = headers.iter().filter_map(|h| bm.stored_contradicts(run_id, partition, h)).collect();
        if proven.is_empty() {
            return;
        }
        let mut mo: Vec<MergeOut> = proven.iter().map(|p| MergeOut::Equivocated(*p)).collect();
        bm.drop_participants(&proven, &mut mo);
        self.merge_outs(stage, mo, out);
        for p in proven {
            warn!(epoch, stage, partition, sender = %p, "a sender stored another contribution than it sent the owners");
            self.convict_equivocator(now, stage, p, out);
        }
    }

    /// Settles an audit if the stake has decided (or `force`: the audit
    /// ran out of time, and is released if undecided).
    fn decide_merge_audit(
        &mut self,
        now: Ms,
        (epoch, stage, partition, generation): (u64, u32, u32, u32),
        force: bool,
        out: &mut Vec<Out>,
    ) {
        let Some(i) = self.validation.merge_audits.iter().position(|a| {
            a.epoch == epoch && a.stage == stage && a.partition == partition && a.generation == generation
        }) else {
            return;
        };
        if self.validation.merge_audits[i].flags {
            self.decide_flag_audit(now, i, force, out);
            return;
        }
        if !self.validation.merge_audits[i].withheld.is_empty() {
            self.decide_withholding_audit(now, i, force, out);
            return;
        }
        if self.butterfly.get(&stage).is_some_and(|bm| bm.disputed.contains_key(&partition)) {
            self.decide_dispute_audit(now, i, force, out);
            return;
        }
        let a = &self.validation.merge_audits[i];
        let Some(held) = self.butterfly.get(&stage).and_then(|bm| bm.held.get(&partition)).cloned() else {
            // Re-planned meanwhile (a participant dropped): a new generation
            // gets a new audit.
            self.validation.merge_audits.remove(i);
            return;
        };
        let stake = |p: &PeerId| self.validation.validators.get(p).map_or(0, |v| v.stake);
        let total = self.total_stake();
        let majority = |s: u64| 2 * u128::from(s) > total;
        let (mut agree, mut differ) = (0u64, 0u64);
        let mut missing: BTreeMap<PeerId, u64> = BTreeMap::new();
        let mut other = None;
        for (v, ans) in &a.answers {
            match ans {
                AuditAnswer::Hash(h, _) if *h == held.hash => agree += stake(v),
                AuditAnswer::Hash(h, _) => {
                    differ += stake(v);
                    other = Some(*h);
                }
                AuditAnswer::Missing(ps) => {
                    for p in ps {
                        *missing.entry(*p).or_default() += stake(v);
                    }
                }
                AuditAnswer::Unable => {}
            }
        }
        let withheld: Vec<PeerId> = missing.into_iter().filter(|(_, s)| majority(*s)).map(|(p, _)| p).collect();
        let all_answered = a.sent_to.iter().all(|v| a.answers.contains_key(v));
        let generation = a.generation;
        let mut mo = Vec::new();
        let Some(bm) = self.butterfly.get_mut(&stage) else { return };
        if majority(agree) {
            bm.audit_result(partition, generation, Some(held.hash), &mut mo);
            self.counters.merge_audits_passed += 1;
        } else if majority(differ) {
            warn!(
                epoch = self.epoch,
                stage, partition, "a merge audit recomputed another result than the owners agreed on"
            );
            bm.audit_result(partition, generation, other, &mut mo);
        } else if !withheld.is_empty() {
            warn!(epoch = self.epoch, stage, partition, ?withheld, "merge contributions withheld from an audit");
            self.validation.merge_audits.remove(i);
            bm.drop_participants(&withheld, &mut mo);
            self.merge_outs(stage, mo, out);
            for p in withheld {
                self.counters.withheld_contributions += 1;
                self.convict_merge(now, p, out);
            }
            return;
        } else if force || all_answered {
            bm.audit_result(partition, generation, None, &mut mo);
            self.counters.merge_audits_released += 1;
        } else {
            return;
        }
        self.validation.merge_audits.remove(i);
        let colluders = named(&mo, |o| if let MergeOut::Colluded(ps) = o { Some(ps) } else { None });
        // A referee's side the recompute confirmed: the other owner of the
        // disputed partition was proven wrong.
        let deviants = named(&mo, |o| if let MergeOut::Deviant(ps) = o { Some(ps) } else { None });
        self.merge_outs(stage, mo, out);
        for p in colluders {
            self.counters.colluding_owners += 1;
            self.convict_merge(now, p, out);
        }
        self.convict_deviants(now, (stage, partition), deviants, out);
    }

    /// A dispute with no referee (R = 2), held for the recompute: a hash
    /// more than half of all validator stake recomputed settles it (the
    /// owner that published another is convicted); undecided at the
    /// deadline, the slice keeps its previous weights.
    fn decide_dispute_audit(&mut self, now: Ms, i: usize, force: bool, out: &mut Vec<Out>) {
        let a = &self.validation.merge_audits[i];
        let (stage, partition, generation) = (a.stage, a.partition, a.generation);
        let stake = |p: &PeerId| self.validation.validators.get(p).map_or(0, |v| v.stake);
        let total = self.total_stake();
        let mut by_hash: BTreeMap<[u8; 32], u64> = BTreeMap::new();
        for (v, ans) in &a.answers {
            if let AuditAnswer::Hash(h, _) = ans {
                *by_hash.entry(*h).or_default() += stake(v);
            }
        }
        let decided = by_hash.into_iter().find(|(_, s)| 2 * u128::from(*s) > total).map(|(h, _)| h);
        let all_answered = a.sent_to.iter().all(|v| a.answers.contains_key(v));
        if decided.is_none() && !force && !all_answered {
            return;
        }
        self.validation.merge_audits.remove(i);
        let mut mo = Vec::new();
        let Some(bm) = self.butterfly.get_mut(&stage) else { return };
        bm.audit_result(partition, generation, decided, &mut mo);
        if decided.is_some() {
            self.counters.merge_audits_passed += 1;
        } else {
            self.counters.merge_audits_released += 1;
        }
        let deviants = named(&mo, |o| if let MergeOut::Deviant(ps) = o { Some(ps) } else { None });
        self.merge_outs(stage, mo, out);
        self.convict_deviants(now, (stage, partition), deviants, out);
    }

    /// Owners a recompute proved wrong in a dispute (against their
    /// referee's side, or their co-owner's at R = 2): convicted.
    fn convict_deviants(&mut self, now: Ms, (stage, partition): (u32, u32), deviants: Vec<PeerId>, out: &mut Vec<Out>) {
        for p in deviants {
            self.counters.deviant_owners += 1;
            warn!(epoch = self.epoch, stage, partition, miner = %p, "a merge owner's disputed result is not what the validators recomputed");
            self.convict_merge(now, p, out);
        }
    }

    /// The flags of two owners against senders of a partition: confirmed
    /// when more than half of all validator stake recomputed flags on every
    /// one of them (they are convicted), refuted when more than half did
    /// not (the two owners framed them and are convicted instead);
    /// undecided at the deadline, the owners' word stands, as without
    /// audits.
    fn decide_flag_audit(&mut self, now: Ms, i: usize, force: bool, out: &mut Vec<Out>) {
        let a = &self.validation.merge_audits[i];
        let (stage, partition, generation) = (a.stage, a.partition, a.generation);
        let Some(hold) = self.butterfly.get(&stage).and_then(|bm| bm.flag_held.get(&partition)).cloned() else {
            self.validation.merge_audits.remove(i);
            return;
        };
        let stake = |p: &PeerId| self.validation.validators.get(p).map_or(0, |v| v.stake);
        let total = self.total_stake();
        let majority = |s: u64| 2 * u128::from(s) > total;
        let (mut confirm, mut refute) = (0u64, 0u64);
        for (v, ans) in &a.answers {
            if let AuditAnswer::Hash(_, flagged) = ans {
                if hold.flagged.iter().all(|f| flagged.contains(f)) {
                    confirm += stake(v);
                } else {
                    refute += stake(v);
                }
            }
        }
        let all_answered = a.sent_to.iter().all(|v| a.answers.contains_key(v));
        let confirmed = if majority(confirm) {
            Some(true)
        } else if majority(refute) {
            warn!(epoch = self.epoch, stage, partition, flaggers = ?hold.flaggers, "owners flagged a contribution the validators' recompute does not");
            Some(false)
        } else if force || all_answered {
            self.counters.merge_audits_released += 1;
            None
        } else {
            return;
        };
        if confirmed == Some(true) {
            self.counters.merge_audits_passed += 1;
        }
        self.validation.merge_audits.remove(i);
        let mut mo = Vec::new();
        let Some(bm) = self.butterfly.get_mut(&stage) else { return };
        bm.flag_audit_result(partition, generation, confirmed, &mut mo);
        let convicted: Vec<(PeerId, bool)> = mo
            .iter()
            .flat_map(|o| match o {
                MergeOut::Colluded(ps) => ps.iter().map(|p| (*p, true)).collect(),
                MergeOut::Flawed(p) => vec![(*p, false)],
                _ => Vec::new(),
            })
            .collect();
        self.merge_outs(stage, mo, out);
        for (p, framed) in convicted {
            if framed {
                self.counters.colluding_owners += 1;
                self.convict_merge(now, p, out);
            } else {
                self.convict_flawed(now, stage, p, out);
            }
        }
    }

    /// Dates new audits and releases the ones past `validation.timeout_ms`
    /// or (except withholding audits, which outlive their merge) whose
    /// merge is over; `withholding_only`: between merges, only those.
    pub(super) fn expire_merge_audits(&mut self, now: Ms, withholding_only: bool, out: &mut Vec<Out>) {
        // Called on every event: the scan of every open audit (thousands at
        // 2,000 miners) is skipped while none can be due. Whether one is
        // due changes only with time, a new audit (removing one makes none
        // due) and what `merge_is_current` reads.
        let key = (self.audits_opened, self.epoch, self.phase.clone(), self.behind.running(), withholding_only);
        if self.merge_audits_quiet.as_ref().is_some_and(|(until, k)| now <= *until && *k == key) {
            return;
        }
        let timeout = self.spec.validation.timeout_ms;
        let mut due = Vec::new();
        let mut quiet_until = Ms::MAX;
        for a in &self.validation.merge_audits {
            let withholding = !a.withheld.is_empty();
            if withholding_only && !withholding {
                continue;
            }
            let over = !withholding && !self.merge_is_current(a.epoch);
            let expires = a.since.unwrap_or(now).saturating_add(timeout);
            if over || a.since.is_some_and(|since| now.saturating_sub(since) > timeout) {
                due.push((a.epoch, a.stage, a.partition, a.generation));
            }
            quiet_until = quiet_until.min(expires);
        }
        for a in &mut self.validation.merge_audits {
            a.since.get_or_insert(now);
        }
        self.merge_audits_quiet = due.is_empty().then_some((quiet_until, key));
        for (epoch, stage, partition, generation) in due {
            warn!(epoch, stage, partition, "a merge audit ran out of time; its owners' result stands");
            self.decide_merge_audit(now, (epoch, stage, partition, generation), true, out);
        }
    }
}

/// The miners the stage merge's outputs name through `pick`.
fn named(mo: &[MergeOut], pick: impl Fn(&MergeOut) -> Option<&Vec<PeerId>>) -> Vec<PeerId> {
    mo.iter().filter_map(pick).flatten().copied().collect()
}
