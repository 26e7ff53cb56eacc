//! The replay of shown inner steps: what a validator knows of the miner
//! ([`StepKnown`]), and the steps recomputed in turn from a shown state
//! ([`Replay`]), plain or traced (`step_trace`).

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

use super::record::{MbFrames, RECENT, StepEvidence, StepHeader, StepMb, optimizer_hash};
use crate::frame::{RunContext, decode_frame};
use crate::hashes::weights_hash;

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

/// A replay of consecutive inner steps.
pub(super) struct Replay<'a, B: Backend> {
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
    pub(super) fn start(
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
    pub(super) fn step(&mut self, j: u32, h: &StepHeader, frames: &[&MbFrames], last: bool) -> Result<()> {
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
