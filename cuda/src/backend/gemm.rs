//! The GEMMs of `CudaBackend`: linear layers through cuBLASLt with bf16
//! operands (their copies found or made by role) or cuBLAS SGEMM, the
//! strided batches attention runs, and the bf16 roofline `stage-gpu`
//! measures.

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{CudaSlice, DevicePtr};
use iota_model::backend::Backend;

use super::{Batched, Copies, CudaBackend, Operand, Role, Scratch, ok};
use crate::lt::{GemmShape, LtGemm};
use crate::runtime::CudaError;

impl CudaBackend {
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
        let shape = GemmShape::single(true, false, size, size, size, size, size, size);
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

    /// `batch` strided GEMMs: cuBLASLt on bf16 operands (C fp32), or the
    /// fp32 SGEMM when both operands are fp32.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn batched(
        &self,
        ta: bool,
        tb: bool,
        s: Batched,
        a: Operand,
        b: Operand,
        c: Operand,
        beta: f32,
        batch: usize,
    ) {
        assert!(c.elem == 4 && a.elem == b.elem, "batched GEMM operand types");
        match (&self.lt, a.elem) {
            (Some(lt), 2) => {
                let shape = GemmShape {
                    ta,
                    tb,
                    m: s.m,
                    n: s.n,
                    k: s.k,
                    lda: s.lda,
                    ldb: s.ldb,
                    ldc: s.ldc,
                    batch,
                    sa: s.sa,
                    sb: s.sb,
                    sc: s.sc,
                };
                // SAFETY: the operands address the callers' buffers and scratch copies, sized by their asserts.
                self.timer.timed(&self.gpu.stream, "gemm bf16 batched (cuBLASLt)", || {
                    ok(unsafe { lt.gemm(shape, a.ptr, b.ptr, c.ptr, beta) }, "bf16 batched gemm")
                });
            }
            _ => self.sgemm_batched(ta, tb, s, a.ptr, b.ptr, c.ptr, beta, batch),
        }
    }

    /// A linear layer's GEMM in the backend's precision. `a` and `b` are
    /// whole contiguous matrices of `a_len` and `b_len` values; their roles
    /// say where the bf16 path finds or keeps their copies.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_gemm(&self, s: GemmShape, a: (u64, usize, Role), b: (u64, usize, Role), c: u64, beta: f32) {
        let Some(lt) = &self.lt else {
            return self.sgemm_cm(s.ta, s.tb, s.m, s.n, s.k, a.0, s.lda, b.0, s.ldb, c, s.ldc, beta);
        };
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let Scratch { a: sa, b: sb, .. } = &mut *scratch;
        let a16 = self.operand16(&mut copies, sa, a, false);
        let b16 = self.operand16(&mut copies, sb, b, true);
        // The output may overlap a cast source (it never does in the model,
        // but the rule must hold for any caller).
        copies.written(c, s.m * s.n.max(1));
        // SAFETY: the bf16 buffers hold the casts of whole operands; `c` is the caller's output.
        self.timer.timed(&self.gpu.stream, "gemm bf16 (cuBLASLt)", || {
            ok(unsafe { lt.gemm(s, a16, b16, c, beta) }, "bf16 gemm")
        });
    }

    /// The bf16 copy of one GEMM operand, found or made as its role says;
    /// `scratch` takes it when it is not kept. `memo`: the scratch is "b",
    /// whose content `Copies::b_holds` follows.
    pub(super) fn operand16(
        &self,
        copies: &mut Copies,
        scratch: &mut Option<CudaSlice<u16>>,
        (src, len, role): (u64, usize, Role),
        memo: bool,
    ) -> u64 {
        let kept = match role {
            Role::Weight => self.kept_copy(&mut copies.weights, src, len),
            Role::Keep => self.kept_copy(&mut copies.acts, src, len),
            Role::LastUse => copies.acts.current(src, len).map(|c| c.device_ptr(&self.gpu.stream).0),
            Role::Transient => None,
        };
        if let Some(p) = kept {
            return p;
        }
        if memo
            && copies.b_holds == Some((src, len))
            && let Some(buf) = scratch.as_ref()
        {
            return buf.device_ptr(&self.gpu.stream).0;
        }
        let p = self.cast_into(scratch, src, len);
        if memo {
            copies.b_holds = Some((src, len));
        }
        p
    }

    /// Row-major C[m, n] (+)= op(A) op(B) written as the column-major
    /// product cuBLAS computes: C^T = op(B)^T op(A)^T.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sgemm_cm(
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
        let r = self.timer.timed(&self.gpu.stream, "sgemm (cuBLAS)", || unsafe {
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
        });
        ok(r, "sgemm");
    }

    /// `batch` column-major sgemms whose operands sit at constant strides.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sgemm_batched(
        &self,
        ta: bool,
        tb: bool,
        s: Batched,
        a: u64,
        b: u64,
        c: u64,
        beta: f32,
        batch: usize,
    ) {
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let alpha = 1.0f32;
        // SAFETY: pointers and strides address the callers' buffers, sized by their asserts.
        let r = self.timer.timed(&self.gpu.stream, "sgemm batched (cuBLAS)", || unsafe {
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
        });
        ok(r, "sgemm_strided_batched");
    }
}
