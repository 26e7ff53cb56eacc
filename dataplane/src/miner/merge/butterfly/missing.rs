//! An owner's claim of contributions it never got (PROTOCOL.md, "Withheld
//! contributions"): past its patience, an owner reports the senders it
//! still misses for a partition it owns, once per partition generation.
//! The orchestrator asks them to store the contribution (the owner's
//! store polls then find it) and plans out one that never does, rather
//! than let the partition, and the stage's merge, stall.

use std::time::Duration;

use iota_core::merge::MergePlan;
use iota_protocol::pb;
use tracing::warn;

use super::{Butterfly, MergeFault};
use crate::miner::events::Output;

/// The least an owner waits for a contribution before claiming it missing
/// (the store has been polled a few times by then).
const MISSING_AFTER: Duration = Duration::from_secs(2);
/// The rate a slice is assumed to travel at when the patience is set (as
/// evidence uploads: 100 Mbit/s).
const SLICE_BYTES_PER_S: u64 = 12_500_000;

impl Butterfly {
    /// How long an owner of partition `k` waits before a claim: at least
    /// `MISSING_AFTER` plus every participant's slice at 100 Mbit/s, and
    /// at least twice as long as the latest contribution this merge took
    /// to arrive (a slow network is everyone's).
    pub(super) fn missing_patience(&self, k: usize) -> Duration {
        let Some(plan) = self.plan.as_ref() else { return MISSING_AFTER };
        let len = plan.partitions.get(k).map_or(0, |p| p.len);
        let slice = self.spec.contribution_bytes(len).unwrap_or(u64::MAX);
        let bytes = slice.saturating_mul(plan.participants.len() as u64);
        let transfer = Duration::from_millis((bytes.saturating_mul(1000) / SLICE_BYTES_PER_S).min(3_600_000));
        (MISSING_AFTER + transfer).max(self.latest_contribution.saturating_mul(2))
    }

    /// Claims, once per partition generation, the contributions this owner
    /// still misses past its patience.
    pub(super) fn claim_missing(&mut self, out: &mut Vec<Output>) {
        let Some(plan) = self.plan.clone() else { return };
        let waited = self.plan_at.elapsed();
        for k in plan.owned_by(&self.me).collect::<Vec<_>>() {
            let Some(part) = plan.partitions.get(k) else { continue };
            let reduced = self.results.get(&k).is_some_and(|r| r.generation == part.generation);
            if reduced || self.verdicts.contains_key(&k) || self.claimed.contains(&(k, part.generation)) {
                continue;
            }
            if waited < self.missing_patience(k) {
                continue;
            }
            let have = self.contribs.get(&k);
            let senders: Vec<Vec<u8>> = plan
                .participants
                .iter()
                .map(|p| p.peer)
                .filter(|p| *p != self.me && !have.is_some_and(|h| h.contains_key(p)))
                .map(|p| p.0.to_vec())
                .collect();
            if senders.is_empty() {
                continue;
            }
            self.claimed.insert((k, part.generation));
            warn!(
                epoch = self.epoch,
                stage = self.stage,
                partition = k,
                missing = senders.len(),
                waited_s = waited.as_secs_f64(),
                "merge contributions never came (not as frames, not in the store): reporting their senders"
            );
            out.push(Output::Report(pb::report::Kind::ContributionsMissing(pb::ContributionsMissing {
                epoch: self.epoch,
                stage: self.stage,
                partition: k as u32,
                generation: part.generation,
                senders,
            })));
        }
    }

    /// Whether a `Withhold` fault keeps its contribution to partition `k`
    /// from the other owners (see `MergeFault::Withhold`).
    pub(super) fn withholds(&self, plan: &MergePlan, k: usize) -> bool {
        if self.fault != Some(MergeFault::Withhold) {
            return false;
        }
        let third_party = (0..plan.partitions.len()).find(|j| !plan.partitions[*j].owners.contains(&self.me));
        third_party.unwrap_or(0) == k
    }
}
