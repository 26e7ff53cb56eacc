//! Withheld merge contributions (PROTOCOL.md, "Withheld contributions"),
//! the orchestrator's side; the rule itself is `StageMerge`'s
//! (`iota_core::merge`, withheld.rs).
//!
//! An owner reports the senders whose contribution it misses. Each
//! sender's first claim on a partition's generation asks it to store that
//! contribution (an honest sender whose frames were lost does so, and the
//! owners read it from the store) and, with validators, opens a
//! withholding audit: the validators recompute the partition from the
//! stored contributions and say whose are missing.
//!
//! The stage never waits on the audit. Two distinct owners' claims
//! against a sender (R >= 3, the sender a third party to the partition)
//! plan it out at once; one owner's claim (R = 2, where the claimant may
//! be the liar) plans it out once the store's patience has passed
//! (`store_patience_ms`: the sender's upload and the owner's read of one
//! slice, with room for latency) with the contribution still not read.
//! Planned out is not convicted. The audit outlives the merge, and its
//! epoch, until `validation.timeout_ms`; by stake:
//! - more than half find the sender's contribution missing: it is
//!   convicted of the merge's epoch (a finding that comes after that
//!   epoch was settled costs the sender the epoch it lands in);
//! - more than half find it stored: the claim is refuted, and shields its
//!   owner from the laggard rule no longer;
//! - undecided: the claim stands as it is, and nobody is convicted.
//!
//! The run's last merge is the exception: it waits for the withholding
//! audits still out, so that no finding comes after the run.
//!
//! Without validators two owners' claims convict the sender; one owner's
//! claim convicts nobody.

use iota_core::PeerId;
use iota_core::merge::{MergeOut, WithheldClaim};
use iota_wire::pb;
use tracing::{info, warn};

use super::validation_state::AuditAnswer;
use super::{Ms, Orchestrator, Out};

/// The least the orchestrator waits, from the first claim on a sender's
/// contribution, for the owners to read it from the store: the request
/// reaches the sender, its worker stores the slice, the owners' next
/// store poll (once a second) reads it.
const STORE_PATIENCE_MS: Ms = 3_000;
/// The longest store patience, whatever the slice and the bandwidth.
const MAX_STORE_PATIENCE_MS: Ms = 3_600_000;

/// How long, from the first claim, owners may take to read a contribution
/// of `slice_bytes` from the store: `STORE_PATIENCE_MS` plus its upload
/// and download at `store_mbit` Mbit/s (the run's `merge.store_mbit`).
pub(super) fn store_patience(slice_bytes: u64, store_mbit: u32) -> Ms {
    let bytes_per_s = u64::from(store_mbit.max(1)) * 125_000;
    let transfer = slice_bytes.saturating_mul(2000) / bytes_per_s;
    STORE_PATIENCE_MS.saturating_add(transfer).min(MAX_STORE_PATIENCE_MS)
}

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
            Some(m) => m.contributions_missing(peer, partition, generation, senders, now, &mut mo),
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
        let epoch = bm.plan.epoch;
        let open = self.validation.merge_audits.iter_mut().find(|a| {
            a.epoch == epoch
                && a.stage == stage
                && a.partition == partition
                && a.generation == generation
                && !a.withheld.is_empty()
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

    /// How long, from the first claim, the owners of `stage`'s partition
    /// `k` may take to read a claimed contribution from the store
    /// (`store_patience` of one slice of it).
    fn store_patience_ms(&self, stage: u32, k: u32) -> Ms {
        let len = self.butterfly.get(&stage).and_then(|bm| bm.plan.partitions.get(k as usize)).map_or(0, |p| p.len);
        let bytes = self.spec.merge.contribution_bytes(len).unwrap_or(u64::MAX);
        store_patience(bytes, self.spec.merge.store_mbit)
    }

    /// Whether a withholding audit waits on the validators (the run's
    /// last merge waits for them: a finding after the run would be lost).
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
    /// the store's patience has passed or the merge `timed_out`.
    pub(super) fn plan_out_withheld(&mut self, now: Ms, stage: u32, timed_out: bool, out: &mut Vec<Out>) {
        let Some(bm) = self.butterfly.get(&stage) else { return };
        let named: Vec<(WithheldClaim, bool)> = bm
            .withheld_senders()
            .into_iter()
            .filter(|c| {
                c.corroborated
                    || timed_out
                    || now.saturating_sub(c.since_ms) >= self.store_patience_ms(stage, c.partition)
            })
            .map(|c| (c, self.withholding_audit_open(stage, c.partition, &c.sender)))
            .collect();
        if named.is_empty() {
            return;
        }
        let mut mo = Vec::new();
        if let Some(bm) = self.butterfly.get_mut(&stage) {
            let senders: Vec<(u32, PeerId, bool)> =
                named.iter().map(|(c, _)| (c.partition, c.sender, c.corroborated)).collect();
            bm.plan_out_withheld(&senders, &mut mo);
        }
        self.merge_outs(stage, mo, out);
        for (c, audited) in named {
            let (epoch, partition, sender) = (self.epoch, c.partition, c.sender);
            if c.corroborated && !audited {
                warn!(epoch, stage, partition, %sender, "two owners never got a sender's merge contribution: it is planned out and convicted");
                self.counters.withheld_contributions += 1;
                self.convict_merge(now, sender, out);
                continue;
            }
            self.counters.withheld_planned_out += 1;
            if audited {
                warn!(epoch, stage, partition, %sender, corroborated = c.corroborated, "a merge contribution never reached its owners: its sender is planned out; the validators' finding decides its conviction");
            } else {
                warn!(epoch, stage, partition, %sender, "an owner never got a sender's merge contribution: it is planned out of this merge");
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
        let epoch = a.epoch;
        self.validation.merge_audits.remove(i);
        // The audit outlives its merge: its stage merge is touched only
        // while it is still that merge.
        let current = self.merge_is_current(epoch);
        let mut mo = Vec::new();
        if let Some(bm) = self.butterfly.get_mut(&stage).filter(|m| current && m.plan.epoch == epoch) {
            for s in &refuted {
                bm.refute_missing(partition, *s);
            }
            let named: Vec<(u32, PeerId, bool)> = convicted.iter().map(|s| (partition, *s, true)).collect();
            bm.plan_out_withheld(&named, &mut mo);
        }
        self.merge_outs(stage, mo, out);
        for s in &refuted {
            info!(epoch, stage, partition, sender = %s, "a contribution claimed missing is stored: the claim is refuted");
        }
        self.counters.missing_claims_refuted += refuted.len() as u64;
        for s in convicted {
            warn!(epoch, stage, partition, sender = %s, late = !current, "the validators found a contribution an owner missed not stored: its sender is convicted");
            self.counters.withheld_contributions += 1;
            self.convict_merge_of(now, epoch, s, out);
        }
    }
}
