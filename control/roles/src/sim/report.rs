//! What a simulated run did and what it found wrong (`sim::run`'s answer).

use crate::orchestrator::Ms;

/// What a run did, and what it found wrong.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimReport {
    /// Events the orchestrator stepped.
    pub events: u64,
    /// Messages and timers the simulator delivered in all.
    pub deliveries: u64,
    pub sim_ms: Ms,
    pub epochs_done: u64,
    pub completed: u64,
    pub dropped: u64,
    pub joined: u64,
    pub crashed: u64,
    /// The most miners queued at once.
    pub queue_max: usize,
    /// Times a queued miner's place moved back (must be 0).
    pub queue_moved_back: u64,
    /// The longest stretch without progress (a phase change or a completed
    /// micro-batch), and the phase timeout it is held against.
    pub longest_stall_ms: Ms,
    pub phase_timeout_ms: Ms,
    /// Reports of live, reachable miners refused, and verdicts, weights
    /// and merge votes of validators refused (each with why; must be empty).
    pub lost_reports: Vec<String>,
    /// Evidence objects the validators checked.
    pub checks: u64,
    /// Validators' other reports refused (an ask that came late, say).
    pub validator_refusals: u64,
    /// Epochs settled, and validators' weight vectors sent that their
    /// epoch's settlement does not carry (must be 0).
    pub settled: u64,
    pub weight_vectors: u64,
    pub weights_unsettled: u64,
    /// Per adversary (its mode's name): what the run did to it, against
    /// what the real swarm does to that mode (`adversary.rs`); a mismatch
    /// is a problem.
    pub adversaries: Vec<AdversaryOutcome>,
    /// Honest miners convicted or ejected (must be 0), and honest miners
    /// that never crashed but were benched (a partition cut them off, or
    /// a stall was pinned on them).
    pub honest_convicted: u64,
    pub honest_benched: u64,
    /// BLAKE3 over every event stepped, in order, with its time: the run's
    /// fingerprint.
    pub digest: String,
}

impl SimReport {
    /// What is wrong with the run, if anything (one line each).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.queue_moved_back > 0 {
            p.push(format!("{} queued places moved back", self.queue_moved_back));
        }
        if self.longest_stall_ms > self.phase_timeout_ms {
            p.push(format!("a stall of {} ms (phase timeout {} ms)", self.longest_stall_ms, self.phase_timeout_ms));
        }
        if self.honest_convicted > 0 {
            p.push(format!("{} honest miners convicted", self.honest_convicted));
        }
        if self.weights_unsettled > 0 {
            p.push(format!("{} validators' weights missing from their epoch's settlement", self.weights_unsettled));
        }
        for a in self.adversaries.iter().filter(|a| !a.is_named_as_expected()) {
            p.push(format!(
                "adversary {} (miner {}): {} where the swarm says {}",
                a.mode, a.miner, a.named, a.expected
            ));
        }
        p.extend(self.lost_reports.iter().take(5).cloned());
        p
    }
}

/// One adversary's fate in a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdversaryOutcome {
    pub mode: &'static str,
    pub miner: usize,
    /// The stage it held (what its mode does there depends on it).
    pub stage: u32,
    /// What the run did to it ("convicted (recompute)", "benched", ...),
    /// and what the real swarm does to that mode on that stage (the
    /// outcomes it allows, split by `|`).
    pub named: String,
    pub expected: String,
}

impl AdversaryOutcome {
    pub fn is_named_as_expected(&self) -> bool {
        self.expected.split('|').any(|e| e == self.named)
    }
}
