//! A stage's weight versions: the stashes that give a micro-batch's
//! backward the weights its forward ran with, weight prediction, and the
//! memory mode (activation recomputation, which also makes a head's
//! stashes lean).

use std::ops::Range;

use iota_core::ParamLayout;

use super::Stage;
use crate::backend::Backend;

/// The part of a stage's weights a lean stash keeps: all of them but a
/// head's embedding table, which the layout puts first
/// (`ParamLayout::for_stage`).
fn lean_stash_range(layout: &ParamLayout, has_embedding: bool) -> Range<usize> {
    let embedding = has_embedding.then(|| layout.range("model.embed_tokens.weight")).filter(|e| e.start == 0);
    embedding.map_or(0, |e| e.end)..layout.total()
}

impl<B: Backend> Stage<B> {
    /// Called right before the weights change in place (an optimizer
    /// step): keeps a copy of the current weights while a micro-batch
    /// forwarded with them still awaits its backward.
    pub fn before_update(&mut self) {
        if self.stash_weights && self.in_flight_at(self.version) && !self.stash.contains_key(&self.version) {
            let copy = self.stashed_part(&self.params);
            self.stash.insert(self.version, copy);
        }
        if self.predict_accum.is_some() {
            let n = self.layout.total();
            let be = &self.be;
            let copy = self.before_step.get_or_insert_with(|| be.empty(n));
            be.copy(be.all_mut(copy), be.all(&self.params));
        }
        self.version += 1;
    }

    /// A copy of the part of `weights` a stash keeps (`stash_range`).
    pub(super) fn stashed_part(&self, weights: &B::Buf) -> B::Buf {
        let mut copy = self.be.empty(self.stash_range.len());
        self.be.copy(self.be.all_mut(&mut copy), self.be.view(weights, self.stash_range.clone()));
        copy
    }

    /// Exchanges `stash_range` of the weights with a stash's contents, in
    /// place: before a stashed micro-batch's backward (the weights then
    /// hold its forward's version where the backward reads them) and after
    /// it (back to the current ones, the stash again the old version).
    /// Through a bounded buffer, so the swap adds at most `SWAP_CHUNK`
    /// values to the peak.
    pub(super) fn swap_stash(&mut self, stash: &mut B::Buf) {
        let be = &*self.be;
        let (at, n) = (self.stash_range.start, self.stash_range.len());
        let chunk = self.swap_chunk.min(n);
        if chunk == 0 {
            return;
        }
        let mut tmp = be.empty(chunk);
        for i in (0..n).step_by(chunk) {
            let len = chunk.min(n - i);
            let (w, st) = (at + i..at + i + len, i..i + len);
            be.copy(be.view_mut(&mut tmp, 0..len), be.view(&self.params, w.clone()));
            be.copy(be.view_mut(&mut self.params, w), be.view(stash, st.clone()));
            be.copy(be.view_mut(stash, st), be.view(&tmp, 0..len));
        }
    }

    /// Weight prediction on (`Some(micro-batches per optimizer step)`) or
    /// off. With it, a forward runs on the current weights extrapolated by
    /// the optimizer steps the micro-batches already in flight here will
    /// take before this one's gradient is applied (the last step's change
    /// times in-flight / accum), and its backward on the same weights:
    /// pipelining's delayed gradient is then taken near the weights it is
    /// applied to, where stashing alone takes it at the old ones (PipeDream
    /// keeps the forward's weights; XPipe and SpecTrain predict them).
    pub fn set_weight_prediction(&mut self, accum: Option<usize>) {
        self.predict_accum = accum.map(|a| a.max(1));
        if accum.is_none() {
            self.before_step = None;
        }
    }

    /// The weights a forward starting now should run on, if prediction
    /// moves them: (1 + a) w - a w_before_step, a = steps ahead.
    pub(super) fn predicted_weights(&self) -> Option<B::Buf> {
        let accum = self.predict_accum?;
        let before = self.before_step.as_ref()?;
        let ahead = self.saved.len() as f32 / accum as f32;
        if ahead == 0.0 {
            return None;
        }
        let be = &*self.be;
        let mut w = be.empty(self.layout.total());
        be.copy(be.all_mut(&mut w), be.all(before));
        be.scale(be.all_mut(&mut w), -ahead / (1.0 + ahead));
        be.add_assign(be.all_mut(&mut w), be.all(&self.params));
        be.scale(be.all_mut(&mut w), 1.0 + ahead);
        Some(w)
    }

    /// Turns weight stashing off (backward then runs with the current
    /// weights, whatever the forward ran with) or on.
    pub fn set_weight_stashing(&mut self, on: bool) {
        self.stash_weights = on;
        if !on {
            self.stash.clear();
        }
    }

    /// Activation recomputation: a forward keeps only each block's input
    /// residual, and the backward runs each block's forward again before
    /// its backward. A held micro-batch then takes one residual per block
    /// instead of every activation (the attention probabilities above all),
    /// for about a third more compute. Same weights, same backend: the
    /// same gradient bits, so it is a miner's own choice, not the run's.
    /// Applies to micro-batches forwarded after the call.
    ///
    /// A recomputing head also leaves its embedding table out of weight
    /// stashes (the memory mode: the stash is then swapped into the
    /// weights' buffer by copies, where a whole one just takes its place).
    /// Call it before the first forward: with stashes held, their extent
    /// stays as it is.
    pub fn set_recompute(&mut self, on: bool) {
        self.recompute = on;
        if self.stash.is_empty() {
            self.stash_range =
                if on { lean_stash_range(&self.layout, self.spec.has_embedding()) } else { 0..self.layout.total() };
        }
    }

    /// Whether stashes hold the whole weights (and take their place).
    pub(super) fn whole_stash(&self) -> bool {
        self.stash_range.len() == self.layout.total()
    }

    pub fn recompute(&self) -> bool {
        self.recompute
    }

    /// Weight versions kept for micro-batches in flight.
    pub fn stashed_versions(&self) -> usize {
        self.stash.len()
    }

    /// A micro-batch in flight was forwarded on the weights of `version`
    /// (not on predicted ones, which it keeps itself).
    pub(super) fn in_flight_at(&self, version: u64) -> bool {
        self.saved.values().any(|s| s.version == version && s.weights.is_none())
    }

    /// Drops stashed weights no micro-batch in flight needs any more.
    pub(super) fn prune_stash(&mut self) {
        if !self.stash.is_empty() {
            let live: std::collections::HashSet<u64> =
                self.saved.values().filter(|s| s.weights.is_none()).map(|s| s.version).collect();
            self.stash.retain(|v, _| live.contains(v));
        }
    }
}

#[cfg(test)]
mod stash_tests {
    use super::super::*;
    use crate::CpuBackend;

    /// A head stage's stash leaves the embedding out and is swapped in and
    /// out in chunks (7 values here, so many, the last one short): the
    /// stashed micro-batch's backward runs on its forward's weights, and
    /// afterwards the stage holds its current weights, bit for bit.
    #[test]
    fn a_partial_stash_swaps_in_chunks_and_back() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let spec = StageSpec::split(&cfg, 2).unwrap().remove(0);
        let be = Arc::new(CpuBackend::new());
        let mut st = Stage::new(be.clone(), &cfg, spec.clone(), 3);
        st.set_recompute(true);
        st.swap_chunk = 7;
        let embedding = cfg.vocab_size * cfg.d_model;
        assert_eq!(st.stash_range, embedding..st.layout.total());
        let tokens = |salt: u32| -> Vec<u32> { (0..32).map(|i| (i * 31 + salt) % 256).collect() };
        let dout: Vec<f32> = (0..32 * spec.boundary_width).map(|i| (i as f32 * 0.61).sin() * 1e-2).collect();
        let w0 = st.params_host();
        st.forward(1, StageInput::Tokens(&tokens(1)), 2, 16).unwrap();
        // A step, as the optimizer makes one: every weight moves.
        st.before_update();
        be.scale(be.all_mut(st.params_mut()), 0.9);
        assert_eq!(st.stashed_versions(), 1);
        assert_eq!(be.len(st.stash.values().next().unwrap()), st.layout.total() - embedding, "no embedding kept");
        let w1 = st.params_host();
        st.forward(2, StageInput::Tokens(&tokens(2)), 2, 16).unwrap();
        st.zero_grads();
        st.backward(1, &dout).unwrap();
        assert!(st.params_host() == w1, "the current weights are back");
        let mut at_w0 = Stage::with_params(be.clone(), &cfg, spec, &w0).unwrap();
        at_w0.forward(1, StageInput::Tokens(&tokens(1)), 2, 16).unwrap();
        at_w0.backward(1, &dout).unwrap();
        assert!(st.grads_host() == at_w0.grads_host(), "the backward ran on the forward's weights");
        assert_eq!(st.stashed_versions(), 0);
    }
}
