//! The orchestrator's side of one stage's butterfly merge, free of I/O: it
//! holds the plan, collects the owners' slice hashes, accepts a result per
//! partition (a verdict), sends a disputed partition to a referee, re-plans
//! around participants that drop out, plans out a participant proven to
//! have sent two owners different contributions (see `equivocation`) or
//! whose contribution two other owners flag (see `flaws`), holds an
//! audited partition's agreed result until a validator's recompute of it
//! answers (two colluding owners agree on a wrong result: the audit
//! convicts both), and knows when the stage is merged.
//! The orchestrator drives it from reports; the local merge harness and the
//! bench drive it directly, without gRPC.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::equivocation::{Equivocation, SignedContribution};
use super::plan::MergePlan;
use crate::identity::PeerId;

/// The hash of a verdict that keeps a partition's previous weights.
pub const KEEP_PREVIOUS: [u8; 32] = [0; 32];

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub partition: u32,
    pub generation: u32,
    pub hash: [u8; 32],
    /// Stores the merged slice and its momentum in the object store.
    pub writer: PeerId,
}

/// Two owners of a partition published different results.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    pub epoch: u64,
    pub stage: u32,
    pub partition: u32,
    pub generation: u32,
    /// Each owner with the hash it published.
    pub owners: Vec<(PeerId, [u8; 32])>,
    /// Set once a referee re-computed the partition: the owners whose hash
    /// differs from the referee's.
    pub deviants: Vec<PeerId>,
}

/// What the orchestrator should send after an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeOut {
    /// The (changed) plan, to every participant.
    Plan,
    /// A verdict, to every participant.
    Verdict(Verdict),
    /// A participant was proven to equivocate (the proof is the last of
    /// `StageMerge::equivocations`) and is planned out: the orchestrator
    /// convicts it.
    Equivocated(PeerId),
    /// Two owners other than this participant flagged its contribution
    /// (see `flaws`); it is planned out, and the orchestrator convicts it.
    Flawed(PeerId),
    /// Two owners flagged a sender's contribution to this partition: the
    /// conviction waits for the validators' recompute of the flags
    /// (`StageMerge::flag_audit_result`).
    AuditFlags { partition: u32, generation: u32 },
    /// Both owners agreed on an audited partition: its result is held
    /// until a validator recomputes it (`StageMerge::audit_result`). The
    /// orchestrator asks every participant for its contribution and a
    /// validator for the recompute.
    Audit { partition: u32, generation: u32 },
    /// A validator's recompute of an audited partition differs from the
    /// result its owners agreed on: they are planned out, and the
    /// orchestrator convicts them.
    Colluded(Vec<PeerId>),
    /// A validator's recompute of a disputed partition matched the result
    /// its referee and one owner gave: the other owner is proven wrong,
    /// planned out, and the orchestrator convicts it.
    Deviant(Vec<PeerId>),
    /// An owner reported `sender`'s contribution to this partition
    /// missing (the first claim on it this generation): the orchestrator
    /// asks the sender to store it, and the validators whether it did
    /// (see `withheld.rs`).
    Missing { partition: u32, generation: u32, sender: PeerId },
}

/// An owner's result for one partition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceReport {
    /// The blake3 of its encoded update.
    pub hash: [u8; 32],
    /// The headers of the contributions it reduced that came as frames,
    /// checked (see `SignedContribution::check`).
    pub contributions: Vec<SignedContribution>,
    /// Participants whose contribution it flagged (see `flaws`).
    pub flagged: Vec<PeerId>,
}

impl SliceReport {
    /// A result with no evidence.
    pub fn of(hash: [u8; 32]) -> SliceReport {
        SliceReport { hash, ..SliceReport::default() }
    }
}

/// A contribution as an owner reported it: payload hash, archived signed
/// header.
type Reported = ([u8; 32], Vec<u8>);

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageMerge {
    pub plan: MergePlan,
    /// How many times the plan changed (a referee, a re-plan): what is
    /// built from the plan is rebuilt when this moves.
    #[serde(default)]
    plan_revision: u64,
    /// Each owner pair's partitions in audit order (derived, not saved).
    #[serde(skip)]
    audit_order: super::audit_order::AuditOrder,
    /// Hashes per partition for its current generation, by owner.
    reports: Vec<BTreeMap<PeerId, [u8; 32]>>,
    pub verdicts: Vec<Option<Verdict>>,
    /// Participants that finished, with the hash of their merged weights.
    pub done: BTreeMap<PeerId, [u8; 32]>,
    pub mismatches: Vec<Mismatch>,
    /// Writers whose stored slice a reader found bad, per partition: never
    /// made a partition's writer again this merge.
    #[serde(default)]
    spurned: BTreeMap<u32, Vec<PeerId>>,
    /// Per partition, each sender's contribution as the owners reported it
    /// (payload hash, archived signed header), over the whole merge: a
    /// sender's slice does not change with re-plans.
    #[serde(default)]
    contributions: Vec<BTreeMap<PeerId, Reported>>,
    /// Proofs of equivocation found in this merge.
    #[serde(default)]
    pub equivocations: Vec<Equivocation>,
    /// Per partition, the owners that flagged each sender.
    #[serde(default)]
    flags: Vec<BTreeMap<PeerId, BTreeSet<PeerId>>>,
    /// Participants planned out for flawed contributions: (partition, who).
    #[serde(default)]
    pub flawed: Vec<(u32, PeerId)>,
    /// The orchestrator's secret for drawing, per pair of owners, the one
    /// partition a validator recomputes (None: no audits). The owners
    /// cannot tell which until they have reported.
    #[serde(default)]
    audit_seed: Option<u64>,
    /// Owner pairs whose audit passed (or was released): their agreed
    /// results are accepted at once.
    #[serde(default)]
    cleared: BTreeSet<(PeerId, PeerId)>,
    /// Agreed results waiting for their pair's audit, by partition.
    #[serde(default)]
    pub held: BTreeMap<u32, Verdict>,
    /// Flags waiting for their audit, by partition.
    #[serde(default)]
    pub flag_held: BTreeMap<u32, FlagHold>,
    /// Audits passed, failed (owners convicted) and released unanswered.
    #[serde(default)]
    pub audited: AuditCounts,
    /// Owners an audit found agreeing on a wrong result: (partition, owners).
    #[serde(default)]
    pub colluded: Vec<(u32, Vec<PeerId>)>,
    /// Audits asked for: (partition, generation).
    #[serde(default)]
    audit_asked: BTreeSet<(u32, u32)>,
    /// The orchestrator's secret for drawing referees (`MergePlan::referee_for`).
    #[serde(default)]
    referee_seed: u64,
    /// Referees' results held for an audit, by partition (the result
    /// itself is in `held`).
    #[serde(default)]
    pub referee_held: BTreeMap<u32, RefereeHold>,
    /// Per partition (its current generation), each sender an owner
    /// reported missing, with the owners that did (see `withheld.rs`).
    #[serde(default)]
    missing: Vec<BTreeMap<PeerId, BTreeSet<PeerId>>>,
    /// Claims of a missing contribution the validators found stored:
    /// (partition, sender). They shield the claimant no longer.
    #[serde(default)]
    missing_refuted: BTreeSet<(u32, PeerId)>,
    /// Claims passed on (`MergeOut::Missing`): (partition, generation, sender).
    #[serde(default)]
    missing_asked: BTreeSet<(u32, u32, PeerId)>,
    /// When each open claim (partition, sender) was first made, in the
    /// orchestrator's milliseconds: past its store patience the sender is
    /// planned out (see `withheld.rs`).
    #[serde(default)]
    missing_since: BTreeMap<(u32, PeerId), u64>,
    /// Senders planned out for a withheld contribution: (partition, who,
    /// whether two owners corroborated it).
    #[serde(default)]
    pub withheld: Vec<(u32, PeerId, bool)>,
    /// Disputes with no referee to draw (R = 2) held for the validators'
    /// recompute, by partition: (generation, each owner's hash). See
    /// `referee.rs`.
    #[serde(default)]
    pub disputed: BTreeMap<u32, (u32, OwnerHashes)>,
}

/// Each owner of a partition with the hash it reported.
pub type OwnerHashes = Vec<(PeerId, [u8; 32])>;

/// A disputed partition's referee result waiting for its audit (see
/// `referee.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefereeHold {
    pub referee: PeerId,
    /// The owner whose result the referee's matched.
    pub sided: Option<PeerId>,
    /// The owners whose result it did not match.
    pub deviants: Vec<PeerId>,
}

/// Senders two owners flagged in a partition, waiting for the audit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlagHold {
    pub generation: u32,
    pub flagged: Vec<PeerId>,
    /// The owners that flagged them.
    pub flaggers: Vec<PeerId>,
}

/// What the audits of one stage merge came to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditCounts {
    pub passed: u32,
    pub failed: u32,
    /// Released without an answer (no validator answered in time), or the
    /// validator could not recompute.
    pub released: u32,
}

impl StageMerge {
    pub fn new(plan: MergePlan) -> StageMerge {
        let k = plan.partitions.len();
        StageMerge {
            plan,
            plan_revision: 0,
            audit_order: Default::default(),
            reports: vec![BTreeMap::new(); k],
            verdicts: vec![None; k],
            done: BTreeMap::new(),
            mismatches: Vec::new(),
            spurned: BTreeMap::new(),
            contributions: vec![BTreeMap::new(); k],
            equivocations: Vec::new(),
            flags: vec![BTreeMap::new(); k],
            flawed: Vec::new(),
            audit_seed: None,
            cleared: BTreeSet::new(),
            held: BTreeMap::new(),
            flag_held: BTreeMap::new(),
            audited: AuditCounts::default(),
            colluded: Vec::new(),
            audit_asked: BTreeSet::new(),
            referee_seed: 0,
            referee_held: BTreeMap::new(),
            missing: vec![BTreeMap::new(); k],
            missing_refuted: BTreeSet::new(),
            missing_asked: BTreeSet::new(),
            missing_since: BTreeMap::new(),
            withheld: Vec::new(),
            disputed: BTreeMap::new(),
        }
    }

    /// Whether partition `k` has no result yet that is not waiting on
    /// something: no verdict, not held for an audit, not disputed.
    pub(super) fn open(&self, k: usize) -> bool {
        let settled = self.verdicts.get(k).is_some_and(|v| v.is_some());
        !settled && !self.held.contains_key(&(k as u32)) && !self.disputed.contains_key(&(k as u32))
    }

    /// `peer` has reported anything in this merge: a slice hash (for the
    /// partitions' current generations) or its finished merge.
    pub fn reported(&self, peer: &PeerId) -> bool {
        self.done.contains_key(peer)
            || self.reports.iter().any(|r| r.contains_key(peer))
            || self.missing.iter().any(|m| m.values().any(|by| by.contains(peer)))
    }

    /// Owners of a partition with no result yet (no verdict, none held
    /// for an audit) that have not reported it while another of its owners
    /// has: a participant that reports one partition and sits on another
    /// holds the whole stage hostage, and `reported` alone cannot tell.
    /// An owner waiting on a contribution it reported missing is no
    /// laggard (the sender is named instead, see `withheld_senders`),
    /// unless the validators found that contribution stored.
    pub fn laggard_owners(&self) -> BTreeSet<PeerId> {
        let mut out = BTreeSet::new();
        for (k, part) in self.plan.partitions.iter().enumerate() {
            let Some(r) = self.reports.get(k).filter(|r| self.open(k) && !r.is_empty()) else { continue };
            let waiting = self.claimants(k as u32);
            out.extend(part.owners.iter().filter(|o| !r.contains_key(o) && !waiting.contains(o)));
        }
        out
    }

    /// Every participant finished.
    /// Moves whenever the plan changes.
    pub fn plan_revision(&self) -> u64 {
        self.plan_revision
    }

    pub fn complete(&self) -> bool {
        // `done` holds participants only (`merge_done` takes no one else and
        // a re-plan drops those it plans out): as many as the plan's are
        // all of them. Asked on every event of a merge, it looks nothing up.
        debug_assert!(self.done.keys().all(|p| self.plan.is_participant(p)), "a non-participant finished");
        self.done.len() == self.plan.participants.len()
    }

    /// Whether every finished participant holds the same weights.
    pub fn consistent(&self) -> bool {
        self.done.values().all(|h| Some(h) == self.done.values().next())
    }

    /// An owner's result for a partition, with its evidence. Stale or
    /// foreign reports are ignored (returns false) rather than refused:
    /// they are normal after a re-plan. A contribution header that
    /// contradicts another owner's report of the same sender's is a proof:
    /// the sender is planned out (`MergeOut::Equivocated`) and the
    /// partition is reduced again without it, so no honest owner is named
    /// deviant for it. A sender flagged by two owners other than itself is
    /// planned out the same way (`MergeOut::Flawed`).
    pub fn slice_done(
        &mut self,
        peer: PeerId,
        k: u32,
        generation: u32,
        report: &SliceReport,
        out: &mut Vec<MergeOut>,
    ) -> bool {
        let taken = self.take_slice_report(peer, k, generation, report, out);
        if taken {
            self.ask_audits(out);
        }
        taken
    }

    fn take_slice_report(
        &mut self,
        peer: PeerId,
        k: u32,
        generation: u32,
        report: &SliceReport,
        out: &mut Vec<MergeOut>,
    ) -> bool {
        let hash = report.hash;
        let ku = k as usize;
        let Some(part) = self.plan.partitions.get(ku).cloned() else { return false };
        if part.generation != generation || !part.owners.contains(&peer) || self.verdicts[ku].is_some() {
            return false;
        }
        let liars = self.compare_contributions(k, &report.contributions);
        if !liars.is_empty() {
            out.extend(liars.iter().map(|l| MergeOut::Equivocated(*l)));
            self.drop_participants(&liars, out);
            return true;
        }
        let flawed = self.count_flags(k, peer, &report.flagged);
        if !flawed.is_empty() {
            // Two owners' word convicts a sender; with audits on, only once
            // the validators' recompute flags it too (two colluding owners
            // could otherwise frame an honest sender).
            if self.audit_seed.is_some() {
                let flaggers: BTreeSet<PeerId> =
                    flawed.iter().flat_map(|f| self.flags[ku].get(f).cloned().unwrap_or_default()).collect();
                let hold = FlagHold { generation, flagged: flawed, flaggers: flaggers.into_iter().collect() };
                self.flag_held.insert(k, hold);
                out.push(MergeOut::AuditFlags { partition: k, generation });
                return true;
            }
            self.convict_flawed(k, &flawed, out);
            return true;
        }
        self.reports[ku].insert(peer, hash);
        if self.reports[ku].len() < part.owners.len() {
            return true;
        }
        let owners: Vec<(PeerId, [u8; 32])> = part.owners.iter().map(|o| (*o, self.reports[ku][o])).collect();
        // A referee's answer settles an open dispute on this partition, by
        // siding with one of its owners. One that sides with neither is
        // no third opinion to apply unchecked (a referee colluding with a
        // lying owner could otherwise pass any result): the slice keeps
        // its previous weights this epoch.
        if owners.len() == 1
            && let Some(m) = self
                .mismatches
                .iter_mut()
                .rev()
                .find(|m| m.partition == k && m.deviants.is_empty() && m.generation < generation)
        {
            m.deviants = m.owners.iter().filter(|(_, h)| *h != hash).map(|(p, _)| *p).collect();
            if m.deviants.len() == m.owners.len() {
                self.accept(k, generation, KEEP_PREVIOUS, owners[0].0, out);
                return true;
            }
            // With audits on, a referee's side waits for a validator's
            // recompute like two agreeing owners' result: it names the
            // deviant owner only if the recompute agrees (a referee
            // colluding with the lying owner is convicted instead).
            if self.audit_seed.is_some() {
                let sided = m.owners.iter().find(|(_, h)| *h == hash).map(|(p, _)| *p);
                let hold = RefereeHold { referee: owners[0].0, sided, deviants: m.deviants.clone() };
                self.hold_referee(k, generation, hash, hold, out);
                return true;
            }
        }
        if owners.iter().all(|(_, h)| *h == owners[0].1) {
            match self.pair_of(k).filter(|p| self.audit_seed.is_some() && !self.cleared.contains(p)) {
                Some(_) => {
                    // The pair's audit is asked for once its audited
                    // partition is held (`ask_audits`, below).
                    self.held.insert(k, Verdict { partition: k, generation, hash, writer: owners[0].0 });
                }
                None => self.accept(k, generation, hash, owners[0].0, out),
            }
            return true;
        }
        self.mismatches.push(Mismatch {
            epoch: self.plan.epoch,
            stage: self.plan.stage,
            partition: k,
            generation,
            owners,
            deviants: Vec::new(),
        });
        match self.plan.referee_for(ku, self.referee_seed) {
            Some(referee) => {
                self.plan = self.plan.with_referee(ku, referee);
                self.plan_revision += 1;
                self.reports[ku].clear();
                out.push(MergeOut::Plan);
            }
            // No participant is left to referee (R = 2). With audits on,
            // the validators' recompute tells which owner is right.
            None if self.audit_seed.is_some() => self.hold_dispute(k, generation, out),
            // Nobody else can tell which owner is right: keep this slice's
            // previous weights for this epoch.
            None => self.accept(k, generation, KEEP_PREVIOUS, part.owners[0], out),
        }
        true
    }

    /// Records the contributions an owner reported for partition `k`;
    /// returns the participants whose report contradicts an earlier one
    /// (each with its proof recorded). Senders outside the plan are
    /// skipped; a participant appears once per partition.
    fn compare_contributions(&mut self, k: u32, contributions: &[SignedContribution]) -> Vec<PeerId> {
        let ku = k as usize;
        if self.contributions.len() != self.plan.partitions.len() {
            self.contributions.resize(self.plan.partitions.len(), BTreeMap::new());
        }
        let mut liars = Vec::new();
        for c in contributions {
            if !self.plan.is_participant(&c.sender) || liars.contains(&c.sender) {
                continue;
            }
            match self.contributions[ku].get(&c.sender) {
                None => {
                    self.contributions[ku].insert(c.sender, (c.payload_hash, c.header.clone()));
                }
                Some((h, _)) if *h == c.payload_hash => {}
                Some((_, first)) => {
                    self.equivocations.push(Equivocation {
                        epoch: self.plan.epoch,
                        stage: self.plan.stage,
                        partition: k,
                        sender: c.sender,
                        headers: [first.clone(), c.header.clone()],
                    });
                    liars.push(c.sender);
                }
            }
        }
        liars
    }

    fn accept(&mut self, k: u32, generation: u32, hash: [u8; 32], writer: PeerId, out: &mut Vec<MergeOut>) {
        let v = Verdict { partition: k, generation, hash, writer };
        self.verdicts[k as usize] = Some(v.clone());
        out.push(MergeOut::Verdict(v));
    }

    /// A participant finished with these merged weights.
    pub fn merge_done(&mut self, peer: PeerId, weights_hash: [u8; 32]) -> bool {
        if !self.plan.is_participant(&peer) || self.verdicts.iter().any(|v| v.is_none()) {
            return false;
        }
        self.done.insert(peer, weights_hash);
        true
    }

    /// A reader found what `bad` stored for partition `k` not to match its
    /// announcement: if `bad` is that partition's writer, the writing moves
    /// to a participant that holds the accepted slice (an owner that
    /// reported the accepted hash, else one that finished its merge, which
    /// applied every verdict), never back to a writer found bad. Returns
    /// the new writer; `None` if `bad` is not the writer or nobody else
    /// holds the slice (the stage then completes on its timeout). `lacking`
    /// (the reader, which read the store because it lacks the slice) is
    /// not asked.
    pub fn move_writer(&mut self, k: u32, bad: PeerId, lacking: &[PeerId], out: &mut Vec<MergeOut>) -> Option<PeerId> {
        let ku = k as usize;
        let v = self.verdicts.get(ku)?.as_ref()?;
        if v.writer != bad {
            return None;
        }
        let spurned = self.spurned.entry(k).or_default();
        if !spurned.contains(&bad) {
            spurned.push(bad);
        }
        let owners_with_it =
            self.plan.partitions[ku].owners.iter().filter(|o| self.reports[ku].get(*o) == Some(&v.hash)).copied();
        let finished = self.plan.participants.iter().map(|p| p.peer).filter(|p| self.done.contains_key(p));
        let next = owners_with_it.chain(finished).find(|p| !spurned.contains(p) && !lacking.contains(p))?;
        let mut v = v.clone();
        v.writer = next;
        self.verdicts[ku] = Some(v.clone());
        out.push(MergeOut::Verdict(v));
        Some(next)
    }

    /// Participants that went silent: partitions still open are re-planned
    /// without them; accepted ones whose writer is gone get a new writer.
    pub fn drop_participants(&mut self, gone: &[PeerId], out: &mut Vec<MergeOut>) {
        let gone: Vec<PeerId> = gone.iter().copied().filter(|p| self.plan.is_participant(p)).collect();
        if gone.is_empty() {
            return;
        }
        let mut next = self.plan.without(&gone);
        for k in 0..self.plan.partitions.len() {
            match &mut self.verdicts[k] {
                // Settled: owners and generation stay (minus the gone, who
                // did their part); only the writer may have to move.
                Some(v) => {
                    let mut keep = self.plan.partitions[k].clone();
                    keep.owners.retain(|o| !gone.contains(o));
                    if gone.contains(&v.writer) {
                        let fallback = next.participants.first().map(|p| p.peer);
                        v.writer = keep.owners.first().copied().or(fallback).unwrap_or(v.writer);
                        out.push(MergeOut::Verdict(v.clone()));
                    }
                    if keep.owners.is_empty() {
                        keep.owners.push(v.writer);
                    }
                    next.partitions[k] = keep;
                }
                None => {
                    self.reports[k].clear();
                    if let Some(m) = self.missing.get_mut(k) {
                        m.clear();
                    }
                    self.missing_since.retain(|(p, _), _| *p as usize != k);
                    self.held.remove(&(k as u32));
                    self.disputed.remove(&(k as u32));
                    self.flag_held.remove(&(k as u32));
                    self.referee_held.remove(&(k as u32));
                }
            }
        }
        self.plan = next;
        self.plan_revision += 1;
        for p in &gone {
            self.done.remove(p);
        }
        out.push(MergeOut::Plan);
    }
}

#[path = "audit_draw.rs"]
mod audit_draw;
#[path = "flagged.rs"]
mod flagged;
#[path = "referee.rs"]
mod referee;
#[path = "stored_contribution.rs"]
mod stored_contribution;
#[path = "withheld.rs"]
mod withheld;
pub use withheld::WithheldClaim;

#[cfg(test)]
#[path = "stage_tests.rs"]
mod tests;
