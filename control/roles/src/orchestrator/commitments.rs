//! Miners' commitment heads (see `iota_core::commitment`): kept per miner
//! for the current and the previous epoch, each report checked against the
//! one before it. A report that contradicts an earlier one for the same
//! epoch is a claim of two histories: it is kept as evidence (both
//! reports) and the earlier heads stay on record.

use iota_core::PeerId;
use iota_core::commitment::EpochHeads;

use super::state::{CommitmentBreak, MAX_COMMITMENT_BREAKS};
use super::{Orchestrator, Refusal};

impl Orchestrator {
    pub(super) fn on_commitments(&mut self, peer: PeerId, heads: Vec<EpochHeads>) -> Result<(), Refusal> {
        let current = self.epoch;
        let m = self.miners.get_mut(&peer).ok_or(Refusal::Unknown(peer))?;
        let mut breaks = Vec::new();
        let mut changed = false;
        for h in heads {
            // Only epochs whose work is still being checked.
            if h.epoch > current || h.epoch.saturating_add(1) < current {
                continue;
            }
            match m.commitments.get(&h.epoch) {
                Some(earlier) => match earlier.rewritten_by(&h) {
                    Some(what) => breaks.push(CommitmentBreak {
                        epoch: h.epoch,
                        miner: peer,
                        what,
                        earlier: earlier.clone(),
                        later: h,
                    }),
                    None => {
                        m.commitments.insert(h.epoch, h);
                        changed = true;
                    }
                },
                None => {
                    m.commitments.insert(h.epoch, h);
                    changed = true;
                }
            }
        }
        let kept = m.commitments.len();
        m.commitments.retain(|&e, _| e.saturating_add(1) >= current);
        if changed || m.commitments.len() != kept {
            self.commitments_changed += 1;
        }
        self.counters.commitment_breaks += breaks.len() as u64;
        for b in breaks {
            if self.commitment_breaks.len() >= MAX_COMMITMENT_BREAKS {
                self.commitment_breaks.remove(0);
            }
            self.commitment_breaks.push(b);
        }
        Ok(())
    }

    /// A miner's last reported heads for `epoch` (the current or previous one).
    pub fn commitments_of(&self, peer: &PeerId, epoch: u64) -> Option<&EpochHeads> {
        self.miners.get(peer)?.commitments.get(&epoch)
    }

    /// Every contradicting report the run keeps, oldest first.
    pub fn commitment_breaks(&self) -> &[CommitmentBreak] {
        &self.commitment_breaks
    }
}
