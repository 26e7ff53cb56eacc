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
use iota_model::{Backend, MbEnd, Stage, StageInput, codec};
use iota_wire::RunConfig;

use super::record::{MbFrames, RECENT, StepEvidence, StepHeader, StepMb, optimizer_hash};
use super::step_trace::{KeptBefore, StepTrace, optimizer_traced};
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

/// A step whose recompute on the same backend is not what the miner
/// committed (the failure a signed trace turns into a proof).
#[derive(Debug)]
pub(super) struct Differs {
    pub(super) step: u32,
    what: &'static str,
}

impl std::fmt::Display for Differs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "inner step {}: recomputed, the step {}", self.step, self.what)
    }
}

impl std::error::Error for Differs {}

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
            if weights_hash(&after) != h.weights_after {
                return Err(Differs { step: j, what: "reaches other weights" }.into());
            }
            let be = self.st.backend().clone();
            let state = optimizer_hash(self.opt.t, &be.to_host(&self.opt.m), &be.to_host(&self.opt.v));
            if state != h.optimizer_after {
                return Err(Differs { step: j, what: "leaves another optimizer state" }.into());
            }
        }
        self.current = h.weights_after;
        if self.recent.len() >= RECENT {
            self.recent.remove(0);
        }
        self.recent.push((h.weights_after, after));
        Ok(())
    }

    /// Step `j` (`h`) from the state before it (which the replay holds:
    /// the steps before it passed), traced, with what its optimizer read;
    /// nothing is compared. The replay then holds the state after it.
    pub(super) fn step_traced(
        &mut self,
        j: u32,
        h: &StepHeader,
        frames: &[&MbFrames],
    ) -> Result<(StepTrace, KeptBefore)> {
        ensure!(frames.len() == h.mbs.len(), "inner step {j}: frames missing");
        let mut traces = Vec::with_capacity(h.mbs.len());
        for (n, (mb, f)) in h.mbs.iter().zip(frames).enumerate() {
            self.load(&mb.weights).with_context(|| format!("inner step {j}, micro-batch {n}"))?;
            let x = MbInputs::of(self.st.spec(), self.cfg, self.k, mb, f)?;
            let t = self.st.traced_mb(x.input()?, x.end()?, x.samples, x.seq, &weights_hash)?;
            traces.push(t.trace);
        }
        self.load(&h.weights_before).with_context(|| format!("inner step {j}"))?;
        let lr = self.cfg.train.schedule.at(h.step);
        let adamw = &self.cfg.train.adamw;
        let (trace, kept) = optimizer_traced(&mut self.st, &mut self.opt, (adamw, lr), h.step, traces, true);
        self.st.zero_grads();
        self.current = weights_hash(&self.st.params_host());
        Ok((trace, kept.context("what the optimizer read")?))
    }

    /// Puts in place the state micro-batch `n` of step `h` ran in (the
    /// gradients of the step's micro-batches before it, its forward
    /// weights) and returns its inputs. Only the micro-batches are run:
    /// the optimizer state is not touched.
    pub(super) fn before_mb(&mut self, h: &StepHeader, frames: &[&MbFrames], n: usize) -> Result<MbInputs> {
        self.st.zero_grads();
        for (mb, f) in h.mbs.iter().zip(frames).take(n) {
            self.load(&mb.weights)?;
            accumulate(&mut self.st, self.cfg, self.k, mb, f)?;
        }
        let mb = h.mbs.get(n).context("no such micro-batch")?;
        let f = frames.get(n).context("no such micro-batch")?;
        self.load(&mb.weights)?;
        MbInputs::of(self.st.spec(), self.cfg, self.k, mb, f)
    }

    /// The stage the replay runs on.
    pub(super) fn stage_mut(&mut self) -> &mut Stage<B> {
        &mut self.st
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

/// A micro-batch's inputs as its worker had them: the activations it
/// received (not at the head), the corpus's tokens and targets (head and
/// tail), the gradient it received (not at the tail).
pub(super) struct MbInputs {
    pub(super) hidden: Option<Vec<f32>>,
    pub(super) data: Option<(Vec<u32>, Vec<u32>)>,
    pub(super) grad: Option<Vec<f32>>,
    pub(super) samples: usize,
    pub(super) seq: usize,
    /// A tail's loss scale (`1 / grad_accum`, as the worker runs it).
    pub(super) loss_scale: f32,
}

impl MbInputs {
    /// What the stage `spec` takes in for this micro-batch, from the frames
    /// `f` its neighbours signed for `mb` and the corpus.
    pub(super) fn of(spec: &StageSpec, cfg: &RunConfig, k: &StepKnown, mb: &StepMb, f: &MbFrames) -> Result<Self> {
        ensure!(
            mb.samples <= cfg.spec.batch.max(1),
            "a micro-batch of {} samples, the run's hold {}",
            mb.samples,
            cfg.spec.batch
        );
        let (samples, seq) = (mb.samples as usize, cfg.train.seq);
        let rows = samples.checked_mul(seq).filter(|r| *r > 0).context("a micro-batch of no tokens")?;
        let (head, tail) = (spec.has_embedding(), spec.has_lm_head());
        let width = spec.boundary_width;
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
        let grad = match tail {
            true => None,
            false => {
                let p = frame_payload(k, mb, &f.grad, f.grad_signer, Direction::ActivationGrad)?;
                Some(codec::decode(cfg.train.codec, rows, width, p)?)
            }
        };
        let loss_scale = 1.0 / cfg.train.grad_accum.max(1) as f32;
        Ok(MbInputs { hidden, data, grad, samples, seq, loss_scale })
    }

    pub(super) fn input(&self) -> Result<StageInput<'_>> {
        Ok(match (&self.hidden, &self.data) {
            (Some(h), _) => StageInput::Hidden(h),
            (None, Some((x, _))) => StageInput::Tokens(x),
            (None, None) => anyhow::bail!("no input"),
        })
    }

    pub(super) fn end(&self) -> Result<MbEnd<'_>> {
        Ok(match (&self.grad, &self.data) {
            (Some(g), _) => MbEnd::Grad(g),
            (None, Some((_, y))) => MbEnd::Targets { targets: y, loss_scale: self.loss_scale },
            (None, None) => anyhow::bail!("no gradient and no targets"),
        })
    }
}

/// One micro-batch's backward into `st`'s gradients, as its worker ran it.
fn accumulate<B: Backend>(st: &mut Stage<B>, cfg: &RunConfig, k: &StepKnown, mb: &StepMb, f: &MbFrames) -> Result<()> {
    let x = MbInputs::of(st.spec(), cfg, k, mb, f)?;
    match x.end()? {
        MbEnd::Targets { targets, loss_scale } => {
            st.forward_backward(x.input()?, targets, x.samples, x.seq, loss_scale)?;
        }
        MbEnd::Grad(g) => {
            st.forward(0, x.input()?, x.samples, x.seq)?;
            st.backward(0, g)?;
        }
    }
    Ok(())
}
