//! A failed inner-step recompute narrowed to one segment of one
//! micro-batch, as a proof anyone can re-check at that segment's cost
//! (issue 55, Deliver 3; Gensyn's Verde bisects a dispute the same way).
//!
//! The miner's trace of a micro-batch (`iota_model::MbTrace`: per segment
//! of its stage, the hash of the output, of the input's gradient and of
//! the gradients accumulated over the segment's parameters) and the
//! validator's own trace of the same work agree up to the first value one
//! of them computed otherwise ([`first_disagreement`], in the order the
//! values were made: the micro-batches in turn, each forward segment by
//! segment, then its backward last segment first). Everything that enters
//! that segment is a value both traces agree on, so the validator shows
//! those values ([`SegmentProof`]): the segment's input, the gradient of
//! its output (a backward dispute), its weights against the committed
//! weights the micro-batch's forward ran on, and its gradients before the
//! micro-batch. A referee checks that every shown value hashes to the
//! miner's own trace ([`SegmentProof::bind`]) and recomputes that one
//! segment ([`SegmentProof::recheck`]); the proof holds when the miner's
//! claimed hashes are not what the segment gives.
//!
//! What is not here yet: the miner's trace signed and carried in its step
//! object, the proof in a verdict, and the orchestrator's and `ledger
//! verify`'s re-check; a dispute in the optimizer step itself (the traces
//! agree and the weights after do not), narrowed to a tensor.

// Hostile proofs: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use iota_core::{ModelConfig, ParamLayout, StageSpec};
use iota_model::{Backend, MbEnd, MbTrace, Stage, StageInput};

use crate::hashes::{WeightsWitness, tokens_hash, weights_hash};

/// Where two traces of one step first part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disputed {
    /// The micro-batch, in the step's order.
    pub mb: usize,
    pub segment: usize,
    /// In the segment's backward (its input's gradient or its
    /// parameters' gradients), not its forward.
    pub backward: bool,
}

/// The first place where `theirs` (the miner's traces of a step's
/// micro-batches) and `ours` (the validator's of the same work) differ;
/// `None` when they agree throughout. A trace not shaped as `ours` is an
/// error (it is not a trace of this stage's micro-batches).
pub fn first_disagreement(theirs: &[MbTrace], ours: &[MbTrace]) -> Result<Option<Disputed>> {
    ensure!(theirs.len() == ours.len(), "a trace of {} micro-batches, the step has {}", theirs.len(), ours.len());
    for (mb, (t, o)) in theirs.iter().zip(ours).enumerate() {
        let n = o.outputs.len();
        ensure!(
            t.outputs.len() == n && t.input_grads.len() == n && t.grads.len() == n,
            "micro-batch {mb}: a trace not of this stage's {n} segments"
        );
        if let Some(segment) = (0..n).find(|&k| t.outputs.get(k) != o.outputs.get(k)) {
            return Ok(Some(Disputed { mb, segment, backward: false }));
        }
        let differs = |k: &usize| t.input_grads.get(*k) != o.input_grads.get(*k) || t.grads.get(*k) != o.grads.get(*k);
        if let Some(segment) = (0..n).rev().find(differs) {
            return Ok(Some(Disputed { mb, segment, backward: true }));
        }
    }
    Ok(None)
}

/// What enters the disputed segment.
#[derive(Clone, Debug, PartialEq)]
pub enum ProofInput {
    /// A head's tokens (its embedding).
    Tokens(Vec<u32>),
    /// The output of the segment before it, or the stage's input.
    Values(Vec<f32>),
}

/// What its backward starts from.
#[derive(Clone, Debug, PartialEq)]
pub enum ProofEnd {
    /// A forward dispute of a segment that is not the LM head.
    None,
    /// The gradient of the segment's output.
    Grad(Vec<f32>),
    /// The LM head's targets and its loss scale.
    Targets { targets: Vec<u32>, loss_scale: f32 },
}

/// The miner's hashes at the disputed point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claimed {
    pub output: [u8; 32],
    pub input_grad: [u8; 32],
    pub grads: [u8; 32],
}

/// One segment of one micro-batch shown with everything its recompute
/// reads (the module text).
#[derive(Clone, Debug, PartialEq)]
pub struct SegmentProof {
    pub at: Disputed,
    pub samples: u32,
    pub seq: u32,
    pub input: ProofInput,
    pub end: ProofEnd,
    /// The weights the micro-batch's forward ran on, covering the segment.
    pub weights: WeightsWitness,
    /// The segment's gradients before the micro-batch (a backward dispute;
    /// empty otherwise).
    pub grads_before: Vec<f32>,
    pub claimed: Claimed,
}

/// The hash a segment's input is bound by: the trace's output hash of the
/// segment before it, or, for the first, the stage's input as the caller
/// knows it (the corpus's tokens, the received frame's values).
pub fn input_hash(input: &ProofInput) -> [u8; 32] {
    match input {
        ProofInput::Tokens(t) => tokens_hash(t),
        ProofInput::Values(v) => weights_hash(v),
    }
}

/// The hash a backward's start is bound by: the trace's input gradient
/// hash of the segment after it, or, for the last, the received gradient
/// frame's values or the corpus's targets with the run's loss scale.
pub fn end_hash(end: &ProofEnd) -> [u8; 32] {
    match end {
        ProofEnd::None => [0; 32],
        ProofEnd::Grad(g) => weights_hash(g),
        ProofEnd::Targets { targets, loss_scale } => {
            let mut h = blake3::Hasher::new();
            h.update(b"iota-rs targets v1");
            h.update(&tokens_hash(targets));
            h.update(&loss_scale.to_le_bytes());
            *h.finalize().as_bytes()
        }
    }
}

/// What the referee knows beside the miner's traces: the hashes of what
/// enters the stage from outside it, and the committed weights the
/// micro-batch's forward ran on.
pub struct Edges {
    pub stage_input: [u8; 32],
    pub stage_end: [u8; 32],
    pub forward_weights: [u8; 32],
}

impl SegmentProof {
    /// Builds the proof of `at` from the validator's own stage (the
    /// weights the micro-batch's forward ran on in place, and its
    /// gradients as the step's micro-batches before this one left them),
    /// re-running the micro-batch's segments up to the disputed one.
    pub fn build<B: Backend>(
        st: &mut Stage<B>,
        input: StageInput,
        end: MbEnd,
        (samples, seq): (u32, u32),
        at: Disputed,
        theirs: &MbTrace,
    ) -> Result<SegmentProof> {
        let segs = st.segments();
        let seg = segs.get(at.segment).context("no such segment")?.clone();
        let last = segs.len().checked_sub(1).context("a stage without segments")?;
        let (b, s) = (samples as usize, seq as usize);
        // The forward, segment by segment, keeping what enters each (the
        // LM head, last, is never run here: nothing follows it).
        let mut inputs = vec![match input {
            StageInput::Tokens(t) => ProofInput::Tokens(t.to_vec()),
            StageInput::Hidden(h) => ProofInput::Values(h.to_vec()),
        }];
        let upto = if at.backward { last } else { at.segment };
        for k in 0..upto {
            let x = inputs.get(k).context("segment input")?;
            let out = st.segment_run(k, as_input(x), None, b, s)?;
            inputs.push(ProofInput::Values(out.output));
        }
        let grads_before = st.grads_host().get(seg.params.clone()).context("segment gradients")?.to_vec();
        let end = match (at.backward, end) {
            (false, MbEnd::Targets { targets, loss_scale }) if at.segment == last => {
                ProofEnd::Targets { targets: targets.to_vec(), loss_scale }
            }
            (false, _) => ProofEnd::None,
            (true, end) => backward_to(st, &inputs, end, at.segment, (b, s))?,
        };
        let input = inputs.get(at.segment).context("segment input")?.clone();
        let pick = |v: &Vec<[u8; 32]>| v.get(at.segment).copied().context("the miner's trace is short");
        let claimed = Claimed {
            output: pick(&theirs.outputs)?,
            input_grad: pick(&theirs.input_grads)?,
            grads: pick(&theirs.grads)?,
        };
        Ok(SegmentProof {
            at,
            samples,
            seq,
            input,
            end,
            weights: WeightsWitness::of(&st.params_host(), seg.params),
            grads_before: if at.backward { grads_before } else { Vec::new() },
            claimed,
        })
    }

    /// Checks that every value shown is one the miner's own traces commit
    /// to: the claimed hashes are its trace's at the point, the input is
    /// what its segment before gave (or the stage's input), the backward's
    /// start what its segment after gave (or the stage's end), the
    /// gradients before what its previous micro-batch left (or none, for
    /// the step's first). The weights are checked by `recheck`.
    pub fn bind(&self, theirs: &MbTrace, previous: Option<&MbTrace>, edges: &Edges) -> Result<()> {
        let k = self.at.segment;
        let pick = |v: &Vec<[u8; 32]>, i: usize| v.get(i).copied().context("the miner's trace is short");
        let claimed = Claimed {
            output: pick(&theirs.outputs, k)?,
            input_grad: pick(&theirs.input_grads, k)?,
            grads: pick(&theirs.grads, k)?,
        };
        ensure!(claimed == self.claimed, "the claimed hashes are not the miner's trace's");
        let want_input = match k.checked_sub(1) {
            Some(before) => pick(&theirs.outputs, before)?,
            None => edges.stage_input,
        };
        ensure!(input_hash(&self.input) == want_input, "the segment's input is not the one the miner's trace names");
        let last = theirs.outputs.len().checked_sub(1).context("an empty trace")?;
        match (&self.end, self.at.backward) {
            // A forward dispute of the LM head without targets fails its
            // recheck.
            (ProofEnd::None, false) => {}
            (ProofEnd::Targets { .. }, _) => {
                ensure!(k == last && end_hash(&self.end) == edges.stage_end, "targets not the stage's")
            }
            (ProofEnd::Grad(_), true) => {
                let want = match k.checked_add(1).filter(|n| *n <= last) {
                    Some(after) => pick(&theirs.input_grads, after)?,
                    None => edges.stage_end,
                };
                ensure!(end_hash(&self.end) == want, "the output gradient is not the one the miner's trace names");
            }
            _ => bail!("a proof whose end does not fit its dispute"),
        }
        if self.at.backward {
            let before = match previous {
                Some(p) => pick(&p.grads, k)?,
                None => weights_hash(&vec![0.0; self.grads_before.len()]),
            };
            ensure!(weights_hash(&self.grads_before) == before, "the gradients before are not the miner's");
        }
        // The weights are checked against `edges.forward_weights` where
        // `recheck` reads them (it knows the segment's range).
        Ok(())
    }

    /// Recomputes the segment from what the proof shows (after `bind`):
    /// `Ok(true)` when the miner's claimed hashes are not what it gives
    /// (the proof holds), `Ok(false)` when they are (it does not). Costs
    /// one segment's forward and backward, on a stage whose other weights
    /// are zeros.
    pub fn recheck<B: Backend>(
        &self,
        be: &Arc<B>,
        model: &ModelConfig,
        spec: &StageSpec,
        forward_weights: &[u8; 32],
    ) -> Result<bool> {
        let layout = ParamLayout::for_stage(model, spec);
        let n = layout.total();
        ensure!(self.weights.n == n as u64, "weights of {} values, the stage has {n}", self.weights.n);
        let mut params = vec![0.0f32; n];
        let mut st = Stage::with_params(be.clone(), model, spec.clone(), &params)?;
        let seg = st.segments().get(self.at.segment).context("no such segment")?.clone();
        let range = (seg.params.start as u64)..(seg.params.end as u64);
        let shown = self.weights.range(forward_weights, range).map_err(anyhow::Error::msg)?;
        params.get_mut(seg.params.clone()).context("segment range")?.copy_from_slice(shown);
        st.set_params(&params)?;
        if self.at.backward {
            ensure!(self.grads_before.len() == seg.params.len(), "gradients before of another length");
            let mut grads = vec![0.0f32; n];
            grads.get_mut(seg.params.clone()).context("segment range")?.copy_from_slice(&self.grads_before);
            st.set_grads(&grads)?;
        }
        let end = match &self.end {
            ProofEnd::None => None,
            ProofEnd::Grad(g) => Some(MbEnd::Grad(g)),
            ProofEnd::Targets { targets, loss_scale } => Some(MbEnd::Targets { targets, loss_scale: *loss_scale }),
        };
        let out =
            st.segment_run(self.at.segment, as_input(&self.input), end, self.samples as usize, self.seq as usize)?;
        if !self.at.backward {
            return Ok(weights_hash(&out.output) != self.claimed.output);
        }
        let din = weights_hash(&out.din.unwrap_or_default());
        let grads = weights_hash(st.grads_host().get(seg.params).context("segment range")?);
        Ok(din != self.claimed.input_grad || grads != self.claimed.grads)
    }
}

fn as_input(x: &ProofInput) -> StageInput<'_> {
    match x {
        ProofInput::Tokens(t) => StageInput::Tokens(t),
        ProofInput::Values(v) => StageInput::Hidden(v),
    }
}

/// The gradient of segment `k`'s output: the backward from the stage's
/// end through the segments after `k` (whose gradients it accumulates;
/// `k`'s own are untouched).
fn backward_to<B: Backend>(
    st: &mut Stage<B>,
    inputs: &[ProofInput],
    end: MbEnd,
    k: usize,
    (b, s): (usize, usize),
) -> Result<ProofEnd> {
    let last = inputs.len().checked_sub(1).context("no segments")?;
    let mut dout = match end {
        MbEnd::Targets { targets, loss_scale } if k == last => {
            return Ok(ProofEnd::Targets { targets: targets.to_vec(), loss_scale });
        }
        MbEnd::Targets { targets, loss_scale } => {
            let x = inputs.get(last).context("segment input")?;
            let out = st.segment_run(last, as_input(x), Some(MbEnd::Targets { targets, loss_scale }), b, s)?;
            out.din.context("the LM head gave no gradient")?
        }
        MbEnd::Grad(g) if k == last => return Ok(ProofEnd::Grad(g.to_vec())),
        MbEnd::Grad(g) => {
            let x = inputs.get(last).context("segment input")?;
            let out = st.segment_run(last, as_input(x), Some(MbEnd::Grad(g)), b, s)?;
            out.din.context("no gradient")?
        }
    };
    for j in (k.saturating_add(1)..last).rev() {
        let x = inputs.get(j).context("segment input")?;
        let out = st.segment_run(j, as_input(x), Some(MbEnd::Grad(&dout)), b, s)?;
        dout = out.din.context("no gradient")?;
    }
    Ok(ProofEnd::Grad(dout))
}

#[cfg(test)]
mod tests;
