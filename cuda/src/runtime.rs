//! Finding and loading the CUDA libraries at run time (driver, NVRTC, the
//! headers kernels include) and compiling kernels, without ever panicking
//! on a machine that has none of them. The rest of the crate builds on
//! this; `lib.rs` re-exports it.

use std::path::{Path, PathBuf};

use crate::kernels::Kernel;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver found (libcuda.so could not be loaded): this machine has no usable NVIDIA GPU")]
    NoDriver,
    #[error(
        "NVRTC not found (libnvrtc.so.13 could not be loaded): install the CUDA 13.0 toolkit, or run scripts/fetch-nvrtc.py and put its lib/ on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("cuda_bf16.h not found in any include directory ({0}); set IOTA_CUDA_INCLUDE")]
    NoHeaders(String),
    #[error("kernel {name} does not compile:\n{log}")]
    Compile { name: &'static str, log: String },
    #[error("CUDA: {0}")]
    Driver(String),
}

/// Whether the CUDA driver library can be loaded. `CudaContext::new` panics
/// without it, so everything asks this first.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC can be loaded (after `preload_nvrtc`, if one was needed).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Loads NVRTC from a directory that is not on the loader's search path
/// (e.g. the cache `scripts/fetch-nvrtc.py` fills), by absolute path, so the
/// later load by name finds the library already in the process. The
/// builtins library goes first: NVRTC opens it by name too.
pub fn preload_nvrtc(lib_dir: &Path) -> Result<(), CudaError> {
    for name in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let p = lib_dir.join(name);
        // SAFETY: loading NVIDIA's library runs only its initialisers.
        let lib =
            unsafe { libloading::os::unix::Library::open(Some(&p), libc_flags()) }.map_err(|_| CudaError::NoNvrtc)?;
        // Kept for the life of the process, like a library linked at start.
        std::mem::forget(lib);
    }
    Ok(())
}

fn libc_flags() -> std::os::raw::c_int {
    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL
}

/// Directories searched for the CUDA headers kernels include (`cuda_bf16.h`
/// and what it pulls in): `IOTA_CUDA_INCLUDE` (colon-separated) first, then
/// the toolkit's usual places, then the fetch script's cache.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("IOTA_CUDA_INCLUDE")
        .map(|v| v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect())
        .unwrap_or_default();
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs.push(PathBuf::from("/usr/local/cuda-13.0/include"));
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cache/iota-rs/cuda-13.0/include"));
    }
    dirs
}

/// The first include directory that holds `cuda_bf16.h`.
pub fn find_headers() -> Result<PathBuf, CudaError> {
    let dirs = include_dirs();
    dirs.iter().find(|d| d.join("cuda_bf16.h").exists()).cloned().ok_or_else(|| {
        CudaError::NoHeaders(dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "))
    })
}

/// The options every kernel compiles with (part of the kernel cache's key).
pub(crate) const COMPILE_OPTIONS: &[&str] = &["--std=c++17"];

/// Compiles one kernel source to PTX for `arch` (e.g. "compute_90").
pub fn compile(k: &Kernel, include: &Path, arch: &'static str) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        include_paths: vec![include.display().to_string()],
        arch: Some(arch),
        name: Some(format!("{}.cu", k.name)),
        options: COMPILE_OPTIONS.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(k.source, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            CudaError::Compile { name: k.name, log: log.to_string_lossy().into_owned() }
        }
        other => CudaError::Compile { name: k.name, log: format!("{other:?}") },
    })
}

/// What `cuda` looks like on this machine, for `--help`-level messages.
pub fn describe() -> String {
    match (driver_present(), nvrtc_present()) {
        (false, _) => CudaError::NoDriver.to_string(),
        (true, false) => CudaError::NoNvrtc.to_string(),
        (true, true) => "CUDA driver and NVRTC found".into(),
    }
}

/// NVRTC from `scripts/fetch-nvrtc.py`'s cache when the system has none
/// (a machine with the driver but not the toolkit). Does nothing when
/// NVRTC is already loadable.
pub fn ensure_nvrtc() {
    if nvrtc_present() {
        return;
    }
    if let Some(home) = std::env::var_os("HOME") {
        let _ = preload_nvrtc(&PathBuf::from(home).join(".cache/iota-rs/cuda-13.0/lib"));
    }
}
