//! A validator's check of one sampled forward: the evidence a miner
//! uploads for it, checked link by link before anything is recomputed.
//!
//! 1. The output frame is signed by the miner, is an activation of the
//!    sampled micro-batch attempt, and is well formed for the run.
//! 2. Its input is what it answers: the head's output answers the hash of
//!    the micro-batch's tokens; another stage's output answers the
//!    `frame_id` of the activation frame its upstream neighbour signed for
//!    the same micro-batch attempt.
//! 3. The weights it was computed with are ones the miner committed to in
//!    that epoch: the weights the epoch started from, or one of the
//!    states after an inner step, whose hash list chains to the head the
//!    miner reported (`iota_core::commitment`).
//! 4. Recomputed on those weights and that input, the output is the same
//!    (byte for byte on the same backend, within `tolerance` otherwise).
//!
//! A link that fails is the miner's doing: it signed the output and chose
//! what to upload. Evidence is hostile input: everything is bounded and
//! nothing panics.

use iota_core::commitment::{Chain, EpochHeads};
use iota_core::wire::Direction;
use iota_core::{PeerId, WireCodec};
use iota_model::Backend;

use crate::frame::{RunContext, decode_frame};
use crate::miner::worker::{tokens_hash, weights_hash};
use crate::recompute::{ForwardInput, Recompute, compare};

/// The micro-batch attempt a sample names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampledMb {
    pub epoch: u64,
    pub shard: u32,
    pub first_sample: u64,
    pub samples: u32,
    pub attempt: u32,
}

/// What a miner uploads for a sampled forward.
#[derive(Clone, Copy, Debug)]
pub struct ForwardEvidence<'a> {
    /// The whole activation frame it received (absent for the head stage).
    pub input_frame: Option<&'a [u8]>,
    /// The whole activation frame it sent.
    pub output_frame: &'a [u8],
    /// The stage weights it computed with.
    pub weights: &'a [f32],
    /// The hashes of its weights after each inner step of the epoch, in
    /// order (the items of its weights chain).
    pub step_hashes: &'a [[u8; 32]],
}

/// What the validator knows without the miner.
pub struct Known<'a> {
    pub ctx: &'a RunContext,
    pub miner: PeerId,
    pub stage: u32,
    /// The upstream neighbour on the sampled micro-batch's pathway.
    pub upstream: Option<PeerId>,
    /// The micro-batch's tokens (head stage).
    pub tokens: Option<&'a [u32]>,
    /// The miner's commitment heads for the epoch, as the orchestrator
    /// recorded them from its `UploadDone`.
    pub committed: &'a EpochHeads,
    /// The hash of the merged weights the epoch started from.
    pub epoch_start: [u8; 32],
    pub codec: WireCodec,
    /// 0: byte for byte (same backend).
    pub tolerance: f64,
}

/// A check's result.
#[derive(Clone, Debug, PartialEq)]
pub enum Finding {
    Honest,
    /// The miner's evidence contradicts itself or the recompute: why.
    Cheated(String),
}

/// Runs checks 1 to 4 of the module text.
pub fn check_forward<B: Backend>(r: &Recompute<B>, k: &Known, mb: SampledMb, ev: ForwardEvidence) -> Finding {
    match check(r, k, mb, ev) {
        Ok(()) => Finding::Honest,
        Err(why) => Finding::Cheated(why),
    }
}

fn check<B: Backend>(r: &Recompute<B>, k: &Known, mb: SampledMb, ev: ForwardEvidence) -> Result<(), String> {
    // 1. The output, signed by the miner.
    let (out, out_payload) = decode_frame(ev.output_frame, k.ctx, k.miner).map_err(|e| format!("output frame: {e}"))?;
    let same_mb = |h: &iota_core::wire::FrameHeader| {
        u64::from(h.epoch) == mb.epoch
            && h.shard == mb.shard
            && h.first_sample == mb.first_sample
            && h.samples == mb.samples
            && h.attempt == mb.attempt
    };
    if out.direction != Direction::Activation || !same_mb(&out) {
        return Err("the output frame is not the sampled micro-batch's activation".into());
    }
    if out.codec != k.codec.id() {
        return Err("the output frame is not in the run's codec".into());
    }
    // 2. What it answers.
    let input = match (k.tokens, ev.input_frame, k.upstream) {
        (Some(tokens), None, _) => {
            if out.answers != tokens_hash(tokens) {
                return Err("the output does not answer the micro-batch's tokens".into());
            }
            ForwardInput::Tokens(tokens)
        }
        (None, Some(frame), Some(up)) => {
            let (inp, payload) = decode_frame(frame, k.ctx, up).map_err(|e| format!("input frame: {e}"))?;
            if inp.direction != Direction::Activation || !same_mb(&inp) {
                return Err("the input frame is not the sampled micro-batch's activation".into());
            }
            if out.answers != inp.frame_id() {
                return Err("the output does not answer the input frame".into());
            }
            ForwardInput::Wire(payload)
        }
        _ => return Err("the evidence does not match the stage (tokens for the head, a frame otherwise)".into()),
    };
    // 3. Committed weights.
    if Chain::of(ev.step_hashes) != k.committed.weights {
        return Err("the step hashes do not chain to the committed weights head".into());
    }
    let w = weights_hash(ev.weights);
    if w != k.epoch_start && !ev.step_hashes.contains(&w) {
        return Err("the weights are not ones it committed to".into());
    }
    // 4. The recompute.
    let honest = r.forward(k.stage, ev.weights, input, mb.samples as usize).map_err(|e| format!("recompute: {e:#}"))?;
    let dims = out.dims();
    let (Some(&rows), Some(&cols), 2) = (dims.first(), dims.get(1), dims.len()) else {
        return Err("the output frame is not a matrix".into());
    };
    let (rows, cols) = (rows as usize, cols as usize);
    let c = compare(k.codec, rows, cols, out_payload, &honest).map_err(|e| format!("comparison: {e:#}"))?;
    if !c.passes(k.tolerance) {
        return Err(format!("recomputed output differs: max |d| {:.3e}, relative L2 {:.3e}", c.max_abs, c.rel_l2));
    }
    Ok(())
}
