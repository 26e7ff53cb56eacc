//! `iota eval`: a model's loss and perplexity on text, through the same
//! stage forward (and wire codec at stage boundaries) as training, so
//! `--split val` reproduces the validation loss `iota train` reports.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use iota_core::WireCodec;
use iota_model::CpuBackend;
use iota_model::data::{Corpus, Tokenizer, load_tokens, synthetic};
use iota_model::hf::{ModelSource, ModelWeights};
use iota_model::train::Pipeline;

use crate::args::{BoundaryCodec, EvalArgs, EvalSplit};
use crate::run_settings::{recorded_data, run_dir_of};

/// The tokens to measure on: --data, or the corpus a trainer run recorded.
fn eval_tokens_source(a: &EvalArgs, w: &ModelWeights, tok: &Tokenizer) -> Result<(Vec<u32>, String)> {
    if let Some(p) = &a.data {
        return Ok((load_tokens(p, tok)?, p.display().to_string()));
    }
    if let ModelSource::Checkpoint(ckpt) = ModelSource::resolve(&a.model)? {
        let run = run_dir_of(&ckpt);
        if let Some(d) = recorded_data(&run)? {
            return Ok(match d.path {
                Some(p) => (load_tokens(&p, tok)?, p.display().to_string()),
                // The trainer's generated toy corpus, from the run's seed.
                None => (tok.encode(&synthetic::grammar_text(w.train.seed, 2_000_000)), "the generated corpus".into()),
            });
        }
    }
    bail!("give --data FILE: {} does not record the corpus it trained on", a.model.display())
}

/// `iota eval`.
pub fn eval(a: EvalArgs) -> Result<()> {
    if let Some(t) = a.threads {
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global().context("setting the thread count")?;
    }
    let w = ModelWeights::load(&a.model)?;
    let mut train = w.train.clone();
    if let Some(b) = a.batch {
        train.batch = b;
    }
    if let Some(s) = a.seq {
        train.seq = s;
    }
    if a.boundary_codec == BoundaryCodec::None {
        train.codec = WireCodec::F32;
    }
    train.validate()?;
    let tok = Tokenizer::new(train.tokenizer)?;
    let (tokens, source) = eval_tokens_source(&a, &w, &tok)?;
    let mut p = Pipeline::new(Arc::new(CpuBackend::new()), train.clone())?;
    for (stage, params) in p.stages_mut().iter_mut().zip(w.stage_params()?) {
        stage.set_params(&params)?;
    }
    let (batch, seq) = (train.batch, train.seq);
    // The batches to run, as (inputs, targets).
    let batches: Vec<(Vec<u32>, Vec<u32>)> = match a.split {
        EvalSplit::Val => {
            let corpus = Corpus::new(tokens, seq, 64, 0.02).map_err(anyhow::Error::msg)?;
            (0..a.batches.unwrap_or(4)).map(|i| corpus.val_batch(train.seed, i, batch, seq)).collect()
        }
        EvalSplit::All => {
            let windows = tokens.len().saturating_sub(1) / seq;
            if windows == 0 {
                bail!("{source} has {} tokens; --seq {seq} needs at least {}", tokens.len(), seq + 1);
            }
            let limit = a.batches.map_or(usize::MAX, |b| b as usize);
            (0..windows)
                .step_by(batch)
                .take(limit)
                .map(|first| {
                    let rows = batch.min(windows - first);
                    let (mut x, mut y) = (Vec::with_capacity(rows * seq), Vec::with_capacity(rows * seq));
                    for r in first..first + rows {
                        x.extend_from_slice(&tokens[r * seq..(r + 1) * seq]);
                        y.extend_from_slice(&tokens[r * seq + 1..(r + 1) * seq + 1]);
                    }
                    (x, y)
                })
                .collect()
        }
    };
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::new(batches.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(ProgressStyle::with_template("eval [{bar:30}] {pos}/{len} batches | {msg}")?.progress_chars("=> "));
    let t0 = Instant::now();
    let (mut sum, mut count) = (0f64, 0usize);
    for (i, (x, y)) in batches.iter().enumerate() {
        let losses = p.eval_tokens(x, y, u64::MAX - i as u64)?;
        sum += losses.iter().map(|&l| f64::from(l)).sum::<f64>();
        count += losses.len();
        bar.inc(1);
        bar.set_message(format!("loss {:.4}", sum / count as f64));
    }
    bar.finish_and_clear();
    let loss = sum / count.max(1) as f64;
    let split = match a.split {
        EvalSplit::All => "all",
        EvalSplit::Val => "val",
    };
    if a.json {
        let out = serde_json::json!({
            "loss": loss, "perplexity": loss.exp(), "tokens": count, "batches": batches.len(),
            "split": split, "data": source, "boundary_codec": train.codec.name(),
            "seconds": t0.elapsed().as_secs_f64(),
        });
        println!("{out}");
    } else {
        println!(
            "loss {loss:.4} nats/token, perplexity {:.2}, over {count} tokens ({} batches, split {split}) of {source} in {:.1}s",
            loss.exp(),
            batches.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
