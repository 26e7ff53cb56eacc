//! Recomputing a miner's sampled work, as a validator does (issue 13).
//!
//! Given the weights a miner committed to and the inputs it was sent, this
//! computes what an honest miner of that stage sends: its forward payload,
//! the gradient payload of a backward, the tail's per-token losses. The
//! arithmetic is the worker's own (`Stage` on the run's backend, the run's
//! wire codec); the CPU reference gives the same bits whatever its thread
//! count, so on the same backend an honest miner's payload is reproduced
//! byte for byte. [`compare`] measures how far a claimed payload is from
//! the recomputed one, for tolerances across backends.
//!
//! Inputs here are a miner's uploads: shapes and lengths are checked, and
//! nothing panics on them.

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use iota_core::{ParamLayout, StageSpec};
use iota_model::{Backend, Stage, StageInput, codec};
use iota_wire::RunConfig;

/// What enters a recomputed stage.
#[derive(Clone, Copy, Debug)]
pub enum ForwardInput<'a> {
    /// The micro-batch's token ids (head stage).
    Tokens(&'a [u32]),
    /// The payload of the activation frame it was sent (other stages).
    Wire(&'a [u8]),
}

/// Recomputes stages of one run.
pub struct Recompute<B: Backend> {
    be: Arc<B>,
    cfg: RunConfig,
    specs: Vec<StageSpec>,
}

/// The stage's input: the decoded wire payload, or the head's tokens.
fn stage_input<'a>(hidden: &'a Option<Vec<f32>>, input: ForwardInput<'a>) -> Result<StageInput<'a>> {
    Ok(match (hidden, input) {
        (Some(h), _) => StageInput::Hidden(h),
        (None, ForwardInput::Tokens(t)) => StageInput::Tokens(t),
        (None, ForwardInput::Wire(_)) => bail!("no input"),
    })
}

/// What a tail stage computes for a micro-batch.
#[derive(Clone, Debug, PartialEq)]
pub struct TailWork {
    pub losses: Vec<f32>,
    /// The payload of the gradient frame it sends back (None if the tail is
    /// the whole model).
    pub grad: Option<Vec<u8>>,
}

impl<B: Backend> Recompute<B> {
    pub fn new(be: Arc<B>, cfg: RunConfig) -> Result<Self> {
        let specs = StageSpec::split(&cfg.train.model, cfg.train.stages)?;
        Ok(Recompute { be, cfg, specs })
    }

    fn stage(&self, stage: u32, weights: &[f32]) -> Result<Stage<B>> {
        let spec = self.specs.get(stage as usize).with_context(|| format!("the run has no stage {stage}"))?;
        let want = ParamLayout::for_stage(&self.cfg.train.model, spec).total();
        ensure!(weights.len() == want, "stage {stage} has {want} weights, not {}", weights.len());
        let mut st = Stage::with_params(self.be.clone(), &self.cfg.train.model, spec.clone(), weights)?;
        // `backward_after` sets the weights a backward claims to have run
        // on between the forward and the backward: it must use them.
        st.set_weight_stashing(false);
        Ok(st)
    }

    fn rows(&self, samples: usize) -> Result<usize> {
        samples.checked_mul(self.cfg.train.seq).filter(|r| *r > 0).context("a micro-batch of no tokens")
    }

    fn hidden(&self, st: &Stage<B>, input: ForwardInput, rows: usize) -> Result<Option<Vec<f32>>> {
        Ok(match input {
            ForwardInput::Tokens(t) => {
                ensure!(st.spec().has_embedding(), "only the head stage takes tokens");
                ensure!(t.len() == rows, "{} tokens for {rows} positions", t.len());
                None
            }
            ForwardInput::Wire(bytes) => {
                ensure!(!st.spec().has_embedding(), "the head stage takes tokens");
                Some(codec::decode(self.cfg.train.codec, rows, st.spec().boundary_width, bytes)?)
            }
        })
    }

    /// The activation payload an honest miner of `stage` (not the tail)
    /// holding `weights` sends on for `input`, a micro-batch of `samples`.
    pub fn forward(&self, stage: u32, weights: &[f32], input: ForwardInput, samples: usize) -> Result<Vec<u8>> {
        let mut st = self.stage(stage, weights)?;
        ensure!(!st.spec().has_lm_head(), "the tail stage sends no activations");
        let rows = self.rows(samples)?;
        let hidden = self.hidden(&st, input, rows)?;
        let x = stage_input(&hidden, input)?;
        let out = st.forward(0, x, samples, self.cfg.train.seq)?;
        let width = st.boundary_width();
        Ok(codec::encode(self.cfg.train.codec, rows, width, &out)?)
    }

    /// The gradient payload an honest miner of a middle stage sends back
    /// for a micro-batch whose activation input was `input` and whose
    /// output gradient came in as `dout` (a wire payload); `None` for the
    /// head stage (which sends no gradient).
    pub fn backward(
        &self,
        stage: u32,
        weights: &[f32],
        input: ForwardInput,
        dout: &[u8],
        samples: usize,
    ) -> Result<Option<Vec<u8>>> {
        self.backward_after(stage, weights, weights, input, dout, samples)
    }

    /// `backward` as a miner computes it when an inner step came between
    /// the micro-batch's forward and its backward: the forward ran on
    /// `forward_weights` (its saved activations are those), the backward
    /// on `backward_weights` (the stage's weights when the gradient came).
    pub fn backward_after(
        &self,
        stage: u32,
        forward_weights: &[f32],
        backward_weights: &[f32],
        input: ForwardInput,
        dout: &[u8],
        samples: usize,
    ) -> Result<Option<Vec<u8>>> {
        let mut st = self.stage(stage, forward_weights)?;
        ensure!(!st.spec().has_lm_head(), "the tail stage's gradient comes from its loss");
        ensure!(
            backward_weights.len() == forward_weights.len(),
            "stage {stage} has {} weights, not {}",
            forward_weights.len(),
            backward_weights.len()
        );
        let rows = self.rows(samples)?;
        let hidden = self.hidden(&st, input, rows)?;
        let x = stage_input(&hidden, input)?;
        st.forward(0, x, samples, self.cfg.train.seq)?;
        if backward_weights != forward_weights {
            st.set_params(backward_weights)?;
        }
        let g = codec::decode(self.cfg.train.codec, rows, st.boundary_width(), dout)?;
        let din = st.backward(0, &g)?;
        let width = st.spec().boundary_width;
        din.map(|d| codec::encode(self.cfg.train.codec, rows, width, &d)).transpose().map_err(Into::into)
    }

    /// What the tail stage computes for a micro-batch: its per-token losses
    /// against `targets` and the gradient payload it sends back.
    pub fn tail(
        &self,
        stage: u32,
        weights: &[f32],
        input: ForwardInput,
        targets: &[u32],
        samples: usize,
    ) -> Result<TailWork> {
        let mut st = self.stage(stage, weights)?;
        ensure!(st.spec().has_lm_head(), "stage {stage} is not the tail");
        let rows = self.rows(samples)?;
        ensure!(targets.len() == rows, "{} targets for {rows} positions", targets.len());
        let hidden = self.hidden(&st, input, rows)?;
        let x = stage_input(&hidden, input)?;
        let k = self.cfg.train.grad_accum.max(1) as f32;
        let t = st.forward_backward(x, targets, samples, self.cfg.train.seq, 1.0 / k)?;
        let width = st.spec().boundary_width;
        let grad = t.din.map(|d| codec::encode(self.cfg.train.codec, rows, width, &d)).transpose()?;
        Ok(TailWork { losses: t.losses, grad })
    }
}

/// How a claimed payload differs from the recomputed one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// Byte for byte the same.
    pub identical: bool,
    /// Largest absolute difference of the decoded values.
    pub max_abs: f32,
    /// ||claimed - honest|| / ||honest|| over the decoded values.
    pub rel_l2: f64,
    /// The same, of each element's difference less what the codec's
    /// rounding alone can make of two nearly equal values (one
    /// quantisation step of the recomputed row; one bf16 ulp): the part of
    /// the difference that is arithmetic, not rounding.
    pub rel_l2_beyond_rounding: f64,
}

impl Comparison {
    /// Within `tolerance` (relative L2 beyond the codec's rounding); 0
    /// demands identical bytes.
    ///
    /// Why not the plain relative L2: two honest backends' values a hair
    /// apart can round to neighbouring int8 codes, a whole step apart. In
    /// a row ruled by one large value (a tail's gradient often is) a step
    /// is a large part of the row's norm, so a few such flips made an
    /// honest bf16 miner's gradient look 3.4% off (CI, 2026-11-27) where
    /// its arithmetic differed by well under 1%. What rounding can explain
    /// is forgiven. A cheat hiding in it moves each value by at most one
    /// step (twice the codec's own rounding error), even in one direction
    /// throughout: a bias of at most 1/127 of each row's largest value in
    /// int8, which the tolerance-free check of a same-backend miner would
    /// catch and a cross-backend one cannot tell from rounding.
    pub fn passes(&self, tolerance: f64) -> bool {
        self.identical || (tolerance > 0.0 && self.rel_l2_beyond_rounding <= tolerance)
    }
}

/// Compares a claimed payload with the recomputed one (both in the run's
/// codec, `rows x cols`). A claimed payload that does not decode, or holds
/// a non-finite value, is as far off as can be.
pub fn compare(c: iota_core::WireCodec, rows: usize, cols: usize, claimed: &[u8], honest: &[u8]) -> Result<Comparison> {
    let h = codec::decode(c, rows, cols, honest).context("the recomputed payload")?;
    if claimed == honest {
        return Ok(Comparison { identical: true, max_abs: 0.0, rel_l2: 0.0, rel_l2_beyond_rounding: 0.0 });
    }
    let far = Comparison {
        identical: false,
        max_abs: f32::INFINITY,
        rel_l2: f64::INFINITY,
        rel_l2_beyond_rounding: f64::INFINITY,
    };
    let Ok(x) = codec::decode(c, rows, cols, claimed) else { return Ok(far) };
    if x.iter().any(|v| !v.is_finite()) {
        return Ok(far);
    }
    let (mut max_abs, mut diff2, mut beyond2, mut norm2) = (0.0f32, 0.0f64, 0.0f64, 0.0f64);
    for (xr, hr) in x.chunks(cols.max(1)).zip(h.chunks(cols.max(1))) {
        let absmax = hr.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (a, b) in xr.iter().zip(hr) {
            let d = a - b;
            // Each side rounds by at most half a step: two encodings of
            // nearly the same value differ by at most a step.
            let step = 2.0 * codec::error_bound(c, if c == iota_core::WireCodec::Bf16 { b.abs() } else { absmax });
            let beyond = (d.abs() - step).max(0.0);
            max_abs = max_abs.max(d.abs());
            diff2 += f64::from(d) * f64::from(d);
            beyond2 += f64::from(beyond) * f64::from(beyond);
            norm2 += f64::from(*b) * f64::from(*b);
        }
    }
    let relative = |sq: f64| {
        if norm2 > 0.0 {
            (sq / norm2).sqrt()
        } else if sq > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    };
    Ok(Comparison { identical: false, max_abs, rel_l2: relative(diff2), rel_l2_beyond_rounding: relative(beyond2) })
}

#[cfg(test)]
mod tests {
    use iota_core::WireCodec;

    use super::*;

    /// A row ruled by one large value, and the same row with every small
    /// value's int8 code moved by `codes` steps.
    fn int8_pair(codes: i8) -> (Vec<u8>, Vec<u8>) {
        let row: Vec<f32> = (0..16).map(|i| if i == 0 { 127.0 } else { (i % 5) as f32 - 2.0 }).collect();
        let honest = codec::encode(WireCodec::Int8Row, 1, 16, &row).unwrap();
        let mut claimed = honest.clone();
        for c in &mut claimed[3..] {
            *c = (*c as i8 + codes) as u8;
        }
        (claimed, honest)
    }

    #[test]
    fn rounding_flips_are_forgiven_and_more_is_not() {
        // One step on 15 of 16 values: 3% of the row's norm in all, none of
        // it beyond what two roundings of nearly equal values can make.
        let (claimed, honest) = int8_pair(1);
        let c = compare(WireCodec::Int8Row, 1, 16, &claimed, &honest).unwrap();
        assert!(!c.identical && c.rel_l2 > 0.02, "{c:?}");
        assert_eq!(c.rel_l2_beyond_rounding, 0.0, "{c:?}");
        assert!(c.passes(1e-6) && !c.passes(0.0));
        // Three steps: two of them are not rounding.
        let (claimed, honest) = int8_pair(3);
        let c = compare(WireCodec::Int8Row, 1, 16, &claimed, &honest).unwrap();
        assert!(c.rel_l2_beyond_rounding > 0.5 * c.rel_l2 && !c.passes(0.05), "{c:?}");

        // bf16: one ulp is forgiven, four are not; f32 forgives nothing.
        let x: Vec<f32> = (1..=8).map(|i| i as f32 * 0.37).collect();
        let honest = codec::encode(WireCodec::Bf16, 1, 8, &x).unwrap();
        let bumped = |ulps: u16| -> Vec<u8> {
            honest.chunks_exact(2).flat_map(|b| (u16::from_le_bytes([b[0], b[1]]) + ulps).to_le_bytes()).collect()
        };
        let one = compare(WireCodec::Bf16, 1, 8, &bumped(1), &honest).unwrap();
        assert!(one.rel_l2 > 0.0 && one.rel_l2_beyond_rounding == 0.0, "{one:?}");
        let four = compare(WireCodec::Bf16, 1, 8, &bumped(4), &honest).unwrap();
        assert!(four.rel_l2_beyond_rounding > 0.5 * four.rel_l2, "{four:?}");
        let f = codec::encode(WireCodec::F32, 1, 8, &x).unwrap();
        let g = codec::encode(WireCodec::F32, 1, 8, &x.iter().map(|v| v * 1.001).collect::<Vec<_>>()).unwrap();
        let c = compare(WireCodec::F32, 1, 8, &g, &f).unwrap();
        assert_eq!(c.rel_l2, c.rel_l2_beyond_rounding);
    }
}
