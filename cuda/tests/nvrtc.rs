//! Every `.cu` source compiles with NVRTC 13.0 for Hopper (compute_90) and
//! defines the entry points the Rust side launches. Needs no GPU: NVRTC runs
//! on the CPU. CI fetches NVRTC with scripts/fetch-nvrtc.py and sets
//! IOTA_REQUIRE_NVRTC=1, so there a missing NVRTC fails instead of skipping.

use std::path::PathBuf;

fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("IOTA_CUDA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/iota-rs/cuda-13.0")))
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let required = std::env::var("IOTA_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if !iota_cuda::nvrtc_present()
        && let Some(dir) = cache_dir()
    {
        let _ = iota_cuda::preload_nvrtc(&dir.join("lib"));
    }
    if !iota_cuda::nvrtc_present() {
        assert!(!required, "IOTA_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: run scripts/fetch-nvrtc.py");
        println!(
            "SKIPPED: NVRTC not found (run scripts/fetch-nvrtc.py, or set IOTA_REQUIRE_NVRTC=1 to make this fail)"
        );
        return;
    }
    let include = iota_cuda::find_headers().unwrap_or_else(|_| std::env::temp_dir());
    for k in iota_cuda::KERNELS {
        let t0 = std::time::Instant::now();
        let ptx = iota_cuda::compile(k, &include, "compute_90").unwrap_or_else(|e| panic!("{e}"));
        let src = ptx.to_src();
        for f in k.functions {
            assert!(src.contains(&format!(".entry {f}(")), "{}: no entry point {f} in the PTX", k.name);
        }
        println!("{}: {} entry points, {} bytes of PTX, {:?}", k.name, k.functions.len(), src.len(), t0.elapsed());
    }
}

#[test]
fn a_broken_kernel_reports_the_compiler_log() {
    if !iota_cuda::nvrtc_present()
        && let Some(dir) = cache_dir()
    {
        let _ = iota_cuda::preload_nvrtc(&dir.join("lib"));
    }
    if !iota_cuda::nvrtc_present() {
        println!("SKIPPED: NVRTC not found");
        return;
    }
    let bad = iota_cuda::Kernel {
        name: "broken",
        source: "extern \"C\" __global__ void f(float* x) { x[0] = undefined_thing; }",
        functions: &["f"],
        lazy: false,
    };
    let err = iota_cuda::compile(&bad, &std::env::temp_dir(), "compute_90").unwrap_err().to_string();
    assert!(err.contains("broken") && err.contains("undefined_thing"), "{err}");
}

#[test]
fn no_driver_is_a_plain_error_not_a_panic() {
    // On a machine without libcuda this says so; with one it reports it found it.
    let d = iota_cuda::describe();
    assert!(!d.is_empty());
    if !iota_cuda::driver_present() {
        assert!(d.contains("no CUDA driver found"), "{d}");
    }
}

#[test]
fn selftest_on_the_cpu_passes_and_cuda_without_a_driver_says_so() {
    let checks = iota_cuda::selftest::run(iota_cuda::selftest::Device::Cpu).unwrap();
    assert!(checks.len() >= 5);
    assert!(checks.iter().all(|c| c.passed()), "{checks:?}");
    if !iota_cuda::driver_present() {
        let err = iota_cuda::selftest::run(iota_cuda::selftest::Device::Cuda).expect_err("no GPU here").to_string();
        assert!(err.contains("no CUDA driver found"), "{err}");
        println!("not run here: the CUDA half of the selftest (no GPU)");
    }
}

/// The fused attention kernels' lane-level model (cuda/tests/flash_emu.py:
/// each kernel's per-thread code run for every lane of every warp, mma.sync
/// by its fragment layout) against a plain attention, for partial tiles,
/// grouped KV heads and two sequences: what can be checked of flash.cu's
/// indexing without a GPU. Skips without python3.
#[test]
fn the_fused_attention_kernels_lane_model_matches_plain_attention() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/flash_emu.py");
    let out = match std::process::Command::new("python3").arg(&script).output() {
        Ok(o) => o,
        Err(e) => {
            println!("SKIPPED: python3 not runnable ({e})");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the model's errors exceed 1e-2 or an output was left unwritten:\n{text}");
    assert_eq!(text.lines().filter(|l| l.contains("dqkv")).count(), 3, "three shapes were checked");
}
