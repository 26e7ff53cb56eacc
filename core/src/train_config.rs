//! What a training run is configured with: the model, the tokenizer kind,
//! the batch shape, the optimiser and its schedule. Pure data shared by the
//! single-process trainer, the run configuration miners receive, and the
//! control plane; the code that acts on it lives in `iota-model`.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::codec::WireCodec;
use crate::compute_plan::{AUTO_MUON_MAX_SLOWDOWN, muon_slowdown};
use crate::config::ModelConfig;

/// The most tokens one micro-batch may hold (batch x seq): 16M, far above
/// any card's memory, so that byte counts derived from it cannot overflow.
pub const MAX_TOKENS_PER_MICRO_BATCH: usize = 1 << 24;
/// The longest training sequence (attention's scores grow with its square).
pub const MAX_TRAIN_SEQ: usize = 1 << 17;
/// The most micro-batches one optimizer step may accumulate.
pub const MAX_GRAD_ACCUM: usize = 1 << 16;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub model: ModelConfig,
    pub tokenizer: TokenizerKind,
    pub stages: usize,
    pub batch: usize,
    pub seq: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    pub steps: u64,
    pub schedule: LrSchedule,
    pub adamw: AdamWConfig,
    /// Codec of boundary tensors (both directions).
    pub codec: WireCodec,
    pub seed: u64,
}

impl TrainConfig {
    /// Sets the inner optimizer by its `--optimizer` name. `auto` takes
    /// Muon where its Newton-Schulz steps slow the run by at most
    /// [`AUTO_MUON_MAX_SLOWDOWN`] (see [`TrainConfig::muon_slowdown`]),
    /// else AdamW; [`TrainConfig::auto_optimizer_note`] says which and why.
    pub fn choose_optimizer(&mut self, name: &str, pipeline_stages: usize) -> Result<()> {
        if name != "auto" {
            return self.adamw.set_optimizer(name);
        }
        let cheap = self.muon_slowdown(pipeline_stages).is_some_and(|s| s <= AUTO_MUON_MAX_SLOWDOWN);
        self.adamw.set_optimizer(if cheap { "muon" } else { "adamw" })
    }

    /// What Muon's Newton-Schulz steps add to the step of the slowest of
    /// `pipeline_stages` stages (one process is one stage), counted by
    /// `compute_plan`; `None` for a split the model does not allow.
    pub fn muon_slowdown(&self, pipeline_stages: usize) -> Option<f64> {
        muon_slowdown(&self.model, pipeline_stages, self.tokens_per_step(), self.seq)
    }

    /// One line for a run's start-up: the optimizer `auto` chose and why.
    pub fn auto_optimizer_note(&self, pipeline_stages: usize) -> String {
        let Some(s) = self.muon_slowdown(pipeline_stages) else {
            return format!("optimizer: {} (auto)", self.adamw.optimizer_name());
        };
        let (pct, limit, tokens) = (s * 100.0, AUTO_MUON_MAX_SLOWDOWN * 100.0, self.tokens_per_step());
        if self.adamw.muon {
            format!(
                "optimizer: muon (auto: its Newton-Schulz steps add about {pct:.0}% to the slowest stage's step of \
                 {tokens} tokens, within the {limit:.0}% auto allows; --optimizer adamw for AdamW)"
            )
        } else {
            format!(
                "optimizer: adamw (auto: Muon's Newton-Schulz steps would add about {pct:.0}% to the slowest \
                 stage's step of {tokens} tokens, over the {limit:.0}% auto allows; --optimizer muon for Muon, \
                 which learns more per token)"
            )
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        if self.batch == 0 || self.seq == 0 || self.grad_accum == 0 {
            bail!("--batch, --seq and --grad-accum must be positive");
        }
        if self.batch.saturating_mul(self.seq) > MAX_TOKENS_PER_MICRO_BATCH
            || self.seq > MAX_TRAIN_SEQ
            || self.grad_accum > MAX_GRAD_ACCUM
        {
            bail!(
                "--batch x --seq ({} x {}) must be at most {MAX_TOKENS_PER_MICRO_BATCH} tokens, --seq at most \
                 {MAX_TRAIN_SEQ} and --grad-accum {} at most {MAX_GRAD_ACCUM}",
                self.batch,
                self.seq,
                self.grad_accum
            );
        }
        if self.seq > self.model.max_seq {
            bail!("--seq {} exceeds the model's max_seq {}", self.seq, self.model.max_seq);
        }
        if self.stages == 0 || self.stages > self.model.n_layers {
            bail!("--stages {} must be between 1 and the model's {} layers", self.stages, self.model.n_layers);
        }
        if let Some(v) = &self.model.stage_layers
            && v.len() != self.stages
        {
            bail!("--stage-layers gives {} stages ({v:?}) but the run has --stages {}", v.len(), self.stages);
        }
        if self.tokenizer.vocab_real() > self.model.vocab_real {
            bail!(
                "tokenizer {} emits {} ids but the model has {}",
                self.tokenizer.name(),
                self.tokenizer.vocab_real(),
                self.model.vocab_real
            );
        }
        if !(self.schedule.peak > 0.0 && self.schedule.peak.is_finite()) {
            bail!("--lr must be a positive number");
        }
        if !(0.0..=1.0).contains(&self.schedule.min_ratio) {
            bail!("the schedule's min_ratio {} must be in [0, 1]", self.schedule.min_ratio);
        }
        self.adamw.validate()?;
        Ok(())
    }

    pub fn tokens_per_step(&self) -> usize {
        // Saturating: `--optimizer auto` asks before validate() bounds them.
        self.batch.saturating_mul(self.seq).saturating_mul(self.grad_accum)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Clip the gradient's global L2 norm to this (0 = no clipping).
    pub grad_clip: f32,
    /// NAdam (Nesterov look-ahead on the first moment) instead of Adam.
    /// Left out of saved settings when off, so older runs keep their id.
    #[serde(default, skip_serializing_if = "is_false")]
    pub nesterov: bool,
    /// beta1 of each pipeline stage, head first (empty: `beta1` everywhere;
    /// shorter than the stage count: the last value for the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage_beta1: Vec<f32>,
    /// The learning rate's multiplier at each pipeline stage, head first
    /// (empty: 1 everywhere; shorter than the stage count: the last value
    /// for the rest): a pipelined stage applies gradients some steps old
    /// (docs/BENCHMARKS.md, convergence), which a smaller step tolerates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage_lr: Vec<f32>,
    /// Weight prediction for pipelined stages: a stage forwards a
    /// micro-batch on its weights extrapolated by the optimizer steps that
    /// micro-batches ahead of it will take (the last step's change, times
    /// that count), and runs its backward on the same weights, so the
    /// gradient is taken near the weights it will be applied to. Off: on
    /// the current weights (stashed for the backward). Left out of saved
    /// settings when off.
    #[serde(default, skip_serializing_if = "is_false")]
    pub predict_weights: bool,
    /// Muon for the blocks' weight matrices (attention, MLP, bottleneck
    /// projections): momentum, then the update orthogonalised by a
    /// Newton-Schulz iteration, scaled to AdamW's update size so the same
    /// learning rate serves both; embeddings, the LM head and norm gains
    /// keep AdamW. Its momentum lives where AdamW's first moment does.
    /// Left out of saved settings when off.
    #[serde(default, skip_serializing_if = "is_false")]
    pub muon: bool,
    /// Muon's momentum (None: 0.95, its authors' value). A replica steps on
    /// a fraction of the global batch, and Muon's orthogonalisation raises
    /// the noise of its momentum to full length (docs/BENCHMARKS.md,
    /// "Where Muon's merge-interval cost comes from"): a longer momentum
    /// averages more of it away. Left out of saved settings when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub muon_momentum: Option<f32>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl AdamWConfig {
    /// beta1 of stage `stage`.
    pub fn beta1_of(&self, stage: usize) -> f32 {
        match self.stage_beta1.get(stage).or(self.stage_beta1.last()) {
            Some(&b) => b,
            None => self.beta1,
        }
    }

    /// The learning rate's multiplier at stage `stage`.
    pub fn lr_scale_of(&self, stage: usize) -> f32 {
        self.stage_lr.get(stage).or(self.stage_lr.last()).copied().unwrap_or(1.0)
    }

    /// The inner optimizers `--optimizer` names.
    pub const OPTIMIZERS: &'static str = "auto, adamw, nadam, muon";

    /// Sets the inner optimizer by its `--optimizer` name: adamw (or adam),
    /// nadam, or muon (Muon for the blocks' matrices, AdamW for the rest).
    pub fn set_optimizer(&mut self, name: &str) -> Result<()> {
        (self.nesterov, self.muon) = match name {
            "adamw" | "adam" => (false, false),
            "nadam" => (true, false),
            "muon" => (false, true),
            "auto" => bail!("--optimizer auto is chosen from the run's shape (TrainConfig::choose_optimizer)"),
            other => bail!("unknown --optimizer '{other}' ({})", Self::OPTIMIZERS),
        };
        Ok(())
    }

    /// The `--optimizer` name of these settings.
    pub fn optimizer_name(&self) -> &'static str {
        match (self.muon, self.nesterov) {
            (true, _) => "muon",
            (false, true) => "nadam",
            (false, false) => "adamw",
        }
    }

    pub fn validate(&self) -> Result<()> {
        for &s in &self.stage_lr {
            if !(s.is_finite() && s > 0.0 && s <= 10.0) {
                bail!("a stage's learning-rate multiplier {s} must be in (0, 10]");
            }
        }
        for &b in std::iter::once(&self.beta1).chain(&self.stage_beta1) {
            if !(0.0..1.0).contains(&b) {
                bail!("beta1 {b} must be in [0, 1)");
            }
        }
        if !(0.0..1.0).contains(&self.beta2) {
            bail!("beta2 {} must be in [0, 1)", self.beta2);
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            bail!("eps {} must be finite and > 0", self.eps);
        }
        for (name, x) in [("weight_decay", self.weight_decay), ("grad_clip", self.grad_clip)] {
            if !(x.is_finite() && x >= 0.0) {
                bail!("{name} {x} must be finite and >= 0");
            }
        }
        Ok(())
    }
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            nesterov: false,
            stage_beta1: Vec::new(),
            stage_lr: Vec::new(),
            predict_weights: false,
            muon: false,
            muon_momentum: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub peak: f32,
    pub warmup: u64,
    pub total: u64,
    /// The rate decays to `peak * min_ratio` at `total` steps.
    pub min_ratio: f32,
}

impl LrSchedule {
    /// Learning rate of 0-based step `step`.
    pub fn at(&self, step: u64) -> f32 {
        if step < self.warmup {
            return self.peak * (step + 1) as f32 / self.warmup as f32;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        let floor = self.min_ratio as f64;
        (self.peak as f64 * (floor + (1.0 - floor) * cos)) as f32
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TokenizerKind {
    Gpt2,
    Byte,
}

impl TokenizerKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gpt2" | "r50k" => Some(TokenizerKind::Gpt2),
            "byte" | "bytes" => Some(TokenizerKind::Byte),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TokenizerKind::Gpt2 => "gpt2",
            TokenizerKind::Byte => "byte",
        }
    }
    /// Tokens it can emit.
    pub fn vocab_real(self) -> usize {
        match self {
            TokenizerKind::Gpt2 => crate::config::GPT2_VOCAB,
            TokenizerKind::Byte => 256,
        }
    }
    /// Embedding rows to allocate (padded to a multiple of 64).
    pub fn vocab_padded(self) -> usize {
        self.vocab_real().div_ceil(64) * 64
    }
}
