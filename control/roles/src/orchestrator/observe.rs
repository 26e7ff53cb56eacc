//! Read-only views of the run for operators (the dashboard, metrics):
//! nothing here changes the state.

use std::collections::BTreeMap;

use iota_core::PeerId;
use iota_core::merge::{MergePlan, Mismatch};

use super::{MbStatus, Ms, Orchestrator, Phase};

/// How far a stage's merge of the current epoch has come.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MergeProgress {
    /// Replicas whose upload (parameter server) or merge plan entry
    /// (butterfly) is in.
    pub uploaded: usize,
    /// Butterfly partitions, and those whose result is settled.
    pub partitions: usize,
    pub settled: usize,
    /// Butterfly participants, and those that reported their merged weights.
    pub participants: usize,
    pub finished: usize,
    /// The stage's merged weights are known.
    pub merged: bool,
}

impl Orchestrator {
    /// Every butterfly hash mismatch so far.
    pub fn mismatches(&self) -> &[Mismatch] {
        &self.mismatches
    }
    /// The current butterfly plan of a stage (Merging phase).
    pub fn merge_plan(&self, stage: u32) -> Option<&MergePlan> {
        self.butterfly.get(&stage).map(|m| &m.plan)
    }

    /// The stage's merge progress (all zero outside upload and merge).
    pub fn merge_progress(&self, stage: u32) -> MergeProgress {
        let mut p = MergeProgress {
            uploaded: self.uploads.get(&stage).map_or(0, |u| u.len()),
            merged: self.merged.contains_key(&stage),
            ..MergeProgress::default()
        };
        if let Some(m) = self.butterfly.get(&stage) {
            p.partitions = m.plan.partitions.len();
            p.settled = m.verdicts.iter().filter(|v| v.is_some()).count();
            p.participants = m.plan.participants.len();
            p.finished = m.done.len();
            p.uploaded = p.uploaded.max(p.participants);
            p.merged |= p.participants > 0 && p.finished == p.participants;
        }
        p
    }

    /// Time spent training over the run, the current phase included (ms).
    pub fn training_ms(&self, now: Ms) -> u64 {
        let current = if self.phase == Phase::Training { now.saturating_sub(self.phase_entered) } else { 0 };
        self.counters.training_ms + current
    }

    /// Mean tokens per completed micro-batch (0 before the first).
    pub fn tokens_per_micro_batch(&self) -> f64 {
        if self.counters.completed == 0 { 0.0 } else { self.counters.tokens as f64 / self.counters.completed as f64 }
    }

    /// The pathways micro-batches are in flight on now, each with how many
    /// (hedges counted on their own pathway); the busiest `limit`.
    pub fn pathways_in_flight(&self, limit: usize) -> Vec<(Vec<PeerId>, u32)> {
        let mut count: BTreeMap<&[PeerId], u32> = BTreeMap::new();
        for r in self.mbs.values() {
            if let MbStatus::InFlight { pathway, hedge, .. } = &r.status {
                *count.entry(pathway.as_slice()).or_default() += 1;
                if let Some(h) = hedge {
                    *count.entry(h.pathway.as_slice()).or_default() += 1;
                }
            }
        }
        let mut v: Vec<(Vec<PeerId>, u32)> = count.into_iter().map(|(p, n)| (p.to_vec(), n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(limit);
        v
    }

    /// Losses of the current epoch's completed micro-batches, in issue
    /// order (the finished epochs' are in `history`).
    pub fn current_losses(&self) -> Vec<f32> {
        if self.phase == Phase::Done {
            return Vec::new();
        }
        self.mbs
            .values()
            .filter_map(|r| match r.status {
                MbStatus::Done { loss, .. } => Some(loss),
                _ => None,
            })
            .collect()
    }
}
