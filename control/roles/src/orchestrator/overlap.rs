//! The merge behind compute (`merge.overlap`): the butterfly merge of
//! epoch E runs while epoch E+1 trains. Its participants are handed the
//! plan with E+1's Training phase; each replica keeps training on its own
//! weights and, when E+1's training ends, lands the merge (the merged
//! weights plus what it trained since E ended) before it contributes to
//! E+1's merge. Training does not end (Uploading waits) until the merge
//! behind it is complete; that wait is the merge's visible time. The last
//! epoch's merge is synchronous, so the run ends on merged weights.

use super::{Ms, Orchestrator, Out, Phase};

impl Orchestrator {
    /// Whether the merge planned now runs behind the next epoch's training:
    /// the run asks for it and this is not the last epoch.
    pub(super) fn merges_behind_compute(&self) -> bool {
        self.spec.merge.overlap && self.epoch + 1 < self.spec.epoch_count() && !self.butterfly.is_empty()
    }

    /// Ends the epoch with its merge planned but not run: the next epoch
    /// trains while it runs (the participants get the plan with the
    /// Training phase).
    pub(super) fn start_overlapped(&mut self, now: Ms, rng: &mut iota_core::Rng, out: &mut Vec<Out>) {
        tracing::info!(epoch = self.epoch, "merge runs behind the next epoch's training");
        self.behind.start(self.epoch, now);
        self.finish_epoch(now, rng, out, false);
    }

    /// Moves the merge behind training along: plans out participants that
    /// cannot finish (as in the Merging phase, on the merge's own timeout)
    /// and ends it once complete.
    pub(super) fn tend_overlapped(&mut self, now: Ms, out: &mut Vec<Out>) {
        if self.behind.running().is_none() {
            return;
        }
        let timed_out = self.behind.timed_out(now, self.merge_timeout_ms());
        self.tend_butterfly(now, timed_out, out);
        if !self.butterfly_complete(timed_out) {
            if timed_out {
                self.behind.rearm(now);
            }
            return;
        }
        let Some(landed) = self.behind.land(now) else { return };
        if !timed_out {
            self.last_merge_ms = Some(landed.took);
        }
        self.counters.divergent_merges += self.butterfly.values().filter(|m| !m.consistent()).count() as u64;
        self.counters.merging_ms += landed.waited.unwrap_or(0);
        self.counters.merges_behind_compute += 1;
        tracing::info!(epoch = landed.epoch, took_ms = landed.took, "merge behind compute complete");
        self.butterfly.clear();
    }

    /// Whether the epoch's training, all of it done, must wait for the
    /// merge behind it (counted from the first time it had to).
    pub(super) fn waits_for_overlapped(&mut self, now: Ms) -> bool {
        self.behind.must_wait(now)
    }

    /// A merge's timeout: as the Merging phase's (four times the last
    /// merge, within the run's bounds).
    fn merge_timeout_ms(&self) -> Ms {
        self.timeout_after(self.last_merge_ms)
    }

    /// Whether the phase command for a Training miner carries the merge
    /// running behind it.
    pub(super) fn overlapped_plan_in_training(&self) -> bool {
        self.behind.running().is_some() && self.phase == Phase::Training
    }
}
