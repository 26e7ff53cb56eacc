//! `CpuBackend`: the fp32 reference backend (what CI runs and what every
//! other backend is checked against). GEMMs go through the `gemm` crate
//! (runtime-dispatched AVX-512/AVX2/SSE kernels, rayon-parallel); everything
//! else is in `ops.rs` and `attention.rs`.

pub mod attention;
pub mod gemm;
pub mod ops;

use std::ops::Range;

use self::gemm::{GemmCall, GemmLog, Mat, sgemm};
use crate::backend::{AdamStep, AttnDims, Backend};

#[derive(Default)]
pub struct CpuBackend {
    log: GemmLog,
    /// GEMM operands rounded to bf16 first (accumulation stays fp32).
    bf16_gemm: bool,
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend whose GEMMs round both operands to bf16 (nearest even)
    /// and accumulate in fp32: the arithmetic of a GPU's bf16 GEMMs
    /// (`--gemm bf16`), on the CPU, so that honest differences between
    /// backends can be measured and tested without a GPU. Everything else
    /// stays the fp32 reference.
    pub fn with_bf16_gemm() -> Self {
        CpuBackend { bf16_gemm: true, ..Self::default() }
    }

    /// Starts recording the shape of every GEMM (for the benchmark's floor).
    pub fn start_gemm_log(&self) {
        self.log.start();
    }

    /// Stops recording and returns the calls seen since `start_gemm_log`.
    pub fn take_gemm_log(&self) -> Vec<GemmCall> {
        self.log.take()
    }

    fn gemm(&self, dst: &mut [f32], d: Mat, lhs: &[f32], l: Mat, rhs: &[f32], r: Mat, acc: bool) {
        self.log.record(GemmCall { dst: d, lhs: l, rhs: r, acc, batch: 1, parallel: true });
        if self.bf16_gemm {
            let round = |x: &[f32]| -> Vec<f32> {
                x.iter().map(|&v| iota_core::codec::bf16_to_f32(iota_core::codec::f32_to_bf16(v))).collect()
            };
            sgemm(dst, d, &round(lhs), l, &round(rhs), r, acc, true);
        } else {
            sgemm(dst, d, lhs, l, rhs, r, acc, true);
        }
    }
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Ref<'a> = &'a [f32];
    type Mut<'a> = &'a mut [f32];

    fn name(&self) -> String {
        let gemm = if self.bf16_gemm { ", bf16 GEMM operands" } else { "" };
        format!("cpu ({} threads{gemm})", rayon::current_num_threads())
    }

    fn zeros(&self, n: usize) -> Vec<f32> {
        vec![0.0; n]
    }
    fn empty(&self, n: usize) -> Vec<f32> {
        // NaN poisons any read before the write it promises (debug builds:
        // the tests); release builds take zeroed pages, which cost nothing.
        if cfg!(debug_assertions) { vec![f32::NAN; n] } else { vec![0.0; n] }
    }
    fn upload(&self, host: &[f32]) -> Vec<f32> {
        host.to_vec()
    }
    fn decode_wire(
        &self,
        codec: iota_core::WireCodec,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Vec<f32>, iota_core::CoreError> {
        // The decoded vector is the buffer: no upload copy.
        crate::codec::decode(codec, rows, cols, bytes)
    }
    fn download(&self, buf: &Vec<f32>, range: Range<usize>, out: &mut [f32]) {
        out.copy_from_slice(&buf[range]);
    }
    fn len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }
    fn view<'a>(&self, buf: &'a Vec<f32>, range: Range<usize>) -> &'a [f32] {
        &buf[range]
    }
    fn view_mut<'a>(&self, buf: &'a mut Vec<f32>, range: Range<usize>) -> &'a mut [f32] {
        &mut buf[range]
    }

    fn fill(&self, x: &mut [f32], value: f32) {
        ops::fill(x, value)
    }
    fn copy(&self, dst: &mut [f32], src: &[f32]) {
        ops::copy(dst, src)
    }
    fn add_assign(&self, dst: &mut [f32], src: &[f32]) {
        ops::add_assign(dst, src)
    }
    fn scale(&self, x: &mut [f32], s: f32) {
        ops::scale(x, s)
    }
    fn sum_squares(&self, x: &[f32]) -> f64 {
        ops::sum_squares(x)
    }
    fn scatter_cols(&self, dst: &mut [f32], src: &[f32], n: usize, d: usize, b: usize, acc: bool) {
        ops::scatter_cols(dst, src, n, d, b, acc)
    }
    fn gather_cols(&self, dst: &mut [f32], src: &[f32], n: usize, d: usize, b: usize, acc: bool) {
        ops::gather_cols(dst, src, n, d, b, acc)
    }

    fn matmul(&self, out: &mut [f32], inp: &[f32], w: &[f32], n: usize, c: usize, oc: usize, acc: bool) {
        self.gemm(out, Mat::rm(n, oc), inp, Mat::rm(n, c), w, Mat::rm(oc, c).t(), acc);
    }
    fn matmul_bwd_input(&self, dinp: &mut [f32], dout: &[f32], w: &[f32], n: usize, c: usize, oc: usize, acc: bool) {
        self.gemm(dinp, Mat::rm(n, c), dout, Mat::rm(n, oc), w, Mat::rm(oc, c), acc);
    }
    fn matmul_bwd_weight(&self, dw: &mut [f32], dout: &[f32], inp: &[f32], n: usize, c: usize, oc: usize) {
        self.gemm(dw, Mat::rm(oc, c), dout, Mat::rm(n, oc).t(), inp, Mat::rm(n, c), true);
    }

    fn embedding(&self, out: &mut [f32], tokens: &[u32], wte: &[f32], d: usize) {
        ops::embedding(out, tokens, wte, d)
    }
    fn embedding_bwd(&self, dwte: &mut [f32], dout: &[f32], tokens: &[u32], d: usize) {
        ops::embedding_bwd(dwte, dout, tokens, d)
    }

    fn rmsnorm(&self, out: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], n: usize, d: usize, eps: f32) {
        ops::rmsnorm(out, rstd, x, w, n, d, eps)
    }
    fn rmsnorm_bwd(
        &self,
        dx: &mut [f32],
        dw: &mut [f32],
        dout: &[f32],
        x: &[f32],
        w: &[f32],
        rstd: &[f32],
        n: usize,
        d: usize,
    ) {
        ops::rmsnorm_bwd(dx, dw, dout, x, w, rstd, n, d)
    }

    fn rope(
        &self,
        x: &mut [f32],
        table: &[f32],
        rows: usize,
        seq: usize,
        row_stride: usize,
        heads: usize,
        head_dim: usize,
        inverse: bool,
    ) {
        ops::rope(x, table, rows, seq, row_stride, heads, head_dim, inverse)
    }
    fn attention(&self, out: &mut [f32], probs: &mut [f32], qkv: &[f32], dims: AttnDims) {
        attention::attention(out, probs, qkv, dims, &self.log)
    }
    fn attention_bwd(&self, dqkv: &mut [f32], dout: &[f32], qkv: &[f32], _out: &[f32], probs: &[f32], dims: AttnDims) {
        attention::attention_bwd(dqkv, dout, qkv, probs, dims, &self.log)
    }

    fn swiglu(&self, out: &mut [f32], gu: &[f32], n: usize, f: usize) {
        ops::swiglu(out, gu, n, f)
    }
    fn swiglu_bwd(&self, dgu: &mut [f32], dout: &[f32], gu: &[f32], n: usize, f: usize) {
        ops::swiglu_bwd(dgu, dout, gu, n, f)
    }

    fn cross_entropy(
        &self,
        logits: &mut [f32],
        targets: &[u32],
        n: usize,
        vocab: usize,
        vocab_real: usize,
        dscale: f32,
    ) -> Vec<f32> {
        ops::cross_entropy(logits, targets, n, vocab, vocab_real, dscale)
    }

    fn adamw(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], step: AdamStep) {
        ops::adamw(p, g, m, v, step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iota_core::codec::{bf16_to_f32, f32_to_bf16};

    #[test]
    fn a_bf16_gemm_is_the_fp32_gemm_of_operands_rounded_to_bf16() {
        let (n, c, oc) = (8, 16, 4);
        // Values with low mantissa bits set, so rounding changes them.
        let inp: Vec<f32> = (0..n * c).map(|i| 1.0 + i as f32 * 1.3e-3).collect();
        let w: Vec<f32> = (0..oc * c).map(|i| (i as f32 * 0.37).sin() * 0.1 + 1e-4).collect();
        let round = |x: &[f32]| -> Vec<f32> { x.iter().map(|&v| bf16_to_f32(f32_to_bf16(v))).collect() };
        let (mut bf, mut by_hand, mut fp) = (vec![0f32; n * oc], vec![0f32; n * oc], vec![0f32; n * oc]);
        CpuBackend::with_bf16_gemm().matmul(&mut bf, &inp, &w, n, c, oc, false);
        CpuBackend::new().matmul(&mut by_hand, &round(&inp), &round(&w), n, c, oc, false);
        CpuBackend::new().matmul(&mut fp, &inp, &w, n, c, oc, false);
        assert_eq!(bf, by_hand);
        assert_ne!(bf, fp, "rounding the operands changed nothing");
        // A single output near zero may move by more than its size, so the
        // bound is on the whole product's relative L2 (bf16 keeps 8 bits).
        let l2 = |v: &mut dyn Iterator<Item = f32>| v.map(|x| x * x).sum::<f32>().sqrt();
        let rel = l2(&mut bf.iter().zip(&fp).map(|(a, b)| a - b)) / l2(&mut fp.iter().copied());
        assert!(rel > 0.0 && rel < 1e-2, "bf16 operands moved the product by {rel} relative L2");
    }
}
