//! Subtensor's I32F32 fixed-point arithmetic, for the bonds.
//!
//! Bonds are the state one epoch hands to the next, and subtensor computes
//! them in I32F32 (32 fractional bits) whose multiplications and divisions
//! truncate. Over epochs that truncation shows: a column of bonds that no
//! weight changes still loses one u16 step per epoch when stored
//! (`floor(x * 65_535)`), which subtensor's `test_bonds` asserts. So the bond
//! EMA and its normalisations are done here on the same grid, with the same
//! truncation; everything else in Yuma stays `f64`.
//!
//! Only non-negative values below 2^31 occur (the callers scale larger
//! bonds down), held in a `u64` with 32 fractional bits; column sums, which
//! can pass 2^32 over many validators, are `u128`, so nothing overflows
//! where subtensor's i64 would saturate (the values it meets never get there).

/// A non-negative I32F32 value: `raw / 2^32`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fx(u64);

const FRAC: u32 = 32;
const SCALE: f64 = (1u64 << FRAC) as f64;

impl Fx {
    pub const ZERO: Fx = Fx(0);
    pub const ONE: Fx = Fx(1 << FRAC);

    /// `x` truncated onto the grid (`floor(x * 2^32) / 2^32`); `x` must be
    /// finite, non-negative and below 2^31.
    pub fn from_f64(x: f64) -> Fx {
        // Scaling by a power of two is exact, and the cast truncates: for a
        // non-negative value that is the floor, the only rounding. (Through
        // i64, which x86-64 converts in one instruction; the value fits.)
        Fx((x * SCALE) as i64 as u64)
    }

    #[cfg(test)]
    pub fn from_raw(raw: u64) -> Fx {
        Fx(raw)
    }

    #[cfg(test)]
    pub fn raw(self) -> u64 {
        self.0
    }

    pub fn to_f64(self) -> f64 {
        self.0.min(i64::MAX as u64) as i64 as f64 / SCALE
    }

    pub fn add(self, o: Fx) -> Fx {
        Fx(self.0.saturating_add(o.0))
    }

    pub fn sub(self, o: Fx) -> Fx {
        Fx(self.0.saturating_sub(o.0))
    }

    /// The product, truncated (I32F32 multiplication).
    pub fn mul(self, o: Fx) -> Fx {
        let p = (u128::from(self.0) * u128::from(o.0)) >> FRAC;
        Fx(u64::try_from(p).unwrap_or(u64::MAX))
    }
}

/// `a / b`, truncated (I32F32 division), for a raw divisor `b > 0` that may
/// be a wide sum.
pub fn div_wide(a: Fx, b: u128) -> Fx {
    if a.0 >> FRAC == 0 && b >> 64 == 0 {
        // The common case (a < 1) fits a 64-bit division.
        Fx((a.0 << FRAC) / b as u64)
    } else {
        Fx(u64::try_from((u128::from(a.0) << FRAC) / b).unwrap_or(u64::MAX))
    }
}

/// Adds a row to per-column sums (raw, wide).
pub fn add_to_sums(sums: &mut [u128], row: &[Fx]) {
    for (s, v) in sums.iter_mut().zip(row) {
        *s += u128::from(v.0);
    }
}

/// Divides every column of the row-major `m` (`cols` wide) by `by[j]`
/// (raw), leaving columns whose divisor is zero alone.
pub fn divide_cols(m: &mut [Fx], cols: usize, by: &[u128]) {
    for row in m.chunks_exact_mut(cols) {
        for (v, &d) in row.iter_mut().zip(by) {
            if d > 0 && v.0 > 0 {
                *v = div_wide(*v, d);
            }
        }
    }
}

/// Subtensor's `inplace_col_normalize` (each column sums to 1; all-zero
/// columns stay zero), given the column sums.
pub fn col_normalize_by(m: &mut [Fx], cols: usize, sums: &[u128]) {
    divide_cols(m, cols, sums);
}

/// Subtensor's `inplace_col_max_upscale`: each column's largest entry
/// becomes 1.
pub fn col_max_upscale(m: &mut [Fx], cols: usize) {
    let mut max = vec![0u128; cols];
    for row in m.chunks_exact(cols) {
        for (x, &v) in max.iter_mut().zip(row) {
            *x = (*x).max(u128::from(v.0));
        }
    }
    divide_cols(m, cols, &max);
}
