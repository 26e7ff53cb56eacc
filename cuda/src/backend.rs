//! `CudaBackend`: the `Backend` trait on one GPU. Parameters, activations,
//! gradients and optimizer state are fp32. The linear layers' GEMMs run in
//! one of two precisions (`GemmPrecision`): fp32 through cuBLAS sgemm (the
//! CPU reference's math, for checking), or bf16 through cuBLASLt (operands
//! cast to bf16 by `cast_bf16` into scratch buffers, fp32 accumulation and
//! output), the fast default. Attention's per-head GEMMs stay fp32. GEMMs
//! are column-major, so every row-major product below is written as its
//! transpose; everything else runs the kernels in `ops.cu`. One stream, so
//! ops run in issue order; a view is a raw device pointer plus a length,
//! borrowed from its buffer.
//!
//! Why cast per call rather than keep a bf16 copy of the weights: the copy
//! would have to follow every write to the fp32 master (AdamW, a merge, a
//! checkpoint load, a rejoin download), and a stale copy trains silently
//! wrong. The cast reads 4 and writes 2 bytes per weight, under 10% of the
//! GEMM's time at the `1b` shapes.
//!
//! The trait's methods return no errors: a CUDA failure here (out of
//! memory, a lost device) panics with the driver's message, like an
//! out-of-memory on the CPU aborts.
//!
//! Status: compiles and is compile-checked in CI; its numerics have not run
//! on a GPU yet (`iota-miner selftest --device cuda` compares every op with
//! the CPU backend).

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use iota_model::backend::{AdamStep, AttnDims, Backend};

use crate::gpu::Gpu;
use crate::lt::{GemmShape, LtGemm};
use crate::runtime::CudaError;

/// Precision of the linear layers' GEMMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPrecision {
    /// cuBLAS sgemm: matches the CPU reference to fp32 rounding.
    F32,
    /// cuBLASLt, bf16 operands, fp32 accumulation and output.
    Bf16,
}

impl GemmPrecision {
    pub fn parse(s: &str) -> Option<GemmPrecision> {
        match s {
            "fp32" | "f32" => Some(GemmPrecision::F32),
            "bf16" => Some(GemmPrecision::Bf16),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            GemmPrecision::F32 => "fp32",
            GemmPrecision::Bf16 => "bf16",
        }
    }
}

/// Shape and strides (in elements) of a strided-batched column-major GEMM.
#[derive(Clone, Copy, Debug)]
struct Batched {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    sa: usize,
    ldb: usize,
    sb: usize,
    ldc: usize,
    sc: usize,
}

/// Grow-only bf16 operand buffers of the bf16 GEMM path.
struct Scratch {
    a: Option<CudaSlice<u16>>,
    b: Option<CudaSlice<u16>>,
}

const THREADS: u32 = 256;

/// Launches kernel `$name` with the arguments in the kernel's order.
macro_rules! launch {
    ($self:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let mut b = $self.gpu.stream.launch_builder($self.gpu.function($name));
        $( b.arg($arg); )*
        // SAFETY: each call site passes the kernel's arguments in order and type.
        ok(unsafe { b.launch($cfg) }, $name);
    }};
}

/// A read-only view of part of a device buffer.
#[derive(Clone, Copy, Debug)]
pub struct DRef<'a> {
    ptr: u64,
    len: usize,
    _buf: PhantomData<&'a CudaSlice<f32>>,
}

/// A writable view of part of a device buffer.
#[derive(Debug)]
pub struct DMut<'a> {
    ptr: u64,
    len: usize,
    _buf: PhantomData<&'a mut CudaSlice<f32>>,
}

pub struct CudaBackend {
    gpu: Arc<Gpu>,
    receiver: crate::pinned::DeviceReceiver,
    blas: CudaBlas,
    precision: GemmPrecision,
    lt: Option<LtGemm>,
    scratch: Mutex<Scratch>,
}

// The backend is used from one compute thread at a time; cuBLAS handles and
// the stream are not shared across threads concurrently.
unsafe impl Send for CudaBackend {}
unsafe impl Sync for CudaBackend {}

fn ok<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("CUDA {what} failed: {e:?}"))
}

impl CudaBackend {
    /// fp32 GEMMs (the reference precision).
    pub fn new(gpu: Arc<Gpu>) -> Result<CudaBackend, CudaError> {
        CudaBackend::with_precision(gpu, GemmPrecision::F32)
    }

    pub fn with_precision(gpu: Arc<Gpu>, precision: GemmPrecision) -> Result<CudaBackend, CudaError> {
        let blas = CudaBlas::new(gpu.stream.clone()).map_err(|e| CudaError::Driver(format!("cuBLAS: {e:?}")))?;
        let lt = match precision {
            GemmPrecision::Bf16 => Some(LtGemm::new(gpu.stream.clone(), gpu.compute.0)?),
            GemmPrecision::F32 => None,
        };
        let receiver = crate::pinned::DeviceReceiver::new(gpu.clone());
        Ok(CudaBackend { gpu, receiver, blas, precision, lt, scratch: Mutex::new(Scratch { a: None, b: None }) })
    }

    pub fn precision(&self) -> GemmPrecision {
        self.precision
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Waits for all work issued so far (for timing).
    pub fn synchronize(&self) {
        ok(self.gpu.stream.synchronize(), "synchronize");
    }

    /// Measured bf16 GEMM throughput of cuBLASLt on this GPU (TFLOP/s): a
    /// square `size`^3 GEMM on random operands, timed with CUDA events after
    /// warm-up, median of `iters`. The roofline `stage-gpu` reports against.
    pub fn bf16_gemm_tflops(&self, size: usize, iters: usize) -> Result<f64, CudaError> {
        let lt = match &self.lt {
            Some(lt) => lt,
            None => &LtGemm::new(self.gpu.stream.clone(), self.gpu.compute.0)?,
        };
        let mut rng = iota_core::rng::Rng::new(11);
        let host: Vec<f32> = (0..size * size).map(|_| rng.normal()).collect();
        let src = self.upload(&host);
        let (mut a, mut b) = (None, None);
        let ap = self.cast_into(&mut a, self.ptr(&src), size * size);
        let bp = self.cast_into(&mut b, self.ptr(&src), size * size);
        let c = self.zeros(size * size);
        let shape = GemmShape { ta: true, tb: false, m: size, n: size, k: size, lda: size, ldb: size, ldc: size };
        let gemm = || {
            // SAFETY: a, b hold size^2 bf16 values, c size^2 f32, alive past the synchronize below.
            unsafe { lt.gemm(shape, ap, bp, self.ptr(&c), 0.0) }
        };
        for _ in 0..3 {
            gemm()?;
        }
        let ev = |s: &Arc<cudarc::driver::CudaStream>| {
            s.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| CudaError::Driver(format!("{e:?}")))
        };
        let mut ms = Vec::with_capacity(iters);
        for _ in 0..iters.max(1) {
            let start = ev(&self.gpu.stream)?;
            gemm()?;
            let end = ev(&self.gpu.stream)?;
            end.synchronize().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
            ms.push(start.elapsed_ms(&end).map_err(|e| CudaError::Driver(format!("{e:?}")))? as f64);
        }
        ms.sort_by(f64::total_cmp);
        let median = ms[ms.len() / 2];
        Ok(2.0 * (size as f64).powi(3) / (median * 1e-3) / 1e12)
    }

    /// Runs `f` (work issued on this backend's stream) and returns the
    /// stream time it took in milliseconds, measured with CUDA events.
    pub fn time_ms(&self, f: impl FnOnce()) -> f64 {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ok(self.gpu.stream.record_event(flags), "event");
        f();
        let end = ok(self.gpu.stream.record_event(flags), "event");
        ok(end.synchronize(), "event synchronize");
        ok(start.elapsed_ms(&end), "event elapsed") as f64
    }

    /// Casts `len` contiguous f32 values at `src` into `buf` (grown to fit); returns its pointer.
    fn cast_into(&self, buf: &mut Option<CudaSlice<u16>>, src: u64, len: usize) -> u64 {
        if buf.as_ref().is_none_or(|b| b.len() < len) {
            // The old buffer's free is ordered on the stream after the GEMMs that read it.
            *buf = Some(ok(self.gpu.stream.alloc_zeros::<u16>(len.max(1)), "alloc"));
        }
        let dst = buf.as_ref().expect("allocated above").device_ptr(&self.gpu.stream).0;
        let n = len as i64;
        launch!(self, "cast_bf16", self.grid(len), &dst, &src, &n);
        dst
    }

    /// A linear layer's GEMM in the backend's precision. `a` and `b` are
    /// whole contiguous matrices of `a_len` and `b_len` values.
    #[allow(clippy::too_many_arguments)]
    fn linear_gemm(&self, s: GemmShape, a: u64, a_len: usize, b: u64, b_len: usize, c: u64, beta: f32) {
        match &self.lt {
            None => self.sgemm_cm(s.ta, s.tb, s.m, s.n, s.k, a, s.lda, b, s.ldb, c, s.ldc, beta),
            Some(lt) => {
                let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
                let Scratch { a: sa, b: sb } = &mut *scratch;
                let a16 = self.cast_into(sa, a, a_len);
                let b16 = self.cast_into(sb, b, b_len);
                // SAFETY: the scratch buffers hold the casts of whole operands; `c` is the caller's output.
                ok(unsafe { lt.gemm(s, a16, b16, c, beta) }, "bf16 gemm");
            }
        }
    }

    fn grid(&self, n: usize) -> LaunchConfig {
        let blocks = (n as u64).div_ceil(THREADS as u64).clamp(1, 65_535) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
    }

    fn rows(&self, rows: usize) -> LaunchConfig {
        LaunchConfig { grid_dim: (rows.max(1) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
    }

    fn ptr(&self, buf: &CudaSlice<f32>) -> u64 {
        buf.device_ptr(&self.gpu.stream).0
    }

    /// Row-major C[m, n] (+)= op(A) op(B) written as the column-major
    /// product cuBLAS computes: C^T = op(B)^T op(A)^T.
    #[allow(clippy::too_many_arguments)]
    fn sgemm_cm(
        &self,
        ta: bool,
        tb: bool,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        c: u64,
        ldc: usize,
        beta: f32,
    ) {
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let alpha = 1.0f32;
        // SAFETY: pointers are device allocations sized by the callers' asserts.
        let r = unsafe {
            cudarc::cublas::result::sgemm(
                *self.blas.handle(),
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &alpha,
                a as *const f32,
                lda as i32,
                b as *const f32,
                ldb as i32,
                &beta,
                c as *mut f32,
                ldc as i32,
            )
        };
        ok(r, "sgemm");
    }

    /// `batch` column-major sgemms whose operands sit at constant strides.
    #[allow(clippy::too_many_arguments)]
    fn sgemm_batched(&self, ta: bool, tb: bool, s: Batched, a: u64, b: u64, c: u64, beta: f32, batch: usize) {
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let alpha = 1.0f32;
        // SAFETY: pointers and strides address the callers' buffers, sized by their asserts.
        let r = unsafe {
            cudarc::cublas::result::sgemm_strided_batched(
                *self.blas.handle(),
                op(ta),
                op(tb),
                s.m as i32,
                s.n as i32,
                s.k as i32,
                &alpha,
                a as *const f32,
                s.lda as i32,
                s.sa as i64,
                b as *const f32,
                s.ldb as i32,
                s.sb as i64,
                &beta,
                c as *mut f32,
                s.ldc as i32,
                s.sc as i64,
                batch as i32,
            )
        };
        ok(r, "sgemm_strided_batched");
    }
}

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;
    type Ref<'a> = DRef<'a>;
    type Mut<'a> = DMut<'a>;

    fn name(&self) -> String {
        format!("cuda ({}, {}, {} GEMMs)", self.gpu.name, self.gpu.arch, self.precision.name())
    }

    fn zeros(&self, n: usize) -> CudaSlice<f32> {
        ok(self.gpu.stream.alloc_zeros(n.max(1)), "alloc")
    }
    fn upload(&self, host: &[f32]) -> CudaSlice<f32> {
        if host.is_empty() {
            return self.zeros(0);
        }
        ok(self.gpu.stream.clone_htod(host), "upload")
    }
    fn download(&self, buf: &CudaSlice<f32>, range: Range<usize>, out: &mut [f32]) {
        assert_eq!(range.len(), out.len(), "download length");
        if out.is_empty() {
            return;
        }
        let view = buf.slice(range);
        ok(self.gpu.stream.memcpy_dtoh(&view, out), "download");
        ok(self.gpu.stream.synchronize(), "synchronize");
    }
    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }
    /// int8 rows decode on the device: the payload (page-locked when it
    /// comes from a `PinnedHeap` pool) is copied once, asynchronously, and
    /// decoded by `decode_int8_rows`; other codecs decode on the host.
    fn decode_wire(
        &self,
        codec: iota_core::WireCodec,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<CudaSlice<f32>, iota_core::CoreError> {
        if codec != iota_core::WireCodec::Int8Row || rows * cols == 0 {
            let v = iota_model::codec::decode(codec, rows, cols, bytes)?;
            return Ok(self.upload(&v));
        }
        let expected = codec.payload_bytes(rows, cols).unwrap_or(usize::MAX);
        if bytes.len() != expected {
            return Err(iota_core::CoreError::PayloadLength {
                codec: codec.name(),
                rows,
                cols,
                expected,
                got: bytes.len(),
            });
        }
        let mut out = self.zeros(rows * cols);
        // SAFETY: `bytes` outlives the `wait` below, which ends the copy's use of it.
        let pending = unsafe { self.receiver.decode_int8(bytes, rows, cols, &mut out, None) };
        match pending.and_then(|p| p.wait()) {
            Ok(true) => Ok(out),
            // The same verdict the CPU decoder gives such bytes.
            Ok(false) => Err(iota_core::CoreError::NonFinite("int8 row scale or code")),
            Err(e) => panic!("CUDA decode failed: {e}"),
        }
    }
    fn view<'a>(&self, buf: &'a CudaSlice<f32>, range: Range<usize>) -> DRef<'a> {
        assert!(range.end <= buf.len(), "view out of range");
        DRef { ptr: self.ptr(buf) + 4 * range.start as u64, len: range.len(), _buf: PhantomData }
    }
    fn view_mut<'a>(&self, buf: &'a mut CudaSlice<f32>, range: Range<usize>) -> DMut<'a> {
        assert!(range.end <= buf.len(), "view out of range");
        DMut { ptr: self.ptr(buf) + 4 * range.start as u64, len: range.len(), _buf: PhantomData }
    }

    fn fill(&self, x: DMut<'_>, value: f32) {
        let n = x.len as i64;
        launch!(self, "fill", self.grid(x.len), &x.ptr, &n, &value);
    }
    fn copy(&self, dst: DMut<'_>, src: DRef<'_>) {
        assert_eq!(dst.len, src.len, "copy lengths");
        let n = dst.len as i64;
        launch!(self, "copy", self.grid(dst.len), &dst.ptr, &src.ptr, &n);
    }
    fn add_assign(&self, dst: DMut<'_>, src: DRef<'_>) {
        assert_eq!(dst.len, src.len, "add_assign lengths");
        let n = dst.len as i64;
        launch!(self, "add_assign", self.grid(dst.len), &dst.ptr, &src.ptr, &n);
    }
    fn scale(&self, x: DMut<'_>, s: f32) {
        let n = x.len as i64;
        launch!(self, "scale", self.grid(x.len), &x.ptr, &n, &s);
    }
    fn sum_squares(&self, x: DRef<'_>) -> f64 {
        let cfg = self.grid(x.len);
        let blocks = cfg.grid_dim.0 as usize;
        let partials: CudaSlice<f64> = ok(self.gpu.stream.alloc_zeros(blocks), "alloc");
        let pp = partials.device_ptr(&self.gpu.stream).0;
        let n = x.len as i64;
        launch!(self, "sum_squares_partials", cfg, &x.ptr, &n, &pp);
        let p = ok(self.gpu.stream.clone_dtoh(&partials), "download");
        p.iter().sum()
    }
    fn scatter_cols(&self, dst: DMut<'_>, src: DRef<'_>, n: usize, d: usize, b: usize, acc: bool) {
        assert!(dst.len == n * d && src.len == n * b && b <= d, "scatter_cols shapes");
        let (ni, di, bi, ai) = (n as i32, d as i32, b as i32, acc as i32);
        launch!(self, "scatter_cols", self.grid(n * b), &dst.ptr, &src.ptr, &ni, &di, &bi, &ai);
    }
    fn gather_cols(&self, dst: DMut<'_>, src: DRef<'_>, n: usize, d: usize, b: usize, acc: bool) {
        assert!(dst.len == n * b && src.len == n * d && b <= d, "gather_cols shapes");
        let (ni, di, bi, ai) = (n as i32, d as i32, b as i32, acc as i32);
        launch!(self, "gather_cols", self.grid(n * b), &dst.ptr, &src.ptr, &ni, &di, &bi, &ai);
    }

    fn matmul(&self, out: DMut<'_>, inp: DRef<'_>, w: DRef<'_>, n: usize, c: usize, oc: usize, acc: bool) {
        assert!(out.len == n * oc && inp.len == n * c && w.len == oc * c, "matmul shapes");
        // out^T[oc, n] = w[oc, c] inp^T  (column-major: A = w^T stored c x oc)
        let s = GemmShape { ta: true, tb: false, m: oc, n, k: c, lda: c, ldb: c, ldc: oc };
        self.linear_gemm(s, w.ptr, w.len, inp.ptr, inp.len, out.ptr, if acc { 1.0 } else { 0.0 });
    }
    fn matmul_bwd_input(&self, dinp: DMut<'_>, dout: DRef<'_>, w: DRef<'_>, n: usize, c: usize, oc: usize, acc: bool) {
        assert!(dinp.len == n * c && dout.len == n * oc && w.len == oc * c, "matmul_bwd_input shapes");
        let s = GemmShape { ta: false, tb: false, m: c, n, k: oc, lda: c, ldb: oc, ldc: c };
        self.linear_gemm(s, w.ptr, w.len, dout.ptr, dout.len, dinp.ptr, if acc { 1.0 } else { 0.0 });
    }
    fn matmul_bwd_weight(&self, dw: DMut<'_>, dout: DRef<'_>, inp: DRef<'_>, n: usize, c: usize, oc: usize) {
        assert!(dw.len == oc * c && dout.len == n * oc && inp.len == n * c, "matmul_bwd_weight shapes");
        let s = GemmShape { ta: false, tb: true, m: c, n: oc, k: n, lda: c, ldb: oc, ldc: c };
        self.linear_gemm(s, inp.ptr, inp.len, dout.ptr, dout.len, dw.ptr, 1.0);
    }

    fn embedding(&self, out: DMut<'_>, tokens: &[u32], wte: DRef<'_>, d: usize) {
        assert_eq!(out.len, tokens.len() * d, "embedding shapes");
        let dt = ok(self.gpu.stream.clone_htod(tokens), "upload");
        let tp = dt.device_ptr(&self.gpu.stream).0;
        let (n, di) = (tokens.len() as i32, d as i32);
        launch!(self, "embedding", self.rows(tokens.len()), &out.ptr, &tp, &wte.ptr, &n, &di);
        ok(self.gpu.stream.synchronize(), "synchronize"); // `dt` is freed on return
    }
    fn embedding_bwd(&self, dwte: DMut<'_>, dout: DRef<'_>, tokens: &[u32], d: usize) {
        assert_eq!(dout.len, tokens.len() * d, "embedding_bwd shapes");
        // Group positions by token on the host (CSR), in token order.
        let mut order: Vec<usize> = (0..tokens.len()).collect();
        order.sort_by_key(|&i| (tokens[i], i));
        let (mut ids, mut starts, mut positions) = (Vec::new(), Vec::new(), Vec::with_capacity(order.len()));
        for &i in &order {
            if ids.last() != Some(&tokens[i]) {
                ids.push(tokens[i]);
                starts.push(positions.len() as i32);
            }
            positions.push(i as i32);
        }
        starts.push(positions.len() as i32);
        if ids.is_empty() {
            return;
        }
        let s = &self.gpu.stream;
        let (di, si, pi) = (
            ok(s.clone_htod(&ids), "upload"),
            ok(s.clone_htod(&starts), "upload"),
            ok(s.clone_htod(&positions), "upload"),
        );
        let (ip, sp, pp) = (di.device_ptr(s).0, si.device_ptr(s).0, pi.device_ptr(s).0);
        let (distinct, dd) = (ids.len() as i32, d as i32);
        launch!(self, "embedding_bwd", self.rows(ids.len()), &dwte.ptr, &dout.ptr, &ip, &sp, &pp, &distinct, &dd);
        ok(s.synchronize(), "synchronize");
    }

    #[allow(clippy::too_many_arguments)]
    fn rmsnorm(&self, out: DMut<'_>, rstd: DMut<'_>, x: DRef<'_>, w: DRef<'_>, n: usize, d: usize, eps: f32) {
        assert!(out.len == n * d && x.len == n * d && rstd.len == n && w.len == d, "rmsnorm shapes");
        let (ni, di) = (n as i32, d as i32);
        launch!(self, "rmsnorm", self.rows(n), &out.ptr, &rstd.ptr, &x.ptr, &w.ptr, &ni, &di, &eps);
    }
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_bwd(
        &self,
        dx: DMut<'_>,
        dw: DMut<'_>,
        dout: DRef<'_>,
        x: DRef<'_>,
        w: DRef<'_>,
        rstd: DRef<'_>,
        n: usize,
        d: usize,
    ) {
        assert!(dx.len == n * d && dw.len == d && dout.len == n * d && x.len == n * d, "rmsnorm_bwd shapes");
        const ROWS_PER_BLOCK: usize = 32;
        let blocks = n.div_ceil(ROWS_PER_BLOCK).max(1);
        let partials: CudaSlice<f32> = ok(self.gpu.stream.alloc_zeros(blocks * d), "alloc");
        let pp = partials.device_ptr(&self.gpu.stream).0;
        let (ni, di, rpb) = (n as i32, d as i32, ROWS_PER_BLOCK as i32);
        launch!(
            self,
            "rmsnorm_bwd",
            self.rows(blocks),
            &dx.ptr,
            &pp,
            &dout.ptr,
            &x.ptr,
            &w.ptr,
            &rstd.ptr,
            &ni,
            &di,
            &rpb
        );
        let bi = blocks as i32;
        launch!(self, "sum_rows", self.grid(d), &dw.ptr, &pp, &bi, &di);
        ok(self.gpu.stream.synchronize(), "synchronize");
        drop(partials);
    }

    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: DMut<'_>,
        table: DRef<'_>,
        rows: usize,
        seq: usize,
        row_stride: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    ) {
        assert!(heads * head_dim <= row_stride && x.len >= rows * row_stride, "rope shapes");
        let (r, s, rs, h, hd, inv) =
            (rows as i32, seq as i32, row_stride as i32, heads as i32, head_dim as i32, inverse as i32);
        launch!(self, "rope", self.grid(rows * heads * head_dim / 2), &x.ptr, &table.ptr, &r, &s, &rs, &h, &hd, &inv);
    }

    // Attention runs as strided-batched GEMMs, one call per (sequence, head
    // within its KV group) batched over the KV heads: head h = j*group + g
    // reads KV head j, so for a fixed g its Q columns are `group*hd` apart and
    // its K/V columns `hd` apart, both constant strides. The saved
    // probabilities are laid out [batch][g][j][t][t] (the trait leaves their
    // order to the backend), so each batch's score matrices are contiguous
    // and the softmax kernels see plain rows.
    fn attention(&self, out: DMut<'_>, probs: DMut<'_>, qkv: DRef<'_>, dims: AttnDims) {
        let (t, hd, nh, nkv) = (dims.seq, dims.head_dim, dims.n_heads, dims.n_kv_heads);
        let (qs, qd, kvd) = (dims.qkv_dim(), dims.q_dim(), dims.kv_dim());
        let group = nh / nkv;
        assert!(
            qkv.len == dims.rows() * qs && probs.len == dims.probs_len() && out.len == dims.rows() * qd,
            "attention shapes"
        );
        let (tt, f) = (t * t, 4u64);
        for b in 0..dims.batch {
            let row0 = qkv.ptr + f * (b * t * qs) as u64;
            for g in 0..group {
                let p = probs.ptr + f * ((b * group + g) * nkv * tt) as u64;
                let (q, k) = (row0 + f * (g * hd) as u64, row0 + f * qd as u64);
                // S_j[i, j'] = Q_h[i, :] . K_j[j', :]
                let s1 = Batched { m: t, n: t, k: hd, lda: qs, sa: hd, ldb: qs, sb: group * hd, ldc: t, sc: tt };
                self.sgemm_batched(true, false, s1, k, q, p, 0.0, nkv);
            }
        }
        let rows = (dims.batch * nh * t) as i32;
        let (ti, scale) = (t as i32, 1.0 / (hd as f32).sqrt());
        launch!(self, "causal_softmax", self.rows(rows as usize), &probs.ptr, &rows, &ti, &scale);
        for b in 0..dims.batch {
            let row0 = qkv.ptr + f * (b * t * qs) as u64;
            for g in 0..group {
                let p = probs.ptr + f * ((b * group + g) * nkv * tt) as u64;
                let v = row0 + f * (qd + kvd) as u64;
                let o = out.ptr + f * (b * t * qd + g * hd) as u64;
                // O_h[t, hd] = P_h[t, t] V_j[t, hd]
                let s2 = Batched { m: hd, n: t, k: t, lda: qs, sa: hd, ldb: t, sb: tt, ldc: qd, sc: group * hd };
                self.sgemm_batched(false, false, s2, v, p, o, 0.0, nkv);
            }
        }
    }

    fn attention_bwd(&self, dqkv: DMut<'_>, dout: DRef<'_>, qkv: DRef<'_>, probs: DRef<'_>, dims: AttnDims) {
        let (t, hd, nh, nkv) = (dims.seq, dims.head_dim, dims.n_heads, dims.n_kv_heads);
        let (qs, qd, kvd) = (dims.qkv_dim(), dims.q_dim(), dims.kv_dim());
        let group = nh / nkv;
        assert!(
            dqkv.len == qkv.len && dout.len == dims.rows() * qd && probs.len == dims.probs_len(),
            "attention_bwd shapes"
        );
        let (tt, f) = (t * t, 4u64);
        let ds: CudaSlice<f32> = ok(self.gpu.stream.alloc_zeros(nkv * tt), "alloc");
        let dsp = ds.device_ptr(&self.gpu.stream).0;
        let (rows, ti, scale) = ((nkv * t) as i32, t as i32, 1.0 / (hd as f32).sqrt());
        for b in 0..dims.batch {
            let (x0, dx0) = (qkv.ptr + f * (b * t * qs) as u64, dqkv.ptr + f * (b * t * qs) as u64);
            for g in 0..group {
                // The first head of each group writes dK/dV; the others add.
                let acc = if g == 0 { 0.0 } else { 1.0 };
                let p = probs.ptr + f * ((b * group + g) * nkv * tt) as u64;
                let (q, k, v) = (x0 + f * (g * hd) as u64, x0 + f * qd as u64, x0 + f * (qd + kvd) as u64);
                let (dq, dk, dv) = (dx0 + f * (g * hd) as u64, dx0 + f * qd as u64, dx0 + f * (qd + kvd) as u64);
                let dof = dout.ptr + f * (b * t * qd + g * hd) as u64;
                // dP = dO V^T  -> ds
                let s = Batched { m: t, n: t, k: hd, lda: qs, sa: hd, ldb: qd, sb: group * hd, ldc: t, sc: tt };
                self.sgemm_batched(true, false, s, v, dof, dsp, 0.0, nkv);
                // dV (+)= P^T dO
                let s = Batched { m: hd, n: t, k: t, lda: qd, sa: group * hd, ldb: t, sb: tt, ldc: qs, sc: hd };
                self.sgemm_batched(false, true, s, dof, p, dv, acc, nkv);
                // dS = scale * P * (dP - rowsum(P dP)), in place over the nkv*t rows
                launch!(self, "causal_softmax_bwd", self.rows(nkv * t), &dsp, &p, &rows, &ti, &scale);
                // dQ = dS K
                let s = Batched { m: hd, n: t, k: t, lda: qs, sa: hd, ldb: t, sb: tt, ldc: qs, sc: group * hd };
                self.sgemm_batched(false, false, s, k, dsp, dq, 0.0, nkv);
                // dK (+)= dS^T Q
                let s = Batched { m: hd, n: t, k: t, lda: qs, sa: group * hd, ldb: t, sb: tt, ldc: qs, sc: hd };
                self.sgemm_batched(false, true, s, q, dsp, dk, acc, nkv);
            }
        }
        ok(self.gpu.stream.synchronize(), "synchronize");
        drop(ds);
    }

    fn swiglu(&self, out: DMut<'_>, gu: DRef<'_>, n: usize, f: usize) {
        assert!(out.len == n * f && gu.len == 2 * n * f, "swiglu shapes");
        let (ni, fi) = (n as i32, f as i32);
        launch!(self, "swiglu", self.grid(n * f), &out.ptr, &gu.ptr, &ni, &fi);
    }
    fn swiglu_bwd(&self, dgu: DMut<'_>, dout: DRef<'_>, gu: DRef<'_>, n: usize, f: usize) {
        assert!(dgu.len == 2 * n * f && dout.len == n * f && gu.len == 2 * n * f, "swiglu_bwd shapes");
        let (ni, fi) = (n as i32, f as i32);
        launch!(self, "swiglu_bwd", self.grid(n * f), &dgu.ptr, &dout.ptr, &gu.ptr, &ni, &fi);
    }

    fn cross_entropy(
        &self,
        logits: DMut<'_>,
        targets: &[u32],
        n: usize,
        vocab: usize,
        vocab_real: usize,
        dscale: f32,
    ) -> Vec<f32> {
        assert!(logits.len == n * vocab && targets.len() == n && vocab_real <= vocab, "cross_entropy shapes");
        assert!(targets.iter().all(|&t| (t as usize) < vocab_real), "target outside the vocabulary");
        let s = &self.gpu.stream;
        let dt = ok(s.clone_htod(targets), "upload");
        let loss: CudaSlice<f32> = ok(s.alloc_zeros(n.max(1)), "alloc");
        let (tp, lp) = (dt.device_ptr(s).0, loss.device_ptr(s).0);
        let (ni, vi, vr) = (n as i32, vocab as i32, vocab_real as i32);
        launch!(self, "cross_entropy", self.rows(n), &logits.ptr, &tp, &lp, &ni, &vi, &vr, &dscale);
        let mut l = ok(s.clone_dtoh(&loss), "download");
        l.truncate(n);
        l
    }

    fn adamw(&self, p: DMut<'_>, g: DRef<'_>, m: DMut<'_>, v: DMut<'_>, step: AdamStep) {
        assert!(p.len == g.len && p.len == m.len && p.len == v.len, "adamw lengths");
        let (step_size, grad_coef) = step.moment_coefficients();
        let bc2 = 1.0 - (step.beta2 as f64).powi(step.t as i32);
        let inv_sqrt_bc2 = (1.0 / bc2.sqrt()) as f32;
        let decay = 1.0 - step.lr * step.weight_decay;
        let (n, null) = (p.len as i64, 0u64);
        launch!(
            self,
            "adamw",
            self.grid(p.len),
            &p.ptr,
            &g.ptr,
            &m.ptr,
            &v.ptr,
            &null,
            &n,
            &step.beta1,
            &step.beta2,
            &step.eps,
            &step_size,
            &inv_sqrt_bc2,
            &decay,
            &step.grad_scale,
            &grad_coef
        );
    }
}
