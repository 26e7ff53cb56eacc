//! Naive references for `selftest --device cpu`: the slice reduce and the
//! int8 row codec written again from their definitions, as plain loops
//! (f64 wherever the definition is real arithmetic), calling nothing of
//! `iota_core::merge` or `iota_model::codec`. Slow on purpose; only as
//! clever as the definition needs.
//!
//! The definitions (see `iota_core::merge::reduce` and `iota_core::codec`):
//! - reduce: contributions that arrived, have the slice's length and only
//!   finite values take part; their weights are renormalised to sum to 1
//!   (equal weights when they sum to 0 or less); g is their weighted mean,
//!   or trimmed mean, or centered clipping: start at the coordinate-wise
//!   median, then `max(iters, 1)` times move the center v by
//!   sum_i w_i min(1, tau / |x_i - v|) (x_i - v), tau = tau_factor times the
//!   median of the |x_i - v|. Then Nesterov: m <- mu m + g; u = lr (g + mu m)
//!   (with mu = 0: u = lr g, the momentum left alone).
//! - int8 row: per row, the scale is absmax / 127 (in f32) rounded up to a
//!   bf16 (the top 16 bits of an f32), written little-endian, then one code
//!   per value: x * (1 / scale), both in f32, rounded half away from zero and
//!   clamped to [-127, 127], as a two's-complement byte. The codes are
//!   defined by that f32 arithmetic (the GPU kernel does the same), so it is
//!   reproduced here exactly: the bytes must match, not just nearly.
//!   Decoding: code x scale; a code -128, a non-finite or negative scale or
//!   a non-finite product makes the payload invalid.

use iota_core::merge::{OuterOpt, ReduceRule};

use super::check::Kernels;
use crate::runtime::CudaError;

/// The naive references as a [`Kernels`].
pub struct Naive;

impl Kernels for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }
    fn reduce_slice(
        &self,
        rule: ReduceRule,
        outer: OuterOpt,
        contribs: &[Option<&[f32]>],
        weights: &[f64],
        momentum: &mut [f32],
    ) -> Result<Vec<f32>, CudaError> {
        Ok(reduce(rule, outer, contribs, weights, momentum))
    }
    fn encode_int8_rows(&self, x: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, CudaError> {
        encode_int8_rows(x, rows, cols).ok_or_else(|| CudaError::Driver("naive encode: non-finite input".into()))
    }
    fn decode_int8_rows(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Option<Vec<f32>>, CudaError> {
        Ok(decode_int8_rows(bytes, rows, cols))
    }
}

/// The slice reduce and the outer Nesterov step; returns u, updates `momentum`.
pub fn reduce(
    rule: ReduceRule,
    outer: OuterOpt,
    contribs: &[Option<&[f32]>],
    weights: &[f64],
    momentum: &mut [f32],
) -> Vec<f32> {
    let n = momentum.len();
    let mut xs: Vec<&[f32]> = Vec::new();
    let mut ws: Vec<f64> = Vec::new();
    for i in 0..contribs.len().min(weights.len()) {
        let Some(c) = contribs[i] else { continue };
        if c.len() != n {
            continue;
        }
        let mut finite = true;
        for &v in c {
            if !v.is_finite() {
                finite = false;
            }
        }
        if finite {
            xs.push(c);
            ws.push(weights[i]);
        }
    }
    let mut total = 0.0;
    for &w in &ws {
        total += w;
    }
    for w in ws.iter_mut() {
        *w = if total > 0.0 { *w / total } else { 1.0 / xs.len() as f64 };
    }
    let g = if xs.is_empty() {
        vec![0.0; n]
    } else {
        match rule {
            ReduceRule::Mean => mean(&xs, &ws, n),
            ReduceRule::TrimmedMean { trim } => trimmed_mean(&xs, &ws, trim as usize, n),
            ReduceRule::CenteredClip { tau_factor, iters } => {
                centered_clip(&xs, &ws, tau_factor as f64, iters.max(1), n)
            }
        }
    };
    let (lr, mu) = (outer.lr as f64, outer.momentum as f64);
    let mut u = vec![0.0f32; n];
    for j in 0..n {
        if mu == 0.0 {
            // No momentum: not kept (`iota_core::merge::reduce::outer_step`).
            u[j] = (lr * g[j]) as f32;
            continue;
        }
        let m = mu * momentum[j] as f64 + g[j];
        momentum[j] = m as f32;
        u[j] = (lr * (g[j] + mu * m)) as f32;
    }
    u
}

fn mean(xs: &[&[f32]], w: &[f64], n: usize) -> Vec<f64> {
    let mut g = vec![0.0; n];
    for j in 0..n {
        for i in 0..xs.len() {
            g[j] += w[i] * xs[i][j] as f64;
        }
    }
    g
}

fn trimmed_mean(xs: &[&[f32]], w: &[f64], trim: usize, n: usize) -> Vec<f64> {
    let r = xs.len();
    // At most (r - 1) / 2 from each end: at least one value stays.
    let k = trim.min((r - 1) / 2);
    let mut g = vec![0.0; n];
    for j in 0..n {
        let mut col: Vec<(f64, f64)> = (0..r).map(|i| (xs[i][j] as f64, w[i])).collect();
        col.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut s, mut wsum, mut plain) = (0.0, 0.0, 0.0);
        for &(x, w) in &col[k..r - k] {
            s += w * x;
            wsum += w;
            plain += x;
        }
        g[j] = if wsum > 0.0 { s / wsum } else { plain / (r - 2 * k) as f64 };
    }
    g
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let k = v.len();
    if k % 2 == 1 { v[k / 2] } else { (v[k / 2 - 1] + v[k / 2]) / 2.0 }
}

fn centered_clip(xs: &[&[f32]], w: &[f64], tau_factor: f64, iters: u32, n: usize) -> Vec<f64> {
    let r = xs.len();
    let mut v = vec![0.0; n];
    let mut col = vec![0.0; r];
    for j in 0..n {
        for i in 0..r {
            col[i] = xs[i][j] as f64;
        }
        v[j] = median(&mut col);
    }
    for _ in 0..iters {
        let mut dist = vec![0.0; r];
        for i in 0..r {
            let mut s = 0.0;
            for j in 0..n {
                let d = xs[i][j] as f64 - v[j];
                s += d * d;
            }
            dist[i] = s.sqrt();
        }
        let tau = tau_factor * median(&mut dist.clone());
        let mut scale = vec![1.0; r];
        for i in 0..r {
            if dist[i] > 0.0 {
                scale[i] = (tau / dist[i]).min(1.0);
            }
        }
        for j in 0..n {
            let mut step = 0.0;
            for i in 0..r {
                step += w[i] * scale[i] * (xs[i][j] as f64 - v[j]);
            }
            v[j] += step;
        }
    }
    v
}

/// The smallest bf16 (as its 16 bits) not below `x >= 0`.
fn bf16_at_or_above(x: f32) -> u16 {
    let truncated = f32::from_bits(x.to_bits() & 0xFFFF_0000);
    let up = if truncated < x { f32::from_bits(truncated.to_bits() + 0x1_0000) } else { truncated };
    (up.to_bits() >> 16) as u16
}

/// Halves away from zero.
fn round_half_away(y: f32) -> f32 {
    let a = y.abs();
    let mut q = a.floor();
    if a - q >= 0.5 {
        q += 1.0;
    }
    if y < 0.0 { -q } else { q }
}

/// int8-per-row bytes of `x` ([rows, cols]); None for a non-finite value or
/// a length that does not match the shape.
pub fn encode_int8_rows(x: &[f32], rows: usize, cols: usize) -> Option<Vec<u8>> {
    if x.len() != rows.checked_mul(cols)? {
        return None;
    }
    let mut out = Vec::with_capacity(rows * (2 + cols));
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mut absmax = 0.0f32;
        for &v in row {
            if !v.is_finite() {
                return None;
            }
            if v.abs() > absmax {
                absmax = v.abs();
            }
        }
        let bits = bf16_at_or_above(absmax / 127.0);
        out.push((bits & 0xFF) as u8);
        out.push((bits >> 8) as u8);
        let scale = f32::from_bits((bits as u32) << 16);
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for &v in row {
            let mut q = round_half_away(v * inv);
            // 0 x inf (a subnormal scale) is NaN: code 0, as `NaN as i8` is.
            if q.is_nan() {
                q = 0.0;
            }
            q = q.clamp(-127.0, 127.0);
            out.push(q as i8 as u8);
        }
    }
    Some(out)
}

/// Decodes int8-per-row bytes; None when they are invalid or the length
/// does not match the shape.
pub fn decode_int8_rows(bytes: &[u8], rows: usize, cols: usize) -> Option<Vec<f32>> {
    let rb = cols.checked_add(2)?;
    if bytes.len() != rows.checked_mul(rb)? {
        return None;
    }
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let b = &bytes[r * rb..(r + 1) * rb];
        let scale = f32::from_bits(((b[0] as u32) | (b[1] as u32) << 8) << 16);
        if !scale.is_finite() || scale < 0.0 {
            return None;
        }
        for &c in &b[2..] {
            let q = c as i8;
            if q == -128 {
                return None;
            }
            let v = (q as f64 * scale as f64) as f32;
            if !v.is_finite() {
                return None;
            }
            out.push(v);
        }
    }
    Some(out)
}
