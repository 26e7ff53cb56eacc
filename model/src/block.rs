//! Forward and backward of the pieces a stage is made of: a Llama block, the
//! bottleneck decoder/encoder at stage boundaries, and the LM head with its
//! loss. Each forward returns the activations its backward needs.

use std::ops::Range;

use iota_core::{ModelConfig, ParamLayout};

use crate::backend::{AttnDims, Backend};

/// Flat-buffer ranges of one block's tensors (fused where one GEMM reads them).
#[derive(Clone, Debug)]
pub struct LayerIdx {
    pub attn_norm: Range<usize>,
    /// q|k|v as one `[qkv_dim, d]` matrix.
    pub qkv: Range<usize>,
    pub o: Range<usize>,
    pub mlp_norm: Range<usize>,
    /// gate|up as one `[2f, d]` matrix.
    pub gate_up: Range<usize>,
    pub down: Range<usize>,
}

impl LayerIdx {
    pub fn new(layout: &ParamLayout, layer: usize) -> LayerIdx {
        let p = format!("model.layers.{layer}");
        let r = |s: &str| layout.range(&format!("{p}.{s}"));
        LayerIdx {
            attn_norm: r("input_layernorm.weight"),
            qkv: r("self_attn.q_proj.weight").start..r("self_attn.v_proj.weight").end,
            o: r("self_attn.o_proj.weight"),
            mlp_norm: r("post_attention_layernorm.weight"),
            gate_up: r("mlp.gate_proj.weight").start..r("mlp.up_proj.weight").end,
            down: r("mlp.down_proj.weight"),
        }
    }
}

/// Everything shared by the calls of one micro-batch.
pub struct Ctx<'a, B: Backend> {
    pub be: &'a B,
    pub cfg: &'a ModelConfig,
    pub params: &'a B::Buf,
    pub rope: &'a B::Buf,
    pub batch: usize,
    pub seq: usize,
}

impl<B: Backend> Ctx<'_, B> {
    pub fn n(&self) -> usize {
        self.batch * self.seq
    }
    pub fn attn(&self) -> AttnDims {
        AttnDims {
            batch: self.batch,
            seq: self.seq,
            n_heads: self.cfg.n_heads,
            n_kv_heads: self.cfg.n_kv_heads,
            head_dim: self.cfg.head_dim(),
        }
    }
    pub fn p(&self, r: &Range<usize>) -> B::Ref<'_> {
        self.be.view(self.params, r.clone())
    }
    fn copy_of(&self, x: &B::Buf) -> B::Buf {
        let mut y = self.be.empty(self.be.len(x));
        self.be.copy(self.be.all_mut(&mut y), self.be.all(x));
        y
    }
}

/// Saved activations of one block.
pub struct BlockActs<B: Backend> {
    x: B::Buf,
    xn1: B::Buf,
    rstd1: B::Buf,
    qkv: B::Buf,
    probs: B::Buf,
    att: B::Buf,
    x2: B::Buf,
    xn2: B::Buf,
    rstd2: B::Buf,
    gu: B::Buf,
    m: B::Buf,
}

impl<B: Backend> BlockActs<B> {
    /// The block's input residual, the rest dropped: all a recomputing
    /// stage keeps (`block_recompute` makes the rest again from it).
    pub fn into_input(self) -> B::Buf {
        self.x
    }
}

/// x -> x + attn(norm(x)) -> (+ mlp(norm(.))). Consumes the input residual
/// (kept for backward) and returns the output residual.
pub fn block_forward<B: Backend>(c: &Ctx<B>, li: &LayerIdx, x: B::Buf) -> (BlockActs<B>, B::Buf) {
    let a = block_recompute(c, li, x);
    let (n, d, f) = (c.n(), c.cfg.d_model, c.cfg.ffn_hidden);
    let mut x3 = c.copy_of(&a.x2);
    c.be.matmul(c.be.all_mut(&mut x3), c.be.all(&a.m), c.p(&li.down), n, f, d, true);
    (a, x3)
}

/// The activations `block_backward` reads, made from the block's input:
/// `block_forward` without its last GEMM, whose output the backward does
/// not read. A recomputing stage runs it again in the backward; on the
/// same backend and weights it gives the forward's bits.
pub fn block_recompute<B: Backend>(c: &Ctx<B>, li: &LayerIdx, x: B::Buf) -> BlockActs<B> {
    let be = c.be;
    let cfg = c.cfg;
    let (n, d, f) = (c.n(), cfg.d_model, cfg.ffn_hidden);
    let (qd, qkvd) = (cfg.q_dim(), cfg.qkv_dim());
    let mut xn1 = be.empty(n * d);
    let mut rstd1 = be.empty(n);
    be.rmsnorm(be.all_mut(&mut xn1), be.all_mut(&mut rstd1), be.all(&x), c.p(&li.attn_norm), n, d, cfg.norm_eps);
    let mut qkv = be.empty(n * qkvd);
    be.matmul(be.all_mut(&mut qkv), be.all(&xn1), c.p(&li.qkv), n, d, qkvd, false);
    // q and k heads are adjacent at the start of each row: rotate them together.
    let rot = cfg.n_heads + cfg.n_kv_heads;
    be.rope(be.all_mut(&mut qkv), be.all(c.rope), n, c.seq, qkvd, rot, cfg.head_dim(), false);
    let mut att = be.empty(n * qd);
    let mut probs = be.empty(be.attention_saved_len(c.attn()));
    be.attention(be.all_mut(&mut att), be.all_mut(&mut probs), be.all(&qkv), c.attn());
    let mut x2 = c.copy_of(&x);
    be.matmul(be.all_mut(&mut x2), be.all(&att), c.p(&li.o), n, qd, d, true);
    let mut xn2 = be.empty(n * d);
    let mut rstd2 = be.empty(n);
    be.rmsnorm(be.all_mut(&mut xn2), be.all_mut(&mut rstd2), be.all(&x2), c.p(&li.mlp_norm), n, d, cfg.norm_eps);
    let mut gu = be.empty(n * 2 * f);
    be.matmul(be.all_mut(&mut gu), be.all(&xn2), c.p(&li.gate_up), n, d, 2 * f, false);
    let mut m = be.empty(n * f);
    be.swiglu(be.all_mut(&mut m), be.all(&gu), n, f);
    BlockActs { x, xn1, rstd1, qkv, probs, att, x2, xn2, rstd2, gu, m }
}

/// Backward of one block. `dres` holds d(loss)/d(output residual) on entry
/// and d(loss)/d(input residual) on return. Parameter gradients accumulate
/// into `grads`.
pub fn block_backward<B: Backend>(c: &Ctx<B>, li: &LayerIdx, a: &BlockActs<B>, dres: &mut B::Buf, grads: &mut B::Buf) {
    let be = c.be;
    let cfg = c.cfg;
    let (n, d, f) = (c.n(), cfg.d_model, cfg.ffn_hidden);
    let (qd, qkvd) = (cfg.q_dim(), cfg.qkv_dim());
    // MLP
    let mut dm = be.empty(n * f);
    be.matmul_bwd_input(be.all_mut(&mut dm), be.all(dres), c.p(&li.down), n, f, d, false);
    be.matmul_bwd_weight(be.view_mut(grads, li.down.clone()), be.all(dres), be.all(&a.m), n, f, d);
    let mut dgu = be.empty(n * 2 * f);
    be.swiglu_bwd(be.all_mut(&mut dgu), be.all(&dm), be.all(&a.gu), n, f);
    drop(dm);
    let mut dxn = be.empty(n * d);
    be.matmul_bwd_input(be.all_mut(&mut dxn), be.all(&dgu), c.p(&li.gate_up), n, d, 2 * f, false);
    be.matmul_bwd_weight(be.view_mut(grads, li.gate_up.clone()), be.all(&dgu), be.all(&a.xn2), n, d, 2 * f);
    drop(dgu);
    be.rmsnorm_bwd(
        be.all_mut(dres),
        be.view_mut(grads, li.mlp_norm.clone()),
        be.all(&dxn),
        be.all(&a.x2),
        c.p(&li.mlp_norm),
        be.all(&a.rstd2),
        n,
        d,
    );
    // Attention
    let mut datt = be.empty(n * qd);
    be.matmul_bwd_input(be.all_mut(&mut datt), be.all(dres), c.p(&li.o), n, qd, d, false);
    be.matmul_bwd_weight(be.view_mut(grads, li.o.clone()), be.all(dres), be.all(&a.att), n, qd, d);
    let mut dqkv = be.empty(n * qkvd);
    be.attention_bwd(be.all_mut(&mut dqkv), be.all(&datt), be.all(&a.qkv), be.all(&a.att), be.all(&a.probs), c.attn());
    drop(datt);
    let rot = cfg.n_heads + cfg.n_kv_heads;
    be.rope(be.all_mut(&mut dqkv), be.all(c.rope), n, c.seq, qkvd, rot, cfg.head_dim(), true);
    be.matmul_bwd_input(be.all_mut(&mut dxn), be.all(&dqkv), c.p(&li.qkv), n, d, qkvd, false);
    be.matmul_bwd_weight(be.view_mut(grads, li.qkv.clone()), be.all(&dqkv), be.all(&a.xn1), n, d, qkvd);
    be.rmsnorm_bwd(
        be.all_mut(dres),
        be.view_mut(grads, li.attn_norm.clone()),
        be.all(&dxn),
        be.all(&a.x),
        c.p(&li.attn_norm),
        be.all(&a.rstd1),
        n,
        d,
    );
}
