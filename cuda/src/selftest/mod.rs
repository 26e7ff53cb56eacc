//! `iota-miner selftest`: every custom kernel against an independent
//! reference on fresh random inputs.
//!
//! The butterfly reduce and the int8 wire codec go through [`Kernels`], and
//! [`run_with`] checks one implementation (the subject) against another (the
//! reference), row by row. `--device cuda` checks the GPU ([`Gpu`]) against
//! the production CPU code ([`CpuProduction`]: `iota_core::merge::reduce_slice`,
//! `iota_model::codec`), then appends the GPU-only checks (every `Backend`
//! op, bf16 GEMMs, the pinned receive path, NCCL, a whole body stage with
//! each bottleneck style). `--device cpu` (no GPU)
//! checks the production CPU code against [`Naive`]: straight-line loops
//! written from the algorithms' definitions, sharing no code with it.

mod check;
mod gpu_checks;
mod naive;
mod rows;
mod stage_checks;
#[cfg(test)]
mod tests;

pub use self::check::{Check, CpuProduction, Device, Kernels};
pub use self::naive::Naive;
pub use self::rows::run_with;
use crate::gpu::Gpu;
use crate::runtime::CudaError;

/// Runs every check; the caller prints the table and fails on any miss.
pub fn run(device: Device) -> Result<Vec<Check>, CudaError> {
    match device {
        Device::Cpu => run_with(&CpuProduction, &Naive),
        Device::Cuda => {
            let gpu = std::sync::Arc::new(Gpu::open(0)?);
            let mut out = run_with(gpu.as_ref(), &CpuProduction)?;
            gpu_checks::append(gpu.clone(), &mut out)?;
            stage_checks::append(gpu, &mut out)?;
            Ok(out)
        }
    }
}
