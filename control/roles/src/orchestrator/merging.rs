//! The orchestrator's side of butterfly merging: one plan per stage when
//! Merging starts, and turning a stage merge's outputs into commands.

use iota_core::merge::{MergeOut, MergePlan, Participant, PartitionOf, SignedContribution, SliceReport, StageMerge};
use iota_wire::{MergeMethod, StoredObject, pb};

use iota_core::PeerId;

use super::phase::StageParts;
use super::state::Upload;
use super::{Ms, Orchestrator, Out, Phase, Refusal};

/// Checks the contribution headers an owner reported with its result for
/// partition `k` of `plan`: each must be a contribution to that partition,
/// signed by its sender (an honest owner only hands on frames it verified).
fn check_contributions(
    plan: &MergePlan,
    run_id: u64,
    k: u32,
    headers: &[Vec<u8>],
) -> Result<Vec<SignedContribution>, Refusal> {
    let Some(to) = PartitionOf::of(plan, run_id, k) else { return Ok(Vec::new()) };
    headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            SignedContribution::check(h, &to).map_err(|e| Refusal::Invalid(format!("contribution header {i}: {e}")))
        })
        .collect()
}

impl Orchestrator {
    /// An owner's result for a partition (`SliceDone`), with the headers
    /// of the contributions it reduced and the senders it flagged. A stale
    /// one is counted and ignored; one whose headers prove a sender
    /// equivocated, or whose flag is a sender's second, convicts the
    /// sender.
    #[allow(clippy::too_many_arguments, reason = "one report's fields, grouped")]
    pub(super) fn on_slice_done(
        &mut self,
        now: Ms,
        peer: PeerId,
        (epoch, stage): (u64, u32),
        (partition, generation, hash): (u32, u32, [u8; 32]),
        contributions: &[Vec<u8>],
        flagged: Vec<PeerId>,
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        let mut mo = Vec::new();
        let current = self.merge_is_current(epoch);
        let accepted = match self.butterfly.get_mut(&stage).filter(|m| current && m.plan.epoch == epoch) {
            Some(m) => {
                let contributions = check_contributions(&m.plan, self.spec.run_id, partition, contributions)?;
                let report = SliceReport { hash, contributions, flagged };
                m.slice_done(peer, partition, generation, &report, &mut mo)
            }
            None => false,
        };
        if !accepted {
            self.counters.stale_reports += 1;
        }
        let convicts: Vec<(PeerId, bool)> = mo
            .iter()
            .filter_map(|o| match o {
                MergeOut::Equivocated(p) => Some((*p, true)),
                MergeOut::Flawed(p) => Some((*p, false)),
                _ => None,
            })
            .collect();
        self.merge_outs(stage, mo, out);
        for (miner, equivocated) in convicts {
            if equivocated {
                self.convict_equivocator(now, stage, miner, out);
            } else {
                self.convict_flawed(now, stage, miner, out);
            }
        }
        Ok(())
    }

    /// What a participant of a running butterfly merge may have missed:
    /// the verdicts on its stage's settled partitions, then the merged
    /// slices stored so far. Commands are not delivered reliably: those in
    /// a crashed orchestrator's buffers are lost though its state has them
    /// (a verdict is saved before it is sent), and a full queue drops its
    /// oldest. A miner takes a repeat as a no-op.
    pub fn butterfly_catch_up(&self, peer: &PeerId) -> Vec<Out> {
        let Some(stage) = self.miners.get(peer).map(|m| m.stage) else { return Vec::new() };
        let Some(bm) = self.butterfly.get(&stage) else { return Vec::new() };
        let epoch = bm.plan.epoch;
        if !self.merge_is_current(epoch) || !bm.plan.is_participant(peer) || bm.done.contains_key(peer) {
            return Vec::new();
        }
        let verdicts = bm.verdicts.iter().flatten().map(|v| {
            pb::command::Kind::Verdict(pb::SliceVerdict {
                epoch,
                stage,
                partition: v.partition,
                generation: v.generation,
                hash: v.hash.to_vec(),
                writer: v.writer.0.to_vec(),
            })
        });
        let stored = self
            .objects_of(epoch, stage)
            .into_iter()
            .flat_map(|so| so.weights.values())
            .filter(|o| o.writer != *peer)
            .map(|o| pb::command::Kind::Stored(pb::Stored { epoch, stage, object: Some(o.to_pb()) }));
        verdicts.chain(stored).map(|cmd| Out { to: *peer, cmd }).collect()
    }

    /// Sends what a stage's butterfly merge asked for to its participants.
    pub(super) fn merge_outs(&mut self, stage: u32, mo: Vec<MergeOut>, out: &mut Vec<Out>) {
        let Some(bm) = self.butterfly.get(&stage) else { return };
        let mut to_record = Vec::new();
        let mut audits = Vec::new();
        let mut missing = Vec::new();
        let mut parts = StageParts::default();
        for o in mo {
            if let MergeOut::Missing { partition, generation, sender } = o {
                missing.push((partition, generation, sender));
                continue;
            }
            if let MergeOut::Audit { partition, generation } = o {
                audits.push((partition, generation, false));
                continue;
            }
            if let MergeOut::AuditFlags { partition, generation } = o {
                audits.push((partition, generation, true));
                continue;
            }
            for p in &bm.plan.participants {
                let cmd = match &o {
                    MergeOut::Plan => match self.miners.get(&p.peer) {
                        Some(m) => self.phase_cmd_with(m, &mut parts),
                        None => continue,
                    },
                    MergeOut::Verdict(v) => pb::command::Kind::Verdict(pb::SliceVerdict {
                        epoch: bm.plan.epoch,
                        stage,
                        partition: v.partition,
                        generation: v.generation,
                        hash: v.hash.to_vec(),
                        writer: v.writer.0.to_vec(),
                    }),
                    // The caller convicts it (see `convict_equivocator`).
                    MergeOut::Equivocated(_) | MergeOut::Flawed(_) | MergeOut::Colluded(_) | MergeOut::Deviant(_) => {
                        continue;
                    }
                    MergeOut::Audit { .. } | MergeOut::AuditFlags { .. } | MergeOut::Missing { .. } => continue,
                };
                out.push(Out { to: p.peer, cmd });
            }
        }
        // New disputes go to the run's record and counters.
        let known = self.mismatches.iter().filter(|m| m.epoch == bm.plan.epoch && m.stage == stage).count();
        for m in bm.mismatches.iter().skip(known) {
            to_record.push(m.clone());
        }
        // Deviants found by a referee update the recorded dispute.
        for m in &bm.mismatches {
            if let Some(r) = self.mismatches.iter_mut().find(|r| {
                r.epoch == m.epoch && r.stage == m.stage && r.partition == m.partition && r.generation == m.generation
            }) {
                r.deviants = m.deviants.clone();
            }
        }
        self.counters.hash_mismatches += to_record.len() as u64;
        self.mismatches.extend(to_record);
        for (partition, generation, flags) in audits {
            self.open_merge_audit(stage, partition, generation, (flags, Vec::new()), out);
        }
        for (partition, generation, sender) in missing {
            self.ask_withheld(stage, (partition, generation), sender, out);
        }
    }

    /// One butterfly plan per stage, over the miners that uploaded (i.e.
    /// finished training), weighted by the work this orchestrator counted;
    /// a benched miner takes part only if it did work this epoch (see
    /// `MinerState::merges`).
    pub(super) fn plan_merges(&mut self, rng: &mut iota_core::Rng) {
        self.fitness_changes += 1;
        self.butterfly.clear();
        if self.spec.merge.method != MergeMethod::Butterfly {
            return;
        }
        for s in 0..self.spec.stages {
            let participants: Vec<Participant> = self
                .uploads
                .get(&s)
                .map(|u| {
                    u.keys()
                        .filter_map(|p| self.miners.get(p))
                        .filter(|m| m.live() && m.merges(self.epoch))
                        .map(|m| Participant { peer: m.peer, work: m.work })
                        .collect()
                })
                .unwrap_or_default();
            let params = self.spec.merge.stage_params[s as usize];
            let plan = self.spec.merge.plan(self.epoch, s, participants, params, self.spec.run_id);
            let mut sm = StageMerge::new(plan);
            // Referees are drawn with a secret of this orchestrator's.
            sm.draw_referees_with(rng.next_u64());
            // With validators, every owner pair's results wait for an audit
            // (merge_audit.rs); the draw's seed stays here.
            if self.validation.validators.values().any(|v| v.subscribed) {
                sm.audit_with(rng.next_u64());
            }
            self.butterfly.insert(s, sm);
        }
    }
}

impl Orchestrator {
    /// Plans out the butterfly participants that cannot finish: gone
    /// silent, restarted (registered again: `joining`, its merge state lost
    /// with its process), or, once `timed_out`, not done while another is
    /// (or, while nobody is done, silent while others have reported, or
    /// silent on a partition it owns whose other owner has reported: it
    /// holds everyone else's partitions hostage). While no participant of a
    /// stage has finished, the healthy ones are waited for: planning them
    /// all out would "complete" the stage with no merged weights written,
    /// and its replicas would go on from different weights; at each
    /// timeout they are sent the verdicts and stored slices again, in case
    /// what they wait for was lost on the way.
    pub(super) fn tend_butterfly(&mut self, now: Ms, timed_out: bool, out: &mut Vec<Out>) {
        // The participants are scanned for those to plan out only when a
        // miner's fitness changed since the last scan, or at a timeout (the
        // scan costs every participant's lookup, and this runs on every
        // event of the merge).
        let rescan = timed_out || self.fitness_scanned != Some(self.fitness_changes);
        self.fitness_scanned = Some(self.fitness_changes);
        for s in 0..self.spec.stages {
            // First the senders an owner still misses a contribution from
            // (past the store's patience, or at the timeout): they, not the
            // owners waiting on them, are planned out.
            self.plan_out_withheld(now, s, timed_out, out);
            let Some(bm) = self.butterfly.get(&s).filter(|_| rescan) else { continue };
            let someone_done = !bm.done.is_empty();
            // Only a timed-out merge with nobody done asks (it runs on every
            // event of the merge, and costs participants x partitions).
            let someone_reported =
                timed_out && !someone_done && bm.plan.participants.iter().any(|p| bm.reported(&p.peer));
            let laggards = if timed_out && !someone_done { bm.laggard_owners() } else { Default::default() };
            let gone: Vec<PeerId> = bm
                .plan
                .participants
                .iter()
                .map(|p| p.peer)
                .filter(|p| {
                    !self.miners.get(p).is_some_and(|m| m.healthy && !m.joining)
                        || (timed_out && someone_done && !bm.done.contains_key(p))
                        || (timed_out && !someone_done && someone_reported && !bm.reported(p))
                        || laggards.contains(p)
                })
                .collect();
            if !gone.is_empty() {
                let mut mo = Vec::new();
                if let Some(bm) = self.butterfly.get_mut(&s) {
                    bm.drop_participants(&gone, &mut mo);
                }
                self.merge_outs(s, mo, out);
            }
            // Those still waited for may be waiting on a lost command.
            if timed_out && let Some(bm) = self.butterfly.get(&s) {
                let waited: Vec<PeerId> = bm.plan.participants.iter().map(|p| p.peer).collect();
                for p in waited {
                    out.extend(self.butterfly_catch_up(&p));
                }
            }
        }
    }

    /// Whether every stage's butterfly merge is complete, and (unless the
    /// merge `timed_out`) every partition's merged slice stored (announced
    /// by its current writer), so a miner joining later can load the stage;
    /// a writer that died was replaced by `drop_participants`.
    pub(super) fn butterfly_complete(&self, timed_out: bool) -> bool {
        // Every stage's count first: the stores' check reads every
        // partition, and this is asked on every event of a merge.
        self.butterfly.values().all(|m| m.complete())
            && (timed_out || self.butterfly.iter().all(|(s, m)| self.stage_stored(*s, m)))
    }

    /// Whether reports about the butterfly merge of `epoch` are current: it
    /// is the merge of the Merging phase, or the one running behind the
    /// next epoch's training (`merge.overlap`).
    pub(super) fn merge_is_current(&self, epoch: u64) -> bool {
        (epoch == self.epoch && matches!(self.phase, Phase::Merging)) || self.behind.running() == Some(epoch)
    }

    /// A participant finished its butterfly merge with weights hash `h`,
    /// having read `from_store` slices (contributions, updates) from the
    /// store: counted and logged when the report is accepted, each claim cut
    /// to 4 reads per partition (a replica reads a partition from the store
    /// at most once per generation). False: stale.
    pub(super) fn butterfly_done(
        &mut self,
        peer: PeerId,
        (epoch, stage): (u64, u32),
        h: [u8; 32],
        from_store: (u32, u32),
    ) -> bool {
        let Some(m) = self.butterfly.get_mut(&stage) else { return false };
        let most = m.plan.partitions.len() as u64 * 4;
        // Counted once per participant: a repeated report adds nothing.
        let first = !m.done.contains_key(&peer);
        let accepted = m.merge_done(peer, h);
        if accepted && first && from_store != (0, 0) {
            let (c, u) = (u64::from(from_store.0).min(most), u64::from(from_store.1).min(most));
            tracing::warn!(
                %peer, epoch, stage, contributions = c, updates = u,
                "merge slices went through the object store (a peer unreachable, or a frame lost)"
            );
            self.counters.merge_contributions_from_store += c;
            self.counters.merge_updates_from_store += u;
        }
        accepted
    }
}

impl Orchestrator {
    /// A miner uploaded its epoch's work for the merge (parameter server:
    /// the object it stored, checked to be its own).
    pub(super) fn on_upload_done(
        &mut self,
        peer: PeerId,
        (epoch, stage): (u64, u32),
        key: String,
        work: u64,
        object: Option<StoredObject>,
    ) -> Result<(), Refusal> {
        let current = epoch == self.epoch && matches!(self.phase, Phase::Uploading);
        if !current || self.miners.get(&peer).is_none_or(|m| m.stage != stage) {
            self.counters.stale_reports += 1;
            return Ok(());
        }
        match (self.spec.merge.method, object) {
            (MergeMethod::ParameterServer, Some(o)) => {
                self.check_upload(peer, epoch, stage, &o).inspect_err(|_| self.counters.foreign_objects += 1)?;
                self.record_upload(peer, epoch, stage, o);
            }
            (MergeMethod::ParameterServer, None) => {
                return Err(Refusal::Invalid("a parameter-server upload must announce its object".into()));
            }
            (MergeMethod::Butterfly, _) => {}
        }
        self.uploads.entry(stage).or_default().insert(peer, Upload { key, work });
        Ok(())
    }

    /// A miner finished its part of the merge: the parameter server's
    /// aggregator stored the merged weights, or a butterfly participant
    /// holds merged weights with this hash.
    pub(super) fn on_merge_done(
        &mut self,
        peer: PeerId,
        (epoch, stage): (u64, u32),
        key: String,
        weights_hash: &[u8],
        object: Option<StoredObject>,
        from_store: (u32, u32),
    ) -> Result<(), Refusal> {
        let current = self.merge_is_current(epoch);
        let accepted = match self.spec.merge.method {
            MergeMethod::ParameterServer if current && self.aggregator(stage) == Some(peer) => {
                self.record_merged(epoch, stage, object).inspect_err(|e| {
                    if matches!(e, Refusal::NotYours(_)) {
                        self.counters.foreign_objects += 1;
                    }
                })?;
                self.merged.insert(stage, key);
                if let Ok(h) = <[u8; 32]>::try_from(weights_hash) {
                    self.merged_hash.insert(stage, h);
                }
                true
            }
            MergeMethod::Butterfly if current => {
                let h = <[u8; 32]>::try_from(weights_hash)
                    .map_err(|_| Refusal::Invalid("weights hash must be 32 bytes".into()))?;
                self.butterfly_done(peer, (epoch, stage), h, from_store)
            }
            _ => false,
        };
        if !accepted {
            self.counters.stale_reports += 1;
        }
        Ok(())
    }
}
