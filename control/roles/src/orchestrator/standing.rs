//! Where a miner stands, as the orchestrator tells it in every heartbeat
//! reply (`pb::Standing`; PROTOCOL.md, "A miner's standing"): waiting for
//! the run, joining, on probation, training, uploading or merging on its
//! stage, benched, suspended, ejected or removed, and why; and what it was
//! paid in the last settled epoch and over the run. The miner prints a
//! line whenever it changes and serves it at `/status`.

use iota_core::PeerId;
use iota_wire::pb;

use super::Orchestrator;
use super::liveness::REMOVE_AFTER_BENCHED_EPOCHS;
use super::state::Phase;

/// The most bytes of a standing's reason.
const MAX_REASON: usize = 256;

impl Orchestrator {
    /// `peer`'s standing now; None for an identity that is not a
    /// registered miner (validators, strangers).
    pub fn standing(&self, peer: &PeerId) -> Option<pb::Standing> {
        let m = self.miners.get(peer)?;
        let epoch = self.epoch();
        let (state, until, reason) = if m.ejected {
            let why = format!("validators convicted its work in {} epochs", m.convicted_epochs);
            (pb::StandingState::Ejected, 0, why)
        } else if m.removed {
            let why =
                format!("removed: benched in {} epochs (the limit is {REMOVE_AFTER_BENCHED_EPOCHS})", m.benched_epochs);
            (pb::StandingState::Removed, 0, why)
        } else if m.excluded(epoch) {
            let until = m.suspended_through.unwrap_or(epoch).max(epoch);
            (pb::StandingState::Suspended, until, self.conviction_reason(peer, epoch))
        } else if m.benched {
            let why = format!(
                "out for the rest of epoch {epoch}: {} failures in a row pinned on it; back on probation next epoch",
                m.failures_in_a_row
            );
            (pb::StandingState::Benched, epoch, why)
        } else {
            self.working_state(m.joining, m.probation)
        };
        let last = self.settlements().last().filter(|s| s.miners.contains(peer) || s.validators.contains(peer));
        let paid_last = last.and_then(|s| s.payouts().into_iter().find(|(p, _)| p == peer)).map_or(0.0, |(_, x)| x);
        Some(pb::Standing {
            state: state as i32,
            stage: m.stage,
            stages: self.spec().stages,
            epoch,
            until_epoch: until,
            reason: clip(reason),
            delivered: m.delivered,
            settled: last.is_some(),
            paid_epoch: last.map_or(0, |s| s.epoch),
            paid_last,
            paid_total: self.balances().get(peer).copied().unwrap_or(0.0),
            queue_position: 0,
            queue_length: 0,
        })
    }

    /// The standing of a newcomer queued at `position` of `length` in a
    /// full run (it is no miner yet: no stage, nothing delivered or paid).
    pub fn queued_standing(&self, position: usize, length: usize) -> pb::Standing {
        let places = u64::from(self.spec().stages) * u64::from(self.spec().max_miners_per_stage());
        let reason = format!(
            "every one of the run's {places} places is taken; a place goes to the queue's head first as one frees \
             (asking again every {} s keeps this place)",
            super::QUEUE_RETRY_MS / 1000
        );
        pb::Standing {
            state: pb::StandingState::Queued as i32,
            stages: self.spec().stages,
            epoch: self.epoch(),
            reason: clip(reason),
            queue_position: u32::try_from(position).unwrap_or(u32::MAX),
            queue_length: u32::try_from(length).unwrap_or(u32::MAX),
            ..Default::default()
        }
    }

    /// A miner in good standing: what the run's phase has it do.
    fn working_state(&self, joining: bool, probation: bool) -> (pb::StandingState, u64, String) {
        let epoch = self.epoch();
        match self.phase() {
            Phase::Waiting => {
                let why = "the run waits for enough miners to fill every stage".to_string();
                (pb::StandingState::Waiting, 0, why)
            }
            Phase::Done => (pb::StandingState::Done, 0, String::new()),
            Phase::Training if joining => {
                let why = format!(
                    "joined during epoch {epoch}: it holds no current weights until epoch {} starts",
                    epoch + 1
                );
                (pb::StandingState::Joining, 0, why)
            }
            Phase::Training if probation => {
                let why = "one micro-batch at a time until it delivers one".to_string();
                (pb::StandingState::Probation, 0, why)
            }
            Phase::Training => (pb::StandingState::Training, 0, String::new()),
            Phase::Uploading => (pb::StandingState::Uploading, 0, String::new()),
            Phase::Merging => (pb::StandingState::Merging, 0, String::new()),
        }
    }

    /// Why `peer` is suspended: the first guilty vote on its work of this
    /// epoch the orchestrator still holds, else the suspension itself.
    fn conviction_reason(&self, peer: &PeerId, epoch: u64) -> String {
        let m = self.miners.get(peer);
        let through = m.and_then(|m| m.suspended_through).unwrap_or(epoch);
        let vote = self.validation.verdicts.iter().find(|v| v.miner == *peer && v.guilty && !v.reason.is_empty());
        match vote {
            Some(v) => format!("convicted in epoch {}, suspended through epoch {through}: {}", v.epoch, v.reason),
            None => format!("convicted by the validators, suspended through epoch {through}"),
        }
    }
}

/// `s` cut to `MAX_REASON` bytes on a character boundary.
fn clip(mut s: String) -> String {
    if s.len() > MAX_REASON {
        let mut at = MAX_REASON;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}
