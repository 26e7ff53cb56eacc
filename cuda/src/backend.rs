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
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use iota_model::backend::{AdamStep, AttnDims, Backend};

use crate::cast_cache::CastCache;
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
#[derive(Default)]
struct Scratch {
    a: Option<CudaSlice<u16>>,
    b: Option<CudaSlice<u16>>,
    /// fp32 working space: per-chunk partial sums (rmsnorm_bwd's dw), the
    /// score gradients of attention_bwd.
    partials: Option<CudaSlice<f32>>,
    /// Attention's bf16 operands: QKV, P, dO, dS.
    attn_x: Option<CudaSlice<u16>>,
    attn_p: Option<CudaSlice<u16>>,
    attn_do: Option<CudaSlice<u16>>,
    attn_ds16: Option<CudaSlice<u16>>,
}

/// A GEMM operand: a device address and the size of its elements (fp32
/// buffers, or the bf16 copies the bf16 path makes).
#[derive(Clone, Copy, Debug)]
struct Operand {
    ptr: u64,
    elem: u64,
}

impl Operand {
    fn f32(ptr: u64) -> Self {
        Operand { ptr, elem: 4 }
    }
    fn bf16(ptr: u64) -> Self {
        Operand { ptr, elem: 2 }
    }
    /// The operand `elements` further on.
    fn at(self, elements: usize) -> Self {
        Operand { ptr: self.ptr + self.elem * elements as u64, elem: self.elem }
    }
}

const THREADS: u32 = 256;

/// Launches kernel `$name` with the arguments in the kernel's order.
macro_rules! launch {
    ($self:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        $self.timer.timed(&$self.gpu.stream, $name, || {
            let mut b = $self.gpu.stream.launch_builder($self.gpu.function($name));
            $( b.arg($arg); )*
            // SAFETY: each call site passes the kernel's arguments in order and type.
            ok(unsafe { b.launch($cfg) }, $name);
        })
    }};
}

// After `launch!`, which they use (macros are textually scoped).
mod attention;
mod copies;
mod kept_copies;
use kept_copies::Copies;
mod flash;
mod gemm;

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
    copies: Mutex<Copies>,
    timer: crate::kernel_timer::KernelTimer,
    /// Attention on the fused kernels where they apply (`flash.rs`).
    flash: bool,
    /// Kernels that write a GEMM's next operand write its bf16 copy too
    /// (RoPE's Q|K|V and dQ|dK|dV, SwiGLU's and RMSNorm's input gradients),
    /// so no `cast_bf16` runs for them (`copies.rs`, "fused casts").
    fused_casts: bool,
}

/// How a GEMM operand's bf16 copy is found and kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A weight: its kept copy, made now if there is none.
    Weight,
    /// An activation read again later: its kept copy, made now if none.
    Keep,
    /// An activation read for the last time: its kept copy if there is
    /// one, else a cast into scratch.
    LastUse,
    /// A gradient: cast into scratch (reused by the next GEMM on it).
    Transient,
}

fn limit_from_env(var: &str, default: u64) -> usize {
    std::env::var(var).ok().and_then(|v| v.trim().parse::<usize>().ok()).map_or(default as usize, |mib| mib << 20)
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
        use iota_core::memory_plan::{BF16_ACTIVATION_COPIES_LIMIT, BF16_WEIGHT_COPIES_LIMIT};
        // The plan's limits unless IOTA_BF16_*_COPIES_MIB say otherwise (0
        // turns the copies off); past a limit the least recently used go.
        let copies = Mutex::new(Copies {
            weights: CastCache::new(limit_from_env("IOTA_BF16_WEIGHT_COPIES_MIB", BF16_WEIGHT_COPIES_LIMIT)),
            acts: CastCache::new(limit_from_env("IOTA_BF16_ACTIVATION_COPIES_MIB", BF16_ACTIVATION_COPIES_LIMIT)),
            b_holds: None,
        });
        Ok(CudaBackend {
            gpu,
            receiver,
            blas,
            precision,
            lt,
            scratch: Mutex::new(Scratch::default()),
            copies,
            timer: Default::default(),
            // The fused attention kernels (`flash.rs`), while they are new.
            flash: precision == GemmPrecision::Bf16 && std::env::var("IOTA_FLASH_ATTENTION").is_ok_and(|v| v == "1"),
            // Off by default until a GPU has measured it (`IOTA_FUSED_CASTS=1` turns it on).
            fused_casts: precision == GemmPrecision::Bf16 && std::env::var("IOTA_FUSED_CASTS").is_ok_and(|v| v == "1"),
        })
    }

    pub fn precision(&self) -> GemmPrecision {
        self.precision
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Times every kernel launch, GEMM and device copy from now on (or
    /// stops): `kernel_times` reads them.
    pub fn set_kernel_timing(&self, on: bool) {
        self.timer.set(on);
    }

    /// The work timed since the last call, by kernel, most time first (waits
    /// for it to finish).
    pub fn kernel_times(&self) -> Vec<crate::kernel_timer::KernelTime> {
        self.timer.take()
    }

    /// Waits for all work issued so far (for timing).
    pub fn synchronize(&self) {
        ok(self.gpu.stream.synchronize(), "synchronize");
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
}

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;
    type Ref<'a> = DRef<'a>;
    type Mut<'a> = DMut<'a>;

    fn name(&self) -> String {
        format!("cuda ({}, {}, {} GEMMs)", self.gpu.name, self.gpu.arch, self.precision.name())
    }

    fn zeros(&self, n: usize) -> CudaSlice<f32> {
        let buf = ok(self.gpu.stream.alloc_zeros(n.max(1)), "alloc");
        self.note_allocated(&buf);
        buf
    }
    fn set_copy_limits(&self, weights_bytes: u64, activation_bytes: u64) {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        drop(copies.weights.set_limit(weights_bytes as usize));
        drop(copies.acts.set_limit(activation_bytes as usize));
    }
    fn empty(&self, n: usize) -> CudaSlice<f32> {
        // SAFETY: the trait's contract: the caller writes the whole buffer
        // before reading it (the CPU backend's NaN fill checks that in tests).
        let buf = ok(unsafe { self.gpu.stream.alloc::<f32>(n.max(1)) }, "alloc");
        self.note_allocated(&buf);
        buf
    }
    fn upload(&self, host: &[f32]) -> CudaSlice<f32> {
        if host.is_empty() {
            return self.zeros(0);
        }
        let buf = ok(self.gpu.stream.clone_htod(host), "upload");
        self.note_allocated(&buf);
        buf
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
    /// Taking a mutable view counts as writing it: every write through
    /// this trait needs one, so no bf16 copy of the range is trusted after.
    fn view_mut<'a>(&self, buf: &'a mut CudaSlice<f32>, range: Range<usize>) -> DMut<'a> {
        assert!(range.end <= buf.len(), "view out of range");
        let ptr = self.ptr(buf) + 4 * range.start as u64;
        self.note_written(ptr, range.len());
        DMut { ptr, len: range.len(), _buf: PhantomData }
    }

    fn fill(&self, x: DMut<'_>, value: f32) {
        let n = x.len as i64;
        launch!(self, "fill", self.grid(x.len), &x.ptr, &n, &value);
    }
    /// The driver's device-to-device copy on the stage's stream (it runs
    /// closer to the memory's bandwidth than the plain `copy` kernel).
    fn copy(&self, dst: DMut<'_>, src: DRef<'_>) {
        assert_eq!(dst.len, src.len, "copy lengths");
        if dst.len == 0 {
            return;
        }
        // SAFETY: both views address `len` floats of live buffers (their
        // borrows outlive the call; the copy is ordered on the stream).
        let r = self.timer.timed(&self.gpu.stream, "copy (memcpy)", || unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst.ptr, src.ptr, 4 * dst.len, self.gpu.stream.cu_stream())
        });
        ok(r, "copy");
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
        let s = GemmShape::single(true, false, oc, n, c, c, c, oc);
        self.linear_gemm(
            s,
            (w.ptr, w.len, Role::Weight),
            (inp.ptr, inp.len, Role::Keep),
            out.ptr,
            if acc { 1.0 } else { 0.0 },
        );
    }
    fn matmul_bwd_input(&self, dinp: DMut<'_>, dout: DRef<'_>, w: DRef<'_>, n: usize, c: usize, oc: usize, acc: bool) {
        assert!(dinp.len == n * c && dout.len == n * oc && w.len == oc * c, "matmul_bwd_input shapes");
        let s = GemmShape::single(false, false, c, n, oc, c, oc, c);
        self.linear_gemm(
            s,
            (w.ptr, w.len, Role::Weight),
            (dout.ptr, dout.len, Role::Transient),
            dinp.ptr,
            if acc { 1.0 } else { 0.0 },
        );
    }
    fn matmul_bwd_weight(&self, dw: DMut<'_>, dout: DRef<'_>, inp: DRef<'_>, n: usize, c: usize, oc: usize) {
        assert!(dw.len == oc * c && dout.len == n * oc && inp.len == n * c, "matmul_bwd_weight shapes");
        let s = GemmShape::single(false, true, c, oc, n, c, oc, c);
        self.linear_gemm(s, (inp.ptr, inp.len, Role::LastUse), (dout.ptr, dout.len, Role::Transient), dw.ptr, 1.0);
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
        let out16 = self.produce_slot(out.ptr, out.len);
        launch!(self, "rmsnorm", self.rows(n), &out.ptr, &out16, &rstd.ptr, &x.ptr, &w.ptr, &ni, &di, &eps);
        self.produced(out16, out.ptr, out.len);
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
        assert!(rstd.len == n && w.len == d, "rmsnorm_bwd shapes");
        if n == 0 || d == 0 {
            return;
        }
        let (ni, di) = (n as i32, d as i32);
        let dx16 = self.produce_b(dx.len);
        launch!(self, "rmsnorm_bwd_dx", self.rows(n), &dx.ptr, &dx16, &dout.ptr, &x.ptr, &w.ptr, &rstd.ptr, &ni, &di);
        self.produced_b(dx16, dx.ptr, dx.len);
        // dw: column sums over chunks of rows, then the chunks in order.
        const ROWS_PER_CHUNK: usize = 64;
        let chunks = n.div_ceil(ROWS_PER_CHUNK);
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let pp = self.f32_scratch(&mut scratch.partials, chunks * d);
        let rpc = ROWS_PER_CHUNK as i32;
        let cfg = LaunchConfig {
            grid_dim: (d.div_ceil(THREADS as usize) as u32, chunks as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "rmsnorm_bwd_dw_partials", cfg, &pp, &dout.ptr, &x.ptr, &rstd.ptr, &ni, &di, &rpc);
        let ci = chunks as i32;
        launch!(self, "sum_rows", self.grid(d), &dw.ptr, &pp, &ci, &di);
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
        let cfg = LaunchConfig {
            grid_dim: (rows.clamp(1, 1 << 20) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // The whole buffer's copy, when the rows are all of it: Q|K|V for
        // attention (kept for its backward), or dQ|dK|dV for the GEMMs next.
        let x16 = match (x.len == rows * row_stride, inverse) {
            (false, _) => 0,
            (true, false) => self.produce_copy(x.ptr, x.len),
            (true, true) => self.produce_b(x.len),
        };
        launch!(self, "rope", cfg, &x.ptr, &x16, &table.ptr, &r, &s, &rs, &h, &hd, &inv);
        // Both are no-ops for slot 0.
        if inverse {
            self.produced_b(x16, x.ptr, x.len);
        } else {
            self.produced(x16, x.ptr, x.len);
        }
    }

    fn attention(&self, out: DMut<'_>, saved: DMut<'_>, qkv: DRef<'_>, dims: AttnDims) {
        if self.flash_applies(dims) {
            self.flash_forward(out, saved, qkv, dims)
        } else {
            self.attention_gemms(out, saved, qkv, dims)
        }
    }

    fn attention_saved_len(&self, dims: AttnDims) -> usize {
        if self.flash_applies(dims) { Self::flash_saved_len(dims) } else { dims.probs_len() }
    }

    fn attention_bwd(
        &self,
        dqkv: DMut<'_>,
        dout: DRef<'_>,
        qkv: DRef<'_>,
        out: DRef<'_>,
        saved: DRef<'_>,
        dims: AttnDims,
    ) {
        if self.flash_applies(dims) {
            self.flash_backward(dqkv, dout, qkv, out, saved, dims)
        } else {
            self.attention_gemms_bwd(dqkv, dout, qkv, saved, dims)
        }
    }

    fn swiglu(&self, out: DMut<'_>, gu: DRef<'_>, n: usize, f: usize) {
        assert!(out.len == n * f && gu.len == 2 * n * f, "swiglu shapes");
        let (ni, fi) = (n as i32, f as i32);
        let out16 = self.produce_slot(out.ptr, out.len);
        launch!(self, "swiglu", self.rows(n), &out.ptr, &out16, &gu.ptr, &ni, &fi);
        self.produced(out16, out.ptr, out.len);
    }
    fn swiglu_bwd(&self, dgu: DMut<'_>, dout: DRef<'_>, gu: DRef<'_>, n: usize, f: usize) {
        assert!(dgu.len == 2 * n * f && dout.len == n * f && gu.len == 2 * n * f, "swiglu_bwd shapes");
        let (ni, fi) = (n as i32, f as i32);
        let dgu16 = self.produce_b(dgu.len);
        launch!(self, "swiglu_bwd", self.rows(n), &dgu.ptr, &dgu16, &dout.ptr, &gu.ptr, &ni, &fi);
        self.produced_b(dgu16, dgu.ptr, dgu.len);
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
        // Where this weight has a bf16 copy, the step rewrites it beside the
        // fp32 value, and it is current again without a cast.
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        let bf16 = copies
            .weights
            .storage_holding(p.ptr, p.len)
            .map_or(0u64, |(c, offset)| c.device_ptr(&self.gpu.stream).0 + 2 * offset as u64);
        let n = p.len as i64;
        launch!(
            self,
            "adamw",
            self.grid(p.len),
            &p.ptr,
            &g.ptr,
            &m.ptr,
            &v.ptr,
            &bf16,
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
        if bf16 != 0 {
            copies.weights.refreshed(p.ptr, p.len);
        }
    }
}
