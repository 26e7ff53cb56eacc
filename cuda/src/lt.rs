//! bf16 GEMMs through cuBLASLt: A and B in bf16, C/D in fp32, fp32
//! accumulation (`CUBLAS_COMPUTE_32F`). cudarc's safe `Matmul` wants A, B
//! and C of one type, so this talks to its `result` layer directly.
//!
//! A plan (descriptor, three layouts, the heuristic's algorithm) is built
//! once per GEMM shape and cached: a training step repeats the same few
//! shapes thousands of times, and the heuristic query costs more than a
//! small GEMM.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::runtime::CudaError;

fn err(what: &str, e: impl std::fmt::Debug) -> CudaError {
    CudaError::Driver(format!("cuBLASLt {what}: {e:?}"))
}

/// The shape of one column-major GEMM `C[m, n] = op(A) op(B) (+ beta C)`,
/// or of `batch` of them whose operands sit `sa`, `sb`, `sc` elements apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    pub ta: bool,
    pub tb: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub batch: usize,
    pub sa: usize,
    pub sb: usize,
    pub sc: usize,
}

impl GemmShape {
    /// One GEMM (not batched).
    #[allow(clippy::too_many_arguments)]
    pub fn single(ta: bool, tb: bool, m: usize, n: usize, k: usize, lda: usize, ldb: usize, ldc: usize) -> Self {
        GemmShape { ta, tb, m, n, k, lda, ldb, ldc, batch: 1, sa: 0, sb: 0, sc: 0 }
    }
}

/// The alignment in bytes (a power of two, at most 256) that every pointer
/// of a call has: cuBLASLt's heuristic assumes 256 unless told, and an
/// algorithm picked for aligned operands may refuse offset views.
fn common_alignment(ptrs: &[u64]) -> u32 {
    let bits = ptrs.iter().fold(256u64, |acc, p| acc | p);
    (1u64 << bits.trailing_zeros()).min(256) as u32
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this plan and is destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

pub struct LtGemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    /// Keyed by shape and the operands' common alignment.
    plans: Mutex<HashMap<(GemmShape, u32), Plan>>,
}

// The raw handles are used on the one stream this object owns; calls are
// serialised by the caller (one compute thread) and the plan cache by its lock.
unsafe impl Send for LtGemm {}
unsafe impl Sync for LtGemm {}

impl Drop for LtGemm {
    fn drop(&mut self) {
        self.plans.lock().unwrap_or_else(|p| p.into_inner()).clear();
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// NVIDIA's recommended workspace: 32 MiB on Hopper and later, 4 MiB before.
fn workspace_bytes(major: i32) -> usize {
    if major >= 9 { 32 << 20 } else { 4 << 20 }
}

impl LtGemm {
    pub fn new(stream: Arc<CudaStream>, compute_major: i32) -> Result<LtGemm, CudaError> {
        let handle = lt::create_handle().map_err(|e| err("create", e))?;
        let workspace = stream.alloc_zeros::<u8>(workspace_bytes(compute_major)).map_err(|e| err("workspace", e))?;
        Ok(LtGemm { handle, workspace, stream, plans: Mutex::new(HashMap::new()) })
    }

    fn plan(&self, s: GemmShape, align: u32) -> Result<Plan, CudaError> {
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        let bf16 = sys::cudaDataType_t::CUDA_R_16BF;
        let f32t = sys::cudaDataType_t::CUDA_R_32F;
        // Stored shapes: op(A) is m x k, so A itself is k x m when transposed.
        let (ar, ac) = if s.ta { (s.k, s.m) } else { (s.m, s.k) };
        let (br, bc) = if s.tb { (s.n, s.k) } else { (s.k, s.n) };
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, f32t)
            .map_err(|e| err("matmul descriptor", e))?;
        // Built field by field so `Drop` frees whatever was made if a later step fails.
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: unsafe { std::mem::zeroed() },
        };
        for (attr, t) in [(Attr::CUBLASLT_MATMUL_DESC_TRANSA, s.ta), (Attr::CUBLASLT_MATMUL_DESC_TRANSB, s.tb)] {
            // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 (a 32-bit enum).
            let op: i32 = t.into();
            // SAFETY: the attribute takes a cublasOperation_t, passed by pointer with its size.
            unsafe {
                lt::set_matmul_desc_attribute(plan.desc, attr, (&op) as *const _ as *const _, size_of_val(&op))
                    .map_err(|e| err("transpose attribute", e))?;
            }
        }
        plan.a = lt::create_matrix_layout(bf16, ar as u64, ac as u64, s.lda as i64).map_err(|e| err("layout A", e))?;
        plan.b = lt::create_matrix_layout(bf16, br as u64, bc as u64, s.ldb as i64).map_err(|e| err("layout B", e))?;
        plan.c =
            lt::create_matrix_layout(f32t, s.m as u64, s.n as u64, s.ldc as i64).map_err(|e| err("layout C", e))?;
        if s.batch > 1 {
            use sys::cublasLtMatrixLayoutAttribute_t as L;
            let count = s.batch as i32;
            for (layout, stride) in [(plan.a, s.sa), (plan.b, s.sb), (plan.c, s.sc)] {
                let stride = stride as i64;
                // SAFETY: live layouts; attribute values passed by pointer with their sizes.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        layout,
                        L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count) as *const _ as *const _,
                        size_of_val(&count),
                    )
                    .and_then(|_| {
                        lt::set_matrix_layout_attribute(
                            layout,
                            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            (&stride) as *const _ as *const _,
                            size_of_val(&stride),
                        )
                    })
                    .map_err(|e| err("batch attributes", e))?;
                }
            }
        }
        let pref = lt::create_matmul_pref().map_err(|e| err("preference", e))?;
        let ws = self.workspace.len();
        // SAFETY: every handle is live; the preference is destroyed right after use.
        let heuristic = unsafe {
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let set =
                |attr: P, v: *const std::ffi::c_void, size: usize| lt::set_matmul_pref_attribute(pref, attr, v, size);
            let r = set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&ws) as *const _ as *const _, size_of_val(&ws))
                .and_then(|_| {
                    [
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                    ]
                    .into_iter()
                    .try_for_each(|attr| set(attr, (&align) as *const _ as *const _, size_of_val(&align)))
                })
                .and_then(|_| {
                    lt::get_matmul_algo_heuristic(self.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref)
                });
            let _ = lt::destroy_matmul_pref(pref);
            r.map_err(|e| err(&format!("no algorithm for {s:?}"), e))?
        };
        plan.algo = heuristic.algo;
        Ok(plan)
    }

    /// `C = op(A) op(B) + beta C` with A and B bf16 (device pointers to u16)
    /// and C fp32, column-major, on this object's stream.
    ///
    /// # Safety
    /// `a`, `b`, `c` must be device allocations at least as large as the
    /// shape and leading dimensions say, alive until the stream reaches
    /// this GEMM.
    pub unsafe fn gemm(&self, s: GemmShape, a: u64, b: u64, c: u64, beta: f32) -> Result<(), CudaError> {
        let align = common_alignment(&[a, b, c]);
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let p = match plans.entry((s, align)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(s, align)?),
        };
        let alpha = 1.0f32;
        let (ws, _rec) = self.workspace.device_ptr(&self.stream);
        // SAFETY: the plan's handles are live; pointers per the caller's contract.
        unsafe {
            lt::matmul(
                self.handle,
                p.desc,
                (&alpha) as *const f32 as *const _,
                (&beta) as *const f32 as *const _,
                a as *const _,
                p.a,
                b as *const _,
                p.b,
                c as *const _,
                p.c,
                c as *mut _,
                p.c,
                &p.algo,
                ws as *mut _,
                self.workspace.len(),
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| err(&format!("matmul {s:?}"), e))
    }

    /// Shapes planned so far (for the bench's report).
    pub fn planned(&self) -> usize {
        self.plans.lock().map(|p| p.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::common_alignment;

    #[test]
    fn the_common_alignment_is_the_weakest_pointers() {
        assert_eq!(common_alignment(&[0x1000, 0x2000, 0x3000]), 256);
        assert_eq!(common_alignment(&[0x1000, 0x1080, 0x3000]), 128);
        assert_eq!(common_alignment(&[0x1000, 0x1002, 0x3000]), 2);
        assert_eq!(common_alignment(&[0x1010]), 16);
    }
}
