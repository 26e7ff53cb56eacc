//! Withheld merge contributions (PROTOCOL.md, "Withheld contributions"),
//! the orchestrator's side; the rule itself is `StageMerge`'s
//! (`iota_core::merge`, withheld.rs).
//!
//! An owner reports the senders whose contribution it misses. Each
//! sender's first claim on a partition's generation asks it to store that
//! contribution (an honest sender whose frames were lost does so, and the
//! owners read it from the store) and, with validators, opens a
//! withholding audit: the validators recompute the partition from the
//! stored contributions and say whose are missing. By stake:
//! - more than half find the sender's missing: it is planned out and
//!   convicted;
//! - more than half find it stored: the claim is refuted, and shields its
//!   owner from the laggard rule no longer;
//! - undecided at `validation.timeout_ms`: the claim stands as it is.
//!
//! Two distinct owners' claims against a sender (R >= 3, the sender a
//! third party to the partition) plan it out at once: the stage merges
//! without it rather than wait. Without validators they convict it; with
//! validators the conviction waits for their finding. One owner's claim
//! (R = 2, where the claimant may be the liar) waits for the merge's
//! timeout, and for the audit if one is pending; then the sender is
//! planned out, and convicted of nothing. The merge is not over while a
//! withholding audit is pending: a conviction lands in its epoch.

use iota_core::PeerId;
use iota_core::merge::MergeOut;
use iota_protocol::pb;
use tracing::{info, warn};

use super::validation_state::AuditAnswer;
use super::{Ms, Orchestrator, Out};

impl Orchestrator {
    /// Owner `peer` misses `senders`' contributions to a partition.
    pub(super) fn on_contributions_missing(
        &mut self,
        now: Ms,
        peer: PeerId,
        (epoch, stage): (u64, u32),
        (partition, generation): (u32, u32),
        senders: &[PeerId],
        out: &mut Vec<Out>,
    ) {
        let current = self.merge_is_current(epoch);
        let mut mo = Vec::new();
        let accepted = match self.butterfly.get_mut(&stage).filter(|m| current && m.plan.epoch == epoch) {
            Some(m) => m.contributions_missing(peer, partition, generation, senders, &mut mo),
            None => false,
        };
        if !accepted {
            self.counters.stale_reports += 1;
            return;
        }
        for o in &mo {
            if let MergeOut::Missing { sender, .. } = o {
                info!(epoch, stage, partition, owner = %peer, %sender, "an owner misses a merge contribution; its sender is asked to store it");
            }
        }
        self.merge_outs(stage, mo, out);
        self.plan_out_withheld(now, stage, false, out);
    }

    /// A sender's contribution to a partition was first claimed missing:
    /// the sender is asked to store it, and the validators (if any)
    /// whether it did.
    pub(super) fn ask_withheld(
        &mut self,
        stage: u32,
        (partition, generation): (u32, u32),
        sender: PeerId,
        out: &mut Vec<Out>,
    ) {
        let Some(bm) = self.butterfly.get(&stage) else { return };
        let req = pb::ContributionRequest { epoch: bm.plan.epoch, stage, partitions: vec![partition] };
        out.push(Out { to: sender, cmd: pb::command::Kind::ContributionRequest(req) });
        if !self.validation.validators.values().any(|v| v.subscribed) {
            return;
        }
        // One audit a partition: a second sender claimed missing joins the
        // open one (every answer names every participant whose
        // contribution is not stored).
        let participants = bm.plan.participants.len();
        let open = self.validation.merge_audits.iter_mut().find(|a| {
            a.stage == stage && a.partition == partition && a.generation == generation && !a.withheld.is_empty()
        });
        match open {
            Some(a) => {
                if !a.withheld.contains(&sender) && a.withheld.len() < participants {
                    a.withheld.push(sender);
                }
            }
            None => self.open_merge_audit(stage, partition, generation, (false, vec![sender]), out),
        }
    }

    /// Whether a withholding audit waits on the validators: the merge is
    /// not over until it is decided (or expires, at `validation.timeout_ms`),
    /// so a sender planned out before it is convicted in its epoch.
    pub(super) fn withholding_audits_pending(&self) -> bool {
        self.validation.merge_audits.iter().any(|a| !a.withheld.is_empty())
    }

    /// Whether a withholding audit of `sender` on this partition waits on
    /// the validators.
    fn withholding_audit_open(&self, stage: u32, partition: u32, sender: &PeerId) -> bool {
        self.validation
            .merge_audits
            .iter()
            .any(|a| a.stage == stage && a.partition == partition && a.withheld.contains(sender))
    }

    /// Plans out the senders an owner misses a contribution from (see the
    /// module's text): those two owners claimed at once, the others once
    /// the merge `timed_out` with no audit of them pending.
    pub(super) fn plan_out_withheld(&mut self, now: Ms, stage: u32, timed_out: bool, out: &mut Vec<Out>) {
        let Some(bm) = self.butterfly.get(&stage) else { return };
        let named: Vec<(u32, PeerId, bool, bool)> = bm
            .withheld_senders()
            .into_iter()
            .map(|(k, s, corroborated)| (k, s, corroborated, self.withholding_audit_open(stage, k, &s)))
            .filter(|(_, _, corroborated, audited)| *corroborated || (timed_out && !audited))
            .collect();
        if named.is_empty() {
            return;
        }
        let mut mo = Vec::new();
        if let Some(bm) = self.butterfly.get_mut(&stage) {
            let senders: Vec<(u32, PeerId, bool)> = named.iter().map(|(k, s, c, _)| (*k, *s, *c)).collect();
            bm.plan_out_withheld(&senders, &mut mo);
        }
        self.merge_outs(stage, mo, out);
        for (partition, sender, corroborated, audited) in named {
            if corroborated && audited {
                warn!(epoch = self.epoch, stage, partition, %sender, "two owners never got a sender's merge contribution: it is planned out; the validators' finding decides its conviction");
                self.counters.withheld_planned_out += 1;
            } else if corroborated {
                warn!(epoch = self.epoch, stage, partition, %sender, "two owners never got a sender's merge contribution: it is planned out and convicted");
                self.counters.withheld_contributions += 1;
                self.convict_merge(now, sender, out);
            } else {
                warn!(epoch = self.epoch, stage, partition, %sender, "an owner never got a sender's merge contribution: it is planned out of this merge");
                self.counters.withheld_planned_out += 1;
            }
        }
    }

    /// Settles a withholding audit once the stake has spoken on every
    /// sender in it (or `force`: it ran out of time).
    pub(super) fn decide_withholding_audit(&mut self, now: Ms, i: usize, force: bool, out: &mut Vec<Out>) {
        let a = &self.validation.merge_audits[i];
        let (stage, partition) = (a.stage, a.partition);
        let stake = |p: &PeerId| self.validation.validators.get(p).map_or(0, |v| v.stake);
        let total = self.total_stake();
        let majority = |s: u64| 2 * u128::from(s) > total;
        let (mut convicted, mut refuted, mut undecided) = (Vec::new(), Vec::new(), false);
        for s in &a.withheld {
            let (mut missing, mut stored) = (0u64, 0u64);
            for (v, ans) in &a.answers {
                match ans {
                    AuditAnswer::Missing(ps) if ps.contains(s) => missing += stake(v),
                    AuditAnswer::Missing(_) | AuditAnswer::Hash(..) => stored += stake(v),
                    AuditAnswer::Unable => {}
                }
            }
            if majority(missing) {
                convicted.push(*s);
            } else if majority(stored) {
                refuted.push(*s);
            } else {
                undecided = true;
            }
        }
        let all_answered = a.sent_to.iter().all(|v| a.answers.contains_key(v));
        if undecided && !force && !all_answered {
            return;
        }
        self.validation.merge_audits.remove(i);
        let mut mo = Vec::new();
        let Some(bm) = self.butterfly.get_mut(&stage) else { return };
        for s in &refuted {
            info!(epoch = self.epoch, stage, partition, sender = %s, "a contribution claimed missing is stored: the claim is refuted");
            bm.refute_missing(partition, *s);
        }
        self.counters.missing_claims_refuted += refuted.len() as u64;
        let named: Vec<(u32, PeerId, bool)> = convicted.iter().map(|s| (partition, *s, true)).collect();
        bm.plan_out_withheld(&named, &mut mo);
        self.merge_outs(stage, mo, out);
        for s in convicted {
            warn!(epoch = self.epoch, stage, partition, sender = %s, "the validators found a contribution an owner missed not stored: its sender is convicted");
            self.counters.withheld_contributions += 1;
            self.convict_merge(now, s, out);
        }
    }
}
