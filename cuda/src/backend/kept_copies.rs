//! The ledger of `CudaBackend`'s bf16 copies that outlive one call (the
//! rules are `cast_cache.rs`'s); `copies.rs` makes and finds them.

use cudarc::driver::CudaSlice;

use crate::cast_cache::CastCache;

/// bf16 copies that outlive one call. The weights' are kept until the
/// weight is written (the optimizer step rewrites them in place). The
/// activations' are made by the kernels that produce them (RMSNorm, SwiGLU,
/// the softmax) or by the forward GEMM that casts its input, and read again
/// by the backward (the weight gradient's input, attention's Q|K|V and P).
/// `b_holds` is what scratch "b" holds: an output gradient is the "b"
/// operand of both its input- and weight-gradient GEMMs, so the second finds
/// it cast.
pub(super) struct Copies {
    pub(super) weights: CastCache<CudaSlice<u16>>,
    pub(super) acts: CastCache<CudaSlice<u16>>,
    pub(super) b_holds: Option<(u64, usize)>,
}

impl Copies {
    pub(super) fn written(&mut self, ptr: u64, len: usize) {
        self.weights.written(ptr, len);
        self.acts.written(ptr, len);
        if self.b_holds.is_some_and(|(p, l)| p < ptr + 4 * len as u64 && ptr < p + 4 * l as u64) {
            self.b_holds = None;
        }
    }
    pub(super) fn allocated(&mut self, ptr: u64, len: usize) {
        // Freed storage goes in stream order, after the work that read it.
        drop(self.weights.allocated(ptr, 4 * len));
        drop(self.acts.allocated(ptr, 4 * len));
        self.written(ptr, len);
    }
}
