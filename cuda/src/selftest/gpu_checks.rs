//! The checks only a GPU can run, appended to the kernel rows by
//! `run(Device::Cuda)`: every `Backend` op against `CpuBackend`, the bf16
//! GEMM path, the pinned receive path and an NCCL all-reduce.

use std::sync::Arc;
use std::time::Instant;

use iota_core::WireCodec;
use iota_core::rng::Rng;
use iota_model::backend::{AdamStep, AttnDims, Backend};

use super::check::{Check, max_rel};
use super::rows::codec_input;
use crate::gpu::Gpu;
use crate::runtime::CudaError;

/// Appends every GPU-only check to `out`, in the table's order.
pub(super) fn append(gpu: Arc<Gpu>, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (rows, cols, x) = codec_input();
    let cpu_err = |e: iota_core::CoreError| CudaError::Driver(e.to_string());
    let bytes = iota_model::codec::encode(WireCodec::Int8Row, rows, cols, &x).map_err(cpu_err)?;
    let cpu_back = iota_model::codec::decode(WireCodec::Int8Row, rows, cols, &bytes).map_err(cpu_err)?;
    pinned_receive_check(gpu.clone(), &x, rows, cols, &cpu_back, out)?;
    nccl_check(out)?;
    backend_checks(gpu, out)
}

/// Both backends, and the inputs' random source.
struct Pair {
    cuda: crate::backend::CudaBackend,
    cpu: iota_model::CpuBackend,
    rng: Rng,
}

impl Pair {
    fn rand(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.rng.normal()).collect()
    }
}

/// One row of the table: `got` (the GPU's) against `want` (the CPU's).
fn push(out: &mut Vec<Check>, op: &str, shape: String, got: &[f32], want: &[f32], tol: f64, t0: Instant) {
    out.push(Check {
        op: op.into(),
        shape,
        max_rel_err: max_rel(got, want),
        tolerance: tol,
        millis: t0.elapsed().as_secs_f64() * 1e3,
        reference: "CpuBackend".into(),
    });
}

/// Runs the body on both backends with the same host inputs; returns (gpu,
/// cpu) host outputs.
macro_rules! both {
    ($cuda:expr, $cpu:expr, $inputs:expr, $outs:expr, |$be:ident, $ins:ident, $os:ident| $body:block) => {{
        fn run<B: Backend>($be: &B, inputs: &[Vec<f32>], outs: &[Vec<f32>]) -> Vec<Vec<f32>> {
            let ins_b: Vec<B::Buf> = inputs.iter().map(|v| $be.upload(v)).collect();
            let mut os_b: Vec<B::Buf> = outs.iter().map(|v| $be.upload(v)).collect();
            {
                let $ins = &ins_b;
                let $os = &mut os_b;
                $body
            }
            os_b.iter().map(|b| $be.to_host(b)).collect()
        }
        // Evaluated once: both backends get the very same inputs.
        let (inputs, outs): (Vec<Vec<f32>>, Vec<Vec<f32>>) = ($inputs, $outs);
        (run($cuda, &inputs, &outs), run($cpu, &inputs, &outs))
    }};
}

/// Every `Backend` op on the GPU against `CpuBackend`, same inputs.
fn backend_checks(gpu: Arc<Gpu>, out: &mut Vec<Check>) -> Result<(), CudaError> {
    bf16_gemm_checks(gpu.clone(), out)?;
    let mut p =
        Pair { cuda: crate::backend::CudaBackend::new(gpu)?, cpu: iota_model::CpuBackend::new(), rng: Rng::new(42) };
    gemm_checks(&mut p, out);
    norm_and_activation_checks(&mut p, out);
    rope_and_embedding_checks(&mut p, out);
    attention_checks(&mut p, out);
    loss_and_optimizer_checks(&mut p, out);
    decode_wire_check(&mut p, out)
}

const N: usize = 96;
const C: usize = 128;
const OC: usize = 160;

fn gemm_checks(p: &mut Pair, out: &mut Vec<Check>) {
    let (n, c, oc) = (N, C, OC);
    let t0 = Instant::now();
    let (g, c_) = both!(&p.cuda, &p.cpu, vec![p.rand(n * c), p.rand(oc * c)], vec![p.rand(n * oc)], |be, i, o| {
        let (a, w) = (be.all(&i[0]), be.all(&i[1]));
        be.matmul(be.all_mut(&mut o[0]), a, w, 96, 128, 160, true);
    });
    push(out, "matmul (acc)", format!("{n}x{c} @ {oc}x{c}^T"), &g[0], &c_[0], 1e-5, t0);
    let t0 = Instant::now();
    let (g, c_) = both!(&p.cuda, &p.cpu, vec![p.rand(n * oc), p.rand(oc * c)], vec![p.rand(n * c)], |be, i, o| {
        let (d, w) = (be.all(&i[0]), be.all(&i[1]));
        be.matmul_bwd_input(be.all_mut(&mut o[0]), d, w, 96, 128, 160, false);
    });
    push(out, "matmul_bwd_input", format!("{n}x{oc} @ {oc}x{c}"), &g[0], &c_[0], 1e-5, t0);
    let t0 = Instant::now();
    let (g, c_) = both!(&p.cuda, &p.cpu, vec![p.rand(n * oc), p.rand(n * c)], vec![p.rand(oc * c)], |be, i, o| {
        let (d, x) = (be.all(&i[0]), be.all(&i[1]));
        be.matmul_bwd_weight(be.all_mut(&mut o[0]), d, x, 96, 128, 160);
    });
    push(out, "matmul_bwd_weight", format!("{oc}x{c}"), &g[0], &c_[0], 1e-5, t0);
}

fn norm_and_activation_checks(p: &mut Pair, out: &mut Vec<Check>) {
    let (n, c) = (N, C);
    let t0 = Instant::now();
    let (g, c_) = both!(
        &p.cuda,
        &p.cpu,
        vec![p.rand(n * c), p.rand(c).iter().map(|x| 1.0 + 0.1 * x).collect()],
        vec![vec![0.0; n * c], vec![0.0; n]],
        |be, i, o| {
            let (x, w) = (be.all(&i[0]), be.all(&i[1]));
            let (a, b) = o.split_at_mut(1);
            be.rmsnorm(be.all_mut(&mut a[0]), be.all_mut(&mut b[0]), x, w, 96, 128, 1e-5);
        }
    );
    push(out, "rmsnorm", format!("{n}x{c}"), &g[0], &c_[0], 1e-5, t0);
    let t0 = Instant::now();
    let (g, c_) = both!(&p.cuda, &p.cpu, vec![p.rand(n * 2 * c)], vec![vec![0.0; n * c]], |be, i, o| {
        be.swiglu(be.all_mut(&mut o[0]), be.all(&i[0]), 96, 128);
    });
    push(out, "swiglu", format!("{n}x{c}"), &g[0], &c_[0], 1e-5, t0);
    let t0 = Instant::now();
    let (g, c_) =
        both!(&p.cuda, &p.cpu, vec![p.rand(n * c), p.rand(n * 2 * c)], vec![vec![0.0; n * 2 * c]], |be, i, o| {
            be.swiglu_bwd(be.all_mut(&mut o[0]), be.all(&i[0]), be.all(&i[1]), 96, 128);
        });
    push(out, "swiglu_bwd", format!("{n}x{c}"), &g[0], &c_[0], 1e-5, t0);
    let t0 = Instant::now();
    let (g, c_) = both!(
        &p.cuda,
        &p.cpu,
        vec![p.rand(n * c), p.rand(n * c), p.rand(c).iter().map(|x| 1.0 + 0.1 * x).collect()],
        vec![p.rand(n * c), p.rand(c), vec![0.0; n * c], vec![0.0; n]],
        |be, i, o| {
            let (dx, rest) = o.split_at_mut(1);
            let (dw, rest) = rest.split_at_mut(1);
            let (y, r) = rest.split_at_mut(1);
            be.rmsnorm(be.all_mut(&mut y[0]), be.all_mut(&mut r[0]), be.all(&i[1]), be.all(&i[2]), 96, 128, 1e-5);
            be.rmsnorm_bwd(
                be.all_mut(&mut dx[0]),
                be.all_mut(&mut dw[0]),
                be.all(&i[0]),
                be.all(&i[1]),
                be.all(&i[2]),
                be.all(&r[0]),
                96,
                128,
            );
        }
    );
    push(out, "rmsnorm_bwd dx", format!("{n}x{c}"), &g[0], &c_[0], 1e-5, t0);
    push(out, "rmsnorm_bwd dw", format!("{c}"), &g[1], &c_[1], 1e-5, Instant::now());
}

fn rope_and_embedding_checks(p: &mut Pair, out: &mut Vec<Check>) {
    let n = N;
    let t0 = Instant::now();
    let table: Vec<f32> = (0..2 * 48 * 8).map(|i| ((i % 97) as f32 * 0.37).cos()).collect();
    let (g, c_) = both!(&p.cuda, &p.cpu, vec![table], vec![p.rand(96 * 80)], |be, i, o| {
        be.rope(be.all_mut(&mut o[0]), be.all(&i[0]), 96, 48, 80, 4, 16, false);
        be.rope(be.all_mut(&mut o[0]), be.all(&i[0]), 96, 48, 80, 2, 16, true);
    });
    push(out, "rope (+ inverse)", "96 rows, 4 heads x 16".into(), &g[0], &c_[0], 1e-5, t0);
    let t0 = Instant::now();
    let (g, c_) = both!(
        &p.cuda,
        &p.cpu,
        vec![p.rand(300 * 64), p.rand(n * 64)],
        vec![vec![0.0; n * 64], p.rand(300 * 64)],
        |be, i, o| {
            let tokens: Vec<u32> = (0..96u32).map(|k| (k * 7919) % 50).collect();
            let (e, dw) = o.split_at_mut(1);
            be.embedding(be.all_mut(&mut e[0]), &tokens, be.all(&i[0]), 64);
            be.embedding_bwd(be.all_mut(&mut dw[0]), be.all(&i[1]), &tokens, 64);
        }
    );
    push(out, "embedding", "96 tokens x 64".into(), &g[0], &c_[0], 0.0, t0);
    push(out, "embedding_bwd (repeated tokens)", "96 tokens x 64".into(), &g[1], &c_[1], 1e-6, Instant::now());
    let x = p.rand(100_000);
    let t0 = Instant::now();
    let (cuda, cpu) = (&p.cuda, &p.cpu);
    let xg = cuda.upload(&x);
    let (sg, sc) = (cuda.sum_squares(cuda.all(&xg)), cpu.sum_squares(cpu.all(&cpu.upload(&x))));
    push(out, "sum_squares", "100000".into(), &[sg as f32], &[sc as f32], 1e-6, t0);
}

fn attention_checks(p: &mut Pair, out: &mut Vec<Check>) {
    let dims = AttnDims { batch: 2, seq: 48, n_heads: 4, n_kv_heads: 2, head_dim: 16 };
    let t0 = Instant::now();
    let (g, c_) = both!(
        &p.cuda,
        &p.cpu,
        vec![p.rand(dims.rows() * dims.qkv_dim())],
        vec![vec![0.0; dims.rows() * dims.q_dim()], vec![0.0; dims.probs_len()]],
        |be, i, o| {
            let dims = AttnDims { batch: 2, seq: 48, n_heads: 4, n_kv_heads: 2, head_dim: 16 };
            let (a, b) = o.split_at_mut(1);
            be.attention(be.all_mut(&mut a[0]), be.all_mut(&mut b[0]), be.all(&i[0]), dims);
        }
    );
    push(out, "attention (GQA, causal)", "2x48, 4/2 heads x 16".into(), &g[0], &c_[0], 1e-5, t0);
    let t0 = Instant::now();
    let (g, c_) = both!(
        &p.cuda,
        &p.cpu,
        vec![p.rand(dims.rows() * dims.qkv_dim()), p.rand(dims.rows() * dims.q_dim())],
        vec![
            vec![0.0; dims.rows() * dims.qkv_dim()],
            vec![0.0; dims.rows() * dims.q_dim()],
            vec![0.0; dims.probs_len()]
        ],
        |be, i, o| {
            let dims = AttnDims { batch: 2, seq: 48, n_heads: 4, n_kv_heads: 2, head_dim: 16 };
            let (a, rest) = o.split_at_mut(1);
            let (ob, pb) = rest.split_at_mut(1);
            be.attention(be.all_mut(&mut ob[0]), be.all_mut(&mut pb[0]), be.all(&i[0]), dims);
            let o = be.upload(&be.to_host(&ob[0]));
            be.attention_bwd(be.all_mut(&mut a[0]), be.all(&i[1]), be.all(&i[0]), be.all(&o), be.all(&pb[0]), dims);
        }
    );
    push(out, "attention_bwd", "2x48, 4/2 heads x 16".into(), &g[0], &c_[0], 1e-4, t0);
}

fn loss_and_optimizer_checks(p: &mut Pair, out: &mut Vec<Check>) {
    let n = N;
    let (vocab, vreal) = (512usize, 500usize);
    let targets: Vec<u32> = (0..n).map(|i| (i * 37 % vreal) as u32).collect();
    let logits = p.rand(n * vocab);
    let t0 = Instant::now();
    let (cuda, cpu) = (&p.cuda, &p.cpu);
    let mut lg = cuda.upload(&logits);
    let loss_g = cuda.cross_entropy(cuda.all_mut(&mut lg), &targets, n, vocab, vreal, 0.5);
    let mut lc = cpu.upload(&logits);
    let loss_c = cpu.cross_entropy(cpu.all_mut(&mut lc), &targets, n, vocab, vreal, 0.5);
    push(out, "cross_entropy loss", format!("{n}x{vocab}"), &loss_g, &loss_c, 1e-5, t0);
    let (got, want) = (cuda.to_host(&lg), cpu.to_host(&lc));
    push(out, "cross_entropy grad", format!("{n}x{vocab}"), &got, &want, 1e-5, Instant::now());
    // Adam, then NAdam (the `both!` body is a fn item: the flag is a literal).
    macro_rules! optimizer_check {
        ($what:expr, $nesterov:literal) => {{
            let t0 = Instant::now();
            let (g, c_) = both!(
                &p.cuda,
                &p.cpu,
                vec![p.rand(4096), p.rand(4096)],
                vec![p.rand(4096), p.rand(4096).iter().map(|x| x.abs()).collect(), p.rand(4096)],
                |be, i, o| {
                    let step = AdamStep {
                        lr: 1e-3,
                        beta1: 0.9,
                        beta2: 0.95,
                        eps: 1e-8,
                        weight_decay: 0.1,
                        t: 3,
                        grad_scale: 0.5,
                        nesterov: $nesterov,
                    };
                    let (m, rest) = o.split_at_mut(1);
                    let (v, p) = rest.split_at_mut(1);
                    be.adamw(be.all_mut(&mut p[0]), be.all(&i[0]), be.all_mut(&mut m[0]), be.all_mut(&mut v[0]), step);
                }
            );
            push(out, $what, "4096".into(), &g[2], &c_[2], 1e-5, t0);
        }};
    }
    optimizer_check!("adamw (params)", false);
    optimizer_check!("nadam (params)", true);
    // Muon's Newton-Schulz orthogonalisation, wide and tall (the two
    // orientations take different GEMMs), composed of the backend's ops.
    macro_rules! newton_schulz_check {
        ($rows:literal, $cols:literal) => {{
            let t0 = Instant::now();
            let (g, c_) = both!(&p.cuda, &p.cpu, vec![], vec![p.rand($rows * $cols)], |be, _i, o| {
                iota_model::optim::newton_schulz(be, &mut o[0], $rows, $cols);
            });
            push(out, "muon newton-schulz", format!("{}x{}", $rows, $cols), &g[0], &c_[0], 1e-4, t0);
        }};
    }
    newton_schulz_check!(96, 160);
    newton_schulz_check!(160, 96);
}

/// decode_wire: valid int8 bytes decode identically; bytes the CPU rejects
/// (a scale so large that 127 x scale overflows) are rejected.
fn decode_wire_check(p: &mut Pair, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let (rows, cols) = (257usize, 96usize);
    let x = p.rand(rows * cols);
    let (cuda, cpu) = (&p.cuda, &p.cpu);
    let bytes =
        iota_model::codec::encode(WireCodec::Int8Row, rows, cols, &x).map_err(|e| CudaError::Driver(e.to_string()))?;
    let t0 = Instant::now();
    let got = cuda.decode_wire(WireCodec::Int8Row, rows, cols, &bytes).map(|b| cuda.to_host(&b));
    let want = cpu.decode_wire(WireCodec::Int8Row, rows, cols, &bytes).map_err(|e| CudaError::Driver(e.to_string()))?;
    let mut huge = bytes.clone();
    huge[0] = 0x7f;
    huge[1] = 0x7f; // bf16 0x7f7f, the largest finite value
    huge[2] = 127;
    let both_reject = cuda.decode_wire(WireCodec::Int8Row, rows, cols, &huge).is_err()
        && cpu.decode_wire(WireCodec::Int8Row, rows, cols, &huge).is_err();
    out.push(Check {
        op: "decode_wire int8 (+ overflow rejected)".into(),
        shape: format!("{rows} x {cols}"),
        max_rel_err: match got {
            Ok(g) if both_reject => max_rel(&g, &want),
            _ => f64::INFINITY,
        },
        tolerance: 0.0,
        millis: t0.elapsed().as_secs_f64() * 1e3,
        reference: "CpuBackend".into(),
    });
    Ok(())
}

/// The bf16 GEMM path (cuBLASLt) against the CPU: exactly (to accumulation
/// order) on operands rounded to bf16 first, and within 1e-2 of the fp32
/// product on the raw operands.
fn bf16_gemm_checks(gpu: Arc<Gpu>, out: &mut Vec<Check>) -> Result<(), CudaError> {
    use iota_core::codec::{bf16_to_f32, f32_to_bf16};
    use iota_model::CpuBackend;
    use iota_model::backend::Backend;

    let cuda = crate::backend::CudaBackend::with_precision(gpu, crate::backend::GemmPrecision::Bf16)?;
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(7);
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| bf16_to_f32(f32_to_bf16(*x))).collect() };
    // Odd sizes on purpose: no dimension a multiple of 8 in the first shape.
    for (n, c, oc) in [(97usize, 131usize, 163usize), (512, 1024, 768)] {
        for which in ["matmul", "matmul_bwd_input", "matmul_bwd_weight"] {
            let (a_len, b_len, o_len) = match which {
                "matmul" => (n * c, oc * c, n * oc),
                "matmul_bwd_input" => (n * oc, oc * c, n * c),
                _ => (n * oc, n * c, oc * c),
            };
            let a: Vec<f32> = (0..a_len).map(|_| rng.normal()).collect();
            let b: Vec<f32> = (0..b_len).map(|_| rng.normal()).collect();
            let o0: Vec<f32> = (0..o_len).map(|_| rng.normal()).collect();
            #[allow(clippy::too_many_arguments)]
            fn go<B: Backend>(
                be: &B,
                which: &str,
                a: &[f32],
                b: &[f32],
                o0: &[f32],
                n: usize,
                c: usize,
                oc: usize,
            ) -> Vec<f32> {
                let (a, b, mut o) = (be.upload(a), be.upload(b), be.upload(o0));
                let (ar, br, om) = (be.all(&a), be.all(&b), be.all_mut(&mut o));
                match which {
                    "matmul" => be.matmul(om, ar, br, n, c, oc, true),
                    "matmul_bwd_input" => be.matmul_bwd_input(om, ar, br, n, c, oc, true),
                    _ => be.matmul_bwd_weight(om, ar, br, n, c, oc),
                }
                be.to_host(&o)
            }
            let t0 = Instant::now();
            let got = go(&cuda, which, &a, &b, &o0, n, c, oc);
            let millis = t0.elapsed().as_secs_f64() * 1e3;
            let exact = go(&cpu, which, &round(&a), &round(&b), &o0, n, c, oc);
            let fp32 = go(&cpu, which, &a, &b, &o0, n, c, oc);
            let shape = format!("n{n} c{c} oc{oc}");
            out.push(Check {
                op: format!("bf16 {which} vs bf16-rounded"),
                shape: shape.clone(),
                max_rel_err: max_rel(&got, &exact),
                tolerance: 1e-5,
                millis,
                reference: "CpuBackend, bf16-rounded operands".into(),
            });
            out.push(Check {
                op: format!("bf16 {which} vs fp32"),
                shape,
                max_rel_err: max_rel(&got, &fp32),
                tolerance: 1e-2,
                millis: 0.0,
                reference: "CpuBackend, fp32".into(),
            });
        }
    }
    bf16_attention_checks(&cuda, &cpu, &mut rng, out);
    weight_copy_checks(&cuda, &mut rng, out);
    Ok(())
}

/// The bf16 copies of weights never go stale: a weight read by a matmul,
/// then written (by `scale`, by an AdamW step that rewrites the copy itself,
/// by being freed and its memory handed out again), is read as written. Each
/// product is compared with the CPU's on the weights as they are then
/// (downloaded), operands rounded to bf16. The weight sits at an odd offset
/// in a larger buffer, as the stage's parameters do.
fn weight_copy_checks(cuda: &crate::backend::CudaBackend, rng: &mut Rng, out: &mut Vec<Check>) {
    use iota_core::codec::{bf16_to_f32, f32_to_bf16};
    use iota_model::backend::{AdamStep, Backend};
    let cpu = iota_model::CpuBackend::new();
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| bf16_to_f32(f32_to_bf16(*x))).collect() };
    let (n, c, oc) = (64usize, 96usize, 80usize);
    let off = 1; // one float in: not 16-byte aligned
    let inp_h: Vec<f32> = (0..n * c).map(|_| rng.normal()).collect();
    let inp = cuda.upload(&inp_h);
    let mut params = cuda.upload(&(0..off + oc * c + 3).map(|_| rng.normal()).collect::<Vec<_>>());
    let w = off..off + oc * c;
    let t0 = Instant::now();
    let mut worst = 0.0f64;
    let check = |cuda_params: &cudarc::driver::CudaSlice<f32>, worst: &mut f64| {
        let mut o = cuda.zeros(n * oc);
        cuda.matmul(cuda.all_mut(&mut o), cuda.all(&inp), cuda.view(cuda_params, w.clone()), n, c, oc, false);
        let got = cuda.to_host(&o);
        let wh = cuda.to_host(cuda_params)[w.clone()].to_vec();
        let mut want = vec![0.0; n * oc];
        cpu.matmul(&mut want, &round(&inp_h), &round(&wh), n, c, oc, false);
        *worst = worst.max(max_rel(&got, &want));
    };
    check(&params, &mut worst);
    check(&params, &mut worst); // the copy, reused
    cuda.scale(cuda.view_mut(&mut params, w.clone()), -2.0);
    check(&params, &mut worst);
    let g = cuda.upload(&(0..oc * c).map(|_| rng.normal()).collect::<Vec<_>>());
    let (mut m, mut v) = (cuda.zeros(oc * c), cuda.zeros(oc * c));
    let step = AdamStep {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        t: 1,
        grad_scale: 1.0,
        nesterov: false,
    };
    cuda.adamw(cuda.view_mut(&mut params, w.clone()), cuda.all(&g), cuda.all_mut(&mut m), cuda.all_mut(&mut v), step);
    check(&params, &mut worst);
    // Freed, and the same amount asked for again: likely the same address.
    drop(params);
    let params = cuda.upload(&(0..off + oc * c + 3).map(|_| rng.normal()).collect::<Vec<_>>());
    check(&params, &mut worst);
    // Activations: RMSNorm writes its output's copy; a matmul reads it
    // (kept), the weight gradient reads it again (last use); then the
    // output is rewritten and both must see the new values.
    let x = cuda.upload(&(0..n * c).map(|_| rng.normal()).collect::<Vec<_>>());
    let gain = cuda.upload(&(0..c).map(|_| 1.0 + 0.1 * rng.normal()).collect::<Vec<_>>());
    let w2_h: Vec<f32> = (0..oc * c).map(|_| rng.normal()).collect();
    let w2 = cuda.upload(&w2_h);
    let dout_h: Vec<f32> = (0..n * oc).map(|_| rng.normal()).collect();
    let dout = cuda.upload(&dout_h);
    let (mut xn, mut rstd) = (cuda.zeros(n * c), cuda.zeros(n));
    cuda.rmsnorm(cuda.all_mut(&mut xn), cuda.all_mut(&mut rstd), cuda.all(&x), cuda.all(&gain), n, c, 1e-5);
    let act_check = |xn: &cudarc::driver::CudaSlice<f32>, worst: &mut f64| {
        let xh = round(&cuda.to_host(xn));
        let mut o = cuda.zeros(n * oc);
        cuda.matmul(cuda.all_mut(&mut o), cuda.all(xn), cuda.all(&w2), n, c, oc, false);
        let mut want = vec![0.0; n * oc];
        cpu.matmul(&mut want, &xh, &round(&w2_h), n, c, oc, false);
        *worst = worst.max(max_rel(&cuda.to_host(&o), &want));
        let mut dw = cuda.zeros(oc * c);
        cuda.matmul_bwd_weight(cuda.all_mut(&mut dw), cuda.all(&dout), cuda.all(xn), n, c, oc);
        let mut want = vec![0.0; oc * c];
        cpu.matmul_bwd_weight(&mut want, &round(&dout_h), &xh, n, c, oc);
        *worst = worst.max(max_rel(&cuda.to_host(&dw), &want));
    };
    act_check(&xn, &mut worst);
    cuda.scale(cuda.all_mut(&mut xn), -0.5);
    act_check(&xn, &mut worst);
    out.push(Check {
        op: "bf16 copies follow writes".into(),
        shape: format!("n{n} c{c} oc{oc}, at offset {off}: read, reread, scale, adamw, realloc; rmsnorm out, rescaled"),
        max_rel_err: worst,
        tolerance: 1e-5,
        millis: t0.elapsed().as_secs_f64() * 1e3,
        reference: "CpuBackend, bf16-rounded operands".into(),
    });
}

/// Attention with bf16 GEMMs (Q, K, V, P, dO and dS rounded to bf16; scores,
/// softmax and accumulation in fp32) against the fp32 CPU reference.
fn bf16_attention_checks(
    cuda: &crate::backend::CudaBackend,
    cpu: &iota_model::CpuBackend,
    rng: &mut Rng,
    out: &mut Vec<Check>,
) {
    use iota_model::backend::{AttnDims, Backend};
    fn run<B: Backend>(be: &B, qkv: &[f32], dout: &[f32], dims: AttnDims) -> (Vec<f32>, Vec<f32>) {
        let x = be.upload(qkv);
        let d = be.upload(dout);
        let (mut o, mut p, mut dx) =
            (be.zeros(dims.rows() * dims.q_dim()), be.zeros(be.attention_saved_len(dims)), be.zeros(qkv.len()));
        be.attention(be.all_mut(&mut o), be.all_mut(&mut p), be.all(&x), dims);
        be.attention_bwd(be.all_mut(&mut dx), be.all(&d), be.all(&x), be.all(&o), be.all(&p), dims);
        (be.to_host(&o), be.to_host(&dx))
    }
    let flash = cuda.with_flash_attention();
    for dims in [
        AttnDims { batch: 2, seq: 48, n_heads: 4, n_kv_heads: 2, head_dim: 16 },
        AttnDims { batch: 2, seq: 128, n_heads: 8, n_kv_heads: 2, head_dim: 64 },
        // Rows past 2048 keys: the softmax kernels' path without registers.
        AttnDims { batch: 1, seq: 2056, n_heads: 2, n_kv_heads: 1, head_dim: 16 },
        // Sequences that are no whole number of the fused kernels' 64-row
        // tiles, and their other head sizes.
        AttnDims { batch: 2, seq: 100, n_heads: 6, n_kv_heads: 2, head_dim: 32 },
        AttnDims { batch: 1, seq: 70, n_heads: 2, n_kv_heads: 2, head_dim: 128 },
    ] {
        let qkv: Vec<f32> = (0..dims.rows() * dims.qkv_dim()).map(|_| rng.normal()).collect();
        let dout: Vec<f32> = (0..dims.rows() * dims.q_dim()).map(|_| rng.normal()).collect();
        let t0 = Instant::now();
        let (go, gdx) = run(cuda, &qkv, &dout, dims);
        let millis = t0.elapsed().as_secs_f64() * 1e3;
        let (co, cdx) = run(cpu, &qkv, &dout, dims);
        // The fused kernels (`flash.cu`) on the same inputs, where they
        // apply: bf16 Q, K, V, P, dO and dS as the GEMM path rounds them.
        let t1 = Instant::now();
        let fused = flash.as_ref().filter(|f| f.flash_applies(dims)).map(|f| run(f, &qkv, &dout, dims));
        let fused_millis = t1.elapsed().as_secs_f64() * 1e3;
        let shape =
            format!("{}x{}, {}/{} heads x {}", dims.batch, dims.seq, dims.n_heads, dims.n_kv_heads, dims.head_dim);
        let mut rows =
            vec![("bf16 attention vs fp32", &go, &co, 2e-2), ("bf16 attention_bwd vs fp32", &gdx, &cdx, 3e-2)];
        if let Some((fo, fdx)) = &fused {
            rows.push(("fused (flash) attention vs fp32", fo, &co, 2e-2));
            rows.push(("fused (flash) attention_bwd vs fp32", fdx, &cdx, 3e-2));
        }
        for (op, got, want, tol) in rows {
            let millis = if op.starts_with("fused") { fused_millis } else { millis };
            out.push(Check {
                op: op.into(),
                shape: shape.clone(),
                max_rel_err: max_rel(got, want),
                tolerance: tol,
                millis,
                reference: "CpuBackend, fp32".into(),
            });
        }
    }
}

/// The receive path: an int8 payload in page-locked memory, copied to the
/// device asynchronously and decoded there with the residual add fused,
/// against the CPU decode plus the same residual.
fn pinned_receive_check(
    gpu: Arc<Gpu>,
    x: &[f32],
    rows: usize,
    cols: usize,
    cpu_back: &[f32],
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    use crate::pinned::{DeviceReceiver, PinnedAllocator};
    let payload =
        iota_model::codec::encode(WireCodec::Int8Row, rows, cols, x).map_err(|e| CudaError::Driver(e.to_string()))?;
    let alloc = PinnedAllocator::new(&gpu);
    let ptr = alloc.alloc(payload.len())?;
    // SAFETY: ptr holds payload.len() page-locked bytes, freed below after the decode completed.
    let pinned = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), payload.len()) };
    pinned.copy_from_slice(&payload);
    let residual: Vec<f32> = (0..rows * cols).map(|i| (i % 13) as f32 * 0.25).collect();
    let want: Vec<f32> = cpu_back.iter().zip(&residual).map(|(a, b)| a + b).collect();
    let s = &gpu.stream;
    let res_d = s.clone_htod(&residual).map_err(|e| CudaError::Driver(format!("{e:?}")))?;
    let mut out_d = s.alloc_zeros::<f32>(rows * cols).map_err(|e| CudaError::Driver(format!("{e:?}")))?;
    let rx = DeviceReceiver::new(gpu.clone());
    let t0 = Instant::now();
    // SAFETY: `pinned` is page-locked and untouched until `wait` returns.
    let valid = unsafe { rx.decode_int8(pinned, rows, cols, &mut out_d, Some(&res_d)) }?.wait()?;
    let millis = t0.elapsed().as_secs_f64() * 1e3;
    let got = s.clone_dtoh(&out_d).map_err(|e| CudaError::Driver(format!("{e:?}")))?;
    // A corrupted payload (code -128) must come back invalid.
    pinned[2] = 0x80;
    let mut junk = s.alloc_zeros::<f32>(rows * cols).map_err(|e| CudaError::Driver(format!("{e:?}")))?;
    // SAFETY: as above.
    let rejected = !unsafe { rx.decode_int8(pinned, rows, cols, &mut junk, None) }?.wait()?;
    // SAFETY: allocated above; both decodes have completed.
    unsafe { alloc.free(ptr) };
    out.push(Check {
        op: "pinned receive + int8 decode + residual".into(),
        shape: format!("{rows} x {cols}"),
        max_rel_err: if valid && rejected { max_rel(&got, &want) } else { f64::INFINITY },
        tolerance: 0.0,
        millis,
        reference: "cpu decode + residual".into(),
    });
    Ok(())
}

/// NCCL across every GPU of this machine (a 1-rank communicator when there
/// is one): each rank all-reduces its own vector in place, one thread per
/// rank (communicator set-up blocks until all ranks join), and every rank
/// must end with the elementwise sum.
fn nccl_check(out: &mut Vec<Check>) -> Result<(), CudaError> {
    use cudarc::driver::{CudaContext, DevicePtr};
    let nccl = iota_ffi::Nccl::load().map_err(|e| CudaError::Driver(e.to_string()))?;
    let ranks = CudaContext::device_count().map_err(|e| CudaError::Driver(format!("{e:?}")))?.max(1) as usize;
    let n = 1 << 20;
    let vecs: Vec<Vec<f32>> = (0..ranks)
        .map(|r| {
            let mut rng = Rng::new(100 + r as u64);
            (0..n).map(|_| rng.normal()).collect()
        })
        .collect();
    let want: Vec<f32> = (0..n).map(|j| vecs.iter().map(|v| v[j] as f64).sum::<f64>() as f32).collect();
    let id = nccl.unique_id().map_err(|e| CudaError::Driver(e.to_string()))?;
    let t0 = Instant::now();
    let results: Vec<Result<Vec<f32>, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..ranks)
            .map(|r| {
                let (nccl, v) = (&nccl, &vecs[r]);
                sc.spawn(move || -> Result<Vec<f32>, String> {
                    let ctx = CudaContext::new(r).map_err(|e| format!("{e:?}"))?;
                    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
                    let stream = ctx.default_stream();
                    let buf = stream.clone_htod(v).map_err(|e| format!("{e:?}"))?;
                    let comm = nccl.init_rank(ranks as i32, id, r as i32).map_err(|e| e.to_string())?;
                    let ptr = buf.device_ptr(&stream).0;
                    // SAFETY: buf holds n f32 on this rank's device and outlives the synchronize below.
                    unsafe { nccl.all_reduce_sum_f32(&comm, ptr, n, stream.cu_stream() as u64) }
                        .map_err(|e| e.to_string())?;
                    stream.synchronize().map_err(|e| format!("{e:?}"))?;
                    let got = stream.clone_dtoh(&buf).map_err(|e| format!("{e:?}"))?;
                    nccl.destroy(comm).map_err(|e| e.to_string())?;
                    Ok(got)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("rank thread panicked".into()))).collect()
    });
    let millis = t0.elapsed().as_secs_f64() * 1e3;
    let mut worst = 0.0f64;
    for r in results {
        worst = worst.max(match r {
            Ok(got) => max_rel(&got, &want),
            Err(e) => return Err(CudaError::Driver(format!("NCCL all-reduce: {e}"))),
        });
    }
    out.push(Check {
        op: format!("nccl all-reduce sum ({ranks} rank{})", if ranks == 1 { "" } else { "s" }),
        shape: format!("{n}"),
        max_rel_err: worst,
        tolerance: 1e-6,
        millis,
        reference: "sum over ranks (f64)".into(),
    });
    Ok(())
}
