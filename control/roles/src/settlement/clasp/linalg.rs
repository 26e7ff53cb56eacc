//! The numerics CLASP needs: a dense Cholesky factorisation and inverse for a
//! symmetric positive definite matrix of a few hundred rows, and the normal
//! tail with its inverse (for critical values). Plain loops in a fixed order,
//! so results are bitwise reproducible on one platform.

/// Inverse of the symmetric positive definite `p x p` matrix `a` (row-major,
/// both triangles filled), through its Cholesky factor, with the trace of the
/// inverse. `None` when a pivot is not positive and finite (not positive
/// definite in floating point). Cost: about p^3/2 multiply-adds.
pub(crate) fn spd_inverse(a: &[f64], p: usize) -> Option<(Vec<f64>, f64)> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: this CPU has AVX, checked just above.
        return unsafe { spd_inverse_avx(a, p) };
    }
    spd_inverse_in(a, p)
}

/// `spd_inverse` compiled for AVX: twice the lanes of the baseline's SSE2.
/// Every output element goes through the same operations in the same
/// order either way (no fused multiply-add, each of `dot`'s eight sums in
/// its own lane), so the bits do not depend on which one ran: validators
/// on different machines agree.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn spd_inverse_avx(a: &[f64], p: usize) -> Option<(Vec<f64>, f64)> {
    spd_inverse_in(a, p)
}

#[inline(always)]
pub(crate) fn spd_inverse_in(a: &[f64], p: usize) -> Option<(Vec<f64>, f64)> {
    debug_assert_eq!(a.len(), p * p);
    // Lower Cholesky factor, row-major: a = l l'.
    let mut l = vec![0.0; p * p];
    for j in 0..p {
        let s = a[j * p + j] - dot(&l[j * p..j * p + j], &l[j * p..j * p + j]);
        if !(s > 0.0 && s.is_finite()) {
            return None;
        }
        let ljj = s.sqrt();
        l[j * p + j] = ljj;
        for i in j + 1..p {
            let s = a[i * p + j] - dot(&l[i * p..i * p + j], &l[j * p..j * p + j]);
            l[i * p + j] = s / ljj;
        }
    }
    // m = l^-1 (lower), row by row (contiguous axpys):
    // m_i = -(sum_{k < i} l_ik m_k) / l_ii on columns < i, m_ii = 1 / l_ii.
    let mut m = vec![0.0; p * p];
    for i in 0..p {
        let (done, rest) = m.split_at_mut(i * p);
        let row_i = &mut rest[..p];
        for k in 0..i {
            let lik = l[i * p + k];
            if lik != 0.0 {
                for (o, &mkj) in row_i[..=k].iter_mut().zip(&done[k * p..k * p + k + 1]) {
                    *o -= lik * mkj;
                }
            }
        }
        let lii = l[i * p + i];
        for o in &mut row_i[..i] {
            *o /= lii;
        }
        row_i[i] = 1.0 / lii;
    }
    // a^-1 = m' m: (a^-1)_ij = sum_{k >= max(i, j)} m_ki m_kj.
    let mut inv = vec![0.0; p * p];
    let mut trace = 0.0;
    for k in 0..p {
        let row = &m[k * p..k * p + k + 1];
        for i in 0..=k {
            let mki = row[i];
            trace += mki * mki;
            if mki == 0.0 {
                continue;
            }
            let out = &mut inv[i * p..i * p + i + 1];
            for (o, &mkj) in out.iter_mut().zip(&row[..=i]) {
                *o += mki * mkj;
            }
        }
    }
    for i in 0..p {
        for j in 0..i {
            inv[j * p + i] = inv[i * p + j];
        }
    }
    Some((inv, trace))
}

/// `a . b` over eight running sums, added in a fixed order. A single
/// running sum waits on each addition before the next (the Cholesky
/// factorisation spent most of its time there); eight independent ones
/// vectorise and overlap. The order is fixed, so the result is still the
/// same bits on every run.
#[inline(always)]
pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f64; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        for ((s, &xv), &yv) in acc.iter_mut().zip(x).zip(y) {
            *s += xv * yv;
        }
    }
    let mut tail = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Complementary error function, Chebyshev fit (Numerical Recipes' `erfcc`):
/// relative error below 1.2e-7 everywhere, tails included.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// P(Z > z) for a standard normal Z.
pub(crate) fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The z with P(Z > z) = alpha, for alpha in (0, 0.5]; by bisection on the
/// monotone tail (60 halvings of [0, 40] reach 4e-17).
pub(crate) fn normal_isf(alpha: f64) -> f64 {
    let alpha = alpha.clamp(1e-300, 0.5);
    let (mut lo, mut hi) = (0.0f64, 40.0f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if normal_sf(mid) > alpha { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// The critical value for `tests` one-sided tests at the family level of a
/// normal test at `z` (Bonferroni: each at P(Z > z) / tests), turned into a
/// Student-t quantile with `dof` degrees of freedom by the Cornish-Fisher
/// expansion (accurate to ~1e-3 for dof >= 5 at these tails).
pub(crate) fn critical_value(z: f64, tests: usize, dof: f64) -> f64 {
    let q = if tests > 1 { normal_isf(normal_sf(z) / tests as f64) } else { z };
    if !dof.is_finite() || dof <= 0.0 {
        return q;
    }
    let (q2, v) = (q * q, dof);
    let g1 = (q2 + 1.0) * q / 4.0;
    let g2 = ((5.0 * q2 + 16.0) * q2 + 3.0) * q / 96.0;
    let g3 = (((3.0 * q2 + 19.0) * q2 + 17.0) * q2 - 15.0) * q / 384.0;
    q + g1 / v + g2 / (v * v) + g3 / (v * v * v)
}
