//! The GPU end of the receive path: page-locked host memory for the data
//! plane's receive pool, and the step from a received payload to decoded
//! activations on the device.
//!
//! The transport reads a frame's payload from QUIC straight into a pooled
//! buffer (the one host copy). With a `PinnedAllocator` behind the pool that
//! buffer is page-locked, so `DeviceReceiver` can DMA it to the device
//! asynchronously on the stage's stream and decode it there (int8 rows ->
//! f32, with the bottleneck's residual add fused): no second host copy and
//! no staging through pageable memory.
//!
//! Page-locked memory is allocated with flags 0, not cudarc's default
//! write-combined: the CPU writes these buffers (the transport) and reads
//! them back (frame validation, hashing), and write-combined memory is very
//! slow for CPU reads.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use iota_core::WireCodec;

use crate::gpu::Gpu;
use crate::runtime::CudaError;

fn drv(e: impl std::fmt::Debug) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

/// Allocates and frees page-locked host memory in a GPU's context.
#[derive(Clone)]
pub struct PinnedAllocator {
    ctx: Arc<CudaContext>,
}

impl PinnedAllocator {
    pub fn new(gpu: &Gpu) -> PinnedAllocator {
        PinnedAllocator { ctx: gpu.ctx.clone() }
    }

    /// `bytes` of page-locked, cached (not write-combined) host memory.
    pub fn alloc(&self, bytes: usize) -> Result<NonNull<u8>, CudaError> {
        self.ctx.bind_to_thread().map_err(drv)?;
        // SAFETY: plain allocation; the memory is uninitialised bytes, valid for u8.
        let p = unsafe { cudarc::driver::result::malloc_host(bytes.max(1), 0) }.map_err(drv)?;
        NonNull::new(p as *mut u8).ok_or_else(|| CudaError::Driver("cuMemHostAlloc returned null".into()))
    }

    /// # Safety
    /// `ptr` must come from `alloc` of this allocator and not be in use.
    pub unsafe fn free(&self, ptr: NonNull<u8>) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: per the caller's contract.
            let _ = unsafe { cudarc::driver::result::free_host(ptr.as_ptr() as *mut _) };
        }
    }
}

/// Moves received payloads onto the device and decodes them there, on the
/// GPU's stream (the stage's stream, so the decode is ordered before the
/// stage's first kernel that reads it).
pub struct DeviceReceiver {
    gpu: Arc<Gpu>,
    /// Device copy of the wire bytes, grow-only.
    staging: Mutex<Option<CudaSlice<u8>>>,
}

/// A decode in flight. `wait` blocks until the device has it and says
/// whether the payload was valid; until then the source buffer must stay
/// untouched (the DMA reads it).
pub struct Pending {
    done: CudaEvent,
    bad: CudaSlice<i32>,
    gpu: Arc<Gpu>,
}

impl Pending {
    /// `Ok(true)` when every row decoded; `Ok(false)` when the payload held
    /// an invalid scale or code (the output then holds NaNs: reject the frame).
    pub fn wait(self) -> Result<bool, CudaError> {
        self.done.synchronize().map_err(drv)?;
        let bad = self.gpu.stream.clone_dtoh(&self.bad).map_err(drv)?;
        Ok(bad[0] == 0)
    }
}

impl DeviceReceiver {
    pub fn new(gpu: Arc<Gpu>) -> DeviceReceiver {
        DeviceReceiver { gpu, staging: Mutex::new(None) }
    }

    /// Copies an int8-row payload (`rows` x `cols`) to the device and decodes
    /// it into `out` (`rows * cols` f32), adding `residual` when given.
    /// Checks the payload's size first: hostile input never reaches a kernel
    /// with the wrong length.
    ///
    /// # Safety
    /// `payload` must be page-locked host memory (from `PinnedAllocator`)
    /// that stays alive and unmodified until the returned `Pending` has been
    /// waited on; with pageable memory the copy is still correct but not
    /// asynchronous.
    pub unsafe fn decode_int8(
        &self,
        payload: &[u8],
        rows: usize,
        cols: usize,
        out: &mut CudaSlice<f32>,
        residual: Option<&CudaSlice<f32>>,
    ) -> Result<Pending, CudaError> {
        let want = WireCodec::Int8Row.payload_bytes(rows, cols);
        if want != Some(payload.len()) || out.len() < rows * cols || residual.is_some_and(|r| r.len() < rows * cols) {
            return Err(CudaError::Driver(format!(
                "payload of {} bytes does not hold {rows} x {cols} int8 rows (expected {want:?})",
                payload.len()
            )));
        }
        let s = &self.gpu.stream;
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if staging.as_ref().is_none_or(|b| b.len() < payload.len()) {
            *staging = Some(s.alloc_zeros::<u8>(payload.len().max(1)).map_err(drv)?);
        }
        let dst = staging.as_mut().expect("allocated above");
        {
            let (dp, _rec) = dst.device_ptr_mut(s);
            // SAFETY: dst holds >= payload.len() bytes; the source's lifetime is the caller's contract.
            unsafe { cudarc::driver::result::memcpy_htod_async(dp, payload, s.cu_stream()) }.map_err(drv)?;
        }
        let bad: CudaSlice<i32> = s.alloc_zeros(1).map_err(drv)?;
        let (r, c) = (rows as i32, cols as i32);
        let res_ptr: u64 = residual.map_or(0, |x| x.device_ptr(s).0);
        let out_ptr: u64 = out.device_ptr_mut(s).0;
        let (in_ptr, bad_ptr) = (dst.device_ptr(s).0, bad.device_ptr(s).0);
        let cfg = LaunchConfig { grid_dim: (rows.max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(self.gpu.function("decode_int8_rows"));
        b.arg(&in_ptr).arg(&r).arg(&c).arg(&res_ptr).arg(&out_ptr).arg(&bad_ptr);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        let done = s.record_event(None).map_err(drv)?;
        Ok(Pending { done, bad, gpu: self.gpu.clone() })
    }
}
