//! `--stage-layers`: how a run cuts the model's blocks into pipeline
//! stages (even, balanced by FLOPs, balanced within a card size, or listed),
//! and the line a run's start says of it.

use anyhow::{Context, Result, bail};
use iota_core::{ModelConfig, StageSpec};
use iota_protocol::RunConfig;

/// How the run cuts the model into stages, when that is worth a line:
/// a split other than the even one, or an even one whose slowest stage
/// `--stage-layers balanced` would make at least a tenth faster (by
/// FLOPs: with a card per miner, the pipeline's pace).
pub fn stage_note(asked: &str, cfg: &RunConfig) -> Option<String> {
    use iota_core::compute_plan::{balanced_with_imbalance, stage_imbalance};
    let (model, stages, seq) = (&cfg.train.model, cfg.train.stages, cfg.train.seq);
    let now = stage_imbalance(model, stages, seq)?;
    let list = |v: &[usize]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",");
    if let Some(v) = &model.stage_layers {
        return Some(format!(
            "blocks per stage: {} (--stage-layers {}): the slowest stage's step is {now:.2}x the stages' mean",
            list(v),
            asked
        ));
    }
    let (balanced, better) = balanced_with_imbalance(model, stages, seq)?;
    (better * 1.1 <= now).then(|| {
        format!(
            "blocks per stage: {} (even): the slowest stage's step is {now:.2}x the stages' mean; \
             --stage-layers balanced ({}) would make it {better:.2}x, where each miner has a card of its own",
            list(&iota_core::layout::even_layers(model.n_layers, stages)),
            list(&balanced)
        )
    })
}

/// `--stage-layers` for `stages` stages of `model` at micro-batches of
/// `batch` x `seq`, a head or body miner holding `held` at once: None for
/// the even split (however it was asked for, so the run id is the even
/// split's).
pub fn stage_layers(
    arg: &str,
    model: &ModelConfig,
    stages: usize,
    (batch, seq, held): (usize, usize, usize),
) -> Result<Option<Vec<usize>>> {
    use iota_core::compute_plan::balanced_stage_layers_within;
    let out_of_range = || format!("--stages {stages} must be between 1 and the model's {} layers", model.n_layers);
    if stages == 0 || stages > model.n_layers {
        bail!("{}", out_of_range());
    }
    let counts = match arg.split_once(':') {
        _ if arg == "even" => return Ok(None),
        _ if arg == "balanced" => {
            balanced_stage_layers_within(model, stages, seq, &|_, _| true).context(out_of_range())?
        }
        Some(("balanced", gib)) => {
            let card =
                gib.parse::<f64>().ok().filter(|g| g.is_finite() && *g > 0.0 && *g <= 1e6).with_context(|| {
                    format!("--stage-layers {arg}: balanced:GIB takes a card size in GiB, such as 16")
                })?;
            let fits = |i: usize, n: usize| stage_fits(model, stages, (i, n), (batch, seq, held), card);
            balanced_stage_layers_within(model, stages, seq, &fits).with_context(|| {
                format!(
                    "--stage-layers {arg}: no split of `{}`'s {} blocks into {stages} stages fits {card} GiB cards \
                     at batch {batch} x seq {seq} with {held} micro-batch(es) held, even recomputing activations \
                     (iota-bench scale --plan-only shows what each stage needs)",
                    model.name, model.n_layers
                )
            })?
        }
        None => {
            let counts = arg
                .split(',')
                .map(|n| n.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .ok()
                .filter(|v| !v.contains(&0))
                .with_context(|| {
                    format!(
                        "--stage-layers '{arg}': even, balanced, balanced:GIB or blocks per stage such as 7,7,2 \
                         (each >= 1)"
                    )
                })?;
            if counts.len() != stages || iota_core::config::checked_total(&counts) != Some(model.n_layers) {
                bail!(
                    "--stage-layers {arg}: {} stage(s) adding up to {} blocks, but the run has --stages {stages} and \
                     `{}` has {} layers",
                    counts.len(),
                    counts.iter().fold(0usize, |a, n| a.saturating_add(*n)),
                    model.name,
                    model.n_layers
                );
            }
            counts
        }
        Some(_) => bail!("--stage-layers '{arg}': even, balanced, balanced:GIB or blocks per stage such as 7,7,2"),
    };
    Ok((counts != iota_core::layout::even_layers(model.n_layers, stages)).then_some(counts))
}

/// Whether stage `i` of `stages` holding `n` blocks fits a card of
/// `card_gib` on a CUDA miner with bf16 GEMMs, holding `held` micro-batches
/// (the run's in-flight limit per replica: fewer would slow the pipeline
/// the split is meant to speed up), recomputing activations where keeping
/// them does not fit (as such a miner runs), under AdamW's or Muon's state,
/// whichever is larger.
fn stage_fits(
    model: &ModelConfig,
    stages: usize,
    (i, n): (usize, usize),
    (batch, seq, held): (usize, usize, usize),
    card_gib: f64,
) -> bool {
    use iota_core::memory_plan::{ComputeBackend, InnerOptimizer, Workload, stage_memory};
    let spec = StageSpec::sized(model, i, stages, n);
    let room = iota_core::memory_fit::usable((card_gib * (1u64 << 30) as f64) as u64);
    [InnerOptimizer::AdamW, InnerOptimizer::Muon].into_iter().all(|optimizer| {
        let w = Workload { optimizer, ..Workload::of(ComputeBackend::CudaBf16Gemm, batch, seq, held.max(1)) };
        [false, true].into_iter().any(|r| stage_memory(model, &spec, &w.recomputing(r)).required_peak() <= room)
    })
}
