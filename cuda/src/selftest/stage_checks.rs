//! A whole body stage on the GPU against `CpuBackend`: the bottleneck
//! decoder, a block and the bottleneck encoder, forward and backward, in
//! both bottleneck styles and both GEMM precisions. The residual style adds
//! no kernel (its SwiGLU branches are GEMMs and the SwiGLU op), but it
//! runs them at shapes no block has: a 2-wide input to the decoder's
//! branch and a 2-wide output of the encoder's, the 128x boundary of
//! `small`.

use std::sync::Arc;
use std::time::Instant;

use iota_core::rng::Rng;
use iota_core::{BottleneckStyle, ModelConfig, StageSpec};
use iota_model::backend::Backend;
use iota_model::{Stage, StageInput};

use super::check::{Check, max_rel};
use crate::backend::{CudaBackend, GemmPrecision};
use crate::gpu::Gpu;
use crate::runtime::CudaError;

/// `tiny` in 3 stages with `width` boundary channels: the middle stage
/// has the decoder, one block and the encoder.
pub(super) fn body_stage_config(style: BottleneckStyle, width: usize) -> (ModelConfig, StageSpec) {
    let mut cfg = ModelConfig::preset("tiny").expect("a preset");
    cfg.bottleneck = width;
    cfg.bottleneck_style = style;
    let spec = StageSpec::split(&cfg, 3).expect("tiny splits in 3").swap_remove(1);
    (cfg, spec)
}

/// The stage's output, input gradient and parameter gradients for one
/// micro-batch (`batch` x `seq`) of the given input and output gradient.
pub(super) fn body_stage_run<B: Backend>(
    be: Arc<B>,
    cfg: &ModelConfig,
    spec: &StageSpec,
    (batch, seq): (usize, usize),
    hidden: &[f32],
    dout: &[f32],
) -> Result<[Vec<f32>; 3], CudaError> {
    let fail = |e: iota_model::StageError| CudaError::Driver(format!("stage check: {e}"));
    let mut stage = Stage::new(be, cfg, spec.clone(), 11);
    let z = stage.forward(1, StageInput::Hidden(hidden), batch, seq).map_err(fail)?;
    let din = stage.backward(1, dout).map_err(fail)?.unwrap_or_default();
    Ok([z, din, stage.grads_host()])
}

/// A head or body stage of `tiny` in 3 stages driven in a pipeline's order
/// (forward 1, forward 2, backward 1, an AdamW step, backward 2: the second
/// backward runs on a stash), keeping its activations or recomputing them
/// (`Stage::set_recompute`; a recomputing head's stash leaves the
/// embedding out and is swapped in by copies): every output, input
/// gradient and weight gradient, in order.
pub(super) fn pipelined_stage_run<B: Backend>(
    be: Arc<B>,
    stage_index: usize,
    recompute: bool,
    (batch, seq): (usize, usize),
) -> Result<Vec<Vec<f32>>, CudaError> {
    let fail = |e: iota_model::StageError| CudaError::Driver(format!("recompute check: {e}"));
    let cfg = ModelConfig::preset("tiny").expect("a preset");
    let spec = StageSpec::split(&cfg, 3).expect("tiny splits in 3").swap_remove(stage_index);
    let mut stage = Stage::new(be.clone(), &cfg, spec.clone(), 11);
    stage.set_recompute(recompute);
    let mut optim = iota_model::optim::AdamW::new(&*be, stage.layout().total());
    let n = batch * seq;
    let mut rng = Rng::new(5 + stage_index as u64);
    let tokens: Vec<Vec<u32>> = (0..2).map(|_| (0..n).map(|_| rng.below(256) as u32).collect()).collect();
    let hidden: Vec<Vec<f32>> = (0..2).map(|_| (0..n * spec.boundary_width).map(|_| rng.normal()).collect()).collect();
    let dout: Vec<Vec<f32>> =
        (0..2).map(|_| (0..n * spec.boundary_width).map(|_| 1e-2 * rng.normal()).collect()).collect();
    let input = |i: usize| {
        if spec.has_embedding() { StageInput::Tokens(&tokens[i]) } else { StageInput::Hidden(&hidden[i]) }
    };
    let mut seen = Vec::new();
    seen.push(stage.forward(1, input(0), batch, seq).map_err(fail)?);
    seen.push(stage.forward(2, input(1), batch, seq).map_err(fail)?);
    seen.extend(stage.backward(1, &dout[0]).map_err(fail)?);
    seen.push(stage.grads_host());
    optim.step(&mut stage, &iota_model::optim::AdamWConfig::default(), 1e-2);
    stage.zero_grads();
    seen.extend(stage.backward(2, &dout[1]).map_err(fail)?);
    seen.push(stage.grads_host());
    seen.push(stage.params_host());
    Ok(seen)
}

/// The worst relative error over two runs' outputs, in order (infinite
/// when they do not have the same outputs).
fn worst_of(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter().zip(want).map(|(g, w)| max_rel(g, w)).fold(0.0, f64::max)
}

/// Appends a row per (style, GEMM precision): the worst of the output's,
/// the input gradient's and the weight gradients' relative errors.
pub(super) fn append(gpu: Arc<Gpu>, out: &mut Vec<Check>) -> Result<(), CudaError> {
    let cpu = Arc::new(iota_model::CpuBackend::new());
    let (batch, seq) = (2, 64);
    for style in [BottleneckStyle::Linear, BottleneckStyle::Residual] {
        let (cfg, spec) = body_stage_config(style, 2);
        let n = batch * seq * cfg.bottleneck;
        let mut rng = Rng::new(3);
        let hidden: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let dout: Vec<f32> = (0..n).map(|_| 1e-2 * rng.normal()).collect();
        let want = body_stage_run(cpu.clone(), &cfg, &spec, (batch, seq), &hidden, &dout)?;
        // Not yet calibrated on a GPU: fp32 GEMMs should agree to float
        // rounding compounded over a stage; bf16 operands lose 8 bits each.
        for (precision, tol) in [(GemmPrecision::F32, 1e-4), (GemmPrecision::Bf16, 5e-2)] {
            let cuda = Arc::new(CudaBackend::with_precision(gpu.clone(), precision)?);
            let t0 = Instant::now();
            let got = body_stage_run(cuda, &cfg, &spec, (batch, seq), &hidden, &dout)?;
            let err = got.iter().zip(&want).map(|(g, w)| max_rel(g, w)).fold(0.0, f64::max);
            out.push(Check {
                op: format!("body stage, {} bottleneck, {} GEMMs", style.name(), precision.name()),
                shape: format!("tiny, b={}, {batch}x{seq}: z, dz_in, grads", cfg.bottleneck),
                max_rel_err: err,
                tolerance: tol,
                millis: t0.elapsed().as_secs_f64() * 1e3,
                reference: "CpuBackend".into(),
            });
        }
    }
    // Recomputing is the same arithmetic on the same backend: expected
    // bit-identical (0), as on the CPU; a difference means a kernel whose
    // result depends on more than its inputs (atomics, a GEMM algorithm
    // picked per call).
    for (stage, what) in [(0, "head"), (1, "body")] {
        let cuda = Arc::new(CudaBackend::with_precision(gpu.clone(), GemmPrecision::Bf16)?);
        let t0 = Instant::now();
        let kept = pipelined_stage_run(cuda.clone(), stage, false, (batch, seq))?;
        let recomputed = pipelined_stage_run(cuda, stage, true, (batch, seq))?;
        let err = worst_of(&recomputed, &kept);
        out.push(Check {
            op: format!("{what} stage recomputing activations, bf16 GEMMs"),
            shape: format!("tiny, {batch}x{seq}, 2 in flight, a step between: z, dz_in, grads, weights"),
            max_rel_err: err,
            tolerance: 1e-6,
            millis: t0.elapsed().as_secs_f64() * 1e3,
            reference: "the same stage keeping them".into(),
        });
    }
    // Fused casts: RoPE, SwiGLU's and RMSNorm's backward write the bf16
    // copies the GEMMs read next instead of `cast_bf16` making them. The
    // copy's rounding is the cast's, so every GEMM reads the same bits:
    // expected bit-identical (0). A difference means a copy read stale or
    // written wrong (a scratch reused before its GEMM, a write not noted).
    for (stage, what) in [(0, "head"), (1, "body")] {
        for recompute in [false, true] {
            let plain = CudaBackend::with_precision(gpu.clone(), GemmPrecision::Bf16)?;
            let (Some(off), Some(on)) = (plain.with_fused_casts(false), plain.with_fused_casts(true)) else {
                continue;
            };
            let t0 = Instant::now();
            let want = pipelined_stage_run(Arc::new(off), stage, recompute, (batch, seq))?;
            let got = pipelined_stage_run(Arc::new(on), stage, recompute, (batch, seq))?;
            let err = worst_of(&got, &want);
            let how = if recompute { "recomputing" } else { "keeping activations" };
            out.push(Check {
                op: format!("{what} stage with fused casts, {how}, bf16 GEMMs"),
                shape: format!("tiny, {batch}x{seq}, 2 in flight, a step between: z, dz_in, grads, weights"),
                max_rel_err: err,
                tolerance: 1e-6,
                millis: t0.elapsed().as_secs_f64() * 1e3,
                reference: "the same stage with cast_bf16".into(),
            });
        }
    }
    Ok(())
}
