//! What a run did to its adversaries and to the validators' weights,
//! held against what the real swarm does (`SimReport::problems`).

use super::World;
use super::adversary::SimAdversary;
use super::cheating::compute_fault;
use super::report::AdversaryOutcome;

impl World {
    /// Every weight vector a validator sent is in its epoch's settlement,
    /// and each adversary's fate.
    pub(super) fn account(&mut self) {
        let settlements = self.o.settlements();
        self.report.settled = settlements.len() as u64;
        let mut unsettled = 0;
        for (epoch, v) in &self.weights_sent {
            let carried = settlements.iter().find(|s| s.epoch == *epoch).is_some_and(|s| {
                let row = s.validators.iter().position(|p| p == v);
                row.and_then(|r| s.input.weights.get(r)).is_some_and(|w| w.iter().any(|x| *x > 0.0))
            });
            unsettled += u64::from(!carried);
        }
        self.report.weights_unsettled = unsettled;
        self.report.weight_vectors = self.weights_sent.len() as u64;
        let mut outcomes = Vec::new();
        for (i, m) in self.miners.iter().enumerate() {
            let Some(mode) = m.mode else { continue };
            let state = self.o.miner(&m.peer);
            let stage = state.map_or(0, |s| s.stage);
            let named = match state {
                None => "never placed",
                Some(s) if s.convicted_epochs > 0 || s.ejected => match self.guilty.get(&m.peer) {
                    Some(crate::validation::quorum::Check::Recompute) => "convicted (recompute)",
                    _ => "convicted (merge)",
                },
                Some(s) if s.benched_epochs > 0 || s.benched || s.removed => "benched",
                // Never credited a micro-batch (so never paid), never blamed.
                Some(_) if !self.credited(&m.peer) => "unpaid",
                Some(s) if s.false_reports >= 3 => "discredited",
                Some(_) => "none",
            };
            let expected = expected(mode, stage, self.cfg.stages);
            outcomes.push(AdversaryOutcome {
                mode: mode.name(),
                miner: i,
                stage,
                named: named.into(),
                expected: expected.into(),
            });
        }
        self.report.adversaries = outcomes;
        // No honest miner convicted (a crashed one's stalls may bench it).
        for m in self.miners.iter().filter(|m| m.mode.is_none()) {
            let Some(s) = self.o.miner(&m.peer) else { continue };
            self.report.honest_convicted += u64::from(s.convicted_epochs > 0 || s.ejected);
            let live = m.standing != super::Standing::Crashed;
            self.report.honest_benched += u64::from(live && (s.benched_epochs > 0 || s.benched));
        }
    }
}

impl World {
    /// Whether any epoch credited `peer` with a completed micro-batch.
    fn credited(&self, peer: &iota_core::PeerId) -> bool {
        self.o.history().iter().flat_map(|e| &e.miners).any(|m| m.peer == *peer && m.completed > 0)
    }
}

/// How the real swarm names `mode` on `stage` (alternatives split by
/// `|`): the integration and orchestrator tests' findings.
fn expected(mode: SimAdversary, stage: u32, stages: u32) -> &'static str {
    use SimAdversary::*;
    match mode {
        // It never works: benched where a stall is pinned on it, and where
        // a hedge finished its micro-batches first, never blamed, and
        // never credited or paid.
        Silent | Closed => "benched|unpaid",
        // Steered away from, never blamed.
        Slow => "none",
        Flaky => "benched|none",
        // Its reports are never corroborated; it is not blamed for them.
        // (It sends nothing on, so nothing it carries is credited.)
        HostileUnreachable => "discredited|unpaid|none",
        // Alone it has no accomplice: it reduces honestly.
        Collude => "none",
        // Dense merges carry no backlog to inflate (the real swarm
        // convicts it with sparse contributions: integration
        // `validated_sparse_contributions_convict_an_inflated_backlog_and_no_honest_replica`).
        InflatedBacklog => "none",
        MergeEquivocate | Nan | MergeGarbage | MergeLie | Withholder | LyingOwner | RefereeCollusion
        | FramingSender | ScaledPoison | CopyPartner | NegatePartner => "convicted (merge)",
        _ if compute_fault(mode, stage, stages).is_some() => "convicted (recompute)",
        _ => "none",
    }
}
