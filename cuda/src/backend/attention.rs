//! Attention on `CudaBackend`: strided-batched GEMMs around the softmax
//! kernels (fp32 SGEMM, or bf16 through cuBLASLt with kept copies of the
//! operands).

use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use iota_model::backend::AttnDims;

use super::{Batched, CudaBackend, DMut, DRef, Operand, Scratch, ok};

impl CudaBackend {
    // Attention runs as strided-batched GEMMs, one call per (sequence, head
    // within its KV group) batched over the KV heads: head h = j*group + g
    // reads KV head j, so for a fixed g its Q columns are `group*hd` apart and
    // its K/V columns `hd` apart, both constant strides. The saved
    // probabilities are laid out [batch][g][j][t][t] (the trait leaves their
    // order to the backend), so each batch's score matrices are contiguous
    // and the softmax kernels see plain rows. With bf16 GEMMs the operands
    // (Q, K, V, P, dO, dS) are bf16 copies: Q|K|V and P made by the forward
    // and kept for the backward where the copy limits allow (P and dS written
    // by the softmax kernels themselves); scores, outputs and gradients stay fp32.
    pub(super) fn attention_gemms(&self, out: DMut<'_>, probs: DMut<'_>, qkv: DRef<'_>, dims: AttnDims) {
        let (t, hd, nh, nkv) = (dims.seq, dims.head_dim, dims.n_heads, dims.n_kv_heads);
        let (qs, qd, kvd) = (dims.qkv_dim(), dims.q_dim(), dims.kv_dim());
        let group = nh / nkv;
        assert!(
            qkv.len == dims.rows() * qs && probs.len == dims.probs_len() && out.len == dims.rows() * qd,
            "attention shapes"
        );
        let tt = t * t;
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let Scratch { attn_x, attn_p, .. } = &mut *scratch;
        // Operand bases: the fp32 buffers, or their bf16 copies, kept for the
        // backward where they fit (else in scratch).
        let (x, p16, p_kept) = match self.lt {
            None => (Operand::f32(qkv.ptr), None, false),
            Some(_) => {
                let x = self
                    .kept_copy(&mut copies.acts, qkv.ptr, qkv.len)
                    .unwrap_or_else(|| self.cast_into(attn_x, qkv.ptr, qkv.len));
                let (p16, kept) = match self.copy_slot(&mut copies.acts, probs.ptr, probs.len) {
                    Some(p) => (p, true),
                    None => (self.u16_scratch(attn_p, probs.len), false),
                };
                (Operand::bf16(x), Some(p16), kept)
            }
        };
        let p_op = p16.map_or(Operand::f32(probs.ptr), Operand::bf16);
        for b in 0..dims.batch {
            for g in 0..group {
                let row0 = b * t * qs;
                let p = (b * group + g) * nkv * tt;
                // S_j[i, j'] = Q_h[i, :] . K_j[j', :]
                let s1 = Batched { m: t, n: t, k: hd, lda: qs, sa: hd, ldb: qs, sb: group * hd, ldc: t, sc: tt };
                self.batched(
                    true,
                    false,
                    s1,
                    x.at(row0 + qd),
                    x.at(row0 + g * hd),
                    Operand::f32(probs.ptr).at(p),
                    0.0,
                    nkv,
                );
            }
        }
        let rows = (dims.batch * nh * t) as i32;
        let (ti, scale, p16p) = (t as i32, 1.0 / (hd as f32).sqrt(), p16.unwrap_or(0));
        launch!(self, "causal_softmax", self.rows(rows as usize), &probs.ptr, &p16p, &rows, &ti, &scale);
        if p_kept {
            copies.acts.mark_current(probs.ptr, probs.len);
        }
        for b in 0..dims.batch {
            for g in 0..group {
                let row0 = b * t * qs;
                let p = (b * group + g) * nkv * tt;
                let o = Operand::f32(out.ptr).at(b * t * qd + g * hd);
                // O_h[t, hd] = P_h[t, t] V_j[t, hd]
                let s2 = Batched { m: hd, n: t, k: t, lda: qs, sa: hd, ldb: t, sb: tt, ldc: qd, sc: group * hd };
                self.batched(false, false, s2, x.at(row0 + qd + kvd), p_op.at(p), o, 0.0, nkv);
            }
        }
    }

    pub(super) fn attention_gemms_bwd(
        &self,
        dqkv: DMut<'_>,
        dout: DRef<'_>,
        qkv: DRef<'_>,
        probs: DRef<'_>,
        dims: AttnDims,
    ) {
        let (t, hd, nh, nkv) = (dims.seq, dims.head_dim, dims.n_heads, dims.n_kv_heads);
        let (qs, qd, kvd) = (dims.qkv_dim(), dims.q_dim(), dims.kv_dim());
        let group = nh / nkv;
        assert!(
            dqkv.len == qkv.len && dout.len == dims.rows() * qd && probs.len == dims.probs_len(),
            "attention_bwd shapes"
        );
        let tt = t * t;
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let Scratch { attn_x, attn_p, attn_do, attn_ds16, partials, .. } = &mut *scratch;
        let dsp = self.f32_scratch(partials, nkv * tt);
        let (x, p_op, do_op, ds_op, ds16) = match self.lt {
            None => {
                let ds = Operand::f32(dsp);
                (Operand::f32(qkv.ptr), Operand::f32(probs.ptr), Operand::f32(dout.ptr), ds, 0u64)
            }
            Some(_) => {
                // The forward's copies where they were kept and are current.
                let mut kept =
                    |src: u64, len: usize, scratch: &mut Option<CudaSlice<u16>>| match copies.acts.current(src, len) {
                        Some(c) => c.device_ptr(&self.gpu.stream).0,
                        None => self.cast_into(scratch, src, len),
                    };
                let x = kept(qkv.ptr, qkv.len, attn_x);
                let p = kept(probs.ptr, probs.len, attn_p);
                let d = self.cast_into(attn_do, dout.ptr, dout.len);
                let ds16 = self.u16_scratch(attn_ds16, nkv * tt);
                (Operand::bf16(x), Operand::bf16(p), Operand::bf16(d), Operand::bf16(ds16), ds16)
            }
        };
        let (rows, ti, scale) = ((nkv * t) as i32, t as i32, 1.0 / (hd as f32).sqrt());
        let dx = Operand::f32(dqkv.ptr);
        for b in 0..dims.batch {
            let row0 = b * t * qs;
            for g in 0..group {
                // The first head of each group writes dK/dV; the others add.
                let acc = if g == 0 { 0.0 } else { 1.0 };
                let p = (b * group + g) * nkv * tt;
                let (q, k, v) = (row0 + g * hd, row0 + qd, row0 + qd + kvd);
                let dof = b * t * qd + g * hd;
                // dP = dO V^T  -> ds
                let s = Batched { m: t, n: t, k: hd, lda: qs, sa: hd, ldb: qd, sb: group * hd, ldc: t, sc: tt };
                self.batched(true, false, s, x.at(v), do_op.at(dof), Operand::f32(dsp), 0.0, nkv);
                // dV (+)= P^T dO
                let s = Batched { m: hd, n: t, k: t, lda: qd, sa: group * hd, ldb: t, sb: tt, ldc: qs, sc: hd };
                self.batched(false, true, s, do_op.at(dof), p_op.at(p), dx.at(v), acc, nkv);
                // dS = scale * P * (dP - rowsum(P dP)), in place over the nkv*t rows
                let pf = probs.ptr + 4 * p as u64;
                launch!(self, "causal_softmax_bwd", self.rows(nkv * t), &dsp, &ds16, &pf, &rows, &ti, &scale);
                // dQ = dS K
                let s = Batched { m: hd, n: t, k: t, lda: qs, sa: hd, ldb: t, sb: tt, ldc: qs, sc: group * hd };
                self.batched(false, false, s, x.at(k), ds_op, dx.at(q), 0.0, nkv);
                // dK (+)= dS^T Q
                let s = Batched { m: hd, n: t, k: t, lda: qs, sa: group * hd, ldb: t, sb: tt, ldc: qs, sc: hd };
                self.batched(false, true, s, x.at(q), ds_op, dx.at(k), acc, nkv);
            }
        }
    }
}
