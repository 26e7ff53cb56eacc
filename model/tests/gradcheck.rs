//! Finite-difference checks of every op's backward and of whole stages, and
//! naive-reference checks of the forward kernels.
//!
//! Tolerance: the backends compute in f32, so central differences use a step
//! of 1e-2..3e-3 with the probe loss summed in f64; on a sample of
//! coordinates per tensor we require
//! `||analytic - numeric|| / max(||analytic||, ||numeric||) < TOL` (TOL = 1e-2)
//! which catches any wrong term while tolerating f32 rounding.

use std::sync::Arc;

use iota_core::{BottleneckStyle, ModelConfig, Rng, StageSpec};
use iota_model::backend::{AttnDims, Backend};
use iota_model::{CpuBackend, Stage, StageInput};

const TOL: f64 = 1e-2;

fn randn(rng: &mut Rng, n: usize, std: f32) -> Vec<f32> {
    let mut v = vec![0.0; n];
    rng.fill_normal(&mut v, std);
    v
}

fn probe(out: &[f32], r: &[f32]) -> f64 {
    out.iter().zip(r).map(|(a, b)| *a as f64 * *b as f64).sum()
}

/// Compares `analytic` (d probe / d inputs[which]) against central
/// differences of `f` at `samples` coordinates.
#[allow(clippy::too_many_arguments)]
fn compare(
    what: &str,
    inputs: &[Vec<f32>],
    which: usize,
    analytic: &[f32],
    f: &dyn Fn(&[Vec<f32>]) -> f64,
    eps: f32,
    samples: usize,
    rng: &mut Rng,
) {
    assert_eq!(analytic.len(), inputs[which].len(), "{what}: gradient length");
    let n = analytic.len();
    let idx: Vec<usize> =
        if n <= samples { (0..n).collect() } else { (0..samples).map(|_| rng.below(n as u64) as usize).collect() };
    let (mut diff, mut na, mut nn) = (0.0f64, 0.0f64, 0.0f64);
    for &i in &idx {
        let mut x = inputs.to_vec();
        x[which][i] += eps;
        let up = f(&x);
        x[which][i] -= 2.0 * eps;
        let down = f(&x);
        let num = (up - down) / (2.0 * eps as f64);
        let a = analytic[i] as f64;
        diff += (a - num).powi(2);
        na += a * a;
        nn += num * num;
    }
    let rel = diff.sqrt() / na.sqrt().max(nn.sqrt()).max(1e-8);
    assert!(
        rel < TOL,
        "{what}: relative gradient error {rel:.3e} (|analytic| {:.3e}, |numeric| {:.3e})",
        na.sqrt(),
        nn.sqrt()
    );
}

#[test]
fn matmul_backward() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(1);
    let (n, c, oc) = (7, 11, 5);
    let inputs = vec![randn(&mut rng, n * c, 1.0), randn(&mut rng, oc * c, 1.0)];
    let r = randn(&mut rng, n * oc, 1.0);
    let f = |x: &[Vec<f32>]| {
        let mut out = vec![0.0; n * oc];
        be.matmul(&mut out, &x[0], &x[1], n, c, oc, false);
        probe(&out, &r)
    };
    let mut dinp = vec![0.0; n * c];
    let mut dw = vec![0.0; oc * c];
    be.matmul_bwd_input(&mut dinp, &r, &inputs[1], n, c, oc, false);
    be.matmul_bwd_weight(&mut dw, &r, &inputs[0], n, c, oc);
    compare("matmul dinp", &inputs, 0, &dinp, &f, 1e-2, 50, &mut rng);
    compare("matmul dw", &inputs, 1, &dw, &f, 1e-2, 50, &mut rng);
}

#[test]
fn rmsnorm_backward() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(2);
    let (n, d) = (70, 24); // more rows than one reduction block
    let inputs = vec![randn(&mut rng, n * d, 1.0), randn(&mut rng, d, 1.0)];
    let r = randn(&mut rng, n * d, 1.0);
    let f = |x: &[Vec<f32>]| {
        let (mut out, mut rstd) = (vec![0.0; n * d], vec![0.0; n]);
        be.rmsnorm(&mut out, &mut rstd, &x[0], &x[1], n, d, 1e-5);
        probe(&out, &r)
    };
    let (mut out, mut rstd) = (vec![0.0; n * d], vec![0.0; n]);
    be.rmsnorm(&mut out, &mut rstd, &inputs[0], &inputs[1], n, d, 1e-5);
    let mut dx = vec![0.0; n * d];
    let mut dw = vec![0.0; d];
    be.rmsnorm_bwd(&mut dx, &mut dw, &r, &inputs[0], &inputs[1], &rstd, n, d);
    compare("rmsnorm dx", &inputs, 0, &dx, &f, 3e-3, 60, &mut rng);
    compare("rmsnorm dw", &inputs, 1, &dw, &f, 3e-3, 60, &mut rng);
}

#[test]
fn rope_backward_and_reference() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(3);
    let mut cfg = ModelConfig::preset("tiny").unwrap();
    cfg.rope_scaling = Some(iota_core::RopeScaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 16,
    });
    let (seq, hd, heads, stride) = (6, cfg.head_dim(), 3, 3 * cfg.head_dim() + 5);
    let rows = 2 * seq;
    let table = iota_model::rope::rope_table(&cfg, seq);
    let inputs = vec![randn(&mut rng, rows * stride, 1.0)];
    let r = randn(&mut rng, rows * stride, 1.0);
    let f = |x: &[Vec<f32>]| {
        let mut y = x[0].clone();
        be.rope(&mut y, &table, rows, seq, stride, heads, hd, false);
        probe(&y, &r)
    };
    let mut g = r.clone();
    be.rope(&mut g, &table, rows, seq, stride, heads, hd, true);
    compare("rope", &inputs, 0, &g, &f, 1e-2, 80, &mut rng);
    // Reference: rotate-half with angle pos * inv_freq[i], columns past the heads untouched.
    let inv = cfg.rope_inv_freq();
    let mut y = inputs[0].clone();
    be.rope(&mut y, &table, rows, seq, stride, heads, hd, false);
    for row in 0..rows {
        let pos = (row % seq) as f64;
        for h in 0..heads {
            for (i, freq) in inv.iter().enumerate() {
                let (a, b) = (row * stride + h * hd + i, row * stride + h * hd + i + hd / 2);
                let (x1, x2) = (inputs[0][a] as f64, inputs[0][b] as f64);
                let ang = pos * freq;
                assert!((y[a] as f64 - (x1 * ang.cos() - x2 * ang.sin())).abs() < 1e-5);
                assert!((y[b] as f64 - (x2 * ang.cos() + x1 * ang.sin())).abs() < 1e-5);
            }
        }
        for j in heads * hd..stride {
            assert_eq!(y[row * stride + j], inputs[0][row * stride + j]);
        }
    }
}

fn naive_attention(qkv: &[f32], d: AttnDims) -> Vec<f32> {
    let (t, hd, qs, qd) = (d.seq, d.head_dim, d.qkv_dim(), d.q_dim());
    let g = d.n_heads / d.n_kv_heads;
    let mut out = vec![0.0; d.rows() * qd];
    for b in 0..d.batch {
        for h in 0..d.n_heads {
            let kvh = h / g;
            for i in 0..t {
                let q = &qkv[(b * t + i) * qs + h * hd..][..hd];
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        let k = &qkv[(b * t + j) * qs + qd + kvh * hd..][..hd];
                        q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
                for e in 0..hd {
                    let mut acc = 0.0;
                    for (j, s) in scores.iter().enumerate() {
                        acc += (s - mx).exp() / z * qkv[(b * t + j) * qs + qd + d.kv_dim() + kvh * hd + e] as f64;
                    }
                    out[(b * t + i) * qd + h * hd + e] = acc as f32;
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_and_backward() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(4);
    for (nh, nkv) in [(4, 2), (3, 3), (4, 1)] {
        let d = AttnDims { batch: 2, seq: 7, n_heads: nh, n_kv_heads: nkv, head_dim: 6 };
        let inputs = vec![randn(&mut rng, d.rows() * d.qkv_dim(), 1.0)];
        let run = |x: &[f32]| {
            let (mut out, mut probs) = (vec![0.0; d.rows() * d.q_dim()], vec![0.0; d.probs_len()]);
            be.attention(&mut out, &mut probs, x, d);
            (out, probs)
        };
        let (out, probs) = run(&inputs[0]);
        let want = naive_attention(&inputs[0], d);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "attention {nh}/{nkv}: {a} vs {b}");
        }
        let r = randn(&mut rng, out.len(), 1.0);
        let f = |x: &[Vec<f32>]| probe(&run(&x[0]).0, &r);
        let mut dqkv = vec![0.0; inputs[0].len()];
        be.attention_bwd(&mut dqkv, &r, &inputs[0], &out, &probs, d);
        compare(&format!("attention {nh}/{nkv}"), &inputs, 0, &dqkv, &f, 3e-3, 120, &mut rng);
    }
}

#[test]
fn swiglu_backward() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(5);
    let (n, f) = (9, 13);
    let inputs = vec![randn(&mut rng, n * 2 * f, 2.0)];
    let r = randn(&mut rng, n * f, 1.0);
    let fun = |x: &[Vec<f32>]| {
        let mut out = vec![0.0; n * f];
        be.swiglu(&mut out, &x[0], n, f);
        probe(&out, &r)
    };
    let mut dgu = vec![0.0; n * 2 * f];
    be.swiglu_bwd(&mut dgu, &r, &inputs[0], n, f);
    compare("swiglu", &inputs, 0, &dgu, &fun, 1e-2, 80, &mut rng);
}

#[test]
fn embedding_backward_is_scatter_add() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(6);
    let (v, d) = (40, 8);
    let tokens: Vec<u32> = (0..50).map(|_| rng.below(v as u64) as u32).chain([3, 3, 3]).collect();
    let inputs = vec![randn(&mut rng, v * d, 1.0)];
    let r = randn(&mut rng, tokens.len() * d, 1.0);
    let f = |x: &[Vec<f32>]| {
        let mut out = vec![0.0; tokens.len() * d];
        be.embedding(&mut out, &tokens, &x[0], d);
        probe(&out, &r)
    };
    let mut dwte = vec![0.0; v * d];
    be.embedding_bwd(&mut dwte, &r, &tokens, d);
    compare("embedding", &inputs, 0, &dwte, &f, 1e-2, 320, &mut rng);
}

#[test]
fn cross_entropy_gradient_and_padding() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(7);
    let (n, v, real) = (5, 12, 10);
    let targets: Vec<u32> = (0..n).map(|_| rng.below(real as u64) as u32).collect();
    let inputs = vec![randn(&mut rng, n * v, 3.0)];
    let f = |x: &[Vec<f32>]| {
        let mut l = x[0].clone();
        be.cross_entropy(&mut l, &targets, n, v, real, 1.0).iter().map(|&x| x as f64).sum()
    };
    let mut g = inputs[0].clone();
    let losses = be.cross_entropy(&mut g, &targets, n, v, real, 1.0);
    compare("cross_entropy", &inputs, 0, &g, &f, 1e-2, 60, &mut rng);
    for row in 0..n {
        assert!(g[row * v + real..(row + 1) * v].iter().all(|&x| x == 0.0), "padding columns get no gradient");
        // Reference loss: logsumexp over the real vocabulary minus the target logit.
        let x = &inputs[0][row * v..row * v + real];
        let lse = x.iter().map(|&a| (a as f64).exp()).sum::<f64>().ln();
        assert!((losses[row] as f64 - (lse - x[targets[row] as usize] as f64)).abs() < 1e-4);
    }
}

/// A config small enough for finite differences of a whole stage.
fn micro_config(bottleneck: usize) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny").unwrap();
    c.vocab_size = 24;
    c.vocab_real = 20;
    c.d_model = 16;
    c.n_layers = 3;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_hidden = 24;
    c.max_seq = 8;
    c.bottleneck = bottleneck;
    c.init_std = 0.3; // large enough that every path matters at initialisation
    c.validate().unwrap();
    c
}

#[test]
fn whole_stages_match_finite_differences() {
    check_whole_stages(&micro_config(4), 8);
}

/// The residual bottleneck (SwiGLU branches in the encoder and decoder):
/// every tensor of every stage, and each stage's input gradient through its
/// decoder, against finite differences; at b = 4 and at b = 1 (where the
/// decoder's branch input is one number per token).
#[test]
fn whole_stages_with_the_residual_bottleneck_match_finite_differences() {
    for b in [4, 1] {
        let mut cfg = micro_config(b);
        cfg.bottleneck_style = BottleneckStyle::Residual;
        check_whole_stages(&cfg, 9 + b as u64);
    }
}

fn check_whole_stages(cfg: &ModelConfig, seed: u64) {
    let be = Arc::new(CpuBackend::new());
    let mut rng = Rng::new(seed);
    let cfg = cfg.clone();
    let specs = StageSpec::split(&cfg, 3).unwrap();
    let (batch, seq) = (2, 5);
    let n = batch * seq;
    let tokens: Vec<u32> = (0..n).map(|_| rng.below(cfg.vocab_real as u64) as u32).collect();
    let targets: Vec<u32> = (0..n).map(|_| rng.below(cfg.vocab_real as u64) as u32).collect();
    let w = cfg.bottleneck;

    for spec in &specs {
        let mut stage = Stage::new(be.clone(), &cfg, spec.clone(), 11);
        let params = stage.params_host();
        let hidden = randn(&mut rng, n * w, 1.0);
        let is_tail = spec.has_lm_head();
        let r = randn(&mut rng, n * w, 1.0);
        // Probe loss as a function of (params, input activations).
        let f = |x: &[Vec<f32>]| -> f64 {
            let mut s = Stage::with_params(be.clone(), &cfg, spec.clone(), &x[0]).unwrap();
            let input = if spec.has_embedding() { StageInput::Tokens(&tokens) } else { StageInput::Hidden(&x[1]) };
            if is_tail {
                let l = s.eval_loss(input, &targets, batch, seq).unwrap();
                l.iter().map(|&v| v as f64).sum::<f64>() / n as f64
            } else {
                probe(&s.forward(0, input, batch, seq).unwrap(), &r)
            }
        };
        let input = if spec.has_embedding() { StageInput::Tokens(&tokens) } else { StageInput::Hidden(&hidden) };
        let din = if is_tail {
            stage.forward_backward(input, &targets, batch, seq, 1.0).unwrap().din
        } else {
            stage.forward(7, input, batch, seq).unwrap();
            stage.backward(7, &r).unwrap()
        };
        let grads = stage.grads_host();
        let inputs = vec![params, hidden];
        for e in &stage.layout().entries {
            let sub: Vec<f32> = grads[e.range()].to_vec();
            // Perturb a sample of this tensor's coordinates only.
            let off = e.offset;
            let len = e.len();
            let mut sampled_rng = Rng::new(off as u64);
            let idx: Vec<usize> = (0..len.min(12)).map(|_| off + sampled_rng.below(len as u64) as usize).collect();
            let mut diff = 0.0f64;
            let (mut na, mut nn) = (0.0f64, 0.0f64);
            for &i in &idx {
                let eps = 3e-3f32;
                let mut x = inputs.clone();
                x[0][i] += eps;
                let up = f(&x);
                x[0][i] -= 2.0 * eps;
                let down = f(&x);
                let num = (up - down) / (2.0 * eps as f64);
                let a = sub[i - off] as f64;
                diff += (a - num).powi(2);
                na += a * a;
                nn += num * num;
            }
            let rel = diff.sqrt() / na.sqrt().max(nn.sqrt()).max(1e-6);
            assert!(
                rel < TOL || na.sqrt().max(nn.sqrt()) < 1e-6,
                "stage {} {}: relative error {rel:.3e} (|a| {:.3e} |num| {:.3e})",
                spec.index,
                e.name,
                na.sqrt(),
                nn.sqrt()
            );
        }
        match din {
            Some(din) => compare(&format!("stage {} input", spec.index), &inputs, 1, &din, &f, 3e-3, 40, &mut rng),
            None => assert!(spec.has_embedding()),
        }
    }
}

/// The LM head and loss computed a few rows at a time (the full logits
/// never held) give the losses, gradients and input gradient of the whole
/// computation, and match finite differences themselves.
#[test]
fn the_chunked_lm_head_matches_the_whole_one_and_finite_differences() {
    let be = Arc::new(CpuBackend::new());
    let mut rng = Rng::new(21);
    let cfg = micro_config(4);
    let spec = StageSpec::split(&cfg, 2).unwrap().pop().unwrap();
    assert!(spec.has_lm_head());
    let (batch, seq) = (2, 5);
    let n = batch * seq;
    let hidden = randn(&mut rng, n * cfg.bottleneck, 1.0);
    let targets: Vec<u32> = (0..n).map(|_| rng.below(cfg.vocab_real as u64) as u32).collect();
    let run = |budget: Option<usize>, params: &[f32]| {
        let mut s = Stage::with_params(be.clone(), &cfg, spec.clone(), params).unwrap();
        if let Some(b) = budget {
            s.set_logit_budget(b);
        }
        let out = s.forward_backward(StageInput::Hidden(&hidden), &targets, batch, seq, 1.0).unwrap();
        (out.losses, out.din.unwrap(), s.grads_host())
    };
    let params = Stage::new(be.clone(), &cfg, spec.clone(), 5).params_host();
    let (l_whole, d_whole, g_whole) = run(None, &params);
    // 3 rows of logits at a time: chunks of 3, 3, 3 and 1 rows.
    let (l_chunk, d_chunk, g_chunk) = run(Some(3 * cfg.vocab_size), &params);
    let max_rel = |a: &[f32], b: &[f32]| {
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    };
    assert!(max_rel(&l_whole, &l_chunk) < 1e-6, "losses");
    assert!(max_rel(&d_whole, &d_chunk) < 1e-5, "input gradient");
    let lm = spec_range(&be, &cfg, &spec, "lm_head.weight");
    assert!(max_rel(&g_whole[lm.clone()], &g_chunk[lm.clone()]) < 1e-5, "LM head gradient");
    assert!(max_rel(&g_whole, &g_chunk) < 1e-5, "every gradient");
    // One row at a time, against finite differences of the loss.
    let (_, _, g_rows) = run(Some(1), &params);
    let loss = |p: &[f32]| -> f64 {
        let mut s = Stage::with_params(be.clone(), &cfg, spec.clone(), p).unwrap();
        s.set_logit_budget(1);
        let l = s.eval_loss(StageInput::Hidden(&hidden), &targets, batch, seq).unwrap();
        l.iter().map(|&v| v as f64).sum::<f64>() / n as f64
    };
    let mut idx_rng = Rng::new(3);
    let norm = spec_range(&be, &cfg, &spec, "model.norm.weight");
    for range in [lm, norm] {
        for _ in 0..8 {
            let i = range.start + idx_rng.below(range.len() as u64) as usize;
            let eps = 3e-3f32;
            let mut p = params.clone();
            p[i] += eps;
            let up = loss(&p);
            p[i] -= 2.0 * eps;
            let num = (up - loss(&p)) / (2.0 * eps as f64);
            let a = g_rows[i] as f64;
            assert!((a - num).abs() < 2e-3 * num.abs().max(0.05), "param {i}: analytic {a} vs numeric {num}");
        }
    }
}

fn spec_range(be: &Arc<CpuBackend>, cfg: &ModelConfig, spec: &StageSpec, name: &str) -> std::ops::Range<usize> {
    Stage::new(be.clone(), cfg, spec.clone(), 0).layout().range(name)
}
