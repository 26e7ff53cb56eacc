//! Fused (flash) attention on `CudaBackend` (`kernels/flash.cu`): one kernel
//! for the forward and two for the backward, no `[t, t]` probabilities in
//! memory (the forward saves a log-sum-exp per query and head). Used with
//! bf16 GEMMs when turned on (`IOTA_FLASH_ATTENTION=1`, or
//! `with_flash_attention`) and the head size is 16, 32, 64 or 128;
//! otherwise attention runs as GEMMs around the softmax kernels
//! (`attention.rs`). Off by default until it has been measured on a GPU.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use iota_model::backend::AttnDims;

use super::{CudaBackend, DMut, DRef, Scratch, ok};

/// Queries (and keys) per block of the kernels: `TILE` in flash.cu.
const TILE: usize = 64;
/// Threads per block: 4 warps of 16 rows each.
const THREADS: u32 = 128;

fn names(head_dim: usize) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match head_dim {
        16 => ("flash_fwd_16", "flash_bwd_dq_16", "flash_bwd_dkv_16"),
        32 => ("flash_fwd_32", "flash_bwd_dq_32", "flash_bwd_dkv_32"),
        64 => ("flash_fwd_64", "flash_bwd_dq_64", "flash_bwd_dkv_64"),
        128 => ("flash_fwd_128", "flash_bwd_dq_128", "flash_bwd_dkv_128"),
        _ => return None,
    })
}

impl CudaBackend {
    /// A second backend on the same GPU with the fused attention kernels on
    /// (None without bf16 GEMMs, which they need).
    pub fn with_flash_attention(&self) -> Option<CudaBackend> {
        self.lt.as_ref()?;
        let mut be = CudaBackend::with_precision(self.gpu.clone(), self.precision).ok()?;
        be.flash = true;
        Some(be)
    }

    /// Whether attention of these dimensions runs on the fused kernels.
    pub fn flash_applies(&self, dims: AttnDims) -> bool {
        self.flash
            && self.lt.is_some()
            && names(dims.head_dim).is_some()
            && dims.n_kv_heads > 0
            && dims.n_heads.is_multiple_of(dims.n_kv_heads)
            && dims.seq > 0
    }

    /// Values the fused forward saves: a log-sum-exp per (sequence, head, query).
    pub(super) fn flash_saved_len(dims: AttnDims) -> usize {
        dims.batch * dims.n_heads * dims.seq
    }

    fn flash_grid(dims: AttnDims, heads: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (dims.seq.div_ceil(TILE) as u32, heads as u32, dims.batch as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The bf16 copy of q|k|v: the kept one if current, else a cast into
    /// scratch (made and kept for the backward where the copies allow).
    fn qkv16(&self, scratch: &mut Scratch, copies: &mut super::Copies, qkv: DRef<'_>) -> u64 {
        self.kept_copy(&mut copies.acts, qkv.ptr, qkv.len)
            .unwrap_or_else(|| self.cast_into(&mut scratch.attn_x, qkv.ptr, qkv.len))
    }

    pub(super) fn flash_forward(&self, out: DMut<'_>, lse: DMut<'_>, qkv: DRef<'_>, dims: AttnDims) {
        let (fwd, _, _) = names(dims.head_dim).expect("flash_applies was checked");
        assert!(
            qkv.len == dims.rows() * dims.qkv_dim()
                && out.len == dims.rows() * dims.q_dim()
                && lse.len == Self::flash_saved_len(dims),
            "fused attention shapes"
        );
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let x = self.qkv16(&mut scratch, &mut copies, qkv);
        let (t, nh, nkv) = (dims.seq as i32, dims.n_heads as i32, dims.n_kv_heads as i32);
        let scale = 1.0 / (dims.head_dim as f32).sqrt();
        launch!(self, fwd, Self::flash_grid(dims, dims.n_heads), &x, &out.ptr, &lse.ptr, &t, &nh, &nkv, &scale);
    }

    pub(super) fn flash_backward(
        &self,
        dqkv: DMut<'_>,
        dout: DRef<'_>,
        qkv: DRef<'_>,
        out: DRef<'_>,
        lse: DRef<'_>,
        dims: AttnDims,
    ) {
        let (_, dq, dkv) = names(dims.head_dim).expect("flash_applies was checked");
        assert!(
            dqkv.len == qkv.len
                && dout.len == dims.rows() * dims.q_dim()
                && out.len == dout.len
                && lse.len == Self::flash_saved_len(dims),
            "fused attention_bwd shapes"
        );
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let x = self.qkv16(&mut scratch, &mut copies, qkv);
        let rows = Self::flash_saved_len(dims);
        let dterm = self.f32_scratch(&mut scratch.partials, rows);
        let (b, t, nh, nkv, hd) =
            (dims.batch as i32, dims.seq as i32, dims.n_heads as i32, dims.n_kv_heads as i32, dims.head_dim as i32);
        let scale = 1.0 / (dims.head_dim as f32).sqrt();
        launch!(self, "flash_bwd_prep", self.grid(rows), &dterm, &dout.ptr, &out.ptr, &b, &t, &nh, &hd);
        // dQ by query tiles over the heads, then dK and dV by key tiles over
        // the KV heads: the same arguments, disjoint columns of dqkv.
        for (kernel, heads) in [(dq, dims.n_heads), (dkv, dims.n_kv_heads)] {
            let grid = Self::flash_grid(dims, heads);
            launch!(self, kernel, grid, &dqkv.ptr, &x, &dout.ptr, &lse.ptr, &dterm, &t, &nh, &nkv, &scale);
        }
    }
}
