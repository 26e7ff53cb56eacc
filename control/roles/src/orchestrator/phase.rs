//! What miners are told of the run's phase: the phase command (with a
//! stage's aggregator or merge plan while merging) and its broadcast.

use std::collections::BTreeMap;

use iota_core::PeerId;

use iota_wire::store_keys::upload_prefix;
use iota_wire::{pb, plan_to_pb};

use super::{MinerState, Ms, Orchestrator, Out, Phase};

/// What the phase command holds for every miner of a stage, each stage
/// built once per phase change: at 2,000 miners, converting a stage's plan
/// and manifests again for each of its miners was a tenth of the run.
#[derive(Default)]
pub(super) struct StageParts {
    of: BTreeMap<u32, StagePhase>,
}

struct StagePhase {
    cmd: pb::PhaseChange,
    aggregator: Option<PeerId>,
    /// The stage merge's plan and the momentum it starts from (its
    /// participants only).
    plan: Option<(pb::MergePlan, Vec<pb::StoredObject>)>,
}

/// The shortest a measured phase timeout gets.
pub const MIN_PHASE_TIMEOUT_MS: Ms = 10_000;

impl Orchestrator {
    pub(super) fn phase_cmd(&self) -> pb::command::Kind {
        let (phase, prefix) = match self.phase {
            Phase::Waiting => (pb::Phase::Waiting, String::new()),
            Phase::Training => (pb::Phase::Training, self.weights_prefix()),
            Phase::Uploading => (pb::Phase::Uploading, upload_prefix(self.epoch)),
            Phase::Merging => (pb::Phase::Merging, upload_prefix(self.epoch)),
            Phase::Done => (pb::Phase::Done, self.weights_prefix()),
        };
        pb::command::Kind::Phase(pb::PhaseChange {
            epoch: self.epoch,
            phase: phase as i32,
            aggregator: Vec::new(),
            upload_prefix: prefix,
            merge_plan: None,
            weights: Vec::new(),
            momentum: Vec::new(),
            weights_from: 0,
            uploads: Vec::new(),
        })
    }

    /// Prefix of the merged weights the current epoch starts from.
    pub(super) fn weights_prefix(&self) -> String {
        self.weights_epoch().map_or(String::new(), |e| format!("epoch-{e:06}/"))
    }

    pub(super) fn broadcast_phase(&self, out: &mut Vec<Out>) {
        let mut parts = StageParts::default();
        for m in self.miners.values().filter(|m| m.live()) {
            out.push(Out { to: m.peer, cmd: self.phase_cmd_with(m, &mut parts) });
        }
    }

    /// The phase command for miner `peer` as things stand now (None for an
    /// unknown or unhealthy miner). An orchestrator restored from its saved
    /// state sends it to each miner that subscribes again: commands the old
    /// process had queued died with it, and a miner that missed a phase
    /// change would otherwise refuse every route of the new epoch.
    pub fn phase_for(&self, peer: &PeerId) -> Option<pb::command::Kind> {
        let m = self.miners.get(peer)?;
        m.live().then(|| self.phase_cmd_for(m))
    }

    /// The phase as miner `m` hears it: in Merging, with its stage's
    /// aggregator (parameter server) or plan (butterfly).
    pub(super) fn phase_cmd_for(&self, m: &MinerState) -> pb::command::Kind {
        self.phase_cmd_with(m, &mut StageParts::default())
    }

    /// As `phase_cmd_for`, with what is the same for every miner of a stage
    /// kept in `parts` for the next (a phase change goes to every miner).
    pub(super) fn phase_cmd_with(&self, m: &MinerState, parts: &mut StageParts) -> pb::command::Kind {
        let shared = parts.of.entry(m.stage).or_insert_with(|| self.stage_phase(m.stage));
        let mut p = shared.cmd.clone();
        if self.phase == Phase::Merging && shared.aggregator == Some(m.peer) {
            p.uploads = self.uploads_manifest(m.stage);
        }
        if let Some((plan, momentum)) = &shared.plan
            && self.butterfly.get(&m.stage).is_some_and(|bm| bm.plan.is_participant(&m.peer))
        {
            p.merge_plan = Some(plan.clone());
            p.momentum = momentum.clone();
        }
        pb::command::Kind::Phase(p)
    }

    /// What the phase command holds for every miner of `stage`; the plan
    /// goes only to the stage merge's participants.
    fn stage_phase(&self, stage: u32) -> StagePhase {
        let pb::command::Kind::Phase(mut p) = self.phase_cmd() else { unreachable!("phase_cmd makes a phase command") };
        let (mut aggregator, mut plan) = (None, None);
        let stage_plan = || self.butterfly.get(&stage).map(|bm| (plan_to_pb(&bm.plan), self.momentum_manifest(stage)));
        match self.phase {
            Phase::Merging => {
                aggregator = self.aggregator(stage);
                p.aggregator = aggregator.map(|a| a.0.to_vec()).unwrap_or_default();
                plan = stage_plan();
            }
            Phase::Training | Phase::Done => {
                p.weights = self.weights_manifest(stage);
                p.weights_from = self.weights_epoch().map_or(0, |e| e + 1);
                // The previous epoch's merge, running behind this training.
                if self.overlapped_plan_in_training() {
                    plan = stage_plan();
                }
            }
            // With the merge behind compute, a replica lands the previous
            // epoch's merge as it uploads: these are its weights.
            Phase::Uploading if self.spec.merge.overlap => {
                p.weights = self.weights_manifest(stage);
                p.weights_from = self.weights_epoch().map_or(0, |e| e + 1);
            }
            Phase::Waiting | Phase::Uploading => {}
        }
        StagePhase { cmd: p, aggregator, plan }
    }

    pub(super) fn set_phase(&mut self, now: Ms, p: Phase, out: &mut Vec<Out>) {
        if p != self.phase {
            tracing::debug!(epoch = self.epoch, from = ?self.phase, to = ?p, after_ms = now.saturating_sub(self.phase_entered), "phase");
            // How long an upload or merge took, when it ended by itself
            // (not by its timeout): later ones are timed by it.
            let took = now.saturating_sub(self.phase_entered);
            let within = took <= self.phase_timeout_ms();
            match self.phase {
                Phase::Uploading if within => self.last_upload_ms = Some(took),
                Phase::Merging if within => self.last_merge_ms = Some(took),
                _ => {}
            }
            match self.phase {
                // Waiting for the merge behind training counts as merging.
                Phase::Training => self.counters.training_ms += took.saturating_sub(self.behind.waited_ms()),
                Phase::Uploading => self.counters.uploading_ms += took,
                Phase::Merging => self.counters.merging_ms += took,
                _ => {}
            }
            self.phase_entered = now;
            if p == Phase::Training {
                self.counters.first_training_at_ms.get_or_insert(now);
            }
        }
        self.phase = p;
        self.phase_since = now;
        self.broadcast_phase(out);
    }

    /// The timeout of the current phase: four times the last measured
    /// duration of the same phase, at least `MIN_PHASE_TIMEOUT_MS` and at
    /// most the run's `phase_timeout_ms` (which also serves before anything
    /// was measured), so a silent miner costs each epoch seconds, not the
    /// configured ceiling.
    pub(crate) fn phase_timeout_ms(&self) -> Ms {
        let measured = match self.phase {
            Phase::Uploading => self.last_upload_ms,
            Phase::Merging => self.last_merge_ms,
            _ => None,
        };
        self.timeout_after(measured)
    }

    /// Four times a `measured` duration, at least `MIN_PHASE_TIMEOUT_MS`
    /// and at most the run's `phase_timeout_ms` (the ceiling itself while
    /// nothing was measured).
    pub(super) fn timeout_after(&self, measured: Option<Ms>) -> Ms {
        let ceiling = self.spec.phase_timeout_ms;
        measured.map_or(ceiling, |m| m.saturating_mul(4).clamp(MIN_PHASE_TIMEOUT_MS.min(ceiling), ceiling))
    }
}
