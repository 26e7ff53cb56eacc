//! Causal grouped-query attention on the CPU.
//!
//! Each (batch, head) pair is an independent task: two GEMMs on strided views
//! of the fused q|k|v buffer (no transposes or copies) around a masked
//! softmax. The backward runs one task per (batch, kv-head) so that the query
//! heads sharing a kv-head add their dK/dV contributions in a fixed order
//! without any atomics.

use rayon::prelude::*;

use super::gemm::{GemmCall, GemmLog, Mat, sgemm_raw};
use super::ops::{SendPtr, softmax_in_place};
use crate::backend::AttnDims;

fn check(dims: &AttnDims, qkv_len: usize, probs_len: usize) {
    assert!(dims.n_heads.is_multiple_of(dims.n_kv_heads), "heads not a multiple of kv heads");
    assert_eq!(qkv_len, dims.rows() * dims.qkv_dim(), "qkv buffer size");
    assert_eq!(probs_len, dims.probs_len(), "probs buffer size");
}

struct Views {
    t: usize,
    hd: usize,
    qs: usize,
    qd: usize,
    kvd: usize,
    group: usize,
}

impl Views {
    fn new(d: &AttnDims) -> Views {
        Views {
            t: d.seq,
            hd: d.head_dim,
            qs: d.qkv_dim(),
            qd: d.q_dim(),
            kvd: d.kv_dim(),
            group: d.n_heads / d.n_kv_heads,
        }
    }
    /// Offsets of Q_h, K_kvh and V_kvh for batch b inside the qkv buffer.
    fn q(&self, b: usize, h: usize) -> usize {
        b * self.t * self.qs + h * self.hd
    }
    fn k(&self, b: usize, h: usize) -> usize {
        b * self.t * self.qs + self.qd + (h / self.group) * self.hd
    }
    fn v(&self, b: usize, h: usize) -> usize {
        self.k(b, h) + self.kvd
    }
    /// Offset of head h's output columns for batch b inside `out [n, q_dim]`.
    fn o(&self, b: usize, h: usize) -> usize {
        b * self.t * self.qd + h * self.hd
    }
    fn head(&self) -> Mat {
        Mat::strided(self.t, self.hd, self.qs)
    }
    fn out_head(&self) -> Mat {
        Mat::strided(self.t, self.hd, self.qd)
    }
    fn square(&self) -> Mat {
        Mat::rm(self.t, self.t)
    }
}

pub fn attention(out: &mut [f32], probs: &mut [f32], qkv: &[f32], dims: AttnDims, log: &GemmLog) {
    check(&dims, qkv.len(), probs.len());
    assert_eq!(out.len(), dims.rows() * dims.q_dim(), "attention out size");
    let v = Views::new(&dims);
    let (t, nh) = (dims.seq, dims.n_heads);
    let scale = 1.0 / (dims.head_dim as f32).sqrt();
    let batch = dims.batch * nh;
    log.record(GemmCall { dst: v.square(), lhs: v.head(), rhs: v.head().t(), acc: false, batch, parallel: false });
    log.record(GemmCall { dst: v.out_head(), lhs: v.square(), rhs: v.head(), acc: false, batch, parallel: false });
    let out_ptr = SendPtr(out.as_mut_ptr());
    probs.par_chunks_mut(t * t).enumerate().for_each(|(bh, p)| {
        let (b, h) = (bh / nh, bh % nh);
        // SAFETY: the q/k/v views lie inside `qkv` (size checked above); the
        // scores go to this task's own chunk of `probs`.
        unsafe {
            sgemm_raw(
                p.as_mut_ptr(),
                v.square(),
                qkv.as_ptr().add(v.q(b, h)),
                v.head(),
                qkv.as_ptr().add(v.k(b, h)),
                v.head().t(),
                false,
                false,
            );
        }
        for (i, row) in p.chunks_mut(t).enumerate() {
            let (live, masked) = row.split_at_mut(i + 1);
            softmax_in_place(live, scale, 1.0);
            masked.fill(0.0);
        }
        // SAFETY: head h of batch b writes only its own hd columns of its own
        // T rows of `out`; no other task addresses them.
        unsafe {
            sgemm_raw(
                out_ptr.get().add(v.o(b, h)),
                v.out_head(),
                p.as_ptr(),
                v.square(),
                qkv.as_ptr().add(v.v(b, h)),
                v.head(),
                false,
                false,
            );
        }
    });
}

pub fn attention_bwd(dqkv: &mut [f32], dout: &[f32], qkv: &[f32], probs: &[f32], dims: AttnDims, log: &GemmLog) {
    check(&dims, qkv.len(), probs.len());
    assert_eq!(dqkv.len(), qkv.len(), "dqkv size");
    assert_eq!(dout.len(), dims.rows() * dims.q_dim(), "attention dout size");
    let v = Views::new(&dims);
    let (t, nh, nkv) = (dims.seq, dims.n_heads, dims.n_kv_heads);
    let scale = 1.0 / (dims.head_dim as f32).sqrt();
    let batch = dims.batch * nh;
    let sq = v.square();
    for (dst, lhs, rhs) in [
        (sq, v.out_head(), v.head().t()), // dP = dO V^T
        (v.head(), sq.t(), v.out_head()), // dV += P^T dO
        (v.head(), sq, v.head()),         // dQ = dS K
        (v.head(), sq.t(), v.head()),     // dK += dS^T Q
    ] {
        log.record(GemmCall { dst, lhs, rhs, acc: false, batch, parallel: false });
    }
    let dptr = SendPtr(dqkv.as_mut_ptr());
    (0..dims.batch * nkv).into_par_iter().for_each(|bk| {
        let (b, kvh) = (bk / nkv, bk % nkv);
        let mut ds = vec![0.0f32; t * t];
        for (gi, h) in (kvh * v.group..(kvh + 1) * v.group).enumerate() {
            let p = &probs[(b * nh + h) * t * t..(b * nh + h + 1) * t * t];
            let first = gi == 0;
            // SAFETY: all reads are inside `qkv`, `dout`, `probs` (sizes
            // checked). Writes: dQ of head h, and dK/dV of kv-head kvh, for
            // batch b: this task is the only one with this (b, kvh), and query
            // head h belongs to exactly one kv-head.
            unsafe {
                let d_o = dout.as_ptr().add(v.o(b, h));
                sgemm_raw(
                    ds.as_mut_ptr(),
                    sq,
                    d_o,
                    v.out_head(),
                    qkv.as_ptr().add(v.v(b, h)),
                    v.head().t(),
                    false,
                    false,
                );
                sgemm_raw(dptr.get().add(v.v(b, h)), v.head(), p.as_ptr(), sq.t(), d_o, v.out_head(), !first, false);
            }
            for (i, (dr, pr)) in ds.chunks_mut(t).zip(p.chunks(t)).enumerate() {
                let live = i + 1;
                let mut dotp = 0.0f32;
                for j in 0..live {
                    dotp += dr[j] * pr[j];
                }
                for j in 0..live {
                    dr[j] = pr[j] * (dr[j] - dotp) * scale;
                }
                dr[live..].fill(0.0);
            }
            unsafe {
                sgemm_raw(
                    dptr.get().add(v.q(b, h)),
                    v.head(),
                    ds.as_ptr(),
                    sq,
                    qkv.as_ptr().add(v.k(b, h)),
                    v.head(),
                    false,
                    false,
                );
                sgemm_raw(
                    dptr.get().add(v.k(b, h)),
                    v.head(),
                    ds.as_ptr(),
                    sq.t(),
                    qkv.as_ptr().add(v.q(b, h)),
                    v.head(),
                    !first,
                    false,
                );
            }
        }
    });
}
