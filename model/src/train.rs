//! The single-process trainer: S pipeline stages in one process, with every
//! boundary tensor passed through the wire codec exactly as a distributed run
//! would send it (so it trains with the same quantisation error).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use iota_core::{MicroBatchId, SampleId, StageSpec};
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::checkpoint::{self, NamedTensor};
use crate::codec;
pub use iota_core::train_config::TrainConfig;

use crate::data::Corpus;
use crate::optim::AdamW;
use crate::stage::{Stage, StageInput};

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    /// Per stage.
    pub grad_norms: Vec<f32>,
    /// Stages whose gradient was non-finite (their update was skipped).
    pub skipped: Vec<usize>,
    pub tokens: usize,
    /// Bytes that crossed stage boundaries (activations + gradients).
    pub wire_bytes: usize,
}

/// Loss and traffic of micro-batches accumulated before a step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Accumulated {
    pub loss_sum: f64,
    pub tokens: usize,
    pub wire_bytes: usize,
}

/// The trainer's data order: micro-batch `g` is `batch` consecutive samples
/// of shard `g % shards`, round-robin over the shards.
pub fn micro_batch_id(g: u64, shards: usize, batch: usize) -> MicroBatchId {
    let shards = shards.max(1) as u64;
    MicroBatchId {
        first: SampleId { epoch: 0, shard: (g % shards) as u32, index: (g / shards) * batch as u64 },
        len: batch as u32,
    }
}

/// One micro-batch through `stages` in order (the head first), forward
/// then backward, every boundary tensor through the wire codec both ways,
/// gradients accumulated in each stage scaled by `loss_scale`. The stages
/// may belong to different replicas, as on a swarm pathway. Returns the
/// per-token losses and the boundary bytes.
pub fn accumulate_through<B: Backend>(
    stages: &mut [&mut Stage<B>],
    codec: iota_core::WireCodec,
    seq: usize,
    tokens: &[u32],
    targets: &[u32],
    key: u64,
    loss_scale: f32,
) -> Result<(Vec<f32>, usize)> {
    accumulate_through_with(stages, codec, seq, tokens, targets, key, loss_scale, |_, _, _| Ok(()))
}

/// `accumulate_through`, calling `around_backward(s, stage, true)` just
/// before a head or body stage's backward and `(s, stage, false)` just
/// after it (a replay can change the weights a backward sees).
#[allow(clippy::too_many_arguments, reason = "accumulate_through's arguments and the hook")]
pub fn accumulate_through_with<B: Backend>(
    stages: &mut [&mut Stage<B>],
    codec: iota_core::WireCodec,
    seq: usize,
    tokens: &[u32],
    targets: &[u32],
    key: u64,
    loss_scale: f32,
    mut around_backward: impl FnMut(usize, &mut Stage<B>, bool) -> Result<()>,
) -> Result<(Vec<f32>, usize)> {
    let batch = tokens.len() / seq;
    let n = batch * seq;
    let last = stages.len() - 1;
    let mut wire = 0usize;
    let mut hidden: Vec<f32> = Vec::new();
    for (s, stage) in stages.iter_mut().enumerate().take(last) {
        let input = if s == 0 { StageInput::Tokens(tokens) } else { StageInput::Hidden(&hidden) };
        let mut out = stage.forward(key, input, batch, seq).with_context(|| format!("stage {s} forward"))?;
        let width = stage.boundary_width();
        wire += codec::round_trip(codec, n, width, &mut out).with_context(|| format!("stage {s} output"))?;
        hidden = out;
    }
    let input = if last == 0 { StageInput::Tokens(tokens) } else { StageInput::Hidden(&hidden) };
    let tail =
        stages[last].forward_backward(input, targets, batch, seq, loss_scale).context("tail stage forward/backward")?;
    let mut grad = tail.din;
    for s in (0..last).rev() {
        let mut g = grad.take().expect("non-head stages return an input gradient");
        let width = stages[s].boundary_width();
        wire += codec::round_trip(codec, n, width, &mut g).with_context(|| format!("gradient into stage {s}"))?;
        around_backward(s, stages[s], true)?;
        grad = stages[s].backward(key, &g).with_context(|| format!("stage {s} backward"))?;
        around_backward(s, stages[s], false)?;
    }
    Ok((tail.losses, wire))
}

pub struct Pipeline<B: Backend> {
    pub cfg: TrainConfig,
    stages: Vec<Stage<B>>,
    optim: Vec<AdamW<B>>,
    step: u64,
}

impl<B: Backend> Pipeline<B> {
    pub fn new(be: Arc<B>, cfg: TrainConfig) -> Result<Self> {
        cfg.validate()?;
        let specs = StageSpec::split(&cfg.model, cfg.stages)?;
        let stages: Vec<Stage<B>> =
            specs.into_iter().map(|s| Stage::new(be.clone(), &cfg.model, s, cfg.seed)).collect();
        let optim = stages.iter().map(|s| AdamW::new(&*be, s.layout().total())).collect();
        Ok(Pipeline { cfg, stages, optim, step: 0 })
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }
    pub fn stages(&self) -> &[Stage<B>] {
        &self.stages
    }
    pub fn stages_mut(&mut self) -> &mut [Stage<B>] {
        &mut self.stages
    }
    /// Each stage's optimizer state (its moments and step count).
    pub fn optimizers_mut(&mut self) -> &mut [AdamW<B>] {
        &mut self.optim
    }
    pub fn param_count(&self) -> usize {
        self.stages.iter().map(|s| s.layout().total()).sum()
    }

    /// Runs one micro-batch through all stages, forward then backward,
    /// accumulating gradients scaled by `loss_scale`. Returns per-token losses
    /// and the boundary bytes.
    pub fn accumulate(
        &mut self,
        tokens: &[u32],
        targets: &[u32],
        key: u64,
        loss_scale: f32,
    ) -> Result<(Vec<f32>, usize)> {
        let (codec, seq) = (self.cfg.codec, self.cfg.seq);
        let mut stages: Vec<&mut Stage<B>> = self.stages.iter_mut().collect();
        accumulate_through(&mut stages, codec, seq, tokens, targets, key, loss_scale)
    }

    /// One optimizer step over `grad_accum` micro-batches: those numbered
    /// `step * grad_accum ..` in the trainer's data order (`micro_batch_id`).
    pub fn train_step(&mut self, corpus: &Corpus) -> Result<StepReport> {
        let k = self.cfg.grad_accum as u64;
        self.zero_grads();
        let acc = self.accumulate_micro_batches(corpus, self.step * k, k, 1.0 / k as f32)?;
        Ok(self.apply_step(acc))
    }

    pub fn zero_grads(&mut self) {
        for s in &mut self.stages {
            s.zero_grads();
        }
    }

    /// Forward and backward of the `count` micro-batches numbered from
    /// `first` in the trainer's data order, their gradients added to the
    /// stages' (scaled by `loss_scale`) without an optimizer step. Data
    /// parallel replicas call this with disjoint ranges of one global step's
    /// micro-batches.
    pub fn accumulate_micro_batches(
        &mut self,
        corpus: &Corpus,
        first: u64,
        count: u64,
        loss_scale: f32,
    ) -> Result<Accumulated> {
        let mut acc = Accumulated::default();
        for g in first..first + count {
            let mb = micro_batch_id(g, corpus.num_shards(), self.cfg.batch);
            let (x, y) = corpus.micro_batch(self.cfg.seed, mb, self.cfg.seq);
            let (losses, bytes) = self.accumulate(&x, &y, mb.key(), loss_scale)?;
            acc.loss_sum += losses.iter().map(|&l| l as f64).sum::<f64>();
            acc.tokens += losses.len();
            acc.wire_bytes += bytes;
        }
        Ok(acc)
    }

    /// The optimizer step of every stage from the gradients accumulated so
    /// far, at the schedule's rate for this step.
    pub fn apply_step(&mut self, acc: Accumulated) -> StepReport {
        let lr = self.cfg.schedule.at(self.step);
        let mut grad_norms = Vec::with_capacity(self.stages.len());
        let mut skipped = Vec::new();
        for (i, (stage, opt)) in self.stages.iter_mut().zip(&mut self.optim).enumerate() {
            let st = opt.step(stage, &self.cfg.adamw, lr);
            grad_norms.push(st.grad_norm);
            if !st.applied {
                skipped.push(i);
            }
        }
        let report = StepReport {
            step: self.step,
            loss: (acc.loss_sum / acc.tokens.max(1) as f64) as f32,
            lr,
            grad_norms,
            skipped,
            tokens: acc.tokens,
            wire_bytes: acc.wire_bytes,
        };
        self.step += 1;
        report
    }

    /// Mean loss over `batches` validation batches (no gradients).
    pub fn eval(&mut self, corpus: &Corpus, batches: u64) -> Result<f32> {
        let (batch, seq) = (self.cfg.batch, self.cfg.seq);
        let mut sum = 0.0f64;
        let mut count = 0usize;
        for i in 0..batches {
            let (x, y) = corpus.val_batch(self.cfg.seed, i, batch, seq);
            let l = self.eval_tokens(&x, &y, u64::MAX - i)?;
            sum += l.iter().map(|&v| v as f64).sum::<f64>();
            count += l.len();
        }
        Ok((sum / count.max(1) as f64) as f32)
    }

    /// Per-token losses of `tokens` (rows of `seq`) against `targets`, no
    /// gradients, through the codec at every boundary as in training.
    /// `key` names the micro-batch's saved activations while it runs.
    pub fn eval_tokens(&mut self, tokens: &[u32], targets: &[u32], key: u64) -> Result<Vec<f32>> {
        let codec = self.cfg.codec;
        let seq = self.cfg.seq;
        if tokens.is_empty() || !tokens.len().is_multiple_of(seq) || targets.len() != tokens.len() {
            bail!("eval_tokens takes whole rows of {seq} tokens and as many targets");
        }
        let batch = tokens.len() / seq;
        let n = batch * seq;
        let last = self.stages.len() - 1;
        let mut hidden = Vec::new();
        for s in 0..last {
            let input = if s == 0 { StageInput::Tokens(tokens) } else { StageInput::Hidden(&hidden) };
            let mut out = self.stages[s].forward(key, input, batch, seq)?;
            self.stages[s].discard(key);
            codec::round_trip(codec, n, self.stages[s].boundary_width(), &mut out)?;
            hidden = out;
        }
        let input = if last == 0 { StageInput::Tokens(tokens) } else { StageInput::Hidden(&hidden) };
        Ok(self.stages[last].eval_loss(input, targets, batch, seq)?)
    }

    /// Writes a checkpoint into `run_dir` (see `checkpoint`); returns its folder.
    pub fn save(&self, run_dir: &Path, keep: usize) -> Result<PathBuf> {
        std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
        let tmp = run_dir.join(format!("ckpt-{:08}.tmp", self.step));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        let host: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = self
            .stages
            .iter()
            .zip(&self.optim)
            .map(|(s, o)| {
                let be = s.backend();
                (s.params_host(), be.to_host(&o.m), be.to_host(&o.v))
            })
            .collect();
        let mut weights = Vec::new();
        let mut moments = Vec::new();
        for (s, (p, m, v)) in self.stages.iter().zip(&host) {
            for e in &s.layout().entries {
                weights.push(NamedTensor { name: e.name.clone(), shape: e.shape.clone(), data: &p[e.range()] });
                moments.push(NamedTensor {
                    name: format!("exp_avg.{}", e.name),
                    shape: e.shape.clone(),
                    data: &m[e.range()],
                });
                moments.push(NamedTensor {
                    name: format!("exp_avg_sq.{}", e.name),
                    shape: e.shape.clone(),
                    data: &v[e.range()],
                });
            }
        }
        let config_json = serde_json::to_string(&self.cfg.model)?;
        let meta = BTreeMap::from([
            ("format".to_string(), "pt".to_string()),
            ("iota.model_config".to_string(), config_json),
            ("iota.step".to_string(), self.step.to_string()),
        ]);
        checkpoint::write_safetensors(&tmp.join("model.safetensors"), &weights, meta)?;
        checkpoint::write_safetensors(&tmp.join("optimizer.safetensors"), &moments, BTreeMap::new())?;
        let state =
            TrainState { config: self.cfg.clone(), step: self.step, adam_t: self.optim.iter().map(|o| o.t).collect() };
        std::fs::write(tmp.join("state.json"), serde_json::to_vec_pretty(&state)?)?;
        checkpoint::publish(run_dir, &tmp, self.step, keep)
    }

    /// Restores a pipeline from a checkpoint folder or run directory.
    pub fn load(be: Arc<B>, path: &Path) -> Result<Self> {
        let dir = checkpoint::resolve(path)?;
        let state: TrainState =
            serde_json::from_slice(&std::fs::read(dir.join("state.json")).context("reading state.json")?)
                .context("state.json is not a valid trainer state")?;
        let mut p = Pipeline::new(be, state.config.clone())?;
        if state.adam_t.len() != p.stages.len() {
            bail!("state.json lists {} optimizer counters for {} stages", state.adam_t.len(), p.stages.len());
        }
        let weights = checkpoint::read_safetensors(&dir.join("model.safetensors"))?;
        let moments = checkpoint::read_safetensors(&dir.join("optimizer.safetensors"))?;
        for ((stage, opt), t) in p.stages.iter_mut().zip(&mut p.optim).zip(&state.adam_t) {
            let layout = stage.layout().clone();
            let n = layout.total();
            let (mut w, mut m, mut v) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            for e in &layout.entries {
                weights.copy_into(&e.name, &e.shape, &mut w[e.range()])?;
                moments.copy_into(&format!("exp_avg.{}", e.name), &e.shape, &mut m[e.range()])?;
                moments.copy_into(&format!("exp_avg_sq.{}", e.name), &e.shape, &mut v[e.range()])?;
            }
            stage.set_params(&w)?;
            let be = stage.backend().clone();
            opt.m = be.upload(&m);
            opt.v = be.upload(&v);
            opt.t = *t;
        }
        p.step = state.step;
        Ok(p)
    }
}

#[derive(Serialize, Deserialize)]
struct TrainState {
    config: TrainConfig,
    step: u64,
    adam_t: Vec<u64>,
}
