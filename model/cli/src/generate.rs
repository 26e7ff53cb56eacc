//! `iota generate` and `iota logits`: a trained model, token by token.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use iota_core::Rng;
use iota_model::data::Tokenizer;
use iota_model::hf::ModelWeights;
use iota_model::infer::{Llama, SamplerConfig, sample};

use crate::args::{BoundaryCodec, GenerateArgs, LogitsArgs};

fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(t) = threads {
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global().context("setting the thread count")?;
    }
    Ok(())
}

/// Loads the model at `path` for token-by-token use, with its tokenizer.
pub fn open(path: &std::path::Path, codec: BoundaryCodec) -> Result<(Llama, Tokenizer, ModelWeights)> {
    let w = ModelWeights::load(path)?;
    let tok = Tokenizer::new(w.train.tokenizer)?;
    let m = Llama::new(&w, codec == BoundaryCodec::None)?;
    Ok((m, tok, w))
}

/// The prompt's tokens; an empty prompt starts a new document (after the
/// end-of-text token, or a newline for the byte tokenizer).
fn prompt_tokens(tok: &Tokenizer, prompt: &str) -> Vec<u32> {
    if prompt.is_empty() {
        return match tok.eot() {
            Some(eot) => vec![eot],
            None => tok.encode("\n"),
        };
    }
    tok.encode(prompt)
}

/// Writes the longest complete UTF-8 prefix of `pending` and keeps the rest
/// (a token may end inside a character).
fn flush_utf8(out: &mut impl Write, pending: &mut Vec<u8>) -> Result<()> {
    let valid = match std::str::from_utf8(pending) {
        Ok(s) => s.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        // Bytes that can never become a character: show them replaced.
        Err(_) => {
            out.write_all(String::from_utf8_lossy(pending).as_bytes())?;
            pending.clear();
            return Ok(());
        }
    };
    out.write_all(&pending[..valid])?;
    pending.drain(..valid);
    out.flush()?;
    Ok(())
}

/// `iota generate`.
pub fn generate(a: GenerateArgs) -> Result<()> {
    set_threads(a.threads)?;
    let sampler = SamplerConfig { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p };
    sampler.validate().map_err(anyhow::Error::msg)?;
    let (m, tok, w) = open(&a.model, a.boundary_codec)?;
    let prompt = prompt_tokens(&tok, &a.prompt);
    if prompt.len() >= m.cfg.max_seq {
        bail!("the prompt has {} tokens; the model's context is {}", prompt.len(), m.cfg.max_seq);
    }
    eprintln!(
        "model: {} ({:.1}M parameters, {} stage(s){}){}",
        w.train.model.name,
        w.param_count() as f64 / 1e6,
        w.train.stages,
        if w.has_bottleneck() { format!(", bottleneck {}", w.train.model.bottleneck) } else { String::new() },
        w.provenance.trained_for.as_ref().map_or(String::new(), |t| format!(", trained for {t}"))
    );
    let mut cache = m.new_cache();
    let mut logits = Vec::new();
    for &t in &prompt {
        logits = m.step(&mut cache, t)?;
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    out.write_all(a.prompt.as_bytes())?;
    out.flush()?;
    let mut rng = Rng::new(a.seed);
    let mut pending = Vec::new();
    let t0 = Instant::now();
    let mut generated = 0usize;
    let mut why = "the token limit";
    for _ in 0..a.max_tokens {
        let next = sample(&logits, &sampler, &mut rng);
        generated += 1;
        if Some(next) == tok.eot() && !a.ignore_eos {
            why = "the end-of-text token";
            break;
        }
        pending.extend(tok.decode_bytes(&[next]));
        flush_utf8(&mut out, &mut pending)?;
        if cache.len() >= m.cfg.max_seq {
            why = "the model's context length";
            break;
        }
        logits = m.step(&mut cache, next)?;
    }
    out.write_all(String::from_utf8_lossy(&pending).as_bytes())?;
    writeln!(out)?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("{generated} tokens in {secs:.2}s ({:.1} tokens/s); stopped at {why}", generated as f64 / secs.max(1e-9));
    Ok(())
}

/// `iota logits`.
pub fn logits(a: LogitsArgs) -> Result<()> {
    let (m, tok, _) = open(&a.model, a.boundary_codec)?;
    let tokens = match &a.prompt {
        Some(p) => tok.encode(p),
        None => a.tokens.clone(),
    };
    if tokens.is_empty() {
        bail!("give --tokens or a non-empty --prompt");
    }
    let mut cache = m.new_cache();
    let rows = tokens.iter().map(|&t| m.step(&mut cache, t)).collect::<Result<Vec<_>>>()?;
    let out = serde_json::json!({ "tokens": tokens, "logits": rows });
    println!("{out}");
    Ok(())
}
