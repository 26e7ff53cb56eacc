//! One inner step traced (`StepTrace`), what the miner shows of a step a
//! validator's recompute failed, and the disputes in its optimizer step
//! narrowed to one segment's squared norm or one leaf of the weights
//! after (issue 55, Deliver 3).
//!
//! A trace holds, beside the micro-batches' traces (`proof`), what the
//! optimizer step read and wrote: the counter and the roots of AdamW's m
//! and v before it, each segment's squared gradient norm (the clipping
//! norm is summed from them, `iota_model::optim::grad_norm`), and the leaf
//! hashes of the weights, m and v after it. It binds to the step's signed
//! record ([`StepTrace::bind`]): the roots before make the record's
//! optimizer state before, the leaves after its weights and state after.
//! So once the micro-batches' traces agree (both parties hold the same
//! accumulated gradients), a validator whose step gives other weights
//! finds a segment whose claimed squared norm is not its gradients' (a
//! [`NormProof`]: the segment's gradients, bound to the last
//! micro-batch's trace), or a leaf after the step that is not what the
//! optimizer gives (a [`LeafProof`]: the leaf's values before, its
//! moments and gradients, each against the miner's own roots, widened to
//! the whole matrix where Muon updates it). Each is re-checked at one
//! segment's cost.

// Hostile traces: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use std::ops::Range;

use anyhow::{Context, Result, ensure};
use iota_core::{ParamLayout, StageSpec};
use iota_model::optim::{AdamW, AdamWConfig, UpdateAt, grad_norm, segment_sum_squares, update_entry};
use iota_model::{Backend, MbTrace, Stage, segments_of};

use super::proof::{Disputed, first_disagreement};
use super::record::{Reader, StepHeader, optimizer_hash_of_roots};
use crate::hashes::{WEIGHTS_LEAF, WeightsWitness, leaf_hash, weights_hash, weights_leaves, weights_root};

/// An inner step as the miner ran it (the module text).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTrace {
    /// The record's counter.
    pub step: u64,
    /// AdamW's counter before the step, and the roots of m and v.
    pub t_before: u64,
    pub m_before: [u8; 32],
    pub v_before: [u8; 32],
    pub mbs: Vec<MbTrace>,
    /// Per segment: the squared norm of its accumulated gradients.
    pub sum_squares: Vec<f64>,
    /// The leaf hashes (`hashes::weights_leaves`) of the weights, m and v
    /// after the step.
    pub w_after: Vec<[u8; 32]>,
    pub m_after: Vec<[u8; 32]>,
    pub v_after: Vec<[u8; 32]>,
}

/// Bounds on a trace read from the store (from the stage's shape).
#[derive(Clone, Copy, Debug)]
pub struct TraceLimits {
    pub segments: u64,
    /// Most micro-batches of a step (`grad_accum`).
    pub max_mbs: u64,
    /// The stage's weight count.
    pub weights: u64,
}

const DOMAIN: &[u8] = b"iota-rs step trace v1";

impl StepTrace {
    // Our own bytes: sizes of vectors in memory.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = DOMAIN.to_vec();
        for x in [self.step, self.t_before] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b.extend_from_slice(&self.m_before);
        b.extend_from_slice(&self.v_before);
        let segments = self.sum_squares.len();
        b.extend_from_slice(&(segments as u64).to_le_bytes());
        b.extend_from_slice(&(self.mbs.len() as u64).to_le_bytes());
        for t in &self.mbs {
            for h in t.outputs.iter().chain(&t.input_grads).chain(&t.grads) {
                b.extend_from_slice(h);
            }
        }
        self.sum_squares.iter().for_each(|x| b.extend_from_slice(&x.to_bits().to_le_bytes()));
        b.extend_from_slice(&(self.w_after.len() as u64).to_le_bytes());
        for h in self.w_after.iter().chain(&self.m_after).chain(&self.v_after) {
            b.extend_from_slice(h);
        }
        b
    }

    pub fn decode(bytes: &[u8], l: TraceLimits) -> Result<StepTrace> {
        let mut r = Reader { b: bytes, at: 0 };
        ensure!(r.take(DOMAIN.len())? == DOMAIN, "not a step trace");
        let (step, t_before) = (r.u64()?, r.u64()?);
        let (m_before, v_before) = (r.h32()?, r.h32()?);
        let segments = r.count(l.segments, 8)?;
        let per_mb = segments.checked_mul(3 * 32).context("too many segments")?;
        let n = r.count(l.max_mbs, per_mb)?;
        let mut mbs = Vec::with_capacity(n);
        for _ in 0..n {
            let mut list = || (0..segments).map(|_| r.h32()).collect::<Result<Vec<_>>>();
            mbs.push(MbTrace { outputs: list()?, input_grads: list()?, grads: list()? });
        }
        let sum_squares = (0..segments).map(|_| r.u64().map(f64::from_bits)).collect::<Result<Vec<_>>>()?;
        let leaves = r.count(l.weights.div_ceil(WEIGHTS_LEAF as u64), 3 * 32)?;
        let mut list = || (0..leaves).map(|_| r.h32()).collect::<Result<Vec<_>>>();
        let (w_after, m_after, v_after) = (list()?, list()?, list()?);
        r.done()?;
        Ok(StepTrace { step, t_before, m_before, v_before, mbs, sum_squares, w_after, m_after, v_after })
    }

    /// The gradient norm the step clipped with.
    pub fn norm(&self) -> f32 {
        grad_norm(&self.sum_squares) as f32
    }

    /// AdamW's counter after the step (a step whose norm is not finite is
    /// skipped).
    pub fn t_after(&self) -> u64 {
        if self.norm().is_finite() { self.t_before.saturating_add(1) } else { self.t_before }
    }

    /// Checks the trace is of the step `h` records for a stage of `n`
    /// weights: its counter and micro-batches, the optimizer state before
    /// (its roots), and the weights and optimizer state after (its leaves).
    pub fn bind(&self, h: &StepHeader, n: u64) -> Result<()> {
        ensure!(self.step == h.step, "a trace of step {}, the record's is {}", self.step, h.step);
        ensure!(
            self.mbs.len() == h.mbs.len(),
            "a trace of {} micro-batches, the record lists {}",
            self.mbs.len(),
            h.mbs.len()
        );
        ensure!(
            optimizer_hash_of_roots(self.t_before, &self.m_before, &self.v_before) == h.optimizer_before,
            "the trace's optimizer state before is not the record's"
        );
        ensure!(weights_root(n, &self.w_after) == h.weights_after, "the trace's weights after are not the record's");
        let (m, v) = (weights_root(n, &self.m_after), weights_root(n, &self.v_after));
        ensure!(
            optimizer_hash_of_roots(self.t_after(), &m, &v) == h.optimizer_after,
            "the trace's optimizer state after is not the record's"
        );
        Ok(())
    }

    /// The hash a miner signs its trace by, for `miner`'s step on `stage`
    /// of `epoch` in run `run_id`.
    pub fn signing_digest(&self, run_id: u64, epoch: u64, stage: u32, miner: &[u8; 32]) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(&run_id.to_le_bytes());
        h.update(&epoch.to_le_bytes());
        h.update(&stage.to_le_bytes());
        h.update(miner);
        h.update(&self.encode());
        *h.finalize().as_bytes()
    }
}

/// The values a step's optimizer read, kept by a validator that may need
/// to prove a leaf ([`BeforeOptimizer`] borrows them).
pub struct KeptBefore {
    pub weights: Vec<f32>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    pub grads: Vec<f32>,
}

impl KeptBefore {
    pub fn view(&self) -> BeforeOptimizer<'_> {
        BeforeOptimizer { weights: &self.weights, m: &self.m, v: &self.v, grads: &self.grads }
    }
}

/// The optimizer step of step `step` on `st` (its micro-batches' traces
/// `mbs` already run, its weights before in place), traced; with `keep`,
/// what it read, for proofs.
pub fn optimizer_traced<B: Backend>(
    st: &mut Stage<B>,
    opt: &mut AdamW<B>,
    (cfg, lr): (&AdamWConfig, f32),
    step: u64,
    mbs: Vec<MbTrace>,
    keep: bool,
) -> (StepTrace, Option<KeptBefore>) {
    let be = st.backend().clone();
    let (m, v) = (be.to_host(&opt.m), be.to_host(&opt.v));
    let (m_before, v_before, t_before) = (weights_hash(&m), weights_hash(&v), opt.t);
    let sum_squares = segment_sum_squares(st);
    let kept = keep.then(|| KeptBefore { weights: st.params_host(), m, v, grads: st.grads_host() });
    opt.step(st, cfg, lr);
    let trace = StepTrace {
        step,
        t_before,
        m_before,
        v_before,
        mbs,
        sum_squares,
        w_after: weights_leaves(&st.params_host()),
        m_after: weights_leaves(&be.to_host(&opt.m)),
        v_after: weights_leaves(&be.to_host(&opt.v)),
    };
    (trace, kept)
}

/// Where two traces of one step first part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepDispute {
    /// In a micro-batch (`proof::SegmentProof`).
    Mb(Disputed),
    /// A segment's squared gradient norm ([`NormProof`]).
    SumSquares(usize),
    /// A leaf of the weights, m or v after the step ([`LeafProof`]).
    Leaf(u64),
}

/// The first place `theirs` and `ours` (of the same step, from the same
/// state) part, in the order the step made its values; `None`: nowhere.
pub fn first_step_disagreement(theirs: &StepTrace, ours: &StepTrace) -> Result<Option<StepDispute>> {
    if let Some(d) = first_disagreement(&theirs.mbs, &ours.mbs)? {
        return Ok(Some(StepDispute::Mb(d)));
    }
    let segs = ours.sum_squares.len();
    ensure!(
        theirs.sum_squares.len() == segs,
        "squared norms of {} segments, the stage has {segs}",
        theirs.sum_squares.len()
    );
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (a, b) = (bits(&theirs.sum_squares), bits(&ours.sum_squares));
    if let Some(k) = (0..segs).find(|&k| a.get(k) != b.get(k)) {
        return Ok(Some(StepDispute::SumSquares(k)));
    }
    let leaves = ours.w_after.len();
    for (x, y) in [(&theirs.w_after, &ours.w_after), (&theirs.m_after, &ours.m_after), (&theirs.v_after, &ours.v_after)]
    {
        ensure!(x.len() == leaves && y.len() == leaves, "leaf lists of another length");
    }
    let differs = |l: &usize| {
        theirs.w_after.get(*l) != ours.w_after.get(*l)
            || theirs.m_after.get(*l) != ours.m_after.get(*l)
            || theirs.v_after.get(*l) != ours.v_after.get(*l)
    };
    Ok((0..leaves).find(differs).map(|l| StepDispute::Leaf(l as u64)))
}

/// What a step read, as the validator holds it before its optimizer ran:
/// the weights, AdamW's state and the accumulated gradients.
pub struct BeforeOptimizer<'a> {
    pub weights: &'a [f32],
    pub m: &'a [f32],
    pub v: &'a [f32],
    pub grads: &'a [f32],
}

/// A segment whose claimed squared gradient norm is not its gradients'.
#[derive(Clone, Debug, PartialEq)]
pub struct NormProof {
    pub segment: u32,
    /// Its accumulated gradients (bound to the last micro-batch's trace).
    pub grads: Vec<f32>,
}

impl NormProof {
    pub fn build(
        layout: &ParamLayout,
        spec: &StageSpec,
        before: &BeforeOptimizer,
        segment: usize,
    ) -> Result<NormProof> {
        let seg = segments_of(layout, spec).get(segment).context("no such segment")?.clone();
        let grads = before.grads.get(seg.params).context("gradients of another size")?.to_vec();
        Ok(NormProof { segment: u32::try_from(segment)?, grads })
    }

    /// Whether the proof holds against `theirs`: the gradients are the
    /// ones its last micro-batch's trace names for the segment, and their
    /// squared norm on `be` is not the one it claims.
    pub fn holds<B: Backend>(&self, be: &B, theirs: &StepTrace) -> Result<bool> {
        let k = self.segment as usize;
        let last = theirs.mbs.last().context("a trace of no micro-batches")?;
        let named = last.grads.get(k).context("no such segment")?;
        ensure!(weights_hash(&self.grads) == *named, "the gradients are not the ones the trace names");
        let claimed = theirs.sum_squares.get(k).context("no such segment")?;
        let got = be.sum_squares(be.all(&be.upload(&self.grads)));
        Ok(got.to_bits() != claimed.to_bits())
    }
}

/// A leaf after the step that is not what the optimizer gives: the values
/// it is computed from, over `range` (the leaf, widened to every Muon
/// matrix it touches), each against the miner's roots.
#[derive(Clone, Debug, PartialEq)]
pub struct LeafProof {
    pub leaf: u64,
    pub range: Range<u64>,
    /// Against the record's weights before, the trace's m and v before.
    pub weights: WeightsWitness,
    pub m: WeightsWitness,
    pub v: WeightsWitness,
    /// Per segment the range meets: its gradients (against the last
    /// micro-batch's trace), over the part of the range it holds.
    pub grads: Vec<(u32, WeightsWitness)>,
}

/// The values `leaf` is computed from: the leaf, widened to the whole of
/// every matrix Muon updates that it meets (`muon`: whether Muon is on).
fn leaf_range(layout: &ParamLayout, leaf: u64, muon: bool) -> Result<Range<usize>> {
    let n = layout.total();
    let from = usize::try_from(leaf)?.checked_mul(WEIGHTS_LEAF).filter(|f| *f < n).context("no such leaf")?;
    let to = from.saturating_add(WEIGHTS_LEAF).min(n);
    let (mut a, mut b) = (from, to);
    for e in &layout.entries {
        let r = e.range();
        if muon && e.takes_muon() && r.start < to && from < r.end {
            a = a.min(r.start);
            b = b.max(r.end);
        }
    }
    Ok(a..b)
}

impl LeafProof {
    pub fn build(
        layout: &ParamLayout,
        spec: &StageSpec,
        cfg: &AdamWConfig,
        before: &BeforeOptimizer,
        leaf: u64,
    ) -> Result<LeafProof> {
        let r = leaf_range(layout, leaf, cfg.muon)?;
        let mut grads = Vec::new();
        for (k, seg) in segments_of(layout, spec).into_iter().enumerate() {
            let (a, b) = (r.start.max(seg.params.start), r.end.min(seg.params.end));
            if a < b {
                let g = before.grads.get(seg.params.clone()).context("gradients of another size")?;
                let local = a.saturating_sub(seg.params.start)..b.saturating_sub(seg.params.start);
                grads.push((u32::try_from(k)?, WeightsWitness::of(g, local)));
            }
        }
        Ok(LeafProof {
            leaf,
            range: r.start as u64..r.end as u64,
            weights: WeightsWitness::of(before.weights, r.clone()),
            m: WeightsWitness::of(before.m, r.clone()),
            v: WeightsWitness::of(before.v, r),
            grads,
        })
    }

    /// Whether the proof holds against `theirs` (bound to the step's
    /// record `h` before: `StepTrace::bind`): every value shown is the
    /// miner's (its range the one the leaf needs), and the optimizer step
    /// at `lr` on them gives a leaf of the weights, m or v after other
    /// than the trace claims. Costs the leaf's update (a Muon matrix's
    /// where it is one).
    pub fn holds<B: Backend>(
        &self,
        be: &B,
        (layout, spec): (&ParamLayout, &StageSpec),
        (cfg, lr): (&AdamWConfig, f32),
        h: &StepHeader,
        theirs: &StepTrace,
    ) -> Result<bool> {
        let r = leaf_range(layout, self.leaf, cfg.muon)?;
        ensure!(self.range == (r.start as u64..r.end as u64), "the proof's range is not the one its leaf needs");
        let span = r.start as u64..r.end as u64;
        let w = self.weights.range(&h.weights_before, span.clone()).map_err(anyhow::Error::msg)?;
        let m = self.m.range(&theirs.m_before, span.clone()).map_err(anyhow::Error::msg)?;
        let v = self.v.range(&theirs.v_before, span).map_err(anyhow::Error::msg)?;
        let g = self.gradients(layout, spec, &r, theirs)?;
        let (mut w, mut m, mut v) = (be.upload(w), be.upload(m), be.upload(v));
        let g = be.upload(&g);
        let norm = theirs.norm();
        if norm.is_finite() {
            let up = UpdateAt::new(cfg, spec.index, lr, theirs.t_after(), norm);
            for e in &layout.entries {
                let er = e.range();
                let (a, b) = (er.start.max(r.start), er.end.min(r.end));
                if a < b {
                    let at = a.saturating_sub(r.start)..b.saturating_sub(r.start);
                    ensure!(update_entry(be, cfg, e, at, (&mut w, &g, &mut m, &mut v), up), "a Muon matrix in part");
                }
            }
        }
        let l = usize::try_from(self.leaf)?;
        let from = l.saturating_mul(WEIGHTS_LEAF).saturating_sub(r.start);
        let to = from.saturating_add(WEIGHTS_LEAF).min(r.len());
        let leaf_of = |buf: &B::Buf| leaf_hash(be.to_host(buf).get(from..to).unwrap_or(&[]));
        let claimed = |v: &[[u8; 32]]| v.get(l).copied().context("no such leaf");
        Ok(leaf_of(&w) != claimed(&theirs.w_after)?
            || leaf_of(&m) != claimed(&theirs.m_after)?
            || leaf_of(&v) != claimed(&theirs.v_after)?)
    }

    /// The accumulated gradients over `r`, each segment's part checked
    /// against the last micro-batch's trace.
    fn gradients(
        &self,
        layout: &ParamLayout,
        spec: &StageSpec,
        r: &Range<usize>,
        theirs: &StepTrace,
    ) -> Result<Vec<f32>> {
        let last = theirs.mbs.last().context("a trace of no micro-batches")?;
        let segs = segments_of(layout, spec);
        let mut g = vec![0.0f32; r.len()];
        let mut covered = 0usize;
        for (k, wit) in &self.grads {
            let seg = segs.get(*k as usize).context("no such segment")?;
            let named = last.grads.get(*k as usize).context("no such segment")?;
            ensure!(wit.n == seg.params.len() as u64, "segment {k}: gradients of another size");
            let (a, b) = (r.start.max(seg.params.start), r.end.min(seg.params.end));
            ensure!(a < b, "segment {k} holds none of the range");
            let local = (a.saturating_sub(seg.params.start) as u64)..(b.saturating_sub(seg.params.start) as u64);
            let vals = wit.range(named, local).map_err(anyhow::Error::msg)?;
            let dst = a.saturating_sub(r.start)..b.saturating_sub(r.start);
            g.get_mut(dst).context("range")?.copy_from_slice(vals);
            covered = covered.saturating_add(b.saturating_sub(a));
        }
        let distinct = self.grads.windows(2).all(|p| p.first().map(|x| x.0) < p.get(1).map(|x| x.0));
        ensure!(distinct && covered == r.len(), "the gradients shown do not cover the range once");
        Ok(g)
    }
}

#[cfg(test)]
mod tests;
