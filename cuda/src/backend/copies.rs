//! `CudaBackend`'s scratch buffers and the bookkeeping of its bf16 copies
//! (`cast_cache.rs` holds the ledger's rules): where a GEMM operand's copy
//! is found, kept or cast into scratch, and what a kernel's write or a new
//! allocation makes stale.
//!
//! Fused casts: a kernel that writes the next GEMM's operand can write its
//! bf16 copy in the same pass (`produce_slot` into the kept copies,
//! `produce_b` into scratch "b", where an output gradient's copy lives for
//! its two GEMMs), which saves a `cast_bf16` launch and a read of the fp32
//! values. The copy is marked only after the launch, and any later write
//! over its source forgets it, as for a cast.

use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};

use super::{CudaBackend, ok};
use crate::cast_cache::CastCache;

impl CudaBackend {
    /// Casts `len` contiguous f32 values at `src` into `buf` (grown to fit); returns its pointer.
    pub(super) fn cast_into(&self, buf: &mut Option<CudaSlice<u16>>, src: u64, len: usize) -> u64 {
        if buf.as_ref().is_none_or(|b| b.len() < len) {
            // The old buffer's free is ordered on the stream after the GEMMs that read it.
            *buf = Some(ok(self.gpu.stream.alloc_zeros::<u16>(len.max(1)), "alloc"));
        }
        let dst = buf.as_ref().expect("allocated above").device_ptr(&self.gpu.stream).0;
        let n = len as i64;
        launch!(self, "cast_bf16", self.grid(len), &dst, &src, &n);
        dst
    }

    /// A grow-only f32 scratch buffer of at least `len` values; its pointer.
    /// Work on the one stream is ordered, so a later call may reuse it, and
    /// a replaced buffer is freed in stream order after its last reader.
    pub(super) fn f32_scratch(&self, buf: &mut Option<CudaSlice<f32>>, len: usize) -> u64 {
        if buf.as_ref().is_none_or(|b| b.len() < len) {
            *buf = Some(ok(self.gpu.stream.alloc_zeros::<f32>(len.max(1)), "alloc"));
        }
        buf.as_ref().expect("allocated above").device_ptr(&self.gpu.stream).0
    }

    /// A grow-only bf16 scratch buffer of at least `len` values; its pointer.
    pub(super) fn u16_scratch(&self, buf: &mut Option<CudaSlice<u16>>, len: usize) -> u64 {
        if buf.as_ref().is_none_or(|b| b.len() < len) {
            *buf = Some(ok(self.gpu.stream.alloc_zeros::<u16>(len.max(1)), "alloc"));
        }
        buf.as_ref().expect("allocated above").device_ptr(&self.gpu.stream).0
    }

    /// The current bf16 copy of `[src, src + 4 len)` in `cache`, made now if
    /// there is none and it fits the limit; None when it does not fit.
    pub(super) fn kept_copy(&self, cache: &mut CastCache<CudaSlice<u16>>, src: u64, len: usize) -> Option<u64> {
        if let Some(copy) = cache.current(src, len) {
            return Some(copy.device_ptr(&self.gpu.stream).0);
        }
        let dst = self.copy_slot(cache, src, len)?;
        let n = len as i64;
        launch!(self, "cast_bf16", self.grid(len), &dst, &src, &n);
        cache.mark_current(src, len);
        Some(dst)
    }

    /// Storage in `cache` for the copy of exactly `[src, src + 4 len)`, made
    /// if there is none and it fits the limit (not yet current: the caller
    /// writes it, then marks it current).
    pub(super) fn copy_slot(&self, cache: &mut CastCache<CudaSlice<u16>>, src: u64, len: usize) -> Option<u64> {
        if cache.storage(src, len).is_none() {
            if !cache.admits(len) {
                return None;
            }
            let buf = ok(self.gpu.stream.alloc_zeros::<u16>(len.max(1)), "alloc");
            // Room is made from the least recently used copies.
            drop(cache.insert(src, len, buf));
        }
        Some(cache.storage(src, len).expect("inserted above").device_ptr(&self.gpu.stream).0)
    }

    /// With bf16 GEMMs: storage for the bf16 copy of an activation a kernel
    /// is about to write (0: none, the kernel writes fp32 only). Mark it
    /// current after the launch with `produced`.
    pub(super) fn produce_slot(&self, ptr: u64, len: usize) -> u64 {
        if self.lt.is_none() {
            return 0;
        }
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        self.copy_slot(&mut copies.acts, ptr, len).unwrap_or(0)
    }

    /// A second backend on the same GPU with fused casts on or off (`fused_casts`),
    /// attention as this one's; None without bf16 GEMMs.
    pub fn with_fused_casts(&self, on: bool) -> Option<CudaBackend> {
        self.lt.as_ref()?;
        let mut be = CudaBackend::with_precision(self.gpu.clone(), self.precision).ok()?;
        be.flash = self.flash;
        be.fused_casts = on;
        Some(be)
    }

    /// With fused casts: `produce_slot`, for a kernel that writes the
    /// operand a `cast_bf16` would otherwise copy (0: it writes fp32 only).
    pub(super) fn produce_copy(&self, ptr: u64, len: usize) -> u64 {
        if self.fused_casts { self.produce_slot(ptr, len) } else { 0 }
    }

    /// With fused casts: scratch "b" for the bf16 copy of an output
    /// gradient a kernel is about to write, which the next GEMMs read as
    /// their "b" operand (0: none, the kernel writes fp32 only). It no
    /// longer holds what it held; mark it with `produced_b` after the launch.
    pub(super) fn produce_b(&self, len: usize) -> u64 {
        if !self.fused_casts || self.lt.is_none() || len == 0 {
            return 0;
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let slot = self.u16_scratch(&mut scratch.b, len);
        drop(scratch);
        self.copies.lock().unwrap_or_else(|p| p.into_inner()).b_holds = None;
        slot
    }

    /// Scratch "b" now holds the bf16 copy of `[ptr, ptr + 4 len)` (a no-op
    /// for slot 0). Any later write over the range forgets it (`Copies::written`).
    pub(super) fn produced_b(&self, slot: u64, ptr: u64, len: usize) {
        if slot != 0 {
            self.copies.lock().unwrap_or_else(|p| p.into_inner()).b_holds = Some((ptr, len));
        }
    }

    pub(super) fn produced(&self, slot: u64, ptr: u64, len: usize) {
        if slot != 0 {
            self.copies.lock().unwrap_or_else(|p| p.into_inner()).acts.mark_current(ptr, len);
        }
    }

    /// Memory at `[ptr, ptr + 4 len)` may change: bf16 copies of it are stale.
    pub(super) fn note_written(&self, ptr: u64, len: usize) {
        self.copies.lock().unwrap_or_else(|p| p.into_inner()).written(ptr, len);
    }

    pub(super) fn note_allocated(&self, buf: &CudaSlice<f32>) -> u64 {
        let ptr = self.ptr(buf);
        self.copies.lock().unwrap_or_else(|p| p.into_inner()).allocated(ptr, buf.len());
        ptr
    }
}
