//! How the replay's micro-batches cross the replicas' stages: pathways
//! drawn as the orchestrator draws them, and pipelining's delayed
//! gradients (`Variant::Swarm`'s `mixed`, `delay` and `predict`).

use std::collections::VecDeque;

use anyhow::Result;
use iota_core::Rng;
use iota_model::data::Corpus;
use iota_model::train::{Pipeline, accumulate_through_with, micro_batch_id};
use iota_model::{CpuBackend, Stage};

/// Steps of delay per stage for `delay` at the head of `stages`: falling to
/// 0 at the tail (`Variant::Swarm`).
pub(super) fn stage_delays(delay: u64, stages: usize) -> Vec<u64> {
    let last = stages.saturating_sub(1) as u64;
    (0..stages as u64).map(|s| if last == 0 { 0 } else { (delay * (last - s)).div_ceil(last) }).collect()
}

/// Puts into each replica's stages the weights this step's gradient is
/// taken on: their weights of `delays[s]` steps before (as far back as the
/// history since the last merge goes), moved on by that many times the
/// step they had just taken when `predict`. Returns the current weights of
/// the stages it changed, to put back before the optimizer step.
#[allow(clippy::type_complexity, reason = "[replica][stage] weights, some unchanged")]
pub(super) fn delayed_weights(
    replicas: &mut [Pipeline<CpuBackend>],
    history: &mut [VecDeque<Vec<Vec<f32>>>],
    delays: &[u64],
    predict: bool,
) -> Result<Vec<Vec<Option<Vec<f32>>>>> {
    let deepest = delays.iter().copied().max().unwrap_or(0) as usize;
    let mut current = Vec::with_capacity(replicas.len());
    for (p, h) in replicas.iter_mut().zip(history.iter_mut()) {
        let stages = p.stages().len();
        let mut put_back = vec![None; stages];
        if deepest == 0 {
            current.push(put_back);
            continue;
        }
        h.push_front(p.stages().iter().map(|s| s.params_host()).collect());
        h.truncate(deepest + 2);
        for (s, &d) in delays.iter().enumerate() {
            let at = (d as usize).min(h.len() - 1);
            if at == 0 {
                continue;
            }
            let base = &h[at][s];
            let w: Vec<f32> = match h.get(at + 1).filter(|_| predict) {
                Some(before) => {
                    let ahead = at as f32;
                    base.iter().zip(&before[s]).map(|(b, o)| b + ahead * (b - o)).collect()
                }
                None => base.clone(),
            };
            p.stages_mut()[s].set_params(&w)?;
            put_back[s] = Some(h[0][s].clone());
        }
        current.push(put_back);
    }
    Ok(current)
}

/// What draws one step's pathways: the run's seed, the global step, and
/// the share of steps drawn mixed.
#[derive(Clone, Copy)]
pub(super) struct PathwayDraw {
    pub seed: u64,
    pub step: u64,
    pub mix_percent: u8,
}

/// The gradients of one inner step of every replica with pathways drawn as
/// the orchestrator draws them (one replica per stage, independently): the
/// step's R groups of A micro-batches go through each stage's replicas in
/// a random order, so every stage replica still takes A micro-batches per
/// step (the orchestrator balances load) but from every other stage's
/// replicas. The caller steps each replica's optimizer. With
/// `mix_percent` below 100, only that share of steps is drawn so (each
/// step by a coin of the step's seed); the others keep every replica on its
/// own pathway: how much of mixing's cost a router that mixes less often
/// would keep.
///
/// With `backward_at` ([replica][stage], from `delayed_weights`), a stage
/// given weights there runs its backward on them instead of on the weights
/// it forwarded with (a recomputing stage without stashing: its blocks'
/// forward runs again on them).
pub(super) fn mixed_grads(
    replicas: &mut [Pipeline<CpuBackend>],
    corpus: &Corpus,
    first: u64,
    a: u64,
    draw: PathwayDraw,
    backward_at: Option<&[Vec<Option<Vec<f32>>>]>,
) -> Result<()> {
    let PathwayDraw { seed, step, mix_percent } = draw;
    let r = replicas.len();
    let stages = replicas[0].stages().len();
    let (codec, seq, batch) = (replicas[0].cfg.codec, replicas[0].cfg.seq, replicas[0].cfg.batch);
    let mut rng = Rng::derived(seed, &[0x7061_7468, step]);
    // Drawn apart from the pathways so that mixing everything draws what it always did.
    let mixes = Rng::derived(seed, &[0x6d69_7821, step]).below(100) < mix_percent as u64;
    let perms: Vec<Vec<usize>> = (0..stages)
        .map(|_| {
            let mut p: Vec<usize> = (0..r).collect();
            for i in (1..r).rev() {
                p.swap(i, rng.below(i as u64 + 1) as usize);
            }
            if !mixes {
                p.sort_unstable();
            }
            p
        })
        .collect();
    for p in replicas.iter_mut() {
        p.zero_grads();
    }
    for j in 0..r {
        let path: Vec<usize> = perms.iter().map(|p| p[j]).collect();
        for i in 0..a {
            let mb = micro_batch_id(first + j as u64 * a + i, corpus.num_shards(), batch);
            let (x, y) = corpus.micro_batch(seed, mb, seq);
            // The stages of this pathway, each from the replica drawn for it.
            let mut chosen: Vec<Option<&mut Stage<CpuBackend>>> = (0..stages).map(|_| None).collect();
            for (ri, p) in replicas.iter_mut().enumerate() {
                for (s, st) in p.stages_mut().iter_mut().enumerate() {
                    if path[s] == ri {
                        chosen[s] = Some(st);
                    }
                }
            }
            let mut pathway: Vec<&mut Stage<CpuBackend>> = chosen.into_iter().flatten().collect();
            let mut forwarded_with: Option<Vec<f32>> = None;
            let around = |s: usize, stage: &mut Stage<CpuBackend>, before: bool| -> Result<()> {
                let Some(w) = backward_at.and_then(|b| b[path[s]][s].as_ref()) else { return Ok(()) };
                if before {
                    forwarded_with = Some(stage.params_host());
                    stage.set_params(w)?;
                } else if let Some(old) = forwarded_with.take() {
                    stage.set_params(&old)?;
                }
                Ok(())
            };
            accumulate_through_with(&mut pathway, codec, seq, &x, &y, mb.key(), 1.0 / a as f32, around)?;
        }
    }
    Ok(())
}
