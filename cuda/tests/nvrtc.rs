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

/// Whether NVRTC is loadable, after loading it from the fetch script's
/// cache where the system has none.
fn nvrtc_loaded() -> bool {
    if !iota_cuda::nvrtc_present()
        && let Some(dir) = cache_dir()
    {
        let _ = iota_cuda::preload_nvrtc(&dir.join("lib"));
    }
    iota_cuda::nvrtc_present()
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let required = std::env::var("IOTA_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if !nvrtc_loaded() {
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
    if !nvrtc_loaded() {
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

#[test]
fn the_kernel_cache_returns_what_nvrtc_compiled_and_skips_the_compile() {
    if !nvrtc_loaded() {
        println!("SKIPPED: NVRTC not found");
        return;
    }
    let include = iota_cuda::find_headers().unwrap_or_else(|_| std::env::temp_dir());
    let dir = tempfile::tempdir().unwrap();
    let cache = iota_cuda::PtxCache::at(dir.path());
    // The programs a GPU opens with (the lazy flash program takes seconds more).
    for k in iota_cuda::KERNELS.iter().filter(|k| !k.lazy) {
        let t0 = std::time::Instant::now();
        let (first, from) = iota_cuda::compile_cached(Some(&cache), k, &include, "compute_90").unwrap();
        let compiled = t0.elapsed();
        assert_eq!(from, iota_cuda::PtxSource::Compiled);
        let t1 = std::time::Instant::now();
        let (second, from) = iota_cuda::compile_cached(Some(&cache), k, &include, "compute_90").unwrap();
        let cached = t1.elapsed();
        assert_eq!(from, iota_cuda::PtxSource::Cached, "{}", k.name);
        assert_eq!(first.to_src(), second.to_src(), "{}", k.name);
        // Another architecture is another entry.
        let (_, from) = iota_cuda::compile_cached(Some(&cache), k, &include, "compute_80").unwrap();
        assert_eq!(from, iota_cuda::PtxSource::Compiled, "{}", k.name);
        println!("{}: compiled {compiled:?}, from the cache {cached:?}", k.name);
    }
    // A damaged entry is compiled again and rewritten whole.
    let k = iota_cuda::KERNELS.iter().find(|k| k.name == "codec").unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        std::fs::write(&path, bytes).unwrap();
    }
    let (_, from) = iota_cuda::compile_cached(Some(&cache), k, &include, "compute_90").unwrap();
    assert_eq!(from, iota_cuda::PtxSource::Compiled);
    let (_, from) = iota_cuda::compile_cached(Some(&cache), k, &include, "compute_90").unwrap();
    assert_eq!(from, iota_cuda::PtxSource::Cached);
}
