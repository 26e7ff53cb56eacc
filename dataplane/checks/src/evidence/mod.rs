//! A validator's check of one sampled forward: the evidence a miner
//! uploads for it, checked link by link before anything is recomputed.
//!
//! 1. The output frame is signed by the miner, is an activation of the
//!    sampled micro-batch attempt (at the tail: the gradient it sent back),
//!    and is well formed for the run.
//! 2. Its input is what it answers: the head's output answers the hash of
//!    the micro-batch's tokens; another stage's output answers the
//!    `frame_id` of the activation frame its upstream neighbour signed for
//!    the same micro-batch attempt.
//! 3. The weights it was computed with are ones the miner committed to in
//!    that epoch: the weights the epoch started from, or one of the
//!    states after an inner step, whose hash list chains to the head the
//!    miner reported (`iota_core::commitment`).
//! 4. Recomputed on those weights and that input, the output is the same
//!    (byte for byte on the same backend, within `tolerance` otherwise);
//!    at the tail, so is the mean loss it reported ([`check_tail`]).
//!
//! A middle stage's backward ([`check_backward`]) adds, on top of links 1
//! to 3 of its forward:
//!
//! 5. The gradient frame it received is signed by its downstream neighbour
//!    on the pathway, is the sampled attempt's gradient, and answers the
//!    miner's output frame (the activation it is the gradient of).
//! 6. The gradient frame it sent upstream is signed by the miner, is the
//!    sampled attempt's gradient, and answers the input frame (likewise).
//! 7. The weights its backward ran on are ones it committed to (an inner
//!    step may come between an attempt's forward and its backward: the
//!    forward's saved activations then meet the stepped weights).
//! 8. Recomputed from the input, the forward's weights, the backward's
//!    weights and the received gradient, the sent gradient is the same.
//!
//! A head's forward ([`check_head_answer`]) adds link 5 on its own: the
//! gradient frame its downstream neighbour sent back for the attempt,
//! signed by that neighbour and answering the head's output frame. It is
//! what binds the output a head uploads to the one its neighbour received:
//! without it a head could send cheap or garbage activations and sign an
//! honest frame afterwards for the few attempts drawn (a middle stage's
//! output is bound the same way by link 5 of its backward, a tail's by
//! its upstream neighbour's record of the gradient, `lanes`).
//!
//! A link that fails is the miner's doing: it signed the output and chose
//! what to upload. Evidence is hostile input: everything is bounded and
//! nothing panics.

use iota_core::commitment::{Chain, EpochHeads};
use iota_core::wire::{Direction, FrameHeader};
use iota_core::{PeerId, WireCodec};
use iota_model::Backend;

use crate::frame::{RunContext, decode_frame};
use crate::hashes::{tokens_hash, weights_hash};
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

/// What a middle stage uploads for its backward of a sampled attempt.
#[derive(Clone, Copy, Debug)]
pub struct BackwardEvidence<'a> {
    /// Its forward of the attempt (whose input the backward starts from).
    pub forward: ForwardEvidence<'a>,
    /// The whole gradient frame it received from downstream.
    pub received_grad: &'a [u8],
    /// The whole gradient frame it sent upstream.
    pub sent_grad: &'a [u8],
    /// The weights its backward ran on (the forward's unless an inner step
    /// came between the two).
    pub weights: &'a [f32],
}

/// What the validator knows without the miner.
pub struct Known<'a> {
    pub ctx: &'a RunContext,
    pub miner: PeerId,
    pub stage: u32,
    /// The upstream neighbour on the sampled micro-batch's pathway.
    pub upstream: Option<PeerId>,
    /// The downstream neighbour on it (None at the tail).
    pub downstream: Option<PeerId>,
    /// The micro-batch's tokens (head stage).
    pub tokens: Option<&'a [u32]>,
    /// The miner's commitment heads for the epoch, as the orchestrator
    /// recorded them from its `UploadDone`.
    pub committed: &'a EpochHeads,
    /// The hashes of the weights the epoch may have started from: the
    /// merged weights as the merge's participants reported them (the
    /// orchestrator's record) and, where the validator loaded the merge
    /// itself, as it computed them from the stored slices, so that one
    /// participant reporting a false hash cannot make its honest replicas'
    /// starting weights look uncommitted.
    pub epoch_starts: &'a [[u8; 32]],
    pub codec: WireCodec,
    /// 0: byte for byte (same backend).
    pub tolerance: f64,
}

/// The relative difference an honest miner on another backend may show
/// against the CPU reference's recompute: of a payload, the relative L2 of
/// what its values differ by beyond the codec's rounding
/// (`Comparison::rel_l2_beyond_rounding`); of a reported loss, the
/// relative difference. A miner whose device label is not the validator's
/// is judged within it (`Known::tolerance`), one on the same kind byte for
/// byte.
///
/// Calibrated on the CPU with GEMM operands rounded to bf16 (the arithmetic
/// of `--gemm bf16` on a GPU; `CpuBackend::with_bf16_gemm`): an honest
/// `tiny` 3-stage model's payloads differed by at most 2.0e-4 beyond the
/// int8 rounding (6.1e-3 in all) and its losses by 2.4e-5, after 4 and 20
/// training steps; 10%-RMS noise on an activation differs by 0.083 beyond
/// it, zeros by 0.99 (the integration test
/// `validation::cross_backend::an_honest_bf16_miner_is_within_the_cross_backend_tolerance_and_cheats_are_not`
/// measures both and keeps 4x of margin on the honest side, 3x on the
/// cheats'). On an H100 (`iota-miner selftest --device cuda`, 2026-11-27)
/// a bf16 stage's outputs and gradients differ from fp32 by at most
/// 2.8e-3 element by element before any rounding, so a real GPU's honest
/// difference is bounded well inside this too.
pub const CROSS_BACKEND_TOLERANCE: f64 = 0.01;

/// A check's result.
#[derive(Clone, Debug, PartialEq)]
pub enum Finding {
    Honest,
    /// The miner's evidence contradicts itself or the recompute: why.
    Cheated(String),
}

/// Runs checks 1 to 4 of the module text on a head or middle stage's
/// activation.
pub fn check_forward<B: Backend>(r: &Recompute<B>, k: &Known, mb: SampledMb, ev: ForwardEvidence) -> Finding {
    let run = || -> Result<(), String> {
        let l = links(k, mb, ev, Direction::Activation)?;
        let honest =
            r.forward(k.stage, ev.weights, l.input, mb.samples as usize).map_err(|e| format!("recompute: {e:#}"))?;
        same_payload(k, &l.out, l.out_payload, &honest, "recomputed output")
    };
    match run() {
        Ok(()) => Finding::Honest,
        Err(why) => Finding::Cheated(why),
    }
}

/// What the tail claimed for a micro-batch besides its gradient frame.
#[derive(Clone, Copy, Debug)]
pub struct TailClaim<'a> {
    /// The micro-batch's targets (from the corpus, as the tail reads them).
    pub targets: &'a [u32],
    /// The mean loss it reported (`LossReport.loss`).
    pub reported_loss: f32,
}

/// The tail's checks: links 1 to 3 on the gradient frame it sent back
/// (which answers the activation it received), then the recompute of its
/// losses and gradient: the gradient payload must be the recomputed one
/// and the reported mean loss the recomputed mean (bit for bit on the same
/// backend; within `tolerance`, relative, otherwise).
pub fn check_tail<B: Backend>(
    r: &Recompute<B>,
    k: &Known,
    mb: SampledMb,
    ev: ForwardEvidence,
    claim: TailClaim,
) -> Finding {
    let run = || -> Result<(), String> {
        let l = links(k, mb, ev, Direction::ActivationGrad)?;
        let t = r
            .tail(k.stage, ev.weights, l.input, claim.targets, mb.samples as usize)
            .map_err(|e| format!("recompute: {e:#}"))?;
        let mean = (t.losses.iter().map(|&x| f64::from(x)).sum::<f64>() / t.losses.len().max(1) as f64) as f32;
        let loss_ok = if k.tolerance == 0.0 {
            mean.to_bits() == claim.reported_loss.to_bits()
        } else {
            f64::from((claim.reported_loss - mean).abs()) <= k.tolerance * f64::from(mean.abs()).max(1e-12)
        };
        if !loss_ok {
            return Err(format!("reported loss {} differs from the recomputed {mean}", claim.reported_loss));
        }
        let honest = t.grad.ok_or("the tail of a one-stage model sends no gradient")?;
        same_payload(k, &l.out, l.out_payload, &honest, "recomputed gradient")
    };
    match run() {
        Ok(()) => Finding::Honest,
        Err(why) => Finding::Cheated(why),
    }
}

/// A middle stage's backward of a sampled attempt: links 1 to 3 of its
/// forward, then links 5 to 8 of the module text. The forward's output is
/// judged by [`check_forward`]; a validator runs both.
pub fn check_backward<B: Backend>(r: &Recompute<B>, k: &Known, mb: SampledMb, ev: BackwardEvidence) -> Finding {
    let run = || -> Result<(), String> {
        let l = links(k, mb, ev.forward, Direction::Activation)?;
        let (Some(inp), Some(down)) = (l.input_header.as_ref(), k.downstream) else {
            return Err("only a middle stage's backward is checked (the head sends no gradient upstream)".into());
        };
        // 5. The gradient it received, from downstream, for its output.
        let (_, got_payload) = answered(k, mb, &l.out, down, ev.received_grad)?;
        // 6. The gradient it sent, for its input.
        let (sent, sent_payload) = gradient_answering(k, mb, ev.sent_grad, k.miner, inp, ("sent", "input"))?;
        // 7. Committed weights for the backward too.
        if !committed(k, ev.forward.step_hashes, ev.weights) {
            return Err("the backward's weights are not ones it committed to".into());
        }
        // 8. The recompute.
        let honest = r
            .backward_after(k.stage, ev.forward.weights, ev.weights, l.input, got_payload, mb.samples as usize)
            .map_err(|e| format!("recompute: {e:#}"))?
            .ok_or("the stage sends no gradient upstream")?;
        same_payload(k, &sent, sent_payload, &honest, "recomputed upstream gradient")
    };
    match run() {
        Ok(()) => Finding::Honest,
        Err(why) => Finding::Cheated(why),
    }
}

/// Link 5 of a head's forward (module text): `received_grad`, the whole
/// gradient frame it received for the sampled attempt, is signed by its
/// downstream neighbour on the pathway and answers its output frame. The
/// forward itself is judged by [`check_forward`]; a validator runs both.
pub fn check_head_answer(k: &Known, mb: SampledMb, ev: ForwardEvidence, received_grad: &[u8]) -> Finding {
    let run = || -> Result<(), String> {
        if k.stage != 0 || ev.input_frame.is_some() {
            return Err("only a head's forward is answered this way".into());
        }
        let down = k.downstream.ok_or("a head with no downstream neighbour is the whole model: it sends nothing")?;
        let (out, _) = decode_frame(ev.output_frame, k.ctx, k.miner).map_err(|e| format!("output frame: {e}"))?;
        if out.direction != Direction::Activation || !same_mb(&out, mb) {
            return Err("the output frame is not the sampled micro-batch's Activation frame".into());
        }
        answered(k, mb, &out, down, received_grad).map(|_| ())
    };
    match run() {
        Ok(()) => Finding::Honest,
        Err(why) => Finding::Cheated(why),
    }
}

/// Link 5: `received_grad` is the gradient `down` signed for the sampled
/// attempt, in the run's codec and `out`'s shape, answering `out`. Its
/// header and payload.
fn answered<'a>(
    k: &Known,
    mb: SampledMb,
    out: &FrameHeader,
    down: PeerId,
    received_grad: &'a [u8],
) -> Result<(FrameHeader, &'a [u8]), String> {
    gradient_answering(k, mb, received_grad, down, out, ("received", "output"))
}

/// Links 5 and 6: `frame` is a gradient `signer` signed for the sampled
/// attempt, in the run's codec and the shape of `of`, the frame it
/// answers. `(side, what)` name them in the reasons ("received",
/// "output"; "sent", "input").
fn gradient_answering<'a>(
    k: &Known,
    mb: SampledMb,
    frame: &'a [u8],
    signer: PeerId,
    of: &FrameHeader,
    (side, what): (&str, &str),
) -> Result<(FrameHeader, &'a [u8]), String> {
    let (g, payload) = decode_frame(frame, k.ctx, signer).map_err(|e| format!("{side} gradient frame: {e}"))?;
    if g.direction != Direction::ActivationGrad || !same_mb(&g, mb) {
        return Err(format!("the {side} gradient frame is not the sampled micro-batch's gradient"));
    }
    if g.codec != k.codec.id() || g.dims() != of.dims() {
        return Err(format!("the {side} gradient frame is not in the run's codec and the {what}'s shape"));
    }
    if g.answers != of.frame_id() {
        return Err(format!("the {side} gradient does not answer the {what} frame"));
    }
    Ok((g, payload))
}

/// What links 1 to 3 establish: the output and its payload, and the
/// input to recompute from.
struct Linked<'a> {
    out: FrameHeader,
    out_payload: &'a [u8],
    input: ForwardInput<'a>,
    /// The input frame's header (None at the head).
    input_header: Option<FrameHeader>,
}

/// Whether a frame is of the sampled micro-batch attempt.
fn same_mb(h: &FrameHeader, mb: SampledMb) -> bool {
    u64::from(h.epoch) == mb.epoch
        && h.shard == mb.shard
        && h.first_sample == mb.first_sample
        && h.samples == mb.samples
        && h.attempt == mb.attempt
}

/// Whether `weights` are a state the miner committed to: the epoch's start
/// or one of its step hashes (which chain to its committed head).
fn committed(k: &Known, step_hashes: &[[u8; 32]], weights: &[f32]) -> bool {
    let w = weights_hash(weights);
    k.epoch_starts.contains(&w) || step_hashes.contains(&w)
}

/// Checks 1 to 3: the output frame (of `direction`) signed by the miner
/// for the sampled attempt, what it answers, and committed weights.
fn links<'a>(k: &'a Known, mb: SampledMb, ev: ForwardEvidence<'a>, direction: Direction) -> Result<Linked<'a>, String> {
    // 1. The output, signed by the miner.
    let (out, out_payload) = decode_frame(ev.output_frame, k.ctx, k.miner).map_err(|e| format!("output frame: {e}"))?;
    if out.direction != direction || !same_mb(&out, mb) {
        return Err(format!("the output frame is not the sampled micro-batch's {direction:?} frame"));
    }
    if out.codec != k.codec.id() {
        return Err("the output frame is not in the run's codec".into());
    }
    // 2. What it answers.
    let mut input_header = None;
    let input = match (k.tokens, ev.input_frame, k.upstream) {
        (Some(tokens), None, _) if direction == Direction::Activation => {
            if out.answers != tokens_hash(tokens) {
                return Err("the output does not answer the micro-batch's tokens".into());
            }
            ForwardInput::Tokens(tokens)
        }
        (None, Some(frame), Some(up)) => {
            let (inp, payload) = decode_frame(frame, k.ctx, up).map_err(|e| format!("input frame: {e}"))?;
            if inp.direction != Direction::Activation || !same_mb(&inp, mb) {
                return Err("the input frame is not the sampled micro-batch's activation".into());
            }
            if out.answers != inp.frame_id() {
                return Err("the output does not answer the input frame".into());
            }
            input_header = Some(inp);
            ForwardInput::Wire(payload)
        }
        _ => return Err("the evidence does not match the stage (tokens for the head, a frame otherwise)".into()),
    };
    // 3. Committed weights.
    if Chain::of(ev.step_hashes) != k.committed.weights {
        return Err("the step hashes do not chain to the committed weights head".into());
    }
    if !committed(k, ev.step_hashes, ev.weights) {
        return Err("the weights are not ones it committed to".into());
    }
    Ok(Linked { out, out_payload, input, input_header })
}

/// Check 4's (and 8's) comparison: the claimed payload, sent under
/// header `h`, against the recomputed one.
fn same_payload(k: &Known, h: &FrameHeader, payload: &[u8], honest: &[u8], what: &str) -> Result<(), String> {
    let dims = h.dims();
    let (Some(&rows), Some(&cols), 2) = (dims.first(), dims.get(1), dims.len()) else {
        return Err(format!("the frame compared with the {what} is not a matrix"));
    };
    let (rows, cols) = (rows as usize, cols as usize);
    let c = compare(k.codec, rows, cols, payload, honest).map_err(|e| format!("comparison: {e:#}"))?;
    if !c.passes(k.tolerance) {
        return Err(format!(
            "{what} differs: max |d| {:.3e}, relative L2 {:.3e} ({:.3e} beyond the codec's rounding)",
            c.max_abs, c.rel_l2, c.rel_l2_beyond_rounding
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
