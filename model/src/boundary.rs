//! The bottleneck at a stage boundary, in its two styles
//! (`iota_core::BottleneckStyle`).
//!
//! Linear (the default):
//! - encoder (last block of a non-tail stage): `z = h[:, :b] + rmsnorm(h) @ W_down^T`
//!   keeps b of the d residual channels as an identity path (so gradients
//!   flow even at initialisation) and adds a learned d->b projection of the
//!   normalised residual;
//! - decoder (first block of the next stage): `h0 = pad(z) + z @ W_up^T`
//!   puts the b channels back in place and adds a learned b->d expansion.
//!
//! Residual (ResBM-style): the same identity path and linear projections,
//! plus a SwiGLU branch on each side, `r = bottleneck_hidden()` wide:
//! - encoder: `z = h[:, :b] + hn @ W_down^T + swiglu(hn @ W_eg^T, hn @ W_eu^T) @ W_eo^T`,
//!   `hn = rmsnorm(h)`;
//! - decoder: `h0 = pad(z) + z @ W_up^T + swiglu(z @ W_dg^T, z @ W_du^T) @ W_do^T`.
//!
//! With `W_eo = W_do = 0` the residual style computes exactly the linear
//! one. Both are written with the generic `Backend` ops (GEMM, RMSNorm,
//! SwiGLU, column gather/scatter), so every backend runs them.
//! Only z (b values per token, then quantised) crosses the wire.

use std::ops::Range;

use iota_core::ParamLayout;

use crate::backend::Backend;
use crate::block::Ctx;

/// A SwiGLU branch: `swiglu(x @ [W_g; W_u]^T) @ W_o^T`.
#[derive(Clone, Debug)]
pub struct MlpIdx {
    /// gate|up as one `[2r, in]` matrix.
    pub gate_up: Range<usize>,
    /// `[out, r]`.
    pub down: Range<usize>,
}

impl MlpIdx {
    /// The branch `{prefix}.{gate,up,down}_proj.weight`, if the layout has one.
    fn find(layout: &ParamLayout, prefix: &str) -> Option<MlpIdx> {
        let gate = layout.get(&format!("{prefix}.gate_proj.weight"))?;
        Some(MlpIdx {
            gate_up: gate.offset..layout.range(&format!("{prefix}.up_proj.weight")).end,
            down: layout.range(&format!("{prefix}.down_proj.weight")),
        })
    }
}

/// What a SwiGLU branch's backward needs: its pre-activations and output.
pub struct MlpActs<B: Backend> {
    gu: B::Buf,
    m: B::Buf,
}

/// out `[n, o]` += swiglu(x `[n, i]` @ gate_up^T) @ down^T.
fn mlp_forward<B: Backend>(c: &Ctx<B>, idx: &MlpIdx, x: &B::Buf, out: &mut B::Buf, i: usize, o: usize) -> MlpActs<B> {
    let be = c.be;
    let (n, r) = (c.n(), c.cfg.bottleneck_hidden());
    let mut gu = be.zeros(n * 2 * r);
    be.matmul(be.all_mut(&mut gu), be.all(x), c.p(&idx.gate_up), n, i, 2 * r, false);
    let mut m = be.zeros(n * r);
    be.swiglu(be.all_mut(&mut m), be.all(&gu), n, r);
    be.matmul(be.all_mut(out), be.all(&m), c.p(&idx.down), n, r, o, true);
    MlpActs { gu, m }
}

/// dx `[n, i]` += d(loss)/dx given dout `[n, o]`; accumulates the branch's
/// weight gradients.
#[allow(clippy::too_many_arguments)]
fn mlp_backward<B: Backend>(
    c: &Ctx<B>,
    idx: &MlpIdx,
    a: &MlpActs<B>,
    x: &B::Buf,
    dout: &B::Buf,
    dx: &mut B::Buf,
    grads: &mut B::Buf,
    i: usize,
    o: usize,
) {
    let be = c.be;
    let (n, r) = (c.n(), c.cfg.bottleneck_hidden());
    let mut dm = be.zeros(n * r);
    be.matmul_bwd_input(be.all_mut(&mut dm), be.all(dout), c.p(&idx.down), n, r, o, false);
    be.matmul_bwd_weight(be.view_mut(grads, idx.down.clone()), be.all(dout), be.all(&a.m), n, r, o);
    let mut dgu = be.zeros(n * 2 * r);
    be.swiglu_bwd(be.all_mut(&mut dgu), be.all(&dm), be.all(&a.gu), n, r);
    drop(dm);
    be.matmul_bwd_input(be.all_mut(dx), be.all(&dgu), c.p(&idx.gate_up), n, i, 2 * r, true);
    be.matmul_bwd_weight(be.view_mut(grads, idx.gate_up.clone()), be.all(&dgu), be.all(x), n, i, 2 * r);
}

/// The decoder's tensors (first block of a non-head stage).
#[derive(Clone, Debug)]
pub struct DecodeIdx {
    pub up: Range<usize>,
    /// The residual style's SwiGLU branch.
    pub mlp: Option<MlpIdx>,
}

impl DecodeIdx {
    pub fn new(layout: &ParamLayout, layer: usize) -> Self {
        let p = format!("model.layers.{layer}.bottleneck");
        DecodeIdx {
            up: layout.range(&format!("{p}.up_proj.weight")),
            mlp: MlpIdx::find(layout, &format!("{p}.decoder_mlp")),
        }
    }
}

/// What the decoder's backward needs: its input and its branch's activations.
pub struct DecodeActs<B: Backend> {
    z: B::Buf,
    mlp: Option<MlpActs<B>>,
}

/// z `[n, b]` -> h0 `[n, d]` (z is kept for the backward).
pub fn decode_forward<B: Backend>(c: &Ctx<B>, idx: &DecodeIdx, z: B::Buf) -> (DecodeActs<B>, B::Buf) {
    let be = c.be;
    let (n, d, b) = (c.n(), c.cfg.d_model, c.cfg.bottleneck);
    let mut h = be.zeros(n * d);
    be.scatter_cols(be.all_mut(&mut h), be.all(&z), n, d, b, false);
    be.matmul(be.all_mut(&mut h), be.all(&z), c.p(&idx.up), n, b, d, true);
    let mlp = idx.mlp.as_ref().map(|m| mlp_forward(c, m, &z, &mut h, b, d));
    (DecodeActs { z, mlp }, h)
}

/// d(loss)/dh0 -> d(loss)/dz; accumulates the decoder's gradients.
pub fn decode_backward<B: Backend>(
    c: &Ctx<B>,
    idx: &DecodeIdx,
    a: &DecodeActs<B>,
    dh: &B::Buf,
    grads: &mut B::Buf,
) -> B::Buf {
    let be = c.be;
    let (n, d, b) = (c.n(), c.cfg.d_model, c.cfg.bottleneck);
    let mut dz = be.zeros(n * b);
    be.gather_cols(be.all_mut(&mut dz), be.all(dh), n, d, b, false);
    be.matmul_bwd_input(be.all_mut(&mut dz), be.all(dh), c.p(&idx.up), n, b, d, true);
    be.matmul_bwd_weight(be.view_mut(grads, idx.up.clone()), be.all(dh), be.all(&a.z), n, b, d);
    if let (Some(m), Some(acts)) = (&idx.mlp, &a.mlp) {
        mlp_backward(c, m, acts, &a.z, dh, &mut dz, grads, b, d);
    }
    dz
}

/// The encoder's tensors (last block of a non-tail stage).
#[derive(Clone, Debug)]
pub struct EncodeIdx {
    pub norm: Range<usize>,
    pub down: Range<usize>,
    /// The residual style's SwiGLU branch.
    pub mlp: Option<MlpIdx>,
}

impl EncodeIdx {
    pub fn new(layout: &ParamLayout, layer: usize) -> Self {
        let p = format!("model.layers.{layer}.bottleneck");
        EncodeIdx {
            norm: layout.range(&format!("{p}.norm.weight")),
            down: layout.range(&format!("{p}.down_proj.weight")),
            mlp: MlpIdx::find(layout, &format!("{p}.encoder_mlp")),
        }
    }
}

pub struct EncodeActs<B: Backend> {
    hn: B::Buf,
    rstd: B::Buf,
    mlp: Option<MlpActs<B>>,
}

/// h `[n, d]` -> z `[n, b]`.
pub fn encode_forward<B: Backend>(c: &Ctx<B>, idx: &EncodeIdx, h: &B::Buf) -> (EncodeActs<B>, B::Buf) {
    let be = c.be;
    let (n, d, b) = (c.n(), c.cfg.d_model, c.cfg.bottleneck);
    let mut hn = be.zeros(n * d);
    let mut rstd = be.zeros(n);
    be.rmsnorm(be.all_mut(&mut hn), be.all_mut(&mut rstd), be.all(h), c.p(&idx.norm), n, d, c.cfg.norm_eps);
    let mut z = be.zeros(n * b);
    be.gather_cols(be.all_mut(&mut z), be.all(h), n, d, b, false);
    be.matmul(be.all_mut(&mut z), be.all(&hn), c.p(&idx.down), n, d, b, true);
    let mlp = idx.mlp.as_ref().map(|m| mlp_forward(c, m, &hn, &mut z, d, b));
    (EncodeActs { hn, rstd, mlp }, z)
}

/// d(loss)/dz -> d(loss)/dh; accumulates the encoder's gradients.
pub fn encode_backward<B: Backend>(
    c: &Ctx<B>,
    idx: &EncodeIdx,
    a: &EncodeActs<B>,
    h: &B::Buf,
    dz: &B::Buf,
    grads: &mut B::Buf,
) -> B::Buf {
    let be = c.be;
    let (n, d, b) = (c.n(), c.cfg.d_model, c.cfg.bottleneck);
    let mut dh = be.zeros(n * d);
    be.scatter_cols(be.all_mut(&mut dh), be.all(dz), n, d, b, false);
    let mut dhn = be.zeros(n * d);
    be.matmul_bwd_input(be.all_mut(&mut dhn), be.all(dz), c.p(&idx.down), n, d, b, false);
    be.matmul_bwd_weight(be.view_mut(grads, idx.down.clone()), be.all(dz), be.all(&a.hn), n, d, b);
    if let (Some(m), Some(acts)) = (&idx.mlp, &a.mlp) {
        mlp_backward(c, m, acts, &a.hn, dz, &mut dhn, grads, d, b);
    }
    be.rmsnorm_bwd(
        be.all_mut(&mut dh),
        be.view_mut(grads, idx.norm.clone()),
        be.all(&dhn),
        be.all(h),
        c.p(&idx.norm),
        be.all(&a.rstd),
        n,
        d,
    );
    dh
}
