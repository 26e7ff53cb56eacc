//! The compute interface every stage is written against.
//!
//! There is no autograd tape: each op has an explicit forward and backward,
//! and the stage code (see `block.rs`) calls them in order and keeps the
//! activations the backward needs. A backend owns its memory (`Buf`) and hands
//! out borrowed views (`Ref`, `Mut`) of ranges of it, so a stage can keep all
//! its parameters in one flat buffer and still address each tensor.
//!
//! Conventions (all row-major):
//! - activations are `[n, c]` with `n = batch * seq` token rows;
//! - a linear layer's weight is `[out, in]` (as PyTorch/HF store it) and
//!   computes `y = x @ w^T`;
//! - backward functions *accumulate* into parameter gradients (`+=`), so
//!   several micro-batches can be summed before an optimizer step;
//! - ops with an `acc` flag write (`=`) when it is false and add when true.
//!
//! Determinism: for the same inputs a backend returns bitwise identical
//! results on every call (no atomics, reductions in a fixed order).

use std::ops::Range;

/// Shapes of one causal self-attention call on a fused `q|k|v` buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    pub batch: usize,
    pub seq: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl AttnDims {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }
    /// Elements of the saved attention probabilities `[batch, heads, seq, seq]`.
    pub fn probs_len(&self) -> usize {
        self.batch * self.n_heads * self.seq * self.seq
    }
}

/// Hyper-parameters of one AdamW update of one tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled weight decay (0 for tensors that are not decayed).
    pub weight_decay: f32,
    /// 1-based step count, for bias correction.
    pub t: u64,
    /// Multiplies the gradient first (grad-norm clipping, accumulation mean).
    pub grad_scale: f32,
    /// NAdam: the first moment looks one step ahead (Dozat 2016), i.e. the
    /// update uses beta1 m_t / (1 - beta1^(t+1)) + (1 - beta1) g_t / (1 - beta1^t)
    /// in place of Adam's m_t / (1 - beta1^t).
    pub nesterov: bool,
}

impl AdamStep {
    /// The update's coefficients on m_t and on the (scaled) gradient:
    /// (lr / (1 - beta1^t), 0) for Adam; NAdam's look-ahead otherwise.
    pub fn moment_coefficients(&self) -> (f32, f32) {
        let b1 = self.beta1 as f64;
        let bc1 = 1.0 - b1.powi(self.t as i32);
        let lr = self.lr as f64;
        if self.nesterov {
            let bc1_next = 1.0 - b1.powi(self.t as i32 + 1);
            ((lr * b1 / bc1_next) as f32, (lr * (1.0 - b1) / bc1) as f32)
        } else {
            ((lr / bc1) as f32, 0.0)
        }
    }
}

pub trait Backend: Send + Sync {
    /// Owned storage of f32 values.
    type Buf: Send;
    /// A read-only view of part of a `Buf`.
    type Ref<'a>: Copy
    where
        Self: 'a;
    /// A writable view of part of a `Buf`.
    type Mut<'a>
    where
        Self: 'a;

    fn name(&self) -> String;

    // ---- memory ----
    fn zeros(&self, n: usize) -> Self::Buf;
    /// A buffer of `n` values whose contents are unspecified: for an output
    /// the next op writes whole before anything reads it (a GEMM with
    /// `acc = false`, a norm, the attention), where zeroing it first is
    /// wasted bandwidth (a `1b` stage's step zeroed ~5 GB on the GPU).
    /// `CpuBackend` fills it with NaN in debug builds, so a caller that reads
    /// before writing fails the tests instead of reading stale values.
    fn empty(&self, n: usize) -> Self::Buf {
        self.zeros(n)
    }
    /// Bytes a backend may keep in bf16 copies of weights and of
    /// activations (a cache; `CudaBackend` with bf16 GEMMs). A miner sets
    /// them from what its memory leaves beside its stage's required peak.
    fn set_copy_limits(&self, _weights_bytes: u64, _activation_bytes: u64) {}
    fn upload(&self, host: &[f32]) -> Self::Buf;
    fn download(&self, buf: &Self::Buf, range: Range<usize>, out: &mut [f32]);
    fn len(&self, buf: &Self::Buf) -> usize;
    fn view<'a>(&self, buf: &'a Self::Buf, range: Range<usize>) -> Self::Ref<'a>;
    fn view_mut<'a>(&self, buf: &'a mut Self::Buf, range: Range<usize>) -> Self::Mut<'a>;

    fn all<'a>(&self, buf: &'a Self::Buf) -> Self::Ref<'a> {
        let n = self.len(buf);
        self.view(buf, 0..n)
    }
    fn all_mut<'a>(&self, buf: &'a mut Self::Buf) -> Self::Mut<'a> {
        let n = self.len(buf);
        self.view_mut(buf, 0..n)
    }
    fn to_host(&self, buf: &Self::Buf) -> Vec<f32> {
        let n = self.len(buf);
        let mut v = vec![0.0; n];
        self.download(buf, 0..n, &mut v);
        v
    }

    /// Decodes a received boundary payload (`rows` x `cols`, wire `codec`)
    /// into a buffer of this backend. The bytes are hostile: an invalid
    /// encoding is an error, and a decoded buffer holds only finite values.
    /// The default decodes on the host and uploads; a GPU backend copies the
    /// bytes to the device and decodes there.
    fn decode_wire(
        &self,
        codec: iota_core::WireCodec,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self::Buf, iota_core::CoreError> {
        let v = crate::codec::decode(codec, rows, cols, bytes)?;
        Ok(self.upload(&v))
    }

    // ---- elementwise ----
    fn fill(&self, x: Self::Mut<'_>, value: f32);
    fn copy(&self, dst: Self::Mut<'_>, src: Self::Ref<'_>);
    /// dst += src
    fn add_assign(&self, dst: Self::Mut<'_>, src: Self::Ref<'_>);
    fn scale(&self, x: Self::Mut<'_>, s: f32);
    /// Sum of squares, accumulated in f64 in a fixed order.
    fn sum_squares(&self, x: Self::Ref<'_>) -> f64;
    /// dst[:, :b] (+)= src, with dst `[n, d]` and src `[n, b]`.
    fn scatter_cols(&self, dst: Self::Mut<'_>, src: Self::Ref<'_>, n: usize, d: usize, b: usize, acc: bool);
    /// dst (+)= src[:, :b], with dst `[n, b]` and src `[n, d]`.
    fn gather_cols(&self, dst: Self::Mut<'_>, src: Self::Ref<'_>, n: usize, d: usize, b: usize, acc: bool);

    // ---- linear ----
    /// out[n, oc] (+)= inp[n, c] @ w[oc, c]^T
    fn matmul(
        &self,
        out: Self::Mut<'_>,
        inp: Self::Ref<'_>,
        w: Self::Ref<'_>,
        n: usize,
        c: usize,
        oc: usize,
        acc: bool,
    );
    /// dinp[n, c] (+)= dout[n, oc] @ w[oc, c]
    fn matmul_bwd_input(
        &self,
        dinp: Self::Mut<'_>,
        dout: Self::Ref<'_>,
        w: Self::Ref<'_>,
        n: usize,
        c: usize,
        oc: usize,
        acc: bool,
    );
    /// dw[oc, c] += dout[n, oc]^T @ inp[n, c]
    fn matmul_bwd_weight(
        &self,
        dw: Self::Mut<'_>,
        dout: Self::Ref<'_>,
        inp: Self::Ref<'_>,
        n: usize,
        c: usize,
        oc: usize,
    );

    // ---- embedding ----
    /// out[i, :] = wte[tokens[i], :]
    fn embedding(&self, out: Self::Mut<'_>, tokens: &[u32], wte: Self::Ref<'_>, d: usize);
    /// dwte[tokens[i], :] += dout[i, :], summed in token order.
    fn embedding_bwd(&self, dwte: Self::Mut<'_>, dout: Self::Ref<'_>, tokens: &[u32], d: usize);

    // ---- normalisation ----
    /// out = x / rms(x) * w per row; saves 1/rms in `rstd[n]`.
    fn rmsnorm(
        &self,
        out: Self::Mut<'_>,
        rstd: Self::Mut<'_>,
        x: Self::Ref<'_>,
        w: Self::Ref<'_>,
        n: usize,
        d: usize,
        eps: f32,
    );
    /// dx += d(out)/dx . dout; dw += d(out)/dw . dout
    fn rmsnorm_bwd(
        &self,
        dx: Self::Mut<'_>,
        dw: Self::Mut<'_>,
        dout: Self::Ref<'_>,
        x: Self::Ref<'_>,
        w: Self::Ref<'_>,
        rstd: Self::Ref<'_>,
        n: usize,
        d: usize,
    );

    // ---- attention ----
    /// Rotates, in place, the first `heads` head-wide column blocks of each row
    /// of `x` (`row_stride` apart) by the angles in `table` (`[seq, hd/2]` cos
    /// then `[seq, hd/2]` sin; row r is at position r % seq). `inverse`
    /// rotates the other way, which is exactly RoPE's backward.
    fn rope(
        &self,
        x: Self::Mut<'_>,
        table: Self::Ref<'_>,
        rows: usize,
        seq: usize,
        row_stride: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    );
    /// Causal softmax attention over a fused `[n, q|k|v]` buffer with grouped
    /// KV heads. Writes `out [n, q_dim]` and what its backward needs into
    /// `saved` (`attention_saved_len` values: the probabilities
    /// `[batch, heads, seq, seq]`, or a fused kernel's row statistics).
    fn attention(&self, out: Self::Mut<'_>, saved: Self::Mut<'_>, qkv: Self::Ref<'_>, dims: AttnDims);
    /// Values `attention` saves for its backward.
    fn attention_saved_len(&self, dims: AttnDims) -> usize {
        dims.probs_len()
    }
    /// Writes (not accumulates) `dqkv [n, qkv_dim]`; `out` is the forward's
    /// output.
    fn attention_bwd(
        &self,
        dqkv: Self::Mut<'_>,
        dout: Self::Ref<'_>,
        qkv: Self::Ref<'_>,
        out: Self::Ref<'_>,
        saved: Self::Ref<'_>,
        dims: AttnDims,
    );

    // ---- MLP ----
    /// out[n, f] = silu(gu[:, :f]) * gu[:, f:]
    fn swiglu(&self, out: Self::Mut<'_>, gu: Self::Ref<'_>, n: usize, f: usize);
    /// Writes dgu [n, 2f].
    fn swiglu_bwd(&self, dgu: Self::Mut<'_>, dout: Self::Ref<'_>, gu: Self::Ref<'_>, n: usize, f: usize);

    // ---- loss ----
    /// Fused softmax + cross-entropy. `logits [n, vocab]` is overwritten with
    /// `dscale * (softmax - onehot)`; columns >= `vocab_real` are padding and
    /// get gradient 0. Returns the per-row loss (natural log).
    fn cross_entropy(
        &self,
        logits: Self::Mut<'_>,
        targets: &[u32],
        n: usize,
        vocab: usize,
        vocab_real: usize,
        dscale: f32,
    ) -> Vec<f32>;

    // ---- optimizer ----
    fn adamw(&self, p: Self::Mut<'_>, g: Self::Ref<'_>, m: Self::Mut<'_>, v: Self::Mut<'_>, step: AdamStep);
}
