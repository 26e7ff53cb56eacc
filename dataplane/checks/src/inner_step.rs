//! Inner steps, committed and recomputed (PROTOCOL.md, "Inner steps").
//!
//! A miner's forward and backward frames are checked by `evidence`; what
//! changes the model is the weight gradient its backwards accumulate and
//! the optimizer step it takes with them. For every inner step a miner
//! commits a [`StepHeader`]: the step counter the learning rate is read
//! at, the micro-batch attempts whose backwards it accumulated (in the
//! order it ran them, each with the hash of the weights its forward ran
//! on), and the hashes of the weights and of the optimizer state before
//! and after. The headers are chained (`EpochHeads::steps`), led by the
//! last header of the miner's previous epoch on the stage when there is
//! one (the optimizer state the epoch carries in).
//!
//! For a drawn attempt the miner shows the step its backward went into
//! ([`StepEvidence`]), replayed from the last optimizer state it kept: a
//! miner keeps AdamW's m and v (two stage-sized snapshots) only at every
//! `validation.step_window`-th step of an epoch, so a drawn step comes
//! with the fewer than `step_window` steps before it back to such a state;
//! the validator ([`check_step`]):
//! 1. re-chains the headers to the committed head, and checks they follow
//!    each other (a step's state before is its predecessor's after; the
//!    weights may also be the epoch's merged start, which a late merge
//!    puts in place) and that each step's weights after is the weights
//!    chain's item for it;
//! 2. finds the attempt in a step, or counts it among the fewer than
//!    `grad_accum` completed attempts no step lists (the epoch's last,
//!    partial accumulation, dropped);
//! 3. recomputes each replayed step in turn (the drawn one last): every
//!    listed micro-batch's forward and backward
//!    from the frames its neighbours signed for it (or the corpus's tokens
//!    and targets), on the committed weights its forward ran on,
//!    accumulated in order, then the optimizer step from the state the
//!    step before left (the first from the shown one, whose hash is the
//!    committed one) at the committed counter; the weights and the state
//!    after must hash to the committed ones, bit for bit on the same
//!    backend (on another, only the drawn step's weights are compared,
//!    within `Known::tolerance`). Weights states the replay does not
//!    compute itself are shown ([`shown_states`]).
//!
//! So a miner that skips its weight gradients, its optimizer steps, or a
//! head's whole backward, commits to weights no recompute reaches. The
//! record of an honest step is what its worker ran, so it is reproduced
//! exactly (the CPU reference gives the same bits whatever its thread
//! count).
//!
//! Not checked here: that the optimizer state the epoch carries in is the
//! one the previous epoch's last step left (its header leads the chain and
//! is committed, so the link can be checked against the previous epoch's
//! head: not yet done).
//!
//! Everything shown is hostile: lengths are bounded before allocation,
//! and nothing panics.

// Store bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use iota_core::commitment::Chain;
use iota_core::wire::Direction;
use iota_core::{ParamLayout, PeerId, StageSpec};
use iota_model::optim::AdamW;
use iota_model::{Backend, Stage, StageInput, codec};
use iota_wire::RunConfig;

use crate::evidence::Finding;
use crate::frame::{RunContext, decode_frame};
use crate::hashes::weights_hash;

pub mod proof;
mod record;
pub mod step_trace;
use self::record::RECENT;
pub use self::record::{
    MbFrames, OptimizerState, StepEvidence, StepHeader, StepLimits, StepMb, optimizer_hash, shown_states,
};

/// A micro-batch's tokens and targets by (shard, first sample, samples).
pub type MbData<'a> = &'a dyn Fn(u32, u64, u32) -> Option<(Vec<u32>, Vec<u32>)>;

/// What the validator knows of the step's miner without it.
pub struct StepKnown<'a> {
    pub ctx: &'a RunContext,
    pub miner: PeerId,
    pub stage: u32,
    /// The committed steps chain, and the one of the epoch before (None:
    /// not held).
    pub steps: &'a Chain,
    pub previous_steps: Option<&'a Chain>,
    /// The items of its weights chain (already checked against its head).
    pub step_hashes: &'a [[u8; 32]],
    /// The weights the epoch may have started from.
    pub epoch_starts: &'a [[u8; 32]],
    /// The drawn attempt: (shard, first sample, attempt).
    pub attempt: (u32, u64, u32),
    /// The miner's completed attempts this epoch: (shard, first sample,
    /// attempt) -> the pathway (one peer per stage).
    pub completed: &'a BTreeMap<(u32, u64, u32), Vec<PeerId>>,
    /// The miners of each neighbouring stage (a frame of an attempt not
    /// among `completed` must be signed by one of them).
    pub upstream_miners: &'a [PeerId],
    pub downstream_miners: &'a [PeerId],
    /// A micro-batch's tokens and targets, from the corpus.
    pub data: MbData<'a>,
    /// 0: bit for bit (same backend).
    pub tolerance: f64,
}

/// Runs the checks of the module text on `ev`.
pub fn check_step<B: Backend>(be: &std::sync::Arc<B>, cfg: &RunConfig, k: &StepKnown, ev: &StepEvidence) -> Finding {
    let fresh = match stage_weights(cfg, k.stage) {
        Ok(n) => OptimizerState::fresh(n).hash(),
        Err(e) => return Finding::Cheated(format!("{e:#}")),
    };
    match check_chain(cfg.train.grad_accum, fresh, k, ev).and_then(|()| recompute_shown(be, cfg, k, ev)) {
        Ok(()) => Finding::Honest,
        Err(e) => Finding::Cheated(format!("{e:#}")),
    }
}

/// Links 1 and 2: the headers are the committed ones and follow each
/// other, and the attempt is in a step or among the few no step lists.
fn stage_weights(cfg: &RunConfig, stage: u32) -> Result<usize> {
    let specs = StageSpec::split(&cfg.train.model, cfg.train.stages)?;
    let spec = specs.get(stage as usize).context("no such stage")?;
    Ok(ParamLayout::for_stage(&cfg.train.model, spec).total())
}

/// `fresh`: the hash of a fresh optimizer's state for the stage (what a
/// chain that carries nothing in starts from).
fn check_chain(grad_accum: usize, fresh: [u8; 32], k: &StepKnown, ev: &StepEvidence) -> Result<()> {
    let chained = Chain::of(ev.headers.iter().map(StepHeader::hash).collect::<Vec<_>>().iter());
    ensure!(chained == *k.steps, "inner steps: the records shown are not the committed steps chain");
    let own = ev.headers.get(usize::from(ev.carried)..).context("inner steps: a carried record that is not there")?;
    ensure!(
        own.len() == k.step_hashes.len(),
        "inner steps: {} step records for {} committed weights",
        own.len(),
        k.step_hashes.len()
    );
    let mut prev = if ev.carried { ev.headers.first() } else { None };
    for (i, (h, after)) in own.iter().zip(k.step_hashes).enumerate() {
        ensure!(h.weights_after == *after, "inner step {i}: its record's weights are not the weights chain's");
        let (weights, optimizer, step) = match prev {
            Some(p) => (p.weights_after, p.optimizer_after, p.step.checked_add(1)),
            None => (h.weights_before, h.optimizer_before, Some(h.step)),
        };
        ensure!(h.optimizer_before == optimizer, "inner step {i}: an optimizer state its predecessor did not leave");
        ensure!(step == Some(h.step), "inner step {i}: counter {} after {:?}", h.step, step);
        ensure!(
            h.weights_before == weights || k.epoch_starts.contains(&h.weights_before),
            "inner step {i}: stepped from weights neither its predecessor left nor the epoch started from"
        );
        ensure!(!h.mbs.is_empty(), "inner step {i}: no micro-batches");
        prev = Some(h);
    }
    match (ev.carried, ev.headers.first()) {
        // The record carried in must be the one the epoch before ended in.
        (true, Some(c)) => {
            let mut ended = ev.carried_before;
            ended.push(&c.hash());
            ensure!(
                k.previous_steps == Some(&ended),
                "inner steps: the record carried in is not where the previous epoch's steps chain ends"
            );
        }
        (false, Some(first)) => {
            ensure!(first.optimizer_before == fresh, "inner step 0: a first step not from a fresh optimizer");
            ensure!(
                k.epoch_starts.contains(&first.weights_before),
                "inner step 0: not stepped from the weights the epoch started from"
            );
        }
        _ => {}
    }
    let (shard, first, attempt) = k.attempt;
    let listed: std::collections::HashSet<(u32, u64, u32)> =
        own.iter().flat_map(|h| h.mbs.iter().map(|m| (m.shard, m.first_sample, m.attempt))).collect();
    match ev.index {
        Some(i) => {
            let h = own.get(i as usize).context("inner steps: the attempt's step is not in the epoch")?;
            ensure!(h.lists(shard, first, attempt), "inner step {i} does not list the drawn attempt");
        }
        None => {
            ensure!(!listed.contains(&k.attempt), "the drawn attempt is in a step it did not show");
            let unlisted = k.completed.keys().filter(|a| !listed.contains(a)).count();
            let accum = grad_accum.max(1);
            ensure!(
                unlisted < accum,
                "inner steps: {unlisted} completed attempts in no step (at most {} are the last, partial \
                 accumulation)",
                accum.saturating_sub(1)
            );
        }
    }
    Ok(())
}

/// Link 3: the drawn step recomputed, replayed from the shown optimizer
/// state through every step between (each checked the same way).
fn recompute_shown<B: Backend>(
    be: &std::sync::Arc<B>,
    cfg: &RunConfig,
    k: &StepKnown,
    ev: &StepEvidence,
) -> Result<()> {
    let Some(i) = ev.index else { return Ok(()) };
    let own = ev.headers.get(usize::from(ev.carried)..).context("steps")?;
    let window = cfg.spec.validation.step_window.max(1);
    ensure!(
        ev.from <= i && i.saturating_sub(ev.from) < window,
        "inner step {i}: shown from step {}, not within the run's window of {window} steps before it",
        ev.from
    );
    let steps = own.get(ev.from as usize..=i as usize).context("inner steps: the replayed steps are not there")?;
    let mbs = steps.iter().map(|h| h.mbs.len()).fold(0usize, usize::saturating_add);
    ensure!(
        ev.frames.len() == mbs,
        "inner steps {}..={i}: frames for {} of {mbs} micro-batches",
        ev.from,
        ev.frames.len()
    );
    let first = steps.first().context("step")?;
    ensure!(
        ev.optimizer.hash() == first.optimizer_before,
        "inner step {}: the optimizer state shown is not the committed one",
        ev.from
    );
    let mut replay = Replay::start(be, cfg, k, ev, first)?;
    let mut frames = ev.frames.iter();
    for (n, h) in steps.iter().enumerate() {
        let j = ev.from.saturating_add(u32::try_from(n)?);
        let mb_frames: Vec<&MbFrames> = frames.by_ref().take(h.mbs.len()).collect();
        replay.step(j, h, &mb_frames, j == i)?;
    }
    Ok(())
}

/// A replay of consecutive inner steps.
struct Replay<'a, B: Backend> {
    cfg: &'a RunConfig,
    k: &'a StepKnown<'a>,
    /// The weights states shown, with their hashes.
    shown: Vec<([u8; 32], &'a [f32])>,
    /// The last steps' results, computed here (what they committed, on
    /// the same backend).
    recent: Vec<([u8; 32], Vec<f32>)>,
    st: Stage<B>,
    opt: AdamW<B>,
    /// Which state `st` holds.
    current: [u8; 32],
}

impl<'a, B: Backend> Replay<'a, B> {
    fn start(
        be: &std::sync::Arc<B>,
        cfg: &'a RunConfig,
        k: &'a StepKnown<'a>,
        ev: &'a StepEvidence,
        first: &StepHeader,
    ) -> Result<Self> {
        let shown: Vec<([u8; 32], &[f32])> = ev.weights.iter().map(|w| (weights_hash(w), w.as_slice())).collect();
        let specs = StageSpec::split(&cfg.train.model, cfg.train.stages)?;
        let spec = specs.get(k.stage as usize).context("no such stage")?.clone();
        let n = ParamLayout::for_stage(&cfg.train.model, &spec).total();
        let before = shown.iter().find(|(h, _)| *h == first.weights_before).map(|(_, w)| *w);
        let before = before.context("the weights state the first replayed step read is not shown")?;
        ensure!(before.len() == n && ev.optimizer.m.len() == n && ev.optimizer.v.len() == n, "inner steps: sizes");
        let mut st = Stage::with_params(be.clone(), &cfg.train.model, spec, before)?;
        st.set_weight_stashing(false);
        let opt = AdamW::<B> { m: be.upload(&ev.optimizer.m), v: be.upload(&ev.optimizer.v), t: ev.optimizer.t };
        Ok(Replay { cfg, k, shown, recent: Vec::new(), st, opt, current: first.weights_before })
    }

    /// Puts the weights state `hash` in place.
    fn load(&mut self, hash: &[u8; 32]) -> Result<()> {
        if *hash == self.current {
            return Ok(());
        }
        let shown = self.shown.iter().find(|(h, _)| h == hash).map(|(_, w)| *w);
        let state = shown.or_else(|| self.recent.iter().find(|(h, _)| h == hash).map(|(_, w)| w.as_slice()));
        self.st.set_params(state.context("a weights state the step used is not shown")?)?;
        self.current = *hash;
        Ok(())
    }

    /// Step `j` (`h`), whose micro-batches' frames are `frames`; `last`:
    /// the drawn one (whose result is compared within a tolerance where
    /// the backends differ).
    fn step(&mut self, j: u32, h: &StepHeader, frames: &[&MbFrames], last: bool) -> Result<()> {
        let k = self.k;
        ensure!(frames.len() == h.mbs.len(), "inner step {j}: frames missing");
        let committed = |x: &[u8; 32]| k.epoch_starts.contains(x) || k.step_hashes.contains(x);
        for (n, (mb, f)) in h.mbs.iter().zip(frames).enumerate() {
            ensure!(committed(&mb.weights), "inner step {j}, micro-batch {n}: forwarded on uncommitted weights");
            self.load(&mb.weights).with_context(|| format!("inner step {j}, micro-batch {n}"))?;
            accumulate(&mut self.st, self.cfg, k, mb, f).with_context(|| format!("inner step {j}, micro-batch {n}"))?;
        }
        self.load(&h.weights_before).with_context(|| format!("inner step {j}"))?;
        self.opt.step(&mut self.st, &self.cfg.train.adamw, self.cfg.train.schedule.at(h.step));
        self.st.zero_grads();
        let after = self.st.params_host();
        if k.tolerance > 0.0 {
            // Another backend: only the drawn step's weights are compared
            // (the replay carries its own, close ones, to it).
            if last {
                let want = self.shown.iter().find(|(x, _)| *x == h.weights_after).map(|(_, w)| *w);
                let rel = rel_l2(&after, want.context("the drawn step's weights are not shown")?);
                ensure!(rel <= k.tolerance, "inner step {j}: recomputed weights differ by {rel:.3e} (relative L2)");
            }
        } else {
            ensure!(
                weights_hash(&after) == h.weights_after,
                "inner step {j}: recomputed, the step reaches other weights"
            );
            let be = self.st.backend().clone();
            let state = optimizer_hash(self.opt.t, &be.to_host(&self.opt.m), &be.to_host(&self.opt.v));
            ensure!(state == h.optimizer_after, "inner step {j}: recomputed, the step leaves another optimizer state");
        }
        self.current = h.weights_after;
        if self.recent.len() >= RECENT {
            self.recent.remove(0);
        }
        self.recent.push((h.weights_after, after));
        Ok(())
    }
}

/// How far `a` is from `b`, relative to `b`.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut d, mut n) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let e = f64::from(*x) - f64::from(*y);
        d += e * e;
        n += f64::from(*y) * f64::from(*y);
    }
    (d / n.max(f64::MIN_POSITIVE)).sqrt()
}

/// A frame of `mb` in `direction`, signed by `signer`, which must be the
/// pathway's neighbour for a completed attempt (or a miner of the
/// neighbouring stage otherwise): its payload.
fn frame_payload<'a>(
    k: &StepKnown,
    mb: &StepMb,
    bytes: &'a [u8],
    signer: [u8; 32],
    direction: Direction,
) -> Result<&'a [u8]> {
    let signer = PeerId(signer);
    let key = (mb.shard, mb.first_sample, mb.attempt);
    let (neighbour_stage, pool) = match direction {
        Direction::Activation => (k.stage.checked_sub(1), k.upstream_miners),
        _ => (k.stage.checked_add(1), k.downstream_miners),
    };
    let neighbour_stage = neighbour_stage.context("no neighbour stage")?;
    match k.completed.get(&key) {
        Some(path) => ensure!(
            path.get(neighbour_stage as usize) == Some(&signer),
            "its {direction:?} frame is not signed by its pathway's neighbour"
        ),
        None => ensure!(pool.contains(&signer), "its {direction:?} frame is signed by no miner of the next stage"),
    }
    let (fh, payload) =
        decode_frame(bytes, k.ctx, signer).map_err(|e| anyhow::anyhow!("its {direction:?} frame: {e}"))?;
    ensure!(
        fh.direction == direction
            && u32::from(fh.stage) == neighbour_stage
            && (fh.shard, fh.first_sample, fh.attempt, fh.samples)
                == (mb.shard, mb.first_sample, mb.attempt, mb.samples),
        "its {direction:?} frame is not the attempt's"
    );
    Ok(payload)
}

/// One micro-batch's backward into `st`'s gradients, as its worker ran it.
fn accumulate<B: Backend>(st: &mut Stage<B>, cfg: &RunConfig, k: &StepKnown, mb: &StepMb, f: &MbFrames) -> Result<()> {
    ensure!(
        mb.samples <= cfg.spec.batch.max(1),
        "a micro-batch of {} samples, the run's hold {}",
        mb.samples,
        cfg.spec.batch
    );
    let (samples, seq) = (mb.samples as usize, cfg.train.seq);
    let rows = samples.checked_mul(seq).filter(|r| *r > 0).context("a micro-batch of no tokens")?;
    let (head, tail) = (st.spec().has_embedding(), st.spec().has_lm_head());
    let width = st.spec().boundary_width;
    let hidden = match head {
        true => None,
        false => {
            let p = frame_payload(k, mb, &f.input, f.input_signer, Direction::Activation)?;
            Some(codec::decode(cfg.train.codec, rows, width, p)?)
        }
    };
    let data = match head || tail {
        true => Some((k.data)(mb.shard, mb.first_sample, mb.samples).context("no corpus data")?),
        false => None,
    };
    let input = match (&hidden, &data) {
        (Some(h), _) => StageInput::Hidden(h),
        (None, Some((x, _))) => StageInput::Tokens(x),
        (None, None) => anyhow::bail!("no input"),
    };
    if tail {
        let (_, y) = data.as_ref().context("targets")?;
        let accum = cfg.train.grad_accum.max(1) as f32;
        st.forward_backward(input, y, samples, seq, 1.0 / accum)?;
        return Ok(());
    }
    let p = frame_payload(k, mb, &f.grad, f.grad_signer, Direction::ActivationGrad)?;
    let g = codec::decode(cfg.train.codec, rows, width, p)?;
    st.forward(0, input, samples, seq)?;
    st.backward(0, &g)?;
    Ok(())
}

#[cfg(test)]
mod tests;
