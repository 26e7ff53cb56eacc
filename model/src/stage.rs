//! A pipeline stage: a contiguous run of blocks plus, depending on its role,
//! the embedding (head), the bottleneck encoder/decoder (at boundaries), and
//! the final norm, LM head and loss (tail).
//!
//! Head and body stages run `forward` on a micro-batch (saving what the
//! backward needs under the micro-batch's key) and later `backward` with the
//! gradient of their output. A tail stage knows the loss as soon as its
//! forward ends, so it runs both at once: `forward_backward`.
//!
//! Boundary tensors (stage inputs and outputs) are host `f32` slices: they are
//! what goes through the wire codec.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use iota_core::{ModelConfig, ParamLayout, Rng, StageRole, StageSpec, layout::Init};
use thiserror::Error;

use crate::backend::Backend;
use crate::block::{BlockActs, Ctx, LayerIdx, block_backward, block_forward, block_recompute};
use crate::boundary::{
    DecodeActs, DecodeIdx, EncodeActs, EncodeIdx, decode_backward, decode_forward, encode_backward, encode_forward,
};
use crate::lm_head::{HeadIdx, head_forward_backward};
use crate::rope::rope_table;

mod versions;

#[derive(Debug, Error, PartialEq)]
pub enum StageError {
    #[error("stage {index} is a {role:?} stage and cannot {what}")]
    Role { index: usize, role: StageRole, what: &'static str },
    #[error("{what}: got {got} values, expected {expected}")]
    Shape { what: &'static str, expected: usize, got: usize },
    #[error("sequence length {seq} is outside 1..={max} (the model's max_seq)")]
    SeqLen { seq: usize, max: usize },
    #[error("token {token} at position {pos} is outside the vocabulary ({vocab})")]
    Token { token: u32, pos: usize, vocab: usize },
    #[error("non-finite value in {0}")]
    NonFinite(&'static str),
    #[error("micro-batch {0:#x} already has saved activations")]
    Duplicate(u64),
    #[error("no saved activations for micro-batch {0:#x}")]
    Unknown(u64),
    #[error("{0} micro-batches already in flight (the limit)")]
    TooManyInFlight(usize),
}

/// What enters a stage.
#[derive(Clone, Copy, Debug)]
pub enum StageInput<'a> {
    /// Token ids `[batch * seq]` (head stage).
    Tokens(&'a [u32]),
    /// Boundary activations `[batch * seq, boundary_width]` (other stages).
    Hidden(&'a [f32]),
}

/// A stage's input once it is on the backend.
enum Input<'a, B: Backend> {
    Tokens(&'a [u32]),
    Hidden(B::Buf),
}

/// A `Ctx` borrowing only the fields it needs, so `self.grads` stays free
/// to borrow mutably beside it. The RoPE table must exist (`ensure_rope`).
macro_rules! ctx {
    ($s:ident, $batch:expr, $seq:expr) => {
        Ctx { be: &*$s.be, cfg: &$s.cfg, params: &$s.params, rope: &$s.rope[&$seq], batch: $batch, seq: $seq }
    };
}

// After `ctx!`: the module uses it.
mod trace;
pub use self::trace::{MbEnd, MbTrace, MbTraced, Segment, SegmentKind, SegmentOut, ValuesHash, segments_of};

struct Saved<B: Backend> {
    /// The weights version the forward ran with (`Stage::version`).
    version: u64,
    batch: usize,
    seq: usize,
    tokens: Option<Vec<u32>>,
    dec: Option<DecodeActs<B>>,
    blocks: KeptBlocks<B>,
    h_out: B::Buf,
    enc: Option<EncodeActs<B>>,
    /// The predicted weights the forward ran on (weight prediction), which
    /// its backward runs on too; `None`: the weights of `version`.
    weights: Option<B::Buf>,
}

/// What a micro-batch's forward keeps of its blocks for the backward.
enum KeptBlocks<B: Backend> {
    /// Every block's activations.
    All(Vec<BlockActs<B>>),
    /// Each block's input residual only (`Stage::set_recompute`): the
    /// backward makes each block's activations again, one block at a time.
    Inputs(Vec<B::Buf>),
}

/// Result of a tail stage's combined forward and backward.
pub struct TailOutput {
    /// Per-token loss (natural log), `[batch * seq]`.
    pub losses: Vec<f32>,
    /// Gradient of the stage input (`None` for a whole-model stage).
    pub din: Option<Vec<f32>>,
}

pub struct Stage<B: Backend> {
    be: Arc<B>,
    cfg: ModelConfig,
    spec: StageSpec,
    layout: ParamLayout,
    params: B::Buf,
    grads: B::Buf,
    /// RoPE tables by sequence length (few distinct lengths occur).
    rope: HashMap<usize, B::Buf>,
    layers: Vec<LayerIdx>,
    embed: Option<Range<usize>>,
    decode: Option<DecodeIdx>,
    encode: Option<EncodeIdx>,
    head: Option<HeadIdx>,
    saved: HashMap<u64, Saved<B>>,
    max_in_flight: usize,
    /// Bumped by every change of the weights (an optimizer step, a merge).
    version: u64,
    /// Weight stashing (PipeDream): the weights of earlier versions that
    /// micro-batches still in flight were forwarded with, so their backward
    /// runs with the same weights as their forward. Without it a stage that
    /// steps between a micro-batch's forward and backward differentiates a
    /// function it never evaluated; on the swarm that cost more than the
    /// merge interval did (docs/BENCHMARKS.md, convergence).
    /// Each holds `stash_range` of the weights: all of them (the stash
    /// then takes the weights' place for a backward, no copy), or, for a
    /// recomputing head, all but its embedding table, which no backward
    /// reads (a `1.5b` head's 1 GiB; swapped in and out by copies).
    stash: HashMap<u64, B::Buf>,
    stash_range: Range<usize>,
    /// Values `swap_stash` moves at a time (`SWAP_CHUNK`; tests set less).
    swap_chunk: usize,
    stash_weights: bool,
    /// Weight prediction (`set_weight_prediction`): micro-batches per
    /// optimizer step, and the weights before the last step (`None` before
    /// the first step and after weights were set, when the step's change
    /// is unknown).
    predict_accum: Option<usize>,
    before_step: Option<B::Buf>,
    /// Activation recomputation (`set_recompute`).
    recompute: bool,
}

/// Values `Stage::swap_stash` moves at a time (16 MiB of f32).
const SWAP_CHUNK: usize = 1 << 22;

/// FNV-1a: a stable 64-bit hash of a tensor name (the init stream's key).
fn name_key(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Initial values of a stage's flat parameter vector. Each tensor draws from
/// its own stream keyed by (seed, name), so a tensor starts identical however
/// the model is split into stages.
///
/// A long tensor is filled in parallel parts, each resuming its stream
/// where the sequential fill would be (`Rng::skipped`): the values are the
/// same bits as one sequential fill, in a fraction of the time (a `1.5b`
/// stage's 468M draws took ~14 s of a miner's start-up sequentially).
pub fn init_params(layout: &ParamLayout, seed: u64) -> Vec<f32> {
    use rayon::prelude::*;
    const PART: usize = 1 << 20;
    let mut p = vec![0.0f32; layout.total()];
    for e in &layout.entries {
        let dst = &mut p[e.range()];
        match e.init {
            Init::Const(v) => dst.fill(v),
            Init::Normal(std) => {
                let stream = Rng::derived(seed, &[name_key(&e.name)]);
                dst.par_chunks_mut(PART).enumerate().for_each(|(i, part)| {
                    // Two draws per normal sample.
                    stream.skipped(2 * (i * PART) as u64).fill_normal(part, std);
                });
            }
        }
    }
    p
}

impl<B: Backend> Stage<B> {
    /// A freshly initialised stage.
    pub fn new(be: Arc<B>, cfg: &ModelConfig, spec: StageSpec, seed: u64) -> Stage<B> {
        let layout = ParamLayout::for_stage(cfg, &spec);
        let host = init_params(&layout, seed);
        Self::with_params(be, cfg, spec, &host).expect("init_params matches its layout")
    }

    /// A stage with given parameter values (flat, in layout order).
    pub fn with_params(be: Arc<B>, cfg: &ModelConfig, spec: StageSpec, params: &[f32]) -> Result<Stage<B>, StageError> {
        let layout = ParamLayout::for_stage(cfg, &spec);
        if params.len() != layout.total() {
            return Err(StageError::Shape { what: "stage parameters", expected: layout.total(), got: params.len() });
        }
        let has_lm_head = spec.has_lm_head();
        let last_layer = spec.layers.end - 1;
        let stage = Stage {
            params: be.upload(params),
            grads: be.zeros(layout.total()),
            rope: HashMap::new(),
            layers: spec.layers.clone().map(|l| LayerIdx::new(&layout, l)).collect(),
            embed: spec.has_embedding().then(|| layout.range("model.embed_tokens.weight")),
            decode: spec.decode_in.then(|| DecodeIdx::new(&layout, spec.layers.start)),
            encode: spec.encode_out.then(|| EncodeIdx::new(&layout, last_layer)),
            head: has_lm_head.then(|| HeadIdx::new(&layout)),
            saved: HashMap::new(),
            max_in_flight: 64,
            version: 0,
            stash: HashMap::new(),
            stash_range: 0..layout.total(),
            swap_chunk: SWAP_CHUNK,
            stash_weights: true,
            predict_accum: None,
            before_step: None,
            recompute: false,
            cfg: cfg.clone(),
            spec,
            layout,
            be,
        };
        Ok(stage)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    pub fn spec(&self) -> &StageSpec {
        &self.spec
    }
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }
    pub fn backend(&self) -> &Arc<B> {
        &self.be
    }
    pub fn params(&self) -> &B::Buf {
        &self.params
    }
    pub fn params_mut(&mut self) -> &mut B::Buf {
        &mut self.params
    }
    pub fn grads(&self) -> &B::Buf {
        &self.grads
    }
    /// Parameters and gradients at once (what an optimizer step needs).
    pub fn params_and_grads(&mut self) -> (&mut B::Buf, &B::Buf) {
        (&mut self.params, &self.grads)
    }
    pub fn params_host(&self) -> Vec<f32> {
        self.be.to_host(&self.params)
    }
    pub fn grads_host(&self) -> Vec<f32> {
        self.be.to_host(&self.grads)
    }
    pub fn set_params(&mut self, host: &[f32]) -> Result<(), StageError> {
        if host.len() != self.layout.total() {
            return Err(StageError::Shape { what: "stage parameters", expected: self.layout.total(), got: host.len() });
        }
        let old = std::mem::replace(&mut self.params, self.be.upload(host));
        if self.stash_weights && self.in_flight_at(self.version) && !self.stash.contains_key(&self.version) {
            let kept = if self.whole_stash() { old } else { self.stashed_part(&old) };
            self.stash.insert(self.version, kept);
        }
        self.version += 1;
        // A merge or a load is no optimizer step: nothing to extrapolate.
        self.before_step = None;
        Ok(())
    }

    /// Replaces the accumulated gradients (data-parallel replicas that
    /// average their gradients before stepping).
    pub fn set_grads(&mut self, host: &[f32]) -> Result<(), StageError> {
        if host.len() != self.layout.total() {
            return Err(StageError::Shape { what: "stage gradients", expected: self.layout.total(), got: host.len() });
        }
        self.grads = self.be.upload(host);
        Ok(())
    }
    pub fn zero_grads(&mut self) {
        self.be.fill(self.be.all_mut(&mut self.grads), 0.0);
    }
    /// Micro-batches forwarded but not yet backwarded.
    pub fn in_flight(&self) -> usize {
        self.saved.len()
    }
    pub fn set_max_in_flight(&mut self, n: usize) {
        self.max_in_flight = n.max(1);
    }
    /// Most logits the LM head holds at once (f32 values; default
    /// `lm_head::LOGIT_BUDGET`): the loss and its gradient are computed in
    /// chunks of rows that fit, so the full [tokens, vocab] logits never
    /// exist. No effect on a stage without the head.
    pub fn set_logit_budget(&mut self, values: usize) {
        if let Some(h) = self.head.as_mut() {
            h.logit_budget = values.max(1);
        }
    }
    /// Drops a micro-batch's saved activations (its backward will never come).
    pub fn discard(&mut self, key: u64) -> bool {
        let found = self.saved.remove(&key).is_some();
        self.prune_stash();
        found
    }
    /// Width of the tensors at this stage's input and output boundaries.
    pub fn boundary_width(&self) -> usize {
        self.spec.boundary_width
    }

    fn role_err(&self, what: &'static str) -> StageError {
        StageError::Role { index: self.spec.index, role: self.spec.role(), what }
    }

    /// `n` token ids, each inside the vocabulary.
    fn check_tokens(&self, what: &'static str, t: &[u32], n: usize) -> Result<(), StageError> {
        if t.len() != n {
            return Err(StageError::Shape { what, expected: n, got: t.len() });
        }
        let vocab = self.cfg.vocab_real;
        match t.iter().enumerate().find(|(_, t)| **t as usize >= vocab) {
            Some((pos, &token)) => Err(StageError::Token { token, pos, vocab }),
            None => Ok(()),
        }
    }

    /// Validates a host input and moves it onto the backend.
    fn accept<'a>(&self, input: StageInput<'a>, batch: usize, seq: usize) -> Result<Input<'a, B>, StageError> {
        self.check_input(&input, batch, seq)?;
        Ok(match input {
            StageInput::Tokens(t) => Input::Tokens(t),
            StageInput::Hidden(h) => Input::Hidden(self.be.upload(h)),
        })
    }

    /// Validates boundary activations already on the backend (decoded there
    /// by `Backend::decode_wire`, which guarantees finite values).
    fn accept_buf(&self, z: B::Buf, batch: usize, seq: usize) -> Result<Input<'static, B>, StageError> {
        if seq == 0 || seq > self.cfg.max_seq {
            return Err(StageError::SeqLen { seq, max: self.cfg.max_seq });
        }
        if self.spec.has_embedding() {
            return Err(self.role_err("take activations (it starts with the embedding)"));
        }
        let want = batch * seq * self.spec.boundary_width;
        let got = self.be.len(&z);
        if got != want {
            return Err(StageError::Shape { what: "boundary activations", expected: want, got });
        }
        Ok(Input::Hidden(z))
    }

    fn check_input(&self, input: &StageInput, batch: usize, seq: usize) -> Result<(), StageError> {
        if seq == 0 || seq > self.cfg.max_seq {
            return Err(StageError::SeqLen { seq, max: self.cfg.max_seq });
        }
        let n = batch * seq;
        match (input, self.spec.has_embedding()) {
            (StageInput::Tokens(t), true) => self.check_tokens("tokens", t, n)?,
            (StageInput::Hidden(h), false) => {
                let want = n * self.spec.boundary_width;
                if h.len() != want {
                    return Err(StageError::Shape { what: "boundary activations", expected: want, got: h.len() });
                }
                if h.iter().any(|v| !v.is_finite()) {
                    return Err(StageError::NonFinite("boundary activations"));
                }
            }
            (StageInput::Tokens(_), false) => {
                return Err(self.role_err("take tokens (it has no embedding)"));
            }
            (StageInput::Hidden(_), true) => {
                return Err(self.role_err("take activations (it starts with the embedding)"));
            }
        }
        Ok(())
    }

    fn ensure_rope(&mut self, seq: usize) {
        if !self.rope.contains_key(&seq) {
            let t = self.be.upload(&rope_table(&self.cfg, seq));
            self.rope.insert(seq, t);
        }
    }

    /// Embedding or decoder, then the blocks.
    fn run_forward(&mut self, input: Input<B>, batch: usize, seq: usize) -> Saved<B> {
        self.ensure_rope(seq);
        let be = &*self.be;
        let c = ctx!(self, batch, seq);
        let (n, d) = (c.n(), self.cfg.d_model);
        let mut tokens = None;
        let mut dec = None;
        let mut h = match input {
            Input::Tokens(t) => {
                let mut h = be.zeros(n * d);
                be.embedding(be.all_mut(&mut h), t, c.p(self.embed.as_ref().unwrap()), d);
                tokens = Some(t.to_vec());
                h
            }
            Input::Hidden(z) => match &self.decode {
                Some(idx) => {
                    let (acts, h) = decode_forward(&c, idx, z);
                    dec = Some(acts);
                    h
                }
                None => z,
            },
        };
        let mut blocks = Vec::with_capacity(self.layers.len());
        let mut inputs = Vec::new();
        for li in &self.layers {
            let (acts, out) = block_forward(&c, li, h);
            if self.recompute {
                inputs.push(acts.into_input());
            } else {
                blocks.push(acts);
            }
            h = out;
        }
        let blocks = if self.recompute { KeptBlocks::Inputs(inputs) } else { KeptBlocks::All(blocks) };
        Saved { version: self.version, batch, seq, tokens, dec, blocks, h_out: h, enc: None, weights: None }
    }

    /// Blocks backward, then decoder / embedding backward. Returns the
    /// gradient of the stage input for non-head stages.
    fn run_backward(&mut self, s: Saved<B>, mut dres: B::Buf) -> Option<Vec<f32>> {
        self.ensure_rope(s.seq);
        let be = &*self.be;
        let c = ctx!(self, s.batch, s.seq);
        match s.blocks {
            KeptBlocks::All(blocks) => {
                for (li, acts) in self.layers.iter().zip(&blocks).rev() {
                    block_backward(&c, li, acts, &mut dres, &mut self.grads);
                }
            }
            KeptBlocks::Inputs(inputs) => {
                // On the weights the forward ran with (the caller put them
                // back), so the activations are the forward's bits.
                for (li, x) in self.layers.iter().zip(inputs).rev() {
                    let acts = block_recompute(&c, li, x);
                    block_backward(&c, li, &acts, &mut dres, &mut self.grads);
                }
            }
        }
        if let Some(tokens) = &s.tokens {
            be.embedding_bwd(
                be.view_mut(&mut self.grads, self.embed.clone().unwrap()),
                be.all(&dres),
                tokens,
                self.cfg.d_model,
            );
            return None;
        }
        let din = match (&self.decode, &s.dec) {
            (Some(idx), Some(acts)) => decode_backward(&c, idx, acts, &dres, &mut self.grads),
            _ => dres,
        };
        Some(be.to_host(&din))
    }

    /// Forward of a head or body stage: returns the boundary output
    /// `[batch * seq, boundary_width]` and keeps the activations under `key`.
    pub fn forward(&mut self, key: u64, input: StageInput, batch: usize, seq: usize) -> Result<Vec<f32>, StageError> {
        if self.spec.has_lm_head() {
            return Err(self.role_err("run forward alone (use forward_backward)"));
        }
        let input = self.accept(input, batch, seq)?;
        self.forward_input(key, input, batch, seq)
    }

    /// `forward` of boundary activations already on the backend.
    pub fn forward_buf(&mut self, key: u64, z: B::Buf, batch: usize, seq: usize) -> Result<Vec<f32>, StageError> {
        if self.spec.has_lm_head() {
            return Err(self.role_err("run forward alone (use forward_backward)"));
        }
        let input = self.accept_buf(z, batch, seq)?;
        self.forward_input(key, input, batch, seq)
    }

    fn forward_input(&mut self, key: u64, input: Input<B>, batch: usize, seq: usize) -> Result<Vec<f32>, StageError> {
        if self.saved.contains_key(&key) {
            return Err(StageError::Duplicate(key));
        }
        if self.saved.len() >= self.max_in_flight {
            return Err(StageError::TooManyInFlight(self.saved.len()));
        }
        let current = self.predicted_weights().map(|w| std::mem::replace(&mut self.params, w));
        let mut s = self.run_forward(input, batch, seq);
        let out = match &self.encode {
            Some(idx) => {
                let c = ctx!(self, batch, seq);
                let (acts, z) = encode_forward(&c, idx, &s.h_out);
                s.enc = Some(acts);
                self.be.to_host(&z)
            }
            None => self.be.to_host(&s.h_out),
        };
        if let Some(cur) = current {
            s.weights = Some(std::mem::replace(&mut self.params, cur));
        }
        if out.iter().any(|v| !v.is_finite()) {
            return Err(StageError::NonFinite("stage output (the model diverged)"));
        }
        self.saved.insert(key, s);
        Ok(out)
    }

    /// Backward of a head or body stage for a micro-batch forwarded earlier.
    /// Returns the gradient of its input (`None` for the head stage).
    pub fn backward(&mut self, key: u64, dout: &[f32]) -> Result<Option<Vec<f32>>, StageError> {
        let s = self.saved.get(&key).ok_or(StageError::Unknown(key))?;
        let want = s.batch * s.seq * self.spec.boundary_width;
        if dout.len() != want {
            return Err(StageError::Shape { what: "output gradient", expected: want, got: dout.len() });
        }
        if dout.iter().any(|v| !v.is_finite()) {
            return Err(StageError::NonFinite("output gradient"));
        }
        let dz = self.be.upload(dout);
        self.backward_buf(key, dz)
    }

    /// `backward` with the output gradient already on the backend (decoded
    /// there by `Backend::decode_wire`).
    pub fn backward_buf(&mut self, key: u64, dz: B::Buf) -> Result<Option<Vec<f32>>, StageError> {
        let s = self.saved.get(&key).ok_or(StageError::Unknown(key))?;
        let want = s.batch * s.seq * self.spec.boundary_width;
        if self.be.len(&dz) != want {
            return Err(StageError::Shape { what: "output gradient", expected: want, got: self.be.len(&dz) });
        }
        let mut s = self.saved.remove(&key).unwrap();
        // The weights this micro-batch was forwarded with: predicted ones
        // it kept, or a version's, if they changed since.
        let predicted = s.weights.take();
        let was_stashed = predicted.is_none();
        // Predicted weights are a whole buffer, put in place of the
        // current one; a stash holds part of one, swapped in and out.
        let (current, mut swapped) = match (predicted, self.stash.remove(&s.version)) {
            (Some(w), stashed) => {
                if let Some(v) = stashed {
                    self.stash.insert(s.version, v);
                }
                (Some(std::mem::replace(&mut self.params, w)), None)
            }
            (None, Some(w)) if s.version != self.version && self.whole_stash() => {
                (Some(std::mem::replace(&mut self.params, w)), None)
            }
            (None, Some(mut w)) if s.version != self.version => {
                self.swap_stash(&mut w);
                (None, Some(w))
            }
            // A stash of the current version is never needed.
            (None, _) => (None, None),
        };
        let version = s.version;
        let dres = match (&self.encode, &s.enc) {
            (Some(idx), Some(acts)) => {
                let c = ctx!(self, s.batch, s.seq);
                encode_backward(&c, idx, acts, &s.h_out, &dz, &mut self.grads)
            }
            _ => dz,
        };
        let din = self.run_backward(s, dres);
        if let Some(cur) = current {
            let old = std::mem::replace(&mut self.params, cur);
            if was_stashed && self.in_flight_at(version) {
                self.stash.insert(version, old);
            }
        }
        if let Some(mut old) = swapped.take() {
            self.swap_stash(&mut old);
            if self.in_flight_at(version) {
                self.stash.insert(version, old);
            }
        }
        Ok(din)
    }

    /// Tail (or whole-model) stage: forward, loss against `targets`, and
    /// backward in one go. Gradients accumulate scaled by
    /// `loss_scale / (batch * seq)` (mean over the micro-batch's tokens, times
    /// e.g. 1/k when k micro-batches are accumulated).
    pub fn forward_backward(
        &mut self,
        input: StageInput,
        targets: &[u32],
        batch: usize,
        seq: usize,
        loss_scale: f32,
    ) -> Result<TailOutput, StageError> {
        self.check_tail(targets, batch, seq)?;
        let input = self.accept(input, batch, seq)?;
        self.tail_forward_backward(input, targets, batch, seq, loss_scale)
    }

    /// `forward_backward` of boundary activations already on the backend.
    pub fn forward_backward_buf(
        &mut self,
        z: B::Buf,
        targets: &[u32],
        batch: usize,
        seq: usize,
        loss_scale: f32,
    ) -> Result<TailOutput, StageError> {
        self.check_tail(targets, batch, seq)?;
        let input = self.accept_buf(z, batch, seq)?;
        self.tail_forward_backward(input, targets, batch, seq, loss_scale)
    }

    fn tail_forward_backward(
        &mut self,
        input: Input<B>,
        targets: &[u32],
        batch: usize,
        seq: usize,
        loss_scale: f32,
    ) -> Result<TailOutput, StageError> {
        let s = self.run_forward(input, batch, seq);
        let n = batch * seq;
        let c = ctx!(self, batch, seq);
        let (losses, dh) = head_forward_backward(
            &c,
            self.head.as_ref().unwrap(),
            &s.h_out,
            targets,
            loss_scale / n as f32,
            Some(&mut self.grads),
        );
        let din = self.run_backward(s, dh.expect("gradients were requested"));
        Ok(TailOutput { losses, din })
    }

    /// Tail (or whole-model) stage: per-token loss without touching gradients.
    pub fn eval_loss(
        &mut self,
        input: StageInput,
        targets: &[u32],
        batch: usize,
        seq: usize,
    ) -> Result<Vec<f32>, StageError> {
        self.check_tail(targets, batch, seq)?;
        let input = self.accept(input, batch, seq)?;
        let s = self.run_forward(input, batch, seq);
        let c = ctx!(self, batch, seq);
        Ok(head_forward_backward(&c, self.head.as_ref().unwrap(), &s.h_out, targets, 0.0, None).0)
    }

    fn check_tail(&self, targets: &[u32], batch: usize, seq: usize) -> Result<(), StageError> {
        if !self.spec.has_lm_head() {
            return Err(self.role_err("compute a loss (it has no LM head)"));
        }
        self.check_tokens("targets", targets, batch * seq)
    }
}

#[cfg(test)]
mod init_tests {
    use super::*;
    use iota_core::layout::ParamEntry;

    /// The parallel fill yields the sequential fill's bits, across part
    /// boundaries and for a tensor that is not a whole number of parts.
    #[test]
    fn parallel_init_is_the_sequential_stream() {
        let len = (1 << 20) * 2 + 12_345;
        let layout = ParamLayout {
            entries: vec![
                ParamEntry { name: "a".into(), shape: vec![3], offset: 0, init: Init::Const(1.0), decay: false },
                ParamEntry { name: "w".into(), shape: vec![len], offset: 3, init: Init::Normal(0.02), decay: true },
            ],
        };
        let p = init_params(&layout, 77);
        let mut want = vec![0.0f32; len];
        Rng::derived(77, &[name_key("w")]).fill_normal(&mut want, 0.02);
        assert_eq!(&p[..3], &[1.0; 3]);
        assert!(p[3..].iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
