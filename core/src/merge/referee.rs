//! A disputed partition's referee: drawn with the orchestrator's secret,
//! and, with audits on, its result checked by a validator's recompute
//! before it is applied or names anybody.
//!
//! Two owners disagree; a third participant (the referee) reduces the
//! partition again. Its result matching one owner's names the other
//! deviant, but on the referee's word alone that is one participant's
//! word against another's: a referee colluding with a lying owner would
//! frame the honest one. So the result is held, the validators recompute
//! the partition, and then:
//! - the recompute matches: the result is applied and the deviant owner
//!   is proven wrong (`MergeOut::Deviant`: planned out, convicted);
//! - it differs: the referee and the owner it sided with agreed on a
//!   wrong result (`MergeOut::Colluded`: both planned out, convicted);
//! - no answer in time: the result is applied and nobody is named.
//!
//! Without audits (no validators) the referee's side is applied and
//! nobody is named.
//!
//! With two replicas there is no third participant to referee: with
//! audits on, the dispute itself is held for the validators' recompute
//! (`hold_dispute`), which names the owner that is wrong; without, the
//! slice keeps its previous weights.

use super::{KEEP_PREVIOUS, MergeOut, RefereeHold, StageMerge, Verdict};
use crate::identity::PeerId;

impl StageMerge {
    /// Draws the referees of this merge's disputes with `seed` (the
    /// orchestrator's secret; 0 until set).
    pub fn draw_referees_with(&mut self, seed: u64) {
        self.referee_seed = seed;
    }

    /// Holds referee `hold.referee`'s result for partition `k` and asks for
    /// its audit.
    pub(super) fn hold_referee(
        &mut self,
        k: u32,
        generation: u32,
        hash: [u8; 32],
        hold: RefereeHold,
        out: &mut Vec<MergeOut>,
    ) {
        self.held.insert(k, Verdict { partition: k, generation, hash, writer: hold.referee });
        self.referee_held.insert(k, hold);
        self.ask_audit_once(k, generation, out);
    }

    /// Asks for the audit of partition `k`'s `generation`, once.
    fn ask_audit_once(&mut self, k: u32, generation: u32, out: &mut Vec<MergeOut>) {
        if self.audit_asked.insert((k, generation)) {
            out.push(MergeOut::Audit { partition: k, generation });
        }
    }

    /// The validators' recompute of a referee's partition (None: nobody
    /// answered in time, or they could not recompute).
    pub(super) fn referee_audit_result(
        &mut self,
        k: u32,
        generation: u32,
        recomputed: Option<[u8; 32]>,
        out: &mut Vec<MergeOut>,
    ) -> bool {
        let Some(v) = self.held.get(&k).filter(|v| v.generation == generation).cloned() else { return false };
        let Some(hold) = self.referee_held.remove(&k) else { return false };
        self.held.remove(&k);
        match recomputed {
            Some(h) if h != v.hash => {
                self.audited.failed += 1;
                let wrong: Vec<PeerId> = std::iter::once(hold.referee).chain(hold.sided).collect();
                self.colluded.push((k, wrong.clone()));
                out.push(MergeOut::Colluded(wrong.clone()));
                // The partition is reduced again without them.
                self.drop_participants(&wrong, out);
            }
            Some(_) => {
                self.audited.passed += 1;
                self.accept(v.partition, v.generation, v.hash, v.writer, out);
                // Named once: one already planned out (by another of its
                // disputes) is not convicted again.
                let deviants: Vec<PeerId> =
                    hold.deviants.iter().copied().filter(|d| self.plan.is_participant(d)).collect();
                if !deviants.is_empty() {
                    out.push(MergeOut::Deviant(deviants.clone()));
                    self.drop_participants(&deviants, out);
                }
            }
            None => {
                self.audited.released += 1;
                self.accept(v.partition, v.generation, v.hash, v.writer, out);
            }
        }
        true
    }

    /// Holds a dispute no referee can settle (R = 2: no third participant)
    /// for the validators' recompute, and asks for it.
    pub(super) fn hold_dispute(&mut self, k: u32, generation: u32, out: &mut Vec<MergeOut>) {
        let owners = self
            .mismatches
            .iter()
            .rev()
            .find(|m| m.partition == k && m.generation == generation)
            .map(|m| m.owners.clone())
            .unwrap_or_default();
        self.disputed.insert(k, (generation, owners));
        self.ask_audit_once(k, generation, out);
    }

    /// The validators' recompute of a dispute held by `hold_dispute`. The
    /// owner whose hash it matches is right: its result is applied, and
    /// the other is proven wrong (`MergeOut::Deviant`: planned out,
    /// convicted; its other disputes in this merge are settled with it).
    /// No owner matching, or no answer: the slice keeps its previous
    /// weights and nobody is named.
    pub(super) fn dispute_audit_result(
        &mut self,
        k: u32,
        generation: u32,
        recomputed: Option<[u8; 32]>,
        out: &mut Vec<MergeOut>,
    ) -> bool {
        let Some((g, owners)) = self.disputed.get(&k).cloned() else { return false };
        if g != generation {
            return false;
        }
        self.disputed.remove(&k);
        let first = owners.first().map(|(p, _)| *p);
        let right = recomputed.and_then(|h| owners.iter().find(|(_, x)| *x == h).map(|(p, _)| (*p, h)));
        let Some((writer, h)) = right else {
            self.audited.released += 1;
            if let Some(w) = first.or_else(|| self.plan.participants.first().map(|p| p.peer)) {
                self.accept(k, generation, KEEP_PREVIOUS, w, out);
            }
            // If it was its owner pair's audited partition, the audit
            // passes on to another they agreed on.
            self.ask_audits(out);
            return true;
        };
        self.audited.passed += 1;
        self.accept(k, generation, h, writer, out);
        let wrong: Vec<PeerId> =
            owners.iter().filter(|(_, x)| *x != h).map(|(p, _)| *p).filter(|p| self.plan.is_participant(p)).collect();
        if wrong.is_empty() {
            return true;
        }
        // Every open dispute of this merge that a proven-wrong owner was in
        // names it: a later single owner's result there is no referee's.
        for m in self.mismatches.iter_mut().filter(|m| m.epoch == self.plan.epoch && m.deviants.is_empty()) {
            if m.owners.iter().any(|(p, _)| wrong.contains(p)) {
                m.deviants = wrong.iter().copied().filter(|w| m.owners.iter().any(|(p, _)| p == w)).collect();
            }
        }
        out.push(MergeOut::Deviant(wrong.clone()));
        self.drop_participants(&wrong, out);
        true
    }
}
