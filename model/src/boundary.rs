//! The bottleneck at a stage boundary.
//!
//! Encoder (last block of a non-tail stage): `z = h[:, :b] + rmsnorm(h) @ W_down^T`
//! keeps b of the d residual channels as an identity path (so gradients flow
//! even at initialisation) and adds a learned d->b projection of the
//! normalised residual.
//! Decoder (first block of the next stage): `h0 = pad(z) + z @ W_up^T`
//! puts the b channels back in place and adds a learned b->d expansion.
//! Only z (b values per token, then quantised) crosses the wire.

use std::ops::Range;

use iota_core::ParamLayout;

use crate::backend::Backend;
use crate::block::Ctx;

#[derive(Clone, Debug)]
pub struct EncodeIdx {
    pub norm: Range<usize>,
    pub down: Range<usize>,
}

impl EncodeIdx {
    pub fn new(layout: &ParamLayout, layer: usize) -> Self {
        let p = format!("model.layers.{layer}.bottleneck");
        EncodeIdx {
            norm: layout.range(&format!("{p}.norm.weight")),
            down: layout.range(&format!("{p}.down_proj.weight")),
        }
    }
}

pub fn decode_up_range(layout: &ParamLayout, layer: usize) -> Range<usize> {
    layout.range(&format!("model.layers.{layer}.bottleneck.up_proj.weight"))
}

/// z `[n, b]` -> h0 `[n, d]`.
pub fn decode_forward<B: Backend>(c: &Ctx<B>, up: &Range<usize>, z: &B::Buf) -> B::Buf {
    let be = c.be;
    let (n, d, b) = (c.n(), c.cfg.d_model, c.cfg.bottleneck);
    let mut h = be.zeros(n * d);
    be.scatter_cols(be.all_mut(&mut h), be.all(z), n, d, b, false);
    be.matmul(be.all_mut(&mut h), be.all(z), c.p(up), n, b, d, true);
    h
}

/// d(loss)/dh0 -> d(loss)/dz; accumulates dW_up.
pub fn decode_backward<B: Backend>(
    c: &Ctx<B>,
    up: &Range<usize>,
    z: &B::Buf,
    dh: &B::Buf,
    grads: &mut B::Buf,
) -> B::Buf {
    let be = c.be;
    let (n, d, b) = (c.n(), c.cfg.d_model, c.cfg.bottleneck);
    let mut dz = be.zeros(n * b);
    be.gather_cols(be.all_mut(&mut dz), be.all(dh), n, d, b, false);
    be.matmul_bwd_input(be.all_mut(&mut dz), be.all(dh), c.p(up), n, b, d, true);
    be.matmul_bwd_weight(be.view_mut(grads, up.clone()), be.all(dh), be.all(z), n, b, d);
    dz
}

pub struct EncodeActs<B: Backend> {
    hn: B::Buf,
    rstd: B::Buf,
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
    (EncodeActs { hn, rstd }, z)
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
