//! Flags: owners that find a sender's contribution undecodable,
//! non-finite or a far outlier (`flaws`) flag it. Two owners other than
//! the sender convict it; with audits on, only once the validators'
//! recompute flags it too (two colluding owners could otherwise frame an
//! honest sender).

use std::collections::BTreeMap;

use super::{MergeOut, StageMerge};
use crate::identity::PeerId;

impl StageMerge {
    /// Records that owner `by` flagged `flagged` in partition `k`; returns
    /// the participants now flagged there by two owners other than
    /// themselves.
    pub(super) fn count_flags(&mut self, k: u32, by: PeerId, flagged: &[PeerId]) -> Vec<PeerId> {
        let ku = k as usize;
        if self.flags.len() != self.plan.partitions.len() {
            self.flags.resize(self.plan.partitions.len(), BTreeMap::new());
        }
        let mut out = Vec::new();
        for f in flagged {
            if *f == by || !self.plan.is_participant(f) || out.contains(f) {
                continue;
            }
            let owners = self.flags[ku].entry(*f).or_default();
            owners.insert(by);
            if owners.len() >= 2 {
                out.push(*f);
            }
        }
        out
    }

    pub(super) fn convict_flawed(&mut self, k: u32, flawed: &[PeerId], out: &mut Vec<MergeOut>) {
        out.extend(flawed.iter().map(|l| MergeOut::Flawed(*l)));
        self.flawed.extend(flawed.iter().map(|l| (k, *l)));
        self.drop_participants(flawed, out);
    }

    /// The validators' verdict on the senders two owners flagged in
    /// partition `k`: `Some(true)` their recompute flags them too (or
    /// None: nobody answered in time, and the owners' word stands, as
    /// without audits): the senders are convicted (`MergeOut::Flawed`).
    /// `Some(false)`: it does not, so the flagging owners framed them:
    /// the owners are convicted (`MergeOut::Colluded`). Either way the
    /// convicted are planned out. False for a flag audit not waited on.
    pub fn flag_audit_result(
        &mut self,
        k: u32,
        generation: u32,
        confirmed: Option<bool>,
        out: &mut Vec<MergeOut>,
    ) -> bool {
        let Some(hold) = self.flag_held.get(&k).filter(|h| h.generation == generation).cloned() else { return false };
        self.flag_held.remove(&k);
        if confirmed == Some(false) {
            self.audited.failed += 1;
            self.colluded.push((k, hold.flaggers.clone()));
            out.push(MergeOut::Colluded(hold.flaggers.clone()));
            self.drop_participants(&hold.flaggers, out);
        } else {
            if confirmed.is_some() {
                self.audited.passed += 1;
            } else {
                self.audited.released += 1;
            }
            self.convict_flawed(k, &hold.flagged, out);
        }
        true
    }
}
