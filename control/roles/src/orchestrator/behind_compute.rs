//! The merge behind compute's clock, a part of the orchestrator's state of
//! its own (`overlap.rs` drives it): which epoch's merge runs behind
//! training, since when, and how long training waited for it.

use serde::{Deserialize, Serialize};

type Ms = u64;

/// The merge behind compute's own state: which epoch's merge runs behind
/// training, since when, and how long training has waited for it. Saved
/// flattened into the orchestrator's state, under the names it had there
/// before it was a part of its own (saved runs load unchanged).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BehindCompute {
    /// The epoch whose butterfly merge runs behind the current epoch's
    /// training.
    #[serde(default)]
    overlapped: Option<u64>,
    /// When that merge started (re-armed when a timeout plans some out).
    #[serde(default)]
    overlapped_since: Ms,
    /// Since when the epoch's training has been finished and waiting for
    /// it (the merge's visible time).
    #[serde(default)]
    overlap_wait_since: Option<Ms>,
    /// This epoch's training time spent waiting for the merge behind it.
    #[serde(default)]
    overlap_waited_ms: Ms,
}

/// A merge behind compute that completed.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Landed {
    pub epoch: u64,
    /// From its start (or its last re-arming) to completion.
    pub took: Ms,
    /// Training's wait for it, where training had to wait.
    pub waited: Option<Ms>,
}

impl BehindCompute {
    /// The epoch whose merge runs behind training, if one does.
    pub(super) fn running(&self) -> Option<u64> {
        self.overlapped
    }

    /// `epoch`'s merge starts behind the next epoch's training.
    pub(super) fn start(&mut self, epoch: u64, now: Ms) {
        self.overlapped = Some(epoch);
        self.overlapped_since = now;
    }

    /// Whether the running merge has taken longer than `timeout`.
    pub(super) fn timed_out(&self, now: Ms, timeout: Ms) -> bool {
        now.saturating_sub(self.overlapped_since) > timeout
    }

    /// The next round of planning out waits another timeout.
    pub(super) fn rearm(&mut self, now: Ms) {
        self.overlapped_since = now;
    }

    /// Training, all of it done, must wait for the running merge (the wait
    /// counted from the first time it had to); false when none runs.
    pub(super) fn must_wait(&mut self, now: Ms) -> bool {
        if self.overlapped.is_none() {
            return false;
        }
        self.overlap_wait_since.get_or_insert(now);
        true
    }

    /// The running merge completed at `now`: what it took and what
    /// training waited for it (added to this epoch's wait).
    pub(super) fn land(&mut self, now: Ms) -> Option<Landed> {
        let epoch = self.overlapped.take()?;
        let waited = self.overlap_wait_since.take().map(|since| now.saturating_sub(since));
        self.overlap_waited_ms = self.overlap_waited_ms.saturating_add(waited.unwrap_or(0));
        Some(Landed { epoch, took: now.saturating_sub(self.overlapped_since), waited })
    }

    /// A new epoch: its wait starts from nothing (a merge still running
    /// behind it carries on).
    pub(super) fn new_epoch(&mut self) {
        self.overlap_wait_since = None;
        self.overlap_waited_ms = 0;
    }

    /// This epoch's training time spent waiting for the merge behind it.
    pub(super) fn waited_ms(&self) -> Ms {
        self.overlap_waited_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merge behind compute's clock on its own: started, waited for,
    /// timed out and re-armed, landed; the epoch's wait adds up and a new
    /// epoch starts it from nothing.
    #[test]
    fn the_merge_behind_compute_keeps_its_own_time() {
        let mut b = BehindCompute::default();
        assert_eq!((b.running(), b.must_wait(5)), (None, false), "nothing runs, nothing to wait for");
        assert_eq!(b.land(5), None);
        b.start(3, 1_000);
        assert_eq!(b.running(), Some(3));
        assert!(!b.timed_out(1_500, 600) && b.timed_out(1_700, 600));
        b.rearm(1_700);
        assert!(!b.timed_out(2_200, 600), "re-armed: another timeout");
        assert!(b.must_wait(2_000) && b.must_wait(2_400), "waited for from the first time");
        let landed = b.land(2_500).unwrap();
        assert_eq!(landed, Landed { epoch: 3, took: 800, waited: Some(500) });
        assert_eq!((b.running(), b.waited_ms()), (None, 500));
        // A merge training never waited for adds nothing.
        b.start(4, 3_000);
        assert_eq!(b.land(3_100).unwrap().waited, None);
        assert_eq!(b.waited_ms(), 500);
        b.new_epoch();
        assert_eq!(b.waited_ms(), 0);
    }

    /// Saved flattened under the names the fields had in the
    /// orchestrator's state: a state saved before reads the same.
    #[test]
    fn it_saves_under_the_orchestrators_old_field_names() {
        let mut b = BehindCompute::default();
        b.start(7, 42);
        b.must_wait(50);
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(json["overlapped"], 7);
        assert_eq!(json["overlapped_since"], 42);
        assert_eq!(json["overlap_wait_since"], 50);
        assert_eq!(json["overlap_waited_ms"], 0);
        let old = serde_json::json!({"overlapped": 7, "overlapped_since": 42, "overlap_wait_since": 50});
        assert_eq!(serde_json::from_value::<BehindCompute>(old).unwrap(), b);
    }
}
