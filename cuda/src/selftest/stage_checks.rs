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
    Ok(())
}
