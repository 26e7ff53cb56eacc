//! Where this miner stands, in words: the orchestrator's `Standing` (in
//! every heartbeat reply) and what the miner sees itself (an orchestrator
//! it cannot reach) as one line, printed whenever it changes, served at
//! `/status` and read back by `iota-miner status`. Pure: the daemon feeds
//! it and prints what it returns.

use iota_protocol::pb;

/// The state's name, as lines and metrics say it.
pub fn state_name(s: pb::StandingState) -> &'static str {
    match s {
        pb::StandingState::Unspecified => "unknown",
        pb::StandingState::Waiting => "waiting",
        pb::StandingState::Joining => "joining",
        pb::StandingState::Probation => "probation",
        pb::StandingState::Training => "training",
        pb::StandingState::Uploading => "uploading",
        pb::StandingState::Merging => "merging",
        pb::StandingState::Benched => "benched",
        pb::StandingState::Suspended => "suspended",
        pb::StandingState::Ejected => "ejected",
        pb::StandingState::Removed => "removed",
        pb::StandingState::Done => "done",
        pb::StandingState::Queued => "queued",
    }
}

/// Every state, for the metrics' one-hot gauge.
pub const STATES: [pb::StandingState; 12] = [
    pb::StandingState::Queued,
    pb::StandingState::Waiting,
    pb::StandingState::Joining,
    pb::StandingState::Probation,
    pb::StandingState::Training,
    pb::StandingState::Uploading,
    pb::StandingState::Merging,
    pb::StandingState::Benched,
    pb::StandingState::Suspended,
    pb::StandingState::Ejected,
    pb::StandingState::Removed,
    pb::StandingState::Done,
];

/// One line for a standing (the reason is the orchestrator's, shown as
/// printable text only), with the throughput this miner measured.
pub fn line(st: &pb::Standing, tokens_per_s: f64) -> String {
    let state = st.state();
    let stage = format!("stage {} of {}", st.stage, st.stages.max(1));
    let reason: String = st.reason.chars().filter(|c| !c.is_control()).take(256).collect();
    let what = match state {
        // The rate since the last heartbeat: none yet at an epoch's start.
        pb::StandingState::Training if tokens_per_s >= 1.0 => {
            format!("training {stage}, epoch {}, at {tokens_per_s:.0} tokens/s", st.epoch)
        }
        pb::StandingState::Training => format!("training {stage}, epoch {}", st.epoch),
        pb::StandingState::Uploading => format!("uploading {stage}'s weights, epoch {}", st.epoch),
        pb::StandingState::Merging => format!("merging {stage}, epoch {}", st.epoch),
        pb::StandingState::Probation => format!("on probation on {stage}, epoch {}: {reason}", st.epoch),
        pb::StandingState::Joining => format!("assigned {stage}, waiting for the next epoch: {reason}"),
        pb::StandingState::Waiting => format!("registered, assigned {stage}, waiting: {reason}"),
        pb::StandingState::Done => "the run is over".to_string(),
        pb::StandingState::Queued => {
            format!("queued at position {} of {}: {reason}", st.queue_position, st.queue_length)
        }
        _ => format!("{}: {reason}", state_name(state)),
    };
    format!("{what}; {} micro-batches delivered; {}", st.delivered, pay(st))
}

/// What the miner was paid, in words.
fn pay(st: &pb::Standing) -> String {
    if !st.settled {
        return "no epoch settled yet".to_string();
    }
    format!("paid {:.4} for epoch {}, {:.4} over the run", st.paid_last, st.paid_epoch, st.paid_total)
}

/// Failed heartbeats in a row before the orchestrator counts as out of
/// reach.
pub const UNREACHABLE_AFTER: u32 = 3;

/// What a change of standing is judged by: the state, stage, epoch, the
/// end of a bench or suspension, the reason's text, the last settled
/// epoch and a queued miner's place (not the throughput or the delivered count, which move all the
/// time).
type Key = (i32, u32, u64, u64, String, bool, u64, u32);

fn key(st: &pb::Standing) -> Key {
    (st.state, st.stage, st.epoch, st.until_epoch, st.reason.clone(), st.settled, st.paid_epoch, st.queue_position)
}

/// The last standing seen and the line that describes it.
#[derive(Default)]
pub struct StandingLog {
    last: Option<Key>,
    /// Heartbeats failed in a row.
    failed: u32,
    unreachable: bool,
    now: String,
    standing: Option<pb::Standing>,
}

impl StandingLog {
    /// A heartbeat reply's standing: the line to print where it changed.
    pub fn observe(&mut self, st: &pb::Standing, tokens_per_s: f64) -> Option<String> {
        let k = key(st);
        self.now = line(st, tokens_per_s);
        self.standing = Some(st.clone());
        let changed = self.last.as_ref() != Some(&k) || self.unreachable;
        self.last = Some(k);
        self.unreachable = false;
        self.failed = 0;
        changed.then(|| self.now.clone())
    }

    /// A heartbeat that failed: after `UNREACHABLE_AFTER` in a row, the
    /// line to print (once per outage; one lost heartbeat is not one).
    pub fn unreachable(&mut self, error: &str, every_s: f64) -> Option<String> {
        self.failed = self.failed.saturating_add(1);
        if self.failed < UNREACHABLE_AFTER || self.unreachable {
            return None;
        }
        let error: String = error.chars().filter(|c| !c.is_control()).take(256).collect();
        self.now = format!("cannot reach the orchestrator ({error}); retrying every {every_s:.1} s");
        self.unreachable = true;
        Some(self.now.clone())
    }

    /// The line for now (`/status`), empty before the first heartbeat.
    pub fn now(&self) -> &str {
        &self.now
    }

    /// What `/metrics` shows of it.
    pub fn standing_metrics(&self) -> Option<StandingMetrics> {
        let st = self.standing.as_ref()?;
        Some(StandingMetrics {
            state: if self.unreachable { "unreachable" } else { state_name(st.state()) },
            stage: st.stage,
            paid_last: st.paid_last,
            paid_total: st.paid_total,
        })
    }
}

/// A standing as `/metrics` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct StandingMetrics {
    /// `state_name`, or `unreachable`.
    pub state: &'static str,
    pub stage: u32,
    pub paid_last: f64,
    pub paid_total: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(state: pb::StandingState, epoch: u64, reason: &str) -> pb::Standing {
        pb::Standing {
            state: state as i32,
            stage: 1,
            stages: 3,
            epoch,
            until_epoch: 0,
            reason: reason.into(),
            delivered: 40,
            settled: epoch > 0,
            paid_epoch: epoch.saturating_sub(1),
            paid_last: 0.25,
            paid_total: 0.5,
            ..Default::default()
        }
    }

    fn queued(position: u32, length: u32) -> pb::Standing {
        pb::Standing {
            state: pb::StandingState::Queued as i32,
            stages: 3,
            reason: "every one of the run's 24 places is taken".into(),
            queue_position: position,
            queue_length: length,
            ..Default::default()
        }
    }

    /// A miner walked through every state prints one line at each change
    /// (not when only the throughput moves), each saying what it is and
    /// why, and the orchestrator out of reach once per outage.
    #[test]
    fn every_state_change_prints_one_line_and_nothing_else_does() {
        use pb::StandingState as S;
        let mut log = StandingLog::default();
        let walk = [
            (queued(3, 5), "queued at position 3 of 5: every one of the run's 24 places is taken"),
            // Moving up the queue is a change; the queue growing behind is not.
            (queued(2, 4), "queued at position 2 of 4: every one"),
            (
                st(S::Waiting, 0, "the run waits for enough miners to fill every stage"),
                "registered, assigned stage 1 of 3, waiting: the run waits for enough miners",
            ),
            (
                st(S::Joining, 0, "joined during epoch 0: it holds no current weights until epoch 1 starts"),
                "assigned stage 1 of 3, waiting for the next epoch: joined during epoch 0",
            ),
            (
                st(S::Probation, 1, "one micro-batch at a time until it delivers one"),
                "on probation on stage 1 of 3, epoch 1: one micro-batch",
            ),
            (st(S::Training, 1, ""), "training stage 1 of 3, epoch 1, at 1500 tokens/s"),
            (st(S::Uploading, 1, ""), "uploading stage 1 of 3's weights, epoch 1"),
            (st(S::Merging, 1, ""), "merging stage 1 of 3, epoch 1"),
            (
                st(S::Training, 2, ""),
                "training stage 1 of 3, epoch 2, at 1500 tokens/s; 40 micro-batches delivered; paid 0.2500 for epoch 1, 0.5000 over the run",
            ),
            (
                st(S::Benched, 2, "out for the rest of epoch 2: 3 failures in a row pinned on it"),
                "benched: out for the rest of epoch 2: 3 failures in a row",
            ),
            (
                st(S::Suspended, 3, "convicted in epoch 3, suspended through epoch 4: inner step 2: recomputed"),
                "suspended: convicted in epoch 3, suspended through epoch 4",
            ),
            (
                st(S::Ejected, 5, "validators convicted its work in 3 epochs"),
                "ejected: validators convicted its work in 3 epochs",
            ),
            (st(S::Removed, 5, "benched in 3 epochs (the limit is 3)"), "removed: benched in 3 epochs"),
            (st(S::Done, 6, ""), "the run is over; 40 micro-batches delivered; paid 0.2500 for epoch 5"),
        ];
        for (s, want) in &walk {
            let printed = log.observe(s, 1500.0).unwrap_or_else(|| panic!("no line for {:?}", s.state()));
            assert!(printed.starts_with(want), "{printed:?} does not start with {want:?}");
            assert_eq!(log.now(), printed);
            // The same standing again, at another throughput: no new line.
            assert_eq!(log.observe(s, 10.0), None, "{printed}");
        }
        let mut behind = queued(2, 4);
        behind.queue_length = 9;
        let mut q = StandingLog::default();
        assert!(q.observe(&queued(2, 4), 0.0).is_some());
        assert_eq!(q.observe(&behind, 0.0), None, "the queue growing behind is no change");
        assert!(line(&walk[2].0, 1.0).ends_with("no epoch settled yet"));
        // At an epoch's start no rate is measured yet: none is printed.
        assert!(line(&walk[5].0, 0.0).starts_with("training stage 1 of 3, epoch 1; "), "{}", line(&walk[5].0, 0.0));
        // An outage prints once, after three failed heartbeats, and the
        // standing after it prints again.
        assert_eq!(log.unreachable("connection refused", 0.5), None, "one lost heartbeat is no outage");
        assert_eq!(log.unreachable("connection refused", 0.5), None);
        let down = log.unreachable("connection refused", 0.5).expect("a line");
        assert_eq!(down, "cannot reach the orchestrator (connection refused); retrying every 0.5 s");
        assert_eq!(log.unreachable("connection refused", 0.5), None);
        assert_eq!(log.standing_metrics().map(|m| m.state), Some("unreachable"));
        assert!(log.observe(&walk[13].0, 1.0).is_some(), "back: printed again");
        // A hostile reason cannot break the line.
        let bad = st(S::Benched, 2, "a\nb\u{1b}[31mc");
        assert!(!line(&bad, 0.0).contains('\n') && !line(&bad, 0.0).contains('\u{1b}'));
    }
}
