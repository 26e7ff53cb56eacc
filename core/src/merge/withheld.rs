//! Withheld contributions: a sender that keeps its contribution to one
//! partition from that partition's owners, while reporting everything
//! else, would hold the partition, and with it the stage's merge,
//! hostage; at R = 2 it would even get its honest co-owner planned out
//! as the laggard and merge its own contribution alone.
//!
//! So an owner that has waited past its patience reports the senders it
//! misses (`contributions_missing`). The orchestrator asks each sender to
//! store its contribution (an honest sender whose frames were lost does,
//! and the owners read it from the store), and, with validators, asks
//! them whether it did. A claim keeps its owner from being counted a
//! laggard on that partition. A claim still open on an unsettled
//! partition past the store's patience (the orchestrator's, counted from
//! the first claim: `withheld_senders` says when that was) plans the
//! sender out: its work leaves the merge and the stage goes on.
//!
//! A claim is one owner's word: at R = 2 the claimant may be the liar.
//! So planning a sender out is not yet a conviction. The orchestrator
//! convicts a withholder only on two distinct owners' claims (R >= 3,
//! the sender a third party to the partition) or the validators' stake
//! finding the contribution not stored. A claim the validators find
//! refuted (the contribution is in the store) shields its owner no
//! longer (`refute_missing`), and the laggard rule applies to it.

use std::collections::BTreeSet;

use super::{MergeOut, StageMerge};
use crate::identity::PeerId;

/// A sender claimed missing on a partition still unsettled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WithheldClaim {
    pub partition: u32,
    pub sender: PeerId,
    /// Two distinct owners claimed it.
    pub corroborated: bool,
    /// The first claim's time (the orchestrator's milliseconds).
    pub since_ms: u64,
}

impl StageMerge {
    /// Owner `owner` of partition `k` (generation `generation`) misses
    /// these senders' contributions (claimed at `now_ms`). Stale or
    /// foreign claims, and claims on a partition the owner has already
    /// reported or that is settled, are ignored (false). Each sender's
    /// first claim on a generation is passed on as `MergeOut::Missing`.
    pub fn contributions_missing(
        &mut self,
        owner: PeerId,
        k: u32,
        generation: u32,
        senders: &[PeerId],
        now_ms: u64,
        out: &mut Vec<MergeOut>,
    ) -> bool {
        let ku = k as usize;
        let Some(part) = self.plan.partitions.get(ku) else { return false };
        if part.generation != generation || !part.owners.contains(&owner) || !self.open(ku) {
            return false;
        }
        // It reduced the partition: it lacks nothing.
        if self.reports.get(ku).is_some_and(|r| r.contains_key(&owner)) {
            return false;
        }
        if self.missing.len() != self.plan.partitions.len() {
            self.missing.resize(self.plan.partitions.len(), Default::default());
        }
        let mut taken = false;
        // At most one entry per participant: the map stays bounded by the plan.
        for s in senders.iter().filter(|s| **s != owner && self.plan.is_participant(s)) {
            if self.missing_refuted.contains(&(k, *s)) {
                continue;
            }
            self.missing[ku].entry(*s).or_default().insert(owner);
            self.missing_since.entry((k, *s)).or_insert(now_ms);
            taken = true;
            if self.missing_asked.insert((k, generation, *s)) {
                out.push(MergeOut::Missing { partition: k, generation, sender: *s });
            }
        }
        taken
    }

    /// The validators found `sender`'s contribution to partition `k`
    /// stored: the owners that claimed it missing can read it, and their
    /// claim no longer keeps them from being counted laggards.
    pub fn refute_missing(&mut self, k: u32, sender: PeerId) {
        self.missing_refuted.insert((k, sender));
        if let Some(m) = self.missing.get_mut(k as usize) {
            m.remove(&sender);
        }
        self.missing_since.remove(&(k, sender));
    }

    /// The owners of partition `k` waiting on a contribution they claimed
    /// missing (a claim not refuted).
    pub(super) fn claimants(&self, k: u32) -> BTreeSet<PeerId> {
        self.missing.get(k as usize).map(|m| m.values().flatten().copied().collect()).unwrap_or_default()
    }

    /// Senders claimed missing on a partition that is still unsettled,
    /// each once (its first such partition, corroborated if any of its
    /// partitions is, since its earliest claim).
    pub fn withheld_senders(&self) -> Vec<WithheldClaim> {
        let mut out: Vec<WithheldClaim> = Vec::new();
        // Every claim in `missing` has its time here (in the same order,
        // partition then sender): walking the claims, not every partition,
        // keeps this cheap where it is asked on every report.
        for (&(k, s), &since_ms) in &self.missing_since {
            let Some(by) = self.missing.get(k as usize).and_then(|m| m.get(&s)) else { continue };
            if !self.open(k as usize) || !self.plan.is_participant(&s) {
                continue;
            }
            let corroborated = by.len() >= 2;
            match out.iter_mut().find(|c| c.sender == s) {
                Some(c) => {
                    c.corroborated |= corroborated;
                    c.since_ms = c.since_ms.min(since_ms);
                }
                None => out.push(WithheldClaim { partition: k, sender: s, corroborated, since_ms }),
            }
        }
        out
    }

    /// Plans out senders found withholding (see `withheld_senders`): their
    /// work leaves the merge, and the partitions they held up are reduced
    /// again without them.
    pub fn plan_out_withheld(&mut self, senders: &[(u32, PeerId, bool)], out: &mut Vec<MergeOut>) {
        let gone: Vec<PeerId> = senders.iter().map(|(_, p, _)| *p).filter(|p| self.plan.is_participant(p)).collect();
        if gone.is_empty() {
            return;
        }
        self.withheld.extend(senders.iter().filter(|(_, p, _)| gone.contains(p)).copied());
        self.drop_participants(&gone, out);
    }
}
