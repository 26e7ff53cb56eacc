//! AdamW with decoupled weight decay, global grad-norm clipping, and the
//! learning-rate schedule (linear warm-up, cosine decay to a floor).

use crate::backend::{AdamStep, Backend};
use crate::stage::Stage;

pub use iota_core::train_config::{AdamWConfig, LrSchedule};

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
        let beta1 = cfg.beta1_of(stage.spec().index);
        let lr = lr * cfg.lr_scale_of(stage.spec().index);
        let norm = be.sum_squares(be.all(stage.grads())).sqrt() as f32;
        if !norm.is_finite() {
            return StepStats { grad_norm: norm, applied: false };
        }
        stage.before_update();
        let (params, grads) = stage.params_and_grads();
        let scale = if cfg.grad_clip > 0.0 && norm > cfg.grad_clip { cfg.grad_clip / norm } else { 1.0 };
        self.t += 1;
        for e in &layout.entries {
            let r = e.range();
            be.adamw(
                be.view_mut(params, r.clone()),
                be.view(grads, r.clone()),
                be.view_mut(&mut self.m, r.clone()),
                be.view_mut(&mut self.v, r),
                AdamStep {
                    lr,
                    beta1,
                    beta2: cfg.beta2,
                    eps: cfg.eps,
                    weight_decay: if e.decay { cfg.weight_decay } else { 0.0 },
                    t: self.t,
                    grad_scale: scale,
                    nesterov: cfg.nesterov,
                },
            );
        }
        StepStats { grad_norm: norm, applied: true }
    }
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
