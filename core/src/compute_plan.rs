//! What a stage computes per optimizer step, counted in FLOPs from its
//! layout: the training step's GEMMs and attention, and Muon's
//! Newton-Schulz iterations. `--optimizer auto` weighs the two to choose
//! Muon where it is cheap (docs/BENCHMARKS.md, "Muon").
//!
//! The count is a model of time, not a measurement: it leaves out what is
//! not a GEMM (norms, softmax, the loss over the vocabulary), so it
//! overstates Muon's share where those weigh (one process of `small` on
//! the CPU: 15% counted, 5% measured), and it knows nothing of a GPU's
//! launch overheads on small matrices.

use crate::config::ModelConfig;
use crate::layout::{ParamLayout, StageSpec};

/// Newton-Schulz steps per Muon update (Jordan et al., 2024).
pub const MUON_NS_STEPS: usize = 5;

/// `--optimizer auto` takes Muon when its Newton-Schulz work slows the
/// run's slowest stage by at most this fraction, else AdamW. Muon's gain
/// at equal tokens where measured (`small`: 8% lower swarm loss, the
/// swarm's gap to one process halved) is worth far more than a tenth of
/// throughput; beyond a tenth it is not measured.
pub const AUTO_MUON_MAX_SLOWDOWN: f64 = 0.10;

/// FLOPs of one training step (forward and backward) of `spec` over
/// `tokens` tokens in sequences of `seq`: 6 per weight of every matrix
/// that a GEMM reads, per token (the embedding is a gather, not a GEMM),
/// and attention's two products over the causal half of the sequence,
/// 6 x seq x q_dim per token and block.
pub fn stage_step_flops(cfg: &ModelConfig, spec: &StageSpec, tokens: usize, seq: usize) -> f64 {
    let weights: usize = ParamLayout::for_stage(cfg, spec)
        .entries
        .iter()
        .filter(|e| e.shape.len() == 2 && !e.name.contains("embed_tokens"))
        .map(|e| e.len())
        .sum();
    let attention = 6.0 * seq as f64 * cfg.q_dim() as f64 * spec.layers.len() as f64;
    tokens as f64 * (6.0 * weights as f64 + attention)
}

/// FLOPs of Muon's Newton-Schulz iterations over `spec`'s matrices in one
/// optimizer step: per step and `r x c` matrix (k = min, n = max), the
/// Gram matrix (2 k^2 n), its square (2 k^3) and the product back
/// (2 k^2 n), as `iota_model::optim::newton_schulz` computes them.
pub fn stage_newton_schulz_flops(cfg: &ModelConfig, spec: &StageSpec) -> f64 {
    ParamLayout::for_stage(cfg, spec)
        .entries
        .iter()
        .filter(|e| e.takes_muon())
        .map(|e| {
            let (k, n) = (e.shape[0].min(e.shape[1]) as f64, e.shape[0].max(e.shape[1]) as f64);
            MUON_NS_STEPS as f64 * (4.0 * k * k * n + 2.0 * k * k * k)
        })
        .sum()
}

/// How much Muon slows a pipeline of `stages` stages, each stepping after
/// `tokens_per_step` tokens: the slowest stage's step with Newton-Schulz
/// over the slowest without, minus one (a pipeline runs at its slowest
/// stage's pace; one process is one stage). `None` for a split the model
/// does not allow.
pub fn muon_slowdown(cfg: &ModelConfig, stages: usize, tokens_per_step: usize, seq: usize) -> Option<f64> {
    let specs = StageSpec::split(cfg, stages).ok()?;
    let (mut without, mut with) = (0.0f64, 0.0f64);
    for s in &specs {
        let step = stage_step_flops(cfg, s, tokens_per_step, seq);
        without = without.max(step);
        with = with.max(step + stage_newton_schulz_flops(cfg, s));
    }
    (without > 0.0).then(|| with / without - 1.0)
}

/// Blocks per stage that make the slowest stage's training step as short
/// as a split of `cfg` into `stages` stages allows, by the FLOP count
/// above at sequences of `seq` (the tail's LM head counts with it; the
/// head's embedding, a gather, does not). Ties between splits with that
/// slowest stage go towards stages of more equal cost: at each stage the
/// choice compares the slowest of it and the later stages, then the sum
/// of their squared costs, then takes the fewest blocks (a heuristic for
/// the tie only; the slowest stage is exact). Every stage keeps at least
/// one block.
///
/// A pipeline runs at its slowest stage's pace, so with one miner per
/// stage on cards of its own this is the split that runs fastest; on one
/// shared device the total work, not its split, sets the pace.
pub fn balanced_stage_layers(cfg: &ModelConfig, stages: usize, seq: usize) -> Option<Vec<usize>> {
    balanced_stage_layers_within(cfg, stages, seq, &|_, _| true)
}

/// `balanced_stage_layers` among the splits whose every stage `admits`
/// (stage index, its blocks): a card size its memory must fit, say. None
/// when no split is admitted.
pub fn balanced_stage_layers_within(
    cfg: &ModelConfig,
    stages: usize,
    seq: usize,
    admits: &dyn Fn(usize, usize) -> bool,
) -> Option<Vec<usize>> {
    let l = cfg.n_layers;
    if stages == 0 || stages > l {
        return None;
    }
    // cost[i][n]: stage i holding n blocks (one token's step: only ratios matter).
    let cost: Vec<Vec<f64>> = (0..stages)
        .map(|i| (0..=l).map(|n| stage_step_flops(cfg, &StageSpec::sized(cfg, i, stages, n), 1, seq)).collect())
        .collect();
    // Stage i's blocks given the blocks still free for stages i.., minimising
    // (the slowest stage, then the sum of squares) over the rest.
    type Best = Option<(f64, f64, Vec<usize>)>;
    let better = |a: &Best, b: &(f64, f64, Vec<usize>)| match a {
        None => true,
        Some(a) => b.0 < a.0 || (b.0 == a.0 && b.1 < a.1),
    };
    // best[i][free]: the best split of `free` blocks over stages i..stages.
    let mut best: Vec<Vec<Best>> = vec![vec![None; l + 1]; stages + 1];
    best[stages][0] = Some((0.0, 0.0, Vec::new()));
    for i in (0..stages).rev() {
        let later = stages - i - 1;
        for free in 1..=l {
            let mut here: Best = None;
            // At least one block for every later stage.
            for n in 1..=free.saturating_sub(later) {
                let Some((m, sq, rest)) = &best[i + 1][free - n] else { continue };
                if !admits(i, n) {
                    continue;
                }
                let c = cost[i][n];
                let cand = (m.max(c), sq + c * c, std::iter::once(n).chain(rest.iter().copied()).collect());
                if better(&here, &cand) {
                    here = Some(cand);
                }
            }
            best[i][free] = here;
        }
    }
    best[0][l].take().map(|b| b.2)
}

/// The slowest stage's training step over the stages' mean for a split
/// of `cfg` into `stages` stages (1.0: balanced; a pipeline on cards of
/// its own keeps each card busy this fraction's inverse of the time).
pub fn stage_imbalance(cfg: &ModelConfig, stages: usize, seq: usize) -> Option<f64> {
    let specs = StageSpec::split(cfg, stages).ok()?;
    let costs: Vec<f64> = specs.iter().map(|s| stage_step_flops(cfg, s, 1, seq)).collect();
    let mean = costs.iter().sum::<f64>() / costs.len() as f64;
    (mean > 0.0).then(|| costs.iter().copied().fold(0.0, f64::max) / mean)
}

/// The balanced split of `cfg` into `stages` stages and its slowest stage
/// over the stages' mean (`stage_imbalance` of that split).
pub fn balanced_with_imbalance(cfg: &ModelConfig, stages: usize, seq: usize) -> Option<(Vec<usize>, f64)> {
    let split = balanced_stage_layers(cfg, stages, seq)?;
    let mut c = cfg.clone();
    c.stage_layers = Some(split.clone());
    let r = stage_imbalance(&c, stages, seq)?;
    Some((split, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of `l` blocks into `s` stages of at least one.
    fn all_splits(l: usize, s: usize) -> Vec<Vec<usize>> {
        if s == 1 {
            return vec![vec![l]];
        }
        (1..=l - (s - 1))
            .flat_map(|n| {
                all_splits(l - n, s - 1).into_iter().map(move |mut r| {
                    r.insert(0, n);
                    r
                })
            })
            .collect()
    }

    fn slowest(cfg: &ModelConfig, split: &[usize], seq: usize) -> f64 {
        let mut c = cfg.clone();
        c.stage_layers = Some(split.to_vec());
        StageSpec::split(&c, split.len()).unwrap().iter().map(|s| stage_step_flops(&c, s, 1, seq)).fold(0.0, f64::max)
    }

    #[test]
    fn the_balanced_split_has_the_fastest_slowest_stage_of_all_splits() {
        for (preset, seq) in [("small", 128), ("1.5b", 1024), ("1b", 2048), ("tiny", 64)] {
            let cfg = ModelConfig::preset(preset).unwrap();
            for stages in 1..=cfg.n_layers.min(5) {
                let b = balanced_stage_layers(&cfg, stages, seq).unwrap();
                assert_eq!(b.len(), stages);
                assert_eq!(b.iter().sum::<usize>(), cfg.n_layers);
                assert!(!b.contains(&0), "{preset} {stages}: {b:?}");
                let best =
                    all_splits(cfg.n_layers, stages).iter().map(|s| slowest(&cfg, s, seq)).fold(f64::MAX, f64::min);
                assert_eq!(slowest(&cfg, &b, seq), best, "{preset} {stages}: {b:?}");
                let even = crate::layout::even_layers(cfg.n_layers, stages);
                assert!(slowest(&cfg, &b, seq) <= slowest(&cfg, &even, seq));
            }
        }
        assert_eq!(balanced_stage_layers(&ModelConfig::preset("tiny").unwrap(), 0, 64), None);
    }

    #[test]
    fn a_bound_on_each_stage_leaves_the_best_split_it_admits() {
        let cfg = ModelConfig::preset("1.5b").unwrap();
        assert_eq!(balanced_stage_layers(&cfg, 3, 1024), Some(vec![7, 7, 2]));
        // The head may hold at most 6 blocks: the best split left.
        let capped = balanced_stage_layers_within(&cfg, 3, 1024, &|i, n| i != 0 || n <= 6).unwrap();
        assert!(capped[0] <= 6, "{capped:?}");
        let best = all_splits(16, 3)
            .into_iter()
            .filter(|s| s[0] <= 6)
            .map(|s| slowest(&cfg, &s, 1024))
            .fold(f64::MAX, f64::min);
        assert_eq!(slowest(&cfg, &capped, 1024), best, "{capped:?}");
        assert_eq!(balanced_stage_layers_within(&cfg, 3, 1024, &|_, n| n <= 5), None, "3 x 5 < 16 blocks");
    }

    #[test]
    fn at_iota_s_shape_the_tail_gives_up_blocks_for_its_lm_head() {
        let mut cfg = ModelConfig::preset("1.5b").unwrap();
        let even = stage_imbalance(&cfg, 3, 1024).unwrap();
        let split = balanced_stage_layers(&cfg, 3, 1024).unwrap();
        // The LM head (128,256 x 2,048) costs about four blocks' worth.
        assert!(split[2] < split[0] && split[2] < split[1], "{split:?}");
        cfg.stage_layers = Some(split.clone());
        let balanced = stage_imbalance(&cfg, 3, 1024).unwrap();
        assert!(even > 1.3 && balanced < 1.05, "slowest over mean: even {even}, balanced {balanced} ({split:?})");
    }

    #[test]
    fn a_square_matrix_costs_thirty_k_cubed_and_a_stage_sums_its_matrices() {
        let mut cfg = ModelConfig::preset("tiny").unwrap();
        cfg.bottleneck = 0;
        let whole = StageSpec::whole(&cfg);
        let (d, f, kv) = (cfg.d_model as f64, cfg.ffn_hidden as f64, cfg.kv_dim() as f64);
        let square = 5.0 * 6.0 * d * d * d;
        let kv_proj = 5.0 * (4.0 * kv * kv * d + 2.0 * kv * kv * kv);
        let mlp = 5.0 * (4.0 * d * d * f + 2.0 * d * d * d);
        let per_block = 2.0 * square + 2.0 * kv_proj + 3.0 * mlp;
        let got = stage_newton_schulz_flops(&cfg, &whole);
        assert!((got / (per_block * cfg.n_layers as f64) - 1.0).abs() < 1e-12, "{got}");
    }

    #[test]
    fn the_step_counts_the_head_but_not_the_embedding() {
        let cfg = ModelConfig::preset("small").unwrap();
        let specs = StageSpec::split(&cfg, 3).unwrap();
        let (head, tail) = (&specs[0], &specs[2]);
        let lm_head = 6.0 * (cfg.vocab_size * cfg.d_model) as f64 * 1024.0;
        // Same number of blocks; the tail's LM head is the difference
        // (the bottleneck's two projections aside: the head has one, the
        // tail one).
        let diff = stage_step_flops(&cfg, tail, 1024, 128) - stage_step_flops(&cfg, head, 1024, 128);
        assert!((diff / lm_head - 1.0).abs() < 0.01, "{diff} vs {lm_head}");
        // Twice the tokens, twice the work; Muon's does not grow.
        let one = stage_step_flops(&cfg, tail, 1024, 128);
        assert!((stage_step_flops(&cfg, tail, 2048, 128) / one - 2.0).abs() < 1e-12);
    }

    #[test]
    fn muon_is_cheap_where_the_tokens_per_step_outweigh_the_matrices() {
        // `small` in the swarm's shape: the tail's LM head sets the pace
        // and Muon adds about 6% to it (measured on the 2-core VM: 5-6%).
        let small = ModelConfig::preset("small").unwrap();
        let s = muon_slowdown(&small, 3, 8 * 128, 128).unwrap();
        assert!(s > 0.03 && s < 0.08, "{s}");
        // The same model in one process pays for every block's matrices.
        let one = muon_slowdown(&small, 1, 8 * 128, 128).unwrap();
        assert!(one > s, "{one} vs {s}");
        // `1.5b` at batch 4 x seq 1024: the Newton-Schulz steps cost more
        // than the step itself; at 64 times the tokens they do not.
        let big = ModelConfig::preset("1.5b").unwrap();
        assert!(muon_slowdown(&big, 3, 4096, 1024).unwrap() > 1.0);
        assert!(muon_slowdown(&big, 3, 64 * 4096, 1024).unwrap() < 0.05);
        assert!(muon_slowdown(&big, 17, 4096, 1024).is_none());
    }
}
