//! A GPU with our kernels loaded, and the host side of the custom kernels
//! the user named: the butterfly's per-slice reduce and the int8 wire codec.
//! Each mirrors a CPU reference (`iota_core::merge::reduce_slice`,
//! `iota_model::codec`) and `selftest` checks it against that reference.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use iota_core::merge::reduce::clip_cannot_bite;
use iota_core::merge::{OuterOpt, ReduceRule, ReduceStats};

use crate::kernels::KERNELS;
use crate::ptx_cache::{PtxCache, PtxSource};
use crate::runtime::CudaError;

const THREADS: u32 = 256;
/// Largest replica count the reduce kernels take (their per-thread arrays).
pub const MAX_REPLICAS: usize = 64;

fn drv(e: impl std::fmt::Debug) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub arch: &'static str,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    functions: HashMap<&'static str, CudaFunction>,
    /// The lazy programs' functions, compiled on first use (`Kernel::lazy`).
    lazy: HashMap<&'static str, std::sync::OnceLock<HashMap<&'static str, CudaFunction>>>,
    include: std::path::PathBuf,
    /// Where compiled programs are kept between runs (`IOTA_PTX_CACHE`).
    ptx_cache: Option<PtxCache>,
}

/// Compiles one program for `arch` (or reads it from the kernel cache) and
/// loads its functions. A cached program the driver refuses is compiled
/// afresh, so a bad entry costs one compile, never the run.
fn load_program(
    ctx: &Arc<CudaContext>,
    cache: Option<&PtxCache>,
    k: &crate::kernels::Kernel,
    include: &std::path::Path,
    arch: &'static str,
) -> Result<HashMap<&'static str, CudaFunction>, CudaError> {
    let load = |ptx| -> Result<HashMap<&'static str, CudaFunction>, CudaError> {
        let module = ctx.load_module(ptx).map_err(drv)?;
        k.functions.iter().map(|f| Ok((*f, module.load_function(f).map_err(drv)?))).collect()
    };
    let (ptx, source) = crate::ptx_cache::compile_cached(cache, k, include, arch)?;
    match load(ptx) {
        Err(e) if source == PtxSource::Cached => {
            eprintln!("note: kernel cache: the driver refused the cached {} program ({e}); compiling it again", k.name);
            load(crate::runtime::compile(k, include, arch)?)
        }
        loaded => loaded,
    }
}

/// NVRTC wants a `&'static str` architecture; the devices we expect.
fn arch_for(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        (m, _) if m >= 9 => "compute_90",
        _ => "compute_80",
    }
}

impl Gpu {
    /// Opens GPU `ordinal` and compiles its kernels for it (once per
    /// process; a lazy program at its first launch). Fails with a plain error when there is no driver or no NVRTC.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        if !crate::runtime::driver_present() {
            return Err(CudaError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        // SAFETY: all our work goes on the one default stream (no `fork`,
        // no second stream anywhere in the crate), so stream order already
        // orders every read and write; the events cudarc would otherwise
        // create with each allocation and wait on at each free order
        // nothing.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(drv)?;
        let name = ctx.name().map_err(drv)?;
        let arch = arch_for(major, minor);
        let include = crate::runtime::find_headers().unwrap_or_else(|_| std::env::temp_dir());
        let ptx_cache = PtxCache::from_env();
        let mut functions = HashMap::new();
        let mut lazy = HashMap::new();
        for k in KERNELS {
            if k.lazy {
                lazy.insert(k.name, std::sync::OnceLock::new());
                continue;
            }
            functions.extend(load_program(&ctx, ptx_cache.as_ref(), k, &include, arch)?);
        }
        let stream = ctx.default_stream();
        let gpu = Gpu { ctx, stream, name, arch, compute: (major, minor), functions, lazy, include, ptx_cache };
        if gpu.keep_pool_memory().is_none() {
            eprintln!(
                "note: the CUDA driver did not take the memory pool's release threshold; freed memory goes back to the device at each synchronisation"
            );
        }
        Ok(gpu)
    }

    /// The default memory pool (which cudarc's stream-ordered allocations
    /// come from).
    fn default_pool(&self) -> Option<cudarc::driver::sys::CUmemoryPool> {
        use cudarc::driver::sys;
        self.ctx.bind_to_thread().ok()?;
        let dev = cudarc::driver::result::device::get(self.ctx.ordinal() as i32).ok()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: a plain driver query into a local of the handle type; the
        // context is bound above.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev).result().ok()? };
        Some(pool)
    }

    /// Keeps freed memory in the pool across synchronisations. The pool's
    /// default release threshold is 0: at every synchronisation (a step has
    /// several: downloads, timing events) it hands all freed memory back,
    /// and the next step's allocations map it again in the driver, on the
    /// host, between launches. A training step frees and reallocates the
    /// same activation sizes every micro-batch, so the memory is kept, as
    /// PyTorch's caching allocator keeps it.
    fn keep_pool_memory(&self) -> Option<()> {
        use cudarc::driver::sys;
        let pool = self.default_pool()?;
        let mut keep: u64 = u64::MAX;
        // SAFETY: the attribute takes a cuuint64_t, passed by pointer.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
            .result()
            .ok()?;
        }
        Some(())
    }

    /// The most bytes the device's default memory pool has held at once
    /// for this process (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`): the peak of every
    /// stream-ordered allocation, which is how cudarc allocates our buffers,
    /// exact where sampling the free memory would miss a short peak. Not
    /// counted: cuBLAS's own workspace, the context, module images. None
    /// where the driver does not answer. (On an H100 it read within 0.1-2
    /// GiB of the memory plan: docs/BENCHMARKS.md, "scale".)
    pub fn pool_high_water(&self) -> Option<u64> {
        use cudarc::driver::sys;
        let pool = self.default_pool()?;
        let mut high: u64 = 0;
        // SAFETY: a plain driver query into a local of the type the driver
        // writes (a cuuint64_t).
        unsafe {
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut high as *mut u64).cast(),
            )
            .result()
            .ok()?;
        }
        Some(high)
    }

    pub fn function(&self, name: &str) -> &CudaFunction {
        if let Some(f) = self.functions.get(name) {
            return f;
        }
        let k = KERNELS
            .iter()
            .find(|k| k.lazy && k.functions.contains(&name))
            .unwrap_or_else(|| panic!("kernel {name} is not in KERNELS"));
        let program = self.lazy[k.name].get_or_init(|| {
            // Compile-checked in CI (cuda/tests/nvrtc.rs), so a failure here
            // is the machine's NVRTC or driver, reported as it is.
            load_program(&self.ctx, self.ptx_cache.as_ref(), k, &self.include, self.arch)
                .unwrap_or_else(|e| panic!("compiling the {} kernels: {e}", k.name))
        });
        &program[name]
    }

    fn grid(&self, n: usize) -> LaunchConfig {
        let blocks = (n as u64).div_ceil(THREADS as u64).clamp(1, 4096) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
    }

    /// The int8-per-row wire encoding of `x` ([rows, cols]), as bytes.
    pub fn encode_int8_rows(&self, x: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, CudaError> {
        let s = &self.stream;
        let dx = s.clone_htod(x).map_err(drv)?;
        let mut out: CudaSlice<u8> = s.alloc_zeros(rows * (cols + 2)).map_err(drv)?;
        let (r, c) = (rows as i32, cols as i32);
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(self.function("encode_int8_rows"));
        b.arg(&dx).arg(&r).arg(&c).arg(&mut out);
        // SAFETY: argument types and order match the kernel's signature.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        s.clone_dtoh(&out).map_err(drv)
    }

    /// Decodes int8-per-row bytes; None when the input is invalid.
    pub fn decode_int8_rows(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Option<Vec<f32>>, CudaError> {
        let s = &self.stream;
        let din = s.clone_htod(bytes).map_err(drv)?;
        let mut out: CudaSlice<f32> = s.alloc_zeros(rows * cols).map_err(drv)?;
        let mut bad: CudaSlice<i32> = s.alloc_zeros(1).map_err(drv)?;
        let (r, c) = (rows as i32, cols as i32);
        let null: u64 = 0; // no residual
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(self.function("decode_int8_rows"));
        b.arg(&din).arg(&r).arg(&c).arg(&null).arg(&mut out).arg(&mut bad);
        // SAFETY: as above; a null residual pointer is passed as a 64-bit zero.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        if s.clone_dtoh(&bad).map_err(drv)?[0] != 0 {
            return Ok(None);
        }
        Ok(Some(s.clone_dtoh(&out).map_err(drv)?))
    }

    /// `iota_core::merge::reduce_slice` on the device: same inputs, same
    /// meaning, fp32 results within rounding of the CPU's (sums run in f64
    /// but in a different order). Trimmed mean has no kernel yet: it runs on
    /// the CPU reference.
    pub fn reduce_slice(
        &self,
        rule: ReduceRule,
        outer: OuterOpt,
        contribs: &[Option<&[f32]>],
        weights: &[f64],
        momentum: &mut [f32],
    ) -> Result<(Vec<f32>, ReduceStats), CudaError> {
        if matches!(rule, ReduceRule::TrimmedMean { .. }) || contribs.len() > MAX_REPLICAS {
            return Ok(iota_core::merge::reduce_slice(rule, outer, contribs, weights, momentum));
        }
        let s = &self.stream;
        let (n, r) = (momentum.len(), contribs.len());
        let mut stats = ReduceStats::default();
        let (mut packed, present) = pack_contributions(contribs, n, &mut stats);
        let dx = s.clone_htod(&packed).map_err(drv)?;
        let cfg = self.grid(n);
        let used = self.finite_rows(&dx, &present, n, &mut stats)?;
        // A weight of 0 is not enough to leave a rejected contribution out:
        // 0 x NaN (or inf) is NaN in the kernels' sums. Its row becomes zeros.
        let dx = if used == present {
            dx
        } else {
            for i in (0..r).filter(|&i| present[i] && !used[i]) {
                packed[i * n..(i + 1) * n].fill(0.0);
            }
            s.clone_htod(&packed).map_err(drv)?
        };
        let count = used.iter().filter(|&&u| u).count();
        let dw = s.clone_htod(&normalized_weights(weights, &used)).map_err(drv)?;
        let mut g: CudaSlice<f32> = s.alloc_zeros(n).map_err(drv)?;
        // As on the CPU: centered clipping that cannot clip is the mean.
        let rule = match rule {
            ReduceRule::CenteredClip { tau_factor, .. } if clip_cannot_bite(count, tau_factor) => ReduceRule::Mean,
            r => r,
        };
        let (ri, ni) = (r as i32, n as i64);
        if count > 0 {
            match rule {
                ReduceRule::Mean | ReduceRule::TrimmedMean { .. } => {
                    let mut b = s.launch_builder(self.function("weighted_mean"));
                    b.arg(&dx).arg(&dw).arg(&ri).arg(&ni).arg(&mut g);
                    unsafe { b.launch(cfg) }.map_err(drv)?;
                }
                ReduceRule::CenteredClip { tau_factor, iters } => {
                    let rows = Rows { dx: &dx, dw: &dw, used: &used, n };
                    stats.clipped = self.centered_clip(&rows, tau_factor, iters, &mut g)?;
                }
            }
        }
        Ok((self.nesterov(&g, outer, momentum)?, stats))
    }

    /// Which present rows of `dx` ([r][n]) are finite throughout; counts
    /// the others as rejected.
    fn finite_rows(
        &self,
        dx: &CudaSlice<f32>,
        present: &[bool],
        n: usize,
        stats: &mut ReduceStats,
    ) -> Result<Vec<bool>, CudaError> {
        let s = &self.stream;
        let r = present.len();
        let cfg = self.grid(n);
        let blocks = cfg.grid_dim.0 as usize;
        let mut flags: CudaSlice<i32> = s.alloc_zeros(r * blocks).map_err(drv)?;
        let mut b = s.launch_builder(self.function("nonfinite_partials"));
        let (ri, ni) = (r as i32, n as i64);
        b.arg(dx).arg(&ri).arg(&ni).arg(&mut flags);
        unsafe { b.launch(cfg) }.map_err(drv)?;
        let flags = s.clone_dtoh(&flags).map_err(drv)?;
        let mut used = present.to_vec();
        for i in 0..r {
            if present[i] && flags[i * blocks..(i + 1) * blocks].iter().any(|&f| f != 0) {
                used[i] = false;
                stats.rejected_non_finite += 1;
            }
        }
        Ok(used)
    }

    /// Centered clipping around the coordinate-wise median, `iters` times,
    /// into `g`; how many used rows the last iteration clipped.
    fn centered_clip(
        &self,
        rows: &Rows<'_>,
        tau_factor: f32,
        iters: u32,
        g: &mut CudaSlice<f32>,
    ) -> Result<usize, CudaError> {
        let s = &self.stream;
        let (r, n) = (rows.used.len(), rows.n);
        let (ri, ni) = (r as i32, n as i64);
        let cfg = self.grid(n);
        let blocks = cfg.grid_dim.0 as usize;
        let use_i: Vec<i32> = rows.used.iter().map(|&u| u as i32).collect();
        let duse = s.clone_htod(&use_i).map_err(drv)?;
        let mut b = s.launch_builder(self.function("coord_median"));
        b.arg(rows.dx).arg(&duse).arg(&ri).arg(&ni).arg(&mut *g);
        unsafe { b.launch(cfg) }.map_err(drv)?;
        let mut partials: CudaSlice<f64> = s.alloc_zeros(r * blocks).map_err(drv)?;
        let mut clipped = 0;
        for _ in 0..iters.max(1) {
            let mut b = s.launch_builder(self.function("sq_dist_partials"));
            b.arg(rows.dx).arg(&*g).arg(&ri).arg(&ni).arg(&mut partials);
            unsafe { b.launch(cfg) }.map_err(drv)?;
            let p = s.clone_dtoh(&partials).map_err(drv)?;
            let dist: Vec<f64> = (0..r).map(|i| p[i * blocks..(i + 1) * blocks].iter().sum::<f64>().sqrt()).collect();
            let tau = tau_factor as f64 * median_used_distance(&dist, rows.used) as f64;
            let scale: Vec<f64> = dist.iter().map(|&d| if d > tau && d > 0.0 { tau / d } else { 1.0 }).collect();
            clipped = (0..r).filter(|&i| rows.used[i] && scale[i] < 1.0).count();
            let dscale = s.clone_htod(&scale).map_err(drv)?;
            let mut b = s.launch_builder(self.function("clip_step"));
            b.arg(rows.dx).arg(rows.dw).arg(&dscale).arg(&ri).arg(&ni).arg(&mut *g);
            unsafe { b.launch(cfg) }.map_err(drv)?;
        }
        Ok(clipped)
    }

    /// The outer (Nesterov) step on the reduced pseudo-gradient `g`:
    /// `momentum` updated in place; the update returned.
    fn nesterov(&self, g: &CudaSlice<f32>, outer: OuterOpt, momentum: &mut [f32]) -> Result<Vec<f32>, CudaError> {
        let s = &self.stream;
        if outer.momentum == 0.0 {
            // No momentum: u = lr g on the host, as the CPU reference
            // defines it (the momentum is not kept), the same bits.
            let mut u = s.clone_dtoh(g).map_err(drv)?;
            iota_core::merge::reduce::outer_step(outer, &mut u, momentum);
            return Ok(u);
        }
        let n = momentum.len();
        let mut dm = s.clone_htod(momentum).map_err(drv)?;
        let mut du: CudaSlice<f32> = s.alloc_zeros(n).map_err(drv)?;
        let mut b = s.launch_builder(self.function("nesterov"));
        let ni = n as i64;
        b.arg(g).arg(&mut dm).arg(&mut du).arg(&outer.lr).arg(&outer.momentum).arg(&ni);
        unsafe { b.launch(self.grid(n)) }.map_err(drv)?;
        let m = s.clone_dtoh(&dm).map_err(drv)?;
        momentum.copy_from_slice(&m);
        s.clone_dtoh(&du).map_err(drv)
    }
}

/// The contributions on the device, for the clipping kernels.
struct Rows<'a> {
    /// [r][n], rejected rows zeroed.
    dx: &'a CudaSlice<f32>,
    /// Each row's weight (normalized; 0 for rows not used).
    dw: &'a CudaSlice<f64>,
    used: &'a [bool],
    n: usize,
}

/// Present, right-length contributions packed [r][n] (absent ones are
/// zeros), and which are present; a wrong length counts as rejected.
fn pack_contributions(contribs: &[Option<&[f32]>], n: usize, stats: &mut ReduceStats) -> (Vec<f32>, Vec<bool>) {
    let r = contribs.len();
    let mut packed = vec![0.0f32; r * n];
    let mut present = vec![false; r];
    for (i, c) in contribs.iter().enumerate() {
        match c {
            Some(c) if c.len() == n => {
                packed[i * n..(i + 1) * n].copy_from_slice(c);
                present[i] = true;
            }
            Some(_) => stats.rejected_non_finite += 1,
            None => {}
        }
    }
    (packed, present)
}

/// Each used row's weight over the used rows' total (equal weights when
/// the total is 0); 0 for a row not used.
fn normalized_weights(weights: &[f64], used: &[bool]) -> Vec<f64> {
    let total: f64 = (0..used.len()).filter(|&i| used[i]).map(|i| weights[i]).sum();
    let count = used.iter().filter(|&&u| u).count();
    (0..used.len())
        .map(|i| match (used[i], total > 0.0) {
            (false, _) => 0.0,
            (true, true) => weights[i] / total,
            (true, false) => 1.0 / count as f64,
        })
        .collect()
}

/// tau's base, as on the CPU: the median of the used rows' distances (f32,
/// the mean of the middle two for an even count).
fn median_used_distance(dist: &[f64], used: &[bool]) -> f32 {
    let mut d32: Vec<f32> = (0..dist.len()).filter(|&i| used[i]).map(|i| dist[i] as f32).collect();
    d32.sort_by(f32::total_cmp);
    let k = d32.len();
    if k % 2 == 1 { d32[k / 2] } else { ((d32[k / 2 - 1] as f64 + d32[k / 2] as f64) / 2.0) as f32 }
}
