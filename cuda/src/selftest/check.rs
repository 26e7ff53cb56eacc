//! What a selftest row is ([`Check`]), the kernels a row exercises
//! ([`Kernels`]) and their production implementations (CPU and GPU), and
//! how results are compared.

use iota_core::WireCodec;
use iota_core::merge::{OuterOpt, ReduceRule, reduce_slice};

use crate::gpu::Gpu;
use crate::runtime::CudaError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(Clone, Debug)]
pub struct Check {
    pub op: String,
    pub shape: String,
    pub max_rel_err: f64,
    pub tolerance: f64,
    pub millis: f64,
    /// What the result was compared against (e.g. "naive", "cpu").
    pub reference: String,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.max_rel_err.is_finite() && self.max_rel_err <= self.tolerance
    }
}

/// The kernels under test: one slice reduce of the butterfly merge and the
/// int8-per-row wire codec.
pub trait Kernels {
    /// Short name, shown as the reference of a row.
    fn name(&self) -> &'static str;
    /// `iota_core::merge::reduce_slice`'s contract: returns the update u,
    /// updates `momentum` in place.
    fn reduce_slice(
        &self,
        rule: ReduceRule,
        outer: OuterOpt,
        contribs: &[Option<&[f32]>],
        weights: &[f64],
        momentum: &mut [f32],
    ) -> Result<Vec<f32>, CudaError>;
    /// The int8-per-row wire bytes of a finite `[rows, cols]` tensor.
    fn encode_int8_rows(&self, x: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, CudaError>;
    /// Decodes int8-per-row bytes of the right length; Ok(None) when they
    /// are invalid (code -128, a non-finite or negative scale, a decoded
    /// value that overflows).
    fn decode_int8_rows(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Option<Vec<f32>>, CudaError>;
}

/// The production CPU code: what every miner without a GPU runs, and the
/// reference the GPU kernels must match.
pub struct CpuProduction;

impl Kernels for CpuProduction {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn reduce_slice(
        &self,
        rule: ReduceRule,
        outer: OuterOpt,
        contribs: &[Option<&[f32]>],
        weights: &[f64],
        momentum: &mut [f32],
    ) -> Result<Vec<f32>, CudaError> {
        Ok(reduce_slice(rule, outer, contribs, weights, momentum).0)
    }
    fn encode_int8_rows(&self, x: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, CudaError> {
        iota_model::codec::encode(WireCodec::Int8Row, rows, cols, x).map_err(|e| CudaError::Driver(e.to_string()))
    }
    fn decode_int8_rows(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Option<Vec<f32>>, CudaError> {
        Ok(iota_model::codec::decode(WireCodec::Int8Row, rows, cols, bytes).ok())
    }
}

impl Kernels for Gpu {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn reduce_slice(
        &self,
        rule: ReduceRule,
        outer: OuterOpt,
        contribs: &[Option<&[f32]>],
        weights: &[f64],
        momentum: &mut [f32],
    ) -> Result<Vec<f32>, CudaError> {
        Ok(Gpu::reduce_slice(self, rule, outer, contribs, weights, momentum)?.0)
    }
    fn encode_int8_rows(&self, x: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, CudaError> {
        Gpu::encode_int8_rows(self, x, rows, cols)
    }
    fn decode_int8_rows(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Option<Vec<f32>>, CudaError> {
        Gpu::decode_int8_rows(self, bytes, rows, cols)
    }
}

/// Largest |got - want| relative to want's largest finite magnitude. A
/// NaN or infinity on one side only (or different infinities) is an
/// infinite error: `f64::max` alone would skip a NaN and let it pass.
pub(super) fn max_rel(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs() as f64)).max(1e-30);
    let mut worst = 0.0f64;
    for (&x, &y) in got.iter().zip(want) {
        if x == y || (x.is_nan() && y.is_nan()) {
            continue;
        }
        let d = (x as f64 - y as f64).abs() / scale;
        if !d.is_finite() {
            return f64::INFINITY;
        }
        worst = worst.max(d);
    }
    worst
}
