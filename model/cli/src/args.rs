//! The `iota` command line: what each command and flag means (`--help`
//! prints these doc comments).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use iota_core::{BottleneckStyle, ModelConfig, WireCodec};
use iota_cuda::ComputeDevice;
use iota_cuda::backend::GemmPrecision;
use iota_model::data::TokenizerKind;
use iota_model::optim::{AdamWConfig, LrSchedule};
use iota_model::train::TrainConfig;

#[derive(Parser)]
#[command(name = "iota", version, about = "iota-rs: pipeline-parallel LLM pre-training, single-process tools")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once
pub enum Cmd {
    /// Train a model in one process, optionally split into pipeline stages
    /// (every stage boundary goes through the bottleneck and wire codec, as in
    /// a swarm). Writes loss.csv and safetensors checkpoints to --out.
    Train(TrainArgs),
    /// Sample text from a trained model, streaming tokens to the terminal
    /// (a KV cache makes each new token cost one step). MODEL is an exported
    /// folder, a swarm run directory (its model/), or a trainer checkpoint or
    /// run directory.
    Generate(GenerateArgs),
    /// Measure a model's loss and perplexity on a text file: the whole file
    /// (--split all), or the validation windows `iota train` reports on
    /// (--split val, with the file the run trained on).
    Eval(EvalArgs),
    /// Write a model as a Hugging Face Llama folder (config.json,
    /// safetensors, tokenizer files, a model card). Refuses a destination
    /// that is not empty.
    Export(ExportArgs),
    /// Print a model's next-token logits at every position of a prompt, as
    /// JSON (to compare with another implementation of the same model).
    Logits(LogitsArgs),
    /// List the model presets: parameter counts, shapes, and the bytes per
    /// token that cross a stage boundary with each codec.
    Presets {
        /// Also print per-stage parameter counts for this many stages.
        #[arg(long, default_value_t = 3)]
        stages: usize,
    },
}

#[derive(Args)]
pub struct TrainArgs {
    /// Model preset (tiny, small, 125m, 1b, 1.5b, 15b) or a JSON file holding a ModelConfig.
    #[arg(long, default_value = "small")]
    pub config: String,
    /// Training corpus: a UTF-8 text file, JSON-lines with a "text" field (.jsonl),
    /// uint16 token shards (.bin, raw or llm.c header), or a directory of .bin shards.
    /// Without it, a generated toy corpus is used.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Tokenizer: gpt2 (BPE, offline), byte, or auto (byte for tiny, gpt2 otherwise).
    #[arg(long, default_value = "auto")]
    pub tokenizer: String,
    /// Optimizer steps to reach (a resumed run continues up to this step).
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence (default: 128, or the model's max_seq if smaller).
    #[arg(long)]
    pub seq: Option<usize>,
    /// Micro-batches accumulated per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Peak learning rate (linear warm-up, then cosine decay to --min-lr-ratio x peak).
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f32,
    /// Warm-up steps (default: 5% of --steps, at most 100).
    #[arg(long)]
    pub warmup: Option<u64>,
    #[arg(long, default_value_t = 0.1)]
    pub min_lr_ratio: f32,
    /// Decoupled AdamW weight decay (matrices only, never norm gains).
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f32,
    /// Clip each stage's gradient L2 norm to this (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f32,
    /// Optimizer: auto, adamw, nadam (Adam with a Nesterov look-ahead on
    /// the first moment), or muon (the blocks' matrices take Muon's
    /// orthogonalised momentum, scaled to AdamW's step size; embeddings,
    /// LM head and norms keep AdamW). auto: Muon where its Newton-Schulz
    /// steps add at most 10% to a step (counted from the model and the
    /// tokens per step), else AdamW; the first lines say which and why.
    #[arg(long, default_value = "auto")]
    pub optimizer: String,
    /// beta1 of each stage, head first, comma-separated (a shorter list
    /// repeats its last value; default 0.9 everywhere).
    #[arg(long, value_delimiter = ',')]
    pub stage_beta1: Vec<f32>,
    /// Pipeline stages to split the model into (run in this one process).
    #[arg(long, default_value_t = 1)]
    pub stages: usize,
    /// Wire codec at stage boundaries: int8, int4, bf16 or f32.
    #[arg(long, default_value = "int8")]
    pub codec: String,
    /// Bottleneck width at stage boundaries (default: the preset's; 0 = off,
    /// the full residual crosses).
    #[arg(long)]
    pub bottleneck: Option<usize>,
    /// Bottleneck style: linear (the default: identity path plus linear
    /// projections) or residual (plus a SwiGLU branch in the encoder and the
    /// decoder; docs/ARCHITECTURE.md, "The bottleneck").
    #[arg(long)]
    pub bottleneck_style: Option<String>,
    /// Seed of initialisation and data order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Run directory: loss.csv, checkpoints and run.json (the run's settings)
    /// go here. A directory holding another run is refused (see --new-run).
    /// Default: runs/train, or the run directory being resumed.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Resume from a checkpoint folder or a run directory (its LATEST checkpoint).
    /// The model, trainer settings and corpus come from the run; a flag that
    /// contradicts them is refused. --steps may extend the run.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Evaluate validation loss every N steps (0 = only at the end).
    #[arg(long, default_value_t = 50)]
    pub eval_every: u64,
    /// Validation batches per evaluation.
    #[arg(long, default_value_t = 4)]
    pub eval_batches: u64,
    /// Write a checkpoint every N steps (0 = only at the end; Ctrl-C also saves).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Compute device: cpu (the fp32 reference), cuda (GPU 0) or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: ComputeDevice,
    /// Precision of the linear layers' GEMMs on CUDA: bf16 (cuBLASLt, bf16
    /// operands, fp32 accumulation; fast) or fp32 (cuBLAS sgemm; matches the
    /// CPU reference). Weights, activations and optimizer state stay fp32.
    #[arg(long, default_value = "bf16", value_parser = parse_gemm)]
    pub gemm: GemmPrecision,
    /// When stderr is not a terminal, print a progress line every N steps.
    #[arg(long, default_value_t = 10)]
    pub log_every: u64,
    /// Start a new run in --out even though it holds another one: the old
    /// run's files (loss.csv, checkpoints, LATEST, run.json) move into
    /// OUT/archive-N first. Nothing is deleted.
    #[arg(long)]
    pub new_run: bool,
    /// The flags given on the command line (filled in after parsing): on
    /// --resume, each of these must agree with the checkpoint.
    #[arg(skip)]
    pub explicit: Vec<String>,
}

/// What crosses a stage boundary when using a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BoundaryCodec {
    /// Quantised with the run's wire codec, as in training (the default:
    /// the model the validators and the trainer measured).
    Trained,
    /// Exact: no quantisation (what a plain Llama forward computes).
    None,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// The model: an exported folder, a swarm run directory, or a trainer
    /// checkpoint / run directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Text to continue (default: the start of a new document).
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Tokens to generate (stops early at the end-of-text token or the
    /// model's context length).
    #[arg(long, default_value_t = 100)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy: always the most likely token).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample among the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sample among the most likely tokens that together reach this probability.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Seed of the sampler: the same seed, model and prompt give the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep going past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, value_enum, default_value_t = BoundaryCodec::Trained)]
    pub boundary_codec: BoundaryCodec,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(Args)]
pub struct EvalArgs {
    #[arg(long)]
    pub model: PathBuf,
    /// The text (or token shards) to measure on. Default: the corpus the
    /// run trained on, when the model is a trainer run that recorded it.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// all: every window of the file; val: the trainer's validation windows.
    #[arg(long, value_enum, default_value_t = EvalSplit::All)]
    pub split: EvalSplit,
    /// Batches to measure (default: the whole file for --split all, 4 for
    /// --split val as `iota train` does).
    #[arg(long)]
    pub batches: Option<u64>,
    /// Sequences per batch (default: the run's).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Tokens per sequence (default: the run's).
    #[arg(long)]
    pub seq: Option<usize>,
    #[arg(long, value_enum, default_value_t = BoundaryCodec::Trained)]
    pub boundary_codec: BoundaryCodec,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalSplit {
    All,
    Val,
}

#[derive(Args)]
pub struct ExportArgs {
    #[arg(long)]
    pub model: PathBuf,
    /// The folder to create (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Weight precision: f32 (exact) or bf16 (half the size).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Split the weights into shards of at most this many MB.
    #[arg(long, default_value_t = 5000)]
    pub max_shard_mb: u64,
}

#[derive(Args)]
pub struct LogitsArgs {
    #[arg(long)]
    pub model: PathBuf,
    /// Token ids, comma-separated (or --prompt).
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    pub tokens: Vec<u32>,
    /// Text to tokenize with the model's tokenizer.
    #[arg(long)]
    pub prompt: Option<String>,
    #[arg(long, value_enum, default_value_t = BoundaryCodec::Trained)]
    pub boundary_codec: BoundaryCodec,
}

fn parse_gemm(s: &str) -> Result<GemmPrecision, String> {
    GemmPrecision::parse(s).ok_or_else(|| format!("unknown GEMM precision '{s}' (bf16, fp32)"))
}

fn model_config(spec: &str) -> Result<ModelConfig> {
    if spec.ends_with(".json") {
        let text = std::fs::read_to_string(spec).with_context(|| format!("reading model config {spec}"))?;
        let c: ModelConfig =
            serde_json::from_str(&text).with_context(|| format!("{spec} is not a valid model config"))?;
        c.validate()?;
        return Ok(c);
    }
    Ok(ModelConfig::preset(spec)?)
}

impl TrainArgs {
    /// The run the flags describe.
    pub fn train_config(&self) -> Result<TrainConfig> {
        let a = self;
        let mut model = model_config(&a.config)?;
        let tokenizer = match a.tokenizer.as_str() {
            "auto" if model.vocab_real <= 256 => TokenizerKind::Byte,
            "auto" => TokenizerKind::Gpt2,
            other => TokenizerKind::parse(other)
                .with_context(|| format!("unknown tokenizer '{other}' (gpt2, byte, auto)"))?,
        };
        // The embedding follows the tokenizer.
        model.vocab_real = tokenizer.vocab_real();
        model.vocab_size = tokenizer.vocab_padded();
        if let Some(b) = a.bottleneck {
            model.bottleneck = b;
        }
        if let Some(s) = &a.bottleneck_style {
            model.bottleneck_style = BottleneckStyle::parse(s)
                .with_context(|| format!("unknown bottleneck style '{s}' (linear, residual)"))?;
        }
        let codec = WireCodec::parse(&a.codec)
            .with_context(|| format!("unknown codec '{}' (int8, int4, bf16, f32)", a.codec))?;
        let warmup = a.warmup.unwrap_or((a.steps / 20).clamp(1, 100));
        let seq = a.seq.unwrap_or(model.max_seq.min(128));
        let mut cfg = TrainConfig {
            model,
            tokenizer,
            stages: a.stages,
            batch: a.batch,
            seq,
            grad_accum: a.grad_accum,
            steps: a.steps,
            schedule: LrSchedule { peak: a.lr, warmup, total: a.steps, min_ratio: a.min_lr_ratio },
            adamw: AdamWConfig {
                weight_decay: a.weight_decay,
                grad_clip: a.grad_clip,
                stage_beta1: a.stage_beta1.clone(),
                ..AdamWConfig::default()
            },
            codec,
            seed: a.seed,
        };
        // One process runs every stage in turn: its step is all of them.
        cfg.choose_optimizer(&a.optimizer, 1)?;
        cfg.validate()?;
        Ok(cfg)
    }
}
