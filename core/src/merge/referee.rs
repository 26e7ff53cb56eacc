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
//! Without audits (no validators) the referee's side is applied and
//! nobody is named.

use super::{MergeOut, RefereeHold, StageMerge, Verdict};
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
                if !hold.deviants.is_empty() {
                    out.push(MergeOut::Deviant(hold.deviants.clone()));
                    self.drop_participants(&hold.deviants, out);
                }
            }
            None => {
                self.audited.released += 1;
                self.accept(v.partition, v.generation, v.hash, v.writer, out);
            }
        }
        true
    }
}
