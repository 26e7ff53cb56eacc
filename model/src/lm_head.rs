//! Final norm, LM head and the fused softmax-cross-entropy.
//!
//! The logits of a whole micro-batch can be large (rows x 50k vocabulary),
//! so rows are processed in chunks of at most `LOGIT_BUDGET` values: each
//! chunk's logits are turned into dlogits in place and consumed at once
//! (the loss is known right here, so the head's backward runs immediately).

use std::ops::Range;

use iota_core::ParamLayout;

use crate::backend::Backend;
use crate::block::Ctx;

/// Most logits held at once (f32 values), unless a stage is given another
/// budget (`Stage::set_logit_budget`).
pub const LOGIT_BUDGET: usize = 8 << 20;

#[derive(Clone, Debug)]
pub struct HeadIdx {
    pub norm: Range<usize>,
    pub lm: Range<usize>,
    /// Most logits held at once (f32 values; at least one row's).
    pub logit_budget: usize,
}

impl HeadIdx {
    pub fn new(layout: &ParamLayout) -> Self {
        HeadIdx {
            norm: layout.range("model.norm.weight"),
            lm: layout.range("lm_head.weight"),
            logit_budget: LOGIT_BUDGET,
        }
    }
}

/// Rows of logits computed at once under the default budget.
pub fn rows_per_chunk(n: usize, vocab: usize) -> usize {
    rows_per_chunk_within(n, vocab, LOGIT_BUDGET)
}

/// Rows of logits computed at once when at most `budget` values may be held.
pub fn rows_per_chunk_within(n: usize, vocab: usize, budget: usize) -> usize {
    (budget / vocab.max(1)).clamp(1, n.max(1))
}

/// Per-row losses for residual `h [n, d]` and `targets [n]`. With `grads`,
/// also accumulates the head's parameter gradients (loss scaled by `dscale`
/// per row) and returns d(loss)/dh.
pub fn head_forward_backward<B: Backend>(
    c: &Ctx<B>,
    idx: &HeadIdx,
    h: &B::Buf,
    targets: &[u32],
    dscale: f32,
    mut grads: Option<&mut B::Buf>,
) -> (Vec<f32>, Option<B::Buf>) {
    let be = c.be;
    let cfg = c.cfg;
    let (n, d, v) = (c.n(), cfg.d_model, cfg.vocab_size);
    assert_eq!(targets.len(), n, "one target per row");
    let mut hn = be.empty(n * d);
    let mut rstd = be.empty(n);
    be.rmsnorm(be.all_mut(&mut hn), be.all_mut(&mut rstd), be.all(h), c.p(&idx.norm), n, d, cfg.norm_eps);
    let chunk = rows_per_chunk_within(n, v, idx.logit_budget);
    let mut logits = be.empty(chunk * v);
    // Every chunk's input gradient writes its rows.
    let mut dhn = grads.as_ref().map(|_| be.empty(n * d));
    let mut losses = Vec::with_capacity(n);
    for r0 in (0..n).step_by(chunk) {
        let rows = chunk.min(n - r0);
        let hrows = r0 * d..(r0 + rows) * d;
        be.matmul(be.view_mut(&mut logits, 0..rows * v), be.view(&hn, hrows.clone()), c.p(&idx.lm), rows, d, v, false);
        let l = be.cross_entropy(
            be.view_mut(&mut logits, 0..rows * v),
            &targets[r0..r0 + rows],
            rows,
            v,
            cfg.vocab_real,
            dscale,
        );
        losses.extend(l);
        if let (Some(g), Some(dhn)) = (grads.as_deref_mut(), dhn.as_mut()) {
            let dl = be.view(&logits, 0..rows * v);
            be.matmul_bwd_input(be.view_mut(dhn, hrows.clone()), dl, c.p(&idx.lm), rows, d, v, false);
            be.matmul_bwd_weight(be.view_mut(g, idx.lm.clone()), dl, be.view(&hn, hrows), rows, d, v);
        }
    }
    let dh = match (grads, dhn) {
        (Some(g), Some(dhn)) => {
            let mut dh = be.zeros(n * d);
            be.rmsnorm_bwd(
                be.all_mut(&mut dh),
                be.view_mut(g, idx.norm.clone()),
                be.all(&dhn),
                be.all(h),
                c.p(&idx.norm),
                be.all(&rstd),
                n,
                d,
            );
            Some(dh)
        }
        _ => None,
    };
    (losses, dh)
}
