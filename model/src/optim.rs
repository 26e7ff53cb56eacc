//! AdamW with decoupled weight decay, global grad-norm clipping, and the
//! learning-rate schedule (linear warm-up, cosine decay to a floor); Muon
//! for the blocks' matrices as an option (`AdamWConfig::muon`).

use crate::backend::{AdamStep, Backend};
use crate::stage::Stage;
use iota_core::layout::ParamEntry;

pub use iota_core::train_config::{AdamWConfig, LrSchedule};

/// Muon's momentum (Nesterov form), the value its authors use.
pub const MUON_MOMENTUM: f32 = 0.95;
/// Newton-Schulz steps (counted in `iota_core::compute_plan` for
/// `--optimizer auto`) and the quintic's coefficients (Jordan et al.,
/// 2024: chosen so that five steps bring every singular value of a
/// normalised matrix into roughly [0.7, 1.2]).
pub use iota_core::compute_plan::MUON_NS_STEPS;
pub const MUON_NS_COEFFICIENTS: (f32, f32, f32) = (3.4445, -4.7750, 2.0315);
/// The orthogonalised update of an `r x c` matrix has an RMS of about
/// 1/sqrt(max(r, c)); times this factor x sqrt(max(r, c)) its RMS is 0.2,
/// about AdamW's, so one learning rate and weight decay serve both
/// (Liu et al., 2025, "Muon is scalable for LLM training").
pub const MUON_RMS_MATCH: f32 = 0.2;

/// Replaces the `rows x cols` matrix in `x` (any non-zero one) with its
/// approximate orthogonalisation, U V^T of its SVD with singular values
/// near 1, by Muon's Newton-Schulz iteration on the smaller Gram matrix.
/// Built from the backend's GEMMs, so CPU and CUDA run the same algorithm.
pub fn newton_schulz<B: Backend>(be: &B, x: &mut B::Buf, rows: usize, cols: usize) {
    let (a, b, c) = MUON_NS_COEFFICIENTS;
    let norm = be.sum_squares(be.all(x)).sqrt() as f32;
    be.scale(be.all_mut(x), 1.0 / (norm + 1e-7));
    // Work on whichever of X X^T and X^T X is smaller.
    let k = rows.min(cols);
    let mut gram = be.zeros(k * k);
    let mut gram2 = be.zeros(k * k);
    let mut prod = be.zeros(rows * cols);
    for _ in 0..MUON_NS_STEPS {
        if rows <= cols {
            // G = X X^T
            be.matmul(be.all_mut(&mut gram), be.all(x), be.all(x), rows, cols, rows, false);
        } else {
            // G = X^T X
            be.fill(be.all_mut(&mut gram), 0.0);
            be.matmul_bwd_weight(be.all_mut(&mut gram), be.all(x), be.all(x), rows, cols, cols);
        }
        // P = b G + c G G (G is symmetric, so G G = G G^T).
        be.matmul(be.all_mut(&mut gram2), be.all(&gram), be.all(&gram), k, k, k, false);
        be.scale(be.all_mut(&mut gram), b);
        be.scale(be.all_mut(&mut gram2), c);
        be.add_assign(be.all_mut(&mut gram), be.all(&gram2));
        if rows <= cols {
            // P X
            be.matmul_bwd_input(be.all_mut(&mut prod), be.all(&gram), be.all(x), rows, cols, rows, false);
        } else {
            // X P (= X P^T, P symmetric)
            be.matmul(be.all_mut(&mut prod), be.all(x), be.all(&gram), rows, cols, cols, false);
        }
        // X = a X + (P X | X P)
        be.scale(be.all_mut(x), a);
        be.add_assign(be.all_mut(x), be.all(&prod));
    }
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    pub grad_norm: f32,
    /// False when the gradient was not finite and the step was skipped.
    pub applied: bool,
}

/// AdamW moments of one stage (same flat layout as its parameters).
pub struct AdamW<B: Backend> {
    pub m: B::Buf,
    pub v: B::Buf,
    /// Steps taken (the bias-correction counter).
    pub t: u64,
}

impl<B: Backend> AdamW<B> {
    pub fn new(be: &B, n: usize) -> Self {
        AdamW { m: be.zeros(n), v: be.zeros(n), t: 0 }
    }

    /// One update of `stage` from its accumulated gradients. The gradient is
    /// clipped by its own global norm; a non-finite gradient skips the step
    /// (the weights are never poisoned) and says so.
    pub fn step(&mut self, stage: &mut Stage<B>, cfg: &AdamWConfig, lr: f32) -> StepStats {
        let be = stage.backend().clone();
        let layout = stage.layout().clone();
        let index = stage.spec().index;
        let norm = grad_norm(&segment_sum_squares(stage)) as f32;
        if !norm.is_finite() {
            return StepStats { grad_norm: norm, applied: false };
        }
        stage.before_update();
        let (params, grads) = stage.params_and_grads();
        self.t += 1;
        let up = UpdateAt::new(cfg, index, lr, self.t, norm);
        for e in &layout.entries {
            update_entry(&*be, cfg, e, e.range(), (params, grads, &mut self.m, &mut self.v), up);
        }
        StepStats { grad_norm: norm, applied: true }
    }
}

/// What one optimizer step applies to every tensor of a stage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpdateAt {
    /// The schedule's rate times the stage's scale.
    pub lr: f32,
    pub beta1: f32,
    /// The step counter after this step (bias correction).
    pub t: u64,
    /// The clipping scale the gradient is multiplied by.
    pub grad_scale: f32,
}

impl UpdateAt {
    /// For stage `index` at schedule rate `lr`, counter `t` (after the
    /// step), with gradient norm `norm`.
    pub fn new(cfg: &AdamWConfig, index: usize, lr: f32, t: u64, norm: f32) -> UpdateAt {
        let grad_scale = if cfg.grad_clip > 0.0 && norm > cfg.grad_clip { cfg.grad_clip / norm } else { 1.0 };
        UpdateAt { lr: lr * cfg.lr_scale_of(index), beta1: cfg.beta1_of(index), t, grad_scale }
    }
}

/// The update of tensor `e`, whose values lie at `at` in the four buffers
/// (weights, gradients, first and second moments): its own range in a
/// stage's buffers, or any place in a referee's. An AdamW tensor is
/// updated value by value, so `at` may hold part of it; a Muon matrix
/// needs the whole (`at` of another length leaves it untouched and says
/// so).
pub fn update_entry<B: Backend>(
    be: &B,
    cfg: &AdamWConfig,
    e: &ParamEntry,
    at: std::ops::Range<usize>,
    (params, grads, m, v): (&mut B::Buf, &B::Buf, &mut B::Buf, &mut B::Buf),
    up: UpdateAt,
) -> bool {
    let decay = if e.decay { cfg.weight_decay } else { 0.0 };
    if cfg.muon && e.takes_muon() {
        if at.len() != e.len() {
            return false;
        }
        let mu = cfg.muon_momentum.unwrap_or(MUON_MOMENTUM);
        muon_update(be, (params, grads, m), e, at, (up.lr, decay, mu), up.grad_scale);
        return true;
    }
    be.adamw(
        be.view_mut(params, at.clone()),
        be.view(grads, at.clone()),
        be.view_mut(m, at.clone()),
        be.view_mut(v, at),
        AdamStep {
            lr: up.lr,
            beta1: up.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: decay,
            t: up.t,
            grad_scale: up.grad_scale,
            nesterov: cfg.nesterov,
        },
    );
    true
}

/// The squared norm of each segment's gradients (`Stage::segments`), in
/// segment order: what the clipping norm is summed from, so a referee
/// holding one segment's gradients can check that segment's part of it
/// (PROTOCOL.md, "Inner steps recomputed").
pub fn segment_sum_squares<B: Backend>(stage: &Stage<B>) -> Vec<f64> {
    let be = stage.backend();
    stage.segments().iter().map(|s| be.sum_squares(be.view(stage.grads(), s.params.clone()))).collect()
}

/// The gradient norm from the segments' squared norms, added in order.
pub fn grad_norm(segment_sum_squares: &[f64]) -> f64 {
    segment_sum_squares.iter().sum::<f64>().sqrt()
}

/// One Muon update of the matrix `e`: momentum m = mu m + g, the Nesterov
/// direction g + mu m orthogonalised, then
/// w = w (1 - lr decay) - lr 0.2 sqrt(max(r, c)) O.
fn muon_update<B: Backend>(
    be: &B,
    (params, grads, momentum): (&mut B::Buf, &B::Buf, &mut B::Buf),
    e: &ParamEntry,
    r: std::ops::Range<usize>,
    (lr, decay, mu): (f32, f32, f32),
    grad_scale: f32,
) {
    let (rows, cols) = (e.shape[0], e.shape[1]);
    let mut dir = be.zeros(r.len());
    be.copy(be.all_mut(&mut dir), be.view(grads, r.clone()));
    be.scale(be.all_mut(&mut dir), grad_scale);
    be.scale(be.view_mut(momentum, r.clone()), mu);
    be.add_assign(be.view_mut(momentum, r.clone()), be.all(&dir));
    let mut ahead = be.zeros(r.len());
    be.copy(be.all_mut(&mut ahead), be.view(momentum, r.clone()));
    be.scale(be.all_mut(&mut ahead), mu);
    be.add_assign(be.all_mut(&mut dir), be.all(&ahead));
    newton_schulz(be, &mut dir, rows, cols);
    if decay > 0.0 {
        be.scale(be.view_mut(params, r.clone()), 1.0 - lr * decay);
    }
    be.scale(be.all_mut(&mut dir), -lr * MUON_RMS_MATCH * (rows.max(cols) as f32).sqrt());
    be.add_assign(be.view_mut(params, r), be.all(&dir));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_floor() {
        let s = LrSchedule { peak: 1.0, warmup: 10, total: 110, min_ratio: 0.1 };
        assert!((s.at(0) - 0.1).abs() < 1e-6);
        assert!((s.at(9) - 1.0).abs() < 1e-6);
        assert!((s.at(10) - 1.0).abs() < 1e-6);
        assert!((s.at(60) - 0.55).abs() < 1e-3);
        assert!((s.at(110) - 0.1).abs() < 1e-6);
        assert!((s.at(500) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn adamw_matches_scalar_reference() {
        use crate::CpuBackend;
        let be = CpuBackend::new();
        let (mut p, g, mut m, mut v) = (vec![1.0f32, -2.0], vec![0.5f32, 0.25], vec![0.0f32; 2], vec![0.0f32; 2]);
        let h = AdamStep {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.1,
            t: 1,
            grad_scale: 2.0,
            nesterov: false,
        };
        be.adamw(&mut p, &g, &mut m, &mut v, h);
        for i in 0..2 {
            let gi = g[i] as f64 * 2.0;
            let mh = 0.1 * gi / 0.1;
            let vh = 0.01 * gi * gi / 0.01;
            let p0 = [1.0f64, -2.0][i];
            let want = p0 * (1.0 - 0.01) - 0.1 * mh / (vh.sqrt() + 1e-8);
            assert!((p[i] as f64 - want).abs() < 1e-6, "{} vs {want}", p[i]);
        }
    }

    #[test]
    fn nadam_matches_scalar_reference_over_steps() {
        use crate::CpuBackend;
        let be = CpuBackend::new();
        let (b1, b2, lr, eps) = (0.8f64, 0.99f64, 0.05f64, 1e-8f64);
        let (mut p, mut m, mut v) = (vec![0.7f32, -1.5], vec![0.0f32; 2], vec![0.0f32; 2]);
        let (mut rp, mut rm, mut rv) = ([0.7f64, -1.5], [0.0f64; 2], [0.0f64; 2]);
        let step = |t: u64, nesterov: bool| AdamStep {
            lr: lr as f32,
            beta1: b1 as f32,
            beta2: b2 as f32,
            eps: eps as f32,
            weight_decay: 0.0,
            t,
            grad_scale: 1.0,
            nesterov,
        };
        for t in 1..=4u64 {
            let g = [0.3f32 * t as f32, -0.2];
            be.adamw(&mut p, &g, &mut m, &mut v, step(t, true));
            for i in 0..2 {
                let gi = g[i] as f64;
                rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
                rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
                let m_hat = b1 * rm[i] / (1.0 - b1.powi(t as i32 + 1)) + (1.0 - b1) * gi / (1.0 - b1.powi(t as i32));
                let v_hat = rv[i] / (1.0 - b2.powi(t as i32));
                rp[i] -= lr * m_hat / (v_hat.sqrt() + eps);
                assert!((p[i] as f64 - rp[i]).abs() < 1e-5, "step {t}: {} vs {}", p[i], rp[i]);
            }
        }
        // And it is not Adam: the same steps without look-ahead end elsewhere.
        let (mut q, mut m2, mut v2) = (vec![0.7f32, -1.5], vec![0.0f32; 2], vec![0.0f32; 2]);
        for t in 1..=4u64 {
            let g = [0.3f32 * t as f32, -0.2];
            be.adamw(&mut q, &g, &mut m2, &mut v2, step(t, false));
        }
        assert!((q[0] - p[0]).abs() > 1e-4, "{q:?} vs {p:?}");
    }

    /// The same iteration in f64, written out on plain arrays.
    fn newton_schulz_reference(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
        let (a, b, c) = MUON_NS_COEFFICIENTS;
        let (a, b, c) = (a as f64, b as f64, c as f64);
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut x: Vec<f64> = x.iter().map(|v| v / (norm + 1e-7)).collect();
        let at = |x: &[f64], i: usize, j: usize| x[i * cols + j];
        for _ in 0..MUON_NS_STEPS {
            // X X^T when wide, X^T X when tall.
            let k = rows.min(cols);
            let mut g = vec![0.0f64; k * k];
            for i in 0..k {
                for j in 0..k {
                    g[i * k + j] = if rows <= cols {
                        (0..cols).map(|t| at(&x, i, t) * at(&x, j, t)).sum()
                    } else {
                        (0..rows).map(|t| at(&x, t, i) * at(&x, t, j)).sum()
                    };
                }
            }
            let mut p = vec![0.0f64; k * k];
            for i in 0..k {
                for j in 0..k {
                    let gg: f64 = (0..k).map(|t| g[i * k + t] * g[t * k + j]).sum();
                    p[i * k + j] = b * g[i * k + j] + c * gg;
                }
            }
            let mut next = vec![0.0f64; rows * cols];
            for i in 0..rows {
                for j in 0..cols {
                    let px: f64 = if rows <= cols {
                        (0..k).map(|t| p[i * k + t] * at(&x, t, j)).sum()
                    } else {
                        (0..k).map(|t| at(&x, i, t) * p[t * k + j]).sum()
                    };
                    next[i * cols + j] = a * at(&x, i, j) + px;
                }
            }
            x = next;
        }
        x
    }

    #[test]
    fn newton_schulz_orthogonalises_wide_and_tall_matrices_as_its_reference_does() {
        use crate::CpuBackend;
        let be = CpuBackend::new();
        for (rows, cols) in [(6usize, 10usize), (10, 6), (7, 7)] {
            // A matrix far from orthogonal: a strong diagonal plus a smooth pattern.
            let host: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    (if r == c { 3.0 } else { 0.0 }) + ((r * 7 + c * 3) % 11) as f32 * 0.1 - 0.5
                })
                .collect();
            let mut x = be.upload(&host);
            newton_schulz(&be, &mut x, rows, cols);
            let got = be.to_host(&x);
            let want = newton_schulz_reference(&host.iter().map(|&v| v as f64).collect::<Vec<_>>(), rows, cols);
            for (g, w) in got.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-4, "{rows}x{cols}: {g} vs {w}");
            }
            // Every singular value near 1: the smaller Gram matrix is near
            // the identity (the quintic leaves them in roughly [0.7, 1.2]).
            let k = rows.min(cols);
            for i in 0..k {
                for j in 0..k {
                    let dot: f64 = if rows <= cols {
                        (0..cols).map(|t| want[i * cols + t] * want[j * cols + t]).sum()
                    } else {
                        (0..rows).map(|t| want[t * cols + i] * want[t * cols + j]).sum()
                    };
                    let ideal = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - ideal).abs() < 0.5, "{rows}x{cols} Gram[{i},{j}] = {dot}");
                }
            }
            // And the input was not: its normalised Gram matrix is far from I.
            let n2: f64 = host.iter().map(|&v| (v as f64).powi(2)).sum();
            let d0: f64 = if rows <= cols {
                (0..cols).map(|t| (host[t] as f64).powi(2)).sum::<f64>() / n2
            } else {
                (0..rows).map(|t| (host[t * cols] as f64).powi(2)).sum::<f64>() / n2
            };
            assert!((d0 - 1.0).abs() > 0.5, "the test matrix was already orthogonal ({d0})");
        }
    }

    #[test]
    fn muon_moves_the_block_matrices_and_leaves_the_rest_to_adamw() {
        use crate::CpuBackend;
        use iota_core::config::ModelConfig;
        use iota_core::layout::StageSpec;
        use std::sync::Arc;
        let be = Arc::new(CpuBackend::new());
        let cfg = ModelConfig::preset("tiny").unwrap();
        let spec = StageSpec::split(&cfg, 1).unwrap().remove(0);
        let run = |muon: bool| {
            let mut st = Stage::new(be.clone(), &cfg, spec.clone(), 7);
            let n = st.layout().total();
            let g: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 1e-3).collect();
            st.set_grads(&g).unwrap();
            let before = st.params_host();
            let mut opt = AdamW::new(&*be, n);
            let c = AdamWConfig { muon, ..AdamWConfig::default() };
            assert!(opt.step(&mut st, &c, 1e-2).applied);
            (st.layout().clone(), before, st.params_host())
        };
        let (layout, before, adam) = run(false);
        let (_, _, muon) = run(true);
        let mut matrices = 0;
        for e in &layout.entries {
            let r = e.range();
            if e.takes_muon() {
                matrices += 1;
                assert!(adam[r.clone()] != muon[r.clone()], "{} took AdamW's step under Muon", e.name);
                // Muon's step has an RMS of about 0.2 x lr (plus the decay).
                let rms =
                    (r.clone().map(|i| ((muon[i] - before[i]) as f64).powi(2)).sum::<f64>() / r.len() as f64).sqrt();
                assert!((1e-3..4e-3).contains(&rms), "{}: update RMS {rms}", e.name);
            } else {
                assert!(adam[r.clone()] == muon[r.clone()], "{} left AdamW under Muon", e.name);
            }
        }
        assert!(matrices > 0 && matrices < layout.entries.len());
    }

    #[test]
    fn muon_momentum_is_a_setting_whose_default_is_the_constant() {
        use crate::CpuBackend;
        use iota_core::config::ModelConfig;
        use iota_core::layout::StageSpec;
        use std::sync::Arc;
        let be = Arc::new(CpuBackend::new());
        let cfg = ModelConfig::preset("tiny").unwrap();
        let spec = StageSpec::split(&cfg, 1).unwrap().remove(0);
        // Two steps on different gradients: the first step's direction is
        // (1 + mu) g, which orthogonalises alike for every mu; the second's is not.
        let run = |mu: Option<f32>| {
            let mut st = Stage::new(be.clone(), &cfg, spec.clone(), 7);
            let n = st.layout().total();
            let mut opt = AdamW::new(&*be, n);
            let c = AdamWConfig { muon: true, muon_momentum: mu, ..AdamWConfig::default() };
            for k in 0..2 {
                let g: Vec<f32> = (0..n).map(|i| ((i * (37 + 14 * k) % 101) as f32 - 50.0) * 1e-3).collect();
                st.set_grads(&g).unwrap();
                assert!(opt.step(&mut st, &c, 1e-2).applied);
            }
            (st.layout().clone(), st.params_host())
        };
        let (layout, default) = run(None);
        assert_eq!(default, run(Some(MUON_MOMENTUM)).1, "unset is the constant");
        let (_, short) = run(Some(0.5));
        for e in &layout.entries {
            let r = e.range();
            assert_eq!(e.takes_muon(), default[r.clone()] != short[r.clone()], "{}", e.name);
        }
        // Unset, it is left out of saved settings: earlier runs keep their id.
        let saved = serde_json::to_string(&AdamWConfig::default()).unwrap();
        assert!(!saved.contains("muon_momentum"), "{saved}");
    }

    #[test]
    fn stage_beta1_falls_back_to_the_last_value_then_to_beta1() {
        let mut c = AdamWConfig::default();
        assert_eq!(c.beta1_of(2), 0.9);
        c.stage_beta1 = vec![0.8, 0.85];
        assert_eq!((c.beta1_of(0), c.beta1_of(1), c.beta1_of(5)), (0.8, 0.85, 0.85));
        assert_eq!(c.lr_scale_of(3), 1.0, "no multipliers: 1 everywhere");
        c.stage_lr = vec![0.5, 0.75];
        assert_eq!((c.lr_scale_of(0), c.lr_scale_of(1), c.lr_scale_of(4)), (0.5, 0.75, 0.75));
        assert!(c.validate().is_ok());
        for bad in [0.0, -1.0, f32::NAN, 11.0] {
            c.stage_lr = vec![1.0, bad];
            assert!(c.validate().is_err(), "multiplier {bad}");
        }
        c.stage_lr.clear();
        c.stage_beta1.push(1.0);
        assert!(c.validate().is_err());
    }
}
