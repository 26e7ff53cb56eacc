//! Which partition of each owner pair a validator audits, and the audits'
//! results. Every pair of owners has one partition drawn (the least
//! seeded hash among those it owns and that are not settled otherwise);
//! the results the pair agrees on are held until that partition's audit
//! answers.
//!
//! The draw is asked at every owner's report, so each pair's partitions
//! are kept in draw order for the plan they were drawn from
//! (`audit_order.rs`): the scan of every partition at each report was a
//! twentieth of a 2,000-miner simulated run.

use std::collections::{BTreeMap, BTreeSet};

use super::{MergeOut, StageMerge};
use crate::merge::audit_order::{AuditOrder, Pair};

impl StageMerge {
    /// Turns audits on: for every pair of owners, the results they agree
    /// on wait until a validator has recomputed one of their partitions,
    /// drawn with `seed` (which the owners must not know). Two colluding
    /// owners that lie on every partition they share are caught at their
    /// first merge, ones that lie on a fraction f of them with probability
    /// at least f, and nothing they agreed on is applied before their
    /// audit.
    pub fn audit_with(&mut self, seed: u64) {
        self.audit_seed = Some(seed);
    }

    /// The owner pair of partition `k` in the current plan (None: not two
    /// owners, as after a referee).
    pub(super) fn pair_of(&self, k: u32) -> Option<Pair> {
        match self.plan.partitions.get(k as usize)?.owners[..] {
            [a, b] => Some((a.min(b), a.max(b))),
            _ => None,
        }
    }

    /// The partition audited for an owner pair: of the partitions the pair
    /// owns now and that are not settled otherwise (held for the audit or
    /// not yet agreed), the one with the least seeded hash. One settled
    /// without the audit (a dispute kept its previous weights) passes the
    /// audit on to the next, so a pair cannot dodge it by disputing.
    pub(super) fn audited_of(&self, pair: Pair) -> Option<u32> {
        let seed = self.audit_seed?;
        let unsettled = |k: &u32| self.verdicts.get(*k as usize).is_some_and(|v| v.is_none());
        let drawn = match &self.audit_order {
            o if o.built_at == Some((self.plan_revision, seed)) => {
                o.of_pair.get(&pair).and_then(|ks| ks.iter().copied().find(unsettled))
            }
            _ => self.audited_by_scan(seed, pair),
        };
        // Checked against the scan where that stays cheap (tests' merges).
        if cfg!(debug_assertions) && self.plan.partitions.len() <= 64 {
            assert_eq!(drawn, self.audited_by_scan(seed, pair), "the kept audit order is stale");
        }
        drawn
    }

    /// `audited_of` from the plan itself.
    fn audited_by_scan(&self, seed: u64, pair: Pair) -> Option<u32> {
        (0..self.plan.partitions.len() as u32)
            .filter(|k| self.pair_of(*k) == Some(pair))
            .filter(|k| self.verdicts.get(*k as usize).is_some_and(|v| v.is_none()))
            .min_by_key(|k| audit_key(seed, *k))
    }

    /// Builds the audit order for the current plan and seed, unless it is
    /// built already. The plan changes only with a revision (a referee, a
    /// re-plan), so the revision and the seed say when to build again.
    fn keep_audit_order(&mut self) {
        let Some(seed) = self.audit_seed else { return };
        let at = (self.plan_revision, seed);
        if self.audit_order.built_at == Some(at) {
            return;
        }
        let mut of_pair: BTreeMap<Pair, Vec<(u64, u32)>> = BTreeMap::new();
        for k in 0..self.plan.partitions.len() as u32 {
            if let Some(pair) = self.pair_of(k) {
                of_pair.entry(pair).or_default().push((audit_key(seed, k), k));
            }
        }
        let of_pair = of_pair
            .into_iter()
            .map(|(pair, mut ks)| {
                ks.sort_unstable();
                (pair, ks.into_iter().map(|(_, k)| k).collect())
            })
            .collect();
        self.audit_order = AuditOrder { built_at: Some(at), of_pair };
    }

    /// A validator's recompute of an audited partition: `Some(hash)` of
    /// the update it computed, or None (it could not, or nobody answered
    /// in time: the pair's results are accepted, as without an audit). A
    /// different hash convicts both owners (`MergeOut::Colluded`): they
    /// are planned out and every partition not yet accepted is re-planned
    /// without them. Returns false for an audit not waited on (stale, or
    /// another generation).
    pub fn audit_result(
        &mut self,
        k: u32,
        generation: u32,
        recomputed: Option<[u8; 32]>,
        out: &mut Vec<MergeOut>,
    ) -> bool {
        if self.referee_held.contains_key(&k) {
            return self.referee_audit_result(k, generation, recomputed, out);
        }
        if self.disputed.contains_key(&k) {
            return self.dispute_audit_result(k, generation, recomputed, out);
        }
        let Some(v) = self.held.get(&k).filter(|v| v.generation == generation).cloned() else { return false };
        self.keep_audit_order();
        let Some(pair) = self.pair_of(k).filter(|p| self.audited_of(*p) == Some(k)) else { return false };
        match recomputed {
            Some(h) if h != v.hash => {
                self.audited.failed += 1;
                let owners = vec![pair.0, pair.1];
                self.colluded.push((k, owners.clone()));
                out.push(MergeOut::Colluded(owners.clone()));
                self.drop_participants(&owners, out);
            }
            _ => {
                if recomputed.is_some() {
                    self.audited.passed += 1;
                } else {
                    self.audited.released += 1;
                }
                self.cleared.insert(pair);
                let waiting: Vec<u32> = self.held.keys().copied().filter(|j| self.pair_of(*j) == Some(pair)).collect();
                for j in waiting {
                    if let Some(v) = self.held.remove(&j) {
                        self.accept(v.partition, v.generation, v.hash, v.writer, out);
                    }
                }
            }
        }
        true
    }

    /// The audits waiting on a validator: (partition, generation).
    pub fn audits_waiting(&self) -> Vec<(u32, u32)> {
        let held = self
            .held
            .values()
            .filter(|v| {
                self.referee_held.contains_key(&v.partition)
                    || self.pair_of(v.partition).and_then(|p| self.audited_of(p)) == Some(v.partition)
            })
            .map(|v| (v.partition, v.generation));
        let disputed = self.disputed.iter().map(|(k, (g, _))| (*k, *g));
        let mut all: Vec<(u32, u32)> = held.chain(disputed).collect();
        all.sort_unstable();
        all
    }

    /// Asks, once per (partition, generation), for the audit of each owner
    /// pair whose audited partition is held: whenever a pair's results are
    /// waiting, its audit is on its way (the audited partition can move,
    /// when the one first drawn settles by a dispute or goes to a referee).
    pub(super) fn ask_audits(&mut self, out: &mut Vec<MergeOut>) {
        let pairs: BTreeSet<Pair> =
            self.held.keys().filter_map(|k| self.pair_of(*k)).filter(|p| !self.cleared.contains(p)).collect();
        if pairs.is_empty() {
            return;
        }
        self.keep_audit_order();
        for pair in pairs {
            let Some(a) = self.audited_of(pair) else { continue };
            let Some(generation) = self.held.get(&a).map(|v| v.generation) else { continue };
            if self.audit_asked.insert((a, generation)) {
                out.push(MergeOut::Audit { partition: a, generation });
            }
        }
    }
}

/// Partition `k`'s rank in the audit draw of `seed` (the least is audited).
fn audit_key(seed: u64, k: u32) -> u64 {
    crate::rng::Rng::new(seed ^ u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64()
}
