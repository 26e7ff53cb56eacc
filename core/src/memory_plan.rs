//! What one pipeline stage holds in memory, counted from the code that
//! allocates it (no I/O; `iota-bench scale --plan-only` prints it, and a
//! miner will state it when it registers).
//!
//! Every figure names the buffers it stands for, so a change to one of them
//! shows which line here follows:
//! - `Stage` (`iota-model/src/stage.rs`): one flat fp32 parameter buffer and
//!   one gradient buffer of the stage's `ParamLayout`; a RoPE table per
//!   sequence length; per micro-batch in flight a `Saved` (every block's
//!   `BlockActs`, the output residual, the bottleneck decoder's and encoder's
//!   activations); with weight stashing a copy of the weights (recomputing,
//!   all but a head's embedding table) per older version a micro-batch in
//!   flight was forwarded with (`before_update`).
//! - `block_forward` / `block_backward` (`block.rs`), `boundary.rs`,
//!   `head_forward_backward` (`lm_head.rs`, logits in chunks of at most
//!   `LOGIT_BUDGET` values): the temporaries of one forward and backward.
//! - `AdamW` (`optim.rs`): two fp32 moments per parameter, AdamW and NAdam.
//! - `CudaBackend` (`iota-cuda/src/backend.rs`): every buffer is fp32, as
//!   on the CPU; with bf16 GEMMs two grow-only scratch buffers take the bf16
//!   casts of the largest operands seen (`cast_into`), the weights keep bf16
//!   copies (up to `BF16_WEIGHT_COPIES_LIMIT`), attention keeps bf16 copies
//!   of its operands; the cuBLASLt workspace; attention's backward a
//!   `[kv_heads, seq, seq]` score buffer.
//! - The miner (`iota-dataplane`): the receive pool, the evidence log and
//!   the butterfly merge's vectors live in host memory, never on the GPU.
//!
//! Not counted, because no code of ours decides it: the CUDA driver's own
//! use (a fixed allowance, `CUDA_RUNTIME_ALLOWANCE`) and the caching
//! allocator's slack between freed and reused blocks.

use crate::codec::WireCodec;
use crate::config::{BottleneckStyle, ModelConfig};
use crate::error::ConfigError;
use crate::layout::{ParamLayout, StageRole, StageSpec};
use crate::merge::BLOCK;

pub const GIB: u64 = 1 << 30;

/// Most logits the LM head holds at once, in f32 values
/// (`iota_model::lm_head::LOGIT_BUDGET`; a model test keeps them equal).
pub const LOGIT_BUDGET: usize = 8 << 20;

/// The cuBLASLt workspace of the bf16 GEMM path (`lt.rs`, Hopper and later).
pub const CUBLASLT_WORKSPACE: u64 = 32 << 20;

/// The most bytes of bf16 weight copies a `CudaBackend` keeps by default
/// (`IOTA_BF16_WEIGHT_COPIES_MIB` overrides it): a weight's copy lives
/// until the weight is written, and the optimizer step rewrites it in place.
pub const BF16_WEIGHT_COPIES_LIMIT: u64 = 1 << 30;

/// The most bytes of bf16 activation copies a `CudaBackend` keeps by
/// default (`IOTA_BF16_ACTIVATION_COPIES_MIB` overrides it): the forward's
/// GEMM inputs, Q|K|V and the attention probabilities, made once and read
/// again by the backward.
pub const BF16_ACTIVATION_COPIES_LIMIT: u64 = 2 << 30;

/// An allowance for what the CUDA driver holds for a process that no code of
/// ours allocates: the context, the NVRTC-compiled kernels' and cuBLAS's
/// module images, cuBLAS's own workspace. Not measured here: a stated
/// assumption, to be replaced by a measurement (docs/BENCHMARKS.md).
pub const CUDA_RUNTIME_ALLOWANCE: u64 = 512 << 20;

/// A miner's receive pool budget (`MinerOptions::pool_bytes`); page-locked
/// host memory on a CUDA miner.
pub const RECEIVE_POOL_BYTES: u64 = 256 << 20;

/// The evidence log's budget for weights snapshots (`DEFAULT_EVIDENCE_BYTES`);
/// received frames take up to a quarter more.
pub const EVIDENCE_WEIGHTS_BYTES: u64 = 1 << 30;

/// Share of a card a plan leaves free: the caching allocator's slack and
/// what the driver holds beyond `CUDA_RUNTIME_ALLOWANCE`. The one
/// measurement so far (`1.5b` tail, batch 2 x 1024, an H200) came out 10%
/// above this plan (docs/BENCHMARKS.md, scale).
pub const FIT_RESERVE: f64 = 0.10;

/// What a stage computes with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ComputeBackend {
    /// `CpuBackend`: everything in host memory, fp32.
    #[default]
    Cpu,
    /// `CudaBackend` with fp32 GEMMs (cuBLAS sgemm).
    CudaF32Gemm,
    /// `CudaBackend` with bf16 GEMMs (cuBLASLt): fp32 storage, bf16 operand
    /// casts into scratch buffers.
    CudaBf16Gemm,
}

impl ComputeBackend {
    pub fn is_cuda(self) -> bool {
        self != ComputeBackend::Cpu
    }

    pub fn name(self) -> &'static str {
        match self {
            ComputeBackend::Cpu => "cpu",
            ComputeBackend::CudaF32Gemm => "cuda-fp32",
            ComputeBackend::CudaBf16Gemm => "cuda-bf16",
        }
    }

    pub fn parse(s: &str) -> Option<ComputeBackend> {
        [ComputeBackend::Cpu, ComputeBackend::CudaF32Gemm, ComputeBackend::CudaBf16Gemm]
            .into_iter()
            .find(|b| b.name() == s)
    }
}

/// The inner optimizer. Each keeps two fp32 moments per parameter (Muon
/// its momentum in the first), and Muon a step's scratch besides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InnerOptimizer {
    AdamW,
    NAdam,
    Muon,
}

impl InnerOptimizer {
    /// What a run's optimizer settings keep per weight (NAdam counts as
    /// AdamW: the same two moments).
    pub fn of(settings: &crate::train_config::AdamWConfig) -> InnerOptimizer {
        if settings.muon { InnerOptimizer::Muon } else { InnerOptimizer::AdamW }
    }

    pub fn moments(self) -> u64 {
        match self {
            InnerOptimizer::AdamW | InnerOptimizer::NAdam | InnerOptimizer::Muon => 2,
        }
    }

    /// fp32 values of scratch one optimizer step allocates at its peak:
    /// for Muon, three copies of the largest matrix it updates and two
    /// Gram matrices of its smaller side (`optim::newton_schulz`).
    pub fn step_scratch(self, layout: &ParamLayout) -> u64 {
        if self != InnerOptimizer::Muon {
            return 0;
        }
        layout
            .entries
            .iter()
            .filter(|e| e.takes_muon())
            .map(|e| {
                let k = e.shape[0].min(e.shape[1]) as u64;
                3 * e.len() as u64 + 2 * k * k
            })
            .max()
            .unwrap_or(0)
    }
}

/// How a stage is driven.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    /// Sequences per micro-batch.
    pub batch: usize,
    pub seq: usize,
    /// Micro-batches a head or body stage holds activations for at its peak
    /// (forwarded, backward not yet done). A tail (or whole-model) stage runs
    /// forward and backward at once and holds one, whatever this says.
    pub in_flight: usize,
    /// `Stage::set_weight_stashing` (on by default).
    pub weight_stashing: bool,
    pub optimizer: InnerOptimizer,
    pub backend: ComputeBackend,
    /// Activation recomputation (`Stage::set_recompute`): a held
    /// micro-batch keeps each block's input residual only, and the backward
    /// makes one block's activations at a time again.
    pub recompute: bool,
    /// Fused attention (`CudaBackend` with `IOTA_FLASH_ATTENTION=1`): a
    /// block saves a log-sum-exp per (sequence, head, query) instead of the
    /// `[batch, heads, seq, seq]` probabilities, and the backward has no
    /// score scratch. Only on CUDA backends.
    pub fused_attention: bool,
}

impl Workload {
    /// `batch` x `seq` micro-batches, `in_flight` held, on `backend`, as
    /// miners run by default: weight stashing on, AdamW (NAdam keeps the
    /// same moments).
    pub fn of(backend: ComputeBackend, batch: usize, seq: usize, in_flight: usize) -> Workload {
        Workload {
            batch,
            seq,
            in_flight,
            weight_stashing: true,
            optimizer: InnerOptimizer::AdamW,
            backend,
            recompute: false,
            fused_attention: false,
        }
    }

    /// The same with fused attention on or off (only a CUDA backend has it).
    pub fn fusing(self, on: bool) -> Workload {
        Workload { fused_attention: on && self.backend.is_cuda(), ..self }
    }

    /// The same with activation recomputation on or off.
    pub fn recomputing(self, on: bool) -> Workload {
        Workload { recompute: on, ..self }
    }
}

/// One stage's memory, by what holds it, in bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct StageMemory {
    pub index: usize,
    pub role: StageRole,
    pub params: usize,
    /// Micro-batches whose activations are held at the peak.
    pub held_micro_batches: usize,
    /// Older weight versions kept for micro-batches in flight.
    pub stashed_versions: usize,
    /// fp32 master weights.
    pub weights: u64,
    /// fp32 accumulated gradients.
    pub grads: u64,
    /// The optimizer's moments.
    pub optimizer_state: u64,
    pub weight_stashes: u64,
    /// bf16 casts of the largest GEMM operands (grow-only scratch).
    pub bf16_operands: u64,
    /// bf16 copies of the GEMM weights (and of whole stashes), up to
    /// `BF16_WEIGHT_COPIES_LIMIT`.
    pub bf16_weight_copies: u64,
    /// bf16 copies of the saved activations the backward's GEMMs read
    /// (every micro-batch held), up to `BF16_ACTIVATION_COPIES_LIMIT`.
    pub bf16_activation_copies: u64,
    /// Attention's bf16 operands: Q|K|V, the probabilities, the output
    /// gradient and the score gradients of one sequence (grow-only scratch).
    pub bf16_attention: u64,
    /// RoPE tables (one sequence length).
    pub rope_tables: u64,
    /// The cuBLASLt workspace and the CUDA driver allowance.
    pub runtime: u64,
    /// Saved activations of one micro-batch.
    pub activations_per_micro_batch: u64,
    /// Of which the attention probabilities `[batch, heads, seq, seq]`.
    pub attention_probs_per_micro_batch: u64,
    /// The largest set of temporaries alive at once beyond the held
    /// activations: the loss's logits chunk and its companions at the tail,
    /// a block's backward, or the forward's output.
    pub workspace: u64,
    pub workspace_is_loss: bool,
}

impl StageMemory {
    pub fn saved_activations(&self) -> u64 {
        self.activations_per_micro_batch * self.held_micro_batches as u64
    }

    /// The stage's peak: training, or a merge's reload, whichever is higher.
    pub fn peak(&self) -> u64 {
        self.training_peak().max(self.reload_peak())
    }

    /// Everything alive at the peak of a forward or backward (the sum of
    /// `lines`).
    pub fn training_peak(&self) -> u64 {
        self.static_bytes() + self.weight_stashes + self.saved_activations() + self.workspace
    }

    /// Loading merged weights (`Stage::set_params` after a merge) uploads
    /// them before the old ones are freed, between epochs: nothing is in
    /// flight then, so no activations and no stashes.
    pub fn reload_peak(&self) -> u64 {
        self.static_bytes() + self.weights
    }

    /// What stays allocated between micro-batches (a tail holds no
    /// activations then; a head or body stage still holds its in-flight ones).
    pub fn between_micro_batches(&self) -> u64 {
        let held = match self.role {
            StageRole::Head | StageRole::Body => self.saved_activations(),
            StageRole::Tail | StageRole::Whole => 0,
        };
        self.static_bytes() + self.weight_stashes + held
    }

    /// Allocated for as long as the stage exists.
    fn static_bytes(&self) -> u64 {
        self.weights
            + self.grads
            + self.optimizer_state
            + self.bf16_operands
            + self.bf16_weight_copies
            + self.bf16_activation_copies
            + self.bf16_attention
            + self.rope_tables
            + self.runtime
    }

    /// The bf16 copies of weights and activations: a cache that takes what
    /// the card has left (`copy_limits`), so whether a stage fits is decided
    /// without them.
    pub fn optional_copies(&self) -> u64 {
        self.bf16_weight_copies + self.bf16_activation_copies
    }

    /// The peak without the optional copies: what a card must hold.
    pub fn required_peak(&self) -> u64 {
        self.peak() - self.optional_copies()
    }

    /// Byte limits for the weights' and the activations' bf16 copies on a
    /// card of `card_bytes`: each up to its planned size, the weights' first
    /// (one copy saves a cast in every forward and backward), within what
    /// the required peak leaves of the usable memory.
    pub fn copy_limits(&self, card_bytes: u64) -> (u64, u64) {
        let usable = (card_bytes as f64 * (1.0 - FIT_RESERVE)) as u64;
        let headroom = usable.saturating_sub(self.required_peak());
        let weights = self.bf16_weight_copies.min(headroom);
        (weights, self.bf16_activation_copies.min(headroom - weights))
    }

    /// Whether the required peak fits a card of `card_bytes` with
    /// `FIT_RESERVE` of it left free.
    pub fn fits(&self, card_bytes: u64) -> bool {
        self.required_peak() as f64 <= card_bytes as f64 * (1.0 - FIT_RESERVE)
    }

    /// The breakdown of `training_peak` as printable lines (the same labels
    /// for every stage; the counts are `held_micro_batches` and
    /// `stashed_versions`).
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        let mut v = vec![
            ("weights (fp32)", self.weights),
            ("gradients (fp32)", self.grads),
            ("optimizer moments (2 x fp32), step scratch", self.optimizer_state),
            ("weight stashes (fp32 copies)", self.weight_stashes),
            ("bf16 GEMM operand copies", self.bf16_operands),
            ("bf16 weight copies", self.bf16_weight_copies),
            ("bf16 activation copies", self.bf16_activation_copies),
            ("bf16 attention operands", self.bf16_attention),
            ("RoPE table", self.rope_tables),
            ("CUDA runtime (allowance + cuBLASLt)", self.runtime),
            ("saved activations (micro-batches held)", self.saved_activations()),
        ];
        let what = if self.workspace_is_loss { "loss workspace (logits chunk)" } else { "backward workspace" };
        v.push((what, self.workspace));
        v
    }
}

/// f32 values of one micro-batch's `Saved` (what `Stage::forward` keeps).
struct SavedValues {
    total: usize,
    probs: usize,
}

/// What attention saves per block: the probabilities [batch, heads, seq,
/// seq], or fused, a log-sum-exp per (sequence, head, query).
fn attention_saved(cfg: &ModelConfig, batch: usize, seq: usize, fused: bool) -> usize {
    if fused { batch * cfg.n_heads * seq } else { batch * cfg.n_heads * seq * seq }
}

/// f32 values of one block's `BlockActs`: x, xn1, x2, xn2 [n, d]; rstd1,
/// rstd2 [n]; qkv; what attention saves; att [n, q_dim]; gu [n, 2f]; m [n, f].
fn block_values(cfg: &ModelConfig, batch: usize, seq: usize, fused: bool) -> usize {
    let n = batch * seq;
    let (d, f) = (cfg.d_model, cfg.ffn_hidden);
    let saved = attention_saved(cfg, batch, seq, fused);
    4 * n * d + 2 * n + n * cfg.qkv_dim() + saved + n * cfg.q_dim() + 2 * n * f + n * f
}

fn saved_values(
    cfg: &ModelConfig,
    spec: &StageSpec,
    batch: usize,
    seq: usize,
    tokens_on_device: bool,
    (recompute, fused): (bool, bool),
) -> SavedValues {
    let n = batch * seq;
    let (d, b) = (cfg.d_model, cfg.bottleneck);
    // Recomputing: each block's input residual [n, d] only.
    let (block, probs) = if recompute {
        (n * d, 0)
    } else {
        (block_values(cfg, batch, seq, fused), attention_saved(cfg, batch, seq, fused))
    };
    let mut total = spec.layers.len() * block + n * d; // + h_out
    // The residual style's SwiGLU branches (`boundary.rs`): MlpActs gu [n, 2r], m [n, r].
    let branch = if cfg.bottleneck_style == BottleneckStyle::Residual { 3 * n * cfg.bottleneck_hidden() } else { 0 };
    if spec.decode_in {
        total += n * b + branch; // DecodeActs: z, its branch
    }
    if spec.encode_out {
        total += n * d + n + branch; // EncodeActs: hn, rstd, its branch
    }
    if spec.has_embedding() && tokens_on_device {
        total += n; // the token ids (u32, host memory, so only where host is the device)
    }
    SavedValues { total, probs: spec.layers.len() * probs }
}

/// f32 values alive at once in the worst phase of `block_backward`, besides
/// the incoming residual gradient.
fn block_backward_values(cfg: &ModelConfig, batch: usize, seq: usize, backend: ComputeBackend, fused: bool) -> usize {
    let n = batch * seq;
    let (d, f) = (cfg.d_model, cfg.ffn_hidden);
    // MLP: dm [n, f] and dgu [n, 2f] together, then dgu and dxn [n, d].
    let mlp = (n * f + 2 * n * f).max(2 * n * f + n * d);
    // Attention: dxn, datt [n, q_dim], dqkv, and the backend's score scratch
    // (CUDA: [kv_heads, seq, seq] per sequence; CPU: [seq, seq] per task,
    // counted once: one task per thread; fused: the row terms
    // [batch, heads, seq]).
    let scores = match (backend.is_cuda(), fused) {
        (true, true) => batch * cfg.n_heads * seq,
        (true, false) => cfg.n_kv_heads * seq * seq,
        (false, _) => seq * seq,
    };
    let attn = n * d + n * cfg.q_dim() + n * cfg.qkv_dim() + scores;
    mlp.max(attn)
}

/// f32 values alive at once in the worst phase of the bottleneck's backward
/// (`boundary.rs`), besides the residual gradient and the kept output
/// gradient: the encoder's dhn [n, d], and with the residual style a branch's
/// dm [n, r] and dgu [n, 2r] (the decoder's come with its dz [n, b]).
fn boundary_backward_values(cfg: &ModelConfig, spec: &StageSpec, n: usize) -> usize {
    let branch = if cfg.bottleneck_style == BottleneckStyle::Residual { 3 * n * cfg.bottleneck_hidden() } else { 0 };
    let encoder = if spec.encode_out { n * cfg.d_model + branch } else { 0 };
    let decoder = if spec.decode_in { n * cfg.bottleneck + branch } else { 0 };
    encoder.max(decoder)
}

/// f32 values of the largest "a" and "b" operands of a stage's linear GEMMs,
/// as the bf16 GEMM path casts them (`CudaBackend::linear_gemm`: a = the
/// weight, or the input of a weight gradient; b = the activation input or
/// output gradient).
pub fn gemm_operand_values(cfg: &ModelConfig, spec: &StageSpec, batch: usize, seq: usize) -> (usize, usize) {
    let n = batch * seq;
    let (d, f, bw, v) = (cfg.d_model, cfg.ffn_hidden, cfg.bottleneck, cfg.vocab_size);
    let (qd, qkvd) = (cfg.q_dim(), cfg.qkv_dim());
    let mut a = [qkvd * d, d * qd, 2 * f * d, d * f, n * f, n * d, n * qd].into_iter().max().unwrap_or(0);
    let mut b = [n * d, n * qd, n * f, 2 * n * f, n * qkvd].into_iter().max().unwrap_or(0);
    if spec.decode_in || spec.encode_out {
        a = a.max(d * bw).max(n * bw).max(n * d);
        b = b.max(n * bw).max(n * d);
        if cfg.bottleneck_style == BottleneckStyle::Residual {
            // The branches: [2r, d] and [2r, b] gate|up, [b, r] and [d, r]
            // down; their weight gradients read m [n, r]; gu's gradient is [n, 2r].
            let r = cfg.bottleneck_hidden();
            a = a.max(2 * r * d).max(2 * r * bw).max(d * r).max(n * r);
            b = b.max(2 * n * r);
        }
    }
    if spec.has_lm_head() {
        let rows = logit_rows_per_chunk(n, v);
        a = a.max(v * d).max(rows * d);
        b = b.max(rows * d).max(rows * v);
    }
    (a, b)
}

/// Rows of logits the LM head computes at once (`lm_head::rows_per_chunk`).
pub fn logit_rows_per_chunk(n: usize, vocab: usize) -> usize {
    (LOGIT_BUDGET / vocab.max(1)).clamp(1, n.max(1))
}

/// The memory of one stage of `cfg` split as `spec` under workload `w`.
pub fn stage_memory(cfg: &ModelConfig, spec: &StageSpec, w: &Workload) -> StageMemory {
    const F32: u64 = 4;
    let params = ParamLayout::for_stage(cfg, spec).total();
    let p = params as u64;
    let role = spec.role();
    let (n, d) = (w.batch * w.seq, cfg.d_model);
    let tail = spec.has_lm_head();
    let held = if tail { 1 } else { w.in_flight.max(1) };
    // A step stashes the current weights while a micro-batch forwarded with
    // them is in flight. It comes right after a backward, so at most the
    // other held - 1 micro-batches are on older versions; the tail holds
    // none across a step.
    let stashed = if w.weight_stashing && !tail { held - 1 } else { 0 };
    let fused = w.fused_attention && w.backend.is_cuda();
    let saved = saved_values(cfg, spec, w.batch, w.seq, !w.backend.is_cuda(), (w.recompute, fused));
    let out_width = if spec.encode_out { cfg.bottleneck } else { d };
    // The backward's residual gradient, a block's worst phase, and past an
    // encoder the output gradient it came from (`backward_buf` keeps it
    // until it returns; without an encoder it becomes the residual gradient).
    let kept_output_grad = if spec.encode_out { n * cfg.bottleneck } else { 0 };
    // Recomputing, a block's activations are made again beside its
    // backward's temporaries (all but its input, which is among the held).
    let recomputed =
        if w.recompute && !spec.layers.is_empty() { block_values(cfg, w.batch, w.seq, fused) - n * d } else { 0 };
    let backward = n * d
        + kept_output_grad
        + (recomputed + block_backward_values(cfg, w.batch, w.seq, w.backend, fused))
            .max(boundary_backward_values(cfg, spec, n));
    // The tail's loss: hn, dhn and dh [n, d], rstd [n], one logits chunk.
    let loss = 3 * n * d + n + logit_rows_per_chunk(n, cfg.vocab_size) * cfg.vocab_size;
    // A forward's transient beyond what it saves is its output.
    let forward = n * out_width;
    let workspace_is_loss = tail && loss > backward;
    let workspace = if tail { loss.max(backward) } else { backward.max(forward) };
    let bf16_operands = match w.backend {
        ComputeBackend::CudaBf16Gemm => {
            let (a, b) = gemm_operand_values(cfg, spec, w.batch, w.seq);
            2 * (a + b) as u64
        }
        _ => 0,
    };
    let (bf16_weight_copies, bf16_attention) = match w.backend {
        ComputeBackend::CudaBf16Gemm => {
            let layout = ParamLayout::for_stage(cfg, spec);
            let gemm_weights: usize = layout
                .entries
                .iter()
                .filter(|e| e.shape.len() == 2 && e.name != "model.embed_tokens.weight")
                .map(|e| e.len())
                .sum();
            // A whole stash takes the weights' place for its backward, so
            // its GEMMs cast from its own addresses; a lean one (a
            // recomputing head) is swapped into the weights' buffer: no
            // copies of its own.
            let lean = w.recompute && spec.has_embedding();
            let versions = if lean { 1 } else { 1 + stashed as u64 };
            let copies = (2 * gemm_weights as u64 * versions).min(BF16_WEIGHT_COPIES_LIMIT);
            let (t, kv) = (w.seq, cfg.n_kv_heads);
            let attention = if spec.layers.is_empty() {
                0
            } else if fused {
                // The fused kernels read Q|K|V's bf16 copy (scratch where
                // not kept) and cast nothing else.
                n * cfg.qkv_dim()
            } else {
                n * cfg.qkv_dim() + w.batch * cfg.n_heads * t * t + n * cfg.q_dim() + kv * t * t
            };
            (copies, 2 * attention as u64)
        }
        _ => (0, 0),
    };
    // Per block: the inputs of its four GEMMs (xn1, att, xn2, m), Q|K|V and
    // the probabilities.
    let bf16_activation_copies = match w.backend {
        ComputeBackend::CudaBf16Gemm => {
            let t = w.seq;
            let probs = if fused { 0 } else { w.batch * cfg.n_heads * t * t };
            let block = 2 * n * d + n * cfg.q_dim() + n * cfg.ffn_hidden + n * cfg.qkv_dim() + probs;
            if w.recompute {
                // Made again with each block's recomputed activations, and
                // read by its backward right after: one block's worth.
                (2 * block as u64).min(BF16_ACTIVATION_COPIES_LIMIT)
            } else {
                let per_micro_batch = 2 * (spec.layers.len() * block) as u64;
                (per_micro_batch * held as u64).min(BF16_ACTIVATION_COPIES_LIMIT)
            }
        }
        _ => 0,
    };
    let runtime = match w.backend {
        ComputeBackend::Cpu => 0,
        ComputeBackend::CudaF32Gemm => CUDA_RUNTIME_ALLOWANCE,
        ComputeBackend::CudaBf16Gemm => CUDA_RUNTIME_ALLOWANCE + CUBLASLT_WORKSPACE,
    };
    StageMemory {
        index: spec.index,
        role,
        params,
        held_micro_batches: held,
        stashed_versions: stashed,
        weights: F32 * p,
        grads: F32 * p,
        optimizer_state: F32
            * (p * w.optimizer.moments() + w.optimizer.step_scratch(&ParamLayout::for_stage(cfg, spec))),
        weight_stashes: F32 * stashed_params(cfg, spec, w.recompute) * stashed as u64,
        bf16_operands,
        bf16_weight_copies,
        bf16_activation_copies,
        bf16_attention,
        rope_tables: F32 * (w.seq * cfg.head_dim()) as u64,
        runtime,
        activations_per_micro_batch: F32 * saved.total as u64,
        attention_probs_per_micro_batch: F32 * saved.probs as u64,
        workspace: F32 * workspace as u64,
        workspace_is_loss,
    }
}

/// Parameters a weight stash keeps: all, or recomputing, all but a head's
/// embedding table, which no backward reads (`Stage::set_recompute`).
fn stashed_params(cfg: &ModelConfig, spec: &StageSpec, recompute: bool) -> u64 {
    let all = ParamLayout::for_stage(cfg, spec).total() as u64;
    if recompute && spec.has_embedding() { all - (cfg.vocab_size * cfg.d_model) as u64 } else { all }
}

/// Every stage of `cfg` split into `stages`.
pub fn plan_memory(cfg: &ModelConfig, stages: usize, w: &Workload) -> Result<Vec<StageMemory>, ConfigError> {
    Ok(StageSpec::split(cfg, stages)?.iter().map(|s| stage_memory(cfg, s, w)).collect())
}

/// A miner's host memory beyond its stage (the same on every backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// The receive pool's budget.
    pub receive_pool: u64,
    /// The evidence log's budgets (weights snapshots, received frames).
    pub evidence_log: u64,
    /// The butterfly merge's vectors at their peak (merging).
    pub merge: u64,
}

impl HostMemory {
    pub fn total(&self) -> u64 {
        self.receive_pool + self.evidence_log + self.merge
    }
}

/// Bytes of `values` values encoded as the merge encodes a slice: blocks
/// of `BLOCK` values, each a row of the codec (`encode_slice`).
pub fn merge_encoded_bytes(values: f64, codec: WireCodec) -> f64 {
    values / BLOCK as f64 * codec.row_bytes(BLOCK as usize) as f64
}

/// Host memory of a miner holding a stage of `params` values merged over
/// `replicas` replicas with `merge_codec` (`dataplane/src/miner/merge/butterfly/`).
pub fn host_memory(params: usize, replicas: usize, merge_codec: WireCodec) -> HostMemory {
    let p = params as f64;
    let r = replicas.max(1) as f64;
    let merge = if replicas < 2 {
        0.0
    } else {
        // A replica owns 2P/R values (two owners per partition).
        let owned = 2.0 * p / r;
        // theta_prev, delta, theta_next and the finished copy (`merged`).
        let vectors = 4.0 * 4.0 * p;
        // Its own encoded contribution (every partition), the other
        // replicas' contributions to the partitions it owns, its encoded
        // results, and the updates it receives for the others.
        let encoded = merge_encoded_bytes(p + (r - 1.0) * owned + owned + (p - owned), merge_codec);
        // Outer momentum of its partitions, read and kept with each result.
        let momentum = 2.0 * 4.0 * owned;
        vectors + encoded + momentum
    };
    HostMemory {
        receive_pool: RECEIVE_POOL_BYTES,
        evidence_log: EVIDENCE_WEIGHTS_BYTES + EVIDENCE_WEIGHTS_BYTES / 4,
        merge: merge.round() as u64,
    }
}

#[cfg(test)]
#[path = "memory_plan_tests.rs"]
mod tests;
