//! Validators' verdicts, weighed by stake.
//!
//! A validator that re-checked a miner's work votes on an accusation
//! (epoch, miner, check): guilty or not. An accusation is decided once one
//! side holds more than half of all validator stake for guilty, or at least
//! half for not guilty (a tie never convicts). A conviction excludes the
//! miner's work of that epoch and is a strike; after `strikes_to_eject`
//! strikes the miner is ejected (its identity refused from then on). A
//! validator whose vote lost is counted (`outvoted`), which settlement
//! weighs. Every map is bounded: only the run's validators vote, and open
//! accusations are capped.

use std::collections::BTreeMap;

use iota_core::PeerId;
use serde::{Deserialize, Serialize};

/// Open (undecided) accusations one validator may hold votes in at once:
/// each validator has its own room, so one that votes on everything (or
/// on work nobody else drew) fills only its own, never the honest
/// validators'. Room for a draw over 2,000 miners in each of the two live
/// epochs.
pub const MAX_OPEN: usize = 4096;
/// Decided accusations remembered (so late votes are recognised).
pub const MAX_DECIDED: usize = 16_384;

/// What a validator checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Check {
    /// A sampled micro-batch recomputed: outputs differ from the committed ones.
    Recompute,
    /// The evidence for a sample was not uploaded in time.
    NoEvidence,
    /// The uploaded evidence does not match the miner's commitment heads.
    Commitment,
    /// A merge contribution or reduced slice recomputed differently.
    Merge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Accusation {
    pub epoch: u64,
    pub miner: PeerId,
    pub check: Check,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Guilty,
    Cleared,
}

/// What the orchestrator must do after a vote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Consequence {
    /// Leave the miner's work of `epoch` out (its merge contribution, its
    /// recorded work).
    Exclude { epoch: u64, miner: PeerId, check: Check },
    /// Remove the miner from the run and refuse its identity.
    Eject { miner: PeerId },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VoteError {
    #[error("{0} is not a validator of this run")]
    NotAValidator(PeerId),
    #[error("validator {0} already voted the other way on this accusation")]
    Equivocation(PeerId),
    #[error("this validator has votes in {MAX_OPEN} open accusations; decide some first")]
    TooMany,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Quorum {
    stakes: BTreeMap<PeerId, u64>,
    total: u128,
    strikes_to_eject: u32,
    #[serde(with = "crate::serde_pairs")]
    open: BTreeMap<Accusation, BTreeMap<PeerId, bool>>,
    #[serde(with = "crate::serde_pairs")]
    decided: BTreeMap<Accusation, Outcome>,
    strikes: BTreeMap<PeerId, u32>,
    ejected: Vec<PeerId>,
    outvoted: BTreeMap<PeerId, u64>,
    /// Accusations of epochs before this are forgotten (open or decided),
    /// and votes on them count for nothing.
    #[serde(default)]
    forgotten_before: u64,
}

impl Quorum {
    /// `stakes`: every validator of the run with its stake (zero stakes
    /// are left out: they could never count).
    pub fn new(stakes: BTreeMap<PeerId, u64>, strikes_to_eject: u32) -> Quorum {
        let stakes: BTreeMap<PeerId, u64> = stakes.into_iter().filter(|(_, s)| *s > 0).collect();
        let total = stakes.values().map(|&s| u128::from(s)).sum();
        Quorum {
            stakes,
            total,
            strikes_to_eject: strikes_to_eject.max(1),
            open: BTreeMap::new(),
            decided: BTreeMap::new(),
            strikes: BTreeMap::new(),
            ejected: Vec::new(),
            outvoted: BTreeMap::new(),
            forgotten_before: 0,
        }
    }

    /// Forgets every accusation of an epoch before `epoch`, open or
    /// decided (strikes and ejections stay), and from then on takes votes
    /// on them as changing nothing. Called as epochs start, it bounds what
    /// the quorum holds by the live epochs: without it, accusations that no
    /// majority ever decides (a lone validator's guilty votes on work
    /// nobody else drew) stay open for good and, at `MAX_OPEN`, refuse
    /// every new vote.
    pub fn forget_before(&mut self, epoch: u64) {
        self.forgotten_before = self.forgotten_before.max(epoch);
        let keep = self.forgotten_before;
        self.open.retain(|a, _| a.epoch >= keep);
        self.decided.retain(|a, _| a.epoch >= keep);
    }

    /// Votes on accusations of epochs before this one count for nothing.
    pub fn forgotten_before(&self) -> u64 {
        self.forgotten_before
    }

    pub fn is_validator(&self, p: &PeerId) -> bool {
        self.stakes.contains_key(p)
    }

    /// One validator's vote. A repeat of the same vote changes nothing; a
    /// vote after the decision only counts against a validator that lost.
    pub fn vote(&mut self, validator: PeerId, acc: Accusation, guilty: bool) -> Result<Vec<Consequence>, VoteError> {
        if !self.is_validator(&validator) {
            return Err(VoteError::NotAValidator(validator));
        }
        if acc.epoch < self.forgotten_before {
            return Ok(Vec::new());
        }
        if let Some(&outcome) = self.decided.get(&acc) {
            if (outcome == Outcome::Guilty) != guilty {
                *self.outvoted.entry(validator).or_default() += 1;
            }
            return Ok(Vec::new());
        }
        // A vote that would open another accusation for this validator
        // (counted over those it has a vote in; the whole map is bounded by
        // MAX_OPEN times the run's validators).
        // A validator holds a vote in at most every open accusation, so the
        // count (a scan of them all, once per vote) is only needed once
        // there are MAX_OPEN of them.
        let new_for_it = self.open.get(&acc).is_none_or(|votes| !votes.contains_key(&validator));
        if new_for_it
            && self.open.len() >= MAX_OPEN
            && self.open.values().filter(|votes| votes.contains_key(&validator)).count() >= MAX_OPEN
        {
            return Err(VoteError::TooMany);
        }
        let votes = self.open.entry(acc).or_default();
        match votes.get(&validator) {
            Some(&v) if v != guilty => return Err(VoteError::Equivocation(validator)),
            Some(_) => return Ok(Vec::new()),
            None => {
                votes.insert(validator, guilty);
            }
        }
        let stake_of = |want: bool| -> u128 {
            votes.iter().filter(|(_, v)| **v == want).map(|(p, _)| u128::from(self.stakes[p])).sum()
        };
        let (for_guilty, against) = (stake_of(true), stake_of(false));
        let outcome = if 2 * for_guilty > self.total {
            Outcome::Guilty
        } else if 2 * against >= self.total {
            Outcome::Cleared
        } else {
            return Ok(Vec::new());
        };
        Ok(self.decide(acc, outcome))
    }

    /// An accusation the orchestrator holds a proof of (signatures anyone
    /// can check: a merge equivocation), decided guilty with no vote; it
    /// strikes like a voted conviction. Validators that voted it down were
    /// outvoted.
    pub fn proven(&mut self, acc: Accusation) -> Vec<Consequence> {
        if self.decided.get(&acc) == Some(&Outcome::Guilty) {
            return Vec::new();
        }
        self.decide(acc, Outcome::Guilty)
    }

    fn decide(&mut self, acc: Accusation, outcome: Outcome) -> Vec<Consequence> {
        let votes = self.open.remove(&acc).unwrap_or_default();
        for (v, g) in votes {
            if (outcome == Outcome::Guilty) != g {
                *self.outvoted.entry(v).or_default() += 1;
            }
        }
        if self.decided.len() >= MAX_DECIDED
            && let Some(&oldest) = self.decided.keys().next()
        {
            self.decided.remove(&oldest);
        }
        self.decided.insert(acc, outcome);
        let mut out = Vec::new();
        if outcome == Outcome::Guilty {
            out.push(Consequence::Exclude { epoch: acc.epoch, miner: acc.miner, check: acc.check });
            let s = self.strikes.entry(acc.miner).or_default();
            *s += 1;
            if *s == self.strikes_to_eject {
                self.ejected.push(acc.miner);
                out.push(Consequence::Eject { miner: acc.miner });
            }
        }
        out
    }

    pub fn outcome(&self, acc: &Accusation) -> Option<Outcome> {
        self.decided.get(acc).copied()
    }

    /// Whether an accusation of `epoch` under `check` is still open with a
    /// guilty vote in it (more votes may yet convict).
    pub fn open_with_guilty(&self, epoch: u64, check: Check) -> bool {
        self.open.iter().any(|(a, votes)| a.epoch == epoch && a.check == check && votes.values().any(|g| *g))
    }

    pub fn strikes(&self, miner: &PeerId) -> u32 {
        self.strikes.get(miner).copied().unwrap_or(0)
    }

    pub fn ejected(&self) -> &[PeerId] {
        &self.ejected
    }

    /// Votes a validator cast against the decided outcome.
    pub fn outvoted(&self, validator: &PeerId) -> u64 {
        self.outvoted.get(validator).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(i: u8) -> PeerId {
        PeerId([100 + i; 32])
    }

    fn acc(epoch: u64, miner: u8) -> Accusation {
        Accusation { epoch, miner: PeerId([miner; 32]), check: Check::Recompute }
    }

    fn quorum(stakes: &[u64], strikes: u32) -> Quorum {
        Quorum::new(stakes.iter().enumerate().map(|(i, s)| (v(i as u8), *s)).collect(), strikes)
    }

    #[test]
    fn a_majority_of_stake_convicts_and_a_false_minority_is_outvoted() {
        // Stakes 50, 30, 20: validator 2 alone (20%) accuses an honest miner.
        let mut q = quorum(&[50, 30, 20], 3);
        assert_eq!(q.vote(v(2), acc(1, 7), true), Ok(vec![]), "20% decides nothing");
        assert_eq!(q.vote(v(0), acc(1, 7), false), Ok(vec![]), "with 50% against, guilty can no longer win");
        assert_eq!(q.outcome(&acc(1, 7)), Some(Outcome::Cleared));
        assert_eq!(q.vote(v(1), acc(1, 7), false), Ok(vec![]));
        assert_eq!(q.outcome(&acc(1, 7)), Some(Outcome::Cleared));
        assert_eq!(q.strikes(&PeerId([7; 32])), 0);
        assert_eq!((q.outvoted(&v(2)), q.outvoted(&v(0))), (1, 0));
        // A real cheater: the two largest agree (80%).
        assert!(!q.open_with_guilty(1, Check::Recompute), "the cleared one is not open");
        assert_eq!(q.vote(v(0), acc(1, 8), true), Ok(vec![]), "50% is not more than half");
        assert!(q.open_with_guilty(1, Check::Recompute), "open, a guilty vote in");
        assert!(!q.open_with_guilty(1, Check::Merge) && !q.open_with_guilty(2, Check::Recompute));
        let c = q.vote(v(1), acc(1, 8), true).unwrap();
        assert!(!q.open_with_guilty(1, Check::Recompute), "decided");
        assert_eq!(c, vec![Consequence::Exclude { epoch: 1, miner: PeerId([8; 32]), check: Check::Recompute }]);
        // The late dissenter is counted against.
        assert_eq!(q.vote(v(2), acc(1, 8), false), Ok(vec![]));
        assert_eq!(q.outvoted(&v(2)), 2);
    }

    #[test]
    fn strikes_eject_once_and_only_validators_vote() {
        let mut q = quorum(&[10], 2);
        let miner = PeerId([9; 32]);
        assert_eq!(q.vote(v(0), acc(1, 9), true).unwrap().len(), 1);
        let second = q.vote(v(0), acc(2, 9), true).unwrap();
        assert_eq!(second.last(), Some(&Consequence::Eject { miner }));
        assert_eq!(q.ejected(), &[miner]);
        let third = q.vote(v(0), acc(3, 9), true).unwrap();
        assert!(!third.iter().any(|c| matches!(c, Consequence::Eject { .. })), "ejected once");
        assert_eq!(q.vote(PeerId([1; 32]), acc(1, 9), true), Err(VoteError::NotAValidator(PeerId([1; 32]))));
        let zero = Quorum::new([(v(5), 0)].into(), 1);
        assert!(!zero.is_validator(&v(5)), "no stake, no vote");
    }

    #[test]
    fn a_proven_accusation_convicts_without_votes_strikes_once_and_outvotes_dissent() {
        let mut q = quorum(&[50, 30, 20], 2);
        let miner = PeerId([4; 32]);
        let merge = |epoch| Accusation { epoch, miner, check: Check::Merge };
        assert_eq!(q.vote(v(2), merge(1), false), Ok(vec![]), "an open vote against");
        assert_eq!(q.proven(merge(1)), vec![Consequence::Exclude { epoch: 1, miner, check: Check::Merge }]);
        assert_eq!(q.outcome(&merge(1)), Some(Outcome::Guilty));
        assert_eq!(q.outvoted(&v(2)), 1);
        assert_eq!(q.proven(merge(1)), vec![], "proven twice, struck once");
        assert_eq!(q.strikes(&miner), 1);
        assert_eq!(q.proven(merge(2)).last(), Some(&Consequence::Eject { miner }));
    }

    #[test]
    fn a_validator_cannot_vote_both_ways_or_flood_open_accusations() {
        let mut q = quorum(&[10, 10, 10], 3);
        assert_eq!(q.vote(v(0), acc(1, 1), true), Ok(vec![]));
        assert_eq!(q.vote(v(0), acc(1, 1), true), Ok(vec![]), "a repeat is harmless");
        assert_eq!(q.vote(v(0), acc(1, 1), false), Err(VoteError::Equivocation(v(0))));
        for i in 1..MAX_OPEN as u64 {
            q.vote(v(0), acc(1 + i, 1), true).unwrap();
        }
        assert_eq!(q.vote(v(0), acc(0, 2), true), Err(VoteError::TooMany));
        // Its flood fills its own room only: the others still vote, on
        // new accusations too, and their votes decide.
        assert_eq!(q.vote(v(2), acc(0, 3), false), Ok(vec![]), "another validator opens one");
        assert_eq!(q.vote(v(1), acc(0, 3), false), Ok(vec![]));
        assert_eq!(q.outcome(&acc(0, 3)), Some(Outcome::Cleared));
        // Its vote on an accusation another validator opened is refused
        // too (it would be one more for it), and deciding one frees room.
        q.vote(v(2), acc(0, 4), true).unwrap();
        assert_eq!(q.vote(v(0), acc(0, 4), true), Err(VoteError::TooMany));
        q.vote(v(1), acc(1, 1), true).unwrap();
        assert_eq!(q.outcome(&acc(1, 1)), Some(Outcome::Guilty));
        assert_eq!(q.vote(v(0), acc(0, 2), true), Ok(vec![]));
    }

    #[test]
    fn past_epochs_are_forgotten_and_free_the_room_they_held() {
        let mut q = quorum(&[10, 10, 10], 3);
        // A lone validator's guilty votes nobody decides, over many epochs.
        for i in 0..MAX_OPEN as u64 {
            q.vote(v(0), acc(i / 16, i as u8), true).unwrap();
        }
        assert_eq!(q.vote(v(0), acc(300, 1), true), Err(VoteError::TooMany));
        assert_eq!(q.vote(v(1), acc(300, 2), true), Ok(vec![]), "the others' room is their own");
        // Decided before the cut, a conviction's strike stays.
        q.vote(v(1), acc(0, 0), true).unwrap();
        assert_eq!(q.strikes(&PeerId([0; 32])), 1);
        q.forget_before(255);
        assert_eq!((q.open.len(), q.decided.len()), (17, 0), "only epoch 255's and 300's accusations are left");
        assert_eq!(q.strikes(&PeerId([0; 32])), 1);
        assert_eq!(q.vote(v(0), acc(300, 1), true), Ok(vec![]), "room again");
        // A vote on a forgotten epoch changes nothing, and opens nothing.
        assert_eq!(q.vote(v(1), acc(3, 3), true), Ok(vec![]));
        assert_eq!(q.vote(v(2), acc(3, 3), true), Ok(vec![]));
        assert_eq!(q.outcome(&acc(3, 3)), None);
        assert_eq!(q.open.len(), 18);
        // The cut never moves back.
        q.forget_before(10);
        assert_eq!(q.vote(v(1), acc(100, 4), true), Ok(vec![]));
        assert_eq!(q.open.len(), 18);
    }
}
