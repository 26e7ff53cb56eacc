//! Hand-written CPU kernels for everything that is not a GEMM.
//!
//! Loops are written over contiguous rows with independent accumulators so
//! the compiler vectorises them. Work is split into fixed-size chunks (never
//! "one per thread"), so results do not depend on the thread count.

use rayon::prelude::*;

use crate::backend::AdamStep;

/// Elements per parallel task for purely elementwise work.
const ELEM_CHUNK: usize = 1 << 15;
/// Rows per task for the row-reductions whose parameter gradient is summed
/// over rows (the partial sums are then added in chunk order).
const ROW_BLOCK: usize = 32;

/// A raw pointer that may cross threads. Every use documents why the
/// elements it touches are disjoint between threads.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    // A method (not field access) so closures capture the whole wrapper.
    #[inline]
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// Sum with 8 independent lanes (vectorisable, fixed order).
#[inline]
pub(crate) fn sum8(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += f(c[i]);
        }
    }
    let mut s = 0.0;
    for r in rest {
        s += f(*r);
    }
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + s
}

/// Dot product with 8 independent lanes.
#[inline]
pub(crate) fn dot8(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut s = 0.0;
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + s
}

/// exp(x) in f32 without a libm call, so loops over it vectorise:
/// x = n ln2 + r with |r| <= ln2/2, exp(r) by a degree-6 polynomial (Cephes'
/// expf coefficients, ~2 ulp), 2^n assembled in the exponent bits. Inputs are
/// clamped to the range where the result is a normal f32 (below it the true
/// value is below 2e-38 and rounds away in every sum we use it in).
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.clamp(-87.3, 88.3);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Numerically safe softmax of `row` in place, scaled by `mul`, with the
/// logits first multiplied by `temp`: row = mul * softmax(temp * row).
/// Returns (max(row_in), sum of exp) for callers that need the log-partition.
#[inline]
pub(crate) fn softmax_in_place(row: &mut [f32], temp: f32, mul: f32) -> (f32, f32) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] = lanes[i].max(c[i]);
        }
    }
    let mx = rest.iter().fold(lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)), |a, &b| a.max(b));
    for v in row.iter_mut() {
        *v = fast_exp((*v - mx) * temp);
    }
    let sum = sum8(row, |v| v);
    let k = mul / sum;
    for v in row.iter_mut() {
        *v *= k;
    }
    (mx, sum)
}

pub fn fill(x: &mut [f32], v: f32) {
    x.par_chunks_mut(ELEM_CHUNK).for_each(|c| c.fill(v));
}

pub fn copy(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "copy length mismatch");
    dst.par_chunks_mut(ELEM_CHUNK).zip(src.par_chunks(ELEM_CHUNK)).for_each(|(d, s)| d.copy_from_slice(s));
}

pub fn add_assign(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "add length mismatch");
    dst.par_chunks_mut(ELEM_CHUNK).zip(src.par_chunks(ELEM_CHUNK)).for_each(|(d, s)| {
        for (a, b) in d.iter_mut().zip(s) {
            *a += *b;
        }
    });
}

pub fn scale(x: &mut [f32], s: f32) {
    x.par_chunks_mut(ELEM_CHUNK).for_each(|c| c.iter_mut().for_each(|v| *v *= s));
}

pub fn sum_squares(x: &[f32]) -> f64 {
    let partial: Vec<f64> =
        x.par_chunks(ELEM_CHUNK).map(|c| c.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>()).collect();
    partial.iter().sum()
}

pub fn scatter_cols(dst: &mut [f32], src: &[f32], n: usize, d: usize, b: usize, acc: bool) {
    assert!(b <= d && dst.len() == n * d && src.len() == n * b, "scatter_cols shapes");
    dst.par_chunks_mut(d).zip(src.par_chunks(b.max(1))).for_each(|(dr, sr)| {
        if acc {
            dr[..b].iter_mut().zip(sr).for_each(|(a, s)| *a += *s);
        } else {
            dr[..b].copy_from_slice(&sr[..b]);
        }
    });
}

pub fn gather_cols(dst: &mut [f32], src: &[f32], n: usize, d: usize, b: usize, acc: bool) {
    assert!(b <= d && dst.len() == n * b && src.len() == n * d, "gather_cols shapes");
    if b == 0 {
        return;
    }
    dst.par_chunks_mut(b).zip(src.par_chunks(d)).for_each(|(dr, sr)| {
        if acc {
            dr.iter_mut().zip(&sr[..b]).for_each(|(a, s)| *a += *s);
        } else {
            dr.copy_from_slice(&sr[..b]);
        }
    });
}

pub fn embedding(out: &mut [f32], tokens: &[u32], wte: &[f32], d: usize) {
    assert_eq!(out.len(), tokens.len() * d, "embedding out shape");
    let vocab = wte.len() / d;
    out.par_chunks_mut(d).zip(tokens.par_iter()).for_each(|(row, &t)| {
        let t = t as usize;
        assert!(t < vocab, "token {t} outside vocabulary {vocab}");
        row.copy_from_slice(&wte[t * d..(t + 1) * d]);
    });
}

/// Deterministic scatter-add: task `p` of `P` owns the vocabulary rows with
/// `token % P == p` and adds their gradients in token order, so no two tasks
/// touch the same row and the summation order is fixed.
pub fn embedding_bwd(dwte: &mut [f32], dout: &[f32], tokens: &[u32], d: usize) {
    assert_eq!(dout.len(), tokens.len() * d, "embedding_bwd dout shape");
    let vocab = dwte.len() / d;
    assert!(tokens.iter().all(|&t| (t as usize) < vocab), "token outside vocabulary");
    const TASKS: usize = 16;
    let base = SendPtr(dwte.as_mut_ptr());
    (0..TASKS).into_par_iter().for_each(|p| {
        for (i, &t) in tokens.iter().enumerate() {
            let t = t as usize;
            if t % TASKS != p {
                continue;
            }
            // SAFETY: row t is in bounds (checked above) and only task t % TASKS writes it.
            let row = unsafe { std::slice::from_raw_parts_mut(base.get().add(t * d), d) };
            for (a, g) in row.iter_mut().zip(&dout[i * d..(i + 1) * d]) {
                *a += *g;
            }
        }
    });
}

pub fn rmsnorm(out: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], n: usize, d: usize, eps: f32) {
    assert!(out.len() == n * d && x.len() == n * d && rstd.len() == n && w.len() == d, "rmsnorm shapes");
    out.par_chunks_mut(d).zip(rstd.par_iter_mut()).zip(x.par_chunks(d)).for_each(|((o, r), xr)| {
        let ms = sum8(xr, |v| v * v) / d as f32;
        let s = 1.0 / (ms + eps).sqrt();
        *r = s;
        for ((o, &xv), &wv) in o.iter_mut().zip(xr).zip(w) {
            *o = xv * s * wv;
        }
    });
}

#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_bwd(
    dx: &mut [f32],
    dw: &mut [f32],
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    n: usize,
    d: usize,
) {
    assert!(
        dx.len() == n * d
            && dout.len() == n * d
            && x.len() == n * d
            && rstd.len() == n
            && w.len() == d
            && dw.len() == d,
        "rmsnorm_bwd shapes"
    );
    let blk = ROW_BLOCK * d;
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(blk)
        .zip(dout.par_chunks(blk))
        .zip(x.par_chunks(blk))
        .zip(rstd.par_chunks(ROW_BLOCK))
        .map(|(((dxb, gb), xb), rb)| {
            let mut pdw = vec![0.0f32; d];
            let mut wg = vec![0.0f32; d];
            for (((dxr, gr), xr), &r) in dxb.chunks_mut(d).zip(gb.chunks(d)).zip(xb.chunks(d)).zip(rb) {
                for j in 0..d {
                    wg[j] = w[j] * gr[j];
                }
                let s = dot8(&wg, xr) * r * r * r / d as f32;
                for j in 0..d {
                    dxr[j] += r * wg[j] - xr[j] * s;
                    pdw[j] += gr[j] * xr[j] * r;
                }
            }
            pdw
        })
        .collect();
    for p in partials {
        for (a, b) in dw.iter_mut().zip(&p) {
            *a += *b;
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &mut [f32],
    table: &[f32],
    rows: usize,
    seq: usize,
    row_stride: usize,
    heads: usize,
    hd: usize,
    inverse: bool,
) {
    let half = hd / 2;
    assert!(table.len() >= 2 * seq * half, "rope table too short");
    assert!(heads * hd <= row_stride && x.len() >= rows * row_stride, "rope shapes");
    let (cos, sin) = table.split_at(seq * half);
    let sign = if inverse { -1.0 } else { 1.0 };
    x.par_chunks_mut(row_stride).take(rows).enumerate().for_each(|(r, row)| {
        let pos = r % seq;
        let c = &cos[pos * half..(pos + 1) * half];
        let s = &sin[pos * half..(pos + 1) * half];
        for h in 0..heads {
            let (a, b) = row[h * hd..(h + 1) * hd].split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                let si = sign * s[i];
                a[i] = x1 * c[i] - x2 * si;
                b[i] = x2 * c[i] + x1 * si;
            }
        }
    });
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + fast_exp(-x))
}

pub fn swiglu(out: &mut [f32], gu: &[f32], n: usize, f: usize) {
    assert!(out.len() == n * f && gu.len() == 2 * n * f, "swiglu shapes");
    out.par_chunks_mut(f).zip(gu.par_chunks(2 * f)).for_each(|(o, r)| {
        let (g, u) = r.split_at(f);
        for j in 0..f {
            o[j] = g[j] * sigmoid(g[j]) * u[j];
        }
    });
}

pub fn swiglu_bwd(dgu: &mut [f32], dout: &[f32], gu: &[f32], n: usize, f: usize) {
    assert!(dgu.len() == 2 * n * f && dout.len() == n * f && gu.len() == 2 * n * f, "swiglu_bwd shapes");
    dgu.par_chunks_mut(2 * f).zip(dout.par_chunks(f)).zip(gu.par_chunks(2 * f)).for_each(|((dr, o), r)| {
        let (g, u) = r.split_at(f);
        let (dg, du) = dr.split_at_mut(f);
        for j in 0..f {
            let s = sigmoid(g[j]);
            let silu = g[j] * s;
            du[j] = o[j] * silu;
            dg[j] = o[j] * u[j] * s * (1.0 + g[j] * (1.0 - s));
        }
    });
}

pub fn cross_entropy(
    logits: &mut [f32],
    targets: &[u32],
    n: usize,
    vocab: usize,
    vocab_real: usize,
    dscale: f32,
) -> Vec<f32> {
    assert!(logits.len() == n * vocab && targets.len() == n && vocab_real <= vocab, "cross_entropy shapes");
    logits
        .par_chunks_mut(vocab)
        .zip(targets.par_iter())
        .map(|(row, &t)| {
            let t = t as usize;
            assert!(t < vocab_real, "target {t} outside vocabulary {vocab_real}");
            let (live, pad) = row.split_at_mut(vocab_real);
            let target_logit = live[t];
            let (mx, sum) = softmax_in_place(live, 1.0, dscale);
            let loss = sum.ln() + mx - target_logit;
            live[t] -= dscale;
            pad.fill(0.0);
            loss
        })
        .collect()
}

pub fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: AdamStep) {
    assert!(p.len() == g.len() && p.len() == m.len() && p.len() == v.len(), "adamw lengths");
    let (step, grad_coef) = h.moment_coefficients();
    let bc2 = 1.0 - (h.beta2 as f64).powi(h.t as i32);
    let inv_sqrt_bc2 = (1.0 / bc2.sqrt()) as f32;
    let decay = 1.0 - h.lr * h.weight_decay;
    p.par_chunks_mut(ELEM_CHUNK)
        .zip(g.par_chunks(ELEM_CHUNK))
        .zip(m.par_chunks_mut(ELEM_CHUNK))
        .zip(v.par_chunks_mut(ELEM_CHUNK))
        .for_each(|(((pc, gc), mc), vc)| {
            for i in 0..pc.len() {
                let gi = gc[i] * h.grad_scale;
                mc[i] = h.beta1 * mc[i] + (1.0 - h.beta1) * gi;
                vc[i] = h.beta2 * vc[i] + (1.0 - h.beta2) * gi * gi;
                let denom = vc[i].sqrt() * inv_sqrt_bc2 + h.eps;
                // Adam's update unchanged when there is no look-ahead term.
                let update = if h.nesterov { step * mc[i] + grad_coef * gi } else { step * mc[i] };
                pc[i] = pc[i] * decay - update / denom;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let rel = ((fast_exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 4e-7, "worst relative error {worst:e}");
        assert_eq!(fast_exp(0.0), 1.0);
        assert!(fast_exp(-1000.0) < 2e-38 && fast_exp(-1000.0) >= 0.0);
        assert!(fast_exp(1000.0).is_finite());
    }

    #[test]
    fn softmax_matches_reference() {
        let mut row: Vec<f32> = (0..37).map(|i| ((i * 7919) % 23) as f32 * 0.7 - 8.0).collect();
        let orig = row.clone();
        let (mx, sum) = softmax_in_place(&mut row, 0.5, 2.0);
        let z: f64 = orig.iter().map(|&v| ((v as f64 - mx as f64) * 0.5).exp()).sum();
        assert!((sum as f64 - z).abs() / z < 1e-6);
        for (r, o) in row.iter().zip(&orig) {
            let want = 2.0 * ((*o as f64 - mx as f64) * 0.5).exp() / z;
            assert!((*r as f64 - want).abs() < 1e-6 * want.max(1e-3));
        }
    }
}
