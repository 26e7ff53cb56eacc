//! `iota train`: the single-process trainer on the CPU or a GPU, with a
//! progress bar, a loss log and checkpoints.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use iota_cuda::ComputeDevice;
use iota_model::data::{Corpus, load_tokens, synthetic};
use iota_model::run_dir::{self, Claim};
use iota_model::train::{Pipeline, TrainConfig};
use iota_model::{Backend, CpuBackend};

use crate::args::TrainArgs;
use crate::run_settings::{DataSource, RUN_FILES, check_resume_flags, recorded_data, run_dir_of, settings};

/// Loads the corpus at `path` (or the generated toy corpus) as the trainer
/// addresses it.
fn load_corpus(path: Option<&Path>, cfg: &TrainConfig) -> Result<(Corpus, DataSource)> {
    let tok = iota_model::data::Tokenizer::new(cfg.tokenizer)?;
    let t0 = Instant::now();
    let tokens = match path {
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
    let path =
        path.map(|p| std::fs::canonicalize(p).with_context(|| format!("cannot read {}", p.display()))).transpose()?;
    let source = DataSource { path, id: corpus.id().clone() };
    Ok((corpus, source))
}

/// A new run in `--out` (default `runs/train`), which must not hold another.
fn start<B: Backend>(be: Arc<B>, a: &TrainArgs) -> Result<(Pipeline<B>, Corpus, PathBuf)> {
    let cfg = a.train_config()?;
    if a.optimizer == "auto" {
        eprintln!("{}", cfg.auto_optimizer_note(1));
    }
    let (corpus, data) = load_corpus(a.data.as_deref(), &cfg)?;
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("runs/train"));
    match run_dir::claim(&out, &settings(&cfg, &data)?, RUN_FILES, a.new_run)? {
        Claim::Fresh => {}
        Claim::Archived(to) => eprintln!("note: the previous run in {} moved into {}", out.display(), to.display()),
        Claim::Same => bail!(
            "{} already holds this run; continue it with --resume {}, or pass --new-run to start it over (the old files move into {}/archive-N)",
            out.display(),
            out.display(),
            out.display()
        ),
    }
    Ok((Pipeline::new(be, cfg)?, corpus, out))
}

/// Continues the run of checkpoint `path` with its own settings and corpus;
/// writes into its run directory unless `--out` says otherwise.
fn resume<B: Backend>(be: Arc<B>, a: &TrainArgs, path: &Path) -> Result<(Pipeline<B>, Corpus, PathBuf)> {
    let mut p = Pipeline::load(be, path).with_context(|| format!("resuming from {}", path.display()))?;
    check_resume_flags(a, &p.cfg)?;
    let from = run_dir_of(path);
    let recorded = recorded_data(&from)?;
    let data_path = a.data.clone().or_else(|| recorded.as_ref().and_then(|d| d.path.clone()));
    let (corpus, data) = load_corpus(data_path.as_deref(), &p.cfg)?;
    if let Some(r) = &recorded
        && r.id != data.id
    {
        bail!(
            "the corpus loaded ({} tokens, blake3 {}) is not the one this run trained on ({} tokens, blake3 {}{})",
            data.id.tokens,
            &data.id.blake3[..16],
            r.id.tokens,
            &r.id.blake3[..16],
            r.path.as_ref().map_or(String::new(), |p| format!(", from {}", p.display()))
        );
    }
    let out = a.out.clone().unwrap_or_else(|| from.clone());
    // A run written before run directories recorded their settings adopts
    // them now; any other directory must hold this run or none.
    let adopt = run_dir::read_settings(&out)?.is_none() && same_dir(&out, &from);
    let run_files = if adopt { &[][..] } else { RUN_FILES };
    if let Claim::Archived(to) = run_dir::claim(&out, &settings(&p.cfg, &data)?, run_files, a.new_run)? {
        eprintln!("note: the previous run in {} moved into {}", out.display(), to.display());
    }
    p.cfg.steps = p.cfg.steps.max(a.steps);
    eprintln!("resumed at step {} from {}", p.step_count(), path.display());
    Ok((p, corpus, out))
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// `iota train`.
pub fn train(a: TrainArgs) -> Result<()> {
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
    let (mut pipe, corpus, out) = match &a.resume {
        Some(path) => resume(be.clone(), &a, path)?,
        None => start(be.clone(), &a)?,
    };
    let cfg = pipe.cfg.clone();
    let csv_path = out.join("loss.csv");
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
            pipe.save(&out, 2)?;
        }
        last = Some(r);
    }
    bar.finish_and_clear();
    csv.flush()?;
    let ckpt = pipe.save(&out, 2)?;
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
        println!("resume with: iota train --resume {}", out.display());
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
