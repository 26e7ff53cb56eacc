//! `iota`: the single-process trainer and model tools.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use iota_core::codec::boundary_cost;
use iota_core::config::PRESETS;
use iota_core::{ModelConfig, WireCodec};
use iota_cuda::ComputeDevice;
use iota_cuda::backend::GemmPrecision;
use iota_model::data::{Corpus, TokenizerKind, load_tokens, synthetic};
use iota_model::optim::{AdamWConfig, LrSchedule};
use iota_model::train::{Pipeline, TrainConfig};
use iota_model::{Backend, CpuBackend};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "iota", version, about = "iota-rs: pipeline-parallel LLM pre-training, single-process tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once
enum Cmd {
    /// Train a model in one process, optionally split into pipeline stages
    /// (every stage boundary goes through the bottleneck and wire codec, as in
    /// a swarm). Writes loss.csv and safetensors checkpoints to --out.
    Train(TrainArgs),
    /// List the model presets: parameter counts, shapes, and the bytes per
    /// token that cross a stage boundary with each codec.
    Presets {
        /// Also print per-stage parameter counts for this many stages.
        #[arg(long, default_value_t = 3)]
        stages: usize,
    },
}

#[derive(Args)]
struct TrainArgs {
    /// Model preset (tiny, small, 125m, 1b, 1.5b, 15b) or a JSON file holding a ModelConfig.
    #[arg(long, default_value = "small")]
    config: String,
    /// Training corpus: a UTF-8 text file, JSON-lines with a "text" field (.jsonl),
    /// uint16 token shards (.bin, raw or llm.c header), or a directory of .bin shards.
    /// Without it, a generated toy corpus is used.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Tokenizer: gpt2 (BPE, offline), byte, or auto (byte for tiny, gpt2 otherwise).
    #[arg(long, default_value = "auto")]
    tokenizer: String,
    /// Optimizer steps to reach (a resumed run continues up to this step).
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Tokens per sequence (default: 128, or the model's max_seq if smaller).
    #[arg(long)]
    seq: Option<usize>,
    /// Micro-batches accumulated per optimizer step.
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Peak learning rate (linear warm-up, then cosine decay to --min-lr-ratio x peak).
    #[arg(long, default_value_t = 2e-3)]
    lr: f32,
    /// Warm-up steps (default: 5% of --steps, at most 100).
    #[arg(long)]
    warmup: Option<u64>,
    #[arg(long, default_value_t = 0.1)]
    min_lr_ratio: f32,
    /// Decoupled AdamW weight decay (matrices only, never norm gains).
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f32,
    /// Clip each stage's gradient L2 norm to this (0 = off).
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f32,
    /// Pipeline stages to split the model into (run in this one process).
    #[arg(long, default_value_t = 1)]
    stages: usize,
    /// Wire codec at stage boundaries: int8, int4, bf16 or f32.
    #[arg(long, default_value = "int8")]
    codec: String,
    /// Bottleneck width at stage boundaries (default: the preset's; 0 = off,
    /// the full residual crosses).
    #[arg(long)]
    bottleneck: Option<usize>,
    /// Seed of initialisation and data order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Run directory: loss.csv and checkpoints go here.
    #[arg(long, default_value = "runs/train")]
    out: PathBuf,
    /// Resume from a checkpoint folder or a run directory (its LATEST checkpoint).
    /// The model and trainer settings come from the checkpoint.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Evaluate validation loss every N steps (0 = only at the end).
    #[arg(long, default_value_t = 50)]
    eval_every: u64,
    /// Validation batches per evaluation.
    #[arg(long, default_value_t = 4)]
    eval_batches: u64,
    /// Write a checkpoint every N steps (0 = only at the end; Ctrl-C also saves).
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Compute device: cpu (the fp32 reference), cuda (GPU 0) or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: ComputeDevice,
    /// Precision of the linear layers' GEMMs on CUDA: bf16 (cuBLASLt, bf16
    /// operands, fp32 accumulation; fast) or fp32 (cuBLAS sgemm; matches the
    /// CPU reference). Weights, activations and optimizer state stay fp32.
    #[arg(long, default_value = "bf16", value_parser = parse_gemm)]
    gemm: GemmPrecision,
    /// When stderr is not a terminal, print a progress line every N steps.
    #[arg(long, default_value_t = 10)]
    log_every: u64,
}

fn main() {
    iota_model::alloc::keep_freed_memory();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Train(a) => train(a),
        Cmd::Presets { stages } => presets(stages),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

fn presets(stages: usize) -> Result<()> {
    println!(
        "{:<6} {:>15} {:>5} {:>6} {:>6} {:>6} {:>7} {:>4} | {:>9} {:>9} {:>9} | per-stage params ({stages} stages)",
        "preset", "params", "d", "layers", "heads", "ffn", "vocab", "b", "bf16 B/t", "int8", "int4"
    );
    for name in PRESETS {
        let c = ModelConfig::preset(name)?;
        let cost = |codec| boundary_cost(c.d_model, c.bottleneck, codec);
        let (i8c, i4c) = (cost(WireCodec::Int8Row), cost(WireCodec::Int4Row));
        let per_stage = c
            .stage_param_counts(stages.min(c.n_layers).max(1))?
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(" / ");
        println!(
            "{:<6} {:>15} {:>5} {:>6} {:>6} {:>6} {:>7} {:>4} | {:>9} {:>4}B {:>4.0}x {:>4}B {:>4.0}x | {}",
            name,
            c.param_count(),
            c.d_model,
            c.n_layers,
            format!("{}/{}", c.n_heads, c.n_kv_heads),
            c.ffn_hidden,
            c.vocab_size,
            c.bottleneck,
            2 * c.d_model,
            i8c.bytes_per_token,
            i8c.ratio,
            i4c.bytes_per_token,
            i4c.ratio,
            per_stage
        );
    }
    println!(
        "B/t: bytes per token crossing a stage boundary (one direction); ratio against the bf16 d-wide hidden state."
    );
    Ok(())
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

fn build_config(a: &TrainArgs) -> Result<TrainConfig> {
    let mut model = model_config(&a.config)?;
    let tokenizer = match a.tokenizer.as_str() {
        "auto" if model.vocab_real <= 256 => TokenizerKind::Byte,
        "auto" => TokenizerKind::Gpt2,
        other => {
            TokenizerKind::parse(other).with_context(|| format!("unknown tokenizer '{other}' (gpt2, byte, auto)"))?
        }
    };
    // The embedding follows the tokenizer.
    model.vocab_real = tokenizer.vocab_real();
    model.vocab_size = tokenizer.vocab_padded();
    if let Some(b) = a.bottleneck {
        model.bottleneck = b;
    }
    let codec =
        WireCodec::parse(&a.codec).with_context(|| format!("unknown codec '{}' (int8, int4, bf16, f32)", a.codec))?;
    let warmup = a.warmup.unwrap_or((a.steps / 20).clamp(1, 100));
    let seq = a.seq.unwrap_or(model.max_seq.min(128));
    let cfg = TrainConfig {
        model,
        tokenizer,
        stages: a.stages,
        batch: a.batch,
        seq,
        grad_accum: a.grad_accum,
        steps: a.steps,
        schedule: LrSchedule { peak: a.lr, warmup, total: a.steps, min_ratio: a.min_lr_ratio },
        adamw: AdamWConfig { weight_decay: a.weight_decay, grad_clip: a.grad_clip, ..AdamWConfig::default() },
        codec,
        seed: a.seed,
    };
    cfg.validate()?;
    Ok(cfg)
}

fn load_corpus(a: &TrainArgs, cfg: &TrainConfig) -> Result<Corpus> {
    let tok = iota_model::data::Tokenizer::new(cfg.tokenizer)?;
    let t0 = Instant::now();
    let tokens = match &a.data {
        Some(p) => load_tokens(p, &tok)?,
        None => {
            eprintln!("note: no --data given; training on a generated toy corpus");
            tok.encode(&synthetic::grammar_text(cfg.seed, 2_000_000))
        }
    };
    let corpus = Corpus::new(tokens, cfg.seq, 64, 0.02).map_err(anyhow::Error::msg)?;
    eprintln!(
        "data: {} training + {} validation tokens ({} tokenizer, {} shards) in {:.1}s",
        corpus.train_tokens(),
        corpus.val_tokens(),
        cfg.tokenizer.name(),
        corpus.num_shards(),
        t0.elapsed().as_secs_f64()
    );
    Ok(corpus)
}

fn parse_gemm(s: &str) -> Result<GemmPrecision, String> {
    GemmPrecision::parse(s).ok_or_else(|| format!("unknown GEMM precision '{s}' (bf16, fp32)"))
}

fn train(a: TrainArgs) -> Result<()> {
    if let Some(t) = a.threads {
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global().context("setting the thread count")?;
    }
    match a.device {
        ComputeDevice::Cpu => train_on(Arc::new(CpuBackend::new()), a),
        ComputeDevice::Cuda(i) => {
            let be = iota_cuda::open_backend(i, a.gemm).with_context(|| format!("opening {}", a.device))?;
            train_on(Arc::new(be), a)
        }
    }
}

fn train_on<B: Backend + 'static>(be: Arc<B>, a: TrainArgs) -> Result<()> {
    let mut pipe = match &a.resume {
        Some(path) => {
            let mut p =
                Pipeline::load(be.clone(), path).with_context(|| format!("resuming from {}", path.display()))?;
            p.cfg.steps = p.cfg.steps.max(a.steps);
            eprintln!("resumed at step {} from {}", p.step_count(), path.display());
            p
        }
        None => Pipeline::new(be.clone(), build_config(&a)?)?,
    };
    let cfg = pipe.cfg.clone();
    let corpus = load_corpus(&a, &cfg)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let csv_path = a.out.join("loss.csv");
    let mut csv = open_csv(&csv_path, a.resume.is_some())?;
    let m = &cfg.model;
    eprintln!(
        "model: {} ({} params, d={}, {} layers) in {} stage(s), bottleneck {}, codec {}, backend {}",
        m.name,
        pipe.param_count(),
        m.d_model,
        m.n_layers,
        cfg.stages,
        if cfg.stages > 1 && m.bottleneck > 0 { m.bottleneck.to_string() } else { "off".into() },
        cfg.codec.name(),
        be.name()
    );

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    }
    let tty = std::io::stderr().is_terminal();
    let bar = if tty { ProgressBar::new(cfg.steps) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")?.progress_chars("=> "),
    );
    bar.set_position(pipe.step_count());

    let start = Instant::now();
    let start_step = pipe.step_count();
    let mut tokens_done = 0usize;
    let mut last = None;
    let mut val = None;
    while pipe.step_count() < cfg.steps {
        if stop.load(Ordering::SeqCst) {
            bar.abandon_with_message("interrupted");
            eprintln!("interrupted at step {}: saving a checkpoint", pipe.step_count());
            break;
        }
        let t0 = Instant::now();
        let r = pipe.train_step(&corpus)?;
        tokens_done += r.tokens;
        let tps = r.tokens as f64 / t0.elapsed().as_secs_f64();
        let step = pipe.step_count();
        if !r.skipped.is_empty() {
            eprintln!(
                "warning: step {}: non-finite gradient in stage(s) {:?}; their update was skipped",
                r.step, r.skipped
            );
        }
        let eval_now = (a.eval_every > 0 && step % a.eval_every == 0) || step == cfg.steps;
        val = if eval_now { Some(pipe.eval(&corpus, a.eval_batches)?) } else { None };
        let gnorm = r.grad_norms.iter().map(|g| g * g).sum::<f32>().sqrt();
        writeln!(
            csv,
            "{},{:.6},{},{:.6e},{:.4},{:.1},{:.2}",
            r.step,
            r.loss,
            val.map_or(String::new(), |v| format!("{v:.6}")),
            r.lr,
            gnorm,
            tps,
            r.wire_bytes as f64 / r.tokens as f64
        )?;
        let msg = format!(
            "loss {:.3}{} | {:.0} tok/s | lr {:.2e}",
            r.loss,
            val.map_or(String::new(), |v| format!(" (val {v:.3})")),
            tps,
            r.lr
        );
        bar.set_position(step);
        bar.set_message(msg.clone());
        if !tty && (step % a.log_every.max(1) == 0 || step == cfg.steps || eval_now) {
            eprintln!("step {step}/{}: {msg}", cfg.steps);
        }
        if a.checkpoint_every > 0 && step % a.checkpoint_every == 0 && step < cfg.steps {
            pipe.save(&a.out, 2)?;
        }
        last = Some(r);
    }
    bar.finish_and_clear();
    csv.flush()?;
    let ckpt = pipe.save(&a.out, 2)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "trained steps {}..{} in {:.1}s ({:.0} tokens/s)",
        start_step,
        pipe.step_count(),
        secs,
        tokens_done as f64 / secs
    );
    if let Some(r) = last {
        println!(
            "final train loss {:.4}{}",
            r.loss,
            val.map_or(String::new(), |v| format!(", validation loss {v:.4}"))
        );
    }
    println!("loss log:   {}", csv_path.display());
    println!("checkpoint: {}", ckpt.display());
    if stop.load(Ordering::SeqCst) {
        println!("resume with: iota train --resume {}", a.out.display());
    }
    Ok(())
}

fn open_csv(path: &Path, append: bool) -> Result<std::io::BufWriter<std::fs::File>> {
    let exists = path.exists();
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(append)
        .write(true)
        .truncate(!append)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    if !(append && exists) {
        writeln!(w, "step,train_loss,val_loss,lr,grad_norm,tokens_per_s,wire_bytes_per_token")?;
    }
    Ok(w)
}
