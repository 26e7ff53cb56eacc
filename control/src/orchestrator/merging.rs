//! The orchestrator's side of butterfly merging: one plan per stage when
//! Merging starts, and turning a stage merge's outputs into commands.

use iota_core::merge::{MergePlan, Participant};

use iota_core::merge::{MergeOut, StageMerge};
use iota_protocol::{MergeMethod, pb};

use super::{Orchestrator, Out};

impl Orchestrator {
    /// Sends what a stage's butterfly merge asked for to its participants.
    pub(super) fn merge_outs(&mut self, stage: u32, mo: Vec<MergeOut>, out: &mut Vec<Out>) {
        let Some(bm) = self.butterfly.get(&stage) else { return };
        let mut to_record = Vec::new();
        for o in mo {
            for p in &bm.plan.participants {
                let cmd = match &o {
                    MergeOut::Plan => match self.miners.get(&p.peer) {
                        Some(m) => self.phase_cmd_for(m),
                        None => continue,
                    },
                    MergeOut::Verdict(v) => pb::command::Kind::Verdict(pb::SliceVerdict {
                        epoch: self.epoch,
                        stage,
                        partition: v.partition,
                        generation: v.generation,
                        hash: v.hash.to_vec(),
                        writer: v.writer.0.to_vec(),
                    }),
                };
                out.push(Out { to: p.peer, cmd });
            }
        }
        // New disputes go to the run's record and counters.
        let known = self.mismatches.iter().filter(|m| m.epoch == self.epoch && m.stage == stage).count();
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
    }

    /// One butterfly plan per stage, over the miners that uploaded (i.e.
    /// finished training), weighted by the work this orchestrator counted;
    /// a benched miner takes part only if it did work this epoch (see
    /// `MinerState::merges`).
    pub(super) fn plan_merges(&mut self) {
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
            let plan = MergePlan::new(
                self.epoch,
                s,
                participants,
                params,
                self.spec.run_id,
                self.spec.merge.slices_per_replica,
            );
            self.butterfly.insert(s, StageMerge::new(plan));
        }
    }
}
