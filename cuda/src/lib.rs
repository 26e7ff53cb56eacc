//! iota-cuda: the CUDA side of iota-rs.
//!
//! Kernels are `.cu` files under `cuda/kernels/`, embedded in the binary with
//! `include_str!` and compiled by NVRTC for the device they run on; the PTX
//! is kept on disk between runs (`ptx_cache`), so a machine compiles each
//! program once. Every CUDA library (driver, NVRTC, cuBLASLt) is loaded at
//! run time, so the workspace builds on a machine with no CUDA at all and
//! the binaries start there; asking for a GPU then fails with a plain
//! message instead of a panic.

pub mod backend;
mod cast_cache;
pub mod gpu;
pub mod kernel_timer;
pub mod kernels;
pub mod lt;
pub mod pinned;
pub mod ptx_cache;
pub mod runtime;
pub mod selftest;

pub use kernels::{KERNELS, Kernel};
pub use ptx_cache::{PtxCache, PtxSource, compile_cached};
pub use runtime::{
    CudaError, compile, describe, driver_present, ensure_nvrtc, find_headers, include_dirs, nvrtc_present,
    preload_nvrtc,
};

/// Where a process computes, as a command line names it: `cpu`, `cuda`
/// (GPU 0) or `cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComputeDevice {
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for ComputeDevice {
    type Err = String;
    fn from_str(s: &str) -> Result<ComputeDevice, String> {
        match s {
            "cpu" => Ok(ComputeDevice::Cpu),
            "cuda" => Ok(ComputeDevice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(ComputeDevice::Cuda)
                .ok_or_else(|| format!("unknown device '{s}' (cpu, cuda, cuda:N)")),
        }
    }
}

impl std::fmt::Display for ComputeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ComputeDevice::Cpu => write!(f, "cpu"),
            ComputeDevice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Opens GPU `ordinal` with the kernels compiled (loading NVRTC from the
/// cache if needed).
pub fn open_gpu(ordinal: usize) -> Result<std::sync::Arc<gpu::Gpu>, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    ensure_nvrtc();
    Ok(std::sync::Arc::new(gpu::Gpu::open(ordinal)?))
}

/// Opens GPU `ordinal` and builds a `CudaBackend` on it.
pub fn open_backend(ordinal: usize, precision: backend::GemmPrecision) -> Result<backend::CudaBackend, CudaError> {
    backend::CudaBackend::with_precision(open_gpu(ordinal)?, precision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse() {
        assert_eq!("cpu".parse(), Ok(ComputeDevice::Cpu));
        assert_eq!("cuda".parse(), Ok(ComputeDevice::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(ComputeDevice::Cuda(3)));
        assert!("cuda:x".parse::<ComputeDevice>().is_err());
        assert!("gpu".parse::<ComputeDevice>().unwrap_err().contains("cpu, cuda, cuda:N"));
        assert_eq!(ComputeDevice::Cuda(2).to_string(), "cuda:2");
    }
}
